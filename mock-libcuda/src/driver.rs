//! The driver, in safe Rust: every exported entry point's behaviour, returning `CUresult` on
//! failure. [`crate::ffi::exports`] only converts pointers and calls in here.
//!
//! Checkpoint calls made by *another* process (CRIU with the plugin, the `cuda-checkpoint`
//! utility) or by the target itself are sent to the target's restore thread through its
//! mailbox in the world (see [`crate::target`]) and answered from there.

use crate::custom;
use crate::devmem::{DevmemError, Piece, Sparse};
use crate::target::{self, Op, Request, Response};
use crate::world::config::{FaultAction, GpuUuidText};
use crate::world::state::Allocation;
use crate::world::timeouts::{Timeout, Waited};
use crate::world::{World, WorldError};
use abi::{CUprocessState, CUresult, GpuUuid};
use std::cell::Cell;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// First device address; allocation `id` lives at `DEVPTR_BASE + (id << ALLOC_SHIFT)`.
pub const DEVPTR_BASE: u64 = 0x7000_0000_0000;
/// Bits of offset in a device address: an allocation may span 1 TiB.
pub const ALLOC_SHIFT: u32 = 40;
/// Largest single allocation (the address encoding leaves [`ALLOC_SHIFT`] bits of offset).
pub const MAX_ALLOC: u64 = 1 << ALLOC_SHIFT;
/// Grace a caller adds to a lock's own `timeoutMs` before it stops waiting for the target.
const LOCK_GRACE: Duration = Duration::from_millis(250);

pub(crate) type R<T> = Result<T, CUresult>;

struct Local {
    initialized: bool,
    /// Host indices this process sees, in ordinal order (from `CUDA_VISIBLE_DEVICES`).
    visible: Vec<GpuUuid>,
}

static LOCAL: Mutex<Local> = Mutex::new(Local {
    initialized: false,
    visible: Vec::new(),
});

thread_local! {
    /// The calling thread's current context: a device ordinal.
    static CURRENT: Cell<Option<i32>> = const { Cell::new(None) };
}

fn local() -> std::sync::MutexGuard<'static, Local> {
    LOCAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The world, or `CUDA_ERROR_NOT_INITIALIZED` (with the reason on stderr, once).
pub fn world() -> R<Arc<World>> {
    World::from_env().map_err(|e| {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| eprintln!("mock-libcuda: {e}"));
        CUresult::ERROR_NOT_INITIALIZED
    })
}

fn os_err(_: WorldError) -> CUresult {
    CUresult::ERROR_OPERATING_SYSTEM
}

// ---------------------------------------------------------------------------------------------
// Faults and tracing

/// Runs `op` for the call `function` under the world's faults, and traces the outcome.
pub fn call<T>(
    world: &World,
    function: &str,
    target: Option<i32>,
    args: &dyn Fn() -> String,
    op: impl FnOnce() -> R<T>,
) -> R<T> {
    let fault = match world.fault_for(&[function], target) {
        Ok(f) => f,
        Err(_) => {
            return trace_result(world, function, args, Err(CUresult::ERROR_OPERATING_SYSTEM))
        }
    };
    let result = match fault {
        None => op(),
        Some(action) => apply_fault(world, &action, target, op),
    };
    trace_result(world, function, args, result)
}

fn trace_result<T>(world: &World, function: &str, args: &dyn Fn() -> String, r: R<T>) -> R<T> {
    let code = match &r {
        Ok(_) => CUresult::SUCCESS,
        Err(c) => *c,
    };
    world.trace(function, &args(), &code.to_string());
    r
}

/// Carries a fault's action out around `op`.
pub fn apply_fault<T>(
    world: &World,
    action: &FaultAction,
    target: Option<i32>,
    op: impl FnOnce() -> R<T>,
) -> R<T> {
    match action {
        FaultAction::Return { code } => Err(code.cuda()),
        FaultAction::ErrorAfter { code } => {
            let _ = op();
            Err(code.cuda())
        }
        FaultAction::Fail { code } => {
            if let Some(t) = target.and_then(|pid| resolve(world, pid).ok()) {
                let _ = send(world, t, Op::Fail, request_deadline(world));
                let _ = world.update_entry(t.id, |e| {
                    e.state = CUprocessState::FAILED.0;
                });
            }
            Err(code.cuda())
        }
        FaultAction::Delay { ms } => {
            std::thread::sleep(Duration::from_millis(*ms));
            op()
        }
        FaultAction::Hang { file } => {
            hang(world, file.as_deref());
            op()
        }
        FaultAction::Crash { signal } => crate::ffi::sys::crash(signal.as_deref()),
        FaultAction::KillTarget => {
            if let Some(pid) = target {
                crate::ffi::sys::kill_and_wait(pid, Duration::from_secs(5));
            }
            op()
        }
        FaultAction::ForeignLock => {
            if let Some(t) = target.and_then(|pid| resolve(world, pid).ok()) {
                let _ = send(
                    world,
                    t,
                    Op::Lock { timeout_ms: 0 },
                    request_deadline(world),
                );
            }
            op()
        }
        FaultAction::Garbage { .. } => Err(CUresult::ERROR_UNKNOWN),
    }
}

/// Blocks until `file` (relative to the world) exists, or forever without one.
pub fn hang(world: &World, file: Option<&str>) {
    world.hang(file);
}

// ---------------------------------------------------------------------------------------------
// Initialisation and devices

/// `cuInit`.
pub fn init(flags: u32) -> R<()> {
    let w = world()?;
    call(&w, "cuInit", None, &|| format!("flags={flags}"), || {
        if flags != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let host: Vec<GpuUuid> = w.config().gpus.iter().map(|g| g.uuid.0).collect();
        let env = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let visible: Vec<GpuUuid> = crate::visible::visible_indices(env.as_deref(), &host)
            .into_iter()
            .map(|i| host[i])
            .collect();
        if visible.is_empty() {
            return Err(CUresult::ERROR_NO_DEVICE);
        }
        let mut l = local();
        l.visible = visible;
        l.initialized = true;
        drop(l);
        target::start_internal_threads(&w);
        Ok(())
    })
}

