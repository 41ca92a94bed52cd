//! The two ways of driving a process's CUDA checkpoint state machine, behind one trait.
//!
//! * [`driver::DriverApi`]: `libcuda.so.1`'s `cuCheckpointProcess*` entry points, opened at run
//!   time (never linked). Each call runs on a worker thread so it can be abandoned on timeout.
//! * [`cli::Cli`]: the `cuda-checkpoint` utility, spawned with an argv (no shell), captured
//!   output, a deadline, and kill-and-reap on timeout.
//!
//! Both speak in the same [`Op`]s and report failures as a [`BackendError`] that names the
//! operation, the pid, the backend and, where there is one, the CUDA code by name.
//!
//! The state machine they drive (NVIDIA, CUDA 12.8+):
//!
//! ```text
//!  RUNNING --lock--> LOCKED --checkpoint--> CHECKPOINTED
//!     ^                |  ^                      |
//!     +----unlock------+  +-------restore--------+
//! ```

pub mod cli;
pub mod drive;
pub mod driver;
pub mod registry;

pub use registry::BackendKind;

use abi::{CUprocessState, CUresult, GpuUuid};
use std::fmt;
use std::time::Duration;

pub use crate::task::{Pid, Tid};

/// A GPU remapping for restore: (GPU at dump time, GPU to restore onto).
pub type GpuPair = (GpuUuid, GpuUuid);

/// One backend operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `cuInit(0)` in the calling process, which restore needs (driver API only).
    Init,
    GetRestoreTid,
    GetState,
    Lock,
    Checkpoint,
    Restore,
    Unlock,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Init => "initialise the driver for",
            Op::GetRestoreTid => "get the restore thread",
            Op::GetState => "get the checkpoint state",
            Op::Lock => "lock",
            Op::Checkpoint => "checkpoint",
            Op::Restore => "restore",
            Op::Unlock => "unlock",
        })
    }
}

/// Extra wait, beyond the lock's own timeout, before the plugin gives up on a lock call: the
/// driver (or the utility) enforces `timeoutMs` itself and needs a moment to report it.
pub const LOCK_GRACE: Duration = Duration::from_secs(2);

/// How long a rollback waits for an abandoned *lock* to return: the plugin abandons a lock only
/// after the driver's own lock timeout and a grace have passed, so a lock still blocked then is
/// taken to be hung after this much more. (Other calls have no timeout of the driver's own and
/// may legitimately finish late: for them the rollback waits longer.)
pub const LOCK_ABANDON_GRACE: Duration = Duration::from_millis(500);

/// How long to wait for `op` given the configured per-operation timeout (`None` = forever).
#[must_use]
pub fn op_deadline(op: Op, timeout: Option<Duration>) -> Option<Duration> {
    match op {
        Op::Lock => timeout.map(|t| t + LOCK_GRACE),
        _ => timeout,
    }
}

/// How long one lock may take.
///
/// `driver` is the timeout the lock itself is given (`timeoutMs` of `cuCheckpointProcessLock`,
/// `--timeout` of the utility): how long the driver waits for the task's work in flight before
/// it gives up with `CUDA_ERROR_NOT_READY`, leaving the task running. `wait` is how long the
/// plugin waits for the call to return at all before it abandons it (driver API) or kills it
/// (utility); it leaves the driver a moment to report its own timeout. `None` means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockLimits {
    pub driver: Option<Duration>,
    pub wait: Option<Duration>,
}

impl LockLimits {
    /// The limits for the per-operation `timeout` alone: the driver gets the timeout, the plugin
    /// waits [`LOCK_GRACE`] longer.
    #[must_use]
    pub fn from_timeout(timeout: Option<Duration>) -> Self {
        LockLimits {
            driver: timeout,
            wait: op_deadline(Op::Lock, timeout),
        }
    }

