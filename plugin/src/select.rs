//! Backend selection, fixed once per CRIU operation in `init`.
//!
//! | `backend=` | driver probe | CLI probe | result |
//! |---|---|---|---|
//! | `driver-api` | supported | (not run) | driver API |
//! | `driver-api` | unsupported / error | (not run) | init fails, naming the reason |
//! | `cuda-checkpoint` | (not run) | supported | CLI (fails if a device map is needed and the CLI lacks `--device-map`) |
//! | `cuda-checkpoint` | (not run) | unsupported / error | init fails |
//! | `auto` | supported | (not run) | driver API |
//! | `auto` | **error** | (not run) | init fails: a probe that errors never silently switches |
//! | `auto` | unsupported | supported | CLI (same device-map rule) |
//! | `auto` | unsupported | error | init fails |
//! | `auto` | unsupported | unsupported | [`Selection::NoneAvailable`]: the caller disables the plugin at dump, and fails a restore that needs it |
//!
//! "Supported" for the driver API means `libcuda.so.1` loads, `cuInit`, `cuDriverGetVersion` and
//! all six `cuCheckpointProcess*` resolve, and the driver reports CUDA 13.0 (13000) or later;
//! for the CLI, that `cuda-checkpoint -h` runs and mentions `--action` (r555+).

use crate::backend::cli::CliProbe;
use crate::backend::driver::DriverProbe;
use crate::backend::BackendKind;
use crate::options::BackendChoice;
use abi::CUresult;
use std::fmt;
use std::path::PathBuf;

/// The chosen backend, with what its probe learnt.
pub enum Selected {
    Driver {
        driver: crate::backend::driver::DriverHandle,
        version: i32,
        init: Option<CUresult>,
        /// The driver has custom storage (CUDA 13.4).
        custom_storage: bool,
    },
    Cli {
        program: PathBuf,
        device_map: bool,
    },
}

impl Selected {
    /// Which backend it is.
    #[must_use]
    pub fn kind(&self) -> BackendKind {
        match self {
            Selected::Driver { .. } => BackendKind::DriverApi,
            Selected::Cli { .. } => BackendKind::CudaCheckpoint,
        }
    }
}

impl fmt::Debug for Selected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selected::Driver { version, init, .. } => f
                .debug_struct("Driver")
                .field("version", version)
                .field("init", init)
                .finish_non_exhaustive(),
            Selected::Cli {
                program,
                device_map,
            } => f
                .debug_struct("Cli")
                .field("program", program)
                .field("device_map", device_map)
                .finish(),
        }
    }
}

/// The outcome of a selection that did not fail.
#[derive(Debug)]
pub enum Selection {
    Use(Selected),
    /// `auto`, and neither backend is supported here.
    NoneAvailable {
        driver: String,
        cli: String,
    },
}

/// Why no backend can be used and the operation must fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("backend driver-api is not supported here: {0}")]
    DriverUnsupported(String),
    #[error("probing the driver API failed (not falling back to cuda-checkpoint): {0}")]
    DriverProbe(String),
    #[error("backend cuda-checkpoint is not supported here: {0}")]
    CliUnsupported(String),
    #[error("probing cuda-checkpoint failed: {0}")]
    CliProbe(String),
    #[error("restoring onto other GPUs needs a device map, but {0} has no --device-map (driver r580 or later needed)")]
    NoDeviceMap(String),
    #[error("the image needs cuda_plugin but no backend is available (driver API: {driver}; cuda-checkpoint: {cli})")]
    NoneAvailable { driver: String, cli: String },
}

fn use_cli(cli: CliProbe, need_device_map: bool) -> Result<Selected, SelectError> {
    match cli {
        CliProbe::Supported {
            program,
            device_map,
        } => {
            if need_device_map && !device_map {
                Err(SelectError::NoDeviceMap(program.display().to_string()))
            } else {
                Ok(Selected::Cli {
                    program,
                    device_map,
                })
            }
        }
        CliProbe::Unsupported(r) => Err(SelectError::CliUnsupported(r)),
        CliProbe::Error(r) => Err(SelectError::CliProbe(r)),
    }
}

