//! The fault sweep ([`harness::sweep`]): every (call, fault) combination of the default set
//! (one code per group the plugin cannot tell apart), each a scenario run by the scenario runner
//! and judged by its invariants; every invariant must hold (or be a listed known violation), and
//! the table is an insta snapshot (`tests/snapshots/sweep.snap`). `harness sweep --full` runs
//! the larger set (every code, delays and hangs on every call).
//!
//! With `CRIU_CUDA_FULL=1` (`scripts/test.sh --full`, the nightly run) it runs the full set
//! instead (`harness sweep --full`: every code, the slow faults everywhere), whose table is not
//! a snapshot: every invariant must hold.
//!
//! It needs root (the container-shaped cases start trees in new pid and mount namespaces): run
//! by another user it is listed as ignored, with the reason. `CRIU_CUDA_SWEEP_JOBS` sets how
//! many cases run at a time (default: `harness::runner::default_jobs`, twice the cores), and as
//! many again of those that wait out a delay or a hang run beside them.

use std::path::Path;
use std::process::ExitCode;

use harness::runner::{self, Artifacts};
use harness::sweep;
use libtest_mimic::{Arguments, Failed, Trial};

const HARNESS: &str = env!("CARGO_BIN_EXE_harness");

fn fault_sweep_keeps_every_invariant() -> Result<(), Failed> {
    let art = Artifacts::for_tests(Path::new(HARNESS))?;
    runner::become_subreaper();
    let full = criu_cuda_env::is_on(criu_cuda_env::FULL);
    let cases = sweep::cases(full);
    if cases.len() < 200 {
        return Err(format!("only {} combinations", cases.len()).into());
    }
    let jobs = std::env::var(criu_cuda_env::SWEEP_JOBS)
        .ok()
        .and_then(|j| j.parse().ok())
        .unwrap_or_else(runner::default_jobs);
    let started = std::time::Instant::now();
    let results = sweep::run_all(&cases, &art, jobs, jobs, &|r| {
        if sweep::is_failure(r) {
            eprintln!(
                "{} {} {} {} {}: {}\n  repro: {}\n{}",
                r.case.call,
                r.case.fault.name(),
                r.case.phase.name(),
                r.case.target.name(),
                r.case.profile,
                sweep::check_text(r),
                r.case.repro(),
                r.detail
            );
        }
    });
    eprintln!(
        "fault sweep: {} combinations in {:.1} s, {jobs} at a time",
        results.len(),
        started.elapsed().as_secs_f64()
    );
    let failures: Vec<String> = results
        .iter()
        .filter(|r| sweep::is_failure(r))
        .map(|r| format!("{}: {}", r.case.repro(), sweep::check_text(r)))
        .collect();
    let table = sweep::table(&results, false);
    if full {
        eprintln!("{table}");
        return if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("\n").into())
        };
    }
    let snapshot = std::panic::catch_unwind(|| {
        let mut settings = insta::Settings::clone_current();
        settings.set_snapshot_path(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots"));
        settings.set_prepend_module_to_snapshot(false);
        settings.set_omit_expression(true);
        settings.bind(|| insta::assert_snapshot!("sweep", table));
    });
    if !failures.is_empty() {
        return Err(failures.join("\n").into());
    }
    snapshot.map_err(|_| "the sweep's table differs from tests/snapshots/sweep.snap".into())
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let root = nix::unistd::geteuid().is_root();
    let trial = Trial::test(
        "fault_sweep_keeps_every_invariant",
        fault_sweep_keeps_every_invariant,
    )
    .with_ignored_flag(!root);
    if !root {
        eprintln!(
            "note: fault_sweep_keeps_every_invariant is ignored: not root (its container-shaped \
             cases start trees in new pid and mount namespaces); run it as root: \
             `cargo test -p harness --test sweep` (or `bash scripts/test.sh`)"
        );
    }
    libtest_mimic::run(&args, vec![trial]).exit_code()
}
