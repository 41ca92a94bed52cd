//! The scenario file format (`scenarios/**/*.toml`): one behaviour per file.
//!
//! ```toml
//! description = "RESUME_DEVICES_LATE errors abort the restore under the newer rules"
//!
//! known_failure = "…"  # optional: runs, a failure is "xfail", a pass is an error
//!
//! alone = true         # optional: no other scenario of the run runs beside it (a tree of
//!                      # dozens of tasks, whose dump must fit CRIU's freeze alarm)
//!
//! requires = ["restore-as-dumped"]  # optional: capabilities the CUDA plugin under test needs
//!                      # (see [`Capability`]); what the options, faults and steps already
//!                      # imply is added (`Scenario::requirements`). A plugin without one of
//!                      # them is "not applicable" to the scenario, with the reason.
//!
//! [world]              # optional: a `world.toml` (docs/mock-world.md) for `mock-world init`;
//! driver = { branch = 580 }   # `schema = 1` and one default GPU are added when absent; a
//!                      # `[[world.fault]]` may name a task (`task = "worker"`) instead of a pid:
//!                      # faults are installed (`mock-world configure`) once the workload runs;
//!                      # every other key passes through: `[world.rates]` (driver_gbps,
//!                      # link_gbps, host_gbps, time_scale), `[world.host]` (memory_gib),
//!                      # `[world.memory]` (real_mib, sample_kib), `[world.nvml]` (present)
//!
//! [workload]           # the process tree, root first; `parent` names an earlier task
//! tasks = [{ name = "root" }, { name = "worker", parent = "root", cuda = true, threads = 1 }]
//!                      # CUDA tasks: `gpus = [0, 1]`, `kib = 64` (every byte real), or
//!                      # `gib = 80.0` (virtual device memory: a memset and 16 pattern windows,
//!                      # `mock-cuda-app --gib`), and `kernel_ms = 500` (a kernel of that many
//!                      # milliseconds always in flight: a lock waits for it), and
//!                      # `collective = "tp"` (a member of that collective: its lock waits
//!                      # until every member has a lock requested); any task:
//!                      # `seccomp = true` (a seccomp filter, checked after a restore)
//! namespaces = ["pid", "mount"]   # optional: the tree starts in new namespaces, as in a
//!                      # container (any of "pid", "mount"; below)
//!
//! [host]
//! engine = "emulated"  # or "criu" (a real CRIU >= 4.0; skipped when absent)
//! profile = "pr3076"   # 4.1 | 4.2 | upstream | pr3076
//! rules = "newer"      # optional override: 4.1 | newer
//! sentinel = true      # optional, emulated only: CRIU proposal #3105's CHECKPOINT_DEVICES(-1)
//!                      # and RESUME_DEVICES_LATE(-1) after the per-task loops
//! cuda_checkpoint = true   # a cuda-checkpoint in the steps' PATH
//! force_enable = true      # CRIU_CUDA_FORCE_ENABLE=1 (no GPU here)
//! image_fs_kib = 64        # optional, root only: the image directory is a tmpfs of that size
//!                          # (mounted before the first step, unmounted at the end)
//!
//! [[plugins]]          # what goes into the plugin directory, in this order
//! kind = "test"        # "cuda" (the CUDA plugin under test: this project's unless
//! name = "probe"       # `harness run --plugin`) or "test" (tests/support/testplugin.c)
//! script = { resume = "ret=-1" }
//!
//! [[plugins]]
//! kind = "cuda"
//! path = "target/criu/4.1.1/c-plugin/cuda_plugin.so"  # optional: install this `.so`
//!                      # (absolute, or relative to the workspace) as the CUDA plugin
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
//! options = ["cuda_plugin.device-map=0=1,1=0"]   # after the scenario's `options`: a repeated
//!                      # option here overrides (the plugin takes the last of repeats)
//! env = { CUDA_VISIBLE_DEVICES = "1" }  # extra environment of this step's CRIU/engine
//! log = ["is ignored"]  # substrings the step's log must contain (ok or failed)
//!
//! [[steps]]            # harness-side steps between CRIU operations (`expect` may be omitted):
//! action = "reconfigure-world"   # `mock-world configure`: the world becomes "another host";
//! world = { gpu = [] }  # keys given replace the `[world]` keys of the same name
//!
//! [[steps]]
//! action = "remove-image"        # delete a file of the image directory (or of the stream)
//! name = "cuda-gpu-inventory.img"
//!
//! [[steps]]
//! action = "special-image"       # put a FIFO, a symbolic link to /dev/zero or a directory in
//! name = "cuda-plugin-{gpu}.img"  # place of an image; in image names `{task}` is that task's
//! kind = "fifo"                  # pid at the dump (fifo | dev-zero | directory)
//!
//! [[steps]]
//! action = "signal"              # send a signal to a task (STOP, CONT, KILL, ...)
//! task = "gpu"
//! signal = "STOP"
//!
//! [[steps]]                      # CRIU steps also take: `criu_timeout = 3` (CRIU's --timeout),
//! action = "dump"                # `action_script = "exit 3"` (a post-dump action script, dump
//! expect = "fail"                # only) and `within = 3.5` (the step must end within that many
//! criu_timeout = 3               # seconds); every step is killed after 120 s (or, with
//! within = 3.5                   # `within`, after 2 × `within` + 10 s)
//!
//! [[steps]]
//! action = "write-image"         # replace an image with `hex` bytes (whitespace and `_`
//! name = "cuda-gpu-inventory.img"  # ignored); with `offset`, overwrite from there instead;
//! hex = "02000000"     # with `truncate = N`, keep the first N bytes (after any overwrite;
//! offset = 8           # -N drops the last N); `from = "NAME"` starts from another image's
//!                      # bytes, `replace = ["FROM", "TO"]` replaces the first FROM
//!
//! [expect]             # the final state
//! tasks = "running"    # running | parked | gone
//! cuda_state = { worker = "running" }   # running | locked | checkpointed | failed | none
//! gpu_data_verified = true              # every task answers SIGUSR1 with PASS
//! dead = ["worker"]                     # tasks a fault killed
//! gpus = { worker = ["GPU-…"] }         # the GPUs each task's PASS line reports (in its
//!                                       # allocation order), checked with the data
//! start_gpus = { worker = ["GPU-…"] }   # the GPUs its READY line reported at start
//! host_pids = "changed"                 # after the last restore, every task's host pid differs
//!                                       # from the one it started with and its namespace pid
//!                                       # is the same ("kept": the same host pids)
//! images_absent = ["cuda-cs-*"]         # globs (`*`, `?`) no file of the image directory
//!                                       # may match after the last step
//! ```
//!
//! ## Namespaces
//!
//! `[workload] namespaces` starts the root of the tree with `unshare` semantics, as a container
//! runtime would: `"pid"`, a new pid namespace whose init (pid 1) is the root; `"mount"`, a new
//! (private) mount namespace. With both, the tree gets a `/proc` of its own pid namespace
//! (`unshare --mount-proc`), so it sees its own pids; with `"pid"` alone it keeps the host's
//! `/proc`. In new namespaces the tree inherits no descriptor but its standard ones and opens
//! its output file itself, for appending (CRIU cannot dump a descriptor of a mount of another
//! mount namespace, "Can't lookup mount=… for fd=…", and at restore checks the size of a file
//! open for writing unless it is open for appending; `unshare` writes to a file of its own). In
//! a mount namespace the tree gets an empty `/dev/shm` of its own (else CRIU stores the host's
//! `/dev/shm` content with the tree, seconds of `tar`).
//! The mock world, the built artifacts and the scenario directory stay visible.
//!
//! The tasks are known by host pids, as CRIU and the plugin name them from the root namespace
//! (a READY line reports the namespace pid; the runner finds the host pid by the namespace and
//! that pid); transcripts name tasks by name either way. Real CRIU dumps the namespaces of the
//! root without options, and restores a mount namespace only with `--root /` (the runner adds
//! it; without it CRIU 4.1/4.2 stop with "mnt: BUG at criu/mount.c:48", or with
//! `--mntns-compat-mode` "The --root option is required to restore a mount namespace"). A pid
//! namespace is restored as a new one: the tasks keep their namespace pids and get new host
//! pids, which the runner learns (`criu restore --pidfile`). The emulated engine re-seizes the
//! same tasks (same host pids), and, as CRIU does when it dumps a mount namespace other than
//! its own, enters the tree's mount namespace during a dump (`setns(CLONE_NEWNS)`, which fails
//! while the engine is multi-threaded).
//!
//! Parsing is strict: an unknown key anywhere is an error naming the file and the key.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

