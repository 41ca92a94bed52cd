//! Image directories and the emulated image streamer.
//!
//! Without `--stream`, plugins create flat files with `openat(criu_get_image_dir(), ...)` in the
//! image directory itself.
//!
//! With `--stream`, plugin images must go through `img_streamer_open(name, flags)`, which hands
//! out one end of a pipe, as CRIU does with criu-image-streamer:
//! * on dump (`flags == O_WRONLY|O_CREAT|O_TRUNC`, 0x241) a host thread drains the pipe; a name
//!   can be written once; when the image directory is closed (after `exit(DUMP)`) every captured
//!   file is appended, in open order, to the single stream file [`STREAM_FILE`];
//! * on restore (`flags == O_RDONLY`) the stream is loaded before plugins start; each name can be
//!   read once (a second open, or an unknown name, gives `-ENOENT`), sequentially, with no seek or
//!   stat possible; a host thread feeds the pipe.
//!
//! Any other `flags` value is a `BUG_ON` in CRIU and aborts the engine here too.
//!
//! In stream mode `criu_get_image_dir()` returns a fresh scratch directory (`stream-local/<stage>`
//! under the image directory) holding only `streamer-capture.sock` or `streamer-serve.sock`
//! placeholders, so files a plugin writes there directly are not part of the stream and are gone
//! on restore, as they would be after a real migration.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// The stream file inside the image directory.
pub const STREAM_FILE: &str = "stream.img";
const MAGIC: &[u8; 16] = b"HARNESS-STREAM1\n";
/// CRIU's `O_DUMP`.
pub const O_DUMP: i32 = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
/// CRIU's `O_RSTR`.
pub const O_RSTR: i32 = libc::O_RDONLY;
/// How long `close` waits for plugins to close streamed files they are writing.
const CAPTURE_DRAIN: Duration = Duration::from_secs(10);

/// A streamer failure.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// I/O on the stream file or a pipe.
    #[error("failed to {what}")]
    Io {
        /// What was attempted.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The stream file is malformed.
    #[error("malformed stream file {0}")]
    Malformed(String),
    /// A plugin still holds a streamed image open when the dump ends.
    #[error("plugin never closed streamed image `{0}`")]
    NotClosed(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StreamError {
    let what = what.into();
    move |source| StreamError::Io { what, source }
}

/// Encodes the stream file.
#[must_use]
pub fn encode(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    for (name, data) in files {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(data);
    }
    out
}

/// Decodes the stream file.
///
/// # Errors
/// On a bad magic, a truncated record or a non-UTF-8 name.
pub fn decode(bytes: &[u8], origin: &str) -> Result<Vec<(String, Vec<u8>)>, StreamError> {
    let bad = || StreamError::Malformed(origin.to_owned());
    let mut rest = bytes.strip_prefix(MAGIC.as_slice()).ok_or_else(bad)?;
    let mut files = Vec::new();
    let take = |rest: &mut &[u8], n: usize| -> Result<Vec<u8>, StreamError> {
        if rest.len() < n {
            return Err(bad());
        }
        let (a, b) = rest.split_at(n);
        *rest = b;
        Ok(a.to_vec())
    };
    while !rest.is_empty() {
        let len = u32::from_le_bytes(take(&mut rest, 4)?.try_into().map_err(|_| bad())?);
        let name = String::from_utf8(take(&mut rest, len as usize)?).map_err(|_| bad())?;
        let size = u64::from_le_bytes(take(&mut rest, 8)?.try_into().map_err(|_| bad())?);
        let size = usize::try_from(size).map_err(|_| bad())?;
        files.push((name, take(&mut rest, size)?));
    }
    Ok(files)
}

/// The host side of `img_streamer_open`.
#[derive(Debug)]
pub enum Streamer {
    /// Dump: captures files written by plugins.
    Capture {
        /// Names opened so far, in order.
        opened: Vec<String>,
        /// Completed files from the drain threads.
        tx: Sender<(String, Vec<u8>)>,
        /// Receiving end of `tx`.
        rx: Receiver<(String, Vec<u8>)>,
    },
    /// Restore: serves each stored file once.
    Serve {
        /// Files not yet served.
        store: HashMap<String, Vec<u8>>,
    },
}

/// What `img_streamer_open` should do.
#[derive(Debug)]
pub enum OpenOutcome {
    /// Hand this descriptor to the plugin.
    Fd(OwnedFd),
    /// Return this negative errno.
    Errno(i32),
    /// The flags are wrong for the mode: CRIU's `BUG_ON`.
    Bug,
}

impl Streamer {
    /// A capturing streamer for a dump.
    #[must_use]
    pub fn capture() -> Self {
        let (tx, rx) = channel();
        Self::Capture {
            opened: Vec::new(),
            tx,
            rx,
        }
    }

    /// A serving streamer loaded from `dir/stream.img` (an absent file serves nothing).
    ///
    /// # Errors
    /// When the stream file cannot be read or is malformed.
    pub fn serve(dir: &Path) -> Result<Self, StreamError> {
        let path = dir.join(STREAM_FILE);
        let store = match std::fs::read(&path) {
            Ok(bytes) => decode(&bytes, &path.display().to_string())?
                .into_iter()
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashMap::new(),
            Err(e) => return Err(io(format!("read {}", path.display()))(e)),
        };
        Ok(Self::Serve { store })
    }

    /// `img_streamer_open(name, flags)`.
    pub fn open(&mut self, name: &str, flags: i32) -> OpenOutcome {
        match self {
            Self::Capture { opened, tx, .. } => {
                if flags != O_DUMP {
                    return OpenOutcome::Bug;
                }
                if opened.iter().any(|n| n == name) {
                    return OpenOutcome::Errno(-libc::EEXIST);
                }
                let Ok((rd, wr)) = nix::unistd::pipe() else {
                    return OpenOutcome::Errno(-libc::EMFILE);
                };
                opened.push(name.to_owned());
                let tx = tx.clone();
                let name = name.to_owned();
                std::thread::spawn(move || {
                    let mut data = Vec::new();
                    let _ = File::from(rd).read_to_end(&mut data);
                    let _ = tx.send((name, data));
                });
                OpenOutcome::Fd(wr)
            }
            Self::Serve { store } => {
                if flags != O_RSTR {
                    return OpenOutcome::Bug;
                }
                let Some(data) = store.remove(name) else {
                    return OpenOutcome::Errno(-libc::ENOENT);
                };
                let Ok((rd, wr)) = nix::unistd::pipe() else {
                    return OpenOutcome::Errno(-libc::EMFILE);
                };
                // The reader may stop early; the write then fails with EPIPE (Rust ignores
                // SIGPIPE) and the thread ends.
                std::thread::spawn(move || {
                    let _ = File::from(wr).write_all(&data);
                });
                OpenOutcome::Fd(rd)
            }
        }
    }

    /// Ends a capture: waits for every opened file to be closed by the plugin and writes the
    /// stream file. A serving streamer just drops what was not read.
    ///
    /// # Errors
    /// When a plugin keeps a streamed file open or the stream file cannot be written.
    pub fn finish(self, dir: &Path) -> Result<(), StreamError> {
        let Self::Capture { opened, tx, rx } = self else {
            return Ok(());
        };
        drop(tx);
        let deadline = Instant::now() + CAPTURE_DRAIN;
        let mut done: HashMap<String, Vec<u8>> = HashMap::new();
        while done.len() < opened.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((name, data)) => {
                    done.insert(name, data);
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    let missing = opened
                        .iter()
                        .find(|n| !done.contains_key(*n))
                        .cloned()
                        .unwrap_or_default();
                    return Err(StreamError::NotClosed(missing));
                }
            }
        }
        let files: Vec<(String, Vec<u8>)> = opened
            .into_iter()
            .map(|n| {
                let d = done.remove(&n).unwrap_or_default();
                (n, d)
            })
            .collect();
        let path = dir.join(STREAM_FILE);
        std::fs::write(&path, encode(&files)).map_err(io(format!("write {}", path.display())))
    }
}

