//! The plugin's top-level error, and its one translation into a C return value.

use crate::backend::BackendError;
use crate::config::ConfigError;
use crate::engine::EngineError;
use crate::gpu_map::MapError;
use crate::host::HostError;
use crate::image::ImageError;
use crate::inventory::InventoryError;
use crate::options::OptionError;
use crate::select::SelectError;
use crate::thread::ThreadError;

/// Everything that can make an entry point fail.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error(transparent)]
    Option(#[from] OptionError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    DeviceMap(#[from] MapError),
    #[error(transparent)]
    GpuInventory(#[from] InventoryError),
    #[error("cuda_plugin.device-map is a restore option; it was given to a {0}")]
    MapOnDump(&'static str),
    #[error("cannot enumerate the GPUs of this host to map the checkpointed ones: {0}")]
    Gpus(crate::machine::GpuError),
    #[error(transparent)]
    Select(#[from] SelectError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("the image needs cuda_plugin but {0}")]
    RestoreImpossible(String),
    #[error("cannot claim cuda_plugin in the image inventory: {0}")]
    Inventory(HostError),
    #[error("restore: {0}")]
    ImageRead(HostError),
    #[error("restore: image {name}: {cause}")]
    TaskImage { name: String, cause: ImageError },
    #[error(
        "restore: the dump's task list ({}) names pid {pid}, but its image {} is missing",
        crate::image::LIST_FILE_NAME,
        crate::image::file_name(*pid)
    )]
    TaskImageMissing { pid: crate::backend::Pid },
    #[error(
        "restore: GPU {gpu} has {} free (NVML) but the checkpointed tasks mapped onto it need {}{}: \
         the driver would fail their restore with CUDA_ERROR_OUT_OF_MEMORY; refusing before any \
         task is restored (free that GPU, map the tasks onto others with cuda_plugin.device-map, \
         or cuda_plugin.check-capacity=off overrides)",
        crate::nvml::gib(*free),
        crate::nvml::gib(*need),
        if *others > 0 { format!(" ({others} more GPU(s) short as well)") } else { String::new() }
    )]
    GpuTooSmall {
        gpu: abi::GpuUuid,
        need: u64,
        free: u64,
        others: usize,
    },
    /// `custom-storage=` cannot be honoured (or an image made with custom storage cannot be
    /// restored here); refused at `init`, before any task is touched.
    #[error("custom storage: {0}")]
    CustomStorage(String),
}

fn backend_errno(e: &BackendError) -> i32 {
    match e {
        BackendError::Timeout { .. } | BackendError::OutputHeld { .. } => libc::ETIMEDOUT,
        BackendError::Busy { .. } => libc::EBUSY,
        BackendError::Spawn { .. } => libc::ENOEXEC,
        BackendError::Untrusted { .. } => libc::EPERM,
        BackendError::HelperLost { .. } => libc::EPIPE,
        BackendError::Cuda { .. }
        | BackendError::Exit { .. }
        | BackendError::BadOutput { .. }
        | BackendError::CustomStorage { .. }
        | BackendError::Unsupported { .. } => libc::EIO,
    }
}

fn thread_errno(e: &ThreadError) -> i32 {
    match e {
        ThreadError::Ptrace { errno, .. } if *errno > 0 => *errno,
        ThreadError::Ptrace { .. } => libc::EIO,
        ThreadError::StopTimeout { .. } | ThreadError::KillTimeout { .. } => libc::ETIMEDOUT,
        ThreadError::Gone { .. } => libc::ESRCH,
        ThreadError::SeccompSuspend { .. } => libc::EPERM,
        ThreadError::StopsAtOnce { .. } => libc::EIO,
    }
}

impl PluginError {
    /// The negative errno an entry point returns for this error. Never `-ENOTSUP`, which CRIU
    /// reads as "not mine" rather than as a failure.
    #[must_use]
    pub fn to_errno(&self) -> i32 {
        let e = match self {
            PluginError::Option(_)
            | PluginError::Config(_)
            | PluginError::DeviceMap(_)
            | PluginError::GpuInventory(_)
            | PluginError::MapOnDump(_) => libc::EINVAL,
            PluginError::Gpus(_) => libc::ENODEV,
            PluginError::Select(_) | PluginError::RestoreImpossible(_) => libc::ENODEV,
            PluginError::Inventory(_) => libc::EIO,
            PluginError::ImageRead(_)
            | PluginError::TaskImage { .. }
            | PluginError::TaskImageMissing { .. } => libc::EINVAL,
            PluginError::GpuTooSmall { .. } => libc::ENOMEM,
            PluginError::CustomStorage(_) => libc::ENOTSUP,
            PluginError::Engine(e) => match e {
                EngineError::Backend { cause, .. } => backend_errno(cause),
                EngineError::Thread { cause, .. } => thread_errno(cause),
                EngineError::BadState { .. } | EngineError::NoRestoreThread { .. } => libc::EIO,
                EngineError::FreezeTimeout { .. } => libc::ETIMEDOUT,
                EngineError::LockTimeout { cause, .. } => backend_errno(cause),
                EngineError::ForeignLock { .. } => libc::EBUSY,
                EngineError::Stopped { .. } => libc::EAGAIN,
                EngineError::HostTooSmall { .. } => libc::ENOMEM,
                EngineError::MigGpu { .. } => libc::ENODEV,
                EngineError::Inventory { .. }
                | EngineError::GpuInventory { .. }
                | EngineError::ImageIo { .. }
                | EngineError::ImageFormat { .. }
                | EngineError::RollbackIncomplete { .. } => libc::EIO,
            },
        };
        let e = if e == libc::ENOTSUP { libc::EIO } else { e };
        -e
    }
}

