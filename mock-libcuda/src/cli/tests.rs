//! Tests of the command line against a recording fake driver.

use super::*;
use proptest::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

const G1: &str = "GPU-00000000-0000-0000-0000-000000000001";
const G2: &str = "GPU-00000000-0000-0000-0000-000000000002";
const G3: &str = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6";

const GENERATIONS: [CliGeneration; 4] = [
    CliGeneration::R550,
    CliGeneration::R555,
    CliGeneration::R580,
    CliGeneration::R590,
];

/// A driver that records every call. In `strict` mode it follows the checkpoint state
/// machine; otherwise every call succeeds and the state stays as set. `fail` scripts a code
/// per method name.
#[derive(Debug)]
struct Fake {
    branch: (u32, String),
    strict: bool,
    state: Cell<CUprocessState>,
    tid: i32,
    fail: HashMap<&'static str, CUresult>,
    calls: RefCell<Vec<String>>,
}

impl Fake {
    fn new(generation: CliGeneration) -> Fake {
        let branch = match generation {
            CliGeneration::R550 => (550, "550.54.09"),
            CliGeneration::R555 => (555, "555.42.06"),
            CliGeneration::R580 => (580, "580.65.06"),
            CliGeneration::R590 => (590, "590.44.01"),
        };
        Fake {
            branch: (branch.0, branch.1.to_owned()),
            strict: true,
            state: Cell::new(CUprocessState::RUNNING),
            tid: 4242,
            fail: HashMap::new(),
            calls: RefCell::new(Vec::new()),
        }
    }

    fn in_state(self, s: CUprocessState) -> Fake {
        self.state.set(s);
        self
    }

    fn failing(mut self, method: &'static str, code: CUresult) -> Fake {
        self.fail.insert(method, code);
        self
    }

    fn lenient(mut self) -> Fake {
        self.strict = false;
        self
    }

    fn calls(&self) -> Vec<String> {
        self.calls.borrow().clone()
    }

    fn step(
        &self,
        method: &'static str,
        call: String,
        from: CUprocessState,
        to: CUprocessState,
    ) -> Result<(), CUresult> {
        self.calls.borrow_mut().push(call);
        if let Some(&c) = self.fail.get(method) {
            return Err(c);
        }
        if self.strict {
            if self.state.get() != from {
                return Err(CUresult::ERROR_ILLEGAL_STATE);
            }
            self.state.set(to);
        }
        Ok(())
    }
}

impl CheckpointDriver for Fake {
    fn driver_version(&self) -> i32 {
        13000
    }
    fn branch(&self) -> (u32, String) {
        self.branch.clone()
    }
    fn init(&self) -> Result<(), CUresult> {
        self.calls.borrow_mut().push("init".into());
        self.fail.get("init").map_or(Ok(()), |&c| Err(c))
    }
    fn get_restore_tid(&self, pid: i32) -> Result<i32, CUresult> {
        self.calls
            .borrow_mut()
            .push(format!("get_restore_tid({pid})"));
        self.fail
            .get("get_restore_tid")
            .map_or(Ok(self.tid), |&c| Err(c))
    }
    fn get_state(&self, pid: i32) -> Result<CUprocessState, CUresult> {
        self.calls.borrow_mut().push(format!("get_state({pid})"));
        self.fail
            .get("get_state")
            .map_or(Ok(self.state.get()), |&c| Err(c))
    }
    fn lock(&self, pid: i32, timeout_ms: u32) -> Result<(), CUresult> {
        self.step(
            "lock",
            format!("lock({pid}, {timeout_ms})"),
            CUprocessState::RUNNING,
            CUprocessState::LOCKED,
        )
    }
    fn checkpoint(&self, pid: i32) -> Result<(), CUresult> {
        self.step(
            "checkpoint",
            format!("checkpoint({pid})"),
            CUprocessState::LOCKED,
            CUprocessState::CHECKPOINTED,
        )
    }
    fn restore(&self, pid: i32, pairs: &[(GpuUuid, GpuUuid)]) -> Result<(), CUresult> {
        let pairs: Vec<String> = pairs.iter().map(|(o, n)| format!("{o}={n}")).collect();
        self.step(
            "restore",
            format!("restore({pid}, [{}])", pairs.join(",")),
            CUprocessState::CHECKPOINTED,
            CUprocessState::LOCKED,
        )
    }
    fn unlock(&self, pid: i32) -> Result<(), CUresult> {
        self.step(
            "unlock",
            format!("unlock({pid})"),
            CUprocessState::LOCKED,
            CUprocessState::RUNNING,
        )
    }
}

/// The outcome of one invocation.
#[derive(Debug)]
struct Outcome {
    code: i32,
    out: String,
    err: String,
}

fn argv(args: &[&str]) -> Vec<String> {
    std::iter::once("cuda-checkpoint")
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect()
}

fn run_with(generation: CliGeneration, fake: &Fake, args: &[&str]) -> Outcome {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let code = run(&argv(args), generation, fake, &mut out, &mut err);
    Outcome {
        code,
        out: String::from_utf8_lossy(&out).into_owned(),
        err: String::from_utf8_lossy(&err).into_owned(),
    }
}

