//! Table, JUnit XML, plugin log parsing and the status protocol, on fixed data.

use std::path::PathBuf;
use std::time::Duration;

use zdtm_cuda::plugin_log::{self, HookTiming, Phases};
use zdtm_cuda::report::{self, gbps, CsFiles, Cycle, Outcome, TestResult};
use zdtm_cuda::runner::{self, parse_status, verdict, Backend, CustomStorage, Exit, RunConfig};

const DUMP_LOG: &str = "\
(00.000812) cuda_plugin: init(DUMP): backend driver-api
(00.004000) cuda_plugin: pid 4242: restore thread 4243, initial state running, locked: true
(00.004100) cuda_plugin: PAUSE_DEVICES pid 4242: done in 0.5 ms
(00.350000) cuda_plugin: CHECKPOINT_DEVICES pid 4242: done in 150.0 ms
(00.350100) cuda_plugin: CHECKPOINT_DEVICES pid 4244: done in 50.0 ms
(00.400000) Error (criu/util.c:1): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
";
const RESTORE_LOG: &str = "\
(00.100000) cuda_plugin: RESUME_DEVICES_LATE pid 4242: done in 100.0 ms
(00.100100) cuda_plugin: pid 4242: restored, now running
";

#[test]
fn plugin_lines_parse() {
    assert_eq!(
        plugin_log::parse_line("(00.004100) cuda_plugin: PAUSE_DEVICES pid 4242: done in 0.5 ms"),
        Some(HookTiming {
            hook: "PAUSE_DEVICES".into(),
            pid: 4242,
            ms: 0.5
        })
    );
    for not in [
        "cuda_plugin: pid 4242: checkpointed",
        "cuda_plugin: PAUSE_DEVICES pid x: done in 1 ms",
        "cuda_plugin: PAUSE_DEVICES pid 1: done in fast",
        "other: PAUSE_DEVICES pid 1: done in 1.0 ms",
        "cuda_plugin: init(DUMP) pid 1: done in 1.0 ms",
    ] {
        assert_eq!(plugin_log::parse_line(not), None, "{not}");
    }
    let p = Phases::from_logs(DUMP_LOG, RESTORE_LOG);
    assert_eq!(
        p,
        Phases {
            lock: Some(0.5),
            checkpoint: Some(200.0),
            restore: Some(100.0),
            unlock: None
        }
    );
    let split = Phases::from_logs(
        "",
        "cuda_plugin: RESTORE pid 1: done in 80.0 ms\ncuda_plugin: UNLOCK pid 1: done in 2.0 ms\ncuda_plugin: RESUME_DEVICES_LATE pid 1: done in 83.0 ms\n",
    );
    assert_eq!((split.restore, split.unlock), (Some(80.0), Some(2.0)));
}

#[test]
fn criu_errors_skip_the_rlimit_noise() {
    let log = format!("{DUMP_LOG}(00.5) Error (criu/cr-dump.c:2): Dumping FAILED.\n");
    assert_eq!(
        runner::criu_errors(&log, 5),
        ["(00.5) Error (criu/cr-dump.c:2): Dumping FAILED."]
    );
}

#[test]
fn rates() {
    assert_eq!(gbps(2_000_000_000, 1000.0), Some(2.0));
    assert_eq!(gbps(0, 10.0), None);
    assert_eq!(gbps(10, 0.0), None);
}

#[test]
fn status_protocol() {
    let s = parse_status(
        "INFO: 4 of 4 streams still busy at READY\nREADY bytes=268435456\nINFO: after\nPASS\n",
    );
    assert_eq!(s.ready, Some(268_435_456));
    assert_eq!(s.info, ["4 of 4 streams still busy at READY", "after"]);
    assert_eq!(s.verdict, Some(Outcome::Pass));
    assert_eq!(verdict(&s, Exit::Code(0)), Outcome::Pass);
    assert_eq!(verdict(&s, Exit::Unknown), Outcome::Pass);
    assert!(matches!(verdict(&s, Exit::Code(1)), Outcome::Fail(_)));

    let f = parse_status("READY bytes=1\nFAIL: big buffer after restore: 3 of 9 words differ\n");
    assert_eq!(
        verdict(&f, Exit::Code(1)),
        Outcome::Fail("big buffer after restore: 3 of 9 words differ".into())
    );
    let k = parse_status("SKIP: needs 2 CUDA device(s), found 1\n");
    assert_eq!(k.ready, None);
    assert_eq!(
        verdict(&k, Exit::Code(77)),
        Outcome::Skip("needs 2 CUDA device(s), found 1".into())
    );
    let none = parse_status("READY bytes=5\n");
    assert_eq!(
        verdict(&none, Exit::Signal(9)),
        Outcome::Fail("killed by signal 9 (SIGKILL) without a verdict".into())
    );
    assert_eq!(
        verdict(&none, Exit::Code(3)),
        Outcome::Fail("exited with code 3 without a verdict".into())
    );
}

