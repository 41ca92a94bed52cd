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

use crate::backend::{op_deadline, Backend, BackendError, GpuPair, Op, Pid, Tid};
use crate::host::{Host, HostError, Level};
use crate::image::{ImageError, TaskImage};
use crate::thread::{ThreadControl, ThreadError};
use crate::timing::{Spent, SpentTimes, TimedBackend, TimedThreads};
use abi::CUprocessState;
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

/// A lifecycle failure.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{step} pid {pid}: {cause}")]
    Backend {
        step: Step,
        pid: Pid,
        cause: BackendError,
    },
    #[error("{step} pid {pid}: {cause}")]
    Thread {
        step: Step,
        pid: Pid,
        cause: ThreadError,
    },
    #[error("{step} pid {pid}: the CUDA state is {state}, which cannot be checkpointed")]
    BadState {
        step: Step,
        pid: Pid,
        state: CUprocessState,
    },
    #[error("CHECKPOINT_DEVICES pid {pid}: failed to add cuda_plugin to the inventory: {cause}")]
    Inventory { pid: Pid, cause: HostError },
    #[error("{step} pid {pid}: task image: {cause}")]
    ImageIo {
        step: Step,
        pid: Pid,
        cause: HostError,
    },
    #[error("CHECKPOINT_DEVICES pid {pid}: {cause}")]
    GpuInventory {
        pid: Pid,
        cause: crate::inventory::InventoryError,
    },
    #[error("RESUME_DEVICES_LATE pid {pid}: task image: {cause}")]
    ImageFormat { pid: Pid, cause: ImageError },
    #[error("dump finish: {} task(s) could not be put back in their initial CUDA state: pids {pids:?}", pids.len())]
    RollbackIncomplete { pids: Vec<Pid> },
}

/// Settings fixed at `init`.
#[derive(Debug, Clone, Default)]
pub struct EngineConfig {
    /// Per-operation timeout; `None` = none.
    pub timeout: Option<Duration>,
    /// GPU remapping for restore.
    pub pairs: Vec<GpuPair>,
    /// The tasks stay alive after the dump (`--leave-running`, CRIU's `final_state == TASK_ALIVE`).
    pub leave_running: bool,
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
    finished: bool,
    /// Time spent in the backend and in restore-thread control (see [`Engine::take_spent`]).
    spent: Arc<Spent>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("backend", &self.backend.kind())
            .field("cfg", &self.cfg)
            .field("tasks", &self.tasks)
            .field("inventory_added", &self.inventory_added)
            .field("finished", &self.finished)
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
            finished: false,
            spent,
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

