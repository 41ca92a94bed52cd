//! The `cuda-checkpoint` backend: NVIDIA's utility (r555+), run once per operation.
//!
//! Every run passes an argv (no shell), captures stdout and stderr together (as CRIU's C plugin
//! does), closes CRIU's descriptors in the child (see [`crate::ffi::spawn`]), and waits with a
//! deadline: on timeout the child is killed with SIGKILL and reaped. NVIDIA notes that killing
//! the utility mid-operation can leave the driver out of step; the lifecycle engine therefore
//! re-queries the state before any rollback step.
//!
//! Runs are expensive (tens of milliseconds to seconds each), so the backend runs the utility as
//! rarely as it can: the restore TID is cached per pid between hooks, and the engine avoids
//! state queries where its records already know the answer. Per dump of N CUDA processes that is
//! at most 4N+1 runs (the `-h` probe, then `--get-restore-tid`, `--get-state`, `lock` and
//! `checkpoint` per process); per restore at most 2N+1 when the dump left per-task records.
//!
//! Capabilities come from `cuda-checkpoint -h`: `--action` must appear (r555+), and a device map
//! needs `--device-map` (r580+).

use super::{
    lock_timeout_ms, op_deadline, Backend, BackendError, BackendKind, ExitInfo, FailureClass,
    GpuPair, Job, JobResult, LockLimits, Op, Pid, Tid,
};
use abi::CUprocessState;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The utility's file name, looked up in `PATH` when no `cuda-checkpoint=PATH` option is given.
pub const PROGRAM: &str = "cuda-checkpoint";

/// At most this much output is kept per run.
const OUTPUT_LIMIT: usize = 64 * 1024;

/// What one run produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutput {
    pub status: ExitInfo,
    /// stdout and stderr, interleaved as written, lossily decoded, truncated to 64 KiB.
    pub output: String,
}

/// Why a run produced no usable result.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot start it: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("timed out after {}; killed it and its process group", crate::message::Span(*.0))]
    TimedOut(Duration),
    #[error(
        "it exited ({status}) but its output stayed open {} longer (a process it started \
         still holds it); killed its process group",
        crate::message::Span(*waited)
    )]
    OutputHeld { status: ExitInfo, waited: Duration },
    #[error("cannot wait for it: {0}")]
    Wait(#[source] std::io::Error),
    /// Not run: somebody other than root can change it ([`crate::trust`]).
    #[error(transparent)]
    Untrusted(crate::trust::TrustError),
}

/// Runs a program to completion (the seam between the backend and real processes).
pub trait CommandRunner: Send {
    /// Runs `program args...`; `deadline` (`None` = forever) bounds the whole run, its output
    /// included.
    fn run(
        &mut self,
        program: &Path,
        args: &[String],
        deadline: Option<Duration>,
    ) -> Result<RunOutput, RunError>;
    /// Runs `program` once per `(args, deadline)`, at most `width` runs at a time, each bounded
    /// by its own deadline from its own start; one result per run, in order. The default runs
    /// them one after another.
    fn run_many(
        &mut self,
        program: &Path,
        runs: &[(Vec<String>, Option<Duration>)],
        width: usize,
    ) -> Vec<Result<RunOutput, RunError>> {
        let _ = width;
        runs.iter()
            .map(|(args, deadline)| self.run(program, args, *deadline))
            .collect()
    }
}

/// How long a run's output may stay open after the utility exited, when the deadline allows
/// that much: output written before the exit is already in the pipe, so a pipe that stays open
/// is held by some process the utility left behind.
pub const OUTPUT_AFTER_EXIT: Duration = Duration::from_secs(2);

/// The real runner: `std::process::Command` in its own process group, tied to CRIU's life, one
/// pipe for both output streams, waited for on the calling thread (see [`crate::ffi::spawn`]).
/// The variables that would hide or reorder GPUs in the utility's view
/// ([`crate::ffi::cuda::VIEW_VARIABLES`]) are removed from its environment: device maps and the
/// inventory speak of every GPU in the driver's order. Several runs at once
/// ([`CommandRunner::run_many`]) are waited for together, with one `poll` over all of them: no
/// thread is started.
#[derive(Debug, Default)]
pub struct ProcessRunner;

/// One run in progress: the child, its output so far, and its deadline.
struct Running {
    child: std::process::Child,
    reader: std::fs::File,
    pidfd: Option<std::os::fd::OwnedFd>,
    pgid: u32,
    start: Instant,
    deadline: Option<Duration>,
    output: Vec<u8>,
    eof: bool,
    status: Option<std::process::ExitStatus>,
    exited_at: Option<Instant>,
    pause: Duration,
}

impl Running {
    fn start(
        program: &Path,
        args: &[String],
        deadline: Option<Duration>,
    ) -> Result<Self, RunError> {
        use crate::ffi::spawn;
        match crate::trust::check(program, crate::trust::Role::Program) {
            Ok(()) => {}
            // Nothing there to run: said as the failed start it is.
            Err(crate::trust::TrustError::Unreadable {
                kind: std::io::ErrorKind::NotFound,
                ..
            }) => {
                return Err(RunError::Spawn(std::io::Error::from(
                    std::io::ErrorKind::NotFound,
                )))
            }
            Err(e) => return Err(RunError::Untrusted(e)),
        }
        let start = Instant::now();
        let (reader, writer) = spawn::pipe().map_err(RunError::Spawn)?;
        let writer2 = writer.try_clone().map_err(RunError::Spawn)?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(writer2);
        for v in crate::ffi::cuda::VIEW_VARIABLES {
            cmd.env_remove(v);
        }
        spawn::prepare_child(&mut cmd, std::process::id());
        let child = cmd.spawn().map_err(RunError::Spawn)?;
        // Our copies of the write end must go, or the reader never sees EOF.
        drop(cmd);
        let pgid = child.id();
        let pidfd = spawn::pidfd_open(child.id()).ok();
        Ok(Running {
            child,
            reader,
            pidfd,
            pgid,
            start,
            deadline,
            output: Vec::new(),
            eof: false,
            status: None,
            exited_at: None,
            pause: Duration::from_micros(500),
        })
    }

