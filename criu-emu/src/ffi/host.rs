//! The Rust side of the exported host symbols.
//!
//! The C shim (`csrc/host.c`) defines the symbols plugins look up and forwards each call to one
//! `harness_rs_*` function here. Every callback runs under the panic guard that the mock
//! libraries share ([`mock_cuda_world::panic_guard`]) with a CRIU-like fallback (a panic must
//! not unwind into plugin C code). The engine reaches the exported data symbols (`opts`,
//! `fi_strategy`, `cr_plugin_ctl`) through `dlsym(RTLD_DEFAULT, ...)`, so the library never
//! links against the shim and also builds into executables without it (tests).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::os::fd::IntoRawFd;
use std::sync::{Mutex, PoisonError};

use abi::criu::{ProcStatusCreds, SeizeTaskStatus};

use crate::images::OpenOutcome;
use crate::{host, log, pr_err};

/// Runs the body of the callback `entry` under the panic guard
/// ([`mock_cuda_world::panic_guard::guard`]): a panic is reported with its message and the
/// callback returns its CRIU-like `fallback`.
fn guard<T>(entry: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    mock_cuda_world::panic_guard::guard("harness", entry, fallback, f)
}

/// # Safety
/// `p` must be NULL or point at a NUL-terminated string that outlives the call.
unsafe fn bytes<'a>(p: *const c_char) -> Option<&'a [u8]> {
    if p.is_null() {
        None
    } else {
        // SAFETY: guaranteed by the caller.
        Some(unsafe { CStr::from_ptr(p) }.to_bytes())
    }
}

/// `print_on_level` after formatting.
///
/// # Safety
/// `msg` must point at `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn harness_rs_log(level: c_uint, msg: *const c_char, len: usize) {
    if msg.is_null() {
        return;
    }
    // SAFETY: guaranteed by the caller (the shim passes its vsnprintf buffer and length).
    let text = unsafe { std::slice::from_raw_parts(msg.cast::<u8>(), len) };
    guard("harness_rs_log", (), || {
        log::write_raw(level, &String::from_utf8_lossy(text))
    });
}

/// `log_get_loglevel`.
#[unsafe(no_mangle)]
pub extern "C" fn harness_rs_loglevel() -> c_uint {
    log::level()
}

/// `add_inventory_plugin`.
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn harness_rs_add_inventory_plugin(name: *const c_char) -> c_int {
    // SAFETY: guaranteed by the caller.
    let Some(name) = (unsafe { bytes(name) }) else {
        return -1;
    };
    guard("harness_rs_add_inventory_plugin", -1, || {
        host::add_inventory_plugin(&String::from_utf8_lossy(name))
    })
}

/// `check_and_remove_inventory_plugin`.
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string. `n` is only used under the 4.1 rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn harness_rs_check_and_remove_inventory_plugin(
    name: *const c_char,
    n: usize,
) -> bool {
    // SAFETY: guaranteed by the caller.
    let Some(name) = (unsafe { bytes(name) }) else {
        return false;
    };
    guard(
        "harness_rs_check_and_remove_inventory_plugin",
        false,
        || host::check_and_remove_inventory_plugin(name, n),
    )
}

/// `has_inventory_plugin`.
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn harness_rs_has_inventory_plugin(name: *const c_char) -> bool {
    // SAFETY: guaranteed by the caller.
    let Some(name) = (unsafe { bytes(name) }) else {
        return false;
    };
    guard("harness_rs_has_inventory_plugin", false, || {
        host::has_inventory_plugin(name)
    })
}

/// `check_inventory_plugins`.
#[unsafe(no_mangle)]
pub extern "C" fn harness_rs_check_inventory_plugins() -> c_int {
    guard(
        "harness_rs_check_inventory_plugins",
        -1,
        host::check_inventory_plugins,
    )
}

/// `criu_get_image_dir`.
#[unsafe(no_mangle)]
pub extern "C" fn harness_rs_get_image_dir() -> c_int {
    host::image_dir_fd()
}

/// `set_compel_interrupt_only_mode`.
#[unsafe(no_mangle)]
pub extern "C" fn harness_rs_set_interrupt_only_mode() {
    guard(
        "harness_rs_set_interrupt_only_mode",
        (),
        host::set_interrupt_only_mode,
    );
}

