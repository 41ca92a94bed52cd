//! The scenario file format (`scenarios/**/*.toml`): one behaviour per file.
//!
//! ```toml
//! description = "RESUME_DEVICES_LATE errors abort the restore under the newer rules"
//!
//! known_failure = "…"  # optional: runs, a failure is "xfail", a pass is an error
//!
//! [world]              # optional: a `world.toml` (docs/mock-world.md) for `mock-world init`;
//! driver = { branch = 580 }   # `schema = 1` and one default GPU are added when absent; a
//!                      # `[[world.fault]]` may name a task (`task = "worker"`) instead of a pid:
//!                      # faults are installed (`mock-world configure`) once the workload runs
//!
//! [workload]           # the process tree, root first; `parent` names an earlier task
//! tasks = [{ name = "root" }, { name = "worker", parent = "root", cuda = true, threads = 1 }]
//!                      # CUDA tasks: `gpus = [0, 1]`, `kib = 64`
//!
//! [host]
//! engine = "emulated"  # or "criu" (a real CRIU >= 4.0; skipped when absent)
//! profile = "pr3076"   # 4.1 | 4.2 | upstream | pr3076
//! rules = "newer"      # optional override: 4.1 | newer
//! cuda_checkpoint = true   # a cuda-checkpoint in the steps' PATH
//! force_enable = true      # CRIU_CUDA_FORCE_ENABLE=1 (no GPU here)
//!
//! [[plugins]]          # what goes into the plugin directory, in this order
//! kind = "test"        # "cuda" (this project's plugin) or "test" (tests/support/testplugin.c)
//! name = "probe"
//! script = { resume = "ret=-1" }
//!
//! [[steps]]
//! action = "dump"      # dump | pre-dump | restore | cuda-checkpoint (`task`, `args`)
//! expect = "ok"        # ok | fail
//! backend = "driver-api"   # optional: what the CUDA plugin selected (or "none")
//!
//! [[steps]]
//! action = "restore"
//! expect = "fail"
//! error = "RESUME_DEVICES_LATE failed"   # a substring of the engine log
//!
//! [expect]             # the final state
//! tasks = "running"    # running | parked | gone
//! cuda_state = { worker = "running" }   # running | locked | checkpointed | failed | none
//! gpu_data_verified = true              # every task answers SIGUSR1 with PASS
//! dead = ["worker"]                     # tasks a fault killed
//! ```
//!
//! Parsing is strict: an unknown key anywhere is an error naming the file and the key.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// One scenario file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// The behaviour this scenario pins, in one sentence.
    pub description: String,
    /// The mock world, passed verbatim to `mock-world init`.
    #[serde(default)]
    pub world: Option<toml::Table>,
    /// The process tree.
    pub workload: Workload,
    /// The host that drives the plugins.
    pub host: Host,
    /// The plugin directory's content.
    #[serde(default)]
    pub plugins: Vec<PluginSpec>,
    /// `--plugin-option`s given to every step.
    #[serde(default)]
    pub options: Vec<String>,
    /// The operations, in order.
    pub steps: Vec<Step>,
    /// The expected end state.
    #[serde(default)]
    pub expect: Expect,
    /// A scenario that pins the correct behaviour of a component that does not have it yet: it
    /// runs, its failure is reported as "xfail" with this reason, and a pass is an error.
    #[serde(default)]
    pub known_failure: Option<String>,
}

/// The process tree.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Tasks, root first.
    pub tasks: Vec<TaskSpec>,
}

/// One task of the workload.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// A name unique in the scenario.
    pub name: String,
    /// The parent's name; absent for the root.
    #[serde(default)]
    pub parent: Option<String>,
    /// Whether the task uses CUDA (needs the mock world).
    #[serde(default)]
    pub cuda: bool,
    /// Extra threads.
    #[serde(default)]
    pub threads: u32,
    /// GPU ordinals a CUDA task allocates on (default `[0]`).
    #[serde(default)]
    pub gpus: Option<Vec<u32>>,
    /// KiB allocated per GPU by a CUDA task (default 64).
    #[serde(default)]
    pub kib: Option<u32>,
}

/// Which host runs the steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineKind {
    /// The harness engine emulation.
    Emulated,
    /// A real CRIU binary.
    Criu,
}

/// The host.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// Emulated or real.
    pub engine: EngineKind,
    /// The profile (`4.1`, `4.2`, `upstream`, `pr3076`).
    pub profile: String,
    /// A rule-set override.
    #[serde(default)]
    pub rules: Option<String>,
    /// Whether a `cuda-checkpoint` is in the `PATH` of the steps (default true).
    #[serde(default = "yes")]
    pub cuda_checkpoint: bool,
    /// Whether `CRIU_CUDA_FORCE_ENABLE=1` is set for the steps (default true: no GPU here).
    #[serde(default = "yes")]
    pub force_enable: bool,
}

