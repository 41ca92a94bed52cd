//! `cuda_plugin.so` under real CRIU (4.1.x and 4.2.x, whichever are present) against mock CUDA
//! workload trees in a mock world, for what the scenario corpus cannot express: one trial per
//! CRIU version × backend × case.
//!
//! | Case | What it checks | Why not a scenario |
//! |---|---|---|
//! | `criu-killed-at-lock`, `criu-killed-at-checkpoint` | CRIU is SIGKILLed mid-dump (after the 1st CUDA task's PAUSE_DEVICES or CHECKPOINT_DEVICES, the 2nd task's call delayed 2 s and in flight): the plugin's guardian puts every CUDA task back (restored, unlocked), the tree runs with its data intact, no guardian is left and its log (`cuda-plugin-guardian.log` in the image directory) names every task it put back | a scenario runs each CRIU step to its end: nothing kills CRIU at a point of its run, nor reads the guardian's log |
//! | `criu-aborts-at-checkpoint` | the same at CHECKPOINT_DEVICES with SIGABRT (what CRIU's `BUG()` raises) | as above |
//! | `criu-killed-at-resume` | CRIU is SIGKILLed mid-restore (after the 1st CUDA task's RESUME_DEVICES_LATE, the 2nd task's restore in flight): the guardian restores the GPU state of the task left behind, the tree runs with its data | as above |
//! | `unprivileged` | `criu --unprivileged` as `nobody` with CAP_CHECKPOINT_RESTORE only dumps and restores that user's tree (with `no_new_privs`) through either backend; the guardian runs as that user | the runner runs the tree and CRIU as itself (root); the format cannot run them as another user with chosen capabilities |
//! | `other-plugin` | another plugin in the same directory (declining every device hook) gets PAUSE_DEVICES, CHECKPOINT_DEVICES and RESUME_DEVICES_LATE for the CPU-only task, and the CUDA tasks still dump and restore with their data | CRIU loads the plugins in `readdir` order, which differs from file system to file system, and so would a snapshot of the other plugin's log; the case checks what holds in either order |
//! | `output-held`, `killed-during-lock` (utility) | see [`holes`] | see [`holes`] |
//!
//! The rest of what this test checked is pinned by the scenario corpus (`scenarios/`, `cargo
//! test -p harness --test scenarios -- '[criu]'`), whose runner checks more of each run (every
//! task's state, CUDA state and data, nothing left behind, and the transcript's snapshot: every
//! driver call and `cuda-checkpoint` run), on the hosts `criu-4.1` and `criu-4.2`, with the
//! backends of the case:
//!
//! | Case (was) | Scenario |
//! |---|---|
//! | `dump-restore` | `criu/dump-and-restore` |
//! | `lock-fails` | `criu/lock-failure-leaves-everything-running` (driver API), `cuda/rollback/cuda-checkpoint/lock-failure-leaves-every-task-running` |
//! | `checkpoint-fails` | `cuda/rollback/driver-api/checkpoint-failure-restores-and-unlocks-the-others`, `cuda/rollback/cuda-checkpoint/checkpoint-failure-restores-and-unlocks-the-others` (CRIU 4.1), `cuda/conformance/checkpoint-error-leaves-no-task-locked` (CRIU 4.2) |
//! | `lock-timeout` | `cuda/rollback/driver-api/lock-call-outlasting-the-timeout-is-abandoned`, `cuda/rollback/cuda-checkpoint/cli-hang-at-lock-is-killed-after-the-timeout` |
//! | `checkpoint-hang` | `cuda/rollback/driver-api/checkpoint-hang-times-out`, `cuda/rollback/cuda-checkpoint/cli-hang-at-checkpoint-is-killed-after-the-timeout` |
//! | `leave-running` | `criu/leave-running` (driver API), `criu/leave-running-then-dump-and-restore` |
//! | `cycles` | `cuda/cycles/two-dump-restore-cycles` |
//! | `seccomp-filtered` | `containers/seccomp-pid-mount` |
//! | `restore-twice` | `criu/same-images-restore-twice` |
//! | `freeze-alarm-hung-lock`, `freeze-alarm-slow-then-hung` | `cuda/holes/freeze-alarm/hung-lock-fails-before-criu-s-alarm`, `cuda/holes/freeze-alarm/slow-lock-then-hung-lock-fails-within-the-alarm` |
//! | `foreign-lock` | `cuda/holes/foreign-lock/another-tool-s-lock-is-left-alone-driver-api`, `…-cuda-checkpoint` |
//! | `restore-fails-kills-and-retries` | `criu/restore-failure-kills-the-task-and-the-images-restore-again` |
//! | `restore-fails-leave` | `cuda/holes/restore-failure/restore-error-with-leave-is-only-logged-under-4.1-rules` |
//! | `bad-task-image-fifo`, `-dev-zero`, `-truncated` | `cuda/holes/bad-images/fifo-task-image-fails-the-restore-up-front`, `dev-zero-…`, `truncated-…` |
//! | `long-option` | `cuda/holes/messages/long-option-value-is-quoted-by-length` |
//! | `visible-devices-empty` | `cuda/holes/small/empty-cuda-visible-devices-does-not-reach-the-utility` |
//! | `non-cuda-tree-unaffected` | `criu/cpu-only-tree-without-a-gpu-is-untouched` |
//! | `exec-counts-n1`, `-n8`, `-n32` | `criu/runs-per-task/1-cuda-task-dumps-and-restores`, `8-cuda-tasks-…`, `32-cuda-tasks-…` |
//!
//! Every case ends by checking that nothing but its tree is left running (no `cuda-checkpoint`,
//! no CRIU), killing the tree, and checking that no process of its world remains. The trials run
//! one at a time (restores need their old pids free). A table of the results with dump/restore
//! times is printed at the end.
//!
//! Skips (with the reason) when not root, or when no CRIU is found (see `testkit::criu` for where
//! it is looked for) unless `CRIU_CUDA_REQUIRE_CRIU=1`. `CRIU_CUDA_TEST_PLUGIN_SO=PATH` tests that
//! prebuilt plugin (e.g. a release build) instead. A failed case keeps its directory (images,
//! CRIU logs, world, report) and prints its path, and its error ends with the world's
//! `timeouts.log` when a driver request gave up on a restore thread (with that thread's state,
//! wait channel and tracer then); `CRIU_CUDA_REAL_CRIU_KEEP=1` keeps every case's.
//!
//! Run: `cargo test -p cuda-plugin --test real_criu [-- FILTER]`, e.g. `-- criu-4.2/driver-api/`.

