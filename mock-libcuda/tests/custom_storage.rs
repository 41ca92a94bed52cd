//! Custom storage (CUDA 13.4) through the C entry points, against live mock workloads: the
//! round trip (real and virtual allocations, a swapped GPU pair), every documented error,
//! Complete with a stream under capture, the caller killed mid-operation, and the
//! `cuGetProcAddress` gate on 13.3 and 13.4 worlds.
//!
//! A caller retains primary contexts, which makes it a CUDA process of the world it first
//! did that in for the rest of its life; so every scenario runs in a process of its own (this
//! test binary again, filtered to the scenario, see [`isolated`]), one world each.

mod common;

use abi::cuda::{
    proc_address_query, CUcheckpointCustomStorageInfo, CUstream, CUSTOM_STORAGE_MIN_DRIVER_VERSION,
};
use abi::{
    CUcheckpointCheckpointArgs, CUcheckpointGpuPair, CUcheckpointRestoreArgs, CUprocessState,
    CUresult, GpuUuid,
};
use common::*;
use mock_libcuda::driver;
use mock_libcuda::ffi::exports;
use mock_libcuda::world::client::{CudaState, MockWorld, Presence};
use std::ffi::{c_int, c_void, CString};
use std::process::Command;
use std::time::Duration;
use testkit::wait::wait_for;
use testkit::world::{GPU0, GPU1};

const SCENARIO_ENV: &str = "CUSTOM_STORAGE_SCENARIO";

/// Runs `body` in a process of its own: this binary, filtered to the test `name`.
fn isolated(name: &str, body: impl FnOnce()) {
    if std::env::var(SCENARIO_ENV).as_deref() == Ok(name) {
        body();
        return;
    }
    let _s = serial();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(SCENARIO_ENV, name)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scenario {name} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("test result: ok. 1 passed"),
        "scenario {name} did not run"
    );
}

/// A 13.4 world (r615) with two H100s.
fn world_134(extra: &str) -> TestWorld {
    TestWorld::new(&config(615, extra))
}

/// Whether every thread of `pid` is in a stop (`T` in its `stat`).
fn all_threads_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let state = stat.rfind(')').and_then(|i| stat.get(i + 2..i + 3));
        state == Some("T")
    })
}

fn ok(r: CUresult) {
    assert_eq!(r, CUresult::SUCCESS);
}

/// `cuInit` and a primary context on each of `ordinals`.
fn contexts(ordinals: &[c_int]) {
    ok(exports::cuInit(0));
    for &d in ordinals {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        ok(unsafe { exports::cuDevicePrimaryCtxRetain(&mut ctx, d) });
    }
}

/// One entry of the per-device list.
#[derive(Debug, Clone, Copy)]
struct Dev {
    ptr: u64,
    size: usize,
    stream: CUstream,
}

/// An open operation as the caller sees it.
#[derive(Debug)]
struct Operation {
    handle: *mut c_void,
    devices: Vec<Dev>,
}

fn read_info(info: *mut CUcheckpointCustomStorageInfo) -> Operation {
    assert!(!info.is_null(), "the driver hands out the info");
    // SAFETY: the driver's info, valid until Complete.
    let i = unsafe { info.read() };
    // SAFETY: `device_count` entries at `per_device_data`.
    let per = unsafe { std::slice::from_raw_parts(i.per_device_data, i.device_count as usize) };
    Operation {
        handle: i.handle,
        devices: per
            .iter()
            .map(|d| Dev {
                ptr: d.dev_ptr,
                size: d.size,
                stream: d.stream,
            })
            .collect(),
    }
}

fn open_checkpoint(pid: i32) -> Result<Operation, CUresult> {
    let mut info: *mut CUcheckpointCustomStorageInfo = std::ptr::null_mut();
    let mut args = CUcheckpointCheckpointArgs {
        custom_storage_info_out: &mut info,
        ..Default::default()
    };
    // SAFETY: valid args and out-pointer.
    let r = unsafe { exports::cuCheckpointProcessCheckpoint(pid, &mut args) };
    if r == CUresult::SUCCESS {
        Ok(read_info(info))
    } else {
        assert!(info.is_null(), "a failed call hands nothing out");
        Err(r)
    }
}