fn usage_error(generation: CliGeneration, args: &[&str]) -> String {
    let fake = Fake::new(generation);
    let o = run_with(generation, &fake, args);
    assert_eq!(o.code, EXIT_USAGE, "{args:?}: {o:?}");
    assert_eq!(o.out, "", "{args:?}");
    assert!(fake.calls().is_empty(), "{args:?} reached the driver");
    let mut lines = o.err.lines();
    let first = lines.next().unwrap_or_default().to_owned();
    assert!(first.starts_with("cuda-checkpoint: "), "{first}");
    assert_eq!(
        lines.next(),
        Some("Try 'cuda-checkpoint --help' for more information.")
    );
    first
}

// ---------------------------------------------------------------- help and discovery

/// Snapshots live in `src/snapshots/`, next to `cli.rs`.
macro_rules! snapshot {
    ($value:expr) => {
        insta::with_settings!({ snapshot_path => "../snapshots", prepend_module_to_snapshot => true }, {
            insta::assert_snapshot!($value);
        })
    };
}

fn help_of(generation: CliGeneration) -> String {
    let fake = Fake::new(generation);
    let args: &[&str] = if generation == CliGeneration::R550 {
        &["--help"]
    } else {
        &["-h"]
    };
    let o = run_with(generation, &fake, args);
    assert_eq!(o.code, 0);
    assert_eq!(o.err, "");
    assert!(fake.calls().is_empty(), "help must not reach the driver");
    o.out
}

#[test]
fn help_r550() {
    snapshot!(help_of(CliGeneration::R550));
}

#[test]
fn help_r555() {
    snapshot!(help_of(CliGeneration::R555));
}

#[test]
fn help_r580() {
    snapshot!(help_of(CliGeneration::R580));
}

#[test]
fn help_r590() {
    snapshot!(help_of(CliGeneration::R590));
}

#[test]
fn help_layout_follows_the_utility() {
    for g in GENERATIONS {
        let h = help_of(g);
        let lines: Vec<&str> = h.lines().collect();
        assert!(lines[0].contains("CUDA checkpoint and restore utility"));
        let version = lines
            .iter()
            .find(|l| l.starts_with("Version "))
            .expect("a version line");
        assert!(version.contains(&Fake::new(g).branch.1), "{version}");
        assert!(version.contains("Copyright"), "{version}");
        // Every description line is indented by exactly one TAB.
        assert!(
            lines
                .iter()
                .all(|l| !l.starts_with(' ') || l.starts_with("    --")),
            "{h}"
        );
        if g == CliGeneration::R550 {
            assert!(h.contains("--toggle --pid <value>"));
            assert!(!h.contains("--action"));
            assert!(!h.contains("Operations:"));
            continue;
        }
        let ops = h.find("Operations:").expect("Operations heading");
        let opts = h.find("Options:").expect("Options heading");
        assert!(ops < opts);
        // CRIU's probe: exit 0 and `--action` in the output of `-h`.
        assert!(h.contains("--action"));
        let order = [
            "--get-state --pid <pid>",
            "--action lock | checkpoint | restore | unlock --pid <pid> [--timeout <ms>]",
            "--toggle --pid <pid>",
            "--get-restore-tid --pid <pid>",
        ];
        let pos: Vec<usize> = order.iter().map(|s| h.find(s).expect(s)).collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{pos:?}");
        assert!(h.contains("--pid|-p <pid>") && h.contains("--timeout|-t <timeout>"));
        assert!(h.contains("--help|-h"));
        assert_eq!(
            h.contains("--device-map|-d <deviceUuids>"),
            g >= CliGeneration::R580
        );
        assert_eq!(
            h.contains("[--device-map <uuids>]"),
            g >= CliGeneration::R580
        );
        assert_eq!(
            h.contains("--launch-job|-j <program>"),
            g >= CliGeneration::R590
        );
        assert!(h.lines().filter(|l| l.starts_with('\t')).count() >= 8);
    }
}

#[test]
fn help_year_follows_the_branch() {
    let mut fake = Fake::new(CliGeneration::R555);
    assert!(help_text(CliGeneration::R555, &fake).contains("(C) 2024"));
    fake.branch = (570, "570.86.10".into());
    assert!(help_text(CliGeneration::R555, &fake).contains("Version 570.86.10. Copyright (C) 2025"));
    fake.branch = (610, "610.10.01".into());
    assert!(help_text(CliGeneration::R590, &fake).contains("(C) 2026"));
}

fn escape(s: &str) -> String {
    if s.starts_with("CUDA checkpoint and restore utility") {
        return format!("<help, {} lines>", s.lines().count());
    }
    s.replace('\t', "\\t").replace('\n', "\\n")
}

/// Runs a fixed set of command lines against a lenient fake and renders one row per line:
/// argv, exit status, stdout, stderr, driver calls.
fn discovery_table(generation: CliGeneration) -> String {
    let map = format!("{G1}={G2}");
    let cases: Vec<Vec<&str>> = vec![
        vec![],
        vec!["--help"],
        vec!["-h"],
        vec!["--toggle", "--pid", "1"],
        vec!["--toggle", "-p", "1"],
        vec!["--get-state", "--pid", "1"],
        vec!["--get-restore-tid", "--pid", "1"],
        vec!["--action", "lock", "--pid", "1"],
        vec!["--action", "lock", "--pid", "1", "--timeout", "500"],
        vec!["--action", "lock", "-p", "1", "-t", "500"],
        vec!["--action", "checkpoint", "--pid", "1"],
        vec!["--action", "restore", "--pid", "1"],
        vec!["--action", "unlock", "--pid", "1"],
        vec!["--action", "restore", "--pid", "1", "--device-map", &map],
        vec!["--action", "restore", "--pid", "1", "-d", &map],
        vec!["--action", "lock", "--pid", "1", "--device-map", &map],
        vec!["--toggle", "--pid", "1", "--device-map", &map],
        vec!["--launch-job", "/bin/true"],
        vec!["-j", "/bin/true", "-x"],
        vec!["--get-state"],
        vec!["--bogus"],
    ];
    let mut table = String::new();
    for args in cases {
        let fake = Fake::new(generation).lenient();
        let o = run_with(generation, &fake, &args);
        table.push_str(&format!(
            "cuda-checkpoint {}\n  exit {} | out {} | err {} | calls [{}]\n",
            args.join(" "),
            o.code,
            escape(&o.out),
            escape(&o.err),
            fake.calls().join(", ")
        ));
    }
    table
}

