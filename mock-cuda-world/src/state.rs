//! Runtime state of a world: the world's own fields in `state.json` (its host, its counters:
//! world ids, allocation ids, fault matches) and each CUDA process's entry in a file of its own,
//! `procs/<world id>.json`. Every change is a read-modify-write under one exclusive `flock(2)` on
//! `state.lock`, then a rename of each file it changed; readers take no lock. A change reads and
//! writes only the files it concerns: a process changing its own entry (its state at a lock, its
//! contexts, its restore thread) reads and writes that entry alone, so the lock is held for
//! microseconds whatever the number of processes, and a process looking at its own entry (a
//! workload's memory copies) reads one small file. `state.json` carries a format tag and
//! version; a corrupt or foreign file is an error naming the file, never silently replaced.
//!
//! A reader of the whole state ([`World::read_state`]) reads the files one after another: each
//! entry is one whole version of itself, but a change to two entries at once (rare: a dead
//! process's entry dropped while another takes its identity) may be seen half made.

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
/// Version of `state.json` (2: processes by world id, with their namespace identity; 3: each
/// process's entry in `procs/<id>.json`).
pub const STATE_VERSION: u32 = 3;
/// The directory of the processes' entries, one `<world id>.json` each.
pub const PROCS_DIR: &str = "procs";
/// How long a process waits for the state lock before reporting an error. An update takes
/// milliseconds; the bound is for a holder that never lets go, not for the queue of 32 tasks
/// registering at once on a loaded 2-core runner beside other scenarios.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// The whole runtime state: `state.json` and the processes' entries.
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
    /// CUDA processes by world id (each in `procs/<id>.json`, not in `state.json`).
    #[serde(skip)]
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
    /// The collective the process is a member of (`MOCK_CUDA_COLLECTIVE=NAME:SIZE`, what
    /// `mock-cuda-app --collective` sets), as the ranks of an NCCL communicator are: a
    /// member's lock completes only once every member has a lock requested (see
    /// [`StateFile::collective_gathered`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<Collective>,
    /// A lock request is being carried out on the process's restore thread (it waits for the
    /// process's work in flight): a lock requested and not yet answered.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub locking: bool,
}

/// Membership of a collective: its name and how many members it has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Collective {
    pub name: String,
    pub size: u32,
}

impl Collective {
    /// Parses `NAME:SIZE` (a non-empty name without `:`, a size of at least 1).
    pub fn parse(s: &str) -> Result<Collective, String> {
        let bad = || format!("{s:?} is not NAME:SIZE (a name and a number of members, at least 1)");
        let (name, size) = s.rsplit_once(':').ok_or_else(bad)?;
        let size: u32 = size.trim().parse().map_err(|_| bad())?;
        if name.is_empty() || name.contains(':') || size == 0 {
            return Err(bad());
        }
        Ok(Collective {
            name: name.to_owned(),
            size,
        })
    }
}

impl ProcessEntry {
    /// A process as it registers: in `state` (a `CUprocessState` value), with its restore
    /// thread `restore_tid`, and no devices, contexts, memory, images or operations yet.
    #[must_use]
    pub fn new(pid: i32, pid_ns: u64, nspid: i32, state: u32, restore_tid: i32) -> Self {
        ProcessEntry {
            pid,
            pid_ns,
            nspid,
            state,
            restore_tid,
            devices: Vec::new(),
            contexts: Vec::new(),
            allocations: Vec::new(),
            checkpointed: Vec::new(),
            reserved: Vec::new(),
            custom_storage: false,
            open_caller: None,
            collective: None,
            locking: false,
        }
    }

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

    /// Whether every member of `c` has a lock requested: how many processes of the collective
    /// are LOCKED (or further: CHECKPOINTED, CHECKPOINTING, RESTORING) or have a lock in
    /// progress, against its size. A member's work in flight needs all its peers (as an
    /// NCCL rank's kernel waits for the other ranks), so its lock completes only then.
    #[must_use]
    pub fn collective_gathered(&self, c: &Collective) -> bool {
        let joined = self
            .processes
            .values()
            .filter(|e| e.collective.as_ref().is_some_and(|m| m.name == c.name))
            .filter(|e| {
                e.locking || !matches!(e.state(), CUprocessState::RUNNING | CUprocessState::FAILED)
            })
            .count();
        joined >= c.size as usize
    }

