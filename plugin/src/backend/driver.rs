//! The driver-API backend: `cuCheckpointProcess*` from `libcuda.so.1`.
//!
//! The library is opened at run time by [`crate::ffi::cuda`] (normal loader search, so
//! `LD_LIBRARY_PATH` works) and reaches this module as a [`CudaDriver`]: plain safe methods that
//! return the raw `CUresult`.
//!
//! # Timeouts and abandoned calls
//!
//! A driver call can block: the work is done by the target's restore thread, and if that thread
//! cannot run (stopped, or wedged in the driver) the caller waits forever. So every call is a
//! [`DriverCall`] that a [`DriverExec`] runs with the operation's deadline: in the plugin's
//! helper process ([`crate::agent`], the default, which keeps CRIU single-threaded), or on the
//! session's [`Worker`] threads (`guardian=off`, or when the helper cannot start). The rule for a
//! call that overruns its deadline (abandon it, refuse further calls while it stays blocked, let a
//! rollback wait a bounded time for it) is the same for both and described in [`crate::worker`].
//! A timed-out call surfaces as [`BackendError::Timeout`], a refused one as
//! [`BackendError::Busy`], a helper that died mid-call as [`BackendError::HelperLost`].

use super::{
    lock_timeout_ms, op_deadline, Backend, BackendError, BackendKind, FailureClass, GpuPair, Job,
    JobResult, LockLimits, Op, Pid, Tid,
};
use crate::image::CustomRecord;
use crate::worker::{CallError, Worker};
use abi::cuda::GPU_PAIRS_MIN_DRIVER_VERSION;
use abi::{CUcheckpointGpuPair, CUprocessState, CUresult};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The oldest driver this backend accepts: CUDA 13.0 (r580), the first whose restore arguments
/// carry GPU pairs.
pub const MIN_DRIVER_VERSION: i32 = GPU_PAIRS_MIN_DRIVER_VERSION;

pub use crate::ffi::cuda::{CudaDriver, LoadError};

/// Custom storage as the driver-API backend uses it: its tasks' GPU memory moved to and from
/// image files by a copier process ([`crate::cstore::client::CustomPath`]). The backend knows
/// only this trait, so that custom storage (which runs its copiers through the helper's
/// protocol) sits above it.
pub trait CustomStorage: Send + fmt::Debug {
    /// What checkpointing `pid` wrote (for its task image).
    fn written(&self, pid: Pid) -> Option<CustomRecord>;
    /// Restore: what the dump recorded for the task that is `pid` now.
    fn set_recorded(&mut self, pid: Pid, rec: CustomRecord);
    /// A line for the log: what `pid`'s last operation moved.
    fn summary(&self, pid: Pid) -> Option<String>;
    /// After a failed dump: removes the files of every task but `keep`'s; how many it removed.
    fn discard(&mut self, keep: &[Pid]) -> usize;
    /// Whether `pid`'s GPU memory is in custom-storage files.
    fn holds(&self, pid: Pid) -> bool;
    /// Checkpoints `jobs` into files, at most `width` at a time; each task's result in order.
    fn checkpoint_many(&mut self, jobs: &[Job], width: usize) -> Vec<JobResult>;
    /// Restores `jobs` from their files (with the dump's GPU pairs), at most `width` at a time.
    fn restore_many(&mut self, jobs: &[Job], pairs: &[GpuPair], width: usize) -> Vec<JobResult>;
}

/// Where a usable driver's calls run.
#[derive(Clone)]
pub enum DriverHandle {
    /// In this process, on worker threads.
    Local(Arc<dyn CudaDriver>),
    /// Through an executor: the plugin's helper process ([`crate::agent`]).
    Exec(Arc<dyn DriverExec>),
}

impl fmt::Debug for DriverHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DriverHandle::Local(_) => "Local",
            DriverHandle::Exec(_) => "Exec",
        })
    }
}

/// The outcome of probing the driver API.
pub enum DriverProbe {
    /// Usable. `init` holds the `cuInit(0)` result when the probe was asked to initialise.
    Supported {
        driver: DriverHandle,
        version: i32,
        init: Option<CUresult>,
        /// Custom storage is there ([`CudaDriver::custom_storage`]).
        custom_storage: bool,
    },
    /// Not usable here, and that is a normal situation (auto may fall back).
    Unsupported(String),
    /// The probe itself failed; auto must not silently switch backends.
    Error(String),
}

