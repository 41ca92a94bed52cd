//! The fault sweep (`harness sweep`): for every driver call and `cuda-checkpoint` invocation the
//! CUDA plugin makes in a dump, a failed dump's rollback and a restore, inject every fault kind
//! the mock world knows that applies, on the first and on the second CUDA task, and check the
//! invariants after each run.
//!
//! Each case is a scenario ([`Case::scenario_toml`]; `harness sweep --print --only KEY` shows
//! it, and `harness run` runs it saved to a file) run by the scenario runner, the one executor
//! of the corpus too, and judged by its `[invariants]` ([`crate::scenario::Invariants`], checked
//! by the runner): a fresh world and a small tree (`cpu`, a CPU-only root, with two CUDA
//! children `t1` and `t2` of 4 KiB each) on the emulated engine, with `cuda_plugin.timeout=1`,
//! its faults installed only once the phase under test starts (the workload runs before a dump,
//! the dump is done before a restore). A `rollback` case adds a trigger (the checkpoint of `t2`
//! fails) so that the faulted call is the one the rollback makes for `t1`.
//!
//! The codes injected are one per group of codes the plugin cannot tell apart ([`CODE_GROUPS`],
//! proven against the plugin's own `FailureClass` by a unit test); `--full` injects every code
//! of [`CODES`] and the slow faults (delays, hangs) at every call.
//!
//! A container-shaped variant ([`Tree::Container`], the `tree` column) runs the same tree
//! started in new pid and mount namespaces (`cpu`, the root, is the namespace's init; the tasks
//! are known by host pids, as CRIU names them), for the lock, checkpoint, restore and unlock
//! calls of both tasks through both backends with a representative set of faults (a failing
//! call, one that fails after its effect, a target killed under the call, someone else's lock)
//! and a rollback ([`container_cases`]). Every case also runs in the plugin's parallel mode.
//!
//! Invariants, checked after every case:
//! - the faulted step ends within [`STEP_LIMIT`] (the freeze-alarm cases: CRIU's `--timeout`
//!   and half a second, without reaching CRIU's FATAL path);
//! - it succeeds, or fails with a plugin error naming the step (`PAUSE_DEVICES`, ...), the pid of
//!   the faulted task (for faults that name one) and the code (or `timed out`, for delays);
//! - a failed dump or rollback leaves every surviving task running (not stopped, not ptraced),
//!   unlocked (CUDA state running), its GPU data intact (`PASS`);
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
//! - someone else's lock is left in place, and once undone the task's data is intact;
//! - no process of the world other than the workload is left (no `cuda-checkpoint` helper).
//!
//! A task killed by a `kill-target` fault, or put in the FAILED state by a `fail` fault, is
//! exempt from the per-task checks (the fault did that, not the plugin).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::runner::{Artifacts, Verdict};
use crate::scenario::Scenario;
use cuda_plugin::backend::registry::{backend_of_call, Facts, BACKENDS};

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

/// [`CODES`] in groups the plugin cannot tell apart: `cuda_plugin::backend::FailureClass`, the
/// one place where the plugin distinguishes failure codes, gives every code of a group the same
/// class for every call of either backend (a unit test checks it). A call without a target
/// (initialisation, GPU enumeration) has one class for every code. The default sweep injects
/// each group's first code (and one code into a call without a target), `--full` every code.
pub const CODE_GROUPS: &[&[&str]] = &[
    &["CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_NOT_INITIALIZED"],
    &["CUDA_ERROR_ILLEGAL_STATE"],
    &["CUDA_ERROR_NOT_READY"],
    &[
        "CUDA_ERROR_UNKNOWN",
        "CUDA_ERROR_NOT_SUPPORTED",
        "CUDA_ERROR_OUT_OF_MEMORY",
        "CUDA_ERROR_OPERATING_SYSTEM",
        "CUDA_ERROR_NOT_PERMITTED",
    ],
];

/// The codes a case of `call` injects: every code with `full`; else one per group of
/// [`CODE_GROUPS`] for a call that names a task, and one for a call without a target.
#[must_use]
pub fn codes_for(call: &str, full: bool) -> Vec<&'static str> {
    if full {
        return CODES.to_vec();
    }
    let targetless = targetless_calls().any(|c| c == call);
    if targetless {
        return vec![CODE_GROUPS[3][0]];
    }
    CODE_GROUPS.iter().map(|g| g[0]).collect()
}

