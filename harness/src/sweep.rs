//! The fault sweep (`harness sweep`): for every driver call and `cuda-checkpoint` invocation the
//! CUDA plugin makes in a dump, a failed dump's rollback and a restore, inject every fault kind
//! the mock world knows that applies, on the first and on the second CUDA task, and check the
//! invariants after each run.
//!
//! Each case runs a fresh world and a small tree (`t1`: CUDA root with one extra thread, `t2`: a
//! CUDA child, `cpu`: a CPU-only child; 4 KiB per task) on the emulated engine, with
//! `cuda_plugin.timeout=1`, and installs its faults (`mock-world configure`) only once the phase
//! under test starts: the workload runs before a dump, the dump is done before a restore. A
//! `rollback` case adds a trigger (the checkpoint of `t2` fails) so that the faulted call is the
//! one the rollback makes for `t1`.
//!
//! A container-shaped variant ([`Tree::Container`], the `tree` column) runs the same tree
//! started in new pid and mount namespaces (`cpu`, the root, is the namespace's init; the tasks
//! are known by host pids, as CRIU names them), for the lock, checkpoint, restore and unlock
//! calls of both tasks through both backends with a representative set of faults (a failing
//! call, one that fails after its effect, a target killed under the call, someone else's lock)
//! and a rollback ([`container_cases`]).
//!
//! Invariants, checked after every case:
//! - the faulted step ends within [`STEP_LIMIT`] (the engine is killed past it: "hang");
//! - it succeeds, or fails with a plugin error naming the step (`PAUSE_DEVICES`, ...), the pid of
//!   the faulted task (for faults that name one) and the code (or `timed out`, for delays);
//! - a failed dump or rollback leaves every surviving task running (not stopped, not ptraced),
//!   unlocked (CUDA state running), its GPU data intact (`PASS`), its descriptor count unchanged;
//!   a task the rollback could not put back is allowed only when the log reports it by pid;
//! - a successful dump leaves every CUDA task checkpointed and parked; a fault-free restore then
//!   brings everything back running with its data;
//! - a successful restore leaves everything running and unlocked with its data; a failed restore
//!   (the newer rules: RESUME_DEVICES_LATE failures abort it) leaves the tree parked as the
//!   emulated engine guarantees, every CUDA task checkpointed, locked or running (never failed
//!   unless a `fail` fault put it there), and recoverable: driven back with a fault-free
//!   `cuda-checkpoint`, its data is intact. Under the 4.1 rules a failing RESUME_DEVICES_LATE is
//!   only logged: a "successful" restore that leaves a task not running must have logged the
//!   error naming it;
//! - no process of the world other than the workload is left (no `cuda-checkpoint` helper).
//!
//! A task killed by a `kill-target` fault, or put in the FAILED state by a `fail` fault, is
//! exempt from the per-task checks (the fault did that, not the plugin).

use crate::procfs::{comm, parked, state, thread_count, world_processes};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use crate::runner::Artifacts;
use crate::scenario::Namespace;
use crate::workload::{
    host_pid_in, kill_and_reap, mock_env, run_checked, spawn_root, tree_root, verify_data,
    wait_ready,
};
use mock_cuda_world::client::MockWorld;

/// The longest a faulted step may take before it counts as a hang (and is killed).
pub const STEP_LIMIT: Duration = Duration::from_secs(20);

/// CRIU's `--timeout` for [`Fault::AlarmHang`]: the dump must fail within it and
/// [`ALARM_SLACK`], every task running and unlocked.
const ALARM_TIMEOUT: Duration = Duration::from_secs(2);
/// See [`ALARM_TIMEOUT`].
const ALARM_SLACK: Duration = Duration::from_millis(500);

/// When a `hang` fault with a file is released (the file created), from the start of the step:
/// past the 1 s timeout of every call, within the lock's deadline (timeout plus 2 s grace).
const HANG_RELEASE: Duration = Duration::from_millis(2200);

/// The error codes injected into every call: those the API documents for the checkpoint calls
/// and those seen in the field.
pub const CODES: &[&str] = &[
    "CUDA_ERROR_INVALID_VALUE",
    "CUDA_ERROR_NOT_INITIALIZED",
    "CUDA_ERROR_ILLEGAL_STATE",
    "CUDA_ERROR_NOT_SUPPORTED",
    "CUDA_ERROR_NOT_READY",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "CUDA_ERROR_OPERATING_SYSTEM",
    "CUDA_ERROR_NOT_PERMITTED",
    "CUDA_ERROR_UNKNOWN",
];

/// Driver calls that name a target process.
pub const TASK_CALLS: &[&str] = &[
    "cuCheckpointProcessGetRestoreThreadId",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
];

/// Driver calls without a target (initialisation and GPU enumeration).
pub const GLOBAL_CALLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetUuid_v2",
    "cuDeviceGetName",
    "cuDeviceTotalMem",
];

/// `cuda-checkpoint` invocations that name a target process.
pub const CLI_TASK_CALLS: &[&str] = &[
    "cuda-checkpoint:get-restore-tid",
    "cuda-checkpoint:get-state",
    "cuda-checkpoint:lock",
    "cuda-checkpoint:checkpoint",
    "cuda-checkpoint:restore",
    "cuda-checkpoint:unlock",
];

/// The phase whose calls are faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// A dump.
    Dump,
    /// The rollback of a dump whose checkpoint of `t2` failed.
    Rollback,
    /// A restore of a good dump.
    Restore,
}

impl Phase {
    /// The table name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Phase::Dump => "dump",
            Phase::Rollback => "rollback",
            Phase::Restore => "restore",
        }
    }
}

/// The shape of the tree a case runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tree {
    /// The tree in the host's namespaces.
    Bare,
    /// The same tree started in new pid and mount namespaces, as in a container: `cpu` is the
    /// namespace's init (pid 1), the tasks are known by host pids.
    Container,
}

impl Tree {
    /// The table name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Tree::Bare => "bare",
            Tree::Container => "container",
        }
    }

    fn namespaces(self) -> &'static [Namespace] {
        match self {
            Tree::Bare => &[],
            Tree::Container => &[Namespace::Pid, Namespace::Mount],
        }
    }
}

/// Which process the fault names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// None (the call has no target).
    Any,
    /// The first CUDA task (the root).
    First,
    /// The second CUDA task.
    Second,
}

impl Target {
    /// The table name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Target::Any => "-",
            Target::First => "t1",
            Target::Second => "t2",
        }
    }
}