impl fmt::Debug for DriverProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DriverProbe::Supported {
                version,
                init,
                custom_storage,
                ..
            } => f
                .debug_struct("Supported")
                .field("version", version)
                .field("init", init)
                .field("custom_storage", custom_storage)
                .finish_non_exhaustive(),
            DriverProbe::Unsupported(r) => f.debug_tuple("Unsupported").field(r).finish(),
            DriverProbe::Error(r) => f.debug_tuple("Error").field(r).finish(),
        }
    }
}

/// Classifies a load attempt: absent library or missing symbols are *unsupported*; a failing
/// `cuDriverGetVersion` is an *error*; a version below [`MIN_DRIVER_VERSION`] is unsupported.
/// With `call_init` (restore needs an initialised driver in the caller, or persistence mode),
/// `cuInit(0)` is called and its result reported, not judged.
pub fn probe_driver(load: Result<Arc<dyn CudaDriver>, LoadError>, call_init: bool) -> DriverProbe {
    let driver = match load {
        Ok(d) => d,
        Err(e) => return DriverProbe::Unsupported(e.to_string()),
    };
    let version = match driver.driver_version() {
        Ok(v) => v,
        Err(code) => return DriverProbe::Error(format!("cuDriverGetVersion failed: {code}")),
    };
    if version < MIN_DRIVER_VERSION {
        return DriverProbe::Unsupported(format!(
            "driver reports CUDA version {version}, the driver API backend needs {MIN_DRIVER_VERSION} or later"
        ));
    }
    let init = call_init.then(|| driver.init());
    let custom_storage = driver.custom_storage();
    DriverProbe::Supported {
        driver: DriverHandle::Local(driver),
        version,
        init,
        custom_storage,
    }
}

/// One driver call, as data: what [`DriverExec`] runs (here, on a worker thread, or in the
/// plugin's helper process, see [`crate::agent`]; the derives are its place in the helper's
/// protocol, [`crate::agent::proto`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DriverCall {
    /// `cuInit(0)`.
    Init,
    /// `cuCheckpointProcessGetRestoreThreadId`.
    RestoreTid(Pid),
    /// `cuCheckpointProcessGetState`.
    State(Pid),
    /// `cuCheckpointProcessLock` with `timeoutMs`.
    Lock { pid: Pid, timeout_ms: u32 },
    /// `cuCheckpointProcessCheckpoint`.
    Checkpoint(Pid),
    /// `cuCheckpointProcessRestore` with GPU pairs (old UUID, new UUID).
    Restore {
        pid: Pid,
        pairs: Vec<([u8; 16], [u8; 16])>,
    },
    /// `cuCheckpointProcessUnlock`.
    Unlock(Pid),
}

/// What a [`DriverCall`] returned: the raw codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DriverReply {
    Tid(Result<i32, u32>),
    State(Result<u32, u32>),
    Code(u32),
}

impl DriverCall {
    /// Runs the call on `d`.
    #[must_use]
    pub fn apply(&self, d: &dyn CudaDriver) -> DriverReply {
        match self {
            DriverCall::Init => DriverReply::Code(d.init().0),
            DriverCall::RestoreTid(pid) => DriverReply::Tid(d.restore_tid(*pid).map_err(|c| c.0)),
            DriverCall::State(pid) => {
                DriverReply::State(d.state(*pid).map(|s| s.0).map_err(|c| c.0))
            }
            DriverCall::Lock { pid, timeout_ms } => DriverReply::Code(d.lock(*pid, *timeout_ms).0),
            DriverCall::Checkpoint(pid) => DriverReply::Code(d.checkpoint(*pid).0),
            DriverCall::Restore { pid, pairs } => {
                let pairs: Vec<CUcheckpointGpuPair> = pairs
                    .iter()
                    .map(|(old, new)| CUcheckpointGpuPair {
                        old_uuid: abi::GpuUuid(*old).to_cu(),
                        new_uuid: abi::GpuUuid(*new).to_cu(),
                    })
                    .collect();
                DriverReply::Code(d.restore(*pid, &pairs).0)
            }
            DriverCall::Unlock(pid) => DriverReply::Code(d.unlock(*pid).0),
        }
    }
}

