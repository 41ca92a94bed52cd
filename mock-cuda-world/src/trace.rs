//! The call trace (`trace.log`): one line per driver call, appended with a single `write(2)` on
//! an `O_APPEND` descriptor so lines from concurrent processes never interleave.
//!
//! Line format (stable, diff-friendly): `<caller-pid> <function>(<args>) = <RESULT>`, e.g.
//! `4242 cuCheckpointProcessLock(pid=4250, timeoutMs=5000) = CUDA_SUCCESS`.

use super::World;
use std::io::Write;

impl World {
    /// Appends one call to the trace. Tracing never fails the call it records.
    pub fn trace(&self, function: &str, args: &str, result: &str) {
        let line = format!("{} {function}({args}) = {result}\n", std::process::id());
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.trace_path())
        {
            let _ = f.write_all(line.as_bytes());
        }
    }

    /// The trace so far.
    pub fn read_trace(&self) -> String {
        std::fs::read_to_string(self.trace_path()).unwrap_or_default()
    }
}
