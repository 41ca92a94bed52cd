//! The corpus walk: collecting scenarios, running them on the worker pool, checking snapshots,
//! printing the table.

use super::*;

/// Every scenario under `dir` (a `*.toml` file, or a variant of one with a `[matrix]`), sorted,
/// with its name: the path relative to `dir` without the extension, and for a variant `@` and
/// its values (`containers/pid@criu-4.1,driver-api`). A file that does not parse is listed
/// under its file's name (running it reports the error).
#[must_use]
pub fn collect(dir: &Path) -> Vec<(String, PathBuf)> {
    collect_files(dir)
        .into_iter()
        .flat_map(|(name, p)| {
            let suffixes: Vec<String> = match Scenario::load_variants(&p) {
                Ok(all) => all.iter().map(|(v, _)| v.suffix()).collect(),
                Err(_) => vec![String::new()],
            };
            suffixes.into_iter().map(move |x| {
                let name = if x.is_empty() {
                    name.clone()
                } else {
                    format!("{name}@{x}")
                };
                (name, p.clone())
            })
        })
        .collect()
}

/// Every `*.toml` under `dir`, sorted, with the path relative to `dir` without the extension.
fn collect_files(dir: &Path) -> Vec<(String, PathBuf)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "toml") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    if dir.is_file() {
        files.push(dir.to_path_buf());
    } else {
        walk(dir, &mut files);
    }
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p
                .strip_prefix(dir)
                .ok()
                .filter(|r| !r.as_os_str().is_empty())
                .unwrap_or(&p)
                .with_extension("")
                .display()
                .to_string();
            (name, p)
        })
        .collect()
}

/// The snapshot file name of scenario `name` (`cuda/x` -> `cuda__x.snap`).
#[must_use]
pub fn snapshot_name(name: &str) -> String {
    name.replace('/', "__")
}

/// The body of an insta `.snap` file (after its `---` header), if it exists.
#[must_use]
pub fn read_snapshot(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let rest = text.strip_prefix("---\n")?;
    let at = rest.find("\n---\n")?;
    Some(rest[at + 5..].to_owned())
}

/// How a passing scenario without its snapshot file fails.
const NO_SNAPSHOT: &str = "no snapshot";

/// One row of the `harness run` table.
#[derive(Debug, Clone)]
pub struct Row {
    /// Scenario name.
    pub name: String,
    /// Its report (`None` when the file did not parse: then `error`).
    pub report: Option<Report>,
    /// Parse error or snapshot mismatch.
    pub error: Option<String>,
}

impl Row {
    /// The row's result in one line that is the same on every run: `pass`, `fail: WHY`,
    /// `n.a.: WHY`, `xfail: WHY` or `skip: WHY`.
    #[must_use]
    pub fn result(&self) -> String {
        match (&self.error, self.report.as_ref().map(|r| &r.verdict)) {
            (Some(e), None) => format!("fail: {}", first_line(e)),
            (Some(e), Some(_)) if e.starts_with(NO_SNAPSHOT) => format!("fail: {NO_SNAPSHOT}"),
            (Some(_), Some(_)) => "fail: the transcript differs from its snapshot".to_owned(),
            (None, Some(Verdict::Pass)) => "pass".to_owned(),
            (None, Some(Verdict::Fail(e))) => format!("fail: {}", first_line(e)),
            (None, Some(Verdict::Skip(why))) => format!("skip: {why}"),
            (None, Some(Verdict::XFail(why))) => format!("xfail: {}", first_line(why)),
            (None, Some(Verdict::NotApplicable(why))) => format!("n.a.: {why}"),
            (None, None) => "fail".to_owned(),
        }
    }

    /// Whether it counts as a failure.
    #[must_use]
    pub fn failed(&self) -> bool {
        self.error.is_some()
            || matches!(
                self.report.as_ref().map(|r| &r.verdict),
                None | Some(Verdict::Fail(_))
            )
    }
}

