//! What CRIU sees: `CR_PLUGIN_DESC`, the load-time constructor, and the `extern "C"` entry
//! points: the top of the plugin's modules (nothing imports it). Besides [`crate::ffi`], the
//! only module allowed `unsafe`, and only for what an exported symbol needs: the two
//! `no_mangle` statics, the `.init_array` constructor and its one write to the descriptor.
//!
//! ```text
//! CR_PLUGIN_DESC (cr_plugin_desc_t, 32 + 8 * 17 bytes)
//!   +0   name        "cuda_plugin"
//!   +8   init        cuda_plugin_init(stage)
//!   +16  exit        cuda_plugin_exit(stage, ret)
//!   +24  version     0x200 (never 0x100: CRIU frees "old" descriptors)
//!   +28  max_hooks   17, lowered by the constructor to the host's count
//!   +32  hooks[17]   [9] RESUME_DEVICES_LATE  [10] PAUSE_DEVICES
//!                    [11] CHECKPOINT_DEVICES  [16] DUMP_FINISH; the rest NULL
//! ```
//!
//! Every entry point runs its body under [`guard`]: a panic is caught, logged through CRIU's
//! logger, and becomes -1 (or nothing, for `exit`). Each one only translates CRIU's arguments,
//! calls one function of [`crate::session::run`] (which holds the plugin's state between `init`
//! and `exit`) and turns its result into CRIU's return value.

use crate::engine::Outcome;
use crate::error::PluginError;
use crate::hooks::{self, MaxHooks};
use crate::host::Level;
use crate::session::run::{self, TaskHook};
use abi::criu::options_meta::{self, CrPluginOptionMeta, CrPluginOptionsMeta};
use abi::criu::{CrPluginDesc, Hook, Stage, CRIU_PLUGIN_VERSION, HOOK_COUNT_BUILD};
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

/// The exported descriptor: a `cr_plugin_desc_t` the constructor may patch.
#[repr(transparent)]
#[derive(Debug)]
pub struct Descriptor(UnsafeCell<CrPluginDesc>);

// SAFETY: the only write (max_hooks, in the constructor) happens inside dlopen, before CRIU or
// any other thread can read the descriptor; afterwards it is read-only.
unsafe impl Sync for Descriptor {}

const fn hook_table() -> [*mut c_void; HOOK_COUNT_BUILD] {
    let mut h = [std::ptr::null_mut(); HOOK_COUNT_BUILD];
    h[Hook::RESUME_DEVICES_LATE.0] =
        resume_devices_late as extern "C" fn(c_int) -> c_int as *mut c_void;
    h[Hook::PAUSE_DEVICES.0] = pause_devices as extern "C" fn(c_int) -> c_int as *mut c_void;
    h[Hook::CHECKPOINT_DEVICES.0] =
        checkpoint_devices as extern "C" fn(c_int) -> c_int as *mut c_void;
    h[Hook::DUMP_FINISH.0] = dump_finish as extern "C" fn(c_int) -> c_int as *mut c_void;
    h
}

const fn option_meta(i: usize) -> CrPluginOptionMeta {
    let d = crate::options::DOCS[i];
    CrPluginOptionMeta {
        name: d.name.as_ptr(),
        value_syntax: d.value_syntax.as_ptr(),
        default_value: match d.default_value {
            Some(v) => v.as_ptr(),
            None => std::ptr::null(),
        },
        help: d.help.as_ptr(),
    }
}

static OPTION_META: [CrPluginOptionMeta; crate::options::DOCS.len()] = [
    option_meta(0),
    option_meta(1),
    option_meta(2),
    option_meta(3),
    option_meta(4),
    option_meta(5),
    option_meta(6),
    option_meta(7),
    option_meta(8),
    option_meta(9),
];

/// `CR_PLUGIN_OPTIONS_META`: the plugin's options, for tools that list them without calling
/// `init` (`harness plugins`; see `docs/plugin-interface.md`).
#[unsafe(no_mangle)]
pub static CR_PLUGIN_OPTIONS_META: CrPluginOptionsMeta = CrPluginOptionsMeta {
    version: options_meta::VERSION,
    count: OPTION_META.len() as u32,
    options: OPTION_META.as_ptr(),
};

/// `CR_PLUGIN_DESC`, read by CRIU's loader with `dlsym`.
#[unsafe(no_mangle)]
pub static CR_PLUGIN_DESC: Descriptor = Descriptor(UnsafeCell::new(CrPluginDesc {
    name: c"cuda_plugin".as_ptr(),
    init: Some(cuda_plugin_init),
    exit: Some(cuda_plugin_exit),
    version: CRIU_PLUGIN_VERSION,
    max_hooks: HOOK_COUNT_BUILD as u32,
    hooks: hook_table(),
}));

/// The constructor's decision, logged by `init`.
static MAX_HOOKS: OnceLock<MaxHooks> = OnceLock::new();

