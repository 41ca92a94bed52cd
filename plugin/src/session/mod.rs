//! What `init(stage)` decides: whether the plugin takes part in this CRIU operation, with which
//! backend and settings. Pure logic over [`InitContext`] (facts read from CRIU and the system)
//! and [`InitServices`] (probes and the inventory), so every rule is unit-tested.
//!
//! The plugin is *disabled* (every hook returns `-ENOTSUP`, `init` succeeds) for:
//!
//! * pre-dump: CRIU calls PAUSE_DEVICES there but never CHECKPOINT_DEVICES nor `exit`, so a lock
//!   taken there would never be released;
//! * a dump on a machine without an NVIDIA GPU (`/proc/driver/nvidia/gpus/` absent), unless CRIU's
//!   fault 138 (`CRIU_FAULT=138`, `FI_PLUGIN_CUDA_FORCE_ENABLE`) or `CRIU_CUDA_FORCE_ENABLE=1` asks
//!   to run anyway, for hardware-free testing against a mock driver;
//! * a dump where `backend=auto` finds neither backend supported (logged as a warning);
//! * a restore whose inventory does not list `cuda_plugin` (a CPU-only image): no backend is
//!   probed at all.
//!
//! A restore whose inventory lists `cuda_plugin` must succeed in selecting a backend or `init`
//! fails: restoring CUDA tasks without one would leave them broken. The inventory entry is
//! consumed only once the backend is ready (exact match; see [`crate::ffi::criu`]).

pub mod criu_host;
pub mod run;

use crate::backend::cli::{Cli, CliProbe, ProcessRunner};
use crate::backend::driver::{DriverApi, DriverHandle, DriverProbe};
use crate::backend::{Backend, GpuPair, Pid};
use crate::engine::EngineConfig;
use crate::env::Environment;
use crate::error::PluginError;
use crate::gpu_map::{self, MapSpec};
use crate::host::Host;
use crate::host::InventoryAnswer;
use crate::image::{TaskImage, TaskList};
use crate::options::{self, OptionSource, Options};
use crate::select::{select, SelectError, Selected, Selection};
use crate::worker::Worker;
use abi::criu::Stage;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use abi::criu::fault::PLUGIN_CUDA_FORCE_ENABLE as FI_PLUGIN_CUDA_FORCE_ENABLE;
use abi::criu::opts::TASK_ALIVE;

/// Facts gathered before deciding.
#[derive(Debug, Clone)]
pub struct InitContext {
    pub stage: Stage,
    /// `criu_plugin_get_options` strings after `argv[0]`; `None` when the host lacks it.
    pub host_options: Option<Vec<String>>,
    pub env: Environment,
    /// The plugin's options file, as looked up and read ([`crate::config::Lookup::load`]).
    pub config: Result<Option<crate::config::ConfigFile>, crate::config::ConfigError>,
    /// `/proc/driver/nvidia/gpus/` exists.
    pub nvidia_gpu_present: bool,
    /// CRIU's `fi_strategy`, when readable.
    pub fault: Option<i32>,
    /// CRIU's `opts.timeout` (seconds), when readable.
    pub criu_timeout: Option<u32>,
    /// CRIU's `opts.final_state`, when readable.
    pub final_state: Option<i32>,
    /// The host only logs a failed RESUME_DEVICES_LATE (it has no DUMP_FINISH: CRIU 4.1, 4.2).
    pub late_errors_ignored: bool,
    /// CRIU runs with its image streamer (`--stream`).
    pub streaming: bool,
}

/// How `init` probes the backends, on top of what it asks of its [`Host`] (the same seam the
/// engine then runs on).
pub trait Probes {
    /// Whether the helper process may run (`guardian=on`); called once the options are known,
    /// before any other service that may touch the driver.
    fn allow_helper(&mut self, allowed: bool) {
        let _ = allowed;
    }
    /// Probes the driver API, giving up after `limit` (`None`: no limit).
    fn probe_driver(&mut self, call_init: bool, limit: Option<Duration>) -> DriverProbe;
    fn probe_cli(
        &mut self,
        program: Option<&Path>,
        path: Option<&OsStr>,
        timeout: Option<Duration>,
    ) -> CliProbe;
}

/// Side-effecting services `init` uses: its host's (CRIU's and the machine's) and the probes.
pub trait InitServices: Host + Probes {}

impl<T: Host + Probes + ?Sized> InitServices for T {}

/// An enabled plugin's settings.
#[derive(Debug)]
pub struct Plan {
    pub stage: Stage,
    pub selected: Selected,
    pub cfg: EngineConfig,
    pub options: Options,
    /// Custom storage, when this dump or restore uses it.
    pub custom: Option<CustomPlan>,
    /// Lines for the init log.
    pub notes: Vec<String>,
}

/// A dump or restore that moves GPU memory through custom storage ([`crate::cstore`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomPlan {
    /// The dump's id (a restore: the dump's, checked against every file).
    pub dump_id: [u8; 16],
}

/// The decision.
#[derive(Debug)]
pub enum Start {
    Disabled { reason: String, warn: bool },
    Enabled(Box<Plan>),
}

fn disabled(reason: impl Into<String>) -> Result<Start, PluginError> {
    Ok(Start::Disabled {
        reason: reason.into(),
        warn: false,
    })
}

