//! Every scripted fault kind through the driver API, against live mock workloads: what the
//! caller gets, what happens to the target, which calls a fault matches (function, pid, nth,
//! sticky), and what the trace records.
//!
//! Faults that end or block the calling process (`crash`, `hang` without a file) run in a child
//! process: this test binary started again with only [`child_process_entry`] selected, which
//! makes one driver call named by `MOCK_FAULTS_CHILD_CALL` and prints its result.

mod common;

use abi::{CUprocessState, CUresult};
use common::*;
use mock_libcuda::driver;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testkit::proc::{stat_state, thread_names};

/// One `[[fault]]` table: `function`, extra keys (`nth = 2`, `pid = …`), the inline action.
fn fault(function: &str, keys: &str, action: &str) -> String {
    format!("\n[[fault]]\nfunction = \"{function}\"\n{keys}\naction = {action}\n")
}

/// This process's calls in the world's trace, with `names` given to numbers (pids).
fn my_trace(w: &TestWorld, names: &[(i32, &str)]) -> Vec<String> {
    let trace = w.world.read_trace();
    mock_cuda_world::trace::calls_by(&trace, &std::process::id().to_string())
        .into_iter()
        .map(|l| {
            names
                .iter()
                .fold(l.to_owned(), |l, (n, label)| name_number(&l, *n, label))
        })
        .collect()
}

/// Replaces the whole number `n` (not a longer number containing it) by `label`.
fn name_number(text: &str, n: i32, label: &str) -> String {
    let n = n.to_string();
    let mut out = String::new();
    let mut digits = String::new();
    for c in text.chars().chain(std::iter::once('\n')) {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        out.push_str(if digits == n { label } else { &digits });
        digits.clear();
        out.push(c);
    }
    out.pop();
    out
}

fn assert_traced(w: &TestWorld, line: &str) {
    let trace = w.world.read_trace();
    let mine = mock_cuda_world::trace::calls_by(&trace, &std::process::id().to_string());
    assert!(
        mine.contains(&line),
        "no line {line:?} of this process in the trace:\n{trace}"
    );
}

// ---------------------------------------------------------------------------------------------
// The child process

const CHILD_ENV: &str = "MOCK_FAULTS_CHILD_CALL";

/// Not a test of its own (hence ignored): the body of the child process of the tests below,
/// which start this binary with `--ignored --exact child_process_entry` and
/// `MOCK_FAULTS_CHILD_CALL=<call>:<pid>`, `<call>` one of `lock`, `get-state`, `init`. Prints
/// `CHILD-RESULT <CUresult>`.
#[test]
#[ignore = "the child process of the tests of this file; they start it"]
fn child_process_entry() {
    let call = std::env::var(CHILD_ENV).unwrap_or_else(|_| {
        panic!("{CHILD_ENV} is not set: child_process_entry is started by this file's tests")
    });
    let (op, pid) = call.split_once(':').unwrap_or((call.as_str(), "0"));
    let pid: i32 = pid.parse().unwrap();
    let r = match op {
        "init" => driver::init(0),
        "lock" => driver::lock(pid, 0),
        "get-state" => driver::get_state(pid).map(|_| ()),
        other => panic!("unknown child call {other}"),
    };
    println!("CHILD-RESULT {}", r.err().unwrap_or(CUresult::SUCCESS));
}

/// This test binary, started to make one driver call (`<call>:<pid>`) in world `w`, with core
/// dumps off.
fn child(w: &TestWorld, call: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--ignored",
        "--exact",
        "child_process_entry",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env(CHILD_ENV, call)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    w.env(&mut cmd);
    // SAFETY: runs between fork and exec and only calls setrlimit(2), which is
    // async-signal-safe, with a pointer to a local struct that outlives the call.
    unsafe {
        cmd.pre_exec(|| {
            let zero = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            let _ = libc::setrlimit(libc::RLIMIT_CORE, &zero);
            Ok(())
        });
    }
    cmd
}

// ---------------------------------------------------------------------------------------------
// Fault kinds

#[test]
fn return_fault_returns_its_code_and_changes_nothing() {
    let _s = serial();
    let faults = fault(
        "cuCheckpointProcessLock",
        "",
        r#"{ kind = "return", code = "CUDA_ERROR_NOT_READY" }"#,
    );
    let mut w = TestWorld::new(&config(580, &faults));
    let pid = w.spawn_app(&["--kib", "4"]);
    assert_eq!(driver::lock(pid, 1000), Err(CUresult::ERROR_NOT_READY));
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::RUNNING));
    // One-shot: the next lock is real.
    driver::lock(pid, 1000).unwrap();
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::LOCKED));
    driver::unlock(pid).unwrap();
    assert!(w.verify(0, pid).starts_with("PASS"));
    assert_traced(
        &w,
        &format!("cuCheckpointProcessLock(pid={pid}, timeoutMs=1000) = CUDA_ERROR_NOT_READY"),
    );
}

