//! Support for `real_criu.rs`: the built artifacts, the CRIU binaries, mock worlds, workload
//! trees and the process bookkeeping a real dump/restore needs.
//!
//! # Where the artifacts come from
//!
//! Everything is taken from the target directory this test binary was built in
//! (`std::env::current_exe()` is `<target>/<profile>/deps/real_criu-<hash>`), as
//! `fake-cuda-checkpoint/tests/support` does:
//!
//! - `cuda_plugin.so`: the newer of `<profile>/deps/libcuda_plugin.so` (refreshed by `cargo test`)
//!   and `<profile>/libcuda_plugin.so` (refreshed by `cargo build`), copied into each case's
//!   plugin directory under the name CRIU's loader wants;
//! - `libmock_libcuda.so` (newer of the same two places), `mock-world`, `mock-cuda-app` and
//!   `cuda-checkpoint` (`fake-cuda-checkpoint`) from `<profile>/`.
//!
//! When one is missing or older than its sources, `$CARGO build -p mock-libcuda
//! -p fake-cuda-checkpoint -p cuda-plugin` runs once for the same profile and target directory.
//!
//! `CRIU_CUDA_TEST_PLUGIN_SO=PATH` tests a prebuilt plugin instead of the one from the target
//! directory (the mocks still come from there): `scripts/check-dist-load.sh` runs the release
//! build of `scripts/dist.sh` through real CRIU this way.
//!
//! # Where CRIU comes from
//!
//! `CRIU_CUDA_CRIU_4_1` / `CRIU_CUDA_CRIU_4_2` (set by `scripts/test.sh`), else the
//! `versions` file named by `CRIU_CUDA_CRIU_VERSIONS`, else `$CRIU_CUDA_CRIU_DIR/versions`,
//! else `<workspace>/target/criu/versions` (written by `scripts/fetch-criu.sh`).
//!
//! # Processes
//!
//! The test process makes itself a child subreaper: the workload trees it starts, the trees
//! CRIU restores (`restore -d`) and anything CRIU leaves behind are reparented to it, and
//! [`reap`] collects them, so a dumped tree's pids are free again as soon as its tasks die
//! (a zombie keeps its pid: "Can't fork for N: File exists"). Only processes whose environment
//! names the case's world are ever signalled.

#![allow(dead_code)]

use std::ffi::c_int;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

/// Results of the checks: `Err` carries a message for the test report.
pub type R<T = ()> = Result<T, String>;

/// `ensure!(cond, fmt…)`: returns `Err(message)` when `cond` is false.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(format!($($arg)+));
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Artifacts

/// The built programs and libraries the tests run.
#[derive(Debug)]
pub struct Artifacts {
    pub plugin_so: PathBuf,
    pub mock_so: PathBuf,
    pub mock_world: PathBuf,
    pub mock_app: PathBuf,
    pub cuda_checkpoint: PathBuf,
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).ok()?.modified().ok()
}

/// Newest modification time of the files under `p` (recursively), or of `p` itself.
fn newest(p: &Path) -> Option<SystemTime> {
    let meta = std::fs::metadata(p).ok()?;
    if !meta.is_dir() {
        return meta.modified().ok();
    }
    std::fs::read_dir(p)
        .ok()?
        .filter_map(|e| newest(&e.ok()?.path()))
        .max()
}

fn newest_of(paths: &[PathBuf]) -> Option<(SystemTime, PathBuf)> {
    paths
        .iter()
        .filter_map(|p| Some((mtime(p)?, p.clone())))
        .max()
}

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the package lives in the workspace")
        .to_path_buf()
}

/// The artifacts, located (and built when needed) once per test process.
pub fn artifacts() -> &'static R<Artifacts> {
    static A: OnceLock<R<Artifacts>> = OnceLock::new();
    A.get_or_init(locate_or_build)
}

