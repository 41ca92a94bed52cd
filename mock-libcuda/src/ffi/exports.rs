//! The C ABI of the mock `libcuda.so.1`.
//!
//! Each export checks its pointers, converts them to Rust values and calls [`crate::driver`],
//! all under one panic guard: a panic (a bug in the mock) is reported on stderr and returns
//! `CUDA_ERROR_UNKNOWN`; the command-line entry returns 231 (that code's exit status). A NULL
//! output pointer is `CUDA_ERROR_INVALID_VALUE`; the optional argument structs of the
//! checkpoint calls may be NULL (the documented "optional"), and their reserved bytes must be
//! zero. GPU pairs in restore arguments are read only when the world's driver is CUDA 13.0 or
//! newer; below that those bytes are reserved too.

#![expect(
    clippy::missing_safety_doc,
    reason = "each export's safety contract is the C API's: every pointer argument is NULL or \
              valid for the access the driver API documents (see the module documentation)"
)]

use crate::driver;
use abi::cuda::{
    proc_address_query, CUcheckpointCustomStorageInfo, CUcheckpointCustomStoragePerDeviceData,
    CUcheckpointOperationHandle, CUcontext, CUdevice, CUdeviceptr, CUstream,
    CheckpointCliExportTable, ReservedBytes, CHECKPOINT_CLI_EXPORT_TABLE_ID,
    GPU_PAIRS_MIN_DRIVER_VERSION,
};
use abi::{
    CUcheckpointCheckpointArgs, CUcheckpointLockArgs, CUcheckpointRestoreArgs,
    CUcheckpointUnlockArgs, CUprocessState, CUresult, CUuuid, GpuUuid,
};
use mock_cuda_world::panic_guard;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uchar, c_uint, c_void, CStr};
use std::sync::Mutex;

/// Runs `f` under the panic guard ([`panic_guard::guard`]; a panic is `CUDA_ERROR_UNKNOWN`),
/// turning `Result<(), CUresult>` into a `CUresult`.
fn guard(name: &str, f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match panic_guard::guard("mock-libcuda", name, Err(CUresult::ERROR_UNKNOWN), f) {
        Ok(()) => CUresult::SUCCESS,
        Err(code) => code,
    }
}

/// Writes `value` through an output pointer, or fails with INVALID_VALUE when it is NULL.
///
/// # Safety
/// `out` must be NULL or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and, by the caller's contract, valid for writes of T.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// Reads an optional argument struct (NULL means all zero).
///
/// # Safety
/// `args` must be NULL or valid for a read of `T`.
unsafe fn get_args<T: Default>(args: *const T) -> T {
    if args.is_null() {
        T::default()
    } else {
        // SAFETY: non-NULL and valid for reads of T by the caller's contract.
        unsafe { args.read_unaligned() }
    }
}

/// The CUDA version the world's driver reports (0 without a world: every optional field is then
/// a reserved byte).
fn world_cuda_version() -> i32 {
    driver::world().map_or(0, |w| w.config().driver.cuda_version())
}

fn pairs_honoured() -> bool {
    world_cuda_version() >= GPU_PAIRS_MIN_DRIVER_VERSION
}

/// Records a call rejected for its arguments and returns INVALID_VALUE.
fn reject(function: &str, pid: c_int, why: &str) -> Result<(), CUresult> {
    if let Ok(w) = driver::world() {
        w.trace(
            function,
            &format!("pid={pid}, {why}"),
            &CUresult::ERROR_INVALID_VALUE.to_string(),
        );
    }
    Err(CUresult::ERROR_INVALID_VALUE)
}

// ----------------------------------------------------------------------------- init, devices

/// `CUresult cuInit(unsigned int Flags)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    guard("cuInit", || driver::init(flags))
}

/// `CUresult cuDriverGetVersion(int *driverVersion)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    guard("cuDriverGetVersion", || {
        if version.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let v = driver::driver_version()?;
        // SAFETY: checked non-NULL; the caller passes a valid int pointer.
        unsafe { put(version, v) }
    })
}

/// `CUresult cuDeviceGetCount(int *count)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    guard("cuDeviceGetCount", || {
        let n = driver::device_count()?;
        // SAFETY: NULL is rejected by `put`; otherwise the caller passes a valid int pointer.
        unsafe { put(count, n) }
    })
}

/// `CUresult cuDeviceGet(CUdevice *device, int ordinal)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    guard("cuDeviceGet", || {
        let d = driver::device_get(ordinal)?;
        // SAFETY: NULL is rejected by `put`; otherwise a valid CUdevice pointer.
        unsafe { put(device, d) }
    })
}

