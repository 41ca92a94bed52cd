//! The normalised call trace: one line per plugin call and per engine milestone, with task pids
//! replaced by their index in the process tree (`#0` is the root), so a trace can be compared
//! across runs. Written (and flushed) line by line to the `--trace` file, so it survives a plugin
//! that aborts the engine.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

static TRACE: Mutex<Option<File>> = Mutex::new(None);

/// Appends the trace to `path` (created if missing), so that the dump and the restore of one
/// scenario can share a file.
///
/// # Errors
/// When the file cannot be opened.
pub fn init(path: &Path) -> std::io::Result<()> {
    let f = OpenOptions::new().create(true).append(true).open(path)?;
    *TRACE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(f);
    Ok(())
}

/// Records one event line (no newline).
pub fn record(line: std::fmt::Arguments<'_>) {
    let mut t = TRACE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(f) = t.as_mut() {
        let _ = writeln!(f, "{line}");
        let _ = f.flush();
    }
}

/// Records a formatted trace event.
#[macro_export]
macro_rules! trace_event {
    ($($arg:tt)*) => {
        $crate::trace::record(format_args!($($arg)*))
    };
}
