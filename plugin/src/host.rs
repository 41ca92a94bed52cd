//! What the lifecycle engine needs from CRIU, as a trait: logging, the image inventory, and the
//! per-task image files. The real implementation ([`crate::ffi::criu::CriuHost`]) calls CRIU's
//! services found with `dlsym`; tests use a recording fake.

use crate::backend::Pid;
use crate::inventory::GpuInfo;
use std::fmt;

/// A log level (CRIU's `print_on_level` levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// CRIU records the first ERROR line as the operation's error; keep it for real failures.
    Error,
    Warn,
    Info,
    Debug,
}

impl Level {
    /// The numeric level `print_on_level` takes.
    #[must_use]
    pub const fn criu(self) -> u32 {
        use abi::criu::log_level;
        match self {
            Level::Error => log_level::ERROR,
            Level::Warn => log_level::WARN,
            Level::Info => log_level::INFO,
            Level::Debug => log_level::DEBUG,
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        })
    }
}

/// A failed host service.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("CRIU does not export {0}")]
    Missing(&'static str),
    #[error("{service} failed")]
    Failed { service: &'static str },
    #[error("{what} {name}: {source}")]
    Io {
        what: &'static str,
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("image {name} is {kind}, not a regular file")]
    NotRegular { name: String, kind: &'static str },
    #[error("image {name} is larger than the {limit} bytes such an image can hold")]
    TooLarge { name: String, limit: usize },
}

/// CRIU's freeze alarm (`alarm(--timeout)` around seizing the tree and PAUSE_DEVICES; when it
/// fires CRIU interrupts what it waits for, and five seconds later aborts without a rollback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezeAlarm {
    /// The host exports no `alarm_timeouted`: nothing is known.
    Unknown,
    /// No alarm is pending.
    Disarmed,
    /// It fires in `left`.
    Armed { left: std::time::Duration },
    /// It has fired (`alarm_timeouted()`).
    Expired,
}

/// CRIU's services, as the engine uses them.
pub trait Host: Send {
    /// Logs one line (the implementation adds the `cuda_plugin: ` prefix).
    fn log(&self, level: Level, msg: &str);
    /// `add_inventory_plugin("cuda_plugin")`. The engine calls it at most once per dump.
    fn add_inventory_entry(&mut self) -> Result<(), HostError>;
    /// Writes the per-task image of `pid` (whole file, once).
    fn write_task_image(&mut self, pid: Pid, data: &[u8]) -> Result<(), HostError>;
    /// Writes the dump's task list (whole file, once per dump).
    fn write_task_list(&mut self, data: &[u8]) -> Result<(), HostError>;
    /// Reads the per-task image of `pid`; `None` when there is none.
    fn read_task_image(&mut self, pid: Pid) -> Result<Option<Vec<u8>>, HostError>;
    /// CRIU's freeze alarm now.
    fn freeze_alarm(&self) -> FreezeAlarm;
    /// NVML's view of the GPUs' memory and its users, within `limit`.
    fn gpu_memory(
        &mut self,
        limit: Option<std::time::Duration>,
    ) -> Result<crate::nvml::Snapshot, crate::nvml::NvmlError>;
    /// The host's available memory (`MemAvailable`), bytes.
    fn memory_available(&self) -> Option<u64>;
    /// `root` and every process below it.
    fn tree(&self, root: Pid) -> Vec<Pid>;
    /// Writes the GPU inventory image (whole file, once per dump).
    fn write_gpu_inventory(&mut self, data: &[u8]) -> Result<(), HostError>;
    /// The GPUs of CRIU's view (see [`crate::inventory`] for the enumeration rule), within
    /// `limit` (`None`: no limit).
    fn current_gpus(&mut self, limit: Option<std::time::Duration>) -> Result<Vec<GpuInfo>, String>;
}
