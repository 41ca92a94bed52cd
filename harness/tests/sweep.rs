//! The fault sweep ([`harness::sweep`]): every (call, fault) combination of the default set, on
//! the emulated engine, two at a time; every invariant must hold (or be a listed known
//! violation), and the table is an insta snapshot (`tests/snapshots/sweep.snap`).
//!
//! The artifacts come from this test's own target directory, built once when missing (as for
//! the scenario corpus). `harness sweep --full` runs the larger set (delays and hangs on every
//! call).

use std::path::Path;

use harness::runner::{self, Artifacts};
use harness::sweep;

const HARNESS: &str = env!("CARGO_BIN_EXE_harness");

#[test]
fn fault_sweep_keeps_every_invariant() {
    let art = Artifacts::for_tests(Path::new(HARNESS)).expect("artifacts");
    runner::become_subreaper();
    let cases = sweep::cases(false);
    assert!(cases.len() >= 200, "{} combinations", cases.len());
    let started = std::time::Instant::now();
    let results = sweep::run_all(&cases, &art, 2, &|r| {
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
        "fault sweep: {} combinations in {:.1} s",
        results.len(),
        started.elapsed().as_secs_f64()
    );
    let failures: Vec<String> = results
        .iter()
        .filter(|r| sweep::is_failure(r))
        .map(|r| format!("{}: {}", r.case.repro(), sweep::check_text(r)))
        .collect();
    let table = sweep::table(&results, false);
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.bind(|| insta::assert_snapshot!("sweep", table));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
