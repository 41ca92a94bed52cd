//! The status of a world: its state, each process where the caller sees it now, and the
//! transfers in progress. `mock-world status` prints it as a table ([`Status::table`]) or as
//! JSON ([`Status::to_json`]).

use crate::pidns::{self, Presence as Found};
use crate::state::{ProcessEntry, StateFile};
use crate::transfers::Progress;
use crate::World;
use abi::CUprocessState;
use serde::{Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The CUDA state of a process, as the harness and the tests name it (`running`, `locked`,
/// `checkpointed`, `failed`), `none` for a process the world does not know (not a CUDA
/// process), `other` for a state the mock never records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaState {
    /// Not a CUDA process of the world.
    None,
    Running,
    Locked,
    Checkpointed,
    Failed,
    /// A custom-storage checkpoint is open (CUDA 13.4).
    Checkpointing,
    /// A custom-storage restore is open (CUDA 13.4).
    Restoring,
    /// Another `CUprocessState` value.
    Other(u32),
}

impl CudaState {
    /// The state a process's `CUprocessState` value stands for.
    #[must_use]
    pub const fn from_raw(state: u32) -> CudaState {
        match state {
            0 => CudaState::Running,
            1 => CudaState::Locked,
            2 => CudaState::Checkpointed,
            3 => CudaState::Failed,
            4 => CudaState::Checkpointing,
            5 => CudaState::Restoring,
            n => CudaState::Other(n),
        }
    }

    /// Its name: `none`, `running`, `locked`, `checkpointed`, `failed`, `checkpointing`,
    /// `restoring` or `other`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            CudaState::None => "none",
            CudaState::Running => "running",
            CudaState::Locked => "locked",
            CudaState::Checkpointed => "checkpointed",
            CudaState::Failed => "failed",
            CudaState::Checkpointing => "checkpointing",
            CudaState::Restoring => "restoring",
            CudaState::Other(_) => "other",
        }
    }
}

impl From<CUprocessState> for CudaState {
    fn from(s: CUprocessState) -> Self {
        CudaState::from_raw(s.0)
    }
}

impl std::fmt::Display for CudaState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a process of the world is, seen from the caller when the status was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Presence {
    /// Alive, in the caller's view.
    Here,
    /// It died (a checkpointed process whose dump ended it included).
    Gone,
    /// The caller cannot tell (the process is not in its view, which does not show every
    /// process of the world's host).
    Unknown,
}

impl Presence {
    /// `here`, `gone` or `unknown`, as `mock-world status --json` writes it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Presence::Here => "here",
            Presence::Gone => "gone",
            Presence::Unknown => "unknown",
        }
    }
}

/// One CUDA process of the world. Serialises as the entry of `mock-world status --json`: its
/// state entry, `id` and `present`, with `restore_tid` as the caller sees it when the restore
/// thread was found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessStatus {
    /// Its world id.
    pub id: u64,
    /// Where it is.
    pub present: Presence,
    /// Its entry in the state, `restore_tid` replaced by the tid the caller sees when the
    /// restore thread was found.
    #[serde(flatten)]
    pub entry: ProcessEntry,
    /// Its host pid: found now, or the last one known (0: never known).
    #[serde(skip)]
    host_pid: i32,
    /// Its restore thread's tid as the caller sees it (found only while the process is here).
    #[serde(skip)]
    tid_here: Option<i32>,
    /// Its transfer in progress.
    #[serde(skip)]
    transfer: Option<Progress>,
}

impl ProcessStatus {
    /// Its CUDA state.
    #[must_use]
    pub fn state(&self) -> CudaState {
        CudaState::from_raw(self.entry.state)
    }

    /// Its host pid (found now, or the last one known), `None` when never known.
    #[must_use]
    pub fn host_pid(&self) -> Option<i32> {
        (self.host_pid > 0).then_some(self.host_pid)
    }

    /// Its restore thread's tid: as the caller sees it when found, else as the state recorded
    /// it (in the process's own pid namespace).
    #[must_use]
    pub fn restore_tid(&self) -> i32 {
        self.entry.restore_tid
    }

