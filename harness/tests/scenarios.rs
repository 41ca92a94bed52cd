//! The regression corpus: one libtest-mimic trial per `scenarios/**/*.toml`, named by its path
//! relative to `scenarios/` and filterable with `cargo test --test scenarios -- NAME`.
//!
//! Each trial drives real processes through [`harness::runner`]: the workload tree, and one
//! engine process (or real `criu`) per step, so scenarios share no plugin state. Scenarios on a
//! real CRIU are skipped with a reason unless that CRIU is found, and fail instead when
//! `CRIU_CUDA_REQUIRE_CRIU=1`. A scenario marked `known_failure` passes when it fails (and fails
//! when it passes). The normalised transcript of each passing scenario is an insta snapshot in
//! `scenarios/snapshots/<dir>__<name>.snap`.
//!
//! The artifacts (the CUDA plugin, the mock driver, `mock-world`, `mock-cuda-app`,
//! `cuda-checkpoint`) come from this test's own target directory; when one is missing, cargo
//! builds them once.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use harness::runner::{self, Artifacts, RunOptions, Verdict};
use harness::scenario::Scenario;
use libtest_mimic::{Arguments, Failed, Trial};

const HARNESS: &str = env!("CARGO_BIN_EXE_harness");
const MANIFEST: &str = env!("CARGO_MANIFEST_DIR");

fn corpus_dir() -> PathBuf {
    Path::new(MANIFEST).join("../scenarios")
}

fn artifacts() -> Result<&'static Artifacts, String> {
    static A: std::sync::OnceLock<Result<Artifacts, String>> = std::sync::OnceLock::new();
    A.get_or_init(|| {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let profile = exe
            .parent()
            .and_then(Path::parent)
            .ok_or("the test binary is not in <target>/<profile>/deps")?;
        Artifacts::locate(profile, Path::new(HARNESS))
    })
    .as_ref()
    .map_err(Clone::clone)
}

fn run_trial(name: &str, s: &Scenario, opts: RunOptions) -> Result<(), Failed> {
    let art = artifacts()?;
    let report = runner::run(s, art, opts);
    match report.verdict {
        Verdict::Pass => {
            let snap = runner::snapshot_name(name);
            let transcript = report.transcript;
            let checked = std::panic::catch_unwind(move || {
                let mut settings = insta::Settings::clone_current();
                settings.set_snapshot_path(corpus_dir().join("snapshots"));
                settings.set_prepend_module_to_snapshot(false);
                settings.set_omit_expression(true);
                settings.bind(|| insta::assert_snapshot!(snap, transcript));
            });
            checked.map_err(|_| Failed::from("the transcript differs from its snapshot"))
        }
        Verdict::Fail(e) => Err(e.into()),
        Verdict::Skip(why) => {
            eprintln!("note: {name} is skipped: {why}");
            Ok(())
        }
        Verdict::XFail(why) => {
            eprintln!("note: {name} failed as expected: {why}");
            Ok(())
        }
        Verdict::NotApplicable(why) => {
            eprintln!("note: {name} does not apply to this project's plugin: {why}");
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    // CI runs the corpus once, in the main job (`harness run scenarios/`, which checks the same
    // snapshots and fails on a missing one): `.ci/run` sets this for `scripts/test.sh`.
    if std::env::var("CRIU_CUDA_CORPUS_IN_MAIN_JOB").is_ok_and(|v| v == "1") {
        eprintln!(
            "scenarios: CRIU_CUDA_CORPUS_IN_MAIN_JOB=1: the corpus runs in the main job \
             (scripts/main-job.sh), not here"
        );
        return ExitCode::SUCCESS;
    }
    runner::become_subreaper();
    let opts = RunOptions {
        require_criu: std::env::var("CRIU_CUDA_REQUIRE_CRIU").is_ok_and(|v| v == "1"),
    };
    let art_dir = std::path::PathBuf::from(MANIFEST).join("..");
    let trials = runner::collect(&corpus_dir())
        .into_iter()
        .map(|(name, path)| match Scenario::load(&path) {
            Err(e) => Trial::test(name, move || Err(e.to_string().into())),
            Ok(s) => {
                let kind = if s.host.engine == harness::scenario::EngineKind::Criu {
                    "criu"
                } else {
                    "emulated"
                };
                let ignored = s.host.engine == harness::scenario::EngineKind::Criu
                    && !opts.require_criu
                    && runner::find_criu(&s.host.profile, &art_dir).is_none();
                if ignored {
                    eprintln!("note: {name} is skipped: no CRIU {} found", s.host.profile);
                }
                let n = name.clone();
                Trial::test(name, move || run_trial(&n, &s, opts))
                    .with_kind(kind)
                    .with_ignored_flag(ignored)
            }
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}
