//! Descriptor hygiene for `cuda-checkpoint` children.
//!
//! CRIU holds many descriptors without `O_CLOEXEC` (service descriptors, the image directory,
//! log files); CRIU's C plugin closes them in the child before `exec`. Here a `pre_exec` hook
//! marks every descriptor above stderr close-on-exec with `close_range(3, ~0,
//! CLOSE_RANGE_CLOEXEC)` (Linux 5.11+), so the exec drops them while std's own exec-error pipe
//! keeps working. On older kernels the call fails and the child inherits them; it is short-lived.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes `cmd`'s child drop every inherited descriptor above 2 at `exec`.
pub fn close_inherited_fds(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and only makes one raw syscall,
    // which is async-signal-safe; it allocates nothing and touches no locks.
    unsafe {
        cmd.pre_exec(|| {
            libc::syscall(
                libc::SYS_close_range,
                3 as libc::c_uint,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
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

/// A close-on-exec pipe: (read end, write end). (`std::io::pipe` needs Rust 1.87; the
/// workspace's minimum is 1.85.)
pub fn pipe() -> std::io::Result<(std::fs::File, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created by pipe2 and are owned by nobody else.
    Ok(unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}
