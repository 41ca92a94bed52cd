//! Running one workload through CRIU: start, READY, dump, (restore), SIGUSR1, verdict.
//!
//! The runner makes itself a child subreaper ([`become_subreaper`]), so a task that
//! `criu restore -d` restores is re-parented to it when CRIU exits and its exit status can be
//! collected like the original child's.

use std::ffi::OsString;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::plugin_log::Phases;
use crate::report::{CsFiles, Cycle, Outcome, TestResult};
use crate::workloads::{Workload, EXIT_PASS, EXIT_SKIP};

/// The plugin backend (`cuda_plugin.backend=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// `libcuda.so.1`'s `cuCheckpointProcess*` entry points.
    DriverApi,
    /// NVIDIA's `cuda-checkpoint` utility.
    CudaCheckpoint,
    /// The plugin's choice.
    Auto,
}

impl Backend {
    /// The option spelling.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Backend::DriverApi => "driver-api",
            Backend::CudaCheckpoint => "cuda-checkpoint",
            Backend::Auto => "auto",
        }
    }
}

/// `cuda_plugin.custom-storage=` for a test case (see `docs/custom-storage.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CustomStorage {
    /// GPU memory straight into `cuda-cs-*.img` (needs a CUDA 13.4 driver).
    On,
    /// Host staging, as before custom storage.
    Off,
}

impl CustomStorage {
    /// The option spelling.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            CustomStorage::On => "on",
            CustomStorage::Off => "off",
        }
    }
}

/// One test case: a workload, and the custom-storage setting it runs with (`None`: the option
/// is not passed, the plugin's default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// The workload.
    pub workload: Workload,
    /// `cuda_plugin.custom-storage=`.
    pub custom_storage: Option<CustomStorage>,
    /// Why it cannot run here, or `None` when it can.
    pub skip: Option<String>,
}

impl Case {
    /// `cuda00`, or `cuda00[custom-storage=on]`.
    #[must_use]
    pub fn name(&self) -> String {
        case_name(self.workload.name, self.custom_storage)
    }
}

/// `cuda00`, or `cuda00[custom-storage=on]`.
#[must_use]
pub fn case_name(workload: &str, cs: Option<CustomStorage>) -> String {
    match cs {
        None => workload.to_owned(),
        Some(c) => format!("{workload}[custom-storage={}]", c.as_str()),
    }
}

/// The cases of `workloads` with `backend`: each workload once per custom-storage setting in
/// `modes` (once without the option when `modes` is empty). A workload that cannot run here
/// is skipped in every case with its reason; a `custom-storage=on` case where custom storage
/// cannot run (an older or unknown driver, the cuda-checkpoint backend) is skipped with that
/// reason, never dropped.
#[must_use]
pub fn cases(
    d: &crate::detect::Detection,
    workloads: &[Workload],
    backend: Backend,
    modes: &[CustomStorage],
) -> Vec<Case> {
    let modes: Vec<Option<CustomStorage>> = if modes.is_empty() {
        vec![None]
    } else {
        modes.iter().copied().map(Some).collect()
    };
    let mut v = Vec::new();
    for w in workloads {
        for &cs in &modes {
            let skip = d.skip_reason(w).or_else(|| match cs {
                Some(CustomStorage::On) => d.custom_storage_skip(backend),
                _ => None,
            });
            v.push(Case {
                workload: *w,
                custom_storage: cs,
                skip,
            });
        }
    }
    v
}

/// How plugin options reach CRIU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OptionStyle {
    /// `--plugin-option` when `criu --help` mentions it, else the environment.
    Auto,
    /// Only `CRIU_PLUGIN_OPTIONS` in CRIU's environment (the plugin's fallback).
    Env,
    /// `--plugin-option cuda_plugin.NAME=VALUE` on the command line (and the environment).
    Cli,
}

