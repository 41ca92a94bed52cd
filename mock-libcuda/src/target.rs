//! The in-target side of the mock: what lives inside a process that uses CUDA.
//!
//! A process becomes a CUDA process (a checkpoint target) when it creates its first context.
//! It then gets:
//! * a **world id**, under which the world files it (its entry, mailbox and device memory),
//!   and its identity as the kernel knows it: its pid namespace and pid there, and its host pid
//!   when it can see it (module [`crate::world::pidns`]). A process that CRIU restored into a
//!   new pid namespace (new host pid, new namespace inode, the same namespace pid) notices the
//!   change on its restore thread and re-announces itself under the identity it has now.
//! * a **restore thread** (named `cuda` + 11 hex digits, like the driver's: the digits are the
//!   world id, the mark the process is found by after a restore), whose TID
//!   `cuCheckpointProcessGetRestoreThreadId` reports. Lock, checkpoint, restore and unlock
//!   requests are carried out by this thread, which serves the process's mailbox in the world:
//!   a caller writes a request file and rings a futex doorbell shared through a file mapping.
//!   A request to a process whose restore thread is stopped (SIGSTOP, ptrace) therefore makes no
//!   progress and the caller gives up after its timeout.
//!
//!   CRIU freezes every thread of a task wherever it is and then resumes the restore thread
//!   alone, so the thread must never wait for something a workload thread can hold. It takes
//!   no in-process lock a workload thread takes (its `Mutex`es are its own, the API gate is
//!   atomics, it keeps its own copy of the world, and the world's caches are per thread), and
//!   waits for workload threads in two places only: a lock waits (up to `timeoutMs`) for the
//!   calls in the API gate, which is why CRIU locks a task before it freezes it; and the
//!   world's state lock (`flock`; a holder stopped for 300 ms is broken), which workload
//!   threads take inside the gate (allocations, contexts), or outside it only to register the
//!   process, to count scripted faults of calls made outside the gate, and in checkpoint calls
//!   of their own.
//!   `tests/restore_thread_stress.rs` (full mode) freezes a busy CUDA tree that way hundreds of
//!   times.
//! * an **API gate**: workload calls (allocations, copies, …) enter it; a lock waits for the
//!   calls in flight to leave (up to `timeoutMs`) and keeps new ones blocked until unlock.
//! * **device memory** that lives outside the process (one file per allocation under
//!   `<world>/devmem/`) while RUNNING or LOCKED. A checkpoint moves it into the process's own
//!   memory (so CRIU dumps it with the process) and a restore writes it back, onto the mapped
//!   GPUs. Both take the time their (logical) bytes need under the world's time model
//!   ([`crate::world::rates`]), publishing their progress in `<world>/transfers/`; a
//!   checkpoint whose staged bytes do not fit in the host's memory is OOM-killed, and a
//!   restore claims its GPU memory before it starts (`CUDA_ERROR_OUT_OF_MEMORY` when it does
//!   not fit, the checkpoint intact).
//! * a **GPU handle**: a file descriptor CRIU refuses to dump, held while the process has GPU
//!   state, released by a checkpoint and re-acquired by a restore. A dump whose CUDA checkpoint
//!   did not happen fails, as on a real GPU.

use crate::world::config::GpuUuidText;
use crate::world::pidns::{self, NsIdentity, Presence};
use crate::world::rates::{self, Limits, Part};
use crate::world::state::{Allocation, CheckpointedGpu};
use crate::world::transfers::{Direction, GpuProgress, Progress};
use crate::world::World;
use abi::{CUprocessState, CUresult, GpuUuid};
use serde::{Deserialize, Serialize};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How often the restore thread looks at its mailbox when it has no doorbell
/// (`MOCK_CUDA_MAILBOX=poll`, or the doorbell could not be mapped).
const POLL: Duration = Duration::from_millis(1);

/// How long the restore thread sleeps on its doorbell before it looks at the mailbox anyway.
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// The doorbell word a caller rings after writing a request.
pub(crate) const BELL_REQUEST: usize = 0;
/// The doorbell word the restore thread rings after writing a response.
pub(crate) const BELL_RESPONSE: usize = 1;
/// The doorbell's file in a mailbox.
pub(crate) const BELL_FILE: &str = "bell";

/// Environment variable choosing how a target's restore thread learns of requests: `futex`
/// (the default: a doorbell wakes it) or `poll` (it looks every millisecond, as the mock did
/// before it had a doorbell; for measuring the difference).
pub const MAILBOX_ENV: &str = "MOCK_CUDA_MAILBOX";

/// A request to a target's restore thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    pub caller: u32,
    pub op: Op,
}

/// The operations a restore thread carries out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Op {
    Lock {
        timeout_ms: u32,
    },
    Checkpoint,
    Restore {
        pairs: Vec<(GpuUuidText, GpuUuidText)>,
    },
    Unlock,
    /// Fault injection: enter CU_PROCESS_STATE_FAILED.
    Fail,
    /// A checkpoint with custom storage (CUDA 13.4): LOCKED -> CHECKPOINTING, the memory left
    /// where it is for the caller to copy. `caller` names the caller's liveness file (relative
    /// to the world): the caller holds a `flock` on it while it lives.
    CustomCheckpoint {
        caller: String,
    },
    /// A restore with custom storage: CHECKPOINTED (with custom storage) -> RESTORING, the
    /// memory claimed and mapped (empty) for the caller to fill.
    CustomRestore {
        pairs: Vec<(GpuUuidText, GpuUuidText)>,
        caller: String,
    },
    /// `cuCheckpointOperationComplete`: finishes the open custom-storage operation.
    Complete,
}

impl Op {
    /// The driver function that sends this request (`fail-fault` for a `fail` fault's).
    #[must_use]
    pub fn function(&self) -> &'static str {
        match self {
            Op::Lock { .. } => "cuCheckpointProcessLock",
            Op::Checkpoint => "cuCheckpointProcessCheckpoint",
            Op::Restore { .. } => "cuCheckpointProcessRestore",
            Op::Unlock => "cuCheckpointProcessUnlock",
            Op::Fail => "fail-fault",
            Op::CustomCheckpoint { .. } => "cuCheckpointProcessCheckpoint",
            Op::CustomRestore { .. } => "cuCheckpointProcessRestore",
            Op::Complete => "cuCheckpointOperationComplete",
        }
    }
}

/// A restore thread's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub id: u64,
    pub result: u32,
}