fn open_restore(pid: i32, pairs: &[(&str, &str)]) -> Result<Operation, CUresult> {
    let mut info: *mut CUcheckpointCustomStorageInfo = std::ptr::null_mut();
    let mut pairs: Vec<CUcheckpointGpuPair> = pairs
        .iter()
        .map(|(o, n)| CUcheckpointGpuPair {
            old_uuid: GpuUuid::parse(o).unwrap().to_cu(),
            new_uuid: GpuUuid::parse(n).unwrap().to_cu(),
        })
        .collect();
    let mut args = CUcheckpointRestoreArgs {
        gpu_pairs: if pairs.is_empty() {
            std::ptr::null_mut()
        } else {
            pairs.as_mut_ptr()
        },
        gpu_pairs_count: pairs.len() as u32,
        custom_storage_info_out: &mut info,
        ..Default::default()
    };
    // SAFETY: valid args, pairs and out-pointer.
    let r = unsafe { exports::cuCheckpointProcessRestore(pid, &mut args) };
    if r == CUresult::SUCCESS {
        Ok(read_info(info))
    } else {
        Err(r)
    }
}

fn complete(op: &Operation) -> CUresult {
    exports::cuCheckpointOperationComplete(op.handle)
}

fn dtoh(ptr: u64, len: usize) -> Result<Vec<u8>, CUresult> {
    let mut buf = vec![0u8; len];
    // SAFETY: `len` writable bytes.
    let r = unsafe { exports::cuMemcpyDtoH_v2(buf.as_mut_ptr().cast(), ptr, len) };
    if r == CUresult::SUCCESS {
        Ok(buf)
    } else {
        Err(r)
    }
}

fn htod(ptr: u64, data: &[u8]) -> CUresult {
    // SAFETY: `data.len()` readable bytes.
    unsafe { exports::cuMemcpyHtoD_v2(ptr, data.as_ptr().cast(), data.len()) }
}

/// Copies every device's bytes out: synchronously for the first, on its stream for the
/// others (then synchronised).
fn copy_out(op: &Operation) -> Vec<Vec<u8>> {
    op.devices
        .iter()
        .enumerate()
        .map(|(k, d)| {
            let mut buf = vec![0u8; d.size];
            if k == 0 {
                buf = dtoh(d.ptr, d.size).unwrap();
            } else {
                // SAFETY: `d.size` writable bytes, kept until the stream is synchronised.
                ok(unsafe {
                    exports::cuMemcpyDtoHAsync_v2(buf.as_mut_ptr().cast(), d.ptr, d.size, d.stream)
                });
                ok(exports::cuStreamSynchronize(d.stream));
            }
            buf
        })
        .collect()
}

/// Copies `data[k]` into device `k`: asynchronously on each stream (Complete waits).
fn copy_in(op: &Operation, data: &[Vec<u8>]) {
    for (d, bytes) in op.devices.iter().zip(data) {
        assert_eq!(
            d.size,
            bytes.len(),
            "each entry is the size it had at checkpoint"
        );
        // SAFETY: readable bytes, kept until Complete.
        ok(unsafe {
            exports::cuMemcpyHtoDAsync_v2(d.ptr, bytes.as_ptr().cast(), bytes.len(), d.stream)
        });
    }
}

/// The byte at offset `i` of the workload's `alloc`th allocation (mock-cuda-app's pattern).
fn pattern(alloc: usize, i: u64) -> u8 {
    ((i * 131 + alloc as u64 * 17 + 7) % 251) as u8
}

fn state(pid: i32) -> CUprocessState {
    driver::get_state(pid).unwrap()
}

fn entry_of(w: &TestWorld, pid: i32) -> mock_libcuda::world::state::ProcessEntry {
    w.world
        .read_state()
        .unwrap()
        .by_pid(pid)
        .map(|(_, e)| e.clone())
        .unwrap()
}

