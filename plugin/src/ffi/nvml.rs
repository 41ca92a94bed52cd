//! `libnvidia-ml.so.1` (NVML), opened at run time (never linked): which GPU holds how much
//! memory, for which process, and which GPUs are in MIG mode.
//!
//! The plugin asks NVML once per dump (how much device memory each task of the tree holds: what
//! its checkpoint will stage into host memory and how long its copy may take, and whether a GPU
//! it uses is in MIG mode, which the driver cannot checkpoint) and once per
//! restore (how much memory each target GPU has free). A node without NVML, or an NVML that
//! fails, only costs those checks (the caller logs that they were skipped). The library stays
//! loaded once opened, like the driver's.

use crate::nvml::{GpuMemory, NodeGpu, NodeReport, NvmlError, Snapshot};
use abi::nvml::{
    NvmlDevice, NvmlEnableState, NvmlMemory, NvmlProcessInfo, NvmlReturn, NVML_DEVICE_MIG_DISABLE,
    NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE,
    NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE, NVML_VALUE_NOT_AVAILABLE_ULL,
};
use abi::GpuUuid;
use std::ffi::{c_char, c_uint, CStr};
use std::sync::OnceLock;

/// The library's SONAME.
pub const LIBRARY: &str = "libnvidia-ml.so.1";

type InitFn = unsafe extern "C" fn() -> NvmlReturn;
type ShutdownFn = unsafe extern "C" fn() -> NvmlReturn;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> NvmlReturn;
type HandleFn = unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> NvmlReturn;
type UuidFn = unsafe extern "C" fn(NvmlDevice, *mut c_char, c_uint) -> NvmlReturn;
type MemFn = unsafe extern "C" fn(NvmlDevice, *mut NvmlMemory) -> NvmlReturn;
type ProcsFn = unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut NvmlProcessInfo) -> NvmlReturn;

static LIBRARY_HANDLE: OnceLock<Result<libloading::Library, String>> = OnceLock::new();

fn library() -> Result<&'static libloading::Library, NvmlError> {
    LIBRARY_HANDLE
        .get_or_init(|| {
            // SAFETY: loading NVML runs its initialisers, which is what loading it is for; it
            // has no preconditions on our side. RTLD_LOCAL keeps its symbols out of CRIU's.
            unsafe { libloading::Library::new(LIBRARY) }.map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| NvmlError::Absent(e.clone()))
}

macro_rules! entry {
    ($lib:expr, $name:literal, $ty:ty) => {{
        // SAFETY: the symbol is the NVML entry point of that name, whose C signature is `$ty`
        // (NVML API reference); the pointer stays valid because the library is never unloaded.
        let sym = unsafe { $lib.get::<$ty>(concat!($name, "\0").as_bytes()) };
        *sym.map_err(|_| NvmlError::Absent(format!("{LIBRARY} lacks {}", $name)))?
    }};
}

/// An optional entry point: `None` when the library lacks it.
macro_rules! optional_entry {
    ($lib:expr, $name:literal, $ty:ty) => {{
        // SAFETY: as in `entry!`: the NVML entry point of that name has the C signature `$ty`,
        // and the library is never unloaded.
        let sym = unsafe { $lib.get::<$ty>(concat!($name, "\0").as_bytes()) };
        sym.ok().map(|s| *s)
    }};
}

fn check(what: &'static str, r: NvmlReturn) -> Result<(), NvmlError> {
    if r.is_success() {
        Ok(())
    } else {
        Err(NvmlError::Call { what, code: r })
    }
}

/// [`snapshot`] on `worker`, given up after `limit` (an NVML that hangs must not hang CRIU).
pub fn snapshot_within(
    worker: &crate::worker::Worker,
    limit: Option<std::time::Duration>,
) -> Result<Snapshot, NvmlError> {
    worker
        .call("NVML memory query", limit, snapshot)
        .map_err(|e| NvmlError::Stuck(e.to_string()))?
}

