//! What the helper does once CRIU has gone: put the tasks back.
//!
//! The ledger ([`Ledger`]) is what the plugin told the helper: the backend and settings, every
//! task it was about to change with the state to put it back to, the last operation it started
//! on each. When CRIU ends without the plugin's last word (or, after a successful dump, leaves a
//! task running that it should have killed or left stopped), the guardian:
//!
//! 1. waits for driver calls still in flight in the helper as the helper told to finish does
//!    (`calls::wait_late_calls`: each as long again as CRIU waited for it, at least 5 s), since a
//!    checkpoint still copying must not race a restore, and a call that lands late is put back
//!    by its own thread (`put_back_late`), which the helper's exit must not cut off;
//! 2. for each task, checks it is the same process (pid and start time), waits at most
//!    [`UNTRACE_LIMIT`] (for all tasks together) until it is no longer ptraced (the kernel
//!    detaches the tree when CRIU exits), and skips one that is stopped (`T`): its restore
//!    thread could not run;
//! 3. dump: drives it to its dump-start state, state-driven like the rollback (query, restore,
//!    unlock), with the backend CRIU was using (its own copy of the driver library, or the
//!    utility) and the plugin's deadlines (per-operation timeout, or [`DEFAULT_OP_LIMIT`] when
//!    the plugin has none; copies sized by the task's bytes, or [`UNKNOWN_BYTES`]);
//!    restore: finishes its restore the same way; should that fail, kills it
//!    (`on-restore-failure=kill`: CRIU's own rule for a failed restore, and a retry then finds
//!    its pids free) or leaves it (`leave`);
//! 4. logs every step to `cuda-plugin-guardian.log` in the image directory and to syslog.
//!
//! After a successful dump ([`FinishMode::WatchTasks`]) it waits at most [`WATCH_LIMIT`] for
//! CRIU to exit, then puts back only the tasks that are alive, not stopped and not exiting:
//! CRIU 4.1 and 4.2 resume the tasks when a post-dump action script fails after the plugin's
//! last hook, and tell the plugin nothing.

use super::calls::{loaded, wait_late_calls, Driver, InFlight};
use crate::agent::proto::{FinishMode, GuardBackend, GuardConfig, GuardStage, ToAgent, Tracked};
use crate::backend::cli::{Cli, ProcessRunner};
use crate::backend::drive::{drive, DriveError, Driven};
use crate::backend::driver::{DriverApi, LocalExec};
use crate::backend::{Backend, GpuPair, Pid};
use crate::ffi::agent::{open_in, poll, syslog};
use crate::thread::ThreadControl;
use abi::CUprocessState;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

/// The guardian's log, in the image directory.
pub const LOG_FILE: &str = "cuda-plugin-guardian.log";
/// How long the guardian waits, for all tasks together, for the kernel to untrace them.
pub const UNTRACE_LIMIT: Duration = Duration::from_secs(10);
/// The per-operation limit when the plugin ran without one (`timeout=0`).
pub const DEFAULT_OP_LIMIT: Duration = Duration::from_secs(60);
/// The bytes a copy's deadline assumes when the task's own are unknown (more than any GPU holds
/// today).
pub const UNKNOWN_BYTES: u64 = 256 << 30;
/// After a successful dump: how long the guardian waits for CRIU to exit.
pub const WATCH_LIMIT: Duration = Duration::from_secs(60);

/// One task the plugin told the guardian about.
#[derive(Debug, Clone)]
pub struct Guarded {
    pub tracked: Tracked,
    /// Its start time when the note came: a task with another one is not ours.
    pub start_time: Option<u64>,
    /// The last operation the plugin started on it.
    pub intent: Option<String>,
}

/// What the plugin told the helper.
#[derive(Debug, Default)]
pub struct Ledger {
    pub config: Option<GuardConfig>,
    pub tasks: Vec<Guarded>,
    /// Messages that did not decode (a bug; logged if the guardian acts).
    pub errors: Vec<String>,
}

