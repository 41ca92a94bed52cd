//! Results: the human table and JUnit XML.

use std::fmt::Write as _;
use std::time::Duration;

use crate::plugin_log::Phases;

/// How a test ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It printed PASS and exited 0.
    Pass,
    /// Anything else, with the reason.
    Fail(String),
    /// A precondition is missing (found by the runner or by the workload), with the reason.
    Skip(String),
}

impl Outcome {
    /// `PASS`, `FAIL` or `SKIP`.
    #[must_use]
    pub const fn label(&self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Fail(_) => "FAIL",
            Outcome::Skip(_) => "SKIP",
        }
    }
}

/// The `cuda-cs-*.img` files a dump wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CsFiles {
    /// How many.
    pub files: u32,
    /// Their total size in bytes.
    pub bytes: u64,
}

/// One dump (and restore) of a test.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cycle {
    /// `criu dump` wall time.
    pub criu_dump: Option<Duration>,
    /// `criu restore` wall time (none with `--leave-running`).
    pub criu_restore: Option<Duration>,
    /// The plugin's phase times.
    pub phases: Phases,
    /// The `cuda-cs-*.img` files of the dump (counted when the case sets custom storage).
    pub cs_files: Option<CsFiles>,
}

/// One test's result.
#[derive(Debug, Clone, PartialEq)]
pub struct TestResult {
    /// The workload name.
    pub name: String,
    /// The backend it ran with.
    pub backend: String,
    /// `cuda_plugin.custom-storage=` of the case (`on`, `off`), `None` when not passed.
    pub custom_storage: Option<String>,
    /// How it ended.
    pub outcome: Outcome,
    /// Device memory reported in the READY line.
    pub device_bytes: Option<u64>,
    /// Every dump/restore cycle, in order.
    pub cycles: Vec<Cycle>,
    /// Wall time of the whole test.
    pub elapsed: Duration,
    /// Where its logs are.
    pub log_dir: Option<String>,
    /// Extra lines for JUnit's system-out (the workload's INFO lines, CRIU errors).
    pub notes: Vec<String>,
}

/// Gigabytes (10^9 bytes) per second, for `bytes` moved in `ms` milliseconds.
#[must_use]
pub fn gbps(bytes: u64, ms: f64) -> Option<f64> {
    // An allow, not an expect: the lint is pedantic and fires only where a build enables it.
    #[allow(
        clippy::cast_precision_loss,
        reason = "u64 -> f64 loses precision only above 2^53 bytes; irrelevant for a rate"
    )]
    let b = bytes as f64;
    (ms > 0.0 && bytes > 0).then(|| b / (ms / 1000.0) / 1e9)
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, s) = v.fold((0u32, 0.0), |(n, s), x| (n + 1, s + x));
    (n > 0).then(|| s / f64::from(n))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Means over a test's cycles (`None` when no cycle has the value).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    /// Lock, ms.
    pub lock: Option<f64>,
    /// Checkpoint, ms.
    pub checkpoint: Option<f64>,
    /// Restore, ms.
    pub restore: Option<f64>,
    /// Unlock, ms.
    pub unlock: Option<f64>,
    /// `criu dump`, ms.
    pub criu_dump: Option<f64>,
    /// `criu restore`, ms.
    pub criu_restore: Option<f64>,
    /// Device bytes / checkpoint time.
    pub checkpoint_gbps: Option<f64>,
    /// Device bytes / restore time.
    pub restore_gbps: Option<f64>,
    /// Device bytes / `criu dump` wall time.
    pub criu_dump_gbps: Option<f64>,
    /// Device bytes / `criu restore` wall time.
    pub criu_restore_gbps: Option<f64>,
    /// The first cycle's `cuda-cs-*.img` files.
    pub cs_files: Option<CsFiles>,
}

