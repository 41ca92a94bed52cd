//! The command line: `cargo bench -p cuda-plugin --bench criu_bench -- [OPTIONS]`, and the
//! settings it resolves to (a benchmark run with `--bench`, else the smoke test).

use crate::config::Config;
use clap::Parser;
use std::path::PathBuf;

/// The command line as given.
#[derive(Debug, Parser)]
#[command(
    name = "criu_bench",
    about = "what cuda_plugin.so costs under real CRIU (docs/performance.md)",
    args_override_self = true
)]
pub(crate) struct Args {
    /// A real benchmark run (`cargo bench` passes it); else a one-round N=1 smoke test.
    #[arg(long)]
    bench: bool,
    /// Rounds (default 5; 1 in the smoke test).
    #[arg(long, value_name = "R")]
    rounds: Option<usize>,
    /// Tree sizes N (default 1,8,32; 1 in the smoke test).
    #[arg(long, value_name = "N,...", value_delimiter = ',', value_parser = parse_size)]
    sizes: Option<Vec<usize>>,
    /// The CRIU to run (default: CRIU 4.2.x from target/criu, else 4.1.x).
    #[arg(long, value_name = "PATH")]
    criu: Option<PathBuf>,
    /// Skip the emulated engine's hook latency.
    #[arg(long)]
    no_emulated: bool,
    /// Skip the scenario suite's throughput.
    #[arg(long)]
    no_scenarios: bool,
    /// Where criu_bench.{md,csv,json} go (default: <target-dir>/bench).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Where the plot goes (default: docs/performance.svg).
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,
    /// Write no plot.
    #[arg(long)]
    no_svg: bool,
    /// Where the mock worlds live (default: /dev/shm when writable, else the temporary
    /// directory).
    #[arg(long, value_name = "DIR")]
    world_dir: Option<PathBuf>,
    /// The configurations to sample (default: all).
    #[arg(
        long,
        value_name = "driver-api,cuda-checkpoint,c-plugin,...",
        value_delimiter = ',',
        value_parser = Config::parse
    )]
    configs: Option<Vec<Config>>,
    /// List the tests (libtest's `--list`, as test runners ask).
    #[arg(long, hide = true)]
    list: bool,
    #[command(flatten)]
    pub(crate) libtest: Libtest,
}

/// The other options of libtest's command line, which `cargo test` and `cargo bench` may pass
/// on to a `harness = false` target: accepted and ignored.
#[derive(Debug, clap::Args)]
pub(crate) struct Libtest {
    #[arg(long, hide = true)]
    nocapture: bool,
    #[arg(long, hide = true)]
    show_output: bool,
    #[arg(long, hide = true, value_name = "N")]
    test_threads: Option<String>,
    #[arg(long, hide = true)]
    exact: bool,
    #[arg(long, hide = true)]
    ignored: bool,
    #[arg(long, hide = true)]
    include_ignored: bool,
    #[arg(long, hide = true)]
    test: bool,
    #[arg(short, long, hide = true)]
    quiet: bool,
    #[arg(long, hide = true)]
    color: Option<String>,
    #[arg(long, hide = true)]
    format: Option<String>,
    #[arg(long, hide = true)]
    skip: Vec<String>,
    #[arg(long, hide = true)]
    logfile: Option<String>,
    #[arg(long, hide = true)]
    report_time: bool,
    #[arg(long, hide = true)]
    ensure_time: bool,
    #[arg(long, hide = true)]
    shuffle: bool,
    #[arg(long, hide = true)]
    shuffle_seed: Option<String>,
    #[arg(long, hide = true)]
    force_run_in_process: bool,
    #[arg(long, hide = true)]
    exclude_should_panic: bool,
    #[arg(short = 'Z', hide = true)]
    unstable: Vec<String>,
    /// Test name filters.
    #[arg(hide = true)]
    filters: Vec<String>,
}

impl Libtest {
    /// The libtest arguments given, as on the command line.
    pub(crate) fn given(&self) -> Vec<String> {
        let mut out = Vec::new();
        let flags = [
            ("--nocapture", self.nocapture),
            ("--show-output", self.show_output),
            ("--exact", self.exact),
            ("--ignored", self.ignored),
            ("--include-ignored", self.include_ignored),
            ("--test", self.test),
            ("--quiet", self.quiet),
            ("--report-time", self.report_time),
            ("--ensure-time", self.ensure_time),
            ("--shuffle", self.shuffle),
            ("--force-run-in-process", self.force_run_in_process),
            ("--exclude-should-panic", self.exclude_should_panic),
        ];
        out.extend(flags.iter().filter(|f| f.1).map(|f| f.0.to_owned()));
        let values = [
            ("--test-threads", &self.test_threads),
            ("--color", &self.color),
            ("--format", &self.format),
            ("--logfile", &self.logfile),
            ("--shuffle-seed", &self.shuffle_seed),
        ];
        for (flag, v) in values {
            if let Some(v) = v {
                out.push(format!("{flag} {v}"));
            }
        }
        out.extend(self.skip.iter().map(|s| format!("--skip {s}")));
        out.extend(self.unstable.iter().map(|z| format!("-Z {z}")));
        out.extend(self.filters.iter().cloned());
        out
    }
}

fn parse_size(s: &str) -> Result<usize, String> {
    s.trim().parse::<usize>().map_err(|e| e.to_string())
}

/// The settings of one run.
#[derive(Debug, Clone)]
pub(crate) struct Opts {
    /// `--bench` was given (a real benchmark run); else a smoke test.
    pub(crate) bench: bool,
    pub(crate) rounds: usize,
    pub(crate) sizes: Vec<usize>,
    pub(crate) criu: Option<PathBuf>,
    pub(crate) emulated: bool,
    pub(crate) scenarios: bool,
    pub(crate) out: Option<PathBuf>,
    pub(crate) svg: Option<PathBuf>,
    pub(crate) no_svg: bool,
    pub(crate) list: bool,
    pub(crate) world_dir: Option<PathBuf>,
    /// `--configs`: the configurations to sample (default: all).
    pub(crate) configs: Option<Vec<Config>>,
}

impl Opts {
    /// The settings the command line asks for (clap exits with status 2 on a malformed one);
    /// libtest's own arguments are ignored, each with a note on stderr.
    pub(crate) fn from_command_line() -> Result<Opts, String> {
        let args = Args::parse();
        for a in args.libtest.given() {
            eprintln!("criu_bench: ignoring argument {a:?}");
        }
        Opts::resolve(args)
    }

    /// The settings `a` asks for.
    pub(crate) fn resolve(a: Args) -> Result<Opts, String> {
        let mut o = Opts {
            bench: a.bench,
            rounds: a.rounds.unwrap_or(5),
            sizes: a.sizes.clone().unwrap_or_else(|| vec![1, 8, 32]),
            criu: a.criu,
            emulated: !a.no_emulated,
            scenarios: !a.no_scenarios,
            out: a.out,
            svg: a.svg,
            no_svg: a.no_svg,
            list: a.list,
            world_dir: a.world_dir,
            configs: a.configs,
        };
        if o.rounds < 1 {
            return Err("--rounds must be at least 1".into());
        }
        if o.sizes.is_empty() || o.sizes.contains(&0) {
            return Err("--sizes must list sizes of at least 1".into());
        }
        if !o.bench {
            // The smoke test: one round of N=1 only, nothing else, nothing written.
            if a.rounds.is_none() {
                o.rounds = 1;
            }
            if a.sizes.is_none() {
                o.sizes = vec![1];
            }
            o.emulated = false;
            o.scenarios = false;
            o.no_svg = true;
        }
        Ok(o)
    }
}