/// `cuDriverGetVersion` (works without `cuInit`, as the real driver's does).
pub fn driver_version() -> R<i32> {
    let w = world()?;
    let v = w.config().driver.cuda_version();
    call(&w, "cuDriverGetVersion", None, &String::new, || Ok(v))
}

/// The calling process's device table: the world's record for a CUDA process (remapped by
/// restores), else the view computed by `cuInit`.
fn devices(w: &World) -> R<Vec<GpuUuid>> {
    let l = local();
    if !l.initialized {
        return Err(CUresult::ERROR_NOT_INITIALIZED);
    }
    if let Some(rt) = target::runtime() {
        if let Some(e) = w.read_process(rt.id()).map_err(os_err)? {
            return Ok(e.devices.iter().map(|d| d.0).collect());
        }
    }
    Ok(l.visible.clone())
}

/// The caller's device table (ordinal -> GPU); `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`.
pub(crate) fn device_table(w: &World) -> R<Vec<GpuUuid>> {
    devices(w)
}

/// Whether this process called `cuInit`.
pub(crate) fn initialized() -> bool {
    local().initialized
}

fn device_uuid_of(w: &World, dev: i32) -> R<GpuUuid> {
    let d = devices(w)?;
    usize::try_from(dev)
        .ok()
        .and_then(|i| d.get(i).copied())
        .ok_or(CUresult::ERROR_INVALID_DEVICE)
}

/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
pub const POINTER_ATTRIBUTE_DEVICE_ORDINAL: i32 = 9;

/// `cuPointerGetAttribute` for `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL` (the only attribute the
/// mock models; others are `CUDA_ERROR_INVALID_VALUE`): the caller's ordinal of the GPU a
/// device pointer lives on, for a custom-storage operation's pointers and the caller's own
/// allocations.
pub fn pointer_device_ordinal(attribute: i32, ptr: u64) -> R<i32> {
    let w = world()?;
    call(
        &w,
        "cuPointerGetAttribute",
        None,
        &|| format!("attribute={attribute}, ptr={ptr:#x}"),
        || {
            if attribute != POINTER_ATTRIBUTE_DEVICE_ORDINAL {
                return Err(CUresult::ERROR_INVALID_VALUE);
            }
            let gpu = match crate::custom::gpu_of(ptr) {
                Some(g) => g,
                None => locate(&w, ptr, 0)?.0.gpu.0,
            };
            let d = devices(&w)?;
            d.iter()
                .position(|g| *g == gpu)
                .and_then(|i| i32::try_from(i).ok())
                .ok_or(CUresult::ERROR_INVALID_DEVICE)
        },
    )
}

/// `cuDeviceGetCount`.
pub fn device_count() -> R<i32> {
    let w = world()?;
    call(&w, "cuDeviceGetCount", None, &String::new, || {
        Ok(devices(&w)?.len() as i32)
    })
}

/// `cuDeviceGet`.
pub fn device_get(ordinal: i32) -> R<i32> {
    let w = world()?;
    call(
        &w,
        "cuDeviceGet",
        None,
        &|| format!("ordinal={ordinal}"),
        || {
            device_uuid_of(&w, ordinal)?;
            Ok(ordinal)
        },
    )
}

/// `cuDeviceGetUuid` / `cuDeviceGetUuid_v2` (no MIG in this mock: both give the GPU's UUID).
pub fn device_uuid(function: &str, dev: i32) -> R<GpuUuid> {
    let w = world()?;
    call(&w, function, None, &|| format!("dev={dev}"), || {
        device_uuid_of(&w, dev)
    })
}

/// A property of the GPU behind a device ordinal.
fn device_property<T>(
    function: &str,
    dev: i32,
    f: impl FnOnce(&crate::world::config::GpuConfig) -> T,
) -> R<T> {
    let w = world()?;
    call(&w, function, None, &|| format!("dev={dev}"), || {
        let u = device_uuid_of(&w, dev)?;
        w.config()
            .gpu(u)
            .map(f)
            .ok_or(CUresult::ERROR_INVALID_DEVICE)
    })
}

/// `cuDeviceGetName`.
pub fn device_name(dev: i32) -> R<String> {
    device_property("cuDeviceGetName", dev, |g| g.name.clone())
}

/// `cuDeviceTotalMem`.
pub fn device_total_mem(dev: i32) -> R<u64> {
    device_property("cuDeviceTotalMem", dev, |g| g.memory_mib * 1024 * 1024)
}

// ---------------------------------------------------------------------------------------------
// Contexts and the data path (the calls a workload makes)

fn data_call<T>(
    w: &World,
    function: &str,
    args: &dyn Fn() -> String,
    op: impl FnOnce() -> R<T>,
) -> R<T> {
    data_call_for(w, function, None, args, op)
}

/// [`data_call`] on behalf of `target` (a fault naming a pid fires only for its calls).
fn data_call_for<T>(
    w: &World,
    function: &str,
    target: Option<i32>,
    args: &dyn Fn() -> String,
    op: impl FnOnce() -> R<T>,
) -> R<T> {
    if w.config().trace_data_path || !w.config().faults.is_empty() {
        call(w, function, target, args, op)
    } else {
        op()
    }
}

/// A workload call that needs a context: enters the API gate first (blocking while the process
/// is locked or checkpointed), then runs under faults and tracing, so a scripted delay is work
/// in flight that a lock has to wait for.
fn gated<T>(
    w: &World,
    function: &str,
    args: &dyn Fn() -> String,
    op: impl FnOnce() -> R<T>,
) -> R<T> {
    gated_for(w, function, None, args, op)
}

