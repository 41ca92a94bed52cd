//! The plugin's options: `backend`, `device-map`, `timeout`, `cuda-checkpoint`,
//! `on-restore-failure`, `check-capacity`, `min-copy-rate` and `guardian`.
//!
//! # Sources and precedence
//!
//! Two layers, combined option by option (see [`collect`]):
//!
//! * **the run's options**, from exactly one channel:
//!   1. CRIU's `criu_plugin_get_options(&argc, &argv)` (merged upstream with #3138; no CRIU
//!      release has it yet). Every plugin sees every `--PLUGIN.NAME=VALUE` string, after a
//!      synthetic `argv[0]`. We take the strings in the `cuda_plugin.` namespace, ignore the rest,
//!      and never modify CRIU's array (the FFI layer copies the strings before this module sees
//!      them).
//!   2. When the host has no such service, or it carried no `cuda_plugin.` option at all, the
//!      environment variable `CRIU_PLUGIN_OPTIONS`: the same strings separated by whitespace,
//!      with or without the leading `--`. (When CRIU hands options over, this variable is
//!      ignored as a whole: it is only a stand-in for the same channel.)
//! * **the node's options**, from the plugin's options file `cuda_plugin.conf`
//!   ([`crate::config`]: `CRIU_CUDA_PLUGIN_CONFIG`, else next to the plugin's `.so`, else
//!   `/etc/criu/cuda_plugin.conf`).
//!
//! So: options CRIU hands over > `CRIU_PLUGIN_OPTIONS` > the options file > the defaults. An
//! option the run names overrides the file's value of that option only; every option the run
//! does not name keeps the file's value. (The file is where an administrator puts the node's
//! settings, e.g. the backend and the utility's path, for runs whose environment nobody controls;
//! a run that sets a `timeout` should not lose them.)
//!
//! Repeated options: the last one wins (CRIU keeps every value in order). An unknown
//! `cuda_plugin.*` name, a missing `=VALUE` or an invalid value is an error naming the option and
//! the allowed values (and, in the file, the file and the line); `init` then fails.

use crate::backend::BackendKind;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The option namespace (the plugin's descriptor name).
pub const NAMESPACE: &str = "cuda_plugin";

/// Environment variable read when the host cannot hand options over.
pub const ENV_OPTIONS: &str = "CRIU_PLUGIN_OPTIONS";

/// Which backend talks to the driver (`backend=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// The first backend of [`crate::backend::registry::BACKENDS`] that is supported here (the
    /// driver API, else `cuda-checkpoint`; only when the earlier one is *unsupported*).
    #[default]
    Auto,
    /// This backend, or fail.
    Only(BackendKind),
}

impl BackendChoice {
    /// Every accepted spelling, for messages.
    #[must_use]
    pub fn allowed() -> &'static str {
        static ALLOWED: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        ALLOWED.get_or_init(|| format!("auto, {}", BackendKind::names()))
    }

    /// The option spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Only(k) => k.facts().name,
        }
    }

    fn parse(v: &str) -> Option<Self> {
        match v {
            "auto" => Some(BackendChoice::Auto),
            other => BackendKind::from_name(other).map(BackendChoice::Only),
        }
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a restore does with a task whose GPU state could not be restored, on hosts that only log
/// a failed RESUME_DEVICES_LATE and release the task anyway (CRIU 4.1 and 4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestoreFailure {
    /// Kill the task (SIGKILL): CRIU then fails the restore, and the images, which are intact,
    /// can be restored again.
    #[default]
    Kill,
    /// Leave it as it is (LOCKED or CHECKPOINTED: its next CUDA call blocks until someone
    /// restores and unlocks it by hand).
    Leave,
}

impl RestoreFailure {
    /// Every accepted spelling, for messages.
    pub const ALLOWED: &'static str = "kill, leave";

    /// The option spelling.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            RestoreFailure::Kill => "kill",
            RestoreFailure::Leave => "leave",
        }
    }

    fn parse(v: &str) -> Option<Self> {
        match v {
            "kill" => Some(RestoreFailure::Kill),
            "leave" => Some(RestoreFailure::Leave),
            _ => None,
        }
    }
}

impl fmt::Display for RestoreFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `parallel=auto|N`: how many tasks' checkpoints (and restores) run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Parallel {
    /// `parallel=N` (1 to [`Parallel::MAX`]); 1 is one task at a time, each inside its own
    /// hook call.
    Width(u32),
    /// `parallel=auto`: one per task, up to [`Parallel::AUTO_CAP`].
    Auto,
    /// Nothing given: as `auto` (the default since issue 29: one lock after another does not
    /// fit CRIU's freeze alarm for large trees, and cannot lock the ranks of a collective).
    #[default]
    Unset,
}

impl Parallel {
    /// The most tasks `auto` runs at once: a host has at most 8 GPUs in the common case (16
    /// on the largest systems), and a task per GPU is the shape of a tensor-parallel job.
    pub const AUTO_CAP: u32 = 16;
    /// The largest `parallel=N`.
    pub const MAX: u32 = 64;
    const ALLOWED: &'static str = "auto, or a whole number from 1 to 64 (1 = one task at a time)";

