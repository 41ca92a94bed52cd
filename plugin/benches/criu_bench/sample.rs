//! One sample: a dump + restore of a fresh tree in one configuration, and what is read from it
//! (wall times, `cuda-checkpoint` runs and trace lines, the plugin's hook times, CRIU's phases).

use crate::config::Config;
use crate::ensure;
use crate::run::{keep_all, tail, Bench, Run};
use crate::stats::CriuStats;
use std::collections::BTreeMap;
use testkit::criu::*;

/// One dump + restore.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(crate) config: Config,
    pub(crate) n: usize,
    pub(crate) round: usize,
    pub(crate) dump_ms: f64,
    pub(crate) restore_ms: f64,
    pub(crate) dump_runs: usize,
    pub(crate) restore_runs: usize,
    /// Lines the world trace gained during the dump / the restore (driver calls and
    /// `cuda-checkpoint` runs).
    pub(crate) dump_calls: usize,
    pub(crate) restore_calls: usize,
    /// Hook name → per-task times (ms), from both logs.
    pub(crate) hooks: BTreeMap<String, Vec<f64>>,
    pub(crate) stats: CriuStats,
}

/// Per hook name, the `done in` time of every call; and under `"<HOOK> (backend)"` and
/// `"<HOOK> (restore thread)"` the time each call waited on the backend and on restore-thread
/// control.
pub(crate) fn collect_hooks(into: &mut BTreeMap<String, Vec<f64>>, log: &str) {
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
pub(crate) const BACKEND_PART: &str = "(backend)";
pub(crate) const THREADS_PART: &str = "(restore thread)";

/// One dump + restore of a fresh tree of `n` tasks in `config`.
pub(crate) fn sample(b: &Bench, config: Config, n: usize, round: usize) -> R<Sample> {
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
    let stats = CriuStats::of_images(&img);
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
