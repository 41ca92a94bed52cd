//! `docs/troubleshooting.md` against the code, both ways (part of the `docs` test).
//!
//! - **Doc to code** (`troubleshooting: every message is in the code`): the backticked text of
//!   each table row's first column (the message) is cut at its placeholders (`P`, `N`, `X`, `…`
//!   and the others in [`PLACEHOLDERS`]) and at `: ` (where messages chain a context and its
//!   cause, which the code writes in separate places); every piece of [`MIN_DOC`] characters or
//!   more must occur in a string of a `.rs` file under `plugin/src`. The code is read with its
//!   string continuations (`\` at the end of a line) joined, `\"` as `"`, `{{`/`}}` as `{`/`}`,
//!   and `{NAME}` replaced by the value of a `const NAME: &str` of the same file (or, when only
//!   one file defines it, of that file).
//! - **Code to doc** (`troubleshooting: every error of the plugin is in the doc`): every
//!   `#[error("…")]` of `plugin/src`'s error enums is cut at its `{…}` placeholders and at
//!   `: `; every piece of [`MIN_CODE`] characters or more must occur in the doc, unless the
//!   message is listed in [`INTERNAL`] with the reason it is not a user's concern.
//! - **Driver versions** (`troubleshooting: driver versions are the code's`): every driver
//!   branch the doc names (`r555`, `r580`, …) is named in `plugin/src` too.

use std::path::Path;

use libtest_mimic::Trial;

/// Words of a message that stand for a value in the doc.
const PLACEHOLDERS: &[&str] = &[
    "P", "N", "X", "M", "K", "W", "Y", "Z", "T", "F", "L", "C", "B", "V", "E", "Ns", "NAME",
    "PROGRAM", "STATE", "OUTPUT", "HOOK", "MODEL",
];

/// The shortest piece of a doc message that is checked (shorter ones are words like `pid`).
const MIN_DOC: usize = 8;

/// The shortest piece of a code message that is checked.
const MIN_CODE: usize = 12;

/// `#[error]` messages of `plugin/src` that the doc does not list, each with why: the start of
/// the message's literal text, and the reason.
const INTERNAL: &[(&str, &str)] = &[
    (
        "undecodable message from the other side",
        "the plugin-guardian protocol decoder: only a bug or a version mix-up of the plugin's \
         own two halves produces it, and it surfaces as the helper being gone",
    ),
    (
        "the GPU enumeration: the helper answered",
        "the plugin-guardian protocol out of turn (a reply of another kind): only a bug or a \
         version mix-up of the plugin's own two halves produces it",
    ),
    (
        "the driver call panicked",
        "a bug in the plugin's worker thread, caught; nothing a user can act on",
    ),
];

/// Files whose `#[error]` messages the doc covers as a class, each with why.
const INTERNAL_FILES: &[(&str, &str)] = &[
    (
        "cstore/format.rs",
        "the custom-storage file format's errors are the <why> of the custom-storage rows \
         (init(restore) … cuda-cs-P-N.img …; failed to restore … cuda-cs-P-N.img …)",
    ),
    (
        "cstore/pipeline.rs",
        "the copy pipeline's errors are the <why> of the custom-storage rows (failed to \
         checkpoint / restore pid P via driver-api with custom storage: …)",
    ),
];