/// A fault kind of the mock world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// Return the code, do nothing.
    Return(&'static str),
    /// Do the call, then return `CUDA_ERROR_UNKNOWN`.
    ErrorAfter,
    /// Put the target into the FAILED state, return `CUDA_ERROR_UNKNOWN`.
    Fail,
    /// Sleep this many ms, then carry on.
    Delay(u32),
    /// Block until killed.
    Hang,
    /// Block until a file appears (created `HANG_RELEASE` into the step).
    HangFile,
    /// The `cuda-checkpoint` run dies of SIGSEGV.
    Crash,
    /// SIGKILL the target, then carry on.
    KillTarget,
    /// `cuda-checkpoint` prints garbage and exits 0.
    Garbage,
    /// Another tool locks the target just before the call (the mock's `foreign-lock`).
    ForeignLock,
    /// The call hangs, and CRIU's freeze alarm (`--timeout 2`, the plugin's own timeout 10 s)
    /// is what bounds it.
    AlarmHang,
    /// Another plugin's DUMP_FINISH fails (-5) after ours reported success ([`LATE_CALLS`]).
    PluginFails,
    /// The post-dump action script fails ([`LATE_CALLS`]).
    ScriptFails,
    /// The task's image is damaged between the dump and the restore ([`IMAGE_CALLS`]).
    Image(ImageDamage),
}

/// How a per-task image is damaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ImageDamage {
    /// Gone.
    Missing,
    /// Empty.
    Empty,
    /// Cut in the middle of its last line.
    Truncated,
    /// One byte with its top bit flipped (not text any more).
    Flipped,
    /// The image of the other CUDA task, under this task's name.
    OtherPid,
    /// A state a dump never records.
    UnknownState,
    /// A FIFO nobody writes to.
    Fifo,
    /// A symbolic link to `/dev/zero`.
    DevZero,
}

impl ImageDamage {
    /// Every kind.
    pub const ALL: [ImageDamage; 8] = [
        ImageDamage::Missing,
        ImageDamage::Empty,
        ImageDamage::Truncated,
        ImageDamage::Flipped,
        ImageDamage::OtherPid,
        ImageDamage::UnknownState,
        ImageDamage::Fifo,
        ImageDamage::DevZero,
    ];

    fn name(self) -> &'static str {
        match self {
            ImageDamage::Missing => "missing",
            ImageDamage::Empty => "empty",
            ImageDamage::Truncated => "truncated",
            ImageDamage::Flipped => "byte-flipped",
            ImageDamage::OtherPid => "other pid",
            ImageDamage::UnknownState => "unknown state",
            ImageDamage::Fifo => "fifo",
            ImageDamage::DevZero => "/dev/zero",
        }
    }
}

/// Calls that are not driver calls: another plugin's DUMP_FINISH and the post-dump action
/// script (faulted with [`Fault::PluginFails`], [`Fault::ScriptFails`]), with each backend.
pub const LATE_CALLS: &[&str] = &["dump-finish", "cuda-checkpoint+dump-finish"];

/// The per-task image (faulted with [`Fault::Image`]), with each backend.
pub const IMAGE_CALLS: &[&str] = &["task-image", "cuda-checkpoint+task-image"];

impl Fault {
    /// The table name.
    #[must_use]
    pub fn name(self) -> String {
        match self {
            Fault::Return(c) => c.trim_start_matches("CUDA_ERROR_").to_owned(),
            Fault::ErrorAfter => "error-after".to_owned(),
            Fault::Fail => "fail".to_owned(),
            Fault::Delay(ms) => format!("delay {ms}ms"),
            Fault::Hang => "hang".to_owned(),
            Fault::HangFile => "hang (file)".to_owned(),
            Fault::Crash => "crash".to_owned(),
            Fault::KillTarget => "kill-target".to_owned(),
            Fault::Garbage => "garbage".to_owned(),
            Fault::ForeignLock => "foreign-lock".to_owned(),
            Fault::AlarmHang => "hang (freeze alarm 2s)".to_owned(),
            Fault::PluginFails => "other plugin fails".to_owned(),
            Fault::ScriptFails => "post-dump script fails".to_owned(),
            Fault::Image(d) => format!("image {}", d.name()),
        }
    }

    fn action(self) -> String {
        match self {
            Fault::Return(c) => format!("{{ kind = \"return\", code = \"{c}\" }}"),
            Fault::ErrorAfter => {
                "{ kind = \"error-after\", code = \"CUDA_ERROR_UNKNOWN\" }".to_owned()
            }
            Fault::Fail => "{ kind = \"fail\", code = \"CUDA_ERROR_UNKNOWN\" }".to_owned(),
            Fault::Delay(ms) => format!("{{ kind = \"delay\", ms = {ms} }}"),
            Fault::Hang => "{ kind = \"hang\" }".to_owned(),
            Fault::HangFile => "{ kind = \"hang\", file = \"release\" }".to_owned(),
            Fault::Crash => "{ kind = \"crash\" }".to_owned(),
            Fault::KillTarget => "{ kind = \"kill-target\" }".to_owned(),
            Fault::Garbage => {
                "{ kind = \"garbage\", text = \"#@!garbage\\n\", status = 0 }".to_owned()
            }
            Fault::ForeignLock => "{ kind = \"foreign-lock\" }".to_owned(),
            Fault::AlarmHang => "{ kind = \"hang\" }".to_owned(),
            Fault::PluginFails | Fault::ScriptFails | Fault::Image(_) => String::new(),
        }
    }

    /// Whether the fault is a mock-world fault (installed in the world's config).
    fn in_world(self) -> bool {
        !matches!(
            self,
            Fault::PluginFails | Fault::ScriptFails | Fault::Image(_)
        )
    }

    /// The word an error caused by this fault must contain (besides step and pid).
    fn reason(self) -> Option<&'static str> {
        match self {
            Fault::Return(c) => Some(c),
            Fault::ErrorAfter | Fault::Fail => Some("CUDA_ERROR_UNKNOWN"),
            Fault::Delay(_) | Fault::Hang | Fault::HangFile => Some("timed out"),
            Fault::ForeignLock => Some("another tool locked"),
            Fault::AlarmHang => Some("freezing timeout"),
            Fault::Image(_) => Some("cuda-plugin-"),
            Fault::Crash
            | Fault::KillTarget
            | Fault::Garbage
            | Fault::PluginFails
            | Fault::ScriptFails => None,
        }
    }

    fn is_slow(self) -> bool {
        matches!(
            self,
            Fault::Delay(_) | Fault::Hang | Fault::HangFile | Fault::AlarmHang
        )
    }
}

/// One sweep case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Case {
    /// The faulted function (`cuda-checkpoint:<op>` for the utility).
    pub call: &'static str,
    /// The fault.
    pub fault: Fault,
    /// The phase.
    pub phase: Phase,
    /// The task the fault names.
    pub target: Target,
    /// The emulated host profile (`pr3076`, `4.1`).
    pub profile: &'static str,
    /// The tree's shape.
    pub tree: Tree,
    /// The plugin's parallel mode (`cuda_plugin.parallel=auto`): both tasks' checkpoints, and
    /// restores, run together at the first hook call of CRIU's loop (see [`parallel_cases`]).
    pub parallel: bool,
}

impl Case {
    fn cli(&self) -> bool {
        self.call.starts_with("cuda-checkpoint")
    }

    /// Which matching call fires: the rollback's GetState is the task's second.
    fn nth(&self) -> u32 {
        if self.phase == Phase::Rollback
            && (self.call.ends_with(":get-state") || self.call.ends_with("GetState"))
        {
            2
        } else {
            1
        }
    }

