//! Where the built programs and libraries are, and the nested `cargo build` that refreshes them.
//!
//! A test binary is `<target>/<profile>/deps/<test>-<hash>`: the workspace's programs are in
//! `<target>/<profile>/`, its cdylibs both there (refreshed by `cargo build`) and in `deps/`
//! (refreshed by `cargo test`), so the newer of the two copies is the one to use.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

/// The variable `scripts/test.sh` sets to the profile directory (e.g. `target/debug`) where it
/// built every artifact before the tests run (the harness's runner reads the same one).
pub const ARTIFACTS_VAR: &str = criu_cuda_env::ARTIFACTS;

/// The target directory the running test binary was built in.
#[derive(Debug, Clone)]
pub struct Layout {
    /// `<target>/<profile>/deps`.
    pub deps: PathBuf,
    /// `<target>/<profile>`.
    pub profile_dir: PathBuf,
    /// `<target>`.
    pub target_dir: PathBuf,
    /// The profile's name ("debug", "release", …).
    pub profile: String,
}

impl Layout {
    /// The layout of the running test binary.
    pub fn of_current_exe() -> Result<Layout, String> {
        let exe = std::env::current_exe().map_err(|e| format!("locating the test binary: {e}"))?;
        let deps = exe.parent().ok_or("the test binary has no directory")?;
        let profile_dir = deps.parent().ok_or("deps/ has no parent")?;
        Self::of_profile_dir(profile_dir)
    }

    /// Where the tests take the artifacts from, and whether they are prebuilt: the profile
    /// directory in `$CRIU_CUDA_ARTIFACTS` ([`ARTIFACTS_VAR`]: `scripts/test.sh` built everything
    /// there first, so nothing is rebuilt and a missing artifact is an error), else the running
    /// test binary's (refreshed by a nested `cargo build` when older than its sources).
    pub fn for_tests() -> Result<(Layout, bool), String> {
        match std::env::var_os(ARTIFACTS_VAR) {
            Some(dir) => Ok((Self::of_profile_dir(Path::new(&dir))?, true)),
            None => Ok((Self::of_current_exe()?, false)),
        }
    }

    /// The layout around the profile directory `profile_dir` (`<target>/<profile>`).
    pub fn of_profile_dir(profile_dir: &Path) -> Result<Layout, String> {
        let deps = profile_dir.join("deps");
        let target_dir = profile_dir
            .parent()
            .ok_or("the profile dir has no parent")?;
        let profile = profile_dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("the profile directory has no UTF-8 name")?
            .to_owned();
        Ok(Layout {
            deps: deps.to_path_buf(),
            profile_dir: profile_dir.to_path_buf(),
            target_dir: target_dir.to_path_buf(),
            profile,
        })
    }

    /// `deps/<name>` and `<profile>/<name>`: the two copies of a cdylib.
    pub fn both(&self, name: &str) -> [PathBuf; 2] {
        [self.deps.join(name), self.profile_dir.join(name)]
    }

    /// Runs `$CARGO build --manifest-path <workspace>/Cargo.toml args…` for this profile and
    /// target directory (`cargo` when `CARGO` is unset).
    pub fn cargo_build(&self, workspace: &Path, args: &[&str]) -> Result<(), String> {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(&cargo);
        cmd.arg("build")
            .arg("--manifest-path")
            .arg(workspace.join("Cargo.toml"))
            .args(args)
            .env("CARGO_TARGET_DIR", &self.target_dir);
        match self.profile.as_str() {
            "debug" => {}
            "release" => {
                cmd.arg("--release");
            }
            other => {
                cmd.args(["--profile", other]);
            }
        }
        eprintln!("testkit: building {args:?}: {cmd:?}");
        let out = cmd
            .output()
            .map_err(|e| format!("running {cargo:?} build: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{cmd:?} failed: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }
}

/// The modification time of `p`.
pub fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).ok()?.modified().ok()
}

/// Newest modification time of the files under `p` (recursively), or of `p` itself.
pub fn newest(p: &Path) -> Option<SystemTime> {
    let meta = std::fs::metadata(p).ok()?;
    if !meta.is_dir() {
        return meta.modified().ok();
    }
    std::fs::read_dir(p)
        .ok()?
        .filter_map(|e| newest(&e.ok()?.path()))
        .max()
}

/// The newest existing file of `paths`, with its time.
pub fn newest_of(paths: &[PathBuf]) -> Option<(SystemTime, PathBuf)> {
    paths
        .iter()
        .filter_map(|p| Some((mtime(p)?, p.clone())))
        .max()
}

/// True when every artifact exists and none is older than the newest of `sources` (true when
/// no source can be read: an installed tree without sources).
pub fn fresh(artifact_times: &[Option<SystemTime>], sources: &[PathBuf]) -> bool {
    let oldest = artifact_times
        .iter()
        .copied()
        .collect::<Option<Vec<_>>>()
        .and_then(|v| v.into_iter().min());
    let source_time = sources.iter().filter_map(|s| newest(s)).max();
    match (oldest, source_time) {
        (Some(a), Some(s)) => a >= s,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit lives in the workspace")
        .to_path_buf()
}