fn uuid_into(function: &str, uuid: *mut CUuuid, dev: CUdevice) -> Result<(), CUresult> {
    if uuid.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let u = driver::device_uuid(function, dev)?;
    // SAFETY: checked non-NULL; the caller passes a valid CUuuid pointer.
    unsafe { put(uuid, u.to_cu()) }
}

/// `CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    guard("cuDeviceGetUuid", || {
        uuid_into("cuDeviceGetUuid", uuid, dev)
    })
}

/// `CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    guard("cuDeviceGetUuid_v2", || {
        uuid_into("cuDeviceGetUuid_v2", uuid, dev)
    })
}

/// `CUresult cuDeviceGetName(char *name, int len, CUdevice dev)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guard("cuDeviceGetName", || {
        if name.is_null() || len <= 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let s = driver::device_name(dev)?;
        let n = s.len().min(len as usize - 1);
        // SAFETY: `name` is valid for `len` bytes (caller contract) and we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), name, n);
            name.add(n).write(0);
        }
        Ok(())
    })
}

fn total_mem(bytes: *mut usize, dev: CUdevice) -> Result<(), CUresult> {
    let b = driver::device_total_mem(dev)?;
    // SAFETY: NULL is rejected by `put`; otherwise a valid size_t pointer.
    unsafe { put(bytes, b as usize) }
}

/// `CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard("cuDeviceTotalMem", || total_mem(bytes, dev))
}

/// `CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard("cuDeviceTotalMem_v2", || total_mem(bytes, dev))
}

// ----------------------------------------------------------------------------- errors

/// `CUresult cuGetErrorName(CUresult error, const char **pStr)`: unknown codes give
/// INVALID_VALUE and a NULL string, as the driver does.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, out: *mut *const c_char) -> CUresult {
    guard("cuGetErrorName", || match error.name_cstr() {
        // SAFETY: NULL is rejected by `put`; otherwise a valid `const char **`.
        Some(s) => unsafe { put(out, s.as_ptr()) },
        None => {
            // SAFETY: as above.
            let _ = unsafe { put(out, std::ptr::null()) };
            Err(CUresult::ERROR_INVALID_VALUE)
        }
    })
}

/// `CUresult cuGetErrorString(CUresult error, const char **pStr)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, out: *mut *const c_char) -> CUresult {
    guard("cuGetErrorString", || match error.description_cstr() {
        // SAFETY: NULL is rejected by `put`; otherwise a valid `const char **`.
        Some(s) => unsafe { put(out, s.as_ptr()) },
        None => {
            // SAFETY: as above.
            let _ = unsafe { put(out, std::ptr::null()) };
            Err(CUresult::ERROR_INVALID_VALUE)
        }
    })
}

// ----------------------------------------------------------------------------- entry points

/// A symbol `cuGetProcAddress` can return: base name, the CUDA version that introduced it,
/// and its address.
struct ProcEntry {
    name: &'static str,
    since: c_int,
    /// Exported symbol that serves this base name (for the world's hidden-symbol check).
    symbol: &'static str,
    addr: *const c_void,
}

