//! CRIU's plugin engine and the three lifecycles it drives: dump, pre-dump and restore.
//!
//! The loader follows `criu/plugin.c` (`cr_plugin_init`): every `*.so` of the plugin directory in
//! raw `readdir` order is `dlopen`ed (`RTLD_LAZY | RTLD_LOCAL`); its `CR_PLUGIN_DESC` is checked
//! (version, `max_hooks` against the host's hook count); `init(stage)` runs; only after a
//! successful `init` are its non-NULL hooks below `max_hooks` chained, in load order. A library
//! that fails to load, a rejected descriptor or a failed `init` fails the run: the plugins loaded
//! so far get `exit(stage, -1)`, the failing one gets no `exit`, the rest are never opened.
//!
//! Dispatch follows [`Rules`]: chained hooks stop at the first result other than `-ENOTSUP`;
//! under the newer rules DUMP_DEVICES_LATE, DUMP_FINISH, RESTORE_INIT and POST_FORKING are
//! broadcast instead (every handler runs, `-ENOTSUP` is skipped, the first real error wins).
//!
//! The harness does not copy memory: a "restore" re-seizes the dumped tasks themselves (kept
//! group-stopped by a dump whose final state is dead or stopped), takes them out of the
//! group-stop so that every thread is in a plain ptrace-stop as after a real CRIU restore (a
//! plugin can then run one thread), and resumes them.

use std::ffi::c_int;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use abi::criu::{ctl_size_for_hooks, Hook, Stage, HOOK_COUNT_BUILD};

use crate::ffi::dl::{self, HookFn, Opened, Plugin};
use crate::ffi::host as ffi_host;
use crate::images::{self, Streamer};
use crate::inventory::{self, InventoryFile, PluginList, TaskEntry};
use crate::meta::OptionMeta;
use crate::options::PluginOption;
use crate::profile::{HostProfile, Rules};
use crate::pstree::{Frozen, Release, TreeError};
use crate::{host, pr_debug, pr_err, pr_info, pr_warn, trace_event};

/// `-ENOTSUP`: "not mine, ask the next plugin".
pub const ENOTSUP: i32 = -libc::ENOTSUP;
/// CRIU's compiled-in plugin directory.
pub const DEFAULT_LIBDIR: &str = "/usr/lib/criu/";
/// CRIU's default `--timeout`.
pub const DEFAULT_TIMEOUT: u32 = 10;
/// The pid of #3105's sentinel calls.
pub const SENTINEL_PID: i32 = -1;
/// Values of `CRIU_FAULT` at or above this are rejected (`FI_MAX`).
pub const FI_MAX: i32 = 139;

/// `opts.final_state` of a dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalState {
    /// `--leave-running` (TASK_ALIVE, 1).
    Alive,
    /// The default (TASK_DEAD, 2). The harness parks the tree (group-stopped, untraced) instead
    /// of killing it, so that a restore can resume the same tasks.
    Dead,
    /// `--leave-stopped` (TASK_STOPPED, 3).
    Stopped,
}

impl FinalState {
    /// The `TASK_*` value plugins read from `opts.final_state`.
    #[must_use]
    pub const fn task_state(self) -> i32 {
        match self {
            Self::Alive => 1,
            Self::Dead => 2,
            Self::Stopped => 3,
        }
    }
}

/// Where plugins are loaded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LibDir {
    /// `-L/--libdir`: must exist.
    Explicit(PathBuf),
    /// `CRIU_LIBS_DIR` from the environment: must exist.
    Env(PathBuf),
    /// CRIU's compiled-in default: when absent, no plugin loads and the restore-time inventory
    /// check is skipped (as CRIU does).
    Default,
}

impl LibDir {
    /// `-L` if given, else `CRIU_LIBS_DIR`, else the default.
    #[must_use]
    pub fn resolve(explicit: Option<PathBuf>) -> Self {
        match explicit {
            Some(p) => Self::Explicit(p),
            None => match std::env::var_os("CRIU_LIBS_DIR") {
                Some(p) => Self::Env(PathBuf::from(p)),
                None => Self::Default,
            },
        }
    }
}

/// Everything a lifecycle needs besides its own arguments.
#[derive(Debug, Clone)]
pub struct Config {
    /// The emulated host (must be the profile this executable was linked for).
    pub profile: HostProfile,
    /// The dispatch rules.
    pub rules: Rules,
    /// Where plugins come from.
    pub libdir: LibDir,
    /// `-D/--images-dir`.
    pub images_dir: PathBuf,
    /// `--stream`.
    pub stream: bool,
    /// `--timeout` seconds (freeze timeout).
    pub timeout: u32,
    /// `--plugin-option`s, in order.
    pub options: Vec<PluginOption>,
    /// `CRIU_FAULT`.
    pub fault: i32,
    /// `--action-script`.
    pub action_script: Option<PathBuf>,
    /// `--device-sentinel`: after the per-task CHECKPOINT_DEVICES loop and after the per-task
    /// RESUME_DEVICES_LATE loop, call the hook once more with pid -1, as CRIU proposal #3105
    /// ("seize, cr-restore: add sentinel notification for batched device plugins") does.
    pub sentinel: bool,
}

