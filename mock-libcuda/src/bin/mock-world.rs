//! `mock-world`: creates and inspects mock CUDA worlds, a command line over
//! `mock_cuda_world::client` (what the tests and the harness call in-process).
//!
//! ```text
//! mock-world init DIR --config world.toml [--lib libmock_libcuda.so] [--nvml-lib libmock_nvml.so]
//! mock-world configure DIR --config world.toml [--lib libmock_libcuda.so] [--nvml-lib …]
//! mock-world status DIR [--json]
//! mock-world trace DIR
//! mock-world check CONFIG
//! ```

#![deny(unsafe_code)]

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use mock_libcuda::world::client::{ConfigSource, MockWorld};
use mock_libcuda::world::config::WorldConfig;
use std::path::{Path, PathBuf};

#[derive(Parser, Debug)]
#[command(name = "mock-world", about = "Create and inspect mock CUDA worlds")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create (or reset) a world: config, fresh state and trace, lib/libcuda.so.1 and (unless
    /// the config says `[nvml] present = false`) lib/libnvidia-ml.so.1.
    Init {
        dir: PathBuf,
        /// The world's config (world.toml format).
        #[arg(long)]
        config: PathBuf,
        /// The built mock library (default: $MOCK_LIBCUDA_SO, else libmock_libcuda.so next to
        /// this program).
        #[arg(long)]
        lib: Option<PathBuf>,
        /// The built NVML stand-in (default: $MOCK_NVML_SO, else libmock_nvml.so next to this
        /// program; when there is none, the world has no NVML and a warning says so).
        #[arg(long)]
        nvml_lib: Option<PathBuf>,
    },
    /// Replace the config of an existing world, keeping its state and trace (e.g. to add a
    /// fault naming a process that runs in it).
    Configure {
        dir: PathBuf,
        #[arg(long)]
        config: PathBuf,
        /// The built mock library, needed when the hidden symbols change (default as for init).
        #[arg(long)]
        lib: Option<PathBuf>,
        /// The built NVML stand-in (default as for init).
        #[arg(long)]
        nvml_lib: Option<PathBuf>,
    },
    /// Print the CUDA processes of a world: host pid (`?` when unknown), the restore thread's
    /// tid as seen from here (`-` when the process is gone), state, memory, namespace pid and
    /// pid namespace. `--json`: the state, processes keyed by host pid.
    Status {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Print a world's call trace.
    Trace { dir: PathBuf },
    /// Validate a config file.
    Check { config: PathBuf },
}

/// The newest of `name` next to this program and in its `deps/` (`cargo test` refreshes
/// `deps/` but not the copy next to the binaries).
fn next_to_me(name: &str) -> Result<Option<PathBuf>> {
    let exe = std::env::current_exe().context("locating mock-world")?;
    let dir = exe.parent().context("mock-world has no directory")?;
    Ok([dir.join(name), dir.join("deps").join(name)]
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p))
}

fn default_lib() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("MOCK_LIBCUDA_SO") {
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = next_to_me("libmock_libcuda.so")? {
        return Ok(p);
    }
    bail!("cannot find libmock_libcuda.so next to mock-world (build the mock-libcuda crate, or pass --lib / set MOCK_LIBCUDA_SO)")
}

/// The NVML stand-in to install: `--nvml-lib`, `$MOCK_NVML_SO`, or the one next to this
/// program; `None` when the config wants none, or none was built.
fn nvml_lib(given: Option<PathBuf>, cfg: &WorldConfig) -> Result<Option<PathBuf>> {
    if !cfg.nvml.present {
        return Ok(None);
    }
    let from_env = std::env::var_os("MOCK_NVML_SO").filter(|v| !v.is_empty());
    if let Some(p) = given.or_else(|| from_env.map(PathBuf::from)) {
        return Ok(Some(p));
    }
    next_to_me("libmock_nvml.so")
}

/// Says that a world that should have NVML has none.
fn warn_no_nvml(w: &MockWorld) {
    eprintln!(
        "mock-world: warning: no libmock_nvml.so next to mock-world: {} has no {} (build the mock-nvml crate, pass --nvml-lib, or say [nvml] present = false)",
        w.dir().display(),
        mock_libcuda::world::NVML_LIB
    );
}

fn read_config(dir: &Path, path: &Path) -> Result<WorldConfig> {
    Ok(ConfigSource::File(path).load(dir)?)
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Init {
            dir,
            config,
            lib,
            nvml_lib: nvml,
        } => {
            let cfg = read_config(&dir, &config)?;
            let lib = match lib {
                Some(l) => l,
                None => default_lib()?,
            };
            let nvml = nvml_lib(nvml, &cfg)?;
            let w = MockWorld::init(&dir, &cfg, &lib, nvml.as_deref())?;
            if cfg.nvml.present && !w.has_nvml() {
                warn_no_nvml(&w);
            }
            println!(
                "world {}: driver r{} ({}), cuDriverGetVersion {}, {} GPU(s), {} fault(s)",
                w.dir().display(),
                cfg.driver.branch,
                cfg.driver.version_string(),
                cfg.driver.cuda_version(),
                cfg.gpus.len(),
                cfg.faults.len()
            );
        }
        Cmd::Configure {
            dir,
            config,
            lib,
            nvml_lib: nvml,
        } => {
            let cfg = read_config(&dir, &config)?;
            let lib = lib.or_else(|| default_lib().ok());
            let nvml = nvml_lib(nvml, &cfg)?;
            let w = MockWorld::open(&dir)?.with_libs(lib.as_deref(), nvml.as_deref());
            w.configure(&cfg)?;
            // Without a stand-in to install, the library init installed stays.
            if cfg.nvml.present && !w.has_nvml() {
                warn_no_nvml(&w);
            }
            println!(
                "world {}: config replaced ({} fault(s))",
                dir.display(),
                cfg.faults.len()
            );
        }
        Cmd::Status { dir, json } => {
            let status = MockWorld::open(&dir)?.status()?;
            if json {
                println!("{}", status.to_json());
            } else {
                print!("{}", status.table());
            }
        }
        Cmd::Trace { dir } => {
            print!("{}", MockWorld::open(&dir)?.trace());
        }
        Cmd::Check { config } => {
            let cfg = WorldConfig::parse(
                &std::fs::read_to_string(&config)
                    .with_context(|| format!("reading {}", config.display()))?,
                &config.display().to_string(),
            )?;
            println!(
                "{}: ok (driver r{}, {} GPU(s), {} fault(s))",
                config.display(),
                cfg.driver.branch,
                cfg.gpus.len(),
                cfg.faults.len()
            );
        }
    }
    Ok(())
}
