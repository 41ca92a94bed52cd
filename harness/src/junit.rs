//! JUnit XML of a `harness run`, for CI systems: one `<testsuite>` per scenario and one
//! `<testcase>` per step of it (`step 0: dump`, ...), plus `outcome` for the end-state checks
//! (and `setup` when the scenario failed before its first step). A failed one holds a
//! `<failure>` whose message is the first line of why (the same on every run) and whose text is
//! all of it; steps a failure kept from running, and scenarios that were skipped or are not
//! applicable to the plugin under test, are `<skipped>` with the reason; the failing step of a
//! `known_failure` scenario is `<skipped>` as "known failure". A scenario file that does not
//! parse is one failed `parse` test case; a transcript that differs from its snapshot fails a
//! `snapshot` test case.
//!
//! Written by hand rather than with a crate (`quick-junit` would bring `quick-xml`, `chrono`,
//! `uuid` and more for what is a few elements): the only subtle part, escaping, is
//! [`escape`], tested below.

use std::fmt::Write as _;
use std::time::Duration;

use crate::runner::{Row, Verdict};

/// `s` as XML 1.0 character data or attribute value: `&<>"'` escaped, characters XML cannot
/// hold (most C0 controls, lone surrogates cannot occur in a `str`) replaced with U+FFFD.
#[must_use]
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

struct Case {
    name: String,
    time: Duration,
    /// (message, text)
    failure: Option<(String, String)>,
    skipped: Option<String>,
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn cases(r: &Row) -> Vec<Case> {
    let case = |name: &str, failure: Option<&str>, skipped: Option<String>| Case {
        name: name.to_owned(),
        time: Duration::ZERO,
        failure: failure.map(|f| (first_line(f).to_owned(), f.to_owned())),
        skipped,
    };
    let Some(rep) = &r.report else {
        return vec![case("parse", r.error.as_deref(), None)];
    };
    match &rep.verdict {
        Verdict::NotApplicable(why) => {
            return vec![case(
                "scenario",
                None,
                Some(format!("not applicable: {why}")),
            )]
        }
        Verdict::Skip(why) => return vec![case("scenario", None, Some(format!("skipped: {why}")))],
        _ => {}
    }
    let xfail = matches!(rep.verdict, Verdict::XFail(_));
    let mut out: Vec<Case> = rep
        .steps
        .iter()
        .map(|st| Case {
            name: st.name.clone(),
            time: st.elapsed,
            failure: st
                .failure
                .as_ref()
                .filter(|_| !xfail)
                .map(|f| (first_line(f).to_owned(), f.clone())),
            skipped: st.skipped.clone().or_else(|| {
                st.failure
                    .as_ref()
                    .filter(|_| xfail)
                    .map(|f| format!("known failure: {}", first_line(f)))
            }),
        })
        .collect();
    if let Some(e) = &r.error {
        out.push(case("snapshot", Some(e), None));
    }
    out
}

/// The JUnit XML of `rows`, run with the plugin `label`, in `took`.
#[must_use]
pub fn render(rows: &[Row], label: &str, took: Duration) -> String {
    let all: Vec<(&Row, Vec<Case>)> = rows.iter().map(|r| (r, cases(r))).collect();
    let count = |f: &dyn Fn(&Case) -> bool| {
        all.iter()
            .map(|(_, cs)| cs.iter().filter(|c| f(c)).count())
            .sum::<usize>()
    };
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        x,
        "<testsuites name=\"harness run: {}\" tests=\"{}\" failures=\"{}\" skipped=\"{}\" time=\"{:.3}\">",
        escape(label),
        count(&|_| true),
        count(&|c| c.failure.is_some()),
        count(&|c| c.skipped.is_some()),
        took.as_secs_f64()
    );
    for (row, cs) in &all {
        let time: Duration = cs.iter().map(|c| c.time).sum();
        let _ = writeln!(
            x,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" skipped=\"{}\" time=\"{:.3}\">",
            escape(&row.name),
            cs.len(),
            cs.iter().filter(|c| c.failure.is_some()).count(),
            cs.iter().filter(|c| c.skipped.is_some()).count(),
            time.as_secs_f64()
        );
        if let Some(rep) = &row.report {
            let _ = writeln!(
                x,
                "    <properties><property name=\"host\" value=\"{}\"/><property name=\"plugin\" value=\"{}\"/><property name=\"result\" value=\"{}\"/></properties>",
                escape(&rep.host),
                escape(label),
                escape(&row.result())
            );
        }
        for c in cs {
            let open = format!(
                "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\"",
                escape(&row.name),
                escape(&c.name),
                c.time.as_secs_f64()
            );
            match (&c.failure, &c.skipped) {
                (Some((msg, text)), _) => {
                    let _ = writeln!(
                        x,
                        "{open}>\n      <failure message=\"{}\">{}</failure>\n    </testcase>",
                        escape(msg),
                        escape(text)
                    );
                }
                (None, Some(why)) => {
                    let _ = writeln!(
                        x,
                        "{open}>\n      <skipped message=\"{}\"/>\n    </testcase>",
                        escape(why)
                    );
                }
                (None, None) => {
                    let _ = writeln!(x, "{open}/>");
                }
            }
        }
        x.push_str("  </testsuite>\n");
    }
    x.push_str("</testsuites>\n");
    x
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::{Report, StepRecord};