impl TestResult {
    /// Means over the cycles, and the rates.
    #[must_use]
    pub fn summary(&self) -> Summary {
        let c = &self.cycles;
        let s = Summary {
            lock: mean(c.iter().filter_map(|c| c.phases.lock)),
            checkpoint: mean(c.iter().filter_map(|c| c.phases.checkpoint)),
            restore: mean(c.iter().filter_map(|c| c.phases.restore)),
            unlock: mean(c.iter().filter_map(|c| c.phases.unlock)),
            criu_dump: mean(c.iter().filter_map(|c| c.criu_dump.map(ms))),
            criu_restore: mean(c.iter().filter_map(|c| c.criu_restore.map(ms))),
            checkpoint_gbps: None,
            restore_gbps: None,
            criu_dump_gbps: None,
            criu_restore_gbps: None,
            cs_files: c.iter().find_map(|c| c.cs_files),
        };
        let rate = |t: Option<f64>| self.device_bytes.zip(t).and_then(|(b, t)| gbps(b, t));
        Summary {
            checkpoint_gbps: self
                .device_bytes
                .zip(s.checkpoint)
                .and_then(|(b, t)| gbps(b, t)),
            restore_gbps: self
                .device_bytes
                .zip(s.restore)
                .and_then(|(b, t)| gbps(b, t)),
            criu_dump_gbps: rate(s.criu_dump),
            criu_restore_gbps: rate(s.criu_restore),
            ..s
        }
    }

    /// The case's name: `cuda00`, or `cuda00[custom-storage=on]`.
    #[must_use]
    pub fn case_name(&self) -> String {
        match &self.custom_storage {
            None => self.name.clone(),
            Some(c) => format!("{}[custom-storage={c}]", self.name),
        }
    }
}

fn mib(b: u64) -> String {
    // An allow, not an expect: the lint is pedantic (see `gbps`).
    #[allow(
        clippy::cast_precision_loss,
        reason = "display only: MiB with one decimal"
    )]
    let m = b as f64 / 1048576.0;
    format!("{m:.1}")
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{x:.prec$}"))
}

/// The human table: one row per test (means over its cycles), then the reasons of failures and
/// skips, then the totals.
#[must_use]
pub fn table(results: &[TestResult]) -> String {
    let head = [
        "TEST",
        "BACKEND",
        "RESULT",
        "CYCLES",
        "DEV MiB",
        "LOCK ms",
        "CKPT ms",
        "CKPT GB/s",
        "RSTR ms",
        "RSTR GB/s",
        "UNLK ms",
        "DUMP ms",
        "RESTORE ms",
    ];
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| (*s).to_owned()).collect()];
    for r in results {
        let s = r.summary();
        rows.push(vec![
            r.case_name(),
            r.backend.clone(),
            r.outcome.label().to_owned(),
            r.cycles.len().to_string(),
            r.device_bytes.map_or_else(|| "-".to_owned(), mib),
            opt(s.lock, 1),
            opt(s.checkpoint, 1),
            opt(s.checkpoint_gbps, 2),
            opt(s.restore, 1),
            opt(s.restore_gbps, 2),
            opt(s.unlock, 1),
            opt(s.criu_dump, 0),
            opt(s.criu_restore, 0),
        ]);
    }
    let mut out = align(&rows, 3);
    out.push_str(&custom_storage_table(results));
    let mut reasons = String::new();
    for r in results {
        match &r.outcome {
            Outcome::Pass => {}
            Outcome::Fail(why) | Outcome::Skip(why) => {
                let _ = writeln!(
                    reasons,
                    "  {} {} ({}): {why}",
                    r.outcome.label(),
                    r.case_name(),
                    r.backend
                );
            }
        }
    }
    if !reasons.is_empty() {
        out.push('\n');
        out.push_str(&reasons);
    }
    let (p, f, s) = counts(results);
    if results
        .iter()
        .any(|r| r.summary().restore.is_some() && r.summary().unlock.is_none())
    {
        out.push_str(
            "\nRSTR is the plugin's RESUME_DEVICES_LATE (restore and unlock together; the plugin does not log the unlock on its own).\n",
        );
    }
    let _ = writeln!(out, "\n{p} passed, {f} failed, {s} skipped");
    out
}

