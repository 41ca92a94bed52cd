//! `mock-world`: creates and inspects mock CUDA worlds.
//!
//! ```text
//! mock-world init DIR --config world.toml [--lib libmock_libcuda.so] [--nvml-lib libmock_nvml.so]
//! mock-world configure DIR --config world.toml [--lib libmock_libcuda.so] [--nvml-lib …]
//! mock-world status DIR [--json]
//! mock-world trace DIR
//! mock-world check CONFIG
//! ```

#![deny(unsafe_code)]

use abi::CUprocessState;
use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use mock_libcuda::world::config::WorldConfig;
use mock_libcuda::world::pidns::{self, Presence};
use mock_libcuda::world::state::{ProcessEntry, StateFile};
use mock_libcuda::world::World;
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
fn warn_no_nvml(w: &World) {
    eprintln!(
        "mock-world: warning: no libmock_nvml.so next to mock-world: {} has no {} (build the mock-nvml crate, pass --nvml-lib, or say [nvml] present = false)",
        w.dir().display(),
        mock_libcuda::world::NVML_LIB
    );
}

/// One process of `mock-world status`: its entry, where it is now, its host pid (found now, or
/// the last one known) and its restore thread's tid as this process sees them.
struct Row<'a> {
    id: u64,
    entry: &'a ProcessEntry,
    present: &'static str,
    pid: i32,
    tid: Option<i32>,
}

fn status_rows<'a>(w: &World, st: &'a StateFile) -> Vec<Row<'a>> {
    st.processes
        .iter()
        .map(|(&id, e)| {
            let (present, pid, tid) = match w.locate(&e.whereabouts(id)) {
                Presence::Here(p) => ("here", p, pidns::restore_thread(p, id)),
                Presence::Gone => ("gone", e.pid, None),
                Presence::Unknown => ("unknown", e.pid, None),
            };
            Row {
                id,
                entry: e,
                present,
                pid,
                tid,
            }
        })
        .collect()
}

fn read_config(path: &Path) -> Result<WorldConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(WorldConfig::parse(&text, &path.display().to_string())?)
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Init {
            dir,
            config,
            lib,
            nvml_lib: nvml,
        } => {
            let cfg = read_config(&config)?;
            let lib = match lib {
                Some(l) => l,
                None => default_lib()?,
            };
            let w = World::create(&dir, &cfg, &lib)?;
            match nvml_lib(nvml, &cfg)? {
                Some(so) => w.install_nvml(Some(&so))?,
                None if cfg.nvml.present => warn_no_nvml(&w),
                None => {}
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
            let cfg = read_config(&config)?;
            let lib = lib.or_else(|| default_lib().ok());
            let w = World::reconfigure(&dir, &cfg, lib.as_deref())?;
            match nvml_lib(nvml, &cfg)? {
                Some(so) => w.install_nvml(Some(&so))?,
                None if !cfg.nvml.present => w.install_nvml(None)?,
                // The library init installed stays.
                None if w
                    .dir()
                    .join("lib")
                    .join(mock_libcuda::world::NVML_LIB)
                    .exists() => {}
                None => warn_no_nvml(&w),
            }
            println!(
                "world {}: config replaced ({} fault(s))",
                dir.display(),
                cfg.faults.len()
            );
        }
        Cmd::Status { dir, json } => {
            let w = World::open(&dir)?;
            let st = w.read_state()?;
            let transfers = w.transfers();
            let rows = status_rows(&w, &st);
            if json {
                // The state file, its processes keyed by host pid (or `id<N>` for one whose
                // host pid is unknown), plus the transfers in progress.
                let mut v = serde_json::to_value(&st)?;
                let mut procs = serde_json::Map::new();
                for r in &rows {
                    let mut e = serde_json::to_value(r.entry)?;
                    e["id"] = r.id.into();
                    e["present"] = r.present.into();
                    if let Some(tid) = r.tid {
                        e["restore_tid"] = tid.into();
                    }
                    let key = if r.pid > 0 {
                        r.pid.to_string()
                    } else {
                        format!("id{}", r.id)
                    };
                    // A live process wins over a dead one whose pid it reuses.
                    if r.present == "here" || !procs.contains_key(&key) {
                        procs.insert(key, e);
                    }
                }
                v["processes"] = serde_json::Value::Object(procs);
                v["transfers"] = serde_json::to_value(&transfers)?;
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "{:>8} {:>8} {:<13} {:>7} {:>15} {:>15} {:>6} {:>12}  gpus",
                    "pid", "tid", "state", "allocs", "bytes", "staged", "nspid", "pid-ns"
                );
                for r in &rows {
                    let e = r.entry;
                    let bytes: u64 = e.allocations.iter().map(|a| a.size).sum();
                    let gpus: Vec<String> = e.contexts.iter().map(|g| g.0.to_string()).collect();
                    let transfer = transfers.iter().find(|t| t.id == r.id);
                    // Host memory the process's checkpoint holds: what a transfer in progress
                    // has staged so far, all of it once checkpointed.
                    let staged = match transfer {
                        Some(t) => t.staged(),
                        None if e.state() == CUprocessState::CHECKPOINTED => {
                            e.checkpointed.iter().map(|c| c.bytes).sum()
                        }
                        None => 0,
                    };
                    let pid = if r.pid > 0 {
                        r.pid.to_string()
                    } else {
                        "?".to_owned()
                    };
                    let tid = r.tid.map_or_else(|| "-".to_owned(), |t| t.to_string());
                    println!(
                        "{pid:>8} {tid:>8} {:<13} {:>7} {bytes:>15} {staged:>15} {:>6} {:>12}  {}",
                        e.state().to_string(),
                        e.allocations.len(),
                        e.nspid,
                        e.pid_ns,
                        gpus.join(",")
                    );
                    if let Some(t) = transfer {
                        println!(
                            "{:>8} {} in progress: {} of {} bytes moved",
                            "",
                            t.direction,
                            t.moved(),
                            t.total()
                        );
                    }
                }
            }
        }
        Cmd::Trace { dir } => {
            let w = World::open(&dir)?;
            print!("{}", w.read_trace());
        }
        Cmd::Check { config } => {
            let cfg = read_config(&config)?;
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