#[test]
fn a_custom_storage_round_trip_keeps_every_byte_and_stages_nothing() {
    isolated(
        "a_custom_storage_round_trip_keeps_every_byte_and_stages_nothing",
        || {
            let mut w = world_134("");
            let pid = w.spawn_app(&["--gpus", "0,1", "--kib", "64"]);
            contexts(&[0, 1]);
            driver::lock(pid, 5000).unwrap();
            let op = open_checkpoint(pid).unwrap();
            assert_eq!(state(pid), CUprocessState::CHECKPOINTING);
            assert_eq!(op.devices.len(), 2, "one entry per GPU of the task");
            assert!(op.devices.iter().all(|d| d.size == 64 * 1024));
            let data = copy_out(&op);
            for (k, bytes) in data.iter().enumerate() {
                // Entry k is the caller's ordinal k: the workload's allocation on GPU k.
                assert!(
                    bytes
                        .iter()
                        .enumerate()
                        .all(|(i, b)| *b == pattern(k, i as u64)),
                    "entry {k} holds the workload's bytes"
                );
            }
            ok(complete(&op));
            assert_eq!(state(pid), CUprocessState::CHECKPOINTED);
            let e = entry_of(&w, pid);
            assert!(e.custom_storage);
            let id = w.world.read_state().unwrap().by_pid(pid).unwrap().0;
            assert!(
                e.allocations
                    .iter()
                    .all(|a| !w.world.devmem_path(id, a.id).exists()),
                "the GPU memory is released"
            );
            let status = MockWorld::open(w.path()).unwrap().status().unwrap();
            let p = status.process(pid).unwrap();
            assert_eq!(p.state(), CudaState::Checkpointed);
            assert_eq!(p.staged_bytes(), 0, "nothing staged in the task");
            assert!(status.table().contains("checkpointed"));
            assert_eq!(complete(&op), CUresult::ERROR_INVALID_VALUE, "finished");
            assert_eq!(
                dtoh(op.devices[0].ptr, 16),
                Err(CUresult::ERROR_INVALID_VALUE),
                "the pointers end with the operation"
            );
            // Not interchangeable with the host-staged path.
            assert_eq!(
                driver::restore(pid, &[]),
                Err(CUresult::ERROR_INVALID_VALUE)
            );
            assert_eq!(state(pid), CUprocessState::CHECKPOINTED);

            let op = open_restore(pid, &[]).unwrap();
            assert_eq!(state(pid), CUprocessState::RESTORING);
            let status = MockWorld::open(w.path()).unwrap().status().unwrap();
            assert_eq!(status.process(pid).unwrap().state(), CudaState::Restoring);
            assert!(status.table().contains("restoring"));
            copy_in(&op, &data);
            ok(complete(&op));
            assert_eq!(state(pid), CUprocessState::LOCKED);
            assert!(!entry_of(&w, pid).custom_storage);
            driver::unlock(pid).unwrap();
            let line = w.verify(0, pid);
            assert!(line.starts_with("PASS"), "{line}");

            // Again onto the swapped pair: entry k of the restore is the caller's ordinal k of
            // the new GPUs, so new GPU0 takes what GPU1 held.
            driver::lock(pid, 5000).unwrap();
            let op = open_checkpoint(pid).unwrap();
            let data = copy_out(&op);
            ok(complete(&op));
            let op = open_restore(pid, &[(GPU0, GPU1), (GPU1, GPU0)]).unwrap();
            // The buffers must outlive Complete: the copies read them on the streams.
            let swapped = [data[1].clone(), data[0].clone()];
            copy_in(&op, &swapped);
            ok(complete(&op));
            driver::unlock(pid).unwrap();
            let line = w.verify(0, pid);
            assert!(line.starts_with("PASS"), "{line}");
            let e = entry_of(&w, pid);
            assert_eq!(e.devices[0].0, GpuUuid::parse(GPU1).unwrap(), "remapped");
        },
    );
}