/// The API gate, lock-free: workload threads are stopped by CRIU at arbitrary points, and the
/// restore thread must never wait for a lock one of them holds. Waiters poll (they only wait
/// while the process is locked or checkpointed).
struct Gate {
    /// `CUprocessState` value.
    state: AtomicU32,
    /// A lock is waiting for the calls in flight: no new call may enter.
    locking: AtomicBool,
    /// Workload calls inside the gate.
    active: AtomicU32,
}

impl Gate {
    fn state(&self) -> CUprocessState {
        CUprocessState(self.state.load(SeqCst))
    }
}

/// How long a waiter on the gate sleeps between looks.
const GATE_POLL: Duration = Duration::from_micros(200);

/// How often a transfer recomputes its rate (from the transfers it finds in the world).
const TICK: Duration = Duration::from_millis(10);

/// How often a transfer publishes its progress (besides when it starts and ends).
const PUBLISH: Duration = Duration::from_millis(50);

/// A transfer shorter than this (wall-clock, alone) just sleeps its time without publishing its
/// parts (the 16–64 KiB allocations of most tests take microseconds).
const INSTANT: Duration = Duration::from_millis(2);

struct SavedAlloc {
    alloc: Allocation,
    data: Vec<u8>,
}

/// The open custom-storage operation of a process (CUDA 13.4), kept by its restore thread.
#[derive(Debug, Clone)]
struct OpenOp {
    /// A restore (else a checkpoint).
    restore: bool,
    /// The caller's liveness file, relative to the world.
    caller: String,
    /// A restore's GPU map (old -> new).
    map: Vec<(GpuUuid, GpuUuid)>,
}

/// Directory of the world where custom-storage callers keep their liveness files.
pub const CALLERS_DIR: &str = "callers";

/// The runtime of a CUDA process.
pub struct Runtime {
    world: Arc<World>,
    /// The process's world id.
    id: u64,
    /// The pid namespace the process last announced itself in (a CRIU restore into a new pid
    /// namespace changes it; the restore thread then re-announces the process).
    announced_ns: AtomicU64,
    gate: Gate,
    /// The collective the process is a member of ([`COLLECTIVE_ENV`]).
    collective: Option<crate::world::state::Collective>,
    saved: Mutex<Vec<SavedAlloc>>,
    gpu_handle: Mutex<Option<OwnedFd>>,
    restore_tid: OnceLock<i32>,
    /// The id of the request the restore thread is carrying out.
    request: AtomicU64,
    /// The mailbox's doorbell; `None`: the restore thread polls.
    bell: OnceLock<crate::ffi::sys::Bell>,
    /// The world as the restore thread last read it, with its config's modification time.
    current: Mutex<(Arc<World>, Option<std::time::SystemTime>)>,
    /// The world's entry as it was when this process was checkpointed: a process restored from
    /// the same images again (after the world forgot it) announces itself with it.
    checkpoint_entry: Mutex<Option<crate::world::state::ProcessEntry>>,
    /// The open custom-storage operation, if any (only the restore thread touches it).
    open_op: Mutex<Option<OpenOp>>,
    /// Checkpointed with custom storage: restores only with custom storage.
    custom: AtomicBool,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

static RUNTIME: OnceLock<Arc<Runtime>> = OnceLock::new();

/// The process's runtime, if it became a CUDA process.
pub fn runtime() -> Option<&'static Arc<Runtime>> {
    RUNTIME.get()
}

/// Environment variable of a target: `NAME:SIZE` makes the process a member of the collective
/// NAME of SIZE members (`mock-cuda-app --collective`), as the ranks of an NCCL communicator
/// are: its work in flight needs every member, so a lock of it completes only once every
/// member has a lock requested (in progress or done); until then it waits, up to its
/// `timeoutMs` (then `CUDA_ERROR_NOT_READY`), like a rank whose all-reduce waits for peers
/// that are frozen or not being locked.
pub const COLLECTIVE_ENV: &str = "MOCK_CUDA_COLLECTIVE";

/// How often a lock of a collective's member looks whether every member has a lock requested.
const COLLECTIVE_POLL: Duration = Duration::from_millis(10);

/// How long registration waits for the new restore thread to report its thread id.
const RESTORE_THREAD_START: Duration = Duration::from_secs(30);

