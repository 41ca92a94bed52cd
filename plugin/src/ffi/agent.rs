//! What the plugin's helper process (the *agent*, see [`crate::agent`]) needs from the OS: a
//! message channel, the double fork that starts it outside CRIU's process group, and syslog.
//!
//! * **The channel** is a `SOCK_SEQPACKET` socket pair: messages keep their boundaries, arrive in
//!   order, and the peer's exit reads as end-of-file. Both ends are close-on-exec.
//! * **The fork.** [`spawn_detached`] forks twice: the intermediate child forks the agent and
//!   exits at once, and the caller reaps it with `waitpid` on its pid before returning, so CRIU is
//!   never left with a child it does not know (CRIU's restore fails on any unexpected child exit
//!   once its SIGCHLD handler is installed, which is after plugin `init`), and the agent is
//!   re-parented to init (or the nearest subreaper, a container runtime's shim, say). The agent
//!   leads a new session (a signal to CRIU's process group or terminal does not reach it),
//!   resets every signal to its default and unblocks them, keeps only the descriptors it is
//!   given (it must not hold CRIU's log, its service socket or a runtime's pipes open past CRIU)
//!   and has /dev/null as stdio.
//! * **CRIU's pid stays watchable**: [`self_pidfd`] is a pidfd for the calling process, which the
//!   agent inherits and polls to learn that CRIU has exited even if some other process still
//!   holds CRIU's end of the channel.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// One end of a `SOCK_SEQPACKET` socket pair.
#[derive(Debug)]
pub struct Channel(OwnedFd);

/// The largest message either side sends (an NVML snapshot of a big node is the largest).
pub const MAX_MESSAGE: usize = 1 << 20;

impl Channel {
    /// A connected pair, both ends close-on-exec, with send buffers large enough for
    /// [`MAX_MESSAGE`].
    pub fn pair() -> io::Result<(Channel, Channel)> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: socketpair writes two new descriptors into the two-element array.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned by nobody else.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let (a, b) = (Channel(a), Channel(b));
        a.grow_buffers();
        b.grow_buffers();
        Ok((a, b))
    }

    fn grow_buffers(&self) {
        let size = libc::c_int::try_from(MAX_MESSAGE + 4096).unwrap_or(libc::c_int::MAX);
        for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
            // SAFETY: setsockopt reads one c_int from a valid pointer; a failure (a lower
            // rmem_max) only keeps the default size, which bounds the largest message.
            unsafe {
                libc::setsockopt(
                    self.0.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    std::ptr::addr_of!(size).cast(),
                    libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap_or(4),
                );
            }
        }
    }

    /// Shuts both directions of the channel down: the peer reads EOF although this process
    /// still holds the descriptor (threads still running may try to send; they get EPIPE).
    pub fn shutdown(&self) {
        // SAFETY: shutdown on a socket descriptor this Channel owns; it only changes the
        // socket's state, and a failure (already shut) is harmless.
        unsafe {
            libc::shutdown(self.0.as_raw_fd(), libc::SHUT_RDWR);
        }
    }

    /// The descriptor (to poll it).
    #[must_use]
    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.0.as_fd()
    }

    /// Sends one message without blocking; `WouldBlock` when the peer's queue is full,
    /// `BrokenPipe` when the peer is gone.
    pub fn try_send(&self, msg: &[u8]) -> io::Result<()> {
        // SAFETY: send reads `msg.len()` bytes from a valid slice; MSG_NOSIGNAL turns a closed
        // peer into EPIPE instead of SIGPIPE.
        let n = unsafe {
            libc::send(
                self.0.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends one message, waiting at most `limit` for room in the peer's queue.
    pub fn send(&self, msg: &[u8], limit: Duration) -> io::Result<()> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            match self.try_send(msg) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the helper process does not read its messages",
                        ));
                    }
                    poll(&[(self.fd(), libc::POLLOUT)], Some(left))?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }

    /// Receives one message without blocking: `Ok(None)` when none is queued, `Err(UnexpectedEof)`
    /// when the peer is gone and nothing is left.
    pub fn try_recv(&self, buf: &mut Vec<u8>) -> io::Result<Option<()>> {
        // Room for the largest message, without writing it first (zeroing 1 MiB per receive
        // cost milliseconds per call in unoptimised builds).
        buf.clear();
        buf.reserve(MAX_MESSAGE);
        let room = buf.capacity();
        // SAFETY: recv writes at most `room` bytes into the vector's allocation, whose capacity
        // is `room`; nothing is read from it before `set_len` below covers only bytes written.
        let n = unsafe {
            libc::recv(
                self.0.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                room,
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            buf.clear();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        let n = usize::try_from(n).unwrap_or(0);
        if n == 0 {
            buf.clear();
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the other end closed the channel",
            ));
        }
        if n > MAX_MESSAGE {
            buf.clear();
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a message of {n} bytes exceeds the limit of {MAX_MESSAGE}"),
            ));
        }
        // SAFETY: recv wrote `n` bytes (`n <= MAX_MESSAGE <= room`, as MSG_TRUNC reports the
        // datagram's full length and longer ones were refused above) at the start of the buffer.
        unsafe { buf.set_len(n.min(room)) };
        Ok(Some(()))
    }
}

