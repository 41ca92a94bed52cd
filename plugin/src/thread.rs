//! Running only the CUDA restore thread of a task CRIU holds stopped.
//!
//! During CHECKPOINT_DEVICES, DUMP_FINISH/exit and RESUME_DEVICES_LATE every thread of the task is
//! ptrace-stopped by CRIU, but checkpoint requests are served by the target's restore thread.
//! So the plugin lets exactly that thread run for the duration of the request and then stops it
//! again exactly as CRIU left it (CRIU's C plugin does the same):
//!
//! * resume: save the signal mask (`PTRACE_GETSIGMASK`), block every signal but SIGTRAP
//!   (`PTRACE_SETSIGMASK`), drop the ptrace options so the thread's seccomp filter applies while it
//!   runs (`PTRACE_SETOPTIONS 0`), `PTRACE_CONT`, then confirm that it runs: it must not report a
//!   stop (`waitpid(WNOHANG | __WALL)`) or show a traced stop (`t` in `/proc`) at once. A thread
//!   seen sleeping has run since (after `PTRACE_CONT` the kernel shows it runnable until it does),
//!   and so has one seen runnable after it has been on a CPU since (its `schedstat` count,
//!   [`times_scheduled`]; where the kernel does not count, one that stays runnable for 10 ms
//!   without stopping). An idle restore thread is confirmed within microseconds. A thread that
//!   stopped again is continued again, at most 3 times; then the resume fails
//!   ([`ThreadError::StopsAtOnce`]) and the thread is left stopped with CRIU's mask and options;
//! * re-stop: if the thread is stopped already (a stop notification is pending, taken now, or
//!   `/proc` shows it in a traced stop), it is not interrupted; otherwise `PTRACE_INTERRUPT` and
//!   wait for the stop (`waitpid(__WALL)`, polled with a deadline). A thread found in a
//!   signal-delivery-stop (SIGTRAP or SIGSTOP, the only signals not blocked) instead of an event
//!   stop is continued with the signal discarded and stopped again (at most 3 rounds). Then put
//!   back CRIU's options (`PTRACE_O_TRACESYSGOOD`, and `PTRACE_O_SUSPEND_SECCOMP` only for a
//!   thread with a seccomp mode, as CRIU's seize does: see [`Resumed::seccomp`]), restore the
//!   mask.
//!
//! Why both: `PTRACE_INTERRUPT` sent to a thread that is stopped already does not stop it twice;
//! it queues a trap (the kernel's `JOBCTL_TRAP_STOP`) that the thread takes as soon as it is
//! continued, so it stops again at once and the `PTRACE_CONT` that was meant to let it serve the
//! driver does nothing, nor does every later one while the dance repeats the mistake. The driver's
//! request then times out (`CUDA_ERROR_TIMEOUT`) although the resume reported success. The
//! re-stop therefore never interrupts a thread it sees stopped, and the resume checks its effect,
//! which also catches a trap queued when the thread stopped between the re-stop's look and its
//! interrupt, or one queued by somebody else.
//!
//! A thread that is not traced by this process (the task was never seized, e.g. a rollback after
//! a failed PAUSE_DEVICES) is left alone: it is running anyway. The real implementation is
//! [`crate::ffi::ptrace::Ptrace`].

use crate::task::{Pid, Tid};

/// Proof that [`ThreadControl::resume`] ran; hand it back to [`ThreadControl::restop`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a resumed thread must be stopped again"]
pub struct Resumed {
    pub pid: Pid,
    pub tid: Tid,
    /// The saved signal mask, or `None` when the thread was not ours to stop (nothing changed).
    pub saved_sigmask: Option<u64>,
    /// The thread runs under a seccomp filter (`Seccomp:` of its `/proc` status is not 0), so
    /// CRIU's seize suspended the filter (`PTRACE_O_SUSPEND_SECCOMP`) and the re-stop must
    /// suspend it again. For any other thread CRIU set only `PTRACE_O_TRACESYSGOOD`, and so does
    /// the re-stop: suspending seccomp needs CAP_SYS_ADMIN, which `criu --unprivileged` lacks.
    pub seccomp: bool,
}

