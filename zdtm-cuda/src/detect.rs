//! What the machine offers: NVIDIA driver, GPUs, nvcc (or prebuilt workloads), cuBLAS, CRIU 4.0+
//! and root. Every probe goes through [`Probe`], whose filesystem root and command runner are
//! injectable, so the logic is tested without a GPU.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::toolchain::{self, Nvcc, NvccLookup};
use crate::workloads::Workload;

/// Runs a helper program (`nvidia-smi`, `criu --version`, `ldconfig -p`) and returns its stdout
/// when it exits 0.
pub trait CommandRunner: fmt::Debug {
    /// `prog args...`'s standard output, or `None` when it cannot run or fails.
    fn stdout(&self, prog: &Path, args: &[&str]) -> Option<String>;
}

/// The real [`CommandRunner`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemRunner;

impl CommandRunner for SystemRunner {
    fn stdout(&self, prog: &Path, args: &[&str]) -> Option<String> {
        let o = Command::new(prog)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()?;
        o.status
            .success()
            .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
    }
}

/// The inputs of detection.
#[derive(Debug)]
pub struct Probe {
    /// Prefix for `/proc/driver/nvidia/...` (normally `/`).
    pub root: PathBuf,
    /// `$PATH`, for `nvidia-smi` and `criu`.
    pub path_var: Option<OsString>,
    /// The effective uid.
    pub euid: u32,
    /// How to find nvcc.
    pub nvcc: NvccLookup,
    /// Prebuilt workload directory (`--prebuilt`), used instead of nvcc.
    pub prebuilt: Option<PathBuf>,
    /// `--criu`.
    pub criu: Option<PathBuf>,
    /// `target/criu/versions` of `scripts/fetch-criu.sh` (`<version> <wrapper>` lines).
    pub criu_versions: Option<PathBuf>,
    /// Directories searched for `libcublas.so*` before `ldconfig -p`.
    pub lib_dirs: Vec<PathBuf>,
    /// This program, run as `<self_exe> cuda-driver` to ask `libcuda.so.1` for its CUDA
    /// version in a process of its own (`None`: only `nvidia-smi` is asked).
    pub self_exe: Option<PathBuf>,
    /// Runs helper programs.
    pub runner: Box<dyn CommandRunner>,
}

impl Probe {
    /// The probe of this process and machine.
    #[must_use]
    pub fn system(criu: Option<PathBuf>, prebuilt: Option<PathBuf>) -> Self {
        let nvcc = NvccLookup::from_env();
        let mut lib_dirs = Vec::new();
        if let Some(tc) = &nvcc.toolchain_dir {
            lib_dirs.extend(toolchain::wheel_paths(tc, "lib"));
        }
        if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
            lib_dirs.extend(std::env::split_paths(&v));
        }
        lib_dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
        Probe {
            root: PathBuf::from("/"),
            path_var: std::env::var_os("PATH"),
            euid: nix::unistd::geteuid().as_raw(),
            nvcc,
            prebuilt,
            criu,
            criu_versions: Some(toolchain::workspace_root().join("target/criu/versions")),
            lib_dirs,
            // Only the zdtm-cuda program has the `cuda-driver` subcommand: any other program
            // (a test binary using this library) would run itself again, and again.
            self_exe: std::env::current_exe()
                .ok()
                .filter(|p| p.file_name().is_some_and(|n| n == "zdtm-cuda")),
            runner: Box::new(SystemRunner),
        }
    }

    fn in_path(&self, name: &str) -> Option<PathBuf> {
        let path = self.path_var.as_ref()?;
        std::env::split_paths(path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    }
}

/// The NVIDIA driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driver {
    /// E.g. `580.65.06`.
    pub version: String,
    /// Where the version came from.
    pub source: String,
}

/// A usable CRIU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Criu {
    /// The executable (or wrapper).
    pub path: PathBuf,
    /// `criu --version`'s `Version:`.
    pub version: String,
}

/// The CUDA version of the driver (`cuDriverGetVersion`) and whether it has custom storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDriver {
    /// `cuDriverGetVersion`'s number, e.g. 13040 for CUDA 13.4.
    pub version: u32,
    /// Whether `cuGetProcAddress("cuCheckpointOperationComplete", 13040)` resolves (`None`:
    /// not probed, the version came from `nvidia-smi`).
    pub operation_complete: Option<bool>,
    /// Where the version came from.
    pub source: String,
}

/// The first driver version with custom storage (CUDA 13.4).
pub const CUSTOM_STORAGE_MIN_CUDA: u32 = 13040;

