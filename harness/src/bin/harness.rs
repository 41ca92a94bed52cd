//! The `harness` front-end: finds the engine executable of the requested host profile
//! (`--host`, else `HARNESS_HOST`, else the default) next to itself and execs it with the same
//! arguments. Each engine is a separate executable because the host symbols a plugin can see are
//! fixed at link time.
//!
//! `harness run [-j N] [PATH...]` runs the scenario corpus instead (default `scenarios/`, twice
//! the cores at a time) and prints a table: scenario, host, backend, result, time. `--plugin
//! PATH` runs it against another CUDA plugin (`harness run --help`: its settings), `--junit
//! FILE` also writes JUnit XML.
//!
//! `harness conformance [--out FILE | --check FILE] [--ours-from FILE] [-j N]` builds the table
//! of the corpus against this project's plugin (one column per backend, from one run of the
//! corpus: `harness run --results FILE` writes it) and CRIU's C plugins, and writes or checks it
//! (`harness::conformance`).
//!
//! `harness sweep [--full] [-j N] [--waiting-jobs N] [--only FILTER] [--out FILE]` runs the fault sweep
//! (`harness::sweep`) and prints its table: call, fault, phase, task, host, tree, outcome, check.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::path::PathBuf;

use harness::kit::{self, PluginUnderTest};
use harness::profile::HostProfile;
use harness::runner;
use harness::scenario::Capability;

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

/// `harness run`: runs the scenario corpus.
#[derive(Debug, Parser)]
#[command(
    name = "harness run",
    about = "Runs the scenario corpus (default: scenarios/) and prints one line per scenario.",
    after_help = "The CUDA plugin under test defaults to this project's, with every capability it has."
)]
struct RunArgs {
    /// Scenarios at a time (default: twice the cores, 2 to 8; they mostly wait).
    #[arg(short = 'j', long = "jobs", value_name = "N", default_value_t = runner::default_jobs())]
    jobs: usize,
    /// Also write JUnit XML: one test suite per scenario, one test case per step.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Another plugin's .so; outcomes (exit status, task and CUDA states, GPU data, nothing
    /// left behind, bounded time) are checked, this project's log lines and snapshots are not;
    /// scenarios that do not load the CUDA plugin are not applicable.
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// What enables it without a GPU, repeatable (default for --plugin: CRIU_FAULT=138, CRIU's
    /// FI_PLUGIN_CUDA_FORCE_ENABLE; `none`: nothing).
    #[arg(long = "plugin-env", value_name = "VAR=VAL")]
    plugin_env: Vec<String>,
    /// Its name in the inventory and its options' namespace (default: its descriptor's name).
    #[arg(long = "plugin-name", value_name = "NAME")]
    plugin_name: Option<String>,
    /// What it can do beyond lock/checkpoint/restore/unlock through cuda-checkpoint,
    /// comma-separated, or `all` (default for --plugin: none): plugin-options, driver-api,
    /// device-map, call-timeout, restore-as-dumped, custom-storage, parallel; a scenario
    /// needing one it lacks is reported as not applicable, with the reason.
    #[arg(long = "plugin-caps", value_name = "LIST")]
    plugin_caps: Option<String>,
    /// Give scenarios that pin no backend `cuda_plugin.backend=B` first (only for a plugin with
    /// plugin-options); those that pin another are not applicable.
    #[arg(long, value_name = "B")]
    backend: Option<String>,
    /// How the summary names it.
    #[arg(long = "plugin-label", value_name = "TEXT")]
    plugin_label: Option<String>,
    /// Also write every scenario's result as JSON, for `harness conformance --ours-from FILE`.
    #[arg(long, value_name = "FILE")]
    results: Option<PathBuf>,
    /// Scenario files or directories (default: scenarios/).
    #[arg(value_name = "SCENARIO_FILE_OR_DIR")]
    paths: Vec<PathBuf>,
}

