//! `mock-cuda-world`: the world of the mock CUDA driver (`mock-libcuda`) and the NVML stand-in
//! (`mock-nvml`): a directory, named by [`WORLD_ENV`], shared by every process that loads
//! either (CRIU with the plugin, the `cuda-checkpoint` utility, the workloads).
//!
//! ```text
//! <world>/world.toml        scripted config (driver, GPUs, faults)          -> config.rs
//! <world>/state.json        runtime state, versioned, updated under a lock  -> state.rs
//! <world>/procs/<id>.json   each CUDA process's entry in that state (by world id)
//! <world>/state.lock        flock(2) target serialising state updates
//! <world>/trace.log         one line per driver call                        -> trace.rs
//! <world>/timeouts.log      one line per request that timed out            -> timeouts.rs
//! <world>/errors.log        one line per world error answered as 304       -> timeouts.rs
//! <world>/lib/libcuda.so.1  the mock, with hidden symbols removed from its dynamic table
//! <world>/lib/libnvidia-ml.so.1  the NVML stand-in (unless `[nvml] present = false`)
//! <world>/devmem/           device memory of RUNNING/LOCKED processes, one file per allocation
//! <world>/mailbox/<id>/     requests to a target's restore thread (by world id)
//! <world>/transfers/        checkpoints and restores in progress            -> transfers.rs
//! ```
//!
//! Tools and tests create, reconfigure and inspect a world through [`client::MockWorld`] (the
//! `mock-world` program is its command line).
//!
//! A CUDA process is filed under its **world id**, and known by its namespace identity and
//! host pid (module [`pidns`]): a process in a container is found by its host pid, and a
//! process CRIU restored into new namespaces is still the same process of the world.

#![deny(unsafe_code)]

pub mod client;
pub mod config;
pub mod elf;
pub mod faults;
#[expect(unsafe_code, reason = "the one module allowed to hold unsafe code")]
pub mod ffi;
pub mod panic_guard;
pub mod pidns;
pub mod rates;
pub mod state;
pub mod sys;
pub mod timeouts;
pub mod trace;
pub mod transfers;

use crate::config::WorldConfig;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Every driver symbol the mock `libcuda.so.1` exports (what a world can hide; what a world
/// removes from its copy of the NVML stand-in, which links the same world code).
pub const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetUuid",
    "cuDeviceGetUuid_v2",
    "cuDeviceGetName",
    "cuDeviceTotalMem",
    "cuDeviceTotalMem_v2",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuGetExportTable",
    "cuCheckpointProcessGetRestoreThreadId",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
    "cuCtxCreate",
    "cuCtxCreate_v2",
    "cuCtxDestroy",
    "cuCtxDestroy_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxSynchronize",
    "cuMemAlloc",
    "cuMemAlloc_v2",
    "cuMemFree",
    "cuMemFree_v2",
    "cuMemcpyHtoD",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoD",
    "cuMemcpyDtoD_v2",
    "cuMemsetD8",
    "cuMemsetD8_v2",
    "cuMemGetInfo",
    "cuMemGetInfo_v2",
    "cuPointerGetAttribute",
    // CUDA 13.4 custom storage, and what its caller copies with.
    "cuCheckpointOperationComplete",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostRegister",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemcpyDtoHAsync",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyHtoDAsync",
    "cuMemcpyHtoDAsync_v2",
    "cuStreamCreate",
    "cuStreamDestroy",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
];

/// File name of the NVML stand-in in a world's `lib/`.
pub const NVML_LIB: &str = "libnvidia-ml.so.1";

/// Environment variable naming the world directory.
pub const WORLD_ENV: &str = "MOCK_CUDA_WORLD";

/// Errors about the world directory and its files. Each names the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    #[error("{WORLD_ENV} is not set: the mock driver has no world to impersonate")]
    NoWorld,
    #[error("mock world config {path}: {reason}")]
    Config { path: String, reason: String },
    #[error("mock world state {path}: {reason}")]
    State { path: String, reason: String },
    #[error("mock world {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("mock world lock {path}: not acquired within {ms} ms")]
    LockTimeout { path: String, ms: u64 },
    #[error("mock world library: {0}")]
    Library(String),
}