fn cfg() -> RunConfig {
    RunConfig {
        criu: "/opt/criu".into(),
        libdir: "/opt/plugins".into(),
        backend: Backend::DriverApi,
        bin_dir: PathBuf::new(),
        work_dir: PathBuf::new(),
        leave_running: false,
        repeat: 1,
        device_map: Some(
            "GPU-00000000-0000-0000-0000-000000000001=GPU-00000000-0000-0000-0000-000000000002"
                .into(),
        ),
        keep_images: false,
        cli_options: false,
        mib: None,
        timeout: Duration::from_secs(1),
        env: Vec::new(),
        custom_storage: None,
    }
}

fn words(v: Vec<std::ffi::OsString>) -> String {
    v.iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn criu_command_lines() {
    let mut c = cfg();
    let (img, logs) = (PathBuf::from("/w/img-1"), PathBuf::from("/w"));
    assert_eq!(
        words(runner::dump_args(&c, 42, &img, &logs, "dump-1.log")),
        "dump -t 42 -D /w/img-1 -W /w -L /opt/plugins -v4 -o dump-1.log"
    );
    assert_eq!(
        words(runner::restore_args(&c, &img, &logs, "restore-1.log")),
        "restore -D /w/img-1 -W /w -L /opt/plugins -v4 -o restore-1.log -d"
    );
    assert_eq!(
        runner::plugin_options(&c, false),
        ["cuda_plugin.backend=driver-api"]
    );
    assert_eq!(runner::plugin_options(&c, true).len(), 2);
    c.cli_options = true;
    c.leave_running = true;
    assert_eq!(
        words(runner::dump_args(&c, 42, &img, &logs, "d.log")),
        "dump -t 42 -D /w/img-1 -W /w -L /opt/plugins -v4 -o d.log --plugin-option cuda_plugin.backend=driver-api --leave-running"
    );
    assert!(words(runner::restore_args(&c, &img, &logs, "r.log")).contains(
        "--plugin-option cuda_plugin.device-map=GPU-00000000-0000-0000-0000-000000000001=GPU-00000000-0000-0000-0000-000000000002 -d"
    ));
}

#[test]
fn custom_storage_reaches_dump_and_restore() {
    let mut c = cfg();
    let (img, logs) = (PathBuf::from("/w/img-1"), PathBuf::from("/w"));
    for (cs, opt) in [
        (CustomStorage::On, "cuda_plugin.custom-storage=on"),
        (CustomStorage::Off, "cuda_plugin.custom-storage=off"),
    ] {
        c.custom_storage = Some(cs);
        for restore in [false, true] {
            assert_eq!(runner::plugin_options(&c, restore)[1], opt);
        }
        c.cli_options = true;
        assert!(words(runner::dump_args(&c, 42, &img, &logs, "d.log"))
            .contains(&format!("--plugin-option {opt}")));
        assert!(words(runner::restore_args(&c, &img, &logs, "r.log"))
            .contains(&format!("--plugin-option {opt}")));
        c.cli_options = false;
    }
    c.custom_storage = None;
    assert!(!runner::plugin_options(&c, true)
        .iter()
        .any(|o| o.contains("custom-storage")));
}

#[test]
fn plugin_custom_storage_lines_and_files() {
    let log = "(00.001) cuda_plugin: init(DUMP): backend driver-api\n(00.002) cuda_plugin: custom storage: on (dump 0011): GPU memory goes straight to cuda-cs-*.img\n";
    assert_eq!(
        runner::custom_storage_lines(log),
        ["custom storage: on (dump 0011): GPU memory goes straight to cuda-cs-*.img"]
    );
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("cuda-cs-42-0.img"), [0u8; 8192]).unwrap();
    std::fs::write(d.path().join("cuda-cs-42-1.img"), [0u8; 4096]).unwrap();
    std::fs::write(d.path().join("pages-1.img"), [0u8; 100]).unwrap();
    assert_eq!(
        runner::cs_files(d.path()),
        CsFiles {
            files: 2,
            bytes: 12288
        }
    );
    assert_eq!(runner::cs_files(&d.path().join("none")), CsFiles::default());
}