/// Everything [`run_one`] needs.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The CRIU executable.
    pub criu: PathBuf,
    /// The plugin directory (holds `cuda_plugin.so` and no other plugin).
    pub libdir: PathBuf,
    /// The backend.
    pub backend: Backend,
    /// Directory of the workload executables.
    pub bin_dir: PathBuf,
    /// Logs go to `<work_dir>/<backend>/<test>/`, images to `img-<cycle>` below it.
    pub work_dir: PathBuf,
    /// `criu dump --leave-running`: dump only, no restore; the original task is verified.
    pub leave_running: bool,
    /// Dump/restore cycles before the verification.
    pub repeat: u32,
    /// `cuda_plugin.device-map=` at restore.
    pub device_map: Option<String>,
    /// Keep the images of a failed test.
    pub keep_images: bool,
    /// Whether to pass options with `--plugin-option` too (resolved from [`OptionStyle`]).
    pub cli_options: bool,
    /// `ZDTM_CUDA_MIB` for the workloads.
    pub mib: Option<u64>,
    /// Limit of each wait (READY, a task vanishing, the verdict) and of each CRIU run.
    pub timeout: Duration,
    /// Extra environment for the workloads (e.g. `LD_LIBRARY_PATH` for cuBLAS).
    pub env: Vec<(OsString, OsString)>,
    /// `cuda_plugin.custom-storage=` at dump and restore (`None`: not passed).
    pub custom_storage: Option<CustomStorage>,
}

/// `CRIU_PLUGIN_OPTIONS` for a dump (`restore = false`) or a restore.
#[must_use]
pub fn plugin_options(cfg: &RunConfig, restore: bool) -> Vec<String> {
    let mut v = vec![format!("cuda_plugin.backend={}", cfg.backend.as_str())];
    if let Some(cs) = cfg.custom_storage {
        v.push(format!("cuda_plugin.custom-storage={}", cs.as_str()));
    }
    if restore {
        if let Some(m) = &cfg.device_map {
            v.push(format!("cuda_plugin.device-map={m}"));
        }
    }
    v
}

/// `criu dump` arguments.
#[must_use]
pub fn dump_args(
    cfg: &RunConfig,
    pid: i32,
    images: &Path,
    logs: &Path,
    log: &str,
) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["dump".into(), "-t".into(), pid.to_string().into()];
    common_args(cfg, &mut a, images, logs, log, false);
    if cfg.leave_running {
        a.push("--leave-running".into());
    }
    a
}

/// `criu restore` arguments.
#[must_use]
pub fn restore_args(cfg: &RunConfig, images: &Path, logs: &Path, log: &str) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["restore".into()];
    common_args(cfg, &mut a, images, logs, log, true);
    a.push("-d".into());
    a
}

fn common_args(
    cfg: &RunConfig,
    a: &mut Vec<OsString>,
    images: &Path,
    logs: &Path,
    log: &str,
    restore: bool,
) {
    a.extend([
        "-D".into(),
        images.into(),
        "-W".into(),
        logs.into(),
        "-L".into(),
        cfg.libdir.clone().into(),
        "-v4".into(),
        "-o".into(),
        log.into(),
    ]);
    if cfg.cli_options {
        for o in plugin_options(cfg, restore) {
            a.push("--plugin-option".into());
            a.push(o.into());
        }
    }
}

/// What a workload wrote to its status file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// `READY bytes=N` seen (with N).
    pub ready: Option<u64>,
    /// `INFO:` lines.
    pub info: Vec<String>,
    /// The verdict line, if any.
    pub verdict: Option<Outcome>,
}

/// Parses a status file.
#[must_use]
pub fn parse_status(text: &str) -> Status {
    let mut s = Status::default();
    for line in text.lines().map(str::trim_end) {
        if let Some(rest) = line.strip_prefix("READY") {
            let bytes = rest
                .split_whitespace()
                .find_map(|w| w.strip_prefix("bytes="))
                .and_then(|b| b.parse().ok());
            s.ready = Some(bytes.unwrap_or(0));
        } else if let Some(i) = line.strip_prefix("INFO: ") {
            s.info.push(i.to_owned());
        } else if line == "PASS" {
            s.verdict = Some(Outcome::Pass);
        } else if let Some(r) = line.strip_prefix("FAIL: ") {
            s.verdict = Some(Outcome::Fail(r.to_owned()));
        } else if let Some(r) = line.strip_prefix("SKIP: ") {
            s.verdict = Some(Outcome::Skip(r.to_owned()));
        }
    }
    s
}

/// How a task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// `exit(code)`.
    Code(i32),
    /// Killed by a signal.
    Signal(i32),
    /// Gone, but not our child: status unknown.
    Unknown,
}

