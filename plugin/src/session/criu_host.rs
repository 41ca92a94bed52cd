//! The production [`crate::host::Host`]: CRIU's services (found with `dlsym`, in
//! [`crate::ffi::criu`]), the machine's (GPUs and NVML through the helper process or the session's
//! worker) and the backend probes, with the helper process started on first need.

use crate::agent::Access;
use crate::backend::cli::{probe_cli, CliProbe, ProcessRunner};
use crate::backend::driver::DriverProbe;
use crate::ffi::criu;
use crate::host::{Criu, FreezeAlarm, HostError, InventoryAnswer, Level};
use crate::machine::{GpuError, Machine};
use crate::session::Probes;
use crate::task::Pid;
use std::ffi::OsStr;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn log(level: Level, msg: &str) {
    crate::ffi::log::log(level.criu(), msg);
}

/// Whether the plugin's helper process may run, and whether it does.
#[derive(Debug)]
pub enum Helper {
    /// `guardian=off`, or not decided yet.
    Off,
    /// Allowed, started on first need (the first driver call, or the end of `init`).
    Allowed,
    Running,
    /// It could not start; driver calls run on threads in CRIU.
    Failed,
}

/// The production [`crate::host::Host`], for `init` and then the engine: CRIU's services found
/// with `dlsym` ([`Criu`], here), the machine's and the backend probes
/// ([`crate::machine::Machine`] and [`crate::session::Probes`], in [`crate::session::run`]). Driver
/// work (GPU enumeration, NVML) runs in the helper process when it runs, else on the session's
/// worker ([`crate::agent::Access`]).
#[derive(Debug)]
pub struct CriuHost {
    pub access: Access,
    pub helper: Helper,
}

impl Criu for CriuHost {
    fn log(&self, level: Level, msg: &str) {
        crate::ffi::log::log(level.criu(), msg);
    }

    fn add_inventory_entry(&mut self) -> Result<(), HostError> {
        criu::add_inventory_plugin()
    }

    fn inventory_query(&mut self) -> InventoryAnswer {
        criu::inventory_query()
    }

    fn inventory_consume(&mut self) -> Result<(), HostError> {
        criu::inventory_consume()
    }

    fn read_image(&mut self, name: &str, limit: usize) -> Result<Option<Vec<u8>>, HostError> {
        criu::read_image(name, limit)
    }

    fn open_image_file(&mut self, name: &str) -> Result<Option<File>, HostError> {
        criu::open_image_file(name)
    }

    fn write_task_image(&mut self, pid: Pid, data: &[u8]) -> Result<(), HostError> {
        criu::write_image(&crate::image::file_name(pid), data)
    }

    fn write_task_list(&mut self, data: &[u8]) -> Result<(), HostError> {
        criu::write_image(crate::image::LIST_FILE_NAME, data)
    }

    fn write_gpu_inventory(&mut self, data: &[u8]) -> Result<(), HostError> {
        criu::write_image(crate::inventory::FILE_NAME, data)
    }

    fn freeze_alarm(&self) -> FreezeAlarm {
        criu::freeze_alarm()
    }
}

impl CriuHost {
    /// Starts the helper if it may run and does not yet. CRIU is single-threaded here: nothing
    /// of the plugin's has run on a thread yet (every driver call so far went to the helper, or
    /// there was none).
    pub(super) fn ensure_helper(&mut self) {
        if !matches!(self.helper, Helper::Allowed) {
            return;
        }
        match crate::helper::spawn(criu::image_dir_fd()) {
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