/// Waits at most `timeout` (`None`: no limit) for any of `fds` to be ready for its events;
/// returns each one's `revents`. An interrupted wait returns all zeros.
pub fn poll(
    fds: &[(BorrowedFd<'_>, libc::c_short)],
    timeout: Option<Duration>,
) -> io::Result<Vec<libc::c_short>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|(fd, events)| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: *events,
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| {
        libc::c_int::try_from(t.as_micros().div_ceil(1000)).unwrap_or(libc::c_int::MAX)
    });
    let n = libc::nfds_t::try_from(pfds.len()).unwrap_or(0);
    // SAFETY: `pfds` is a valid array of `n` pollfd structures that lives across the call.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), n, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![0; fds.len()]);
        }
        return Err(e);
    }
    Ok(pfds.iter().map(|p| p.revents).collect())
}

/// A pidfd for the calling process (readable once it has exited), or `None` on kernels without
/// `pidfd_open` (before 5.3). Close-on-exec.
#[must_use]
pub fn self_pidfd() -> Option<OwnedFd> {
    super::spawn::pidfd_open(std::process::id()).ok()
}

/// Starts `body` in a new process, detached from the caller (see the module docs), keeping only
/// the descriptors in `keep` open in it. Returns once the intermediate child is reaped; the
/// agent's own pid is not known here (it says so itself, over the channel). `body`'s return
/// value is the agent's exit status.
///
/// Call it only while the calling process has one thread: the child runs `body`, which may take
/// locks and allocate, and a lock held by another thread at the fork would never be released.
pub fn spawn_detached(
    keep: &[RawFd],
    name: &'static CStr,
    body: impl FnOnce() -> i32,
) -> io::Result<()> {
    // Everything the children need is prepared before the fork.
    let devnull = CString::new("/dev/null").unwrap_or_default();
    let mut keep: Vec<RawFd> = keep.to_vec();
    keep.sort_unstable();
    keep.dedup();
    // SAFETY: fork has no memory-safety preconditions. The child only makes raw system calls
    // until the second fork; the grandchild goes on to run `body` (see the function's docs for
    // why that is sound).
    let first = unsafe { libc::fork() };
    if first < 0 {
        return Err(io::Error::last_os_error());
    }
    if first == 0 {
        // The intermediate child.
        // SAFETY: as above.
        let second = unsafe { libc::fork() };
        if second != 0 {
            // SAFETY: _exit ends this process at once, without running the parent's atexit
            // handlers or flushing its stdio buffers (which belong to CRIU).
            unsafe { libc::_exit(if second < 0 { 1 } else { 0 }) };
        }
        detach(&keep, &devnull, name);
        let code = body();
        // SAFETY: as above; the agent never returns into the caller's code.
        unsafe { libc::_exit(code) };
    }
    // The caller: reap the intermediate child, which exits at once.
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child writes its status into a valid c_int.
        let r = unsafe { libc::waitpid(first, &raw mut status, libc::__WALL) };
        if r == first {
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            // Someone else reaped it (a SIGCHLD handler with waitpid(-1)): it is gone either way.
            Some(libc::ECHILD) => return Ok(()),
            _ => return Err(e),
        }
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "the intermediate child of the helper process failed (wait status {status:#x})"
        )))
    }
}