/// Runs driver calls with deadlines and the rule for abandoned calls of [`crate::worker`]: on a
/// worker thread of this process ([`LocalExec`]) or in the plugin's helper process
/// ([`crate::agent::client::Link`]), which keeps CRIU single-threaded.
pub trait DriverExec: Send + Sync {
    /// Runs `call` (described by `what` in messages), waiting at most `deadline`.
    fn exec(
        &self,
        what: &str,
        call: DriverCall,
        deadline: Option<Duration>,
    ) -> Result<DriverReply, CallError>;
    /// Runs every `(what, call, deadline)`, at most `width` at a time, each waiting at most its
    /// deadline from its own start; one result per call, in order. The default runs them one
    /// after another (as [`LocalExec`] does: concurrent calls there would be more threads in
    /// CRIU).
    fn exec_many(
        &self,
        calls: Vec<(String, DriverCall, Option<Duration>)>,
        width: usize,
    ) -> Vec<Result<DriverReply, CallError>> {
        let _ = width;
        calls
            .into_iter()
            .map(|(what, call, deadline)| self.exec(&what, call, deadline))
            .collect()
    }
    /// What the abandoned call that is still blocked was, if one is.
    fn blocked(&self) -> Option<String>;
    /// Waits at most `limit` for an abandoned call to return (see [`Worker::settle`]).
    fn settle(&self, limit: Duration) -> bool;
}

/// Driver calls on a worker thread of this process.
pub struct LocalExec {
    pub driver: Arc<dyn CudaDriver>,
    pub worker: Worker,
}

impl fmt::Debug for LocalExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalExec")
            .field("worker", &self.worker)
            .finish_non_exhaustive()
    }
}

impl DriverExec for LocalExec {
    fn exec(
        &self,
        what: &str,
        call: DriverCall,
        deadline: Option<Duration>,
    ) -> Result<DriverReply, CallError> {
        let driver = Arc::clone(&self.driver);
        self.worker
            .call(what, deadline, move || call.apply(&*driver))
    }
    fn blocked(&self) -> Option<String> {
        self.worker.blocked()
    }
    fn settle(&self, limit: Duration) -> bool {
        self.worker.settle(limit)
    }
}

/// One call per pid (for [`DriverApi::code_many`]), each waited for at most `deadline`.
fn per_pid(
    pids: &[Pid],
    deadline: Option<Duration>,
    call: &dyn Fn(Pid) -> DriverCall,
) -> Vec<(Pid, Option<Duration>, DriverCall)> {
    pids.iter().map(|&p| (p, deadline, call(p))).collect()
}

/// The driver-API backend.
pub struct DriverApi {
    exec: Arc<dyn DriverExec>,
    /// The per-operation timeout (`None` = forever).
    timeout: Option<Duration>,
    /// `cuInit(0)` succeeded in the calling process (restore needs it, also during a dump's
    /// rollback).
    initialized: bool,
    /// The operation of the last call abandoned on timeout.
    abandoned: std::cell::Cell<Option<Op>>,
    /// Custom storage, when this dump or restore uses it: checkpoints (and the restores of
    /// tasks whose memory is in files) go through the copier instead of `exec`.
    custom: Option<Box<dyn CustomStorage>>,
}

impl fmt::Debug for DriverApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DriverApi")
            .field("blocked", &self.exec.blocked())
            .finish_non_exhaustive()
    }
}

impl DriverApi {
    /// A backend over `driver` with a per-operation `timeout` (`None` = forever), whose calls run
    /// on `worker`.
    pub fn new(driver: Arc<dyn CudaDriver>, timeout: Option<Duration>, worker: Worker) -> Self {
        Self::with_exec(Arc::new(LocalExec { driver, worker }), timeout)
    }

    /// A backend whose calls `exec` runs.
    pub fn with_exec(exec: Arc<dyn DriverExec>, timeout: Option<Duration>) -> Self {
        DriverApi {
            exec,
            timeout,
            initialized: false,
            abandoned: std::cell::Cell::new(None),
            custom: None,
        }
    }

    /// Moves GPU memory through custom storage ([`crate::cstore`]).
    #[must_use]
    pub fn with_custom_storage(mut self, path: Box<dyn CustomStorage>) -> Self {
        self.custom = Some(path);
        self
    }

    /// True while an abandoned call is still blocked in the driver.
    #[must_use]
    pub fn has_outstanding_call(&self) -> bool {
        self.exec.blocked().is_some()
    }

    fn call(
        &self,
        op: Op,
        pid: Pid,
        deadline: Option<Duration>,
        call: DriverCall,
    ) -> Result<DriverReply, BackendError> {
        self.exec
            .exec(&format!("{op} pid {pid}"), call, deadline)
            .map_err(|e| self.call_error(op, pid, e))
    }

    /// `op` on every job at once (at most `width` in flight; see [`DriverExec::exec_many`]),
    /// each reply a plain `CUresult`.
    fn code_many(
        &self,
        op: Op,
        jobs: Vec<(Pid, Option<Duration>, DriverCall)>,
        width: usize,
    ) -> Vec<JobResult> {
        let started = std::time::Instant::now();
        let pids: Vec<Pid> = jobs.iter().map(|j| j.0).collect();
        let calls = jobs
            .into_iter()
            .map(|(pid, deadline, call)| (format!("{op} pid {pid}"), call, deadline))
            .collect();
        let replies = self.exec.exec_many(calls, width);
        pids.into_iter()
            .zip(replies)
            .map(|(pid, r)| {
                let r = r
                    .map_err(|e| self.call_error(op, pid, e))
                    .and_then(|r| DriverApi::code_of(op, pid, r));
                // The batch's calls overlap: each is charged the batch's time so far.
                (r, started.elapsed())
            })
            .collect()
    }

