//! The scenario suite's throughput: `harness run scenarios` once, its wall time and count.

use crate::emulated::harness_exe;
use std::process::{Command, Stdio};
use std::time::Instant;
use testkit::criu::*;

#[derive(Debug, Clone, Default)]
pub(crate) struct Suite {
    pub(crate) wall_s: f64,
    pub(crate) scenarios: usize,
    pub(crate) summary: String,
    pub(crate) note: Option<String>,
}

pub(crate) fn scenario_suite() -> Suite {
    let mut s = Suite::default();
    let Some(harness) = harness_exe() else {
        s.note = Some("skipped: no `harness` built next to this bench".into());
        return s;
    };
    let t = Instant::now();
    let out = Command::new(&harness)
        .arg("run")
        .arg("scenarios")
        .current_dir(workspace())
        .stdin(Stdio::null())
        .output();
    s.wall_s = t.elapsed().as_secs_f64();
    reap();
    match out {
        Err(e) => s.note = Some(format!("could not run harness run: {e}")),
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout);
            // "P passed, F failed, S skipped (T scenarios in X s)"
            let line = text
                .lines()
                .rev()
                .find(|l| l.contains(" scenarios in "))
                .unwrap_or("")
                .trim()
                .to_owned();
            s.scenarios = line
                .split_once('(')
                .and_then(|(_, r)| r.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            if !o.status.success() {
                let failed: Vec<String> = String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .filter_map(|l| l.strip_prefix("==== FAILED "))
                    .map(str::to_owned)
                    .collect();
                s.note = Some(format!(
                    "harness run exited with {}; failed: {} (the scenario suite's failures, not \
                     the benchmark's)",
                    o.status,
                    failed.join(", ")
                ));
            }
            s.summary = line;
        }
    }
    s
}
