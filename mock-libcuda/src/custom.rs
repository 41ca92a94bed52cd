//! Custom storage (CUDA 13.4), the caller's side: opening a custom-storage checkpoint or
//! restore of another process, the device pointers it hands out, the caller's copies to and
//! from them (synchronous and on streams), streams, and `cuCheckpointOperationComplete`.
//! The target's side (the state changes, the abort when the caller dies) runs on the target's
//! restore thread ([`crate::target`]). The model is in `docs/custom-storage.md` ("The mock's
//! model"); the API surface in `docs/mock-world.md`.
//!
//! * **Device pointers.** Each entry of an operation's per-device list gets an address range
//!   of its own, `CUSTOM_BASE + (slot << 40)`, that no allocation of the caller uses. A byte
//!   at offset `o` of the range is byte `o` of the target's allocations on that GPU laid end
//!   to end in allocation order: a copy reads or writes the target's device memory files
//!   (a real allocation's bytes; a virtual allocation's stored form, where a run of one byte
//!   value is stored as a fill). The range ends with the operation.
//! * **Liveness.** A caller holds a `flock` on a file of its own under `<world>/callers/` for
//!   its whole life; the target's restore thread aborts the open operation once the lock is
//!   free (the kernel drops it when the caller dies), which works across pid namespaces.
//! * **Time.** A copy to or from an operation's device pointer takes the time the world's time
//!   model gives a part on that GPU that bypasses the driver's copy path (its share of the
//!   GPU's link and of the host, with every other transfer and copy in the world): a
//!   synchronous copy waits for it; an asynchronous one moves the bytes at once and leaves the
//!   time to its stream's worker, which `cuStreamSynchronize` and Complete wait for. The
//!   caller publishes its copies as a transfer (direction `copy`, staging nothing), so the
//!   targets' own checkpoints and restores see them on the links.

use crate::devmem::{Piece, Sparse};
use crate::driver::{self, Target, R};
use crate::target::{self, Op};
use crate::world::config::GpuUuidText;
use crate::world::rates::{self, Limits, Part};
use crate::world::state::Allocation;
use crate::world::transfers::{Direction, GpuProgress, Progress};
use crate::world::World;
use abi::{CUresult, GpuUuid};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// First address of the ranges custom-storage operations hand out (far from allocations).
pub const CUSTOM_BASE: u64 = 0xC000_0000_0000_0000;
/// Bits of offset in a range: one GPU's share may span 1 TiB.
const RANGE_SHIFT: u32 = 40;
/// A run of one byte value at least this long in a copy into a virtual allocation is stored
/// as a fill, not as data.
pub const FILL_RUN: usize = 256;
/// How often a modelled copy recomputes its rate.
const TICK: Duration = Duration::from_millis(10);
/// How often a modelled copy publishes the caller's transfer.
const PUBLISH: Duration = Duration::from_millis(50);
/// A copy shorter than this (wall-clock, alone) just sleeps its time.
const INSTANT: Duration = Duration::from_millis(2);

/// Whether the caller whose liveness file is `caller` (relative to the world) is gone: the file
/// is missing or nobody holds its lock.
#[must_use]
pub fn caller_gone(w: &World, caller: &str) -> bool {
    let path = w.dir().join(caller);
    !path.exists() || crate::ffi::sys::FileLock::acquire(&path, std::time::Instant::now()).is_ok()
}

/// The GPU of the open operation's range `dptr` lies in, if it lies in one.
#[must_use]
pub fn gpu_of(dptr: u64) -> Option<GpuUuid> {
    let guard = ops();
    guard.as_ref()?.values().find_map(|op| {
        op.devices
            .iter()
            .find(|d| dptr >= d.base && dptr - d.base < (1 << RANGE_SHIFT))
            .map(|d| d.gpu)
    })
}

/// Whether `dptr` lies in a custom-storage range.
#[must_use]
pub fn is_custom(dptr: u64) -> bool {
    dptr >= CUSTOM_BASE
}

