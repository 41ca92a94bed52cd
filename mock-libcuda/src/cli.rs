//! The `cuda-checkpoint` command line, as the driver serves it through its export table.
//!
//! NVIDIA's `cuda-checkpoint` binary is a trampoline: it asks `libcuda.so.1` for an export table
//! and hands `argc`/`argv` to the function in it, so parsing, help text, messages and exit
//! statuses all belong to the driver. [`run`] is that function for the mock, written against
//! [`CheckpointDriver`] so it can be tested without a world. It is pure apart from the two
//! writers and the driver, and total: no input makes it panic.
//!
//! # Generations
//!
//! | [`CliGeneration`] | operations | options |
//! |---|---|---|
//! | `R550` | `--toggle` | `--pid <pid>`, `--help` (long forms only) |
//! | `R555` | `--get-state`, `--action lock\|checkpoint\|restore\|unlock`, `--toggle`, `--get-restore-tid` | `--pid\|-p`, `--timeout\|-t`, `--help\|-h` |
//! | `R580` | as R555 | adds `--device-map\|-d <old=new,...>` (restore only) |
//! | `R590` | adds `--launch-job\|-j <program> [args...]` | as R580 |
//!
//! An option of a later generation is an unrecognized option in an earlier one.
//!
//! # Outputs and exit statuses
//!
//! * `--help`: the help text on `out`, exit 0.
//! * `--get-state`: the state word (`running`, `locked`, `checkpointed`, `failed`, …) and a
//!   newline on `out`; `--get-restore-tid`: the thread id in decimal and a newline on `out`;
//!   `--action …` and `--toggle`: nothing. Exit 0.
//! * A failing driver call: one line on `err` in the utility's templates
//!   (`Could not lock on process ID <pid>: "<cuGetErrorString text>"`,
//!   `Error getting process state for process ID <pid>: "…"`,
//!   `Error toggling CUDA in process ID <pid>: "…"`, `Error initializing CUDA: "…"`), and the
//!   exit status is the `CUresult` modulo 256 ([`CUresult::exit_status`]), as the real utility
//!   returns the positive code from `main`. A code that is a multiple of 256 therefore exits 0,
//!   exactly as it would with the real utility (no known code is).
//! * A usage error: `cuda-checkpoint: <what is wrong>` and a hint line on `err`, exit
//!   [`EXIT_USAGE`] (1). Note that 1 is also the status of `CUDA_ERROR_INVALID_VALUE`.
//!
//! # Choices made where the reference is silent
//!
//! * Parsing follows `getopt_long` conventions: `--opt value`, `--opt=value`, `-p value`,
//!   `-pvalue`, short flags may be clustered (`-hp1`), `--` ends the options. Long options
//!   must be spelled out in full (no unambiguous-prefix matching). Options are processed left
//!   to right: `--help` prints the help and exits 0 as soon as it is reached, so an error in
//!   an option before it wins, and anything after it is not looked at. Positional arguments
//!   are collected and rejected after the scan ("unexpected argument"), as getopt permutes them.
//! * In R550 no short option exists (its help lists none).
//! * Exactly one operation per invocation; repeating the same one is harmless, two different
//!   ones (including two different `--action` words) are a usage error. `--pid`, `--timeout`
//!   and `--device-map` may repeat; the last one wins. The action word is exact and lowercase.
//! * `--pid` is a positive decimal number that fits an `int` (`0`, negatives, signs, spaces
//!   are usage errors); it is required by every operation but `--help` and `--launch-job`.
//! * `--timeout <ms>` is a decimal `u32`. It is accepted with every operation and used
//!   wherever a lock happens: `--action lock` and the lock step of `--toggle`; other
//!   operations ignore it. Absent means 0 (wait without limit), as in `CUcheckpointLockArgs`.
//! * `--device-map` is parsed (strictly, see [`parse_device_map`]) wherever it appears; a
//!   syntax error is a usage error. With `--action` other than `restore` it is refused with
//!   "--device-map is only allowed for restore action" (exit 1); with `--toggle`,
//!   `--get-state` and `--get-restore-tid` it is accepted and ignored (the real utility was
//!   seen to ignore it with `--toggle`). Repeated endpoints and GPUs that do not exist are
//!   not checked here: the driver's restore refuses them (`CUDA_ERROR_INVALID_VALUE`).
//! * The utility initialises CUDA in its own process ([`CheckpointDriver::init`]) once, before
//!   the first driver call of every operation that targets a process, not only before a
//!   restore: a field report shows `Error initializing CUDA` from `--get-restore-tid`.
//! * `--toggle` reads the state first: RUNNING → lock (with `--timeout`) then checkpoint;
//!   CHECKPOINTED → restore (no GPU pairs) then unlock; any other state fails with
//!   `CUDA_ERROR_ILLEGAL_STATE`. A failing step is not rolled back (a failed checkpoint
//!   leaves the process LOCKED), in line with the utility making no attempt to repair a
//!   process after an error.
//! * `--launch-job` (R590+) is parsed (the program and everything after it belong to the job)
//!   but not carried out: the mock prints that it does not support it and exits with the
//!   status of `CUDA_ERROR_NOT_SUPPORTED` (801 → 33).
//! * A state the driver reports that has no word prints `unknown(<n>)`; a `CUresult` without a
//!   description is quoted as `unrecognized error code <n>`.
//! * If writing the help, the state or the thread id to `out` fails, a message goes to `err`
//!   and the exit status is 1. Failures to write to `err` are ignored.
//! * Messages name the program `cuda-checkpoint`, whatever `argv[0]` says.

