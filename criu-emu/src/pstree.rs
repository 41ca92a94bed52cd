//! Freezing and releasing real process trees with ptrace, as CRIU's `collect_pstree` and
//! `pstree_switch_state` do (in interrupt-only mode: no cgroup freezer).
//!
//! Collection is depth-first: for each task, a callback runs first (the engine's PAUSE_DEVICES,
//! "just before it is seized"), then every thread is `PTRACE_SEIZE`d and `PTRACE_INTERRUPT`ed and
//! waited for, the thread list is re-read until stable, and only then are the children read from
//! `/proc/PID/task/TID/children` and collected in turn. All ptrace requests come from the calling
//! thread, which must stay the tracer for the whole operation (the engine runs on one thread).
//!
//! A [`Frozen`] tree that is dropped without an explicit [`Frozen::release`] (an error path, a
//! panic unwinding through the engine) detaches every task and lets it run. If the engine dies
//! outright (a plugin aborts it), the kernel detaches the tracees when the tracer exits.

use std::collections::HashSet;

use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::host;

/// A frozen (or frozen-then-released) task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// Its pid (tgid).
    pub pid: i32,
    /// Index of its parent in the tree; `None` for the root.
    pub parent: Option<usize>,
    /// Threads seized (empty for a zombie).
    pub threads: Vec<i32>,
    /// A zombie cannot be seized; it gets no CHECKPOINT/RESUME calls.
    pub zombie: bool,
    /// `/proc/PID/stat` start time, to detect pid reuse between dump and restore.
    pub start_time: u64,
    /// Whether it was in group-stop (`T`) when seized.
    pub was_stopped: bool,
    /// Whether [`Frozen::leave_group_stop`] ended that group-stop (a failed restore stops it
    /// again on release).
    pub continued: bool,
}

/// How to let a frozen tree go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Detach and let every task run (tasks already stopped before the seize stay stopped
    /// unless `continue_stopped`).
    Resume {
        /// Send SIGCONT to tasks that were in group-stop when seized.
        continue_stopped: bool,
    },
    /// Queue SIGSTOP, then detach: every task ends up group-stopped and untraced.
    Stop,
}

/// A ptrace or /proc failure while freezing a tree.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// The task does not exist (or is not the task that was dumped).
    #[error("task {0} does not exist")]
    NoTask(i32),
    /// The task exists but its start time differs from the dump's: the pid was reused.
    #[error("task {0} is not the dumped task (pid reused)")]
    Reused(i32),
    /// `PTRACE_SEIZE`/`PTRACE_INTERRUPT` failed.
    #[error("failed to seize task {pid}")]
    Seize {
        /// The thread.
        pid: i32,
        /// The cause.
        #[source]
        source: Errno,
    },
    /// `waitpid` failed.
    #[error("failed to wait for task {pid} to stop")]
    Wait {
        /// The thread.
        pid: i32,
        /// The cause.
        #[source]
        source: Errno,
    },
    /// The main thread died while being seized.
    #[error("task {0} died while being seized")]
    Died(i32),
    /// The freeze timeout fired.
    #[error("timeout reached while freezing task {0}")]
    Timeout(i32),
    /// The engine's per-task callback failed.
    #[error("pre-seize callback for task {pid} failed with {ret}")]
    Callback {
        /// The task.
        pid: i32,
        /// The hook result.
        ret: i32,
    },
    /// The thread list never settled.
    #[error("thread list of task {0} never settled")]
    Unstable(i32),
}

/// `State` and start time from `/proc/PID/stat`.
fn stat(pid: i32) -> Option<(char, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// The start time of `pid`, if it exists.
#[must_use]
pub fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|(_, t)| t)
}

fn thread_ids(pid: i32) -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut v: Vec<i32> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    // The main thread first.
    if let Some(i) = v.iter().position(|&t| t == pid) {
        v.remove(i);
        v.insert(0, pid);
    }
    v
}

fn children(pid: i32, threads: &[i32]) -> Vec<i32> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for tid in threads {
        let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/children")) else {
            continue;
        };
        for c in s.split_whitespace().filter_map(|c| c.parse::<i32>().ok()) {
            if seen.insert(c) {
                out.push(c);
            }
        }
    }
    out
}

