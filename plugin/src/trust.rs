//! What the plugin may trust: the files it reads for configuration and the programs it runs,
//! by the rule of sshd's `StrictModes`.
//!
//! CRIU runs as root, so a file the plugin reads for its options (`cuda_plugin.conf`, which can
//! name the program the plugin runs) or a program it runs (`cuda-checkpoint`) that anybody but
//! root can change would hand that somebody root. The rule, for the file (or program) and for
//! every directory on its path up to `/` (the path as given, and the path with its symbolic
//! links resolved):
//!
//! - **owned by root**, or, when the plugin runs as another user (`criu --unprivileged`), by that
//!   user or root;
//! - **not writable by group or others**. A directory that is writable by them but sticky (like
//!   `/tmp`, mode 1777) passes: others cannot remove or replace what they do not own in it.
//!
//! There is no switch that turns the rule off: a node whose files break it is misconfigured,
//! and the error says which file, who owns it, its mode and the command that fixes it.

use std::fmt;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// What the checked file is for (it names the file in errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The plugin's options file.
    Config,
    /// A program the plugin runs.
    Program,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Config => "options file",
            Role::Program => "program",
        })
    }
}

/// What was found on a path: the owner and the mode bits of one file or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub uid: u32,
    /// `st_mode` (type and permission bits).
    pub mode: u32,
    pub is_dir: bool,
}

/// Why a path is not trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Owned by a user other than root (or the unprivileged CRIU's own user).
    Owner,
    /// Writable by its group.
    GroupWritable,
    /// Writable by others.
    WorldWritable,
}

/// A path that breaks the rule, or that could not be checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    #[error(
        "{role} {} is not trusted: {} {} is {}; {}",
        .file.display(),
        if .at == .file { "the file" } else { "its directory" },
        .at.display(),
        describe(*.fault, *.stat, *.euid),
        fix(*.fault, .at, *.euid)
    )]
    Untrusted {
        role: Role,
        /// The file the plugin wanted to read or run.
        file: PathBuf,
        /// The path at fault: the file itself or one of its directories.
        at: PathBuf,
        fault: Fault,
        stat: Stat,
        /// The user the plugin runs as.
        euid: u32,
    },
    #[error("{role} {}: cannot check who may change it: {what} {}: {reason}", .file.display(), .at.display())]
    Unreadable {
        role: Role,
        file: PathBuf,
        at: PathBuf,
        what: &'static str,
        /// The system's error.
        reason: String,
        kind: io::ErrorKind,
    },
}

fn describe(fault: Fault, stat: Stat, euid: u32) -> String {
    let mode = stat.mode & 0o7777;
    match fault {
        Fault::Owner if euid == 0 => format!("owned by uid {} (mode {mode:04o}), not root", stat.uid),
        Fault::Owner => format!(
            "owned by uid {} (mode {mode:04o}), neither root nor the user CRIU runs as (uid {euid})",
            stat.uid
        ),
        Fault::GroupWritable => format!("writable by its group (mode {mode:04o}, owner uid {})", stat.uid),
        Fault::WorldWritable => format!("writable by everyone (mode {mode:04o}, owner uid {})", stat.uid),
    }
}

fn fix(fault: Fault, at: &Path, euid: u32) -> String {
    format!("fix: {}", fix_command(fault, at, euid))
}

fn fix_command(fault: Fault, at: &Path, euid: u32) -> String {
    match fault {
        Fault::Owner if euid == 0 => format!("chown root {}", at.display()),
        Fault::Owner => format!("chown {euid} {} (or root)", at.display()),
        Fault::GroupWritable | Fault::WorldWritable => format!("chmod go-w {}", at.display()),
    }
}

impl TrustError {
    /// The command that fixes an untrusted path, as the error's message ends with it
    /// (`chmod go-w /etc/criu`); `None` for a path that could not be checked.
    #[must_use]
    pub fn fix_command(&self) -> Option<String> {
        match self {
            TrustError::Untrusted {
                fault, at, euid, ..
            } => Some(fix_command(*fault, at, *euid)),
            TrustError::Unreadable { .. } => None,
        }
    }
}

