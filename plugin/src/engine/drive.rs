//! The state-driven walk back to a task's target state, shared by the dump's rollback
//! ([`super::dump`]) and the guardian ([`crate::agent`]).

use crate::backend::{Backend, BackendError, GpuPair, Pid};
use abi::CUprocessState;
use std::time::Duration;

/// How long [`drive`] waits for a task with an open custom-storage operation (CHECKPOINTING,
/// RESTORING) to leave it: the driver aborts the operation when the copier that opened it
/// exits (the mock's model, see `docs/custom-storage.md`), which the plugin has made happen.
pub const OPEN_OPERATION_WAIT: Duration = Duration::from_secs(10);

/// How [`drive`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driven {
    /// The task is in the target state.
    Reached,
    /// The task is less advanced than the target (RUNNING, or LOCKED for a CHECKPOINTED
    /// target): someone else changed it, and it is left so (never re-locked).
    LessAdvanced(CUprocessState),
}

/// Why [`drive`] failed.
#[derive(Debug)]
pub enum DriveError {
    Backend(BackendError),
    /// A state the machine has no way back from.
    BadState(CUprocessState),
}

/// Drives `pid` to `target`, state-driven: query the state, then restore (with `pairs` and the
/// deadline `restore_deadline` gives) and unlock as needed. Every step taken is added to
/// `steps`. Shared by the rollback and the guardian.
pub fn drive(
    backend: &mut dyn Backend,
    pid: Pid,
    target: CUprocessState,
    pairs: &[GpuPair],
    restore_deadline: &mut dyn FnMut() -> Option<Duration>,
    steps: &mut Vec<&'static str>,
) -> Result<Driven, DriveError> {
    let mut state = backend.get_state(pid).map_err(DriveError::Backend)?;
    let mut waited = false;
    loop {
        match (state, target) {
            (s, t) if s == t => return Ok(Driven::Reached),
            (CUprocessState::CHECKPOINTED, _) => {
                backend
                    .restore(pid, pairs, restore_deadline())
                    .map_err(DriveError::Backend)?;
                steps.push("restored");
                state = CUprocessState::LOCKED;
            }
            (CUprocessState::LOCKED, CUprocessState::RUNNING) => {
                backend.unlock(pid).map_err(DriveError::Backend)?;
                steps.push("unlocked");
                state = CUprocessState::RUNNING;
            }
            (CUprocessState::RUNNING | CUprocessState::LOCKED, _) => {
                return Ok(Driven::LessAdvanced(state))
            }
            (CUprocessState::CHECKPOINTING | CUprocessState::RESTORING, _) if !waited => {
                // A custom-storage operation is open: its copier failed (or was killed) and
                // the driver aborts what the copier had open once it has exited. Wait for that,
                // bounded, then act on the state it leaves.
                waited = true;
                let until = std::time::Instant::now() + OPEN_OPERATION_WAIT;
                while matches!(
                    state,
                    CUprocessState::CHECKPOINTING | CUprocessState::RESTORING
                ) && std::time::Instant::now() < until
                {
                    std::thread::sleep(Duration::from_millis(20));
                    state = backend.get_state(pid).map_err(DriveError::Backend)?;
                }
            }
            (state, _) => return Err(DriveError::BadState(state)),
        }
    }
}