/// [`gated`] on behalf of `target`: a copy into or out of a custom-storage range is made for
/// the process whose memory the range maps, and a fault naming that process fires for it.
fn gated_for<T>(
    w: &World,
    function: &str,
    target: Option<i32>,
    args: &dyn Fn() -> String,
    op: impl FnOnce() -> R<T>,
) -> R<T> {
    let rt = target::runtime().ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
    let _in = rt.enter()?;
    data_call_for(w, function, target, args, op)
}

/// `cuCtxCreate` / `cuDevicePrimaryCtxRetain`: makes the process a CUDA process and sets the
/// calling thread's current context. Returns the context handle (ordinal + 1).
pub fn ctx_create(function: &str, dev: i32) -> R<usize> {
    let w = world()?;
    data_call(&w, function, &|| format!("dev={dev}"), || {
        let uuid = device_uuid_of(&w, dev)?;
        let table = devices(&w)?;
        let rt = target::ensure_registered(&w, &table)?;
        target::start_internal_threads(&w);
        let _in = rt.enter()?;
        let id = rt.id();
        w.update_entry(id, |e| {
            if !e.contexts.iter().any(|c| c.0 == uuid) {
                e.contexts.push(GpuUuidText(uuid));
            }
        })
        .map_err(os_err)?;
        CURRENT.with(|c| c.set(Some(dev)));
        Ok(dev as usize + 1)
    })
}

/// `cuCtxSetCurrent`.
pub fn ctx_set_current(ctx: usize) -> R<()> {
    let dev = if ctx == 0 { None } else { Some(ctx as i32 - 1) };
    CURRENT.with(|c| c.set(dev));
    Ok(())
}

/// `cuCtxGetCurrent`.
#[must_use]
pub fn ctx_get_current() -> usize {
    CURRENT.with(|c| c.get()).map_or(0, |d| d as usize + 1)
}

/// `cuCtxGetDevice`.
pub fn ctx_get_device() -> R<i32> {
    CURRENT
        .with(|c| c.get())
        .ok_or(CUresult::ERROR_INVALID_CONTEXT)
}

/// Environment variable of a target: every `cuCtxSynchronize` of the process stays inside the
/// API gate this many milliseconds, as when it waits for a kernel that runs that long (the mock
/// launches no kernels): work in flight that a lock has to wait for.
pub const KERNEL_MS_ENV: &str = "MOCK_CUDA_KERNEL_MS";

/// The process's kernel time ([`KERNEL_MS_ENV`]); a value that is not a number of
/// milliseconds is an error naming the variable.
fn kernel_time() -> R<Option<Duration>> {
    static KERNEL: std::sync::OnceLock<Result<Option<Duration>, String>> =
        std::sync::OnceLock::new();
    let k = KERNEL.get_or_init(|| match std::env::var(KERNEL_MS_ENV) {
        Err(_) => Ok(None),
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map(|ms| Some(Duration::from_millis(ms)))
            .map_err(|_| format!("{KERNEL_MS_ENV}={v:?} is not a number of milliseconds")),
    });
    k.clone().map_err(|e| {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| eprintln!("mock-libcuda: {e}"));
        CUresult::ERROR_INVALID_VALUE
    })
}

/// `cuCtxSynchronize`: waits (through the gate) while the process is locked; with
/// [`KERNEL_MS_ENV`] it then stays in the gate for the kernel's time.
pub fn ctx_synchronize() -> R<()> {
    let w = world()?;
    let kernel = kernel_time()?;
    gated(&w, "cuCtxSynchronize", &String::new, || {
        if let Some(t) = kernel {
            std::thread::sleep(t);
        }
        Ok(())
    })
}

fn current_gpu(w: &World) -> R<GpuUuid> {
    let dev = ctx_get_device()?;
    device_uuid_of(w, dev)
}

/// `cuMemAlloc`.
pub fn mem_alloc(size: u64) -> R<u64> {
    let w = world()?;
    gated(&w, "cuMemAlloc", &|| format!("bytes={size}"), || {
        if size == 0 || size > MAX_ALLOC {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let gpu = current_gpu(&w)?;
        let capacity = w.config().gpu(gpu).map_or(0, |g| g.capacity_bytes());
        let sampled = size > w.config().memory.real_limit();
        let me = own_id()?;
        let id = w
            .update(|st| {
                st.release_dead_claims(|id, e| {
                    w.locate(&e.whereabouts(id)) == crate::world::pidns::Presence::Gone
                });
                let used = st.resident_bytes(gpu, None);
                if used + size > capacity {
                    return Err(CUresult::ERROR_OUT_OF_MEMORY);
                }
                let id = st.next_alloc;
                st.next_alloc += 1;
                let e = st
                    .processes
                    .get_mut(&me)
                    .ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
                e.allocations.push(Allocation {
                    id,
                    size,
                    gpu: GpuUuidText(gpu),
                    sampled,
                });
                Ok(id)
            })
            .map_err(os_err)??;
        let path = w.devmem_path(me, id);
        if sampled {
            std::fs::write(&path, Sparse::new(size).encode())
                .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?;
        } else {
            let f = std::fs::File::create(&path).map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?;
            f.set_len(size)
                .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?;
        }
        Ok(DEVPTR_BASE + (id << ALLOC_SHIFT))
    })
}

/// Splits a device address into (allocation, offset), checking `len` bytes fit.
fn locate(w: &World, dptr: u64, len: u64) -> R<(Allocation, u64)> {
    if dptr < DEVPTR_BASE {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let id = (dptr - DEVPTR_BASE) >> ALLOC_SHIFT;
    let off = dptr & (MAX_ALLOC - 1);
    let me = own_id()?;
    // The process's own entry alone: a workload checks its memory every few milliseconds.
    let a = w
        .read_process(me)
        .map_err(os_err)?
        .and_then(|e| e.allocations.into_iter().find(|a| a.id == id))
        .ok_or(CUresult::ERROR_INVALID_VALUE)?;
    if off.checked_add(len).is_none_or(|end| end > a.size) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    Ok((a, off))
}

/// `cuMemFree`.
pub fn mem_free(dptr: u64) -> R<()> {
    let w = world()?;
    gated(&w, "cuMemFree", &|| format!("dptr={dptr:#x}"), || {
        let (a, off) = locate(&w, dptr, 0)?;
        if off != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let me = own_id()?;
        w.update_entry(me, |e| {
            e.allocations.retain(|x| x.id != a.id);
        })
        .map_err(os_err)?;
        let _ = std::fs::remove_file(w.devmem_path(me, a.id));
        Ok(())
    })
}

fn devmem_io(w: &World, a: &Allocation) -> R<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(w.devmem_path(own_id()?, a.id))
        .map_err(|_| CUresult::ERROR_ILLEGAL_ADDRESS)
}

/// Serialises read-modify-write cycles of virtual allocations among this process's threads
/// (only the process itself touches its device memory files).
static SPARSE_IO: Mutex<()> = Mutex::new(());

fn load_sparse(w: &World, a: &Allocation) -> R<Sparse> {
    let bytes = std::fs::read(w.devmem_path(own_id()?, a.id))
        .map_err(|_| CUresult::ERROR_ILLEGAL_ADDRESS)?;
    Sparse::decode(&bytes).map_err(|e| {
        eprintln!("mock-libcuda: device memory of allocation {}: {e}", a.id);
        CUresult::ERROR_OPERATING_SYSTEM
    })
}

fn store_sparse(w: &World, a: &Allocation, m: &Sparse) -> R<()> {
    std::fs::write(w.devmem_path(own_id()?, a.id), m.encode())
        .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)
}