impl Ledger {
    /// Takes a note.
    pub fn apply(&mut self, note: ToAgent) {
        match note {
            ToAgent::Configure(c) => self.config = Some(c),
            ToAgent::Track(t) => {
                if let Some(g) = self.tasks.iter_mut().find(|g| g.tracked.pid == t.pid) {
                    // Its dump-start state does not change; the rest may be refined.
                    let target = g.tracked.target;
                    g.tracked = Tracked { target, ..t };
                } else {
                    let start_time = crate::thread::start_time(t.pid);
                    self.tasks.push(Guarded {
                        tracked: t,
                        start_time,
                        intent: None,
                    });
                }
            }
            ToAgent::Intent { pid, op } => {
                if let Some(g) = self.tasks.iter_mut().find(|g| g.tracked.pid == pid) {
                    g.intent = Some(op);
                }
            }
            ToAgent::Untrack { pid } => self.tasks.retain(|g| g.tracked.pid != pid),
            ToAgent::Call { .. } | ToAgent::Abandon { .. } | ToAgent::Finish(_) => {}
        }
    }

    /// Records a message that did not decode.
    pub fn note_error(&mut self, e: String) {
        if self.errors.len() < 8 {
            self.errors.push(e);
        }
    }
}

/// Everything the guardian works with once CRIU is gone.
pub struct Ending {
    pub ledger: Ledger,
    pub finish: Option<FinishMode>,
    pub inflight: InFlight,
    pub driver: Driver,
    pub image_dir: Option<OwnedFd>,
    pub criu_pid: Pid,
    pub criu_pidfd: Option<OwnedFd>,
}

impl std::fmt::Debug for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ending")
            .field("ledger", &self.ledger)
            .field("finish", &self.finish)
            .field("criu_pid", &self.criu_pid)
            .finish_non_exhaustive()
    }
}

/// The guardian's log: the image directory's file (when it can be opened) and syslog.
struct Log {
    file: Option<std::fs::File>,
    me: u32,
    errors: usize,
}

impl Log {
    fn open(dir: Option<&OwnedFd>) -> Log {
        Log {
            file: dir.and_then(|d| open_in(d.as_fd(), LOG_FILE).ok()),
            me: std::process::id(),
            errors: 0,
        }
    }

    fn line(&mut self, error: bool, msg: &str) {
        if error {
            self.errors += 1;
        }
        let msg = crate::message::cap(msg);
        if let Some(f) = &mut self.file {
            let _ = writeln!(
                f,
                "{} cuda-guardian[{}]: {}{msg}",
                utc_now(),
                self.me,
                if error { "Error: " } else { "" }
            );
        }
        syslog(error, &format!("cuda-guardian: {msg}"));
    }
}

