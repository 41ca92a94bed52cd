//! The driver calls of custom storage (CUDA 13.4), for the copier process
//! ([`crate::cstore::copier`]): contexts, pinned host memory, asynchronous copies, and the
//! checkpoint and restore calls with `customStorageInfo_out`, completed by
//! `cuCheckpointOperationComplete` (resolved with `cuGetProcAddress(…, 13040)`, as real
//! callers probe it).
//!
//! Everything here runs in the copier, never in CRIU: `cuInit` and the retained primary
//! contexts start driver threads in their caller.

use super::cuda::{complete_entry, CompleteFn, LoadError, LIBRARY};
use crate::task::Pid;
use abi::cuda::CUdeviceptr;
use abi::{
    CUcheckpointCheckpointArgs, CUcheckpointCustomStorageInfo, CUcheckpointGpuPair,
    CUcheckpointRestoreArgs, CUresult, CUstream, CUuuid, GpuUuid,
};
use std::ffi::{c_int, c_uint, c_void};

type InitFn = unsafe extern "C" fn(c_uint) -> CUresult;
type DeviceGetCountFn = unsafe extern "C" fn(*mut c_int) -> CUresult;
type DeviceGetFn = unsafe extern "C" fn(*mut c_int, c_int) -> CUresult;
type DeviceGetUuidFn = unsafe extern "C" fn(*mut CUuuid, c_int) -> CUresult;
type PrimaryCtxRetainFn = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CUresult;
type PrimaryCtxReleaseFn = unsafe extern "C" fn(c_int) -> CUresult;
type CtxSetCurrentFn = unsafe extern "C" fn(*mut c_void) -> CUresult;
type MemHostAllocFn = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CUresult;
type MemFreeHostFn = unsafe extern "C" fn(*mut c_void) -> CUresult;
type DtoHAsyncFn = unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize, CUstream) -> CUresult;
type HtoDAsyncFn = unsafe extern "C" fn(CUdeviceptr, *const c_void, usize, CUstream) -> CUresult;
type StreamSyncFn = unsafe extern "C" fn(CUstream) -> CUresult;
type PointerGetAttributeFn = unsafe extern "C" fn(*mut c_void, c_int, CUdeviceptr) -> CUresult;
type CheckpointFn = unsafe extern "C" fn(c_int, *mut CUcheckpointCheckpointArgs) -> CUresult;
type RestoreFn = unsafe extern "C" fn(c_int, *mut CUcheckpointRestoreArgs) -> CUresult;

/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`: the ordinal of the device a pointer belongs to.
const POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
/// `CU_MEMHOSTALLOC_PORTABLE`: pinned memory usable from every context of the process.
const MEMHOSTALLOC_PORTABLE: c_uint = 1;

/// A driver call that failed: its name and code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{call} returned {code}")]
pub struct CallFailed {
    pub call: &'static str,
    pub code: CUresult,
}

fn cu(call: &'static str, code: CUresult) -> Result<(), CallFailed> {
    if code.is_success() {
        Ok(())
    } else {
        Err(CallFailed { call, code })
    }
}

/// The entry points custom storage needs, resolved once.
#[derive(Debug, Clone, Copy)]
pub struct CsApi {
    init: InitFn,
    device_get_count: DeviceGetCountFn,
    device_get: DeviceGetFn,
    device_get_uuid: DeviceGetUuidFn,
    primary_ctx_retain: PrimaryCtxRetainFn,
    primary_ctx_release: PrimaryCtxReleaseFn,
    ctx_set_current: CtxSetCurrentFn,
    mem_host_alloc: MemHostAllocFn,
    mem_free_host: MemFreeHostFn,
    dtoh_async: DtoHAsyncFn,
    htod_async: HtoDAsyncFn,
    stream_sync: StreamSyncFn,
    pointer_get_attribute: PointerGetAttributeFn,
    checkpoint: CheckpointFn,
    restore: RestoreFn,
    complete: CompleteFn,
}

fn library() -> Result<&'static libloading::Library, LoadError> {
    super::cuda::library()
}

macro_rules! sym {
    ($lib:expr, $name:literal, $ty:ty) => {{
        // SAFETY: the symbol is the CUDA driver entry point of that name, whose C signature is
        // `$ty` (CUDA Driver API reference); the pointer is copied out of the Symbol and stays
        // valid because the library is never unloaded.
        let sym = unsafe { $lib.get::<$ty>(concat!($name, "\0").as_bytes()) };
        *sym.map_err(|_| LoadError::SymbolMissing($name))?
    }};
}

/// A pinned host buffer from `cuMemHostAlloc`, freed on drop.
#[derive(Debug)]
pub struct Pinned {
    ptr: *mut u8,
    len: usize,
    free: MemFreeHostFn,
}

// SAFETY: the buffer is plain memory owned by this value; the driver has no thread-affinity
// for pinned host memory allocated PORTABLE.
unsafe impl Send for Pinned {}

impl AsRef<[u8]> for Pinned {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` is a live allocation of `len` bytes owned by `self`; `&self` rules out
        // a mutable view for as long as this one lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AsMut<[u8]> for Pinned {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl Pinned {
    /// The buffer.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `len` bytes owned by `self`, and `&mut self`
        // makes this the only view of it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Its address, for the driver's copies.
    #[must_use]
    pub fn addr(&self) -> *mut u8 {
        self.ptr
    }

    /// Its length.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed once.
        let _ = unsafe { (self.free)(self.ptr.cast()) };
    }
}