fn proc_table() -> Vec<ProcEntry> {
    macro_rules! e {
        ($name:literal, $since:expr, $sym:ident) => {
            ProcEntry {
                name: $name,
                since: $since,
                symbol: stringify!($sym),
                addr: $sym as *const c_void,
            }
        };
    }
    vec![
        e!("cuInit", 2000, cuInit),
        e!("cuDriverGetVersion", 2020, cuDriverGetVersion),
        e!("cuDeviceGetCount", 2000, cuDeviceGetCount),
        e!("cuDeviceGet", 2000, cuDeviceGet),
        e!("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
        e!("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
        e!("cuDeviceGetName", 2000, cuDeviceGetName),
        e!("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
        e!("cuGetErrorName", 6000, cuGetErrorName),
        e!("cuGetErrorString", 6000, cuGetErrorString),
        e!("cuGetProcAddress", 12000, cuGetProcAddress_v2),
        e!("cuGetProcAddress", 11030, cuGetProcAddress),
        e!("cuGetExportTable", 3000, cuGetExportTable),
        e!(
            "cuCheckpointProcessGetRestoreThreadId",
            12080,
            cuCheckpointProcessGetRestoreThreadId
        ),
        e!(
            "cuCheckpointProcessGetState",
            12080,
            cuCheckpointProcessGetState
        ),
        e!("cuCheckpointProcessLock", 12080, cuCheckpointProcessLock),
        e!(
            "cuCheckpointProcessCheckpoint",
            12080,
            cuCheckpointProcessCheckpoint
        ),
        e!(
            "cuCheckpointProcessRestore",
            12080,
            cuCheckpointProcessRestore
        ),
        e!(
            "cuCheckpointProcessUnlock",
            12080,
            cuCheckpointProcessUnlock
        ),
        e!("cuCtxCreate", 3020, cuCtxCreate_v2),
        e!("cuCtxDestroy", 4000, cuCtxDestroy_v2),
        e!("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
        e!(
            "cuDevicePrimaryCtxRelease",
            11000,
            cuDevicePrimaryCtxRelease_v2
        ),
        e!("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
        e!("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
        e!("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
        e!("cuCtxGetDevice", 2000, cuCtxGetDevice),
        e!("cuCtxSynchronize", 2000, cuCtxSynchronize),
        e!("cuMemAlloc", 3020, cuMemAlloc_v2),
        e!("cuMemFree", 3020, cuMemFree_v2),
        e!("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2),
        e!("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
        e!("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2),
        e!("cuMemsetD8", 3020, cuMemsetD8_v2),
        e!("cuMemGetInfo", 3020, cuMemGetInfo_v2),
        e!(
            "cuCheckpointOperationComplete",
            13040,
            cuCheckpointOperationComplete
        ),
        e!("cuMemHostAlloc", 2020, cuMemHostAlloc),
        e!("cuMemFreeHost", 2000, cuMemFreeHost),
        e!("cuMemHostRegister", 6050, cuMemHostRegister_v2),
        e!("cuMemHostRegister", 4000, cuMemHostRegister),
        e!("cuMemHostUnregister", 4000, cuMemHostUnregister),
        e!("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2),
        e!("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2),
        e!("cuStreamCreate", 2000, cuStreamCreate),
        e!("cuStreamDestroy", 4000, cuStreamDestroy_v2),
        e!("cuStreamSynchronize", 2000, cuStreamSynchronize),
        e!("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
        e!("cuStreamEndCapture", 10000, cuStreamEndCapture),
    ]
}

/// `cuGetProcAddress` semantics: `cudaVersion` newer than the driver is INVALID_VALUE; an
/// unknown or hidden symbol is SUCCESS with NULL and SYMBOL_NOT_FOUND; a symbol newer than the
/// requested version is SUCCESS with NULL and VERSION_NOT_SUFFICIENT.
fn get_proc_address(
    function: &str,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    status: *mut c_int,
) -> Result<(), CUresult> {
    let w = driver::world()?;
    if symbol.is_null() || pfn.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL, and the API requires a NUL-terminated symbol name.
    let name = unsafe { CStr::from_ptr(symbol) }
        .to_string_lossy()
        .into_owned();
    let args = || format!("symbol={name}, cudaVersion={version}");
    driver::call(&w, function, None, &args, || {
        if version > w.config().driver.cuda_version() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let table = proc_table();
        let candidates: Vec<&ProcEntry> = table
            .iter()
            .filter(|e| e.name == name && w.config().driver.exports(e.symbol))
            .collect();
        let (addr, st) = if candidates.is_empty() {
            (std::ptr::null(), proc_address_query::SYMBOL_NOT_FOUND)
        } else if let Some(e) = candidates
            .iter()
            .filter(|e| e.since <= version)
            .max_by_key(|e| e.since)
        {
            (e.addr, proc_address_query::SUCCESS)
        } else {
            (std::ptr::null(), proc_address_query::VERSION_NOT_SUFFICIENT)
        };
        // SAFETY: `pfn` checked non-NULL above; the caller passes a valid `void **`.
        unsafe { put(pfn, addr.cast_mut()) }?;
        if !status.is_null() {
            // SAFETY: non-NULL optional out-parameter of the caller.
            unsafe { put(status, st as c_int) }?;
        }
        Ok(())
    })
}

/// `CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    _flags: u64,
) -> CUresult {
    guard("cuGetProcAddress", || {
        get_proc_address(
            "cuGetProcAddress",
            symbol,
            pfn,
            version,
            std::ptr::null_mut(),
        )
    })
}

/// `CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
/// cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    _flags: u64,
    status: *mut c_int,
) -> CUresult {
    guard("cuGetProcAddress_v2", || {
        get_proc_address("cuGetProcAddress_v2", symbol, pfn, version, status)
    })
}

/// The table the `cuda-checkpoint` utility runs its command line through.
static CLI_TABLE: CheckpointCliExportTable = CheckpointCliExportTable {
    size: std::mem::size_of::<CheckpointCliExportTable>() as u64,
    reserved: [0; 6],
    run: Some(cli_entry),
};

/// `CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)`:
/// serves the checkpoint command-line table; any other id is CUDA_ERROR_INVALID_VALUE.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    id: *const CUuuid,
) -> CUresult {
    guard("cuGetExportTable", || {
        let w = driver::world()?;
        if table.is_null() || id.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        // SAFETY: non-NULL; the caller passes a valid CUuuid.
        let id = unsafe { id.read_unaligned() };
        driver::call(
            &w,
            "cuGetExportTable",
            None,
            &|| format!("id={}", GpuUuid::from_cu(id)),
            || {
                if id != CHECKPOINT_CLI_EXPORT_TABLE_ID {
                    return Err(CUresult::ERROR_INVALID_VALUE);
                }
                // SAFETY: `table` checked non-NULL above.
                unsafe { put(table, std::ptr::from_ref(&CLI_TABLE).cast::<c_void>()) }
            },
        )
    })
}

/// Slot 7 of the export table: `int run(int argc, char **argv)`, the whole command line.
unsafe extern "C" fn cli_entry(argc: c_int, argv: *mut *mut c_char) -> c_int {
    let unknown = c_int::from(CUresult::ERROR_UNKNOWN.exit_status());
    panic_guard::guard(
        "mock-libcuda",
        "the cuda-checkpoint command line",
        unknown,
        || {
            let mut args = Vec::new();
            if !argv.is_null() {
                for i in 0..usize::try_from(argc).unwrap_or(0) {
                    // SAFETY: argv holds argc valid pointers (the C main contract).
                    let p = unsafe { *argv.add(i) };
                    if p.is_null() {
                        break;
                    }
                    // SAFETY: each argv entry is a NUL-terminated string.
                    args.push(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
                }
            }
            crate::cli_entry::run_command_line(&args)
        },
    )
}

// ----------------------------------------------------------------------------- checkpoint API

/// `CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessGetRestoreThreadId(
    pid: c_int,
    tid: *mut c_int,
) -> CUresult {
    guard("cuCheckpointProcessGetRestoreThreadId", || {
        if tid.is_null() {
            return reject("cuCheckpointProcessGetRestoreThreadId", pid, "tid=NULL");
        }
        let t = driver::get_restore_tid(pid)?;
        // SAFETY: checked non-NULL.
        unsafe { put(tid, t) }
    })
}

/// `CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state)`. On failure `*state`
/// is left untouched, as with the driver.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessGetState(
    pid: c_int,
    state: *mut CUprocessState,
) -> CUresult {
    guard("cuCheckpointProcessGetState", || {
        if state.is_null() {
            return reject("cuCheckpointProcessGetState", pid, "state=NULL");
        }
        let s = driver::get_state(pid)?;
        // SAFETY: checked non-NULL.
        unsafe { put(state, s) }
    })
}

/// `CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessLock(
    pid: c_int,
    args: *mut CUcheckpointLockArgs,
) -> CUresult {
    guard("cuCheckpointProcessLock", || {
        // SAFETY: NULL or a valid CUcheckpointLockArgs (API contract).
        let a = unsafe { get_args(args.cast_const()) };
        if !a.reserved_clear(world_cuda_version()) {
            return reject("cuCheckpointProcessLock", pid, "reserved bytes set");
        }
        driver::lock(pid, a.timeout_ms)
    })
}

/// `CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessCheckpoint(
    pid: c_int,
    args: *mut CUcheckpointCheckpointArgs,
) -> CUresult {
    guard("cuCheckpointProcessCheckpoint", || {
        // SAFETY: NULL or a valid CUcheckpointCheckpointArgs (API contract).
        let a = unsafe { get_args(args.cast_const()) };
        if !a.reserved_clear(world_cuda_version()) {
            return reject("cuCheckpointProcessCheckpoint", pid, "reserved bytes set");
        }
        if !a.custom_storage_info_out.is_null() {
            let opened = driver::checkpoint_custom(pid)?;
            // SAFETY: a non-NULL customStorageInfo_out is a valid
            // `CUcheckpointCustomStorageInfo **` (API contract).
            unsafe { hand_out(a.custom_storage_info_out, &opened) };
            return Ok(());
        }
        driver::checkpoint(pid)
    })
}

/// The info structs handed out for open operations, by handle (freed at Complete).
static HANDED_OUT: Mutex<Option<HashMap<u64, usize>>> = Mutex::new(None);

/// Allocates the `CUcheckpointCustomStorageInfo` of an opened operation (and its per-device
/// array) and stores its address through `out`. Both stay valid until the operation's
/// `cuCheckpointOperationComplete` succeeds.
///
/// # Safety
/// `out` must be valid for a write of a pointer.
unsafe fn hand_out(out: *mut *mut CUcheckpointCustomStorageInfo, opened: &crate::custom::Opened) {
    let per: Box<[CUcheckpointCustomStoragePerDeviceData]> = opened
        .devices
        .iter()
        .map(|d| CUcheckpointCustomStoragePerDeviceData {
            dev_ptr: d.dev_ptr,
            size: d.size as usize,
            stream: d.stream as CUstream,
        })
        .collect();
    let count = per.len() as u32;
    let info = Box::new(CUcheckpointCustomStorageInfo {
        handle: opened.handle as CUcheckpointOperationHandle,
        per_device_data: Box::into_raw(per).cast::<CUcheckpointCustomStoragePerDeviceData>(),
        device_count: count,
    });
    let raw = Box::into_raw(info);
    HANDED_OUT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(opened.handle, raw as usize);
    // SAFETY: valid for a pointer write (the caller's contract).
    unsafe { out.write_unaligned(raw) };
}

/// Frees what [`hand_out`] allocated for `handle`.
fn take_back(handle: u64) {
    let raw = HANDED_OUT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()
        .and_then(|m| m.remove(&handle));
    if let Some(raw) = raw {
        let info = raw as *mut CUcheckpointCustomStorageInfo;
        // SAFETY: `raw` came from `Box::into_raw` in `hand_out` and is freed once (removed from
        // the map above); the array was a boxed slice of `device_count` entries.
        unsafe {
            let info = Box::from_raw(info);
            let per = std::ptr::slice_from_raw_parts_mut(
                info.per_device_data,
                info.device_count as usize,
            );
            drop(Box::from_raw(per));
        }
    }
}

/// `CUresult cuCheckpointOperationComplete(CUcheckpointOperationHandle handle)` (CUDA 13.4).
#[unsafe(no_mangle)]
pub extern "C" fn cuCheckpointOperationComplete(handle: CUcheckpointOperationHandle) -> CUresult {
    guard("cuCheckpointOperationComplete", || {
        driver::operation_complete(handle as u64)?;
        take_back(handle as u64);
        Ok(())
    })
}

/// `CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessRestore(
    pid: c_int,
    args: *mut CUcheckpointRestoreArgs,
) -> CUresult {
    guard("cuCheckpointProcessRestore", || {
        // SAFETY: NULL or a valid CUcheckpointRestoreArgs (API contract).
        let a = unsafe { get_args(args.cast_const()) };
        let honoured = pairs_honoured();
        if !a.reserved_clear(world_cuda_version()) {
            return reject("cuCheckpointProcessRestore", pid, "reserved bytes set");
        }
        let mut pairs = Vec::new();
        if honoured && a.gpu_pairs_count > 0 {
            if a.gpu_pairs.is_null() {
                return reject(
                    "cuCheckpointProcessRestore",
                    pid,
                    "gpuPairs=NULL with a count",
                );
            }
            // SAFETY: the caller passes gpuPairsCount valid pairs at gpuPairs.
            let slice =
                unsafe { std::slice::from_raw_parts(a.gpu_pairs, a.gpu_pairs_count as usize) };
            pairs = slice
                .iter()
                .map(|p| (GpuUuid::from_cu(p.old_uuid), GpuUuid::from_cu(p.new_uuid)))
                .collect();
        }
        if !a.custom_storage_info_out.is_null() {
            let opened = driver::restore_custom(pid, &pairs)?;
            // SAFETY: a non-NULL customStorageInfo_out is a valid
            // `CUcheckpointCustomStorageInfo **` (API contract).
            unsafe { hand_out(a.custom_storage_info_out, &opened) };
            return Ok(());
        }
        driver::restore(pid, &pairs)
    })
}

/// `CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessUnlock(
    pid: c_int,
    args: *mut CUcheckpointUnlockArgs,
) -> CUresult {
    guard("cuCheckpointProcessUnlock", || {
        // SAFETY: NULL or a valid CUcheckpointUnlockArgs (API contract).
        let a = unsafe { get_args(args.cast_const()) };
        if !a.reserved_clear(world_cuda_version()) {
            return reject("cuCheckpointProcessUnlock", pid, "reserved bytes set");
        }
        driver::unlock(pid)
    })
}

// ----------------------------------------------------------------------------- contexts, memory

fn ctx_create(function: &str, ctx: *mut CUcontext, dev: CUdevice) -> Result<(), CUresult> {
    if ctx.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let handle = driver::ctx_create(function, dev)?;
    // SAFETY: checked non-NULL.
    unsafe { put(ctx, handle as CUcontext) }
}

/// `CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate(
    ctx: *mut CUcontext,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard("cuCtxCreate", || ctx_create("cuCtxCreate", ctx, dev))
}

/// `CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    ctx: *mut CUcontext,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard("cuCtxCreate_v2", || ctx_create("cuCtxCreate_v2", ctx, dev))
}

/// `CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard("cuDevicePrimaryCtxRetain", || {
        ctx_create("cuDevicePrimaryCtxRetain", ctx, dev)
    })
}

