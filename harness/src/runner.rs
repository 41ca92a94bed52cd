//! The scenario executor: runs one `scenarios/**/*.toml` file against real processes and reports
//! whether the expected outcome happened, with a normalised transcript for snapshots.
//!
//! Per scenario: a temporary directory with a mock CUDA world (`mock-world init`, faults naming
//! tasks installed with `mock-world configure` once the workload runs), a plugin directory
//! (`cuda_plugin.so`, test plugins compiled from `tests/support/testplugin.c`), the workload
//! tree (one `mock-cuda-app` per task, each started by its parent's shell before it `exec`s, in
//! its own session), and the steps, each a `harness` engine process or a real `criu`, or done by
//! the harness itself: `mock-world configure` (the world becomes another host), removing or
//! rewriting an image (a file of the image directory, or an entry of the stream file).
//!
//! The transcript of each step holds the engine's hook trace, the mock driver's call trace
//! (calls of the engine/CRIU process and of `cuda-checkpoint` runs; the workload's own calls are
//! left out) and the plugin log lines, with pids replaced by task names (`root`,
//! `root.restore` for a restore thread, `criu`, `cuda-checkpoint`), paths and durations removed.

use crate::procfs::{comm, field, parked, state, thread_count, world_processes};
use crate::workload::{
    cuda_state_name, host_pid_in, kill_and_reap, mock_env, run_checked, spawn_root, tree_root,
    verify_data, wait_ready,
};
use mock_cuda_world::pidns::{identity_of, pid_ns_of};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use crate::kit::PluginUnderTest;
use crate::scenario::{
    Action, EngineKind, HostPids, Namespace, Outcome, PluginKind, Scenario, Step, TaskState,
};

/// Where the executables and libraries a scenario needs live.
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// The `harness` front-end.
    pub harness: PathBuf,
    /// `cuda_plugin.so` (built as `libcuda_plugin.so`).
    pub plugin: PathBuf,
    /// `libmock_libcuda.so`.
    pub mock_lib: PathBuf,
    /// `libmock_nvml.so` (the NVML stand-in `mock-world` installs).
    pub mock_nvml: PathBuf,
    /// `mock-world`.
    pub mock_world: PathBuf,
    /// `mock-cuda-app`.
    pub mock_app: PathBuf,
    /// `cuda-checkpoint` (the fake).
    pub cuda_checkpoint: PathBuf,
    /// The workspace root (test plugin sources, CRIU wrappers).
    pub workspace: PathBuf,
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).ok()?.modified().ok()
}

/// The newer of `<profile>/<name>` and `<profile>/deps/<name>` (`cargo test` refreshes `deps/`
/// only).
fn newest_lib(profile: &Path, name: &str) -> PathBuf {
    let a = profile.join(name);
    let b = profile.join("deps").join(name);
    match (mtime(&a), mtime(&b)) {
        (Some(x), Some(y)) if x > y => a,
        (Some(_), None) => a,
        _ => b,
    }
}

impl Artifacts {
    /// The artifacts of the target profile directory `profile` (e.g. `target/debug`), with the
    /// `harness` front-end `harness`. When one is missing, `$CARGO build` (or `cargo`) builds the
    /// packages that provide them, once per process.
    ///
    /// # Errors
    /// A build that fails or an artifact still missing after it.
    pub fn locate(profile: &Path, harness: &Path) -> Result<Self, String> {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let make = || Self {
            harness: harness.to_path_buf(),
            plugin: newest_lib(profile, "libcuda_plugin.so"),
            mock_lib: newest_lib(profile, "libmock_libcuda.so"),
            mock_nvml: newest_lib(profile, "libmock_nvml.so"),
            mock_world: profile.join("mock-world"),
            mock_app: profile.join("mock-cuda-app"),
            cuda_checkpoint: profile.join("cuda-checkpoint"),
            workspace: workspace.clone(),
        };
        let a = make();
        if a.missing().is_none() {
            return Ok(a);
        }
        static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
        BUILT.get_or_init(|| build(profile, &workspace)).clone()?;
        let a = make();
        match a.missing() {
            None => Ok(a),
            Some(p) => Err(format!("{} is missing after the build", p.display())),
        }
    }

    fn missing(&self) -> Option<&Path> {
        [
            &self.harness,
            &self.plugin,
            &self.mock_lib,
            &self.mock_nvml,
            &self.mock_world,
            &self.mock_app,
            &self.cuda_checkpoint,
        ]
        .into_iter()
        .find(|p| !p.exists())
        .map(PathBuf::as_path)
    }
}

fn build(profile: &Path, workspace: &Path) -> Result<(), String> {
    let target = profile.parent().ok_or("no target directory")?;
    let name = profile
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("odd profile directory")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut c = Command::new(&cargo);
    c.arg("build")
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .args([
            "-p",
            "cuda-plugin",
            "-p",
            "mock-libcuda",
            "-p",
            "mock-nvml",
            "-p",
            "fake-cuda-checkpoint",
        ])
        .args(["-p", "harness", "--lib", "--bins"])
        .env("CARGO_TARGET_DIR", target);
    match name {
        "debug" => {}
        "release" => {
            c.arg("--release");
        }
        other => {
            c.args(["--profile", other]);
        }
    }
    let out = c.output().map_err(|e| format!("running {cargo:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{c:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// How a scenario ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every expectation held.
    Pass,
    /// An expectation failed (why).
    Fail(String),
    /// It cannot run here (why).
    Skip(String),
    /// A `known_failure` scenario failed as expected (the reason, then what failed).
    XFail(String),
    /// It does not apply to the plugin under test (why; see [`crate::kit::applicability`]).
    NotApplicable(String),
}

/// One step of a run (or its setup, or its end-state checks), for per-step reports (JUnit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRecord {
    /// `setup`, `step 0: dump`, ..., `outcome`.
    pub name: String,
    /// Wall time.
    pub elapsed: Duration,
    /// What failed, if it did (first line: the same on every run).
    pub failure: Option<String>,
    /// Why it did not run (`not reached`: an earlier step failed), if it did not.
    pub skipped: Option<String>,
}

/// What [`run`] reports.
#[derive(Debug, Clone)]
pub struct Report {
    /// The verdict.
    pub verdict: Verdict,
    /// The host, as `emulated 4.2` or `criu 4.1`.
    pub host: String,
    /// The backends the CUDA plugin selected, per step that selected one (`-` when none).
    pub backend: String,
    /// The normalised transcript (compare with the snapshot when the verdict is a pass).
    pub transcript: String,
    /// Whether the transcript may be compared with the snapshot: this project's plugin, run
    /// with the scenario's own options only.
    pub snapshot_applies: bool,
    /// The setup, each step that ran and the end-state checks, in order.
    pub steps: Vec<StepRecord>,
    /// Wall time.
    pub elapsed: Duration,
}

/// Options of a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// A real-CRIU scenario whose CRIU is absent fails instead of being skipped
    /// (`CRIU_CUDA_REQUIRE_CRIU=1`).
    pub require_criu: bool,
}

/// Makes this process a child subreaper, so that the orphans of a workload tree (its children
/// after a real CRIU dump killed it, a `cuda-checkpoint` a plugin left behind) become its
/// children and can be reaped by pid. Call once before running scenarios.
pub fn become_subreaper() {
    let _ = nix::sys::prctl::set_child_subreaper(true);
}

/// Runs scenario `s` with this project's plugin.
#[must_use]
pub fn run(s: &Scenario, art: &Artifacts, opts: RunOptions) -> Report {
    run_with(s, art, opts, &PluginUnderTest::ours())
}