/// One GPU's entry of an open operation, as the driver gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceEntry {
    pub dev_ptr: CUdeviceptr,
    pub size: u64,
    pub stream: usize,
}

/// An open custom-storage operation: its handle and per-device entries. Only
/// [`CsApi::complete`] ends it (or the copier's exit, which the driver aborts it on).
#[derive(Debug)]
pub struct Operation {
    handle: usize,
    pub entries: Vec<DeviceEntry>,
}

impl CsApi {
    /// Resolves every entry point; `Ok(None)` when the driver has no custom storage.
    pub fn load() -> Result<Option<CsApi>, LoadError> {
        let lib = library()?;
        let Some(complete) = complete_entry(lib)? else {
            return Ok(None);
        };
        Ok(Some(CsApi {
            init: sym!(lib, "cuInit", InitFn),
            device_get_count: sym!(lib, "cuDeviceGetCount", DeviceGetCountFn),
            device_get: sym!(lib, "cuDeviceGet", DeviceGetFn),
            device_get_uuid: sym!(lib, "cuDeviceGetUuid_v2", DeviceGetUuidFn),
            primary_ctx_retain: sym!(lib, "cuDevicePrimaryCtxRetain", PrimaryCtxRetainFn),
            primary_ctx_release: sym!(lib, "cuDevicePrimaryCtxRelease_v2", PrimaryCtxReleaseFn),
            ctx_set_current: sym!(lib, "cuCtxSetCurrent", CtxSetCurrentFn),
            mem_host_alloc: sym!(lib, "cuMemHostAlloc", MemHostAllocFn),
            mem_free_host: sym!(lib, "cuMemFreeHost", MemFreeHostFn),
            dtoh_async: sym!(lib, "cuMemcpyDtoHAsync_v2", DtoHAsyncFn),
            htod_async: sym!(lib, "cuMemcpyHtoDAsync_v2", HtoDAsyncFn),
            stream_sync: sym!(lib, "cuStreamSynchronize", StreamSyncFn),
            pointer_get_attribute: sym!(lib, "cuPointerGetAttribute", PointerGetAttributeFn),
            checkpoint: sym!(lib, "cuCheckpointProcessCheckpoint", CheckpointFn),
            restore: sym!(lib, "cuCheckpointProcessRestore", RestoreFn),
            complete,
        }))
    }

