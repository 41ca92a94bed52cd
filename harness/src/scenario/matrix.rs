//! The `[matrix]` of a scenario file: one file, several variants.
//!
//! ```toml
//! description = "A CUDA tree in its own pid namespace dumps and restores with {backend} on {host}"
//!
//! [matrix]
//! host = ["criu-4.1", "criu-4.2", "emulated-pr3076"]   # sets [host] engine and profile
//! backend = ["driver-api", "cuda-checkpoint"]         # cuda_plugin.backend=…, first option
//! parallel = ["1", "auto"]                            # cuda_plugin.parallel=…, last option
//! exclude = [{ host = "criu-4.1", backend = "cuda-checkpoint" }]   # combinations left out
//!
//! [[variant]]                 # an overlay, merged into every variant it matches
//! match = { engine = "criu" } # by host, engine, profile, backend or parallel (a value or a list)
//! expect = { host_pids = "changed" }
//! step.0.log = ["…"]          # patches step 0 (counted from 0) key by key
//! ```
//!
//! Each combination of the axes is a variant, named by the file's name and its values in the
//! order host, backend, parallel: `containers/pid@criu-4.1,driver-api`
//! (`parallel-1`/`parallel-auto` for the parallel axis). In every string of the file
//! `{host}`, `{engine}`, `{profile}`, `{backend}` and `{parallel}` stand for the variant's
//! values, and `{call:OP}` for the backend's name of operation OP (`lock`, `checkpoint`,
//! `restore`, `unlock`, `get-state`, `get-restore-tid`) as a fault's `function` names it:
//! `cuCheckpointProcessLock` with the driver API, `cuda-checkpoint:lock` with the utility (a
//! placeholder of an axis the matrix lacks, or `{call:…}` with `auto`, is an error). An
//! overlay's tables are
//! merged key by key into the variant's (`step.N` into step N); any other value replaces the
//! variant's. Overlays apply
//! in file order, after the axes; one that matches no variant is an error (a typo). The
//! variant is then parsed and checked like a file of its own.

use std::collections::BTreeMap;

/// The axes, in the order a variant's name lists them.
pub const AXES: [&str; 3] = ["host", "backend", "parallel"];

/// The hosts a `host` axis may name: engine and profile.
const HOSTS: &[(&str, &str, &str)] = &[
    ("criu-4.1", "criu", "4.1"),
    ("criu-4.2", "criu", "4.2"),
    ("emulated-4.1", "emulated", "4.1"),
    ("emulated-4.2", "emulated", "4.2"),
    ("emulated-upstream", "emulated", "upstream"),
    ("emulated-pr3076", "emulated", "pr3076"),
];

const BACKENDS: &[&str] = &["driver-api", "cuda-checkpoint", "auto"];

/// The operations a `{call:OP}` placeholder names, with the driver API's function (the
/// `cuda-checkpoint` backend's is `cuda-checkpoint:OP`, as the mock's faults name it).
const CALLS: &[(&str, &str)] = &[
    ("lock", "cuCheckpointProcessLock"),
    ("checkpoint", "cuCheckpointProcessCheckpoint"),
    ("restore", "cuCheckpointProcessRestore"),
    ("unlock", "cuCheckpointProcessUnlock"),
    ("get-state", "cuCheckpointProcessGetState"),
    ("get-restore-tid", "cuCheckpointProcessGetRestoreThreadId"),
];

fn op_placeholder(op: &str) -> &'static str {
    match op {
        "lock" => "{call:lock}",
        "checkpoint" => "{call:checkpoint}",
        "restore" => "{call:restore}",
        "unlock" => "{call:unlock}",
        "get-state" => "{call:get-state}",
        _ => "{call:get-restore-tid}",
    }
}

/// One variant: the value of each axis the matrix has.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Variant {
    /// `criu-4.1`, `emulated-pr3076`, …
    pub host: Option<String>,
    /// `driver-api`, `cuda-checkpoint` or `auto`.
    pub backend: Option<String>,
    /// The value of `cuda_plugin.parallel`.
    pub parallel: Option<String>,
}

impl Variant {
    /// The name's suffix after `@` (`criu-4.1,driver-api`); empty for a file without a matrix.
    #[must_use]
    pub fn suffix(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        parts.extend(self.host.clone());
        parts.extend(self.backend.clone());
        parts.extend(self.parallel.as_ref().map(|p| format!("parallel-{p}")));
        parts.join(",")
    }

