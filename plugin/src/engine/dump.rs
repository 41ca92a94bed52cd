//! The dump: PAUSE_DEVICES, CHECKPOINT_DEVICES, and DUMP_FINISH or `exit(DUMP)` (see [`super`]
//! for what each does). The locks are in `lock`, the survey of the tree's GPU memory in
//! `survey`, the rollback in `rollback`.

mod lock;
mod rollback;
mod survey;

pub use lock::{ALARM_RESERVE, MIN_LOCK_WINDOW};

use super::common::{take_result, Core};
use super::{EngineError, Outcome, Step};
use crate::backend::{Job, Op, Pid, Tid};
use crate::host::Level;
use crate::image::TaskImage;
use abi::CUprocessState;
use std::collections::BTreeMap;
use survey::Sizes;

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

/// A dump: its tasks, what it did to each of them, and how far it got.
#[derive(Debug)]
pub struct Dump {
    core: Core,
    /// The CUDA tasks, in PAUSE_DEVICES order.
    tasks: Vec<TaskRecord>,
    inventory_added: bool,
    finish: Finish,
    /// The tasks' image pids, by host pid, once the first image is written (see
    /// [`Dump::image_keys`]).
    image_keys: Option<BTreeMap<Pid, Pid>>,
    sizes: Sizes,
    /// Parallel mode: each task's checkpoint result (its duration in ms), from the batch the
    /// first CHECKPOINT_DEVICES started; taken by the task's own call.
    checkpoint_batch: Option<Vec<(Pid, Result<u64, EngineError>)>>,
    /// Parallel mode: the tasks the first PAUSE_DEVICES locked ahead (with their restore
    /// threads) or failed to, until each task's own call takes its result (see
    /// [`Dump::lock_ahead`]).
    ahead: Option<Ahead>,
}

/// What the lock-ahead did to each task it probed: its restore thread when it locked it (`None`:
/// not a CUDA task), or the failure its own call returns (see [`Dump::lock_ahead`]).
type Ahead = Vec<(Pid, Result<Option<Tid>, EngineError>)>;

/// The record of a task locked ahead ([`Dump::lock_ahead`]): RUNNING at dump start, locked
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

impl Dump {
    /// A dump that runs on `core`.
    #[must_use]
    pub fn new(core: Core) -> Self {
        Dump {
            core,
            tasks: Vec::new(),
            inventory_added: false,
            finish: Finish::Pending,
            image_keys: None,
            sizes: Sizes::default(),
            checkpoint_batch: None,
            ahead: None,
        }
    }

    /// What the dump shares with a restore: the backend, the time spent, the batch flag.
    #[must_use]
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// [`Dump::core`], to take what it counts.
    pub fn core_mut(&mut self) -> &mut Core {
        &mut self.core
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

    /// The per-task records, in PAUSE_DEVICES order.
    #[must_use]
    pub fn tasks(&self) -> &[TaskRecord] {
        &self.tasks
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
                if self.core.cfg.parallel > 1 && self.ahead.is_none() {
                    self.ahead = Some(self.lock_ahead(pid));
                    return self.pause_devices(pid);
                }
                let Some(tid) = self.core.backend.get_restore_tid(pid).map_err(be)? else {
                    self.core.log(
                        Level::Debug,
                        &format!("pid {pid} has no CUDA restore thread; not ours"),
                    );
                    return Ok(Outcome::NotMine);
                };
                let initial = self.core.backend.get_state(pid).map_err(be)?;
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
            // Locked ahead ([`Dump::lock_ahead`]).
            _ if rec.locked_by_us => {}
            CUprocessState::RUNNING => {
                if let Some(state) = self.core.threads.stopped(pid, tid) {
                    return Err(EngineError::Stopped { pid, tid, state });
                }
                self.survey(pid)?;
                let (limits, alarm_left) = self.lock_limits(pid, 1)?;
                let bytes = self.known_bytes(pid);
                self.core.guard_note(|g| g.track(pid, initial, bytes, &[]));
                self.core.guard_note(|g| g.intent(pid, Op::Lock));
                let started = std::time::Instant::now();
                if let Err(cause) = self.core.backend.lock(pid, limits) {
                    let took = started.elapsed();
                    // In sequential mode the tree's tasks are locked one at a time.
                    let narrow = (self.core.cfg.parallel <= 1).then_some(1);
                    return Err(self.failed_lock(rec, cause, limits, took, alarm_left, narrow));
                }
                rec.locked_by_us = true;
            }
            CUprocessState::LOCKED | CUprocessState::CHECKPOINTED => {
                if initial == CUprocessState::LOCKED {
                    // Its checkpoint is ours to undo.
                    let bytes = self.known_bytes(pid);
                    self.core.guard_note(|g| g.track(pid, initial, bytes, &[]));
                }
                self.core.log(
                    Level::Info,
                    &format!("pid {pid} is already {initial}; leaving its lock alone"),
                );
            }
            state => return Err(EngineError::BadState { step, pid, state }),
        }
        self.core.log(
            Level::Info,
            &format!(
                "pid {pid}: restore thread {tid}, initial state {initial}, locked: {}",
                rec.locked_by_us
            ),
        );
        self.tasks.push(rec);
        Ok(Outcome::Handled)
    }