    /// The limits for a lock that must be over within `window` (CRIU's freeze alarm): when the
    /// usual limits would outlast it, the plugin waits exactly `window` and the driver is given
    /// `window` less a grace of a fifth of it (at most [`LOCK_GRACE`]) to report its own
    /// timeout. Returns the limits and whether the window shortened them.
    #[must_use]
    pub fn within(self, window: Duration) -> (Self, bool) {
        if self.wait.is_some_and(|w| w <= window) {
            return (self, false);
        }
        let grace = LOCK_GRACE.min(window / 5);
        let driver_max = window.saturating_sub(grace);
        let driver = Some(self.driver.map_or(driver_max, |d| d.min(driver_max)));
        (
            LockLimits {
                driver,
                wait: Some(window),
            },
            true,
        )
    }
}

/// The lock call's own timeout in milliseconds (0 = none), saturated to `u32`.
#[must_use]
pub fn lock_timeout_ms(timeout: Option<Duration>) -> u32 {
    timeout.map_or(0, |t| {
        u32::try_from(t.as_millis()).unwrap_or(u32::MAX).max(1)
    })
}

/// How the plugin treats a failed call, by backend, operation and driver result: the one place
/// where it tells failure codes apart. Every decision the plugin makes from a code (is there CUDA
/// state at all, may the call have taken effect, did the driver's lock time out) goes through
/// it, so the codes of one class are handled alike, and the fault sweep tests one code per class
/// (`harness::sweep::CODE_GROUPS`, checked against this function).
///
/// Through `cuda-checkpoint` the plugin sees the utility's exit status, the `CUresult` modulo
/// 256 ([`CUresult::exit_status`]). Calls without a target (`cuInit`, `cuDriverGetVersion`, the
/// GPU enumeration; [`Op::Init`] here) have one class for every failure: the plugin only tells
/// success from failure there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FailureClass {
    /// What callers observe from "get the restore thread" for a process without CUDA state:
    /// `CUDA_ERROR_INVALID_VALUE` or `CUDA_ERROR_NOT_INITIALIZED` (exit status 1 or 3). The task
    /// is not the plugin's.
    NoCudaState,
    /// A definite refusal, `CUDA_ERROR_ILLEGAL_STATE` (exit status 145): the task's state does
    /// not allow the operation (for a lock: someone else locked it first). It did not take
    /// effect.
    Refused,
    /// The driver's own lock timeout, `CUDA_ERROR_NOT_READY` through the driver API: the lock
    /// gave up and left the task running.
    LockTimeout,
    /// Any other failure: it may have taken effect, so the state must be checked (and a lock
    /// undone).
    Other,
}

impl FailureClass {
    /// The class of `code` returned by `op` through `backend` (`code` is not a success).
    #[must_use]
    pub fn of(backend: BackendKind, op: Op, code: CUresult) -> Self {
        match backend {
            BackendKind::DriverApi => Self::of_driver(op, code),
            BackendKind::CudaCheckpoint => Self::of_exit(op, i32::from(code.exit_status())),
        }
    }

    fn of_driver(op: Op, code: CUresult) -> Self {
        match (op, code) {
            (Op::Init, _) => Self::Other,
            (
                Op::GetRestoreTid,
                CUresult::ERROR_INVALID_VALUE | CUresult::ERROR_NOT_INITIALIZED,
            ) => Self::NoCudaState,
            (_, CUresult::ERROR_ILLEGAL_STATE) => Self::Refused,
            (_, CUresult::ERROR_NOT_READY) => Self::LockTimeout,
            _ => Self::Other,
        }
    }

    /// The class of the utility's exit status `status` (not 0) for `op`.
    #[must_use]
    pub fn of_exit(op: Op, status: i32) -> Self {
        let illegal = i32::from(CUresult::ERROR_ILLEGAL_STATE.exit_status());
        let no_cuda = [
            i32::from(CUresult::ERROR_INVALID_VALUE.exit_status()),
            i32::from(CUresult::ERROR_NOT_INITIALIZED.exit_status()),
        ];
        match op {
            Op::Init => Self::Other,
            Op::GetRestoreTid if no_cuda.contains(&status) => Self::NoCudaState,
            _ if status == illegal => Self::Refused,
            _ => Self::Other,
        }
    }
}