/// One entry of an operation's per-device list, as handed to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceData {
    pub dev_ptr: u64,
    pub size: u64,
    pub stream: u64,
}

/// An opened operation: its handle and per-device list (in the caller's ordinal order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub handle: u64,
    pub devices: Vec<DeviceData>,
}

#[derive(Debug, Clone)]
struct Segment {
    alloc: Allocation,
    /// Offset of the allocation in the device's range.
    start: u64,
}

#[derive(Debug, Clone)]
struct DeviceView {
    gpu: GpuUuid,
    base: u64,
    size: u64,
    stream: u64,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone)]
struct OpenOperation {
    target: Target,
    devices: Vec<DeviceView>,
}

static OPS: Mutex<Option<HashMap<u64, OpenOperation>>> = Mutex::new(None);
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);
static NEXT_SLOT: AtomicU64 = AtomicU64::new(0);

fn ops() -> std::sync::MutexGuard<'static, Option<HashMap<u64, OpenOperation>>> {
    OPS.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Liveness

/// The caller's liveness file (relative to the world), locked for the process's life.
fn liveness(w: &World) -> R<String> {
    static HELD: OnceLock<(String, crate::ffi::sys::FileLock)> = OnceLock::new();
    static INIT: Mutex<()> = Mutex::new(());
    let _g = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((name, _)) = HELD.get() {
        return Ok(name.clone());
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!(
        "{}/{}-{nanos}.lock",
        target::CALLERS_DIR,
        std::process::id()
    );
    let dir = w.dir().join(target::CALLERS_DIR);
    std::fs::create_dir_all(&dir).map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?;
    let lock = crate::ffi::sys::FileLock::acquire(&w.dir().join(&name), Instant::now())
        .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?;
    let _ = HELD.set((name.clone(), lock));
    Ok(name)
}

// ---------------------------------------------------------------------------------------------
// Opening and completing

fn custom_supported(w: &World) -> bool {
    w.config().driver.cuda_version() >= abi::cuda::CUSTOM_STORAGE_MIN_DRIVER_VERSION
}

/// The caller's GPUs with a context, and its device table (ordinal -> GPU).
fn caller_gpus(w: &World) -> R<(Vec<GpuUuid>, Vec<GpuUuid>)> {
    let table = driver::device_table(w).map_err(|_| CUresult::ERROR_INVALID_CONTEXT)?;
    let me = target::runtime()
        .map(|rt| rt.id())
        .ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
    let contexts = w
        .read_process(me)
        .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?
        .map(|e| e.contexts.iter().map(|c| c.0).collect())
        .unwrap_or_default();
    Ok((contexts, table))
}

/// Orders `gpus` by the caller's ordinals; `CUDA_ERROR_INVALID_CONTEXT` when the caller has
/// no context on one of them.
fn in_caller_order(w: &World, gpus: &[GpuUuid]) -> R<Vec<GpuUuid>> {
    let (contexts, table) = caller_gpus(w)?;
    let mut out: Vec<(usize, GpuUuid)> = Vec::new();
    for g in gpus {
        if !contexts.contains(g) {
            return Err(CUresult::ERROR_INVALID_CONTEXT);
        }
        let ordinal = table
            .iter()
            .position(|t| t == g)
            .ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
        if !out.iter().any(|(_, x)| x == g) {
            out.push((ordinal, *g));
        }
    }
    out.sort_by_key(|(o, _)| *o);
    Ok(out.into_iter().map(|(_, g)| g).collect())
}

/// Registers an opened operation: one range and one stream per GPU.
fn register(
    target: Target,
    gpus: &[GpuUuid],
    allocations: &[Allocation],
    gpu_of: impl Fn(GpuUuid) -> GpuUuid,
) -> R<Opened> {
    let mut devices = Vec::new();
    for &g in gpus {
        let mut segments = Vec::new();
        let mut at = 0u64;
        for a in allocations.iter().filter(|a| gpu_of(a.gpu.0) == g) {
            segments.push(Segment {
                alloc: a.clone(),
                start: at,
            });
            at += a.size;
        }
        let slot = NEXT_SLOT.fetch_add(1, SeqCst);
        devices.push(DeviceView {
            gpu: g,
            base: CUSTOM_BASE + (slot << RANGE_SHIFT),
            size: at,
            stream: new_stream(),
            segments,
        });
    }
    let handle = 0xC5_0000_0000 + NEXT_HANDLE.fetch_add(1, SeqCst);
    let opened = Opened {
        handle,
        devices: devices
            .iter()
            .map(|d| DeviceData {
                dev_ptr: d.base,
                size: d.size,
                stream: d.stream,
            })
            .collect(),
    };
    ops()
        .get_or_insert_with(HashMap::new)
        .insert(handle, OpenOperation { target, devices });
    Ok(opened)
}

/// The caller-side checks every custom-storage call makes first: a world that has it, a
/// target that is not the caller, `cuInit` (else `CUDA_ERROR_INVALID_CONTEXT`: no context
/// can exist without it).
fn precheck(w: &World, pid: i32) -> R<Target> {
    if !custom_supported(w) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    if crate::ffi::sys::tgid_of(pid) == Some(std::process::id() as i32) {
        return Err(CUresult::ERROR_NOT_SUPPORTED);
    }
    let t = driver::resolve(w, pid)?;
    if target::runtime().is_some_and(|rt| rt.id() == t.id) {
        return Err(CUresult::ERROR_NOT_SUPPORTED);
    }
    if !driver::initialized() {
        return Err(CUresult::ERROR_INVALID_CONTEXT);
    }
    Ok(t)
}

/// `cuCheckpointProcessCheckpoint` with a non-NULL `customStorageInfo_out` (the caller side;
/// run inside the call's fault and trace wrapper).
pub fn open_checkpoint(w: &World, pid: i32) -> R<Opened> {
    let t = precheck(w, pid)?;
    let entry = driver::entry(w, t)?;
    let mut gpus: Vec<GpuUuid> = entry.contexts.iter().map(|c| c.0).collect();
    gpus.extend(entry.allocations.iter().map(|a| a.gpu.0));
    let gpus = in_caller_order(w, &gpus)?;
    let caller = liveness(w)?;
    driver::send_op(w, t, Op::CustomCheckpoint { caller })?;
    // LOCKED -> CHECKPOINTING: the allocations cannot change while it is open.
    let entry = driver::entry(w, t)?;
    register(t, &gpus, &entry.allocations, |g| g)
}

/// `cuCheckpointProcessRestore` with a non-NULL `customStorageInfo_out` (the caller side).
pub fn open_restore(w: &World, pid: i32, pairs: &[(GpuUuid, GpuUuid)]) -> R<Opened> {
    let t = precheck(w, pid)?;
    let entry = driver::entry(w, t)?;
    // The map and the GPUs are checked here only for a process the world knows checkpointed
    // with custom storage; anything else is the target's to refuse (ILLEGAL_STATE for the
    // wrong state, INVALID_VALUE for a host-staged checkpoint).
    let ready = entry.state() == abi::CUprocessState::CHECKPOINTED && entry.custom_storage;
    let map = if ready {
        target::resolve_restore_map(w, &entry.checkpointed, pairs)?
    } else {
        Vec::new()
    };
    let to = |u: GpuUuid| map.iter().find(|(o, _)| *o == u).map_or(u, |(_, n)| *n);
    let new_gpus: Vec<GpuUuid> = entry.checkpointed.iter().map(|c| to(c.uuid.0)).collect();
    // Checked before the target is asked (INVALID_CONTEXT leaves it as it was) ...
    in_caller_order(w, &new_gpus)?;
    let caller = liveness(w)?;
    let pairs_text = pairs
        .iter()
        .map(|(a, b)| (GpuUuidText(*a), GpuUuidText(*b)))
        .collect();
    driver::send_op(
        w,
        t,
        Op::CustomRestore {
            pairs: pairs_text,
            caller,
        },
    )?;
    // ... and the share list made from the entry as the target left it: a process restored
    // again from the same images announces itself (with what it checkpointed) only when it
    // takes this request, so the entry read above may be its dead incarnation's.
    let entry = driver::entry(w, t)?;
    let map = target::resolve_restore_map(w, &entry.checkpointed, pairs)?;
    let to = |u: GpuUuid| map.iter().find(|(o, _)| *o == u).map_or(u, |(_, n)| *n);
    let new_gpus: Vec<GpuUuid> = entry.checkpointed.iter().map(|c| to(c.uuid.0)).collect();
    let gpus = in_caller_order(w, &new_gpus)?;
    register(t, &gpus, &entry.allocations, to)
}

/// The target of an open operation (for fault matching), if the handle is open.
#[must_use]
pub fn target_of(handle: u64) -> Option<i32> {
    ops()
        .as_ref()
        .and_then(|m| m.get(&handle))
        .map(|o| o.target.pid)
}

/// `cuCheckpointOperationComplete` (inside the call's fault and trace wrapper): synchronises
/// the operation's streams (one under capture: `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, the
/// operation stays open), then has the target finish. Any failure leaves the operation open.
pub fn complete(w: &World, handle: u64) -> R<()> {
    if !custom_supported(w) {
        return Err(CUresult::ERROR_NOT_SUPPORTED);
    }
    let op = ops()
        .as_ref()
        .and_then(|m| m.get(&handle))
        .cloned()
        .ok_or(CUresult::ERROR_INVALID_VALUE)?;
    for d in &op.devices {
        if stream_capturing(d.stream) {
            return Err(CUresult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
    }
    for d in &op.devices {
        stream_wait(d.stream)?;
    }
    driver::send_op(w, op.target, Op::Complete)?;
    if let Some(m) = ops().as_mut() {
        m.remove(&handle);
    }
    for d in &op.devices {
        let _ = streams().as_mut().map(|s| s.remove(&d.stream));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Copies

/// The operation range `dptr..dptr + len` lies in: (target world id, GPU, segments, offset).
fn locate(dptr: u64, len: u64) -> R<(u64, GpuUuid, Vec<Segment>, u64)> {
    let guard = ops();
    let m = guard.as_ref().ok_or(CUresult::ERROR_INVALID_VALUE)?;
    for op in m.values() {
        for d in &op.devices {
            if dptr >= d.base && dptr - d.base < (1 << RANGE_SHIFT) {
                let off = dptr - d.base;
                if off.checked_add(len).is_none_or(|end| end > d.size) {
                    return Err(CUresult::ERROR_INVALID_VALUE);
                }
                return Ok((op.target.id, d.gpu, d.segments.clone(), off));
            }
        }
    }
    Err(CUresult::ERROR_INVALID_VALUE)
}

/// The process whose memory the custom-storage range at `dptr` maps (its pid as the caller
/// named it); `None` for any other address.
#[must_use]
pub fn target_pid(dptr: u64) -> Option<i32> {
    if !is_custom(dptr) {
        return None;
    }
    let guard = ops();
    let m = guard.as_ref()?;
    m.values()
        .find(|op| {
            op.devices
                .iter()
                .any(|d| dptr >= d.base && dptr - d.base < (1 << RANGE_SHIFT))
        })
        .map(|op| op.target.pid)
}

/// Serialises read-modify-write cycles of the target's virtual allocations in this process.
static SPARSE_IO: Mutex<()> = Mutex::new(());

fn sparse_of(w: &World, id: u64, a: &Allocation) -> R<Sparse> {
    let bytes =
        std::fs::read(w.devmem_path(id, a.id)).map_err(|_| CUresult::ERROR_ILLEGAL_ADDRESS)?;
    Sparse::decode(&bytes).map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)
}

/// Calls `f(segment, offset in its allocation, range of the caller's buffer)` for each part of
/// `off..off + len` in the segments.
fn each_part(
    segments: &[Segment],
    off: u64,
    len: u64,
    mut f: impl FnMut(&Segment, u64, std::ops::Range<usize>) -> R<()>,
) -> R<()> {
    let end = off + len;
    for s in segments {
        let (a, b) = (s.start, s.start + s.alloc.size);
        let from = off.max(a);
        let to = end.min(b);
        if from < to {
            f(s, from - a, (from - off) as usize..(to - off) as usize)?;
        }
    }
    Ok(())
}

/// Reads the target's bytes at `dptr` into `dst` (no time taken).
fn read_now(w: &World, dst: &mut [u8], dptr: u64) -> R<GpuUuid> {
    use std::os::unix::fs::FileExt;
    let (id, gpu, segments, off) = locate(dptr, dst.len() as u64)?;
    each_part(&segments, off, dst.len() as u64, |s, at, range| {
        let buf = &mut dst[range];
        if s.alloc.sampled {
            let _io = SPARSE_IO.lock().unwrap_or_else(|p| p.into_inner());
            sparse_of(w, id, &s.alloc)?
                .read(at, buf)
                .map_err(|_| CUresult::ERROR_INVALID_VALUE)
        } else {
            std::fs::File::open(w.devmem_path(id, s.alloc.id))
                .and_then(|f| f.read_exact_at(buf, at))
                .map_err(|_| CUresult::ERROR_ILLEGAL_ADDRESS)
        }
    })?;
    Ok(gpu)
}

/// The pieces a copy of `data` into a virtual allocation stores: runs of one byte value of at
/// least [`FILL_RUN`] bytes (or the whole buffer) as fills, the rest as data.
#[must_use]
pub fn pieces_of(data: &[u8]) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut data_from = 0usize;
    let mut i = 0usize;
    while i < data.len() {
        let v = data[i];
        let mut j = i;
        while j < data.len() && data[j] == v {
            j += 1;
        }
        if j - i >= FILL_RUN || (i == 0 && j == data.len()) {
            if data_from < i {
                out.push(Piece::Data(data[data_from..i].to_vec()));
            }
            out.push(Piece::Fill {
                len: (j - i) as u64,
                value: v,
            });
            data_from = j;
        }
        i = j;
    }
    if data_from < data.len() {
        out.push(Piece::Data(data[data_from..].to_vec()));
    }
    out
}

/// Writes `src` into the target's memory at `dptr` (no time taken).
fn write_now(w: &World, dptr: u64, src: &[u8]) -> R<GpuUuid> {
    use std::os::unix::fs::FileExt;
    let (id, gpu, segments, off) = locate(dptr, src.len() as u64)?;
    each_part(&segments, off, src.len() as u64, |s, at, range| {
        let buf = &src[range];
        if s.alloc.sampled {
            let _io = SPARSE_IO.lock().unwrap_or_else(|p| p.into_inner());
            let mut m = sparse_of(w, id, &s.alloc)?;
            match m.write_pieces(at, &pieces_of(buf), w.config().memory.sample_limit()) {
                Ok(()) => std::fs::write(w.devmem_path(id, s.alloc.id), m.encode())
                    .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM),
                Err(crate::devmem::DevmemError::SampleFull { .. }) => {
                    Err(CUresult::ERROR_NOT_SUPPORTED)
                }
                Err(_) => Err(CUresult::ERROR_INVALID_VALUE),
            }
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .open(w.devmem_path(id, s.alloc.id))
                .and_then(|f| f.write_all_at(buf, at))
                .map_err(|_| CUresult::ERROR_ILLEGAL_ADDRESS)
        }
    })?;
    Ok(gpu)
}

/// A synchronous copy from an operation's range: the bytes, then the modelled time.
pub fn dtoh(w: &Arc<World>, dst: &mut [u8], dptr: u64) -> R<()> {
    let gpu = read_now(w, dst, dptr)?;
    model_copy(w, gpu, dst.len() as u64);
    Ok(())
}

/// A synchronous copy into an operation's range.
pub fn htod(w: &Arc<World>, dptr: u64, src: &[u8]) -> R<()> {
    let gpu = write_now(w, dptr, src)?;
    model_copy(w, gpu, src.len() as u64);
    Ok(())
}

/// An asynchronous copy of `len` bytes at `dptr` on `stream`: the range is checked now, `work`
/// moves the bytes on the stream's worker (the caller's buffer is the stream's until it is
/// synchronised), which then takes the modelled time. An error while they move is the
/// stream's, reported by the next `cuStreamSynchronize`.
fn async_copy(
    w: &Arc<World>,
    stream: u64,
    dptr: u64,
    len: usize,
    work: impl FnOnce(&World) -> R<GpuUuid> + Send + 'static,
) -> R<()> {
    check_stream(stream)?;
    let (_, gpu, _, _) = locate(dptr, len as u64)?;
    let w2 = Arc::clone(w);
    enqueue(
        w,
        stream,
        gpu,
        len as u64,
        Box::new(move || work(&w2).map(|_| ())),
    )
}

/// An asynchronous copy from an operation's range (see `async_copy`).
pub fn dtoh_async(w: &Arc<World>, dst: crate::ffi::HostBuf, dptr: u64, stream: u64) -> R<()> {
    async_copy(w, stream, dptr, dst.len(), move |w| {
        dst.with_mut(|b| read_now(w, b, dptr))
    })
}

/// An asynchronous copy into an operation's range (see `async_copy`).
pub fn htod_async(w: &Arc<World>, dptr: u64, src: crate::ffi::HostBuf, stream: u64) -> R<()> {
    async_copy(w, stream, dptr, src.len(), move |w| {
        src.with(|b| write_now(w, dptr, b))
    })
}

// ---------------------------------------------------------------------------------------------
// The time model of the caller's copies

struct ActiveCopy {
    key: u64,
    gpu: GpuUuid,
    total: u64,
    moved: u64,
}

static ACTIVE: Mutex<Vec<ActiveCopy>> = Mutex::new(Vec::new());
static NEXT_COPY: AtomicU64 = AtomicU64::new(1);

fn publish(w: &World, me: u64) {
    let active = ACTIVE.lock().unwrap_or_else(|p| p.into_inner());
    if active.is_empty() {
        w.remove_progress(me);
        return;
    }
    let p = Progress {
        id: me,
        pid: target::host_pid_hint(w),
        identity: target::own_identity(),
        request: 0,
        direction: Direction::Copy,
        gpus: active
            .iter()
            .map(|c| GpuProgress {
                uuid: GpuUuidText(c.gpu),
                total: c.total,
                moved: c.moved,
            })
            .collect(),
    };
    drop(active);
    let _ = w.write_progress(&p);
}

/// Takes the time a copy of `bytes` on `gpu` needs: its share of the GPU's link and of the
/// host with every transfer of the world and every other copy of this process
/// ([`rates::share_bypassing`]), recomputed every tick, the process's copies published as its
/// transfer meanwhile.
fn model_copy(w: &World, gpu: GpuUuid, bytes: u64) {
    if bytes == 0 {
        return;
    }
    let cfg = w.config();
    let limits = Limits::of(&cfg.rates);
    let scale = cfg.rates.time_scale;
    let alone = rates::duration(bytes as f64 / limits.link.min(limits.host), scale);
    let Some(me) = target::runtime().map(|rt| rt.id()) else {
        std::thread::sleep(alone);
        return;
    };
    if alone < INSTANT {
        std::thread::sleep(alone);
        return;
    }
    let key = NEXT_COPY.fetch_add(1, SeqCst);
    ACTIVE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(ActiveCopy {
            key,
            gpu,
            total: bytes,
            moved: 0,
        });
    publish(w, me);
    let mut moved = 0.0f64;
    let mut last = Instant::now();
    let mut published = last;
    loop {
        let mut all: Vec<Part<u64, GpuUuid>> = Vec::new();
        let mut bypass = Vec::new();
        for p in w.transfers().into_iter().filter(|p| p.id != me) {
            for g in p.gpus.iter().filter(|g| g.active()) {
                all.push(Part {
                    process: p.id,
                    gpu: g.uuid.0,
                });
                bypass.push(p.direction == Direction::Copy);
            }
        }
        let mine = {
            let active = ACTIVE.lock().unwrap_or_else(|p| p.into_inner());
            let mut mine = 0;
            for c in active.iter().filter(|c| c.moved < c.total) {
                if c.key == key {
                    mine = all.len();
                }
                all.push(Part {
                    process: me,
                    gpu: c.gpu,
                });
                bypass.push(true);
            }
            mine
        };
        let rate = rates::share_bypassing(&all, &bypass, &limits)[mine];
        let left = (bytes as f64 - moved) / rate;
        std::thread::sleep(TICK.min(rates::duration(left, scale)));
        let now = Instant::now();
        moved = (moved + rate * now.duration_since(last).as_secs_f64() * scale).min(bytes as f64);
        last = now;
        let done = bytes as f64 - moved < 1.0;
        {
            let mut active = ACTIVE.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = active.iter_mut().find(|c| c.key == key) {
                c.moved = if done { bytes } else { moved as u64 };
            }
        }
        if done {
            break;
        }
        if now.duration_since(published) >= PUBLISH {
            publish(w, me);
            published = now;
        }
    }
    ACTIVE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|c| c.key != key);
    publish(w, me);
}

// ---------------------------------------------------------------------------------------------
// Streams

struct Stream {
    capturing: bool,
    queue: Arc<Queue>,
}

/// Moves a copy's bytes.
type Work = Box<dyn FnOnce() -> R<()> + Send>;

/// A copy a stream's worker carries out: (world, GPU, bytes, the work that moves them).
type Job = (Arc<World>, GpuUuid, u64, Work);

/// A stream's work: a worker thread moves each copy's bytes and takes its modelled time, in
/// turn. The first error is kept for the next synchronisation.
struct Queue {
    pending: Mutex<u64>,
    idle: Condvar,
    jobs: Mutex<Option<std::sync::mpsc::Sender<Job>>>,
    error: Mutex<Option<CUresult>>,
}

static STREAMS: Mutex<Option<HashMap<u64, Stream>>> = Mutex::new(None);
static NEXT_STREAM: AtomicU64 = AtomicU64::new(1);

fn streams() -> std::sync::MutexGuard<'static, Option<HashMap<u64, Stream>>> {
    STREAMS.lock().unwrap_or_else(|p| p.into_inner())
}

