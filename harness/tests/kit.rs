//! The conformance kit end to end: the corpus run against CRIU 4.1.1's C `cuda_plugin.so` (built
//! by `scripts/fetch-criu.sh --c-plugin`) finds what `scenarios/cuda/conformance/` names, this
//! project's plugin run through the same path as a stranger's passes, and `harness run --plugin
//! --junit` reports the failing step.
//!
//! The scenarios run on Debian's CRIU 4.2.x. Trials whose C plugin or CRIU is absent are ignored
//! with the reason, unless `CRIU_CUDA_REQUIRE_C_PLUGINS=1` / `CRIU_CUDA_REQUIRE_CRIU=1`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use harness::kit::PluginUnderTest;
use harness::runner::{self, Artifacts, RunOptions, Verdict};
use harness::scenario::{Capability, Scenario};
use libtest_mimic::{Arguments, Failed, Trial};

const HARNESS: &str = env!("CARGO_BIN_EXE_harness");

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn artifacts() -> Result<Artifacts, String> {
    Artifacts::for_tests(Path::new(HARNESS))
}

fn scenario(name: &str) -> PathBuf {
    workspace().join(format!("scenarios/cuda/conformance/{name}.toml"))
}

const LOCKED: &str = "task gpu: CUDA state locked, expected running";

fn finds_the_locked_task(so: &Path) -> Result<(), Failed> {
    let art = artifacts()?;
    for name in [
        "checkpoint-error-leaves-no-task-locked",
        "checkpoint-crash-leaves-no-task-locked",
        "checkpoint-exit-0-with-garbage-leaves-no-task-locked",
    ] {
        let s = Scenario::load(&scenario(name)).map_err(|e| e.to_string())?;
        let r = runner::run_with(
            &s,
            &art,
            RunOptions { require_criu: true },
            &PluginUnderTest::other(so),
        );
        match &r.verdict {
            Verdict::Fail(e) if e.lines().next() == Some(LOCKED) => {}
            other => return Err(format!("{name}: {other:?}, expected a fail: {LOCKED}").into()),
        }
        let failed: Vec<&str> = r
            .steps
            .iter()
            .filter(|s| s.failure.is_some())
            .map(|s| s.name.as_str())
            .collect();
        if failed != ["outcome"] {
            return Err(format!("{name}: failed records {failed:?}, expected the outcome").into());
        }
    }
    Ok(())
}

fn ours_as_a_stranger_passes() -> Result<(), Failed> {
    let art = artifacts()?;
    let mut put = PluginUnderTest::other(&art.plugin);
    put.capabilities = Capability::ALL
        .into_iter()
        .filter(|c| *c != Capability::Parallel)
        .collect();
    for name in [
        "checkpoint-error-leaves-no-task-locked",
        "task-checkpointed-before-the-dump-is-restored-checkpointed",
    ] {
        let s = Scenario::load(&scenario(name)).map_err(|e| e.to_string())?;
        let r = runner::run_with(&s, &art, RunOptions { require_criu: true }, &put);
        if r.verdict != Verdict::Pass {
            return Err(format!("{name}: {:?}", r.verdict).into());
        }
        if r.snapshot_applies {
            return Err(format!("{name}: a stranger's transcript is never a snapshot").into());
        }
    }
    // Without the capability, the scenario that declares it does not apply, with the reason.
    put.capabilities.remove(&Capability::RestoreAsDumped);
    let s = Scenario::load(&scenario(
        "task-checkpointed-before-the-dump-is-restored-checkpointed",
    ))
    .map_err(|e| e.to_string())?;
    let r = runner::run_with(&s, &art, RunOptions { require_criu: true }, &put);
    match r.verdict {
        Verdict::NotApplicable(why) if why.starts_with("needs restore-as-dumped (declared") => {
            Ok(())
        }
        other => Err(format!("{other:?}").into()),
    }
}

fn junit_names_the_failing_step(so: &Path) -> Result<(), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let xml = dir.path().join("kit.xml");
    let out = Command::new(HARNESS)
        .arg("run")
        .arg("--junit")
        .arg(&xml)
        .arg("--plugin")
        .arg(so)
        .arg(scenario("checkpoint-error-leaves-no-task-locked"))
        .arg(scenario("restore-onto-another-host-s-gpus"))
        .env(criu_cuda_env::REQUIRE_CRIU, "1")
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.code() != Some(1) {
        return Err(format!("harness run exited {:?}:\n{stdout}", out.status).into());
    }
    if !stdout.contains("0 passed, 1 failed, 0 skipped, 1 not applicable") {
        return Err(format!("summary:\n{stdout}").into());
    }
    let x = std::fs::read_to_string(&xml).map_err(|e| e.to_string())?;
    let want = [
        "tests=\"3\" failures=\"1\" skipped=\"1\"",
        "name=\"outcome\"",
        &format!("<failure message=\"{LOCKED}\">"),
        "<skipped message=\"not applicable: needs device-map (task rev must end on GPU-",
    ];
    for w in want {
        if !x.contains(w) {
            return Err(format!("the JUnit XML lacks {w}:\n{x}").into());
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    runner::become_subreaper();
    let require = criu_cuda_env::is_on;
    let c41 = harness::conformance::c_plugins(&workspace())
        .into_iter()
        .find(|(v, p)| v.starts_with("4.1.") && p.exists())
        .map(|(_, p)| p);
    let no_criu = (runner::find_criu("4.2", &workspace()).is_none()
        && !require(criu_cuda_env::REQUIRE_CRIU))
    .then_some("no CRIU 4.2 found (scripts/fetch-criu.sh)");
    let no_c = (c41.is_none() && !require(criu_cuda_env::REQUIRE_C_PLUGINS))
        .then_some("no CRIU 4.1.x C plugin (scripts/fetch-criu.sh --c-plugin)");
    let need_c = |so: &Option<PathBuf>| -> Result<PathBuf, Failed> {
        so.clone().ok_or_else(|| {
            "required: no CRIU 4.1.x C plugin (scripts/fetch-criu.sh --c-plugin)".into()
        })
    };
    let (a, b) = (c41.clone(), c41);
    let trials = [
        (
            Trial::test(
                "the_c_plugin_leaves_a_task_locked_after_a_failed_checkpoint",
                move || finds_the_locked_task(&need_c(&a)?),
            ),
            no_criu.or(no_c),
        ),
        (
            Trial::test(
                "our_plugin_run_as_a_stranger_s_passes",
                ours_as_a_stranger_passes,
            ),
            no_criu,
        ),
        (
            Trial::test(
                "junit_names_the_failing_step_and_the_not_applicable_reason",
                move || junit_names_the_failing_step(&need_c(&b)?),
            ),
            no_criu.or(no_c),
        ),
    ];
    let trials = trials
        .into_iter()
        .map(|(t, absent)| match absent {
            Some(why) => {
                eprintln!("note: {} is ignored: {why}", t.name());
                t.with_ignored_flag(true)
            }
            None => t,
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}
