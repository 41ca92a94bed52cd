//! The driver API against live mock workloads: the state machine, the restore thread, device
//! memory moves, timeouts, GPU pairs, and what other processes see.

mod common;

use abi::{CUprocessState, CUresult, GpuUuid};
use common::*;
use mock_cuda_world::trace::calls_by;
use mock_libcuda::driver;
use std::time::{Duration, Instant};
use testkit::proc::{stat_state, thread_names};
use testkit::wait::wait_for;
use testkit::world::{GPU0, GPU1, GPU2};

fn uuid(s: &str) -> GpuUuid {
    GpuUuid::parse(s).unwrap()
}

#[test]
fn full_cycle_keeps_gpu_data_and_moves_it_through_the_process() {
    let _s = serial();
    let mut w = TestWorld::new(&config(580, ""));
    let pid = w.spawn_app(&["--gpus", "0,1", "--kib", "64", "--threads", "2"]);

    let tid = driver::get_restore_tid(pid).unwrap();
    let names = thread_names(pid);
    let (_, comm) = names
        .iter()
        .find(|(t, _)| *t == tid)
        .expect("restore tid is a thread of the target");
    assert!(
        comm.starts_with("cuda") && comm.len() == 15,
        "restore thread is named like the driver's: {comm}"
    );
    // Any thread id names the process.
    assert_eq!(driver::get_state(tid), Ok(CUprocessState::RUNNING));

    driver::lock(pid, 5000).unwrap();
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::LOCKED));
    driver::checkpoint(pid).unwrap();
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::CHECKPOINTED));
    let devmem: Vec<_> = std::fs::read_dir(w.path().join("devmem"))
        .unwrap()
        .collect();
    assert!(
        devmem.is_empty(),
        "checkpointed device memory lives in the process, not the world"
    );

    // (That restore needs cuInit in the caller is checked in uninitialised.rs: cuInit is
    // process-wide, and other tests of this file call it.)
    driver::init(0).unwrap();
    driver::restore(pid, &[]).unwrap();
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::LOCKED));
    driver::unlock(pid).unwrap();
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::RUNNING));
    let line = w.verify(0, pid);
    assert!(line.starts_with("PASS"), "{line}");
    assert!(line.contains(GPU0) && line.contains(GPU1), "{line}");
}

#[test]
fn wrong_state_calls_are_illegal_state_and_change_nothing() {
    let _s = serial();
    let mut w = TestWorld::new(&config(580, ""));
    let pid = w.spawn_app(&["--kib", "4"]);
    driver::init(0).unwrap();
    assert_eq!(driver::checkpoint(pid), Err(CUresult::ERROR_ILLEGAL_STATE));
    assert_eq!(
        driver::restore(pid, &[]),
        Err(CUresult::ERROR_ILLEGAL_STATE)
    );
    assert_eq!(driver::unlock(pid), Err(CUresult::ERROR_ILLEGAL_STATE));
    driver::lock(pid, 0).unwrap();
    assert_eq!(driver::lock(pid, 0), Err(CUresult::ERROR_ILLEGAL_STATE));
    assert_eq!(
        driver::restore(pid, &[]),
        Err(CUresult::ERROR_ILLEGAL_STATE)
    );
    driver::checkpoint(pid).unwrap();
    assert_eq!(driver::unlock(pid), Err(CUresult::ERROR_ILLEGAL_STATE));
    assert_eq!(driver::checkpoint(pid), Err(CUresult::ERROR_ILLEGAL_STATE));
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::CHECKPOINTED));
    driver::restore(pid, &[]).unwrap();
    driver::unlock(pid).unwrap();
    assert!(w.verify(0, pid).starts_with("PASS"));
}

