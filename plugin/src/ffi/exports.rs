//! What CRIU sees: `CR_PLUGIN_DESC`, the load-time constructor, and the `extern "C"` entry
//! points.
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
//! logger, and becomes -1 (or nothing, for `exit`). The plugin's state lives in one mutex-guarded
//! global, reset by every `init` (CRIU's service mode may load the same file again).

use super::{criu, cuda, ptrace};
use crate::agent::client::{Link, LinkGuard};
use crate::agent::proto::FinishMode;
use crate::agent::Access;
use crate::backend::cli::{probe_cli, CliProbe, ProcessRunner};
use crate::backend::driver::DriverProbe;
use crate::engine::{Engine, EngineError, Outcome};
use crate::env::Environment;
use crate::error::PluginError;
use crate::hooks::{self, MaxHooks};
use crate::host::Level;
use crate::machine::{GpuError, Machine};
use crate::message::{Report, Tenths};
use crate::select::Selected;
use crate::session::{self, InitContext, Probes, Start};
use crate::worker::Worker;
use abi::criu::options_meta::{self, CrPluginOptionMeta, CrPluginOptionsMeta};
use abi::criu::{CrPluginDesc, Hook, Stage, CRIU_PLUGIN_VERSION, HOOK_COUNT_BUILD};
use criu::{CriuHost, Helper};
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void, OsStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

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
            criu::plugin_ctl_size(),
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

/// The plugin's state between `init` and `exit`.
struct Active {
    stage: Stage,
    /// `None` when the plugin is disabled for this operation.
    engine: Option<Engine>,
    started: Instant,
    /// The helper process, when one runs (see [`crate::agent`]).
    helper: Option<Arc<Link>>,
}

static ACTIVE: Mutex<Option<Active>> = Mutex::new(None);

