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
//!
//! **Where things are.** The session holds an [`Engine`]: a [`dump::Dump`] (PAUSE_DEVICES,
//! CHECKPOINT_DEVICES, DUMP_FINISH; its locks in `dump/lock.rs`, its survey of the tree's GPU
//! memory in `dump/survey.rs`, its rollback in `dump/rollback.rs`) or a [`restore::Restore`]
//! (RESUME_DEVICES_LATE, `exit(RESTORE)`), each with its own state on a shared [`Core`] (the
//! backend, restore-thread control, the host, the settings, the guardian).
//! [`crate::backend::drive::drive`], the state-driven walk back to a task's target state, serves
//! the rollback and the guardian;
//! [`EngineError`] and its messages are in `error.rs`.

mod common;
pub mod dump;
mod error;
pub mod restore;

pub use common::Core;
pub use error::{EngineError, Step};

use crate::backend::{GpuPair, Pid};
use crate::image::TaskImage;
use crate::options::RestoreFailure;
use dump::Dump;
use restore::Restore;
use std::collections::BTreeMap;
use std::time::Duration;

/// What a per-task hook did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The task has CUDA state and the hook handled it (hook returns 0).
    Handled,
    /// Not a CUDA task (hook returns `-ENOTSUP`, so other plugins still see it).
    NotMine,
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
    /// time (see [`Dump::checkpoint_devices`]).
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

/// The lifecycle engine of one CRIU operation, as the session holds it: a dump or a restore
/// (CRIU runs them in different processes, each with its own `init`).
#[derive(Debug)]
pub enum Engine {
    Dump(Dump),
    Restore(Restore),
}

impl Engine {
    /// What both kinds share (the backend, the time spent, the batch flag).
    #[must_use]
    pub fn core(&self) -> &Core {
        match self {
            Engine::Dump(d) => d.core(),
            Engine::Restore(r) => r.core(),
        }
    }

    /// [`Engine::core`], to take what it counts.
    pub fn core_mut(&mut self) -> &mut Core {
        match self {
            Engine::Dump(d) => d.core_mut(),
            Engine::Restore(r) => r.core_mut(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
