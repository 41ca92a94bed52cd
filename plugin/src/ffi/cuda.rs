//! `libcuda.so.1`, opened at run time with libloading (never linked).
//!
//! The library is looked up by its SONAME with the normal loader search, so `LD_LIBRARY_PATH`
//! selects a mock driver in tests. Once loaded it is kept for the life of the process: the real
//! driver starts threads and is not safe to unload, and an abandoned call may still be running
//! inside it (see [`crate::backend::driver`]).
//!
//! [`CudaDriver`] is the checkpoint API as safe calls that return the driver's code; the
//! backends, the helper process and the tests' fakes all speak it.

use crate::inventory::GpuInfo;
use crate::task::Pid;
use abi::cuda::CUSTOM_STORAGE_MIN_DRIVER_VERSION;
use abi::{
    CUcheckpointCheckpointArgs, CUcheckpointGpuPair, CUcheckpointLockArgs, CUcheckpointRestoreArgs,
    CUcheckpointUnlockArgs, CUprocessState, CUresult, CUuuid, GpuUuid,
};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Arc, OnceLock};

/// The driver entry points the driver-API backend needs, as safe calls returning the raw code.
pub trait CudaDriver: Send + Sync + 'static {
    /// `cuDriverGetVersion`.
    fn driver_version(&self) -> Result<i32, CUresult>;
    /// `cuInit(0)`.
    fn init(&self) -> CUresult;
    /// `cuCheckpointProcessGetRestoreThreadId`.
    fn restore_tid(&self, pid: Pid) -> Result<i32, CUresult>;
    /// `cuCheckpointProcessGetState`.
    fn state(&self, pid: Pid) -> Result<CUprocessState, CUresult>;
    /// `cuCheckpointProcessLock` with `timeoutMs` (0 = none).
    fn lock(&self, pid: Pid, timeout_ms: u32) -> CUresult;
    /// `cuCheckpointProcessCheckpoint` with zeroed arguments.
    fn checkpoint(&self, pid: Pid) -> CUresult;
    /// `cuCheckpointProcessRestore`, with `pairs` when non-empty.
    fn restore(&self, pid: Pid, pairs: &[CUcheckpointGpuPair]) -> CUresult;
    /// `cuCheckpointProcessUnlock` with zeroed arguments.
    fn unlock(&self, pid: Pid) -> CUresult;
    /// Whether the driver has custom storage (CUDA 13.4: `cuGetProcAddress` finds
    /// `cuCheckpointOperationComplete` at 13040). Makes no call that starts driver threads.
    fn custom_storage(&self) -> bool {
        false
    }
}

/// Why the driver library could not be used at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error("cannot load libcuda.so.1: {0}")]
    LibraryAbsent(String),
    #[error("libcuda.so.1 lacks {0}")]
    SymbolMissing(&'static str),
}

/// The driver library's SONAME.
pub const LIBRARY: &str = "libcuda.so.1";

type DriverGetVersionFn = unsafe extern "C" fn(*mut c_int) -> CUresult;
pub(crate) type InitFn = unsafe extern "C" fn(c_uint) -> CUresult;
type GetRestoreTidFn = unsafe extern "C" fn(c_int, *mut c_int) -> CUresult;
type GetStateFn = unsafe extern "C" fn(c_int, *mut CUprocessState) -> CUresult;
type LockFn = unsafe extern "C" fn(c_int, *mut CUcheckpointLockArgs) -> CUresult;
type CheckpointFn = unsafe extern "C" fn(c_int, *mut CUcheckpointCheckpointArgs) -> CUresult;
type RestoreFn = unsafe extern "C" fn(c_int, *mut CUcheckpointRestoreArgs) -> CUresult;
type UnlockFn = unsafe extern "C" fn(c_int, *mut CUcheckpointUnlockArgs) -> CUresult;
pub(crate) type CompleteFn = unsafe extern "C" fn(*mut c_void) -> CUresult;
type GetProcAddressV2Fn = unsafe extern "C" fn(
    *const std::ffi::c_char,
    *mut *mut c_void,
    c_int,
    u64,
    *mut c_int,
) -> CUresult;

static LIBRARY_HANDLE: OnceLock<libloading::Library> = OnceLock::new();

/// The resolved entry points. The pointers stay valid forever: the library is never unloaded.
#[derive(Debug, Clone, Copy)]
struct LoadedDriver {
    driver_get_version: DriverGetVersionFn,
    init: InitFn,
    get_restore_tid: GetRestoreTidFn,
    get_state: GetStateFn,
    lock: LockFn,
    checkpoint: CheckpointFn,
    restore: RestoreFn,
    unlock: UnlockFn,
}

