//! The plugin's own options file, `cuda_plugin.conf`: the node's settings where nobody can set
//! CRIU's environment (runc started by containerd or CRI-O on a Kubernetes node).
//!
//! # Where it is looked for
//!
//! The first of these that names an existing file is read; only one file is ever read:
//!
//! 1. the path in the environment variable `CRIU_CUDA_PLUGIN_CONFIG` ([`ENV_CONFIG`]; an empty
//!    value counts as unset). A file named there must exist: a missing one is an error, so that a
//!    typo does not silently fall back to the defaults;
//! 2. `cuda_plugin.conf` in the directory of the loaded plugin `.so`, as CRIU loaded it (its
//!    plugin directory, `--libdir`; a symbolic link is not followed to its target's directory);
//! 3. `/etc/criu/cuda_plugin.conf` ([`SYSTEM_PATH`]).
//!
//! A file missing at 2. or 3. is not an error. [`Lookup`] holds the three places, so tests (and
//! any caller) can point them anywhere.
//!
//! # Format
//!
//! One option per line, `NAME=VALUE`, with the names and values of `CRIU_PLUGIN_OPTIONS` (see
//! [`crate::options`]): `backend=driver-api`, or with the namespace, `cuda_plugin.backend=...`
//! (a leading `--` is accepted too). Spaces around the name and the value are ignored, and a value
//! may contain spaces (a path). Blank lines and lines whose first non-blank character is `#` are
//! skipped; a `#` elsewhere is part of the value. A repeated option: the last one wins.
//!
//! # Trust
//!
//! The file found is read only if nobody but root (under `criu --unprivileged`: root or CRIU's
//! own user) can change it or any directory on its path ([`crate::trust`]); otherwise `init`
//! fails, naming the file, its owner, its mode and the fix. There is no switch that turns this
//! off.
//!
//! An unreadable file, a line that is not valid UTF-8, an unknown name, a name of another
//! plugin's namespace, a missing `=VALUE` or an invalid value fails the plugin's `init` with an
//! error naming the file and the line. How the file's options combine with those of a CRIU run is
//! [`crate::options::collect`]'s business.

use crate::options::{self, OptionError, NAMESPACE};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The environment variable naming the options file.
pub const ENV_CONFIG: &str = criu_cuda_env::PLUGIN_CONFIG;

/// The file's name next to the plugin.
pub const FILE_NAME: &str = "cuda_plugin.conf";

/// The system-wide file.
pub const SYSTEM_PATH: &str = "/etc/criu/cuda_plugin.conf";

/// The largest file read (an options file has a handful of lines).
pub const MAX_BYTES: u64 = 64 * 1024;

/// Which of the three places the file was found at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Named by [`ENV_CONFIG`].
    Environment,
    /// Next to the plugin's `.so`.
    BesidePlugin,
    /// [`SYSTEM_PATH`].
    System,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Environment => ENV_CONFIG,
            Origin::BesidePlugin => "next to the plugin",
            Origin::System => "system-wide",
        })
    }
}

/// The three places, in lookup order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The value of [`ENV_CONFIG`] (`None` when unset or empty).
    pub explicit: Option<PathBuf>,
    /// The directory holding the loaded plugin (`None` when it cannot be found out).
    pub plugin_dir: Option<PathBuf>,
    /// Normally [`SYSTEM_PATH`].
    pub system: PathBuf,
}

/// A file that was read and is valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFile {
    pub path: PathBuf,
    pub origin: Origin,
    /// Its options as `cuda_plugin.NAME=VALUE` strings, in file order (each one valid).
    pub options: Vec<String>,
}

impl ConfigFile {
    /// What [`options::collect`] takes of it.
    #[must_use]
    pub fn as_options(&self) -> options::FileOptions<'_> {
        options::FileOptions {
            path: &self.path,
            options: &self.options,
        }
    }
}

/// What is wrong with one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("not valid UTF-8")]
    NotUtf8,
    #[error(
        "{} is not an option of {NAMESPACE} (this file holds only {NAMESPACE}'s options, as \
         NAME=VALUE)",
        crate::message::quote(name)
    )]
    Foreign { name: String },
    #[error(transparent)]
    Option(#[from] OptionError),
}