fn results() -> Vec<TestResult> {
    let cycle = |dump_ms: u64, restore_ms: u64| Cycle {
        criu_dump: Some(Duration::from_millis(dump_ms)),
        criu_restore: Some(Duration::from_millis(restore_ms)),
        phases: Phases::from_logs(DUMP_LOG, RESTORE_LOG),
        cs_files: None,
    };
    vec![
        TestResult {
            name: "cuda00".into(),
            backend: "driver-api".into(),
            custom_storage: None,
            outcome: Outcome::Pass,
            device_bytes: Some(269_500_416),
            cycles: vec![cycle(900, 700), cycle(1100, 900)],
            elapsed: Duration::from_millis(4321),
            log_dir: Some("/w/driver-api/cuda00".into()),
            notes: vec!["INFO: cuBLAS <none> & \"quotes\"".into()],
        },
        TestResult {
            name: "cuda_streams00".into(),
            backend: "driver-api".into(),
            custom_storage: None,
            outcome: Outcome::Fail(
                "after restore, round 0: stream 2: word 7 is 0x00000001, expected 0x00000002 <&>"
                    .into(),
            ),
            device_bytes: Some(67_108_896),
            cycles: vec![cycle(1000, 800)],
            elapsed: Duration::from_millis(2500),
            log_dir: Some("/w/driver-api/cuda_streams00".into()),
            notes: vec!["control \u{1} char".into()],
        },
        TestResult {
            name: "cuda_graph00".into(),
            backend: "driver-api".into(),
            custom_storage: Some("on".into()),
            outcome: Outcome::Pass,
            device_bytes: Some(1_073_741_824),
            cycles: vec![Cycle {
                cs_files: Some(CsFiles {
                    files: 1,
                    bytes: 1_073_762_304,
                }),
                ..cycle(500, 400)
            }],
            elapsed: Duration::from_millis(1500),
            log_dir: Some("/w/driver-api/custom-storage-on/cuda_graph00".into()),
            notes: vec!["plugin (dump): custom storage: on (dump 00ff): GPU memory goes straight to cuda-cs-*.img".into()],
        },
        TestResult {
            name: "cuda_graph00".into(),
            backend: "driver-api".into(),
            custom_storage: Some("off".into()),
            outcome: Outcome::Pass,
            device_bytes: Some(1_073_741_824),
            cycles: vec![Cycle {
                cs_files: Some(CsFiles::default()),
                ..cycle(1000, 800)
            }],
            elapsed: Duration::from_millis(2500),
            log_dir: Some("/w/driver-api/custom-storage-off/cuda_graph00".into()),
            notes: Vec::new(),
        },
        TestResult {
            name: "cuda_zerocopy00".into(),
            backend: "driver-api".into(),
            custom_storage: Some("on".into()),
            outcome: Outcome::Skip("custom storage needs a CUDA 13.4 driver; this one reports 13.0".into()),
            device_bytes: None,
            cycles: Vec::new(),
            elapsed: Duration::ZERO,
            log_dir: None,
            notes: Vec::new(),
        },
        TestResult {
            name: "cuda_multigpu00".into(),
            backend: "cuda-checkpoint".into(),
            custom_storage: None,
            outcome: Outcome::Skip("needs 2 GPUs, this machine has 1".into()),
            device_bytes: None,
            cycles: Vec::new(),
            elapsed: Duration::ZERO,
            log_dir: None,
            notes: Vec::new(),
        },
    ]
}