/// Why a lifecycle failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// This executable does not export the host symbols of `profile`.
    #[error("this executable does not implement host profile {0} (cr_plugin_ctl/opts missing or mis-sized)")]
    HostMismatch(HostProfile),
    /// `CRIU_FAULT` out of range.
    #[error("unknown fault injection {0}")]
    Fault(i32),
    /// The plugin directory cannot be read.
    #[error("failed to open plugin directory {path}")]
    LibDir {
        /// The directory.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `dlopen` failed.
    #[error("unable to load {path}: {reason}")]
    Load {
        /// The library.
        path: String,
        /// `dlerror()`.
        reason: String,
    },
    /// `verify_plugin` rejected the descriptor.
    #[error("corrupted plugin {path}: {reason}")]
    Corrupted {
        /// The library.
        path: String,
        /// Which check failed.
        reason: String,
    },
    /// A plugin's `init` returned nonzero.
    #[error("failed in init({stage}) of \"{name}\" (returned {ret})")]
    Init {
        /// The descriptor name.
        name: String,
        /// The stage number.
        stage: i32,
        /// What `init` returned.
        ret: i32,
    },
    /// Restore-time inventory check failed.
    #[error("missing required plugin(s): {0}")]
    MissingPlugins(String),
    /// A hook's result failed the operation.
    #[error("{hook} failed with {ret}{}", .pid.map(|p| format!(" for task {p}")).unwrap_or_default())]
    Hook {
        /// The hook name.
        hook: &'static str,
        /// The task, for per-task hooks.
        pid: Option<i32>,
        /// The result.
        ret: i32,
    },
    /// A task holds a file CRIU cannot dump (as `dump_task_files_seized` finds it).
    #[error("Can't dump file {fd} of that type ({what}) of task {pid}")]
    UndumpableFile {
        /// The task.
        pid: i32,
        /// The descriptor.
        fd: i32,
        /// What it refers to (`anon_inode:[userfaultfd]`).
        what: String,
    },
    /// A restored task died before it was released.
    #[error("task {pid} died before the restore finished")]
    TaskDied {
        /// The task.
        pid: i32,
    },
    /// An action script failed (post-dump: the dump fails and the tree is resumed).
    #[error("{action} action script failed with {reason}")]
    ActionScript {
        /// `post-dump`.
        action: &'static str,
        /// The exit status.
        reason: String,
    },
    /// CRIU could not enter the tree's mount namespace (`setns(CLONE_NEWNS)`).
    #[error("can't switch to the mount namespace of task {pid}")]
    MountNamespace {
        /// The tree's root.
        pid: i32,
        /// What `setns` (or opening the namespace) failed with.
        #[source]
        source: nix::errno::Errno,
    },
    /// Freezing or re-seizing the tree failed.
    #[error("failed to freeze the process tree")]
    Tree(#[from] TreeError),
    /// The image directory cannot be used.
    #[error("failed to use image directory {path}")]
    Images {
        /// The directory.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The inventory cannot be read or written.
    #[error(transparent)]
    Inventory(#[from] inventory::InventoryError),
    /// The image streamer failed.
    #[error(transparent)]
    Stream(#[from] images::StreamError),
}

/// An argument of a hook call, for dispatch and the trace.
#[derive(Debug, Clone, Copy)]
enum Arg {
    /// A task pid and its index in the tree.
    Task(i32, usize),
    /// The #3105 sentinel: pid -1 after a per-task loop ("no more tasks").
    Sentinel,
    /// An integer (the dump result of DUMP_FINISH).
    Int(i32),
    /// `int (void)` hooks.
    Void,
}

/// The loaded plugins and their hook chains (`cr_plugin_ctl`).
#[derive(Debug)]
pub struct Engine {
    profile: HostProfile,
    rules: Rules,
    plugins: Vec<Plugin>,
    chains: Vec<Vec<(usize, HookFn)>>,
}

fn stage_name(stage: Stage) -> &'static str {
    stage.name()
}

impl Engine {
    fn new(profile: HostProfile, rules: Rules) -> Self {
        Self {
            profile,
            rules,
            plugins: Vec::new(),
            chains: vec![Vec::new(); HOOK_COUNT_BUILD],
        }
    }

    /// `cr_plugin_init(stage)`. On failure every plugin loaded so far has had `exit(stage, -1)`.
    fn init_plugins(&mut self, libdir: &LibDir, stage: Stage) -> Result<(), EngineError> {
        let dir = match libdir {
            LibDir::Explicit(p) | LibDir::Env(p) => p.clone(),
            LibDir::Default => {
                let d = PathBuf::from(DEFAULT_LIBDIR);
                if !d.exists() {
                    pr_debug!("plugin: default directory {DEFAULT_LIBDIR} is absent; no plugins");
                    return Ok(());
                }
                d
            }
        };
        let result = self.load_all(&dir, stage);
        let result = result.and_then(|()| {
            if stage == Stage::RESTORE && host::check_inventory_plugins() != 0 {
                let missing = host::inventory().unclaimed().join(", ");
                return Err(EngineError::MissingPlugins(missing));
            }
            if stage == Stage::RESTORE {
                let r = self.dispatch_global(Hook::RESTORE_INIT, Arg::Void);
                if self.global_failed(r) {
                    pr_err!("restore init hook failed: {r}");
                    return Err(EngineError::Hook {
                        hook: Hook::RESTORE_INIT.name(),
                        pid: None,
                        ret: r,
                    });
                }
            }
            Ok(())
        });
        if result.is_err() {
            self.fini(stage, -1);
        }
        result
    }

    fn load_all(&mut self, dir: &Path, stage: Stage) -> Result<(), EngineError> {
        let entries = std::fs::read_dir(dir).map_err(|source| {
            pr_err!("Can't open directory {}: {source}", dir.display());
            EngineError::LibDir {
                path: dir.display().to_string(),
                source,
            }
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| EngineError::LibDir {
                path: dir.display().to_string(),
                source,
            })?;
            let fname = entry.file_name();
            if !fname.as_encoded_bytes().ends_with(b".so") {
                continue;
            }
            let path = dir.join(&fname);
            self.load_one(&path, stage)?;
        }
        Ok(())
    }

    fn load_one(&mut self, path: &Path, stage: Stage) -> Result<(), EngineError> {
        let shown = path.display().to_string();
        let plugin = match dl::open(path, self.profile.hooks()) {
            Ok(Opened::Descriptor(p)) => p,
            Ok(Opened::Legacy(p)) => {
                pr_warn!(
                    "Generating dynamic descriptor for plugin `{shown}'. Won't work in next version of the program.Please update your plugin."
                );
                p
            }
            Err(e) => {
                pr_err!("Unable to load {shown}: {e}");
                trace_event!("load {} -> error", file_label(path));
                return Err(EngineError::Load {
                    path: shown,
                    reason: e.to_string(),
                });
            }
        };
        if let Err(reason) = verify(self.profile, &plugin) {
            pr_debug!("{reason}");
            pr_err!("Corrupted plugin {shown}");
            trace_event!("load {} -> rejected", plugin.name());
            return Err(EngineError::Corrupted {
                path: shown,
                reason,
            });
        }
        pr_info!(
            "Plugin \"{}\" (version {} hooks {})",
            plugin.name(),
            plugin.version(),
            plugin.max_hooks()
        );
        for i in 0..plugin.max_hooks() as usize {
            if let Some(h) = plugin.hook(i) {
                pr_debug!("\t{i:4} -> {:#x}", h.addr());
            }
        }
        trace_event!("load {}", plugin.name());
        let ret = plugin.init(stage);
        trace_event!(
            "init {} stage={} -> {ret}",
            plugin.name(),
            stage_name(stage)
        );
        if ret != 0 {
            pr_err!("Failed in init({}) of \"{}\"", stage.0, plugin.name());
            let name = plugin.name().to_owned();
            drop(plugin);
            return Err(EngineError::Init {
                name,
                stage: stage.0,
                ret,
            });
        }
        let idx = self.plugins.len();
        for (i, chain) in self.chains.iter_mut().enumerate() {
            if let Some(h) = plugin.hook(i) {
                chain.push((idx, h));
            }
        }
        self.plugins.push(plugin);
        Ok(())
    }

    /// `cr_plugin_fini(stage, ret)`: `exit` then `dlclose`, plugin by plugin in load order.
    fn fini(&mut self, stage: Stage, ret: i32) {
        for chain in &mut self.chains {
            chain.clear();
        }
        for plugin in std::mem::take(&mut self.plugins) {
            trace_event!(
                "exit {} stage={} ret={ret}",
                plugin.name(),
                stage_name(stage)
            );
            plugin.exit(stage, ret);
            drop(plugin);
        }
    }

    fn call(&self, hook: Hook, pi: usize, h: HookFn, arg: Arg) -> i32 {
        let p = &self.plugins[pi];
        pr_debug!("plugin: `{}' hook {} -> {:#x}", p.name(), hook.0, h.addr());
        let (ret, shown) = match arg {
            Arg::Task(pid, idx) => (p.call_int_hook(h, pid as c_int), format!(" pid=#{idx}")),
            Arg::Sentinel => (p.call_int_hook(h, SENTINEL_PID), " pid=-1".to_owned()),
            Arg::Int(v) => (p.call_int_hook(h, v), format!(" arg={v}")),
            Arg::Void => (p.call_void_hook(h), String::new()),
        };
        trace_event!("hook {} {}{shown} -> {ret}", hook.name(), p.name());
        ret
    }

    /// `run_plugins`: stop at the first result other than `-ENOTSUP`.
    fn run_chain(&self, hook: Hook, arg: Arg) -> i32 {
        let mut ret = ENOTSUP;
        for &(pi, h) in &self.chains[hook.0] {
            ret = self.call(hook, pi, h, arg);
            if ret != ENOTSUP {
                break;
            }
        }
        ret
    }

    /// `run_plugins_all`: every handler; `-ENOTSUP` when none took part, else 0 or the first
    /// result that is neither 0 nor `-ENOTSUP`.
    fn run_all(&self, hook: Hook, arg: Arg) -> i32 {
        let mut any = false;
        let mut first_err = 0;
        for &(pi, h) in &self.chains[hook.0] {
            let r = self.call(hook, pi, h, arg);
            if r == ENOTSUP {
                continue;
            }
            any = true;
            if r != 0 && first_err == 0 {
                first_err = r;
            }
        }
        if any {
            first_err
        } else {
            ENOTSUP
        }
    }

    /// The four global hooks: broadcast under the newer rules, chained under 4.1 rules.
    fn dispatch_global(&self, hook: Hook, arg: Arg) -> i32 {
        match self.rules {
            Rules::Criu41 => self.run_chain(hook, arg),
            Rules::Newer => self.run_all(hook, arg),
        }
    }

    /// Whether a global hook's result fails the operation: any nonzero result other than
    /// `-ENOTSUP` (newer rules, and CRIU's DUMP_DEVICES_LATE check); negative ones only for
    /// RESTORE_INIT and POST_FORKING under 4.1 rules.
    fn global_failed(&self, r: i32) -> bool {
        match self.rules {
            Rules::Newer => r != 0 && r != ENOTSUP,
            Rules::Criu41 => r < 0 && r != ENOTSUP,
        }
    }

    /// Gives up the plugins without `exit` or `dlclose` (pre-dump: CRIU never finalises them).
    fn abandon(&mut self) {
        for chain in &mut self.chains {
            chain.clear();
        }
        for p in std::mem::take(&mut self.plugins) {
            std::mem::forget(p);
        }
    }
}

/// A trace label for a library that could not be opened: its file name.
fn file_label(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    )
}

/// `verify_plugin`.
fn verify(profile: HostProfile, p: &Plugin) -> Result<(), String> {
    let max_version = max_plugin_version(profile);
    if p.version() > max_version {
        return Err(format!(
            "Plugin {} has version {:x} while max {:x} supported",
            p.name(),
            p.version(),
            max_version
        ));
    }
    if p.max_hooks() > profile.hooks() {
        return Err(format!(
            "Plugin {} has {} assigned while max {} supported",
            p.name(),
            p.max_hooks(),
            profile.hooks()
        ));
    }
    Ok(())
}

/// The newest descriptor version a host accepts: 0.2.0, or 0.3.0 on the #3076 branch.
#[must_use]
pub const fn max_plugin_version(profile: HostProfile) -> u32 {
    match profile {
        HostProfile::Pr3076 => abi::criu::plugin_version(0, 3, 0),
        _ => abi::criu::CRIU_PLUGIN_VERSION,
    }
}

/// Sets up the host state every lifecycle shares (opts, fi_strategy, rules, options, the image
/// directory plugins see and, with `--stream`, the streamer).
fn setup(cfg: &Config, final_state: FinalState, restore: bool) -> Result<(), EngineError> {
    std::hint::black_box(ffi_host::callbacks());
    if ffi_host::exported_size(c"cr_plugin_ctl") != Some(ctl_size_for_hooks(cfg.profile.hooks())) {
        return Err(EngineError::HostMismatch(cfg.profile));
    }
    if !(0..FI_MAX).contains(&cfg.fault) {
        return Err(EngineError::Fault(cfg.fault));
    }
    if !ffi_host::write_opts(
        cfg.profile.opts_size(),
        final_state.task_state(),
        cfg.timeout,
        cfg.profile.stream_offset(),
        cfg.stream,
    ) || !ffi_host::write_fi_strategy(cfg.fault)
    {
        return Err(EngineError::HostMismatch(cfg.profile));
    }
    host::set_rules(cfg.rules);
    host::set_options(cfg.options.clone());

    let images = &cfg.images_dir;
    let io_err = |source| EngineError::Images {
        path: images.display().to_string(),
        source,
    };
    if !restore {
        std::fs::create_dir_all(images).map_err(io_err)?;
    }
    let plugin_dir = if cfg.stream {
        let local = images::stream_local_dir(images, restore)?;
        host::set_streamer(Some(if restore {
            Streamer::serve(images)?
        } else {
            Streamer::capture()
        }));
        local
    } else {
        images.clone()
    };
    let fd = open_dir(&plugin_dir).map_err(io_err)?;
    host::set_image_dir(Some(fd));
    pr_info!(
        "harness: host {} (rules {}, {} hooks), images {}{}",
        cfg.profile,
        cfg.rules,
        cfg.profile.hooks(),
        images.display(),
        if cfg.stream { " (stream)" } else { "" }
    );
    Ok(())
}

fn open_dir(p: &Path) -> std::io::Result<OwnedFd> {
    let f = std::fs::File::open(p)?;
    if !f.metadata()?.is_dir() {
        return Err(std::io::Error::from_raw_os_error(libc::ENOTDIR));
    }
    Ok(OwnedFd::from(f))
}

/// Closes the image directory (and, on dump, writes the stream). CRIU's `close_image_dir`.
fn close_images(cfg: &Config) -> Result<(), EngineError> {
    host::set_image_dir(None);
    if let Some(s) = host::take_streamer() {
        s.finish(&cfg.images_dir)?;
    }
    Ok(())
}

fn task_entries(frozen: &Frozen) -> Vec<TaskEntry> {
    frozen
        .tasks()
        .iter()
        .map(|t| TaskEntry {
            pid: t.pid,
            parent: t.parent,
            start_time: t.start_time,
            zombie: t.zombie,
        })
        .collect()
}

fn write_inventory(
    cfg: &Config,
    stage: &str,
    final_state: FinalState,
    frozen: &Frozen,
) -> Result<(), EngineError> {
    let plugins = host::inventory().names().map(<[String]>::to_vec);
    InventoryFile {
        format: inventory::FORMAT.to_owned(),
        version: inventory::VERSION,
        host: cfg.profile.tag().to_owned(),
        stage: stage.to_owned(),
        stream: cfg.stream,
        final_state: final_state.task_state(),
        tasks: task_entries(frozen),
        plugins,
    }
    .write(&cfg.images_dir)?;
    Ok(())
}

/// Freezes the tree with PAUSE_DEVICES before each task (the alarm armed), as `collect_pstree`.
fn collect_pstree(
    engine: &Engine,
    cfg: &Config,
    root: i32,
    frozen: &mut Frozen,
) -> Result<(), EngineError> {
    ffi_host::arm_alarm(cfg.timeout);
    let r = frozen.collect(root, &mut |idx, pid| {
        let r = engine.run_chain(Hook::PAUSE_DEVICES, Arg::Task(pid, idx));
        if r < 0 && r != ENOTSUP {
            pr_err!("Can't pause devices of task {pid}: {r}");
            return Err(r);
        }
        Ok(())
    });
    ffi_host::disarm_alarm();
    match r {
        Ok(()) => {
            trace_event!("frozen tasks={}", frozen.tasks().len());
            Ok(())
        }
        Err(TreeError::Callback { pid, ret }) => Err(EngineError::Hook {
            hook: Hook::PAUSE_DEVICES.name(),
            pid: Some(pid),
            ret,
        }),
        Err(e) => {
            pr_err!("{e}");
            Err(e.into())
        }
    }
}

/// `criu dump -t ROOT`.
///
/// # Errors
/// Any failure of the dump; the tree has then been resumed.
pub fn dump(cfg: &Config, root: i32, final_state: FinalState) -> Result<(), EngineError> {
    setup(cfg, final_state, false)?;
    host::set_inventory(PluginList::new());
    trace_event!(
        "dump host={} rules={}{}",
        cfg.profile,
        cfg.rules,
        if cfg.sentinel { " sentinel" } else { "" }
    );
    let mut engine = Engine::new(cfg.profile, cfg.rules);
    if let Err(e) = engine.init_plugins(&cfg.libdir, Stage::DUMP) {
        let _ = close_images(cfg);
        trace_event!("dump -> failed");
        return Err(e);
    }
    let mut frozen = Frozen::new();
    let mut result = collect_pstree(&engine, cfg, root, &mut frozen);
    if result.is_ok() {
        result = checkpoint_devices(&engine, cfg, &frozen);
    }
    if result.is_ok() {
        result = dump_files(&frozen);
    }
    if result.is_ok() {
        result = dump_mount_namespace(root);
    }
    if result.is_ok() {
        let r = engine.dispatch_global(Hook::DUMP_DEVICES_LATE, Arg::Task(root, 0));
        if r != 0 && r != ENOTSUP {
            pr_err!("dump devices late hook failed: {r}");
            result = Err(EngineError::Hook {
                hook: Hook::DUMP_DEVICES_LATE.name(),
                pid: Some(root),
                ret: r,
            });
        }
    }
    if result.is_ok() {
        result = write_inventory(cfg, "dump", final_state, &frozen);
    }

    // cr_dump_finish(ret): the post-dump action script runs after a successful dump; its
    // failure makes CRIU resume the tree and fail, and (#3076) reaches DUMP_FINISH and the
    // plugins' exit, while CRIU 4.1/4.2 pass plugins the dump's own result only.
    let mut ret = if result.is_ok() { 0 } else { -1 };
    let mut post_dump_failed = false;
    if ret == 0 {
        if let Some(script) = &cfg.action_script {
            if let Err(e) = run_action_script(script, "post-dump") {
                pr_info!("Post dump script passed with {e}");
                post_dump_failed = true;
                result = Err(EngineError::ActionScript {
                    action: "post-dump",
                    reason: e,
                });
            }
        }
    }
    if post_dump_failed && cfg.rules == Rules::Newer {
        ret = -1;
    }
    let r = engine.dispatch_global(Hook::DUMP_FINISH, Arg::Int(ret));
    if r != 0 && r != ENOTSUP && ret == 0 {
        pr_err!("dump finish hook failed: {r}");
        ret = r;
        result = Err(EngineError::Hook {
            hook: Hook::DUMP_FINISH.name(),
            pid: None,
            ret: r,
        });
    }
    engine.fini(Stage::DUMP, ret);
    if ret != 0 {
        let _ = std::fs::remove_file(cfg.images_dir.join(inventory::FILE_NAME));
    }
    let mode = match (ret, final_state) {
        (0, FinalState::Dead | FinalState::Stopped) if !post_dump_failed => Release::Stop,
        _ => Release::Resume {
            continue_stopped: false,
        },
    };
    frozen.release(mode);
    trace_event!(
        "released {}",
        if mode == Release::Stop {
            "stopped"
        } else {
            "running"
        }
    );
    let closed = close_images(cfg);
    if result.is_ok() {
        result = closed;
    }
    trace_event!("dump -> {}", if result.is_ok() { "ok" } else { "failed" });
    result
}

/// Runs `script` as CRIU runs an action script: through the shell, with
/// `CRTOOLS_SCRIPT_ACTION=action`. Returns a description of a non-zero exit.
fn run_action_script(script: &Path, action: &str) -> Result<(), String> {
    let status = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(script.as_os_str())
        .env("CRTOOLS_SCRIPT_ACTION", action)
        .stdin(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} ({status})", status.code().unwrap_or(-1)))
    }
}

/// Descriptor kinds CRIU (4.1, 4.2) refuses to dump: anonymous inodes without a dumper. A
/// CUDA task whose GPU state was not checkpointed still holds such a descriptor in the mock
/// (as `/dev/nvidia*` on a GPU), so a dump that skipped it fails here as with real CRIU.
const UNDUMPABLE: [&str; 2] = ["anon_inode:[userfaultfd]", "anon_inode:[io_uring]"];

/// The file part of `dump_one_task`: fails on the first descriptor CRIU cannot dump.
fn dump_files(frozen: &Frozen) -> Result<(), EngineError> {
    for t in frozen.tasks().iter().filter(|t| !t.zombie) {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/fd", t.pid)) else {
            continue;
        };
        for e in dir.flatten() {
            let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(link) = std::fs::read_link(e.path()) else {
                continue;
            };
            let what = link.to_string_lossy().into_owned();
            if UNDUMPABLE.contains(&what.as_str()) {
                pr_err!("Can't dump file {fd} of that type [600] (anon {what})");
                pr_err!("Dump files (pid: {}) failed with -1", t.pid);
                return Err(EngineError::UndumpableFile {
                    pid: t.pid,
                    fd,
                    what,
                });
            }
        }
    }
    Ok(())
}