fn locate_or_build() -> R<Artifacts> {
    let exe = std::env::current_exe().map_err(|e| format!("locating the test binary: {e}"))?;
    let deps = exe.parent().ok_or("the test binary has no directory")?;
    let profile_dir = deps.parent().ok_or("deps/ has no parent")?;
    let target_dir = profile_dir
        .parent()
        .ok_or("the profile dir has no parent")?;
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("the profile directory has no UTF-8 name")?
        .to_owned();
    let ws = workspace();
    let both = |name: &str| [deps.join(name), profile_dir.join(name)];
    let plugins = both("libcuda_plugin.so");
    let mocks = both("libmock_libcuda.so");
    let programs = [
        profile_dir.join("mock-world"),
        profile_dir.join("mock-cuda-app"),
        profile_dir.join("cuda-checkpoint"),
    ];

    let sources = [
        "abi/src",
        "abi/Cargo.toml",
        "mock-libcuda/src",
        "mock-libcuda/Cargo.toml",
        "fake-cuda-checkpoint/src",
        "fake-cuda-checkpoint/Cargo.toml",
        "plugin/src",
        "plugin/Cargo.toml",
        "Cargo.lock",
    ];
    let source_time = sources.iter().filter_map(|s| newest(&ws.join(s))).max();
    let oldest_artifact = || {
        let mut times = vec![
            newest_of(&plugins).map(|(t, _)| t),
            newest_of(&mocks).map(|(t, _)| t),
        ];
        times.extend(programs.iter().map(|p| mtime(p)));
        times
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .and_then(|v| v.into_iter().min())
    };
    let fresh = match (oldest_artifact(), source_time) {
        (Some(a), Some(s)) => a >= s,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if !fresh {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(&cargo);
        cmd.arg("build")
            .arg("--manifest-path")
            .arg(ws.join("Cargo.toml"))
            .args([
                "-p",
                "mock-libcuda",
                "-p",
                "fake-cuda-checkpoint",
                "-p",
                "cuda-plugin",
            ])
            .env("CARGO_TARGET_DIR", target_dir);
        match profile.as_str() {
            "debug" => {}
            "release" => {
                cmd.arg("--release");
            }
            other => {
                cmd.args(["--profile", other]);
            }
        }
        eprintln!("real_criu: building the mock and the plugin: {cmd:?}");
        let out = cmd
            .output()
            .map_err(|e| format!("running {cargo:?} build: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{cmd:?} failed: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    for p in &programs {
        ensure!(p.exists(), "{} was not built", p.display());
    }
    let plugin_so = match std::env::var_os("CRIU_CUDA_TEST_PLUGIN_SO") {
        Some(p) => {
            let p = PathBuf::from(p);
            ensure!(
                p.is_file(),
                "CRIU_CUDA_TEST_PLUGIN_SO={} is not a file",
                p.display()
            );
            p
        }
        None => {
            newest_of(&plugins)
                .ok_or("libcuda_plugin.so was not built")?
                .1
        }
    };
    Ok(Artifacts {
        plugin_so,
        mock_so: newest_of(&mocks)
            .ok_or("libmock_libcuda.so was not built")?
            .1,
        mock_world: programs[0].clone(),
        mock_app: programs[1].clone(),
        cuda_checkpoint: programs[2].clone(),
    })
}

// ---------------------------------------------------------------------------------------------
// CRIU binaries

/// One real CRIU.
#[derive(Debug, Clone)]
pub struct Criu {
    /// "4.1" or "4.2".
    pub series: &'static str,
    /// The full version, e.g. "4.1.1" (the series when unknown).
    pub version: String,
    /// The wrapper to run.
    pub path: PathBuf,
}

/// The CRIU binaries present, 4.1.x first; see the module docs for where they come from.
pub fn find_criu() -> Vec<Criu> {
    let mut found: Vec<Criu> = Vec::new();
    let versions_file = std::env::var_os("CRIU_CUDA_CRIU_VERSIONS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("CRIU_CUDA_CRIU_DIR").map(|d| PathBuf::from(d).join("versions"))
        })
        .unwrap_or_else(|| workspace().join("target/criu/versions"));
    let listed: Vec<(String, PathBuf)> = std::fs::read_to_string(&versions_file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_owned(), PathBuf::from(it.next()?)))
        })
        .collect();
    for (series, var) in [("4.1", "CRIU_CUDA_CRIU_4_1"), ("4.2", "CRIU_CUDA_CRIU_4_2")] {
        let in_series = |v: &str| v == series || v.starts_with(&format!("{series}."));
        let from_env = std::env::var_os(var).map(PathBuf::from);
        let from_list = listed.iter().find(|(v, _)| in_series(v));
        let path = match (from_env, from_list) {
            (Some(p), _) => p,
            (None, Some((_, p))) => p.clone(),
            (None, None) => continue,
        };
        if !path.is_file() {
            continue;
        }
        let version = listed
            .iter()
            .find(|(v, p)| in_series(v) && *p == path)
            .map(|(v, _)| v.clone())
            .unwrap_or_else(|| series.to_owned());
        found.push(Criu {
            series,
            version,
            path,
        });
    }
    found
}