/// The verdict from the status file and the exit.
#[must_use]
pub fn verdict(status: &Status, exit: Exit) -> Outcome {
    match (&status.verdict, exit) {
        (Some(Outcome::Pass), Exit::Code(EXIT_PASS) | Exit::Unknown) => Outcome::Pass,
        (Some(Outcome::Pass), e) => Outcome::Fail(format!("printed PASS but ended with {e:?}")),
        (Some(Outcome::Skip(r)), _) => Outcome::Skip(r.clone()),
        (Some(Outcome::Fail(r)), _) => Outcome::Fail(r.clone()),
        (None, Exit::Code(EXIT_SKIP)) => Outcome::Skip("exit code 77 without a SKIP line".into()),
        (None, Exit::Code(c)) => Outcome::Fail(format!("exited with code {c} without a verdict")),
        (None, Exit::Signal(s)) => Outcome::Fail(format!(
            "killed by signal {s} ({}) without a verdict",
            Signal::try_from(s).map_or("?", Signal::as_str)
        )),
        (None, Exit::Unknown) => Outcome::Fail("vanished without a verdict".into()),
    }
}

/// The `cuda-cs-*.img` files of an image directory: how many, and their total size.
#[must_use]
pub fn cs_files(images: &Path) -> CsFiles {
    let mut c = CsFiles::default();
    for e in std::fs::read_dir(images).into_iter().flatten().flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("cuda-cs-") && name.ends_with(".img") {
            c.files += 1;
            c.bytes += e.metadata().map_or(0, |m| m.len());
        }
    }
    c
}

/// The plugin's custom-storage lines of a CRIU log (`cuda_plugin: custom storage: ...`,
/// what it decided at init), without the prefix.
#[must_use]
pub fn custom_storage_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| {
            let i = l.find("cuda_plugin: ")?;
            let rest = &l[i + "cuda_plugin: ".len()..];
            rest.contains("custom storage")
                .then(|| rest.trim().to_owned())
        })
        .collect()
}

/// Makes this process a child subreaper (see the module documentation).
pub fn become_subreaper() -> Result<(), Errno> {
    nix::sys::prctl::set_child_subreaper(true)
}

/// Waits up to `limit` for `pid` to end: reaps it if it is our child, else polls `/proc`.
/// `None` on timeout.
fn wait_gone(pid: i32, limit: Duration) -> Option<Exit> {
    let p = Pid::from_raw(pid);
    let t = Instant::now();
    loop {
        match waitpid(p, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, c)) => return Some(Exit::Code(c)),
            Ok(WaitStatus::Signaled(_, s, _)) => return Some(Exit::Signal(s as i32)),
            Ok(_) => {}
            Err(Errno::ECHILD) => {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    return Some(Exit::Unknown);
                }
            }
            Err(_) => {}
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill_and_reap(pid: i32) {
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    let _ = wait_gone(pid, Duration::from_secs(10));
}

/// CRIU's `Error` lines from a log (the last `max`).
#[must_use]
pub fn criu_errors(log: &str, max: usize) -> Vec<String> {
    let v: Vec<String> = log
        .lines()
        .filter(|l| {
            l.contains("Error (")
                || l.contains("cuda_plugin: Error")
                || l.contains("cuda_plugin: ") && l.contains("failed")
        })
        // Harmless in every sandbox without CAP_SYS_RESOURCE.
        .filter(|l| !l.contains("RLIMIT_NOFILE"))
        .map(|l| l.trim().to_owned())
        .collect();
    v[v.len().saturating_sub(max)..].to_vec()
}

struct Ctx<'a> {
    cfg: &'a RunConfig,
    dir: PathBuf,
    status_file: PathBuf,
    result: TestResult,
}