/// Why the options file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("options file {} named by {ENV_CONFIG} does not exist", path.display())]
    Missing { path: PathBuf },
    #[error("cannot read options file {}: {reason}", path.display())]
    Unreadable { path: PathBuf, reason: String },
    #[error("options file {} is not a regular file", path.display())]
    NotAFile { path: PathBuf },
    #[error("options file {} is larger than {MAX_BYTES} bytes", path.display())]
    TooLarge { path: PathBuf },
    #[error("options file {}, line {line}: {error}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        error: LineError,
    },
    /// Somebody other than root (or the unprivileged CRIU's user) can change it
    /// ([`crate::trust`]).
    #[error(transparent)]
    Untrusted(#[from] crate::trust::TrustError),
}

impl Lookup {
    /// The places from [`ENV_CONFIG`]'s value and the plugin's path (the `.so` file).
    #[must_use]
    pub fn new(explicit: Option<&std::ffi::OsStr>, plugin_so: Option<&Path>) -> Self {
        Lookup {
            explicit: explicit.filter(|v| !v.is_empty()).map(PathBuf::from),
            plugin_dir: plugin_so
                .and_then(Path::parent)
                .filter(|d| !d.as_os_str().is_empty())
                .map(Path::to_path_buf),
            system: PathBuf::from(SYSTEM_PATH),
        }
    }

    /// The candidates, in order.
    #[must_use]
    pub fn candidates(&self) -> Vec<(PathBuf, Origin)> {
        let mut out = Vec::new();
        if let Some(p) = &self.explicit {
            out.push((p.clone(), Origin::Environment));
        }
        if let Some(d) = &self.plugin_dir {
            out.push((d.join(FILE_NAME), Origin::BesidePlugin));
        }
        out.push((self.system.clone(), Origin::System));
        out
    }

    /// Finds, reads and checks the file; `Ok(None)` when there is none.
    pub fn load(&self) -> Result<Option<ConfigFile>, ConfigError> {
        for (path, origin) in self.candidates() {
            match std::fs::metadata(&path) {
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                    ) =>
                {
                    if origin == Origin::Environment {
                        return Err(ConfigError::Missing { path });
                    }
                }
                Err(e) => {
                    return Err(ConfigError::Unreadable {
                        path,
                        reason: e.to_string(),
                    })
                }
                Ok(m) if !m.is_file() => return Err(ConfigError::NotAFile { path }),
                Ok(_) => {
                    crate::trust::check(&path, crate::trust::Role::Config)?;
                    return read(path, origin).map(Some);
                }
            }
        }
        Ok(None)
    }
}

fn read(path: PathBuf, origin: Origin) -> Result<ConfigFile, ConfigError> {
    let unreadable = |path: &Path, e: std::io::Error| ConfigError::Unreadable {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let f = std::fs::File::open(&path).map_err(|e| unreadable(&path, e))?;
    let mut bytes = Vec::new();
    f.take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(&path, e))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(ConfigError::TooLarge { path });
    }
    match parse(&bytes) {
        Ok(options) => Ok(ConfigFile {
            path,
            origin,
            options,
        }),
        Err((line, error)) => Err(ConfigError::Line { path, line, error }),
    }
}

/// Parses a file's bytes into `cuda_plugin.NAME=VALUE` strings, each checked with
/// [`options::parse`]; the error carries the 1-based line number.
pub fn parse(bytes: &[u8]) -> Result<Vec<String>, (usize, LineError)> {
    let mut out = Vec::new();
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line_no = i + 1;
        let line = std::str::from_utf8(raw).map_err(|_| (line_no, LineError::NotUtf8))?;
        if let Some(opt) = parse_line(line).map_err(|e| (line_no, e))? {
            out.push(opt);
        }
    }
    Ok(out)
}

