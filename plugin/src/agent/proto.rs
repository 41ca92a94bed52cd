//! The messages between the plugin in CRIU and its helper process, one message per
//! `SOCK_SEQPACKET` record, in [postcard]'s compact binary form, derived with serde. Both ends
//! are the same build of the same library (the helper is a fork of CRIU that never execs), so
//! there is no version skew to negotiate and the protocol carries no version number: the
//! helper's [`FromAgent::Hello`] is the whole handshake, and a message that does not decode is
//! a bug, reported as such ([`DecodeError`]).
//!
//! # The format
//!
//! Postcard's (its specification is the "postcard wire format" of its documentation): an enum
//! is its variant's index (from 0 in declaration order) and then the variant's fields; a struct
//! or tuple is its fields in order; unsigned integers are varints (7 bits a byte, low first),
//! signed ones zigzag varints; an `f64` is its 8 bytes little-endian (a NaN keeps its bits); a
//! `bool` is one byte, 0 or 1; `Option` is 0 or 1 and the value, `Result` 0 (`Ok`) or 1 (`Err`)
//! and the value; a string, a list and a path (its bytes, not necessarily UTF-8) are a varint
//! length and the contents; a UUID is its 16 bytes; a `Duration`
//! is its seconds and nanoseconds.
//!
//! [`decode`] refuses a message longer than [`MAX_LEN`] (the channel's own limit), one that
//! ends early, has bytes left over or is not the one encoding [`encode`] gives its value (a
//! varint with needless continuation bytes, a `Duration` with 10^9 nanoseconds or more), and
//! never panics on any input (the tests feed it arbitrary and mutated bytes). It allocates in
//! proportion to the message: postcard reads lengths from a slice, a string's bytes must be
//! there, and a list whose length is more than the bytes left gets no room reserved up front.
//!
//! [postcard]: https://docs.rs/postcard

use crate::backend::driver::{DriverCall, DriverReply};
use crate::inventory::GpuInfo;
use crate::nvml::{GpuMemory, Snapshot};
use crate::task::Pid;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// CRIU → helper.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToAgent {
    /// Run `call`; the answer is a [`FromAgent::Reply`] with the same `id`. `deadline` is how
    /// long CRIU waits for it (the guardian waits that long for a call in flight when CRIU dies).
    Call {
        id: u64,
        deadline: Option<Duration>,
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
    /// A custom-storage checkpoint or restore (the copier's work, see [`crate::cstore`]).
    Custom(CustomJob),
}

/// One task's custom-storage operation, as the copier carries it out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CustomJob {
    /// Checkpoint (true) or restore (false).
    pub checkpoint: bool,
    /// The task's pid now.
    pub pid: Pid,
    /// The task's pid as the image names it (file names, headers).
    pub key: Pid,
    /// The dump's id, in every file's header.
    pub dump_id: [u8; 16],
    /// Restore: GPU pairs (old UUID, new UUID); empty: every GPU maps to itself.
    pub pairs: Vec<([u8; 16], [u8; 16])>,
    /// Restore: the task's files in order (GPU at dump, bytes), from its task image.
    pub files: Vec<([u8; 16], u64)>,
}

/// One GPU of a finished custom-storage operation, in file order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CustomGpu {
    /// The GPU at dump (the file's).
    pub uuid: [u8; 16],
    /// Device bytes moved.
    pub bytes: u64,
    /// Bytes of chunks written to (or read from) the file.
    pub data: u64,
    /// Bytes of uniform chunks recorded, not written.
    pub fills: u64,
    /// How long the GPU's copy took, in microseconds.
    pub micros: u64,
    /// Whether the file was written (read) with `O_DIRECT`.
    pub direct: bool,
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
    /// A custom-storage operation's outcome, per GPU in file order.
    Custom(Result<Vec<CustomGpu>, String>),
}

/// The driver probe's outcome (see [`crate::backend::driver::probe_driver`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProbeReply {
    Supported {
        version: i32,
        init: Option<u32>,
        /// The driver has custom storage (`cuCheckpointOperationComplete` at 13040).
        custom_storage: bool,
    },
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

/// One GPU of a [`WireSnapshot`] ([`GpuMemory`] on the wire).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireGpuMemory {
    pub uuid: [u8; 16],
    /// Total and free bytes.
    pub total: u64,
    pub free: u64,
    /// Processes: host pid, bytes used.
    pub processes: Vec<(u32, Option<u64>)>,
    /// MIG mode (`None`: unknown).
    pub mig: Option<bool>,
}

