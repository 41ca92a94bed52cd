//! The runner's CRIU choreography against real CRIU (4.x from target/criu, as fetched by
//! scripts/fetch-criu.sh) with a CPU-only stand-in workload that speaks the zdtm-cuda protocol:
//! dump, reap, restore (re-parented to the subreaper runner), SIGUSR1, verdict; repeated cycles;
//! --leave-running; a failing verdict. No plugin and no GPU are involved. Reported as ignored,
//! with the reason, when not root or no CRIU 4.x is present, and failed instead when
//! `CRIU_CUDA_REQUIRE_CRIU=1` (as CI sets it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use zdtm_cuda::detect::{self, Probe};
use zdtm_cuda::report::Outcome;
use zdtm_cuda::runner::{self, Backend, RunConfig};
use zdtm_cuda::workloads::Workload;

/// Keeps a pattern in memory across the checkpoint; `FAKE_FAIL=1` makes it fail the check.
const FAKE: &str = r#"
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static const char *st;
static void line(const char *s) {
    FILE *f = fopen(st, "a"); fprintf(f, "%s\n", s); fclose(f); printf("%s\n", s); fflush(stdout);
}
int main(int argc, char **argv) {
    if (argc != 3 || strcmp(argv[1], "--status") != 0) return 2;
    st = argv[2];
    sigset_t set; sigemptyset(&set); sigaddset(&set, SIGUSR1); sigprocmask(SIG_BLOCK, &set, NULL);
    static unsigned buf[1 << 16];
    for (unsigned i = 0; i < 1 << 16; i++) buf[i] = i * 2654435761u;
    line("INFO: fake workload");
    line("READY bytes=262144");
    for (int waited = 0; waited < 120;) {
        struct timespec ts = {1, 0};
        int s = sigtimedwait(&set, NULL, &ts);
        if (s == SIGUSR1) break;
        if (s < 0 && errno == EAGAIN) waited++;
    }
    if (getenv("FAKE_FAIL")) buf[7] ^= 1;
    for (unsigned i = 0; i < 1 << 16; i++)
        if (buf[i] != i * 2654435761u) { line("FAIL: word 7 changed"); return 1; }
    line("PASS");
    return 0;
}
"#;

fn criu() -> Result<PathBuf, String> {
    let probe = Probe::system(
        std::env::var_os(criu_cuda_env::CRIU_4_1).map(PathBuf::from),
        None,
    );
    detect::detect(&probe).criu.map(|c| c.path)
}

fn build_fake(dir: &Path) -> PathBuf {
    let src = dir.join("fake.c");
    std::fs::write(&src, FAKE).unwrap();
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let out = bin.join("fake00");
    let s = Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap();
    assert!(s.success());
    bin
}

const FAKE_WORKLOAD: Workload = Workload {
    name: "fake00",
    summary: "CPU-only stand-in",
    source: "",
    min_gpus: 0,
    needs_cublas: false,
};

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let require = criu_cuda_env::is_on(criu_cuda_env::REQUIRE_CRIU);
    let missing = if nix::unistd::geteuid().is_root() {
        criu().err()
    } else {
        Some("not root (CRIU needs root)".to_owned())
    };
    let trial = match missing {
        None => libtest_mimic::Trial::test("runner_drives_real_criu", || {
            let criu = criu().map_err(libtest_mimic::Failed::from)?;
            runner_drives_real_criu(criu);
            Ok(())
        }),
        Some(why) if require => libtest_mimic::Trial::test("runner_drives_real_criu", move || {
            Err(format!("{why}, and CRIU_CUDA_REQUIRE_CRIU=1").into())
        }),
        Some(why) => libtest_mimic::Trial::ignorable_test("runner_drives_real_criu", move || {
            Ok(libtest_mimic::Completion::ignored_with(why))
        }),
    };
    libtest_mimic::run(&args, vec![trial]).exit();
}

fn runner_drives_real_criu(criu: PathBuf) {
    runner::become_subreaper().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = build_fake(dir.path());
    let libdir = dir.path().join("plugins");
    std::fs::create_dir_all(&libdir).unwrap();
    let cfg = RunConfig {
        criu,
        libdir,
        backend: Backend::DriverApi,
        bin_dir,
        work_dir: dir.path().join("work"),
        leave_running: false,
        repeat: 1,
        device_map: None,
        keep_images: true,
        cli_options: false,
        mib: None,
        timeout: Duration::from_secs(60),
        env: Vec::new(),
        custom_storage: None,
    };

    let r = runner::run_one(&cfg, &FAKE_WORKLOAD);
    assert_eq!(r.outcome, Outcome::Pass, "{r:#?}");
    assert_eq!(r.device_bytes, Some(262_144));
    assert_eq!(r.cycles.len(), 1);
    assert!(r.cycles[0].criu_dump.is_some() && r.cycles[0].criu_restore.is_some());
    assert_eq!(r.notes, ["INFO: fake workload"]);
    let logs = dir.path().join("work/driver-api/fake00");
    assert!(logs.join("dump-1.log").is_file() && logs.join("restore-1.log").is_file());
    assert!(!logs.join("img-1").exists(), "images of a pass are removed");

    let r = runner::run_one(
        &RunConfig {
            repeat: 3,
            ..cfg.clone()
        },
        &FAKE_WORKLOAD,
    );
    assert_eq!(r.outcome, Outcome::Pass, "{r:#?}");
    assert_eq!(r.cycles.len(), 3);

    let r = runner::run_one(
        &RunConfig {
            leave_running: true,
            ..cfg.clone()
        },
        &FAKE_WORKLOAD,
    );
    assert_eq!(r.outcome, Outcome::Pass, "{r:#?}");
    assert!(r.cycles[0].criu_restore.is_none());

    let failing = RunConfig {
        env: vec![("FAKE_FAIL".into(), "1".into())],
        ..cfg.clone()
    };
    let r = runner::run_one(&failing, &FAKE_WORKLOAD);
    assert_eq!(r.outcome, Outcome::Fail("word 7 changed".into()));
    assert!(
        logs.join("img-1").is_dir(),
        "images of a failure are kept with keep_images"
    );

    // A dump that cannot work: a plugin directory holding a broken "plugin".
    let bad = dir.path().join("badplugins");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("broken.so"), "not an ELF").unwrap();
    let r = runner::run_one(&RunConfig { libdir: bad, ..cfg }, &FAKE_WORKLOAD);
    match &r.outcome {
        Outcome::Fail(why) => assert!(why.starts_with("criu dump (cycle 1) failed"), "{why}"),
        o => panic!("{o:?}"),
    }
}
