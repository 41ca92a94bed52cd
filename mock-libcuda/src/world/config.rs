//! The scripted part of a world: `world.toml`.
//!
//! ```toml
//! schema = 1
//! [driver]
//! branch = 580                 # r550 … r610; selects the cuda-checkpoint generation
//! version = "580.65.06"        # full driver version (help text); default "<branch>.00.00"
//! cuda_version = 13000         # what cuDriverGetVersion reports; default from the branch
//! hidden_symbols = ["cuCheckpointProcessLock"]   # absent from dlsym and cuGetProcAddress
//! request_timeout_ms = 10000   # a request to a target whose restore thread never answers
//!
//! [[gpu]]                      # ordinal = position in this list (nvidia-smi order)
//! uuid = "GPU-00000000-0000-0000-0000-000000000001"
//! name = "NVIDIA H100 80GB HBM3"
//! memory_mib = 81559
//! chip = "GH100"               # restore pairs must map GPUs of the same chip
//!
//! [[fault]]
//! function = "cuCheckpointProcessLock"  # or "cuInit", "cuda-checkpoint", ...
//! pid = 1234                   # optional: only calls that target this pid (any of its tids)
//! nth = 2                      # optional: the 2nd matching call (1-based); default 1
//! sticky = false               # true: every matching call from the nth on
//! action = { kind = "return", code = "CUDA_ERROR_NOT_READY" }
//! ```

use abi::{CUresult, GpuUuid};
use serde::{Deserialize, Serialize};

/// Current `schema` of `world.toml`.
pub const CONFIG_SCHEMA: u32 = 1;

/// The scripted world.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorldConfig {
    pub schema: u32,
    /// Also trace the data path (allocations, copies, memsets, context calls). Off by default:
    /// a workload's periodic checks would make traces timing-dependent.
    #[serde(default)]
    pub trace_data_path: bool,
    pub driver: DriverConfig,
    #[serde(default, rename = "gpu")]
    pub gpus: Vec<GpuConfig>,
    #[serde(default, rename = "fault")]
    pub faults: Vec<FaultSpec>,
}

/// The driver the world impersonates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriverConfig {
    /// Driver branch (550, 555, 560, 565, 570, 575, 580, 590, 595, 610, 615).
    pub branch: u32,
    /// Full driver version string, e.g. `580.65.06`.
    #[serde(default)]
    pub version: Option<String>,
    /// `cuDriverGetVersion` value; defaults to the branch's CUDA version.
    #[serde(default)]
    pub cuda_version: Option<i32>,
    /// Exported symbols the world pretends not to have (dlsym and cuGetProcAddress).
    #[serde(default)]
    pub hidden_symbols: Vec<String>,
    /// How long a caller waits for a target's restore thread before giving up.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

fn default_request_timeout_ms() -> u64 {
    10_000
}

/// One GPU of the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    pub uuid: GpuUuidText,
    pub name: String,
    pub memory_mib: u64,
    /// Chip family; restore only maps GPUs of the same chip.
    pub chip: String,
}

impl GpuConfig {
    /// Memory capacity in bytes.
    #[must_use]
    pub fn capacity_bytes(&self) -> u64 {
        self.memory_mib * 1024 * 1024
    }
}

/// A GPU UUID that (de)serialises as its strict text form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuUuidText(pub GpuUuid);

impl Serialize for GpuUuidText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for GpuUuidText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        GpuUuid::parse(&s)
            .map(GpuUuidText)
            .map_err(serde::de::Error::custom)
    }
}

/// A scripted fault.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// Exported function name (`cuCheckpointProcessLock`, `cuInit`, …) or `cuda-checkpoint`
    /// (one invocation of the command line, any operation) or `cuda-checkpoint:<op>` with
    /// `<op>` one of `lock`, `checkpoint`, `restore`, `unlock`, `get-state`, `get-restore-tid`,
    /// `toggle`, `help`.
    pub function: String,
    /// Only calls that target this process (any of its thread ids names it).
    #[serde(default)]
    pub pid: Option<i32>,
    /// The matching call (1-based) at which the fault fires.
    #[serde(default = "one")]
    pub nth: u32,
    /// Fire on every matching call from `nth` on, instead of once.
    #[serde(default)]
    pub sticky: bool,
    pub action: FaultAction,
}

fn one() -> u32 {
    1
}

/// What a fault does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum FaultAction {
    /// Return `code` without doing anything.
    Return { code: CodeText },
    /// Carry the operation out (its state change happens), then return `code`.
    ErrorAfter { code: CodeText },
    /// Put the target into CU_PROCESS_STATE_FAILED, then return `code`.
    Fail { code: CodeText },
    /// Sleep, then carry on normally.
    Delay { ms: u64 },
    /// Block until `file` exists (relative to the world directory), then carry on; without
    /// `file`, block until the caller is killed.
    Hang {
        #[serde(default)]
        file: Option<String>,
    },
    /// Kill the calling process with `signal` (default SIGSEGV) before doing anything.
    Crash {
        #[serde(default)]
        signal: Option<String>,
    },
    /// SIGKILL the target process, then carry the call on (it fails as for a dead target).
    KillTarget,
    /// Another tool locks the target first (as `cuda-checkpoint --action lock` run by an
    /// operator would, through its restore thread), then the call goes on: a lock then fails
    /// with `CUDA_ERROR_ILLEGAL_STATE`, the target is LOCKED by someone else.
    ForeignLock,
    /// `cuda-checkpoint` only: print `text` and exit with `status` without doing anything.
    Garbage { text: String, status: i32 },
}

