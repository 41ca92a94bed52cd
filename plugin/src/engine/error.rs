//! What can go wrong in a hook, and the messages that say so: [`EngineError`], with the hook
//! or step it belongs to ([`Step`]).

use crate::backend::{BackendError, Pid, Tid};
use crate::host::HostError;
use crate::image::ImageError;
use crate::thread::ThreadError;
use abi::CUprocessState;
use std::fmt;
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

/// A lifecycle failure. A variant with a `cause` keeps it as its [`source`](std::error::Error::source)
/// and says only where it happened; [`crate::message::Report`] writes the whole message (the
/// backend's own message names the pid, so a backend failure reads `STEP: failed to OP pid P
/// via BACKEND: …`, the pid once).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{step}")]
    Backend {
        step: Step,
        pid: Pid,
        #[source]
        cause: BackendError,
    },
    #[error("{step} pid {pid}")]
    Thread {
        step: Step,
        pid: Pid,
        #[source]
        cause: ThreadError,
    },
    #[error("{step} pid {pid}: the CUDA state is {state}, which cannot be checkpointed")]
    BadState {
        step: Step,
        pid: Pid,
        state: CUprocessState,
    },
    #[error("{}", freeze_timeout_message(*pid, *criu_timeout, *left, cause.as_ref(), *narrow))]
    FreezeTimeout {
        pid: Pid,
        /// CRIU's `--timeout`, when known.
        criu_timeout: Option<u32>,
        /// What was left of it when the lock started; `None`: it had already expired.
        left: Option<Duration>,
        /// The lock's failure, when one was tried.
        cause: Option<BackendError>,
        /// The lock ran with fewer tasks locked at once than the tree has (how many: 1 in
        /// sequential mode): the message names the likely cause, a collective (see
        /// `collective_hint`).
        narrow: Option<usize>,
    },
    /// A lock that timed out while the tree's tasks were locked fewer at a time than it has
    /// (`width`; 1 in sequential mode): the backend's failure, and the likely cause.
    #[error("PAUSE_DEVICES: {cause}; {}", collective_hint(*width))]
    LockTimeout {
        pid: Pid,
        cause: BackendError,
        width: usize,
    },
    #[error(
        "PAUSE_DEVICES: another tool locked the task while the dump was starting ({cause}; its \
         state is now {state}); that lock is not ours and is left alone"
    )]
    ForeignLock {
        pid: Pid,
        state: String,
        cause: BackendError,
    },
    #[error(
        "PAUSE_DEVICES pid {pid}: the task is stopped (its CUDA restore thread {tid} is in state \
         {state:?}), so the driver cannot lock it and the lock could only time out; continue it \
         (kill -CONT {pid}) and dump again"
    )]
    Stopped { pid: Pid, tid: Tid, state: char },
    #[error(
        "PAUSE_DEVICES pid {pid}: the tree's CUDA tasks hold {} of GPU memory (NVML), which their \
         checkpoints stage in host memory, but the host has only {} available (MemAvailable): \
         the dump would get a task OOM-killed halfway; refusing before any task is locked \
         (cuda_plugin.check-capacity=off overrides)",
        crate::nvml::gib(*need),
        crate::nvml::gib(*available)
    )]
    HostTooSmall { pid: Pid, need: u64, available: u64 },
    #[error("{}", mig_message(on_mig))]
    MigGpu {
        /// Each task of the tree with a context on a GPU in MIG mode, and that GPU.
        on_mig: Vec<(Pid, abi::GpuUuid)>,
    },
    #[error("CHECKPOINT_DEVICES pid {pid}: failed to add cuda_plugin to the inventory")]
    Inventory {
        pid: Pid,
        #[source]
        cause: HostError,
    },
    #[error("{step} pid {pid}: task image")]
    ImageIo {
        step: Step,
        pid: Pid,
        #[source]
        cause: HostError,
    },
    #[error("CHECKPOINT_DEVICES pid {pid}")]
    GpuInventory {
        pid: Pid,
        #[source]
        cause: crate::inventory::InventoryError,
    },
    #[error("RESUME_DEVICES_LATE pid {pid}: task image {}", crate::image::file_name(*pid))]
    ImageFormat {
        pid: Pid,
        #[source]
        cause: ImageError,
    },
    #[error(
        "RESUME_DEVICES_LATE pid {pid}: the dump recorded CUDA state for this task, but the \
         driver knows no CUDA restore thread for it now"
    )]
    NoRestoreThread { pid: Pid },
    #[error("dump finish: {} task(s) could not be put back in their initial CUDA state: pids {pids:?}", pids.len())]
    RollbackIncomplete { pids: Vec<Pid> },
}