use std::fmt;
use std::io::Write;

use abi::{CUprocessState, CUresult, GpuUuid};

use crate::cli_api::CheckpointDriver;
use crate::world::config::CliGeneration;

/// Exit status of a usage error (unknown option, missing or bad value, stray argument, …).
pub const EXIT_USAGE: i32 = 1;

/// The name messages give the program.
const PROGRAM: &str = "cuda-checkpoint";

/// One of the four steps of `--action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `cuCheckpointProcessLock`.
    Lock,
    /// `cuCheckpointProcessCheckpoint`.
    Checkpoint,
    /// `cuCheckpointProcessRestore`.
    Restore,
    /// `cuCheckpointProcessUnlock`.
    Unlock,
}

impl Action {
    /// The word on the command line (`lock`, …).
    #[must_use]
    pub const fn word(self) -> &'static str {
        match self {
            Action::Lock => "lock",
            Action::Checkpoint => "checkpoint",
            Action::Restore => "restore",
            Action::Unlock => "unlock",
        }
    }

    /// Parses the exact, lowercase word.
    #[must_use]
    pub fn from_word(s: &str) -> Option<Action> {
        [
            Action::Lock,
            Action::Checkpoint,
            Action::Restore,
            Action::Unlock,
        ]
        .into_iter()
        .find(|a| a.word() == s)
    }
}

/// The operation an invocation asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// `--help` / `-h`.
    Help,
    /// `--get-state`.
    GetState,
    /// `--get-restore-tid`.
    GetRestoreTid,
    /// `--toggle`.
    Toggle,
    /// `--action <word>`.
    Action(Action),
    /// `--launch-job <program> [args…]` (R590+).
    LaunchJob {
        /// The program to launch.
        program: String,
        /// Its arguments.
        args: Vec<String>,
    },
}

