//! The mock world at scale: virtual device memory of tens of GiB, checkpoint and restore that
//! take the time their bytes need (and share links), progress while they run, host memory that
//! can run out, GPUs too small for a restore, and kernels a lock waits for.
//!
//! Timing assertions compare with the modelled time (a lower bound: the model cannot be
//! absent) and with each other (ratios), with upper bounds generous enough for a loaded
//! two-core machine; `time_scale` keeps every test well under two seconds of transfers.

mod common;

use abi::{CUprocessState, CUresult, GpuUuid};
use common::*;
use mock_libcuda::driver;
use mock_libcuda::world::config::WorldConfig;
use mock_libcuda::world::World;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};
use testkit::read;
use testkit::world::{GPU0, GPU1, GPU2};

const GIB: u64 = 1 << 30;

/// A world with three H100-like GPUs (GPU2 has `small_gib`), the given `[rates]` keys and
/// extra TOML.
fn world(rates: &str, small_gib: u64, extra: &str) -> String {
    format!(
        r#"schema = 1
[driver]
branch = 580
request_timeout_ms = 1500
[rates]
{rates}
{extra}
[[gpu]]
uuid = "{GPU0}"
name = "NVIDIA H100 80GB HBM3"
memory_mib = 81920
chip = "GH100"
[[gpu]]
uuid = "{GPU1}"
name = "NVIDIA H100 80GB HBM3"
memory_mib = 81920
chip = "GH100"
[[gpu]]
uuid = "{GPU2}"
name = "NVIDIA H100 80GB HBM3"
memory_mib = {}
chip = "GH100"
"#,
        small_gib * 1024
    )
}

fn uuid(s: &str) -> GpuUuid {
    GpuUuid::parse(s).unwrap()
}

/// Modelled seconds of `bytes` at `gbps`, as wall-clock time at `scale`.
fn modelled(bytes: u64, gbps: f64, scale: f64) -> Duration {
    Duration::from_secs_f64(bytes as f64 / (gbps * 1e9) / scale)
}

/// Runs `f` and returns its result with the time it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed())
}

#[test]
fn an_80_gib_task_checkpoints_in_its_modelled_time_with_progress_and_verifies() {
    let _s = serial();
    // 80 GiB at the driver path's 6 GB/s is 14.3 s; scaled by 40: 358 ms each way.
    let scale = 40.0;
    let mut w = TestWorld::new(&world("time_scale = 40", 80, ""));
    let pid = w.spawn_app(&["--gpus", "0", "--gib", "80"]);
    let state = w.world.read_state().unwrap();
    let (id, e) = state.by_pid(pid).unwrap();
    let a = &e.allocations[0];
    assert_eq!(a.size, 80 * GIB, "accounted at its full size");
    assert!(a.sampled, "an 80 GiB allocation is virtual");
    let stored = std::fs::metadata(w.path().join("devmem").join(format!("{id}-{}.bin", a.id)))
        .unwrap()
        .len();
    assert!(
        stored < 64 * 1024,
        "the world stores a sample ({stored} bytes)"
    );

    driver::init(0).unwrap();
    driver::lock(pid, 0).unwrap();
    let want = modelled(80 * GIB, 6.0, scale);
    let world_dir = w.path().to_path_buf();
    let watcher = std::thread::spawn(move || {
        // Progress while the call runs: bytes moved and staged grow, short of the total.
        let world = World::open(&world_dir).unwrap();
        let mut seen = Vec::new();
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Some(t) = world.transfers().into_iter().find(|t| t.pid == pid) {
                seen.push((t.moved(), t.staged(), t.total()));
            } else if !seen.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        seen
    });
    let (r, took) = timed(|| driver::checkpoint(pid));
    r.unwrap();
    let seen = watcher.join().unwrap();
    assert!(took >= want.mul_f64(0.95), "{took:?} < modelled {want:?}");
    assert!(
        took < want * 4 + Duration::from_secs(1),
        "{took:?} ≫ {want:?}"
    );
    assert!(
        seen.iter()
            .any(|&(moved, staged, total)| moved > 0 && moved < total && staged == moved),
        "no progress seen mid-transfer: {seen:?}"
    );
    assert!(
        seen.windows(2).all(|p| p[0].0 <= p[1].0),
        "progress only grows: {seen:?}"
    );
    let st = w.world.read_state().unwrap();
    let e = st.by_pid(pid).unwrap().1;
    assert_eq!(e.state(), CUprocessState::CHECKPOINTED);
    assert_eq!(e.checkpointed[0].bytes, 80 * GIB);

    let (r, took) = timed(|| driver::restore(pid, &[]));
    r.unwrap();
    assert!(
        took >= want.mul_f64(0.95),
        "restore {took:?} < modelled {want:?}"
    );
    driver::unlock(pid).unwrap();
    let line = w.verify(0, pid);
    assert!(line.starts_with("PASS") && line.contains(GPU0), "{line}");
}

