//! The timeout log (`timeouts.log`): a request that gives up on a target's restore thread, or
//! on the mailbox's `call.lock`, leaves one line saying what `/proc` showed of that thread, and
//! nothing of it reaches the call trace.

mod common;

use abi::CUresult;
use common::*;
use mock_libcuda::driver;
use mock_libcuda::world::timeouts::FILE;
use nix::sys::ptrace;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::time::{Duration, Instant};
use testkit::proc::task_stat_state;
use testkit::wait::wait_for;

/// The lines of the world's timeout log.
fn timeouts(w: &TestWorld) -> Vec<String> {
    testkit::read(&w.path().join(FILE))
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Checks the fields of a timeout line (module `mock_cuda_world::timeouts`).
fn assert_line(line: &str, function: &str, what: &str, fields: &[String]) {
    let me = std::process::id().to_string();
    let words: Vec<&str> = line.split(' ').collect();
    assert!(
        words.len() > 3 && words[0].contains('.') && words[1] == me,
        "time and caller: {line}"
    );
    assert!(
        line.contains(&format!(" {function} gave up after ")),
        "{line}"
    );
    assert!(
        line.contains(&format!(" ms waiting for {what}: ")),
        "{line}"
    );
    for f in fields {
        assert!(words.contains(&f.as_str()), "{f} in {line}");
    }
    let wchan = words
        .iter()
        .find_map(|w| w.strip_prefix("wchan="))
        .unwrap_or_else(|| panic!("wchan in {line}"));
    assert!(!wchan.is_empty(), "{line}");
}

/// The call trace says nothing of the timeout log's facts.
fn assert_trace_clean(w: &TestWorld) {
    let trace = w.world.read_trace();
    for word in ["gave up", "restore_tid=", "wchan=", "tracer="] {
        assert!(!trace.contains(word), "`{word}` in the trace:\n{trace}");
    }
}

#[test]
fn a_request_to_a_sigstopped_target_logs_its_stopped_restore_thread() {
    let _s = serial();
    let mut w = TestWorld::new(&config(580, ""));
    let pid = w.spawn_app(&["--kib", "4"]);
    let tid = driver::get_restore_tid(pid).unwrap();
    assert!(timeouts(&w).is_empty(), "nothing timed out yet");
    kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
    wait_for(
        Duration::from_secs(5),
        || task_stat_state(pid, tid) == Some('T'),
        "the restore thread to stop",
    );

    let t = Instant::now();
    assert_eq!(driver::lock(pid, 0), Err(CUresult::ERROR_TIMEOUT));
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "the world's timeout"
    );
    let lines = timeouts(&w);
    assert_eq!(lines.len(), 1, "one line per timeout: {lines:?}");
    assert_line(
        &lines[0],
        "cuCheckpointProcessLock",
        "the answer",
        &[
            format!("target={pid}"),
            format!("restore_tid={tid}"),
            "taken=no".to_owned(),
            "state=T".to_owned(),
            "tracer=0".to_owned(),
        ],
    );
    // A lock with its own timeout gives up the same way (the caller gets NOT_READY).
    assert_eq!(driver::lock(pid, 100), Err(CUresult::ERROR_NOT_READY));
    let lines = timeouts(&w);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[1].contains(" state=T "), "{}", lines[1]);
    assert_trace_clean(&w);

    kill(Pid::from_raw(pid), Signal::SIGCONT).unwrap();
    driver::lock(pid, 1000).unwrap();
    driver::unlock(pid).unwrap();
    assert_eq!(timeouts(&w).len(), 2, "answered requests log nothing");
}

/// Waits for the ptrace stop of `tid`, which this thread traces.
fn wait_stop(tid: i32) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        match waitpid(
            Pid::from_raw(tid),
            Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG),
        ) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => {
                return Err(format!("thread {tid} exited"))
            }
            Ok(_) => return Ok(()),
            Err(e) => return Err(format!("waitpid({tid}): {e}")),
        }
        if Instant::now() > end {
            return Err(format!("thread {tid} did not stop"));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

#[test]
fn a_request_to_a_ptrace_frozen_restore_thread_logs_its_tracer() {
    let _s = serial();
    let mut w = TestWorld::new(&config(580, ""));
    let pid = w.spawn_app(&["--kib", "4"]);
    let tid = driver::get_restore_tid(pid).unwrap();
    let t = Pid::from_raw(tid);
    // Frozen as CRIU freezes a thread (this thread is the tracer).
    if let Err(e) = ptrace::seize(t, ptrace::Options::PTRACE_O_TRACESYSGOOD) {
        eprintln!("skipped: ptrace is not permitted here (PTRACE_SEIZE: {e})");
        return;
    }
    let frozen = ptrace::interrupt(t)
        .map_err(|e| format!("PTRACE_INTERRUPT: {e}"))
        .and_then(|()| wait_stop(tid));
    let result = frozen.map(|()| {
        assert_eq!(task_stat_state(pid, tid), Some('t'));
        assert_eq!(driver::unlock(pid), Err(CUresult::ERROR_TIMEOUT));
        timeouts(&w)
    });
    let _ = ptrace::detach(t, None);
    let lines = result.unwrap();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_line(
        &lines[0],
        "cuCheckpointProcessUnlock",
        "the answer",
        &[
            format!("target={pid}"),
            format!("restore_tid={tid}"),
            "taken=no".to_owned(),
            "state=t".to_owned(),
            format!("tracer={}", nix::unistd::gettid()),
        ],
    );
    assert_trace_clean(&w);
}

#[test]
fn a_request_that_cannot_get_call_lock_logs_the_lock() {
    let _s = serial();
    let mut w = TestWorld::new(&config(580, ""));
    let pid = w.spawn_app(&["--kib", "4"]);
    let tid = driver::get_restore_tid(pid).unwrap();
    // Another caller's request in flight holds the mailbox's call.lock.
    let mailboxes: Vec<_> = std::fs::read_dir(w.path().join("mailbox"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(mailboxes.len(), 1, "{mailboxes:?}");
    let held = mock_libcuda::world::sys::FileLock::acquire(
        &mailboxes[0].join("call.lock"),
        Instant::now() + Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(driver::lock(pid, 0), Err(CUresult::ERROR_TIMEOUT));
    drop(held);
    let lines = timeouts(&w);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_line(
        &lines[0],
        "cuCheckpointProcessLock",
        "call.lock",
        &[
            format!("target={pid}"),
            format!("restore_tid={tid}"),
            "taken=-".to_owned(),
            "tracer=0".to_owned(),
        ],
    );
    assert!(
        ["state=S", "state=R"]
            .iter()
            .any(|s| lines[0].split(' ').any(|w| w == *s)),
        "the restore thread waits for requests: {}",
        lines[0]
    );
    assert_trace_clean(&w);
    // The lock is free again: the target answers.
    driver::lock(pid, 1000).unwrap();
    driver::unlock(pid).unwrap();
    assert_eq!(timeouts(&w).len(), 1);
}