/// One line: `None` for a blank or comment line, else the option string.
fn parse_line(line: &str) -> Result<Option<String>, LineError> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let (name, value) = match line.split_once('=') {
        Some((n, v)) => (n.trim(), Some(v.trim())),
        None => (line, None),
    };
    let bare = name.strip_prefix("--").unwrap_or(name);
    let bare = bare
        .strip_prefix(NAMESPACE)
        .and_then(|r| r.strip_prefix('.'))
        .unwrap_or(bare);
    if bare.contains(['.', ' ', '\t']) {
        return Err(LineError::Foreign {
            name: name.to_owned(),
        });
    }
    let opt = match value {
        Some(v) => format!("{NAMESPACE}.{bare}={v}"),
        None => format!("{NAMESPACE}.{bare}"),
    };
    options::parse([opt.as_str()])?;
    Ok(Some(opt))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendKind;
    use crate::options::{BackendChoice, Options, RestoreFailure, TimeoutOption};
    use proptest::prelude::*;

    fn parsed(text: &str) -> Options {
        let strings = parse(text.as_bytes()).unwrap();
        options::parse(strings.iter().map(String::as_str)).unwrap()
    }

    #[test]
    fn comments_blank_lines_spaces_and_both_spellings() {
        let o = parsed(
            "# node settings\n\n  backend = cuda-checkpoint \r\n\
             \t# indented comment\n\
             cuda_plugin.timeout=30\n\
             --cuda_plugin.cuda-checkpoint=/opt/nvidia tools/cuda-checkpoint\n\
             on-restore-failure=leave",
        );
        assert_eq!(o.backend, BackendChoice::Only(BackendKind::CudaCheckpoint));
        assert_eq!(o.timeout, Some(TimeoutOption::Seconds(30)));
        assert_eq!(
            o.cuda_checkpoint.as_deref(),
            Some(Path::new("/opt/nvidia tools/cuda-checkpoint")),
            "a value may hold spaces"
        );
        assert_eq!(o.on_restore_failure, RestoreFailure::Leave);
        assert_eq!(parse(b"").unwrap(), Vec::<String>::new());
        assert_eq!(parse(b"\n# only\n\n").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn errors_carry_the_line_and_the_reason() {
        let (line, e) = parse(b"# c\nbackend=driver-api\n\nbackend=fast\n").unwrap_err();
        assert_eq!(line, 4);
        assert!(
            matches!(e, LineError::Option(OptionError::InvalidValue { ref name, .. }) if name == "backend"),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("auto, driver-api, cuda-checkpoint"),
            "{e}"
        );
        let (line, e) = parse(b"backend=auto\nbackedn=auto").unwrap_err();
        assert_eq!(
            (line, e),
            (
                2,
                LineError::Option(OptionError::Unknown {
                    name: "backedn".into()
                })
            )
        );
        let (line, e) = parse(b"timeout\n").unwrap_err();
        assert_eq!(line, 1);
        assert!(matches!(
            e,
            LineError::Option(OptionError::MissingValue { .. })
        ));
        let (line, e) = parse(b"amdgpu.x=1\n").unwrap_err();
        assert_eq!(line, 1);
        assert!(matches!(e, LineError::Foreign { .. }), "{e:?}");
        assert!(e.to_string().contains("amdgpu.x"), "{e}");
        let (line, e) = parse(b"backend=auto # fast\n").unwrap_err();
        assert_eq!(line, 1, "a trailing comment is part of the value: {e}");
        let (line, e) = parse(b"backend=auto\n\xff=1\n").unwrap_err();
        assert_eq!((line, e), (2, LineError::NotUtf8));
    }

    fn lookup(dir: &Path) -> Lookup {
        Lookup {
            explicit: None,
            plugin_dir: Some(dir.join("plugins")),
            system: dir.join("etc/cuda_plugin.conf"),
        }
    }

    fn write(p: &Path, text: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn lookup_order_and_missing_files() {
        let d = tempfile::tempdir().unwrap();
        let mut l = lookup(d.path());
        assert_eq!(l.load().unwrap(), None, "no file at all is not an error");
        let system = d.path().join("etc/cuda_plugin.conf");
        write(&system, "backend=driver-api\n");
        let f = l.load().unwrap().unwrap();
        assert_eq!(
            (f.path.as_path(), f.origin),
            (system.as_path(), Origin::System)
        );
        let beside = d.path().join("plugins").join(FILE_NAME);
        write(&beside, "backend=cuda-checkpoint\n");
        let f = l.load().unwrap().unwrap();
        assert_eq!(
            f.origin,
            Origin::BesidePlugin,
            "beside the plugin wins over /etc"
        );
        assert_eq!(f.options, vec!["cuda_plugin.backend=cuda-checkpoint"]);
        let named = d.path().join("named.conf");
        write(&named, "timeout=5\n");
        l.explicit = Some(named.clone());
        let f = l.load().unwrap().unwrap();
        assert_eq!((f.path, f.origin), (named, Origin::Environment));
        l.explicit = Some(d.path().join("typo.conf"));
        let e = l.load().unwrap_err();
        assert!(matches!(e, ConfigError::Missing { .. }), "{e:?}");
        assert!(e.to_string().contains("typo.conf") && e.to_string().contains(ENV_CONFIG));
    }

    #[test]
    fn bad_files_name_the_file() {
        let d = tempfile::tempdir().unwrap();
        let l = lookup(d.path());
        let beside = d.path().join("plugins").join(FILE_NAME);
        write(&beside, "backend=driver-api\nguardian=maybe\n");
        let e = l.load().unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains(&format!("{}, line 2:", beside.display())) && m.contains("on, off"),
            "{m}"
        );
        std::fs::remove_file(&beside).unwrap();
        std::fs::create_dir(&beside).unwrap();
        assert!(matches!(
            l.load().unwrap_err(),
            ConfigError::NotAFile { .. }
        ));
        std::fs::remove_dir(&beside).unwrap();
        write(&beside, &"# padding\n".repeat(7000));
        assert!(matches!(
            l.load().unwrap_err(),
            ConfigError::TooLarge { .. }
        ));
        std::fs::remove_file(&beside).unwrap();
        // Something that is not a directory on the way: no file there, the next place is read.
        let system = d.path().join("etc/cuda_plugin.conf");
        write(&system, "backend=auto\n");
        let odd = Lookup {
            plugin_dir: Some(system.clone()),
            ..l.clone()
        };
        assert_eq!(odd.load().unwrap().unwrap().origin, Origin::System);
        // A path the kernel refuses (ENAMETOOLONG): an error naming it, not "missing".
        let long = Lookup {
            explicit: Some(d.path().join("x".repeat(5000))),
            ..l.clone()
        };
        let e = long.load().unwrap_err();
        assert!(matches!(e, ConfigError::Unreadable { .. }), "{e:?}");
    }

    #[test]
    fn new_takes_the_plugins_directory() {
        let l = Lookup::new(
            Some(std::ffi::OsStr::new("")),
            Some(Path::new("/usr/lib/criu/cuda_plugin.so")),
        );
        assert_eq!(l.explicit, None, "an empty variable counts as unset");
        assert_eq!(l.plugin_dir.as_deref(), Some(Path::new("/usr/lib/criu")));
        assert_eq!(l.system, Path::new(SYSTEM_PATH));
        let l = Lookup::new(Some("/x.conf".as_ref()), Some(Path::new("cuda_plugin.so")));
        assert_eq!(
            l.plugin_dir, None,
            "a bare file name has no directory to look in"
        );
        assert_eq!(l.explicit.as_deref(), Some(Path::new("/x.conf")));
    }

    fn arb_options() -> impl Strategy<Value = Options> {
        crate::options::tests_support::arb_options()
    }

    /// One option string as a file line, in one of the accepted spellings.
    fn as_line(opt: &str, style: u8, pad: bool) -> String {
        let bare = opt.strip_prefix("cuda_plugin.").unwrap();
        let body = match style % 3 {
            0 => bare.to_owned(),
            1 => opt.to_owned(),
            _ => format!("--{opt}"),
        };
        let body = if pad {
            let (n, v) = body.split_once('=').unwrap();
            format!("  {n} =\t{v} ")
        } else {
            body
        };
        body
    }

    proptest! {
        #[test]
        fn rendered_options_parse_back(
            o in arb_options(),
            styles in proptest::collection::vec((any::<u8>(), any::<bool>(), 0u8..4), 8),
            crlf in any::<bool>(),
        ) {
            let mut text = String::new();
            let nl = if crlf { "\r\n" } else { "\n" };
            for (opt, (style, pad, filler)) in o.to_strings().iter().zip(styles.iter().cycle()) {
                match filler {
                    0 => text.push_str(&format!("# {opt}{nl}")),
                    1 => text.push_str(nl),
                    _ => {}
                }
                text.push_str(&as_line(opt, *style, *pad));
                text.push_str(nl);
            }
            prop_assert_eq!(parsed(&text), o);
        }

        #[test]
        fn parser_never_panics_and_errors_point_at_a_line(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Err((line, _)) = parse(&bytes) {
                let lines = bytes.split(|&b| b == b'\n').count();
                prop_assert!(line >= 1 && line <= lines, "line {} of {}", line, lines);
            }
        }

        #[test]
        fn one_bad_line_fails_the_file_at_that_line(
            o in arb_options(),
            at in 0usize..10,
            bad in prop_oneof![
                Just("backend=gpu".to_owned()),
                Just("nonsense=1".to_owned()),
                Just("timeout".to_owned()),
                Just("other.backend=auto".to_owned()),
                "[a-z]{1,8}\\.[a-z]{1,8}=[a-z]{0,4}",
            ],
        ) {
            let mut lines: Vec<String> = o.to_strings();
            let at = at.min(lines.len());
            lines.insert(at, bad);
            let text = lines.join("\n");
            let r = parse(text.as_bytes());
            prop_assert_eq!(r.map_err(|(l, _)| l), Err(at + 1));
        }
    }
}
