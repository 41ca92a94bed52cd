//! What the plugin needs from CRIU, as one trait for `init` and the lifecycle engine alike
//! ([`Criu`]: logging, the image inventory, the image files, the freeze alarm), and [`Host`],
//! CRIU's services together with the machine's ([`crate::machine::Machine`]: GPUs, memory, the
//! process tree). The real implementation ([`crate::session::criu_host::CriuHost`]) calls CRIU's
//! services found with `dlsym`; tests use recording fakes.

pub use crate::ffi::criu::{FreezeAlarm, HostError, InventoryAnswer};
pub use crate::ffi::log::Level;
use crate::task::Pid;

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
