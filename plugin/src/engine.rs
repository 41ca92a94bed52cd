//! The dump/restore lifecycle: what each CRIU hook does to each CUDA task, and how a failed or
//! `--leave-running` dump puts every task back.
//!
//! CRIU calls the device hooks once per process (never per thread), on its main thread:
//!
//! | Hook | Task state | What the engine does |
//! |---|---|---|
//! | PAUSE_DEVICES | running, not yet seized | find the restore thread (none: `NotMine`, i.e. `-ENOTSUP`); record the initial CUDA state; lock with the timeout unless already locked/checkpointed; on failure leave the task as found |
//! | CHECKPOINT_DEVICES | whole tree ptrace-stopped | resume only the restore thread, checkpoint, stop it again; write the task image; add the inventory entry once per dump |
//! | DUMP_FINISH(ret) (hook 16 where the host has it, else `exit(DUMP, ret)`) | still stopped | if the dump failed or the tasks stay alive: wait (at most one lock deadline) for a driver call abandoned on timeout to return (then stop waiting for it), put every task we changed back in its initial state, state-driven (query, then act), logging tasks that could not be recovered |
//! | RESUME_DEVICES_LATE | restored, still ptrace-stopped | resume the restore thread, restore (with the device map), unlock when the task was running at dump time, stop it again |
//!
//! Every result is `Ok(Outcome)` or an [`EngineError`] that names the hook, the pid and the
//! failing step; [`crate::error`] turns it into a negative errno.
//!
//! **Restore-time initial state.** A restore cannot ask the driver what the state was at dump
//! time, so CHECKPOINT_DEVICES records it (and the restore TID) in a per-task image
//! ([`crate::image`]). Without that image (older dumps, renumbered pids) the engine probes the
//! task and assumes it was RUNNING, as CRIU's C plugin does.
//!
//! **`--leave-stopped`.** Only a failed dump or `--leave-running` (CRIU's `TASK_ALIVE`) triggers
//! the rollback, like CRIU's C plugin: with `--leave-stopped` the tasks stay CHECKPOINTED.

use crate::agent::{AgentError, Guard};
use crate::backend::drive::{drive, DriveError, Driven};
use crate::backend::{
    op_deadline, Backend, BackendError, GpuPair, Job, LockLimits, Op, Pid, Tid, LOCK_ABANDON_GRACE,
};
use crate::host::{FreezeAlarm, Host, HostError, Level};
use crate::image::{ImageError, TaskImage};
use crate::message::Report;
use crate::options::RestoreFailure;
use crate::thread::{ThreadControl, ThreadError};
use crate::timing::{Spent, SpentTimes, TimedBackend, TimedThreads};
use abi::CUprocessState;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The hook (or step) an error belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Pause,
    Checkpoint,
    DumpFinish,
    Resume,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Pause => "PAUSE_DEVICES",
            Step::Checkpoint => "CHECKPOINT_DEVICES",
            Step::DumpFinish => "dump finish",
            Step::Resume => "RESUME_DEVICES_LATE",
        })
    }
}

/// What a per-task hook did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The task has CUDA state and the hook handled it (hook returns 0).
    Handled,
    /// Not a CUDA task (hook returns `-ENOTSUP`, so other plugins still see it).
    NotMine,
}

/// A lifecycle failure. A variant with a `cause` keeps it as its [`source`](std::error::Error::source)
/// and says only where it happened; [`crate::message::Report`] writes the whole message (the
/// backend's own message names the pid, so a backend failure reads `STEP: failed to OP pid P
/// via BACKEND: …`, the pid once).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{step}")]
    Backend {
        step: Step,
        pid: Pid,
        #[source]
        cause: BackendError,
    },
    #[error("{step} pid {pid}")]
    Thread {
        step: Step,
        pid: Pid,
        #[source]
        cause: ThreadError,
    },
    #[error("{step} pid {pid}: the CUDA state is {state}, which cannot be checkpointed")]
    BadState {
        step: Step,
        pid: Pid,
        state: CUprocessState,
    },
    #[error("{}", freeze_timeout_message(*pid, *criu_timeout, *left, cause.as_ref(), *narrow))]
    FreezeTimeout {
        pid: Pid,
        /// CRIU's `--timeout`, when known.
        criu_timeout: Option<u32>,
        /// What was left of it when the lock started; `None`: it had already expired.
        left: Option<Duration>,
        /// The lock's failure, when one was tried.
        cause: Option<BackendError>,
        /// The lock ran with fewer tasks locked at once than the tree has (how many: 1 in
        /// sequential mode): the message names the likely cause, a collective (see
        /// `collective_hint`).
        narrow: Option<usize>,
    },
    /// A lock that timed out while the tree's tasks were locked fewer at a time than it has
    /// (`width`; 1 in sequential mode): the backend's failure, and the likely cause.
    #[error("PAUSE_DEVICES: {cause}; {}", collective_hint(*width))]
    LockTimeout {
        pid: Pid,
        cause: BackendError,
        width: usize,
    },
    #[error(
        "PAUSE_DEVICES: another tool locked the task while the dump was starting ({cause}; its \
         state is now {state}); that lock is not ours and is left alone"
    )]
    ForeignLock {
        pid: Pid,
        state: String,
        cause: BackendError,
    },
    #[error(
        "PAUSE_DEVICES pid {pid}: the task is stopped (its CUDA restore thread {tid} is in state \
         {state:?}), so the driver cannot lock it and the lock could only time out; continue it \
         (kill -CONT {pid}) and dump again"
    )]
    Stopped { pid: Pid, tid: Tid, state: char },
    #[error(
        "PAUSE_DEVICES pid {pid}: the tree's CUDA tasks hold {} of GPU memory (NVML), which their \
         checkpoints stage in host memory, but the host has only {} available (MemAvailable): \
         the dump would get a task OOM-killed halfway; refusing before any task is locked \
         (cuda_plugin.check-capacity=off overrides)",
        crate::nvml::gib(*need),
        crate::nvml::gib(*available)
    )]
    HostTooSmall { pid: Pid, need: u64, available: u64 },
    #[error("{}", mig_message(on_mig))]
    MigGpu {
        /// Each task of the tree with a context on a GPU in MIG mode, and that GPU.
        on_mig: Vec<(Pid, abi::GpuUuid)>,
    },
    #[error("CHECKPOINT_DEVICES pid {pid}: failed to add cuda_plugin to the inventory")]
    Inventory {
        pid: Pid,
        #[source]
        cause: HostError,
    },
    #[error("{step} pid {pid}: task image")]
    ImageIo {
        step: Step,
        pid: Pid,
        #[source]
        cause: HostError,
    },
    #[error("CHECKPOINT_DEVICES pid {pid}")]
    GpuInventory {
        pid: Pid,
        #[source]
        cause: crate::inventory::InventoryError,
    },
    #[error("RESUME_DEVICES_LATE pid {pid}: task image {}", crate::image::file_name(*pid))]
    ImageFormat {
        pid: Pid,
        #[source]
        cause: ImageError,
    },
    #[error(
        "RESUME_DEVICES_LATE pid {pid}: the dump recorded CUDA state for this task, but the \
         driver knows no CUDA restore thread for it now"
    )]
    NoRestoreThread { pid: Pid },
    #[error("dump finish: {} task(s) could not be put back in their initial CUDA state: pids {pids:?}", pids.len())]
    RollbackIncomplete { pids: Vec<Pid> },
}

impl crate::message::Caused for EngineError {
    fn caused_by(&self) -> Option<&dyn std::fmt::Display> {
        match self {
            Self::Backend { cause, .. } => Some(cause),
            Self::Thread { cause, .. } => Some(cause),
            Self::Inventory { cause, .. } | Self::ImageIo { cause, .. } => Some(cause),
            Self::GpuInventory { cause, .. } => Some(cause),
            Self::ImageFormat { cause, .. } => Some(cause),
            Self::BadState { .. }
            | Self::FreezeTimeout { .. }
            | Self::LockTimeout { .. }
            | Self::ForeignLock { .. }
            | Self::Stopped { .. }
            | Self::HostTooSmall { .. }
            | Self::MigGpu { .. }
            | Self::NoRestoreThread { .. }
            | Self::RollbackIncomplete { .. } => None,
        }
    }
}

fn mig_message(on_mig: &[(Pid, abi::GpuUuid)]) -> String {
    let tasks: Vec<String> = on_mig
        .iter()
        .map(|(pid, gpu)| format!("pid {pid} on {gpu}"))
        .collect();
    format!(
        "PAUSE_DEVICES: {} task(s) of the tree run on a GPU in MIG mode (NVML): {}; the CUDA \
         driver cannot checkpoint a process on a MIG instance (its checkpoint fails, reported \
         as out of memory), so the dump is refused before any task is locked; to checkpoint \
         the job, run it on GPUs with MIG mode disabled",
        on_mig.len(),
        tasks.join(", ")
    )
}

