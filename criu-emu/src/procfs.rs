//! Small `/proc` readers of the emulated CRIU (its freezer and its lifecycles); the harness's
//! runner uses them too.

/// The state letter of `pid` (`/proc/PID/stat`), `?` when it cannot be read.
pub fn state(pid: i32) -> char {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s[s.rfind(')')? + 2..].chars().next())
        .unwrap_or('?')
}

/// Whether every thread of `pid` is stopped and traced by nobody (parked by the freezer's
/// release).
pub fn parked(pid: i32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .all(|t| {
            let st = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            st.contains("State:\tT (stopped)") && st.contains("TracerPid:\t0")
        })
}
