//! Processes as the kernel knows them: pid namespaces, the pid a process has in each of them,
//! and how a process of the world is found again from any pid namespace of the host.
//!
//! # What `/proc` says
//!
//! * `/proc/<P>/status` has a line `NSpid:` with the pid of `P` in every pid namespace from the
//!   one of the `/proc` mount (first) down to `P`'s own (last): `NSpid:\t26886\t1` for a process
//!   that is pid 1 in a namespace of its own, seen through the host's `/proc`. Seen through its
//!   own `/proc` (`unshare --mount-proc`), the same process has `NSpid:\t1`.
//! * `readlink /proc/<P>/ns/pid` is `pid:[INODE]`: the pid namespace `P` lives in. An inode
//!   names a namespace while it exists; the kernel reuses the number once the namespace is gone
//!   (a CRIU restore of a pid namespace was seen to get the inode of the namespace it replaces).
//! * A pid given to a `/proc` path is a pid of the `/proc` mount's namespace (the caller's
//!   **view**). The kernel resolves the pid of a `cuCheckpointProcess*` call in the caller's own
//!   pid namespace; the mock resolves it in the caller's `/proc`, which is the same thing unless
//!   a process in a pid namespace of its own kept the host's `/proc` (`unshare -p` without
//!   `--mount-proc`).
//!
//! # Who a CUDA process of the world is
//!
//! A CUDA process gets a **world id** when it registers (its first context): a number no other
//! process of the world has, stable for the process's whole life (checkpoints, CRIU restores
//! into new namespaces, restores of the same images again). Its mailbox and device memory are
//! filed under it. The world also records the process's **identity** as the kernel knows it,
//! its pid namespace inode and its pid there ([`NsIdentity`]), and its **host pid** (its pid in
//! the pid namespace of the world's host, the one `mock-world init` ran in) when known.
//!
//! The restore thread's name carries the world id: `cuda` and 11 hex digits
//! ([`restore_thread_name`]). It is the one mark that survives everything the process goes
//! through: CRIU restores thread names, but not pids, namespaces or start times.
//!
//! A call about pid `P` resolves `P` (in the caller's view) to its identity, and looks the
//! identity up; the entry counts only when `P` still has the restore thread of that entry's
//! id (otherwise `P` reused a dead process's pid in that namespace). A process whose identity
//! the world does not know yet, such as one CRIU just restored into a new pid namespace (a new
//! inode, a new host pid, the same namespace pid), is found by its restore thread's name and
//! its entry is re-keyed to the identity it has now.

use serde::{Deserialize, Serialize};

/// A process as its own pid namespace knows it: the namespace (inode of `/proc/<P>/ns/pid`)
/// and its pid there (the last field of `NSpid:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NsIdentity {
    /// The pid namespace's inode.
    pub ns: u64,
    /// The pid in that namespace.
    pub pid: i32,
}

impl std::fmt::Display for NsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@pid:[{}]", self.pid, self.ns)
    }
}

/// The fields of the `NSpid:` line of a `/proc/<P>/status` text, outermost namespace first;
/// `None` without such a line, or when a field is not a positive pid.
#[must_use]
pub fn parse_nspid(status: &str) -> Option<Vec<i32>> {
    let rest = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Vec<i32> = rest
        .split_whitespace()
        .map(|f| f.parse::<i32>().ok().filter(|p| *p > 0))
        .collect::<Option<_>>()?;
    (!pids.is_empty()).then_some(pids)
}

/// The inode of a namespace link of kind `kind` (`readlink /proc/<P>/ns/pid` is
/// `pid:[4026531836]`); `None` for anything else.
#[must_use]
pub fn parse_ns_link(link: &str, kind: &str) -> Option<u64> {
    let inner = link
        .strip_prefix(kind)?
        .strip_prefix(":[")?
        .strip_suffix(']')?;
    if inner.is_empty() || !inner.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    inner.parse().ok()
}

/// The restore thread's name for world id `id`: `cuda` and the id in 11 lowercase hex digits
/// (15 characters, the most a thread name holds).
#[must_use]
pub fn restore_thread_name(id: u64) -> String {
    format!("cuda{:011x}", id & MAX_ID)
}

