//! The plugin's log: every line goes through CRIU's `print_on_level` (found with `dlsym` at each
//! call, never linked), to CRIU through the helper process's channel when it is the helper that
//! logs ([`forward_to`]), or to stderr outside CRIU. The bottom of the plugin's modules: it uses
//! none of them but [`crate::message`], and any of them may log.

use crate::PLUGIN_NAME;
use std::ffi::{c_char, c_uint, c_void, CString};
use std::ptr::NonNull;
use std::sync::OnceLock;

/// Where the helper process's lines go instead of `print_on_level` (set once, in the helper).
static FORWARD: OnceLock<fn(u32, &str)> = OnceLock::new();

/// From now on, [`log`] hands every line to `forward` (the helper process sends it to CRIU
/// through its channel: [`crate::helper::server::forward_log`]). The first call wins.
pub fn forward_to(forward: fn(u32, &str)) {
    let _ = FORWARD.set(forward);
}

/// CRIU's `void print_on_level(unsigned level, const char *fmt, ...)`.
type PrintOnLevelFn = unsafe extern "C" fn(c_uint, *const c_char, ...);

/// The text of one log line: the `cuda_plugin: ` prefix, `Error: ` or `Warn: ` for those levels
/// (as CRIU's own `pr_err`/`pr_warn` lines say, so that `grep Error` finds the plugin's
/// failures too), capped well under CRIU's 8 KiB message buffer ([`crate::message`]).
#[must_use]
pub fn line(level: u32, msg: &str) -> String {
    use abi::criu::log_level;
    let tag = match level {
        log_level::ERROR => "Error: ",
        log_level::WARN => "Warn: ",
        _ => "",
    };
    let line = format!("{PLUGIN_NAME}: {tag}{msg}");
    let mut line = crate::message::cap(&line).into_owned();
    line.push('\n');
    line
}

/// Logs `msg` as [`line()`] makes it through `print_on_level(level, "%s", …)`, or to stderr when
/// CRIU's logger is absent (unit tests, other hosts).
pub fn log(level: u32, msg: &str) {
    // In the plugin's helper process, CRIU's logger is not ours to call: the line goes to CRIU.
    if let Some(forward) = FORWARD.get() {
        forward(level, msg);
        return;
    }
    let line = line(level, msg);
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads loader tables.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"print_on_level".as_ptr()) };
    match NonNull::new(sym) {
        Some(p) => {
            // SAFETY: CRIU's exported `print_on_level` has the C signature of `PrintOnLevelFn`;
            // data and function pointers have the same size and representation on the supported
            // (LP64 Linux) targets.
            let print = unsafe { std::mem::transmute::<*mut c_void, PrintOnLevelFn>(p.as_ptr()) };
            let c = CString::new(line.replace('\0', "\\0")).unwrap_or_default();
            // SAFETY: print_on_level is CRIU's variadic logger; the format is the constant "%s"
            // and its one argument is a valid NUL-terminated string, so user text is never
            // interpreted as a format.
            unsafe { print(level, c"%s".as_ptr(), c.as_ptr()) };
        }
        None => eprint!("{line}"),
    }
}

/// A log level (CRIU's `print_on_level` levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// CRIU records the first ERROR line as the operation's error; keep it for real failures.
    Error,
    Warn,
    Info,
    Debug,
}

impl Level {
    /// The numeric level `print_on_level` takes.
    #[must_use]
    pub const fn criu(self) -> u32 {
        use abi::criu::log_level;
        match self {
            Level::Error => log_level::ERROR,
            Level::Warn => log_level::WARN,
            Level::Info => log_level::INFO,
            Level::Debug => log_level::DEBUG,
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        })
    }
}