/// Decides, for `init(ctx.stage)`.
pub fn start(ctx: &InitContext, svc: &mut dyn InitServices) -> Result<Start, PluginError> {
    let file = ctx.config.clone()?;
    let (options, source) = options::collect(
        ctx.host_options.as_deref(),
        ctx.env.plugin_options.as_deref(),
        file.as_ref().map(crate::config::ConfigFile::as_options),
    )?;
    let map_spec = options
        .device_map
        .as_deref()
        .map(MapSpec::parse)
        .transpose()?;
    // The skip-rollback mutant (see `harness/tests/mutants.rs`) is a plugin without any way
    // back: no guardian either, or the corpus could not tell it from a working one.
    svc.allow_helper(!options.no_guardian && !cfg!(criu_cuda_mutant = "skip-rollback"));
    let timeout = options.effective_timeout(ctx.criu_timeout);
    let mut notes = vec![format!(
        "options from {source}: backend={}, timeout={}, device map: {}",
        options.backend,
        timeout.map_or_else(|| "none".to_owned(), |t| format!("{}s", t.as_secs())),
        map_spec
            .as_ref()
            .map_or_else(|| "not given".to_owned(), ToString::to_string),
    )];
    if source.run == OptionSource::None && source.file.is_none() && ctx.host_options.is_none() {
        notes.push(
            "CRIU has no criu_plugin_get_options; options come from CRIU_PLUGIN_OPTIONS".into(),
        );
    }
    let forced = if ctx.fault == Some(FI_PLUGIN_CUDA_FORCE_ENABLE) {
        Some("CRIU fault 138")
    } else if ctx.env.force_enable {
        Some("CRIU_CUDA_FORCE_ENABLE=1")
    } else {
        None
    };
    let gpu_ok = ctx.nvidia_gpu_present || forced.is_some();
    if let (false, Some(why)) = (ctx.nvidia_gpu_present, forced) {
        notes.push(format!("no NVIDIA GPU found, running anyway ({why})"));
    }
    let no_gpu = "no NVIDIA GPU (/proc/driver/nvidia/gpus/ is absent; CRIU_CUDA_FORCE_ENABLE=1 or CRIU_FAULT=138 overrides)";
    let restore = match ctx.stage {
        Stage::PRE_DUMP => {
            return disabled(
                "pre-dump: CRIU never resumes devices paused there, so CUDA is left alone",
            )
        }
        Stage::DUMP => {
            if map_spec.is_some() {
                return Err(PluginError::MapOnDump("dump"));
            }
            if !gpu_ok {
                return disabled(no_gpu);
            }
            false
        }
        Stage::RESTORE => {
            let consumed =
                match svc.inventory_query() {
                    InventoryAnswer::NotListed => return disabled(
                        "the image inventory does not list cuda_plugin (no CUDA state to restore)",
                    ),
                    InventoryAnswer::Listed { consumed } => consumed,
                    InventoryAnswer::Unknown(why) => {
                        notes.push(format!(
                        "cannot read the image inventory ({why}); assuming it lists cuda_plugin"
                    ));
                        true
                    }
                };
            if !gpu_ok {
                return Err(PluginError::RestoreImpossible(no_gpu.to_owned()));
            }
            !consumed
        }
        Stage(other) => return disabled(format!("unknown stage {other}")),
    };
    let pairs: Vec<GpuPair> = if ctx.stage == Stage::RESTORE {
        resolve_map(map_spec.as_ref(), timeout, svc, &mut notes)?
    } else {
        Vec::new()
    };
    let restore_tasks = if ctx.stage == Stage::RESTORE {
        load_task_records(svc, &mut notes)?
    } else {
        None
    };
    if let (Some(tasks), false) = (&restore_tasks, options.skip_capacity_check) {
        check_gpu_room(tasks, &pairs, timeout, svc, &mut notes)?;
    }
    let need_map = !pairs.is_empty();
    let path = ctx.env.path.clone();
    let program = options.cuda_checkpoint.clone();
    let driver_unsupported = std::cell::RefCell::new(None);
    let selection = {
        let svc_cell = std::cell::RefCell::new(&mut *svc);
        select(
            options.backend,
            need_map,
            || {
                let p = svc_cell
                    .borrow_mut()
                    .probe_driver(ctx.stage == Stage::RESTORE, timeout);
                if let DriverProbe::Unsupported(why) = &p {
                    *driver_unsupported.borrow_mut() = Some(why.clone());
                }
                p
            },
            || {
                svc_cell
                    .borrow_mut()
                    .probe_cli(program.as_deref(), path.as_deref(), timeout)
            },
        )?
    };
    if let (Selection::Use(Selected::Cli { .. }), Some(why)) =
        (&selection, driver_unsupported.into_inner())
    {
        notes.push(format!(
            "auto: the driver API is unsupported here ({why}); using cuda-checkpoint"
        ));
    }
    let selected = match selection {
        Selection::Use(s) => s,
        Selection::NoneAvailable { driver, cli } => {
            if ctx.stage == Stage::RESTORE {
                return Err(SelectError::NoneAvailable { driver, cli }.into());
            }
            return Ok(Start::Disabled {
                reason: format!("no CUDA checkpoint backend available (driver API: {driver}; cuda-checkpoint: {cli})"),
                warn: true,
            });
        }
    };
    // Before the entry is consumed: a refused restore leaves it for the next try.
    let custom = custom_storage(
        ctx,
        &options,
        &selected,
        restore_tasks.as_ref(),
        svc,
        &mut notes,
    )?;
    if restore {
        svc.inventory_consume().map_err(PluginError::Inventory)?;
    }
    // Without the guardian the driver API's calls run one at a time inside CRIU: a batch would
    // overlap nothing, and locks ahead would each get a share of CRIU's freeze alarm sized for
    // overlapping rounds, so their sum would not be bounded by it.
    // (Said only when parallel= was given: by default it is simply one at a time then.)
    let mut parallel = options.parallel.width();
    let overlap = selected.kind().facts().overlap;
    if parallel > 1 && options.no_guardian && overlap == crate::backend::registry::Overlap::Threads
    {
        parallel = 1;
        if options.parallel != crate::options::Parallel::Unset {
            notes.push(
                "parallel: off for the driver API with guardian=off (its calls run one at a time)"
                    .to_owned(),
            );
        }
    }
    Ok(Start::Enabled(Box::new(Plan {
        stage: ctx.stage,
        selected,
        custom,
        cfg: EngineConfig {
            timeout,
            criu_timeout: ctx.criu_timeout,
            pairs,
            leave_running: ctx.final_state == Some(TASK_ALIVE),
            restore_tasks,
            on_restore_failure: options.on_restore_failure,
            late_errors_ignored: ctx.late_errors_ignored,
            skip_capacity_check: options.skip_capacity_check,
            min_copy_rate: options
                .min_copy_rate
                .as_ref()
                .map_or(0.0, crate::options::CopyRate::bytes_per_second),
            parallel,
        },
        options,
        notes,
    })))
}

