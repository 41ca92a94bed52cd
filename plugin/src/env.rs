//! Every environment variable the plugin reads, read in one place.
//!
//! | Variable | Effect |
//! |---|---|
//! | `CRIU_PLUGIN_OPTIONS` | Plugin options when CRIU cannot hand them over (see [`crate::options`]). |
//! | `CRIU_CUDA_PLUGIN_CONFIG=PATH` | The plugin's options file, instead of `cuda_plugin.conf` next to the plugin or in `/etc/criu/` (see [`crate::config`]). |
//! | `CRIU_CUDA_FORCE_ENABLE=1` | Run even without `/proc/driver/nvidia/gpus/` (hardware-free testing; CRIU's fault 138 does the same). |
//! | `CRIU_CUDA_PLUGIN_MAX_HOOKS=N` | Override the descriptor's `max_hooks` (1..=17) instead of reading the host's count. |
//! | `CRIU_CUDA_MEM_AVAILABLE_GIB=N` | The host memory the dump's capacity check takes as available, in GiB, instead of `MemAvailable` of `/proc/meminfo` (to test the check at sizes this host does not have, or to keep headroom). |
//! | `PATH` | Where `cuda-checkpoint` is looked up without `cuda-checkpoint=PATH`. |
//!
//! `LD_LIBRARY_PATH` is honoured implicitly: `libcuda.so.1` is opened with the normal loader search.

use std::ffi::OsString;

/// `CRIU_PLUGIN_OPTIONS`.
pub const OPTIONS: &str = crate::options::ENV_OPTIONS;
/// `CRIU_CUDA_PLUGIN_CONFIG`.
pub const CONFIG: &str = crate::config::ENV_CONFIG;
/// `CRIU_CUDA_FORCE_ENABLE`.
pub const FORCE_ENABLE: &str = criu_cuda_env::FORCE_ENABLE;
/// `CRIU_CUDA_PLUGIN_MAX_HOOKS`.
pub const MAX_HOOKS: &str = criu_cuda_env::PLUGIN_MAX_HOOKS;

/// `CRIU_CUDA_MEM_AVAILABLE_GIB`.
pub const MEM_AVAILABLE: &str = criu_cuda_env::MEM_AVAILABLE_GIB;

/// `CRIU_CUDA_MEM_AVAILABLE_GIB` in bytes, when set to a whole number of GiB.
#[must_use]
pub fn mem_available_override() -> Option<u64> {
    std::env::var(MEM_AVAILABLE)
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(1 << 30)
}

/// A snapshot of the variables above.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    pub plugin_options: Option<String>,
    /// `CRIU_CUDA_PLUGIN_CONFIG` (the options file's path).
    pub plugin_config: Option<OsString>,
    pub force_enable: bool,
    pub path: Option<OsString>,
}

impl Environment {
    /// Reads the process environment.
    #[must_use]
    pub fn from_process() -> Self {
        Environment {
            plugin_options: std::env::var(OPTIONS).ok(),
            plugin_config: std::env::var_os(CONFIG),
            force_enable: std::env::var(FORCE_ENABLE).is_ok_and(|v| v.trim() == "1"),
            path: std::env::var_os("PATH"),
        }
    }
}

/// `CRIU_CUDA_PLUGIN_MAX_HOOKS`, read by the load-time constructor.
#[must_use]
pub fn max_hooks_override() -> Option<String> {
    std::env::var(MAX_HOOKS).ok()
}
