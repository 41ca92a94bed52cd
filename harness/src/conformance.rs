//! The conformance table (`docs/conformance.md`): every scenario of the corpus against this
//! project's plugin (one column per backend) and CRIU's own C plugin of each fetched CRIU
//! (`scripts/fetch-criu.sh --c-plugin`), each cell `pass`, `fail: WHY`, `n.a.: WHY` or
//! `xfail: WHY`, with a summary per plugin. `harness conformance --out FILE` writes it;
//! `harness conformance --check FILE` runs the same and fails, naming each cell, when a cell
//! differs from the committed table.
//!
//! Column rules ([`crate::kit`] has the rest): this project's plugin's two columns come from one
//! run of the corpus with its own options (the main job's, `harness run --results FILE`, read
//! with `--ours-from FILE`, or run here): a scenario that pins a backend (an option, a matrix
//! value, or a step expecting one) appears in that backend's column only, one that pins `auto`
//! or an invalid backend (it tests the selection) in the driver-API column, and one that pins
//! none shows its run with the default backend in the driver-API column and is run once more,
//! here, with `cuda_plugin.backend=cuda-checkpoint` given first, for the other column. The C
//! plugins take no options: a scenario that pins `cuda-checkpoint` runs without the option, one
//! that needs options, the driver API or another capability is not applicable to them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::kit::PluginUnderTest;
use crate::runner::{Artifacts, Row};
use crate::scenario::Scenario;

/// One scenario's result in one run: its name, its host and the one-line result of
/// [`Row::result`]. A run of the corpus is a list of them ([`Results`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    /// The scenario (variant) name.
    pub name: String,
    /// `emulated 4.2`, `criu 4.1`, or `-` when it did not parse.
    pub host: String,
    /// `pass`, `fail: WHY`, `n.a.: WHY`, `xfail: WHY` or `skip: WHY`.
    pub result: String,
}

impl From<&Row> for Cell {
    fn from(r: &Row) -> Self {
        Self {
            name: r.name.clone(),
            host: r
                .report
                .as_ref()
                .map_or_else(|| "-".to_owned(), |x| x.host.clone()),
            result: r.result(),
        }
    }
}

/// What `harness run --results FILE` writes: one run of the corpus, for `harness conformance
/// --ours-from FILE` to build this project's columns from instead of running it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Results {
    /// How the run named its plugin.
    pub plugin: String,
    /// This project's plugin with its own options (no backend forced, nothing injected): the
    /// only run our columns can be built from.
    pub ours_as_is: bool,
    /// Every scenario of the run, in file order.
    pub cells: Vec<Cell>,
}

impl Results {
    /// The results of `rows`, a run of `put`.
    #[must_use]
    pub fn of(put: &PluginUnderTest, rows: &[Row]) -> Self {
        Self {
            plugin: put.label.clone(),
            ours_as_is: *put == PluginUnderTest::ours(),
            cells: rows.iter().map(Cell::from).collect(),
        }
    }

    /// Reads a results file and checks that it can give this project's columns for the
    /// scenarios `names`: a run of this project's plugin as is, of exactly these scenarios.
    ///
    /// # Errors
    /// Unreadable, malformed, another plugin's run, or another corpus (the names differ).
    pub fn read_for(path: &std::path::Path, names: &[String]) -> Result<Self, String> {
        let shown = path.display();
        let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
        let r: Self = serde_json::from_str(&text).map_err(|e| format!("{shown}: {e}"))?;
        if !r.ours_as_is {
            return Err(format!(
                "{shown} is a run of {}, not of this project's plugin with its own options",
                r.plugin
            ));
        }
        let have: Vec<&String> = r.cells.iter().map(|c| &c.name).collect();
        let missing: Vec<&String> = names.iter().filter(|n| !have.contains(n)).collect();
        let extra: Vec<&&String> = have.iter().filter(|n| !names.contains(n)).collect();
        if let Some(n) = missing.first() {
            return Err(format!(
                "{shown} lacks {} scenario(s) of the corpus (first: {n}): run the corpus again \
                 with `harness run --results {shown}`",
                missing.len()
            ));
        }
        if let Some(n) = extra.first() {
            return Err(format!(
                "{shown} has {} scenario(s) the corpus no longer has (first: {n}): run the \
                 corpus again with `harness run --results {shown}`",
                extra.len()
            ));
        }
        Ok(r)
    }
}