/// Decides whether this dump or restore uses custom storage (`custom-storage=`, see
/// `docs/custom-storage.md`), refusing before any task is touched where it is asked for and
/// cannot work. A restore whose image has custom-storage files checks every file's header and
/// frames here ([`crate::cstore::pipeline::verify_file`]): a missing, stale, truncated or
/// damaged file refuses the restore, naming it.
fn custom_storage(
    ctx: &InitContext,
    options: &Options,
    selected: &Selected,
    restore_tasks: Option<&BTreeMap<Pid, TaskImage>>,
    svc: &mut dyn InitServices,
    notes: &mut Vec<String>,
) -> Result<Option<CustomPlan>, PluginError> {
    use crate::options::CustomStorage;
    let mode = options.custom_storage;
    // Why it cannot work here, if it cannot.
    let blocker = match selected {
        s if !s.kind().facts().custom_storage => {
            Some(format!("the {} backend has no custom storage", s.kind()))
        }
        Selected::Driver {
            custom_storage: false,
            version,
            ..
        } => Some(format!(
            "the driver (CUDA {}.{}) has no custom storage: it needs CUDA 13.4 (cuCheckpointOperationComplete)",
            version / 1000,
            version % 1000 / 10
        )),
        Selected::Driver { .. } if options.no_guardian => Some(
            "guardian=off: custom storage copies in a helper process, which guardian=off rules out"
                .to_owned(),
        ),
        Selected::Driver { .. } if ctx.streaming => Some(
            "CRIU's image streamer (--stream) takes one stream, and custom storage writes files in parallel"
                .to_owned(),
        ),
        _ => None,
    };
    if ctx.stage == Stage::RESTORE {
        let records: Vec<(Pid, crate::image::CustomRecord)> = restore_tasks
            .into_iter()
            .flatten()
            .filter_map(|(p, t)| t.custom.clone().map(|c| (*p, c)))
            .collect();
        let Some((_, first)) = records.first() else {
            if mode == CustomStorage::On {
                return Err(PluginError::CustomStorage(
                    "custom-storage=on, but this image was dumped without custom storage".into(),
                ));
            }
            return Ok(None);
        };
        if mode == CustomStorage::Off {
            return Err(PluginError::CustomStorage(format!(
                "custom-storage=off, but this image keeps {} task(s)' GPU memory in custom-storage files",
                records.len()
            )));
        }
        if let Some(why) = blocker {
            return Err(PluginError::CustomStorage(format!(
                "this image keeps {} task(s)' GPU memory in custom-storage files, and {why}",
                records.len()
            )));
        }
        let dump_id = first.dump_id;
        let mut files = 0usize;
        let mut bytes = 0u64;
        for (pid, rec) in &records {
            for (n, (uuid, size)) in rec.gpus.iter().enumerate() {
                let place = u32::try_from(n).unwrap_or(u32::MAX);
                let name = crate::cstore::pipeline::file_name(rec.file_pid, place);
                let file = svc
                    .open_image_file(&name)
                    .map_err(|e| PluginError::CustomStorage(format!("task {pid}: {e}")))?
                    .ok_or_else(|| {
                        PluginError::CustomStorage(format!("task {pid}: {name} is missing"))
                    })?;
                let expected = crate::cstore::pipeline::Expected {
                    dump_id: rec.dump_id,
                    pid: rec.file_pid,
                    uuid: *uuid,
                    place,
                    size: *size,
                };
                let mut file = crate::cstore::pipeline::ImageFile {
                    file,
                    path: name.clone().into(),
                    direct: false,
                };
                crate::cstore::pipeline::verify_file(&mut file, &expected)
                    .map_err(|e| PluginError::CustomStorage(format!("task {pid}: {e}")))?;
                files += 1;
                bytes += size;
            }
        }
        notes.push(format!(
            "custom storage: {files} file(s), {} of GPU memory, checked (headers and frames)",
            crate::message::bytes(bytes)
        ));
        return Ok(Some(CustomPlan { dump_id }));
    }
    match (mode, blocker) {
        (CustomStorage::Off, _) => {
            notes.push(
                "custom storage: off (custom-storage=off); GPU memory is staged in host memory"
                    .into(),
            );
            Ok(None)
        }
        (CustomStorage::On, Some(why)) => Err(PluginError::CustomStorage(format!(
            "custom-storage=on cannot be honoured: {why}"
        ))),
        (CustomStorage::Auto, Some(why)) => {
            notes.push(format!(
                "custom storage: not used ({why}); GPU memory is staged in host memory"
            ));
            Ok(None)
        }
        (_, None) => {
            let dump_id =
                crate::cstore::client::new_dump_id().map_err(PluginError::CustomStorage)?;
            notes.push(format!(
                "custom storage: on (dump {}): GPU memory goes straight to cuda-cs-*.img",
                crate::image::dump_id_hex(&dump_id)
            ));
            Ok(Some(CustomPlan { dump_id }))
        }
    }
}

/// Reads the dump's GPU inventory and resolves the device map against this host's GPUs, before
/// any task is touched. Returns the restore pairs: empty when every GPU maps to itself (so no
/// pairs reach drivers that predate them).
fn resolve_map(
    spec: Option<&MapSpec>,
    limit: Option<Duration>,
    svc: &mut dyn InitServices,
    notes: &mut Vec<String>,
) -> Result<Vec<GpuPair>, PluginError> {
    let inventory = match svc
        .read_image(
            crate::inventory::FILE_NAME,
            crate::inventory::MAX_IMAGE_BYTES,
        )
        .map_err(PluginError::ImageRead)?
    {
        Some(bytes) => Some(crate::inventory::read(&mut &bytes[..])?),
        None => {
            notes.push("the image has no GPU inventory (dumped by an older plugin or without GPU enumeration)".into());
            None
        }
    };
    if spec.is_none() && inventory.is_none() {
        return Ok(Vec::new());
    }
    let current = svc.current_gpus(limit).map_err(PluginError::Gpus)?;
    let resolved = gpu_map::resolve(spec, inventory.as_deref(), &current)?;
    if resolved.is_identity() {
        notes.push(format!(
            "device map: every checkpointed GPU is present ({} GPU(s)); no remapping",
            resolved.pairs.len()
        ));
        Ok(Vec::new())
    } else {
        notes.push(format!("device map: {}", resolved.cli_value()));
        Ok(resolved.pairs)
    }
}