/// Pieces of doc messages that the code writes from parts (a value the doc spells out, a
/// constant passed as an argument), each with where the code has it.
const COMPOSED: &[(&str, &str)] = &[
    (
        "and <why>",
        "session.rs: `… custom-storage files, and {why}` (the refusal's reason)",
    ),
    (
        "failed to restore pid",
        "backend/mod.rs: `failed to {op} pid {pid} via driver-api with custom storage` (op restore)",
    ),
    (
        "cuda_plugin.conf next to it is not read",
        "session/run.rs: `{} next to it` with config::FILE_NAME",
    ),
    (
        "ended during the dump without the plugin's final word",
        "helper/guardian.rs",
    ),
    (
        "the lock CRIU gave up on landed late",
        "helper/server.rs: `the {what} CRIU gave up on`",
    ),
    (
        "for option cuda_plugin.cuda-checkpoint",
        "options.rs: `for option {NAMESPACE}.{name}`",
    ),
    (
        "it was given to a dump",
        "error.rs: `it was given to a {0}`",
    ),
    (
        "checkpointed GPU GPU-",
        "gpu_map.rs: `checkpointed GPU {uuid}`",
    ),
    ("not auto", "gpu_map.rs: `not {what}`"),
    (
        "is a directory",
        "host.rs: `is {kind}`, with the kinds listed in the doc",
    ),
    (
        "cuInit or the GPU enumeration timed out after",
        "composed from the call's name",
    ),
    (
        "cuDriverGetVersion/cuInit of libcuda.so.",
        "composed from the call's name",
    ),
    (
        "CUDA_VISIBLE_DEVICES=",
        "the variable's name and value are arguments",
    ),
    ("GPU GPU-", "error.rs: `GPU {gpu}`"),
    ("now running", "after a `{state}` value"),
    (
        "its state is now locked",
        "engine/error.rs: `its state is now {state}`",
    ),
    (
        "exited with status",
        "backend/mod.rs: `exited with {status}`, the status reading `status N`",
    ),
    (
        "the CUDA state is failed",
        "engine/error.rs: `the CUDA state is {state}`",
    ),
    ("image cuda-plugin-", "image::file_name(pid)"),
    ("but its image cuda-plugin-", "image::file_name(pid)"),
    (".img is missing", "image::file_name(pid)"),
    (
        "is in state '",
        "engine/error.rs: `is in state {state:?}`, a char",
    ),
    (
        "left of CRIU's freezing timeout",
        "engine/error.rs: freeze_timeout_message() `left of {timeout}`",
    ),
    (
        "are left of CRIU's freezing timeout",
        "engine/error.rs: freeze_timeout_message() `are left of {timeout}`",
    ),
];

/// Pieces of `#[error]` messages that are causes or details the doc shows as `…` after the
/// context it lists (the row of the message they end up in), each with that row.
const CAUSES: &[(&str, &str)] = &[
    ("cannot start it", "`cannot run PROGRAM: …`, the utility's probe"),
    ("killed it and its process group", "`timed out after …; killed and reaped`"),
    ("cannot wait for it", "`cannot run PROGRAM: …`, the utility's probe"),
    ("cannot load libcuda.so.", "`backend driver-api is not supported here: …`, `auto: the driver API is unsupported here (…)`"),
    ("` exited with", "`failed to … via cuda-checkpoint: …… exited with status N`"),
    ("this file holds only cuda_plugin's options", "`options file F, line L: …` (`… is not an option of cuda_plugin …`)"),
    ("failed to add cuda_plugin to the inventory", "`cannot claim cuda_plugin in the image inventory: …` (the same service, at the first checkpoint)"),
    ("CRIU does not export", "`cannot claim cuda_plugin in the image inventory: …` on a CRIU without the inventory service"),
    ("NVML reported the GPU UUID", "`NVML is not available: …` and `no GPU inventory written (…)`"),
    ("which does not parse", "`NVML is not available: …` and `no GPU inventory written (…)`"),
    ("NVML did not answer", "`NVML is not available: …` (NVML hung)"),
    ("probing cuda-checkpoint failed", "`backend cuda-checkpoint is not supported here: …` and `no CUDA checkpoint backend available (…)`"),
    ("exited while it was running", "`… on restore thread T failed: …` (the restore thread vanished, -ESRCH)"),
    ("did not die within", "`RESUME_DEVICES_LATE pid P: killed the task …` (the kill that row describes did not complete)"),
    ("ms of SIGKILL", "`RESUME_DEVICES_LATE pid P: killed the task …` (the kill that row describes did not complete)"),
    ("cannot start a worker thread", "`failed to … pid P via driver-api: …` with guardian=off (a thread limit)"),
    ("the plugin's helper process is gone", "`failed to … pid P via driver-api: the plugin's helper process, which runs the driver calls, is gone (…)`"),
];

