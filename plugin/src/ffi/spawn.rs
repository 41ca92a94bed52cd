//! What a `cuda-checkpoint` child needs from the OS, and how the plugin waits for it.
//!
//! * **Descriptor hygiene.** CRIU holds many descriptors without `O_CLOEXEC` (service
//!   descriptors, the image directory, log files); CRIU's C plugin closes them in the child before
//!   `exec`. Here a `pre_exec` hook marks every descriptor above stderr close-on-exec with
//!   `close_range(3, ~0, CLOSE_RANGE_CLOEXEC)` (Linux 5.11+), so the exec drops them while std's
//!   own exec-error pipe keeps working. On older kernels the call fails and the child inherits
//!   them; it is short-lived.
//! * **Tied to CRIU's life.** The child asks for SIGKILL when its parent dies
//!   (`PR_SET_PDEATHSIG`), and exits at once if CRIU already died between the fork and that
//!   request. The signal follows the *thread* that forked, not the process: the plugin spawns
//!   only from the thread CRIU calls its hooks on (CRIU's main thread), never from a worker.
//! * **Its own process group**, so that a run that overstays its deadline is killed together with
//!   anything it started (a wrapper script's background process that holds its output, say).
//! * **Waiting without threads**: [`wait_readable`] polls the output pipe and a pidfd of the
//!   child (Linux 5.3+), so one loop on the calling thread collects the output and notices the
//!   exit, with the deadline covering both.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

/// Prepares `cmd`'s child: descriptors above 2 are dropped at `exec`, it dies with its parent
/// (`parent` is this process's pid, read before the fork) and it leads its own process group.
pub fn prepare_child(cmd: &mut Command, parent: u32) {
    cmd.process_group(0);
    let parent = libc::pid_t::try_from(parent).unwrap_or(0);
    // SAFETY: the closure runs in the forked child before exec and only makes raw syscalls
    // (close_range, prctl, getppid, _exit), which are async-signal-safe; it allocates nothing
    // and touches no locks.
    unsafe {
        cmd.pre_exec(move || {
            libc::syscall(
                libc::SYS_close_range,
                3 as libc::c_uint,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            // The parent died before the request took effect: nobody would kill us later.
            if libc::getppid() != parent {
                libc::_exit(127);
            }
            Ok(())
        });
    }
}

/// Clears `FD_CLOEXEC` on `fd` (tests simulate an inherited CRIU descriptor with it).
#[cfg(test)]
pub fn clear_cloexec_for_test(fd: std::os::fd::RawFd) {
    // SAFETY: fcntl F_SETFD on a descriptor the caller owns only changes its flags.
    let r = unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    assert_eq!(r, 0);
}

/// A close-on-exec pipe whose read end does not block: (read end, write end). (`std::io::pipe`
/// needs Rust 1.87; the workspace's minimum is 1.85.)
pub fn pipe() -> std::io::Result<(std::fs::File, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created by pipe2 and are owned by nobody else.
    let (r, w) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            OwnedFd::from_raw_fd(fds[1]),
        )
    };
    // SAFETY: F_SETFL on a descriptor we own only changes its status flags.
    if unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((r, w))
}

/// A pidfd for `pid` (readable once the process has exited), or an error on kernels without
/// `pidfd_open` (before 5.3), where the caller polls instead.
pub fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd =
        libc::c_int::try_from(fd).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this descriptor; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits at most `timeout` until one of `fds` is readable (or hung up); returns which ones are.
/// An interrupted wait (`EINTR`, e.g. CRIU's freeze alarm) returns with none ready.
pub fn wait_readable(fds: &[BorrowedFd<'_>], timeout: Duration) -> std::io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = libc::c_int::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(libc::c_int::MAX);
    let n = libc::nfds_t::try_from(pfds.len()).unwrap_or(0);
    // SAFETY: `pfds` is a valid array of `n` pollfd structures that lives across the call.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), n, ms) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    Ok(pfds
        .iter()
        .map(|p| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
        .collect())
}

/// SIGKILL to every process of the group `pgid` (the child and whatever it started).
pub fn kill_group(pgid: u32) {
    if let Ok(pgid) = libc::pid_t::try_from(pgid) {
        if pgid > 1 {
            // SAFETY: kill(2) with a negative pid signals that process group; no memory involved.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
    }
}
