//! Finding `nvcc` and building the workloads with it.
//!
//! `nvcc` is looked up, in order: `$NVCC`, `nvcc` in `PATH`, `/usr/local/cuda/bin/nvcc`, and the
//! Python-wheel toolchain that `scripts/zdtm-cuda-toolchain.sh` installs under
//! `target/cuda-toolchain` (`nvidia/cu*/bin/nvcc`; override the directory with
//! `$ZDTM_CUDA_TOOLCHAIN`). No GPU is needed to build: the runtime is linked statically and
//! cuBLAS is loaded at run time.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::workloads::{Workload, HEADER};

/// Where an `nvcc` was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvccSource {
    /// `$NVCC` (or `--nvcc`).
    Env,
    /// `nvcc` in `PATH`.
    Path,
    /// `/usr/local/cuda/bin/nvcc`.
    CudaHome,
    /// The Python-wheel toolchain directory.
    Wheels,
}

impl NvccSource {
    /// A short label for reports.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            NvccSource::Env => "$NVCC",
            NvccSource::Path => "PATH",
            NvccSource::CudaHome => "/usr/local/cuda",
            NvccSource::Wheels => "wheels",
        }
    }
}

/// A usable `nvcc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nvcc {
    /// The executable.
    pub path: PathBuf,
    /// How it was found.
    pub source: NvccSource,
}

/// The inputs of the `nvcc` lookup (injectable for tests).
#[derive(Debug, Clone, Default)]
pub struct NvccLookup {
    /// `$NVCC` or `--nvcc`.
    pub explicit: Option<PathBuf>,
    /// `$PATH`.
    pub path_var: Option<OsString>,
    /// The CUDA installation (normally `/usr/local/cuda`).
    pub cuda_home: Option<PathBuf>,
    /// The wheel toolchain directory (normally `target/cuda-toolchain`).
    pub toolchain_dir: Option<PathBuf>,
}

impl NvccLookup {
    /// The lookup of this process: `$NVCC`, `$PATH`, `/usr/local/cuda`, [`default_toolchain_dir`].
    #[must_use]
    pub fn from_env() -> Self {
        NvccLookup {
            explicit: std::env::var_os("NVCC")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            path_var: std::env::var_os("PATH"),
            cuda_home: Some(PathBuf::from("/usr/local/cuda")),
            toolchain_dir: Some(default_toolchain_dir()),
        }
    }
}

