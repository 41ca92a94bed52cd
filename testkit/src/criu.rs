//! Support for the plugin's real-CRIU tests and benchmarks (`real_criu.rs`, `runc.rs`,
//! `criu_bench`, `scale_bench`): the built artifacts, the CRIU binaries, mock worlds, workload
//! trees and the process bookkeeping a real dump/restore needs.
//!
//! # Where the artifacts come from
//!
//! Everything is taken from the target directory this test binary was built in
//! (see [`crate::artifacts`]):
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

pub use crate::artifacts::workspace;
use crate::artifacts::{fresh, mtime, newest_of, Layout};
pub use crate::ensure;
pub use crate::proc::{
    environ_has, exists, processes_with_env, signal, thread_status, threads, TaskStatus, SIGABRT,
    SIGCONT, SIGKILL, SIGUSR1,
};
pub use crate::read;
pub use crate::wait::wait_until;
pub use crate::world::{CudaState, MockWorld};
use std::ffi::c_int;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

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

/// Writes `text` to `p`; the error names the file.
pub fn write(p: &Path, text: &str) -> R {
    std::fs::write(p, text).map_err(|e| format!("writing {}: {e}", p.display()))
}

/// Creates `p` and its parents; the error names the directory.
pub fn mkdir(p: &Path) -> R {
    std::fs::create_dir_all(p).map_err(|e| format!("creating {}: {e}", p.display()))
}

/// The last `n` lines of `s` (of a log, for an error message).
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `mock-cuda-app`'s options for the 3-process tree of the real-CRIU and container tests: a
/// multi-threaded CUDA root, a CPU-only child, a CUDA grandchild.
pub const TREE3: [&str; 8] = [
    "--kib",
    "64",
    "--threads",
    "1",
    "--children",
    "1",
    "--child-args",
    "--cpu-only --children 1 --kib 16",
];

// ---------------------------------------------------------------------------------------------
// Artifacts

/// The built programs and libraries the tests run.
#[derive(Debug)]
pub struct Artifacts {
    pub plugin_so: PathBuf,
    pub mock_so: PathBuf,
    /// The NVML stand-in, when it was built (a world made without it has no NVML).
    pub mock_nvml: Option<PathBuf>,
    pub mock_app: PathBuf,
    pub cuda_checkpoint: PathBuf,
}

/// The artifacts, located (and built when needed) once per test process.
pub fn artifacts() -> &'static R<Artifacts> {
    static A: OnceLock<R<Artifacts>> = OnceLock::new();
    A.get_or_init(locate_or_build)
}