// ---------------------------------------------------------------------------------------------
// Processes

extern "C" {
    fn kill(pid: c_int, sig: c_int) -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn prctl(option: c_int, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> c_int;
    fn geteuid() -> u32;
    fn setsid() -> c_int;
}

pub const SIGABRT: c_int = 6;
pub const SIGKILL: c_int = 9;
pub const SIGUSR1: c_int = 10;
pub const SIGCONT: c_int = 18;

/// True when running as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    unsafe { geteuid() == 0 }
}

/// Makes this process a child subreaper (see the module docs); true on success.
pub fn become_subreaper() -> bool {
    const PR_SET_CHILD_SUBREAPER: c_int = 36;
    // SAFETY: prctl(2) with integer arguments only; touches no memory of ours.
    unsafe { prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 }
}

/// Sends `sig` to `pid`; true when delivered.
pub fn signal(pid: i32, sig: c_int) -> bool {
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    unsafe { kill(pid, sig) == 0 }
}

/// Collects every exited child (our own, and the orphans reparented to us). Only called when
/// no `std::process::Child` of ours is still waiting to be waited for.
pub fn reap() {
    const WNOHANG: c_int = 1;
    loop {
        let mut st: c_int = 0;
        // SAFETY: waitpid(2) writes the status into a local we own.
        let r = unsafe { waitpid(-1, &mut st, WNOHANG) };
        if r <= 0 {
            return;
        }
    }
}

/// Runs `cmd` in a new session (as `setsid` does).
pub fn in_new_session(cmd: &mut Command) {
    // SAFETY: the closure runs between fork and exec and only calls setsid(2), which is
    // async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            setsid();
            Ok(())
        });
    }
}

pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Polls `cond` every 5 ms for at most `limit`; false on timeout.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits, for each of `pids` at most `limit`, until its pid is free (reaping what is
/// reparented to us): CRIU restores a tree with its old pids, and pid 1 reaps slowly.
pub fn wait_pids_gone(pids: &[i32], limit: Duration) -> R {
    for &pid in pids {
        let gone = wait_until(limit, || {
            reap();
            !exists(pid)
        });
        ensure!(gone, "pid {pid} of the dumped tree is still there");
    }
    Ok(())
}

/// True when `/proc/<pid>` exists (a zombie counts: its pid is still taken).
pub fn exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// True when `pid`'s environment contains `needle` (e.g. `MOCK_CUDA_WORLD=<dir>`).
pub fn environ_has(pid: i32, needle: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|env| env.split(|&b| b == 0).any(|kv| kv == needle.as_bytes()))
        .unwrap_or(false)
}

/// Every live process whose environment contains `needle`.
pub fn processes_with_env(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| p != me && environ_has(p, needle))
        .collect()
}

/// A thread's `State:` letter and `TracerPid:` from `/proc/<pid>/task/<tid>/status`.
fn thread_status(pid: i32, tid: i32) -> Option<(char, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
    };
    let state = field("State:")?.chars().next()?;
    let tracer = field("TracerPid:")?.parse().ok()?;
    Some((state, tracer))
}

