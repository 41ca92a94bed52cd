//! The bottom layer: thin, safe wrappers over every C interface the plugin uses, and all of
//! its `unsafe` but the exported symbols ([`crate::entry`]). It imports nothing of the plugin
//! above [`crate::task`], [`crate::inventory`], [`crate::nvml`]'s types, [`crate::thread`]'s
//! seam and the leaf utilities ([`crate::message`], [`crate::worker`]).
//!
//! | Module | Unsafe operations |
//! |---|---|
//! | [`agent`] | the helper process's channel (`SOCK_SEQPACKET` pair), its double fork into a session of its own with only its descriptors, CRIU's pidfd, syslog |
//! | [`log`] | `dlsym(RTLD_DEFAULT)` of CRIU's logger, `print_on_level`, and the variadic call to it |
//! | [`criu`] | `dlsym(RTLD_DEFAULT)` look-ups of CRIU's services and data (the inventory, the image directory, options, `opts`, `fi_strategy`, `cr_plugin_ctl`), never linked |
//! | [`cuda`] | `libcuda.so.1` opened with libloading, and the driver calls |
//! | [`cstore`] | custom storage's driver calls (CUDA 13.4): contexts, pinned host memory, asynchronous copies, the operation's info struct, in the copier process |
//! | [`nvml`] | `libnvidia-ml.so.1` opened with libloading: GPU memory and its processes |
//! | [`ptrace`] | resuming and re-stopping one traced thread |
//! | [`spawn`] | marking inherited descriptors close-on-exec in `cuda-checkpoint` children |
//!
//! This module itself: `dladdr` on the plugin's own code, to learn which file the host loaded
//! ([`plugin_path`], for the options file next to it) and to pin it in memory ([`pin_self`]).
//!
//! Each `unsafe` block carries a `// SAFETY:` comment. The rest of the crate is
//! `#![deny(unsafe_code)]` and reaches these operations only through safe functions.

pub mod agent;
pub mod criu;
pub mod cstore;
pub mod cuda;
pub mod log;
pub mod nvml;
pub mod ptrace;
pub mod spawn;

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

/// `dladdr` of a function of this library: which loaded object we are. `None` when the loader
/// does not know (or gives no file name).
fn own_dl_info() -> Option<libc::Dl_info> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let addr = own_dl_info as fn() -> Option<libc::Dl_info> as *const c_void;
    // SAFETY: `addr` is the address of a function of this library and `info` points to writable
    // memory of the right type; dladdr only writes to `info`.
    let found = unsafe { libc::dladdr(addr, info.as_mut_ptr()) };
    if found == 0 {
        return None;
    }
    // SAFETY: dladdr returned non-zero, so it initialised `info`.
    let info = unsafe { info.assume_init() };
    (!info.dli_fname.is_null()).then_some(info)
}

/// The path of this plugin's `.so` as the host loaded it (CRIU: `<libdir>/<name>`), made
/// absolute against the current directory when the host gave a relative one; `None` when the
/// loader does not say.
#[must_use]
pub fn plugin_path() -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let info = own_dl_info()?;
    // SAFETY: `dli_fname` is a non-null, NUL-terminated path owned by the loader, valid while the
    // library is loaded, which it is (we are running its code). It is copied at once.
    let bytes = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_bytes()
        .to_vec();
    let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&bytes));
    if !bytes.contains(&b'/') {
        // Found through the loader's search path: no directory we could name.
        return None;
    }
    if path.is_absolute() {
        Some(path)
    } else {
        std::env::current_dir().ok().map(|d| d.join(path))
    }
}

/// `posix_fadvise(fd, offset, len, advice)`: a hint to the page cache about a range of an open
/// file (`libc::POSIX_FADV_*`); the error number on failure.
pub fn fadvise(fd: &std::fs::File, offset: u64, len: u64, advice: i32) -> Result<(), i32> {
    use std::os::fd::AsRawFd;
    let off = libc::off_t::try_from(offset).unwrap_or(libc::off_t::MAX);
    let len = libc::off_t::try_from(len).unwrap_or(libc::off_t::MAX);
    // SAFETY: the descriptor is open for the duration of the call (borrowed from `fd`); the
    // call only reads its arguments and touches no memory of ours.
    match unsafe { libc::posix_fadvise(fd.as_raw_fd(), off, len, advice) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// The effective user id of this process (the user whose files [`crate::trust`] accepts besides
/// root's).
#[must_use]
pub fn euid() -> u32 {
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// Keeps this library mapped for the rest of the process's life (`RTLD_NODELETE`).
///
/// Called when a driver call is abandoned on timeout: its worker thread may return into this
/// library's code after CRIU has `dlclose`d it. Idempotent.
pub fn pin_self() {
    static PINNED: AtomicBool = AtomicBool::new(false);
    if PINNED.swap(true, Ordering::SeqCst) {
        return;
    }
    let Some(info) = own_dl_info() else {
        return;
    };
    // SAFETY: `dli_fname` is a NUL-terminated path owned by the loader, valid while the library
    // is loaded, which it is (we are running its code). RTLD_NOLOAD only takes a reference on the
    // already loaded object; RTLD_NODELETE makes it permanent. The handle is deliberately leaked.
    let handle = unsafe {
        libc::dlopen(
            info.dli_fname,
            libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
        )
    };
    let name = {
        // SAFETY: as above, a valid NUL-terminated string owned by the loader.
        let c = unsafe { CStr::from_ptr(info.dli_fname) };
        c.to_string_lossy().into_owned()
    };
    if handle.is_null() {
        log::log(
            abi::criu::log_level::WARN,
            &format!("cannot pin {name} in memory; an abandoned driver call may outlive it"),
        );
    } else {
        log::log(
            abi::criu::log_level::INFO,
            &format!("pinned {name} in memory: a driver call was abandoned"),
        );
    }
}
