//! NVML (NVIDIA Management Library) types used to learn which processes hold how much memory
//! on which GPU, LP64 layout.
//!
//! Written from the published NVML API reference (the `nvmlReturn_t` codes, the
//! `nvmlMemory_t`, `nvmlMemory_v2_t` and `nvmlProcessInfo_t` struct pages, the buffer-size
//! constants); no vendor header is copied. As with `CUresult`, [`NvmlReturn`] is a transparent
//! `u32` newtype so values this crate does not know survive untouched.
//!
//! The descriptions [`NvmlReturn::description`] gives (what the mock's `nvmlErrorString`
//! returns) are this crate's own short wording, not NVIDIA's exact strings.

use std::ffi::{c_uint, c_ulonglong, CStr};
use std::fmt;

/// `nvmlReturn_t` (`enum nvmlReturn_enum`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct NvmlReturn(pub c_uint);

macro_rules! nvml_returns {
    ($( $ident:ident = $value:expr, $name:literal, $text:literal; )*) => {
        impl NvmlReturn {
            $( #[doc = $text] pub const $ident: NvmlReturn = NvmlReturn($value); )*

            /// Every code this crate knows, in numeric order.
            pub const KNOWN: &'static [NvmlReturn] = &[$(NvmlReturn::$ident),*];

            /// The enum identifier (`NVML_ERROR_INSUFFICIENT_SIZE`), or `None` when unknown.
            #[must_use]
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $( $value => Some($name), )*
                    _ => None,
                }
            }

            /// A short description, or `None` for a code this crate does not know.
            #[must_use]
            pub const fn description(self) -> Option<&'static str> {
                match self.0 {
                    $( $value => Some($text), )*
                    _ => None,
                }
            }

            /// NUL-terminated form of [`NvmlReturn::description`] (`"Unknown Error"` for a
            /// code this crate does not know), for `nvmlErrorString`.
            #[must_use]
            pub const fn description_cstr(self) -> &'static CStr {
                match self.0 {
                    $( $value => match CStr::from_bytes_with_nul(concat!($text, "\0").as_bytes()) {
                        Ok(c) => c,
                        Err(_) => panic!("description contains a NUL"),
                    }, )*
                    _ => c"Unknown Error",
                }
            }
        }
    };
}

nvml_returns! {
    SUCCESS = 0, "NVML_SUCCESS", "Success";
    ERROR_UNINITIALIZED = 1, "NVML_ERROR_UNINITIALIZED", "Uninitialized";
    ERROR_INVALID_ARGUMENT = 2, "NVML_ERROR_INVALID_ARGUMENT", "Invalid Argument";
    ERROR_NOT_SUPPORTED = 3, "NVML_ERROR_NOT_SUPPORTED", "Not Supported";
    ERROR_NO_PERMISSION = 4, "NVML_ERROR_NO_PERMISSION", "Insufficient Permissions";
    ERROR_ALREADY_INITIALIZED = 5, "NVML_ERROR_ALREADY_INITIALIZED", "Already Initialized";
    ERROR_NOT_FOUND = 6, "NVML_ERROR_NOT_FOUND", "Not Found";
    ERROR_INSUFFICIENT_SIZE = 7, "NVML_ERROR_INSUFFICIENT_SIZE", "Insufficient Size";
    ERROR_INSUFFICIENT_POWER = 8, "NVML_ERROR_INSUFFICIENT_POWER", "Insufficient External Power";
    ERROR_DRIVER_NOT_LOADED = 9, "NVML_ERROR_DRIVER_NOT_LOADED", "Driver Not Loaded";
    ERROR_TIMEOUT = 10, "NVML_ERROR_TIMEOUT", "Timeout";
    ERROR_IRQ_ISSUE = 11, "NVML_ERROR_IRQ_ISSUE", "Interrupt Request Issue";
    ERROR_LIBRARY_NOT_FOUND = 12, "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML Shared Library Not Found";
    ERROR_FUNCTION_NOT_FOUND = 13, "NVML_ERROR_FUNCTION_NOT_FOUND", "Function Not Found";
    ERROR_CORRUPTED_INFOROM = 14, "NVML_ERROR_CORRUPTED_INFOROM", "Corrupted infoROM";
    ERROR_GPU_IS_LOST = 15, "NVML_ERROR_GPU_IS_LOST", "GPU is lost";
    ERROR_RESET_REQUIRED = 16, "NVML_ERROR_RESET_REQUIRED", "GPU requires a reset";
    ERROR_OPERATING_SYSTEM = 17, "NVML_ERROR_OPERATING_SYSTEM", "The operating system blocked the request";
    ERROR_LIB_RM_VERSION_MISMATCH = 18, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", "NVML and driver versions differ";
    ERROR_IN_USE = 19, "NVML_ERROR_IN_USE", "In use by another client";
    ERROR_MEMORY = 20, "NVML_ERROR_MEMORY", "Insufficient Memory";
    ERROR_NO_DATA = 21, "NVML_ERROR_NO_DATA", "No data";
    ERROR_VGPU_ECC_NOT_SUPPORTED = 22, "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED", "vGPU operation unavailable with ECC enabled";
    ERROR_INSUFFICIENT_RESOURCES = 23, "NVML_ERROR_INSUFFICIENT_RESOURCES", "Insufficient resources";
    ERROR_FREQ_NOT_SUPPORTED = 24, "NVML_ERROR_FREQ_NOT_SUPPORTED", "Frequency not supported";
    ERROR_ARGUMENT_VERSION_MISMATCH = 25, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", "Argument version mismatch";
    ERROR_DEPRECATED = 26, "NVML_ERROR_DEPRECATED", "Deprecated";
    ERROR_NOT_READY = 27, "NVML_ERROR_NOT_READY", "Not Ready";
    ERROR_GPU_NOT_FOUND = 28, "NVML_ERROR_GPU_NOT_FOUND", "GPU not found";
    ERROR_INVALID_STATE = 29, "NVML_ERROR_INVALID_STATE", "Invalid state";
    ERROR_UNKNOWN = 999, "NVML_ERROR_UNKNOWN", "Unknown Error";
}

