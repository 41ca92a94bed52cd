//! The messages between the plugin in CRIU and its helper process, one message per
//! `SOCK_SEQPACKET` record, in a compact binary form (see [`Wire`]). Both ends are the same build
//! of the same library (the helper is a fork of CRIU that never execs), so there is no version
//! skew to negotiate: the helper's [`FromAgent::Hello`] is the whole handshake, and a message
//! that does not decode is a bug, reported as such ([`DecodeError`]).
//!
//! # Why the format is hand-written
//!
//! The messages were first JSON (serde and serde_json), which added about 140 KB of code to a
//! plugin that then had to ship under 1 MB (138 KB on x86_64, 126 KB on aarch64; the limit in
//! `scripts/check-dist.sh` is 1.5 MB now),
//! for a protocol that is private between two copies of one `.so`: it needs no
//! self-description, no schema evolution and no versioning across builds. So each type here
//! writes and reads itself ([`Wire`]):
//!
//! * an enum is a tag byte (its variant, numbered from 0 in declaration order) and then the
//!   variant's fields; a struct is its fields in declaration order;
//! * integers are fixed-width little-endian (`u32`, `i32`, `u64`); an `f64` is its IEEE-754 bits
//!   as a `u64`; a `bool` is one byte, 0 or 1;
//! * `Option` and `Result` are a tag byte (`None`/`Ok` 0, `Some`/`Err` 1) and the value;
//! * a string, a path (its bytes, not necessarily UTF-8) and a `Vec` are a `u32` length (bytes,
//!   or items) and the contents; a UUID is its 16 bytes.
//!
//! Decoding checks every read against what is left, refuses a length above [`MAX_LEN`], a tag it
//! does not know, a string that is not UTF-8 and bytes left over after the message, and never
//! panics on any input (the tests feed it arbitrary and mutated bytes).

use crate::backend::driver::{DriverCall, DriverReply};
use crate::inventory::GpuInfo;
use crate::nvml::{GpuMemory, Snapshot};
use crate::task::Pid;
use std::path::PathBuf;
use std::time::Duration;

/// CRIU → helper.
#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq)]
pub enum FromAgent {
    /// The first message: the helper runs, with this pid.
    Hello { pid: Pid },
    /// The answer to the [`ToAgent::Call`] `id`.
    Reply { id: u64, reply: Reply },
    /// A line for CRIU's log, from code running in the helper (CRIU logs it as its own).
    Log { level: u32, msg: String },
}

/// An answer.
#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardStage {
    Dump,
    Restore,
}

/// How the guardian drives a task itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardBackend {
    /// The driver API, from the helper's own copy of `libcuda.so.1`.
    DriverApi,
    /// The `cuda-checkpoint` utility at `program`.
    Cli { program: PathBuf, device_map: bool },
}

/// The guardian's settings.
#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishMode {
    /// Everything is as it should be: exit now.
    Done,
    /// The dump succeeded and CRIU is about to kill the tasks, or leave them stopped. CRIU may
    /// still resume them instead (CRIU 4.1 and 4.2 do when a post-dump action script fails after
    /// the plugin's last hook), so: once CRIU has exited, put back every tracked task that is
    /// alive and neither stopped nor dying.
    WatchTasks,
}

/// The longest string, path or list a message may hold (bytes, or items): the channel's own
/// limit on a whole message ([`crate::ffi::agent::MAX_MESSAGE`]).
pub const MAX_LEN: usize = crate::ffi::agent::MAX_MESSAGE;

/// Why a message did not decode. `at` is the byte offset in the message where the malformed part
/// starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A tag byte (an enum's variant, `Option`, `Result`, `bool`) that `what` does not have.
    #[error("undecodable message from the other side: unknown {what} tag {tag} at byte {at}")]
    UnknownTag {
        what: &'static str,
        tag: u8,
        at: usize,
    },
    /// The message ends inside `what`.
    #[error(
        "undecodable message from the other side: it ends inside {what} at byte {at} \
         ({need} bytes needed, {left} left)"
    )]
    Truncated {
        what: &'static str,
        at: usize,
        need: usize,
        left: usize,
    },
    /// The message goes on after its last field.
    #[error(
        "undecodable message from the other side: {count} bytes left over \
         after the message's {at}"
    )]
    TrailingBytes { at: usize, count: usize },
    /// A string that is not UTF-8.
    #[error("undecodable message from the other side: {what} at byte {at} is not UTF-8")]
    InvalidUtf8 { what: &'static str, at: usize },
    /// A length above [`MAX_LEN`].
    #[error(
        "undecodable message from the other side: {what} at byte {at} has length {len}, over \
         the limit of {MAX_LEN}"
    )]
    TooLong {
        what: &'static str,
        at: usize,
        len: u32,
    },
}

