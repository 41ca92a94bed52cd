//! Calls that may block forever (into the CUDA driver) run here: on a worker thread, waited for
//! with a deadline.
//!
//! Every driver call of the plugin goes through one [`Worker`]: the driver-API backend's
//! `cuCheckpointProcess*` calls, the driver probe at `init` (`cuDriverGetVersion`, `cuInit`) and
//! the GPU enumeration. The rule for a call that overruns its deadline is the same for all of
//! them:
//!
//! * the caller gets [`CallError::TimedOut`] and the call is **abandoned**: its thread keeps
//!   running until the driver returns (nothing can interrupt a thread blocked in a driver), and
//!   the worker's `on_abandon` hook runs (the plugin pins its own library in memory with it, so
//!   that the thread never returns into code CRIU has `dlclose`d);
//! * while an abandoned call is still blocked, every further call fails at once with
//!   [`CallError::Busy`] instead of queueing behind it (a driver blocked in one call is likely to
//!   block the next one too, and a second blocked thread would help nobody);
//! * [`Worker::settle`] waits a bounded time for the abandoned call to return (a rollback does,
//!   so that it sees, and undoes, a lock that landed late) and, if it is still blocked then,
//!   stops waiting for it: later calls are no longer refused because of it, each with its own
//!   deadline.
//!
//! A worker is shared (cheaply cloned) by everything of one CRIU operation that calls the driver,
//! so "at most one abandoned call" holds across the probe, the enumeration and the backend.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Runs when a call is abandoned.
pub type AbandonHook = Arc<dyn Fn() + Send + Sync>;

/// Why a bounded call produced no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The call overran its deadline and was abandoned.
    #[error("timed out after {}", crate::message::Span(*after))]
    TimedOut { after: Duration },
    /// An earlier call is still blocked; this one was not started.
    #[error("an earlier driver call ({blocked}) timed out and is still blocked")]
    Busy { blocked: String },
    /// The call panicked.
    #[error("the driver call panicked")]
    Panicked,
    /// No thread could be started.
    #[error("cannot start a worker thread: {0}")]
    NoThread(String),
    /// The helper process that runs the call is gone (it crashed, or was killed).
    #[error("the plugin's helper process is gone ({0})")]
    Lost(String),
}

/// The abandoned call, while it is blocked.
type Slot = Arc<Mutex<Option<String>>>;

/// Where a call's result lands: `Some(Some(value))`, or `Some(None)` when it panicked. A mutex
/// and a condition variable, not a channel: `std::sync::mpsc` brought its three channel flavours
/// into the plugin for each result type.
type Landing = Arc<(Mutex<Option<Option<Box<dyn Any + Send>>>>, Condvar)>;

/// Clears the slot when the worker thread finishes, even by panic.
struct SlotGuard(Slot);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

struct Inner {
    /// The marker of the call in flight (or abandoned and still blocked). Replaced by a fresh
    /// one when [`Worker::settle`] gives up on a blocked call.
    slot: Mutex<Slot>,
    on_abandon: AbandonHook,
}

/// Runs driver calls with deadlines (see the module docs).
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("blocked", &self.blocked())
            .finish()
    }
}

impl Worker {
    /// A worker whose abandonments call `on_abandon`.
    #[must_use]
    pub fn new(on_abandon: AbandonHook) -> Self {
        Worker {
            inner: Arc::new(Inner {
                slot: Mutex::new(Arc::new(Mutex::new(None))),
                on_abandon,
            }),
        }
    }