    /// Reads and validates the state of the world at `dir`: `state.json` and every entry of
    /// `procs/`.
    pub fn load(dir: &Path) -> Result<StateFile, WorldError> {
        let path = dir.join("state.json");
        let text = std::fs::read_to_string(&path).map_err(|e| WorldError::io(&path, e))?;
        let mut st = StateFile::parse(&text, &path)?;
        for (id, path) in entry_files(dir)? {
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(WorldError::io(&path, e)),
            };
            st.processes
                .insert(id, parse_entry(text.as_bytes(), &path)?);
        }
        Ok(st)
    }

    /// Validates the text of the state file `path` (its processes are not in it).
    fn parse(text: &str, path: &Path) -> Result<StateFile, WorldError> {
        let bad = |reason: String| WorldError::State {
            path: path.display().to_string(),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON ({e})")))?;
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

    /// Writes the whole state of the world at `dir` (each file atomically): `state.json`, an
    /// entry per process, and no entry of a process it does not hold.
    pub fn store(&self, dir: &Path) -> Result<(), WorldError> {
        let procs = dir.join(PROCS_DIR);
        std::fs::create_dir_all(&procs).map_err(|e| WorldError::io(&procs, e))?;
        for (id, path) in entry_files(dir)? {
            if !self.processes.contains_key(&id) {
                remove_entry_file(&path)?;
            }
        }
        for (id, e) in &self.processes {
            store_entry(&entry_path(dir, *id), e)?;
        }
        self.store_own(dir)
    }

    /// Writes `state.json` alone (atomically).
    fn store_own(&self, dir: &Path) -> Result<(), WorldError> {
        let text = serde_json::to_string_pretty(self).expect("state always serialises");
        write_atomic(&dir.join("state.json"), text.as_bytes())
    }

    /// Whether `self` and `other` differ in what `state.json` holds (not in their processes).
    fn same_own(&self, other: &StateFile) -> bool {
        self.format == other.format
            && self.version == other.version
            && self.host_pid_ns == other.host_pid_ns
            && self.id_salt == other.id_salt
            && self.registered == other.registered
            && self.fault_counts == other.fault_counts
            && self.next_alloc == other.next_alloc
    }
}

/// The file of the entry of world id `id` in the world at `dir`.
fn entry_path(dir: &Path, id: u64) -> std::path::PathBuf {
    dir.join(PROCS_DIR).join(format!("{id}.json"))
}

/// The entry files of the world at `dir`, by world id (nothing when it has no `procs/`).
/// Other names (a writer's temporary files) are not entries.
fn entry_files(dir: &Path) -> Result<Vec<(u64, std::path::PathBuf)>, WorldError> {
    let procs = dir.join(PROCS_DIR);
    let list = match std::fs::read_dir(&procs) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(WorldError::io(&procs, e)),
    };
    let mut out = Vec::new();
    for item in list {
        let item = item.map_err(|e| WorldError::io(&procs, e))?;
        let name = item.file_name();
        let id = name
            .to_str()
            .and_then(|n| n.strip_suffix(".json"))
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(id) = id {
            out.push((id, item.path()));
        }
    }
    Ok(out)
}

/// Validates the bytes of the entry file `path`.
fn parse_entry(bytes: &[u8], path: &Path) -> Result<ProcessEntry, WorldError> {
    serde_json::from_slice(bytes).map_err(|e| WorldError::State {
        path: path.display().to_string(),
        reason: format!("not a process entry ({e})"),
    })
}

fn store_entry(path: &Path, e: &ProcessEntry) -> Result<(), WorldError> {
    let text = serde_json::to_vec(e).expect("an entry always serialises");
    write_atomic(path, &text)
}

fn remove_entry_file(path: &Path) -> Result<(), WorldError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(WorldError::io(path, e)),
        _ => Ok(()),
    }
}