/// The thread ids of `pid`.
pub fn threads(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Ok when every thread of `pid` is alive, not stopped (`T`/`t`), not a zombie and not traced.
pub fn check_free_running(pid: i32) -> R {
    let tids = threads(pid);
    ensure!(!tids.is_empty(), "pid {pid} is gone");
    for tid in tids {
        if let Some((state, tracer)) = thread_status(pid, tid) {
            ensure!(
                !matches!(state, 'T' | 't' | 'Z' | 'X'),
                "pid {pid} thread {tid} is in state {state}"
            );
            ensure!(tracer == 0, "pid {pid} thread {tid} is traced by {tracer}");
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Worlds

/// A mock world config: driver r580 (CUDA 13.0), one GPU, and `faults` (TOML) appended.
pub fn world_config(faults: &str) -> String {
    format!(
        r#"schema = 1
[driver]
branch = 580

[[gpu]]
uuid = "GPU-00000000-0000-4000-8000-000000000000"
name = "NVIDIA H100 80GB HBM3"
memory_mib = 1024
chip = "GH100"
{faults}"#
    )
}

/// A `[[fault]]` table.
pub fn fault(function: &str, nth: u32, action: &str) -> String {
    format!("\n[[fault]]\nfunction = \"{function}\"\nnth = {nth}\naction = {action}\n")
}

/// The lines of the world's trace that record a run of `cuda-checkpoint`.
pub fn cli_runs(trace: &str) -> usize {
    trace
        .lines()
        .filter(|l| l.contains(" cuda-checkpoint(") && l.contains(") = exit="))
        .count()
}

/// The CUDA state of each process in the world, from `mock-world status`.
pub fn world_states(mock_world: &Path, world: &Path) -> R<Vec<(i32, String)>> {
    let out = Command::new(mock_world)
        .arg("status")
        .arg(world)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running mock-world status: {e}"))?;
    ensure!(
        out.status.success(),
        "mock-world status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            let pid = cols.next()?.parse().ok()?;
            let state = cols.nth(1)?.to_owned();
            Some((pid, state))
        })
        .collect())
}

// ---------------------------------------------------------------------------------------------
// Plugin logs

/// `(hook, pid, ms)` of every "cuda_plugin: <HOOK> pid N: done in X ms" line of a CRIU log.
pub fn hook_times(log: &str) -> Vec<(String, i32, f64)> {
    log.lines()
        .filter_map(|l| {
            let rest = &l[l.find("cuda_plugin: ")? + "cuda_plugin: ".len()..];
            let (head, ms) = rest.split_once(": done in ")?;
            let ms: f64 = ms.strip_suffix(" ms")?.trim().parse().ok()?;
            let (hook, pid) = head.split_once(" pid ")?;
            Some((hook.to_owned(), pid.trim().parse().ok()?, ms))
        })
        .collect()
}

/// `(hook, pid, backend ms, restore-thread control ms)` of every
/// "cuda_plugin: <HOOK> pid N: waited X ms on BACKEND, Y ms on restore-thread control" line.
pub fn hook_waits(log: &str) -> Vec<(String, i32, f64, f64)> {
    log.lines()
        .filter_map(|l| {
            let rest = &l[l.find("cuda_plugin: ")? + "cuda_plugin: ".len()..];
            let (head, rest) = rest.split_once(": waited ")?;
            let (backend, rest) = rest.split_once(" ms on ")?;
            let (_, rest) = rest.split_once(", ")?;
            let threads = rest.strip_suffix(" ms on restore-thread control")?;
            let (hook, pid) = head.split_once(" pid ")?;
            Some((
                hook.to_owned(),
                pid.trim().parse().ok()?,
                backend.trim().parse().ok()?,
                threads.trim().parse().ok()?,
            ))
        })
        .collect()
}

/// "n=…, mean …, max … ms" of `xs`.
pub fn stats(xs: &[f64]) -> String {
    if xs.is_empty() {
        return "none".to_owned();
    }
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    let max = xs.iter().copied().fold(f64::MIN, f64::max);
    let min = xs.iter().copied().fold(f64::MAX, f64::min);
    format!("n={} mean {mean:.1} min {min:.1} max {max:.1} ms", xs.len())
}