/// `13040` -> `13.4` (`cuDriverGetVersion`'s encoding: 1000 * major + 10 * minor).
#[must_use]
pub fn cuda_version_str(v: u32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

impl CudaDriver {
    /// Why custom storage cannot run on this driver, or `None` when it can.
    #[must_use]
    pub fn custom_storage_blocker(&self) -> Option<String> {
        if self.version < CUSTOM_STORAGE_MIN_CUDA {
            return Some(format!(
                "custom storage needs a CUDA 13.4 driver; this one reports {}",
                cuda_version_str(self.version)
            ));
        }
        if self.operation_complete == Some(false) {
            return Some(format!(
                "custom storage needs cuCheckpointOperationComplete; this driver reports {} but cuGetProcAddress(\"cuCheckpointOperationComplete\", 13040) does not resolve it",
                cuda_version_str(self.version)
            ));
        }
        None
    }
}

/// The output of `zdtm-cuda cuda-driver` (`cuda_driver_version=13040` and
/// `checkpoint_operation_complete=yes|no` lines) -> the driver.
#[must_use]
pub fn parse_cuda_driver_probe(text: &str, source: &str) -> Option<CudaDriver> {
    let mut version = None;
    let mut complete = None;
    for l in text.lines().map(str::trim) {
        if let Some(v) = l.strip_prefix("cuda_driver_version=") {
            version = v.parse().ok();
        } else if let Some(c) = l.strip_prefix("checkpoint_operation_complete=") {
            complete = match c {
                "yes" => Some(true),
                "no" => Some(false),
                _ => None,
            };
        }
    }
    Some(CudaDriver {
        version: version.filter(|&v| v > 0)?,
        operation_complete: complete,
        source: source.to_owned(),
    })
}

/// `nvidia-smi`'s banner (`... Driver Version: 580.65.06  CUDA Version: 13.0 ...`) -> 13000.
#[must_use]
pub fn parse_smi_cuda_version(text: &str) -> Option<u32> {
    let rest = &text[text.find("CUDA Version")? + "CUDA Version".len()..];
    let v = rest
        .trim_start_matches([' ', ':'])
        .split_whitespace()
        .next()?;
    let v = v.trim_end_matches('|');
    let (major, minor) = v.split_once('.')?;
    let (major, minor): (u32, u32) = (major.parse().ok()?, minor.parse().ok()?);
    (minor < 100).then_some(major * 1000 + minor * 10)
}

/// Asks `libcuda.so.1` (in this process) for `cuDriverGetVersion` and, from 13.4, whether
/// `cuGetProcAddress_v2("cuCheckpointOperationComplete", 13040)` resolves; no `cuInit`. The
/// body of the hidden `zdtm-cuda cuda-driver` subcommand, printed as
/// `cuda_driver_version=N` and `checkpoint_operation_complete=yes|no`.
///
/// # Errors
/// Why the library or its entry points cannot be had.
pub fn probe_libcuda() -> Result<(u32, bool), String> {
    use std::ffi::{c_char, c_int, c_void};
    type DriverGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
    type GetProcAddressV2 =
        unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;
    // SAFETY: loading the NVIDIA driver library runs its initialisers, which have no
    // preconditions; nothing else in this process uses it.
    let lib = unsafe { libloading::Library::new("libcuda.so.1") }
        .map_err(|e| format!("cannot load libcuda.so.1: {e}"))?;
    // SAFETY: `cuDriverGetVersion` has the C signature `CUresult (int *)`.
    let get_version = unsafe { lib.get::<DriverGetVersion>(b"cuDriverGetVersion\0") }
        .map_err(|e| format!("libcuda.so.1 has no cuDriverGetVersion: {e}"))?;
    let mut v: c_int = 0;
    // SAFETY: it writes one int through a valid pointer.
    let r = unsafe { get_version(&mut v) };
    if r != 0 || v <= 0 {
        return Err(format!("cuDriverGetVersion failed (CUresult {r})"));
    }
    let version = u32::try_from(v).unwrap_or(0);
    if version < CUSTOM_STORAGE_MIN_CUDA {
        return Ok((version, false));
    }
    // SAFETY: `cuGetProcAddress_v2` has the C signature `CUresult (const char *, void **, int,
    // cuuint64_t, CUdriverProcAddressQueryResult *)`.
    let Ok(gpa) = (unsafe { lib.get::<GetProcAddressV2>(b"cuGetProcAddress_v2\0") }) else {
        return Ok((version, false));
    };
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut status: c_int = 0;
    // SAFETY: a NUL-terminated name and valid out-pointers; flags 0 is the default query.
    let r = unsafe {
        gpa(
            c"cuCheckpointOperationComplete".as_ptr(),
            &mut pfn,
            13040,
            0,
            &mut status,
        )
    };
    Ok((version, r == 0 && !pfn.is_null()))
}

/// A found thing, or the exact reason it is missing.
pub type Found<T> = Result<T, String>;

/// Everything [`detect`] found out.
#[derive(Debug, Clone)]
pub struct Detection {
    /// The NVIDIA driver.
    pub driver: Found<Driver>,
    /// The GPU count (at least 1), or why there is none.
    pub gpus: Found<u32>,
    /// nvcc.
    pub nvcc: Found<Nvcc>,
    /// The prebuilt workload directory, when one was given.
    pub prebuilt: Option<Found<PathBuf>>,
    /// A loadable cuBLAS.
    pub cublas: Found<PathBuf>,
    /// CRIU 4.0 or newer.
    pub criu: Found<Criu>,
    /// Running as root.
    pub root: Found<()>,
    /// The driver's CUDA version (decides the custom-storage cases).
    pub cuda: Found<CudaDriver>,
}

/// `NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ...` (or the
/// `Open Kernel Module for x86_64` spelling) -> `580.65.06`.
#[must_use]
pub fn parse_proc_driver_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| {
            w.contains('.')
                && w.chars().all(|c| c.is_ascii_digit() || c == '.')
                && w.starts_with(|c: char| c.is_ascii_digit())
        })
        .map(str::to_owned)
}