impl NvmlReturn {
    /// True for `NVML_SUCCESS`.
    #[must_use]
    pub const fn is_success(self) -> bool {
        self.0 == 0
    }

    /// Looks a code up by its enum identifier (`NVML_ERROR_TIMEOUT`) or its number.
    #[must_use]
    pub fn from_name(s: &str) -> Option<NvmlReturn> {
        let s = s.trim();
        if let Ok(n) = s.parse::<u32>() {
            return Some(NvmlReturn(n));
        }
        Self::KNOWN.iter().copied().find(|c| c.name() == Some(s))
    }
}

impl fmt::Display for NvmlReturn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "nvmlReturn_t({})", self.0),
        }
    }
}

impl fmt::Debug for NvmlReturn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self} ({})", self.0)
    }
}

/// `nvmlDevice_t`: an opaque handle (a pointer the library hands out and the caller passes
/// back; callers never dereference it).
pub type NvmlDevice = *mut std::ffi::c_void;

/// `nvmlInitWithFlags` flag: do not fail initialisation when the host has no GPU.
pub const NVML_INIT_FLAG_NO_GPUS: c_uint = 1;
/// `nvmlInitWithFlags` flag: do not attach to the GPUs while initialising.
pub const NVML_INIT_FLAG_NO_ATTACH: c_uint = 2;

/// Buffer size that always fits a GPU UUID from `nvmlDeviceGetUUID`.
pub const NVML_DEVICE_UUID_BUFFER_SIZE: usize = 80;
/// The newer, larger UUID buffer size of the reference (room for MIG UUIDs).
pub const NVML_DEVICE_UUID_V2_BUFFER_SIZE: usize = 96;
/// Buffer size that always fits a name from `nvmlDeviceGetName`.
pub const NVML_DEVICE_NAME_BUFFER_SIZE: usize = 64;
/// The newer, larger name buffer size of the reference.
pub const NVML_DEVICE_NAME_V2_BUFFER_SIZE: usize = 96;
/// Buffer size that always fits the string of `nvmlSystemGetDriverVersion`.
pub const NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE: usize = 80;

/// "Not available" in a 64-bit value field (e.g. `usedGpuMemory` where the driver cannot
/// account memory per process).
pub const NVML_VALUE_NOT_AVAILABLE_ULL: c_ulonglong = c_ulonglong::MAX;
/// "Not available" in a 32-bit field (`gpuInstanceId`, `computeInstanceId` outside MIG).
pub const NVML_VALUE_NOT_AVAILABLE_UINT: c_uint = c_uint::MAX;

/// The version word of a versioned NVML struct: its size in the low 24 bits, the version
/// number above them.
#[must_use]
pub const fn struct_version(size: usize, version: u32) -> c_uint {
    (size as c_uint) | (version << 24)
}