/// The mount-namespace part of a dump (`dump_mnt_namespaces`, after the tasks' files): when the
/// root's mount namespace is not the engine's, CRIU dumps it, and a container's mounts are
/// never all fully visible (`/sys/fs/cgroup` has children), so CRIU enters the namespace from
/// its main process (`open_mountpoint` → `switch_mnt_ns` → `setns(fd, CLONE_NEWNS)`) and
/// comes back. `setns` into a mount namespace fails with `EINVAL` while the caller shares its
/// filesystem attributes (`CLONE_FS`) with another thread: a thread that a plugin, or a library
/// it loaded (a driver's internal threads), left running in the engine fails the dump, as it
/// fails CRIU's ("Can't setns …/mnt: Invalid argument").
fn dump_mount_namespace(root: i32) -> Result<(), EngineError> {
    use nix::sched::{setns, CloneFlags};
    use std::os::fd::AsRawFd;
    let fail = |source: nix::errno::Errno| {
        pr_err!("Can't switch mnt_ns");
        EngineError::MountNamespace { pid: root, source }
    };
    let theirs = std::fs::read_link(format!("/proc/{root}/ns/mnt"));
    let ours = std::fs::read_link("/proc/self/ns/mnt");
    match (&theirs, &ours) {
        (Ok(t), Ok(o)) if t == o => return Ok(()),
        (Ok(_), Ok(_)) => {}
        _ => return Err(fail(nix::errno::Errno::ENOENT)),
    }
    let fd = |path: &str| {
        std::fs::File::open(path)
            .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
    };
    let back = fd("/proc/self/ns/mnt").map_err(fail)?;
    let cwd = fd(".").map_err(fail)?;
    let ns = fd(&format!("/proc/{root}/ns/mnt")).map_err(fail)?;
    if let Err(e) = setns(&ns, CloneFlags::CLONE_NEWNS) {
        pr_err!("Can't setns {}/mnt: {}", ns.as_raw_fd(), e.desc());
        return Err(fail(e));
    }
    pr_info!("mnt: entered the mount namespace of task {root}");
    // Back, and to the directory the engine was in (setns moved it to the namespace's root).
    setns(&back, CloneFlags::CLONE_NEWNS).map_err(fail)?;
    nix::unistd::fchdir(cwd.as_raw_fd()).map_err(fail)?;
    Ok(())
}

