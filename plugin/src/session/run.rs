//! The running session: the plugin's state between CRIU's `init` and `exit`, and what each of
//! CRIU's calls does with it. The entry points ([`crate::entry`]) only translate CRIU's
//! arguments, call one function here and turn its result into CRIU's return value.

use crate::agent::client::{Link, LinkGuard};
use crate::agent::proto::FinishMode;
use crate::agent::Access;
use crate::engine::dump::Dump;
use crate::engine::restore::Restore;
use crate::engine::{Core, Engine, EngineError, Outcome};
use crate::env::Environment;
use crate::error::PluginError;
use crate::ffi::criu;
use crate::hooks::MaxHooks;
use crate::host::Level;
use crate::message::{Report, Tenths};
use crate::select::Selected;
use crate::session::criu_host::{CriuHost, Helper};
use crate::session::{InitContext, Start};
use crate::worker::Worker;
use abi::criu::Stage;
use std::ffi::c_int;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    crate::ffi::log::log(level.criu(), msg);
}

/// The per-task hooks, each with its stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskHook {
    PauseDevices,
    CheckpointDevices,
    ResumeDevicesLate,
}

impl TaskHook {
    /// CRIU's name of the hook, for the log.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::PauseDevices => "PAUSE_DEVICES",
            Self::CheckpointDevices => "CHECKPOINT_DEVICES",
            Self::ResumeDevicesLate => "RESUME_DEVICES_LATE",
        }
    }

    /// The stage in which CRIU calls it.
    #[must_use]
    pub fn stage(self) -> Stage {
        match self {
            Self::PauseDevices | Self::CheckpointDevices => Stage::DUMP,
            Self::ResumeDevicesLate => Stage::RESTORE,
        }
    }

    fn run(self, engine: &mut Engine, pid: i32) -> Result<Outcome, EngineError> {
        match (self, engine) {
            (Self::PauseDevices, Engine::Dump(d)) => d.pause_devices(pid),
            (Self::CheckpointDevices, Engine::Dump(d)) => d.checkpoint_devices(pid),
            (Self::ResumeDevicesLate, Engine::Restore(r)) => r.resume_devices_late(pid),
            // The other operation's hook (`task_hook` checks the stage first).
            _ => Ok(Outcome::NotMine),
        }
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

/// `init(stage)`: decides, through [`super::start`], whether and how the plugin works in this
/// operation, starts the helper process and builds the engine the hooks then use. `mh` is the
/// load-time constructor's choice of `max_hooks` ([`crate::hooks`]). A failure is logged here,
/// with the stage, and returned for the entry point to turn into an errno.
pub fn init(stage: Stage, mh: &MaxHooks) -> Result<(), PluginError> {
    *active() = None;
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
    let plugin_so = crate::ffi::plugin_path();
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
        host_options: criu::plugin_options().unwrap_or_else(|code| {
            log(
                Level::Warn,
                &format!(
                    "criu_plugin_get_options failed ({code}); using {}",
                    crate::env::OPTIONS
                ),
            );
            None
        }),
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
    let worker = Worker::new(Arc::new(crate::ffi::pin_self));
    let mut host = CriuHost {
        access: Access {
            worker: worker.clone(),
            link: None,
        },
        helper: Helper::Off,
    };
    match super::start(&ctx, &mut host) {
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
            Ok(())
        }
        Ok(Start::Enabled(plan)) => {
            for n in &plan.notes {
                log(Level::Info, n);
            }
            match &plan.selected {
                Selected::Driver { version, init, .. } => {
                    log(
                        Level::Info,
                        &format!(
                            "backend driver-api ({} {version})",
                            crate::ffi::cuda::LIBRARY
                        ),
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
                    timeout: plan.cfg.timeout,
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
                    Box::new(|| crate::helper::spawn_named(criu::image_dir_fd(), c"cuda-copier")),
                )
            });
            let backend =
                super::build_backend(plan.selected, plan.cfg.timeout, worker.clone(), custom);
            let mut core = Core::new(
                backend,
                Box::new(crate::ffi::ptrace::Ptrace),
                // The host init probed with: its helper is running, failed or off by now, so
                // the engine's calls never start one.
                Box::new(host),
                plan.cfg,
            );
            if let Some(h) = &helper {
                core = core.with_guard(Box::new(LinkGuard(Arc::clone(h))));
            }
            // `start` enables the plugin only to dump or to restore.
            let engine = if stage == Stage::DUMP {
                Engine::Dump(Dump::new(core))
            } else {
                Engine::Restore(Restore::new(core))
            };
            *active() = Some(Active {
                stage,
                engine: Some(engine),
                started: Instant::now(),
                helper,
            });
            Ok(())
        }
        Err(e) => {
            finish_helper(host.access.link.as_ref(), FinishMode::Done);
            log(
                Level::Error,
                &format!("init({}) failed: {}", stage.name(), Report(&e)),
            );
            Err(e)
        }
    }
}