/// `criu --version` output (`Version: 4.1.1`, maybe followed by `GitID: ...`) -> `4.1.1`.
#[must_use]
pub fn parse_criu_version(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Version:"))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// Whether a CRIU version string is 4.0 or newer.
#[must_use]
pub fn criu_version_ok(v: &str) -> bool {
    let mut parts = v.split(['.', '-']).map(|p| p.parse::<u32>().ok());
    matches!(parts.next(), Some(Some(major)) if major >= 4)
}

fn detect_driver(p: &Probe) -> Found<Driver> {
    let f = p.root.join("proc/driver/nvidia/version");
    if let Ok(text) = std::fs::read_to_string(&f) {
        return parse_proc_driver_version(&text)
            .map(|version| Driver {
                version,
                source: f.display().to_string(),
            })
            .ok_or_else(|| format!("{} has no NVRM version line", f.display()));
    }
    let Some(smi) = p.in_path("nvidia-smi") else {
        return Err(format!(
            "no NVIDIA driver: {} is missing and nvidia-smi is not in PATH",
            f.display()
        ));
    };
    match p.runner.stdout(
        &smi,
        &["--query-gpu=driver_version", "--format=csv,noheader"],
    ) {
        Some(out) => out
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(|v| Driver {
                version: v.to_owned(),
                source: smi.display().to_string(),
            })
            .ok_or_else(|| format!("{} reported no driver version", smi.display())),
        None => Err(format!(
            "no NVIDIA driver: {} is missing and {} failed",
            f.display(),
            smi.display()
        )),
    }
}

fn detect_cuda(p: &Probe) -> Found<CudaDriver> {
    let mut why = Vec::new();
    if let Some(exe) = &p.self_exe {
        match p.runner.stdout(exe, &["cuda-driver"]) {
            Some(out) => {
                if let Some(d) = parse_cuda_driver_probe(&out, "libcuda.so.1") {
                    return Ok(d);
                }
                why.push("libcuda.so.1: no version in the probe's output".to_owned());
            }
            None => why.push("libcuda.so.1 could not be asked (cuDriverGetVersion)".to_owned()),
        }
    }
    match p.in_path("nvidia-smi") {
        Some(smi) => match p.runner.stdout(&smi, &[]) {
            Some(out) => match parse_smi_cuda_version(&out) {
                Some(version) => {
                    return Ok(CudaDriver {
                        version,
                        operation_complete: None,
                        source: smi.display().to_string(),
                    })
                }
                None => why.push(format!("{} shows no CUDA Version", smi.display())),
            },
            None => why.push(format!("{} failed", smi.display())),
        },
        None => why.push("nvidia-smi is not in PATH".to_owned()),
    }
    Err(format!("CUDA version unknown: {}", why.join("; ")))
}

fn detect_gpus(p: &Probe) -> Found<u32> {
    let d = p.root.join("proc/driver/nvidia/gpus");
    if let Ok(rd) = std::fs::read_dir(&d) {
        let n = rd.flatten().filter(|e| e.path().is_dir()).count();
        return match u32::try_from(n) {
            Ok(0) => Err(format!("no GPU: {} is empty", d.display())),
            Ok(n) => Ok(n),
            Err(_) => Err(format!("implausible GPU count {n}")),
        };
    }
    let Some(smi) = p.in_path("nvidia-smi") else {
        return Err(format!(
            "no GPU: {} is missing and nvidia-smi is not in PATH",
            d.display()
        ));
    };
    let out = p
        .runner
        .stdout(&smi, &["-L"])
        .ok_or_else(|| format!("no GPU: {} -L failed", smi.display()))?;
    let n = out.lines().filter(|l| l.starts_with("GPU ")).count();
    match u32::try_from(n) {
        Ok(0) => Err(format!("no GPU: {} -L lists none", smi.display())),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("implausible GPU count {n}")),
    }
}