pub(crate) fn library() -> Result<&'static libloading::Library, LoadError> {
    if let Some(l) = LIBRARY_HANDLE.get() {
        return Ok(l);
    }
    // SAFETY: loading the CUDA driver runs its initialisers; that is what loading a driver
    // library is for, and it has no preconditions on our side. RTLD_LAZY|RTLD_LOCAL (libloading's
    // default) keeps its symbols out of CRIU's global namespace.
    let lib = unsafe { libloading::Library::new(LIBRARY) }
        .map_err(|e| LoadError::LibraryAbsent(e.to_string()))?;
    let _ = LIBRARY_HANDLE.set(lib);
    LIBRARY_HANDLE
        .get()
        .ok_or_else(|| LoadError::LibraryAbsent("library handle lost".into()))
}

/// Resolves one entry point by name.
macro_rules! entry {
    ($lib:expr, $name:literal, $ty:ty) => {{
        // SAFETY: the symbol is the CUDA driver entry point of that name, whose C signature is
        // `$ty` (CUDA Driver API, checkpoint group and version management); the pointer is copied
        // out of the Symbol and stays valid because the library is never unloaded.
        let sym = unsafe { $lib.get::<$ty>(concat!($name, "\0").as_bytes()) };
        *sym.map_err(|_| LoadError::SymbolMissing($name))?
    }};
}

/// Variables that would reorder or hide GPUs in CRIU's view; removed before the first `cuInit`.
pub const VIEW_VARIABLES: [&str; 2] = ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"];

/// `cuInit(0)`, once per process, after removing [`VIEW_VARIABLES`] from CRIU's environment so
/// the plugin sees every GPU in the driver's default order whatever the operator exported
/// (the GPU inventory and device maps depend on it). Removed values are logged.
pub(crate) fn init_once(init: InitFn) -> CUresult {
    static RESULT: OnceLock<CUresult> = OnceLock::new();
    *RESULT.get_or_init(|| {
        for v in VIEW_VARIABLES {
            if let Some(old) = std::env::var_os(v) {
                super::log::log(
                    abi::criu::log_level::WARN,
                    &format!(
                        "{v}={} is ignored: the plugin enumerates every GPU in the driver's order",
                        old.to_string_lossy()
                    ),
                );
                std::env::remove_var(v);
            }
        }
        // SAFETY: `cuInit(0)`; the flags must be zero.
        unsafe { init(0) }
    })
}

type DeviceGetCountFn = unsafe extern "C" fn(*mut c_int) -> CUresult;
type DeviceGetFn = unsafe extern "C" fn(*mut c_int, c_int) -> CUresult;
type DeviceGetUuidFn = unsafe extern "C" fn(*mut CUuuid, c_int) -> CUresult;
type DeviceGetNameFn = unsafe extern "C" fn(*mut std::ffi::c_char, c_int, c_int) -> CUresult;
type DeviceTotalMemFn = unsafe extern "C" fn(*mut usize, c_int) -> CUresult;

/// Why [`enumerate_gpus`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnumError {
    /// `libcuda.so.1` or one of the enumeration's entry points is missing.
    Load(LoadError),
    /// A driver call of the enumeration failed.
    Driver { call: &'static str, code: CUresult },
}

impl From<LoadError> for EnumError {
    fn from(e: LoadError) -> Self {
        EnumError::Load(e)
    }
}

fn cu(call: &'static str, code: CUresult) -> Result<(), EnumError> {
    if code.is_success() {
        Ok(())
    } else {
        Err(EnumError::Driver { call, code })
    }
}

