//! The CRIU (and compel) functions C plugins link against besides the plugin API proper:
//! `compel_wait_task`, `parse_pid_status` and `find_unused_fd_pid` (`close_fds` is in the C shim,
//! as it runs in a forked child). CRIU 4.1/4.2's `cuda_plugin.c` resumes a task's CUDA restore
//! thread during CHECKPOINT_DEVICES and RESUME_DEVICES_LATE and stops it again with
//! `PTRACE_INTERRUPT` and `compel_wait_task(tid, -1, parse_pid_status, NULL, &creds.s, NULL)`;
//! amdgpu's `RESTORE_EXT_FILE` asks `find_unused_fd_pid` for a descriptor number.
//!
//! The semantics follow compel's and CRIU's (`compel/src/lib/infect.c`, `criu/proc_parse.c`);
//! the engine calls every hook on its one thread, which is the tracer, so a plugin's
//! `compel_wait_task` waits for its tracee as it would inside CRIU.

use nix::sys::ptrace;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use abi::criu::compel_task;

use crate::{pr_debug, pr_err};

/// What `parse_pid_status` reads from `/proc/PID/status` (CRIU's `struct proc_status_creds`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PidStatus {
    /// The first letter of `State`.
    pub state: u8,
    /// `PPid`.
    pub ppid: i32,
    /// The last `NSpid` entry.
    pub vpid: i32,
    /// `SigPnd`.
    pub sigpnd: u64,
    /// `ShdPnd`.
    pub shdpnd: u64,
    /// `SigBlk`.
    pub sigblk: u64,
    /// `Seccomp`.
    pub seccomp_mode: i32,
    /// `Uid`.
    pub uids: [u32; 4],
    /// `Gid`.
    pub gids: [u32; 4],
    /// `CapInh`, `CapPrm`, `CapEff`, `CapBnd`, `CapAmb` as 64-bit masks.
    pub caps: [u64; 5],
}

/// Parses `/proc/PID/status` (a thread id works too) as CRIU's `parse_pid_status` does.
///
/// # Errors
/// An unreadable file or a field CRIU requires that is missing or malformed.
pub fn parse_pid_status(pid: i32) -> Result<PidStatus, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("can't read /proc/{pid}/status: {e}"))?;
    parse_status_text(&text).map_err(|e| format!("/proc/{pid}/status: {e}"))
}

fn parse_status_text(text: &str) -> Result<PidStatus, String> {
    let mut st = PidStatus::default();
    let mut seen = 0u32;
    let hex = |v: &str, k: &str| u64::from_str_radix(v, 16).map_err(|_| format!("bad {k} `{v}`"));
    let ids = |v: &str, k: &str| -> Result<[u32; 4], String> {
        let parts: Vec<u32> = v
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| format!("bad {k} `{v}`"))?;
        parts.try_into().map_err(|_| format!("bad {k} `{v}`"))
    };
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let v = value.trim();
        let bit = match key {
            "State" => {
                st.state = *v.as_bytes().first().ok_or("empty State")?;
                0
            }
            "PPid" => {
                st.ppid = v.parse().map_err(|_| format!("bad PPid `{v}`"))?;
                1
            }
            "NSpid" => {
                let last = v.split_whitespace().last().ok_or("empty NSpid")?;
                st.vpid = last.parse().map_err(|_| format!("bad NSpid `{v}`"))?;
                2
            }
            "Uid" => {
                st.uids = ids(v, key)?;
                3
            }
            "Gid" => {
                st.gids = ids(v, key)?;
                4
            }
            "CapInh" | "CapPrm" | "CapEff" | "CapBnd" | "CapAmb" => {
                let i = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]
                    .iter()
                    .position(|k| *k == key)
                    .unwrap_or(0);
                st.caps[i] = hex(v, key)?;
                5 + u32::try_from(i).unwrap_or(0)
            }
            "Seccomp" => {
                st.seccomp_mode = v.parse().map_err(|_| format!("bad Seccomp `{v}`"))?;
                10
            }
            "ShdPnd" => {
                st.shdpnd |= hex(v, key)?;
                11
            }
            "SigPnd" => {
                st.sigpnd |= hex(v, key)?;
                12
            }
            "SigBlk" => {
                st.sigblk |= hex(v, key)?;
                13
            }
            _ => continue,
        };
        seen |= 1 << bit;
    }
    // Everything but NSpid (absent without pid namespaces support) and CapAmb (older kernels).
    let required = ((1u32 << 14) - 1) & !(1 << 2) & !(1 << 9);
    if seen & required != required {
        return Err(format!("fields missing (seen {seen:#x})"));
    }
    if seen & (1 << 2) == 0 {
        st.vpid = -1;
    }
    Ok(st)
}

