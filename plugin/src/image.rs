//! The per-task images `cuda-plugin-<pid>.img` and the dump's task list
//! `cuda-plugin-tasks.img`, written at CHECKPOINT_DEVICES and read, and validated, at the
//! restore's `init`, before any task is touched.
//!
//! It records what restore cannot find out by itself: the task's CUDA state when the dump
//! started (so a task that was LOCKED, or already CHECKPOINTED, is restored to that state rather
//! than to RUNNING) and its restore TID (so the restore needs no `--get-restore-tid` run). It is
//! one small text file per CUDA task, written once and read once, so it also works through
//! CRIU's image streamer.
//!
//! The task list names every CUDA task of the dump (every task PAUSE_DEVICES found with CUDA
//! state), written with the first checkpointed task. A restore reads it at `init` (the image
//! directory cannot be listed: the streamer serves files by name only), then reads and checks
//! every per-task image it names: a missing, unreadable or malformed one fails the restore up
//! front, naming the file. Images from before the task list existed have none; their per-task
//! images are then read at each task's RESUME_DEVICES_LATE, and a task without one is probed
//! and assumed to have been RUNNING, as CRIU's C plugin does.
//!
//! ```text
//! cuda_plugin tasks v1
//! pids 1234 1240
//! ```
//!
//! ```text
//! cuda_plugin task v1
//! pid 1234
//! restore_tid 1240
//! initial_state running
//! gpu GPU-8932f937-d72c-4106-c12f-20bd9faed9f6 85899345920
//! checkpoint_ms 14512
//! ```
//!
//! A dump made with custom storage ([`crate::cstore`]) adds the dump's id, the pid its files
//! are named by (the task's pid in CRIU's view at dump), and one line per custom-storage file
//! of the task, in file order (`cuda-cs-<pid>-<n>.img`, `n` from 0): the GPU's UUID at dump
//! and its bytes.
//!
//! ```text
//! custom_storage 6b1f0c2e9d8a4f7e8c1d2b3a4f5e6d7c 1234
//! cs_gpu GPU-8932f937-d72c-4106-c12f-20bd9faed9f6 85899345920
//! ```
//!
//! `gpu` lines (one per GPU the task had memory on, from NVML at dump) and `checkpoint_ms` (how
//! long its checkpoint took) are optional: a restore checks the target GPUs' free memory
//! against them, sizes its deadline by them and reports the restore's time next to the
//! checkpoint's. Readers ignore keys they do not know, so older plugins read these images.

use crate::task::{Pid, Tid};
use abi::CUprocessState;

/// First line of the file; the trailing number is the format version.
pub const MAGIC: &str = "cuda_plugin task v1";
/// First line of the task list.
pub const LIST_MAGIC: &str = "cuda_plugin tasks v1";
/// The task list's file name.
pub const LIST_FILE_NAME: &str = "cuda-plugin-tasks.img";
/// The largest per-task image read (they are about 80 bytes).
pub const MAX_TASK_IMAGE: usize = 64 * 1024;
/// The largest task list read (about 8 bytes per task).
pub const MAX_TASK_LIST: usize = 1024 * 1024;

/// The dump's CUDA tasks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskList {
    pub pids: Vec<Pid>,
}