/// Rows as aligned columns: the first `left` left-aligned, the rest right-aligned.
fn align(rows: &[Vec<String>], left: usize) -> String {
    let n = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..n)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i < left {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Custom storage on and off side by side, one row per workload and backend that has a case
/// with `custom_storage` set: the results, the GPU bytes next to the `cuda-cs-*.img` files
/// (count and size) of the `on` dump, and `criu dump` / `criu restore` wall time and GB/s
/// (GPU bytes over the wall time) of each. Empty when no case sets custom storage.
#[must_use]
pub fn custom_storage_table(results: &[TestResult]) -> String {
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for r in results.iter().filter(|r| r.custom_storage.is_some()) {
        if !keys.contains(&(r.name.as_str(), r.backend.as_str())) {
            keys.push((&r.name, &r.backend));
        }
    }
    if keys.is_empty() {
        return String::new();
    }
    let head = [
        "TEST",
        "BACKEND",
        "ON",
        "OFF",
        "DEV MiB",
        "CS FILES",
        "CS MiB",
        "DUMP ms on",
        "off",
        "DUMP GB/s on",
        "off",
        "RESTORE ms on",
        "off",
        "RESTORE GB/s on",
        "off",
    ];
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| (*s).to_owned()).collect()];
    for (name, backend) in keys {
        let find = |cs: &str| {
            results.iter().find(|r| {
                r.name == name && r.backend == backend && r.custom_storage.as_deref() == Some(cs)
            })
        };
        let (on, off) = (find("on"), find("off"));
        let (son, soff) = (on.map(TestResult::summary), off.map(TestResult::summary));
        let label = |r: Option<&TestResult>| r.map_or("-", |r| r.outcome.label()).to_owned();
        let dev = on
            .and_then(|r| r.device_bytes)
            .or_else(|| off.and_then(|r| r.device_bytes));
        let cs = son.and_then(|s| s.cs_files);
        let get = |s: Option<Summary>, f: fn(&Summary) -> Option<f64>, p: usize| {
            opt(s.as_ref().and_then(f), p)
        };
        rows.push(vec![
            name.to_owned(),
            backend.to_owned(),
            label(on),
            label(off),
            dev.map_or_else(|| "-".to_owned(), mib),
            cs.map_or_else(|| "-".to_owned(), |c| c.files.to_string()),
            cs.map_or_else(|| "-".to_owned(), |c| mib(c.bytes)),
            get(son, |s| s.criu_dump, 0),
            get(soff, |s| s.criu_dump, 0),
            get(son, |s| s.criu_dump_gbps, 2),
            get(soff, |s| s.criu_dump_gbps, 2),
            get(son, |s| s.criu_restore, 0),
            get(soff, |s| s.criu_restore, 0),
            get(son, |s| s.criu_restore_gbps, 2),
            get(soff, |s| s.criu_restore_gbps, 2),
        ]);
    }
    let mut out = String::from(
        "\nCustom storage on vs off (criu dump / criu restore wall time; GB/s = GPU bytes / wall time; CS = the on dump's cuda-cs-*.img files):\n",
    );
    out.push_str(&align(&rows, 4));
    out
}

/// `(passed, failed, skipped)`.
#[must_use]
pub fn counts(results: &[TestResult]) -> (usize, usize, usize) {
    results
        .iter()
        .fold((0, 0, 0), |(p, f, s), r| match r.outcome {
            Outcome::Pass => (p + 1, f, s),
            Outcome::Fail(_) => (p, f + 1, s),
            Outcome::Skip(_) => (p, f, s + 1),
        })
}

/// Escapes text for XML attributes and content (control characters other than tab, newline and
/// carriage return are not allowed in XML 1.0 and become U+FFFD).
#[must_use]
pub fn xml_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            '\t' | '\n' | '\r' => o.push(c),
            c if (c as u32) < 0x20 => o.push('\u{FFFD}'),
            c => o.push(c),
        }
    }
    o
}

fn secs(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

/// JUnit XML: one `<testsuite>` per backend, one `<testcase>` per test with its timings as
/// properties and its cycles and notes in `<system-out>`. Deterministic (no timestamps, no host
/// name), so it can be compared in tests.
#[must_use]
pub fn junit(results: &[TestResult]) -> String {
    let mut backends: Vec<&str> = Vec::new();
    for r in results {
        if !backends.contains(&r.backend.as_str()) {
            backends.push(&r.backend);
        }
    }
    let (_, f, s) = counts(results);
    let total: Duration = results.iter().map(|r| r.elapsed).sum();
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        x,
        "<testsuites name=\"zdtm-cuda\" tests=\"{}\" failures=\"{f}\" errors=\"0\" skipped=\"{s}\" time=\"{}\">",
        results.len(),
        secs(total)
    );
    for b in backends {
        let rs: Vec<&TestResult> = results.iter().filter(|r| r.backend == b).collect();
        let owned: Vec<TestResult> = rs.iter().map(|r| (*r).clone()).collect();
        let (_, f, s) = counts(&owned);
        let t: Duration = rs.iter().map(|r| r.elapsed).sum();
        let suite = xml_escape(&format!("zdtm-cuda.{b}"));
        let _ = writeln!(
            x,
            "  <testsuite name=\"{suite}\" tests=\"{}\" failures=\"{f}\" errors=\"0\" skipped=\"{s}\" time=\"{}\">",
            rs.len(),
            secs(t)
        );
        let _ = writeln!(
            x,
            "    <properties>\n      <property name=\"backend\" value=\"{}\"/>\n    </properties>",
            xml_escape(b)
        );
        for r in rs {
            junit_case(&mut x, &suite, r);
        }
        x.push_str("  </testsuite>\n");
    }
    x.push_str("</testsuites>\n");
    x
}

