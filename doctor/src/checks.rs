//! The checks (`docs/doctor.md`). Facts are gathered once (the options file, the driver, NVML),
//! then each check judges its part of them.

use crate::report::{Check, Status};
use cuda_plugin::backend::cli::{
    find_in_path, probe_cli, CliProbe, CommandRunner, ProcessRunner, RunError, RunOutput,
};
use cuda_plugin::backend::driver::{probe_driver, DriverProbe, LoadError};
use cuda_plugin::backend::BackendKind;
use cuda_plugin::backend::ExitInfo;
use cuda_plugin::config::{ConfigError, Lookup, Origin};
use cuda_plugin::nvml::NodeReport;
use cuda_plugin::options::{BackendChoice, CustomStorage, Options};
use cuda_plugin::trust::{self, Role};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// CUDA 13.0: restore onto other GPUs (device maps) through the driver API.
const DEVICE_MAP_CUDA: i32 = abi::cuda::GPU_PAIRS_MIN_DRIVER_VERSION;
/// CUDA 13.4: custom storage.
const CUSTOM_STORAGE_CUDA: i32 = abi::cuda::CUSTOM_STORAGE_MIN_DRIVER_VERSION;
/// The oldest CRIU that works with current kernels and loads the plugin.
const MIN_CRIU: (u32, u32) = (4, 0);

/// Where to look, and for how long to wait (from the command line).
#[derive(Debug)]
pub struct Context {
    pub root: PathBuf,
    pub plugin_dir: PathBuf,
    pub path: Option<OsString>,
    pub criu: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub cuda_checkpoint: Option<PathBuf>,
    pub images: Option<PathBuf>,
    pub timeout: Duration,
}

/// Every check, in the order they are printed.
pub fn run(ctx: &Context) -> Vec<Check> {
    let (options_check, options) = options_file(ctx);
    let driver = driver_facts(ctx.timeout);
    let nvml = nvml_facts(ctx.timeout);
    let cli = cli_program(ctx, options.as_ref());
    let mut out = criu(ctx);
    out.push(options_check);
    out.push(program_trust(cli.as_deref()));
    let driver_check = driver_check(&driver, &nvml);
    let driver_api = matches!(driver, DriverFacts::Loaded { ref probe, .. } if probe.is_ok());
    out.push(driver_check);
    out.push(cuda_checkpoint(
        ctx,
        cli.as_deref(),
        options.as_ref(),
        driver_api,
    ));
    out.push(nvml_check(&nvml));
    out.push(gpus_check(&nvml));
    let custom = custom_storage_in_use(&driver, options.as_ref());
    out.push(host_memory(ctx, &nvml, custom));
    out.push(image_dir(ctx, &nvml));
    out.push(runtimes(ctx));
    out
}

// ------------------------------------------------------------------------------------ helpers

/// Runs `f` on a thread and waits for it at most `limit` (a driver or NVML that hangs must not
/// hang the doctor); `None` when it did not answer in time (or panicked).
fn bounded<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

/// Runs `program args` with the plugin's own runner: no shell, its own process group, killed
/// after `limit`, and only if nobody but root (or this user) can change it ([`trust`]).
fn run_program(program: &Path, args: &[&str], limit: Duration) -> Result<RunOutput, RunError> {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    ProcessRunner.run(program, &args, Some(limit))
}

fn ran_ok(r: &Result<RunOutput, RunError>) -> bool {
    matches!(r, Ok(o) if o.status == ExitInfo::Code(0))
}

fn find(ctx: &Context, name: &str) -> Option<PathBuf> {
    find_in_path(ctx.path.as_deref(), name)
}