#[test]
fn two_checkpoints_on_one_gpu_share_its_link_and_on_two_gpus_overlap() {
    let _s = serial();
    // The link (6 GB/s) is as fast as the driver path: alone, a task gets 6 GB/s; two on one
    // GPU get 3 each; two on two GPUs get 6 each. 12 GiB at 6 GB/s scaled by 8: 268 ms.
    let mut w = TestWorld::new(&world(
        "driver_gbps = 6.0\nlink_gbps = 6.0\nhost_gbps = 100.0\ntime_scale = 8",
        80,
        "",
    ));
    let gib = "12";
    let one = modelled(12 * GIB, 6.0, 8.0);
    let alone = w.spawn_app(&["--gpus", "0", "--gib", gib]);
    let a = w.spawn_app(&["--gpus", "0", "--gib", gib]);
    let b = w.spawn_app(&["--gpus", "0", "--gib", gib]);
    let c = w.spawn_app(&["--gpus", "1", "--gib", gib]);
    let d = w.spawn_app(&["--gpus", "2", "--gib", gib]);
    for p in [alone, a, b, c, d] {
        driver::lock(p, 0).unwrap();
    }
    let both = |x: i32, y: i32| {
        let tx = std::thread::spawn(move || timed(|| driver::checkpoint(x)));
        let ty = std::thread::spawn(move || timed(|| driver::checkpoint(y)));
        let (rx, dx) = tx.join().unwrap();
        let (ry, dy) = ty.join().unwrap();
        assert_eq!((rx, ry), (Ok(()), Ok(())), "after {dx:?} and {dy:?}");
        dx.max(dy)
    };
    let (r, t_alone) = timed(|| driver::checkpoint(alone));
    r.unwrap();
    let t_same = both(a, b);
    let t_apart = both(c, d);
    assert!(t_alone >= one.mul_f64(0.95), "{t_alone:?} < {one:?}");
    assert!(
        t_same >= (one * 2).mul_f64(0.95),
        "{t_same:?} < {:?}",
        one * 2
    );
    let same = t_same.as_secs_f64() / t_alone.as_secs_f64();
    let apart = t_apart.as_secs_f64() / t_alone.as_secs_f64();
    eprintln!(
        "checkpoint of 12 GiB, modelled {one:?}: alone {t_alone:?}, two on one GPU {t_same:?} ({same:.2}×), two on two GPUs {t_apart:?} ({apart:.2}×)"
    );
    assert!(
        (1.6..2.8).contains(&same),
        "two on one link: {t_same:?} vs {t_alone:?} alone ({same:.2}×)"
    );
    assert!(
        (0.85..1.45).contains(&apart),
        "two on two GPUs overlap: {t_apart:?} vs {t_alone:?} alone ({apart:.2}×)"
    );
}

#[test]
fn a_restore_onto_a_gpu_without_room_fails_out_of_memory_and_keeps_the_checkpoint() {
    let _s = serial();
    let text = world("time_scale = 1000", 40, "");
    let mut w = TestWorld::new(&text);
    let pid = w.spawn_app(&["--gpus", "0", "--gib", "60"]);
    // A neighbour on the big target GPU leaves it 30 GiB.
    let neighbour = w.spawn_app(&["--gpus", "1", "--gib", "50"]);
    driver::init(0).unwrap();
    driver::lock(pid, 0).unwrap();
    driver::checkpoint(pid).unwrap();
    for target in [GPU2, GPU1] {
        assert_eq!(
            driver::restore(pid, &[(uuid(GPU0), uuid(target))]),
            Err(CUresult::ERROR_OUT_OF_MEMORY),
            "60 GiB onto {target}"
        );
        assert_eq!(driver::get_state(pid), Ok(CUprocessState::CHECKPOINTED));
    }
    let st = w.world.read_state().unwrap();
    assert!(
        st.by_pid(pid).unwrap().1.reserved.is_empty(),
        "a failed restore claims nothing"
    );
    assert_eq!(st.resident_bytes(uuid(GPU1), None), 50 * GIB);

    // The same world with a bigger GPU2: the checkpoint is intact and restores onto it.
    let bigger = WorldConfig::parse(&world("time_scale = 1000", 80, ""), "bigger").unwrap();
    World::reconfigure(w.path(), &bigger, None).unwrap();
    driver::restore(pid, &[(uuid(GPU0), uuid(GPU2))]).unwrap();
    driver::unlock(pid).unwrap();
    let line = w.verify(0, pid);
    assert!(line.starts_with("PASS") && line.contains(GPU2), "{line}");
    assert!(w.verify(1, neighbour).starts_with("PASS"));
}