const fn yes() -> bool {
    true
}

/// What a plugin entry installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PluginKind {
    /// This project's CUDA plugin.
    Cuda,
    /// The scriptable C test plugin.
    Test,
}

/// One plugin of the plugin directory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSpec {
    /// What to install.
    pub kind: PluginKind,
    /// Descriptor name (test plugins).
    #[serde(default)]
    pub name: Option<String>,
    /// File name in the directory (default: `<name>.so`).
    #[serde(default)]
    pub file: Option<String>,
    /// Extra `-D` defines for a test plugin (`TP_NO_CLAMP`, `TP_VERSION=0x300`, ...).
    #[serde(default)]
    pub defines: Vec<String>,
    /// Test plugin actions per event (`init`, `pause`, `resume`, ...), see testplugin.c.
    #[serde(default)]
    pub script: BTreeMap<String, String>,
}

/// An operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// `dump`.
    Dump,
    /// `pre-dump`.
    PreDump,
    /// `restore`.
    Restore,
    /// Run `cuda-checkpoint ARGS --pid <task>` (e.g. to lock a task before the dump).
    CudaCheckpoint,
}

/// The expected result of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Exit status 0.
    Ok,
    /// Exit status 1.
    Fail,
}

/// One step.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// The operation.
    pub action: Action,
    /// `--leave-running`.
    #[serde(default)]
    pub leave_running: bool,
    /// `--stream`.
    #[serde(default)]
    pub stream: bool,
    /// Extra `--plugin-option`s for this step.
    #[serde(default)]
    pub options: Vec<String>,
    /// Expected result.
    pub expect: Outcome,
    /// A substring the engine log must contain.
    #[serde(default)]
    pub error: Option<String>,
    /// The backend the CUDA plugin must have selected in this step (`driver-api`,
    /// `cuda-checkpoint`), or `none` (disabled, or init failed before selecting).
    #[serde(default)]
    pub backend: Option<String>,
    /// `cuda-checkpoint` steps: the task.
    #[serde(default)]
    pub task: Option<String>,
    /// `cuda-checkpoint` steps: the arguments before `--pid`.
    #[serde(default)]
    pub args: Vec<String>,
}

/// The end state of every task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskState {
    /// Running and untraced.
    #[default]
    Running,
    /// Group-stopped and untraced.
    Parked,
    /// Every task has exited (a real CRIU dump without `--leave-running`).
    Gone,
}

/// The expected end state.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// State of the workload's tasks after the last step.
    #[serde(default)]
    pub tasks: TaskState,
    /// The CUDA backend that ran (checked against the mock world).
    #[serde(default)]
    pub backend: Option<String>,
    /// Final CUDA state per task name (checked against the mock world).
    #[serde(default)]
    pub cuda_state: BTreeMap<String, String>,
    /// Whether GPU data must have been verified by the workload.
    #[serde(default)]
    pub gpu_data_verified: Option<bool>,
    /// Tasks expected to have died (a `kill-target` fault); not checked for state or data.
    #[serde(default)]
    pub dead: Vec<String>,
}

/// A scenario file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// Unreadable.
    #[error("failed to read {path}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Not valid against the schema (the message names the key).
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// toml's message, which names the offending key and its position.
        message: String,
    },
    /// Valid TOML, inconsistent content.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

impl Scenario {
    /// Parses `text` (from `path`, for messages).
    ///
    /// # Errors
    /// Syntax errors, unknown keys, and inconsistent task or plugin lists.
    pub fn parse(path: &str, text: &str) -> Result<Self, ScenarioError> {
        let s: Self = toml::from_str(text).map_err(|e| ScenarioError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        s.validate().map_err(|message| ScenarioError::Invalid {
            path: path.to_owned(),
            message,
        })?;
        Ok(s)
    }

    /// Reads and parses a scenario file.
    ///
    /// # Errors
    /// As [`Scenario::parse`], plus I/O.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&shown, &text)
    }

