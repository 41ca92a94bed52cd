//! `criu_bench`: what `cuda_plugin.so` costs under real CRIU, side by side with a plugin-free
//! dump, plus the plugin's hook latency under the emulated engine and the scenario suite's
//! throughput. See `docs/performance.md` for the method and the latest results.
//!
//! # What one run measures
//!
//! 1. **Real CRIU** (4.2.x if present, else 4.1.x; `--criu PATH` to choose): dump + restore of
//!    trees of N = 1, 8, 32 processes (`--sizes`) in three configurations,
//!    - `driver-api`: `mock-cuda-app --kib 64 --children N-1 --child-args "--kib 64"` (N mock
//!      CUDA processes) with the plugin, `cuda_plugin.backend=driver-api`;
//!    - `cuda-checkpoint`: the same tree with `cuda_plugin.backend=cuda-checkpoint`;
//!    - `driver-api-noguard`: as `driver-api` with `cuda_plugin.guardian=off` (no helper
//!      process: what the guardian costs);
//!    - `driver-api-parallel`, `cuda-checkpoint-parallel`: as `driver-api` and
//!      `cuda-checkpoint` with `cuda_plugin.parallel=auto` (every task's checkpoint and restore
//!      at the first hook call of CRIU's loop);
//!    - `plain`: the same tree with `--cpu-only` (no driver loaded) and an empty plugin
//!      directory (no plugin at all).
//!
//!    Every round runs every (N, configuration) pair once, in an order rotated per round, so
//!    drift in the machine's load hits all configurations alike; min and median over the rounds
//!    are reported. Each sample uses a fresh mock world and tree; only the `criu dump` and
//!    `criu restore -d` processes are timed (wall clock, spawn to exit). After each restore the
//!    tree is checked (every task runs free, every task's data check PASSes on SIGUSR1).
//!    From each sample: the `cuda-checkpoint` runs of the dump and of the restore (the world
//!    trace's `cuda-checkpoint(...) = exit=N` lines), the plugin's per-task hook times
//!    (`<HOOK> pid N: done in X ms` at `-v4`), and CRIU's own phase times (`stats-dump`,
//!    `stats-restore` in the image directory).
//! 2. **Emulated engine**: `harness --host pr3076 dump` / `restore` of an 8-task CUDA tree, per
//!    backend, interleaved the same way; per-call hook latency from the plugin log.
//! 3. **Scenario suite**: `harness run scenarios/` wall time and scenarios/s (once, at the end).
//!
//! Output: tables on stdout, `<target-dir>/bench/criu_bench.{json,csv}` and the plot
//! `docs/performance.svg` (median dump+restore against N).
//!
//! # Running
//!
//! `scripts/bench.sh [ROUNDS]` builds everything in release mode and runs
//! `cargo bench -p cuda-plugin --bench criu_bench -- --rounds ROUNDS`. Options:
//! `--rounds R` (default 5), `--sizes 1,8,32`, `--criu PATH`, `--no-emulated`,
//! `--no-scenarios`, `--out DIR`, `--svg PATH`, `--no-svg`.
//!
//! Without `--bench` on the command line (`cargo test --all-targets` runs bench targets that
//! way) it is a smoke test: one round of N=1 in the three configurations, nothing written.
//! It skips (exit 0) when not root or when no CRIU is found. A failed sample keeps its
//! directory (images, CRIU logs, world) and prints its path; `CRIU_BENCH_KEEP=1` keeps all.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};
use support::*;

// ---------------------------------------------------------------------------------------------
// Options

#[derive(Debug, Clone)]
struct Opts {
    /// `--bench` was given (a real benchmark run); else a smoke test.
    bench: bool,
    rounds: usize,
    sizes: Vec<usize>,
    criu: Option<PathBuf>,
    emulated: bool,
    scenarios: bool,
    out: Option<PathBuf>,
    svg: Option<PathBuf>,
    no_svg: bool,
    list: bool,
    world_dir: Option<PathBuf>,
    /// `--configs`: the configurations to sample (default: all).
    configs: Option<Vec<Config>>,
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        bench: false,
        rounds: 5,
        sizes: vec![1, 8, 32],
        criu: None,
        emulated: true,
        scenarios: true,
        out: None,
        svg: None,
        no_svg: false,
        list: false,
        world_dir: None,
        configs: None,
    };
    let mut it = std::env::args().skip(1);
    let mut explicit_rounds = false;
    let mut explicit_sizes = false;
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--bench" => o.bench = true,
            "--rounds" => {
                o.rounds = value("--rounds")?
                    .parse()
                    .map_err(|e| format!("--rounds: {e}"))?;
                explicit_rounds = true;
            }
            "--sizes" => {
                o.sizes = value("--sizes")?
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse::<usize>()
                            .map_err(|e| format!("--sizes: {e}"))
                    })
                    .collect::<Result<_, _>>()?;
                explicit_sizes = true;
            }
            "--criu" => o.criu = Some(PathBuf::from(value("--criu")?)),
            "--no-emulated" => o.emulated = false,
            "--no-scenarios" => o.scenarios = false,
            "--out" => o.out = Some(PathBuf::from(value("--out")?)),
            "--svg" => o.svg = Some(PathBuf::from(value("--svg")?)),
            "--no-svg" => o.no_svg = true,
            "--world-dir" => o.world_dir = Some(PathBuf::from(value("--world-dir")?)),
            "--list" => o.list = true,
            "--configs" => {
                let names = value("--configs")?;
                let mut cs = Vec::new();
                for name in names.split(',').map(str::trim) {
                    let c = CONFIGS
                        .iter()
                        .copied()
                        .find(|c| c.name() == name)
                        .ok_or_else(|| {
                            let all: Vec<_> = CONFIGS.iter().map(|c| c.name()).collect();
                            format!(
                                "--configs: unknown configuration {name:?} (known: {})",
                                all.join(", ")
                            )
                        })?;
                    cs.push(c);
                }
                o.configs = Some(cs);
            }
            "-h" | "--help" => {
                return Err("usage: criu_bench [--bench] [--rounds R] [--sizes 1,8,32] \
                            [--criu PATH] [--no-emulated] [--no-scenarios] [--out DIR] \
                            [--svg PATH] [--no-svg] [--world-dir DIR] \
                            [--configs driver-api,cuda-checkpoint,c-plugin,...]"
                    .into())
            }
            // libtest options `cargo test` may pass (--nocapture, --test-threads N, filters…).
            other => eprintln!("criu_bench: ignoring argument {other:?}"),
        }
    }
    ensure!(o.rounds >= 1, "--rounds must be at least 1");
    ensure!(
        !o.sizes.is_empty() && o.sizes.iter().all(|&n| n >= 1),
        "--sizes must list sizes of at least 1"
    );
    if !o.bench {
        // The smoke test: one round of N=1 only, nothing else, nothing written.
        if !explicit_rounds {
            o.rounds = 1;
        }
        if !explicit_sizes {
            o.sizes = vec![1];
        }
        o.emulated = false;
        o.scenarios = false;
        o.no_svg = true;
    }
    Ok(o)
}

// ---------------------------------------------------------------------------------------------
// Configurations and samples

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Config {
    Driver,
    Cli,
    Plain,
    /// `driver-api` with `cuda_plugin.guardian=off`: the driver calls on threads inside CRIU,
    /// no helper process (what the guardian costs, side by side).
    DriverNoGuardian,
    /// `driver-api` with `cuda_plugin.parallel=auto`.
    DriverParallel,
    /// `cuda-checkpoint` with `cuda_plugin.parallel=auto`.
    CliParallel,
    /// CRIU's own C `cuda_plugin.so` of the same CRIU version (built by
    /// `scripts/fetch-criu.sh --c-plugin`), enabled with `CRIU_FAULT=138`; it takes no options
    /// and runs `cuda-checkpoint`. Sampled only where that `.so` exists.
    CPlugin,
}