/// Every GPU of CRIU's view: ordinal, UUID, name and memory, through the driver library
/// (needed by both backends: `cuda-checkpoint` itself runs on it).
pub fn enumerate_gpus() -> Result<Vec<GpuInfo>, EnumError> {
    let lib = library()?;
    // `entry!`'s `?` turns a missing symbol into `EnumError::Load`; only the two look-ups with a
    // fallback name go through a closure, to fall back to the older name.
    let init = entry!(lib, "cuInit", InitFn);
    let count_fn = entry!(lib, "cuDeviceGetCount", DeviceGetCountFn);
    let get = entry!(lib, "cuDeviceGet", DeviceGetFn);
    let uuid_fn = (|| Ok::<_, LoadError>(entry!(lib, "cuDeviceGetUuid_v2", DeviceGetUuidFn)))()
        .or_else(|_| (|| Ok::<_, LoadError>(entry!(lib, "cuDeviceGetUuid", DeviceGetUuidFn)))())?;
    let name_fn = entry!(lib, "cuDeviceGetName", DeviceGetNameFn);
    let mem_fn = (|| Ok::<_, LoadError>(entry!(lib, "cuDeviceTotalMem_v2", DeviceTotalMemFn)))()
        .or_else(|_| {
            (|| Ok::<_, LoadError>(entry!(lib, "cuDeviceTotalMem", DeviceTotalMemFn)))()
        })?;
    cu("cuInit", init_once(init))?;
    let mut count: c_int = 0;
    // SAFETY: writes one int through a valid pointer.
    cu("cuDeviceGetCount", unsafe { count_fn(&mut count) })?;
    let mut gpus = Vec::new();
    for ordinal in 0..count.max(0) {
        let mut dev: c_int = 0;
        // SAFETY: writes one CUdevice (int) through a valid pointer.
        cu("cuDeviceGet", unsafe { get(&mut dev, ordinal) })?;
        let mut uuid = CUuuid::default();
        // SAFETY: writes one 16-byte CUuuid through a valid pointer.
        cu("cuDeviceGetUuid", unsafe { uuid_fn(&mut uuid, dev) })?;
        let mut name = [0 as std::ffi::c_char; 256];
        // SAFETY: the driver writes at most `len` bytes, NUL included, into the buffer.
        cu("cuDeviceGetName", unsafe {
            name_fn(name.as_mut_ptr(), name.len() as c_int, dev)
        })?;
        let mut mem: usize = 0;
        // SAFETY: writes one size_t through a valid pointer.
        cu("cuDeviceTotalMem", unsafe { mem_fn(&mut mem, dev) })?;
        // SAFETY: the buffer is NUL-terminated: the driver terminates it and its last byte
        // was zero to begin with.
        let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        gpus.push(GpuInfo {
            ordinal: ordinal as u32,
            uuid: GpuUuid::from_cu(uuid),
            name,
            memory_bytes: mem as u64,
        });
    }
    Ok(gpus)
}

/// Opens the driver and resolves `cuInit`, `cuDriverGetVersion` and the six
/// `cuCheckpointProcess*` entry points.
pub fn load() -> Result<Arc<dyn CudaDriver>, LoadError> {
    let lib = library()?;
    let d = LoadedDriver {
        driver_get_version: entry!(lib, "cuDriverGetVersion", DriverGetVersionFn),
        init: entry!(lib, "cuInit", InitFn),
        get_restore_tid: entry!(
            lib,
            "cuCheckpointProcessGetRestoreThreadId",
            GetRestoreTidFn
        ),
        get_state: entry!(lib, "cuCheckpointProcessGetState", GetStateFn),
        lock: entry!(lib, "cuCheckpointProcessLock", LockFn),
        checkpoint: entry!(lib, "cuCheckpointProcessCheckpoint", CheckpointFn),
        restore: entry!(lib, "cuCheckpointProcessRestore", RestoreFn),
        unlock: entry!(lib, "cuCheckpointProcessUnlock", UnlockFn),
    };
    Ok(Arc::new(d))
}

/// The checkpoint API's entry points, in the order [`load`] resolves them.
pub const CHECKPOINT_SYMBOLS: [&str; 6] = [
    "cuCheckpointProcessGetRestoreThreadId",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
];

/// Which of `names` the driver library exports (looked up with `dlsym`, nothing called), in
/// the order given: what `cuda-plugin-doctor` reports of the checkpoint API.
pub fn exported(names: &[&str]) -> Result<Vec<bool>, LoadError> {
    let lib = library()?;
    Ok(names
        .iter()
        .map(|n| {
            let mut c = n.as_bytes().to_vec();
            c.push(0);
            // SAFETY: only the symbol's presence is asked; the pointer is never called or
            // dereferenced (the type is a placeholder for an address).
            unsafe { lib.get::<*const std::ffi::c_void>(&c) }.is_ok()
        })
        .collect())
}

/// `cuDriverGetVersion` alone, without the checkpoint API ([`load`] needs all of it): the
/// CUDA version of a driver too old for the driver-API backend. Calls nothing else (no
/// `cuInit`).
pub fn driver_version() -> Result<Result<i32, CUresult>, LoadError> {
    let lib = library()?;
    let f = entry!(lib, "cuDriverGetVersion", DriverGetVersionFn);
    let mut v: c_int = 0;
    // SAFETY: `cuDriverGetVersion(int *)` writes one int through a valid pointer.
    let r = unsafe { f(&mut v) };
    Ok(if r.is_success() { Ok(v) } else { Err(r) })
}

impl CudaDriver for LoadedDriver {
    fn driver_version(&self) -> Result<i32, CUresult> {
        let mut v: c_int = 0;
        // SAFETY: `cuDriverGetVersion(int *)` writes one int through a valid pointer.
        let r = unsafe { (self.driver_get_version)(&mut v) };
        if r.is_success() {
            Ok(v)
        } else {
            Err(r)
        }
    }