/// A failed backend operation.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("failed to {op} pid {pid} via {backend}: {code}")]
    Cuda {
        backend: BackendKind,
        op: Op,
        pid: Pid,
        code: CUresult,
    },
    #[error("failed to {op} pid {pid} via {backend}: timed out after {}", crate::message::Span(*after))]
    Timeout {
        backend: BackendKind,
        op: Op,
        pid: Pid,
        after: Duration,
    },
    #[error("failed to {op} pid {pid} via driver-api: an earlier driver call ({blocked}) timed out and is still blocked")]
    Busy { op: Op, pid: Pid, blocked: String },
    #[error("failed to {op} pid {pid} via cuda-checkpoint: `{command}` exited with {status}{}: {}", guess_code(*.status), crate::message::quote(output))]
    Exit {
        op: Op,
        pid: Pid,
        command: String,
        status: ExitInfo,
        output: String,
    },
    #[error(
        "failed to {op} pid {pid} via {backend}: unexpected output {}",
        crate::message::quote_debug(output)
    )]
    BadOutput {
        backend: BackendKind,
        op: Op,
        pid: Pid,
        output: String,
    },
    #[error("failed to {op} pid {pid} via cuda-checkpoint: it exited ({status}) but its output stayed open {} longer (a process it started still holds it); killed its process group", crate::message::Span(*waited))]
    OutputHeld {
        op: Op,
        pid: Pid,
        status: ExitInfo,
        waited: Duration,
    },
    #[error("failed to {op} pid {pid} via cuda-checkpoint: cannot run {program}: {source}")]
    Spawn {
        op: Op,
        pid: Pid,
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// The utility was not run: somebody other than root can change it ([`crate::trust`]).
    #[error("failed to {op} pid {pid} via cuda-checkpoint: not run: {source}")]
    Untrusted {
        op: Op,
        pid: Pid,
        source: Box<crate::trust::TrustError>,
    },
    #[error("failed to {op} pid {pid} via driver-api: the plugin's helper process, which runs the driver calls, is gone ({why})")]
    HelperLost { op: Op, pid: Pid, why: String },
    #[error("failed to {op} pid {pid} via driver-api with custom storage: {why}")]
    CustomStorage { op: Op, pid: Pid, why: String },
    #[error("failed to {op} pid {pid} via {backend}: {what}")]
    Unsupported {
        backend: BackendKind,
        op: Op,
        pid: Pid,
        what: &'static str,
    },
}

impl BackendError {
    /// The operation that failed.
    #[must_use]
    pub fn op(&self) -> Op {
        match self {
            BackendError::Cuda { op, .. }
            | BackendError::Timeout { op, .. }
            | BackendError::Busy { op, .. }
            | BackendError::Exit { op, .. }
            | BackendError::OutputHeld { op, .. }
            | BackendError::BadOutput { op, .. }
            | BackendError::Spawn { op, .. }
            | BackendError::Untrusted { op, .. }
            | BackendError::HelperLost { op, .. }
            | BackendError::CustomStorage { op, .. }
            | BackendError::Unsupported { op, .. } => *op,
        }
    }

    /// Whether the operation may have taken effect despite the failure, so that the state must
    /// be checked (and a lock undone): everything but a definite refusal. Definite refusals are
    /// `CUDA_ERROR_ILLEGAL_STATE` (the task was not in a state that allows the operation: for a
    /// lock, someone else locked it first), a call that was never started (busy, cannot spawn)
    /// and an unsupported request.
    #[must_use]
    pub fn may_have_landed(&self) -> bool {
        match self {
            BackendError::Cuda {
                backend, op, code, ..
            } => FailureClass::of(*backend, *op, *code) != FailureClass::Refused,
            BackendError::Exit {
                op,
                status: ExitInfo::Code(c),
                ..
            } => FailureClass::of_exit(*op, *c) != FailureClass::Refused,
            BackendError::Exit {
                status: ExitInfo::Signal(_),
                ..
            } => true,
            BackendError::Timeout { .. }
            | BackendError::OutputHeld { .. }
            | BackendError::BadOutput { .. }
            | BackendError::CustomStorage { .. }
            | BackendError::HelperLost { .. } => true,
            BackendError::Busy { .. }
            | BackendError::Spawn { .. }
            | BackendError::Untrusted { .. }
            | BackendError::Unsupported { .. } => false,
        }
    }