thread_local! {
    /// The calling thread's last parse of `state.json`: (path, bytes, parsed).
    static OWN_CACHE: std::cell::RefCell<Option<(std::path::PathBuf, Vec<u8>, StateFile)>> =
        const { std::cell::RefCell::new(None) };
    /// The calling thread's last parse of each entry file it read: path -> (bytes, parsed).
    static ENTRY_CACHE: std::cell::RefCell<std::collections::HashMap<std::path::PathBuf, (Vec<u8>, ProcessEntry)>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// Entries a thread keeps parsed at most (a test process opens many worlds).
const ENTRY_CACHE_MAX: usize = 4096;

impl World {
    /// `state.json` as it is now, without the processes: read whole every time, but parsed
    /// again only when its bytes differ from those this thread last parsed for this path (else
    /// a copy of what it parsed then). Entries are read the same way ([`Self::load_entry`]).
    /// Every CUDA call of a workload looks at the state, and parsing is what costs: with 64
    /// processes in one file, 64 workloads checking their memory every 50 ms parsed its 30 KB
    /// over a thousand times a second, which took most of a 2-core machine.
    ///
    /// The caches are the calling thread's own: a workload's threads are frozen by CRIU at any
    /// point, and one frozen while holding a cache shared by the process (or in `malloc` while
    /// another thread frees what it allocated) would block the restore thread, which must serve
    /// the driver's requests while its task is frozen (`restore_thread_stress` caught exactly
    /// that with a process-wide cache).
    fn load_own(&self) -> Result<StateFile, WorldError> {
        let path = self.state_path();
        let bytes = std::fs::read(&path).map_err(|e| WorldError::io(&path, e))?;
        let hit = OWN_CACHE.with_borrow(|c| match c {
            Some((p, seen, st)) if *p == path && *seen == bytes => Some(st.clone()),
            _ => None,
        });
        if let Some(st) = hit {
            return Ok(st);
        }
        let text = String::from_utf8(bytes).map_err(|e| WorldError::State {
            path: path.display().to_string(),
            reason: format!("not UTF-8 ({e})"),
        })?;
        let st = StateFile::parse(&text, &path)?;
        OWN_CACHE.set(Some((path, text.into_bytes(), st.clone())));
        Ok(st)
    }

    /// The entry of world id `id` as it is now (`None` when the world has none), from its file
    /// (see [`Self::load_own`] for the cache).
    fn load_entry(&self, id: u64) -> Result<Option<ProcessEntry>, WorldError> {
        self.load_entry_at(&entry_path(self.dir(), id))
    }

    fn load_entry_at(&self, path: &Path) -> Result<Option<ProcessEntry>, WorldError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(WorldError::io(path, e)),
        };
        let hit = ENTRY_CACHE.with_borrow(|c| {
            c.get(path)
                .filter(|(seen, _)| *seen == bytes)
                .map(|(_, e)| e.clone())
        });
        if let Some(e) = hit {
            return Ok(Some(e));
        }
        let e = parse_entry(&bytes, path)?;
        ENTRY_CACHE.with_borrow_mut(|c| {
            if c.len() >= ENTRY_CACHE_MAX {
                c.clear();
            }
            c.insert(path.to_path_buf(), (bytes, e.clone()));
        });
        Ok(Some(e))
    }

    /// The whole state as it is now: `state.json`, then every entry.
    fn load_state(&self) -> Result<StateFile, WorldError> {
        let mut st = self.load_own()?;
        for (id, path) in entry_files(self.dir())? {
            // An entry removed since the listing is no longer there.
            if let Some(e) = self.load_entry_at(&path)? {
                st.processes.insert(id, e);
            }
        }
        Ok(st)
    }

    /// Runs `f` on the whole state under the world's exclusive lock and stores what it changed
    /// (the entries it changed, added or removed, and `state.json`). `f` may run more than once:
    /// when the lock was broken while this thread was stopped holding it (see
    /// [`LOCK_BREAK_AFTER`]), its first result is discarded and the update starts again on the
    /// state as it is now. An error is also written to the world's error log. An update of one
    /// process's entry is [`Self::update_entry`] (or [`Self::update_process`]), of the world's
    /// own fields [`Self::update_own`]: they read and write nothing else.
    pub fn update<R>(&self, f: impl FnMut(&mut StateFile) -> R) -> Result<R, WorldError> {
        self.transact(
            Self::load_state,
            |state, before| state == before,
            |me, state, before| {
                let dir = me.dir();
                for (id, e) in &state.processes {
                    if before.processes.get(id) != Some(e) {
                        store_entry(&entry_path(dir, *id), e)?;
                    }
                }
                for id in before.processes.keys() {
                    if !state.processes.contains_key(id) {
                        remove_entry_file(&entry_path(dir, *id))?;
                    }
                }
                if !state.same_own(before) {
                    state.store_own(dir)?;
                }
                Ok(())
            },
            f,
        )
    }

    /// [`Self::update`] when it would change something: `f` runs first on the state as a
    /// reader sees it, without the lock, and only when it changes that state does the update
    /// run under the lock. For a look that usually changes nothing (resolving a pid every call
    /// makes); `f` must act on the state alone (it may run on a state that is not stored).
    pub fn update_if_changed<R>(
        &self,
        mut f: impl FnMut(&mut StateFile) -> R,
    ) -> Result<R, WorldError> {
        let mut seen = self.read_state()?;
        let before = seen.clone();
        let r = f(&mut seen);
        if seen == before {
            return Ok(r);
        }
        self.update(f)
    }

    /// Runs `f` on the entry of world id `id` (`None` when the world has none: setting it adds
    /// one, clearing it removes it) under the world's exclusive lock, and stores it when `f`
    /// changed it; nothing else is read or written. As [`Self::update`] otherwise.
    pub fn update_process<R>(
        &self,
        id: u64,
        f: impl FnMut(&mut Option<ProcessEntry>) -> R,
    ) -> Result<R, WorldError> {
        self.transact(
            |me| me.load_entry(id),
            |slot, before| slot == before,
            |me, slot, _| {
                let path = entry_path(me.dir(), id);
                match slot {
                    Some(e) => store_entry(&path, e),
                    None => remove_entry_file(&path),
                }
            },
            f,
        )
    }

    /// Runs `f` on the entry of world id `id`, if the world has one (`Ok(None)` when it has
    /// not): [`Self::update_process`] for a change of an entry that exists.
    pub fn update_entry<R>(
        &self,
        id: u64,
        mut f: impl FnMut(&mut ProcessEntry) -> R,
    ) -> Result<Option<R>, WorldError> {
        self.update_process(id, |slot| slot.as_mut().map(&mut f))
    }

    /// Runs `f` on the world's own fields (`state.json`: its counters, its host) under the
    /// world's exclusive lock; `f` sees no processes (and a change to them is not stored). As
    /// [`Self::update`] otherwise.
    pub fn update_own<R>(&self, mut f: impl FnMut(&mut StateFile) -> R) -> Result<R, WorldError> {
        self.transact(
            Self::load_own,
            |state, before| state.same_own(before),
            |me, state, _| state.store_own(me.dir()),
            |state| {
                let r = f(state);
                debug_assert!(
                    state.processes.is_empty(),
                    "update_own changed the processes"
                );
                r
            },
        )
    }

    /// The one read-modify-write under the world's exclusive lock that every update is: takes
    /// the lock, `load`s what the update concerns, runs `f` on it, and, when `unchanged` says it
    /// changed, `store`s it (given the value before `f`, to store only what differs). When the
    /// lock was broken while this thread was stopped holding it, the result is discarded and
    /// the update starts again on what is stored now. Errors are also written to the world's
    /// error log.
    fn transact<T: Clone, R>(
        &self,
        load: impl Fn(&Self) -> Result<T, WorldError>,
        unchanged: impl Fn(&T, &T) -> bool,
        store: impl Fn(&Self, &T, &T) -> Result<(), WorldError>,
        mut f: impl FnMut(&mut T) -> R,
    ) -> Result<R, WorldError> {
        self.logged("state update", || loop {
            let guard = self.lock_state()?;
            let mut value = load(self)?;
            let before = value.clone();
            let r = f(&mut value);
            if unchanged(&value, &before) {
                return Ok(r);
            }
            if !self.still_ours(&guard) {
                continue;
            }
            store(self, &value, &before)?;
            return Ok(r);
        })
    }

    /// Whether this thread still holds the lock `guard` (no waiter broke it while the thread
    /// was stopped): if not, logged, and the update starts again.
    fn still_ours(&self, guard: &StateLock) -> bool {
        if guard.still_held() {
            return true;
        }
        self.log_error(&format!(
            "state update: the state lock was broken while thread {} held it \
             (stopped); the update starts again",
            nix::unistd::gettid()
        ));
        false
    }

    fn logged<R>(
        &self,
        what: &str,
        f: impl FnOnce() -> Result<R, WorldError>,
    ) -> Result<R, WorldError> {
        f().inspect_err(|e| self.log_error(&format!("{what}: {e}")))
    }

    /// The whole state as it is now. Takes no lock: writers replace each file atomically
    /// (write, then rename), so a reader sees one whole version of each (module
    /// documentation). Workloads read the state from threads that CRIU may freeze at any
    /// point; a reader must never hold the world's lock. An error is also written to the
    /// world's error log.
    pub fn read_state(&self) -> Result<StateFile, WorldError> {
        self.logged("state read", || self.load_state())
    }

    /// The entry of world id `id` as it is now (`None` when the world has none), read alone
    /// and without the lock (as [`Self::read_state`]).
    pub fn read_process(&self, id: u64) -> Result<Option<ProcessEntry>, WorldError> {
        self.logged("state read", || self.load_entry(id))
    }

    /// The world's own fields as they are now (`state.json`; no processes), read without the
    /// lock.
    pub fn read_own(&self) -> Result<StateFile, WorldError> {
        self.logged("state read", || self.load_own())
    }

    fn lock_state(&self) -> Result<StateLock, WorldError> {
        let path = self.lock_path();
        let deadline = Instant::now() + LOCK_TIMEOUT;
        StateLock::acquire(&path, deadline, |what| self.log_error(what)).map_err(|e| match e {
            None => WorldError::LockTimeout {
                path: path.display().to_string(),
                ms: LOCK_TIMEOUT.as_millis() as u64,
            },
            Some(io) => WorldError::io(&path, io),
        })
    }
}