/// The cuBLAS sonames the cuBLAS workload tries, newest first.
pub const CUBLAS_SONAMES: &[&str] = &["libcublas.so.13", "libcublas.so.12", "libcublas.so"];

fn detect_cublas(p: &Probe) -> Found<PathBuf> {
    for dir in &p.lib_dirs {
        for so in CUBLAS_SONAMES {
            let f = dir.join(so);
            if f.exists() {
                return Ok(f);
            }
        }
    }
    let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .or_else(|| p.in_path("ldconfig"));
    if let Some(out) = ldconfig.as_ref().and_then(|l| p.runner.stdout(l, &["-p"])) {
        for so in CUBLAS_SONAMES {
            // "\tlibcublas.so.12 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcublas.so.12"
            if let Some(line) = out
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{so} ")))
            {
                if let Some((_, path)) = line.split_once("=>") {
                    return Ok(PathBuf::from(path.trim()));
                }
            }
        }
    }
    let dirs: Vec<String> = p.lib_dirs.iter().map(|d| d.display().to_string()).collect();
    Err(format!(
        "cuBLAS not found: none of {} in [{}] or in ldconfig's cache (install the nvidia-cublas wheel: scripts/zdtm-cuda-toolchain.sh --with-cublas)",
        CUBLAS_SONAMES.join(", "),
        dirs.join(", ")
    ))
}

fn detect_criu(p: &Probe) -> Found<Criu> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(c) = &p.criu {
        candidates.push(c.clone());
    } else {
        candidates.extend(p.in_path("criu"));
        if let Some(v) = &p.criu_versions {
            if let Ok(text) = std::fs::read_to_string(v) {
                // Sorted ascending by fetch-criu.sh: prefer the newest.
                let mut lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
                lines.reverse();
                candidates.extend(
                    lines
                        .iter()
                        .filter_map(|l| l.split_once(' ').map(|(_, w)| PathBuf::from(w.trim()))),
                );
            }
        }
    }
    if candidates.is_empty() {
        return Err(
            "CRIU not found: no --criu, no criu in PATH, no target/criu/versions (run scripts/fetch-criu.sh)"
                .to_owned(),
        );
    }
    let mut reasons = Vec::new();
    for c in candidates {
        match p.runner.stdout(&c, &["--version"]) {
            None => reasons.push(format!("{}: '--version' failed", c.display())),
            Some(out) => match parse_criu_version(&out) {
                None => reasons.push(format!("{}: no 'Version:' in --version", c.display())),
                Some(v) if criu_version_ok(&v) => {
                    return Ok(Criu {
                        path: c,
                        version: v,
                    })
                }
                Some(v) => reasons.push(format!("{} is CRIU {v}, need 4.0 or newer", c.display())),
            },
        }
    }
    Err(reasons.join("; "))
}

/// Probes everything.
#[must_use]
pub fn detect(p: &Probe) -> Detection {
    Detection {
        driver: detect_driver(p),
        gpus: detect_gpus(p),
        nvcc: toolchain::find_nvcc(&p.nvcc).map_err(|e| e.to_string()),
        prebuilt: p.prebuilt.as_ref().map(|d| {
            toolchain::check_prebuilt(d, crate::workloads::ALL)
                .map(|()| d.clone())
                .map_err(|missing| {
                    format!(
                        "prebuilt directory {} lacks {}",
                        d.display(),
                        missing.join(", ")
                    )
                })
        }),
        cublas: detect_cublas(p),
        criu: detect_criu(p),
        root: if p.euid == 0 {
            Ok(())
        } else {
            Err(format!(
                "not root (euid {}): CRIU needs root to dump and restore",
                p.euid
            ))
        },
        cuda: detect_cuda(p),
    }
}

