//! `criu_bench`: what `cuda_plugin.so` costs under real CRIU, side by side with a plugin-free
//! dump, plus the plugin's hook latency under the emulated engine and the scenario suite's
//! throughput. See `docs/performance.md` for the method and the latest results.
//!
//! # What one run measures
//!
//! 1. **Real CRIU** (4.2.x if present, else 4.1.x; `--criu PATH` to choose): dump + restore of
//!    trees of N = 1, 8, 32 processes (`--sizes`) in each configuration (`--configs` picks some):
//!    - `driver-api`: `mock-cuda-app --kib 64 --children N-1 --child-args "--kib 64"` (N mock
//!      CUDA processes) with the plugin, `cuda_plugin.backend=driver-api` and
//!      `cuda_plugin.parallel=1` (one task at a time; `auto` is the default);
//!    - `cuda-checkpoint`: the same tree with `cuda_plugin.backend=cuda-checkpoint` (and
//!      `parallel=1`);
//!    - `driver-api-noguard`: as `driver-api` with `cuda_plugin.guardian=off` (no helper
//!      process: what the guardian costs);
//!    - `driver-api-parallel`, `cuda-checkpoint-parallel`: as `driver-api` and
//!      `cuda-checkpoint` with `cuda_plugin.parallel=auto` (every task's checkpoint and restore
//!      at the first hook call of CRIU's loop);
//!    - `plain`: the same tree with `--cpu-only` (no driver loaded) and an empty plugin
//!      directory (no plugin at all);
//!    - `c-plugin`: CRIU's own C `cuda_plugin.so` of the same CRIU (built by
//!      `scripts/fetch-criu.sh --c-plugin`, enabled with `CRIU_FAULT=138`), where it was built.
//!
//!    Every round runs every (N, configuration) pair once, in an order rotated per round, so
//!    drift in the machine's load hits all configurations alike; min and median over the rounds
//!    are reported. Each sample uses a fresh mock world and tree; only the `criu dump` and
//!    `criu restore -d` processes are timed (wall clock, spawn to exit). After each restore the
//!    tree is checked (every task runs free, every task's data check PASSes on SIGUSR1).
//!    From each sample: the `cuda-checkpoint` runs of the dump and of the restore (the world
//!    trace's `cuda-checkpoint(...) = exit=N` lines), the plugin's per-task hook times
//!    (`<HOOK> pid N: done in X ms` at `-v4`), and CRIU's own phase times (`stats-dump`,
//!    `stats-restore` in the image directory).
//! 2. **Emulated engine**: `harness --host pr3076 dump` / `restore` of an 8-task CUDA tree, per
//!    backend, interleaved the same way; per-call hook latency from the plugin log.
//! 3. **Scenario suite**: `harness run scenarios/` wall time and scenarios/s (once, at the end).
//!
//! Output: tables on stdout, `<target-dir>/bench/criu_bench.{json,csv}` and the plot
//! `docs/performance.svg` (median dump+restore against N).
//!
//! # Running
//!
//! `scripts/bench.sh [ROUNDS]` builds everything in release mode and runs
//! `cargo bench -p cuda-plugin --bench criu_bench -- --rounds ROUNDS`. Options:
//! `--rounds R` (default 5), `--sizes 1,8,32`, `--criu PATH`, `--no-emulated`,
//! `--no-scenarios`, `--out DIR`, `--svg PATH`, `--no-svg`, `--world-dir DIR`,
//! `--configs NAME,...` (`--help` lists them).
//!
//! Without `--bench` on the command line (`cargo test --all-targets` runs bench targets that
//! way) it is a smoke test: one round of N=1 in every configuration, nothing written.
//! It skips (exit 0) when not root or when no CRIU is found. A failed sample keeps its
//! directory (images, CRIU logs, world) and prints its path; `CRIU_BENCH_KEEP=1` keeps all.
//!
//! # Layout
//!
//! `args` (the command line), `config` (the configurations), `run` (one sample's directory,
//! world and tree), `sample` (one dump + restore and what is read from it), `stats` (CRIU's
//! stats images), `emulated` (the emulated engine), `suite` (the scenario suite), `summary`
//! (min and median), `machine` (the host), `report` (the tables), `csv`, `json` and `svg`
//! (the other forms of the report). A `harness = false` bench runs no `#[test]` functions: the
//! tests of `args`, `config` and `stats` are in `plugin/tests/criu_bench_parts.rs`.

mod args;
mod config;
mod csv;
mod emulated;
mod json;
mod machine;
mod report;
mod run;
mod sample;
mod stats;
mod suite;
mod summary;
mod svg;

use args::Opts;
use config::{Config, CONFIGS};
use machine::{loadavg, machine, sh};
use report::Report;
use run::{c_plugin_of, world_base, Bench};
use sample::sample;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;
use testkit::criu::*;

fn criu_version(p: &Path) -> String {
    let out = sh(&p.display().to_string(), &["--version"]);
    out.lines()
        .find_map(|l| l.strip_prefix("Version:"))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| format!("at {}", p.display()))
}

