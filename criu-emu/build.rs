//! Builds the C host shim once per emulated CRIU profile and links each object into its engine
//! executable, exporting exactly the host symbols through a per-profile dynamic list.
//!
//! The object is passed as a per-binary link argument (not a static library) so that it is always
//! linked whole, and `--dynamic-list` both exports its symbols and keeps them from section GC.

use std::fmt::Write as _;
use std::path::PathBuf;

#[path = "src/profiles_table.rs"]
mod profiles_table;

use profiles_table::PROFILES;

fn main() {
    println!("cargo:rerun-if-changed=csrc/host.c");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/profiles_table.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    for p in &PROFILES {
        let tag = p.bin.trim_start_matches("harness-engine-");
        let dir = out.join(format!("host-{tag}"));
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
        let symbols = p.exported_symbols();
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
