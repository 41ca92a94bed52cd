//! The real [`ThreadControl`]: ptrace from CRIU's main thread, which is the tracer (ptrace
//! requests are only accepted from the thread that seized the task). See [`crate::thread`] for
//! the sequence and why.

use crate::task::{Pid, Tid};
use crate::thread::{tracer_and_seccomp, Resumed, ThreadControl, ThreadError};
use std::ffi::{c_long, c_void};
use std::time::{Duration, Instant};

/// How long to wait for the thread to stop after `PTRACE_INTERRUPT`.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// ptrace-based thread control.
#[derive(Debug, Default)]
pub struct Ptrace;

fn request(
    step: &'static str,
    req: libc::c_uint,
    tid: Tid,
    addr: *mut c_void,
    data: *mut c_void,
) -> Result<c_long, ThreadError> {
    // SAFETY: a ptrace request on a thread this process traces; `addr` and `data` are either
    // integers as the request defines them or pointers to live locals of the right size (the
    // 8-byte signal mask for GET/SETSIGMASK).
    let r = unsafe { libc::ptrace(req, tid, addr, data) };
    if r == -1 {
        let errno = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        return Err(ThreadError::Ptrace { step, tid, errno });
    }
    Ok(r)
}

fn set_options(tid: Tid, options: libc::c_int) -> Result<(), ThreadError> {
    request(
        "PTRACE_SETOPTIONS",
        libc::PTRACE_SETOPTIONS as libc::c_uint,
        tid,
        std::ptr::null_mut(),
        options as usize as *mut c_void,
    )
    .map(drop)
}

fn set_mask(tid: Tid, mut mask: u64) -> Result<(), ThreadError> {
    request(
        "PTRACE_SETSIGMASK",
        libc::PTRACE_SETSIGMASK,
        tid,
        std::mem::size_of::<u64>() as *mut c_void,
        (&raw mut mask).cast(),
    )
    .map(drop)
}

/// The options CRIU's seize leaves on a thread, restored after our PTRACE_CONT window:
/// `PTRACE_O_TRACESYSGOOD` on every thread, and `PTRACE_O_SUSPEND_SECCOMP` only on one with a
/// seccomp mode (compel's `compel_wait_task`, `ss->seccomp_mode != SECCOMP_MODE_DISABLED`).
/// Suspending seccomp needs CAP_SYS_ADMIN, so it is only asked for where CRIU asked for it.
fn criu_options(seccomp: bool) -> libc::c_int {
    if seccomp {
        libc::PTRACE_O_SUSPEND_SECCOMP | libc::PTRACE_O_TRACESYSGOOD
    } else {
        libc::PTRACE_O_TRACESYSGOOD
    }
}

/// Restores CRIU's options on a stopped thread; a refused seccomp suspension is named as such.
fn restore_options(tid: Tid, seccomp: bool) -> Result<(), ThreadError> {
    set_options(tid, criu_options(seccomp)).map_err(|e| match e {
        ThreadError::Ptrace { errno, .. } if seccomp && errno == libc::EPERM => {
            ThreadError::SeccompSuspend { tid, errno }
        }
        e => e,
    })
}

/// One look (`waitpid(WNOHANG | __WALL)`, retried on EINTR) for a stop notification of `tid`:
/// the wait status of a stop that has not been waited for yet, `None` when there is none.
fn poll_stop(tid: Tid) -> Result<Option<libc::c_int>, ThreadError> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid on a traced thread with a valid status out-pointer; WNOHANG never blocks.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == tid {
            if libc::WIFSTOPPED(status) {
                return Ok(Some(status));
            }
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                return Err(ThreadError::Gone { tid });
            }
            // A continue notification (WCONTINUED is not asked for): nothing to report.
            return Ok(None);
        }
        if r == -1 {
            let errno = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if errno == libc::EINTR {
                continue;
            }
            return Err(ThreadError::Ptrace {
                step: "waitpid",
                tid,
                errno,
            });
        }
        return Ok(None);
    }
}

/// Whether a wait status is a ptrace event stop (`PTRACE_EVENT_STOP`: the stop a
/// `PTRACE_INTERRUPT` or a group-stop puts a seized thread in, the stop CRIU leaves its threads
/// in) rather than a signal-delivery-stop.
fn is_event_stop(status: libc::c_int) -> bool {
    status >> 16 == libc::PTRACE_EVENT_STOP
}