/// The start of [`collective_hint`].
const COLLECTIVE_RANKS: &str = "if these tasks are ranks of a collective (NCCL ranks, say)";

/// The end of [`collective_hint`].
const COLLECTIVE_FIX: &str = "each rank's lock waits for its collective work in flight, which \
     waits for its peers; lock them all at once with cuda_plugin.parallel=auto (up to 16 \
     tasks) or cuda_plugin.parallel=N (N ranks)";

/// The likely cause of a lock that timed out while the tree's tasks were locked `width` at a
/// time (1: one at a time), fewer than it has: the ranks of a collective (NCCL's, say) each
/// wait for their peers.
fn collective_hint(width: usize) -> String {
    if width <= 1 {
        format!("{COLLECTIVE_RANKS}, they cannot be locked one at a time: {COLLECTIVE_FIX}")
    } else {
        format!("{COLLECTIVE_RANKS}, they cannot be locked {width} at a time: {COLLECTIVE_FIX}")
    }
}

fn freeze_timeout_message(
    pid: Pid,
    criu_timeout: Option<u32>,
    left: Option<Duration>,
    cause: Option<&BackendError>,
    narrow: Option<usize>,
) -> String {
    let timeout = criu_timeout.map_or_else(
        || "CRIU's freezing timeout (--timeout)".to_owned(),
        |t| format!("CRIU's freezing timeout (--timeout {t} s)"),
    );
    // The lock's failure, when quoted, names the pid itself.
    let (task, what) = match (left, cause) {
        (None, _) => (
            format!(" pid {pid}"),
            format!("{timeout} has already expired; not locking the task"),
        ),
        (Some(l), None) => (
            format!(" pid {pid}"),
            format!(
                "only {} ms are left of {timeout}, too little to lock the task",
                crate::message::millis(l)
            ),
        ),
        (Some(l), Some(c)) => (
            String::new(),
            format!(
                "the lock did not finish within the {} ms left of {timeout} ({c})",
                crate::message::millis(l)
            ),
        ),
    };
    let hint = narrow.map_or_else(String::new, |w| format!("; {}", collective_hint(w)));
    format!(
        "PAUSE_DEVICES{task}: {what}; every CUDA task of the tree must be locked and frozen \
         within that timeout: raise it (criu dump --timeout SECONDS), or find out what keeps \
         the task's CUDA work from finishing{hint}"
    )
}

/// Settings fixed at `init`.
#[derive(Debug, Clone, Default)]
pub struct EngineConfig {
    /// Per-operation timeout; `None` = none.
    pub timeout: Option<Duration>,
    /// CRIU's `--timeout` in seconds, when known (for messages about its freeze alarm).
    pub criu_timeout: Option<u32>,
    /// GPU remapping for restore.
    pub pairs: Vec<GpuPair>,
    /// The tasks stay alive after the dump (`--leave-running`, CRIU's `final_state == TASK_ALIVE`).
    pub leave_running: bool,
    /// Restore: the dump's CUDA tasks by pid, read and validated at `init` from the task list and
    /// the per-task images. `None` for images written before the task list existed: each task's
    /// image is then read at its RESUME_DEVICES_LATE.
    pub restore_tasks: Option<BTreeMap<Pid, TaskImage>>,
    /// Restore: what to do with a task whose GPU state could not be restored.
    pub on_restore_failure: RestoreFailure,
    /// Restore: the host only logs a failed RESUME_DEVICES_LATE and releases the task anyway
    /// (CRIU 4.1 and 4.2), so [`EngineConfig::on_restore_failure`] applies.
    pub late_errors_ignored: bool,
    /// `check-capacity=off`: no host-memory check at dump.
    pub skip_capacity_check: bool,
    /// The copy rate (bytes/s) a checkpoint's or restore's deadline assumes; 0: the default.
    pub min_copy_rate: f64,
    /// How many tasks' checkpoints (or restores) may run at once (`parallel=`): 0 or 1 is one
    /// at a time, each inside its own hook call; more starts every task's work at the first
    /// CHECKPOINT_DEVICES (or RESUME_DEVICES_LATE) call of CRIU's loop, at most this many at a
    /// time (see [`Engine::checkpoint_devices`]).
    pub parallel: usize,
}

impl EngineConfig {
    /// The copy rate deadlines assume, bytes per second.
    #[must_use]
    pub fn copy_rate(&self) -> f64 {
        if self.min_copy_rate > 0.0 {
            self.min_copy_rate
        } else {
            crate::nvml::DEFAULT_MIN_COPY_RATE
        }
    }
}

/// What the dump learnt about sizes, once, before its first lock.
#[derive(Debug, Default)]
struct Sizes {
    /// The first pid CRIU paused: the root of the tree.
    root: Option<Pid>,
    /// Whether the tree was surveyed (at its first CUDA task).
    surveyed: bool,
    /// NVML's answer, when it gave one.
    snapshot: Option<crate::nvml::Snapshot>,
    /// All the memory of all GPUs (the most a copy can move), once known.
    all_gpus: Option<u64>,
}

/// How much of CRIU's freeze alarm is kept free at the end of a lock: time for undoing a lock
/// that landed late and for CRIU's own failure path, well before the alarm fires.
pub const ALARM_RESERVE: Duration = Duration::from_secs(1);
/// A lock is not even tried with less of the freeze alarm left than this (after the reserve).
pub const MIN_LOCK_WINDOW: Duration = Duration::from_millis(100);

/// Where the dump's rollback stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finish {
    /// No DUMP_FINISH/exit yet.
    Pending,
    /// DUMP_FINISH reported success and the tasks stay checkpointed; a later `exit` with a
    /// failure still rolls back.
    Kept,
    /// The rollback ran (or nothing needed one and `exit` came).
    Done,
}

/// What the engine knows and did about one CUDA task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    pub pid: Pid,
    pub restore_tid: Tid,
    /// The CUDA state found at PAUSE_DEVICES.
    pub initial: CUprocessState,
    /// We locked it (or tried to and could not verify it is unlocked again).
    pub locked_by_us: bool,
    /// We asked for a checkpoint (whether or not it reported success).
    pub checkpointed_by_us: bool,
}

/// The lifecycle engine for one CRIU operation.
pub struct Engine {
    backend: Box<dyn Backend>,
    threads: Box<dyn ThreadControl>,
    host: Box<dyn Host>,
    cfg: EngineConfig,
    tasks: Vec<TaskRecord>,
    inventory_added: bool,
    finish: Finish,
    /// Restore: the tasks RESUME_DEVICES_LATE handled (or tried to).
    resumed: BTreeSet<Pid>,
    /// The tasks' image pids, by host pid, once the first image is written (see
    /// [`Engine::image_keys`]).
    image_keys: Option<BTreeMap<Pid, Pid>>,
    /// Dump: sizes.
    sizes: Sizes,
    /// Time spent in the backend and in restore-thread control (see [`Engine::take_spent`]).
    spent: Arc<Spent>,
    /// The guardian, when a helper process runs.
    guard: Option<Box<dyn Guard>>,
    /// A note to the guardian failed (logged once).
    guard_failed: bool,
    /// Restore: the dump's tasks were all handed to the guardian (at the first
    /// RESUME_DEVICES_LATE).
    restore_tracked: bool,
    /// Parallel mode, dump: each task's checkpoint result (its duration in ms), from the batch
    /// the first CHECKPOINT_DEVICES started; taken by the task's own call.
    checkpoint_batch: Option<Vec<(Pid, Result<u64, EngineError>)>>,
    /// Parallel mode, restore: each task's result, from the batch the first
    /// RESUME_DEVICES_LATE started; taken by the task's own call.
    restore_batch: Option<Vec<(Pid, Result<Outcome, EngineError>)>>,
    /// A batch ran in the current hook call (see [`Engine::take_batch_ran`]).
    batch_ran: bool,
    /// Parallel mode, dump: the tasks the first PAUSE_DEVICES locked ahead (with their restore
    /// threads) or failed to, until each task's own call takes its result (see
    /// [`Engine::lock_ahead`]).
    /// (`None`: not a CUDA task).
    ahead: Option<Ahead>,
}

/// What the lock-ahead did to each task it probed: its restore thread when it locked it (`None`:
/// not a CUDA task), or the failure its own call returns (see [`Engine::lock_ahead`]).
type Ahead = Vec<(Pid, Result<Option<Tid>, EngineError>)>;