    /// Kills the run's process group, reaps the child and returns `e`.
    fn fail(&mut self, e: RunError) -> Result<RunOutput, RunError> {
        crate::ffi::spawn::kill_group(self.pgid);
        let _ = self.child.wait();
        Err(e)
    }

    /// Reads what there is and looks at the child, without blocking. The run's result once it
    /// is over (exited with its output closed, or out of time: then killed and reaped); else
    /// how long at most to wait on [`Running::fds`] before looking again.
    #[inline(never)] // shared by `run` and `run_many`, not copied into each
    fn step(&mut self) -> Result<Result<RunOutput, RunError>, Duration> {
        if !self.eof {
            match drain(&mut self.reader, &mut self.output) {
                Ok(e) => self.eof = e,
                Err(e) => return Ok(self.fail(RunError::Wait(e))),
            }
        }
        if self.status.is_none() {
            match self.child.try_wait() {
                Ok(Some(st)) => {
                    self.status = Some(st);
                    self.exited_at = Some(Instant::now());
                }
                Ok(None) => {}
                Err(e) => return Ok(self.fail(RunError::Wait(e))),
            }
        }
        if let (true, Some(st)) = (self.eof, self.status) {
            return Ok(Ok(RunOutput {
                status: exit_info(st),
                output: String::from_utf8_lossy(&self.output).into_owned(),
            }));
        }
        let now = Instant::now();
        let mut left = self
            .deadline
            .map(|d| (self.start + d).saturating_duration_since(now));
        if let Some(at) = self.exited_at {
            let after = (at + OUTPUT_AFTER_EXIT).saturating_duration_since(now);
            left = Some(left.map_or(after, |l| l.min(after)));
        }
        if left == Some(Duration::ZERO) {
            let e = match (self.status, self.exited_at) {
                (Some(st), Some(at)) => RunError::OutputHeld {
                    status: exit_info(st),
                    waited: now.saturating_duration_since(at),
                },
                _ => RunError::TimedOut(self.deadline.unwrap_or_default()),
            };
            return Ok(self.fail(e));
        }
        let wait = match (&self.pidfd, self.status) {
            (Some(_), None) => left.unwrap_or(Duration::from_secs(3600)),
            // No pidfd (Linux < 5.3): look at the child again soon.
            (None, None) => {
                self.pause = (self.pause * 2).min(Duration::from_millis(20));
                left.map_or(self.pause, |l| l.min(self.pause))
            }
            (_, Some(_)) => left.unwrap_or(Duration::from_secs(3600)),
        };
        Err(wait)
    }

    /// What a wait for this run's progress polls: its output while open, its pidfd until it
    /// exited.
    fn fds(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        let mut fds = Vec::with_capacity(2);
        if !self.eof {
            fds.push(self.reader.as_fd());
        }
        if let (Some(p), None) = (&self.pidfd, self.status) {
            fds.push(p.as_fd());
        }
        fds
    }
}

impl CommandRunner for ProcessRunner {
    fn run(
        &mut self,
        program: &Path,
        args: &[String],
        deadline: Option<Duration>,
    ) -> Result<RunOutput, RunError> {
        let mut run = Running::start(program, args, deadline)?;
        loop {
            match run.step() {
                Ok(done) => return done,
                Err(wait) => {
                    if let Err(e) = crate::ffi::spawn::wait_readable(&run.fds(), wait) {
                        return run.fail(RunError::Wait(e));
                    }
                }
            }
        }
    }

    fn run_many(
        &mut self,
        program: &Path,
        runs: &[(Vec<String>, Option<Duration>)],
        width: usize,
    ) -> Vec<Result<RunOutput, RunError>> {
        let width = width.max(1);
        let mut out: Vec<Option<Result<RunOutput, RunError>>> =
            std::iter::repeat_with(|| None).take(runs.len()).collect();
        let mut flight: Vec<(usize, Running)> = Vec::new();
        let mut todo = runs.iter().enumerate();
        loop {
            while flight.len() < width {
                let Some((i, (args, deadline))) = todo.next() else {
                    break;
                };
                match Running::start(program, args, *deadline) {
                    Ok(r) => flight.push((i, r)),
                    Err(e) => out[i] = Some(Err(e)),
                }
            }
            if flight.is_empty() {
                break;
            }
            let mut wait = Duration::from_secs(3600);
            let mut finished = false;
            let mut k = 0;
            while k < flight.len() {
                match flight[k].1.step() {
                    Ok(done) => {
                        let (i, _) = flight.swap_remove(k);
                        out[i] = Some(done);
                        finished = true;
                    }
                    Err(w) => {
                        wait = wait.min(w);
                        k += 1;
                    }
                }
            }
            if finished {
                // Room for the next runs (or none left in flight): start them before waiting.
                continue;
            }
            let fds: Vec<_> = flight.iter().flat_map(|(_, r)| r.fds()).collect();
            let waited = crate::ffi::spawn::wait_readable(&fds, wait);
            drop(fds);
            if let Err(e) = waited {
                for (i, mut r) in flight.drain(..) {
                    let e = std::io::Error::new(e.kind(), e.to_string());
                    out[i] = Some(r.fail(RunError::Wait(e)));
                }
            }
        }
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(RunError::Spawn(std::io::Error::other("never started"))))
            })
            .collect()
    }
}