/// Changes a virtual allocation; a write beyond its sample is `CUDA_ERROR_NOT_SUPPORTED`, with
/// the reason on stderr.
fn modify_sparse(
    w: &World,
    a: &Allocation,
    f: impl FnOnce(&mut Sparse, u64) -> Result<(), DevmemError>,
) -> R<()> {
    let _io = SPARSE_IO.lock().unwrap_or_else(|p| p.into_inner());
    let mut m = load_sparse(w, a)?;
    match f(&mut m, w.config().memory.sample_limit()) {
        Ok(()) => store_sparse(w, a, &m),
        Err(e @ DevmemError::SampleFull { .. }) => {
            eprintln!(
                "mock-libcuda: allocation {} is virtual ({} bytes, more than memory.real_mib): {e}; only that much of it is real (raise memory.sample_kib, or memory.real_mib to make it real)",
                a.id, a.size
            );
            Err(CUresult::ERROR_NOT_SUPPORTED)
        }
        Err(_) => Err(CUresult::ERROR_INVALID_VALUE),
    }
}

fn write_dev(w: &World, dptr: u64, src: &[u8]) -> R<()> {
    use std::os::unix::fs::FileExt;
    let (a, off) = locate(w, dptr, src.len() as u64)?;
    if a.sampled {
        return modify_sparse(w, &a, |m, limit| m.write(off, src, limit));
    }
    devmem_io(w, &a)?
        .write_all_at(src, off)
        .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)
}

fn read_dev(w: &World, dst: &mut [u8], dptr: u64) -> R<()> {
    use std::os::unix::fs::FileExt;
    let (a, off) = locate(w, dptr, dst.len() as u64)?;
    if a.sampled {
        let _io = SPARSE_IO.lock().unwrap_or_else(|p| p.into_inner());
        return load_sparse(w, &a)?
            .read(off, dst)
            .map_err(|_| CUresult::ERROR_INVALID_VALUE);
    }
    devmem_io(w, &a)?
        .read_exact_at(dst, off)
        .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)
}

/// The content of `len` bytes at `dptr`, as pieces (a virtual allocation's runs stay runs).
fn read_pieces(w: &World, dptr: u64, len: u64) -> R<Vec<Piece>> {
    let (a, off) = locate(w, dptr, len)?;
    if a.sampled {
        let _io = SPARSE_IO.lock().unwrap_or_else(|p| p.into_inner());
        return load_sparse(w, &a)?
            .pieces(off, len)
            .map_err(|_| CUresult::ERROR_INVALID_VALUE);
    }
    // A real allocation is at most `memory.real_mib` long, so its bytes fit in memory.
    let mut buf = vec![0u8; usize::try_from(len).map_err(|_| CUresult::ERROR_INVALID_VALUE)?];
    read_dev(w, &mut buf, dptr)?;
    Ok(vec![Piece::Data(buf)])
}

/// Writes pieces at `dptr`: runs stay runs in a virtual allocation, and are spelled out in a
/// real one (at most its size).
fn write_pieces(w: &World, dptr: u64, pieces: &[Piece]) -> R<()> {
    let len: u64 = pieces
        .iter()
        .map(|p| match p {
            Piece::Fill { len, .. } => *len,
            Piece::Data(d) => d.len() as u64,
        })
        .sum();
    let (a, off) = locate(w, dptr, len)?;
    if a.sampled {
        return modify_sparse(w, &a, |m, limit| m.write_pieces(off, pieces, limit));
    }
    let mut at = dptr;
    for p in pieces {
        match p {
            Piece::Fill { len, value } => {
                let n = usize::try_from(*len).map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
                write_dev(w, at, &vec![*value; n])?;
                at += *len;
            }
            Piece::Data(d) => {
                write_dev(w, at, d)?;
                at += d.len() as u64;
            }
        }
    }
    Ok(())
}

