//! Processes in pid and mount namespaces of their own, as in a container: the world knows them
//! by their namespace identity and finds them by their host pid, as CRIU and the
//! `cuda-checkpoint` utility name them from the host; and the driver's internal threads.
//!
//! The workloads in namespaces are started with `unshare -p -m -f --mount-proc` (each is pid 1
//! of a pid namespace of its own, with its own `/proc`). Those trials need the right to create
//! namespaces (root): without it they are reported as ignored with the reason (failed instead
//! when `CRIU_CUDA_REQUIRE_NAMESPACES=1`). The `cuda-checkpoint` command line is the driver's
//! own ([`mock_libcuda::cli`], what the utility runs through the export table), run in this
//! process, which lives in the host's namespaces as CRIU does.
//!
//! Run: `cargo test -p mock-libcuda --test namespaces`.

mod common;

use abi::CUprocessState;
use common::*;
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use mock_libcuda::driver::{self, RealDriver};
use mock_libcuda::world::client::{CudaState, MockWorld, Presence};
use mock_libcuda::world::pidns::{self, NsIdentity};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use testkit::proc::{task_stat_state, thread_names};
use testkit::read;
use testkit::wait::wait_for;

type R<T = ()> = Result<T, Failed>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+).into());
        }
    };
}

/// Why namespaces cannot be made here, if they cannot.
fn no_namespaces() -> Option<String> {
    let out = Command::new("unshare")
        .args(["-p", "-m", "-f", "--mount-proc", "true"])
        .stdin(Stdio::null())
        .output();
    match out {
        Err(e) => Some(format!("cannot run unshare: {e}")),
        Ok(o) if !o.status.success() => Some(format!(
            "unshare -p -m -f --mount-proc is refused ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => None,
    }
}

/// Runs `body` unless namespaces cannot be made (then ignored with the reason, or failed when
/// `CRIU_CUDA_REQUIRE_NAMESPACES=1`).
fn with_namespaces(body: fn() -> R) -> R<Completion> {
    if let Some(why) = no_namespaces() {
        if criu_cuda_env::is_on(criu_cuda_env::REQUIRE_NAMESPACES) {
            return Err(format!("{why}, and CRIU_CUDA_REQUIRE_NAMESPACES=1").into());
        }
        return Ok(Completion::ignored_with(why));
    }
    body().map(|()| Completion::Completed)
}

/// A `mock-cuda-app` started as pid 1 of new pid and mount namespaces.
struct NsApp {
    unshare: Child,
    /// Its pid in the host's (this process's) view.
    host_pid: i32,
    report: std::path::PathBuf,
}

impl NsApp {
    fn start(w: &TestWorld, name: &str, args: &[&str]) -> R<NsApp> {
        let report = w.path().join(format!("{name}.report"));
        let mut cmd = Command::new("unshare");
        cmd.args(["-p", "-m", "-f", "--mount-proc", "--kill-child", "--"])
            .arg(env!("CARGO_BIN_EXE_mock-cuda-app"))
            .args(args)
            .arg("--report")
            .arg(&report)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        w.env(&mut cmd);
        let unshare = cmd.spawn().map_err(|e| format!("unshare: {e}"))?;
        let mut app = NsApp {
            host_pid: 0,
            unshare,
            report,
        };
        let u = app.unshare.id();
        wait_for(
            Duration::from_secs(20),
            || read(&app.report).contains("READY") || read(&app.report).contains("FAIL"),
            "the workload in its namespaces to report READY",
        );
        let kids = read(Path::new(&format!("/proc/{u}/task/{u}/children")));
        app.host_pid = kids
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("unshare {u} has no child: {kids:?}"))?;
        ensure!(
            read(&app.report).contains("READY pid=1 "),
            "the workload is pid 1 of its namespace: {}",
            read(&app.report)
        );
        Ok(app)
    }

    /// Asks the workload to check its data (SIGUSR1); its PASS or FAIL line.
    fn verify(&self) -> String {
        let before = read(&self.report).lines().count();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.host_pid),
            nix::sys::signal::Signal::SIGUSR1,
        );
        wait_for(
            Duration::from_secs(20),
            || read(&self.report).lines().count() > before,
            "a verification line",
        );
        read(&self.report)
            .lines()
            .nth(before)
            .unwrap_or_default()
            .to_owned()
    }
}