    /// How many tasks' calls may run at once.
    #[must_use]
    pub fn width(self) -> usize {
        match self {
            Parallel::Width(n) => n as usize,
            Parallel::Auto | Parallel::Unset => Parallel::AUTO_CAP as usize,
        }
    }

    fn parse(v: &str) -> Option<Self> {
        if v == "auto" {
            return Some(Parallel::Auto);
        }
        if v.is_empty() || v.len() > 2 || !v.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: u32 = v.parse().ok()?;
        (1..=Parallel::MAX)
            .contains(&n)
            .then_some(Parallel::Width(n))
    }
}

/// `custom-storage=auto|on|off`: whether a dump moves GPU memory straight into the image through
/// CUDA 13.4's custom storage (see `docs/custom-storage.md` and [`crate::cstore`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CustomStorage {
    /// `auto`, or nothing given: on wherever it can work (the driver API with the helper, on a
    /// 13.4+ driver); a restore follows the image.
    #[default]
    Auto,
    /// `on`: refused at `init` where it cannot work.
    On,
    /// `off`: host staging; an image made with custom storage is refused at restore.
    Off,
}

impl CustomStorage {
    const ALLOWED: &'static str = "auto, on, off";

    fn parse(v: &str) -> Option<Self> {
        match v {
            "auto" => Some(CustomStorage::Auto),
            "on" => Some(CustomStorage::On),
            "off" => Some(CustomStorage::Off),
            _ => None,
        }
    }

    /// The option's value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            CustomStorage::Auto => "auto",
            CustomStorage::On => "on",
            CustomStorage::Off => "off",
        }
    }
}

impl fmt::Display for CustomStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `timeout=SECONDS`: absent means "follow CRIU's `--timeout`, else 10 s".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutOption {
    /// `timeout=0`: wait forever.
    Disabled,
    /// `timeout=N`, N > 0.
    Seconds(u32),
}

/// The parsed options. `Default` is "nothing given".
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Options {
    /// `backend=` (default auto).
    pub backend: BackendChoice,
    /// `device-map=` as given; its grammar belongs to [`crate::gpu_map`]. `None` when absent;
    /// an empty value is kept as `Some("")` and means "no map".
    pub device_map: Option<String>,
    /// `timeout=`.
    pub timeout: Option<TimeoutOption>,
    /// `cuda-checkpoint=PATH` (absolute); else the utility is looked up in `PATH`.
    pub cuda_checkpoint: Option<PathBuf>,
    /// `on-restore-failure=` (default kill).
    pub on_restore_failure: RestoreFailure,
    /// `check-capacity=off`: skip the host- and GPU-memory checks (default on).
    pub skip_capacity_check: bool,
    /// `min-copy-rate=GBPS`: the copy rate a checkpoint's or restore's deadline assumes, in
    /// GB/s (10^9 bytes per second); `None`: [`crate::nvml::DEFAULT_MIN_COPY_RATE`].
    pub min_copy_rate: Option<CopyRate>,
    /// `guardian=off`: no helper process (default on; see [`crate::agent`]).
    pub no_guardian: bool,
    /// `parallel=` (default: auto).
    pub parallel: Parallel,
    /// `custom-storage=` (default auto).
    pub custom_storage: CustomStorage,
}

/// A copy rate in GB/s, as given (kept as text so that rendering round-trips).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyRate(String);

impl CopyRate {
    /// Bytes per second.
    #[must_use]
    pub fn bytes_per_second(&self) -> f64 {
        decimal(&self.0).map_or(crate::nvml::DEFAULT_MIN_COPY_RATE, |g| g * 1e9)
    }

    fn parse(v: &str) -> Option<Self> {
        let ok =
            !v.is_empty() && v.len() <= 16 && decimal(v).is_some_and(|g| g > 0.0 && g.is_finite());
        ok.then(|| CopyRate(v.to_owned()))
    }
}

/// The value of `v` when it is digits with at most one `.` among them (`1`, `0.5`, `2.`, `.5`),
/// at least one digit: the digits as an integer over a power of ten, which for up to 15 digits
/// is exactly what `str::parse::<f64>` returns (both round the exact quotient once). Hand-written
/// because `parse::<f64>` brought about 25 KB of float-parsing code and tables into the plugin
/// for this one option (see `scripts/check-dist.sh`'s size limit).
fn decimal(v: &str) -> Option<f64> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let mut digits: u64 = 0;
    for b in int.bytes().chain(frac.bytes()) {
        if !b.is_ascii_digit() {
            return None;
        }
        digits = digits.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    // Powers of ten up to 10^22 are exact in an f64.
    let mut scale = 1.0_f64;
    for _ in 0..frac.len() {
        scale *= 10.0;
    }
    // Exact below 2^53, i.e. for up to 15 digits.
    Some(digits as f64 / scale)
}