impl crate::message::Caused for EngineError {
    fn caused_by(&self) -> Option<&dyn std::fmt::Display> {
        match self {
            Self::Backend { cause, .. } => Some(cause),
            Self::Thread { cause, .. } => Some(cause),
            Self::Inventory { cause, .. } | Self::ImageIo { cause, .. } => Some(cause),
            Self::GpuInventory { cause, .. } => Some(cause),
            Self::ImageFormat { cause, .. } => Some(cause),
            Self::BadState { .. }
            | Self::FreezeTimeout { .. }
            | Self::LockTimeout { .. }
            | Self::ForeignLock { .. }
            | Self::Stopped { .. }
            | Self::HostTooSmall { .. }
            | Self::MigGpu { .. }
            | Self::NoRestoreThread { .. }
            | Self::RollbackIncomplete { .. } => None,
        }
    }
}

fn mig_message(on_mig: &[(Pid, abi::GpuUuid)]) -> String {
    let tasks: Vec<String> = on_mig
        .iter()
        .map(|(pid, gpu)| format!("pid {pid} on {gpu}"))
        .collect();
    format!(
        "PAUSE_DEVICES: {} task(s) of the tree run on a GPU in MIG mode (NVML): {}; the CUDA \
         driver cannot checkpoint a process on a MIG instance (its checkpoint fails, reported \
         as out of memory), so the dump is refused before any task is locked; to checkpoint \
         the job, run it on GPUs with MIG mode disabled",
        on_mig.len(),
        tasks.join(", ")
    )
}

/// The start of [`collective_hint`].
const COLLECTIVE_RANKS: &str = "if these tasks are ranks of a collective (NCCL ranks, say)";

/// The end of [`collective_hint`].
const COLLECTIVE_FIX: &str = "each rank's lock waits for its collective work in flight, which \
     waits for its peers; lock them all at once with cuda_plugin.parallel=auto (up to 16 \
     tasks) or cuda_plugin.parallel=N (N ranks)";

/// The likely cause of a lock that timed out while the tree's tasks were locked `width` at a
/// time (1: one at a time), fewer than it has: the ranks of a collective (NCCL's, say) each
/// wait for their peers.
pub(super) fn collective_hint(width: usize) -> String {
    if width <= 1 {
        format!("{COLLECTIVE_RANKS}, they cannot be locked one at a time: {COLLECTIVE_FIX}")
    } else {
        format!("{COLLECTIVE_RANKS}, they cannot be locked {width} at a time: {COLLECTIVE_FIX}")
    }
}

fn freeze_timeout_message(
    pid: Pid,
    criu_timeout: Option<u32>,
    left: Option<Duration>,
    cause: Option<&BackendError>,
    narrow: Option<usize>,
) -> String {
    let timeout = criu_timeout.map_or_else(
        || "CRIU's freezing timeout (--timeout)".to_owned(),
        |t| format!("CRIU's freezing timeout (--timeout {t} s)"),
    );
    // The lock's failure, when quoted, names the pid itself.
    let (task, what) = match (left, cause) {
        (None, _) => (
            format!(" pid {pid}"),
            format!("{timeout} has already expired; not locking the task"),
        ),
        (Some(l), None) => (
            format!(" pid {pid}"),
            format!(
                "only {} ms are left of {timeout}, too little to lock the task",
                crate::message::millis(l)
            ),
        ),
        (Some(l), Some(c)) => (
            String::new(),
            format!(
                "the lock did not finish within the {} ms left of {timeout} ({c})",
                crate::message::millis(l)
            ),
        ),
    };
    let hint = narrow.map_or_else(String::new, |w| format!("; {}", collective_hint(w)));
    format!(
        "PAUSE_DEVICES{task}: {what}; every CUDA task of the tree must be locked and frozen \
         within that timeout: raise it (criu dump --timeout SECONDS), or find out what keeps \
         the task's CUDA work from finishing{hint}"
    )
}