pub mod matrix;
pub use matrix::Variant;

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
    /// Runs with no other scenario beside it in this process ([`crate::runner::run_with`]):
    /// for a tree large enough that sharing a 2-core runner with three other scenarios (the
    /// corpus runs four at a time) starves the plugin's lock-ahead of the CPU it needs within
    /// CRIU's freeze alarm.
    #[serde(default)]
    pub alone: bool,
    /// Capabilities the CUDA plugin under test needs beyond what the scenario's options, faults
    /// and steps imply (see [`Scenario::requirements`]).
    #[serde(default)]
    pub requires: Vec<Capability>,
    /// Judge the run by the plugin's invariants instead of `[expect]`: the last step, expected
    /// `any`, may succeed or fail, and what must hold after it depends on which (see
    /// [`Invariants`]). The fault sweep's cases are such scenarios.
    #[serde(default)]
    pub invariants: Option<Invariants>,
}

/// What a run judged by invariants checks, beyond what always holds (`[invariants]`).
///
/// After the last step (a dump or a restore, `expect = "any"`):
/// - it ends within its `within`, and its log holds none of its `absent` strings;
/// - a failure is reported by the plugin naming the hook, the pid of `task` and `reason` (once
///   the world's first fault fired);
/// - a failed dump leaves every surviving task running, untraced, unlocked and with its data
///   (a task the plugin reports it could not put back excepted); a successful one leaves every
///   CUDA task checkpointed and the tree parked, and a fault-free restore then brings it back;
/// - a successful restore leaves everything running with its data (under the 4.1 rules, a task
///   whose RESUME_DEVICES_LATE error was logged excepted); a failed one leaves the tree parked,
///   every CUDA task checkpointed, locked or running, and recoverable: driven back with a
///   fault-free `cuda-checkpoint` after SIGCONT, its data is intact;
/// - `foreign_lock`'s task is left locked, then unlocked by the harness with its data intact;
/// - nothing but the workload is left in the world.
///
/// A task a fault killed, or (with `may_fail`) put in the FAILED state, is exempt.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Invariants {
    /// The task the fault names: a failure must name its pid.
    #[serde(default)]
    pub task: Option<String>,
    /// A word a failure the fault caused must contain (a code's name, `timed out`, …).
    #[serde(default)]
    pub reason: Option<String>,
    /// The faulted call is the rollback's (after another task's checkpoint failed): the
    /// failure may name that other task instead.
    #[serde(default)]
    pub rollback: bool,
    /// A `fail` fault: a task in the FAILED state is the fault's doing.
    #[serde(default)]
    pub may_fail: bool,
    /// The task someone else locked before the plugin's call.
    #[serde(default)]
    pub foreign_lock: Option<String>,
}

/// Something a CUDA plugin under test can do beyond the baseline every CRIU CUDA plugin has
/// (lock, checkpoint, restore and unlock each CUDA task through the `cuda-checkpoint` utility,
/// and put the tasks back when a dump fails). A scenario needs a set of them; a plugin declares
/// the set it has; a scenario that needs one the plugin lacks is "not applicable" to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Capability {
    /// Takes options (`--plugin-option NAME.KEY=VALUE`, `CRIU_PLUGIN_OPTIONS` on CRIU 4.1/4.2).
    PluginOptions,
    /// Can checkpoint through the driver API (`cuCheckpointProcess*` in libcuda).
    DriverApi,
    /// Restores onto other GPUs than the dumped ones (a device map, given or automatic).
    DeviceMap,
    /// Bounds each driver call or utility run with a timeout of its own (an option).
    CallTimeout,
    /// Restores a task that was LOCKED or CHECKPOINTED before the dump in that state.
    RestoreAsDumped,
    /// Keeps its own files in the image (per-task state, a GPU inventory) that scenarios
    /// damage, remove or stream.
    CustomStorage,
    /// Does the work of all a tree's tasks concurrently (one hook call for the whole tree).
    Parallel,
}

impl Capability {
    /// Every capability.
    pub const ALL: [Capability; 7] = [
        Self::PluginOptions,
        Self::DriverApi,
        Self::DeviceMap,
        Self::CallTimeout,
        Self::RestoreAsDumped,
        Self::CustomStorage,
        Self::Parallel,
    ];

    /// The name used in scenario files and on the command line.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::PluginOptions => "plugin-options",
            Self::DriverApi => "driver-api",
            Self::DeviceMap => "device-map",
            Self::CallTimeout => "call-timeout",
            Self::RestoreAsDumped => "restore-as-dumped",
            Self::CustomStorage => "custom-storage",
            Self::Parallel => "parallel",
        }
    }
}

impl Capability {
    /// What it means, in a few words (the reason given when a scenario declares it).
    #[must_use]
    pub const fn describe(self) -> &'static str {
        match self {
            Self::PluginOptions => "takes plugin options",
            Self::DriverApi => "checkpoints through the driver API",
            Self::DeviceMap => "restores onto other GPUs",
            Self::CallTimeout => "bounds each call with its own timeout",
            Self::RestoreAsDumped => {
                "restores a task locked or checkpointed before the dump as it was"
            }
            Self::CustomStorage => "keeps its own image files",
            Self::Parallel => "works on a tree's tasks concurrently",
        }
    }
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Capability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                let all: Vec<&str> = Self::ALL.iter().map(|c| c.name()).collect();
                format!("unknown capability `{s}` (one of: {})", all.join(", "))
            })
    }
}

/// The namespace of the CUDA plugin's options in scenario files.
pub const OPTION_NAMESPACE: &str = "cuda_plugin";

/// `cuda_plugin.KEY=VALUE` -> (KEY, VALUE); `None` for another plugin's option.
#[must_use]
pub fn cuda_option(o: &str) -> Option<(&str, &str)> {
    let rest = o.strip_prefix(OPTION_NAMESPACE)?.strip_prefix('.')?;
    Some(rest.split_once('=').unwrap_or((rest, "")))
}

/// The process tree.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Tasks, root first.
    pub tasks: Vec<TaskSpec>,
    /// New namespaces the root starts in (module documentation, "Namespaces").
    #[serde(default)]
    pub namespaces: Vec<Namespace>,
}

impl Workload {
    /// Whether the tree starts in a new namespace of kind `ns`.
    #[must_use]
    pub fn has(&self, ns: Namespace) -> bool {
        self.namespaces.contains(&ns)
    }
}

/// A namespace kind a tree can start in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Namespace {
    /// A new pid namespace; the root is its init (pid 1).
    Pid,
    /// A new mount namespace.
    Mount,
}

