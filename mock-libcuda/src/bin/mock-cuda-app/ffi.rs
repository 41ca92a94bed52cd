//! The workload's unsafe code: the driver entry points it loads from `libcuda.so.1`, and its
//! signal handlers.

use anyhow::{Context, Result};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

type CuResult = u32;

/// The driver entry points the workload uses, resolved from `libcuda.so.1` at run time, as
/// the CUDA runtime does.
pub struct Driver {
    _lib: libloading::Library,
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult,
    set_current: unsafe extern "C" fn(*mut c_void) -> CuResult,
    synchronize: unsafe extern "C" fn() -> CuResult,
    get_device: unsafe extern "C" fn(*mut c_int) -> CuResult,
    get_uuid: unsafe extern "C" fn(*mut [u8; 16], c_int) -> CuResult,
    alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult,
    htod: unsafe extern "C" fn(u64, *const c_void, usize) -> CuResult,
    dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> CuResult,
    memset: unsafe extern "C" fn(u64, u8, usize) -> CuResult,
}

fn check(what: &str, r: CuResult) -> Result<()> {
    if r == 0 {
        Ok(())
    } else {
        anyhow::bail!("{what} failed with CUresult {r}")
    }
}

impl Driver {
    /// Loads `libcuda.so.1` and its entry points.
    pub fn load() -> Result<Driver> {
        // SAFETY: loading the driver library runs its constructors; the mock (or a real
        // driver) has no initialisation preconditions.
        let lib =
            unsafe { libloading::Library::new("libcuda.so.1") }.context("loading libcuda.so.1")?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol has the C signature of the driver API, which the field
                // type spells out.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .context(concat!("resolving ", $name))?
            };
        }
        Ok(Driver {
            init: sym!("cuInit"),
            retain: sym!("cuDevicePrimaryCtxRetain"),
            set_current: sym!("cuCtxSetCurrent"),
            synchronize: sym!("cuCtxSynchronize"),
            get_device: sym!("cuCtxGetDevice"),
            get_uuid: sym!("cuDeviceGetUuid_v2"),
            alloc: sym!("cuMemAlloc_v2"),
            htod: sym!("cuMemcpyHtoD_v2"),
            dtoh: sym!("cuMemcpyDtoH_v2"),
            memset: sym!("cuMemsetD8_v2"),
            _lib: lib,
        })
    }

    pub fn init(&self) -> Result<()> {
        // SAFETY: plain value argument.
        check("cuInit", unsafe { (self.init)(0) })
    }

    /// Retains device `ordinal`'s primary context and makes it current; returns its handle.
    pub fn context(&self, ordinal: i32) -> Result<usize> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer.
        check("cuDevicePrimaryCtxRetain", unsafe {
            (self.retain)(&mut ctx, ordinal)
        })?;
        self.set_current(ctx as usize)?;
        Ok(ctx as usize)
    }

    pub fn set_current(&self, ctx: usize) -> Result<()> {
        // SAFETY: a handle the driver returned.
        check("cuCtxSetCurrent", unsafe {
            (self.set_current)(ctx as *mut c_void)
        })
    }

    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: no arguments.
        check("cuCtxSynchronize", unsafe { (self.synchronize)() })
    }

    /// UUID of the current context's device.
    pub fn current_uuid(&self) -> Result<[u8; 16]> {
        let mut dev = 0;
        // SAFETY: valid out-pointer.
        check("cuCtxGetDevice", unsafe { (self.get_device)(&mut dev) })?;
        let mut u = [0u8; 16];
        // SAFETY: valid 16-byte out-buffer.
        check("cuDeviceGetUuid_v2", unsafe {
            (self.get_uuid)(&mut u, dev)
        })?;
        Ok(u)
    }

    pub fn alloc(&self, bytes: u64) -> Result<u64> {
        let bytes = usize::try_from(bytes).context("allocation size")?;
        let mut p = 0u64;
        // SAFETY: valid out-pointer.
        check("cuMemAlloc", unsafe { (self.alloc)(&mut p, bytes) })?;
        Ok(p)
    }

    /// Sets `bytes` bytes at `dptr` to `value`.
    pub fn memset(&self, dptr: u64, value: u8, bytes: u64) -> Result<()> {
        let bytes = usize::try_from(bytes).context("memset size")?;
        // SAFETY: plain value arguments.
        check("cuMemsetD8", unsafe { (self.memset)(dptr, value, bytes) })
    }

    pub fn upload(&self, dptr: u64, data: &[u8]) -> Result<()> {
        // SAFETY: `data` is readable for its length.
        check("cuMemcpyHtoD", unsafe {
            (self.htod)(dptr, data.as_ptr().cast(), data.len())
        })
    }

    pub fn download(&self, dptr: u64, data: &mut [u8]) -> Result<()> {
        // SAFETY: `data` is writable for its length.
        check("cuMemcpyDtoH", unsafe {
            (self.dtoh)(data.as_mut_ptr().cast(), dptr, data.len())
        })
    }
}