/// The record of a task locked ahead ([`Engine::lock_ahead`]): RUNNING at dump start, locked
/// by us.
fn ahead_record(pid: Pid, restore_tid: Tid) -> TaskRecord {
    TaskRecord {
        pid,
        restore_tid,
        initial: CUprocessState::RUNNING,
        locked_by_us: true,
        checkpointed_by_us: false,
    }
}

/// Takes `pid`'s result out of a batch's results (a batch is a few tasks: a list will do).
fn take_result<T>(results: &mut Vec<(Pid, T)>, pid: Pid) -> Option<T> {
    let i = results.iter().position(|(p, _)| *p == pid)?;
    Some(results.swap_remove(i).1)
}

/// What restoring one task involves, once its records are read (see [`Engine::plan_resume`]).
#[derive(Debug, Clone)]
struct ResumePlan {
    pid: Pid,
    tid: Tid,
    initial: CUprocessState,
    bytes: Option<u64>,
    deadline: Option<Duration>,
    /// How long its checkpoint took, when the dump recorded it.
    checkpoint_ms: Option<u64>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("backend", &self.backend.kind())
            .field("cfg", &self.cfg)
            .field("tasks", &self.tasks)
            .field("inventory_added", &self.inventory_added)
            .field("finish", &self.finish)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Resumes the restore thread and logs what happened.
    fn resume_thread(
        &mut self,
        step: Step,
        pid: Pid,
        tid: Tid,
    ) -> Result<crate::thread::Resumed, EngineError> {
        let r = self
            .threads
            .resume(pid, tid)
            .map_err(|cause| EngineError::Thread { step, pid, cause })?;
        self.log(
            Level::Debug,
            &format!(
                "{step} pid {pid}: restore thread {tid} {}",
                if r.saved_sigmask.is_some() {
                    "resumed"
                } else {
                    "not traced by us; left alone"
                }
            ),
        );
        Ok(r)
    }

    pub fn new(
        backend: Box<dyn Backend>,
        threads: Box<dyn ThreadControl>,
        host: Box<dyn Host>,
        cfg: EngineConfig,
    ) -> Self {
        let spent = Arc::new(Spent::default());
        Engine {
            backend: Box::new(TimedBackend {
                inner: backend,
                spent: Arc::clone(&spent),
            }),
            threads: Box::new(TimedThreads {
                inner: threads,
                spent: Arc::clone(&spent),
            }),
            host,
            cfg,
            tasks: Vec::new(),
            inventory_added: false,
            finish: Finish::Pending,
            resumed: BTreeSet::new(),
            image_keys: None,
            sizes: Sizes::default(),
            spent,
            guard: None,
            guard_failed: false,
            restore_tracked: false,
            checkpoint_batch: None,
            restore_batch: None,
            batch_ran: false,
            ahead: None,
        }
    }

    /// Whether the hook call just made ran a parallel batch (every task's work), and resets
    /// it: such a call took the batch's time even when its own task was not a CUDA task.
    pub fn take_batch_ran(&mut self) -> bool {
        std::mem::take(&mut self.batch_ran)
    }

    /// How many of `n` tasks' calls run at once in parallel mode; 1 (or 0) is sequential mode.
    fn width(&self, n: usize) -> usize {
        self.cfg.parallel.min(n).max(1)
    }

    /// Tells `guard`, before every state change, what is about to happen.
    #[must_use]
    pub fn with_guard(mut self, guard: Box<dyn Guard>) -> Self {
        self.guard = Some(guard);
        self
    }

    /// Sends one note to the guardian; the first failure is logged.
    fn guard_note(&mut self, note: impl FnOnce(&dyn Guard) -> Result<(), AgentError>) {
        let Some(g) = &self.guard else { return };
        if let Err(e) = note(&**g) {
            self.guard_note_failed(&e);
        }
    }

    /// A note to the guardian failed: logged the first time (kept out of every note's copy).
    #[inline(never)]
    fn guard_note_failed(&mut self, e: &AgentError) {
        if !std::mem::replace(&mut self.guard_failed, true) {
            self.log(
                Level::Warn,
                &format!(
                    "cannot tell the guardian what the plugin is doing ({e}); should CRIU die \
                     now, the tasks it changed may stay locked or checkpointed"
                ),
            );
        }
    }

    /// How the plugin's helper should end (see [`crate::agent::proto::FinishMode`]): after a dump
    /// that kept the tasks checkpointed, or whose rollback left some task unrecovered, it
    /// watches the tasks until CRIU has exited; otherwise it exits now.
    #[must_use]
    pub fn finish_mode(&self) -> crate::agent::proto::FinishMode {
        use crate::agent::proto::FinishMode;
        let changed = self
            .tasks
            .iter()
            .any(|t| t.locked_by_us || t.checkpointed_by_us);
        if self.finish == Finish::Kept || (self.finish == Finish::Done && changed) {
            FinishMode::WatchTasks
        } else {
            FinishMode::Done
        }
    }

    /// The time spent waiting on the backend and on restore-thread control since the last
    /// call (the hooks log it next to their total).
    pub fn take_spent(&self) -> SpentTimes {
        self.spent.take()
    }

    /// The per-task records, in PAUSE_DEVICES order.
    #[must_use]
    pub fn tasks(&self) -> &[TaskRecord] {
        &self.tasks
    }

    /// The backend (for statistics such as the CLI's execution count).
    #[must_use]
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    fn log(&self, level: Level, msg: &str) {
        self.host.log(level, msg);
    }

    fn index(&self, pid: Pid) -> Option<usize> {
        self.tasks.iter().position(|t| t.pid == pid)
    }

    /// PAUSE_DEVICES: the task is still running. In parallel mode the first call locks the
    /// tree's CUDA tasks ahead (see `lock_ahead` below), and each of them takes its own result
    /// at its own call.
    pub fn pause_devices(&mut self, pid: Pid) -> Result<Outcome, EngineError> {
        let step = Step::Pause;
        let be = |cause| EngineError::Backend { step, pid, cause };
        let mut rec = match self.ahead.as_mut().and_then(|a| take_result(a, pid)) {
            Some(r) => match r? {
                Some(tid) => ahead_record(pid, tid),
                None => return Ok(Outcome::NotMine),
            },
            None => {
                if self.index(pid).is_some() {
                    return Ok(Outcome::Handled);
                }
                self.sizes.root.get_or_insert(pid);
                if self.cfg.parallel > 1 && self.ahead.is_none() {
                    self.ahead = Some(self.lock_ahead(pid));
                    return self.pause_devices(pid);
                }
                let Some(tid) = self.backend.get_restore_tid(pid).map_err(be)? else {
                    self.log(
                        Level::Debug,
                        &format!("pid {pid} has no CUDA restore thread; not ours"),
                    );
                    return Ok(Outcome::NotMine);
                };
                let initial = self.backend.get_state(pid).map_err(be)?;
                TaskRecord {
                    pid,
                    restore_tid: tid,
                    initial,
                    locked_by_us: false,
                    checkpointed_by_us: false,
                }
            }
        };
        let (tid, initial) = (rec.restore_tid, rec.initial);
        match initial {
            // Locked ahead ([`Engine::lock_ahead`]).
            _ if rec.locked_by_us => {}
            CUprocessState::RUNNING => {
                if let Some(state) = self.threads.stopped(pid, tid) {
                    return Err(EngineError::Stopped { pid, tid, state });
                }
                self.survey(pid)?;
                let (limits, alarm_left) = self.lock_limits(pid, 1)?;
                let bytes = self.known_bytes(pid);
                self.guard_note(|g| g.track(pid, initial, bytes, &[]));
                self.guard_note(|g| g.intent(pid, Op::Lock));
                let started = std::time::Instant::now();
                if let Err(cause) = self.backend.lock(pid, limits) {
                    let took = started.elapsed();
                    // In sequential mode the tree's tasks are locked one at a time.
                    let narrow = (self.cfg.parallel <= 1).then_some(1);
                    return Err(self.failed_lock(rec, cause, limits, took, alarm_left, narrow));
                }
                rec.locked_by_us = true;
            }
            CUprocessState::LOCKED | CUprocessState::CHECKPOINTED => {
                if initial == CUprocessState::LOCKED {
                    // Its checkpoint is ours to undo.
                    let bytes = self.known_bytes(pid);
                    self.guard_note(|g| g.track(pid, initial, bytes, &[]));
                }
                self.log(
                    Level::Info,
                    &format!("pid {pid} is already {initial}; leaving its lock alone"),
                );
            }
            state => return Err(EngineError::BadState { step, pid, state }),
        }
        self.log(
            Level::Info,
            &format!(
                "pid {pid}: restore thread {tid}, initial state {initial}, locked: {}",
                rec.locked_by_us
            ),
        );
        self.tasks.push(rec);
        Ok(Outcome::Handled)
    }