impl Operation {
    /// The `<op>` of the fault function `cuda-checkpoint:<op>` this operation answers to
    /// (`lock`, `checkpoint`, `restore`, `unlock`, `get-state`, `get-restore-tid`, `toggle`,
    /// `help`, `launch-job`).
    #[must_use]
    pub const fn fault_name(&self) -> &'static str {
        match self {
            Operation::Help => "help",
            Operation::GetState => "get-state",
            Operation::GetRestoreTid => "get-restore-tid",
            Operation::Toggle => "toggle",
            Operation::Action(a) => a.word(),
            Operation::LaunchJob { .. } => "launch-job",
        }
    }

    /// How the operation is spelled on the command line, for messages.
    fn spelling(&self) -> String {
        match self {
            Operation::Action(a) => format!("--action {}", a.word()),
            other => format!("--{}", other.fault_name()),
        }
    }
}

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// What to do.
    pub operation: Operation,
    /// `--pid`; always present for operations that target a process.
    pub pid: Option<i32>,
    /// `--timeout` in milliseconds.
    pub timeout_ms: Option<u32>,
    /// `--device-map` pairs (`old`, `new`).
    pub device_map: Option<Vec<(GpuUuid, GpuUuid)>>,
}

impl Invocation {
    /// The fault functions this invocation answers to: `cuda-checkpoint` and
    /// `cuda-checkpoint:<op>` (see [`crate::world::config::FaultSpec::function`]).
    #[must_use]
    pub fn fault_functions(&self) -> [&'static str; 2] {
        let specific = match self.operation {
            Operation::Help => "cuda-checkpoint:help",
            Operation::GetState => "cuda-checkpoint:get-state",
            Operation::GetRestoreTid => "cuda-checkpoint:get-restore-tid",
            Operation::Toggle => "cuda-checkpoint:toggle",
            Operation::Action(Action::Lock) => "cuda-checkpoint:lock",
            Operation::Action(Action::Checkpoint) => "cuda-checkpoint:checkpoint",
            Operation::Action(Action::Restore) => "cuda-checkpoint:restore",
            Operation::Action(Action::Unlock) => "cuda-checkpoint:unlock",
            Operation::LaunchJob { .. } => "cuda-checkpoint:launch-job",
        };
        ["cuda-checkpoint", specific]
    }
}

/// Why a command line is not a valid invocation. Each is reported as
/// `cuda-checkpoint: <message>` and exits [`EXIT_USAGE`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    /// An option this generation does not know.
    #[error("unrecognized option '{0}'")]
    UnknownOption(String),
    /// An option that needs a value came last.
    #[error("option '{0}' requires an argument")]
    MissingValue(String),
    /// `--flag=value` for a flag that takes none.
    #[error("option '{0}' doesn't allow an argument")]
    UnexpectedValue(String),
    /// A positional argument.
    #[error("unexpected argument '{0}'")]
    StrayArgument(String),
    /// A `--pid` value that is not a positive `int`.
    #[error("invalid process ID '{0}': expected a positive decimal number")]
    BadPid(String),
    /// A `--timeout` value that is not a `u32`.
    #[error("invalid timeout '{0}': expected milliseconds, a decimal number from 0 to 4294967295")]
    BadTimeout(String),
    /// An `--action` word that is not one of the four.
    #[error("unknown action '{0}': expected lock, checkpoint, restore or unlock")]
    UnknownAction(String),
    /// A `--device-map` value with bad syntax.
    #[error("invalid device map '{value}': {reason}")]
    BadDeviceMap {
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `--device-map` with an action other than restore.
    #[error("--device-map is only allowed for restore action")]
    DeviceMapNotRestore,
    /// Two different operations.
    #[error("only one operation may be given, not both {0} and {1}")]
    ConflictingOperations(String, String),
    /// No operation at all.
    #[error("no operation given")]
    NoOperation,
    /// An operation that targets a process, without `--pid`.
    #[error("{0} needs --pid <pid>")]
    MissingPid(String),
}

/// What an option does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opt {
    GetState,
    Action,
    Toggle,
    GetRestoreTid,
    LaunchJob,
    Pid,
    Timeout,
    DeviceMap,
    Help,
}