/// How [`run_corpus`] runs.
#[derive(Debug, Clone)]
pub struct CorpusOptions {
    /// Scenarios run at a time.
    pub jobs: usize,
    /// Per-run options.
    pub run: RunOptions,
    /// The CUDA plugin under test.
    pub plugin: PluginUnderTest,
    /// Print one line per scenario as it ends.
    pub print_rows: bool,
}

/// Runs every scenario under `paths`, `opts.jobs` at a time, checking transcripts against the
/// snapshots in `<scenarios>/snapshots/` where one exists and the run is the scenario's own with
/// this project's plugin. Returns the rows in file order and the wall time.
#[must_use]
pub fn run_rows(paths: &[PathBuf], art: &Artifacts, opts: &CorpusOptions) -> (Vec<Row>, Duration) {
    run_work(work(paths), art, opts)
}

/// Every scenario under `paths` as `harness run` names it (relative to the nearest directory
/// named `scenarios`, with `@VARIANT`), its file and its snapshot directory, in file order.
#[must_use]
pub fn work(paths: &[PathBuf]) -> Vec<(String, PathBuf, PathBuf)> {
    let mut work: Vec<(String, PathBuf, PathBuf)> = Vec::new();
    for root in paths {
        let base = if root.is_file() {
            root.parent().unwrap_or(Path::new(".")).to_path_buf()
        } else {
            root.clone()
        };
        let corpus = find_corpus_root(&base);
        for (listed, p) in collect(root) {
            let p = std::fs::canonicalize(&p).unwrap_or(p);
            let mut name = p
                .strip_prefix(&corpus)
                .unwrap_or(&p)
                .with_extension("")
                .display()
                .to_string();
            if let (_, Some(v)) = crate::scenario::matrix::split_name(&listed) {
                name = format!("{name}@{v}");
            }
            work.push((name, p, corpus.join("snapshots")));
        }
    }
    work
}

/// Runs the scenarios of `work` ([`work`]'s items), `opts.jobs` at a time, as [`run_rows`]
/// does.
#[must_use]
pub fn run_work(
    work: Vec<(String, PathBuf, PathBuf)>,
    art: &Artifacts,
    opts: &CorpusOptions,
) -> (Vec<Row>, Duration) {
    let started = Instant::now();
    if opts.print_rows {
        println!(
            "{:<64} {:<16} {:<16} {:<7} {:>7}",
            "scenario", "host", "backend", "result", "time"
        );
    }
    // The likely longest first, so that none of them starts last and holds the run up; the
    // rows come back in file order.
    let mut order: Vec<(usize, (String, PathBuf, PathBuf))> =
        work.into_iter().enumerate().collect();
    order.sort_by_cached_key(|(_, (name, path, _))| {
        std::cmp::Reverse(
            Scenario::load_variant(path, crate::scenario::matrix::split_name(name).1)
                .map_or(0, |s| s.cost_hint()),
        )
    });
    let mut rows = pool::run(
        order,
        opts.jobs,
        |(i, (name, path, snaps))| (i, run_scenario(&name, &path, &snaps, art, opts)),
        |(_, row)| {
            if opts.print_rows {
                print_row(row);
            }
        },
    );
    rows.sort_by_key(|(i, _)| *i);
    (
        rows.into_iter().map(|(_, r)| r).collect(),
        started.elapsed(),
    )
}