    /// Parallel mode, at the first PAUSE_DEVICES (`root`): CRIU pauses the tree's tasks one by
    /// one, each just before it seizes it, and all of them within its freeze alarm; so the
    /// RUNNING CUDA tasks of the tree below `root` are locked now, together, at most
    /// [`EngineConfig::parallel`] at a time, under the rules of a lock of one's own: the tree is
    /// surveyed first, the guardian is told before, each lock gets the alarm's window divided
    /// by the batch's rounds (so the whole batch ends in time; with too little left, nothing is
    /// locked ahead), and a failed lock is left as found ([`Engine::failed_lock`]). A failed
    /// probe, and "not a CUDA task", are that task's result too; a CUDA task that is not plainly
    /// RUNNING and unstopped is left to its own call, as is one forked after the walk. What
    /// CRIU then never pauses is unlocked again by [`Engine::put_back_ahead`].
    fn lock_ahead(&mut self, root: Pid) -> Ahead {
        let (mut ahead, mut pids, mut tids) = (Vec::new(), Vec::new(), Vec::new());
        for pid in self.host.tree(root) {
            let be = |cause| EngineError::Backend {
                step: Step::Pause,
                pid,
                cause,
            };
            let tid = match self.backend.get_restore_tid(pid) {
                Ok(Some(tid)) => tid,
                Ok(None) => {
                    ahead.push((pid, Ok(None)));
                    continue;
                }
                Err(cause) => {
                    ahead.push((pid, Err(be(cause))));
                    continue;
                }
            };
            match self.backend.get_state(pid) {
                Ok(CUprocessState::RUNNING) if self.threads.stopped(pid, tid).is_none() => {
                    pids.push(pid);
                    tids.push(tid);
                }
                Ok(_) => {}
                Err(cause) => ahead.push((pid, Err(be(cause)))),
            }
        }
        let n = pids.len();
        let width = self.width(n);
        // At most one round per process of the tree: far fewer than u32::MAX.
        let rounds = n.div_ceil(width) as u32;
        let Some(&first) = pids.first() else {
            return ahead;
        };
        if let Err(e) = self.survey(first) {
            ahead.push((first, Err(e)));
            return ahead;
        }
        let Ok((limits, alarm_left)) = self.lock_limits(first, rounds) else {
            return ahead;
        };
        for &pid in &pids {
            let bytes = self.known_bytes(pid);
            self.guard_note(|g| {
                g.track(pid, CUprocessState::RUNNING, bytes, &[])?;
                g.intent(pid, Op::Lock)
            });
        }
        self.log(
            Level::Info,
            &format!("PAUSE_DEVICES: locking {n} task(s), {width} at a time (parallel mode)"),
        );
        self.batch_ran = true;
        let done = self.backend.lock_many(&pids, limits, width);
        let narrow = (width < n).then_some(width);
        for (i, (r, took)) in done.into_iter().enumerate() {
            let (pid, tid) = (pids[i], tids[i]);
            let r = match r {
                Ok(()) => Ok(Some(tid)),
                Err(cause) => {
                    let mut rec = ahead_record(pid, tid);
                    rec.locked_by_us = false;
                    Err(self.failed_lock(rec, cause, limits, took, alarm_left, narrow))
                }
            };
            ahead.push((pid, r));
        }
        ahead
    }

    /// Parallel mode, at the first CHECKPOINT_DEVICES (or at the dump's end, when CRIU failed
    /// first): the tasks locked ahead that CRIU never paused (they exited, left the tree, or
    /// CRIU stopped) are unlocked again, state-driven. One that cannot be (or whose failed lock
    /// could not be checked) joins the records and fails the dump, whose rollback tries again.
    fn put_back_ahead(&mut self) -> Result<(), EngineError> {
        let mut pids = Vec::new();
        for (pid, r) in self.ahead.as_mut().map(std::mem::take).unwrap_or_default() {
            match r {
                Ok(Some(tid)) => {
                    let rec = ahead_record(pid, tid);
                    if !self.roll_back(&rec, "locked ahead, but CRIU never paused it") {
                        self.tasks.push(rec);
                        pids.push(pid);
                    }
                }
                // A failed lock that may still hold is in the records already.
                Err(_) if self.index(pid).is_some() => pids.push(pid),
                _ => {}
            }
        }
        if pids.is_empty() {
            Ok(())
        } else {
            Err(EngineError::RollbackIncomplete { pids })
        }
    }

    /// Once per dump, before its first lock: how much GPU memory the tree holds (NVML), checked
    /// against the host's available memory (see [`crate::nvml`]).
    fn survey(&mut self, pid: Pid) -> Result<(), EngineError> {
        if std::mem::replace(&mut self.sizes.surveyed, true) {
            return Ok(());
        }
        let root = self.sizes.root.unwrap_or(pid);
        let tree = self.host.tree(root);
        let snapshot = match self.host.gpu_memory(self.cfg.timeout) {
            Ok(s) => s,
            Err(e) => {
                self.log(
                    Level::Warn,
                    &format!(
                        "{e}: the host-memory check is skipped, and each checkpoint's deadline \
                         assumes it moves all the memory of all GPUs"
                    ),
                );
                return Ok(());
            }
        };
        let mut need = 0u64;
        let mut holders = 0usize;
        let mut unknown = 0usize;
        for &p in &tree {
            match snapshot.task_bytes(p) {
                Some(m) if !m.is_empty() => {
                    holders += 1;
                    need = need.saturating_add(m.values().sum());
                }
                Some(_) => {}
                None => unknown += 1,
            }
        }
        let available = self.host.memory_available();
        self.log(
            Level::Info,
            &format!(
                "GPU memory of the tree (NVML): {} in {holders} process(es){}; host memory \
                 available: {}",
                crate::nvml::gib(need),
                if unknown > 0 {
                    format!(" ({unknown} more that NVML cannot account)")
                } else {
                    String::new()
                },
                available.map_or_else(|| "unknown".to_owned(), crate::nvml::gib)
            ),
        );
        // The driver cannot checkpoint a process on a MIG instance: refused before any lock.
        let on_mig: Vec<(Pid, abi::GpuUuid)> = tree
            .iter()
            .flat_map(|&p| snapshot.mig_gpus_of(p).into_iter().map(move |g| (p, g)))
            .collect();
        self.sizes.all_gpus = Some(snapshot.all_memory());
        self.sizes.snapshot = Some(snapshot);
        if !on_mig.is_empty() {
            return Err(EngineError::MigGpu { on_mig });
        }
        match available {
            Some(available) if need > available && !self.cfg.skip_capacity_check => {
                Err(EngineError::HostTooSmall {
                    pid,
                    need,
                    available,
                })
            }
            _ => Ok(()),
        }
    }

    /// The device memory of `pid`, when the survey knows it.
    fn known_bytes(&self, pid: Pid) -> Option<u64> {
        self.sizes
            .snapshot
            .as_ref()
            .and_then(|s| s.task_bytes(pid))
            .map(|m| m.values().sum())
    }

    /// The device memory of `pid` per GPU, as NVML reported it at the survey.
    fn task_bytes(&self, pid: Pid) -> Vec<(abi::GpuUuid, u64)> {
        self.sizes
            .snapshot
            .as_ref()
            .and_then(|s| s.task_bytes(pid))
            .map(|m| m.into_iter().collect())
            .unwrap_or_default()
    }

    /// The deadline of a checkpoint or restore of `pid` moving `bytes` (see [`copy_deadline`]).
    fn copy_deadline(&mut self, step: Step, pid: Pid, bytes: Option<u64>) -> Option<Duration> {
        copy_deadline(
            &mut self.sizes,
            &mut *self.host,
            &self.cfg,
            step,
            pid,
            bytes,
        )
    }

    /// The limits of the next lock: the per-operation timeout, shortened to what is left of
    /// CRIU's freeze alarm (less [`ALARM_RESERVE`]) where the host has one, so that the lock
    /// gives up, and the plugin returns, before CRIU's alarm fires and, five seconds later,
    /// aborts CRIU without any rollback. Also returns what was left of the alarm when it
    /// shortened the limits.
    /// `rounds`: how many locks run one after another ([`Engine::lock_ahead`]): each gets that
    /// share of the window.
    fn lock_limits(
        &self,
        pid: Pid,
        rounds: u32,
    ) -> Result<(LockLimits, Option<Duration>), EngineError> {
        let base = LockLimits::from_timeout(self.cfg.timeout);
        let timeout = |left| EngineError::FreezeTimeout {
            pid,
            criu_timeout: self.cfg.criu_timeout,
            left,
            cause: None,
            narrow: None,
        };
        match self.host.freeze_alarm() {
            FreezeAlarm::Expired => Err(timeout(None)),
            FreezeAlarm::Armed { left } => {
                let window = left.saturating_sub(ALARM_RESERVE) / rounds.max(1);
                if window < MIN_LOCK_WINDOW {
                    return Err(timeout(Some(left)));
                }
                let (limits, shortened) = base.within(window);
                if shortened {
                    self.log(
                        Level::Debug,
                        &format!(
                            "pid {pid}: lock limited to {} ms by CRIU's freeze alarm ({} ms left)",
                            crate::message::millis(window),
                            crate::message::millis(left)
                        ),
                    );
                }
                Ok((limits, shortened.then_some(left)))
            }
            FreezeAlarm::Disarmed | FreezeAlarm::Unknown => Ok((base, None)),
        }
    }

