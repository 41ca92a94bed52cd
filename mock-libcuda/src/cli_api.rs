//! The interface between the `cuda-checkpoint` command line ([`crate::cli`]) and the driver
//! that carries its operations out. The real implementation lives in [`crate::driver`]; unit
//! tests of the command line use a fake.

use abi::{CUprocessState, CUresult, GpuUuid};

/// The checkpoint operations the command line needs, as the driver performs them for the
/// calling process. Every method returns the driver's `CUresult` on failure.
pub trait CheckpointDriver {
    /// `cuDriverGetVersion`.
    fn driver_version(&self) -> i32;
    /// Driver branch and full version string (`580`, `"580.65.06"`), for the help banner.
    fn branch(&self) -> (u32, String);
    /// `cuInit(0)` in the calling process (needed before a restore).
    fn init(&self) -> Result<(), CUresult>;
    /// `cuCheckpointProcessGetRestoreThreadId`.
    fn get_restore_tid(&self, pid: i32) -> Result<i32, CUresult>;
    /// `cuCheckpointProcessGetState`.
    fn get_state(&self, pid: i32) -> Result<CUprocessState, CUresult>;
    /// `cuCheckpointProcessLock` with `timeoutMs` (0 = wait forever).
    fn lock(&self, pid: i32, timeout_ms: u32) -> Result<(), CUresult>;
    /// `cuCheckpointProcessCheckpoint`.
    fn checkpoint(&self, pid: i32) -> Result<(), CUresult>;
    /// `cuCheckpointProcessRestore` with GPU pairs (`old`, `new`); empty means none.
    fn restore(&self, pid: i32, pairs: &[(GpuUuid, GpuUuid)]) -> Result<(), CUresult>;
    /// `cuCheckpointProcessUnlock`.
    fn unlock(&self, pid: i32) -> Result<(), CUresult>;
}
