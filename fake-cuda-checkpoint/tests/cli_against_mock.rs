//! The real `cuda-checkpoint` binary against real mock worlds: the mock `libcuda.so.1`, live
//! `mock-cuda-app` workloads, and an independent API client (`support/api_probe.c`) in other
//! processes. Where the mock's artifacts come from (and when they are built) is described in
//! `support/mod.rs`.

mod support;

use std::time::Duration;
use support::*;

#[test]
fn without_libcuda_the_loader_fails_with_127() {
    let a = artifacts();
    let empty = tempfile::tempdir().unwrap();
    let r = std::process::Command::new(&a.cuda_checkpoint)
        .arg("--help")
        .env("LD_LIBRARY_PATH", empty.path())
        .env_remove("MOCK_CUDA_WORLD")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&r.stderr);
    if r.status.code() == Some(127) {
        assert_eq!(
            stderr.replace(&a.cuda_checkpoint.display().to_string(), "<ARGV0>"),
            "<ARGV0>: error while loading shared libraries: libcuda.so.1: cannot open shared \
             object file: No such file or directory\n"
        );
        assert!(r.stdout.is_empty());
    } else {
        // A host with a real driver installed: the search finds it. The broken library below
        // still covers the loader path.
        eprintln!("libcuda.so.1 is installed on this host; the not-found case is skipped");
    }

    // A libcuda.so.1 that is not a library: the loader's message, exit 127, on any host.
    std::fs::write(empty.path().join("libcuda.so.1"), b"").unwrap();
    let r = std::process::Command::new(&a.cuda_checkpoint)
        .args(["--get-state", "--pid", "1"])
        .env("LD_LIBRARY_PATH", empty.path())
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert!(
        stderr.starts_with(&format!(
            "{}: error while loading shared libraries: ",
            a.cuda_checkpoint.display()
        )) && stderr.contains("libcuda.so.1"),
        "{stderr}"
    );
}

#[test]
fn a_driver_older_than_12040_is_insufficient() {
    let w = World::new(&config(550, "cuda_version = 12030", false, ""));
    for args in [&["--help"][..], &["--toggle", "--pid", "1"]] {
        let r = w.cli(args);
        assert_eq!(r.code(), 255, "{r:?}");
        assert_eq!(r.stderr, "Insufficient driver\n");
        assert_eq!(r.stdout, "");
    }
    // The utility asks the version and stops there: the command line never ran.
    let trace = w.trace();
    assert!(
        trace.contains(" cuDriverGetVersion() = CUDA_SUCCESS"),
        "{trace}"
    );
    assert!(!trace.contains("cuGetExportTable"), "{trace}");
    assert!(!trace.contains("cuda-checkpoint("), "{trace}");
}

/// Makes a text independent of the run: the workload's pid and restore TID, GPU UUIDs.
fn normalise(text: &str, pid: i32, tid: &str) -> String {
    let mut names = vec![(i64::from(pid), "<PID>")];
    if let Ok(t) = tid.parse() {
        names.push((t, "<TID>"));
    }
    name_numbers(text, &names)
        .replace(GPU0, "<GPU0>")
        .replace(GPU1, "<GPU1>")
}

/// One command line per line of the table, with its exit status and outputs.
fn discovery(w: &World, pid: i32, tid: &str, runs: &[Vec<String>]) -> String {
    let help = w.cli(&["--help"]);
    let mut out = String::new();
    for args in runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = w.cli(&args);
        let show = |s: &str| {
            if s.is_empty() {
                "-".to_owned()
            } else if s == help.stdout {
                "<the --help text below>".to_owned()
            } else {
                format!("{:?}", normalise(s, pid, tid))
            }
        };
        let line = format!(
            "$ cuda-checkpoint{}\n  exit {} | stdout {} | stderr {}\n",
            normalise(
                &args.iter().map(|a| format!(" {a}")).collect::<String>(),
                pid,
                tid
            ),
            r.code(),
            show(&r.stdout),
            show(&r.stderr),
        );
        out.push_str(&line);
    }
    out.push_str("\n--help:\n");
    out.push_str(&help.stdout);
    out
}

