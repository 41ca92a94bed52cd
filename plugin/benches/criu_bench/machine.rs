//! The machine a run was on (CPU, cores, kernel, load) for the report's header.

use std::path::Path;
use std::process::Command;
use testkit::criu::*;

#[derive(Debug)]
pub(crate) struct Machine {
    pub(crate) date: String,
    pub(crate) cpu: String,
    pub(crate) cores: usize,
    pub(crate) kernel: String,
    pub(crate) load_start: String,
    pub(crate) load_end: String,
}

pub(crate) fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

pub(crate) fn loadavg() -> String {
    read(Path::new("/proc/loadavg"))
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn machine() -> Machine {
    let cpuinfo = read(Path::new("/proc/cpuinfo"));
    Machine {
        date: sh("date", &["-u", "+%Y-%m-%dT%H:%MZ"]),
        cpu: cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
            .unwrap_or_else(|| "unknown CPU".into()),
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        kernel: read(Path::new("/proc/sys/kernel/osrelease"))
            .trim()
            .to_owned(),
        load_start: loadavg(),
        load_end: String::new(),
    }
}