const CONFIGS: [Config; 7] = [
    Config::Driver,
    Config::Cli,
    Config::Plain,
    Config::DriverNoGuardian,
    Config::DriverParallel,
    Config::CliParallel,
    Config::CPlugin,
];

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Driver => "driver-api",
            Config::Cli => "cuda-checkpoint",
            Config::Plain => "plain",
            Config::DriverNoGuardian => "driver-api-noguard",
            Config::DriverParallel => "driver-api-parallel",
            Config::CliParallel => "cuda-checkpoint-parallel",
            Config::CPlugin => "c-plugin",
        }
    }

    /// The backend, with any further option the configuration sets.
    fn backend(self) -> Option<&'static str> {
        match self {
            Config::Driver => Some("driver-api"),
            Config::Cli => Some("cuda-checkpoint"),
            Config::Plain => None,
            Config::DriverNoGuardian => Some("driver-api cuda_plugin.guardian=off"),
            Config::DriverParallel => Some("driver-api cuda_plugin.parallel=auto"),
            Config::CliParallel => Some("cuda-checkpoint cuda_plugin.parallel=auto"),
            Config::CPlugin => None,
        }
    }

    fn colour(self) -> &'static str {
        match self {
            Config::Driver => "#1f77b4",
            Config::Cli => "#d62728",
            Config::Plain => "#2ca02c",
            Config::DriverNoGuardian => "#9467bd",
            Config::DriverParallel => "#ff7f0e",
            Config::CliParallel => "#8c564b",
            Config::CPlugin => "#7f7f7f",
        }
    }
}

/// CRIU's own phase times (µs → ms) from `stats-dump` / `stats-restore`.
#[derive(Debug, Clone, Default)]
struct CriuStats {
    freezing: f64,
    frozen: f64,
    memdump: f64,
    memwrite: f64,
    /// Pages written to the images (`pages_written`).
    pages: f64,
    forking: f64,
    restore: f64,
}

/// One dump + restore.
#[derive(Debug, Clone)]
struct Sample {
    config: Config,
    n: usize,
    round: usize,
    dump_ms: f64,
    restore_ms: f64,
    dump_runs: usize,
    restore_runs: usize,
    /// Lines the world trace gained during the dump / the restore (driver calls and
    /// `cuda-checkpoint` runs).
    dump_calls: usize,
    restore_calls: usize,
    /// Hook name → per-task times (ms), from both logs.
    hooks: BTreeMap<String, Vec<f64>>,
    stats: CriuStats,
}

/// What every sample shares: the CRIU to run and the artifacts.
struct Bench {
    criu: PathBuf,
    criu_version: String,
    a: &'static Artifacts,
    /// Where the mock worlds live (see [`world_base`]).
    world_base: PathBuf,
    /// CRIU's C plugin for this CRIU ([`Config::CPlugin`]), where it was built.
    c_plugin: Option<PathBuf>,
}

/// CRIU's own C `cuda_plugin.so` built beside the CRIU wrapper `criu` by
/// `scripts/fetch-criu.sh --c-plugin` (`target/criu/<version>/c-plugin/cuda_plugin.so`).
fn c_plugin_of(criu: &Path) -> Option<PathBuf> {
    let so = criu.parent()?.join("c-plugin").join("cuda_plugin.so");
    so.is_file().then_some(so)
}

