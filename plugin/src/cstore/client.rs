//! CRIU's side of custom storage: the copier process, the jobs it is sent, and what each task's
//! operation left for its task image.
//!
//! The copier is started on the first job (from CRIU's main thread, while CRIU has no other
//! thread: the driver-API backend with the guardian runs none) and serves every job of the dump
//! or restore, each on a thread of its own. A job that fails, or that overruns its deadline,
//! ends the copier (it exits by itself; one that overran is killed), which is how the driver's
//! open operations of its tasks are aborted; the next job starts a new one.

use crate::agent::client::Link;
use crate::agent::proto::{Call, CustomGpu, CustomJob, FinishMode, Reply};
use crate::backend::{BackendError, BackendKind, GpuPair, Job, JobResult, Op, Pid};
use crate::image::CustomRecord;
use crate::worker::CallError;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long CRIU waits for a copier it ended (or that ended itself after a failure) to exit.
const COPIER_EXIT_WAIT: Duration = Duration::from_secs(2);

/// Starts a copier process and connects to it.
pub type Spawn = Box<dyn FnMut() -> Result<Link, crate::agent::AgentError> + Send>;

/// The custom-storage path of one dump or restore.
pub struct CustomPath {
    dump_id: [u8; 16],
    /// The image directory, where a failed checkpoint's files are removed.
    dir: Option<std::os::fd::RawFd>,
    spawn: Spawn,
    copier: Option<Arc<Link>>,
    /// Dump: the tasks checkpointed here, for their task images (and a rollback's restore).
    written: BTreeMap<Pid, CustomRecord>,
    /// Restore: what the dump recorded, by the task's pid now.
    recorded: BTreeMap<Pid, CustomRecord>,
    /// What each task's last operation moved, per GPU, for the log.
    moved: BTreeMap<Pid, Vec<CustomGpu>>,
    /// Dump: tasks whose checkpoint was asked of a copier whose answer never came (it died,
    /// or was ended, after another task's failure): the operation may have completed, the
    /// task then CHECKPOINTED with its files whole (the copier completes only after every
    /// file is written and synced). Restoring one reads its files' headers first.
    unanswered: std::collections::BTreeSet<Pid>,
}

impl std::fmt::Debug for CustomPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomPath")
            .field("dump_id", &crate::image::dump_id_hex(&self.dump_id))
            .field("copier", &self.copier.as_ref().map(|l| l.agent_pid()))
            .finish_non_exhaustive()
    }
}

/// A fresh dump id: 16 bytes from the kernel's random source.
pub fn new_dump_id() -> Result<[u8; 16], String> {
    use std::io::Read;
    let mut id = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut id))
        .map_err(|e| format!("cannot draw a dump id from /dev/urandom: {e}"))?;
    Ok(id)
}

impl CustomPath {
    /// A path whose files carry `dump_id`, in the image directory `dir`, its copiers started
    /// by `spawn`.
    #[must_use]
    pub fn new(dump_id: [u8; 16], dir: Option<std::os::fd::RawFd>, spawn: Spawn) -> Self {
        CustomPath {
            dump_id,
            dir,
            spawn,
            copier: None,
            written: BTreeMap::new(),
            recorded: BTreeMap::new(),
            moved: BTreeMap::new(),
            unanswered: std::collections::BTreeSet::new(),
        }
    }

    /// A line for the log: what `pid`'s last operation moved (`None`: nothing through custom
    /// storage).
    #[must_use]
    pub fn summary(&self, pid: Pid) -> Option<String> {
        self.moved.get(&pid).map(|gpus| summary(gpus))
    }

    /// What checkpointing `pid` wrote (for its task image).
    #[must_use]
    pub fn written(&self, pid: Pid) -> Option<CustomRecord> {
        self.written.get(&pid).cloned()
    }

    /// Restore: what the dump recorded for the task that is `pid` now.
    pub fn set_recorded(&mut self, pid: Pid, rec: CustomRecord) {
        self.recorded.insert(pid, rec);
    }

    /// Whether `pid`'s GPU memory is in custom-storage files (restoring it reads them).
    #[must_use]
    pub fn holds(&self, pid: Pid) -> bool {
        self.recorded.contains_key(&pid)
            || self.written.contains_key(&pid)
            || self.unanswered.contains(&pid)
    }