/// Now, as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc(secs)
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (the civil calendar from day numbers, as in
/// Howard Hinnant's `civil_from_days`).
fn utc(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Why the guardian acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// CRIU ended without the plugin's last word.
    CriuDied,
    /// After a successful dump, CRIU left these tasks running.
    ResumedAfterDump,
}

/// Runs once CRIU is gone; returns the helper's exit status.
pub fn after_criu(e: Ending) -> i32 {
    let Ending {
        ledger,
        finish,
        inflight,
        driver,
        image_dir,
        criu_pid,
        criu_pidfd,
    } = e;
    let Some(cfg) = ledger.config.clone() else {
        return 0; // the plugin never got as far as choosing a backend
    };
    let (why, tasks) = match finish {
        Some(FinishMode::Done) => return 0,
        None => (Why::CriuDied, ledger.tasks.clone()),
        Some(FinishMode::WatchTasks) => {
            if let Some(fd) = &criu_pidfd {
                let _ = poll(&[(fd.as_fd(), libc::POLLIN)], Some(WATCH_LIMIT));
            }
            let left: Vec<Guarded> = ledger
                .tasks
                .iter()
                .filter(|g| is_ours(g) && !crate::thread::exiting(g.tracked.pid))
                .filter(|g| !stopped(g.tracked.pid))
                .cloned()
                .collect();
            (Why::ResumedAfterDump, left)
        }
    };
    if tasks.is_empty() {
        return 0;
    }
    let mut log = Log::open(image_dir.as_ref());
    let stage = match cfg.stage {
        GuardStage::Dump => "dump",
        GuardStage::Restore => "restore",
    };
    match why {
        Why::CriuDied => log.line(
            true,
            &format!(
                "CRIU (pid {criu_pid}) ended during the {stage} without the plugin's final \
                 word; {} CUDA task(s) to look after: {}",
                tasks.len(),
                describe(&tasks)
            ),
        ),
        Why::ResumedAfterDump => log.line(
            true,
            &format!(
                "CRIU (pid {criu_pid}) resumed {} checkpointed CUDA task(s) after a dump it had \
                 reported as successful to the plugin (a post-dump action script failed?): {}",
                tasks.len(),
                describe(&tasks)
            ),
        ),
    }
    for e in &ledger.errors {
        log.line(true, &format!("internal: {e}"));
    }
    wait_inflight(&inflight, &mut log);
    let timeout = cfg.timeout.unwrap_or(DEFAULT_OP_LIMIT);
    let mut backend: Box<dyn Backend> = match &cfg.backend {
        GuardBackend::DriverApi => match loaded(&driver) {
            Ok(d) => Box::new(DriverApi::with_exec(
                Arc::new(LocalExec {
                    driver: d,
                    worker: crate::worker::Worker::new(Arc::new(|| {})),
                }),
                Some(timeout),
            )),
            Err(e) => {
                log.line(
                    true,
                    &format!("cannot load the driver to put the tasks back: {e}"),
                );
                return 1;
            }
        },
        GuardBackend::Cli {
            program,
            device_map,
        } => Box::new(Cli::new(
            program.clone(),
            Box::new(ProcessRunner),
            Some(timeout),
            *device_map,
        )),
    };
    let untrace_by = Instant::now() + UNTRACE_LIMIT;
    for g in &tasks {
        let pid = g.tracked.pid;
        if !is_ours(g) {
            log.line(false, &format!("pid {pid}: gone; nothing to do"));
            continue;
        }
        if !wait_untraced(pid, untrace_by) {
            log.line(
                true,
                &format!(
                    "pid {pid}: still traced after {}; left as it is (run \
                     cuda-checkpoint --action restore, then --action unlock, --pid {pid} once \
                     it is free)",
                    crate::message::Span(UNTRACE_LIMIT)
                ),
            );
            continue;
        }
        if stopped(pid) {
            log.line(
                true,
                &format!(
                    "pid {pid} is stopped, so its CUDA restore thread cannot run; left as it is \
                     (kill -CONT {pid}, then cuda-checkpoint --action restore and --action \
                     unlock --pid {pid})"
                ),
            );
            continue;
        }
        let finished = put_back(&mut *backend, g, &cfg, timeout, &mut log);
        if !finished && cfg.stage == GuardStage::Restore && cfg.kill_on_restore_failure {
            match crate::ffi::ptrace::Ptrace.kill_task(pid) {
                Ok(()) => log.line(
                    false,
                    &format!(
                        "pid {pid}: killed (on-restore-failure=kill): its restore could not be \
                         finished; the images are intact, so it can be retried"
                    ),
                ),
                Err(e) => log.line(true, &format!("pid {pid}: cannot kill it: {e}")),
            }
        }
    }
    // The first error line is the announcement; any more are tasks left as they were.
    let failed = log.errors > 1;
    log.line(
        false,
        &format!(
            "done ({} task(s), {} backend); exiting",
            tasks.len(),
            cfg.backend.kind()
        ),
    );
    i32::from(failed)
}

fn describe(tasks: &[Guarded]) -> String {
    tasks
        .iter()
        .map(|g| {
            format!(
                "pid {} (to be {}{})",
                g.tracked.pid,
                CUprocessState(g.tracked.target),
                g.intent
                    .as_ref()
                    .map_or_else(String::new, |i| format!("; last operation: {i}"))
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn is_ours(g: &Guarded) -> bool {
    let now = crate::thread::start_time(g.tracked.pid);
    now.is_some()
        && (g.start_time.is_none() || now == g.start_time)
        && crate::thread::process_alive(g.tracked.pid)
}

fn stopped(pid: Pid) -> bool {
    matches!(crate::thread::thread_state(pid, pid), Some('T' | 't'))
}

fn wait_untraced(pid: Pid, by: Instant) -> bool {
    let mut pause = Duration::from_millis(1);
    loop {
        match crate::thread::tracer_of(pid, pid) {
            Some(0) | None => return true,
            Some(_) => {}
        }
        if Instant::now() >= by {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

fn wait_inflight(inflight: &InFlight, log: &mut Log) {
    if inflight
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .is_empty()
    {
        return;
    }
    log.line(false, "waiting for driver calls still in flight");
    if !wait_late_calls(inflight) {
        log.line(
            true,
            "a driver call of the plugin is still blocked after its deadline; going on without it",
        );
    }
}

fn put_back(
    backend: &mut dyn Backend,
    g: &Guarded,
    cfg: &GuardConfig,
    timeout: Duration,
    log: &mut Log,
) -> bool {
    let pid = g.tracked.pid;
    let target = CUprocessState(g.tracked.target);
    let pairs: Vec<GpuPair> = g
        .tracked
        .pairs
        .iter()
        .map(|(a, b)| (abi::GpuUuid(*a), abi::GpuUuid(*b)))
        .collect();
    let bytes = g.tracked.bytes.unwrap_or(UNKNOWN_BYTES);
    let deadline = crate::nvml::copy_deadline(Some(timeout), bytes, cfg.copy_rate);
    let mut steps = Vec::new();
    let started = Instant::now();
    let r = drive(backend, pid, target, &pairs, &mut || deadline, &mut steps);
    let ms = crate::message::millis(started.elapsed());
    let did = if steps.is_empty() {
        "nothing to do".to_owned()
    } else {
        steps.join(", ")
    };
    let reached = matches!(r, Ok(Driven::Reached));
    match r {
        Ok(Driven::Reached) => log.line(
            false,
            &format!("pid {pid}: back to {target} ({did}, {ms} ms)"),
        ),
        Ok(Driven::LessAdvanced(s)) => log.line(
            false,
            &format!("pid {pid} is {s}, was {target} when the dump started; left so ({did})"),
        ),
        Err(DriveError::Backend(e)) => log.line(
            true,
            &format!("pid {pid}: cannot put it back to {target} ({did} before): {e}"),
        ),
        Err(DriveError::BadState(s)) => log.line(
            true,
            &format!("pid {pid}: its CUDA state is {s}; there is no way back to {target}"),
        ),
    }
    reached
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_the_civil_date() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_300_000), "2026-12-03T12:13:20Z");
    }

    #[test]
    fn the_ledger_keeps_the_first_target_and_forgets_untracked_tasks() {
        let mut l = Ledger::default();
        let t = |pid, target| Tracked {
            pid,
            target,
            bytes: None,
            pairs: Vec::new(),
        };
        let me = std::process::id() as i32;
        l.apply(ToAgent::Track(t(me, 0)));
        l.apply(ToAgent::Intent {
            pid: me,
            op: "lock".into(),
        });
        l.apply(ToAgent::Track(Tracked {
            bytes: Some(5),
            ..t(me, 1)
        }));
        assert_eq!(l.tasks.len(), 1);
        assert_eq!(l.tasks[0].tracked.target, 0, "the dump-start state stays");
        assert_eq!(l.tasks[0].tracked.bytes, Some(5));
        assert_eq!(l.tasks[0].intent.as_deref(), Some("lock"));
        assert!(l.tasks[0].start_time.is_some());
        assert!(is_ours(&l.tasks[0]));
        let mut other = l.tasks[0].clone();
        other.start_time = other.start_time.map(|s| s + 1);
        assert!(!is_ours(&other), "a reused pid is not ours");
        l.apply(ToAgent::Untrack { pid: me });
        assert!(l.tasks.is_empty());
    }
}
