//! Runtime state of a world (`state.json`): one entry per CUDA process, updated atomically
//! (read-modify-write under an exclusive `flock(2)` on `state.lock`, then a rename; readers take
//! no lock). The file carries a format tag and version; a
//! corrupt or foreign file is an error naming the file, never silently replaced.

use super::config::GpuUuidText;
use super::pidns::{NsIdentity, ProcessRef};
use super::{write_atomic, World, WorldError};
use abi::CUprocessState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// Format tag of `state.json`.
pub const STATE_FORMAT: &str = "mock-cuda-world-state";
/// Version of `state.json` (2: processes by world id, with their namespace identity).
pub const STATE_VERSION: u32 = 2;
/// How long a process waits for the state lock before reporting an error.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// The whole runtime state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateFile {
    pub format: String,
    pub version: u32,
    /// The pid namespace of the world's host (the one `mock-world init` ran in): host pids are
    /// pids of this namespace (module [`crate::pidns`]).
    pub host_pid_ns: u64,
    /// The world's salt of world ids (drawn when it was created).
    pub id_salt: u32,
    /// How many processes registered so far (the counter part of world ids).
    pub registered: u64,
    /// CUDA processes by world id.
    pub processes: BTreeMap<u64, ProcessEntry>,
    /// Matching-call counters of the scripted faults, by fault index.
    pub fault_counts: BTreeMap<usize, u64>,
    /// Next allocation id.
    pub next_alloc: u64,
}

impl Default for StateFile {
    fn default() -> Self {
        StateFile {
            format: STATE_FORMAT.to_owned(),
            version: STATE_VERSION,
            host_pid_ns: 0,
            id_salt: 0,
            registered: 0,
            processes: BTreeMap::new(),
            fault_counts: BTreeMap::new(),
            next_alloc: 1,
        }
    }
}

/// One CUDA process as the driver sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessEntry {
    /// Its host pid (a pid of the world's host pid namespace) as last known; 0 while no process
    /// that sees the host's pids has seen it (it registered inside a pid namespace of its own).
    pub pid: i32,
    /// Its pid namespace (the inode of `/proc/<pid>/ns/pid`).
    pub pid_ns: u64,
    /// Its pid in that namespace (what `getpid()` tells it).
    pub nspid: i32,
    /// `CUprocessState` value.
    pub state: u32,
    /// TID of the restore thread, in the process's own pid namespace (what `gettid()` told it).
    pub restore_tid: i32,
    /// The process's device ordinals: ordinal -> GPU.
    pub devices: Vec<GpuUuidText>,
    /// GPUs the process created contexts on.
    pub contexts: Vec<GpuUuidText>,
    /// Device allocations.
    pub allocations: Vec<Allocation>,
    /// GPUs whose state was checkpointed (set while CHECKPOINTED), with their chips.
    pub checkpointed: Vec<CheckpointedGpu>,
    /// Device memory a restore in progress has claimed on the GPUs it restores onto (empty
    /// otherwise): counted as resident, so concurrent restores and allocations cannot
    /// over-commit a GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved: Vec<CheckpointedGpu>,
    /// Checkpointed with custom storage (CUDA 13.4): its GPU memory went to wherever the
    /// caller copied it, not into the process, so it holds no staged host memory, and it
    /// restores only with custom storage. Also set while such a checkpoint or restore is open
    /// (CHECKPOINTING, RESTORING).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub custom_storage: bool,
    /// While a custom-storage operation is open: the liveness file (under the world) its caller
    /// holds locked for its life. `cuCheckpointProcessGetState` uses it to see the abort that
    /// the caller's death brings (see mock-libcuda's `custom` module).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_caller: Option<String>,
}

impl ProcessEntry {
    /// The state as the API type.
    #[must_use]
    pub fn state(&self) -> CUprocessState {
        CUprocessState(self.state)
    }

    /// Its identity as the world last knew it.
    #[must_use]
    pub fn identity(&self) -> NsIdentity {
        NsIdentity {
            ns: self.pid_ns,
            pid: self.nspid,
        }
    }

    /// What is needed to find it ([`crate::pidns::locate`]), for world id `id`.
    #[must_use]
    pub fn whereabouts(&self, id: u64) -> ProcessRef {
        ProcessRef {
            id,
            host_pid: self.pid,
            identity: self.identity(),
        }
    }
}

/// One device allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allocation {
    pub id: u64,
    /// Size in bytes (the logical size of a virtual allocation).
    pub size: u64,
    pub gpu: GpuUuidText,
    /// A virtual allocation (larger than `memory.real_mib`): its file holds the stored form of
    /// `mock_libcuda::devmem::Sparse`, not its bytes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sampled: bool,
}

