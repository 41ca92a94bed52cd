//! `libcuda.so.1`, opened at run time with libloading (never linked).
//!
//! The library is looked up by its SONAME with the normal loader search, so `LD_LIBRARY_PATH`
//! selects a mock driver in tests. Once loaded it is kept for the life of the process: the real
//! driver starts threads and is not safe to unload, and an abandoned call may still be running
//! inside it (see [`crate::backend::driver`]).

use crate::backend::driver::{CudaDriver, LoadError};
use crate::backend::Pid;
use abi::{
    CUcheckpointCheckpointArgs, CUcheckpointGpuPair, CUcheckpointLockArgs, CUcheckpointRestoreArgs,
    CUcheckpointUnlockArgs, CUprocessState, CUresult,
};
use std::ffi::{c_int, c_uint};
use std::sync::{Arc, OnceLock};

/// The driver library's SONAME.
pub const LIBRARY: &str = "libcuda.so.1";

type DriverGetVersionFn = unsafe extern "C" fn(*mut c_int) -> CUresult;
type InitFn = unsafe extern "C" fn(c_uint) -> CUresult;
type GetRestoreTidFn = unsafe extern "C" fn(c_int, *mut c_int) -> CUresult;
type GetStateFn = unsafe extern "C" fn(c_int, *mut CUprocessState) -> CUresult;
type LockFn = unsafe extern "C" fn(c_int, *mut CUcheckpointLockArgs) -> CUresult;
type CheckpointFn = unsafe extern "C" fn(c_int, *mut CUcheckpointCheckpointArgs) -> CUresult;
type RestoreFn = unsafe extern "C" fn(c_int, *mut CUcheckpointRestoreArgs) -> CUresult;
type UnlockFn = unsafe extern "C" fn(c_int, *mut CUcheckpointUnlockArgs) -> CUresult;

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

fn library() -> Result<&'static libloading::Library, LoadError> {
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
        // SAFETY: `cuInit(0)`; the flags must be zero.
        unsafe { (self.init)(0) }
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
}