#[path = "real_criu/holes.rs"]
mod holes;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use testkit::criu::*;
use testkit::proc::status_field;

/// One row of the final table.
#[derive(Debug, Clone)]
struct Row {
    version: String,
    backend: &'static str,
    case: String,
    result: String,
    dumps: Vec<f64>,
    restores: Vec<f64>,
}

static ROWS: Mutex<Vec<Row>> = Mutex::new(Vec::new());

const BACKENDS: [&str; 2] = ["driver-api", "cuda-checkpoint"];

/// A finished CRIU run.
#[derive(Debug)]
struct CriuRun {
    code: Option<i32>,
    ms: f64,
    log: String,
}

impl CriuRun {
    fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// One case: its directory, world, plugin directory and workload tree.
struct Case {
    criu: Criu,
    /// The case's directory (kept on failure for a post-mortem).
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
    keep: bool,
    world: PathBuf,
    libdir: PathBuf,
    bindir: PathBuf,
    options: String,
    report: PathBuf,
    /// Every pid of the tree, root first, and which have CUDA.
    pids: Vec<i32>,
    cuda: Vec<i32>,
    dumps: Vec<f64>,
    restores: Vec<f64>,
    /// Run the tree and CRIU as [`UNPRIVILEGED_UID`], CRIU with `--unprivileged` and
    /// CAP_CHECKPOINT_RESTORE only (see [`Case::unprivileged`]).
    unprivileged: bool,
}

/// The user an unprivileged case runs as (`nobody`).
const UNPRIVILEGED_UID: u32 = 65534;

impl Case {
    fn new(criu: &Criu, backend: &'static str, faults: &str, extra_options: &str) -> R<Case> {
        let a = artifacts().as_ref().map_err(Clone::clone)?;
        let dir = tempfile::Builder::new()
            .prefix("real-criu-")
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?;
        let world = dir.path().join("world");
        let libdir = dir.path().join("plugins");
        let bindir = dir.path().join("bin");
        for d in [&libdir, &bindir] {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        std::fs::copy(&a.plugin_so, libdir.join("cuda_plugin.so"))
            .map_err(|e| format!("copying {}: {e}", a.plugin_so.display()))?;
        std::os::unix::fs::symlink(&a.cuda_checkpoint, bindir.join("cuda-checkpoint"))
            .map_err(|e| format!("linking cuda-checkpoint: {e}"))?;
        init_world(a, &world, &world_config(faults))?;
        let options = format!("cuda_plugin.backend={backend} {extra_options}")
            .trim()
            .to_owned();
        Ok(Case {
            criu: criu.clone(),
            report: dir.path().join("report.txt"),
            path: dir.path().to_path_buf(),
            dir: Some(dir),
            keep: false,
            world,
            libdir,
            bindir,
            options,
            pids: Vec::new(),
            cuda: Vec::new(),
            dumps: Vec::new(),
            restores: Vec::new(),
            unprivileged: false,
        })
    }

    /// Makes this case run unprivileged: its directory (world, plugins, reports, images)
    /// belongs to [`UNPRIVILEGED_UID`], the tree runs as that user with `no_new_privs`, and CRIU
    /// as that user with `--unprivileged` and CAP_CHECKPOINT_RESTORE as its only capability.
    fn unprivileged(&mut self) -> R {
        self.unprivileged = true;
        // What the unprivileged user runs must be where it can reach it, wherever the checkout
        // is (a clone in root's home, mode 0700, is not): CRIU (its wrapper and libraries) and
        // the utility the plugin runs; the workload program is staged in `spawn_tree`.
        let criu_dir = self
            .criu
            .path
            .parent()
            .ok_or("the CRIU wrapper has no directory")?;
        let staged =
            testkit::stage::for_others_only(criu_dir, Some(&["criu", "usr", "lib", "etc"]))?;
        self.criu.path = staged.join(
            self.criu
                .path
                .file_name()
                .ok_or("the CRIU wrapper has no file name")?,
        );
        let a = artifacts().as_ref().map_err(Clone::clone)?;
        let cc = self.bindir.join("cuda-checkpoint");
        std::fs::remove_file(&cc).map_err(|e| format!("{}: {e}", cc.display()))?;
        std::os::unix::fs::symlink(testkit::stage::for_others(&a.cuda_checkpoint)?, &cc)
            .map_err(|e| format!("linking cuda-checkpoint: {e}"))?;
        self.give_away(&self.path)
    }

    /// Hands `p` and everything below it to [`UNPRIVILEGED_UID`] (an unprivileged case only).
    fn give_away(&self, p: &Path) -> R {
        if !self.unprivileged {
            return Ok(());
        }
        let uid = UNPRIVILEGED_UID;
        let mut todo = vec![p.to_path_buf()];
        while let Some(p) = todo.pop() {
            std::os::unix::fs::lchown(&p, Some(uid), Some(uid))
                .map_err(|e| format!("chown {}: {e}", p.display()))?;
            if p.is_dir() && !p.is_symlink() {
                let entries = std::fs::read_dir(&p).map_err(|e| format!("{}: {e}", p.display()))?;
                todo.extend(entries.flatten().map(|e| e.path()));
            }
        }
        Ok(())
    }

    /// The command that runs `program`: as it is, or for an unprivileged case through
    /// `setpriv` as [`UNPRIVILEGED_UID`] with the given `setpriv` options.
    fn command(&self, program: &Path, setpriv: &[&str]) -> Command {
        if !self.unprivileged {
            return Command::new(program);
        }
        let id = UNPRIVILEGED_UID;
        let mut cmd = Command::new("setpriv");
        // In the case's directory, which the user owns: the test's own (the checkout) may be
        // where it cannot look, and CRIU dumps the tree's working directory.
        cmd.current_dir(&self.path);
        cmd.arg(format!("--reuid={id}"))
            .arg(format!("--regid={id}"))
            .arg("--clear-groups")
            .args(setpriv)
            .arg("--")
            .arg(program);
        cmd
    }

    /// `MOCK_CUDA_WORLD=<world>`: marks every process of this case.
    fn marker(&self) -> String {
        format!("MOCK_CUDA_WORLD={}", self.world.display())
    }

    fn env(&self, cmd: &mut Command) {
        cmd.env("MOCK_CUDA_WORLD", &self.world)
            .env("LD_LIBRARY_PATH", self.world.join("lib"))
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove(criu_cuda_env::PLUGIN_MAX_HOOKS);
    }

    /// Starts `mock-cuda-app args…` in a new session and waits for `procs` READY lines.
    fn spawn_tree(&mut self, args: &[&str], procs: usize) -> R {
        let a = artifacts().as_ref().map_err(Clone::clone)?;
        // Unprivileged, the tree sets no_new_privs: CRIU's restorer may then leave capabilities
        // in the bounding set it cannot drop without CAP_SETPCAP (criu/pie/restorer.c, "trim
        // bset"); a container's tasks usually have it set (seccomp needs it).
        let app = if self.unprivileged {
            testkit::stage::for_others(&a.mock_app)?
        } else {
            a.mock_app.clone()
        };
        let mut cmd = self.command(&app, &["--no-new-privs"]);
        cmd.args(args)
            .arg("--report")
            .arg(&self.report)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.env(&mut cmd);
        in_new_session(&mut cmd);
        // Not kept as a `Child`: `reap` collects it with the orphans.
        let root = cmd
            .spawn()
            .map_err(|e| format!("starting mock-cuda-app: {e}"))?
            .id() as i32;
        let ready = |r: &str| r.lines().filter(|l| l.starts_with("READY ")).count();
        let limit = Duration::from_secs(10 + procs as u64);
        if !wait_until(limit, || ready(&read(&self.report)) >= procs) {
            self.pids = vec![root];
            return Err(format!(
                "the workload tree did not report {procs} READY lines: {}",
                read(&self.report)
            ));
        }
        for l in read(&self.report).lines() {
            let Some(rest) = l.strip_prefix("READY ") else {
                continue;
            };
            let field = |k: &str| {
                rest.split_whitespace()
                    .find_map(|f| f.strip_prefix(k).map(str::to_owned))
            };
            let pid: i32 = field("pid=")
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| format!("bad READY line {l:?}"))?;
            self.pids.push(pid);
            if field("cuda=").as_deref() == Some("yes") {
                self.cuda.push(pid);
            }
        }
        // The root starts its children before it reports READY: put it first.
        let i = self
            .pids
            .iter()
            .position(|&p| p == root)
            .ok_or_else(|| format!("the root {root} did not report READY: {:?}", self.pids))?;
        self.pids[..=i].rotate_right(1);
        if let Some(j) = self.cuda.iter().position(|&p| p == root) {
            self.cuda[..=j].rotate_right(1);
        }
        Ok(())
    }

