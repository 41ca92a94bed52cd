//! Moving one GPU's bytes between the device and its image file ([`super::format`]),
//! with the copies and the file I/O overlapped, through the [`DeviceCopy`] seam (the copier implements it with the driver's
//! asynchronous copies on the stream the driver handed it).
//!
//! - [`dump_gpu`]: while chunk *i* is copied from the device into one staging buffer, chunk
//!   *i − 1* is classified, checksummed and written from the other; then the stream is
//!   synchronized. Uniform chunks (every byte one value: zeros above all) are not written: runs
//!   of them become fill frames. The file ends with the end frame and an `fdatasync`.
//! - [`verify_file`]: the header and the frame structure, reading only the frame blocks and
//!   seeking over the data: the cheap check a restore runs on every file before it touches any
//!   task.
//! - [`restore_gpu`]: a reader thread reads the frames in order, each data chunk (and the
//!   frame block after it, in the same read) into a free staging buffer, while the GPU's thread
//!   checks the chunk before it and the device copies the one before that: with three buffers
//!   the disk, the checksum and the copy each work on their own chunk. No chunk is handed to
//!   the device before its checksum matched, and the frame structure is checked again as it
//!   streams. Its caller runs [`verify_file`] on every file first (the copier does, for all of a
//!   task's files, before it opens the task's restore).
//!
//! The staging buffers move between the pipeline and the device by value ([`DeviceCopy::Buf`]):
//! a buffer enqueued for a copy belongs to the device until [`DeviceCopy::sync`] hands it back,
//! so no code can touch or free memory a copy is still using.
//!
//! # `O_DIRECT`
//!
//! [`open_for_dump`] and [`open_for_restore`] try `O_DIRECT` and fall back to buffered I/O when
//! the filesystem refuses it with `EINVAL` at `open`; a filesystem that takes the flag at `open`
//! but refuses the first transfer with `EINVAL` is reopened buffered by path there and then
//! ([`ImageFile::direct`] tells which was used). Every transfer is a multiple of
//! [`ALIGN`] at an aligned file offset, from or to an aligned buffer: the staging buffers
//! ([`DeviceCopy::take_buffers`], whose alignment is checked when the file is direct) and
//! [`AlignedBuf`] for the frame blocks.

use super::format::{self, FormatError, Frame, Header, Walker, ALIGN, ALIGN64};
use abi::{CUresult, GpuUuid};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A failed driver call: the function and what it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{function} failed: {result}")]
pub struct DeviceError {
    /// The driver function (`cuMemcpyDtoHAsync`, `cuStreamSynchronize`, ...).
    pub function: &'static str,
    /// Its `CUresult`.
    pub result: CUresult,
}

/// One GPU's side of an open custom-storage operation, as the copier drives it.
pub trait DeviceCopy {
    /// A staging buffer (pinned host memory in the copier).
    type Buf: AsRef<[u8]> + AsMut<[u8]> + Send;
    /// The bytes the driver mapped for this GPU (the per-device `size`).
    fn size(&self) -> u64;
    /// Hands over the staging buffers: at least two, each [`ALIGN`]-aligned and of at least the
    /// chunk size (a restore reads the next frame block with a chunk's data when a buffer has
    /// [`ALIGN`] bytes to spare, and keeps the disk, the checksum and the copy busy at once
    /// with three). A second call gets none.
    fn take_buffers(&mut self) -> Vec<Self::Buf>;
    /// Enqueues (`cuMemcpyDtoHAsync`) `len` bytes at device offset `off` into `buf`, which is
    /// the device's until [`DeviceCopy::sync`] hands it back (also when this fails).
    fn enqueue_to_host(&mut self, off: u64, buf: Self::Buf, len: usize) -> Result<(), DeviceError>;
    /// Enqueues (`cuMemcpyHtoDAsync`) the device bytes `off..off + len` from `buf[..piece]`,
    /// copied again for each `piece` bytes (a fill run longer than a chunk; the last copy is
    /// shorter); `buf` is the device's until [`DeviceCopy::sync`] hands it back (also when this
    /// fails).
    fn enqueue_to_device(
        &mut self,
        buf: Self::Buf,
        off: u64,
        len: u64,
        piece: usize,
    ) -> Result<(), DeviceError>;
    /// Waits for everything enqueued (`cuStreamSynchronize`) and hands back the buffers, in the
    /// order they were enqueued. After a failure they stay with the device.
    fn sync(&mut self) -> Result<Vec<Self::Buf>, DeviceError>;
}

/// A heap buffer whose bytes start at an [`ALIGN`]-aligned address, in safe code: it
/// over-allocates by [`ALIGN`] and starts at the first aligned byte.
#[derive(Debug)]
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes.
    #[must_use]
    pub fn new(len: usize) -> Self {
        let storage = vec![0u8; len + ALIGN];
        let start = (ALIGN - storage.as_ptr() as usize % ALIGN) % ALIGN;
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    /// The bytes.
    #[must_use]
    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    /// The bytes, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// An image file open for a dump or a restore.
#[derive(Debug)]
pub struct ImageFile {
    pub file: File,
    /// Its path, for messages (and for reopening it buffered).
    pub path: PathBuf,
    /// Whether it is open with `O_DIRECT`.
    pub direct: bool,
}

/// The image file name of task `pid`'s GPU at `place` in its per-device list.
#[must_use]
pub fn file_name(pid: i32, place: u32) -> String {
    format!("cuda-cs-{pid}-{place}.img")
}

/// What a dump writes into the header besides the sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub dump_id: [u8; 16],
    pub pid: i32,
    pub uuid: GpuUuid,
    pub place: u32,
}

/// What a restore expects a file's header to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub dump_id: [u8; 16],
    pub pid: i32,
    pub uuid: GpuUuid,
    pub place: u32,
    /// The device size.
    pub size: u64,
}

/// How [`dump_gpu`] works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DumpOptions {
    /// Bytes per chunk: a multiple of [`ALIGN`], at most [`format::MAX_CHUNK`], at most the
    /// staging buffers' size.
    pub chunk: u32,
}

impl Default for DumpOptions {
    fn default() -> Self {
        DumpOptions { chunk: 32 << 20 }
    }
}

/// How [`restore_gpu`] works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RestoreOptions {
    /// The target memory is known to be zero: runs of zeros are not copied.
    pub target_zeroed: bool,
}

/// What a dump did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DumpStats {
    pub device_bytes: u64,
    /// Bytes in data frames (their true lengths).
    pub data_bytes: u64,
    /// Bytes recorded as fill frames, not written.
    pub fill_bytes: u64,
    /// The file's size.
    pub file_bytes: u64,
    pub data_frames: u64,
    pub fill_frames: u64,
    pub elapsed: Duration,
    /// Whether the file was written with `O_DIRECT`.
    pub direct: bool,
}

/// What a restore did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreStats {
    pub device_bytes: u64,
    /// Bytes copied from data frames.
    pub data_bytes: u64,
    /// Bytes of fill frames copied from a filled staging buffer.
    pub fill_bytes_copied: u64,
    /// Bytes of zero fill frames not copied ([`RestoreOptions::target_zeroed`]).
    pub fill_bytes_skipped: u64,
    pub file_bytes: u64,
    pub elapsed: Duration,
    /// Whether the file was read with `O_DIRECT`.
    pub direct: bool,
}

/// A file's header and frame structure, as [`verify_file`] found them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub header: Header,
    pub data_frames: u64,
    pub fill_frames: u64,
    pub data_bytes: u64,
    pub fill_bytes: u64,
    pub file_bytes: u64,
}