#[test]
fn error_after_fault_changes_state_then_returns_its_code() {
    let _s = serial();
    let faults = fault(
        "cuCheckpointProcessCheckpoint",
        "",
        r#"{ kind = "error-after", code = "CUDA_ERROR_UNKNOWN" }"#,
    );
    let mut w = TestWorld::new(&config(580, &faults));
    let pid = w.spawn_app(&["--kib", "16"]);
    driver::init(0).unwrap();
    driver::lock(pid, 1000).unwrap();
    assert_eq!(driver::checkpoint(pid), Err(CUresult::ERROR_UNKNOWN));
    assert_eq!(
        driver::get_state(pid),
        Ok(CUprocessState::CHECKPOINTED),
        "the checkpoint happened although the call failed"
    );
    driver::restore(pid, &[]).unwrap();
    driver::unlock(pid).unwrap();
    assert!(w.verify(0, pid).starts_with("PASS"));
    assert_traced(
        &w,
        &format!("cuCheckpointProcessCheckpoint(pid={pid}) = CUDA_ERROR_UNKNOWN"),
    );
}

#[test]
fn fail_fault_puts_the_target_in_failed_state() {
    let _s = serial();
    let faults = fault(
        "cuCheckpointProcessCheckpoint",
        "",
        r#"{ kind = "fail", code = "CUDA_ERROR_OPERATING_SYSTEM" }"#,
    );
    let mut w = TestWorld::new(&config(580, &faults));
    // The workload checks its data once a minute only, so it does not notice the failure
    // (and exit) while the test looks at it.
    let pid = w.spawn_app(&["--kib", "4", "--check-ms", "60000"]);
    driver::init(0).unwrap();
    driver::lock(pid, 1000).unwrap();
    assert_eq!(
        driver::checkpoint(pid),
        Err(CUresult::ERROR_OPERATING_SYSTEM)
    );
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::FAILED));
    assert_eq!(driver::lock(pid, 100), Err(CUresult::ERROR_ILLEGAL_STATE));
    assert_eq!(driver::checkpoint(pid), Err(CUresult::ERROR_ILLEGAL_STATE));
    assert_eq!(
        driver::restore(pid, &[]),
        Err(CUresult::ERROR_ILLEGAL_STATE)
    );
    assert_eq!(driver::unlock(pid), Err(CUresult::ERROR_ILLEGAL_STATE));
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::FAILED));
    assert!(
        driver::get_restore_tid(pid).is_ok(),
        "the process is still there"
    );
    assert_traced(
        &w,
        &format!("cuCheckpointProcessCheckpoint(pid={pid}) = CUDA_ERROR_OPERATING_SYSTEM"),
    );
}

#[test]
fn delay_fault_delays_the_call_and_then_carries_it_out() {
    let _s = serial();
    let faults = fault(
        "cuCheckpointProcessLock",
        "",
        r#"{ kind = "delay", ms = 300 }"#,
    );
    let mut w = TestWorld::new(&config(580, &faults));
    let pid = w.spawn_app(&["--kib", "4"]);
    let t = Instant::now();
    driver::lock(pid, 1000).unwrap();
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::LOCKED));
    driver::unlock(pid).unwrap();
    assert_traced(
        &w,
        &format!("cuCheckpointProcessLock(pid={pid}, timeoutMs=1000) = CUDA_SUCCESS"),
    );
}

#[test]
fn hang_fault_with_a_file_blocks_until_the_file_appears() {
    let _s = serial();
    let faults = fault(
        "cuCheckpointProcessGetRestoreThreadId",
        "",
        r#"{ kind = "hang", file = "release-me" }"#,
    );
    let mut w = TestWorld::new(&config(580, &faults));
    let pid = w.spawn_app(&["--kib", "4"]);
    let file = w.path().join("release-me");
    let creator = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        std::fs::write(file, b"").unwrap();
    });
    let t = Instant::now();
    let tid = driver::get_restore_tid(pid).unwrap();
    let took = t.elapsed();
    creator.join().unwrap();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(thread_names(pid).iter().any(|(t, _)| *t == tid));
}