#[test]
fn flag_discovery_r550() {
    snapshot!(discovery_table(CliGeneration::R550));
}

#[test]
fn flag_discovery_r555() {
    snapshot!(discovery_table(CliGeneration::R555));
}

#[test]
fn flag_discovery_r580() {
    snapshot!(discovery_table(CliGeneration::R580));
}

#[test]
fn flag_discovery_r590() {
    snapshot!(discovery_table(CliGeneration::R590));
}

// ---------------------------------------------------------------- operations

#[test]
fn get_state_prints_the_state_word() {
    for (st, word) in [
        (CUprocessState::RUNNING, "running\n"),
        (CUprocessState::LOCKED, "locked\n"),
        (CUprocessState::CHECKPOINTED, "checkpointed\n"),
        (CUprocessState::FAILED, "failed\n"),
        (CUprocessState(9), "unknown(9)\n"),
    ] {
        let fake = Fake::new(CliGeneration::R555).in_state(st);
        let o = run_with(CliGeneration::R555, &fake, &["--get-state", "--pid", "77"]);
        assert_eq!((o.code, o.out.as_str(), o.err.as_str()), (0, word, ""));
        assert_eq!(fake.calls(), ["init", "get_state(77)"]);
    }
}

#[test]
fn get_restore_tid_prints_the_tid() {
    let fake = Fake::new(CliGeneration::R580);
    let o = run_with(
        CliGeneration::R580,
        &fake,
        &["--get-restore-tid", "-p", "31"],
    );
    assert_eq!((o.code, o.out.as_str(), o.err.as_str()), (0, "4242\n", ""));
    assert_eq!(fake.calls(), ["init", "get_restore_tid(31)"]);
}

#[test]
fn each_action_calls_its_driver_step_and_prints_nothing() {
    let fake = Fake::new(CliGeneration::R555);
    for (word, call) in [
        ("lock", "lock(9, 0)"),
        ("checkpoint", "checkpoint(9)"),
        ("restore", "restore(9, [])"),
        ("unlock", "unlock(9)"),
    ] {
        fake.calls.borrow_mut().clear();
        let o = run_with(
            CliGeneration::R555,
            &fake,
            &["--action", word, "--pid", "9"],
        );
        assert_eq!(
            (o.code, o.out.as_str(), o.err.as_str()),
            (0, "", ""),
            "{word}"
        );
        assert_eq!(fake.calls(), ["init", call]);
    }
    assert_eq!(fake.state.get(), CUprocessState::RUNNING);
}

#[test]
fn action_failures_use_the_utility_template_and_exit_with_the_code_mod_256() {
    let cases = [
        ("lock", CUresult::ERROR_NOT_READY, 88, "device not ready"),
        (
            "checkpoint",
            CUresult::ERROR_OPERATING_SYSTEM,
            48,
            "OS call failed or operation not supported on this OS",
        ),
        (
            "restore",
            CUresult::ERROR_INVALID_VALUE,
            1,
            "invalid argument",
        ),
        (
            "unlock",
            CUresult::ERROR_ILLEGAL_STATE,
            145,
            "the operation cannot be performed in the present state",
        ),
    ];
    for (word, code, status, text) in cases {
        let fake = Fake::new(CliGeneration::R580).failing(word, code);
        let o = run_with(
            CliGeneration::R580,
            &fake,
            &["--action", word, "--pid", "1234"],
        );
        assert_eq!(o.code, status, "{word}");
        assert_eq!(o.out, "");
        assert_eq!(
            o.err,
            format!("Could not {word} on process ID 1234: \"{text}\"\n")
        );
    }
}

#[test]
fn a_wrong_state_is_the_drivers_illegal_state() {
    let fake = Fake::new(CliGeneration::R555);
    let o = run_with(
        CliGeneration::R555,
        &fake,
        &["--action", "checkpoint", "--pid", "5"],
    );
    assert_eq!(o.code, 145);
    assert_eq!(
        o.err,
        "Could not checkpoint on process ID 5: \"the operation cannot be performed in the present state\"\n"
    );
}

#[test]
fn query_failures_use_their_templates() {
    let fake = Fake::new(CliGeneration::R555).failing("get_state", CUresult::ERROR_INVALID_VALUE);
    let o = run_with(CliGeneration::R555, &fake, &["--get-state", "--pid", "3"]);
    assert_eq!(o.code, 1);
    assert_eq!(o.out, "");
    assert_eq!(
        o.err,
        "Error getting process state for process ID 3: \"invalid argument\"\n"
    );

    let fake =
        Fake::new(CliGeneration::R555).failing("get_restore_tid", CUresult::ERROR_NOT_INITIALIZED);
    let o = run_with(
        CliGeneration::R555,
        &fake,
        &["--get-restore-tid", "--pid", "3"],
    );
    assert_eq!(o.code, 3);
    assert_eq!(
        o.err,
        "Error getting restore thread ID for process ID 3: \"initialization error\"\n"
    );
}

