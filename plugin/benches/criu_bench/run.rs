//! What every sample shares (the CRIU, the artifacts, where the worlds live) and one sample's
//! directory, mock world and process tree: starting the tree, running CRIU or the harness on
//! it with the right environment, checking the restored tree and cleaning up.

use crate::config::Config;
use crate::ensure;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testkit::criu::*;

/// What every sample shares: the CRIU to run and the artifacts.
pub(crate) struct Bench {
    pub(crate) criu: PathBuf,
    pub(crate) criu_version: String,
    pub(crate) a: &'static Artifacts,
    /// Where the mock worlds live (see [`world_base`]).
    pub(crate) world_base: PathBuf,
    /// CRIU's C plugin for this CRIU ([`Config::CPlugin`]), where it was built.
    pub(crate) c_plugin: Option<PathBuf>,
}

/// CRIU's own C `cuda_plugin.so` built beside the CRIU wrapper `criu` by
/// `scripts/fetch-criu.sh --c-plugin` (`target/criu/<version>/c-plugin/cuda_plugin.so`).
pub(crate) fn c_plugin_of(criu: &Path) -> Option<PathBuf> {
    let so = criu.parent()?.join("c-plugin").join("cuda_plugin.so");
    so.is_file().then_some(so)
}

/// The directory for the mock worlds: `--world-dir`, else `/dev/shm` when it is a writable
/// directory, else the system's temporary directory. A world models the driver's and the
/// GPU's memory (device data, state, mailboxes), so it belongs in memory like theirs; CRIU's
/// images stay in the sample directory under the temporary directory, for every configuration
/// alike.
pub(crate) fn world_base(world_dir: Option<&Path>) -> PathBuf {
    if let Some(d) = world_dir {
        return d.to_path_buf();
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
pub(crate) struct Run<'b> {
    b: &'b Bench,
    dir: Option<tempfile::TempDir>,
    /// The directory holding the world (under [`Bench::world_base`]).
    world_dir: Option<tempfile::TempDir>,
    pub(crate) path: PathBuf,
    world: PathBuf,
    pub(crate) libdir: PathBuf,
    bindir: PathBuf,
    report: PathBuf,
    options: Option<String>,
    /// CRIU's C plugin is loaded: enabled with `CRIU_FAULT=138` instead of our variable.
    c_plugin: bool,
    pub(crate) pids: Vec<i32>,
    pub(crate) keep: bool,
}

impl<'b> Run<'b> {
    /// A sample directory for `config`: our plugin with its backend and options, CRIU's C
    /// plugin, or no plugin.
    pub(crate) fn for_config(b: &'b Bench, config: Config, prefix: &str) -> R<Run<'b>> {
        match (config, &b.c_plugin) {
            (Config::CPlugin, Some(so)) => Run::new(b, None, Some(so), prefix),
            (Config::CPlugin, None) => Err("CRIU's C plugin was not built".into()),
            _ => Run::new(b, config.backend(), None, prefix),
        }
    }

    /// `backend`: our plugin with this backend (and options); else `other_plugin`, if any.
    pub(crate) fn new(
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
        init_world(b.a, &world, &world_config(""))?;
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
            .env_remove(criu_cuda_env::PLUGIN_MAX_HOOKS)
            .env_remove("CRIU_LIBS_DIR")
            .env_remove("CRIU_FAULT");
        match &self.options {
            Some(o) => {
                cmd.env("CRIU_PLUGIN_OPTIONS", o)
                    .env(criu_cuda_env::FORCE_ENABLE, "1");
            }
            None => {
                cmd.env_remove("CRIU_PLUGIN_OPTIONS")
                    .env_remove(criu_cuda_env::FORCE_ENABLE);
            }
        }
        if self.c_plugin {
            // CRIU's FI_PLUGIN_CUDA_FORCE_ENABLE: the C plugin's switch for hosts without a GPU.
            cmd.env("CRIU_FAULT", "138");
        }
    }

    /// Starts a tree of `n` processes (CUDA unless `cpu_only`) and waits for `n` READY lines.
    pub(crate) fn spawn_tree(&mut self, n: usize, cpu_only: bool) -> R {
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
    pub(crate) fn trace_counts(&self) -> (usize, usize) {
        let t = read(&self.world.join("trace.log"));
        (cli_runs(&t), t.lines().count())
    }

    /// Runs `prog args…` with the run's environment; returns (ok, wall ms, log text).
    pub(crate) fn timed(&self, prog: &Path, args: &[&str], log: &Path) -> R<(bool, f64, String)> {
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

    pub(crate) fn criu(&self, args: &[&str], log: &str) -> R<(bool, f64, String)> {
        let log = self.path.join(log);
        let libdir = self.libdir.display().to_string();
        let logs = log.display().to_string();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["-L", &libdir, "-v4", "-o", &logs]);
        self.timed(&self.b.criu, &all, &log)
    }

    pub(crate) fn wait_tree_gone(&self) -> R {
        wait_pids_gone(&self.pids, Duration::from_secs(20))
    }

    /// Every task runs free and answers SIGUSR1 with PASS.
    pub(crate) fn check_restored(&self) -> R {
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

    pub(crate) fn teardown(&mut self) {
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
pub(crate) fn keep_all() -> bool {
    std::env::var("CRIU_BENCH_KEEP").is_ok_and(|v| v == "1")
}

pub(crate) fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
