//! Programs another user must run, where that user can reach them.
//!
//! A test that drops privileges (a workload and CRIU run as `nobody`) fails when the checkout
//! sits where that user cannot look, as a clone in root's home (`/root`, mode 0700) does: the
//! kernel refuses to execute a program behind a directory it may not search ("Permission
//! denied"). [`for_others`] gives such a test a copy it can reach: the files hard-linked (or
//! copied, across filesystems) into a directory of root's under the system's temporary
//! directory, mode 0755 on the way down, with their own modes kept. Hard links share the
//! original's owner and mode, so nothing of the checkout is handed away.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Where `path` (a file, or a directory with everything below it) can be reached by any user:
/// `path` itself when every directory above it is searchable by others, else a staged copy,
/// made once per test process and path. Symbolic links inside a staged directory are copied
/// as links (a relative one stays valid).
///
/// # Errors
/// The copy could not be made; the message names the file.
pub fn for_others(path: &Path) -> Result<PathBuf, String> {
    for_others_only(path, None)
}

/// [`for_others`] for a directory of which only the top-level entries `only` are needed (the
/// wrapper of a fetched CRIU and the libraries beside it, not its sources).
///
/// # Errors
/// As [`for_others`].
pub fn for_others_only(path: &Path, only: Option<&[&str]>) -> Result<PathBuf, String> {
    let path = path
        .canonicalize()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if reachable_by_others(&path) {
        return Ok(path);
    }
    static STAGED: OnceLock<Mutex<Vec<(PathBuf, PathBuf)>>> = OnceLock::new();
    let staged = STAGED.get_or_init(Mutex::default);
    let mut staged = staged
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, to)) = staged.iter().find(|(from, _)| *from == path) {
        return Ok(to.clone());
    }
    let root = stage_root()?;
    let to = root.join(format!("{}", staged.len())).join(
        path.file_name()
            .ok_or_else(|| format!("{}: no file name", path.display()))?,
    );
    let parent = to.parent().unwrap_or(&root).to_path_buf();
    make_dir(&parent)?;
    match only {
        None => copy_tree(&path, &to)?,
        Some(names) => {
            make_dir(&to)?;
            for n in names {
                let from = path.join(n);
                if from.exists() {
                    copy_tree(&from, &to.join(n))?;
                }
            }
        }
    }
    staged.push((path, to.clone()));
    Ok(to)
}

/// Whether every directory above `path` lets others search it (`o+x`).
fn reachable_by_others(path: &Path) -> bool {
    path.ancestors()
        .skip(1)
        .all(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
}

/// This process's staging directory: `<tmp>/criu-cuda-stage-<pid>`, mode 0755, removed and made
/// anew on first use.
fn stage_root() -> Result<PathBuf, String> {
    static ROOT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("criu-cuda-stage-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        make_dir(&root)?;
        Ok(root)
    })
    .clone()
}

fn make_dir(d: &Path) -> Result<(), String> {
    std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", d.display()))
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(from).map_err(|e| format!("{}: {e}", from.display()))?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = std::fs::read_link(from).map_err(|e| format!("{}: {e}", from.display()))?;
        return std::os::unix::fs::symlink(target, to)
            .map_err(|e| format!("{}: {e}", to.display()));
    }
    if ft.is_dir() {
        make_dir(to)?;
        let entries = std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
        for e in entries {
            let e = e.map_err(|e| format!("{}: {e}", from.display()))?;
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        }
        return Ok(());
    }
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to)
            .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_behind_a_closed_directory_is_staged_where_others_reach_it() {
        let dir = tempfile::tempdir().unwrap();
        let closed = dir.path().join("home");
        std::fs::create_dir(&closed).unwrap();
        let tree = closed.join("tool");
        std::fs::create_dir_all(tree.join("lib")).unwrap();
        std::fs::write(tree.join("run"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(tree.join("run"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(tree.join("lib/x.so"), "x").unwrap();
        std::os::unix::fs::symlink("x.so", tree.join("lib/x.so.1")).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let staged = for_others(&tree).unwrap();
        assert_ne!(staged, tree.canonicalize().unwrap());
        assert!(
            reachable_by_others(&staged.join("run")),
            "{}",
            staged.display()
        );
        let mode = std::fs::metadata(staged.join("run"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755, "the program keeps its mode");
        assert_eq!(
            std::fs::read_link(staged.join("lib/x.so.1")).unwrap(),
            Path::new("x.so")
        );
        assert_eq!(
            std::fs::read_to_string(staged.join("lib/x.so.1")).unwrap(),
            "x"
        );
        // Staged once per path.
        assert_eq!(for_others(&tree).unwrap(), staged);
        // A path others can reach is used as it is.
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o755)).unwrap();
        let open = dir.path().join("open");
        std::fs::write(&open, "y").unwrap();
        if reachable_by_others(&open.canonicalize().unwrap()) {
            assert_eq!(for_others(&open).unwrap(), open.canonicalize().unwrap());
        }
    }
}