/// `CUresult cuCtxDestroy(CUcontext ctx)`: contexts live as long as the process in this mock.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy(_ctx: CUcontext) -> CUresult {
    CUresult::SUCCESS
}

/// `CUresult cuCtxDestroy_v2(CUcontext ctx)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(_ctx: CUcontext) -> CUresult {
    CUresult::SUCCESS
}

/// `CUresult cuDevicePrimaryCtxRelease(CUdevice dev)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease(_dev: CUdevice) -> CUresult {
    CUresult::SUCCESS
}

/// `CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(_dev: CUdevice) -> CUresult {
    CUresult::SUCCESS
}

/// `CUresult cuCtxSetCurrent(CUcontext ctx)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    guard("cuCtxSetCurrent", || driver::ctx_set_current(ctx as usize))
}

/// `CUresult cuCtxGetCurrent(CUcontext *pctx)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult {
    // SAFETY: NULL is rejected by `put`; otherwise a valid CUcontext pointer.
    guard("cuCtxGetCurrent", || unsafe {
        put(ctx, driver::ctx_get_current() as CUcontext)
    })
}

/// `CUresult cuCtxGetDevice(CUdevice *device)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    guard("cuCtxGetDevice", || {
        let d = driver::ctx_get_device()?;
        // SAFETY: NULL is rejected by `put`; otherwise a valid CUdevice pointer.
        unsafe { put(device, d) }
    })
}

