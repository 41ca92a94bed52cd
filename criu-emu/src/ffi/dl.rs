//! Plugin libraries, as `criu/plugin.c` opens and calls them.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};

use abi::criu::{CrPluginDesc, ExitFn, InitFn, PidHookFn, Stage, VoidHookFn, HOOK_COUNT_BUILD};
use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL};

use crate::meta::{CrPluginOptionsMeta, MetaError, OptionMeta, MAX_COUNT, SYMBOL, VERSION};

/// `CRIU_PLUGIN_VERSION_OLD`, the version of a synthesised (legacy) descriptor.
const VERSION_OLD: u32 = abi::criu::CRIU_PLUGIN_VERSION_OLD;

/// Hook function names CRIU looks up in a library without `CR_PLUGIN_DESC`, by hook number.
const LEGACY_HOOK_NAMES: [&CStr; 15] = [
    c"cr_plugin_dump_unix_sk",
    c"cr_plugin_restore_unix_sk",
    c"cr_plugin_dump_file",
    c"cr_plugin_restore_file",
    c"cr_plugin_dump_ext_mount",
    c"cr_plugin_restore_ext_mount",
    c"cr_plugin_dump_ext_link",
    c"cr_plugin_handle_device_vma",
    c"cr_plugin_update_vma_map",
    c"cr_plugin_resume_devices_late",
    c"cr_plugin_pause_devices",
    c"cr_plugin_checkpoint_devices",
    c"cr_plugin_post_forking",
    c"cr_plugin_restore_init",
    c"cr_plugin_dump_devices_late",
];

/// A hook entry point taken from a descriptor slot. Only [`Plugin`] can call it, which keeps the
/// library loaded for the duration of the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookFn(*mut c_void);

impl HookFn {
    /// The address, for CRIU's `hook N -> 0x...` debug line.
    #[must_use]
    pub fn addr(self) -> usize {
        self.0 as usize
    }
}

#[derive(Debug)]
enum Source {
    /// The library's own `CR_PLUGIN_DESC`.
    Static(*const CrPluginDesc),
    /// CRIU's `cr_gen_plugin_desc` for a library without one.
    Generated {
        init: Option<InitFn>,
        exit: Option<ExitFn>,
        max_hooks: u32,
        hooks: [*mut c_void; HOOK_COUNT_BUILD],
    },
}

/// A dlopen'ed plugin library and its (static or generated) descriptor. Dropping it `dlclose`s
/// the library, as `cr_plugin_fini` does after `exit`.
#[derive(Debug)]
pub struct Plugin {
    source: Source,
    name: String,
    path: PathBuf,
    // Declared last so it is dropped last.
    lib: Library,
}

/// `dlopen` or `dlsym` failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DlError(String);

/// What [`open`] found in a library.
#[derive(Debug)]
pub enum Opened {
    /// The library exports `CR_PLUGIN_DESC`.
    Descriptor(Plugin),
    /// No descriptor: CRIU generates one from legacy symbol names.
    Legacy(Plugin),
}