const fn sig_bit(sig: i32) -> u64 {
    1 << (sig - 1)
}

fn is_stop_signal(sig: i32) -> bool {
    [libc::SIGSTOP, libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU].contains(&sig)
}

/// `compel_wait_task(pid, ppid, get_status, free_status, ss, data)` after `get_status` has been
/// turned into `status` (called after each wait; `None` is its failure) and `free_status`
/// into `release` (called before each retry). Returns a `COMPEL_TASK_*` value or -1; on the
/// paths where compel gives up on a live task it detaches from it, as compel does.
pub fn wait_task(
    pid: i32,
    ppid: i32,
    status: &mut dyn FnMut() -> Option<PidStatus>,
    release: &mut dyn FnMut(),
) -> i32 {
    let p = Pid::from_raw(pid);
    let give_up = |why: String| {
        pr_err!("{why}");
        if let Err(e) = ptrace::detach(p, None) {
            pr_err!("Unable to detach from {pid}: {e}");
        }
        -1
    };
    loop {
        let waited = waitpid(p, Some(WaitPidFlag::__WALL));
        let Some(ss) = status() else {
            return give_up(format!("can't read the status of {pid}"));
        };
        let ws = match waited {
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) | Err(_) => {
                if ss.state != b'Z' {
                    pr_err!(
                        "Unseizable non-zombie {pid} found, state {}, err {}",
                        char::from(ss.state),
                        waited.err().map_or(0, |e| e as i32)
                    );
                    return -1;
                }
                return if waited.is_err() {
                    compel_task::ZOMBIE
                } else {
                    compel_task::DEAD
                };
            }
            Ok(ws) => ws,
        };
        if ppid != -1 && ss.ppid != ppid {
            return give_up(format!(
                "Task pid reused while suspending ({pid}: {ppid} -> {})",
                ss.ppid
            ));
        }
        if !matches!(
            ws,
            WaitStatus::Stopped(..) | WaitStatus::PtraceEvent(..) | WaitStatus::PtraceSyscall(..)
        ) {
            return give_up(format!("SEIZE {pid}: task not stopped after seize"));
        }
        let si = match ptrace::getsiginfo(p) {
            Ok(si) => si,
            Err(e) => return give_up(format!("SEIZE {pid}: can't read signfo: {e}")),
        };
        if si.si_code >> 8 != libc::PTRACE_EVENT_STOP {
            // A signal arrived first: let the task have it, then wait for the stop again.
            let sig = nix::sys::signal::Signal::try_from(si.si_signo).ok();
            if let Err(e) = ptrace::cont(p, sig) {
                return give_up(format!("Can't continue signal handling, aborting: {e}"));
            }
            release();
            continue;
        }
        let mut options = ptrace::Options::PTRACE_O_TRACESYSGOOD;
        if ss.seccomp_mode != 0 {
            options |= ptrace::Options::from_bits_retain(libc::PTRACE_O_SUSPEND_SECCOMP);
        }
        if let Err(e) = ptrace::setoptions(p, options) {
            pr_err!("Unable to set ptrace options for {pid}: {e}");
            return -1;
        }
        if (ss.sigpnd | ss.shdpnd) & sig_bit(libc::SIGTRAP) != 0 {
            return give_up(format!(
                "Can't dump the {pid} thread with a pending SIGTRAP."
            ));
        }
        // Stops that were pending or in force before the seize, as compel counts them.
        let mut stops = 0;
        for set in [ss.sigpnd, ss.shdpnd] {
            if set & sig_bit(libc::SIGSTOP) != 0 {
                stops += 1;
            }
            if set & sig_bit(libc::SIGTSTP) != 0 && ss.sigblk & sig_bit(libc::SIGTSTP) == 0 {
                stops += 1;
            }
        }
        if is_stop_signal(si.si_signo) {
            stops += 1;
        }
        if stops > 0 {
            // Run the task into each pending stop (it traps at once: it was interrupted).
            for _ in 0..stops {
                let ok = ptrace::cont(p, None).is_ok()
                    && matches!(
                        waitpid(p, Some(WaitPidFlag::__WALL)),
                        Ok(WaitStatus::Stopped(..) | WaitStatus::PtraceEvent(..))
                    );
                if !ok {
                    let sig = if is_stop_signal(si.si_signo) {
                        si.si_signo
                    } else {
                        libc::SIGSTOP
                    };
                    let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::try_from(sig).ok());
                    return give_up(format!("SEIZE {pid}: can't skip its stop signals"));
                }
            }
            return compel_task::STOPPED;
        }
        if si.si_signo == libc::SIGTRAP {
            pr_debug!("compel: {pid} is stopped (alive)");
            return compel_task::ALIVE;
        }
        return give_up(format!(
            "SEIZE {pid}: unsupported stop signal {}",
            si.si_signo
        ));
    }
}

