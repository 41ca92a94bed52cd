//! Phase timings from the plugin's lines in CRIU's logs.
//!
//! The plugin logs `cuda_plugin: <HOOK> pid <N>: done in <X> ms` for every per-task hook it
//! handled (at CRIU's debug level, so `-v4`). The phases are:
//!
//! | Phase | Hook |
//! |---|---|
//! | lock | `PAUSE_DEVICES` |
//! | checkpoint | `CHECKPOINT_DEVICES` |
//! | restore | `RESUME_DEVICES_LATE` (restore *and* unlock, unless `RESTORE` is logged) |
//! | unlock | `UNLOCK`, when the plugin logs it separately |
//!
//! A tree with several CUDA tasks has one line per task and hook; they run one after the other,
//! so a phase's time is their sum.

/// One `<HOOK> pid <N>: done in <X> ms` line.
#[derive(Debug, Clone, PartialEq)]
pub struct HookTiming {
    /// The hook (or step) name, e.g. `CHECKPOINT_DEVICES`.
    pub hook: String,
    /// The task.
    pub pid: i32,
    /// Milliseconds.
    pub ms: f64,
}

/// Parses one log line; `None` when it is not a timing line.
#[must_use]
pub fn parse_line(line: &str) -> Option<HookTiming> {
    let rest = &line[line.find("cuda_plugin: ")? + "cuda_plugin: ".len()..];
    let (hook, rest) = rest.split_once(" pid ")?;
    if hook.is_empty() || !hook.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
        return None;
    }
    let (pid, rest) = rest.split_once(": done in ")?;
    let ms = rest.trim().strip_suffix("ms")?.trim().parse::<f64>().ok()?;
    Some(HookTiming {
        hook: hook.to_owned(),
        pid: pid.trim().parse().ok()?,
        ms,
    })
}

/// Every timing line of a log.
#[must_use]
pub fn parse(log: &str) -> Vec<HookTiming> {
    log.lines().filter_map(parse_line).collect()
}

/// The plugin's phase times of one dump/restore cycle, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Phases {
    /// PAUSE_DEVICES.
    pub lock: Option<f64>,
    /// CHECKPOINT_DEVICES.
    pub checkpoint: Option<f64>,
    /// RESTORE if logged, else RESUME_DEVICES_LATE (which then includes the unlock).
    pub restore: Option<f64>,
    /// UNLOCK, when logged separately.
    pub unlock: Option<f64>,
}

fn sum(t: &[HookTiming], names: &[&str]) -> Option<f64> {
    let v: Vec<f64> = t
        .iter()
        .filter(|h| names.contains(&h.hook.as_str()))
        .map(|h| h.ms)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum())
}

impl Phases {
    /// The phases of a dump log and a restore log.
    #[must_use]
    pub fn from_logs(dump_log: &str, restore_log: &str) -> Self {
        let d = parse(dump_log);
        let r = parse(restore_log);
        Phases {
            lock: sum(&d, &["PAUSE_DEVICES", "LOCK"]),
            checkpoint: sum(&d, &["CHECKPOINT_DEVICES", "CHECKPOINT"]),
            restore: sum(&r, &["RESTORE"]).or_else(|| sum(&r, &["RESUME_DEVICES_LATE"])),
            unlock: sum(&r, &["UNLOCK"]),
        }
    }
}