/// `harness run [-j N] [--junit FILE] [plugin options] PATH...`: runs the scenario corpus.
fn run_scenarios(args: &[OsString]) -> Result<ExitCode> {
    let RunArgs {
        jobs,
        junit,
        plugin,
        plugin_env,
        plugin_name: name,
        plugin_caps,
        backend,
        plugin_label: label,
        results,
        mut paths,
    } = RunArgs::parse_from(
        std::iter::once(OsString::from("harness run")).chain(args.iter().cloned()),
    );
    let env: Option<Vec<(String, String)>> = if plugin_env.is_empty() {
        None
    } else {
        let mut list = Vec::new();
        for v in plugin_env.iter().filter(|v| *v != "none") {
            let (k, val) = v
                .split_once('=')
                .with_context(|| format!("--plugin-env {v}: expected VAR=VALUE"))?;
            list.push((k.to_owned(), val.to_owned()));
        }
        Some(list)
    };
    let caps: Option<std::collections::BTreeSet<Capability>> = match plugin_caps {
        None => None,
        Some(v) if v == "all" => Some(Capability::ALL.into_iter().collect()),
        Some(v) => Some(
            v.split(',')
                .filter(|c| !c.is_empty() && *c != "none")
                .map(|c| c.parse::<Capability>().map_err(anyhow::Error::msg))
                .collect::<Result<_>>()?,
        ),
    };
    if paths.is_empty() {
        paths.push(PathBuf::from("scenarios"));
    }
    let art = artifacts_as_subreaper()?;
    let mut put = match &plugin {
        Some(p) => {
            let p =
                std::fs::canonicalize(p).with_context(|| format!("--plugin {}", p.display()))?;
            let mut put = PluginUnderTest::other(&p);
            put.name = match &name {
                Some(n) => n.clone(),
                None => {
                    kit::descriptor(&art, &p, "pr3076")
                        .map_err(anyhow::Error::msg)?
                        .name
                }
            };
            put
        }
        None => PluginUnderTest::ours(),
    };
    if let Some(e) = env {
        put.enable = e;
    }
    if let Some(n) = name {
        put.name = n;
    }
    if let Some(c) = caps {
        put.capabilities = c;
    }
    if let Some(b) = backend {
        if !["driver-api", "cuda-checkpoint"].contains(&b.as_str()) {
            bail!("--backend {b}: expected driver-api or cuda-checkpoint");
        }
        if !put.has(Capability::PluginOptions) {
            bail!("--backend needs a plugin with the plugin-options capability");
        }
        put.label = format!("{}, {b}", put.label);
        put.backend = Some(b);
        put.explicit = true;
    }
    if let Some(l) = label {
        put.label = l;
    }
    let opts = runner::CorpusOptions {
        jobs,
        run: runner::RunOptions {
            require_criu: criu_cuda_env::is_on(criu_cuda_env::REQUIRE_CRIU),
        },
        plugin: put,
        print_rows: true,
    };
    let started = std::time::Instant::now();
    let (rows, ok) = runner::run_corpus(&paths, &art, &opts);
    if let Some(f) = junit {
        let xml = harness::junit::render(&rows, &opts.plugin.label, started.elapsed());
        std::fs::write(&f, xml).with_context(|| format!("writing {}", f.display()))?;
        println!("JUnit XML: {}", f.display());
    }
    if let Some(f) = results {
        let r = harness::conformance::Results::of(&opts.plugin, &rows);
        std::fs::write(&f, serde_json::to_string_pretty(&r)?)
            .with_context(|| format!("writing {}", f.display()))?;
        println!("results: {}", f.display());
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `harness conformance [--out FILE | --check FILE] [--ours-from FILE] [-j N] [PATH...]`.
fn run_conformance(args: &[OsString]) -> Result<ExitCode> {
    use harness::conformance;
    let mut jobs = runner::default_jobs();
    let mut out: Option<PathBuf> = None;
    let mut check: Option<PathBuf> = None;
    let mut ours_from: Option<PathBuf> = None;
    let mut paths = Vec::new();
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = it.next() {
        match a.as_str() {
            "-j" | "--jobs" => jobs = it.next().context("-j needs a number")?.parse()?,
            "--out" => out = Some(PathBuf::from(it.next().context("--out needs a file")?)),
            "--check" => check = Some(PathBuf::from(it.next().context("--check needs a file")?)),
            "--ours-from" => {
                ours_from = Some(PathBuf::from(
                    it.next().context("--ours-from needs a file")?,
                ));
            }
            "-h" | "--help" => {
                println!(
                    "usage: harness conformance [--out FILE] [--check FILE] [--ours-from FILE] [-j N] [SCENARIO_DIR...]\n\n\
                     Builds the conformance table of the corpus (default scenarios/): this project's plugin\n\
                     (one column per backend, from one run of the corpus with its own options: --ours-from\n\
                     takes the results `harness run --results FILE` wrote, else it runs the corpus here;\n\
                     scenarios that pin no backend run once more with cuda-checkpoint) and the C plugins of\n\
                     scripts/fetch-criu.sh --c-plugin (only the scenarios that apply to them run). --out\n\
                     writes the table (docs/conformance.md), --check fails when a cell differs from FILE's\n\
                     (with --out too, the fresh table is written there)."
                );
                return Ok(ExitCode::SUCCESS);
            }
            s if s.starts_with('-') => bail!("harness conformance: unknown option `{s}`"),
            _ => paths.push(PathBuf::from(a)),
        }
    }
    if out.is_none() && check.is_none() {
        bail!("harness conformance: give --out FILE, --check FILE or both");
    }
    if paths.is_empty() {
        paths.push(PathBuf::from("scenarios"));
    }
    let art = artifacts_as_subreaper()?;
    let columns = conformance::standard_columns(&art.workspace).map_err(anyhow::Error::msg)?;
    let options = |plugin: &PluginUnderTest| runner::CorpusOptions {
        jobs,
        // The table must be complete: a real-CRIU scenario without its CRIU fails.
        run: runner::RunOptions { require_criu: true },
        plugin: plugin.clone(),
        print_rows: false,
    };
    let work = runner::work(&paths);
    let mut scenarios = Vec::new();
    for (name, file, _) in &work {
        let variant = harness::scenario::matrix::split_name(name).1;
        let s = harness::scenario::Scenario::load_variant(file, variant)
            .with_context(|| format!("scenario {name}"))?;
        scenarios.push((name.clone(), s));
    }
    let names: Vec<String> = work.iter().map(|(n, _, _)| n.clone()).collect();
    let started = std::time::Instant::now();
    let ours = match &ours_from {
        Some(f) => {
            let r = conformance::Results::read_for(f, &names).map_err(anyhow::Error::msg)?;
            println!(
                "this project's plugin: {} results from {}",
                r.cells.len(),
                f.display()
            );
            r.cells
        }
        None => {
            let (rows, took) =
                runner::run_work(work.clone(), &art, &options(&PluginUnderTest::ours()));
            println!(
                "this project's plugin: {} scenarios run ({:.1} s)",
                rows.len(),
                took.as_secs_f64()
            );
            rows.iter().map(conformance::Cell::from).collect()
        }
    };
    let ([da, cc], rerun) =
        conformance::our_columns(&ours, &scenarios, [&columns[0], &columns[1]], &art)
            .map_err(anyhow::Error::msg)?;
    // What still runs, in one pool (so that one column's slowest scenarios do not leave the
    // others waiting): the cuda-checkpoint column's scenarios that pin no backend, and every
    // C plugin's column (a scenario that does not apply to it is not run).
    let mut todo: Vec<(usize, (String, PathBuf, PathBuf))> = work
        .iter()
        .filter(|(n, _, _)| rerun.contains(n))
        .map(|w| (1, w.clone()))
        .collect();
    for c in 2..columns.len() {
        todo.extend(work.iter().map(|w| (c, w.clone())));
    }
    // The likely longest first (as `harness run` orders them).
    todo.sort_by_cached_key(|(c, (name, path, _))| {
        let cost = harness::scenario::Scenario::load_variant(
            path,
            harness::scenario::matrix::split_name(name).1,
        )
        .map_or(0, |s| s.cost_hint());
        (std::cmp::Reverse(cost), *c)
    });
    let per_column: Vec<runner::CorpusOptions> =
        columns.iter().map(|c| options(&c.plugin)).collect();
    let pool_started = std::time::Instant::now();
    let rows = runner::pool::run(
        todo,
        jobs,
        |(c, (name, path, snaps))| {
            (
                c,
                runner::run_scenario(&name, &path, &snaps, &art, &per_column[c]),
            )
        },
        |_| {},
    );
    let mut runs: Vec<Vec<conformance::Cell>> = vec![da, cc];
    runs.resize(columns.len(), Vec::new());
    for (c, row) in &rows {
        runs[*c].push(conformance::Cell::from(row));
    }
    for (c, col) in columns.iter().enumerate().skip(1) {
        let mine: Vec<&runner::Row> = rows
            .iter()
            .filter(|(k, _)| *k == c)
            .map(|(_, r)| r)
            .collect();
        let count = |k: &str| mine.iter().filter(|r| r.result().starts_with(k)).count();
        println!(
            "{}: ran {} scenario(s): {} pass, {} fail, {} xfail, {} n.a.",
            col.heading,
            mine.len(),
            count("pass"),
            count("fail"),
            count("xfail"),
            count("n.a."),
        );
    }
    println!(
        "the runs still needed, {} at a time: {:.1} s",
        jobs,
        pool_started.elapsed().as_secs_f64()
    );
    println!("conformance: {:.1} s", started.elapsed().as_secs_f64());
    let table = conformance::Table::from_runs(&columns, &runs);
    let descriptions: std::collections::BTreeMap<String, String> = scenarios
        .into_iter()
        .map(|(name, s)| (name, s.description))
        .collect();
    let md = conformance::render(&table, &descriptions);
    if let Some(f) = &out {
        std::fs::write(f, &md).with_context(|| format!("writing {}", f.display()))?;
        println!("wrote {}", f.display());
    }
    if let Some(f) = &check {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let was = conformance::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        let d = conformance::diff(&was, &table);
        if !d.is_empty() {
            eprintln!(
                "\n{} cell(s) differ from {}:\n  {}\n\nIf the change is intended, regenerate the table with \
                 `harness conformance --out {}` and commit it.",
                d.len(),
                f.display(),
                d.join("\n  "),
                f.display()
            );
            return Ok(ExitCode::FAILURE);
        }
        println!("{}: every cell as committed", f.display());
    }
    Ok(ExitCode::SUCCESS)
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

/// `harness soak`: the chaos soak.
#[derive(Debug, Parser)]
#[command(
    name = "harness soak",
    about = "Runs dumps and restores of CUDA trees with a bad day drawn at random from the seed (the helper, a cuda-checkpoint run or a workload task killed in a call, a call stalled past its deadline; both backends, both parallel settings, trees in their own namespaces) and checks that every task is back or the checkpoint succeeded; a failing run prints the command that replays it."
)]
struct SoakArgs {
    /// How many runs.
    #[arg(long, default_value_t = 50)]
    runs: u64,
    /// The seed (default: from the clock, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Only this run of the seed (a replay).
    #[arg(long, value_name = "I")]
    run: Option<u64>,
    /// Runs at a time (default: twice the cores, 2 to 8; they mostly wait).
    #[arg(short = 'j', long = "jobs", value_name = "N", default_value_t = runner::default_jobs())]
    jobs: usize,
    /// Runs that wait out a stall at a time, beside the others (default: as many as --jobs; 0
    /// runs them with the others).
    #[arg(long = "waiting-jobs", value_name = "N")]
    waiting_jobs: Option<usize>,
}

/// `harness soak [--runs N] [--seed S] [--run I] [-j N] [--waiting-jobs N]`: the chaos soak.
fn run_soak(args: &[OsString]) -> Result<ExitCode> {
    use harness::soak;
    let a = SoakArgs::parse_from(
        std::iter::once(OsString::from("harness soak")).chain(args.iter().cloned()),
    );
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let runs: Vec<u64> = match a.run {
        Some(i) => vec![i],
        None => (0..a.runs).collect(),
    };
    let art = artifacts_as_subreaper()?;
    let waiting_jobs = a.waiting_jobs.unwrap_or(a.jobs);
    eprintln!(
        "soak: seed {seed}, {} run(s) of {} cases, {} at a time and {waiting_jobs} waiting ones beside them",
        runs.len(),
        soak::space().len(),
        a.jobs,
    );
    let started = std::time::Instant::now();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let total = runs.len();
    let results = soak::run(&runs, seed, &art, a.jobs, waiting_jobs, &|r| {
        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        eprintln!(
            "[{n}/{total}] {:.1}s {}: {}",
            r.elapsed.as_secs_f64(),
            r.case.key(),
            r.outcome
        );
    });
    let mut failed = 0;
    for r in &results {
        if let Some(why) = r.failure() {
            failed += 1;
            eprintln!(
                "FAILED run {} (seed {seed}): {}: {why}\n  replay: {}\n{}",
                r.run,
                r.result.case.key(),
                r.replay(seed),
                r.result.detail
            );
        }
    }
    print!(
        "{}",
        soak::figures(&results, started.elapsed().as_secs_f64())
    );
    println!("seed {seed}");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `harness sweep`: the fault sweep.
#[derive(Debug, Parser)]
#[command(
    name = "harness sweep",
    about = "Runs the fault sweep (faults at each driver call, phase and task) and prints its table: call, fault, phase, task, host, tree, outcome, check."
)]
struct SweepArgs {
    /// Add the slow faults (delays and hangs) everywhere.
    #[arg(long)]
    full: bool,
    /// Cases at a time (default: twice the cores, 2 to 8; they mostly wait).
    #[arg(short = 'j', long = "jobs", value_name = "N", default_value_t = runner::default_jobs())]
    jobs: usize,
    /// Cases that wait out a delay or a hang at a time, beside the others (default: as many as
    /// --jobs; 0 runs them with the others).
    #[arg(long = "waiting-jobs", value_name = "N")]
    waiting_jobs: Option<usize>,
    /// Only the cases whose key (`call|fault|phase|task|host|tree|mode`) contains FILTER.
    #[arg(long, value_name = "FILTER")]
    only: Option<String>,
    /// Also write the table to FILE.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Print the selected cases' keys and their number, and run none.
    #[arg(long)]
    list: bool,
    /// Print the selected cases as scenarios (`harness run` runs a saved one), and run none.
    #[arg(long)]
    print: bool,
}