/// Every GPU NVML sees, with its memory and the processes using it (host pids).
pub fn snapshot() -> Result<Snapshot, NvmlError> {
    let lib = library()?;
    let init = entry!(lib, "nvmlInit_v2", InitFn);
    let count_fn = entry!(lib, "nvmlDeviceGetCount_v2", CountFn);
    let handle_fn = entry!(lib, "nvmlDeviceGetHandleByIndex_v2", HandleFn);
    let uuid_fn = entry!(lib, "nvmlDeviceGetUUID", UuidFn);
    let mem_fn = entry!(lib, "nvmlDeviceGetMemoryInfo", MemFn);
    let procs_fn = entry!(lib, "nvmlDeviceGetComputeRunningProcesses_v3", ProcsFn);
    let mig_fn = optional_entry!(lib, "nvmlDeviceGetMigMode", MigModeFn);
    // SAFETY: nvmlInit_v2 takes nothing; it may be called more than once (reference counted).
    check("nvmlInit_v2", unsafe { init() })?;
    let mut count: c_uint = 0;
    // SAFETY: `count` is a valid out-pointer.
    check("nvmlDeviceGetCount_v2", unsafe { count_fn(&mut count) })?;
    let mut gpus = Vec::new();
    for i in 0..count {
        let mut dev: NvmlDevice = std::ptr::null_mut();
        // SAFETY: `dev` is a valid out-pointer; `i` is below the count NVML reported.
        check("nvmlDeviceGetHandleByIndex_v2", unsafe {
            handle_fn(i, &mut dev)
        })?;
        let mut buf = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        let len = c_uint::try_from(buf.len()).unwrap_or(c_uint::MAX);
        // SAFETY: `dev` is a handle NVML returned; `buf` holds `len` bytes.
        check("nvmlDeviceGetUUID", unsafe {
            uuid_fn(dev, buf.as_mut_ptr(), len)
        })?;
        buf[buf.len() - 1] = 0;
        // SAFETY: NVML wrote a NUL-terminated string into `buf` (it succeeded, and the buffer
        // has the size the reference says always fits); the last byte is forced to NUL anyway.
        let text = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let uuid = GpuUuid::parse(&text).map_err(|e| NvmlError::BadUuid {
            text: crate::message::quote(&text).into_owned(),
            why: e.to_string(),
        })?;
        let mut mem = NvmlMemory::default();
        // SAFETY: `dev` is a handle NVML returned; `mem` is a valid out-pointer.
        check("nvmlDeviceGetMemoryInfo", unsafe { mem_fn(dev, &mut mem) })?;
        let procs = processes(procs_fn, dev)?;
        // A GPU without MIG support answers NOT_SUPPORTED: it is never in MIG mode.
        let mig = match mig_mode(mig_fn, dev) {
            Ok(on) => Some(on),
            Err(NvmlReturn::ERROR_NOT_SUPPORTED) => Some(false),
            Err(_) => None,
        };
        gpus.push(GpuMemory {
            uuid,
            total: mem.total,
            free: mem.free,
            processes: procs,
            mig,
        });
    }
    Ok(Snapshot { gpus })
}

type DriverVersionFn = unsafe extern "C" fn(*mut c_char, c_uint) -> NvmlReturn;
type NameFn = unsafe extern "C" fn(NvmlDevice, *mut c_char, c_uint) -> NvmlReturn;
type PersistenceFn = unsafe extern "C" fn(NvmlDevice, *mut NvmlEnableState) -> NvmlReturn;
type MigModeFn = unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut c_uint) -> NvmlReturn;