impl Ctx<'_> {
    fn status(&self) -> Status {
        parse_status(&std::fs::read_to_string(&self.status_file).unwrap_or_default())
    }

    fn finish(mut self, outcome: Outcome, started: Instant) -> TestResult {
        let st = self.status();
        self.result
            .notes
            .splice(0..0, st.info.iter().map(|i| format!("INFO: {i}")));
        let failed = matches!(outcome, Outcome::Fail(_));
        if !(failed && self.cfg.keep_images) {
            for i in 1..=self.cfg.repeat {
                let _ = std::fs::remove_dir_all(self.dir.join(format!("img-{i}")));
            }
        } else {
            self.result
                .notes
                .push(format!("images kept in {}/img-*", self.dir.display()));
        }
        self.result.outcome = outcome;
        self.result.elapsed = started.elapsed();
        self.result
    }

    /// Runs CRIU, killing it (and reporting `TimedOut`) when it runs over the configured
    /// timeout: a hung CRIU must not hang the runner.
    fn criu(&self, args: &[OsString], restore: bool) -> std::io::Result<(bool, Duration)> {
        let t = Instant::now();
        let mut child = Command::new(&self.cfg.criu)
            .args(args)
            .env(
                "CRIU_PLUGIN_OPTIONS",
                plugin_options(self.cfg, restore).join(" "),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        loop {
            if let Some(st) = child.try_wait()? {
                return Ok((st.success(), t.elapsed()));
            }
            if t.elapsed() > self.cfg.timeout {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "criu ran over {} s (--timeout) and was killed",
                        self.cfg.timeout.as_secs()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }
}

/// The result of a case that did not run.
#[must_use]
pub fn skipped_case(c: &Case, backend: Backend, reason: String) -> TestResult {
    TestResult {
        custom_storage: c.custom_storage.map(|m| m.as_str().to_owned()),
        ..skipped(&c.workload, backend, reason)
    }
}

/// A test result for a test that did not run.
#[must_use]
pub fn skipped(w: &Workload, backend: Backend, reason: String) -> TestResult {
    TestResult {
        name: w.name.to_owned(),
        backend: backend.as_str().to_owned(),
        custom_storage: None,
        outcome: Outcome::Skip(reason),
        device_bytes: None,
        cycles: Vec::new(),
        elapsed: Duration::ZERO,
        log_dir: None,
        notes: Vec::new(),
    }
}

/// Runs one workload through CRIU and returns its result (never panics on the workload's or
/// CRIU's failures: they are the result).
#[must_use]
pub fn run_one(cfg: &RunConfig, w: &Workload) -> TestResult {
    let started = Instant::now();
    let mut dir = cfg.work_dir.join(cfg.backend.as_str());
    if let Some(cs) = cfg.custom_storage {
        dir.push(format!("custom-storage-{}", cs.as_str()));
    }
    let dir = dir.join(w.name);
    let mut cx = Ctx {
        cfg,
        status_file: dir.join("status"),
        dir: dir.clone(),
        result: TestResult {
            name: w.name.to_owned(),
            backend: cfg.backend.as_str().to_owned(),
            custom_storage: cfg.custom_storage.map(|c| c.as_str().to_owned()),
            outcome: Outcome::Pass,
            device_bytes: None,
            cycles: Vec::new(),
            elapsed: Duration::ZERO,
            log_dir: Some(dir.display().to_string()),
            notes: Vec::new(),
        },
    };
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return cx.finish(
            Outcome::Fail(format!("cannot create {}: {e}", dir.display())),
            started,
        );
    }

    // Start: a session leader (so CRIU needs no --shell-job), stdio on files.
    let out = match File::create(dir.join("workload.out")).and_then(|f| Ok((f.try_clone()?, f))) {
        Ok(o) => o,
        Err(e) => {
            return cx.finish(
                Outcome::Fail(format!("cannot create workload.out: {e}")),
                started,
            )
        }
    };
    let mut cmd = Command::new(cfg.bin_dir.join(w.name));
    cmd.arg("--status")
        .arg(&cx.status_file)
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(out.0)
        .stderr(out.1)
        .envs(cfg.env.iter().map(|(k, v)| (k, v)));
    if let Some(m) = cfg.mib {
        cmd.env("ZDTM_CUDA_MIB", m.to_string());
    }
    // SAFETY: the closure runs in the forked child before exec and only calls setsid(2), which
    // is async-signal-safe; it touches no memory shared with the parent.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()
                .map(drop)
                .map_err(std::io::Error::from)
        });
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return cx.finish(
                Outcome::Fail(format!("cannot start {}: {e}", w.name)),
                started,
            )
        }
    };
    let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
    // Reaped with waitpid below, like a restored task.
    drop(child);

    // READY (or an early verdict).
    let t = Instant::now();
    loop {
        let st = cx.status();
        if let Some(b) = st.ready {
            cx.result.device_bytes = Some(b);
            break;
        }
        if let Some(exit) = wait_gone(pid, Duration::ZERO) {
            let st = cx.status();
            let o = verdict(&st, exit);
            let o = match o {
                Outcome::Pass => Outcome::Fail("ended with PASS before READY".into()),
                o => o,
            };
            return cx.finish(o, started);
        }
        if t.elapsed() > cfg.timeout {
            kill_and_reap(pid);
            return cx.finish(
                Outcome::Fail(format!("no READY within {} s", cfg.timeout.as_secs())),
                started,
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    for i in 1..=cfg.repeat {
        let images = dir.join(format!("img-{i}"));
        if let Err(e) = std::fs::create_dir_all(&images) {
            kill_and_reap(pid);
            return cx.finish(
                Outcome::Fail(format!("cannot create {}: {e}", images.display())),
                started,
            );
        }
        let mut cycle = Cycle::default();
        let dump_log = format!("dump-{i}.log");
        match cx.criu(&dump_args(cfg, pid, &images, &dir, &dump_log), false) {
            Ok((true, d)) => {
                cycle.criu_dump = Some(d);
                if i == 1 {
                    let lines = custom_storage_lines(&cx.log(&dump_log));
                    cx.result
                        .notes
                        .extend(lines.into_iter().map(|l| format!("plugin (dump): {l}")));
                }
                if let Some(cs) = cfg.custom_storage {
                    let files = cs_files(&images);
                    cycle.cs_files = Some(files);
                    let wrong = match cs {
                        CustomStorage::On if files.files == 0 => Some(
                            "custom-storage=on, but the dump wrote no cuda-cs-*.img file"
                                .to_owned(),
                        ),
                        CustomStorage::Off if files.files > 0 => Some(format!(
                            "custom-storage=off, but the dump wrote {} cuda-cs-*.img file(s)",
                            files.files
                        )),
                        _ => None,
                    };
                    if let Some(why) = wrong {
                        cx.result.cycles.push(cycle);
                        kill_and_reap(pid);
                        return cx.finish(Outcome::Fail(format!("cycle {i}: {why}")), started);
                    }
                }
            }
            Ok((false, _)) => {
                let errs = criu_errors(&cx.log(&dump_log), 5);
                cx.result.notes.extend(errs.iter().cloned());
                kill_and_reap(pid);
                return cx.finish(
                    Outcome::Fail(format!(
                        "criu dump (cycle {i}) failed: {}",
                        errs.join(" | ")
                    )),
                    started,
                );
            }
            Err(e) => {
                kill_and_reap(pid);
                return cx.finish(
                    Outcome::Fail(format!("cannot run {}: {e}", cfg.criu.display())),
                    started,
                );
            }
        }
        let restore_log = format!("restore-{i}.log");
        if !cfg.leave_running {
            // The dump killed the task; its pid must be free before the restore.
            match wait_gone(pid, cfg.timeout) {
                Some(_) => {}
                None => {
                    kill_and_reap(pid);
                    return cx.finish(
                        Outcome::Fail(format!(
                            "pid {pid} still there {} s after the dump",
                            cfg.timeout.as_secs()
                        )),
                        started,
                    );
                }
            }
            match cx.criu(&restore_args(cfg, &images, &dir, &restore_log), true) {
                Ok((true, d)) => {
                    cycle.criu_restore = Some(d);
                    if i == 1 {
                        let lines = custom_storage_lines(&cx.log(&restore_log));
                        cx.result
                            .notes
                            .extend(lines.into_iter().map(|l| format!("plugin (restore): {l}")));
                    }
                }
                Ok((false, _)) => {
                    let errs = criu_errors(&cx.log(&restore_log), 5);
                    cx.result.notes.extend(errs.iter().cloned());
                    if Path::new(&format!("/proc/{pid}")).exists() {
                        kill_and_reap(pid);
                    }
                    cx.result.cycles.push(cycle);
                    return cx.finish(
                        Outcome::Fail(format!(
                            "criu restore (cycle {i}) failed: {}",
                            errs.join(" | ")
                        )),
                        started,
                    );
                }
                Err(e) => {
                    return cx.finish(
                        Outcome::Fail(format!("cannot run {}: {e}", cfg.criu.display())),
                        started,
                    );
                }
            }
        }
        cycle.phases = Phases::from_logs(&cx.log(&dump_log), &cx.log(&restore_log));
        cx.result.cycles.push(cycle);
    }

    // Verify.
    if let Err(e) = kill(Pid::from_raw(pid), Signal::SIGUSR1) {
        return cx.finish(
            Outcome::Fail(format!("cannot signal pid {pid} after the restore: {e}")),
            started,
        );
    }
    let Some(exit) = wait_gone(pid, cfg.timeout) else {
        kill_and_reap(pid);
        return cx.finish(
            Outcome::Fail(format!(
                "no verdict within {} s of SIGUSR1",
                cfg.timeout.as_secs()
            )),
            started,
        );
    };
    let o = verdict(&cx.status(), exit);
    cx.finish(o, started)
}
