//! What the plugin needs from CRIU, as one trait for `init` and the lifecycle engine alike
//! ([`Criu`]: logging, the image inventory, the image files, the freeze alarm), and [`Host`],
//! CRIU's services together with the machine's ([`crate::machine::Machine`]: GPUs, memory, the
//! process tree). The real implementation ([`crate::ffi::criu::CriuHost`]) calls CRIU's
//! services found with `dlsym`; tests use recording fakes.

use crate::backend::Pid;
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

/// What the inventory says about `cuda_plugin` at restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InventoryAnswer {
    NotListed,
    /// Listed; `consumed` when the only available query also removed the entry (CRIU 4.1's
    /// destructive `check_and_remove_inventory_plugin`).
    Listed {
        consumed: bool,
    },
    /// The host has no inventory service; assume listed.
    Unknown(String),
}

/// A failed host service.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("CRIU does not export {0}")]
    Missing(&'static str),
    #[error("{service} failed")]
    Failed { service: &'static str },
    #[error("{service}(\"cuda_plugin\") found no entry")]
    NoEntry { service: &'static str },
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

/// CRIU's services, as `init` and the engine use them.
pub trait Criu: Send {
    /// Logs one line (the implementation adds the `cuda_plugin: ` prefix).
    fn log(&self, level: Level, msg: &str);
    /// `add_inventory_plugin("cuda_plugin")`. The engine calls it at most once per dump.
    fn add_inventory_entry(&mut self) -> Result<(), HostError>;
    /// Whether the dump's inventory lists `cuda_plugin` (restore's `init`).
    fn inventory_query(&mut self) -> InventoryAnswer;
    /// Removes the (exactly matching) inventory entry.
    fn inventory_consume(&mut self) -> Result<(), HostError>;
    /// The image file `name` of the dump, at most `limit` bytes (`None`: there is none).
    fn read_image(&mut self, name: &str, limit: usize) -> Result<Option<Vec<u8>>, HostError>;
    /// Writes the per-task image of `pid` (whole file, once).
    fn write_task_image(&mut self, pid: Pid, data: &[u8]) -> Result<(), HostError>;
    /// Writes the dump's task list (whole file, once per dump).
    fn write_task_list(&mut self, data: &[u8]) -> Result<(), HostError>;
    /// Writes the GPU inventory image (whole file, once per dump).
    fn write_gpu_inventory(&mut self, data: &[u8]) -> Result<(), HostError>;
    /// CRIU's freeze alarm now.
    fn freeze_alarm(&self) -> FreezeAlarm;
    /// Opens the image file `name` for reading in place, as a regular file (`None`: there is
    /// none). The custom-storage files are checked through it at restore's `init`. Hosts that
    /// cannot (tests' fakes) say so.
    fn open_image_file(&mut self, name: &str) -> Result<Option<std::fs::File>, HostError> {
        let _ = name;
        Err(HostError::Missing("an image directory to open files in"))
    }
    /// Reads the per-task image of `pid`; `None` when there is none.
    fn read_task_image(&mut self, pid: Pid) -> Result<Option<Vec<u8>>, HostError> {
        self.read_image(&crate::image::file_name(pid), crate::image::MAX_TASK_IMAGE)
    }
}

/// Everything the plugin asks of its host: CRIU's services and the machine's.
pub trait Host: Criu + crate::machine::Machine {}

impl<T: Criu + crate::machine::Machine + ?Sized> Host for T {}