fn hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why a dump, check or restore of one file failed. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum CsError {
    /// The bytes are not a valid file: `offset` is the file offset of the frame (block) at fault.
    #[error("{}: at byte {offset}: {source}", .file.display())]
    Format {
        file: PathBuf,
        offset: u64,
        source: FormatError,
    },
    #[error(
        "{}: left by another dump (dump id {}, this dump is {})",
        .file.display(), hex(.found), hex(.expected)
    )]
    Stale {
        file: PathBuf,
        found: [u8; 16],
        expected: [u8; 16],
    },
    #[error("{}: written for pid {found}, expected pid {expected}", .file.display())]
    WrongPid {
        file: PathBuf,
        found: i32,
        expected: i32,
    },
    #[error(
        "{}: written for GPU {found} at place {found_place}, expected GPU {expected} at place \
         {expected_place}",
        .file.display()
    )]
    WrongGpu {
        file: PathBuf,
        found: GpuUuid,
        found_place: u32,
        expected: GpuUuid,
        expected_place: u32,
    },
    #[error("{}: holds {found} device bytes, expected {expected}", .file.display())]
    WrongSize {
        file: PathBuf,
        found: u64,
        expected: u64,
    },
    #[error("{}: the GPU's mapping has {device} bytes, the restore expects {expected}", .file.display())]
    DeviceSize {
        file: PathBuf,
        device: u64,
        expected: u64,
    },
    #[error("{}: {op} at byte {offset}: {source}", .file.display())]
    Io {
        file: PathBuf,
        op: &'static str,
        offset: u64,
        source: io::Error,
    },
    #[error("{}: no space left writing at byte {offset}: {source}", .file.display())]
    NoSpace {
        file: PathBuf,
        offset: u64,
        source: io::Error,
    },
    /// A driver copy failed. `completed`: device bytes `0..completed` were in the file (dump)
    /// or on the device (restore) when it did; `file_bytes`: bytes of the file written or read.
    #[error(
        "{}: {source} at device offset {device_offset} ({completed} device bytes done, {file_bytes} \
         file bytes)",
        .file.display()
    )]
    Device {
        file: PathBuf,
        device_offset: u64,
        completed: u64,
        file_bytes: u64,
        source: DeviceError,
    },
    #[error(
        "{}: chunk size {chunk} is not a multiple of {ALIGN} up to {}",
        .file.display(), format::MAX_CHUNK
    )]
    Chunk { file: PathBuf, chunk: u32 },
    #[error(
        "{}: staging buffer {which} ({len} bytes at address {addr:#x}) is smaller than a chunk \
         ({chunk}) or not {ALIGN}-aligned",
        .file.display()
    )]
    Buffer {
        file: PathBuf,
        which: usize,
        len: usize,
        addr: usize,
        chunk: u32,
    },
    #[error("{}: the device lent {count} staging buffer(s), a copy needs two", .file.display())]
    Buffers { file: PathBuf, count: usize },
    /// The restore's reader thread ended without a result (it panicked).
    #[error("{}: the reader thread failed", .file.display())]
    Reader { file: PathBuf },
    /// The dump's writer thread ended without a result (it panicked).
    #[error("{}: the writer thread failed", .file.display())]
    Writer { file: PathBuf },
}

fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

fn is_einval(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

impl ImageFile {
    fn io(&self, op: &'static str, offset: u64) -> impl FnOnce(io::Error) -> CsError + '_ {
        move |source| {
            if is_no_space(&source) {
                CsError::NoSpace {
                    file: self.path.clone(),
                    offset,
                    source,
                }
            } else {
                CsError::Io {
                    file: self.path.clone(),
                    op,
                    offset,
                    source,
                }
            }
        }
    }

    fn format(&self, offset: u64) -> impl FnOnce(FormatError) -> CsError + '_ {
        move |source| CsError::Format {
            file: self.path.clone(),
            offset,
            source,
        }
    }

    /// Falls back to buffered I/O after `EINVAL` on a direct transfer (a filesystem that takes
    /// `O_DIRECT` at `open` but not for I/O).
    fn reopen_buffered(&mut self, write: bool) -> io::Result<()> {
        self.file = OpenOptions::new()
            .read(!write)
            .write(write)
            .custom_flags(libc::O_CLOEXEC)
            .open(&self.path)?;
        self.direct = false;
        Ok(())
    }

    fn write_at(&mut self, buf: &[u8], offset: u64) -> Result<(), CsError> {
        match self.file.write_all_at(buf, offset) {
            Err(e) if is_einval(&e) && self.direct => {
                self.reopen_buffered(true)
                    .map_err(self.io("reopen (buffered)", offset))?;
                self.file
                    .write_all_at(buf, offset)
                    .map_err(self.io("write", offset))
            }
            r => r.map_err(self.io("write", offset)),
        }
    }

    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> Result<(), CsError> {
        match self.file.read_exact_at(buf, offset) {
            Err(e) if is_einval(&e) && self.direct => {
                self.reopen_buffered(false)
                    .map_err(self.io("reopen (buffered)", offset))?;
                self.file
                    .read_exact_at(buf, offset)
                    .map_err(self.io("read", offset))
            }
            r => r.map_err(self.io("read", offset)),
        }
    }

    /// Through the page cache (not `O_DIRECT`): asks the kernel to start reading
    /// `offset..offset + len` now, so that the disk works while the caller checks and copies
    /// what it read before. A hint: a refusal changes nothing but speed.
    fn read_ahead(&self, offset: u64, len: u64) {
        if !self.direct {
            let _ = crate::ffi::fadvise(&self.file, offset, len, libc::POSIX_FADV_WILLNEED);
        }
    }

    /// Through the page cache: drops `offset..offset + len`, read and no longer needed, so that
    /// a restore of tens of GB does not fill the host's memory with it.
    fn done_with(&self, offset: u64, len: u64) {
        if !self.direct {
            let _ = crate::ffi::fadvise(&self.file, offset, len, libc::POSIX_FADV_DONTNEED);
        }
    }

    fn len(&self) -> Result<u64, CsError> {
        Ok(self.file.metadata().map_err(self.io("fstat", 0))?.len())
    }
}

/// Creates `dir/name` for a dump: `O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC`, mode 0600, with
/// `O_DIRECT` where the filesystem takes it. A filesystem that refuses `O_DIRECT` with `EINVAL`
/// gets the file buffered; one that created the (empty) file before refusing has it removed
/// and created again without the flag.
pub fn open_for_dump(dir: &Path, name: &str) -> Result<ImageFile, CsError> {
    open_dump_with(&dir.join(name), |path, direct| {
        let flags = libc::O_CLOEXEC | if direct { libc::O_DIRECT } else { 0 };
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(flags)
            .open(path)
    })
}

fn open_dump_with(
    path: &Path,
    open: impl Fn(&Path, bool) -> io::Result<File>,
) -> Result<ImageFile, CsError> {
    let failed = |source| CsError::Io {
        file: path.to_owned(),
        op: "create",
        offset: 0,
        source,
    };
    match open(path, true) {
        Ok(file) => Ok(ImageFile {
            file,
            path: path.to_owned(),
            direct: true,
        }),
        Err(e) if is_einval(&e) => {
            // O_EXCL: a file there now was created by this call (a file that was there before
            // fails with EEXIST before the filesystem sees O_DIRECT). Only an empty one is
            // removed, to be safe.
            if std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0) {
                std::fs::remove_file(path).map_err(failed)?;
            }
            let file = open(path, false).map_err(failed)?;
            Ok(ImageFile {
                file,
                path: path.to_owned(),
                direct: false,
            })
        }
        Err(e) => Err(failed(e)),
    }
}

/// Opens `path` for a restore: `O_RDONLY|O_CLOEXEC`, with `O_DIRECT` where the filesystem
/// takes it (buffered after `EINVAL`).
pub fn open_for_restore(path: &Path) -> Result<ImageFile, CsError> {
    let open = |direct: bool| {
        let flags = libc::O_CLOEXEC | if direct { libc::O_DIRECT } else { 0 };
        OpenOptions::new().read(true).custom_flags(flags).open(path)
    };
    let failed = |source| CsError::Io {
        file: path.to_owned(),
        op: "open",
        offset: 0,
        source,
    };
    let (file, direct) = match open(true) {
        Ok(f) => (f, true),
        Err(e) if is_einval(&e) => (open(false).map_err(failed)?, false),
        Err(e) => return Err(failed(e)),
    };
    Ok(ImageFile {
        file,
        path: path.to_owned(),
        direct,
    })
}

