//! The docs, run as written: every fenced code block of `README.md` and `docs/*.md` is parsed,
//! and every `sh` block is checked the way the HTML comment on the line above its fence says.
//!
//! # Rules
//!
//! - Every fenced block has an info string (`sh`, `toml`, `c`, `text`, …). An untagged block is
//!   an error naming its `file:line`. Shell commands are tagged `sh` (`bash`, `shell`, `console`
//!   and `zsh` are refused, so that no command block escapes the check).
//! - Every `sh` block has a marker on the last non-blank line before its fence, an HTML comment
//!   that renders as nothing: `<!-- docs-check: KIND ARGS -->`. A block without one, a marker
//!   that does not parse, and a marker that is not followed by an `sh` block are errors naming
//!   `file:line`. The kinds:
//!
//! | marker | how the block is checked |
//! |---|---|
//! | `<!-- docs-check: run released -->` | run twice, with `criu` = Debian's CRIU 4.1.x, then 4.2.x (the real binaries); the prelude provides a mock CUDA tree `$PID` (below) |
//! | `<!-- docs-check: run upstream -->` | run once, with `criu` = the harness's `upstream` engine (which has `--plugin-option`); same prelude |
//! | `… run released installed -->`, `… run upstream installed -->` | as above, and the prelude installs the built plugin as `/usr/lib/criu/cuda_plugin.so` first (for blocks that say "installed as above") |
//! | `… run released dist -->`, `… run upstream dist -->` | as above, but run in an empty directory holding this version's release tarballs (`target/dist/criu-cuda-plugin-<version>-*.tar.gz`, from `scripts/dist.sh`), as from the directory a release was downloaded to; afterwards `/usr/lib/criu/cuda_plugin.so` must be the `cuda_plugin.so` of a tarball (by the SHA256SUMS the block unpacked) |
//! | `<!-- docs-check: run mock-world -->` | run with no prelude (the block builds and starts what it needs); afterwards every process it left must be a `mock-cuda-app` that runs free, is RUNNING in its world, passes its data check (its stdout must be a file), and the world's trace must hold one successful `cuda-checkpoint` run per `cuda-checkpoint` command of the block |
//! | `<!-- docs-check: run fetched-criu -->` | run with no prelude, for blocks that run a CRIU of `target/criu` themselves (needs `scripts/fetch-criu.sh`); afterwards what the block left must run free, no CRIU may be left, no CRIU log under `/tmp` may say `FAILED`, and a log must say that the dump and the restore finished successfully |
//! | `<!-- docs-check: ci -->` | not run: every command line of the block (comments dropped) must be a line of `.ci/run`, optionally after `NAME=value` assignments |
//! | `<!-- docs-check: kit -->` | the conformance kit's command: its one `target/debug/harness run` command runs with the build under test on `scenarios/cuda/conformance/` only (its `--junit` file in a temporary directory), and must pass every scenario and write the JUnit XML (needs root and CRIU 4.2.x); its other command lines must be lines of `.ci/run` |
//! | `<!-- docs-check: manual REASON -->` | not run (reported as ignored, with the reason); only for benchmark runs: the reason must be given, and every command must run `scripts/bench.sh` or `cargo bench` |
//!
//! # Running a block
//!
//! The block's text goes verbatim into a file run by `bash -euo pipefail`, with the repository
//! root as working directory, inside `unshare --mount --propagation private`. In that mount
//! namespace a tmpfs covers `/tmp` and another `/usr/lib/criu` (created on the host for the run
//! when missing, and removed afterwards), so `-D /tmp/img` and
//! `install … /usr/lib/criu/cuda_plugin.so` run literally and leave the host alone. When this
//! test's target directory is not `<repo>/target` (`CARGO_TARGET_DIR`), the namespace shows it
//! at `<repo>/target` (a tmpfs there, with bind mounts of the target directory's and the
//! original `target/`'s subdirectories, e.g. `target/criu`), so `target/release/…` in a block
//! means the build this test uses; nested `cargo` runs get that directory as
//! `CARGO_TARGET_DIR`.
//!
//! The `released` and `upstream` prelude provides what the docs assume of a GPU host: a mock
//! world (driver r580, two H100s `GPU-8932f937-…` and `GPU-1d2e3f40-…`) named by
//! `MOCK_CUDA_WORLD`, `LD_LIBRARY_PATH` to its `libcuda.so.1`, `CRIU_CUDA_FORCE_ENABLE=1`, the
//! fake `cuda-checkpoint` and a `criu` in `PATH`, and `PID`: a `mock-cuda-app --gpus 0,1`
//! started as a session leader with `setsid`. The block must dump and restore it. Afterwards the
//! test checks that `$PID` runs again (not stopped, not traced), is RUNNING in the world, and
//! passes its data check (SIGUSR1) on the GPUs the block's device map names; and that the world's
//! trace shows the lock and checkpoint through the dump's backend and the restore and unlock
//! through the restore's backend (from `cuda_plugin.backend` in the block's `--plugin-option`s
//! or `CRIU_PLUGIN_OPTIONS`; `auto` means the driver API here), with the GPU pairs of its
//! `cuda_plugin.device-map`. Nothing but the tree may be left running. Then every process of
//! the namespace is killed and waited for.
//!
//! A failed block prints its `file:line`, its text, its exit status, stdout, stderr and the CRIU
//! logs it wrote under `/tmp`, and keeps its directory. Blocks run one at a time (the tree is
//! restored with its old pid).
//!
//! # Skips
//!
//! `run` blocks need root (mount namespaces, ptrace); `released` blocks need CRIU 4.1.x/4.2.x
//! (found as the other real-CRIU tests find them: `CRIU_CUDA_CRIU_4_1`/`_4_2`, else
//! `target/criu/versions`), `fetched-criu` blocks `target/criu/versions`. Otherwise the block
//! prints a `SKIP` line and is reported as ignored, unless `CRIU_CUDA_REQUIRE_CRIU=1`, which
//! turns a skip into a failure. `dist` blocks also need the release tarballs of this version
//! (run `scripts/dist.sh` first); without them they skip, or fail with
//! `CRIU_CUDA_REQUIRE_DIST=1`.
//!
//! Every `toml` block of `docs/scenarios.md` must parse as a scenario (`harness::scenario`).
//!
//! # Messages
//!
//! `docs/messages.rs` (trials named `troubleshooting: …`) checks `docs/troubleshooting.md`
//! against the plugin's code, both ways: each message the doc lists is in `plugin/src`, and each
//! `#[error]` message of the plugin is in the doc (its module documentation has the rules).
//!
//! # Links
//!
//! `docs/links.rs` (the trial `links`) checks that every relative Markdown link of these files
//! resolves, to a file of the repository and, with an `#anchor`, to a heading of that file (its
//! module documentation has the rules).
//!
//! Run: `cargo test -p harness --test docs [-- FILTER]`, e.g. `-- README.md:`.
//! `DOCS_CHECK_KEEP=1` keeps every block's directory. A block that runs longer than 120 s (900 s
//! when it runs `cargo`; `DOCS_CHECK_TIMEOUT=SECONDS` overrides both) is killed and fails.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use testkit::proc::exists;

use harness::runner::{self, Artifacts};
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use mock_cuda_world::client::{CudaState, MockWorld};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// The scenario format's reference: each of its `toml` blocks must parse as a scenario.
const SCENARIOS_DOC: &str = "docs/scenarios.md";

#[path = "docs/messages.rs"]
mod messages;

#[path = "docs/links.rs"]
mod links;

const HARNESS: &str = env!("CARGO_BIN_EXE_harness");
const MANIFEST: &str = env!("CARGO_MANIFEST_DIR");
const TARGET_TMPDIR: &str = env!("CARGO_TARGET_TMPDIR");

/// Results of the checks: `Err` carries the message for the report.
type R<T = ()> = Result<T, String>;

macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(format!($($arg)+));
        }
    };
}

fn repo() -> PathBuf {
    let p = Path::new(MANIFEST).join("..");
    p.canonicalize().unwrap_or(p)
}

// ---------------------------------------------------------------------------------------------
// Parsing the Markdown

/// How the environment of a `run` block is prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Profile {
    Released,
    Upstream,
    MockWorld,
    FetchedCriu,
}

impl Profile {
    fn name(self) -> &'static str {
        match self {
            Profile::Released => "released",
            Profile::Upstream => "upstream",
            Profile::MockWorld => "mock-world",
            Profile::FetchedCriu => "fetched-criu",
        }
    }

    /// Whether the prelude starts a mock CUDA tree in a mock world.
    fn cuda_tree(self) -> bool {
        matches!(self, Profile::Released | Profile::Upstream)
    }
}

/// What a marker asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Check {
    Run {
        profile: Profile,
        installed: bool,
        dist: bool,
    },
    Ci,
    Kit,
    Manual(String),
}

/// One fenced code block.
#[derive(Debug, Clone)]
struct Block {
    /// Path relative to the repository, e.g. `docs/mock-world.md`.
    file: String,
    /// 1-based line of the opening fence.
    line: usize,
    lang: String,
    text: String,
    check: Option<Check>,
}

impl Block {
    fn at(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }

    /// The block with line numbers of the Markdown file.
    fn listing(&self) -> String {
        let mut s = String::new();
        for (i, l) in self.text.lines().enumerate() {
            let _ = writeln!(s, "  {:>4} | {l}", self.line + 1 + i);
        }
        s
    }
}

const MARKER_PREFIX: &str = "<!-- docs-check:";