impl crate::message::Caused for PluginError {
    fn caused_by(&self) -> Option<&dyn std::fmt::Display> {
        match self {
            Self::Engine(e) => e.caused_by(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendKind, Op};
    use crate::engine::Step;
    use std::time::Duration;

    #[test]
    fn errno_mapping_is_negative_and_never_enotsup() {
        let t = PluginError::Engine(EngineError::Backend {
            step: Step::Pause,
            pid: 1,
            cause: BackendError::Timeout {
                backend: BackendKind::CudaCheckpoint,
                op: Op::Lock,
                pid: 1,
                after: Duration::from_secs(1),
            },
        });
        assert_eq!(t.to_errno(), -libc::ETIMEDOUT);
        // The cause is the error's source, and its message names the pid: once.
        assert_eq!(t.to_string(), "PAUSE_DEVICES");
        assert_eq!(
            crate::message::Report(&t).to_string(),
            "PAUSE_DEVICES: failed to lock pid 1 via cuda-checkpoint: timed out after 1s"
        );
        let p = PluginError::Engine(EngineError::Thread {
            step: Step::Checkpoint,
            pid: 1,
            cause: ThreadError::Ptrace {
                step: "x",
                tid: 2,
                errno: libc::ENOTSUP,
            },
        });
        assert_eq!(
            p.to_errno(),
            -libc::EIO,
            "-ENOTSUP would read as 'not mine'"
        );
        let o = PluginError::Option(OptionError::Unknown { name: "x".into() });
        assert_eq!(o.to_errno(), -libc::EINVAL);
    }

    /// Every error of the engine, with each kind of cause it keeps.
    fn engine_errors() -> Vec<EngineError> {
        let backend = || BackendError::Timeout {
            backend: BackendKind::DriverApi,
            op: Op::Checkpoint,
            pid: 4242,
            after: Duration::from_secs(3),
        };
        let host = || HostError::Failed {
            service: "open_image",
        };
        vec![
            EngineError::Backend {
                step: Step::Checkpoint,
                pid: 4242,
                cause: backend(),
            },
            EngineError::Thread {
                step: Step::Resume,
                pid: 4242,
                cause: ThreadError::Ptrace {
                    step: "seize",
                    tid: 8,
                    errno: libc::EPERM,
                },
            },
            EngineError::Inventory {
                pid: 4242,
                cause: host(),
            },
            EngineError::ImageIo {
                step: Step::Checkpoint,
                pid: 4242,
                cause: host(),
            },
            EngineError::GpuInventory {
                pid: 4242,
                cause: InventoryError::Version { found: 9 },
            },
            EngineError::ImageFormat {
                pid: 4242,
                cause: ImageError::NotText,
            },
            EngineError::ForeignLock {
                pid: 4242,
                state: "locked".into(),
                cause: backend(),
            },
            EngineError::FreezeTimeout {
                pid: 4242,
                criu_timeout: Some(10),
                left: Some(Duration::from_millis(900)),
                cause: Some(backend()),
                narrow: None,
            },
            EngineError::FreezeTimeout {
                pid: 4242,
                criu_timeout: Some(10),
                left: Some(Duration::from_millis(900)),
                cause: Some(backend()),
                narrow: Some(1),
            },
            EngineError::LockTimeout {
                pid: 4242,
                cause: backend(),
                width: 4,
            },
            EngineError::FreezeTimeout {
                pid: 4242,
                criu_timeout: None,
                left: None,
                cause: None,
                narrow: None,
            },
            EngineError::NoRestoreThread { pid: 4242 },
            EngineError::RollbackIncomplete { pids: vec![4242] },
        ]
    }

    /// `Report` (what the log shows) and `source()` (what a Rust caller walks) tell one story:
    /// the cause `Report` appends is exactly the error's source, and no message says it twice.
    #[test]
    fn report_follows_the_source_chain() {
        use crate::message::{Caused, Report};
        use std::error::Error;
        for e in engine_errors() {
            let by_source = e.source().map(ToString::to_string);
            let by_cause = e.caused_by().map(ToString::to_string);
            assert_eq!(by_source, by_cause, "{e:?}");
            let r = Report(&e).to_string();
            match &by_source {
                Some(c) => assert_eq!(r, format!("{e}: {c}")),
                None => assert_eq!(r, e.to_string()),
            }
            // (An image's file name carries the pid too; that names the file, not the task.)
            let named = r.matches("pid 4242").count() + r.matches("pids [4242]").count();
            assert_eq!(named, 1, "the pid once in {r:?}");
            let p = PluginError::from(e);
            assert_eq!(
                Report(&p).to_string(),
                r,
                "PluginError::Engine reads the same"
            );
        }
    }
}