    /// Whether the driver refused the operation because of the task's state
    /// (`CUDA_ERROR_ILLEGAL_STATE`, exit status 145 from the utility).
    #[must_use]
    pub fn is_illegal_state(&self) -> bool {
        !self.may_have_landed()
            && matches!(self, BackendError::Cuda { .. } | BackendError::Exit { .. })
    }

    /// True when the driver gave a lock up at its timeout, waiting for the task's work in
    /// flight: `CUDA_ERROR_NOT_READY` through the driver API, exit status 88 from the utility.
    /// (Not a call the plugin stopped waiting for: that one is a driver that does not answer.)
    #[must_use]
    pub fn is_driver_lock_timeout(&self) -> bool {
        let not_ready = i32::from(CUresult::ERROR_NOT_READY.exit_status());
        match self {
            BackendError::Cuda {
                backend, op, code, ..
            } => FailureClass::of(*backend, *op, *code) == FailureClass::LockTimeout,
            BackendError::Exit {
                op: Op::Lock,
                status: ExitInfo::Code(c),
                ..
            } => *c == not_ready,
            _ => false,
        }
    }

    /// True when the failure was a timeout (ours or the driver's lock timeout).
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        match self {
            BackendError::Timeout { .. } => true,
            BackendError::Cuda {
                backend, op, code, ..
            } => FailureClass::of(*backend, *op, *code) == FailureClass::LockTimeout,
            _ => false,
        }
    }
}

/// How a `cuda-checkpoint` process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitInfo {
    Code(i32),
    Signal(i32),
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitInfo::Code(c) => write!(f, "status {c}"),
            ExitInfo::Signal(s) => write!(f, "signal {s}"),
        }
    }
}

/// The utility exits with the failing `CUresult` modulo 256; name the code when exactly one
/// known code has that remainder.
fn guess_code(status: ExitInfo) -> String {
    let ExitInfo::Code(c) = status else {
        return String::new();
    };
    let Ok(c) = u8::try_from(c) else {
        return String::new();
    };
    let mut hits = CUresult::KNOWN
        .iter()
        .filter(|r| !r.is_success() && r.exit_status() == c);
    match (hits.next(), hits.next()) {
        (Some(r), None) => format!(" (probably {r})"),
        _ => String::new(),
    }
}

/// One task's part of a batch ([`Backend::checkpoint_many`], [`Backend::restore_many`]): the
/// task and how long its call may take (`None`: until it returns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    pub pid: Pid,
    pub deadline: Option<Duration>,
}

/// One job's result in a batch, and how long its call took.
pub type JobResult = (Result<(), BackendError>, Duration);

/// Runs `f` and measures it: the default batches' one-after-another step.
pub(crate) fn timed_job(f: impl FnOnce() -> Result<(), BackendError>) -> JobResult {
    let t = std::time::Instant::now();
    let r = f();
    (r, t.elapsed())
}