fn parse_marker(s: &str) -> R<Check> {
    let inner = s
        .trim()
        .strip_prefix(MARKER_PREFIX)
        .and_then(|r| r.strip_suffix("-->"))
        .ok_or("a marker is one line: `<!-- docs-check: KIND ARGS -->`")?;
    let words: Vec<&str> = inner.split_whitespace().collect();
    match words.as_slice() {
        ["run", profile, rest @ ..] => {
            let profile = match *profile {
                "released" => Profile::Released,
                "upstream" => Profile::Upstream,
                "mock-world" => Profile::MockWorld,
                "fetched-criu" => Profile::FetchedCriu,
                other => {
                    return Err(format!(
                    "unknown run profile `{other}` (released, upstream, mock-world, fetched-criu)"
                ))
                }
            };
            let (installed, dist) = match rest {
                [] => (false, false),
                ["installed"] if profile.cuda_tree() => (true, false),
                ["dist"] if profile.cuda_tree() => (false, true),
                _ => {
                    return Err(format!(
                    "unexpected `{}` after `run {}` (only `installed` or `dist`, for released and upstream)",
                    rest.join(" "),
                    profile.name()
                ))
                }
            };
            Ok(Check::Run {
                profile,
                installed,
                dist,
            })
        }
        ["run"] => {
            Err("`run` needs a profile: released, upstream, mock-world, fetched-criu".into())
        }
        ["ci"] => Ok(Check::Ci),
        ["ci", ..] => Err("`ci` takes no arguments".into()),
        ["kit"] => Ok(Check::Kit),
        ["kit", ..] => Err("`kit` takes no arguments".into()),
        ["manual"] => Err("`manual` needs a reason: `<!-- docs-check: manual REASON -->`".into()),
        ["manual", ..] => Ok(Check::Manual(words[1..].join(" "))),
        [] => Err("empty marker (run PROFILE, ci, kit, manual REASON)".into()),
        [other, ..] => Err(format!(
            "unknown marker kind `{other}` (run PROFILE, ci, kit, manual REASON)"
        )),
    }
}

/// The fence of a line: its character, length and info string.
fn fence(line: &str) -> Option<(char, usize, &str)> {
    let t = line.trim_start();
    if line.len() - t.len() > 3 {
        return None;
    }
    let c = t.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let n = t.chars().take_while(|x| *x == c).count();
    (n >= 3).then(|| (c, n, t[n..].trim()))
}

/// The fenced blocks of one Markdown file; problems go to `errors`.
fn parse_markdown(file: &str, text: &str, errors: &mut Vec<String>) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    // A marker seen and not yet attached to a block: (line, parsed).
    let mut pending: Option<(usize, R<Check>)> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.trim_start().starts_with(MARKER_PREFIX) {
            if let Some((l, _)) = pending.take() {
                errors.push(format!(
                    "{file}:{l}: docs-check marker not followed by an sh block"
                ));
            }
            pending = Some((i + 1, parse_marker(line)));
            i += 1;
            continue;
        }
        let Some((c, n, info)) = fence(line) else {
            if !line.trim().is_empty() {
                if let Some((l, _)) = pending.take() {
                    errors.push(format!(
                        "{file}:{l}: docs-check marker not followed by an sh block"
                    ));
                }
            }
            i += 1;
            continue;
        };
        let start = i + 1;
        let mut body = Vec::new();
        let mut closed = false;
        i += 1;
        while i < lines.len() {
            if let Some((c2, n2, rest)) = fence(lines[i]) {
                if c2 == c && n2 >= n && rest.is_empty() {
                    closed = true;
                    break;
                }
            }
            body.push(lines[i]);
            i += 1;
        }
        i += 1;
        if !closed {
            errors.push(format!("{file}:{start}: code block is never closed"));
        }
        let lang = info.split_whitespace().next().unwrap_or("").to_owned();
        let marker = pending.take();
        if lang.is_empty() {
            errors.push(format!(
                "{file}:{start}: fenced code block without an info string (tag it: sh, toml, c, text, …)"
            ));
        }
        if ["bash", "shell", "console", "zsh", "shell-session"].contains(&lang.as_str()) {
            errors.push(format!(
                "{file}:{start}: tag shell commands `sh`, not `{lang}` (sh blocks are checked)"
            ));
        }
        let mut check = None;
        match (lang.as_str(), marker) {
            ("sh", None) => errors.push(format!(
                "{file}:{start}: sh block without a docs-check marker on the line above (`<!-- docs-check: run PROFILE|ci|manual REASON -->`)"
            )),
            ("sh", Some((l, Err(e)))) => errors.push(format!("{file}:{l}: bad docs-check marker: {e}")),
            ("sh", Some((_, Ok(k)))) => check = Some(k),
            (_, Some((l, _))) => errors.push(format!(
                "{file}:{l}: docs-check marker before a `{lang}` block (markers are for sh blocks)"
            )),
            (_, None) => {}
        }
        let mut text = body.join("\n");
        text.push('\n');
        blocks.push(Block {
            file: file.to_owned(),
            line: start,
            lang,
            text,
            check,
        });
    }
    if let Some((l, _)) = pending {
        errors.push(format!(
            "{file}:{l}: docs-check marker not followed by an sh block"
        ));
    }
    blocks
}

/// README.md and docs/*.md, relative to the repository, in a stable order.
fn doc_files() -> Vec<String> {
    let mut files = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.ends_with(".md"))
                .map(|n| format!("docs/{n}"))
                .collect()
        })
        .unwrap_or_default();
    docs.sort();
    files.extend(docs);
    files
}

/// Every block of every doc, and the problems found.
fn parse_docs() -> (Vec<Block>, Vec<String>) {
    let mut errors = Vec::new();
    let mut blocks = Vec::new();
    for f in doc_files() {
        match std::fs::read_to_string(repo().join(&f)) {
            Ok(text) => blocks.extend(parse_markdown(&f, &text, &mut errors)),
            Err(e) => errors.push(format!("{f}: {e}")),
        }
    }
    (blocks, errors)
}

// ---------------------------------------------------------------------------------------------
// Reading shell commands (enough to know what a block asks CRIU and the plugin for)

/// The text of `line` before an unquoted `#` that starts a word.
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double, mut prev_space) = (false, false, true);
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev_space => return &line[..i],
            _ => {}
        }
        prev_space = c.is_whitespace();
    }
    line
}

/// The simple commands of a block: continuation lines joined, heredoc bodies and comments
/// dropped, split at unquoted `;`, `&` and `|`, each as words with the quotes removed (no
/// expansion).
fn shell_commands(text: &str) -> Vec<Vec<String>> {
    let mut logical = Vec::new();
    let mut cur = String::new();
    let mut heredoc: Option<String> = None;
    for l in text.lines() {
        if let Some(end) = &heredoc {
            if l.trim() == end {
                heredoc = None;
            }
            continue;
        }
        let code = strip_comment(l);
        if let Some(pos) = code.find("<<") {
            let word = code[pos + 2..]
                .trim_start_matches('-')
                .split_whitespace()
                .next()
                .unwrap_or("")
                .trim_matches(|c| c == '\'' || c == '"');
            if !word.is_empty() {
                heredoc = Some(word.to_owned());
            }
        }
        if let Some(s) = code.trim_end().strip_suffix('\\') {
            cur.push_str(s);
            cur.push(' ');
            continue;
        }
        cur.push_str(code);
        logical.push(std::mem::take(&mut cur));
    }
    logical.push(cur);
    let mut out = Vec::new();
    for l in logical {
        let mut words: Vec<String> = Vec::new();
        let mut word = String::new();
        let mut in_word = false;
        let (mut single, mut double) = (false, false);
        for c in l.chars() {
            match c {
                '\'' if !double => {
                    single = !single;
                    in_word = true;
                }
                '"' if !single => {
                    double = !double;
                    in_word = true;
                }
                ';' | '&' | '|' if !single && !double => {
                    if in_word {
                        words.push(std::mem::take(&mut word));
                        in_word = false;
                    }
                    if !words.is_empty() {
                        out.push(std::mem::take(&mut words));
                    }
                }
                c if c.is_whitespace() && !single && !double => {
                    if in_word {
                        words.push(std::mem::take(&mut word));
                        in_word = false;
                    }
                }
                c => {
                    word.push(c);
                    in_word = true;
                }
            }
        }
        if in_word {
            words.push(word);
        }
        if !words.is_empty() {
            out.push(words);
        }
    }
    out
}

fn is_assignment(w: &str) -> bool {
    w.split_once('=').is_some_and(|(n, _)| {
        !n.is_empty()
            && n.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
            && !n.starts_with(|c: char| c.is_ascii_digit())
    })
}

/// A `criu VERB …` command of a block and the `cuda_plugin.*` options it gets.
#[derive(Debug, Clone)]
struct CriuCall {
    verb: String,
    options: BTreeMap<String, String>,
}

fn add_options(map: &mut BTreeMap<String, String>, spec: &str) {
    for o in spec.split_whitespace() {
        if let Some(rest) = o.strip_prefix("cuda_plugin.") {
            let (k, v) = rest.split_once('=').unwrap_or((rest, ""));
            map.insert(k.to_owned(), v.to_owned());
        }
    }
}

