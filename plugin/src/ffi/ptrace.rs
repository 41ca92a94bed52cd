//! The real [`ThreadControl`]: ptrace from CRIU's main thread, which is the tracer (ptrace
//! requests are only accepted from the thread that seized the task). See [`crate::thread`] for
//! the sequence and why.

use crate::backend::{Pid, Tid};
use crate::thread::{tracer_of, Resumed, ThreadControl, ThreadError};
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

/// The options CRIU's seize leaves on a thread, restored after our PTRACE_CONT window.
const CRIU_OPTIONS: libc::c_int = libc::PTRACE_O_SUSPEND_SECCOMP | libc::PTRACE_O_TRACESYSGOOD;

/// Waits (polling, with a deadline) until `tid` reports a stop. The polls back off from 10 µs
/// to 200 µs: a thread usually stops within tens of microseconds of PTRACE_INTERRUPT.
///
/// Normally that is the PTRACE_EVENT_STOP our PTRACE_INTERRUPT asked for, the same stop CRIU
/// left the thread in. While resumed the thread blocks every signal but SIGTRAP, so another kind
/// of stop (a signal-delivery-stop for SIGTRAP, a group-stop) is unlikely; it is accepted as
/// "stopped" rather than resumed again, which would deliver or drop the signal.
fn wait_stopped(tid: Tid) -> Result<(), ThreadError> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(10);
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid on a traced thread with a valid status out-pointer; WNOHANG never blocks.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == tid {
            if libc::WIFSTOPPED(status) {
                return Ok(());
            }
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                return Err(ThreadError::Gone { tid });
            }
        } else if r == -1 {
            let errno = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if errno != libc::EINTR {
                return Err(ThreadError::Ptrace {
                    step: "waitpid",
                    tid,
                    errno,
                });
            }
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

impl ThreadControl for Ptrace {
    fn resume(&mut self, pid: Pid, tid: Tid) -> Result<Resumed, ThreadError> {
        // TracerPid names the tracing *thread*; ptrace requests only work from it, so it must be
        // the calling thread (CRIU's main thread, whose tid is CRIU's pid).
        // The raw system call, not glibc's gettid(): that wrapper only exists since glibc 2.30,
        // and the released plugin loads on glibc 2.17 (scripts/check-dist.sh rejects a symbol
        // newer than that, or one without a version).
        // SAFETY: SYS_gettid takes no arguments, has no preconditions and cannot fail.
        let me = unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t;
        match tracer_of(pid, tid) {
            None => return Err(ThreadError::Gone { tid }),
            Some(t) if t != me => {
                return Ok(Resumed {
                    pid,
                    tid,
                    saved_sigmask: None,
                })
            }
            Some(_) => {}
        }
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
        let run = set_options(tid, 0).and_then(|()| {
            request(
                "PTRACE_CONT",
                libc::PTRACE_CONT as libc::c_uint,
                tid,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
            .map(drop)
        });
        if let Err(e) = run {
            // Still stopped: put back what we changed, best effort.
            let _ = set_options(tid, CRIU_OPTIONS);
            let _ = set_mask(tid, saved);
            return Err(e);
        }
        Ok(Resumed {
            pid,
            tid,
            saved_sigmask: Some(saved),
        })
    }

    fn restop(&mut self, resumed: Resumed) -> Result<(), ThreadError> {
        let Some(saved) = resumed.saved_sigmask else {
            return Ok(());
        };
        let tid = resumed.tid;
        request(
            "PTRACE_INTERRUPT",
            libc::PTRACE_INTERRUPT,
            tid,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )?;
        wait_stopped(tid)?;
        let opts = set_options(tid, CRIU_OPTIONS);
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
        // SAFETY: kill(2) only sends a signal.
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
                    ms: u64::try_from(LIMIT.as_millis()).unwrap_or(u64::MAX),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn state_of(pid: Pid) -> char {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        s.rsplit(')').next().unwrap().trim().chars().next().unwrap()
    }

    /// Seizes and interrupts `pid` the way CRIU's compel does; `false` when ptrace is not
    /// permitted here.
    fn seize_like_criu(pid: Pid) -> bool {
        // SAFETY: PTRACE_SEIZE/INTERRUPT on our own child; integer arguments only.
        let ok = unsafe {
            libc::ptrace(libc::PTRACE_SEIZE, pid, 0usize, CRIU_OPTIONS as usize) == 0
                && libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0usize, 0usize) == 0
        };
        ok && wait_stopped(pid).is_ok()
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
        if !seize_like_criu(pid) {
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
        let restop = p.restop(r);
        if let Err(ThreadError::Ptrace {
            step: "PTRACE_SETOPTIONS",
            errno,
            ..
        }) = restop
        {
            // PTRACE_O_SUSPEND_SECCOMP needs CAP_SYS_ADMIN, which CRIU has.
            assert_eq!(errno, libc::EPERM);
        } else {
            restop.unwrap();
        }
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
}
