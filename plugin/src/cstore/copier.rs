//! The copier process's side of custom storage: one job is one task's checkpoint or restore,
//! its GPUs copied on threads of their own through [`super::pipeline`].
//!
//! The copier loads the driver, calls `cuInit` and retains every GPU's primary context once
//! (the contexts custom storage maps the tasks' memory into), then serves jobs. A job that
//! fails removes the files it wrote and returns its error; the server then ends the process
//! ([`crate::helper::server`]), which is how the operation it left open is aborted.

use super::pipeline::{self, file_name, DeviceCopy, DeviceError, Expected, Identity, ImageFile};
use crate::agent::proto::{CustomGpu, CustomJob};
use crate::ffi::cstore::{CsApi, DeviceEntry, Operation, Pinned};
use abi::GpuUuid;
use std::os::fd::{BorrowedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

/// The staging chunk: each GPU of a job holds three pinned buffers of this size. 16 MiB
/// keeps the per-call overhead of the copies and writes under 1 % at tens of GB/s while eight
/// GPUs' buffers stay within 384 MiB of pinned memory.
pub const CHUNK: u32 = 16 << 20;

/// Staging buffers per GPU: at a dump one copied into from the GPU, one framed and checksummed,
/// one written (the pipeline's writer thread); at a restore one read into (its reader thread),
/// one checked, one copied to the GPU.
const BUFFERS: usize = 3;

/// `e`'s message with the files named as in the image directory (the copier reaches that
/// directory as `/proc/self/fd/N`, which says nothing to whoever reads CRIU's log).
fn named(dir: &Path, e: &pipeline::CsError) -> String {
    e.to_string().replace(&format!("{}/", dir.display()), "")
}

/// The driver, loaded and with every GPU's primary context retained, once per copier.
struct Copier {
    api: CsApi,
    /// Per ordinal: the GPU's UUID and its primary context.
    gpus: Vec<(GpuUuid, usize)>,
}

fn copier() -> Result<&'static Copier, String> {
    static COPIER: OnceLock<Result<Copier, String>> = OnceLock::new();
    COPIER
        .get_or_init(|| {
            let api = CsApi::load()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "the driver has no custom storage (CUDA 13.4)".to_owned())?;
            let gpus = api.open_contexts().map_err(|e| e.to_string())?;
            Ok(Copier { api, gpus })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Carries out `job` with the image directory `dir`; per GPU in file order on success.
pub fn run(job: &CustomJob, dir: Option<RawFd>) -> Result<Vec<CustomGpu>, String> {
    let Some(dir) = dir else {
        return Err("the copier has no image directory".into());
    };
    // The helper's image directory, open for its whole life (see `crate::helper::server`),
    // and a path that names it for the pipeline's opens.
    let path = PathBuf::from(format!("/proc/self/fd/{dir}"));
    let dir = crate::ffi::agent::borrow_fd(dir);
    let c = copier()?;
    if job.checkpoint {
        checkpoint(c, job, dir, &path)
    } else {
        restore(c, job, &path)
    }
}

/// One GPU of an open operation, as the pipeline drives it.
struct Device<'a> {
    api: &'a CsApi,
    entry: DeviceEntry,
    /// The staging buffers not yet handed to the pipeline.
    bufs: Vec<Pinned>,
    /// The buffers of the copies enqueued since the last synchronization: the stream may still
    /// read or write them, so they are handed back (or freed) only after it is synchronized.
    held: Vec<Pinned>,
}

impl DeviceCopy for Device<'_> {
    type Buf = Pinned;

    fn size(&self) -> u64 {
        self.entry.size
    }

    fn take_buffers(&mut self) -> Vec<Pinned> {
        std::mem::take(&mut self.bufs)
    }

    fn enqueue_to_host(
        &mut self,
        off: u64,
        mut buf: Pinned,
        len: usize,
    ) -> Result<(), DeviceError> {
        let (api, entry) = (self.api, self.entry);
        let r = api.to_host(&mut buf, 0, entry.dev_ptr + off, len, entry.stream);
        // Moving the handle leaves the memory where it is.
        self.held.push(buf);
        r.map_err(device_error)
    }

    fn enqueue_to_device(
        &mut self,
        buf: Pinned,
        off: u64,
        len: u64,
        piece: usize,
    ) -> Result<(), DeviceError> {
        let (api, entry) = (self.api, self.entry);
        // A fill run longer than a chunk is the same buffer copied again.
        let mut o = off;
        let mut r = Ok(());
        while o < off + len && r.is_ok() {
            let n = (off + len - o).min(piece as u64) as usize;
            r = api.to_device(&buf, 0, entry.dev_ptr + o, n, entry.stream);
            o += n as u64;
        }
        self.held.push(buf);
        r.map_err(device_error)
    }

    fn sync(&mut self) -> Result<Vec<Pinned>, DeviceError> {
        self.api.sync(self.entry.stream).map_err(device_error)?;
        Ok(std::mem::take(&mut self.held))
    }
}