/// One option: long name, optional short letter (with the generation it appeared in),
/// whether it takes a value, and the generation the long form appeared in.
struct OptSpec {
    opt: Opt,
    long: &'static str,
    short: Option<(char, CliGeneration)>,
    takes_value: bool,
    since: CliGeneration,
}

const OPTIONS: &[OptSpec] = &[
    OptSpec {
        opt: Opt::GetState,
        long: "get-state",
        short: None,
        takes_value: false,
        since: CliGeneration::R555,
    },
    OptSpec {
        opt: Opt::Action,
        long: "action",
        short: None,
        takes_value: true,
        since: CliGeneration::R555,
    },
    OptSpec {
        opt: Opt::Toggle,
        long: "toggle",
        short: None,
        takes_value: false,
        since: CliGeneration::R550,
    },
    OptSpec {
        opt: Opt::GetRestoreTid,
        long: "get-restore-tid",
        short: None,
        takes_value: false,
        since: CliGeneration::R555,
    },
    OptSpec {
        opt: Opt::LaunchJob,
        long: "launch-job",
        short: Some(('j', CliGeneration::R590)),
        takes_value: true,
        since: CliGeneration::R590,
    },
    OptSpec {
        opt: Opt::Pid,
        long: "pid",
        short: Some(('p', CliGeneration::R555)),
        takes_value: true,
        since: CliGeneration::R550,
    },
    OptSpec {
        opt: Opt::Timeout,
        long: "timeout",
        short: Some(('t', CliGeneration::R555)),
        takes_value: true,
        since: CliGeneration::R555,
    },
    OptSpec {
        opt: Opt::DeviceMap,
        long: "device-map",
        short: Some(('d', CliGeneration::R580)),
        takes_value: true,
        since: CliGeneration::R580,
    },
    OptSpec {
        opt: Opt::Help,
        long: "help",
        short: Some(('h', CliGeneration::R555)),
        takes_value: false,
        since: CliGeneration::R550,
    },
];

fn find_long(name: &str, generation: CliGeneration) -> Option<&'static OptSpec> {
    OPTIONS
        .iter()
        .find(|o| o.long == name && o.since <= generation)
}

fn find_short(c: char, generation: CliGeneration) -> Option<&'static OptSpec> {
    OPTIONS
        .iter()
        .find(|o| matches!(o.short, Some((s, since)) if s == c && since <= generation))
}

/// Parses a `--device-map` value: comma-separated `old=new` pairs of GPU UUIDs in their
/// full, lowercase text form (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, see
/// [`GpuUuid::parse`]). No spaces, no empty entries, no UUID prefixes, no `MIG-` ids.
/// Whether the pairs make sense (every checkpointed GPU covered, no endpoint repeated,
/// GPUs exist) is the driver's restore to judge, not the parser's.
pub fn parse_device_map(s: &str) -> Result<Vec<(GpuUuid, GpuUuid)>, String> {
    if s.is_empty() {
        return Err("the map is empty; expected <old-uuid>=<new-uuid>[,...]".to_owned());
    }
    s.split(',')
        .enumerate()
        .map(|(i, entry)| {
            let n = i + 1;
            if entry.is_empty() {
                return Err(format!("entry {n} is empty"));
            }
            let (old, new) = entry
                .split_once('=')
                .ok_or_else(|| format!("entry {n} ({entry:?}) is not <old-uuid>=<new-uuid>"))?;
            let old = GpuUuid::parse(old).map_err(|e| format!("entry {n}: {e}"))?;
            let new = GpuUuid::parse(new).map_err(|e| format!("entry {n}: {e}"))?;
            Ok((old, new))
        })
        .collect()
}

fn parse_pid(v: &str) -> Result<i32, UsageError> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(UsageError::BadPid(v.to_owned()));
    }
    match v.parse::<i32>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(UsageError::BadPid(v.to_owned())),
    }
}