/// Runs scenario `s` with the CUDA plugin `put`.
#[must_use]
pub fn run_with(s: &Scenario, art: &Artifacts, opts: RunOptions, put: &PluginUnderTest) -> Report {
    let start = Instant::now();
    let host = format!(
        "{} {}",
        match s.host.engine {
            EngineKind::Emulated => "emulated",
            EngineKind::Criu => "criu",
        },
        s.host.profile
    );
    if let Err(why) = crate::kit::applicability(s, put, art) {
        return Report {
            verdict: Verdict::NotApplicable(why),
            host,
            backend: "-".to_owned(),
            transcript: String::new(),
            snapshot_applies: false,
            steps: Vec::new(),
            elapsed: start.elapsed(),
        };
    }
    let mut ex = Exec {
        s,
        art,
        put,
        records: Vec::new(),
        dir: PathBuf::new(),
        world: None,
        criu: None,
        names: BTreeMap::new(),
        pids: BTreeMap::new(),
        tids: BTreeMap::new(),
        procs: BTreeMap::new(),
        cli_pids: BTreeSet::new(),
        lock_timeouts: known_lock_timeouts(s),
        root_child: None,
        nspids: BTreeMap::new(),
        start_pids: BTreeMap::new(),
        ns_names: BTreeMap::new(),
        env: Vec::new(),
        transcript: String::new(),
        backends: Vec::new(),
        trace_offset: 0,
    };
    let tmp = tempfile::Builder::new().prefix("scenario-").tempdir();
    let result = match (&tmp, s.host.engine) {
        (Err(e), _) => Err(format!("tempdir: {e}")),
        (Ok(_), EngineKind::Criu) => match find_criu(&s.host.profile, &art.workspace) {
            Some(c) => {
                ex.criu = Some(c);
                Ok(())
            }
            None if opts.require_criu => Err(format!(
                "required (CRIU_CUDA_REQUIRE_CRIU=1): no CRIU {} found",
                s.host.profile
            )),
            None => {
                return Report {
                    verdict: Verdict::Skip(format!("no CRIU {} found", s.host.profile)),
                    host,
                    backend: "-".to_owned(),
                    transcript: String::new(),
                    snapshot_applies: false,
                    steps: Vec::new(),
                    elapsed: start.elapsed(),
                }
            }
        },
        (Ok(_), EngineKind::Emulated) => Ok(()),
    };
    let result = result.and_then(|()| {
        ex.dir = tmp
            .as_ref()
            .map_err(|e| e.to_string())?
            .path()
            .to_path_buf();
        ex.execute()
    });
    ex.cleanup();
    let error = result.as_ref().err().cloned();
    let verdict = match (result, &s.known_failure) {
        (Ok(()), None) => Verdict::Pass,
        (Err(e), None) => Verdict::Fail(e),
        (Err(e), Some(k)) => Verdict::XFail(format!("{k} ({})", first_line(&e))),
        (Ok(()), Some(k)) => Verdict::Fail(format!(
            "marked known_failure (\"{k}\") but passed: remove the mark"
        )),
    };
    let mut shown: Vec<String> = Vec::new();
    for b in &ex.backends {
        if shown.last() != Some(b) {
            shown.push(b.clone());
        }
    }
    let backend = if shown.is_empty() {
        "-".to_owned()
    } else {
        shown.join(">")
    };
    let mut steps = ex.records;
    if let (Some(e), false) = (&error, steps.iter().any(|r| r.failure.is_some())) {
        // Failed before any step (the world, the workload, the plugin directory).
        steps.push(StepRecord {
            name: "setup".to_owned(),
            elapsed: Duration::ZERO,
            failure: Some(e.clone()),
            skipped: None,
        });
    }
    // The steps (and end-state checks) a failure kept from running.
    let ran = steps.iter().filter(|r| r.name.starts_with("step ")).count();
    if error.is_some() {
        let rest = s
            .steps
            .iter()
            .enumerate()
            .skip(ran)
            .map(|(i, st)| format!("step {i}: {}", crate::scenario::name(st.action)));
        let outcome = (!steps.iter().any(|r| r.name == "outcome")).then(|| "outcome".to_owned());
        for name in rest.chain(outcome) {
            steps.push(StepRecord {
                name,
                elapsed: Duration::ZERO,
                failure: None,
                skipped: Some("not reached".to_owned()),
            });
        }
    }
    if let (Verdict::Fail(e), Some(last)) = (&verdict, steps.last_mut()) {
        // A known failure that passed.
        if error.is_none() {
            last.failure = Some(e.clone());
        }
    }
    Report {
        verdict,
        host,
        backend,
        transcript: ex.transcript,
        snapshot_applies: put.ours && !put.injects_options(s),
        steps,
        elapsed: start.elapsed(),
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// A real CRIU for `profile` (`4.1`, `4.2`): `$CRIU_CUDA_CRIU_4_1`/`_4_2`, else the wrapper
/// listed in `target/criu/versions` (`$CRIU_CUDA_CRIU_VERSIONS`), else `criu` in `PATH` when its
/// version matches.
#[must_use]
pub fn find_criu(profile: &str, workspace: &Path) -> Option<PathBuf> {
    let var = format!("CRIU_CUDA_CRIU_{}", profile.replace('.', "_"));
    if let Some(p) = std::env::var_os(&var).map(PathBuf::from) {
        if p.exists() {
            return Some(p);
        }
    }
    let versions = std::env::var_os("CRIU_CUDA_CRIU_VERSIONS")
        .map_or_else(|| workspace.join("target/criu/versions"), PathBuf::from);
    if let Ok(text) = std::fs::read_to_string(versions) {
        for line in text.lines() {
            let mut it = line.split_whitespace();
            if let (Some(v), Some(p)) = (it.next(), it.next()) {
                if (v == profile || v.starts_with(&format!("{profile}."))) && Path::new(p).exists()
                {
                    return Some(PathBuf::from(p));
                }
            }
        }
    }
    let out = Command::new("criu").arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text
        .lines()
        .find_map(|l| l.strip_prefix("Version:"))?
        .trim();
    (v == profile || v.starts_with(&format!("{profile}."))).then(|| PathBuf::from("criu"))
}

struct Exec<'a> {
    s: &'a Scenario,
    art: &'a Artifacts,
    put: &'a PluginUnderTest,
    records: Vec<StepRecord>,
    dir: PathBuf,
    world: Option<PathBuf>,
    criu: Option<PathBuf>,
    /// pid/tid (as text) -> label.
    names: BTreeMap<String, String>,
    /// task name -> pid.
    pids: BTreeMap<String, i32>,
    /// task name -> restore thread id.
    tids: BTreeMap<String, i32>,
    /// step processes (engine, criu) by pid.
    procs: BTreeMap<i32, &'static str>,
    cli_pids: BTreeSet<i32>,
    /// Lock timeouts (ms) the scenario configures; any other one the plugin derived from
    /// CRIU's freeze alarm, which depends on timing (see [`known_lock_timeouts`]).
    lock_timeouts: BTreeSet<u64>,
    root_child: Option<Child>,
    /// task name -> pid in its own pid namespace (the host pid when it has none of its own).
    nspids: BTreeMap<String, i32>,
    /// task name -> host pid when it started.
    start_pids: BTreeMap<String, i32>,
    /// (pid namespace, namespace pid) -> task name: how the mock's trace names callers that
    /// live in another pid namespace than the world's host.
    ns_names: BTreeMap<(u64, i32), String>,
    env: Vec<(String, String)>,
    transcript: String,
    backends: Vec<String>,
    trace_offset: usize,
}

const DEFAULT_GPU: &str = r#"
[[gpu]]
uuid = "GPU-00000000-0000-4000-8000-000000000000"
name = "NVIDIA H100 80GB HBM3"
memory_mib = 81559
chip = "GH100"
"#;

impl Exec<'_> {
    fn execute(&mut self) -> Result<(), String> {
        let cuda = self.s.needs_cuda();
        let lib = self.dir.join("lib");
        std::fs::create_dir(&lib).map_err(|e| e.to_string())?;
        if cuda {
            self.init_world()?;
        }
        self.install_plugins(&lib)?;
        if cuda {
            self.spawn_apps()?;
            self.install_faults()?;
        } else {
            self.spawn_sleepers()?;
        }
        for (i, step) in self.s.steps.iter().enumerate() {
            let t = Instant::now();
            let r = self.step(i, step, &lib);
            self.records.push(StepRecord {
                name: format!("step {i}: {}", crate::scenario::name(step.action)),
                elapsed: t.elapsed(),
                failure: r.as_ref().err().cloned(),
                skipped: None,
            });
            r?;
        }
        let t = Instant::now();
        let r = self.check_end();
        self.records.push(StepRecord {
            name: "outcome".to_owned(),
            elapsed: t.elapsed(),
            failure: r.as_ref().err().cloned(),
            skipped: None,
        });
        r
    }

    fn world_table(&self, with_faults: bool) -> Result<toml::Table, String> {
        self.complete_world(self.s.world.clone().unwrap_or_default(), with_faults)
    }

    /// `t` with `schema = 1` and the default GPU added when absent; faults dropped, or kept with
    /// task names turned into pids.
    fn complete_world(&self, mut t: toml::Table, with_faults: bool) -> Result<toml::Table, String> {
        t.entry("schema").or_insert(toml::Value::Integer(1));
        if !t.contains_key("gpu") {
            let g: toml::Table = toml::from_str(DEFAULT_GPU).map_err(|e| e.to_string())?;
            t.insert("gpu".to_owned(), g["gpu"].clone());
        }
        if !with_faults {
            t.remove("fault");
            return Ok(t);
        }
        if let Some(toml::Value::Array(faults)) = t.get_mut("fault") {
            for f in faults {
                let Some(ft) = f.as_table_mut() else { continue };
                if let Some(toml::Value::String(task)) = ft.remove("task") {
                    let pid = self
                        .pids
                        .get(&task)
                        .ok_or_else(|| format!("fault names unknown task `{task}`"))?;
                    ft.insert("pid".to_owned(), toml::Value::Integer(i64::from(*pid)));
                }
            }
        }
        Ok(t)
    }

    fn init_world(&mut self) -> Result<(), String> {
        let w = self.dir.join("world");
        let cfg = self.dir.join("world.toml");
        let t = self.world_table(false)?;
        std::fs::write(&cfg, t.to_string()).map_err(|e| e.to_string())?;
        run_checked(
            Command::new(&self.art.mock_world)
                .arg("init")
                .arg(&w)
                .arg("--config")
                .arg(&cfg)
                .arg("--lib")
                .arg(&self.art.mock_lib)
                .arg("--nvml-lib")
                .arg(&self.art.mock_nvml),
            "mock-world init",
        )?;
        let bin = self.dir.join("bin");
        std::fs::create_dir(&bin).map_err(|e| e.to_string())?;
        if self.s.host.cuda_checkpoint {
            std::os::unix::fs::symlink(&self.art.cuda_checkpoint, bin.join("cuda-checkpoint"))
                .map_err(|e| e.to_string())?;
        }
        self.env = mock_env(&w, &bin);
        self.world = Some(w);
        Ok(())
    }

    fn configure_world(&self, cfg: &Path, t: &toml::Table) -> Result<(), String> {
        let w = self.world.clone().ok_or("no mock world")?;
        std::fs::write(cfg, t.to_string()).map_err(|e| e.to_string())?;
        run_checked(
            Command::new(&self.art.mock_world)
                .arg("configure")
                .arg(&w)
                .arg("--config")
                .arg(cfg)
                .arg("--lib")
                .arg(&self.art.mock_lib)
                .arg("--nvml-lib")
                .arg(&self.art.mock_nvml),
            "mock-world configure",
        )?;
        Ok(())
    }

    fn install_faults(&mut self) -> Result<(), String> {
        if self.world.is_none() {
            return Ok(());
        }
        if !self
            .s
            .world
            .as_ref()
            .is_some_and(|t| t.contains_key("fault"))
        {
            return Ok(());
        }
        let cfg = self.dir.join("world-faults.toml");
        let t = self.world_table(true)?;
        self.configure_world(&cfg, &t)
    }

    fn install_plugins(&mut self, lib: &Path) -> Result<(), String> {
        for p in &self.s.plugins {
            match p.kind {
                PluginKind::Cuda => {
                    let file = p
                        .file
                        .clone()
                        .unwrap_or_else(|| "cuda_plugin.so".to_owned());
                    let so = p.path.as_deref().map_or_else(
                        || crate::kit::plugin_file(self.s, self.put, self.art),
                        |x| self.art.workspace.join(x),
                    );
                    std::fs::copy(&so, lib.join(file))
                        .map_err(|e| format!("copy {}: {e}", so.display()))?;
                }
                PluginKind::Test => {
                    let name = p.name.as_deref().unwrap_or("tp");
                    let file = p.file.clone().unwrap_or_else(|| format!("{name}.so"));
                    let src = self
                        .art
                        .workspace
                        .join("harness/tests/support/testplugin.c");
                    run_checked(
                        Command::new("cc")
                            .args(["-shared", "-fPIC", "-O0", "-w"])
                            .arg(format!("-DTP_NAME=\"{name}\""))
                            .args(p.defines.iter().map(|d| format!("-D{d}")))
                            .arg(src)
                            .arg("-o")
                            .arg(lib.join(file)),
                        &format!("cc test plugin {name}"),
                    )?;
                    for (event, actions) in &p.script {
                        self.env
                            .push((format!("TP_{name}_{event}"), actions.clone()));
                    }
                }
            }
        }
        Ok(())
    }

    fn children_of(&self, idx: usize) -> Vec<usize> {
        let name = &self.s.workload.tasks[idx].name;
        self.s
            .workload
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.parent.as_deref() == Some(name.as_str()))
            .map(|(j, _)| j)
            .collect()
    }

    fn spawn_tree(&mut self, exec_line: &dyn Fn(usize) -> String) -> Result<(), String> {
        let n = self.s.workload.tasks.len();
        for i in 0..n {
            let mut script = String::new();
            for j in self.children_of(i) {
                let _ = writeln!(script, "sh {}/task{j}.sh &", self.dir.display());
            }
            script.push_str(&exec_line(i));
            script.push('\n');
            std::fs::write(self.dir.join(format!("task{i}.sh")), script)
                .map_err(|e| e.to_string())?;
        }
        self.root_child = Some(spawn_root(
            &self.dir,
            &self.env,
            &self.s.workload.namespaces,
        )?);
        Ok(())
    }

    /// The host pid of the tree's root.
    fn root_pid(&self, deadline: Instant) -> Result<i32, String> {
        let child = self.root_child.as_ref().ok_or("the tree was not started")?;
        tree_root(child, &self.s.workload.namespaces, deadline)
    }

    /// The host pid of a task whose READY line says `pid` (its pid in its own namespace).
    fn host_pid_of(&self, pid: i32, deadline: Instant) -> Result<i32, String> {
        if !self.s.workload.has(Namespace::Pid) {
            return Ok(pid);
        }
        let root = self.root_pid(deadline)?;
        let ns = pid_ns_of(root).ok_or_else(|| format!("no pid namespace of the root {root}"))?;
        loop {
            if let Some(h) = host_pid_in(ns, pid) {
                return Ok(h);
            }
            if Instant::now() > deadline {
                return Err(format!("no process is pid {pid} of pid namespace {ns}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Records where task `name` lives now: its host pid, and its namespace pid.
    fn place_task(&mut self, name: &str, host: i32) {
        self.add_task(name, host);
        if let Some(id) = identity_of(host) {
            // The namespace pid it started with (a restore keeps it).
            self.nspids.entry(name.to_owned()).or_insert(id.pid);
            self.ns_names.insert((id.ns, id.pid), name.to_owned());
        }
    }

    /// After a real CRIU restored a tree with its own pid namespace: the tasks' new host pids,
    /// found by their namespace pids (CRIU keeps them) in the namespace of the restored root
    /// (`--pidfile`). Task names keep naming the old pids too.
    fn follow_restored_tree(&mut self, pidfile: &Path) -> Result<(), String> {
        let text =
            std::fs::read_to_string(pidfile).map_err(|e| format!("{}: {e}", pidfile.display()))?;
        let root: i32 = text
            .trim()
            .parse()
            .map_err(|_| format!("{}: not a pid: {text:?}", pidfile.display()))?;
        let ns = pid_ns_of(root)
            .ok_or_else(|| format!("no pid namespace of the restored root {root}"))?;
        for (name, nspid) in self.nspids.clone() {
            let host = host_pid_in(ns, nspid).ok_or_else(|| {
                format!("task {name} (pid {nspid} of its namespace) was not restored")
            })?;
            self.place_task(&name, host);
        }
        Ok(())
    }

    fn spawn_apps(&mut self) -> Result<(), String> {
        let app = self.art.mock_app.display().to_string();
        let dir = self.dir.display().to_string();
        let tasks = self.s.workload.tasks.clone();
        self.spawn_tree(&|i| {
            let t = &tasks[i];
            let mut line = String::new();
            for (k, v) in &t.env {
                let _ = write!(line, "export {k}='{}'; ", v.replace('\'', "'\\''"));
            }
            let _ = write!(
                line,
                "exec {app} --report {dir}/report{i} --threads {}",
                t.threads
            );
            if t.cuda {
                let gpus = t.gpus.clone().unwrap_or_else(|| vec![0]);
                let gpus: Vec<String> = gpus.iter().map(u32::to_string).collect();
                let _ = write!(line, " --gpus {}", gpus.join(","));
                match t.gib {
                    Some(g) => {
                        let _ = write!(line, " --gib {g}");
                    }
                    None => {
                        let _ = write!(line, " --kib {}", t.kib.unwrap_or(64));
                    }
                }
                if let Some(ms) = t.kernel_ms {
                    let _ = write!(line, " --kernel-ms {ms}");
                }
            } else {
                line.push_str(" --cpu-only");
            }
            if t.seccomp {
                line.push_str(" --seccomp");
            }
            line
        })?;
        let deadline = Instant::now() + Duration::from_secs(20);
        for (i, t) in tasks.iter().enumerate() {
            let (nspid, ready) = wait_ready(&self.dir, i, &t.name, deadline)?;
            let pid = self.host_pid_of(nspid, deadline)?;
            if let Some(want) = self.s.expect.start_gpus.get(&t.name) {
                let got: Vec<&str> = field(&ready, "gpus")
                    .map(|g| g.split(',').filter(|u| !u.is_empty()).collect())
                    .unwrap_or_default();
                if got != *want {
                    return Err(format!(
                        "task {}: started on GPUs {got:?}, expected {want:?}",
                        t.name
                    ));
                }
                if self.transcript.is_empty() {
                    self.transcript.push_str("== start\n-- gpus\n");
                }
                let _ = writeln!(self.transcript, "{}: {}", t.name, got.join(","));
            }
            self.place_task(&t.name, pid);
            self.start_pids.insert(t.name.clone(), pid);
        }
        // Threads settle after READY: wait until each task has its extra threads (and, for
        // CUDA tasks, the restore thread and the driver's internal threads) so that the freeze
        // sees a stable tree.
        let internal = self
            .s
            .world
            .as_ref()
            .and_then(|w| w.get("driver")?.get("internal_threads")?.as_integer())
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        for (i, t) in tasks.iter().enumerate() {
            let pid = self.pids[&t.name];
            let want = 1
                + t.threads as usize
                + usize::from(t.cuda) * (1 + internal)
                + usize::from(t.cuda && t.kernel_ms.is_some());
            let end = Instant::now() + Duration::from_secs(5);
            while thread_count(pid) < want && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = i;
        }
        self.refresh_tids();
        Ok(())
    }

    fn spawn_sleepers(&mut self) -> Result<(), String> {
        self.spawn_tree(&|_| "exec sleep 100000".to_owned())?;
        let deadline = Instant::now() + Duration::from_secs(5);
        let root = self.root_pid(deadline)?;
        loop {
            let mut pids = BTreeMap::new();
            if self.map_sleepers(0, root, &mut pids)
                && pids.len() == self.s.workload.tasks.len()
                && pids.values().all(|&p| comm(p) == "sleep")
            {
                for (n, p) in pids {
                    self.place_task(&n, p);
                    self.start_pids.insert(n, p);
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("workload did not start".to_owned());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn map_sleepers(&self, idx: usize, pid: i32, out: &mut BTreeMap<String, i32>) -> bool {
        out.insert(self.s.workload.tasks[idx].name.clone(), pid);
        let kids = self.children_of(idx);
        let pids = proc_children(pid);
        if pids.len() != kids.len() {
            return false;
        }
        // Children start in declaration order but may be reported in any; map by start time.
        let mut pids = pids;
        pids.sort_by_key(|&p| crate::pstree::start_time(p).unwrap_or(0));
        kids.into_iter()
            .zip(pids)
            .all(|(j, p)| self.map_sleepers(j, p, out))
    }

    fn add_task(&mut self, name: &str, pid: i32) {
        self.pids.insert(name.to_owned(), pid);
        self.names.insert(pid.to_string(), name.to_owned());
    }

    fn world_status(&self) -> Result<serde_json::Value, String> {
        let Some(w) = &self.world else {
            return Ok(serde_json::Value::Null);
        };
        let out = run_checked(
            Command::new(&self.art.mock_world)
                .arg("status")
                .arg(w)
                .arg("--json"),
            "mock-world status",
        )?;
        serde_json::from_str(&out).map_err(|e| format!("mock-world status --json: {e}"))
    }

    fn refresh_tids(&mut self) {
        let Ok(st) = self.world_status() else { return };
        for (name, pid) in self.pids.clone() {
            if let Some(tid) = st["processes"][pid.to_string()]["restore_tid"].as_i64() {
                self.tids.insert(name.clone(), tid as i32);
                self.names
                    .insert(tid.to_string(), format!("{name}.restore"));
            }
        }
    }

    /// A step the harness carries out itself: reconfigure the world, remove or rewrite an image.
    fn harness_step(&mut self, i: usize, step: &Step) -> Result<(), String> {
        let verb = crate::scenario::name(step.action);
        let mut detail = String::new();
        match step.action {
            Action::ReconfigureWorld => {
                let given = step.world.clone().unwrap_or_default();
                let mut t = self.s.world.clone().unwrap_or_default();
                for (k, v) in &given {
                    t.insert(k.clone(), v.clone());
                }
                let t = self.complete_world(t, true)?;
                self.configure_world(&self.dir.join(format!("world-step{i}.toml")), &t)?;
                detail.push_str("-- world\n");
                for (k, v) in &given {
                    match (k.as_str(), v) {
                        ("gpu", toml::Value::Array(gpus)) => {
                            for (n, g) in gpus.iter().enumerate() {
                                let f = |key: &str| {
                                    g.get(key)
                                        .map(|v| {
                                            v.as_str().map_or_else(|| v.to_string(), str::to_owned)
                                        })
                                        .unwrap_or_default()
                                };
                                let _ = writeln!(
                                    detail,
                                    "gpu {n}: {} {} ({}, {} MiB)",
                                    f("uuid"),
                                    f("name"),
                                    f("chip"),
                                    f("memory_mib")
                                );
                            }
                            if gpus.is_empty() {
                                detail.push_str("no GPU\n");
                            }
                        }
                        _ => {
                            let _ = writeln!(detail, "{k} = {v}");
                        }
                    }
                }
            }
            Action::Signal => {
                let task = step.task.as_deref().unwrap_or_default();
                let pid = *self
                    .pids
                    .get(task)
                    .ok_or_else(|| format!("step {i}: no task `{task}`"))?;
                let name = step.signal.as_deref().unwrap_or_default();
                let sig: nix::sys::signal::Signal = format!("SIG{name}")
                    .parse()
                    .map_err(|e| format!("step {i}: {name}: {e}"))?;
                nix::sys::signal::kill(Pid::from_raw(pid), sig)
                    .map_err(|e| format!("step {i}: kill {task}: {e}"))?;
                if sig == nix::sys::signal::Signal::SIGSTOP {
                    let end = Instant::now() + Duration::from_secs(5);
                    while state(pid) != 'T' && Instant::now() < end {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                let _ = writeln!(detail, "-- signal\nSIG{name} to {task}");
            }
            Action::SpecialImage => {
                let name = self.image_name(step.name.as_deref().unwrap_or_default());
                let path = self.dir.join("img").join(&name);
                let kind = step.kind.ok_or_else(|| format!("step {i}: no kind"))?;
                let _ = std::fs::remove_file(&path);
                let made = match kind {
                    crate::scenario::SpecialKind::Fifo => {
                        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
                            .map_err(std::io::Error::from)
                    }
                    crate::scenario::SpecialKind::DevZero => {
                        std::os::unix::fs::symlink("/dev/zero", &path)
                    }
                    crate::scenario::SpecialKind::Directory => std::fs::create_dir(&path),
                };
                made.map_err(|e| format!("step {i}: {}: {e}", path.display()))?;
                let _ = writeln!(detail, "-- image\n{} -> {kind:?}", self.normalise(&name));
            }
            Action::RemoveImage | Action::WriteImage => {
                let name = self.image_name(step.name.as_deref().unwrap_or_default());
                let bytes = step
                    .hex
                    .as_deref()
                    .map(crate::scenario::decode_hex)
                    .transpose()
                    .map_err(|e| format!("step {i}: hex: {e}"))?;
                let remove = step.action == Action::RemoveImage;
                let (before, after, streamed) = self.edit_image(&name, |old| {
                    if remove {
                        return match old {
                            Some(_) => Ok(None),
                            None => Err(format!("step {i}: there is no image `{name}` to remove")),
                        };
                    }
                    let mut data = old.unwrap_or_default();
                    match (step.offset, &bytes) {
                        (Some(at), Some(b)) => {
                            let at = usize::try_from(at).map_err(|e| e.to_string())?;
                            if data.len() < at + b.len() {
                                data.resize(at + b.len(), 0);
                            }
                            data[at..at + b.len()].copy_from_slice(b);
                        }
                        (None, Some(b)) => data.clone_from(b),
                        (_, None) => {}
                    }
                    if let Some(n) = step.truncate {
                        data.truncate(usize::try_from(n).map_err(|e| e.to_string())?);
                    }
                    Ok(Some(data))
                })?;
                // The plugin's task images and task list hold pids, which differ from run to
                // run: their sizes and bytes are left out.
                let per_task = step
                    .name
                    .as_deref()
                    .is_some_and(|n| n.contains('{') || n.starts_with("cuda-plugin-"));
                let size = |b: &Option<Vec<u8>>, gone: &str| match b {
                    None => gone.to_owned(),
                    Some(_) if per_task => "present".to_owned(),
                    Some(b) => format!("{} bytes", b.len()),
                };
                let _ = writeln!(
                    detail,
                    "-- image\n{}{}: {} -> {}",
                    self.normalise(&name),
                    if streamed { " (in the stream)" } else { "" },
                    size(&before, "absent"),
                    size(&after, "removed"),
                );
                if let (Some(b), false) = (&after, per_task) {
                    for chunk in b.chunks(32) {
                        let line: Vec<String> = chunk.iter().map(|x| format!("{x:02x}")).collect();
                        let _ = writeln!(detail, "{}", line.join(" "));
                    }
                }
            }
            _ => return Err(format!("step {i}: {verb} is not a harness-side step")),
        }
        let _ = writeln!(self.transcript, "== step {i}: {verb} -> ok");
        self.transcript.push_str(&detail);
        Ok(())
    }

    /// Applies `f` to image `name` (its bytes, `None` when absent; it returns the new bytes or
    /// `None` to delete): a file of the image directory, or an entry of the stream file when the
    /// dump was streamed. Returns the bytes before and after, and whether it was streamed.
    #[expect(
        clippy::type_complexity,
        reason = "the bytes before and after and whether the dump was streamed, named once here"
    )]
    fn edit_image(
        &self,
        name: &str,
        f: impl FnOnce(Option<Vec<u8>>) -> Result<Option<Vec<u8>>, String>,
    ) -> Result<(Option<Vec<u8>>, Option<Vec<u8>>, bool), String> {
        let img = self.dir.join("img");
        let stream = img.join(crate::images::STREAM_FILE);
        if stream.exists() {
            let raw = std::fs::read(&stream).map_err(|e| format!("{}: {e}", stream.display()))?;
            let mut files = crate::images::decode(&raw, &stream.display().to_string())
                .map_err(|e| e.to_string())?;
            let at = files.iter().position(|(n, _)| n == name);
            let before = at.map(|k| files[k].1.clone());
            let after = f(before.clone())?;
            match (at, &after) {
                (Some(k), Some(b)) => files[k].1.clone_from(b),
                (Some(k), None) => {
                    files.remove(k);
                }
                (None, Some(b)) => files.push((name.to_owned(), b.clone())),
                (None, None) => {}
            }
            std::fs::write(&stream, crate::images::encode(&files))
                .map_err(|e| format!("{}: {e}", stream.display()))?;
            return Ok((before, after, true));
        }
        let path = img.join(name);
        let before = std::fs::read(&path).ok();
        let after = f(before.clone())?;
        match &after {
            Some(b) => std::fs::write(&path, b),
            None => std::fs::remove_file(&path),
        }
        .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok((before, after, false))
    }

    /// `[host] memory_gib` of the scenario's world, if it models the host's memory.
    fn world_host_memory_gib(&self) -> Option<u64> {
        let t = self.s.world.as_ref()?.get("host")?.get("memory_gib")?;
        t.as_integer()
            .and_then(|g| u64::try_from(g).ok())
            .or_else(|| t.as_float().map(|f| f as u64))
    }

    /// The arguments a CRIU step adds for its `criu_timeout` and `action_script`.
    fn criu_step_args(&self, c: &mut Command, step: &Step) -> Result<(), String> {
        if let Some(t) = step.criu_timeout {
            c.arg("--timeout").arg(t.to_string());
        }
        if let Some(text) = &step.action_script {
            let path = self.dir.join("action-script.sh");
            std::fs::write(&path, format!("#!/bin/sh\n{text}\n"))
                .map_err(|e| format!("{}: {e}", path.display()))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("{}: {e}", path.display()))?;
            c.arg("--action-script").arg(&path);
        }
        Ok(())
    }

    /// An image step's file name, with every `{task}` replaced by that task's pid.
    fn image_name(&self, name: &str) -> String {
        let mut out = name.to_owned();
        for (task, pid) in &self.pids {
            out = out.replace(&format!("{{{task}}}"), &pid.to_string());
        }
        out
    }

    fn step(&mut self, i: usize, step: &Step, lib: &Path) -> Result<(), String> {
        if step.action.is_harness_side() {
            return self.harness_step(i, step);
        }
        let img = self.dir.join("img");
        let log = self.dir.join(format!("step{i}.log"));
        let trace = self.dir.join(format!("step{i}.trace"));
        let tp_log = self.dir.join(format!("step{i}.tp"));
        let root = self.pids[&self.s.workload.tasks[0].name];
        let options = self.put.options(self.s, &step.options);
        let verb = crate::scenario::name(step.action);
        let mut c;
        let label;
        let mut env_options = None;
        if step.action == Action::CudaCheckpoint {
            let task = step.task.as_deref().unwrap_or_default();
            c = Command::new(&self.art.cuda_checkpoint);
            c.args(&step.args)
                .arg("--pid")
                .arg(self.pids[task].to_string());
            label = "cuda-checkpoint";
        } else if let Some(criu) = self.criu.clone() {
            if step.action == Action::Restore {
                self.wait_tree_gone()?;
            }
            std::fs::create_dir_all(&img).map_err(|e| e.to_string())?;
            c = Command::new(&criu);
            c.arg(verb);
            if step.action != Action::Restore {
                c.arg("-t").arg(root.to_string());
            } else {
                c.arg("-d");
                // CRIU restores a mount namespace only onto a root it is given.
                if self.s.workload.has(Namespace::Mount) {
                    c.arg("--root").arg("/");
                }
                if self.s.workload.has(Namespace::Pid) {
                    c.arg("--pidfile")
                        .arg(self.dir.join(format!("step{i}.pid")));
                }
            }
            c.arg("-D")
                .arg(&img)
                .arg("-L")
                .arg(lib)
                .arg("-v4")
                .arg("-o")
                .arg(&log);
            if step.leave_running {
                c.arg("--leave-running");
            }
            self.criu_step_args(&mut c, step)?;
            if !options.is_empty() {
                env_options = Some(options.join(" "));
            }
            label = "criu";
        } else {
            c = Command::new(&self.art.harness);
            c.arg("--host").arg(&self.s.host.profile).arg(verb);
            c.arg("-D")
                .arg(&img)
                .arg("-L")
                .arg(lib)
                .arg("-v4")
                .arg("-o")
                .arg(&log);
            c.arg("--trace").arg(&trace);
            if let Some(r) = &self.s.host.rules {
                c.arg("--rules").arg(r);
            }
            if self.s.host.sentinel {
                c.arg("--device-sentinel");
            }
            if step.action != Action::Restore {
                c.arg("-t").arg(root.to_string());
            }
            if step.leave_running {
                c.arg("--leave-running");
            }
            if step.stream {
                c.arg("--stream");
            }
            self.criu_step_args(&mut c, step)?;
            let native = self
                .s
                .host
                .profile
                .parse::<crate::profile::HostProfile>()
                .is_ok_and(crate::profile::HostProfile::has_plugin_options);
            if native {
                for o in &options {
                    c.arg("--plugin-option").arg(o);
                }
            } else if !options.is_empty() {
                env_options = Some(options.join(" "));
            }
            label = "criu";
        }
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        // The plugin sizes the host by MemAvailable; it sees the world's modelled host instead
        // of this machine: `[host] memory_gib`, else a host of 1 TiB (the world's host memory
        // is unlimited by default), so that outcomes and snapshots do not depend on where the
        // corpus runs.
        c.env(
            "CRIU_CUDA_MEM_AVAILABLE_GIB",
            self.world_host_memory_gib().unwrap_or(1024).to_string(),
        );
        c.envs(&step.env);
        c.env("TP_LOG", &tp_log);
        c.env_remove("CRIU_LIBS_DIR").env_remove("CRIU_FAULT");
        match env_options {
            Some(o) => c.env("CRIU_PLUGIN_OPTIONS", o),
            None => c.env_remove("CRIU_PLUGIN_OPTIONS"),
        };
        for (k, v) in &self.put.enable {
            if self.s.host.force_enable {
                c.env(k, v);
            } else {
                c.env_remove(k);
            }
        }
        // The CUDA tasks already checkpointed before a dump (by the user, not by the dump).
        let before = if step.action == Action::Dump {
            self.checkpointed_tasks()?
        } else {
            Vec::new()
        };
        let started = Instant::now();
        let limit = step_limit(step);
        let (status, stdout, stderr) = run_bounded(&mut c, limit, |pid| {
            self.procs.insert(pid, label);
        })
        .map_err(|e| format!("step {i} ({verb}): {e}"))?;
        let status = status.ok_or_else(|| {
            format!(
                "step {i} ({verb}) did not finish within {} s\nkilled it and its process group \
                 (log: {})",
                limit.as_secs(),
                log.display()
            )
        })?;
        let took = started.elapsed();
        let got = if status.success() {
            Outcome::Ok
        } else {
            Outcome::Fail
        };
        // A pid namespace restored by a real CRIU: the tasks have new host pids.
        let restored_ns = step.action == Action::Restore
            && self.criu.is_some()
            && self.s.workload.has(Namespace::Pid);
        if restored_ns && got == Outcome::Ok {
            self.follow_restored_tree(&self.dir.join(format!("step{i}.pid")))?;
        }
        let log_text = std::fs::read_to_string(&log).unwrap_or_default();
        // The plugin's helper process runs its driver calls: name it in the driver's trace.
        // It outlives CRIU by design (it puts back the tasks of a CRIU that died, or that
        // resumed them checkpointed): the step ends when it has exited too.
        for pid in guardian_pids(&log_text) {
            self.procs.insert(pid, "guardian");
            wait_gone(pid, GUARDIAN_LIMIT)
                .map_err(|e| format!("step {i} ({verb}): the plugin's guardian {e}"))?;
        }
        // The engine's trace and the driver's trace of this step.
        let _ = writeln!(
            self.transcript,
            "== step {i}: {verb}{}{} -> {}",
            if step.leave_running {
                " --leave-running"
            } else {
                ""
            },
            step.task
                .as_deref()
                .map(|t| format!(" {} {t}", step.args.join(" ")))
                .unwrap_or_default(),
            if got == Outcome::Ok { "ok" } else { "failed" }
        );
        let driver = self.take_driver_trace();
        self.refresh_tids();
        let engine_trace = std::fs::read_to_string(&trace).unwrap_or_default();
        if !engine_trace.is_empty() {
            self.transcript.push_str("-- engine\n");
            for l in engine_trace.lines() {
                let _ = writeln!(self.transcript, "{}", self.normalise(l));
            }
        }
        if !driver.is_empty() {
            self.transcript.push_str("-- driver\n");
            for l in &driver {
                let _ = writeln!(self.transcript, "{l}");
            }
        }
        let plugin_lines: Vec<String> = log_text
            .lines()
            .filter_map(|l| l.find("cuda_plugin: ").map(|at| &l[at..]))
            .map(|l| self.normalise(l))
            .collect();
        if !plugin_lines.is_empty() {
            self.transcript.push_str("-- plugin log\n");
            for l in &plugin_lines {
                let _ = writeln!(self.transcript, "{l}");
            }
        }
        let tp = std::fs::read_to_string(&tp_log).unwrap_or_default();
        if !tp.is_empty() {
            self.transcript.push_str("-- test plugins\n");
            for l in tp.lines() {
                let _ = writeln!(self.transcript, "{}", self.normalise(l));
            }
        }
        if step.action == Action::CudaCheckpoint {
            let _ = writeln!(
                self.transcript,
                "-- output\n{}",
                self.normalise(stdout.trim_end())
            );
        }
        let backend = plugin_lines.iter().find_map(|l| {
            let rest = l.strip_prefix("cuda_plugin: backend ")?;
            Some(rest.split_whitespace().next()?.to_owned())
        });
        if let Some(b) = &backend {
            self.backends.push(b.clone());
        }
        let context = || {
            format!(
                "\n--- stderr:\n{stderr}\n--- log ({}):\n{log_text}",
                log.display()
            )
        };
        if let Some(w) = step.within {
            if took.as_secs_f64() > w {
                return Err(format!(
                    "step {i} ({verb}) took more than the {w} s it must end within\n\
                     it took {:.2} s{}",
                    took.as_secs_f64(),
                    context()
                ));
            }
        }
        if got != step.outcome() {
            let shown = |o: Outcome| if o == Outcome::Ok { "ok" } else { "failed" };
            return Err(format!(
                "step {i} ({verb}): expected {}, got {}\n({status}, {:.1} s){}",
                shown(step.outcome()),
                shown(got),
                took.as_secs_f64(),
                context()
            ));
        }
        if step.action == Action::Dump && got == Outcome::Ok && !step.leave_running {
            self.check_inventory(i, verb, &before)?;
        }
        if !self.put.ours {
            // The log lines and the backend line are this project's plugin's.
            return Ok(());
        }
        if let Some(e) = &step.error {
            let hay = format!("{log_text}{stderr}{stdout}");
            if !hay.contains(e.as_str()) {
                return Err(format!("step {i} ({verb}): log lacks `{e}`{}", context()));
            }
        }
        for want in &step.log {
            if !log_text.contains(want.as_str()) && !stderr.contains(want.as_str()) {
                return Err(format!(
                    "step {i} ({verb}): log lacks `{want}`{}",
                    context()
                ));
            }
        }
        if let Some(want) = &step.backend {
            let got = backend.as_deref().unwrap_or("none");
            if got != want {
                return Err(format!(
                    "step {i} ({verb}): backend {got}, expected {want}{}",
                    context()
                ));
            }
        }
        Ok(())
    }

    /// The CUDA tasks of the workload whose CUDA state is checkpointed now, by name.
    fn checkpointed_tasks(&self) -> Result<Vec<String>, String> {
        if self.world.is_none() {
            return Ok(Vec::new());
        }
        let st = self.world_status()?;
        Ok(self
            .s
            .workload
            .tasks
            .iter()
            .filter(|t| t.cuda)
            .filter(|t| {
                self.pids.get(&t.name).is_some_and(|pid| {
                    cuda_state_name(&st["processes"][pid.to_string()]) == "checkpointed"
                })
            })
            .map(|t| t.name.clone())
            .collect())
    }

    /// After a dump that checkpointed a CUDA task (one not checkpointed before it, `before`;
    /// a tree the user checkpointed may be dumped without the plugin): the image requires the CUDA plugin by
    /// its inventory name (so a restore without it fails instead of releasing tasks without
    /// their GPU state). Read from the harness's `inventory.json`, or found in CRIU's
    /// `inventory.img`; nothing to check without either, or with an image of the older format
    /// (no plugin list).
    fn check_inventory(&self, i: usize, verb: &str, before: &[String]) -> Result<(), String> {
        let checkpointed = self
            .checkpointed_tasks()?
            .iter()
            .any(|t| !before.contains(t));
        if !checkpointed {
            return Ok(());
        }
        let img = self.dir.join("img");
        let name = &self.put.name;
        let listed =
            if let Ok(text) = std::fs::read_to_string(img.join(crate::inventory::FILE_NAME)) {
                let v: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| format!("step {i} ({verb}): inventory.json: {e}"))?;
                match v["plugins"].as_array() {
                    None => return Ok(()),
                    Some(list) => list.iter().any(|p| p.as_str() == Some(name.as_str())),
                }
            } else if let Ok(raw) = std::fs::read(img.join("inventory.img")) {
                raw.windows(name.len()).any(|w| w == name.as_bytes())
            } else {
                return Ok(());
            };
        if listed {
            Ok(())
        } else {
            Err(format!(
                "step {i} ({verb}): the image holds GPU state but does not require plugin {name}\n\
                 a restore without the plugin would release the tasks without their GPU state"
            ))
        }
    }

    /// New lines of the world's trace, without the workload's own calls, normalised.
    fn take_driver_trace(&mut self) -> Vec<String> {
        let Some(w) = &self.world else {
            return Vec::new();
        };
        let text = std::fs::read_to_string(w.join("trace.log")).unwrap_or_default();
        let new = text.get(self.trace_offset..).unwrap_or("").to_owned();
        self.trace_offset = text.len();
        let tasks: BTreeSet<i32> = self.pids.values().copied().collect();
        // Calls made by others than the workload's tasks, as (caller, call). A caller in
        // another pid namespace than the world's host is `<nspid>@pid:[<inode>]`: a task when
        // the runner knows it, else someone else (-1).
        let calls: Vec<(i32, &str)> = new
            .lines()
            .filter_map(|l| {
                let (caller, call) = l.split_once(' ')?;
                match caller.parse::<i32>() {
                    Ok(pid) => Some((pid, call)),
                    Err(_) => {
                        let (nspid, ns) = caller.split_once("@pid:[")?;
                        let key = (ns.strip_suffix(']')?.parse().ok()?, nspid.parse().ok()?);
                        let task = self.ns_names.get(&key).and_then(|n| self.pids.get(n));
                        Some((task.copied().unwrap_or(-1), call))
                    }
                }
            })
            .filter(|(caller, _)| !tasks.contains(caller))
            .collect();
        // A process is a `cuda-checkpoint` run if any of its lines says so, also its earlier ones.
        for (caller, call) in &calls {
            if call.starts_with("cuda-checkpoint(") {
                self.cli_pids.insert(*caller);
            }
        }
        let lines: Vec<(i32, String)> = calls
            .iter()
            .map(|(pid, call)| {
                let who = match self.procs.get(pid) {
                    Some(l) => *l,
                    None if self.cli_pids.contains(pid) => "cuda-checkpoint",
                    None => "other",
                };
                (*pid, format!("{who} {}", self.normalise(call)))
            })
            .collect();
        if self.parallel_mode() {
            order_concurrent(lines, &self.cli_pids)
        } else {
            lines.into_iter().map(|(_, l)| l).collect()
        }
    }

    /// Whether the scenario runs the plugin's parallel mode (`cuda_plugin.parallel=` other
    /// than 1), whose concurrent driver calls and `cuda-checkpoint` runs land in the trace in
    /// any order (see [`order_concurrent`]).
    fn parallel_mode(&self) -> bool {
        self.s.options.iter().any(|o| {
            o.trim_start_matches('-')
                .strip_prefix("cuda_plugin.parallel=")
                .is_some_and(|v| v != "1")
        })
    }

    /// Pids and tids to task names, paths and durations removed.
    fn normalise(&self, line: &str) -> String {
        let mut s = line.to_owned();
        for (path, label) in [
            (self.dir.display().to_string(), "<tmp>"),
            (self.art.workspace.display().to_string(), "<workspace>"),
        ] {
            if !path.is_empty() {
                s = s.replace(&path, label);
            }
        }
        for p in [
            &self.art.cuda_checkpoint,
            &self.art.plugin,
            &self.art.mock_lib,
        ] {
            if let Some(parent) = p.parent() {
                s = s.replace(&parent.display().to_string(), "<target>");
            }
        }
        let chars: Vec<char> = s.chars().collect();
        let mut out = String::with_capacity(s.len());
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if !c.is_ascii_digit() {
                out.push(c);
                i += 1;
                continue;
            }
            let mut j = i;
            while j < chars.len() && chars[j].is_ascii_digit() {
                j += 1;
            }
            let mut k = j;
            // A decimal with a time unit: a duration.
            if k + 1 < chars.len() && chars[k] == '.' && chars[k + 1].is_ascii_digit() {
                k += 1;
                while k < chars.len() && chars[k].is_ascii_digit() {
                    k += 1;
                }
            }
            let rest: String = chars[k..].iter().take(4).collect();
            let unit = ["ms", " ms", "s", " s", "µs", " µs"].iter().find(|u| {
                rest.starts_with(*u)
                    && !rest[u.len()..]
                        .chars()
                        .next()
                        .is_some_and(char::is_alphanumeric)
            });
            let num: String = chars[i..j].iter().collect();
            let prev = i.checked_sub(1).map(|p| chars[p]);
            // Part of a word, a version or a UUID; `cuda-plugin-<pid>.img` is a pid.
            let hyphen_after_hex = prev == Some('-') && i >= 2 && chars[i - 2].is_ascii_hexdigit();
            // The integer part of a decimal (`1024.0 GiB`) is never a pid either.
            let decimal =
                chars.get(j) == Some(&'.') && chars.get(j + 1).is_some_and(char::is_ascii_digit);
            let glued = prev.is_some_and(|p| p.is_alphanumeric() || p == '.')
                || hyphen_after_hex
                || decimal
                || chars
                    .get(j)
                    .is_some_and(|n| n.is_alphanumeric() || *n == '-');
            let before: String = chars[..i]
                .iter()
                .rev()
                .take(16)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let lock_timeout = before.ends_with("timeoutMs=") || before.ends_with("--timeout ");
            // Values that are never pids, whatever pid the number happens to equal (pids wrap
            // at 32768 here: a version, a size or a status can be some step's pid).
            let after: String = chars[k..].iter().take(9).collect();
            let value = never_a_pid(&before, &after);
            if k > j && unit.is_some() {
                out.push_str("N.N");
                i = k;
            } else if k == j && (unit == Some(&" ms") || unit == Some(&"ms")) {
                // Whole milliseconds (what is left of CRIU's freeze alarm, say): timing.
                out.push('N');
                i = j;
            } else if let (true, None | Some(&"ms" | &" ms"), Ok(ms)) =
                (lock_timeout, unit, num.parse::<u64>())
            {
                // A lock timeout the freeze alarm shortened depends on timing (how long the
                // freeze and the earlier locks took): keep the configured ones, name the rest.
                if self.lock_timeouts.contains(&ms) {
                    out.push_str(&num);
                } else {
                    out.push_str("<alarm>");
                }
                i = j;
            } else if value {
                out.push_str(&chars[i..k].iter().collect::<String>());
                i = k;
            } else if let (false, Some(name)) = (glued, self.names.get(&num)) {
                out.push_str(name);
                i = j;
            } else if !glued && self.cli_pids.contains(&num.parse().unwrap_or(-1)) {
                out.push_str("cuda-checkpoint");
                i = j;
            } else if let (false, Some(label)) = (glued, self.procs.get(&num.parse().unwrap_or(-1)))
            {
                out.push_str(label);
                i = j;
            } else {
                out.push_str(&chars[i..k].iter().collect::<String>());
                i = k;
            }
        }
        out
    }

    fn wait_tree_gone(&mut self) -> Result<(), String> {
        let pids: Vec<i32> = self.pids.values().copied().collect();
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            for &p in &pids {
                let _ = waitpid(Pid::from_raw(p), Some(WaitPidFlag::WNOHANG));
            }
            if let Some(c) = self.root_child.as_mut() {
                let _ = c.try_wait();
            }
            if pids
                .iter()
                .all(|p| !Path::new(&format!("/proc/{p}")).exists())
            {
                return Ok(());
            }
            if Instant::now() > end {
                return Err("the dumped tree did not go away before the restore".to_owned());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn check_end(&mut self) -> Result<(), String> {
        let s = self.s;
        let alive: Vec<(String, i32)> = self
            .pids
            .iter()
            .filter(|(n, _)| !s.expect.dead.contains(n))
            .map(|(n, p)| (n.clone(), *p))
            .collect();
        let end = Instant::now() + Duration::from_secs(3);
        for (name, pid) in &alive {
            let good = || match s.expect.tasks {
                TaskState::Running => crate::pstree::running_untraced(*pid).is_ok(),
                TaskState::Parked => parked(*pid),
                TaskState::Gone => {
                    !Path::new(&format!("/proc/{pid}")).exists() || comm(*pid).is_empty()
                }
            };
            while !good() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
            if !good() {
                let detail = crate::pstree::running_untraced(*pid)
                    .err()
                    .unwrap_or_default();
                let is = if !Path::new(&format!("/proc/{pid}")).exists() || state(*pid) == 'Z' {
                    "gone"
                } else if detail.contains("TracerPid") && !detail.ends_with("TracerPid 0") {
                    "traced"
                } else if parked(*pid) || !detail.is_empty() {
                    "stopped"
                } else {
                    "running"
                };
                return Err(format!(
                    "task {name} is {is}, expected {}\n({pid}) {detail}",
                    match s.expect.tasks {
                        TaskState::Running => "running",
                        TaskState::Parked => "parked",
                        TaskState::Gone => "gone",
                    }
                ));
            }
        }
        for name in &s.expect.dead {
            let pid = self.pids[name];
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
            if crate::pstree::start_time(pid).is_some()
                && !comm(pid).is_empty()
                && state(pid) != 'Z'
            {
                return Err(format!("task {name} should have died\n(pid {pid})"));
            }
        }
        if !s.expect.cuda_state.is_empty() {
            let st = self.world_status()?;
            for (name, want) in &s.expect.cuda_state {
                let pid = self.pids[name];
                let e = &st["processes"][pid.to_string()];
                let got = cuda_state_name(e);
                if got != want {
                    return Err(format!(
                        "task {name}: CUDA state {got}, expected {want}\n{}",
                        self.transcript
                    ));
                }
            }
        }
        if s.expect.tasks == TaskState::Running && self.world.is_some() {
            // Nothing left locked: a running CUDA task whose state the scenario does not pin is
            // running in the world too (or not a CUDA process at all).
            let st = self.world_status()?;
            for t in s.workload.tasks.iter().filter(|t| t.cuda) {
                if s.expect.cuda_state.contains_key(&t.name) || s.expect.dead.contains(&t.name) {
                    continue;
                }
                let pid = self.pids[&t.name];
                let got = cuda_state_name(&st["processes"][pid.to_string()]);
                if !["running", "none"].contains(&got) {
                    return Err(format!(
                        "task {}: CUDA state {got}, expected running (nothing may be left {got})\n{}",
                        t.name, self.transcript
                    ));
                }
            }
        }
        if s.expect.gpu_data_verified.is_some() || !s.expect.gpus.is_empty() {
            let verdicts = self.verify_data(&alive)?;
            if let Some(want) = s.expect.gpu_data_verified {
                let all_pass = verdicts.iter().all(|(_, v)| v.starts_with("PASS"));
                if all_pass != want {
                    let bad: Vec<String> = verdicts
                        .iter()
                        .filter(|(_, v)| !v.starts_with("PASS"))
                        .map(|(n, v)| {
                            let v = v.split_once("reason=").map_or(v.as_str(), |(_, r)| r);
                            format!("{n}: {v}")
                        })
                        .collect();
                    return Err(format!(
                        "GPU data check: {}\n{verdicts:?}",
                        if want {
                            bad.join("; ")
                        } else {
                            "every task passed".to_owned()
                        }
                    ));
                }
            }
            if !s.expect.gpus.is_empty() {
                self.transcript.push_str("== end\n-- gpus\n");
            }
            for (name, want) in &s.expect.gpus {
                let line = verdicts
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, l)| l.as_str())
                    .unwrap_or("not running");
                let got: Vec<&str> = match (line.starts_with("PASS"), field(line, "gpus")) {
                    (true, Some(g)) => g.split(',').filter(|u| !u.is_empty()).collect(),
                    _ => {
                        let why = line.split_once("reason=").map_or(line, |(_, r)| r);
                        return Err(format!(
                            "task {name}: no PASS line with GPUs: {why}\n{line}"
                        ));
                    }
                };
                let _ = writeln!(self.transcript, "{name}: {}", got.join(","));
                if got != *want {
                    return Err(format!(
                        "task {name}: on GPUs {got:?}, expected {want:?}\n{}",
                        self.transcript
                    ));
                }
            }
        }
        if let Some(want) = s.expect.host_pids {
            self.check_host_pids(want)?;
        }
        self.check_leftovers()
    }

    /// `expect.host_pids`: each task's host pid now against the one it started with, and its
    /// namespace pid now against the one it had (a restore keeps namespace pids).
    fn check_host_pids(&mut self, want: HostPids) -> Result<(), String> {
        if self.s.expect.gpus.is_empty() {
            self.transcript.push_str("== end\n");
        }
        self.transcript.push_str("-- pids\n");
        for t in &self.s.workload.tasks {
            if self.s.expect.dead.contains(&t.name) {
                continue;
            }
            let (start, now) = (self.start_pids[&t.name], self.pids[&t.name]);
            let nspid_now = identity_of(now).map(|i| i.pid);
            let same_ns = nspid_now == self.nspids.get(&t.name).copied();
            let line = format!(
                "{}: {} host pid, {} namespace pid",
                t.name,
                if start == now { "same" } else { "new" },
                if same_ns { "same" } else { "other" }
            );
            let _ = writeln!(self.transcript, "{line}");
            let ok = match want {
                HostPids::Changed => start != now && same_ns,
                HostPids::Kept => start == now,
            };
            if !ok {
                return Err(format!(
                    "expect.host_pids = {want:?}: task {} started as host pid {start}, is {now} \
                     now (namespace pid {nspid_now:?}, was {:?})",
                    t.name,
                    self.nspids.get(&t.name)
                ));
            }
        }
        Ok(())
    }

    /// SIGUSR1 to every task; each appends PASS or FAIL to its report.
    fn verify_data(&self, tasks: &[(String, i32)]) -> Result<Vec<(String, String)>, String> {
        let index = |name: &str| {
            self.s
                .workload
                .tasks
                .iter()
                .position(|t| t.name == name)
                .ok_or_else(|| format!("no task {name} in the workload"))
        };
        let by_index = tasks
            .iter()
            .map(|(name, pid)| Ok((index(name)?, *pid)))
            .collect::<Result<Vec<_>, String>>()?;
        let verdicts = verify_data(&self.dir, &by_index);
        Ok(tasks
            .iter()
            .map(|(name, _)| name.clone())
            .zip(verdicts)
            .collect())
    }

    /// Processes of this world other than the workload (a `cuda-checkpoint` left behind).
    fn check_leftovers(&self) -> Result<(), String> {
        let Some(w) = &self.world else {
            return Ok(());
        };
        let mut ours: BTreeSet<i32> = self.pids.values().copied().collect();
        // The `unshare` that waits for a tree in its own pid namespace.
        ours.extend(self.root_child.as_ref().map(|c| c.id() as i32));
        let extra: Vec<i32> = world_processes(w)
            .into_iter()
            .filter(|pid| !ours.contains(pid))
            .collect();
        if extra.is_empty() {
            return Ok(());
        }
        let names: BTreeSet<String> = extra.iter().map(|&p| comm(p)).collect();
        let pids: Vec<String> = extra
            .iter()
            .map(|p| format!("{p} ({})", comm(*p)))
            .collect();
        Err(format!(
            "processes left behind: {}\n{}",
            names.into_iter().collect::<Vec<_>>().join(", "),
            pids.join(", ")
        ))
    }

    fn cleanup(&mut self) {
        let mut victims: Vec<i32> = self.pids.values().copied().collect();
        let old: Vec<i32> = self
            .start_pids
            .values()
            .copied()
            .filter(|p| !victims.contains(p))
            .collect();
        victims.extend(old);
        if let Some(w) = &self.world {
            victims.extend(world_processes(w));
        }
        kill_and_reap(&victims, self.root_child.take());
    }
}

/// Whether a number between `before` and `after` (the text around it) is a value that is never
/// a pid: a driver version, a size, an exit status, a hook count.
fn never_a_pid(before: &str, after: &str) -> bool {
    [
        "libcuda.so.1 ",
        "version ",
        "status ",
        "exit=",
        "exceeds ",
        "FAULT=",
        "max_hooks ",
    ]
    .iter()
    .any(|p| before.ends_with(p))
        || [" bytes", " MiB", " hooks", " or later", " time(s)"]
            .iter()
            .any(|x| after.starts_with(x))
}

/// The lock timeouts (ms) a scenario configures: `cuda_plugin.timeout=S` options, CRIU's
/// `--timeout` (the plugin's default, 10 s unless a step sets it) and `--timeout MS` arguments
/// of `cuda-checkpoint` steps.
fn known_lock_timeouts(s: &Scenario) -> BTreeSet<u64> {
    let mut out = BTreeSet::from([0, 10_000]);
    let opts = s
        .options
        .iter()
        .chain(s.steps.iter().flat_map(|st| &st.options));
    for o in opts {
        if let Some(v) = o.strip_prefix("cuda_plugin.timeout=") {
            if let Ok(secs) = v.parse::<u64>() {
                out.insert(secs * 1000);
            }
        }
    }
    for st in &s.steps {
        if let Some(t) = st.criu_timeout {
            out.insert(u64::from(t) * 1000);
        }
        for w in st.args.windows(2) {
            if w[0] == "--timeout" {
                if let Ok(ms) = w[1].parse::<u64>() {
                    out.insert(ms);
                }
            }
        }
    }
    out
}

/// How long a step may run before the watchdog kills it: 120 s, or twice its `within` plus
/// 10 s. A step past its `within` has failed already; the margin only tells "took too long"
/// from "hung" (a plugin without a timeout of its own hangs for ever: the kit's hung-call
/// scenarios run every plugin into that).
fn step_limit(step: &Step) -> Duration {
    step.within.map_or(Duration::from_secs(120), |w| {
        Duration::from_secs_f64(w * 2.0 + 10.0)
    })
}

/// Runs `c` in its own process group with its output captured, for at most `limit`: on
/// expiry the whole group is killed and the status is `None`. `on_spawn` learns the pid.
fn run_bounded(
    c: &mut Command,
    limit: Duration,
    on_spawn: impl FnOnce(i32),
) -> Result<(Option<std::process::ExitStatus>, String, String), String> {
    use std::os::unix::process::CommandExt;
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = c.spawn().map_err(|e| format!("spawn: {e}"))?;
    let pid = child.id() as i32;
    on_spawn(pid);
    let reader = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let out = reader(child.stdout.take().map(|o| Box::new(o) as _));
    let err = reader(child.stderr.take().map(|e| Box::new(e) as _));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(st);
        }
        if start.elapsed() >= limit {
            let _ = nix::sys::signal::killpg(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // A process the step left behind may hold the pipes: do not wait for it.
    let collect = |h: std::thread::JoinHandle<String>| {
        let t = Instant::now();
        while !h.is_finished() && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if h.is_finished() {
            h.join().unwrap_or_default()
        } else {
            String::new()
        }
    };
    Ok((status, collect(out), collect(err)))
}

fn proc_children(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// Every `*.toml` under `dir`, sorted, with its name: the path relative to `dir` without the
/// extension.
#[must_use]
pub fn collect(dir: &Path) -> Vec<(String, PathBuf)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "toml") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    if dir.is_file() {
        files.push(dir.to_path_buf());
    } else {
        walk(dir, &mut files);
    }
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p
                .strip_prefix(dir)
                .ok()
                .filter(|r| !r.as_os_str().is_empty())
                .unwrap_or(&p)
                .with_extension("")
                .display()
                .to_string();
            (name, p)
        })
        .collect()
}

/// The snapshot file name of scenario `name` (`cuda/x` -> `cuda__x.snap`).
#[must_use]
pub fn snapshot_name(name: &str) -> String {
    name.replace('/', "__")
}

/// The body of an insta `.snap` file (after its `---` header), if it exists.
#[must_use]
pub fn read_snapshot(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let rest = text.strip_prefix("---\n")?;
    let at = rest.find("\n---\n")?;
    Some(rest[at + 5..].to_owned())
}

/// One row of the `harness run` table.
#[derive(Debug, Clone)]
pub struct Row {
    /// Scenario name.
    pub name: String,
    /// Its report (`None` when the file did not parse: then `error`).
    pub report: Option<Report>,
    /// Parse error or snapshot mismatch.
    pub error: Option<String>,
}

impl Row {
    /// The row's result in one line that is the same on every run: `pass`, `fail: WHY`,
    /// `n.a.: WHY`, `xfail: WHY` or `skip: WHY`.
    #[must_use]
    pub fn result(&self) -> String {
        match (&self.error, self.report.as_ref().map(|r| &r.verdict)) {
            (Some(e), None) => format!("fail: {}", first_line(e)),
            (Some(_), Some(_)) => "fail: the transcript differs from its snapshot".to_owned(),
            (None, Some(Verdict::Pass)) => "pass".to_owned(),
            (None, Some(Verdict::Fail(e))) => format!("fail: {}", first_line(e)),
            (None, Some(Verdict::Skip(why))) => format!("skip: {why}"),
            (None, Some(Verdict::XFail(why))) => format!("xfail: {}", first_line(why)),
            (None, Some(Verdict::NotApplicable(why))) => format!("n.a.: {why}"),
            (None, None) => "fail".to_owned(),
        }
    }

    /// Whether it counts as a failure.
    #[must_use]
    pub fn failed(&self) -> bool {
        self.error.is_some()
            || matches!(
                self.report.as_ref().map(|r| &r.verdict),
                None | Some(Verdict::Fail(_))
            )
    }
}

/// How [`run_corpus`] runs.
#[derive(Debug, Clone)]
pub struct CorpusOptions {
    /// Scenarios run at a time.
    pub jobs: usize,
    /// Per-run options.
    pub run: RunOptions,
    /// The CUDA plugin under test.
    pub plugin: PluginUnderTest,
    /// Print one line per scenario as it ends.
    pub print_rows: bool,
}

/// Runs every scenario under `paths`, `opts.jobs` at a time, checking transcripts against the
/// snapshots in `<scenarios>/snapshots/` where one exists and the run is the scenario's own with
/// this project's plugin. Returns the rows in file order and the wall time.
#[must_use]
pub fn run_rows(paths: &[PathBuf], art: &Artifacts, opts: &CorpusOptions) -> (Vec<Row>, Duration) {
    use std::sync::{Arc, Mutex};
    let mut work: Vec<(String, PathBuf, PathBuf)> = Vec::new();
    for root in paths {
        let base = if root.is_file() {
            root.parent().unwrap_or(Path::new(".")).to_path_buf()
        } else {
            root.clone()
        };
        let corpus = find_corpus_root(&base);
        for (_, p) in collect(root) {
            let p = std::fs::canonicalize(&p).unwrap_or(p);
            let name = p
                .strip_prefix(&corpus)
                .unwrap_or(&p)
                .with_extension("")
                .display()
                .to_string();
            work.push((name, p, corpus.join("snapshots")));
        }
    }
    let mut work: Vec<_> = work.into_iter().enumerate().collect();
    work.reverse();
    let queue = Arc::new(Mutex::new(work));
    let rows: Arc<Mutex<Vec<(usize, Row)>>> = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    if opts.print_rows {
        println!(
            "{:<64} {:<16} {:<16} {:<7} {:>7}",
            "scenario", "host", "backend", "result", "time"
        );
    }
    std::thread::scope(|sc| {
        for _ in 0..opts.jobs.max(1) {
            let queue = Arc::clone(&queue);
            let rows = Arc::clone(&rows);
            sc.spawn(move || loop {
                let next = queue.lock().map(|mut q| q.pop()).ok().flatten();
                let Some((idx, (name, path, snaps))) = next else {
                    break;
                };
                let row = run_one(&name, &path, &snaps, art, opts);
                if opts.print_rows {
                    print_row(&row);
                }
                if let Ok(mut r) = rows.lock() {
                    r.push((idx, row));
                }
            });
        }
    });
    let mut rows = Arc::try_unwrap(rows)
        .map(|m| m.into_inner().unwrap_or_default())
        .unwrap_or_default();
    rows.sort_by_key(|(i, _)| *i);
    (
        rows.into_iter().map(|(_, r)| r).collect(),
        started.elapsed(),
    )
}

/// Runs every scenario under `paths` (see [`run_rows`]) and prints the table and the summary
/// to stdout (details of failures to stderr). Returns the rows and whether nothing failed.
#[must_use]
pub fn run_corpus(paths: &[PathBuf], art: &Artifacts, opts: &CorpusOptions) -> (Vec<Row>, bool) {
    let (rows, took) = run_rows(paths, art, opts);
    let (mut pass, mut fail, mut skip, mut xfail, mut na) = (0, 0, 0, 0, 0);
    for r in &rows {
        if r.failed() {
            fail += 1;
            let why =
                r.error
                    .clone()
                    .unwrap_or_else(|| match r.report.as_ref().map(|x| &x.verdict) {
                        Some(Verdict::Fail(e)) => e.clone(),
                        _ => String::new(),
                    });
            eprintln!("\n==== FAILED {}\n{why}", r.name);
            continue;
        }
        match r.report.as_ref().map(|x| &x.verdict) {
            Some(Verdict::Pass) => pass += 1,
            Some(Verdict::Skip(_)) => skip += 1,
            Some(Verdict::XFail(_)) => xfail += 1,
            Some(Verdict::NotApplicable(_)) => na += 1,
            Some(Verdict::Fail(_)) | None => {}
        }
    }
    let extra = |n: usize, what: &str| {
        if n > 0 {
            format!(", {n} {what}")
        } else {
            String::new()
        }
    };
    println!(
        "\n{pass} passed, {fail} failed, {skip} skipped{}{} ({} scenarios in {:.1} s, plugin {})",
        extra(xfail, "xfail"),
        extra(na, "not applicable"),
        rows.len(),
        took.as_secs_f64(),
        opts.plugin.label
    );
    (rows, fail == 0)
}

/// The directory holding `snapshots/` for scenarios under `dir`: the nearest ancestor named
/// `scenarios`, else `dir`.
fn find_corpus_root(dir: &Path) -> PathBuf {
    let abs = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    abs.ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "scenarios"))
        .map_or(abs.clone(), Path::to_path_buf)
}

fn run_one(name: &str, path: &Path, snaps: &Path, art: &Artifacts, opts: &CorpusOptions) -> Row {
    let s = match Scenario::load(path) {
        Ok(s) => s,
        Err(e) => {
            return Row {
                name: name.to_owned(),
                report: None,
                error: Some(e.to_string()),
            }
        }
    };
    let report = run_with(&s, art, opts.run, &opts.plugin);
    let mut error = None;
    if report.verdict == Verdict::Pass && report.snapshot_applies {
        let snap = snaps.join(format!("{}.snap", snapshot_name(name)));
        if let Some(want) = read_snapshot(&snap) {
            if want.trim_end() != report.transcript.trim_end() {
                error = Some(format!(
                    "transcript differs from {} (run `cargo insta test -p harness --test scenarios` to review)\n{}",
                    snap.display(),
                    report.transcript
                ));
            }
        }
    }
    Row {
        name: name.to_owned(),
        report: Some(report),
        error,
    }
}

fn print_row(r: &Row) {
    let (host, backend, time) = match &r.report {
        None => ("-".to_owned(), "-".to_owned(), 0.0),
        Some(rep) => (
            rep.host.clone(),
            rep.backend.clone(),
            rep.elapsed.as_secs_f64(),
        ),
    };
    let result = match (&r.report, &r.error) {
        (None, _) => "fail (parse)".to_owned(),
        (Some(_), Some(_)) => "fail (snapshot)".to_owned(),
        (Some(_), None) => r.result(),
    };
    println!(
        "{:<64} {host:<16} {backend:<16} {result:<7} {time:>6.1}s",
        r.name
    );
}

/// Puts a parallel-mode driver trace in an order that does not depend on scheduling. Each
/// `cuda-checkpoint` run's lines (`cli` names those processes; an unnamed `other` caller is
/// taken for a run that never finished) become one block, placed where its first line was;
/// any other line is a block of its own. Then every run of consecutive
/// blocks of one kind (the utility's action, or the called function, with the caller) is
/// sorted by its text: calls that ran side by side are listed by task name, while the order
/// of the batch's phases (all checkpoints, then the rollback; all restores, then all unlocks)
/// is kept.
fn order_concurrent(lines: Vec<(i32, String)>, cli: &BTreeSet<i32>) -> Vec<String> {
    let mut blocks: Vec<Vec<String>> = Vec::new();
    let mut at: BTreeMap<i32, usize> = BTreeMap::new();
    for (pid, line) in lines {
        // A utility run that never got to its own line is not known as one: `other`.
        if cli.contains(&pid) || line.starts_with("other ") {
            if let Some(&b) = at.get(&pid) {
                blocks[b].push(line);
                continue;
            }
            at.insert(pid, blocks.len());
        }
        blocks.push(vec![line]);
    }
    // A utility run without its closing `cuda-checkpoint(...)` line (killed on timeout, or
    // its target killed) has no kind of its own: it belongs with its neighbours.
    let kind_of = |b: &[String]| -> Option<String> {
        let head = match b.iter().find(|l| l.contains(" cuda-checkpoint(")) {
            Some(h) => h,
            None if b.len() > 1
                || b[0].starts_with("cuda-checkpoint ")
                || b[0].starts_with("other ") =>
            {
                return None
            }
            None => &b[0],
        };
        let (who, call) = head.split_once(' ').unwrap_or((head, ""));
        let what = match call.strip_prefix("cuda-checkpoint(") {
            Some(args) => args
                .split_whitespace()
                .take_while(|a| *a != "--pid")
                .collect::<Vec<_>>()
                .join(" "),
            None => call.split('(').next().unwrap_or(call).to_owned(),
        };
        Some(format!("{who} {what}"))
    };
    let mut kinds: Vec<Option<String>> = blocks.iter().map(|b| kind_of(b)).collect();
    for i in 1..kinds.len() {
        if kinds[i].is_none() {
            kinds[i] = kinds[i - 1].clone();
        }
    }
    for i in (0..kinds.len().saturating_sub(1)).rev() {
        if kinds[i].is_none() {
            kinds[i] = kinds[i + 1].clone();
        }
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < blocks.len() {
        let k = &kinds[i];
        let mut j = i + 1;
        while j < blocks.len() && kinds[j] == *k {
            j += 1;
        }
        let mut run: Vec<Vec<String>> = blocks[i..j].to_vec();
        run.sort();
        out.extend(run.into_iter().flatten());
        i = j;
    }
    out
}

/// How long the plugin's guardian may outlive the CRIU run that started it: its own bound on
/// watching CRIU (60 s) and on putting a task back, with room to spare.
const GUARDIAN_LIMIT: Duration = Duration::from_secs(90);

/// The pids of the plugin's guardian helpers a CRIU log names (the plugin logs
/// `helper process PID started` when it starts one).
pub(crate) fn guardian_pids(log: &str) -> Vec<i32> {
    log.lines()
        .filter_map(|l| l.split("helper process ").nth(1))
        .filter_map(|rest| rest.strip_suffix(" started")?.parse().ok())
        .collect()
}

/// Waits until the guardian `pid` has exited (gone, a zombie nobody reaped yet, or its pid
/// taken by a process of another name), for at most `limit`; reaps it when it is our child.
pub(crate) fn wait_gone(pid: i32, limit: Duration) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let rest = s.rsplit_once(')')?.1.trim_start().to_owned();
                rest.chars().next()
            });
        // A pid taken again by another process: the guardian (named so) is gone.
        let ours = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim_end() == "cuda-guardian");
        if ours && state == Some('Z') {
            // A test process that is a subreaper inherits the orphaned guardian: reap it.
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        }
        if !ours || matches!(state, None | Some('Z' | 'X')) {
            return Ok(());
        }
        if started.elapsed() > limit {
            return Err(format!(
                "{pid} still runs {} s after the step ended",
                limit.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_calls_are_listed_by_task_in_phase_order() {
        let l = |p: i32, s: &str| (p, s.to_owned());
        let cli: BTreeSet<i32> = [10, 11, 12].into_iter().collect();
        // Two utility runs interleaved (12's handshake first), then a guardian's calls.
        let got = order_concurrent(
            vec![
                l(12, "cuda-checkpoint cuInit(flags=0) = CUDA_SUCCESS"),
                l(11, "cuda-checkpoint cuInit(flags=0) = CUDA_SUCCESS"),
                l(
                    11,
                    "cuda-checkpoint cuCheckpointProcessCheckpoint(pid=g1) = CUDA_SUCCESS",
                ),
                l(
                    12,
                    "cuda-checkpoint cuCheckpointProcessCheckpoint(pid=g2) = CUDA_SUCCESS",
                ),
                l(
                    12,
                    "cuda-checkpoint cuda-checkpoint(--action checkpoint --pid g2) = exit=0",
                ),
                l(
                    11,
                    "cuda-checkpoint cuda-checkpoint(--action checkpoint --pid g1) = exit=0",
                ),
                l(
                    10,
                    "cuda-checkpoint cuda-checkpoint(--action restore --pid g1) = exit=0",
                ),
                l(
                    7,
                    "guardian cuCheckpointProcessUnlock(pid=g2) = CUDA_SUCCESS",
                ),
                l(
                    7,
                    "guardian cuCheckpointProcessUnlock(pid=g1) = CUDA_SUCCESS",
                ),
                l(
                    7,
                    "guardian cuCheckpointProcessGetState(pid=g3) = CUDA_SUCCESS",
                ),
                l(
                    7,
                    "guardian cuCheckpointProcessUnlock(pid=g0) = CUDA_SUCCESS",
                ),
            ],
            &cli,
        );
        assert_eq!(
            got,
            vec![
                "cuda-checkpoint cuInit(flags=0) = CUDA_SUCCESS",
                "cuda-checkpoint cuCheckpointProcessCheckpoint(pid=g1) = CUDA_SUCCESS",
                "cuda-checkpoint cuda-checkpoint(--action checkpoint --pid g1) = exit=0",
                "cuda-checkpoint cuInit(flags=0) = CUDA_SUCCESS",
                "cuda-checkpoint cuCheckpointProcessCheckpoint(pid=g2) = CUDA_SUCCESS",
                "cuda-checkpoint cuda-checkpoint(--action checkpoint --pid g2) = exit=0",
                "cuda-checkpoint cuda-checkpoint(--action restore --pid g1) = exit=0",
                "guardian cuCheckpointProcessUnlock(pid=g1) = CUDA_SUCCESS",
                "guardian cuCheckpointProcessUnlock(pid=g2) = CUDA_SUCCESS",
                "guardian cuCheckpointProcessGetState(pid=g3) = CUDA_SUCCESS",
                "guardian cuCheckpointProcessUnlock(pid=g0) = CUDA_SUCCESS",
            ]
        );
    }

    #[test]
    fn guardian_pids_come_from_the_plugins_start_lines() {
        let log = "(00.001) cuda_plugin: helper process 4711 started\n\
                   (00.002) cuda_plugin: helper process 12 started late\n\
                   (00.003) cuda_plugin: helper process x started\n\
                   (00.004) cuda_plugin: pid 9: restored\n\
                   (00.005) cuda_plugin: helper process 99 started\n";
        assert_eq!(guardian_pids(log), vec![4711, 99]);
        assert!(guardian_pids("").is_empty());
    }

    proptest::proptest! {
        #[test]
        fn guardian_pid_parser_finds_every_start_line(pids in proptest::collection::vec(1i32.., 0..6), junk in "[ -~]{0,30}") {
            let log: String = pids.iter().map(|p| format!("(00.1) cuda_plugin: helper process {p} started\n{junk}\n")).collect();
            let got = guardian_pids(&log);
            // Junk that itself reads as a start line may add pids, never drop one.
            proptest::prop_assert!(pids.iter().all(|p| got.contains(p)));
            let _ = guardian_pids(&junk);
        }
    }

    #[test]
    fn versions_sizes_and_statuses_are_never_taken_for_pids() {
        for (before, after) in [
            ("(libcuda.so.1 ", ")"),
            ("cr_plugin_ctl is ", " bytes))"),
            ("GH100, ", " MiB)"),
            ("host has ", " hooks (cr"),
            ("--pid gpu) = exit=", ""),
            ("exited with status ", " (probably"),
            ("needs ", " or later)"),
        ] {
            assert!(never_a_pid(before, after), "{before}N{after}");
        }
        for (before, after) in [
            ("pid=", ", timeoutMs"),
            ("cuda_plugin: pid ", ": checkpointed"),
        ] {
            assert!(!never_a_pid(before, after), "{before}N{after}");
        }
    }

    #[test]
    fn the_step_watchdog_kills_a_hung_step_and_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("child.pid");
        // A step that starts a process of its own, then hangs.
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg(format!(
            "sleep 60 & echo $! > {}; sleep 60",
            pidfile.display()
        ));
        let start = Instant::now();
        let mut seen = None;
        let (status, _, _) =
            run_bounded(&mut c, Duration::from_millis(300), |p| seen = Some(p)).unwrap();
        assert!(status.is_none(), "reported as not finished");
        assert!(seen.is_some());
        assert!(start.elapsed() < Duration::from_secs(10), "bounded");
        let child: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        while Path::new(&format!("/proc/{child}")).exists()
            && !matches!(state(child), 'Z' | 'X')
            && Instant::now() < end
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            matches!(state(child), 'Z' | 'X' | '?'),
            "the step's own process was killed with its group"
        );
        // A step that ends in time reports its status and output.
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg("echo out; echo err >&2; exit 3");
        let (status, out, err) = run_bounded(&mut c, Duration::from_secs(20), |_| {}).unwrap();
        assert_eq!(status.and_then(|s| s.code()), Some(3));
        assert_eq!((out.trim(), err.trim()), ("out", "err"));
    }
}