fn check_buffers<B: AsRef<[u8]>>(bufs: &[B], f: &ImageFile, chunk: u32) -> Result<(), CsError> {
    if !format::valid_chunk(chunk) {
        return Err(CsError::Chunk {
            file: f.path.clone(),
            chunk,
        });
    }
    if bufs.len() < 2 {
        return Err(CsError::Buffers {
            file: f.path.clone(),
            count: bufs.len(),
        });
    }
    for (which, b) in bufs.iter().enumerate() {
        let b = b.as_ref();
        let addr = b.as_ptr() as usize;
        if b.len() < chunk as usize || (f.direct && !addr.is_multiple_of(ALIGN)) {
            return Err(CsError::Buffer {
                file: f.path.clone(),
                which,
                len: b.len(),
                addr,
                chunk,
            });
        }
    }
    Ok(())
}

/// Every byte of `b` is the same: that byte.
fn uniform(b: &[u8]) -> Option<u8> {
    let first = *b.first()?;
    let word = u64::from_ne_bytes([first; 8]);
    let mut words = b.chunks_exact(8);
    let same = words
        .by_ref()
        .all(|w| u64::from_ne_bytes(w.try_into().unwrap_or_default()) == word)
        && words.remainder().iter().all(|&x| x == first);
    same.then_some(first)
}

/// What the GPU's thread hands the writer thread, in file order: a frame block, and a data
/// frame's bytes (`total` of the buffer, padded) to write after it.
struct Job<B> {
    block: Box<format::Block>,
    data: Option<(B, usize)>,
}

/// The frame side of a dump, on the GPU's thread: the frame state, the pending fill run, where
/// the next block goes; the blocks and data go to the writer thread.
struct Framer<'a, B> {
    path: &'a Path,
    pos: u64,
    walker: Walker,
    /// A run of uniform chunks not yet written: its length and value.
    run: Option<(u64, u8)>,
    stats: DumpStats,
    jobs: mpsc::Sender<Job<B>>,
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> Framer<'_, B> {
    fn format(&self) -> impl FnOnce(FormatError) -> CsError + '_ {
        let offset = self.pos;
        move |source| CsError::Format {
            file: self.path.to_owned(),
            offset,
            source,
        }
    }

    fn send(&mut self, block: Box<format::Block>, data: Option<(B, usize)>) -> Result<(), Stop> {
        self.pos += ALIGN64 + data.as_ref().map_or(0, |d| d.1 as u64);
        self.jobs
            .send(Job { block, data })
            .map_err(|_| Stop::Writer)
    }

    fn flush_run(&mut self) -> Result<(), Stop> {
        if let Some((len, value)) = self.run.take() {
            let (_, b) = self.walker.fill(len, value).map_err(self.format())?;
            self.send(b, None)?;
            self.stats.fill_frames += 1;
        }
        Ok(())
    }

    /// Chunk `buf[..len]` (the buffer holds at least `padded(len)` bytes): a uniform chunk
    /// extends the fill run and its buffer is handed back; a data chunk's buffer goes to the
    /// writer with its frame block.
    fn chunk(&mut self, mut buf: B, len: usize) -> Result<Option<B>, Stop> {
        if let Some(v) = uniform(&buf.as_ref()[..len]) {
            self.run = match self.run {
                Some((l, rv)) if rv == v => Some((l + len as u64, v)),
                _ => {
                    self.flush_run()?;
                    Some((len as u64, v))
                }
            };
            self.stats.fill_bytes += len as u64;
            return Ok(Some(buf));
        }
        self.flush_run()?;
        let total = format::padded(len as u64) as usize;
        let b = buf.as_mut();
        b[len..total].fill(0);
        let crc = format::crc(&b[..len]);
        let (_, block) = self.walker.data(len as u64, crc).map_err(self.format())?;
        self.send(block, Some((buf, total)))?;
        self.stats.data_bytes += len as u64;
        self.stats.data_frames += 1;
        Ok(None)
    }

    fn device_error(&self, device_offset: u64, source: DeviceError) -> Stop {
        Stop::Failed(CsError::Device {
            file: self.path.to_owned(),
            device_offset,
            completed: self.walker.covered(),
            file_bytes: self.pos,
            source,
        })
    }
}

/// Why the GPU's side of a dump stopped.
enum Stop {
    Failed(CsError),
    /// The writer thread failed (its error is returned).
    Writer,
}

impl From<CsError> for Stop {
    fn from(e: CsError) -> Self {
        Stop::Failed(e)
    }
}

/// The writer thread: writes each job's block and data where the previous one ended and hands
/// the data buffer back; ends when the jobs do, syncing the file (`fdatasync`), or at the first
/// error. Returns the file's size.
fn write_jobs<B: AsRef<[u8]>>(
    out: &mut ImageFile,
    jobs: &mpsc::Receiver<Job<B>>,
    back: &mpsc::Sender<B>,
) -> Result<u64, CsError> {
    let mut pos = 0;
    let mut block = AlignedBuf::new(ALIGN);
    for job in jobs {
        block.as_mut_slice().copy_from_slice(&job.block[..]);
        out.write_at(block.as_slice(), pos)?;
        pos += ALIGN64;
        if let Some((buf, total)) = job.data {
            out.write_at(&buf.as_ref()[..total], pos)?;
            pos += total as u64;
            // The GPU's thread is gone only after a failure of its own.
            let _ = back.send(buf);
        }
    }
    out.file.sync_data().map_err(out.io("fdatasync", pos))?;
    Ok(pos)
}

/// Copies the device's bytes into `out` (a new, empty file, see [`open_for_dump`]): the header
/// from `id`, the device's size and `options.chunk`; data and fill frames; the end frame; then
/// `fdatasync`. A failure leaves a file without its end frame (which [`verify_file`] refuses
/// as truncated); a device failure says how far the file got ([`CsError::Device`]), with
/// everything before that point written. The file is written on a thread of its own while
/// this thread copies a chunk and frames the one before it.
pub fn dump_gpu<D: DeviceCopy + ?Sized>(
    dev: &mut D,
    out: &mut ImageFile,
    id: &Identity,
    options: &DumpOptions,
) -> Result<DumpStats, CsError> {
    let started = Instant::now();
    let chunk = options.chunk;
    let free = dev.take_buffers();
    check_buffers(&free, out, chunk)?;
    let header = Header {
        dump_id: id.dump_id,
        pid: id.pid,
        uuid: id.uuid,
        place: id.place,
        chunk,
        size: dev.size(),
    };
    let path = out.path.clone();
    let (jobs_tx, jobs_rx) = mpsc::channel::<Job<D::Buf>>();
    let (back_tx, back_rx) = mpsc::channel::<D::Buf>();
    let file = &mut *out;
    let (framed, written) = std::thread::scope(|s| {
        let writer = s.spawn(move || write_jobs(file, &jobs_rx, &back_tx));
        let framed = frame_chunks(dev, &path, header, free, jobs_tx, &back_rx);
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(CsError::Writer { file: path.clone() }));
        (framed, written)
    });
    let mut stats = match (framed, written) {
        (Err(Stop::Failed(e)), _) | (_, Err(e)) => return Err(e),
        // The writer stops early only with an error of its own.
        (Err(Stop::Writer), Ok(_)) => return Err(CsError::Writer { file: path }),
        (Ok(stats), Ok(file_bytes)) => DumpStats {
            file_bytes,
            ..stats
        },
    };
    stats.direct = out.direct;
    stats.elapsed = started.elapsed();
    Ok(stats)
}

