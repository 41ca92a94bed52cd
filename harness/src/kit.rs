//! The scenario corpus as a conformance kit for any CRIU CUDA plugin: the plugin under test, its
//! settings, and whether a scenario applies to it.
//!
//! Every scenario's **outcomes** apply to every plugin: each CRIU step's exit status, every
//! task's final state (running, parked or gone; not stopped, not traced), every task's final CUDA
//! state in the mock world (the ones the scenario names, and running for every other CUDA task
//! of a tree that ends running: nothing left locked), the GPU data each task verifies and on which
//! GPUs, the tasks a fault killed, nothing left behind, bounded time (`within`, and the step
//! watchdog), and, after a dump that left GPU state in the image, that the image requires the
//! plugin by its inventory name ([`PluginUnderTest::name`]). **This project's plugin's specifics** apply to it alone: the backend line it
//! logs (`backend = ...` on a step), the log substrings (`error`, `log`), and the transcript
//! snapshots.
//!
//! A scenario is **not applicable** to a plugin, with the reason, when it needs a capability the
//! plugin lacks ([`Scenario::requirements`]), when the plugin under test was chosen explicitly
//! and the scenario does not load the CUDA plugin at all (it tests the engine), when the
//! plugin's descriptor is one the scenario's CRIU refuses (a plugin built for CRIU 4.2's 13
//! hooks on CRIU 4.1), or when the run pins a backend ([`PluginUnderTest::backend`]) and the
//! scenario pins another.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use crate::runner::Artifacts;
use crate::scenario::{Capability, Scenario, OPTION_NAMESPACE};

/// The CUDA plugin a run tests, and how to drive it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginUnderTest {
    /// How tables and reports name it.
    pub label: String,
    /// The `.so`; `None`: this project's plugin (built as `libcuda_plugin.so`).
    pub path: Option<PathBuf>,
    /// The environment that enables it on a machine without a GPU (given to every step of a
    /// scenario whose `[host]` has `force_enable`, the default): `CRIU_CUDA_FORCE_ENABLE=1` for
    /// this project's plugin, CRIU's fault 138 (`CRIU_FAULT=138`) for CRIU's C plugin.
    pub enable: Vec<(String, String)>,
    /// Its name: the descriptor's and the inventory's, and the namespace of its options (a
    /// scenario's `cuda_plugin.KEY=VALUE` becomes `NAME.KEY=VALUE`).
    pub name: String,
    /// What it can do beyond the baseline. Without [`Capability::PluginOptions`] it gets none of
    /// a scenario's `cuda_plugin.*` options (a scenario that needs one is not applicable; a
    /// `backend` pin of a backend it has is simply dropped).
    pub capabilities: BTreeSet<Capability>,
    /// A backend given (as `cuda_plugin.backend=B`, before the scenario's own options) to every
    /// scenario that pins none; a scenario that pins another is not applicable. This is how
    /// this project's plugin gets one column per backend.
    pub backend: Option<String>,
    /// This project's plugin: its log lines, backend lines and snapshots are checked too.
    pub ours: bool,
    /// Chosen explicitly (`--plugin`, `harness conformance`): scenarios that do not load the
    /// CUDA plugin are not applicable, as they test nothing of it.
    pub explicit: bool,
}

impl PluginUnderTest {
    /// This project's plugin, as `harness run` and the tests run the corpus: every capability
    /// it has, no backend forced, engine scenarios included.
    #[must_use]
    pub fn ours() -> Self {
        Self {
            label: "criu-cuda".to_owned(),
            path: None,
            enable: vec![(criu_cuda_env::FORCE_ENABLE.to_owned(), "1".to_owned())],
            name: OPTION_NAMESPACE.to_owned(),
            capabilities: Capability::ALL.into_iter().collect(),
            backend: None,
            ours: true,
            explicit: false,
        }
    }

    /// This project's plugin with `backend` forced where a scenario pins none: one column of
    /// the conformance table.
    #[must_use]
    pub fn ours_with_backend(backend: &str) -> Self {
        Self {
            label: format!("criu-cuda, {backend}"),
            backend: Some(backend.to_owned()),
            explicit: true,
            ..Self::ours()
        }
    }

    /// Another plugin, with the defaults of a plugin derived from CRIU's own: enabled by fault
    /// 138, no options, no capability beyond the baseline, named `cuda_plugin` (callers replace
    /// the name with the descriptor's, [`descriptor`]).
    #[must_use]
    pub fn other(path: &Path) -> Self {
        Self {
            label: path.display().to_string(),
            path: Some(path.to_path_buf()),
            enable: vec![("CRIU_FAULT".to_owned(), "138".to_owned())],
            name: OPTION_NAMESPACE.to_owned(),
            capabilities: BTreeSet::new(),
            backend: None,
            ours: false,
            explicit: true,
        }
    }

