//! The `harness` front-end: finds the engine executable of the requested host profile
//! (`--host`, else `HARNESS_HOST`, else the default) next to itself and execs it with the same
//! arguments. Each engine is a separate executable because the host symbols a plugin can see are
//! fixed at link time.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use harness::profile::HostProfile;

fn requested_host(args: &[OsString]) -> Result<HostProfile> {
    let mut it = args.iter().map(|a| a.to_string_lossy());
    while let Some(a) = it.next() {
        if a == "--host" {
            let v = it.next().context("--host needs a value")?;
            return Ok(v.parse()?);
        }
        if let Some(v) = a.strip_prefix("--host=") {
            return Ok(v.parse()?);
        }
    }
    match std::env::var("HARNESS_HOST") {
        Ok(v) => Ok(v.parse()?),
        Err(_) => Ok(HostProfile::DEFAULT),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("harness: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run() -> Result<ExitCode> {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let host = requested_host(&args)?;
    let me = std::env::current_exe().context("cannot locate the harness executable")?;
    let engine = me.with_file_name(host.engine_bin());
    if !engine.exists() {
        bail!(
            "engine {} not found next to {} (build the harness package's binaries)",
            host.engine_bin(),
            me.display()
        );
    }
    let err = Command::new(&engine).args(&args).exec();
    bail!("cannot exec {}: {err}", engine.display())
}