/// The rule for one file or directory.
#[must_use]
pub fn judge(stat: Stat, euid: u32) -> Option<Fault> {
    if stat.uid != 0 && stat.uid != euid {
        return Some(Fault::Owner);
    }
    let sticky = stat.is_dir && stat.mode & 0o1000 != 0;
    if stat.mode & 0o002 != 0 && !sticky {
        return Some(Fault::WorldWritable);
    }
    if stat.mode & 0o020 != 0 && !sticky {
        return Some(Fault::GroupWritable);
    }
    None
}

/// The directories above `path` (an absolute path), nearest first, up to `/`.
fn ancestors(path: &Path) -> impl Iterator<Item = &Path> {
    path.ancestors().skip(1)
}

/// Makes `path` absolute against `cwd` and drops `.` components (`..` is kept: it is resolved
/// by the filesystem, and the resolved path is checked as well).
fn absolute(path: &Path, cwd: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    };
    joined
        .components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect()
}

/// Checks `file` for `role` with `stat` (following symbolic links) and `resolve` (the path
/// with every symbolic link resolved): the file, its directories as given and its directories
/// resolved. The seam for tests; [`check`] uses the real filesystem.
pub fn check_with(
    file: &Path,
    role: Role,
    euid: u32,
    cwd: &Path,
    stat: &dyn Fn(&Path) -> io::Result<Stat>,
    resolve: &dyn Fn(&Path) -> io::Result<PathBuf>,
) -> Result<(), TrustError> {
    let given = absolute(file, cwd);
    let unreadable = |at: &Path, what, e: io::Error| TrustError::Unreadable {
        role,
        file: file.to_path_buf(),
        at: at.to_path_buf(),
        what,
        reason: e.to_string(),
        kind: e.kind(),
    };
    let real = resolve(&given).map_err(|e| unreadable(&given, "resolve", e))?;
    let mut paths: Vec<&Path> = vec![&real];
    paths.extend(ancestors(&real));
    paths.extend(ancestors(&given));
    let mut seen = std::collections::HashSet::new();
    for at in paths {
        if !seen.insert(at) {
            continue;
        }
        let s = stat(at).map_err(|e| unreadable(at, "stat", e))?;
        if let Some(fault) = judge(s, euid) {
            return Err(TrustError::Untrusted {
                role,
                file: file.to_path_buf(),
                at: at.to_path_buf(),
                fault,
                stat: s,
                euid,
            });
        }
    }
    Ok(())
}

fn real_stat(p: &Path) -> io::Result<Stat> {
    let m = std::fs::metadata(p)?;
    Ok(Stat {
        uid: m.uid(),
        mode: m.mode(),
        is_dir: m.is_dir(),
    })
}