/// Bytes as GiB with one decimal.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// `13000` as `13.0`.
fn cuda(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The first line of a program's output, trimmed.
fn first_line(s: &str) -> &str {
    s.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
}

// --------------------------------------------------------------------------------------- CRIU

/// Where CRIU is: `--criu`, the path, then ROOT/usr/sbin/criu and ROOT/usr/local/sbin/criu.
fn criu_program(ctx: &Context) -> Option<PathBuf> {
    if let Some(p) = &ctx.criu {
        return Some(p.clone());
    }
    find(ctx, "criu").or_else(|| {
        ["usr/sbin/criu", "usr/local/sbin/criu"]
            .iter()
            .map(|p| ctx.root.join(p))
            .find(|p| p.is_file())
    })
}

/// `Version: 4.1.1` (the first line of `criu --version`) as (4, 1).
fn criu_version(output: &str) -> Option<(u32, u32, String)> {
    let line = output
        .lines()
        .find_map(|l| l.trim().strip_prefix("Version:"))?
        .trim();
    let mut parts = line.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor, line.to_owned()))
}

/// `criu` (found, version) and `criu-plugin` (the plugin in CRIU's plugin directory).
fn criu(ctx: &Context) -> Vec<Check> {
    const ID: &str = "criu";
    let criu = match criu_program(ctx) {
        None => Check::fail(
            ID,
            "criu not found (path, /usr/sbin/criu, /usr/local/sbin/criu)",
            "Install CRIU 4.0 or later (criu.org, or your distribution's backports) or name it \
             with --criu PATH.",
        ),
        Some(p) => match run_program(&p, &["--version"], ctx.timeout) {
            Err(e) => {
                let fix = match &e {
                    RunError::Untrusted(t) => t.fix_command().map(|cmd| {
                        format!(
                            "Run `{cmd}`: CRIU runs as root, and the doctor runs no program that \
                             anybody but root can change."
                        )
                    }),
                    _ => None,
                };
                Check::fail(
                    ID,
                    format!("{}: `criu --version` did not run: {e}", p.display()),
                    fix.unwrap_or_else(|| "Install a working CRIU 4.0 or later.".to_owned()),
                )
            }
            Ok(out) => match criu_version(&out.output) {
                None => Check::fail(
                    ID,
                    format!(
                        "{}: cannot read a version from `criu --version` ({}): {:?}",
                        p.display(),
                        out.status,
                        first_line(&out.output)
                    ),
                    "Install a working CRIU 4.0 or later.",
                ),
                Some((major, minor, text)) if (major, minor) < MIN_CRIU => Check::fail(
                    ID,
                    format!("CRIU {text} at {}", p.display()),
                    format!(
                        "Install CRIU 4.0 or later: CRIU {text} fails on current kernels before \
                         it loads any plugin (Debian bookworm's 3.17 does)."
                    ),
                ),
                Some((_, _, text)) => Check::pass(ID, format!("CRIU {text} at {}", p.display())),
            },
        },
    };
    let so = ctx.plugin_dir.join("cuda_plugin.so");
    let plugin = if so.is_file() {
        Check::pass(
            "criu-plugin",
            format!(
                "{} is there: CRIU loads it from its plugin directory",
                so.display()
            ),
        )
    } else {
        Check::fail(
            "criu-plugin",
            format!("{} is missing", so.display()),
            format!(
                "Copy cuda_plugin.so from the release tarball into {} (CRIU's plugin directory; \
                 crun and podman give CRIU no other).",
                ctx.plugin_dir.display()
            ),
        )
    };
    vec![criu, plugin]
}

// ------------------------------------------------------------------------------- trust rules

