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
//! `cuda-checkpoint`) come from `$CRIU_CUDA_ARTIFACTS`, where `scripts/test.sh` built them;
//! without it, from this test's own target directory, where cargo builds them once when one is
//! missing or older than its sources. `CRIU_CUDA_TEST_PLUGIN_SO=PATH` tests that prebuilt build
//! of this project's plugin (the released `.so`) in place of the built one, with every check
//! and snapshot (as everywhere the harness runs this project's plugin).
//!
//! `CRIU_CUDA_CORPUS_IN_MAIN_JOB=1` (CI's tests) runs no scenario: the main job runs the corpus.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use harness::kit::PluginUnderTest;
use harness::runner::{self, Artifacts, CorpusOptions, RunOptions, Verdict};
use harness::scenario::matrix::split_name;
use harness::scenario::Scenario;
use libtest_mimic::{Arguments, Completion, Failed, Trial};

const HARNESS: &str = env!("CARGO_BIN_EXE_harness");
const MANIFEST: &str = env!("CARGO_MANIFEST_DIR");

fn corpus_dir() -> PathBuf {
    Path::new(MANIFEST).join("../scenarios")
}

fn artifacts() -> Result<&'static Artifacts, String> {
    static A: std::sync::OnceLock<Result<Artifacts, String>> = std::sync::OnceLock::new();
    A.get_or_init(|| Artifacts::for_tests(Path::new(HARNESS)))
        .as_ref()
        .map_err(Clone::clone)
}

/// One trial: [`runner::run_scenario`], the implementation `harness run` uses, judges the run;
/// on a pass, insta compares the transcript with its snapshot as well, to show the difference
/// and bless it when asked (`INSTA_UPDATE`).
fn run_trial(name: &str, path: &Path, opts: &CorpusOptions) -> Result<Completion, Failed> {
    let art = artifacts()?;
    let snaps = corpus_dir().join("snapshots");
    let row = runner::run_scenario(name, path, &snaps, art, opts);
    let Some(report) = row.report else {
        return Err(row.error.unwrap_or_default().into());
    };
    match report.verdict {
        Verdict::Pass if report.snapshot_applies => {
            let snap = runner::snapshot_name(name);
            let transcript = report.transcript;
            let checked = std::panic::catch_unwind(move || {
                let mut settings = insta::Settings::clone_current();
                settings.set_snapshot_path(snaps);
                settings.set_prepend_module_to_snapshot(false);
                settings.set_omit_expression(true);
                settings.bind(|| insta::assert_snapshot!(snap, transcript));
            });
            checked.map(|()| Completion::Completed).map_err(|_| {
                Failed::from(
                    row.error
                        .unwrap_or_else(|| "the transcript differs from its snapshot".into()),
                )
            })
        }
        Verdict::Pass => Ok(Completion::Completed),
        Verdict::Fail(e) => Err(e.into()),
        // Counted as ignored, with the reason: a skip is never a pass.
        Verdict::Skip(why) => Ok(Completion::ignored_with(why)),
        Verdict::XFail(why) => {
            eprintln!("note: {name} failed as expected: {why}");
            Ok(Completion::Completed)
        }
        Verdict::NotApplicable(why) => {
            eprintln!("note: {name} does not apply to this project's plugin: {why}");
            Ok(Completion::Completed)
        }
    }
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    // CI runs the corpus once, in the main job (`harness run scenarios/`, which checks the same
    // snapshots and fails on a missing one): `.ci/run` sets this for `scripts/test.sh`.
    if criu_cuda_env::is_on(criu_cuda_env::CORPUS_IN_MAIN_JOB) {
        eprintln!(
            "scenarios: CRIU_CUDA_CORPUS_IN_MAIN_JOB=1: the corpus runs in the main job \
             (scripts/main-job.sh), not here"
        );
        return ExitCode::SUCCESS;
    }
    if let Some(so) = std::env::var_os(runner::TEST_PLUGIN_VAR) {
        eprintln!(
            "scenarios: the plugin under test is {} ({})",
            Path::new(&so).display(),
            runner::TEST_PLUGIN_VAR
        );
    }
    runner::become_subreaper();
    let run = RunOptions {
        require_criu: criu_cuda_env::is_on(criu_cuda_env::REQUIRE_CRIU),
    };
    let opts = CorpusOptions {
        jobs: 1,
        run,
        plugin: PluginUnderTest::ours(),
        print_rows: false,
    };
    let art_dir = std::path::PathBuf::from(MANIFEST).join("..");
    // Why scenarios will not run here, and how many each.
    let mut skips: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    let mut trials = Vec::new();
    for (name, path) in runner::collect(&corpus_dir()) {
        let s = match Scenario::load_variant(&path, split_name(&name).1) {
            Ok(s) => s,
            Err(e) => {
                trials.push(Trial::test(name, move || Err(e.to_string().into())));
                continue;
            }
        };
        let criu = s.host.engine == harness::scenario::EngineKind::Criu;
        let why = runner::needs_root(&s).or_else(|| {
            (criu && !run.require_criu && runner::find_criu(&s.host.profile, &art_dir).is_none())
                .then(|| format!("no CRIU {} found", s.host.profile))
        });
        if let Some(w) = &why {
            *skips.entry(w.clone()).or_default() += 1;
        }
        let n = name.clone();
        let opts = opts.clone();
        trials.push(
            Trial::ignorable_test(name, move || run_trial(&n, &path, &opts))
                .with_kind(if criu { "criu" } else { "emulated" })
                .with_ignored_flag(why.is_some()),
        );
    }
    let conclusion = libtest_mimic::run(&args, trials);
    if !skips.is_empty() {
        eprintln!("\nscenarios: not run here (listed as ignored above):");
        for (why, n) in &skips {
            eprintln!("  {n} scenario(s): {why}");
        }
        eprintln!(
            "  to run every scenario: as root, `bash scripts/test.sh` (it fetches real CRIU 4.1 \
             and 4.2 into target/criu first)"
        );
    }
    conclusion.exit_code()
}