/// Reads the dump's task list and every per-task image it names, and checks them, before any
/// task is touched (see [`crate::image`]). `None` for a dump from before the task list existed.
fn load_task_records(
    svc: &mut dyn InitServices,
    notes: &mut Vec<String>,
) -> Result<Option<BTreeMap<Pid, TaskImage>>, PluginError> {
    use crate::image::{file_name, LIST_FILE_NAME, MAX_TASK_IMAGE, MAX_TASK_LIST};
    let Some(bytes) = svc
        .read_image(LIST_FILE_NAME, MAX_TASK_LIST)
        .map_err(PluginError::ImageRead)?
    else {
        notes.push(format!(
            "the image has no task list ({LIST_FILE_NAME}: dumped by an older plugin); each \
             task's image is read when CRIU resumes it"
        ));
        return Ok(None);
    };
    let list = TaskList::decode(&bytes).map_err(|cause| PluginError::TaskImage {
        name: LIST_FILE_NAME.to_owned(),
        cause,
    })?;
    let mut out = BTreeMap::new();
    for pid in list.pids {
        let name = file_name(pid);
        let bytes = svc
            .read_image(&name, MAX_TASK_IMAGE)
            .map_err(PluginError::ImageRead)?
            .ok_or(PluginError::TaskImageMissing { pid })?;
        let img = TaskImage::decode(&bytes, pid)
            .map_err(|cause| PluginError::TaskImage { name, cause })?;
        out.insert(pid, img);
    }
    notes.push(format!("the dump holds {} CUDA task(s)", out.len()));
    Ok(Some(out))
}

/// Before any task is restored: every target GPU must have as much free memory as the
/// checkpointed tasks mapped onto it held at dump (their images record it).
fn check_gpu_room(
    tasks: &BTreeMap<Pid, TaskImage>,
    pairs: &[GpuPair],
    limit: Option<Duration>,
    svc: &mut dyn InitServices,
    notes: &mut Vec<String>,
) -> Result<(), PluginError> {
    let mut need: BTreeMap<abi::GpuUuid, u64> = BTreeMap::new();
    for img in tasks.values() {
        for &(old, bytes) in &img.gpu_bytes {
            let target = pairs
                .iter()
                .find(|(o, _)| *o == old)
                .map_or(old, |(_, n)| *n);
            *need.entry(target).or_insert(0) += bytes;
        }
    }
    if need.is_empty() {
        return Ok(());
    }
    let snapshot = match svc.gpu_memory(limit) {
        Ok(s) => s,
        Err(e) => {
            notes.push(format!("{e}: the GPU-memory check is skipped"));
            return Ok(());
        }
    };
    let short = crate::nvml::shortfalls(&snapshot, &need);
    if let Some(s) = short.first() {
        return Err(PluginError::GpuTooSmall {
            gpu: s.gpu,
            need: s.need,
            free: s.free,
            others: short.len() - 1,
        });
    }
    let room: Vec<String> = need
        .iter()
        .map(|(g, n)| {
            format!(
                "{g}: {} of {} free",
                crate::nvml::gib(*n),
                crate::nvml::gib(snapshot.gpu(*g).map_or(0, |m| m.free))
            )
        })
        .collect();
    notes.push(format!("GPU memory needed (NVML): {}", room.join(", ")));
    Ok(())
}