#[test]
fn a_virtual_allocation_round_trips_with_its_fill_stored_as_a_fill() {
    isolated(
        "a_virtual_allocation_round_trips_with_its_fill_stored_as_a_fill",
        || {
            // 8 MiB allocations are virtual above memory.real_mib = 1.
            let mut w = world_134("\n[memory]\nreal_mib = 1\n");
            let pid = w.spawn_app(&["--gpus", "0", "--gib", "0.0078125"]);
            contexts(&[0]);
            driver::lock(pid, 5000).unwrap();
            let op = open_checkpoint(pid).unwrap();
            assert_eq!(op.devices.len(), 1);
            let d = op.devices[0];
            assert_eq!(d.size, 8 << 20);
            const CHUNK: usize = 1 << 20;
            let chunks: Vec<Vec<u8>> = (0..d.size / CHUNK)
                .map(|c| dtoh(d.ptr + (c * CHUNK) as u64, CHUNK).unwrap())
                .collect();
            // The workload set everything to its fill value and wrote windows of pattern.
            let fill = chunks[0][100_000];
            assert!(chunks.iter().all(|c| c.contains(&fill)));
            assert_eq!(chunks[0][0], pattern(0, 0), "a window at offset 0");
            ok(complete(&op));
            let op = open_restore(pid, &[]).unwrap();
            let d = op.devices[0];
            for (c, bytes) in chunks.iter().enumerate() {
                ok(htod(d.ptr + (c * CHUNK) as u64, bytes));
            }
            ok(complete(&op));
            let id = w.world.read_state().unwrap().by_pid(pid).unwrap().0;
            let alloc = entry_of(&w, pid).allocations[0].id;
            let stored = std::fs::metadata(w.world.devmem_path(id, alloc))
                .unwrap()
                .len();
            assert!(
                stored < 64 * 1024,
                "runs of the fill value are stored as fills ({stored} bytes stored)"
            );
            driver::unlock(pid).unwrap();
            let line = w.verify(0, pid);
            assert!(line.starts_with("PASS"), "{line}");
        },
    );
}