/// In the grandchild, before `body`: a new session, default signals, only `keep` open, stdio on
/// /dev/null, and a name of its own.
fn detach(keep: &[RawFd], devnull: &CString, name: &CStr) {
    // SAFETY: raw system calls on this process only. setsid makes it a session (and group)
    // leader; sigaction with SIG_DFL and sigprocmask with an empty set touch no memory but the
    // local structures; close_range closes descriptors nobody in this process uses any more
    // (the ones it needs are in `keep`); open/dup2 install /dev/null as stdio; prctl names it.
    unsafe {
        libc::setsid();
        for sig in 1..libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let mut empty = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&raw mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &raw const empty, std::ptr::null_mut());
        let mut from: RawFd = 3;
        for &k in keep.iter().filter(|&&k| k >= 3) {
            if k > from {
                close_range(from, k - 1);
            }
            from = k + 1;
        }
        close_range(from, RawFd::MAX);
        let null = libc::open(devnull.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            if null > 2 {
                libc::close(null);
            }
        }
        libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0);
    }
}

/// Closes `first..=last`: `close_range` where the kernel has it (5.9+), else one by one up to
/// the descriptor limit.
///
/// # Safety
/// Nothing in this process may use a descriptor in the range afterwards.
unsafe fn close_range(first: RawFd, last: RawFd) {
    let (Ok(a), Ok(b)) = (libc::c_uint::try_from(first), libc::c_uint::try_from(last)) else {
        return;
    };
    // SAFETY: the caller guarantees nothing uses these descriptors.
    if unsafe { libc::syscall(libc::SYS_close_range, a, b, 0 as libc::c_uint) } == 0 {
        return;
    }
    // SAFETY: sysconf only reads a limit.
    let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
    let max = RawFd::try_from(max).unwrap_or(1 << 16).min(1 << 20);
    for fd in first..=last.min(max) {
        // SAFETY: as above.
        unsafe { libc::close(fd) };
    }
}

/// A duplicate of `fd` (close-on-exec) that the caller owns.
pub fn dup(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor for the same open file; `fd` is only read.
    let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if d < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(d) })
}

/// Opens `name` for appending in the directory `dir` (created with mode 0600 when missing; never
/// following a symlink).
pub fn open_in(dir: BorrowedFd<'_>, name: &str) -> io::Result<std::fs::File> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: openat with a valid directory descriptor and a NUL-terminated relative name
    // returns a new descriptor or -1.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_WRONLY
                | libc::O_CREAT
                | libc::O_APPEND
                | libc::O_CLOEXEC
                | libc::O_NOFOLLOW
                | libc::O_NONBLOCK,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just created and is owned by nobody else.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Sends one line to syslog when the host has a syslog socket (`/dev/log`); `err` picks
/// `LOG_ERR` over `LOG_NOTICE`.
pub fn syslog(err: bool, msg: &str) {
    if !std::path::Path::new("/dev/log").exists() {
        return;
    }
    let Ok(text) = CString::new(msg.replace('\0', " ")) else {
        return;
    };
    static OPEN: std::sync::Once = std::sync::Once::new();
    OPEN.call_once(|| {
        // SAFETY: openlog keeps the ident pointer, which is a static string.
        unsafe { libc::openlog(c"cuda_plugin".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
    });
    let prio = if err { libc::LOG_ERR } else { libc::LOG_NOTICE };
    // SAFETY: a constant "%s" format with one NUL-terminated string argument.
    unsafe { libc::syslog(prio, c"%s".as_ptr(), text.as_ptr()) };
}

/// A directory descriptor that stays open for the rest of the process's life, borrowed: the
/// helper's image directory (it holds it until it exits, see [`crate::helper::server`]) or
/// CRIU's (`criu_get_image_dir`, open for CRIU's whole run).
#[must_use]
pub fn borrow_fd(fd: RawFd) -> BorrowedFd<'static> {
    // SAFETY: the caller passes an image directory descriptor that stays open until the process
    // exits (see above).
    unsafe { BorrowedFd::borrow_raw(fd) }
}

/// Ends the calling process at once with `code`: no atexit handlers (the driver's among them),
/// no unwinding of other threads. The copier's way to abort its open custom-storage operations
/// (see [`crate::cstore`]).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions; it never returns.
    unsafe { libc::_exit(code) }
}

/// Removes `name` from the directory `dir` (a partial custom-storage file); false when it could
/// not (it is not there).
pub fn unlink_in(dir: BorrowedFd<'_>, name: &str) -> bool {
    let Ok(c) = CString::new(name) else {
        return false;
    };
    // SAFETY: unlinkat with a valid directory descriptor and a NUL-terminated relative name.
    unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) == 0 }
}