/// The directory for the mock worlds: `--world-dir`, else `/dev/shm` when it is a writable
/// directory, else the system's temporary directory. A world models the driver's and the
/// GPU's memory (device data, state, mailboxes), so it belongs in memory like theirs; CRIU's
/// images stay in the sample directory under the temporary directory, for every configuration
/// alike.
fn world_base(o: &Opts) -> PathBuf {
    if let Some(d) = &o.world_dir {
        return d.clone();
    }
    let shm = Path::new("/dev/shm");
    let writable = tempfile::Builder::new()
        .prefix("criu-bench-probe-")
        .tempdir_in(shm)
        .is_ok();
    if writable {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// One sample's directory, world and tree.
struct Run<'b> {
    b: &'b Bench,
    dir: Option<tempfile::TempDir>,
    /// The directory holding the world (under [`Bench::world_base`]).
    world_dir: Option<tempfile::TempDir>,
    path: PathBuf,
    world: PathBuf,
    libdir: PathBuf,
    bindir: PathBuf,
    report: PathBuf,
    options: Option<String>,
    /// CRIU's C plugin is loaded: enabled with `CRIU_FAULT=138` instead of our variable.
    c_plugin: bool,
    pids: Vec<i32>,
    keep: bool,
}

impl<'b> Run<'b> {
    /// A sample directory for `config`: our plugin with its backend and options, CRIU's C
    /// plugin, or no plugin.
    fn for_config(b: &'b Bench, config: Config, prefix: &str) -> R<Run<'b>> {
        match (config, &b.c_plugin) {
            (Config::CPlugin, Some(so)) => Run::new(b, None, Some(so), prefix),
            (Config::CPlugin, None) => Err("CRIU's C plugin was not built".into()),
            _ => Run::new(b, config.backend(), None, prefix),
        }
    }

    /// `backend`: our plugin with this backend (and options); else `other_plugin`, if any.
    fn new(
        b: &'b Bench,
        backend: Option<&str>,
        other_plugin: Option<&Path>,
        prefix: &str,
    ) -> R<Run<'b>> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?;
        let p = dir.path().to_path_buf();
        let world_dir = tempfile::Builder::new()
            .prefix("criu-bench-world-")
            .tempdir_in(&b.world_base)
            .map_err(|e| format!("a directory under {}: {e}", b.world_base.display()))?;
        let world = world_dir.path().join("world");
        let (libdir, bindir) = (p.join("plugins"), p.join("bin"));
        for d in [&libdir, &bindir] {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        let so = match (backend, other_plugin) {
            (Some(_), _) => Some(b.a.plugin_so.as_path()),
            (None, other) => other,
        };
        if let Some(so) = so {
            std::fs::copy(so, libdir.join("cuda_plugin.so"))
                .map_err(|e| format!("copying {}: {e}", so.display()))?;
        }
        std::os::unix::fs::symlink(&b.a.cuda_checkpoint, bindir.join("cuda-checkpoint"))
            .map_err(|e| format!("linking cuda-checkpoint: {e}"))?;
        let cfg = p.join("world.toml");
        std::fs::write(&cfg, world_config("")).map_err(|e| format!("world.toml: {e}"))?;
        let out = Command::new(&b.a.mock_world)
            .arg("init")
            .arg(&world)
            .arg("--config")
            .arg(&cfg)
            .arg("--lib")
            .arg(&b.a.mock_so)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running mock-world: {e}"))?;
        ensure!(
            out.status.success(),
            "mock-world init failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(Run {
            b,
            report: p.join("report.txt"),
            path: p,
            dir: Some(dir),
            world_dir: Some(world_dir),
            world,
            libdir,
            bindir,
            options: backend.map(|be| format!("cuda_plugin.backend={be}")),
            c_plugin: other_plugin.is_some(),
            pids: Vec::new(),
            keep: false,
        })
    }

    fn marker(&self) -> String {
        format!("MOCK_CUDA_WORLD={}", self.world.display())
    }

    /// The environment of the workload, CRIU and the harness.
    fn env(&self, cmd: &mut Command) {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut new_path = self.bindir.clone().into_os_string();
        new_path.push(":");
        new_path.push(path);
        cmd.env("MOCK_CUDA_WORLD", &self.world)
            .env("LD_LIBRARY_PATH", self.world.join("lib"))
            .env("PATH", new_path)
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("CRIU_CUDA_PLUGIN_MAX_HOOKS")
            .env_remove("CRIU_LIBS_DIR")
            .env_remove("CRIU_FAULT");
        match &self.options {
            Some(o) => {
                cmd.env("CRIU_PLUGIN_OPTIONS", o)
                    .env("CRIU_CUDA_FORCE_ENABLE", "1");
            }
            None => {
                cmd.env_remove("CRIU_PLUGIN_OPTIONS")
                    .env_remove("CRIU_CUDA_FORCE_ENABLE");
            }
        }
        if self.c_plugin {
            // CRIU's FI_PLUGIN_CUDA_FORCE_ENABLE: the C plugin's switch for hosts without a GPU.
            cmd.env("CRIU_FAULT", "138");
        }
    }

    /// Starts a tree of `n` processes (CUDA unless `cpu_only`) and waits for `n` READY lines.
    fn spawn_tree(&mut self, n: usize, cpu_only: bool) -> R {
        let mut args: Vec<String> = vec!["--kib".into(), "64".into()];
        if cpu_only {
            args.push("--cpu-only".into());
        }
        if n > 1 {
            args.push("--children".into());
            args.push((n - 1).to_string());
            args.push("--child-args".into());
            args.push(if cpu_only {
                "--cpu-only --kib 64".into()
            } else {
                "--kib 64".into()
            });
        }
        let mut cmd = Command::new(&self.b.a.mock_app);
        cmd.args(&args)
            .arg("--report")
            .arg(&self.report)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.env(&mut cmd);
        in_new_session(&mut cmd);
        let root = cmd
            .spawn()
            .map_err(|e| format!("starting mock-cuda-app: {e}"))?
            .id() as i32;
        self.pids = vec![root];
        let ready = |r: &[String]| r.iter().filter(|l| l.starts_with("READY ")).count();
        let limit = Duration::from_secs(20 + n as u64);
        ensure!(
            wait_until(limit, || ready(&self.records()) >= n),
            "the tree did not report {n} READY lines: {}",
            read(&self.report)
        );
        for l in self.records() {
            let pid = l
                .strip_prefix("READY ")
                .and_then(|r| r.split_whitespace().find_map(|f| f.strip_prefix("pid=")))
                .and_then(|p| p.parse::<i32>().ok());
            if let Some(pid) = pid {
                if pid != root {
                    self.pids.push(pid);
                }
            }
        }
        let cuda = self
            .records()
            .iter()
            .filter(|l| l.starts_with("READY ") && l.contains(" cuda=yes"))
            .count();
        ensure!(
            cuda == if cpu_only { 0 } else { n },
            "expected {} CUDA tasks, the report says {cuda}",
            if cpu_only { 0 } else { n }
        );
        Ok(())
    }

    /// The report's records. `mock-cuda-app` appends each line with two `write(2)`s (text, then
    /// newline), so with many processes two records can share a line and leave an empty one:
    /// split before every record keyword instead of trusting the newlines.
    fn records(&self) -> Vec<String> {
        let mut text = read(&self.report);
        for k in ["READY ", "PASS ", "FAIL "] {
            text = text.replace(k, &format!("\n{k}"));
        }
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// (`cuda-checkpoint` runs, trace lines) so far.
    fn trace_counts(&self) -> (usize, usize) {
        let t = read(&self.world.join("trace.log"));
        (cli_runs(&t), t.lines().count())
    }

    /// Runs `prog args…` with the run's environment; returns (ok, wall ms, log text).
    fn timed(&self, prog: &Path, args: &[&str], log: &Path) -> R<(bool, f64, String)> {
        let out = std::fs::File::create(log.with_extension("out")).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(prog);
        cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
        self.env(&mut cmd);
        let t = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", prog.display()))?;
        let deadline = t + Duration::from_secs(300);
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("{} {args:?} ran over 300 s", prog.display()));
                }
                Ok(None) => std::thread::sleep(Duration::from_micros(500)),
                Err(e) => return Err(format!("waiting for {}: {e}", prog.display())),
            }
        };
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        reap();
        let mut text = read(log);
        if !status.success() {
            text.push_str(&read(&log.with_extension("out")));
        }
        Ok((status.success(), ms, text))
    }

    fn criu(&self, args: &[&str], log: &str) -> R<(bool, f64, String)> {
        let log = self.path.join(log);
        let libdir = self.libdir.display().to_string();
        let logs = log.display().to_string();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["-L", &libdir, "-v4", "-o", &logs]);
        self.timed(&self.b.criu, &all, &log)
    }

    fn wait_tree_gone(&self) -> R {
        wait_pids_gone(&self.pids, Duration::from_secs(20))
    }

    /// Every task runs free and answers SIGUSR1 with PASS.
    fn check_restored(&self) -> R {
        let free = || self.pids.iter().all(|&p| check_free_running(p).is_ok());
        if !wait_until(Duration::from_secs(5), free) {
            for &p in &self.pids {
                check_free_running(p)?;
            }
        }
        let before = self.records().len();
        for &pid in &self.pids {
            ensure!(signal(pid, SIGUSR1), "signalling pid {pid}");
        }
        let answered = |r: &[String], pid: i32| {
            let needle = format!(" pid={pid} ");
            r.iter()
                .skip(before)
                .any(|l| l.starts_with("PASS") && l.contains(&needle))
        };
        let all = wait_until(Duration::from_secs(20), || {
            let r = self.records();
            self.pids.iter().all(|&p| answered(&r, p))
        });
        let report = read(&self.report);
        ensure!(
            all && !self.records().iter().any(|l| l.starts_with("FAIL")),
            "not every task PASSed its data check after the restore:\n{report}"
        );
        Ok(())
    }

    fn teardown(&mut self) {
        let marker = self.marker();
        reap();
        wait_until(Duration::from_secs(10), || {
            let left = processes_with_env(&marker);
            for &pid in &left {
                signal(pid, SIGCONT);
                signal(pid, SIGKILL);
            }
            reap();
            left.is_empty()
        });
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        self.teardown();
        if self.keep {
            if let Some(d) = self.dir.take() {
                eprintln!("    kept {} for inspection", d.keep().display());
            }
            if let Some(d) = self.world_dir.take() {
                eprintln!("    kept its world {}", d.keep().display());
            }
        }
    }
}

