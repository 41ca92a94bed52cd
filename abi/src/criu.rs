//! CRIU's plugin ABI (`criu/include/criu-plugin.h`), as the plugin loader of CRIU 4.1, 4.2 and the
//! development line read it.
//!
//! The descriptor's hook array is declared at [`HOOK_COUNT_BUILD`] slots (every hook this project
//! knows, up to the proposed `DUMP_FINISH`). CRIU reads only the first `max_hooks` slots and
//! refuses a descriptor whose `max_hooks` exceeds its own hook count, so a plugin lowers
//! `max_hooks` to the host's count at load time (see [`host_hook_count_from_ctl_size`]).

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `CRIU_PLUGIN_VERSION_OLD`: a descriptor CRIU synthesised itself and frees in `cr_plugin_fini`.
/// A static descriptor must never carry it.
pub const CRIU_PLUGIN_VERSION_OLD: c_uint = 0x100;
/// Plugin ABI version 0.2.0 (`(0 << 16) | (2 << 8) | 0`), accepted by CRIU 4.x.
pub const CRIU_PLUGIN_VERSION: c_uint = 0x200;

/// Encodes a plugin ABI version the way `CRIU_PLUGIN_VERSION` does.
#[must_use]
pub const fn plugin_version(major: u32, minor: u32, sublevel: u32) -> c_uint {
    (major << 16) | (minor << 8) | sublevel
}

/// A hook number (`CR_PLUGIN_HOOK__*`), an index into [`CrPluginDesc::hooks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct Hook(pub usize);

impl Hook {
    pub const DUMP_UNIX_SK: Hook = Hook(0);
    pub const RESTORE_UNIX_SK: Hook = Hook(1);
    pub const DUMP_EXT_FILE: Hook = Hook(2);
    pub const RESTORE_EXT_FILE: Hook = Hook(3);
    pub const DUMP_EXT_MOUNT: Hook = Hook(4);
    pub const RESTORE_EXT_MOUNT: Hook = Hook(5);
    pub const DUMP_EXT_LINK: Hook = Hook(6);
    pub const HANDLE_DEVICE_VMA: Hook = Hook(7);
    pub const UPDATE_VMA_MAP: Hook = Hook(8);
    /// `int (int pid)`: restore, main criu process, task still ptrace-stopped.
    pub const RESUME_DEVICES_LATE: Hook = Hook(9);
    /// `int (int pid)`: dump, task still running, just before it is seized.
    pub const PAUSE_DEVICES: Hook = Hook(10);
    /// `int (int pid)`: dump, whole tree seized.
    pub const CHECKPOINT_DEVICES: Hook = Hook(11);
    /// `int (void)`: restore, once after forking (CRIU 4.2+).
    pub const POST_FORKING: Hook = Hook(12);
    /// `int (void)`: restore, once after every plugin's `init` (development line).
    pub const RESTORE_INIT: Hook = Hook(13);
    /// `int (int root_pid)`: dump, once after every task was dumped (development line).
    pub const DUMP_DEVICES_LATE: Hook = Hook(14);
    /// `int (int family, int state, u32 *src, u32 *dst)` (merged upstream after 4.2).
    pub const UPDATE_INETSK: Hook = Hook(15);
    /// `int (int ret)`: dump, before finalisation, tasks still frozen (proposed, #3076 series).
    pub const DUMP_FINISH: Hook = Hook(16);

    /// Every hook this crate knows, in number order.
    pub const ALL: [Hook; HOOK_COUNT_BUILD] = [
        Self::DUMP_UNIX_SK,
        Self::RESTORE_UNIX_SK,
        Self::DUMP_EXT_FILE,
        Self::RESTORE_EXT_FILE,
        Self::DUMP_EXT_MOUNT,
        Self::RESTORE_EXT_MOUNT,
        Self::DUMP_EXT_LINK,
        Self::HANDLE_DEVICE_VMA,
        Self::UPDATE_VMA_MAP,
        Self::RESUME_DEVICES_LATE,
        Self::PAUSE_DEVICES,
        Self::CHECKPOINT_DEVICES,
        Self::POST_FORKING,
        Self::RESTORE_INIT,
        Self::DUMP_DEVICES_LATE,
        Self::UPDATE_INETSK,
        Self::DUMP_FINISH,
    ];