/// The options file, found and checked as the plugin does ([`Lookup::load`]: the trust rules
/// and the parser); its options, for the other checks.
fn options_file(ctx: &Context) -> (Check, Option<Options>) {
    const ID: &str = "options-file";
    let lookup = Lookup {
        explicit: ctx.config.clone(),
        plugin_dir: Some(ctx.plugin_dir.clone()),
        system: ctx.root.join("etc/criu/cuda_plugin.conf"),
    };
    let places: Vec<String> = lookup
        .candidates()
        .iter()
        .map(|(p, _)| p.display().to_string())
        .collect();
    match lookup.load() {
        Ok(None) => (
            Check::skip(
                ID,
                format!(
                    "no options file ({}): the plugin runs with its defaults and CRIU_PLUGIN_OPTIONS",
                    places.join(", ")
                ),
            )
            .detail("podman passes the runtime only PATH: there, options must be in the options file"),
            Some(Options::default()),
        ),
        Ok(Some(file)) => {
            let origin = match file.origin {
                Origin::Environment => "named by CRIU_CUDA_PLUGIN_CONFIG",
                Origin::BesidePlugin => "next to the plugin",
                Origin::System => "system-wide",
            };
            let parsed = cuda_plugin::options::parse(file.options.iter().map(String::as_str));
            let mut c = Check::pass(
                ID,
                format!(
                    "{} ({origin}): trusted, {} option(s)",
                    file.path.display(),
                    file.options.len()
                ),
            );
            for o in &file.options {
                c = c.detail(o.clone());
            }
            (c, parsed.ok())
        }
        Err(e) => {
            let fix = match &e {
                ConfigError::Untrusted(t) => match t.fix_command() {
                    Some(cmd) => format!(
                        "Run `{cmd}`: the plugin reads no file that anybody but root can change."
                    ),
                    None => "Make the file and its directories readable by root.".to_owned(),
                },
                ConfigError::Missing { path } => format!(
                    "Create {} or unset CRIU_CUDA_PLUGIN_CONFIG.",
                    path.display()
                ),
                ConfigError::Line { line, .. } => format!(
                    "Correct line {line}: one NAME=VALUE per line, the options of \
                     CRIU_PLUGIN_OPTIONS (docs/options.md)."
                ),
                _ => "Make it a readable regular file of at most 64 KiB.".to_owned(),
            };
            (
                Check::fail(ID, format!("the plugin's init would fail: {e}"), fix),
                None,
            )
        }
    }
}

/// The `cuda-checkpoint` the plugin would run: `--cuda-checkpoint`, the options file's
/// `cuda-checkpoint=`, else the path.
fn cli_program(ctx: &Context, options: Option<&Options>) -> Option<PathBuf> {
    ctx.cuda_checkpoint
        .clone()
        .or_else(|| options.and_then(|o| o.cuda_checkpoint.clone()))
        .or_else(|| find(ctx, cuda_plugin::backend::cli::PROGRAM))
}

/// The trust rules for the program the plugin runs.
fn program_trust(program: Option<&Path>) -> Check {
    const ID: &str = "program-trust";
    let Some(p) = program else {
        return Check::skip(ID, "no cuda-checkpoint to check (see cuda-checkpoint)");
    };
    match trust::check(p, Role::Program) {
        Ok(()) => Check::pass(
            ID,
            format!(
                "{}: trusted: only root (or the doctor's own user) can change it or its directories",
                p.display()
            ),
        ),
        Err(e) => {
            let fix = match e.fix_command() {
                Some(cmd) => {
                    format!(
                        "Run `{cmd}`: the plugin runs no program that anybody but root can change."
                    )
                }
                None => "Make the program and its directories readable by root.".to_owned(),
            };
            Check::fail(ID, format!("the plugin would refuse to run it: {e}"), fix)
        }
    }
}

// ------------------------------------------------------------------------------------- driver