#[test]
fn cuinit_runs_before_every_targeted_operation_and_its_failure_is_reported() {
    for args in [
        &["--get-state", "--pid", "3"][..],
        &["--get-restore-tid", "--pid", "3"],
        &["--toggle", "--pid", "3"],
        &["--action", "lock", "--pid", "3"],
        &["--action", "restore", "--pid", "3"],
    ] {
        let fake = Fake::new(CliGeneration::R555).failing("init", CUresult::ERROR_NO_DEVICE);
        let o = run_with(CliGeneration::R555, &fake, args);
        assert_eq!(o.code, 100, "{args:?}");
        assert_eq!(
            o.err,
            "Error initializing CUDA: \"no CUDA-capable device is detected\"\n"
        );
        assert_eq!(fake.calls(), ["init"], "{args:?}");
    }
}

#[test]
fn unknown_codes_are_quoted_by_number_and_exit_modulo_256() {
    let fake = Fake::new(CliGeneration::R555).failing("lock", CUresult(12345));
    let o = run_with(
        CliGeneration::R555,
        &fake,
        &["--action", "lock", "--pid", "2"],
    );
    assert_eq!(o.code, 12345 % 256);
    assert_eq!(
        o.err,
        "Could not lock on process ID 2: \"unrecognized error code 12345\"\n"
    );
    // Faithful to the utility: a multiple of 256 reaches the shell as 0.
    let fake = Fake::new(CliGeneration::R555).failing("lock", CUresult(512));
    let o = run_with(
        CliGeneration::R555,
        &fake,
        &["--action", "lock", "--pid", "2"],
    );
    assert_eq!(o.code, 0);
    assert!(o.err.starts_with("Could not lock"));
}

// ---------------------------------------------------------------- toggle

#[test]
fn toggle_checkpoints_a_running_process_and_restores_a_checkpointed_one() {
    for g in GENERATIONS {
        let fake = Fake::new(g);
        let o = run_with(g, &fake, &["--toggle", "--pid", "10"]);
        assert_eq!((o.code, o.out.as_str(), o.err.as_str()), (0, "", ""));
        assert_eq!(fake.state.get(), CUprocessState::CHECKPOINTED);
        assert_eq!(
            fake.calls(),
            ["init", "get_state(10)", "lock(10, 0)", "checkpoint(10)"]
        );
        fake.calls.borrow_mut().clear();
        let o = run_with(g, &fake, &["--toggle", "--pid", "10"]);
        assert_eq!((o.code, o.out.as_str(), o.err.as_str()), (0, "", ""));
        assert_eq!(fake.state.get(), CUprocessState::RUNNING);
        assert_eq!(
            fake.calls(),
            ["init", "get_state(10)", "restore(10, [])", "unlock(10)"]
        );
    }
}

#[test]
fn toggle_refuses_locked_and_failed_processes() {
    for st in [
        CUprocessState::LOCKED,
        CUprocessState::FAILED,
        CUprocessState(5),
    ] {
        let fake = Fake::new(CliGeneration::R550).in_state(st);
        let o = run_with(CliGeneration::R550, &fake, &["--toggle", "--pid", "10"]);
        assert_eq!(o.code, 145);
        assert_eq!(
            o.err,
            "Error toggling CUDA in process ID 10: \"the operation cannot be performed in the present state\"\n"
        );
        assert_eq!(fake.calls(), ["init", "get_state(10)"]);
    }
}

#[test]
fn toggle_failures_use_the_toggle_template_without_rollback() {
    let fake = Fake::new(CliGeneration::R555).failing("checkpoint", CUresult::ERROR_OUT_OF_MEMORY);
    let o = run_with(CliGeneration::R555, &fake, &["--toggle", "--pid", "8"]);
    assert_eq!(o.code, 2);
    assert_eq!(
        o.err,
        "Error toggling CUDA in process ID 8: \"out of memory\"\n"
    );
    assert_eq!(
        fake.calls(),
        ["init", "get_state(8)", "lock(8, 0)", "checkpoint(8)"]
    );
    assert_eq!(fake.state.get(), CUprocessState::LOCKED);

    let fake =
        Fake::new(CliGeneration::R555).failing("get_state", CUresult::ERROR_OPERATING_SYSTEM);
    let o = run_with(CliGeneration::R555, &fake, &["--toggle", "--pid", "8"]);
    assert_eq!(o.code, 48);
    assert!(o
        .err
        .starts_with("Error toggling CUDA in process ID 8: \"OS call failed"));
}

// ---------------------------------------------------------------- timeout

#[test]
fn timeout_reaches_lock_and_the_lock_step_of_toggle_only() {
    let fake = Fake::new(CliGeneration::R555).lenient();
    run_with(
        CliGeneration::R555,
        &fake,
        &["--action", "lock", "--pid", "4", "--timeout", "1500"],
    );
    run_with(
        CliGeneration::R555,
        &fake,
        &["--action", "lock", "-p4", "-t0"],
    );
    run_with(
        CliGeneration::R555,
        &fake,
        &["--action=lock", "--pid=4", "--timeout=4294967295"],
    );
    run_with(
        CliGeneration::R555,
        &fake,
        &["--action", "checkpoint", "--pid", "4", "-t", "9"],
    );
    run_with(
        CliGeneration::R555,
        &fake,
        &["--get-state", "--pid", "4", "-t", "9"],
    );
    let strict = Fake::new(CliGeneration::R555);
    run_with(
        CliGeneration::R555,
        &strict,
        &["--toggle", "--pid", "4", "-t", "250"],
    );
    assert_eq!(
        fake.calls(),
        [
            "init",
            "lock(4, 1500)",
            "init",
            "lock(4, 0)",
            "init",
            "lock(4, 4294967295)",
            "init",
            "checkpoint(4)",
            "init",
            "get_state(4)"
        ]
    );
    assert_eq!(strict.calls()[2], "lock(4, 250)");
}