/// Set by SIGUSR1: verify now and report.
pub static VERIFY: AtomicBool = AtomicBool::new(false);
/// Set by SIGTERM: verify, report, exit.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: c_int) {
    if sig == libc::SIGUSR1 {
        VERIFY.store(true, Ordering::SeqCst);
    } else {
        STOP.store(true, Ordering::SeqCst);
    }
}

/// Installs the SIGUSR1 and SIGTERM handlers.
pub fn install_signal_handlers() -> Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGUSR1, Signal::SIGTERM] {
        // SAFETY: the handler only stores to atomics, which is async-signal-safe.
        unsafe { sigaction(sig, &action) }
            .with_context(|| format!("installing a {sig} handler"))?;
    }
    Ok(())
}

/// The system call `--seccomp` filters, and the errno the filter answers it with: `acct(2)`
/// with `EOWNERDEAD`, an answer no kernel gives to `acct` (so the probe cannot mistake an
/// unfiltered call for a filtered one, and a filtered call never changes process accounting).
const FILTERED_SYSCALL: libc::c_long = libc::SYS_acct;
const FILTERED_ERRNO: u32 = libc::EOWNERDEAD as u32;

/// Installs a seccomp filter (mode 2, inherited by every thread started afterwards and by
/// children) that answers [`FILTERED_SYSCALL`] with [`FILTERED_ERRNO`] and allows the rest;
/// sets `no_new_privs` as an unprivileged filter requires. With `container`, it also answers
/// `userfaultfd` and `io_uring_setup` with `EPERM`, as the default profiles of podman and
/// Docker do: the calls the mock driver's stand-in GPU handle needs.
pub fn install_seccomp_filter(container: bool) -> Result<()> {
    use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule, TargetArch};
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| anyhow::anyhow!("seccomp on {}: {e}", std::env::consts::ARCH))?;
    let errno = |e: i32| SeccompAction::Errno(u32::try_from(e).unwrap_or(1));
    let mut rules: Vec<(libc::c_long, Vec<SeccompRule>)> = Vec::new();
    if container {
        rules.push((libc::SYS_userfaultfd, vec![]));
        rules.push((libc::SYS_io_uring_setup, vec![]));
    }
    let mut programs: Vec<BpfProgram> = Vec::new();
    // One filter per answer (seccompiler gives a filter one match action).
    programs.push(
        SeccompFilter::new(
            [(FILTERED_SYSCALL, vec![])].into_iter().collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(FILTERED_ERRNO),
            arch,
        )
        .context("building the seccomp filter")?
        .try_into()
        .context("compiling the seccomp filter")?,
    );
    if !rules.is_empty() {
        programs.push(
            SeccompFilter::new(
                rules.into_iter().collect(),
                SeccompAction::Allow,
                errno(libc::EPERM),
                arch,
            )
            .context("building the container seccomp filter")?
            .try_into()
            .context("compiling the container seccomp filter")?,
        );
    }
    for program in &programs {
        seccompiler::apply_filter(program).context("installing the seccomp filter")?;
    }
    Ok(())
}

/// Whether the filter of [`install_seccomp_filter`] is in force for the calling thread: the
/// filtered call fails with the filter's errno.
pub fn seccomp_filter_active() -> bool {
    // SAFETY: acct(NULL) takes no pointer to memory; under the filter it never reaches the
    // kernel, without it an unprivileged caller gets EPERM and root only switches accounting
    // off (which is off on these machines).
    let r = unsafe { libc::syscall(FILTERED_SYSCALL, std::ptr::null::<libc::c_char>()) };
    r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(FILTERED_ERRNO as i32)
}