/// `CRIU_BENCH_KEEP=1`: keep every sample's directory (images, logs, world), not only failed ones.
fn keep_all() -> bool {
    std::env::var("CRIU_BENCH_KEEP").is_ok_and(|v| v == "1")
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Per hook name, the `done in` time of every call; and under `"<HOOK> (backend)"` and
/// `"<HOOK> (restore thread)"` the time each call waited on the backend and on restore-thread
/// control.
fn collect_hooks(into: &mut BTreeMap<String, Vec<f64>>, log: &str) {
    for (hook, _, ms) in hook_times(log) {
        into.entry(hook).or_default().push(ms);
    }
    for (hook, _, backend, threads) in hook_waits(log) {
        into.entry(format!("{hook} {BACKEND_PART}"))
            .or_default()
            .push(backend);
        into.entry(format!("{hook} {THREADS_PART}"))
            .or_default()
            .push(threads);
    }
}

/// Suffixes of the hook-time keys holding the time waited on the backend and on ptrace.
const BACKEND_PART: &str = "(backend)";
const THREADS_PART: &str = "(restore thread)";

/// One dump + restore of a fresh tree of `n` tasks in `config`.
fn sample(b: &Bench, config: Config, n: usize, round: usize) -> R<Sample> {
    let mut run = Run::for_config(b, config, "criu-bench-")?;
    let r = sample_in(&mut run, config, n, round);
    run.keep = r.is_err() || keep_all();
    r
}

fn sample_in(run: &mut Run<'_>, config: Config, n: usize, round: usize) -> R<Sample> {
    run.spawn_tree(n, config == Config::Plain)?;
    let img = run.path.join("img");
    std::fs::create_dir_all(&img).map_err(|e| e.to_string())?;
    let imgs = img.display().to_string();
    let root = run.pids[0].to_string();
    let runs0 = run.trace_counts();
    let (ok, dump_ms, dump_log) = run.criu(&["dump", "-t", &root, "-D", &imgs], "dump.log")?;
    ensure!(ok, "criu dump failed; log tail:\n{}", tail(&dump_log, 25));
    let runs1 = run.trace_counts();
    run.wait_tree_gone()?;
    let (ok, restore_ms, restore_log) = run.criu(&["restore", "-d", "-D", &imgs], "restore.log")?;
    ensure!(
        ok,
        "criu restore failed; log tail:\n{}",
        tail(&restore_log, 25)
    );
    let runs2 = run.trace_counts();
    run.check_restored()?;
    run.teardown();
    let mut hooks = BTreeMap::new();
    collect_hooks(&mut hooks, &dump_log);
    collect_hooks(&mut hooks, &restore_log);
    if let Some(be) = config.backend() {
        for h in ["PAUSE_DEVICES", "CHECKPOINT_DEVICES", "RESUME_DEVICES_LATE"] {
            let got = hooks.get(h).map_or(0, Vec::len);
            ensure!(
                got == n,
                "{be}: {got} \"{h} … done in\" lines for {n} CUDA tasks"
            );
        }
    }
    let mut stats = CriuStats::default();
    if let Some(d) = read_stats(&img.join("stats-dump"), 1) {
        stats.freezing = d.get(&1).copied().unwrap_or(0) as f64 / 1000.0;
        stats.frozen = d.get(&2).copied().unwrap_or(0) as f64 / 1000.0;
        stats.memdump = d.get(&3).copied().unwrap_or(0) as f64 / 1000.0;
        stats.memwrite = d.get(&4).copied().unwrap_or(0) as f64 / 1000.0;
        stats.pages = d.get(&7).copied().unwrap_or(0) as f64;
    }
    if let Some(r) = read_stats(&img.join("stats-restore"), 2) {
        stats.forking = r.get(&3).copied().unwrap_or(0) as f64 / 1000.0;
        stats.restore = r.get(&4).copied().unwrap_or(0) as f64 / 1000.0;
    }
    Ok(Sample {
        config,
        n,
        round,
        dump_ms,
        restore_ms,
        dump_runs: runs1.0 - runs0.0,
        restore_runs: runs2.0 - runs1.0,
        dump_calls: runs1.1 - runs0.1,
        restore_calls: runs2.1 - runs1.1,
        hooks,
        stats,
    })
}

// ---------------------------------------------------------------------------------------------
// CRIU's stats images (protobuf, decoded by hand: a handful of varint fields)

fn varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*i)?;
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The varint fields of a protobuf message; `sub` set: the fields of the embedded message
/// with that field number instead.
fn proto_fields(b: &[u8], sub: Option<u64>) -> Option<BTreeMap<u64, u64>> {
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < b.len() {
        let key = varint(b, &mut i)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                let v = varint(b, &mut i)?;
                out.insert(field, v);
            }
            1 => i += 8,
            5 => i += 4,
            2 => {
                let len = varint(b, &mut i)? as usize;
                let body = b.get(i..i + len)?;
                i += len;
                if Some(field) == sub {
                    return proto_fields(body, None);
                }
            }
            _ => return None,
        }
    }
    if sub.is_some() {
        None
    } else {
        Some(out)
    }
}

/// `stats_entry.<which>` (1 dump, 2 restore) of a CRIU stats image.
fn read_stats(p: &Path, which: u64) -> Option<BTreeMap<u64, u64>> {
    const STATS_MAGIC: u32 = 0x5709_3306;
    let b = std::fs::read(p).ok()?;
    let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let start = if u32_at(0)? == STATS_MAGIC {
        4
    } else if u32_at(4)? == STATS_MAGIC {
        8
    } else {
        return None;
    };
    let len = u32_at(start)? as usize;
    proto_fields(b.get(start + 4..start + 4 + len)?, Some(which))
}

// ---------------------------------------------------------------------------------------------
// Statistics

fn min(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::INFINITY, f64::min)
}

fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn of(samples: &[Sample], c: Config, n: usize) -> Vec<&Sample> {
    samples
        .iter()
        .filter(|s| s.config == c && s.n == n)
        .collect()
}

fn col(ss: &[&Sample], f: impl Fn(&Sample) -> f64) -> Vec<f64> {
    ss.iter().map(|s| f(s)).collect()
}

/// "min / median".
fn mm(xs: &[f64]) -> String {
    if xs.is_empty() {
        "-".into()
    } else {
        format!("{:.1} / {:.1}", min(xs), median(xs))
    }
}

// ---------------------------------------------------------------------------------------------
// The emulated engine and the scenario suite

#[derive(Debug, Clone, Default)]
struct Emulated {
    /// backend → hook → per-call ms.
    hooks: BTreeMap<String, BTreeMap<String, Vec<f64>>>,
    /// backend → (dump ms, restore ms) per round.
    walls: BTreeMap<String, Vec<(f64, f64)>>,
    note: Option<String>,
}

const EMULATED_TASKS: usize = 8;

fn harness_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let h = exe.parent()?.parent()?.join("harness");
    h.is_file().then_some(h)
}

fn emulated(b: &Bench, rounds: usize) -> Emulated {
    let mut e = Emulated::default();
    let Some(harness) = harness_exe() else {
        e.note = Some(
            "skipped: no `harness` next to this bench's profile directory (scripts/bench.sh \
             builds it)"
                .into(),
        );
        return e;
    };
    let backends = ["driver-api", "cuda-checkpoint"];
    for round in 0..rounds {
        for k in 0..backends.len() {
            let be = backends[(k + round) % backends.len()];
            match emulated_once(b, &harness, be) {
                Ok((hooks, d, r)) => {
                    let per = e.hooks.entry(be.to_owned()).or_default();
                    for (h, v) in hooks {
                        per.entry(h).or_default().extend(v);
                    }
                    e.walls.entry(be.to_owned()).or_default().push((d, r));
                }
                Err(err) => {
                    e.note = Some(format!("{be}: {err}"));
                    eprintln!("criu_bench: emulated {be}: {err}");
                }
            }
        }
    }
    e
}

