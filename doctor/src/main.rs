//! `cuda-plugin-doctor`: checks a node for `cuda_plugin.so` and prints, per check, PASS, WARN,
//! FAIL or SKIP, what it found and, for anything that did not pass, the fix in one sentence
//! (`docs/doctor.md` describes every check). `--json` prints the same as one JSON document.
//!
//! Exit status: 0 when no check failed, 1 when one did, 2 for a usage error.
//!
//! The files it reads are read under `--root` (default `/`), so that a test can build a fake
//! node in a directory; the programs it runs are found in `--path` (default `$PATH`) and run
//! without a shell, each with a time limit (`--timeout`). What the plugin itself decides (its
//! options file and where it is looked for, the trust rules, the driver and `cuda-checkpoint`
//! probes) is decided by the plugin's own code (`cuda_plugin`), not by a copy of it.

mod checks;
mod report;

use clap::Parser;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// Checks a node for cuda_plugin.so (CRIU, trust rules, driver, cuda-checkpoint, NVML, memory,
/// container runtimes) and prints the fix for anything that does not pass.
#[derive(Debug, Parser)]
#[command(name = "cuda-plugin-doctor", version = cuda_plugin::PLUGIN_VERSION)]
pub struct Args {
    /// Print the report as one JSON document.
    #[arg(long)]
    pub json: bool,
    /// The root the node's files are read under (/etc/criu, /usr/lib/criu, /proc/meminfo, ...).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// Where programs are looked for (PATH's format; default: this process's PATH).
    #[arg(long, value_name = "DIRS")]
    pub path: Option<OsString>,
    /// The CRIU to check (default: criu in the path, then ROOT/usr/sbin/criu,
    /// ROOT/usr/local/sbin/criu).
    #[arg(long, value_name = "PATH")]
    pub criu: Option<PathBuf>,
    /// CRIU's plugin directory (default: ROOT/usr/lib/criu).
    #[arg(long, value_name = "DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// The options file CRIU_CUDA_PLUGIN_CONFIG names for CRIU (default: this process's
    /// CRIU_CUDA_PLUGIN_CONFIG; else the plugin's own lookup: next to the plugin, then
    /// ROOT/etc/criu/cuda_plugin.conf).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The cuda-checkpoint to check (default: the options file's cuda-checkpoint=, else the
    /// path).
    #[arg(long, value_name = "PATH")]
    pub cuda_checkpoint: Option<PathBuf>,
    /// The image directory, for its free space and O_DIRECT (custom storage).
    #[arg(long, value_name = "DIR")]
    pub images: Option<PathBuf>,
    /// How long each program the doctor runs, and each driver or NVML query, may take.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub timeout: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let ctx = checks::Context::new(&args);
    let report = report::Report::new(args.root.display().to_string(), checks::run(&ctx));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.human());
    }
    std::process::exit(i32::from(report.failed()));
}

impl checks::Context {
    fn new(args: &Args) -> Self {
        let root = args.root.clone();
        checks::Context {
            plugin_dir: args
                .plugin_dir
                .clone()
                .unwrap_or_else(|| root.join("usr/lib/criu")),
            path: args.path.clone().or_else(|| std::env::var_os("PATH")),
            criu: args.criu.clone(),
            config: args.config.clone().or_else(|| {
                std::env::var_os(cuda_plugin::config::ENV_CONFIG)
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            }),
            cuda_checkpoint: args.cuda_checkpoint.clone(),
            images: args.images.clone(),
            timeout: Duration::from_secs(args.timeout.max(1)),
            root,
        }
    }
}