fn locate_or_build() -> R<Artifacts> {
    let (layout, prebuilt) = Layout::for_tests()?;
    let ws = workspace();
    let plugins = layout.both("libcuda_plugin.so");
    let mocks = layout.both("libmock_libcuda.so");
    let programs = ["mock-cuda-app", "cuda-checkpoint"].map(|p| layout.profile_dir.join(p));
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
    ]
    .map(|s| ws.join(s));
    let mut times = vec![
        newest_of(&plugins).map(|(t, _)| t),
        newest_of(&mocks).map(|(t, _)| t),
    ];
    times.extend(programs.iter().map(|p| mtime(p)));
    if !prebuilt && !fresh(&times, &sources) {
        layout.cargo_build(
            &ws,
            &[
                "-p",
                "mock-libcuda",
                "-p",
                "fake-cuda-checkpoint",
                "-p",
                "cuda-plugin",
            ],
        )?;
    }
    let from = if prebuilt {
        format!(
            " (${} names where scripts/test.sh built it)",
            crate::artifacts::ARTIFACTS_VAR
        )
    } else {
        String::new()
    };
    for p in &programs {
        ensure!(p.exists(), "{} was not built{from}", p.display());
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
        mock_nvml: newest_of(&layout.both("libmock_nvml.so")).map(|(_, p)| p),
        mock_app: programs[0].clone(),
        cuda_checkpoint: programs[1].clone(),
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

/// A program the container tests drive: the path in environment variable `var`, else `name`
/// found in `PATH`.
pub fn find_program(var: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return Some(PathBuf::from(p));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The first line `program --version` prints.
pub fn program_version(program: &Path) -> R<String> {
    let out = Command::new(program)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("running {} --version: {e}", program.display()))?;
    ensure!(
        out.status.success(),
        "{} --version failed: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned())
}

// ---------------------------------------------------------------------------------------------
// Processes

extern "C" {
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn prctl(option: c_int, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> c_int;
    fn geteuid() -> u32;
    fn setsid() -> c_int;
    fn unshare(flags: c_int) -> c_int;
}

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

/// Moves this process into a mount namespace of its own whose mounts no longer propagate to
/// the host's (`unshare -m --propagation private`): what the test mounts afterwards, and what
/// the programs it starts mount, is seen by them only and goes away with the last of them.
/// Call it while the process has a single thread (first thing in `main`): `unshare(2)` refuses
/// `CLONE_NEWNS` to a thread that shares its filesystem attributes with another.
pub fn enter_private_mount_namespace() -> R {
    const CLONE_NEWNS: c_int = 0x0002_0000;
    // SAFETY: unshare(2) takes one integer and touches no memory of ours.
    if unsafe { unshare(CLONE_NEWNS) } != 0 {
        return Err(format!(
            "unshare(CLONE_NEWNS): {}",
            std::io::Error::last_os_error()
        ));
    }
    let out = Command::new("mount")
        .args(["--make-rprivate", "/"])
        .output()
        .map_err(|e| format!("running mount --make-rprivate /: {e}"))?;
    ensure!(
        out.status.success(),
        "mount --make-rprivate / failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
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

/// Waits up to `limit` (reaping) until no process has `marker` (`NAME=value`) in its
/// environment; then kills (SIGCONT, SIGKILL) and names on stderr any that are left, and fails
/// with their pids ("processes of the case were left").
pub fn end_marked_processes(marker: &str, limit: Duration) -> R {
    let ended = wait_until(limit, || {
        reap();
        processes_with_env(marker).is_empty()
    });
    if ended {
        return Ok(());
    }
    let left = processes_with_env(marker);
    for &p in &left {
        let cmd = read(Path::new(&format!("/proc/{p}/cmdline"))).replace('\0', " ");
        eprintln!("    process {p} left: {cmd}");
        signal(p, SIGCONT);
        signal(p, SIGKILL);
    }
    reap();
    Err(format!("processes of the case were left: {left:?}"))
}

/// Ok when every thread of `pid` is alive, not stopped (`T`/`t`), not a zombie and not traced.
pub fn check_free_running(pid: i32) -> R {
    let tids = threads(pid);
    ensure!(!tids.is_empty(), "pid {pid} is gone");
    for tid in tids {
        if let Some(TaskStatus { state, tracer }) = thread_status(pid, tid) {
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
    world_config_on(580, faults)
}

/// [`world_config`] with driver branch `branch` (615: CUDA 13.4, custom storage).
pub fn world_config_on(branch: u32, faults: &str) -> String {
    format!(
        r#"schema = 1
[driver]
branch = {branch}

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

/// What `mock-world status` shows of `world`.
fn world_status(world: &Path) -> R<mock_cuda_world::client::Status> {
    MockWorld::open(world)
        .and_then(|w| w.status())
        .map_err(|e| e.to_string())
}

/// The CUDA state of each process of the world whose host pid is known, in world-id order
/// (the rows of `mock-world status`: a pid reused after a process died has two).
pub fn world_states(world: &Path) -> R<Vec<(i32, CudaState)>> {
    Ok(world_status(world)?
        .processes
        .iter()
        .filter_map(|p| Some((p.host_pid()?, p.state())))
        .collect())
}

/// The world's processes that are alive (a restore thread seen from here): `(host pid,
/// state)`.
pub fn live_cuda_states(world: &Path) -> R<Vec<(i32, &'static str)>> {
    Ok(world_status(world)?
        .processes
        .iter()
        .filter(|p| p.restore_tid_here().is_some())
        .filter_map(|p| Some((p.host_pid()?, p.state().name())))
        .collect())
}

/// The 2 CUDA tasks of [`TREE3`] alive and in state `want` (`running`, ...) in the world
/// (waits up to 3 s for it).
pub fn expect_live_cuda(world: &Path, want: &str) -> R {
    let check = || -> R {
        let live = live_cuda_states(world)?;
        ensure!(
            live.len() == 2 && live.iter().all(|(_, s)| *s == want),
            "expected the 2 CUDA tasks {want} in the mock world, found (host pid, state) {live:?}"
        );
        Ok(())
    };
    if wait_until(Duration::from_secs(3), || check().is_ok()) {
        return Ok(());
    }
    check()
}

/// Creates the world `world` from `config` (TOML) with the built mock library and NVML
/// stand-in (none when it was not built, as `mock-world init` does).
pub fn init_world(a: &Artifacts, world: &Path, config: &str) -> R<MockWorld> {
    MockWorld::init(world, config, &a.mock_so, a.mock_nvml.as_deref()).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------------
// Plugin logs

/// `(hook, pid, ms)` of every `cuda_plugin: <HOOK> pid N: done in X ms` line of a CRIU log.
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
/// `cuda_plugin: <HOOK> pid N: waited X ms on BACKEND, Y ms on restore-thread control` line.
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