    fn engine_profile(&self) -> Option<(&'static str, &'static str)> {
        let h = self.host.as_deref()?;
        HOSTS
            .iter()
            .find(|(name, _, _)| *name == h)
            .map(|(_, e, p)| (*e, *p))
    }

    /// The placeholders and what they stand for.
    fn substitutions(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let (Some(h), Some((e, p))) = (&self.host, self.engine_profile()) {
            out.push(("{host}", h.clone()));
            out.push(("{engine}", e.to_owned()));
            out.push(("{profile}", p.to_owned()));
        }
        if let Some(b) = &self.backend {
            out.push(("{backend}", b.clone()));
            for (op, driver) in CALLS {
                let call = match b.as_str() {
                    "driver-api" => (*driver).to_owned(),
                    "cuda-checkpoint" => format!("cuda-checkpoint:{op}"),
                    _ => continue,
                };
                out.push((op_placeholder(op), call));
            }
        }
        if let Some(p) = &self.parallel {
            out.push(("{parallel}", p.clone()));
        }
        out
    }

    /// The value this variant has for a `match` or `exclude` key.
    fn value_of(&self, key: &str) -> Option<String> {
        match key {
            "host" => self.host.clone(),
            "engine" => self.engine_profile().map(|(e, _)| e.to_owned()),
            "profile" => self.engine_profile().map(|(_, p)| p.to_owned()),
            "backend" => self.backend.clone(),
            "parallel" => self.parallel.clone(),
            _ => None,
        }
    }
}

/// Splits a scenario name into the file's name and the variant's suffix
/// (`a/b@criu-4.1,driver-api` -> (`a/b`, `Some("criu-4.1,driver-api")`)).
#[must_use]
pub fn split_name(name: &str) -> (&str, Option<&str>) {
    match name.split_once('@') {
        Some((base, v)) => (base, Some(v)),
        None => (name, None),
    }
}

/// A file's content split into its variants: each variant's suffix and the table to parse.
/// A file without `[matrix]` (and without `[[variant]]`) is its own single variant, `None`.
///
/// # Errors
/// What is wrong with the matrix or an overlay, in one line.
pub fn expand(mut t: toml::Table) -> Result<Option<Vec<(Variant, toml::Table)>>, String> {
    let matrix = t.remove("matrix");
    let overlays = t.remove("variant");
    let Some(matrix) = matrix else {
        return match overlays {
            None => Ok(None),
            Some(_) => Err("`[[variant]]` overlays need a `[matrix]`".to_owned()),
        };
    };
    let toml::Value::Table(matrix) = matrix else {
        return Err("`matrix` must be a table".to_owned());
    };
    let mut axes: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut exclude: Vec<toml::Table> = Vec::new();
    for (k, v) in &matrix {
        if k == "exclude" {
            let list = v
                .as_array()
                .ok_or("matrix.exclude must be a list of tables")?;
            for e in list {
                let e = e
                    .as_table()
                    .ok_or("matrix.exclude must be a list of tables")?;
                check_match_keys("matrix.exclude", e)?;
                exclude.push(e.clone());
            }
            continue;
        }
        let axis = AXES.iter().find(|a| **a == k).ok_or_else(|| {
            format!(
                "matrix: unknown axis `{k}` (one of: {}, exclude)",
                AXES.join(", ")
            )
        })?;
        let values = strings(v).ok_or_else(|| format!("matrix.{k} must be a list of strings"))?;
        if values.is_empty() {
            return Err(format!("matrix.{k} is empty"));
        }
        for (i, x) in values.iter().enumerate() {
            if values[..i].contains(x) {
                return Err(format!("matrix.{k}: `{x}` is listed twice"));
            }
            check_value(k, x)?;
        }
        axes.insert(axis, values);
    }
    if axes.is_empty() {
        return Err("`[matrix]` has no axis".to_owned());
    }
    let variants = combinations(&axes)
        .into_iter()
        .filter(|v| !exclude.iter().any(|e| matches(v, e)))
        .collect::<Vec<_>>();
    if variants.is_empty() {
        return Err("matrix.exclude leaves no variant".to_owned());
    }
    for e in &exclude {
        if !combinations(&axes).iter().any(|v| matches(v, e)) {
            return Err(format!("matrix.exclude: {e} matches no combination"));
        }
    }
    let overlays = parse_overlays(overlays)?;
    for (i, (m, _)) in overlays.iter().enumerate() {
        if !variants.iter().any(|v| matches(v, m)) {
            return Err(format!("variant {i}: `match = {m}` matches no variant"));
        }
    }
    let mut out = Vec::new();
    for v in variants {
        let table =
            variant_table(&t, &v, &overlays).map_err(|e| format!("variant {}: {e}", v.suffix()))?;
        out.push((v, table));
    }
    Ok(Some(out))
}