    /// After a failed lock of a running (unseized) task: leave the task as found. A lock that may
    /// have landed anyway (a timeout, a transport failure, a driver that reported an error after
    /// acting) is checked for and undone; a definite refusal because of the task's state
    /// (`CUDA_ERROR_ILLEGAL_STATE`) means someone else locked it first, and their lock is left
    /// alone.
    fn failed_lock(
        &mut self,
        mut rec: TaskRecord,
        cause: BackendError,
        limits: LockLimits,
        took: Duration,
        alarm_left: Option<Duration>,
        narrow: Option<usize>,
    ) -> EngineError {
        let pid = rec.pid;
        // The alarm is to blame only when the lock ran into the limit it set.
        let ran_out = limits
            .driver
            .is_some_and(|d| took + Duration::from_millis(50) >= d);
        let alarm_left = alarm_left.filter(|_| ran_out);
        if cause.is_illegal_state() {
            let state = match self.backend.get_state(pid) {
                Ok(s) => s.to_string(),
                Err(e) => format!("unknown: {e}"),
            };
            self.guard_note(|g| g.untrack(pid));
            return EngineError::ForeignLock { pid, state, cause };
        }
        if cause.may_have_landed() && !self.unlock_if_locked(pid) {
            rec.locked_by_us = true;
            self.tasks.push(rec);
        } else {
            self.guard_note(|g| g.untrack(pid));
        }
        match alarm_left {
            Some(left) if cause.is_timeout() => EngineError::FreezeTimeout {
                pid,
                criu_timeout: self.cfg.criu_timeout,
                left: Some(left),
                narrow: narrow.filter(|_| cause.is_driver_lock_timeout()),
                cause: Some(cause),
            },
            _ => match narrow {
                Some(width) if cause.is_driver_lock_timeout() => {
                    EngineError::LockTimeout { pid, cause, width }
                }
                _ => EngineError::Backend {
                    step: Step::Pause,
                    pid,
                    cause,
                },
            },
        }
    }

    /// After a failed lock that may have landed: unlock the task if it is locked after all
    /// (logged). Returns true when the task is known to be back to RUNNING.
    fn unlock_if_locked(&mut self, pid: Pid) -> bool {
        match self.backend.get_state(pid) {
            Ok(CUprocessState::RUNNING) => true,
            Ok(CUprocessState::LOCKED) => match self.backend.unlock(pid) {
                Ok(()) => {
                    self.log(
                        Level::Warn,
                        &format!(
                            "PAUSE_DEVICES pid {pid}: the failed lock had landed after all; \
                             unlocked the task again"
                        ),
                    );
                    true
                }
                Err(e) => {
                    self.log(
                        Level::Error,
                        &format!("PAUSE_DEVICES pid {pid}: cannot undo a late lock: {e}"),
                    );
                    false
                }
            },
            Ok(s) => {
                self.log(
                    Level::Error,
                    &format!("PAUSE_DEVICES pid {pid}: unexpected state {s} after a failed lock"),
                );
                false
            }
            Err(e @ BackendError::Busy { .. }) => {
                self.log(
                    Level::Info,
                    &format!(
                        "PAUSE_DEVICES pid {pid}: cannot check the task now ({e}); the rollback \
                         checks it again"
                    ),
                );
                false
            }
            Err(e) => {
                self.log(
                    Level::Error,
                    &format!(
                        "PAUSE_DEVICES pid {pid}: cannot verify the state after a failed lock: {e}"
                    ),
                );
                false
            }
        }
    }

    /// CHECKPOINT_DEVICES: the whole tree is ptrace-stopped.
    pub fn checkpoint_devices(&mut self, pid: Pid) -> Result<Outcome, EngineError> {
        let step = Step::Checkpoint;
        self.put_back_ahead()?;
        if self.cfg.parallel > 1 && self.checkpoint_batch.is_none() {
            // CRIU calls CHECKPOINT_DEVICES for every task in one loop with the whole tree
            // frozen (criu/seize.c, checkpoint_devices): the first call starts them all.
            let batch = self.checkpoint_batch_run();
            self.checkpoint_batch = Some(batch);
            self.batch_ran = true;
        }
        let Some(i) = self.index(pid) else {
            return Ok(Outcome::NotMine);
        };
        let rec = self.tasks[i].clone();
        let gpu_bytes = self.task_bytes(pid);
        let mut checkpoint_ms = None;
        let batched = self
            .checkpoint_batch
            .as_mut()
            .and_then(|b| take_result(b, pid));
        if let Some(done) = batched {
            checkpoint_ms = Some(done?);
        } else if rec.initial != CUprocessState::CHECKPOINTED {
            let (job, resumed) = self.start_checkpoint(i)?;
            let started = std::time::Instant::now();
            let done = self.backend.checkpoint(pid, job.deadline);
            checkpoint_ms = Some(crate::message::millis(started.elapsed()));
            let stopped = self.threads.restop(resumed);
            done.map_err(|cause| EngineError::Backend { step, pid, cause })?;
            stopped.map_err(|cause| EngineError::Thread { step, pid, cause })?;
        }
        let key = self.image_keys().get(&pid).copied().unwrap_or(pid);
        let image = TaskImage {
            pid: key,
            restore_tid: rec.restore_tid,
            initial_state: rec.initial,
            gpu_bytes,
            checkpoint_ms,
            custom: self.backend.custom_written(pid),
        };
        self.host
            .write_task_image(key, &image.encode())
            .map_err(|cause| EngineError::ImageIo { step, pid, cause })?;
        if !self.inventory_added {
            // With the first checkpointed task: PAUSE_DEVICES has seen the whole tree by now, so
            // the task list names every CUDA task this dump holds.
            let keys = self.image_keys();
            let list = crate::image::TaskList {
                pids: self
                    .tasks
                    .iter()
                    .map(|t| keys.get(&t.pid).copied().unwrap_or(t.pid))
                    .collect(),
            };
            self.host
                .write_task_list(&list.encode())
                .map_err(|cause| EngineError::ImageIo { step, pid, cause })?;
            self.write_gpu_inventory(pid)?;
            self.host
                .add_inventory_entry()
                .map_err(|cause| EngineError::Inventory { pid, cause })?;
            self.inventory_added = true;
        }
        match self.backend.custom_summary(pid) {
            Some(s) => self.log(
                Level::Info,
                &format!("pid {pid}: checkpointed into custom storage: {s}"),
            ),
            None => self.log(Level::Info, &format!("pid {pid}: checkpointed")),
        }
        Ok(Outcome::Handled)
    }

    /// What every checkpoint of task `i` starts with: its deadline (by its GPU memory), its
    /// restore thread resumed, the record marked and the guardian told.
    fn start_checkpoint(&mut self, i: usize) -> Result<(Job, crate::thread::Resumed), EngineError> {
        let step = Step::Checkpoint;
        let (pid, tid) = (self.tasks[i].pid, self.tasks[i].restore_tid);
        let known = self
            .sizes
            .snapshot
            .is_some()
            .then(|| self.task_bytes(pid).iter().map(|(_, b)| b).sum());
        let deadline = self.copy_deadline(step, pid, known);
        let resumed = self.resume_thread(step, pid, tid)?;
        // Marked before the call: a checkpoint that reports a failure (a timeout, say) may
        // still have happened, and the rollback is state-driven anyway.
        self.tasks[i].checkpointed_by_us = true;
        self.guard_note(|g| g.intent(pid, Op::Checkpoint));
        Ok((Job { pid, deadline }, resumed))
    }

