//! Everything `unsafe` in the mock: the C ABI surface ([`exports`]) and the few system calls
//! without a safe wrapper ([`sys`]).

pub mod exports;
pub mod sys;

/// Every driver symbol the library exports (what a world can hide).
pub use mock_cuda_world::DRIVER_SYMBOLS as EXPORTED_SYMBOLS;

/// A caller's host buffer in an asynchronous copy. CUDA's contract for `cuMemcpy*Async`: the
/// buffer stays valid, and the caller leaves it alone, until the copy's stream is
/// synchronised. The mock keeps it: the bytes move on the stream's worker, and
/// `cuStreamSynchronize` (or `cuStreamDestroy`) returns only after they have.
#[derive(Debug, Clone, Copy)]
pub struct HostBuf {
    ptr: usize,
    len: usize,
}

impl HostBuf {
    /// A buffer of `len` bytes at `ptr` (non-NULL unless `len` is 0).
    #[must_use]
    pub fn new(ptr: *const std::ffi::c_void, len: usize) -> Self {
        Self {
            ptr: ptr as usize,
            len: if ptr.is_null() { 0 } else { len },
        }
    }

    /// Its length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Runs `f` on the bytes, to read them.
    pub fn with<T>(&self, f: impl FnOnce(&[u8]) -> T) -> T {
        if self.len == 0 {
            return f(&[]);
        }
        // SAFETY: the caller of the copy passed `len` readable bytes at `ptr` (non-NULL) and,
        // by the API's contract, keeps them valid and unmodified until the stream is
        // synchronised, which waits for this closure's work.
        f(unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) })
    }

    /// Runs `f` on the bytes, to write them.
    pub fn with_mut<T>(&self, f: impl FnOnce(&mut [u8]) -> T) -> T {
        if self.len == 0 {
            return f(&mut []);
        }
        // SAFETY: the caller of the copy passed `len` writable bytes at `ptr` (non-NULL) and,
        // by the API's contract, neither reads nor frees them until the stream is
        // synchronised, which waits for this closure's work; one copy writes them at a time.
        f(unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) })
    }
}