#[test]
fn non_cuda_and_missing_processes_are_invalid_value() {
    let _s = serial();
    let _w = TestWorld::new(&config(580, ""));
    let me = std::process::id() as i32;
    assert_eq!(
        driver::get_restore_tid(me),
        Err(CUresult::ERROR_INVALID_VALUE)
    );
    assert_eq!(driver::get_state(me), Err(CUresult::ERROR_INVALID_VALUE));
    assert_eq!(
        driver::lock(i32::MAX, 0),
        Err(CUresult::ERROR_INVALID_VALUE)
    );
    assert_eq!(driver::get_state(-1), Err(CUresult::ERROR_INVALID_VALUE));
}

#[test]
fn a_stopped_restore_thread_times_out_instead_of_hanging() {
    let _s = serial();
    let mut w = TestWorld::new(&config(580, ""));
    let pid = w.spawn_app(&["--kib", "4"]);
    let p = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGSTOP).unwrap();
    wait_for(
        Duration::from_secs(5),
        || stat_state(pid) == Some('T'),
        "the target to stop",
    );

    let t = Instant::now();
    assert_eq!(
        driver::lock(pid, 300),
        Err(CUresult::ERROR_NOT_READY),
        "a lock with timeoutMs reports NOT_READY"
    );
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "lock gave up after {took:?}"
    );
    assert_eq!(
        driver::get_state(pid),
        Ok(CUprocessState::RUNNING),
        "a timed-out lock leaves the process RUNNING"
    );

    let t = Instant::now();
    assert_eq!(
        driver::lock(pid, 0),
        Err(CUresult::ERROR_TIMEOUT),
        "without timeoutMs the world's request timeout applies"
    );
    assert!(t.elapsed() < Duration::from_secs(5));

    // Once the thread runs again, the withdrawn requests must not execute behind our back.
    nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGCONT).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::RUNNING));
    driver::lock(pid, 1000).unwrap();
    driver::unlock(pid).unwrap();
    assert!(w.verify(0, pid).starts_with("PASS"));
}

#[test]
fn gpu_pairs_move_memory_to_other_gpus_and_bad_maps_are_refused() {
    let _s = serial();
    let extra = testkit::world::a100(GPU2);
    let mut w = TestWorld::new(&config(580, &extra));
    let pid = w.spawn_app(&["--gpus", "0,1", "--kib", "16"]);
    driver::init(0).unwrap();
    driver::lock(pid, 0).unwrap();
    driver::checkpoint(pid).unwrap();
    let (g0, g1, g2) = (uuid(GPU0), uuid(GPU1), uuid(GPU2));
    let refused: &[(&str, Vec<(GpuUuid, GpuUuid)>)] = &[
        ("incomplete", vec![(g0, g1)]),
        ("repeated new GPU", vec![(g0, g1), (g1, g1)]),
        ("repeated old GPU", vec![(g0, g1), (g0, g0)]),
        ("other chip", vec![(g0, g2), (g1, g0)]),
        (
            "unknown GPU",
            vec![
                (g0, uuid("GPU-99999999-9999-4999-8999-999999999999")),
                (g1, g0),
            ],
        ),
    ];
    for (why, pairs) in refused {
        assert_eq!(
            driver::restore(pid, pairs),
            Err(CUresult::ERROR_INVALID_VALUE),
            "{why}"
        );
        assert_eq!(
            driver::get_state(pid),
            Ok(CUprocessState::CHECKPOINTED),
            "{why} leaves the checkpoint intact"
        );
    }
    driver::restore(pid, &[(g0, g1), (g1, g0)]).unwrap();
    driver::unlock(pid).unwrap();
    let line = w.verify(0, pid);
    assert!(line.starts_with("PASS"), "{line}");
    assert!(
        line.ends_with(&format!("gpus={GPU1},{GPU0}")),
        "allocations now live on the swapped GPUs: {line}"
    );
}