    /// A one-line command reproducing this case.
    #[must_use]
    pub fn repro(&self) -> String {
        format!("harness sweep --full --only '{}'", self.key())
    }

    fn key(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}|{}|{}",
            self.call,
            self.fault.name(),
            self.phase.name(),
            self.target.name(),
            self.profile,
            self.tree.name(),
            self.mode()
        )
    }

    /// The table name of the plugin's mode.
    #[must_use]
    pub fn mode(&self) -> &'static str {
        if self.parallel {
            "parallel"
        } else {
            "one-by-one"
        }
    }
}

/// How long a step waits for the plugin's guardian to exit after the engine.
const GUARDIAN_SETTLE: Duration = Duration::from_secs(5);

/// Cases known to violate an invariant, with why: each is a reported plugin limitation, kept
/// visible in the table (`xfail`) until it is fixed; a case that starts holding its invariants is
/// an `XPASS` failure, so that the mark is removed.
#[must_use]
pub fn known_violation(case: &Case) -> Option<&'static str> {
    // Earlier marks (fixed): GetRestoreThreadId's "no CUDA state" answers on a CUDA task (the
    // emulated engine now refuses the task's device descriptor as CRIU does), cuInit hangs (now
    // bounded), a utility exiting 0 with output after an action (now an error), and a post-dump
    // script failing on CRIU 4.1, which resumes the tree checkpointed without telling any hook
    // (the plugin's guardian now puts it back once CRIU has exited).
    let _ = case;
    None
}

/// The sweep's cases: `full` adds the slow faults (delays and hangs) everywhere; the default
/// keeps them for the lock and checkpoint calls of the first task only.
#[must_use]
pub fn cases(full: bool) -> Vec<Case> {
    let mut out = Vec::new();
    let tasks = [Target::First, Target::Second];
    let slow = [Fault::Delay(0), Fault::Hang, Fault::HangFile];
    let delay_for = |call: &str| {
        if call.ends_with("Lock") || call.ends_with(":lock") {
            4000
        } else {
            2000
        }
    };
    let mut push = |call: &'static str, fault: Fault, phase, target, profile| {
        let fault = match fault {
            Fault::Delay(0) => Fault::Delay(delay_for(call)),
            f => f,
        };
        out.push(Case {
            call,
            fault,
            phase,
            target,
            profile,
            tree: Tree::Bare,
            parallel: false,
        });
    };
    let slow_default = |call: &str, phase: Phase, t: Target| {
        t == Target::First
            && match phase {
                Phase::Dump => {
                    call.ends_with("Lock")
                        || call.ends_with(":lock")
                        || call.ends_with("Checkpoint")
                        || call.ends_with(":checkpoint")
                }
                Phase::Restore => call.ends_with("Restore") || call.ends_with(":restore"),
                Phase::Rollback => false,
            }
    };
    // Driver API, per task.
    let phases_of = |call: &str| -> &'static [Phase] {
        if call.ends_with("Restore")
            || call.ends_with(":restore")
            || call.ends_with("Unlock")
            || call.ends_with(":unlock")
        {
            &[Phase::Restore, Phase::Rollback]
        } else if call.ends_with("GetState") || call.ends_with(":get-state") {
            &[Phase::Dump, Phase::Rollback]
        } else {
            &[Phase::Dump]
        }
    };
    for &call in TASK_CALLS.iter().chain(CLI_TASK_CALLS) {
        let cli = call.starts_with("cuda-checkpoint");
        for &phase in phases_of(call) {
            // The rollback puts back t1 (checkpointed) after t2's checkpoint failed.
            let targets: &[Target] = if phase == Phase::Rollback {
                &[Target::First]
            } else {
                &tasks
            };
            for &t in targets {
                let mut kinds: Vec<Fault> = CODES.iter().map(|c| Fault::Return(c)).collect();
                kinds.extend([Fault::ErrorAfter, Fault::Fail, Fault::KillTarget]);
                if cli {
                    kinds.extend([Fault::Crash, Fault::Garbage]);
                }
                if full || slow_default(call, phase, t) {
                    kinds.extend(slow);
                }
                for k in kinds {
                    push(call, k, phase, t, "pr3076");
                }
            }
        }
    }
    // Calls without a target: at dump and at restore.
    for &call in GLOBAL_CALLS.iter().chain(&["cuda-checkpoint:help"]) {
        let cli = call.starts_with("cuda-checkpoint");
        for phase in [Phase::Dump, Phase::Restore] {
            let mut kinds: Vec<Fault> = CODES.iter().map(|c| Fault::Return(c)).collect();
            if cli {
                kinds.extend([Fault::Crash, Fault::Garbage]);
            }
            if full || call == "cuInit" || cli {
                kinds.extend(slow);
            }
            for k in kinds {
                push(call, k, phase, Target::Any, "pr3076");
            }
        }
    }
    // The 4.1 rules: no DUMP_FINISH (rollback from exit), RESUME_DEVICES_LATE only logged.
    for call in [
        "cuCheckpointProcessLock",
        "cuCheckpointProcessCheckpoint",
        "cuda-checkpoint:checkpoint",
    ] {
        for t in tasks {
            for k in [Fault::Return("CUDA_ERROR_UNKNOWN"), Fault::ErrorAfter] {
                push(call, k, Phase::Dump, t, "4.1");
            }
        }
    }
    for call in [
        "cuCheckpointProcessRestore",
        "cuCheckpointProcessUnlock",
        "cuda-checkpoint:restore",
        "cuda-checkpoint:unlock",
    ] {
        for t in tasks {
            for k in [
                Fault::Return("CUDA_ERROR_UNKNOWN"),
                Fault::Return("CUDA_ERROR_OUT_OF_MEMORY"),
                Fault::ErrorAfter,
                Fault::Fail,
                Fault::KillTarget,
            ] {
                push(call, k, Phase::Restore, t, "4.1");
            }
        }
    }
    // The holes of the rollback: someone else's lock, CRIU's freeze alarm, a failure after
    // DUMP_FINISH reported success, and damaged task images at restore.
    for call in ["cuCheckpointProcessLock", "cuda-checkpoint:lock"] {
        for t in tasks {
            for profile in ["pr3076", "4.1"] {
                push(call, Fault::ForeignLock, Phase::Dump, t, profile);
                push(call, Fault::AlarmHang, Phase::Dump, t, profile);
            }
        }
    }
    for &call in LATE_CALLS {
        push(call, Fault::PluginFails, Phase::Dump, Target::Any, "pr3076");
        for profile in ["pr3076", "4.1"] {
            push(call, Fault::ScriptFails, Phase::Dump, Target::Any, profile);
        }
    }
    for &call in IMAGE_CALLS {
        for t in tasks {
            for d in ImageDamage::ALL {
                for profile in ["pr3076", "4.1"] {
                    push(call, Fault::Image(d), Phase::Restore, t, profile);
                }
            }
        }
    }
    out.extend(container_cases());
    let parallel = parallel_cases(&out);
    out.extend(parallel);
    out.sort();
    out.dedup();
    out
}