/// Prepares the scratch directory that stands in for the image directory under `--stream`.
///
/// # Errors
/// On I/O failure.
pub fn stream_local_dir(images: &Path, restore: bool) -> Result<PathBuf, StreamError> {
    let dir = images
        .join("stream-local")
        .join(if restore { "restore" } else { "dump" });
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io(format!("clear {}", dir.display())))?;
    }
    std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
    let sock = if restore {
        "streamer-serve.sock"
    } else {
        "streamer-capture.sock"
    };
    std::fs::write(dir.join(sock), b"").map_err(io(format!("create {sock}")))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_round_trip() {
        let files = vec![
            ("a.img".to_owned(), b"hello".to_vec()),
            ("b".to_owned(), Vec::new()),
        ];
        assert_eq!(decode(&encode(&files), "t").unwrap(), files);
        assert!(decode(b"nope", "t").is_err());
        let mut trunc = encode(&files);
        trunc.pop();
        assert!(decode(&trunc, "t").is_err());
    }

    #[test]
    fn capture_then_serve_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Streamer::capture();
        assert!(matches!(s.open("x", O_RSTR), OpenOutcome::Bug));
        let OpenOutcome::Fd(fd) = s.open("x", O_DUMP) else {
            panic!("open for dump")
        };
        assert!(matches!(s.open("x", O_DUMP), OpenOutcome::Errno(e) if e == -libc::EEXIST));
        let big = vec![7u8; 300_000];
        File::from(fd).write_all(&big).unwrap();
        s.finish(dir.path()).unwrap();

        let mut s = Streamer::serve(dir.path()).unwrap();
        assert!(matches!(s.open("x", O_DUMP), OpenOutcome::Bug));
        let OpenOutcome::Fd(fd) = s.open("x", O_RSTR) else {
            panic!("open for restore")
        };
        let mut back = Vec::new();
        File::from(fd).read_to_end(&mut back).unwrap();
        assert_eq!(back, big);
        assert!(matches!(s.open("x", O_RSTR), OpenOutcome::Errno(e) if e == -libc::ENOENT));
        assert!(matches!(s.open("y", O_RSTR), OpenOutcome::Errno(e) if e == -libc::ENOENT));
    }

    #[test]
    fn capture_waits_for_a_late_close() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Streamer::capture();
        let OpenOutcome::Fd(fd) = s.open("held", O_DUMP) else {
            panic!("open")
        };
        // The plugin closes its end only after the dump started closing the image directory.
        let held = fd;
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(held);
        });
        s.finish(dir.path()).unwrap();
        t.join().unwrap();
    }
}