fn emulated_once(
    b: &Bench,
    harness: &Path,
    backend: &str,
) -> R<(BTreeMap<String, Vec<f64>>, f64, f64)> {
    let mut run = Run::new(b, Some(backend), None, "criu-bench-emu-")?;
    let r = (|| {
        run.spawn_tree(EMULATED_TASKS, false)?;
        let img = run.path.join("img");
        let imgs = img.display().to_string();
        let lib = run.libdir.display().to_string();
        let root = run.pids[0].to_string();
        let opt = format!("cuda_plugin.backend={backend}");
        let dlog = run.path.join("emu-dump.log");
        let rlog = run.path.join("emu-restore.log");
        let (dl, rl) = (dlog.display().to_string(), rlog.display().to_string());
        let (ok, d_ms, d_text) = run.timed(
            harness,
            &[
                "--host",
                "pr3076",
                "dump",
                "-t",
                &root,
                "-D",
                &imgs,
                "-L",
                &lib,
                "-v4",
                "-o",
                &dl,
                "--plugin-option",
                &opt,
            ],
            &dlog,
        )?;
        ensure!(ok, "harness dump failed:\n{}", tail(&d_text, 20));
        let (ok, r_ms, r_text) = run.timed(
            harness,
            &[
                "--host", "pr3076", "restore", "-D", &imgs, "-L", &lib, "-v4", "-o", &rl,
            ],
            &rlog,
        )?;
        ensure!(ok, "harness restore failed:\n{}", tail(&r_text, 20));
        run.check_restored()?;
        let mut hooks = BTreeMap::new();
        collect_hooks(&mut hooks, &d_text);
        collect_hooks(&mut hooks, &r_text);
        ensure!(
            !hooks.is_empty(),
            "no \"done in\" lines in the harness logs:\n{}",
            tail(&d_text, 20)
        );
        Ok((hooks, d_ms, r_ms))
    })();
    run.keep = r.is_err() || keep_all();
    r
}

#[derive(Debug, Clone, Default)]
struct Suite {
    wall_s: f64,
    scenarios: usize,
    summary: String,
    note: Option<String>,
}

fn scenario_suite() -> Suite {
    let mut s = Suite::default();
    let Some(harness) = harness_exe() else {
        s.note = Some("skipped: no `harness` built next to this bench".into());
        return s;
    };
    let t = Instant::now();
    let out = Command::new(&harness)
        .arg("run")
        .arg("scenarios")
        .current_dir(workspace())
        .stdin(Stdio::null())
        .output();
    s.wall_s = t.elapsed().as_secs_f64();
    reap();
    match out {
        Err(e) => s.note = Some(format!("could not run harness run: {e}")),
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout);
            // "P passed, F failed, S skipped (T scenarios in X s)"
            let line = text
                .lines()
                .rev()
                .find(|l| l.contains(" scenarios in "))
                .unwrap_or("")
                .trim()
                .to_owned();
            s.scenarios = line
                .split_once('(')
                .and_then(|(_, r)| r.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            if !o.status.success() {
                let failed: Vec<String> = String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .filter_map(|l| l.strip_prefix("==== FAILED "))
                    .map(str::to_owned)
                    .collect();
                s.note = Some(format!(
                    "harness run exited with {}; failed: {} (the scenario suite's failures, not \
                     the benchmark's)",
                    o.status,
                    failed.join(", ")
                ));
            }
            s.summary = line;
        }
    }
    s
}

// ---------------------------------------------------------------------------------------------
// Reporting

struct Machine {
    date: String,
    cpu: String,
    cores: usize,
    kernel: String,
    load_start: String,
    load_end: String,
}

fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn loadavg() -> String {
    read(Path::new("/proc/loadavg"))
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn machine() -> Machine {
    let cpuinfo = read(Path::new("/proc/cpuinfo"));
    Machine {
        date: sh("date", &["-u", "+%Y-%m-%dT%H:%MZ"]),
        cpu: cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
            .unwrap_or_else(|| "unknown CPU".into()),
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        kernel: read(Path::new("/proc/sys/kernel/osrelease"))
            .trim()
            .to_owned(),
        load_start: loadavg(),
        load_end: String::new(),
    }
}

struct Report<'a> {
    o: &'a Opts,
    criu_version: String,
    world_base: String,
    m: &'a Machine,
    samples: &'a [Sample],
    emu: Option<&'a Emulated>,
    suite: Option<&'a Suite>,
}