    /// A restore or an unlock whose helper died under it ([`BackendError::HelperLost`]): the
    /// link has a fresh helper by the next call (see [`crate::agent::client::Link::revivable`]),
    /// so the task's state says whether the call landed before the death: a restore that
    /// finds the task still CHECKPOINTED, or an unlock that finds it still LOCKED, is made
    /// once more; one that finds the state it was to reach succeeded. Any other result, and
    /// any other error, is returned as it was. Locks and checkpoints are not retried: the
    /// dump fails and its rollback puts the tasks back.
    fn after_lost(
        &mut self,
        op: Op,
        pid: Pid,
        r: Result<(), BackendError>,
        again: impl FnOnce(&mut Self) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let Err(BackendError::HelperLost { .. }) = &r else {
            return r;
        };
        let (before, after) = match op {
            Op::Restore => (CUprocessState::CHECKPOINTED, CUprocessState::LOCKED),
            Op::Unlock => (CUprocessState::LOCKED, CUprocessState::RUNNING),
            _ => return r,
        };
        match self.get_state(pid) {
            Ok(s) if s == before => again(self),
            Ok(s) if s == after => Ok(()),
            _ => r,
        }
    }

    /// [`DriverApi::after_lost`] for each job of a batch that lost its helper, one after
    /// another.
    fn after_lost_many(
        &mut self,
        op: Op,
        results: Vec<JobResult>,
        pids: &[Pid],
        again: &dyn Fn(&mut Self, Pid) -> Result<(), BackendError>,
    ) -> Vec<JobResult> {
        results
            .into_iter()
            .zip(pids)
            .map(|((r, took), &pid)| {
                if matches!(r, Err(BackendError::HelperLost { .. })) {
                    let (r, t) =
                        super::timed_job(|| self.after_lost(op, pid, r, |me| again(me, pid)));
                    (r, took + t)
                } else {
                    (r, took)
                }
            })
            .collect()
    }

    fn call_error(&self, op: Op, pid: Pid, e: CallError) -> BackendError {
        match e {
            CallError::TimedOut { after } => {
                self.abandoned.set(Some(op));
                BackendError::Timeout {
                    backend: BackendKind::DriverApi,
                    op,
                    pid,
                    after,
                }
            }
            CallError::Busy { blocked } => BackendError::Busy { op, pid, blocked },
            CallError::Panicked => BackendError::Unsupported {
                backend: BackendKind::DriverApi,
                op,
                pid,
                what: "the driver call panicked",
            },
            CallError::NoThread(_) => BackendError::Unsupported {
                backend: BackendKind::DriverApi,
                op,
                pid,
                what: "cannot start a worker thread",
            },
            CallError::Lost(why) => BackendError::HelperLost { op, pid, why },
        }
    }

    /// The code of a reply that must be a plain `CUresult`.
    fn code_of(op: Op, pid: Pid, r: DriverReply) -> Result<(), BackendError> {
        match r {
            DriverReply::Code(c) => DriverApi::code(op, pid, CUresult(c)),
            other => Err(Self::mismatch(op, pid, other)),
        }
    }

    fn mismatch(op: Op, pid: Pid, r: DriverReply) -> BackendError {
        BackendError::BadOutput {
            backend: BackendKind::DriverApi,
            op,
            pid,
            output: format!("{r:?}"),
        }
    }

    fn code(op: Op, pid: Pid, code: CUresult) -> Result<(), BackendError> {
        if code.is_success() {
            Ok(())
        } else {
            Err(BackendError::Cuda {
                backend: BackendKind::DriverApi,
                op,
                pid,
                code,
            })
        }
    }
}

impl Backend for DriverApi {
    fn kind(&self) -> BackendKind {
        BackendKind::DriverApi
    }

    fn custom_written(&self, pid: Pid) -> Option<crate::image::CustomRecord> {
        self.custom.as_ref().and_then(|c| c.written(pid))
    }

    fn set_custom_recorded(&mut self, pid: Pid, rec: crate::image::CustomRecord) {
        if let Some(c) = &mut self.custom {
            c.set_recorded(pid, rec);
        }
    }

