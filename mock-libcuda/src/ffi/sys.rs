//! Operating-system helpers: process facts from `/proc`, signals, the GPU handle (a
//! descriptor CRIU refuses to dump) and the mailbox doorbell. The helpers the world itself needs
//! (file locks, liveness, `crash`) live in `mock-cuda-world` and are re-exported here.

pub use mock_cuda_world::ffi::crash;
pub use mock_cuda_world::pidns::tgid_of;
pub use mock_cuda_world::sys::{alive, stopped, FileLock};

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

/// The calling thread's id.
#[must_use]
pub fn gettid() -> i32 {
    nix::unistd::gettid().as_raw()
}

/// Kills `pid` with SIGKILL and waits (bounded) until it is gone or a zombie.
pub fn kill_and_wait(pid: i32, limit: Duration) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let deadline = Instant::now() + limit;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Opens the GPU handle: a userfaultfd, a descriptor type CRIU refuses to dump ("Can't dump
/// file N of that type"), standing in for the `/dev/nvidia*` state a real CUDA process holds.
/// Falls back to an io_uring instance (also refused). `Ok(None)` when `MOCK_CUDA_NO_GPU_HANDLE`
/// is set (then a dump without checkpoint is not prevented; the state machine is still exact).
///
/// # Errors
/// The kernel allows neither (a container's seccomp profile blocks both, as podman's and
/// Docker's defaults do): the two errors, for the caller to refuse to become a CUDA process,
/// as a real process that cannot open `/dev/nvidiactl` does. Running on without the handle
/// would let a dump without the plugin pass.
pub fn open_gpu_handle() -> Result<Option<OwnedFd>, String> {
    if std::env::var_os("MOCK_CUDA_NO_GPU_HANDLE").is_some() {
        return Ok(None);
    }
    const UFFD_USER_MODE_ONLY: libc::c_long = 1;
    // SAFETY: userfaultfd(flags) takes no pointers.
    let mut fd = unsafe {
        libc::syscall(
            libc::SYS_userfaultfd,
            libc::c_long::from(libc::O_CLOEXEC) | UFFD_USER_MODE_ONLY,
        )
    };
    let mut refused = String::new();
    if fd < 0 {
        refused = format!("userfaultfd: {}", std::io::Error::last_os_error());
        // struct io_uring_params is 120 bytes; all-zero asks for defaults.
        let mut params = [0u8; 120];
        // SAFETY: io_uring_setup(entries, params) reads and writes exactly the 120-byte
        // `struct io_uring_params` we pass, which outlives the call.
        fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    }
    if fd < 0 {
        return Err(format!(
            "{refused}; io_uring_setup: {}",
            std::io::Error::last_os_error()
        ));
    }
    let fd = i32::try_from(fd).map_err(|_| format!("descriptor {fd} out of range"))?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// A doorbell between a caller and a target's restore thread: [`Bell::WORDS`] `u32` futex
/// words in a small file of the target's mailbox, mapped `MAP_SHARED` by both sides, so a
/// request and its answer wake the other side at once instead of being found by polling.
///
/// The target keeps its mapping for its whole life. The mapping holds no lock and no
/// descriptor (the file is closed once mapped), so CRIU dumps it like any shared file mapping
/// and a thread stopped while waiting on it leaves nothing held.
#[derive(Debug)]
pub struct Bell {
    words: std::ptr::NonNull<std::sync::atomic::AtomicU32>,
}

// SAFETY: the mapping is only reached through `AtomicU32`s, which are safe to share between
// threads (and processes); the pointer stays valid until `Drop` unmaps it.
unsafe impl Send for Bell {}
// SAFETY: as for `Send`: all access goes through atomics.
unsafe impl Sync for Bell {}

impl Bell {
    /// Number of futex words.
    pub const WORDS: usize = 2;
    const LEN: usize = Self::WORDS * std::mem::size_of::<u32>();

    /// Maps the doorbell at `path`. With `create`, the file is created (zeroed) if missing;
    /// without it, a missing file is `NotFound` (the target uses no doorbell).
    pub fn map(path: &Path, create: bool) -> std::io::Result<Bell> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)?;
        if file.metadata()?.len() < Self::LEN as u64 {
            if !create {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: shorter than {} bytes", path.display(), Self::LEN),
                ));
            }
            file.set_len(Self::LEN as u64)?;
        }
        // SAFETY: a fresh shared mapping of LEN bytes of an open file at least LEN bytes
        // long; the kernel picks the address, so nothing existing is replaced.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let words = std::ptr::NonNull::new(ptr.cast())
            .ok_or_else(|| std::io::Error::other("mmap returned NULL"))?;
        Ok(Bell { words })
    }

    /// Word `i` (panics when `i >= WORDS`).
    #[must_use]
    pub fn word(&self, i: usize) -> &std::sync::atomic::AtomicU32 {
        assert!(i < Self::WORDS, "doorbell word {i} out of range");
        // SAFETY: `i` is in range, the mapping is page-aligned, writable and lives as long as
        // `self`; `AtomicU32` has the layout of `u32`.
        unsafe { &*self.words.as_ptr().add(i) }
    }

    /// Sleeps while word `i` still holds `seen`, at most `timeout` (a wake-up, a signal or a
    /// changed value ends it early; callers re-check their condition either way).
    pub fn wait(&self, i: usize, seen: u32, timeout: Duration) {
        let ts = libc::timespec {
            tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(timeout.subsec_nanos()),
        };
        let word: *const std::sync::atomic::AtomicU32 = self.word(i);
        // SAFETY: FUTEX_WAIT (shared, not private: the word is in a MAP_SHARED file mapping
        // other processes also map) reads the aligned u32 at `word`, valid for the call, and
        // the timespec, which outlives the call.
        let _ = unsafe {
            libc::syscall(
                libc::SYS_futex,
                word,
                libc::FUTEX_WAIT,
                seen,
                &ts as *const libc::timespec,
            )
        };
    }

    /// Adds one to word `i` and wakes every waiter on it.
    pub fn ring(&self, i: usize) {
        let word = self.word(i);
        word.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let ptr: *const std::sync::atomic::AtomicU32 = word;
        // SAFETY: FUTEX_WAKE only uses the address as a key; it is a valid aligned u32.
        let _ = unsafe { libc::syscall(libc::SYS_futex, ptr, libc::FUTEX_WAKE, i32::MAX) };
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the LEN bytes `map` mapped; no reference into the mapping
        // outlives `self` (every `word` borrow is tied to it).
        let _ = unsafe { libc::munmap(self.words.as_ptr().cast(), Self::LEN) };
    }
}
