//! The corpus must catch a broken plugin: a build of `cuda_plugin.so` that skips its rollback
//! (`--cfg criu_cuda_mutant="skip-rollback"`, see plugin/src/engine/dump/rollback.rs) is run through the
//! rollback and leave-running scenarios, and the scenarios that pin a rollback must fail with
//! it (they pass with the real plugin in the `scenarios` target).
//!
//! The mutant is built once into `<target>/mutants/` (a separate target directory, since the
//! cfg changes the whole build).

use harness::runner::{self, Artifacts, RunOptions, Verdict};
use harness::scenario::matrix::split_name;
use harness::scenario::Scenario;
use std::path::{Path, PathBuf};
use std::process::Command;

const HARNESS: &str = env!("CARGO_BIN_EXE_harness");
const MANIFEST: &str = env!("CARGO_MANIFEST_DIR");

/// Scenarios whose verdict depends on the rollback (a failed or `--leave-running` dump must
/// put every task back).
const ROLLBACK_PINNED: &[&str] = &[
    "cuda/rollback/driver-api/checkpoint-failure-restores-and-unlocks-the-others@emulated-pr3076",
    "cuda/rollback/driver-api/checkpoint-error-after-state-change-is-rolled-back",
    "cuda/rollback/dump-late-failure-of-another-plugin-rolls-back@driver-api",
    "cuda/rollback/driver-api/rollback-on-4.1-host",
    "cuda/rollback/driver-api/rollback-runs-in-exit-without-dump-finish",
    "cuda/rollback/cuda-checkpoint/checkpoint-failure-restores-and-unlocks-the-others@emulated-pr3076",
    "cuda/rollback/cuda-checkpoint/checkpoint-error-after-state-change-is-rolled-back",
    "cuda/leave-running/leaves-every-task-running-and-unlocked@driver-api",
    "cuda/leave-running/leaves-every-task-running-and-unlocked@cuda-checkpoint",
];

fn build_mutant(target: &Path) -> PathBuf {
    let dir = target.join("mutants");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "-p", "cuda-plugin", "--lib", "--manifest-path"])
        .arg(Path::new(MANIFEST).join("../Cargo.toml"))
        .env("CARGO_TARGET_DIR", &dir)
        .env("RUSTFLAGS", "--cfg criu_cuda_mutant=\"skip-rollback\"")
        .status()
        .expect("running cargo");
    assert!(st.success(), "building the skip-rollback mutant failed");
    dir.join("debug").join("libcuda_plugin.so")
}

#[test]
fn a_plugin_that_skips_its_rollback_fails_the_rollback_scenarios() {
    runner::become_subreaper();
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap();
    let mut art = Artifacts::for_tests(Path::new(HARNESS)).unwrap();
    art.plugin = build_mutant(profile.parent().unwrap());
    let corpus = Path::new(MANIFEST).join("../scenarios");
    let mut survived = Vec::new();
    for name in ROLLBACK_PINNED {
        let (file, variant) = split_name(name);
        let path = corpus.join(format!("{file}.toml"));
        let s = Scenario::load_variant(&path, variant)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let report = runner::run(&s, &art, RunOptions::default());
        match report.verdict {
            Verdict::Fail(why) => eprintln!("killed: {name}: {}", why.lines().next().unwrap_or("")),
            other => survived.push(format!("{name}: {other:?}")),
        }
    }
    assert!(
        survived.is_empty(),
        "the skip-rollback mutant survived these scenarios:\n{}",
        survived.join("\n")
    );
}