#[test]
fn every_documented_error_of_custom_storage() {
    isolated("every_documented_error_of_custom_storage", || {
        let mut w = world_134(
            "\n[[fault]]\nfunction = \"cuCheckpointOperationComplete\"\nnth = 3\naction = { kind = \"return\", code = \"CUDA_ERROR_UNKNOWN\" }\n",
        );
        let pid = w.spawn_app(&["--gpus", "0,1", "--kib", "16"]);
        driver::lock(pid, 5000).unwrap();
        // No cuInit, hence no context.
        assert_eq!(
            open_checkpoint(pid).err(),
            Some(CUresult::ERROR_INVALID_CONTEXT)
        );
        // A context on one of the task's two GPUs only.
        contexts(&[0]);
        assert_eq!(
            open_checkpoint(pid).err(),
            Some(CUresult::ERROR_INVALID_CONTEXT)
        );
        contexts(&[1]);
        assert_eq!(
            state(pid),
            CUprocessState::LOCKED,
            "refusals change nothing"
        );
        // The caller itself.
        assert_eq!(
            open_checkpoint(std::process::id() as i32).err(),
            Some(CUresult::ERROR_NOT_SUPPORTED)
        );
        // Wrong states.
        assert_eq!(
            open_restore(pid, &[]).err(),
            Some(CUresult::ERROR_ILLEGAL_STATE)
        );
        driver::unlock(pid).unwrap();
        assert_eq!(
            open_checkpoint(pid).err(),
            Some(CUresult::ERROR_ILLEGAL_STATE)
        );
        driver::lock(pid, 5000).unwrap();

        let op = open_checkpoint(pid).unwrap();
        assert_eq!(
            open_checkpoint(pid).err(),
            Some(CUresult::ERROR_ILLEGAL_STATE)
        );
        assert_eq!(driver::checkpoint(pid), Err(CUresult::ERROR_ILLEGAL_STATE));
        assert_eq!(driver::unlock(pid), Err(CUresult::ERROR_ILLEGAL_STATE));
        let data = copy_out(&op);
        let d = op.devices[0];
        // Bounds.
        assert_eq!(dtoh(d.ptr, d.size + 1), Err(CUresult::ERROR_INVALID_VALUE));
        assert_eq!(
            dtoh(d.ptr + d.size as u64, 1),
            Err(CUresult::ERROR_INVALID_VALUE)
        );
        assert_eq!(
            htod(d.ptr + 1, &vec![0; d.size]),
            CUresult::ERROR_INVALID_VALUE
        );
        assert_eq!(dtoh(d.ptr + d.size as u64 - 4, 4).map(|v| v.len()), Ok(4));
        // Unknown handles (the 1st Complete; the scripted fault fires on the 3rd).
        assert_eq!(
            exports::cuCheckpointOperationComplete(0x1234 as *mut c_void),
            CUresult::ERROR_INVALID_VALUE
        );
        // A stream under capture: refused, the operation stays open.
        let mut graph = std::ptr::null_mut();
        ok(exports::cuStreamBeginCapture_v2(d.stream, 0));
        assert_eq!(complete(&op), CUresult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
        assert_eq!(
            exports::cuStreamSynchronize(d.stream),
            CUresult::ERROR_STREAM_CAPTURE_UNSUPPORTED
        );
        assert_eq!(state(pid), CUprocessState::CHECKPOINTING);
        // SAFETY: a valid out-pointer.
        ok(unsafe { exports::cuStreamEndCapture(d.stream, &mut graph) });
        // The scripted fault fails the first Complete that gets through: still open.
        assert_eq!(complete(&op), CUresult::ERROR_UNKNOWN);
        assert_eq!(state(pid), CUprocessState::CHECKPOINTING);
        ok(complete(&op));
        assert_eq!(state(pid), CUprocessState::CHECKPOINTED);
        assert_eq!(complete(&op), CUresult::ERROR_INVALID_VALUE);

        // A bad GPU map (a GPU paired with itself twice) is INVALID_VALUE, nothing changed.
        assert_eq!(
            open_restore(pid, &[(GPU0, GPU1), (GPU1, GPU1)]).err(),
            Some(CUresult::ERROR_INVALID_VALUE)
        );
        assert_eq!(state(pid), CUprocessState::CHECKPOINTED);
        let op = open_restore(pid, &[]).unwrap();
        copy_in(&op, &data);
        ok(complete(&op));
        // A host-staged checkpoint restores only without custom storage.
        driver::checkpoint(pid).unwrap();
        assert_eq!(
            open_restore(pid, &[]).err(),
            Some(CUresult::ERROR_INVALID_VALUE)
        );
        assert_eq!(state(pid), CUprocessState::CHECKPOINTED);
        driver::init(0).unwrap();
        driver::restore(pid, &[]).unwrap();
        driver::unlock(pid).unwrap();
        let line = w.verify(0, pid);
        assert!(line.starts_with("PASS"), "{line}");
    });
}

/// Starts this binary as a copier that opens an operation on `pid` and then sleeps.
fn spawn_copier(w: &TestWorld, direction: &str, pid: i32) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["copier", "--exact", "--nocapture", "--test-threads=1"])
        .env(SCENARIO_ENV, "copier")
        .env("COPIER_DIRECTION", direction)
        .env("COPIER_TARGET", pid.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    w.env(&mut cmd);
    cmd.spawn().unwrap()
}