/// `CUresult cuCtxSynchronize(void)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    guard("cuCtxSynchronize", driver::ctx_synchronize)
}

fn mem_alloc(dptr: *mut CUdeviceptr, bytes: usize) -> Result<(), CUresult> {
    if dptr.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let p = driver::mem_alloc(bytes as u64)?;
    // SAFETY: checked non-NULL.
    unsafe { put(dptr, p) }
}

/// `CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    guard("cuMemAlloc", || mem_alloc(dptr, bytes))
}

/// `CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    guard("cuMemAlloc_v2", || mem_alloc(dptr, bytes))
}

/// `CUresult cuMemFree(CUdeviceptr dptr)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree(dptr: CUdeviceptr) -> CUresult {
    guard("cuMemFree", || driver::mem_free(dptr))
}

/// `CUresult cuMemFree_v2(CUdeviceptr dptr)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guard("cuMemFree_v2", || driver::mem_free(dptr))
}

fn htod(dst: CUdeviceptr, src: *const c_void, n: usize) -> Result<(), CUresult> {
    if src.is_null() && n > 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let slice = if n == 0 {
        &[][..]
    } else {
        // SAFETY: the caller passes `n` readable bytes at `src` (checked non-NULL).
        unsafe { std::slice::from_raw_parts(src.cast::<u8>(), n) }
    };
    driver::memcpy_htod(dst, slice)
}