/// `checkpoint_devices` (criu/seize.c): CHECKPOINT_DEVICES for every live task in one loop, the
/// whole tree frozen; a result other than 0 and `-ENOTSUP` stops the loop and fails the dump.
/// With the #3105 sentinel, a loop that went through is followed by CHECKPOINT_DEVICES(-1),
/// whose result is checked the same way (`-ENOTSUP`, what a plugin that ignores the sentinel
/// answers, is harmless; another error fails the dump). A loop that stopped skips it.
fn checkpoint_devices(engine: &Engine, cfg: &Config, frozen: &Frozen) -> Result<(), EngineError> {
    for (idx, t) in frozen.tasks().iter().enumerate() {
        if t.zombie {
            continue;
        }
        let r = engine.run_chain(Hook::CHECKPOINT_DEVICES, Arg::Task(t.pid, idx));
        if r < 0 && r != ENOTSUP {
            pr_err!("Can't checkpoint devices of task {}: {r}", t.pid);
            return Err(EngineError::Hook {
                hook: Hook::CHECKPOINT_DEVICES.name(),
                pid: Some(t.pid),
                ret: r,
            });
        }
    }
    if cfg.sentinel {
        let r = engine.run_chain(Hook::CHECKPOINT_DEVICES, Arg::Sentinel);
        pr_info!("sentinel (#3105): CHECKPOINT_DEVICES({SENTINEL_PID}) -> {r}");
        if r < 0 && r != ENOTSUP {
            pr_err!("Can't checkpoint devices (sentinel, pid {SENTINEL_PID}): {r}");
            return Err(EngineError::Hook {
                hook: Hook::CHECKPOINT_DEVICES.name(),
                pid: Some(SENTINEL_PID),
                ret: r,
            });
        }
    }
    Ok(())
}