impl Report<'_> {
    fn dr(s: &Sample) -> f64 {
        s.dump_ms + s.restore_ms
    }

    fn med(&self, c: Config, n: usize, f: impl Fn(&Sample) -> f64) -> f64 {
        median(&col(&of(self.samples, c, n), f))
    }

    /// The target verdict: driver-API dump+restore (median) at N=32 within 10% of plain.
    fn target_ratio(&self) -> Option<f64> {
        let d = self.med(Config::Driver, 32, Self::dr);
        let p = self.med(Config::Plain, 32, Self::dr);
        (d.is_finite() && p.is_finite()).then_some(d / p)
    }

    fn text(&self) -> String {
        let mut s = String::new();
        let m = self.m;
        let _ = writeln!(
            s,
            "\ncriu_bench: CRIU {}, {} round(s), sizes {:?}; {} UTC; {} ({} cores), kernel {}; \
             load average {} at start, {} at end; mock worlds under {}",
            self.criu_version,
            self.o.rounds,
            self.o.sizes,
            m.date,
            m.cpu,
            m.cores,
            m.kernel,
            m.load_start,
            m.load_end,
            self.world_base
        );
        let _ = writeln!(
            s,
            "\n1. Real CRIU: wall time of `criu dump` / `criu restore -d`, ms (min / median over rounds)\n"
        );
        let _ = writeln!(
            s,
            "| config | N | dump ms | restore ms | dump+restore ms | dump ms/task |\n|---|---:|---:|---:|---:|---:|"
        );
        for &n in &self.o.sizes {
            for c in CONFIGS {
                let ss = of(self.samples, c, n);
                if ss.is_empty() {
                    continue;
                }
                let _ = writeln!(
                    s,
                    "| {} | {n} | {} | {} | {} | {:.2} |",
                    c.name(),
                    mm(&col(&ss, |x| x.dump_ms)),
                    mm(&col(&ss, |x| x.restore_ms)),
                    mm(&col(&ss, Self::dr)),
                    median(&col(&ss, |x| x.dump_ms)) / n as f64
                );
            }
        }
        let _ = writeln!(
            s,
            "\n2. The plugin's added time (medians; plain = same tree without CUDA and without the plugin)\n"
        );
        let _ = writeln!(
            s,
            "| backend | N | +dump ms/task | +restore ms/task | +dump/task ÷ plain dump/task | dump ×plain | restore ×plain | dump+restore ×plain (median) | (min) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for &n in &self.o.sizes {
            let pd = self.med(Config::Plain, n, |x| x.dump_ms);
            let pr = self.med(Config::Plain, n, |x| x.restore_ms);
            let pdr_min = min(&col(&of(self.samples, Config::Plain, n), Self::dr));
            for c in [Config::Driver, Config::Cli, Config::CPlugin] {
                let ss = of(self.samples, c, n);
                if ss.is_empty() {
                    continue;
                }
                let d = self.med(c, n, |x| x.dump_ms);
                let r = self.med(c, n, |x| x.restore_ms);
                let nf = n as f64;
                let _ = writeln!(
                    s,
                    "| {} | {n} | {:+.2} | {:+.2} | {:+.0}% | {:.2} | {:.2} | {:.2} | {:.2} |",
                    c.name(),
                    (d - pd) / nf,
                    (r - pr) / nf,
                    100.0 * (d - pd) / pd,
                    d / pd,
                    r / pr,
                    (d + r) / (pd + pr),
                    min(&col(&ss, Self::dr)) / pdr_min
                );
            }
        }
        let _ = writeln!(
            s,
            "\n3. cuda-checkpoint executions (from the world trace; max over rounds), and all trace lines (driver calls + runs)\n"
        );
        let _ = writeln!(
            s,
            "| backend | N | per dump | limit 4N+1 | per restore | limit 2N+1 | verdict | trace lines dump / restore |\n|---|---:|---:|---:|---:|---:|---|---:|"
        );
        for &n in &self.o.sizes {
            for c in [Config::Driver, Config::Cli, Config::CPlugin] {
                let ss = of(self.samples, c, n);
                if ss.is_empty() {
                    continue;
                }
                let d = ss.iter().map(|x| x.dump_runs).max().unwrap_or(0);
                let r = ss.iter().map(|x| x.restore_runs).max().unwrap_or(0);
                let verdict = match c {
                    Config::Driver if d == 0 && r == 0 => "PASS",
                    Config::Cli if d <= 4 * n + 1 && r <= 2 * n + 1 => "PASS",
                    // The limits are ours; CRIU's C plugin is shown for comparison.
                    Config::CPlugin => "-",
                    _ => "MISS",
                };
                let _ = writeln!(
                    s,
                    "| {} | {n} | {d} | {} | {r} | {} | {} | {} / {} |",
                    c.name(),
                    4 * n + 1,
                    2 * n + 1,
                    verdict,
                    ss.iter().map(|x| x.dump_calls).max().unwrap_or(0),
                    ss.iter().map(|x| x.restore_calls).max().unwrap_or(0)
                );
            }
        }
        let _ = writeln!(s, "\n4. Targets\n");
        match self.target_ratio() {
            Some(r) => {
                let _ = writeln!(
                    s,
                    "- driver-api adds at most 10% to the plugin-free dump+restore at N=32: \
                     {:.2}× plain ({:+.0}%) → {}",
                    r,
                    (r - 1.0) * 100.0,
                    if r <= 1.10 { "PASS" } else { "MISS" }
                );
            }
            None => {
                let _ = writeln!(s, "- driver-api ≤ +10% at N=32: n/a (N=32 not measured)");
            }
        }
        let cli_ok = self.o.sizes.iter().all(|&n| {
            of(self.samples, Config::Cli, n)
                .iter()
                .all(|x| x.dump_runs <= 4 * n + 1 && x.restore_runs <= 2 * n + 1)
        });
        let _ = writeln!(
            s,
            "- cuda-checkpoint ≤ 4N+1 runs per dump and ≤ 2N+1 per restore: {}",
            if cli_ok { "PASS" } else { "MISS" }
        );

        let _ = writeln!(
            s,
            "\n5. Where the time goes (medians, ms): CRIU's phases (stats-dump / stats-restore) and the plugin's hooks (sum over tasks; mean per task)\n"
        );
        let _ = writeln!(
            s,
            "| config | N | dump | freezing | frozen | memdump | memwrite | pages written | PAUSE_DEVICES | CHECKPOINT_DEVICES | restore | forking | restore phase | RESUME_DEVICES_LATE |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        let hook = |x: &Sample, h: &str| x.hooks.get(h).map_or(0.0, |v| v.iter().sum());
        for &n in &self.o.sizes {
            for c in CONFIGS {
                if of(self.samples, c, n).is_empty() {
                    continue;
                }
                let h = |name: &'static str| {
                    let sum = self.med(c, n, |x| hook(x, name));
                    // No plugin, or CRIU's C plugin, which logs no hook times.
                    if c.backend().is_none() {
                        "-".to_owned()
                    } else {
                        format!("{sum:.1} ({:.2})", sum / n as f64)
                    }
                };
                let _ = writeln!(
                    s,
                    "| {} | {n} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {} | {} | {:.1} | {:.1} | {:.1} | {} |",
                    c.name(),
                    self.med(c, n, |x| x.dump_ms),
                    self.med(c, n, |x| x.stats.freezing),
                    self.med(c, n, |x| x.stats.frozen),
                    self.med(c, n, |x| x.stats.memdump),
                    self.med(c, n, |x| x.stats.memwrite),
                    self.med(c, n, |x| x.stats.pages),
                    h("PAUSE_DEVICES"),
                    h("CHECKPOINT_DEVICES"),
                    self.med(c, n, |x| x.restore_ms),
                    self.med(c, n, |x| x.stats.forking),
                    self.med(c, n, |x| x.stats.restore),
                    h("RESUME_DEVICES_LATE"),
                );
            }
        }
        let _ = writeln!(
            s,
            "\nInside the hooks (medians of the sum over tasks, ms; mean per task in brackets): \
             waiting on the backend (driver calls or `cuda-checkpoint` runs), on restore-thread \
             control (ptrace), and the rest (the plugin's own work)\n"
        );
        let _ = writeln!(
            s,
            "| config | N | hook | total | backend | restore thread | plugin's own |\n|---|---:|---|---:|---:|---:|---:|"
        );
        for &n in &self.o.sizes {
            for c in [Config::Driver, Config::Cli] {
                if of(self.samples, c, n).is_empty() {
                    continue;
                }
                for h in ["PAUSE_DEVICES", "CHECKPOINT_DEVICES", "RESUME_DEVICES_LATE"] {
                    let total = self.med(c, n, |x| hook(x, h));
                    let be = self.med(c, n, |x| hook(x, &format!("{h} {BACKEND_PART}")));
                    let th = self.med(c, n, |x| hook(x, &format!("{h} {THREADS_PART}")));
                    let own = self.med(c, n, |x| {
                        hook(x, h)
                            - hook(x, &format!("{h} {BACKEND_PART}"))
                            - hook(x, &format!("{h} {THREADS_PART}"))
                    });
                    let per = |v: f64| format!("{v:.1} ({:.2})", v / n as f64);
                    let _ = writeln!(
                        s,
                        "| {} | {n} | {h} | {} | {} | {} | {} |",
                        c.name(),
                        per(total),
                        per(be),
                        per(th),
                        per(own)
                    );
                }
            }
        }
        if let Some(n) = self.o.sizes.iter().copied().max() {
            let _ = writeln!(s, "\nAt N={n} (medians, ms):");
            let pd = self.med(Config::Plain, n, |x| x.dump_ms);
            let pr = self.med(Config::Plain, n, |x| x.restore_ms);
            for c in [Config::Driver, Config::Cli] {
                if of(self.samples, c, n).is_empty() {
                    continue;
                }
                let d = self.med(c, n, |x| x.dump_ms);
                let r = self.med(c, n, |x| x.restore_ms);
                let hooks_d = self.med(c, n, |x| {
                    hook(x, "PAUSE_DEVICES") + hook(x, "CHECKPOINT_DEVICES")
                });
                let hooks_r = self.med(c, n, |x| hook(x, "RESUME_DEVICES_LATE"));
                let _ = writeln!(
                    s,
                    "- {}: dump {:+.1} vs plain, of which plugin hooks {:.1} and CRIU itself \
                     {:+.1}; restore {:+.1} vs plain, of which RESUME_DEVICES_LATE {:.1} and \
                     CRIU itself {:+.1}",
                    c.name(),
                    d - pd,
                    hooks_d,
                    d - pd - hooks_d,
                    r - pr,
                    hooks_r,
                    r - pr - hooks_r
                );
            }
        }

        if let Some(e) = self.emu {
            let _ = writeln!(
                s,
                "\n6. Emulated engine (`harness --host pr3076`, {EMULATED_TASKS}-task CUDA tree): hook latency per call, ms\n"
            );
            if e.hooks.is_empty() {
                let _ = writeln!(s, "{}", e.note.as_deref().unwrap_or("no data"));
            } else {
                let _ = writeln!(
                    s,
                    "| backend | hook | calls | min | median | max | harness dump ms (median) | harness restore ms (median) |\n|---|---|---:|---:|---:|---:|---:|---:|"
                );
                for (be, hooks) in &e.hooks {
                    let walls = e.walls.get(be).cloned().unwrap_or_default();
                    let wd: Vec<f64> = walls.iter().map(|w| w.0).collect();
                    let wr: Vec<f64> = walls.iter().map(|w| w.1).collect();
                    for (h, v) in hooks {
                        let _ = writeln!(
                            s,
                            "| {be} | {h} | {} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} |",
                            v.len(),
                            min(v),
                            median(v),
                            v.iter().copied().fold(0.0, f64::max),
                            median(&wd),
                            median(&wr)
                        );
                    }
                }
                if let Some(n) = &e.note {
                    let _ = writeln!(s, "\nnote: {n}");
                }
            }
        }
        if let Some(su) = self.suite {
            let _ = writeln!(s, "\n7. Scenario suite (`harness run scenarios`, -j 2)\n");
            if su.scenarios > 0 {
                let _ = writeln!(
                    s,
                    "{} scenarios in {:.1} s wall = {:.2} scenarios/s ({})",
                    su.scenarios,
                    su.wall_s,
                    su.scenarios as f64 / su.wall_s,
                    su.summary
                );
            }
            if let Some(n) = &su.note {
                let _ = writeln!(s, "note: {n}");
            }
        }
        s
    }

    fn csv(&self) -> String {
        let mut s = String::from(
            "round,config,n,dump_ms,restore_ms,dump_restore_ms,cli_runs_dump,cli_runs_restore,\
             trace_lines_dump,trace_lines_restore,\
             pause_ms_sum,checkpoint_ms_sum,resume_ms_sum,criu_freezing_ms,criu_frozen_ms,\
             criu_memdump_ms,criu_memwrite_ms,criu_pages_written,criu_forking_ms,criu_restore_ms\n",
        );
        for x in self.samples {
            let h = |n: &str| x.hooks.get(n).map_or(0.0, |v| v.iter().sum::<f64>());
            let _ = writeln!(
                s,
                "{},{},{},{:.3},{:.3},{:.3},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.0},{:.3},{:.3}",
                x.round,
                x.config.name(),
                x.n,
                x.dump_ms,
                x.restore_ms,
                x.dump_ms + x.restore_ms,
                x.dump_runs,
                x.restore_runs,
                x.dump_calls,
                x.restore_calls,
                h("PAUSE_DEVICES"),
                h("CHECKPOINT_DEVICES"),
                h("RESUME_DEVICES_LATE"),
                x.stats.freezing,
                x.stats.frozen,
                x.stats.memdump,
                x.stats.memwrite,
                x.stats.pages,
                x.stats.forking,
                x.stats.restore
            );
        }
        s
    }

    fn json(&self) -> String {
        fn esc(s: &str) -> String {
            let mut o = String::new();
            for ch in s.chars() {
                match ch {
                    '"' => o.push_str("\\\""),
                    '\\' => o.push_str("\\\\"),
                    c if (c as u32) < 0x20 => {
                        let _ = write!(o, "\\u{:04x}", c as u32);
                    }
                    c => o.push(c),
                }
            }
            o
        }
        let num = |v: f64| {
            if v.is_finite() {
                format!("{v:.3}")
            } else {
                "null".into()
            }
        };
        let m = self.m;
        let mut s = String::new();
        let _ = write!(
            s,
            "{{\n  \"criu\": \"{}\",\n  \"rounds\": {},\n  \"date\": \"{}\",\n  \"cpu\": \"{}\",\n  \"cores\": {},\n  \"kernel\": \"{}\",\n  \"load_start\": \"{}\",\n  \"load_end\": \"{}\",\n  \"summary\": [",
            esc(&self.criu_version),
            self.o.rounds,
            esc(&m.date),
            esc(&m.cpu),
            m.cores,
            esc(&m.kernel),
            m.load_start,
            m.load_end
        );
        let mut first = true;
        for &n in &self.o.sizes {
            for c in CONFIGS {
                let ss = of(self.samples, c, n);
                if ss.is_empty() {
                    continue;
                }
                let d = col(&ss, |x| x.dump_ms);
                let r = col(&ss, |x| x.restore_ms);
                let dr = col(&ss, Self::dr);
                let _ = write!(
                    s,
                    "{}\n    {{\"config\": \"{}\", \"n\": {n}, \"dump_min\": {}, \"dump_median\": {}, \"restore_min\": {}, \"restore_median\": {}, \"dump_restore_min\": {}, \"dump_restore_median\": {}, \"cli_runs_dump\": {}, \"cli_runs_restore\": {}}}",
                    if first { "" } else { "," },
                    c.name(),
                    num(min(&d)),
                    num(median(&d)),
                    num(min(&r)),
                    num(median(&r)),
                    num(min(&dr)),
                    num(median(&dr)),
                    ss.iter().map(|x| x.dump_runs).max().unwrap_or(0),
                    ss.iter().map(|x| x.restore_runs).max().unwrap_or(0),
                );
                first = false;
            }
        }
        let _ = write!(
            s,
            "\n  ],\n  \"driver_api_n32_ratio\": {},\n",
            self.target_ratio().map_or("null".into(), num)
        );
        s.push_str("  \"emulated\": [");
        let mut first = true;
        if let Some(e) = self.emu {
            for (be, hooks) in &e.hooks {
                for (h, v) in hooks {
                    let _ = write!(
                        s,
                        "{}\n    {{\"backend\": \"{be}\", \"hook\": \"{h}\", \"calls\": {}, \"min_ms\": {}, \"median_ms\": {}}}",
                        if first { "" } else { "," },
                        v.len(),
                        num(min(v)),
                        num(median(v))
                    );
                    first = false;
                }
            }
        }
        s.push_str("\n  ],\n");
        match self.suite {
            Some(su) if su.scenarios > 0 => {
                let _ = writeln!(
                    s,
                    "  \"scenario_suite\": {{\"scenarios\": {}, \"wall_s\": {}, \"per_s\": {}, \"summary\": \"{}\"}}",
                    su.scenarios,
                    num(su.wall_s),
                    num(su.scenarios as f64 / su.wall_s),
                    esc(&su.summary)
                );
            }
            _ => s.push_str("  \"scenario_suite\": null\n"),
        }
        s.push_str("}\n");
        s
    }

    /// Median dump+restore against N, one line per configuration, min as hollow markers.
    fn svg(&self) -> String {
        let (w, h) = (720.0, 440.0);
        let (left, right, top, bottom) = (70.0, 190.0, 50.0, 60.0);
        let pw = w - left - right;
        let ph = h - top - bottom;
        let nmax = self.o.sizes.iter().copied().max().unwrap_or(1) as f64;
        let ymax_data = self
            .samples
            .iter()
            .map(Self::dr)
            .fold(0.0, f64::max)
            .max(1.0);
        let step = nice_step(ymax_data / 5.0);
        let ymax = (ymax_data / step).ceil() * step;
        let x = |n: f64| left + pw * n / nmax;
        let y = |v: f64| top + ph * (1.0 - v / ymax);
        let mut s = String::new();
        let _ = writeln!(
            s,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"##
        );
        let _ = writeln!(
            s,
            r##"<rect width="{w}" height="{h}" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">criu dump + criu restore -d, median of {} round(s) (CRIU {})</text>
<text x="{}" y="38" text-anchor="middle" font-size="11" fill="#555">{} · {} cores · load {} → {} · {} · hollow marks: min</text>"##,
            w / 2.0,
            self.o.rounds,
            self.criu_version,
            w / 2.0,
            self.m.cpu,
            self.m.cores,
            self.m.load_start,
            self.m.load_end,
            self.m.date
        );
        // Grid and axes.
        let mut v = 0.0;
        while v <= ymax + step / 2.0 {
            let yy = y(v);
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v}</text>"##,
                left + pw,
                left - 6.0,
                yy + 4.0
            );
            v += step;
        }
        for &n in &self.o.sizes {
            let xx = x(n as f64);
            let _ = writeln!(
                s,
                r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{:.1}" stroke="#eee"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{n}</text>"##,
                top + ph,
                top + ph + 18.0
            );
        }
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{top}" x2="{left}" y2="{:.1}" stroke="black"/><line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">N (processes in the tree)</text>
<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">dump + restore, ms</text>"##,
            top + ph,
            top + ph,
            left + pw,
            top + ph,
            left + pw / 2.0,
            h - 18.0,
            top + ph / 2.0
        );
        for (i, c) in CONFIGS.iter().enumerate() {
            let pts: Vec<(f64, f64, f64)> = self
                .o
                .sizes
                .iter()
                .filter_map(|&n| {
                    let ss = of(self.samples, *c, n);
                    (!ss.is_empty()).then(|| {
                        let v = col(&ss, Self::dr);
                        (n as f64, median(&v), min(&v))
                    })
                })
                .collect();
            if pts.is_empty() {
                continue;
            }
            let path: Vec<String> = pts
                .iter()
                .map(|&(n, m, _)| format!("{:.1},{:.1}", x(n), y(m)))
                .collect();
            let col = c.colour();
            let _ = writeln!(
                s,
                r##"<polyline fill="none" stroke="{col}" stroke-width="2" points="{}"/>"##,
                path.join(" ")
            );
            for &(n, m, mn) in &pts {
                let _ = writeln!(
                    s,
                    r##"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{col}"><title>{} N={n}: median {m:.1} ms, min {mn:.1} ms</title></circle><circle cx="{:.1}" cy="{:.1}" r="3" fill="none" stroke="{col}"/>"##,
                    x(n),
                    y(m),
                    c.name(),
                    x(n),
                    y(mn)
                );
            }
            let ly = top + 10.0 + 22.0 * i as f64;
            let lx = left + pw + 16.0;
            let label = match c {
                Config::Driver => "driver-api backend",
                Config::Cli => "cuda-checkpoint backend",
                Config::Plain => "plain tree, no plugin",
                Config::DriverNoGuardian => "driver-api, guardian=off",
                Config::DriverParallel => "driver-api, parallel=auto",
                Config::CliParallel => "cuda-checkpoint, parallel=auto",
                Config::CPlugin => "CRIU's C plugin (cuda-checkpoint)",
            };
            let _ = writeln!(
                s,
                r##"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{col}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{label}</text>"##,
                lx + 22.0,
                lx + 28.0,
                ly + 4.0
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// 1, 2 or 5 × 10^k, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.max(1e-9).log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= raw {
            return m * p;
        }
    }
    10.0 * p
}

