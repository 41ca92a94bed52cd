//! The cases that run the plugin with its `cuda-checkpoint` utility in ways the scenario corpus
//! cannot set up: a wrapper in place of the utility, and CRIU killed while a utility run is in
//! flight. Each was measured failing on the plugin before it was fixed (the closing note of that
//! change names the before and after).
//!
//! | Case | What it checks | Why not a scenario |
//! |---|---|---|
//! | `output-held` (utility) | a `cuda-checkpoint` wrapper leaves a process holding its output: the dump fails within 10 s (the run's deadline), not when that process exits, naming the held output; every task runs with its data | a scenario's `cuda-checkpoint` is the fake utility or none (`[host] cuda_checkpoint`); no fault of the mock world leaves a process holding the utility's output |
//! | `killed-during-lock` (utility) | CRIU is killed (SIGKILL) while a `cuda-checkpoint` lock is in flight: the utility dies with it, and the task is not locked later, once the hang is released | the format cannot kill CRIU at a point of its run (see [`super::KillAt`]) |
//!
//! The other rollback holes this file used to check under real CRIU are scenarios now, on the
//! `criu-4.1` and `criu-4.2` hosts (the table in `real_criu.rs` names them).

use super::*;

/// The world faults of a case, by name (they are installed when the case's world is made).
pub fn faults(case: &str, backend: &str) -> String {
    match case {
        "killed-during-lock" => fault(
            lock_function(backend),
            1,
            r#"{ kind = "hang", file = "release" }"#,
        ),
        _ => String::new(),
    }
}

/// The plugin options of a case.
/// Both pin one task at a time (parallel=auto is the default): their fault numbering and the
/// point where CRIU is killed assume each task's calls in its own hook call.
pub fn options(case: &str) -> &'static str {
    match case {
        "output-held" => "cuda_plugin.timeout=2 cuda_plugin.parallel=1",
        _ => "cuda_plugin.parallel=1",
    }
}

/// A case: its name, its body and the backends it applies to.
pub type HoleCase = (&'static str, fn(&mut Case) -> R, &'static [&'static str]);

/// The cases.
pub fn cases() -> Vec<HoleCase> {
    const CLI: &[&str] = &["cuda-checkpoint"];
    vec![
        ("output-held", output_held as fn(&mut Case) -> R, CLI),
        ("killed-during-lock", killed_during_lock, CLI),
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

/// A site's `cuda-checkpoint` wrapper that leaves a process holding the utility's output.
///
/// Not a scenario: a scenario's `cuda-checkpoint` is the fake utility or none, and no fault of
/// the mock world leaves a process behind holding the utility's output.
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

/// CRIU killed while the utility's lock of the root is in flight (hung until released).
///
/// Not a scenario: nothing in the format kills CRIU at a point of its run (see
/// [`super::KillAt`]), nor releases a hang after the step that ran into it has ended.
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