    fn custom_summary(&self, pid: Pid) -> Option<String> {
        self.custom.as_ref().and_then(|c| c.summary(pid))
    }

    fn discard_custom_files(&mut self, keep: &[Pid]) -> usize {
        self.custom.as_mut().map_or(0, |c| c.discard(keep))
    }

    fn settle(&mut self, limit: Duration) -> super::Settled {
        let limit = match self.abandoned.get() {
            // None of this backend's calls was abandoned, and none of the plugin's others (a
            // GPU enumeration, an NVML query) is blocked where the calls run: nothing to wait
            // for.
            None if self.exec.blocked().is_none() => return super::Settled::Nothing,
            // Another call of the plugin's was abandoned (the GPU enumeration at the first
            // checkpoint, say): wait for it like for our own, or where the calls run on a
            // worker in CRIU the rollback would be refused as busy.
            None => limit,
            Some(Op::Lock) => limit.min(super::LOCK_ABANDON_GRACE),
            Some(_) => limit,
        };
        if self.exec.settle(limit) {
            super::Settled::Returned
        } else {
            super::Settled::StillBlocked
        }
    }

    fn get_restore_tid(&mut self, pid: Pid) -> Result<Option<Tid>, BackendError> {
        let op = Op::GetRestoreTid;
        match self.call(
            op,
            pid,
            op_deadline(op, self.timeout),
            DriverCall::RestoreTid(pid),
        )? {
            DriverReply::Tid(Ok(tid)) if tid > 0 => Ok(Some(tid)),
            DriverReply::Tid(Ok(_)) => Ok(None),
            DriverReply::Tid(Err(code)) => {
                match FailureClass::of(BackendKind::DriverApi, op, CUresult(code)) {
                    // What callers of the API observe for a process without CUDA state.
                    FailureClass::NoCudaState => Ok(None),
                    _ => DriverApi::code(op, pid, CUresult(code)).map(|()| None),
                }
            }
            other => Err(Self::mismatch(op, pid, other)),
        }
    }

    fn get_state(&mut self, pid: Pid) -> Result<CUprocessState, BackendError> {
        let op = Op::GetState;
        match self.call(
            op,
            pid,
            op_deadline(op, self.timeout),
            DriverCall::State(pid),
        )? {
            DriverReply::State(Ok(s)) => Ok(CUprocessState(s)),
            DriverReply::State(Err(code)) => Err(BackendError::Cuda {
                backend: BackendKind::DriverApi,
                op,
                pid,
                code: CUresult(code),
            }),
            other => Err(Self::mismatch(op, pid, other)),
        }
    }

    fn lock(&mut self, pid: Pid, limits: LockLimits) -> Result<(), BackendError> {
        let op = Op::Lock;
        let timeout_ms = lock_timeout_ms(limits.driver);
        let r = self.call(op, pid, limits.wait, DriverCall::Lock { pid, timeout_ms })?;
        DriverApi::code_of(op, pid, r)
    }

    fn checkpoint(&mut self, pid: Pid, deadline: Option<Duration>) -> Result<(), BackendError> {
        if let Some(c) = &mut self.custom {
            let job = Job { pid, deadline };
            return c.checkpoint_many(&[job], 1).remove(0).0;
        }
        let op = Op::Checkpoint;
        let r = self.call(op, pid, deadline, DriverCall::Checkpoint(pid))?;
        DriverApi::code_of(op, pid, r)
    }

    fn restore(
        &mut self,
        pid: Pid,
        pairs: &[GpuPair],
        deadline: Option<Duration>,
    ) -> Result<(), BackendError> {
        if let Some(c) = self.custom.as_mut().filter(|c| c.holds(pid)) {
            let job = Job { pid, deadline };
            return c.restore_many(&[job], pairs, 1).remove(0).0;
        }
        if !self.initialized {
            // Restore needs an initialised driver in the caller (or persistence mode); a dump's
            // rollback restores too, so initialise lazily here rather than in the probe.
            let op = Op::Init;
            let r = self.call(op, pid, op_deadline(op, self.timeout), DriverCall::Init)?;
            DriverApi::code_of(op, pid, r)?;
            self.initialized = true;
        }
        let op = Op::Restore;
        let wire: Vec<([u8; 16], [u8; 16])> =
            pairs.iter().map(|(old, new)| (old.0, new.0)).collect();
        let call = || DriverCall::Restore {
            pid,
            pairs: wire.clone(),
        };
        let r = self
            .call(op, pid, deadline, call())
            .and_then(|r| DriverApi::code_of(op, pid, r));
        self.after_lost(op, pid, r, |me| {
            me.call(op, pid, deadline, call())
                .and_then(|r| DriverApi::code_of(op, pid, r))
        })
    }

