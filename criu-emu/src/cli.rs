//! The engine's command line, shaped like CRIU's (`dump -t PID -D DIR -L DIR ...`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::engine::{self, Config, FinalState, LibDir, PluginInfo, DEFAULT_TIMEOUT};
use crate::options::PluginOption;
use crate::profile::{HostProfile, Rules};
use crate::{log, pr_err, pr_info, trace};

/// Drive CRIU plugins through dump, pre-dump and restore of a real process tree, as an emulated
/// CRIU host would.
#[derive(Debug, Parser)]
#[command(name = "harness", version)]
pub struct Cli {
    /// Emulated host: 4.1, 4.2, upstream, pr3076 (must match this engine executable; the
    /// `harness` front-end picks the executable from it).
    #[arg(long, global = true)]
    pub host: Option<HostProfile>,
    /// The operation.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Checkpoint a process tree (CRIU's `dump`).
    Dump(DumpArgs),
    /// Run init(PRE_DUMP) and PAUSE_DEVICES over a tree, then let it run (no `exit`).
    PreDump(DumpArgs),
    /// Resume the tasks recorded in an image directory (CRIU's `restore`).
    Restore(RestoreArgs),
    /// List the plugins of a directory and their declared options, without calling `init`.
    Plugins(PluginsArgs),
}

/// Options every operation shares.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// Image directory.
    #[arg(short = 'D', long = "images-dir")]
    pub images_dir: PathBuf,
    /// Plugin directory (else `CRIU_LIBS_DIR`, else /usr/lib/criu/).
    #[arg(short = 'L', long)]
    pub libdir: Option<PathBuf>,
    /// A plugin option, `PLUGIN.NAME[=VALUE]`; repeatable, kept in order.
    #[arg(long = "plugin-option", value_name = "PLUGIN.NAME[=VALUE]")]
    pub plugin_option: Vec<PluginOption>,
    /// Engine rules (default: the host's own).
    #[arg(long, value_name = "4.1|newer")]
    pub rules: Option<Rules>,
    /// Route plugin images through the emulated image streamer.
    #[arg(long)]
    pub stream: bool,
    /// Freeze timeout in seconds.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT)]
    pub timeout: u32,
    /// An action script (run with `CRTOOLS_SCRIPT_ACTION` set; the emulated engine runs it for
    /// `post-dump` only, the one action whose result reaches plugins).
    #[arg(long = "action-script", value_name = "FILE")]
    pub action_script: Option<PathBuf>,
    /// Issue CRIU proposal #3105's sentinel calls: CHECKPOINT_DEVICES(-1) after the per-task
    /// CHECKPOINT_DEVICES loop, RESUME_DEVICES_LATE(-1) after the per-task RESUME_DEVICES_LATE
    /// loop (any host profile; no released CRIU makes them).
    #[arg(long = "device-sentinel")]
    pub device_sentinel: bool,
    /// Log file (relative to the image directory unless absolute).
    #[arg(short = 'o', long = "log-file")]
    pub log_file: Option<PathBuf>,
    /// Log level: 0 msg, 1 error, 2 warn (default), 3 info, 4 debug.
    #[arg(short = 'v', long = "verbosity", default_value_t = log::WARN)]
    pub verbosity: u32,
    /// Append the normalised call trace to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

/// `dump` and `pre-dump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    /// Root of the tree.
    #[arg(short = 't', long = "tree")]
    pub tree: i32,
    /// Let the tree run after the dump (TASK_ALIVE).
    #[arg(short = 'R', long, conflicts_with = "leave_stopped")]
    pub leave_running: bool,
    /// Leave the tree stopped after the dump (TASK_STOPPED).
    #[arg(short = 's', long)]
    pub leave_stopped: bool,
    /// Shared options.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `restore`.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// Accepted for CRIU compatibility; the harness always returns once the tree runs.
    #[arg(short = 'd', long = "restore-detached")]
    pub restore_detached: bool,
    /// Shared options.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `plugins`.
