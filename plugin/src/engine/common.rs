//! What a dump and a restore share: the backend, restore-thread control, the host, the
//! settings, the guardian, and the time spent in the first two ([`Core`]); and the deadline of a
//! copy of GPU memory.

use super::{EngineConfig, EngineError, Step};
use crate::agent::AgentError;
use crate::agent::Guard;
use crate::backend::drive::{drive, DriveError, Driven};
use crate::backend::{Backend, GpuPair, Pid, Tid};
use crate::host::{Host, Level};
use crate::thread::ThreadControl;
use crate::timing::{Spent, SpentTimes, TimedBackend, TimedThreads};
use abi::CUprocessState;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// What a dump and a restore share (see [`super::dump::Dump`], [`super::restore::Restore`]):
/// built at `init`, then handed to the one the operation is.
pub struct Core {
    /// The backend, timed (see [`Core::take_spent`]).
    pub(super) backend: Box<dyn Backend>,
    /// Restore-thread control, timed.
    pub(super) threads: Box<dyn ThreadControl>,
    pub(super) host: Box<dyn Host>,
    pub(super) cfg: EngineConfig,
    /// All the memory of all GPUs (the most a copy can move), once known.
    pub(super) all_gpus: Option<u64>,
    /// A batch ran in the current hook call (see [`Core::take_batch_ran`]).
    pub(super) batch_ran: bool,
    /// Time spent in the backend and in restore-thread control (see [`Core::take_spent`]).
    spent: Arc<Spent>,
    /// The guardian, when a helper process runs.
    guard: Option<Box<dyn Guard>>,
    /// A note to the guardian failed (logged once).
    guard_failed: bool,
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Core")
            .field("backend", &self.backend.kind())
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Core {
    /// The shared part of a dump or restore: `backend` and `threads` are timed (see
    /// [`Core::take_spent`]).
    pub fn new(
        backend: Box<dyn Backend>,
        threads: Box<dyn ThreadControl>,
        host: Box<dyn Host>,
        cfg: EngineConfig,
    ) -> Self {
        let spent = Arc::new(Spent::default());
        Core {
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
            all_gpus: None,
            batch_ran: false,
            spent,
            guard: None,
            guard_failed: false,
        }
    }

    /// Tells `guard`, before every state change, what is about to happen.
    #[must_use]
    pub fn with_guard(mut self, guard: Box<dyn Guard>) -> Self {
        self.guard = Some(guard);
        self
    }

    /// Whether the hook call just made ran a parallel batch (every task's work), and resets
    /// it: such a call took the batch's time even when its own task was not a CUDA task.
    pub fn take_batch_ran(&mut self) -> bool {
        std::mem::take(&mut self.batch_ran)
    }

    /// The time spent waiting on the backend and on restore-thread control since the last
    /// call (the hooks log it next to their total).
    pub fn take_spent(&self) -> SpentTimes {
        self.spent.take()
    }

    /// The backend (for statistics such as the CLI's execution count).
    #[must_use]
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    pub(super) fn log(&self, level: Level, msg: &str) {
        self.host.log(level, msg);
    }

    /// How many of `n` tasks' calls run at once in parallel mode; 1 (or 0) is sequential mode.
    pub(super) fn width(&self, n: usize) -> usize {
        self.cfg.parallel.min(n).max(1)
    }

    /// Sends one note to the guardian; the first failure is logged.
    pub(super) fn guard_note(&mut self, note: impl FnOnce(&dyn Guard) -> Result<(), AgentError>) {
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

    /// Resumes the restore thread and logs what happened.
    pub(super) fn resume_thread(
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

    /// The pid the images name `pid` by: its pid in its own pid namespace (what a restore into
    /// a new pid namespace keeps), else the pid itself.
    pub(super) fn image_pid(&self, pid: Pid) -> Pid {
        self.threads.ns_pid(pid).unwrap_or(pid)
    }

    /// The deadline of a checkpoint or restore of `pid` moving `bytes` (see [`copy_deadline`]).
    pub(super) fn copy_deadline(
        &mut self,
        step: Step,
        pid: Pid,
        bytes: Option<u64>,
    ) -> Option<Duration> {
        copy_deadline(
            &mut self.all_gpus,
            &mut *self.host,
            &self.cfg,
            step,
            pid,
            bytes,
        )
    }

    /// Whether a guardian is told what the plugin does.
    pub(super) fn has_guard(&self) -> bool {
        self.guard.is_some()
    }

    /// Drives `pid` to `target` ([`drive`]); a restore on the way gets the deadline of a copy
    /// of `bytes` (unknown: all GPU memory), logged under `step`.
    pub(super) fn drive(
        &mut self,
        step: Step,
        pid: Pid,
        target: CUprocessState,
        pairs: &[GpuPair],
        bytes: Option<u64>,
        steps: &mut Vec<&'static str>,
    ) -> Result<Driven, DriveError> {
        let Core {
            backend,
            host,
            cfg,
            all_gpus,
            ..
        } = self;
        drive(
            &mut **backend,
            pid,
            target,
            pairs,
            &mut || copy_deadline(all_gpus, &mut **host, cfg, step, pid, bytes),
            steps,
        )
    }
}

/// Takes `pid`'s result out of a batch's results (a batch is a few tasks: a list will do).
pub(super) fn take_result<T>(results: &mut Vec<(Pid, T)>, pid: Pid) -> Option<T> {
    let i = results.iter().position(|(p, _)| *p == pid)?;
    Some(results.swap_remove(i).1)
}

/// All the memory of all GPUs: NVML's, else the driver's enumeration (once).
fn all_gpu_bytes(all_gpus: &mut Option<u64>, host: &mut dyn Host, cfg: &EngineConfig) -> u64 {
    if let Some(b) = *all_gpus {
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
    *all_gpus = Some(b);
    b
}

/// The deadline of a checkpoint or restore of `pid` moving `bytes` (unknown: all GPU memory):
/// the timeout plus what the bytes take at the minimum copy rate.
fn copy_deadline(
    all_gpus: &mut Option<u64>,
    host: &mut dyn Host,
    cfg: &EngineConfig,
    step: Step,
    pid: Pid,
    bytes: Option<u64>,
) -> Option<Duration> {
    let (bytes, how) = match bytes {
        Some(b) => (b, "its GPU memory"),
        None => (
            all_gpu_bytes(all_gpus, host, cfg),
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