/// `alarm_timeouted`.
#[unsafe(no_mangle)]
pub extern "C" fn harness_rs_alarm_timeouted() -> bool {
    host::alarm_timeouted()
}

/// `img_streamer_open`. Wrong flags are CRIU's `BUG_ON`: the engine aborts.
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn harness_rs_img_streamer_open(name: *const c_char, flags: c_int) -> c_int {
    // SAFETY: guaranteed by the caller.
    let Some(name) = (unsafe { bytes(name) }) else {
        return -libc::EINVAL;
    };
    let out = guard(
        "harness_rs_img_streamer_open",
        OpenOutcome::Errno(-libc::EIO),
        || host::img_streamer_open(&String::from_utf8_lossy(name), flags),
    );
    match out {
        OpenOutcome::Fd(fd) => fd.into_raw_fd(),
        OpenOutcome::Errno(e) => e,
        OpenOutcome::Bug => {
            pr_err!("BUG at img_streamer_open: flags {flags:#x} do not match the streamer mode");
            std::process::abort();
        }
    }
}

/// compel's `get_status` callback: `int (*)(int pid, struct seize_task_status *, void *data)`.
pub type GetStatusFn =
    unsafe extern "C" fn(pid: c_int, ss: *mut SeizeTaskStatus, data: *mut c_void) -> c_int;
/// compel's `free_status` callback.
pub type FreeStatusFn =
    unsafe extern "C" fn(pid: c_int, ss: *mut SeizeTaskStatus, data: *mut c_void);

/// `compel_wait_task(pid, ppid, get_status, free_status, ss, data)`: waits for a thread this
/// (the tracer) thread interrupted or seized, as compel does; see [`crate::compel::wait_task`].
///
/// # Safety
/// `get_status`, when not NULL, must be callable with `ss` and `data` (CRIU's
/// `parse_pid_status` needs `ss` to be the first member of a `struct proc_status_creds`); the
/// same for `free_status`; `ss` must be valid for reads and writes of a `seize_task_status`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn harness_rs_compel_wait_task(
    pid: c_int,
    ppid: c_int,
    get_status: Option<GetStatusFn>,
    free_status: Option<FreeStatusFn>,
    ss: *mut SeizeTaskStatus,
    data: *mut c_void,
) -> c_int {
    let (Some(get_status), false) = (get_status, ss.is_null()) else {
        pr_err!("compel_wait_task({pid}): no get_status callback or status buffer");
        return -1;
    };
    let mut status = || {
        // SAFETY: the callback and its arguments are the caller's, valid per the contract.
        let r = unsafe { get_status(pid, ss, data) };
        // SAFETY: `ss` is valid for reads per the contract.
        let s = unsafe { ss.read() };
        (r == 0).then(|| crate::compel::PidStatus {
            state: s.state as u8,
            ppid: s.ppid,
            vpid: s.vpid,
            sigpnd: s.sigpnd,
            shdpnd: s.shdpnd,
            sigblk: s.sigblk,
            seccomp_mode: s.seccomp_mode,
            ..Default::default()
        })
    };
    let mut release = || {
        if let Some(free) = free_status {
            // SAFETY: as for `get_status`.
            unsafe { free(pid, ss, data) };
        }
    };
    guard("harness_rs_compel_wait_task", -1, || {
        crate::compel::wait_task(pid, ppid, &mut status, &mut release)
    })
}