/// Makes the calling process a CUDA process (idempotent): registers it in the world with its
/// device table, starts the restore thread and takes the GPU handle.
pub fn ensure_registered(
    world: &Arc<World>,
    devices: &[GpuUuid],
) -> Result<&'static Arc<Runtime>, CUresult> {
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    static INIT: Mutex<()> = Mutex::new(());
    let _g = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let collective = match std::env::var(COLLECTIVE_ENV) {
        Err(_) => None,
        Ok(v) => Some(crate::world::state::Collective::parse(&v).map_err(|why| {
            let what = format!("{COLLECTIVE_ENV}: {why}");
            eprintln!("mock libcuda: {what}");
            world.log_error(&what);
            CUresult::ERROR_INVALID_VALUE
        })?),
    };
    // No stand-in GPU handle, no CUDA process: a mock process without it would let a dump
    // without the plugin pass (CRIU refuses only the handle), a false pass for any test.
    let gpu_handle = crate::ffi::sys::open_gpu_handle().map_err(|why| {
        let what = format!(
            "cannot open the stand-in GPU handle ({why}): a seccomp profile (a container \
             runtime's default) blocks both; allow userfaultfd or io_uring_setup, or set \
             MOCK_CUDA_NO_GPU_HANDLE=1 to run without it (a dump is then not refused)"
        );
        eprintln!("mock libcuda: {what}");
        world.log_error(&what);
        CUresult::ERROR_OPERATING_SYSTEM
    })?;
    let me = own_identity();
    let id = world
        .update_own(crate::world::state::StateFile::new_id)
        .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?;
    let rt = Arc::new(Runtime {
        world: Arc::clone(world),
        id,
        announced_ns: AtomicU64::new(me.ns),
        gate: Gate {
            state: AtomicU32::new(CUprocessState::RUNNING.0),
            locking: AtomicBool::new(false),
            active: AtomicU32::new(0),
        },
        collective: collective.clone(),
        saved: Mutex::new(Vec::new()),
        gpu_handle: Mutex::new(gpu_handle),
        restore_tid: OnceLock::new(),
        request: AtomicU64::new(0),
        bell: OnceLock::new(),
        checkpoint_entry: Mutex::new(None),
        open_op: Mutex::new(None),
        custom: AtomicBool::new(false),
        current: Mutex::new((
            Arc::clone(world),
            std::fs::metadata(world.dir().join("world.toml"))
                .and_then(|m| m.modified())
                .ok(),
        )),
    });
    let mailbox = world.mailbox_dir(id);
    let _ = std::fs::remove_dir_all(&mailbox);
    std::fs::create_dir_all(&mailbox).map_err(|e| {
        world.log_error(&format!("creating mailbox {}: {e}", mailbox.display()));
        CUresult::ERROR_OPERATING_SYSTEM
    })?;
    if std::env::var(MAILBOX_ENV).as_deref() != Ok("poll") {
        // Without a doorbell (it could not be mapped) callers find no bell file and poll.
        if let Ok(bell) = crate::ffi::sys::Bell::map(&mailbox.join(BELL_FILE), true) {
            let _ = rt.bell.set(bell);
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let thread_rt = Arc::clone(&rt);
    std::thread::Builder::new()
        .name(crate::world::pidns::restore_thread_name(id))
        .spawn(move || {
            let _ = tx.send(crate::ffi::sys::gettid());
            thread_rt.restore_thread_loop();
        })
        .map_err(|e| {
            world.log_error(&format!("starting the restore thread: {e}"));
            CUresult::ERROR_OPERATING_SYSTEM
        })?;
    // A thread starts in microseconds, but not on a loaded 2-core runner with 32 tasks
    // registering at once: the bound is for a thread that never runs.
    let tid = rx.recv_timeout(RESTORE_THREAD_START).map_err(|_| {
        world.log_error(&format!(
            "the restore thread did not start within {} s",
            RESTORE_THREAD_START.as_secs()
        ));
        CUresult::ERROR_OPERATING_SYSTEM
    })?;
    let _ = rt.restore_tid.set(tid);
    let devices: Vec<GpuUuidText> = devices.iter().copied().map(GpuUuidText).collect();
    let host_pid = host_pid_hint(world);
    let entry = crate::world::state::ProcessEntry {
        devices,
        collective,
        ..crate::world::state::ProcessEntry::new(
            host_pid,
            me.ns,
            me.pid,
            CUprocessState::RUNNING.0,
            tid,
        )
    };
    // A process of the world whose identity this one has taken (a pid reused) is dead: its
    // entry goes, with its device memory, unless it is checkpointed (its images may be
    // restored). `driver::resolve` finds a process it knows as it is by its own entry alone,
    // so it would not see such an entry.
    let gone = world
        .update(|st| {
            let dead: Vec<u64> = st
                .processes
                .iter()
                .filter(|(other, e)| {
                    **other != id
                        && me.ns != 0
                        && e.identity() == me
                        && e.state() != CUprocessState::CHECKPOINTED
                })
                .map(|(other, _)| *other)
                .collect();
            let gone: Vec<(u64, crate::world::state::ProcessEntry)> = dead
                .into_iter()
                .filter_map(|other| st.processes.remove(&other).map(|e| (other, e)))
                .collect();
            st.processes.insert(id, entry.clone());
            gone
        })
        .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?;
    for (other, e) in gone {
        for a in &e.allocations {
            let _ = std::fs::remove_file(world.devmem_path(other, a.id));
        }
    }
    let _ = RUNTIME.set(rt);
    Ok(RUNTIME.get().expect("just set"))
}

/// The calling process's identity (its pid namespace is 0 when `/proc` cannot tell it).
pub(crate) fn own_identity() -> NsIdentity {
    pidns::own_identity().unwrap_or(NsIdentity {
        ns: 0,
        pid: std::process::id() as i32,
    })
}

/// The calling process's host pid, when it can tell: its pid in the world's host pid
/// namespace as its `/proc` shows it (the first `NSpid:` field when that `/proc` is the host's,
/// `getpid()` in the host's namespace itself); 0 inside a pid namespace with a `/proc` of its
/// own, where a process cannot learn its host pid (the world learns it from the first caller
/// that finds the process from the host).
#[must_use]
pub fn host_pid_hint(world: &World) -> i32 {
    if world.in_host_ns() {
        return std::process::id() as i32;
    }
    if world.host_view() {
        if let Some(first) = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| pidns::parse_nspid(&s))
            .and_then(|f| f.first().copied())
        {
            return first;
        }
    }
    0
}

/// Starts the driver's internal threads (`[driver] internal_threads` of the world) in the
/// calling process, once: idle threads named `cuda-EvtHandlr` that sleep for ever, as a real
/// driver starts at `cuInit` and at the first context. They make the caller multi-threaded,
/// which is what keeps a CRIU that loaded the driver from entering a mount namespace
/// (`setns(CLONE_NEWNS)` is `EINVAL` while another thread shares the caller's filesystem
/// attributes).
pub fn start_internal_threads(world: &World) {
    static STARTED: std::sync::Once = std::sync::Once::new();
    let n = world.config().driver.internal_threads;
    if n == 0 {
        return;
    }
    STARTED.call_once(|| {
        for _ in 0..n {
            let _ = std::thread::Builder::new()
                .name(INTERNAL_THREAD_NAME.to_owned())
                .spawn(|| loop {
                    // A futex wait that nothing wakes (a spurious wake-up parks again).
                    std::thread::park();
                });
        }
    });
}

/// The name of the driver's internal threads.
pub const INTERNAL_THREAD_NAME: &str = "cuda-EvtHandlr";

/// Token for a workload call inside the API gate.
#[derive(Debug)]
pub struct Entered<'a>(&'a Runtime);

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.0.gate.active.fetch_sub(1, SeqCst);
    }
}

impl Runtime {
    /// Takes the GPU handle again after a restore (the process had it when it became a CUDA
    /// process, so only a changed kernel or seccomp filter refuses it now: logged).
    fn reopen_gpu_handle(&self) {
        let handle = crate::ffi::sys::open_gpu_handle().unwrap_or_else(|why| {
            self.world.log_error(&format!(
                "reopening the stand-in GPU handle after a restore: {why}"
            ));
            None
        });
        *self.gpu_handle.lock().unwrap_or_else(|p| p.into_inner()) = handle;
    }