impl Drop for Device<'_> {
    /// A pipeline that failed may leave copies in flight: their buffers are freed only after
    /// the stream has finished with them (whatever the synchronization returns, the stream no
    /// longer uses them).
    fn drop(&mut self) {
        if !self.held.is_empty() {
            let _ = self.api.sync(self.entry.stream);
        }
    }
}

fn device_error(e: crate::ffi::cstore::CallFailed) -> DeviceError {
    DeviceError {
        function: e.call,
        result: e.code,
    }
}

/// The staging buffers of one GPU: `count` chunks, or less for a smaller GPU share (at least
/// one alignment unit), each with one alignment unit more, for the frame block a restore reads
/// with a chunk's data.
fn buffers(c: &Copier, size: u64, count: usize) -> Result<(Vec<Pinned>, u32), String> {
    let chunk = u64::from(CHUNK).min(super::format::padded(size).max(super::format::ALIGN64));
    let chunk_u32 = u32::try_from(chunk).unwrap_or(CHUNK);
    let len = usize::try_from(chunk + super::format::ALIGN64).unwrap_or(CHUNK as usize);
    let bufs = (0..count)
        .map(|_| c.api.host_alloc(len).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    Ok((bufs, chunk_u32))
}

/// Which GPU (ordinal) each entry of `op` is on.
fn ordinals(c: &Copier, op: &Operation) -> Result<Vec<usize>, String> {
    op.entries
        .iter()
        .map(|e| {
            let o = c.api.device_of(e.dev_ptr).map_err(|e| e.to_string())?;
            usize::try_from(o)
                .ok()
                .filter(|o| *o < c.gpus.len())
                .ok_or_else(|| format!("the driver put a GPU share on device {o}, which this process does not have"))
        })
        .collect()
}

fn checkpoint(
    c: &Copier,
    job: &CustomJob,
    dir: BorrowedFd<'_>,
    path: &Path,
) -> Result<Vec<CustomGpu>, String> {
    let op = c
        .api
        .checkpoint(job.pid)
        .map_err(|e| format!("pid {}: {e}", job.pid))?;
    let ords = ordinals(c, &op)?;
    let names: Vec<String> = (0..op.entries.len())
        .map(|n| file_name(job.key, u32::try_from(n).unwrap_or(u32::MAX)))
        .collect();
    let remove_all = || {
        for n in &names {
            let _ = crate::ffi::agent::unlink_in(dir, n);
        }
    };
    // A dump into a directory that holds an earlier dump's files replaces them, as CRIU
    // replaces its own images: this task's names, and any further GPU's file of that dump.
    // The files are then created exclusively (never through a link someone put there).
    remove_all();
    let mut extra = u32::try_from(names.len()).unwrap_or(u32::MAX);
    while extra < u32::from(u16::MAX)
        && crate::ffi::agent::unlink_in(dir, &file_name(job.key, extra))
    {
        extra += 1;
    }
    let results: Vec<Result<CustomGpu, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = op
            .entries
            .iter()
            .zip(&ords)
            .enumerate()
            .map(|(n, (entry, &ord))| {
                let name = &names[n];
                s.spawn(move || -> Result<CustomGpu, String> {
                    let (uuid, ctx) = c.gpus[ord];
                    c.api.set_current(ctx).map_err(|e| e.to_string())?;
                    let (bufs, chunk) = buffers(c, entry.size, BUFFERS)?;
                    let mut dev = Device {
                        api: &c.api,
                        entry: *entry,
                        bufs,
                        held: Vec::new(),
                    };
                    let mut file =
                        pipeline::open_for_dump(path, name).map_err(|e| named(path, &e))?;
                    let id = Identity {
                        dump_id: job.dump_id,
                        pid: job.key,
                        uuid,
                        place: u32::try_from(n).unwrap_or(u32::MAX),
                    };
                    let t = Instant::now();
                    let stats = pipeline::dump_gpu(
                        &mut dev,
                        &mut file,
                        &id,
                        &pipeline::DumpOptions { chunk },
                    )
                    .map_err(|e| format!("{uuid}: {}", named(path, &e)))?;
                    Ok(CustomGpu {
                        uuid: uuid.0,
                        bytes: entry.size,
                        data: stats.data_bytes,
                        fills: stats.fill_bytes,
                        micros: u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX),
                        direct: stats.direct,
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a copy thread panicked".into()))
            })
            .collect()
    });
    let mut gpus = Vec::new();
    for r in results {
        match r {
            Ok(g) => gpus.push(g),
            Err(e) => {
                remove_all();
                return Err(format!("pid {}: {e}", job.pid));
            }
        }
    }
    if let Err(e) = c.api.complete(&op) {
        remove_all();
        return Err(format!("pid {}: {e}", job.pid));
    }
    Ok(gpus)
}

fn restore(c: &Copier, job: &CustomJob, path: &Path) -> Result<Vec<CustomGpu>, String> {
    // Every file checked (header, frames, end) before the task is touched.
    let mut files: Vec<(ImageFile, Expected)> = Vec::with_capacity(job.files.len());
    for (n, (uuid, size)) in job.files.iter().enumerate() {
        let name = file_name(job.key, u32::try_from(n).unwrap_or(u32::MAX));
        let mut file =
            pipeline::open_for_restore(&path.join(&name)).map_err(|e| named(path, &e))?;
        let expected = Expected {
            dump_id: job.dump_id,
            pid: job.key,
            uuid: GpuUuid(*uuid),
            place: u32::try_from(n).unwrap_or(u32::MAX),
            size: *size,
        };
        pipeline::verify_file(&mut file, &expected).map_err(|e| named(path, &e))?;
        files.push((file, expected));
    }
    let pairs: Vec<abi::CUcheckpointGpuPair> = job
        .pairs
        .iter()
        .map(|(o, n)| abi::CUcheckpointGpuPair {
            old_uuid: GpuUuid(*o).to_cu(),
            new_uuid: GpuUuid(*n).to_cu(),
        })
        .collect();
    let op = c
        .api
        .restore(job.pid, &pairs)
        .map_err(|e| format!("pid {}: {e}", job.pid))?;
    let ords = ordinals(c, &op)?;
    if op.entries.len() != files.len() {
        return Err(format!(
            "pid {}: the driver maps {} GPU share(s), the dump wrote {} file(s) for this task",
            job.pid,
            op.entries.len(),
            files.len()
        ));
    }
    // Each entry's file: its GPU now, mapped back to the GPU at dump.
    let mut place_of = Vec::with_capacity(op.entries.len());
    for (entry, &ord) in op.entries.iter().zip(&ords) {
        let now = c.gpus[ord].0 .0;
        let old = job
            .pairs
            .iter()
            .find(|(_, n)| *n == now)
            .map_or(now, |(o, _)| *o);
        let n = files
            .iter()
            .position(|f| f.1.uuid.0 == old)
            .ok_or_else(|| {
                format!(
                    "pid {}: the driver restores onto {}, which no file of this task was dumped from",
                    job.pid,
                    GpuUuid(now)
                )
            })?;
        if files[n].1.size != entry.size {
            return Err(format!(
                "pid {}: {} holds {} bytes, the driver maps {} on {}",
                job.pid,
                files[n].0.path.display(),
                files[n].1.size,
                entry.size,
                GpuUuid(now)
            ));
        }
        place_of.push(n);
    }
    // Each file to the thread of the entry it restores (place_of is a permutation: each file
    // matched one entry, and the sizes agree).
    let mut slots: Vec<Option<(ImageFile, Expected)>> = files.into_iter().map(Some).collect();
    let mut work = Vec::with_capacity(op.entries.len());
    for ((entry, &ord), &n) in op.entries.iter().zip(&ords).zip(&place_of) {
        let f = slots[n]
            .take()
            .ok_or_else(|| format!("pid {}: two GPU shares map to one file", job.pid))?;
        work.push((*entry, ord, f));
    }
    let results: Vec<Result<CustomGpu, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = work
            .into_iter()
            .map(|(entry, ord, (mut file, expected))| {
                s.spawn(move || -> Result<CustomGpu, String> {
                    let (_, ctx) = c.gpus[ord];
                    c.api.set_current(ctx).map_err(|e| e.to_string())?;
                    let (bufs, _) = buffers(c, entry.size, BUFFERS)?;
                    let mut dev = Device {
                        api: &c.api,
                        entry,
                        bufs,
                        held: Vec::new(),
                    };
                    let t = Instant::now();
                    let stats = pipeline::restore_gpu(
                        &mut dev,
                        &mut file,
                        &expected,
                        &pipeline::RestoreOptions::default(),
                    )
                    .map_err(|e| named(path, &e))?;
                    Ok(CustomGpu {
                        uuid: expected.uuid.0,
                        bytes: entry.size,
                        data: stats.data_bytes,
                        fills: stats.fill_bytes_copied + stats.fill_bytes_skipped,
                        micros: u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX),
                        direct: stats.direct,
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a copy thread panicked".into()))
            })
            .collect()
    });
    let mut gpus = Vec::new();
    for r in results {
        gpus.push(r.map_err(|e| format!("pid {}: {e}", job.pid))?);
    }
    c.api
        .complete(&op)
        .map_err(|e| format!("pid {}: {e}", job.pid))?;
    gpus.sort_by_key(|g| job.files.iter().position(|(u, _)| *u == g.uuid));
    Ok(gpus)
}
