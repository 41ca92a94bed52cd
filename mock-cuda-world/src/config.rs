//! The scripted part of a world: `world.toml`.
//!
//! ```toml
//! schema = 1
//! [driver]
//! branch = 580                 # r550 … r610; selects the cuda-checkpoint generation
//! version = "580.65.06"        # full driver version (help text); default "<branch>.00.00"
//! cuda_version = 13000         # what cuDriverGetVersion reports; default from the branch
//! hidden_symbols = ["cuCheckpointProcessLock"]   # absent from dlsym and cuGetProcAddress
//! request_timeout_ms = 10000   # a request to a target whose restore thread makes no progress
//! internal_threads = 0         # idle driver threads cuInit (and the first context) start
//!
//! [rates]                      # the time model of checkpoint and restore (GB/s = 1e9 B/s)
//! driver_gbps = 6.0            # the driver's copy path, per process
//! link_gbps = 50.0             # each GPU's host link, shared by its concurrent transfers
//! host_gbps = 200.0            # the host-wide ceiling, shared by every transfer
//! time_scale = 1.0             # every modelled duration is divided by this
//!
//! [host]
//! memory_gib = 512             # optional: host memory for staged checkpoints (absent: unlimited)
//!
//! [memory]
//! real_mib = 64                # allocations up to this size are stored whole
//! sample_kib = 64              # the bytes a larger (virtual) allocation stores at most
//!
//! [nvml]
//! present = true               # false: the world has no libnvidia-ml.so.1
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
//!
//! Every table but `[driver]` is optional; every key of `[rates]`, `[host]`, `[memory]` and
//! `[nvml]` has a default (above). Unknown keys are errors that name the key, and values
//! outside their range are errors that name the key and the value.

use abi::nvml::NvmlReturn;
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
    /// The time model of checkpoint and restore.
    #[serde(default)]
    pub rates: RatesConfig,
    /// The host (its memory for staged checkpoints).
    #[serde(default)]
    pub host: HostConfig,
    /// Which allocations are stored whole, and how much of the others.
    #[serde(default)]
    pub memory: MemoryConfig,
    /// The NVML stand-in.
    #[serde(default)]
    pub nvml: NvmlConfig,
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
    /// Idle threads (`cuda-EvtHandlr`) that `cuInit` and the first context start in the
    /// calling process, as a real driver may: they make a CRIU that loaded the driver
    /// multi-threaded (at most [`MAX_INTERNAL_THREADS`]).
    #[serde(default)]
    pub internal_threads: u32,
}

/// Upper bound of `driver.internal_threads`.
pub const MAX_INTERNAL_THREADS: u32 = 64;

fn default_request_timeout_ms() -> u64 {
    10_000
}

/// The time model: how fast checkpoint and restore move device memory (see
/// [`crate::rates`]). Rates are in GB/s (10^9 bytes per second).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatesConfig {
    /// The driver's own copy path, per process (shared by the process's GPUs).
    #[serde(default = "default_driver_gbps")]
    pub driver_gbps: f64,
    /// Each GPU's link to the host, shared by the transfers on that GPU (PCIe Gen5 x16).
    #[serde(default = "default_link_gbps")]
    pub link_gbps: f64,
    /// The host-wide ceiling, shared by every transfer.
    #[serde(default = "default_host_gbps")]
    pub host_gbps: f64,
    /// Divides every modelled duration (100: a 14 s checkpoint takes 140 ms).
    #[serde(default = "default_time_scale")]
    pub time_scale: f64,
}

/// Driver copy path: the 5–8 GB/s observed for `cuda-checkpoint` (landscape.md, 4.2).
pub const DEFAULT_DRIVER_GBPS: f64 = 6.0;
/// A PCIe Gen5 x16 link as measured host-to-device (~50–56 GB/s; landscape.md, 4.1).
pub const DEFAULT_LINK_GBPS: f64 = 50.0;
/// An assumed host memory ceiling for DMA (no reference figure): four Gen5 links at line rate.
pub const DEFAULT_HOST_GBPS: f64 = 200.0;

fn default_driver_gbps() -> f64 {
    DEFAULT_DRIVER_GBPS
}
fn default_link_gbps() -> f64 {
    DEFAULT_LINK_GBPS
}
fn default_host_gbps() -> f64 {
    DEFAULT_HOST_GBPS
}
fn default_time_scale() -> f64 {
    1.0
}