fn junit_case(x: &mut String, suite: &str, r: &TestResult) {
    let _ = writeln!(
        x,
        "    <testcase classname=\"{suite}\" name=\"{}\" time=\"{}\">",
        xml_escape(&r.case_name()),
        secs(r.elapsed)
    );
    let s = r.summary();
    let mut props: Vec<(&str, String)> = Vec::new();
    if let Some(c) = &r.custom_storage {
        props.push(("custom_storage", c.clone()));
    }
    if let Some(b) = r.device_bytes {
        props.push(("device_bytes", b.to_string()));
    }
    props.push(("cycles", r.cycles.len().to_string()));
    for (k, v, p) in [
        ("lock_ms", s.lock, 3),
        ("checkpoint_ms", s.checkpoint, 3),
        ("restore_ms", s.restore, 3),
        ("unlock_ms", s.unlock, 3),
        ("criu_dump_ms", s.criu_dump, 1),
        ("criu_restore_ms", s.criu_restore, 1),
        ("checkpoint_gbps", s.checkpoint_gbps, 3),
        ("restore_gbps", s.restore_gbps, 3),
        ("criu_dump_gbps", s.criu_dump_gbps, 3),
        ("criu_restore_gbps", s.criu_restore_gbps, 3),
    ] {
        if let Some(v) = v {
            props.push((k, format!("{v:.p$}")));
        }
    }
    if let Some(c) = s.cs_files {
        props.push(("cs_files", c.files.to_string()));
        props.push(("cs_bytes", c.bytes.to_string()));
    }
    if let Some(d) = &r.log_dir {
        props.push(("log_dir", d.clone()));
    }
    x.push_str("      <properties>\n");
    for (k, v) in props {
        let _ = writeln!(
            x,
            "        <property name=\"{k}\" value=\"{}\"/>",
            xml_escape(&v)
        );
    }
    x.push_str("      </properties>\n");
    match &r.outcome {
        Outcome::Pass => {}
        Outcome::Fail(why) => {
            let _ = writeln!(
                x,
                "      <failure message=\"{}\" type=\"FAIL\">{}</failure>",
                xml_escape(why),
                xml_escape(why)
            );
        }
        Outcome::Skip(why) => {
            let _ = writeln!(x, "      <skipped message=\"{}\"/>", xml_escape(why));
        }
    }
    let mut out = String::new();
    for (i, c) in r.cycles.iter().enumerate() {
        let _ = writeln!(
            out,
            "cycle {}: criu dump {} ms, criu restore {} ms, lock {} ms, checkpoint {} ms, restore {} ms, unlock {} ms",
            i + 1,
            opt(c.criu_dump.map(ms), 1),
            opt(c.criu_restore.map(ms), 1),
            opt(c.phases.lock, 3),
            opt(c.phases.checkpoint, 3),
            opt(c.phases.restore, 3),
            opt(c.phases.unlock, 3),
        );
        if let Some(f) = c.cs_files {
            let _ = writeln!(
                out,
                "cycle {}: {} cuda-cs-*.img file(s), {} bytes",
                i + 1,
                f.files,
                f.bytes
            );
        }
    }
    for n in &r.notes {
        out.push_str(n);
        out.push('\n');
    }
    if !out.is_empty() {
        let _ = writeln!(x, "      <system-out>{}</system-out>", xml_escape(&out));
    }
    x.push_str("    </testcase>\n");
}