/// `parse_pid_status(pid, ss, data)`: fills the `struct proc_status_creds` whose first member
/// `ss` is from `/proc/PID/status`; 0 or -1.
///
/// # Safety
/// `ss` must be NULL or point at the `s` member of a writable `struct proc_status_creds`
/// (CRIU's own function writes the whole structure through `container_of` too).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn harness_rs_parse_pid_status(
    pid: c_int,
    ss: *mut SeizeTaskStatus,
    _data: *mut c_void,
) -> c_int {
    if ss.is_null() {
        return -1;
    }
    let parsed = guard(
        "harness_rs_parse_pid_status",
        Err(String::from("panic")),
        || crate::compel::parse_pid_status(pid),
    );
    let st = match parsed {
        Ok(st) => st,
        Err(e) => {
            pr_err!("parse_pid_status: {e}");
            return -1;
        }
    };
    let split = |m: u64| [(m & 0xffff_ffff) as u32, (m >> 32) as u32];
    let creds = ProcStatusCreds {
        s: SeizeTaskStatus {
            sigpnd: st.sigpnd,
            shdpnd: st.shdpnd,
            sigblk: st.sigblk,
            state: st.state as c_char,
            vpid: st.vpid,
            ppid: st.ppid,
            seccomp_mode: st.seccomp_mode,
        },
        uids: st.uids,
        gids: st.gids,
        // SAFETY: `ss` is the first member of a `proc_status_creds`, valid for reads.
        last_filter: unsafe { ss.cast::<ProcStatusCreds>().read() }.last_filter,
        cap_inh: split(st.caps[0]),
        cap_prm: split(st.caps[1]),
        cap_eff: split(st.caps[2]),
        cap_bnd: split(st.caps[3]),
        cap_amb: split(st.caps[4]),
    };
    // SAFETY: per the contract, `ss` starts a writable `proc_status_creds` (container_of at
    // offset 0).
    unsafe { ss.cast::<ProcStatusCreds>().write(creds) };
    0
}

/// `find_unused_fd_pid(pid)`.
#[unsafe(no_mangle)]
pub extern "C" fn harness_rs_find_unused_fd_pid(pid: c_int) -> c_int {
    guard("harness_rs_find_unused_fd_pid", -1, || {
        crate::compel::find_unused_fd(pid)
    })
}

/// One `criu_plugin_get_options` answer, kept alive until the process ends.
struct ArgvBlock {
    _strings: Vec<CString>,
    ptrs: Vec<*mut c_char>,
}

// SAFETY: the pointers point into `_strings` of the same block (heap data that never moves) and
// are only read by plugins; Rust never dereferences them.
unsafe impl Send for ArgvBlock {}

static ARGV_BLOCKS: Mutex<Vec<ArgvBlock>> = Mutex::new(Vec::new());

/// `criu_plugin_get_options(int *argc, char ***argv)`: every call gets its own copy of the vector
/// (so one plugin's `getopt_long` permutation cannot disturb another's), owned by the host and
/// valid until the engine exits.
///
/// # Safety
/// `argc` and `argv` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn harness_rs_get_options(
    argc: *mut c_int,
    argv: *mut *mut *mut c_char,
) -> c_int {
    if argc.is_null() || argv.is_null() {
        return -libc::EINVAL;
    }
    let built = guard("harness_rs_get_options", None, || {
        let strings: Vec<CString> = host::options_argv()
            .into_iter()
            .map(|s| CString::new(s).unwrap_or_default())
            .collect();
        let mut ptrs: Vec<*mut c_char> = strings.iter().map(|s| s.as_ptr().cast_mut()).collect();
        ptrs.push(std::ptr::null_mut());
        let n = c_int::try_from(strings.len()).ok()?;
        let block = ArgvBlock {
            _strings: strings,
            ptrs,
        };
        let mut blocks = ARGV_BLOCKS.lock().unwrap_or_else(PoisonError::into_inner);
        blocks.push(block);
        let head = blocks.last_mut()?.ptrs.as_mut_ptr();
        Some((n, head))
    });
    let Some((n, head)) = built else {
        return -libc::ENOMEM;
    };
    // SAFETY: both pointers were checked non-NULL and are valid for writes per the contract.
    unsafe {
        argc.write(n);
        argv.write(head);
    }
    0
}

/// Keeps the callbacks in the final executable: the C shim refers to them, but it is linked
/// after the Rust libraries, so an engine binary must also reference them from Rust.
#[must_use]
pub fn callbacks() -> [usize; 14] {
    [
        harness_rs_log as *const () as usize,
        harness_rs_loglevel as *const () as usize,
        harness_rs_add_inventory_plugin as *const () as usize,
        harness_rs_check_and_remove_inventory_plugin as *const () as usize,
        harness_rs_has_inventory_plugin as *const () as usize,
        harness_rs_check_inventory_plugins as *const () as usize,
        harness_rs_get_image_dir as *const () as usize,
        harness_rs_set_interrupt_only_mode as *const () as usize,
        harness_rs_alarm_timeouted as *const () as usize,
        harness_rs_img_streamer_open as *const () as usize,
        harness_rs_get_options as *const () as usize,
        harness_rs_compel_wait_task as *const () as usize,
        harness_rs_parse_pid_status as *const () as usize,
        harness_rs_find_unused_fd_pid as *const () as usize,
    ]
}

