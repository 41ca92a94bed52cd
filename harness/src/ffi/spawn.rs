//! Starting a process that inherits no descriptor but its standard ones.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes `cmd` close every descriptor above 2 in the child before it executes (`close_range`),
/// as a container runtime does for a container's init: a descriptor the harness inherited
/// without `O_CLOEXEC` (from the shell that started it) would otherwise reach the tree, and a
/// tree with its own mount namespace holding a file of a mount outside it cannot be dumped by
/// CRIU ("Can't lookup mount=… for fd=…").
pub fn close_other_fds(cmd: &mut Command) {
    // SAFETY: the closure only makes the `close_range` system call, which is async-signal-safe,
    // touches no memory of the parent and allocates nothing, as `pre_exec` requires.
    unsafe {
        cmd.pre_exec(|| {
            let r = libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        });
    }
}