/// How long a waiter lets a stopped holder (a ptrace stop: CRIU's freeze, a plugin that stops
/// a restore thread between calls; or SIGSTOP) keep the state lock before it breaks it. A
/// thread of a CUDA process is stopped at arbitrary points, also inside an update; the real
/// driver's locks are per process, so another process's call never waits for it there, and
/// in the mock it must not either (the caller is often the very process that would resume the
/// holder). A broken lock's holder finds out before it stores (the lock file it holds is no
/// longer the world's) and starts its update again; the gap between that check and its
/// rename is a few microseconds, the one window the model leaves open.
pub const LOCK_BREAK_AFTER: Duration = Duration::from_millis(300);

/// The longest pause between two tries at the state lock (the first is
/// [`crate::sys::LOCK_RETRY`], each next one twice as long). An update holds the lock for well
/// under a millisecond on an idle machine.
const LOCK_RETRY_MAX: Duration = Duration::from_millis(2);

/// The world's state lock, held: an exclusive `flock(2)` on `state.lock`, which also names
/// its holder (`<pid> <tid>`) for waiters.
struct StateLock {
    file: nix::fcntl::Flock<std::fs::File>,
    path: std::path::PathBuf,
}

impl StateLock {
    fn acquire(
        path: &Path,
        deadline: Instant,
        log: impl Fn(&str),
    ) -> Result<StateLock, Option<std::io::Error>> {
        use crate::sys::{open_lock_file, try_flock, LOCK_RETRY};
        use std::os::unix::fs::FileExt;
        // Tries come further apart the longer the wait (up to LOCK_RETRY_MAX): 64 processes
        // starting at once each tried every 200 us, and their tries took the CPU the holder
        // needed to let go (lock waits of up to 2 s behind holds of a few milliseconds).
        let mut pause = LOCK_RETRY;
        let mut retry = || {
            std::thread::sleep(pause);
            pause = (pause * 2).min(LOCK_RETRY_MAX);
        };
        // Since when the holder seen (by tid) has been stopped.
        let mut stopped_since: Option<(String, Instant)> = None;
        let mut next_look = Instant::now() + Duration::from_millis(50);
        let mut file = open_lock_file(path).map_err(Some)?;
        loop {
            match try_flock(file).map_err(Some)? {
                Ok(l) => {
                    let held = StateLock {
                        file: l,
                        path: path.to_path_buf(),
                    };
                    // A lock on a file a waiter has since unlinked (broken) is no lock: the
                    // world's lock file is opened again.
                    if !held.still_held() {
                        file = open_lock_file(path).map_err(Some)?;
                        continue;
                    }
                    let me = format!("{} {}\n", std::process::id(), nix::unistd::gettid());
                    let _ = held.file.set_len(0);
                    let _ = held.file.write_all_at(me.as_bytes(), 0);
                    return Ok(held);
                }
                Err(f) => file = f,
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(None);
            }
            // The holder is looked at every 50 ms, not on every try: 32 waiters reading /proc
            // at once would starve the holder they wait for.
            if now < next_look {
                retry();
                continue;
            }
            next_look = now + Duration::from_millis(50);
            let holder = std::fs::read_to_string(path).unwrap_or_default();
            let ids: Vec<i32> = holder
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            let stopped = match ids[..] {
                [pid, tid] => crate::sys::stopped(pid, tid),
                _ => false,
            };
            match &stopped_since {
                Some((h, since)) if stopped && *h == holder => {
                    if now.duration_since(*since) >= LOCK_BREAK_AFTER {
                        // Unlinked, the open makes a new lock file; the holder's is an orphan
                        // it will notice.
                        let _ = std::fs::remove_file(path);
                        file = open_lock_file(path).map_err(Some)?;
                        log(&format!(
                            "state lock: broke the lock of thread {} (stopped for {} ms \
                             holding it)",
                            holder.trim(),
                            now.duration_since(*since).as_millis()
                        ));
                        stopped_since = None;
                        continue;
                    }
                }
                _ if stopped => stopped_since = Some((holder, now)),
                _ => stopped_since = None,
            }
            retry();
        }
    }