/// `criu pre-dump -t ROOT`: `init(PRE_DUMP)` and PAUSE_DEVICES per task, then the tree runs
/// again; no CHECKPOINT_DEVICES and no `exit`, as in CRIU.
///
/// # Errors
/// Any failure; the tree has then been resumed.
pub fn pre_dump(cfg: &Config, root: i32) -> Result<(), EngineError> {
    let final_state = FinalState::Alive;
    setup(cfg, final_state, false)?;
    host::set_inventory(PluginList::new());
    trace_event!("pre-dump host={} rules={}", cfg.profile, cfg.rules);
    let mut engine = Engine::new(cfg.profile, cfg.rules);
    if let Err(e) = engine.init_plugins(&cfg.libdir, Stage::PRE_DUMP) {
        let _ = close_images(cfg);
        trace_event!("pre-dump -> failed");
        return Err(e);
    }
    let mut frozen = Frozen::new();
    let mut result = collect_pstree(&engine, cfg, root, &mut frozen);
    frozen.release(Release::Resume {
        continue_stopped: false,
    });
    trace_event!("released running");
    if result.is_ok() {
        result = write_inventory(cfg, "pre-dump", final_state, &frozen);
    }
    engine.abandon();
    let closed = close_images(cfg);
    if result.is_ok() {
        result = closed;
    }
    trace_event!(
        "pre-dump -> {}",
        if result.is_ok() { "ok" } else { "failed" }
    );
    result
}

