//! The timeout log (`timeouts.log`): one line per driver request that gave up waiting for a
//! target's restore thread, or for the mailbox's `call.lock` (another caller's request to the
//! same target in flight), with what `/proc` said of the restore thread at that moment. It is
//! for the post-mortem of a failed run (the scenario runner and the real-CRIU tests print it),
//! and is kept apart from the call trace (`trace.log`), of which scenario snapshots are made.
//!
//! Each line is appended with a single `write(2)` on an `O_APPEND` descriptor, so lines from
//! concurrent processes never interleave. Format (one line, fields separated by one space):
//!
//! ```text
//! <unix time> <caller> <program> <function> gave up after <N> ms waiting for <what>: target=<pid> restore_tid=<tid> taken=<yes|no|-> state=<S> wchan=<symbol> tracer=<pid>
//! ```
//!
//! e.g. `1750000000.123 4242 cuda-guardian cuCheckpointProcessCheckpoint gave up after 10000 ms
//! waiting for the answer: target=4250 restore_tid=4253 taken=no state=t wchan=ptrace_stop
//! tracer=4242` (on one line). `<caller>` and `<program>` are the call trace's (module
//! [`crate::trace`]); `<what>` is `the answer` or `call.lock`; `taken` says whether the restore
//! thread had picked the request up (`-` for a `call.lock` timeout, where the request was not
//! sent); `state` is the thread's scheduler state (`/proc/<pid>/task/<tid>/stat`: `t` a ptrace
//! stop, `T` a stop signal), `wchan` where it sleeps in the kernel (`wchan`, `0` when it runs)
//! and `tracer` its `TracerPid` (0 when untraced). A value that cannot be read is `?`.

use super::World;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// The timeout log's file name in the world directory.
pub const FILE: &str = "timeouts.log";

/// The error log's file name in the world directory: one line per world error (the state or
/// its lock unreadable, a restore thread that never started) that a mock driver call answered
/// with `CUDA_ERROR_OPERATING_SYSTEM`, which says nothing of the cause by itself:
/// `<unix time> <caller> <program> <what failed>: <why>`, appended like the timeout log.
pub const ERRORS_FILE: &str = "errors.log";

/// What a caller was waiting for when it gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// The restore thread's answer to its request; `taken`: the thread had picked the request
    /// up.
    Answer { taken: bool },
    /// The mailbox's `call.lock`, held by another caller whose request is in flight.
    CallLock,
}

/// One request that timed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout<'a> {
    /// The driver function (`cuCheckpointProcessCheckpoint`, …).
    pub function: &'a str,
    /// The target process, in the caller's view.
    pub target: i32,
    /// Its restore thread, in the caller's view, when it has one.
    pub restore_tid: Option<i32>,
    /// What the caller waited for.
    pub waited: Waited,
    /// How long it waited.
    pub after: Duration,
}

/// What `/proc` says of a thread: its scheduler state, its wait channel and its tracer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ThreadFacts {
    /// The state letter of `/proc/<pid>/task/<tid>/stat`.
    pub state: Option<char>,
    /// `/proc/<pid>/task/<tid>/wchan` (`0` while it runs).
    pub wchan: Option<String>,
    /// `TracerPid:` of `/proc/<pid>/task/<tid>/status`.
    pub tracer: Option<i32>,
}