#[test]
fn a_checkpoint_that_does_not_fit_in_host_memory_is_oom_killed() {
    let _s = serial();
    // 48 GiB of host memory: the first 30 GiB checkpoint fits, the second is killed once it
    // has staged the 18 GiB left (18 GiB at 6 GB/s scaled by 50: 64 ms).
    let mut w = TestWorld::new(&world("time_scale = 50", 80, "[host]\nmemory_gib = 48"));
    let first = w.spawn_app(&["--gpus", "0", "--gib", "30"]);
    let second = w.spawn_app(&["--gpus", "1", "--gib", "30"]);
    driver::lock(first, 0).unwrap();
    driver::checkpoint(first).unwrap();
    driver::lock(second, 0).unwrap();
    let (r, took) = timed(|| driver::checkpoint(second));
    assert_eq!(
        r,
        Err(CUresult::ERROR_OPERATING_SYSTEM),
        "the caller sees its target die under the call"
    );
    let until_full = modelled(18 * GIB, 6.0, 50.0);
    assert!(
        took >= until_full.mul_f64(0.9),
        "killed when the host filled up: {took:?} < {until_full:?}"
    );
    let status = w.wait(1);
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert_eq!(
        driver::get_state(second),
        Err(CUresult::ERROR_INVALID_VALUE)
    );
    assert!(
        w.world.transfers().is_empty(),
        "the dead transfer left no trace"
    );
    // The first one is untouched and comes back.
    driver::init(0).unwrap();
    driver::restore(first, &[]).unwrap();
    driver::unlock(first).unwrap();
    assert!(w.verify(0, first).starts_with("PASS"));
}

#[test]
fn a_checkpoint_longer_than_the_request_timeout_is_waited_for() {
    let _s = serial();
    // 8 GiB at 6 GB/s scaled by 1.6: 895 ms, half as long again as the 600 ms request timeout.
    let text = world("time_scale = 1.6", 80, "")
        .replace("request_timeout_ms = 1500", "request_timeout_ms = 600");
    let mut w = TestWorld::new(&text);
    let pid = w.spawn_app(&["--gpus", "0", "--gib", "8"]);
    driver::lock(pid, 0).unwrap();
    let (r, took) = timed(|| driver::checkpoint(pid));
    r.unwrap();
    assert!(
        took >= modelled(8 * GIB, 6.0, 1.6).mul_f64(0.95),
        "{took:?}"
    );
    // A stopped target makes no progress: the caller gives up (its restore has not finished).
    driver::init(0).unwrap();
    let p = nix::unistd::Pid::from_raw(pid);
    let restore = std::thread::spawn(move || driver::restore(pid, &[]));
    std::thread::sleep(Duration::from_millis(150));
    nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let r = restore.join().unwrap();
    let st = driver::get_state(pid);
    nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert_eq!(r, Err(CUresult::ERROR_TIMEOUT));
    assert_eq!(st, Ok(CUprocessState::CHECKPOINTED));
}

#[test]
fn a_lock_waits_for_a_kernel_in_flight() {
    let _s = serial();
    let mut w = TestWorld::new(&world("", 80, ""));
    let pid = w.spawn_app(&["--gpus", "0", "--kib", "16", "--kernel-ms", "400"]);
    // The kernel thread keeps a call in the gate almost all the time.
    std::thread::sleep(Duration::from_millis(50));
    let (r, took) = timed(|| driver::lock(pid, 100));
    assert_eq!(r, Err(CUresult::ERROR_NOT_READY), "after {took:?}");
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::RUNNING));
    let (r, took) = timed(|| driver::lock(pid, 0));
    r.unwrap();
    assert!(took < Duration::from_millis(400 + 500), "{took:?}");
    driver::unlock(pid).unwrap();
    assert!(w.verify(0, pid).starts_with("PASS"));
}

#[test]
fn virtual_memory_is_enforced_against_capacity_and_small_tasks_stay_real() {
    let _s = serial();
    let mut w = TestWorld::new(&world("", 40, ""));
    let small = w.spawn_app(&["--gpus", "2", "--kib", "64"]);
    let st = w.world.read_state().unwrap();
    assert!(!st.by_pid(small).unwrap().1.allocations[0].sampled);
    // 40 GiB on GPU2 holds 64 KiB already: 40 GiB more does not fit.
    let report = w.path().join("big.txt");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mock-cuda-app"));
    cmd.args(["--gpus", "2", "--gib", "40", "--report"])
        .arg(&report)
        .stdout(std::process::Stdio::null());
    w.env(&mut cmd);
    let status = cmd.status().unwrap();
    assert_eq!(status.code(), Some(1));
    let text = read(&report);
    assert!(
        text.contains("cuMemAlloc failed with CUresult 2"),
        "out of memory: {text}"
    );
}