impl TaskList {
    /// The file contents.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let pids: Vec<String> = self.pids.iter().map(ToString::to_string).collect();
        format!("{LIST_MAGIC}\npids {}\n", pids.join(" ")).into_bytes()
    }

    /// Parses a file written by [`TaskList::encode`]: the magic, then one `pids` line of
    /// distinct positive pids; nothing else.
    pub fn decode(data: &[u8]) -> Result<TaskList, ImageError> {
        let text = std::str::from_utf8(data).map_err(|_| ImageError::NotText)?;
        let mut lines = text.lines();
        let first = lines.next().unwrap_or("");
        if first != LIST_MAGIC {
            return Err(ImageError::Magic(crate::message::quote(first).into_owned()));
        }
        let line = lines.next().ok_or(ImageError::Missing("pids"))?;
        let bad = || ImageError::Line(crate::message::quote(line).into_owned());
        let rest = line.strip_prefix("pids").ok_or_else(bad)?;
        let mut pids = Vec::new();
        for w in rest.split_whitespace() {
            let p: Pid = w.parse().map_err(|_| bad())?;
            if p <= 0 || pids.contains(&p) {
                return Err(bad());
            }
            pids.push(p);
        }
        if let Some(extra) = lines.find(|l| !l.trim().is_empty()) {
            return Err(ImageError::Line(crate::message::quote(extra).into_owned()));
        }
        Ok(TaskList { pids })
    }
}

/// The image file name for `pid` (flat, as CRIU's streamer wants).
#[must_use]
pub fn file_name(pid: Pid) -> String {
    format!("cuda-plugin-{pid}.img")
}

/// One task's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskImage {
    pub pid: Pid,
    pub restore_tid: Tid,
    pub initial_state: CUprocessState,
    /// Device memory per GPU at dump (NVML); empty when unknown.
    pub gpu_bytes: Vec<(abi::GpuUuid, u64)>,
    /// How long the checkpoint took, when this plugin did it.
    pub checkpoint_ms: Option<u64>,
    /// Where its GPU memory went, when the dump used custom storage.
    pub custom: Option<CustomRecord>,
}

/// A task checkpointed with custom storage: the dump's id (every file's header must carry it)
/// and its files' GPUs, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomRecord {
    pub dump_id: [u8; 16],
    /// The pid the files are named by.
    pub file_pid: Pid,
    /// `(GPU at dump, bytes)` of `cuda-cs-<pid>-<n>.img`, `n` the index.
    pub gpus: Vec<(abi::GpuUuid, u64)>,
}