    fn init(&self) -> CUresult {
        init_once(self.init)
    }

    fn restore_tid(&self, pid: Pid) -> Result<i32, CUresult> {
        let mut tid: c_int = 0;
        // SAFETY: writes one int through a valid pointer; `pid` is any integer.
        let r = unsafe { (self.get_restore_tid)(pid, &mut tid) };
        if r.is_success() {
            Ok(tid)
        } else {
            Err(r)
        }
    }

    fn state(&self, pid: Pid) -> Result<CUprocessState, CUresult> {
        let mut st = CUprocessState(u32::MAX);
        // SAFETY: writes one CUprocessState (a u32 enum) through a valid pointer.
        let r = unsafe { (self.get_state)(pid, &mut st) };
        if r.is_success() {
            Ok(st)
        } else {
            Err(r)
        }
    }

    fn lock(&self, pid: Pid, timeout_ms: u32) -> CUresult {
        let mut args = CUcheckpointLockArgs {
            timeout_ms,
            ..Default::default()
        };
        // SAFETY: a valid, zero-reserved 64-byte argument struct the driver only reads.
        unsafe { (self.lock)(pid, &mut args) }
    }

    fn checkpoint(&self, pid: Pid) -> CUresult {
        let mut args = CUcheckpointCheckpointArgs::default();
        // SAFETY: a valid, all-zero 64-byte argument struct (classic host-memory checkpoint).
        unsafe { (self.checkpoint)(pid, &mut args) }
    }

    fn restore(&self, pid: Pid, pairs: &[CUcheckpointGpuPair]) -> CUresult {
        let mut pairs = pairs.to_vec();
        let mut args = CUcheckpointRestoreArgs::default();
        if !pairs.is_empty() {
            args.gpu_pairs = pairs.as_mut_ptr();
            args.gpu_pairs_count = u32::try_from(pairs.len()).unwrap_or(u32::MAX);
        }
        // SAFETY: a valid 64-byte argument struct; `gpu_pairs` (when set) points to
        // `gpu_pairs_count` pairs that outlive the call. The backend only runs on drivers
        // >= 13000, which read the pair fields.
        unsafe { (self.restore)(pid, &mut args) }
    }

    fn unlock(&self, pid: Pid) -> CUresult {
        let mut args = CUcheckpointUnlockArgs::default();
        // SAFETY: a valid, all-zero 64-byte argument struct.
        unsafe { (self.unlock)(pid, &mut args) }
    }

    fn custom_storage(&self) -> bool {
        available().unwrap_or(false)
    }
}

/// `cuCheckpointOperationComplete` as real callers find it: `cuGetProcAddress_v2` asked for
/// CUDA 13.4. `Ok(None)`: this driver has no custom storage (older than 13.4, or the symbol
/// is not there).
pub(crate) fn complete_entry(lib: &libloading::Library) -> Result<Option<CompleteFn>, LoadError> {
    let version_fn = entry!(lib, "cuDriverGetVersion", DriverGetVersionFn);
    let mut version: c_int = 0;
    // SAFETY: `cuDriverGetVersion(int *)` writes one int through a valid pointer.
    if !unsafe { version_fn(&mut version) }.is_success()
        || version < CUSTOM_STORAGE_MIN_DRIVER_VERSION
    {
        return Ok(None);
    }
    let gpa = entry!(lib, "cuGetProcAddress_v2", GetProcAddressV2Fn);
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut status: c_int = 0;
    // SAFETY: a NUL-terminated name, and valid out-pointers for the function pointer and the
    // query status; flags 0 is CU_GET_PROC_ADDRESS_DEFAULT.
    let r = unsafe {
        gpa(
            c"cuCheckpointOperationComplete".as_ptr(),
            &mut pfn,
            CUSTOM_STORAGE_MIN_DRIVER_VERSION,
            0,
            &mut status,
        )
    };
    if !r.is_success() || pfn.is_null() {
        return Ok(None);
    }
    // SAFETY: the driver returned the address of `cuCheckpointOperationComplete`, whose C
    // signature is `CUresult (CUcheckpointOperationHandle)`; function and data pointers have
    // the same size on every platform the plugin builds for.
    Ok(Some(unsafe {
        std::mem::transmute::<*mut c_void, CompleteFn>(pfn)
    }))
}

/// Whether the driver has custom storage: loads the library and probes
/// `cuCheckpointOperationComplete` with `cuGetProcAddress(…, 13040)`. Makes no call that
/// starts driver threads (no `cuInit`).
pub fn available() -> Result<bool, LoadError> {
    Ok(complete_entry(library()?)?.is_some())
}
