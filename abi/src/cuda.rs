//! CUDA driver types used by the process-checkpoint API (CUDA 12.8 … 13.4), LP64 layout.
//!
//! `CUresult` and `CUprocessState` are transparent `u32` newtypes rather than Rust enums: a driver
//! may return values this crate does not know, and they must survive a round trip untouched.

use std::ffi::{c_uint, CStr};
use std::fmt;

/// `CUresult` (`enum cudaError_enum`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct CUresult(pub c_uint);

macro_rules! cu_results {
    ($( $(#[$m:meta])* $ident:ident = $value:expr, $name:literal, $text:literal; )*) => {
        impl CUresult {
            $( $(#[$m])* pub const $ident: CUresult = CUresult($value); )*

            /// Every code this crate knows, in numeric order.
            pub const KNOWN: &'static [CUresult] = &[$(CUresult::$ident),*];

            /// The enum identifier (`CUDA_ERROR_INVALID_VALUE`), as `cuGetErrorName` returns it,
            /// or `None` for a code this crate does not know.
            #[must_use]
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $( $value => Some($name), )*
                    _ => None,
                }
            }

            /// NUL-terminated form of [`CUresult::name`], for C callers.
            #[must_use]
            pub const fn name_cstr(self) -> Option<&'static CStr> {
                match self.0 {
                    $( $value => Some(match CStr::from_bytes_with_nul(concat!($name, "\0").as_bytes()) {
                        Ok(c) => c,
                        Err(_) => panic!("name contains a NUL"),
                    }), )*
                    _ => None,
                }
            }

            /// The description, as `cuGetErrorString` returns it, or `None` when unknown.
            #[must_use]
            pub const fn description(self) -> Option<&'static str> {
                match self.0 {
                    $( $value => Some($text), )*
                    _ => None,
                }
            }

            /// NUL-terminated form of [`CUresult::description`], for C callers.
            #[must_use]
            pub const fn description_cstr(self) -> Option<&'static CStr> {
                match self.0 {
                    $( $value => Some(match CStr::from_bytes_with_nul(concat!($text, "\0").as_bytes()) {
                        Ok(c) => c,
                        Err(_) => panic!("description contains a NUL"),
                    }), )*
                    _ => None,
                }
            }
        }
    };
}

cu_results! {
    SUCCESS = 0, "CUDA_SUCCESS", "no error";
    ERROR_INVALID_VALUE = 1, "CUDA_ERROR_INVALID_VALUE", "invalid argument";
    ERROR_OUT_OF_MEMORY = 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory";
    ERROR_NOT_INITIALIZED = 3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error";
    ERROR_DEINITIALIZED = 4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down";
    ERROR_NO_DEVICE = 100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected";
    ERROR_INVALID_DEVICE = 101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal";
    ERROR_INVALID_CONTEXT = 201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context";
    ERROR_OPERATING_SYSTEM = 304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS";
    ERROR_INVALID_HANDLE = 400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle";
    ERROR_ILLEGAL_STATE = 401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state";
    ERROR_NOT_FOUND = 500, "CUDA_ERROR_NOT_FOUND", "named symbol not found";
    ERROR_NOT_READY = 600, "CUDA_ERROR_NOT_READY", "device not ready";
    ERROR_ILLEGAL_ADDRESS = 700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered";
    ERROR_NOT_PERMITTED = 800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted";
    ERROR_NOT_SUPPORTED = 801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported";
    ERROR_STREAM_CAPTURE_UNSUPPORTED = 900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing";
    ERROR_TIMEOUT = 909, "CUDA_ERROR_TIMEOUT", "wait operation timed out";
    ERROR_UNKNOWN = 999, "CUDA_ERROR_UNKNOWN", "unknown error";
}

impl CUresult {
    /// True for `CUDA_SUCCESS`.
    #[must_use]
    pub const fn is_success(self) -> bool {
        self.0 == 0
    }

    /// Looks a code up by its enum identifier (`CUDA_ERROR_NOT_READY`) or its number.
    #[must_use]
    pub fn from_name(s: &str) -> Option<CUresult> {
        let s = s.trim();
        if let Ok(n) = s.parse::<u32>() {
            return Some(CUresult(n));
        }
        Self::KNOWN.iter().copied().find(|c| c.name() == Some(s))
    }

