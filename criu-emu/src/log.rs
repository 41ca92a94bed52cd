//! CRIU-style logging shared by the engine and the plugins' `print_on_level`.
//!
//! Lines look like CRIU's: `(SS.uuuuuu) text`, with `Error (file:line): ` and `Warn  (file:line): `
//! prefixes on the engine's own errors and warnings. Plugin text is written verbatim after the
//! timestamp (plugins add their own prefixes and newlines). Levels follow `criu/include/log.h`:
//! MSG (0, also to stdout, never filtered), ERROR, WARN (the default), INFO, DEBUG.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

pub use abi::criu::log_level::{DEBUG, ERROR, INFO, MSG, WARN};

static LEVEL: AtomicU32 = AtomicU32::new(WARN);
/// The log's file descriptor, for the async-signal-safe writes of the alarm handler.
static LOG_FD: AtomicI32 = AtomicI32::new(2);
static SINK: Mutex<Option<File>> = Mutex::new(None);
static START: OnceLock<Instant> = OnceLock::new();

/// Sets the verbosity and, when `path` is given, sends the log to that file (created or
/// truncated) instead of stderr.
///
/// # Errors
/// When the log file cannot be created.
pub fn init(level: u32, path: Option<&Path>) -> std::io::Result<()> {
    START.get_or_init(Instant::now);
    LEVEL.store(level, Ordering::Relaxed);
    if let Some(p) = path {
        let f = File::create(p)?;
        LOG_FD.store(f.as_raw_fd(), Ordering::Relaxed);
        *SINK
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(f);
    }
    Ok(())
}

/// The current verbosity.
#[must_use]
pub fn level() -> u32 {
    LEVEL.load(Ordering::Relaxed)
}

/// The descriptor the log is written to (stderr unless a log file was set).
#[must_use]
pub fn raw_fd() -> RawFd {
    LOG_FD.load(Ordering::Relaxed)
}

/// Whether a message of `level` would be written.
#[must_use]
pub fn enabled(level: u32) -> bool {
    level == MSG || level <= self::level()
}

fn timestamp() -> String {
    let e = START.get_or_init(Instant::now).elapsed();
    format!("({:02}.{:06}) ", e.as_secs(), e.subsec_micros())
}

/// Writes already formatted `text` (which carries its own newline) at `level`.
pub fn write_raw(level: u32, text: &str) {
    if !enabled(level) {
        return;
    }
    let line = format!("{}{}", timestamp(), text);
    let mut sink = SINK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match sink.as_mut() {
        Some(f) => {
            let _ = f.write_all(line.as_bytes());
        }
        None => {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
    drop(sink);
    if level == MSG {
        let _ = std::io::stdout().write_all(text.as_bytes());
        let _ = std::io::stdout().flush();
    }
}

/// Writes one engine line at `level`, adding CRIU's error/warning prefix and a newline.
pub fn line(level: u32, location: &str, msg: std::fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let text = match level {
        ERROR => format!("Error ({location}): {msg}\n"),
        WARN => format!("Warn  ({location}): {msg}\n"),
        _ => format!("{msg}\n"),
    };
    write_raw(level, &text);
}

/// `pr_err`: an engine error line with its source location.
#[macro_export]
macro_rules! pr_err {
    ($($arg:tt)*) => {
        $crate::log::line($crate::log::ERROR, concat!(file!(), ":", line!()), format_args!($($arg)*))
    };
}

/// `pr_warn`: an engine warning line with its source location.
#[macro_export]
macro_rules! pr_warn {
    ($($arg:tt)*) => {
        $crate::log::line($crate::log::WARN, concat!(file!(), ":", line!()), format_args!($($arg)*))
    };
}

/// `pr_info`.
#[macro_export]
macro_rules! pr_info {
    ($($arg:tt)*) => {
        $crate::log::line($crate::log::INFO, "", format_args!($($arg)*))
    };
}

/// `pr_debug`.
#[macro_export]
macro_rules! pr_debug {
    ($($arg:tt)*) => {
        $crate::log::line($crate::log::DEBUG, "", format_args!($($arg)*))
    };
}

/// `pr_msg`: always written, and echoed to stdout.
#[macro_export]
macro_rules! pr_msg {
    ($($arg:tt)*) => {
        $crate::log::line($crate::log::MSG, "", format_args!($($arg)*))
    };
}