/// What `expect.host_pids` requires of the tasks' host pids after the last restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostPids {
    /// Every task has another host pid than at the start, and the same namespace pid.
    Changed,
    /// Every task has the host pid it started with.
    Kept,
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
    /// GiB allocated per GPU by a CUDA task, instead of `kib` (virtual device memory).
    #[serde(default)]
    pub gib: Option<f64>,
    /// Milliseconds of the kernel a CUDA task keeps in flight (`mock-cuda-app --kernel-ms`).
    #[serde(default)]
    pub kernel_ms: Option<u64>,
    /// The collective a CUDA task is a member of (`mock-cuda-app --collective NAME:SIZE`, the
    /// size being how many tasks of the scenario name it): its lock completes only once every
    /// member has a lock requested, as an NCCL rank's kernel waits for its peers.
    #[serde(default)]
    pub collective: Option<String>,
    /// Extra environment of the task (e.g. `CUDA_VISIBLE_DEVICES`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Run the task under a seccomp filter, as in a container (`mock-cuda-app --seccomp`: it
    /// checks at every data check that the filter is still in force).
    #[serde(default)]
    pub seccomp: bool,
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
    /// Emulated engine only: issue CRIU proposal #3105's sentinel calls (CHECKPOINT_DEVICES(-1)
    /// and RESUME_DEVICES_LATE(-1) after the per-task loops; the engine's `--device-sentinel`).
    #[serde(default)]
    pub sentinel: bool,
    /// Whether a `cuda-checkpoint` is in the `PATH` of the steps (default true).
    #[serde(default = "yes")]
    pub cuda_checkpoint: bool,
    /// Whether `CRIU_CUDA_FORCE_ENABLE=1` is set for the steps (default true: no GPU here).
    #[serde(default = "yes")]
    pub force_enable: bool,
    /// Root only: the image directory is a tmpfs of this many KiB, mounted before the first
    /// step and unmounted at the end (a full image filesystem).
    #[serde(default)]
    pub image_fs_kib: Option<u64>,
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
    /// `cuda` only: the `.so` to install (absolute, or relative to the workspace) instead of
    /// the CUDA plugin under test.
    #[serde(default)]
    pub path: Option<String>,
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
    /// Replace the mock world's config (`mock-world configure`), keeping its state: the world
    /// becomes "another host" (other GPU UUIDs, another order, fewer GPUs, another model).
    ReconfigureWorld,
    /// Delete an image (`name`) from the image directory, or from the stream with `--stream`.
    RemoveImage,
    /// Replace or patch an image (`name`) with `hex` bytes (`offset`, `truncate`).
    WriteImage,
    /// Replace an image (`name`) with something that is not a regular file (`kind`: `fifo`,
    /// `dev-zero` (a symbolic link to `/dev/zero`) or `directory`).
    SpecialImage,
    /// Send `signal` (`STOP`, `CONT`, ...) to `task`.
    Signal,
}

impl Action {
    /// Whether the harness carries the step out itself (no CRIU, no `cuda-checkpoint`).
    #[must_use]
    pub fn is_harness_side(self) -> bool {
        matches!(
            self,
            Action::ReconfigureWorld
                | Action::RemoveImage
                | Action::WriteImage
                | Action::SpecialImage
                | Action::Signal
        )
    }
}

/// The expected result of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Exit status 0.
    Ok,
    /// Exit status 1.
    Fail,
    /// Either: the scenario's `[invariants]` judge what follows (the last step only).
    Any,
}

/// One step.
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
    /// Extra `--plugin-option`s for this step, after the scenario's (a repeated option
    /// overrides: the plugin takes the last).
    #[serde(default)]
    pub options: Vec<String>,
    /// Extra environment of this step's process (CRIU, the engine, `cuda-checkpoint`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Expected result (required except for harness-side steps, which must succeed).
    #[serde(default)]
    pub expect: Option<Outcome>,
    /// A substring the engine log must contain.
    #[serde(default)]
    pub error: Option<String>,
    /// Substrings the step's log must contain.
    #[serde(default)]
    pub log: Vec<String>,
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
    /// `reconfigure-world` steps: the keys replacing the scenario's `[world]` keys.
    #[serde(default)]
    pub world: Option<toml::Table>,
    /// Image steps: the file name in the image directory.
    #[serde(default)]
    pub name: Option<String>,
    /// `write-image`: the bytes, in hex (whitespace and `_` ignored).
    #[serde(default)]
    pub hex: Option<String>,
    /// `write-image`: overwrite from this offset instead of replacing the whole image.
    #[serde(default)]
    pub offset: Option<u64>,
    /// `write-image`: keep only the first N bytes (after any overwrite); a negative N drops the
    /// last -N bytes.
    #[serde(default)]
    pub truncate: Option<i64>,
    /// `write-image`: start from the bytes of this other image of the directory (`{task}` as in
    /// `name`) instead of the image's own.
    #[serde(default)]
    pub from: Option<String>,
    /// `write-image`: replace the first occurrence of the first string with the second (the
    /// first must occur).
    #[serde(default)]
    pub replace: Option<[String; 2]>,
    /// `special-image`: what replaces the image.
    #[serde(default)]
    pub kind: Option<SpecialKind>,
    /// `signal`: the signal's name without `SIG` (`STOP`, `CONT`, `KILL`, ...).
    #[serde(default)]
    pub signal: Option<String>,
    /// CRIU's `--timeout` (seconds) for this step (default: CRIU's own, 10).
    #[serde(default)]
    pub criu_timeout: Option<u32>,
    /// A post-dump action script (shell text) for this step (`--action-script`).
    #[serde(default)]
    pub action_script: Option<String>,
    /// The step must end within this many seconds (a bounded-time expectation).
    #[serde(default)]
    pub within: Option<f64>,
    /// Substrings the step's log must not contain.
    #[serde(default)]
    pub absent: Vec<String>,
    /// CRIU steps: this many seconds into the step, the harness creates the world's `release`
    /// file (what a `hang` fault with `file = "release"` waits for).
    #[serde(default)]
    pub release_after: Option<f64>,
}

/// What a `special-image` step puts in place of an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpecialKind {
    /// A named pipe nobody writes to (a plain `open` would block).
    Fifo,
    /// A symbolic link to `/dev/zero` (endless data).
    DevZero,
    /// A directory.
    Directory,
}

impl Step {
    /// The expected result (`ok` when omitted on a harness-side step).
    #[must_use]
    pub fn outcome(&self) -> Outcome {
        self.expect.unwrap_or(Outcome::Ok)
    }
}

/// Decodes `hex` (whitespace and `_` ignored).
///
/// # Errors
/// A character that is not a hex digit, or an odd number of digits.
pub fn decode_hex(hex: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = hex
        .bytes()
        .filter(|b| !b.is_ascii_whitespace() && *b != b'_')
        .map(|b| match b {
            b'0'..=b'9' => Ok(b - b'0'),
            b'a'..=b'f' => Ok(b - b'a' + 10),
            b'A'..=b'F' => Ok(b - b'A' + 10),
            other => Err(format!("{:?} is not a hex digit", char::from(other))),
        })
        .collect::<Result<_, _>>()?;
    if !digits.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits ({})", digits.len()));
    }
    Ok(digits.chunks(2).map(|p| (p[0] << 4) | p[1]).collect())
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
    /// The GPU UUIDs each task's PASS line reports after the last step (allocation order).
    #[serde(default)]
    pub gpus: BTreeMap<String, Vec<String>>,
    /// The GPU UUIDs each task's READY line reported when it started.
    #[serde(default)]
    pub start_gpus: BTreeMap<String, Vec<String>>,
    /// How the tasks' host pids compare with those they started with.
    #[serde(default)]
    pub host_pids: Option<HostPids>,
    /// Glob patterns (`*`, `?`) no file of the image directory may match after the last step.
    #[serde(default)]
    pub images_absent: Vec<String>,
}

