//! The rollback holes under real CRIU: each case was measured failing on the plugin before it
//! was fixed (the closing note of that change names the before and after).
//!
//! | Case | What it checks |
//! |---|---|
//! | `freeze-alarm-hung-lock` | `criu dump --timeout 3` with `cuda_plugin.timeout=30` and the 2nd CUDA task's lock hung: the dump fails within 3.5 s, naming CRIU's freezing timeout, CRIU never reaches its FATAL path, every task runs unlocked |
//! | `freeze-alarm-slow-then-hung` | the 1st lock takes 2 s and the 2nd hangs, same timeouts: the same bound |
//! | `foreign-lock` | another tool locks the 2nd task first: the dump fails, that lock is left alone, the 1st task is unlocked |
//! | `restore-fails-kills-and-retries` | the 2nd task's restore fails: CRIU 4.1/4.2 would release it locked; the plugin kills it, so `criu restore` fails; the same images then restore |
//! | `restore-fails-leave` | as above with `on-restore-failure=leave`: the restore "succeeds", the task is left checkpointed and the log has an `Error` naming it |
//! | `bad-task-image-*` | a per-task image that is a FIFO, a link to `/dev/zero` or truncated: the restore fails at once, naming the file, with nothing restored |
//! | `long-option` | a 20 KB option value: the dump fails at init and CRIU's log holds no NUL byte and no line longer than 4 KiB |
//! | `output-held` (utility) | a `cuda-checkpoint` wrapper leaves a process holding its output: the dump fails within the run's deadline, not when that process exits |
//! | `killed-during-lock` (utility) | CRIU is killed (SIGKILL) while a `cuda-checkpoint` lock is in flight: the utility dies with it, and the task is not locked later |
//! | `visible-devices-empty` (utility) | CRIU's environment has `CUDA_VISIBLE_DEVICES=` (empty): the utility does not inherit it, the dump and the restore work |

use super::*;

/// CRIU's `--timeout` in the freeze-alarm cases, and how much later the dump may end.
const ALARM_S: u64 = 3;
const ALARM_SLACK: Duration = Duration::from_millis(500);

