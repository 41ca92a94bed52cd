//! What the helper's server and its guardian share: the calls in flight, the driver library the
//! helper loaded, and how long the helper waits for calls CRIU gave up on.

use crate::backend::driver::{CudaDriver, LoadError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Calls in flight: id → the moment CRIU stops waiting for it, and how long that wait is
/// (`None`: CRIU waits without a deadline).
pub type InFlight = Arc<Mutex<BTreeMap<u64, Option<(Instant, Duration)>>>>;

/// The driver library, loaded once by the first call that needs it.
pub type Driver = Arc<OnceLock<Result<Arc<dyn CudaDriver>, LoadError>>>;

/// The longest the helper, told to finish, still waits for calls in flight (to undo one that
/// CRIU gave up on and that lands late) before it exits; each call is waited for at most as long
/// again as CRIU waited for it.
pub(crate) const LATE_LIMIT: Duration = Duration::from_secs(60);

/// The least the helper waits for a call in flight after CRIU gave up on it: with a short
/// deadline (`timeout=1`), "as long again" is too short for a call that was merely slow (the
/// chaos soak found a checkpoint landing 1.2 s after its 1 s deadline, which left its task
/// LOCKED).
pub(crate) const LATE_FLOOR: Duration = Duration::from_secs(5);

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits for the calls in flight to end (a late one is put back by its own thread before it
/// leaves the set): each as long again as CRIU waited for it, at least [`LATE_FLOOR`] (a lock
/// cut at 1 s gets another 5), one without a deadline the whole bound; never past
/// [`LATE_LIMIT`]. Whether they all ended. The helper told to finish and the guardian after
/// CRIU has gone wait alike.
pub(crate) fn wait_late_calls(inflight: &InFlight) -> bool {
    let now = Instant::now();
    let end = lock(inflight)
        .values()
        .map(|u| u.map_or(now + LATE_LIMIT, |(until, d)| until + d.max(LATE_FLOOR)))
        .max()
        .unwrap_or(now)
        .min(now + LATE_LIMIT);
    loop {
        if lock(inflight).is_empty() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The library, loaded on first use.
pub fn loaded(driver: &Driver) -> Result<Arc<dyn CudaDriver>, LoadError> {
    driver.get_or_init(crate::ffi::cuda::load).clone()
}