    /// Whether it has `c`.
    #[must_use]
    pub fn has(&self, c: Capability) -> bool {
        self.capabilities.contains(&c)
    }

    /// The scenario's options (`scenario` then `step`) as this plugin gets them: the forced
    /// backend first when the scenario pins none, `cuda_plugin.*` ones dropped when it takes no
    /// options or renamed to its namespace; other plugins' options unchanged.
    #[must_use]
    pub fn options(&self, s: &Scenario, step: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        if let (Some(b), None) = (&self.backend, s.pinned_backend()) {
            out.push(format!("{OPTION_NAMESPACE}.backend={b}"));
        }
        out.extend(s.options.iter().chain(step).cloned());
        out.into_iter()
            .filter_map(|o| match crate::scenario::cuda_option(&o) {
                None => Some(o),
                Some(_) if !self.has(Capability::PluginOptions) => None,
                Some(_) if self.name == OPTION_NAMESPACE => Some(o),
                Some(_) => Some(format!("{}{}", self.name, &o[OPTION_NAMESPACE.len()..])),
            })
            .collect()
    }

    /// Whether a run of `s` gets an option the scenario does not give itself (then its
    /// transcript cannot be compared with the snapshot recorded without it).
    #[must_use]
    pub fn injects_options(&self, s: &Scenario) -> bool {
        self.backend.is_some() && s.pinned_backend().is_none()
    }
}

/// What `harness plugins --json` says about a plugin on one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// `CR_PLUGIN_DESC.name`.
    pub name: String,
    /// Its `max_hooks` after its constructors ran on that host.
    pub max_hooks: u32,
    /// Why that host refuses it, if it does.
    pub rejected: Option<String>,
}

/// Reads the descriptor of the plugin `so` as the emulated host `profile` sees it (its
/// constructors run, `init` is not called), with `harness --host PROFILE plugins --json`.
/// Cached per file and profile.
///
/// # Errors
/// The engine fails to load or list it.
pub fn descriptor(art: &Artifacts, so: &Path, profile: &str) -> Result<Descriptor, String> {
    type Cache = Mutex<HashMap<(PathBuf, String), Result<Descriptor, String>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = (so.to_path_buf(), profile.to_owned());
    let cache = CACHE.get_or_init(Cache::default);
    if let Some(d) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return d;
    }
    let d = read_descriptor(art, so, profile);
    if let Ok(mut c) = cache.lock() {
        c.insert(key, d.clone());
    }
    d
}