fn strings(v: &toml::Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|x| x.as_str().map(str::to_owned))
        .collect()
}

fn check_value(axis: &str, x: &str) -> Result<(), String> {
    let ok = match axis {
        "host" => HOSTS.iter().any(|(h, _, _)| *h == x),
        "backend" => BACKENDS.contains(&x),
        _ => x == "auto" || x.parse::<u32>().is_ok_and(|n| n > 0),
    };
    if ok {
        return Ok(());
    }
    let known: Vec<&str> = match axis {
        "host" => HOSTS.iter().map(|(h, _, _)| *h).collect(),
        "backend" => BACKENDS.to_vec(),
        _ => vec!["auto", "N (a positive number)"],
    };
    Err(format!(
        "matrix.{axis}: unknown value `{x}` (one of: {})",
        known.join(", ")
    ))
}

const MATCH_KEYS: [&str; 5] = ["host", "engine", "profile", "backend", "parallel"];

fn check_match_keys(what: &str, m: &toml::Table) -> Result<(), String> {
    for (k, v) in m {
        if !MATCH_KEYS.contains(&k.as_str()) {
            return Err(format!(
                "{what}: unknown key `{k}` (one of: {})",
                MATCH_KEYS.join(", ")
            ));
        }
        if v.as_str().is_none() && strings(v).is_none() {
            return Err(format!("{what}.{k} must be a string or a list of strings"));
        }
    }
    Ok(())
}

/// Whether variant `v` has, for every key of `m`, the value (or one of the values) it names.
fn matches(v: &Variant, m: &toml::Table) -> bool {
    m.iter().all(|(k, want)| {
        let Some(got) = v.value_of(k) else {
            return false;
        };
        match want {
            toml::Value::String(s) => *s == got,
            other => strings(other).is_some_and(|l| l.contains(&got)),
        }
    })
}

/// Every combination, host outermost.
fn combinations(axes: &BTreeMap<&str, Vec<String>>) -> Vec<Variant> {
    let one = |a: &str| -> Vec<Option<String>> {
        axes.get(a)
            .map_or_else(|| vec![None], |v| v.iter().cloned().map(Some).collect())
    };
    let mut out = Vec::new();
    for host in one("host") {
        for backend in one("backend") {
            for parallel in one("parallel") {
                out.push(Variant {
                    host: host.clone(),
                    backend: backend.clone(),
                    parallel,
                });
            }
        }
    }
    out
}

fn parse_overlays(v: Option<toml::Value>) -> Result<Vec<(toml::Table, toml::Table)>, String> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    let list = v
        .as_array()
        .ok_or("`variant` must be a list of tables (`[[variant]]`)")?;
    let mut out = Vec::new();
    for (i, o) in list.iter().enumerate() {
        let mut o = o
            .as_table()
            .ok_or("`variant` must be a list of tables (`[[variant]]`)")?
            .clone();
        let m = match o.remove("match") {
            Some(toml::Value::Table(m)) => m,
            Some(_) => return Err(format!("variant {i}: `match` must be a table")),
            None => return Err(format!("variant {i}: an overlay needs `match`")),
        };
        check_match_keys(&format!("variant {i}: match"), &m)?;
        if m.is_empty() {
            return Err(format!("variant {i}: `match` is empty"));
        }
        for k in ["matrix", "variant"] {
            if o.contains_key(k) {
                return Err(format!("variant {i}: an overlay cannot set `{k}`"));
            }
        }
        out.push((m, o));
    }
    Ok(out)
}

