//! Cost of one lock + checkpoint + restore + unlock cycle of a mock workload, through the
//! driver API and through the `cuda-checkpoint` utility, for a workload woken by its mailbox's
//! doorbell and for one that polls its mailbox (`MOCK_CUDA_MAILBOX=poll`), measured side by
//! side in one run with interleaved rounds.
//!
//! `cargo bench -p mock-libcuda --bench cycle [-- --rounds N --kib K]`
//!
//! The utility is taken from `$CUDA_CHECKPOINT`, else `target/<profile>/cuda-checkpoint`
//! (built with `cargo build -p fake-cuda-checkpoint` of the same profile if missing).

use abi::CUprocessState;
use mock_libcuda::driver;
use mock_libcuda::world::config::WorldConfig;
use mock_libcuda::world::World;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn profile_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mock-cuda-app"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn cuda_checkpoint() -> PathBuf {
    if let Some(p) = std::env::var_os("CUDA_CHECKPOINT") {
        return PathBuf::from(p);
    }
    let p = profile_dir().join("cuda-checkpoint");
    if !p.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let release = profile_dir().ends_with("release");
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "fake-cuda-checkpoint"]);
        if release {
            cmd.arg("--release");
        }
        assert!(
            cmd.status().expect("running cargo").success(),
            "building cuda-checkpoint"
        );
    }
    p
}

fn stats(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[0], v[v.len() / 2])
}

fn cli(bin: &Path, world: &Path, args: &[&str]) {
    let st = Command::new(bin)
        .args(args)
        .env("MOCK_CUDA_WORLD", world)
        .env("LD_LIBRARY_PATH", world.join("lib"))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "cuda-checkpoint {args:?} failed: {st}");
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this as a smoke test.
    let benching = std::env::args().any(|a| a == "--bench");
    let rounds = arg("--rounds", if benching { 30 } else { 2 }) as usize;
    let kib = arg("--kib", 1024);
    let dir = tempfile::tempdir().unwrap();
    let text = "schema = 1\n[driver]\nbranch = 580\n[[gpu]]\nuuid = \"GPU-00000000-0000-4000-8000-000000000000\"\nname = \"bench\"\nmemory_mib = 4096\nchip = \"GH100\"\n";
    let cfg = WorldConfig::parse(text, "bench").unwrap();
    let so = profile_dir().join("deps").join("libmock_libcuda.so");
    let world = World::create(dir.path(), &cfg, &so).unwrap();
    std::env::set_var("MOCK_CUDA_WORLD", world.dir());
    // Two workloads side by side: one whose restore thread is woken by the mailbox's doorbell
    // (the default), one that polls its mailbox every millisecond (`MOCK_CUDA_MAILBOX=poll`).
    let mut apps = Vec::new();
    for mode in ["futex", "poll"] {
        let report = dir.path().join(format!("report-{mode}.txt"));
        let app = Command::new(env!("CARGO_BIN_EXE_mock-cuda-app"))
            .args(["--kib", &kib.to_string(), "--report"])
            .arg(&report)
            .env("MOCK_CUDA_WORLD", world.dir())
            .env("LD_LIBRARY_PATH", world.dir().join("lib"))
            .env(mock_libcuda::target::MAILBOX_ENV, mode)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        while !std::fs::read_to_string(&report)
            .unwrap_or_default()
            .contains("READY")
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        apps.push((mode, app, report));
    }
    driver::init(0).unwrap();
    let bin = cuda_checkpoint();
    // [mode][path]: path 0 = driver API, 1 = cuda-checkpoint.
    let mut samples: [[Vec<Duration>; 2]; 2] = Default::default();
    for round in 0..rounds {
        let run_api = |pid: i32| {
            let t = Instant::now();
            driver::lock(pid, 10_000).unwrap();
            driver::checkpoint(pid).unwrap();
            driver::restore(pid, &[]).unwrap();
            driver::unlock(pid).unwrap();
            t.elapsed()
        };
        let run_cli = |pid: i32| {
            let p = pid.to_string();
            let t = Instant::now();
            for a in [
                ["--action", "lock"],
                ["--action", "checkpoint"],
                ["--action", "restore"],
                ["--action", "unlock"],
            ] {
                cli(&bin, world.dir(), &[a[0], a[1], "--pid", &p]);
            }
            t.elapsed()
        };
        // Rotate the order of the four (mode, path) pairs, so drift and warm-up hit all alike.
        for k in 0..4 {
            let slot = (k + round) % 4;
            let (m, path) = (slot / 2, slot % 2);
            let pid = apps[m].1.id() as i32;
            let took = if path == 0 {
                run_api(pid)
            } else {
                run_cli(pid)
            };
            samples[m][path].push(took);
            assert_eq!(driver::get_state(pid), Ok(CUprocessState::RUNNING));
        }
    }
    for (mode, mut app, report) in apps {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(app.id() as i32),
            nix::sys::signal::Signal::SIGUSR1,
        );
        // The workload answers when it gets to it: wait for its verdict (bounded), not a fixed
        // while (200 ms was too short on a loaded 2-core runner).
        let asked = std::time::Instant::now();
        let mut verdict = String::new();
        while asked.elapsed() < Duration::from_secs(20) {
            verdict = std::fs::read_to_string(&report).unwrap_or_default();
            if verdict.contains("PASS") || verdict.contains("FAIL") {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = app.kill();
        let _ = app.wait();
        assert!(
            verdict.contains("PASS"),
            "the {mode} workload's data must survive every cycle: {verdict}"
        );
    }
    let [[api, util], [api_poll, util_poll]] = samples;
    let (pmin, pmed) = stats(api_poll);
    let (qmin, qmed) = stats(util_poll);
    let (amin, amed) = stats(api);
    let (cmin, cmed) = stats(util);
    println!(
        "lock+checkpoint+restore+unlock of a {kib} KiB mock workload, {rounds} interleaved rounds"
    );
    println!("{:<26} {:>10} {:>10}", "path", "min", "median");
    println!(
        "{:<26} {:>10.2?} {:>10.2?}",
        "driver API (in process)", amin, amed
    );
    println!(
        "{:<26} {:>10.2?} {:>10.2?}",
        "cuda-checkpoint (4 runs)", cmin, cmed
    );
    println!(
        "{:<26} {:>10.2?} {:>10.2?}",
        "driver API, polled mailbox", pmin, pmed
    );
    println!(
        "{:<26} {:>10.2?} {:>10.2?}",
        "cuda-checkpoint, polled", qmin, qmed
    );
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "ratio cuda-checkpoint / API (median): {:.1}x",
        ratio(cmed, amed)
    );
    println!(
        "ratio polled / doorbell mailbox (median): API {:.1}x, cuda-checkpoint {:.1}x",
        ratio(pmed, amed),
        ratio(qmed, cmed)
    );
}
