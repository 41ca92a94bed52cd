//! The messages between the plugin in CRIU and its helper process, one JSON document per
//! `SOCK_SEQPACKET` message. Both ends are the same build of the same library (the helper is a
//! fork of CRIU that never execs), so there is no version skew to negotiate; a message that does
//! not decode is a bug, reported as such.

use crate::backend::driver::{DriverCall, DriverReply};
use crate::backend::Pid;
use crate::inventory::GpuInfo;
use crate::nvml::{GpuMemory, Snapshot};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// CRIU → helper.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToAgent {
    /// Run `call`; the answer is a [`FromAgent::Reply`] with the same `id`. `deadline_ms` is how
    /// long CRIU waits for it (the guardian waits that long for a call in flight when CRIU dies).
    Call {
        id: u64,
        deadline_ms: Option<u64>,
        call: Call,
    },
    /// What the guardian needs to act; sent once the backend is chosen.
    Configure(GuardConfig),
    /// A task whose CUDA state the plugin is about to change, and the state to put it back to.
    Track(Tracked),
    /// The plugin is about to `op` the task (so the guardian's log says what was in progress).
    Intent { pid: Pid, op: String },
    /// The task is back in the state it is to be left in (or gone): nothing to guard.
    Untrack { pid: Pid },
    /// CRIU stopped waiting for the call `id` (it timed out): should it still succeed, a lock
    /// or a checkpoint that CRIU counted as failed is undone by the helper (unlocked; restored
    /// and unlocked), since CRIU's rollback may have looked at the task before it landed.
    Abandon { id: u64 },
    /// The plugin's work in this CRIU run is over.
    Finish(FinishMode),
}

/// A request that has an answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Call {
    /// Load `libcuda.so.1`, read the driver version and, with `call_init`, call `cuInit(0)`.
    Probe { call_init: bool },
    /// One driver call (the library was loaded by an earlier probe).
    Driver(DriverCall),
    /// The GPUs, as CUDA enumerates them.
    Gpus,
    /// NVML's view of the GPUs' memory.
    Nvml,
}

/// Helper → CRIU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FromAgent {
    /// The first message: the helper runs, with this pid.
    Hello { pid: Pid },
    /// The answer to the [`ToAgent::Call`] `id`.
    Reply { id: u64, reply: Reply },
    /// A line for CRIU's log, from code running in the helper (CRIU logs it as its own).
    Log { level: u32, msg: String },
}

/// An answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    Probe(ProbeReply),
    Driver(DriverReply),
    Gpus(Result<Vec<WireGpu>, String>),
    Nvml(Result<WireSnapshot, String>),
    /// The call panicked in the helper.
    Panicked,
}

/// The driver probe's outcome (see [`crate::backend::driver::probe_driver`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProbeReply {
    Supported { version: i32, init: Option<u32> },
    Unsupported(String),
    Error(String),
}

/// [`GpuInfo`] on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireGpu {
    pub ordinal: u32,
    pub uuid: [u8; 16],
    pub name: String,
    pub memory_bytes: u64,
}

impl From<&GpuInfo> for WireGpu {
    fn from(g: &GpuInfo) -> Self {
        WireGpu {
            ordinal: g.ordinal,
            uuid: g.uuid.0,
            name: g.name.clone(),
            memory_bytes: g.memory_bytes,
        }
    }
}

impl From<WireGpu> for GpuInfo {
    fn from(g: WireGpu) -> Self {
        GpuInfo {
            ordinal: g.ordinal,
            uuid: abi::GpuUuid(g.uuid),
            name: g.name,
            memory_bytes: g.memory_bytes,
        }
    }
}

/// One GPU of a [`WireSnapshot`]: UUID, total and free bytes, processes (pid, bytes used).
pub type WireGpuMemory = ([u8; 16], u64, u64, Vec<(u32, Option<u64>)>);

/// [`Snapshot`] on the wire: per GPU (UUID, total, free, processes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireSnapshot {
    pub gpus: Vec<WireGpuMemory>,
}

impl From<&Snapshot> for WireSnapshot {
    fn from(s: &Snapshot) -> Self {
        WireSnapshot {
            gpus: s
                .gpus
                .iter()
                .map(|g| (g.uuid.0, g.total, g.free, g.processes.clone()))
                .collect(),
        }
    }
}

impl From<WireSnapshot> for Snapshot {
    fn from(s: WireSnapshot) -> Self {
        Snapshot {
            gpus: s
                .gpus
                .into_iter()
                .map(|(uuid, total, free, processes)| GpuMemory {
                    uuid: abi::GpuUuid(uuid),
                    total,
                    free,
                    processes,
                })
                .collect(),
        }
    }
}

/// Which CRIU operation the guardian watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GuardStage {
    Dump,
    Restore,
}

/// How the guardian drives a task itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GuardBackend {
    /// The driver API, from the helper's own copy of `libcuda.so.1`.
    DriverApi,
    /// The `cuda-checkpoint` utility at `program`.
    Cli { program: PathBuf, device_map: bool },
}