fn main() -> ExitCode {
    let o = match Opts::from_command_line() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("criu_bench: {e}");
            return ExitCode::from(2);
        }
    };
    if o.list {
        if !o.bench {
            println!("criu_bench_smoke: test");
        }
        return ExitCode::SUCCESS;
    }
    let mode = if o.bench { "bench" } else { "smoke" };
    if !is_root() {
        println!("criu_bench ({mode}): skipped: not root (CRIU needs root)");
        return ExitCode::SUCCESS;
    }
    let (criu, version) = match &o.criu {
        Some(p) => (p.clone(), criu_version(p)),
        None => {
            let found = find_criu();
            let pick = found
                .iter()
                .find(|c| c.series == "4.2")
                .or_else(|| found.first());
            match pick {
                Some(c) => (c.path.clone(), c.version.clone()),
                None => {
                    println!(
                        "criu_bench ({mode}): skipped: no CRIU 4.1.x/4.2.x found (run \
                         scripts/fetch-criu.sh, set CRIU_CUDA_CRIU_4_2, or pass --criu PATH)"
                    );
                    return ExitCode::SUCCESS;
                }
            }
        }
    };
    let a = match artifacts() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("criu_bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !become_subreaper() {
        eprintln!("criu_bench: warning: cannot become a child subreaper");
    }
    let c_plugin = c_plugin_of(&criu);
    let b = Bench {
        criu,
        criu_version: version,
        a,
        world_base: world_base(o.world_dir.as_deref()),
        c_plugin,
    };
    // The configurations sampled: `--configs`, else all; CRIU's C plugin only where it was built.
    let configs: Vec<Config> = CONFIGS
        .iter()
        .copied()
        .filter(|c| o.configs.as_ref().is_none_or(|cs| cs.contains(c)))
        .filter(|&c| {
            let have = c != Config::CPlugin || b.c_plugin.is_some();
            if !have {
                eprintln!(
                    "criu_bench: no C plugin beside {} (scripts/fetch-criu.sh --c-plugin builds it): \
                     c-plugin not sampled",
                    b.criu.display()
                );
            }
            have
        })
        .collect();
    let mut m = machine();
    eprintln!(
        "criu_bench ({mode}): CRIU {} at {}; {} round(s) of sizes {:?}",
        b.criu_version,
        b.criu.display(),
        o.rounds,
        o.sizes
    );
    let started = Instant::now();
    let mut failed = false;
    if o.bench {
        // Warm-up (discarded): page cache, first-exec costs.
        for &c in &configs {
            if let Err(e) = sample(&b, c, 1, 0) {
                eprintln!("criu_bench: warm-up {}: {e}", c.name());
            }
        }
    }
    let mut samples = Vec::new();
    for round in 1..=o.rounds {
        for i in 0..o.sizes.len() {
            let n = o.sizes[(i + round) % o.sizes.len()];
            for k in 0..configs.len() {
                let c = configs[(k + round + i) % configs.len()];
                match sample(&b, c, n, round) {
                    Ok(s) => {
                        eprintln!(
                            "  round {round} {:<15} N={n:<3} dump {:>7.1} ms  restore {:>7.1} ms  cuda-checkpoint runs {}+{}",
                            c.name(),
                            s.dump_ms,
                            s.restore_ms,
                            s.dump_runs,
                            s.restore_runs
                        );
                        samples.push(s);
                    }
                    Err(e) => {
                        failed = true;
                        eprintln!("  round {round} {} N={n}: FAILED: {e}", c.name());
                    }
                }
            }
        }
    }
    let emu = o.emulated.then(|| emulated::emulated(&b, o.rounds));
    let suite = o.scenarios.then(suite::scenario_suite);
    m.load_end = loadavg();
    let report = Report {
        o: &o,
        criu_version: b.criu_version.clone(),
        world_base: b.world_base.display().to_string(),
        m: &m,
        samples: &samples,
        emu: emu.as_ref(),
        suite: suite.as_ref(),
    };
    print!("{}", report.text());
    println!(
        "\n(criu_bench took {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    if o.bench {
        let out = o.out.clone().unwrap_or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|e| Some(e.parent()?.parent()?.parent()?.join("bench")))
                .unwrap_or_else(|| workspace().join("target/bench"))
        });
        let write = |p: PathBuf, text: String| match std::fs::create_dir_all(
            p.parent().unwrap_or(Path::new(".")),
        )
        .and_then(|()| std::fs::write(&p, text))
        {
            Ok(()) => println!("wrote {}", p.display()),
            Err(e) => eprintln!("criu_bench: writing {}: {e}", p.display()),
        };
        write(out.join("criu_bench.csv"), report.csv());
        write(out.join("criu_bench.json"), report.json());
        write(out.join("criu_bench.md"), report.text());
        if !o.no_svg {
            let svg = o
                .svg
                .clone()
                .unwrap_or_else(|| workspace().join("docs/performance.svg"));
            write(svg, report.svg());
        }
    }
    if failed {
        eprintln!("criu_bench: some samples FAILED (their directories were kept)");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