#[test]
fn hang_fault_without_a_file_blocks_until_the_caller_is_killed() {
    let _s = serial();
    let faults = fault("cuCheckpointProcessLock", "", r#"{ kind = "hang" }"#);
    let mut w = TestWorld::new(&config(580, &faults));
    let pid = w.spawn_app(&["--kib", "4"]);
    let mut c = child(&w, &format!("lock:{pid}")).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        c.try_wait().unwrap().is_none(),
        "the call still blocks after 500 ms"
    );
    c.kill().unwrap();
    let status = c.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert_eq!(
        w.world.read_state().unwrap().fault_counts.get(&0),
        Some(&1),
        "the child's lock matched the fault"
    );
    assert!(
        !w.world.read_trace().contains("cuCheckpointProcessLock"),
        "the hung call never completed"
    );
    // The hang happened before anything was sent: the target is untouched and serves others
    // (the fault was one-shot and the child's call used it up).
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::RUNNING));
    driver::lock(pid, 1000).unwrap();
    driver::unlock(pid).unwrap();
    assert!(w.verify(0, pid).starts_with("PASS"));
}

#[test]
fn crash_fault_kills_the_caller_with_its_signal() {
    let _s = serial();
    let faults = fault("cuCheckpointProcessGetState", "", r#"{ kind = "crash" }"#)
        + &fault(
            "cuCheckpointProcessGetState",
            "nth = 2",
            r#"{ kind = "crash", signal = "SIGABRT" }"#,
        );
    let mut w = TestWorld::new(&config(580, &faults));
    let pid = w.spawn_app(&["--kib", "4"]);
    // Match counts are shared by all processes: the first child's call is the 1st match, the
    // second child's the 2nd.
    for want in [libc::SIGSEGV, libc::SIGABRT] {
        let out = child(&w, &format!("get-state:{pid}")).output().unwrap();
        assert_eq!(out.status.signal(), Some(want), "{out:?}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("CHILD-RESULT"),
            "the call never returned: {out:?}"
        );
    }
    // The third call is not faulted, and the target never noticed.
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::RUNNING));
    assert!(w.verify(0, pid).starts_with("PASS"));
}