    /// The upstream identifier without the `CR_PLUGIN_HOOK__` prefix.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self.0 {
            0 => "DUMP_UNIX_SK",
            1 => "RESTORE_UNIX_SK",
            2 => "DUMP_EXT_FILE",
            3 => "RESTORE_EXT_FILE",
            4 => "DUMP_EXT_MOUNT",
            5 => "RESTORE_EXT_MOUNT",
            6 => "DUMP_EXT_LINK",
            7 => "HANDLE_DEVICE_VMA",
            8 => "UPDATE_VMA_MAP",
            9 => "RESUME_DEVICES_LATE",
            10 => "PAUSE_DEVICES",
            11 => "CHECKPOINT_DEVICES",
            12 => "POST_FORKING",
            13 => "RESTORE_INIT",
            14 => "DUMP_DEVICES_LATE",
            15 => "UPDATE_INETSK",
            16 => "DUMP_FINISH",
            _ => "UNKNOWN",
        }
    }
}

/// Hook slots in a descriptor built by this project (`CR_PLUGIN_HOOK__MAX` of the newest header
/// we know, the #3076 line).
pub const HOOK_COUNT_BUILD: usize = 17;

/// `CR_PLUGIN_HOOK__MAX` of the CRIU lines we support.
pub mod host_hooks {
    /// CRIU 4.0 and 4.1.
    pub const CRIU_4_1: u32 = 12;
    /// CRIU 4.2 (adds POST_FORKING).
    pub const CRIU_4_2: u32 = 13;
    /// Upstream development line after 4.2 (RESTORE_INIT, DUMP_DEVICES_LATE, UPDATE_INETSK).
    pub const UPSTREAM: u32 = 16;
    /// The #3076 series (adds DUMP_FINISH).
    pub const PR_3076: u32 = 17;
}

/// Operation stage passed to `init` and `exit` (`enum cr_plugin_stage`-like constants).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Stage(pub c_int);

impl Stage {
    pub const DUMP: Stage = Stage(0);
    pub const PRE_DUMP: Stage = Stage(1);
    pub const RESTORE: Stage = Stage(2);

    /// Lowercase name, for logs.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self.0 {
            0 => "dump",
            1 => "pre-dump",
            2 => "restore",
            _ => "unknown",
        }
    }
}

/// `print_on_level` levels (`criu/include/log.h`).
pub mod log_level {
    pub const MSG: u32 = 0;
    pub const ERROR: u32 = 1;
    pub const WARN: u32 = 2;
    pub const INFO: u32 = 3;
    pub const DEBUG: u32 = 4;
}

/// `int init(int stage)`.
pub type InitFn = unsafe extern "C" fn(stage: c_int) -> c_int;
/// `void exit(int stage, int ret)`.
pub type ExitFn = unsafe extern "C" fn(stage: c_int, ret: c_int);
/// `int hook(int pid)`: PAUSE_DEVICES, CHECKPOINT_DEVICES, RESUME_DEVICES_LATE,
/// DUMP_DEVICES_LATE (root pid) and DUMP_FINISH (dump result).
pub type PidHookFn = unsafe extern "C" fn(pid: c_int) -> c_int;
/// `int hook(void)`: RESTORE_INIT and POST_FORKING.
pub type VoidHookFn = unsafe extern "C" fn() -> c_int;

/// `cr_plugin_desc_t`.
#[repr(C)]
#[derive(Debug)]
pub struct CrPluginDesc {
    pub name: *const c_char,
    pub init: Option<InitFn>,
    pub exit: Option<ExitFn>,
    pub version: c_uint,
    pub max_hooks: c_uint,
    pub hooks: [*mut c_void; HOOK_COUNT_BUILD],
}

