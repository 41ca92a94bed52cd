//! The state behind the exported host services, shared by the engine and the `harness_rs_*`
//! callbacks the plugins reach through the C shim.
//!
//! A plugin may call a host service from inside any hook, so the engine never holds one of these
//! locks while it calls into a plugin; each service takes its lock briefly.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::images::{OpenOutcome, Streamer};
use crate::inventory::PluginList;
use crate::options::PluginOption;
use crate::profile::Rules;
use crate::{pr_debug, pr_err, trace_event};

static RULES: AtomicU8 = AtomicU8::new(0);
static INVENTORY: Mutex<PluginList> = Mutex::new(PluginList::new());
static OPTIONS: Mutex<Vec<PluginOption>> = Mutex::new(Vec::new());
static IMAGE_DIR: Mutex<Option<OwnedFd>> = Mutex::new(None);
static IMAGE_DIR_FD: AtomicI32 = AtomicI32::new(-1);
static STREAMER: Mutex<Option<Streamer>> = Mutex::new(None);
static INTERRUPT_ONLY: AtomicBool = AtomicBool::new(false);
static ALARM_ATTEMPTS: AtomicU32 = AtomicU32::new(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sets the rule set the services apply (inventory matching).
pub fn set_rules(rules: Rules) {
    RULES.store(u8::from(rules == Rules::Newer), Ordering::Relaxed);
}

/// The rule set in force.
#[must_use]
pub fn rules() -> Rules {
    if RULES.load(Ordering::Relaxed) == 1 {
        Rules::Newer
    } else {
        Rules::Criu41
    }
}

/// Replaces the required-plugin list (restore: loaded from the image).
pub fn set_inventory(list: PluginList) {
    *lock(&INVENTORY) = list;
}

/// A copy of the required-plugin list.
#[must_use]
pub fn inventory() -> PluginList {
    lock(&INVENTORY).clone()
}

/// `add_inventory_plugin`.
pub fn add_inventory_plugin(name: &str) -> i32 {
    lock(&INVENTORY).add(name);
    pr_debug!("inventory: add plugin `{name}'");
    trace_event!("inventory add {name} -> 0");
    0
}

/// `check_and_remove_inventory_plugin(name, n)`.
pub fn check_and_remove_inventory_plugin(name: &[u8], n: usize) -> bool {
    let rules = rules();
    let found = lock(&INVENTORY).check_and_remove(rules, name, n);
    let shown = String::from_utf8_lossy(name);
    match rules {
        Rules::Criu41 => {
            trace_event!("inventory check_and_remove {shown} n={n} -> {found}");
        }
        Rules::Newer => trace_event!("inventory check_and_remove {shown} -> {found}"),
    }
    found
}

/// `has_inventory_plugin(name)`.
pub fn has_inventory_plugin(name: &[u8]) -> bool {
    let found = lock(&INVENTORY).has(name);
    trace_event!("inventory has {} -> {found}", String::from_utf8_lossy(name));
    found
}

/// `check_inventory_plugins`: 0, or -1 after logging every unclaimed entry.
pub fn check_inventory_plugins() -> i32 {
    let inv = lock(&INVENTORY);
    let left = inv.unclaimed();
    for name in left {
        pr_err!("Missing required plugin: {name}");
    }
    i32::from(!left.is_empty()).wrapping_neg()
}

/// Sets the `--plugin-option` list handed out by `criu_plugin_get_options`.
pub fn set_options(options: Vec<PluginOption>) {
    *lock(&OPTIONS) = options;
}

/// The option vector, `argv[0]` included.
#[must_use]
pub fn options_argv() -> Vec<String> {
    crate::options::argv(&lock(&OPTIONS))
}

/// Opens (or, with `None`, closes) the image directory `criu_get_image_dir` returns.
pub fn set_image_dir(fd: Option<OwnedFd>) {
    let mut g = lock(&IMAGE_DIR);
    IMAGE_DIR_FD.store(fd.as_ref().map_or(-1, AsRawFd::as_raw_fd), Ordering::SeqCst);
    *g = fd;
}

/// `criu_get_image_dir`: the directory's descriptor, or -1 once it is closed.
#[must_use]
pub fn image_dir_fd() -> i32 {
    IMAGE_DIR_FD.load(Ordering::SeqCst)
}

/// Installs (or removes) the image streamer.
pub fn set_streamer(s: Option<Streamer>) {
    *lock(&STREAMER) = s;
}

/// Takes the image streamer out, to finish it.
#[must_use]
pub fn take_streamer() -> Option<Streamer> {
    lock(&STREAMER).take()
}

/// `img_streamer_open(name, flags)`.
pub fn img_streamer_open(name: &str, flags: i32) -> OpenOutcome {
    let mut g = lock(&STREAMER);
    let out = match g.as_mut() {
        Some(s) => s.open(name, flags),
        None => {
            pr_err!("img_streamer_open({name}): the image streamer is not in use (no --stream)");
            OpenOutcome::Errno(-libc::ENOTCONN)
        }
    };
    drop(g);
    let shown = match &out {
        OpenOutcome::Fd(_) => "fd".to_owned(),
        OpenOutcome::Errno(e) => e.to_string(),
        OpenOutcome::Bug => "BUG".to_owned(),
    };
    trace_event!("streamer open {name} flags={flags:#x} -> {shown}");
    out
}

/// `set_compel_interrupt_only_mode`.
pub fn set_interrupt_only_mode() {
    INTERRUPT_ONLY.store(true, Ordering::Relaxed);
    pr_debug!("compel: interrupt-only mode requested by a plugin");
}

/// Whether a plugin asked for interrupt-only mode (the harness always freezes with
/// `PTRACE_INTERRUPT`, so this is informational).
#[must_use]
pub fn interrupt_only_mode() -> bool {
    INTERRUPT_ONLY.load(Ordering::Relaxed)
}

/// Counts one SIGALRM of the freeze timeout; returns the attempts before this one. Async-signal
/// safe.
pub fn alarm_fired() -> u32 {
    ALARM_ATTEMPTS.fetch_add(1, Ordering::SeqCst)
}

/// `alarm_timeouted`.
#[must_use]
pub fn alarm_timeouted() -> bool {
    ALARM_ATTEMPTS.load(Ordering::SeqCst) > 0
}