    /// The exit status a `cuda-checkpoint` process reports for this code (the code modulo 256).
    #[must_use]
    pub const fn exit_status(self) -> u8 {
        (self.0 % 256) as u8
    }
}

impl fmt::Display for CUresult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "CUresult({})", self.0),
        }
    }
}

impl fmt::Debug for CUresult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self} ({})", self.0)
    }
}

/// `CUprocessState` (`enum CUprocessState_enum`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct CUprocessState(pub c_uint);

impl CUprocessState {
    pub const RUNNING: CUprocessState = CUprocessState(0);
    pub const LOCKED: CUprocessState = CUprocessState(1);
    pub const CHECKPOINTED: CUprocessState = CUprocessState(2);
    pub const FAILED: CUprocessState = CUprocessState(3);
    /// CUDA 13.4, custom storage only.
    pub const CHECKPOINTING: CUprocessState = CUprocessState(4);
    /// CUDA 13.4, custom storage only.
    pub const RESTORING: CUprocessState = CUprocessState(5);

    /// The enum identifier (`CU_PROCESS_STATE_LOCKED`).
    #[must_use]
    pub const fn name(self) -> Option<&'static str> {
        match self.0 {
            0 => Some("CU_PROCESS_STATE_RUNNING"),
            1 => Some("CU_PROCESS_STATE_LOCKED"),
            2 => Some("CU_PROCESS_STATE_CHECKPOINTED"),
            3 => Some("CU_PROCESS_STATE_FAILED"),
            4 => Some("CU_PROCESS_STATE_CHECKPOINTING"),
            5 => Some("CU_PROCESS_STATE_RESTORING"),
            _ => None,
        }
    }

    /// The lowercase word `cuda-checkpoint --get-state` prints (`running`, `locked`, ...).
    #[must_use]
    pub const fn cli_word(self) -> Option<&'static str> {
        match self.0 {
            0 => Some("running"),
            1 => Some("locked"),
            2 => Some("checkpointed"),
            3 => Some("failed"),
            4 => Some("checkpointing"),
            5 => Some("restoring"),
            _ => None,
        }
    }

    /// Parses the CLI word back (exact, lowercase).
    #[must_use]
    pub fn from_cli_word(s: &str) -> Option<CUprocessState> {
        (0..=5)
            .map(CUprocessState)
            .find(|st| st.cli_word() == Some(s))
    }
}

impl fmt::Display for CUprocessState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cli_word() {
            Some(w) => f.write_str(w),
            None => write!(f, "state({})", self.0),
        }
    }
}

impl fmt::Debug for CUprocessState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self} ({})", self.0)
    }
}

/// `CUdevice`: a device ordinal in the caller's visible view.
pub type CUdevice = std::ffi::c_int;
/// `CUdeviceptr`.
pub type CUdeviceptr = u64;
/// `CUcontext`: an opaque pointer.
pub type CUcontext = *mut std::ffi::c_void;

/// `CUuuid` (`struct CUuuid_st { char bytes[16]; }`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
#[repr(C)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUcheckpointGpuPair` (CUDA 13.0+): restore the GPU `old_uuid` onto `new_uuid`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
#[repr(C)]
pub struct CUcheckpointGpuPair {
    pub old_uuid: CUuuid,
    pub new_uuid: CUuuid,
}

/// `CUcheckpointLockArgs`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[repr(C)]
pub struct CUcheckpointLockArgs {
    /// Milliseconds to wait for the lock; 0 waits forever.
    pub timeout_ms: u32,
    pub reserved0: u32,
    pub reserved1: [u64; 7],
}

/// `CUstream`: an opaque pointer.
pub type CUstream = *mut std::ffi::c_void;

/// `CUcheckpointOperationHandle` (CUDA 13.4): an opaque pointer naming one open custom-storage
/// operation, given to `cuCheckpointOperationComplete`.
pub type CUcheckpointOperationHandle = *mut std::ffi::c_void;