/// Encodes a message.
#[must_use]
pub fn encode<T: Wire>(msg: &T) -> Vec<u8> {
    let mut out = Vec::new();
    msg.put(&mut out);
    out
}

/// Decodes a message: all of `bytes`, and nothing more.
pub fn decode<T: Wire>(bytes: &[u8]) -> Result<T, DecodeError> {
    let mut r = Reader { bytes, at: 0 };
    let msg = T::take(&mut r)?;
    match r.left() {
        0 => Ok(msg),
        count => Err(DecodeError::TrailingBytes { at: r.at, count }),
    }
}

/// A type with a place in the wire format (see the [module docs](self)).
pub trait Wire: Sized {
    /// Appends the value's encoding to `out`.
    fn put(&self, out: &mut Vec<u8>);
    /// Reads a value from `r`, or says what is malformed.
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError>;
}

/// The bytes a message is decoded from, and how far decoding has got.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.bytes.len().saturating_sub(self.at)
    }

    /// The next `n` bytes, part of `what`.
    fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let rest = self.bytes.get(self.at..).unwrap_or_default();
        let got = rest.get(..n).ok_or(DecodeError::Truncated {
            what,
            at: self.at,
            need: n,
            left: rest.len(),
        })?;
        self.at += n;
        Ok(got)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let at = self.at;
        let b = self.bytes(N, what)?;
        <[u8; N]>::try_from(b).map_err(|_| DecodeError::Truncated {
            what,
            at,
            need: N,
            left: b.len(),
        })
    }

    /// A tag byte of `what`, with the offset it was read at (for [`DecodeError::UnknownTag`]).
    fn tag(&mut self, what: &'static str) -> Result<(u8, usize), DecodeError> {
        let at = self.at;
        let [t] = self.array::<1>(what)?;
        Ok((t, at))
    }

    /// A length of `what` (bytes or items), at most [`MAX_LEN`] and, since every byte string
    /// and every item here is at least one byte, at most what is left.
    fn len(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        let at = self.at;
        let len = u32::from_le_bytes(self.array(what)?);
        let n = usize::try_from(len).unwrap_or(usize::MAX);
        if n > MAX_LEN {
            return Err(DecodeError::TooLong { what, at, len });
        }
        if n > self.left() {
            return Err(DecodeError::Truncated {
                what,
                at: self.at,
                need: n,
                left: self.left(),
            });
        }
        Ok(n)
    }
}

fn unknown(what: &'static str, (tag, at): (u8, usize)) -> DecodeError {
    DecodeError::UnknownTag { what, tag, at }
}

/// Writes a length (bytes or items). One above `u32::MAX` cannot be sent (the channel takes at
/// most [`MAX_LEN`] bytes); it is written as `u32::MAX`, which the receiver refuses.
fn put_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_len(out, b.len());
    out.extend_from_slice(b);
}

macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok(<$t>::from_le_bytes(r.array(stringify!($t))?))
            }
        }
    )*};
}
wire_int!(u32, i32, u64);

/// A duration as nanoseconds (`u64`: up to 584 years; a longer one is sent as that).
impl Wire for Duration {
    fn put(&self, out: &mut Vec<u8>) {
        u64::try_from(self.as_nanos()).unwrap_or(u64::MAX).put(out);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Duration::from_nanos(u64::take(r)?))
    }
}

impl Wire for f64 {
    fn put(&self, out: &mut Vec<u8>) {
        self.to_bits().put(out);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(f64::from_bits(u64::from_le_bytes(r.array("f64")?)))
    }
}

impl Wire for bool {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.tag("bool")? {
            (0, _) => Ok(false),
            (1, _) => Ok(true),
            t => Err(unknown("bool", t)),
        }
    }
}