/// A failed ptrace step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThreadError {
    #[error("{step} on restore thread {tid} failed: {}", std::io::Error::from_raw_os_error(*.errno))]
    Ptrace {
        step: &'static str,
        tid: Tid,
        errno: i32,
    },
    #[error("restore thread {tid} did not stop within {secs} s after PTRACE_INTERRUPT")]
    StopTimeout { tid: Tid, secs: u64 },
    #[error("restore thread {tid} exited while it was running")]
    Gone { tid: Tid },
    #[error("pid {pid} did not die within {ms} ms of SIGKILL")]
    KillTimeout { pid: Pid, ms: u64 },
    #[error(
        "restore thread {tid} runs under a seccomp filter, and stopping it again as CRIU left it \
         (PTRACE_O_SUSPEND_SECCOMP) was refused: {}; that needs CAP_SYS_ADMIN, which CRIU \
         lacks with --unprivileged",
        std::io::Error::from_raw_os_error(*.errno)
    )]
    SeccompSuspend { tid: Tid, errno: i32 },
    #[error(
        "restore thread {tid} of pid {pid} stopped again at once after each of {conts} \
         PTRACE_CONTs, so it cannot serve the driver's request; it is left stopped, with the \
         signal mask and ptrace options CRIU gave it"
    )]
    StopsAtOnce { pid: Pid, tid: Tid, conts: u32 },
}

/// Resume one thread of a stopped task, and stop it again.
pub trait ThreadControl: Send {
    /// Lets `tid` (a thread of `pid`) run, if this process traces it.
    fn resume(&mut self, pid: Pid, tid: Tid) -> Result<Resumed, ThreadError>;
    /// Stops the thread again and restores what `resume` changed.
    fn restop(&mut self, resumed: Resumed) -> Result<(), ThreadError>;
    /// Whether `tid` is a thread of `pid` (used to trust a TID recorded at dump time).
    fn thread_exists(&self, pid: Pid, tid: Tid) -> bool;
    /// Whether the process `pid` still exists (and is not a zombie).
    fn task_exists(&self, pid: Pid) -> bool;
    /// The scheduler state of `tid` when it is stopped (`T`: a stop signal; `t`: traced by
    /// someone), else `None`: such a thread cannot serve a driver request.
    fn stopped(&self, pid: Pid, tid: Tid) -> Option<char>;
    /// Kills the process `pid` (SIGKILL) and waits, bounded, until it is dead.
    fn kill_task(&mut self, pid: Pid) -> Result<(), ThreadError>;
    /// The pid of process `pid` in its own (innermost) pid namespace, `None` when unknown (see
    /// [`ns_pid`]).
    fn ns_pid(&self, _pid: Pid) -> Option<Pid> {
        None
    }
}

/// The pid of process `pid` in its innermost pid namespace: the last `NSpid:` entry of
/// `/proc/<pid>/status` (the pid itself for a process in CRIU's own pid namespace). A tree
/// restored into a new pid namespace gets new host pids but keeps these, so the plugin's images
/// are keyed by them.
#[must_use]
pub fn ns_pid(pid: Pid) -> Option<Pid> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_ns_pid(&status)
}

/// The last number of the `NSpid:` line of a `/proc/<pid>/status` text.
#[must_use]
pub fn parse_ns_pid(status: &str) -> Option<Pid> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let last = line.split_whitespace().last()?;
    last.parse().ok().filter(|p: &Pid| *p > 0)
}

/// The scheduler state letter of `/proc/<pid>/task/<tid>/stat` (the field after the command name,
/// which may itself contain spaces and parentheses), or `None` when the thread is gone.
#[must_use]
pub fn thread_state(pid: Pid, tid: Tid) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    parse_state(&stat)
}

/// How many times `tid` has been put on a CPU: the third field of
/// `/proc/<pid>/task/<tid>/schedstat`. `None` when the thread is gone, or the kernel does not
/// count (no `schedstat` without `CONFIG_SCHED_INFO`; a count of 0 for a thread that has run means
/// the kernel does not keep it).
#[must_use]
pub fn times_scheduled(pid: Pid, tid: Tid) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    parse_schedstat(&text)
}

fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace()
        .nth(2)?
        .parse()
        .ok()
        .filter(|n: &u64| *n > 0)
}

