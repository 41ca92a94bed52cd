//! A typed client of a world directory: create it, replace its config, read its status, all
//! in-process. The `mock-world` program is a command line over these functions, and the tests
//! and the harness call them directly.
//!
//! ```no_run
//! use mock_cuda_world::client::{CudaState, MockWorld};
//! use std::path::Path;
//!
//! # fn main() -> Result<(), mock_cuda_world::client::ClientError> {
//! let text = "schema = 1\n[driver]\nbranch = 580\n";
//! let w = MockWorld::init(
//!     Path::new("/tmp/w"),
//!     text,
//!     Path::new("target/debug/libmock_libcuda.so"),
//!     Some(Path::new("target/debug/libmock_nvml.so")),
//! )?;
//! let status = w.status()?;
//! assert_eq!(status.state_of(4242), CudaState::None);
//! # Ok(())
//! # }
//! ```

mod status;

pub use status::{CudaState, Presence, ProcessStatus, Status};

use crate::config::WorldConfig;
use crate::state::StateFile;
use crate::{World, WorldError, NVML_LIB};
use std::path::{Path, PathBuf};

/// What a client call on a world failed to do, and why. Each names the world directory.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The config given for the world does not parse or validate.
    #[error("mock world {dir}: bad config ({origin}): {reason}")]
    Config {
        dir: String,
        /// Where the config came from: a file's path, or `TOML text`, `TOML table`,
        /// `WorldConfig`.
        origin: String,
        reason: String,
    },
    /// The config file given for the world cannot be read.
    #[error("mock world {dir}: cannot read the config file {path}: {source}")]
    ConfigFile {
        dir: String,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Creating the world's files failed.
    #[error("creating mock world {dir}: {source}")]
    Create {
        dir: String,
        #[source]
        source: WorldError,
    },
    /// Replacing the config of an existing world failed.
    #[error("reconfiguring mock world {dir}: {source}")]
    Reconfigure {
        dir: String,
        #[source]
        source: WorldError,
    },
    /// Installing (or removing) the world's NVML stand-in failed.
    #[error("installing the NVML stand-in of mock world {dir}: {source}")]
    Nvml {
        dir: String,
        #[source]
        source: WorldError,
    },
    /// The directory is not a world, or its config cannot be read.
    #[error("opening mock world {dir}: {source}")]
    Open {
        dir: String,
        #[source]
        source: WorldError,
    },
    /// The world's state cannot be read.
    #[error("reading the state of mock world {dir}: {source}")]
    State {
        dir: String,
        #[source]
        source: WorldError,
    },
}

fn shown(dir: &Path) -> String {
    dir.display().to_string()
}

/// A world config as a caller holds it: typed, as TOML text or table, or in a file. Each is
/// validated the same way ([`WorldConfig::parse`]) before a world is written from it.
#[derive(Debug, Clone, Copy)]
pub enum ConfigSource<'a> {
    Typed(&'a WorldConfig),
    Text(&'a str),
    Table(&'a toml::Table),
    File(&'a Path),
}

impl<'a> From<&'a WorldConfig> for ConfigSource<'a> {
    fn from(c: &'a WorldConfig) -> Self {
        ConfigSource::Typed(c)
    }
}

impl<'a> From<&'a str> for ConfigSource<'a> {
    fn from(t: &'a str) -> Self {
        ConfigSource::Text(t)
    }
}

impl<'a> From<&'a String> for ConfigSource<'a> {
    fn from(t: &'a String) -> Self {
        ConfigSource::Text(t)
    }
}

impl<'a> From<&'a toml::Table> for ConfigSource<'a> {
    fn from(t: &'a toml::Table) -> Self {
        ConfigSource::Table(t)
    }
}

impl ConfigSource<'_> {
    /// Where the config comes from, as an error names it.
    #[must_use]
    pub fn origin(&self) -> String {
        match self {
            ConfigSource::Typed(_) => "WorldConfig".to_owned(),
            ConfigSource::Text(_) => "TOML text".to_owned(),
            ConfigSource::Table(_) => "TOML table".to_owned(),
            ConfigSource::File(p) => shown(p),
        }
    }

    /// The validated config, for the world at `dir` (which errors name).
    ///
    /// # Errors
    /// [`ClientError::ConfigFile`] for a file that cannot be read, [`ClientError::Config`] for
    /// a config that does not parse or validate.
    pub fn load(&self, dir: &Path) -> Result<WorldConfig, ClientError> {
        let origin = self.origin();
        let text = match self {
            // A typed config may have been built field by field: it is checked as its text is.
            ConfigSource::Typed(c) => c.to_toml(),
            ConfigSource::Text(t) => (*t).to_owned(),
            ConfigSource::Table(t) => t.to_string(),
            ConfigSource::File(p) => {
                std::fs::read_to_string(p).map_err(|source| ClientError::ConfigFile {
                    dir: shown(dir),
                    path: shown(p),
                    source,
                })?
            }
        };
        WorldConfig::parse(&text, &origin).map_err(|e| ClientError::Config {
            dir: shown(dir),
            origin,
            reason: match e {
                WorldError::Config { reason, .. } => reason,
                other => other.to_string(),
            },
        })
    }
}

/// A handle on a world directory, with the built libraries it (re)generates the world's `lib/`
/// from.
#[derive(Debug, Clone)]
pub struct MockWorld {
    dir: PathBuf,
    mock_lib: Option<PathBuf>,
    nvml_lib: Option<PathBuf>,
}

