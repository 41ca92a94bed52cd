//! Running only the CUDA restore thread of a task CRIU holds stopped.
//!
//! During CHECKPOINT_DEVICES, DUMP_FINISH/exit and RESUME_DEVICES_LATE every thread of the task is
//! ptrace-stopped by CRIU, but checkpoint requests are served by the target's restore thread.
//! So the plugin lets exactly that thread run for the duration of the request and then stops it
//! again exactly as CRIU left it (CRIU's C plugin does the same):
//!
//! * resume: save the signal mask (`PTRACE_GETSIGMASK`), block every signal but SIGTRAP
//!   (`PTRACE_SETSIGMASK`), drop the ptrace options so the thread's seccomp filter applies while it
//!   runs (`PTRACE_SETOPTIONS 0`), `PTRACE_CONT`;
//! * re-stop: `PTRACE_INTERRUPT`, wait for the stop (`waitpid(__WALL)`, polled with a deadline),
//!   `PTRACE_SETOPTIONS PTRACE_O_SUSPEND_SECCOMP | PTRACE_O_TRACESYSGOOD`, restore the mask.
//!
//! A thread that is not traced by this process (the task was never seized, e.g. a rollback after
//! a failed PAUSE_DEVICES) is left alone: it is running anyway. The real implementation is
//! [`crate::ffi::ptrace::Ptrace`].

use crate::backend::{Pid, Tid};

/// Proof that [`ThreadControl::resume`] ran; hand it back to [`ThreadControl::restop`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a resumed thread must be stopped again"]
pub struct Resumed {
    pub pid: Pid,
    pub tid: Tid,
    /// The saved signal mask, or `None` when the thread was not ours to stop (nothing changed).
    pub saved_sigmask: Option<u64>,
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
}

/// Resume one thread of a stopped task, and stop it again.
pub trait ThreadControl: Send {
    /// Lets `tid` (a thread of `pid`) run, if this process traces it.
    fn resume(&mut self, pid: Pid, tid: Tid) -> Result<Resumed, ThreadError>;
    /// Stops the thread again and restores what `resume` changed.
    fn restop(&mut self, resumed: Resumed) -> Result<(), ThreadError>;
    /// Whether `tid` is a thread of `pid` (used to trust a TID recorded at dump time).
    fn thread_exists(&self, pid: Pid, tid: Tid) -> bool;
}

/// The tracer of `tid` according to `/proc/<pid>/task/<tid>/status` (0 = untraced), or `None`
/// when the thread is gone.
#[must_use]
pub fn tracer_of(pid: Pid, tid: Tid) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    parse_tracer(&status)
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
}
