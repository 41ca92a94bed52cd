//! The report as CSV (`criu_bench.csv`): one row per sample.

use crate::report::Report;
use std::fmt::Write as _;

impl Report<'_> {
    pub(crate) fn csv(&self) -> String {
        let mut s = String::from(
            "round,config,n,dump_ms,restore_ms,dump_restore_ms,cli_runs_dump,cli_runs_restore,\
             trace_lines_dump,trace_lines_restore,\
             pause_ms_sum,checkpoint_ms_sum,resume_ms_sum,criu_freezing_ms,criu_frozen_ms,\
             criu_memdump_ms,criu_memwrite_ms,criu_pages_written,criu_forking_ms,criu_restore_ms\n",
        );
        for x in self.samples {
            let h = |n: &str| x.hooks.get(n).map_or(0.0, |v| v.iter().sum::<f64>());
            let _ = writeln!(
                s,
                "{},{},{},{:.3},{:.3},{:.3},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.0},{:.3},{:.3}",
                x.round,
                x.config.name(),
                x.n,
                x.dump_ms,
                x.restore_ms,
                x.dump_ms + x.restore_ms,
                x.dump_runs,
                x.restore_runs,
                x.dump_calls,
                x.restore_calls,
                h("PAUSE_DEVICES"),
                h("CHECKPOINT_DEVICES"),
                h("RESUME_DEVICES_LATE"),
                x.stats.freezing,
                x.stats.frozen,
                x.stats.memdump,
                x.stats.memwrite,
                x.stats.pages,
                x.stats.forking,
                x.stats.restore
            );
        }
        s
    }
}