/// Runs a per-task hook: [`Outcome::NotMine`] (`-ENOTSUP` for CRIU) when the plugin is
/// disabled, in the other stage, or given a pid that is not a task's; a failure is logged here,
/// with the hook, the pid and the time it took.
pub fn task_hook(hook: TaskHook, pid: c_int) -> Result<Outcome, PluginError> {
    let (name, stage) = (hook.name(), hook.stage());
    // Never a task of CRIU's: CRIU proposal #3105 calls CHECKPOINT_DEVICES and
    // RESUME_DEVICES_LATE with pid -1 after each per-task loop, and a pid of 0 or below must
    // never reach a driver call, a signal or a rollback.
    if pid <= 0 {
        return Ok(Outcome::NotMine);
    }
    let mut guard = active();
    let Some(Active {
        stage: s,
        engine: Some(engine),
        ..
    }) = guard.as_mut()
    else {
        return Ok(Outcome::NotMine);
    };
    if *s != stage {
        return Ok(Outcome::NotMine);
    }
    let _ = engine.core().take_spent();
    let t = Instant::now();
    let r = hook.run(engine, pid);
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let spent = engine.core().take_spent();
    match r {
        Ok(Outcome::Handled) => {
            let in_ms = |d: std::time::Duration| Tenths(d.as_secs_f64() * 1000.0);
            log(
                Level::Debug,
                &format!(
                    "{name} pid {pid}: waited {} ms on {}, {} ms on restore-thread control",
                    in_ms(spent.backend),
                    engine.core().backend().kind(),
                    in_ms(spent.threads)
                ),
            );
            log(
                Level::Debug,
                &format!("{name} pid {pid}: done in {} ms", Tenths(ms)),
            );
            Ok(Outcome::Handled)
        }
        Ok(Outcome::NotMine) => {
            if engine.core_mut().take_batch_ran() {
                // Not a CUDA task, but this call ran every task's work (parallel mode).
                log(
                    Level::Debug,
                    &format!("{name} pid {pid}: done in {} ms", Tenths(ms)),
                );
            }
            Ok(Outcome::NotMine)
        }
        Err(e) => {
            log(
                Level::Error,
                &format!("{} (after {} ms)", Report(&e), Tenths(ms)),
            );
            Err(PluginError::from(e))
        }
    }
}

/// `exit(stage, ret)`: at dump, the rollback if DUMP_FINISH did not run it (and the dump
/// failed); at restore, the restore's end; then the helper is told to finish.
pub fn exit(stage: Stage, ret: c_int) {
    {
        let Some(mut a) = active().take() else { return };
        if let Some(engine) = a.engine.as_mut() {
            match engine {
                Engine::Dump(d) if stage == Stage::DUMP => {
                    // After DUMP_FINISH: rolls back only if the dump failed after it; errors
                    // are logged by the engine.
                    let _ = d.dump_finish(ret);
                }
                Engine::Restore(r) if stage == Stage::RESTORE => r.restore_finish(ret),
                _ => {}
            }
            if let Some(n) = engine.core().backend().executions() {
                log(
                    Level::Info,
                    &format!("cuda-checkpoint ran {n} time(s) in this {}", a.stage.name()),
                );
            }
            let mode = match engine {
                Engine::Dump(d) => d.finish_mode(),
                Engine::Restore(_) => FinishMode::Done,
            };
            finish_helper(a.helper.as_ref(), mode);
        } else {
            finish_helper(a.helper.as_ref(), FinishMode::Done);
        }
        log(
            Level::Info,
            &format!(
                "exit({}, {ret}) after {} ms",
                stage.name(),
                Tenths(a.started.elapsed().as_secs_f64() * 1000.0)
            ),
        );
    }
}

/// DUMP_FINISH `(ret)` (CRIU 4.2+): the dump's end, with the rollback if it failed after the
/// checkpoints; [`Outcome::NotMine`] when no dump is under way.
pub fn dump_finish(ret: c_int) -> Result<Outcome, PluginError> {
    let mut guard = active();
    let Some(Active {
        engine: Some(Engine::Dump(dump)),
        ..
    }) = guard.as_mut()
    else {
        return Ok(Outcome::NotMine);
    };
    dump.dump_finish(ret)?;
    Ok(Outcome::Handled)
}