fn new_stream() -> u64 {
    let h = 0x5_0000_0000 + NEXT_STREAM.fetch_add(1, SeqCst);
    streams().get_or_insert_with(HashMap::new).insert(
        h,
        Stream {
            capturing: false,
            queue: Arc::new(Queue {
                pending: Mutex::new(0),
                idle: Condvar::new(),
                jobs: Mutex::new(None),
                error: Mutex::new(None),
            }),
        },
    );
    h
}

/// A stream handle that is 0 (the NULL stream) or one this process created.
fn check_stream(stream: u64) -> R<()> {
    if stream == 0 {
        return Ok(());
    }
    let s = streams();
    let st = s
        .as_ref()
        .and_then(|m| m.get(&stream))
        .ok_or(CUresult::ERROR_INVALID_HANDLE)?;
    if st.capturing {
        // The mock captures nothing: a copy into a stream under capture is refused.
        return Err(CUresult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(())
}

fn stream_capturing(stream: u64) -> bool {
    streams()
        .as_ref()
        .and_then(|m| m.get(&stream))
        .is_some_and(|s| s.capturing)
}

fn enqueue(w: &Arc<World>, stream: u64, gpu: GpuUuid, bytes: u64, work: Work) -> R<()> {
    let queue = streams()
        .as_ref()
        .and_then(|m| m.get(&stream))
        .map(|s| Arc::clone(&s.queue));
    let Some(q) = queue else {
        // The NULL stream: synchronous.
        work()?;
        model_copy(w, gpu, bytes);
        return Ok(());
    };
    *q.pending.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    let mut jobs = q.jobs.lock().unwrap_or_else(|p| p.into_inner());
    let tx = jobs.get_or_insert_with(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let worker = Arc::clone(&q);
        let _ = std::thread::Builder::new()
            .name("cuda-stream".to_owned())
            .spawn(move || {
                for (w, gpu, bytes, work) in rx {
                    let failed = worker
                        .error
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .is_some();
                    // After an error the stream's later copies are not carried out.
                    if !failed {
                        match work() {
                            Ok(()) => model_copy(&w, gpu, bytes),
                            Err(e) => {
                                *worker.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                            }
                        }
                    }
                    let mut n = worker.pending.lock().unwrap_or_else(|p| p.into_inner());
                    *n -= 1;
                    worker.idle.notify_all();
                }
            });
        tx
    });
    if tx.send((Arc::clone(w), gpu, bytes, work)).is_err() {
        // No worker (the thread could not start): the copy is not made.
        *q.pending.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        return Err(CUresult::ERROR_OUT_OF_MEMORY);
    }
    Ok(())
}

/// Waits until the stream's work is done: the first error of its copies since the last wait
/// is the answer.
fn stream_wait(stream: u64) -> R<()> {
    if stream == 0 {
        return Ok(());
    }
    let q = streams()
        .as_ref()
        .and_then(|m| m.get(&stream))
        .map(|s| Arc::clone(&s.queue))
        .ok_or(CUresult::ERROR_INVALID_HANDLE)?;
    let mut n = q.pending.lock().unwrap_or_else(|p| p.into_inner());
    while *n > 0 {
        n = q.idle.wait(n).unwrap_or_else(|p| p.into_inner());
    }
    drop(n);
    let error = q.error.lock().unwrap_or_else(|p| p.into_inner()).take();
    error.map_or(Ok(()), Err)
}

/// `cuStreamCreate`.
pub fn stream_create() -> u64 {
    new_stream()
}

/// `cuStreamDestroy`: unknown handle `CUDA_ERROR_INVALID_HANDLE`; pending work finishes first.
pub fn stream_destroy(stream: u64) -> R<()> {
    // An error of its copies was the synchronisation's to report.
    let _ = stream_wait(stream);
    streams()
        .as_mut()
        .and_then(|m| m.remove(&stream))
        .map(|_| ())
        .ok_or(CUresult::ERROR_INVALID_HANDLE)
}

/// `cuStreamSynchronize`: a stream under capture is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
pub fn stream_synchronize(stream: u64) -> R<()> {
    if stream_capturing(stream) {
        return Err(CUresult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    stream_wait(stream)
}

/// `cuStreamBeginCapture_v2`: marks the stream as capturing (the NULL stream cannot be
/// captured; one already capturing is `CUDA_ERROR_ILLEGAL_STATE`).
pub fn stream_begin_capture(stream: u64) -> R<()> {
    if stream == 0 {
        return Err(CUresult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    let mut s = streams();
    let st = s
        .as_mut()
        .and_then(|m| m.get_mut(&stream))
        .ok_or(CUresult::ERROR_INVALID_HANDLE)?;
    if st.capturing {
        return Err(CUresult::ERROR_ILLEGAL_STATE);
    }
    st.capturing = true;
    Ok(())
}

/// `cuStreamEndCapture`: ends the capture; the graph is an empty token (nothing was captured).
pub fn stream_end_capture(stream: u64) -> R<u64> {
    let mut s = streams();
    let st = s
        .as_mut()
        .and_then(|m| m.get_mut(&stream))
        .ok_or(CUresult::ERROR_INVALID_HANDLE)?;
    if !st.capturing {
        return Err(CUresult::ERROR_ILLEGAL_STATE);
    }
    st.capturing = false;
    Ok(0x6_0000_0000 + stream)
}