/// Help text and flag discovery, end to end, per driver generation: which options each
/// generation knows (`--action` from r555, `--device-map` from r580, `--launch-job` from
/// r590, `-h` from r555: r550 only knows `--help`), and what a live workload answers.
#[test]
fn help_and_flag_discovery_per_generation() {
    for branch in [550, 555, 580, 590] {
        let mut w = World::new(&config(branch, "", false, ""));
        let pid = w.spawn_app(&["--kib", "4"]);
        let p = pid.to_string();
        let map = format!("{GPU0}={GPU0},{GPU1}={GPU1}");
        // The restore TID varies; only generations with --get-restore-tid print it.
        let tid = if branch >= 555 {
            w.cli_ok(&["--get-restore-tid", "--pid", &p])
                .trim()
                .to_owned()
        } else {
            String::new()
        };
        let runs: Vec<Vec<String>> = [
            vec!["--help"],
            vec!["-h"],
            vec![],
            vec!["--bogus"],
            vec!["--get-state", "--pid", &p],
            vec!["--get-state", "-p", &p],
            vec!["--get-restore-tid", "--pid", &p],
            vec!["--action", "lock", "--pid", &p, "--timeout", "2000"],
            vec!["--get-state", "--pid", &p],
            vec!["--action", "unlock", "--pid", &p],
            vec!["--toggle", "--pid", &p],
            vec!["--get-state", "--pid", &p],
            vec!["--action", "restore", "--pid", &p, "--device-map", &map],
            vec!["--action", "unlock", "--pid", &p],
            vec!["--toggle", "--pid", &p],
            vec!["--toggle", "--pid", &p, "-d", &map],
            vec!["--get-state", "--pid", &p],
            vec!["--action", "lock", "--pid", &p, "--device-map", &map],
            vec!["--launch-job", "/bin/true"],
        ]
        .into_iter()
        .map(|v| v.into_iter().map(str::to_owned).collect())
        .collect();
        let table = discovery(&w, pid, &tid, &runs);
        // Whatever the generation did, the workload's data survived it.
        let line = w.verify(0, pid);
        assert!(line.starts_with("PASS"), "r{branch}: {line}");
        // What tools grep for: `-h` (r555+) exits 0 and mentions `--action`; r580+ mentions
        // `--device-map`.
        let h = w.cli(&[if branch == 550 { "--help" } else { "-h" }]);
        assert_eq!(h.code(), 0);
        assert_eq!(h.stdout.contains("--action"), branch >= 555, "r{branch}");
        assert_eq!(
            h.stdout.contains("--device-map"),
            branch >= 580,
            "r{branch}"
        );
        assert_eq!(
            h.stdout.contains("--launch-job"),
            branch >= 590,
            "r{branch}"
        );
        insta::assert_snapshot!(format!("discovery_r{branch}"), table);
    }
}

#[test]
fn get_state_reports_running_for_a_live_workload() {
    let mut w = World::new(&config(580, "", false, ""));
    let pid = w.spawn_app(&["--kib", "4", "--threads", "1"]);
    let r = w.cli(&["--get-state", "--pid", &pid.to_string()]);
    assert_eq!(
        (r.code(), r.stdout.as_str(), r.stderr.as_str()),
        (0, "running\n", "")
    );
    // Any thread id names the process, the restore thread's included.
    let tid = w.cli_ok(&["--get-restore-tid", "--pid", &pid.to_string()]);
    let tid = tid.trim();
    assert_ne!(tid, pid.to_string());
    assert!(
        std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists(),
        "the restore thread {tid} is a thread of {pid}"
    );
    assert_eq!(w.cli_state(tid.parse().unwrap()), "running");
    // A process that is not a CUDA process: the utility's message and INVALID_VALUE's status.
    let me = std::process::id();
    let r = w.cli(&["--get-state", "--pid", &me.to_string()]);
    assert_eq!(r.code(), 1);
    assert_eq!(
        r.stderr,
        format!("Error getting process state for process ID {me}: \"invalid argument\"\n")
    );
}

