//! The dump's end: DUMP_FINISH or `exit(DUMP)`, and the rollback that puts every task the
//! dump changed back in its initial state when the dump failed or the tasks stay running.

use super::{Dump, Finish, TaskRecord};
use crate::backend::drive::{DriveError, Driven};
use crate::backend::{op_deadline, Op, Pid, LOCK_ABANDON_GRACE};
use crate::engine::{EngineError, Step};
use crate::host::Level;
use crate::message::Report;
use abi::CUprocessState;
use std::time::Duration;

impl Dump {
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
        if ret == 0 && !self.core.cfg.leave_running {
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
            self.core
                .log(Level::Warn, &format!("MUTANT: rollback skipped ({why})"));
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
            let removed = self.core.backend.discard_custom_files(&failed);
            if removed > 0 {
                self.core.log(
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
            self.core.log(Level::Error, &Report(&e).to_string());
            Err(e)
        }
    }

    /// Puts one task back in its initial state (see [`Dump::put_back`]), logged with `why`;
    /// false when it could not be (logged as an error). A task that exited has nothing to put
    /// back.
    pub(super) fn roll_back(&mut self, rec: &TaskRecord, why: &str) -> bool {
        // A call of an earlier put-back that timed out must not block this task's.
        self.core.backend.settle(Duration::ZERO);
        let mut steps = Vec::new();
        self.core.guard_note(|g| g.intent(rec.pid, Op::Restore));
        match self.put_back(rec, &mut steps) {
            Ok(()) => {
                self.core.guard_note(|g| g.untrack(rec.pid));
                let done = if steps.is_empty() {
                    String::new()
                } else {
                    format!(": {}", steps.join(", "))
                };
                self.core.log(
                    Level::Info,
                    &format!("pid {}: back to {} ({why}){done}", rec.pid, rec.initial),
                );
            }
            Err(_) if !self.core.threads.task_exists(rec.pid) => {
                self.core.guard_note(|g| g.untrack(rec.pid));
                self.core.log(
                    Level::Warn,
                    &format!(
                        "pid {}: the task exited during the dump; there is nothing to put back",
                        rec.pid
                    ),
                );
            }
            Err(e) => {
                self.core.log(
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
        let limit = op_deadline(Op::Lock, self.core.cfg.timeout).unwrap_or(LOCK_ABANDON_GRACE);
        let t = std::time::Instant::now();
        // Only a call that was outstanding is worth a line: the time the check itself takes on
        // a loaded host is not a wait.
        match self.core.backend.settle(limit) {
            crate::backend::Settled::Nothing => {}
            crate::backend::Settled::Returned => {
                self.core.log(
                    Level::Info,
                    &format!(
                        "dump finish: waited {} ms for a timed-out driver call to return",
                        crate::message::Tenths(t.elapsed().as_secs_f64() * 1000.0)
                    ),
                );
            }
            crate::backend::Settled::StillBlocked => {
                self.core.log(
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
        let resumed = self.core.resume_thread(step, pid, rec.restore_tid)?;
        let driven = self.drive_to(pid, rec.initial, steps);
        let stopped = self.core.threads.restop(resumed);
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
        let bytes = self.copy_bytes(pid);
        let driven = self.core.drive(step, pid, target, &[], bytes, steps);
        match driven {
            Ok(Driven::Reached) => Ok(()),
            Ok(Driven::LessAdvanced(state)) => {
                // Someone else changed it; do not re-lock.
                self.core.log(
                    Level::Warn,
                    &format!("pid {pid} is {state}, was {target} at dump start; leaving it"),
                );
                Ok(())
            }
            Err(DriveError::Backend(cause)) => Err(EngineError::Backend { step, pid, cause }),
            Err(DriveError::BadState(state)) => Err(EngineError::BadState { step, pid, state }),
        }
    }
}