/// `criu restore`: resumes the tasks recorded in the image.
///
/// # Errors
/// Any failure; the tasks are then left as they were before the restore.
pub fn restore(cfg: &Config) -> Result<(), EngineError> {
    let inv = InventoryFile::read(&cfg.images_dir).inspect_err(|e| pr_err!("{e}"))?;
    setup(cfg, FinalState::Dead, true)?;
    host::set_inventory(PluginList::from_image(inv.plugins.as_deref()));
    trace_event!(
        "restore host={} rules={}{}",
        cfg.profile,
        cfg.rules,
        if cfg.sentinel { " sentinel" } else { "" }
    );
    let mut engine = Engine::new(cfg.profile, cfg.rules);
    if let Err(e) = engine.init_plugins(&cfg.libdir, Stage::RESTORE) {
        let _ = close_images(cfg);
        trace_event!("restore -> failed");
        return Err(e);
    }

    let known: Vec<(i32, Option<usize>, u64, bool)> = inv
        .tasks
        .iter()
        .map(|t| (t.pid, t.parent, t.start_time, t.zombie))
        .collect();
    let mut frozen = Frozen::new();
    let mut result = frozen
        .seize_known(&known)
        .and_then(|()| frozen.leave_group_stop())
        .map_err(|e| {
            pr_err!("{e}");
            EngineError::from(e)
        });
    if result.is_ok() {
        trace_event!("seized tasks={}", frozen.tasks().len());
        let r = engine.dispatch_global(Hook::POST_FORKING, Arg::Void);
        if engine.global_failed(r) {
            pr_err!("post forking hook failed: {r}");
            result = Err(EngineError::Hook {
                hook: Hook::POST_FORKING.name(),
                pid: None,
                ret: r,
            });
        }
    }
    if result.is_ok() {
        result = resume_devices_late(&engine, cfg, &frozen);
    }
    if result.is_ok() {
        // finalize_restore_detach: a task that died (a plugin killed it) cannot be detached,
        // and CRIU fails the restore ("Unable to detach", then it kills the tree).
        if let Some(t) = frozen
            .tasks()
            .iter()
            .find(|t| !t.zombie && matches!(crate::procfs::state(t.pid), 'Z' | 'X' | '?'))
        {
            pr_err!("Unable to detach {}: No such process", t.pid);
            result = Err(EngineError::TaskDied { pid: t.pid });
        }
    }
    let closed = close_images(cfg);
    if result.is_ok() {
        result = closed;
    }
    let ret = if result.is_ok() { 0 } else { -1 };
    frozen.release(Release::Resume {
        continue_stopped: ret == 0,
    });
    trace_event!(
        "released {}",
        if ret == 0 { "running" } else { "as before" }
    );
    if ret == 0 {
        pr_info!("Restore finished successfully. Tasks resumed.");
    }
    engine.fini(Stage::RESTORE, ret);
    trace_event!(
        "restore -> {}",
        if result.is_ok() { "ok" } else { "failed" }
    );
    result
}