/// The world faults of a case, by name (they are installed when the case's world is made).
pub fn faults(case: &str, backend: &str) -> String {
    let cli = backend == "cuda-checkpoint";
    let lock = if cli {
        "cuda-checkpoint:lock"
    } else {
        "cuCheckpointProcessLock"
    };
    let restore = if cli {
        "cuda-checkpoint:restore"
    } else {
        "cuCheckpointProcessRestore"
    };
    match case {
        "freeze-alarm-hung-lock" => fault(lock, 2, r#"{ kind = "hang" }"#),
        "freeze-alarm-slow-then-hung" => {
            fault(lock, 1, r#"{ kind = "delay", ms = 2000 }"#)
                + &fault(lock, 2, r#"{ kind = "hang" }"#)
        }
        "foreign-lock" => fault(lock, 2, r#"{ kind = "foreign-lock" }"#),
        "restore-fails-kills-and-retries" | "restore-fails-leave" => fault(
            restore,
            2,
            r#"{ kind = "return", code = "CUDA_ERROR_OUT_OF_MEMORY" }"#,
        ),
        "killed-during-lock" => fault(lock, 1, r#"{ kind = "hang", file = "release" }"#),
        _ => String::new(),
    }
}

/// The plugin options of a case.
pub fn options(case: &str) -> &'static str {
    match case {
        "freeze-alarm-hung-lock" | "freeze-alarm-slow-then-hung" => "cuda_plugin.timeout=30",
        "restore-fails-leave" => "cuda_plugin.on-restore-failure=leave",
        "output-held" => "cuda_plugin.timeout=2",
        _ => "",
    }
}

/// A case: its name, its body and the backends it applies to.
pub type HoleCase = (&'static str, fn(&mut Case) -> R, &'static [&'static str]);

/// The cases.
pub fn cases() -> Vec<HoleCase> {
    const BOTH: &[&str] = &["driver-api", "cuda-checkpoint"];
    const CLI: &[&str] = &["cuda-checkpoint"];
    const DRIVER: &[&str] = &["driver-api"];
    vec![
        (
            "freeze-alarm-hung-lock",
            freeze_alarm as fn(&mut Case) -> R,
            BOTH,
        ),
        ("freeze-alarm-slow-then-hung", freeze_alarm, BOTH),
        ("foreign-lock", foreign_lock, BOTH),
        ("restore-fails-kills-and-retries", restore_fails_kill, BOTH),
        ("restore-fails-leave", restore_fails_leave, DRIVER),
        ("bad-task-image-fifo", bad_image_fifo, DRIVER),
        ("bad-task-image-dev-zero", bad_image_dev_zero, DRIVER),
        ("bad-task-image-truncated", bad_image_truncated, CLI),
        ("long-option", long_option, DRIVER),
        ("output-held", output_held, CLI),
        ("killed-during-lock", killed_during_lock, CLI),
        ("visible-devices-empty", visible_devices_empty, CLI),
    ]
}

/// A two-task tree of CUDA tasks (root and child), as the fault numbering above assumes.
fn spawn_pair(c: &mut Case) -> R {
    c.spawn_tree(
        &["--kib", "32", "--children", "1", "--child-args", "--kib 16"],
        2,
    )?;
    ensure!(c.cuda.len() == 2, "expected two CUDA tasks: {:?}", c.cuda);
    Ok(())
}

fn dump_with(c: &mut Case, extra: &[&str]) -> R<CriuRun> {
    let d = c.images("img")?;
    let root = c.pids[0].to_string();
    let mut args = vec!["dump", "-t", &root, "-D", &d];
    args.extend_from_slice(extra);
    let r = c.criu(&args, "img-dump.log")?;
    c.dumps.push(r.ms);
    Ok(r)
}

/// A CRIU run's time as a duration.
fn ms(x: f64) -> Duration {
    Duration::from_secs_f64(x / 1000.0)
}

fn state_of(c: &Case, pid: i32) -> R<CudaState> {
    Ok(world_states(&c.world)?
        .into_iter()
        .find(|(p, _)| *p == pid)
        .map_or(CudaState::None, |(_, s)| s))
}

fn freeze_alarm(c: &mut Case) -> R {
    spawn_pair(c)?;
    let timeout = ALARM_S.to_string();
    let d = dump_with(c, &["--timeout", &timeout])?;
    ensure!(!d.ok(), "the dump succeeded despite a hung lock");
    let limit = Duration::from_secs(ALARM_S) + ALARM_SLACK;
    ensure!(
        ms(d.ms) < limit,
        "the dump took {:.0} ms, more than --timeout {ALARM_S} s and {} ms",
        d.ms,
        ALARM_SLACK.as_millis()
    );
    ensure!(
        !d.log.contains("FATAL"),
        "CRIU reached its FATAL path:\n{}",
        tail(&d.log, 20)
    );
    ensure!(
        d.log.contains("CRIU's freezing timeout (--timeout 3 s)") && d.log.contains("Error"),
        "no error naming CRIU's freezing timeout:\n{}",
        tail(&d.log, 20)
    );
    note(format!(
        "{} {}: the hung lock failed the dump in {:.0} ms (--timeout {ALARM_S})",
        c.criu.version, c.backend, d.ms
    ));
    c.check_running()?;
    c.verify_data()?;
    c.teardown()
}

fn foreign_lock(c: &mut Case) -> R {
    spawn_pair(c)?;
    let d = dump_with(c, &[])?;
    ensure!(
        !d.ok(),
        "the dump succeeded though another tool locked a task"
    );
    ensure!(
        d.log.contains("another tool locked the task"),
        "{}",
        tail(&d.log, 20)
    );
    let (first, second) = (c.cuda[0], c.cuda[1]);
    ensure!(
        state_of(c, second)? == CudaState::Locked,
        "the other tool's lock of {second} was undone"
    );
    ensure!(
        state_of(c, first)? == CudaState::Running,
        "{first} is not running"
    );
    // That lock is the other tool's to release; then everything runs with its data.
    let a = artifacts().as_ref().map_err(Clone::clone)?;
    let mut cmd = Command::new(&a.cuda_checkpoint);
    cmd.args(["--action", "unlock", "--pid", &second.to_string()]);
    c.env(&mut cmd);
    let out = cmd.output().map_err(|e| e.to_string())?;
    ensure!(out.status.success(), "unlocking {second} by hand failed");
    c.check_running()?;
    c.verify_data()?;
    c.teardown()
}

/// Removes the restore fault (the world's config without faults) so the images restore.
fn clear_faults(c: &Case) -> R {
    let a = artifacts().as_ref().map_err(Clone::clone)?;
    MockWorld::open(&c.world)
        .map(|w| w.with_libs(Some(&a.mock_so), a.mock_nvml.as_deref()))
        .and_then(|w| w.configure(&world_config("")))
        .map_err(|e| e.to_string())
}

fn restore_fails_kill(c: &mut Case) -> R {
    spawn_pair(c)?;
    let d = c.dump("img", false)?;
    c.expect_ok("dump", &d)?;
    c.wait_tree_gone()?;
    let second = c.cuda[1];
    let r = c.restore("img")?;
    ensure!(
        !r.ok(),
        "criu restore reported success though a task's GPU state was not restored:\n{}",
        tail(&r.log, 25)
    );
    ensure!(
        r.log.lines().any(|l| l.contains("cuda_plugin: Error")
            && l.contains(&format!("pid {second}"))
            && l.contains("killed the task")),
        "no error saying the task was killed:\n{}",
        tail(&r.log, 25)
    );
    c.wait_tree_gone()?;
    // The images are intact: the same restore, without the fault, brings everything back.
    clear_faults(c)?;
    let r = c.restore("img")?;
    c.expect_ok("the second restore", &r)?;
    c.check_running()?;
    c.verify_data()?;
    c.teardown()
}

fn restore_fails_leave(c: &mut Case) -> R {
    spawn_pair(c)?;
    let d = c.dump("img", false)?;
    c.expect_ok("dump", &d)?;
    c.wait_tree_gone()?;
    let second = c.cuda[1];
    let r = c.restore("img")?;
    c.expect_ok("restore (on-restore-failure=leave)", &r)?;
    ensure!(
        r.log.lines().any(|l| l.contains("cuda_plugin: Error")
            && l.contains(&format!("pid {second}"))
            && l.contains("on-restore-failure=leave")),
        "no error naming the task left behind:\n{}",
        tail(&r.log, 25)
    );
    ensure!(
        state_of(c, second)? == CudaState::Checkpointed,
        "{second} is not checkpointed"
    );
    c.teardown()
}

fn bad_image(c: &mut Case, damage: impl FnOnce(&Path) -> std::io::Result<()>) -> R {
    spawn_pair(c)?;
    let d = c.dump("img", false)?;
    c.expect_ok("dump", &d)?;
    c.wait_tree_gone()?;
    let name = format!("cuda-plugin-{}.img", c.cuda[1]);
    let path = c.path.join("img").join(&name);
    std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    damage(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let r = c.restore("img")?;
    ensure!(!r.ok(), "the restore succeeded with a bad task image");
    ensure!(
        ms(r.ms) < Duration::from_secs(20),
        "the restore took {:.0} ms: it waited on the image",
        r.ms
    );
    ensure!(
        r.log
            .lines()
            .any(|l| l.contains("cuda_plugin: Error") && l.contains(&name)),
        "no error naming {name}:\n{}",
        tail(&r.log, 25)
    );
    c.pids.clear(); // nothing was restored
    c.teardown()
}

fn bad_image_fifo(c: &mut Case) -> R {
    bad_image(c, |p| {
        let made = Command::new("mkfifo").arg(p).status()?;
        if made.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("mkfifo: {made}")))
        }
    })
}

fn bad_image_dev_zero(c: &mut Case) -> R {
    bad_image(c, |p| std::os::unix::fs::symlink("/dev/zero", p))
}

fn bad_image_truncated(c: &mut Case) -> R {
    bad_image(c, |p| std::fs::write(p, b"cuda_plugin task v1\npid 1"))
}

fn long_option(c: &mut Case) -> R {
    c.options = format!("cuda_plugin.backend={}", "x".repeat(20_000));
    spawn_pair(c)?;
    let d = c.dump("img", false)?;
    ensure!(!d.ok(), "the dump succeeded with an invalid option");
    let raw = std::fs::read(c.path.join("img-dump.log")).map_err(|e| e.to_string())?;
    ensure!(!raw.contains(&0), "CRIU's log holds a NUL byte");
    let longest = raw
        .split(|&b| b == b'\n')
        .map(<[u8]>::len)
        .max()
        .unwrap_or(0);
    ensure!(longest <= 4096, "a log line of {longest} bytes");
    ensure!(
        d.log.contains("bytes in all)"),
        "the long value is not quoted by length:\n{}",
        tail(&d.log, 10)
    );
    c.check_running()?;
    c.teardown()
}

fn output_held(c: &mut Case) -> R {
    // A site's wrapper: runs the utility, then leaves a process holding its output for 20 s.
    let a = artifacts().as_ref().map_err(Clone::clone)?;
    let wrapper = c.bindir.join("cuda-checkpoint");
    std::fs::remove_file(&wrapper).map_err(|e| e.to_string())?;
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n\"{}\" \"$@\"\nrc=$?\nsleep 20 &\nexit $rc\n",
            a.cuda_checkpoint.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    spawn_pair(c)?;
    let d = c.dump("img", false)?;
    ensure!(
        !d.ok(),
        "the dump succeeded though every run's output stayed open"
    );
    ensure!(
        ms(d.ms) < Duration::from_secs(10),
        "the dump took {:.0} ms: the output pipe was waited for without a bound",
        d.ms
    );
    ensure!(d.log.contains("output stayed open"), "{}", tail(&d.log, 20));
    c.check_running()?;
    c.verify_data()?;
    c.teardown()
}

fn killed_during_lock(c: &mut Case) -> R {
    spawn_pair(c)?;
    let root = c.cuda[0];
    let d = c.images("img")?;
    let r = root.to_string();
    let mut criu = c.criu_spawn(&["dump", "-t", &r, "-D", &d], "img-dump.log")?;
    // Wait until the utility's lock of the root is in flight (hung), then kill CRIU.
    let marker = c.marker();
    let lock_run = || {
        processes_with_env(&marker).into_iter().find(|&p| {
            let cmd = read(Path::new(&format!("/proc/{p}/cmdline"))).replace('\0', " ");
            cmd.contains("--action lock")
        })
    };
    let mut run = None;
    ensure!(
        wait_until(Duration::from_secs(20), || {
            run = lock_run();
            run.is_some()
        }),
        "no cuda-checkpoint lock run appeared"
    );
    let _ = criu.kill();
    let _ = criu.wait();
    let run = run.unwrap_or(0);
    ensure!(
        wait_until(Duration::from_secs(5), || {
            reap();
            !exists(run)
        }),
        "cuda-checkpoint ({run}) outlived CRIU"
    );
    // Were it still alive, releasing the hang now would lock the task with nobody to undo it.
    std::fs::write(c.world.join("release"), "").map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(500));
    ensure!(
        state_of(c, root)? == CudaState::Running,
        "the root was locked after CRIU died"
    );
    c.check_running()?;
    c.verify_data()?;
    c.teardown()
}

fn visible_devices_empty(c: &mut Case) -> R {
    c.extra_env
        .push(("CUDA_VISIBLE_DEVICES".to_owned(), String::new()));
    spawn_pair(c)?;
    let d = c.dump("img", false)?;
    c.expect_ok("dump with CUDA_VISIBLE_DEVICES= in CRIU's environment", &d)?;
    c.wait_tree_gone()?;
    let r = c.restore("img")?;
    c.expect_ok("restore", &r)?;
    c.check_running()?;
    c.verify_data()?;
    c.teardown()
}