fn read_descriptor(art: &Artifacts, so: &Path, profile: &str) -> Result<Descriptor, String> {
    let dir = tempfile::Builder::new()
        .prefix("descriptor-")
        .tempdir()
        .map_err(|e| format!("tempdir: {e}"))?;
    std::fs::copy(so, dir.path().join("plugin.so"))
        .map_err(|e| format!("copy {}: {e}", so.display()))?;
    let out = Command::new(&art.harness)
        .args(["--host", profile, "plugins", "--json", "-L"])
        .arg(dir.path())
        .output()
        .map_err(|e| format!("{}: {e}", art.harness.display()))?;
    if !out.status.success() {
        return Err(format!(
            "harness plugins cannot read {}: {}",
            so.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("harness plugins --json: {e}"))?;
    let p = v
        .as_array()
        .and_then(|a| a.first())
        .ok_or_else(|| format!("{} has no CR_PLUGIN_DESC", so.display()))?;
    Ok(Descriptor {
        name: p["name"].as_str().unwrap_or_default().to_owned(),
        max_hooks: p["max_hooks"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
        rejected: p["rejected"].as_str().map(str::to_owned),
    })
}

/// The `.so` a scenario installs as its CUDA plugin under `put`: the scenario's own `path`
/// (relative paths from the workspace), else the plugin under test's, else this project's.
#[must_use]
pub fn plugin_file(s: &Scenario, put: &PluginUnderTest, art: &Artifacts) -> PathBuf {
    let pinned = s
        .plugins
        .iter()
        .find_map(|p| p.path.as_deref())
        .map(|p| art.workspace.join(p));
    pinned
        .or_else(|| put.path.clone())
        .unwrap_or_else(|| art.plugin.clone())
}

/// `Ok` when `s` applies to `put`, else why not (one line, the same on every run).
///
/// # Errors
/// The reason it does not apply.
pub fn applicability(s: &Scenario, put: &PluginUnderTest, art: &Artifacts) -> Result<(), String> {
    if !s.uses_cuda_plugin() {
        return if put.explicit {
            Err("does not load the CUDA plugin (tests the engine)".to_owned())
        } else {
            Ok(())
        };
    }
    let missing: Vec<(Capability, String)> = s
        .requirements()
        .into_iter()
        .filter(|(c, _)| !put.has(*c))
        .collect();
    if let Some((_, why)) = missing.first() {
        let names: Vec<&str> = missing.iter().map(|(c, _)| c.name()).collect();
        return Err(format!("needs {} ({why})", names.join(", ")));
    }
    if let (Some(want), Some(pinned)) = (&put.backend, s.pinned_backend()) {
        // A scenario that pins `auto` or an invalid backend tests the selection itself; it is
        // listed with the driver API, which `auto` prefers.
        let column = if pinned == "cuda-checkpoint" {
            "cuda-checkpoint"
        } else {
            "driver-api"
        };
        if column != want {
            let shown: String = if pinned.chars().count() > 24 {
                format!("{}…", pinned.chars().take(16).collect::<String>())
            } else {
                pinned.to_owned()
            };
            return Err(format!("pins backend {shown}"));
        }
    }
    if !put.ours || s.plugins.iter().any(|p| p.path.is_some()) {
        let so = plugin_file(s, put, art);
        if !so.exists() {
            return Err(format!("no plugin file {}", so.display()));
        }
        let d = descriptor(art, &so, &s.host.profile)?;
        if let Some(why) = d.rejected {
            return Err(format!("CRIU {} refuses it: {why}", s.host.profile));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCENARIO: &str = r#"
description = "x"
options = ["cuda_plugin.backend=cuda-checkpoint", "probe.flag"]
[world]
driver = { branch = 580 }
[workload]
tasks = [{ name = "root", cuda = true }]
[host]
engine = "emulated"
profile = "pr3076"
[[plugins]]
kind = "cuda"
[[steps]]
action = "dump"
expect = "ok"
options = ["cuda_plugin.timeout=3"]
"#;

    fn art() -> Artifacts {
        Artifacts {
            harness: PathBuf::from("/nonexistent/harness"),
            plugin: PathBuf::from("/nonexistent/libcuda_plugin.so"),
            mock_lib: PathBuf::new(),
            mock_nvml: PathBuf::new(),
            mock_world: PathBuf::new(),
            mock_app: PathBuf::new(),
            cuda_checkpoint: PathBuf::new(),
            workspace: PathBuf::from("/w"),
        }
    }

    #[test]
    fn options_are_dropped_renamed_or_led_by_the_forced_backend() {
        let s = Scenario::parse("s.toml", SCENARIO).unwrap();
        let step = &s.steps[0].options;
        let ours = PluginUnderTest::ours();
        assert_eq!(
            ours.options(&s, step),
            [
                "cuda_plugin.backend=cuda-checkpoint",
                "probe.flag",
                "cuda_plugin.timeout=3"
            ]
        );
        let mut renamed = PluginUnderTest::ours();
        renamed.name = "gpu_plugin".to_owned();
        assert_eq!(
            renamed.options(&s, step)[0],
            "gpu_plugin.backend=cuda-checkpoint"
        );
        let other = PluginUnderTest::other(Path::new("/x.so"));
        assert_eq!(other.options(&s, step), ["probe.flag"]);
        // The scenario pins its backend: nothing is forced.
        let col = PluginUnderTest::ours_with_backend("driver-api");
        assert!(!col.injects_options(&s));
        let unpinned = Scenario::parse(
            "s.toml",
            &SCENARIO.replace("\"cuda_plugin.backend=cuda-checkpoint\", ", ""),
        )
        .unwrap();
        assert!(col.injects_options(&unpinned));
        assert_eq!(
            col.options(&unpinned, &[])[0],
            "cuda_plugin.backend=driver-api"
        );
    }

    #[test]
    fn a_missing_capability_or_another_backend_makes_a_scenario_not_applicable() {
        let s = Scenario::parse("s.toml", SCENARIO).unwrap();
        let art = art();
        let mut other = PluginUnderTest::other(Path::new("/x.so"));
        let e = applicability(&s, &other, &art).unwrap_err();
        assert_eq!(
            e,
            "needs plugin-options, call-timeout (sets cuda_plugin.timeout)"
        );
        other.capabilities = Capability::ALL.into_iter().collect();
        // Past the capabilities, the descriptor is read from the file, which is absent here.
        assert!(applicability(&s, &other, &art)
            .unwrap_err()
            .starts_with("no plugin file"));
        let col = PluginUnderTest::ours_with_backend("driver-api");
        assert_eq!(
            applicability(&s, &col, &art).unwrap_err(),
            "pins backend cuda-checkpoint"
        );
        assert_eq!(
            applicability(
                &s,
                &PluginUnderTest::ours_with_backend("cuda-checkpoint"),
                &art
            ),
            Ok(())
        );
        let engine_only = Scenario::parse(
            "s.toml",
            &SCENARIO.replace("kind = \"cuda\"", "kind = \"test\"\nname = \"probe\""),
        )
        .unwrap();
        assert_eq!(
            applicability(&engine_only, &PluginUnderTest::ours(), &art),
            Ok(())
        );
        assert!(applicability(&engine_only, &col, &art)
            .unwrap_err()
            .contains("engine"));
    }
}