fn default_symbol(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no preconditions.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// The ELF `st_size` of a dynamic symbol of the running executable, `None` when absent.
#[must_use]
pub fn exported_size(name: &CStr) -> Option<usize> {
    let p = default_symbol(name);
    if p.is_null() {
        return None;
    }
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let mut sym: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a valid address in a loaded object; `info` and `sym` are valid for writes;
    // with RTLD_DL_SYMENT glibc stores a pointer to the matching `Elf64_Sym` in `sym`.
    let ok = unsafe { libc::dladdr1(p, info.as_mut_ptr(), &mut sym, 1) };
    if ok == 0 || sym.is_null() {
        return None;
    }
    // SAFETY: glibc returned a pointer to the symbol-table entry, valid while the object stays
    // loaded (the executable: forever).
    let size = unsafe { (*sym.cast::<libc::Elf64_Sym>()).st_size };
    usize::try_from(size).ok()
}

/// Whether the running executable exports `name` (what a plugin's `dlsym(RTLD_DEFAULT)` sees).
#[must_use]
pub fn exports(name: &CStr) -> bool {
    !default_symbol(name).is_null()
}

/// Writes the fields of the exported `opts` plugins may read. Returns `false` when the
/// executable exports no `opts`, or one of another size than `size` (the profile's).
#[must_use]
pub fn write_opts(
    size: usize,
    final_state: i32,
    timeout: u32,
    stream_offset: usize,
    stream: bool,
) -> bool {
    if exported_size(c"opts") != Some(size) || stream_offset + 4 > size || 0x160 + 4 > size {
        return false;
    }
    let base = default_symbol(c"opts").cast::<u8>();
    // SAFETY: `opts` is a `size`-byte writable object (size checked above); every offset written
    // is within it and only touched by the engine's single thread before plugins run.
    unsafe {
        base.cast::<i32>().write_unaligned(final_state);
        base.add(0x160).cast::<u32>().write_unaligned(timeout);
        base.add(stream_offset)
            .cast::<i32>()
            .write_unaligned(i32::from(stream));
    }
    true
}

/// Sets the exported `fi_strategy`. Returns `false` when it is not exported.
#[must_use]
pub fn write_fi_strategy(value: i32) -> bool {
    if exported_size(c"fi_strategy") != Some(4) {
        return false;
    }
    // SAFETY: a 4-byte writable int (size checked), written before any plugin is loaded.
    unsafe { default_symbol(c"fi_strategy").cast::<i32>().write(value) };
    true
}

extern "C" fn on_alarm(_sig: c_int) {
    let before = host::alarm_fired();
    let fd = log::raw_fd();
    let msg: &[u8] = if before < 5 {
        b"Error (harness): Timeout reached. Try to interrupt\n"
    } else {
        b"Error (harness): FATAL: Unable to interrupt the current operation\n"
    };
    // SAFETY: write(2) and alarm(2) are async-signal-safe; `msg` is a static buffer.
    unsafe {
        libc::write(fd, msg.as_ptr().cast(), msg.len());
        if before < 5 {
            libc::alarm(1);
        } else {
            libc::abort();
        }
    }
}

/// Arms CRIU's freeze timeout: SIGALRM after `secs` seconds, installed without `SA_RESTART`, so a
/// blocking call in a hook gets `EINTR`; re-armed every second up to five times, then the engine
/// aborts as CRIU `BUG()`s.
pub fn arm_alarm(secs: u32) {
    // SAFETY: a zeroed sigaction is valid; the handler only uses async-signal-safe calls and
    // atomics; flags 0 means no SA_RESTART, as in CRIU's setup_alarm_handler.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_alarm as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = 0;
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
        libc::alarm(secs);
    }
}

/// Disarms the freeze timeout.
pub fn disarm_alarm() {
    // SAFETY: alarm(0) only cancels a pending alarm.
    unsafe {
        libc::alarm(0);
    }
}