fn active() -> std::sync::MutexGuard<'static, Option<Active>> {
    ACTIVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn log(level: Level, msg: &str) {
    super::log::log(level.criu(), msg);
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

impl CriuHost {
    /// Starts the helper if it may run and does not yet. CRIU is single-threaded here: nothing
    /// of the plugin's has run on a thread yet (every driver call so far went to the helper, or
    /// there was none).
    fn ensure_helper(&mut self) {
        if !matches!(self.helper, Helper::Allowed) {
            return;
        }
        match crate::agent::spawn(criu::image_dir_fd()) {
            Ok(link) => {
                log(
                    Level::Debug,
                    &format!("helper process {} started", link.agent_pid()),
                );
                self.access.link = Some(Arc::new(link));
                self.helper = Helper::Running;
            }
            Err(e) => {
                log(
                    Level::Warn,
                    &format!(
                        "{e}: driver calls run on threads inside CRIU (a dump of a tree in its \
                         own mount namespace may then fail), and nothing guards the tasks \
                         should CRIU die"
                    ),
                );
                self.helper = Helper::Failed;
            }
        }
    }
}

impl Probes for CriuHost {
    fn allow_helper(&mut self, allowed: bool) {
        self.helper = if allowed {
            Helper::Allowed
        } else {
            Helper::Off
        };
    }

    fn probe_driver(&mut self, call_init: bool, limit: Option<Duration>) -> DriverProbe {
        self.ensure_helper();
        // A driver whose cuDriverGetVersion or cuInit hangs must not hang CRIU.
        self.access.probe(call_init, limit)
    }

    fn probe_cli(
        &mut self,
        program: Option<&Path>,
        path: Option<&OsStr>,
        timeout: Option<Duration>,
    ) -> CliProbe {
        probe_cli(program, path, &mut ProcessRunner, timeout)
    }
}

impl Machine for CriuHost {
    fn current_gpus(
        &mut self,
        limit: Option<Duration>,
    ) -> Result<Vec<crate::inventory::GpuInfo>, GpuError> {
        self.ensure_helper();
        self.access.current_gpus(limit)
    }

    fn gpu_memory(
        &mut self,
        limit: Option<Duration>,
    ) -> Result<crate::nvml::Snapshot, crate::nvml::NvmlError> {
        self.ensure_helper();
        self.access.gpu_memory(limit)
    }

    fn memory_available(&self) -> Option<u64> {
        crate::env::mem_available_override().or_else(|| {
            crate::nvml::parse_mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
        })
    }

    fn tree(&self, root: crate::backend::Pid) -> Vec<crate::backend::Pid> {
        crate::thread::descendants(root)
    }
}

/// Tells the helper (if one runs) that the plugin's work is over.
fn finish_helper(helper: Option<&Arc<Link>>, mode: FinishMode) {
    if let Some(h) = helper {
        if let Err(e) = h.finish(mode) {
            log(
                Level::Warn,
                &format!("cannot tell the helper process to finish ({e})"),
            );
        }
    }
}

fn init(stage: Stage) -> c_int {
    *active() = None;
    install_panic_hook();
    let mh = MAX_HOOKS
        .get()
        .cloned()
        .unwrap_or_else(|| hooks::choose(None, None));
    log(
        Level::Info,
        &format!(
            "{} {}: init({}), max_hooks {} ({}), DUMP_FINISH {}",
            crate::PLUGIN_NAME,
            crate::PLUGIN_VERSION,
            stage.name(),
            mh.count,
            mh.reason,
            if mh.has_dump_finish() {
                "available"
            } else {
                "unavailable: rollback runs in exit"
            }
        ),
    );
    let env = Environment::from_process();
    let plugin_so = super::plugin_path();
    if plugin_so.is_none() {
        log(
            Level::Warn,
            &format!(
                "cannot find out where this plugin was loaded from; {} next to it is not read",
                crate::config::FILE_NAME
            ),
        );
    }
    let lookup = crate::config::Lookup::new(env.plugin_config.as_deref(), plugin_so.as_deref());
    let config = lookup.load();
    // Logged before anything can fail or disable the plugin: which file set the node's options.
    if let Ok(Some(f)) = &config {
        log(
            Level::Info,
            &format!(
                "options file {} ({}): {} option(s)",
                f.path.display(),
                f.origin,
                f.options.len()
            ),
        );
    }
    let ctx = InitContext {
        late_errors_ignored: !mh.has_dump_finish(),
        streaming: criu::streaming(),
        stage,
        host_options: criu::plugin_options(),
        config,
        env,
        nvidia_gpu_present: Path::new("/proc/driver/nvidia/gpus/").is_dir(),
        fault: criu::fault_strategy(),
        criu_timeout: criu::opts_timeout(),
        final_state: criu::opts_final_state(),
    };
    if ctx.final_state.is_none() && stage == Stage::DUMP {
        log(
            Level::Warn,
            "cannot read CRIU's opts.final_state; assuming the tasks do not stay running",
        );
    }
    let worker = Worker::new(Arc::new(super::pin_self));
    let mut host = CriuHost {
        access: Access {
            worker: worker.clone(),
            link: None,
        },
        helper: Helper::Off,
    };
    match session::start(&ctx, &mut host) {
        Ok(Start::Disabled { reason, warn }) => {
            log(
                if warn { Level::Warn } else { Level::Info },
                &format!("disabled: {reason}"),
            );
            finish_helper(host.access.link.as_ref(), FinishMode::Done);
            *active() = Some(Active {
                stage,
                engine: None,
                started: Instant::now(),
                helper: None,
            });
            0
        }
        Ok(Start::Enabled(plan)) => {
            for n in &plan.notes {
                log(Level::Info, n);
            }
            match &plan.selected {
                Selected::Driver { version, init, .. } => {
                    log(
                        Level::Info,
                        &format!("backend driver-api ({} {version})", cuda::LIBRARY),
                    );
                    if let Some(code) = init.filter(|c| !c.is_success()) {
                        log(Level::Warn, &format!("cuInit(0) failed with {code}; restore needs an initialised driver or persistence mode"));
                    }
                }
                Selected::Cli {
                    program,
                    device_map,
                } => log(
                    Level::Info,
                    &format!(
                        "backend cuda-checkpoint ({}, --device-map {})",
                        program.display(),
                        if *device_map {
                            "supported"
                        } else {
                            "unsupported"
                        }
                    ),
                ),
            }
            if stage == Stage::DUMP && !criu::set_interrupt_only_mode() {
                log(Level::Warn, "CRIU has no set_compel_interrupt_only_mode; a cgroup freezer would also freeze restore threads");
            }
            host.ensure_helper();
            let helper = host.access.link.clone();
            if let Some(h) = &helper {
                let config = crate::agent::proto::GuardConfig {
                    stage: if stage == Stage::DUMP {
                        crate::agent::proto::GuardStage::Dump
                    } else {
                        crate::agent::proto::GuardStage::Restore
                    },
                    backend: match &plan.selected {
                        Selected::Driver { .. } => crate::agent::proto::GuardBackend::DriverApi,
                        Selected::Cli {
                            program,
                            device_map,
                        } => crate::agent::proto::GuardBackend::Cli {
                            program: program.clone(),
                            device_map: *device_map,
                        },
                    },
                    timeout_ms: plan.cfg.timeout.map(crate::message::millis),
                    copy_rate: plan.cfg.copy_rate(),
                    kill_on_restore_failure: plan.cfg.on_restore_failure
                        == crate::options::RestoreFailure::Kill,
                };
                match h.note(&crate::agent::proto::ToAgent::Configure(config)) {
                    Ok(()) => log(
                        Level::Info,
                        "guardian on: a helper process runs the driver calls and puts the tasks \
                         back should CRIU die",
                    ),
                    Err(e) => log(
                        Level::Warn,
                        &format!("cannot configure the helper process ({e}); nothing guards the tasks should CRIU die"),
                    ),
                }
            }
            let custom = plan.custom.as_ref().map(|c| {
                crate::cstore::client::CustomPath::new(
                    c.dump_id,
                    criu::image_dir_fd(),
                    Box::new(|| crate::agent::spawn_named(criu::image_dir_fd(), c"cuda-copier")),
                )
            });
            let backend =
                session::build_backend(plan.selected, plan.cfg.timeout, worker.clone(), custom);
            let mut engine = Engine::new(
                backend,
                Box::new(ptrace::Ptrace),
                // The host init probed with: its helper is running, failed or off by now, so
                // the engine's calls never start one.
                Box::new(host),
                plan.cfg,
            );
            if let Some(h) = &helper {
                engine = engine.with_guard(Box::new(LinkGuard(Arc::clone(h))));
            }
            *active() = Some(Active {
                stage,
                engine: Some(engine),
                started: Instant::now(),
                helper,
            });
            0
        }
        Err(e) => {
            finish_helper(host.access.link.as_ref(), FinishMode::Done);
            log(
                Level::Error,
                &format!("init({}) failed: {}", stage.name(), Report(&e)),
            );
            e.to_errno()
        }
    }
}

/// Runs a per-task hook: `-ENOTSUP` when disabled or in the wrong stage.
fn per_task(
    name: &str,
    stage: Stage,
    pid: c_int,
    f: impl FnOnce(&mut Engine, i32) -> Result<Outcome, EngineError>,
) -> c_int {
    // Never a task of CRIU's: CRIU proposal #3105 calls CHECKPOINT_DEVICES and
    // RESUME_DEVICES_LATE with pid -1 after each per-task loop, and a pid of 0 or below must
    // never reach a driver call, a signal or a rollback.
    if pid <= 0 {
        return -libc::ENOTSUP;
    }
    let mut guard = active();
    let Some(Active {
        stage: s,
        engine: Some(engine),
        ..
    }) = guard.as_mut()
    else {
        return -libc::ENOTSUP;
    };
    if *s != stage {
        return -libc::ENOTSUP;
    }
    let _ = engine.take_spent();
    let t = Instant::now();
    let r = f(engine, pid);
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let spent = engine.take_spent();
    match r {
        Ok(Outcome::Handled) => {
            let in_ms = |d: std::time::Duration| Tenths(d.as_secs_f64() * 1000.0);
            log(
                Level::Debug,
                &format!(
                    "{name} pid {pid}: waited {} ms on {}, {} ms on restore-thread control",
                    in_ms(spent.backend),
                    engine.backend().kind(),
                    in_ms(spent.threads)
                ),
            );
            log(
                Level::Debug,
                &format!("{name} pid {pid}: done in {} ms", Tenths(ms)),
            );
            0
        }
        Ok(Outcome::NotMine) => {
            if engine.take_batch_ran() {
                // Not a CUDA task, but this call ran every task's work (parallel mode).
                log(
                    Level::Debug,
                    &format!("{name} pid {pid}: done in {} ms", Tenths(ms)),
                );
            }
            -libc::ENOTSUP
        }
        Err(e) => {
            log(
                Level::Error,
                &format!("{} (after {} ms)", Report(&e), Tenths(ms)),
            );
            PluginError::from(e).to_errno()
        }
    }
}

extern "C" fn cuda_plugin_init(stage: c_int) -> c_int {
    guard("init", -1, || init(Stage(stage)))
}

extern "C" fn cuda_plugin_exit(stage: c_int, ret: c_int) {
    guard("exit", (), || {
        let Some(mut a) = active().take() else { return };
        if let Some(engine) = a.engine.as_mut() {
            if a.stage == Stage::DUMP && Stage(stage) == Stage::DUMP {
                // After DUMP_FINISH: rolls back only if the dump failed after it; errors are
                // logged by the engine.
                let _ = engine.dump_finish(ret);
            }
            if a.stage == Stage::RESTORE && Stage(stage) == Stage::RESTORE {
                engine.restore_finish(ret);
            }
            if let Some(n) = engine.backend().executions() {
                log(
                    Level::Info,
                    &format!("cuda-checkpoint ran {n} time(s) in this {}", a.stage.name()),
                );
            }
            let mode = if a.stage == Stage::DUMP {
                engine.finish_mode()
            } else {
                FinishMode::Done
            };
            finish_helper(a.helper.as_ref(), mode);
        } else {
            finish_helper(a.helper.as_ref(), FinishMode::Done);
        }
        log(
            Level::Info,
            &format!(
                "exit({}, {ret}) after {} ms",
                Stage(stage).name(),
                Tenths(a.started.elapsed().as_secs_f64() * 1000.0)
            ),
        );
    });
}

extern "C" fn pause_devices(pid: c_int) -> c_int {
    guard("PAUSE_DEVICES", -1, || {
        per_task("PAUSE_DEVICES", Stage::DUMP, pid, Engine::pause_devices)
    })
}

extern "C" fn checkpoint_devices(pid: c_int) -> c_int {
    guard("CHECKPOINT_DEVICES", -1, || {
        per_task(
            "CHECKPOINT_DEVICES",
            Stage::DUMP,
            pid,
            Engine::checkpoint_devices,
        )
    })
}

extern "C" fn resume_devices_late(pid: c_int) -> c_int {
    guard("RESUME_DEVICES_LATE", -1, || {
        per_task(
            "RESUME_DEVICES_LATE",
            Stage::RESTORE,
            pid,
            Engine::resume_devices_late,
        )
    })
}

extern "C" fn dump_finish(ret: c_int) -> c_int {
    guard("DUMP_FINISH", -1, || {
        let mut guard = active();
        let Some(Active {
            stage: Stage::DUMP,
            engine: Some(engine),
            ..
        }) = guard.as_mut()
        else {
            return -libc::ENOTSUP;
        };
        match engine.dump_finish(ret) {
            Ok(()) => 0,
            Err(e) => PluginError::from(e).to_errno(),
        }
    })
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