/// The `criu` runs of a block, with `CRIU_PLUGIN_OPTIONS` (exported or given to the command)
/// and `--plugin-option` taken into account.
fn criu_calls(text: &str) -> Vec<CriuCall> {
    let mut exported: Option<String> = None;
    let mut calls = Vec::new();
    for words in shell_commands(text) {
        if words[0] == "export" {
            for w in &words[1..] {
                if let Some(v) = w.strip_prefix("CRIU_PLUGIN_OPTIONS=") {
                    exported = Some(v.to_owned());
                }
            }
            continue;
        }
        let n = words.iter().take_while(|w| is_assignment(w)).count();
        let local = words[..n]
            .iter()
            .find_map(|w| w.strip_prefix("CRIU_PLUGIN_OPTIONS="));
        // `CRIU_PLUGIN_OPTIONS=…` alone sets a shell variable, which CRIU does not see.
        let Some(cmd) = words.get(n) else {
            continue;
        };
        if Path::new(cmd).file_name().and_then(|f| f.to_str()) != Some("criu") {
            continue;
        }
        let Some(verb) = words.get(n + 1) else {
            continue;
        };
        let mut options = BTreeMap::new();
        if let Some(env) = local.map(str::to_owned).or_else(|| exported.clone()) {
            add_options(&mut options, &env);
        }
        let args = &words[n + 2..];
        let mut k = 0;
        while k < args.len() {
            if args[k] == "--plugin-option" {
                if let Some(v) = args.get(k + 1) {
                    add_options(&mut options, v);
                }
                k += 2;
                continue;
            }
            if let Some(v) = args[k].strip_prefix("--plugin-option=") {
                add_options(&mut options, v);
            }
            k += 1;
        }
        calls.push(CriuCall {
            verb: verb.clone(),
            options,
        });
    }
    calls
}

/// How many commands of the block run a `cuda-checkpoint` executable.
fn cuda_checkpoint_commands(text: &str) -> usize {
    shell_commands(text)
        .iter()
        .filter(|w| {
            let n = w.iter().take_while(|x| is_assignment(x)).count();
            w.get(n)
                .and_then(|c| Path::new(c).file_name())
                .and_then(|f| f.to_str())
                == Some("cuda-checkpoint")
        })
        .count()
}

// ---------------------------------------------------------------------------------------------
// `ci` and `manual`