/// The late stage of `restore_root_task` (criu/cr-restore.c): RESUME_DEVICES_LATE for every
/// live restored task in one loop before the tree is released. With the #3105 sentinel the loop
/// is followed by RESUME_DEVICES_LATE(-1), whose result is handled as a task's result of the
/// same loop under the rules in force (see [`late_result`]).
fn resume_devices_late(engine: &Engine, cfg: &Config, frozen: &Frozen) -> Result<(), EngineError> {
    for (idx, t) in frozen.tasks().iter().enumerate() {
        if t.zombie {
            continue;
        }
        let r = engine.run_chain(Hook::RESUME_DEVICES_LATE, Arg::Task(t.pid, idx));
        late_result(cfg, r, t.pid)?;
    }
    if cfg.sentinel {
        let r = engine.run_chain(Hook::RESUME_DEVICES_LATE, Arg::Sentinel);
        pr_info!("sentinel (#3105): RESUME_DEVICES_LATE({SENTINEL_PID}) -> {r}");
        late_result(cfg, r, SENTINEL_PID)?;
    }
    Ok(())
}

/// What a RESUME_DEVICES_LATE result does: under the newer rules anything but 0 and `-ENOTSUP`
/// fails the restore; under the 4.1 rules it is only logged (4.1.1 logs even `-ENOTSUP`).
fn late_result(cfg: &Config, r: i32, pid: i32) -> Result<(), EngineError> {
    match cfg.rules {
        Rules::Newer => {
            if r != 0 && r != ENOTSUP {
                pr_err!("resume devices late hook failed for task {pid}: {r}");
                return Err(EngineError::Hook {
                    hook: Hook::RESUME_DEVICES_LATE.name(),
                    pid: Some(pid),
                    ret: r,
                });
            }
        }
        Rules::Criu41 => {
            // 4.1.1 logs even -ENOTSUP; later lines suppress it. Never fatal.
            if r < 0 && (r != ENOTSUP || cfg.profile == HostProfile::Criu41) {
                pr_debug!("restore late stage hook for external plugin failed");
            }
        }
    }
    Ok(())
}