/// One backend: the six operations of the checkpoint state machine for one target process.
///
/// Implementations never block longer than their configured timeout (plus [`LOCK_GRACE`] for
/// `lock`), except when that timeout is "none".
pub trait Backend: Send {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// The CUDA restore thread of `pid`, or `None` when `pid` has no CUDA state.
    fn get_restore_tid(&mut self, pid: Pid) -> Result<Option<Tid>, BackendError>;
    /// The checkpoint state of `pid`.
    fn get_state(&mut self, pid: Pid) -> Result<CUprocessState, BackendError>;
    /// RUNNING -> LOCKED, within `limits`.
    fn lock(&mut self, pid: Pid, limits: LockLimits) -> Result<(), BackendError>;
    /// LOCKED -> CHECKPOINTED, waiting at most `deadline` (`None`: until it returns); the
    /// engine sizes it by the task's bytes ([`crate::nvml::copy_deadline`]).
    fn checkpoint(&mut self, pid: Pid, deadline: Option<Duration>) -> Result<(), BackendError>;
    /// CHECKPOINTED -> LOCKED, remapping GPUs by `pairs` (empty = no remapping), waiting at most
    /// `deadline`.
    fn restore(
        &mut self,
        pid: Pid,
        pairs: &[GpuPair],
        deadline: Option<Duration>,
    ) -> Result<(), BackendError>;
    /// LOCKED -> RUNNING.
    fn unlock(&mut self, pid: Pid) -> Result<(), BackendError>;
    /// LOCKED -> CHECKPOINTED for every job, at most `width` calls at a time, each within its
    /// own deadline; one result per job, in order (a failure belongs to its own job only). The
    /// default runs them one after another.
    fn checkpoint_many(&mut self, jobs: &[Job], width: usize) -> Vec<JobResult> {
        let _ = width;
        jobs.iter()
            .map(|j| timed_job(|| self.checkpoint(j.pid, j.deadline)))
            .collect()
    }
    /// CHECKPOINTED -> LOCKED for every job (see [`Backend::checkpoint_many`]).
    fn restore_many(&mut self, jobs: &[Job], pairs: &[GpuPair], width: usize) -> Vec<JobResult> {
        let _ = width;
        jobs.iter()
            .map(|j| timed_job(|| self.restore(j.pid, pairs, j.deadline)))
            .collect()
    }
    /// RUNNING -> LOCKED for every pid, each within `limits` (see [`Backend::checkpoint_many`]).
    fn lock_many(&mut self, pids: &[Pid], limits: LockLimits, width: usize) -> Vec<JobResult> {
        let _ = width;
        pids.iter()
            .map(|&p| timed_job(|| self.lock(p, limits)))
            .collect()
    }
    /// LOCKED -> RUNNING for every pid (see [`Backend::checkpoint_many`]).
    fn unlock_many(&mut self, pids: &[Pid], width: usize) -> Vec<JobResult> {
        let _ = width;
        pids.iter().map(|&p| timed_job(|| self.unlock(p))).collect()
    }
    /// Custom storage: what checkpointing `pid` wrote, for its task image (`None`: its GPU
    /// memory stayed with the task, or this backend has no custom storage).
    fn custom_written(&self, pid: Pid) -> Option<crate::image::CustomRecord> {
        let _ = pid;
        None
    }
    /// Custom storage, at restore: what the dump recorded for the task that is `pid` now, so
    /// that its restore reads its files. Backends without custom storage ignore it (`init`
    /// refuses such an image before any task is touched).
    fn set_custom_recorded(&mut self, pid: Pid, rec: crate::image::CustomRecord) {
        let _ = (pid, rec);
    }
    /// Custom storage, after a failed dump's rollback: removes the files this dump wrote, but
    /// those of `keep` (tasks that could not be put back: the files may hold their only copy of
    /// their GPU memory). Returns how many it removed.
    fn discard_custom_files(&mut self, keep: &[Pid]) -> usize {
        let _ = keep;
        0
    }
    /// Custom storage: a log line on what `pid`'s last checkpoint or restore moved.
    fn custom_summary(&self, pid: Pid) -> Option<String> {
        let _ = pid;
        None
    }
    /// How many external processes the backend ran so far (the CLI's executions), if any.
    fn executions(&self) -> Option<usize> {
        None
    }
    /// Waits at most `limit` for a call abandoned on timeout to return; true when none is
    /// outstanding (any more). While one is, the driver-API backend refuses every other call, so
    /// the rollback waits here first: without this, a task locked before the one whose lock timed
    /// out could not be unlocked, and a late lock would go unnoticed. When the call is still
    /// blocked after `limit`, the backend stops waiting for it (later calls are no longer refused
    /// because of it) and returns [`Settled::StillBlocked`]. Backends that never abandon a call (the CLI kills and
    /// reaps its child) have nothing to wait for.
    fn settle(&mut self, limit: Duration) -> Settled {
        let _ = limit;
        Settled::Nothing
    }
}

