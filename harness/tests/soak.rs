//! The chaos soak ([`harness::soak`]) as a test: `CRIU_CUDA_SOAK_RUNS` runs (default 50; 500
//! with `CRIU_CUDA_FULL=1`, the nightly run) drawn from `CRIU_CUDA_SOAK_SEED` (default 1205, so
//! that CI draws the same runs every time; a long soak takes any seed: `harness soak --runs 5000
//! --seed S`). Every run must keep its invariants; a failing run prints the command that
//! replays it.
//!
//! It needs root (the container-shaped runs start trees in new pid and mount namespaces): run
//! by another user it is listed as ignored, with the reason.

use std::path::Path;
use std::process::ExitCode;

use harness::runner::{self, Artifacts};
use harness::soak;
use libtest_mimic::{Arguments, Failed, Trial};

const HARNESS: &str = env!("CARGO_BIN_EXE_harness");

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn chaos_soak_keeps_every_invariant() -> Result<(), Failed> {
    let art = Artifacts::for_tests(Path::new(HARNESS))?;
    runner::become_subreaper();
    let full = criu_cuda_env::is_on(criu_cuda_env::FULL);
    let seed = env_u64(criu_cuda_env::SOAK_SEED).unwrap_or(1205);
    let runs = env_u64(criu_cuda_env::SOAK_RUNS).unwrap_or(if full { 500 } else { 50 });
    let numbers: Vec<u64> = (0..runs).collect();
    let started = std::time::Instant::now();
    // The stalls (most runs) wait out a deadline: twice as many of them beside the others (50
    // runs took 16.6 s so, against 30.7 s in one pool, on the 2-core VM).
    let jobs = runner::default_jobs();
    let results = soak::run(&numbers, seed, &art, jobs, 2 * jobs, &|_| {});
    eprint!(
        "chaos soak, seed {seed}:\n{}",
        soak::figures(&results, started.elapsed().as_secs_f64())
    );
    let failures: Vec<String> = results
        .iter()
        .filter_map(|r| {
            r.failure().map(|why| {
                format!(
                    "run {}: {}: {why}\n  replay: {}\n{}",
                    r.run,
                    r.result.case.key(),
                    r.replay(seed),
                    r.result.detail
                )
            })
        })
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let root = nix::unistd::geteuid().is_root();
    let trial = Trial::test(
        "chaos_soak_keeps_every_invariant",
        chaos_soak_keeps_every_invariant,
    )
    .with_ignored_flag(!root);
    if !root {
        eprintln!(
            "note: chaos_soak_keeps_every_invariant is ignored: not root (its container-shaped \
             runs start trees in new pid and mount namespaces); run it as root: \
             `cargo test -p harness --test soak` (or `bash scripts/test.sh`)"
        );
    }
    libtest_mimic::run(&args, vec![trial]).exit_code()
}