    /// `cuInit(0)` (with the plugin's GPU view, see [`super::cuda`]), then the primary
    /// context of every GPU retained: the contexts custom storage maps the targets' memory
    /// into. Returns each ordinal's UUID and context.
    pub fn open_contexts(&self) -> Result<Vec<(GpuUuid, usize)>, CallFailed> {
        cu("cuInit", super::cuda::init_once(self.init))?;
        let mut count: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        cu("cuDeviceGetCount", unsafe {
            (self.device_get_count)(&mut count)
        })?;
        let mut out = Vec::new();
        for ordinal in 0..count.max(0) {
            let mut dev: c_int = 0;
            // SAFETY: writes one CUdevice through a valid pointer.
            cu("cuDeviceGet", unsafe {
                (self.device_get)(&mut dev, ordinal)
            })?;
            let mut uuid = CUuuid::default();
            // SAFETY: writes one 16-byte CUuuid through a valid pointer.
            cu("cuDeviceGetUuid_v2", unsafe {
                (self.device_get_uuid)(&mut uuid, dev)
            })?;
            let mut ctx: *mut c_void = std::ptr::null_mut();
            // SAFETY: writes one CUcontext through a valid pointer.
            cu("cuDevicePrimaryCtxRetain", unsafe {
                (self.primary_ctx_retain)(&mut ctx, dev)
            })?;
            out.push((GpuUuid::from_cu(uuid), ctx as usize));
        }
        Ok(out)
    }

    /// Releases the primary contexts [`CsApi::open_contexts`] retained (ordinals `0..n`).
    pub fn close_contexts(&self, n: usize) {
        for ordinal in 0..n {
            // SAFETY: releases a primary context this process retained once.
            let _ = unsafe { (self.primary_ctx_release)(ordinal as c_int) };
        }
    }

    /// Makes `ctx` (from [`CsApi::open_contexts`]) the calling thread's current context.
    pub fn set_current(&self, ctx: usize) -> Result<(), CallFailed> {
        // SAFETY: a context handle the driver gave this process, still retained.
        cu("cuCtxSetCurrent", unsafe {
            (self.ctx_set_current)(ctx as *mut c_void)
        })
    }