/// What `harness plugins` reports for one library.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PluginInfo {
    /// The file name (opaque: only the descriptor name identifies a plugin).
    pub file: String,
    /// The descriptor name.
    pub name: String,
    /// The descriptor version.
    pub version: u32,
    /// The descriptor's `max_hooks` (after its constructors ran).
    pub max_hooks: u32,
    /// Names of the non-NULL hooks below `max_hooks`.
    pub hooks: Vec<&'static str>,
    /// `None` when this host accepts the descriptor, else why `verify_plugin` rejects it.
    pub rejected: Option<String>,
    /// Declared options (`CR_PLUGIN_OPTIONS_META`), if published and readable.
    pub options: Option<Vec<OptionMeta>>,
    /// Why published metadata was ignored.
    pub options_error: Option<String>,
}

/// `harness plugins --libdir DIR`: opens every `*.so` (running constructors) and reads
/// descriptors and option metadata, never calling `init`. Libraries without a descriptor are
/// skipped with a warning.
///
/// # Errors
/// An unreadable directory or a library that cannot be opened.
pub fn inspect(profile: HostProfile, dir: &Path) -> Result<Vec<PluginInfo>, EngineError> {
    let entries = std::fs::read_dir(dir).map_err(|source| EngineError::LibDir {
        path: dir.display().to_string(),
        source,
    })?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| EngineError::LibDir {
            path: dir.display().to_string(),
            source,
        })?;
        let fname = entry.file_name();
        if !fname.as_encoded_bytes().ends_with(b".so") {
            continue;
        }
        let path = dir.join(&fname);
        let plugin = match dl::open(&path, profile.hooks()) {
            Ok(Opened::Descriptor(p)) => p,
            Ok(Opened::Legacy(_)) => {
                pr_warn!("{} has no CR_PLUGIN_DESC; skipped", path.display());
                continue;
            }
            Err(e) => {
                return Err(EngineError::Load {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })
            }
        };
        let hooks = (0..HOOK_COUNT_BUILD)
            .filter(|&i| plugin.hook(i).is_some())
            .map(|i| Hook(i).name())
            .collect();
        let (options, options_error) = match plugin.options_meta() {
            None => (None, None),
            Some(Ok(o)) => (Some(o), None),
            Some(Err(e)) => (None, Some(e.to_string())),
        };
        out.push(PluginInfo {
            file: fname.to_string_lossy().into_owned(),
            name: plugin.name().to_owned(),
            version: plugin.version(),
            max_hooks: plugin.max_hooks(),
            hooks,
            rejected: verify(profile, &plugin).err(),
            options,
            options_error,
        });
    }
    Ok(out)
}
