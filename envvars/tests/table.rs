//! `docs/environment.md` against [`criu_cuda_env::VARS`], and the repository against both:
//!
//! - the doc's table lists exactly the variables of `VARS`, in its order, with the same readers
//!   and text;
//! - every `CRIU_CUDA_*` name in the repository's Rust, shell, TOML and Markdown files (and
//!   `.ci/run`) is one of them (`CRIU_CUDA_CRIU_<series>` is built by
//!   [`criu_cuda_env::criu_wrapper`]; a prefix of declared names, such as `CRIU_CUDA_REQUIRE_`,
//!   may be named);
//! - no Rust file outside this crate spells a variable's name as a whole string literal: the
//!   constants are the one declaration.

use criu_cuda_env::VARS;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate is in the workspace")
        .to_path_buf()
}

/// The rows of the doc's table: `| `NAME` | readers | effect |`.
fn doc_rows() -> Vec<(String, String, String)> {
    let text =
        std::fs::read_to_string(repo().join("docs/environment.md")).expect("docs/environment.md");
    text.lines()
        .filter(|l| l.starts_with("| `CRIU_CUDA_"))
        .map(|l| {
            let cells: Vec<&str> = l.trim().trim_matches('|').split(" | ").collect();
            assert_eq!(cells.len(), 3, "a row of three cells: {l}");
            (
                cells[0].trim().trim_matches('`').to_owned(),
                cells[1].trim().to_owned(),
                cells[2].trim().to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_doc_table_is_vars() {
    let rows = doc_rows();
    let want: Vec<(String, String, String)> = VARS
        .iter()
        .map(|v| (v.name.to_owned(), v.read_by.to_owned(), v.effect.to_owned()))
        .collect();
    for (i, (got, want)) in rows.iter().zip(&want).enumerate() {
        assert_eq!(got, want, "row {} of docs/environment.md", i + 1);
    }
    assert_eq!(
        rows.len(),
        want.len(),
        "docs/environment.md has {} rows, criu_cuda_env::VARS {}",
        rows.len(),
        want.len()
    );
}

/// Files to scan: under the repository, without `target/`, `.git/` and fetched trees.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if p.is_dir() {
            if !matches!(name.as_ref(), "target" | ".git" | "fuzz") {
                files(&p, out);
            }
        } else if name.ends_with(".rs")
            || name.ends_with(".sh")
            || name.ends_with(".toml")
            || name.ends_with(".md")
            || (name == "run" && dir.file_name().is_some_and(|d| d == ".ci"))
        {
            out.push(p);
        }
    }
}

/// Each `CRIU_CUDA_[A-Z0-9_]*` token of `text`, with whether it stands alone as a string literal.
fn tokens(text: &str) -> Vec<(String, bool)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("CRIU_CUDA_") {
        let start = i + at;
        let mut end = start + "CRIU_CUDA_".len();
        while end < b.len()
            && (b[end].is_ascii_uppercase() || b[end].is_ascii_digit() || b[end] == b'_')
        {
            end += 1;
        }
        let literal = start > 0 && b[start - 1] == b'"' && end < b.len() && b[end] == b'"';
        out.push((text[start..end].to_owned(), literal));
        i = end;
    }
    out
}

#[test]
fn every_name_in_the_repository_is_declared_and_rust_uses_the_constants() {
    let root = repo();
    let mut all = Vec::new();
    files(&root, &mut all);
    let known: std::collections::BTreeSet<&str> = VARS.iter().map(|v| v.name).collect();
    let mut unknown = Vec::new();
    let mut literals = Vec::new();
    for p in &all {
        let Ok(text) = std::fs::read_to_string(p) else {
            continue;
        };
        let rel = p.strip_prefix(&root).unwrap_or(p).display().to_string();
        for (name, literal) in tokens(&text) {
            // A family named by its prefix (`CRIU_CUDA_REQUIRE_*`, the `CRIU_CUDA_CRIU_`
            // of the wrappers) is fine when declared names start with it.
            let ok = known.contains(name.as_str())
                || (name.ends_with('_') && known.iter().any(|k| k.starts_with(name.as_str())));
            if !ok {
                unknown.push(format!("{rel}: {name}"));
            }
            if literal && rel.ends_with(".rs") && !rel.starts_with("envvars/") {
                literals.push(format!("{rel}: \"{name}\""));
            }
        }
    }
    unknown.sort();
    unknown.dedup();
    assert!(
        unknown.is_empty(),
        "CRIU_CUDA_* names not declared in envvars/src/lib.rs (add them to VARS and to docs/environment.md):\n  {}",
        unknown.join("\n  ")
    );
    assert!(
        literals.is_empty(),
        "Rust files that spell a variable's name instead of using criu_cuda_env's constant:\n  {}",
        literals.join("\n  ")
    );
}