/// Selects a backend. The probes are run lazily: an explicit choice runs only its own probe, and
/// `auto` runs the CLI probe only when the driver API is unsupported.
pub fn select(
    choice: BackendChoice,
    need_device_map: bool,
    driver: impl FnOnce() -> DriverProbe,
    cli: impl FnOnce() -> CliProbe,
) -> Result<Selection, SelectError> {
    let from_driver = |p: DriverProbe| match p {
        DriverProbe::Supported {
            driver,
            version,
            init,
            custom_storage,
        } => Ok(Ok(Selected::Driver {
            driver,
            version,
            init,
            custom_storage,
        })),
        DriverProbe::Unsupported(r) => Ok(Err(r)),
        DriverProbe::Error(r) => Err(SelectError::DriverProbe(r)),
    };
    match choice {
        BackendChoice::Only(BackendKind::DriverApi) => match from_driver(driver())? {
            Ok(s) => Ok(Selection::Use(s)),
            Err(r) => Err(SelectError::DriverUnsupported(r)),
        },
        BackendChoice::Only(BackendKind::CudaCheckpoint) => {
            use_cli(cli(), need_device_map).map(Selection::Use)
        }
        BackendChoice::Auto => match from_driver(driver())? {
            Ok(s) => Ok(Selection::Use(s)),
            Err(driver_reason) => match cli() {
                CliProbe::Unsupported(cli_reason) => Ok(Selection::NoneAvailable {
                    driver: driver_reason,
                    cli: cli_reason,
                }),
                other => use_cli(other, need_device_map).map(Selection::Use),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::driver::tests::FakeDriver;
    use crate::backend::driver::{probe_driver, CudaDriver, LoadError};
    use std::cell::Cell;
    use std::sync::Arc;

    /// The driver side of the matrix.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Lib {
        Absent,
        SymbolMissing,
        Version(i32),
        VersionQueryFails,
    }

    /// The CLI side of the matrix.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Cli {
        Absent,
        Old,
        New { device_map: bool },
        Hangs,
    }

    #[derive(Debug, PartialEq, Eq)]
    enum Want {
        Driver,
        Cli,
        None,
        Fail(&'static str),
    }

    /// `auto` takes the backends in the registry's order: with every one supported it uses
    /// the first, and it only reaches the next when the first is unsupported.
    #[test]
    fn auto_follows_the_registry_order() {
        use crate::backend::registry::BACKENDS;
        let pick = |driver: Lib, cli: Cli| match select(
            BackendChoice::Auto,
            false,
            || driver_probe(driver),
            || cli_probe(cli),
        ) {
            Ok(Selection::Use(s)) => Some(s.kind()),
            _ => None,
        };
        let all = pick(Lib::Version(13000), Cli::New { device_map: true });
        assert_eq!(all, Some(BACKENDS[0].kind));
        let second = pick(Lib::Absent, Cli::New { device_map: true });
        assert_eq!(second, Some(BACKENDS[1].kind));
        assert_eq!(
            BACKENDS.len(),
            2,
            "a new backend needs its place in select()"
        );
    }

    fn driver_probe(l: Lib) -> DriverProbe {
        let load: Result<Arc<dyn CudaDriver>, LoadError> = match l {
            Lib::Absent => Err(LoadError::LibraryAbsent("libcuda.so.1: cannot open".into())),
            Lib::SymbolMissing => Err(LoadError::SymbolMissing("cuCheckpointProcessRestore")),
            Lib::Version(v) => Ok(Arc::new(FakeDriver {
                version: Some(v),
                ..Default::default()
            })),
            Lib::VersionQueryFails => Ok(Arc::new(FakeDriver {
                version_error: Some(CUresult::ERROR_OPERATING_SYSTEM),
                ..Default::default()
            })),
        };
        probe_driver(load, false)
    }

    fn cli_probe(c: Cli) -> CliProbe {
        match c {
            Cli::Absent => CliProbe::Unsupported("cuda-checkpoint not found in PATH".into()),
            Cli::Old => CliProbe::Unsupported("help lacks --action".into()),
            Cli::New { device_map } => CliProbe::Supported {
                program: "/usr/bin/cuda-checkpoint".into(),
                device_map,
            },
            Cli::Hangs => CliProbe::Error("`cuda-checkpoint -h` timed out".into()),
        }
    }

    /// The rules of the issue, stated per side, independently of `select`'s code.
    fn expected(choice: BackendChoice, lib: Lib, cli: Cli, need_map: bool) -> Want {
        let driver_ok = matches!(lib, Lib::Version(v) if v >= 13000);
        let driver_error = lib == Lib::VersionQueryFails;
        let cli_ok = matches!(cli, Cli::New { .. });
        let cli_map = matches!(cli, Cli::New { device_map: true });
        let cli_outcome = || {
            if cli == Cli::Hangs {
                Want::Fail("CliProbe")
            } else if !cli_ok {
                Want::Fail("CliUnsupported")
            } else if need_map && !cli_map {
                Want::Fail("NoDeviceMap")
            } else {
                Want::Cli
            }
        };
        match choice {
            BackendChoice::Only(BackendKind::DriverApi) if driver_ok => Want::Driver,
            BackendChoice::Only(BackendKind::DriverApi) if driver_error => {
                Want::Fail("DriverProbe")
            }
            BackendChoice::Only(BackendKind::DriverApi) => Want::Fail("DriverUnsupported"),
            BackendChoice::Only(BackendKind::CudaCheckpoint) => cli_outcome(),
            BackendChoice::Auto if driver_ok => Want::Driver,
            BackendChoice::Auto if driver_error => Want::Fail("DriverProbe"),
            BackendChoice::Auto if matches!(cli, Cli::Absent | Cli::Old) => Want::None,
            BackendChoice::Auto => cli_outcome(),
        }
    }

    fn variant(e: &SelectError) -> &'static str {
        match e {
            SelectError::DriverUnsupported(_) => "DriverUnsupported",
            SelectError::DriverProbe(_) => "DriverProbe",
            SelectError::CliUnsupported(_) => "CliUnsupported",
            SelectError::CliProbe(_) => "CliProbe",
            SelectError::NoDeviceMap(_) => "NoDeviceMap",
            SelectError::NoneAvailable { .. } => "NoneAvailable",
        }
    }

    #[test]
    fn every_combination_follows_the_rules() {
        let libs = [
            Lib::Absent,
            Lib::SymbolMissing,
            Lib::Version(12080),
            Lib::Version(12999),
            Lib::Version(13000),
            Lib::Version(13010),
            Lib::VersionQueryFails,
        ];
        let clis = [
            Cli::Absent,
            Cli::Old,
            Cli::New { device_map: false },
            Cli::New { device_map: true },
            Cli::Hangs,
        ];
        let mut n = 0;
        for choice in [
            BackendChoice::Auto,
            BackendChoice::Only(BackendKind::DriverApi),
            BackendChoice::Only(BackendKind::CudaCheckpoint),
        ] {
            for lib in libs {
                for cli in clis {
                    for need_map in [false, true] {
                        let driver_probed = Cell::new(0);
                        let cli_probed = Cell::new(0);
                        let got = select(
                            choice,
                            need_map,
                            || {
                                driver_probed.set(driver_probed.get() + 1);
                                driver_probe(lib)
                            },
                            || {
                                cli_probed.set(cli_probed.get() + 1);
                                cli_probe(cli)
                            },
                        );
                        let got = match got {
                            Ok(Selection::Use(Selected::Driver { .. })) => Want::Driver,
                            Ok(Selection::Use(Selected::Cli { .. })) => Want::Cli,
                            Ok(Selection::NoneAvailable { .. }) => Want::None,
                            Err(e) => Want::Fail(variant(&e)),
                        };
                        let case = format!(
                            "backend={choice} lib={lib:?} cli={cli:?} device_map_needed={need_map}"
                        );
                        assert_eq!(got, expected(choice, lib, cli, need_map), "{case}");
                        assert!(
                            driver_probed.get() <= 1 && cli_probed.get() <= 1,
                            "{case}: each probe at most once"
                        );
                        if choice == BackendChoice::Only(BackendKind::CudaCheckpoint) {
                            assert_eq!(
                                driver_probed.get(),
                                0,
                                "{case}: explicit CLI never loads libcuda"
                            );
                        }
                        if choice == BackendChoice::Only(BackendKind::DriverApi)
                            || got == Want::Driver
                            || got == Want::Fail("DriverProbe")
                        {
                            assert_eq!(
                                cli_probed.get(),
                                0,
                                "{case}: the CLI is not run needlessly"
                            );
                        }
                        n += 1;
                    }
                }
            }
        }
        assert_eq!(n, 3 * 7 * 5 * 2);
    }

    #[test]
    fn reasons_reach_the_error_text() {
        let e = select(
            BackendChoice::Only(BackendKind::DriverApi),
            false,
            || driver_probe(Lib::Version(12080)),
            || unreachable!(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("12080"), "{e}");
        let e = select(
            BackendChoice::Auto,
            false,
            || driver_probe(Lib::VersionQueryFails),
            || unreachable!(),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("CUDA_ERROR_OPERATING_SYSTEM")
                && e.to_string().contains("not falling back"),
            "{e}"
        );
        match select(
            BackendChoice::Auto,
            false,
            || driver_probe(Lib::Absent),
            || cli_probe(Cli::Old),
        )
        .unwrap()
        {
            Selection::NoneAvailable { driver, cli } => {
                assert!(driver.contains("libcuda.so.1"), "{driver}");
                assert!(cli.contains("--action"), "{cli}");
            }
            s => panic!("expected NoneAvailable, got {s:?}"),
        }
    }
}