/// Sends `sig` to `pid`; false when it could not (the process is gone).
#[must_use]
pub fn kill(pid: i32, sig: libc::c_int) -> bool {
    if pid <= 1 {
        return false;
    }
    // SAFETY: kill(2) on one pid; no memory involved.
    unsafe { libc::kill(pid, sig) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_channel_keeps_message_boundaries_and_reports_the_peer_gone() {
        let (a, b) = Channel::pair().unwrap();
        a.send(b"one", Duration::from_secs(1)).unwrap();
        a.send(&[7u8; 70_000], Duration::from_secs(1)).unwrap();
        let mut buf = Vec::new();
        assert_eq!(b.try_recv(&mut buf).unwrap(), Some(()));
        assert_eq!(buf, b"one");
        assert_eq!(b.try_recv(&mut buf).unwrap(), Some(()));
        assert_eq!(buf.len(), 70_000);
        assert_eq!(b.try_recv(&mut buf).unwrap(), None, "nothing queued");
        drop(a);
        let e = b.try_recv(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(b.try_send(b"x").is_err(), "peer gone");
    }

    #[test]
    fn a_detached_child_keeps_only_its_descriptors_and_its_own_session() {
        let (a, b) = Channel::pair().unwrap();
        let (_other, _other2) = Channel::pair().unwrap();
        let keep = b.fd().as_raw_fd();
        let other = _other.fd().as_raw_fd();
        let t = Instant::now();
        spawn_detached(&[keep], c"cuda-guardian", || {
            // SAFETY: test-only queries of this process.
            let (sid, me) = unsafe { (libc::getsid(0), libc::getpid()) };
            let other_open = std::path::Path::new(&format!("/proc/self/fd/{other}")).exists();
            let msg = format!("{sid} {me} {other_open}");
            let _ = b.send(msg.as_bytes(), Duration::from_secs(1));
            0
        })
        .unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
        poll(&[(a.fd(), libc::POLLIN)], Some(Duration::from_secs(10))).unwrap();
        let mut buf = Vec::new();
        assert_eq!(a.try_recv(&mut buf).unwrap(), Some(()));
        let text = String::from_utf8(buf.clone()).unwrap();
        let f: Vec<&str> = text.split(' ').collect();
        assert_eq!(f[0], f[1], "session leader: {text}");
        assert_eq!(f[2], "false", "other descriptors closed: {text}");
        assert_ne!(f[1].parse::<u32>().unwrap(), std::process::id());
        // The child exits after its message: the channel reads end-of-file (our copy of `b`
        // is still open here, so drop it first).
        drop(b);
        let r = poll(&[(a.fd(), libc::POLLIN)], Some(Duration::from_secs(10))).unwrap();
        assert_ne!(r[0], 0);
        assert_eq!(
            a.try_recv(&mut buf).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }
}