impl Wire for [u8; 16] {
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.array("UUID")
    }
}

impl Wire for String {
    fn put(&self, out: &mut Vec<u8>) {
        put_bytes(out, self.as_bytes());
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let n = r.len("string")?;
        let at = r.at;
        let b = r.bytes(n, "string")?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| DecodeError::InvalidUtf8 { what: "string", at })
    }
}

impl Wire for PathBuf {
    fn put(&self, out: &mut Vec<u8>) {
        use std::os::unix::ffi::OsStrExt;
        put_bytes(out, self.as_os_str().as_bytes());
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        use std::os::unix::ffi::OsStrExt;
        let n = r.len("path")?;
        let b = r.bytes(n, "path")?;
        Ok(PathBuf::from(std::ffi::OsStr::from_bytes(b)))
    }
}

impl<T: Wire> Wire for Option<T> {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.put(out);
            }
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.tag("Option")? {
            (0, _) => Ok(None),
            (1, _) => T::take(r).map(Some),
            t => Err(unknown("Option", t)),
        }
    }
}

impl<T: Wire, E: Wire> Wire for Result<T, E> {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Ok(v) => {
                out.push(0);
                v.put(out);
            }
            Err(e) => {
                out.push(1);
                e.put(out);
            }
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.tag("Result")? {
            (0, _) => T::take(r).map(Ok),
            (1, _) => E::take(r).map(Err),
            t => Err(unknown("Result", t)),
        }
    }
}

// Every item type of a list here encodes in at least one byte (see `Reader::len`).
impl<T: Wire> Wire for Vec<T> {
    fn put(&self, out: &mut Vec<u8>) {
        put_len(out, self.len());
        for v in self {
            v.put(out);
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let n = r.len("list")?;
        (0..n).map(|_| T::take(r)).collect()
    }
}

impl<A: Wire, B: Wire> Wire for (A, B) {
    fn put(&self, out: &mut Vec<u8>) {
        self.0.put(out);
        self.1.put(out);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok((A::take(r)?, B::take(r)?))
    }
}

impl<A: Wire, B: Wire, C: Wire, D: Wire> Wire for (A, B, C, D) {
    fn put(&self, out: &mut Vec<u8>) {
        self.0.put(out);
        self.1.put(out);
        self.2.put(out);
        self.3.put(out);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok((A::take(r)?, B::take(r)?, C::take(r)?, D::take(r)?))
    }
}

impl Wire for ToAgent {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            ToAgent::Call { id, deadline, call } => {
                out.push(0);
                id.put(out);
                deadline.put(out);
                call.put(out);
            }
            ToAgent::Configure(c) => {
                out.push(1);
                c.put(out);
            }
            ToAgent::Track(t) => {
                out.push(2);
                t.put(out);
            }
            ToAgent::Intent { pid, op } => {
                out.push(3);
                pid.put(out);
                op.put(out);
            }
            ToAgent::Untrack { pid } => {
                out.push(4);
                pid.put(out);
            }
            ToAgent::Abandon { id } => {
                out.push(5);
                id.put(out);
            }
            ToAgent::Finish(m) => {
                out.push(6);
                m.put(out);
            }
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(match r.tag("ToAgent")? {
            (0, _) => ToAgent::Call {
                id: Wire::take(r)?,
                deadline: Wire::take(r)?,
                call: Wire::take(r)?,
            },
            (1, _) => ToAgent::Configure(Wire::take(r)?),
            (2, _) => ToAgent::Track(Wire::take(r)?),
            (3, _) => ToAgent::Intent {
                pid: Wire::take(r)?,
                op: Wire::take(r)?,
            },
            (4, _) => ToAgent::Untrack {
                pid: Wire::take(r)?,
            },
            (5, _) => ToAgent::Abandon { id: Wire::take(r)? },
            (6, _) => ToAgent::Finish(Wire::take(r)?),
            t => return Err(unknown("ToAgent", t)),
        })
    }
}