/// Why no `nvcc` (or no build) is available.
#[derive(Debug, thiserror::Error)]
pub enum ToolchainError {
    #[error("nvcc {0} (from $NVCC or --nvcc) is not an executable file")]
    ExplicitNotExecutable(PathBuf),
    #[error("nvcc not found (looked at {looked}); run scripts/zdtm-cuda-toolchain.sh or set NVCC")]
    NotFound { looked: String },
    #[error("cannot create {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run {nvcc}: {source}")]
    Spawn {
        nvcc: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{failed} of {total} workload(s) failed to compile: {names}")]
    Compile {
        failed: usize,
        total: usize,
        names: String,
        /// Per workload: its name and nvcc's output.
        logs: Vec<(String, String)>,
    },
    #[error("invalid GPU architecture {0:?} (want a number such as 80 or 90, or sm_90)")]
    Arch(String),
}

/// The workspace's `target/cuda-toolchain` (or `$ZDTM_CUDA_TOOLCHAIN`).
#[must_use]
pub fn default_toolchain_dir() -> PathBuf {
    std::env::var_os("ZDTM_CUDA_TOOLCHAIN")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/cuda-toolchain"))
}

/// The workspace root this crate was built in.
#[must_use]
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The `nvidia/cu*/<rel>` paths under a wheel toolchain directory, newest CUDA major first.
#[must_use]
pub fn wheel_paths(toolchain_dir: &Path, rel: &str) -> Vec<PathBuf> {
    let mut majors: Vec<(u32, PathBuf)> = std::fs::read_dir(toolchain_dir.join("nvidia"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let major = name.strip_prefix("cu")?.parse::<u32>().ok()?;
            Some((major, e.path().join(rel)))
        })
        .collect();
    majors.sort_by_key(|m| std::cmp::Reverse(m.0));
    majors.into_iter().map(|(_, p)| p).collect()
}

/// Finds `nvcc` (see the module documentation for the order).
pub fn find_nvcc(l: &NvccLookup) -> Result<Nvcc, ToolchainError> {
    if let Some(p) = &l.explicit {
        return if is_executable(p) {
            Ok(Nvcc {
                path: p.clone(),
                source: NvccSource::Env,
            })
        } else {
            Err(ToolchainError::ExplicitNotExecutable(p.clone()))
        };
    }
    let mut looked = Vec::new();
    if let Some(path) = &l.path_var {
        for dir in std::env::split_paths(path) {
            let p = dir.join("nvcc");
            if is_executable(&p) {
                return Ok(Nvcc {
                    path: p,
                    source: NvccSource::Path,
                });
            }
        }
        looked.push("PATH".to_owned());
    }
    if let Some(home) = &l.cuda_home {
        let p = home.join("bin/nvcc");
        if is_executable(&p) {
            return Ok(Nvcc {
                path: p,
                source: NvccSource::CudaHome,
            });
        }
        looked.push(p.display().to_string());
    }
    if let Some(dir) = &l.toolchain_dir {
        if let Some(p) = wheel_paths(dir, "bin/nvcc")
            .into_iter()
            .find(|p| is_executable(p))
        {
            return Ok(Nvcc {
                path: p,
                source: NvccSource::Wheels,
            });
        }
        looked.push(format!("{}/nvidia/cu*/bin/nvcc", dir.display()));
    }
    Err(ToolchainError::NotFound {
        looked: looked.join(", "),
    })
}

/// `nvcc --version`'s last "release" line, e.g. `Cuda compilation tools, release 13.5, V13.5.37`.
#[must_use]
pub fn nvcc_version(nvcc: &Path) -> Option<String> {
    let out = Command::new(nvcc).arg("--version").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find(|l| l.contains("release"))
        .map(|l| l.trim().to_owned())
}

/// The default GPU architectures: Ampere (sm_80) and Hopper (sm_90) machine code, plus
/// compute_90 PTX that newer GPUs (Blackwell) JIT-compile.
pub const DEFAULT_ARCHS: &[u32] = &[80, 90];

/// Parses `80,90`, `sm_80,sm_90` or `compute_90`-style lists.
pub fn parse_archs(s: &str) -> Result<Vec<u32>, ToolchainError> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let digits = part
            .strip_prefix("sm_")
            .or_else(|| part.strip_prefix("compute_"))
            .unwrap_or(part);
        let n: u32 = digits
            .parse()
            .map_err(|_| ToolchainError::Arch(part.to_owned()))?;
        if !(30..=200).contains(&n) {
            return Err(ToolchainError::Arch(part.to_owned()));
        }
        if !v.contains(&n) {
            v.push(n);
        }
    }
    if v.is_empty() {
        return Err(ToolchainError::Arch(s.to_owned()));
    }
    v.sort_unstable();
    Ok(v)
}

/// nvcc's arguments for one workload: optimised C++17 host code with warnings, SASS for every
/// architecture and PTX for the newest, the CUDA runtime linked statically, `-ldl` for cuBLAS.
#[must_use]
pub fn nvcc_args(source: &Path, include_dir: &Path, out: &Path, archs: &[u32]) -> Vec<OsString> {
    let mut a: Vec<OsString> = ["-O2", "-std=c++17", "-Xcompiler", "-Wall,-Wextra"]
        .iter()
        .map(OsString::from)
        .collect();
    a.push("-I".into());
    a.push(include_dir.into());
    for (i, arch) in archs.iter().enumerate() {
        a.push("-gencode".into());
        if i + 1 == archs.len() {
            a.push(format!("arch=compute_{arch},code=[sm_{arch},compute_{arch}]").into());
        } else {
            a.push(format!("arch=compute_{arch},code=sm_{arch}").into());
        }
    }
    a.push("--cudart=static".into());
    a.push("-o".into());
    a.push(out.into());
    a.push(source.into());
    a.push("-ldl".into());
    a
}