impl fmt::Display for CopyRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The default per-operation timeout when neither the option nor CRIU's `opts.timeout` is known.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl Options {
    /// The per-operation timeout: the option, else CRIU's `--timeout` (seconds, 0 = none), else
    /// [`DEFAULT_TIMEOUT`]. `None` means "no timeout".
    #[must_use]
    pub fn effective_timeout(&self, criu_timeout_secs: Option<u32>) -> Option<Duration> {
        match self.timeout {
            Some(TimeoutOption::Disabled) => None,
            Some(TimeoutOption::Seconds(s)) => Some(Duration::from_secs(u64::from(s))),
            None => match criu_timeout_secs {
                Some(0) => None,
                Some(s) => Some(Duration::from_secs(u64::from(s))),
                None => Some(DEFAULT_TIMEOUT),
            },
        }
    }

    /// Renders the options back into `cuda_plugin.NAME=VALUE` strings (without `--`), in a fixed
    /// order. Parsing the result yields `self` again (property-tested).
    #[must_use]
    pub fn to_strings(&self) -> Vec<String> {
        let mut out = vec![format!("{NAMESPACE}.backend={}", self.backend)];
        if let Some(m) = &self.device_map {
            out.push(format!("{NAMESPACE}.device-map={m}"));
        }
        match self.timeout {
            Some(TimeoutOption::Disabled) => out.push(format!("{NAMESPACE}.timeout=0")),
            Some(TimeoutOption::Seconds(s)) => out.push(format!("{NAMESPACE}.timeout={s}")),
            None => {}
        }
        if let Some(p) = &self.cuda_checkpoint {
            out.push(format!("{NAMESPACE}.cuda-checkpoint={}", p.display()));
        }
        out.push(format!(
            "{NAMESPACE}.on-restore-failure={}",
            self.on_restore_failure
        ));
        out.push(format!(
            "{NAMESPACE}.check-capacity={}",
            if self.skip_capacity_check {
                "off"
            } else {
                "on"
            }
        ));
        if let Some(r) = &self.min_copy_rate {
            out.push(format!("{NAMESPACE}.min-copy-rate={r}"));
        }
        out.push(format!(
            "{NAMESPACE}.guardian={}",
            if self.no_guardian { "off" } else { "on" }
        ));
        match self.parallel {
            Parallel::Auto => out.push(format!("{NAMESPACE}.parallel=auto")),
            Parallel::Width(n) => out.push(format!("{NAMESPACE}.parallel={n}")),
            Parallel::Unset => {}
        }
        out.push(format!(
            "{NAMESPACE}.custom-storage={}",
            self.custom_storage
        ));
        out
    }
}

/// Why the options are unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error(
        "unknown option {NAMESPACE}.{} (known: backend, device-map, timeout, cuda-checkpoint, \
         on-restore-failure, check-capacity, min-copy-rate, guardian, parallel, custom-storage)",
        crate::message::quote(name)
    )]
    Unknown { name: String },
    #[error(
        "option {NAMESPACE}.{name} needs a value ({NAMESPACE}.{name}=VALUE; allowed: {allowed})"
    )]
    MissingValue { name: String, allowed: &'static str },
    #[error(
        "invalid value {} for option {NAMESPACE}.{name} (allowed: {allowed})",
        crate::message::quote_debug(value)
    )]
    InvalidValue {
        name: String,
        value: String,
        allowed: &'static str,
    },
}

/// One option as published in the plugin's option metadata (`CR_PLUGIN_OPTIONS_META`).
#[derive(Debug, Clone, Copy)]
pub struct OptionDoc {
    pub name: &'static std::ffi::CStr,
    pub value_syntax: &'static std::ffi::CStr,
    /// `None`: no fixed default.
    pub default_value: Option<&'static std::ffi::CStr>,
    pub help: &'static std::ffi::CStr,
}