/// A GPU a checkpoint holds state of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointedGpu {
    pub uuid: GpuUuidText,
    pub chip: String,
    pub bytes: u64,
}

impl StateFile {
    /// Device memory resident on `gpu`: the allocations of RUNNING, LOCKED and CHECKPOINTING
    /// processes (a checkpointed process holds none; a restoring one holds its claim) and what restores in progress claimed, leaving
    /// out `except`. Sizes are logical (a virtual allocation counts in full).
    #[must_use]
    pub fn resident_bytes(&self, gpu: abi::GpuUuid, except: Option<u64>) -> u64 {
        let others = self.processes.iter().filter(|(id, _)| Some(**id) != except);
        let allocated: u64 = others
            .clone()
            .filter(|(_, e)| {
                matches!(
                    e.state(),
                    CUprocessState::RUNNING
                        | CUprocessState::LOCKED
                        | CUprocessState::CHECKPOINTING
                )
            })
            .flat_map(|(_, e)| e.allocations.iter())
            .filter(|a| a.gpu.0 == gpu)
            .map(|a| a.size)
            .sum();
        let claimed: u64 = others
            .flat_map(|(_, e)| e.reserved.iter())
            .filter(|r| r.uuid.0 == gpu)
            .map(|r| r.bytes)
            .sum();
        allocated + claimed
    }

    /// Drops the claims of restores whose process is gone (killed mid-restore): the memory
    /// they claimed is free again. `gone(id, entry)` tells whether the process is gone.
    pub fn release_dead_claims(&mut self, gone: impl Fn(u64, &ProcessEntry) -> bool) {
        for (id, e) in &mut self.processes {
            if !e.reserved.is_empty() && gone(*id, e) {
                e.reserved.clear();
            }
        }
    }

    /// A new world id (the next of this world's counter, with its salt).
    pub fn new_id(&mut self) -> u64 {
        self.registered += 1;
        crate::pidns::make_id(self.id_salt, self.registered)
    }

    /// The entry whose identity is `ident`, with its world id.
    #[must_use]
    pub fn by_identity(&self, ident: NsIdentity) -> Option<(u64, &ProcessEntry)> {
        self.processes
            .iter()
            .find(|(_, e)| e.identity() == ident)
            .map(|(id, e)| (*id, e))
    }

    /// The entry whose recorded host pid is `pid`, with its world id (for tests and tools
    /// that know processes by host pid; the newest when a pid was reused).
    #[must_use]
    pub fn by_pid(&self, pid: i32) -> Option<(u64, &ProcessEntry)> {
        self.processes
            .iter()
            .rev()
            .find(|(_, e)| e.pid == pid && pid > 0)
            .map(|(id, e)| (*id, e))
    }

    /// Reads and validates a state file.
    pub fn load(path: &Path) -> Result<StateFile, WorldError> {
        let bad = |reason: String| WorldError::State {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| WorldError::io(path, e))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON ({e})")))?;
        match value.get("format").and_then(|f| f.as_str()) {
            Some(STATE_FORMAT) => {}
            Some(other) => return Err(bad(format!("format {other:?} is not {STATE_FORMAT:?}"))),
            None => return Err(bad(format!("no format tag: not a {STATE_FORMAT} file"))),
        }
        match value.get("version").and_then(serde_json::Value::as_u64) {
            Some(v) if v == u64::from(STATE_VERSION) => {}
            Some(v) => {
                return Err(bad(format!(
                    "version {v} is not supported (expected {STATE_VERSION})"
                )))
            }
            None => return Err(bad("no version".to_owned())),
        }
        serde_json::from_value(value).map_err(|e| bad(format!("malformed ({e})")))
    }

    /// Writes the state atomically.
    pub fn store(&self, path: &Path) -> Result<(), WorldError> {
        let text = serde_json::to_string_pretty(self).expect("state always serialises");
        write_atomic(path, text.as_bytes())
    }
}

impl World {
    /// Runs `f` on the state under the world's exclusive lock and stores the result.
    pub fn update<R>(&self, f: impl FnOnce(&mut StateFile) -> R) -> Result<R, WorldError> {
        let _guard = self.lock_state()?;
        let path = self.state_path();
        let mut state = StateFile::load(&path)?;
        let before = state.clone();
        let r = f(&mut state);
        if state != before {
            state.store(&path)?;
        }
        Ok(r)
    }