fn parse_state(stat: &str) -> Option<char> {
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// `root` and every process below it, from `/proc/<pid>/task/<tid>/children` (root first,
/// each parent before its children).
#[must_use]
pub fn descendants(root: Pid) -> Vec<Pid> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let pid = out[i];
        i += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for c in children
                .split_whitespace()
                .filter_map(|c| c.parse::<Pid>().ok())
            {
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
    }
    out
}

/// The fields of `/proc/<pid>/stat` after the command name (the state is the first), or `None`
/// when the process is gone.
fn stat_fields(pid: Pid) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// When `pid` started (clock ticks after boot, `/proc/<pid>/stat` field 22): with the pid, it
/// names one process for good (a pid can be reused, the pair cannot).
#[must_use]
pub fn start_time(pid: Pid) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// Whether `pid` is on its way out: the kernel's `PF_EXITING` flag (`/proc/<pid>/stat` field 9)
/// or a SIGKILL pending for it (`SigPnd`/`ShdPnd` of `/proc/<pid>/status`). True when it is gone.
#[must_use]
pub fn exiting(pid: Pid) -> bool {
    const PF_EXITING: u64 = 0x4;
    let Some(fields) = stat_fields(pid) else {
        return true;
    };
    if matches!(fields.first().map(String::as_str), Some("Z" | "X" | "x")) {
        return true;
    }
    if fields
        .get(6)
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|f| f & PF_EXITING != 0)
    {
        return true;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    sigkill_pending(&status)
}

fn sigkill_pending(status: &str) -> bool {
    let bit = 1u64 << (libc::SIGKILL - 1);
    status.lines().any(|l| {
        ["SigPnd:", "ShdPnd:"].iter().any(|k| {
            l.strip_prefix(k)
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .is_some_and(|m| m & bit != 0)
        })
    })
}

/// Whether `pid` is alive: its `/proc` entry exists and it is not a zombie (or dead).
#[must_use]
pub fn process_alive(pid: Pid) -> bool {
    thread_state(pid, pid).is_some_and(|s| s != 'Z' && s != 'X' && s != 'x')
}

/// The tracer of `tid` according to `/proc/<pid>/task/<tid>/status` (0 = untraced), or `None`
/// when the thread is gone.
#[must_use]
pub fn tracer_of(pid: Pid, tid: Tid) -> Option<i32> {
    tracer_and_seccomp(pid, tid).map(|(t, _)| t)
}

/// The tracer of `tid` (as [`tracer_of`]) and whether it runs under seccomp (its `Seccomp:`
/// mode is not 0, see [`parse_seccomp`]), from one read of its `/proc` status; `None` when the
/// thread is gone.
#[must_use]
pub fn tracer_and_seccomp(pid: Pid, tid: Tid) -> Option<(i32, bool)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    Some((
        parse_tracer(&status)?,
        parse_seccomp(&status).is_some_and(|m| m != 0),
    ))
}

/// The `Seccomp:` mode of a `/proc/<pid>/status` text: 0 none, 1 strict, 2 filter; `None`
/// when the line is missing (a kernel without seccomp) or unreadable.
#[must_use]
pub fn parse_seccomp(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .and_then(|v| v.trim().parse().ok())
}

