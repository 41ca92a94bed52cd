//! Builds the C host shim once per emulated CRIU profile and links each object into its engine
//! executable, exporting exactly the host symbols through a per-profile dynamic list.
//!
//! The object is passed as a per-binary link argument (not a static library) so that it is always
//! linked whole, and `--dynamic-list` both exports its symbols and keeps them from section GC.

use std::fmt::Write as _;
use std::path::PathBuf;

struct Profile {
    bin: &'static str,
    tag: &'static str,
    hooks: u32,
    opts_size: u32,
    inventory_query: bool,
    plugin_options: bool,
}

const PROFILES: &[Profile] = &[
    Profile {
        bin: "harness-engine-41",
        tag: "41",
        hooks: 12,
        opts_size: 0x1f8,
        inventory_query: false,
        plugin_options: false,
    },
    Profile {
        bin: "harness-engine-42",
        tag: "42",
        hooks: 13,
        opts_size: 0x200,
        inventory_query: false,
        plugin_options: false,
    },
    Profile {
        bin: "harness-engine-upstream",
        tag: "upstream",
        hooks: 16,
        opts_size: 0x200,
        inventory_query: true,
        plugin_options: true,
    },
    Profile {
        bin: "harness-engine-pr3076",
        tag: "pr3076",
        hooks: 17,
        opts_size: 0x200,
        inventory_query: true,
        plugin_options: true,
    },
];

const COMMON_SYMBOLS: &[&str] = &[
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

fn main() {
    println!("cargo:rerun-if-changed=csrc/host.c");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    for p in PROFILES {
        let dir = out.join(format!("host-{}", p.tag));
        std::fs::create_dir_all(&dir).expect("create the profile's build directory");
        let objects = cc::Build::new()
            .file("csrc/host.c")
            .define("HOST_HOOKS", p.hooks.to_string().as_str())
            .define("HOST_OPTS_SIZE", p.opts_size.to_string().as_str())
            .define(
                "HOST_INVENTORY_QUERY",
                if p.inventory_query { "1" } else { "0" },
            )
            .define(
                "HOST_PLUGIN_OPTIONS",
                if p.plugin_options { "1" } else { "0" },
            )
            .flag_if_supported("-Wall")
            .flag_if_supported("-Wextra")
            .pic(true)
            .cargo_metadata(false)
            .out_dir(&dir)
            .compile_intermediates();

        let mut list = String::from("{\n");
        let mut symbols: Vec<&str> = COMMON_SYMBOLS.to_vec();
        if p.inventory_query {
            symbols.push("has_inventory_plugin");
        }
        if p.plugin_options {
            symbols.push("criu_plugin_get_options");
        }
        for s in symbols {
            writeln!(list, "  {s};").expect("write to a String");
        }
        list.push_str("};\n");
        let list_path = dir.join("exports.list");
        std::fs::write(&list_path, list).expect("write the dynamic list");

        for o in objects {
            println!("cargo:rustc-link-arg-bin={}={}", p.bin, o.display());
        }
        println!(
            "cargo:rustc-link-arg-bin={}=-Wl,--dynamic-list={}",
            p.bin,
            list_path.display()
        );
    }
}
