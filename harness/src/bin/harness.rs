//! The `harness` front-end: finds the engine executable of the requested host profile
//! (`--host`, else `HARNESS_HOST`, else the default) next to itself and execs it with the same
//! arguments. Each engine is a separate executable because the host symbols a plugin can see are
//! fixed at link time.
//!
//! `harness run [-j N] [PATH...]` runs the scenario corpus instead (default `scenarios/`, two at a
//! time) and prints a table: scenario, host, backend, result, time.
//!
//! `harness sweep [--full] [-j N] [--only FILTER] [--out FILE]` runs the fault sweep
//! (`harness::sweep`) and prints its table: call, fault, phase, task, host, tree, outcome, check.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use std::path::PathBuf;

use harness::profile::HostProfile;
use harness::runner;

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

/// `harness run [-j N] PATH...`: runs the scenario corpus (files or directories).
fn run_scenarios(args: &[OsString]) -> Result<ExitCode> {
    let mut jobs = 2;
    let mut paths = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let a = a.to_string_lossy();
        if a == "-j" || a == "--jobs" {
            jobs = it
                .next()
                .context("-j needs a number")?
                .to_string_lossy()
                .parse()?;
        } else if let Some(v) = a.strip_prefix("-j") {
            jobs = v.parse()?;
        } else if a == "-h" || a == "--help" {
            println!("usage: harness run [-j N] SCENARIO_FILE_OR_DIR...");
            return Ok(ExitCode::SUCCESS);
        } else {
            paths.push(PathBuf::from(a.as_ref()));
        }
    }
    if paths.is_empty() {
        paths.push(PathBuf::from("scenarios"));
    }
    let art = artifacts_as_subreaper()?;
    let opts = runner::RunOptions {
        require_criu: std::env::var("CRIU_CUDA_REQUIRE_CRIU").is_ok_and(|v| v == "1"),
    };
    Ok(if runner::run_corpus(&paths, &art, jobs, opts) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The built artifacts next to this executable; this process then becomes the subreaper of
/// the workloads it starts.
fn artifacts_as_subreaper() -> Result<runner::Artifacts> {
    let me = std::env::current_exe().context("cannot locate the harness executable")?;
    let profile = me
        .parent()
        .context("the harness executable has no directory")?;
    let art = runner::Artifacts::locate(profile, &me).map_err(anyhow::Error::msg)?;
    runner::become_subreaper();
    Ok(art)
}

/// `harness sweep [--full] [-j N] [--only FILTER] [--out FILE]`: the fault sweep.
fn run_sweep(args: &[OsString]) -> Result<ExitCode> {
    use harness::sweep;
    let mut jobs = 2;
    let mut full = false;
    let mut only: Option<String> = None;
    let mut out: Option<PathBuf> = None;
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = it.next() {
        match a.as_str() {
            "--full" => full = true,
            "-j" | "--jobs" => jobs = it.next().context("-j needs a number")?.parse()?,
            "--only" => only = Some(it.next().context("--only needs a filter")?),
            "--out" => out = Some(PathBuf::from(it.next().context("--out needs a file")?)),
            "-h" | "--help" => {
                println!("usage: harness sweep [--full] [-j N] [--only FILTER] [--out FILE]");
                return Ok(ExitCode::SUCCESS);
            }
            other => bail!("harness sweep: unknown argument `{other}`"),
        }
    }
    let art = artifacts_as_subreaper()?;
    let mut cases = sweep::cases(full);
    if let Some(f) = &only {
        cases = sweep::filter(cases, f);
    }
    let total = cases.len();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let started = std::time::Instant::now();
    let results = sweep::run_all(&cases, &art, jobs, &|r| {
        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        eprintln!(
            "[{n}/{total}] {:.1}s {} {} {} {} {}: {} [{}]",
            r.elapsed.as_secs_f64(),
            r.case.call,
            r.case.fault.name(),
            r.case.target.name(),
            r.case.profile,
            r.case.tree.name(),
            r.outcome,
            sweep::check_text(r)
        );
        if sweep::is_failure(r) {
            eprintln!("    repro: {}\n{}", r.case.repro(), r.detail);
        }
    });
    let table = sweep::table(&results, true);
    print!("{table}");
    println!("({:.1} s)", started.elapsed().as_secs_f64());
    if let Some(p) = out {
        std::fs::write(&p, &table).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(if results.iter().any(sweep::is_failure) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn run() -> Result<ExitCode> {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == "run") {
        return run_scenarios(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "sweep") {
        return run_sweep(&args[1..]);
    }
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