/// Every option, for tools that list plugin options without loading the plugin's `init`.
pub const DOCS: [OptionDoc; 10] = [
    OptionDoc {
        name: c"backend",
        value_syntax: c"auto|driver-api|cuda-checkpoint",
        default_value: Some(c"auto"),
        help: c"checkpoint backend: libcuda's cuCheckpointProcess* API (CUDA 13.0+ drivers) or the cuda-checkpoint utility (r555+); auto prefers the API and falls back only when it is unsupported",
    },
    OptionDoc {
        name: c"device-map",
        value_syntax: c"auto|GPU-old=GPU-new,...|old=new,...",
        default_value: None,
        help: c"restore only: GPUs to restore onto, by UUID (unique prefixes allowed) or ordinal; without it, auto when the GPUs differ from the dump's",
    },
    OptionDoc {
        name: c"timeout",
        value_syntax: c"SECONDS",
        default_value: Some(c"CRIU's --timeout (10)"),
        help: c"limit for each driver call or cuda-checkpoint run (a checkpoint or restore gets this plus the time its bytes take at min-copy-rate; a lock never outlasts CRIU's own --timeout); 0 = none",
    },
    OptionDoc {
        name: c"cuda-checkpoint",
        value_syntax: c"PATH",
        default_value: Some(c"cuda-checkpoint found in PATH"),
        help: c"the cuda-checkpoint utility to run (an absolute path)",
    },
    OptionDoc {
        name: c"on-restore-failure",
        value_syntax: c"kill|leave",
        default_value: Some(c"kill"),
        help: c"restore only, on CRIU 4.1/4.2 (which ignore a failed late restore hook): kill a task whose GPU state could not be restored, so that the restore fails and can be retried from the intact images, or leave it locked/checkpointed for recovery by hand",
    },
    OptionDoc {
        name: c"check-capacity",
        value_syntax: c"on|off",
        default_value: Some(c"on"),
        help: c"refuse a dump whose CUDA tasks hold more GPU memory than the host has available, and a restore onto GPUs without enough free memory, before anything is touched (needs NVML)",
    },
    OptionDoc {
        name: c"min-copy-rate",
        value_syntax: c"GBPS",
        default_value: Some(c"1"),
        help: c"the copy rate, in GB/s, a checkpoint's or restore's deadline assumes: timeout + bytes / rate",
    },
    OptionDoc {
        name: c"guardian",
        value_syntax: c"on|off",
        default_value: Some(c"on"),
        help: c"a helper process, started at init, runs the driver calls (CRIU stays single-threaded) and, if CRIU dies mid-operation, puts every CUDA task it touched back in its dump-start state (log: cuda-plugin-guardian.log in the image directory); off: driver calls run on threads inside CRIU and nothing guards the tasks",
    },
    OptionDoc {
        name: c"custom-storage",
        value_syntax: c"auto|on|off",
        default_value: Some(c"auto"),
        help: c"move GPU memory straight into the image directory (cuda-cs-PID-N.img, checksummed, uniform chunks not written) through CUDA 13.4 custom storage, copied by a helper process per GPU and task in parallel, instead of staging it in each task's host memory for CRIU to dump as pages; auto: where the driver API runs with the guardian on a 13.4+ driver; on: refuse at init where it cannot work; off: host staging (a custom-storage image is then refused at restore)",
    },
    OptionDoc {
        name: c"parallel",
        value_syntax: c"auto|N",
        default_value: Some(c"auto"),
        help: c"how many tasks' locks, checkpoints and restores run at once: auto (one per task, at most 16) or N > 1 locks the tree's CUDA tasks together at CRIU's first PAUSE_DEVICES call (so that many locks fit CRIU's freeze timeout, and the ranks of a collective, such as NCCL's, which wait for each other, can be locked at all) and starts every task's copy at the first CHECKPOINT_DEVICES / RESUME_DEVICES_LATE call, so the GPUs of a multi-GPU job copy side by side; each task's call still returns its own result, and a failure rolls every task back; 1: one task at a time, each in its own call (needs the guardian for the driver API; with guardian=off driver calls stay one at a time)",
    },
];

const ONOFF_ALLOWED: &str = "on, off";
const RATE_ALLOWED: &str = "a positive decimal number of GB/s (e.g. 1, 0.5, 25)";
const TIMEOUT_ALLOWED: &str = "whole seconds from 0 to 4294967295, 0 = no timeout";
const PATH_ALLOWED: &str =
    "an absolute file path (CRIU runs the plugin in the image directory, so a relative one would \
     name a file there)";
const DEVICE_MAP_ALLOWED: &str =
    "auto, GPU-old=GPU-new,... (UUIDs or unique prefixes) or old=new,... (ordinals)";

/// Which channel the run's option strings came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionSource {
    /// `criu_plugin_get_options`.
    Host,
    /// `CRIU_PLUGIN_OPTIONS`.
    Environment,
    /// Neither carried any `cuda_plugin.` option.
    None,
}

impl fmt::Display for OptionSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OptionSource::Host => "criu_plugin_get_options",
            OptionSource::Environment => ENV_OPTIONS,
            OptionSource::None => "defaults",
        })
    }
}

/// Where the options came from, for the init log line: the run's channel and the options file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sources {
    pub run: OptionSource,
    /// The options file that was read, if any.
    pub file: Option<PathBuf>,
}

impl fmt::Display for Sources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.run) {
            (None, run) => write!(f, "{run}"),
            (Some(p), OptionSource::None) => write!(f, "{}", p.display()),
            (Some(p), run) => write!(f, "{run} over {}", p.display()),
        }
    }
}

/// What the options file gives [`collect`]: where it is and its option strings (already
/// checked; [`crate::config`] reads the file).
#[derive(Debug, Clone, Copy)]
pub struct FileOptions<'a> {
    pub path: &'a Path,
    pub options: &'a [String],
}

/// Picks the run's channel and combines it with the options file (see the module docs).
/// `host` holds the strings `criu_plugin_get_options` returned after `argv[0]` (`None` when the
/// host lacks the service), `env` the value of [`ENV_OPTIONS`], `file` the options file read.
pub fn collect(
    host: Option<&[String]>,
    env: Option<&str>,
    file: Option<FileOptions<'_>>,
) -> Result<(Options, Sources), OptionError> {
    let run: (Vec<&str>, OptionSource) = match (host, env) {
        (Some(args), _) if args.iter().any(|a| ours(a).is_some()) => (
            args.iter().map(String::as_str).collect(),
            OptionSource::Host,
        ),
        (_, Some(env)) if env.split_whitespace().any(|a| ours(a).is_some()) => {
            (env.split_whitespace().collect(), OptionSource::Environment)
        }
        _ => (Vec::new(), OptionSource::None),
    };
    // The run's strings alone first, so that an error in them is reported as theirs.
    parse(run.0.iter().copied())?;
    let file_strings = file.map_or(&[][..], |f| f.options);
    let options = parse(
        file_strings
            .iter()
            .map(String::as_str)
            .chain(run.0.iter().copied()),
    )?;
    Ok((
        options,
        Sources {
            run: run.1,
            file: file.map(|f| f.path.to_path_buf()),
        },
    ))
}

