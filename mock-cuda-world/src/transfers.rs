//! Transfers in progress: one small file per process that checkpoints or restores
//! (`<world>/transfers/<id>.json`, by world id), written by its restore thread when it takes the request,
//! every 50 ms while the transfer runs, and removed once the request is answered.
//!
//! The files are the world's registry of active transfers (each restore thread reads them to
//! learn how many transfers share its GPU's link and the host, see [`crate::rates`]),
//! its progress report (`mock-world status`: bytes moved so far and the host memory the
//! transfer has staged), and the sign of life a caller of a long checkpoint waits on instead
//! of its request timeout. Keeping them apart from `state.json` keeps progress cheap: an update
//! rewrites a few hundred bytes of the process's own file and takes no lock.
//!
//! A file whose process is gone (killed mid-transfer, e.g. by the OOM killer) is ignored and
//! removed by the next reader.

use super::config::GpuUuidText;
use super::pidns::{NsIdentity, Presence, ProcessRef};
use super::{write_atomic, World, WorldError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// Which way a transfer moves device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// GPU → host memory of the process (`cuCheckpointProcessCheckpoint`).
    Checkpoint,
    /// Host → GPU (`cuCheckpointProcessRestore`).
    Restore,
    /// A custom-storage caller's copies (CUDA 13.4: `cuMemcpyDtoH`/`HtoD` on the device
    /// pointers of an open operation): they use the GPU's link and the host, not the driver's
    /// own copy path, and stage nothing in the target.
    Copy,
}

impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Direction::Checkpoint => "checkpoint",
            Direction::Restore => "restore",
            Direction::Copy => "custom-storage copy",
        })
    }
}

/// One GPU's part of a transfer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuProgress {
    pub uuid: GpuUuidText,
    /// Bytes this part moves.
    pub total: u64,
    /// Bytes moved so far.
    pub moved: u64,
}

impl GpuProgress {
    /// Whether this part still moves bytes.
    #[must_use]
    pub fn active(&self) -> bool {
        self.moved < self.total
    }
}

/// A transfer in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Progress {
    /// The transferring process's world id.
    pub id: u64,
    /// Its host pid as it knew it (0: unknown, inside a pid namespace of its own).
    pub pid: i32,
    /// Its identity: pid namespace and pid there.
    pub identity: NsIdentity,
    /// The request being carried out.
    pub request: u64,
    pub direction: Direction,
    pub gpus: Vec<GpuProgress>,
}

impl Progress {
    /// What is needed to find the transferring process.
    #[must_use]
    pub fn whereabouts(&self) -> ProcessRef {
        ProcessRef {
            id: self.id,
            host_pid: self.pid,
            identity: self.identity,
        }
    }

    /// Bytes moved so far.
    #[must_use]
    pub fn moved(&self) -> u64 {
        self.gpus.iter().map(|g| g.moved).sum()
    }

    /// Bytes the transfer moves in all.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.gpus.iter().map(|g| g.total).sum()
    }

    /// Host memory the transfer holds now: what a checkpoint has staged so far, what a
    /// restore has not yet moved back to the GPU.
    #[must_use]
    pub fn staged(&self) -> u64 {
        match self.direction {
            Direction::Checkpoint => self.moved(),
            Direction::Restore => self.total() - self.moved(),
            Direction::Copy => 0,
        }
    }
}

impl World {
    fn transfers_dir(&self) -> PathBuf {
        self.dir().join("transfers")
    }

    fn transfer_path(&self, id: u64) -> PathBuf {
        self.transfers_dir().join(format!("{id}.json"))
    }

    /// Publishes a transfer's progress (atomically: readers see one whole version).
    pub fn write_progress(&self, p: &Progress) -> Result<(), WorldError> {
        let dir = self.transfers_dir();
        std::fs::create_dir_all(&dir).map_err(|e| WorldError::io(&dir, e))?;
        let text = serde_json::to_vec(p).expect("progress serialises");
        write_atomic(&self.transfer_path(p.id), &text)
    }

    /// Ends a transfer's entry.
    pub fn remove_progress(&self, id: u64) {
        let _ = std::fs::remove_file(self.transfer_path(id));
    }

    /// The transfer of the process with world id `id`, with the time its file was last
    /// written, if it runs.
    #[must_use]
    pub fn progress_of(&self, id: u64) -> Option<(Progress, SystemTime)> {
        let path = self.transfer_path(id);
        let stamp = std::fs::metadata(&path).and_then(|m| m.modified()).ok()?;
        let p: Progress = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
        Some((p, stamp))
    }

    /// Whether the process with world id `id`, pid `pid` in the caller's view, is carrying
    /// `request` out: its transfer is registered and either reported progress within `within`
    /// or has a restore thread that is not stopped (SIGSTOP, ptrace). A thread that waits for
    /// the disk (a busy host can stall a file write for seconds) is still working; a stopped
    /// one is not, once its last report is older than `within`.
    #[must_use]
    pub fn transfer_working(&self, id: u64, pid: i32, request: u64, within: Duration) -> bool {
        self.progress_of(id).is_some_and(|(p, stamp)| {
            p.request == request
                && (stamp.elapsed().is_ok_and(|age| age <= within)
                    || crate::pidns::restore_thread(pid, id)
                        .is_some_and(|tid| !crate::sys::stopped(pid, tid)))
        })
    }

    /// Every transfer in progress, by world id; files of processes that are gone are removed
    /// (those of processes the caller cannot see, inside another pid namespace, are kept).
    #[must_use]
    pub fn transfers(&self) -> Vec<Progress> {
        let Ok(dir) = std::fs::read_dir(self.transfers_dir()) else {
            return Vec::new();
        };
        let mut out: Vec<Progress> = dir
            .filter_map(|e| {
                let name = e.ok()?.file_name();
                let id: u64 = name.to_str()?.strip_suffix(".json")?.parse().ok()?;
                let (p, _) = self.progress_of(id)?;
                if self.locate(&p.whereabouts()) == Presence::Gone {
                    self.remove_progress(id);
                    return None;
                }
                Some(p)
            })
            .collect();
        out.sort_by_key(|p| p.id);
        out
    }
}