/// `CUcheckpointCustomStoragePerDeviceData` (CUDA 13.4): one GPU's share of a custom-storage
/// operation, in the *caller's* context on that GPU: the target's memory mapped at `dev_ptr`
/// (`size` bytes), to be copied on `stream`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(C)]
pub struct CUcheckpointCustomStoragePerDeviceData {
    pub dev_ptr: CUdeviceptr,
    pub size: usize,
    pub stream: CUstream,
}

/// `CUcheckpointCustomStorageInfo` (CUDA 13.4): what the driver hands back through
/// `customStorageInfo_out`. The driver allocates and fills it; it stays valid until
/// `cuCheckpointOperationComplete(handle)`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(C)]
pub struct CUcheckpointCustomStorageInfo {
    pub handle: CUcheckpointOperationHandle,
    pub per_device_data: *mut CUcheckpointCustomStoragePerDeviceData,
    pub device_count: u32,
}

/// `CUcheckpointCheckpointArgs` in the 13.4 spelling. Before 13.4 all 64 bytes are reserved;
/// a NULL `custom_storage_info_out` keeps the classic checkpoint to host memory, so a zeroed
/// struct means the same on every driver.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(C)]
pub struct CUcheckpointCheckpointArgs {
    pub custom_storage_info_out: *mut *mut CUcheckpointCustomStorageInfo,
    pub reserved: [u8; 56],
}

impl Default for CUcheckpointCheckpointArgs {
    fn default() -> Self {
        Self {
            custom_storage_info_out: std::ptr::null_mut(),
            reserved: [0; 56],
        }
    }
}

/// `CUcheckpointRestoreArgs` in the 13.4 spelling. On 12.8/12.9 drivers all 64 bytes are
/// reserved, so `gpu_pairs` must stay NULL there; before 13.4 `custom_storage_info_out` (and
/// `padding0`) are reserved bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(C)]
pub struct CUcheckpointRestoreArgs {
    pub gpu_pairs: *mut CUcheckpointGpuPair,
    pub gpu_pairs_count: u32,
    pub padding0: u32,
    pub custom_storage_info_out: *mut *mut CUcheckpointCustomStorageInfo,
    pub reserved: [u8; 40],
}

impl Default for CUcheckpointRestoreArgs {
    fn default() -> Self {
        Self {
            gpu_pairs: std::ptr::null_mut(),
            gpu_pairs_count: 0,
            padding0: 0,
            custom_storage_info_out: std::ptr::null_mut(),
            reserved: [0; 40],
        }
    }
}

/// `CUcheckpointUnlockArgs`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[repr(C)]
pub struct CUcheckpointUnlockArgs {
    pub reserved: [u64; 8],
}

/// `CUdriverProcAddressQueryResult`.
pub mod proc_address_query {
    pub const SUCCESS: u32 = 0;
    pub const SYMBOL_NOT_FOUND: u32 = 1;
    pub const VERSION_NOT_SUFFICIENT: u32 = 2;
}

/// The `cuGetExportTable` id under which the driver serves the `cuda-checkpoint` command line.
pub const CHECKPOINT_CLI_EXPORT_TABLE_ID: CUuuid = CUuuid {
    bytes: [
        0x69, 0xa2, 0x8e, 0x9f, 0x24, 0x49, 0x8b, 0x47, 0xb0, 0x30, 0xc5, 0xda, 0x33, 0x0e, 0xa4,
        0xe9,
    ],
};
/// Byte offset of the CLI entry point (`int (int argc, char **argv)`) in that table.
pub const CHECKPOINT_CLI_EXPORT_TABLE_ENTRY_OFFSET: usize = 0x38;
/// Smallest table size (its first 8-byte word) the utility accepts.
pub const CHECKPOINT_CLI_EXPORT_TABLE_MIN_SIZE: u64 = 64;
/// Oldest driver (`cuDriverGetVersion`) the utility runs on: CUDA 12.4, driver r550.
pub const CHECKPOINT_CLI_MIN_DRIVER_VERSION: i32 = 12040;
/// Oldest driver with the `cuCheckpointProcess*` entry points (CUDA 12.8, r570).
pub const CHECKPOINT_API_MIN_DRIVER_VERSION: i32 = 12080;
/// Oldest driver whose restore arguments carry GPU pairs (CUDA 13.0, r580).
pub const GPU_PAIRS_MIN_DRIVER_VERSION: i32 = 13000;
/// Oldest driver with custom storage (`customStorageInfo_out`, `cuCheckpointOperationComplete`,
/// the CHECKPOINTING and RESTORING states): CUDA 13.4. Callers probe it with
/// `cuGetProcAddress("cuCheckpointOperationComplete", 13040)`.
pub const CUSTOM_STORAGE_MIN_DRIVER_VERSION: i32 = 13040;

