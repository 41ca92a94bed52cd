//! The dump's locks: one task's at its PAUSE_DEVICES, or the tree's, ahead, at the first one
//! in parallel mode; each limited by CRIU's freeze alarm, and a failed one left as found.

use super::{ahead_record, Ahead, Dump, TaskRecord};
use crate::backend::{BackendError, LockLimits, Op, Pid};
use crate::engine::{EngineError, Step};
use crate::host::{FreezeAlarm, Level};
use abi::CUprocessState;
use std::time::Duration;

/// How much of CRIU's freeze alarm is kept free at the end of a lock: time for undoing a lock
/// that landed late and for CRIU's own failure path, well before the alarm fires.
pub const ALARM_RESERVE: Duration = Duration::from_secs(1);
/// A lock is not even tried with less of the freeze alarm left than this (after the reserve).
pub const MIN_LOCK_WINDOW: Duration = Duration::from_millis(100);

impl Dump {
    /// Parallel mode, at the first PAUSE_DEVICES (`root`): CRIU pauses the tree's tasks one by one,
    /// each just before it seizes it, and all of them within its freeze alarm; so the RUNNING CUDA
    /// tasks of the tree below `root` are locked now, together, at most
    /// [`EngineConfig::parallel`](crate::engine::EngineConfig::parallel) at a time, under the rules
    /// of a lock of one's own: the tree is surveyed first, the guardian is told before, each lock
    /// gets the alarm's window divided by the batch's rounds (so the whole batch ends in time; with
    /// too little left, nothing is locked ahead), and a failed lock is left as found
    /// ([`Dump::failed_lock`]). A failed probe, and "not a CUDA task", are that task's result too;
    /// a CUDA task that is not plainly RUNNING and unstopped is left to its own call, as is one
    /// forked after the walk. What CRIU then never pauses is unlocked again by
    /// [`Dump::put_back_ahead`].
    pub(super) fn lock_ahead(&mut self, root: Pid) -> Ahead {
        let (mut ahead, mut pids, mut tids) = (Vec::new(), Vec::new(), Vec::new());
        for pid in self.core.host.tree(root) {
            let be = |cause| EngineError::Backend {
                step: Step::Pause,
                pid,
                cause,
            };
            let tid = match self.core.backend.get_restore_tid(pid) {
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
            match self.core.backend.get_state(pid) {
                Ok(CUprocessState::RUNNING) if self.core.threads.stopped(pid, tid).is_none() => {
                    pids.push(pid);
                    tids.push(tid);
                }
                Ok(_) => {}
                Err(cause) => ahead.push((pid, Err(be(cause)))),
            }
        }
        let n = pids.len();
        let width = self.core.width(n);
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
            self.core.guard_note(|g| {
                g.track(pid, CUprocessState::RUNNING, bytes, &[])?;
                g.intent(pid, Op::Lock)
            });
        }
        self.core.log(
            Level::Info,
            &format!("PAUSE_DEVICES: locking {n} task(s), {width} at a time (parallel mode)"),
        );
        self.core.batch_ran = true;
        let done = self.core.backend.lock_many(&pids, limits, width);
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
    pub(super) fn put_back_ahead(&mut self) -> Result<(), EngineError> {
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

    /// The limits of the next lock: the per-operation timeout, shortened to what is left of
    /// CRIU's freeze alarm (less [`ALARM_RESERVE`]) where the host has one, so that the lock
    /// gives up, and the plugin returns, before CRIU's alarm fires and, five seconds later,
    /// aborts CRIU without any rollback. Also returns what was left of the alarm when it
    /// shortened the limits.
    /// `rounds`: how many locks run one after another ([`Dump::lock_ahead`]): each gets that
    /// share of the window.
    pub(super) fn lock_limits(
        &self,
        pid: Pid,
        rounds: u32,
    ) -> Result<(LockLimits, Option<Duration>), EngineError> {
        let base = LockLimits::from_timeout(self.core.cfg.timeout);
        let timeout = |left| EngineError::FreezeTimeout {
            pid,
            criu_timeout: self.core.cfg.criu_timeout,
            left,
            cause: None,
            narrow: None,
        };
        match self.core.host.freeze_alarm() {
            FreezeAlarm::Expired => Err(timeout(None)),
            FreezeAlarm::Armed { left } => {
                let window = left.saturating_sub(ALARM_RESERVE) / rounds.max(1);
                if window < MIN_LOCK_WINDOW {
                    return Err(timeout(Some(left)));
                }
                let (limits, shortened) = base.within(window);
                if shortened {
                    self.core.log(
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
    pub(super) fn failed_lock(
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
            let state = match self.core.backend.get_state(pid) {
                Ok(s) => s.to_string(),
                Err(e) => format!("unknown: {e}"),
            };
            self.core.guard_note(|g| g.untrack(pid));
            return EngineError::ForeignLock { pid, state, cause };
        }
        if cause.may_have_landed() && !self.unlock_if_locked(pid) {
            rec.locked_by_us = true;
            self.tasks.push(rec);
        } else {
            self.core.guard_note(|g| g.untrack(pid));
        }
        match alarm_left {
            Some(left) if cause.is_timeout() => EngineError::FreezeTimeout {
                pid,
                criu_timeout: self.core.cfg.criu_timeout,
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
        match self.core.backend.get_state(pid) {
            Ok(CUprocessState::RUNNING) => true,
            Ok(CUprocessState::LOCKED) => match self.core.backend.unlock(pid) {
                Ok(()) => {
                    self.core.log(
                        Level::Warn,
                        &format!(
                            "PAUSE_DEVICES pid {pid}: the failed lock had landed after all; \
                             unlocked the task again"
                        ),
                    );
                    true
                }
                Err(e) => {
                    self.core.log(
                        Level::Error,
                        &format!("PAUSE_DEVICES pid {pid}: cannot undo a late lock: {e}"),
                    );
                    false
                }
            },
            Ok(s) => {
                self.core.log(
                    Level::Error,
                    &format!("PAUSE_DEVICES pid {pid}: unexpected state {s} after a failed lock"),
                );
                false
            }
            Err(e @ BackendError::Busy { .. }) => {
                self.core.log(
                    Level::Info,
                    &format!(
                        "PAUSE_DEVICES pid {pid}: cannot check the task now ({e}); the rollback \
                         checks it again"
                    ),
                );
                false
            }
            Err(e) => {
                self.core.log(
                    Level::Error,
                    &format!(
                        "PAUSE_DEVICES pid {pid}: cannot verify the state after a failed lock: {e}"
                    ),
                );
                false
            }
        }
    }
}