impl Default for RatesConfig {
    fn default() -> Self {
        RatesConfig {
            driver_gbps: DEFAULT_DRIVER_GBPS,
            link_gbps: DEFAULT_LINK_GBPS,
            host_gbps: DEFAULT_HOST_GBPS,
            time_scale: 1.0,
        }
    }
}

/// The host.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// Host memory (GiB) that staged checkpoints may fill; absent: unlimited. A checkpoint
    /// whose staged bytes do not fit is OOM-killed.
    #[serde(default)]
    pub memory_gib: Option<f64>,
}

impl HostConfig {
    /// The host memory in bytes, `None` when unlimited.
    #[must_use]
    pub fn memory_bytes(&self) -> Option<u64> {
        self.memory_gib.map(|g| (g * GIB as f64) as u64)
    }
}

/// One GiB.
pub const GIB: u64 = 1 << 30;

/// Which allocations are real (stored whole) and what a virtual one stores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// Allocations up to this many MiB are stored whole; larger ones are virtual: accounted at
    /// their size, with at most `sample_kib` of real bytes.
    #[serde(default = "default_real_mib")]
    pub real_mib: u64,
    /// The most bytes (KiB) a virtual allocation stores (what its workload wrote, by offset).
    #[serde(default = "default_sample_kib")]
    pub sample_kib: u64,
}

fn default_real_mib() -> u64 {
    64
}
fn default_sample_kib() -> u64 {
    64
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            real_mib: default_real_mib(),
            sample_kib: default_sample_kib(),
        }
    }
}

impl MemoryConfig {
    /// Largest allocation stored whole, bytes.
    #[must_use]
    pub fn real_limit(&self) -> u64 {
        self.real_mib << 20
    }

    /// Most bytes a virtual allocation stores.
    #[must_use]
    pub fn sample_limit(&self) -> u64 {
        self.sample_kib << 10
    }
}

/// Upper bound of `memory.real_mib` (an allocation moved whole into the target's memory).
pub const MAX_REAL_MIB: u64 = 4096;
/// Upper bound of `memory.sample_kib`.
pub const MAX_SAMPLE_KIB: u64 = 16 * 1024;

/// The NVML stand-in (`libnvidia-ml.so.1`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvmlConfig {
    /// Whether the world has the library (`mock-world init` installs it next to `libcuda.so.1`).
    #[serde(default = "yes")]
    pub present: bool,
}

fn yes() -> bool {
    true
}

impl Default for NvmlConfig {
    fn default() -> Self {
        NvmlConfig { present: true }
    }
}

/// The NVML functions the stand-in exports (what an `nvml*` fault may name).
pub const NVML_FUNCTIONS: &[&str] = &[
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetMigMode",
];

/// One GPU of the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    pub uuid: GpuUuidText,
    pub name: String,
    pub memory_mib: u64,
    /// Chip family; restore only maps GPUs of the same chip.
    pub chip: String,
    /// Persistence mode, as `nvmlDeviceGetPersistenceMode` reports it (default on).
    #[serde(default = "yes")]
    pub persistence: bool,
    /// MIG mode, as `nvmlDeviceGetMigMode` reports it (default off). The mock driver cannot
    /// checkpoint a process with a context on such a GPU: its checkpoint returns
    /// `CUDA_ERROR_OUT_OF_MEMORY` (as NVIDIA's cuda-checkpoint issue #42 reports), the process
    /// staying LOCKED.
    #[serde(default)]
    pub mig: bool,
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

/// The code of a fault: a `CUresult` for the driver and the utility, an `nvmlReturn_t` for the
/// NVML stand-in, written by name (`CUDA_ERROR_NOT_READY`, `NVML_ERROR_TIMEOUT`) or number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeText {
    /// A `CUDA_*` name.
    Cuda(CUresult),
    /// An `NVML_*` name.
    Nvml(NvmlReturn),
    /// A number (meaning whatever the faulted function returns).
    Number(u32),
}

impl CodeText {
    /// The code as the driver returns it.
    #[must_use]
    pub fn cuda(self) -> CUresult {
        CUresult(self.value())
    }

    /// The code as NVML returns it.
    #[must_use]
    pub fn nvml(self) -> NvmlReturn {
        NvmlReturn(self.value())
    }

    fn value(self) -> u32 {
        match self {
            CodeText::Cuda(c) => c.0,
            CodeText::Nvml(n) => n.0,
            CodeText::Number(n) => n,
        }
    }
}