    fn unlock(&mut self, pid: Pid) -> Result<(), BackendError> {
        let op = Op::Unlock;
        let deadline = op_deadline(op, self.timeout);
        let r = self
            .call(op, pid, deadline, DriverCall::Unlock(pid))
            .and_then(|r| DriverApi::code_of(op, pid, r));
        self.after_lost(op, pid, r, |me| {
            me.call(op, pid, deadline, DriverCall::Unlock(pid))
                .and_then(|r| DriverApi::code_of(op, pid, r))
        })
    }

    fn checkpoint_many(&mut self, jobs: &[Job], width: usize) -> Vec<JobResult> {
        if let Some(c) = &mut self.custom {
            return c.checkpoint_many(jobs, width);
        }
        let jobs = jobs
            .iter()
            .map(|j| (j.pid, j.deadline, DriverCall::Checkpoint(j.pid)))
            .collect();
        self.code_many(Op::Checkpoint, jobs, width)
    }

    fn restore_many(&mut self, jobs: &[Job], pairs: &[GpuPair], width: usize) -> Vec<JobResult> {
        if let Some(c) = &mut self.custom {
            if jobs.iter().all(|j| c.holds(j.pid)) {
                return c.restore_many(jobs, pairs, width);
            }
            if jobs.iter().any(|j| c.holds(j.pid)) {
                // Some in files, some not: each its own way, one after another.
                return jobs
                    .iter()
                    .map(|j| super::timed_job(|| self.restore(j.pid, pairs, j.deadline)))
                    .collect();
            }
        }
        if !self.initialized {
            if let Some(first) = jobs.first() {
                let op = Op::Init;
                let init = self
                    .call(
                        op,
                        first.pid,
                        op_deadline(op, self.timeout),
                        DriverCall::Init,
                    )
                    .and_then(|r| DriverApi::code_of(op, first.pid, r));
                if init.is_err() {
                    // Every restore needs it: each task then fails (or not) as it would alone.
                    return jobs
                        .iter()
                        .map(|j| super::timed_job(|| self.restore(j.pid, pairs, j.deadline)))
                        .collect();
                }
                self.initialized = true;
            }
        }
        let wire: Vec<([u8; 16], [u8; 16])> =
            pairs.iter().map(|(old, new)| (old.0, new.0)).collect();
        let pids: Vec<Pid> = jobs.iter().map(|j| j.pid).collect();
        let calls = jobs
            .iter()
            .map(|j| {
                let call = DriverCall::Restore {
                    pid: j.pid,
                    pairs: wire.clone(),
                };
                (j.pid, j.deadline, call)
            })
            .collect();
        let results = self.code_many(Op::Restore, calls, width);
        let deadline_of = |pid| jobs.iter().find(|j| j.pid == pid).and_then(|j| j.deadline);
        self.after_lost_many(Op::Restore, results, &pids, &|me, pid| {
            let call = DriverCall::Restore {
                pid,
                pairs: wire.clone(),
            };
            me.call(Op::Restore, pid, deadline_of(pid), call)
                .and_then(|r| DriverApi::code_of(Op::Restore, pid, r))
        })
    }

    fn lock_many(&mut self, pids: &[Pid], limits: LockLimits, width: usize) -> Vec<JobResult> {
        let timeout_ms = lock_timeout_ms(limits.driver);
        let call = |pid| DriverCall::Lock { pid, timeout_ms };
        self.code_many(Op::Lock, per_pid(pids, limits.wait, &call), width)
    }