/// The lowercase hex of a dump id.
#[must_use]
pub fn dump_id_hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_dump_id(v: &str) -> Option<[u8; 16]> {
    if v.len() != 32 || !v.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&v[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(id)
}

impl TaskImage {
    /// A record with no sizes or times.
    #[must_use]
    pub fn new(pid: Pid, restore_tid: Tid, initial_state: CUprocessState) -> Self {
        TaskImage {
            pid,
            restore_tid,
            initial_state,
            gpu_bytes: Vec::new(),
            checkpoint_ms: None,
            custom: None,
        }
    }

    /// All its device memory, or `None` when unknown.
    #[must_use]
    pub fn total_bytes(&self) -> Option<u64> {
        (!self.gpu_bytes.is_empty()).then(|| self.gpu_bytes.iter().map(|(_, b)| *b).sum())
    }
}

/// Why an image file is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("not a cuda_plugin image (first line {0:?})")]
    Magic(String),
    #[error("not text (a damaged or foreign file)")]
    NotText,
    #[error("unknown CUDA state {0:?} (a damaged or foreign file)")]
    State(String),
    #[error("malformed line {0:?}")]
    Line(String),
    #[error("missing field {0}")]
    Missing(&'static str),
    #[error("image is for pid {found}, expected {expected}")]
    Pid { found: Pid, expected: Pid },
}

impl TaskImage {
    /// The file contents.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let state = self
            .initial_state
            .cli_word()
            .map_or_else(|| self.initial_state.0.to_string(), str::to_owned);
        let mut s = format!(
            "{MAGIC}\npid {}\nrestore_tid {}\ninitial_state {state}\n",
            self.pid, self.restore_tid
        );
        for (uuid, bytes) in &self.gpu_bytes {
            s.push_str(&format!("gpu {uuid} {bytes}\n"));
        }
        if let Some(ms) = self.checkpoint_ms {
            s.push_str(&format!("checkpoint_ms {ms}\n"));
        }
        if let Some(c) = &self.custom {
            s.push_str(&format!(
                "custom_storage {} {}\n",
                dump_id_hex(&c.dump_id),
                c.file_pid
            ));
            for (uuid, bytes) in &c.gpus {
                s.push_str(&format!("cs_gpu {uuid} {bytes}\n"));
            }
        }
        s.into_bytes()
    }

    /// Parses a file written by [`TaskImage::encode`]; unknown keys are ignored (forward
    /// compatibility), the pid must match `expected`, and the state must be one a dump
    /// leaves behind (running, locked or checkpointed).
    pub fn decode(data: &[u8], expected: Pid) -> Result<TaskImage, ImageError> {
        let text = std::str::from_utf8(data).map_err(|_| ImageError::NotText)?;
        let mut lines = text.lines();
        let first = lines.next().unwrap_or("");
        if first != MAGIC {
            return Err(ImageError::Magic(crate::message::quote(first).into_owned()));
        }
        let (mut pid, mut tid, mut state) = (None, None, None);
        let mut gpu_bytes = Vec::new();
        let mut checkpoint_ms = None;
        let mut dump_id = None;
        let mut cs_gpus = Vec::new();
        for line in lines.filter(|l| !l.trim().is_empty()) {
            let (k, v) = line
                .split_once(' ')
                .ok_or_else(|| ImageError::Line(crate::message::quote(line).into_owned()))?;
            let bad = || ImageError::Line(crate::message::quote(line).into_owned());
            match k {
                "pid" => pid = Some(v.parse::<Pid>().map_err(|_| bad())?),
                "restore_tid" => tid = Some(v.parse::<Tid>().map_err(|_| bad())?),
                "initial_state" => {
                    let st = CUprocessState::from_cli_word(v)
                        .or_else(|| v.parse().ok().map(CUprocessState))
                        .ok_or_else(bad)?;
                    if !matches!(
                        st,
                        CUprocessState::RUNNING
                            | CUprocessState::LOCKED
                            | CUprocessState::CHECKPOINTED
                    ) {
                        return Err(ImageError::State(v.to_owned()));
                    }
                    state = Some(st);
                }
                "gpu" => {
                    let (u, b) = v.split_once(' ').ok_or_else(bad)?;
                    let uuid = abi::GpuUuid::parse(u).map_err(|_| bad())?;
                    let bytes: u64 = b.parse().map_err(|_| bad())?;
                    if gpu_bytes.iter().any(|(g, _)| *g == uuid) {
                        return Err(bad());
                    }
                    gpu_bytes.push((uuid, bytes));
                }
                "checkpoint_ms" => checkpoint_ms = Some(v.parse::<u64>().map_err(|_| bad())?),
                "custom_storage" => {
                    if dump_id.is_some() {
                        return Err(bad());
                    }
                    let (id, p) = v.split_once(' ').ok_or_else(bad)?;
                    let p: Pid = p.parse().map_err(|_| bad())?;
                    if p <= 0 {
                        return Err(bad());
                    }
                    dump_id = Some((parse_dump_id(id).ok_or_else(bad)?, p));
                }
                "cs_gpu" => {
                    let (u, b) = v.split_once(' ').ok_or_else(bad)?;
                    let uuid = abi::GpuUuid::parse(u).map_err(|_| bad())?;
                    let bytes: u64 = b.parse().map_err(|_| bad())?;
                    if cs_gpus.iter().any(|(g, _)| *g == uuid) {
                        return Err(bad());
                    }
                    cs_gpus.push((uuid, bytes));
                }
                _ => {}
            }
        }
        let img = TaskImage {
            pid: pid.ok_or(ImageError::Missing("pid"))?,
            restore_tid: tid.ok_or(ImageError::Missing("restore_tid"))?,
            initial_state: state.ok_or(ImageError::Missing("initial_state"))?,
            gpu_bytes,
            checkpoint_ms,
            custom: match (dump_id, cs_gpus.is_empty()) {
                (Some((dump_id, file_pid)), _) => Some(CustomRecord {
                    dump_id,
                    file_pid,
                    gpus: cs_gpus,
                }),
                (None, true) => None,
                (None, false) => return Err(ImageError::Missing("custom_storage")),
            },
        };
        if img.pid != expected {
            return Err(ImageError::Pid {
                found: img.pid,
                expected,
            });
        }
        Ok(img)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_rejections() {
        let t = TaskImage::new(10, 12, CUprocessState::LOCKED);
        let bytes = t.encode();
        assert!(String::from_utf8_lossy(&bytes).contains("initial_state locked"));
        assert_eq!(TaskImage::decode(&bytes, 10), Ok(t.clone()));
        assert_eq!(
            TaskImage::decode(&bytes, 11),
            Err(ImageError::Pid {
                found: 10,
                expected: 11
            })
        );
        assert!(matches!(
            TaskImage::decode(b"garbage", 10),
            Err(ImageError::Magic(_))
        ));
        assert_eq!(
            TaskImage::decode(format!("{MAGIC}\npid 10\n").as_bytes(), 10),
            Err(ImageError::Missing("restore_tid"))
        );
        assert_eq!(file_name(7), "cuda-plugin-7.img");
    }

    #[test]
    fn damaged_images_are_named_errors() {
        let good = TaskImage::new(10, 12, CUprocessState::RUNNING).encode();
        assert_eq!(
            TaskImage::decode(b"", 10),
            Err(ImageError::Magic(String::new()))
        );
        let cut = String::from_utf8_lossy(&good)
            .find("initial_state")
            .unwrap();
        assert_eq!(
            TaskImage::decode(&good[..cut], 10),
            Err(ImageError::Missing("initial_state")),
            "truncated"
        );
        assert!(
            TaskImage::decode(&good[..cut + 16], 10).is_err(),
            "cut inside a line"
        );
        let mut flipped = good.clone();
        flipped[3] ^= 0x80;
        assert_eq!(TaskImage::decode(&flipped, 10), Err(ImageError::NotText));
        let unknown = String::from_utf8(good.clone())
            .unwrap()
            .replace("running", "7");
        assert_eq!(
            TaskImage::decode(unknown.as_bytes(), 10),
            Err(ImageError::State("7".into())),
            "a state a dump never leaves behind"
        );
    }

    #[test]
    fn sizes_and_times_are_optional_and_checked() {
        let mut t = TaskImage::new(5, 6, CUprocessState::RUNNING);
        assert_eq!(t.total_bytes(), None);
        t.gpu_bytes = vec![
            (abi::GpuUuid([1; 16]), 80 << 30),
            (abi::GpuUuid([2; 16]), 1),
        ];
        t.checkpoint_ms = Some(14_000);
        assert_eq!(t.total_bytes(), Some((80 << 30) + 1));
        let text = String::from_utf8(t.encode()).unwrap();
        assert!(text.contains("gpu GPU-01010101-0101-0101-0101-010101010101 85899345920\n"));
        assert_eq!(TaskImage::decode(text.as_bytes(), 5), Ok(t));
        for bad in [
            "gpu GPU-x 1",
            "gpu GPU-01010101-0101-0101-0101-010101010101 -1",
            "checkpoint_ms x",
        ] {
            let img = format!("{MAGIC}\npid 5\nrestore_tid 6\ninitial_state running\n{bad}\n");
            assert!(TaskImage::decode(img.as_bytes(), 5).is_err(), "{bad}");
        }
    }

    #[test]
    fn custom_storage_records_round_trip_and_are_checked() {
        let mut t = TaskImage::new(5, 6, CUprocessState::RUNNING);
        t.custom = Some(CustomRecord {
            dump_id: [0xab; 16],
            file_pid: 99,
            gpus: vec![(abi::GpuUuid([1; 16]), 4096), (abi::GpuUuid([2; 16]), 0)],
        });
        let text = String::from_utf8(t.encode()).unwrap();
        assert!(text.contains(&format!("custom_storage {} 99\n", "ab".repeat(16))));
        assert_eq!(TaskImage::decode(text.as_bytes(), 5), Ok(t));
        let head = format!("{MAGIC}\npid 5\nrestore_tid 6\ninitial_state running\n");
        let gpu = "cs_gpu GPU-01010101-0101-0101-0101-010101010101 1";
        assert_eq!(
            TaskImage::decode(format!("{head}{gpu}\n").as_bytes(), 5),
            Err(ImageError::Missing("custom_storage")),
            "files without the dump id they belong to"
        );
        for bad in [
            "custom_storage abc 5",
            "custom_storage 000102030405060708090a0b0c0d0e0f",
            "custom_storage 000102030405060708090a0b0c0d0e0f 0",
            "custom_storage zz0102030405060708090a0b0c0d0e0f 5",
            "custom_storage 000102030405060708090a0b0c0d0e0f 5\ncustom_storage 000102030405060708090a0b0c0d0e0f 5",
            "custom_storage 000102030405060708090a0b0c0d0e0f 5\ncs_gpu GPU-01010101-0101-0101-0101-010101010101 1\ncs_gpu GPU-01010101-0101-0101-0101-010101010101 2",
        ] {
            assert!(TaskImage::decode(format!("{head}{bad}\n").as_bytes(), 5).is_err(), "{bad}");
        }
    }

    #[test]
    fn task_list_round_trip_and_rejections() {
        let l = TaskList {
            pids: vec![5, 77, 1234],
        };
        assert_eq!(TaskList::decode(&l.encode()), Ok(l));
        assert_eq!(
            TaskList::decode(&TaskList::default().encode()),
            Ok(TaskList::default())
        );
        for bad in [
            "cuda_plugin tasks v1\npids 5 5\n",
            "cuda_plugin tasks v1\npids 5 -1\n",
            "cuda_plugin tasks v1\npids 5 x\n",
            "cuda_plugin tasks v1\npids 5\nmore\n",
            "cuda_plugin tasks v2\npids 5\n",
            "cuda_plugin tasks v1\n",
        ] {
            assert!(TaskList::decode(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn encode_decode_is_identity(
            pid in 1i32..,
            tid in 1i32..,
            st in 0u32..3,
            gpus in proptest::collection::btree_map(any::<[u8; 16]>(), any::<u64>(), 0..4),
            ms in proptest::option::of(any::<u64>()),
            custom in proptest::option::of((any::<[u8; 16]>(), proptest::collection::btree_map(any::<[u8; 16]>(), any::<u64>(), 0..4))),
        ) {
            let st = [CUprocessState::RUNNING, CUprocessState::LOCKED, CUprocessState::CHECKPOINTED][st as usize];
            let mut t = TaskImage::new(pid, tid, st);
            t.gpu_bytes = gpus.into_iter().map(|(u, b)| (abi::GpuUuid(u), b)).collect();
            t.checkpoint_ms = ms;
            t.custom = custom.map(|(dump_id, g)| CustomRecord {
                dump_id,
                file_pid: pid,
                gpus: g.into_iter().map(|(u, b)| (abi::GpuUuid(u), b)).collect(),
            });
            prop_assert_eq!(TaskImage::decode(&t.encode(), pid), Ok(t));
        }

        #[test]
        fn task_list_round_trips(pids in proptest::collection::btree_set(1i32.., 0..50)) {
            let l = TaskList { pids: pids.into_iter().collect() };
            prop_assert_eq!(TaskList::decode(&l.encode()), Ok(l));
        }

        #[test]
        fn task_list_decode_never_panics(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = TaskList::decode(&data);
        }

        #[test]
        fn decode_never_panics(data in proptest::collection::vec(any::<u8>(), 0..200), pid in any::<i32>()) {
            let _ = TaskImage::decode(&data, pid);
        }
    }
}