// SAFETY: the descriptor only holds pointers to static code and data, which are
// valid from every thread.
unsafe impl Sync for CrPluginDesc {}

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(offset_of!(CrPluginDesc, name) == 0);
    assert!(offset_of!(CrPluginDesc, init) == 8);
    assert!(offset_of!(CrPluginDesc, exit) == 16);
    assert!(offset_of!(CrPluginDesc, version) == 24);
    assert!(offset_of!(CrPluginDesc, max_hooks) == 28);
    assert!(offset_of!(CrPluginDesc, hooks) == 32);
    assert!(size_of::<CrPluginDesc>() == 32 + 8 * HOOK_COUNT_BUILD);
    assert!(align_of::<CrPluginDesc>() == 8);
};

/// Size in bytes of CRIU's exported `cr_plugin_ctl` for a host with `hooks` hook numbers: one
/// list head for the plugin list plus one per hook, 16 bytes each on LP64.
#[must_use]
pub const fn ctl_size_for_hooks(hooks: u32) -> usize {
    16 * (hooks as usize + 1)
}

/// The host's `CR_PLUGIN_HOOK__MAX`, read back from the ELF size of `cr_plugin_ctl`. `None` when
/// the size is not a whole number of list heads or names no hook at all.
#[must_use]
pub const fn host_hook_count_from_ctl_size(size: usize) -> Option<u32> {
    if size < 32 || !size.is_multiple_of(16) {
        return None;
    }
    let n = size / 16 - 1;
    if n > u32::MAX as usize {
        return None;
    }
    Some(n as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctl_size_round_trips_for_known_hosts() {
        for hooks in [
            host_hooks::CRIU_4_1,
            host_hooks::CRIU_4_2,
            host_hooks::UPSTREAM,
            host_hooks::PR_3076,
        ] {
            assert_eq!(
                host_hook_count_from_ctl_size(ctl_size_for_hooks(hooks)),
                Some(hooks)
            );
        }
        // Debian's criu 4.1.1 exports cr_plugin_ctl with st_size 0xd0.
        assert_eq!(host_hook_count_from_ctl_size(0xd0), Some(12));
        assert_eq!(host_hook_count_from_ctl_size(0), None);
        assert_eq!(host_hook_count_from_ctl_size(0xd8), None);
    }

    #[test]
    fn hook_numbers_match_upstream() {
        for (i, h) in Hook::ALL.iter().enumerate() {
            assert_eq!(h.0, i);
            assert_ne!(h.name(), "UNKNOWN");
        }
        assert_eq!(Hook::PAUSE_DEVICES.0, 10);
        assert_eq!(Hook::RESTORE_INIT.0, 13);
        assert_eq!(Hook::DUMP_DEVICES_LATE.0, 14);
        assert_eq!(Hook::UPDATE_INETSK.0, 15);
        assert_eq!(Hook::DUMP_FINISH.0, 16);
        assert_eq!(plugin_version(0, 2, 0), CRIU_PLUGIN_VERSION);
        assert_ne!(CRIU_PLUGIN_VERSION, CRIU_PLUGIN_VERSION_OLD);
    }
}

/// Fields of CRIU's exported `opts` (`struct cr_options`) that are stable across CRIU 4.1,
/// 4.2 and the development line on x86-64. Other fields move between versions: do not read
/// them.
pub mod opts {
    /// Size of the `opts` object in Debian's CRIU 4.1.1 (the smallest we support).
    pub const MIN_SIZE: usize = 0x1f8;
    /// `int final_state` (one of [`TASK_ALIVE`], [`TASK_DEAD`], [`TASK_STOPPED`]).
    pub const FINAL_STATE: usize = 0;
    /// `unsigned int timeout`, seconds (`--timeout`, default 10).
    pub const TIMEOUT: usize = 0x160;
    /// `final_state` after the dump with `--leave-running` (and for pre-dump).
    pub const TASK_ALIVE: i32 = 1;
    /// `final_state` of a plain dump: the tree is killed.
    pub const TASK_DEAD: i32 = 2;
    /// `final_state` with `--leave-stopped`.
    pub const TASK_STOPPED: i32 = 3;
}

/// CRIU fault injection (`CRIU_FAULT`, read through the exported `fi_strategy`).
pub mod fault {
    /// `FI_PLUGIN_CUDA_FORCE_ENABLE`: run the CUDA plugin without an NVIDIA GPU.
    pub const PLUGIN_CUDA_FORCE_ENABLE: i32 = 138;
}

/// compel's `struct seize_task_status` (`compel/include/uapi/infect.h`, 4.1.1 through criu-dev):
/// what `compel_wait_task`'s `get_status` callback fills for a task being seized.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeizeTaskStatus {
    /// `SigPnd`: signals pending for the thread.
    pub sigpnd: u64,
    /// `ShdPnd`: signals pending for the process.
    pub shdpnd: u64,
    /// `SigBlk`: blocked signals.
    pub sigblk: u64,
    /// The first letter of `State` (`R`, `S`, `t`, `Z`, ...).
    pub state: c_char,
    /// The pid in the innermost pid namespace (`NSpid`'s last entry).
    pub vpid: c_int,
    /// `PPid`.
    pub ppid: c_int,
    /// `Seccomp`: 0 disabled, 1 strict, 2 filter.
    pub seccomp_mode: c_int,
}