/// The copier of [`the_callers_death_aborts_its_operation_both_ways`] (does nothing in a plain
/// test run).
#[test]
fn copier() {
    if std::env::var(SCENARIO_ENV).as_deref() != Ok("copier") {
        return;
    }
    let pid: i32 = std::env::var("COPIER_TARGET").unwrap().parse().unwrap();
    contexts(&[0, 1]);
    let _op = if std::env::var("COPIER_DIRECTION").as_deref() == Ok("restore") {
        open_restore(pid, &[]).unwrap()
    } else {
        open_checkpoint(pid).unwrap()
    };
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn the_callers_death_aborts_its_operation_both_ways() {
    isolated("the_callers_death_aborts_its_operation_both_ways", || {
        let mut w = world_134("");
        let pid = w.spawn_app(&["--gpus", "0,1", "--kib", "64"]);
        contexts(&[0, 1]);
        driver::lock(pid, 5000).unwrap();
        let kill = |c: &mut std::process::Child| {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap();
            c.wait().unwrap();
        };

        let mut c = spawn_copier(&w, "checkpoint", pid);
        wait_for(
            Duration::from_secs(20),
            || state(pid) == CUprocessState::CHECKPOINTING,
            "the copier's checkpoint to open",
        );
        kill(&mut c);
        wait_for(
            Duration::from_secs(5),
            || state(pid) == CUprocessState::LOCKED,
            "the abort to LOCKED",
        );
        assert!(!entry_of(&w, pid).custom_storage);
        assert!(
            std::fs::read_to_string(w.world.trace_path())
                .unwrap()
                .contains("custom-storage-abort"),
            "the abort is traced"
        );
        // The memory is untouched: a checkpoint of our own reads it whole.
        let op = open_checkpoint(pid).unwrap();
        let data = copy_out(&op);
        assert!(data[1]
            .iter()
            .enumerate()
            .all(|(i, b)| *b == pattern(1, i as u64)));
        ok(complete(&op));

        let mut c = spawn_copier(&w, "restore", pid);
        wait_for(
            Duration::from_secs(20),
            || state(pid) == CUprocessState::RESTORING,
            "the copier's restore to open",
        );
        assert!(
            !entry_of(&w, pid).reserved.is_empty(),
            "the restore claimed memory"
        );
        kill(&mut c);
        wait_for(
            Duration::from_secs(5),
            || state(pid) == CUprocessState::CHECKPOINTED,
            "the abort to CHECKPOINTED",
        );
        assert!(
            entry_of(&w, pid).reserved.is_empty(),
            "the claim is released"
        );
        // The restore can be retried.
        let op = open_restore(pid, &[]).unwrap();
        copy_in(&op, &data);
        ok(complete(&op));
        driver::unlock(pid).unwrap();
        let line = w.verify(0, pid);
        assert!(line.starts_with("PASS"), "{line}");
        // The copiers were CUDA processes (contexts, no memory): the status shows them gone,
        // holding nothing, next to the workload.
        let status = MockWorld::open(w.path()).unwrap().status().unwrap();
        let copiers: Vec<_> = status
            .processes
            .iter()
            .filter(|p| {
                p.host_pid() != Some(pid) && p.host_pid() != Some(std::process::id() as i32)
            })
            .collect();
        assert_eq!(copiers.len(), 2, "{}", status.table());
        assert!(copiers.iter().all(|p| p.present == Presence::Gone
            && p.allocated_bytes() == 0
            && p.staged_bytes() == 0));
        assert_eq!(status.state_of(pid), CudaState::Running);
    });
}

fn proc_address(name: &str, version: c_int) -> (CUresult, *mut c_void, c_int) {
    let c = CString::new(name).unwrap();
    let mut pfn = std::ptr::null_mut();
    let mut status: c_int = -1;
    // SAFETY: valid NUL-terminated name and out-pointers.
    let r = unsafe { exports::cuGetProcAddress_v2(c.as_ptr(), &mut pfn, version, 0, &mut status) };
    (r, pfn, status)
}

#[test]
fn custom_storage_is_found_from_13_4_only() {
    isolated("custom_storage_is_found_from_13_4_only", || {
        let w = TestWorld::new(&config(610, "")); // CUDA 13.3
        let (r, p, _) = proc_address(
            "cuCheckpointOperationComplete",
            CUSTOM_STORAGE_MIN_DRIVER_VERSION,
        );
        assert_eq!((r, p.is_null()), (CUresult::ERROR_INVALID_VALUE, true));
        assert_eq!(
            exports::cuCheckpointOperationComplete(std::ptr::dangling_mut::<c_void>()),
            CUresult::ERROR_NOT_SUPPORTED
        );
        let mut w = w;
        let pid = w.spawn_app(&["--kib", "4"]);
        contexts(&[0]);
        driver::lock(pid, 5000).unwrap();
        assert_eq!(
            open_checkpoint(pid).err(),
            Some(CUresult::ERROR_INVALID_VALUE),
            "customStorageInfo_out is a reserved byte before 13.4"
        );
        assert_eq!(state(pid), CUprocessState::LOCKED);
        drop(w);

        let _w = world_134("");
        let (r, p, st) = proc_address(
            "cuCheckpointOperationComplete",
            CUSTOM_STORAGE_MIN_DRIVER_VERSION,
        );
        assert_eq!(
            (r, st),
            (CUresult::SUCCESS, proc_address_query::SUCCESS as c_int)
        );
        assert_eq!(p, exports::cuCheckpointOperationComplete as *mut c_void);
        let (r, p, st) = proc_address("cuCheckpointOperationComplete", 13030);
        assert_eq!(
            (r, p.is_null(), st),
            (
                CUresult::SUCCESS,
                true,
                proc_address_query::VERSION_NOT_SUFFICIENT as c_int
            )
        );
        drop(_w);
        let _w = TestWorld::new(&config(615, "").replace(
            "request_timeout_ms",
            "hidden_symbols = [\"cuCheckpointOperationComplete\"]\nrequest_timeout_ms",
        ));
        let (r, p, st) = proc_address(
            "cuCheckpointOperationComplete",
            CUSTOM_STORAGE_MIN_DRIVER_VERSION,
        );
        assert_eq!(
            (r, p.is_null(), st),
            (
                CUresult::SUCCESS,
                true,
                proc_address_query::SYMBOL_NOT_FOUND as c_int
            ),
            "hidden"
        );
        let mut pp = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        ok(unsafe { exports::cuMemHostAlloc(&mut pp, 10_000, 0) });
        assert_eq!(pp as usize % 4096, 0, "page-aligned, for O_DIRECT");
        // SAFETY: memory from cuMemHostAlloc.
        ok(unsafe { exports::cuMemFreeHost(pp) });
        // SAFETY: freed already: the driver only looks the address up.
        let again = unsafe { exports::cuMemFreeHost(pp) };
        assert_eq!(again, CUresult::ERROR_INVALID_VALUE);
    });
}

#[test]
fn copies_take_the_links_time_shared_and_faults_reach_the_new_calls() {
    isolated(
        "copies_take_the_links_time_shared_and_faults_reach_the_new_calls",
        || {
            // 64 KiB at 1 MB/s on a link: 65.5 ms. The driver's copy path is far slower, and
            // custom storage bypasses it.
            let mut w = world_134(
                "\n[rates]\nlink_gbps = 0.001\ndriver_gbps = 0.00001\nhost_gbps = 100.0\n\
                 [[fault]]\nfunction = \"cuMemcpyDtoHAsync_v2\"\naction = { kind = \"return\", code = \"CUDA_ERROR_UNKNOWN\" }\n\
                 [[fault]]\nfunction = \"cuStreamSynchronize\"\naction = { kind = \"return\", code = \"CUDA_ERROR_NOT_READY\" }\n",
            );
            let pid = w.spawn_app(&["--gpus", "0,1", "--kib", "64"]);
            contexts(&[0, 1]);
            driver::lock(pid, 5000).unwrap();
            let op = open_checkpoint(pid).unwrap();
            let (a, b) = (op.devices[0], op.devices[1]);
            let alone = Duration::from_secs_f64(65_536.0 / 1e6);

            let t = std::time::Instant::now();
            dtoh(a.ptr, a.size).unwrap();
            let one = t.elapsed();
            assert!(one >= alone * 9 / 10, "{one:?}");
            assert!(
                one < Duration::from_secs(3),
                "not the driver's path: {one:?}"
            );

            let mut buf = vec![0u8; a.size];
            let mut buf2 = vec![0u8; a.size];
            // SAFETY: writable buffers kept until synchronised.
            let r = unsafe {
                exports::cuMemcpyDtoHAsync_v2(buf.as_mut_ptr().cast(), a.ptr, a.size, a.stream)
            };
            assert_eq!(r, CUresult::ERROR_UNKNOWN, "the scripted fault");
            assert_eq!(
                exports::cuStreamSynchronize(a.stream),
                CUresult::ERROR_NOT_READY,
                "the scripted fault"
            );
            // Two copies on one GPU's link, on two streams: half the rate each.
            let mut s2: CUstream = std::ptr::null_mut();
            // SAFETY: a valid out-pointer.
            ok(unsafe { exports::cuStreamCreate(&mut s2, 0) });
            let t = std::time::Instant::now();
            // SAFETY: writable buffers kept until synchronised.
            unsafe {
                ok(exports::cuMemcpyDtoHAsync_v2(
                    buf.as_mut_ptr().cast(),
                    a.ptr,
                    a.size,
                    a.stream,
                ));
                ok(exports::cuMemcpyDtoHAsync_v2(
                    buf2.as_mut_ptr().cast(),
                    a.ptr,
                    a.size,
                    s2,
                ));
            }
            assert!(t.elapsed() < alone, "asynchronous copies return at once");
            ok(exports::cuStreamSynchronize(a.stream));
            ok(exports::cuStreamSynchronize(s2));
            let shared = t.elapsed();
            assert!(shared >= alone * 18 / 10, "one link, shared: {shared:?}");
            ok(exports::cuStreamDestroy_v2(s2));
            assert_eq!(
                exports::cuStreamDestroy_v2(s2),
                CUresult::ERROR_INVALID_HANDLE
            );

            // Complete waits for the copies on the operation's streams.
            let t = std::time::Instant::now();
            // SAFETY: a writable buffer kept until Complete.
            ok(unsafe {
                exports::cuMemcpyDtoHAsync_v2(buf.as_mut_ptr().cast(), b.ptr, b.size, b.stream)
            });
            ok(complete(&op));
            assert!(t.elapsed() >= alone * 9 / 10, "{:?}", t.elapsed());
            assert_eq!(state(pid), CUprocessState::CHECKPOINTED);
        },
    );
}

#[test]
fn a_stopped_target_times_out_and_a_full_gpu_refuses_the_restore() {
    isolated(
        "a_stopped_target_times_out_and_a_full_gpu_refuses_the_restore",
        || {
            let mut w = world_134("");
            // 40 of the GPU's 64 MiB.
            let a = w.spawn_app(&["--gpus", "0", "--kib", "40960"]);
            contexts(&[0, 1]);
            driver::lock(a, 5000).unwrap();
            let signal = |pid: i32, s| {
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), s).unwrap();
                if s == nix::sys::signal::Signal::SIGSTOP {
                    // kill(2) returns before the group stop reaches every thread: until then
                    // the restore thread may still take a request.
                    wait_for(
                        Duration::from_secs(10),
                        || all_threads_stopped(pid),
                        "every thread of the target stopped",
                    );
                }
            };
            // The target's restore thread carries the state changes out: stopped, the request
            // times out (request_timeout_ms) and is withdrawn.
            signal(a, nix::sys::signal::Signal::SIGSTOP);
            assert_eq!(open_checkpoint(a).err(), Some(CUresult::ERROR_TIMEOUT));
            signal(a, nix::sys::signal::Signal::SIGCONT);
            assert_eq!(state(a), CUprocessState::LOCKED);
            let op = open_checkpoint(a).unwrap();
            let data = copy_out(&op);
            signal(a, nix::sys::signal::Signal::SIGSTOP);
            assert_eq!(complete(&op), CUresult::ERROR_TIMEOUT);
            signal(a, nix::sys::signal::Signal::SIGCONT);
            assert_eq!(state(a), CUprocessState::CHECKPOINTING, "still open");
            ok(complete(&op));

            // Another process takes the memory A released.
            let b = w.spawn_app(&["--gpus", "0", "--kib", "40960"]);
            assert_eq!(
                open_restore(a, &[]).err(),
                Some(CUresult::ERROR_OUT_OF_MEMORY)
            );
            assert_eq!(state(a), CUprocessState::CHECKPOINTED);
            assert!(entry_of(&w, a).reserved.is_empty());
            // Onto the other GPU it fits.
            let op = open_restore(a, &[(GPU0, GPU1)]).unwrap();
            assert_eq!(op.devices.len(), 1);
            copy_in(&op, &data);
            ok(complete(&op));
            driver::unlock(a).unwrap();
            let line = w.verify(0, a);
            assert!(line.starts_with("PASS") && line.contains(GPU1), "{line}");
            let line = w.verify(1, b);
            assert!(line.starts_with("PASS"), "{line}");
        },
    );
}