/// Every case again in the plugin's parallel mode: the mode changes every phase (the locks
/// ahead at the first PAUSE_DEVICES, the batch of CHECKPOINT_DEVICES, the rollback of tasks
/// locked or checkpointed together, the batch of RESUME_DEVICES_LATE).
#[must_use]
pub fn parallel_cases(cases: &[Case]) -> Vec<Case> {
    cases
        .iter()
        .map(|c| Case {
            parallel: true,
            ..*c
        })
        .collect()
}

/// The container-shaped variant: the same tree in new pid and mount namespaces, for the lock,
/// checkpoint, restore and unlock of each task through each backend, with the faults that
/// exercise a different path each (a failing call, a call that fails after its effect, a
/// target killed under it, someone else's lock).
pub fn container_cases() -> Vec<Case> {
    let mut out = Vec::new();
    let mut push = |call: &'static str, fault: Fault, phase: Phase, target: Target| {
        out.push(Case {
            call,
            fault,
            phase,
            target,
            profile: "pr3076",
            tree: Tree::Container,
            parallel: false,
        });
    };
    for backend in ["cuCheckpointProcess", "cuda-checkpoint:"] {
        let call = |op: &str| -> &'static str {
            match (backend, op) {
                ("cuda-checkpoint:", "Lock") => "cuda-checkpoint:lock",
                ("cuda-checkpoint:", "Checkpoint") => "cuda-checkpoint:checkpoint",
                ("cuda-checkpoint:", "Restore") => "cuda-checkpoint:restore",
                ("cuda-checkpoint:", _) => "cuda-checkpoint:unlock",
                (_, "Lock") => "cuCheckpointProcessLock",
                (_, "Checkpoint") => "cuCheckpointProcessCheckpoint",
                (_, "Restore") => "cuCheckpointProcessRestore",
                _ => "cuCheckpointProcessUnlock",
            }
        };
        for t in [Target::First, Target::Second] {
            for k in [
                Fault::Return("CUDA_ERROR_UNKNOWN"),
                Fault::ErrorAfter,
                Fault::KillTarget,
                Fault::ForeignLock,
            ] {
                push(call("Lock"), k, Phase::Dump, t);
            }
            for k in [Fault::Return("CUDA_ERROR_UNKNOWN"), Fault::ErrorAfter] {
                push(call("Checkpoint"), k, Phase::Dump, t);
                push(call("Restore"), k, Phase::Restore, t);
            }
            push(
                call("Unlock"),
                Fault::Return("CUDA_ERROR_UNKNOWN"),
                Phase::Restore,
                t,
            );
        }
        push(
            call("Restore"),
            Fault::Return("CUDA_ERROR_UNKNOWN"),
            Phase::Rollback,
            Target::First,
        );
    }
    out
}

/// What one case did.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// The case.
    pub case: Case,
    /// Normalised outcome (`dump failed at PAUSE_DEVICES; t1=running t2=running`).
    pub outcome: String,
    /// Whether the fault fired at all.
    pub fired: bool,
    /// Invariant violations (empty: all held).
    pub violations: Vec<String>,
    /// Wall time of the case.
    pub elapsed: Duration,
    /// Log excerpt for violations.
    pub detail: String,
}

const TASKS: [&str; 3] = ["t1", "t2", "cpu"];

struct Run<'a> {
    case: Case,
    art: &'a Artifacts,
    dir: PathBuf,
    world: PathBuf,
    env: Vec<(String, String)>,
    pids: Vec<i32>,
    root_child: Option<Child>,
    violations: Vec<String>,
    detail: String,
}

/// Runs one case.
#[must_use]
pub fn run_case(case: &Case, art: &Artifacts) -> CaseResult {
    let start = Instant::now();
    let tmp = tempfile::Builder::new().prefix("sweep-").tempdir();
    let mut r = match &tmp {
        Ok(t) => Run {
            case: *case,
            art,
            dir: t.path().to_path_buf(),
            world: t.path().join("world"),
            env: Vec::new(),
            pids: Vec::new(),
            root_child: None,
            violations: Vec::new(),
            detail: String::new(),
        },
        Err(e) => {
            return CaseResult {
                case: *case,
                outcome: "setup failed".to_owned(),
                fired: false,
                violations: vec![format!("tempdir: {e}")],
                elapsed: start.elapsed(),
                detail: String::new(),
            }
        }
    };
    let (outcome, fired) = match r.execute() {
        Ok(x) => x,
        Err(e) => {
            r.violations
                .push(format!("setup: {}", e.lines().next().unwrap_or("")));
            let _ = writeln!(r.detail, "{e}");
            ("setup failed".to_owned(), false)
        }
    };
    r.cleanup();
    CaseResult {
        case: *case,
        outcome,
        fired,
        violations: r.violations,
        elapsed: start.elapsed(),
        detail: r.detail,
    }
}

/// The result of one engine step.
struct StepResult {
    ok: bool,
    log: String,
    trace: String,
    took: Duration,
    killed: bool,
}

