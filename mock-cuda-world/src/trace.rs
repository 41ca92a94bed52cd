//! The call trace (`trace.log`): one line per driver call, appended with a single `write(2)` on
//! an `O_APPEND` descriptor so lines from concurrent processes never interleave.
//!
//! Line format (stable, diff-friendly): `<caller> <function>(<args>) = <RESULT>`, e.g.
//! `4242 cuCheckpointProcessLock(pid=4250, timeoutMs=5000) = CUDA_SUCCESS`. The caller is its
//! pid when it lives in the world's host pid namespace (its host pid), else its namespace pid
//! and namespace, `1@pid:[4026532175]` (a process in a container cannot learn its host pid).

use super::World;
use std::io::Write;

impl World {
    /// Appends one call to the trace. Tracing never fails the call it records.
    pub fn trace(&self, function: &str, args: &str, result: &str) {
        let line = format!("{} {function}({args}) = {result}\n", self.caller());
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.trace_path())
        {
            let _ = f.write_all(line.as_bytes());
        }
    }

    /// How the trace names the calling process (module documentation).
    #[must_use]
    pub fn caller(&self) -> String {
        let host = self.host_pid_ns();
        match crate::pidns::own_identity() {
            Some(me) if host != 0 && me.ns != host => me.to_string(),
            _ => std::process::id().to_string(),
        }
    }

    /// The trace so far.
    pub fn read_trace(&self) -> String {
        std::fs::read_to_string(self.trace_path()).unwrap_or_default()
    }
}
