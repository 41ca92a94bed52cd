//! What the scenario runner and the fault sweep both do with a tree of mock workloads: run the
//! mock world's tools, start the tree and wait for its tasks, ask them to check their data, and
//! kill and reap them.
//!
//! A tree lives in a directory: `task<i>.sh` starts task `i` (and its children), task `i`
//! writes `report<i>` (a `READY pid=… gpus=…` line once started, then `PASS`/`FAIL` lines on
//! SIGUSR1), and the tree's output goes to `workload.out`.

use crate::procfs::{field, state};
use crate::scenario::Namespace;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `c` to completion; its stdout, or an error naming `what` with its status and output.
pub(crate) fn run_checked(c: &mut Command, what: &str) -> Result<String, String> {
    let out = c
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The environment of a tree (and of the engine) in mock world `world`, with `bin` (where
/// `cuda-checkpoint` may be linked) first in `PATH`.
pub(crate) fn mock_env(world: &Path, bin: &Path) -> Vec<(String, String)> {
    vec![
        ("MOCK_CUDA_WORLD".to_owned(), world.display().to_string()),
        (
            "LD_LIBRARY_PATH".to_owned(),
            world.join("lib").display().to_string(),
        ),
        (
            "PATH".to_owned(),
            format!(
                "{}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
                bin.display()
            ),
        ),
    ]
}

/// Starts `dir/task0.sh` as a session leader with `env`, its output in `dir/workload.out`, in
/// new namespaces of the kinds `namespaces` lists (`unshare`; see the "Namespaces" section of
/// [`crate::scenario`]):
/// * a new pid namespace (`-p -f`): `unshare` forks, and its child, the namespace's init, becomes
///   the root (with a new mount namespace too, with a `/proc` of its own: `--mount-proc`);
/// * a new mount namespace (`-m`, private): the tree gets an empty `/dev/shm` of its own. That
///   mount is made only after the shell checked that it runs in another mount namespace than
///   this process (it never touches the host's `/dev/shm`).
///
/// In namespaces the tree opens its output file itself (for appending), and `unshare`'s own
/// output goes to `dir/unshare.out`.
///
/// The tree's working directory is `dir`.
///
/// The returned child is `setsid` or `unshare`; [`tree_root`] finds the root's host pid.
pub(crate) fn spawn_root(
    dir: &Path,
    env: &[(String, String)],
    namespaces: &[Namespace],
) -> Result<Child, String> {
    let out = std::fs::File::create(dir.join("workload.out")).map_err(|e| e.to_string())?;
    // In namespaces, `unshare` writes its own complaints elsewhere: the tree's output file
    // must not change behind CRIU's back between a dump and a restore.
    let out = if namespaces.is_empty() {
        out
    } else {
        std::fs::File::create(dir.join("unshare.out")).map_err(|e| e.to_string())?
    };
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let task0 = dir.join("task0.sh");
    let mut c;
    if namespaces.is_empty() {
        c = Command::new("setsid");
        c.arg("sh").arg(&task0);
    } else {
        let pid = namespaces.contains(&Namespace::Pid);
        let mount = namespaces.contains(&Namespace::Mount);
        c = Command::new("unshare");
        if pid {
            c.args(["-p", "-f"]);
        }
        if mount {
            c.args(["-m", "--propagation", "private"]);
            if pid {
                c.arg("--mount-proc");
            }
        }
        let q = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', "'\\''"));
        let mut script = String::new();
        if mount {
            let host_mnt = std::fs::read_link("/proc/self/ns/mnt")
                .map_err(|e| format!("/proc/self/ns/mnt: {e}"))?;
            script.push_str(&format!(
                "[ \"$(readlink /proc/self/ns/mnt)\" != '{}' ] || {{ echo 'not in a new mount namespace' >&2; exit 97; }}\n\
                 while umount /dev/shm 2>/dev/null; do :; done\n\
                 mount -t tmpfs -o size=64m,mode=1777 shm /dev/shm || exit 98\n",
                host_mnt.display(),
            ));
        }
        // Opened by the tree itself (in its mount namespace), for appending: CRIU checks the
        // size of a file open for writing at restore, except one open for appending only.
        script.push_str(&format!(
            "exec </dev/null >>{} 2>&1\n",
            q(&dir.join("workload.out"))
        ));
        script.push_str(&format!("exec setsid sh {}\n", q(&task0)));
        c.arg("sh").arg("-c").arg(script);
        crate::ffi::spawn::close_other_fds(&mut c);
    }
    // Each tree works in its own scenario directory. CRIU's parasite, dumping a task whose
    // `/proc` belongs to another pid namespace, mounts a `/proc` of its own at
    // `proc.crtools` in the task's working directory: two such dumps with one working
    // directory (scenarios run side by side) collide there (EEXIST).
    c.current_dir(dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("spawn workload: {e}"))
}

/// The host pid of the root of a tree [`spawn_root`] started as `child`: the child itself, or
/// with a new pid namespace its child (the namespace's init), once it exists.
pub(crate) fn tree_root(
    child: &Child,
    namespaces: &[Namespace],
    deadline: Instant,
) -> Result<i32, String> {
    let pid = child.id() as i32;
    if !namespaces.contains(&Namespace::Pid) {
        return Ok(pid);
    }
    loop {
        let kids =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(k) = kids.split_whitespace().next().and_then(|k| k.parse().ok()) {
            return Ok(k);
        }
        if Instant::now() > deadline {
            return Err(format!("unshare {pid} started no namespace init"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The host pid of the process with pid `nspid` in pid namespace `ns`.
pub(crate) fn host_pid_in(ns: u64, nspid: i32) -> Option<i32> {
    use mock_cuda_world::pidns::{find_identity, NsIdentity};
    find_identity(NsIdentity { ns, pid: nspid })
}

fn report(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("report{i}"))
}

/// Waits until task `i` (named `name`) reports READY; its pid and READY line. An error when it
/// reports FAIL instead, or nothing by `deadline` (with the tree's output).
pub(crate) fn wait_ready(
    dir: &Path,
    i: usize,
    name: &str,
    deadline: Instant,
) -> Result<(i32, String), String> {
    loop {
        let text = std::fs::read_to_string(report(dir, i)).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.starts_with("READY ")) {
            let pid = field(l, "pid")
                .and_then(|p| p.parse::<i32>().ok())
                .ok_or_else(|| format!("odd READY line `{l}`"))?;
            return Ok((pid, l.to_owned()));
        }
        if let Some(l) = text.lines().find(|l| l.starts_with("FAIL ")) {
            return Err(format!("task {name} failed to start: {l}"));
        }
        if Instant::now() > deadline {
            let out = std::fs::read_to_string(dir.join("workload.out")).unwrap_or_default();
            return Err(format!("task {name} never reported READY\n{out}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// SIGUSR1 to each `(i, pid)` of `tasks`; the PASS or FAIL line each appends to its report
/// (or an earlier FAIL, or "no answer to SIGUSR1" after 5 s), in the order of `tasks`.
pub(crate) fn verify_data(dir: &Path, tasks: &[(usize, i32)]) -> Vec<String> {
    let lines = |i: usize| std::fs::read_to_string(report(dir, i)).unwrap_or_default();
    let before: Vec<usize> = tasks
        .iter()
        .map(|&(i, _)| lines(i).lines().count())
        .collect();
    for &(_, pid) in tasks {
        let _ = kill(Pid::from_raw(pid), Signal::SIGUSR1);
    }
    tasks
        .iter()
        .zip(before)
        .map(|(&(i, _), n)| {
            let end = Instant::now() + Duration::from_secs(5);
            loop {
                let r = lines(i);
                if let Some(l) = r
                    .lines()
                    .skip(n)
                    .find(|l| l.starts_with("PASS") || l.starts_with("FAIL"))
                {
                    break l.to_owned();
                }
                if let Some(l) = r.lines().take(n).find(|l| l.starts_with("FAIL")) {
                    break l.to_owned();
                }
                if Instant::now() > end {
                    break "no answer to SIGUSR1".to_owned();
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
        .collect()
}

/// SIGKILLs `victims` and the tree's root `root`, then waits (5 s in all) until each victim is
/// gone or a zombie, reaping those that are our children (orphans reparented to this
/// subreaper included).
pub(crate) fn kill_and_reap(victims: &[i32], root: Option<Child>) {
    for &p in victims {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    if let Some(mut c) = root {
        let _ = c.kill();
        let _ = c.wait();
    }
    let end = Instant::now() + Duration::from_secs(5);
    for &p in victims {
        while Instant::now() < end {
            let _ = waitpid(Pid::from_raw(p), Some(WaitPidFlag::WNOHANG));
            if !Path::new(&format!("/proc/{p}")).exists() || state(p) == 'Z' {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree in a pid namespace of its own (whose `/proc` is the host's) works in its scenario
    /// directory: CRIU's parasite mounts its `/proc` there (`proc.crtools`), so two such trees
    /// dumped side by side never share that mountpoint.
    #[test]
    fn a_tree_works_in_its_own_directory() {
        let mut kinds = vec![vec![]];
        if nix::unistd::geteuid().is_root() {
            kinds.push(vec![Namespace::Pid]);
        } else {
            eprintln!(
                "note: not root: the tree in a new pid namespace is not started (run the test as \
                 root, as scripts/test.sh is)"
            );
        }
        for namespaces in kinds {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("task0.sh"), "exec sleep 30\n").unwrap();
            let child = spawn_root(dir.path(), &[], &namespaces).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            let root = tree_root(&child, &namespaces, deadline);
            let cwd = root.as_ref().ok().and_then(|r| loop {
                // `unshare`'s child execs `sh`, which execs `setsid sh task0.sh`: the
                // working directory holds from the first of them on.
                if let Ok(c) = std::fs::read_link(format!("/proc/{r}/cwd")) {
                    break Some(c);
                }
                if Instant::now() > deadline {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(2));
            });
            let mut victims = vec![];
            if let Ok(r) = root {
                victims.push(r);
            }
            kill_and_reap(&victims, Some(child));
            let root = root.unwrap();
            assert_eq!(
                cwd,
                Some(dir.path().canonicalize().unwrap()),
                "the working directory of tree root {root} in namespaces {namespaces:?}"
            );
        }
    }
}
