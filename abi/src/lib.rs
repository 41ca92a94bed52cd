//! C ABI mirrors shared by every crate of criu-cuda.
//!
//! * [`criu`]: CRIU's plugin descriptor (`cr_plugin_desc_t`), hook numbers and stages.
//! * [`cuda`]: the CUDA driver types used by the process-checkpoint API (`CUresult`,
//!   `CUprocessState`, `CUuuid`, the four argument structs and `CUcheckpointGpuPair`).
//! * [`nvml`]: the NVML types a process-memory query needs (`nvmlReturn_t`, `nvmlMemory_t`,
//!   `nvmlMemory_v2_t`, `nvmlProcessInfo_t`).
//! * [`uuid`]: the text form of a GPU UUID (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
//!
//! Every `#[repr(C)]` type carries compile-time assertions of its size, alignment and field
//! offsets, so a layout drift is a build failure rather than memory corruption at run time.
//! Declarations follow the published API descriptions; no vendor header is copied.

pub mod criu;
pub mod cuda;
pub mod nvml;
pub mod uuid;

pub use cuda::{
    CUcheckpointCheckpointArgs, CUcheckpointCustomStorageInfo,
    CUcheckpointCustomStoragePerDeviceData, CUcheckpointGpuPair, CUcheckpointLockArgs,
    CUcheckpointOperationHandle, CUcheckpointRestoreArgs, CUcheckpointUnlockArgs, CUprocessState,
    CUresult, CUstream, CUuuid,
};
pub use uuid::{GpuUuid, UuidParseError};
