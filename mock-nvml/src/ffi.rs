//! The C ABI of the NVML stand-in: every export checks its pointers, converts them to Rust
//! values and calls [`crate::nvml`], all under one panic guard. A panic (a bug in the mock) is
//! reported on stderr and returns `NVML_ERROR_UNKNOWN` (`nvmlErrorString`, which returns a
//! string, returns "Unknown Error"); it never unwinds into the caller. A NULL output pointer is
//! `NVML_ERROR_INVALID_ARGUMENT`.
//!
//! A device handle (`nvmlDevice_t`) is the address of one byte of a static array, by host index:
//! stable for the life of the process, never dereferenced by anyone, and told apart from any
//! other pointer by its address alone.

#![expect(
    clippy::missing_safety_doc,
    reason = "each export's safety contract is NVML's: every pointer argument is NULL or valid \
              for the access the NVML reference documents (see the module documentation)"
)]

use crate::nvml;
use abi::nvml::{
    NvmlDevice, NvmlEnableState, NvmlMemory, NvmlMemoryV2, NvmlProcessInfo, NvmlReturn,
    NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE, NVML_MEMORY_V2, NVML_VALUE_NOT_AVAILABLE_UINT,
};
use mock_cuda_world::panic_guard;
use std::ffi::{c_char, c_uint, CStr};

/// Most devices a handle can name.
pub const MAX_DEVICES: usize = 256;

/// The bytes whose addresses are the device handles.
static HANDLES: [u8; MAX_DEVICES] = [0; MAX_DEVICES];

fn handle_of(index: usize) -> NvmlDevice {
    HANDLES
        .as_ptr()
        .wrapping_add(index)
        .cast_mut()
        .cast::<std::ffi::c_void>()
}

/// The host index a handle names, `None` for any other pointer.
fn index_of(device: NvmlDevice) -> Option<usize> {
    let offset = (device as usize).wrapping_sub(HANDLES.as_ptr() as usize);
    (offset < MAX_DEVICES).then_some(offset)
}

/// Runs `f` under the panic guard ([`panic_guard::guard`]; a panic is `NVML_ERROR_UNKNOWN`),
/// turning `Result<(), NvmlReturn>` into an `NvmlReturn`.
fn guard(name: &str, f: impl FnOnce() -> Result<(), NvmlReturn>) -> NvmlReturn {
    match panic_guard::guard("mock-nvml", name, Err(NvmlReturn::ERROR_UNKNOWN), f) {
        Ok(()) => NvmlReturn::SUCCESS,
        Err(code) => code,
    }
}

/// Writes `value` through an output pointer, or fails with INVALID_ARGUMENT when it is NULL.
///
/// # Safety
/// `out` must be NULL or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), NvmlReturn> {
    if out.is_null() {
        return Err(NvmlReturn::ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-NULL and, by the caller's contract, valid for writes of T.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// Copies `s` and a NUL into the caller's `length`-byte buffer, or fails with
/// INSUFFICIENT_SIZE when it does not fit (INVALID_ARGUMENT for NULL).
///
/// # Safety
/// `buf` must be NULL or valid for writes of `length` bytes.
unsafe fn put_str(buf: *mut c_char, length: c_uint, s: &str) -> Result<(), NvmlReturn> {
    if buf.is_null() {
        return Err(NvmlReturn::ERROR_INVALID_ARGUMENT);
    }
    if s.len() + 1 > length as usize {
        return Err(NvmlReturn::ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` is valid for `length` bytes (caller contract) and we write len + 1 of them;
    // `s` does not overlap the caller's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

/// `nvmlReturn_t nvmlInit_v2(void)`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    guard("nvmlInit_v2", || nvml::init("nvmlInit_v2", 0))
}

/// `nvmlReturn_t nvmlInitWithFlags(unsigned int flags)`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(flags: c_uint) -> NvmlReturn {
    guard("nvmlInitWithFlags", || {
        nvml::init("nvmlInitWithFlags", flags)
    })
}

/// `nvmlReturn_t nvmlShutdown(void)`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    guard("nvmlShutdown", nvml::shutdown)
}

/// `const char *nvmlErrorString(nvmlReturn_t result)`: a static description ("Unknown Error"
/// for a code the stand-in does not know). Works without initialisation.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    panic_guard::guard(
        "mock-nvml",
        "nvmlErrorString",
        c"Unknown Error".as_ptr(),
        || result.description_cstr().as_ptr(),
    )
}

/// `nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    guard("nvmlSystemGetDriverVersion", || {
        let v = nvml::driver_version()?;
        // SAFETY: NULL is rejected by `put_str`; otherwise `length` writable bytes.
        unsafe { put_str(version, length, &v) }
    })
}

/// `nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    guard("nvmlDeviceGetCount_v2", || {
        if count.is_null() {
            return Err(NvmlReturn::ERROR_INVALID_ARGUMENT);
        }
        let n = nvml::device_count()?;
        // SAFETY: checked non-NULL; the caller passes a valid unsigned int pointer.
        unsafe { put(count, n) }
    })
}

/// `nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    guard("nvmlDeviceGetHandleByIndex_v2", || {
        if device.is_null() {
            return Err(NvmlReturn::ERROR_INVALID_ARGUMENT);
        }
        let i = nvml::handle_by_index(index)?;
        // SAFETY: checked non-NULL; the caller passes a valid nvmlDevice_t pointer.
        unsafe { put(device, handle_of(i)) }
    })
}

