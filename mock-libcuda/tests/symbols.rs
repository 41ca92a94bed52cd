//! What a caller can find in the library: `dlsym` of the world's `libcuda.so.1` (hidden
//! symbols of old drivers), `cuGetProcAddress`, the export table, `CUDA_VISIBLE_DEVICES`.

mod common;

use abi::cuda::{proc_address_query, CHECKPOINT_CLI_EXPORT_TABLE_ID};
use abi::{CUcheckpointGpuPair, CUcheckpointRestoreArgs, CUresult, CUuuid};
use common::*;
use mock_libcuda::ffi::exports;
use std::ffi::{c_int, c_void, CString};
use testkit::world::{GPU0, GPU1};

fn dlsym_finds(lib: &std::path::Path, name: &str) -> bool {
    // SAFETY: loading the mock runs no initialisers with preconditions.
    let l = unsafe { libloading::Library::new(lib) }.unwrap();
    // SAFETY: only the symbol's presence is checked; it is never called.
    unsafe { l.get::<*const c_void>(name.as_bytes()) }.is_ok()
}

#[test]
fn old_drivers_lack_the_checkpoint_entry_points_and_worlds_hide_any_symbol() {
    let _s = serial();
    let w = TestWorld::new(&config(565, ""));
    let lib = w.path().join("lib/libcuda.so.1");
    assert!(dlsym_finds(&lib, "cuInit"));
    assert!(
        dlsym_finds(&lib, "cuGetExportTable"),
        "r565 still serves cuda-checkpoint"
    );
    for f in [
        "cuCheckpointProcessLock",
        "cuCheckpointProcessGetRestoreThreadId",
        "cuCheckpointProcessRestore",
    ] {
        assert!(!dlsym_finds(&lib, f), "{f} must not exist before r570");
    }
    drop(w);
    let w = TestWorld::new(&config(580, "").replace("request_timeout_ms", "hidden_symbols = [\"cuCheckpointProcessUnlock\", \"cuDeviceGetUuid_v2\"]\nrequest_timeout_ms"));
    let lib = w.path().join("lib/libcuda.so.1");
    assert!(dlsym_finds(&lib, "cuCheckpointProcessLock"));
    assert!(!dlsym_finds(&lib, "cuCheckpointProcessUnlock"));
    assert!(!dlsym_finds(&lib, "cuDeviceGetUuid_v2"));
    assert!(dlsym_finds(&lib, "cuDeviceGetUuid"));
    let image = std::fs::read(&lib).unwrap();
    assert_eq!(
        mock_libcuda::elf::soname(&image).unwrap().as_deref(),
        Some("libcuda.so.1")
    );
    let names = mock_libcuda::elf::exported_names(&image).unwrap();
    for s in mock_libcuda::ffi::EXPORTED_SYMBOLS {
        let hidden = ["cuCheckpointProcessUnlock", "cuDeviceGetUuid_v2"].contains(s);
        assert_eq!(names.iter().any(|n| n == s), !hidden, "{s}");
    }
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
fn get_proc_address_follows_the_documented_rules() {
    let _s = serial();
    let _w = TestWorld::new(&config(575, "").replace(
        "request_timeout_ms",
        "hidden_symbols = [\"cuCheckpointProcessLock\"]\nrequest_timeout_ms",
    ));
    // r575 is CUDA 12.9.
    let (r, p, st) = proc_address("cuCheckpointProcessGetState", 12080);
    assert_eq!(
        (r, st),
        (CUresult::SUCCESS, proc_address_query::SUCCESS as c_int)
    );
    assert_eq!(p, exports::cuCheckpointProcessGetState as *mut c_void);
    let (r, p, st) = proc_address("cuCheckpointProcessGetState", 12000);
    assert_eq!(
        (r, p.is_null(), st),
        (
            CUresult::SUCCESS,
            true,
            proc_address_query::VERSION_NOT_SUFFICIENT as c_int
        )
    );
    let (r, p, st) = proc_address("cuCheckpointProcessLock", 12080);
    assert_eq!(
        (r, p.is_null(), st),
        (
            CUresult::SUCCESS,
            true,
            proc_address_query::SYMBOL_NOT_FOUND as c_int
        ),
        "hidden"
    );
    let (r, p, st) = proc_address("cuNoSuchThing", 12000);
    assert_eq!(
        (r, p.is_null(), st),
        (
            CUresult::SUCCESS,
            true,
            proc_address_query::SYMBOL_NOT_FOUND as c_int
        )
    );
    let (r, _, _) = proc_address("cuInit", 13000);
    assert_eq!(
        r,
        CUresult::ERROR_INVALID_VALUE,
        "a version newer than the driver"
    );
    // The base name resolves to the ABI variant of the requested version.
    assert_eq!(
        proc_address("cuDeviceGetUuid", 11040).1,
        exports::cuDeviceGetUuid_v2 as *mut c_void
    );
    assert_eq!(
        proc_address("cuDeviceGetUuid", 10000).1,
        exports::cuDeviceGetUuid as *mut c_void
    );
    assert_eq!(
        proc_address("cuMemAlloc", 12000).1,
        exports::cuMemAlloc_v2 as *mut c_void
    );
}

#[test]
fn the_export_table_serves_the_command_line_only() {
    let _s = serial();
    let _w = TestWorld::new(&config(550, ""));
    let mut t: *const c_void = std::ptr::null();
    // SAFETY: valid out-pointer and id.
    let r = unsafe { exports::cuGetExportTable(&mut t, &CHECKPOINT_CLI_EXPORT_TABLE_ID) };
    assert_eq!(r, CUresult::SUCCESS);
    // SAFETY: the table is a static `CheckpointCliExportTable`.
    let table = unsafe { &*t.cast::<abi::cuda::CheckpointCliExportTable>() };
    assert!(table.size >= abi::cuda::CHECKPOINT_CLI_EXPORT_TABLE_MIN_SIZE && table.run.is_some());
    let other = CUuuid { bytes: [7; 16] };
    // SAFETY: as above.
    let r = unsafe { exports::cuGetExportTable(&mut t, &other) };
    assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
    let mut v = 0;
    // SAFETY: valid out-pointer.
    let r = unsafe { exports::cuDriverGetVersion(&mut v) };
    assert_eq!(r, CUresult::SUCCESS);
    assert_eq!(v, 12040, "r550 reports CUDA 12.4");
    // SAFETY: NULL is the documented error case.
    let r = unsafe { exports::cuDriverGetVersion(std::ptr::null_mut()) };
    assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
}

#[test]
fn gpu_pairs_are_reserved_bytes_before_cuda_13() {
    let _s = serial();
    let mut w = TestWorld::new(&config(575, ""));
    let pid = w.spawn_app(&["--kib", "4"]);
    mock_libcuda::driver::init(0).unwrap();
    mock_libcuda::driver::lock(pid, 0).unwrap();
    mock_libcuda::driver::checkpoint(pid).unwrap();
    let mut pair = CUcheckpointGpuPair::default();
    let mut args = CUcheckpointRestoreArgs {
        gpu_pairs: &mut pair,
        gpu_pairs_count: 1,
        ..Default::default()
    };
    // SAFETY: valid args pointing at one valid pair.
    let r = unsafe { exports::cuCheckpointProcessRestore(pid, &mut args) };
    assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
    // Zero-filled arguments (or none) restore.
    // SAFETY: NULL args are documented as optional.
    let r = unsafe { exports::cuCheckpointProcessRestore(pid, std::ptr::null_mut()) };
    assert_eq!(r, CUresult::SUCCESS);
    mock_libcuda::driver::unlock(pid).unwrap();
    assert!(w.verify(0, pid).starts_with("PASS"));
}

#[test]
fn visible_devices_shape_the_workloads_ordinals() {
    let _s = serial();
    let mut w = TestWorld::new(&config(580, ""));
    let cases: &[(&str, &str)] = &[
        ("1", GPU1),
        ("1,0", GPU1),
        ("GPU-0000", GPU0),
        (GPU1, GPU1),
        ("gpu-11111111-1111", GPU1),
    ];
    for (n, (cvd, first)) in cases.iter().enumerate() {
        let pid = w.spawn_app_env(&["--kib", "4"], &[("CUDA_VISIBLE_DEVICES", cvd)]);
        let report = w.report(n);
        assert!(
            report.contains(&format!("READY pid={pid} cuda=yes gpus={first}")),
            "CUDA_VISIBLE_DEVICES={cvd}: {report}"
        );
    }
    // No visible GPU: cuInit fails with NO_DEVICE and the workload says so.
    let before = cases.len();
    w.spawn_app_env(&["--kib", "4"], &[("CUDA_VISIBLE_DEVICES", "")]);
    assert!(
        w.report(before).contains("FAIL") && w.report(before).contains("CUresult 100"),
        "{}",
        w.report(before)
    );
    w.spawn_app_env(
        &["--kib", "4", "--gpus", "1"],
        &[("CUDA_VISIBLE_DEVICES", "0,7,1")],
    );
    assert!(
        w.report(before + 1).contains("GPU ordinal 1"),
        "an invalid entry ends the list: {}",
        w.report(before + 1)
    );
}

#[test]
fn reconfiguring_keeps_state_and_rebuilds_the_library_when_symbols_change() {
    let _s = serial();
    let mut w = TestWorld::new(&config(580, ""));
    let pid = w.spawn_app(&["--kib", "4"]);
    let lib = w.path().join("lib/libcuda.so.1");
    assert!(dlsym_finds(&lib, "cuCheckpointProcessLock"));
    let cfg = mock_libcuda::world::config::WorldConfig::parse(&config(565, ""), "t").unwrap();
    let e = mock_libcuda::world::World::reconfigure(w.path(), &cfg, None).unwrap_err();
    assert!(e.to_string().contains("mock library is needed"), "{e}");
    mock_libcuda::world::World::reconfigure(w.path(), &cfg, Some(&mock_so())).unwrap();
    assert!(
        !dlsym_finds(&lib, "cuCheckpointProcessLock"),
        "r565 has no checkpoint API"
    );
    let st = mock_libcuda::world::World::open(w.path())
        .unwrap()
        .read_state()
        .unwrap();
    assert!(
        st.by_pid(pid).is_some(),
        "the running workload is still known"
    );
    let bad = config(
        580,
        "[[fault]]\nfunction = \"cuInit\"\npid = 5\naction = { kind = \"return\", code = 3 }\n",
    );
    let e = mock_libcuda::world::config::WorldConfig::parse(&bad, "bad.toml").unwrap_err();
    assert!(e.to_string().contains("pid only applies"), "{e}");
}
