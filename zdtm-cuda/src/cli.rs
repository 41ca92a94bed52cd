//! The command line (clap), in the library so that its parsing is tested.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::runner::{Backend, CustomStorage, OptionStyle};
use crate::workloads;

/// Real CUDA workloads checkpointed and restored through real CRIU with cuda_plugin.so.
#[derive(Debug, Parser)]
#[command(name = "zdtm-cuda", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Cmd,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once per process; boxing would only complicate the tests' matches"
)]
pub enum Cmd {
    /// Report the driver, GPUs, nvcc, cuBLAS, CRIU and root; each missing one with its reason.
    Detect(DetectArgs),
    /// Compile the workloads with nvcc (no GPU needed).
    Build(BuildArgs),
    /// List the workloads.
    List,
    /// Run workloads through CRIU dump and restore, one at a time.
    Run(RunArgs),
    /// Print libcuda.so.1's cuDriverGetVersion and whether cuCheckpointOperationComplete
    /// resolves (what `detect` and `run` ask, in a process of their own).
    #[command(hide = true, name = "cuda-driver")]
    CudaDriver,
}

/// `detect`.
#[derive(Debug, Args)]
pub struct DetectArgs {
    /// The CRIU to use (default: criu in PATH, else the newest of target/criu/versions).
    #[arg(long, value_name = "PATH")]
    pub criu: Option<PathBuf>,
    /// Prebuilt workload directory (instead of nvcc).
    #[arg(long, value_name = "DIR")]
    pub prebuilt: Option<PathBuf>,
}

/// Options of the nvcc build, shared by `build` and `run`.
#[derive(Debug, Args)]
pub struct CompileArgs {
    /// GPU architectures (SASS for each, PTX for the newest), e.g. 80,90 or sm_80,sm_90.
    #[arg(long, value_name = "LIST", default_value = "80,90", value_parser = parse_archs)]
    pub arch: Archs,
    /// Parallel nvcc processes (default: the number of CPUs, at most 4).
    #[arg(short = 'j', long, value_name = "N")]
    pub jobs: Option<usize>,
    /// The nvcc to use (default: $NVCC, PATH, /usr/local/cuda, target/cuda-toolchain).
    #[arg(long, value_name = "PATH")]
    pub nvcc: Option<PathBuf>,
}

/// A parsed `--arch` list (sorted, without repeats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archs(pub Vec<u32>);

fn parse_archs(s: &str) -> Result<Archs, String> {
    crate::toolchain::parse_archs(s)
        .map(Archs)
        .map_err(|e| e.to_string())
}

/// `build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Output directory (default: target/zdtm-cuda/bin).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Build only these workloads (default: all).
    #[arg(value_name = "TEST", value_parser = parse_test)]
    pub tests: Vec<String>,
    #[command(flatten)]
    pub compile: CompileArgs,
}

/// `run`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["all", "tests"])))]
pub struct RunArgs {
    /// Run every workload.
    #[arg(long, conflicts_with = "tests")]
    pub all: bool,
    /// The workloads to run.
    #[arg(value_name = "TEST", value_parser = parse_test)]
    pub tests: Vec<String>,
    /// Plugin backend(s); several (comma-separated or repeated) run the set once per backend.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "auto")]
    pub backend: Vec<Backend>,
    /// `cuda_plugin.custom-storage=` settings: each workload runs once per setting, as its own
    /// case (`cuda00[custom-storage=on]`); `on` is skipped, with the reason, where the driver
    /// does not report CUDA 13.4 or the backend is cuda-checkpoint.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["on", "off"])]
    pub custom_storage: Vec<CustomStorage>,
    /// The CRIU to use (default: criu in PATH, else the newest of target/criu/versions).
    #[arg(long, value_name = "PATH")]
    pub criu: Option<PathBuf>,
    /// Plugin directory holding cuda_plugin.so (and no other plugin).
    #[arg(short = 'L', long, value_name = "DIR", conflicts_with = "plugin")]
    pub libdir: Option<PathBuf>,
    /// The plugin library (copied as cuda_plugin.so into a fresh plugin directory); default:
    /// target/{release,debug}/libcuda_plugin.so when --libdir is not given.
    #[arg(long, value_name = "SO")]
    pub plugin: Option<PathBuf>,
    /// Dump with --leave-running and verify the original task (no restore).
    #[arg(long)]
    pub leave_running: bool,
    /// Dump/restore cycles before the verification.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeat: u32,
    /// GPU remapping for the restore: OLD=NEW[,...] with full GPU UUIDs (GPU-xxxxxxxx-...).
    #[arg(long, value_name = "MAP", value_parser = parse_device_map)]
    pub device_map: Option<String>,
    /// Keep the images of failed tests.
    #[arg(long)]
    pub keep_images: bool,
    /// Write JUnit XML here.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Use the workloads in DIR instead of building them.
    #[arg(long, value_name = "DIR")]
    pub prebuilt: Option<PathBuf>,
    /// Logs, images and built workloads (default: target/zdtm-cuda/run).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Buffer size for the workloads in MiB (ZDTM_CUDA_MIB; default per workload).
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
    pub mib: Option<u64>,
    /// Seconds allowed for each wait (READY, the dumped task vanishing, the verdict) and for
    /// each CRIU run (killed past it).
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub timeout: u64,
    /// How plugin options reach CRIU.
    #[arg(long, value_enum, default_value = "auto")]
    pub plugin_options: OptionStyle,
    #[command(flatten)]
    pub compile: CompileArgs,
}

fn parse_test(s: &str) -> Result<String, String> {
    if workloads::find(s).is_some() {
        Ok(s.to_owned())
    } else {
        let names: Vec<&str> = workloads::ALL.iter().map(|w| w.name).collect();
        Err(format!("unknown test {s:?} (known: {})", names.join(", ")))
    }
}

/// Why a `--device-map` is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceMapError {
    #[error("empty device map")]
    Empty,
    #[error("device map entry {0:?} is not OLD=NEW")]
    Entry(String),
    #[error("{0:?} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")]
    Uuid(String),
    #[error("{0} is mapped twice")]
    Duplicate(String),
}

fn is_gpu_uuid(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("GPU-") else {
        return false;
    };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Checks a device map (the plugin's syntax: comma-separated `OLD=NEW` GPU UUIDs) and returns it
/// without blanks.
pub fn parse_device_map(s: &str) -> Result<String, DeviceMapError> {
    let mut seen: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (old, new) = entry
            .split_once('=')
            .ok_or_else(|| DeviceMapError::Entry(entry.to_owned()))?;
        let (old, new) = (old.trim(), new.trim());
        for u in [old, new] {
            if !is_gpu_uuid(u) {
                return Err(DeviceMapError::Uuid(u.to_owned()));
            }
        }
        if seen.contains(&old) {
            return Err(DeviceMapError::Duplicate(old.to_owned()));
        }
        seen.push(old);
        out.push(format!("{old}={new}"));
    }
    if out.is_empty() {
        return Err(DeviceMapError::Empty);
    }
    Ok(out.join(","))
}