    /// Starts CRIU with `args` and the case's environment; the log goes to `<dir>/<log>`.
    fn criu_spawn(&self, args: &[&str], log: &str) -> R<std::process::Child> {
        let log_path = self.path.join(log);
        let out = std::fs::File::create(self.path.join(format!("{log}.out")))
            .map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = self.command(
            &self.criu.path,
            &[
                "--inh-caps=+checkpoint_restore",
                "--ambient-caps=+checkpoint_restore",
            ],
        );
        cmd.args(args);
        if self.unprivileged {
            cmd.arg("--unprivileged");
        }
        cmd.arg("-L")
            .arg(&self.libdir)
            .args(["-v4", "-o"])
            .arg(&log_path)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .env("CRIU_PLUGIN_OPTIONS", &self.options);
        // There is no NVIDIA GPU here.
        cmd.env(criu_cuda_env::FORCE_ENABLE, "1");
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut new_path = self.bindir.clone().into_os_string();
        new_path.push(":");
        new_path.push(path);
        cmd.env("PATH", new_path);
        self.env(&mut cmd);
        cmd.spawn()
            .map_err(|e| format!("starting {}: {e}", self.criu.path.display()))
    }

    /// Runs CRIU with `args` and the case's environment; the log goes to `<dir>/<log>`.
    fn criu(&self, args: &[&str], log: &str) -> R<CriuRun> {
        let log_path = self.path.join(log);
        let t = Instant::now();
        let mut child = self.criu_spawn(args, log)?;
        let deadline = t + Duration::from_secs(120);
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("criu {args:?} ran over 120 s; killed"));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => return Err(format!("waiting for criu: {e}")),
            }
        };
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        reap();
        Ok(CriuRun {
            code: status.code(),
            ms,
            log: read(&log_path),
        })
    }

    fn images(&self, name: &str) -> R<String> {
        let d = self.path.join(name);
        std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        self.give_away(&d)?;
        Ok(d.display().to_string())
    }

    /// `criu dump` of the tree into `<dir>/<images>`.
    fn dump(&mut self, images: &str, leave_running: bool) -> R<CriuRun> {
        let d = self.images(images)?;
        let root = self.pids[0].to_string();
        let mut args = vec!["dump", "-t", &root, "-D", &d];
        if leave_running {
            args.push("--leave-running");
        }
        let r = self.criu(&args, &format!("{images}-dump.log"))?;
        self.dumps.push(r.ms);
        Ok(r)
    }

    /// `criu restore -d` from `<dir>/<images>`.
    fn restore(&mut self, images: &str) -> R<CriuRun> {
        let d = self.images(images)?;
        let r = self.criu(
            &["restore", "-D", &d, "-d"],
            &format!("{images}-restore.log"),
        )?;
        self.restores.push(r.ms);
        Ok(r)
    }

    fn expect_ok(&self, what: &str, r: &CriuRun) -> R {
        ensure!(
            r.ok(),
            "criu {what} failed ({:?}); log tail:\n{}",
            r.code,
            tail(&r.log, 25)
        );
        Ok(())
    }

    /// Waits until every pid of the tree is gone (reaping what is reparented to us).
    fn wait_tree_gone(&self) -> R {
        wait_pids_gone(&self.pids, Duration::from_secs(10))
    }

    fn check_running_once(&self) -> R {
        for &pid in &self.pids {
            check_free_running(pid)?;
        }
        let states = world_states(&self.world)?;
        for &pid in &self.cuda {
            let st = states
                .iter()
                .find(|(p, _)| *p == pid)
                .map(|(_, s)| s.name());
            ensure!(
                st == Some("running"),
                "pid {pid} is {st:?} in the mock world, not running"
            );
        }
        Ok(())
    }

    /// Every task runs free and every CUDA task is RUNNING (unlocked) in the world.
    fn check_running(&self) -> R {
        if wait_until(Duration::from_secs(3), || self.check_running_once().is_ok()) {
            return Ok(());
        }
        self.check_running_once()
    }

    /// Asks every task to check its data (SIGUSR1) and expects a PASS line from each.
    fn verify_data(&self) -> R {
        let before = read(&self.report).lines().count();
        for &pid in &self.pids {
            ensure!(signal(pid, SIGUSR1), "signalling pid {pid}");
        }
        let answered = |pid: i32| {
            let needle = format!(" pid={pid} ");
            let r = read(&self.report);
            r.lines()
                .skip(before)
                .any(|l| (l.starts_with("PASS") || l.starts_with("FAIL")) && l.contains(&needle))
        };
        let all = wait_until(Duration::from_secs(10), || {
            self.pids.iter().all(|&p| answered(p))
        });
        let report = read(&self.report);
        ensure!(
            !report.lines().any(|l| l.starts_with("FAIL")),
            "a task failed its data check:\n{report}"
        );
        ensure!(all, "not every task answered SIGUSR1:\n{report}");
        Ok(())
    }

    /// Kills what is left of the case's processes and checks that none remains, and that
    /// nothing but the tree itself was still running (a `cuda-checkpoint` or CRIU left behind).
    fn teardown(&mut self) -> R {
        let marker = self.marker();
        reap();
        // The plugin's guardian outlives CRIU by design (it watches a dump's tasks until CRIU
        // has exited, then puts back any left checkpointed); it must end on its own, bounded.
        wait_guardians(self)?;
        let strays: Vec<i32> = processes_with_env(&marker)
            .into_iter()
            .filter(|p| !self.pids.contains(p))
            .inspect(|p| {
                let cmd = read(Path::new(&format!("/proc/{p}/cmdline"))).replace('\0', " ");
                eprintln!("    stray process {p}: {cmd}");
            })
            .collect();
        let mut left = Vec::new();
        let done = wait_until(Duration::from_secs(5), || {
            for pid in processes_with_env(&marker) {
                signal(pid, SIGCONT);
                signal(pid, SIGKILL);
            }
            reap();
            left = processes_with_env(&marker);
            left.is_empty()
        });
        ensure!(done, "processes of the case are left: {left:?}");
        ensure!(
            strays.is_empty(),
            "processes other than the workload tree were left running: {strays:?}"
        );
        Ok(())
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = self.teardown();
        if self.keep {
            if let Some(d) = self.dir.take() {
                eprintln!("    kept {} for inspection", d.keep().display());
            }
        }
    }
}