/// This project's two columns (driver API, `cuda-checkpoint`) from one run of its plugin as is
/// (`ours`, keyed by name) over `scenarios` (name, scenario; in table order): each column's
/// cells, and the scenarios that pin no backend, which the `cuda-checkpoint` column still needs
/// a run of (with that backend forced) — their cells in that column are left empty.
///
/// # Errors
/// A scenario the run lacks.
pub fn our_columns(
    ours: &[Cell],
    scenarios: &[(String, Scenario)],
    columns: [&Column; 2],
    art: &Artifacts,
) -> Result<([Vec<Cell>; 2], Vec<String>), String> {
    let by_name: BTreeMap<&str, &Cell> = ours.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut out: [Vec<Cell>; 2] = [Vec::new(), Vec::new()];
    let mut rerun = Vec::new();
    for (name, s) in scenarios {
        let run = by_name
            .get(name.as_str())
            .ok_or_else(|| format!("the run of this project's plugin lacks {name}"))?;
        for (i, col) in columns.iter().enumerate() {
            let result = match crate::kit::applicability(s, &col.plugin, art) {
                Err(why) => format!("n.a.: {why}"),
                // Pinned (to this column's backend, or to `auto`/an invalid one listed with
                // the driver API), or unpinned in the driver-API column: the run as is.
                Ok(()) if s.pinned_backend().is_some() || i == 0 => run.result.clone(),
                Ok(()) => {
                    rerun.push(name.clone());
                    continue;
                }
            };
            out[i].push(Cell {
                name: name.clone(),
                host: run.host.clone(),
                result,
            });
        }
    }
    Ok((out, rerun))
}

/// One column: a heading and the plugin it runs.
#[derive(Debug, Clone)]
pub struct Column {
    /// The heading (stable: the committed table is compared by it).
    pub heading: String,
    /// The plugin.
    pub plugin: PluginUnderTest,
}

/// The C plugins `scripts/fetch-criu.sh --c-plugin` built: `target/criu/c-plugins` (or
/// `$CRIU_CUDA_CRIU_DIR/c-plugins`), `<version> <path>` per line.
#[must_use]
pub fn c_plugins(workspace: &Path) -> Vec<(String, PathBuf)> {
    let list = std::env::var_os(criu_cuda_env::CRIU_DIR)
        .map_or_else(|| workspace.join("target/criu"), PathBuf::from)
        .join("c-plugins");
    std::fs::read_to_string(list)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (v, p) = l.split_once(' ')?;
            Some((v.trim().to_owned(), PathBuf::from(p.trim())))
        })
        .collect()
}

/// The standard columns: this project's plugin with each backend, then the C plugin of each
/// fetched CRIU (oldest first).
///
/// # Errors
/// No C plugin was built, or one listed is missing.
pub fn standard_columns(workspace: &Path) -> Result<Vec<Column>, String> {
    let mut cols: Vec<Column> = cuda_plugin::backend::registry::BACKENDS
        .iter()
        .map(|b| Column {
            heading: format!("criu-cuda ({})", b.title),
            plugin: PluginUnderTest::ours_with_backend(b.name),
        })
        .collect();
    let c = c_plugins(workspace);
    if c.is_empty() {
        return Err("no C plugin was built: run `bash scripts/fetch-criu.sh --c-plugin`".into());
    }
    for (version, path) in c {
        if !path.exists() {
            return Err(format!(
                "{} (CRIU {version}'s C plugin) is missing: run `bash scripts/fetch-criu.sh --c-plugin`",
                path.display()
            ));
        }
        let heading = format!("CRIU {version} C plugin");
        let mut plugin = PluginUnderTest::other(&path);
        plugin.label.clone_from(&heading);
        cols.push(Column { heading, plugin });
    }
    Ok(cols)
}