/// What the driver library said, as plain data.
#[derive(Debug)]
enum DriverFacts {
    /// `libcuda.so.1` does not load.
    Absent(String),
    /// It did not answer in time.
    Stuck,
    Loaded {
        /// `cuDriverGetVersion`.
        version: Result<i32, String>,
        /// The checkpoint API's symbols, each present or not.
        symbols: Vec<(&'static str, bool)>,
        /// The plugin's probe: `Ok(custom storage)` when the driver-API backend is usable.
        probe: Result<bool, String>,
    },
}

fn driver_facts(limit: Duration) -> DriverFacts {
    use cuda_plugin::ffi::cuda;
    bounded(limit, || {
        let version = match cuda::driver_version() {
            Err(LoadError::LibraryAbsent(e)) => return DriverFacts::Absent(e),
            Err(e) => Err(e.to_string()),
            Ok(v) => v.map_err(|code| format!("cuDriverGetVersion failed: {code}")),
        };
        let present = cuda::exported(&cuda::CHECKPOINT_SYMBOLS).unwrap_or_default();
        let symbols = cuda::CHECKPOINT_SYMBOLS
            .iter()
            .copied()
            .zip(present.into_iter().chain(std::iter::repeat(false)))
            .collect();
        let probe = match probe_driver(cuda::load(), false) {
            DriverProbe::Supported { custom_storage, .. } => Ok(custom_storage),
            DriverProbe::Unsupported(r) | DriverProbe::Error(r) => Err(r),
        };
        DriverFacts::Loaded {
            version,
            symbols,
            probe,
        }
    })
    .unwrap_or(DriverFacts::Stuck)
}

fn driver_check(d: &DriverFacts, nvml: &NvmlFacts) -> Check {
    const ID: &str = "driver";
    let install = "Install the NVIDIA driver (r580 or later for the driver API; r555 or later for \
                   cuda-checkpoint) so that libcuda.so.1 is on the loader's path.";
    let branch = match nvml {
        NvmlFacts::Report(r) => r.branch().map(|b| format!(", driver r{b}")),
        _ => None,
    }
    .unwrap_or_default();
    match d {
        DriverFacts::Absent(e) => {
            Check::fail(ID, format!("libcuda.so.1 does not load: {e}"), install)
        }
        DriverFacts::Stuck => Check::fail(
            ID,
            "libcuda.so.1 did not answer cuDriverGetVersion in time",
            "Check the driver (dmesg, nvidia-smi): it hangs when asked its version.",
        ),
        DriverFacts::Loaded {
            version,
            symbols,
            probe,
        } => {
            let have = symbols.iter().filter(|(_, p)| *p).count();
            let version_text = match version {
                Ok(v) => format!("CUDA {}{branch}", cuda(*v)),
                Err(e) => format!("version unknown ({e}){branch}"),
            };
            let mut c = match (probe, version) {
                (Ok(custom), _) => {
                    let mut features =
                        vec![format!("device maps (CUDA {}+)", cuda(DEVICE_MAP_CUDA))];
                    if *custom {
                        features.push(format!(
                            "custom storage (CUDA {}+)",
                            cuda(CUSTOM_STORAGE_CUDA)
                        ));
                    }
                    let mut c = Check::pass(
                        ID,
                        format!(
                            "{version_text}: checkpoint API {have}/{} symbols; features: {}",
                            symbols.len(),
                            features.join(", ")
                        ),
                    );
                    if !custom {
                        c = c.detail(format!(
                            "no custom storage (needs CUDA {}): GPU memory is staged in host memory",
                            cuda(CUSTOM_STORAGE_CUDA)
                        ));
                    }
                    c
                }
                (Err(reason), Ok(_)) => Check::warn(
                    ID,
                    format!(
                        "{version_text}: checkpoint API {have}/{} symbols; the driver-API backend \
                         is unavailable: {reason}",
                        symbols.len()
                    ),
                    "Upgrade the driver to r580 (CUDA 13.0) or later for the driver-API backend \
                     (device maps; custom storage from CUDA 13.4); until then the plugin needs \
                     cuda-checkpoint.",
                ),
                (Err(reason), Err(_)) => Check::fail(
                    ID,
                    format!("{version_text}: the plugin's probe fails: {reason}"),
                    install,
                ),
            };
            for (name, present) in symbols {
                c = c.detail(format!(
                    "{name}: {}",
                    if *present { "present" } else { "missing" }
                ));
            }
            c
        }
    }
}

// ---------------------------------------------------------------------------- cuda-checkpoint

/// Keeps the output of the last run, so that the help the plugin's probe read can be searched
/// for what the plugin does not ask about (`--launch-job`).
struct Recording {
    last: Option<String>,
}

impl CommandRunner for Recording {
    fn run(
        &mut self,
        program: &Path,
        args: &[String],
        deadline: Option<Duration>,
    ) -> Result<RunOutput, RunError> {
        let r = ProcessRunner.run(program, args, deadline);
        if let Ok(o) = &r {
            self.last = Some(o.output.clone());
        }
        r
    }
}

fn cuda_checkpoint(
    ctx: &Context,
    program: Option<&Path>,
    options: Option<&Options>,
    driver_api: bool,
) -> Check {
    const ID: &str = "cuda-checkpoint";
    let required = options
        .is_some_and(|o| o.backend == BackendChoice::Only(BackendKind::CudaCheckpoint))
        || !driver_api;
    let why_needed = if driver_api {
        "the options file says backend=cuda-checkpoint"
    } else {
        "the driver-API backend is unavailable here"
    };
    let install = "Install cuda-checkpoint (NVIDIA's utility, r555 or later; r580 for \
                   --device-map) in CRIU's PATH, or name it with cuda-checkpoint=PATH in the \
                   options file.";
    let Some(program) = program else {
        return if required {
            Check::fail(ID, format!("not found, and needed: {why_needed}"), install)
        } else {
            Check::skip(ID, "not found; not needed: the plugin uses the driver API")
        };
    };
    let mut runner = Recording { last: None };
    let probe = probe_cli(Some(program), None, &mut runner, Some(ctx.timeout));
    let help = runner.last.unwrap_or_default();
    match probe {
        CliProbe::Supported {
            program,
            device_map,
        } => {
            let launch_job = help.contains("--launch-job");
            let yes = |b: bool| if b { "yes" } else { "no" };
            let found = format!(
                "{}: --action yes, --device-map {}, --launch-job {}",
                program.display(),
                yes(device_map),
                yes(launch_job)
            );
            if !device_map && !driver_api {
                Check::warn(
                    ID,
                    found,
                    "Upgrade the driver to r580 or later: without --device-map (and without the \
                     driver API) a restore cannot move tasks to other GPUs.",
                )
            } else {
                Check::pass(ID, found)
            }
        }
        CliProbe::Unsupported(reason) => {
            let status = if required { Status::Fail } else { Status::Warn };
            Check::new(
                ID,
                status,
                format!("{}: unusable: {reason}", program.display()),
            )
            .with_fix(install)
        }
        CliProbe::Error(reason) => Check::fail(
            ID,
            format!("{}: the plugin's probe fails: {reason}", program.display()),
            "Fix what the probe names (a program anybody but root can change is never run; one \
             that hangs on -h is broken).",
        ),
    }
}

// --------------------------------------------------------------------------------------- NVML

#[derive(Debug)]
enum NvmlFacts {
    Report(NodeReport),
    /// The library does not load (or lacks a function the doctor needs).
    Absent(String),
    /// It loads but fails.
    Failed(String),
    Stuck,
}

fn nvml_facts(limit: Duration) -> NvmlFacts {
    use cuda_plugin::nvml::NvmlError;
    bounded(limit, || match cuda_plugin::ffi::nvml::node() {
        Ok(r) => NvmlFacts::Report(r),
        Err(NvmlError::Absent(e)) => NvmlFacts::Absent(e),
        Err(e) => NvmlFacts::Failed(e.to_string()),
    })
    .unwrap_or(NvmlFacts::Stuck)
}

fn nvml_check(n: &NvmlFacts) -> Check {
    const ID: &str = "nvml";
    match n {
        NvmlFacts::Absent(e) => Check::warn(
            ID,
            format!("NVML is not available: {e}; the plugin skips its memory checks"),
            "Install the driver's NVML (libnvidia-ml.so.1, nvidia-utils) so the plugin can check \
             host and GPU memory before it touches a task.",
        ),
        NvmlFacts::Failed(e) => Check::fail(
            ID,
            format!("NVML fails: {e}"),
            "Check the driver with nvidia-smi (NVML loads but cannot answer).",
        ),
        NvmlFacts::Stuck => Check::fail(
            ID,
            "NVML did not answer in time",
            "Check the driver with nvidia-smi (NVML hangs).",
        ),
        NvmlFacts::Report(r) if r.gpus.is_empty() => Check::fail(
            ID,
            "NVML sees no GPU",
            "Check that the GPUs and the driver are up (nvidia-smi).",
        ),
        NvmlFacts::Report(r) => {
            let version = match &r.driver_version {
                Ok(v) => format!("driver {v}"),
                Err(code) => format!("driver version unknown ({code})"),
            };
            let mut c = Check::pass(ID, format!("{version}, {} GPU(s)", r.gpus.len()));
            for (i, g) in r.gpus.iter().enumerate() {
                let name = g.name.clone().unwrap_or_else(|c| c.to_string());
                c = c.detail(format!("GPU {i}: {} {name}, {}", g.uuid, gib(g.total)));
            }
            c
        }
    }
}

/// Persistence mode and MIG mode of every GPU.
fn gpus_check(n: &NvmlFacts) -> Check {
    const ID: &str = "gpus";
    let NvmlFacts::Report(r) = n else {
        return Check::skip(ID, "persistence and MIG modes unknown: no NVML (see nvml)");
    };
    if r.gpus.is_empty() {
        return Check::skip(ID, "no GPU (see nvml)");
    }
    let mut mig = Vec::new();
    let mut no_persistence = Vec::new();
    let mut details = Vec::new();
    for (i, g) in r.gpus.iter().enumerate() {
        let p = match g.persistence {
            Ok(true) => "on".to_owned(),
            Ok(false) => {
                no_persistence.push(i);
                "off".to_owned()
            }
            Err(code) => {
                no_persistence.push(i);
                format!("unknown ({code})")
            }
        };
        let m = match g.mig {
            Ok(true) => {
                mig.push(i);
                "on".to_owned()
            }
            Ok(false) => "off".to_owned(),
            Err(code) if code == abi::nvml::NvmlReturn::ERROR_NOT_SUPPORTED => {
                "not supported (off)".to_owned()
            }
            Err(code) => format!("unknown ({code})"),
        };
        details.push(format!("GPU {i} {}: persistence {p}, MIG {m}", g.uuid));
    }
    let list = |v: &[usize]| {
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut c =
        if !mig.is_empty() {
            Check::fail(
                ID,
                format!("MIG mode is on for GPU {}", list(&mig)),
                format!(
                "Turn MIG off (nvidia-smi -i {} -mig 0, then reset the GPU): the driver cannot \
                 checkpoint a process on a MIG instance (cuda-checkpoint #42).",
                list(&mig)
            ),
            )
        } else if !no_persistence.is_empty() {
            Check::warn(
            ID,
            format!("persistence mode is not on for GPU {}", list(&no_persistence)),
            "Turn persistence mode on (nvidia-persistenced, or nvidia-smi -pm 1): a restore needs \
             it or a cuInit in the restoring process, and the driver state survives between dump \
             and restore only with it.",
        )
        } else {
            Check::pass(
                ID,
                format!("{} GPU(s): persistence mode on, MIG off", r.gpus.len()),
            )
        };
    c.details = details;
    c
}

// ------------------------------------------------------------------------------------- memory

/// Whether a dump would use custom storage (GPU memory straight into the image directory)
/// rather than stage GPU memory in host memory.
fn custom_storage_in_use(d: &DriverFacts, options: Option<&Options>) -> bool {
    let available = matches!(
        d,
        DriverFacts::Loaded {
            probe: Ok(true),
            ..
        }
    );
    let o = options.cloned().unwrap_or_default();
    available
        && o.custom_storage != CustomStorage::Off
        && !o.no_guardian
        && o.backend != BackendChoice::Only(BackendKind::CudaCheckpoint)
}

/// `MemAvailable` of ROOT/proc/meminfo, bytes.
fn mem_available(root: &Path) -> Result<u64, String> {
    let p = root.join("proc/meminfo");
    let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| format!("{} has no MemAvailable line", p.display()))
}

fn gpu_total(n: &NvmlFacts) -> Option<u64> {
    match n {
        NvmlFacts::Report(r) if !r.gpus.is_empty() => Some(r.gpus.iter().map(|g| g.total).sum()),
        _ => None,
    }
}

/// All GPU memory against the host's available memory (host staging).
fn host_memory(ctx: &Context, n: &NvmlFacts, custom: bool) -> Check {
    const ID: &str = "host-memory";
    let Some(total) = gpu_total(n) else {
        return Check::skip(ID, "GPU memory unknown: no NVML (see nvml)");
    };
    let avail = match mem_available(&ctx.root) {
        Ok(a) => a,
        Err(e) => {
            return Check::warn(
                ID,
                format!("host memory unknown: {e}"),
                "Run the doctor where /proc/meminfo is readable.",
            )
        }
    };
    let found = format!(
        "GPU memory {} in all, host MemAvailable {}",
        gib(total),
        gib(avail)
    );
    if custom {
        Check::pass(
            ID,
            format!(
                "{found}; custom storage writes GPU memory to the image directory, not host memory"
            ),
        )
    } else if total > avail {
        Check::fail(
            ID,
            format!("{found}: a dump of a job that fills every GPU does not fit (host staging)"),
            "Free or add host memory, or use custom storage (a CUDA 13.4 driver, \
             custom-storage=auto) so that GPU memory goes straight to the image directory.",
        )
    } else {
        Check::pass(ID, format!("{found}: host staging fits"))
    }
}

/// Whether a file in `dir` can be opened with `O_DIRECT` (created and removed again).
fn takes_o_direct(dir: &Path) -> Result<bool, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let p = dir.join(format!(".cuda-plugin-doctor-{}", std::process::id()));
    let r = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(&p);
    match r {
        Ok(f) => {
            drop(f);
            let _ = std::fs::remove_file(&p);
            Ok(true)
        }
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let _ = std::fs::remove_file(&p);
            Ok(false)
        }
        Err(e) => Err(format!("cannot create a file in {}: {e}", dir.display())),
    }
}