/// What `/proc` says of thread `tid` of `pid` now (all `None` when it is gone).
#[must_use]
pub fn thread_facts(pid: i32, tid: i32) -> ThreadFacts {
    let dir = format!("/proc/{pid}/task/{tid}");
    let state = std::fs::read_to_string(format!("{dir}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')')?.1.trim_start().chars().next());
    let wchan = std::fs::read_to_string(format!("{dir}/wchan"))
        .ok()
        .map(|w| w.split_whitespace().collect::<Vec<_>>().join("_"))
        .filter(|w| !w.is_empty());
    let tracer = std::fs::read_to_string(format!("{dir}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))?
                .trim()
                .parse()
                .ok()
        });
    ThreadFacts {
        state,
        wchan,
        tracer,
    }
}

/// The line (without its newline) for timeout `t` seen by `caller` (`program`) at `unix` (a
/// time since the epoch), with `facts` of the restore thread (module documentation).
#[must_use]
pub fn line(
    unix: Duration,
    caller: &str,
    program: &str,
    t: &Timeout<'_>,
    facts: &ThreadFacts,
) -> String {
    fn or_unknown<T: ToString>(v: Option<T>) -> String {
        v.map_or_else(|| "?".to_owned(), |v| v.to_string())
    }
    let (what, taken) = match t.waited {
        Waited::Answer { taken } => ("the answer", if taken { "yes" } else { "no" }),
        Waited::CallLock => ("call.lock", "-"),
    };
    format!(
        "{}.{:03} {caller} {program} {} gave up after {} ms waiting for {what}: target={} \
         restore_tid={} taken={taken} state={} wchan={} tracer={}",
        unix.as_secs(),
        unix.subsec_millis(),
        t.function,
        t.after.as_millis(),
        t.target,
        or_unknown(t.restore_tid),
        or_unknown(facts.state),
        or_unknown(facts.wchan.as_deref()),
        or_unknown(facts.tracer),
    )
}

impl World {
    /// The world's timeout log (module documentation).
    #[must_use]
    pub fn timeouts_path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// Appends timeout `t` to the timeout log, with what `/proc` says of the restore thread
    /// now. Never fails the call it records.
    pub fn log_timeout(&self, t: &Timeout<'_>) {
        let facts = t
            .restore_tid
            .map(|tid| thread_facts(t.target, tid))
            .unwrap_or_default();
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let text = line(unix, &self.caller(), &super::trace::program(), t, &facts) + "\n";
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.timeouts_path())
        {
            let _ = f.write_all(text.as_bytes());
        }
    }

    /// Appends `what` (what failed, and why) to the error log ([`ERRORS_FILE`]). Never fails.
    pub fn log_error(&self, what: &str) {
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let text = format!(
            "{}.{:03} {} {} {}\n",
            unix.as_secs(),
            unix.subsec_millis(),
            self.caller_in(self.known_host_pid_ns()),
            super::trace::program(),
            what.replace('\n', " ")
        );
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.dir.join(ERRORS_FILE))
        {
            let _ = f.write_all(text.as_bytes());
        }
    }

    /// The timeout log so far (empty when nothing timed out).
    #[must_use]
    pub fn read_timeouts(&self) -> String {
        std::fs::read_to_string(self.timeouts_path()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_says_what_timed_out_and_what_the_thread_did() {
        let t = Timeout {
            function: "cuCheckpointProcessCheckpoint",
            target: 4250,
            restore_tid: Some(4253),
            waited: Waited::Answer { taken: false },
            after: Duration::from_millis(10_000),
        };
        let facts = ThreadFacts {
            state: Some('t'),
            wchan: Some("ptrace_stop".to_owned()),
            tracer: Some(4242),
        };
        assert_eq!(
            line(
                Duration::from_millis(1_750_000_000_123),
                "4242",
                "cuda-guardian",
                &t,
                &facts
            ),
            "1750000000.123 4242 cuda-guardian cuCheckpointProcessCheckpoint gave up after \
             10000 ms waiting for the answer: target=4250 restore_tid=4253 taken=no state=t \
             wchan=ptrace_stop tracer=4242"
        );
        let lock = Timeout {
            waited: Waited::CallLock,
            restore_tid: None,
            ..t
        };
        assert_eq!(
            line(
                Duration::from_millis(5),
                "1@pid:[4026532175]",
                "criu",
                &lock,
                &ThreadFacts::default()
            ),
            "0.005 1@pid:[4026532175] criu cuCheckpointProcessCheckpoint gave up after 10000 ms \
             waiting for call.lock: target=4250 restore_tid=? taken=- state=? wchan=? tracer=?"
        );
    }

    #[test]
    fn facts_of_a_live_thread_and_of_none() {
        let me = std::process::id() as i32;
        let f = thread_facts(me, me);
        assert!(matches!(f.state, Some('R' | 'S')), "{f:?}");
        assert_eq!(f.tracer, Some(0), "the test process is not traced");
        assert_eq!(thread_facts(me, i32::MAX), ThreadFacts::default());
    }
}