/// Waits (polling, with a deadline) until `tid` reports a stop, and returns its wait status.
/// The polls back off from 10 µs to 200 µs: a thread usually stops within tens of microseconds
/// of PTRACE_INTERRUPT.
///
/// Normally that is the PTRACE_EVENT_STOP our PTRACE_INTERRUPT asked for, the same stop CRIU
/// left the thread in. While resumed the thread blocks every signal but SIGTRAP, so another kind
/// of stop (a signal-delivery-stop for SIGTRAP or SIGSTOP) is unlikely; [`Ptrace::restop`]
/// deals with one.
fn wait_stopped(tid: Tid) -> Result<libc::c_int, ThreadError> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(10);
    loop {
        if let Some(status) = poll_stop(tid)? {
            return Ok(status);
        }
        if start.elapsed() >= STOP_TIMEOUT {
            return Err(ThreadError::StopTimeout {
                tid,
                secs: STOP_TIMEOUT.as_secs(),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_micros(200));
    }
}

fn cont(tid: Tid) -> Result<(), ThreadError> {
    request(
        "PTRACE_CONT",
        libc::PTRACE_CONT as libc::c_uint,
        tid,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    )
    .map(drop)
}

fn interrupt(tid: Tid) -> Result<(), ThreadError> {
    request(
        "PTRACE_INTERRUPT",
        libc::PTRACE_INTERRUPT,
        tid,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    )
    .map(drop)
}

/// How long [`Ptrace::resume`] watches a thread it continued that is runnable and has been on a
/// CPU, or one in a traced stop whose notification has not come, before it takes the thread as
/// running, or as stopped. Only where the kernel does not say whether the thread has been on a
/// CPU ([`crate::thread::times_scheduled`]) is a runnable thread watched for this long. A thread
/// that blocks (the restore thread waits for requests) is confirmed as soon as it does, within
/// microseconds.
pub const CONFIRM_WINDOW: Duration = Duration::from_millis(10);

/// How long [`Ptrace::resume`] waits for a thread it continued to get onto a CPU at all (a
/// loaded host) before it takes it as running without having seen it run.
pub const RUN_WAIT: Duration = Duration::from_secs(1);

/// How many more times [`Ptrace::resume`] continues a thread that stopped again at once.
pub const CONT_RETRIES: u32 = 3;

/// How long [`Ptrace::restop`] waits for the notification of a thread it finds stopped already
/// (`t` in `/proc`) before it takes the stop as one whose notification was waited for elsewhere.
const NOTIFY_GRACE: Duration = Duration::from_millis(1);

/// What [`watch`] saw of a thread after a `PTRACE_CONT`.
enum Seen {
    /// It runs: it blocked, or it is runnable after having been on a CPU.
    Runs,
    /// It stopped again (a stop notification, or a traced stop that lasted).
    Stopped,
}

/// `PTRACE_CONT`s `tid`, which is in a ptrace stop, and confirms that it runs, continuing it
/// again when it stopped again at once (a trap queued by a `PTRACE_INTERRUPT` sent while it was
/// stopped already, see [`crate::thread`]), at most [`CONT_RETRIES`] times.
///
/// A signal that stops it in the window (only SIGTRAP and SIGSTOP can: every other one is
/// blocked) is discarded, as it was before when the thread was continued or detached with no
/// signal.
///
/// On [`ThreadError::StopsAtOnce`] and on a failed `PTRACE_CONT` the thread is stopped; on
/// [`ThreadError::Gone`] it is gone.
fn cont_confirmed(pid: Pid, tid: Tid) -> Result<(), ThreadError> {
    let mut conts: u32 = 0;
    loop {
        // Stopped, so the count holds still until the PTRACE_CONT.
        let before = crate::thread::times_scheduled(pid, tid);
        cont(tid)?;
        conts += 1;
        match watch(pid, tid, before)? {
            Seen::Runs => return Ok(()),
            Seen::Stopped if conts > CONT_RETRIES => {
                return Err(ThreadError::StopsAtOnce { pid, tid, conts })
            }
            Seen::Stopped => {}
        }
    }
}

/// Watches `tid` right after a `PTRACE_CONT` (`before`: how often it had been scheduled then).
///
/// Once `PTRACE_CONT` returns, the kernel shows the thread runnable (`R`) until it has run, so a
/// thread seen sleeping (`S`, `D`) has run since and got past the point where a queued trap
/// stops it: it runs. So does one seen runnable after it has been on a CPU since (the count is
/// read before the state: a thread that ran into a trap shows `t`). A stop notification, or a
/// traced stop (`t`) that lasts [`CONFIRM_WINDOW`] without one, is a stop at once.
fn watch(pid: Pid, tid: Tid, before: Option<u64>) -> Result<Seen, ThreadError> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(10);
    loop {
        let ran = before.and_then(|b| Some(crate::thread::times_scheduled(pid, tid)? > b));
        if poll_stop(tid)?.is_some() {
            return Ok(Seen::Stopped);
        }
        let waited = start.elapsed();
        match crate::thread::thread_state(pid, tid) {
            None | Some('Z' | 'X' | 'x') => return Err(ThreadError::Gone { tid }),
            // Stopped: its notification is due.
            Some('t' | 'T') if waited >= CONFIRM_WINDOW => return Ok(Seen::Stopped),
            Some('t' | 'T') => {}
            Some('R') => match ran {
                Some(true) => return Ok(Seen::Runs),
                // Not on a CPU yet.
                Some(false) if waited >= RUN_WAIT => return Ok(Seen::Runs),
                Some(false) => {}
                // The kernel does not say: runnable for a while without stopping is running.
                None if waited >= CONFIRM_WINDOW => return Ok(Seen::Runs),
                None => {}
            },
            Some(_) => return Ok(Seen::Runs),
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_micros(200));
    }
}