fn parse_timeout(v: &str) -> Result<u32, UsageError> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(UsageError::BadTimeout(v.to_owned()));
    }
    v.parse::<u32>()
        .map_err(|_| UsageError::BadTimeout(v.to_owned()))
}

/// Accumulates options during the scan.
#[derive(Default)]
struct Builder {
    operation: Option<Operation>,
    pid: Option<i32>,
    timeout_ms: Option<u32>,
    device_map: Option<Vec<(GpuUuid, GpuUuid)>>,
}

impl Builder {
    fn set_operation(&mut self, op: Operation) -> Result<(), UsageError> {
        match &self.operation {
            Some(prev) if *prev != op => Err(UsageError::ConflictingOperations(
                prev.spelling(),
                op.spelling(),
            )),
            _ => {
                self.operation = Some(op);
                Ok(())
            }
        }
    }
}

/// What applying one option asks the scanner to do next.
enum Next {
    Continue,
    /// `--help`: stop, the result is help.
    Help,
    /// `--launch-job`: stop, the rest of argv belongs to the job.
    Job(String),
}

fn apply(b: &mut Builder, opt: Opt, value: Option<&str>) -> Result<Next, UsageError> {
    let value = value.unwrap_or_default();
    match opt {
        Opt::Help => return Ok(Next::Help),
        Opt::LaunchJob => return Ok(Next::Job(value.to_owned())),
        Opt::GetState => b.set_operation(Operation::GetState)?,
        Opt::GetRestoreTid => b.set_operation(Operation::GetRestoreTid)?,
        Opt::Toggle => b.set_operation(Operation::Toggle)?,
        Opt::Action => {
            let a = Action::from_word(value)
                .ok_or_else(|| UsageError::UnknownAction(value.to_owned()))?;
            b.set_operation(Operation::Action(a))?;
        }
        Opt::Pid => b.pid = Some(parse_pid(value)?),
        Opt::Timeout => b.timeout_ms = Some(parse_timeout(value)?),
        Opt::DeviceMap => {
            let map = parse_device_map(value).map_err(|reason| UsageError::BadDeviceMap {
                value: value.to_owned(),
                reason,
            })?;
            b.device_map = Some(map);
        }
    }
    Ok(Next::Continue)
}

/// Parses `argv` (with `argv[0]`, the program name, first) as the given generation does.
/// The glue uses it to find which `cuda-checkpoint:<op>` faults apply before [`run`].
pub fn parse(argv: &[String], generation: CliGeneration) -> Result<Invocation, UsageError> {
    let mut b = Builder::default();
    let mut stray: Option<String> = None;
    let args = argv.get(1..).unwrap_or_default();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        i += 1;
        let next = if arg == "--" {
            if stray.is_none() {
                stray = args.get(i).cloned();
            }
            break;
        } else if let Some(body) = arg.strip_prefix("--") {
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (body, None),
            };
            let spec = find_long(name, generation)
                .ok_or_else(|| UsageError::UnknownOption(format!("--{name}")))?;
            let value = match (spec.takes_value, inline) {
                (false, Some(_)) => return Err(UsageError::UnexpectedValue(format!("--{name}"))),
                (false, None) => None,
                (true, Some(v)) => Some(v),
                (true, None) => {
                    let v = args
                        .get(i)
                        .ok_or_else(|| UsageError::MissingValue(format!("--{name}")))?;
                    i += 1;
                    Some(v.as_str())
                }
            };
            apply(&mut b, spec.opt, value)?
        } else if arg.len() > 1 && arg.starts_with('-') {
            let mut next = Next::Continue;
            let cluster = &arg[1..];
            for (pos, c) in cluster.char_indices() {
                let spec = find_short(c, generation)
                    .ok_or_else(|| UsageError::UnknownOption(format!("-{c}")))?;
                let value = if spec.takes_value {
                    let rest = &cluster[pos + c.len_utf8()..];
                    if rest.is_empty() {
                        let v = args
                            .get(i)
                            .ok_or_else(|| UsageError::MissingValue(format!("-{c}")))?;
                        i += 1;
                        Some(v.as_str())
                    } else {
                        Some(rest)
                    }
                } else {
                    None
                };
                next = apply(&mut b, spec.opt, value)?;
                if spec.takes_value || !matches!(next, Next::Continue) {
                    break;
                }
            }
            next
        } else {
            if stray.is_none() {
                stray = Some(arg.to_owned());
            }
            Next::Continue
        };
        match next {
            Next::Continue => {}
            Next::Help => {
                return Ok(Invocation {
                    operation: Operation::Help,
                    pid: b.pid,
                    timeout_ms: b.timeout_ms,
                    device_map: b.device_map,
                })
            }
            Next::Job(program) => {
                let job_args = args.get(i..).unwrap_or_default().to_vec();
                b.set_operation(Operation::LaunchJob {
                    program,
                    args: job_args,
                })?;
                break;
            }
        }
    }
    if let Some(s) = stray {
        return Err(UsageError::StrayArgument(s));
    }
    let operation = b.operation.ok_or(UsageError::NoOperation)?;
    if b.device_map.is_some() && matches!(&operation, Operation::Action(a) if *a != Action::Restore)
    {
        return Err(UsageError::DeviceMapNotRestore);
    }
    let needs_pid = !matches!(&operation, Operation::Help | Operation::LaunchJob { .. });
    if needs_pid && b.pid.is_none() {
        return Err(UsageError::MissingPid(operation.spelling()));
    }
    Ok(Invocation {
        operation,
        pid: b.pid,
        timeout_ms: b.timeout_ms,
        device_map: b.device_map,
    })
}

