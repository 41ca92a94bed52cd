//! Process facts from `/proc` and file locks: what the world needs to know about the processes
//! in it (all safe code).

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

/// An exclusive `flock(2)` on a file, released on drop.
#[derive(Debug)]
pub struct FileLock(
    #[expect(dead_code, reason = "held only for its drop, which releases the lock")]
    nix::fcntl::Flock<File>,
);

impl FileLock {
    /// Takes the lock, retrying until `deadline`. `Err(None)` means the deadline passed.
    pub fn acquire(path: &Path, deadline: Instant) -> Result<FileLock, Option<std::io::Error>> {
        let mut file = open_lock_file(path).map_err(Some)?;
        loop {
            match try_flock(file).map_err(Some)? {
                Ok(l) => return Ok(FileLock(l)),
                Err(f) => {
                    if Instant::now() >= deadline {
                        return Err(None);
                    }
                    file = f;
                    std::thread::sleep(LOCK_RETRY);
                }
            }
        }
    }
}

/// How long a lock waiter sleeps between tries.
pub(crate) const LOCK_RETRY: Duration = Duration::from_micros(200);

/// Opens (creating it if absent) the lock file at `path`.
pub(crate) fn open_lock_file(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// One try at an exclusive `flock(2)` on `file`: the lock, or the file back when another holds
/// it (or a signal interrupted the try).
pub(crate) fn try_flock(file: File) -> std::io::Result<Result<nix::fcntl::Flock<File>, File>> {
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(Ok(l)),
        Err((f, nix::errno::Errno::EWOULDBLOCK | nix::errno::Errno::EINTR)) => Ok(Err(f)),
        Err((_, e)) => Err(std::io::Error::from(e)),
    }
}

/// True when `pid` exists and is not a zombie.
#[must_use]
pub fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rfind(')').and_then(|i| stat.get(i + 2..i + 3));
    !matches!(state, None | Some("Z" | "X"))
}

/// True when thread `tid` of `pid` is stopped (SIGSTOP, a ptrace stop): it makes no progress
/// until someone resumes it.
#[must_use]
pub fn stopped(pid: i32, tid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) else {
        return false;
    };
    let state = stat.rfind(')').and_then(|i| stat.get(i + 2..i + 3));
    matches!(state, Some("T" | "t"))
}