impl WorldError {
    /// An I/O error about `path`.
    pub fn io(path: &Path, source: std::io::Error) -> WorldError {
        WorldError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// An opened world.
#[derive(Debug)]
pub struct World {
    dir: PathBuf,
    config: WorldConfig,
    /// The world's host pid namespace, read from the state once.
    host_ns: std::sync::OnceLock<Option<u64>>,
}

impl World {
    /// Opens the world at `dir`, reading and validating its config.
    pub fn open(dir: &Path) -> Result<World, WorldError> {
        let path = dir.join("world.toml");
        let text = std::fs::read_to_string(&path).map_err(|e| WorldError::io(&path, e))?;
        let config = WorldConfig::parse(&text, &path.display().to_string())?;
        Ok(World {
            dir: dir.to_path_buf(),
            config,
            host_ns: std::sync::OnceLock::new(),
        })
    }

    /// The world named by [`WORLD_ENV`]. Opened once per thread and directory, and opened
    /// again when its `world.toml` changes (`mock-world configure`): a process restored onto
    /// "another host" must see that host's GPUs.
    ///
    /// The cache is the calling thread's own, not the process's: CRIU freezes a workload's
    /// threads at any point, and one frozen while it held a process-wide cache would block
    /// every other thread's next driver call, the restore thread's included (which must serve
    /// the driver while its task is frozen). The same holds for the parsed state
    /// ([`state`]'s caches).
    pub fn from_env() -> Result<Arc<World>, WorldError> {
        type Opened = Option<(Arc<World>, Option<std::time::SystemTime>)>;
        thread_local! {
            static CACHE: std::cell::RefCell<Opened> = const { std::cell::RefCell::new(None) };
        }
        let dir = std::env::var_os(WORLD_ENV)
            .filter(|d| !d.is_empty())
            .ok_or(WorldError::NoWorld)?;
        let stamp = std::fs::metadata(Path::new(&dir).join("world.toml"))
            .and_then(|m| m.modified())
            .ok();
        let hit = CACHE.with_borrow(|c| match c {
            Some((w, seen)) if w.dir.as_os_str() == dir && *seen == stamp => Some(Arc::clone(w)),
            _ => None,
        });
        if let Some(w) = hit {
            return Ok(w);
        }
        let w = Arc::new(World::open(Path::new(&dir))?);
        CACHE.set(Some((Arc::clone(&w), stamp)));
        Ok(w)
    }

    /// Creates (or re-creates) a world at `dir` from `config`: writes `world.toml`, a fresh
    /// state and trace (and removes an old `timeouts.log`), and `lib/libcuda.so.1` made from the mock library at `mock_so` with the
    /// world's hidden symbols removed from its dynamic symbol table. The NVML stand-in is
    /// installed separately ([`World::install_nvml`]).
    pub fn create(dir: &Path, config: &WorldConfig, mock_so: &Path) -> Result<World, WorldError> {
        let io = |p: &Path, e| WorldError::io(p, e);
        std::fs::create_dir_all(dir.join("lib")).map_err(|e| io(dir, e))?;
        for sub in ["devmem", "mailbox", "transfers", state::PROCS_DIR] {
            let p = dir.join(sub);
            if p.exists() {
                std::fs::remove_dir_all(&p).map_err(|e| io(&p, e))?;
            }
            std::fs::create_dir_all(&p).map_err(|e| io(&p, e))?;
        }
        // Round-trip through the validator so a world is never written from a bad config.
        let text = config.to_toml();
        let cfg_path = dir.join("world.toml");
        WorldConfig::parse(&text, &cfg_path.display().to_string())?;
        write_atomic(&cfg_path, text.as_bytes())?;
        // The host is where the world is made: pids of this pid namespace are host pids.
        let state = state::StateFile {
            host_pid_ns: pidns::own_pid_ns().unwrap_or(0),
            id_salt: random_salt(),
            ..state::StateFile::default()
        };
        state.store(dir)?;
        let trace = dir.join("trace.log");
        std::fs::write(&trace, b"").map_err(|e| io(&trace, e))?;
        // A re-created world starts without the old world's timeouts.
        for log in [timeouts::FILE, timeouts::ERRORS_FILE] {
            let log = dir.join(log);
            match std::fs::remove_file(&log) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&log, e)),
                _ => {}
            }
        }
        let hidden: Vec<&str> = DRIVER_SYMBOLS
            .iter()
            .copied()
            .filter(|s| !config.driver.exports(s))
            .collect();
        let lib = dir.join("lib").join("libcuda.so.1");
        install_patched(mock_so, &hidden, false, &lib)?;
        // A fresh world has NVML only once `install_nvml` puts it there.
        let nvml = dir.join("lib").join(NVML_LIB);
        match std::fs::remove_file(&nvml) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&nvml, e)),
            _ => {}
        }
        World::open(dir)
    }

    /// Replaces the config of an existing world, keeping its state and trace (e.g. to add a
    /// fault that names a process started in it). The library is regenerated when the set of
    /// hidden symbols changes. Every process sees the new config at its next call.
    pub fn reconfigure(
        dir: &Path,
        config: &WorldConfig,
        mock_so: Option<&Path>,
    ) -> Result<World, WorldError> {
        let old = World::open(dir)?;
        let text = config.to_toml();
        let cfg_path = dir.join("world.toml");
        WorldConfig::parse(&text, &cfg_path.display().to_string())?;
        let hidden = |c: &WorldConfig| -> Vec<&str> {
            DRIVER_SYMBOLS
                .iter()
                .copied()
                .filter(|s| !c.driver.exports(s))
                .collect()
        };
        if hidden(&old.config) != hidden(config) {
            let so = mock_so.ok_or_else(|| {
                WorldError::Library("the new config hides other symbols: the mock library is needed to rebuild lib/libcuda.so.1".into())
            })?;
            install_patched(
                so,
                &hidden(config),
                false,
                &dir.join("lib").join("libcuda.so.1"),
            )?;
        }
        write_atomic(&cfg_path, text.as_bytes())?;
        World::open(dir)
    }

    /// Installs `lib/libnvidia-ml.so.1` from the NVML stand-in at `nvml_so` when the config
    /// says `[nvml] present = true`, or removes it when it says `false` (`nvml_so` is then not
    /// read). The copy leaves out of its dynamic symbol table any driver symbol the stand-in
    /// might export, so `libnvidia-ml.so.1` serves NVML only.
    pub fn install_nvml(&self, nvml_so: Option<&Path>) -> Result<(), WorldError> {
        let lib = self.dir.join("lib").join(NVML_LIB);
        if !self.config.nvml.present {
            return match std::fs::remove_file(&lib) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(WorldError::io(&lib, e)),
                _ => Ok(()),
            };
        }
        let so = nvml_so.ok_or_else(|| {
            WorldError::Library(format!(
                "the config has [nvml] present = true, but no NVML stand-in (libmock_nvml.so) was given for {}",
                lib.display()
            ))
        })?;
        install_patched(so, DRIVER_SYMBOLS, true, &lib)
    }

    /// The world directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The scripted config.
    #[must_use]
    pub fn config(&self) -> &WorldConfig {
        &self.config
    }

    /// The world's `state` file.
    #[must_use]
    pub fn state_path(&self) -> PathBuf {
        self.dir.join("state.json")
    }

    /// The world's `lock` file.
    #[must_use]
    pub fn lock_path(&self) -> PathBuf {
        self.dir.join("state.lock")
    }

    /// The world's `trace` file.
    #[must_use]
    pub fn trace_path(&self) -> PathBuf {
        self.dir.join("trace.log")
    }

    /// The file holding one device allocation of a RUNNING or LOCKED process (by world id).
    #[must_use]
    pub fn devmem_path(&self, id: u64, alloc: u64) -> PathBuf {
        self.dir.join("devmem").join(format!("{id}-{alloc}.bin"))
    }

    /// The mailbox of a target's restore thread (by world id).
    #[must_use]
    pub fn mailbox_dir(&self, id: u64) -> PathBuf {
        self.dir.join("mailbox").join(id.to_string())
    }

    /// The pid namespace of the world's host (0 when unknown).
    #[must_use]
    pub fn host_pid_ns(&self) -> u64 {
        self.host_ns
            .get_or_init(|| self.read_own().ok().map(|s| s.host_pid_ns))
            .unwrap_or(0)
    }

    /// The host pid namespace if a read of the state has already found it, else 0. Never
    /// reads the state: the error log uses it, and a failed first read logs its error from
    /// inside [`Self::host_pid_ns`]'s initialisation.
    pub(crate) fn known_host_pid_ns(&self) -> u64 {
        self.host_ns.get().copied().flatten().unwrap_or(0)
    }

    /// Whether the caller's `/proc` shows the pids of the world's host: then a pid it finds is
    /// a host pid, and a process of the world it cannot find is gone.
    #[must_use]
    pub fn host_view(&self) -> bool {
        let host = self.host_pid_ns();
        host != 0 && pidns::proc_pid_ns() == Some(host)
    }

    /// Whether the caller lives in the world's host pid namespace (its `getpid()` is its host
    /// pid).
    #[must_use]
    pub fn in_host_ns(&self) -> bool {
        let host = self.host_pid_ns();
        host != 0 && pidns::own_pid_ns() == Some(host)
    }

    /// Where the process `p` of the world is, seen from the caller.
    #[must_use]
    pub fn locate(&self, p: &pidns::ProcessRef) -> pidns::Presence {
        pidns::locate(p, self.host_view())
    }
}