/// `nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    guard("nvmlDeviceGetHandleByUUID", || {
        if uuid.is_null() || device.is_null() {
            return Err(NvmlReturn::ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL, and the API requires a NUL-terminated string.
        let text = unsafe { CStr::from_ptr(uuid) }.to_string_lossy();
        let i = nvml::handle_by_uuid(&text)?;
        // SAFETY: checked non-NULL; the caller passes a valid nvmlDevice_t pointer.
        unsafe { put(device, handle_of(i)) }
    })
}

/// `nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: NvmlDevice,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    guard("nvmlDeviceGetUUID", || {
        let u = nvml::uuid(index_of(device))?;
        // SAFETY: NULL is rejected by `put_str`; otherwise `length` writable bytes.
        unsafe { put_str(uuid, length, &u) }
    })
}

/// `nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: NvmlDevice,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    guard("nvmlDeviceGetName", || {
        let n = nvml::name(index_of(device))?;
        // SAFETY: NULL is rejected by `put_str`; otherwise `length` writable bytes.
        unsafe { put_str(name, length, &n) }
    })
}

/// `nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: NvmlDevice,
    mode: *mut NvmlEnableState,
) -> NvmlReturn {
    guard("nvmlDeviceGetPersistenceMode", || {
        if mode.is_null() {
            return Err(NvmlReturn::ERROR_INVALID_ARGUMENT);
        }
        let on = nvml::persistence_mode(index_of(device))?;
        let state = if on {
            NvmlEnableState::ENABLED
        } else {
            NvmlEnableState::DISABLED
        };
        // SAFETY: checked non-NULL; the caller passes a valid nvmlEnableState_t.
        unsafe { put(mode, state) }
    })
}

/// `nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
/// unsigned int *pendingMode)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: NvmlDevice,
    current_mode: *mut c_uint,
    pending_mode: *mut c_uint,
) -> NvmlReturn {
    guard("nvmlDeviceGetMigMode", || {
        if current_mode.is_null() || pending_mode.is_null() {
            return Err(NvmlReturn::ERROR_INVALID_ARGUMENT);
        }
        let on = nvml::mig_mode(index_of(device))?;
        let mode = if on {
            NVML_DEVICE_MIG_ENABLE
        } else {
            NVML_DEVICE_MIG_DISABLE
        };
        // SAFETY: both checked non-NULL; the caller passes two valid unsigned ints.
        unsafe { put(current_mode, mode) }?;
        // SAFETY: as above.
        unsafe { put(pending_mode, mode) }
    })
}