impl Wire for Call {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Call::Probe { call_init } => {
                out.push(0);
                call_init.put(out);
            }
            Call::Driver(c) => {
                out.push(1);
                c.put(out);
            }
            Call::Gpus => out.push(2),
            Call::Nvml => out.push(3),
            Call::Custom(j) => {
                out.push(4);
                j.put(out);
            }
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(match r.tag("Call")? {
            (0, _) => Call::Probe {
                call_init: Wire::take(r)?,
            },
            (1, _) => Call::Driver(Wire::take(r)?),
            (2, _) => Call::Gpus,
            (3, _) => Call::Nvml,
            (4, _) => Call::Custom(Wire::take(r)?),
            t => return Err(unknown("Call", t)),
        })
    }
}

impl Wire for DriverCall {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            DriverCall::Init => out.push(0),
            DriverCall::RestoreTid(pid) => {
                out.push(1);
                pid.put(out);
            }
            DriverCall::State(pid) => {
                out.push(2);
                pid.put(out);
            }
            DriverCall::Lock { pid, timeout_ms } => {
                out.push(3);
                pid.put(out);
                timeout_ms.put(out);
            }
            DriverCall::Checkpoint(pid) => {
                out.push(4);
                pid.put(out);
            }
            DriverCall::Restore { pid, pairs } => {
                out.push(5);
                pid.put(out);
                pairs.put(out);
            }
            DriverCall::Unlock(pid) => {
                out.push(6);
                pid.put(out);
            }
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(match r.tag("DriverCall")? {
            (0, _) => DriverCall::Init,
            (1, _) => DriverCall::RestoreTid(Wire::take(r)?),
            (2, _) => DriverCall::State(Wire::take(r)?),
            (3, _) => DriverCall::Lock {
                pid: Wire::take(r)?,
                timeout_ms: Wire::take(r)?,
            },
            (4, _) => DriverCall::Checkpoint(Wire::take(r)?),
            (5, _) => DriverCall::Restore {
                pid: Wire::take(r)?,
                pairs: Wire::take(r)?,
            },
            (6, _) => DriverCall::Unlock(Wire::take(r)?),
            t => return Err(unknown("DriverCall", t)),
        })
    }
}

impl Wire for FromAgent {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            FromAgent::Hello { pid } => {
                out.push(0);
                pid.put(out);
            }
            FromAgent::Reply { id, reply } => {
                out.push(1);
                id.put(out);
                reply.put(out);
            }
            FromAgent::Log { level, msg } => {
                out.push(2);
                level.put(out);
                msg.put(out);
            }
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(match r.tag("FromAgent")? {
            (0, _) => FromAgent::Hello {
                pid: Wire::take(r)?,
            },
            (1, _) => FromAgent::Reply {
                id: Wire::take(r)?,
                reply: Wire::take(r)?,
            },
            (2, _) => FromAgent::Log {
                level: Wire::take(r)?,
                msg: Wire::take(r)?,
            },
            t => return Err(unknown("FromAgent", t)),
        })
    }
}

impl Wire for Reply {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Probe(p) => {
                out.push(0);
                p.put(out);
            }
            Reply::Driver(d) => {
                out.push(1);
                d.put(out);
            }
            Reply::Gpus(g) => {
                out.push(2);
                g.put(out);
            }
            Reply::Nvml(n) => {
                out.push(3);
                n.put(out);
            }
            Reply::Panicked => out.push(4),
            Reply::Custom(c) => {
                out.push(5);
                c.put(out);
            }
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(match r.tag("Reply")? {
            (0, _) => Reply::Probe(Wire::take(r)?),
            (1, _) => Reply::Driver(Wire::take(r)?),
            (2, _) => Reply::Gpus(Wire::take(r)?),
            (3, _) => Reply::Nvml(Wire::take(r)?),
            (4, _) => Reply::Panicked,
            (5, _) => Reply::Custom(Wire::take(r)?),
            t => return Err(unknown("Reply", t)),
        })
    }
}

impl Wire for ProbeReply {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            ProbeReply::Supported {
                version,
                init,
                custom_storage,
            } => {
                out.push(0);
                version.put(out);
                init.put(out);
                custom_storage.put(out);
            }
            ProbeReply::Unsupported(why) => {
                out.push(1);
                why.put(out);
            }
            ProbeReply::Error(why) => {
                out.push(2);
                why.put(out);
            }
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(match r.tag("ProbeReply")? {
            (0, _) => ProbeReply::Supported {
                version: Wire::take(r)?,
                init: Wire::take(r)?,
                custom_storage: Wire::take(r)?,
            },
            (1, _) => ProbeReply::Unsupported(Wire::take(r)?),
            (2, _) => ProbeReply::Error(Wire::take(r)?),
            t => return Err(unknown("ProbeReply", t)),
        })
    }
}