#[test]
fn bad_timeouts_are_usage_errors() {
    for t in ["", "-1", "1.5", "abc", "4294967296", "+3", " 3"] {
        let msg = usage_error(
            CliGeneration::R555,
            &["--action", "lock", "--pid", "1", "--timeout", t],
        );
        assert_eq!(
            msg,
            format!("cuda-checkpoint: invalid timeout '{t}': expected milliseconds, a decimal number from 0 to 4294967295")
        );
    }
    let msg = usage_error(
        CliGeneration::R550,
        &["--toggle", "--pid", "1", "--timeout", "5"],
    );
    assert_eq!(msg, "cuda-checkpoint: unrecognized option '--timeout'");
}

// ---------------------------------------------------------------- device map

#[test]
fn device_map_is_passed_to_restore() {
    let fake = Fake::new(CliGeneration::R580).in_state(CUprocessState::CHECKPOINTED);
    let map = format!("{G1}={G2},{G2}={G1}");
    let o = run_with(
        CliGeneration::R580,
        &fake,
        &["--action", "restore", "--pid", "6", "--device-map", &map],
    );
    assert_eq!((o.code, o.out.as_str(), o.err.as_str()), (0, "", ""));
    assert_eq!(
        fake.calls(),
        ["init".to_owned(), format!("restore(6, [{map}])")]
    );

    let fake = Fake::new(CliGeneration::R590).lenient();
    let inline = format!("-d{G3}={G3}");
    run_with(
        CliGeneration::R590,
        &fake,
        &["-p", "6", &inline, "--action", "restore"],
    );
    assert_eq!(fake.calls()[1], format!("restore(6, [{G3}={G3}])"));
}

#[test]
fn device_map_is_refused_with_other_actions_and_ignored_by_toggle_and_queries() {
    let map = format!("{G1}={G2}");
    for word in ["lock", "checkpoint", "unlock"] {
        let msg = usage_error(
            CliGeneration::R580,
            &["--action", word, "--pid", "1", "--device-map", &map],
        );
        assert_eq!(
            msg,
            "cuda-checkpoint: --device-map is only allowed for restore action"
        );
    }
    let fake = Fake::new(CliGeneration::R580).in_state(CUprocessState::CHECKPOINTED);
    let o = run_with(
        CliGeneration::R580,
        &fake,
        &["--toggle", "--pid", "1", "-d", &map],
    );
    assert_eq!(o.code, 0);
    assert_eq!(
        fake.calls(),
        ["init", "get_state(1)", "restore(1, [])", "unlock(1)"]
    );
    let fake = Fake::new(CliGeneration::R580);
    let o = run_with(
        CliGeneration::R580,
        &fake,
        &["--get-state", "--pid", "1", "-d", &map],
    );
    assert_eq!((o.code, o.out.as_str()), (0, "running\n"));
}

#[test]
fn device_map_needs_r580() {
    let map = format!("{G1}={G2}");
    for g in [CliGeneration::R550, CliGeneration::R555] {
        let msg = usage_error(g, &["--device-map", &map, "--toggle", "--pid", "1"]);
        assert_eq!(msg, "cuda-checkpoint: unrecognized option '--device-map'");
    }
    let msg = usage_error(
        CliGeneration::R555,
        &["--action", "restore", "--pid", "1", "-d", &map],
    );
    assert_eq!(msg, "cuda-checkpoint: unrecognized option '-d'");
}

#[test]
fn device_map_syntax_errors_are_usage_errors() {
    let msg = usage_error(
        CliGeneration::R580,
        &[
            "--action",
            "restore",
            "--pid",
            "1",
            "--device-map",
            "GPU-1=GPU-2",
        ],
    );
    assert!(
        msg.starts_with(
            "cuda-checkpoint: invalid device map 'GPU-1=GPU-2': entry 1: GPU UUID \"GPU-1\""
        ),
        "{msg}"
    );
    let msg = usage_error(
        CliGeneration::R580,
        &["--action", "restore", "--pid", "1", "-d"],
    );
    assert_eq!(msg, "cuda-checkpoint: option '-d' requires an argument");
}

#[test]
fn parse_device_map_accepts_only_full_lowercase_pairs() {
    let one = parse_device_map(&format!("{G1}={G2}")).unwrap();
    assert_eq!(
        one,
        [(GpuUuid::parse(G1).unwrap(), GpuUuid::parse(G2).unwrap())]
    );
    let two = parse_device_map(&format!("{G1}={G2},{G3}={G3}")).unwrap();
    assert_eq!(two.len(), 2);
    // Repeats are for the driver's restore to refuse, not the parser.
    assert_eq!(
        parse_device_map(&format!("{G1}={G2},{G1}={G2}"))
            .unwrap()
            .len(),
        2
    );

    let bad = [
        ("", "the map is empty"),
        (&format!("{G1}={G2},") as &str, "entry 2 is empty"),
        (&format!(",{G1}={G2}"), "entry 1 is empty"),
        (G1, "is not <old-uuid>=<new-uuid>"),
        (&format!("{G1}:{G2}"), "is not <old-uuid>=<new-uuid>"),
        (&format!("{G1}={}", G3.to_uppercase()), "lowercase hex"),
        (&format!("{G1}=GPU-00000000"), "has 12 characters"),
        (
            &format!("{G1}=MIG-00000000-0000-0000-0000-000000000002"),
            "does not start with",
        ),
        (&format!("{G1} ={G2}"), "has 41 characters"),
        (&format!("{G1}={G2}={G2}"), "has 81 characters"),
    ];
    for (text, why) in bad {
        let e = parse_device_map(text).unwrap_err();
        assert!(e.contains(why), "{text:?}: {e}");
    }
}