    /// The record of a task whose checkpoint went unanswered, from its files' headers (this
    /// dump's id and the task's pid): `cuda-cs-<pid>-<n>.img` from n = 0 to the first that
    /// is missing. `None` when there is no such file.
    fn discover(&self, pid: Pid) -> Option<CustomRecord> {
        use std::io::Read;
        let dir = self.dir?;
        let mut gpus = Vec::new();
        for n in 0..u32::from(u16::MAX) {
            let name = super::pipeline::file_name(pid, n);
            let Ok(mut f) = std::fs::File::open(format!("/proc/self/fd/{dir}/{name}")) else {
                break;
            };
            let mut block = [0u8; super::format::ALIGN];
            if f.read_exact(&mut block).is_err() {
                break;
            }
            match super::format::Header::decode(&block) {
                Ok((h, _)) if h.dump_id == self.dump_id && h.pid == pid && h.place == n => {
                    gpus.push((h.uuid, h.size));
                }
                _ => break,
            }
        }
        (!gpus.is_empty()).then_some(CustomRecord {
            dump_id: self.dump_id,
            file_pid: pid,
            gpus,
        })
    }

    fn copier(&mut self) -> Result<Arc<Link>, String> {
        if let Some(l) = &self.copier {
            if l.gone().is_none() {
                return Ok(Arc::clone(l));
            }
        }
        self.copier = None;
        let link = Arc::new((self.spawn)().map_err(|e| format!("cannot start the copier: {e}"))?);
        self.copier = Some(Arc::clone(&link));
        Ok(link)
    }

