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

/// Runs `cmd` to the end with its output collected (as [`std::process::Command::output`] does, with the
/// standard streams as `cmd` sets them), killing it once it runs over `limit`. `what` names the
/// program in the errors: "starting `what`: …", "`what` ran over `limit`; killed".
pub fn output_within(
    cmd: &mut std::process::Command,
    limit: Duration,
    what: &str,
) -> Result<std::process::Output, String> {
    let mut child = cmd.spawn().map_err(|e| format!("starting {what}: {e}"))?;
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{what} ran over {limit:?}; killed"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("waiting for {what}: {e}")),
        }
    }
    child
        .wait_with_output()
        .map_err(|e| format!("collecting {what}'s output: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn output_within_collects_or_kills() {
        let out = output_within(
            Command::new("sh")
                .args(["-c", "echo hi"])
                .stdout(Stdio::piped()),
            Duration::from_secs(20),
            "sh",
        )
        .unwrap();
        assert_eq!(out.stdout, b"hi\n");
        let err = output_within(
            Command::new("sleep").arg("100"),
            Duration::from_millis(50),
            "sleep",
        )
        .unwrap_err();
        assert!(err.contains("ran over"), "{err}");
    }

    #[test]
    fn wait_until_times_out() {
        assert!(wait_until(Duration::from_secs(1), || true));
        assert!(!wait_until(Duration::from_millis(20), || false));
    }
}
