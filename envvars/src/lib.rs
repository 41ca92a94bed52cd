//! Every `CRIU_CUDA_*` environment variable of the project, declared once: the plugin, the
//! doctor, the harness, the test support and the tests name a variable only through these
//! constants, and the scripts only as listed in [`VARS`]. `docs/environment.md` is their table
//! (`tests/table.rs` checks it against [`VARS`], every name the repository uses against
//! [`VARS`], and that no Rust file outside this crate spells a variable's name as a string).
//!
//! No dependencies and no code beyond names and two readers: the plugin links it.

#![forbid(unsafe_code)]

/// One variable: its name, who reads it, and what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    pub name: &'static str,
    /// Who reads it: `plugin`, `doctor`, `tests`, `harness`, `scripts` or `bench`.
    pub read_by: &'static str,
    /// What it does, one sentence (the table's text).
    pub effect: &'static str,
}

/// The plugin: run without `/proc/driver/nvidia/gpus/` (hardware-free testing).
pub const FORCE_ENABLE: &str = "CRIU_CUDA_FORCE_ENABLE";
/// The plugin and the doctor: the options file's path.
pub const PLUGIN_CONFIG: &str = "CRIU_CUDA_PLUGIN_CONFIG";
/// The plugin: the descriptor's `max_hooks`.
pub const PLUGIN_MAX_HOOKS: &str = "CRIU_CUDA_PLUGIN_MAX_HOOKS";
/// The plugin: the host memory the capacity check takes as available, GiB.
pub const MEM_AVAILABLE_GIB: &str = "CRIU_CUDA_MEM_AVAILABLE_GIB";
/// Tests: where the built programs and libraries are.
pub const ARTIFACTS: &str = "CRIU_CUDA_ARTIFACTS";
/// Tests: the plugin `.so` they load.
pub const TEST_PLUGIN_SO: &str = "CRIU_CUDA_TEST_PLUGIN_SO";
/// Scripts and tests: where the fetched CRIUs are.
pub const CRIU_DIR: &str = "CRIU_CUDA_CRIU_DIR";
/// Tests: the list of fetched CRIUs.
pub const CRIU_VERSIONS: &str = "CRIU_CUDA_CRIU_VERSIONS";
/// Tests: the CRIU 4.1.x wrapper.
pub const CRIU_4_1: &str = "CRIU_CUDA_CRIU_4_1";
/// Tests: the CRIU 4.2.x wrapper.
pub const CRIU_4_2: &str = "CRIU_CUDA_CRIU_4_2";
/// Tests and the harness: a missing CRIU fails instead of skipping.
pub const REQUIRE_CRIU: &str = "CRIU_CUDA_REQUIRE_CRIU";
/// Tests: missing release tarballs fail the docs check.
pub const REQUIRE_DIST: &str = "CRIU_CUDA_REQUIRE_DIST";
/// Tests: CRIU's C plugins must have been built.
pub const REQUIRE_C_PLUGINS: &str = "CRIU_CUDA_REQUIRE_C_PLUGINS";
/// Tests: runc must be installed.
pub const REQUIRE_RUNC: &str = "CRIU_CUDA_REQUIRE_RUNC";
/// Tests: podman must be installed.
pub const REQUIRE_PODMAN: &str = "CRIU_CUDA_REQUIRE_PODMAN";
/// Tests: pid and mount namespaces must be available.
pub const REQUIRE_NAMESPACES: &str = "CRIU_CUDA_REQUIRE_NAMESPACES";
/// Tests: the corpus runs in the main job, not in `cargo test`.
pub const CORPUS_IN_MAIN_JOB: &str = "CRIU_CUDA_CORPUS_IN_MAIN_JOB";
/// Tests: the full mode (every sweep code, the stress test).
pub const FULL: &str = "CRIU_CUDA_FULL";
/// Tests: the runc to use.
pub const RUNC: &str = "CRIU_CUDA_RUNC";
/// Tests: the podman to use.
pub const PODMAN: &str = "CRIU_CUDA_PODMAN";
/// Tests: keep every runc case's directory.
pub const RUNC_KEEP: &str = "CRIU_CUDA_RUNC_KEEP";
/// Tests: keep every podman case's directory.
pub const PODMAN_KEEP: &str = "CRIU_CUDA_PODMAN_KEEP";
/// Tests: keep every real-CRIU case's directory.
pub const REAL_CRIU_KEEP: &str = "CRIU_CUDA_REAL_CRIU_KEEP";
/// Tests: the sweep's number of workers.
pub const SWEEP_JOBS: &str = "CRIU_CUDA_SWEEP_JOBS";
/// Tests: the soak's number of runs.
pub const SOAK_RUNS: &str = "CRIU_CUDA_SOAK_RUNS";
/// Tests: the soak's seed.
pub const SOAK_SEED: &str = "CRIU_CUDA_SOAK_SEED";
/// Tests: the restore-thread stress test's number of cycles.
pub const STRESS_RUNS: &str = "CRIU_CUDA_STRESS_RUNS";
/// Tests: the restore-thread stress test's seed.
pub const STRESS_SEED: &str = "CRIU_CUDA_STRESS_SEED";
/// Scripts: do not fetch CRIU.
pub const SKIP_FETCH: &str = "CRIU_CUDA_SKIP_FETCH";
/// Scripts: the Debian mirror.
pub const DEBIAN_MIRROR: &str = "CRIU_CUDA_DEBIAN_MIRROR";
/// Scripts: the archive of old Debian releases.
pub const DEBIAN_ARCHIVE: &str = "CRIU_CUDA_DEBIAN_ARCHIVE";
/// Scripts: the keyring for Debian's Release files.
pub const DEBIAN_KEYRING: &str = "CRIU_CUDA_DEBIAN_KEYRING";
/// Scripts: which benchmark `scripts/bench.sh` runs.
pub const BENCH: &str = "CRIU_CUDA_BENCH";