    fn report(verdict: Verdict, steps: Vec<StepRecord>) -> Option<Report> {
        Some(Report {
            verdict,
            host: "criu 4.1".to_owned(),
            backend: "-".to_owned(),
            transcript: String::new(),
            snapshot_applies: false,
            steps,
            elapsed: Duration::from_millis(1500),
            invariants: None,
        })
    }

    fn step(name: &str, failure: Option<&str>, skipped: Option<&str>) -> StepRecord {
        StepRecord {
            name: name.to_owned(),
            elapsed: Duration::from_millis(250),
            failure: failure.map(str::to_owned),
            skipped: skipped.map(str::to_owned),
        }
    }

    #[test]
    fn escaping_keeps_the_document_well_formed() {
        assert_eq!(
            escape("a<b>&\"c\"'d'"),
            "a&lt;b&gt;&amp;&quot;c&quot;&apos;d&apos;"
        );
        assert_eq!(
            escape("tab\tnl\n\u{1b}[0m\u{0}"),
            "tab\tnl\n\u{fffd}[0m\u{fffd}"
        );
        assert_eq!(escape("GPU-ü €"), "GPU-ü €");
    }

    #[test]
    fn one_suite_per_scenario_one_case_per_step() {
        let rows = vec![
            Row {
                name: "criu/41/a".to_owned(),
                report: report(
                    Verdict::Fail("step 0 (dump): expected ok, got failed\n<log>".to_owned()),
                    vec![
                        step(
                            "step 0: dump",
                            Some("step 0 (dump): expected ok, got failed\n<log>"),
                            None,
                        ),
                        step("step 1: restore", None, Some("not reached")),
                        step("outcome", None, Some("not reached")),
                    ],
                ),
                error: None,
            },
            Row {
                name: "cuda/b".to_owned(),
                report: report(
                    Verdict::NotApplicable("needs device-map (sets x)".to_owned()),
                    vec![],
                ),
                error: None,
            },
            Row {
                name: "cuda/c".to_owned(),
                report: report(
                    Verdict::Pass,
                    vec![
                        step("step 0: dump", None, None),
                        step("outcome", None, None),
                    ],
                ),
                error: None,
            },
            Row {
                name: "bad".to_owned(),
                report: None,
                error: Some("bad.toml: unknown key `x`".to_owned()),
            },
        ];
        let x = render(&rows, "CRIU 4.1.1 C plugin", Duration::from_secs(2));
        assert!(x.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"harness run: CRIU 4.1.1 C plugin\" tests=\"7\" failures=\"2\" skipped=\"3\" time=\"2.000\">"), "{x}");
        assert!(x.contains("<testsuite name=\"criu/41/a\" tests=\"3\" failures=\"1\" skipped=\"2\" time=\"0.750\">"), "{x}");
        assert!(x.contains("<failure message=\"step 0 (dump): expected ok, got failed\">step 0 (dump): expected ok, got failed\n&lt;log&gt;</failure>"), "{x}");
        assert!(x.contains("<testcase classname=\"cuda/b\" name=\"scenario\" time=\"0.000\">\n      <skipped message=\"not applicable: needs device-map (sets x)\"/>"), "{x}");
        assert!(
            x.contains("<testcase classname=\"cuda/c\" name=\"outcome\" time=\"0.250\"/>"),
            "{x}"
        );
        assert!(x.contains("<testcase classname=\"bad\" name=\"parse\" time=\"0.000\">\n      <failure message=\"bad.toml: unknown key `x`\">"), "{x}");
        assert_eq!(x.matches("<testsuite ").count(), 4);
        assert_eq!(x.matches("</testsuite>").count(), 4);
        assert!(x.ends_with("</testsuites>\n"));
    }
}