/// `PROC_CAP_SIZE`: 32-bit words per capability set in `struct proc_status_creds`.
pub const PROC_CAP_SIZE: usize = 2;

/// CRIU's `struct proc_status_creds` (`criu/include/proc_parse.h`, the same in 4.1.1 and
/// 4.2.1): `parse_pid_status(pid, ss, data)` takes `ss` to be the `s` member of one of these
/// (`container_of`) and fills the credentials after it too, so callers pass a whole one.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcStatusCreds {
    /// What `compel_wait_task` reads.
    pub s: SeizeTaskStatus,
    /// `Uid`: real, effective, saved, filesystem.
    pub uids: [c_uint; 4],
    /// `Gid`: real, effective, saved, filesystem.
    pub gids: [c_uint; 4],
    /// Not filled by `parse_pid_status`.
    pub last_filter: u32,
    /// `CapInh`, low word first.
    pub cap_inh: [u32; PROC_CAP_SIZE],
    /// `CapPrm`.
    pub cap_prm: [u32; PROC_CAP_SIZE],
    /// `CapEff`.
    pub cap_eff: [u32; PROC_CAP_SIZE],
    /// `CapBnd`.
    pub cap_bnd: [u32; PROC_CAP_SIZE],
    /// `CapAmb`.
    pub cap_amb: [u32; PROC_CAP_SIZE],
}

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(offset_of!(SeizeTaskStatus, state) == 24);
    assert!(offset_of!(SeizeTaskStatus, vpid) == 28);
    assert!(offset_of!(SeizeTaskStatus, seccomp_mode) == 36);
    assert!(size_of::<SeizeTaskStatus>() == 40);
    assert!(offset_of!(ProcStatusCreds, uids) == 40);
    assert!(offset_of!(ProcStatusCreds, gids) == 56);
    assert!(offset_of!(ProcStatusCreds, last_filter) == 72);
    assert!(offset_of!(ProcStatusCreds, cap_inh) == 76);
    assert!(offset_of!(ProcStatusCreds, cap_amb) == 108);
    assert!(size_of::<ProcStatusCreds>() == 120);
    assert!(align_of::<ProcStatusCreds>() == 8);
};

