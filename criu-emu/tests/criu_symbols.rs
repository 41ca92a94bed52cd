//! The emulated engines export what real CRIU exports, and what C plugins import.
//!
//! For each profile with a released CRIU (`4.1`: Debian's criu 4.1.x, `4.2`: 4.2.x, found as the
//! scenario runner finds them, `scripts/fetch-criu.sh`), every dynamic symbol the engine
//! executable defines must be defined by that `criu` binary too, as a function where CRIU has a
//! function and as data of the same size where CRIU has data (`opts`, `fi_strategy`,
//! `cr_plugin_ctl`). Every CRIU symbol CRIU 4.1/4.2's C plugins import must be defined by both:
//! for `cuda_plugin.so` the undefined symbols of the plugins `scripts/fetch-criu.sh --c-plugin`
//! built (listed in `target/criu/c-plugins`), for amdgpu the list below.
//!
//! `upstream` and `pr3076` have no released binary: their engines must export what the `4.2`
//! engine does, plus `has_inventory_plugin` and `criu_plugin_get_options`.
//!
//! A trial whose CRIU (or C plugin) is absent is ignored with its reason, and fails instead with
//! `CRIU_CUDA_REQUIRE_CRIU=1` (`CRIU_CUDA_REQUIRE_C_PLUGINS=1`). Symbols are read with
//! `readelf --dyn-syms` (binutils).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use libtest_mimic::{Arguments, Failed, Trial};

/// The CRIU symbols amdgpu_plugin.so of CRIU 4.1.1 and 4.2.1 imports (its other undefined
/// symbols are libc's, libdrm's and libprotobuf-c's). Read with `nm -D --undefined-only` from
/// the plugin built from Debian's source packages (`make -C plugins/amdgpu ARCH=x86
/// CONFIG_AMDGPU=y amdgpu_plugin.so` after `make images/built-in.o compel/compel-host-bin`);
/// both versions import the same set.
const AMDGPU_IMPORTS: &[&str] = &[
    "add_inventory_plugin",
    "check_and_remove_inventory_plugin",
    "criu_get_image_dir",
    "find_unused_fd_pid",
    "img_streamer_open",
    "opts",
    "print_on_level",
];

/// Functions and data the newer hosts add over 4.2.
const NEWER_ONLY: &[&str] = &["has_inventory_plugin", "criu_plugin_get_options"];

#[derive(Debug, Clone, PartialEq, Eq)]
struct Sym {
    kind: String,
    size: u64,
}

/// Defined dynamic symbols of an ELF file: name (without a version) -> kind and size.
fn defined(path: &Path) -> Result<BTreeMap<String, Sym>, String> {
    let out = Command::new("readelf")
        .args(["--dyn-syms", "--wide"])
        .arg(path)
        .output()
        .map_err(|e| format!("readelf: {e} (install binutils)"))?;
    if !out.status.success() {
        return Err(format!(
            "readelf --dyn-syms {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut syms = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // Num: Value Size Type Bind Vis Ndx Name
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 || !f[0].ends_with(':') || f[6] == "UND" {
            continue;
        }
        let name = f[7].split('@').next().unwrap_or_default().to_owned();
        let size = f[2]
            .strip_prefix("0x")
            .map_or_else(|| f[2].parse().ok(), |h| u64::from_str_radix(h, 16).ok())
            .unwrap_or(0);
        syms.insert(
            name,
            Sym {
                kind: f[3].to_owned(),
                size,
            },
        );
    }
    Ok(syms)
}

/// Undefined dynamic symbols without a version (those a plugin expects from its host).
fn host_imports(path: &Path) -> Result<Vec<String>, String> {
    let out = Command::new("readelf")
        .args(["--dyn-syms", "--wide"])
        .arg(path)
        .output()
        .map_err(|e| format!("readelf: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() >= 8 && f[6] == "UND" && !f[7].contains('@')).then(|| f[7].to_owned())
        })
        .collect())
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn engine(profile: &str) -> PathBuf {
    PathBuf::from(match profile {
        "4.1" => env!("CARGO_BIN_EXE_harness-engine-41"),
        "4.2" => env!("CARGO_BIN_EXE_harness-engine-42"),
        "upstream" => env!("CARGO_BIN_EXE_harness-engine-upstream"),
        _ => env!("CARGO_BIN_EXE_harness-engine-pr3076"),
    })
}

/// The `criu` executable (not the wrapper `scripts/fetch-criu.sh` writes) of a series.
fn criu_binary(series: &str) -> Option<PathBuf> {
    let found = testkit::criu::find_criu()
        .into_iter()
        .find(|c| c.series == series)?
        .path;
    let found = if found.components().count() == 1 {
        // `criu` in PATH.
        std::env::var_os("PATH")?
            .to_str()?
            .split(':')
            .map(|d| Path::new(d).join(&found))
            .find(|p| p.exists())?
    } else {
        found
    };
    let unpacked = found.parent()?.join("usr/sbin/criu");
    Some(if unpacked.exists() { unpacked } else { found })
}

/// `target/criu/c-plugins`: "<version> <path of cuda_plugin.so>" per line.
fn c_plugins() -> Vec<(String, PathBuf)> {
    let list = std::env::var_os(criu_cuda_env::CRIU_DIR)
        .map_or_else(|| workspace().join("target/criu"), PathBuf::from)
        .join("c-plugins");
    std::fs::read_to_string(list)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (v, p) = l.split_once(' ')?;
            Some((v.to_owned(), PathBuf::from(p)))
        })
        .filter(|(_, p)| p.exists())
        .collect()
}