/// One compiled workload.
#[derive(Debug, Clone)]
pub struct Built {
    /// The workload name.
    pub name: String,
    /// The executable.
    pub binary: PathBuf,
    /// How long nvcc took.
    pub elapsed: Duration,
    /// nvcc's output (warnings), if any.
    pub output: String,
}

/// The result of [`build`].
#[derive(Debug, Clone)]
pub struct BuildReport {
    /// The compiled workloads, in [`crate::workloads::ALL`] order.
    pub built: Vec<Built>,
    /// Wall time of the whole build.
    pub elapsed: Duration,
}

/// Writes the sources under `out/src` and compiles each workload into `out/<name>` with up to
/// `jobs` nvcc processes at once.
pub fn build(
    nvcc: &Path,
    out: &Path,
    archs: &[u32],
    jobs: usize,
    workloads: &[Workload],
) -> Result<BuildReport, ToolchainError> {
    let started = Instant::now();
    let src = out.join("src");
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ToolchainError::Io { path, source }
    };
    std::fs::create_dir_all(&src).map_err(io(&src))?;
    let header = src.join(HEADER.0);
    std::fs::write(&header, HEADER.1).map_err(io(&header))?;
    for w in workloads {
        let p = src.join(w.source_file());
        std::fs::write(&p, w.source).map_err(io(&p))?;
    }

    let next = Mutex::new(0usize);
    let results: Mutex<Vec<Option<Result<Built, ToolchainError>>>> =
        Mutex::new(workloads.iter().map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, workloads.len().max(1)) {
            s.spawn(|| loop {
                let i = {
                    let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
                    let i = *n;
                    *n += 1;
                    i
                };
                let Some(w) = workloads.get(i) else { break };
                let r = compile_one(nvcc, &src, out, archs, w);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });

    let mut built = Vec::new();
    let mut logs = Vec::new();
    for (w, r) in workloads
        .iter()
        .zip(results.into_inner().unwrap_or_else(|e| e.into_inner()))
    {
        match r {
            Some(Ok(b)) => built.push(b),
            Some(Err(ToolchainError::Compile { logs: l, .. })) => logs.extend(l),
            Some(Err(e)) => return Err(e),
            None => logs.push((w.name.to_owned(), "not compiled".to_owned())),
        }
    }
    if !logs.is_empty() {
        return Err(ToolchainError::Compile {
            failed: logs.len(),
            total: workloads.len(),
            names: logs
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            logs,
        });
    }
    Ok(BuildReport {
        built,
        elapsed: started.elapsed(),
    })
}

fn compile_one(
    nvcc: &Path,
    src: &Path,
    out: &Path,
    archs: &[u32],
    w: &Workload,
) -> Result<Built, ToolchainError> {
    let t = Instant::now();
    let binary = out.join(w.name);
    let args = nvcc_args(&src.join(w.source_file()), src, &binary, archs);
    let o = Command::new(nvcc)
        .args(&args)
        .output()
        .map_err(|source| ToolchainError::Spawn {
            nvcc: nvcc.to_path_buf(),
            source,
        })?;
    let mut output = String::from_utf8_lossy(&o.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&o.stderr));
    if !o.status.success() {
        return Err(ToolchainError::Compile {
            failed: 1,
            total: 1,
            names: w.name.to_owned(),
            logs: vec![(w.name.to_owned(), format!("nvcc {}: {output}", o.status))],
        });
    }
    Ok(Built {
        name: w.name.to_owned(),
        binary,
        elapsed: t.elapsed(),
        output: output.trim().to_owned(),
    })
}

/// Whether `dir` holds an executable for every workload; the missing ones otherwise.
pub fn check_prebuilt(dir: &Path, workloads: &[Workload]) -> Result<(), Vec<String>> {
    let missing: Vec<String> = workloads
        .iter()
        .filter(|w| !is_executable(&dir.join(w.name)))
        .map(|w| w.name.to_owned())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing)
    }
}