/// A state change made through the utility is seen through the driver API by another process,
/// and one made through the API by another process is seen by the utility; the workload's own
/// view follows both, and the world's state file agrees.
#[test]
fn state_changes_are_seen_across_processes_both_ways() {
    let mut w = World::new(&config(580, "", false, ""));
    let app = w.spawn_app(&["--gpus", "0,1", "--kib", "16"]);
    let p = app.to_string();

    // CLI -> API.
    let lock = w.cli(&["--action", "lock", "--pid", &p]);
    assert_eq!(lock.code(), 0, "{lock:?}");
    assert_eq!(w.probe(&["getstate", &p]), "result=0 state=1");
    assert_eq!(w.status_state(app), Some(CudaState::Locked));
    let ckpt = w.cli(&["--action", "checkpoint", "--pid", &p]);
    assert_eq!(ckpt.code(), 0, "{ckpt:?}");
    assert_eq!(w.probe(&["getstate", &p]), "result=0 state=2");
    assert_eq!(w.status_state(app), Some(CudaState::Checkpointed));

    // API -> CLI.
    assert_eq!(w.probe(&["restore", &p]), "result=0");
    assert_eq!(w.cli_state(app), "locked");
    assert_eq!(w.probe(&["unlock", &p]), "result=0");
    assert_eq!(w.cli_state(app), "running");
    assert_eq!(w.status_state(app), Some(CudaState::Running));
    // Both sides name the same restore thread.
    let tid = w.cli_ok(&["--get-restore-tid", "--pid", &p]);
    assert_eq!(
        w.probe(&["tid", &p]),
        format!("result=0 tid={}", tid.trim())
    );
    // The reverse of the first step: a lock by the API, an unlock by the utility.
    assert_eq!(w.probe(&["lock", &p, "1000"]), "result=0");
    assert_eq!(w.cli_state(app), "locked");
    w.cli_ok(&["--action", "unlock", "--pid", &p]);
    assert_eq!(w.probe(&["getstate", &p]), "result=0 state=0");

    let line = w.verify(0, app);
    assert!(line.starts_with("PASS"), "{line}");

    // The trace names each caller: the utility's calls come from its own process.
    let trace = w.trace();
    assert!(
        trace.contains(&format!(
            "{} cuda-checkpoint cuCheckpointProcessLock(pid={app}, timeoutMs=0) = CUDA_SUCCESS\n{} cuda-checkpoint cuda-checkpoint(--action lock --pid {app}) = exit=0\n",
            lock.pid, lock.pid
        )),
        "{trace}"
    );
    let ckpt_line = format!(
        "{} cuda-checkpoint cuCheckpointProcessCheckpoint(pid={app}) = CUDA_SUCCESS",
        ckpt.pid
    );
    assert!(trace.contains(&ckpt_line), "{trace}");
    let restores: Vec<&str> = trace
        .lines()
        .filter(|l| {
            l.ends_with(&format!(
                "cuCheckpointProcessRestore(pid={app}) = CUDA_SUCCESS"
            ))
        })
        .collect();
    assert_eq!(restores.len(), 1, "{trace}");
    let prober: i32 = restores[0].split(' ').next().unwrap().parse().unwrap();
    assert!(prober != app && prober != lock.pid && prober != ckpt.pid);
}

#[test]
fn an_action_in_the_wrong_state_exits_145() {
    let mut w = World::new(&config(580, "", false, ""));
    let app = w.spawn_app(&["--kib", "4"]);
    let p = app.to_string();
    for (action, verb) in [
        ("checkpoint", "checkpoint"),
        ("restore", "restore"),
        ("unlock", "unlock"),
    ] {
        let r = w.cli(&["--action", action, "--pid", &p]);
        assert_eq!(r.code(), 145, "{r:?}");
        assert_eq!(
            r.stderr,
            format!(
                "Could not {verb} on process ID {app}: \"the operation cannot be performed in the present state\"\n"
            )
        );
        assert_eq!(r.stdout, "");
    }
    w.cli_ok(&["--action", "lock", "--pid", &p]);
    let r = w.cli(&["--action", "lock", "--pid", &p]);
    assert_eq!(r.code(), 145, "locking twice: {r:?}");
    let r = w.cli(&["--toggle", "--pid", &p]);
    assert_eq!(r.code(), 145, "toggling a locked process: {r:?}");
    assert!(r
        .stderr
        .starts_with(&format!("Error toggling CUDA in process ID {app}: ")));
    assert_eq!(w.cli_state(app), "locked", "failed actions change nothing");
    w.cli_ok(&["--action", "unlock", "--pid", &p]);
    assert!(w.verify(0, app).starts_with("PASS"));
}