/// `cuMemcpyHtoD`. Into a custom-storage operation's range: the target's memory
/// ([`crate::custom`]), taking the modelled time.
pub fn memcpy_htod(dptr: u64, src: &[u8]) -> R<()> {
    let w = world()?;
    gated(
        &w,
        "cuMemcpyHtoD",
        &|| format!("dptr={dptr:#x}, bytes={}", src.len()),
        || {
            if custom::is_custom(dptr) {
                custom::htod(&w, dptr, src)
            } else {
                write_dev(&w, dptr, src)
            }
        },
    )
}

/// `cuMemcpyDtoH`. From a custom-storage operation's range: the target's memory.
pub fn memcpy_dtoh(dst: &mut [u8], dptr: u64) -> R<()> {
    let w = world()?;
    let len = dst.len();
    gated(
        &w,
        "cuMemcpyDtoH",
        &|| format!("dptr={dptr:#x}, bytes={len}"),
        || {
            if custom::is_custom(dptr) {
                custom::dtoh(&w, dst, dptr)
            } else {
                read_dev(&w, dst, dptr)
            }
        },
    )
}

/// `cuMemcpyHtoDAsync` (`function` names the export): into a custom-storage range the bytes
/// move on the stream's worker, which then takes the modelled time; into the caller's own
/// memory it is a synchronous copy.
pub fn memcpy_htod_async(
    function: &str,
    dptr: u64,
    src: crate::ffi::HostBuf,
    stream: u64,
) -> R<()> {
    let w = world()?;
    gated_for(
        &w,
        function,
        custom::target_pid(dptr),
        &|| format!("dptr={dptr:#x}, bytes={}, stream={stream:#x}", src.len()),
        || {
            if custom::is_custom(dptr) {
                custom::htod_async(&w, dptr, src, stream)
            } else {
                src.with(|b| write_dev(&w, dptr, b))
            }
        },
    )
}

/// `cuMemcpyDtoHAsync` (`function` names the export).
pub fn memcpy_dtoh_async(
    function: &str,
    dst: crate::ffi::HostBuf,
    dptr: u64,
    stream: u64,
) -> R<()> {
    let w = world()?;
    let len = dst.len();
    gated_for(
        &w,
        function,
        custom::target_pid(dptr),
        &|| format!("dptr={dptr:#x}, bytes={len}, stream={stream:#x}"),
        || {
            if custom::is_custom(dptr) {
                custom::dtoh_async(&w, dst, dptr, stream)
            } else {
                dst.with_mut(|b| read_dev(&w, b, dptr))
            }
        },
    )
}

/// `cuStreamCreate`.
pub fn stream_create(flags: u32) -> R<u64> {
    let w = world()?;
    gated(&w, "cuStreamCreate", &|| format!("flags={flags}"), || {
        Ok(custom::stream_create())
    })
}

/// `cuStreamDestroy` / `_v2`.
pub fn stream_destroy(function: &str, stream: u64) -> R<()> {
    let w = world()?;
    data_call(&w, function, &|| format!("stream={stream:#x}"), || {
        custom::stream_destroy(stream)
    })
}

/// `cuStreamSynchronize`: waits for the stream's modelled copies.
pub fn stream_synchronize(stream: u64) -> R<()> {
    let w = world()?;
    gated(
        &w,
        "cuStreamSynchronize",
        &|| format!("stream={stream:#x}"),
        || custom::stream_synchronize(stream),
    )
}

/// `cuStreamBeginCapture_v2` (the capture mode is not modelled).
pub fn stream_begin_capture(stream: u64, mode: i32) -> R<()> {
    let w = world()?;
    data_call(
        &w,
        "cuStreamBeginCapture_v2",
        &|| format!("stream={stream:#x}, mode={mode}"),
        || custom::stream_begin_capture(stream),
    )
}

/// `cuStreamEndCapture`: the graph handle.
pub fn stream_end_capture(stream: u64) -> R<u64> {
    let w = world()?;
    data_call(
        &w,
        "cuStreamEndCapture",
        &|| format!("stream={stream:#x}"),
        || custom::stream_end_capture(stream),
    )
}

/// A host-memory call (`cuMemHostAlloc`, `cuMemHostRegister`, …): needs `cuInit`; runs `op`
/// (the allocation or bookkeeping, done by the caller in [`crate::ffi`]) under faults and
/// tracing.
pub fn host_memory<T>(
    function: &str,
    args: &dyn Fn() -> String,
    op: impl FnOnce() -> R<T>,
) -> R<T> {
    let w = world()?;
    data_call(&w, function, args, || {
        if !local().initialized {
            return Err(CUresult::ERROR_NOT_INITIALIZED);
        }
        op()
    })
}

/// `cuMemcpyDtoD`.
pub fn memcpy_dtod(dst: u64, src: u64, len: u64) -> R<()> {
    let w = world()?;
    gated(
        &w,
        "cuMemcpyDtoD",
        &|| format!("dst={dst:#x}, src={src:#x}, bytes={len}"),
        || {
            let pieces = read_pieces(&w, src, len)?;
            write_pieces(&w, dst, &pieces)
        },
    )
}

/// `cuMemsetD8`.
pub fn memset_d8(dptr: u64, value: u8, n: u64) -> R<()> {
    let w = world()?;
    gated(
        &w,
        "cuMemsetD8",
        &|| format!("dptr={dptr:#x}, value={value}, count={n}"),
        || write_pieces(&w, dptr, &[Piece::Fill { len: n, value }]),
    )
}

/// `cuMemGetInfo`: (free, total) of the current context's GPU.
pub fn mem_get_info() -> R<(u64, u64)> {
    let w = world()?;
    let gpu = current_gpu(&w)?;
    let total = w.config().gpu(gpu).map_or(0, |g| g.capacity_bytes());
    let used = w.read_state().map_err(os_err)?.resident_bytes(gpu, None);
    Ok((total.saturating_sub(used), total))
}

// ---------------------------------------------------------------------------------------------
// The checkpoint API