fn variant_table(
    base: &toml::Table,
    v: &Variant,
    overlays: &[(toml::Table, toml::Table)],
) -> Result<toml::Table, String> {
    let mut t = base.clone();
    if let Some((engine, profile)) = v.engine_profile() {
        let host = t
            .entry("host")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let host = host.as_table_mut().ok_or("`host` must be a table")?;
        for (k, val) in [("engine", engine), ("profile", profile)] {
            if host.contains_key(k) {
                return Err(format!(
                    "host.{k} is set by the matrix's `host` axis: remove it"
                ));
            }
            host.insert(k.to_owned(), toml::Value::String(val.to_owned()));
        }
    }
    let mut options: Vec<toml::Value> = match t.remove("options") {
        None => Vec::new(),
        Some(toml::Value::Array(a)) => a,
        Some(_) => return Err("`options` must be a list of strings".to_owned()),
    };
    for (key, value, first) in [
        ("backend", &v.backend, true),
        ("parallel", &v.parallel, false),
    ] {
        let Some(value) = value else { continue };
        let prefix = format!("{}.{key}=", super::OPTION_NAMESPACE);
        if options
            .iter()
            .any(|o| o.as_str().is_some_and(|s| s.starts_with(&prefix)))
        {
            return Err(format!(
                "options: {prefix}… is set by the matrix's `{key}` axis: remove it"
            ));
        }
        let o = toml::Value::String(format!("{prefix}{value}"));
        if first {
            options.insert(0, o);
        } else {
            options.push(o);
        }
    }
    if !options.is_empty() {
        t.insert("options".to_owned(), toml::Value::Array(options));
    }
    for (m, o) in overlays {
        if matches(v, m) {
            overlay(&mut t, o)?;
        }
    }
    let subs = v.substitutions();
    let mut t = toml::Value::Table(t);
    substitute(&mut t, &subs)?;
    match t {
        toml::Value::Table(t) => Ok(t),
        _ => unreachable!("a table stays a table"),
    }
}

/// Applies an overlay: its `step` table patches steps by index (`step.1.log = [...]` merges
/// into the second step), every other key merges into the variant ([`merge`]).
fn overlay(t: &mut toml::Table, o: &toml::Table) -> Result<(), String> {
    for (k, v) in o {
        if k != "step" {
            merge(t, &toml::Table::from_iter([(k.clone(), v.clone())]));
            continue;
        }
        let patches = v
            .as_table()
            .ok_or("an overlay's `step` must be a table of step numbers")?;
        let steps = t
            .get_mut("steps")
            .and_then(toml::Value::as_array_mut)
            .ok_or("an overlay's `step` patches steps, but there are none")?;
        let n = steps.len();
        for (i, patch) in patches {
            let at = i
                .parse::<usize>()
                .ok()
                .filter(|at| *at < n)
                .ok_or_else(|| format!("overlay `step.{i}`: no step {i} (there are {n})"))?;
            let patch = patch
                .as_table()
                .ok_or_else(|| format!("overlay `step.{i}` must be a table"))?;
            let step = steps[at]
                .as_table_mut()
                .ok_or_else(|| format!("step {i} is not a table"))?;
            merge(step, patch);
        }
    }
    Ok(())
}