    /// CHECKPOINT_DEVICES: the whole tree is ptrace-stopped.
    pub fn checkpoint_devices(&mut self, pid: Pid) -> Result<Outcome, EngineError> {
        let step = Step::Checkpoint;
        self.put_back_ahead()?;
        if self.core.cfg.parallel > 1 && self.checkpoint_batch.is_none() {
            // CRIU calls CHECKPOINT_DEVICES for every task in one loop with the whole tree
            // frozen (criu/seize.c, checkpoint_devices): the first call starts them all.
            let batch = self.checkpoint_batch_run();
            self.checkpoint_batch = Some(batch);
            self.core.batch_ran = true;
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
            let done = self.core.backend.checkpoint(pid, job.deadline);
            checkpoint_ms = Some(crate::message::millis(started.elapsed()));
            let stopped = self.core.threads.restop(resumed);
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
            custom: self.core.backend.custom_written(pid),
        };
        self.core
            .host
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
            self.core
                .host
                .write_task_list(&list.encode())
                .map_err(|cause| EngineError::ImageIo { step, pid, cause })?;
            self.write_gpu_inventory(pid)?;
            self.core
                .host
                .add_inventory_entry()
                .map_err(|cause| EngineError::Inventory { pid, cause })?;
            self.inventory_added = true;
        }
        match self.core.backend.custom_summary(pid) {
            Some(s) => self.core.log(
                Level::Info,
                &format!("pid {pid}: checkpointed into custom storage: {s}"),
            ),
            None => self
                .core
                .log(Level::Info, &format!("pid {pid}: checkpointed")),
        }
        Ok(Outcome::Handled)
    }

    /// What every checkpoint of task `i` starts with: its deadline (by its GPU memory), its
    /// restore thread resumed, the record marked and the guardian told.
    fn start_checkpoint(&mut self, i: usize) -> Result<(Job, crate::thread::Resumed), EngineError> {
        let step = Step::Checkpoint;
        let (pid, tid) = (self.tasks[i].pid, self.tasks[i].restore_tid);
        let bytes = self.copy_bytes(pid);
        let deadline = self.core.copy_deadline(step, pid, bytes);
        let resumed = self.core.resume_thread(step, pid, tid)?;
        // Marked before the call: a checkpoint that reports a failure (a timeout, say) may
        // still have happened, and the rollback is state-driven anyway.
        self.tasks[i].checkpointed_by_us = true;
        self.core.guard_note(|g| g.intent(pid, Op::Checkpoint));
        Ok((Job { pid, deadline }, resumed))
    }

    /// Parallel mode: checkpoints every task of the dump that is not checkpointed yet, at most
    /// [`EngineConfig::parallel`](crate::engine::EngineConfig::parallel) at a time: resume each
    /// restore thread (from CRIU's thread, the tracer), run the checkpoints together
    /// ([`Backend::checkpoint_many`](crate::backend::Backend::checkpoint_many)), stop each thread
    /// again exactly as CRIU left it. Each task's result waits for its own CHECKPOINT_DEVICES call;
    /// a task whose thread could not be resumed has nothing started. Should CRIU stop calling
    /// (another task failed), the tasks checkpointed here are put back by the dump's rollback like
    /// any other (they are marked `checkpointed_by_us`).
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
        let width = self.core.width(jobs.len());
        self.core.log(
            Level::Info,
            &format!(
                "{step}: checkpointing {} task(s), {width} at a time (parallel mode)",
                jobs.len()
            ),
        );
        let done = self.core.backend.checkpoint_many(&jobs, width);
        for ((job, resumed), (r, took)) in running.into_iter().zip(done) {
            let pid = job.pid;
            let stopped = self.core.threads.restop(resumed);
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
        match self.core.host.current_gpus(self.core.cfg.timeout) {
            Ok(gpus) => {
                let bytes = crate::inventory::encode(&gpus).map_err(|cause| EngineError::GpuInventory { pid, cause })?;
                self.core.host
                    .write_gpu_inventory(&bytes)
                    .map_err(|cause| EngineError::ImageIo { step, pid, cause })?;
                let list: Vec<String> = gpus.iter().map(|g| format!("{}:{} ({})", g.ordinal, g.uuid, g.name)).collect();
                self.core.log(Level::Info, &format!("GPU inventory: {} GPU(s): {}", gpus.len(), list.join(", ")));
            }
            Err(why) => self.core.log(
                Level::Warn,
                &format!("no GPU inventory written ({why}); a restore onto other GPUs will need a complete UUID device map"),
            ),
        }
        Ok(())
    }

    /// The image pid of every CUDA task of the dump (see [`Core::image_pid`]), by host pid. Two
    /// tasks with the same pid in their own namespaces (nested pid namespaces) cannot be told
    /// apart that way: then the images use host pids, and say so once.
    fn image_keys(&mut self) -> BTreeMap<Pid, Pid> {
        if let Some(k) = &self.image_keys {
            return k.clone();
        }
        let mut keys: BTreeMap<Pid, Pid> = self
            .tasks
            .iter()
            .map(|t| (t.pid, self.core.image_pid(t.pid)))
            .collect();
        let distinct: std::collections::BTreeSet<Pid> = keys.values().copied().collect();
        if distinct.len() != keys.len() {
            self.core.log(
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
}