/// r550's only operation, end to end: a toggle checkpoints, a second one restores, the
/// workload's data is intact (r550 has no --get-state: the world's state file is the witness).
#[test]
fn toggle_round_trip_keeps_gpu_data() {
    let mut w = World::new(&config(550, "", false, ""));
    let app = w.spawn_app(&["--gpus", "0,1", "--kib", "64", "--threads", "2"]);
    let p = app.to_string();
    assert_eq!(w.status_state(app), Some(CudaState::Running));
    w.cli_ok(&["--toggle", "--pid", &p]);
    assert_eq!(w.status_state(app), Some(CudaState::Checkpointed));
    let devmem = std::fs::read_dir(w.dir().join("devmem")).unwrap().count();
    assert_eq!(devmem, 0, "checkpointed memory lives in the process");
    w.cli_ok(&["--toggle", "--pid", &p]);
    assert_eq!(w.status_state(app), Some(CudaState::Running));
    let line = w.verify(0, app);
    assert!(line.starts_with("PASS"), "{line}");
    assert!(line.ends_with(&format!("gpus={GPU0},{GPU1}")), "{line}");
}

#[test]
fn device_map_restores_onto_swapped_gpus() {
    let mut w = World::new(&config(580, "", true, ""));
    let app = w.spawn_app(&["--gpus", "0,1", "--kib", "32"]);
    let p = app.to_string();
    w.cli_ok(&["--action", "lock", "--pid", &p, "--timeout", "2000"]);
    w.cli_ok(&["--action", "checkpoint", "--pid", &p]);
    // A map onto another chip is refused by the driver; the checkpoint stays intact.
    let bad = format!("{GPU0}={GPU2},{GPU1}={GPU0}");
    let r = w.cli(&["--action", "restore", "--pid", &p, "-d", &bad]);
    assert_eq!(r.code(), 1, "{r:?}");
    assert_eq!(
        r.stderr,
        format!("Could not restore on process ID {app}: \"invalid argument\"\n")
    );
    assert_eq!(w.cli_state(app), "checkpointed");
    let swap = format!("{GPU0}={GPU1},{GPU1}={GPU0}");
    w.cli_ok(&["--action", "restore", "--pid", &p, "--device-map", &swap]);
    w.cli_ok(&["--action", "unlock", "--pid", &p]);
    let line = w.verify(0, app);
    assert!(line.starts_with("PASS"), "{line}");
    assert!(
        line.ends_with(&format!("gpus={GPU1},{GPU0}")),
        "the workload's allocations now report the swapped GPUs: {line}"
    );
    assert!(
        w.trace().contains(&format!(
            "cuCheckpointProcessRestore(pid={app}, gpuPairs=[{swap}]) = CUDA_SUCCESS"
        )),
        "{}",
        w.trace()
    );
}

#[test]
fn device_map_is_refused_for_other_actions() {
    let mut w = World::new(&config(580, "", false, ""));
    let app = w.spawn_app(&["--kib", "4"]);
    let p = app.to_string();
    let map = format!("{GPU0}={GPU1}");
    for action in ["lock", "checkpoint", "unlock"] {
        let r = w.cli(&["--action", action, "--pid", &p, "--device-map", &map]);
        assert_eq!(r.code(), 1, "{action}: {r:?}");
        assert_eq!(
            r.stderr,
            "cuda-checkpoint: --device-map is only allowed for restore action\n\
             Try 'cuda-checkpoint --help' for more information.\n"
        );
    }
    assert_eq!(w.cli_state(app), "running");
    let trace = w.trace();
    assert!(
        !trace.contains("cuCheckpointProcessLock"),
        "a refused command line makes no driver call: {trace}"
    );
}