#[test]
fn lock_waits_for_calls_in_flight_and_blocks_new_ones() {
    let _s = serial();
    let mut w = TestWorld::new(&config(580, "[[fault]]\nfunction = \"cuMemcpyDtoH\"\nsticky = true\naction = { kind = \"delay\", ms = 400 }\n"));
    let pid = w.spawn_app(&["--kib", "4", "--check-ms", "1"]);
    // The workload is almost always inside a 400 ms copy: a 50 ms lock cannot get in.
    let mut not_ready = 0;
    for _ in 0..3 {
        match driver::lock(pid, 50) {
            Err(CUresult::ERROR_NOT_READY) => not_ready += 1,
            Ok(()) => driver::unlock(pid).unwrap(),
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert!(
        not_ready >= 2,
        "locks should time out while a call is in flight ({not_ready}/3)"
    );
    driver::lock(pid, 3000).unwrap();
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::LOCKED));
    driver::unlock(pid).unwrap();
}

#[test]
fn the_trace_records_every_checkpoint_call() {
    let _s = serial();
    let mut w = TestWorld::new(&config(580, ""));
    let pid = w.spawn_app(&["--kib", "4"]);
    driver::lock(pid, 1000).unwrap();
    driver::unlock(pid).unwrap();
    let trace = w.world.read_trace();
    let mine = calls_by(&trace, &std::process::id().to_string());
    assert!(
        mine.contains(
            &format!("cuCheckpointProcessLock(pid={pid}, timeoutMs=1000) = CUDA_SUCCESS").as_str()
        ),
        "{trace}"
    );
    assert!(
        mine.contains(&format!("cuCheckpointProcessUnlock(pid={pid}) = CUDA_SUCCESS").as_str()),
        "{trace}"
    );
    // The workload's calls are traced too, under its own name.
    assert!(
        trace.contains(&format!(
            "{pid} mock-cuda-app cuInit(flags=0) = CUDA_SUCCESS"
        )),
        "{trace}"
    );
}

#[test]
fn a_process_whose_seccomp_profile_blocks_its_gpu_handle_refuses_to_start() {
    let _s = serial();
    let mut w = TestWorld::new(&config(580, ""));
    // As under podman's or Docker's default profile: userfaultfd and io_uring_setup refused.
    w.spawn_app(&["--kib", "4", "--seccomp", "--seccomp-container"]);
    assert_eq!(w.wait(0).code(), Some(1), "{}", w.report(0));
    let report = w.report(0);
    assert!(
        report.starts_with("FAIL") && !report.contains("READY"),
        "{report}"
    );
    let errors = testkit::read(&w.path().join(mock_libcuda::world::timeouts::ERRORS_FILE));
    for want in [
        "cannot open the stand-in GPU handle",
        "userfaultfd: Operation not permitted",
        "io_uring_setup: Operation not permitted",
        "MOCK_CUDA_NO_GPU_HANDLE",
    ] {
        assert!(
            errors.contains(want),
            "{want:?} not in the error log: {errors}"
        );
    }
    // Only the filter makes the difference, and the opt-out still runs without a handle.
    let pid = w.spawn_app(&["--kib", "4", "--seccomp"]);
    assert!(w.report(1).contains("READY"), "{}", w.report(1));
    assert!(w.verify(1, pid).starts_with("PASS"));
    w.spawn_app_env(
        &["--kib", "4", "--seccomp", "--seccomp-container"],
        &[("MOCK_CUDA_NO_GPU_HANDLE", "1")],
    );
    assert!(w.report(2).contains("READY"), "{}", w.report(2));
}

