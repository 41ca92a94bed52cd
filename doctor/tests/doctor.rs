//! `cuda-plugin-doctor` against fake node roots (a temporary directory with fake `criu`, `runc`,
//! `crun` scripts, a plugin directory, options files, `proc/meminfo`) and mock worlds (the
//! driver, NVML and `cuda-checkpoint` of `mock-world`). Each check has a test that makes it fail
//! and one that makes it pass; the doctor runs as a program, as an operator runs it, with
//! `--json`, and the tests read its verdicts from the JSON.
//!
//! The tests run one at a time (a lock): each writes scripts and then runs them, and a script
//! being written while another test forks would make its exec fail with ETXTBSY.

use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

const DOCTOR: &str = env!("CARGO_BIN_EXE_cuda-plugin-doctor");

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A fake node: `root/` (the node's files), `root/bin` (its PATH) and optionally a mock world.
struct Node {
    dir: tempfile::TempDir,
    world: Option<PathBuf>,
    images: Option<PathBuf>,
    /// `--timeout`, seconds.
    timeout: u32,
    _serial: MutexGuard<'static, ()>,
}

/// What the doctor said.
struct Outcome {
    code: i32,
    json: Value,
}

impl Outcome {
    fn check(&self, id: &str) -> &Value {
        self.json["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("no check {id} in {:#}", self.json))
    }

    /// The status of check `id`, asserted to be `want`; returns the check's text (found,
    /// details and fix) for further assertions.
    fn expect(&self, id: &str, want: &str) -> String {
        let c = self.check(id);
        assert_eq!(c["status"], want, "check {id}: {c:#}");
        if want == "PASS" {
            assert!(c["fix"].is_null(), "a passing check has no fix: {c:#}");
        } else if want != "SKIP" {
            assert!(
                c["fix"].as_str().is_some_and(|f| !f.is_empty()),
                "a check that does not pass says the fix: {c:#}"
            );
        }
        c.to_string()
    }
}

fn write_mode(p: &Path, text: &str, mode: u32) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

impl Node {
    fn new() -> Node {
        let guard = serial();
        let dir = tempfile::tempdir().unwrap();
        for d in [
            "root/bin",
            "root/usr/lib/criu",
            "root/etc/criu",
            "root/proc",
        ] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        // Directories the tests make must not be group- or world-writable whatever the umask.
        for d in [
            "root",
            "root/bin",
            "root/usr",
            "root/usr/lib",
            "root/usr/lib/criu",
            "root/etc",
            "root/etc/criu",
        ] {
            std::fs::set_permissions(dir.path().join(d), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
        let n = Node {
            dir,
            world: None,
            images: None,
            timeout: 10,
            _serial: guard,
        };
        n.meminfo(512 * 1024 * 1024);
        n
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// A script in the node's PATH.
    fn program(&self, name: &str, script: &str) -> &Self {
        self.program_mode(name, script, 0o755)
    }

    fn program_mode(&self, name: &str, script: &str, mode: u32) -> &Self {
        write_mode(
            &self.root().join("bin").join(name),
            &format!("#!/bin/sh\n{script}\n"),
            mode,
        );
        self
    }

    fn criu(&self, version: &str) -> &Self {
        self.program(
            "criu",
            &format!("echo 'Version: {version}'\necho 'GitID: v{version}'"),
        )
    }

    fn plugin(&self) -> &Self {
        write_mode(&self.root().join("usr/lib/criu/cuda_plugin.so"), "", 0o644);
        self
    }

    fn options(&self, text: &str, mode: u32) -> &Self {
        write_mode(&self.root().join("etc/criu/cuda_plugin.conf"), text, mode);
        self
    }

    fn meminfo(&self, available_kib: u64) -> &Self {
        write_mode(
            &self.root().join("proc/meminfo"),
            &format!(
                "MemTotal: {} kB\nMemFree: 1 kB\nMemAvailable: {available_kib} kB\n",
                available_kib * 2
            ),
            0o644,
        );
        self
    }

    /// A mock world from `config`, its `cuda-checkpoint` copied into the node's PATH when
    /// `with_cli`.
    fn world(&mut self, config: &str, with_cli: bool) -> &mut Self {
        let a = testkit::criu::artifacts()
            .as_ref()
            .expect("the built artifacts");
        let w = self.dir.path().join("world");
        testkit::criu::init_world(a, &w, config).unwrap();
        if with_cli {
            let to = self.root().join("bin/cuda-checkpoint");
            std::fs::copy(&a.cuda_checkpoint, &to).unwrap();
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        self.world = Some(w);
        self
    }

    fn images(&mut self) -> &mut Self {
        let d = self.dir.path().join("images");
        std::fs::create_dir_all(&d).unwrap();
        self.images = Some(d);
        self
    }

    fn command(&self, extra: &[&str]) -> Command {
        let mut cmd = Command::new(DOCTOR);
        cmd.arg("--root")
            .arg(self.root())
            .arg("--path")
            .arg(self.root().join("bin"))
            .args(["--timeout", &self.timeout.to_string()])
            .env_remove(criu_cuda_env::PLUGIN_CONFIG)
            .env_remove("MOCK_CUDA_WORLD")
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("CUDA_VISIBLE_DEVICES");
        if let Some(w) = &self.world {
            testkit::world::env(&mut cmd, w);
        }
        if let Some(d) = &self.images {
            cmd.arg("--images").arg(d);
        }
        cmd.args(extra);
        cmd
    }

    fn run(&self) -> Outcome {
        let out = self.command(&["--json"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let json: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {text}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        Outcome {
            code: out.status.code().unwrap(),
            json,
        }
    }
}

/// A world with driver `branch` and one 64 MiB H100, with `extra` TOML (GPU settings, faults).
fn world_config(branch: u32, gpu_extra: &str, extra: &str) -> String {
    format!(
        "schema = 1\n[driver]\nbranch = {branch}\n\n[[gpu]]\nuuid = \"{}\"\nname = \"NVIDIA H100 80GB HBM3\"\nmemory_mib = 64\nchip = \"GH100\"\n{gpu_extra}\n{extra}",
        testkit::world::GPU0
    )
}

fn sticky_fault(function: &str, code: &str) -> String {
    format!(
        "\n[[fault]]\nfunction = \"{function}\"\nsticky = true\naction = {{ kind = \"return\", code = \"{code}\" }}\n"
    )
}

// ------------------------------------------------------------------------------------- CRIU

#[test]
fn criu_3_fails_and_4_passes() {
    let n = Node::new();
    n.criu("3.17.1");
    let o = n.run();
    let c = o.expect("criu", "FAIL");
    assert!(c.contains("3.17.1") && c.contains("4.0 or later"), "{c}");
    assert_eq!(o.code, 1, "a failed check exits 1");
    n.criu("4.1.1");
    assert!(n.run().expect("criu", "PASS").contains("CRIU 4.1.1"));
}

#[test]
fn a_criu_others_can_change_is_not_run() {
    let n = Node::new();
    n.criu("4.1.1");
    std::fs::set_permissions(
        n.root().join("bin/criu"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let c = n.run().expect("criu", "FAIL");
    assert!(c.contains("not trusted") && c.contains("chmod go-w"), "{c}");
}

#[test]
fn criu_missing_fails() {
    let n = Node::new();
    let c = n.run().expect("criu", "FAIL");
    assert!(c.contains("not found"), "{c}");
}

#[test]
fn the_plugin_must_be_in_crius_plugin_directory() {
    let n = Node::new();
    let c = n.run().expect("criu-plugin", "FAIL");
    assert!(c.contains("cuda_plugin.so is missing"), "{c}");
    n.plugin();
    n.run().expect("criu-plugin", "PASS");
}

// ------------------------------------------------------------------------------- trust rules

#[test]
fn options_file_writable_by_others_fails_with_the_plugins_fault() {
    let n = Node::new();
    n.options("backend=auto\n", 0o666);
    let c = n.run().expect("options-file", "FAIL");
    assert!(
        c.contains("writable by everyone") && c.contains("chmod go-w"),
        "the fault the plugin reports, and its fix: {c}"
    );
    n.options("backend=auto\n", 0o644);
    let c = n.run().expect("options-file", "PASS");
    assert!(c.contains("cuda_plugin.backend=auto"), "{c}");
}

#[test]
fn options_file_with_a_bad_line_fails_and_none_is_a_skip() {
    let n = Node::new();
    n.run().expect("options-file", "SKIP");
    n.options("# node\nbackend=fast\n", 0o644);
    let c = n.run().expect("options-file", "FAIL");
    assert!(c.contains("line 2") && c.contains("Correct line 2"), "{c}");
}

#[test]
fn a_program_others_can_change_fails_the_trust_check() {
    let n = Node::new();
    n.program_mode("cuda-checkpoint", "echo '--action'", 0o757);
    let c = n.run().expect("program-trust", "FAIL");
    assert!(
        c.contains("cuda-checkpoint") && c.contains("chmod go-w"),
        "{c}"
    );
    n.program_mode("cuda-checkpoint", "echo '--action'", 0o755);
    n.run().expect("program-trust", "PASS");
}

// ------------------------------------------------------------------------------------ driver

#[test]
fn a_driver_whose_version_query_fails_fails() {
    let mut n = Node::new();
    n.world(
        &world_config(
            580,
            "",
            &sticky_fault("cuDriverGetVersion", "CUDA_ERROR_UNKNOWN"),
        ),
        false,
    );
    let c = n.run().expect("driver", "FAIL");
    assert!(c.contains("cuDriverGetVersion failed"), "{c}");
}

#[test]
fn driver_r580_passes_with_device_maps_and_r615_with_custom_storage() {
    let mut n = Node::new();
    n.world(&world_config(580, "", ""), false);
    let c = n.run().expect("driver", "PASS");
    assert!(
        c.contains("CUDA 13.0") && c.contains("driver r580") && c.contains("6/6 symbols"),
        "{c}"
    );
    assert!(
        c.contains("device maps") && c.contains("no custom storage"),
        "{c}"
    );
    drop(n); // releases the lock the next node takes
    let mut n = Node::new();
    n.world(&world_config(615, "", ""), false);
    let c = n.run().expect("driver", "PASS");
    assert!(c.contains("custom storage (CUDA 13.4+)"), "{c}");
}

#[test]
fn a_driver_without_the_checkpoint_api_warns() {
    let mut n = Node::new();
    n.world(&world_config(555, "", ""), false);
    let c = n.run().expect("driver", "WARN");
    assert!(c.contains("cuCheckpointProcessLock: missing"), "{c}");
}

// --------------------------------------------------------------------------- cuda-checkpoint

#[test]
fn cuda_checkpoint_too_old_without_the_driver_api_fails() {
    let mut n = Node::new();
    // r550: no checkpoint API in the driver, and a utility without --action.
    n.world(&world_config(550, "", ""), true);
    let c = n.run().expect("cuda-checkpoint", "FAIL");
    assert!(c.contains("too old") || c.contains("--action"), "{c}");
}

#[test]
fn cuda_checkpoint_r580_passes_with_device_map() {
    let mut n = Node::new();
    n.world(&world_config(580, "", ""), true);
    let c = n.run().expect("cuda-checkpoint", "PASS");
    assert!(c.contains("--action yes, --device-map yes"), "{c}");
}

// -------------------------------------------------------------------------------------- NVML

#[test]
fn nvml_that_fails_to_initialise_fails() {
    let mut n = Node::new();
    n.world(
        &world_config(580, "", &sticky_fault("nvmlInit_v2", "NVML_ERROR_UNKNOWN")),
        false,
    );
    let c = n.run().expect("nvml", "FAIL");
    assert!(c.contains("nvmlInit_v2"), "{c}");
    n.run().expect("gpus", "SKIP");
}

#[test]
fn nvml_passes_with_its_driver_version_and_gpus() {
    let mut n = Node::new();
    n.world(&world_config(580, "", ""), false);
    let o = n.run();
    let c = o.expect("nvml", "PASS");
    assert!(c.contains("driver 580.00.00, 1 GPU(s)"), "{c}");
    let c = o.expect("gpus", "PASS");
    assert!(c.contains("persistence on, MIG off"), "{c}");
}

#[test]
fn a_gpu_in_mig_mode_fails_and_one_without_persistence_warns() {
    let mut n = Node::new();
    n.world(&world_config(580, "mig = true", ""), false);
    let c = n.run().expect("gpus", "FAIL");
    assert!(
        c.contains("MIG mode is on for GPU 0") && c.contains("#42"),
        "{c}"
    );
    drop(n); // releases the lock the next node takes
    let mut n = Node::new();
    n.world(&world_config(580, "persistence = false", ""), false);
    let c = n.run().expect("gpus", "WARN");
    assert!(c.contains("persistence off"), "{c}");
}

// ------------------------------------------------------------------------------------ memory

#[test]
fn gpu_memory_beyond_host_memory_fails_host_staging() {
    let mut n = Node::new();
    n.world(&world_config(580, "", ""), false);
    n.meminfo(1024); // 1 MiB available, 64 MiB of GPU memory
    let c = n.run().expect("host-memory", "FAIL");
    assert!(c.contains("does not fit"), "{c}");
    n.meminfo(16 * 1024 * 1024);
    n.run().expect("host-memory", "PASS");
}

#[test]
fn an_image_directory_too_small_for_gpu_memory_fails() {
    let mut n = Node::new();
    // 1 PiB of GPU memory: more than any test machine's disk.
    n.world(
        &world_config(615, "", "").replace("memory_mib = 64", "memory_mib = 1073741824"),
        false,
    );
    n.images();
    let c = n.run().expect("image-dir", "FAIL");
    assert!(c.contains("does not fit"), "{c}");
}

#[test]
fn an_image_directory_with_room_passes_and_reports_o_direct() {
    let mut n = Node::new();
    n.world(&world_config(615, "", ""), false);
    n.run().expect("image-dir", "SKIP");
    n.images();
    // The filesystem decides O_DIRECT: ask it the same way, then expect PASS or the warning.
    let probe = n.images.as_ref().unwrap().join("probe");
    let direct = {
        use std::os::unix::fs::OpenOptionsExt;
        let r = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT)
            .open(&probe);
        let _ = std::fs::remove_file(&probe);
        r.is_ok()
    };
    let o = n.run();
    if direct {
        let c = o.expect("image-dir", "PASS");
        assert!(
            c.contains("takes O_DIRECT") && c.contains("room for GPU memory"),
            "{c}"
        );
    } else {
        let c = o.expect("image-dir", "WARN");
        assert!(c.contains("refuses O_DIRECT"), "{c}");
    }
    let left: Vec<_> = std::fs::read_dir(n.images.as_ref().unwrap())
        .unwrap()
        .collect();
    assert!(
        left.is_empty(),
        "the O_DIRECT probe file is removed: {left:?}"
    );
}

// ---------------------------------------------------------------------------------- runtimes

#[test]
fn a_crun_without_criu_and_no_runc_fails() {
    let n = Node::new();
    n.program(
        "crun",
        "echo 'crun version 1.8.1'\necho 'commit: deadbeef'\necho '+SYSTEMD +SELINUX +CAP +SECCOMP -CRIU +YAJL'",
    );
    let c = n.run().expect("runtimes", "FAIL");
    assert!(
        c.contains("crun") && c.contains("no (built without +CRIU)"),
        "{c}"
    );
}

#[test]
fn runc_with_checkpoint_and_podman_pass() {
    let n = Node::new();
    n.program(
        "runc",
        r#"case "$1" in
--version) echo 'runc version 1.1.5'; echo 'spec: 1.0.2-dev' ;;
features) echo '{"ociVersionMin":"1.0.0","annotations":{"org.opencontainers.runc.checkpoint.enabled":"true"}}' ;;
*) exit 1 ;;
esac"#,
    );
    n.program("podman", "echo 'podman version 4.3.1'");
    let c = n.run().expect("runtimes", "PASS");
    assert!(
        c.contains("runc version 1.1.5") && c.contains("CRIU support yes"),
        "{c}"
    );
    assert!(
        c.contains("podman version 4.3.1") && c.contains("only PATH"),
        "{c}"
    );
    // A crun with +CRIU beside it passes as well.
    n.program(
        "crun",
        "echo 'crun version 1.19'\necho '+SYSTEMD +CRIU +YAJL'",
    );
    let c = n.run().expect("runtimes", "PASS");
    assert!(c.contains("runc, crun"), "{c}");
}

// ------------------------------------------------------------------------- the whole node

#[test]
fn a_good_node_passes_everything_and_exits_0() {
    let mut n = Node::new();
    n.criu("4.1.1").plugin().options("backend=auto\n", 0o644);
    n.program(
        "runc",
        r#"case "$1" in
--version) echo 'runc version 1.1.5' ;;
features) echo '{"annotations":{"org.opencontainers.runc.checkpoint.enabled":"true"}}' ;;
esac"#,
    );
    n.world(&world_config(615, "", ""), true).images();
    let o = n.run();
    for c in o.json["checks"].as_array().unwrap() {
        let ok = c["status"] == "PASS" || (c["id"] == "image-dir" && c["status"] == "WARN");
        assert!(ok, "{c:#}");
    }
    assert_eq!(o.code, 0, "{:#}", o.json);
    assert_eq!(o.json["summary"]["fail"], 0);

    // The same node for a person: one line per check, and the summary.
    let out = n.command(&[]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    for id in [
        "criu",
        "criu-plugin",
        "options-file",
        "program-trust",
        "driver",
        "cuda-checkpoint",
        "nvml",
        "gpus",
        "host-memory",
        "image-dir",
        "runtimes",
    ] {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().nth(1) == Some(id)),
            "no line for {id}:\n{text}"
        );
    }
    assert!(text.contains("11 checks: "), "{text}");
}

#[test]
fn a_program_or_a_library_that_hangs_is_given_up_on() {
    let mut n = Node::new();
    n.timeout = 1;
    n.program("criu", "sleep 60");
    n.world(
        &world_config(
            580,
            "",
            "\n[[fault]]\nfunction = \"nvmlInit_v2\"\naction = { kind = \"hang\" }\n",
        ),
        false,
    );
    let start = std::time::Instant::now();
    let o = n.run();
    let took = start.elapsed();
    let c = o.expect("criu", "FAIL");
    assert!(c.contains("timed out"), "{c}");
    let c = o.expect("nvml", "FAIL");
    assert!(c.contains("did not answer in time"), "{c}");
    assert!(
        took < std::time::Duration::from_secs(8),
        "two waits of 1 s each, and the rest quick: {took:?}"
    );
}

#[test]
fn a_usage_error_exits_2() {
    let n = Node::new();
    let out = n.command(&["--no-such-option"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// A good node as a person reads it (the paths of the fake node and the version normalised).
#[test]
fn the_human_report_of_a_good_node() {
    let mut n = Node::new();
    n.criu("4.1.1")
        .plugin()
        .options("backend=auto\nparallel=auto\n", 0o644);
    n.meminfo(32 * 1024 * 1024);
    n.program(
        "runc",
        r#"case "$1" in
--version) echo 'runc version 1.1.5' ;;
features) echo '{"annotations":{"org.opencontainers.runc.checkpoint.enabled":"true"}}' ;;
esac"#,
    );
    n.program(
        "crun",
        "echo 'crun version 1.8.1'\necho '+SYSTEMD -CRIU +YAJL'",
    );
    n.world(&world_config(615, "", ""), true);
    let out = n.command(&[]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout)
        .unwrap()
        .replace(n.root().to_str().unwrap(), "[NODE]")
        .replace(env!("CARGO_PKG_VERSION"), "[VERSION]");
    insta::assert_snapshot!("good_node", text);
}