/// The part after `cuda_plugin.` when `arg` (with or without leading `--`) is in our namespace.
fn ours(arg: &str) -> Option<&str> {
    let a = arg.strip_prefix("--").unwrap_or(arg);
    a.strip_prefix(NAMESPACE)?.strip_prefix('.')
}

/// Parses option strings; strings outside the `cuda_plugin.` namespace are ignored.
pub fn parse<'a>(args: impl IntoIterator<Item = &'a str>) -> Result<Options, OptionError> {
    parse_dyn(&mut args.into_iter())
}

/// [`parse`], compiled once for every kind of iterator (the plugin must stay small).
fn parse_dyn(args: &mut dyn Iterator<Item = &str>) -> Result<Options, OptionError> {
    let mut o = Options::default();
    for arg in args {
        let Some(rest) = ours(arg) else { continue };
        let (name, value) = match rest.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (rest, None),
        };
        let need = |allowed: &'static str| {
            value.ok_or_else(|| OptionError::MissingValue {
                name: name.to_owned(),
                allowed,
            })
        };
        let invalid = |allowed: &'static str, v: &str| OptionError::InvalidValue {
            name: name.to_owned(),
            value: v.to_owned(),
            allowed,
        };
        match name {
            "backend" => {
                let v = need(BackendChoice::allowed())?;
                o.backend =
                    BackendChoice::parse(v).ok_or_else(|| invalid(BackendChoice::allowed(), v))?;
            }
            "device-map" => o.device_map = Some(need(DEVICE_MAP_ALLOWED)?.to_owned()),
            "timeout" => {
                let v = need(TIMEOUT_ALLOWED)?;
                if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(invalid(TIMEOUT_ALLOWED, v));
                }
                let secs: u32 = v.parse().map_err(|_| invalid(TIMEOUT_ALLOWED, v))?;
                o.timeout = Some(if secs == 0 {
                    TimeoutOption::Disabled
                } else {
                    TimeoutOption::Seconds(secs)
                });
            }
            "cuda-checkpoint" => {
                let v = need(PATH_ALLOWED)?;
                if !v.starts_with('/') {
                    return Err(invalid(PATH_ALLOWED, v));
                }
                o.cuda_checkpoint = Some(PathBuf::from(v));
            }
            "check-capacity" => {
                let v = need(ONOFF_ALLOWED)?;
                o.skip_capacity_check = match v {
                    "on" => false,
                    "off" => true,
                    _ => return Err(invalid(ONOFF_ALLOWED, v)),
                };
            }
            "min-copy-rate" => {
                let v = need(RATE_ALLOWED)?;
                o.min_copy_rate = Some(CopyRate::parse(v).ok_or_else(|| invalid(RATE_ALLOWED, v))?);
            }
            "parallel" => {
                let v = need(Parallel::ALLOWED)?;
                o.parallel = Parallel::parse(v).ok_or_else(|| invalid(Parallel::ALLOWED, v))?;
            }
            "custom-storage" => {
                let v = need(CustomStorage::ALLOWED)?;
                o.custom_storage =
                    CustomStorage::parse(v).ok_or_else(|| invalid(CustomStorage::ALLOWED, v))?;
            }
            "guardian" => {
                let v = need(ONOFF_ALLOWED)?;
                o.no_guardian = match v {
                    "on" => false,
                    "off" => true,
                    _ => return Err(invalid(ONOFF_ALLOWED, v)),
                };
            }
            "on-restore-failure" => {
                let v = need(RestoreFailure::ALLOWED)?;
                o.on_restore_failure =
                    RestoreFailure::parse(v).ok_or_else(|| invalid(RestoreFailure::ALLOWED, v))?;
            }
            _ => {
                return Err(OptionError::Unknown {
                    name: name.to_owned(),
                })
            }
        }
    }
    Ok(o)
}