// ---------------------------------------------------------------------------------------------
// main

fn criu_version(p: &Path) -> String {
    let out = sh(&p.display().to_string(), &["--version"]);
    out.lines()
        .find_map(|l| l.strip_prefix("Version:"))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| format!("at {}", p.display()))
}

fn main() -> ExitCode {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("criu_bench: {e}");
            return ExitCode::from(2);
        }
    };
    if o.list {
        if !o.bench {
            println!("criu_bench_smoke: test");
        }
        return ExitCode::SUCCESS;
    }
    let mode = if o.bench { "bench" } else { "smoke" };
    if !is_root() {
        println!("criu_bench ({mode}): skipped: not root (CRIU needs root)");
        return ExitCode::SUCCESS;
    }
    let (criu, version) = match &o.criu {
        Some(p) => (p.clone(), criu_version(p)),
        None => {
            let found = find_criu();
            let pick = found
                .iter()
                .find(|c| c.series == "4.2")
                .or_else(|| found.first());
            match pick {
                Some(c) => (c.path.clone(), c.version.clone()),
                None => {
                    println!(
                        "criu_bench ({mode}): skipped: no CRIU 4.1.x/4.2.x found (run \
                         scripts/fetch-criu.sh, set CRIU_CUDA_CRIU_4_2, or pass --criu PATH)"
                    );
                    return ExitCode::SUCCESS;
                }
            }
        }
    };
    let a = match artifacts() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("criu_bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !become_subreaper() {
        eprintln!("criu_bench: warning: cannot become a child subreaper");
    }
    let c_plugin = c_plugin_of(&criu);
    let b = Bench {
        criu,
        criu_version: version,
        a,
        world_base: world_base(&o),
        c_plugin,
    };
    // The configurations sampled: `--configs`, else all; CRIU's C plugin only where it was built.
    let configs: Vec<Config> = CONFIGS
        .iter()
        .copied()
        .filter(|c| o.configs.as_ref().is_none_or(|cs| cs.contains(c)))
        .filter(|&c| {
            let have = c != Config::CPlugin || b.c_plugin.is_some();
            if !have {
                eprintln!(
                    "criu_bench: no C plugin beside {} (scripts/fetch-criu.sh --c-plugin builds it): \
                     c-plugin not sampled",
                    b.criu.display()
                );
            }
            have
        })
        .collect();
    let mut m = machine();
    eprintln!(
        "criu_bench ({mode}): CRIU {} at {}; {} round(s) of sizes {:?}",
        b.criu_version,
        b.criu.display(),
        o.rounds,
        o.sizes
    );
    let started = Instant::now();
    let mut failed = false;
    if o.bench {
        // Warm-up (discarded): page cache, first-exec costs.
        for &c in &configs {
            if let Err(e) = sample(&b, c, 1, 0) {
                eprintln!("criu_bench: warm-up {}: {e}", c.name());
            }
        }
    }
    let mut samples = Vec::new();
    for round in 1..=o.rounds {
        for i in 0..o.sizes.len() {
            let n = o.sizes[(i + round) % o.sizes.len()];
            for k in 0..configs.len() {
                let c = configs[(k + round + i) % configs.len()];
                match sample(&b, c, n, round) {
                    Ok(s) => {
                        eprintln!(
                            "  round {round} {:<15} N={n:<3} dump {:>7.1} ms  restore {:>7.1} ms  cuda-checkpoint runs {}+{}",
                            c.name(),
                            s.dump_ms,
                            s.restore_ms,
                            s.dump_runs,
                            s.restore_runs
                        );
                        samples.push(s);
                    }
                    Err(e) => {
                        failed = true;
                        eprintln!("  round {round} {} N={n}: FAILED: {e}", c.name());
                    }
                }
            }
        }
    }
    let emu = o.emulated.then(|| emulated(&b, o.rounds));
    let suite = o.scenarios.then(scenario_suite);
    m.load_end = loadavg();
    let report = Report {
        o: &o,
        criu_version: b.criu_version.clone(),
        world_base: b.world_base.display().to_string(),
        m: &m,
        samples: &samples,
        emu: emu.as_ref(),
        suite: suite.as_ref(),
    };
    print!("{}", report.text());
    println!(
        "\n(criu_bench took {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    if o.bench {
        let out = o.out.clone().unwrap_or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|e| Some(e.parent()?.parent()?.parent()?.join("bench")))
                .unwrap_or_else(|| workspace().join("target/bench"))
        });
        let write = |p: PathBuf, text: String| match std::fs::create_dir_all(
            p.parent().unwrap_or(Path::new(".")),
        )
        .and_then(|()| std::fs::write(&p, text))
        {
            Ok(()) => println!("wrote {}", p.display()),
            Err(e) => eprintln!("criu_bench: writing {}: {e}", p.display()),
        };
        write(out.join("criu_bench.csv"), report.csv());
        write(out.join("criu_bench.json"), report.json());
        write(out.join("criu_bench.md"), report.text());
        if !o.no_svg {
            let svg = o
                .svg
                .clone()
                .unwrap_or_else(|| workspace().join("docs/performance.svg"));
            write(svg, report.svg());
        }
    }
    if failed {
        eprintln!("criu_bench: some samples FAILED (their directories were kept)");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