/// The calling process's world id, once it is a CUDA process.
fn own_id() -> R<u64> {
    target::runtime()
        .map(|rt| rt.id())
        .ok_or(CUresult::ERROR_INVALID_CONTEXT)
}

/// A checkpoint target: its pid in the caller's view (`/proc`) and its world id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// Its pid (thread group) as the caller's `/proc` shows it.
    pub pid: i32,
    /// Its world id.
    pub id: u64,
}

/// Resolves a pid or tid `pid` of the caller's view to a CUDA process of the world, the way the
/// kernel knows processes (module [`crate::world::pidns`]): its identity (pid namespace and
/// pid there, from `/proc/<pid>/ns/pid` and `NSpid:`) names the world's entry, which counts
/// only while the process has that entry's restore thread; a process whose identity the world
/// does not know (restored by CRIU into new namespaces) is found by its restore thread's name,
/// and its entry takes its identity now. A caller that sees the host's pids records the host
/// pid it found. An entry whose identity a process without its restore thread has taken over
/// belonged to a process that died: unless checkpointed, it is dropped with its device memory
/// (a process that exits without a checkpoint releases its GPU state). A process with a
/// restore thread that the world has forgotten resolves too: its thread re-announces it when
/// it takes a request. `CUDA_ERROR_INVALID_VALUE` for anything else.
///
/// A process the world knows as it is (the entry its restore thread names has its identity,
/// and its host pid when the caller sees host pids) is found by reading that entry alone:
/// every driver call resolves its pid, and the plugin's helper, locking 16 tasks of 64 at once,
/// spent most of each lock's time reading and parsing the other 63 entries. A dead process's
/// entry that a new one's identity takes over is dropped when the new one registers
/// ([`crate::target::ensure_registered`]), so this look cannot miss it.
pub fn resolve(w: &World, pid: i32) -> R<Target> {
    use crate::world::pidns;
    let tgid = pidns::tgid_of(pid).ok_or(CUresult::ERROR_INVALID_VALUE)?;
    let ident = pidns::identity_of(tgid);
    let thread = pidns::restore_thread_of(tgid).map(|(_, id)| id);
    let host_pid = w.host_view().then_some(tgid);
    if let (Some(id), Some(i)) = (thread, ident) {
        let known = w
            .read_process(id)
            .map_err(os_err)?
            .is_some_and(|e| e.identity() == i && host_pid.is_none_or(|h| e.pid == h));
        if known {
            return Ok(Target { pid: tgid, id });
        }
    }
    // Otherwise the whole state is looked at, and the lock taken only to change it.
    let (found, gone) = w
        .update_if_changed(|st| {
            let mut gone = None;
            if let Some((id, e)) = ident.and_then(|i| st.by_identity(i)) {
                if thread != Some(id) && e.state() != CUprocessState::CHECKPOINTED {
                    gone = st.processes.remove(&id).map(|e| (id, e));
                }
            }
            let Some(id) = thread else {
                return (None, gone);
            };
            if let Some(e) = st.processes.get_mut(&id) {
                if let Some(i) = ident {
                    (e.pid_ns, e.nspid) = (i.ns, i.pid);
                }
                if let Some(h) = host_pid {
                    e.pid = h;
                }
            }
            (Some(id), gone)
        })
        .map_err(os_err)?;
    if let Some((id, e)) = gone {
        for a in &e.allocations {
            let _ = std::fs::remove_file(w.devmem_path(id, a.id));
        }
    }
    found
        .map(|id| Target { pid: tgid, id })
        .ok_or(CUresult::ERROR_INVALID_VALUE)
}

/// The world's entry of a target (`CUDA_ERROR_INVALID_VALUE` when the world forgot it).
fn entry_of(w: &World, t: Target) -> R<crate::world::state::ProcessEntry> {
    w.read_process(t.id)
        .map_err(os_err)?
        .ok_or(CUresult::ERROR_INVALID_VALUE)
}

fn target_args(pid: i32) -> impl Fn() -> String {
    move || format!("pid={pid}")
}

/// `cuCheckpointProcessGetRestoreThreadId`: the restore thread's tid in the caller's view.
pub fn get_restore_tid(pid: i32) -> R<i32> {
    let w = world()?;
    let tgid = crate::ffi::sys::tgid_of(pid);
    call(
        &w,
        "cuCheckpointProcessGetRestoreThreadId",
        tgid,
        &target_args(pid),
        || {
            let t = resolve(&w, pid)?;
            crate::world::pidns::restore_thread(t.pid, t.id).ok_or(CUresult::ERROR_INVALID_VALUE)
        },
    )
}