impl Drop for NsApp {
    fn drop(&mut self) {
        // The namespace's init goes with it (--kill-child), and every process of it with that.
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

/// `cuda-checkpoint ARGS` through the driver's command line: (exit status, stdout, stderr).
fn cli(args: &[&str]) -> (i32, String, String) {
    let argv: Vec<String> = std::iter::once("cuda-checkpoint")
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect();
    let generation = driver::world()
        .map(|w| w.config().driver.cli_generation())
        .expect("a world");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = mock_libcuda::cli::run(&argv, generation, &RealDriver, &mut out, &mut err);
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

fn state_of(pid: i32) -> String {
    let (code, out, err) = cli(&["--get-state", "--pid", &pid.to_string()]);
    format!("{code} {}{}", out.trim(), err.trim())
}

fn config_with(top: &str, driver_extra: &str) -> String {
    format!(
        "{top}\n{}",
        config(580, "").replacen(
            "request_timeout_ms = 1500\n",
            &format!("request_timeout_ms = 1500\n{driver_extra}\n"),
            1
        )
    )
}

fn containers_are_found_by_their_host_pids() -> R {
    let _s = serial();
    let w = TestWorld::new(&config_with("trace_data_path = true", ""));
    let a = NsApp::start(&w, "a", &["--kib", "16"])?;
    let b = NsApp::start(&w, "b", &["--kib", "16", "--gpus", "1"])?;
    let (ha, hb) = (a.host_pid, b.host_pid);
    let ns_a = pidns::pid_ns_of(ha).ok_or("no pid namespace of a")?;
    ensure!(
        pidns::nspid_of(ha) == Some(vec![ha, 1]),
        "NSpid of {ha}: {:?}",
        pidns::nspid_of(ha)
    );
    ensure!(
        pidns::pid_ns_of(hb) != Some(ns_a) && pidns::own_pid_ns() != Some(ns_a),
        "each workload has a pid namespace of its own"
    );

    // Registered with the identity it knows (pid 1 of its namespace); it could not see its
    // host pid.
    let st = w.world.read_state()?;
    let (id_a, e) = st
        .by_identity(NsIdentity { ns: ns_a, pid: 1 })
        .ok_or("no entry for a")?;
    ensure!(
        (e.nspid, e.pid) == (1, 0),
        "a registered as ({}, {})",
        e.nspid,
        e.pid
    );

    // From the host, by host pid: both pid 1s are told apart.
    ensure!(state_of(ha) == "0 running", "{}", state_of(ha));
    ensure!(state_of(hb) == "0 running", "{}", state_of(hb));
    // ... and the world learnt a's host pid from that call.
    let st = w.world.read_state()?;
    ensure!(
        st.processes[&id_a].pid == ha,
        "host pid {}",
        st.processes[&id_a].pid
    );
    // Pid 1 of the host's namespace is not the container's pid 1.
    let (code, _, err) = cli(&["--get-state", "--pid", "1"]);
    ensure!(code == 1, "pid 1 of the host: {code} {err}");

    // The restore thread's tid, as the host sees it.
    let tid = driver::get_restore_tid(ha).map_err(|e| format!("restore tid: {e}"))?;
    let names = thread_names(ha);
    ensure!(
        names
            .iter()
            .any(|(t, n)| *t == tid && *n == pidns::restore_thread_name(id_a)),
        "tid {tid} is not {}'s restore thread: {names:?}",
        pidns::restore_thread_name(id_a)
    );

    // A whole cycle of one, through the utility's command line; the other is untouched.
    let h = ha.to_string();
    for (action, after) in [
        ("lock", "locked"),
        ("checkpoint", "checkpointed"),
        ("restore", "locked"),
    ] {
        let (code, _, err) = cli(&["--action", action, "--pid", &h]);
        ensure!(code == 0, "--action {action}: {code} {err}");
        ensure!(
            state_of(ha) == format!("0 {after}"),
            "after {action}: {}",
            state_of(ha)
        );
        ensure!(state_of(hb) == "0 running", "b: {}", state_of(hb));
    }
    let (code, _, err) = cli(&["--action", "unlock", "--pid", &h]);
    ensure!(code == 0, "--action unlock: {code} {err}");
    ensure!(driver::get_state(ha) == Ok(CUprocessState::RUNNING), "a");
    let v = a.verify();
    ensure!(v.starts_with("PASS pid=1 "), "a's data: {v}");
    let v = b.verify();
    ensure!(v.starts_with("PASS pid=1 "), "b's data: {v}");

    // The trace names the workload's own calls by its namespace identity, the host's calls
    // by their pid.
    let trace = w.world.read_trace();
    let lock = format!("cuCheckpointProcessLock(pid={ha}, ");
    ensure!(
        mock_cuda_world::trace::calls_by(&trace, &std::process::id().to_string())
            .iter()
            .any(|c| c.starts_with(&lock)),
        "no {lock:?} of this process in\n{trace}"
    );
    let own = format!("1@pid:[{ns_a}] mock-cuda-app cuMemAlloc(");
    ensure!(trace.contains(&own), "no {own:?} in\n{trace}");

    // The status (what `mock-world status` prints) shows the host pid and the namespace pid.
    let st = MockWorld::open(w.path())?.status()?;
    let p = st
        .process(ha)
        .ok_or_else(|| format!("no process {ha}:\n{}", st.table()))?;
    ensure!(
        p.state() == CudaState::Running
            && p.present == Presence::Here
            && p.host_pid() == Some(ha)
            && p.entry.nspid == 1
            && p.entry.pid_ns == ns_a
            && p.restore_tid_here().is_some(),
        "{p:?}"
    );
    let status = st.table();
    let row = status
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&h))
        .ok_or_else(|| format!("no row for {ha}:\n{status}"))?;
    let cols: Vec<&str> = row.split_whitespace().collect();
    ensure!(
        cols.get(2) == Some(&"running")
            && cols.get(6) == Some(&"1")
            && cols.get(7) == Some(&ns_a.to_string().as_str()),
        "{row}"
    );
    ensure!(
        status.lines().next().is_some_and(|l| l.contains("nspid")),
        "{status}"
    );
    Ok(())
}

fn a_process_known_by_an_old_identity_is_found_by_its_restore_thread() -> R {
    let _s = serial();
    let w = TestWorld::new(&config(580, ""));
    let a = NsApp::start(&w, "a", &["--kib", "16"])?;
    let ha = a.host_pid;
    let ns = pidns::pid_ns_of(ha).ok_or("no pid namespace")?;
    // What the world holds of a process CRIU restored into new namespaces: the identity and
    // host pid it had before.
    let stale = NsIdentity { ns: 1, pid: 1 };
    let id = w.world.update(|st| {
        let (id, _) = st.by_identity(NsIdentity { ns, pid: 1 })?;
        let e = st.processes.get_mut(&id)?;
        (e.pid_ns, e.nspid, e.pid) = (stale.ns, stale.pid, 999_999);
        Some(id)
    })?;
    let id = id.ok_or("no entry")?;
    ensure!(state_of(ha) == "0 running", "{}", state_of(ha));
    let st = w.world.read_state()?;
    let e = &st.processes[&id];
    ensure!(
        (e.pid_ns, e.nspid, e.pid) == (ns, 1, ha),
        "re-keyed to ({}, {}, {}), not ({ns}, 1, {ha})",
        e.pid_ns,
        e.nspid,
        e.pid
    );
    ensure!(
        st.processes.len() == 1,
        "still one process: {:?}",
        st.processes.keys()
    );
    let (code, _, err) = cli(&["--action", "lock", "--pid", &ha.to_string()]);
    ensure!(code == 0, "lock: {code} {err}");
    ensure!(state_of(ha) == "0 locked", "{}", state_of(ha));
    Ok(())
}

fn internal_threads_start_with_cuinit_and_never_end() -> R {
    let _s = serial();
    let mut w = TestWorld::new(&config_with("", "internal_threads = 3"));
    let count = |pid: i32, name: &str| thread_names(pid).iter().filter(|(_, n)| n == name).count();
    // Two GPUs: a context on each; the threads start once.
    let pid = w.spawn_app(&["--gpus", "0,1", "--kib", "16"]);
    ensure!(
        count(pid, mock_libcuda::target::INTERNAL_THREAD_NAME) == 3,
        "{:?}",
        thread_names(pid)
    );
    let restore = thread_names(pid)
        .iter()
        .filter(|(_, n)| pidns::parse_restore_thread_name(n).is_some())
        .count();
    ensure!(restore == 1, "one restore thread: {:?}", thread_names(pid));
    // They sleep (a futex wait), and a checkpoint cycle leaves them alone.
    driver::init(0).map_err(|e| format!("cuInit: {e}"))?;
    driver::lock(pid, 0).map_err(|e| format!("lock: {e}"))?;
    driver::checkpoint(pid).map_err(|e| format!("checkpoint: {e}"))?;
    driver::restore(pid, &[]).map_err(|e| format!("restore: {e}"))?;
    driver::unlock(pid).map_err(|e| format!("unlock: {e}"))?;
    for (tid, n) in thread_names(pid) {
        if n == mock_libcuda::target::INTERNAL_THREAD_NAME {
            let state = task_stat_state(pid, tid);
            ensure!(state == Some('S'), "thread {tid} is not asleep: {state:?}");
        }
    }
    ensure!(
        count(pid, mock_libcuda::target::INTERNAL_THREAD_NAME) == 3,
        "still three"
    );
    ensure!(w.verify(0, pid).starts_with("PASS"), "data");
    // A process that never calls cuInit has none.
    let cpu = w.spawn_app(&["--cpu-only"]);
    ensure!(
        count(cpu, mock_libcuda::target::INTERNAL_THREAD_NAME) == 0,
        "{:?}",
        thread_names(cpu)
    );
    // Without the setting, none.
    drop(w);
    let mut w = TestWorld::new(&config(580, ""));
    let pid = w.spawn_app(&["--kib", "16"]);
    ensure!(
        count(pid, mock_libcuda::target::INTERNAL_THREAD_NAME) == 0,
        "{:?}",
        thread_names(pid)
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let trials = vec![
        Trial::ignorable_test("containers_are_found_by_their_host_pids", || {
            with_namespaces(containers_are_found_by_their_host_pids)
        }),
        Trial::ignorable_test(
            "a_process_known_by_an_old_identity_is_found_by_its_restore_thread",
            || with_namespaces(a_process_known_by_an_old_identity_is_found_by_its_restore_thread),
        ),
        Trial::test("internal_threads_start_with_cuinit_and_never_end", || {
            internal_threads_start_with_cuinit_and_never_end()
        }),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}