    /// Its restore thread's tid as the caller sees it: `None` when the process is gone, out of
    /// view, or has no restore thread now.
    #[must_use]
    pub fn restore_tid_here(&self) -> Option<i32> {
        self.tid_here
    }

    /// Its transfer in progress.
    #[must_use]
    pub fn transfer(&self) -> Option<&Progress> {
        self.transfer.as_ref()
    }

    /// Device memory it holds, in bytes (logical sizes).
    #[must_use]
    pub fn allocated_bytes(&self) -> u64 {
        self.entry.allocations.iter().map(|a| a.size).sum()
    }

    /// Host memory its checkpoint holds: what a transfer in progress has staged so far, all of
    /// it once checkpointed, else nothing. A custom-storage checkpoint stages nothing (the
    /// caller copied the memory out).
    #[must_use]
    pub fn staged_bytes(&self) -> u64 {
        match &self.transfer {
            Some(t) => t.staged(),
            None if self.entry.custom_storage => 0,
            None if self.entry.state() == CUprocessState::CHECKPOINTED => {
                self.entry.checkpointed.iter().map(|c| c.bytes).sum()
            }
            None => 0,
        }
    }

    /// Its key in `processes` of the JSON status: its host pid, or `id<N>` when never known.
    #[must_use]
    pub fn key(&self) -> String {
        match self.host_pid() {
            Some(p) => p.to_string(),
            None => format!("id{}", self.id),
        }
    }
}

/// The status of a world: its state, each process where the caller sees it ([`Presence`]), the
/// transfers in progress. Serialises as `mock-world status --json` (the state file, its
/// `processes` keyed by host pid instead of world id, plus `transfers`). The default is the
/// status of an empty world.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    pub format: String,
    pub version: u32,
    pub host_pid_ns: u64,
    pub id_salt: u32,
    pub registered: u64,
    /// Every process of the state, by world id (serialised keyed by host pid, see
    /// [`Status::keyed`]).
    #[serde(serialize_with = "keyed_processes")]
    pub processes: Vec<ProcessStatus>,
    /// Matching-call counters of the scripted faults, by fault index.
    pub fault_counts: BTreeMap<usize, u64>,
    pub next_alloc: u64,
    /// The transfers in progress, by world id.
    pub transfers: Vec<Progress>,
}

impl Default for Status {
    fn default() -> Self {
        Status::assemble(StateFile::default(), Vec::new(), |_, _| {
            (Found::Unknown, None)
        })
    }
}

fn keyed_processes<S: Serializer>(p: &[ProcessStatus], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(keyed(p))
}

/// The processes by [`ProcessStatus::key`]: where two share a key (a pid reused), a live one
/// wins over a dead one, else the first by world id.
fn keyed(processes: &[ProcessStatus]) -> BTreeMap<String, &ProcessStatus> {
    let mut m = BTreeMap::new();
    for p in processes {
        let key = p.key();
        if p.present == Presence::Here || !m.contains_key(&key) {
            m.insert(key, p);
        }
    }
    m
}

impl Status {
    /// The status of world `w` with state `state`: each process located from the caller
    /// (module [`crate::pidns`]), its transfer attached.
    #[must_use]
    pub fn of(w: &World, state: StateFile) -> Status {
        let transfers = w.transfers();
        Status::assemble(state, transfers, |id, e| {
            match w.locate(&e.whereabouts(id)) {
                Found::Here(p) => (Found::Here(p), pidns::restore_thread(p, id)),
                other => (other, None),
            }
        })
    }