/// The fault functions and target an argv answers to, for the export-table glue: what
/// [`Invocation::fault_functions`] and [`Invocation::pid`] give for a valid command line, and
/// just `cuda-checkpoint` with no target for an invalid one.
#[must_use]
pub fn fault_key(argv: &[String], generation: CliGeneration) -> (Vec<&'static str>, Option<i32>) {
    match parse(argv, generation) {
        Ok(inv) => (inv.fault_functions().to_vec(), inv.pid),
        Err(_) => (vec!["cuda-checkpoint"], None),
    }
}

/// The `cuGetErrorString` text of a code, as the messages quote it.
pub fn describe(code: CUresult) -> String {
    match code.description() {
        Some(d) => d.to_owned(),
        None => format!("unrecognized error code {}", code.0),
    }
}

/// A failed driver call: the message line and the exit status.
struct Failure {
    message: String,
    code: CUresult,
}

impl Failure {
    fn new(code: CUresult, context: impl fmt::Display) -> Failure {
        Failure {
            message: format!("{context}: \"{}\"", describe(code)),
            code,
        }
    }
}

fn init(driver: &dyn CheckpointDriver) -> Result<(), Failure> {
    driver
        .init()
        .map_err(|c| Failure::new(c, "Error initializing CUDA"))
}

fn action_failure(a: Action, pid: i32) -> impl Fn(CUresult) -> Failure {
    move |c| {
        Failure::new(
            c,
            format_args!("Could not {} on process ID {pid}", a.word()),
        )
    }
}

fn do_action(
    driver: &dyn CheckpointDriver,
    a: Action,
    pid: i32,
    timeout_ms: u32,
    pairs: &[(GpuUuid, GpuUuid)],
) -> Result<(), Failure> {
    let fail = action_failure(a, pid);
    match a {
        Action::Lock => driver.lock(pid, timeout_ms).map_err(fail),
        Action::Checkpoint => driver.checkpoint(pid).map_err(fail),
        Action::Restore => driver.restore(pid, pairs).map_err(fail),
        Action::Unlock => driver.unlock(pid).map_err(fail),
    }
}