/// Strategies shared by the property tests of this module and [`crate::config`].
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;
    use proptest::prelude::*;

    /// Any valid [`Options`].
    pub(crate) fn arb_options() -> impl Strategy<Value = Options> {
        (
            prop_oneof![
                Just(BackendChoice::Auto),
                Just(BackendChoice::Only(BackendKind::DriverApi)),
                Just(BackendChoice::Only(BackendKind::CudaCheckpoint))
            ],
            proptest::option::of("[A-Za-z0-9=,:-]{0,60}"),
            proptest::option::of(prop_oneof![
                Just(TimeoutOption::Disabled),
                (1u32..).prop_map(TimeoutOption::Seconds)
            ]),
            proptest::option::of("/[A-Za-z0-9._/-]{1,40}"),
            prop_oneof![Just(RestoreFailure::Kill), Just(RestoreFailure::Leave)],
            any::<bool>(),
            proptest::option::of("[1-9][0-9]{0,3}(\\.[0-9]{1,3})?"),
            any::<bool>(),
            prop_oneof![
                Just(Parallel::Unset),
                Just(Parallel::Auto),
                (1u32..=Parallel::MAX).prop_map(Parallel::Width)
            ],
            prop_oneof![
                Just(CustomStorage::Auto),
                Just(CustomStorage::On),
                Just(CustomStorage::Off)
            ],
        )
            .prop_map(
                |(backend, device_map, timeout, cc, orf, skip, rate, no_guardian, parallel, cs)| {
                    Options {
                        backend,
                        device_map,
                        timeout,
                        cuda_checkpoint: cc.map(PathBuf::from),
                        on_restore_failure: orf,
                        skip_capacity_check: skip,
                        min_copy_rate: rate.map(CopyRate),
                        no_guardian,
                        parallel,
                        custom_storage: cs,
                    }
                },
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_rates_read_as_str_parse_reads_them() {
        for v in [
            "1",
            "0.5",
            "2.",
            ".5",
            "10",
            "25.6",
            "0.001",
            "1.1",
            "3.3333",
            "123456789012345",
            "0.000000000000001",
            "999999999999999",
            "007.50",
        ] {
            assert_eq!(decimal(v), v.parse::<f64>().ok(), "{v}");
        }
        for v in [
            "", ".", "1.2.3", "-1", "+1", "1e9", "inf", "NaN", " 1", "1,5", "0x10",
        ] {
            assert_eq!(decimal(v), None, "{v}");
        }
        assert!(CopyRate::parse("0").is_none() && CopyRate::parse("0.0").is_none());
        assert_eq!(
            CopyRate::parse("2.5").map(|r| r.bytes_per_second()),
            Some(2.5e9)
        );
    }

    proptest::proptest! {
        #[test]
        fn decimal_agrees_with_str_parse(v in "[0-9]{0,8}\\.?[0-9]{0,7}") {
            let want = v.parse::<f64>().ok().filter(|_| v.bytes().any(|b| b.is_ascii_digit()));
            proptest::prop_assert_eq!(decimal(&v), want);
        }
    }
    use proptest::prelude::*;

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn defaults_when_nothing_is_given() {
        let (o, src) = collect(None, None, None).unwrap();
        assert_eq!(o, Options::default());
        assert_eq!(src.run, OptionSource::None);
        assert_eq!(o.backend, BackendChoice::Auto);
        assert_eq!(o.effective_timeout(None), Some(DEFAULT_TIMEOUT));
        assert_eq!(
            o.effective_timeout(Some(3)),
            Some(Duration::from_secs(3)),
            "the default follows CRIU's --timeout"
        );
        assert_eq!(o.effective_timeout(Some(0)), None, "criu --timeout 0");
    }

    #[test]
    fn host_argv_takes_only_our_namespace() {
        let argv = strs(&[
            "--amdgpu.foo=bar",
            "--cuda_plugin.backend=driver-api",
            "--cuda_pluginX.backend=nonsense",
            "--cuda_plugin.timeout=0",
            "--cuda_plugin.cuda-checkpoint=/opt/cc",
        ]);
        let (o, src) = collect(Some(&argv), Some("cuda_plugin.backend=auto"), None).unwrap();
        assert_eq!(src.run, OptionSource::Host);
        assert_eq!(o.backend, BackendChoice::Only(BackendKind::DriverApi));
        assert_eq!(o.timeout, Some(TimeoutOption::Disabled));
        assert_eq!(o.effective_timeout(Some(10)), None, "timeout=0 means none");
        assert_eq!(o.cuda_checkpoint, Some(PathBuf::from("/opt/cc")));
    }

    #[test]
    fn environment_is_used_when_the_host_has_nothing_for_us() {
        let argv = strs(&["--other.x=1"]);
        let env = "  --cuda_plugin.backend=cuda-checkpoint\tcuda_plugin.timeout=7 other.y ";
        let (o, src) = collect(Some(&argv), Some(env), None).unwrap();
        assert_eq!(src.run, OptionSource::Environment);
        assert_eq!(o.backend, BackendChoice::Only(BackendKind::CudaCheckpoint));
        assert_eq!(o.effective_timeout(None), Some(Duration::from_secs(7)));
        let (_, src) = collect(None, Some(env), None).unwrap();
        assert_eq!(src.run, OptionSource::Environment, "host lacks the service");
    }

    fn file(lines: &[&str]) -> crate::config::ConfigFile {
        crate::config::ConfigFile {
            path: PathBuf::from("/etc/criu/cuda_plugin.conf"),
            origin: crate::config::Origin::System,
            options: lines.iter().map(|l| format!("cuda_plugin.{l}")).collect(),
        }
    }

    #[test]
    fn the_file_is_the_base_and_the_run_overrides_what_it_names() {
        let f = file(&[
            "backend=cuda-checkpoint",
            "cuda-checkpoint=/opt/cc",
            "timeout=30",
        ]);
        // The file alone.
        let (o, src) = collect(None, None, Some(f.as_options())).unwrap();
        assert_eq!(o.backend, BackendChoice::Only(BackendKind::CudaCheckpoint));
        assert_eq!(o.timeout, Some(TimeoutOption::Seconds(30)));
        assert_eq!(src.to_string(), "/etc/criu/cuda_plugin.conf");
        // CRIU_PLUGIN_OPTIONS overrides the timeout only.
        let (o, src) = collect(None, Some("cuda_plugin.timeout=5"), Some(f.as_options())).unwrap();
        assert_eq!(o.timeout, Some(TimeoutOption::Seconds(5)), "the run wins");
        assert_eq!(
            o.backend,
            BackendChoice::Only(BackendKind::CudaCheckpoint),
            "the file's backend stays"
        );
        assert_eq!(o.cuda_checkpoint, Some(PathBuf::from("/opt/cc")));
        assert_eq!(
            src.to_string(),
            "CRIU_PLUGIN_OPTIONS over /etc/criu/cuda_plugin.conf"
        );
        // CRIU's own options win over both; the environment is then ignored as a whole.
        let host = strs(&["--cuda_plugin.backend=driver-api"]);
        let (o, src) = collect(
            Some(&host),
            Some("cuda_plugin.timeout=5 cuda_plugin.guardian=off"),
            Some(f.as_options()),
        )
        .unwrap();
        assert_eq!(o.backend, BackendChoice::Only(BackendKind::DriverApi));
        assert_eq!(
            o.timeout,
            Some(TimeoutOption::Seconds(30)),
            "the file's, not the env's"
        );
        assert!(
            !o.no_guardian,
            "CRIU_PLUGIN_OPTIONS is not read when CRIU hands options over"
        );
        assert_eq!(src.run, OptionSource::Host);
        // Foreign strings of the run do not count as the run's options.
        let (o, src) = collect(None, Some("amdgpu.x=1"), Some(f.as_options())).unwrap();
        assert_eq!(
            (o.backend, src.run),
            (
                BackendChoice::Only(BackendKind::CudaCheckpoint),
                OptionSource::None
            )
        );
        // An error in the run's options is the run's, even with a valid file.
        let e = collect(None, Some("cuda_plugin.timeout=soon"), Some(f.as_options())).unwrap_err();
        assert!(matches!(e, OptionError::InvalidValue { ref name, .. } if name == "timeout"));
        // Without a file nothing changes.
        let (o, src) = collect(None, None, None).unwrap();
        assert_eq!(
            (o, src.to_string()),
            (Options::default(), "defaults".to_owned())
        );
    }

    #[test]
    fn last_repeat_wins_and_device_map_is_kept_raw() {
        let o = parse([
            "cuda_plugin.backend=driver-api",
            "cuda_plugin.device-map=GPU-a=GPU-b,x=y",
            "cuda_plugin.backend=auto",
        ])
        .unwrap();
        assert_eq!(o.backend, BackendChoice::Auto);
        assert_eq!(o.device_map.as_deref(), Some("GPU-a=GPU-b,x=y"));
    }

    #[test]
    fn errors_name_the_option_and_the_allowed_values() {
        let e = parse(["--cuda_plugin.backend=cuda"]).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("cuda_plugin.backend"), "{m}");
        assert!(m.contains("auto, driver-api, cuda-checkpoint"), "{m}");
        for bad in ["-1", "1.5", "", "ten", "99999999999"] {
            let e = parse([format!("cuda_plugin.timeout={bad}").as_str()]).unwrap_err();
            assert!(
                matches!(e, OptionError::InvalidValue { ref name, .. } if name == "timeout"),
                "timeout={bad} must be rejected, got {e:?}"
            );
        }
        assert!(matches!(
            parse(["cuda_plugin.backend"]).unwrap_err(),
            OptionError::MissingValue { .. }
        ));
        assert!(matches!(
            parse(["cuda_plugin.cuda-checkpoint="]).unwrap_err(),
            OptionError::InvalidValue { .. }
        ));
        let e = parse(["cuda_plugin.cuda-checkpoint=bin/cuda-checkpoint"]).unwrap_err();
        assert!(
            e.to_string().contains("an absolute file path"),
            "a relative path would be resolved in the image directory: {e}"
        );
        let e = parse(["cuda_plugin.on-restore-failure=ignore"]).unwrap_err();
        assert!(e.to_string().contains("kill, leave"), "{e}");
        assert_eq!(
            parse(["cuda_plugin.on-restore-failure=leave"])
                .unwrap()
                .on_restore_failure,
            RestoreFailure::Leave
        );
        for bad in ["0", "-1", "x", "1e3", "", "inf"] {
            assert!(
                parse([format!("cuda_plugin.min-copy-rate={bad}").as_str()]).is_err(),
                "min-copy-rate={bad}"
            );
        }
        let o = parse(["cuda_plugin.min-copy-rate=2.5"]).unwrap();
        assert_eq!(o.min_copy_rate.unwrap().bytes_per_second(), 2.5e9);
        assert!(
            parse(["cuda_plugin.check-capacity=off"])
                .unwrap()
                .skip_capacity_check
        );
        assert!(parse(["cuda_plugin.check-capacity=no"]).is_err());
        let long = format!("cuda_plugin.backend={}", "x".repeat(20_000));
        let m = parse([long.as_str()]).unwrap_err().to_string();
        assert!(
            m.len() < 600 && m.contains("20000 bytes"),
            "a long value is quoted by length: {} bytes",
            m.len()
        );
        let e = parse(["--cuda_plugin.backnd=auto"]).unwrap_err();
        assert_eq!(
            e,
            OptionError::Unknown {
                name: "backnd".into()
            }
        );
        assert!(matches!(
            parse(["cuda_plugin.=x"]).unwrap_err(),
            OptionError::Unknown { .. }
        ));
    }

    use super::tests_support::arb_options;

    proptest! {
        #[test]
        fn render_then_parse_round_trips(o in arb_options(), dashes in any::<bool>()) {
            let strings: Vec<String> = o
                .to_strings()
                .into_iter()
                .map(|s| if dashes { format!("--{s}") } else { s })
                .collect();
            prop_assert_eq!(parse(strings.iter().map(String::as_str)).unwrap(), o.clone());
            // The same strings through the environment (no whitespace inside values here).
            let env = strings.join(" ");
            let (p, src) = collect(None, Some(&env), None).unwrap();
            prop_assert_eq!(p, o);
            prop_assert_eq!(src.run, OptionSource::Environment);
        }

        #[test]
        fn foreign_options_are_ignored(o in arb_options(), foreign in proptest::collection::vec("--[a-z_]{1,12}\\.[a-z-]{1,10}=[ -~]{0,10}", 0..5)) {
            let mut argv: Vec<String> = foreign.iter().filter(|f| ours(f).is_none()).cloned().collect();
            let n = argv.len();
            argv.extend(o.to_strings().into_iter().map(|s| format!("--{s}")));
            argv.rotate_left(n / 2);
            let (p, _) = collect(Some(&argv), None, None).unwrap();
            prop_assert_eq!(p, o);
        }

        #[test]
        fn each_option_the_run_names_overrides_the_file(a in arb_options(), b in arb_options(), host in any::<bool>()) {
            let f = crate::config::ConfigFile {
                path: PathBuf::from("/x/cuda_plugin.conf"),
                origin: crate::config::Origin::BesidePlugin,
                options: a.to_strings(),
            };
            let run = b.to_strings();
            let (got, src) = if host {
                let argv: Vec<String> = run.iter().map(|s| format!("--{s}")).collect();
                collect(Some(&argv), None, Some(f.as_options())).unwrap()
            } else {
                collect(None, Some(&run.join(" ")), Some(f.as_options())).unwrap()
            };
            // `to_strings` always names these five, and the others only when set.
            let want = Options {
                backend: b.backend,
                device_map: b.device_map.clone().or(a.device_map.clone()),
                timeout: b.timeout.or(a.timeout),
                cuda_checkpoint: b.cuda_checkpoint.clone().or(a.cuda_checkpoint.clone()),
                on_restore_failure: b.on_restore_failure,
                skip_capacity_check: b.skip_capacity_check,
                min_copy_rate: b.min_copy_rate.clone().or(a.min_copy_rate.clone()),
                no_guardian: b.no_guardian,
                parallel: if b.parallel == Parallel::Unset { a.parallel } else { b.parallel },
                custom_storage: b.custom_storage,
            };
            prop_assert_eq!(got, want);
            prop_assert_eq!(src.file, Some(PathBuf::from("/x/cuda_plugin.conf")));
            // The file alone gives exactly the file's options.
            let (alone, _) = collect(None, None, Some(f.as_options())).unwrap();
            prop_assert_eq!(alone, a);
        }

        #[test]
        fn parser_never_panics(args in proptest::collection::vec("\\PC{0,40}", 0..6)) {
            let _ = parse(args.iter().map(String::as_str));
            let joined = args.join(" ");
            let _ = collect(Some(&args), Some(&joined), None);
        }

        #[test]
        fn timeout_accepts_exactly_the_u32_decimals(n in any::<u64>()) {
            let r = parse([format!("cuda_plugin.timeout={n}").as_str()]);
            if n <= u64::from(u32::MAX) {
                let want = if n == 0 { TimeoutOption::Disabled } else { TimeoutOption::Seconds(n as u32) };
                prop_assert_eq!(r.unwrap().timeout, Some(want));
            } else {
                prop_assert!(r.is_err());
            }
        }
    }

    #[test]
    fn parallel_takes_auto_or_a_width() {
        // The default is auto since issue 29 (it was one at a time): one lock after another
        // does not fit CRIU's freeze alarm for large trees and cannot lock a collective's ranks.
        assert_eq!(Options::default().parallel.width(), 16, "auto by default");
        let o = parse(["cuda_plugin.parallel=auto"]).unwrap();
        assert_eq!(o.parallel, Parallel::Auto);
        assert_eq!(o.parallel.width(), 16);
        assert_eq!(
            parse(["cuda_plugin.parallel=8"]).unwrap().parallel.width(),
            8
        );
        assert_eq!(
            parse(["cuda_plugin.parallel=1"]).unwrap().parallel.width(),
            1
        );
        for bad in ["0", "65", "-1", "", "two", "+4", "08x", "100"] {
            let e = parse([format!("cuda_plugin.parallel={bad}").as_str()]).unwrap_err();
            assert!(
                e.to_string()
                    .contains("auto, or a whole number from 1 to 64"),
                "parallel={bad}: {e}"
            );
        }
    }

    #[test]
    fn published_option_metadata_names_exactly_the_parsed_options() {
        let samples = [
            "auto",
            "0=0",
            "5",
            "/bin/true",
            "leave",
            "off",
            "2.5",
            "on",
            "off",
            "auto",
        ];
        assert_eq!(samples.len(), DOCS.len());
        for (doc, value) in DOCS.iter().zip(samples) {
            let name = doc.name.to_str().unwrap();
            let arg = format!("--cuda_plugin.{name}={value}");
            assert!(
                parse([arg.as_str()]).is_ok(),
                "{arg} is documented but rejected"
            );
        }
        assert!(matches!(
            parse(["--cuda_plugin.undocumented=1"]),
            Err(OptionError::Unknown { .. })
        ));
    }
}
