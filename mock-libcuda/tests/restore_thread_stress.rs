//! Full-mode stress test: the restore threads of a CUDA tree serve lock, checkpoint, restore and
//! unlock while every other thread of the tree is frozen at an arbitrary point, as CRIU freezes
//! the tasks it dumps: `PTRACE_SEIZE` and `PTRACE_INTERRUPT` of every thread, then each driver
//! call made with only the task's restore thread resumed, exactly as the plugin resumes it
//! (`plugin/src/ffi/ptrace.rs`: every signal but SIGTRAP blocked, options cleared, then
//! `PTRACE_INTERRUPT` and CRIU's options and mask back). Hundreds of cycles run under a CPU hog;
//! whatever a frozen workload thread holds, every request must be answered well inside the
//! world's request timeout.
//!
//! The tree is the real-CRIU cases' pair (a CUDA root and a CUDA child), busier: worker threads
//! and a "kernel" thread that keep calling into the driver, and data checks every millisecond. Each cycle takes the
//! tree the way a dump does (CRIU's order: each task locked while it runs, then seized; or, at
//! random, seized first and locked through its restore thread), checkpoints every task, then
//! rolls back (restore and unlock), and lets the tree run a random while.
//!
//! Slow (500 cycles take about half a minute on 2 cores, more under load), so it runs only
//! in full mode:
//!
//! ```text
//! CRIU_CUDA_FULL=1 cargo test -p mock-libcuda --test restore_thread_stress
//! ```
//!
//! `CRIU_CUDA_STRESS_RUNS` sets the number of cycles (default 500), `CRIU_CUDA_STRESS_SEED` the
//! seed of the random choices and pauses (default: drawn, and printed). It traces its workload
//! (ptrace): as root, or where Yama lets a parent trace its child. On a hang it fails naming
//! the seed and the cycle, with each thread's state, kernel wait channel and stack, the futex a
//! blocked thread waits on and the user-space PC of the frozen ones (symbolised), and a gdb
//! backtrace of every thread when gdb is installed.

mod common;

use common::*;
use libtest_mimic::{Arguments, Failed, Trial};
use mock_libcuda::driver;
use nix::sys::ptrace;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::fmt::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The variable that turns the full-mode tests on.
const FULL_ENV: &str = criu_cuda_env::FULL;
/// Cycles to run.
const RUNS_ENV: &str = criu_cuda_env::STRESS_RUNS;
const DEFAULT_RUNS: u64 = 500;
/// The seed of the random choices.
const SEED_ENV: &str = criu_cuda_env::STRESS_SEED;

/// The world's request timeout: a request unanswered this long is a hang (a healthy one takes
/// milliseconds, even on a loaded machine).
const REQUEST_TIMEOUT_MS: u64 = 5000;
/// A lock's own timeout. A lock waits for the calls inside the API gate, so one made through a
/// frozen task's restore thread is refused (`CUDA_ERROR_NOT_READY`) when a workload thread
/// froze inside the gate: an answer, not a hang (and why CRIU locks a task before it seizes it).
const LOCK_TIMEOUT_MS: u32 = 100;
/// How long a thread may take to stop after `PTRACE_INTERRUPT`.
const STOP_LIMIT: Duration = Duration::from_secs(10);

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let trial = Trial::test(
        "restore_threads_serve_every_request_while_their_tasks_are_frozen",
        stress,
    );
    let trial = if std::env::var(FULL_ENV).as_deref() == Ok("1") {
        trial
    } else {
        eprintln!(
            "note: {} is ignored: a full-mode stress test; run it with \
             {FULL_ENV}=1 cargo test -p mock-libcuda --test restore_thread_stress \
             ({RUNS_ENV}=N cycles, default {DEFAULT_RUNS})",
            trial.name()
        );
        trial.with_ignored_flag(true)
    };
    libtest_mimic::run(&args, vec![trial]).exit_code()
}

/// A small xorshift generator: a run is reproducible from its seed (up to the scheduler).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A pause of up to `max_us` microseconds.
    fn pause(&mut self, max_us: u64) -> Duration {
        Duration::from_micros(self.next() % (max_us + 1))
    }
}

/// Busy-looping processes, one more than the CPUs, killed on drop.
struct Hog(Vec<Child>);