/// A salt for the world ids of a new world, from the kernel's random pool (the clock and the
/// pid when that cannot be read).
fn random_salt() -> u32 {
    use std::io::Read;
    let mut b = [0u8; 4];
    let drawn = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    let v = match drawn {
        Ok(()) => u32::from_le_bytes(b),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            t ^ std::process::id().rotate_left(16)
        }
    };
    v & ((1 << (44 - pidns::ID_COUNTER_BITS)) - 1)
}

/// Writes `bytes` to `path` through a temporary file and a rename, so readers never see a
/// partial file.
/// Puts at `dest` a copy of the library `src` with the dynamic symbols `hidden` hidden
/// ([`elf::hide_dynamic_symbols`]), replacing what was there. A name `src` does not export is
/// an error, or with `skip_absent` left alone.
///
/// The copy is hard-linked from a cache beside `src` (`.mock-world-libs/`, one file per
/// source and set of hidden names, keyed by the source's path, inode, size and modification
/// time): every world made from one build shares one copy on disk instead of writing tens of
/// MB each (debug builds of the stand-ins are 25-30 MB). A new build of `src` is a new key; the
/// cached copies are files of their own, so rebuilding `src` never changes a world's library.
/// Where the cache cannot be written or linked (another filesystem, a read-only build
/// directory), the copy is written at `dest` directly.
///
/// # Errors
/// `src` cannot be read or is not an ELF library, or `dest` cannot be written.
pub fn install_patched(
    src: &Path,
    hidden: &[&str],
    skip_absent: bool,
    dest: &Path,
) -> Result<(), WorldError> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(src).map_err(|e| WorldError::io(src, e))?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        src.canonicalize().unwrap_or_else(|_| src.to_path_buf()),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        hidden,
        skip_absent,
    )
        .hash(&mut h);
    let patch = || -> Result<Vec<u8>, WorldError> {
        let bad = |e: elf::ElfError| WorldError::Library(format!("{}: {e}", src.display()));
        let image = std::fs::read(src).map_err(|e| WorldError::io(src, e))?;
        let exported = if skip_absent {
            elf::exported_names(&image).map_err(bad)?
        } else {
            Vec::new()
        };
        let names: Vec<&str> = hidden
            .iter()
            .copied()
            .filter(|h| !skip_absent || exported.iter().any(|e| e == h))
            .collect();
        elf::hide_dynamic_symbols(&image, &names).map_err(bad)
    };
    let cached = src.parent().map(|d| {
        d.join(".mock-world-libs").join(format!(
            "{}.{:016x}",
            src.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            h.finish()
        ))
    });
    if let Some(c) = cached {
        let ready = c.exists()
            || (|| {
                let dir = c.parent()?;
                std::fs::create_dir_all(dir).ok()?;
                write_atomic(&c, &patch().ok()?).ok()
            })()
            .is_some();
        // Linked under a temporary name, then renamed over `dest`: a reader sees the old file
        // or the new one.
        let tmp = unique_beside(dest, "link");
        if ready && std::fs::hard_link(&c, &tmp).is_ok() {
            return std::fs::rename(&tmp, dest).map_err(|e| WorldError::io(dest, e));
        }
    }
    write_atomic(dest, &patch()?)
}

pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), WorldError> {
    let tmp = unique_beside(path, "tmp");
    std::fs::write(&tmp, bytes).map_err(|e| WorldError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| WorldError::io(path, e))
}

/// A name beside `path` that no other writer uses at the same time: its file name with `.KIND.`,
/// this process's id and a number of this process's own appended (so that two threads, or two
/// files of one stem, never share it).
fn unique_beside(path: &Path, kind: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{kind}.{}.{n}", std::process::id()));
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn patched_libraries_are_shared_through_a_cache_and_follow_a_rebuild() {
        let tmp = tempfile::tempdir().unwrap();
        let build = tmp.path().join("build");
        std::fs::create_dir(&build).unwrap();
        // Any ELF stands in for a built library: the test executable.
        let src = build.join("libstand-in.so");
        std::fs::copy("/proc/self/exe", &src).unwrap();
        let (a, b, c) = (
            tmp.path().join("a.so"),
            tmp.path().join("b.so"),
            tmp.path().join("c.so"),
        );
        let hidden = ["cuNoSuchSymbol"];
        install_patched(&src, &hidden, true, &a).unwrap();
        install_patched(&src, &hidden, true, &b).unwrap();
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(ino(&a), ino(&b), "one copy on disk for one build");
        assert_ne!(ino(&a), ino(&src), "the copy is not the build's own file");
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&src).unwrap());
        // A name the library lacks is an error unless it may be absent.
        assert!(install_patched(&src, &hidden, false, &c).is_err());
        // A rebuild is another key: worlds made before keep their copy.
        std::fs::write(&src, std::fs::read("/proc/self/exe").unwrap()).unwrap();
        let t = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&src)
            .unwrap()
            .set_modified(t)
            .unwrap();
        install_patched(&src, &hidden, true, &c).unwrap();
        assert_ne!(ino(&c), ino(&a));
        // Without a usable cache the copy is written in place.
        std::fs::remove_dir_all(build.join(".mock-world-libs")).unwrap();
        std::fs::write(build.join(".mock-world-libs"), "not a directory").unwrap();
        let d = tmp.path().join("d.so");
        install_patched(&src, &hidden, true, &d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().nlink(), 1);
        assert_eq!(std::fs::read(&d).unwrap(), std::fs::read(&src).unwrap());
    }

    /// Worlds made at once from one library with other hidden names (tests run in threads)
    /// each get their own copy: no two writers share a temporary file.
    #[test]
    fn worlds_made_at_once_get_each_their_own_patched_library() {
        let libc = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/aarch64-linux-gnu/libc.so.6",
            "/lib64/libc.so.6",
        ]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists());
        let Some(libc) = libc else {
            eprintln!("note: no libc.so.6 found to patch; nothing to check");
            return;
        };
        // A few rounds, each with a cold cache: the writers race only while it fills.
        for _ in 0..4 {
            at_once(libc);
        }
    }

    fn at_once(libc: &Path) {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("libc.so.6");
        std::fs::copy(libc, &src).unwrap();
        let sets: [&[&str]; 2] = [&["puts"], &["printf"]];
        std::thread::scope(|sc| {
            for i in 0..16 {
                let (src, dir) = (&src, tmp.path());
                sc.spawn(move || {
                    let dest = dir.join(format!("world{i}.so"));
                    install_patched(src, sets[i % 2], false, &dest).unwrap();
                });
            }
        });
        for i in 0..16 {
            let names = elf::exported_names(
                &std::fs::read(tmp.path().join(format!("world{i}.so"))).unwrap(),
            )
            .unwrap();
            let (gone, kept) = if i % 2 == 0 {
                ("puts", "printf")
            } else {
                ("printf", "puts")
            };
            assert!(!names.iter().any(|n| n == gone), "world {i} exports {gone}");
            assert!(names.iter().any(|n| n == kept), "world {i} lacks {kept}");
        }
    }
}