/// Merges `over` into `t`: tables key by key, any other value replaced.
fn merge(t: &mut toml::Table, over: &toml::Table) {
    for (k, v) in over {
        match (t.get_mut(k), v) {
            (Some(toml::Value::Table(a)), toml::Value::Table(b)) => merge(a, b),
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Replaces the placeholders in every string; a placeholder of an absent axis is an error.
fn substitute(v: &mut toml::Value, subs: &[(&str, String)]) -> Result<(), String> {
    match v {
        toml::Value::String(s) => {
            for (from, to) in subs {
                if s.contains(from) {
                    *s = s.replace(from, to);
                }
            }
            for p in [
                "{host}",
                "{engine}",
                "{profile}",
                "{backend}",
                "{parallel}",
                "{call:",
            ] {
                if s.contains(p) {
                    return Err(format!(
                        "`{p}` in \"{s}\", but the matrix has no axis that sets it"
                    ));
                }
            }
            Ok(())
        }
        toml::Value::Array(a) => a.iter_mut().try_for_each(|x| substitute(x, subs)),
        toml::Value::Table(t) => t.iter_mut().try_for_each(|(_, x)| substitute(x, subs)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_text(text: &str) -> Result<Vec<(String, toml::Table)>, String> {
        let t: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
        Ok(expand(t)?
            .unwrap_or_default()
            .into_iter()
            .map(|(v, t)| (v.suffix(), t))
            .collect())
    }

    #[test]
    fn a_matrix_makes_one_variant_per_combination_in_axis_order() {
        let got = expand_text(
            r#"
description = "with {backend} on {host} ({engine} {profile}), parallel {parallel}"
options = ["cuda_plugin.timeout=3"]
[matrix]
parallel = ["1", "auto"]
backend = ["driver-api", "cuda-checkpoint"]
host = ["criu-4.2", "emulated-pr3076"]
exclude = [{ host = "criu-4.2", parallel = "auto" }]
[host]
cuda_checkpoint = false
"#,
        )
        .unwrap();
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "criu-4.2,driver-api,parallel-1",
                "criu-4.2,cuda-checkpoint,parallel-1",
                "emulated-pr3076,driver-api,parallel-1",
                "emulated-pr3076,driver-api,parallel-auto",
                "emulated-pr3076,cuda-checkpoint,parallel-1",
                "emulated-pr3076,cuda-checkpoint,parallel-auto",
            ]
        );
        let t = &got[3].1;
        assert_eq!(
            t["description"].as_str(),
            Some("with driver-api on emulated-pr3076 (emulated pr3076), parallel auto")
        );
        assert_eq!(t["host"]["engine"].as_str(), Some("emulated"));
        assert_eq!(t["host"]["profile"].as_str(), Some("pr3076"));
        assert_eq!(t["host"]["cuda_checkpoint"].as_bool(), Some(false));
        let opts: Vec<&str> = t["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_str().unwrap())
            .collect();
        assert_eq!(
            opts,
            [
                "cuda_plugin.backend=driver-api",
                "cuda_plugin.timeout=3",
                "cuda_plugin.parallel=auto"
            ]
        );
    }

    #[test]
    fn overlays_merge_into_the_variants_they_match() {
        let got = expand_text(
            r#"
[matrix]
host = ["criu-4.1", "criu-4.2", "emulated-4.1"]
[expect]
tasks = "running"
host_pids = "kept"
[[variant]]
match = { engine = "criu" }
expect = { host_pids = "changed" }
[[variant]]
match = { profile = ["4.2"] }
extra = "x"
"#,
        )
        .unwrap();
        let pids: Vec<(&str, &str)> = got
            .iter()
            .map(|(n, t)| (n.as_str(), t["expect"]["host_pids"].as_str().unwrap()))
            .collect();
        assert_eq!(
            pids,
            [
                ("criu-4.1", "changed"),
                ("criu-4.2", "changed"),
                ("emulated-4.1", "kept")
            ]
        );
        // Tables merge: the key the overlay does not name stays.
        assert!(got
            .iter()
            .all(|(_, t)| t["expect"]["tasks"].as_str() == Some("running")));
        assert!(got[1].1.contains_key("extra") && !got[0].1.contains_key("extra"));
        let got = expand_text(
            r#"
[matrix]
host = ["criu-4.1", "emulated-4.1"]
[[steps]]
action = "dump"
log = ["a"]
[[steps]]
action = "restore"
[[variant]]
match = { engine = "emulated" }
step.1.log = ["b"]
"#,
        )
        .unwrap();
        let log = |i: usize, s: usize| got[i].1["steps"][s].get("log").map(ToString::to_string);
        assert_eq!(log(0, 1), None);
        assert_eq!(log(1, 1).as_deref(), Some("[\"b\"]"));
        assert_eq!(log(1, 0).as_deref(), Some("[\"a\"]"));
        let e = expand_text(
            "[matrix]\nhost = [\"criu-4.1\"]\n[[steps]]\n[[variant]]\nmatch = { host = \"criu-4.1\" }\nstep.3.log = []",
        )
        .unwrap_err();
        assert!(e.contains("no step 3 (there are 1)"), "{e}");
    }

    #[test]
    fn call_placeholders_name_each_backends_function() {
        let got = expand_text(
            r#"
[matrix]
backend = ["driver-api", "cuda-checkpoint"]
[[world.fault]]
function = "{call:checkpoint}"
[[world.fault]]
function = "{call:get-restore-tid}"
"#,
        )
        .unwrap();
        let f = |i: usize| -> Vec<&str> {
            got[i].1["world"]["fault"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["function"].as_str().unwrap())
                .collect()
        };
        assert_eq!(
            f(0),
            [
                "cuCheckpointProcessCheckpoint",
                "cuCheckpointProcessGetRestoreThreadId"
            ]
        );
        assert_eq!(
            f(1),
            [
                "cuda-checkpoint:checkpoint",
                "cuda-checkpoint:get-restore-tid"
            ]
        );
        let e = expand_text("x = \"{call:lock}\"\n[matrix]\nbackend = [\"auto\"]").unwrap_err();
        assert!(e.contains("`{call:` in"), "{e}");
    }

    #[test]
    fn a_file_without_a_matrix_is_not_expanded() {
        assert!(expand(toml::from_str("description = \"x\"").unwrap())
            .unwrap()
            .is_none());
    }

    #[test]
    fn mistakes_are_named() {
        for (text, want) in [
            ("[matrix]\ncolour = [\"red\"]", "unknown axis `colour`"),
            ("[matrix]\nhost = [\"criu-9\"]", "unknown value `criu-9`"),
            ("[matrix]\nbackend = []", "matrix.backend is empty"),
            (
                "[matrix]\nbackend = [\"auto\", \"auto\"]",
                "`auto` is listed twice",
            ),
            ("[matrix]", "has no axis"),
            (
                "[[variant]]\nmatch = { host = \"criu-4.1\" }",
                "need a `[matrix]`",
            ),
            (
                "[matrix]\nhost = [\"criu-4.1\"]\n[[variant]]\nmatch = { host = \"criu-4.2\" }",
                "matches no variant",
            ),
            (
                "[matrix]\nhost = [\"criu-4.1\"]\n[[variant]]\nexpect = {}",
                "needs `match`",
            ),
            (
                "[matrix]\nhost = [\"criu-4.1\"]\n[[variant]]\nmatch = { colour = \"x\" }",
                "unknown key `colour`",
            ),
            (
                "[matrix]\nhost = [\"criu-4.1\"]\n[host]\nengine = \"criu\"",
                "host.engine is set by the matrix",
            ),
            (
                "options = [\"cuda_plugin.backend=auto\"]\n[matrix]\nbackend = [\"auto\"]",
                "set by the matrix's `backend` axis",
            ),
            (
                "description = \"on {host}\"\n[matrix]\nbackend = [\"auto\"]",
                "`{host}` in \"on {host}\"",
            ),
            (
                "[matrix]\nhost = [\"criu-4.1\"]\nexclude = [{ host = \"criu-4.1\" }]",
                "leaves no variant",
            ),
            (
                "[matrix]\nhost = [\"criu-4.1\", \"criu-4.2\"]\nexclude = [{ backend = \"auto\" }]",
                "matches no combination",
            ),
        ] {
            let e = expand_text(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn names_split_at_the_variant() {
        assert_eq!(
            split_name("a/b@criu-4.1,driver-api"),
            ("a/b", Some("criu-4.1,driver-api"))
        );
        assert_eq!(split_name("a/b"), ("a/b", None));
    }

    proptest::proptest! {
        /// Every combination is named once, the names parse back to their values, and an
        /// exclusion removes exactly the combinations it matches.
        #[test]
        fn variants_are_the_product_minus_the_exclusions(
            hosts in proptest::sample::subsequence(vec!["criu-4.1", "criu-4.2", "emulated-4.1", "emulated-pr3076"], 1..=4),
            backends in proptest::sample::subsequence(vec!["driver-api", "cuda-checkpoint", "auto"], 0..=3),
            excluded in proptest::option::of(0usize..4),
        ) {
            let list = |v: &[&str]| v.iter().map(|x| format!("\"{x}\"")).collect::<Vec<_>>().join(", ");
            let mut text = format!("[matrix]\nhost = [{}]\n", list(&hosts));
            if !backends.is_empty() {
                text.push_str(&format!("backend = [{}]\n", list(&backends)));
            }
            let ex = excluded.and_then(|i| hosts.get(i)).filter(|_| hosts.len() > 1);
            if let Some(h) = ex {
                text.push_str(&format!("exclude = [{{ host = \"{h}\" }}]\n"));
            }
            let got = expand_text(&text).unwrap();
            let per_host = backends.len().max(1);
            let hosts_left = hosts.len() - usize::from(ex.is_some());
            proptest::prop_assert_eq!(got.len(), hosts_left * per_host);
            let mut names: Vec<&String> = got.iter().map(|(n, _)| n).collect();
            names.dedup();
            proptest::prop_assert_eq!(names.len(), got.len());
            for (n, t) in &got {
                let host = n.split(',').next().unwrap();
                proptest::prop_assert!(Some(host) != ex.copied());
                let (_, engine, profile) = HOSTS.iter().find(|(h, _, _)| *h == host).unwrap();
                proptest::prop_assert_eq!(t["host"]["engine"].as_str(), Some(*engine));
                proptest::prop_assert_eq!(t["host"]["profile"].as_str(), Some(*profile));
            }
        }
    }
}