impl MockWorld {
    /// Creates (or re-creates) the world at `dir` from `config` ([`World::create`]): its config,
    /// a fresh state and trace, `lib/libcuda.so.1` made from the mock library `mock_lib`, and,
    /// when the config says `[nvml] present = true` and `nvml_lib` names the NVML stand-in,
    /// `lib/libnvidia-ml.so.1` ([`MockWorld::has_nvml`] tells whether the world got one). The
    /// handle keeps both libraries for [`MockWorld::configure`].
    ///
    /// # Errors
    /// A config that does not validate (nothing is written then), or a file of the world that
    /// cannot be written.
    pub fn init<'a>(
        dir: impl AsRef<Path>,
        config: impl Into<ConfigSource<'a>>,
        mock_lib: &Path,
        nvml_lib: Option<&Path>,
    ) -> Result<MockWorld, ClientError> {
        let dir = dir.as_ref();
        let cfg = config.into().load(dir)?;
        let w = World::create(dir, &cfg, mock_lib).map_err(|source| ClientError::Create {
            dir: shown(dir),
            source,
        })?;
        if let (true, Some(so)) = (cfg.nvml.present, nvml_lib) {
            w.install_nvml(Some(so))
                .map_err(|source| ClientError::Nvml {
                    dir: shown(dir),
                    source,
                })?;
        }
        Ok(MockWorld {
            dir: dir.to_path_buf(),
            mock_lib: Some(mock_lib.to_path_buf()),
            nvml_lib: nvml_lib.map(Path::to_path_buf),
        })
    }

    /// The existing world at `dir` (its config must read and validate), with no libraries
    /// (see [`MockWorld::with_libs`]).
    ///
    /// # Errors
    /// [`ClientError::Open`] when `dir` holds no world or its config is bad.
    pub fn open(dir: impl AsRef<Path>) -> Result<MockWorld, ClientError> {
        let w = MockWorld {
            dir: dir.as_ref().to_path_buf(),
            mock_lib: None,
            nvml_lib: None,
        };
        w.world()?;
        Ok(w)
    }

    /// This handle with the built mock library (needed by [`MockWorld::configure`] when the new
    /// config hides other driver symbols) and NVML stand-in (installed by it when the config
    /// wants NVML).
    #[must_use]
    pub fn with_libs(mut self, mock_lib: Option<&Path>, nvml_lib: Option<&Path>) -> MockWorld {
        self.mock_lib = mock_lib.map(Path::to_path_buf);
        self.nvml_lib = nvml_lib.map(Path::to_path_buf);
        self
    }

    /// The world directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The world, opened now (it reads the config as it is now).
    ///
    /// # Errors
    /// [`ClientError::Open`].
    pub fn world(&self) -> Result<World, ClientError> {
        World::open(&self.dir).map_err(|source| ClientError::Open {
            dir: shown(&self.dir),
            source,
        })
    }

    /// Replaces the world's config, keeping its state and trace ([`World::reconfigure`]);
    /// every process sees the new config at its next call. NVML follows the config: removed
    /// when it says `[nvml] present = false`, installed from this handle's NVML stand-in when
    /// it wants NVML and one was given, kept as it is otherwise.
    ///
    /// # Errors
    /// A config that does not validate (the world is left as it was), a world that cannot be
    /// opened, a new set of hidden symbols without the mock library, a file that cannot be
    /// written.
    pub fn configure<'a>(&self, config: impl Into<ConfigSource<'a>>) -> Result<(), ClientError> {
        let cfg = config.into().load(&self.dir)?;
        let w =
            World::reconfigure(&self.dir, &cfg, self.mock_lib.as_deref()).map_err(|source| {
                ClientError::Reconfigure {
                    dir: shown(&self.dir),
                    source,
                }
            })?;
        let nvml = match (cfg.nvml.present, &self.nvml_lib) {
            (false, _) => w.install_nvml(None),
            (true, Some(so)) => w.install_nvml(Some(so)),
            (true, None) => Ok(()),
        };
        nvml.map_err(|source| ClientError::Nvml {
            dir: shown(&self.dir),
            source,
        })
    }

    /// The world's config as it is now.
    ///
    /// # Errors
    /// [`ClientError::Open`].
    pub fn config(&self) -> Result<WorldConfig, ClientError> {
        Ok(self.world()?.config().clone())
    }

    /// Whether the world has its NVML stand-in (`lib/libnvidia-ml.so.1`).
    #[must_use]
    pub fn has_nvml(&self) -> bool {
        self.dir.join("lib").join(NVML_LIB).exists()
    }

    /// The world's state file as it is now (no look at the processes: see
    /// [`MockWorld::status`]).
    ///
    /// # Errors
    /// [`ClientError::State`] for a state file that is missing, corrupt or foreign.
    pub fn state(&self) -> Result<StateFile, ClientError> {
        StateFile::load(&self.dir).map_err(|source| ClientError::State {
            dir: shown(&self.dir),
            source,
        })
    }

    /// How many calls scripted fault `index` (of `world.toml`'s `[[fault]]` list) has matched
    /// so far (0 when none).
    ///
    /// # Errors
    /// As [`MockWorld::state`].
    pub fn fault_count(&self, index: usize) -> Result<u64, ClientError> {
        Ok(self.state()?.fault_counts.get(&index).copied().unwrap_or(0))
    }

    /// The world's processes as the caller sees them now, and its transfers in progress
    /// ([`Status`]; what `mock-world status` prints). Like every reader that sees the host's
    /// pids, it drops the transfer files of processes that are gone.
    ///
    /// # Errors
    /// [`ClientError::Open`], [`ClientError::State`].
    pub fn status(&self) -> Result<Status, ClientError> {
        let w = self.world()?;
        let state = w.read_state().map_err(|source| ClientError::State {
            dir: shown(&self.dir),
            source,
        })?;
        Ok(Status::of(&w, state))
    }

    /// The world's call trace so far (empty when there is none).
    #[must_use]
    pub fn trace(&self) -> String {
        std::fs::read_to_string(self.dir.join("trace.log")).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