    /// A consistent snapshot of the state. Takes no lock: writers replace the file atomically
    /// (write, then rename), so a reader sees one whole version. Workloads read the state from
    /// threads that CRIU may freeze at any point; a reader must never hold the world's lock.
    pub fn read_state(&self) -> Result<StateFile, WorldError> {
        StateFile::load(&self.state_path())
    }

    fn lock_state(&self) -> Result<crate::sys::FileLock, WorldError> {
        let path = self.lock_path();
        let deadline = Instant::now() + LOCK_TIMEOUT;
        crate::sys::FileLock::acquire(&path, deadline).map_err(|e| match e {
            None => WorldError::LockTimeout {
                path: path.display().to_string(),
                ms: LOCK_TIMEOUT.as_millis() as u64,
            },
            Some(io) => WorldError::io(&path, io),
        })
    }
}

/// A process entry with no devices or memory, for tests.
#[cfg(test)]
pub(crate) fn test_entry(pid: i32, ns: u64, nspid: i32, state: CUprocessState) -> ProcessEntry {
    ProcessEntry {
        pid,
        pid_ns: ns,
        nspid,
        state: state.0,
        restore_tid: nspid + 1,
        devices: Vec::new(),
        contexts: Vec::new(),
        allocations: Vec::new(),
        checkpointed: Vec::new(),
        reserved: Vec::new(),
        custom_storage: false,
        open_caller: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pid: i32, ns: u64, nspid: i32) -> ProcessEntry {
        test_entry(pid, ns, nspid, CUprocessState::RUNNING)
    }

    #[test]
    fn processes_are_filed_by_world_id_and_found_by_identity_or_host_pid() {
        let mut st = StateFile {
            id_salt: 0x12345,
            ..StateFile::default()
        };
        let a = st.new_id();
        let b = st.new_id();
        assert_ne!(a, b);
        assert_eq!(
            a >> crate::pidns::ID_COUNTER_BITS,
            0x12345,
            "ids carry the salt"
        );
        // Two pid 1s of two namespaces, one of them with its host pid unknown.
        st.processes.insert(a, entry(4100, 7, 1));
        st.processes.insert(b, entry(0, 8, 1));
        assert_eq!(
            st.by_identity(NsIdentity { ns: 8, pid: 1 }).map(|x| x.0),
            Some(b)
        );
        assert_eq!(
            st.by_identity(NsIdentity { ns: 7, pid: 1 }).map(|x| x.0),
            Some(a)
        );
        assert_eq!(st.by_identity(NsIdentity { ns: 9, pid: 1 }), None);
        assert_eq!(st.by_pid(4100).map(|x| x.0), Some(a));
        assert_eq!(st.by_pid(0), None, "an unknown host pid names nothing");
        // Claims of gone processes are released, others kept.
        for e in st.processes.values_mut() {
            e.reserved.push(CheckpointedGpu {
                uuid: GpuUuidText(abi::GpuUuid([1; 16])),
                chip: "GH100".into(),
                bytes: 5,
            });
        }
        st.release_dead_claims(|id, _| id == a);
        assert!(st.processes[&a].reserved.is_empty());
        assert_eq!(st.processes[&b].reserved.len(), 1);
        let p = dir_round_trip(&st);
        assert_eq!(p, st);
    }

    fn dir_round_trip(st: &StateFile) -> StateFile {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        st.store(&p).unwrap();
        StateFile::load(&p).unwrap()
    }

    #[test]
    fn corrupt_and_foreign_files_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        std::fs::write(&p, "{ not json").unwrap();
        let e = StateFile::load(&p).unwrap_err().to_string();
        assert!(
            e.contains("state.json") && e.contains("not valid JSON"),
            "{e}"
        );
        std::fs::write(&p, r#"{"format":"something-else","version":1}"#).unwrap();
        let e = StateFile::load(&p).unwrap_err().to_string();
        assert!(e.contains("something-else"), "{e}");
        std::fs::write(&p, r#"{"format":"mock-cuda-world-state","version":99}"#).unwrap();
        let e = StateFile::load(&p).unwrap_err().to_string();
        assert!(e.contains("version 99"), "{e}");
        // A world of the previous version (processes by pid) is refused, not misread.
        std::fs::write(&p, r#"{"format":"mock-cuda-world-state","version":1}"#).unwrap();
        let e = StateFile::load(&p).unwrap_err().to_string();
        assert!(e.contains("version 1 is not supported"), "{e}");
        StateFile::default().store(&p).unwrap();
        assert_eq!(StateFile::load(&p).unwrap(), StateFile::default());
    }
}