/// The image directory's free space against all GPU memory, and `O_DIRECT`.
fn image_dir(ctx: &Context, n: &NvmlFacts) -> Check {
    const ID: &str = "image-dir";
    let Some(dir) = &ctx.images else {
        return Check::skip(
            ID,
            "no --images DIR given: the image filesystem is not checked",
        );
    };
    let free = match nix::sys::statvfs::statvfs(dir) {
        Ok(s) => s.blocks_available().saturating_mul(s.fragment_size()),
        Err(e) => {
            return Check::fail(
                ID,
                format!("{}: statvfs failed: {e}", dir.display()),
                "Give --images an existing directory on the filesystem the images go to.",
            )
        }
    };
    let direct = match takes_o_direct(dir) {
        Ok(d) => d,
        Err(e) => {
            return Check::fail(
                ID,
                e,
                "Make the image directory writable by root (CRIU writes its images there).",
            )
        }
    };
    let direct_text = if direct {
        "takes O_DIRECT"
    } else {
        "refuses O_DIRECT (custom storage falls back to buffered I/O through the page cache)"
    };
    let found = format!("{}: {} free, {direct_text}", dir.display(), gib(free));
    match gpu_total(n) {
        Some(total) if total > free => Check::fail(
            ID,
            format!("{found}; GPU memory {} in all does not fit", gib(total)),
            "Give the images a filesystem with at least as much free space as the GPUs' memory.",
        ),
        Some(total) if !direct => Check::warn(
            ID,
            format!("{found}; room for GPU memory {}", gib(total)),
            "Put the images on a filesystem that takes O_DIRECT (ext4, xfs) for custom storage's \
             full rate.",
        ),
        Some(total) => Check::pass(ID, format!("{found}; room for GPU memory {}", gib(total))),
        None => Check::pass(ID, format!("{found}; GPU memory unknown (see nvml)")),
    }
}

