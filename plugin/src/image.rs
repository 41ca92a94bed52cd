//! The per-task image `cuda-plugin-<pid>.img`, written at CHECKPOINT_DEVICES and read at
//! RESUME_DEVICES_LATE.
//!
//! It records what restore cannot find out by itself: the task's CUDA state when the dump
//! started (so a task that was LOCKED, or already CHECKPOINTED, is restored to that state rather
//! than to RUNNING) and its restore TID (so the restore needs no `--get-restore-tid` run). It is
//! one small text file per CUDA task, written once and read once, so it also works through
//! CRIU's image streamer. A missing file (an image from an older plugin, a pid namespace that
//! renumbered the task, a streamer without the file) is not an error: restore then probes the
//! task and assumes it was RUNNING, as CRIU's C plugin does.
//!
//! ```text
//! cuda_plugin task v1
//! pid 1234
//! restore_tid 1240
//! initial_state running
//! ```

use crate::backend::{Pid, Tid};
use abi::CUprocessState;

/// First line of the file; the trailing number is the format version.
pub const MAGIC: &str = "cuda_plugin task v1";

/// The image file name for `pid` (flat, as CRIU's streamer wants).
#[must_use]
pub fn file_name(pid: Pid) -> String {
    format!("cuda-plugin-{pid}.img")
}

/// One task's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskImage {
    pub pid: Pid,
    pub restore_tid: Tid,
    pub initial_state: CUprocessState,
}

/// Why an image file is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("not a cuda_plugin task image (first line {0:?})")]
    Magic(String),
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
        format!(
            "{MAGIC}\npid {}\nrestore_tid {}\ninitial_state {state}\n",
            self.pid, self.restore_tid
        )
        .into_bytes()
    }

    /// Parses a file written by [`TaskImage::encode`]; unknown keys are ignored (forward
    /// compatibility), and the pid must match `expected`.
    pub fn decode(data: &[u8], expected: Pid) -> Result<TaskImage, ImageError> {
        let text = String::from_utf8_lossy(data);
        let mut lines = text.lines();
        let first = lines.next().unwrap_or("");
        if first != MAGIC {
            return Err(ImageError::Magic(first.to_owned()));
        }
        let (mut pid, mut tid, mut state) = (None, None, None);
        for line in lines.filter(|l| !l.trim().is_empty()) {
            let (k, v) = line
                .split_once(' ')
                .ok_or_else(|| ImageError::Line(line.to_owned()))?;
            let bad = || ImageError::Line(line.to_owned());
            match k {
                "pid" => pid = Some(v.parse::<Pid>().map_err(|_| bad())?),
                "restore_tid" => tid = Some(v.parse::<Tid>().map_err(|_| bad())?),
                "initial_state" => {
                    state = Some(
                        CUprocessState::from_cli_word(v)
                            .or_else(|| v.parse().ok().map(CUprocessState))
                            .ok_or_else(bad)?,
                    );
                }
                _ => {}
            }
        }
        let img = TaskImage {
            pid: pid.ok_or(ImageError::Missing("pid"))?,
            restore_tid: tid.ok_or(ImageError::Missing("restore_tid"))?,
            initial_state: state.ok_or(ImageError::Missing("initial_state"))?,
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
        let t = TaskImage {
            pid: 10,
            restore_tid: 12,
            initial_state: CUprocessState::LOCKED,
        };
        let bytes = t.encode();
        assert!(String::from_utf8_lossy(&bytes).contains("initial_state locked"));
        assert_eq!(TaskImage::decode(&bytes, 10), Ok(t));
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

    proptest! {
        #[test]
        fn encode_decode_is_identity(pid in 1i32.., tid in 1i32.., st in 0u32..8) {
            let t = TaskImage { pid, restore_tid: tid, initial_state: CUprocessState(st) };
            prop_assert_eq!(TaskImage::decode(&t.encode(), pid), Ok(t));
        }

        #[test]
        fn decode_never_panics(data in proptest::collection::vec(any::<u8>(), 0..200), pid in any::<i32>()) {
            let _ = TaskImage::decode(&data, pid);
        }
    }
}