#[test]
fn kill_target_fault_kills_the_target_and_the_call_fails() {
    let _s = serial();
    let faults = fault("cuCheckpointProcessLock", "", r#"{ kind = "kill-target" }"#);
    let mut w = TestWorld::new(&config(580, &faults));
    let pid = w.spawn_app(&["--kib", "16"]);
    assert!(w.world.read_state().unwrap().by_pid(pid).is_some());
    assert_eq!(driver::lock(pid, 1000), Err(CUresult::ERROR_INVALID_VALUE));
    let state = stat_state(pid);
    assert!(
        matches!(state, None | Some('Z')),
        "the target is dead: {state:?}"
    );
    assert!(
        w.world.read_state().unwrap().by_pid(pid).is_none(),
        "its world entry is dropped"
    );
    assert_eq!(
        std::fs::read_dir(w.path().join("devmem")).unwrap().count(),
        0,
        "its device memory is released"
    );
    assert_eq!(driver::get_state(pid), Err(CUresult::ERROR_INVALID_VALUE));
    assert_traced(
        &w,
        &format!("cuCheckpointProcessLock(pid={pid}, timeoutMs=1000) = CUDA_ERROR_INVALID_VALUE"),
    );
}

#[test]
fn cuinit_faults_make_init_fail_or_hang() {
    let _s = serial();
    // No workload here: its own cuInit would count as a match.
    let faults = fault(
        "cuInit",
        "",
        r#"{ kind = "return", code = "CUDA_ERROR_NO_DEVICE" }"#,
    ) + &fault(
        "cuInit",
        "nth = 2",
        r#"{ kind = "fail", code = "CUDA_ERROR_OPERATING_SYSTEM" }"#,
    ) + &fault("cuInit", "nth = 3", r#"{ kind = "hang", file = "go" }"#)
        + &fault("cuInit", "nth = 4", r#"{ kind = "hang" }"#);
    let w = TestWorld::new(&config(580, &faults));
    assert_eq!(driver::init(0), Err(CUresult::ERROR_NO_DEVICE));
    assert_eq!(driver::init(0), Err(CUresult::ERROR_OPERATING_SYSTEM));
    let file = w.path().join("go");
    let creator = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        std::fs::write(file, b"").unwrap();
    });
    let t = Instant::now();
    driver::init(0).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(200));
    creator.join().unwrap();
    // The 4th cuInit hangs for good: in a child, which is still blocked after 500 ms.
    let mut c = child(&w, "init").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(c.try_wait().unwrap().is_none(), "cuInit still blocks");
    c.kill().unwrap();
    c.wait().unwrap();
    // The 5th is normal.
    driver::init(0).unwrap();
    let lines = my_trace(&w, &[]);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("cuInit("))
            .collect::<Vec<_>>(),
        [
            "cuInit(flags=0) = CUDA_ERROR_NO_DEVICE",
            "cuInit(flags=0) = CUDA_ERROR_OPERATING_SYSTEM",
            "cuInit(flags=0) = CUDA_SUCCESS",
            "cuInit(flags=0) = CUDA_SUCCESS",
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Matching: pid, nth, sticky

#[test]
fn a_pid_fault_fires_for_its_target_only() {
    let _s = serial();
    let base = config(580, "");
    let mut w = TestWorld::new(&base);
    let a = w.spawn_app(&["--kib", "4"]);
    let b = w.spawn_app(&["--kib", "4"]);
    // The pid is known only now: script the world again before this process first reads it
    // (the running workloads keep the config they read, which is fine: they are the targets).
    let text = base
        + &fault(
            "cuCheckpointProcessGetState",
            &format!("pid = {a}\nsticky = true"),
            r#"{ kind = "return", code = "CUDA_ERROR_NOT_PERMITTED" }"#,
        );
    mock_libcuda::world::config::WorldConfig::parse(&text, "test").unwrap();
    let tmp = w.path().join("world.toml.new");
    std::fs::write(&tmp, &text).unwrap();
    std::fs::rename(&tmp, w.path().join("world.toml")).unwrap();

    let a_tid = driver::get_restore_tid(a).unwrap();
    for _ in 0..2 {
        assert_eq!(driver::get_state(b), Ok(CUprocessState::RUNNING));
        assert_eq!(driver::get_state(a), Err(CUresult::ERROR_NOT_PERMITTED));
        assert_eq!(
            driver::get_state(a_tid),
            Err(CUresult::ERROR_NOT_PERMITTED),
            "any thread id names the process"
        );
    }
    // Only calls that target `a` count: 4 matches for a, none for b.
    assert_eq!(w.world.read_state().unwrap().fault_counts.get(&0), Some(&4));
}

#[test]
fn an_nth_fault_fires_on_the_nth_matching_call_only() {
    let _s = serial();
    let faults = fault(
        "cuCheckpointProcessGetState",
        "nth = 3",
        r#"{ kind = "return", code = "CUDA_ERROR_UNKNOWN" }"#,
    );
    let mut w = TestWorld::new(&config(580, &faults));
    let pid = w.spawn_app(&["--kib", "4"]);
    let got: Vec<_> = (0..5).map(|_| driver::get_state(pid).is_ok()).collect();
    assert_eq!(got, [true, true, false, true, true]);
    // Other functions do not count.
    driver::get_restore_tid(pid).unwrap();
}

#[test]
fn a_sticky_fault_fires_on_every_call_from_the_nth_on() {
    let _s = serial();
    let faults = fault(
        "cuCheckpointProcessGetState",
        "nth = 2\nsticky = true",
        r#"{ kind = "return", code = "CUDA_ERROR_UNKNOWN" }"#,
    );
    let mut w = TestWorld::new(&config(580, &faults));
    let pid = w.spawn_app(&["--kib", "4"]);
    let got: Vec<_> = (0..5).map(|_| driver::get_state(pid).is_ok()).collect();
    assert_eq!(got, [true, false, false, false, false]);
}

/// The trace records each faulted call with the code it returned, in call order.
#[test]
fn faulted_calls_are_traced_with_their_codes() {
    let _s = serial();
    let faults = fault(
        "cuCheckpointProcessLock",
        "",
        r#"{ kind = "return", code = "CUDA_ERROR_NOT_READY" }"#,
    ) + &fault(
        "cuCheckpointProcessLock",
        "nth = 2",
        r#"{ kind = "error-after", code = "CUDA_ERROR_TIMEOUT" }"#,
    ) + &fault(
        "cuCheckpointProcessCheckpoint",
        "",
        r#"{ kind = "delay", ms = 10 }"#,
    ) + &fault(
        "cuCheckpointProcessRestore",
        "sticky = true",
        r#"{ kind = "return", code = 12345 }"#,
    );
    let mut w = TestWorld::new(&config(580, &faults));
    let pid = w.spawn_app(&["--kib", "4"]);
    driver::init(0).unwrap();
    let results = [
        driver::lock(pid, 0),
        driver::lock(pid, 0),
        driver::checkpoint(pid),
        driver::restore(pid, &[]),
        driver::restore(pid, &[]),
        driver::get_state(pid).map(|_| ()),
    ];
    assert_eq!(
        results,
        [
            Err(CUresult::ERROR_NOT_READY),
            Err(CUresult::ERROR_TIMEOUT),
            Ok(()),
            Err(CUresult(12345)),
            Err(CUresult(12345)),
            Ok(()),
        ]
    );
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::CHECKPOINTED));
    let lines = my_trace(&w, &[(pid, "<APP>")]);
    insta::assert_snapshot!(lines.join("\n"));
}