/// `compel_wait_task`'s results (`compel/include/uapi/task-state.h`).
pub mod compel_task {
    /// Stopped by the seize (`PTRACE_EVENT_STOP` with `SIGTRAP`): it was running.
    pub const ALIVE: i32 = 0x01;
    /// It exited (not a zombie of ours any more).
    pub const DEAD: i32 = 0x02;
    /// It was stopped by a stop signal before the seize.
    pub const STOPPED: i32 = 0x03;
    /// A zombie.
    pub const ZOMBIE: i32 = 0x06;
}

/// `img_streamer_open(name, flags)`: CRIU `BUG()`s on any other flag value.
pub mod streamer {
    /// `O_DUMP`: `O_WRONLY | O_CREAT | O_TRUNC` on Linux.
    pub const O_DUMP: i32 = 0o1 | 0o100 | 0o1000;
    /// `O_RSTR`: `O_RDONLY`.
    pub const O_RSTR: i32 = 0;
}

/// Declarative option metadata a plugin may export as `CR_PLUGIN_OPTIONS_META`, next to
/// `CR_PLUGIN_DESC`, so tools can list its `--plugin-option`s without calling `init`
/// (a criu-cuda convention, documented in `docs/plugin-interface.md`).
///
/// ```c
/// struct cr_plugin_option_meta {     /* 32 bytes */
///     const char *name;              /* "backend" (without "PLUGIN.") */
///     const char *value_syntax;      /* "auto|driver-api|cuda-checkpoint"; NULL: bare flag */
///     const char *default_value;     /* NULL: no default */
///     const char *help;              /* one line; may be NULL */
/// };
/// struct cr_plugin_options_meta {    /* 16 bytes */
///     unsigned int version;          /* 1 */
///     unsigned int count;
///     const struct cr_plugin_option_meta *options;
/// };
/// ```
pub mod options_meta {
    use std::ffi::c_char;

    /// The exported symbol's name.
    pub const SYMBOL: &str = "CR_PLUGIN_OPTIONS_META";
    /// The only layout version defined so far; readers ignore other versions.
    pub const VERSION: u32 = 1;
    /// An upper bound on `count`, against garbage.
    pub const MAX_COUNT: u32 = 256;

    /// `struct cr_plugin_option_meta`.
    #[repr(C)]
    #[derive(Debug)]
    pub struct CrPluginOptionMeta {
        pub name: *const c_char,
        pub value_syntax: *const c_char,
        pub default_value: *const c_char,
        pub help: *const c_char,
    }

    /// `struct cr_plugin_options_meta`.
    #[repr(C)]
    #[derive(Debug)]
    pub struct CrPluginOptionsMeta {
        pub version: u32,
        pub count: u32,
        pub options: *const CrPluginOptionMeta,
    }

    // SAFETY: the metadata only points at static, immutable strings and entries.
    unsafe impl Sync for CrPluginOptionMeta {}
    // SAFETY: as above.
    unsafe impl Sync for CrPluginOptionsMeta {}

    const _: () = {
        use std::mem::{offset_of, size_of};
        assert!(size_of::<CrPluginOptionMeta>() == 32);
        assert!(offset_of!(CrPluginOptionMeta, value_syntax) == 8);
        assert!(offset_of!(CrPluginOptionMeta, default_value) == 16);
        assert!(offset_of!(CrPluginOptionMeta, help) == 24);
        assert!(size_of::<CrPluginOptionsMeta>() == 16);
        assert!(offset_of!(CrPluginOptionsMeta, count) == 4);
        assert!(offset_of!(CrPluginOptionsMeta, options) == 8);
    };
}

/// `RTLD_DL_SYMENT` for `dladdr1`: ask for the symbol's ELF entry (to read `cr_plugin_ctl`'s
/// size).
pub const RTLD_DL_SYMENT: i32 = 1;

#[cfg(test)]
mod more_tests {
    #[test]
    fn streamer_flags_match_the_c_library() {
        assert_eq!(
            super::streamer::O_DUMP,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC
        );
        assert_eq!(super::streamer::O_RSTR, libc::O_RDONLY);
        assert_eq!(super::RTLD_DL_SYMENT, 1);
    }
}