    fn validate(&self) -> Result<(), String> {
        let mut seen = Vec::new();
        for (i, t) in self.workload.tasks.iter().enumerate() {
            if seen.contains(&t.name.as_str()) {
                return Err(format!("task `{}` is declared twice", t.name));
            }
            match (&t.parent, i) {
                (None, 0) => {}
                (Some(p), i) if i > 0 && seen.contains(&p.as_str()) => {}
                (None, _) => return Err(format!("task `{}` has no parent", t.name)),
                (Some(p), _) => {
                    return Err(format!(
                        "task `{}`: parent `{p}` is not declared before it",
                        t.name
                    ))
                }
            }
            seen.push(&t.name);
        }
        if seen.is_empty() {
            return Err("the workload has no task".to_owned());
        }
        self.host
            .profile
            .parse::<crate::profile::HostProfile>()
            .map_err(|e| e.to_string())?;
        if let Some(r) = &self.host.rules {
            r.parse::<crate::profile::Rules>()
                .map_err(|e| e.to_string())?;
        }
        for p in &self.plugins {
            if p.kind == PluginKind::Test && p.name.is_none() {
                return Err("a test plugin needs a `name`".to_owned());
            }
        }
        if self.steps.is_empty() {
            return Err("no steps".to_owned());
        }
        for (i, st) in self.steps.iter().enumerate() {
            match (st.action, &st.task) {
                (Action::CudaCheckpoint, Some(t)) if seen.contains(&t.as_str()) => {}
                (Action::CudaCheckpoint, _) => {
                    return Err(format!("step {i}: cuda-checkpoint needs a declared `task`"))
                }
                (_, Some(_)) => return Err(format!("step {i}: only cuda-checkpoint takes a task")),
                (_, None) => {}
            }
            if let Some(b) = &st.backend {
                if !["driver-api", "cuda-checkpoint", "none"].contains(&b.as_str()) {
                    return Err(format!("step {i}: unknown backend `{b}`"));
                }
            }
        }
        for name in self.expect.cuda_state.keys().chain(&self.expect.dead) {
            if !seen.contains(&name.as_str()) {
                return Err(format!("expect: unknown task `{name}`"));
            }
        }
        for (name, st) in &self.expect.cuda_state {
            if !["running", "locked", "checkpointed", "failed", "none"].contains(&st.as_str()) {
                return Err(format!("expect.cuda_state.{name}: unknown state `{st}`"));
            }
        }
        Ok(())
    }

    /// Whether running it needs the mock world and the CUDA plugin.
    #[must_use]
    pub fn needs_cuda(&self) -> bool {
        self.world.is_some()
            || self.workload.tasks.iter().any(|t| t.cuda)
            || self.plugins.iter().any(|p| p.kind == PluginKind::Cuda)
            || self.expect.backend.is_some()
            || !self.expect.cuda_state.is_empty()
            || self.expect.gpu_data_verified.is_some()
            || self
                .steps
                .iter()
                .any(|s| s.backend.is_some() || s.action == Action::CudaCheckpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
description = "x"
[workload]
tasks = [{ name = "root" }, { name = "c", parent = "root", threads = 2 }]
[host]
engine = "emulated"
profile = "4.1"
[[steps]]
action = "dump"
expect = "ok"
"#;

    #[test]
    fn parses_a_minimal_scenario() {
        let s = Scenario::parse("m.toml", MINIMAL).unwrap();
        assert_eq!(s.workload.tasks.len(), 2);
        assert_eq!(s.steps[0].action, Action::Dump);
        assert!(!s.needs_cuda());
        assert_eq!(s.expect.tasks, TaskState::Running);
    }

    #[test]
    fn unknown_keys_are_errors_naming_file_and_key() {
        for (extra, key) in [
            ("bogus = 1\n", "bogus"),
            ("[expect]\nbackedn = \"x\"\n", "backedn"),
        ] {
            let text = format!("{MINIMAL}{extra}");
            let e = Scenario::parse("dir/s.toml", &text)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("dir/s.toml: "), "{e}");
            assert!(e.contains(key), "{e}");
        }
        let text = MINIMAL.replace("threads = 2", "thread = 2");
        let e = Scenario::parse("s.toml", &text).unwrap_err().to_string();
        assert!(e.contains("thread"), "{e}");
    }

    #[test]
    fn world_is_kept_verbatim_and_marks_cuda() {
        let text = format!("{MINIMAL}[world]\ndriver_version = 580\n[world.gpus]\ncount = 2\n");
        let s = Scenario::parse("s.toml", &text).unwrap();
        let w = s.world.as_ref().unwrap();
        assert_eq!(w["driver_version"].as_integer(), Some(580));
        assert!(s.needs_cuda());
    }

    #[test]
    fn inconsistent_content_is_rejected() {
        let bad_parent = MINIMAL.replace("parent = \"root\"", "parent = \"nobody\"");
        assert!(Scenario::parse("s", &bad_parent).is_err());
        let bad_host = MINIMAL.replace("profile = \"4.1\"", "profile = \"9\"");
        assert!(Scenario::parse("s", &bad_host).is_err());
    }
}