/// [`Snapshot`] on the wire: per GPU (UUID, total, free, processes, MIG mode).
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
                .map(|g| WireGpuMemory {
                    uuid: g.uuid.0,
                    total: g.total,
                    free: g.free,
                    processes: g.processes.clone(),
                    mig: g.mig,
                })
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
                .map(|g| GpuMemory {
                    uuid: abi::GpuUuid(g.uuid),
                    total: g.total,
                    free: g.free,
                    processes: g.processes,
                    mig: g.mig,
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
    Cli {
        #[serde(with = "path_bytes")]
        program: PathBuf,
        device_map: bool,
    },
}

impl GuardBackend {
    /// Which backend it is.
    #[must_use]
    pub fn kind(&self) -> crate::backend::BackendKind {
        match self {
            GuardBackend::DriverApi => crate::backend::BackendKind::DriverApi,
            GuardBackend::Cli { .. } => crate::backend::BackendKind::CudaCheckpoint,
        }
    }
}

/// The guardian's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuardConfig {
    pub stage: GuardStage,
    pub backend: GuardBackend,
    /// The per-operation timeout (`None`: none; the guardian then uses its own bound).
    pub timeout: Option<Duration>,
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

/// The longest message (bytes) [`decode`] takes: the channel's own limit
/// ([`crate::ffi::agent::MAX_MESSAGE`]), which also bounds every string, path and list in one.
pub const MAX_LEN: usize = crate::ffi::agent::MAX_MESSAGE;

/// A message of the protocol (what [`encode`] and [`decode`] take): the two directions.
pub trait Wire: Serialize + for<'de> Deserialize<'de> {
    /// The type's name, for [`DecodeError`].
    const NAME: &'static str;
}

impl Wire for ToAgent {
    const NAME: &'static str = "ToAgent";
}

impl Wire for FromAgent {
    const NAME: &'static str = "FromAgent";
}

/// Why a message did not decode. `what` is the message's type ([`Wire::NAME`]); `at` is how
/// many of its bytes decoding had read when it stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The message is longer than [`MAX_LEN`].
    #[error(
        "undecodable message from the other side: a {what} of {len} bytes, over the limit of \
         {MAX_LEN}"
    )]
    TooLong { what: &'static str, len: usize },
    /// The message ends inside a value.
    #[error(
        "undecodable message from the other side: the {what} ends inside a value, at byte {at}"
    )]
    Truncated { what: &'static str, at: usize },
    /// A value that is not one (`error`: postcard's reason, such as a bool that is neither 0
    /// nor 1, a string that is not UTF-8, or an enum variant the type does not have).
    #[error(
        "undecodable message from the other side: the {what} has {} at byte {at}",
        malformed(.error)
    )]
    Malformed {
        what: &'static str,
        at: usize,
        error: postcard::Error,
    },
    /// The message goes on after its last value.
    #[error(
        "undecodable message from the other side: {count} bytes left over after the {what}'s \
         {at}"
    )]
    TrailingBytes {
        what: &'static str,
        at: usize,
        count: usize,
    },
    /// The message decodes, but is not the encoding [`encode`] gives its value (which the
    /// other side, the same build, would have sent): it differs from byte `at` on.
    #[error(
        "undecodable message from the other side: the {what} is not in its one encoding (from \
         byte {at} on)"
    )]
    NotCanonical { what: &'static str, at: usize },
}

/// What [`DecodeError::Malformed`] found, in words.
fn malformed(e: &postcard::Error) -> String {
    use postcard::Error as E;
    match e {
        E::DeserializeBadVarint => "a number longer than its type".into(),
        E::DeserializeBadBool => "a bool that is neither 0 nor 1".into(),
        E::DeserializeBadUtf8 => "a string that is not UTF-8".into(),
        E::DeserializeBadOption => "an Option tag that is neither 0 nor 1".into(),
        E::DeserializeBadEnum => "an enum variant above u32::MAX".into(),
        // Serde's derived code reports a variant index the enum does not have (and a
        // `Duration` whose seconds overflow) through a custom error, whose text postcard drops.
        E::SerdeDeCustom => "a value out of range (an enum variant its type does not have)".into(),
        e => format!("a value that is not one ({e})"),
    }
}