fn exit_info(st: std::process::ExitStatus) -> ExitInfo {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => ExitInfo::Code(c),
        (None, Some(s)) => ExitInfo::Signal(s),
        (None, None) => ExitInfo::Code(-1),
    }
}

/// Reads what the pipe holds now, keeping at most [`OUTPUT_LIMIT`] bytes (the rest is read and
/// dropped, so the child never blocks on a full pipe). Returns true at end of file.
fn drain(reader: &mut std::fs::File, out: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok(true),
            Ok(n) => {
                let room = OUTPUT_LIMIT.saturating_sub(out.len());
                out.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Finds `name` as an executable file in the `PATH`-style list `path`.
#[must_use]
pub fn find_in_path(path: Option<&OsStr>, name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path?)
        .map(|dir| dir.join(name))
        .find(|p| {
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// What `cuda-checkpoint -h` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CliProbe {
    /// Usable; `device_map` tells whether `--device-map` is supported.
    Supported { program: PathBuf, device_map: bool },
    /// Not usable here (absent, cannot run, too old).
    Unsupported(String),
    /// The probe itself failed (timed out).
    Error(String),
}

/// Probes the utility: `program` is the `cuda-checkpoint=PATH` option, else it is searched in
/// `path_env`. Counts as one execution.
pub fn probe_cli(
    program: Option<&Path>,
    path_env: Option<&OsStr>,
    runner: &mut dyn CommandRunner,
    timeout: Option<Duration>,
) -> CliProbe {
    let program = match program {
        Some(p) => p.to_path_buf(),
        None => match find_in_path(path_env, PROGRAM) {
            Some(p) => p,
            None => return CliProbe::Unsupported(format!("{PROGRAM} not found in PATH")),
        },
    };
    match runner.run(&program, &["-h".to_owned()], timeout) {
        // Not a utility that is merely absent or old: the node is misconfigured, and `init`
        // fails naming the file.
        Err(RunError::Untrusted(e)) => CliProbe::Error(e.to_string()),
        Err(RunError::TimedOut(d)) => CliProbe::Error(format!(
            "`{} -h` timed out after {}",
            program.display(),
            crate::message::Span(d)
        )),
        Err(e) => CliProbe::Unsupported(format!("cannot run `{} -h`: {e}", program.display())),
        Ok(out)
            if out.status != ExitInfo::Code(0) && out.output.contains("unrecognized option") =>
        {
            // r550 knows only `--help` (and `--toggle`): ask it that way before blaming `-h`.
            match runner.run(&program, &["--help".to_owned()], timeout) {
                Ok(help)
                    if help.status == ExitInfo::Code(0) && !help.output.contains("--action") =>
                {
                    CliProbe::Unsupported(format!(
                        "{} is too old: it does not know -h and its --help offers no --action \
                         (driver r555 or later needed)",
                        program.display()
                    ))
                }
                _ => CliProbe::Unsupported(format!(
                    "`{} -h` exited with {}: {}",
                    program.display(),
                    out.status,
                    crate::message::quote(out.output.trim())
                )),
            }
        }
        Ok(out) if out.status != ExitInfo::Code(0) => CliProbe::Unsupported(format!(
            "`{} -h` exited with {}: {}",
            program.display(),
            out.status,
            crate::message::quote(out.output.trim())
        )),
        Ok(out) if !out.output.contains("--action") => CliProbe::Unsupported(format!(
            "{} is too old: its help lacks --action (driver r555 or later needed)",
            program.display()
        )),
        Ok(out) => CliProbe::Supported {
            device_map: out.output.contains("--device-map"),
            program,
        },
    }
}

/// The `cuda-checkpoint` backend.
pub struct Cli {
    program: PathBuf,
    runner: Box<dyn CommandRunner>,
    timeout: Option<Duration>,
    device_map: bool,
    tids: HashMap<Pid, Option<Tid>>,
    executions: usize,
}

impl fmt::Debug for Cli {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cli")
            .field("program", &self.program)
            .field("timeout", &self.timeout)
            .field("device_map", &self.device_map)
            .field("executions", &self.executions)
            .finish_non_exhaustive()
    }
}

impl Cli {
    /// A backend running `program` through `runner`; `device_map` comes from the probe, and
    /// `executions` starts at 1 to count the probe.
    pub fn new(
        program: PathBuf,
        runner: Box<dyn CommandRunner>,
        timeout: Option<Duration>,
        device_map: bool,
    ) -> Self {
        Cli {
            program,
            runner,
            timeout,
            device_map,
            tids: HashMap::new(),
            executions: 1,
        }
    }

    /// Runs of the utility so far, including the `-h` probe.
    #[must_use]
    pub fn executions(&self) -> usize {
        self.executions
    }

    fn command_line(&self, args: &[String]) -> String {
        let mut s = self.program.display().to_string();
        for a in args {
            s.push(' ');
            s.push_str(a);
        }
        s
    }

    fn run(
        &mut self,
        op: Op,
        pid: Pid,
        args: Vec<String>,
        deadline: Option<Duration>,
    ) -> Result<RunOutput, BackendError> {
        self.executions += 1;
        let r = self.runner.run(&self.program, &args, deadline);
        self.run_result(op, pid, r)
    }

    fn run_result(
        &self,
        op: Op,
        pid: Pid,
        r: Result<RunOutput, RunError>,
    ) -> Result<RunOutput, BackendError> {
        match r {
            Ok(out) => Ok(out),
            Err(RunError::TimedOut(after)) => Err(BackendError::Timeout {
                backend: BackendKind::CudaCheckpoint,
                op,
                pid,
                after,
            }),
            Err(RunError::OutputHeld { status, waited }) => Err(BackendError::OutputHeld {
                op,
                pid,
                status,
                waited,
            }),
            Err(RunError::Untrusted(source)) => Err(BackendError::Untrusted {
                op,
                pid,
                source: Box::new(source),
            }),
            Err(RunError::Spawn(source) | RunError::Wait(source)) => Err(BackendError::Spawn {
                op,
                pid,
                program: self.program.display().to_string(),
                source,
            }),
        }
    }

    fn action(
        &mut self,
        op: Op,
        pid: Pid,
        args: Vec<String>,
        deadline: Option<Duration>,
    ) -> Result<(), BackendError> {
        let full = action_argv(op, pid, args);
        let out = self.run(op, pid, full.clone(), deadline)?;
        self.action_result(op, pid, &full, out)
    }

    /// `op` on every job at once: one run of the utility each, at most `width` at a time (see
    /// [`CommandRunner::run_many`]), `extra` added to each argv.
    fn action_many(
        &mut self,
        op: Op,
        jobs: &[Job],
        extra: &[String],
        width: usize,
    ) -> Vec<JobResult> {
        let started = Instant::now();
        let runs: Vec<(Vec<String>, Option<Duration>)> = jobs
            .iter()
            .map(|j| (action_argv(op, j.pid, extra.to_vec()), j.deadline))
            .collect();
        self.executions += runs.len();
        let outs = self.runner.run_many(&self.program, &runs, width);
        jobs.iter()
            .zip(runs)
            .zip(outs)
            .map(|((j, (argv, _)), out)| {
                let r = self
                    .run_result(op, j.pid, out)
                    .and_then(|out| self.action_result(op, j.pid, &argv, out));
                // The batch's runs overlap: each is charged the batch's time so far.
                (r, started.elapsed())
            })
            .collect()
    }

    /// What a finished action run means: success only for exit 0 with no output.
    fn action_result(
        &self,
        op: Op,
        pid: Pid,
        full: &[String],
        out: RunOutput,
    ) -> Result<(), BackendError> {
        if out.status == ExitInfo::Code(0) {
            // The utility prints nothing when an action succeeds: anything else means this is
            // not the utility we think it is (or it is broken), and "exit 0" cannot be trusted
            // to mean the state changed.
            if out.output.trim().is_empty() {
                Ok(())
            } else {
                Err(BackendError::BadOutput {
                    backend: BackendKind::CudaCheckpoint,
                    op,
                    pid,
                    output: out.output,
                })
            }
        } else {
            Err(BackendError::Exit {
                op,
                pid,
                command: self.command_line(full),
                status: out.status,
                output: out.output.trim().to_owned(),
            })
        }
    }
}

/// One job per pid, each with `deadline`.
fn jobs(pids: &[Pid], deadline: Option<Duration>) -> Vec<Job> {
    pids.iter().map(|&pid| Job { pid, deadline }).collect()
}

/// A lock's extra arguments: the driver's own timeout, when there is one.
fn lock_args(limits: LockLimits) -> Vec<String> {
    let ms = lock_timeout_ms(limits.driver);
    if ms == 0 {
        Vec::new()
    } else {
        vec!["--timeout".to_owned(), ms.to_string()]
    }
}

/// The utility's argv for `op` on `pid`, then `args`.
fn action_argv(op: Op, pid: Pid, mut args: Vec<String>) -> Vec<String> {
    let mut full = vec![
        "--action".to_owned(),
        action_word(op).to_owned(),
        "--pid".to_owned(),
        pid.to_string(),
    ];
    full.append(&mut args);
    full
}

fn action_word(op: Op) -> &'static str {
    match op {
        Op::Lock => "lock",
        Op::Checkpoint => "checkpoint",
        Op::Restore => "restore",
        Op::Unlock => "unlock",
        Op::Init | Op::GetRestoreTid | Op::GetState => "",
    }
}

/// Formats GPU pairs the way `--device-map` takes them: `old=new,old=new`.
#[must_use]
pub fn device_map_arg(pairs: &[GpuPair]) -> String {
    pairs
        .iter()
        .map(|(o, n)| format!("{o}={n}"))
        .collect::<Vec<_>>()
        .join(",")
}

impl Backend for Cli {
    fn kind(&self) -> BackendKind {
        BackendKind::CudaCheckpoint
    }

    fn get_restore_tid(&mut self, pid: Pid) -> Result<Option<Tid>, BackendError> {
        if let Some(t) = self.tids.get(&pid) {
            return Ok(*t);
        }
        let op = Op::GetRestoreTid;
        let args = vec![
            "--get-restore-tid".to_owned(),
            "--pid".to_owned(),
            pid.to_string(),
        ];
        let out = self.run(op, pid, args.clone(), op_deadline(op, self.timeout))?;
        let tid = match out.status {
            ExitInfo::Code(0) => {
                match out.output.split_whitespace().last().map(str::parse::<Tid>) {
                    Some(Ok(t)) if t > 0 => Some(t),
                    _ => {
                        return Err(BackendError::BadOutput {
                            backend: BackendKind::CudaCheckpoint,
                            op,
                            pid,
                            output: out.output,
                        })
                    }
                }
            }
            // The exit status is the `CUresult` modulo 256: `CUDA_ERROR_INVALID_VALUE` (1) and
            // `CUDA_ERROR_NOT_INITIALIZED` (3) are what callers observe for a process without
            // CUDA state, as with the driver API. Any other failure (another code, a signal) is
            // an error: taking it for "no CUDA state" would dump the task unchecked.
            ExitInfo::Code(c) if FailureClass::of_exit(op, c) == FailureClass::NoCudaState => None,
            status => {
                return Err(BackendError::Exit {
                    op,
                    pid,
                    command: self.command_line(&args),
                    status,
                    output: out.output.trim().to_owned(),
                })
            }
        };
        self.tids.insert(pid, tid);
        Ok(tid)
    }

    fn get_state(&mut self, pid: Pid) -> Result<CUprocessState, BackendError> {
        let op = Op::GetState;
        let args = vec![
            "--get-state".to_owned(),
            "--pid".to_owned(),
            pid.to_string(),
        ];
        let out = self.run(op, pid, args.clone(), op_deadline(op, self.timeout))?;
        if out.status != ExitInfo::Code(0) {
            return Err(BackendError::Exit {
                op,
                pid,
                command: self.command_line(&args),
                status: out.status,
                output: out.output.trim().to_owned(),
            });
        }
        let word = out.output.split_whitespace().next().unwrap_or("");
        CUprocessState::from_cli_word(word).ok_or_else(|| BackendError::BadOutput {
            backend: BackendKind::CudaCheckpoint,
            op,
            pid,
            output: out.output.clone(),
        })
    }

    fn lock(&mut self, pid: Pid, limits: LockLimits) -> Result<(), BackendError> {
        self.action(Op::Lock, pid, lock_args(limits), limits.wait)
    }

    fn checkpoint(&mut self, pid: Pid, deadline: Option<Duration>) -> Result<(), BackendError> {
        self.action(Op::Checkpoint, pid, Vec::new(), deadline)
    }

    fn restore(
        &mut self,
        pid: Pid,
        pairs: &[GpuPair],
        deadline: Option<Duration>,
    ) -> Result<(), BackendError> {
        if pairs.is_empty() {
            return self.action(Op::Restore, pid, Vec::new(), deadline);
        }
        if !self.device_map {
            return Err(BackendError::Unsupported {
                backend: BackendKind::CudaCheckpoint,
                op: Op::Restore,
                pid,
                what: "this cuda-checkpoint has no --device-map (driver r580 or later needed)",
            });
        }
        self.action(
            Op::Restore,
            pid,
            vec!["--device-map".to_owned(), device_map_arg(pairs)],
            deadline,
        )
    }

    fn unlock(&mut self, pid: Pid) -> Result<(), BackendError> {
        self.action(
            Op::Unlock,
            pid,
            Vec::new(),
            op_deadline(Op::Unlock, self.timeout),
        )
    }

    fn checkpoint_many(&mut self, jobs: &[Job], width: usize) -> Vec<JobResult> {
        self.action_many(Op::Checkpoint, jobs, &[], width)
    }

    fn restore_many(&mut self, jobs: &[Job], pairs: &[GpuPair], width: usize) -> Vec<JobResult> {
        if !pairs.is_empty() && !self.device_map {
            // Refused per task, exactly as one at a time.
            return jobs
                .iter()
                .map(|j| super::timed_job(|| self.restore(j.pid, pairs, j.deadline)))
                .collect();
        }
        let extra = if pairs.is_empty() {
            Vec::new()
        } else {
            vec!["--device-map".to_owned(), device_map_arg(pairs)]
        };
        self.action_many(Op::Restore, jobs, &extra, width)
    }

    fn lock_many(&mut self, pids: &[Pid], limits: LockLimits, width: usize) -> Vec<JobResult> {
        let jobs = jobs(pids, limits.wait);
        self.action_many(Op::Lock, &jobs, &lock_args(limits), width)
    }

    fn unlock_many(&mut self, pids: &[Pid], width: usize) -> Vec<JobResult> {
        let jobs = jobs(pids, op_deadline(Op::Unlock, self.timeout));
        self.action_many(Op::Unlock, &jobs, &[], width)
    }

    fn executions(&self) -> Option<usize> {
        Some(self.executions)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    /// One recorded run: argv after the program, and the deadline.
    type Call = (Vec<String>, Option<Duration>);

    /// Records every argv and answers from a script (default: exit 0, empty output).
    #[derive(Clone, Default)]
    pub(crate) struct ScriptedRunner {
        pub calls: Arc<Mutex<Vec<Call>>>,
        pub answers: Arc<Mutex<VecDeque<Result<RunOutput, RunError>>>>,
    }

    impl ScriptedRunner {
        pub(crate) fn answer(&self, code: i32, output: &str) {
            self.answers.lock().unwrap().push_back(Ok(RunOutput {
                status: ExitInfo::Code(code),
                output: output.to_owned(),
            }));
        }
        pub(crate) fn answer_err(&self, e: RunError) {
            self.answers.lock().unwrap().push_back(Err(e));
        }
        pub(crate) fn argvs(&self) -> Vec<String> {
            self.calls
                .lock()
                .unwrap()
                .iter()
                .map(|(a, _)| a.join(" "))
                .collect()
        }
    }

    impl CommandRunner for ScriptedRunner {
        fn run(
            &mut self,
            _program: &Path,
            args: &[String],
            deadline: Option<Duration>,
        ) -> Result<RunOutput, RunError> {
            self.calls.lock().unwrap().push((args.to_vec(), deadline));
            self.answers
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Ok(RunOutput {
                    status: ExitInfo::Code(0),
                    output: String::new(),
                }))
        }
    }

    const HELP_555: &str = "CUDA checkpoint and restore utility.\nOperations:\n  --get-state --pid <pid>\n  --action lock | checkpoint | restore | unlock --pid <pid> [--timeout <ms>]\n";
    const HELP_580: &str = "CUDA checkpoint and restore utility.\n  --action lock | checkpoint | restore | unlock --pid <pid> [--timeout <ms>] [--device-map <uuids>]\nOptions:\n  --device-map|-d <deviceUuids>\n";
    const HELP_550: &str = "CUDA checkpoint utility\n  --toggle --pid <value>\n  --help\n";

    #[test]
    fn probe_reads_capabilities_from_help() {
        let r = ScriptedRunner::default();
        let mut run = r.clone();
        let p = Path::new("/x/cuda-checkpoint");
        r.answer(0, HELP_555);
        assert_eq!(
            probe_cli(Some(p), None, &mut run, None),
            CliProbe::Supported {
                program: p.into(),
                device_map: false
            }
        );
        r.answer(0, HELP_580);
        assert_eq!(
            probe_cli(Some(p), None, &mut run, None),
            CliProbe::Supported {
                program: p.into(),
                device_map: true
            }
        );
        r.answer(0, HELP_550);
        assert!(
            matches!(probe_cli(Some(p), None, &mut run, None), CliProbe::Unsupported(m) if m.contains("--action"))
        );
        r.answer(255, "Insufficient driver");
        assert!(
            matches!(probe_cli(Some(p), None, &mut run, None), CliProbe::Unsupported(m) if m.contains("Insufficient"))
        );
        r.answer_err(RunError::Spawn(std::io::Error::from(
            std::io::ErrorKind::NotFound,
        )));
        assert!(matches!(
            probe_cli(Some(p), None, &mut run, None),
            CliProbe::Unsupported(_)
        ));
        r.answer_err(RunError::TimedOut(Duration::from_secs(1)));
        assert!(
            matches!(probe_cli(Some(p), None, &mut run, None), CliProbe::Error(_)),
            "a hanging probe is an error"
        );
        assert!(r.argvs().iter().all(|a| a == "-h"));
        let p = probe_cli(None, Some(OsStr::new("/nonexistent-dir")), &mut run, None);
        assert!(matches!(p, CliProbe::Unsupported(m) if m.contains("not found in PATH")));
    }

    #[test]
    fn argv_per_operation_and_tid_cache() {
        let r = ScriptedRunner::default();
        let mut b = Cli::new(
            "/cc".into(),
            Box::new(r.clone()),
            Some(Duration::from_secs(10)),
            true,
        );
        r.answer(0, "4242\n");
        assert_eq!(b.get_restore_tid(42).unwrap(), Some(4242));
        assert_eq!(
            b.get_restore_tid(42).unwrap(),
            Some(4242),
            "cached: no second run"
        );
        r.answer(1, "Error: invalid argument");
        assert_eq!(
            b.get_restore_tid(7).unwrap(),
            None,
            "CUDA_ERROR_INVALID_VALUE = no CUDA"
        );
        assert_eq!(b.get_restore_tid(7).unwrap(), None);
        r.answer(0, "locked\n");
        assert_eq!(b.get_state(42).unwrap(), CUprocessState::LOCKED);
        b.lock(42, LockLimits::from_timeout(Some(Duration::from_secs(3))))
            .unwrap();
        b.lock(42, LockLimits::from_timeout(None)).unwrap();
        b.checkpoint(42, Some(Duration::from_secs(10))).unwrap();
        let (a, c) = (abi::GpuUuid([0xaa; 16]), abi::GpuUuid([0xbb; 16]));
        b.restore(42, &[(a, c)], Some(Duration::from_secs(10)))
            .unwrap();
        b.restore(42, &[], Some(Duration::from_secs(10))).unwrap();
        b.unlock(42).unwrap();
        assert_eq!(
            r.argvs(),
            vec![
                "--get-restore-tid --pid 42".to_owned(),
                "--get-restore-tid --pid 7".into(),
                "--get-state --pid 42".into(),
                "--action lock --pid 42 --timeout 3000".into(),
                "--action lock --pid 42".into(),
                "--action checkpoint --pid 42".into(),
                format!("--action restore --pid 42 --device-map {a}={c}"),
                "--action restore --pid 42".into(),
                "--action unlock --pid 42".into(),
            ]
        );
        let deadlines: Vec<_> = r.calls.lock().unwrap().iter().map(|(_, d)| *d).collect();
        assert_eq!(
            deadlines[3],
            Some(Duration::from_secs(5)),
            "lock waits its timeout plus grace"
        );
        assert_eq!(deadlines[4], None, "lock without timeout waits forever");
        assert_eq!(deadlines[5], Some(Duration::from_secs(10)));
        assert_eq!(b.executions(), 1 + 9);
    }

    #[test]
    fn failures_name_step_pid_backend_and_probable_code() {
        let r = ScriptedRunner::default();
        let mut b = Cli::new("/cc".into(), Box::new(r.clone()), None, false);
        r.answer(88, "Could not lock on process ID 5: \"device not ready\"");
        let e = b
            .lock(5, LockLimits::from_timeout(Some(Duration::from_secs(1))))
            .unwrap_err();
        let m = e.to_string();
        assert!(m.contains("lock pid 5 via cuda-checkpoint"), "{m}");
        assert!(m.contains("CUDA_ERROR_NOT_READY"), "{m}");
        assert!(m.contains("device not ready"), "{m}");
        r.answer_err(RunError::TimedOut(Duration::from_secs(1)));
        assert!(b.checkpoint(5, None).unwrap_err().is_timeout());
        r.answer(0, "bogus");
        assert!(matches!(
            b.get_state(5).unwrap_err(),
            BackendError::BadOutput { .. }
        ));
        r.answer(0, "not-a-number");
        assert!(matches!(
            b.get_restore_tid(5).unwrap_err(),
            BackendError::BadOutput { .. }
        ));
        // An action prints nothing on success: output with exit 0 is not trusted.
        r.answer(0, "checkpointed!?\n");
        assert!(matches!(
            b.checkpoint(5, None).unwrap_err(),
            BackendError::BadOutput { .. }
        ));
        r.answer(0, "");
        assert!(b.unlock(5).is_ok());
        // Only INVALID_VALUE (1) and NOT_INITIALIZED (3) mean "no CUDA state"; any other
        // failure is an error naming the pid and the probable code, and is not cached.
        r.answer(
            145,
            "Error: injected fault: \"operation not permitted when stream is capturing\"",
        );
        let m = b.get_restore_tid(6).unwrap_err().to_string();
        assert!(
            m.contains("pid 6") && m.contains("CUDA_ERROR_ILLEGAL_STATE"),
            "{m}"
        );
        r.answer(231, "Error: injected fault: \"unknown error\"");
        assert!(b.get_restore_tid(6).is_err(), "not cached");
        r.answer(3, "Error: injected fault: \"initialization error\"");
        assert_eq!(b.get_restore_tid(6).unwrap(), None);
        let pair = (abi::GpuUuid([1; 16]), abi::GpuUuid([2; 16]));
        let e = b.restore(5, &[pair], None).unwrap_err();
        assert!(e.to_string().contains("--device-map"), "{e}");
    }

    #[test]
    fn real_runner_captures_both_streams_and_kills_on_timeout() {
        let sh = Path::new("/bin/sh");
        let mut r = ProcessRunner;
        let out = r
            .run(
                sh,
                &["-c".into(), "echo out; echo err >&2; exit 3".into()],
                Some(Duration::from_secs(20)),
            )
            .unwrap();
        assert_eq!(out.status, ExitInfo::Code(3));
        assert!(
            out.output.contains("out") && out.output.contains("err"),
            "{:?}",
            out.output
        );
        let start = Instant::now();
        let e = r
            .run(
                sh,
                &["-c".into(), "sleep 30".into()],
                Some(Duration::from_millis(200)),
            )
            .unwrap_err();
        assert!(matches!(e, RunError::TimedOut(_)), "{e:?}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "killed, not waited for"
        );
        let e = r
            .run(Path::new("/nonexistent/cuda-checkpoint"), &[], None)
            .unwrap_err();
        assert!(matches!(e, RunError::Spawn(_)), "{e:?}");
    }

    #[test]
    fn real_runner_runs_a_batch_side_by_side_each_with_its_own_result() {
        // Each run marks its start, then waits until the three others of its width started:
        // run one after another, the first would never see them and time out.
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        let wait_all = |i: usize| {
            format!(
                "touch {d}/{i}; n=0; while [ $(ls {d} | wc -l) -lt 3 ]; do n=$((n+1)); \
                 [ $n -gt 2000 ] && exit 9; sleep 0.005; done; echo run {i}; exit {i}"
            )
        };
        let runs: Vec<(Vec<String>, Option<Duration>)> = vec![
            (
                vec!["-c".into(), wait_all(0)],
                Some(Duration::from_secs(30)),
            ),
            (
                vec!["-c".into(), wait_all(1)],
                Some(Duration::from_secs(30)),
            ),
            (
                vec!["-c".into(), wait_all(2)],
                Some(Duration::from_secs(30)),
            ),
            // A fourth that hangs: killed at its own deadline, the others unaffected.
            (
                vec!["-c".into(), "sleep 30".into()],
                Some(Duration::from_millis(300)),
            ),
        ];
        let mut r = ProcessRunner;
        let out = r.run_many(Path::new("/bin/sh"), &runs, 4);
        assert_eq!(out.len(), 4);
        for (i, o) in out.iter().take(3).enumerate() {
            let o = o.as_ref().unwrap();
            assert_eq!(o.status, ExitInfo::Code(i as i32), "run {i}: {o:?}");
            assert_eq!(o.output.trim(), format!("run {i}"));
        }
        assert!(matches!(out[3], Err(RunError::TimedOut(_))), "{:?}", out[3]);
        // Width 1 is one after another: the first run then waits alone, and gives up.
        let solo = tempfile::tempdir().unwrap();
        let d = solo.path().display().to_string();
        let runs: Vec<(Vec<String>, Option<Duration>)> = (0..2)
            .map(|i| {
                let script =
                    format!("touch {d}/{i}; [ $(ls {d} | wc -l) -ge 2 ] && exit 0; exit 7");
                (vec!["-c".into(), script], Some(Duration::from_secs(30)))
            })
            .collect();
        let out = r.run_many(Path::new("/bin/sh"), &runs, 1);
        assert_eq!(out[0].as_ref().unwrap().status, ExitInfo::Code(7), "alone");
        assert_eq!(
            out[1].as_ref().unwrap().status,
            ExitInfo::Code(0),
            "after it"
        );
    }

    /// Whether `pid` is alive (not gone, not a zombie).
    fn alive(pid: u32) -> bool {
        crate::thread::process_alive(i32::try_from(pid).unwrap())
    }

    #[test]
    fn the_deadline_covers_output_held_open_by_a_process_left_behind() {
        // A wrapper that runs the real work in the background and exits: the background
        // process keeps the output pipe open for a minute.
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("bg.pid");
        let script = format!("sleep 60 & echo $! > {}; exit 0", pidfile.display());
        let start = Instant::now();
        let e = ProcessRunner
            .run(
                Path::new("/bin/sh"),
                &["-c".into(), script],
                Some(Duration::from_secs(1)),
            )
            .unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(
                e,
                RunError::OutputHeld {
                    status: ExitInfo::Code(0),
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("killed its process group"), "{e}");
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(5),
            "bounded by the deadline: {took:?}"
        );
        let bg: u32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let t = Instant::now();
        while alive(bg) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            !alive(bg),
            "the process left behind was killed with the group"
        );
        // Without a deadline the wait after the exit is still bounded.
        let start = Instant::now();
        let e = ProcessRunner
            .run(
                Path::new("/bin/sh"),
                &["-c".into(), "sleep 60 & exit 0".into()],
                None,
            )
            .unwrap_err();
        assert!(matches!(e, RunError::OutputHeld { .. }), "{e:?}");
        assert!(start.elapsed() < OUTPUT_AFTER_EXIT + Duration::from_secs(3));
    }

    #[test]
    fn the_child_dies_with_the_thread_that_started_it_and_sees_no_gpu_view_variables() {
        // The parent-death signal follows the thread that forked: a child prepared like the
        // utility's and started from a thread that then ends is killed at once (as it is when
        // CRIU dies during a run).
        let mut child = std::thread::spawn(|| {
            let mut cmd = Command::new("/bin/sleep");
            cmd.arg("60");
            crate::ffi::spawn::prepare_child(&mut cmd, std::process::id());
            cmd.spawn().unwrap()
        })
        .join()
        .unwrap();
        let t = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break Some(st);
            }
            if t.elapsed() > Duration::from_secs(5) {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.and_then(|s| s.signal()),
            Some(libc::SIGKILL),
            "killed when its parent went away"
        );
        // The variables that would reorder or hide GPUs do not reach the utility.
        std::env::set_var("CUDA_VISIBLE_DEVICES", "");
        std::env::set_var("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
        let out = ProcessRunner
            .run(
                Path::new("/bin/sh"),
                &[
                    "-c".into(),
                    "echo \"[${CUDA_VISIBLE_DEVICES-unset}] [${CUDA_DEVICE_ORDER-unset}]\"".into(),
                ],
                Some(Duration::from_secs(20)),
            )
            .unwrap();
        std::env::remove_var("CUDA_VISIBLE_DEVICES");
        std::env::remove_var("CUDA_DEVICE_ORDER");
        assert_eq!(out.output.trim(), "[unset] [unset]");
    }

    #[test]
    fn an_r550_utility_is_reported_as_too_old() {
        let r = ScriptedRunner::default();
        let mut run = r.clone();
        r.answer(
            1,
            "cuda-checkpoint: unrecognized option '-h'\nTry 'cuda-checkpoint --help' for more information.",
        );
        r.answer(0, HELP_550);
        let p = Path::new("/opt/cuda-checkpoint");
        match probe_cli(Some(p), None, &mut run, None) {
            CliProbe::Unsupported(m) => assert!(m.contains("too old") && m.contains("r555"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn real_runner_does_not_leak_descriptors_into_the_child() {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open("/dev/null").unwrap();
        // Clear CLOEXEC the way an inherited CRIU service descriptor would look.
        let fd = f.as_raw_fd();
        crate::ffi::spawn::clear_cloexec_for_test(fd);
        let out = ProcessRunner
            .run(
                Path::new("/bin/sh"),
                &[
                    "-c".into(),
                    format!("test -e /proc/self/fd/{fd} && echo leaked || echo closed"),
                ],
                Some(Duration::from_secs(20)),
            )
            .unwrap();
        assert_eq!(
            out.output.trim(),
            "closed",
            "descriptor {fd} reached the child"
        );
    }

    #[test]
    fn finds_executables_in_path() {
        let dir = std::env::temp_dir().join(format!("cuda-plugin-path-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join(PROGRAM);
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path = std::env::join_paths(["/nonexistent", dir.to_str().unwrap()]).unwrap();
        assert_eq!(find_in_path(Some(&path), PROGRAM), None, "not executable");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_in_path(Some(&path), PROGRAM), Some(exe));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