/// `nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    memory: *mut NvmlMemory,
) -> NvmlReturn {
    guard("nvmlDeviceGetMemoryInfo", || {
        if memory.is_null() {
            return Err(NvmlReturn::ERROR_INVALID_ARGUMENT);
        }
        let m = nvml::memory("nvmlDeviceGetMemoryInfo", index_of(device))?;
        let out = NvmlMemory {
            total: m.total,
            free: m.free,
            used: m.used,
        };
        // SAFETY: checked non-NULL; the caller passes a valid nvmlMemory_t.
        unsafe { put(memory, out) }
    })
}

/// `nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)`:
/// the caller sets `memory->version` to `nvmlMemory_v2`; any other is
/// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut NvmlMemoryV2,
) -> NvmlReturn {
    guard("nvmlDeviceGetMemoryInfo_v2", || {
        if memory.is_null() {
            return Err(NvmlReturn::ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: checked non-NULL; the caller passes a valid nvmlMemory_v2_t.
        let version = unsafe { std::ptr::addr_of!((*memory).version).read_unaligned() };
        if version != NVML_MEMORY_V2 {
            return Err(NvmlReturn::ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let m = nvml::memory("nvmlDeviceGetMemoryInfo_v2", index_of(device))?;
        let out = NvmlMemoryV2 {
            version,
            total: m.total,
            reserved: 0,
            free: m.free,
            used: m.used,
        };
        // SAFETY: checked non-NULL; the caller passes a valid nvmlMemory_v2_t.
        unsafe { put(memory, out) }
    })
}

/// `nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
/// unsigned int *infoCount, nvmlProcessInfo_t *infos)`: with `*infoCount` smaller than the
/// number of processes (0 to ask), sets it to that number and returns
/// `NVML_ERROR_INSUFFICIENT_SIZE` (`infos` may then be NULL); else fills `infos` and sets
/// `*infoCount` to the number written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: NvmlDevice,
    info_count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    guard("nvmlDeviceGetComputeRunningProcesses_v3", || {
        if info_count.is_null() {
            return Err(NvmlReturn::ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: checked non-NULL; the caller passes a valid unsigned int.
        let capacity = unsafe { info_count.read_unaligned() };
        match nvml::running_processes(index_of(device), capacity) {
            Err((code, needed)) => {
                if let Some(n) = needed {
                    // SAFETY: checked non-NULL above.
                    unsafe { put(info_count, n) }?;
                }
                Err(code)
            }
            Ok(procs) => {
                if infos.is_null() && !procs.is_empty() {
                    return Err(NvmlReturn::ERROR_INVALID_ARGUMENT);
                }
                for (i, p) in procs.iter().enumerate() {
                    let info = NvmlProcessInfo {
                        pid: p.pid,
                        used_gpu_memory: p.used,
                        gpu_instance_id: NVML_VALUE_NOT_AVAILABLE_UINT,
                        compute_instance_id: NVML_VALUE_NOT_AVAILABLE_UINT,
                    };
                    // SAFETY: `infos` is non-NULL here and holds `capacity` entries (caller
                    // contract); `i < procs.len() <= capacity`.
                    unsafe { put(infos.add(i), info) }?;
                }
                // SAFETY: checked non-NULL above.
                unsafe { put(info_count, procs.len() as c_uint) }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_name_their_index_and_nothing_else() {
        for i in [0, 1, 7, MAX_DEVICES - 1] {
            assert_eq!(index_of(handle_of(i)), Some(i));
        }
        assert_eq!(index_of(std::ptr::null_mut()), None);
        assert_eq!(index_of(handle_of(MAX_DEVICES)), None);
        let other = 5u8;
        assert_eq!(index_of(std::ptr::from_ref(&other).cast_mut().cast()), None);
    }

    #[test]
    fn error_strings_are_static_and_known() {
        // SAFETY: nvmlErrorString returns a pointer to a static NUL-terminated string.
        let s = unsafe { CStr::from_ptr(nvmlErrorString(NvmlReturn::ERROR_INSUFFICIENT_SIZE)) };
        assert_eq!(s.to_str().unwrap(), "Insufficient Size");
        // SAFETY: as above.
        let s = unsafe { CStr::from_ptr(nvmlErrorString(NvmlReturn(31337))) };
        assert_eq!(s.to_str().unwrap(), "Unknown Error");
    }
}
