//! The relative links of `README.md` and `docs/*.md` (part of the `docs` test, trial `links`).
//!
//! Every Markdown link `[text](target)` outside code blocks and code spans whose target is not a
//! URL (`scheme:`) must resolve: its path, relative to the file that holds it, names a file or a
//! directory of the repository, and its `#anchor`, when given, is the anchor of a heading of
//! that Markdown file (or of the same file, for a bare `#anchor`), as GitHub makes them:
//! lower-cased, every character but letters, digits, spaces, `-` and `_` dropped, spaces turned
//! into `-`, and `-1`, `-2`, … appended to repeated ones.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use libtest_mimic::Trial;

fn repo() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    p.canonicalize().unwrap_or(p)
}

/// Whether `line` opens or closes a fenced code block (three or more backticks or tildes, at
/// most three spaces in).
fn is_fence(line: &str) -> bool {
    let t = line.trim_start();
    line.len() - t.len() <= 3 && (t.starts_with("```") || t.starts_with("~~~"))
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if is_fence(line) {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// `line` with its code spans blanked out.
fn without_code(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else if in_code {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// The targets of the inline links of one line (`[text](target)`, an optional title dropped).
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else {
            break;
        };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        if !target.is_empty() {
            out.push(target.to_owned());
        }
        rest = &after[end..];
    }
    out
}

/// GitHub's anchor of a heading's text.
pub fn slug(heading: &str) -> String {
    // Links keep their text; code spans their content.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of the headings of a Markdown text.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let t = line.trim_start();
        let hashes = t.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !t[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(t[hashes..].trim().trim_end_matches('#').trim());
        let mut a = base.clone();
        let mut n = 0;
        while seen.contains(&a) {
            n += 1;
            a = format!("{base}-{n}");
        }
        seen.insert(a);
    }
    seen
}

/// `base` joined with the relative `rel`, `..` and `.` resolved lexically.
fn join(base: &Path, rel: &str) -> PathBuf {
    let mut out = base.to_path_buf();
    for c in Path::new(rel).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The broken links of `files` (paths relative to `root`), each as `file:line: target: why`,
/// and how many links were checked.
fn broken(root: &Path, files: &[String]) -> (Vec<String>, usize) {
    let mut bad = Vec::new();
    let mut checked = 0;
    for f in files {
        let path = root.join(f);
        let Ok(text) = std::fs::read_to_string(&path) else {
            bad.push(format!("{f}: unreadable"));
            continue;
        };
        let dir = path.parent().unwrap_or(root).to_path_buf();
        for (line, l) in prose_lines(&text) {
            for target in link_targets(l) {
                let scheme = target
                    .split_once(':')
                    .is_some_and(|(s, _)| !s.is_empty() && !s.contains('/') && !s.contains('#'));
                if scheme {
                    continue;
                }
                checked += 1;
                let (p, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let dest = if p.is_empty() {
                    path.clone()
                } else {
                    join(&dir, p)
                };
                if !dest.starts_with(root) || !dest.exists() {
                    bad.push(format!(
                        "{f}:{line}: `{target}`: {} does not exist",
                        dest.display()
                    ));
                    continue;
                }
                let Some(anchor) = anchor else {
                    continue;
                };
                if dest.extension().and_then(|e| e.to_str()) != Some("md") {
                    bad.push(format!(
                        "{f}:{line}: `{target}`: an anchor into a file that is not Markdown"
                    ));
                    continue;
                }
                let known = anchors(&std::fs::read_to_string(&dest).unwrap_or_default());
                if !known.contains(anchor) {
                    bad.push(format!(
                        "{f}:{line}: `{target}`: no heading of {} has the anchor #{anchor}",
                        dest.strip_prefix(root).unwrap_or(&dest).display()
                    ));
                }
            }
        }
    }
    (bad, checked)
}

/// The checker on made-up Markdown.
fn self_check() -> Result<(), String> {
    let cases = [
        (
            "Parallel checkpoint and restore (`parallel=auto`)",
            "parallel-checkpoint-and-restore-parallelauto",
        ),
        ("The guardian's cost", "the-guardians-cost"),
        (
            "`parallel=1` or `parallel=auto`",
            "parallel1-or-parallelauto",
        ),
        ("See [the doc](x.md#y) here", "see-the-doc-here"),
        ("CRIU_LIBS_DIR and 4.1.x", "criu_libs_dir-and-41x"),
    ];
    for (h, want) in cases {
        let got = slug(h);
        if got != want {
            return Err(format!("slug({h:?}) = {got:?}, expected {want:?}"));
        }
    }
    let md = "# A\n## A\n```text\n# not a heading\n[x](nowhere.md)\n```\nsee [b](b.md#c \"t\") and `[c](d.md)`, <https://x>, [e](https://e.org/f)\n";
    let a = anchors(md);
    let want: BTreeSet<String> = ["a".to_owned(), "a-1".to_owned()].into();
    if a != want {
        return Err(format!("anchors {a:?}, expected {want:?}"));
    }
    let targets: Vec<String> = prose_lines(md)
        .into_iter()
        .flat_map(|(_, l)| link_targets(l))
        .collect();
    if targets != ["b.md#c", "https://e.org/f"] {
        return Err(format!("link targets {targets:?}"));
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = dir.path().canonicalize().map_err(|e| e.to_string())?;
    std::fs::create_dir_all(root.join("docs")).map_err(|e| e.to_string())?;
    std::fs::write(root.join("README.md"), "# Top\n[ok](docs/a.md#one) [bad](docs/a.md#two) [gone](docs/b.md) [self](#top) [up](../outside.md)\n").map_err(|e| e.to_string())?;
    std::fs::write(root.join("docs/a.md"), "## One\n[back](../README.md#top)\n")
        .map_err(|e| e.to_string())?;
    let (bad, n) = broken(&root, &["README.md".into(), "docs/a.md".into()]);
    let kinds: Vec<bool> = bad
        .iter()
        .map(|b| b.contains("#two") || b.contains("docs/b.md") || b.contains("outside.md"))
        .collect();
    if n != 6 || bad.len() != 3 || kinds.contains(&false) {
        return Err(format!("{n} links checked, broken: {bad:#?}"));
    }
    Ok(())
}

pub fn trials(files: Vec<String>) -> Vec<Trial> {
    vec![Trial::test("links", move || {
        self_check()?;
        let (bad, checked) = broken(&repo(), &files);
        if bad.is_empty() {
            println!(
                "    links: {checked} relative links in {} files, every one resolves",
                files.len()
            );
            Ok(())
        } else {
            Err(format!(
                "{} broken relative link(s):\n  {}",
                bad.len(),
                bad.join("\n  ")
            )
            .into())
        }
    })]
}