/// The GPU's thread of a dump: copies chunk *i* into a free buffer while it frames chunk
/// *i − 1* for the writer; the buffers come back from the writer (data) or straight away
/// (uniform chunks). Returns when the end frame is queued (dropping `jobs` ends the writer).
fn frame_chunks<D: DeviceCopy + ?Sized>(
    dev: &mut D,
    path: &Path,
    header: Header,
    mut free: Vec<D::Buf>,
    jobs: mpsc::Sender<Job<D::Buf>>,
    back: &mpsc::Receiver<D::Buf>,
) -> Result<DumpStats, Stop> {
    let (hb, hcrc) = header.encode();
    let mut w = Framer {
        path,
        pos: 0,
        walker: Walker::new(header, hcrc),
        run: None,
        stats: DumpStats {
            device_bytes: header.size,
            data_bytes: 0,
            fill_bytes: 0,
            file_bytes: 0,
            data_frames: 0,
            fill_frames: 0,
            elapsed: Duration::ZERO,
            direct: false,
        },
        jobs,
    };
    w.send(hb, None)?;
    let chunk64 = u64::from(header.chunk);
    let n = header.chunks();
    // A chunk copied into its buffer, waiting to be framed, and its length.
    let mut prev: Option<(D::Buf, usize)> = None;
    let mut copy = || -> Result<(), Stop> {
        for i in 0..=n {
            let cur = if i < n {
                let off = i * chunk64;
                let len = chunk64.min(header.size - off) as usize;
                // A free buffer, or the next one the writer is done with.
                let buf = match free.pop() {
                    Some(b) => b,
                    None => back.recv().map_err(|_| Stop::Writer)?,
                };
                dev.enqueue_to_host(off, buf, len)
                    .map_err(|e| w.device_error(off, e))?;
                Some(len)
            } else {
                None
            };
            // The previous chunk, from its buffer, while this one is copied.
            if let Some((buf, len)) = prev.take() {
                free.extend(w.chunk(buf, len)?);
            }
            if let Some(len) = cur {
                let mut done = dev
                    .sync()
                    .map_err(|e| w.device_error(i * chunk64 + len as u64, e))?;
                let buf = done.pop().ok_or_else(|| CsError::Buffers {
                    file: path.to_owned(),
                    count: 0,
                })?;
                prev = Some((buf, len));
            }
        }
        w.flush_run()?;
        let (_, end) = w.walker.end().map_err(w.format())?;
        w.send(end, None)
    };
    copy()?;
    Ok(w.stats)
}

/// Reads a file's frame blocks in order, applying the format's rules.
struct Reader {
    len: u64,
    /// The file offset of the next frame block.
    at: u64,
    block: AlignedBuf,
    /// `block` already holds the frame block at this offset (read with the data before it).
    cached: Option<u64>,
    walker: Walker,
}

impl Reader {
    /// Reads and checks the header against `expected`.
    fn open(f: &mut ImageFile, expected: &Expected) -> Result<(Reader, u32), CsError> {
        let len = f.len()?;
        if len < ALIGN64 {
            return Err(f.format(0)(FormatError::Truncated {
                len,
                needed: ALIGN64,
            }));
        }
        let mut block = AlignedBuf::new(ALIGN);
        f.read_at(block.as_mut_slice(), 0)?;
        let (h, hcrc) = Header::decode(block_of(&block)).map_err(f.format(0))?;
        let file = f.path.clone();
        if h.dump_id != expected.dump_id {
            return Err(CsError::Stale {
                file,
                found: h.dump_id,
                expected: expected.dump_id,
            });
        }
        if h.pid != expected.pid {
            return Err(CsError::WrongPid {
                file,
                found: h.pid,
                expected: expected.pid,
            });
        }
        if h.uuid != expected.uuid || h.place != expected.place {
            return Err(CsError::WrongGpu {
                file,
                found: h.uuid,
                found_place: h.place,
                expected: expected.uuid,
                expected_place: expected.place,
            });
        }
        if h.size != expected.size {
            return Err(CsError::WrongSize {
                file,
                found: h.size,
                expected: expected.size,
            });
        }
        let r = Reader {
            len,
            at: ALIGN64,
            block,
            cached: None,
            walker: Walker::new(h, hcrc),
        };
        Ok((r, h.chunk))
    }

    /// The next frame and the file offset of its block, or `None` after the end frame (when
    /// nothing follows it). A data frame's bytes are the caller's to read or skip.
    fn next(&mut self, f: &mut ImageFile) -> Result<Option<(Frame, u64)>, CsError> {
        let at = self.at;
        if self.walker.done() {
            if at != self.len {
                return Err(f.format(at)(FormatError::Trailing {
                    extra: self.len.saturating_sub(at),
                }));
            }
            return Ok(None);
        }
        let truncated = |needed| FormatError::Truncated {
            len: self.len,
            needed,
        };
        if at + ALIGN64 > self.len {
            return Err(f.format(at)(truncated(at + ALIGN64)));
        }
        if self.cached.take() != Some(at) {
            f.read_at(self.block.as_mut_slice(), at)?;
        }
        let (frame, crc) = Frame::decode(block_of(&self.block)).map_err(f.format(at))?;
        self.walker.accept(&frame, crc).map_err(f.format(at))?;
        let next = at + frame.file_bytes();
        if next > self.len {
            return Err(f.format(at)(truncated(next)));
        }
        self.at = next;
        Ok(Some((frame, at)))
    }
}

fn block_of(b: &AlignedBuf) -> &format::Block {
    b.as_slice().try_into().unwrap_or(&[0; ALIGN])
}

/// Checks a file's header against `expected` and its frame structure and end frame, reading
/// the frame blocks only (the data bytes and their checksums are [`restore_gpu`]'s): a file of
/// another dump, task, GPU or size, or a damaged, truncated or extended one, is refused, naming
/// the file and the offset.
pub fn verify_file(f: &mut ImageFile, expected: &Expected) -> Result<Summary, CsError> {
    let (mut r, _) = Reader::open(f, expected)?;
    let mut s = Summary {
        header: *r.walker.header(),
        data_frames: 0,
        fill_frames: 0,
        data_bytes: 0,
        fill_bytes: 0,
        file_bytes: r.len,
    };
    while let Some((frame, _)) = r.next(f)? {
        match frame {
            Frame::Data { length, .. } => {
                s.data_frames += 1;
                s.data_bytes += length;
            }
            Frame::Fill { length, .. } => {
                s.fill_frames += 1;
                s.fill_bytes += length;
            }
            Frame::End { .. } => {}
        }
    }
    Ok(s)
}

/// What the reader thread hands the GPU's thread, in file order.
enum Piece<B> {
    /// A data frame's bytes in `buf` (checksum not checked yet); its frame block was at `at`.
    Data {
        buf: B,
        frame: Frame,
        at: u64,
        /// The file offset after this frame.
        next: u64,
    },
    /// A fill frame: `buf` holds one chunk of its value, for `len` device bytes at `off`.
    Fill {
        buf: B,
        off: u64,
        len: u64,
        next: u64,
    },
}

/// What the reader thread read, and why it stopped early.
struct ReadStats {
    data_bytes: u64,
    fill_bytes_copied: u64,
    fill_bytes_skipped: u64,
    direct: bool,
}

enum ReadEnd {
    Failed(CsError),
    /// The GPU's thread stopped taking pieces (it failed first).
    Stopped,
}

impl From<CsError> for ReadEnd {
    fn from(e: CsError) -> Self {
        ReadEnd::Failed(e)
    }
}

/// Copies `f` to the device. The caller checks the file first with [`verify_file`] where a
/// damaged file must be refused before the device is touched; the structure is checked again
/// here as the frames stream (a file changed since is refused too). Every chunk's checksum is
/// checked before it is enqueued; the first mismatch is returned ([`FormatError::DataCrc`]:
/// the file, the frame's offset, the device offset, both checksums) with nothing of that chunk
/// or after it handed to the device. The file is read on a thread of its own, into the free
/// buffers, while this thread checks and copies.
pub fn restore_gpu<D: DeviceCopy + ?Sized>(
    dev: &mut D,
    f: &mut ImageFile,
    expected: &Expected,
    options: &RestoreOptions,
) -> Result<RestoreStats, CsError> {
    let started = Instant::now();
    if dev.size() != expected.size {
        return Err(CsError::DeviceSize {
            file: f.path.clone(),
            device: dev.size(),
            expected: expected.size,
        });
    }
    let (r, chunk) = Reader::open(f, expected)?;
    let bufs = dev.take_buffers();
    check_buffers(&bufs, f, chunk)?;
    let path = f.path.clone();
    let file_bytes = r.len;
    let (free_tx, free_rx) = mpsc::channel::<D::Buf>();
    let (full_tx, full_rx) = mpsc::channel::<Piece<D::Buf>>();
    for b in bufs {
        // The receiver is alive: it is used below.
        let _ = free_tx.send(b);
    }
    let (copied, read) = std::thread::scope(|s| {
        let reader = s.spawn(move || read_pieces(f, r, chunk, options, &free_rx, &full_tx));
        // Takes both channel ends: when it returns, a reader still at work finds them closed.
        let copied = copy_pieces(dev, &path, chunk, free_tx, full_rx);
        let read = reader
            .join()
            .unwrap_or_else(|_| Err(ReadEnd::Failed(CsError::Reader { file: path.clone() })));
        (copied, read)
    });
    copied?;
    let read = match read {
        Ok(read) => read,
        Err(ReadEnd::Failed(e)) => return Err(e),
        // Only after the GPU's thread failed, which returned above.
        Err(ReadEnd::Stopped) => return Err(CsError::Reader { file: path }),
    };
    Ok(RestoreStats {
        device_bytes: expected.size,
        data_bytes: read.data_bytes,
        fill_bytes_copied: read.fill_bytes_copied,
        fill_bytes_skipped: read.fill_bytes_skipped,
        file_bytes,
        elapsed: started.elapsed(),
        direct: read.direct,
    })
}

