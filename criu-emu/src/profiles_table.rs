//! The emulated CRIU profiles' facts, written down once.
//!
//! `build.rs` includes this file (`#[path]`) to compile the C host shim per profile and to write
//! each engine's dynamic list; [`crate::profile`] reads it for the profile's methods; a unit test
//! there checks the `[[bin]]` entries of `harness/Cargo.toml` against it. Plain data with no
//! dependencies, so the build script can compile it too.

/// What a real CRIU of one profile fixes at build and link time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileFacts {
    /// The name on the command line (`--host`) and in [`std::fmt::Display`].
    pub tag: &'static str,
    /// The engine executable (a `[[bin]]` of `harness/Cargo.toml`).
    pub bin: &'static str,
    /// `CR_PLUGIN_HOOK__MAX` (the ELF size of `cr_plugin_ctl` is this many pointers).
    pub hooks: u32,
    /// `sizeof(struct cr_options)` on x86_64, the ELF size of the exported `opts`.
    pub opts_size: usize,
    /// Offset of `opts.stream` in `struct cr_options` on x86_64.
    pub stream_offset: usize,
    /// Whether the host exports `has_inventory_plugin`.
    pub inventory_query: bool,
    /// Whether the host exports `criu_plugin_get_options`.
    pub plugin_options: bool,
    /// Whether the host applies the newer dispatch and failure rules (otherwise 4.1's).
    pub newer_rules: bool,
}

/// Every profile, oldest first, in the order of `HostProfile::ALL`.
pub const PROFILES: [ProfileFacts; 4] = [
    // CRIU 4.0/4.1 (Debian's 4.1.1).
    ProfileFacts {
        tag: "4.1",
        bin: "harness-engine-41",
        hooks: 12,
        opts_size: 0x1f8,
        stream_offset: 0x194,
        inventory_query: false,
        plugin_options: false,
        newer_rules: false,
    },
    // CRIU 4.2: POST_FORKING; `allow_uprobes` added, `stream` moved.
    ProfileFacts {
        tag: "4.2",
        bin: "harness-engine-42",
        hooks: 13,
        opts_size: 0x200,
        stream_offset: 0x198,
        inventory_query: false,
        plugin_options: false,
        newer_rules: false,
    },
    // The development line after 4.2.
    ProfileFacts {
        tag: "upstream",
        bin: "harness-engine-upstream",
        hooks: 16,
        opts_size: 0x200,
        stream_offset: 0x198,
        inventory_query: true,
        plugin_options: true,
        newer_rules: true,
    },
    // The #3076 series: DUMP_FINISH.
    ProfileFacts {
        tag: "pr3076",
        bin: "harness-engine-pr3076",
        hooks: 17,
        opts_size: 0x200,
        stream_offset: 0x198,
        inventory_query: true,
        plugin_options: true,
        newer_rules: true,
    },
];

/// Host symbols every profile exports.
pub const COMMON_SYMBOLS: &[&str] = &[
    "print_on_level",
    "log_get_loglevel",
    "add_inventory_plugin",
    "check_and_remove_inventory_plugin",
    "check_inventory_plugins",
    "criu_get_image_dir",
    "set_compel_interrupt_only_mode",
    "alarm_timeouted",
    "img_streamer_open",
    "cr_plugin_ctl",
    "opts",
    "fi_strategy",
    // CRIU and compel functions CRIU 4.1/4.2's C plugins link against (cuda_plugin.c:
    // close_fds, compel_wait_task, parse_pid_status; amdgpu: find_unused_fd_pid). Debian's
    // criu 4.1.1 and 4.2.1 export all four (harness/tests/criu_symbols.rs checks).
    "close_fds",
    "compel_wait_task",
    "parse_pid_status",
    "find_unused_fd_pid",
];

impl ProfileFacts {
    /// Every host symbol this profile's engine exports: [`COMMON_SYMBOLS`] and its optional ones.
    #[must_use]
    pub fn exported_symbols(&self) -> Vec<&'static str> {
        let mut symbols = COMMON_SYMBOLS.to_vec();
        if self.inventory_query {
            symbols.push("has_inventory_plugin");
        }
        if self.plugin_options {
            symbols.push("criu_plugin_get_options");
        }
        symbols
    }
}