fn repo() -> std::path::PathBuf {
    super::repo()
}

fn rs_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The `const NAME: &str = "value";` definitions of `text` (and `= criu_cuda_env::X;`, whose value
/// is the name of the variable that constant declares).
fn str_consts(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(at) = line.find("const ") else {
            continue;
        };
        let rest = &line[at + 6..];
        // `= criu_cuda_env::X;`: the name that constant declares (the prefix and X).
        if let Some((name, rest)) = rest.split_once(": &str = criu_cuda_env::") {
            if let Some((ident, _)) = rest.split_once(';') {
                let value = format!("CRIU_CUDA_{ident}");
                if criu_cuda_env::VARS.iter().any(|v| v.name == value) {
                    out.push((name.to_owned(), value));
                }
            }
            continue;
        }
        let Some((name, rest)) = rest.split_once(": &str = \"") else {
            continue;
        };
        let Some((value, _)) = rest.split_once("\";") else {
            continue;
        };
        if name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            out.push((name.to_owned(), value.to_owned()));
        }
    }
    out
}

/// Joins string continuations, unescapes `\"` and `{{`/`}}`, and fills in `{CONST}`s.
fn normalise(text: &str, consts: &[(String, String)]) -> String {
    let mut joined = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("\\\n") {
        joined.push_str(&rest[..at]);
        rest = rest[at + 2..].trim_start();
    }
    joined.push_str(rest);
    let mut s = joined.replace("\\\"", "\"");
    for (name, value) in consts {
        s = s.replace(&format!("{{{name}}}"), value);
    }
    s.replace("{{", "{").replace("}}", "}")
}

/// Every `.rs` file under `plugin/src`, normalised, with its path.
fn plugin_sources() -> Vec<(String, String)> {
    let mut files = Vec::new();
    rs_files(&repo().join("plugin/src"), &mut files);
    files.sort();
    let texts: Vec<(String, String)> = files
        .iter()
        .map(|p| {
            let shown = p.strip_prefix(repo()).unwrap_or(p).display().to_string();
            (shown, std::fs::read_to_string(p).unwrap_or_default())
        })
        .collect();
    // A constant defined in one file only is known everywhere; a file's own come first.
    let all: Vec<(String, String)> = texts.iter().flat_map(|(_, t)| str_consts(t)).collect();
    let global: Vec<(String, String)> = all
        .iter()
        .filter(|(n, _)| all.iter().filter(|(m, _)| m == n).count() == 1)
        .cloned()
        .collect();
    texts
        .into_iter()
        .map(|(shown, t)| {
            let mut consts = str_consts(&t);
            consts.extend(global.iter().cloned());
            let n = normalise(&t, &consts);
            (shown, n)
        })
        .collect()
}

/// Whether a word of a doc message stands for a value: a placeholder, a number, or a number
/// with its unit (`10s`; a unit word after a placeholder, `N GiB`, is cut with it).
fn is_value(word: &str, prev_value: bool) -> bool {
    PLACEHOLDERS.contains(&word)
        || (!word.is_empty() && word.chars().all(|c| c.is_ascii_digit()))
        || (word.starts_with(|c: char| c.is_ascii_digit())
            && ["s", "ms"].contains(&word.trim_start_matches(|c: char| c.is_ascii_digit())))
        || (prev_value && ["s", "ms", "GiB", "MiB", "bytes"].contains(&word))
}

