//! Where a hook's time goes: the time spent waiting on the backend (driver calls or
//! `cuda-checkpoint` runs) and on restore-thread control (ptrace), measured by wrapping the two
//! seams. The rest of a hook is the plugin's own work (bookkeeping, image files, logging).

use crate::backend::{
    Backend, BackendError, BackendKind, GpuPair, Job, JobResult, LockLimits, Pid, Tid,
};
use crate::thread::{Resumed, ThreadControl, ThreadError};
use abi::CUprocessState;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Time accumulated since the last [`Spent::take`].
#[derive(Debug, Default)]
pub struct Spent {
    backend_ns: AtomicU64,
    threads_ns: AtomicU64,
}

/// A [`Spent`] reading: time in the backend and in restore-thread control.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpentTimes {
    pub backend: Duration,
    pub threads: Duration,
}

impl Spent {
    fn add(counter: &AtomicU64, since: Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        counter.fetch_add(ns, Relaxed);
    }

    /// The time accumulated so far, resetting both counters.
    pub fn take(&self) -> SpentTimes {
        SpentTimes {
            backend: Duration::from_nanos(self.backend_ns.swap(0, Relaxed)),
            threads: Duration::from_nanos(self.threads_ns.swap(0, Relaxed)),
        }
    }
}

/// A [`Backend`] that adds the time of every operation to a [`Spent`].
pub struct TimedBackend {
    pub inner: Box<dyn Backend>,
    pub spent: Arc<Spent>,
}

impl std::fmt::Debug for TimedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedBackend")
            .field("kind", &self.inner.kind())
            .field("spent", &self.spent)
            .finish()
    }
}

impl TimedBackend {
    fn timed<T>(&mut self, f: impl FnOnce(&mut dyn Backend) -> T) -> T {
        let t = Instant::now();
        let r = f(&mut *self.inner);
        Spent::add(&self.spent.backend_ns, t);
        r
    }
}

impl Backend for TimedBackend {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }
    fn get_restore_tid(&mut self, pid: Pid) -> Result<Option<Tid>, BackendError> {
        self.timed(|b| b.get_restore_tid(pid))
    }
    fn get_state(&mut self, pid: Pid) -> Result<CUprocessState, BackendError> {
        self.timed(|b| b.get_state(pid))
    }
    fn lock(&mut self, pid: Pid, limits: LockLimits) -> Result<(), BackendError> {
        self.timed(|b| b.lock(pid, limits))
    }
    fn checkpoint(&mut self, pid: Pid, deadline: Option<Duration>) -> Result<(), BackendError> {
        self.timed(|b| b.checkpoint(pid, deadline))
    }
    fn restore(
        &mut self,
        pid: Pid,
        pairs: &[GpuPair],
        deadline: Option<Duration>,
    ) -> Result<(), BackendError> {
        self.timed(|b| b.restore(pid, pairs, deadline))
    }
    fn unlock(&mut self, pid: Pid) -> Result<(), BackendError> {
        self.timed(|b| b.unlock(pid))
    }
    fn checkpoint_many(&mut self, jobs: &[Job], width: usize) -> Vec<JobResult> {
        self.timed(|b| b.checkpoint_many(jobs, width))
    }
    fn restore_many(&mut self, jobs: &[Job], pairs: &[GpuPair], width: usize) -> Vec<JobResult> {
        self.timed(|b| b.restore_many(jobs, pairs, width))
    }
    fn lock_many(&mut self, pids: &[Pid], limits: LockLimits, width: usize) -> Vec<JobResult> {
        self.timed(|b| b.lock_many(pids, limits, width))
    }
    fn unlock_many(&mut self, pids: &[Pid], width: usize) -> Vec<JobResult> {
        self.timed(|b| b.unlock_many(pids, width))
    }
    fn custom_written(&self, pid: Pid) -> Option<crate::image::CustomRecord> {
        self.inner.custom_written(pid)
    }
    fn set_custom_recorded(&mut self, pid: Pid, rec: crate::image::CustomRecord) {
        self.inner.set_custom_recorded(pid, rec);
    }
    fn custom_summary(&self, pid: Pid) -> Option<String> {
        self.inner.custom_summary(pid)
    }
    fn discard_custom_files(&mut self, keep: &[Pid]) -> usize {
        self.inner.discard_custom_files(keep)
    }
    fn executions(&self) -> Option<usize> {
        self.inner.executions()
    }
    fn settle(&mut self, limit: Duration) -> crate::backend::Settled {
        self.timed(|b| b.settle(limit))
    }
}

/// A [`ThreadControl`] that adds the time of every step to a [`Spent`].
pub struct TimedThreads {
    pub inner: Box<dyn ThreadControl>,
    pub spent: Arc<Spent>,
}

impl std::fmt::Debug for TimedThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedThreads")
            .field("spent", &self.spent)
            .finish_non_exhaustive()
    }
}

impl ThreadControl for TimedThreads {
    fn resume(&mut self, pid: Pid, tid: Tid) -> Result<Resumed, ThreadError> {
        let t = Instant::now();
        let r = self.inner.resume(pid, tid);
        Spent::add(&self.spent.threads_ns, t);
        r
    }
    fn restop(&mut self, resumed: Resumed) -> Result<(), ThreadError> {
        let t = Instant::now();
        let r = self.inner.restop(resumed);
        Spent::add(&self.spent.threads_ns, t);
        r
    }
    fn thread_exists(&self, pid: Pid, tid: Tid) -> bool {
        let t = Instant::now();
        let r = self.inner.thread_exists(pid, tid);
        Spent::add(&self.spent.threads_ns, t);
        r
    }
    fn task_exists(&self, pid: Pid) -> bool {
        self.inner.task_exists(pid)
    }
    fn ns_pid(&self, pid: Pid) -> Option<Pid> {
        self.inner.ns_pid(pid)
    }
    fn stopped(&self, pid: Pid, tid: Tid) -> Option<char> {
        self.inner.stopped(pid, tid)
    }
    fn kill_task(&mut self, pid: Pid) -> Result<(), ThreadError> {
        self.inner.kill_task(pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Slow;
    impl ThreadControl for Slow {
        fn resume(&mut self, pid: Pid, tid: Tid) -> Result<Resumed, ThreadError> {
            std::thread::sleep(Duration::from_millis(3));
            Ok(Resumed {
                pid,
                tid,
                saved_sigmask: None,
                seccomp: false,
            })
        }
        fn restop(&mut self, _: Resumed) -> Result<(), ThreadError> {
            Ok(())
        }
        fn thread_exists(&self, _: Pid, _: Tid) -> bool {
            true
        }
        fn task_exists(&self, _: Pid) -> bool {
            true
        }
        fn stopped(&self, _: Pid, _: Tid) -> Option<char> {
            None
        }
        fn kill_task(&mut self, _: Pid) -> Result<(), ThreadError> {
            Ok(())
        }
    }

    #[test]
    fn thread_time_accumulates_until_taken() {
        let spent = Arc::new(Spent::default());
        let mut t = TimedThreads {
            inner: Box::new(Slow),
            spent: Arc::clone(&spent),
        };
        let r = t.resume(1, 2).unwrap();
        t.restop(r).unwrap();
        let r = t.resume(1, 2).unwrap();
        t.restop(r).unwrap();
        let got = spent.take();
        assert!(got.threads >= Duration::from_millis(6), "{got:?}");
        assert_eq!(got.backend, Duration::ZERO);
        assert_eq!(spent.take(), SpentTimes::default(), "take resets");
    }
}