/// The checkpoint CLI export table as the utility reads it: the table size, six unused slots,
/// then the command-line entry point at byte offset 0x38.
#[derive(Debug)]
#[repr(C)]
pub struct CheckpointCliExportTable {
    pub size: u64,
    pub reserved: [usize; 6],
    pub run: Option<
        unsafe extern "C" fn(
            argc: std::ffi::c_int,
            argv: *mut *mut std::ffi::c_char,
        ) -> std::ffi::c_int,
    >,
}

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<CUresult>() == 4);
    assert!(size_of::<CUprocessState>() == 4);
    assert!(size_of::<CUuuid>() == 16 && align_of::<CUuuid>() == 1);
    assert!(size_of::<CUcheckpointGpuPair>() == 32 && align_of::<CUcheckpointGpuPair>() == 1);
    assert!(offset_of!(CUcheckpointGpuPair, old_uuid) == 0);
    assert!(offset_of!(CUcheckpointGpuPair, new_uuid) == 16);
    assert!(size_of::<CUcheckpointLockArgs>() == 64 && align_of::<CUcheckpointLockArgs>() == 8);
    assert!(offset_of!(CUcheckpointLockArgs, timeout_ms) == 0);
    assert!(offset_of!(CUcheckpointLockArgs, reserved0) == 4);
    assert!(offset_of!(CUcheckpointLockArgs, reserved1) == 8);
    assert!(size_of::<CUcheckpointCheckpointArgs>() == 64);
    assert!(align_of::<CUcheckpointCheckpointArgs>() == 8);
    assert!(size_of::<CUcheckpointRestoreArgs>() == 64);
    assert!(align_of::<CUcheckpointRestoreArgs>() == 8);
    assert!(offset_of!(CUcheckpointRestoreArgs, gpu_pairs) == 0);
    assert!(offset_of!(CUcheckpointRestoreArgs, gpu_pairs_count) == 8);
    assert!(offset_of!(CUcheckpointRestoreArgs, padding0) == 12);
    assert!(offset_of!(CUcheckpointRestoreArgs, custom_storage_info_out) == 16);
    assert!(offset_of!(CUcheckpointRestoreArgs, reserved) == 24);
    assert!(offset_of!(CUcheckpointCheckpointArgs, custom_storage_info_out) == 0);
    assert!(offset_of!(CUcheckpointCheckpointArgs, reserved) == 8);
    assert!(size_of::<CUcheckpointCustomStoragePerDeviceData>() == 24);
    assert!(offset_of!(CUcheckpointCustomStoragePerDeviceData, dev_ptr) == 0);
    assert!(offset_of!(CUcheckpointCustomStoragePerDeviceData, size) == 8);
    assert!(offset_of!(CUcheckpointCustomStoragePerDeviceData, stream) == 16);
    assert!(size_of::<CUcheckpointCustomStorageInfo>() == 24);
    assert!(offset_of!(CUcheckpointCustomStorageInfo, handle) == 0);
    assert!(offset_of!(CUcheckpointCustomStorageInfo, per_device_data) == 8);
    assert!(offset_of!(CUcheckpointCustomStorageInfo, device_count) == 16);
    assert!(size_of::<CUcheckpointUnlockArgs>() == 64);
    assert!(align_of::<CUcheckpointUnlockArgs>() == 8);
    assert!(size_of::<CheckpointCliExportTable>() == 64);
    assert!(offset_of!(CheckpointCliExportTable, run) == CHECKPOINT_CLI_EXPORT_TABLE_ENTRY_OFFSET);
};

/// Byte view of an argument struct, for "reserved bytes must be zero" checks.
pub trait ReservedBytes {
    /// True when every byte that a driver of CUDA `version` (`cuDriverGetVersion`) treats as
    /// reserved is zero: the GPU pairs of restore arguments are read from 13.0
    /// ([`GPU_PAIRS_MIN_DRIVER_VERSION`]), the custom-storage pointers from 13.4
    /// ([`CUSTOM_STORAGE_MIN_DRIVER_VERSION`]); below those they are reserved too.
    fn reserved_clear(&self, version: i32) -> bool;
}