/// `CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult {
    guard("cuMemcpyHtoD", || htod(dst, src, n))
}

/// `CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    guard("cuMemcpyHtoD_v2", || htod(dst, src, n))
}

fn dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize) -> Result<(), CUresult> {
    if dst.is_null() && n > 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let slice = if n == 0 {
        &mut [][..]
    } else {
        // SAFETY: the caller passes `n` writable bytes at `dst` (checked non-NULL).
        unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), n) }
    };
    driver::memcpy_dtoh(slice, src)
}

/// `CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    guard("cuMemcpyDtoH", || dtoh(dst, src, n))
}

/// `CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    guard("cuMemcpyDtoH_v2", || dtoh(dst, src, n))
}

/// `CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoD(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    guard("cuMemcpyDtoD", || driver::memcpy_dtod(dst, src, n as u64))
}

/// `CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    guard("cuMemcpyDtoD_v2", || {
        driver::memcpy_dtod(dst, src, n as u64)
    })
}

/// `CUresult cuMemsetD8(CUdeviceptr dst, unsigned char uc, size_t n)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8(dst: CUdeviceptr, value: c_uchar, n: usize) -> CUresult {
    guard("cuMemsetD8", || driver::memset_d8(dst, value, n as u64))
}

/// `CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char uc, size_t n)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: c_uchar, n: usize) -> CUresult {
    guard("cuMemsetD8_v2", || driver::memset_d8(dst, value, n as u64))
}