/// Encodes a message.
#[must_use]
pub fn encode<T: Wire>(msg: &T) -> Vec<u8> {
    // Postcard fails to write into a Vec only for a sequence of unknown length or a value whose
    // `Serialize` fails; no type here has either (the tests encode every variant). Were one
    // added, the empty message would reach the other side as undecodable, not be misread.
    postcard::to_stdvec(msg).unwrap_or_default()
}

/// Decodes a message: all of `bytes`, and nothing more, in the encoding [`encode`] gives.
pub fn decode<T: Wire>(bytes: &[u8]) -> Result<T, DecodeError> {
    let what = T::NAME;
    if bytes.len() > MAX_LEN {
        return Err(DecodeError::TooLong {
            what,
            len: bytes.len(),
        });
    }
    let mut de = postcard::Deserializer::from_bytes(bytes);
    let msg = T::deserialize(&mut de);
    // The slice flavour's finalize only hands back what is left; it cannot fail.
    let left = de.finalize().map_or(0, <[u8]>::len);
    let at = bytes.len().saturating_sub(left);
    let msg = match msg {
        Ok(m) => m,
        Err(postcard::Error::DeserializeUnexpectedEnd) => {
            return Err(DecodeError::Truncated { what, at });
        }
        Err(error) => return Err(DecodeError::Malformed { what, at, error }),
    };
    if left > 0 {
        return Err(DecodeError::TrailingBytes {
            what,
            at,
            count: left,
        });
    }
    // Postcard takes a varint with needless continuation bytes, and serde a `Duration` with a
    // second's worth of nanoseconds or more: one value, several encodings. Only the one the
    // other side writes is taken.
    let again = encode(&msg);
    if again != bytes {
        let at = again
            .iter()
            .zip(bytes)
            .position(|(a, b)| a != b)
            .unwrap_or(again.len().min(bytes.len()));
        return Err(DecodeError::NotCanonical { what, at });
    }
    Ok(msg)
}