// ---------------------------------------------------------------- launch-job

#[test]
fn launch_job_is_listed_from_r590_but_not_supported_by_the_mock() {
    let fake = Fake::new(CliGeneration::R590);
    let o = run_with(
        CliGeneration::R590,
        &fake,
        &["--launch-job", "/bin/app", "--pid", "x"],
    );
    assert_eq!(o.code, 33);
    assert_eq!(
        o.err,
        "Error launching job \"/bin/app\" (--launch-job is not implemented by the mock driver): \"operation not supported\"\n"
    );
    assert!(fake.calls().is_empty());
    let inv = parse(
        &argv(&["-j", "prog", "a", "-h", "--", "b"]),
        CliGeneration::R590,
    )
    .unwrap();
    assert_eq!(
        inv.operation,
        Operation::LaunchJob {
            program: "prog".into(),
            args: vec!["a".into(), "-h".into(), "--".into(), "b".into()]
        }
    );
    let inv = parse(&argv(&["-jprog"]), CliGeneration::R590).unwrap();
    assert_eq!(
        inv.operation,
        Operation::LaunchJob {
            program: "prog".into(),
            args: vec![]
        }
    );
    assert_eq!(
        usage_error(CliGeneration::R590, &["--launch-job"]),
        "cuda-checkpoint: option '--launch-job' requires an argument"
    );
    assert_eq!(
        usage_error(
            CliGeneration::R590,
            &["--get-state", "-p", "1", "-j", "prog"]
        ),
        "cuda-checkpoint: only one operation may be given, not both --get-state and --launch-job"
    );
    assert_eq!(
        usage_error(CliGeneration::R580, &["--launch-job", "prog"]),
        "cuda-checkpoint: unrecognized option '--launch-job'"
    );
    assert_eq!(
        usage_error(CliGeneration::R580, &["-j", "prog"]),
        "cuda-checkpoint: unrecognized option '-j'"
    );
}

// ---------------------------------------------------------------- usage

#[test]
fn r550_knows_only_toggle_pid_and_help() {
    let g = CliGeneration::R550;
    let fake = Fake::new(g);
    assert_eq!(run_with(g, &fake, &["--toggle", "--pid", "5"]).code, 0);
    assert_eq!(run_with(g, &fake, &["--pid=5", "--toggle"]).code, 0);
    for (args, opt) in [
        (&["-h"][..], "-h"),
        (&["--toggle", "-p", "5"], "-p"),
        (&["--get-state", "--pid", "5"], "--get-state"),
        (&["--get-restore-tid", "--pid", "5"], "--get-restore-tid"),
        (&["--action", "lock", "--pid", "5"], "--action"),
    ] {
        assert_eq!(
            usage_error(g, args),
            format!("cuda-checkpoint: unrecognized option '{opt}'")
        );
    }
}

#[test]
fn usage_errors_name_the_problem_and_exit_1() {
    let g = CliGeneration::R580;
    let cases: &[(&[&str], &str)] = &[
        (&[], "no operation given"),
        (&["--pid", "5"], "no operation given"),
        (&["--bogus"], "unrecognized option '--bogus'"),
        (&["--bogus=1"], "unrecognized option '--bogus'"),
        (&["-x"], "unrecognized option '-x'"),
        (
            &["-pé"],
            "invalid process ID 'é': expected a positive decimal number",
        ),
        (&["-é"], "unrecognized option '-é'"),
        (
            &["--get-stat", "--pid", "1"],
            "unrecognized option '--get-stat'",
        ),
        (
            &["--GET-STATE", "--pid", "1"],
            "unrecognized option '--GET-STATE'",
        ),
        (&["--get-state"], "--get-state needs --pid <pid>"),
        (&["--action", "lock"], "--action lock needs --pid <pid>"),
        (&["--toggle"], "--toggle needs --pid <pid>"),
        (
            &["--get-restore-tid"],
            "--get-restore-tid needs --pid <pid>",
        ),
        (
            &["--toggle", "--pid"],
            "option '--pid' requires an argument",
        ),
        (&["--toggle", "-p"], "option '-p' requires an argument"),
        (&["--action"], "option '--action' requires an argument"),
        (
            &["--toggle=yes", "--pid", "1"],
            "option '--toggle' doesn't allow an argument",
        ),
        (&["--help=1"], "option '--help' doesn't allow an argument"),
        (
            &["--action", "Lock", "--pid", "1"],
            "unknown action 'Lock': expected lock, checkpoint, restore or unlock",
        ),
        (
            &["--action", "", "--pid", "1"],
            "unknown action '': expected lock, checkpoint, restore or unlock",
        ),
        (
            &["--action", "freeze", "--pid", "1"],
            "unknown action 'freeze': expected lock, checkpoint, restore or unlock",
        ),
        (
            &["--toggle", "--pid", "1", "extra"],
            "unexpected argument 'extra'",
        ),
        (
            &["stray", "--toggle", "--pid", "1"],
            "unexpected argument 'stray'",
        ),
        (&["--toggle", "--pid", "1", "-"], "unexpected argument '-'"),
        (
            &["--toggle", "--pid", "1", "--", "x"],
            "unexpected argument 'x'",
        ),
        (
            &["--toggle", "--get-state", "--pid", "1"],
            "only one operation may be given, not both --toggle and --get-state",
        ),
        (
            &["--action", "lock", "--action", "unlock", "--pid", "1"],
            "only one operation may be given, not both --action lock and --action unlock",
        ),
    ];
    for (args, msg) in cases {
        assert_eq!(
            usage_error(g, args),
            format!("cuda-checkpoint: {msg}"),
            "{args:?}"
        );
    }
}