impl Run<'_> {
    fn world_config(&self, faults: &[(String, Option<i32>, u32, String)]) -> String {
        let mut t = String::from(
            "schema = 1\n[driver]\nbranch = 580\n\n[[gpu]]\n\
             uuid = \"GPU-00000000-0000-4000-8000-000000000000\"\n\
             name = \"NVIDIA H100 80GB HBM3\"\nmemory_mib = 81559\nchip = \"GH100\"\n",
        );
        for (function, pid, nth, action) in faults {
            let _ = write!(t, "\n[[fault]]\nfunction = \"{function}\"\n");
            if let Some(p) = pid {
                let _ = writeln!(t, "pid = {p}");
            }
            let _ = writeln!(t, "nth = {nth}\naction = {action}");
        }
        t
    }

    fn configure(&self, verb: &str, text: &str) -> Result<(), String> {
        let cfg = self.dir.join(format!("world-{verb}.toml"));
        std::fs::write(&cfg, text).map_err(|e| e.to_string())?;
        let (lib, nvml) = (&self.art.mock_lib, &self.art.mock_nvml);
        let done = if verb == "init" {
            MockWorld::init(&self.world, text, lib, Some(nvml)).map(drop)
        } else {
            MockWorld::open(&self.world)
                .map(|w| w.with_libs(Some(lib), Some(nvml)))
                .and_then(|w| w.configure(text))
        };
        done.map_err(|e| e.to_string())
    }

    fn setup(&mut self) -> Result<(), String> {
        let lib = self.dir.join("lib");
        let bin = self.dir.join("bin");
        std::fs::create_dir(&lib).map_err(|e| e.to_string())?;
        std::fs::create_dir(&bin).map_err(|e| e.to_string())?;
        std::fs::copy(&self.art.plugin, lib.join("cuda_plugin.so"))
            .map_err(|e| format!("copy plugin: {e}"))?;
        if self.case.fault == Fault::PluginFails {
            // Loaded after ours: it declines every task and fails its DUMP_FINISH.
            run_checked(
                Command::new("cc")
                    .args(["-shared", "-fPIC", "-O0", "-w", "-DTP_NAME=\"other\""])
                    .arg(
                        self.art
                            .workspace
                            .join("harness/tests/support/testplugin.c"),
                    )
                    .arg("-o")
                    .arg(lib.join("other.so")),
                "cc test plugin",
            )?;
        }
        std::os::unix::fs::symlink(&self.art.cuda_checkpoint, bin.join("cuda-checkpoint"))
            .map_err(|e| e.to_string())?;
        self.configure("init", &self.world_config(&[]))?;
        self.env = mock_env(&self.world, &bin);
        if self.case.fault == Fault::PluginFails {
            for (k, v) in [
                ("TP_other_pause", "ret=-95"),
                ("TP_other_checkpoint", "ret=-95"),
                ("TP_other_resume", "ret=-95"),
                ("TP_other_dfinish", "ret=-5"),
            ] {
                self.env.push((k.to_owned(), v.to_owned()));
            }
            self.env.push((
                "TP_LOG".to_owned(),
                self.dir.join("tp.log").display().to_string(),
            ));
        }
        // cpu (the root) -> t1 (CUDA), t2 (CUDA). The root is a CPU task so
        // that a `kill-target` fault never kills the root of the dumped tree.
        let app = self.art.mock_app.display().to_string();
        let d = self.dir.display().to_string();
        let scripts = [
            format!(
                "sh {d}/task1.sh &\nsh {d}/task2.sh &\nexec {app} --report {d}/report2 --threads 0 --cpu-only\n"
            ),
            format!("exec {app} --report {d}/report0 --threads 0 --gpus 0 --kib 4\n"),
            format!("exec {app} --report {d}/report1 --threads 0 --gpus 0 --kib 4\n"),
        ];
        for (i, s) in scripts.iter().enumerate() {
            std::fs::write(self.dir.join(format!("task{i}.sh")), s).map_err(|e| e.to_string())?;
        }
        let namespaces = self.case.tree.namespaces();
        let child = spawn_root(&self.dir, &self.env, namespaces)?;
        let deadline = Instant::now() + Duration::from_secs(20);
        let root = tree_root(&child, namespaces, deadline);
        self.root_child = Some(child);
        // In new namespaces the READY lines give namespace pids: the host's pids are those of
        // the same pids in the root's pid namespace.
        let ns = match namespaces.contains(&Namespace::Pid) {
            true => Some(
                mock_cuda_world::pidns::pid_ns_of(root?).ok_or("no pid namespace of the root")?,
            ),
            false => None,
        };
        for (i, task) in TASKS.iter().enumerate() {
            let (pid, _) = wait_ready(&self.dir, i, task, deadline)?;
            let host = match ns {
                Some(ns) => host_pid_in(ns, pid)
                    .ok_or_else(|| format!("{task}: no pid {pid} in pid namespace {ns}"))?,
                None => pid,
            };
            self.pids.push(host);
        }
        // t1, t2: main and restore thread.
        for (i, want) in [2, 2, 1].into_iter().enumerate() {
            let end = Instant::now() + Duration::from_secs(5);
            while thread_count(self.pids[i]) < want && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Ok(())
    }

    fn faults(&self) -> Vec<(String, Option<i32>, u32, String)> {
        let c = &self.case;
        if !c.fault.in_world() {
            return Vec::new();
        }
        let pid = match c.target {
            Target::Any => None,
            Target::First => Some(self.pids[0]),
            Target::Second => Some(self.pids[1]),
        };
        let mut f = vec![(c.call.to_owned(), pid, c.nth(), c.fault.action())];
        if c.phase == Phase::Rollback {
            let trigger = if c.cli() {
                "cuda-checkpoint:checkpoint"
            } else {
                "cuCheckpointProcessCheckpoint"
            };
            f.push((
                trigger.to_owned(),
                Some(self.pids[1]),
                1,
                Fault::Return("CUDA_ERROR_UNKNOWN").action(),
            ));
        }
        f
    }

    /// Runs `harness --host P <verb>`, killing it past [`STEP_LIMIT`].
    fn step(&self, verb: &str, n: usize, release: bool) -> Result<StepResult, String> {
        let img = self.dir.join("img");
        let log = self.dir.join(format!("step{n}.log"));
        let trace = self.dir.join(format!("step{n}.trace"));
        let profile: crate::profile::HostProfile =
            self.case.profile.parse().map_err(|e| format!("{e}"))?;
        let alarm = self.case.fault == Fault::AlarmHang;
        let options = [
            if self.case.cli() {
                "cuda_plugin.backend=cuda-checkpoint"
            } else {
                "cuda_plugin.backend=driver-api"
            },
            // Under the freeze alarm the plugin's own timeout is long: the alarm must bound it.
            if alarm {
                "cuda_plugin.timeout=10"
            } else {
                "cuda_plugin.timeout=1"
            },
            if self.case.parallel {
                "cuda_plugin.parallel=auto"
            } else {
                "cuda_plugin.parallel=1"
            },
        ];
        let mut c = Command::new(&self.art.harness);
        c.arg("--host").arg(self.case.profile).arg(verb);
        c.arg("-D")
            .arg(&img)
            .arg("-L")
            .arg(self.dir.join("lib"))
            .arg("-v4")
            .arg("-o")
            .arg(&log)
            .arg("--trace")
            .arg(&trace);
        if verb == "dump" {
            c.arg("-t").arg(self.pids[2].to_string());
            if alarm {
                c.arg("--timeout").arg(ALARM_TIMEOUT.as_secs().to_string());
            }
            if self.case.fault == Fault::ScriptFails {
                let script = self.dir.join("post-dump.sh");
                std::fs::write(
                    &script,
                    "#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] && exit 3\nexit 0\n",
                )
                .map_err(|e| e.to_string())?;
                c.arg("--action-script").arg(&script);
            }
        }
        c.env_remove("CRIU_LIBS_DIR")
            .env_remove("CRIU_FAULT")
            .env_remove("CRIU_PLUGIN_OPTIONS");
        if profile.has_plugin_options() {
            for o in options {
                c.arg("--plugin-option").arg(o);
            }
        } else {
            c.env("CRIU_PLUGIN_OPTIONS", options.join(" "));
        }
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c.env("CRIU_CUDA_FORCE_ENABLE", "1");
        let started = Instant::now();
        let out = std::fs::File::create(self.dir.join(format!("step{n}.out")))
            .map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut child = c
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawn {verb}: {e}"))?;
        let mut killed = false;
        let mut released = false;
        let status = loop {
            if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
                break s;
            }
            // A task a fault killed is our child (or orphan): reap it, as CRIU's parent would.
            for &p in &self.pids {
                if state(p) == 'Z' {
                    let _ = waitpid(Pid::from_raw(p), Some(WaitPidFlag::WNOHANG));
                }
            }
            let t = started.elapsed();
            if release && !released && t >= HANG_RELEASE {
                let _ = std::fs::write(self.world.join("release"), "");
                released = true;
            }
            if t > STEP_LIMIT {
                killed = true;
                let _ = child.kill();
                break child.wait().map_err(|e| e.to_string())?;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let took = started.elapsed();
        if release && !released {
            let _ = std::fs::write(self.world.join("release"), "");
        }
        let mut output = String::new();
        if let Ok(mut f) = std::fs::File::open(self.dir.join(format!("step{n}.out"))) {
            let _ = f.read_to_string(&mut output);
        }
        let log_text = std::fs::read_to_string(&log).unwrap_or_default();
        // The plugin's guardian outlives the engine briefly (it puts back a tree the engine
        // resumed checkpointed, as after a failed post-dump script): the invariants are checked
        // once it is done. One still waiting for a hung call is left to its own bound.
        for pid in crate::runner::guardian_pids(&log_text) {
            let _ = crate::runner::wait_gone(pid, GUARDIAN_SETTLE);
        }
        Ok(StepResult {
            ok: status.success() && !killed,
            log: format!("{log_text}{output}"),
            trace: std::fs::read_to_string(&trace).unwrap_or_default(),
            took,
            killed,
        })
    }

    fn world_states(&self) -> Result<BTreeMap<i32, String>, String> {
        let st = MockWorld::open(&self.world)
            .and_then(|w| w.status())
            .map_err(|e| e.to_string())?;
        let mut m = BTreeMap::new();
        for &pid in &self.pids {
            m.insert(pid, st.state_of(pid).name().to_owned());
        }
        Ok(m)
    }

    fn fired(&self) -> bool {
        if !self.case.fault.in_world() {
            return true;
        }
        MockWorld::open(&self.world)
            .and_then(|w| w.fault_count(0))
            .is_ok_and(|n| n >= u64::from(self.case.nth()))
    }

    fn alive(&self, pid: i32) -> bool {
        let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        Path::new(&format!("/proc/{pid}")).exists() && !matches!(state(pid), 'Z' | 'X' | '?')
    }

    fn name(&self, pid: i32) -> &'static str {
        self.pids
            .iter()
            .position(|&p| p == pid)
            .map_or("?", |i| TASKS[i])
    }

    /// Where the step failed: the first hook (or init) that returned an error.
    fn failed_at(trace: &str) -> String {
        for l in trace.lines() {
            if let Some(at) = l.find(" -> -").filter(|_| !l.ends_with(" -> -95")) {
                let mut w = l[..at].split_whitespace();
                return match (w.next(), w.next()) {
                    (Some("hook"), Some(h)) => h.to_owned(),
                    (Some("init"), _) => "init".to_owned(),
                    (Some(x), _) => x.to_owned(),
                    _ => "?".to_owned(),
                };
            }
        }
        if trace.contains("-> failed") {
            "engine".to_owned()
        } else {
            "?".to_owned()
        }
    }

    /// The failure is reported by the plugin naming the step, the pid and the reason.
    fn check_error_named(&mut self, s: &StepResult, fired: bool) {
        let c = self.case;
        let steps = [
            "PAUSE_DEVICES",
            "CHECKPOINT_DEVICES",
            "RESUME_DEVICES_LATE",
            "dump finish",
            "init",
            "cuda_plugin",
        ];
        let pid = match c.target {
            Target::Any => None,
            Target::First => Some(self.pids[0]),
            Target::Second => Some(self.pids[1]),
        };
        let lines: Vec<&str> = s
            .log
            .lines()
            .filter(|l| l.contains("cuda_plugin"))
            .collect();
        let named = lines.iter().any(|l| {
            steps[..4].iter().any(|st| l.contains(st))
                && (pid.is_none()
                    || !fired
                    || l.contains(&format!("pid {}", pid.unwrap_or(0)))
                    || c.phase == Phase::Rollback)
                && (!fired || c.fault.reason().is_none_or(|r| l.contains(r)))
        });
        let init_named = lines.iter().any(|l| {
            l.contains("init")
                && (!fired || c.fault.reason().is_none_or(|r| l.contains(r)) || c.cli())
        });
        // A "no CUDA state" answer for a CUDA task makes the plugin decline it; CRIU's file
        // dump then refuses the task's GPU descriptor and names the task: a clean failure.
        let refused = pid.is_some_and(|p| s.log.contains(&format!("Dump files (pid: {p})")));
        if !named && !init_named && !refused {
            self.violations.push(format!(
                "the failure is not reported naming step, pid and {}",
                c.fault.reason().unwrap_or("cause")
            ));
        }
    }

    /// Tasks that the fault itself took out of the checks: dead, or put in FAILED by `fail`.
    fn exempt(&self, states: &BTreeMap<i32, String>) -> Vec<i32> {
        self.pids
            .iter()
            .copied()
            .filter(|&p| {
                !self.alive(p)
                    || (self.case.fault == Fault::Fail
                        && states.get(&p).is_some_and(|s| s == "failed"))
            })
            .collect()
    }

    fn states_text(&self, states: &BTreeMap<i32, String>) -> String {
        self.pids[..2]
            .iter()
            .map(|&p| {
                let s = if self.alive(p) {
                    states.get(&p).map_or("?", String::as_str)
                } else {
                    "dead"
                };
                format!("{}={s}", self.name(p))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Running, untraced, with the expected CUDA state and fd count, data verified.
    fn check_running(&mut self, what: &str, states: &BTreeMap<i32, String>, skip: &[i32]) {
        let end = Instant::now() + Duration::from_secs(3);
        for (i, &p) in self.pids.clone().iter().enumerate() {
            if skip.contains(&p) {
                continue;
            }
            while crate::pstree::running_untraced(p).is_err() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
            if let Err(e) = crate::pstree::running_untraced(p) {
                self.violations
                    .push(format!("{what}: {} not running untraced ({e})", TASKS[i]));
            }
            let want = if i < 2 { "running" } else { "none" };
            let got = states.get(&p).map_or("?", String::as_str);
            if got != want {
                self.violations
                    .push(format!("{what}: {} CUDA state {got}, not {want}", TASKS[i]));
            }
        }
        let live: Vec<(usize, i32)> = self
            .pids
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, p)| !skip.contains(p))
            .collect();
        for (i, verdict) in self.verify_data(&live) {
            if !verdict.starts_with("PASS") {
                self.violations
                    .push(format!("{what}: {} data check: {verdict}", TASKS[i]));
            }
        }
    }

    fn verify_data(&self, tasks: &[(usize, i32)]) -> Vec<(usize, String)> {
        tasks
            .iter()
            .map(|&(i, _)| i)
            .zip(verify_data(&self.dir, tasks))
            .collect()
    }

    /// Processes of this world other than the workload.
    fn check_leftovers(&mut self) {
        // The `unshare` that waits for a container-shaped tree is no leftover.
        let unshare = self.root_child.as_ref().map(|c| c.id() as i32);
        let extra: Vec<String> = world_processes(&self.world)
            .into_iter()
            .filter(|pid| !self.pids.contains(pid) && !matches!(state(*pid), 'Z' | '?'))
            .filter(|pid| Some(*pid) != unshare)
            .map(|pid| format!("{pid} ({})", comm(pid)))
            .collect();
        if !extra.is_empty() {
            self.violations
                .push(format!("processes left behind: {}", extra.join(", ")));
        }
    }

    /// Parked: every thread group-stopped and untraced.
    fn check_parked(&mut self, what: &str, skip: &[i32]) {
        let end = Instant::now() + Duration::from_secs(3);
        for (i, &p) in self.pids.clone().iter().enumerate() {
            if skip.contains(&p) {
                continue;
            }
            while !parked(p) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
            if !parked(p) {
                self.violations.push(format!(
                    "{what}: {} is not parked ({})",
                    TASKS[i],
                    crate::pstree::running_untraced(p).err().unwrap_or_default()
                ));
            }
        }
    }

    /// Drives each CUDA task back to running with a fault-free `cuda-checkpoint` after a
    /// SIGCONT.
    fn recover(&mut self, skip: &[i32]) -> Result<(), String> {
        self.configure("configure", &self.world_config(&[]))?;
        for &p in &self.pids {
            let _ = kill(Pid::from_raw(p), Signal::SIGCONT);
        }
        // A request the failed restore abandoned may still complete: let it, then look.
        std::thread::sleep(Duration::from_millis(100));
        let states = self.world_states()?;
        for &p in &self.pids[..2] {
            if skip.contains(&p) {
                continue;
            }
            let actions: &[&str] = match states.get(&p).map(String::as_str) {
                Some("checkpointed") => &["restore", "unlock"],
                Some("locked") => &["unlock"],
                _ => &[],
            };
            for a in actions {
                run_checked(
                    Command::new(&self.art.cuda_checkpoint)
                        .args(["--action", a, "--pid", &p.to_string()])
                        .envs(self.env.iter().map(|(k, v)| (k, v))),
                    &format!("cuda-checkpoint --action {a}"),
                )?;
            }
        }
        Ok(())
    }

    fn execute(&mut self) -> Result<(String, bool), String> {
        self.setup()?;
        let c = self.case;
        let verb = if c.phase == Phase::Restore {
            let s = self.step("dump", 0, false)?;
            if !s.ok {
                return Err(format!("the fault-free dump failed:\n{}", s.log));
            }
            "restore"
        } else {
            "dump"
        };
        let n = usize::from(c.phase == Phase::Restore);
        if let Fault::Image(d) = c.fault {
            self.damage_image(d)?;
        }
        self.configure("configure", &self.world_config(&self.faults()))?;
        let s = self.step(verb, n, c.fault == Fault::HangFile)?;
        let fired = self.fired();
        if s.killed {
            self.violations
                .push(format!("{verb} still running after {STEP_LIMIT:?}: killed"));
        }
        let states = self.world_states()?;
        let skip = self.exempt(&states);
        let at = Self::failed_at(&s.trace);
        let mut outcome = if s.ok {
            format!("{verb} ok")
        } else {
            format!("{verb} failed at {at}")
        };
        let _ = write!(outcome, "; {}", self.states_text(&states));
        if !fired {
            outcome.push_str(" (not reached)");
        }
        if c.fault == Fault::AlarmHang {
            if s.took > ALARM_TIMEOUT + ALARM_SLACK {
                self.violations.push(format!(
                    "the dump took {:.2} s, more than CRIU's --timeout {} s and {} ms",
                    s.took.as_secs_f64(),
                    ALARM_TIMEOUT.as_secs(),
                    ALARM_SLACK.as_millis()
                ));
            }
            if s.log.contains("FATAL") {
                self.violations
                    .push("CRIU's freeze alarm reached its FATAL path".to_owned());
            }
        }
        // The foreign lock is someone else's: it must be left in place, then undone here.
        let foreign = match (c.fault, c.target) {
            (Fault::ForeignLock, Target::First) => Some(self.pids[0]),
            (Fault::ForeignLock, Target::Second) => Some(self.pids[1]),
            _ => None,
        };
        let mut skip = skip;
        if let Some(p) = foreign.filter(|_| fired) {
            if states.get(&p).map(String::as_str) != Some("locked") {
                self.violations.push(format!(
                    "another tool's lock of {} was not left alone ({})",
                    self.name(p),
                    states.get(&p).map_or("?", String::as_str)
                ));
            }
            skip.push(p);
        }
        match (verb, s.ok) {
            ("dump", false) => {
                if c.fault.in_world() {
                    self.check_error_named(&s, fired);
                }
                // Tasks the rollback reports it could not put back.
                let reported: Vec<i32> = self
                    .pids
                    .iter()
                    .copied()
                    .filter(|p| {
                        s.log.lines().any(|l| {
                            l.contains("could not be put back") && l.contains(&p.to_string())
                        })
                    })
                    .collect();
                let mut skip2 = skip.clone();
                skip2.extend(&reported);
                self.check_running("after the failed dump", &states, &skip2);
                if !reported.is_empty() {
                    outcome.push_str(" (reported stuck)");
                }
            }
            ("dump", true) => {
                self.check_parked("after the dump", &skip);
                for &p in &self.pids[..2] {
                    if !skip.contains(&p) && states[&p] != "checkpointed" {
                        self.violations.push(format!(
                            "the dump succeeded but {} is {}",
                            self.name(p),
                            states[&p]
                        ));
                    }
                }
                self.configure("configure", &self.world_config(&[]))?;
                let r = self.step("restore", 1, false)?;
                if r.ok {
                    let st = self.world_states()?;
                    self.check_running("after a fault-free restore", &st, &skip);
                } else {
                    self.violations.push(format!(
                        "the fault-free restore of that dump failed at {}",
                        Self::failed_at(&r.trace)
                    ));
                    let _ = writeln!(self.detail, "{}", r.log);
                }
            }
            ("restore", true) => {
                let not_running: Vec<i32> = self.pids[..2]
                    .iter()
                    .copied()
                    .filter(|p| !skip.contains(p) && states[p] != "running")
                    .collect();
                if not_running.is_empty() {
                    self.check_running("after the restore", &states, &skip);
                } else {
                    // 4.1 rules: RESUME_DEVICES_LATE errors are only logged.
                    for &p in &not_running {
                        let logged = s.log.lines().any(|l| {
                            l.contains("RESUME_DEVICES_LATE") && l.contains(&format!("pid {p}"))
                        });
                        if !logged || c.profile != "4.1" {
                            self.violations.push(format!(
                                "the restore succeeded but {} is {}{}",
                                self.name(p),
                                states[&p],
                                if logged { "" } else { " (no error logged)" }
                            ));
                        }
                    }
                    outcome.push_str(" (logged)");
                    let mut skip2 = skip.clone();
                    skip2.extend(&not_running);
                    self.check_running("after the restore", &states, &skip2);
                }
            }
            _ => {
                self.check_error_named(&s, fired);
                self.check_parked("after the failed restore", &skip);
                for &p in &self.pids[..2] {
                    if !skip.contains(&p)
                        && !["checkpointed", "locked", "running"].contains(&states[&p].as_str())
                    {
                        self.violations.push(format!(
                            "after the failed restore {} is {}",
                            self.name(p),
                            states[&p]
                        ));
                    }
                }
                match self.recover(&skip) {
                    Ok(()) => {
                        let st = self.world_states()?;
                        self.check_running("recovered after the failed restore", &st, &skip);
                    }
                    Err(e) => self.violations.push(format!("recovery: {e}")),
                }
            }
        }
        if let Some(p) = foreign.filter(|&p| fired && self.alive(p)) {
            // Undo the other tool's lock, then its data must be intact.
            self.configure("configure", &self.world_config(&[]))?;
            run_checked(
                Command::new(&self.art.cuda_checkpoint)
                    .args(["--action", "unlock", "--pid", &p.to_string()])
                    .envs(self.env.iter().map(|(k, v)| (k, v))),
                "cuda-checkpoint --action unlock",
            )?;
            let i = self.pids.iter().position(|&q| q == p).unwrap_or(0);
            for (_, verdict) in self.verify_data(&[(i, p)]) {
                if !verdict.starts_with("PASS") {
                    self.violations.push(format!(
                        "{} data check after the other tool's unlock: {verdict}",
                        TASKS[i]
                    ));
                }
            }
        }
        self.check_leftovers();
        if !self.violations.is_empty() {
            let _ = writeln!(self.detail, "--- {verb} log\n{}", s.log);
        }
        Ok((outcome, fired))
    }

    /// Damages the image of the target task after a fault-free dump.
    fn damage_image(&self, d: ImageDamage) -> Result<(), String> {
        let (me, other) = match self.case.target {
            Target::Second => (self.pids[1], self.pids[0]),
            _ => (self.pids[0], self.pids[1]),
        };
        let img = self.dir.join("img");
        let path = img.join(format!("cuda-plugin-{me}.img"));
        let good = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let text = String::from_utf8_lossy(&good).into_owned();
        std::fs::remove_file(&path).map_err(|e| e.to_string())?;
        let write = |b: &[u8]| std::fs::write(&path, b).map_err(|e| e.to_string());
        match d {
            ImageDamage::Missing => Ok(()),
            ImageDamage::Empty => write(b""),
            ImageDamage::Truncated => write(&good[..good.len().saturating_sub(4)]),
            ImageDamage::Flipped => {
                let mut b = good.clone();
                b[3] ^= 0x80;
                write(&b)
            }
            ImageDamage::OtherPid => {
                let o = std::fs::read(img.join(format!("cuda-plugin-{other}.img")))
                    .map_err(|e| e.to_string())?;
                write(&o)
            }
            ImageDamage::UnknownState => {
                let line = text
                    .lines()
                    .find(|l| l.starts_with("initial_state "))
                    .unwrap_or("initial_state running");
                write(text.replace(line, "initial_state 77").as_bytes())
            }
            ImageDamage::Fifo => {
                nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
                    .map_err(|e| e.to_string())
            }
            ImageDamage::DevZero => {
                std::os::unix::fs::symlink("/dev/zero", &path).map_err(|e| e.to_string())
            }
        }
    }

    fn cleanup(&mut self) {
        let mut victims: Vec<i32> = self.pids.clone();
        victims.extend(world_processes(&self.world));
        kill_and_reap(&victims, self.root_child.take());
    }
}

/// Runs `cases`, `jobs` at a time; `progress` is called with each result as it completes. Every
/// case runs once: a case that fails its invariants fails the sweep. Returns the results in case
/// order.
pub fn run_all(
    cases: &[Case],
    art: &Artifacts,
    jobs: usize,
    progress: &(dyn Fn(&CaseResult) + Sync),
) -> Vec<CaseResult> {
    crate::runner::pool::run(cases.to_vec(), jobs, |c| run_case(&c, art), progress)
}

/// The check column: `ok`, `xfail: why`, or `VIOLATION: ...`.
#[must_use]
pub fn check_text(r: &CaseResult) -> String {
    match (r.violations.is_empty(), known_violation(&r.case)) {
        (true, None) => "ok".to_owned(),
        (true, Some(_)) => "XPASS (remove the known violation)".to_owned(),
        (false, Some(why)) => format!("xfail: {why}"),
        (false, None) => format!("VIOLATION: {}", r.violations.join("; ")),
    }
}

/// Whether the row counts as a failure of the sweep.
#[must_use]
pub fn is_failure(r: &CaseResult) -> bool {
    r.violations.is_empty() == known_violation(&r.case).is_some()
}

/// The sweep table: one row per case, sorted, without times. `states` adds the CUDA state of
/// each task after the step to the outcome (`t1=running t2=failed`); those depend on timing
/// (when a `fail` target dies, whether a put-back under a 1 s timeout finished on a loaded
/// machine), so the snapshot leaves them out.
#[must_use]
pub fn table(results: &[CaseResult], states: bool) -> String {
    let mut rows: Vec<[String; 9]> = results
        .iter()
        .map(|r| {
            [
                r.case.call.to_owned(),
                r.case.fault.name(),
                r.case.phase.name().to_owned(),
                r.case.target.name().to_owned(),
                r.case.profile.to_owned(),
                r.case.tree.name().to_owned(),
                r.case.mode().to_owned(),
                if states {
                    r.outcome.clone()
                } else {
                    r.outcome.split(';').next().unwrap_or("").to_owned()
                },
                check_text(r),
            ]
        })
        .collect();
    rows.sort();
    let head = [
        "call", "fault", "phase", "task", "host", "tree", "mode", "outcome", "check",
    ];
    let mut w = head.map(str::len);
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: &[&str]| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<width$}  ", width = w[i]);
            }
        }
        l.trim_end().to_owned()
    };
    let _ = writeln!(out, "{}", line(&head));
    for r in &rows {
        let cells: Vec<&str> = r.iter().map(String::as_str).collect();
        let _ = writeln!(out, "{}", line(&cells));
    }
    let fired = results.iter().filter(|r| r.fired).count();
    let bad = results.iter().filter(|r| is_failure(r)).count();
    let _ = writeln!(
        out,
        "\n{} combinations ({} fired), {} invariant failures",
        results.len(),
        fired,
        bad
    );
    out
}

/// Selects the cases whose key (`call|fault|phase|task|host|tree|mode`) contains `filter`.
#[must_use]
pub fn filter(cases: Vec<Case>, filter: &str) -> Vec<Case> {
    cases
        .into_iter()
        .filter(|c| c.key().contains(filter))
        .collect()
}

/// Whether this case is slow (a delay or a hang).
#[must_use]
pub fn is_slow(c: &Case) -> bool {
    c.fault.is_slow()
}