impl Detection {
    /// Whether workloads can be had: a prebuilt directory when one was given, else nvcc.
    pub fn workloads(&self) -> Found<String> {
        match &self.prebuilt {
            Some(Ok(d)) => Ok(format!("prebuilt in {}", d.display())),
            Some(Err(e)) => Err(e.clone()),
            None => self
                .nvcc
                .as_ref()
                .map(|n| format!("{} ({})", n.path.display(), n.source.label()))
                .map_err(Clone::clone),
        }
    }

    /// One `(name, Ok(detail) | Err(reason))` row per probe, for the report.
    #[must_use]
    pub fn rows(&self) -> Vec<(&'static str, Found<String>)> {
        let gpus = self
            .gpus
            .as_ref()
            .map(|n| n.to_string())
            .map_err(Clone::clone);
        vec![
            (
                "driver",
                self.driver
                    .as_ref()
                    .map(|d| format!("{} ({})", d.version, d.source))
                    .map_err(Clone::clone),
            ),
            ("gpus", gpus),
            (
                "cuda",
                self.cuda
                    .as_ref()
                    .map(|c| {
                        let cs = match c.custom_storage_blocker() {
                            None => "custom storage".to_owned(),
                            Some(_) => "no custom storage".to_owned(),
                        };
                        let probe = match c.operation_complete {
                            Some(true) => ", cuCheckpointOperationComplete resolves",
                            Some(false) if c.version >= CUSTOM_STORAGE_MIN_CUDA => {
                                ", cuCheckpointOperationComplete does not resolve"
                            }
                            _ => "",
                        };
                        format!(
                            "{} ({}; {cs}{probe}; {})",
                            cuda_version_str(c.version),
                            c.version,
                            c.source
                        )
                    })
                    .map_err(Clone::clone),
            ),
            ("workloads", self.workloads()),
            (
                "cublas",
                self.cublas
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .map_err(Clone::clone),
            ),
            (
                "criu",
                self.criu
                    .as_ref()
                    .map(|c| format!("{} ({})", c.version, c.path.display()))
                    .map_err(Clone::clone),
            ),
            (
                "root",
                self.root
                    .as_ref()
                    .map(|()| "yes".to_owned())
                    .map_err(Clone::clone),
            ),
        ]
    }

    /// Why `w` cannot run here, or `None` when it can. Checked in order: root, CRIU, driver,
    /// GPUs, workloads, cuBLAS, GPU count.
    #[must_use]
    pub fn skip_reason(&self, w: &Workload) -> Option<String> {
        if let Err(e) = &self.root {
            return Some(e.clone());
        }
        if let Err(e) = &self.criu {
            return Some(e.clone());
        }
        if let Err(e) = &self.driver {
            return Some(e.clone());
        }
        let gpus = match &self.gpus {
            Ok(n) => *n,
            Err(e) => return Some(e.clone()),
        };
        if let Err(e) = self.workloads() {
            return Some(e);
        }
        if w.needs_cublas {
            if let Err(e) = &self.cublas {
                return Some(e.clone());
            }
        }
        if gpus < w.min_gpus {
            return Some(format!(
                "needs {} GPUs, this machine has {gpus}",
                w.min_gpus
            ));
        }
        None
    }

    /// Why the `custom-storage=on` case cannot run here (with `backend`), or `None` when it
    /// can: it needs the driver-API backend (or the plugin's choice) on a driver that reports
    /// CUDA 13.4 or newer. An unknown CUDA version is a reason too, never a silent drop.
    #[must_use]
    pub fn custom_storage_skip(&self, backend: crate::runner::Backend) -> Option<String> {
        if backend == crate::runner::Backend::CudaCheckpoint {
            return Some(
                "custom storage needs the driver-api backend; cuda-checkpoint has none".to_owned(),
            );
        }
        match &self.cuda {
            Ok(c) => c.custom_storage_blocker(),
            Err(e) => Some(format!("custom storage needs a CUDA 13.4 driver; {e}")),
        }
    }

    /// The report of `zdtm-cuda detect`: one line per probe.
    #[must_use]
    pub fn render(&self) -> String {
        let mut s = String::new();
        for (name, r) in self.rows() {
            match r {
                Ok(d) => s.push_str(&format!("{name:<10} ok    {d}\n")),
                Err(e) => s.push_str(&format!("{name:<10} SKIP  {e}\n")),
            }
        }
        s
    }
}