fn mem_get_info(free: *mut usize, total: *mut usize) -> Result<(), CUresult> {
    let (f, t) = driver::mem_get_info()?;
    // SAFETY: NULL is rejected by `put`; otherwise valid size_t pointers.
    unsafe {
        put(free, f as usize)?;
        put(total, t as usize)
    }
}

/// `CUresult cuMemGetInfo(size_t *free, size_t *total)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut usize, total: *mut usize) -> CUresult {
    guard("cuMemGetInfo", || mem_get_info(free, total))
}

/// `CUresult cuMemGetInfo_v2(size_t *free, size_t *total)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard("cuMemGetInfo_v2", || mem_get_info(free, total))
}

// ----------------------------------------------------------------------------- host memory

/// Host allocations of `cuMemHostAlloc` (address -> size), and registered ranges.
static HOST_ALLOCS: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);
static HOST_REGISTERED: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);

/// Alignment of `cuMemHostAlloc` memory (callers use it with `O_DIRECT`).
pub const HOST_ALIGN: usize = 4096;

/// `CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr
/// ptr)`: only `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL` (9), written as an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_int,
    ptr: u64,
) -> CUresult {
    guard("cuPointerGetAttribute", || {
        if data.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let ordinal = driver::pointer_device_ordinal(attribute, ptr)?;
        // SAFETY: the caller passes room for the attribute's value, an int for this attribute.
        unsafe { data.cast::<c_int>().write_unaligned(ordinal) };
        Ok(())
    })
}

/// `CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)`: page-aligned
/// (4096) host memory, zeroed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    guard("cuMemHostAlloc", || {
        driver::host_memory(
            "cuMemHostAlloc",
            &|| format!("bytes={bytes}, flags={flags}"),
            || {
                if pp.is_null() || bytes == 0 {
                    return Err(CUresult::ERROR_INVALID_VALUE);
                }
                let layout = std::alloc::Layout::from_size_align(bytes, HOST_ALIGN)
                    .map_err(|_| CUresult::ERROR_OUT_OF_MEMORY)?;
                // SAFETY: the layout has a non-zero size.
                let p = unsafe { std::alloc::alloc_zeroed(layout) };
                if p.is_null() {
                    return Err(CUresult::ERROR_OUT_OF_MEMORY);
                }
                HOST_ALLOCS
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(HashMap::new)
                    .insert(p as usize, bytes);
                // SAFETY: checked non-NULL; the caller passes a valid `void **`.
                unsafe { put(pp, p.cast::<c_void>()) }
            },
        )
    })
}

/// `CUresult cuMemFreeHost(void *p)`: memory not from `cuMemHostAlloc` is INVALID_VALUE.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    guard("cuMemFreeHost", || {
        driver::host_memory("cuMemFreeHost", &|| format!("p={p:p}"), || {
            let bytes = HOST_ALLOCS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
                .and_then(|m| m.remove(&(p as usize)))
                .ok_or(CUresult::ERROR_INVALID_VALUE)?;
            let layout = std::alloc::Layout::from_size_align(bytes, HOST_ALIGN)
                .map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
            // SAFETY: `p` was allocated by `cuMemHostAlloc` with this layout and is freed once
            // (removed from the map above).
            unsafe { std::alloc::dealloc(p.cast::<u8>(), layout) };
            Ok(())
        })
    })
}