/// A string NVML writes into a buffer of `N` bytes (its documented size for the answer).
fn nvml_string<const N: usize>(
    f: impl FnOnce(*mut c_char, c_uint) -> NvmlReturn,
) -> Result<String, NvmlReturn> {
    let mut buf = [0 as c_char; N];
    let len = c_uint::try_from(N).unwrap_or(c_uint::MAX);
    let r = f(buf.as_mut_ptr(), len);
    if !r.is_success() {
        return Err(r);
    }
    buf[N - 1] = 0;
    // SAFETY: NVML succeeded, so it wrote a NUL-terminated string into `buf`; the last byte is
    // forced to NUL anyway.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// What `cuda-plugin-doctor` asks NVML: the driver version, and every GPU's UUID, name, total
/// memory, persistence mode and MIG mode. A missing `nvmlDeviceGetPersistenceMode` or
/// `nvmlDeviceGetMigMode` is reported per GPU as `NVML_ERROR_FUNCTION_NOT_FOUND`, not as a
/// failure of the whole query. Initialises NVML and shuts it down again.
pub fn node() -> Result<NodeReport, NvmlError> {
    let lib = library()?;
    let init = entry!(lib, "nvmlInit_v2", InitFn);
    let shutdown = entry!(lib, "nvmlShutdown", ShutdownFn);
    let version_fn = entry!(lib, "nvmlSystemGetDriverVersion", DriverVersionFn);
    let count_fn = entry!(lib, "nvmlDeviceGetCount_v2", CountFn);
    let handle_fn = entry!(lib, "nvmlDeviceGetHandleByIndex_v2", HandleFn);
    let uuid_fn = entry!(lib, "nvmlDeviceGetUUID", UuidFn);
    let name_fn = entry!(lib, "nvmlDeviceGetName", NameFn);
    let mem_fn = entry!(lib, "nvmlDeviceGetMemoryInfo", MemFn);
    let persistence_fn = optional_entry!(lib, "nvmlDeviceGetPersistenceMode", PersistenceFn);
    let mig_fn = optional_entry!(lib, "nvmlDeviceGetMigMode", MigModeFn);
    // SAFETY: nvmlInit_v2 takes nothing; it may be called more than once (reference counted).
    check("nvmlInit_v2", unsafe { init() })?;
    let report = (|| {
        let driver_version = nvml_string::<NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE>(|p, n| {
            // SAFETY: `p` points to `n` writable bytes.
            unsafe { version_fn(p, n) }
        });
        let mut count: c_uint = 0;
        // SAFETY: `count` is a valid out-pointer.
        check("nvmlDeviceGetCount_v2", unsafe { count_fn(&mut count) })?;
        let mut gpus = Vec::new();
        for i in 0..count {
            let mut dev: NvmlDevice = std::ptr::null_mut();
            // SAFETY: `dev` is a valid out-pointer; `i` is below the count NVML reported.
            check("nvmlDeviceGetHandleByIndex_v2", unsafe {
                handle_fn(i, &mut dev)
            })?;
            let text = nvml_string::<NVML_DEVICE_UUID_V2_BUFFER_SIZE>(|p, n| {
                // SAFETY: `dev` is a handle NVML returned; `p` points to `n` writable bytes.
                unsafe { uuid_fn(dev, p, n) }
            })
            .map_err(|code| NvmlError::Call {
                what: "nvmlDeviceGetUUID",
                code,
            })?;
            let uuid = GpuUuid::parse(&text).map_err(|e| NvmlError::BadUuid {
                text: crate::message::quote(&text).into_owned(),
                why: e.to_string(),
            })?;
            let name = nvml_string::<NVML_DEVICE_NAME_V2_BUFFER_SIZE>(|p, n| {
                // SAFETY: `dev` is a handle NVML returned; `p` points to `n` writable bytes.
                unsafe { name_fn(dev, p, n) }
            });
            let mut mem = NvmlMemory::default();
            // SAFETY: `dev` is a handle NVML returned; `mem` is a valid out-pointer.
            check("nvmlDeviceGetMemoryInfo", unsafe { mem_fn(dev, &mut mem) })?;
            let persistence = match persistence_fn {
                None => Err(NvmlReturn::ERROR_FUNCTION_NOT_FOUND),
                Some(f) => {
                    let mut mode = NvmlEnableState::DISABLED;
                    // SAFETY: `dev` is a handle NVML returned; `mode` is a valid out-pointer.
                    let r = unsafe { f(dev, &mut mode) };
                    if r.is_success() {
                        Ok(mode == NvmlEnableState::ENABLED)
                    } else {
                        Err(r)
                    }
                }
            };
            let mig = mig_mode(mig_fn, dev);
            gpus.push(NodeGpu {
                uuid,
                name,
                total: mem.total,
                persistence,
                mig,
            });
        }
        Ok(NodeReport {
            driver_version,
            gpus,
        })
    })();
    // SAFETY: one nvmlShutdown for the nvmlInit_v2 above.
    let _ = unsafe { shutdown() };
    report
}

/// `nvmlDeviceGetMigMode`'s current mode of `dev` (`f`: the entry point, `None` when the
/// library lacks it, reported as `NVML_ERROR_FUNCTION_NOT_FOUND`).
fn mig_mode(f: Option<MigModeFn>, dev: NvmlDevice) -> Result<bool, NvmlReturn> {
    let f = f.ok_or(NvmlReturn::ERROR_FUNCTION_NOT_FOUND)?;
    let (mut current, mut pending) = (NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_DISABLE);
    // SAFETY: `dev` is a handle NVML returned; both are valid out-pointers.
    let r = unsafe { f(dev, &mut current, &mut pending) };
    if r.is_success() {
        Ok(current == NVML_DEVICE_MIG_ENABLE)
    } else {
        Err(r)
    }
}

/// The compute processes of one GPU, with the count protocol: ask with room for none, then
/// with room for what NVML said (and a little more, for processes that started meanwhile).
fn processes(f: ProcsFn, dev: NvmlDevice) -> Result<Vec<(u32, Option<u64>)>, NvmlError> {
    let mut n: c_uint = 0;
    // SAFETY: with a count of 0 NVML writes no entry, only the count it needs.
    let r = unsafe { f(dev, &mut n, std::ptr::null_mut()) };
    if r.is_success() {
        return Ok(Vec::new());
    }
    if r != NvmlReturn::ERROR_INSUFFICIENT_SIZE {
        return Err(NvmlError::Call {
            what: "nvmlDeviceGetComputeRunningProcesses_v3",
            code: r,
        });
    }
    for _ in 0..3 {
        let mut room = n.saturating_add(8);
        let mut v = vec![NvmlProcessInfo::default(); room as usize];
        // SAFETY: `v` holds `room` entries and `room` says so; NVML writes at most that many.
        let r = unsafe { f(dev, &mut room, v.as_mut_ptr()) };
        if r == NvmlReturn::ERROR_INSUFFICIENT_SIZE {
            n = room;
            continue;
        }
        check("nvmlDeviceGetComputeRunningProcesses_v3", r)?;
        v.truncate(room as usize);
        return Ok(v
            .into_iter()
            .map(|p| {
                let bytes = (p.used_gpu_memory != NVML_VALUE_NOT_AVAILABLE_ULL)
                    .then_some(p.used_gpu_memory);
                (p.pid, bytes)
            })
            .collect());
    }
    Err(NvmlError::Call {
        what: "nvmlDeviceGetComputeRunningProcesses_v3",
        code: NvmlReturn::ERROR_INSUFFICIENT_SIZE,
    })
}