    /// `len` bytes of pinned (page-locked, 4096-aligned) host memory.
    pub fn host_alloc(&self, len: usize) -> Result<Pinned, CallFailed> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer through a valid out-pointer.
        cu("cuMemHostAlloc", unsafe {
            (self.mem_host_alloc)(&mut p, len, MEMHOSTALLOC_PORTABLE)
        })?;
        if p.is_null() {
            return Err(CallFailed {
                call: "cuMemHostAlloc",
                code: CUresult::ERROR_OUT_OF_MEMORY,
            });
        }
        Ok(Pinned {
            ptr: p.cast(),
            len,
            free: self.mem_free_host,
        })
    }

    /// The ordinal of the GPU `ptr` lives on (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`).
    pub fn device_of(&self, ptr: CUdeviceptr) -> Result<i32, CallFailed> {
        let mut ordinal: c_int = -1;
        // SAFETY: the attribute is an int, written through a valid pointer.
        cu("cuPointerGetAttribute", unsafe {
            (self.pointer_get_attribute)(
                (&raw mut ordinal).cast(),
                POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        })?;
        Ok(ordinal)
    }

    /// Enqueues `len` bytes from `src` (device) into `buf` at `at` on `stream`.
    pub fn to_host(
        &self,
        buf: &mut Pinned,
        at: usize,
        src: CUdeviceptr,
        len: usize,
        stream: usize,
    ) -> Result<(), CallFailed> {
        assert!(at + len <= buf.len, "a copy past the staging buffer");
        // SAFETY: `buf` is pinned memory with room for `len` bytes at `at` (checked above); it
        // stays alive and untouched until the stream is synchronised (the copier's device
        // holds an enqueued buffer until then: `cstore::copier`); `src` and `stream` come from
        // the driver's operation.
        cu("cuMemcpyDtoHAsync_v2", unsafe {
            (self.dtoh_async)(buf.ptr.add(at).cast(), src, len, stream as CUstream)
        })
    }

    /// Enqueues `len` bytes of `buf` from `at` to `dst` (device) on `stream`.
    pub fn to_device(
        &self,
        buf: &Pinned,
        at: usize,
        dst: CUdeviceptr,
        len: usize,
        stream: usize,
    ) -> Result<(), CallFailed> {
        assert!(at + len <= buf.len, "a copy past the staging buffer");
        // SAFETY: as for `to_host`: the bytes stay alive and unchanged until the stream is
        // synchronised.
        cu("cuMemcpyHtoDAsync_v2", unsafe {
            (self.htod_async)(dst, buf.ptr.add(at).cast(), len, stream as CUstream)
        })
    }

    /// `cuStreamSynchronize`.
    pub fn sync(&self, stream: usize) -> Result<(), CallFailed> {
        // SAFETY: a stream handle the driver gave this process for an open operation.
        cu("cuStreamSynchronize", unsafe {
            (self.stream_sync)(stream as CUstream)
        })
    }

    /// `cuCheckpointProcessCheckpoint` with custom storage: the task goes to CHECKPOINTING.
    pub fn checkpoint(&self, pid: Pid) -> Result<Operation, CallFailed> {
        let mut info: *mut CUcheckpointCustomStorageInfo = std::ptr::null_mut();
        let mut args = CUcheckpointCheckpointArgs {
            custom_storage_info_out: &mut info,
            ..Default::default()
        };
        // SAFETY: a valid 64-byte argument struct whose out-pointer outlives the call; the
        // driver reads it only on 13.4+, which `load` checked.
        cu("cuCheckpointProcessCheckpoint", unsafe {
            (self.checkpoint)(pid, &mut args)
        })?;
        // SAFETY: on success the driver filled `info` (or left it NULL).
        unsafe { operation("cuCheckpointProcessCheckpoint", info) }
    }

    /// `cuCheckpointProcessRestore` with custom storage (and GPU pairs when non-empty): the
    /// task goes to RESTORING.
    pub fn restore(
        &self,
        pid: Pid,
        pairs: &[CUcheckpointGpuPair],
    ) -> Result<Operation, CallFailed> {
        let mut pairs = pairs.to_vec();
        let mut info: *mut CUcheckpointCustomStorageInfo = std::ptr::null_mut();
        let mut args = CUcheckpointRestoreArgs {
            custom_storage_info_out: &mut info,
            ..Default::default()
        };
        if !pairs.is_empty() {
            args.gpu_pairs = pairs.as_mut_ptr();
            args.gpu_pairs_count = u32::try_from(pairs.len()).unwrap_or(u32::MAX);
        }
        // SAFETY: a valid argument struct; the pairs and the out-pointer outlive the call.
        cu("cuCheckpointProcessRestore", unsafe {
            (self.restore)(pid, &mut args)
        })?;
        // SAFETY: on success the driver filled `info` (or left it NULL).
        unsafe { operation("cuCheckpointProcessRestore", info) }
    }

    /// `cuCheckpointOperationComplete`: synchronises the operation's streams and finishes it.
    pub fn complete(&self, op: &Operation) -> Result<(), CallFailed> {
        // SAFETY: the handle the driver gave for this operation.
        cu("cuCheckpointOperationComplete", unsafe {
            (self.complete)(op.handle as *mut c_void)
        })
    }
}

/// Reads the driver's `CUcheckpointCustomStorageInfo`.
///
/// # Safety
/// `info` is NULL or the struct the driver returned for an operation that is still open.
unsafe fn operation(
    call: &'static str,
    info: *mut CUcheckpointCustomStorageInfo,
) -> Result<Operation, CallFailed> {
    if info.is_null() {
        return Err(CallFailed {
            call,
            code: CUresult::ERROR_INVALID_VALUE,
        });
    }
    // SAFETY: non-NULL, filled by the driver and valid until Complete (caller's contract).
    let i = unsafe { info.read() };
    let mut entries = Vec::with_capacity(i.device_count as usize);
    if i.device_count > 0 && !i.per_device_data.is_null() {
        // SAFETY: the driver's array of `device_count` entries, valid until Complete.
        let data =
            unsafe { std::slice::from_raw_parts(i.per_device_data, i.device_count as usize) };
        entries.extend(data.iter().map(|d| DeviceEntry {
            dev_ptr: d.dev_ptr,
            size: d.size as u64,
            stream: d.stream as usize,
        }));
    }
    Ok(Operation {
        handle: i.handle as usize,
        entries,
    })
}

/// The driver library's name, for messages.
pub const DRIVER: &str = LIBRARY;