/// Runs every scenario under `paths` (see [`run_rows`]) and prints the table and the summary
/// to stdout (details of failures to stderr). Returns the rows and whether nothing failed.
#[must_use]
pub fn run_corpus(paths: &[PathBuf], art: &Artifacts, opts: &CorpusOptions) -> (Vec<Row>, bool) {
    let (rows, took) = run_rows(paths, art, opts);
    let (mut pass, mut fail, mut skip, mut xfail, mut na) = (0, 0, 0, 0, 0);
    for r in &rows {
        if r.failed() {
            fail += 1;
            let why =
                r.error
                    .clone()
                    .unwrap_or_else(|| match r.report.as_ref().map(|x| &x.verdict) {
                        Some(Verdict::Fail(e)) => e.clone(),
                        _ => String::new(),
                    });
            eprintln!("\n==== FAILED {}\n{why}", r.name);
            continue;
        }
        match r.report.as_ref().map(|x| &x.verdict) {
            Some(Verdict::Pass) => pass += 1,
            Some(Verdict::Skip(_)) => skip += 1,
            Some(Verdict::XFail(_)) => xfail += 1,
            Some(Verdict::NotApplicable(_)) => na += 1,
            Some(Verdict::Fail(_)) | None => {}
        }
    }
    let extra = |n: usize, what: &str| {
        if n > 0 {
            format!(", {n} {what}")
        } else {
            String::new()
        }
    };
    println!(
        "\n{pass} passed, {fail} failed, {skip} skipped{}{} ({} scenarios in {:.1} s, plugin {})",
        extra(xfail, "xfail"),
        extra(na, "not applicable"),
        rows.len(),
        took.as_secs_f64(),
        opts.plugin.label
    );
    (rows, fail == 0)
}

/// The directory holding `snapshots/` for scenarios under `dir`: the nearest ancestor named
/// `scenarios`, else `dir`.
fn find_corpus_root(dir: &Path) -> PathBuf {
    let abs = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    abs.ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "scenarios"))
        .map_or(abs.clone(), Path::to_path_buf)
}

/// Loads and runs scenario `name` (file `path`) and judges it: its verdict, and for a passing
/// run of this project's plugin, its transcript against `<snaps>/<name>.snap`. The one
/// implementation behind `harness run` and the libtest runner (`harness/tests/scenarios.rs`).
#[must_use]
pub fn run_scenario(
    name: &str,
    path: &Path,
    snaps: &Path,
    art: &Artifacts,
    opts: &CorpusOptions,
) -> Row {
    let s = match Scenario::load_variant(path, crate::scenario::matrix::split_name(name).1) {
        Ok(s) => s,
        Err(e) => {
            return Row {
                name: name.to_owned(),
                report: None,
                error: Some(e.to_string()),
            }
        }
    };
    let report = run_with(&s, art, opts.run, &opts.plugin);
    let error = check_snapshot(name, &report, snaps);
    Row {
        name: name.to_owned(),
        report: Some(report),
        error,
    }
}

/// Whether `report` matches its snapshot in `snaps`: `None` when it does or none applies (a
/// run that did not pass, or another plugin's), else why not, with the transcript.
fn check_snapshot(name: &str, report: &Report, snaps: &Path) -> Option<String> {
    if report.verdict != Verdict::Pass || !report.snapshot_applies {
        return None;
    }
    let snap = snaps.join(format!("{}.snap", snapshot_name(name)));
    match read_snapshot(&snap) {
        Some(want) if want.trim_end() != report.transcript.trim_end() => Some(format!(
            "transcript differs from {} (run `cargo insta test -p harness --test scenarios` to review)\n{}",
            snap.display(),
            report.transcript
        )),
        Some(_) => None,
        // A passing scenario of this project's plugin has its transcript on file.
        None => Some(format!(
            "{NO_SNAPSHOT} {} (bless it: INSTA_UPDATE=always cargo test -p harness --test scenarios -- {name})\n{}",
            snap.display(),
            report.transcript
        )),
    }
}

fn print_row(r: &Row) {
    let (host, backend, time) = match &r.report {
        None => ("-".to_owned(), "-".to_owned(), 0.0),
        Some(rep) => (
            rep.host.clone(),
            rep.backend.clone(),
            rep.elapsed.as_secs_f64(),
        ),
    };
    let result = match (&r.report, &r.error) {
        (None, _) => "fail (parse)".to_owned(),
        (Some(_), Some(_)) => "fail (snapshot)".to_owned(),
        (Some(_), None) => r.result(),
    };
    println!(
        "{:<64} {host:<16} {backend:<16} {result:<7} {time:>6.1}s",
        r.name
    );
}