    fn unlock_many(&mut self, pids: &[Pid], width: usize) -> Vec<JobResult> {
        let op = Op::Unlock;
        let deadline = op_deadline(op, self.timeout);
        let results = self.code_many(op, per_pid(pids, deadline, &DriverCall::Unlock), width);
        self.after_lost_many(op, results, pids, &|me, pid| {
            me.call(op, pid, deadline, DriverCall::Unlock(pid))
                .and_then(|r| DriverApi::code_of(op, pid, r))
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// A scripted driver: fixed version, optional failure of the version query, per-op codes
    /// and an optional per-op delay.
    #[derive(Default)]
    pub(crate) struct FakeDriver {
        pub version: Option<i32>,
        pub version_error: Option<CUresult>,
        pub tid: Option<Result<i32, CUresult>>,
        pub delay: Option<Duration>,
        pub lock_code: Option<CUresult>,
        pub seen_lock_ms: Mutex<Option<u32>>,
        pub seen_pairs: Mutex<Vec<CUcheckpointGpuPair>>,
        pub inits: AtomicUsize,
    }

    impl CudaDriver for FakeDriver {
        fn custom_storage(&self) -> bool {
            self.version.unwrap_or(13000) >= abi::cuda::CUSTOM_STORAGE_MIN_DRIVER_VERSION
        }
        fn driver_version(&self) -> Result<i32, CUresult> {
            match self.version_error {
                Some(e) => Err(e),
                None => Ok(self.version.unwrap_or(13000)),
            }
        }
        fn init(&self) -> CUresult {
            self.inits.fetch_add(1, Ordering::SeqCst);
            CUresult::SUCCESS
        }
        fn restore_tid(&self, pid: Pid) -> Result<i32, CUresult> {
            if let Some(d) = self.delay {
                std::thread::sleep(d);
            }
            self.tid.unwrap_or(Ok(pid + 1))
        }
        fn state(&self, _pid: Pid) -> Result<CUprocessState, CUresult> {
            Ok(CUprocessState::RUNNING)
        }
        fn lock(&self, _pid: Pid, timeout_ms: u32) -> CUresult {
            *self.seen_lock_ms.lock().unwrap() = Some(timeout_ms);
            self.lock_code.unwrap_or(CUresult::SUCCESS)
        }
        fn checkpoint(&self, _pid: Pid) -> CUresult {
            CUresult::SUCCESS
        }
        fn restore(&self, _pid: Pid, pairs: &[CUcheckpointGpuPair]) -> CUresult {
            *self.seen_pairs.lock().unwrap() = pairs.to_vec();
            CUresult::SUCCESS
        }
        fn unlock(&self, _pid: Pid) -> CUresult {
            CUresult::SUCCESS
        }
    }

    fn backend(d: FakeDriver, op: Option<Duration>) -> (DriverApi, Arc<AtomicUsize>) {
        let abandoned = Arc::new(AtomicUsize::new(0));
        let a = Arc::clone(&abandoned);
        let api = DriverApi::new(
            Arc::new(d),
            op,
            Worker::new(Arc::new(move || {
                a.fetch_add(1, Ordering::SeqCst);
            })),
        );
        (api, abandoned)
    }

    #[test]
    fn probe_classifies_versions_and_failures() {
        let load = |d: FakeDriver| -> Result<Arc<dyn CudaDriver>, LoadError> { Ok(Arc::new(d)) };
        for (v, ok) in [
            (12080, false),
            (12090, false),
            (12999, false),
            (13000, true),
            (13040, true),
        ] {
            let p = probe_driver(
                load(FakeDriver {
                    version: Some(v),
                    ..Default::default()
                }),
                false,
            );
            assert_eq!(
                matches!(p, DriverProbe::Supported { version, init: None, .. } if version == v),
                ok,
                "version {v}: {p:?}"
            );
            if !ok {
                assert!(
                    matches!(p, DriverProbe::Unsupported(ref r) if r.contains("13000")),
                    "{p:?}"
                );
            }
        }
        let p = probe_driver(
            load(FakeDriver {
                version_error: Some(CUresult::ERROR_UNKNOWN),
                ..Default::default()
            }),
            false,
        );
        assert!(
            matches!(p, DriverProbe::Error(ref r) if r.contains("CUDA_ERROR_UNKNOWN")),
            "{p:?}"
        );
        let p = probe_driver(
            Err(LoadError::SymbolMissing("cuCheckpointProcessLock")),
            false,
        );
        assert!(
            matches!(p, DriverProbe::Unsupported(ref r) if r.contains("cuCheckpointProcessLock"))
        );
        let p = probe_driver(Err(LoadError::LibraryAbsent("not found".into())), false);
        assert!(matches!(p, DriverProbe::Unsupported(_)));
        let p = probe_driver(load(FakeDriver::default()), true);
        assert!(
            matches!(
                p,
                DriverProbe::Supported {
                    init: Some(CUresult::SUCCESS),
                    ..
                }
            ),
            "restore probes call cuInit"
        );
    }

    #[test]
    fn restore_tid_maps_not_cuda_codes_to_none() {
        for (tid, want) in [
            (Ok(77), Some(77)),
            (Ok(0), None),
            (Err(CUresult::ERROR_INVALID_VALUE), None),
            (Err(CUresult::ERROR_NOT_INITIALIZED), None),
        ] {
            let (mut b, _) = backend(
                FakeDriver {
                    tid: Some(tid),
                    ..Default::default()
                },
                None,
            );
            assert_eq!(b.get_restore_tid(5).unwrap(), want, "{tid:?}");
        }
        let (mut b, _) = backend(
            FakeDriver {
                tid: Some(Err(CUresult::ERROR_OPERATING_SYSTEM)),
                ..Default::default()
            },
            None,
        );
        let e = b.get_restore_tid(5).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("CUDA_ERROR_OPERATING_SYSTEM")
                && m.contains("pid 5")
                && m.contains("driver-api"),
            "{m}"
        );
    }

    #[test]
    fn lock_passes_the_timeout_in_ms_and_names_the_code() {
        let d = Arc::new(FakeDriver {
            lock_code: Some(CUresult::ERROR_NOT_READY),
            ..Default::default()
        });
        let mut b = DriverApi::new(d.clone(), None, Worker::new(Arc::new(|| {})));
        let e = b
            .lock(
                9,
                LockLimits::from_timeout(Some(Duration::from_millis(1500))),
            )
            .unwrap_err();
        assert!(e.is_timeout(), "NOT_READY is the lock timeout");
        assert_eq!(
            e.to_string(),
            "failed to lock pid 9 via driver-api: CUDA_ERROR_NOT_READY"
        );
        assert_eq!(*d.seen_lock_ms.lock().unwrap(), Some(1500));
    }

    #[test]
    fn restore_passes_pairs() {
        let d = Arc::new(FakeDriver::default());
        let mut b = DriverApi::new(d.clone(), None, Worker::new(Arc::new(|| {})));
        let a = abi::GpuUuid([1; 16]);
        let c = abi::GpuUuid([2; 16]);
        b.restore(3, &[(a, c)], None).unwrap();
        b.restore(3, &[], None).unwrap();
        assert_eq!(
            d.inits.load(Ordering::SeqCst),
            1,
            "cuInit once, before the first restore"
        );
        b.restore(3, &[(a, c)], None).unwrap();
        let seen = d.seen_pairs.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].old_uuid, a.to_cu());
        assert_eq!(seen[0].new_uuid, c.to_cu());
    }