impl Serialize for CodeText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let name = match self {
            CodeText::Cuda(c) => c.name(),
            CodeText::Nvml(n) => n.name(),
            CodeText::Number(_) => None,
        };
        match name {
            Some(n) => s.serialize_str(n),
            None => s.serialize_u32(self.value()),
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
            Raw::N(n) => Ok(CodeText::Number(n)),
            Raw::S(s) => {
                if let Ok(n) = s.trim().parse::<u32>() {
                    return Ok(CodeText::Number(n));
                }
                if let Some(c) = CUresult::from_name(&s) {
                    return Ok(CodeText::Cuda(c));
                }
                NvmlReturn::from_name(&s)
                    .map(CodeText::Nvml)
                    .ok_or_else(|| {
                        serde::de::Error::custom(format!(
                            "unknown code {s:?} (a CUresult or nvmlReturn_t name, or a number)"
                        ))
                    })
            }
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

/// Checks a fault on an NVML function: a function the stand-in exports, an `nvmlReturn_t`
/// code, no target process, and an action NVML calls can take.
fn validate_nvml_fault(i: usize, f: &FaultSpec) -> Result<(), String> {
    let name = &f.function;
    if !NVML_FUNCTIONS.contains(&name.as_str()) {
        return Err(format!(
            "fault {i} ({name}): not an NVML function of the stand-in ({})",
            NVML_FUNCTIONS.join(", ")
        ));
    }
    if name == "nvmlErrorString" {
        return Err(format!(
            "fault {i} ({name}): it returns a string, not a code, and cannot fail"
        ));
    }
    if f.nth == 0 {
        return Err(format!("fault {i} ({name}): nth is 1-based, 0 never fires"));
    }
    if f.pid.is_some() {
        return Err(format!(
            "fault {i} ({name}): pid only applies to calls that target a process (cuCheckpointProcess*, cuda-checkpoint)"
        ));
    }
    match &f.action {
        FaultAction::Return { code } | FaultAction::ErrorAfter { code } => match code {
            CodeText::Cuda(c) => Err(format!(
                "fault {i} ({name}): {c} is a CUresult; NVML functions return nvmlReturn_t codes (NVML_ERROR_…)"
            )),
            _ => Ok(()),
        },
        FaultAction::Delay { .. } | FaultAction::Hang { .. } | FaultAction::Crash { .. } => Ok(()),
        FaultAction::Fail { .. }
        | FaultAction::KillTarget
        | FaultAction::ForeignLock
        | FaultAction::Garbage { .. } => {
            Err(format!(
                "fault {i} ({name}): NVML calls take return, error-after, delay, hang or crash faults"
            ))
        }
    }
}

impl WorldConfig {
    /// Parses `world.toml` text; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<WorldConfig, crate::WorldError> {
        let cfg: WorldConfig = toml::from_str(text).map_err(|e| crate::WorldError::Config {
            path: origin.to_owned(),
            reason: e.to_string(),
        })?;
        cfg.validate(origin)?;
        Ok(cfg)
    }

    fn validate(&self, origin: &str) -> Result<(), crate::WorldError> {
        let bad = |reason: String| crate::WorldError::Config {
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
        let positive = |key: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(bad(format!("{key} = {v}: must be a positive number")))
            }
        };
        if self.driver.internal_threads > MAX_INTERNAL_THREADS {
            return Err(bad(format!(
                "driver.internal_threads = {}: at most {MAX_INTERNAL_THREADS}",
                self.driver.internal_threads
            )));
        }
        positive("rates.driver_gbps", self.rates.driver_gbps)?;
        positive("rates.link_gbps", self.rates.link_gbps)?;
        positive("rates.host_gbps", self.rates.host_gbps)?;
        positive("rates.time_scale", self.rates.time_scale)?;
        if let Some(g) = self.host.memory_gib {
            positive("host.memory_gib", g)?;
        }
        if self.memory.real_mib > MAX_REAL_MIB {
            return Err(bad(format!(
                "memory.real_mib = {}: at most {MAX_REAL_MIB} (larger allocations are virtual)",
                self.memory.real_mib
            )));
        }
        if self.memory.sample_kib == 0 || self.memory.sample_kib > MAX_SAMPLE_KIB {
            return Err(bad(format!(
                "memory.sample_kib = {}: must be 1 … {MAX_SAMPLE_KIB}",
                self.memory.sample_kib
            )));
        }
        for (i, f) in self.faults.iter().enumerate() {
            if f.function.starts_with("nvml") {
                validate_nvml_fault(i, f).map_err(bad)?;
                continue;
            }
            if let FaultAction::Return { code }
            | FaultAction::ErrorAfter { code }
            | FaultAction::Fail { code } = &f.action
            {
                if let CodeText::Nvml(n) = code {
                    return Err(bad(format!(
                        "fault {i} ({}): {n} is an nvmlReturn_t code; {} returns a CUresult",
                        f.function, f.function
                    )));
                }
            }
            if f.nth == 0 {
                return Err(bad(format!(
                    "fault {i} ({}): nth is 1-based, 0 never fires",
                    f.function
                )));
            }
            // A custom-storage copy is made for the task whose memory its range maps.
            let targeted = f.function.starts_with("cuCheckpointProcess")
                || f.function.starts_with("cuda-checkpoint")
                || f.function.starts_with("cuMemcpyDtoHAsync")
                || f.function.starts_with("cuMemcpyHtoDAsync");
            if f.pid.is_some() && !targeted {
                return Err(bad(format!(
                    "fault {i} ({}): pid only applies to calls that target a process (cuCheckpointProcess*, cuda-checkpoint, and a custom-storage copy's cuMemcpy*Async)",
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BASE: &str = "schema = 1\n[driver]\nbranch = 580\n";

    fn parse(extra: &str) -> Result<WorldConfig, String> {
        WorldConfig::parse(&format!("{BASE}{extra}"), "w.toml").map_err(|e| e.to_string())
    }

    #[test]
    fn new_tables_default_to_the_reference_figures() {
        let c = parse("").unwrap();
        assert_eq!(c.rates, RatesConfig::default());
        assert_eq!(c.rates.driver_gbps, 6.0);
        assert_eq!(c.rates.link_gbps, 50.0);
        assert_eq!(c.rates.time_scale, 1.0);
        assert_eq!(
            c.host.memory_bytes(),
            None,
            "host memory is unlimited by default"
        );
        assert_eq!(c.memory.real_limit(), 64 << 20);
        assert_eq!(c.memory.sample_limit(), 64 << 10);
        assert!(c.nvml.present);
    }

    #[test]
    fn new_keys_parse_and_survive_a_round_trip() {
        let c = parse(
            "[rates]\ndriver_gbps = 3\nlink_gbps = 12.5\nhost_gbps = 40.0\ntime_scale = 250\n\
             [host]\nmemory_gib = 0.5\n[memory]\nreal_mib = 1\nsample_kib = 8\n\
             [nvml]\npresent = false\n",
        )
        .unwrap();
        assert_eq!(c.rates.driver_gbps, 3.0);
        assert_eq!(c.rates.time_scale, 250.0);
        assert_eq!(c.host.memory_bytes(), Some(512 << 20));
        assert_eq!(c.memory.real_limit(), 1 << 20);
        assert!(!c.nvml.present);
        assert_eq!(WorldConfig::parse(&c.to_toml(), "again").unwrap(), c);
    }

    #[test]
    fn bad_values_and_unknown_keys_name_the_key() {
        for (extra, key) in [
            ("[rates]\ndriver_gbps = 0\n", "rates.driver_gbps"),
            ("[rates]\nlink_gbps = -50.0\n", "rates.link_gbps"),
            ("[rates]\nhost_gbps = nan\n", "rates.host_gbps"),
            ("[rates]\ntime_scale = inf\n", "rates.time_scale"),
            ("[rates]\nlink_gbs = 5.0\n", "link_gbs"),
            ("[host]\nmemory_gib = 0\n", "host.memory_gib"),
            ("[host]\nmemory = 8\n", "memory"),
            ("[memory]\nreal_mib = 5000\n", "memory.real_mib"),
            ("[memory]\nsample_kib = 0\n", "memory.sample_kib"),
            ("[nvml]\npresent = \"yes\"\n", "present"),
            ("[nvml]\nhidden = true\n", "hidden"),
        ] {
            let e = parse(extra).unwrap_err();
            assert!(e.contains("w.toml"), "{e}");
            assert!(e.contains(key), "{key}: {e}");
        }
    }

    #[test]
    fn internal_threads_default_to_none_and_are_bounded() {
        assert_eq!(parse("").unwrap().driver.internal_threads, 0);
        let c = WorldConfig::parse(
            "schema = 1\n[driver]\nbranch = 580\ninternal_threads = 3\n",
            "w.toml",
        )
        .unwrap();
        assert_eq!(c.driver.internal_threads, 3);
        assert_eq!(WorldConfig::parse(&c.to_toml(), "again").unwrap(), c);
        let e = WorldConfig::parse(
            "schema = 1\n[driver]\nbranch = 580\ninternal_threads = 65\n",
            "w.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("driver.internal_threads = 65"), "{e}");
    }

    fn fault(function: &str, action: &str) -> String {
        format!("[[fault]]\nfunction = \"{function}\"\naction = {action}\n")
    }

    #[test]
    fn nvml_faults_take_nvml_codes_and_nvml_actions() {
        let c = parse(&fault(
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "{ kind = \"return\", code = \"NVML_ERROR_TIMEOUT\" }",
        ))
        .unwrap();
        let FaultAction::Return { code } = &c.faults[0].action else {
            panic!("{:?}", c.faults[0].action)
        };
        assert_eq!(code.nvml(), NvmlReturn::ERROR_TIMEOUT);
        assert!(
            c.to_toml().contains("NVML_ERROR_TIMEOUT"),
            "{}",
            c.to_toml()
        );
        parse(&fault("nvmlInit_v2", "{ kind = \"hang\" }")).unwrap();
        parse(&fault("nvmlInit_v2", "{ kind = \"return\", code = 9 }")).unwrap();
        for (f, action, why) in [
            (
                "nvmlInit_v2",
                "{ kind = \"return\", code = \"CUDA_ERROR_UNKNOWN\" }",
                "is a CUresult",
            ),
            (
                "nvmlInit_v2",
                "{ kind = \"kill-target\" }",
                "NVML calls take",
            ),
            ("nvmlInitt", "{ kind = \"hang\" }", "not an NVML function"),
            ("nvmlErrorString", "{ kind = \"hang\" }", "cannot fail"),
            (
                "cuInit",
                "{ kind = \"return\", code = \"NVML_ERROR_UNKNOWN\" }",
                "returns a CUresult",
            ),
            (
                "cuInit",
                "{ kind = \"return\", code = \"NOPE\" }",
                "unknown code \"NOPE\"",
            ),
        ] {
            let e = parse(&fault(f, action)).unwrap_err();
            assert!(e.contains(why), "{f} {action}: {e}");
        }
        let e = parse(&format!(
            "{}pid = 5\n",
            fault("nvmlDeviceGetCount_v2", "{ kind = \"hang\" }")
        ))
        .unwrap_err();
        assert!(e.contains("pid only applies"), "{e}");
    }

    proptest! {
        #[test]
        fn positive_rates_round_trip_and_others_are_refused(
            driver in prop_oneof![1e-6..1e6f64, Just(0.0), -1e3..0.0f64],
            link in 1e-6..1e6f64,
            scale in prop_oneof![1e-3..1e4f64, Just(-1.0)],
            gib in proptest::option::of(prop_oneof![1e-3..1e5f64, Just(0.0)]),
        ) {
            let mut text = format!(
                "[rates]\ndriver_gbps = {driver:?}\nlink_gbps = {link:?}\ntime_scale = {scale:?}\n"
            );
            if let Some(g) = gib {
                text.push_str(&format!("[host]\nmemory_gib = {g:?}\n"));
            }
            let valid = driver > 0.0 && scale > 0.0 && gib.is_none_or(|g| g > 0.0);
            match parse(&text) {
                Ok(c) => {
                    prop_assert!(valid);
                    prop_assert_eq!(c.rates.driver_gbps, driver);
                    prop_assert_eq!(c.rates.link_gbps, link);
                    prop_assert_eq!(c.rates.time_scale, scale);
                    prop_assert_eq!(c.host.memory_gib, gib);
                    prop_assert_eq!(WorldConfig::parse(&c.to_toml(), "again").unwrap(), c);
                }
                Err(e) => {
                    prop_assert!(!valid, "{}", e);
                    prop_assert!(e.contains("must be a positive number"), "{}", e);
                }
            }
        }

        #[test]
        fn fault_codes_round_trip_by_name_or_number(n in 0u32..1200) {
            let cuda = CUresult(n).name().map(|s| format!("\"{s}\""));
            let nvml = NvmlReturn(n).name().map(|s| format!("\"{s}\""));
            for (function, code) in [
                ("cuInit", cuda.clone().unwrap_or_else(|| n.to_string())),
                ("nvmlInit_v2", nvml.clone().unwrap_or_else(|| n.to_string())),
            ] {
                let c = parse(&fault(function, &format!("{{ kind = \"return\", code = {code} }}")))
                    .unwrap();
                let FaultAction::Return { code } = &c.faults[0].action else {
                    panic!("not a return fault")
                };
                prop_assert_eq!(code.cuda().0, n);
                prop_assert_eq!(code.nvml().0, n);
                prop_assert_eq!(WorldConfig::parse(&c.to_toml(), "again").unwrap(), c);
            }
        }
    }
}