/// A target whose restore thread cannot run (SIGSTOP) makes a lock fail after its timeout
/// instead of hanging; reading the state still answers; nothing is left half-done.
#[test]
fn a_stopped_target_times_out_instead_of_hanging() {
    let mut w = World::new(&config(580, "", false, ""));
    let app = w.spawn_app(&["--kib", "4"]);
    let p = app.to_string();
    assert!(signal(app, SIGSTOP));
    wait_stopped(app);

    let r = w.cli(&["--action", "lock", "--pid", &p, "--timeout", "300"]);
    assert_eq!(r.code(), 88, "CUDA_ERROR_NOT_READY (600 % 256): {r:?}");
    assert_eq!(
        r.stderr,
        format!("Could not lock on process ID {app}: \"device not ready\"\n")
    );
    assert!(
        r.elapsed >= Duration::from_millis(300) && r.elapsed < Duration::from_secs(3),
        "gave up after {:?}",
        r.elapsed
    );
    assert_eq!(
        w.cli_state(app),
        "running",
        "get-state answers a stopped target"
    );

    // Without --timeout the driver's own request timeout (800 ms in this world) applies.
    let r = w.cli(&["--toggle", "--pid", &p]);
    assert_eq!(r.code(), 141, "CUDA_ERROR_TIMEOUT (909 % 256): {r:?}");
    assert!(r.elapsed < Duration::from_secs(4), "{:?}", r.elapsed);

    assert!(signal(app, SIGCONT));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(w.cli_state(app), "running", "withdrawn requests never ran");
    w.cli_ok(&["--action", "lock", "--pid", &p, "--timeout", "2000"]);
    w.cli_ok(&["--action", "unlock", "--pid", &p]);
    assert!(w.verify(0, app).starts_with("PASS"));
}

/// `cuda-checkpoint:<op>` faults: what the utility's caller sees.
#[test]
fn scripted_cli_faults() {
    let faults = r#"
[[fault]]
function = "cuda-checkpoint:get-restore-tid"
action = { kind = "garbage", text = "tid: lots\n\u0001", status = 0 }

[[fault]]
function = "cuda-checkpoint:get-state"
nth = 2
action = { kind = "garbage", text = "", status = 7 }

[[fault]]
function = "cuda-checkpoint:lock"
action = { kind = "return", code = "CUDA_ERROR_NOT_READY" }

[[fault]]
function = "cuda-checkpoint:lock"
nth = 2
action = { kind = "error-after", code = "CUDA_ERROR_UNKNOWN" }

[[fault]]
function = "cuda-checkpoint:unlock"
action = { kind = "delay", ms = 300 }

[[fault]]
function = "cuda-checkpoint:checkpoint"
action = { kind = "crash" }

[[fault]]
function = "cuda-checkpoint:checkpoint"
nth = 2
action = { kind = "crash", signal = "SIGABRT" }
"#;
    let mut w = World::new(&config(580, "", false, faults));
    let app = w.spawn_app(&["--kib", "4"]);
    let p = app.to_string();

    // garbage: the text as is, the scripted status, nothing else.
    let r = w.cli(&["--get-restore-tid", "--pid", &p]);
    assert_eq!(
        (r.code(), r.stdout.as_str(), r.stderr.as_str()),
        (0, "tid: lots\n\u{1}", "")
    );
    // One-shot: the next call is served normally.
    let tid = w.cli_ok(&["--get-restore-tid", "--pid", &p]);
    assert!(tid.trim().parse::<i32>().is_ok(), "{tid:?}");
    assert_eq!(w.cli_state(app), "running");
    let r = w.cli(&["--get-state", "--pid", &p]);
    assert_eq!(
        (r.code(), r.stdout.as_str(), r.stderr.as_str()),
        (7, "", ""),
        "2nd get-state"
    );

    // return: the code's status and message, and nothing happened.
    let r = w.cli(&["--action", "lock", "--pid", &p]);
    assert_eq!(r.code(), 88, "{r:?}");
    assert_eq!(r.stderr, "Error: injected fault: \"device not ready\"\n");
    assert_eq!(w.cli_state(app), "running");

    // error-after: the lock happened, and the caller is told it failed.
    let r = w.cli(&["--action", "lock", "--pid", &p]);
    assert_eq!(r.code(), 231, "CUDA_ERROR_UNKNOWN (999 % 256): {r:?}");
    assert_eq!(r.stderr, "Error: injected fault: \"unknown error\"\n");
    assert_eq!(w.cli_state(app), "locked");

    // crash: the utility dies by the signal, before touching the target.
    let (sig, r) = death_signal(w.cli_command(&["--action", "checkpoint", "--pid", &p]));
    assert_eq!(sig, Some(SIGSEGV), "{r:?}");
    let (sig, r) = death_signal(w.cli_command(&["--action", "checkpoint", "--pid", &p]));
    assert_eq!(sig, Some(SIGABRT), "{r:?}");
    assert_eq!(w.cli_state(app), "locked");

    // delay: slower, and otherwise normal.
    let r = w.cli(&["--action", "unlock", "--pid", &p]);
    assert_eq!(r.code(), 0, "{r:?}");
    assert!(r.elapsed >= Duration::from_millis(300), "{:?}", r.elapsed);
    assert_eq!(w.cli_state(app), "running");
    assert!(w.verify(0, app).starts_with("PASS"));

    // Each invocation that lived to return is in the trace with its exit status, and the faults
    // that stopped it early made no driver call. Crashed ones left no line.
    let trace = w.trace();
    let cli_lines: Vec<String> = trace
        .lines()
        // `<caller> <program> <call> = <result>`: the call and its result.
        .filter_map(|l| l.splitn(3, ' ').nth(2))
        .filter(|l| l.starts_with("cuda-checkpoint(") || l.starts_with("cuCheckpointProcessLock"))
        .map(|l| name_numbers(l, &[(i64::from(app), "<APP>")]))
        .collect();
    insta::assert_snapshot!("cli_fault_trace", cli_lines.join("\n"));
}

