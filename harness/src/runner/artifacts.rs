//! Locating the built executables and libraries a scenario needs (building them when missing
//! or older than their sources).

use super::*;

/// Where the executables and libraries a scenario needs live.
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// The `harness` front-end.
    pub harness: PathBuf,
    /// `cuda_plugin.so` (built as `libcuda_plugin.so`).
    pub plugin: PathBuf,
    /// `libmock_libcuda.so`.
    pub mock_lib: PathBuf,
    /// `libmock_nvml.so` (the NVML stand-in `mock-world` installs).
    pub mock_nvml: PathBuf,
    /// `mock-world`.
    pub mock_world: PathBuf,
    /// `mock-cuda-app`.
    pub mock_app: PathBuf,
    /// `cuda-checkpoint` (the fake).
    pub cuda_checkpoint: PathBuf,
    /// The workspace root (test plugin sources, CRIU wrappers).
    pub workspace: PathBuf,
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).ok()?.modified().ok()
}

/// The newest modification time of the files under `p` (recursively), or of `p` itself.
fn newest(p: &Path) -> Option<SystemTime> {
    let meta = std::fs::metadata(p).ok()?;
    if !meta.is_dir() {
        return meta.modified().ok();
    }
    std::fs::read_dir(p)
        .ok()?
        .filter_map(|e| newest(&e.ok()?.path()))
        .max()
}

/// The newer of `<profile>/<name>` and `<profile>/deps/<name>` (`cargo test` refreshes `deps/`
/// only).
fn newest_lib(profile: &Path, name: &str) -> PathBuf {
    let a = profile.join(name);
    let b = profile.join("deps").join(name);
    match (mtime(&a), mtime(&b)) {
        (Some(x), Some(y)) if x > y => a,
        (Some(_), None) => a,
        _ => b,
    }
}

/// The variable `scripts/test.sh` sets to the profile directory (e.g. `target/debug`) where it
/// built every artifact before the tests run: tests then take them from there and never run a
/// nested `cargo build` ([`Artifacts::for_tests`]).
pub const ARTIFACTS_VAR: &str = criu_cuda_env::ARTIFACTS;

/// The variable naming a prebuilt `cuda_plugin.so` (the released one, say) that replaces the
/// built plugin wherever the harness and the tests run this project's plugin: every scenario,
/// the sweep, the kit's columns of it. `plugin/tests/real_criu.rs` reads it too (testkit).
pub const TEST_PLUGIN_VAR: &str = criu_cuda_env::TEST_PLUGIN_SO;