/// A path as its bytes (serde's own `PathBuf` refuses one that is not UTF-8): a varint length
/// and the bytes, as a string.
mod path_bytes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::path::{Path, PathBuf};

    pub(super) fn serialize<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
        p.as_os_str().as_bytes().serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
        Vec::<u8>::deserialize(d).map(|b| PathBuf::from(std::ffi::OsString::from_vec(b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::os::unix::ffi::OsStringExt;

    fn uuid(b: u8) -> [u8; 16] {
        [b; 16]
    }

    /// A message of every variant of [`ToAgent`], and of every type it holds.
    fn every_to_agent() -> Vec<ToAgent> {
        let calls = vec![
            Call::Probe { call_init: false },
            Call::Probe { call_init: true },
            Call::Gpus,
            Call::Nvml,
            Call::Custom(CustomJob {
                checkpoint: true,
                pid: 7,
                key: 7,
                dump_id: uuid(9),
                pairs: vec![],
                files: vec![],
            }),
            Call::Custom(CustomJob {
                checkpoint: false,
                pid: i32::MAX,
                key: 1,
                dump_id: uuid(0),
                pairs: vec![(uuid(1), uuid(2))],
                files: vec![(uuid(1), 80 << 30), (uuid(3), 0)],
            }),
            Call::Driver(DriverCall::Init),
            Call::Driver(DriverCall::RestoreTid(-1)),
            Call::Driver(DriverCall::State(i32::MAX)),
            Call::Driver(DriverCall::Lock {
                pid: 7,
                timeout_ms: u32::MAX,
            }),
            Call::Driver(DriverCall::Checkpoint(i32::MIN)),
            Call::Driver(DriverCall::Restore {
                pid: 8,
                pairs: vec![],
            }),
            Call::Driver(DriverCall::Restore {
                pid: 8,
                pairs: vec![(uuid(1), uuid(2)), (uuid(3), uuid(0xff))],
            }),
            Call::Driver(DriverCall::Unlock(9)),
        ];
        let mut all: Vec<ToAgent> = calls
            .into_iter()
            .zip(
                [
                    None,
                    Some(Duration::ZERO),
                    Some(Duration::from_nanos(u64::MAX)),
                ]
                .into_iter()
                .cycle(),
            )
            .enumerate()
            .map(|(i, (call, deadline))| ToAgent::Call {
                id: i as u64,
                deadline,
                call,
            })
            .collect();
        for (stage, backend, timeout, copy_rate, kill) in [
            (GuardStage::Dump, GuardBackend::DriverApi, None, 0.0, false),
            (
                GuardStage::Restore,
                GuardBackend::Cli {
                    program: PathBuf::from("/usr/bin/cuda-checkpoint"),
                    device_map: true,
                },
                Some(Duration::from_secs(30)),
                1.5e9,
                true,
            ),
            (
                GuardStage::Dump,
                GuardBackend::Cli {
                    // Not UTF-8: a path is bytes.
                    program: PathBuf::from(std::ffi::OsString::from_vec(vec![b'/', 0xff, 0xfe])),
                    device_map: false,
                },
                Some(Duration::ZERO),
                f64::INFINITY,
                false,
            ),
        ] {
            all.push(ToAgent::Configure(GuardConfig {
                stage,
                backend,
                timeout,
                copy_rate,
                kill_on_restore_failure: kill,
            }));
        }
        all.extend([
            ToAgent::Track(Tracked {
                pid: 42,
                target: 0,
                bytes: None,
                pairs: vec![],
            }),
            ToAgent::Track(Tracked {
                pid: 43,
                target: 2,
                bytes: Some(80 << 30),
                pairs: vec![(uuid(4), uuid(5))],
            }),
            ToAgent::Intent {
                pid: 42,
                op: "checkpoint".into(),
            },
            ToAgent::Intent {
                pid: 42,
                op: String::new(),
            },
            ToAgent::Untrack { pid: 42 },
            ToAgent::Abandon { id: u64::MAX },
            ToAgent::Finish(FinishMode::Done),
            ToAgent::Finish(FinishMode::WatchTasks),
        ]);
        all
    }

    /// A message of every variant of [`FromAgent`], and of every type it holds.
    fn every_from_agent() -> Vec<FromAgent> {
        let replies = vec![
            Reply::Probe(ProbeReply::Supported {
                version: 12_080,
                init: None,
                custom_storage: false,
            }),
            Reply::Probe(ProbeReply::Supported {
                version: -1,
                init: Some(100),
                custom_storage: true,
            }),
            Reply::Probe(ProbeReply::Unsupported("no libcuda.so.1".into())),
            Reply::Probe(ProbeReply::Error("cuDriverGetVersion failed: 3".into())),
            Reply::Driver(DriverReply::Tid(Ok(1234))),
            Reply::Driver(DriverReply::Tid(Err(3))),
            Reply::Driver(DriverReply::State(Ok(1))),
            Reply::Driver(DriverReply::State(Err(u32::MAX))),
            Reply::Driver(DriverReply::Code(0)),
            Reply::Gpus(Ok(vec![])),
            Reply::Gpus(Ok(vec![
                WireGpu {
                    ordinal: 0,
                    uuid: uuid(1),
                    name: "NVIDIA H200".into(),
                    memory_bytes: 141 << 30,
                },
                WireGpu {
                    ordinal: 1,
                    uuid: uuid(2),
                    name: "Ünïcödé ✓".into(),
                    memory_bytes: u64::MAX,
                },
            ])),
            Reply::Gpus(Err("cuInit failed".into())),
            Reply::Nvml(Ok(WireSnapshot { gpus: vec![] })),
            Reply::Nvml(Ok(WireSnapshot {
                gpus: vec![
                    WireGpuMemory {
                        uuid: uuid(1),
                        total: 80 << 30,
                        free: 1 << 30,
                        processes: vec![(100, Some(5)), (101, None)],
                        mig: Some(true),
                    },
                    WireGpuMemory {
                        uuid: uuid(2),
                        total: 0,
                        free: 0,
                        processes: vec![],
                        mig: None,
                    },
                ],
            })),
            Reply::Nvml(Err("NVML not found".into())),
            Reply::Panicked,
            Reply::Custom(Ok(vec![CustomGpu {
                uuid: uuid(3),
                bytes: 80 << 30,
                data: 40 << 30,
                fills: 40 << 30,
                micros: u64::MAX,
                direct: true,
            }])),
            Reply::Custom(Ok(vec![])),
            Reply::Custom(Err("cuda-cs-7-0.img: No space left on device".into())),
        ];
        let mut all = vec![FromAgent::Hello { pid: 77 }];
        all.extend(
            replies
                .into_iter()
                .enumerate()
                .map(|(i, reply)| FromAgent::Reply {
                    id: i as u64,
                    reply,
                }),
        );
        all.extend([
            FromAgent::Log {
                level: 3,
                msg: "a line".into(),
            },
            FromAgent::Log {
                level: 0,
                msg: String::new(),
            },
        ]);
        all
    }

    #[test]
    fn every_variant_survives_the_wire() {
        for m in every_to_agent() {
            assert_eq!(decode::<ToAgent>(&encode(&m)), Ok(m.clone()), "{m:?}");
        }
        for m in every_from_agent() {
            assert_eq!(decode::<FromAgent>(&encode(&m)), Ok(m.clone()), "{m:?}");
        }
        // Every tag of the top-level enums is used.
        let tags = |v: Vec<Vec<u8>>| {
            let mut t: Vec<u8> = v.iter().map(|b| b[0]).collect();
            t.dedup();
            t
        };
        assert_eq!(
            tags(every_to_agent().iter().map(encode).collect()),
            (0..7).collect::<Vec<u8>>()
        );
        assert_eq!(
            tags(every_from_agent().iter().map(encode).collect()),
            (0..3).collect::<Vec<u8>>()
        );
    }

    #[test]
    fn the_format_is_as_documented() {
        // Variant 5, the id 0x0102 as a varint (0x82: the low 7 bits and "more"; then 0x02).
        assert_eq!(encode(&ToAgent::Abandon { id: 0x0102 }), [5, 0x82, 0x02]);
        // Variant 3, the pid -2 as a zigzag varint (3), the string's length and bytes.
        assert_eq!(
            encode(&ToAgent::Intent {
                pid: -2,
                op: "lock".into()
            }),
            [3, 3, 4, b'l', b'o', b'c', b'k']
        );
        // Reply, id 1, Reply::Driver, DriverReply::Tid, Err, 3.
        assert_eq!(
            encode(&FromAgent::Reply {
                id: 1,
                reply: Reply::Driver(DriverReply::Tid(Err(3)))
            }),
            [1, 1, 1, 0, 1, 3]
        );
        // Call, id 2, no deadline, Call::Probe, true.
        assert_eq!(
            encode(&ToAgent::Call {
                id: 2,
                deadline: None,
                call: Call::Probe { call_init: true }
            }),
            [0, 2, 0, 0, 1]
        );
        // A deadline of 30 s and 5 ns: Some, seconds, nanoseconds; Call::Gpus.
        assert_eq!(
            encode(&ToAgent::Call {
                id: 0,
                deadline: Some(Duration::new(30, 5)),
                call: Call::Gpus
            }),
            [0, 0, 1, 30, 5, 2]
        );
        // A path is its bytes, UTF-8 or not.
        assert_eq!(
            encode(&ToAgent::Configure(GuardConfig {
                stage: GuardStage::Restore,
                backend: GuardBackend::Cli {
                    program: PathBuf::from(std::ffi::OsString::from_vec(vec![b'/', 0xff])),
                    device_map: true
                },
                timeout: None,
                copy_rate: 1.0,
                kill_on_restore_failure: false
            })),
            [1, 1, 1, 2, b'/', 0xff, 1, 0, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0]
        );
    }

    #[test]
    fn a_nan_copy_rate_keeps_its_bits() {
        let nan = f64::from_bits(0x7ff8_0000_dead_beef);
        let m = ToAgent::Configure(GuardConfig {
            stage: GuardStage::Dump,
            backend: GuardBackend::DriverApi,
            timeout: None,
            copy_rate: nan,
            kill_on_restore_failure: false,
        });
        let Ok(ToAgent::Configure(c)) = decode::<ToAgent>(&encode(&m)) else {
            panic!("did not decode");
        };
        assert_eq!(c.copy_rate.to_bits(), nan.to_bits());
    }

    #[test]
    fn malformed_messages_say_what_is_wrong() {
        use postcard::Error as P;
        use DecodeError::*;
        let (to, from) = ("ToAgent", "FromAgent");
        assert_eq!(decode::<ToAgent>(b""), Err(Truncated { what: to, at: 0 }));
        // ToAgent has no variant 7, Reply no variant 9.
        assert_eq!(
            decode::<ToAgent>(&[7]),
            Err(Malformed {
                what: to,
                at: 1,
                error: P::SerdeDeCustom
            })
        );
        assert_eq!(
            decode::<FromAgent>(&[1, 0, 9]),
            Err(Malformed {
                what: from,
                at: 3,
                error: P::SerdeDeCustom
            })
        );
        // Abandon with an id whose varint does not end.
        assert_eq!(
            decode::<ToAgent>(&[5, 0x80, 0x80]),
            Err(Truncated { what: to, at: 3 })
        );
        // ... or is longer than a u64's.
        assert_eq!(
            decode::<ToAgent>(&[5, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]),
            Err(Malformed {
                what: to,
                at: 11,
                error: P::DeserializeBadVarint
            })
        );
        assert_eq!(
            decode::<ToAgent>(&[6, 0, 0]),
            Err(TrailingBytes {
                what: to,
                at: 2,
                count: 1
            })
        );
        // Probe { call_init: 2 }.
        assert_eq!(
            decode::<ToAgent>(&[0, 0, 0, 0, 2]),
            Err(Malformed {
                what: to,
                at: 5,
                error: P::DeserializeBadBool
            })
        );
        // Intent with a string that is not UTF-8.
        assert_eq!(
            decode::<ToAgent>(&[3, 2, 2, 0xc3, 0x28]),
            Err(Malformed {
                what: to,
                at: 5,
                error: P::DeserializeBadUtf8
            })
        );
        // Intent with a string of 4 GiB in a message of 8 bytes.
        assert_eq!(
            decode::<ToAgent>(&[3, 2, 0xff, 0xff, 0xff, 0xff, 0x0f, b'x']),
            Err(Truncated { what: to, at: 7 })
        );
        // A list of a million GPUs in a few bytes (nothing is reserved for them).
        let mut m = vec![1, 0, 2, 0];
        m.extend_from_slice(&[0xc0, 0x84, 0x3d]);
        assert_eq!(
            decode::<FromAgent>(&m),
            Err(Truncated { what: from, at: 7 })
        );
        // Finish(Done) with a needless continuation byte in its variant, and a deadline of 0 s
        // and 10^9 ns (serde's Duration takes it as 1 s): values, but not as encode writes them.
        assert_eq!(
            decode::<ToAgent>(&[6, 0x80, 0]),
            Err(NotCanonical { what: to, at: 1 })
        );
        assert_eq!(
            decode::<ToAgent>(&[0, 0, 1, 0, 0x80, 0x94, 0xeb, 0xdc, 0x03, 2]),
            Err(NotCanonical { what: to, at: 3 })
        );
        // A message over the channel's limit is not read at all.
        assert_eq!(
            decode::<ToAgent>(&vec![0; MAX_LEN + 1]),
            Err(TooLong {
                what: to,
                len: MAX_LEN + 1
            })
        );
        let e = decode::<ToAgent>(&[9]).unwrap_err().to_string();
        assert!(
            e.contains("undecodable") && e.contains("ToAgent") && e.contains("enum variant"),
            "{e}"
        );
        let e = decode::<ToAgent>(&[0, 0, 0, 0, 2]).unwrap_err().to_string();
        assert!(e.contains("bool") && e.contains("byte 5"), "{e}");
    }

    #[test]
    fn a_length_at_the_limit_is_taken() {
        let msg = "x".repeat(MAX_LEN - 16);
        let m = FromAgent::Log { level: 1, msg };
        assert_eq!(decode::<FromAgent>(&encode(&m)), Ok(m));
    }

    fn arb_uuid() -> impl Strategy<Value = [u8; 16]> {
        any::<[u8; 16]>()
    }

    fn arb_driver_call() -> impl Strategy<Value = DriverCall> {
        prop_oneof![
            Just(DriverCall::Init),
            any::<i32>().prop_map(DriverCall::RestoreTid),
            any::<i32>().prop_map(DriverCall::State),
            (any::<i32>(), any::<u32>())
                .prop_map(|(pid, timeout_ms)| DriverCall::Lock { pid, timeout_ms }),
            any::<i32>().prop_map(DriverCall::Checkpoint),
            (
                any::<i32>(),
                proptest::collection::vec((arb_uuid(), arb_uuid()), 0..4)
            )
                .prop_map(|(pid, pairs)| DriverCall::Restore { pid, pairs }),
            any::<i32>().prop_map(DriverCall::Unlock),
        ]
    }

    fn arb_call() -> impl Strategy<Value = Call> {
        prop_oneof![
            any::<bool>().prop_map(|call_init| Call::Probe { call_init }),
            Just(Call::Gpus),
            Just(Call::Nvml),
            arb_driver_call().prop_map(Call::Driver),
            (
                any::<bool>(),
                any::<i32>(),
                any::<i32>(),
                arb_uuid(),
                proptest::collection::vec((arb_uuid(), arb_uuid()), 0..3),
                proptest::collection::vec((arb_uuid(), any::<u64>()), 0..3),
            )
                .prop_map(|(checkpoint, pid, key, dump_id, pairs, files)| {
                    Call::Custom(CustomJob {
                        checkpoint,
                        pid,
                        key,
                        dump_id,
                        pairs,
                        files,
                    })
                }),
        ]
    }

    fn arb_to_agent() -> impl Strategy<Value = ToAgent> {
        let backend = prop_oneof![
            Just(GuardBackend::DriverApi),
            (proptest::collection::vec(any::<u8>(), 0..24), any::<bool>()).prop_map(
                |(p, device_map)| GuardBackend::Cli {
                    program: PathBuf::from(std::ffi::OsString::from_vec(p)),
                    device_map,
                }
            ),
        ];
        let config = (
            any::<bool>(),
            backend,
            any::<Option<u64>>().prop_map(|t| t.map(Duration::from_nanos)),
            // NaN != NaN; a_nan_copy_rate_keeps_its_bits covers it.
            any::<f64>().prop_filter("not NaN", |x| !x.is_nan()),
            any::<bool>(),
        )
            .prop_map(|(restore, backend, timeout, copy_rate, kill)| GuardConfig {
                stage: if restore {
                    GuardStage::Restore
                } else {
                    GuardStage::Dump
                },
                backend,
                timeout,
                copy_rate,
                kill_on_restore_failure: kill,
            });
        let tracked = (
            any::<i32>(),
            any::<u32>(),
            any::<Option<u64>>(),
            proptest::collection::vec((arb_uuid(), arb_uuid()), 0..4),
        )
            .prop_map(|(pid, target, bytes, pairs)| Tracked {
                pid,
                target,
                bytes,
                pairs,
            });
        prop_oneof![
            (
                any::<u64>(),
                any::<Option<u64>>().prop_map(|d| d.map(Duration::from_nanos)),
                arb_call()
            )
                .prop_map(|(id, deadline, call)| { ToAgent::Call { id, deadline, call } }),
            config.prop_map(ToAgent::Configure),
            tracked.prop_map(ToAgent::Track),
            (any::<i32>(), any::<String>()).prop_map(|(pid, op)| ToAgent::Intent { pid, op }),
            any::<i32>().prop_map(|pid| ToAgent::Untrack { pid }),
            any::<u64>().prop_map(|id| ToAgent::Abandon { id }),
            any::<bool>().prop_map(|w| ToAgent::Finish(if w {
                FinishMode::WatchTasks
            } else {
                FinishMode::Done
            })),
        ]
    }

    fn arb_from_agent() -> impl Strategy<Value = FromAgent> {
        let driver = prop_oneof![
            any::<Result<i32, u32>>().prop_map(DriverReply::Tid),
            any::<Result<u32, u32>>().prop_map(DriverReply::State),
            any::<u32>().prop_map(DriverReply::Code),
        ];
        let probe = prop_oneof![
            (any::<i32>(), any::<Option<u32>>(), any::<bool>()).prop_map(
                |(version, init, custom_storage)| ProbeReply::Supported {
                    version,
                    init,
                    custom_storage
                }
            ),
            any::<String>().prop_map(ProbeReply::Unsupported),
            any::<String>().prop_map(ProbeReply::Error),
        ];
        let gpu = (any::<u32>(), arb_uuid(), any::<String>(), any::<u64>()).prop_map(
            |(ordinal, uuid, name, memory_bytes)| WireGpu {
                ordinal,
                uuid,
                name,
                memory_bytes,
            },
        );
        let snapshot = proptest::collection::vec(
            (
                arb_uuid(),
                any::<u64>(),
                any::<u64>(),
                proptest::collection::vec(any::<(u32, Option<u64>)>(), 0..4),
                any::<Option<bool>>(),
            )
                .prop_map(|(uuid, total, free, processes, mig)| WireGpuMemory {
                    uuid,
                    total,
                    free,
                    processes,
                    mig,
                }),
            0..4,
        )
        .prop_map(|gpus| WireSnapshot { gpus });
        let reply = prop_oneof![
            probe.prop_map(Reply::Probe),
            driver.prop_map(Reply::Driver),
            proptest::result::maybe_err(proptest::collection::vec(gpu, 0..4), any::<String>())
                .prop_map(Reply::Gpus),
            proptest::result::maybe_err(snapshot, any::<String>()).prop_map(Reply::Nvml),
            Just(Reply::Panicked),
            proptest::result::maybe_err(
                proptest::collection::vec(
                    (
                        arb_uuid(),
                        any::<u64>(),
                        any::<u64>(),
                        any::<u64>(),
                        any::<u64>(),
                        any::<bool>()
                    )
                        .prop_map(
                            |(uuid, bytes, data, fills, micros, direct)| CustomGpu {
                                uuid,
                                bytes,
                                data,
                                fills,
                                micros,
                                direct
                            }
                        ),
                    0..3
                ),
                any::<String>()
            )
            .prop_map(Reply::Custom),
        ];
        prop_oneof![
            any::<i32>().prop_map(|pid| FromAgent::Hello { pid }),
            (any::<u64>(), reply).prop_map(|(id, reply)| FromAgent::Reply { id, reply }),
            (any::<u32>(), any::<String>()).prop_map(|(level, msg)| FromAgent::Log { level, msg }),
        ]
    }

    /// `bytes` with some of them changed, cut or added, as chosen by `edits`.
    fn mutated(bytes: &[u8], edits: &[(usize, u8, u8)]) -> Vec<u8> {
        let mut v = bytes.to_vec();
        for &(i, kind, b) in edits {
            let i = i % (v.len() + 1);
            match kind % 4 {
                0 if i < v.len() => v[i] ^= b | 1,
                1 => v.truncate(i),
                2 => v.insert(i, b),
                _ if i < v.len() => v[i] = b,
                _ => v.push(b),
            }
        }
        v
    }

    fn cut_and_extended<T: Wire + std::fmt::Debug>(
        m: &T,
        extra: usize,
    ) -> Result<(), TestCaseError> {
        let bytes = encode(m);
        for n in 0..bytes.len() {
            let cut = decode::<T>(&bytes[..n]);
            prop_assert!(
                matches!(cut, Err(DecodeError::Truncated { .. })),
                "{n} bytes of {bytes:?}: {cut:?}"
            );
        }
        let mut long = bytes.clone();
        long.resize(bytes.len() + extra, 0);
        prop_assert_eq!(
            decode::<T>(&long).err(),
            Some(DecodeError::TrailingBytes {
                what: T::NAME,
                at: bytes.len(),
                count: extra
            })
        );
        Ok(())
    }

    proptest! {
        #[test]
        fn to_agent_survives_the_wire(m in arb_to_agent()) {
            prop_assert_eq!(decode::<ToAgent>(&encode(&m)), Ok(m));
        }

        #[test]
        fn from_agent_survives_the_wire(m in arb_from_agent()) {
            prop_assert_eq!(decode::<FromAgent>(&encode(&m)), Ok(m));
        }

        /// Every strict prefix of a message is truncated, and a message with more after it has
        /// bytes left over.
        #[test]
        fn cut_or_extended_messages_are_refused(
            m in arb_to_agent(),
            r in arb_from_agent(),
            extra in 1..8usize,
        ) {
            cut_and_extended(&m, extra)?;
            cut_and_extended(&r, extra)?;
        }

        #[test]
        fn garbage_is_an_error_not_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<ToAgent>(&bytes);
            let _ = decode::<FromAgent>(&bytes);
        }

        /// Damaged messages (closer to real ones than random bytes) never panic either, and
        /// whatever decodes encodes back to the same bytes.
        #[test]
        fn damaged_messages_are_an_error_not_a_panic(
            m in arb_to_agent(),
            r in arb_from_agent(),
            edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6),
        ) {
            for bytes in [mutated(&encode(&m), &edits), mutated(&encode(&r), &edits)] {
                if let Ok(t) = decode::<ToAgent>(&bytes) {
                    prop_assert_eq!(encode(&t), bytes.clone());
                }
                if let Ok(f) = decode::<FromAgent>(&bytes) {
                    prop_assert_eq!(encode(&f), bytes.clone());
                }
            }
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
                mig: Some(false),
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
    }
}