/// The world id a restore thread's name carries (the inverse of [`restore_thread_name`]);
/// `None` for any other name (`cuda-EvtHandlr`, …).
#[must_use]
pub fn parse_restore_thread_name(comm: &str) -> Option<u64> {
    let hex = comm.trim_end_matches('\n').strip_prefix("cuda")?;
    if hex.len() != 11 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// The largest world id (44 bits: 11 hex digits).
pub const MAX_ID: u64 = (1 << 44) - 1;

/// Bits of a world id that count processes; the bits above them are the world's salt, drawn
/// when the world is created, so that two worlds on one host hand out different ids.
pub const ID_COUNTER_BITS: u32 = 24;

/// The world id of the `n`-th process (from 1) of a world with `salt`.
#[must_use]
pub fn make_id(salt: u32, n: u64) -> u64 {
    ((u64::from(salt) << ID_COUNTER_BITS) | (n & ((1 << ID_COUNTER_BITS) - 1))) & MAX_ID
}

fn read_link_inode(path: &str, kind: &str) -> Option<u64> {
    let link = std::fs::read_link(path).ok()?;
    parse_ns_link(link.to_str()?, kind)
}

/// The pid namespace of process `pid` (of the caller's view).
#[must_use]
pub fn pid_ns_of(pid: i32) -> Option<u64> {
    read_link_inode(&format!("/proc/{pid}/ns/pid"), "pid")
}

/// The calling process's pid namespace.
#[must_use]
pub fn own_pid_ns() -> Option<u64> {
    read_link_inode("/proc/self/ns/pid", "pid")
}

/// The `NSpid:` fields of process `pid` (of the caller's view).
#[must_use]
pub fn nspid_of(pid: i32) -> Option<Vec<i32>> {
    parse_nspid(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// The identity of process `pid` of the caller's view (not of a thread: give a tgid).
#[must_use]
pub fn identity_of(pid: i32) -> Option<NsIdentity> {
    let ns = pid_ns_of(pid)?;
    let last = *nspid_of(pid)?.last()?;
    Some(NsIdentity { ns, pid: last })
}

/// The calling process's identity: its pid namespace and `getpid()`.
#[must_use]
pub fn own_identity() -> Option<NsIdentity> {
    Some(NsIdentity {
        ns: own_pid_ns()?,
        pid: i32::try_from(std::process::id()).ok()?,
    })
}

/// The pid namespace of the caller's `/proc` mount: the namespace of the nearest process,
/// walking up from the caller through its parents, that `/proc` shows with a single `NSpid:`
/// field (it lives in the mount's namespace). `None` when that cannot be read.
#[must_use]
pub fn proc_pid_ns() -> Option<u64> {
    let mut pid = i32::try_from(std::process::id()).ok()?;
    let mut at: String = "self".to_owned();
    for _ in 0..64 {
        let status = std::fs::read_to_string(format!("/proc/{at}/status")).ok()?;
        let fields = parse_nspid(&status)?;
        if fields.len() == 1 {
            return read_link_inode(&format!("/proc/{at}/ns/pid"), "pid");
        }
        if at == "self" {
            pid = fields[0];
        }
        let ppid: i32 = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))?
            .trim()
            .parse()
            .ok()?;
        if ppid <= 0 || ppid == pid {
            return None;
        }
        pid = ppid;
        at = ppid.to_string();
    }
    None
}

/// The process (thread group) a pid or tid of the caller's view belongs to.
#[must_use]
pub fn tgid_of(id: i32) -> Option<i32> {
    if id <= 0 {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{id}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Tgid:"))?;
    line["Tgid:".len()..].trim().parse().ok()
}

/// The threads of `pid` (of the caller's view), with their names.
fn threads(pid: i32) -> Vec<(i32, String)> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    rd.filter_map(|e| {
        let tid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
        Some((tid, comm.trim_end().to_owned()))
    })
    .collect()
}

/// The restore thread of `pid` (of the caller's view) and the world id its name carries, when
/// the process is alive and has one.
#[must_use]
pub fn restore_thread_of(pid: i32) -> Option<(i32, u64)> {
    if !crate::sys::alive(pid) {
        return None;
    }
    threads(pid)
        .into_iter()
        .find_map(|(tid, comm)| Some((tid, parse_restore_thread_name(&comm)?)))
}

/// The thread of `pid` (of the caller's view) that is the restore thread of world id `id`, when
/// the process is alive and has it.
#[must_use]
pub fn restore_thread(pid: i32, id: u64) -> Option<i32> {
    restore_thread_of(pid)
        .filter(|(_, found)| *found == id)
        .map(|(tid, _)| tid)
}

/// Every process (thread group) of the caller's view.
#[must_use]
pub fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// The process of the caller's view with identity `id` (a scan of `/proc`).
#[must_use]
pub fn find_identity(id: NsIdentity) -> Option<i32> {
    all_pids()
        .into_iter()
        .find(|&p| pid_ns_of(p) == Some(id.ns) && identity_of(p) == Some(id))
}

/// Where to find a CUDA process of the world: its world id and what the world last knew of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessRef {
    /// Its world id.
    pub id: u64,
    /// Its host pid as last known (0: never known).
    pub host_pid: i32,
    /// Its identity as last known.
    pub identity: NsIdentity,
}