/// `nvmlMemory_t` (v1), filled by `nvmlDeviceGetMemoryInfo`. `used` counts reserved memory
/// as well, so `total = free + used`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[repr(C)]
pub struct NvmlMemory {
    /// Total device memory, bytes.
    pub total: c_ulonglong,
    /// Unallocated device memory, bytes.
    pub free: c_ulonglong,
    /// Allocated (and reserved) device memory, bytes.
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`, filled by `nvmlDeviceGetMemoryInfo_v2`: the caller sets `version` to
/// [`NVML_MEMORY_V2`]; `reserved` is the memory the driver and firmware set aside.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[repr(C)]
pub struct NvmlMemoryV2 {
    /// Must be [`NVML_MEMORY_V2`].
    pub version: c_uint,
    /// Total device memory, bytes.
    pub total: c_ulonglong,
    /// Memory reserved for the driver and firmware, bytes.
    pub reserved: c_ulonglong,
    /// Unallocated device memory, bytes.
    pub free: c_ulonglong,
    /// Allocated device memory, bytes.
    pub used: c_ulonglong,
}

/// The `version` word of [`NvmlMemoryV2`] (`nvmlMemory_v2`).
pub const NVML_MEMORY_V2: c_uint = struct_version(std::mem::size_of::<NvmlMemoryV2>(), 2);

/// `nvmlProcessInfo_t` as the `_v2` and `_v3` process queries
/// (`nvmlDeviceGetComputeRunningProcesses_v3`) fill it: one process with a compute context on
/// the GPU.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[repr(C)]
pub struct NvmlProcessInfo {
    /// Process id (as the host sees it).
    pub pid: c_uint,
    /// Device memory the process uses, bytes, or [`NVML_VALUE_NOT_AVAILABLE_ULL`].
    pub used_gpu_memory: c_ulonglong,
    /// MIG GPU instance, or [`NVML_VALUE_NOT_AVAILABLE_UINT`] outside MIG.
    pub gpu_instance_id: c_uint,
    /// MIG compute instance, or [`NVML_VALUE_NOT_AVAILABLE_UINT`] outside MIG.
    pub compute_instance_id: c_uint,
}

/// `nvmlEnableState_t`: a feature's state as `nvmlDeviceGetPersistenceMode` reports it
/// (`NVML_FEATURE_DISABLED` = 0, `NVML_FEATURE_ENABLED` = 1). A C enum, so a transparent `u32`
/// newtype: a value this crate does not know survives untouched.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
#[repr(transparent)]
pub struct NvmlEnableState(pub c_uint);

impl NvmlEnableState {
    /// `NVML_FEATURE_DISABLED`.
    pub const DISABLED: NvmlEnableState = NvmlEnableState(0);
    /// `NVML_FEATURE_ENABLED`.
    pub const ENABLED: NvmlEnableState = NvmlEnableState(1);
}

/// `NVML_DEVICE_MIG_DISABLE`: the MIG mode `nvmlDeviceGetMigMode` reports for a GPU not in MIG
/// mode (its current and pending modes are `unsigned int`s).
pub const NVML_DEVICE_MIG_DISABLE: c_uint = 0;
/// `NVML_DEVICE_MIG_ENABLE`: the GPU is (or, as the pending mode, will be after a reset) in MIG
/// mode.
pub const NVML_DEVICE_MIG_ENABLE: c_uint = 1;

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<NvmlEnableState>() == 4 && align_of::<NvmlEnableState>() == 4);
    assert!(size_of::<NvmlReturn>() == 4);
    assert!(size_of::<NvmlMemory>() == 24 && align_of::<NvmlMemory>() == 8);
    assert!(offset_of!(NvmlMemory, total) == 0);
    assert!(offset_of!(NvmlMemory, free) == 8);
    assert!(offset_of!(NvmlMemory, used) == 16);
    assert!(size_of::<NvmlMemoryV2>() == 40 && align_of::<NvmlMemoryV2>() == 8);
    assert!(offset_of!(NvmlMemoryV2, version) == 0);
    assert!(offset_of!(NvmlMemoryV2, total) == 8);
    assert!(offset_of!(NvmlMemoryV2, reserved) == 16);
    assert!(offset_of!(NvmlMemoryV2, free) == 24);
    assert!(offset_of!(NvmlMemoryV2, used) == 32);
    assert!(NVML_MEMORY_V2 == 0x0200_0028);
    assert!(size_of::<NvmlProcessInfo>() == 24 && align_of::<NvmlProcessInfo>() == 8);
    assert!(offset_of!(NvmlProcessInfo, pid) == 0);
    assert!(offset_of!(NvmlProcessInfo, used_gpu_memory) == 8);
    assert!(offset_of!(NvmlProcessInfo, gpu_instance_id) == 16);
    assert!(offset_of!(NvmlProcessInfo, compute_instance_id) == 20);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_descriptions_cover_every_known_code() {
        for c in NvmlReturn::KNOWN {
            let name = c.name().unwrap();
            assert!(name.starts_with("NVML_"), "{name}");
            assert_eq!(NvmlReturn::from_name(name), Some(*c));
            assert_eq!(
                c.description_cstr().to_str().unwrap(),
                c.description().unwrap()
            );
        }
        assert_eq!(NvmlReturn(4242).name(), None);
        assert_eq!(NvmlReturn(4242).description_cstr(), c"Unknown Error");
        assert_eq!(NvmlReturn(4242).to_string(), "nvmlReturn_t(4242)");
        assert_eq!(
            NvmlReturn::from_name("7"),
            Some(NvmlReturn::ERROR_INSUFFICIENT_SIZE)
        );
        assert_eq!(NvmlReturn::from_name("CUDA_ERROR_UNKNOWN"), None);
    }
}