/// Whether file name `name` matches the glob `pattern` (`*`: any run of characters, `?`: any
/// one character; nothing else is special), as `expect.images_absent` uses it.
#[must_use]
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
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
    /// Parses `text` (from `path`, for messages): a file without a `[matrix]`.
    ///
    /// # Errors
    /// Syntax errors, unknown keys, and inconsistent task or plugin lists; a file with a
    /// `[matrix]` (its variants are parsed with [`Scenario::parse_variants`]).
    pub fn parse(path: &str, text: &str) -> Result<Self, ScenarioError> {
        let mut all = Self::parse_variants(path, text)?;
        match (all.len(), all.first()) {
            (1, Some((v, _))) if *v == Variant::default() => Ok(all.remove(0).1),
            (n, _) => Err(ScenarioError::Invalid {
                path: path.to_owned(),
                message: format!("has a [matrix] of {n} variants: name one (NAME@VARIANT)"),
            }),
        }
    }

    /// Parses `text` (from `path`, for messages) into its variants ([`matrix`]): one,
    /// [`Variant::default`], for a file without a `[matrix]`.
    ///
    /// # Errors
    /// As [`Scenario::parse`] for any variant (the message names it), and a malformed matrix.
    pub fn parse_variants(path: &str, text: &str) -> Result<Vec<(Variant, Self)>, ScenarioError> {
        let parse_err = |message: String| ScenarioError::Parse {
            path: path.to_owned(),
            message,
        };
        let invalid = |message: String| ScenarioError::Invalid {
            path: path.to_owned(),
            message,
        };
        let table: toml::Table =
            toml::from_str(text).map_err(|e| parse_err(e.to_string().trim_end().to_owned()))?;
        let Some(variants) = matrix::expand(table).map_err(invalid)? else {
            // Parsed from the text, so that an error shows the line.
            let s: Self =
                toml::from_str(text).map_err(|e| parse_err(e.to_string().trim_end().to_owned()))?;
            s.validate().map_err(invalid)?;
            return Ok(vec![(Variant::default(), s)]);
        };
        variants
            .into_iter()
            .map(|(v, t)| {
                let at = |m: String| format!("variant {}: {m}", v.suffix());
                let s: Self = toml::Value::Table(t)
                    .try_into()
                    .map_err(|e: toml::de::Error| {
                        parse_err(at(e.to_string().trim_end().to_owned()))
                    })?;
                s.validate().map_err(|m| invalid(at(m)))?;
                Ok((v, s))
            })
            .collect()
    }

    /// Reads and parses a scenario file without a `[matrix]`.
    ///
    /// # Errors
    /// As [`Scenario::parse`], plus I/O.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        Self::load_variant(path, None)
    }

    /// Reads a scenario file and parses its variants.
    ///
    /// # Errors
    /// As [`Scenario::parse_variants`], plus I/O.
    pub fn load_variants(path: &Path) -> Result<Vec<(Variant, Self)>, ScenarioError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            path: shown.clone(),
            source,
        })?;
        Self::parse_variants(&shown, &text)
    }

    /// Reads a scenario file and parses the variant named by `suffix` (the part of a scenario's
    /// name after `@`; `None` for a file without a `[matrix]`).
    ///
    /// # Errors
    /// As [`Scenario::load_variants`], and a variant the file does not have.
    pub fn load_variant(path: &Path, suffix: Option<&str>) -> Result<Self, ScenarioError> {
        let all = Self::load_variants(path)?;
        let want = suffix.unwrap_or("");
        let names: Vec<String> = all.iter().map(|(v, _)| v.suffix()).collect();
        all.into_iter()
            .find(|(v, _)| v.suffix() == want)
            .map(|(_, s)| s)
            .ok_or_else(|| ScenarioError::Invalid {
                path: path.display().to_string(),
                message: match suffix {
                    None => format!(
                        "has a [matrix]: name one of its variants (NAME@VARIANT): {}",
                        names.join(", ")
                    ),
                    Some(x) => format!("has no variant `{x}` (it has: {})", names.join(", ")),
                },
            })
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
        if self.host.sentinel && self.host.engine == EngineKind::Criu {
            return Err(
                "host.sentinel is for the emulated engine (no released CRIU makes the #3105 \
                 sentinel calls)"
                    .to_owned(),
            );
        }
        for p in &self.plugins {
            if p.kind == PluginKind::Test && p.name.is_none() {
                return Err("a test plugin needs a `name`".to_owned());
            }
            if p.kind == PluginKind::Test && p.path.is_some() {
                return Err("`path` is for a `cuda` plugin entry".to_owned());
            }
            if p.path.as_deref().is_some_and(|x| !x.ends_with(".so")) {
                return Err("a plugin `path` must name a `.so`".to_owned());
            }
        }
        if self.steps.is_empty() {
            return Err("no steps".to_owned());
        }
        let ns = &self.workload.namespaces;
        if let Some(n) = ns
            .iter()
            .enumerate()
            .find_map(|(i, n)| ns[..i].contains(n).then_some(n))
        {
            return Err(format!("workload.namespaces: {n:?} is listed twice"));
        }
        if self.expect.host_pids.is_some()
            && !self.steps.iter().any(|s| s.action == Action::Restore)
        {
            return Err("expect.host_pids needs a restore step".to_owned());
        }
        if self.expect.host_pids == Some(HostPids::Changed) && !self.workload.has(Namespace::Pid) {
            return Err(
                "expect.host_pids = \"changed\" needs workload.namespaces with \"pid\"".to_owned(),
            );
        }
        if self.host.image_fs_kib == Some(0) {
            return Err("host.image_fs_kib must be at least 1".to_owned());
        }
        if let Some(p) = self
            .expect
            .images_absent
            .iter()
            .find(|p| p.is_empty() || p.contains('/'))
        {
            return Err(format!(
                "expect.images_absent: `{p}` is not a file name pattern (empty, or has a `/`)"
            ));
        }
        let any: Vec<usize> = (0..self.steps.len())
            .filter(|i| self.steps[*i].expect == Some(Outcome::Any))
            .collect();
        match (&self.invariants, any.as_slice()) {
            (None, []) => {}
            (None, [i, ..]) => {
                return Err(format!(
                    "step {i}: `expect = \"any\"` needs `[invariants]` to judge the run"
                ))
            }
            (Some(_), [i]) if *i + 1 == self.steps.len() => {}
            (Some(_), _) => {
                return Err(
                    "[invariants] judge the last step, which (alone) must be `expect = \"any\"`"
                        .to_owned(),
                )
            }
        }
        if let Some(inv) = &self.invariants {
            if self.expect != Expect::default() {
                return Err("[invariants] replace [expect]: give one or the other".to_owned());
            }
            let last = &self.steps[self.steps.len() - 1];
            if !matches!(last.action, Action::Dump | Action::Restore) {
                return Err("[invariants] judge a dump or a restore".to_owned());
            }
            for t in inv.task.iter().chain(&inv.foreign_lock) {
                if !seen.contains(&t.as_str()) {
                    return Err(format!("invariants: unknown task `{t}`"));
                }
            }
        }
        for (i, st) in self.steps.iter().enumerate() {
            self.validate_step(i, st)?;
            match (st.action, &st.task) {
                (Action::CudaCheckpoint | Action::Signal, Some(t))
                    if seen.contains(&t.as_str()) => {}
                (Action::CudaCheckpoint | Action::Signal, _) => {
                    return Err(format!(
                        "step {i}: {} needs a declared `task`",
                        name(st.action)
                    ))
                }
                (_, Some(_)) => {
                    return Err(format!(
                        "step {i}: only cuda-checkpoint and signal take a task"
                    ))
                }
                (_, None) => {}
            }
            if let Some(b) = &st.backend {
                if !["driver-api", "cuda-checkpoint", "none"].contains(&b.as_str()) {
                    return Err(format!("step {i}: unknown backend `{b}`"));
                }
            }
        }
        for name in self
            .expect
            .cuda_state
            .keys()
            .chain(&self.expect.dead)
            .chain(self.expect.gpus.keys())
            .chain(self.expect.start_gpus.keys())
        {
            if !seen.contains(&name.as_str()) {
                return Err(format!("expect: unknown task `{name}`"));
            }
        }
        for (name, st) in &self.expect.cuda_state {
            if !["running", "locked", "checkpointed", "failed", "none"].contains(&st.as_str()) {
                return Err(format!("expect.cuda_state.{name}: unknown state `{st}`"));
            }
        }
        for (name, gpus) in self.expect.gpus.iter().chain(&self.expect.start_gpus) {
            let task = self.workload.tasks.iter().find(|t| &t.name == name);
            if !task.is_some_and(|t| t.cuda) {
                return Err(format!("expect.gpus.{name}: not a CUDA task"));
            }
            if let Some(g) = gpus.iter().find(|g| !g.starts_with("GPU-")) {
                return Err(format!("expect.gpus.{name}: `{g}` is not a GPU UUID"));
            }
        }
        for t in &self.workload.tasks {
            if t.kib.is_some() && t.gib.is_some() {
                return Err(format!(
                    "task `{}`: `kib` and `gib` exclude each other",
                    t.name
                ));
            }
            if let Some(g) = t.gib {
                if !(g.is_finite() && g > 0.0) {
                    return Err(format!(
                        "task `{}`: gib = {g}: must be a positive number",
                        t.name
                    ));
                }
            }
            for (key, given) in [
                ("gib", t.gib.is_some()),
                ("kernel_ms", t.kernel_ms.is_some()),
                ("collective", t.collective.is_some()),
            ] {
                if given && !t.cuda {
                    return Err(format!("task `{}`: `{key}` needs `cuda = true`", t.name));
                }
            }
            if let Some(c) = &t.collective {
                if c.is_empty() || c.contains(':') || c.chars().any(char::is_whitespace) {
                    return Err(format!(
                        "task `{}`: collective = {c:?}: a name without `:` or spaces",
                        t.name
                    ));
                }
            }
            if let Some(k) = t.env.keys().find(|k| !is_env_name(k)) {
                return Err(format!(
                    "task `{}`: env: `{k}` is not a variable name",
                    t.name
                ));
            }
        }
        Ok(())
    }

    fn validate_step(&self, i: usize, st: &Step) -> Result<(), String> {
        let key = |k: &str, present: bool, allowed: bool| {
            if present && !allowed {
                Err(format!(
                    "step {i}: `{k}` is not a key of a `{}` step",
                    name(st.action)
                ))
            } else if !present && allowed && ["world", "name"].contains(&k) {
                Err(format!(
                    "step {i}: a `{}` step needs `{k}`",
                    name(st.action)
                ))
            } else {
                Ok(())
            }
        };
        let harness = st.action.is_harness_side();
        let image = matches!(
            st.action,
            Action::RemoveImage | Action::WriteImage | Action::SpecialImage
        );
        key(
            "world",
            st.world.is_some(),
            st.action == Action::ReconfigureWorld,
        )?;
        key("name", st.name.is_some(), image)?;
        let write = st.action == Action::WriteImage;
        key("hex", st.hex.is_some(), write)?;
        key("offset", st.offset.is_some(), write)?;
        key("truncate", st.truncate.is_some(), write)?;
        key("from", st.from.is_some(), write)?;
        key("replace", st.replace.is_some(), write)?;
        key("kind", st.kind.is_some(), st.action == Action::SpecialImage)?;
        if st.action == Action::SpecialImage && st.kind.is_none() {
            return Err(format!("step {i}: a `special-image` step needs `kind`"));
        }
        key("signal", st.signal.is_some(), st.action == Action::Signal)?;
        if st.action == Action::Signal {
            let sig = st.signal.as_deref().unwrap_or_default();
            if format!("SIG{sig}")
                .parse::<nix::sys::signal::Signal>()
                .is_err()
            {
                return Err(format!(
                    "step {i}: `{sig}` is not a signal name (STOP, CONT, ...)"
                ));
            }
            if st.task.is_none() {
                return Err(format!("step {i}: a `signal` step needs `task`"));
            }
        }
        let criu = matches!(st.action, Action::Dump | Action::PreDump | Action::Restore);
        key("criu_timeout", st.criu_timeout.is_some(), criu)?;
        key(
            "action_script",
            st.action_script.is_some(),
            st.action == Action::Dump,
        )?;
        key("within", st.within.is_some(), !harness)?;
        key("absent", !st.absent.is_empty(), !harness)?;
        key("release_after", st.release_after.is_some(), criu)?;
        if st.release_after.is_some_and(|w| !(w > 0.0 && w < 600.0)) {
            return Err(format!(
                "step {i}: `release_after` must be between 0 and 600 seconds"
            ));
        }
        if st.within.is_some_and(|w| !(w > 0.0 && w < 600.0)) {
            return Err(format!(
                "step {i}: `within` must be between 0 and 600 seconds"
            ));
        }
        for (k, present) in [
            ("leave_running", st.leave_running),
            ("stream", st.stream),
            ("options", !st.options.is_empty()),
            ("env", !st.env.is_empty()),
            ("error", st.error.is_some()),
            ("log", !st.log.is_empty()),
            ("backend", st.backend.is_some()),
        ] {
            key(k, present, !harness)?;
        }
        match (harness, st.expect) {
            (false, None) => return Err(format!("step {i}: `expect` is missing")),
            (true, Some(Outcome::Fail)) => {
                return Err(format!(
                    "step {i}: a `{}` step cannot be expected to fail",
                    name(st.action)
                ))
            }
            _ => {}
        }
        if st.action == Action::ReconfigureWorld && self.world.is_none() {
            return Err(format!(
                "step {i}: reconfigure-world needs a scenario `[world]`"
            ));
        }
        for n in st.name.iter().chain(&st.from) {
            if n.is_empty() || n.contains('/') || n == "." || n == ".." {
                return Err(format!("step {i}: name `{n}` is not a file name"));
            }
            // `{task}` stands for that task's pid at the dump.
            let mut rest = n.as_str();
            while let Some(open) = rest.find('{') {
                let close = rest[open..]
                    .find('}')
                    .ok_or_else(|| format!("step {i}: name `{n}`: unclosed `{{`"))?;
                let task = &rest[open + 1..open + close];
                if !self.workload.tasks.iter().any(|t| t.name == task) {
                    return Err(format!("step {i}: name `{n}`: no task `{task}`"));
                }
                rest = &rest[open + close + 1..];
            }
        }
        if write {
            let bytes = st
                .hex
                .as_deref()
                .map(decode_hex)
                .transpose()
                .map_err(|e| format!("step {i}: hex: {e}"))?;
            if st.offset.is_some() && bytes.is_none() {
                return Err(format!("step {i}: `offset` needs `hex`"));
            }
            if bytes.is_none() && st.truncate.is_none() && st.from.is_none() && st.replace.is_none()
            {
                return Err(format!(
                    "step {i}: write-image needs `hex`, `truncate`, `from` or `replace`"
                ));
            }
            if st.replace.as_ref().is_some_and(|[a, _]| a.is_empty()) {
                return Err(format!("step {i}: `replace` needs a string to replace"));
            }
        }
        if let Some(k) = st.env.keys().find(|k| !is_env_name(k)) {
            return Err(format!("step {i}: env: `{k}` is not a variable name"));
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
            || !self.expect.gpus.is_empty()
            || !self.expect.start_gpus.is_empty()
            || self.expect.gpu_data_verified.is_some()
            || self.steps.iter().any(|s| {
                s.backend.is_some()
                    || matches!(s.action, Action::CudaCheckpoint | Action::ReconfigureWorld)
            })
    }

    /// A rough measure of how long the scenario runs, to start the long ones first: modelled
    /// GPU memory (its transfers take their time) counts most, then the CUDA tasks of each
    /// CRIU step and the hung calls it waits out.
    #[must_use]
    pub fn cost_hint(&self) -> u64 {
        let gib: f64 = self
            .workload
            .tasks
            .iter()
            .filter_map(|t| {
                t.gib
                    .map(|g| g * t.gpus.as_ref().map_or(1, Vec::len) as f64)
            })
            .sum();
        let cuda = self.workload.tasks.iter().filter(|t| t.cuda).count() as u64;
        let criu_steps = self
            .steps
            .iter()
            .filter(|s| matches!(s.action, Action::Dump | Action::Restore | Action::PreDump))
            .count() as u64;
        let hangs = [self.world.as_ref()]
            .into_iter()
            .chain(self.steps.iter().map(|s| s.world.as_ref()))
            .flatten()
            .filter_map(|w| w.get("fault")?.as_array().cloned())
            .flatten()
            .filter(|f| {
                f.get("action")
                    .and_then(|a| a.get("kind"))
                    .and_then(toml::Value::as_str)
                    .is_some_and(|k| matches!(k, "hang" | "delay"))
            })
            .count() as u64;
        (gib as u64) * 10 + cuda * criu_steps + hangs * 20
    }

    /// Whether the plugin directory holds the CUDA plugin (the plugin under test).
    #[must_use]
    pub fn uses_cuda_plugin(&self) -> bool {
        self.plugins.iter().any(|p| p.kind == PluginKind::Cuda)
    }

    /// Every `cuda_plugin.*` option of the scenario and its steps, in order.
    fn cuda_options(&self) -> impl Iterator<Item = (&str, &str)> {
        self.options
            .iter()
            .chain(self.steps.iter().flat_map(|s| &s.options))
            .filter_map(|o| cuda_option(o))
    }

    /// The capabilities the CUDA plugin under test needs for this scenario, each with why: those
    /// declared in `requires`, and those its content implies:
    ///
    /// * a `cuda_plugin.backend=driver-api` option, a step or `[expect]` `backend =
    ///   "driver-api"`, or a fault on a driver-API function (`cuCheckpointProcess*`):
    ///   `driver-api`;
    /// * `cuda_plugin.device-map`: `device-map`; `cuda_plugin.timeout`: `call-timeout`; both, and
    ///   every other `cuda_plugin.*` option except a `backend` of `driver-api`,
    ///   `cuda-checkpoint` or `auto` (a plugin without options simply has that backend or not,
    ///   and `auto` is the default): also `plugin-options`;
    /// * a step that removes, rewrites or replaces one of the plugin's image files (`cuda-*`):
    ///   `custom-storage`;
    /// * `[expect] gpus` naming a GPU the scenario's `[world]` did not have at the dump (the
    ///   tasks restore onto another host's GPUs): `device-map`.
    #[must_use]
    pub fn requirements(&self) -> BTreeMap<Capability, String> {
        let mut need: BTreeMap<Capability, String> = BTreeMap::new();
        let mut add = |c: Capability, why: String| {
            need.entry(c).or_insert(why);
        };
        for c in &self.requires {
            add(*c, format!("declared: {}", c.describe()));
        }
        for (key, value) in self.cuda_options() {
            let shown = format!("sets {OPTION_NAMESPACE}.{key}");
            match (key, value) {
                ("backend", "driver-api") => add(Capability::DriverApi, format!("{shown}={value}")),
                // The utility (every plugin has it), or the default: nothing to ask for.
                ("backend", "cuda-checkpoint" | "auto") => {}
                ("device-map", _) => {
                    add(Capability::DeviceMap, shown.clone());
                    add(Capability::PluginOptions, shown);
                }
                ("timeout", _) => {
                    add(Capability::CallTimeout, shown.clone());
                    add(Capability::PluginOptions, shown);
                }
                // One at a time is what every plugin does.
                ("parallel", "1") => add(Capability::PluginOptions, shown),
                ("parallel", _) => {
                    add(Capability::Parallel, format!("{shown}={value}"));
                    add(Capability::PluginOptions, shown);
                }
                _ => add(Capability::PluginOptions, shown),
            }
        }
        let expects_driver_api = self.expect.backend.as_deref() == Some("driver-api")
            || self
                .steps
                .iter()
                .any(|s| s.backend.as_deref() == Some("driver-api"));
        if expects_driver_api {
            add(
                Capability::DriverApi,
                "expects the driver-api backend".to_owned(),
            );
        }
        let worlds = self
            .world
            .iter()
            .chain(self.steps.iter().filter_map(|s| s.world.as_ref()));
        for w in worlds {
            let faults = w.get("fault").and_then(toml::Value::as_array);
            for f in faults.into_iter().flatten() {
                if let Some(func) = f.get("function").and_then(toml::Value::as_str) {
                    if func.starts_with("cuCheckpointProcess") {
                        add(Capability::DriverApi, format!("faults {func}"));
                    }
                }
            }
        }
        // Data that must end on a GPU the dump's host did not have: restored onto another host.
        let dumped_on: Vec<&str> = self
            .world
            .as_ref()
            .and_then(|w| w.get("gpu"))
            .and_then(toml::Value::as_array)
            .map(|gpus| {
                gpus.iter()
                    .filter_map(|g| g.get("uuid").and_then(toml::Value::as_str))
                    .collect()
            })
            .unwrap_or_default();
        let moved = self.expect.gpus.iter().find_map(|(task, gpus)| {
            gpus.iter()
                .find(|g| !dumped_on.is_empty() && !dumped_on.contains(&g.as_str()))
                .map(|g| (task, g))
        });
        if let Some((task, g)) = moved {
            add(
                Capability::DeviceMap,
                format!("task {task} must end on {g}, another host's GPU"),
            );
        }
        for st in &self.steps {
            let image = matches!(
                st.action,
                Action::RemoveImage | Action::WriteImage | Action::SpecialImage
            );
            if let (true, Some(n)) = (image, &st.name) {
                if n.starts_with("cuda-") {
                    add(Capability::CustomStorage, format!("edits {n}"));
                }
            }
        }
        need
    }

    /// The backend the scenario pins, if any: the first `driver-api` or `cuda-checkpoint` a step
    /// (or `[expect]`) expects, else the value of its first `cuda_plugin.backend` option
    /// (`auto` or an invalid one included). A scenario that pins none runs with either.
    #[must_use]
    pub fn pinned_backend(&self) -> Option<&str> {
        let known = |b: &&str| ["driver-api", "cuda-checkpoint"].contains(b);
        self.steps
            .iter()
            .filter_map(|s| s.backend.as_deref())
            .chain(self.expect.backend.as_deref())
            .find(known)
            .or_else(|| {
                self.cuda_options()
                    .find(|(k, _)| *k == "backend")
                    .map(|(_, v)| v)
            })
    }
}