/// `harness sweep [--full] [-j N] [--waiting-jobs N] [--only FILTER] [--out FILE]`: the fault sweep.
fn run_sweep(args: &[OsString]) -> Result<ExitCode> {
    use harness::sweep;
    let SweepArgs {
        full,
        jobs,
        waiting_jobs,
        only,
        out,
        list,
        print,
    } = SweepArgs::parse_from(
        std::iter::once(OsString::from("harness sweep")).chain(args.iter().cloned()),
    );
    let mut cases = sweep::cases(full);
    if let Some(f) = &only {
        cases = sweep::filter(cases, f);
    }
    if print {
        for c in &cases {
            println!("# {}\n{}", c.key(), c.scenario_toml());
        }
        return Ok(ExitCode::SUCCESS);
    }
    if list {
        for c in &cases {
            println!("{}", c.key());
        }
        println!("{} cases", cases.len());
        return Ok(ExitCode::SUCCESS);
    }
    let art = artifacts_as_subreaper()?;
    let total = cases.len();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let started = std::time::Instant::now();
    let results = sweep::run_all(&cases, &art, jobs, waiting_jobs.unwrap_or(jobs), &|r| {
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
    if args.first().is_some_and(|a| a == "soak") {
        return run_soak(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "conformance") {
        return run_conformance(&args[1..]);
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