impl Hog {
    fn start() -> Hog {
        let n = std::thread::available_parallelism().map_or(2, usize::from) + 1;
        let hogs = (0..n)
            .map(|_| {
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdin(Stdio::null())
                    .spawn()
                    .expect("starting a CPU hog")
            })
            .collect();
        Hog(hogs)
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn tid(t: i32) -> Pid {
    Pid::from_raw(t)
}

/// Waits until traced thread `t` reports a stop (bounded).
fn wait_stop(t: i32) -> Result<(), String> {
    let start = Instant::now();
    loop {
        match waitpid(tid(t), Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR) => {}
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => {
                return Err(format!("thread {t} ended"))
            }
            Ok(_) => return Ok(()),
            Err(e) => return Err(format!("waitpid({t}): {e}")),
        }
        if start.elapsed() > STOP_LIMIT {
            return Err(format!(
                "thread {t} did not stop within {STOP_LIMIT:?} of PTRACE_INTERRUPT"
            ));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Threads this test holds seized and stopped; detached (so resumed) on drop.
#[derive(Default)]
struct Frozen {
    tids: Vec<i32>,
}

impl Frozen {
    /// Seizes and stops every thread of `pid`, as CRIU does.
    fn freeze(&mut self, pid: i32) -> Result<(), String> {
        let fresh: Vec<i32> = testkit::proc::threads(pid);
        for &t in &fresh {
            ptrace::seize(tid(t), ptrace::Options::PTRACE_O_TRACESYSGOOD)
                .map_err(|e| format!("PTRACE_SEIZE {t}: {e}"))?;
            self.tids.push(t);
        }
        for &t in &fresh {
            ptrace::interrupt(tid(t)).map_err(|e| format!("PTRACE_INTERRUPT {t}: {e}"))?;
        }
        for &t in &fresh {
            wait_stop(t)?;
        }
        Ok(())
    }

    /// Runs `call` with only thread `t` resumed, then stops it again, as the plugin does.
    fn with_running<T>(&self, t: i32, call: impl FnOnce() -> T) -> Result<T, String> {
        let saved = ffi::sigmask(t).map_err(|e| format!("PTRACE_GETSIGMASK {t}: {e}"))?;
        ffi::set_sigmask(t, !(1u64 << (libc::SIGTRAP - 1)))
            .map_err(|e| format!("PTRACE_SETSIGMASK {t}: {e}"))?;
        ptrace::setoptions(tid(t), ptrace::Options::empty())
            .map_err(|e| format!("PTRACE_SETOPTIONS {t}: {e}"))?;
        ptrace::cont(tid(t), None).map_err(|e| format!("PTRACE_CONT {t}: {e}"))?;
        let r = call();
        ptrace::interrupt(tid(t)).map_err(|e| format!("PTRACE_INTERRUPT {t}: {e}"))?;
        wait_stop(t)?;
        ptrace::setoptions(tid(t), ptrace::Options::PTRACE_O_TRACESYSGOOD)
            .map_err(|e| format!("PTRACE_SETOPTIONS {t}: {e}"))?;
        ffi::set_sigmask(t, saved).map_err(|e| format!("PTRACE_SETSIGMASK {t}: {e}"))?;
        Ok(r)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for &t in &self.tids {
            let _ = ptrace::detach(tid(t), None);
        }
    }
}

/// The signal-mask requests nix does not wrap.
mod ffi {
    /// `PTRACE_GETSIGMASK` of stopped tracee `tid`.
    pub fn sigmask(tid: i32) -> std::io::Result<u64> {
        let mut mask: u64 = 0;
        // SAFETY: a ptrace request on a tracee this process holds stopped; `data` points to a
        // live 8-byte mask and `addr` is its size, as PTRACE_GETSIGMASK defines.
        let r = unsafe {
            libc::ptrace(
                libc::PTRACE_GETSIGMASK,
                tid,
                std::mem::size_of::<u64>(),
                &raw mut mask,
            )
        };
        if r == -1 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(mask)
    }

    /// `PTRACE_SETSIGMASK` of stopped tracee `tid`.
    pub fn set_sigmask(tid: i32, mut mask: u64) -> std::io::Result<()> {
        // SAFETY: as in `sigmask`; the kernel only reads the 8-byte mask.
        let r = unsafe {
            libc::ptrace(
                libc::PTRACE_SETSIGMASK,
                tid,
                std::mem::size_of::<u64>(),
                &raw mut mask,
            )
        };
        if r == -1 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// What `/proc` tells of each thread of `pid`: state, wait channel, system call, the futex word
/// a blocked thread waits on, its kernel stack, and the user-space PC of a thread this test
/// holds stopped (each address symbolised from its mapping, with `addr2line` where installed).
fn evidence(pid: i32, frozen: &Frozen) -> String {
    let mut out = String::new();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    for t in testkit::proc::threads(pid) {
        let f = |name: &str| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{t}/{name}"))
                .unwrap_or_else(|e| format!("({e})"))
        };
        let stat = f("stat");
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next())
            .unwrap_or("?");
        let syscall = f("syscall");
        let _ = writeln!(
            out,
            "thread {t} {:?}: state {state}, wchan {}, syscall {}",
            f("comm").trim(),
            f("wchan").trim(),
            syscall.trim()
        );
        if let Some(word) = syscall
            .strip_prefix(&format!("{} ", libc::SYS_futex))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
        {
            let _ = writeln!(out, "  waits on futex {word:#x}: {}", locate(&maps, word));
        }
        for line in f("stack").lines() {
            let _ = writeln!(out, "  {line}");
        }
        if frozen.tids.contains(&t) {
            if let Some(pc) = pc_of(t) {
                let _ = writeln!(out, "  frozen at {pc:#x}: {}", locate(&maps, pc));
            }
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
fn pc_of(t: i32) -> Option<u64> {
    ptrace::getregs(tid(t)).ok().map(|r| r.rip)
}

#[cfg(not(target_arch = "x86_64"))]
fn pc_of(_t: i32) -> Option<u64> {
    None
}

/// The mapping of `/proc/<pid>/maps` an address falls in, as "file+address (symbol)": the
/// function and line of code (`addr2line`), or the variable of data (`nm`), where installed.
fn locate(maps: &str, addr: u64) -> String {
    // (start, end, file offset, path) of each mapping.
    let regions: Vec<(u64, u64, u64, &str)> = maps
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (a, b) = f.first()?.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
                u64::from_str_radix(f.get(2)?, 16).ok()?,
                f.get(5).copied().unwrap_or("[anonymous]"),
            ))
        })
        .collect();
    let Some(&(start, _, _, path)) = regions.iter().find(|r| (r.0..r.1).contains(&addr)) else {
        return "unmapped".to_owned();
    };
    if !path.starts_with('/') {
        return format!("{path}+{:#x}", addr - start);
    }
    // The object's load address: where its first page (file offset 0) is mapped.
    let base = regions
        .iter()
        .find(|r| r.3 == path && r.2 == 0)
        .map_or(start, |r| r.0);
    let at = addr - base;
    let run = |cmd: &mut Command| {
        cmd.stderr(Stdio::null())
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let code = run(Command::new("addr2line").args(["-f", "-C", "-e", path, &format!("{at:#x}")]));
    let code = code.trim().replace('\n', " at ");
    let symbol = if code.is_empty() || code.starts_with("??") {
        // Data: the nearest symbol at or below the address.
        run(Command::new("nm").args(["-C", "--defined-only", path]))
            .lines()
            .filter_map(|l| {
                let (a, rest) = l.split_once(' ')?;
                Some((u64::from_str_radix(a, 16).ok()?, rest.get(2..)?.to_owned()))
            })
            .filter(|(a, _)| *a <= at)
            .max_by_key(|(a, _)| *a)
            .map(|(a, name)| format!("{name}+{:#x}", at - a))
            .unwrap_or(code)
    } else {
        code
    };
    format!("{path}+{at:#x} ({symbol})")
}

/// A backtrace of every thread of `pids` from gdb, if installed. Each process is stopped first
/// (a SIGSTOP, pending while this test holds it) and then detached, so that whatever its
/// threads hold stays held while gdb looks.
fn gdb_backtraces(pids: &[i32], frozen: Frozen) -> String {
    for &p in pids {
        let _ = nix::sys::signal::kill(tid(p), nix::sys::signal::Signal::SIGSTOP);
    }
    drop(frozen);
    let mut out = String::new();
    for &p in pids {
        let bt = testkit::wait::output_within(
            Command::new("gdb").args([
                "-p",
                &p.to_string(),
                "-batch",
                "-nx",
                "-ex",
                "set pagination off",
                "-ex",
                "thread apply all bt 25",
            ]),
            Duration::from_secs(120),
            "gdb",
        );
        let _ = match bt {
            Ok(o) => writeln!(out, "pid {p}:\n{}", String::from_utf8_lossy(&o.stdout)),
            Err(e) => writeln!(out, "pid {p}: no backtrace: {e}"),
        };
    }
    out
}

/// Kills a process this test did not start itself (the workload's child) on drop.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(tid(self.0), nix::sys::signal::Signal::SIGCONT);
        let _ = nix::sys::signal::kill(tid(self.0), nix::sys::signal::Signal::SIGKILL);
    }
}

/// A CUDA task of the tree.
#[derive(Clone, Copy)]
struct Task {
    pid: i32,
    restore_tid: i32,
}

/// How a cycle ended, when no request hung.
enum Cycle {
    /// Every task locked, checkpointed, restored and unlocked.
    Full,
    /// A lock was refused (`CUDA_ERROR_NOT_READY`: a workload thread frozen inside the API
    /// gate); every task locked so far, and the refused one, were unlocked.
    LockRefused,
}

/// A failed cycle: what failed.
struct Stuck(String);

/// Runs `op` with only `task`'s restore thread running; its result, or what went wrong with
/// the thread control.
fn served(
    f: &Frozen,
    task: Task,
    what: &str,
    op: impl FnOnce() -> Result<(), abi::CUresult>,
) -> Result<Result<(), abi::CUresult>, Stuck> {
    f.with_running(task.restore_tid, op)
        .map_err(|e| Stuck(format!("{what} pid {}: {e}", task.pid)))
}

/// [`served`], for a call that must succeed: any other result fails the cycle, naming the call
/// and how long it took (a `CUDA_ERROR_TIMEOUT` is a request its restore thread never answered).
fn must(
    f: &Frozen,
    task: Task,
    what: &str,
    op: impl FnOnce() -> Result<(), abi::CUresult>,
) -> Result<(), Stuck> {
    let start = Instant::now();
    served(f, task, what, op)?.map_err(|code| {
        Stuck(format!(
            "{what} pid {} returned {code} after {:.1} s",
            task.pid,
            start.elapsed().as_secs_f64()
        ))
    })
}

/// One cycle over the tree (see the module documentation). `frozen` collects the seized
/// threads; the caller detaches them.
fn cycle(tasks: &[Task], rng: &mut Rng, frozen: &mut Frozen) -> Result<Cycle, Stuck> {
    let lock_first = rng.next().is_multiple_of(2);
    let mut locked: Vec<Task> = Vec::new();
    let mut refused = None;
    for &t in tasks {
        let start = Instant::now();
        let r = if lock_first {
            // PAUSE_DEVICES: the task still runs; CRIU seizes it as soon as the lock returns.
            let r = driver::lock(t.pid, LOCK_TIMEOUT_MS);
            frozen.freeze(t.pid).map_err(Stuck)?;
            r
        } else {
            frozen.freeze(t.pid).map_err(Stuck)?;
            served(frozen, t, "lock", || driver::lock(t.pid, LOCK_TIMEOUT_MS))?
        };
        match r {
            Ok(()) => locked.push(t),
            Err(abi::CUresult::ERROR_NOT_READY) => {
                refused = Some(t);
                break;
            }
            Err(code) => {
                return Err(Stuck(format!(
                    "lock pid {} returned {code} after {:.1} s",
                    t.pid,
                    start.elapsed().as_secs_f64()
                )))
            }
        }
    }
    if let Some(t) = refused {
        for &l in &locked {
            must(frozen, l, "unlock", || driver::unlock(l.pid))?;
        }
        // A refused lock may still land after its caller gave up (its restore thread took the
        // request late): the unlock that follows it must be answered, either way.
        let start = Instant::now();
        match served(frozen, t, "unlock", || driver::unlock(t.pid))? {
            Ok(()) | Err(abi::CUresult::ERROR_ILLEGAL_STATE) => {}
            Err(code) => {
                return Err(Stuck(format!(
                    "unlock pid {} after its refused lock returned {code} after {:.1} s",
                    t.pid,
                    start.elapsed().as_secs_f64()
                )))
            }
        }
        return Ok(Cycle::LockRefused);
    }
    for &t in tasks {
        must(frozen, t, "checkpoint", || driver::checkpoint(t.pid))?;
    }
    for &t in tasks {
        must(frozen, t, "restore", || driver::restore(t.pid, &[]))?;
    }
    for &t in tasks {
        must(frozen, t, "unlock", || driver::unlock(t.pid))?;
    }
    Ok(Cycle::Full)
}

fn stress() -> Result<(), Failed> {
    let runs: u64 = match std::env::var(RUNS_ENV) {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("{RUNS_ENV}={v:?} is not a number"))?,
        Err(_) => DEFAULT_RUNS,
    };
    let seed: u64 = match std::env::var(SEED_ENV) {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("{SEED_ENV}={v:?} is not a number"))?,
        Err(_) => {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        }
    };
    eprintln!("restore thread stress: {runs} cycles, {SEED_ENV}={seed}");
    let _s = serial();
    let mut w = TestWorld::new(&testkit::world::two_h100(
        580,
        &format!("request_timeout_ms = {REQUEST_TIMEOUT_MS}\ninternal_threads = 1"),
    ));
    // Busy tasks: a "kernel" thread that calls cuCtxSynchronize back to back (a kernel of 0
    // ms), worker threads, data checks every millisecond.
    let root = w.spawn_app(&[
        "--kib",
        "32",
        "--threads",
        "2",
        "--kernel-ms",
        "0",
        "--check-ms",
        "1",
        "--children",
        "1",
        "--child-args",
        "--kib 16 --threads 1 --kernel-ms 0 --check-ms 1",
    ]);
    testkit::wait::wait_for(
        Duration::from_secs(20),
        || w.report(0).matches("READY").count() >= 2,
        "the child to report READY",
    );
    let child: i32 = w
        .report(0)
        .lines()
        .filter_map(|l| {
            l.strip_prefix("READY pid=")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .find(|&p| p != root)
        .ok_or_else(|| format!("no READY line of the child: {}", w.report(0)))?;
    driver::init(0).map_err(|e| format!("cuInit: {e}"))?;
    let mut tasks = Vec::new();
    for pid in [root, child] {
        let restore_tid =
            driver::get_restore_tid(pid).map_err(|e| format!("restore tid of {pid}: {e}"))?;
        tasks.push(Task { pid, restore_tid });
    }
    let pids = [root, child];
    // The world's drop kills the root; the child, which it started, is this test's to end.
    let _child = KillOnDrop(child);
    let hog = Hog::start();
    let mut rng = Rng(seed);
    let (mut full, mut refused) = (0u64, 0u64);
    let start = Instant::now();
    for i in 1..=runs {
        // Let the tree run a random while, so the next freeze lands anywhere in its calls.
        std::thread::sleep(rng.pause(3000));
        let mut frozen = Frozen::default();
        match cycle(&tasks, &mut rng, &mut frozen) {
            Ok(Cycle::Full) => full += 1,
            Ok(Cycle::LockRefused) => refused += 1,
            Err(Stuck(what)) => {
                let mut view = String::new();
                for t in &tasks {
                    let _ = writeln!(
                        view,
                        "pid {} (restore thread {}):\n{}",
                        t.pid,
                        t.restore_tid,
                        evidence(t.pid, &frozen)
                    );
                }
                let bt = gdb_backtraces(&pids, frozen);
                drop(hog);
                return Err(format!(
                    "cycle {i} of {runs} ({SEED_ENV}={seed}): {what}\n{view}gdb:\n{bt}"
                )
                .into());
            }
        }
        drop(frozen);
    }
    drop(hog);
    eprintln!(
        "restore thread stress: {runs} cycles in {:.1} s: {full} full, {refused} with a lock \
         refused (a thread frozen in the API gate)",
        start.elapsed().as_secs_f64()
    );
    for pid in pids {
        assert_eq!(
            driver::get_state(pid),
            Ok(abi::CUprocessState::RUNNING),
            "pid {pid} after the cycles"
        );
    }
    let line = w.verify(0, root);
    assert!(line.starts_with("PASS"), "{line}");
    Ok(())
}