fn parse_tracer(status: &str) -> Option<i32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_tracer_line() {
        assert_eq!(
            parse_tracer("Name:\tx\nTracerPid:\t1234\nUid:\t0\n"),
            Some(1234)
        );
        assert_eq!(parse_tracer("TracerPid:\t0\n"), Some(0));
        assert_eq!(parse_tracer("Name:\tx\n"), None);
        let me = std::process::id() as i32;
        assert_eq!(tracer_of(me, me), Some(0), "the test process is not traced");
        assert_eq!(tracer_of(me, i32::MAX), None);
    }

    #[test]
    fn ns_pids_come_from_the_last_nspid_entry() {
        let me = std::process::id() as i32;
        assert!(ns_pid(me).is_some());
        assert_eq!(parse_ns_pid("Name:\tx\nNSpid:\t4711\t12\t1\n"), Some(1));
        assert_eq!(parse_ns_pid("NSpid:\t4711\n"), Some(4711));
        assert_eq!(parse_ns_pid("Pid:\t4711\n"), None, "a kernel without NSpid");
        assert_eq!(parse_ns_pid("NSpid:\t\n"), None);
        assert_eq!(parse_ns_pid("NSpid:\t12 x\n"), None);
        assert_eq!(parse_ns_pid("NSpid:\t0\n"), None);
    }

    proptest::proptest! {
        #[test]
        fn ns_pid_parser_takes_the_innermost_pid(pids in proptest::collection::vec(1i32.., 1..5), junk in "[ -~]{0,40}") {
            let text = format!("Name:\t{junk}\nNSpid:\t{}\n", pids.iter().map(ToString::to_string).collect::<Vec<_>>().join("\t"));
            proptest::prop_assert_eq!(parse_ns_pid(&text), pids.last().copied());
            // Never panics on arbitrary text.
            let _ = parse_ns_pid(&junk);
        }
    }

    #[test]
    fn reads_the_seccomp_mode() {
        let text = "Name:\tx\nTracerPid:\t77\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n";
        assert_eq!(parse_seccomp(text), Some(2));
        assert_eq!(parse_seccomp("Seccomp:\t0\n"), Some(0));
        assert_eq!(
            parse_seccomp("Seccomp_filters:\t3\n"),
            None,
            "not the mode line"
        );
        assert_eq!(
            parse_seccomp("Name:\tx\n"),
            None,
            "a kernel without seccomp"
        );
        let me = std::process::id() as i32;
        assert_eq!(
            tracer_and_seccomp(me, me),
            Some((0, false)),
            "the test process is neither traced nor filtered"
        );
        assert_eq!(tracer_and_seccomp(me, i32::MAX), None);
    }

    proptest::proptest! {
        #[test]
        fn seccomp_parser_reads_only_the_mode_line(mode in 0u32..3, filters in 0u32..64, junk in "[ -~]{0,40}") {
            let text = format!("Name:\t{junk}\nSeccomp:\t{mode}\nSeccomp_filters:\t{filters}\n");
            proptest::prop_assert_eq!(parse_seccomp(&text), Some(mode));
            let text = format!("Name:\t{junk}\nSeccomp_filters:\t{filters}\n");
            proptest::prop_assert_eq!(parse_seccomp(&text), None);
            let _ = parse_seccomp(&junk);
        }
    }

    #[test]
    fn start_times_and_pending_kills() {
        let me = std::process::id() as i32;
        let t = start_time(me).unwrap();
        assert_eq!(start_time(me), Some(t), "stable");
        assert_eq!(start_time(i32::MAX), None);
        assert!(!exiting(me));
        assert!(exiting(i32::MAX), "a gone process is as good as exited");
        assert!(sigkill_pending(
            "SigPnd:\t0000000000000000\nShdPnd:\t0000000000000100\n"
        ));
        assert!(!sigkill_pending(
            "SigPnd:\t0000000000000000\nShdPnd:\t0000000000004000\n"
        ));
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(start_time(pid).unwrap() >= t);
        assert!(!exiting(pid));
        let _ = child.kill();
        let _ = child.wait();
        assert!(exiting(pid));
    }

    #[test]
    fn descendants_include_children_of_every_thread() {
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let tree = descendants(me);
        assert_eq!(tree[0], me);
        assert!(tree.contains(&(child.id() as i32)), "{tree:?}");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(descendants(i32::MAX), vec![i32::MAX]);
    }

    #[test]
    fn reads_how_often_a_thread_was_scheduled() {
        assert_eq!(parse_schedstat("76671635 86098663 288\n"), Some(288));
        assert_eq!(parse_schedstat("0 0 0\n"), None, "not counted");
        assert_eq!(parse_schedstat("1 2\n"), None);
        assert_eq!(parse_schedstat("1 2 x\n"), None);
        let me = std::process::id() as i32;
        if std::path::Path::new("/proc/self/schedstat").exists() {
            assert!(times_scheduled(me, me).is_some_and(|n| n > 0));
        }
        assert_eq!(times_scheduled(me, i32::MAX), None);
    }

    #[test]
    fn reads_the_state_after_a_command_name_with_parentheses() {
        assert_eq!(parse_state("42 (a) b) (c) T 1 2 3"), Some('T'));
        assert_eq!(parse_state("42 (cuda) S 1"), Some('S'));
        assert_eq!(parse_state("garbage"), None);
        let me = std::process::id() as i32;
        assert!(process_alive(me));
        assert!(matches!(thread_state(me, me), Some('R' | 'S')));
        assert!(!process_alive(i32::MAX));
    }
}