/// The guardian's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuardConfig {
    pub stage: GuardStage,
    pub backend: GuardBackend,
    /// The per-operation timeout, ms (`None`: none; the guardian then uses its own bound).
    pub timeout_ms: Option<u64>,
    /// The copy rate (bytes/s) deadlines assume.
    pub copy_rate: f64,
    /// Restore: kill the tasks that survive CRIU (`true`, `on-restore-failure=kill`) or finish
    /// their restore (`false`, `leave`).
    pub kill_on_restore_failure: bool,
}

/// A task the guardian may have to put back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tracked {
    pub pid: Pid,
    /// The CUDA state to drive it to (`CUprocessState`): its state when the dump started.
    pub target: u32,
    /// Its GPU memory, bytes, when known (sizes the guardian's deadlines).
    pub bytes: Option<u64>,
    /// Restore: the GPU pairs (old UUID, new UUID) its restore remaps.
    pub pairs: Vec<([u8; 16], [u8; 16])>,
}

/// How the plugin's work ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FinishMode {
    /// Everything is as it should be: exit now.
    Done,
    /// The dump succeeded and CRIU is about to kill the tasks, or leave them stopped. CRIU may
    /// still resume them instead (CRIU 4.1 and 4.2 do when a post-dump action script fails after
    /// the plugin's last hook), so: once CRIU has exited, put back every tracked task that is
    /// alive and neither stopped nor dying.
    WatchTasks,
}

/// Encodes a message.
#[must_use]
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // Serialising these plain data types cannot fail (no maps with non-string keys, no
    // failing Serialize impls); an empty message would be reported by the receiver.
    serde_json::to_vec(msg).unwrap_or_default()
}

/// Decodes a message.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, String> {
    serde_json::from_slice(bytes)
        .map_err(|e| format!("undecodable message from the other side: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_call() -> impl Strategy<Value = Call> {
        prop_oneof![
            any::<bool>().prop_map(|call_init| Call::Probe { call_init }),
            Just(Call::Gpus),
            Just(Call::Nvml),
            any::<i32>().prop_map(|p| Call::Driver(DriverCall::State(p))),
            (any::<i32>(), any::<u32>())
                .prop_map(|(pid, timeout_ms)| Call::Driver(DriverCall::Lock { pid, timeout_ms })),
            (
                any::<i32>(),
                proptest::collection::vec(any::<([u8; 16], [u8; 16])>(), 0..4)
            )
                .prop_map(|(pid, pairs)| Call::Driver(DriverCall::Restore { pid, pairs })),
        ]
    }

    proptest! {
        #[test]
        fn calls_survive_the_wire(id in any::<u64>(), d in any::<Option<u64>>(), call in arb_call()) {
            let m = ToAgent::Call { id, deadline_ms: d, call };
            prop_assert_eq!(decode::<ToAgent>(&encode(&m)).unwrap(), m);
        }

        #[test]
        fn replies_survive_the_wire(
            id in any::<u64>(),
            tid in any::<Result<i32, u32>>(),
            name in ".{0,40}",
            procs in proptest::collection::vec(any::<(u32, Option<u64>)>(), 0..5),
        ) {
            for reply in [
                Reply::Driver(DriverReply::Tid(tid)),
                Reply::Gpus(Ok(vec![WireGpu { ordinal: 1, uuid: [3; 16], name: name.clone(), memory_bytes: u64::MAX }])),
                Reply::Gpus(Err(name.clone())),
                Reply::Nvml(Ok(WireSnapshot { gpus: vec![([9; 16], 1 << 40, 5, procs.clone())] })),
                Reply::Probe(ProbeReply::Supported { version: 13000, init: Some(0) }),
                Reply::Panicked,
            ] {
                let m = FromAgent::Reply { id, reply };
                prop_assert_eq!(decode::<FromAgent>(&encode(&m)).unwrap(), m);
            }
        }

        #[test]
        fn garbage_is_an_error_not_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode::<ToAgent>(&bytes);
            let _ = decode::<FromAgent>(&bytes);
        }
    }

    #[test]
    fn snapshots_and_gpus_convert_both_ways() {
        let s = Snapshot {
            gpus: vec![GpuMemory {
                uuid: abi::GpuUuid([7; 16]),
                total: 80 << 30,
                free: 1,
                processes: vec![(5, Some(3)), (6, None)],
            }],
        };
        assert_eq!(Snapshot::from(WireSnapshot::from(&s)), s);
        let g = GpuInfo {
            ordinal: 3,
            uuid: abi::GpuUuid([1; 16]),
            name: "H200".into(),
            memory_bytes: 141 << 30,
        };
        assert_eq!(GpuInfo::from(WireGpu::from(&g)), g);
        assert!(decode::<ToAgent>(b"").unwrap_err().contains("undecodable"));
    }
}