    /// Enters the API gate for a workload call: blocks while the process is locked or
    /// checkpointed (as the driver blocks CUDA calls of a locked process); fails in FAILED.
    pub fn enter(&self) -> Result<Entered<'_>, CUresult> {
        let g = &self.gate;
        let open = || g.state() == CUprocessState::RUNNING && !g.locking.load(SeqCst);
        loop {
            if g.state() == CUprocessState::FAILED {
                return Err(CUresult::ERROR_ILLEGAL_STATE);
            }
            if open() {
                // Announce, then check again: a lock that started in between sees us in
                // `active` and waits, or we see its `locking` and back off (SeqCst both sides).
                g.active.fetch_add(1, SeqCst);
                if open() {
                    return Ok(Entered(self));
                }
                g.active.fetch_sub(1, SeqCst);
            }
            std::thread::sleep(GATE_POLL);
        }
    }

    /// The world as it is now (re-read when its config changed, e.g. restored on "another
    /// host"), or the one the process registered in.
    ///
    /// Only the restore thread calls this, and it shares no lock with workload threads (which
    /// CRIU may freeze holding one, see the module documentation): it re-reads the config
    /// itself, for the world it registered in.
    fn world(&self) -> Arc<World> {
        let mut w = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let stamp = std::fs::metadata(w.0.dir().join("world.toml"))
            .and_then(|m| m.modified())
            .ok();
        if stamp != w.1 {
            if let Ok(fresh) = World::open(w.0.dir()) {
                *w = (Arc::new(fresh), stamp);
            }
        }
        Arc::clone(&w.0)
    }

    /// The process's world id.
    #[must_use]
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The restore thread's TID.
    #[must_use]
    pub fn restore_tid(&self) -> i32 {
        self.restore_tid.get().copied().unwrap_or(0)
    }

    fn restore_thread_loop(&self) {
        let dir = self.world.mailbox_dir(self.id);
        let req_path = dir.join("req.json");
        let bell = self.bell.get();
        loop {
            // Nothing but the mailbox is touched while idle: this thread is stopped (by CRIU,
            // by SIGSTOP) at arbitrary points, and must never be stopped holding the world's
            // lock or a file lock CRIU would refuse to dump. The doorbell is read before the
            // mailbox, so a request written after the look rings a changed value and the wait
            // returns at once: no wake-up is lost.
            let seen = bell.map(|b| b.word(BELL_REQUEST).load(SeqCst));
            // Restored into a new pid namespace: the world learns the identity it has now.
            self.follow_namespace();
            let Some(req) = take_request(&req_path) else {
                // An open custom-storage operation whose caller died is aborted.
                self.watch_caller();
                match (bell, seen) {
                    (Some(b), Some(seen)) => b.wait(BELL_REQUEST, seen, IDLE_WAIT),
                    _ => std::thread::sleep(POLL),
                }
                continue;
            };
            // A process restored from images may not be known as checkpointed yet.
            self.announce();
            self.request.store(req.id, SeqCst);
            // A checkpoint or restore is registered as a transfer from the moment it is taken
            // until it is answered, so a caller past its request timeout sees it being carried
            // out at every point (the transfer fills its parts in; see transfers.rs).
            let direction = match req.op {
                Op::Checkpoint => Some(Direction::Checkpoint),
                Op::Restore { .. } => Some(Direction::Restore),
                _ => None,
            };
            let world = self.world();
            if let Some(direction) = direction {
                let _ = world.write_progress(&Progress {
                    id: self.id,
                    pid: host_pid_hint(&world),
                    identity: own_identity(),
                    request: req.id,
                    direction,
                    gpus: Vec::new(),
                });
            }
            let result = self.execute(&req.op);
            let resp = Response {
                id: req.id,
                result: result.0,
            };
            let text = serde_json::to_vec(&resp).expect("response serialises");
            let _ = crate::world::write_atomic(&dir.join("resp.json"), &text);
            if let Some(b) = bell {
                b.ring(BELL_RESPONSE);
            }
            if direction.is_some() {
                world.remove_progress(self.id);
            }
        }
    }

    /// A checkpointed process the world does not know as checkpointed (restored from images
    /// whose first restore has since died) registers again, as the driver learns of a restored
    /// process from the process itself. Runs on the restore thread, like every state change,
    /// so it never races one.
    fn announce(&self) {
        let checkpointed = self.gate.state() == CUprocessState::CHECKPOINTED;
        if !checkpointed {
            return;
        }
        let Some(mut entry) = self
            .checkpoint_entry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        else {
            return;
        };
        entry.restore_tid = self.restore_tid();
        let world = self.world();
        let id = self.id;
        let me = own_identity();
        (entry.pid_ns, entry.nspid) = (me.ns, me.pid);
        entry.pid = host_pid_hint(&world);
        let _ = std::fs::create_dir_all(world.mailbox_dir(id));
        // The world may still hold the dead incarnation of a process restored twice from the
        // same images (RUNNING or LOCKED, or RESTORING when its custom-storage restore died
        // with it): what this process holds wins. FAILED is kept.
        let _ = world.update_process(id, |slot| {
            let stale = slot.as_ref().is_none_or(|e| {
                matches!(
                    e.state(),
                    CUprocessState::RUNNING
                        | CUprocessState::LOCKED
                        | CUprocessState::RESTORING
                        | CUprocessState::CHECKPOINTING
                )
            });
            if stale {
                *slot = Some(entry.clone());
            }
        });
    }

    /// Re-announces the process when its pid namespace changed since it last announced itself
    /// (CRIU restored it into a new one): the world's entry takes the identity it has now, and
    /// its host pid when it can tell it (else the entry's host pid is unknown until a caller
    /// that sees the host's pids finds the process). Costs one `readlink` when nothing changed.
    fn follow_namespace(&self) {
        let Some(ns) = pidns::own_pid_ns() else {
            return;
        };
        if self.announced_ns.load(SeqCst) == ns {
            return;
        }
        let world = self.world();
        let me = own_identity();
        let host_pid = host_pid_hint(&world);
        let tid = crate::ffi::sys::gettid();
        let id = self.id;
        let updated = world.update_entry(id, |e| {
            (e.pid_ns, e.nspid, e.pid) = (me.ns, me.pid, host_pid);
            e.restore_tid = tid;
        });
        if updated.is_ok() {
            self.announced_ns.store(ns, SeqCst);
        }
    }

    /// Records in the world that a lock of this process is (or no longer is) in progress, for
    /// the members of its collective to see.
    fn mark_locking(&self, on: bool) {
        if self.collective.is_none() {
            return;
        }
        let id = self.id;
        let _ = self.world().update_entry(id, |e| {
            e.locking = on;
        });
    }

    /// Whether every member of `c` has a lock requested (the world as it is now; a state
    /// that cannot be read counts as not yet).
    fn collective_gathered(&self, c: &crate::world::state::Collective) -> bool {
        self.world()
            .read_state()
            .is_ok_and(|st| st.collective_gathered(c))
    }

    fn set_state(&self, state: CUprocessState) -> CUresult {
        self.gate.state.store(state.0, SeqCst);
        let id = self.id;
        let r = self.world().update_entry(id, |e| {
            e.state = state.0;
        });
        if r.is_ok() {
            CUresult::SUCCESS
        } else {
            CUresult::ERROR_OPERATING_SYSTEM
        }
    }

    /// Carries one operation out, inside the target, on the restore thread.
    fn execute(&self, op: &Op) -> CUresult {
        let g = &self.gate;
        match op {
            Op::Fail => self.set_state(CUprocessState::FAILED),
            Op::Lock { timeout_ms } => {
                if g.state() != CUprocessState::RUNNING || g.locking.load(SeqCst) {
                    return CUresult::ERROR_ILLEGAL_STATE;
                }
                g.locking.store(true, SeqCst);
                let deadline = (*timeout_ms > 0)
                    .then(|| Instant::now() + Duration::from_millis(u64::from(*timeout_ms)));
                let give_up = || {
                    g.locking.store(false, SeqCst);
                    self.mark_locking(false);
                    CUresult::ERROR_NOT_READY
                };
                while g.active.load(SeqCst) > 0 {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return give_up();
                    }
                    std::thread::sleep(GATE_POLL);
                }
                if let Some(c) = &self.collective {
                    // The member's work in flight needs every member: it finishes (and the
                    // lock completes) once each of them has a lock requested.
                    self.mark_locking(true);
                    while !self.collective_gathered(c) {
                        if deadline.is_some_and(|d| Instant::now() >= d) {
                            return give_up();
                        }
                        std::thread::sleep(COLLECTIVE_POLL);
                    }
                }
                let r = self.set_state(CUprocessState::LOCKED);
                if self.collective.is_some() {
                    self.mark_locking(false);
                }
                g.locking.store(false, SeqCst);
                r
            }
            Op::Unlock => {
                if g.state() != CUprocessState::LOCKED {
                    return CUresult::ERROR_ILLEGAL_STATE;
                }
                self.set_state(CUprocessState::RUNNING)
            }
            Op::Checkpoint => {
                if g.state() != CUprocessState::LOCKED {
                    return CUresult::ERROR_ILLEGAL_STATE;
                }
                match self.checkpoint_memory() {
                    Ok(()) => self.set_state(CUprocessState::CHECKPOINTED),
                    Err(code) => code,
                }
            }
            Op::Restore { pairs } => {
                if g.state() != CUprocessState::CHECKPOINTED {
                    return CUresult::ERROR_ILLEGAL_STATE;
                }
                if self.custom.load(SeqCst) {
                    // Checkpointed with custom storage: nothing to restore from host memory.
                    return CUresult::ERROR_INVALID_VALUE;
                }
                let pairs: Vec<(GpuUuid, GpuUuid)> =
                    pairs.iter().map(|(a, b)| (a.0, b.0)).collect();
                match self.restore_memory(&pairs) {
                    Ok(()) => self.set_state(CUprocessState::LOCKED),
                    Err(code) => code,
                }
            }
            Op::CustomCheckpoint { caller } => {
                if g.state() != CUprocessState::LOCKED {
                    return CUresult::ERROR_ILLEGAL_STATE;
                }
                if let Err(code) = refuse_mig(&self.world(), self.id) {
                    return code;
                }
                *self.open_op.lock().unwrap_or_else(|p| p.into_inner()) = Some(OpenOp {
                    restore: false,
                    caller: caller.clone(),
                    map: Vec::new(),
                });
                self.set_state_custom(CUprocessState::CHECKPOINTING, true)
            }
            Op::CustomRestore { pairs, caller } => {
                if g.state() != CUprocessState::CHECKPOINTED {
                    return CUresult::ERROR_ILLEGAL_STATE;
                }
                if !self.custom.load(SeqCst) {
                    // Checkpointed to host memory: restores only from there.
                    return CUresult::ERROR_INVALID_VALUE;
                }
                let pairs: Vec<(GpuUuid, GpuUuid)> =
                    pairs.iter().map(|(a, b)| (a.0, b.0)).collect();
                match self.open_custom_restore(&pairs) {
                    Ok(map) => {
                        *self.open_op.lock().unwrap_or_else(|p| p.into_inner()) = Some(OpenOp {
                            restore: true,
                            caller: caller.clone(),
                            map,
                        });
                        self.set_state_custom(CUprocessState::RESTORING, true)
                    }
                    Err(code) => code,
                }
            }
            Op::Complete => {
                let open = self
                    .open_op
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                let Some(open) = open else {
                    return CUresult::ERROR_INVALID_VALUE;
                };
                let r = if open.restore {
                    self.finish_custom_restore(&open.map)
                } else {
                    self.finish_custom_checkpoint()
                };
                match r {
                    Ok(()) => {
                        *self.open_op.lock().unwrap_or_else(|p| p.into_inner()) = None;
                        if open.restore {
                            self.custom.store(false, SeqCst);
                            self.set_state_custom(CUprocessState::LOCKED, false)
                        } else {
                            self.custom.store(true, SeqCst);
                            self.set_state_custom(CUprocessState::CHECKPOINTED, true)
                        }
                    }
                    Err(code) => code,
                }
            }
        }
    }

    /// Sets the state and the entry's custom-storage mark at once.
    fn set_state_custom(&self, state: CUprocessState, custom: bool) -> CUresult {
        self.gate.state.store(state.0, SeqCst);
        let id = self.id;
        let caller = matches!(
            state,
            CUprocessState::CHECKPOINTING | CUprocessState::RESTORING
        )
        .then(|| {
            self.open_op
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map(|o| o.caller.clone())
        })
        .flatten();
        let r = self.world().update_entry(id, |e| {
            e.state = state.0;
            e.custom_storage = custom;
            e.open_caller = caller.clone();
        });
        if r.is_ok() {
            CUresult::SUCCESS
        } else {
            CUresult::ERROR_OPERATING_SYSTEM
        }
    }

    /// Aborts the open custom-storage operation when its caller is gone (its liveness file is
    /// no longer locked): a checkpoint returns to LOCKED with the memory untouched, a restore
    /// to CHECKPOINTED with its claim released (and the memory it mapped dropped).
    fn watch_caller(&self) {
        let open = self
            .open_op
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(open) = open else {
            return;
        };
        let world = self.world();
        let path = world.dir().join(&open.caller);
        let gone =
            !path.exists() || crate::ffi::sys::FileLock::acquire(&path, Instant::now()).is_ok();
        if !gone {
            return;
        }
        let id = self.id;
        if open.restore {
            let allocations = world
                .read_process(id)
                .ok()
                .flatten()
                .map(|e| e.allocations.clone())
                .unwrap_or_default();
            for a in &allocations {
                let _ = std::fs::remove_file(world.devmem_path(id, a.id));
            }
            let _ = world.update_entry(id, |e| {
                e.reserved.clear();
            });
            let _ = self.set_state_custom(CUprocessState::CHECKPOINTED, true);
        } else {
            let _ = self.set_state_custom(CUprocessState::LOCKED, false);
        }
        *self.open_op.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let from = if open.restore {
            "RESTORING -> CHECKPOINTED"
        } else {
            "CHECKPOINTING -> LOCKED"
        };
        world.trace(
            "custom-storage-abort",
            &format!("caller={}, {from}", open.caller),
            &CUresult::SUCCESS.to_string(),
        );
    }

    /// The GPUs a checkpoint of this process holds state of: every GPU it has a context on,
    /// and every GPU it has memory on, with the bytes of its allocations there.
    fn checkpointed_gpus(
        world: &World,
        id: u64,
        allocations: &[Allocation],
    ) -> Vec<CheckpointedGpu> {
        let mut per_gpu: Vec<CheckpointedGpu> = Vec::new();
        let contexts = world
            .read_process(id)
            .ok()
            .flatten()
            .map(|e| e.contexts.clone())
            .unwrap_or_default();
        for d in &contexts {
            if !per_gpu.iter().any(|c| c.uuid == *d) {
                per_gpu.push(CheckpointedGpu {
                    uuid: *d,
                    chip: chip_of(world, d.0).unwrap_or_default(),
                    bytes: 0,
                });
            }
        }
        for a in allocations {
            if let Some(c) = per_gpu.iter_mut().find(|c| c.uuid == a.gpu) {
                c.bytes += a.size;
            } else {
                per_gpu.push(CheckpointedGpu {
                    uuid: a.gpu,
                    chip: chip_of(world, a.gpu.0).unwrap_or_default(),
                    bytes: a.size,
                });
            }
        }
        per_gpu
    }

    /// Finishes a custom-storage checkpoint: the caller has copied the memory; the process
    /// releases it and its GPU handle, and holds nothing staged.
    fn finish_custom_checkpoint(&self) -> Result<(), CUresult> {
        let world = &*self.world();
        let id = self.id;
        let allocations = world
            .read_process(id)
            .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?
            .map(|e| e.allocations.clone())
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let per_gpu = Self::checkpointed_gpus(world, id, &allocations);
        world
            .update_entry(id, |e| {
                e.checkpointed = per_gpu.clone();
                e.custom_storage = true;
            })
            .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?;
        for a in &allocations {
            let _ = std::fs::remove_file(world.devmem_path(id, a.id));
        }
        let mut entry = world.read_process(id).ok().flatten();
        if let Some(e) = entry.as_mut() {
            e.state = CUprocessState::CHECKPOINTED.0;
        }
        *self
            .checkpoint_entry
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = entry;
        self.saved.lock().unwrap_or_else(|p| p.into_inner()).clear();
        *self.gpu_handle.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(())
    }

    /// Opens a custom-storage restore: checks the GPU map, claims the memory on the new GPUs
    /// (`CUDA_ERROR_OUT_OF_MEMORY` when it does not fit, nothing changed) and maps every
    /// allocation, empty, for the caller to fill. Returns the map (old -> new).
    fn open_custom_restore(
        &self,
        pairs: &[(GpuUuid, GpuUuid)],
    ) -> Result<Vec<(GpuUuid, GpuUuid)>, CUresult> {
        let world = &*self.world();
        let id = self.id;
        let entry = world
            .read_process(id)
            .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let map = resolve_restore_map(world, &entry.checkpointed, pairs)?;
        self.claim(world, &entry, &map)?;
        for a in &entry.allocations {
            let path = world.devmem_path(id, a.id);
            let made = if a.sampled {
                std::fs::write(&path, crate::devmem::Sparse::new(a.size).encode())
            } else {
                std::fs::File::create(&path).and_then(|f| f.set_len(a.size))
            };
            if made.is_err() {
                for b in &entry.allocations {
                    let _ = std::fs::remove_file(world.devmem_path(id, b.id));
                }
                let _ = world.update_entry(id, |e| {
                    e.reserved.clear();
                });
                return Err(CUresult::ERROR_OPERATING_SYSTEM);
            }
        }
        Ok(map)
    }

    /// Claims the GPU memory a restore of `entry` needs under `map`, atomically with the check
    /// that it fits next to what is resident and what other restores claimed
    /// (`CUDA_ERROR_OUT_OF_MEMORY` when it does not, nothing claimed). Returns the claim.
    fn claim(
        &self,
        world: &World,
        entry: &crate::world::state::ProcessEntry,
        map: &[(GpuUuid, GpuUuid)],
    ) -> Result<Vec<CheckpointedGpu>, CUresult> {
        let id = self.id;
        let target = |u: GpuUuid| map.iter().find(|(o, _)| *o == u).map_or(u, |(_, n)| *n);
        let need: Vec<CheckpointedGpu> = world
            .config()
            .gpus
            .iter()
            .map(|g| CheckpointedGpu {
                uuid: g.uuid,
                chip: g.chip.clone(),
                bytes: entry
                    .checkpointed
                    .iter()
                    .filter(|c| target(c.uuid.0) == g.uuid.0)
                    .map(|c| c.bytes)
                    .sum(),
            })
            .filter(|c| c.bytes > 0)
            .collect();
        world
            .update(|st| {
                st.release_dead_claims(|id, e| world.locate(&e.whereabouts(id)) == Presence::Gone);
                for n in &need {
                    let cap = world
                        .config()
                        .gpu(n.uuid.0)
                        .map_or(0, |g| g.capacity_bytes());
                    if st.resident_bytes(n.uuid.0, Some(id)) + n.bytes > cap {
                        return Err(CUresult::ERROR_OUT_OF_MEMORY);
                    }
                }
                if let Some(e) = st.processes.get_mut(&id) {
                    e.reserved = need.clone();
                }
                Ok(())
            })
            .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)??;
        Ok(need)
    }

    /// Finishes a custom-storage restore: the caller has filled the memory; the process takes
    /// it on its new GPUs and re-acquires its GPU handle.
    fn finish_custom_restore(&self, map: &[(GpuUuid, GpuUuid)]) -> Result<(), CUresult> {
        let world = &*self.world();
        let id = self.id;
        let target = |u: GpuUuid| map.iter().find(|(o, _)| *o == u).map_or(u, |(_, n)| *n);
        world
            .update_entry(id, |e| {
                for a in &mut e.allocations {
                    a.gpu = GpuUuidText(target(a.gpu.0));
                }
                for d in e.devices.iter_mut().chain(e.contexts.iter_mut()) {
                    *d = GpuUuidText(target(d.0));
                }
                e.checkpointed.clear();
                e.reserved.clear();
                e.custom_storage = false;
            })
            .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?;
        self.reopen_gpu_handle();
        Ok(())
    }

    /// Moves every allocation from the world into this process's memory.
    fn checkpoint_memory(&self) -> Result<(), CUresult> {
        let world = &*self.world();
        let id = self.id;
        refuse_mig(world, id)?;
        let allocations = world
            .read_process(id)
            .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?
            .map(|e| e.allocations.clone())
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let mut saved = Vec::with_capacity(allocations.len());
        for a in &allocations {
            let path = world.devmem_path(id, a.id);
            let data = std::fs::read(&path).map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?;
            saved.push(SavedAlloc {
                alloc: a.clone(),
                data,
            });
        }
        // Every GPU the process has a context on is part of its checkpoint, used or not.
        let per_gpu = Self::checkpointed_gpus(world, id, &allocations);
        // The copy to host memory takes the time its bytes need (and is OOM-killed when they
        // do not fit in the host's memory).
        let parts: Vec<(GpuUuid, u64)> = per_gpu.iter().map(|c| (c.uuid.0, c.bytes)).collect();
        self.transfer(world, Direction::Checkpoint, &parts);
        world
            .update_entry(id, |e| {
                e.checkpointed = per_gpu.clone();
            })
            .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?;
        for a in &allocations {
            let _ = std::fs::remove_file(world.devmem_path(id, a.id));
        }
        let mut entry = world.read_process(id).ok().flatten();
        if let Some(e) = entry.as_mut() {
            e.state = CUprocessState::CHECKPOINTED.0;
        }
        *self
            .checkpoint_entry
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = entry;
        *self.saved.lock().unwrap_or_else(|p| p.into_inner()) = saved;
        *self.gpu_handle.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(())
    }

    /// Writes the saved allocations back onto the (possibly remapped) GPUs.
    fn restore_memory(&self, pairs: &[(GpuUuid, GpuUuid)]) -> Result<(), CUresult> {
        let world = &*self.world();
        let id = self.id;
        let entry = world
            .read_process(id)
            .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let map = resolve_restore_map(world, &entry.checkpointed, pairs)?;
        let target = |u: GpuUuid| map.iter().find(|(o, _)| *o == u).map_or(u, |(_, n)| *n);
        // Claim the memory first: the driver allocates before it copies.
        let need = self.claim(world, &entry, &map)?;
        let release = || {
            let _ = world.update_entry(id, |e| {
                e.reserved.clear();
            });
        };
        let parts: Vec<(GpuUuid, u64)> = need.iter().map(|n| (n.uuid.0, n.bytes)).collect();
        self.transfer(world, Direction::Restore, &parts);
        let saved = std::mem::take(&mut *self.saved.lock().unwrap_or_else(|p| p.into_inner()));
        for s in &saved {
            let path = world.devmem_path(id, s.alloc.id);
            if std::fs::write(&path, &s.data).is_err() {
                *self.saved.lock().unwrap_or_else(|p| p.into_inner()) = saved;
                release();
                return Err(CUresult::ERROR_OPERATING_SYSTEM);
            }
        }
        let committed = world.update_entry(id, |e| {
            for a in &mut e.allocations {
                a.gpu = GpuUuidText(target(a.gpu.0));
            }
            for d in e.devices.iter_mut().chain(e.contexts.iter_mut()) {
                *d = GpuUuidText(target(d.0));
            }
            e.checkpointed.clear();
            e.reserved.clear();
        });
        if committed.is_err() {
            release();
            return Err(CUresult::ERROR_OPERATING_SYSTEM);
        }
        self.reopen_gpu_handle();
        Ok(())
    }

    /// Takes the time moving `parts` (GPU, bytes) needs under the world's time model,
    /// publishing progress while it runs (module [`crate::world::transfers`]). A checkpoint
    /// whose staged bytes come to exceed the host's free memory ends the process as the
    /// kernel's OOM killer would (SIGKILL), at the moment they do.
    fn transfer(&self, world: &World, direction: Direction, parts: &[(GpuUuid, u64)]) {
        let parts: Vec<(GpuUuid, u64)> = parts.iter().copied().filter(|p| p.1 > 0).collect();
        if parts.is_empty() {
            return;
        }
        let cfg = world.config();
        let limits = Limits::of(&cfg.rates);
        let scale = cfg.rates.time_scale;
        let host_memory = match direction {
            Direction::Checkpoint => cfg.host.memory_bytes(),
            Direction::Restore | Direction::Copy => None,
        };
        let total: u64 = parts.iter().map(|p| p.1).sum();
        let alone = rates::duration(
            rates::simulate(std::slice::from_ref(&parts), &limits)[0],
            scale,
        );
        if alone < INSTANT {
            if let Some(mem) = host_memory {
                let room = mem.saturating_sub(self.staged_elsewhere(world, &[]));
                if total > room {
                    self.oom_kill(world, total, room);
                }
            }
            std::thread::sleep(alone);
            return;
        }
        let mut progress = Progress {
            id: self.id,
            pid: host_pid_hint(world),
            identity: own_identity(),
            request: self.request.load(SeqCst),
            direction,
            gpus: parts
                .iter()
                .map(|&(g, b)| GpuProgress {
                    uuid: GpuUuidText(g),
                    total: b,
                    moved: 0,
                })
                .collect(),
        };
        let mut moved: Vec<f64> = vec![0.0; parts.len()];
        let _ = world.write_progress(&progress);
        let mut last = Instant::now();
        let mut published = last;
        loop {
            let others: Vec<Progress> = world
                .transfers()
                .into_iter()
                .filter(|p| p.id != self.id)
                .collect();
            let mut all: Vec<Part<u64, GpuUuid>> = Vec::new();
            let mut bypass: Vec<bool> = Vec::new();
            for p in &others {
                for g in p.gpus.iter().filter(|g| g.active()) {
                    all.push(Part {
                        process: p.id,
                        gpu: g.uuid.0,
                    });
                    bypass.push(p.direction == Direction::Copy);
                }
            }
            let first_mine = all.len();
            let mine: Vec<usize> = (0..parts.len())
                .filter(|&k| progress.gpus[k].active())
                .collect();
            all.extend(mine.iter().map(|&k| Part {
                process: self.id,
                gpu: parts[k].0,
            }));
            bypass.resize(all.len(), false);
            let shares = rates::share_bypassing(&all, &bypass, &limits);
            let my_rates = &shares[first_mine..];
            // Modelled seconds until the next part finishes, or the staged bytes fill the host.
            let mut next = mine
                .iter()
                .zip(my_rates)
                .map(|(&k, r)| (parts[k].1 as f64 - moved[k]) / r)
                .fold(f64::INFINITY, f64::min);
            let room = host_memory.map(|m| m.saturating_sub(self.staged_elsewhere(world, &others)));
            if let Some(room) = room {
                let staged = progress.staged();
                if staged > room {
                    self.oom_kill(world, total, room);
                }
                if total > room {
                    next = next.min((room - staged) as f64 / my_rates.iter().sum::<f64>());
                }
            }
            std::thread::sleep(TICK.min(rates::duration(next, scale)));
            let now = Instant::now();
            let dt = now.duration_since(last).as_secs_f64() * scale;
            last = now;
            for (&k, r) in mine.iter().zip(my_rates) {
                let cap = parts[k].1 as f64;
                moved[k] = (moved[k] + r * dt).min(cap);
                // The last part of a byte counts as moved: no tick waits for a rounding error.
                progress.gpus[k].moved = if cap - moved[k] < 1.0 {
                    parts[k].1
                } else {
                    moved[k] as u64
                };
            }
            if let Some(room) = room {
                if progress.staged() > room {
                    self.oom_kill(world, total, room);
                }
            }
            if progress.gpus.iter().all(|g| !g.active()) {
                break;
            }
            if now.duration_since(published) >= PUBLISH {
                let _ = world.write_progress(&progress);
                published = now;
            }
        }
        // Done: the entry stays (with nothing left to move) until the request is answered.
        let _ = world.write_progress(&progress);
    }

    /// Host memory held by other processes' checkpoints: transfers in progress (`running`,
    /// read by the caller; empty: read here) and checkpointed processes that are alive (a
    /// dumped process that CRIU ended holds none; its image does).
    fn staged_elsewhere(&self, world: &World, running: &[Progress]) -> u64 {
        let fresh;
        let running = if running.is_empty() {
            fresh = world.transfers();
            &fresh[..]
        } else {
            running
        };
        let mut sum: u64 = running
            .iter()
            .filter(|p| p.id != self.id)
            .map(Progress::staged)
            .sum();
        if let Ok(st) = world.read_state() {
            for (id, e) in &st.processes {
                let transferring = running.iter().any(|p| p.id == *id);
                // A process the caller cannot see (in another pid namespace) counts as alive.
                if *id != self.id
                    && !transferring
                    && e.state() == CUprocessState::CHECKPOINTED
                    && !e.custom_storage
                    && world.locate(&e.whereabouts(*id)) != Presence::Gone
                {
                    sum += e.checkpointed.iter().map(|c| c.bytes).sum::<u64>();
                }
            }
        }
        sum
    }

    /// Ends the process as the kernel's OOM killer does: SIGKILL, nothing unwinds. The staged
    /// checkpoint was charged to this process's memory, so it is the one the kernel picks.
    fn oom_kill(&self, world: &World, need: u64, room: u64) -> ! {
        eprintln!(
            "mock-libcuda: Out of memory: Killed process {} (its checkpoint needs {need} bytes of host memory; {room} were free)",
            std::process::id()
        );
        world.remove_progress(self.id);
        crate::ffi::sys::crash(Some("SIGKILL"))
    }
}

