//! Small `/proc` readers shared by the scenario runner and the fault sweep (with the emulated
//! CRIU's own, re-exported here).

pub(crate) use criu_emu::procfs::{parked, state};

fn memmem(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

pub(crate) fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

pub(crate) fn thread_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count)
}

pub(crate) fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_owned())
        .unwrap_or_default()
}

/// Processes other than this one whose environment names the mock world `world`
/// (`MOCK_CUDA_WORLD=<world>`): the workload, and anything a plugin or a test left behind.
pub(crate) fn world_processes(world: &std::path::Path) -> Vec<i32> {
    let tag = format!("MOCK_CUDA_WORLD={}\0", world.display());
    let me = i32::try_from(std::process::id()).unwrap_or(-1);
    all_pids()
        .into_iter()
        .filter(|&pid| {
            pid != me
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|e| memmem(&e, tag.as_bytes()))
        })
        .collect()
}
