//! What the plugin asks of the machine it runs on, as a trait: its GPUs (CUDA's enumeration and
//! NVML's view of their memory), its available memory and its process tree. CRIU's own services
//! are [`crate::host::Criu`]; the engine and `init` take both as one [`crate::host::Host`].
//!
//! The real implementation ([`crate::session::criu_host::CriuHost`]) runs the GPU calls in the plugin's
//! helper process when one runs ([`crate::agent::Access`]), else on the session's worker, each
//! within a limit; tests use recording fakes.

use crate::backend::driver::LoadError;
use crate::inventory::GpuInfo;
use crate::nvml::{NvmlError, Snapshot};
use crate::task::Pid;
use crate::worker::CallError;
use abi::CUresult;
use std::time::Duration;

/// Why the GPUs could not be enumerated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// `libcuda.so.1` or one of the enumeration's entry points is missing.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A driver call of the enumeration failed.
    #[error("{call} failed with {code}")]
    Driver { call: &'static str, code: CUresult },
    /// The enumeration did not finish within its limit, or an earlier call still blocks.
    #[error("cuInit or the GPU enumeration: {0}")]
    Call(CallError),
    /// The helper process enumerated and failed; its error, as it worded it.
    #[error("{0}")]
    Relayed(String),
    /// The helper process answered the enumeration with something else.
    #[error("the GPU enumeration: the helper answered {0}")]
    Protocol(String),
}

impl From<crate::ffi::cuda::EnumError> for GpuError {
    fn from(e: crate::ffi::cuda::EnumError) -> Self {
        use crate::ffi::cuda::EnumError;
        match e {
            EnumError::Load(e) => GpuError::Load(e),
            EnumError::Driver { call, code } => GpuError::Driver { call, code },
        }
    }
}

/// [`crate::ffi::cuda::enumerate_gpus`] on `worker`, given up after `limit` (`cuInit` or an
/// enumeration call that hangs in a broken driver must not hang CRIU; see [`crate::worker`] for
/// what happens to a call given up on).
pub fn enumerate_gpus_within(
    worker: &crate::worker::Worker,
    limit: Option<Duration>,
) -> Result<Vec<GpuInfo>, GpuError> {
    worker
        .call(
            "cuInit/GPU enumeration",
            limit,
            crate::ffi::cuda::enumerate_gpus,
        )
        .map_err(GpuError::Call)?
        .map_err(GpuError::from)
}

/// The machine's resources, as `init` and the engine use them.
pub trait Machine: Send {
    /// The GPUs of CRIU's view (see [`crate::inventory`] for the enumeration rule), within
    /// `limit` (`None`: no limit).
    fn current_gpus(&mut self, limit: Option<Duration>) -> Result<Vec<GpuInfo>, GpuError>;
    /// NVML's view of the GPUs' memory and its users, within `limit`.
    fn gpu_memory(&mut self, limit: Option<Duration>) -> Result<Snapshot, NvmlError>;
    /// The machine's available memory (`MemAvailable`), bytes.
    fn memory_available(&self) -> Option<u64>;
    /// `root` and every process below it.
    fn tree(&self, root: Pid) -> Vec<Pid>;
}