fn test_plugin() -> Option<PathBuf> {
    std::env::var_os(TEST_PLUGIN_VAR)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

impl Artifacts {
    /// The artifacts of the profile directory `profile`, as they are.
    fn at(profile: &Path, harness: &Path) -> Self {
        Self {
            harness: harness.to_path_buf(),
            plugin: test_plugin().unwrap_or_else(|| newest_lib(profile, "libcuda_plugin.so")),
            mock_lib: newest_lib(profile, "libmock_libcuda.so"),
            mock_nvml: newest_lib(profile, "libmock_nvml.so"),
            mock_world: profile.join("mock-world"),
            mock_app: profile.join("mock-cuda-app"),
            cuda_checkpoint: profile.join("cuda-checkpoint"),
            workspace: Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap_or(Path::new("."))
                .to_path_buf(),
        }
    }

    /// The artifacts of the target profile directory `profile` (e.g. `target/debug`), with the
    /// `harness` front-end `harness`. When one is missing or older than the workspace's sources,
    /// `$CARGO build` (or `cargo`) builds the packages that provide them, once per process.
    ///
    /// # Errors
    /// A build that fails or an artifact still missing after it.
    pub fn locate(profile: &Path, harness: &Path) -> Result<Self, String> {
        let a = Self::at(profile, harness);
        if a.missing().is_none() && !a.stale() {
            return Ok(a);
        }
        static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
        BUILT.get_or_init(|| build(profile, &a.workspace)).clone()?;
        let a = Self::at(profile, harness);
        match a.missing() {
            None => Ok(a),
            Some(p) => Err(format!("{} is missing after the build", p.display())),
        }
    }

    /// The artifacts a test of this workspace uses, with the `harness` front-end `harness`:
    /// those in `$CRIU_CUDA_ARTIFACTS` (see [`ARTIFACTS_VAR`]) when it is set, as they are (no
    /// build), else [`Artifacts::locate`] in the running test binary's profile directory.
    ///
    /// # Errors
    /// An artifact missing from `$CRIU_CUDA_ARTIFACTS`, or [`Artifacts::locate`]'s errors.
    pub fn for_tests(harness: &Path) -> Result<Self, String> {
        if let Some(dir) = std::env::var_os(ARTIFACTS_VAR) {
            let profile = PathBuf::from(dir);
            let a = Self::at(&profile, harness);
            return match a.missing() {
                None => Ok(a),
                Some(p) => Err(format!(
                    "{ARTIFACTS_VAR}={}: {} is missing (scripts/test.sh builds every artifact \
                     there before the tests run)",
                    profile.display(),
                    p.display()
                )),
            };
        }
        let exe = std::env::current_exe().map_err(|e| format!("locating the test binary: {e}"))?;
        let profile = exe
            .parent()
            .and_then(Path::parent)
            .ok_or("the test binary is not in <target>/<profile>/deps")?;
        Self::locate(profile, harness)
    }

    /// Whether an artifact is older than the newest source of the crates that build them (a
    /// plugin edited since the last build would otherwise be tested as it was). False where the
    /// sources cannot be read (an installed harness without its workspace).
    fn stale(&self) -> bool {
        let sources = [
            "Cargo.lock",
            "abi/src",
            "plugin/src",
            "mock-cuda-world/src",
            "mock-libcuda/src",
            "mock-nvml/src",
            "fake-cuda-checkpoint/src",
            "harness/src",
        ];
        let Some(newest_source) = sources
            .iter()
            .filter_map(|s| newest(&self.workspace.join(s)))
            .max()
        else {
            return false;
        };
        // A prebuilt plugin given in TEST_PLUGIN_VAR is tested as it is.
        let built_plugin = test_plugin().is_none().then_some(&self.plugin);
        [&self.harness]
            .into_iter()
            .chain(built_plugin)
            .chain([
                &self.mock_lib,
                &self.mock_nvml,
                &self.mock_world,
                &self.mock_app,
                &self.cuda_checkpoint,
            ])
            .any(|p| mtime(p).is_none_or(|t| t < newest_source))
    }

    fn missing(&self) -> Option<&Path> {
        [
            &self.harness,
            &self.plugin,
            &self.mock_lib,
            &self.mock_nvml,
            &self.mock_world,
            &self.mock_app,
            &self.cuda_checkpoint,
        ]
        .into_iter()
        .find(|p| !p.exists())
        .map(PathBuf::as_path)
    }
}

fn build(profile: &Path, workspace: &Path) -> Result<(), String> {
    let target = profile.parent().ok_or("no target directory")?;
    let name = profile
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("odd profile directory")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut c = Command::new(&cargo);
    c.arg("build")
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .args([
            "-p",
            "cuda-plugin",
            "-p",
            "mock-libcuda",
            "-p",
            "mock-nvml",
            "-p",
            "fake-cuda-checkpoint",
        ])
        .args(["-p", "harness", "--lib", "--bins"])
        .env("CARGO_TARGET_DIR", target);
    match name {
        "debug" => {}
        "release" => {
            c.arg("--release");
        }
        other => {
            c.args(["--profile", other]);
        }
    }
    let out = c.output().map_err(|e| format!("running {cargo:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{c:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
/// A real CRIU for `profile` (`4.1`, `4.2`): `$CRIU_CUDA_CRIU_4_1`/`_4_2`, else the wrapper
/// listed in `target/criu/versions` (`$CRIU_CUDA_CRIU_VERSIONS`), else `criu` in `PATH` when its
/// version matches.
#[must_use]
pub fn find_criu(profile: &str, workspace: &Path) -> Option<PathBuf> {
    let var = criu_cuda_env::criu_wrapper(profile);
    if let Some(p) = std::env::var_os(&var).map(PathBuf::from) {
        if p.exists() {
            return Some(p);
        }
    }
    let versions = std::env::var_os(criu_cuda_env::CRIU_VERSIONS)
        .map_or_else(|| workspace.join("target/criu/versions"), PathBuf::from);
    if let Ok(text) = std::fs::read_to_string(versions) {
        for line in text.lines() {
            let mut it = line.split_whitespace();
            if let (Some(v), Some(p)) = (it.next(), it.next()) {
                if (v == profile || v.starts_with(&format!("{profile}."))) && Path::new(p).exists()
                {
                    return Some(PathBuf::from(p));
                }
            }
        }
    }
    let out = Command::new("criu").arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text
        .lines()
        .find_map(|l| l.strip_prefix("Version:"))?
        .trim();
    (v == profile || v.starts_with(&format!("{profile}."))).then(|| PathBuf::from("criu"))
}