/// The reader thread: walks the frames, reads each data chunk (with the frame block after it
/// when the buffer has room) and fills a buffer for each fill run to copy, handing them over
/// in order. Ends at the end frame, at the first error, or when the GPU's thread stops.
fn read_pieces<B: AsMut<[u8]>>(
    f: &mut ImageFile,
    mut r: Reader,
    chunk: u32,
    options: &RestoreOptions,
    free: &mpsc::Receiver<B>,
    full: &mpsc::Sender<Piece<B>>,
) -> Result<ReadStats, ReadEnd> {
    let mut st = ReadStats {
        data_bytes: 0,
        fill_bytes_copied: 0,
        fill_bytes_skipped: 0,
        direct: f.direct,
    };
    while let Some((frame, at)) = r.next(f)? {
        let piece = match frame {
            Frame::Data { length, .. } => {
                let mut buf = free.recv().map_err(|_| ReadEnd::Stopped)?;
                let b = buf.as_mut();
                let total = format::padded(length) as usize;
                // The next frame's block comes with the data in one read when the buffer has
                // room for it: one request per chunk, not two.
                let next = at + ALIGN64 + total as u64;
                let ahead = b.len() >= total + ALIGN && next + ALIGN64 <= r.len;
                let n = if ahead { total + ALIGN } else { total };
                // Through the page cache: the chunk after this one, while this one is read.
                f.read_ahead(next, (b.len() + ALIGN) as u64);
                f.read_at(&mut b[..n], at + ALIGN64)?;
                f.done_with(at, ALIGN64 + total as u64);
                if ahead {
                    r.block
                        .as_mut_slice()
                        .copy_from_slice(&b[total..total + ALIGN]);
                    r.cached = Some(next);
                }
                st.data_bytes += length;
                Piece::Data {
                    buf,
                    frame,
                    at,
                    next,
                }
            }
            Frame::Fill {
                offset,
                length,
                value,
                ..
            } => {
                if value == 0 && options.target_zeroed {
                    st.fill_bytes_skipped += length;
                    continue;
                }
                let mut buf = free.recv().map_err(|_| ReadEnd::Stopped)?;
                let n = length.min(chunk.into()) as usize;
                buf.as_mut()[..n].fill(value);
                st.fill_bytes_copied += length;
                Piece::Fill {
                    buf,
                    off: offset,
                    len: length,
                    next: at + ALIGN64,
                }
            }
            Frame::End { .. } => continue,
        };
        full.send(piece).map_err(|_| ReadEnd::Stopped)?;
    }
    st.direct = f.direct;
    Ok(st)
}