/// A fault scripted for one pid fires for that process only (here: through the utility), and
/// any thread id of the process names it.
#[test]
fn cli_faults_can_target_one_pid() {
    let base = config(580, "", false, "");
    let mut w = World::new(&base);
    let a = w.spawn_app(&["--kib", "4"]);
    let b = w.spawn_app(&["--kib", "4"]);
    let a_tid: i32 = w
        .cli_ok(&["--get-restore-tid", "--pid", &a.to_string()])
        .trim()
        .parse()
        .unwrap();
    w.rewrite_config(&format!(
        "{base}\n[[fault]]\nfunction = \"cuda-checkpoint:lock\"\npid = {a}\nsticky = true\n\
         action = {{ kind = \"return\", code = \"CUDA_ERROR_NOT_PERMITTED\" }}\n"
    ));
    for target in [a, a_tid] {
        let r = w.cli(&["--action", "lock", "--pid", &target.to_string()]);
        assert_eq!(r.code(), 800 % 256, "{target}: {r:?}");
    }
    assert_eq!(w.cli_state(a), "running");
    w.cli_ok(&["--action", "lock", "--pid", &b.to_string()]);
    assert_eq!(w.cli_state(b), "locked");
    w.cli_ok(&["--action", "unlock", "--pid", &b.to_string()]);
}

/// `fail` and `kill-target` through the utility: what a caller then sees of the target.
#[test]
fn cli_faults_that_break_the_target() {
    let faults = r#"
[[fault]]
function = "cuda-checkpoint:checkpoint"
action = { kind = "fail", code = "CUDA_ERROR_UNKNOWN" }

[[fault]]
function = "cuda-checkpoint:get-restore-tid"
action = { kind = "kill-target" }
"#;
    let mut w = World::new(&config(580, "", false, faults));
    // The workload checks its data once a minute only: it makes no call that would notice
    // the failure and make it exit while the test looks at it.
    let app = w.spawn_app(&["--kib", "4", "--check-ms", "60000"]);
    let victim = w.spawn_app(&["--kib", "4"]);
    let p = app.to_string();

    let r = w.cli(&["--get-restore-tid", "--pid", &victim.to_string()]);
    assert_eq!(r.code(), 1, "a dead target is INVALID_VALUE: {r:?}");
    assert_eq!(
        r.stderr,
        format!("Error getting restore thread ID for process ID {victim}: \"invalid argument\"\n")
    );
    assert_eq!(w.status_state(victim), None, "its world entry is gone");
    let state = stat_state(victim);
    assert!(
        matches!(state, None | Some('Z')),
        "the target was killed: {state:?}"
    );

    w.cli_ok(&["--action", "lock", "--pid", &p]);
    let r = w.cli(&["--action", "checkpoint", "--pid", &p]);
    assert_eq!(r.code(), 231, "{r:?}");
    assert_eq!(w.cli_state(app), "failed");
    for action in ["lock", "checkpoint", "restore", "unlock"] {
        let r = w.cli(&["--action", action, "--pid", &p]);
        assert_eq!(r.code(), 145, "{action} on a failed process: {r:?}");
    }
}