/// The mock world's timeout log (`timeouts.log`: driver requests that gave up waiting for a
/// target's restore thread, with its state, wait channel and tracer then) as a section to
/// append to a failed case's error; empty when nothing timed out.
fn world_timeouts(world: &Path) -> String {
    let path = world.join(mock_cuda_world::timeouts::FILE);
    let text = read(&path);
    if text.trim().is_empty() {
        return String::new();
    }
    format!(
        "\n    the mock world's {}:\n{}",
        path.display(),
        text.trim_end()
    )
}

fn spawn_tree3(c: &mut Case) -> R {
    c.spawn_tree(&TREE3, 3)?;
    ensure!(
        c.pids.len() == 3 && c.cuda.len() == 2 && c.cuda[0] == c.pids[0],
        "unexpected tree: pids {:?}, CUDA {:?}",
        c.pids,
        c.cuda
    );
    ensure!(
        threads(c.pids[0]).len() >= 3,
        "the root is not multi-threaded"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The cases

/// `criu --unprivileged` as a non-root user with CAP_CHECKPOINT_RESTORE only, dumping and
/// restoring that user's tree (with `no_new_privs`): the plugin needs no capability of its own
/// (it puts back only the ptrace options CRIU set, never PTRACE_O_SUSPEND_SECCOMP for an
/// unfiltered task), and its guardian runs as that user too.
///
/// Not a scenario: the runner runs the tree and CRIU as itself (root), and the format has no
/// way to run them as another user with CAP_CHECKPOINT_RESTORE as CRIU's only capability and
/// `no_new_privs` on the tree.
fn unprivileged(c: &mut Case) -> R {
    c.unprivileged()?;
    spawn_tree3(c)?;
    for &pid in &c.pids {
        let uid =
            status_field(pid, "Uid").and_then(|v| v.split_whitespace().next().map(str::to_owned));
        ensure!(
            uid == Some(UNPRIVILEGED_UID.to_string()),
            "pid {pid} runs as uid {uid:?}, not {UNPRIVILEGED_UID}"
        );
    }
    let d = c.dump("img", false)?;
    c.expect_ok("unprivileged dump", &d)?;
    ensure!(
        d.log.contains("cuda_plugin"),
        "the plugin did not run in the unprivileged dump"
    );
    c.wait_tree_gone()?;
    let r = c.restore("img")?;
    c.expect_ok("unprivileged restore", &r)?;
    c.check_running()?;
    c.verify_data()?;
    c.teardown()
}

/// A C plugin that records every device hook it gets and declines each (-ENOTSUP).
const OTHER_PLUGIN_C: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
struct desc { const char *name; int (*init)(int); void (*exit)(int, int); unsigned version, max_hooks; void *hooks[12]; };
static void note(const char *hook, int pid) {
    const char *path = getenv("OTHER_PLUGIN_LOG");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (f) { fprintf(f, "%s %d\n", hook, pid); fclose(f); }
}
static int init(int stage) { note("INIT", stage); return 0; }
static void fini(int stage, int ret) { note("EXIT", ret); }
static int resume(int pid) { note("RESUME_DEVICES_LATE", pid); return -ENOTSUP; }
static int pause_devices(int pid) { note("PAUSE_DEVICES", pid); return -ENOTSUP; }
static int checkpoint(int pid) { note("CHECKPOINT_DEVICES", pid); return -ENOTSUP; }
struct desc CR_PLUGIN_DESC = { "other_probe", init, fini, 0x200, 12,
    { 0, 0, 0, 0, 0, 0, 0, 0, 0, (void *)resume, (void *)pause_devices, (void *)checkpoint } };
"#;

/// Another plugin in the same libdir: whichever comes first in directory order, a task the CUDA
/// plugin does not claim (-ENOTSUP) reaches the other plugin at every device hook, and the CUDA
/// tasks still dump and restore with their data.
///
/// Not a scenario: CRIU 4.1/4.2 load the plugins of the directory in `readdir` order, which
/// depends on the file system (ext4 orders by a hash with a per-file-system seed). Whether the
/// other plugin comes first (and sees every task) or second (and sees the CPU-only one alone)
/// differs from machine to machine, and so would a snapshot of its log; this case checks what
/// holds in either order. (`cuda/plugins/test-plugin-sees-cpu-tasks-the-cuda-plugin-declines`
/// pins it on the emulated engine, which loads the plugins in the scenario's order.)
fn other_plugin(c: &mut Case) -> R {
    let src = c.path.join("other.c");
    std::fs::write(&src, OTHER_PLUGIN_C).map_err(|e| e.to_string())?;
    let so = c.libdir.join("other_probe.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .output()
        .map_err(|e| format!("running {cc}: {e}"))?;
    ensure!(
        out.status.success(),
        "compiling the other plugin: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = c.path.join("other.log");
    std::env::set_var("OTHER_PLUGIN_LOG", &log);
    spawn_tree3(c)?;
    dump_restore_once(c)?;
    let seen = read(&log);
    let cpu_only = c.pids[1];
    for hook in ["PAUSE_DEVICES", "CHECKPOINT_DEVICES", "RESUME_DEVICES_LATE"] {
        ensure!(
            seen.lines().any(|l| l == format!("{hook} {cpu_only}")),
            "the other plugin never got {hook} for the CPU-only task {cpu_only}:\n{seen}"
        );
    }
    c.teardown()
}

fn dump_restore_once(c: &mut Case) -> R {
    let d = c.dump("img", false)?;
    c.expect_ok("dump", &d)?;
    c.wait_tree_gone()?;
    let r = c.restore("img")?;
    c.expect_ok("restore", &r)?;
    c.check_running()?;
    c.verify_data()
}

/// Where a `criu-killed-*` case kills CRIU (SIGKILL, the stand-in for the OOM killer, a
/// node drain or CRIU's own `BUG()`).
///
/// Not a scenario: a scenario's CRIU step runs CRIU to its end (or to the step's time limit,
/// which kills it at no chosen point), and a `signal` step names a task of the tree and runs
/// between steps; nothing sends CRIU a signal once its log shows a marker, and nothing then
/// reads the guardian's log in the image directory.
#[derive(Debug, Clone, Copy)]
enum KillAt {
    /// During the dump's freeze, after the 1st CUDA task is locked, while the 2nd task's lock
    /// (delayed) is in flight.
    Lock,
    /// During the dump, after the 1st CUDA task is checkpointed, while the 2nd task's
    /// checkpoint (delayed) is in flight.
    Checkpoint,
    /// As `Checkpoint`, but CRIU dies of SIGABRT (what its `BUG()` raises).
    Abort,
    /// During the restore, after the 1st CUDA task's RESUME_DEVICES_LATE, while the 2nd task's
    /// restore (delayed) is in flight.
    Resume,
}

/// How long the 2nd task's call is delayed: CRIU is killed within it.
const KILL_DELAY_MS: u64 = 2000;

impl KillAt {
    fn name(self) -> &'static str {
        match self {
            KillAt::Lock => "criu-killed-at-lock",
            KillAt::Checkpoint => "criu-killed-at-checkpoint",
            KillAt::Abort => "criu-aborts-at-checkpoint",
            KillAt::Resume => "criu-killed-at-resume",
        }
    }

    fn fault(self, backend: &str) -> String {
        let cli = backend == "cuda-checkpoint";
        let function = match (self, cli) {
            (KillAt::Lock, true) => "cuda-checkpoint:lock",
            (KillAt::Lock, false) => "cuCheckpointProcessLock",
            (KillAt::Checkpoint | KillAt::Abort, true) => "cuda-checkpoint:checkpoint",
            (KillAt::Checkpoint | KillAt::Abort, false) => "cuCheckpointProcessCheckpoint",
            (KillAt::Resume, true) => "cuda-checkpoint:restore",
            (KillAt::Resume, false) => "cuCheckpointProcessRestore",
        };
        fault(
            function,
            2,
            &format!(r#"{{ kind = "delay", ms = {KILL_DELAY_MS} }}"#),
        )
    }
}

/// Runs CRIU with `args` and sends it `sig` once its log shows `marker`; returns the log.
fn kill_criu_at(c: &Case, args: &[&str], log: &str, marker: &str, sig: i32) -> R<String> {
    let log_path = c.path.join(log);
    let mut child = c.criu_spawn(args, log)?;
    let mut exited = None;
    let seen = wait_until(Duration::from_secs(60), || {
        if read(&log_path).contains(marker) {
            return true;
        }
        exited = child.try_wait().ok().flatten();
        exited.is_some()
    });
    if let Ok(pid) = i32::try_from(child.id()) {
        signal(pid, sig);
    }
    let _ = child.wait();
    reap();
    let text = read(&log_path);
    ensure!(
        seen && exited.is_none(),
        "criu {args:?} never reached `{marker}` (exit: {exited:?}); log tail:\n{}",
        tail(&text, 25)
    );
    Ok(text)
}

/// Waits for the plugin's guardian processes of this case to exit (at most 90 s).
fn wait_guardians(c: &Case) -> R {
    let marker = c.marker();
    let left = || -> Vec<i32> {
        processes_with_env(&marker)
            .into_iter()
            .filter(|&p| read(Path::new(&format!("/proc/{p}/comm"))).trim_end() == "cuda-guardian")
            .collect()
    };
    let done = wait_until(Duration::from_secs(90), || {
        reap();
        left().is_empty()
    });
    ensure!(
        done,
        "the plugin's guardian still runs 90 s after CRIU: {:?}",
        left()
    );
    Ok(())
}

/// CRIU killed mid-dump or mid-restore: the plugin's guardian puts every CUDA task back
/// (dump: restored and unlocked, running as before; restore: the GPU state restored), the tree
/// runs with its data intact, and the guardian's log in the image directory says what it did.
fn criu_killed(c: &mut Case, at: KillAt) -> R {
    spawn_tree3(c)?;
    let first = c.cuda[0];
    let d = c.images("img")?;
    let root = c.pids[0].to_string();
    let sig = if matches!(at, KillAt::Abort) {
        SIGABRT
    } else {
        SIGKILL
    };
    let started = Instant::now();
    match at {
        KillAt::Lock | KillAt::Checkpoint | KillAt::Abort => {
            let hook = if matches!(at, KillAt::Lock) {
                "PAUSE_DEVICES"
            } else {
                "CHECKPOINT_DEVICES"
            };
            let marker = format!("{hook} pid {first}: done");
            kill_criu_at(
                c,
                &["dump", "-t", &root, "-D", &d],
                "img-dump.log",
                &marker,
                sig,
            )?;
        }
        KillAt::Resume => {
            let dump = c.dump("img", false)?;
            c.expect_ok("dump", &dump)?;
            c.wait_tree_gone()?;
            let marker = format!("RESUME_DEVICES_LATE pid {first}: done");
            kill_criu_at(
                c,
                &["restore", "-D", &d, "-d"],
                "img-restore.log",
                &marker,
                sig,
            )?;
        }
    }
    wait_guardians(c)?;
    println!(
        "    every task back within {:.1} s of CRIU's start",
        started.elapsed().as_secs_f64()
    );
    c.check_running()?;
    c.verify_data()?;
    let glog = read(&Path::new(&d).join("cuda-plugin-guardian.log"));
    let stage = if matches!(at, KillAt::Resume) {
        "restore"
    } else {
        "dump"
    };
    // At the dump every task was changed by then; at the restore the first one was done, the
    // other one's restore was in flight.
    let put_back = match at {
        KillAt::Resume => c
            .cuda
            .iter()
            .copied()
            .find(|&p| p != first)
            .unwrap_or(first),
        _ => first,
    };
    let acted = glog.contains(&format!(
        "ended during the {stage} without the plugin's final word"
    )) && glog.contains(&format!("pid {put_back}: back to running"))
        && !glog.contains("failed");
    ensure!(
        acted,
        "the guardian's log does not say it put pid {put_back} back, or reports a failure:\n{glog}"
    );
    println!("    guardian log:\n{}", glog.trim_end());
    c.teardown()
}

// ---------------------------------------------------------------------------------------------
// The trials

fn run_case(
    criu: Criu,
    backend: &'static str,
    case: String,
    faults: String,
    options: &'static str,
    body: impl FnOnce(&mut Case) -> R,
) -> Result<(), Failed> {
    let (result, dumps, restores) = match Case::new(&criu, backend, &faults, options) {
        Ok(mut c) => {
            let r = body(&mut c).and_then(|()| c.teardown());
            // A driver request that gave up on a restore thread says what that thread did.
            let r = r.map_err(|e| e + &world_timeouts(&c.world));
            c.keep = r.is_err() || criu_cuda_env::is_on(criu_cuda_env::REAL_CRIU_KEEP);
            (r, c.dumps.clone(), c.restores.clone())
        }
        Err(e) => (Err(e), Vec::new(), Vec::new()),
    };
    ROWS.lock().unwrap_or_else(|e| e.into_inner()).push(Row {
        version: criu.version.clone(),
        backend,
        case,
        result: if result.is_ok() { "ok" } else { "FAILED" }.to_owned(),
        dumps,
        restores,
    });
    result.map_err(Failed::from)
}

fn trials(criu_list: &[Criu]) -> Vec<Trial> {
    let mut out = Vec::new();
    for criu in criu_list {
        for backend in BACKENDS {
            let name = |case: &str| format!("criu-{}/{backend}/{case}", criu.series);
            for at in [
                KillAt::Lock,
                KillAt::Checkpoint,
                KillAt::Abort,
                KillAt::Resume,
            ] {
                let cr = criu.clone();
                let case = at.name();
                let faults = at.fault(backend);
                // One task at a time (parallel=auto is the default): CRIU is killed after the
                // 1st task's call, while the 2nd task's call is in flight.
                out.push(Trial::test(name(case), move || {
                    run_case(
                        cr,
                        backend,
                        case.into(),
                        faults,
                        "cuda_plugin.parallel=1",
                        |c| criu_killed(c, at),
                    )
                }));
            }
            for (case, body) in [
                ("unprivileged", unprivileged as fn(&mut Case) -> R),
                ("other-plugin", other_plugin),
            ] {
                let cr = criu.clone();
                out.push(Trial::test(name(case), move || {
                    run_case(cr, backend, case.into(), String::new(), "", body)
                }));
            }
            for (case, body, backends) in holes::cases() {
                if !backends.contains(&backend) {
                    continue;
                }
                let cr = criu.clone();
                out.push(Trial::test(name(case), move || {
                    run_case(
                        cr,
                        backend,
                        case.into(),
                        holes::faults(case, backend),
                        holes::options(case),
                        body,
                    )
                }));
            }
        }
    }
    out
}

fn print_summary() {
    let rows = ROWS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if rows.is_empty() {
        return;
    }
    let ms = |v: &[f64]| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join("+")
        }
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nreal CRIU summary\n{:<8} {:<16} {:<18} {:<7} {:>11} {:>11}",
        "version", "backend", "case", "result", "dump ms", "restore ms"
    );
    for r in &rows {
        let _ = writeln!(
            s,
            "{:<8} {:<16} {:<18} {:<7} {:>11} {:>11}",
            r.version,
            r.backend,
            r.case,
            r.result,
            ms(&r.dumps),
            ms(&r.restores)
        );
    }
    print!("{s}");
}

fn skipped(reason: String) -> Vec<Trial> {
    eprintln!("real_criu: skipping: {reason}");
    vec![Trial::ignorable_test("real-criu", move || {
        Ok(Completion::ignored_with(reason))
    })]
}

fn main() {
    let mut args = Arguments::from_args();
    // One at a time: a restore needs its old pids free, and the cases measure times.
    args.test_threads = Some(1);
    let require = criu_cuda_env::is_on(criu_cuda_env::REQUIRE_CRIU);
    let criu = find_criu();
    let trials = if !is_root() {
        skipped("not root (CRIU needs root to dump and restore)".into())
    } else if criu.is_empty() {
        let reason =
            "no CRIU 4.1.x/4.2.x found (set CRIU_CUDA_CRIU_4_1/_4_2 or run scripts/fetch-criu.sh)";
        if require {
            vec![Trial::test("real-criu", move || {
                Err(format!("{reason}, and CRIU_CUDA_REQUIRE_CRIU=1").into())
            })]
        } else {
            skipped(reason.into())
        }
    } else {
        if !become_subreaper() {
            eprintln!("real_criu: warning: cannot become a child subreaper; pids may free slowly");
        }
        if !args.list {
            for c in &criu {
                eprintln!("real_criu: CRIU {} at {}", c.version, c.path.display());
            }
            if let Some(p) = std::env::var_os(criu_cuda_env::TEST_PLUGIN_SO) {
                eprintln!(
                    "real_criu: plugin {} (CRIU_CUDA_TEST_PLUGIN_SO)",
                    Path::new(&p).display()
                );
            }
        }
        trials(&criu)
    };
    let conclusion = libtest_mimic::run(&args, trials);
    print_summary();
    conclusion.exit();
}