/// The GPU's thread: checks each data chunk while the chunk before it is copied, then waits
/// for that copy, hands its buffer back to the reader and enqueues the chunk. Ends when the
/// reader does (its result is the caller's to judge) or at the first error, having waited for
/// the copies in flight either way.
fn copy_pieces<D: DeviceCopy + ?Sized>(
    dev: &mut D,
    path: &Path,
    chunk: u32,
    free: mpsc::Sender<D::Buf>,
    full: mpsc::Receiver<Piece<D::Buf>>,
) -> Result<(), CsError> {
    // The device range of the copy in flight and the file bytes read through its frame.
    let mut flying: Option<(u64, u64, u64)> = None;
    let device = |off: u64, completed: u64, file_bytes: u64| {
        move |source| CsError::Device {
            file: path.to_owned(),
            device_offset: off,
            completed,
            file_bytes,
            source,
        }
    };
    let result = (|| {
        for piece in &full {
            let (buf, off, len, next) = match piece {
                Piece::Data {
                    buf,
                    frame,
                    at,
                    next,
                } => {
                    let Frame::Data { offset, length, .. } = frame else {
                        continue;
                    };
                    let b = buf.as_ref();
                    let total = (format::padded(length) as usize).min(b.len());
                    format::check_data(&frame, &b[..total]).map_err(|source| CsError::Format {
                        file: path.to_owned(),
                        offset: at,
                        source,
                    })?;
                    (buf, offset, length, next)
                }
                Piece::Fill {
                    buf,
                    off,
                    len,
                    next,
                } => (buf, off, len, next),
            };
            if let Some((o, l, fb)) = flying.take() {
                for b in dev.sync().map_err(device(o + l, o, fb))? {
                    // The reader is gone only after a failure of its own, which the caller
                    // returns.
                    let _ = free.send(b);
                }
            }
            // Every copy before this frame is done (synchronized above).
            dev.enqueue_to_device(buf, off, len, chunk as usize)
                .map_err(device(off, off, next))?;
            flying = Some((off, len, next));
        }
        Ok(())
    })();
    if let Some((o, l, fb)) = flying {
        let synced = dev.sync().map_err(device(o + l, o, fb));
        if result.is_ok() {
            synced?;
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;

    /// What the fake device saw of its buffers, shared with them.
    #[derive(Default)]
    struct Probe {
        /// Copies enqueued and not yet synchronized.
        pending: AtomicUsize,
        /// `as_ref` calls (the GPU thread's reads of a buffer) while a copy was in flight.
        refs_while_pending: AtomicUsize,
        /// `as_mut` calls while a copy was in flight.
        muts_while_pending: AtomicUsize,
        /// `as_mut` calls (a chunk read into a buffer, a fill, a dump's chunk padded).
        muts: AtomicUsize,
    }

    struct FakeBuf {
        buf: AlignedBuf,
        probe: Arc<Probe>,
    }

    impl AsRef<[u8]> for FakeBuf {
        fn as_ref(&self) -> &[u8] {
            if self.probe.pending.load(SeqCst) > 0 {
                self.probe.refs_while_pending.fetch_add(1, SeqCst);
            }
            self.buf.as_slice()
        }
    }

    impl AsMut<[u8]> for FakeBuf {
        fn as_mut(&mut self) -> &mut [u8] {
            if self.probe.pending.load(SeqCst) > 0 {
                self.probe.muts_while_pending.fetch_add(1, SeqCst);
            }
            self.probe.muts.fetch_add(1, SeqCst);
            self.buf.as_mut_slice()
        }
    }

    /// A copy: to the host or not, device offset, length, piece (to the device), its buffer;
    /// `None` for a buffer whose enqueue failed.
    type Pending = (Option<(bool, u64, u64, usize)>, FakeBuf);

    /// An in-memory GPU whose copies run at `sync`, as a stream's do: a pipeline that touches
    /// a buffer before its copy was synchronized cannot (the buffer is the device's), and one
    /// that reads a chunk only after the copy before it was synchronized does no overlapping.
    struct FakeDev {
        mem: Vec<u8>,
        bufs: Vec<FakeBuf>,
        pending: Vec<Pending>,
        enqueues: usize,
        syncs: usize,
        fail_enqueue: Option<usize>,
        fail_sync: Option<usize>,
        probe: Arc<Probe>,
        /// A restore of this many chunks: sync *k* (1-based) waits, up to 10 s, until the
        /// reader has filled buffers for chunks up to *k + 1* (0-based), two ahead of the copy
        /// it waits for; whether each got there is in `ahead`.
        read_ahead_of: Option<usize>,
        ahead: Vec<bool>,
    }

    impl FakeDev {
        /// Three buffers of a chunk and one frame block, as the copier's.
        fn new(mem: Vec<u8>, chunk: u32) -> Self {
            Self::with_buffers(mem, chunk as usize + ALIGN, 3)
        }

        fn with_buffers(mem: Vec<u8>, len: usize, count: usize) -> Self {
            let probe = Arc::new(Probe::default());
            FakeDev {
                mem,
                bufs: (0..count)
                    .map(|_| FakeBuf {
                        buf: AlignedBuf::new(len),
                        probe: probe.clone(),
                    })
                    .collect(),
                pending: Vec::new(),
                enqueues: 0,
                syncs: 0,
                fail_enqueue: None,
                fail_sync: None,
                probe,
                read_ahead_of: None,
                ahead: Vec::new(),
            }
        }

        fn enqueue(
            &mut self,
            copy: (bool, u64, u64, usize),
            buf: FakeBuf,
        ) -> Result<(), DeviceError> {
            self.enqueues += 1;
            let failed = self.fail_enqueue == Some(self.enqueues);
            self.pending.push(((!failed).then_some(copy), buf));
            self.probe.pending.store(self.pending.len(), SeqCst);
            if failed {
                return Err(FAILED);
            }
            Ok(())
        }
    }

    const FAILED: DeviceError = DeviceError {
        function: "cuMemcpyDtoHAsync",
        result: CUresult::ERROR_ILLEGAL_ADDRESS,
    };

    impl DeviceCopy for FakeDev {
        type Buf = FakeBuf;
        fn size(&self) -> u64 {
            self.mem.len() as u64
        }
        fn take_buffers(&mut self) -> Vec<FakeBuf> {
            std::mem::take(&mut self.bufs)
        }
        fn enqueue_to_host(
            &mut self,
            off: u64,
            buf: FakeBuf,
            len: usize,
        ) -> Result<(), DeviceError> {
            self.enqueue((true, off, len as u64, len), buf)
        }
        fn enqueue_to_device(
            &mut self,
            buf: FakeBuf,
            off: u64,
            len: u64,
            piece: usize,
        ) -> Result<(), DeviceError> {
            self.enqueue((false, off, len, piece), buf)
        }
        fn sync(&mut self) -> Result<Vec<FakeBuf>, DeviceError> {
            self.syncs += 1;
            if let Some(chunks) = self.read_ahead_of {
                let want = (self.syncs + 2).min(chunks);
                let until = Instant::now() + Duration::from_secs(10);
                while self.probe.muts.load(SeqCst) < want && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(1));
                }
                self.ahead.push(self.probe.muts.load(SeqCst) >= want);
            }
            if self.fail_sync == Some(self.syncs) {
                return Err(DeviceError {
                    function: "cuStreamSynchronize",
                    result: CUresult::ERROR_UNKNOWN,
                });
            }
            let mut back = Vec::new();
            for (copy, mut buf) in std::mem::take(&mut self.pending) {
                if let Some((to_host, off, len, piece)) = copy {
                    let b = buf.buf.as_mut_slice();
                    let mut o = off as usize;
                    let end = (off + len) as usize;
                    while o < end {
                        let n = (end - o).min(piece);
                        if to_host {
                            b[..n].copy_from_slice(&self.mem[o..o + n]);
                        } else {
                            self.mem[o..o + n].copy_from_slice(&b[..n]);
                        }
                        o += n;
                    }
                }
                back.push(buf);
            }
            self.probe.pending.store(0, SeqCst);
            Ok(back)
        }
    }

    const ID: Identity = Identity {
        dump_id: [0xd0; 16],
        pid: 4242,
        uuid: GpuUuid([0x11; 16]),
        place: 1,
    };

    fn expected(size: u64) -> Expected {
        Expected {
            dump_id: ID.dump_id,
            pid: ID.pid,
            uuid: ID.uuid,
            place: ID.place,
            size,
        }
    }

    fn random(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn dump(dir: &Path, mem: &[u8], chunk: u32) -> (PathBuf, DumpStats) {
        let mut dev = FakeDev::new(mem.to_vec(), chunk);
        let mut f = open_for_dump(dir, &file_name(ID.pid, ID.place)).unwrap();
        let opened_direct = f.direct;
        let stats = dump_gpu(&mut dev, &mut f, &ID, &DumpOptions { chunk }).unwrap();
        // Where the filesystem took O_DIRECT at open, every transfer was direct (aligned).
        assert_eq!(stats.direct, opened_direct);
        (f.path, stats)
    }

    fn restore(
        path: &Path,
        size: usize,
        chunk: u32,
        opts: RestoreOptions,
    ) -> Result<(Vec<u8>, RestoreStats), CsError> {
        restore_with(path, size, chunk, opts, ALIGN)
    }

    /// A restore through buffers of `chunk + spare` bytes (`spare` 0: every frame block is a
    /// read of its own).
    fn restore_with(
        path: &Path,
        size: usize,
        chunk: u32,
        opts: RestoreOptions,
        spare: usize,
    ) -> Result<(Vec<u8>, RestoreStats), CsError> {
        // Garbage in the target, so that fills must really be copied.
        let mut dev = FakeDev::with_buffers(vec![0xee; size], chunk as usize + spare, 3);
        let mut f = open_for_restore(path)?;
        let opened_direct = f.direct;
        let stats = restore_gpu(&mut dev, &mut f, &expected(size as u64), &opts)?;
        assert_eq!(stats.direct, opened_direct);
        Ok((dev.mem, stats))
    }

    fn round_trip(mem: &[u8], chunk: u32) -> (DumpStats, Summary) {
        let dir = tempfile::tempdir().unwrap();
        let (path, stats) = dump(dir.path(), mem, chunk);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), stats.file_bytes);
        let summary = verify_file(
            &mut open_for_restore(&path).unwrap(),
            &expected(mem.len() as u64),
        )
        .unwrap();
        let (back, rs) = restore(&path, mem.len(), chunk, RestoreOptions::default()).unwrap();
        assert!(back == mem, "restored bytes differ");
        assert_eq!(rs.data_bytes, stats.data_bytes);
        assert_eq!(rs.fill_bytes_copied, stats.fill_bytes);
        assert_eq!(summary.data_bytes, stats.data_bytes);
        assert_eq!(summary.fill_bytes, stats.fill_bytes);
        assert_eq!(stats.data_bytes + stats.fill_bytes, mem.len() as u64);
        (stats, summary)
    }

    const CHUNK: u32 = 16384;

    #[test]
    fn round_trips() {
        let size = 10 * CHUNK as usize;
        let (s, _) = round_trip(&random(size, 1), CHUNK);
        assert_eq!((s.data_frames, s.fill_frames), (10, 0));
        let (s, sum) = round_trip(&vec![0; size], CHUNK);
        assert_eq!(
            (s.data_bytes, s.fill_frames, s.file_bytes),
            (0, 1, 3 * 4096)
        );
        assert_eq!(sum.fill_frames, 1);
        let (s, _) = round_trip(&vec![0x5a; size + 77], CHUNK);
        assert_eq!((s.data_bytes, s.fill_frames), (0, 1));
        // Uniform chunks of different values are separate runs.
        let mut runs = vec![0u8; size];
        runs[2 * CHUNK as usize..4 * CHUNK as usize].fill(7);
        runs[5 * CHUNK as usize] = 1;
        let (s, _) = round_trip(&runs, CHUNK);
        assert_eq!((s.data_frames, s.fill_frames), (1, 4));
        for odd in [1, 4095, 4097, CHUNK as usize - 1, 3 * CHUNK as usize + 123] {
            round_trip(&random(odd, odd as u64), CHUNK);
            round_trip(&vec![0; odd], CHUNK);
        }
        let (s, _) = round_trip(&[], CHUNK);
        assert_eq!(s.file_bytes, 2 * 4096);
    }

    #[test]
    fn file_work_overlaps_the_copies() {
        let dir = tempfile::tempdir().unwrap();
        let mem = random(6 * CHUNK as usize, 4);
        let mut dev = FakeDev::new(mem.clone(), CHUNK);
        let mut f = open_for_dump(dir.path(), "o.img").unwrap();
        dump_gpu(&mut dev, &mut f, &ID, &DumpOptions { chunk: CHUNK }).unwrap();
        assert_eq!(
            dev.probe.muts_while_pending.load(SeqCst),
            5,
            "chunks 0..5 handled while the next one is copied"
        );
        for buffers in [2, 3] {
            let mut dev =
                FakeDev::with_buffers(vec![0; mem.len()], CHUNK as usize + ALIGN, buffers);
            dev.read_ahead_of = (buffers == 3).then_some(6);
            let mut f = open_for_restore(&f.path).unwrap();
            restore_gpu(
                &mut dev,
                &mut f,
                &expected(mem.len() as u64),
                &RestoreOptions::default(),
            )
            .unwrap();
            assert!(dev.mem == mem);
            assert_eq!(
                dev.probe.refs_while_pending.load(SeqCst),
                5,
                "chunks 1..6 checked while the one before is copied ({buffers} buffers)"
            );
            if buffers == 3 {
                assert_eq!(
                    dev.ahead,
                    vec![true; 6],
                    "with three buffers the reader is two chunks ahead of every copy waited for"
                );
            }
        }
    }

    #[test]
    fn bytes_written_for_a_half_zero_device() {
        let chunk = 256 * 1024;
        let size = 64 * chunk as usize;
        let mut mem = random(size, 9);
        for c in mem.chunks_mut(chunk as usize).step_by(2) {
            c.fill(0);
        }
        let (s, _) = round_trip(&mem, chunk);
        assert_eq!(s.data_bytes, size as u64 / 2);
        assert_eq!(s.fill_bytes, size as u64 / 2);
        let half = size as f64 / 2.0;
        let ratio = s.file_bytes as f64 / half;
        assert!(
            (1.0..1.05).contains(&ratio),
            "file {} bytes for {} data bytes",
            s.file_bytes,
            half
        );
    }

    #[test]
    fn zero_runs_are_skipped_on_a_zeroed_target() {
        let dir = tempfile::tempdir().unwrap();
        let mut mem = vec![0u8; 8 * CHUNK as usize];
        mem[CHUNK as usize..2 * CHUNK as usize].fill(3);
        mem[5 * CHUNK as usize] = 9;
        let (path, _) = dump(dir.path(), &mem, CHUNK);
        let mut dev = FakeDev::new(vec![0; mem.len()], CHUNK);
        let mut f = open_for_restore(&path).unwrap();
        let opts = RestoreOptions {
            target_zeroed: true,
        };
        let rs = restore_gpu(&mut dev, &mut f, &expected(mem.len() as u64), &opts).unwrap();
        assert!(dev.mem == mem);
        assert_eq!(rs.fill_bytes_skipped, 6 * u64::from(CHUNK));
        assert_eq!(rs.fill_bytes_copied, u64::from(CHUNK));
        assert_eq!(dev.enqueues, 2, "the 3s and the data chunk");
    }

    fn dumped(size: usize) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let mut mem = random(size, 3);
        mem[CHUNK as usize..2 * CHUNK as usize].fill(0);
        let (path, _) = dump(dir.path(), &mem, CHUNK);
        (dir, path, mem)
    }

    fn patch(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
        let mut b = std::fs::read(path).unwrap();
        f(&mut b);
        std::fs::remove_file(path).unwrap();
        std::fs::write(path, b).unwrap();
    }

    fn verify(path: &Path, size: usize) -> Result<Summary, CsError> {
        verify_file(&mut open_for_restore(path)?, &expected(size as u64))
    }

    #[test]
    fn a_flipped_data_byte_fails_the_restore_naming_the_chunk() {
        let size = 4 * CHUNK as usize;
        let (_dir, path, _) = dumped(size);
        // Frames: header, data 0 (block + CHUNK), fill, data 2 ...: flip a byte of data 2.
        let frame = 4096 + (4096 + u64::from(CHUNK)) + 4096;
        patch(&path, |b| b[frame as usize + 4096 + 100] ^= 0x40);
        verify(&path, size).expect("the structure is intact: verify reads no data");
        let err = restore(&path, size, CHUNK, RestoreOptions::default()).unwrap_err();
        let CsError::Format {
            offset,
            source:
                FormatError::DataCrc {
                    offset: dev_off,
                    stored,
                    computed,
                    ..
                },
            ..
        } = &err
        else {
            panic!("{err}")
        };
        assert_eq!((*offset, *dev_off), (frame, 2 * u64::from(CHUNK)));
        assert_ne!(stored, computed);
        let msg = err.to_string();
        assert!(
            msg.contains("cuda-cs-4242-1.img") && msg.contains(&format!("at byte {frame}")),
            "{msg}"
        );
    }

    #[test]
    fn nothing_of_a_bad_chunk_or_after_it_reaches_the_device() {
        let size = 4 * CHUNK as usize;
        let (_dir, path, mem) = dumped(size);
        let frame = 4096 + (4096 + u64::from(CHUNK)) + 4096;
        patch(&path, |b| b[frame as usize + 4096] ^= 1);
        let mut dev = FakeDev::new(vec![0xee; size], CHUNK);
        let mut f = open_for_restore(&path).unwrap();
        assert!(restore_gpu(
            &mut dev,
            &mut f,
            &expected(size as u64),
            &RestoreOptions::default()
        )
        .is_err());
        let c = CHUNK as usize;
        assert!(
            dev.mem[..2 * c] == mem[..2 * c],
            "the chunks before it are copied"
        );
        assert!(
            dev.mem[2 * c..].iter().all(|&b| b == 0xee),
            "nothing from the bad chunk on"
        );
    }

    #[test]
    fn damaged_headers_are_named() {
        let size = 4 * CHUNK as usize;
        let (_dir, path, _) = dumped(size);
        patch(&path, |b| b[30] ^= 1);
        assert!(matches!(
            verify(&path, size),
            Err(CsError::Format {
                offset: 0,
                source: FormatError::HeaderCrc { .. },
                ..
            })
        ));
        let (_dir, path, _) = dumped(size);
        patch(&path, |b| b[0] = b'X');
        assert!(matches!(
            verify(&path, size),
            Err(CsError::Format {
                offset: 0,
                source: FormatError::Magic { .. },
                ..
            })
        ));
        let (_dir, path, _) = dumped(size);
        patch(&path, |b| b[16] = 9);
        assert!(matches!(
            verify(&path, size),
            Err(CsError::Format {
                offset: 0,
                source: FormatError::Version { found: 9 },
                ..
            })
        ));
        // A frame block: the second frame (the fill) at 4096 + 4096 + CHUNK.
        let (_dir, path, _) = dumped(size);
        let at = 8192 + u64::from(CHUNK);
        patch(&path, |b| b[at as usize + 17] ^= 1);
        let err = verify(&path, size).unwrap_err();
        assert!(
            matches!(err, CsError::Format { offset, source: FormatError::FrameCrc { .. }, .. } if offset == at),
            "{err}"
        );
    }

    #[test]
    fn truncation_anywhere_is_refused() {
        let size = 3 * CHUNK as usize + 100;
        let (_dir, path, _) = dumped(size);
        let whole = std::fs::read(&path).unwrap();
        let mut cuts: Vec<usize> = (0..whole.len()).step_by(4096).collect();
        cuts.extend((0..whole.len()).step_by(4096).map(|c| c + 1000));
        for cut in cuts.into_iter().filter(|&c| c < whole.len()) {
            patch(&path, |b| b.truncate(cut));
            let err = verify(&path, size).unwrap_err();
            assert!(
                matches!(
                    err,
                    CsError::Format {
                        source: FormatError::Truncated { .. },
                        ..
                    }
                ),
                "cut at {cut}: {err}"
            );
            assert!(restore(&path, size, CHUNK, RestoreOptions::default()).is_err());
            patch(&path, |b| *b = whole.clone());
        }
        verify(&path, size).unwrap();
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let size = 2 * CHUNK as usize;
        let (_dir, path, _) = dumped(size);
        let len = std::fs::metadata(&path).unwrap().len();
        for extra in [1usize, 4096, 8192] {
            patch(&path, |b| b.resize(len as usize + extra, 0));
            let err = verify(&path, size).unwrap_err();
            assert!(
                matches!(&err, CsError::Format { offset, source: FormatError::Trailing { extra: e }, .. } if *offset == len && *e == extra as u64),
                "{err}"
            );
        }
    }

    #[test]
    fn stale_and_foreign_files_are_named() {
        let size = 2 * CHUNK as usize;
        let (_dir, path, _) = dumped(size);
        let check =
            |e: Expected| verify_file(&mut open_for_restore(&path).unwrap(), &e).unwrap_err();
        let err = check(Expected {
            dump_id: [1; 16],
            ..expected(size as u64)
        });
        assert!(
            matches!(err, CsError::Stale { found, .. } if found == ID.dump_id),
            "{err}"
        );
        assert!(err.to_string().contains("another dump"));
        let err = check(Expected {
            pid: 7,
            ..expected(size as u64)
        });
        assert!(
            matches!(
                err,
                CsError::WrongPid {
                    found: 4242,
                    expected: 7,
                    ..
                }
            ),
            "{err}"
        );
        let err = check(Expected {
            uuid: GpuUuid([2; 16]),
            ..expected(size as u64)
        });
        assert!(matches!(err, CsError::WrongGpu { .. }), "{err}");
        let err = check(Expected {
            place: 0,
            ..expected(size as u64)
        });
        assert!(
            matches!(
                err,
                CsError::WrongGpu {
                    found_place: 1,
                    expected_place: 0,
                    ..
                }
            ),
            "{err}"
        );
        let err = check(expected(size as u64 + 1));
        assert!(matches!(err, CsError::WrongSize { .. }), "{err}");
        let mut dev = FakeDev::new(vec![0; size + 4096], CHUNK);
        let err = restore_gpu(
            &mut dev,
            &mut open_for_restore(&path).unwrap(),
            &expected(size as u64),
            &RestoreOptions::default(),
        )
        .unwrap_err();
        assert!(matches!(err, CsError::DeviceSize { .. }), "{err}");
    }

    #[test]
    fn device_errors_say_how_far_the_dump_got() {
        let size = 6 * CHUNK as usize;
        let mem = random(size, 5);
        for (fail_enqueue, fail_sync, done) in [
            (Some(1), None, 0),
            (Some(4), None, 2),
            (None, Some(1), 0),
            (None, Some(5), 4),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let mut dev = FakeDev::new(mem.clone(), CHUNK);
            dev.fail_enqueue = fail_enqueue;
            dev.fail_sync = fail_sync;
            let mut f = open_for_dump(dir.path(), "x.img").unwrap();
            let err = dump_gpu(&mut dev, &mut f, &ID, &DumpOptions { chunk: CHUNK }).unwrap_err();
            let CsError::Device {
                completed,
                file_bytes,
                source,
                ..
            } = &err
            else {
                panic!("{err}")
            };
            assert_eq!(*completed, done * u64::from(CHUNK), "{err}");
            assert_eq!(*file_bytes, 4096 + done * (4096 + u64::from(CHUNK)));
            assert_eq!(std::fs::metadata(&f.path).unwrap().len(), *file_bytes);
            assert!(source.to_string().contains("CUDA_ERROR_"), "{source}");
            let err = verify(&f.path, size).unwrap_err();
            assert!(
                matches!(
                    err,
                    CsError::Format {
                        source: FormatError::Truncated { .. },
                        ..
                    }
                ),
                "{err}"
            );
        }
    }

    #[test]
    fn device_errors_fail_the_restore() {
        let size = 4 * CHUNK as usize;
        let (_dir, path, _) = dumped(size);
        for (fe, fs) in [(Some(2), None), (None, Some(2))] {
            let mut dev = FakeDev::new(vec![0; size], CHUNK);
            dev.fail_enqueue = fe;
            dev.fail_sync = fs;
            let err = restore_gpu(
                &mut dev,
                &mut open_for_restore(&path).unwrap(),
                &expected(size as u64),
                &RestoreOptions::default(),
            )
            .unwrap_err();
            assert!(matches!(err, CsError::Device { .. }), "{err}");
        }
    }

    #[test]
    fn bad_options_and_buffers_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = open_for_dump(dir.path(), "a.img").unwrap();
        for chunk in [0, 4095, 2 * CHUNK] {
            let mut dev = FakeDev::new(vec![0; 100], CHUNK);
            let err = dump_gpu(&mut dev, &mut f, &ID, &DumpOptions { chunk }).unwrap_err();
            assert!(
                matches!(err, CsError::Chunk { .. } | CsError::Buffer { .. }),
                "{err}"
            );
        }
        let mut dev = FakeDev::with_buffers(vec![0; 100], CHUNK as usize, 1);
        let err = dump_gpu(&mut dev, &mut f, &ID, &DumpOptions { chunk: CHUNK }).unwrap_err();
        assert!(matches!(err, CsError::Buffers { count: 1, .. }), "{err}");
    }

    #[test]
    fn open_for_dump_is_exclusive_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = open_for_dump(dir.path(), "a.img").unwrap();
        assert_eq!(
            f.file.metadata().unwrap().permissions().mode() & 0o777,
            0o600
        );
        let err = open_for_dump(dir.path(), "a.img").unwrap_err();
        assert!(
            matches!(&err, CsError::Io { source, .. } if source.kind() == io::ErrorKind::AlreadyExists),
            "{err}"
        );
    }

    #[test]
    fn o_direct_refused_at_open_falls_back_to_buffered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.img");
        // As tmpfs before Linux 6.6 did: the file is created, then O_DIRECT is refused.
        let f = open_dump_with(&path, |p, direct| {
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(p)?;
            if direct {
                drop(file);
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            Ok(file)
        })
        .unwrap();
        assert!(!f.direct);
        // A file that was there before is neither removed nor reused.
        std::fs::write(dir.path().join("c.img"), b"x").unwrap();
        let err = open_dump_with(&dir.path().join("c.img"), |p, direct| {
            if direct {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            OpenOptions::new().write(true).create_new(true).open(p)
        })
        .unwrap_err();
        assert!(matches!(err, CsError::Io { op: "create", .. }), "{err}");
        assert_eq!(std::fs::read(dir.path().join("c.img")).unwrap(), b"x");
    }

    /// Up to about 4 MiB: runs of one value (zeros and others), random stretches.
    fn device_contents() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            (any::<u8>(), 1usize..600_000).prop_map(|(v, n)| vec![v; n]),
            (1usize..600_000).prop_map(|n| vec![0; n]),
            proptest::collection::vec(any::<u8>(), 1..40_000),
        ];
        proptest::collection::vec(piece, 0..8).prop_map(|p| p.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn arbitrary_devices_round_trip(mem in device_contents(), chunk_blocks in 1u32..5) {
            let chunk = chunk_blocks * 4096;
            let dir = tempfile::tempdir().unwrap();
            let (path, stats) = dump(dir.path(), &mem, chunk);
            let (back, _) = restore(&path, mem.len(), chunk, RestoreOptions::default()).unwrap();
            prop_assert!(back == mem);
            let (back, _) = restore_with(&path, mem.len(), chunk, RestoreOptions::default(), 0).unwrap();
            prop_assert!(back == mem, "buffers without room for the next frame block");
            let (back, _) = restore(&path, mem.len(), chunk, RestoreOptions { target_zeroed: true }).unwrap();
            let zeroed_ok = back.iter().zip(&mem).all(|(b, m)| b == m || (*m == 0 && *b == 0xee));
            prop_assert!(zeroed_ok);
            prop_assert_eq!(stats.data_bytes + stats.fill_bytes, mem.len() as u64);
        }

        #[test]
        fn damaged_files_never_panic_and_flips_are_caught(
            mem in device_contents(),
            at in any::<prop::sample::Index>(),
            xor in 1u8..,
            cut in any::<prop::sample::Index>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let (path, _) = dump(dir.path(), &mem, 8192);
            let whole = std::fs::read(&path).unwrap();
            let i = at.index(whole.len());
            patch(&path, |b| b[i] ^= xor);
            prop_assert!(restore(&path, mem.len(), 8192, RestoreOptions::default()).is_err(), "flip at {} survived", i);
            prop_assert!(restore_with(&path, mem.len(), 8192, RestoreOptions::default(), 0).is_err(), "flip at {} survived exact buffers", i);
            let c = cut.index(whole.len());
            patch(&path, |b| { *b = whole[..c].to_vec(); });
            prop_assert!(verify(&path, mem.len()).is_err());
        }
    }
}
