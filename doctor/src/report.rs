//! The doctor's report: one [`Check`] per thing checked, printed for a person or as JSON.

use serde::Serialize;
use std::fmt::Write as _;

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Nothing to do.
    Pass,
    /// Not checked (not applicable here, or what it needs is missing and another check says so).
    Skip,
    /// Works, with a limit or a risk the operator should know.
    Warn,
    /// The plugin cannot work here as the node is.
    Fail,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Skip => "SKIP",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One check: what it found and, unless it passed, the fix.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// A stable name (`criu`, `options-file`, ...), for automation.
    pub id: &'static str,
    pub status: Status,
    /// What was found, in one line.
    pub found: String,
    /// More of what was found, one line each.
    pub details: Vec<String>,
    /// The fix, in one sentence (absent for a check that passed).
    pub fix: Option<String>,
}

impl Check {
    pub fn new(id: &'static str, status: Status, found: impl Into<String>) -> Self {
        Check {
            id,
            status,
            found: found.into(),
            details: Vec::new(),
            fix: None,
        }
    }

    pub fn pass(id: &'static str, found: impl Into<String>) -> Self {
        Self::new(id, Status::Pass, found)
    }

    pub fn skip(id: &'static str, found: impl Into<String>) -> Self {
        Self::new(id, Status::Skip, found)
    }

    pub fn warn(id: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(id, Status::Warn, found).with_fix(fix)
    }

    pub fn fail(id: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(id, Status::Fail, found).with_fix(fix)
    }

    pub fn with_fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }

    pub fn detail(mut self, line: impl Into<String>) -> Self {
        self.details.push(line.into());
        self
    }
}

/// Every check of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The doctor's (and the plugin's) version.
    pub version: &'static str,
    /// The root prefix the files were read under.
    pub root: String,
    pub checks: Vec<Check>,
    pub summary: Summary,
}

/// How many checks ended how.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Summary {
    pub pass: usize,
    pub warn: usize,
    pub fail: usize,
    pub skip: usize,
}

impl Report {
    pub fn new(root: String, checks: Vec<Check>) -> Self {
        let mut summary = Summary::default();
        for c in &checks {
            match c.status {
                Status::Pass => summary.pass += 1,
                Status::Warn => summary.warn += 1,
                Status::Fail => summary.fail += 1,
                Status::Skip => summary.skip += 1,
            }
        }
        Report {
            version: cuda_plugin::PLUGIN_VERSION,
            root,
            checks,
            summary,
        }
    }

    /// Whether some check failed (the exit status is then 1).
    pub fn failed(&self) -> bool {
        self.summary.fail > 0
    }

    /// The report for a person: one block per check.
    pub fn human(&self) -> String {
        let mut out = format!("cuda-plugin-doctor {} (root {})\n", self.version, self.root);
        let width = self.checks.iter().map(|c| c.id.len()).max().unwrap_or(0);
        for c in &self.checks {
            let _ = writeln!(out, "{}  {:width$}  {}", c.status.word(), c.id, c.found);
            for d in &c.details {
                let _ = writeln!(out, "      {:width$}  {d}", "");
            }
            if let Some(fix) = &c.fix {
                let _ = writeln!(out, "      {:width$}  fix: {fix}", "");
            }
        }
        let s = self.summary;
        let _ = writeln!(
            out,
            "{} checks: {} pass, {} warn, {} fail, {} skip",
            self.checks.len(),
            s.pass,
            s.warn,
            s.fail,
            s.skip
        );
        out
    }
}