fn check_against_criu(profile: &str, criu: &Path) -> Result<(), Failed> {
    let ours = defined(&engine(profile))?;
    let theirs = defined(criu)?;
    let mut problems = Vec::new();
    for (name, sym) in &ours {
        match theirs.get(name) {
            None => problems.push(format!("{name}: CRIU {profile} does not export it")),
            Some(t) if t.kind != sym.kind => problems.push(format!(
                "{name}: a {} here, a {} in CRIU {profile}",
                sym.kind, t.kind
            )),
            Some(t) if sym.kind == "OBJECT" && t.size != sym.size => problems.push(format!(
                "{name}: {} bytes here, {} in CRIU {profile}",
                sym.size, t.size
            )),
            Some(_) => {}
        }
    }
    for name in AMDGPU_IMPORTS {
        if !ours.contains_key(*name) {
            problems.push(format!(
                "{name}: amdgpu imports it; the engine does not export it"
            ));
        }
        if !theirs.contains_key(*name) {
            problems.push(format!(
                "{name}: amdgpu imports it; CRIU {profile} lacks it"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "engine {profile} vs {}:\n{}",
            criu.display(),
            problems.join("\n")
        )
        .into())
    }
}

fn check_newer(profile: &str) -> Result<(), Failed> {
    let base = defined(&engine("4.2"))?;
    let ours = defined(&engine(profile))?;
    let mut want: Vec<&str> = base.keys().map(String::as_str).collect();
    want.extend(NEWER_ONLY);
    want.sort_unstable();
    let got: Vec<&str> = ours.keys().map(String::as_str).collect();
    if got != want {
        return Err(format!("engine {profile} exports {got:?}, expected {want:?}").into());
    }
    Ok(())
}

fn check_c_plugin(version: &str, so: &Path) -> Result<(), Failed> {
    let series: String = version.split('.').take(2).collect::<Vec<_>>().join(".");
    let ours = defined(&engine(&series))?;
    let criu = criu_binary(&series).ok_or(format!("no CRIU {series} to compare with"))?;
    let theirs = defined(&criu)?;
    let imports = host_imports(so)?;
    if imports.is_empty() {
        return Err(format!("{} imports nothing from its host?", so.display()).into());
    }
    let missing: Vec<String> = imports
        .iter()
        .filter(|s| !ours.contains_key(*s) || !theirs.contains_key(*s))
        .map(|s| {
            format!(
                "{s} (engine {series}: {}, CRIU {series}: {})",
                ours.contains_key(s),
                theirs.contains_key(s)
            )
        })
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("{} imports:\n{}", so.display(), missing.join("\n")).into())
    }
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let require = criu_cuda_env::is_on;
    let mut trials = Vec::new();
    for profile in ["4.1", "4.2"] {
        let name = format!(
            "engine_{}_exports_what_criu_{profile}_exports",
            profile.replace('.', "")
        );
        match criu_binary(profile) {
            Some(c) => trials.push(Trial::test(name, move || check_against_criu(profile, &c))),
            None if require(criu_cuda_env::REQUIRE_CRIU) => {
                trials.push(Trial::test(name, move || {
                    Err(
                        format!("required (CRIU_CUDA_REQUIRE_CRIU=1): no CRIU {profile} found")
                            .into(),
                    )
                }))
            }
            None => {
                eprintln!(
                    "note: {name} is ignored: no CRIU {profile} found (scripts/fetch-criu.sh)"
                );
                trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
            }
        }
    }
    for profile in ["upstream", "pr3076"] {
        trials.push(Trial::test(
            format!("engine_{profile}_exports_4_2_s_symbols_and_the_newer_api"),
            move || check_newer(profile),
        ));
    }
    let plugins = c_plugins();
    if plugins.is_empty() {
        let name = "c_plugins_find_every_symbol_they_import";
        if require(criu_cuda_env::REQUIRE_C_PLUGINS) {
            trials.push(Trial::test(name, || {
                Err(
                    "required (CRIU_CUDA_REQUIRE_C_PLUGINS=1): no target/criu/c-plugins \
                     (scripts/fetch-criu.sh --c-plugin)"
                        .into(),
                )
            }));
        } else {
            eprintln!(
                "note: {name} is ignored: no C plugin built (scripts/fetch-criu.sh --c-plugin)"
            );
            trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
        }
    }
    for (version, so) in plugins {
        trials.push(Trial::test(
            format!(
                "c_plugin_{}_finds_every_symbol_it_imports",
                version.replace('.', "_")
            ),
            move || check_c_plugin(&version, &so),
        ));
    }
    libtest_mimic::run(&args, trials).exit_code()
}
