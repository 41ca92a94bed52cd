//! The restore: RESUME_DEVICES_LATE for each restored task (one at a time, or the whole tree
//! at the first call in parallel mode), and `exit(RESTORE)`.

use super::common::{take_result, Core};
use super::{EngineError, Outcome, Step};
use crate::backend::{BackendError, Job, Op, Pid, Tid};
use crate::host::Level;
use crate::image::TaskImage;
use crate::message::Report;
use crate::options::RestoreFailure;
use abi::CUprocessState;
use std::collections::BTreeSet;
use std::time::Duration;

/// A restore: which tasks it reached, and the parallel batch's results.
#[derive(Debug)]
pub struct Restore {
    core: Core,
    /// The tasks RESUME_DEVICES_LATE handled (or tried to), by image pid.
    resumed: BTreeSet<Pid>,
    /// The dump's tasks were all handed to the guardian (at the first RESUME_DEVICES_LATE).
    tracked: bool,
    /// Parallel mode: each task's result, from the batch the first RESUME_DEVICES_LATE
    /// started; taken by the task's own call.
    batch: Option<Vec<(Pid, Result<Outcome, EngineError>)>>,
}

/// What restoring one task involves, once its records are read (see [`Restore::plan_resume`]).
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

impl Restore {
    /// A restore that runs on `core`.
    #[must_use]
    pub fn new(core: Core) -> Self {
        Restore {
            core,
            resumed: BTreeSet::new(),
            tracked: false,
            batch: None,
        }
    }

    /// What the restore shares with a dump: the backend, the time spent, the batch flag.
    #[must_use]
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// [`Restore::core`], to take what it counts.
    pub fn core_mut(&mut self) -> &mut Core {
        &mut self.core
    }