/// Whether `code` is the one the default sweep injects for its group (every code with `full`).
fn representative(code: &str, full: bool) -> bool {
    full || CODE_GROUPS.iter().any(|g| g[0] == code)
}

/// The calls that name a target task, every backend's ([`BACKENDS`]: the driver's
/// `cuCheckpointProcess*` entry points, then `cuda-checkpoint`'s actions), in their order.
pub fn task_calls() -> impl Iterator<Item = &'static str> {
    BACKENDS.iter().flat_map(Facts::task_calls)
}

/// The calls without a target: the driver's [`GLOBAL_CALLS`] (which every backend needs: the
/// GPU enumeration), then the probe of each backend that is a program of its own.
pub fn targetless_calls() -> impl Iterator<Item = &'static str> {
    GLOBAL_CALLS.iter().copied().chain(
        BACKENDS
            .iter()
            .filter(|b| b.is_program)
            .map(|b| b.probe_call),
    )
}

/// Whether `call` runs a program of its own (a backend's utility), which can crash or print
/// garbage by itself.
#[must_use]
pub fn is_program_call(call: &str) -> bool {
    backend_of_call(call).is_some_and(|b| b.is_program)
}

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
    /// The caller dies of SIGSEGV: a `cuda-checkpoint` run, or, for a driver call, the
    /// plugin's helper process that makes it.
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
        self.waits() || self == Fault::AlarmHang
    }

    /// Whether a case of this fault spends its time waiting out a delay or a hang (the plugin's
    /// deadline, then its wait for the late call), with a margin of a second or more on each
    /// side: [`run_all`] may run such cases beside the others. Not the freeze-alarm hang,
    /// whose dump must end within half a second of CRIU's alarm.
    fn waits(self) -> bool {
        matches!(self, Fault::Delay(_) | Fault::Hang | Fault::HangFile)
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
        is_program_call(self.call)
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

    /// The case's key: `call|fault|phase|task|host|tree|mode` (what `--only` filters).
    #[must_use]
    pub fn key(&self) -> String {
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

/// The sweep's cases: `full` injects every code of [`CODES`] and adds the slow faults (delays
/// and hangs) everywhere; the default injects one code per group of [`CODE_GROUPS`] and keeps
/// the slow faults for the lock and checkpoint calls of the first task only.
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
    for call in task_calls() {
        let cli = is_program_call(call);
        for &phase in phases_of(call) {
            // The rollback puts back t1 (checkpointed) after t2's checkpoint failed.
            let targets: &[Target] = if phase == Phase::Rollback {
                &[Target::First]
            } else {
                &tasks
            };
            for &t in targets {
                let mut kinds: Vec<Fault> = codes_for(call, full)
                    .into_iter()
                    .map(Fault::Return)
                    .collect();
                kinds.extend([Fault::ErrorAfter, Fault::Fail, Fault::KillTarget]);
                if cli {
                    kinds.extend([Fault::Crash, Fault::Garbage]);
                } else if full {
                    // The driver's caller is the plugin's helper: the helper dies in the call
                    // (a fresh one takes over; `scenarios/cuda/helper-death/`).
                    kinds.push(Fault::Crash);
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
    for call in targetless_calls() {
        let cli = is_program_call(call);
        for phase in [Phase::Dump, Phase::Restore] {
            let mut kinds: Vec<Fault> = codes_for(call, full)
                .into_iter()
                .map(Fault::Return)
                .collect();
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
                if matches!(k, Fault::Return(c) if !representative(c, full)) {
                    continue;
                }
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

impl Case {
    /// The backend the case's call belongs to.
    fn backend(&self) -> &'static str {
        if self.cli() {
            "cuda-checkpoint"
        } else {
            "driver-api"
        }
    }

    /// The task the fault names, by name.
    fn task(&self) -> Option<&'static str> {
        match self.target {
            Target::Any => None,
            Target::First => Some("t1"),
            Target::Second => Some("t2"),
        }
    }

    /// The case as a scenario (`docs/scenarios.md`), judged by `[invariants]`: a fresh world
    /// (driver r580, one GPU), the tree `cpu` (a CPU-only root; so that a `kill-target` fault
    /// never kills the root of the dumped tree) with two CUDA children `t1` and `t2` of 4 KiB
    /// each, in new pid and mount namespaces for [`Tree::Container`]; the emulated engine of
    /// the case's profile; `cuda_plugin.timeout=1` (10 under the freeze alarm, which must bound
    /// the call instead) and the case's backend and mode. The fault is installed (a
    /// `reconfigure-world` step) only once the phase under test starts: the workload runs
    /// before a dump, the dump is done (and a task image damaged) before a restore. A rollback
    /// case adds a trigger: the checkpoint of `t2` fails, so that the faulted call is the one
    /// the rollback makes for `t1`. `harness sweep --print --only KEY` prints it.
    #[must_use]
    pub fn scenario_toml(&self) -> String {
        let c = self;
        let mut t = String::new();
        let _ = writeln!(t, "description = \"fault sweep: {}\"", c.key());
        let _ = writeln!(
            t,
            "options = [\"cuda_plugin.backend={}\", \"cuda_plugin.timeout={}\", \"cuda_plugin.parallel={}\"]",
            c.backend(),
            if c.fault == Fault::AlarmHang { 10 } else { 1 },
            if c.parallel { "auto" } else { "1" }
        );
        t.push_str("\n[world]\ndriver = { branch = 580 }\n\n[workload]\n");
        if c.tree == Tree::Container {
            t.push_str("namespaces = [\"pid\", \"mount\"]\n");
        }
        t.push_str(
            "tasks = [\n    { name = \"cpu\" },\n    \
             { name = \"t1\", parent = \"cpu\", cuda = true, kib = 4 },\n    \
             { name = \"t2\", parent = \"cpu\", cuda = true, kib = 4 },\n]\n",
        );
        let _ = writeln!(
            t,
            "\n[host]\nengine = \"emulated\"\nprofile = \"{}\"\n\n[[plugins]]\nkind = \"cuda\"",
            c.profile
        );
        if c.fault == Fault::PluginFails {
            // Loaded after ours: it declines every task and fails its DUMP_FINISH.
            t.push_str(
                "\n[[plugins]]\nkind = \"test\"\nname = \"other\"\n\
                 script = { pause = \"ret=-95\", checkpoint = \"ret=-95\", resume = \"ret=-95\", dfinish = \"ret=-5\" }\n",
            );
        }
        if c.phase == Phase::Restore {
            t.push_str("\n[[steps]]\naction = \"dump\"\nexpect = \"ok\"\n");
            if let Fault::Image(d) = c.fault {
                t.push_str(&image_damage(d, c.target));
            }
        }
        let faults = self.faults_toml();
        if !faults.is_empty() {
            let _ = write!(
                t,
                "\n[[steps]]\naction = \"reconfigure-world\"\nworld = {{ fault = [\n{faults}] }}\n"
            );
        }
        let verb = if c.phase == Phase::Restore {
            "restore"
        } else {
            "dump"
        };
        let _ = write!(t, "\n[[steps]]\naction = \"{verb}\"\nexpect = \"any\"\n");
        if c.fault == Fault::AlarmHang {
            let _ = writeln!(
                t,
                "criu_timeout = {}\nwithin = {}\nabsent = [\"FATAL\"]",
                ALARM_TIMEOUT.as_secs(),
                (ALARM_TIMEOUT + ALARM_SLACK).as_secs_f64()
            );
        } else {
            let _ = writeln!(t, "within = {}", STEP_LIMIT.as_secs());
        }
        if c.fault == Fault::HangFile {
            let _ = writeln!(t, "release_after = {}", HANG_RELEASE.as_secs_f64());
        }
        if c.fault == Fault::ScriptFails {
            t.push_str(
                "action_script = '[ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] && exit 3; exit 0'\n",
            );
        }
        t.push_str("\n[invariants]\n");
        if let Some(task) = c.task() {
            let _ = writeln!(t, "task = \"{task}\"");
        }
        if let Some(r) = c.fault.reason() {
            let _ = writeln!(t, "reason = \"{r}\"");
        }
        if c.phase == Phase::Rollback {
            t.push_str("rollback = true\n");
        }
        if c.fault == Fault::Fail {
            t.push_str("may_fail = true\n");
        }
        if let (Fault::ForeignLock, Some(task)) = (c.fault, c.task()) {
            let _ = writeln!(t, "foreign_lock = \"{task}\"");
        }
        t
    }

    /// The world's faults for the phase under test, as TOML array items: the case's own first
    /// (the one whose firing the invariants look for), then a rollback's trigger.
    fn faults_toml(&self) -> String {
        let c = self;
        if !c.fault.in_world() {
            return String::new();
        }
        let task = |t: Option<&str>| t.map(|t| format!(", task = \"{t}\"")).unwrap_or_default();
        let mut f = format!(
            "    {{ function = \"{}\"{}, nth = {}, action = {} }},\n",
            c.call,
            task(c.task()),
            c.nth(),
            c.fault.action()
        );
        if c.phase == Phase::Rollback {
            let trigger = if c.cli() {
                "cuda-checkpoint:checkpoint"
            } else {
                "cuCheckpointProcessCheckpoint"
            };
            let _ = writeln!(
                f,
                "    {{ function = \"{trigger}\", task = \"t2\", nth = 1, action = {} }},",
                Fault::Return("CUDA_ERROR_UNKNOWN").action()
            );
        }
        f
    }
}

/// The image steps that damage the target task's image after a fault-free dump.
fn image_damage(d: ImageDamage, target: Target) -> String {
    let (me, other) = match target {
        Target::Second => ("t2", "t1"),
        _ => ("t1", "t2"),
    };
    let name = format!("cuda-plugin-{{{me}}}.img");
    let step = |kind: &str, rest: &str| {
        format!("\n[[steps]]\naction = \"{kind}\"\nname = \"{name}\"\n{rest}")
    };
    match d {
        ImageDamage::Missing => step("remove-image", ""),
        ImageDamage::Empty => step("write-image", "hex = \"\"\n"),
        ImageDamage::Truncated => step("write-image", "truncate = -4\n"),
        // The image's first line is `cuda-plugin-task …`: byte 3 is an `a` (0x61).
        ImageDamage::Flipped => step("write-image", "offset = 3\nhex = \"e1\"\n"),
        ImageDamage::OtherPid => step(
            "write-image",
            &format!("from = \"cuda-plugin-{{{other}}}.img\"\n"),
        ),
        ImageDamage::UnknownState => step(
            "write-image",
            "replace = [\"initial_state running\", \"initial_state 77\"]\n",
        ),
        ImageDamage::Fifo => step("special-image", "kind = \"fifo\"\n"),
        ImageDamage::DevZero => step("special-image", "kind = \"dev-zero\"\n"),
    }
}

/// Runs one case: its scenario through the runner ([`crate::runner::run`]), judged by its
/// invariants.
#[must_use]
pub fn run_case(case: &Case, art: &Artifacts) -> CaseResult {
    let start = Instant::now();
    let text = case.scenario_toml();
    let s = match Scenario::parse(&format!("sweep case {}", case.key()), &text) {
        Ok(s) => s,
        Err(e) => {
            return CaseResult {
                case: *case,
                outcome: "setup failed".to_owned(),
                fired: false,
                violations: vec![format!("the case's scenario: {e}")],
                elapsed: start.elapsed(),
                detail: text,
            }
        }
    };
    let report = crate::runner::run(&s, art, crate::runner::RunOptions::default());
    let (outcome, fired, violations) = match (report.invariants, report.verdict) {
        (Some(r), _) => (r.outcome, r.fired, r.violations),
        (None, Verdict::Fail(e)) => (
            "setup failed".to_owned(),
            false,
            vec![format!("setup: {}", e.lines().next().unwrap_or(""))],
        ),
        (None, other) => (
            "setup failed".to_owned(),
            false,
            vec![format!("setup: {other:?}")],
        ),
    };
    let detail = if violations.is_empty() {
        String::new()
    } else {
        report.transcript
    };
    CaseResult {
        case: *case,
        outcome,
        fired,
        violations,
        elapsed: start.elapsed(),
        detail,
    }
}

/// Runs `cases`, `jobs` at a time, and beside them, on `waiting_jobs` workers of their own, the
/// cases that mostly wait (a delay or a hang, with a margin of a second or more; with
/// `waiting_jobs` 0 they join the others). `progress` is called with each result as it
/// completes. Every case runs once: a case that fails its invariants fails the sweep. Returns
/// the results in case order.
///
/// The waiting cases took half the sweep's time on a 2-core machine while using a tenth of its
/// CPU; beside the quick cases they no longer add to its length. The freeze-alarm cases stay
/// with the others, first, so that none starts last and holds the sweep up.
pub fn run_all(
    cases: &[Case],
    art: &Artifacts,
    jobs: usize,
    waiting_jobs: usize,
    progress: &(dyn Fn(&CaseResult) + Sync),
) -> Vec<CaseResult> {
    let mut order: Vec<(usize, Case)> = cases.iter().copied().enumerate().collect();
    order.sort_by_key(|(_, c)| !is_slow(c));
    let (waiting, others): (Vec<_>, Vec<_>) = order
        .into_iter()
        .partition(|(_, c)| waiting_jobs > 0 && c.fault.waits());
    let run = |items: Vec<(usize, Case)>, n: usize| {
        crate::runner::pool::run(
            items,
            n,
            |(i, c)| (i, run_case(&c, art)),
            |(_, r)| progress(r),
        )
    };
    let mut results = std::thread::scope(|sc| {
        let beside = sc.spawn(|| run(waiting, waiting_jobs));
        let mut results = run(others, jobs);
        results.extend(
            beside
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        );
        results
    });
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use abi::CUresult;
    use cuda_plugin::backend::{BackendKind, FailureClass, Op};

    fn code(name: &str) -> CUresult {
        CUresult::from_name(name).unwrap_or_else(|| panic!("{name} is not a CUresult"))
    }

    /// The backend and operation of a call the sweep faults.
    fn op_of(call: &str) -> (BackendKind, Op) {
        let b = backend_of_call(call).unwrap_or(&cuda_plugin::backend::registry::DRIVER_API);
        let op = b
            .calls
            .iter()
            .find(|(_, c)| *c == call)
            .map_or(Op::Init, |(op, _)| *op);
        (b.kind, op)
    }

    /// The plugin's own error mapping proves the grouping: within a group, every code gets the
    /// same class from every call the sweep faults; every code is in one group; and a call
    /// without a target gives every code one class.
    #[test]
    fn code_groups_are_codes_the_plugin_cannot_tell_apart() {
        let mut all: Vec<&str> = CODE_GROUPS.iter().flat_map(|g| g.iter().copied()).collect();
        all.sort_unstable();
        let mut codes = CODES.to_vec();
        codes.sort_unstable();
        assert_eq!(all, codes, "every code in exactly one group");
        // The classes the plugin gives `codes` from `call`, and whether they are all one.
        let classes = |call: &str, codes: &[&str]| {
            let (backend, op) = op_of(call);
            let c: Vec<FailureClass> = codes
                .iter()
                .map(|c| FailureClass::of(backend, op, code(c)))
                .collect();
            let one = c.iter().all(|x| *x == c[0]);
            (op, c, one)
        };
        for call in task_calls() {
            for g in CODE_GROUPS {
                let (op, c, one) = classes(call, g);
                assert_ne!(op, Op::Init, "{call}");
                assert!(
                    one,
                    "{call}: the plugin tells the codes of {g:?} apart: {c:?}"
                );
            }
        }
        for call in targetless_calls() {
            let (op, c, one) = classes(call, CODES);
            assert_eq!(op, Op::Init, "{call}");
            assert!(one, "{call}: {c:?}");
            assert_eq!(codes_for(call, false).len(), 1);
        }
        // The groups are not finer than they need be for the calls that tell codes apart: each
        // group has a class no other group has for some call.
        for (i, g) in CODE_GROUPS.iter().enumerate() {
            let distinct = task_calls().any(|call| {
                let (backend, op) = op_of(call);
                let mine = FailureClass::of(backend, op, code(g[0]));
                CODE_GROUPS
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .all(|(_, h)| FailureClass::of(backend, op, code(h[0])) != mine)
            });
            assert!(
                distinct,
                "group {g:?} is handled like another group by every call"
            );
        }
    }

    #[test]
    fn the_default_sweep_injects_one_code_per_group_and_full_every_code() {
        let default: std::collections::BTreeSet<&str> = cases(false)
            .iter()
            .filter_map(|c| match c.fault {
                Fault::Return(code) => Some(code),
                _ => None,
            })
            .collect();
        let firsts: std::collections::BTreeSet<&str> = CODE_GROUPS.iter().map(|g| g[0]).collect();
        assert_eq!(default, firsts);
        let full: std::collections::BTreeSet<&str> = cases(true)
            .iter()
            .filter_map(|c| match c.fault {
                Fault::Return(code) => Some(code),
                _ => None,
            })
            .collect();
        assert_eq!(full, CODES.iter().copied().collect());
    }
}