#[test]
fn bad_pids_are_usage_errors() {
    for p in [
        "",
        "0",
        "-1",
        "+5",
        " 5",
        "5 ",
        "abc",
        "0x10",
        "2147483648",
        "99999999999999999999",
    ] {
        assert_eq!(
            usage_error(CliGeneration::R555, &["--get-state", "--pid", p]),
            format!(
                "cuda-checkpoint: invalid process ID '{p}': expected a positive decimal number"
            )
        );
    }
    let fake = Fake::new(CliGeneration::R555);
    let o = run_with(
        CliGeneration::R555,
        &fake,
        &["--get-state", "--pid", "2147483647"],
    );
    assert_eq!(o.code, 0);
    let o = run_with(CliGeneration::R555, &fake, &["--get-state", "--pid", "007"]);
    assert_eq!(o.code, 0);
    assert_eq!(fake.calls()[3], "get_state(7)");
}

#[test]
fn option_spellings_follow_getopt_long() {
    let g = CliGeneration::R555;
    for args in [
        &["--get-state", "--pid", "12"][..],
        &["--get-state", "--pid=12"],
        &["--get-state", "-p", "12"],
        &["--get-state", "-p12"],
        &["--pid", "12", "--get-state"],
        &["--pid", "3", "--get-state", "--pid", "12"],
        &["--get-state", "--get-state", "-p", "12"],
        &["--get-state", "-p", "12", "--"],
    ] {
        let fake = Fake::new(g);
        let o = run_with(g, &fake, args);
        assert_eq!(
            (o.code, o.out.as_str(), o.err.as_str()),
            (0, "running\n", ""),
            "{args:?}"
        );
        assert_eq!(fake.calls(), ["init", "get_state(12)"], "{args:?}");
    }
    // A value is taken from the next argument even when it looks like an option.
    assert_eq!(
        usage_error(g, &["--get-state", "--pid", "--toggle"]),
        "cuda-checkpoint: invalid process ID '--toggle': expected a positive decimal number"
    );
}

#[test]
fn help_wins_when_reached_and_errors_before_it_win_over_it() {
    let g = CliGeneration::R555;
    for args in [
        &["--help"][..],
        &["-h"],
        &["--toggle", "--help"],
        &["--help", "--bogus"],
        &["-hx"],
        &["-p1", "-h", "stray"],
        &["stray", "-h"],
    ] {
        let fake = Fake::new(g);
        let o = run_with(g, &fake, args);
        assert_eq!(o.code, 0, "{args:?}");
        assert!(
            o.out.starts_with("CUDA checkpoint and restore utility"),
            "{args:?}"
        );
        assert!(fake.calls().is_empty());
    }
    assert_eq!(
        usage_error(g, &["--bogus", "--help"]),
        "cuda-checkpoint: unrecognized option '--bogus'"
    );
    assert_eq!(
        usage_error(g, &["-xh"]),
        "cuda-checkpoint: unrecognized option '-x'"
    );
    assert_eq!(
        usage_error(g, &["--toggle", "--get-state", "-h"]),
        "cuda-checkpoint: only one operation may be given, not both --toggle and --get-state"
    );
}

#[test]
fn an_empty_argv_is_a_usage_error() {
    let fake = Fake::new(CliGeneration::R555);
    let mut out = Vec::new();
    let mut err = Vec::new();
    assert_eq!(
        run(&[], CliGeneration::R555, &fake, &mut out, &mut err),
        EXIT_USAGE
    );
    assert!(String::from_utf8_lossy(&err).contains("no operation given"));
}

/// A writer that always fails.
#[derive(Debug)]
struct Broken;

impl Write for Broken {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "pipe closed",
        ))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Err(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "pipe closed",
        ))
    }
}

#[test]
fn a_broken_output_is_reported_and_exits_1() {
    let fake = Fake::new(CliGeneration::R555);
    let mut err = Vec::new();
    let code = run(
        &argv(&["--get-state", "-p", "1"]),
        CliGeneration::R555,
        &fake,
        &mut Broken,
        &mut err,
    );
    assert_eq!(code, 1);
    assert_eq!(
        String::from_utf8_lossy(&err),
        "cuda-checkpoint: cannot write the output: pipe closed\n"
    );
    // Actions print nothing, so a broken stdout does not matter; a broken stderr is ignored.
    let code = run(
        &argv(&["--action", "lock", "-p", "1"]),
        CliGeneration::R555,
        &fake,
        &mut Broken,
        &mut Broken,
    );
    assert_eq!(code, 0);
    let code = run(
        &argv(&["--bogus"]),
        CliGeneration::R555,
        &fake,
        &mut Broken,
        &mut Broken,
    );
    assert_eq!(code, 1);
}