/// The command lines of `.ci/run`, comments dropped.
fn ci_lines() -> R<Vec<String>> {
    let ci_path = repo().join(".ci/run");
    let ci =
        std::fs::read_to_string(&ci_path).map_err(|e| format!("{}: {e}", ci_path.display()))?;
    Ok(ci
        .lines()
        .map(|l| strip_comment(l).trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect())
}

/// Whether `cmd` is a line of `.ci/run` (after `NAME=value` assignments at most).
fn in_ci(ci_lines: &[String], cmd: &str) -> bool {
    ci_lines.iter().any(|l| {
        l.strip_suffix(cmd)
            .is_some_and(|pre| pre.split_whitespace().all(is_assignment))
    })
}

fn check_ci(b: &Block) -> R<String> {
    let ci_lines = ci_lines()?;
    let mut checked = Vec::new();
    let mut missing = Vec::new();
    for (i, raw) in b.text.lines().enumerate() {
        let cmd = strip_comment(raw).trim();
        if cmd.is_empty() {
            continue;
        }
        let found = in_ci(&ci_lines, cmd);
        if found {
            checked.push(format!("`{cmd}`"));
        } else {
            missing.push(format!("{}:{}: `{cmd}`", b.file, b.line + 1 + i));
        }
    }
    ensure!(
        missing.is_empty(),
        "{}: a `ci` block's commands must appear verbatim in .ci/run (after NAME=value assignments at most); not found:\n  {}",
        b.at(),
        missing.join("\n  ")
    );
    ensure!(
        !checked.is_empty(),
        "{}: a `ci` block without commands",
        b.at()
    );
    Ok(format!("in .ci/run: {}", checked.join(", ")))
}

/// The kit block (`docs/development.md`, "Testing another CUDA plugin"): its `harness run` command runs with
/// the build under test (`target/debug/` read as the artifacts' directory) on the conformance
/// scenarios only (`scenarios/cuda/conformance/` appended, the JUnit file in a temporary
/// directory), and must pass them all and write the JUnit XML; its other commands must be lines
/// of `.ci/run`, which runs them.
fn check_kit(name: &str, b: &Block) -> Result<Completion, Failed> {
    match kit_run(b)? {
        Ok(summary) => {
            println!("    {name}: ok: on scenarios/cuda/conformance: {summary}; JUnit XML written");
            Ok(Completion::Completed)
        }
        Err(why) => skip(name, why),
    }
}

/// Runs the kit block's command ([`check_kit`]): its summary line, or why it cannot run here.
fn kit_run(b: &Block) -> R<Result<String, String>> {
    // Commands, with `\` continuations joined.
    let mut commands: Vec<(usize, String)> = Vec::new();
    let mut open = false;
    for (i, raw) in b.text.lines().enumerate() {
        let line = strip_comment(raw).trim();
        if line.is_empty() {
            continue;
        }
        let (part, more) = match line.strip_suffix('\\') {
            Some(p) => (p.trim_end(), true),
            None => (line, false),
        };
        match (open, commands.last_mut()) {
            (true, Some((_, c))) => {
                c.push(' ');
                c.push_str(part);
            }
            _ => commands.push((b.line + 1 + i, part.to_owned())),
        }
        open = more;
    }
    let ci = ci_lines()?;
    let (kit, others): (Vec<_>, Vec<_>) = commands
        .into_iter()
        .partition(|(_, c)| c.starts_with("target/debug/harness run "));
    let missing: Vec<String> = others
        .iter()
        .filter(|(_, c)| !in_ci(&ci, c))
        .map(|(l, c)| format!("{}:{l}: `{c}`", b.file))
        .collect();
    ensure!(
        missing.is_empty(),
        "{}: a `kit` block's other commands must appear verbatim in .ci/run; not found:\n  {}",
        b.at(),
        missing.join("\n  ")
    );
    let [(line, cmd)] = kit.as_slice() else {
        return Err(format!(
            "{}: a `kit` block needs exactly one `target/debug/harness run` command",
            b.at()
        ));
    };
    if !is_root() {
        return Ok(Err("not root (CRIU and ptrace)".to_owned()));
    }
    if runner::find_criu("4.2", &repo()).is_none() {
        return Ok(Err("no CRIU 4.2.x (scripts/fetch-criu.sh)".to_owned()));
    }
    let art = Artifacts::for_tests(Path::new(HARNESS))?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let xml = dir.path().join("kit.xml");
    let mut words = cmd.split_whitespace().skip(1);
    let mut c = Command::new(&art.harness);
    let mut junit = false;
    while let Some(w) = words.next() {
        match w {
            "--junit" => {
                words.next();
                c.arg("--junit").arg(&xml);
                junit = true;
            }
            "target/debug/libcuda_plugin.so" => {
                c.arg(&art.plugin);
            }
            w => {
                ensure!(
                    !w.starts_with("target/"),
                    "{}:{line}: `{w}`: the kit command reads the build under test from target/debug/",
                    b.file
                );
                c.arg(w);
            }
        }
    }
    ensure!(
        junit,
        "{}:{line}: the kit command writes no JUnit XML (--junit)",
        b.file
    );
    c.arg(repo().join("scenarios/cuda/conformance"))
        .current_dir(repo())
        .env(criu_cuda_env::REQUIRE_CRIU, "1");
    let out = c
        .output()
        .map_err(|e| format!("{}: {e}", art.harness.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .lines()
        .find(|l| l.contains(" passed, ") && l.contains(" failed"))
        .unwrap_or("");
    ensure!(
        out.status.success() && summary.contains(" 0 failed"),
        "{}:{line}: the kit command on scenarios/cuda/conformance: {}\n{stdout}\n{}",
        b.file,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let x = std::fs::read_to_string(&xml).map_err(|e| format!("{}: {e}", xml.display()))?;
    ensure!(
        x.contains("<testsuites") && x.contains("failures=\"0\""),
        "{}:{line}: the JUnit XML:\n{x}",
        b.file
    );
    Ok(Ok(summary.to_owned()))
}

fn check_manual(b: &Block) -> R {
    for (i, raw) in b.text.lines().enumerate() {
        let cmd = strip_comment(raw).trim();
        if cmd.is_empty() {
            continue;
        }
        ensure!(
            cmd.contains("scripts/bench.sh") || cmd.contains("cargo bench"),
            "{}:{}: `manual` is only for benchmark runs (scripts/bench.sh, cargo bench); run this command (`{cmd}`) with another marker",
            b.file,
            b.line + 1 + i
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Processes

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Collects every exited child (ours and the orphans reparented to this subreaper); returns the
/// status of `watch` if it was among them.
fn reap(watch: Option<i32>) -> Option<WaitStatus> {
    let mut seen = None;
    loop {
        match waitpid(
            Pid::from_raw(-1),
            Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL),
        ) {
            Ok(WaitStatus::StillAlive) | Err(_) => return seen,
            Ok(st) => {
                if st.pid().map(Pid::as_raw) == watch && watch.is_some() {
                    seen = Some(st);
                }
            }
        }
    }
}

/// [`testkit::wait::wait_until`], reaping our exited children at each poll.
fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    testkit::wait::wait_until(limit, || {
        reap(None);
        cond()
    })
}

fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The processes in the mount namespace `ns` (`mnt:[…]`).
fn ns_procs(ns: &str) -> Vec<i32> {
    pids()
        .into_iter()
        .filter(|p| {
            std::fs::read_link(format!("/proc/{p}/ns/mnt")).is_ok_and(|l| l.to_string_lossy() == ns)
        })
        .collect()
}

fn cmdline(pid: i32) -> String {
    read(Path::new(&format!("/proc/{pid}/cmdline")))
        .trim_end_matches('\0')
        .replace('\0', " ")
}

fn exe_name(pid: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

fn environ(pid: i32, name: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|b| *b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{name}=")).map(str::to_owned)
    })
}

/// Ok when `pid` is alive, no thread stopped or traced.
fn check_free_running(pid: i32) -> R {
    ensure!(exists(pid), "pid {pid} is gone");
    ensure!(
        testkit::proc::thread_status(pid, pid).is_none_or(|s| s.state != 'Z'),
        "pid {pid} is a zombie"
    );
    harness::pstree::running_untraced(pid).map_err(|e| format!("pid {pid}: thread {e}"))
}

/// Kills every process of the namespace (and any other named by `marker`, an environment
/// entry), reaps them, and waits until their pids are free.
fn kill_all(ns: Option<&str>, marker: Option<(&str, &str)>) -> R {
    let mut seen: BTreeSet<i32> = BTreeSet::new();
    let me = std::process::id() as i32;
    let find = || {
        let mut v = ns.map(ns_procs).unwrap_or_default();
        if let Some((k, val)) = marker {
            v.extend(
                pids()
                    .into_iter()
                    .filter(|&p| p != me && environ(p, k).as_deref() == Some(val)),
            );
        }
        v
    };
    let done = wait_until(Duration::from_secs(15), || {
        for p in find() {
            seen.insert(p);
            let _ = kill(Pid::from_raw(p), Signal::SIGCONT);
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        seen.iter().all(|&p| !exists(p)) && find().is_empty()
    });
    let left: Vec<i32> = seen.iter().copied().filter(|&p| exists(p)).collect();
    ensure!(done, "processes of the block are still there: {left:?}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The environment of `run` blocks

/// What every `run` block needs, located once.
#[derive(Debug)]
struct Setup {
    repo: PathBuf,
    /// The target directory this test was built in.
    target: PathBuf,
    art: Artifacts,
}

fn setup() -> R<&'static Setup> {
    static S: OnceLock<R<Setup>> = OnceLock::new();
    S.get_or_init(|| {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let profile = exe
            .parent()
            .and_then(Path::parent)
            .ok_or("the test binary is not in <target>/<profile>/deps")?;
        let target = profile
            .parent()
            .ok_or("no target directory")?
            .canonicalize()
            .map_err(|e| e.to_string())?;
        let art = Artifacts::for_tests(Path::new(HARNESS))?;
        for tool in ["unshare", "mount", "setsid", "install"] {
            let ok = Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            ensure!(ok, "`{tool}` is not installed (util-linux, coreutils)");
        }
        Ok(Setup {
            repo: repo(),
            target,
            art,
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

impl Setup {
    fn mapped(&self) -> bool {
        self.target != self.repo.join("target")
    }

    /// Where host path `p` is seen inside the namespace.
    fn inside(&self, p: &Path) -> R<PathBuf> {
        let q = match p.strip_prefix(&self.target) {
            Ok(rest) if self.mapped() => self.repo.join("target").join(rest),
            _ => p.to_path_buf(),
        };
        // The namespace covers /tmp with a tmpfs; the wrapper keeps only the repository (and so
        // its target/) visible there.
        ensure!(
            !q.starts_with("/tmp") || q.starts_with(&self.repo),
            "{} is under /tmp, which the docs check covers with a tmpfs (move it)",
            q.display()
        );
        Ok(q)
    }
}

/// The world of the `released`/`upstream` prelude: GPUs whose UUIDs the docs' examples name.
const WORLD_TOML: &str = r#"schema = 1

[driver]
branch = 580

[[gpu]]
uuid = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
name = "NVIDIA H100 80GB HBM3"
memory_mib = 1024
chip = "GH100"

[[gpu]]
uuid = "GPU-1d2e3f40-5a6b-4c7d-8e9f-a0b1c2d3e4f5"
name = "NVIDIA H100 80GB HBM3"
memory_mib = 1024
chip = "GH100"
"#;

fn world_gpus() -> Vec<String> {
    WORLD_TOML
        .lines()
        .filter_map(|l| l.strip_prefix("uuid = \""))
        .map(|l| l.trim_end_matches('"').to_owned())
        .collect()
}

/// Runs inside `unshare --mount --propagation private`: the mounts, the prelude, the block, the
/// collection of its logs. Parameters come as `DOCS_*` variables.
const WRAPPER: &str = r#"set -euo pipefail
# Descriptors inherited from outside the namespace would name mounts CRIU cannot find.
for p in /proc/$$/fd/*; do
    fd=${p##*/}
    case $fd in 0 | 1 | 2 | 255) ;; *) eval "exec $fd>&-" ;; esac
done 2>/dev/null
readlink /proc/self/ns/mnt >"$DOCS_W/mntns"
R=$DOCS_REPO/target
if [ "$DOCS_TARGET" != "$R" ]; then
    # Show the test's target directory at <repo>/target: a tmpfs with bind mounts of the
    # directories of the original target/ (e.g. criu/) and, over them, of the real one.
    orig=$DOCS_W/.orig-target real=$DOCS_W/.real-target
    mkdir -p "$orig" "$real" "$R" "$DOCS_TARGET/debug" "$DOCS_TARGET/release"
    mount --bind "$R" "$orig"
    mount --bind "$DOCS_TARGET" "$real"
    mount -t tmpfs -o mode=0755 docs-check-target "$R"
    for src in "$orig" "$real"; do
        for d in "$src"/*/; do
            [ -d "$d" ] || continue
            n=$(basename "$d")
            mkdir -p "$R/$n"
            mount --bind "$d" "$R/$n"
        done
    done
    umount "$orig" "$real"
    export CARGO_TARGET_DIR=$DOCS_TARGET
fi
W=$DOCS_W_IN
# A repository under /tmp (a CI checkout, say) stays visible at its path over the new tmpfs:
# bind it back from a descriptor opened before the mount (-c: the kernel follows the
# descriptor, not the path it names, which the tmpfs hides).
keep_repo=0
case $DOCS_REPO/ in /tmp/*) keep_repo=1 && exec 8<"$DOCS_REPO" ;; esac
mount -t tmpfs -o mode=1777 docs-check-tmp /tmp
if [ "$keep_repo" = 1 ]; then
    mkdir -p "$DOCS_REPO"
    mount -c --rbind /proc/self/fd/8 "$DOCS_REPO"
    exec 8<&-
fi
mount -t tmpfs -o mode=0755 docs-check-plugins /usr/lib/criu
unset CRIU_LIBS_DIR CRIU_PLUGIN_OPTIONS CUDA_VISIBLE_DEVICES CRIU_FAULT HARNESS_HOST \
    MOCK_CUDA_WORLD CRIU_CUDA_PLUGIN_MAX_HOOKS CRIU_CUDA_FORCE_ENABLE
command -v cargo >/dev/null || export PATH=$PATH:$DOCS_CARGO_DIR
if [ "$DOCS_CUDA_TREE" = 1 ]; then
    export MOCK_CUDA_WORLD=$W/world
    export LD_LIBRARY_PATH=$W/world/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export CRIU_CUDA_FORCE_ENABLE=1
    export PATH=$W/bin:$PATH
    "$DOCS_MOCK_WORLD" init "$W/world" --config "$W/world.toml" --lib "$DOCS_MOCK_LIB" \
        --nvml-lib "$DOCS_MOCK_NVML" >/dev/null
    if [ "$DOCS_INSTALLED" = 1 ]; then
        install -D -m 0644 "$DOCS_PLUGIN" /usr/lib/criu/cuda_plugin.so
    fi
    setsid "$DOCS_MOCK_APP" --gpus 0,1 --kib 64 --threads 1 --report "$W/report" \
        </dev/null >/dev/null 2>&1 &
    export PID=$!
    echo "$PID" >"$W/pid"
    for _ in $(seq 200); do
        grep -q '^READY ' "$W/report" 2>/dev/null && break
        sleep 0.05
    done
    grep -q '^READY ' "$W/report" || { echo "docs-check: the mock CUDA tree did not start" >&2; exit 1; }
fi
if [ "$DOCS_DIST" = 1 ]; then
    # As from the directory the release tarballs were downloaded to.
    cd "$W/download"
else
    cd "$DOCS_REPO"
fi
set +e
bash -euo pipefail "$W/block.sh" </dev/null >"$W/stdout" 2>"$W/stderr"
rc=$?
set -e
(cd /usr/lib/criu && sha256sum -- *.so) >"$W/plugins.sha256" 2>/dev/null || true
mkdir -p "$W/logs"
(cd /tmp && find . -path "./${DOCS_REPO#/tmp/}" -prune -o -name '*.log' -type f \
    -exec cp --parents {} "$W/logs/" \;) || true
echo "$rc" >"$W/rc"
"#;

/// One run of one block.
struct BlockRun<'a> {
    s: &'a Setup,
    block: &'a Block,
    profile: Profile,
    installed: bool,
    /// `dist`: the release tarballs the block's directory gets (empty otherwise).
    tarballs: Vec<PathBuf>,
    /// The `criu` the prelude puts in `PATH` (a real CRIU), or None for the harness.
    criu: Option<PathBuf>,
    label: String,
    dir: Option<tempfile::TempDir>,
    /// The directory on the host and inside the namespace.
    w: PathBuf,
    w_in: PathBuf,
    ns: Option<String>,
    created_plugin_dir: bool,
}

/// What the block's run produced.
struct Outcome {
    rc: Option<i32>,
    seconds: f64,
}

impl<'a> BlockRun<'a> {
    fn new(
        s: &'a Setup,
        block: &'a Block,
        profile: Profile,
        installed: bool,
        tarballs: Vec<PathBuf>,
        criu: Option<PathBuf>,
        label: String,
    ) -> R<Self> {
        let base = Path::new(TARGET_TMPDIR);
        std::fs::create_dir_all(base).map_err(|e| format!("{}: {e}", base.display()))?;
        let prefix = format!(
            "docs-{}-{}-",
            block.file.replace(['/', '.'], "_"),
            block.line
        );
        let dir = tempfile::Builder::new()
            .prefix(&prefix)
            .tempdir_in(base)
            .map_err(|e| format!("a directory under {}: {e}", base.display()))?;
        let w = dir
            .path()
            .canonicalize()
            .map_err(|e| format!("{}: {e}", dir.path().display()))?;
        let w_in = s.inside(&w)?;
        Ok(Self {
            s,
            block,
            profile,
            installed,
            tarballs,
            criu,
            label,
            dir: Some(dir),
            w,
            w_in,
            ns: None,
            created_plugin_dir: false,
        })
    }

    fn file(&self, name: &str) -> PathBuf {
        self.w.join(name)
    }

    fn write(&self, name: &str, text: &str) -> R {
        std::fs::write(self.file(name), text).map_err(|e| format!("writing {name}: {e}"))
    }

    fn prepare(&mut self) -> R {
        self.write("block.sh", &self.block.text)?;
        self.write("wrapper.sh", WRAPPER)?;
        if !self.tarballs.is_empty() {
            let download = self.file("download");
            std::fs::create_dir_all(&download).map_err(|e| e.to_string())?;
            for t in &self.tarballs {
                let name = t.file_name().ok_or("a tarball path without a name")?;
                std::fs::copy(t, download.join(name))
                    .map_err(|e| format!("copying {}: {e}", t.display()))?;
            }
        }
        if self.profile.cuda_tree() {
            self.write("world.toml", WORLD_TOML)?;
            let bin = self.file("bin");
            std::fs::create_dir_all(&bin).map_err(|e| e.to_string())?;
            let cc = self.s.inside(&self.s.art.cuda_checkpoint)?;
            std::os::unix::fs::symlink(&cc, bin.join("cuda-checkpoint"))
                .map_err(|e| format!("linking cuda-checkpoint: {e}"))?;
            let target = match &self.criu {
                Some(c) => format!("'{}'", self.s.inside(c)?.display()),
                None => format!(
                    "'{}' --host upstream",
                    self.s.inside(Path::new(HARNESS))?.display()
                ),
            };
            let script = format!("#!/bin/sh\nexec {target} \"$@\"\n");
            std::fs::write(bin.join("criu"), script).map_err(|e| e.to_string())?;
            std::fs::set_permissions(bin.join("criu"), std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("chmod of the criu wrapper: {e}"))?;
        }
        let plugin_dir = Path::new("/usr/lib/criu");
        if !plugin_dir.exists() {
            std::fs::create_dir(plugin_dir)
                .map_err(|e| format!("creating {}: {e}", plugin_dir.display()))?;
            self.created_plugin_dir = true;
        }
        Ok(())
    }

    /// Runs the wrapper (and so the block); returns once it exited.
    fn execute(&mut self) -> R<Outcome> {
        let s = self.s;
        let limit = Duration::from_secs(
            std::env::var("DOCS_CHECK_TIMEOUT")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(if self.block.text.contains("cargo ") {
                    900
                } else {
                    120
                }),
        );
        let cargo_dir = std::env::var_os("CARGO")
            .map(PathBuf::from)
            .and_then(|c| c.parent().map(Path::to_path_buf))
            .unwrap_or_default();
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "bash"])
            .arg(self.file("wrapper.sh"))
            .current_dir(&s.repo)
            .env("DOCS_REPO", &s.repo)
            .env("DOCS_TARGET", &s.target)
            .env("DOCS_W", &self.w)
            .env("DOCS_W_IN", &self.w_in)
            .env("DOCS_CARGO_DIR", cargo_dir)
            .env(
                "DOCS_CUDA_TREE",
                if self.profile.cuda_tree() { "1" } else { "0" },
            )
            .env("DOCS_INSTALLED", if self.installed { "1" } else { "0" })
            .env(
                "DOCS_DIST",
                if self.tarballs.is_empty() { "0" } else { "1" },
            )
            .env("DOCS_MOCK_WORLD", s.inside(&s.art.mock_world)?)
            .env("DOCS_MOCK_LIB", s.inside(&s.art.mock_lib)?)
            .env("DOCS_MOCK_NVML", s.inside(&s.art.mock_nvml)?)
            .env("DOCS_MOCK_APP", s.inside(&s.art.mock_app)?)
            .env("DOCS_PLUGIN", s.inside(&s.art.plugin)?)
            .stdin(Stdio::null());
        let log = std::fs::File::create(self.file("wrapper.log")).map_err(|e| e.to_string())?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        cmd.stdout(log).stderr(log2);
        let start = Instant::now();
        // Waited for with waitpid(-1) below (with the orphans), never through the `Child`.
        let child = cmd.spawn().map_err(|e| format!("starting unshare: {e}"))?;
        let pid = child.id() as i32;
        drop(child);
        let status = loop {
            if self.ns.is_none() {
                let ns = read(&self.file("mntns")).trim().to_owned();
                if !ns.is_empty() {
                    self.ns = Some(ns);
                }
            }
            if let Some(st) = reap(Some(pid)) {
                break st;
            }
            if start.elapsed() > limit {
                // The namespace's /tmp, seen through one of its processes, for the CRIU logs.
                if let Some(p) = self
                    .ns
                    .as_deref()
                    .map(ns_procs)
                    .and_then(|v| v.first().copied())
                {
                    let tmp = PathBuf::from(format!("/proc/{p}/root/tmp"));
                    let repo = self
                        .s
                        .repo
                        .strip_prefix("/tmp")
                        .ok()
                        .map(|rel| tmp.join(rel));
                    copy_logs(&tmp, &self.file("logs"), repo.as_deref());
                }
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                let _ = kill_all(self.ns.as_deref(), None);
                return Err(format!(
                    "the block ran over {} s and was killed (a command that does not return, e.g. `criu restore` without -d?)\n{}",
                    limit.as_secs(),
                    self.report(None)
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let seconds = start.elapsed().as_secs_f64();
        let wrapper_ok = matches!(status, WaitStatus::Exited(_, 0));
        let rc = read(&self.file("rc")).trim().parse().ok();
        ensure!(
            wrapper_ok && rc.is_some(),
            "the docs-check wrapper failed ({status:?}) before the block finished:\n{}\n{}",
            read(&self.file("wrapper.log")),
            self.report(rc)
        );
        Ok(Outcome { rc, seconds })
    }

    /// The block, its exit status, outputs and CRIU logs, for a failure message.
    fn report(&self, rc: Option<i32>) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "block {} ({}):\n{}",
            self.block.at(),
            self.label,
            self.block.listing()
        );
        let _ = writeln!(
            s,
            "exit status: {}",
            rc.map_or("none (did not finish)".to_owned(), |r| r.to_string())
        );
        for name in ["stdout", "stderr"] {
            let t = read(&self.file(name));
            let _ = writeln!(s, "--- {name} ---\n{}", tail(&t, 60));
        }
        let mut logs = Vec::new();
        collect_files(&self.file("logs"), &mut logs);
        logs.sort();
        for l in logs {
            let rel = l.strip_prefix(self.file("logs")).unwrap_or(&l);
            let _ = writeln!(
                s,
                "--- /tmp/{} (last lines) ---\n{}",
                rel.display(),
                tail(&read(&l), 40)
            );
        }
        let _ = write!(s, "--- end ---");
        s
    }

    fn logs(&self) -> Vec<(PathBuf, String)> {
        let mut files = Vec::new();
        collect_files(&self.file("logs"), &mut files);
        files.sort();
        files
            .into_iter()
            .map(|f| {
                let rel = f.strip_prefix(self.file("logs")).unwrap_or(&f);
                (Path::new("/tmp").join(rel), read(&f))
            })
            .collect()
    }

    fn cleanup(&mut self) -> R {
        let marker = self.w_in.join("world").display().to_string();
        let r = kill_all(self.ns.as_deref(), Some(("MOCK_CUDA_WORLD", &marker)));
        if self.created_plugin_dir {
            self.created_plugin_dir = false;
            std::fs::remove_dir("/usr/lib/criu")
                .map_err(|e| format!("removing /usr/lib/criu (created for the check): {e}"))?;
        }
        r
    }
}

impl Drop for BlockRun<'_> {
    fn drop(&mut self) {
        let _ = self.cleanup();
    }
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    collect_files_but(dir, None, out);
}

/// [`collect_files`], leaving out the subtree `skip`.
fn collect_files_but(dir: &Path, skip: Option<&Path>, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if skip == Some(p.as_path()) {
            continue;
        }
        if p.is_dir() {
            collect_files_but(&p, skip, out);
        } else {
            out.push(p);
        }
    }
}

/// Copies the `*.log` files under `from` to `to`, keeping their relative paths, except those
/// under `skip` (the repository, when it lives under the namespace's /tmp).
fn copy_logs(from: &Path, to: &Path, skip: Option<&Path>) {
    let mut files = Vec::new();
    collect_files_but(from, skip, &mut files);
    for f in files {
        if f.extension().is_some_and(|e| e == "log") {
            if let Ok(rel) = f.strip_prefix(from) {
                let dst = to.join(rel);
                if let Some(d) = dst.parent() {
                    let _ = std::fs::create_dir_all(d);
                }
                let _ = std::fs::copy(&f, dst);
            }
        }
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    let skipped = lines.len().saturating_sub(n);
    let mut out = String::new();
    if skipped > 0 {
        let _ = writeln!(out, "[… {skipped} lines]");
    }
    out.push_str(&lines[skipped..].join("\n"));
    out
}

// ---------------------------------------------------------------------------------------------
// Epilogues

/// One line of a world's trace.
#[derive(Debug)]
struct Call {
    caller: i32,
    call: String,
    result: String,
}

fn parse_trace(text: &str) -> Vec<Call> {
    text.lines()
        .filter_map(|l| {
            let t = mock_cuda_world::trace::parse_line(l)?;
            Some(Call {
                caller: t.caller.parse().ok()?,
                call: t.call.to_owned(),
                result: t.result.to_owned(),
            })
        })
        .collect()
}

fn cap(op: &str) -> String {
    let mut c = op.chars();
    c.next()
        .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
        .unwrap_or_default()
}

/// The backend a `criu` run's options select in the prelude's world (r580: `auto` picks the
/// driver API).
fn backend_of(call: &CriuCall) -> R<&'static str> {
    match call.options.get("backend").map(String::as_str) {
        None | Some("auto") => Ok("driver-api"),
        Some("driver-api") => Ok("driver-api"),
        Some("cuda-checkpoint") => Ok("cuda-checkpoint"),
        Some(other) => Err(format!("unknown cuda_plugin.backend={other} in the block")),
    }
}

/// The full UUID of a device-map side: a unique (case-insensitive) UUID prefix or an ordinal.
fn resolve_gpu(spec: &str, gpus: &[String]) -> R<String> {
    if let Ok(i) = spec.parse::<usize>() {
        return gpus
            .get(i)
            .cloned()
            .ok_or_else(|| format!("device map: no GPU {i}"));
    }
    let m: Vec<&String> = gpus
        .iter()
        .filter(|g| g.to_lowercase().starts_with(&spec.to_lowercase()))
        .collect();
    match m.as_slice() {
        [one] => Ok((*one).clone()),
        _ => Err(format!(
            "device map: `{spec}` names {} of the prelude's GPUs {gpus:?}",
            m.len()
        )),
    }
}

/// The block's `cuda_plugin.device-map` of the restore as checkpointed GPU -> GPU (None: no map
/// or `auto`).
fn expected_map(call: &CriuCall, gpus: &[String]) -> R<Option<BTreeMap<String, String>>> {
    let Some(v) = call.options.get("device-map") else {
        return Ok(None);
    };
    if v == "auto" {
        return Ok(None);
    }
    let mut map = BTreeMap::new();
    for e in v.split(',') {
        let (a, b) = e
            .split_once('=')
            .ok_or_else(|| format!("device map entry `{e}` is not OLD=NEW"))?;
        map.insert(resolve_gpu(a, gpus)?, resolve_gpu(b, gpus)?);
    }
    Ok(Some(map))
}

/// `gpuPairs=[A=B,…]` of a traced restore call.
fn gpu_pairs(call: &str) -> BTreeMap<String, String> {
    let Some(start) = call.find("gpuPairs=[") else {
        return BTreeMap::new();
    };
    let rest = &call[start + "gpuPairs=[".len()..];
    let inner = rest.split(']').next().unwrap_or("");
    inner
        .split(',')
        .filter_map(|p| p.split_once('='))
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .collect()
}

fn report_field<'t>(line: &'t str, key: &str) -> Option<&'t str> {
    line.split_whitespace().find_map(|f| f.strip_prefix(key))
}

/// The epilogue of `released`/`upstream`: the tree restored, running, with its data, through
/// the backends and onto the GPUs the block asked for.
fn check_cuda_tree(run: &BlockRun<'_>) -> R<String> {
    let pid: i32 = read(&run.file("pid"))
        .trim()
        .parse()
        .map_err(|_| "the prelude recorded no PID".to_owned())?;
    let calls = criu_calls(&run.block.text);
    let dump = calls.iter().rev().find(|c| c.verb == "dump");
    let restore = calls.iter().rev().find(|c| c.verb == "restore");
    let (Some(dump), Some(restore)) = (dump, restore) else {
        return Err(format!(
            "a `run {}` block must dump and restore the prelude's tree (`criu dump -t \"$PID\" …`, `criu restore …`); found {:?}",
            run.profile.name(),
            calls.iter().map(|c| c.verb.as_str()).collect::<Vec<_>>()
        ));
    };
    let gpus = world_gpus();
    let dump_backend = backend_of(dump)?;
    let restore_backend = backend_of(restore)?;
    let map = expected_map(restore, &gpus)?;

    // Running free, and nothing else left in the namespace.
    let running = || check_free_running(pid);
    if !wait_until(Duration::from_secs(5), || running().is_ok()) {
        running().map_err(|e| format!("the restored tree: {e}"))?;
    }
    if let Some(ns) = &run.ns {
        let others: Vec<String> = ns_procs(ns)
            .into_iter()
            .filter(|&p| p != pid)
            .map(|p| format!("{p} ({})", cmdline(p)))
            .collect();
        ensure!(
            others.is_empty(),
            "processes other than the restored tree were left running: {others:?}"
        );
    }

    // RUNNING in the world.
    let world = run.file("world");
    let status = MockWorld::open(&world)
        .and_then(|w| w.status())
        .map_err(|e| e.to_string())?;
    let state = status
        .processes
        .iter()
        .find(|p| p.host_pid() == Some(pid))
        .map(|p| p.state().name());
    ensure!(
        state == Some("running"),
        "pid {pid} is {state:?} in the mock world, not running:\n{}",
        status.table()
    );

    // The data check, on the GPUs the map names.
    let report = run.file("report");
    let before = read(&report).lines().count();
    kill(Pid::from_raw(pid), Signal::SIGUSR1).map_err(|e| format!("SIGUSR1 to {pid}: {e}"))?;
    let needle = format!(" pid={pid} ");
    let answered = || {
        read(&report)
            .lines()
            .skip(before)
            .any(|l| (l.starts_with("PASS ") || l.starts_with("FAIL ")) && l.contains(&needle))
    };
    let ok = wait_until(Duration::from_secs(10), answered);
    let text = read(&report);
    ensure!(
        !text.lines().any(|l| l.starts_with("FAIL ")),
        "the restored tree failed its data check:\n{text}"
    );
    ensure!(ok, "pid {pid} did not answer SIGUSR1:\n{text}");
    let ready_gpus: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with("READY "))
        .and_then(|l| report_field(l, "gpus="))
        .map(|g| g.split(',').collect())
        .unwrap_or_default();
    let pass = text
        .lines()
        .skip(before)
        .find(|l| l.starts_with("PASS "))
        .unwrap_or("");
    let now_gpus = report_field(pass, "gpus=").unwrap_or("");
    let want: Vec<String> = ready_gpus
        .iter()
        .map(|g| {
            map.as_ref()
                .and_then(|m| m.get(*g).cloned())
                .unwrap_or_else(|| (*g).to_owned())
        })
        .collect();
    ensure!(
        now_gpus == want.join(","),
        "after the restore the tree's data is on {now_gpus}, expected {} (READY: {})",
        want.join(","),
        ready_gpus.join(",")
    );

    // The trace: which backend did what.
    let trace = parse_trace(&read(&world.join("trace.log")));
    let cli: BTreeSet<i32> = trace
        .iter()
        .filter(|c| c.call.starts_with("cuda-checkpoint("))
        .map(|c| c.caller)
        .collect();
    let api_did = |op: &str| {
        let head = format!("cuCheckpointProcess{}(pid={pid}", cap(op));
        trace.iter().any(|c| {
            !cli.contains(&c.caller)
                && c.result == "CUDA_SUCCESS"
                && (c.call.starts_with(&format!("{head},"))
                    || c.call.starts_with(&format!("{head})")))
        })
    };
    let cli_did = |op: &str| {
        trace.iter().any(|c| {
            let Some(args) = c
                .call
                .strip_prefix("cuda-checkpoint(")
                .and_then(|a| a.strip_suffix(')'))
            else {
                return false;
            };
            let w: Vec<&str> = args.split_whitespace().collect();
            c.result == "exit=0"
                && w.windows(2).any(|x| x == ["--action", op])
                && w.windows(2).any(|x| x == ["--pid", &pid.to_string()])
        })
    };
    let mut done = Vec::new();
    for (ops, backend, verb) in [
        (["lock", "checkpoint"], dump_backend, "dump"),
        (["restore", "unlock"], restore_backend, "restore"),
    ] {
        for op in ops {
            let (api, utility) = (api_did(op), cli_did(op));
            match backend {
                "driver-api" => ensure!(
                    api && !utility,
                    "{verb}: expected the driver API to {op} pid {pid} (cuda_plugin.backend of the block's {verb}), and no cuda-checkpoint run to: driver API {api}, cuda-checkpoint {utility}"
                ),
                _ => ensure!(
                    utility && !api,
                    "{verb}: expected `cuda-checkpoint --action {op} --pid {pid}` (cuda_plugin.backend of the block's {verb}), and no driver API call to: cuda-checkpoint {utility}, driver API {api}"
                ),
            }
        }
        done.push(format!("{verb} via {backend}"));
    }
    if dump_backend == "driver-api" && restore_backend == "driver-api" {
        ensure!(
            cli.is_empty(),
            "the block uses the driver API only, but cuda-checkpoint ran {} time(s)",
            cli.len()
        );
    }
    let restores: Vec<&Call> = trace
        .iter()
        .filter(|c| {
            c.result == "CUDA_SUCCESS"
                && c.call
                    .starts_with(&format!("cuCheckpointProcessRestore(pid={pid}"))
        })
        .collect();
    let last = restores
        .last()
        .ok_or("no successful cuCheckpointProcessRestore in the trace")?;
    let pairs = gpu_pairs(&last.call);
    match &map {
        Some(m) => ensure!(
            &pairs == m,
            "the restore mapped the GPUs as {pairs:?}, the block's device map says {m:?}:\n  {}",
            last.call
        ),
        None => ensure!(
            pairs.iter().all(|(a, b)| a == b),
            "no device map in the block, but the restore moved GPUs: {pairs:?}"
        ),
    }
    let map_note = match &map {
        Some(m) => format!(
            "GPUs mapped {}",
            m.iter()
                .map(|(a, b)| format!("{}→{}", &a[..12], &b[..12]))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => "GPUs unchanged".to_owned(),
    };
    Ok(format!(
        "pid {pid} restored, running free, RUNNING in the world, data PASS; {}; {map_note}",
        done.join(", ")
    ))
}

/// The epilogue of `mock-world`: the workloads the block left run, with their data, and its
/// `cuda-checkpoint` commands succeeded.
fn check_mock_world(run: &BlockRun<'_>) -> R<String> {
    let ns = run.ns.as_deref().ok_or("the namespace is unknown")?;
    let procs = ns_procs(ns);
    ensure!(
        !procs.is_empty(),
        "the block left no workload running (a `mock-world` block starts one)"
    );
    let mut worlds = BTreeSet::new();
    for &p in &procs {
        ensure!(
            exe_name(p) == "mock-cuda-app",
            "the block left a process other than mock-cuda-app: {p} ({})",
            cmdline(p)
        );
        check_free_running(p)?;
        let world = environ(p, "MOCK_CUDA_WORLD")
            .ok_or_else(|| format!("pid {p} has no MOCK_CUDA_WORLD"))?;
        // The world is on the namespace's /tmp: seen through the process's root.
        let outside = PathBuf::from(format!("/proc/{p}/root")).join(world.trim_start_matches('/'));
        let status = MockWorld::open(&outside)
            .and_then(|w| w.status())
            .map_err(|e| e.to_string())?;
        let running = status
            .processes
            .iter()
            .any(|q| q.host_pid() == Some(p) && q.state() == CudaState::Running);
        ensure!(
            running,
            "pid {p} is not RUNNING in its world:\n{}",
            status.table()
        );
        let stdout = PathBuf::from(format!("/proc/{p}/fd/1"));
        let before = read(&stdout).lines().count();
        ensure!(
            std::fs::metadata(&stdout).is_ok_and(|m| m.is_file()),
            "pid {p}'s stdout is not a file: the check reads its PASS line there"
        );
        kill(Pid::from_raw(p), Signal::SIGUSR1).map_err(|e| e.to_string())?;
        let needle = format!("PASS pid={p} ");
        let ok = wait_until(Duration::from_secs(10), || {
            read(&stdout)
                .lines()
                .skip(before)
                .any(|l| l.starts_with(&needle))
        });
        ensure!(
            ok,
            "pid {p} did not pass its data check:\n{}",
            read(&stdout)
        );
        worlds.insert(outside);
    }
    let want = cuda_checkpoint_commands(&run.block.text);
    let mut runs = Vec::new();
    for w in &worlds {
        for c in parse_trace(&read(&w.join("trace.log"))) {
            if c.call.starts_with("cuda-checkpoint(") {
                runs.push(format!("{} = {}", c.call, c.result));
            }
        }
    }
    ensure!(
        runs.len() == want && runs.iter().all(|r| r.ends_with("= exit=0")),
        "the block has {want} cuda-checkpoint command(s); the world traced {}:\n  {}",
        runs.len(),
        runs.join("\n  ")
    );
    ensure!(
        !read(&run.file("stdout")).trim().is_empty(),
        "the block printed nothing"
    );
    Ok(format!(
        "{} mock-cuda-app(s) left running free, RUNNING, data PASS; {want} cuda-checkpoint run(s) exit 0",
        procs.len()
    ))
}

/// The epilogue of `fetched-criu`: what the block restored runs, and its CRIU logs agree.
fn check_fetched_criu(run: &BlockRun<'_>) -> R<String> {
    let ns = run.ns.as_deref().ok_or("the namespace is unknown")?;
    let procs = ns_procs(ns);
    ensure!(
        !procs.is_empty(),
        "the block left nothing running (nothing restored?)"
    );
    for &p in &procs {
        ensure!(
            exe_name(p) != "criu",
            "a CRIU was left running: {p} ({})",
            cmdline(p)
        );
        check_free_running(p)?;
    }
    let logs = run.logs();
    ensure!(
        !logs.is_empty(),
        "the block wrote no CRIU log under /tmp (give its CRIU runs -o)"
    );
    for (path, text) in &logs {
        ensure!(
            !text.contains("FAILED"),
            "{} says FAILED:\n{}",
            path.display(),
            tail(text, 30)
        );
    }
    let said = |s: &str| logs.iter().any(|(_, t)| t.contains(s));
    ensure!(
        said("Dumping finished successfully"),
        "no CRIU log says \"Dumping finished successfully\""
    );
    ensure!(
        said("Restore finished successfully"),
        "no CRIU log says \"Restore finished successfully\""
    );
    Ok(format!(
        "restored: {}; running free; the logs say the dump and the restore finished successfully",
        procs
            .iter()
            .map(|&p| format!("{p} ({})", cmdline(p)))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

// ---------------------------------------------------------------------------------------------
// The trials

/// A skip, or a failure when the environment variable `require` is `1`.
fn skip_unless(name: &str, reason: String, require: &str) -> Result<Completion, Failed> {
    if criu_cuda_env::is_on(require) {
        return Err(format!("{reason}, and {require}=1").into());
    }
    println!("SKIP {name}: {reason}");
    Ok(Completion::ignored_with(reason))
}

fn skip(name: &str, reason: String) -> Result<Completion, Failed> {
    skip_unless(name, reason, criu_cuda_env::REQUIRE_CRIU)
}

/// This version's release tarballs in `<target>/dist` (written by `scripts/dist.sh`).
fn dist_tarballs(target: &Path) -> Vec<PathBuf> {
    let prefix = format!("criu-cuda-plugin-{}-", env!("CARGO_PKG_VERSION"));
    let mut v: Vec<PathBuf> = std::fs::read_dir(target.join("dist"))
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&prefix) && n.ends_with("-linux-gnu.tar.gz"))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The epilogue of `dist`: the plugin CRIU loaded from `/usr/lib/criu` is a tarball's
/// `cuda_plugin.so`, by the `SHA256SUMS` the block unpacked.
fn check_dist_installed(run: &BlockRun<'_>) -> R<String> {
    let hash_of = |text: &str, file: &str| -> Option<String> {
        text.lines().find_map(|l| {
            let (h, f) = l.split_once("  ")?;
            (f == file).then(|| h.to_owned())
        })
    };
    let installed = hash_of(&read(&run.file("plugins.sha256")), "cuda_plugin.so").ok_or(
        "the block installed no /usr/lib/criu/cuda_plugin.so (a `dist` block installs the tarball's)",
    )?;
    let mut unpacked = Vec::new();
    if let Ok(d) = std::fs::read_dir(run.file("download")) {
        for e in d.flatten() {
            let sums = read(&e.path().join("SHA256SUMS"));
            if let Some(h) = hash_of(&sums, "cuda_plugin.so") {
                unpacked.push((e.file_name().to_string_lossy().into_owned(), h));
            }
        }
    }
    let from = unpacked
        .iter()
        .find(|(_, h)| *h == installed)
        .map(|(d, _)| d.clone());
    from.map(|d| format!("/usr/lib/criu/cuda_plugin.so is {d}/cuda_plugin.so"))
        .ok_or_else(|| {
            format!(
                "/usr/lib/criu/cuda_plugin.so (sha256 {installed}) is not the cuda_plugin.so of an unpacked tarball ({unpacked:?})"
            )
        })
}

/// A real CRIU of `series`, with a path that can be exec'd from a script.
fn real_criu(series: &str) -> Option<PathBuf> {
    let p = runner::find_criu(series, &repo())?;
    if p.components().count() > 1 {
        return p.canonicalize().ok();
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(&p))
            .find(|c| c.is_file())
    })
}

fn run_block(
    name: &str,
    block: &Block,
    profile: Profile,
    installed: bool,
    dist: bool,
    series: Option<&str>,
) -> Result<Completion, Failed> {
    if !is_root() {
        return skip(
            name,
            "not root (the check mounts in a private namespace, and CRIU needs root)".into(),
        );
    }
    let criu = match series {
        Some(v) => match real_criu(v) {
            Some(p) => Some(p),
            None => {
                return skip(
                    name,
                    format!(
                        "no CRIU {v}.x found (set CRIU_CUDA_CRIU_{}, or run scripts/fetch-criu.sh)",
                        v.replace('.', "_")
                    ),
                )
            }
        },
        None => None,
    };
    if profile == Profile::FetchedCriu {
        // What the block names literally (scripts/fetch-criu.sh's default directory).
        let dir = repo().join("target/criu");
        if !dir.join("versions").is_file() {
            return skip(
                name,
                format!(
                    "no fetched CRIU ({} is missing; run scripts/fetch-criu.sh)",
                    dir.join("versions").display()
                ),
            );
        }
    }
    let s = setup()?;
    let tarballs = if dist {
        let t = dist_tarballs(&s.target);
        if t.is_empty() {
            return skip_unless(
                name,
                format!(
                    "no release tarball criu-cuda-plugin-{}-*.tar.gz in {} (run scripts/dist.sh)",
                    env!("CARGO_PKG_VERSION"),
                    s.target.join("dist").display()
                ),
                criu_cuda_env::REQUIRE_DIST,
            );
        }
        t
    } else {
        Vec::new()
    };
    let label = name.to_owned();
    let mut run = BlockRun::new(s, block, profile, installed, tarballs, criu, label)?;
    let result = run.prepare().and_then(|()| run.execute()).and_then(|o| {
        ensure!(
            o.rc == Some(0),
            "the block failed (exit status {:?})\n{}",
            o.rc,
            run.report(o.rc)
        );
        let what = match profile {
            Profile::Released | Profile::Upstream if dist => check_cuda_tree(&run)
                .and_then(|w| Ok(format!("{w}; {}", check_dist_installed(&run)?))),
            Profile::Released | Profile::Upstream => check_cuda_tree(&run),
            Profile::MockWorld => check_mock_world(&run),
            Profile::FetchedCriu => check_fetched_criu(&run),
        };
        what.map(|w| (w, o.seconds))
            .map_err(|e| format!("{e}\n{}", run.report(o.rc)))
    });
    let cleaned = run.cleanup();
    let keep = result.is_err() || std::env::var("DOCS_CHECK_KEEP").is_ok_and(|v| v == "1");
    if keep {
        if let Some(d) = run.dir.take() {
            eprintln!("    {name}: kept {}", d.keep().display());
        }
    }
    let (what, secs) = result.map_err(|e| format!("{name}: {e}"))?;
    cleaned.map_err(|e| format!("{name}: after the block: {e}"))?;
    println!("    {name}: ok in {secs:.1} s: {what}");
    Ok(Completion::Completed)
}

/// The checker's own parsing, on made-up Markdown and shell.
fn self_check() -> R {
    let md = "x\n```\nuntagged\n```\n\n```sh\nno marker\n```\n<!-- docs-check: run nowhere -->\n```sh\ny\n```\n<!-- docs-check: manual -->\n```sh\nz\n```\n<!-- docs-check: ci -->\n```toml\na = 1\n```\n<!-- docs-check: run upstream installed -->\n\n```sh\nok\n```\n<!-- docs-check: ci -->\n";
    let mut errors = Vec::new();
    let blocks = parse_markdown("t.md", md, &mut errors);
    let want = [
        "t.md:2: fenced code block without an info string",
        "t.md:6: sh block without a docs-check marker",
        "t.md:9: bad docs-check marker: unknown run profile `nowhere`",
        "t.md:13: bad docs-check marker: `manual` needs a reason",
        "t.md:17: docs-check marker before a `toml` block",
        "t.md:26: docs-check marker not followed by an sh block",
    ];
    ensure!(
        errors.len() == want.len() && errors.iter().zip(want).all(|(e, w)| e.starts_with(w)),
        "parse errors {errors:#?}, expected {want:#?}"
    );
    ensure!(
        blocks.len() == 6
            && blocks[5].check
                == Some(Check::Run {
                    profile: Profile::Upstream,
                    installed: true,
                    dist: false,
                })
            && blocks[5].line == 23
            && blocks[5].text == "ok\n",
        "blocks {blocks:#?}"
    );
    let md = "<!-- docs-check: manual takes about 20 minutes -->\n```sh\nsudo scripts/bench.sh 3   # x\nA=1 B=2 scripts/bench.sh\n```\n<!-- docs-check: manual slow -->\n```sh\ncargo build\n```\n";
    let blocks = parse_markdown("m.md", md, &mut errors);
    ensure!(
        errors.len() == want.len()
            && blocks[0].check == Some(Check::Manual("takes about 20 minutes".into()))
            && check_manual(&blocks[0]).is_ok()
            && check_manual(&blocks[1]).is_err(),
        "manual blocks: {blocks:#?} {errors:#?}"
    );
    ensure!(
        parse_marker("<!-- docs-check: run released dist -->")
            == Ok(Check::Run {
                profile: Profile::Released,
                installed: false,
                dist: true,
            })
            && parse_marker("<!-- docs-check: run mock-world dist -->").is_err()
            && parse_marker("<!-- docs-check: run released installed dist -->").is_err(),
        "`dist` markers"
    );
    let sh = "export CRIU_PLUGIN_OPTIONS=\"cuda_plugin.backend=cuda-checkpoint cuda_plugin.timeout=30\"\n\
              criu dump -t \"$PID\" -D /tmp/img # --plugin-option cuda_plugin.x=1\n\
              CRIU_PLUGIN_OPTIONS='cuda_plugin.backend=driver-api' target/criu/4.1.1/criu restore -d; echo\n\
              cat >/tmp/x <<'EOF'\ncriu dump --plugin-option cuda_plugin.backend=nope\nEOF\n\
              criu restore -D /tmp/img \\\n    --plugin-option cuda_plugin.device-map=GPU-1=GPU-2 --plugin-option=cuda_plugin.timeout=0\n\
              x=$(cuda-checkpoint --get-state) && target/debug/cuda-checkpoint --help | cat\n";
    let calls = criu_calls(sh);
    let got: Vec<String> = calls
        .iter()
        .map(|c| format!("{} {:?}", c.verb, c.options))
        .collect();
    let want = [
        r#"dump {"backend": "cuda-checkpoint", "timeout": "30"}"#,
        r#"restore {"backend": "driver-api"}"#,
        r#"restore {"backend": "cuda-checkpoint", "device-map": "GPU-1=GPU-2", "timeout": "0"}"#,
    ];
    ensure!(got == want, "criu calls {got:#?}, expected {want:#?}");
    ensure!(
        cuda_checkpoint_commands(sh) == 1,
        "cuda-checkpoint commands: {} (the one in $(…) is not counted)",
        cuda_checkpoint_commands(sh)
    );
    let gpus = world_gpus();
    ensure!(
        resolve_gpu("gpu-1D2E", &gpus).as_deref() == Ok(gpus[1].as_str())
            && resolve_gpu("0", &gpus).as_deref() == Ok(gpus[0].as_str())
            && resolve_gpu("GPU-", &gpus).is_err(),
        "GPU resolution"
    );
    ensure!(
        strip_comment("echo '#x' \"a#b\" # c") == "echo '#x' \"a#b\" ",
        "comments"
    );
    Ok(())
}

fn trials() -> Vec<Trial> {
    let (blocks, errors) = parse_docs();
    let mut out = Vec::new();
    let count = blocks.len();
    let sh = blocks.iter().filter(|b| b.lang == "sh").count();
    out.push(Trial::test("self-check", || {
        self_check()?;
        Ok(())
    }));
    out.push(Trial::test("markers", move || {
        if errors.is_empty() {
            println!(
                "    markers: {count} fenced blocks, {sh} sh blocks, every one tagged and marked"
            );
            Ok(())
        } else {
            Err(format!(
                "{} problem(s) with the docs' code blocks:\n  {}",
                errors.len(),
                errors.join("\n  ")
            )
            .into())
        }
    }));
    out.extend(messages::trials());
    out.extend(links::trials(doc_files()));
    // The format's reference: its examples must be scenarios the runner accepts.
    for b in blocks
        .iter()
        .filter(|b| b.file == SCENARIOS_DOC && b.lang == "toml")
    {
        let name = format!("{}:scenario", b.at());
        let (at, text) = (b.at(), b.text.clone());
        out.push(Trial::test(name.clone(), move || {
            let all = harness::scenario::Scenario::parse_variants(&at, &text)
                .map_err(|e| e.to_string())?;
            let steps: usize = all.iter().map(|(_, s)| s.steps.len()).sum();
            println!(
                "    {name}: ok: parses ({} variant(s), {steps} step(s))",
                all.len()
            );
            Ok(())
        }));
    }
    for b in blocks {
        let Some(check) = b.check.clone() else {
            continue;
        };
        match check {
            Check::Ci => {
                let name = format!("{}:ci", b.at());
                out.push(Trial::test(name.clone(), move || {
                    let what = check_ci(&b)?;
                    println!("    {name}: ok: {what}");
                    Ok(())
                }));
            }
            Check::Kit => {
                let name = format!("{}:kit", b.at());
                out.push(Trial::ignorable_test(name.clone(), move || {
                    check_kit(&name, &b)
                }));
            }
            Check::Manual(reason) => {
                let name = format!("{}:manual", b.at());
                out.push(Trial::ignorable_test(name.clone(), move || {
                    check_manual(&b)?;
                    println!("MANUAL {name} (not run): {reason}");
                    Ok(Completion::ignored_with(format!("manual: {reason}")))
                }));
            }
            Check::Run {
                profile,
                installed,
                dist,
            } => {
                let series: Vec<Option<&'static str>> = if profile == Profile::Released {
                    vec![Some("4.1"), Some("4.2")]
                } else {
                    vec![None]
                };
                for v in series {
                    let name = match v {
                        Some(v) => format!("{}:{}:criu-{v}", b.at(), profile.name()),
                        None => format!("{}:{}", b.at(), profile.name()),
                    };
                    let b = b.clone();
                    out.push(Trial::ignorable_test(name.clone(), move || {
                        run_block(&name, &b, profile, installed, dist, v)
                    }));
                }
            }
        }
    }
    out
}

fn main() {
    let mut args = Arguments::from_args();
    // One at a time: a restore needs its old pid free, and the blocks share /usr/lib/criu.
    args.test_threads = Some(1);
    runner::become_subreaper();
    libtest_mimic::run(&args, trials()).exit();
}