/// Builds the selected backend; driver calls run on `worker`. With `custom`, the driver-API
/// backend moves GPU memory through custom storage.
#[must_use]
pub fn build_backend(
    selected: Selected,
    timeout: Option<Duration>,
    worker: Worker,
    custom: Option<crate::cstore::client::CustomPath>,
) -> Box<dyn Backend> {
    let with_custom = |d: DriverApi| match custom {
        Some(c) => d.with_custom_storage(Box::new(c)),
        None => d,
    };
    match selected {
        Selected::Driver {
            driver: DriverHandle::Local(driver),
            ..
        } => Box::new(with_custom(DriverApi::new(driver, timeout, worker))),
        Selected::Driver {
            driver: DriverHandle::Exec(exec),
            ..
        } => Box::new(with_custom(DriverApi::with_exec(exec, timeout))),
        Selected::Cli {
            program,
            device_map,
        } => Box::new(Cli::new(
            program,
            Box::new(ProcessRunner),
            timeout,
            device_map,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::driver::tests::FakeDriver;
    use crate::backend::BackendKind;
    use crate::host::{Criu, FreezeAlarm, HostError, Level};
    use crate::inventory::GpuInfo;
    use crate::machine::Machine;
    use crate::options::BackendChoice;
    use std::sync::Arc;

    #[derive(Default)]
    struct Svc {
        driver_version: Option<i32>,
        cli_ok: bool,
        inventory: Option<InventoryAnswer>,
        driver_probes: usize,
        cli_probes: usize,
        queries: usize,
        consumed: usize,
        init_requested: Option<bool>,
        gpu_image: Option<Vec<u8>>,
        nvml: Option<crate::nvml::Snapshot>,
        /// Other images of the dump, by name.
        images: std::collections::HashMap<String, Vec<u8>>,
        gpus: Vec<GpuInfo>,
        enumerations: usize,
        cli_without_map: bool,
    }

    impl Probes for Svc {
        fn probe_driver(&mut self, call_init: bool, _: Option<Duration>) -> DriverProbe {
            self.driver_probes += 1;
            self.init_requested = Some(call_init);
            match self.driver_version {
                Some(v) => crate::backend::driver::probe_driver(
                    Ok(Arc::new(FakeDriver {
                        version: Some(v),
                        ..Default::default()
                    })),
                    call_init,
                ),
                None => DriverProbe::Unsupported("cannot load libcuda.so.1".into()),
            }
        }
        fn probe_cli(
            &mut self,
            _: Option<&Path>,
            _: Option<&OsStr>,
            _: Option<Duration>,
        ) -> CliProbe {
            self.cli_probes += 1;
            if self.cli_ok {
                CliProbe::Supported {
                    program: "/bin/cuda-checkpoint".into(),
                    device_map: !self.cli_without_map,
                }
            } else {
                CliProbe::Unsupported("cuda-checkpoint not found in PATH".into())
            }
        }
    }

    /// `init` reads images and the inventory; it logs through its notes and writes nothing.
    impl Criu for Svc {
        fn inventory_query(&mut self) -> InventoryAnswer {
            self.queries += 1;
            self.inventory.clone().unwrap_or(InventoryAnswer::NotListed)
        }
        fn inventory_consume(&mut self) -> Result<(), HostError> {
            self.consumed += 1;
            Ok(())
        }
        fn read_image(&mut self, name: &str, limit: usize) -> Result<Option<Vec<u8>>, HostError> {
            let data = if name == crate::inventory::FILE_NAME {
                self.gpu_image.clone()
            } else {
                self.images.get(name).cloned()
            };
            match data {
                Some(d) if d.len() > limit => Err(HostError::TooLarge {
                    name: name.to_owned(),
                    limit,
                }),
                d => Ok(d),
            }
        }
        fn open_image_file(&mut self, name: &str) -> Result<Option<std::fs::File>, HostError> {
            let Some(data) = self.images.get(name) else {
                return Ok(None);
            };
            let mut f = tempfile::tempfile().map_err(|source| HostError::Io {
                what: "test file",
                name: name.to_owned(),
                source,
            })?;
            use std::io::{Seek, Write};
            f.write_all(data)
                .and_then(|()| f.rewind())
                .map_err(|source| HostError::Io {
                    what: "test file",
                    name: name.to_owned(),
                    source,
                })?;
            Ok(Some(f))
        }
        fn log(&self, level: Level, msg: &str) {
            panic!("init logs through its notes, not the host: {level} {msg}");
        }
        fn add_inventory_entry(&mut self) -> Result<(), HostError> {
            panic!("init adds no inventory entry");
        }
        fn write_task_image(&mut self, pid: Pid, _: &[u8]) -> Result<(), HostError> {
            panic!("init writes no task image (pid {pid})");
        }
        fn write_task_list(&mut self, _: &[u8]) -> Result<(), HostError> {
            panic!("init writes no task list");
        }
        fn write_gpu_inventory(&mut self, _: &[u8]) -> Result<(), HostError> {
            panic!("init writes no GPU inventory");
        }
        fn freeze_alarm(&self) -> FreezeAlarm {
            panic!("init does not read CRIU's freeze alarm");
        }
    }

    impl Machine for Svc {
        fn current_gpus(
            &mut self,
            _: Option<Duration>,
        ) -> Result<Vec<GpuInfo>, crate::machine::GpuError> {
            self.enumerations += 1;
            Ok(self.gpus.clone())
        }
        fn gpu_memory(
            &mut self,
            _: Option<Duration>,
        ) -> Result<crate::nvml::Snapshot, crate::nvml::NvmlError> {
            self.nvml
                .clone()
                .ok_or_else(|| crate::nvml::NvmlError::Absent("no NVML in this test".into()))
        }
        fn memory_available(&self) -> Option<u64> {
            panic!("init does not read the machine's memory");
        }
        fn tree(&self, root: Pid) -> Vec<Pid> {
            panic!("init does not walk the process tree (root {root})");
        }
    }

    fn ctx(stage: Stage) -> InitContext {
        InitContext {
            late_errors_ignored: true,
            streaming: false,
            stage,
            host_options: None,
            env: Environment::default(),
            config: Ok(None),
            nvidia_gpu_present: true,
            fault: None,
            criu_timeout: Some(10),
            final_state: Some(2),
        }
    }

    #[test]
    fn a_restore_onto_gpus_without_room_is_refused_before_any_task() {
        use crate::image::{file_name, TaskImage, TaskList, LIST_FILE_NAME};
        let old = abi::GpuUuid([1; 16]);
        let mut img = TaskImage::new(10, 11, abi::CUprocessState::RUNNING);
        img.gpu_bytes = vec![(old, 80 << 30)];
        let images = std::collections::HashMap::from([
            (
                LIST_FILE_NAME.to_owned(),
                TaskList { pids: vec![10] }.encode(),
            ),
            (file_name(10), img.encode()),
        ]);
        let snapshot = |free: u64| crate::nvml::Snapshot {
            gpus: vec![crate::nvml::GpuMemory {
                uuid: old,
                total: 81 << 30,
                free,
                processes: Vec::new(),
                mig: None,
            }],
        };
        let mut svc = Svc {
            driver_version: Some(13000),
            inventory: Some(InventoryAnswer::Listed { consumed: false }),
            images: images.clone(),
            nvml: Some(snapshot(40 << 30)),
            ..Default::default()
        };
        let e = start(&ctx(Stage::RESTORE), &mut svc).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains(&old.to_string()) && m.contains("80.0 GiB") && m.contains("40.0 GiB"),
            "{m}"
        );
        assert_eq!(
            svc.driver_probes, 0,
            "refused before a backend is even chosen"
        );
        // Enough room: fine; and the check does not need NVML.
        let mut svc = Svc {
            driver_version: Some(13000),
            inventory: Some(InventoryAnswer::Listed { consumed: false }),
            images: images.clone(),
            nvml: Some(snapshot(80 << 30)),
            ..Default::default()
        };
        assert!(matches!(
            start(&ctx(Stage::RESTORE), &mut svc),
            Ok(Start::Enabled(_))
        ));
        let mut svc = Svc {
            driver_version: Some(13000),
            inventory: Some(InventoryAnswer::Listed { consumed: false }),
            images,
            ..Default::default()
        };
        match start(&ctx(Stage::RESTORE), &mut svc).unwrap() {
            Start::Enabled(p) => assert!(
                p.notes
                    .iter()
                    .any(|n| n.contains("GPU-memory check is skipped")),
                "{:?}",
                p.notes
            ),
            s @ Start::Disabled { .. } => panic!("{s:?}"),
        }
    }

    fn reason(s: &Start) -> &str {
        match s {
            Start::Disabled { reason, .. } => reason,
            Start::Enabled(_) => "enabled",
        }
    }

    #[test]
    fn pre_dump_and_no_gpu_disable_without_probing() {
        let mut svc = Svc {
            driver_version: Some(13000),
            ..Default::default()
        };
        let s = start(&ctx(Stage::PRE_DUMP), &mut svc).unwrap();
        assert!(reason(&s).contains("pre-dump"), "{s:?}");
        let mut c = ctx(Stage::DUMP);
        c.nvidia_gpu_present = false;
        let s = start(&c, &mut svc).unwrap();
        assert!(reason(&s).contains("/proc/driver/nvidia/gpus/"), "{s:?}");
        assert_eq!(
            svc.driver_probes + svc.cli_probes,
            0,
            "disabled means no probe at all"
        );
        c.fault = Some(138);
        assert!(
            matches!(start(&c, &mut svc).unwrap(), Start::Enabled(_)),
            "fault 138 forces"
        );
        c.fault = None;
        c.env.force_enable = true;
        let s = start(&c, &mut svc).unwrap();
        let Start::Enabled(plan) = s else {
            panic!("CRIU_CUDA_FORCE_ENABLE=1 forces")
        };
        assert!(
            plan.notes
                .iter()
                .any(|n| n.contains(criu_cuda_env::FORCE_ENABLE)),
            "{:?}",
            plan.notes
        );
        assert_eq!(svc.init_requested, Some(false), "no cuInit at dump");
    }

    #[test]
    fn restore_of_a_cpu_only_image_probes_nothing() {
        let mut svc = Svc {
            driver_version: Some(13000),
            cli_ok: true,
            ..Default::default()
        };
        let s = start(&ctx(Stage::RESTORE), &mut svc).unwrap();
        assert!(reason(&s).contains("does not list cuda_plugin"), "{s:?}");
        assert_eq!((svc.driver_probes, svc.cli_probes, svc.consumed), (0, 0, 0));
    }

    #[test]
    fn restore_consumes_the_entry_only_after_the_backend_is_ready() {
        let mut svc = Svc {
            driver_version: Some(13000),
            inventory: Some(InventoryAnswer::Listed { consumed: false }),
            ..Default::default()
        };
        let Start::Enabled(plan) = start(&ctx(Stage::RESTORE), &mut svc).unwrap() else {
            panic!()
        };
        assert!(
            matches!(plan.selected, Selected::Driver { init: Some(_), .. }),
            "restore calls cuInit"
        );
        assert_eq!(svc.consumed, 1);
        // No backend: fail, and leave the entry (CRIU then reports the missing plugin too).
        let mut svc = Svc {
            inventory: Some(InventoryAnswer::Listed { consumed: false }),
            ..Default::default()
        };
        let e = start(&ctx(Stage::RESTORE), &mut svc).unwrap_err();
        assert!(e.to_string().contains("no backend is available"), "{e}");
        assert_eq!(svc.consumed, 0);
        // CRIU 4.1's destructive check already consumed it.
        let mut svc = Svc {
            driver_version: Some(13000),
            inventory: Some(InventoryAnswer::Listed { consumed: true }),
            ..Default::default()
        };
        assert!(matches!(
            start(&ctx(Stage::RESTORE), &mut svc).unwrap(),
            Start::Enabled(_)
        ));
        assert_eq!(svc.consumed, 0, "never consumed twice");
        // Listed but no GPU: a clear failure.
        let mut c = ctx(Stage::RESTORE);
        c.nvidia_gpu_present = false;
        let mut svc = Svc {
            inventory: Some(InventoryAnswer::Listed { consumed: false }),
            ..Default::default()
        };
        assert!(matches!(
            start(&c, &mut svc).unwrap_err(),
            PluginError::RestoreImpossible(_)
        ));
    }

    #[test]
    fn dump_without_any_backend_disables_with_a_warning() {
        let mut svc = Svc::default();
        let s = start(&ctx(Stage::DUMP), &mut svc).unwrap();
        assert!(matches!(s, Start::Disabled { warn: true, .. }), "{s:?}");
        assert!(
            reason(&s).contains("libcuda.so.1") && reason(&s).contains("PATH"),
            "{s:?}"
        );
        let mut c = ctx(Stage::DUMP);
        c.env.plugin_options = Some("cuda_plugin.backend=driver-api".into());
        assert!(matches!(
            start(&c, &mut svc).unwrap_err(),
            PluginError::Select(SelectError::DriverUnsupported(_))
        ));
    }

    #[test]
    fn options_timeout_and_final_state_reach_the_engine_config() {
        let mut c = ctx(Stage::DUMP);
        c.host_options = Some(vec![
            "--cuda_plugin.backend=cuda-checkpoint".into(),
            "--cuda_plugin.timeout=3".into(),
        ]);
        c.final_state = Some(TASK_ALIVE);
        let mut svc = Svc {
            driver_version: Some(13000),
            cli_ok: true,
            ..Default::default()
        };
        let Start::Enabled(plan) = start(&c, &mut svc).unwrap() else {
            panic!()
        };
        assert_eq!(
            plan.options.backend,
            BackendChoice::Only(BackendKind::CudaCheckpoint)
        );
        assert!(matches!(plan.selected, Selected::Cli { .. }));
        assert_eq!(svc.driver_probes, 0, "explicit CLI never loads libcuda");
        assert_eq!(plan.cfg.timeout, Some(Duration::from_secs(3)));
        assert!(plan.cfg.leave_running);
        c.host_options = Some(vec!["--cuda_plugin.timeout=soon".into()]);
        let e = start(&c, &mut svc).unwrap_err();
        assert!(e.to_string().contains("cuda_plugin.timeout"), "{e}");
        assert_eq!(e.to_errno(), -libc::EINVAL);
        c.host_options = Some(vec!["--cuda_plugin.device-map=nonsense".into()]);
        assert!(matches!(
            start(&c, &mut svc).unwrap_err(),
            PluginError::DeviceMap(_)
        ));
    }

    /// A dump's `init` with `opts` (without the `cuda_plugin.` prefix) on a driver of CUDA
    /// `version`: whether it uses custom storage, or why it refused, and its notes.
    fn custom_dump(opts: &[&str], version: i32, streaming: bool) -> Result<(bool, String), String> {
        let mut c = ctx(Stage::DUMP);
        c.streaming = streaming;
        c.host_options = Some(opts.iter().map(|o| format!("--cuda_plugin.{o}")).collect());
        let mut svc = Svc {
            driver_version: Some(version),
            cli_ok: true,
            ..Default::default()
        };
        match start(&c, &mut svc) {
            Ok(Start::Enabled(plan)) => Ok((plan.custom.is_some(), plan.notes.join("\n"))),
            Ok(other) => Err(format!("{other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn custom_storage_is_used_exactly_where_it_works_and_on_refuses_elsewhere() {
        let driver = "backend=driver-api";
        let cli = "backend=cuda-checkpoint";
        // auto: on with the driver API and the guardian on a 13.4 driver.
        let (on, notes) = custom_dump(&[driver], 13040, false).unwrap();
        assert!(on && notes.contains("custom storage: on (dump "), "{notes}");
        for (opts, version, streaming, why) in [
            (
                &[driver][..],
                13030,
                false,
                "has no custom storage: it needs CUDA 13.4",
            ),
            (
                &[cli][..],
                13040,
                false,
                "the cuda-checkpoint backend has no custom storage",
            ),
            (&[driver, "guardian=off"][..], 13040, false, "guardian=off"),
            (&[driver][..], 13040, true, "--stream"),
        ] {
            let (on, notes) = custom_dump(opts, version, streaming).unwrap();
            assert!(!on, "{opts:?}");
            assert!(
                notes.contains("custom storage: not used (") && notes.contains(why),
                "{opts:?}: {notes}"
            );
            // on: the same situations refuse the dump before any task is touched.
            let mut with_on = opts.to_vec();
            with_on.push("custom-storage=on");
            let e = custom_dump(&with_on, version, streaming).unwrap_err();
            assert!(
                e.contains("custom-storage=on cannot be honoured") && e.contains(why),
                "{with_on:?}: {e}"
            );
        }
        let (on, notes) = custom_dump(&[driver, "custom-storage=off"], 13040, false).unwrap();
        assert!(!on && notes.contains("custom storage: off"), "{notes}");
        let (on, _) = custom_dump(&[driver, "custom-storage=on"], 13040, false).unwrap();
        assert!(on);
    }

    /// A restore's services whose dump holds task 7 with its GPU memory in custom-storage
    /// files: one file of `size` bytes on GPU 1, with `file`'s bytes (`None`: absent).
    fn custom_image(version: i32, file: Option<Vec<u8>>) -> Svc {
        let mut t = TaskImage::new(7, 8, abi::CUprocessState::RUNNING);
        t.custom = Some(crate::image::CustomRecord {
            dump_id: [5; 16],
            file_pid: 7,
            gpus: vec![(abi::GpuUuid([1; 16]), 0)],
        });
        let mut images = std::collections::HashMap::new();
        images.insert(
            crate::image::LIST_FILE_NAME.to_owned(),
            crate::image::TaskList { pids: vec![7] }.encode(),
        );
        images.insert(crate::image::file_name(7), t.encode());
        if let Some(f) = file {
            images.insert(crate::cstore::pipeline::file_name(7, 0), f);
        }
        Svc {
            driver_version: Some(version),
            cli_ok: true,
            inventory: Some(InventoryAnswer::Listed { consumed: false }),
            images,
            ..Default::default()
        }
    }

    /// An empty GPU share's file (header and end frame) of dump `id`, task 7, GPU 1.
    fn empty_share(id: [u8; 16]) -> Vec<u8> {
        use crate::cstore::format::{Header, Walker};
        let h = Header {
            dump_id: id,
            pid: 7,
            uuid: abi::GpuUuid([1; 16]),
            place: 0,
            chunk: 4096,
            size: 0,
        };
        let (block, crc) = h.encode();
        let mut w = Walker::new(h, crc);
        let (_, end) = w.end().unwrap();
        let mut v = block.to_vec();
        v.extend_from_slice(&end[..]);
        v
    }

    #[test]
    fn a_custom_storage_image_is_checked_or_refused_at_restore_init() {
        let restore = |svc: &mut Svc, opts: &[&str]| {
            let mut c = ctx(Stage::RESTORE);
            c.host_options = Some(opts.iter().map(|o| format!("--cuda_plugin.{o}")).collect());
            start(&c, svc)
        };
        let mut svc = custom_image(13040, Some(empty_share([5; 16])));
        let Start::Enabled(plan) = restore(&mut svc, &[]).unwrap() else {
            panic!()
        };
        assert_eq!(plan.custom, Some(CustomPlan { dump_id: [5; 16] }));
        assert!(plan
            .notes
            .iter()
            .any(|n| n.contains("custom storage: 1 file(s)")));
        assert_eq!(svc.consumed, 1);
        for (version, opts, file, why) in [
            (
                13040,
                &["custom-storage=off"][..],
                Some(empty_share([5; 16])),
                "custom-storage=off, but this image keeps 1 task(s)' GPU memory",
            ),
            (
                13030,
                &[][..],
                Some(empty_share([5; 16])),
                "needs CUDA 13.4",
            ),
            (
                13040,
                &["backend=cuda-checkpoint"][..],
                Some(empty_share([5; 16])),
                "the cuda-checkpoint backend",
            ),
            (13040, &[][..], None, "cuda-cs-7-0.img is missing"),
            (
                13040,
                &[][..],
                Some(empty_share([6; 16])),
                "cuda-cs-7-0.img",
            ),
            (
                13040,
                &[][..],
                Some(empty_share([5; 16])[..4096].to_vec()),
                "cuda-cs-7-0.img",
            ),
        ] {
            let mut svc = custom_image(version, file);
            let e = restore(&mut svc, opts).unwrap_err();
            assert!(
                matches!(e, PluginError::CustomStorage(_)) && e.to_string().contains(why),
                "{opts:?}: {e}"
            );
            assert_eq!(
                svc.consumed, 0,
                "a refused restore leaves the inventory entry"
            );
        }
        // A stale file names the dump ids.
        let mut svc = custom_image(13040, Some(empty_share([6; 16])));
        let e = restore(&mut svc, &[]).unwrap_err().to_string();
        assert!(e.contains(&"05".repeat(16)) || e.contains("stale"), "{e}");
        // An image without custom storage and custom-storage=on.
        let mut svc = Svc {
            driver_version: Some(13040),
            inventory: Some(InventoryAnswer::Listed { consumed: false }),
            ..Default::default()
        };
        let e = restore(&mut svc, &["custom-storage=on"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("dumped without custom storage"), "{e}");
    }

    #[test]
    fn parallel_is_off_for_the_driver_api_without_the_guardian() {
        let width = |opts: &[&str]| {
            let mut c = ctx(Stage::DUMP);
            c.host_options = Some(opts.iter().map(|o| format!("--cuda_plugin.{o}")).collect());
            let mut svc = Svc {
                driver_version: Some(13000),
                cli_ok: true,
                ..Default::default()
            };
            let Start::Enabled(plan) = start(&c, &mut svc).unwrap() else {
                panic!()
            };
            let noted = plan.notes.iter().any(|n| n.contains("guardian=off"));
            (plan.cfg.parallel, noted)
        };
        let driver = "backend=driver-api";
        let cli = "backend=cuda-checkpoint";
        assert_eq!(width(&[driver, "parallel=4"]), (4, false));
        assert_eq!(width(&[driver, "parallel=4", "guardian=off"]), (1, true));
        // The utility's runs are child processes: they overlap without the guardian.
        assert_eq!(width(&[cli, "parallel=4", "guardian=off"]), (4, false));
        assert_eq!(width(&[driver, "guardian=off"]), (1, false));
        // By default (auto): all at once, but one at a time for the driver API without the
        // guardian, without a note.
        assert_eq!(width(&[driver]), (16, false));
        assert_eq!(width(&[cli, "guardian=off"]), (16, false));
        assert_eq!(width(&[driver, "parallel=auto", "guardian=off"]), (1, true));
    }

    #[test]
    fn the_options_file_is_used_logged_and_its_errors_fail_init() {
        let mut c = ctx(Stage::DUMP);
        c.config = Ok(Some(crate::config::ConfigFile {
            path: "/usr/lib/criu/cuda_plugin.conf".into(),
            origin: crate::config::Origin::BesidePlugin,
            options: vec!["cuda_plugin.backend=cuda-checkpoint".into()],
        }));
        let mut svc = Svc {
            driver_version: Some(13000),
            cli_ok: true,
            ..Default::default()
        };
        let Start::Enabled(plan) = start(&c, &mut svc).unwrap() else {
            panic!()
        };
        assert_eq!(
            plan.options.backend,
            BackendChoice::Only(BackendKind::CudaCheckpoint)
        );
        assert!(
            plan.notes[0].starts_with(
                "options from /usr/lib/criu/cuda_plugin.conf: backend=cuda-checkpoint"
            ),
            "{:?}",
            plan.notes
        );
        c.config = Err(crate::config::ConfigError::Line {
            path: "/etc/criu/cuda_plugin.conf".into(),
            line: 3,
            error: crate::config::LineError::NotUtf8,
        });
        let e = start(&c, &mut svc).unwrap_err();
        assert_eq!(e.to_errno(), -libc::EINVAL);
        assert_eq!(
            e.to_string(),
            "options file /etc/criu/cuda_plugin.conf, line 3: not valid UTF-8"
        );
    }

    fn gpus(first: u8) -> Vec<GpuInfo> {
        (0..2)
            .map(|i| GpuInfo {
                ordinal: i,
                uuid: abi::GpuUuid([first + i as u8; 16]),
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_bytes: 80 << 30,
            })
            .collect()
    }

    fn listed(svc: Svc) -> Svc {
        Svc {
            inventory: Some(InventoryAnswer::Listed { consumed: false }),
            ..svc
        }
    }

    fn with_option(stage: Stage, option: &str) -> InitContext {
        let mut c = ctx(stage);
        c.env.plugin_options = Some(option.to_owned());
        c
    }

    #[test]
    fn a_device_map_on_dump_is_refused() {
        let mut svc = Svc {
            driver_version: Some(13000),
            ..Default::default()
        };
        let e = start(
            &with_option(Stage::DUMP, "cuda_plugin.device-map=0=1,1=0"),
            &mut svc,
        )
        .unwrap_err();
        assert_eq!(e.to_errno(), -libc::EINVAL);
        assert!(e.to_string().contains("restore option"), "{e}");
    }

    #[test]
    fn the_same_gpus_need_no_pairs_and_old_images_no_enumeration() {
        let inv = gpus(1);
        let mut svc = listed(Svc {
            driver_version: Some(13000),
            gpu_image: Some(crate::inventory::encode(&inv).unwrap()),
            gpus: vec![inv[1].clone(), inv[0].clone()]
                .into_iter()
                .enumerate()
                .map(|(i, mut g)| {
                    g.ordinal = i as u32;
                    g
                })
                .collect(),
            ..Default::default()
        });
        let Start::Enabled(plan) = start(&ctx(Stage::RESTORE), &mut svc).unwrap() else {
            panic!("enabled")
        };
        assert!(
            plan.cfg.pairs.is_empty(),
            "GPUs found by UUID in another order: identity, no pairs"
        );
        assert!(
            plan.notes.iter().any(|n| n.contains("no remapping")),
            "{:?}",
            plan.notes
        );
        // An image without inventory and no option: nothing is enumerated.
        let mut svc = listed(Svc {
            driver_version: Some(13000),
            ..Default::default()
        });
        let Start::Enabled(plan) = start(&ctx(Stage::RESTORE), &mut svc).unwrap() else {
            panic!("enabled")
        };
        assert!(plan.cfg.pairs.is_empty());
        assert_eq!(svc.enumerations, 0);
    }

    #[test]
    fn another_host_gets_pairs_and_a_cli_without_device_map_is_refused_before_restore() {
        let inv = gpus(1);
        let image = crate::inventory::encode(&inv).unwrap();
        let mut svc = listed(Svc {
            driver_version: Some(13000),
            gpu_image: Some(image.clone()),
            gpus: gpus(9),
            ..Default::default()
        });
        let Start::Enabled(plan) = start(
            &with_option(Stage::RESTORE, "cuda_plugin.device-map=0=1,1=0"),
            &mut svc,
        )
        .unwrap() else {
            panic!("enabled")
        };
        let cur = gpus(9);
        assert_eq!(
            plan.cfg.pairs,
            vec![(inv[0].uuid, cur[1].uuid), (inv[1].uuid, cur[0].uuid)]
        );
        let mut svc = listed(Svc {
            cli_ok: true,
            cli_without_map: true,
            gpu_image: Some(image),
            gpus: gpus(9),
            ..Default::default()
        });
        let e = start(&ctx(Stage::RESTORE), &mut svc).unwrap_err();
        assert!(e.to_string().contains("--device-map"), "{e}");
        assert_eq!(svc.consumed, 0, "nothing claimed, nothing touched");
    }

    #[test]
    fn a_bad_inventory_or_map_fails_init_with_the_reason() {
        let mut svc = listed(Svc {
            driver_version: Some(13000),
            gpu_image: Some(b"CUDAINV\n\x02\0\0\0".to_vec()),
            gpus: gpus(1),
            ..Default::default()
        });
        let e = start(&ctx(Stage::RESTORE), &mut svc).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
        let mut svc = listed(Svc {
            driver_version: Some(13000),
            gpu_image: Some(crate::inventory::encode(&gpus(1)).unwrap()),
            gpus: gpus(1)[..1].to_vec(),
            ..Default::default()
        });
        let e = start(&ctx(Stage::RESTORE), &mut svc).unwrap_err();
        assert!(
            e.to_string().contains("no counterpart"),
            "fewer GPUs here: {e}"
        );
        let mut svc = listed(Svc {
            driver_version: Some(13000),
            ..Default::default()
        });
        let e = start(
            &with_option(Stage::RESTORE, "cuda_plugin.device-map=0=1"),
            &mut svc,
        )
        .unwrap_err();
        assert!(e.to_string().contains("no GPU inventory"), "{e}");
    }
}