fn toggle(driver: &dyn CheckpointDriver, pid: i32, timeout_ms: u32) -> Result<(), CUresult> {
    let state = driver.get_state(pid)?;
    match state {
        CUprocessState::RUNNING => {
            driver.lock(pid, timeout_ms)?;
            driver.checkpoint(pid)
        }
        CUprocessState::CHECKPOINTED => {
            driver.restore(pid, &[])?;
            driver.unlock(pid)
        }
        _ => Err(CUresult::ERROR_ILLEGAL_STATE),
    }
}

fn state_word(s: CUprocessState) -> String {
    match s.cli_word() {
        Some(w) => w.to_owned(),
        None => format!("unknown({})", s.0),
    }
}

/// Carries out a valid invocation; `Ok(text)` is what goes to `out`.
fn execute(
    inv: &Invocation,
    generation: CliGeneration,
    driver: &dyn CheckpointDriver,
) -> Result<String, Failure> {
    let pid = inv.pid.unwrap_or_default();
    let timeout_ms = inv.timeout_ms.unwrap_or(0);
    match &inv.operation {
        Operation::Help => Ok(help_text(generation, driver)),
        Operation::LaunchJob { program, .. } => Err(Failure::new(
            CUresult::ERROR_NOT_SUPPORTED,
            format_args!(
                "Error launching job {program:?} (--launch-job is not implemented by the mock driver)"
            ),
        )),
        Operation::GetState => {
            init(driver)?;
            let st = driver.get_state(pid).map_err(|c| {
                Failure::new(
                    c,
                    format_args!("Error getting process state for process ID {pid}"),
                )
            })?;
            Ok(format!("{}\n", state_word(st)))
        }
        Operation::GetRestoreTid => {
            init(driver)?;
            let tid = driver.get_restore_tid(pid).map_err(|c| {
                Failure::new(
                    c,
                    format_args!("Error getting restore thread ID for process ID {pid}"),
                )
            })?;
            Ok(format!("{tid}\n"))
        }
        Operation::Toggle => {
            init(driver)?;
            toggle(driver, pid, timeout_ms).map_err(|c| {
                Failure::new(c, format_args!("Error toggling CUDA in process ID {pid}"))
            })?;
            Ok(String::new())
        }
        Operation::Action(a) => {
            init(driver)?;
            let pairs = inv.device_map.as_deref().unwrap_or_default();
            do_action(driver, *a, pid, timeout_ms, pairs)?;
            Ok(String::new())
        }
    }
}

/// Runs one `cuda-checkpoint` invocation: `argv[0]` is the program name, `generation` the
/// driver generation whose command line to speak, `driver` carries the operations out.
/// Normal output goes to `out`, messages to `err`. Returns the exit status (0..=255).
/// See the module documentation for the exact behaviour.
pub fn run(
    argv: &[String],
    generation: CliGeneration,
    driver: &dyn CheckpointDriver,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let inv = match parse(argv, generation) {
        Ok(inv) => inv,
        Err(e) => {
            let _ = write!(
                err,
                "{PROGRAM}: {e}\nTry '{PROGRAM} --help' for more information.\n"
            );
            let _ = err.flush();
            return EXIT_USAGE;
        }
    };
    match execute(&inv, generation, driver) {
        Ok(text) => {
            if text.is_empty() {
                return 0;
            }
            match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                Ok(()) => 0,
                Err(e) => {
                    let _ = writeln!(err, "{PROGRAM}: cannot write the output: {e}");
                    let _ = err.flush();
                    1
                }
            }
        }
        Err(f) => {
            let _ = writeln!(err, "{}", f.message);
            let _ = err.flush();
            i32::from(f.code.exit_status())
        }
    }
}

/// The copyright year of a driver branch's help text.
fn year(branch: u32) -> u32 {
    match branch {
        0..=569 => 2024,
        570..=599 => 2025,
        _ => 2026,
    }
}