#[derive(Debug, Args)]
pub struct PluginsArgs {
    /// Plugin directory.
    #[arg(short = 'L', long)]
    pub libdir: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A command-line problem found after parsing.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// `--host` names another profile than this executable's.
    #[error("this engine emulates host {have}, not {want} (use the `harness` front-end)")]
    WrongHost {
        /// This executable's profile.
        have: HostProfile,
        /// The requested one.
        want: HostProfile,
    },
    /// `--plugin-option` on a host without the options API.
    #[error("host {0} has no --plugin-option (criu_plugin_get_options is newer)")]
    NoPluginOptions(HostProfile),
    /// `CRIU_FAULT` is not a number.
    #[error("CRIU_FAULT must be a number, got `{0}`")]
    BadFault(String),
    /// Log or trace file.
    #[error("failed to open {0}")]
    Io(String, #[source] std::io::Error),
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn check_host(have: HostProfile, want: Option<HostProfile>) -> Result<(), CliError> {
    match want {
        Some(w) if w != have => Err(CliError::WrongHost { have, want: w }),
        _ => Ok(()),
    }
}

fn config(profile: HostProfile, c: &CommonArgs) -> Result<Config, CliError> {
    if !c.plugin_option.is_empty() && !profile.has_plugin_options() {
        return Err(CliError::NoPluginOptions(profile));
    }
    let fault = match std::env::var("CRIU_FAULT") {
        Ok(v) => v.trim().parse().map_err(|_| CliError::BadFault(v))?,
        Err(_) => 0,
    };
    let log_path = c.log_file.as_ref().map(|p| resolve(&c.images_dir, p));
    if log_path.is_some() {
        let _ = std::fs::create_dir_all(&c.images_dir);
    }
    log::init(c.verbosity, log_path.as_deref())
        .map_err(|e| CliError::Io(format!("{:?}", log_path), e))?;
    if let Some(t) = &c.trace {
        trace::init(t).map_err(|e| CliError::Io(t.display().to_string(), e))?;
    }
    Ok(Config {
        profile,
        rules: c.rules.unwrap_or(profile.default_rules()),
        libdir: LibDir::resolve(c.libdir.clone()),
        images_dir: c.images_dir.clone(),
        stream: c.stream,
        timeout: c.timeout,
        options: c.plugin_option.clone(),
        fault,
        action_script: c.action_script.clone(),
        sentinel: c.device_sentinel,
    })
}

fn resolve(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// The `main` of `harness-engine-<profile>`.
#[must_use]
pub fn engine_main(profile: HostProfile) -> ExitCode {
    let cli = Cli::parse();
    match run(profile, cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

fn fail_cli(e: &CliError) -> ExitCode {
    eprintln!("Error: {}", chain(e));
    ExitCode::from(1)
}

fn run(profile: HostProfile, cli: Cli) -> Result<(), ExitCode> {
    check_host(profile, cli.host).map_err(|e| fail_cli(&e))?;
    let (what, result) = match cli.command {
        Command::Dump(a) => {
            let cfg = config(profile, &a.common).map_err(|e| fail_cli(&e))?;
            let fs = if a.leave_running {
                FinalState::Alive
            } else if a.leave_stopped {
                FinalState::Stopped
            } else {
                FinalState::Dead
            };
            ("Dumping", engine::dump(&cfg, a.tree, fs))
        }
        Command::PreDump(a) => {
            let cfg = config(profile, &a.common).map_err(|e| fail_cli(&e))?;
            ("Pre-dumping", engine::pre_dump(&cfg, a.tree))
        }
        Command::Restore(a) => {
            let cfg = config(profile, &a.common).map_err(|e| fail_cli(&e))?;
            ("Restoring", engine::restore(&cfg))
        }
        Command::Plugins(a) => {
            return list_plugins(profile, &a.libdir, a.json);
        }
    };
    match result {
        Ok(()) => {
            pr_info!("{what} finished successfully");
            Ok(())
        }
        Err(e) => {
            pr_err!("{}", chain(&e));
            pr_err!("{what} FAILED.");
            Err(ExitCode::from(1))
        }
    }
}

fn list_plugins(profile: HostProfile, dir: &Path, json: bool) -> Result<(), ExitCode> {
    let infos = engine::inspect(profile, dir).map_err(|e| {
        eprintln!("Error: {}", chain(&e));
        ExitCode::from(1)
    })?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&infos).expect("plugin info serialises")
        );
    } else {
        print!("{}", render_plugins(profile, &infos));
    }
    Ok(())
}

/// The text form of `harness plugins`.
#[must_use]
pub fn render_plugins(profile: HostProfile, infos: &[PluginInfo]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if infos.is_empty() {
        s.push_str("no plugins\n");
    }
    for i in infos {
        let _ = writeln!(
            s,
            "{} ({}): version {:#x}, max_hooks {}",
            i.name, i.file, i.version, i.max_hooks
        );
        let _ = writeln!(s, "  hooks: {}", i.hooks.join(" "));
        if let Some(r) = &i.rejected {
            let _ = writeln!(s, "  rejected by host {profile}: {r}");
        }
        if let Some(e) = &i.options_error {
            let _ = writeln!(s, "  options: ignored ({e})");
        }
        if let Some(opts) = &i.options {
            let _ = writeln!(s, "  options:");
            for o in opts {
                let mut line = format!("    --plugin-option={}.{}", i.name, o.name);
                if let Some(v) = &o.value_syntax {
                    let _ = write!(line, "={v}");
                }
                if let Some(d) = &o.default_value {
                    let _ = write!(line, " (default: {d})");
                }
                let _ = writeln!(s, "{line}");
                if let Some(h) = &o.help {
                    let _ = writeln!(s, "        {h}");
                }
            }
        }
    }
    s
}