/// Checks `file` on the real filesystem for the plugin's effective user.
pub fn check(file: &Path, role: Role) -> Result<(), TrustError> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    check_with(file, role, crate::ffi::euid(), &cwd, &real_stat, &|p| {
        std::fs::canonicalize(p)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A filesystem of owners and modes; `links` maps a path to what it resolves to.
    struct Fs {
        nodes: HashMap<PathBuf, Stat>,
        links: HashMap<PathBuf, PathBuf>,
    }

    fn dir(uid: u32, mode: u32) -> Stat {
        Stat {
            uid,
            mode: 0o040_000 | mode,
            is_dir: true,
        }
    }

    fn file(uid: u32, mode: u32) -> Stat {
        Stat {
            uid,
            mode: 0o100_000 | mode,
            is_dir: false,
        }
    }

    /// The node layout of docs/operators.md and docs/options.md: root-owned, 0755 directories, 0644 options file, 0755 programs,
    /// `/tmp` 1777.
    fn node() -> Fs {
        let mut nodes = HashMap::new();
        for d in [
            "/",
            "/etc",
            "/etc/criu",
            "/usr",
            "/usr/bin",
            "/usr/local",
            "/usr/local/bin",
            "/usr/lib",
            "/usr/lib/criu",
            "/home",
            "/opt",
            "/opt/criu",
        ] {
            nodes.insert(PathBuf::from(d), dir(0, 0o755));
        }
        nodes.insert("/tmp".into(), dir(0, 0o1777));
        nodes.insert("/etc/criu/cuda_plugin.conf".into(), file(0, 0o644));
        nodes.insert("/usr/lib/criu/cuda_plugin.conf".into(), file(0, 0o600));
        nodes.insert("/usr/local/bin/cuda-checkpoint".into(), file(0, 0o755));
        nodes.insert("/usr/bin/cuda-checkpoint".into(), file(0, 0o755));
        Fs {
            nodes,
            links: HashMap::new(),
        }
    }

    impl Fs {
        /// What realpath would say: `..` and links resolved, component by component.
        fn resolve(&self, p: &Path) -> io::Result<PathBuf> {
            let mut out = PathBuf::from("/");
            for c in p.components().skip(1) {
                if c == Component::ParentDir {
                    out.pop();
                    continue;
                }
                out.push(c);
                while let Some(t) = self.links.get(&out) {
                    out = t.clone();
                }
            }
            if self.nodes.contains_key(&out) {
                Ok(out)
            } else {
                Err(io::Error::from(io::ErrorKind::NotFound))
            }
        }

        fn check(&self, file: &str, euid: u32) -> Result<(), TrustError> {
            check_with(
                Path::new(file),
                Role::Config,
                euid,
                Path::new("/etc"),
                &|p| Ok(self.nodes[&self.resolve(p)?]),
                &|p| self.resolve(p),
            )
        }

        fn set(&mut self, p: &str, s: Stat) -> &mut Self {
            self.nodes.insert(p.into(), s);
            self
        }
    }

    fn fault_at(r: Result<(), TrustError>) -> (Fault, PathBuf) {
        match r {
            Err(TrustError::Untrusted { fault, at, .. }) => (fault, at),
            other => panic!("expected an untrusted path, got {other:?}"),
        }
    }

    #[test]
    fn the_readme_node_layout_is_trusted() {
        let fs = node();
        for f in [
            "/etc/criu/cuda_plugin.conf",
            "/usr/lib/criu/cuda_plugin.conf",
            "/usr/local/bin/cuda-checkpoint",
            "criu/cuda_plugin.conf",
            "./criu/../criu/cuda_plugin.conf",
        ] {
            fs.check(f, 0).unwrap();
        }
    }

    #[test]
    fn a_file_owned_by_another_user_is_refused() {
        let mut fs = node();
        fs.set("/etc/criu/cuda_plugin.conf", file(1000, 0o644));
        let err = fs.check("/etc/criu/cuda_plugin.conf", 0).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("/etc/criu/cuda_plugin.conf")
                && msg.contains("uid 1000")
                && msg.contains("0644")
                && msg.contains("chown root /etc/criu/cuda_plugin.conf"),
            "{msg}"
        );
        assert_eq!(fault_at(Err(err)).0, Fault::Owner);
    }

    #[test]
    fn group_and_world_writable_files_are_refused() {
        for (mode, want, word) in [
            (0o664, Fault::GroupWritable, "group"),
            (0o646, Fault::WorldWritable, "everyone"),
            (0o666, Fault::WorldWritable, "everyone"),
            // Sticky means nothing on a file.
            (0o1666, Fault::WorldWritable, "everyone"),
        ] {
            let mut fs = node();
            fs.set("/usr/local/bin/cuda-checkpoint", file(0, mode));
            let err = fs.check("/usr/local/bin/cuda-checkpoint", 0).unwrap_err();
            assert!(err.to_string().contains(word), "{err}");
            assert!(
                err.to_string()
                    .contains("chmod go-w /usr/local/bin/cuda-checkpoint"),
                "{err}"
            );
            assert_eq!(
                fault_at(Err(err)),
                (want, "/usr/local/bin/cuda-checkpoint".into())
            );
        }
    }

    #[test]
    fn a_writable_directory_on_the_path_is_refused_up_to_the_root() {
        for (d, mode, uid, want) in [
            ("/etc/criu", 0o777, 0, Fault::WorldWritable),
            ("/etc/criu", 0o775, 0, Fault::GroupWritable),
            ("/etc", 0o757, 0, Fault::WorldWritable),
            ("/", 0o777, 0, Fault::WorldWritable),
            ("/etc/criu", 0o755, 1000, Fault::Owner),
        ] {
            let mut fs = node();
            fs.set(d, dir(uid, mode));
            let err = fs.check("/etc/criu/cuda_plugin.conf", 0).unwrap_err();
            assert!(err.to_string().contains("its directory"), "{err}");
            assert_eq!(fault_at(Err(err)), (want, PathBuf::from(d)));
        }
    }

    #[test]
    fn a_sticky_directory_is_fine_but_not_what_is_in_it() {
        let mut fs = node();
        fs.set("/tmp/cuda_plugin.conf", file(0, 0o644));
        fs.check("/tmp/cuda_plugin.conf", 0).unwrap();
        fs.set("/tmp/cuda_plugin.conf", file(1000, 0o644));
        assert_eq!(
            fault_at(fs.check("/tmp/cuda_plugin.conf", 0)).0,
            Fault::Owner
        );
        // A user's directory under /tmp: its own owner is at fault.
        fs.set("/tmp/u", dir(1000, 0o755))
            .set("/tmp/u/cuda_plugin.conf", file(0, 0o644));
        assert_eq!(
            fault_at(fs.check("/tmp/u/cuda_plugin.conf", 0)),
            (Fault::Owner, "/tmp/u".into())
        );
    }

    #[test]
    fn symbolic_links_are_checked_on_both_sides() {
        // /etc/criu/cuda_plugin.conf -> /home/u/c.conf: the target's directory is the user's.
        let mut fs = node();
        fs.set("/home/u", dir(1000, 0o755))
            .set("/home/u/c.conf", file(0, 0o644));
        fs.nodes.remove(Path::new("/etc/criu/cuda_plugin.conf"));
        fs.links
            .insert("/etc/criu/cuda_plugin.conf".into(), "/home/u/c.conf".into());
        assert_eq!(
            fault_at(fs.check("/etc/criu/cuda_plugin.conf", 0)),
            (Fault::Owner, "/home/u".into())
        );
        // A trusted target through a link in a world-writable directory (not sticky).
        let mut fs = node();
        fs.set("/opt/w", dir(0, 0o777));
        fs.links.insert(
            "/opt/w/cuda-checkpoint".into(),
            "/usr/bin/cuda-checkpoint".into(),
        );
        assert_eq!(
            fault_at(fs.check("/opt/w/cuda-checkpoint", 0)),
            (Fault::WorldWritable, "/opt/w".into())
        );
    }

    #[test]
    fn an_unprivileged_criu_trusts_its_own_user_and_root() {
        let mut fs = node();
        fs.set("/home/u", dir(1000, 0o700))
            .set("/home/u/cuda_plugin.conf", file(1000, 0o600));
        fs.check("/home/u/cuda_plugin.conf", 1000).unwrap();
        fs.check("/etc/criu/cuda_plugin.conf", 1000).unwrap();
        let err = fs.check("/home/u/cuda_plugin.conf", 1001).unwrap_err();
        assert!(err.to_string().contains("uid 1001"), "{err}");
        // Root trusts nobody else, not even the file's own user.
        assert_eq!(
            fault_at(fs.check("/home/u/cuda_plugin.conf", 0)).0,
            Fault::Owner
        );
        fs.set("/home/u/cuda_plugin.conf", file(1000, 0o660));
        assert_eq!(
            fault_at(fs.check("/home/u/cuda_plugin.conf", 1000)).0,
            Fault::GroupWritable
        );
    }

    #[test]
    fn a_path_that_cannot_be_checked_names_it() {
        let fs = node();
        let err = fs.check("/etc/criu/nope.conf", 0).unwrap_err();
        assert!(
            matches!(
                &err,
                TrustError::Unreadable {
                    what: "resolve",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("/etc/criu/nope.conf"), "{err}");
    }

    #[test]
    fn the_real_filesystem_trusts_roots_own_files() {
        // /, /etc and /etc/passwd are root's and not writable by others on every machine this
        // runs on; root and any other user trust them.
        check(Path::new("/etc/passwd"), Role::Config).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.conf");
        std::fs::write(&p, "backend=auto\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        let err = check(&p, Role::Config).unwrap_err();
        assert!(
            matches!(
                err,
                TrustError::Untrusted {
                    fault: Fault::WorldWritable,
                    ..
                }
            ),
            "{err}"
        );
    }
}