// ----------------------------------------------------------------------------------- runtimes

/// runc, crun and podman: found, version, CRIU support.
fn runtimes(ctx: &Context) -> Check {
    const ID: &str = "runtimes";
    let t = ctx.timeout;
    let mut details = Vec::new();
    let mut with_criu = Vec::new();
    let mut without = Vec::new();
    if let Some(p) = find(ctx, "runc") {
        let v = run_program(&p, &["--version"], t);
        let version = v
            .as_ref()
            .map(|o| first_line(&o.output).to_owned())
            .unwrap_or_else(|e| format!("--version failed: {e}"));
        // runc 1.1+: `runc features` lists the annotation that says checkpoint is built in;
        // older ones: the checkpoint command exists.
        let features = run_program(&p, &["features"], t);
        let criu = match &features {
            Ok(o) if o.status == ExitInfo::Code(0) => {
                let v: serde_json::Value = serde_json::from_str(&o.output).unwrap_or_default();
                v.pointer("/annotations/org.opencontainers.runc.checkpoint.enabled")
                    .and_then(serde_json::Value::as_str)
                    == Some("true")
            }
            _ => ran_ok(&run_program(&p, &["checkpoint", "--help"], t)),
        };
        details.push(format!(
            "runc {}: {version}; CRIU support {}",
            p.display(),
            if criu { "yes" } else { "no" }
        ));
        if criu { &mut with_criu } else { &mut without }.push("runc");
    }
    if let Some(p) = find(ctx, "crun") {
        let v = run_program(&p, &["--version"], t);
        let (version, criu) = match &v {
            Ok(o) => (
                first_line(&o.output).to_owned(),
                o.output.split_whitespace().any(|w| w == "+CRIU"),
            ),
            Err(e) => (format!("--version failed: {e}"), false),
        };
        details.push(format!(
            "crun {}: {version}; CRIU support {} (crun passes CRIU no configuration file: the \
             plugin must be in CRIU's plugin directory)",
            p.display(),
            if criu {
                "yes (+CRIU)"
            } else {
                "no (built without +CRIU)"
            }
        ));
        if criu { &mut with_criu } else { &mut without }.push("crun");
    }
    if let Some(p) = find(ctx, "podman") {
        let version = run_program(&p, &["--version"], t)
            .map(|o| first_line(&o.output).to_owned())
            .unwrap_or_else(|e| format!("--version failed: {e}"));
        details.push(format!(
            "podman {}: {version}; it checkpoints through its OCI runtime (above) and passes the \
             runtime only PATH: the plugin's options must be in the options file",
            p.display()
        ));
    }
    let mut c = if with_criu.is_empty() && without.is_empty() {
        Check::skip(ID, "no runc or crun found in the path")
    } else if with_criu.is_empty() {
        Check::fail(
            ID,
            format!(
                "no container runtime with CRIU support ({} without)",
                without.join(", ")
            ),
            "Install runc, or a crun built with CRIU support (+CRIU in crun --version).",
        )
    } else if !without.is_empty() {
        Check::warn(
            ID,
            format!(
                "CRIU support in {}, not in {}",
                with_criu.join(", "),
                without.join(", ")
            ),
            format!(
                "Checkpoint containers with {} (or install a {} built with CRIU support).",
                with_criu.join(" or "),
                without.join(" or ")
            ),
        )
    } else {
        Check::pass(ID, format!("CRIU support in {}", with_criu.join(", ")))
    };
    c.details = details;
    c
}