/// What [`Backend::settle`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// No call was outstanding: nothing was waited for.
    Nothing,
    /// An abandoned call returned within the limit.
    Returned,
    /// A call was still blocked after the limit; the backend stopped waiting for it.
    StillBlocked,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_names_the_probable_code() {
        assert_eq!(
            guess_code(ExitInfo::Code(88)),
            " (probably CUDA_ERROR_NOT_READY)"
        );
        assert_eq!(
            guess_code(ExitInfo::Code(145)),
            " (probably CUDA_ERROR_ILLEGAL_STATE)"
        );
        assert_eq!(guess_code(ExitInfo::Code(0)), "");
        assert_eq!(guess_code(ExitInfo::Signal(9)), "");
    }

    #[test]
    fn lock_gets_a_grace_period_and_ms_saturate() {
        let t = Some(Duration::from_secs(10));
        assert_eq!(op_deadline(Op::Lock, t), Some(Duration::from_secs(12)));
        assert_eq!(op_deadline(Op::Checkpoint, t), t);
        assert_eq!(op_deadline(Op::Lock, None), None);
        assert_eq!(lock_timeout_ms(t), 10_000);
        assert_eq!(lock_timeout_ms(None), 0, "0 = wait forever");
        assert_eq!(
            lock_timeout_ms(Some(Duration::from_secs(u64::MAX / 4))),
            u32::MAX
        );
        assert_eq!(
            lock_timeout_ms(Some(Duration::from_micros(10))),
            1,
            "never 0 = forever by accident"
        );
    }

    #[test]
    fn failure_classes_by_backend_op_and_code() {
        use BackendKind::{CudaCheckpoint as Cli, DriverApi as Api};
        use FailureClass::{LockTimeout, NoCudaState, Other, Refused};
        let cases = [
            (
                Api,
                Op::GetRestoreTid,
                CUresult::ERROR_INVALID_VALUE,
                NoCudaState,
            ),
            (
                Api,
                Op::GetRestoreTid,
                CUresult::ERROR_NOT_INITIALIZED,
                NoCudaState,
            ),
            (Api, Op::Lock, CUresult::ERROR_INVALID_VALUE, Other),
            (Api, Op::Lock, CUresult::ERROR_ILLEGAL_STATE, Refused),
            (Api, Op::Lock, CUresult::ERROR_NOT_READY, LockTimeout),
            (Api, Op::Restore, CUresult::ERROR_OUT_OF_MEMORY, Other),
            (Api, Op::Init, CUresult::ERROR_ILLEGAL_STATE, Other),
            (
                Cli,
                Op::GetRestoreTid,
                CUresult::ERROR_INVALID_VALUE,
                NoCudaState,
            ),
            (
                Cli,
                Op::GetRestoreTid,
                CUresult::ERROR_NOT_INITIALIZED,
                NoCudaState,
            ),
            (Cli, Op::Checkpoint, CUresult::ERROR_INVALID_VALUE, Other),
            (Cli, Op::Lock, CUresult::ERROR_ILLEGAL_STATE, Refused),
            // The utility's lock timeout is an exit status like any other.
            (Cli, Op::Lock, CUresult::ERROR_NOT_READY, Other),
            (Cli, Op::Unlock, CUresult::ERROR_UNKNOWN, Other),
        ];
        for (b, op, code, want) in cases {
            assert_eq!(FailureClass::of(b, op, code), want, "{b} {op} {code}");
        }
        // The errors' own answers follow the class.
        let e = |code| BackendError::Cuda {
            backend: Api,
            op: Op::Lock,
            pid: 7,
            code,
        };
        assert!(!e(CUresult::ERROR_ILLEGAL_STATE).may_have_landed());
        assert!(e(CUresult::ERROR_UNKNOWN).may_have_landed());
        assert!(e(CUresult::ERROR_NOT_READY).is_timeout());
        assert!(!e(CUresult::ERROR_UNKNOWN).is_timeout());
        let exit = |c| BackendError::Exit {
            op: Op::Lock,
            pid: 7,
            command: String::new(),
            status: ExitInfo::Code(c),
            output: String::new(),
        };
        assert!(!exit(145).may_have_landed());
        assert!(exit(231).may_have_landed());
    }
}
