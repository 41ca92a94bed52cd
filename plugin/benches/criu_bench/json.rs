//! The report's summary as JSON (`criu_bench.json`): per configuration and size the min and
//! median times, the target ratio, the emulated engine's hook latency and the scenario suite.
//! Times are rounded to µs (3 decimals of a ms); what cannot be computed is `null`.

use crate::config::CONFIGS;
use crate::report::Report;
use crate::summary::{col, median, min, of};
use serde::Serialize;

#[derive(Debug, Serialize)]
struct Json<'a> {
    criu: &'a str,
    rounds: usize,
    date: &'a str,
    cpu: &'a str,
    cores: usize,
    kernel: &'a str,
    load_start: &'a str,
    load_end: &'a str,
    summary: Vec<Summary>,
    driver_api_n32_ratio: Option<f64>,
    emulated: Vec<EmulatedHook<'a>>,
    scenario_suite: Option<ScenarioSuite<'a>>,
}

/// One configuration at one size.
#[derive(Debug, Serialize)]
struct Summary {
    config: &'static str,
    n: usize,
    dump_min: f64,
    dump_median: f64,
    restore_min: f64,
    restore_median: f64,
    dump_restore_min: f64,
    dump_restore_median: f64,
    cli_runs_dump: usize,
    cli_runs_restore: usize,
}

/// One hook of one backend under the emulated engine.
#[derive(Debug, Serialize)]
struct EmulatedHook<'a> {
    backend: &'a str,
    hook: &'a str,
    calls: usize,
    min_ms: f64,
    median_ms: f64,
}

#[derive(Debug, Serialize)]
struct ScenarioSuite<'a> {
    scenarios: usize,
    wall_s: f64,
    per_s: f64,
    summary: &'a str,
}

/// `v` rounded to 3 decimals, as the tables print it (`NaN` and the infinities are written as
/// `null`).
fn num(v: f64) -> f64 {
    format!("{v:.3}").parse().unwrap_or(f64::NAN)
}

impl Report<'_> {
    pub(crate) fn json(&self) -> String {
        let m = self.m;
        let mut summary = Vec::new();
        for &n in &self.o.sizes {
            for c in CONFIGS {
                let ss = of(self.samples, c, n);
                if ss.is_empty() {
                    continue;
                }
                let d = col(&ss, |x| x.dump_ms);
                let r = col(&ss, |x| x.restore_ms);
                let dr = col(&ss, Self::dr);
                summary.push(Summary {
                    config: c.name(),
                    n,
                    dump_min: num(min(&d)),
                    dump_median: num(median(&d)),
                    restore_min: num(min(&r)),
                    restore_median: num(median(&r)),
                    dump_restore_min: num(min(&dr)),
                    dump_restore_median: num(median(&dr)),
                    cli_runs_dump: ss.iter().map(|x| x.dump_runs).max().unwrap_or(0),
                    cli_runs_restore: ss.iter().map(|x| x.restore_runs).max().unwrap_or(0),
                });
            }
        }
        let mut emulated = Vec::new();
        if let Some(e) = self.emu {
            for (be, hooks) in &e.hooks {
                for (h, v) in hooks {
                    emulated.push(EmulatedHook {
                        backend: be,
                        hook: h,
                        calls: v.len(),
                        min_ms: num(min(v)),
                        median_ms: num(median(v)),
                    });
                }
            }
        }
        let scenario_suite = self
            .suite
            .filter(|su| su.scenarios > 0)
            .map(|su| ScenarioSuite {
                scenarios: su.scenarios,
                wall_s: num(su.wall_s),
                per_s: num(su.scenarios as f64 / su.wall_s),
                summary: &su.summary,
            });
        let json = Json {
            criu: &self.criu_version,
            rounds: self.o.rounds,
            date: &m.date,
            cpu: &m.cpu,
            cores: m.cores,
            kernel: &m.kernel,
            load_start: &m.load_start,
            load_end: &m.load_end,
            summary,
            driver_api_n32_ratio: self.target_ratio().map(num),
            emulated,
            scenario_suite,
        };
        let mut s = serde_json::to_string_pretty(&json).expect("the summary serialises");
        s.push('\n');
        s
    }
}
