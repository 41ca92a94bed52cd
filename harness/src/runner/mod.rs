//! The scenario executor, the one every scenario runs on (the corpus, a variant of a file with a
//! `[matrix]`, a fault sweep case): runs it against real processes and reports whether the
//! expected outcome happened, or, for a scenario with `[invariants]`, whether the plugin's
//! invariants held after its last step ([`InvariantReport`]), with a normalised transcript for
//! snapshots.
//!
//! Per scenario: a temporary directory with a mock CUDA world (made and reconfigured in-process
//! with `mock_cuda_world::client`, as `mock-world init`/`configure` would; faults naming tasks
//! installed once the workload runs), a plugin directory (`cuda_plugin.so`, hard-linked where it
//! can be; test plugins compiled from `tests/support/testplugin.c`), the workload tree (one
//! `mock-cuda-app` per task, each started by its parent's shell before it `exec`s, in its own
//! session), and the steps, each a `harness` engine process or a real `criu`, or done by the
//! harness itself: a new world config (the world becomes another host), removing or rewriting an
//! image (a file of the image directory, or an entry of the stream file).
//!
//! The transcript of each step holds the engine's hook trace, the mock driver's call trace
//! (calls of the engine/CRIU process and of `cuda-checkpoint` runs; the workload's own calls are
//! left out) and the plugin log lines, with pids replaced by task names (`root`,
//! `root.restore` for a restore thread, `criu`, `cuda-checkpoint`), paths and durations removed.
//!
//! Modules: `artifacts` (locating built artifacts), `world` (the mock world and the workload
//! tree), `step` (step execution), `normalise` (the transcript redactor), `checks` (end-state
//! checks and cleanup), `corpus` (the corpus walk) and [`pool`] (the worker pool the sweep
//! shares).

use crate::procfs::{comm, field, parked, state, thread_count, world_processes};
use crate::workload::{
    host_pid_in, kill_and_reap, mock_env, run_checked, spawn_root, tree_root, verify_data,
    wait_ready,
};
use mock_cuda_world::client::{CudaState, MockWorld, Status};
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

mod artifacts;
mod checks;
mod corpus;
mod invariants;
mod normalise;
pub mod pool;
mod step;
mod world;

pub use artifacts::{find_criu, Artifacts, ARTIFACTS_VAR, TEST_PLUGIN_VAR};
pub use corpus::{
    collect, read_snapshot, run_corpus, run_rows, run_scenario, run_work, snapshot_name, work,
    CorpusOptions, Row,
};
pub use invariants::InvariantReport;
use normalise::known_lock_timeouts;
pub(crate) use step::{guardian_pids, wait_gone};

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
    /// For a scenario judged by `[invariants]`: the outcome, whether its fault fired, and what
    /// did not hold.
    pub invariants: Option<InvariantReport>,
}

impl Report {
    /// The report of a scenario that did not run (not applicable, skipped, or failed before
    /// anything started).
    fn not_run(verdict: Verdict, host: String, start: Instant) -> Self {
        Report {
            verdict,
            host,
            backend: "-".to_owned(),
            transcript: String::new(),
            snapshot_applies: false,
            steps: Vec::new(),
            elapsed: start.elapsed(),
            invariants: None,
        }
    }
}

/// Options of a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// A real-CRIU scenario whose CRIU is absent fails instead of being skipped
    /// (`CRIU_CUDA_REQUIRE_CRIU=1`).
    pub require_criu: bool,
}

/// How many scenarios run at a time by default: twice the cores, at least 2 and at most 8. A
/// scenario mostly waits (for its tree to start and stop, for timeouts, for the plugin's
/// guardian), so more run well beside each other than there are cores.
#[must_use]
pub fn default_jobs() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get() * 2)
        .clamp(2, 8)
}

/// Makes this process a child subreaper, so that the orphans of a workload tree (its children
/// after a real CRIU dump killed it, a `cuda-checkpoint` a plugin left behind) become its
/// children and can be reaped by pid. Call once before running scenarios.
pub fn become_subreaper() {
    let _ = nix::sys::prctl::set_child_subreaper(true);
}

/// Who runs now: any number of scenarios beside each other, or one that must run alone
/// ([`Scenario::alone`]).
static TURNS: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A scenario's turn to run in this process, held while it runs: one that must run alone
/// waits until no other runs, and keeps the others waiting until it is done.
pub(crate) struct Turn {
    _alone: Option<std::sync::RwLockWriteGuard<'static, ()>>,
    _beside: Option<std::sync::RwLockReadGuard<'static, ()>>,
}

