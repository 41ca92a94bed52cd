//! Signals and `/proc/<pid>`.

use std::ffi::c_int;
use std::path::Path;

extern "C" {
    fn kill(pid: c_int, sig: c_int) -> c_int;
}

/// Linux signal numbers (the same on x86-64 and aarch64).
pub const SIGABRT: c_int = 6;
/// `SIGKILL`.
pub const SIGKILL: c_int = 9;
/// `SIGUSR1`: asks a mock workload to verify its GPU data.
pub const SIGUSR1: c_int = 10;
/// `SIGSEGV`.
pub const SIGSEGV: c_int = 11;
/// `SIGCONT`.
pub const SIGCONT: c_int = 18;
/// `SIGSTOP`.
pub const SIGSTOP: c_int = 19;

/// Sends `sig` to `pid` (a negative `pid` names a process group); true when delivered.
pub fn signal(pid: i32, sig: c_int) -> bool {
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    unsafe { kill(pid, sig) == 0 }
}

/// True when `/proc/<pid>` exists (a zombie counts: its pid is still taken).
pub fn exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The thread ids of `pid` (empty when it is gone).
pub fn threads(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The fields of one task's `/proc/<pid>/task/<tid>/status` the tests look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStatus {
    /// The `State:` letter (`R`, `S`, `T`, `t`, `Z`…).
    pub state: char,
    /// `TracerPid:` (0 when not traced).
    pub tracer: i32,
}

/// Parses the `State:` and `TracerPid:` fields of a `/proc/…/status` text.
pub fn parse_status(text: &str) -> Option<TaskStatus> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
    };
    Some(TaskStatus {
        state: field("State:")?.chars().next()?,
        tracer: field("TracerPid:")?.parse().ok()?,
    })
}

/// Thread `tid` of `pid`'s status; `None` when it is gone.
pub fn thread_status(pid: i32, tid: i32) -> Option<TaskStatus> {
    parse_status(&std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?)
}

/// The state letter of `pid` from `/proc/<pid>/stat` (after the parenthesised command name,
/// which may itself contain spaces and parentheses).
pub fn stat_state(pid: i32) -> Option<char> {
    parse_stat_state(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The state letter of thread `tid` of `pid` from `/proc/<pid>/task/<tid>/stat`.
pub fn task_stat_state(pid: i32, tid: i32) -> Option<char> {
    parse_stat_state(&std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?)
}

fn parse_stat_state(stat: &str) -> Option<char> {
    stat.get(stat.rfind(')')? + 2..)?.chars().next()
}

/// The value (trimmed) of the field `name` (e.g. `"Seccomp"`, `"Uid"`) of `/proc/<pid>/status`.
pub fn status_field(pid: i32, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(name)?
            .strip_prefix(':')
            .map(|v| v.trim().to_owned())
    })
}

/// True when `pid`'s environment contains `needle` (e.g. `MOCK_CUDA_WORLD=<dir>`).
pub fn environ_has(pid: i32, needle: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|env| env.split(|&b| b == 0).any(|kv| kv == needle.as_bytes()))
        .unwrap_or(false)
}

/// Every live process other than this one whose environment contains `needle`.
pub fn processes_with_env(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| p != me && environ_has(p, needle))
        .collect()
}

/// The `(tid, comm)` of every thread of `pid`.
pub fn thread_names(pid: i32) -> Vec<(i32, String)> {
    threads(pid)
        .into_iter()
        .map(|tid| {
            let comm = crate::read(Path::new(&format!("/proc/{pid}/task/{tid}/comm")));
            (tid, comm.trim().to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_state_and_tracer() {
        let s = "Name:\tx\nState:\tT (stopped)\nTgid:\t1\nTracerPid:\t42\n";
        assert_eq!(
            parse_status(s),
            Some(TaskStatus {
                state: 'T',
                tracer: 42
            })
        );
        assert_eq!(parse_status("Name:\tx\n"), None);
    }

    #[test]
    fn this_process_is_alive_and_untraced() {
        let me = std::process::id() as i32;
        assert!(exists(me));
        assert!(threads(me).contains(&me));
        // The main thread waits for the test threads: running or asleep.
        assert!(matches!(stat_state(me), Some('R' | 'S')));
        assert!(thread_status(me, me).is_some_and(|s| s.tracer == 0));
        assert!(matches!(task_stat_state(me, me), Some('R' | 'S')));
        assert_eq!(status_field(me, "Tgid"), Some(me.to_string()));
        assert_eq!(parse_stat_state("7 (a) b) S 1"), Some('S'));
    }
}