    /// Parallel mode: checkpoints every task of the dump that is not checkpointed yet, at most
    /// [`EngineConfig::parallel`] at a time: resume each restore thread (from CRIU's thread, the
    /// tracer), run the checkpoints together ([`Backend::checkpoint_many`]), stop each thread
    /// again exactly as CRIU left it. Each task's result waits for its own CHECKPOINT_DEVICES
    /// call; a task whose thread could not be resumed has nothing started. Should CRIU stop
    /// calling (another task failed), the tasks checkpointed here are put back by the dump's
    /// rollback like any other (they are marked `checkpointed_by_us`).
    fn checkpoint_batch_run(&mut self) -> Vec<(Pid, Result<u64, EngineError>)> {
        let step = Step::Checkpoint;
        let mut results = Vec::new();
        let mut running = Vec::new();
        for i in 0..self.tasks.len() {
            if self.tasks[i].initial == CUprocessState::CHECKPOINTED {
                continue;
            }
            match self.start_checkpoint(i) {
                Ok(started) => running.push(started),
                Err(e) => results.push((self.tasks[i].pid, Err(e))),
            }
        }
        if running.is_empty() {
            return results;
        }
        let jobs: Vec<Job> = running.iter().map(|(j, _)| *j).collect();
        let width = self.width(jobs.len());
        self.log(
            Level::Info,
            &format!(
                "{step}: checkpointing {} task(s), {width} at a time (parallel mode)",
                jobs.len()
            ),
        );
        let done = self.backend.checkpoint_many(&jobs, width);
        for ((job, resumed), (r, took)) in running.into_iter().zip(done) {
            let pid = job.pid;
            let stopped = self.threads.restop(resumed);
            let r = r
                .map_err(|cause| EngineError::Backend { step, pid, cause })
                .and_then(|()| stopped.map_err(|cause| EngineError::Thread { step, pid, cause }))
                .map(|()| crate::message::millis(took));
            results.push((pid, r));
        }
        results
    }

    /// Writes the GPU inventory image, once per dump (with the first checkpointed task). When
    /// the GPUs cannot be enumerated the dump goes on without it, with a warning: such an image
    /// restores like one from before the inventory existed (only a complete UUID map can
    /// retarget it).
    fn write_gpu_inventory(&mut self, pid: Pid) -> Result<(), EngineError> {
        let step = Step::Checkpoint;
        match self.host.current_gpus(self.cfg.timeout) {
            Ok(gpus) => {
                let bytes = crate::inventory::encode(&gpus).map_err(|cause| EngineError::GpuInventory { pid, cause })?;
                self.host
                    .write_gpu_inventory(&bytes)
                    .map_err(|cause| EngineError::ImageIo { step, pid, cause })?;
                let list: Vec<String> = gpus.iter().map(|g| format!("{}:{} ({})", g.ordinal, g.uuid, g.name)).collect();
                self.log(Level::Info, &format!("GPU inventory: {} GPU(s): {}", gpus.len(), list.join(", ")));
            }
            Err(why) => self.log(
                Level::Warn,
                &format!("no GPU inventory written ({why}); a restore onto other GPUs will need a complete UUID device map"),
            ),
        }
        Ok(())
    }