/// The help text of a generation, for the driver `driver` reports (its full version and
/// branch go into the banner). Layout as the real utility's; wording the mock's own.
#[must_use]
pub fn help_text(generation: CliGeneration, driver: &dyn CheckpointDriver) -> String {
    let (branch, version) = driver.branch();
    let mut h = String::new();
    let banner = "CUDA checkpoint and restore utility.";
    let copyright = format!(
        "Copyright (C) {} the criu-cuda authors. A mock of the NVIDIA tool, not NVIDIA software.",
        year(branch)
    );
    if generation == CliGeneration::R550 {
        h.push_str(banner);
        h.push('\n');
        h.push_str(
            "Moves the CUDA state of a running process into host memory, or back onto the GPU.\n",
        );
        h.push_str(&format!("Version {version}. {copyright}\n\n"));
        h.push_str("    --toggle --pid <value>\n");
        h.push_str(
            "\tCheckpoint the process if it is running, restore it if it is checkpointed.\n\n",
        );
        h.push_str("    --help\n");
        h.push_str("\tShow this text and exit.\n");
        return h;
    }
    let r580 = generation >= CliGeneration::R580;
    h.push_str(banner);
    h.push('\n');
    h.push_str(&format!("Version {version}. {copyright}\n\n"));
    h.push_str("Operations:\n");
    h.push_str("--get-state --pid <pid>\n");
    h.push_str(
        "\tPrint the checkpoint state of the process: running, locked, checkpointed or failed.\n\n",
    );
    h.push_str("--action lock | checkpoint | restore | unlock --pid <pid> [--timeout <ms>]");
    if r580 {
        h.push_str(" [--device-map <uuids>]");
    }
    h.push('\n');
    h.push_str("\tRun one step of a checkpoint or a restore:\n");
    h.push_str("\t  lock        wait for submitted work, then block further CUDA calls (running -> locked)\n");
    h.push_str("\t  checkpoint  copy device memory into host memory and release the GPUs (locked -> checkpointed)\n");
    h.push_str(
        "\t  restore     acquire GPUs again and copy the memory back (checkpointed -> locked)\n",
    );
    h.push_str("\t  unlock      let the process make CUDA calls again (locked -> running)\n");
    if r580 {
        h.push_str("\tA restore may move the process to other GPUs with --device-map.\n");
    }
    h.push('\n');
    h.push_str("--toggle --pid <pid>\n");
    h.push_str(
        "\tLock and checkpoint a running process, or restore and unlock a checkpointed one.\n\n",
    );
    h.push_str("--get-restore-tid --pid <pid>\n");
    h.push_str(
        "\tPrint the ID of the thread that serves checkpoint requests inside the process.\n\n",
    );
    if generation >= CliGeneration::R590 {
        h.push_str("--launch-job|-j <program> [<arg1> ... [<argn>]]\n");
        h.push_str("\tStart a program as a checkpoint job, with a job file named by CUDA_CHECKPOINT_JOB_FILE.\n");
        h.push_str("\t(The mock driver lists this operation but does not carry it out.)\n\n");
    }
    h.push_str("Options:\n");
    h.push_str("--pid|-p <pid>\n");
    h.push_str("\tThe process to operate on; any of its thread IDs names it as well.\n\n");
    h.push_str("--timeout|-t <timeout>\n");
    h.push_str(
        "\tMilliseconds a lock may wait for the process; 0, the default, waits without limit.\n\n",
    );
    if r580 {
        h.push_str("--device-map|-d <deviceUuids>\n");
        h.push_str("\tComma-separated <old>=<new> pairs of full GPU UUIDs (GPU-xxxxxxxx-...) for restore;\n");
        h.push_str("\tthe map must name every GPU the process was checkpointed on.\n\n");
    }
    h.push_str("--help|-h\n");
    h.push_str("\tShow this text and exit.\n");
    h
}

#[cfg(test)]
#[path = "cli/tests.rs"]
mod tests;