/// Whether `tid`, which [`Ptrace::resume`] continued, is stopped already: a stop notification
/// is pending for it (taken here), or `/proc` shows it in a traced stop (its notification is
/// waited for up to [`NOTIFY_GRACE`], so that none is left behind for CRIU's next wait). Its
/// wait status when it has one.
fn stopped_already(pid: Pid, tid: Tid) -> Result<Option<Option<libc::c_int>>, ThreadError> {
    if let Some(status) = poll_stop(tid)? {
        return Ok(Some(Some(status)));
    }
    if !matches!(crate::thread::thread_state(pid, tid), Some('t' | 'T')) {
        return Ok(None);
    }
    let start = Instant::now();
    loop {
        if let Some(status) = poll_stop(tid)? {
            return Ok(Some(Some(status)));
        }
        if start.elapsed() >= NOTIFY_GRACE {
            return Ok(Some(None));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// How many times [`Ptrace::restop`] stops a thread again that it found in a
/// signal-delivery-stop instead of the `PTRACE_EVENT_STOP` CRIU left it in.
const RESTOP_ROUNDS: u32 = 3;

impl ThreadControl for Ptrace {
    fn resume(&mut self, pid: Pid, tid: Tid) -> Result<Resumed, ThreadError> {
        // TracerPid names the tracing *thread*; ptrace requests only work from it, so it must be
        // the calling thread (CRIU's main thread, whose tid is CRIU's pid).
        // The raw system call, not glibc's gettid(): that wrapper only exists since glibc 2.30,
        // and the released plugin loads on glibc 2.17 (scripts/check-dist.sh rejects a symbol
        // newer than that, or one without a version).
        // SAFETY: SYS_gettid takes no arguments, has no preconditions and cannot fail.
        let me = unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t;
        let seccomp = match tracer_and_seccomp(pid, tid) {
            None => return Err(ThreadError::Gone { tid }),
            Some((t, seccomp)) if t != me => {
                return Ok(Resumed {
                    pid,
                    tid,
                    saved_sigmask: None,
                    seccomp,
                })
            }
            Some((_, seccomp)) => seccomp,
        };
        let mut saved: u64 = 0;
        request(
            "PTRACE_GETSIGMASK",
            libc::PTRACE_GETSIGMASK,
            tid,
            std::mem::size_of::<u64>() as *mut c_void,
            (&raw mut saved).cast(),
        )?;
        let all_but_trap = !(1u64 << (libc::SIGTRAP - 1));
        set_mask(tid, all_but_trap)?;
        let run = set_options(tid, 0).and_then(|()| cont_confirmed(pid, tid));
        match run {
            Ok(()) => Ok(Resumed {
                pid,
                tid,
                saved_sigmask: Some(saved),
                seccomp,
            }),
            Err(e @ ThreadError::Gone { .. }) => Err(e),
            Err(e) => {
                // Still (or again) stopped: put back what we changed, best effort.
                let _ = restore_options(tid, seccomp);
                let _ = set_mask(tid, saved);
                Err(e)
            }
        }
    }

    fn restop(&mut self, resumed: Resumed) -> Result<(), ThreadError> {
        let Some(saved) = resumed.saved_sigmask else {
            return Ok(());
        };
        let (pid, tid) = (resumed.pid, resumed.tid);
        for round in 1..=RESTOP_ROUNDS {
            // A PTRACE_INTERRUPT sent to a thread that is stopped already would stay queued as
            // a trap that stops it again at once after the next PTRACE_CONT: only a thread that
            // runs is interrupted.
            let status = match stopped_already(pid, tid)? {
                Some(status) => status,
                None => {
                    interrupt(tid)?;
                    Some(wait_stopped(tid)?)
                }
            };
            match status {
                // A signal-delivery-stop (SIGTRAP or SIGSTOP, the only signals not blocked): it
                // may have come just before our interrupt, which then stays queued. Discard the
                // signal and stop the thread again, which runs into that trap if there is one,
                // so none is left for CRIU's next PTRACE_CONT.
                Some(s) if !is_event_stop(s) && round < RESTOP_ROUNDS => cont(tid)?,
                // The PTRACE_EVENT_STOP CRIU left it in, or a stop whose notification was
                // waited for elsewhere.
                _ => break,
            }
        }
        let opts = restore_options(tid, resumed.seccomp);
        let mask = set_mask(tid, saved);
        opts.and(mask)
    }

    fn thread_exists(&self, pid: Pid, tid: Tid) -> bool {
        std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
    }

    fn task_exists(&self, pid: Pid) -> bool {
        crate::thread::process_alive(pid)
    }

    fn ns_pid(&self, pid: Pid) -> Option<Pid> {
        crate::thread::ns_pid(pid)
    }

    fn stopped(&self, pid: Pid, tid: Tid) -> Option<char> {
        crate::thread::thread_state(pid, tid).filter(|s| matches!(s, 'T' | 't'))
    }

    fn kill_task(&mut self, pid: Pid) -> Result<(), ThreadError> {
        const LIMIT: Duration = Duration::from_secs(2);
        let Some(pid) = one_process(pid) else {
            return Err(ThreadError::Ptrace {
                step: "kill(SIGKILL) of a pid that names no single task",
                tid: pid,
                errno: libc::EINVAL,
            });
        };
        // SAFETY: kill(2) only sends a signal, to one process (see `one_process`).
        if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if errno == libc::ESRCH {
                return Ok(());
            }
            return Err(ThreadError::Ptrace {
                step: "kill(SIGKILL)",
                tid: pid,
                errno,
            });
        }
        let start = Instant::now();
        let mut pause = Duration::from_micros(100);
        while crate::thread::process_alive(pid) {
            if start.elapsed() >= LIMIT {
                return Err(ThreadError::KillTimeout {
                    pid,
                    ms: crate::message::millis(LIMIT),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
        Ok(())
    }
}

/// `pid` when it names one task that may be killed: kill(2) reads 0 as the caller's process
/// group, -1 as every process the caller may signal and -N as process group N, and pid 1 is init.
/// (A pid of -1 reaches the plugin as #3105's sentinel, or from a damaged image.)
fn one_process(pid: Pid) -> Option<Pid> {
    (pid > 1).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn only_a_single_task_pid_may_be_killed() {
        // kill(2) reads 0 as "my process group", -1 as "every process I may signal" and -N as
        // process group N; pid 1 is init.
        for pid in [i32::MIN, -2, -1, 0, 1] {
            assert_eq!(one_process(pid), None, "pid {pid}");
        }
        assert_eq!(one_process(2), Some(2));
        assert_eq!(one_process(4_194_304), Some(4_194_304));
    }

    fn state_of(pid: Pid) -> char {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        s.rsplit(')').next().unwrap().trim().chars().next().unwrap()
    }

    /// Seizes and interrupts `pid` the way CRIU's compel does (then sets its options, with
    /// seccomp suspended for a task that has a seccomp mode); `false` when ptrace is not
    /// permitted here.
    fn seize_like_criu(pid: Pid, seccomp: bool) -> bool {
        // SAFETY: PTRACE_SEIZE/INTERRUPT on our own child; integer arguments only.
        let ok = unsafe {
            libc::ptrace(libc::PTRACE_SEIZE, pid, 0usize, 0usize) == 0
                && libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0usize, 0usize) == 0
        };
        ok && wait_stopped(pid).is_ok() && set_options(pid, criu_options(seccomp)).is_ok()
    }

    /// A child forked from this process that enters seccomp's strict mode and blocks reading a
    /// pipe nobody writes to (strict mode allows only read, write, exit and sigreturn); killed
    /// and reaped on drop.
    struct StrictSleeper {
        pid: Pid,
        pipe_write: libc::c_int,
    }

    impl StrictSleeper {
        fn start() -> Self {
            let mut fds = [0 as libc::c_int; 2];
            // SAFETY: pipe(2) fills the two-element array.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            // SAFETY: the child only makes raw system calls (prctl, read, exit), which are
            // async-signal-safe, so forking a multi-threaded test process is sound.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                // SAFETY: raw system calls in the forked child, arguments are integers and a
                // one-byte local buffer.
                unsafe {
                    libc::syscall(libc::SYS_close, fds[1]);
                    libc::syscall(
                        libc::SYS_prctl,
                        libc::PR_SET_SECCOMP,
                        libc::SECCOMP_MODE_STRICT,
                    );
                    let mut b = 0u8;
                    while libc::syscall(libc::SYS_read, fds[0], &raw mut b, 1usize) != 0 {}
                    libc::syscall(libc::SYS_exit, 0);
                }
                unreachable!("exit returned");
            }
            // SAFETY: closes our copy of the read end.
            unsafe { libc::close(fds[0]) };
            let me = StrictSleeper {
                pid,
                pipe_write: fds[1],
            };
            let end = Instant::now() + Duration::from_secs(5);
            while !crate::thread::tracer_and_seccomp(pid, pid).is_some_and(|(_, s)| s) {
                assert!(Instant::now() < end, "the child never entered strict mode");
                std::thread::sleep(Duration::from_millis(1));
            }
            me
        }
    }

    impl Drop for StrictSleeper {
        fn drop(&mut self) {
            // SAFETY: kill, reap our own child and close our pipe end; integer arguments.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), libc::__WALL);
                libc::close(self.pipe_write);
            }
        }
    }

    /// Runs `f` with CAP_SYS_ADMIN dropped from this thread's effective set (as under
    /// `criu --unprivileged`, which runs with CAP_CHECKPOINT_RESTORE), then raises it again.
    /// Capabilities are per thread: the rest of the test process keeps its own.
    fn without_cap_sys_admin<T>(f: impl FnOnce() -> T) -> T {
        #[repr(C)]
        struct Header {
            version: u32,
            pid: libc::c_int,
        }
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        const VERSION_3: u32 = 0x2008_0522;
        let mut hdr = Header {
            version: VERSION_3,
            pid: 0,
        };
        let mut data = [Data::default(); 2];
        // SAFETY: capget with a v3 header and the two data words v3 defines.
        let r = unsafe { libc::syscall(libc::SYS_capget, &raw mut hdr, data.as_mut_ptr()) };
        assert_eq!(r, 0, "capget");
        let saved = data;
        data[0].effective &= !(1 << CAP_SYS_ADMIN);
        // SAFETY: capset of this thread with the same v3 layout, a subset of what it had.
        let r = unsafe { libc::syscall(libc::SYS_capset, &raw mut hdr, data.as_ptr()) };
        assert_eq!(r, 0, "capset (drop CAP_SYS_ADMIN)");
        let out = f();
        // SAFETY: as above; the saved sets are within the permitted set.
        let r = unsafe { libc::syscall(libc::SYS_capset, &raw mut hdr, saved.as_ptr()) };
        assert_eq!(r, 0, "capset (raise CAP_SYS_ADMIN again)");
        out
    }

    /// `CAP_SYS_ADMIN`'s bit number (linux/capability.h).
    const CAP_SYS_ADMIN: u32 = 21;

    /// Whether this thread has CAP_SYS_ADMIN in its effective set (`CapEff` of its status).
    fn have_cap_sys_admin() -> bool {
        std::fs::read_to_string("/proc/thread-self/status")
            .ok()
            .and_then(|s| {
                let v = s
                    .lines()
                    .find_map(|l| l.strip_prefix("CapEff:"))?
                    .trim()
                    .to_owned();
                u64::from_str_radix(&v, 16).ok()
            })
            .is_some_and(|m| m & (1 << CAP_SYS_ADMIN) != 0)
    }

    #[test]
    fn seccomp_is_suspended_again_only_where_criu_suspended_it() {
        if !have_cap_sys_admin() {
            eprintln!("skipped: needs CAP_SYS_ADMIN (as root) to drop it on purpose");
            return;
        }
        let mut p = Ptrace;
        // A task without seccomp: CRIU set only TRACESYSGOOD, which needs no capability, so
        // the window works without CAP_SYS_ADMIN (criu --unprivileged).
        let plain = sleeper();
        let pid = plain.0.id() as Pid;
        assert!(seize_like_criu(pid, false), "seize");
        without_cap_sys_admin(|| {
            let r = p.resume(pid, pid).unwrap();
            assert!(!r.seccomp);
            assert_ne!(state_of(pid), 't', "running while resumed");
            p.restop(r).expect("re-stop without CAP_SYS_ADMIN");
        });
        assert_eq!(state_of(pid), 't', "stopped again");

        // A task in seccomp's strict mode: the re-stop suspends its filter again, as CRIU's
        // seize did; while it runs, its own filter applies.
        let strict = StrictSleeper::start();
        let spid = strict.pid;
        assert!(seize_like_criu(spid, true), "seize");
        let r = p.resume(spid, spid).unwrap();
        assert!(r.seccomp, "the strict-mode task is known as filtered");
        std::thread::sleep(Duration::from_millis(20));
        assert_ne!(state_of(spid), 't', "running while resumed");
        p.restop(r).unwrap();
        assert_eq!(state_of(spid), 't', "stopped again");

        // Without CAP_SYS_ADMIN that suspension is refused: a clear error, still stopped.
        let r = p.resume(spid, spid).unwrap();
        let e = without_cap_sys_admin(|| p.restop(r)).unwrap_err();
        assert_eq!(
            e,
            ThreadError::SeccompSuspend {
                tid: spid,
                errno: libc::EPERM
            }
        );
        let text = e.to_string();
        assert!(
            text.contains("seccomp") && text.contains("CAP_SYS_ADMIN"),
            "{text}"
        );
        assert_eq!(state_of(spid), 't', "stopped again even so");
    }

    /// Kills and reaps the child even when an assertion fails.
    struct Reaped(std::process::Child);

    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A `sleep 30`: it keeps its signal mask as we set it (a shell would reset it around
    /// forks).
    fn sleeper() -> Reaped {
        Reaped(
            Command::new("/bin/sleep")
                .arg("30")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    #[test]
    fn resume_runs_only_while_resumed_and_restop_restores_mask_and_stop() {
        let child = sleeper();
        let pid = child.0.id() as Pid;
        if !seize_like_criu(pid, false) {
            eprintln!("skipped: ptrace is not permitted in this environment");
            return;
        }
        assert_eq!(state_of(pid), 't', "stopped by our seize");
        let mut mask_before: u64 = 0;
        // SAFETY: reads the 8-byte signal mask of a thread we trace and that is stopped.
        unsafe {
            libc::ptrace(libc::PTRACE_GETSIGMASK, pid, 8usize, &raw mut mask_before);
        }
        let mut p = Ptrace;
        assert!(p.thread_exists(pid, pid));
        let r = p.resume(pid, pid).unwrap();
        assert_eq!(r.saved_sigmask, Some(mask_before));
        std::thread::sleep(Duration::from_millis(50));
        assert_ne!(state_of(pid), 't', "running while resumed");
        // Not filtered: nothing but PTRACE_O_TRACESYSGOOD to put back, allowed to any tracer.
        p.restop(r).unwrap();
        assert_eq!(state_of(pid), 't', "stopped again");
        let mut mask_after: u64 = 0;
        // SAFETY: as above.
        unsafe {
            libc::ptrace(libc::PTRACE_GETSIGMASK, pid, 8usize, &raw mut mask_after);
        }
        assert_eq!(mask_after, mask_before, "signal mask restored");
        // A thread traced by nobody is left alone.
        let free = sleeper();
        let fpid = free.0.id() as Pid;
        let r = p.resume(fpid, fpid).unwrap();
        assert_eq!(r.saved_sigmask, None, "not traced by us: nothing to do");
        p.restop(r).unwrap();
    }

    /// What a [`Forked`] child does.
    #[derive(Clone, Copy)]
    enum Work {
        /// Counts in shared memory, sleeping 1 ms between steps (mostly `S` in `/proc`, as an
        /// idle restore thread is).
        Count,
        /// Sends itself SIGTRAP (ignored, so harmless untraced) over and over: traced, it
        /// stops in a signal-delivery-stop at once whenever it runs.
        Trap,
    }

    /// A child forked from this process that does [`Work`], with a counter in a shared
    /// anonymous mapping; killed and reaped on drop.
    struct Forked {
        pid: Pid,
        counter: *mut u64,
    }

    impl Forked {
        fn start(work: Work) -> Self {
            // SAFETY: a fresh shared anonymous mapping of one page; the result is checked.
            let page = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(page, libc::MAP_FAILED, "mmap");
            let counter = page.cast::<u64>();
            // SAFETY: the child only makes async-signal-safe calls (signal, raw system calls)
            // and writes to the shared page, so forking a multi-threaded test process is sound.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                // SAFETY: raw system calls in the forked child with integer arguments and a
                // local timespec; the counter points into the live shared mapping.
                unsafe {
                    libc::signal(libc::SIGTRAP, libc::SIG_IGN);
                    let me = libc::syscall(libc::SYS_getpid);
                    let step = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 1_000_000,
                    };
                    loop {
                        std::ptr::write_volatile(counter, std::ptr::read_volatile(counter) + 1);
                        match work {
                            Work::Count => {
                                libc::syscall(
                                    libc::SYS_nanosleep,
                                    &raw const step,
                                    std::ptr::null_mut::<libc::timespec>(),
                                );
                            }
                            Work::Trap => {
                                libc::syscall(libc::SYS_tgkill, me, me, libc::SIGTRAP);
                            }
                        }
                    }
                }
            }
            let me = Forked { pid, counter };
            let end = Instant::now() + Duration::from_secs(5);
            while me.count() == 0 {
                assert!(Instant::now() < end, "the child never started counting");
                std::thread::sleep(Duration::from_millis(1));
            }
            me
        }

        fn count(&self) -> u64 {
            // SAFETY: the counter lives in our shared mapping, unmapped only on drop.
            unsafe { std::ptr::read_volatile(self.counter) }
        }

        /// Whether the child makes progress (its counter advances by 3 within 2 s) and is not
        /// in a stop afterwards.
        fn runs(&self) -> bool {
            let from = self.count();
            let end = Instant::now() + Duration::from_secs(2);
            while self.count() < from + 3 {
                if Instant::now() >= end {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            !matches!(state_of(self.pid), 't' | 'T')
        }

        /// Whether the counter stays put for 30 ms.
        fn frozen(&self) -> bool {
            let n = self.count();
            std::thread::sleep(Duration::from_millis(30));
            self.count() == n
        }

        fn sigmask(&self) -> u64 {
            let mut mask: u64 = 0;
            // SAFETY: reads the 8-byte signal mask of a thread we trace and that is stopped.
            let r =
                unsafe { libc::ptrace(libc::PTRACE_GETSIGMASK, self.pid, 8usize, &raw mut mask) };
            assert_eq!(r, 0, "PTRACE_GETSIGMASK");
            mask
        }
    }

    impl Drop for Forked {
        fn drop(&mut self) {
            // SAFETY: kill and reap our own child, unmap our shared page; integer arguments
            // and the pointer mmap returned.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), libc::__WALL);
                libc::munmap(self.counter.cast(), 4096);
            }
        }
    }

    /// Waits until `pid` shows a traced stop in `/proc`.
    fn until_traced_stop(pid: Pid) {
        let end = Instant::now() + Duration::from_secs(5);
        while state_of(pid) != 't' {
            assert!(Instant::now() < end, "{pid} never stopped");
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    #[test]
    fn resume_runs_a_thread_that_has_a_trap_queued() {
        let child = Forked::start(Work::Count);
        let pid = child.pid;
        if !seize_like_criu(pid, false) {
            eprintln!("skipped: ptrace is not permitted in this environment");
            return;
        }
        assert!(child.frozen(), "stopped by our seize");
        // A second PTRACE_INTERRUPT while it is stopped queues a trap: a plain PTRACE_CONT
        // would let it run into that trap and stop again at once.
        interrupt(pid).unwrap();
        let mut p = Ptrace;
        let r = p.resume(pid, pid).expect("resume");
        assert!(
            child.runs(),
            "resumed but not running: state {}",
            state_of(pid)
        );
        p.restop(r).unwrap();
        assert_eq!(state_of(pid), 't', "stopped again");
        assert!(child.frozen(), "stopped again");
        assert_eq!(
            poll_stop(pid).unwrap(),
            None,
            "no stop left to be waited for"
        );
        // And the next window works as the first.
        let r = p.resume(pid, pid).expect("resume again");
        assert!(child.runs(), "running again: state {}", state_of(pid));
        p.restop(r).unwrap();
        assert!(child.frozen(), "stopped again");
    }

    /// How a thread comes to be stopped already when [`Ptrace::restop`] stops it.
    #[derive(Debug, Clone, Copy)]
    enum StoppedBy {
        /// A PTRACE_INTERRUPT whose stop was not waited for: a notification is pending.
        Interrupt,
        /// A PTRACE_INTERRUPT whose stop was waited for: no notification is pending.
        InterruptWaited,
        /// SIGSTOP (not blockable): a signal-delivery-stop, its notification pending.
        Sigstop,
    }

    #[test]
    fn restop_of_a_stopped_thread_leaves_no_trap_queued() {
        for how in [
            StoppedBy::Interrupt,
            StoppedBy::InterruptWaited,
            StoppedBy::Sigstop,
        ] {
            let child = Forked::start(Work::Count);
            let pid = child.pid;
            if !seize_like_criu(pid, false) {
                eprintln!("skipped: ptrace is not permitted in this environment");
                return;
            }
            let mask_before = child.sigmask();
            let mut p = Ptrace;
            let r = p.resume(pid, pid).expect("resume");
            assert!(child.runs(), "{how:?}: running while resumed");
            match how {
                StoppedBy::Interrupt => interrupt(pid).unwrap(),
                StoppedBy::InterruptWaited => {
                    interrupt(pid).unwrap();
                    wait_stopped(pid).unwrap();
                }
                // SAFETY: kill(2) of our own child.
                StoppedBy::Sigstop => assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0),
            }
            until_traced_stop(pid);
            p.restop(r)
                .unwrap_or_else(|e| panic!("{how:?}: restop: {e}"));
            assert_eq!(state_of(pid), 't', "{how:?}: stopped");
            assert!(child.frozen(), "{how:?}: stopped");
            assert_eq!(child.sigmask(), mask_before, "{how:?}: mask restored");
            assert_eq!(
                poll_stop(pid).unwrap(),
                None,
                "{how:?}: no stop left to be waited for"
            );
            // No trap queued: CRIU's own PTRACE_CONT (a plain one) lets it run.
            cont(pid).unwrap();
            assert!(
                child.runs(),
                "{how:?}: a plain PTRACE_CONT after the re-stop did not let it run (state {})",
                state_of(pid)
            );
            interrupt(pid).unwrap();
            wait_stopped(pid).unwrap();
            // And a following resume runs it.
            let r = p.resume(pid, pid).expect("resume after the re-stop");
            assert!(child.runs(), "{how:?}: running after the re-stop");
            p.restop(r).unwrap();
            assert!(child.frozen(), "{how:?}: stopped at the end");
        }
    }

    #[test]
    fn a_thread_that_keeps_stopping_fails_the_resume_and_is_left_as_criu_left_it() {
        let child = Forked::start(Work::Trap);
        let pid = child.pid;
        if !seize_like_criu(pid, false) {
            eprintln!("skipped: ptrace is not permitted in this environment");
            return;
        }
        let mask_before = child.sigmask();
        let mut p = Ptrace;
        let e = p.resume(pid, pid).unwrap_err();
        assert_eq!(
            e,
            ThreadError::StopsAtOnce {
                pid,
                tid: pid,
                conts: CONT_RETRIES + 1
            }
        );
        let text = e.to_string();
        assert!(
            text.contains(&format!("restore thread {pid} of pid {pid}"))
                && text.contains("stopped again at once after each of 4 PTRACE_CONTs"),
            "{text}"
        );
        assert_eq!(state_of(pid), 't', "left stopped");
        assert_eq!(child.sigmask(), mask_before, "mask restored");
        assert_eq!(
            poll_stop(pid).unwrap(),
            None,
            "no stop left to be waited for"
        );
    }
}
