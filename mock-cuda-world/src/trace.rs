//! The call trace (`trace.log`): one line per driver call, appended with a single `write(2)` on
//! an `O_APPEND` descriptor so lines from concurrent processes never interleave.
//!
//! Line format (stable, diff-friendly): `<caller> <program> <function>(<args>) = <RESULT>`,
//! e.g. `4242 criu cuCheckpointProcessLock(pid=4250, timeoutMs=5000) = CUDA_SUCCESS`. The caller
//! is its pid when it lives in the world's host pid namespace (its host pid), else its namespace
//! pid and namespace, `1@pid:[4026532175]` (a process in a container cannot learn its host pid).
//! The program is the calling process's name (`/proc/self/comm` at its first traced call:
//! `criu`, `cuda-checkpoint`, the CUDA plugin's `cuda-guardian`, a workload's `mock-cuda-app`),
//! whitespace as `_`, `?` when unreadable: who called is written where the call is made, not
//! guessed from pids afterwards.

use super::World;
use std::io::Write;
use std::sync::Mutex;

impl World {
    /// Appends one call to the trace. Tracing never fails the call it records.
    pub fn trace(&self, function: &str, args: &str, result: &str) {
        let line = format!(
            "{} {} {function}({args}) = {result}\n",
            self.caller(),
            program()
        );
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.trace_path())
        {
            let _ = f.write_all(line.as_bytes());
        }
    }

    /// How the trace names the calling process (module documentation).
    #[must_use]
    pub fn caller(&self) -> String {
        self.caller_in(self.host_pid_ns())
    }

    /// [`Self::caller`] given the host pid namespace (0 when unknown), for the error log: it
    /// may be written from inside the first read of the state, which `host_pid_ns` makes, so it
    /// must not make it again.
    pub(crate) fn caller_in(&self, host: u64) -> String {
        match crate::pidns::own_identity() {
            Some(me) if host != 0 && me.ns != host => me.to_string(),
            _ => std::process::id().to_string(),
        }
    }

    /// The trace so far (see [`parse_line`] to read one line).
    pub fn read_trace(&self) -> String {
        std::fs::read_to_string(self.trace_path()).unwrap_or_default()
    }
}

/// The calling process's name as the trace writes it (module documentation): its
/// `/proc/self/comm` (its argv[0]'s file name when that is the dynamic loader's), read at the
/// process's first traced call and kept for the process (by pid, so a
/// forked child reads its own: the plugin's helper renames itself after its fork from CRIU,
/// before any call). Kept because `/proc` may later be another pid namespace's: CRIU enters a
/// dumped container's mount namespace, where `/proc/self` does not name it. The cache is only
/// ever `try_lock`ed, so a fork while another thread holds it cannot deadlock the child.
pub(crate) fn program() -> String {
    static NAME: Mutex<Option<(u32, String)>> = Mutex::new(None);
    let pid = std::process::id();
    if let Ok(g) = NAME.try_lock() {
        if let Some((p, n)) = &*g {
            if *p == pid {
                return n.clone();
            }
        }
    }
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
    let mut comm = comm.trim_end_matches('\n').to_owned();
    // A program started through the dynamic loader (`ld-linux-x86-64.so.2 … /usr/sbin/criu`,
    // as scripts/fetch-criu.sh's wrapper runs CRIU) has the loader's name: use the program's
    // (its argv[0], which the loader set).
    if comm.starts_with("ld-linux") || comm == "ld.so" {
        if let Some(prog) = std::env::args_os().next() {
            if let Some(base) = std::path::Path::new(&prog).file_name() {
                comm = base.to_string_lossy().into_owned();
            }
        }
    }
    let name: String = comm
        .chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .collect();
    if name.is_empty() {
        return "?".to_owned();
    }
    if let Ok(mut g) = NAME.try_lock() {
        *g = Some((pid, name.clone()));
    }
    name
}

/// One line of the trace, split into its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceLine<'a> {
    /// The caller: a host pid, or `<nspid>@pid:[<inode>]`.
    pub caller: &'a str,
    /// The calling process's name.
    pub program: &'a str,
    /// `<function>(<args>) = <RESULT>`, as the line has it.
    pub entry: &'a str,
    /// `<function>(<args>)`.
    pub call: &'a str,
    /// What it returned (`CUDA_SUCCESS`, `exit=0`, …).
    pub result: &'a str,
}

/// Splits one trace line into its fields; `None` for a line of another format.
#[must_use]
pub fn parse_line(line: &str) -> Option<TraceLine<'_>> {
    let (caller, rest) = line.split_once(' ')?;
    let (program, entry) = rest.split_once(' ')?;
    let (call, result) = entry.rsplit_once(" = ")?;
    Some(TraceLine {
        caller,
        program,
        entry,
        call,
        result,
    })
}

/// The calls `caller` made, in order, as `<function>(<args>) = <RESULT>`: for checks that know
/// a caller by its pid (a test process's name is its test binary's).
#[must_use]
pub fn calls_by<'a>(text: &'a str, caller: &str) -> Vec<&'a str> {
    text.lines()
        .filter_map(|l| {
            let t = parse_line(l)?;
            (t.caller == caller).then_some(t.entry)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_caller_and_program_and_parses_back() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = "schema = 1\n[driver]\nbranch = 580\n";
        std::fs::write(dir.path().join("world.toml"), cfg).unwrap();
        crate::state::StateFile {
            host_pid_ns: crate::pidns::own_pid_ns().unwrap_or(0),
            ..crate::state::StateFile::default()
        }
        .store(dir.path())
        .unwrap();
        let w = World::open(dir.path()).unwrap();
        w.trace("cuInit", "flags=0", "CUDA_SUCCESS");
        w.trace("cuInit", "flags=0", "CUDA_ERROR_INVALID_VALUE");
        let text = w.read_trace();
        let line = text.lines().next().unwrap();
        let t = parse_line(line).unwrap();
        assert_eq!(t.caller, w.caller());
        assert_eq!(t.program, program());
        assert!(!t.program.is_empty() && !t.program.contains(' '), "{line}");
        assert_eq!(t.entry, "cuInit(flags=0) = CUDA_SUCCESS");
        assert_eq!(t.call, "cuInit(flags=0)");
        assert_eq!(t.result, "CUDA_SUCCESS");
        assert_eq!(text.lines().count(), 2, "{text}");
        assert_eq!(
            calls_by(&text, &w.caller()),
            [
                "cuInit(flags=0) = CUDA_SUCCESS",
                "cuInit(flags=0) = CUDA_ERROR_INVALID_VALUE"
            ]
        );
        assert!(calls_by(&text, "1").is_empty() || w.caller() == "1");
    }

    #[test]
    fn parse_line_refuses_other_formats() {
        assert_eq!(parse_line("4242 cuInit(flags=0)"), None);
        assert_eq!(parse_line(""), None);
    }
}