/// Cuts `text` at values (see [`is_value`]), `…` and punctuation that separates the parts of a
/// message the code writes in different places (`: `, `; `, `, `, ` / `, brackets, quotes), and
/// keeps the pieces of `min` characters or more.
fn pieces(text: &str, min: usize) -> Vec<String> {
    let mut cut = String::with_capacity(text.len());
    let mut word = String::new();
    let mut prev_value = false;
    let mut flush = |word: &mut String, cut: &mut String| {
        if word.is_empty() {
            return;
        }
        if is_value(word, prev_value) {
            cut.push('\0');
            prev_value = true;
        } else {
            cut.push_str(word);
            prev_value = false;
        }
        word.clear();
    };
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut cut);
            match c {
                '…' | '(' | ')' | '[' | ']' | '"' => cut.push('\0'),
                _ => cut.push(c),
            }
        }
    }
    flush(&mut word, &mut cut);
    let mut cut = cut.replace("...", "\0");
    for sep in [": ", "; ", ", ", " / "] {
        cut = cut.replace(sep, "\0");
    }
    cut.split('\0')
        .map(|p| p.trim().trim_end_matches([':', ';', ',']).trim())
        .filter(|p| p.chars().count() >= min)
        .map(str::to_owned)
        .collect()
}

/// The message column of each table row of the doc: `(line, [backticked spans])`.
fn doc_messages(doc: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    for (i, line) in doc.lines().enumerate() {
        let Some(row) = line.strip_prefix("| ") else {
            continue;
        };
        let cell = row.split(" | ").next().unwrap_or("");
        // An escaped backtick quotes a command inside a message: a placeholder here.
        let cell = cell.replace("\\`", "…");
        let spans: Vec<String> = cell
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        if !spans.is_empty() {
            out.push((i + 1, spans));
        }
    }
    out
}

const DOC: &str = "docs/troubleshooting.md";

fn read_doc() -> Result<String, String> {
    std::fs::read_to_string(repo().join(DOC)).map_err(|e| format!("{DOC}: {e}"))
}

/// Doc to code.
fn doc_in_code() -> Result<String, String> {
    let doc = read_doc()?;
    let code = plugin_sources();
    let rows = doc_messages(&doc);
    let mut checked = 0;
    let mut missing = Vec::new();
    for (line, spans) in &rows {
        for span in spans {
            for p in pieces(span, MIN_DOC) {
                checked += 1;
                if COMPOSED.iter().any(|(c, _)| p == *c) {
                    continue;
                }
                if !code.iter().any(|(_, t)| t.contains(&p)) {
                    missing.push(format!("{DOC}:{line}: `{p}` (of `{span}`)"));
                }
            }
        }
    }
    if rows.len() < 50 {
        return Err(format!(
            "{DOC}: only {} table rows with a message found",
            rows.len()
        ));
    }
    if missing.is_empty() {
        Ok(format!(
            "{checked} pieces of {} messages found in plugin/src",
            rows.len()
        ))
    } else {
        Err(format!(
            "{} piece(s) of messages in {DOC} occur in no string of plugin/src (a message \
             that changed, or a doc row that is wrong):\n  {}",
            missing.len(),
            missing.join("\n  ")
        ))
    }
}

/// The literal text of every `#[error("…")]` of `text` (already normalised).
fn error_messages(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[error(") {
        let after = &rest[at + 8..];
        let lit = after.trim_start();
        if let Some(body) = lit.strip_prefix('"') {
            // The literal ends at the first `"` not escaped (normalise() unescaped `\"`, so
            // look for `"` followed by `)` or `,`).
            let end = body
                .match_indices('"')
                .map(|(i, _)| i)
                .find(|&i| {
                    let tail = body[i + 1..].trim_start();
                    tail.starts_with(')') || tail.starts_with(',')
                })
                .unwrap_or(body.len());
            out.push(body[..end].to_owned());
        }
        rest = &rest[at + 8..];
    }
    out
}

/// Code to doc.
fn code_in_doc() -> Result<String, String> {
    let doc = read_doc()?.replace('`', "");
    let mut checked = 0;
    let mut exempt = 0;
    let mut missing = Vec::new();
    for (file, text) in plugin_sources() {
        for msg in error_messages(&text) {
            if let Some((_, why)) = INTERNAL
                .iter()
                .find(|(m, _)| msg.starts_with(m))
                .or_else(|| INTERNAL_FILES.iter().find(|(f, _)| file.ends_with(f)))
            {
                assert!(!why.is_empty());
                exempt += 1;
                continue;
            }
            // The code's `{…}` placeholders become `…`, then it is cut as the doc is.
            let mut cut = String::new();
            let mut depth = 0;
            for c in msg.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        cut.push('…');
                    }
                    '}' if depth > 0 => depth -= 1,
                    _ if depth > 0 => {}
                    _ => cut.push(c),
                }
            }
            for p in pieces(&cut, MIN_CODE) {
                if CAUSES.iter().any(|(c, _)| p == *c) {
                    exempt += 1;
                    continue;
                }
                checked += 1;
                if !doc.contains(&p) {
                    missing.push(format!("{file}: `{p}` (of \"{msg}\")"));
                }
            }
        }
    }
    if missing.is_empty() {
        Ok(format!(
            "{checked} pieces of plugin/src's #[error] messages found in {DOC} ({exempt} internal)"
        ))
    } else {
        Err(format!(
            "{} piece(s) of plugin/src's #[error] messages are not in {DOC} (add a row, or list \
             the message as internal, with the reason, in harness/tests/docs/messages.rs):\n  {}",
            missing.len(),
            missing.join("\n  ")
        ))
    }
}

