//! `cuda_plugin.so`: a CRIU plugin that checkpoints and restores the CUDA state of the processes
//! CRIU dumps, through the CUDA driver API (`cuCheckpointProcess*`, CUDA 13.0+) or NVIDIA's
//! `cuda-checkpoint` utility (r555+).
//!
//! # Design
//!
//! One `.so` loads into CRIU 4.1, 4.2 and the development lines: the descriptor declares every
//! hook this project knows and a load-time constructor lowers `max_hooks` to the host's count
//! ([`hooks`]). Nothing of CRIU or CUDA is linked: CRIU's services are found with
//! `dlsym(RTLD_DEFAULT)` and `libcuda.so.1` is opened with `dlopen`, so a missing symbol degrades
//! with a logged reason instead of aborting CRIU.
//!
//! The crate is layered so that everything but the thin FFI edge is plain, tested Rust:
//!
//! | Module | Role |
//! |---|---|
//! | [`entry`] | The top: the descriptor, the constructor and the `extern "C"` entry points with their panic guard, each only translating for one function of [`session::run`]. |
//! | [`ffi`] | The bottom: thin, safe wrappers over CRIU's services, the driver library, NVML, ptrace and the child-process descriptor hygiene, with all of the `unsafe` but [`entry`]'s. |
//! | [`session`] | What `init(stage)` decides: disabled or enabled, with which backend ([`select`]) and settings ([`options`], [`gpu_map`]); [`session::run`]: the state between `init` and `exit`, `init`'s orchestration (the helper, the engine) and what each hook does with it. |
//! | [`engine`] | The per-task lifecycle: PAUSE, CHECKPOINT, DUMP_FINISH/exit rollback, RESUME. |
//! | [`backend`] | The [`backend::Backend`] trait and its two implementations. |
//! | [`thread`] | The [`thread::ThreadControl`] seam: running only the restore thread of a stopped task. |
//! | [`timing`] | Where a hook's time goes: the backend and restore-thread control, timed at their seams. |
//! | [`host`] | The [`host::Host`] seam: CRIU's logging, inventory and image files. |
//! | [`image`] | The per-task image written at dump and read at restore. |
//! | [`inventory`] | The GPU inventory image: the GPUs the dump saw. |
//! | [`gpu_map`] | `device-map`: the grammar, and its resolution against the inventory and this host's GPUs. |
//! | [`error`] | The top-level error and its single translation to a negative errno. |
//! | [`worker`] | Driver calls on a worker thread with a deadline, and the one rule for calls abandoned on timeout. |
//! | [`agent`] | CRIU's side of the helper process (driver calls outside CRIU, so CRIU stays single-threaded): the protocol, the link, typed errors. |
//! | [`helper`] | The helper process itself: its start, its main loop, the guardian that puts tasks back when CRIU dies. |
//! | [`nvml`](mod@nvml) | Sizes: GPU memory per task (NVML), host- and GPU-memory checks, deadlines that grow with the data. |
//! | [`message`] | Keeping every message handed to CRIU short (CRIU's buffer is 8 KiB). |
//! | [`env`](mod@env) | Every environment variable the plugin reads. |
//! | [`cstore`] | Custom storage: the GPU-memory image files and the copies between them and the GPUs. |
//! | [`config`] | The plugin's options file, `cuda_plugin.conf`: where it is looked for, its format. |
//! | [`trust`] | Which options files and programs the plugin trusts (sshd's `StrictModes` rule). |
//! | [`task`] | The ids CRIU hands the hooks ([`task::Pid`], [`task::Tid`]). |
//!
//! # Entry points and return values
//!
//! | Entry point | Returns |
//! |---|---|
//! | `init(stage)` | 0 (also when disabled); a negative errno for invalid options (or options file) or when a required backend is unavailable |
//! | PAUSE_DEVICES, CHECKPOINT_DEVICES, RESUME_DEVICES_LATE `(pid)` | 0 handled; `-ENOTSUP` not a CUDA task or plugin disabled; another negative errno on failure |
//! | DUMP_FINISH `(ret)` (hook 16, where the host has it) | 0, or a negative errno when some task could not be put back |
//! | `exit(stage, ret)` | nothing; at dump, runs the rollback if DUMP_FINISH did not |
//!
//! A panic in any entry point is caught, logged, and turned into -1 (`init`, hooks) or ignored
//! (`exit`).

#![deny(unsafe_code)]

pub mod agent;
pub mod backend;
pub mod config;
pub mod cstore;
pub mod engine;
#[allow(unsafe_code)]
pub mod entry;
pub mod env;
pub mod error;
#[allow(unsafe_code)]
pub mod ffi;
pub mod gpu_map;
pub mod helper;
pub mod hooks;
pub mod host;
pub mod image;
pub mod inventory;
pub mod machine;
pub mod message;
pub mod nvml;
pub mod options;
pub mod select;
pub mod session;
pub mod task;
pub mod thread;
pub mod timing;
pub mod trust;
pub mod worker;

/// The plugin's name: the descriptor's `name`, the inventory entry and the option namespace.
pub const PLUGIN_NAME: &str = "cuda_plugin";
/// The plugin's version, for the init log: the crate's version (`version` in the workspace's
/// `Cargo.toml`), so the reported version, the release tarballs' names and the git tag
/// (`v<version>`) are one number.
pub const PLUGIN_VERSION: &str = env!("CARGO_PKG_VERSION");
