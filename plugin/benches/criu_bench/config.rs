//! The configurations a sample runs in: which plugin (ours with a backend and options, CRIU's
//! C plugin, or none), their names on the command line and in the report, and their colours
//! and labels in the plot.

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Config {
    Driver,
    Cli,
    Plain,
    /// `driver-api` with `cuda_plugin.guardian=off`: the driver calls on threads inside CRIU,
    /// no helper process (what the guardian costs, side by side).
    DriverNoGuardian,
    /// `driver-api` with `cuda_plugin.parallel=auto`.
    DriverParallel,
    /// `cuda-checkpoint` with `cuda_plugin.parallel=auto`.
    CliParallel,
    /// CRIU's own C `cuda_plugin.so` of the same CRIU version (built by
    /// `scripts/fetch-criu.sh --c-plugin`), enabled with `CRIU_FAULT=138`; it takes no options
    /// and runs `cuda-checkpoint`. Sampled only where that `.so` exists.
    CPlugin,
}

pub(crate) const CONFIGS: [Config; 7] = [
    Config::Driver,
    Config::Cli,
    Config::Plain,
    Config::DriverNoGuardian,
    Config::DriverParallel,
    Config::CliParallel,
    Config::CPlugin,
];

impl Config {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Config::Driver => "driver-api",
            Config::Cli => "cuda-checkpoint",
            Config::Plain => "plain",
            Config::DriverNoGuardian => "driver-api-noguard",
            Config::DriverParallel => "driver-api-parallel",
            Config::CliParallel => "cuda-checkpoint-parallel",
            Config::CPlugin => "c-plugin",
        }
    }

    /// The backend, with any further option the configuration sets.
    pub(crate) fn backend(self) -> Option<&'static str> {
        match self {
            // One task at a time (parallel=auto is the default): the baselines of the
            // parallel configurations.
            Config::Driver => Some("driver-api cuda_plugin.parallel=1"),
            Config::Cli => Some("cuda-checkpoint cuda_plugin.parallel=1"),
            Config::Plain => None,
            Config::DriverNoGuardian => Some("driver-api cuda_plugin.guardian=off"),
            Config::DriverParallel => Some("driver-api cuda_plugin.parallel=auto"),
            Config::CliParallel => Some("cuda-checkpoint cuda_plugin.parallel=auto"),
            Config::CPlugin => None,
        }
    }

    pub(crate) fn colour(self) -> &'static str {
        match self {
            Config::Driver => "#1f77b4",
            Config::Cli => "#d62728",
            Config::Plain => "#2ca02c",
            Config::DriverNoGuardian => "#9467bd",
            Config::DriverParallel => "#ff7f0e",
            Config::CliParallel => "#8c564b",
            Config::CPlugin => "#7f7f7f",
        }
    }

    /// The configuration's line in the plot's legend.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Config::Driver => "driver-api backend",
            Config::Cli => "cuda-checkpoint backend",
            Config::Plain => "plain tree, no plugin",
            Config::DriverNoGuardian => "driver-api, guardian=off",
            Config::DriverParallel => "driver-api, parallel=auto",
            Config::CliParallel => "cuda-checkpoint, parallel=auto",
            Config::CPlugin => "CRIU's C plugin (cuda-checkpoint)",
        }
    }

    /// The configuration named `name` (as [`Config::name`] spells it; `--configs`).
    pub(crate) fn parse(name: &str) -> Result<Config, String> {
        let name = name.trim();
        CONFIGS
            .iter()
            .copied()
            .find(|c| c.name() == name)
            .ok_or_else(|| {
                let all: Vec<_> = CONFIGS.iter().map(|c| c.name()).collect();
                format!("unknown configuration {name:?} (known: {})", all.join(", "))
            })
    }
}