#[test]
fn table_snapshot() {
    insta::assert_snapshot!(report::table(&results()));
}

#[test]
fn junit_snapshot() {
    insta::assert_snapshot!(report::junit(&results()));
}

#[test]
fn junit_is_well_formed() {
    let x = report::junit(&results());
    check_xml(&x);
    check_xml(&report::junit(&[]));
    assert!(x.contains("tests=\"6\" failures=\"1\" errors=\"0\" skipped=\"2\""));
    for case in [
        "name=\"cuda_graph00[custom-storage=on]\"",
        "name=\"cuda_graph00[custom-storage=off]\"",
        "<skipped message=\"custom storage needs a CUDA 13.4 driver; this one reports 13.0\"/>",
        "<property name=\"cs_bytes\" value=\"1073762304\"/>",
    ] {
        assert!(x.contains(case), "{case} missing from\n{x}");
    }
}

#[test]
fn the_table_puts_custom_storage_on_and_off_side_by_side() {
    let t = report::table(&results());
    assert!(
        t.contains("SKIP cuda_zerocopy00[custom-storage=on] (driver-api): custom storage needs a CUDA 13.4 driver; this one reports 13.0"),
        "{t}"
    );
    let row = t
        .lines()
        .find(|l| l.starts_with("cuda_graph00 ") && l.contains("driver-api"))
        .unwrap_or_else(|| panic!("no side-by-side row in\n{t}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    // TEST BACKEND ON OFF DEV CS-FILES CS-MiB DUMP(on off) GB/s(on off) RESTORE(on off) GB/s(on off)
    assert_eq!(
        cols,
        [
            "cuda_graph00",
            "driver-api",
            "PASS",
            "PASS",
            "1024.0",
            "1",
            "1024.0",
            "500",
            "1000",
            "2.15",
            "1.07",
            "400",
            "800",
            "2.68",
            "1.34"
        ]
    );
    assert_eq!(report::custom_storage_table(&results()[..2]), "");
}

/// A small well-formedness check: one root, balanced tags, quoted attributes, only the five
/// predefined entities and numeric references, no raw `<` or control characters in text.
fn check_xml(x: &str) {
    let body = x
        .strip_prefix("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n")
        .expect("XML declaration");
    let mut stack: Vec<String> = Vec::new();
    let mut roots = 0;
    let mut rest = body;
    while let Some(i) = rest.find('<') {
        check_text(&rest[..i]);
        let end = rest[i..].find('>').expect("unterminated tag") + i;
        let tag = &rest[i + 1..end];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name), "mismatched </{name}>");
        } else {
            let self_closing = tag.ends_with('/');
            let tag = tag.trim_end_matches('/');
            let name = tag.split_whitespace().next().expect("tag name");
            assert!(name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
            let mut attrs = tag[name.len()..].trim();
            while !attrs.is_empty() {
                let eq = attrs.find("=\"").expect("attribute with a quoted value");
                let close = attrs[eq + 2..].find('"').expect("closing quote") + eq + 2;
                check_text(&attrs[eq + 2..close]);
                attrs = attrs[close + 1..].trim_start();
            }
            if stack.is_empty() {
                roots += 1;
            }
            if !self_closing {
                stack.push(name.to_owned());
            }
        }
        rest = &rest[end + 1..];
    }
    check_text(rest);
    assert!(stack.is_empty(), "unclosed {stack:?}");
    assert_eq!(roots, 1);
}

fn check_text(t: &str) {
    assert!(!t.contains('<'), "raw < in {t:?}");
    assert!(
        t.chars()
            .all(|c| c >= ' ' || matches!(c, '\t' | '\n' | '\r')),
        "control character in {t:?}"
    );
    let mut s = t;
    while let Some(i) = s.find('&') {
        let semi = s[i..].find(';').expect("unterminated entity") + i;
        let ent = &s[i + 1..semi];
        assert!(
            matches!(ent, "amp" | "lt" | "gt" | "quot" | "apos")
                || ent
                    .strip_prefix('#')
                    .is_some_and(|n| n.chars().all(|c| c.is_ascii_digit())),
            "bad entity &{ent};"
        );
        s = &s[semi + 1..];
    }
}