/// A `CUresult` written by name (`CUDA_ERROR_NOT_READY`) or number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeText(pub CUresult);

impl Serialize for CodeText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.name() {
            Some(n) => s.serialize_str(n),
            None => s.serialize_u32(self.0 .0),
        }
    }
}

impl<'de> Deserialize<'de> for CodeText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u32),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(CodeText(CUresult(n))),
            Raw::S(s) => CUresult::from_name(&s)
                .map(CodeText)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown CUresult {s:?}"))),
        }
    }
}

/// A driver generation of the `cuda-checkpoint` command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CliGeneration {
    /// r550: `--toggle` only.
    R550,
    /// r555 … r575: `--get-state`, `--action`, `--get-restore-tid`, `--timeout`.
    R555,
    /// r580 … r585: adds `--device-map|-d`.
    R580,
    /// r590+: adds `--launch-job|-j` to the help text.
    R590,
}

/// The CUDA versions evidenced for each branch (cuDriverGetVersion).
#[must_use]
pub fn default_cuda_version(branch: u32) -> i32 {
    match branch {
        0..=550 => 12040,
        551..=555 => 12050,
        556..=560 => 12060,
        561..=565 => 12070,
        566..=570 => 12080,
        571..=575 => 12090,
        576..=580 => 13000,
        581..=590 => 13010,
        591..=595 => 13020,
        596..=610 => 13030,
        _ => 13040,
    }
}

impl DriverConfig {
    /// `cuDriverGetVersion`'s value.
    #[must_use]
    pub fn cuda_version(&self) -> i32 {
        self.cuda_version
            .unwrap_or_else(|| default_cuda_version(self.branch))
    }

    /// The full driver version string.
    #[must_use]
    pub fn version_string(&self) -> String {
        self.version
            .clone()
            .unwrap_or_else(|| format!("{}.00.00", self.branch))
    }

    /// The command-line generation the driver serves.
    #[must_use]
    pub fn cli_generation(&self) -> CliGeneration {
        match self.branch {
            0..=554 => CliGeneration::R550,
            555..=579 => CliGeneration::R555,
            580..=589 => CliGeneration::R580,
            _ => CliGeneration::R590,
        }
    }

    /// True when `symbol` is exported by this driver: the checkpoint entry points exist from
    /// r570 (CUDA 12.8) on, and the world can hide any symbol.
    #[must_use]
    pub fn exports(&self, symbol: &str) -> bool {
        if self.hidden_symbols.iter().any(|h| h == symbol) {
            return false;
        }
        if symbol.starts_with("cuCheckpoint") {
            return self.branch >= 570
                && self.cuda_version() >= abi::cuda::CHECKPOINT_API_MIN_DRIVER_VERSION;
        }
        true
    }
}

impl WorldConfig {
    /// Parses `world.toml` text; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<WorldConfig, crate::world::WorldError> {
        let cfg: WorldConfig =
            toml::from_str(text).map_err(|e| crate::world::WorldError::Config {
                path: origin.to_owned(),
                reason: e.to_string(),
            })?;
        cfg.validate(origin)?;
        Ok(cfg)
    }

    fn validate(&self, origin: &str) -> Result<(), crate::world::WorldError> {
        let bad = |reason: String| crate::world::WorldError::Config {
            path: origin.to_owned(),
            reason,
        };
        if self.schema != CONFIG_SCHEMA {
            return Err(bad(format!(
                "schema {} is not supported (this mock reads schema {CONFIG_SCHEMA})",
                self.schema
            )));
        }
        for (i, g) in self.gpus.iter().enumerate() {
            if let Some(j) = self.gpus[..i].iter().position(|o| o.uuid == g.uuid) {
                return Err(bad(format!(
                    "gpu {i} repeats the UUID of gpu {j} ({})",
                    g.uuid.0
                )));
            }
        }
        for (i, f) in self.faults.iter().enumerate() {
            if f.nth == 0 {
                return Err(bad(format!(
                    "fault {i} ({}): nth is 1-based, 0 never fires",
                    f.function
                )));
            }
            let targeted = f.function.starts_with("cuCheckpointProcess")
                || f.function.starts_with("cuda-checkpoint");
            if f.pid.is_some() && !targeted {
                return Err(bad(format!(
                    "fault {i} ({}): pid only applies to calls that target a process (cuCheckpointProcess*, cuda-checkpoint)",
                    f.function
                )));
            }
            if matches!(f.action, FaultAction::Garbage { .. })
                && !f.function.starts_with("cuda-checkpoint")
            {
                return Err(bad(format!(
                    "fault {i} ({}): kind \"garbage\" only applies to cuda-checkpoint",
                    f.function
                )));
            }
        }
        Ok(())
    }

    /// The host GPU with this UUID.
    #[must_use]
    pub fn gpu(&self, uuid: GpuUuid) -> Option<&GpuConfig> {
        self.gpus.iter().find(|g| g.uuid.0 == uuid)
    }

    /// Serialises back to TOML.
    #[must_use]
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a WorldConfig always serialises")
    }
}