impl Wire for CustomJob {
    fn put(&self, out: &mut Vec<u8>) {
        self.checkpoint.put(out);
        self.pid.put(out);
        self.key.put(out);
        self.dump_id.put(out);
        self.pairs.put(out);
        self.files.put(out);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(CustomJob {
            checkpoint: Wire::take(r)?,
            pid: Wire::take(r)?,
            key: Wire::take(r)?,
            dump_id: Wire::take(r)?,
            pairs: Wire::take(r)?,
            files: Wire::take(r)?,
        })
    }
}

impl Wire for CustomGpu {
    fn put(&self, out: &mut Vec<u8>) {
        self.uuid.put(out);
        self.bytes.put(out);
        self.data.put(out);
        self.fills.put(out);
        self.micros.put(out);
        self.direct.put(out);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(CustomGpu {
            uuid: Wire::take(r)?,
            bytes: Wire::take(r)?,
            data: Wire::take(r)?,
            fills: Wire::take(r)?,
            micros: Wire::take(r)?,
            direct: Wire::take(r)?,
        })
    }
}

impl Wire for DriverReply {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            DriverReply::Tid(t) => {
                out.push(0);
                t.put(out);
            }
            DriverReply::State(s) => {
                out.push(1);
                s.put(out);
            }
            DriverReply::Code(c) => {
                out.push(2);
                c.put(out);
            }
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(match r.tag("DriverReply")? {
            (0, _) => DriverReply::Tid(Wire::take(r)?),
            (1, _) => DriverReply::State(Wire::take(r)?),
            (2, _) => DriverReply::Code(Wire::take(r)?),
            t => return Err(unknown("DriverReply", t)),
        })
    }
}

impl Wire for WireGpu {
    fn put(&self, out: &mut Vec<u8>) {
        self.ordinal.put(out);
        self.uuid.put(out);
        self.name.put(out);
        self.memory_bytes.put(out);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(WireGpu {
            ordinal: Wire::take(r)?,
            uuid: Wire::take(r)?,
            name: Wire::take(r)?,
            memory_bytes: Wire::take(r)?,
        })
    }
}

impl Wire for WireGpuMemory {
    fn put(&self, out: &mut Vec<u8>) {
        self.uuid.put(out);
        self.total.put(out);
        self.free.put(out);
        self.processes.put(out);
        self.mig.put(out);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(WireGpuMemory {
            uuid: Wire::take(r)?,
            total: Wire::take(r)?,
            free: Wire::take(r)?,
            processes: Wire::take(r)?,
            mig: Wire::take(r)?,
        })
    }
}

impl Wire for WireSnapshot {
    fn put(&self, out: &mut Vec<u8>) {
        self.gpus.put(out);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(WireSnapshot {
            gpus: Wire::take(r)?,
        })
    }
}

impl Wire for GuardStage {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(match self {
            GuardStage::Dump => 0,
            GuardStage::Restore => 1,
        });
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.tag("GuardStage")? {
            (0, _) => Ok(GuardStage::Dump),
            (1, _) => Ok(GuardStage::Restore),
            t => Err(unknown("GuardStage", t)),
        }
    }
}

impl Wire for GuardBackend {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            GuardBackend::DriverApi => out.push(0),
            GuardBackend::Cli {
                program,
                device_map,
            } => {
                out.push(1);
                program.put(out);
                device_map.put(out);
            }
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(match r.tag("GuardBackend")? {
            (0, _) => GuardBackend::DriverApi,
            (1, _) => GuardBackend::Cli {
                program: Wire::take(r)?,
                device_map: Wire::take(r)?,
            },
            t => return Err(unknown("GuardBackend", t)),
        })
    }
}