/// The driver cannot checkpoint a process on a GPU in MIG mode (NVIDIA's cuda-checkpoint issue
/// #42: the checkpoint fails with "out of memory"): a LOCKED process with a context on such a GPU
/// stays LOCKED and its checkpoint returns `CUDA_ERROR_OUT_OF_MEMORY`, host-staged or with
/// custom storage alike. The model assumes the failure comes at the checkpoint, after a lock that
/// succeeded, and changes nothing.
fn refuse_mig(world: &World, id: u64) -> Result<(), CUresult> {
    let contexts = world
        .read_process(id)
        .map_err(|_| CUresult::ERROR_OPERATING_SYSTEM)?
        .map(|e| e.contexts.clone())
        .unwrap_or_default();
    let on_mig = contexts
        .iter()
        .any(|c| world.config().gpu(c.0).is_some_and(|g| g.mig));
    if on_mig {
        Err(CUresult::ERROR_OUT_OF_MEMORY)
    } else {
        Ok(())
    }
}

fn chip_of(world: &World, uuid: GpuUuid) -> Option<String> {
    world.config().gpu(uuid).map(|g| g.chip.clone())
}

/// Checks restore GPU pairs against what was checkpointed and what this host has, and returns
/// the old -> new map. Without pairs every checkpointed GPU must exist here (identity).
/// With pairs: every checkpointed GPU is covered, every new GPU exists, no endpoint repeats on
/// either side, and each pair joins GPUs of the same chip. Violations are
/// `CUDA_ERROR_INVALID_VALUE`, as the driver reports a bad map.
pub fn resolve_restore_map(
    world: &World,
    checkpointed: &[CheckpointedGpu],
    pairs: &[(GpuUuid, GpuUuid)],
) -> Result<Vec<(GpuUuid, GpuUuid)>, CUresult> {
    let host = &world.config().gpus;
    if pairs.is_empty() {
        for c in checkpointed {
            if !host.iter().any(|g| g.uuid == c.uuid) {
                return Err(CUresult::ERROR_INVALID_VALUE);
            }
        }
        return Ok(checkpointed.iter().map(|c| (c.uuid.0, c.uuid.0)).collect());
    }
    for (i, (old, new)) in pairs.iter().enumerate() {
        if pairs[..i].iter().any(|(o, n)| o == old || n == new) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let Some(new_gpu) = world.config().gpu(*new) else {
            return Err(CUresult::ERROR_INVALID_VALUE);
        };
        // A pair for a GPU this process holds no state of (callers pass one map for a whole
        // tree, or every visible GPU) only needs a valid target.
        if let Some(c) = checkpointed.iter().find(|c| c.uuid.0 == *old) {
            if c.chip != new_gpu.chip {
                return Err(CUresult::ERROR_INVALID_VALUE);
            }
        }
    }
    if checkpointed
        .iter()
        .any(|c| !pairs.iter().any(|(o, _)| *o == c.uuid.0))
    {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    Ok(pairs.to_vec())
}

/// Takes the pending request, if any, out of the mailbox (rename makes the hand-over atomic:
/// a caller that gives up renames it away first, and then the thread never sees it).
fn take_request(req_path: &Path) -> Option<Request> {
    let taken = req_path.with_extension("taken");
    std::fs::rename(req_path, &taken).ok()?;
    let text = std::fs::read(&taken).ok()?;
    let _ = std::fs::remove_file(&taken);
    serde_json::from_slice(&text).ok()
}