    fn slot(&self) -> Slot {
        Arc::clone(
            &self
                .inner
                .slot
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// What the blocked abandoned call was, if one is.
    #[must_use]
    pub fn blocked(&self) -> Option<String> {
        self.slot()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Runs `f` (described by `what`, for messages) on a worker thread and waits for it at most
    /// `deadline` (`None`: until it returns).
    pub fn call<T: Send + 'static>(
        &self,
        what: &str,
        deadline: Option<Duration>,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, CallError> {
        let v = self.call_erased(what, deadline, Box::new(move || Box::new(f()) as Box<_>))?;
        // The value is the `T` that `f` returned: the downcast cannot fail.
        v.downcast::<T>()
            .map(|v| *v)
            .map_err(|_| CallError::Panicked)
    }

    /// [`Worker::call`] for every `T` at once: one copy of the thread and hand-over code, not
    /// one per result type (the plugin's size; see `scripts/check-dist.sh`).
    fn call_erased(
        &self,
        what: &str,
        deadline: Option<Duration>,
        f: Box<dyn FnOnce() -> Box<dyn Any + Send> + Send>,
    ) -> Result<Box<dyn Any + Send>, CallError> {
        let slot = self.slot();
        {
            let mut s = slot.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(blocked) = s.as_ref() {
                return Err(CallError::Busy {
                    blocked: blocked.clone(),
                });
            }
            *s = Some(what.to_owned());
        }
        let landing: Landing = Arc::default();
        let theirs = Arc::clone(&landing);
        let guard = SlotGuard(Arc::clone(&slot));
        let spawned = std::thread::Builder::new()
            .name("cuda_plugin-drv".into())
            .spawn(move || {
                // A panic has been reported by the panic hook; the caller gets `Panicked`.
                let r = catch_unwind(AssertUnwindSafe(f)).ok();
                drop(guard);
                let (done, cv) = &*theirs;
                *done.lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
                cv.notify_all();
            });
        if let Err(e) = spawned {
            // The closure and its guard were dropped: the slot is clear again.
            return Err(CallError::NoThread(e.to_string()));
        }
        let (done, cv) = &*landing;
        let got = done.lock().unwrap_or_else(PoisonError::into_inner);
        let mut got = match deadline {
            Some(d) => {
                cv.wait_timeout_while(got, d, |g| g.is_none())
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => cv
                .wait_while(got, |g| g.is_none())
                .unwrap_or_else(PoisonError::into_inner),
        };
        match (got.take(), deadline) {
            (Some(Some(v)), _) => Ok(v),
            (Some(None), _) => Err(CallError::Panicked),
            (None, Some(after)) => {
                drop(got);
                (self.inner.on_abandon)();
                Err(CallError::TimedOut { after })
            }
            // `wait_while` returns only once the result landed.
            (None, None) => Err(CallError::Panicked),
        }
    }

    /// Waits at most `limit` for an abandoned call to return; true when none is blocked (any
    /// more). When one still is after `limit`, stops waiting for it (later calls are no longer
    /// refused because of it) and returns false.
    pub fn settle(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut pause = Duration::from_micros(200);
        loop {
            if self.blocked().is_none() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(5));
        }
        // Its thread keeps (and will clear) the old slot; later calls use a fresh one.
        *self
            .inner
            .slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(Mutex::new(None));
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn worker() -> (Worker, Arc<AtomicUsize>) {
        let n = Arc::new(AtomicUsize::new(0));
        let m = Arc::clone(&n);
        (
            Worker::new(Arc::new(move || {
                m.fetch_add(1, Ordering::SeqCst);
            })),
            n,
        )
    }

    #[test]
    fn a_call_in_time_returns_its_value() {
        let (w, abandoned) = worker();
        assert_eq!(w.call("x", Some(Duration::from_secs(5)), || 7), Ok(7));
        assert_eq!(w.call("x", None, || 8), Ok(8));
        assert_eq!(abandoned.load(Ordering::SeqCst), 0);
        assert_eq!(w.blocked(), None);
    }

    #[test]
    fn an_overrun_is_abandoned_and_refuses_later_calls_until_it_returns() {
        let (w, abandoned) = worker();
        let e = w
            .call("lock pid 1", Some(Duration::from_millis(30)), || {
                std::thread::sleep(Duration::from_millis(300));
            })
            .unwrap_err();
        assert_eq!(
            e,
            CallError::TimedOut {
                after: Duration::from_millis(30)
            }
        );
        assert_eq!(abandoned.load(Ordering::SeqCst), 1, "the hook ran");
        assert_eq!(
            w.call("unlock pid 2", None, || ()),
            Err(CallError::Busy {
                blocked: "lock pid 1".into()
            })
        );
        assert!(w.clone().settle(Duration::from_secs(5)), "it returns");
        assert_eq!(w.call("unlock pid 2", None, || 3), Ok(3));
    }

    #[test]
    fn settle_gives_up_on_a_blocked_call_and_lets_later_calls_through() {
        let (w, _) = worker();
        w.call("hung", Some(Duration::from_millis(10)), || {
            std::thread::sleep(Duration::from_millis(400));
        })
        .unwrap_err();
        let t = Instant::now();
        assert!(!w.settle(Duration::from_millis(20)));
        assert!(t.elapsed() < Duration::from_millis(300), "bounded");
        assert_eq!(w.blocked(), None);
        assert_eq!(w.call("next", Some(Duration::from_secs(5)), || 1), Ok(1));
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(
            w.call("after the old one returned", None, || 2),
            Ok(2),
            "the old thread's return changes nothing"
        );
    }

    #[test]
    fn a_panicking_call_is_reported_and_frees_the_slot() {
        let (w, _) = worker();
        let e = w.call("boom", None, || -> i32 { panic!("deliberate") });
        assert_eq!(e, Err(CallError::Panicked));
        assert_eq!(w.call("next", None, || 1), Ok(1));
    }
}