/// Opens `path` with `RTLD_LAZY | RTLD_LOCAL` (running its constructors) and looks up
/// `CR_PLUGIN_DESC`. `host_hooks` is the host's hook count, used for a generated descriptor.
///
/// # Errors
/// When `dlopen` fails (not ELF, unresolved symbol under BIND_NOW, ...).
pub fn open(path: &Path, host_hooks: u32) -> Result<Opened, DlError> {
    // SAFETY: loading a library runs its ELF constructors with the harness's address space at
    // their mercy; that is exactly what CRIU does and what the harness exists to exercise. The
    // flags match criu/plugin.c (`dlopen(path, RTLD_LAZY)`, local by default).
    let lib = unsafe { Library::open(Some(path), RTLD_LAZY | RTLD_LOCAL) }
        .map_err(|e| DlError(e.to_string()))?;
    // `CR_PLUGIN_DESC` is dereferenced below under the plugin ABI contract that it is a
    // `cr_plugin_desc_t`.
    let desc = Some(
        raw_symbol(&lib, c"CR_PLUGIN_DESC")
            .cast::<CrPluginDesc>()
            .cast_const(),
    )
    .filter(|p| !p.is_null());
    let path = path.to_path_buf();
    match desc {
        Some(d) => {
            // SAFETY: `d` points at the plugin's static descriptor, valid while `lib` is loaded;
            // its `name` is NULL or a NUL-terminated string (plugin ABI contract).
            let name = unsafe { cstr_or_null((*d).name) };
            Ok(Opened::Descriptor(Plugin {
                source: Source::Static(d),
                name,
                path,
                lib,
            }))
        }
        None => {
            let mut hooks = [std::ptr::null_mut(); HOOK_COUNT_BUILD];
            let n = (host_hooks as usize).min(LEGACY_HOOK_NAMES.len());
            for (slot, sym) in hooks.iter_mut().zip(LEGACY_HOOK_NAMES).take(n) {
                *slot = raw_symbol(&lib, sym);
            }
            let init = raw_symbol(&lib, c"cr_plugin_init");
            let exit = raw_symbol(&lib, c"cr_plugin_fini");
            // SAFETY: a legacy plugin's `cr_plugin_init`/`cr_plugin_fini` have the descriptor's
            // init/exit signatures (criu/plugin.c assigns them to those fields); a NULL address
            // becomes `None`.
            let (init, exit) = unsafe {
                (
                    std::mem::transmute::<*mut c_void, Option<InitFn>>(init),
                    std::mem::transmute::<*mut c_void, Option<ExitFn>>(exit),
                )
            };
            Ok(Opened::Legacy(Plugin {
                source: Source::Generated {
                    init,
                    exit,
                    max_hooks: host_hooks,
                    hooks,
                },
                name: path.display().to_string(),
                path,
                lib,
            }))
        }
    }
}

fn raw_symbol(lib: &Library, name: &CStr) -> *mut c_void {
    // SAFETY: the symbol is only taken as an address; callers give it a type under the plugin
    // ABI contract.
    unsafe { lib.get::<*mut c_void>(name.to_bytes_with_nul()) }
        .map(|s| *s)
        .unwrap_or(std::ptr::null_mut())
}

