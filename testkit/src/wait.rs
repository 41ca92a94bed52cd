//! Polling a condition until a deadline.

use std::time::{Duration, Instant};

/// Polls `cond` every 5 ms for at most `limit`; true as soon as it holds, false on timeout.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// [`wait_until`], panicking with "timed out waiting for `what`" on timeout.
pub fn wait_for(limit: Duration, cond: impl FnMut() -> bool, what: &str) {
    assert!(wait_until(limit, cond), "timed out waiting for {what}");
}