    /// The status of `state` with `transfers`, each process found by `find(id, entry)`: where
    /// it is, and its restore thread's tid when found.
    pub fn assemble(
        state: StateFile,
        transfers: Vec<Progress>,
        find: impl Fn(u64, &ProcessEntry) -> (Found, Option<i32>),
    ) -> Status {
        let processes = state
            .processes
            .into_iter()
            .map(|(id, mut entry)| {
                let (found, tid) = find(id, &entry);
                let (present, host_pid) = match found {
                    Found::Here(p) => (Presence::Here, p),
                    Found::Gone => (Presence::Gone, entry.pid),
                    Found::Unknown => (Presence::Unknown, entry.pid),
                };
                if let Some(t) = tid {
                    entry.restore_tid = t;
                }
                ProcessStatus {
                    id,
                    present,
                    entry,
                    host_pid,
                    tid_here: tid,
                    transfer: transfers.iter().find(|t| t.id == id).cloned(),
                }
            })
            .collect();
        Status {
            format: state.format,
            version: state.version,
            host_pid_ns: state.host_pid_ns,
            id_salt: state.id_salt,
            registered: state.registered,
            processes,
            fault_counts: state.fault_counts,
            next_alloc: state.next_alloc,
            transfers,
        }
    }

    /// The processes by their key in the JSON status ([`ProcessStatus::key`]): host pid, or
    /// `id<N>` for one whose host pid was never known. Where a pid was reused, the live process
    /// wins over a dead one.
    #[must_use]
    pub fn keyed(&self) -> BTreeMap<String, &ProcessStatus> {
        keyed(&self.processes)
    }

    /// The process with host pid `pid` (the one the JSON status files under it).
    #[must_use]
    pub fn process(&self, pid: i32) -> Option<&ProcessStatus> {
        if pid <= 0 {
            return None;
        }
        self.keyed().get(&pid.to_string()).copied()
    }

    /// The CUDA state of the process with host pid `pid`: [`CudaState::None`] when the world
    /// does not know it.
    #[must_use]
    pub fn state_of(&self, pid: i32) -> CudaState {
        self.process(pid)
            .map_or(CudaState::None, ProcessStatus::state)
    }

    /// How many calls scripted fault `index` has matched so far.
    #[must_use]
    pub fn fault_count(&self, index: usize) -> u64 {
        self.fault_counts.get(&index).copied().unwrap_or(0)
    }

    /// `mock-world status --json`: this status as pretty-printed JSON, keys sorted.
    #[must_use]
    pub fn to_json(&self) -> String {
        // Through a `Value`, whose maps sort their keys: the order the program always printed.
        let v = serde_json::to_value(self).expect("a status always serialises");
        serde_json::to_string_pretty(&v).expect("a JSON value always prints")
    }

    /// `mock-world status`: a header and one row per process (host pid, `?` when unknown; the
    /// restore thread's tid as the caller sees it, `-` when not found; state, allocations,
    /// bytes allocated and staged, namespace pid, pid namespace, GPUs with contexts), a line
    /// under a process whose transfer is in progress. Every line ends with a newline.
    #[must_use]
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:>8} {:>8} {:<13} {:>7} {:>15} {:>15} {:>6} {:>12}  gpus\n",
            "pid", "tid", "state", "allocs", "bytes", "staged", "nspid", "pid-ns"
        );
        for p in &self.processes {
            let e = &p.entry;
            let gpus: Vec<String> = e.contexts.iter().map(|g| g.0.to_string()).collect();
            let pid = p
                .host_pid()
                .map_or_else(|| "?".to_owned(), |p| p.to_string());
            let tid = p.tid_here.map_or_else(|| "-".to_owned(), |t| t.to_string());
            let _ = writeln!(
                out,
                "{pid:>8} {tid:>8} {:<13} {:>7} {:>15} {:>15} {:>6} {:>12}  {}",
                e.state().to_string(),
                e.allocations.len(),
                p.allocated_bytes(),
                p.staged_bytes(),
                e.nspid,
                e.pid_ns,
                gpus.join(",")
            );
            if let Some(t) = &p.transfer {
                let _ = writeln!(
                    out,
                    "{:>8} {} in progress: {} of {} bytes moved",
                    "",
                    t.direction,
                    t.moved(),
                    t.total()
                );
            }
        }
        out
    }
}