#[test]
fn a_process_on_a_gpu_in_mig_mode_locks_but_cannot_be_checkpointed() {
    let _s = serial();
    // GPU1 in MIG mode: a process with a context on it (and one on GPU0 only, beside it).
    let mig =
        testkit::world::h100(GPU1).replace("chip = \"GH100\"\n", "chip = \"GH100\"\nmig = true\n");
    let text = format!(
        "schema = 1\n[driver]\nbranch = 580\nrequest_timeout_ms = 1500\n{}{mig}",
        testkit::world::h100(GPU0)
    );
    let mut w = TestWorld::new(&text);
    let on_mig = w.spawn_app(&["--gpus", "0,1", "--kib", "4"]);
    let plain = w.spawn_app(&["--gpus", "0", "--kib", "4"]);
    driver::init(0).unwrap();
    driver::lock(on_mig, 5000).unwrap();
    assert_eq!(
        driver::checkpoint(on_mig),
        Err(CUresult::ERROR_OUT_OF_MEMORY),
        "NVIDIA's cuda-checkpoint #42: \"out of memory\""
    );
    assert_eq!(driver::get_state(on_mig), Ok(CUprocessState::LOCKED));
    driver::unlock(on_mig).unwrap();
    assert!(w.verify(0, on_mig).starts_with("PASS"));
    // Only a process on the MIG GPU is refused.
    driver::lock(plain, 5000).unwrap();
    driver::checkpoint(plain).unwrap();
    driver::restore(plain, &[]).unwrap();
    driver::unlock(plain).unwrap();
    assert!(w.verify(1, plain).starts_with("PASS"));
}

/// A process that takes the pid (the identity) of a dead process of the world drops that
/// process's entry, and its device memory, when it registers, unless the dead one is
/// checkpointed (its images may be restored); its own calls then find it by its entry alone.
#[test]
fn a_new_process_with_a_dead_process_s_pid_drops_its_entry_when_it_registers() {
    use mock_cuda_world::pidns::{own_pid_ns, NsIdentity};
    use mock_cuda_world::state::{Allocation, ProcessEntry};
    use std::io::Write;
    let _s = serial();
    let w = TestWorld::new(&config(580, ""));
    // The shell's pid is the workload's: it execs it once told to.
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        &format!(
            "read go; exec '{}' --kib 4 --report '{}'",
            env!("CARGO_BIN_EXE_mock-cuda-app"),
            w.path().join("report-0.txt").display()
        ),
    ])
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::null());
    w.env(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let pid = child.id() as i32;
    let ns = own_pid_ns().unwrap();
    let dead = |state: CUprocessState, alloc: u64| ProcessEntry {
        allocations: vec![Allocation {
            id: alloc,
            size: 4096,
            gpu: mock_cuda_world::config::GpuUuidText(uuid(GPU0)),
            sampled: false,
        }],
        ..ProcessEntry::new(pid, ns, pid, state.0, pid + 1)
    };
    let (ran, kept) = w
        .world
        .update(|st| {
            let (ran, kept) = (st.new_id(), st.new_id());
            st.processes.insert(ran, dead(CUprocessState::RUNNING, 900));
            st.processes
                .insert(kept, dead(CUprocessState::CHECKPOINTED, 901));
            (ran, kept)
        })
        .unwrap();
    let devmem = w.world.devmem_path(ran, 900);
    std::fs::write(&devmem, [0u8; 4096]).unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    wait_for(
        Duration::from_secs(20),
        || testkit::read(&w.path().join("report-0.txt")).contains("READY"),
        "the workload to report READY",
    );
    let st = w.world.read_state().unwrap();
    assert!(
        !st.processes.contains_key(&ran),
        "the dead RUNNING entry is dropped"
    );
    assert!(!devmem.exists(), "with its device memory");
    assert!(
        st.processes.contains_key(&kept),
        "a checkpointed one is kept"
    );
    let (mine, e) = st
        .processes
        .iter()
        .find(|(id, _)| **id != kept)
        .expect("the new process's entry");
    assert_eq!(e.identity(), NsIdentity { ns, pid });
    driver::init(0).unwrap();
    assert_eq!(driver::get_state(pid), Ok(CUprocessState::RUNNING));
    assert_eq!(
        driver::resolve(&w.world, pid).map(|t| t.id),
        Ok(*mine),
        "found by its own entry"
    );
    let _ = child.kill();
    let _ = child.wait();
}