/// Waits until `tid` is in a ptrace event-stop. `Ok(false)`: the thread is gone.
fn wait_stop(tid: i32) -> Result<bool, TreeError> {
    let p = Pid::from_raw(tid);
    for _ in 0..64 {
        match waitpid(p, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::PtraceEvent(_, _, ev)) if ev == libc::PTRACE_EVENT_STOP => {
                return Ok(true);
            }
            Ok(WaitStatus::PtraceEvent(..) | WaitStatus::PtraceSyscall(_)) => {
                let _ = ptrace::cont(p, None);
            }
            // A signal-delivery-stop that raced with our interrupt: deliver the signal as it
            // would have been without us; the interrupt stays pending.
            Ok(WaitStatus::Stopped(_, sig)) => {
                let _ = ptrace::cont(p, Some(sig));
            }
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => return Ok(false),
            Ok(_) => {}
            Err(Errno::EINTR) => {
                if host::alarm_timeouted() {
                    return Err(TreeError::Timeout(tid));
                }
            }
            Err(Errno::ECHILD) => return Ok(false),
            Err(source) => return Err(TreeError::Wait { pid: tid, source }),
        }
    }
    Err(TreeError::Wait {
        pid: tid,
        source: Errno::EAGAIN,
    })
}

/// Waits for a thread that was just resumed by the tracer until it is in a ptrace event-stop,
/// suppressing signal-delivery-stops of `suppress` and re-injecting any other signal. A thread
/// that does not stop by itself within 200 ms (nothing was queued for it) is interrupted.
fn settle(tid: i32, suppress: &[i32]) -> Result<(), TreeError> {
    let p = Pid::from_raw(tid);
    let mut nudge = Some(std::time::Instant::now() + std::time::Duration::from_millis(200));
    for _ in 0..10_000 {
        match waitpid(p, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {
                if nudge.is_some_and(|t| std::time::Instant::now() > t) {
                    nudge = None;
                    ptrace::interrupt(p).map_err(|source| TreeError::Seize { pid: tid, source })?;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Ok(WaitStatus::PtraceEvent(_, _, ev)) if ev == libc::PTRACE_EVENT_STOP => return Ok(()),
            Ok(WaitStatus::Stopped(_, sig)) => {
                // A signal-delivery-stop: stop at the next trap, delivering anything but the
                // signals this module caused.
                let inject = (!suppress.contains(&(sig as i32))).then_some(sig);
                ptrace::interrupt(p).map_err(|source| TreeError::Seize { pid: tid, source })?;
                ptrace::cont(p, inject).map_err(|source| TreeError::Seize { pid: tid, source })?;
            }
            Ok(WaitStatus::PtraceEvent(..) | WaitStatus::PtraceSyscall(_)) => {
                let _ = ptrace::cont(p, None);
            }
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) | Err(Errno::ECHILD) => {
                return Err(TreeError::Died(tid))
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(source) => return Err(TreeError::Wait { pid: tid, source }),
        }
    }
    Err(TreeError::Unstable(tid))
}

const fn sig_bit(sig: i32) -> u64 {
    1u64 << (sig - 1)
}

/// A hex signal mask line (`ShdPnd:`, `SigBlk:`) of a `/proc` status file.
fn mask(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

/// The process-wide pending signals of `pid`.
fn shared_mask(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status")).map_or(0, |s| mask(&s, "ShdPnd:"))
}

fn blocks(pid: i32, tid: i32, sig: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
        .map_or(true, |s| mask(&s, "SigBlk:") & sig_bit(sig) != 0)
}

fn thread_exists(pid: i32, tid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
}

/// A set of tasks this process has seized.
#[derive(Debug, Default)]
pub struct Frozen {
    tasks: Vec<Task>,
    released: bool,
}

impl Frozen {
    /// Nothing seized yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The tasks, in pstree (DFS pre-) order.
    #[must_use]
    pub fn tasks(&self) -> &[Task] {
        &self.tasks
    }

    /// The index of `pid` in the tree.
    #[must_use]
    pub fn index_of(&self, pid: i32) -> Option<usize> {
        self.tasks.iter().position(|t| t.pid == pid)
    }

    /// Collects the tree rooted at `root`, calling `before_seize(index, pid)` for each task just
    /// before it is seized (depth-first). On error, what was seized stays seized: the caller runs
    /// its failure path with the tasks still frozen and then releases them.
    ///
    /// # Errors
    /// A missing root, a ptrace failure, the freeze timeout, or a callback error.
    pub fn collect(
        &mut self,
        root: i32,
        before_seize: &mut dyn FnMut(usize, i32) -> Result<(), i32>,
    ) -> Result<(), TreeError> {
        if stat(root).is_none() {
            return Err(TreeError::NoTask(root));
        }
        self.collect_one(root, None, before_seize)
    }

    fn collect_one(
        &mut self,
        pid: i32,
        parent: Option<usize>,
        before_seize: &mut dyn FnMut(usize, i32) -> Result<(), i32>,
    ) -> Result<(), TreeError> {
        let idx = self.tasks.len();
        before_seize(idx, pid).map_err(|ret| TreeError::Callback { pid, ret })?;
        self.seize_task(pid, parent, None)?;
        if host::alarm_timeouted() {
            return Err(TreeError::Timeout(pid));
        }
        let threads = self.tasks[idx].threads.clone();
        for child in children(pid, &threads) {
            self.collect_one(child, Some(idx), before_seize)?;
        }
        Ok(())
    }

    /// Seizes already known tasks again (restore), checking each is the task that was dumped.
    ///
    /// # Errors
    /// A task that is gone or was replaced, or a ptrace failure.
    pub fn seize_known(
        &mut self,
        known: &[(i32, Option<usize>, u64, bool)],
    ) -> Result<(), TreeError> {
        for &(pid, parent, start, zombie) in known {
            if zombie {
                self.tasks.push(Task {
                    pid,
                    parent,
                    threads: Vec::new(),
                    zombie: true,
                    start_time: start,
                    was_stopped: false,
                    continued: false,
                });
                continue;
            }
            match stat(pid) {
                None => return Err(TreeError::NoTask(pid)),
                Some((_, t)) if t != start => return Err(TreeError::Reused(pid)),
                Some(_) => {}
            }
            self.seize_task(pid, parent, Some(start))?;
        }
        Ok(())
    }

    fn seize_task(
        &mut self,
        pid: i32,
        parent: Option<usize>,
        expect_start: Option<u64>,
    ) -> Result<(), TreeError> {
        let (state, start_time) = stat(pid).ok_or(TreeError::NoTask(pid))?;
        if expect_start.is_some_and(|s| s != start_time) {
            return Err(TreeError::Reused(pid));
        }
        let idx = self.tasks.len();
        self.tasks.push(Task {
            pid,
            parent,
            threads: Vec::new(),
            zombie: state == 'Z' || state == 'X',
            start_time,
            was_stopped: state == 'T',
            continued: false,
        });
        if self.tasks[idx].zombie {
            return Ok(());
        }
        for _round in 0..16 {
            let known: HashSet<i32> = self.tasks[idx].threads.iter().copied().collect();
            let new: Vec<i32> = thread_ids(pid)
                .into_iter()
                .filter(|t| !known.contains(t))
                .collect();
            if new.is_empty() {
                if self.tasks[idx].threads.is_empty() {
                    return Err(TreeError::Died(pid));
                }
                return Ok(());
            }
            let mut seized = Vec::new();
            for tid in new {
                let p = Pid::from_raw(tid);
                match ptrace::seize(p, ptrace::Options::empty()) {
                    Ok(()) => {}
                    Err(Errno::ESRCH) if tid != pid => continue,
                    Err(source) => return Err(TreeError::Seize { pid: tid, source }),
                }
                self.tasks[idx].threads.push(tid);
                match ptrace::interrupt(p) {
                    Ok(()) => seized.push(tid),
                    Err(Errno::ESRCH) if tid != pid => {}
                    Err(source) => return Err(TreeError::Seize { pid: tid, source }),
                }
            }
            for tid in seized {
                if !wait_stop(tid)? {
                    if tid == pid {
                        return Err(TreeError::Died(pid));
                    }
                    self.tasks[idx].threads.retain(|&t| t != tid);
                }
            }
        }
        Err(TreeError::Unstable(pid))
    }

    /// Takes every seized task that is in group-stop out of it, leaving each of its threads in a
    /// plain ptrace-stop, as the tasks of a real CRIU restore are before RESUME_DEVICES_LATE.
    ///
    /// A seized thread of a group-stopped task that a plugin `PTRACE_CONT`s goes straight back
    /// into the group-stop, so a plugin could never run a thread of it. Here the task gets
    /// `SIGCONT` while seized (which ends the group-stop and queues a notification trap on every
    /// thread); each thread is resumed into that trap and waited for; then the signals this
    /// caused (the queued `SIGCONT`, and the `SIGCHLD` a continued child sends its parent) are
    /// dequeued by a thread that does not block them and suppressed, when they were not pending
    /// before (the tasks of a real restore never see them). [`Frozen::release`] without `continue_stopped` stops such tasks
    /// again, so a failed restore leaves them parked as the dump did.
    ///
    /// # Errors
    /// A ptrace or wait failure, or a thread that does not settle.
    pub fn leave_group_stop(&mut self) -> Result<(), TreeError> {
        // Signals this leaves behind: the SIGCONT itself, and the SIGCHLD (CLD_CONTINUED) each
        // continued task's parent gets. Only those not pending before are dropped.
        let artefacts = [libc::SIGCONT, libc::SIGCHLD];
        let before: Vec<u64> = self.tasks.iter().map(|t| shared_mask(t.pid)).collect();
        for i in 0..self.tasks.len() {
            let task = &self.tasks[i];
            if task.zombie || !task.was_stopped || task.threads.is_empty() {
                continue;
            }
            let pid = task.pid;
            let threads = task.threads.clone();
            kill(Pid::from_raw(pid), Signal::SIGCONT)
                .map_err(|source| TreeError::Seize { pid, source })?;
            self.tasks[i].continued = true;
            for &tid in &threads {
                // The SIGCONT queued a notification trap on every seized thread (and the
                // interrupt makes sure of one): resuming the thread takes it straight into that
                // trap, since job-control traps come before signals.
                let p = Pid::from_raw(tid);
                ptrace::interrupt(p).map_err(|source| TreeError::Seize { pid: tid, source })?;
                ptrace::cont(p, None).map_err(|source| TreeError::Seize { pid: tid, source })?;
                settle(tid, &[])?;
            }
        }
        for (task, before) in self.tasks.iter().zip(before) {
            if task.zombie || task.threads.is_empty() {
                continue;
            }
            let pid = task.pid;
            for _ in 0..4 {
                let new = shared_mask(pid) & !before;
                let drop: Vec<i32> = artefacts
                    .into_iter()
                    .filter(|&s| new & sig_bit(s) != 0)
                    .collect();
                let Some(&sig) = drop.first() else {
                    break;
                };
                let Some(&tid) = task.threads.iter().find(|&&t| !blocks(pid, t, sig)) else {
                    break;
                };
                // No trap is queued: the thread dequeues the signal at once and reports it.
                ptrace::cont(Pid::from_raw(tid), None)
                    .map_err(|source| TreeError::Seize { pid: tid, source })?;
                settle(tid, &drop)?;
            }
        }
        Ok(())
    }

    /// Detaches every seized thread (children first), as `mode` says. Idempotent.
    pub fn release(&mut self, mode: Release) {
        if self.released {
            return;
        }
        self.released = true;
        for task in self.tasks.iter().rev() {
            if task.zombie || task.threads.is_empty() {
                continue;
            }
            let pid = Pid::from_raw(task.pid);
            let restop = task.continued
                && mode
                    == (Release::Resume {
                        continue_stopped: false,
                    });
            if mode == Release::Stop || restop {
                let _ = kill(pid, Signal::SIGSTOP);
            }
            for &tid in &task.threads {
                detach_thread(task.pid, tid);
            }
            if let Release::Resume {
                continue_stopped: true,
            } = mode
            {
                if task.was_stopped {
                    let _ = kill(pid, Signal::SIGCONT);
                }
            }
        }
        if mode == Release::Stop {
            // The stand-in for CRIU's killed tree: it is parked when the engine returns, as a
            // real CRIU's tree is dead (a guardian watching the tree after the engine exits
            // must not find it running in the moment before the SIGSTOP lands).
            let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
            for task in &self.tasks {
                if task.zombie || task.threads.is_empty() {
                    continue;
                }
                while !crate::procfs::parked(task.pid)
                    && !matches!(crate::procfs::state(task.pid), 'Z' | 'X' | '?')
                    && std::time::Instant::now() < end
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        }
    }
}

fn detach_thread(pid: i32, tid: i32) {
    // A task that died while traced (a plugin killed it) has nothing to detach; waiting for its
    // leader would wait for ever, as its threads' exits are ours to collect first.
    if matches!(crate::procfs::state(pid), 'Z' | 'X' | '?') {
        return;
    }
    let p = Pid::from_raw(tid);
    match ptrace::detach(p, None) {
        Ok(()) => {}
        // Not in a ptrace-stop (a plugin resumed it and did not stop it again): stop it first.
        Err(Errno::ESRCH) if thread_exists(pid, tid) => {
            if ptrace::interrupt(p).is_ok() && matches!(wait_stop(tid), Ok(true)) {
                let _ = ptrace::detach(p, None);
            }
        }
        Err(_) => {}
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.release(Release::Resume {
            continue_stopped: false,
        });
    }
}

/// Whether `pid`'s threads are all untraced and none is in a (tracing) stop: what the harness
/// promises after a run that resumes the tree. Returns the offending `State`/`TracerPid` lines.
///
/// # Errors
/// The first thread that is traced or stopped, or whose status cannot be read.
pub fn running_untraced(pid: i32) -> Result<(), String> {
    for tid in thread_ids(pid) {
        let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
            .map_err(|e| format!("{tid}: {e}"))?;
        let field = |k: &str| {
            s.lines()
                .find_map(|l| l.strip_prefix(k))
                .map(str::trim)
                .unwrap_or("")
                .to_owned()
        };
        let state = field("State:");
        let tracer = field("TracerPid:");
        if tracer != "0" || state.starts_with('t') || state.starts_with('T') {
            return Err(format!("{tid}: State {state}, TracerPid {tracer}"));
        }
    }
    Ok(())
}