/// # Safety
/// `p` must be NULL or point at a NUL-terminated string.
unsafe fn cstr_or_null(p: *const c_char) -> String {
    if p.is_null() {
        "(null)".to_owned()
    } else {
        // SAFETY: guaranteed by the caller.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

impl Plugin {
    /// The descriptor's name (the file path for a generated descriptor).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The library's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The descriptor's `version` (OLD for a generated one).
    #[must_use]
    pub fn version(&self) -> u32 {
        match self.source {
            // SAFETY: the descriptor is valid while `self.lib` is loaded.
            Source::Static(d) => unsafe { (*d).version },
            Source::Generated { .. } => VERSION_OLD,
        }
    }

    /// The descriptor's `max_hooks`, read now (constructors may have changed it).
    #[must_use]
    pub fn max_hooks(&self) -> u32 {
        match self.source {
            // SAFETY: the descriptor is valid while `self.lib` is loaded.
            Source::Static(d) => unsafe { (*d).max_hooks },
            Source::Generated { max_hooks, .. } => max_hooks,
        }
    }

    /// Slot `i` of the hook array, read now; `None` when NULL or at/above `max_hooks`. Slots
    /// beyond the array this project's header declares are never read.
    #[must_use]
    pub fn hook(&self, i: usize) -> Option<HookFn> {
        if i >= self.max_hooks() as usize || i >= HOOK_COUNT_BUILD {
            return None;
        }
        let p = match &self.source {
            // SAFETY: the descriptor is valid while `self.lib` is loaded and `i` is below both
            // `max_hooks` and the array length of our mirror. A plugin built against an older
            // header has a shorter array but then also a smaller `max_hooks`, the bound CRIU
            // trusts as well.
            Source::Static(d) => unsafe { std::ptr::addr_of!((*(*d)).hooks[i]).read() },
            Source::Generated { hooks, .. } => hooks[i],
        };
        (!p.is_null()).then_some(HookFn(p))
    }

    fn init_fn(&self) -> Option<InitFn> {
        match self.source {
            // SAFETY: the descriptor is valid while `self.lib` is loaded.
            Source::Static(d) => unsafe { (*d).init },
            Source::Generated { init, .. } => init,
        }
    }

    fn exit_fn(&self) -> Option<ExitFn> {
        match self.source {
            // SAFETY: the descriptor is valid while `self.lib` is loaded.
            Source::Static(d) => unsafe { (*d).exit },
            Source::Generated { exit, .. } => exit,
        }
    }

    /// Calls `init(stage)`; a plugin without `init` succeeds.
    pub fn init(&self, stage: Stage) -> i32 {
        match self.init_fn() {
            // SAFETY: `init` is `int (*)(int)` per the plugin ABI; the library is loaded.
            Some(f) => unsafe { f(stage.0) },
            None => 0,
        }
    }

    /// Calls `exit(stage, ret)` when the plugin has one.
    pub fn exit(&self, stage: Stage, ret: i32) {
        if let Some(f) = self.exit_fn() {
            // SAFETY: `exit` is `void (*)(int, int)` per the plugin ABI; the library is loaded.
            unsafe { f(stage.0, ret) }
        }
    }

    /// Calls an `int (int)` hook (PAUSE/CHECKPOINT/RESUME_DEVICES_LATE, DUMP_DEVICES_LATE,
    /// DUMP_FINISH) taken from this plugin.
    pub fn call_int_hook(&self, hook: HookFn, arg: c_int) -> i32 {
        // SAFETY: the engine only calls hooks with this signature through this method, with a
        // pointer read from this plugin's descriptor; `&self` keeps the library loaded.
        unsafe {
            let f = std::mem::transmute::<*mut c_void, PidHookFn>(hook.0);
            f(arg)
        }
    }

    /// Calls an `int (void)` hook (RESTORE_INIT, POST_FORKING) taken from this plugin.
    pub fn call_void_hook(&self, hook: HookFn) -> i32 {
        // SAFETY: as for `call_int_hook`, for the `int (void)` hooks.
        unsafe {
            let f = std::mem::transmute::<*mut c_void, VoidHookFn>(hook.0);
            f()
        }
    }

    /// Reads the plugin's `CR_PLUGIN_OPTIONS_META`, if it exports one.
    #[must_use]
    pub fn options_meta(&self) -> Option<Result<Vec<OptionMeta>, MetaError>> {
        let p = raw_symbol(&self.lib, c"CR_PLUGIN_OPTIONS_META").cast::<CrPluginOptionsMeta>();
        debug_assert_eq!(SYMBOL, "CR_PLUGIN_OPTIONS_META");
        if p.is_null() {
            return None;
        }
        // SAFETY: the symbol is a `struct cr_plugin_options_meta` by the documented contract
        // (crate::meta); its version is checked before any other field is trusted, `count` is
        // bounded, and every string is NULL or NUL-terminated static data of the loaded library.
        let result = unsafe {
            let m = &*p;
            if m.version != VERSION {
                return Some(Err(MetaError::Version(m.version)));
            }
            if m.count > MAX_COUNT {
                return Some(Err(MetaError::Malformed("count too large")));
            }
            if m.count > 0 && m.options.is_null() {
                return Some(Err(MetaError::Malformed("NULL options array")));
            }
            let mut out = Vec::with_capacity(m.count as usize);
            for i in 0..m.count as usize {
                let o = &*m.options.add(i);
                if o.name.is_null() {
                    return Some(Err(MetaError::Malformed("NULL option name")));
                }
                let opt = |q: *const c_char| (!q.is_null()).then(|| cstr_or_null(q));
                out.push(OptionMeta {
                    name: cstr_or_null(o.name),
                    value_syntax: opt(o.value_syntax),
                    default_value: opt(o.default_value),
                    help: opt(o.help),
                });
            }
            out
        };
        Some(Ok(result))
    }
}