/// Every variable, in the order of `docs/environment.md`.
pub const VARS: &[Var] = &[
    Var { name: FORCE_ENABLE, read_by: "plugin", effect: "`1`: run even without `/proc/driver/nvidia/gpus/` (hardware-free testing against the mock driver; CRIU's fault 138 does the same)" },
    Var { name: PLUGIN_CONFIG, read_by: "plugin, doctor", effect: "the plugin's options file, instead of `cuda_plugin.conf` next to the plugin or in `/etc/criu/`" },
    Var { name: PLUGIN_MAX_HOOKS, read_by: "plugin", effect: "the descriptor's `max_hooks` (1 to 17), instead of the count the load-time constructor reads from the host" },
    Var { name: MEM_AVAILABLE_GIB, read_by: "plugin", effect: "the host memory, in GiB, the dump's capacity check takes as available, instead of `MemAvailable` of `/proc/meminfo`" },
    Var { name: ARTIFACTS, read_by: "tests, harness", effect: "the directory of the built programs and libraries (`scripts/test.sh` sets it to `target/debug` after building them); unset, tests build what they need" },
    Var { name: TEST_PLUGIN_SO, read_by: "tests, harness", effect: "the `cuda_plugin.so` the tests, the main job and the kit load instead of the built one (CI: the released x86_64 `.so`)" },
    Var { name: CRIU_DIR, read_by: "scripts, tests, harness", effect: "where `scripts/fetch-criu.sh` puts the fetched CRIUs and CRIU's C plugins (default `target/criu`)" },
    Var { name: CRIU_VERSIONS, read_by: "tests, harness", effect: "the list of fetched CRIUs, one `<version> <wrapper>` per line (`scripts/test.sh` and `scripts/main-job.sh` set it)" },
    Var { name: CRIU_4_1, read_by: "tests, harness, bench", effect: "the CRIU 4.1.x wrapper (set by the scripts where one was fetched)" },
    Var { name: CRIU_4_2, read_by: "tests, harness, bench", effect: "the CRIU 4.2.x wrapper (set by the scripts where one was fetched)" },
    Var { name: REQUIRE_CRIU, read_by: "scripts, tests, harness", effect: "`1`: a missing CRIU fails the fetch, the tests and the main job instead of skipping what needs it (CI)" },
    Var { name: REQUIRE_DIST, read_by: "tests", effect: "`1`: the docs check fails, instead of skipping, the README's release-tarball block when the tarballs are not built (CI)" },
    Var { name: REQUIRE_C_PLUGINS, read_by: "tests", effect: "`1`: the tests of CRIU's C plugins fail instead of being ignored when they were not built (CI)" },
    Var { name: REQUIRE_RUNC, read_by: "tests", effect: "`1`: the runc test fails instead of skipping when runc is not installed (CI)" },
    Var { name: REQUIRE_PODMAN, read_by: "tests", effect: "`1`: the podman test fails instead of skipping when podman is not installed (CI)" },
    Var { name: REQUIRE_NAMESPACES, read_by: "tests", effect: "`1`: the mock's namespace tests fail instead of skipping when pid and mount namespaces cannot be made" },
    Var { name: CORPUS_IN_MAIN_JOB, read_by: "tests", effect: "`1`: `cargo test`'s scenario runner runs nothing, because the main job runs the corpus (CI)" },
    Var { name: FULL, read_by: "tests", effect: "`1`: the full mode (`scripts/test.sh --full`): the fault sweep with every code and the restore-thread stress test" },
    Var { name: RUNC, read_by: "tests", effect: "the runc the runc test uses (default: `runc` in `PATH`)" },
    Var { name: PODMAN, read_by: "tests", effect: "the podman the podman test uses (default: `podman` in `PATH`)" },
    Var { name: RUNC_KEEP, read_by: "tests", effect: "`1`: the runc test keeps every case's directory, not only a failed one's" },
    Var { name: PODMAN_KEEP, read_by: "tests", effect: "`1`: the podman test keeps every case's directory, not only a failed one's" },
    Var { name: REAL_CRIU_KEEP, read_by: "tests", effect: "`1`: the real-CRIU test keeps every case's directory, not only a failed one's" },
    Var { name: SWEEP_JOBS, read_by: "tests", effect: "how many workers the fault sweep runs at once" },
    Var { name: SOAK_RUNS, read_by: "tests", effect: "how many runs the chaos soak makes" },
    Var { name: SOAK_SEED, read_by: "tests", effect: "the chaos soak's seed (default 1205)" },
    Var { name: STRESS_RUNS, read_by: "tests", effect: "how many cycles the restore-thread stress test runs (default 500)" },
    Var { name: STRESS_SEED, read_by: "tests", effect: "the restore-thread stress test's seed" },
    Var { name: SKIP_FETCH, read_by: "scripts", effect: "`1`: `scripts/test.sh`, `scripts/main-job.sh` and `scripts/bench.sh` do not run `scripts/fetch-criu.sh`" },
    Var { name: DEBIAN_MIRROR, read_by: "scripts", effect: "the Debian mirror of `scripts/fetch-criu.sh` and `scripts/check-dist-load.sh` (default `http://deb.debian.org/debian`)" },
    Var { name: DEBIAN_ARCHIVE, read_by: "scripts", effect: "the archive of old Debian releases of `scripts/check-dist-load.sh` (default `http://archive.debian.org/debian`)" },
    Var { name: DEBIAN_KEYRING, read_by: "scripts", effect: "the keyring `scripts/fetch-criu.sh` checks Debian's Release files with" },
    Var { name: BENCH, read_by: "scripts", effect: "`custom-storage`: `scripts/bench.sh` runs the custom-storage benchmark instead of the CRIU one" },
];

/// The variable naming the wrapper of the fetched CRIU of `series` (`"4.1"` gives
/// `CRIU_CUDA_CRIU_4_1`).
#[must_use]
pub fn criu_wrapper(series: &str) -> String {
    format!("CRIU_CUDA_CRIU_{}", series.replace('.', "_"))
}

/// Whether `name` is set to exactly `1` (the flags above, as the tests, the harness and the
/// benchmarks read them; the plugin reads its own in `plugin/src/env.rs`).
#[must_use]
pub fn is_on(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_prefixed_and_the_wrappers_are_listed() {
        let mut seen = std::collections::BTreeSet::new();
        for v in VARS {
            assert!(v.name.starts_with("CRIU_CUDA_"), "{}", v.name);
            assert!(seen.insert(v.name), "{} twice", v.name);
            assert!(!v.effect.is_empty() && !v.read_by.is_empty(), "{}", v.name);
        }
        assert_eq!(criu_wrapper("4.1"), CRIU_4_1);
        assert_eq!(criu_wrapper("4.2"), CRIU_4_2);
    }
}