#[test]
fn fault_keys_name_the_operation_and_target() {
    let g = CliGeneration::R580;
    let key = |args: &[&str]| fault_key(&argv(args), g);
    assert_eq!(
        key(&["--action", "lock", "-p", "5"]),
        (vec!["cuda-checkpoint", "cuda-checkpoint:lock"], Some(5))
    );
    assert_eq!(
        key(&["--action", "checkpoint", "-p", "5"]).0[1],
        "cuda-checkpoint:checkpoint"
    );
    assert_eq!(
        key(&["--action", "restore", "-p", "5"]).0[1],
        "cuda-checkpoint:restore"
    );
    assert_eq!(
        key(&["--action", "unlock", "-p", "5"]).0[1],
        "cuda-checkpoint:unlock"
    );
    assert_eq!(
        key(&["--get-state", "-p", "6"]),
        (
            vec!["cuda-checkpoint", "cuda-checkpoint:get-state"],
            Some(6)
        )
    );
    assert_eq!(
        key(&["--get-restore-tid", "-p", "6"]).0[1],
        "cuda-checkpoint:get-restore-tid"
    );
    assert_eq!(key(&["--toggle", "-p", "6"]).0[1], "cuda-checkpoint:toggle");
    assert_eq!(
        key(&["-h"]),
        (vec!["cuda-checkpoint", "cuda-checkpoint:help"], None)
    );
    assert_eq!(key(&["--bogus"]), (vec!["cuda-checkpoint"], None));
    assert_eq!(
        fault_key(&argv(&["-j", "x"]), CliGeneration::R590).0[1],
        "cuda-checkpoint:launch-job"
    );
    for op in [
        Operation::Help,
        Operation::GetState,
        Operation::GetRestoreTid,
        Operation::Toggle,
        Operation::Action(Action::Lock),
        Operation::Action(Action::Checkpoint),
        Operation::Action(Action::Restore),
        Operation::Action(Action::Unlock),
        Operation::LaunchJob {
            program: String::new(),
            args: vec![],
        },
    ] {
        let inv = Invocation {
            operation: op.clone(),
            pid: None,
            timeout_ms: None,
            device_map: None,
        };
        assert_eq!(
            inv.fault_functions()[1],
            format!("cuda-checkpoint:{}", op.fault_name())
        );
    }
}

// ---------------------------------------------------------------- properties

const VOCABULARY: &[&str] = &[
    "--help",
    "-h",
    "--toggle",
    "--get-state",
    "--get-restore-tid",
    "--action",
    "lock",
    "checkpoint",
    "restore",
    "unlock",
    "--pid",
    "-p",
    "1",
    "42",
    "0",
    "-1",
    "--timeout",
    "-t",
    "500",
    "--device-map",
    "-d",
    "--launch-job",
    "-j",
    "--",
    "-",
    "",
    "--pid=7",
    "-p7",
    "-hp",
    "-pé",
    "=",
    "--=",
    "GPU-00000000-0000-0000-0000-000000000001=GPU-00000000-0000-0000-0000-000000000002",
];

fn arg_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(VOCABULARY).prop_map(str::to_owned),
        1 => "\\PC{0,12}",
        1 => "-{1,2}[a-z=-]{0,10}",
    ]
}

fn generation_strategy() -> impl Strategy<Value = CliGeneration> {
    prop::sample::select(&GENERATIONS[..])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn run_is_total_and_its_status_matches_its_output(
        generation in generation_strategy(),
        args in prop::collection::vec(arg_strategy(), 0..8),
        state in 0u32..7,
        failing in prop::option::of((
            prop::sample::select(&["init", "get_state", "get_restore_tid", "lock", "checkpoint", "restore", "unlock"][..]),
            prop::sample::select(&CUresult::KNOWN[1..]),
        )),
    ) {
        let mut fake = Fake::new(generation).in_state(CUprocessState(state));
        if let Some((m, c)) = failing {
            fake = fake.failing(m, c);
        }
        let mut full = vec!["cuda-checkpoint".to_owned()];
        full.extend(args);
        let mut out = Vec::new();
        let mut err = Vec::new();
        let code = run(&full, generation, &fake, &mut out, &mut err);
        prop_assert!((0..=255).contains(&code));
        // No known failure code is a multiple of 256: success and silence on stderr coincide.
        prop_assert_eq!(code == 0, err.is_empty(), "code {} err {:?}", code, String::from_utf8_lossy(&err));
        if code != 0 {
            prop_assert!(out.is_empty());
        }
        let parsed = parse(&full, generation);
        if parsed.is_err() {
            prop_assert_eq!(code, EXIT_USAGE);
            prop_assert!(fake.calls().is_empty());
        }
    }

    #[test]
    fn device_maps_round_trip(pairs in prop::collection::vec((any::<[u8; 16]>(), any::<[u8; 16]>()), 1..5)) {
        let pairs: Vec<(GpuUuid, GpuUuid)> = pairs.into_iter().map(|(a, b)| (GpuUuid(a), GpuUuid(b))).collect();
        let text = pairs.iter().map(|(a, b)| format!("{a}={b}")).collect::<Vec<_>>().join(",");
        prop_assert_eq!(parse_device_map(&text), Ok(pairs));
    }

    #[test]
    fn parse_device_map_never_panics(s in "\\PC{0,100}") {
        let _ = parse_device_map(&s);
    }
}