fn host_register(
    function: &str,
    p: *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> Result<(), CUresult> {
    driver::host_memory(
        function,
        &|| format!("p={p:p}, bytes={bytes}, flags={flags}"),
        || {
            if p.is_null() || bytes == 0 {
                return Err(CUresult::ERROR_INVALID_VALUE);
            }
            let mut m = HOST_REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
            let m = m.get_or_insert_with(HashMap::new);
            if m.contains_key(&(p as usize)) {
                return Err(CUresult::ERROR_INVALID_VALUE);
            }
            m.insert(p as usize, bytes);
            Ok(())
        },
    )
}

/// `CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)`: recorded only
/// (every host buffer can be copied from in the mock).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister(p: *mut c_void, bytes: usize, flags: c_uint) -> CUresult {
    guard("cuMemHostRegister", || {
        host_register("cuMemHostRegister", p, bytes, flags)
    })
}

/// `CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, flags: c_uint) -> CUresult {
    guard("cuMemHostRegister_v2", || {
        host_register("cuMemHostRegister_v2", p, bytes, flags)
    })
}

/// `CUresult cuMemHostUnregister(void *p)`: a range not registered is INVALID_VALUE.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    guard("cuMemHostUnregister", || {
        driver::host_memory("cuMemHostUnregister", &|| format!("p={p:p}"), || {
            HOST_REGISTERED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
                .and_then(|m| m.remove(&(p as usize)))
                .map(|_| ())
                .ok_or(CUresult::ERROR_INVALID_VALUE)
        })
    })
}

// ----------------------------------------------------------------------------- streams

fn dtoh_async(
    function: &str,
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> Result<(), CUresult> {
    if dst.is_null() && n > 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    driver::memcpy_dtoh_async(function, super::HostBuf::new(dst, n), src, stream as u64)
}

fn htod_async(
    function: &str,
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: CUstream,
) -> Result<(), CUresult> {
    if src.is_null() && n > 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    driver::memcpy_htod_async(function, dst, super::HostBuf::new(src, n), stream as u64)
}

/// `CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> CUresult {
    guard("cuMemcpyDtoHAsync", || {
        dtoh_async("cuMemcpyDtoHAsync", dst, src, n, stream)
    })
}

/// `CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> CUresult {
    guard("cuMemcpyDtoHAsync_v2", || {
        dtoh_async("cuMemcpyDtoHAsync_v2", dst, src, n, stream)
    })
}

/// `CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: CUstream,
) -> CUresult {
    guard("cuMemcpyHtoDAsync", || {
        htod_async("cuMemcpyHtoDAsync", dst, src, n, stream)
    })
}

/// `CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: CUstream,
) -> CUresult {
    guard("cuMemcpyHtoDAsync_v2", || {
        htod_async("cuMemcpyHtoDAsync_v2", dst, src, n, stream)
    })
}

/// `CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult {
    guard("cuStreamCreate", || {
        if stream.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let h = driver::stream_create(flags)?;
        // SAFETY: checked non-NULL; the caller passes a valid `CUstream *`.
        unsafe { put(stream, h as CUstream) }
    })
}

/// `CUresult cuStreamDestroy(CUstream hStream)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy(stream: CUstream) -> CUresult {
    guard("cuStreamDestroy", || {
        driver::stream_destroy("cuStreamDestroy", stream as u64)
    })
}

/// `CUresult cuStreamDestroy_v2(CUstream hStream)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    guard("cuStreamDestroy_v2", || {
        driver::stream_destroy("cuStreamDestroy_v2", stream as u64)
    })
}

/// `CUresult cuStreamSynchronize(CUstream hStream)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    guard("cuStreamSynchronize", || {
        driver::stream_synchronize(stream as u64)
    })
}

/// `CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)`.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_int) -> CUresult {
    guard("cuStreamBeginCapture_v2", || {
        driver::stream_begin_capture(stream as u64, mode)
    })
}

/// `CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture(stream: CUstream, graph: *mut *mut c_void) -> CUresult {
    guard("cuStreamEndCapture", || {
        if graph.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let g = driver::stream_end_capture(stream as u64)?;
        // SAFETY: checked non-NULL; the caller passes a valid `CUgraph *`.
        unsafe { put(graph, g as *mut c_void) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exported_symbol_is_listed_and_served() {
        let table = proc_table();
        for e in &table {
            assert!(
                crate::ffi::EXPORTED_SYMBOLS.contains(&e.symbol),
                "{} is not in EXPORTED_SYMBOLS",
                e.symbol
            );
        }
        assert_eq!(crate::ffi::EXPORTED_SYMBOLS.len(), 62);
    }
}