    /// DUMP_FINISH(ret), or `exit(DUMP, ret)`; both come on hosts that have DUMP_FINISH. `ret`
    /// is the dump result so far (non-zero = failed). The rollback runs once, as soon as one of
    /// them learns that the dump failed (or that the tasks stay running): on the newer hosts
    /// DUMP_FINISH(0) can be followed by `exit(DUMP, ret != 0)` when something after it failed
    /// (another plugin's DUMP_FINISH, a post-dump action script), and the tasks are then
    /// resumed, so they must be put back then.
    pub fn dump_finish(&mut self, ret: i32) -> Result<(), EngineError> {
        if self.finish == Finish::Done {
            return Ok(());
        }
        // Tasks locked ahead that CRIU never paused (it failed first); one that cannot be
        // unlocked now is the rollback's.
        let _ = self.put_back_ahead();
        if ret == 0 && !self.cfg.leave_running {
            self.finish = Finish::Kept;
            return Ok(());
        }
        let why = match (ret, self.finish) {
            (0, _) => "the tasks stay running",
            (_, Finish::Kept) => "the dump failed after DUMP_FINISH reported success",
            _ => "the dump failed",
        };
        self.finish = Finish::Done;
        // A deliberately broken build (`--cfg criu_cuda_mutant="skip-rollback"`), only for
        // checking that the scenario corpus catches a plugin that skips its rollback.
        if cfg!(criu_cuda_mutant = "skip-rollback") {
            self.log(Level::Warn, &format!("MUTANT: rollback skipped ({why})"));
            return Ok(());
        }
        if self
            .tasks
            .iter()
            .any(|t| t.locked_by_us || t.checkpointed_by_us)
        {
            self.settle_abandoned_call();
        }
        let mut failed = Vec::new();
        for i in 0..self.tasks.len() {
            let rec = self.tasks[i].clone();
            if !rec.locked_by_us && !rec.checkpointed_by_us {
                continue;
            }
            if self.roll_back(&rec, why) {
                self.tasks[i].locked_by_us = false;
                self.tasks[i].checkpointed_by_us = false;
            } else {
                failed.push(rec.pid);
            }
        }
        if ret != 0 {
            // A failed dump's custom-storage files are garbage once their tasks are back;
            // those of a task that could not be put back hold its only copy of its GPU memory.
            let removed = self.backend.discard_custom_files(&failed);
            if removed > 0 {
                self.log(
                    Level::Info,
                    &format!(
                        "dump finish: removed {removed} custom-storage file(s) of the failed dump"
                    ),
                );
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            let e = EngineError::RollbackIncomplete { pids: failed };
            self.log(Level::Error, &Report(&e).to_string());
            Err(e)
        }
    }

    /// Puts one task back in its initial state (see [`Engine::put_back`]), logged with `why`;
    /// false when it could not be (logged as an error). A task that exited has nothing to put
    /// back.
    fn roll_back(&mut self, rec: &TaskRecord, why: &str) -> bool {
        // A call of an earlier put-back that timed out must not block this task's.
        self.backend.settle(Duration::ZERO);
        let mut steps = Vec::new();
        self.guard_note(|g| g.intent(rec.pid, Op::Restore));
        match self.put_back(rec, &mut steps) {
            Ok(()) => {
                self.guard_note(|g| g.untrack(rec.pid));
                let done = if steps.is_empty() {
                    String::new()
                } else {
                    format!(": {}", steps.join(", "))
                };
                self.log(
                    Level::Info,
                    &format!("pid {}: back to {} ({why}){done}", rec.pid, rec.initial),
                );
            }
            Err(_) if !self.threads.task_exists(rec.pid) => {
                self.guard_note(|g| g.untrack(rec.pid));
                self.log(
                    Level::Warn,
                    &format!(
                        "pid {}: the task exited during the dump; there is nothing to put back",
                        rec.pid
                    ),
                );
            }
            Err(e) => {
                self.log(
                    Level::Error,
                    &format!("{}; the task is left as it is", Report(&e)),
                );
                return false;
            }
        }
        true
    }

    /// Before a rollback: a driver call abandoned on timeout (a checkpoint that took too long,
    /// say) blocks every other call until it returns, and may still take effect. Wait for it, at
    /// most one lock deadline (the backend waits less for an abandoned lock, which overran the
    /// driver's own timeout already: [`crate::backend::LOCK_ABANDON_GRACE`]), so the
    /// state-driven rollback sees (and undoes) whatever it did; after that, stop waiting for it,
    /// so that it cannot keep the other tasks locked.
    fn settle_abandoned_call(&mut self) {
        let limit = op_deadline(Op::Lock, self.cfg.timeout).unwrap_or(LOCK_ABANDON_GRACE);
        let t = std::time::Instant::now();
        // Only a call that was outstanding is worth a line: the time the check itself takes on
        // a loaded host is not a wait.
        match self.backend.settle(limit) {
            crate::backend::Settled::Nothing => {}
            crate::backend::Settled::Returned => {
                self.log(
                    Level::Info,
                    &format!(
                        "dump finish: waited {} ms for a timed-out driver call to return",
                        crate::message::Tenths(t.elapsed().as_secs_f64() * 1000.0)
                    ),
                );
            }
            crate::backend::Settled::StillBlocked => {
                self.log(
                    Level::Error,
                    &format!(
                        "dump finish: a timed-out driver call is still blocked after another \
                     {}; putting the tasks back without waiting for it",
                        crate::message::Span(t.elapsed())
                    ),
                );
            }
        }
    }

    /// Drives one task back to its initial state: resume its restore thread (if CRIU holds it),
    /// query the state, act, stop the thread again. Every step taken is added to `steps`.
    fn put_back(
        &mut self,
        rec: &TaskRecord,
        steps: &mut Vec<&'static str>,
    ) -> Result<(), EngineError> {
        let (step, pid) = (Step::DumpFinish, rec.pid);
        let resumed = self.resume_thread(step, pid, rec.restore_tid)?;
        let driven = self.drive_to(pid, rec.initial, steps);
        let stopped = self.threads.restop(resumed);
        driven?;
        stopped.map_err(|cause| EngineError::Thread { step, pid, cause })
    }

    fn drive_to(
        &mut self,
        pid: Pid,
        target: CUprocessState,
        steps: &mut Vec<&'static str>,
    ) -> Result<(), EngineError> {
        let step = Step::DumpFinish;
        let known = self
            .sizes
            .snapshot
            .is_some()
            .then(|| self.task_bytes(pid).iter().map(|(_, b)| b).sum());
        let (sizes, host, cfg) = (&mut self.sizes, &mut self.host, &self.cfg);
        let driven = drive(
            &mut *self.backend,
            pid,
            target,
            &[],
            &mut || copy_deadline(sizes, &mut **host, cfg, step, pid, known),
            steps,
        );
        match driven {
            Ok(Driven::Reached) => Ok(()),
            Ok(Driven::LessAdvanced(state)) => {
                // Someone else changed it; do not re-lock.
                self.log(
                    Level::Warn,
                    &format!("pid {pid} is {state}, was {target} at dump start; leaving it"),
                );
                Ok(())
            }
            Err(DriveError::Backend(cause)) => Err(EngineError::Backend { step, pid, cause }),
            Err(DriveError::BadState(state)) => Err(EngineError::BadState { step, pid, state }),
        }
    }

    /// RESUME_DEVICES_LATE: the restored task is still ptrace-stopped. A failure is returned to
    /// CRIU; on hosts that ignore it (CRIU 4.1/4.2) the task is also killed or left as it is,
    /// per [`EngineConfig::on_restore_failure`].
    pub fn resume_devices_late(&mut self, pid: Pid) -> Result<Outcome, EngineError> {
        self.track_restore_tree(pid);
        if self.cfg.parallel > 1 && self.restore_batch.is_none() {
            // CRIU calls RESUME_DEVICES_LATE for every restored task in one loop before it
            // releases them (criu/cr-restore.c, restore_root_task): the first call starts all.
            let batch = self.restore_batch_run(pid);
            self.restore_batch = Some(batch);
            self.batch_ran = true;
        }
        // One read of the task's pid namespace identity per call (see `image_pid`).
        let key = self.image_pid(pid);
        self.resumed.insert(key);
        let batched = self
            .restore_batch
            .as_mut()
            .and_then(|b| take_result(b, pid));
        let r = match batched {
            Some(r) => r,
            None => self.resume_task(pid, key),
        };
        if let Err(e) = &r {
            self.after_failed_restore(pid, e);
        }
        r
    }

    fn after_failed_restore(&mut self, pid: Pid, e: &EngineError) {
        if !self.cfg.late_errors_ignored {
            return; // the host fails the restore itself
        }
        match self.cfg.on_restore_failure {
            RestoreFailure::Kill => match self.threads.kill_task(pid) {
                Ok(()) => self.log(
                    Level::Error,
                    &format!(
                        "RESUME_DEVICES_LATE pid {pid}: killed the task \
                         (cuda_plugin.on-restore-failure=kill): its GPU state could not be \
                         restored ({}), and this CRIU releases a task whatever this hook \
                         returns; the images are intact, so the restore can be retried",
                        crate::message::quote(&Report(e).to_string())
                    ),
                ),
                Err(k) => self.log(
                    Level::Error,
                    &format!(
                        "RESUME_DEVICES_LATE pid {pid}: could not kill the task whose GPU state \
                         could not be restored: {k}"
                    ),
                ),
            },
            RestoreFailure::Leave => {
                self.log(
                    Level::Error,
                    &format!(
                        "RESUME_DEVICES_LATE pid {pid}: the task is left checkpointed or locked \
                         (cuda_plugin.on-restore-failure=leave): its next CUDA call blocks until \
                         its GPU state is restored by hand (cuda-checkpoint --action restore \
                         --pid {pid}, then --action unlock --pid {pid})"
                    ),
                );
            }
        }
    }

    /// At the first RESUME_DEVICES_LATE (CRIU calls it for the tree's root first): hands every
    /// CUDA task of the restored tree to the guardian, so that CRIU's death halfway through the
    /// loop leaves none of them checkpointed, not only those the loop has reached.
    fn track_restore_tree(&mut self, root: Pid) {
        if self.guard.is_none() || std::mem::replace(&mut self.restore_tracked, true) {
            return;
        }
        let Some(list) = &self.cfg.restore_tasks else {
            return;
        };
        let tree = self.host.tree(root);
        let pairs = self.cfg.pairs.clone();
        // The list is keyed by pid in the tree's own pid namespace; the guardian needs host pids.
        let tasks: Vec<(Pid, CUprocessState, Option<u64>)> = tree
            .iter()
            .filter_map(|&p| {
                let key = self.threads.ns_pid(p).unwrap_or(p);
                let img = list.get(&key)?;
                (img.initial_state != CUprocessState::CHECKPOINTED)
                    .then(|| (p, img.initial_state, img.total_bytes()))
            })
            .collect();
        for (p, initial, bytes) in tasks {
            self.guard_note(|g| g.track(p, initial, bytes, &pairs));
        }
    }

    /// The pid the images name `pid` by: its pid in its own pid namespace (what a restore into
    /// a new pid namespace keeps), else the pid itself.
    fn image_pid(&self, pid: Pid) -> Pid {
        self.threads.ns_pid(pid).unwrap_or(pid)
    }

    /// The image pid of every CUDA task of the dump (see [`Engine::image_pid`]), by host pid. Two
    /// tasks with the same pid in their own namespaces (nested pid namespaces) cannot be told
    /// apart that way: then the images use host pids, and say so once.
    fn image_keys(&mut self) -> BTreeMap<Pid, Pid> {
        if let Some(k) = &self.image_keys {
            return k.clone();
        }
        let mut keys: BTreeMap<Pid, Pid> = self
            .tasks
            .iter()
            .map(|t| (t.pid, self.image_pid(t.pid)))
            .collect();
        let distinct: std::collections::BTreeSet<Pid> = keys.values().copied().collect();
        if distinct.len() != keys.len() {
            self.log(
                Level::Warn,
                "two CUDA tasks of the tree have the same pid in their own pid namespaces (nested \
                 pid namespaces): the images name the tasks by host pid, so a restore that \
                 changes their host pids cannot find their GPU state",
            );
            keys = keys.keys().map(|&p| (p, p)).collect();
        }
        self.image_keys = Some(keys.clone());
        keys
    }

    /// What the dump recorded about `pid` (named `key` in the images): its restore thread and
    /// its initial state, or `None` when it had no CUDA state.
    fn dump_record(&mut self, pid: Pid, key: Pid) -> Result<Option<TaskImage>, EngineError> {
        let step = Step::Resume;
        if let Some(list) = &self.cfg.restore_tasks {
            return Ok(list.get(&key).cloned());
        }
        // An image from before the task list: this task's own image, if any.
        match self
            .host
            .read_task_image(key)
            .map_err(|cause| EngineError::ImageIo { step, pid, cause })?
        {
            Some(bytes) => TaskImage::decode(&bytes, key)
                .map(Some)
                .map_err(|cause| EngineError::ImageFormat { pid, cause }),
            None => Ok(None),
        }
    }

    /// What restoring `pid` (named `key` in the images, [`Engine::image_pid`]) involves: its
    /// restore thread, its dump-time state and its deadline; or the outcome when there is
    /// nothing to restore (not a CUDA task, or one the dump left checkpointed).
    fn plan_resume(
        &mut self,
        pid: Pid,
        key: Pid,
    ) -> Result<Result<ResumePlan, Outcome>, EngineError> {
        let step = Step::Resume;
        let be = |cause| EngineError::Backend { step, pid, cause };
        let listed = self.cfg.restore_tasks.is_some();
        let record = self.dump_record(pid, key)?;
        if listed && record.is_none() {
            return Ok(Err(Outcome::NotMine)); // the dump's task list says: no CUDA state
        }
        // A tree restored into a new pid namespace has new host pids and tids: the recorded
        // restore thread's tid names nothing then.
        let same_pids = key == pid;
        let (tid, initial) = match &record {
            Some(img) if same_pids && self.threads.thread_exists(pid, img.restore_tid) => {
                (img.restore_tid, img.initial_state)
            }
            _ => match self.backend.get_restore_tid(pid).map_err(be)? {
                Some(tid) => (
                    tid,
                    record
                        .as_ref()
                        .map_or(CUprocessState::RUNNING, |r| r.initial_state),
                ),
                None if listed => return Err(EngineError::NoRestoreThread { pid }),
                None => return Ok(Err(Outcome::NotMine)),
            },
        };
        if initial == CUprocessState::CHECKPOINTED {
            self.log(
                Level::Info,
                &format!("pid {pid} was already checkpointed at dump time; leaving it so"),
            );
            return Ok(Err(Outcome::Handled));
        }
        if let Some(custom) = record.as_ref().and_then(|r| r.custom.clone()) {
            self.backend.set_custom_recorded(pid, custom);
        }
        let bytes = record.as_ref().and_then(TaskImage::total_bytes);
        let deadline = self.copy_deadline(step, pid, bytes);
        Ok(Ok(ResumePlan {
            pid,
            tid,
            initial,
            bytes,
            deadline,
            checkpoint_ms: record.as_ref().and_then(|r| r.checkpoint_ms),
        }))
    }

    /// Tells the guardian what is about to happen to `plan`'s task and resumes its restore
    /// thread.
    fn start_resume(&mut self, plan: &ResumePlan) -> Result<crate::thread::Resumed, EngineError> {
        let pid = plan.pid;
        let pairs = self.cfg.pairs.clone();
        let (initial, bytes) = (plan.initial, plan.bytes);
        self.guard_note(|g| g.track(pid, initial, bytes, &pairs));
        self.guard_note(|g| g.intent(pid, Op::Restore));
        self.resume_thread(Step::Resume, pid, plan.tid)
    }

    /// Logs a restored task and tells the guardian it is in its final state.
    fn resumed_log(&mut self, plan: &ResumePlan, restore_ms: u64) {
        let pid = plan.pid;
        if let Some(s) = self.backend.custom_summary(pid) {
            self.log(
                Level::Info,
                &format!("pid {pid}: restored from custom storage: {s}"),
            );
        }
        let size = match (plan.bytes, plan.checkpoint_ms) {
            (Some(b), Some(c)) => format!(
                " ({} in {restore_ms} ms; its checkpoint took {c} ms)",
                crate::nvml::gib(b)
            ),
            (Some(b), None) => format!(" ({} in {restore_ms} ms)", crate::nvml::gib(b)),
            (None, _) => String::new(),
        };
        self.log(
            Level::Info,
            &format!(
                "pid {pid}: restored, now {}{size}",
                if plan.initial == CUprocessState::RUNNING {
                    "running"
                } else {
                    "locked"
                }
            ),
        );
        // In its final state: nothing for the guardian to finish should CRIU die now.
        self.guard_note(|g| g.untrack(pid));
    }

    /// Restores the GPU state of `pid`, named `key` in the images ([`Engine::image_pid`]).
    fn resume_task(&mut self, pid: Pid, key: Pid) -> Result<Outcome, EngineError> {
        let step = Step::Resume;
        let be = |cause| EngineError::Backend { step, pid, cause };
        let plan = match self.plan_resume(pid, key)? {
            Ok(plan) => plan,
            Err(outcome) => return Ok(outcome),
        };
        let resumed = self.start_resume(&plan)?;
        let started = std::time::Instant::now();
        let pairs = self.cfg.pairs.clone();
        let mut done = self.backend.restore(pid, &pairs, plan.deadline).map_err(be);
        let restore_ms = crate::message::millis(started.elapsed());
        if done.is_ok() && plan.initial == CUprocessState::RUNNING {
            done = self.backend.unlock(pid).map_err(be);
        }
        let stopped = self.threads.restop(resumed);
        done?;
        stopped.map_err(|cause| EngineError::Thread { step, pid, cause })?;
        self.resumed_log(&plan, restore_ms);
        Ok(Outcome::Handled)
    }

    /// Parallel mode: restores every task of the restored tree under `root` (the first
    /// RESUME_DEVICES_LATE's task) that the dump recorded, at most [`EngineConfig::parallel`]
    /// at a time: plan each, resume each restore thread, run the restores together, then the
    /// unlocks of the tasks that were running at dump time, and stop each thread again. Each
    /// task's result waits for its own RESUME_DEVICES_LATE call.
    fn restore_batch_run(&mut self, root: Pid) -> Vec<(Pid, Result<Outcome, EngineError>)> {
        let step = Step::Resume;
        let mut results = Vec::new();
        let mut running = Vec::new();
        for p in self.host.tree(root) {
            let key = self.image_pid(p);
            let plan = match self.plan_resume(p, key) {
                Ok(Ok(plan)) => plan,
                Ok(Err(outcome)) => {
                    results.push((p, Ok(outcome)));
                    continue;
                }
                Err(e) => {
                    results.push((p, Err(e)));
                    continue;
                }
            };
            match self.start_resume(&plan) {
                Ok(resumed) => running.push((plan, resumed)),
                Err(e) => {
                    results.push((p, Err(e)));
                }
            }
        }
        if running.is_empty() {
            return results;
        }
        let jobs: Vec<Job> = running
            .iter()
            .map(|(plan, _)| Job {
                pid: plan.pid,
                deadline: plan.deadline,
            })
            .collect();
        let width = self.width(jobs.len());
        self.log(
            Level::Info,
            &format!(
                "{step}: restoring {} task(s), {width} at a time (parallel mode)",
                jobs.len()
            ),
        );
        let pairs = self.cfg.pairs.clone();
        let restored = self.backend.restore_many(&jobs, &pairs, width);
        let mut outcome: Vec<(Result<(), BackendError>, u64)> = restored
            .into_iter()
            .map(|(r, took)| (r, crate::message::millis(took)))
            .collect();
        let unlock: Vec<usize> = (0..running.len())
            .filter(|&k| outcome[k].0.is_ok() && running[k].0.initial == CUprocessState::RUNNING)
            .collect();
        let pids: Vec<Pid> = unlock.iter().map(|&k| running[k].0.pid).collect();
        if !pids.is_empty() {
            let unlocked = self.backend.unlock_many(&pids, self.width(pids.len()));
            for (&k, (r, _)) in unlock.iter().zip(unlocked) {
                outcome[k].0 = r;
            }
        }
        for ((plan, resumed), (r, restore_ms)) in running.into_iter().zip(outcome) {
            let pid = plan.pid;
            let stopped = self.threads.restop(resumed);
            let r = r
                .map_err(|cause| EngineError::Backend { step, pid, cause })
                .and_then(|()| stopped.map_err(|cause| EngineError::Thread { step, pid, cause }));
            if r.is_ok() {
                self.resumed_log(&plan, restore_ms);
            }
            results.push((pid, r.map(|()| Outcome::Handled)));
        }
        results
    }

    /// `exit(RESTORE, ret)`: reports every task of the dump's task list that CRIU never called
    /// RESUME_DEVICES_LATE for (it cannot have had its GPU state restored).
    pub fn restore_finish(&mut self, ret: i32) {
        let Some(list) = &self.cfg.restore_tasks else {
            return;
        };
        let missed: Vec<Pid> = list
            .keys()
            .filter(|p| !self.resumed.contains(p))
            .copied()
            .collect();
        if !missed.is_empty() && ret == 0 {
            self.log(
                Level::Error,
                &format!(
                    "restore: CRIU never called RESUME_DEVICES_LATE for pid(s) {missed:?}, which \
                     had CUDA state at dump time; their GPU state was not restored"
                ),
            );
        }
    }
}

/// All the memory of all GPUs: NVML's, else the driver's enumeration (once).
fn all_gpu_bytes(sizes: &mut Sizes, host: &mut dyn Host, cfg: &EngineConfig) -> u64 {
    if let Some(b) = sizes.all_gpus {
        return b;
    }
    let b = match host.current_gpus(cfg.timeout) {
        Ok(gpus) => gpus.iter().map(|g| g.memory_bytes).sum(),
        Err(why) => {
            host.log(
                Level::Warn,
                &format!("cannot size copies by the GPUs' memory ({why})"),
            );
            0
        }
    };
    sizes.all_gpus = Some(b);
    b
}

/// The deadline of a checkpoint or restore of `pid` moving `bytes` (unknown: all GPU memory):
/// the timeout plus what the bytes take at the minimum copy rate.
fn copy_deadline(
    sizes: &mut Sizes,
    host: &mut dyn Host,
    cfg: &EngineConfig,
    step: Step,
    pid: Pid,
    bytes: Option<u64>,
) -> Option<Duration> {
    let (bytes, how) = match bytes {
        Some(b) => (b, "its GPU memory"),
        None => (
            all_gpu_bytes(sizes, host, cfg),
            "all GPU memory, its own being unknown",
        ),
    };
    let d = crate::nvml::copy_deadline(cfg.timeout, bytes, cfg.copy_rate());
    if let Some(d) = d {
        host.log(
            Level::Debug,
            &format!(
                "{step} pid {pid}: deadline {} s for {} ({how})",
                crate::message::Tenths(d.as_secs_f64()),
                crate::nvml::gib(bytes)
            ),
        );
    }
    d
}

#[cfg(test)]
pub(crate) mod tests;
