//! CRIU's plugin engine, emulated: loads CRIU plugins exactly as CRIU does and drives them
//! through dump, pre-dump and restore of real process trees, on an emulated host profile. The
//! `harness` crate (the scenario runner, the kit, the sweep) runs its engine executables.
//!
//! * [`profile`], [`profiles_table`]: the emulated hosts (4.1, 4.2, upstream, pr3076) and the
//!   rule sets.
//! * [`engine`]: the loader, dispatch and the lifecycles.
//! * [`pstree`], [`procfs`]: freezing and releasing process trees with ptrace; `/proc`.
//! * [`host`]: the state behind the exported host services.
//! * [`inventory`], [`images`], [`options`], [`meta`]: the inventory file and required-plugin
//!   list, image directories and the image streamer, `--plugin-option`, option metadata.
//! * [`log`], [`trace`]: CRIU-style logs and the normalised call trace.
//! * [`cli`]: the command line shared by the engine executables.
//! * [`compel`]: the CRIU and compel functions C plugins link against (`compel_wait_task`,
//!   `parse_pid_status`, `find_unused_fd_pid`).
//! * `ffi`: every `unsafe` block (dlopen and plugin calls, the exported host callbacks).
//!
//! The host symbols plugins look up are defined by a C shim (`csrc/host.c`) linked into each
//! `harness-engine-<profile>` executable (see `build.rs` and `docs/plugin-interface.md`).

#![deny(unsafe_code)]

pub mod log;
pub mod trace;

pub mod cli;
pub mod compel;
pub mod engine;
#[expect(
    unsafe_code,
    reason = "the one module tree allowed to hold unsafe code"
)]
pub mod ffi;
pub mod host;
pub mod images;
pub mod inventory;
pub mod meta;
pub mod options;
pub mod procfs;
pub mod profile;
pub mod profiles_table;
pub mod pstree;