/// `find_unused_fd_pid(pid)`: a descriptor number task `pid` does not use. CRIU answers from the
/// restored task's descriptor table (inside a restore); the harness restores no descriptors, so
/// this is the lowest number above 2 that `pid` has no descriptor on now. -1 (logged) when `pid`
/// is not a task this engine can see.
#[must_use]
pub fn find_unused_fd(pid: i32) -> i32 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        pr_err!("Invalid pid:{pid}");
        return -1;
    };
    let used: std::collections::BTreeSet<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    (3..).find(|fd| !used.contains(fd)).unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_as_criu_reads_them() {
        let text = "Name:\tx\nState:\tS (sleeping)\nPPid:\t7\nNSpid:\t42\t3\nUid:\t0\t1\t2\t3\n\
                    Gid:\t4\t5\t6\t7\nShdPnd:\t0000000000000100\nSigPnd:\t0000000000000001\n\
                    SigBlk:\tfffffffe7ffbfeff\nCapInh:\t0000000000000000\n\
                    CapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\n\
                    CapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\nSeccomp:\t2\n";
        let st = parse_status_text(text).unwrap();
        assert_eq!(st.state, b'S');
        assert_eq!((st.ppid, st.vpid), (7, 3));
        assert_eq!(st.uids, [0, 1, 2, 3]);
        assert_eq!(st.gids, [4, 5, 6, 7]);
        assert_eq!((st.shdpnd, st.sigpnd), (0x100, 1));
        assert_eq!(st.sigblk, 0xffff_fffe_7ffb_feff);
        assert_eq!(st.caps[1], 0x1ff_ffff_ffff);
        assert_eq!(st.seccomp_mode, 2);
        let e = parse_status_text(&text.replace("PPid:\t7\n", "")).unwrap_err();
        assert!(e.contains("missing"), "{e}");
        assert!(parse_status_text(&text.replace("Seccomp:\t2", "Seccomp:\tx")).is_err());
    }

    #[test]
    fn this_process_parses() {
        let st = parse_pid_status(i32::try_from(std::process::id()).unwrap()).unwrap();
        assert!(b"RS".contains(&st.state));
        assert!(find_unused_fd(i32::try_from(std::process::id()).unwrap()) >= 3);
        assert_eq!(find_unused_fd(-5), -1);
    }
}