impl Wire for GuardConfig {
    fn put(&self, out: &mut Vec<u8>) {
        self.stage.put(out);
        self.backend.put(out);
        self.timeout.put(out);
        self.copy_rate.put(out);
        self.kill_on_restore_failure.put(out);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(GuardConfig {
            stage: Wire::take(r)?,
            backend: Wire::take(r)?,
            timeout: Wire::take(r)?,
            copy_rate: Wire::take(r)?,
            kill_on_restore_failure: Wire::take(r)?,
        })
    }
}

impl Wire for Tracked {
    fn put(&self, out: &mut Vec<u8>) {
        self.pid.put(out);
        self.target.put(out);
        self.bytes.put(out);
        self.pairs.put(out);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Tracked {
            pid: Wire::take(r)?,
            target: Wire::take(r)?,
            bytes: Wire::take(r)?,
            pairs: Wire::take(r)?,
        })
    }
}

impl Wire for FinishMode {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(match self {
            FinishMode::Done => 0,
            FinishMode::WatchTasks => 1,
        });
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.tag("FinishMode")? {
            (0, _) => Ok(FinishMode::Done),
            (1, _) => Ok(FinishMode::WatchTasks),
            t => Err(unknown("FinishMode", t)),
        }
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
        assert_eq!(
            encode(&ToAgent::Abandon { id: 0x0102 }),
            [5, 2, 1, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            encode(&ToAgent::Intent {
                pid: -2,
                op: "lock".into()
            }),
            [3, 0xfe, 0xff, 0xff, 0xff, 4, 0, 0, 0, b'l', b'o', b'c', b'k']
        );
        assert_eq!(
            encode(&FromAgent::Reply {
                id: 1,
                reply: Reply::Driver(DriverReply::Tid(Err(3)))
            }),
            [1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 3, 0, 0, 0]
        );
        assert_eq!(
            encode(&ToAgent::Call {
                id: 2,
                deadline: None,
                call: Call::Probe { call_init: true }
            }),
            [0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]
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
        use DecodeError::*;
        assert_eq!(
            decode::<ToAgent>(b""),
            Err(Truncated {
                what: "ToAgent",
                at: 0,
                need: 1,
                left: 0
            })
        );
        assert_eq!(
            decode::<ToAgent>(&[7]),
            Err(UnknownTag {
                what: "ToAgent",
                tag: 7,
                at: 0
            })
        );
        assert_eq!(
            decode::<FromAgent>(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 9]),
            Err(UnknownTag {
                what: "Reply",
                tag: 9,
                at: 9
            })
        );
        // Abandon with a 7-byte id.
        assert_eq!(
            decode::<ToAgent>(&[5, 1, 2, 3, 4, 5, 6, 7]),
            Err(Truncated {
                what: "u64",
                at: 1,
                need: 8,
                left: 7
            })
        );
        assert_eq!(
            decode::<ToAgent>(&[6, 0, 0]),
            Err(TrailingBytes { at: 2, count: 1 })
        );
        // Probe { call_init: 2 }.
        assert_eq!(
            decode::<ToAgent>(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]),
            Err(UnknownTag {
                what: "bool",
                tag: 2,
                at: 11
            })
        );
        // Intent with a string that is not UTF-8.
        assert_eq!(
            decode::<ToAgent>(&[3, 1, 0, 0, 0, 2, 0, 0, 0, 0xc3, 0x28]),
            Err(InvalidUtf8 {
                what: "string",
                at: 9
            })
        );
        // Intent with a string of 4 GiB, and one longer than the message.
        assert_eq!(
            decode::<ToAgent>(&[3, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, b'x']),
            Err(TooLong {
                what: "string",
                at: 5,
                len: u32::MAX
            })
        );
        assert_eq!(
            decode::<ToAgent>(&[3, 1, 0, 0, 0, 5, 0, 0, 0, b'x']),
            Err(Truncated {
                what: "string",
                at: 9,
                need: 5,
                left: 1
            })
        );
        // A list of a million GPUs in a few bytes allocates nothing.
        let mut m = vec![1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0];
        m.extend_from_slice(&1_000_000u32.to_le_bytes());
        assert!(matches!(
            decode::<FromAgent>(&m),
            Err(Truncated { what: "list", .. })
        ));
        let e = decode::<ToAgent>(&[9]).unwrap_err().to_string();
        assert!(e.contains("undecodable") && e.contains("ToAgent"), "{e}");
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