    #[test]
    fn a_blocked_call_times_out_is_abandoned_and_blocks_further_calls_until_it_returns() {
        let (mut b, abandoned) = backend(
            FakeDriver {
                delay: Some(Duration::from_millis(400)),
                ..Default::default()
            },
            Some(Duration::from_millis(50)),
        );
        let e = b.get_restore_tid(1).unwrap_err();
        assert!(
            matches!(
                e,
                BackendError::Timeout {
                    op: Op::GetRestoreTid,
                    pid: 1,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("timed out"), "{e}");
        assert_eq!(
            abandoned.load(Ordering::SeqCst),
            1,
            "the library gets pinned"
        );
        assert!(b.has_outstanding_call());
        let e = b.unlock(2).unwrap_err();
        assert!(
            matches!(e, BackendError::Busy { pid: 2, .. }),
            "at most one outstanding call: {e:?}"
        );
        std::thread::sleep(Duration::from_millis(600));
        assert!(!b.has_outstanding_call(), "the worker finished");
        b.unlock(2)
            .expect("usable again once the abandoned call returned");
    }

    #[test]
    fn settle_waits_for_an_abandoned_call_within_its_limit() {
        let (mut b, _) = backend(
            FakeDriver {
                delay: Some(Duration::from_millis(300)),
                ..Default::default()
            },
            Some(Duration::from_millis(20)),
        );
        assert_eq!(
            b.settle(Duration::ZERO),
            super::super::Settled::Nothing,
            "nothing outstanding"
        );
        b.get_restore_tid(1).unwrap_err();
        assert_eq!(
            b.settle(Duration::from_millis(10)),
            super::super::Settled::StillBlocked,
            "still blocked after a short wait"
        );
        let t = std::time::Instant::now();
        assert_eq!(
            b.settle(Duration::from_secs(5)),
            super::super::Settled::Returned,
            "returns once it is done"
        );
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        b.unlock(2).expect("usable after settling");
    }

    #[test]
    fn settle_gives_up_on_a_call_that_stays_blocked_and_lets_later_calls_through() {
        let (mut b, _) = backend(
            FakeDriver {
                delay: Some(Duration::from_millis(400)),
                ..Default::default()
            },
            Some(Duration::from_millis(20)),
        );
        b.get_restore_tid(1).unwrap_err();
        assert!(matches!(b.unlock(2), Err(BackendError::Busy { .. })));
        assert_eq!(
            b.settle(Duration::from_millis(10)),
            super::super::Settled::StillBlocked,
            "gave up waiting"
        );
        assert!(!b.has_outstanding_call());
        b.unlock(2)
            .expect("no longer refused because of the abandoned call");
        std::thread::sleep(Duration::from_millis(500));
        b.unlock(3)
            .expect("the old worker's return changes nothing");
    }
}