/// The action's name as written in scenario files.
#[must_use]
pub fn name(a: Action) -> &'static str {
    match a {
        Action::Dump => "dump",
        Action::PreDump => "pre-dump",
        Action::Restore => "restore",
        Action::CudaCheckpoint => "cuda-checkpoint",
        Action::ReconfigureWorld => "reconfigure-world",
        Action::RemoveImage => "remove-image",
        Action::WriteImage => "write-image",
        Action::SpecialImage => "special-image",
        Action::Signal => "signal",
    }
}

fn is_env_name(k: &str) -> bool {
    !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
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
    fn image_fs_and_absent_images_parse_and_are_checked() {
        let text = MINIMAL.replace("profile = \"4.1\"", "profile = \"4.1\"\nimage_fs_kib = 64")
            + "[expect]\nimages_absent = [\"cuda-cs-*\", \"x?.img\"]\n";
        let s = Scenario::parse("s.toml", &text).unwrap();
        assert_eq!(s.host.image_fs_kib, Some(64));
        assert_eq!(s.expect.images_absent, ["cuda-cs-*", "x?.img"]);
        let s = Scenario::parse("m.toml", MINIMAL).unwrap();
        assert_eq!(s.host.image_fs_kib, None);
        assert!(s.expect.images_absent.is_empty());
        for (bad, why) in [
            (
                MINIMAL.replace("profile = \"4.1\"", "profile = \"4.1\"\nimage_fs_kib = 0"),
                "image_fs_kib must be at least 1",
            ),
            (
                format!("{MINIMAL}[expect]\nimages_absent = [\"img/cuda-*\"]\n"),
                "not a file name pattern",
            ),
            (
                format!("{MINIMAL}[expect]\nimages_absent = [\"\"]\n"),
                "not a file name pattern",
            ),
            (
                MINIMAL.replace("profile = \"4.1\"", "profile = \"4.1\"\nimage_fs_kib = -1"),
                "image_fs_kib",
            ),
        ] {
            let e = Scenario::parse("dir/s.toml", &bad).unwrap_err().to_string();
            assert!(
                e.starts_with("dir/s.toml: ") && e.contains(why),
                "{why}: {e}"
            );
        }
    }

    #[test]
    fn glob_matches_stars_and_question_marks_only() {
        for (p, n, want) in [
            ("cuda-cs-*", "cuda-cs-123-0.img", true),
            ("cuda-cs-*", "cuda-cs-", true),
            ("cuda-cs-*", "cuda-plugin-1.img", false),
            ("*.img", "pages-1.img", true),
            ("*.img", "pages-1.img.tmp", false),
            ("cuda-cs-*-1.img", "cuda-cs-77-1.img", true),
            ("cuda-cs-*-1.img", "cuda-cs-77-0.img", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("[ab]", "a", false),
            ("[ab]", "[ab]", true),
            ("*", "", true),
            ("", "", true),
        ] {
            assert_eq!(glob_match(p, n), want, "{p} ~ {n}");
        }
    }

    #[test]
    fn world_is_kept_verbatim_and_marks_cuda() {
        let text = format!("{MINIMAL}[world]\ndriver_version = 580\n[world.gpus]\ncount = 2\n");
        let s = Scenario::parse("s.toml", &text).unwrap();
        let w = s.world.as_ref().unwrap();
        assert_eq!(w["driver_version"].as_integer(), Some(580));
        assert!(s.needs_cuda());
    }

    const MAP: &str = r#"
description = "x"
[world]
driver = { branch = 580 }
[workload]
tasks = [{ name = "root", cuda = true, gpus = [0, 1], env = { CUDA_VISIBLE_DEVICES = "1,0" } }]
[host]
engine = "emulated"
profile = "pr3076"
[[steps]]
action = "dump"
expect = "ok"
env = { CUDA_VISIBLE_DEVICES = "1" }
log = ["is ignored"]
[[steps]]
action = "reconfigure-world"
world = { gpu = [] }
[[steps]]
action = "write-image"
name = "cuda-gpu-inventory.img"
offset = 8
hex = "02 00_00 00"
[[steps]]
action = "remove-image"
name = "cuda-gpu-inventory.img"
[[steps]]
action = "restore"
expect = "fail"
options = ["cuda_plugin.device-map=0=1,1=0"]
[expect]
gpus = { root = ["GPU-b1111111-1111-4111-8111-111111111111"] }
start_gpus = { root = ["GPU-a1111111-1111-4111-8111-111111111111"] }
"#;

    #[test]
    fn device_map_steps_and_expectations_parse() {
        let s = Scenario::parse("m.toml", MAP).unwrap();
        assert_eq!(s.steps[1].action, Action::ReconfigureWorld);
        assert!(s.steps[1].action.is_harness_side());
        assert_eq!(s.steps[1].outcome(), Outcome::Ok);
        assert_eq!(
            s.steps[2].hex.as_deref().map(decode_hex),
            Some(Ok(vec![2, 0, 0, 0]))
        );
        assert_eq!(s.steps[4].outcome(), Outcome::Fail);
        assert_eq!(s.workload.tasks[0].env["CUDA_VISIBLE_DEVICES"], "1,0");
        assert_eq!(s.expect.gpus["root"].len(), 1);
        assert!(s.needs_cuda());
    }

    #[test]
    fn device_map_steps_are_validated_naming_file_and_key() {
        for (from, to, key) in [
            ("world = { gpu = [] }", "", "needs `world`"),
            (
                "name = \"cuda-gpu-inventory.img\"\noffset",
                "offset",
                "needs `name`",
            ),
            ("hex = \"02 00_00 00\"", "hex = \"0g\"", "hex"),
            ("hex = \"02 00_00 00\"", "hex = \"020\"", "odd number"),
            ("hex = \"02 00_00 00\"", "", "`offset` needs `hex`"),
            (
                "name = \"cuda-gpu-inventory.img\"\n[[steps]]\naction = \"restore\"",
                "name = \"../x\"\n[[steps]]\naction = \"restore\"",
                "not a file name",
            ),
            (
                "action = \"reconfigure-world\"",
                "action = \"reconfigure-world\"\nexpect = \"fail\"",
                "cannot be expected to fail",
            ),
            (
                "action = \"reconfigure-world\"",
                "action = \"reconfigure-world\"\nstream = true",
                "`stream`",
            ),
            (
                "action = \"dump\"\nexpect = \"ok\"",
                "action = \"dump\"",
                "`expect` is missing",
            ),
            (
                "action = \"dump\"\nexpect = \"ok\"",
                "action = \"dump\"\nexpect = \"ok\"\nname = \"x\"",
                "`name`",
            ),
            ("gpus = { root", "gpus = { nobody", "nobody"),
            (
                "[\"GPU-b1111111-1111-4111-8111-111111111111\"]",
                "[\"b1\"]",
                "not a GPU UUID",
            ),
            (
                "env = { CUDA_VISIBLE_DEVICES = \"1\" }",
                "env = { \"A-B\" = \"1\" }",
                "A-B",
            ),
            (
                "[world]\ndriver = { branch = 580 }\n",
                "",
                "needs a scenario `[world]`",
            ),
        ] {
            assert!(MAP.contains(from), "{from}");
            let text = MAP.replacen(from, to, 1);
            let e = Scenario::parse("dir/m.toml", &text)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("dir/m.toml: "), "{e}");
            assert!(e.contains(key), "{key}: {e}");
        }
        let e = Scenario::parse("m.toml", &MAP.replace("hex = ", "hexx = ")).unwrap_err();
        assert!(e.to_string().contains("hexx"), "{e}");
    }

    #[test]
    fn cuda_tasks_take_sizes_in_gib_kernels_in_flight_and_collectives() {
        let text = MINIMAL.replace(
            "{ name = \"c\", parent = \"root\", threads = 2 }",
            "{ name = \"c\", parent = \"root\", cuda = true, gib = 80, kernel_ms = 500 }",
        );
        let s = Scenario::parse("s.toml", &text).unwrap();
        assert_eq!(s.workload.tasks[1].gib, Some(80.0));
        assert_eq!(s.workload.tasks[1].kernel_ms, Some(500));
        let text = MINIMAL.replace("threads = 2", "cuda = true, collective = \"tp\"");
        let s = Scenario::parse("s.toml", &text).unwrap();
        assert_eq!(s.workload.tasks[1].collective.as_deref(), Some("tp"));
        for (task, why) in [
            ("cuda = true, gib = 80, kib = 4", "exclude each other"),
            ("cuda = true, gib = -1.5", "must be a positive number"),
            ("gib = 80", "`gib` needs `cuda = true`"),
            ("kernel_ms = 500", "`kernel_ms` needs `cuda = true`"),
            ("cuda = true, kernel_ms = -5", "kernel_ms"),
            ("collective = \"tp\"", "`collective` needs `cuda = true`"),
            ("cuda = true, collective = \"tp:8\"", "a name without `:`"),
            ("cuda = true, collective = \"\"", "a name without `:`"),
        ] {
            let bad = MINIMAL.replace("threads = 2", task);
            let e = Scenario::parse("dir/s.toml", &bad).unwrap_err().to_string();
            assert!(
                e.starts_with("dir/s.toml: ") && e.contains(why),
                "{why}: {e}"
            );
        }
    }

    #[test]
    fn namespaces_and_host_pid_expectations_parse_and_are_checked() {
        let with = |ns: &str, expect: &str| {
            let text = MINIMAL.replace("[host]", &format!("namespaces = {ns}\n[host]"))
                + "[[steps]]\naction = \"restore\"\nexpect = \"ok\"\n"
                + expect;
            Scenario::parse("dir/s.toml", &text).map_err(|e| e.to_string())
        };
        let s = with(
            "[\"pid\", \"mount\"]",
            "[expect]\nhost_pids = \"changed\"\n",
        )
        .unwrap();
        assert!(s.workload.has(Namespace::Pid) && s.workload.has(Namespace::Mount));
        assert_eq!(s.expect.host_pids, Some(HostPids::Changed));
        let s = with("[\"mount\"]", "[expect]\nhost_pids = \"kept\"\n").unwrap();
        assert!(!s.workload.has(Namespace::Pid));
        assert!(Scenario::parse("m.toml", MINIMAL)
            .unwrap()
            .workload
            .namespaces
            .is_empty());
        for (ns, expect, why) in [
            ("[\"net\"]", "", "net"),
            ("[\"pid\", \"pid\"]", "", "listed twice"),
            (
                "[\"mount\"]",
                "[expect]\nhost_pids = \"changed\"\n",
                "needs workload.namespaces",
            ),
            ("[\"pid\"]", "[expect]\nhost_pids = \"moved\"\n", "moved"),
        ] {
            let e = with(ns, expect).unwrap_err();
            assert!(
                e.starts_with("dir/s.toml: ") && e.contains(why),
                "{why}: {e}"
            );
        }
        let e = Scenario::parse(
            "s.toml",
            &format!("{MINIMAL}[expect]\nhost_pids = \"kept\"\n"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("needs a restore step"), "{e}");
    }

    #[test]
    fn parallel_mode_needs_the_parallel_capability() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/cuda/parallel");
        let name = "batch-of-8-dumps-and-restores.toml";
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        let variant = |text: &str| {
            Scenario::parse_variants(name, text)
                .unwrap()
                .into_iter()
                .find(|(v, _)| v.suffix() == "emulated-pr3076,driver-api")
                .unwrap()
                .1
        };
        let need = variant(&text).requirements();
        assert_eq!(
            need.get(&Capability::Parallel).map(String::as_str),
            Some("sets cuda_plugin.parallel=auto")
        );
        assert!(need.contains_key(&Capability::PluginOptions));
        let one = text.replace("parallel=auto", "parallel=1");
        let need = variant(&one).requirements();
        assert!(!need.contains_key(&Capability::Parallel), "one at a time");
    }

    #[test]
    fn requirements_are_declared_or_implied_and_backends_pinned() {
        let s = Scenario::parse("m.toml", MAP).unwrap();
        let need = s.requirements();
        // device-map option on a step, data that must end on another host's GPU.
        assert_eq!(
            need.keys().copied().collect::<Vec<_>>(),
            [
                Capability::PluginOptions,
                Capability::DeviceMap,
                Capability::CustomStorage
            ]
        );
        assert_eq!(need[&Capability::DeviceMap], "sets cuda_plugin.device-map");
        assert_eq!(
            need[&Capability::CustomStorage],
            "edits cuda-gpu-inventory.img"
        );
        assert_eq!(s.pinned_backend(), None);

        let text = format!(
            "requires = [\"restore-as-dumped\"]\noptions = [\"cuda_plugin.backend=cuda-checkpoint\", \"other.x=1\"]\n{MINIMAL}\
             [[plugins]]\nkind = \"cuda\"\n[world]\n[[world.fault]]\nfunction = \"cuCheckpointProcessLock\"\n\
             action = {{ kind = \"hang\" }}\n"
        );
        let s = Scenario::parse("r.toml", &text).unwrap();
        let need = s.requirements();
        assert_eq!(
            need.keys().copied().collect::<Vec<_>>(),
            [Capability::DriverApi, Capability::RestoreAsDumped]
        );
        assert_eq!(
            need[&Capability::DriverApi],
            "faults cuCheckpointProcessLock"
        );
        assert!(need[&Capability::RestoreAsDumped].starts_with("declared: "));
        assert_eq!(s.pinned_backend(), Some("cuda-checkpoint"));
        assert!(s.uses_cuda_plugin());

        // A step expecting a backend pins it before any option does.
        let text = MAP.replace(
            "env = { CUDA_VISIBLE_DEVICES = \"1\" }",
            "env = { CUDA_VISIBLE_DEVICES = \"1\" }\nbackend = \"driver-api\"",
        );
        let s = Scenario::parse("m.toml", &text).unwrap();
        assert_eq!(s.pinned_backend(), Some("driver-api"));
        assert!(s.requirements().contains_key(&Capability::DriverApi));

        let e = Scenario::parse("x.toml", &format!("requires = [\"teleport\"]\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("teleport"), "{e}");
        let e = Scenario::parse(
            "x.toml",
            &format!("{MINIMAL}[[plugins]]\nkind = \"cuda\"\npath = \"x.txt\"\n"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("`.so`"), "{e}");
        assert_eq!(
            "device-map".parse::<Capability>(),
            Ok(Capability::DeviceMap)
        );
        for c in Capability::ALL {
            assert_eq!(c.name().parse::<Capability>(), Ok(c));
        }
    }

    #[test]
    fn inconsistent_content_is_rejected() {
        let bad_parent = MINIMAL.replace("parent = \"root\"", "parent = \"nobody\"");
        assert!(Scenario::parse("s", &bad_parent).is_err());
        let bad_host = MINIMAL.replace("profile = \"4.1\"", "profile = \"9\"");
        assert!(Scenario::parse("s", &bad_host).is_err());
        // The #3105 sentinel is a switch of the emulated engine only.
        let sentinel = MINIMAL.replace("profile = \"4.1\"", "profile = \"4.1\"\nsentinel = true");
        assert!(Scenario::parse("s", &sentinel).unwrap().host.sentinel);
        let on_criu = sentinel.replace("engine = \"emulated\"", "engine = \"criu\"");
        let e = Scenario::parse("s", &on_criu).unwrap_err().to_string();
        assert!(
            e.contains("host.sentinel is for the emulated engine"),
            "{e}"
        );
    }
}