/// `cuCheckpointProcessGetState`.
pub fn get_state(pid: i32) -> R<CUprocessState> {
    let w = world()?;
    let tgid = crate::ffi::sys::tgid_of(pid);
    call(
        &w,
        "cuCheckpointProcessGetState",
        tgid,
        &target_args(pid),
        || {
            let t = resolve(&w, pid)?;
            let e = entry_of(&w, t)?;
            // An open custom-storage operation whose caller has died is aborted by the
            // target's restore thread within its idle wait: the state a caller asks for after
            // that death is the one the abort leaves (as a driver that cleans up at the
            // caller's exit would report it), when the thread can run.
            if let (Some(c), true) = (&e.open_caller, e.state().0 >= 4) {
                if crate::custom::caller_gone(&w, c) {
                    let until = Instant::now() + ABORT_WAIT;
                    while Instant::now() < until {
                        let now = entry_of(&w, t)?;
                        if now.state().0 < 4 {
                            return Ok(now.state());
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
            Ok(e.state())
        },
    )
}

/// How long `cuCheckpointProcessGetState` waits for the abort of an operation whose caller
/// died (the restore thread looks every 50 ms; a stopped one never does).
const ABORT_WAIT: Duration = Duration::from_secs(1);

fn request_deadline(w: &World) -> Instant {
    Instant::now() + Duration::from_millis(w.config().driver.request_timeout_ms)
}

/// The CUDA process a request goes to. Whether the request suits its state is the target's
/// decision (its restore thread answers ILLEGAL_STATE): the world's record can lag behind a
/// process restored from images until its thread runs, and a process the world has forgotten
/// is announced by its restore thread when it takes the request.
fn known(w: &World, pid: i32) -> R<Target> {
    resolve(w, pid)
}

/// `cuCheckpointProcessLock`.
pub fn lock(pid: i32, timeout_ms: u32) -> R<()> {
    let w = world()?;
    let tgid = crate::ffi::sys::tgid_of(pid);
    call(
        &w,
        "cuCheckpointProcessLock",
        tgid,
        &|| format!("pid={pid}, timeoutMs={timeout_ms}"),
        || {
            let t = known(&w, pid)?;
            let (deadline, on_timeout) = if timeout_ms > 0 {
                (
                    Instant::now() + Duration::from_millis(u64::from(timeout_ms)) + LOCK_GRACE,
                    CUresult::ERROR_NOT_READY,
                )
            } else {
                (request_deadline(&w), CUresult::ERROR_TIMEOUT)
            };
            send(&w, t, Op::Lock { timeout_ms }, deadline).map_err(|e| {
                if e == CUresult::ERROR_TIMEOUT {
                    on_timeout
                } else {
                    e
                }
            })
        },
    )
}

/// `cuCheckpointProcessCheckpoint`.
pub fn checkpoint(pid: i32) -> R<()> {
    let w = world()?;
    let tgid = crate::ffi::sys::tgid_of(pid);
    call(
        &w,
        "cuCheckpointProcessCheckpoint",
        tgid,
        &target_args(pid),
        || {
            let t = known(&w, pid)?;
            send(&w, t, Op::Checkpoint, request_deadline(&w))
        },
    )
}

/// Formats restore pairs for the trace.
fn pairs_arg(pairs: &[(GpuUuid, GpuUuid)]) -> String {
    let v: Vec<String> = pairs.iter().map(|(o, n)| format!("{o}={n}")).collect();
    format!("[{}]", v.join(","))
}

/// `cuCheckpointProcessRestore`. `pairs` are the GPU pairs of the restore arguments (only read
/// by a CUDA 13.0+ driver; the exports reject them as reserved bytes below that).
pub fn restore(pid: i32, pairs: &[(GpuUuid, GpuUuid)]) -> R<()> {
    let w = world()?;
    let tgid = crate::ffi::sys::tgid_of(pid);
    let args = || {
        if pairs.is_empty() {
            format!("pid={pid}")
        } else {
            format!("pid={pid}, gpuPairs={}", pairs_arg(pairs))
        }
    };
    call(&w, "cuCheckpointProcessRestore", tgid, &args, || {
        if !local().initialized {
            return Err(CUresult::ERROR_NOT_INITIALIZED);
        }
        let t = known(&w, pid)?;
        let pairs = pairs
            .iter()
            .map(|(a, b)| (GpuUuidText(*a), GpuUuidText(*b)))
            .collect();
        send(&w, t, Op::Restore { pairs }, request_deadline(&w))
    })
}

/// The world's entry of a target.
pub(crate) fn entry(w: &World, t: Target) -> R<crate::world::state::ProcessEntry> {
    entry_of(w, t)
}

/// Sends `op` to a target with the request timeout.
pub(crate) fn send_op(w: &World, t: Target, op: Op) -> R<()> {
    send(w, t, op, request_deadline(w))
}

/// `cuCheckpointProcessCheckpoint` with custom storage (a non-NULL `customStorageInfo_out`,
/// CUDA 13.4): the target goes to CHECKPOINTING; returns the operation ([`custom`]).
pub fn checkpoint_custom(pid: i32) -> R<custom::Opened> {
    let w = world()?;
    let tgid = crate::ffi::sys::tgid_of(pid);
    call(
        &w,
        "cuCheckpointProcessCheckpoint",
        tgid,
        &|| format!("pid={pid}, customStorageInfo_out"),
        || custom::open_checkpoint(&w, pid),
    )
}

/// `cuCheckpointProcessRestore` with custom storage: the target goes to RESTORING.
pub fn restore_custom(pid: i32, pairs: &[(GpuUuid, GpuUuid)]) -> R<custom::Opened> {
    let w = world()?;
    let tgid = crate::ffi::sys::tgid_of(pid);
    let args = || {
        if pairs.is_empty() {
            format!("pid={pid}, customStorageInfo_out")
        } else {
            format!(
                "pid={pid}, gpuPairs={}, customStorageInfo_out",
                pairs_arg(pairs)
            )
        }
    };
    call(&w, "cuCheckpointProcessRestore", tgid, &args, || {
        custom::open_restore(&w, pid, pairs)
    })
}

/// `cuCheckpointOperationComplete`.
pub fn operation_complete(handle: u64) -> R<()> {
    let w = world()?;
    let target = custom::target_of(handle);
    call(
        &w,
        "cuCheckpointOperationComplete",
        target,
        &|| format!("handle={handle:#x}"),
        || custom::complete(&w, handle),
    )
}

/// `cuCheckpointProcessUnlock`.
pub fn unlock(pid: i32) -> R<()> {
    let w = world()?;
    let tgid = crate::ffi::sys::tgid_of(pid);
    call(
        &w,
        "cuCheckpointProcessUnlock",
        tgid,
        &target_args(pid),
        || {
            let t = known(&w, pid)?;
            send(&w, t, Op::Unlock, request_deadline(&w))
        },
    )
}

/// How long a caller sleeps on the response doorbell before it checks the target is alive.
const ANSWER_WAIT: Duration = Duration::from_millis(20);

/// Appends a timeout of `function`'s request to `t` to the world's timeout log
/// (`timeouts.log`, module [`crate::world::timeouts`]), with what `/proc` says of its restore
/// thread now.
fn log_timeout(w: &World, t: Target, function: &str, waited: Waited, since: Instant) {
    w.log_timeout(&Timeout {
        function,
        target: t.pid,
        restore_tid: crate::world::pidns::restore_thread(t.pid, t.id),
        waited,
        after: since.elapsed(),
    });
}

/// Sends `op` to the restore thread of `tgid` and waits for its answer until `deadline`.
/// `CUDA_ERROR_TIMEOUT` when the thread does not answer in time (stopped, hung); if the thread
/// had not picked the request up by then, the request is withdrawn and nothing happens. Every
/// such timeout, and one waiting for the mailbox's `call.lock`, is logged in `timeouts.log`.
fn send(w: &World, t: Target, op: Op, deadline: Instant) -> R<()> {
    let tgid = t.pid;
    let since = Instant::now();
    let function = op.function();
    let dir = w.mailbox_dir(t.id);
    if !dir.is_dir() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let _caller = crate::ffi::sys::FileLock::acquire(&dir.join("call.lock"), deadline).map_err(
        |e| match e {
            None => {
                log_timeout(w, t, function, Waited::CallLock, since);
                CUresult::ERROR_TIMEOUT
            }
            Some(_) => CUresult::ERROR_OPERATING_SYSTEM,
        },
    )?;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = (u64::from(std::process::id()) << 32)
        | NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let req = Request {
        id,
        caller: std::process::id(),
        op,
    };
    let req_path = dir.join("req.json");
    let resp_path = dir.join("resp.json");
    let _ = std::fs::remove_file(&resp_path);
    let text = serde_json::to_vec(&req).expect("request serialises");
    crate::world::write_atomic(&req_path, &text).map_err(os_err)?;
    // A target without a doorbell (MOCK_CUDA_MAILBOX=poll) is polled with backoff.
    let bell = crate::ffi::sys::Bell::map(&dir.join(target::BELL_FILE), false).ok();
    if let Some(b) = &bell {
        b.ring(target::BELL_REQUEST);
    }
    let mut pause = Duration::from_micros(50);
    loop {
        // Read the doorbell before looking for the answer: an answer written after the look
        // changes it, and the wait below returns at once.
        let seen = bell.as_ref().map(|b| {
            b.word(target::BELL_RESPONSE)
                .load(std::sync::atomic::Ordering::SeqCst)
        });
        if let Some(resp) = read_response(&resp_path) {
            if resp.id == id {
                let _ = std::fs::remove_file(&resp_path);
                let code = CUresult(resp.result);
                return if code.is_success() { Ok(()) } else { Err(code) };
            }
        }
        // The thread took the request (it renames the file away) when it is gone.
        let taken = || !req_path.exists();
        if Instant::now() >= deadline {
            // A long checkpoint or restore is waited for as long as it makes progress: the
            // timeout is for a thread that does not answer, not for one that works.
            let patience = Duration::from_millis(w.config().driver.request_timeout_ms);
            if !(taken() && w.transfer_working(t.id, tgid, id, patience)) {
                // Withdraw the request if the thread has not taken it yet.
                let withdrawn = std::fs::remove_file(&req_path).is_ok();
                let waited = Waited::Answer { taken: !withdrawn };
                log_timeout(w, t, function, waited, since);
                return Err(CUresult::ERROR_TIMEOUT);
            }
        }
        if !crate::ffi::sys::alive(tgid) {
            // A target that dies while it carries the request out (killed mid-checkpoint)
            // fails the call as the OS failing under the driver (cuda-checkpoint#58 reports
            // 304 from a lock that crashed its target); one that died before is not a process.
            let code = if taken() {
                CUresult::ERROR_OPERATING_SYSTEM
            } else {
                CUresult::ERROR_INVALID_VALUE
            };
            let _ = std::fs::remove_file(&req_path);
            return Err(code);
        }
        match (&bell, seen) {
            (Some(b), Some(seen)) => {
                // Bounded, so liveness and the deadline are still checked while waiting (past
                // the deadline, a transfer in progress is checked on every wait).
                let left = deadline.saturating_duration_since(Instant::now());
                let wait = if left.is_zero() {
                    ANSWER_WAIT
                } else {
                    left.min(ANSWER_WAIT)
                };
                b.wait(target::BELL_RESPONSE, seen, wait);
            }
            _ => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        }
    }
}

fn read_response(path: &Path) -> Option<Response> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

// ---------------------------------------------------------------------------------------------
// The command line served through the export table

/// [`crate::cli_api::CheckpointDriver`] backed by this driver, for the command line.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealDriver;

impl crate::cli_api::CheckpointDriver for RealDriver {
    fn driver_version(&self) -> i32 {
        driver_version().unwrap_or(0)
    }
    fn branch(&self) -> (u32, String) {
        world().map_or((0, String::new()), |w| {
            (w.config().driver.branch, w.config().driver.version_string())
        })
    }
    fn init(&self) -> Result<(), CUresult> {
        init(0)
    }
    fn get_restore_tid(&self, pid: i32) -> Result<i32, CUresult> {
        get_restore_tid(pid)
    }
    fn get_state(&self, pid: i32) -> Result<CUprocessState, CUresult> {
        get_state(pid)
    }
    fn lock(&self, pid: i32, timeout_ms: u32) -> Result<(), CUresult> {
        lock(pid, timeout_ms)
    }
    fn checkpoint(&self, pid: i32) -> Result<(), CUresult> {
        checkpoint(pid)
    }
    fn restore(&self, pid: i32, pairs: &[(GpuUuid, GpuUuid)]) -> Result<(), CUresult> {
        restore(pid, pairs)
    }
    fn unlock(&self, pid: i32) -> Result<(), CUresult> {
        unlock(pid)
    }
}