    /// PAUSE_DEVICES: the task is still running.
    pub fn pause_devices(&mut self, pid: Pid) -> Result<Outcome, EngineError> {
        let step = Step::Pause;
        let be = |cause| EngineError::Backend { step, pid, cause };
        if self.index(pid).is_some() {
            return Ok(Outcome::Handled);
        }
        let Some(tid) = self.backend.get_restore_tid(pid).map_err(be)? else {
            self.log(
                Level::Debug,
                &format!("pid {pid} has no CUDA restore thread; not ours"),
            );
            return Ok(Outcome::NotMine);
        };
        let initial = self.backend.get_state(pid).map_err(be)?;
        let mut rec = TaskRecord {
            pid,
            restore_tid: tid,
            initial,
            locked_by_us: false,
            checkpointed_by_us: false,
        };
        match initial {
            CUprocessState::RUNNING => {
                if let Err(cause) = self.backend.lock(pid, self.cfg.timeout) {
                    // Leave the task as found. A lock that timed out may still complete late, so
                    // query and undo rather than assume.
                    if !self.unlock_if_locked(pid) {
                        rec.locked_by_us = true;
                        self.tasks.push(rec);
                    }
                    return Err(be(cause));
                }
                rec.locked_by_us = true;
            }
            CUprocessState::LOCKED | CUprocessState::CHECKPOINTED => {
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

    /// After a failed lock of a running (unseized) task: unlock it if the lock took effect after
    /// all. Returns true when the task is known to be back to RUNNING.
    fn unlock_if_locked(&mut self, pid: Pid) -> bool {
        match self.backend.get_state(pid) {
            Ok(CUprocessState::RUNNING) => true,
            Ok(CUprocessState::LOCKED) => match self.backend.unlock(pid) {
                Ok(()) => true,
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
        let Some(i) = self.index(pid) else {
            return Ok(Outcome::NotMine);
        };
        let rec = self.tasks[i].clone();
        if rec.initial != CUprocessState::CHECKPOINTED {
            let resumed = self.resume_thread(step, pid, rec.restore_tid)?;
            // Marked before the call: a checkpoint that reports a failure (a timeout, say) may
            // still have happened, and the rollback is state-driven anyway.
            self.tasks[i].checkpointed_by_us = true;
            let done = self.backend.checkpoint(pid);
            let stopped = self.threads.restop(resumed);
            done.map_err(|cause| EngineError::Backend { step, pid, cause })?;
            stopped.map_err(|cause| EngineError::Thread { step, pid, cause })?;
        }
        let image = TaskImage {
            pid,
            restore_tid: rec.restore_tid,
            initial_state: rec.initial,
        };
        self.host
            .write_task_image(pid, &image.encode())
            .map_err(|cause| EngineError::ImageIo { step, pid, cause })?;
        if !self.inventory_added {
            self.write_gpu_inventory(pid)?;
            self.host
                .add_inventory_entry()
                .map_err(|cause| EngineError::Inventory { pid, cause })?;
            self.inventory_added = true;
        }
        self.log(Level::Info, &format!("pid {pid}: checkpointed"));
        Ok(Outcome::Handled)
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

    /// DUMP_FINISH(ret), or `exit(DUMP, ret)` on hosts without that hook. Runs once; later calls
    /// do nothing. `ret` is the dump result (non-zero = failed).
    pub fn dump_finish(&mut self, ret: i32) -> Result<(), EngineError> {
        if std::mem::replace(&mut self.finished, true) {
            return Ok(());
        }
        if ret == 0 && !self.cfg.leave_running {
            return Ok(());
        }
        let why = if ret != 0 {
            "the dump failed"
        } else {
            "the tasks stay running"
        };
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
            // A call of an earlier put-back that timed out must not block this task's.
            self.backend.settle(Duration::ZERO);
            match self.put_back(&rec) {
                Ok(()) => {
                    self.tasks[i].locked_by_us = false;
                    self.tasks[i].checkpointed_by_us = false;
                    self.log(
                        Level::Info,
                        &format!("pid {}: back to {} ({why})", rec.pid, rec.initial),
                    );
                }
                Err(e) => {
                    self.log(Level::Error, &format!("{e}; the task is left as it is"));
                    failed.push(rec.pid);
                }
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            let e = EngineError::RollbackIncomplete { pids: failed };
            self.log(Level::Error, &e.to_string());
            Err(e)
        }
    }

    /// Before a rollback: a driver call abandoned on timeout (a lock that took too long, say)
    /// blocks every other call until it returns, and may still take effect. Wait for it, at most
    /// one lock deadline, so the state-driven rollback sees (and undoes) whatever it did; after
    /// that, stop waiting for it, so that it cannot keep the other tasks locked.
    fn settle_abandoned_call(&mut self) {
        let Some(limit) = op_deadline(Op::Lock, self.cfg.timeout) else {
            return; // no timeout: no call is ever abandoned
        };
        let t = std::time::Instant::now();
        if self.backend.settle(limit) {
            let waited = t.elapsed();
            if waited >= Duration::from_millis(1) {
                self.log(
                    Level::Info,
                    &format!(
                        "dump finish: waited {:.1} ms for a timed-out driver call to return",
                        waited.as_secs_f64() * 1000.0
                    ),
                );
            }
        } else {
            self.log(
                Level::Error,
                &format!(
                    "dump finish: a timed-out driver call is still blocked after another \
                     {limit:?}; putting the tasks back without waiting for it"
                ),
            );
        }
    }

    /// Drives one task back to its initial state: resume its restore thread (if CRIU holds it),
    /// query the state, act, stop the thread again.
    fn put_back(&mut self, rec: &TaskRecord) -> Result<(), EngineError> {
        let (step, pid) = (Step::DumpFinish, rec.pid);
        let resumed = self.resume_thread(step, pid, rec.restore_tid)?;
        let driven = self.drive_to(pid, rec.initial);
        let stopped = self.threads.restop(resumed);
        driven?;
        stopped.map_err(|cause| EngineError::Thread { step, pid, cause })
    }

    fn drive_to(&mut self, pid: Pid, target: CUprocessState) -> Result<(), EngineError> {
        let step = Step::DumpFinish;
        let be = |cause| EngineError::Backend { step, pid, cause };
        let mut state = self.backend.get_state(pid).map_err(be)?;
        loop {
            match (state, target) {
                (s, t) if s == t => return Ok(()),
                (CUprocessState::CHECKPOINTED, _) => {
                    // No remapping: the GPUs are the ones it was checkpointed from.
                    self.backend.restore(pid, &[]).map_err(be)?;
                    state = CUprocessState::LOCKED;
                }
                (CUprocessState::LOCKED, CUprocessState::RUNNING) => {
                    self.backend.unlock(pid).map_err(be)?;
                    state = CUprocessState::RUNNING;
                }
                (CUprocessState::RUNNING | CUprocessState::LOCKED, _) => {
                    // Less advanced than it was found: someone else changed it; do not re-lock.
                    self.log(
                        Level::Warn,
                        &format!("pid {pid} is {state}, was {target} at dump start; leaving it"),
                    );
                    return Ok(());
                }
                (state, _) => return Err(EngineError::BadState { step, pid, state }),
            }
        }
    }

    /// RESUME_DEVICES_LATE: the restored task is still ptrace-stopped.
    pub fn resume_devices_late(&mut self, pid: Pid) -> Result<Outcome, EngineError> {
        let step = Step::Resume;
        let be = |cause| EngineError::Backend { step, pid, cause };
        let image = match self
            .host
            .read_task_image(pid)
            .map_err(|cause| EngineError::ImageIo { step, pid, cause })?
        {
            Some(bytes) => Some(
                TaskImage::decode(&bytes, pid)
                    .map_err(|cause| EngineError::ImageFormat { pid, cause })?,
            ),
            None => None,
        };
        let (tid, initial) = match image {
            Some(img) if self.threads.thread_exists(pid, img.restore_tid) => {
                (img.restore_tid, img.initial_state)
            }
            _ => match self.backend.get_restore_tid(pid).map_err(be)? {
                Some(tid) => (tid, CUprocessState::RUNNING),
                None => return Ok(Outcome::NotMine),
            },
        };
        if initial == CUprocessState::CHECKPOINTED {
            self.log(
                Level::Info,
                &format!("pid {pid} was already checkpointed at dump time; leaving it so"),
            );
            return Ok(Outcome::Handled);
        }
        let resumed = self.resume_thread(step, pid, tid)?;
        let pairs = self.cfg.pairs.clone();
        let mut done = self.backend.restore(pid, &pairs).map_err(be);
        if done.is_ok() && initial == CUprocessState::RUNNING {
            done = self.backend.unlock(pid).map_err(be);
        }
        let stopped = self.threads.restop(resumed);
        done?;
        stopped.map_err(|cause| EngineError::Thread { step, pid, cause })?;
        self.log(
            Level::Info,
            &format!(
                "pid {pid}: restored, now {}",
                if initial == CUprocessState::RUNNING {
                    "running"
                } else {
                    "locked"
                }
            ),
        );
        Ok(Outcome::Handled)
    }
}

#[cfg(test)]
pub(crate) mod tests;