/// Where a process of the world is, seen from the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Alive, with this pid in the caller's view.
    Here(i32),
    /// Gone: it died (a checkpointed process whose dump ended it included).
    Gone,
    /// The caller cannot tell: the process is not in its view, and its view does not show
    /// every process of the world's host (a caller inside a pid namespace).
    Unknown,
}

/// Finds `p` from the caller: `host_view` says whether the caller's `/proc` shows the world's
/// host pid namespace (then a process it cannot find is gone). Cheap candidates first (the
/// recorded host pid, the namespace pid when the caller shares the namespace), then, in the
/// host's view, a scan of `/proc` for a process with the recorded namespace pid (CRIU keeps it)
/// and the restore thread of `p.id`.
#[must_use]
pub fn locate(p: &ProcessRef, host_view: bool) -> Presence {
    let mut candidates = Vec::with_capacity(2);
    if p.host_pid > 0 {
        candidates.push(p.host_pid);
    }
    if p.identity.pid > 0 && own_pid_ns() == Some(p.identity.ns) {
        candidates.push(p.identity.pid);
    }
    for c in candidates {
        if identity_of(c) == Some(p.identity) && restore_thread(c, p.id).is_some() {
            return Presence::Here(c);
        }
    }
    if !host_view {
        return Presence::Unknown;
    }
    let found = all_pids().into_iter().find(|&c| {
        nspid_of(c).and_then(|f| f.last().copied()) == Some(p.identity.pid)
            && restore_thread(c, p.id).is_some()
    });
    found.map_or(Presence::Gone, Presence::Here)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nspid_lines_give_every_level_outermost_first() {
        let status = "Name:\tsleep\nTgid:\t26886\nNSpid:\t26886\t1\nNSpgid:\t26886\t1\n";
        assert_eq!(parse_nspid(status), Some(vec![26886, 1]));
        assert_eq!(parse_nspid("NSpid:\t42\n"), Some(vec![42]));
        assert_eq!(parse_nspid("NSpid:  7   3  1"), Some(vec![7, 3, 1]));
        for bad in [
            "",
            "Name:\tx\n",
            "NSpid:\n",
            "NSpid:\t12\tx\n",
            "NSpid:\t0\n",
            "NSpid:\t-4\n",
            "NSpid:\t99999999999\n",
        ] {
            assert_eq!(parse_nspid(bad), None, "{bad:?}");
        }
        // NSpgid and NSsid are not NSpid.
        assert_eq!(parse_nspid("NSpgid:\t5\nNSsid:\t5\n"), None);
    }

    #[test]
    fn namespace_links_give_their_inode() {
        assert_eq!(
            parse_ns_link("pid:[4026531836]", "pid"),
            Some(4_026_531_836)
        );
        assert_eq!(
            parse_ns_link("mnt:[4026532174]", "mnt"),
            Some(4_026_532_174)
        );
        for bad in [
            "mnt:[4026532174]",
            "pid:4026531836",
            "pid:[]",
            "pid:[12a]",
            "pid:[1]x",
            "pid:[-1]",
            "pid:[99999999999999999999999]",
            "",
        ] {
            assert_eq!(parse_ns_link(bad, "pid"), None, "{bad:?}");
        }
    }

    #[test]
    fn restore_thread_names_carry_the_world_id() {
        assert_eq!(restore_thread_name(1), "cuda00000000001");
        assert_eq!(restore_thread_name(MAX_ID), "cudafffffffffff");
        assert_eq!(restore_thread_name(MAX_ID).len(), 15);
        assert_eq!(
            parse_restore_thread_name("cuda0005eedc0de"),
            Some(0x5eed_c0de)
        );
        assert_eq!(
            parse_restore_thread_name("cuda0005eedc0de\n"),
            Some(0x5eed_c0de)
        );
        for other in [
            "cuda-EvtHandlr",
            "cuda",
            "cuda0005eedc0d",
            "cuda0005eedc0dee",
            "cuda0005EEDC0DE",
            "mock-cuda-app",
            "xcuda0005eedc0d",
        ] {
            assert_eq!(parse_restore_thread_name(other), None, "{other}");
        }
        assert_eq!(make_id(0, 1), 1);
        assert_eq!(make_id(0xabcde, 7), 0xabc_de00_0007);
        assert_eq!(
            make_id(0xabcde, 7) >> ID_COUNTER_BITS,
            0xabcde,
            "the salt is kept"
        );
    }

    #[test]
    fn this_process_is_found_by_its_identity() {
        let me = i32::try_from(std::process::id()).unwrap();
        let id = own_identity().unwrap();
        assert_eq!(own_pid_ns(), pid_ns_of(me));
        // The test runs in the namespace of its /proc (no unshare here).
        if nspid_of(me).is_some_and(|f| f.len() == 1) {
            assert_eq!(identity_of(me), Some(id));
            assert_eq!(find_identity(id), Some(me));
            assert_eq!(proc_pid_ns(), Some(id.ns));
        }
        assert_eq!(tgid_of(me), Some(me));
        assert_eq!(tgid_of(0), None);
        assert_eq!(restore_thread_of(me), None, "no restore thread here");
        let p = ProcessRef {
            id: 9,
            host_pid: me,
            identity: id,
        };
        assert_eq!(
            locate(&p, false),
            Presence::Unknown,
            "not a CUDA process: no restore thread of id 9"
        );
    }

    proptest! {
        #[test]
        fn nspid_lines_round_trip(pids in proptest::collection::vec(1i32..=i32::MAX, 1..6),
                                  sep in prop_oneof![Just("\t"), Just(" "), Just("  ")]) {
            let line: Vec<String> = pids.iter().map(ToString::to_string).collect();
            let status = format!("Name:\tx\nNSpid:{sep}{}\nNSpgid:\t1\n", line.join(sep));
            prop_assert_eq!(parse_nspid(&status), Some(pids));
        }

        #[test]
        fn ns_links_round_trip(inode: u64, kind in "[a-z_]{1,20}") {
            prop_assert_eq!(parse_ns_link(&format!("{kind}:[{inode}]"), &kind), Some(inode));
            prop_assert_eq!(parse_ns_link(&format!("{kind}:[{inode}]"), "other-kind"), None);
        }

        #[test]
        fn arbitrary_text_never_panics_the_parsers(text in ".{0,80}") {
            let _ = parse_nspid(&text);
            let _ = parse_ns_link(&text, "pid");
            let _ = parse_restore_thread_name(&text);
        }

        #[test]
        fn thread_names_round_trip(id in 0u64..=MAX_ID) {
            prop_assert_eq!(parse_restore_thread_name(&restore_thread_name(id)), Some(id));
        }
    }
}