impl Turn {
    pub(crate) fn take(alone: bool) -> Turn {
        use std::sync::PoisonError;
        if alone {
            let turn = TURNS.write().unwrap_or_else(PoisonError::into_inner);
            Turn {
                _alone: Some(turn),
                _beside: None,
            }
        } else {
            let turn = TURNS.read().unwrap_or_else(PoisonError::into_inner);
            Turn {
                _alone: None,
                _beside: Some(turn),
            }
        }
    }
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
        return Report::not_run(Verdict::NotApplicable(why), host, start);
    }
    // Its time starts once it has its turn.
    let _turn = Turn::take(s.alone);
    let start = Instant::now();
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
        judged: None,
        violations: Vec::new(),
        invariants: None,
        last_ok: false,
        image_fs: None,
    };
    if let Some(why) = needs_root(s) {
        let verdict = if opts.require_criu && s.host.engine == EngineKind::Criu {
            Verdict::Fail(format!("required (CRIU_CUDA_REQUIRE_CRIU=1): {why}"))
        } else {
            Verdict::Skip(why)
        };
        return Report::not_run(verdict, host, start);
    }
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
                return Report::not_run(
                    Verdict::Skip(format!("no CRIU {} found", s.host.profile)),
                    host,
                    start,
                )
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
    // A failure shows the mock world's timeout log, if a driver request gave up on a restore
    // thread (with what that thread was doing); the transcript never holds it.
    let result = result.map_err(|e| {
        let timeouts = ex.timeouts();
        if let Some(f) = ex.records.iter_mut().rev().find_map(|r| r.failure.as_mut()) {
            f.push_str(&timeouts);
        }
        e + &timeouts
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
        invariants: ex.invariants,
    }
}

/// Why `s` cannot run as this (non-root) user, if it cannot: real CRIU, and a tree in new pid
/// or mount namespaces, need root. The same sentence for every scenario of a kind, so that a
/// summary can count them.
#[must_use]
pub fn needs_root(s: &Scenario) -> Option<String> {
    if nix::unistd::geteuid().is_root() {
        return None;
    }
    if s.host.engine == EngineKind::Criu {
        return Some("not root: real CRIU needs root".to_owned());
    }
    if s.host.image_fs_kib.is_some() {
        return Some(
            "not root: an image filesystem of its own (host.image_fs_kib) needs root".to_owned(),
        );
    }
    (!s.workload.namespaces.is_empty())
        .then(|| "not root: a tree in new pid or mount namespaces needs root".to_owned())
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
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
    /// `[invariants]`: the judged (last) step as it ran.
    judged: Option<invariants::Judged>,
    /// `[invariants]`: what the judged step's own checks found.
    violations: Vec<String>,
    /// `[invariants]`: the report of the checks after the judged step.
    invariants: Option<InvariantReport>,
    /// Whether the last step that ran exited 0.
    last_ok: bool,
    /// `[host] image_fs_kib`: the tmpfs mounted over the image directory, unmounted at the end.
    image_fs: Option<PathBuf>,
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
        if let Some(kib) = self.s.host.image_fs_kib {
            self.mount_image_fs(kib)?;
        }
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
        let r = match &self.s.invariants {
            Some(inv) => self.check_invariants(inv, &lib),
            None => self.check_end(),
        };
        self.records.push(StepRecord {
            name: "outcome".to_owned(),
            elapsed: t.elapsed(),
            failure: r.as_ref().err().cloned(),
            skipped: None,
        });
        r
    }
}

#[cfg(test)]
mod tests {
    use super::Turn;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A scenario that must run alone waits for those running, and those after it wait for it.
    #[test]
    fn a_scenario_that_runs_alone_has_the_process_to_itself() {
        let running = Turn::take(false);
        let (got, got_rx) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let alone = std::thread::spawn(move || {
            let _turn = Turn::take(true);
            got.send(()).unwrap();
            let _ = release_rx.recv();
        });
        assert!(
            got_rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "not while another runs"
        );
        drop(running);
        got_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("its turn once the other is done");
        let (tx, rx) = mpsc::channel();
        let after = std::thread::spawn(move || {
            let _turn = Turn::take(false);
            tx.send(()).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "no other beside it"
        );
        release.send(()).unwrap();
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the next one's turn once it is done");
        alone.join().unwrap();
        after.join().unwrap();
    }
}