    /// RESUME_DEVICES_LATE: the restored task is still ptrace-stopped. A failure is returned to
    /// CRIU; on hosts that ignore it (CRIU 4.1/4.2) the task is also killed or left as it is, per
    /// [`EngineConfig::on_restore_failure`](crate::engine::EngineConfig::on_restore_failure).
    pub fn resume_devices_late(&mut self, pid: Pid) -> Result<Outcome, EngineError> {
        self.track_restore_tree(pid);
        if self.core.cfg.parallel > 1 && self.batch.is_none() {
            // CRIU calls RESUME_DEVICES_LATE for every restored task in one loop before it
            // releases them (criu/cr-restore.c, restore_root_task): the first call starts all.
            let batch = self.restore_batch_run(pid);
            self.batch = Some(batch);
            self.core.batch_ran = true;
        }
        // One read of the task's pid namespace identity per call (see `image_pid`).
        let key = self.core.image_pid(pid);
        self.resumed.insert(key);
        let batched = self.batch.as_mut().and_then(|b| take_result(b, pid));
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
        if !self.core.cfg.late_errors_ignored {
            return; // the host fails the restore itself
        }
        match self.core.cfg.on_restore_failure {
            RestoreFailure::Kill => match self.core.threads.kill_task(pid) {
                Ok(()) => self.core.log(
                    Level::Error,
                    &format!(
                        "RESUME_DEVICES_LATE pid {pid}: killed the task \
                         (cuda_plugin.on-restore-failure=kill): its GPU state could not be \
                         restored ({}), and this CRIU releases a task whatever this hook \
                         returns; the images are intact, so the restore can be retried",
                        crate::message::quote(&Report(e).to_string())
                    ),
                ),
                Err(k) => self.core.log(
                    Level::Error,
                    &format!(
                        "RESUME_DEVICES_LATE pid {pid}: could not kill the task whose GPU state \
                         could not be restored: {k}"
                    ),
                ),
            },
            RestoreFailure::Leave => {
                self.core.log(
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
        if !self.core.has_guard() || std::mem::replace(&mut self.tracked, true) {
            return;
        }
        let Some(list) = &self.core.cfg.restore_tasks else {
            return;
        };
        let tree = self.core.host.tree(root);
        let pairs = self.core.cfg.pairs.clone();
        // The list is keyed by pid in the tree's own pid namespace; the guardian needs host pids.
        let tasks: Vec<(Pid, CUprocessState, Option<u64>)> = tree
            .iter()
            .filter_map(|&p| {
                let key = self.core.threads.ns_pid(p).unwrap_or(p);
                let img = list.get(&key)?;
                (img.initial_state != CUprocessState::CHECKPOINTED)
                    .then(|| (p, img.initial_state, img.total_bytes()))
            })
            .collect();
        for (p, initial, bytes) in tasks {
            self.core.guard_note(|g| g.track(p, initial, bytes, &pairs));
        }
    }

    /// What the dump recorded about `pid` (named `key` in the images): its restore thread and
    /// its initial state, or `None` when it had no CUDA state.
    fn dump_record(&mut self, pid: Pid, key: Pid) -> Result<Option<TaskImage>, EngineError> {
        let step = Step::Resume;
        if let Some(list) = &self.core.cfg.restore_tasks {
            return Ok(list.get(&key).cloned());
        }
        // An image from before the task list: this task's own image, if any.
        match self
            .core
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

    /// What restoring `pid` (named `key` in the images, [`Core::image_pid`]) involves: its
    /// restore thread, its dump-time state and its deadline; or the outcome when there is
    /// nothing to restore (not a CUDA task, or one the dump left checkpointed).
    fn plan_resume(
        &mut self,
        pid: Pid,
        key: Pid,
    ) -> Result<Result<ResumePlan, Outcome>, EngineError> {
        let step = Step::Resume;
        let be = |cause| EngineError::Backend { step, pid, cause };
        let listed = self.core.cfg.restore_tasks.is_some();
        let record = self.dump_record(pid, key)?;
        if listed && record.is_none() {
            return Ok(Err(Outcome::NotMine)); // the dump's task list says: no CUDA state
        }
        // A tree restored into a new pid namespace has new host pids and tids: the recorded
        // restore thread's tid names nothing then.
        let same_pids = key == pid;
        let (tid, initial) = match &record {
            Some(img) if same_pids && self.core.threads.thread_exists(pid, img.restore_tid) => {
                (img.restore_tid, img.initial_state)
            }
            _ => match self.core.backend.get_restore_tid(pid).map_err(be)? {
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
            self.core.log(
                Level::Info,
                &format!("pid {pid} was already checkpointed at dump time; leaving it so"),
            );
            return Ok(Err(Outcome::Handled));
        }
        if let Some(custom) = record.as_ref().and_then(|r| r.custom.clone()) {
            self.core.backend.set_custom_recorded(pid, custom);
        }
        let bytes = record.as_ref().and_then(TaskImage::total_bytes);
        let deadline = self.core.copy_deadline(step, pid, bytes);
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
        let pairs = self.core.cfg.pairs.clone();
        let (initial, bytes) = (plan.initial, plan.bytes);
        self.core
            .guard_note(|g| g.track(pid, initial, bytes, &pairs));
        self.core.guard_note(|g| g.intent(pid, Op::Restore));
        self.core.resume_thread(Step::Resume, pid, plan.tid)
    }

    /// Logs a restored task and tells the guardian it is in its final state.
    fn resumed_log(&mut self, plan: &ResumePlan, restore_ms: u64) {
        let pid = plan.pid;
        if let Some(s) = self.core.backend.custom_summary(pid) {
            self.core.log(
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
        self.core.log(
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
        self.core.guard_note(|g| g.untrack(pid));
    }

    /// Restores the GPU state of `pid`, named `key` in the images ([`Core::image_pid`]).
    fn resume_task(&mut self, pid: Pid, key: Pid) -> Result<Outcome, EngineError> {
        let step = Step::Resume;
        let be = |cause| EngineError::Backend { step, pid, cause };
        let plan = match self.plan_resume(pid, key)? {
            Ok(plan) => plan,
            Err(outcome) => return Ok(outcome),
        };
        let resumed = self.start_resume(&plan)?;
        let started = std::time::Instant::now();
        let pairs = self.core.cfg.pairs.clone();
        let mut done = self
            .core
            .backend
            .restore(pid, &pairs, plan.deadline)
            .map_err(be);
        let restore_ms = crate::message::millis(started.elapsed());
        if done.is_ok() && plan.initial == CUprocessState::RUNNING {
            done = self.core.backend.unlock(pid).map_err(be);
        }
        let stopped = self.core.threads.restop(resumed);
        done?;
        stopped.map_err(|cause| EngineError::Thread { step, pid, cause })?;
        self.resumed_log(&plan, restore_ms);
        Ok(Outcome::Handled)
    }

    /// Parallel mode: restores every task of the restored tree under `root` (the first
    /// RESUME_DEVICES_LATE's task) that the dump recorded, at most
    /// [`EngineConfig::parallel`](crate::engine::EngineConfig::parallel) at a time: plan each,
    /// resume each restore thread, run the restores together, then the unlocks of the tasks that
    /// were running at dump time, and stop each thread again. Each task's result waits for its own
    /// RESUME_DEVICES_LATE call.
    fn restore_batch_run(&mut self, root: Pid) -> Vec<(Pid, Result<Outcome, EngineError>)> {
        let step = Step::Resume;
        let mut results = Vec::new();
        let mut running = Vec::new();
        for p in self.core.host.tree(root) {
            let key = self.core.image_pid(p);
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
        let width = self.core.width(jobs.len());
        self.core.log(
            Level::Info,
            &format!(
                "{step}: restoring {} task(s), {width} at a time (parallel mode)",
                jobs.len()
            ),
        );
        let pairs = self.core.cfg.pairs.clone();
        let restored = self.core.backend.restore_many(&jobs, &pairs, width);
        let mut outcome: Vec<(Result<(), BackendError>, u64)> = restored
            .into_iter()
            .map(|(r, took)| (r, crate::message::millis(took)))
            .collect();
        let unlock: Vec<usize> = (0..running.len())
            .filter(|&k| outcome[k].0.is_ok() && running[k].0.initial == CUprocessState::RUNNING)
            .collect();
        let pids: Vec<Pid> = unlock.iter().map(|&k| running[k].0.pid).collect();
        if !pids.is_empty() {
            let unlocked = self
                .core
                .backend
                .unlock_many(&pids, self.core.width(pids.len()));
            for (&k, (r, _)) in unlock.iter().zip(unlocked) {
                outcome[k].0 = r;
            }
        }
        for ((plan, resumed), (r, restore_ms)) in running.into_iter().zip(outcome) {
            let pid = plan.pid;
            let stopped = self.core.threads.restop(resumed);
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
        let Some(list) = &self.core.cfg.restore_tasks else {
            return;
        };
        let missed: Vec<Pid> = list
            .keys()
            .filter(|p| !self.resumed.contains(p))
            .copied()
            .collect();
        if !missed.is_empty() && ret == 0 {
            self.core.log(
                Level::Error,
                &format!(
                    "restore: CRIU never called RESUME_DEVICES_LATE for pid(s) {missed:?}, which \
                     had CUDA state at dump time; their GPU state was not restored"
                ),
            );
        }
    }
}