    /// Ends the copier after a failed or overrun job: it exits by itself after a failure; one
    /// that overran is killed, so the driver aborts the operations it has open.
    fn end_copier(&mut self) {
        if let Some(l) = self.copier.take() {
            let pid = l.agent_pid();
            if l.gone().is_none() {
                let _ = crate::ffi::agent::kill(pid, libc::SIGKILL);
            }
            // Until it has exited (its channel closes with it), so that what comes next (the
            // rollback, a retried restore) finds its operations aborted.
            let until = Instant::now() + COPIER_EXIT_WAIT;
            while l.gone().is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    /// Checkpoints `jobs` through the copier, at most `width` at a time; each task's result in
    /// order.
    pub fn checkpoint_many(&mut self, jobs: &[Job], width: usize) -> Vec<JobResult> {
        let calls: Vec<(Pid, CustomJob)> = jobs
            .iter()
            .map(|j| {
                (
                    j.pid,
                    CustomJob {
                        checkpoint: true,
                        pid: j.pid,
                        key: j.pid,
                        dump_id: self.dump_id,
                        pairs: Vec::new(),
                        files: Vec::new(),
                    },
                )
            })
            .collect();
        let deadlines: Vec<Option<Duration>> = jobs.iter().map(|j| j.deadline).collect();
        let out = self.run(Op::Checkpoint, calls, &deadlines, width);
        out.into_iter()
            .zip(jobs)
            .map(|((r, took), j)| {
                if r.as_ref().err().is_some_and(unanswered) {
                    self.unanswered.insert(j.pid);
                }
                let r = r.map(|gpus| {
                    self.moved.insert(j.pid, gpus.clone());
                    self.written.insert(
                        j.pid,
                        CustomRecord {
                            dump_id: self.dump_id,
                            file_pid: j.pid,
                            gpus: gpus
                                .iter()
                                .map(|g| (abi::GpuUuid(g.uuid), g.bytes))
                                .collect(),
                        },
                    );
                });
                (r, took)
            })
            .collect()
    }

    /// Restores `jobs` from their files through the copier (with the dump's GPU pairs), at
    /// most `width` at a time.
    pub fn restore_many(
        &mut self,
        jobs: &[Job],
        pairs: &[GpuPair],
        width: usize,
    ) -> Vec<JobResult> {
        let mut calls = Vec::new();
        let mut missing = BTreeMap::new();
        for j in jobs {
            if !self.recorded.contains_key(&j.pid) && !self.written.contains_key(&j.pid) {
                if let Some(rec) = self.discover(j.pid) {
                    self.written.insert(j.pid, rec);
                }
            }
            let rec = self
                .recorded
                .get(&j.pid)
                .or_else(|| self.written.get(&j.pid));
            match rec {
                Some(rec) => calls.push((
                    j.pid,
                    CustomJob {
                        checkpoint: false,
                        pid: j.pid,
                        key: rec.file_pid,
                        dump_id: rec.dump_id,
                        pairs: pairs.iter().map(|(o, n)| (o.0, n.0)).collect(),
                        files: rec.gpus.iter().map(|(u, b)| (u.0, *b)).collect(),
                    },
                )),
                None => {
                    missing.insert(j.pid, ());
                }
            }
        }
        let deadlines: Vec<Option<Duration>> = jobs
            .iter()
            .filter(|j| !missing.contains_key(&j.pid))
            .map(|j| j.deadline)
            .collect();
        let mut done = self.run(Op::Restore, calls, &deadlines, width).into_iter();
        jobs.iter()
            .map(|j| {
                if missing.contains_key(&j.pid) {
                    (
                        Err(BackendError::CustomStorage {
                            op: Op::Restore,
                            pid: j.pid,
                            why: "the dump recorded no custom-storage files for this task".into(),
                        }),
                        Duration::ZERO,
                    )
                } else {
                    let (r, took) = done.next().unwrap_or((
                        Err(BackendError::CustomStorage {
                            op: Op::Restore,
                            pid: j.pid,
                            why: "never submitted".into(),
                        }),
                        Duration::ZERO,
                    ));
                    if let Ok(gpus) = &r {
                        self.moved.insert(j.pid, gpus.clone());
                    }
                    (r.map(|_| ()), took)
                }
            })
            .collect()
    }

    /// Sends `calls` to the copier, keeping up to `width` in flight; each call's deadline
    /// counts from its own submission.
    #[allow(clippy::type_complexity)]
    fn run(
        &mut self,
        op: Op,
        calls: Vec<(Pid, CustomJob)>,
        deadlines: &[Option<Duration>],
        width: usize,
    ) -> Vec<(Result<Vec<CustomGpu>, BackendError>, Duration)> {
        let n = calls.len();
        let mut out: Vec<Option<(Result<Vec<CustomGpu>, BackendError>, Duration)>> =
            std::iter::repeat_with(|| None).take(n).collect();
        let link = match self.copier() {
            Ok(l) => l,
            Err(why) => {
                return calls
                    .iter()
                    .map(|(pid, _)| {
                        (
                            Err(BackendError::CustomStorage {
                                op,
                                pid: *pid,
                                why: why.clone(),
                            }),
                            Duration::ZERO,
                        )
                    })
                    .collect();
            }
        };
        let what = match op {
            Op::Checkpoint => "custom-storage checkpoint",
            _ => "custom-storage restore",
        };
        let pids: Vec<Pid> = calls.iter().map(|(p, _)| *p).collect();
        let mut flight: VecDeque<(usize, Pid, Option<Duration>, u64, Instant)> = VecDeque::new();
        let mut todo = calls.into_iter().enumerate();
        let mut failed = false;
        loop {
            // After a failure nothing more is started: the dump or restore fails anyway, and
            // the copier ends once the jobs it has run their course.
            while !failed && flight.len() < width.max(1) {
                let Some((i, (pid, job))) = todo.next() else {
                    break;
                };
                let deadline = deadlines.get(i).copied().flatten();
                let started = Instant::now();
                match link.submit(Call::Custom(job), deadline) {
                    Ok(id) => flight.push_back((i, pid, deadline, id, started)),
                    Err(e) => out[i] = Some((Err(call_error(op, pid, e)), Duration::ZERO)),
                }
            }
            let Some((i, pid, deadline, id, started)) = flight.pop_front() else {
                break;
            };
            let r = match link.wait_since(id, what, deadline, started) {
                Ok(Reply::Custom(Ok(gpus))) => {
                    // The copier's own figures per GPU (scripts and benchmarks read the rate;
                    // the task's INFO line sums them up).
                    for (n, g) in gpus.iter().enumerate() {
                        crate::ffi::log::log(
                            abi::criu::log_level::DEBUG,
                            &format!(
                                "custom storage {} pid {pid} gpu {n}: {} bytes ({} data, {} fill) in {} us{}",
                                if matches!(op, Op::Checkpoint) { "dump" } else { "restore" },
                                g.bytes,
                                g.data,
                                g.fills,
                                g.micros,
                                if g.direct { ", O_DIRECT" } else { "" }
                            ),
                        );
                    }
                    Ok(gpus)
                }
                Ok(Reply::Custom(Err(why))) => {
                    failed = true;
                    Err(BackendError::CustomStorage { op, pid, why })
                }
                Ok(other) => {
                    failed = true;
                    Err(BackendError::CustomStorage {
                        op,
                        pid,
                        why: format!("the copier answered {other:?}"),
                    })
                }
                Err(e) => {
                    failed = true;
                    Err(call_error(op, pid, e))
                }
            };
            out[i] = Some((r, started.elapsed()));
        }
        if failed {
            self.end_copier();
            if op == Op::Checkpoint {
                // The copier removes what a failed job wrote. A job whose answer never came
                // (the copier died, or was killed on its deadline) may have completed: its
                // files stay until the rollback has read them back (see `discover`).
                let failed_pids: Vec<Pid> = out
                    .iter()
                    .zip(&pids)
                    .filter(|(r, _)| {
                        r.as_ref()
                            .is_none_or(|(r, _)| r.as_ref().err().is_some_and(|e| !unanswered(e)))
                    })
                    .map(|(_, p)| *p)
                    .collect();
                for pid in failed_pids {
                    self.remove_files(pid);
                }
            }
        }
        out.into_iter()
            .zip(pids)
            .map(|(r, pid)| {
                r.unwrap_or_else(|| {
                    (
                        Err(BackendError::CustomStorage {
                            op,
                            pid,
                            why: "not started: another task's custom-storage job failed first"
                                .into(),
                        }),
                        Duration::ZERO,
                    )
                })
            })
            .collect()
    }
}

/// Whether `e` says the copier never answered (it died, or its deadline passed): the job may
/// have completed all the same.
fn unanswered(e: &BackendError) -> bool {
    matches!(e, BackendError::CustomStorage { why, .. } if why.starts_with("the copier process is gone"))
        || matches!(e, BackendError::Timeout { .. })
}

/// `2 GPU(s), 1.0 GiB: 512.0 MiB in data chunks, 512.0 MiB uniform (not written); slowest
/// GPU 3.1 GB/s; O_DIRECT`.
#[must_use]
pub fn summary(gpus: &[CustomGpu]) -> String {
    let bytes: u64 = gpus.iter().map(|g| g.bytes).sum();
    let data: u64 = gpus.iter().map(|g| g.data).sum();
    let fills: u64 = gpus.iter().map(|g| g.fills).sum();
    #[allow(clippy::cast_precision_loss)]
    let slowest = gpus
        .iter()
        .filter(|g| g.bytes > 0 && g.micros > 0)
        .map(|g| g.bytes as f64 / g.micros as f64 / 1000.0)
        .fold(f64::INFINITY, f64::min);
    let rate = if slowest.is_finite() {
        format!("; slowest GPU {} GB/s", crate::message::Tenths(slowest))
    } else {
        String::new()
    };
    let io = if gpus.iter().all(|g| g.direct) {
        "O_DIRECT"
    } else if gpus.iter().any(|g| g.direct) {
        "partly O_DIRECT"
    } else {
        "buffered"
    };
    format!(
        "{} GPU(s), {}: {} in data chunks, {} uniform (not written){rate}; {io}",
        gpus.len(),
        crate::message::bytes(bytes),
        crate::message::bytes(data),
        crate::message::bytes(fills),
    )
}

impl CustomPath {
    /// Removes `cuda-cs-<pid>-<n>.img` for n from 0 up to the first that is not there; returns
    /// how many it removed.
    fn remove_files(&self, pid: Pid) -> usize {
        let Some(dir) = self.dir else {
            return 0;
        };
        let dir = crate::ffi::agent::borrow_fd(dir);
        let mut n = 0;
        while n < u32::from(u16::MAX)
            && crate::ffi::agent::unlink_in(dir, &super::pipeline::file_name(pid, n))
        {
            n += 1;
        }
        n as usize
    }

    /// After a failed dump: removes the files of every task this dump checkpointed (or asked a
    /// copier that never answered to checkpoint), but `keep`'s; returns how many files it removed.
    pub fn discard(&mut self, keep: &[Pid]) -> usize {
        let pids: Vec<Pid> = self
            .written
            .keys()
            .chain(&self.unanswered)
            .filter(|p| !keep.contains(p))
            .copied()
            .collect();
        let mut n = 0;
        for pid in pids {
            n += self.remove_files(pid);
            self.written.remove(&pid);
            self.unanswered.remove(&pid);
        }
        n
    }
}

impl crate::backend::driver::CustomStorage for CustomPath {
    fn written(&self, pid: Pid) -> Option<CustomRecord> {
        CustomPath::written(self, pid)
    }

    fn set_recorded(&mut self, pid: Pid, rec: CustomRecord) {
        CustomPath::set_recorded(self, pid, rec);
    }

    fn summary(&self, pid: Pid) -> Option<String> {
        CustomPath::summary(self, pid)
    }

    fn discard(&mut self, keep: &[Pid]) -> usize {
        CustomPath::discard(self, keep)
    }

    fn holds(&self, pid: Pid) -> bool {
        CustomPath::holds(self, pid)
    }

    fn checkpoint_many(&mut self, jobs: &[Job], width: usize) -> Vec<JobResult> {
        CustomPath::checkpoint_many(self, jobs, width)
    }

    fn restore_many(&mut self, jobs: &[Job], pairs: &[GpuPair], width: usize) -> Vec<JobResult> {
        CustomPath::restore_many(self, jobs, pairs, width)
    }
}

fn call_error(op: Op, pid: Pid, e: CallError) -> BackendError {
    match e {
        CallError::TimedOut { after } => BackendError::Timeout {
            backend: BackendKind::DriverApi,
            op,
            pid,
            after,
        },
        CallError::Lost(why) => BackendError::CustomStorage {
            op,
            pid,
            why: format!("the copier process is gone ({why})"),
        },
        other => BackendError::CustomStorage {
            op,
            pid,
            why: format!("the copier: {other}"),
        },
    }
}

impl Drop for CustomPath {
    fn drop(&mut self) {
        if let Some(l) = self.copier.take() {
            if l.finish(FinishMode::Done).is_err() {
                let _ = crate::ffi::agent::kill(l.agent_pid(), libc::SIGKILL);
            }
        }
    }
}