/// Runs inside `dlopen`, before CRIU reads the descriptor: lowers `max_hooks` to what the host
/// accepts (see [`crate::hooks`]).
extern "C" fn constructor() {
    let _ = catch_unwind(|| {
        let choice = hooks::choose(
            crate::env::max_hooks_override().as_deref(),
            crate::ffi::criu::plugin_ctl_size(),
        );
        // SAFETY: we are inside dlopen of this library; nothing else can access the descriptor
        // yet (see the `Sync` impl), and the pointer from UnsafeCell::get is valid and aligned.
        unsafe { (*CR_PLUGIN_DESC.0.get()).max_hooks = choice.count };
        let _ = MAX_HOOKS.set(choice);
    });
}

#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn() = constructor;

fn log(level: Level, msg: &str) {
    crate::ffi::log::log(level.criu(), msg);
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// The panic boundary of every entry point: runs `body`, and on a panic logs it and returns
/// `fallback`.
pub fn guard<R>(entry: &str, fallback: R, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(p) => {
            log_panic(entry, &*p);
            fallback
        }
    }
}

/// Logs a panic caught by [`guard`] (once, not in each entry point's copy of it).
#[inline(never)]
fn log_panic(entry: &str, p: &(dyn std::any::Any + Send)) {
    log(
        Level::Error,
        &format!("panic in {entry}: {}; failing the call", panic_message(p)),
    );
}

fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            log(Level::Error, &format!("panic: {info}"));
        }));
    });
}

/// CRIU's return value for a hook: 0 when it handled the task, `-ENOTSUP` when the task is not
/// the plugin's (or the plugin is disabled, or in the other stage), a negative errno on failure.
/// The one place where a result of the plugin becomes a C code (with [`PluginError::to_errno`]).
fn hook_code(r: Result<Outcome, PluginError>) -> c_int {
    match r {
        Ok(Outcome::Handled) => 0,
        Ok(Outcome::NotMine) => -libc::ENOTSUP,
        Err(e) => e.to_errno(),
    }
}

extern "C" fn cuda_plugin_init(stage: c_int) -> c_int {
    guard("init", -1, || {
        install_panic_hook();
        let mh = MAX_HOOKS
            .get()
            .cloned()
            .unwrap_or_else(|| hooks::choose(None, None));
        run::init(Stage(stage), &mh).map_or_else(|e| e.to_errno(), |()| 0)
    })
}

extern "C" fn cuda_plugin_exit(stage: c_int, ret: c_int) {
    guard("exit", (), || run::exit(Stage(stage), ret));
}

extern "C" fn pause_devices(pid: c_int) -> c_int {
    guard("PAUSE_DEVICES", -1, || {
        hook_code(run::task_hook(TaskHook::PauseDevices, pid))
    })
}

extern "C" fn checkpoint_devices(pid: c_int) -> c_int {
    guard("CHECKPOINT_DEVICES", -1, || {
        hook_code(run::task_hook(TaskHook::CheckpointDevices, pid))
    })
}

extern "C" fn resume_devices_late(pid: c_int) -> c_int {
    guard("RESUME_DEVICES_LATE", -1, || {
        hook_code(run::task_hook(TaskHook::ResumeDevicesLate, pid))
    })
}

extern "C" fn dump_finish(ret: c_int) -> c_int {
    guard("DUMP_FINISH", -1, || hook_code(run::dump_finish(ret)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_is_what_criu_expects() {
        // SAFETY: test-only read of the descriptor; the constructor ran before main and nothing writes it now.
        let d = unsafe { &*CR_PLUGIN_DESC.0.get() };
        assert_eq!(d.version, 0x200);
        assert_ne!(d.version, abi::criu::CRIU_PLUGIN_VERSION_OLD);
        // SAFETY: `name` points to a static NUL-terminated string.
        assert_eq!(unsafe { std::ffi::CStr::from_ptr(d.name) }, c"cuda_plugin");
        assert_eq!(
            d.max_hooks, 12,
            "no cr_plugin_ctl in the test binary: clamped to CRIU 4.1"
        );
        for (i, h) in d.hooks.iter().enumerate() {
            let wanted = [9, 10, 11, 16].contains(&i);
            assert_eq!(!h.is_null(), wanted, "hook slot {i}");
        }
    }

    #[test]
    fn hooks_return_enotsup_when_not_initialised_and_panics_become_the_fallback() {
        assert_eq!(pause_devices(1), -libc::ENOTSUP);
        assert_eq!(checkpoint_devices(1), -libc::ENOTSUP);
        assert_eq!(resume_devices_late(1), -libc::ENOTSUP);
        assert_eq!(dump_finish(0), -libc::ENOTSUP);
        assert_eq!(guard("test", -1, || -> c_int { panic!("deliberate") }), -1);
        assert_eq!(guard("test", 7, || 3), 3);
    }
}