/// The table: headings, and per scenario its host and one cell per column.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Table {
    /// Column headings.
    pub columns: Vec<String>,
    /// Scenario -> (host, cells).
    pub rows: BTreeMap<String, (String, Vec<String>)>,
}

impl Table {
    /// The table of one run of the corpus per column (`runs[i]` is column `i`'s cells).
    #[must_use]
    pub fn from_runs(columns: &[Column], runs: &[Vec<Cell>]) -> Self {
        let mut rows: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
        for (i, run) in runs.iter().enumerate() {
            for c in run {
                let e = rows
                    .entry(c.name.clone())
                    .or_insert_with(|| (c.host.clone(), vec![String::new(); columns.len()]));
                if e.0 == "-" {
                    e.0.clone_from(&c.host);
                }
                e.1[i].clone_from(&c.result);
            }
        }
        Self {
            columns: columns.iter().map(|c| c.heading.clone()).collect(),
            rows,
        }
    }
}

fn cell_md(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace('\n', " ")
}

fn cell_unmd(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            if let Some(n) = it.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Splits a Markdown table line into cells, honouring `\|`.
fn split_row(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut cells = Vec::new();
    let mut cur = String::new();
    let mut it = inner.chars();
    while let Some(c) = it.next() {
        match c {
            '\\' => {
                cur.push(c);
                if let Some(n) = it.next() {
                    cur.push(n);
                }
            }
            '|' => cells.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    cells.push(cur);
    cells.into_iter().map(|c| cell_unmd(c.trim())).collect()
}

const ROWS_HEADING: &str = "## Scenarios";

fn kind(cell: &str) -> &str {
    cell.split(':').next().unwrap_or(cell)
}

const INTRO: &str = "\
# Conformance of CRIU CUDA plugins

<!-- Generated by `harness conformance --out docs/conformance.md`: do not edit by hand. CI runs
`harness conformance --check docs/conformance.md`, which fails when a cell changes. -->

Every scenario of the corpus (`scenarios/`), run by the harness against this project's plugin
and CRIU's own C `cuda_plugin.so` of each CRIU `scripts/fetch-criu.sh` fetches (built from
Debian's `criu` source package by `scripts/fetch-criu.sh --c-plugin`), on the mock CUDA world.
As root, `bash scripts/fetch-criu.sh --c-plugin` and then `harness conformance --out
docs/conformance.md` regenerate this file; `docs/development.md` says how to run the same kit
against another plugin.

- **pass**: every outcome held: CRIU's exit status at each step, every task's final state
  (running, parked or gone; never left stopped or traced) and final CUDA state (never left
  locked by mistake), the GPU data each task verifies and on which GPUs, nothing left behind,
  bounded time, and that an image holding GPU state requires the plugin (its inventory entry).
  For this project's plugin, its log lines, backend lines and transcript snapshots are checked
  too.
- **fail**: the first expectation that did not hold.
- **n.a.**: the scenario needs what the plugin does not offer (a capability:
  `plugin-options`, `driver-api`, `device-map`, `call-timeout`, `restore-as-dumped`,
  `custom-storage`, `parallel`), pins the other backend, does not load the CUDA plugin (it
  tests the engine), or runs on a CRIU that refuses the plugin's descriptor.
- **xfail**: a known failure, marked in the scenario (a limit of the CRIU it runs on).

This project's plugin has one column per backend, both from the corpus run of the main job
(`harness run --results`), in which every scenario runs once with its own options: one that
pins a backend (an option, a `[matrix]` value, or a step expecting one) is in that backend's
column only; one that pins `auto` or an invalid backend (it tests the selection) in the
driver-API column; one that pins none shows its run with the default backend in the driver-API
column, and runs once more with `cuda_plugin.backend=cuda-checkpoint` given before its own
options for the other column (its snapshot is then not compared). The C plugins take no options (a `backend` of
`cuda-checkpoint` or `auto` is dropped, anything else makes the scenario not applicable) and
are enabled with CRIU's fault 138 (`CRIU_FAULT=138`), this project's plugin with
`CRIU_CUDA_FORCE_ENABLE=1`.

";

/// The Markdown document: an introduction, the summary per plugin (with the description of
/// each scenario a plugin fails, from `descriptions`), and the table.
#[must_use]
pub fn render(t: &Table, descriptions: &BTreeMap<String, String>) -> String {
    let mut md = String::from(INTRO);
    md.push_str("## Summary\n\n| plugin | pass | fail | xfail | n.a. |\n|---|---|---|---|---|\n");
    for (i, col) in t.columns.iter().enumerate() {
        let count = |k: &str| t.rows.values().filter(|(_, c)| kind(&c[i]) == k).count();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            cell_md(col),
            count("pass"),
            count("fail"),
            count("xfail"),
            count("n.a.")
        );
    }
    md.push('\n');
    for (i, col) in t.columns.iter().enumerate() {
        let _ = writeln!(md, "### {col}\n");
        let cells: Vec<(&String, &String)> = t.rows.iter().map(|(n, (_, c))| (n, &c[i])).collect();
        let applicable = cells.iter().filter(|(_, c)| kind(c) != "n.a.").count();
        let pass = cells.iter().filter(|(_, c)| kind(c) == "pass").count();
        let _ = writeln!(
            md,
            "{pass} of the {applicable} scenarios that apply to it pass ({} in all).",
            cells.len()
        );
        let fails: Vec<&(&String, &String)> =
            cells.iter().filter(|(_, c)| kind(c) == "fail").collect();
        if !fails.is_empty() {
            md.push_str("\nIt fails:\n\n");
            for (n, c) in fails {
                let _ = writeln!(md, "- `{n}`: {}", cell_md(c.trim_start_matches("fail: ")));
                if let Some(d) = descriptions.get(*n) {
                    let _ = writeln!(md, "  ({d})");
                }
            }
        }
        let mut why: BTreeMap<String, usize> = BTreeMap::new();
        for (_, c) in cells.iter().filter(|(_, c)| kind(c) == "n.a.") {
            let reason = c.trim_start_matches("n.a.: ");
            let short = reason.split(" (").next().unwrap_or(reason);
            *why.entry(short.to_owned()).or_default() += 1;
        }
        if !why.is_empty() {
            md.push_str("\nNot applicable:\n\n");
            for (w, n) in &why {
                let _ = writeln!(md, "- {} ({n})", cell_md(w));
            }
        }
        md.push('\n');
    }
    let _ = writeln!(md, "{ROWS_HEADING}\n");
    let _ = writeln!(
        md,
        "| scenario | host | {} |",
        t.columns
            .iter()
            .map(|c| cell_md(c))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(md, "|---|---|{}", "---|".repeat(t.columns.len()));
    for (name, (host, cells)) in &t.rows {
        let _ = writeln!(
            md,
            "| `{}` | {host} | {} |",
            cell_md(name),
            cells
                .iter()
                .map(|c| cell_md(c))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    md
}

/// Reads the table back from a document [`render`] wrote.
///
/// # Errors
/// No scenario table, or a row with another number of cells than the heading.
pub fn parse(md: &str) -> Result<Table, String> {
    let start = md
        .find(ROWS_HEADING)
        .ok_or_else(|| format!("no `{ROWS_HEADING}` section"))?;
    let mut lines = md[start..]
        .lines()
        .skip(1)
        .filter(|l| l.trim_start().starts_with('|'));
    let head = split_row(lines.next().ok_or("no table heading")?);
    if head.len() < 3 || head[0] != "scenario" || head[1] != "host" {
        return Err(format!("unexpected table heading {head:?}"));
    }
    let columns = head[2..].to_vec();
    lines.next();
    let mut rows = BTreeMap::new();
    for line in lines {
        let cells = split_row(line);
        if cells.len() != head.len() {
            return Err(format!(
                "row has {} cells, heading {}: {line}",
                cells.len(),
                head.len()
            ));
        }
        let name = cells[0].trim_matches('`').to_owned();
        rows.insert(name, (cells[1].clone(), cells[2..].to_vec()));
    }
    Ok(Table { columns, rows })
}

/// Every difference between the committed table `was` and a fresh `now`, one line each.
#[must_use]
pub fn diff(was: &Table, now: &Table) -> Vec<String> {
    let mut out = Vec::new();
    if was.columns != now.columns {
        out.push(format!(
            "columns: were {:?}, now {:?}",
            was.columns, now.columns
        ));
        return out;
    }
    for (name, (_, cells)) in &was.rows {
        match now.rows.get(name) {
            None => out.push(format!("{name}: in the table, but no such scenario now")),
            Some((_, now_cells)) => {
                for ((col, a), b) in was.columns.iter().zip(cells).zip(now_cells) {
                    if a != b {
                        out.push(format!("{name} / {col}: was `{a}`, now `{b}`"));
                    }
                }
            }
        }
    }
    for (name, (_, cells)) in &now.rows {
        if !was.rows.contains_key(name) {
            out.push(format!(
                "{name}: new scenario, not in the table ({})",
                cells.join(" / ")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        let mut rows = BTreeMap::new();
        rows.insert(
            "cuda/a".to_owned(),
            (
                "emulated 4.1".to_owned(),
                vec![
                    "pass".to_owned(),
                    "fail: task gpu: CUDA state locked, expected running".to_owned(),
                ],
            ),
        );
        rows.insert(
            "cuda/b|c".to_owned(),
            (
                "criu 4.2".to_owned(),
                vec![
                    "n.a.: pins backend x|y \\ z".to_owned(),
                    "n.a.: needs device-map (sets cuda_plugin.device-map)".to_owned(),
                ],
            ),
        );
        Table {
            columns: vec!["ours".to_owned(), "CRIU 4.1.1 C plugin".to_owned()],
            rows,
        }
    }

    #[test]
    fn the_document_reads_back_to_the_same_table() {
        let t = table();
        let mut descriptions = BTreeMap::new();
        descriptions.insert("cuda/a".to_owned(), "A failed checkpoint".to_owned());
        let md = render(&t, &descriptions);
        assert_eq!(parse(&md).unwrap(), t);
        assert!(md.contains("| ours | 1 | 0 | 0 | 1 |"), "{md}");
        assert!(
            md.contains("| CRIU 4.1.1 C plugin | 0 | 1 | 0 | 1 |"),
            "{md}"
        );
        assert!(
            md.contains(
                "- `cuda/a`: task gpu: CUDA state locked, expected running\n  (A failed checkpoint)\n"
            ),
            "{md}"
        );
        assert!(
            md.contains("Not applicable:\n\n- needs device-map (1)\n"),
            "{md}"
        );
    }

    #[test]
    fn a_changed_cell_is_named() {
        let was = table();
        let mut now = table();
        now.rows.get_mut("cuda/a").unwrap().1[1] = "pass".to_owned();
        now.rows.insert(
            "new".to_owned(),
            ("x".to_owned(), vec!["pass".to_owned(), "pass".to_owned()]),
        );
        let d = diff(&was, &now);
        assert_eq!(
            d,
            [
                "cuda/a / CRIU 4.1.1 C plugin: was `fail: task gpu: CUDA state locked, expected running`, now `pass`",
                "new: new scenario, not in the table (pass / pass)"
            ]
        );
        assert!(diff(&was, &was).is_empty());
        let mut other = table();
        other.columns[0] = "theirs".to_owned();
        assert!(diff(&was, &other)[0].starts_with("columns:"));
    }
}
