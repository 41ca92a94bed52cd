//! What the scenario runner and the fault sweep both do with a tree of mock workloads: run the
//! mock world's tools, start the tree and wait for its tasks, ask them to check their data, and
//! kill and reap them.
//!
//! A tree lives in a directory: `task<i>.sh` starts task `i` (and its children), task `i`
//! writes `report<i>` (a `READY pid=… gpus=…` line once started, then `PASS`/`FAIL` lines on
//! SIGUSR1), and the tree's output goes to `workload.out`.

use crate::procfs::{field, state};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `c` to completion; its stdout, or an error naming `what` with its status and output.
pub(crate) fn run_checked(c: &mut Command, what: &str) -> Result<String, String> {
    let out = c
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The environment of a tree (and of the engine) in mock world `world`, with `bin` (where
/// `cuda-checkpoint` may be linked) first in `PATH`.
pub(crate) fn mock_env(world: &Path, bin: &Path) -> Vec<(String, String)> {
    vec![
        ("MOCK_CUDA_WORLD".to_owned(), world.display().to_string()),
        (
            "LD_LIBRARY_PATH".to_owned(),
            world.join("lib").display().to_string(),
        ),
        (
            "PATH".to_owned(),
            format!(
                "{}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
                bin.display()
            ),
        ),
    ]
}

/// Starts `dir/task0.sh` as a session leader with `env`, its output in `dir/workload.out`.
pub(crate) fn spawn_root(dir: &Path, env: &[(String, String)]) -> Result<Child, String> {
    let out = std::fs::File::create(dir.join("workload.out")).map_err(|e| e.to_string())?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    Command::new("setsid")
        .arg("sh")
        .arg(dir.join("task0.sh"))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("spawn workload: {e}"))
}

fn report(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("report{i}"))
}

/// Waits until task `i` (named `name`) reports READY; its pid and READY line. An error when it
/// reports FAIL instead, or nothing by `deadline` (with the tree's output).
pub(crate) fn wait_ready(
    dir: &Path,
    i: usize,
    name: &str,
    deadline: Instant,
) -> Result<(i32, String), String> {
    loop {
        let text = std::fs::read_to_string(report(dir, i)).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.starts_with("READY ")) {
            let pid = field(l, "pid")
                .and_then(|p| p.parse::<i32>().ok())
                .ok_or_else(|| format!("odd READY line `{l}`"))?;
            return Ok((pid, l.to_owned()));
        }
        if let Some(l) = text.lines().find(|l| l.starts_with("FAIL ")) {
            return Err(format!("task {name} failed to start: {l}"));
        }
        if Instant::now() > deadline {
            let out = std::fs::read_to_string(dir.join("workload.out")).unwrap_or_default();
            return Err(format!("task {name} never reported READY\n{out}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// SIGUSR1 to each `(i, pid)` of `tasks`; the PASS or FAIL line each appends to its report
/// (or an earlier FAIL, or "no answer to SIGUSR1" after 5 s), in the order of `tasks`.
pub(crate) fn verify_data(dir: &Path, tasks: &[(usize, i32)]) -> Vec<String> {
    let lines = |i: usize| std::fs::read_to_string(report(dir, i)).unwrap_or_default();
    let before: Vec<usize> = tasks
        .iter()
        .map(|&(i, _)| lines(i).lines().count())
        .collect();
    for &(_, pid) in tasks {
        let _ = kill(Pid::from_raw(pid), Signal::SIGUSR1);
    }
    tasks
        .iter()
        .zip(before)
        .map(|(&(i, _), n)| {
            let end = Instant::now() + Duration::from_secs(5);
            loop {
                let r = lines(i);
                if let Some(l) = r
                    .lines()
                    .skip(n)
                    .find(|l| l.starts_with("PASS") || l.starts_with("FAIL"))
                {
                    break l.to_owned();
                }
                if let Some(l) = r.lines().take(n).find(|l| l.starts_with("FAIL")) {
                    break l.to_owned();
                }
                if Instant::now() > end {
                    break "no answer to SIGUSR1".to_owned();
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
        .collect()
}

/// The name of a CUDA process state in `mock-world status --json` (`none`: not a CUDA process).
pub(crate) fn cuda_state_name(entry: &serde_json::Value) -> &'static str {
    match entry["state"].as_u64() {
        None => "none",
        Some(0) => "running",
        Some(1) => "locked",
        Some(2) => "checkpointed",
        Some(3) => "failed",
        Some(_) => "other",
    }
}

/// SIGKILLs `victims` and the tree's root `root`, then waits (5 s in all) until each victim is
/// gone or a zombie, reaping those that are our children (orphans reparented to this
/// subreaper included).
pub(crate) fn kill_and_reap(victims: &[i32], root: Option<Child>) {
    for &p in victims {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    if let Some(mut c) = root {
        let _ = c.kill();
        let _ = c.wait();
    }
    let end = Instant::now() + Duration::from_secs(5);
    for &p in victims {
        while Instant::now() < end {
            let _ = waitpid(Pid::from_raw(p), Some(WaitPidFlag::WNOHANG));
            if !Path::new(&format!("/proc/{p}")).exists() || state(p) == 'Z' {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