impl ReservedBytes for CUcheckpointLockArgs {
    fn reserved_clear(&self, _: i32) -> bool {
        self.reserved0 == 0 && self.reserved1.iter().all(|&w| w == 0)
    }
}

impl ReservedBytes for CUcheckpointCheckpointArgs {
    fn reserved_clear(&self, version: i32) -> bool {
        self.reserved.iter().all(|&b| b == 0)
            && (version >= CUSTOM_STORAGE_MIN_DRIVER_VERSION
                || self.custom_storage_info_out.is_null())
    }
}

impl ReservedBytes for CUcheckpointRestoreArgs {
    fn reserved_clear(&self, version: i32) -> bool {
        let tail = self.reserved.iter().all(|&b| b == 0) && self.padding0 == 0;
        let pairs = version >= GPU_PAIRS_MIN_DRIVER_VERSION
            || (self.gpu_pairs.is_null() && self.gpu_pairs_count == 0);
        let custom =
            version >= CUSTOM_STORAGE_MIN_DRIVER_VERSION || self.custom_storage_info_out.is_null();
        tail && pairs && custom
    }
}

impl ReservedBytes for CUcheckpointUnlockArgs {
    fn reserved_clear(&self, _: i32) -> bool {
        self.reserved.iter().all(|&w| w == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_descriptions_cover_every_known_code() {
        for c in CUresult::KNOWN {
            let name = c.name().unwrap();
            assert_eq!(c.name_cstr().unwrap().to_str().unwrap(), name);
            assert_eq!(
                c.description_cstr().unwrap().to_str().unwrap(),
                c.description().unwrap()
            );
            assert_eq!(CUresult::from_name(name), Some(*c));
        }
        assert_eq!(CUresult(12345).name(), None);
        assert_eq!(CUresult(12345).to_string(), "CUresult(12345)");
        assert_eq!(
            CUresult::from_name("401"),
            Some(CUresult::ERROR_ILLEGAL_STATE)
        );
        assert_eq!(CUresult::ERROR_OPERATING_SYSTEM.exit_status(), 48);
        assert_eq!(CUresult::ERROR_ILLEGAL_STATE.exit_status(), 145);
    }

    #[test]
    fn process_state_words_round_trip() {
        for v in 0..6 {
            let st = CUprocessState(v);
            assert_eq!(
                CUprocessState::from_cli_word(st.cli_word().unwrap()),
                Some(st)
            );
        }
        assert_eq!(CUprocessState(9).to_string(), "state(9)");
    }

    #[test]
    fn reserved_bytes_are_checked() {
        let mut l = CUcheckpointLockArgs::default();
        assert!(l.reserved_clear(13000));
        l.reserved1[6] = 1;
        assert!(!l.reserved_clear(13000));
        let mut pair = CUcheckpointGpuPair::default();
        let r = CUcheckpointRestoreArgs {
            gpu_pairs: &mut pair,
            gpu_pairs_count: 1,
            ..Default::default()
        };
        assert!(r.reserved_clear(13000));
        assert!(
            !r.reserved_clear(12090),
            "pairs are reserved bytes before CUDA 13.0"
        );
        let mut info: *mut CUcheckpointCustomStorageInfo = std::ptr::null_mut();
        let c = CUcheckpointCheckpointArgs {
            custom_storage_info_out: &mut info,
            ..Default::default()
        };
        assert!(c.reserved_clear(13040));
        assert!(
            !c.reserved_clear(13030),
            "the custom-storage pointer is a reserved byte before CUDA 13.4"
        );
        let r = CUcheckpointRestoreArgs {
            custom_storage_info_out: &mut info,
            ..Default::default()
        };
        assert!(r.reserved_clear(13040));
        assert!(!r.reserved_clear(13030));
        let r = CUcheckpointRestoreArgs {
            padding0: 1,
            ..Default::default()
        };
        assert!(!r.reserved_clear(13040), "padding0 must stay zero");
    }
}