/// `rNNN` words of `text`.
fn driver_branches(text: &str) -> Vec<String> {
    let mut out: Vec<String> = text
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| {
            w.len() == 4 && w.starts_with('r') && w[1..].chars().all(|c| c.is_ascii_digit())
        })
        .map(str::to_owned)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Driver versions.
fn versions_match() -> Result<String, String> {
    let doc = read_doc()?;
    let code: String = plugin_sources().into_iter().map(|(_, t)| t).collect();
    let known = driver_branches(&code);
    let named = driver_branches(&doc);
    let wrong: Vec<&String> = named.iter().filter(|v| !known.contains(v)).collect();
    if wrong.is_empty() {
        Ok(format!(
            "{} driver branches, all named in plugin/src",
            named.len()
        ))
    } else {
        Err(format!(
            "{DOC} names driver branch(es) {wrong:?} that plugin/src never names (it knows {known:?})"
        ))
    }
}

/// The checker's own cutting, on made-up text.
fn self_check() -> Result<(), String> {
    let got = pieces(
        "PAUSE_DEVICES pid P: failed to lock pid P via B: timed out after Ns (…) GPU-…",
        MIN_DOC,
    );
    let want = ["PAUSE_DEVICES pid", "failed to lock pid", "timed out after"];
    let got2 = pieces("a 10s b: N GiB free (ok, fine) / c; \"x\"", 1);
    if got2 != ["a", "b", "free", "ok", "fine", "c", "x"] {
        return Err(format!("pieces {got2:?}"));
    }
    if got != want {
        return Err(format!("pieces {got:?}, expected {want:?}"));
    }
    let rows = doc_messages("| Message | x |\n|---|---|\n| `a \\`cmd\\` b` / `c` | `not this` |\n");
    if rows != [(3, vec!["a …cmd… b".to_owned(), "c".to_owned()])] {
        return Err(format!("rows {rows:?}"));
    }
    let text = normalise(
        "const N: &str = \"x\";\n#[error(\"a {N} \\\"q\\\" {{b}} \\\n    c {pid}\", f(x))]\n",
        &[("N".to_owned(), "cuda_plugin".to_owned())],
    );
    let msgs = error_messages(&text);
    if msgs != ["a cuda_plugin \"q\" {b} c {pid}"] {
        return Err(format!("error messages {msgs:?}"));
    }
    Ok(())
}

/// The trials of this module.
pub fn trials() -> Vec<Trial> {
    let t = |name: &'static str, f: fn() -> Result<String, String>| {
        Trial::test(name, move || {
            let what = f()?;
            println!("    {name}: ok: {what}");
            Ok(())
        })
    };
    vec![
        t("troubleshooting: self-check", || {
            self_check().map(|()| "cutting and reading".to_owned())
        }),
        t("troubleshooting: every message is in the code", doc_in_code),
        t(
            "troubleshooting: every error of the plugin is in the doc",
            code_in_doc,
        ),
        t(
            "troubleshooting: driver versions are the code's",
            versions_match,
        ),
    ]
}