    /// Whether the file this lock is on is still the world's lock file (no waiter broke it).
    fn still_held(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (self.file.metadata(), std::fs::metadata(&self.path)) {
            (Ok(mine), Ok(now)) => mine.ino() == now.ino() && mine.dev() == now.dev(),
            _ => false,
        }
    }
}

/// A process entry with no devices or memory, for tests.
#[cfg(test)]
pub(crate) fn test_entry(pid: i32, ns: u64, nspid: i32, state: CUprocessState) -> ProcessEntry {
    ProcessEntry::new(pid, ns, nspid, state.0, nspid + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pid: i32, ns: u64, nspid: i32) -> ProcessEntry {
        test_entry(pid, ns, nspid, CUprocessState::RUNNING)
    }

    #[test]
    fn a_collective_is_name_and_size() {
        assert_eq!(
            Collective::parse("tp:8"),
            Ok(Collective {
                name: "tp".into(),
                size: 8
            })
        );
        for bad in ["tp", "tp:", ":8", "tp:0", "tp:x", "a:b:2", "tp:-1"] {
            assert!(Collective::parse(bad).is_err(), "{bad}");
        }
    }

    /// A collective is gathered once each of its members is locking, LOCKED or further along;
    /// members of another collective and processes of none do not count.
    #[test]
    fn a_collective_gathers_when_every_member_has_a_lock_requested() {
        let tp = Collective::parse("tp:3").unwrap();
        let mut st = StateFile::default();
        for (id, name) in [(1, "tp"), (2, "tp"), (3, "tp"), (4, "dp")] {
            let mut e = entry(100 + id as i32, 1, 100 + id as i32);
            e.collective = Some(Collective {
                name: name.into(),
                size: 3,
            });
            st.processes.insert(id, e);
        }
        st.processes.insert(5, entry(105, 1, 105));
        assert!(!st.collective_gathered(&tp));
        st.processes.get_mut(&1).unwrap().locking = true;
        st.processes.get_mut(&2).unwrap().state = CUprocessState::CHECKPOINTED.0;
        for other in [4, 5] {
            st.processes.get_mut(&other).unwrap().locking = true;
        }
        assert!(!st.collective_gathered(&tp), "one member is not locking");
        st.processes.get_mut(&3).unwrap().state = CUprocessState::LOCKED.0;
        assert!(st.collective_gathered(&tp));
        st.processes.get_mut(&3).unwrap().state = CUprocessState::FAILED.0;
        assert!(
            !st.collective_gathered(&tp),
            "a failed member takes no part"
        );
    }

    fn small_world() -> (tempfile::TempDir, World) {
        let dir = tempfile::tempdir().unwrap();
        let cfg = "schema = 1\n[driver]\nbranch = 580\n";
        std::fs::write(dir.path().join("world.toml"), cfg).unwrap();
        StateFile::default().store(dir.path()).unwrap();
        let w = World::open(dir.path()).unwrap();
        (dir, w)
    }

    /// A read parses the file only when its bytes changed since the last read; a change by
    /// another world's handle (another process), by rename or in place, and a file gone bad
    /// are seen at the next read.
    #[test]
    fn a_read_sees_every_new_version_of_the_state() {
        let (dir, w) = small_world();
        let other = World::open(dir.path()).unwrap();
        let path = dir.path().join("state.json");
        assert_eq!(w.read_state().unwrap().next_alloc, 1);
        assert_eq!(w.read_state().unwrap(), w.read_state().unwrap());
        other.update(|st| st.next_alloc = 7).unwrap();
        assert_eq!(w.read_state().unwrap().next_alloc, 7, "replaced by rename");
        let mut st = w.read_state().unwrap();
        st.next_alloc = 8;
        let text = serde_json::to_string_pretty(&st).unwrap();
        std::fs::write(&path, text).unwrap();
        assert_eq!(
            w.read_state().unwrap().next_alloc,
            8,
            "rewritten in place, same size"
        );
        w.update(|st| st.registered = 3).unwrap();
        let st = other.read_state().unwrap();
        assert_eq!((st.next_alloc, st.registered), (8, 3));
        std::fs::write(&path, "{").unwrap();
        assert!(
            w.read_state().is_err(),
            "a bad file is an error, not the last good state"
        );
    }

    #[test]
    fn a_holder_stopped_with_the_lock_is_broken_and_the_update_goes_on() {
        let (_dir, w) = small_world();
        let lock = w.lock_path();
        // flock(1) takes the lock and runs sh, which shares its open file, names itself the
        // holder and stops, as a thread CRIU or the plugin stops inside an update.
        let script = format!(
            "echo \"$$ $$\" > '{}'; kill -STOP $$; sleep 60",
            lock.display()
        );
        let mut holder = std::process::Command::new("flock")
            .arg(&lock)
            .args(["sh", "-c", &script])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("flock(1) (util-linux)");
        let named = Instant::now() + Duration::from_secs(10);
        let sh = loop {
            let text = std::fs::read_to_string(&lock).unwrap_or_default();
            let pid: Option<i32> = text.split_whitespace().next().and_then(|p| p.parse().ok());
            if let Some(pid) = pid.filter(|&p| crate::sys::stopped(p, p)) {
                break pid;
            }
            assert!(Instant::now() < named, "the holder never stopped: {text:?}");
            std::thread::sleep(Duration::from_millis(5));
        };
        let was = w.read_state().unwrap().next_alloc;
        let start = Instant::now();
        w.update(|st| st.next_alloc += 1).unwrap();
        let took = start.elapsed();
        assert!(
            took >= LOCK_BREAK_AFTER && took < LOCK_TIMEOUT / 2,
            "broken after {took:?}"
        );
        assert_eq!(w.read_state().unwrap().next_alloc, was + 1);
        let log = std::fs::read_to_string(w.dir().join(crate::timeouts::ERRORS_FILE)).unwrap();
        assert!(
            log.contains(&format!("broke the lock of thread {sh} {sh}")),
            "{log}"
        );
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(sh),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = holder.kill();
        let _ = holder.wait();
    }

    #[test]
    fn an_update_whose_lock_was_broken_is_made_again_on_the_state_as_it_is() {
        let (_dir, w) = small_world();
        let mut runs = 0;
        w.update(|st| {
            runs += 1;
            if runs == 1 {
                // What a waiter does to a stopped holder, and another update after it.
                std::fs::remove_file(w.lock_path()).unwrap();
                let mut other = StateFile::load(w.dir()).unwrap();
                other.next_alloc = 10;
                other.store(w.dir()).unwrap();
            }
            st.next_alloc += 1;
        })
        .unwrap();
        assert_eq!(runs, 2, "made again once");
        assert_eq!(
            w.read_state().unwrap().next_alloc,
            11,
            "the other update is kept"
        );
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
        st.store(dir.path()).unwrap();
        StateFile::load(dir.path()).unwrap()
    }

    #[test]
    fn corrupt_and_foreign_files_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        let load = || StateFile::load(dir.path());
        std::fs::write(&p, "{ not json").unwrap();
        let e = load().unwrap_err().to_string();
        assert!(
            e.contains("state.json") && e.contains("not valid JSON"),
            "{e}"
        );
        std::fs::write(&p, r#"{"format":"something-else","version":1}"#).unwrap();
        let e = load().unwrap_err().to_string();
        assert!(e.contains("something-else"), "{e}");
        std::fs::write(&p, r#"{"format":"mock-cuda-world-state","version":99}"#).unwrap();
        let e = load().unwrap_err().to_string();
        assert!(e.contains("version 99"), "{e}");
        // Worlds of the earlier versions (processes by pid; all processes in state.json) are
        // refused, not misread.
        for v in [1, 2] {
            std::fs::write(
                &p,
                format!(r#"{{"format":"mock-cuda-world-state","version":{v}}}"#),
            )
            .unwrap();
            let e = load().unwrap_err().to_string();
            assert!(e.contains(&format!("version {v} is not supported")), "{e}");
        }
        StateFile::default().store(dir.path()).unwrap();
        assert_eq!(load().unwrap(), StateFile::default());
        // A bad entry is an error naming its file.
        let entry = dir.path().join(PROCS_DIR).join("7.json");
        std::fs::write(&entry, "{").unwrap();
        let e = load().unwrap_err().to_string();
        assert!(
            e.contains("procs/7.json") && e.contains("not a process entry"),
            "{e}"
        );
    }

    /// Each process's entry is a file of its own; an update of one entry, or of the world's own
    /// fields, reads and writes nothing else, and a whole-state update stores exactly what it
    /// changed (an entry removed is a file removed).
    #[test]
    fn entries_are_files_of_their_own_and_updates_touch_only_theirs() {
        let (dir, w) = small_world();
        let procs = dir.path().join(PROCS_DIR);
        w.update(|st| {
            for id in [1, 2, 3] {
                st.processes
                    .insert(id, entry(100 + id as i32, 1, 100 + id as i32));
            }
            st.registered = 3;
        })
        .unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&procs)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["1.json", "2.json", "3.json"]);
        let text = std::fs::read_to_string(dir.path().join("state.json")).unwrap();
        assert!(!text.contains("processes"), "{text}");
        let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
        let ino = |p: &Path| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(p).unwrap().ino()
        };
        let (one, three, own) = (
            procs.join("1.json"),
            procs.join("3.json"),
            dir.path().join("state.json"),
        );
        let before = (ino(&one), ino(&three), ino(&own), mtime(&own));
        // One entry: only its file is replaced.
        let r = w.update_entry(2, |e| {
            e.state = CUprocessState::LOCKED.0;
            7
        });
        assert_eq!(r.unwrap(), Some(7));
        assert_eq!(
            w.read_process(2).unwrap().unwrap().state(),
            CUprocessState::LOCKED
        );
        assert_eq!((ino(&one), ino(&three), ino(&own), mtime(&own)), before);
        // An entry the world lacks is not made by update_entry, and is by update_process.
        assert_eq!(w.update_entry(9, |e| e.pid = 1).unwrap(), None);
        assert!(!procs.join("9.json").exists());
        w.update_process(9, |slot| *slot = Some(entry(109, 1, 109)))
            .unwrap();
        assert_eq!(w.read_process(9).unwrap().map(|e| e.pid), Some(109));
        // The world's own fields: state.json alone.
        w.update_own(|st| st.next_alloc = 5).unwrap();
        assert_eq!((ino(&one), ino(&three)), (before.0, before.1));
        assert_eq!(w.read_own().unwrap().next_alloc, 5);
        // A whole-state update that removes an entry removes its file, and leaves the others.
        w.update(|st| {
            st.processes.remove(&3);
        })
        .unwrap();
        assert!(!three.exists());
        assert_eq!(ino(&one), before.0);
        let st = w.read_state().unwrap();
        assert_eq!(st.processes.keys().copied().collect::<Vec<_>>(), [1, 2, 9]);
        assert_eq!((st.registered, st.next_alloc), (3, 5));
        // A writer's temporary file is not an entry.
        std::fs::write(procs.join("4.json.tmp.1.0"), "{").unwrap();
        assert_eq!(w.read_state().unwrap().processes.len(), 3);
        // update_if_changed takes the lock only for a change, and then makes it.
        let mut runs = 0;
        w.update_if_changed(|st| {
            runs += 1;
            st.processes.len()
        })
        .unwrap();
        assert_eq!(
            runs, 1,
            "nothing to change: run once, on what a reader sees"
        );
        w.update_if_changed(|st| {
            runs += 1;
            st.processes.remove(&9);
        })
        .unwrap();
        assert_eq!(runs, 3, "a change: run again under the lock");
        assert!(w.read_process(9).unwrap().is_none());
    }
}
