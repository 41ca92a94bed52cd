//! `cuda_plugin.so` on a podman node: Debian bookworm's podman 4.3 with runc and real CRIU 4.2,
//! the plugin installed as the README's node layout says, a mock CUDA workload tree in a
//! container checkpointed and restored with podman's own commands. One trial per backend ×
//! case:
//!
//! | Case | What it checks |
//! |---|---|
//! | `checkpoint-restore` | the 3-process tree (a multi-threaded CUDA root, a CPU-only child, a CUDA grandchild) runs as a container; `podman container checkpoint --keep` succeeds, the container is `exited`, both CUDA tasks are CHECKPOINTED in the world, and the dump log (`userdata/dump.log`) shows CRIU 4.2 loaded the plugin from `/usr/lib/criu` with its options file; `podman container restore --keep` brings it back `running`, both CUDA tasks RUNNING (unlocked), every task answers SIGUSR1 with a PASS line (its GPU data intact), the restore log names the options file, and the world's trace shows `cuda-checkpoint` ran exactly when the file chose that backend |
//! | `export-import` | `podman container checkpoint --export FILE` writes a tarball (the container `exited`, both CUDA tasks CHECKPOINTED), the original container is removed, and `podman container restore --import FILE --name NEW` brings the tree back from the tarball alone under the new name: running, both CUDA tasks RUNNING, data checks PASS |
//! | `checkpoint-fails` | the 2nd CUDA task's lock fails (`NOT_READY`, injected through the world): `podman container checkpoint` fails printing runc's `criu failed: type NOTIFY errno 0` and `log file: <userdata>/dump.log` (not the plugin's error), that log names the plugin's error, and the container keeps running with both CUDA tasks RUNNING (nothing left locked) and its data intact |
//!
//! # The node
//!
//! podman runs the OCI runtime with only `PATH` and `XDG_RUNTIME_DIR` in its environment (runc
//! then starts `criu swrk` from that `PATH`), so nothing but files can configure the plugin:
//! `CRIU_PLUGIN_OPTIONS` never reaches CRIU. The test sets it (naming the other backend) in
//! podman's environment anyway, and the checks show the plugin followed its file. The node's
//! files are installed the README's way, in a private mount namespace of this test
//! (`unshare(CLONE_NEWNS)`, propagation private) with an overlay over `/usr`, so the host's
//! `/usr` (its `/usr/lib/criu`, its `/usr/sbin/criu`) is never changed:
//!
//! - `/usr/lib/criu/cuda_plugin.so`, CRIU's compiled-in plugin directory, and
//!   `/usr/lib/criu/cuda_plugin.conf` next to it (the backend and the utility's path);
//! - `/usr/sbin/criu`: the fetched CRIU 4.2.x (`scripts/fetch-criu.sh`; bookworm's own 3.17 does
//!   not work on this kernel and is never run), through a wrapper that adds what stands in for
//!   a GPU node's driver: the mock world (`MOCK_CUDA_WORLD`, its `libcuda.so.1` in
//!   `LD_LIBRARY_PATH`) and `CRIU_CUDA_FORCE_ENABLE=1` (there is no `/proc/driver/nvidia`
//!   here). The wrapper sets no option of the plugin.
//!
//! Overlays over `/var/lib` and `/run` keep off the host what podman and CRIU write there
//! regardless of the options below: podman's image blob cache (`/var/lib/containers/cache`,
//! written by `podman import`), runc's default state directory `/run/runc` (the
//! `podman container cleanup` that conmon runs when a container exits is not given
//! `--runtime-flag`, so its runc looks there) and CRIU's `/run/criu.kdat`.
//!
//! # The containers
//!
//! podman keeps everything under the case's directory: `--root`, `--runroot`, `--tmpdir`,
//! `--network-config-dir`, runc's state (`--runtime-flag root=...`) and `TMPDIR`, so no other
//! container of the machine is ever seen or touched, and every case ends with
//! `podman rm -f -t 0` (also when it fails or panics). What this machine forces is handled
//! here, not in the plugin:
//!
//! - no registry: the image is imported (`podman import`) from a tarball of a root file system
//!   like `runc.rs`'s (links into `/usr`, which is bound read-only). `podman run --rootfs` would
//!   do for the checkpoint in place, but podman 4.3's `restore --import` pulls the container's
//!   image by name and a `--rootfs` container has none ("repository name must have at least
//!   one component");
//! - no network: `--network none`;
//! - no `CAP_SYS_RESOURCE`: podman's default rlimits (`nofile` 1048576) are above this
//!   machine's hard limits, and runc then fails to start the container ("error setting rlimits
//!   for ready process ... operation not permitted"): `--ulimit` gives the hard `nofile` of this
//!   process and an `nproc` of 4096 (podman lowers its own `nproc`);
//! - no systemd: `--cgroup-manager cgroupfs`, `--events-backend file`; `--storage-driver vfs`;
//! - podman's default seccomp profile refuses `userfaultfd`, the mock driver's stand-in for the
//!   `/dev/nvidia*` handle a real CUDA process holds: the container runs under that profile
//!   (`/usr/share/containers/seccomp.json`) with `userfaultfd` allowed, as a GPU container gets
//!   its device nodes.
//!
//! Skips (with the reason) when not root, when no CRIU 4.2 is found (unless
//! `CRIU_CUDA_REQUIRE_CRIU=1`), or when podman is not installed, unless
//! `CRIU_CUDA_REQUIRE_PODMAN=1` or `CI` is set (then a missing podman fails).
//! `CRIU_CUDA_PODMAN=PATH` names the podman to use (default: `podman` in `PATH`). A failed case
//! keeps its directory and prints its path (`CRIU_CUDA_PODMAN_KEEP=1`: every case).
//!
//! Run: `cargo test -p cuda-plugin --test podman [-- FILTER]`.

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use testkit::criu::*;
use testkit::wait::output_within;

const BACKENDS: [&str; 2] = ["driver-api", "cuda-checkpoint"];

/// The node's plugin directory (CRIU's compiled-in one) and the files in it.
const PLUGIN_DIR: &str = "/usr/lib/criu";
/// The options file next to the plugin.
const OPTIONS_FILE: &str = "/usr/lib/criu/cuda_plugin.conf";
/// Where the node's `criu` is found in podman's (and so runc's) `PATH`.
const NODE_CRIU: &str = "/usr/sbin/criu";
/// The `PATH` podman runs with.
const NODE_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
/// podman's default seccomp profile (containers-common).
const DEFAULT_SECCOMP: &str = "/usr/share/containers/seccomp.json";
/// The directories the node's overlays cover (see the module docs).
const OVERLAID: [&str; 3] = ["/usr", "/var/lib", "/run"];
/// The image every case imports.
const IMAGE: &str = "localhost/criu-cuda-rootfs:test";

/// Which podman to run: `CRIU_CUDA_PODMAN`, else `podman` found in `PATH`.
fn find_podman() -> Option<PathBuf> {
    find_program(criu_cuda_env::PODMAN, "podman")
}

fn chmod(p: &Path, mode: u32) -> R {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {mode:o} {}: {e}", p.display()))
}

/// Runs `cmd` (a program that needs no input) to its end within `limit`.
fn run_within(cmd: &mut Command, limit: Duration, what: &str) -> R<Output> {
    output_within(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        limit,
        what,
    )
}

/// Runs `cmd` within `limit` and fails unless it succeeds.
fn run_ok(cmd: &mut Command, limit: Duration, what: &str) -> R<Output> {
    let out = run_within(cmd, limit, what)?;
    ensure!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// The node

/// What every case shares: the private mount namespace's overlays, the seccomp profile and the
/// image's root file system.
struct Node {
    dir: tempfile::TempDir,
    /// The hard `RLIMIT_NOFILE` of this process.
    nofile: u64,
}

impl Node {
    /// Enters a private mount namespace and lays an overlay over each of [`OVERLAID`], whose
    /// writes land in this node's directory.
    fn set_up() -> R<Node> {
        enter_private_mount_namespace()?;
        let dir = tempfile::Builder::new()
            .prefix("podman-cuda-node-")
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?;
        for (i, target) in OVERLAID.into_iter().enumerate() {
            let (upper, work) = (
                dir.path().join(format!("upper{i}")),
                dir.path().join(format!("work{i}")),
            );
            mkdir(&upper)?;
            mkdir(&work)?;
            run_ok(
                Command::new("mount").args([
                    "-t",
                    "overlay",
                    "overlay",
                    "-o",
                    &format!(
                        "lowerdir={target},upperdir={},workdir={}",
                        upper.display(),
                        work.display()
                    ),
                    target,
                ]),
                Duration::from_secs(20),
                &format!("mounting an overlay on {target}"),
            )?;
        }
        mkdir(Path::new(PLUGIN_DIR))?;
        chmod(Path::new(PLUGIN_DIR), 0o755)?;
        let node = Node {
            nofile: hard_limit("Max open files")?,
            dir,
        };
        node.write_seccomp()?;
        node.write_rootfs()?;
        Ok(node)
    }

    fn seccomp(&self) -> PathBuf {
        self.dir.path().join("seccomp.json")
    }

    fn rootfs_tar(&self) -> PathBuf {
        self.dir.path().join("rootfs.tar")
    }

    /// podman's default profile with `userfaultfd` allowed (see the module docs).
    fn write_seccomp(&self) -> R {
        let text = std::fs::read_to_string(DEFAULT_SECCOMP).map_err(|e| {
            format!("reading podman's default seccomp profile {DEFAULT_SECCOMP}: {e}")
        })?;
        let mut profile: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| format!("{DEFAULT_SECCOMP} is not JSON: {e}"))?;
        let rules = profile["syscalls"]
            .as_array_mut()
            .ok_or_else(|| format!("{DEFAULT_SECCOMP} has no syscalls list"))?;
        for rule in rules.iter_mut() {
            if rule["action"] != "SCMP_ACT_ALLOW" {
                if let Some(names) = rule["names"].as_array_mut() {
                    names.retain(|n| n != "userfaultfd");
                }
            }
        }
        rules.retain(|r| r["names"].as_array().is_none_or(|n| !n.is_empty()));
        rules.push(serde_json::json!({
            "names": ["userfaultfd"], "action": "SCMP_ACT_ALLOW", "args": []
        }));
        write(
            &self.seccomp(),
            &serde_json::to_string(&profile).map_err(|e| e.to_string())?,
        )
    }

    /// The image's root file system: `runc.rs`'s (links into `/usr`, empty mount points).
    fn write_rootfs(&self) -> R {
        let rootfs = self.dir.path().join("rootfs");
        for d in ["usr", "proc", "dev", "tmp", "etc", "sys", "run"] {
            mkdir(&rootfs.join(d))?;
        }
        for l in ["bin", "lib", "lib64", "sbin"] {
            std::os::unix::fs::symlink(format!("usr/{l}"), rootfs.join(l))
                .map_err(|e| format!("linking {l} in the root file system: {e}"))?;
        }
        run_ok(
            Command::new("tar")
                .arg("-C")
                .arg(&rootfs)
                .arg("-cf")
                .arg(self.rootfs_tar())
                .arg("."),
            Duration::from_secs(20),
            "tar of the root file system",
        )?;
        Ok(())
    }

    /// Installs the plugin, its options file and the node's `criu` for one case.
    fn install(&self, a: &Artifacts, criu: &Criu, backend: &str, world: &Path) -> R {
        let so = Path::new(PLUGIN_DIR).join("cuda_plugin.so");
        std::fs::copy(&a.plugin_so, &so)
            .map_err(|e| format!("copying {} to {}: {e}", a.plugin_so.display(), so.display()))?;
        chmod(&so, 0o644)?;
        write(
            Path::new(OPTIONS_FILE),
            &format!(
                "# the node's options for cuda_plugin (written by plugin/tests/podman.rs)\n\n\
                 backend = {backend}\n\
                 cuda-checkpoint = {}\n",
                a.cuda_checkpoint.display(),
            ),
        )?;
        chmod(Path::new(OPTIONS_FILE), 0o644)?;
        write(
            Path::new(NODE_CRIU),
            &format!(
                "#!/bin/sh\n\
                 # The node's CRIU {} (plugin/tests/podman.rs), with the mock world standing in\n\
                 # for the GPU driver. No option of the plugin is set here.\n\
                 export MOCK_CUDA_WORLD={world}\n\
                 export LD_LIBRARY_PATH={world}/lib\n\
                 export CRIU_CUDA_FORCE_ENABLE=1\n\
                 exec {} \"$@\"\n",
                criu.version,
                criu.path.display(),
                world = world.display(),
            ),
        )?;
        chmod(Path::new(NODE_CRIU), 0o755)
    }
}

impl Drop for Node {
    /// Takes the overlays away (lazily: the case's programs may still hold files) before the
    /// directory under them is removed.
    fn drop(&mut self) {
        for target in OVERLAID.into_iter().rev() {
            let _ = Command::new("umount").args(["-l", target]).status();
        }
    }
}

/// The hard limit of `what` (a row of `/proc/self/limits`).
fn hard_limit(what: &str) -> R<u64> {
    let text = read(Path::new("/proc/self/limits"));
    let row = text
        .lines()
        .find_map(|l| l.strip_prefix(what))
        .ok_or_else(|| format!("/proc/self/limits has no {what:?}"))?;
    let hard = row.split_whitespace().nth(1).unwrap_or_default();
    Ok(match hard {
        "unlimited" => 1_048_576,
        n => n
            .parse()
            .map_err(|_| format!("/proc/self/limits: {what} {row:?}"))?,
    })
}

// ---------------------------------------------------------------------------------------------
// A case

/// One case's podman, world and containers, from `podman import` to `podman rm -f`.
struct Case<'n> {
    podman: PathBuf,
    runc: PathBuf,
    node: &'n Node,
    backend: &'static str,
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
    keep: bool,
    world: PathBuf,
    report: PathBuf,
    /// The containers created (their names), for `podman rm -f`.
    names: Vec<String>,
    id: u32,
}

impl<'n> Case<'n> {
    fn new(
        podman: &Path,
        runc: &Path,
        node: &'n Node,
        criu: &Criu,
        backend: &'static str,
        faults: &str,
    ) -> R<Case<'n>> {
        static N: AtomicU32 = AtomicU32::new(0);
        let a = artifacts().as_ref().map_err(Clone::clone)?;
        let dir = tempfile::Builder::new()
            .prefix("podman-cuda-")
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?;
        let path = dir.path().to_path_buf();
        let c = Case {
            podman: podman.to_path_buf(),
            runc: runc.to_path_buf(),
            node,
            backend,
            world: path.join("shared/world"),
            report: path.join("shared/report.txt"),
            path,
            dir: Some(dir),
            keep: false,
            names: Vec::new(),
            id: N.fetch_add(1, Ordering::SeqCst),
        };
        for d in [
            "storage",
            "run",
            "tmp",
            "podman-tmp",
            "net.d",
            "runc",
            "shared",
        ] {
            mkdir(&c.path.join(d))?;
        }
        init_world(a, &c.world, &world_config(faults))?;
        node.install(a, criu, backend, &c.world)?;
        let out = c.podman_ok(&["import", &c.node.rootfs_tar().display().to_string(), IMAGE])?;
        ensure!(!out.stdout.is_empty(), "podman import printed no image id");
        Ok(c)
    }

    /// `MOCK_CUDA_WORLD=<world>`: marks every process of this case (the container's, CRIU's,
    /// the guardian's, the utility's).
    fn marker(&self) -> String {
        format!("MOCK_CUDA_WORLD={}", self.world.display())
    }

    /// The container name `criu-cuda-<pid>-<case>-<what>`.
    fn name(&self, what: &str) -> String {
        format!("criu-cuda-{}-{}-{what}", std::process::id(), self.id)
    }

    /// A podman command with the case's storage, state and runtime, and the environment the
    /// node's podman has (plus a `CRIU_PLUGIN_OPTIONS` that must not reach CRIU).
    fn podman(&self, args: &[&str]) -> Command {
        let p = |d: &str| self.path.join(d).display().to_string();
        let other = if self.backend == "driver-api" {
            "cuda-checkpoint"
        } else {
            "driver-api"
        };
        let mut cmd = Command::new(&self.podman);
        cmd.args(["--root", &p("storage"), "--runroot", &p("run")])
            .args(["--tmpdir", &p("podman-tmp"), "--network-config-dir"])
            .arg(p("net.d"))
            .args(["--cgroup-manager", "cgroupfs", "--events-backend", "file"])
            .args(["--storage-driver", "vfs", "--runtime"])
            .arg(&self.runc)
            .args(["--runtime-flag", &format!("root={}", p("runc"))])
            .args(args)
            .env("PATH", NODE_PATH)
            .env("TMPDIR", p("tmp"))
            .env(
                "CRIU_PLUGIN_OPTIONS",
                format!("cuda_plugin.backend={other}"),
            )
            .env_remove(criu_cuda_env::PLUGIN_CONFIG)
            .env_remove("CRIU_LIBS_DIR")
            .env_remove("CRIU_CONFIG_FILE")
            .env_remove("MOCK_CUDA_WORLD")
            .env_remove("LD_LIBRARY_PATH")
            .env_remove(criu_cuda_env::FORCE_ENABLE)
            .env_remove("CUDA_VISIBLE_DEVICES");
        cmd
    }

    fn podman_run(&self, args: &[&str], limit: Duration) -> R<Output> {
        run_within(&mut self.podman(args), limit, &format!("podman {args:?}"))
    }

    fn podman_ok(&self, args: &[&str]) -> R<Output> {
        run_ok(
            &mut self.podman(args),
            Duration::from_secs(60),
            &format!("podman {args:?}"),
        )
    }

    /// `podman inspect`'s `field` of container `name` (`None` when podman does not know it).
    fn inspect(&self, name: &str, field: &str) -> R<Option<String>> {
        let out = self.podman_run(
            &["inspect", "--type", "container", "--format", field, name],
            Duration::from_secs(20),
        )?;
        if !out.status.success() {
            return Ok(None);
        }
        Ok(Some(String::from_utf8_lossy(&out.stdout).trim().to_owned()))
    }

    fn status(&self, name: &str) -> R<Option<String>> {
        self.inspect(name, "{{.State.Status}}")
    }

    fn expect_status(&self, name: &str, want: &str, when: &str) -> R {
        let got = self.status(name)?;
        ensure!(
            got.as_deref() == Some(want),
            "container {name} is {got:?} {when}, not {want:?}"
        );
        Ok(())
    }

    /// The container's directory of podman's (`.../userdata`: the CRIU logs, the checkpoint).
    fn userdata(&self, name: &str) -> R<PathBuf> {
        Ok(PathBuf::from(
            self.inspect(name, "{{.StaticDir}}")?
                .ok_or_else(|| format!("podman does not know container {name}"))?,
        ))
    }

    fn lines(&self, kind: &str) -> usize {
        read(&self.report)
            .lines()
            .filter(|l| l.starts_with(kind))
            .count()
    }

    /// `podman run -d` of the workload tree as container `name`; waits for its 3 READY lines.
    fn start(&mut self, name: &str) -> R {
        let a = artifacts().as_ref().map_err(Clone::clone)?;
        let programs = a
            .mock_app
            .parent()
            .ok_or("mock-cuda-app has no directory")?
            .display()
            .to_string();
        let shared = self.path.join("shared").display().to_string();
        let world = self.world.display().to_string();
        let seccomp = format!("seccomp={}", self.node.seccomp().display());
        let nofile = format!("nofile={0}:{0}", self.node.nofile);
        let mock_world = format!("MOCK_CUDA_WORLD={world}");
        let ld_path = format!("LD_LIBRARY_PATH={world}/lib");
        let report = self.report.display().to_string();
        let app = a.mock_app.display().to_string();
        let mut args: Vec<&str> = vec!["run", "-d", "--name", name, "--network", "none"];
        args.extend(["--ulimit", &nofile, "--ulimit", "nproc=4096:4096"]);
        args.extend(["--security-opt", &seccomp, "-v", "/usr:/usr:ro"]);
        let ro = format!("{programs}:{programs}:ro");
        let rw = format!("{shared}:{shared}");
        args.extend(["-v", &ro, "-v", &rw, "-e", &mock_world, "-e", &ld_path]);
        args.extend([IMAGE, &app]);
        args.extend(TREE3);
        args.extend(["--report", &report]);
        self.names.push(name.to_owned());
        self.podman_ok(&args)?;
        ensure!(
            wait_until(Duration::from_secs(15), || self.lines("READY ") >= 3),
            "the workload tree in the container did not report 3 READY lines:\n{}",
            read(&self.report)
        );
        self.expect_status(name, "running", "after podman run")
    }

    /// Both CUDA tasks alive and in `want` in the world (waits up to 3 s for it).
    fn expect_cuda(&self, want: &str) -> R {
        expect_live_cuda(&self.world, want)
    }

    /// Both CUDA tasks CHECKPOINTED in the world (their processes are gone).
    fn expect_checkpointed(&self) -> R {
        let states = world_states(&self.world)?;
        ensure!(
            states.len() == 2 && states.iter().all(|(_, s)| *s == CudaState::Checkpointed),
            "after the checkpoint the world should hold 2 checkpointed tasks: {states:?}"
        );
        Ok(())
    }

    /// Every process of container `name` answers SIGUSR1 with a PASS line: the container's
    /// first process (`podman inspect`'s `.State.Pid`) and its descendants are signalled from
    /// here, as `runc kill --all` does (`podman kill` signals the first process only).
    fn verify_data(&self, name: &str) -> R {
        let pid: i32 = self
            .inspect(name, "{{.State.Pid}}")?
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("no pid for container {name}"))?;
        let tree = descendants(pid);
        ensure!(
            tree.len() == 3,
            "container {name} should have 3 processes, has {tree:?}"
        );
        let before = self.lines("PASS");
        for &p in &tree {
            ensure!(signal(p, SIGUSR1), "cannot signal pid {p}");
        }
        let all = wait_until(Duration::from_secs(10), || {
            self.lines("PASS") >= before + 3 || self.lines("FAIL") > 0
        });
        let report = read(&self.report);
        ensure!(
            self.lines("FAIL") == 0,
            "a task failed its data check:\n{report}"
        );
        ensure!(all, "not every task answered SIGUSR1:\n{report}");
        Ok(())
    }

    /// `podman container checkpoint ARGS NAME`: its output, the dump log (podman's
    /// `userdata/dump.log`, read before anything can remove it) and the time.
    fn checkpoint(&self, name: &str, args: &[&str]) -> R<(Output, String, f64)> {
        let userdata = self.userdata(name)?;
        let t = Instant::now();
        let mut all = vec!["container", "checkpoint"];
        all.extend(args);
        all.push(name);
        let out = self.podman_run(&all, Duration::from_secs(120))?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        reap();
        Ok((out, read(&userdata.join("dump.log")), ms))
    }

    fn checkpoint_ok(&self, name: &str, args: &[&str]) -> R<(String, f64)> {
        let (out, log, ms) = self.checkpoint(name, args)?;
        ensure!(
            out.status.success(),
            "podman container checkpoint failed ({}): {}\ndump.log tail:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            tail(&log, 30)
        );
        Ok((log, ms))
    }

    /// `podman container restore ARGS` (ending with the container or `--import FILE`) of the
    /// container that ends up named `name`: the restore log and the time.
    fn restore(&mut self, name: &str, args: &[&str]) -> R<(String, f64)> {
        let t = Instant::now();
        let mut all = vec!["container", "restore", "--keep"];
        all.extend(args);
        if !self.names.iter().any(|n| n == name) {
            self.names.push(name.to_owned());
        }
        let out = self.podman_run(&all, Duration::from_secs(120))?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let log = self
            .userdata(name)
            .map(|u| read(&u.join("restore.log")))
            .unwrap_or_default();
        ensure!(
            out.status.success(),
            "podman container restore failed ({}): {}\nrestore.log tail:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            tail(&log, 30)
        );
        Ok((log, ms))
    }

    /// The plugin was loaded by CRIU 4.2 from the node's plugin directory and took its options
    /// from the file next to it (and from nothing else: the backend is the file's).
    fn expect_options_file(&self, what: &str, log: &str) -> R {
        let used =
            format!("cuda_plugin: options file {OPTIONS_FILE} (next to the plugin): 2 option(s)");
        let from = format!(
            "cuda_plugin: options from {OPTIONS_FILE}: backend={}",
            self.backend
        );
        ensure!(
            log.contains(&used) && log.contains(&from),
            "the {what} log does not show the plugin loaded from {PLUGIN_DIR} with its options \
             file ({used:?}, {from:?}):\n{}",
            tail(log, 30)
        );
        ensure!(
            log.lines().take(5).any(|l| l.contains("Version: 4.2")),
            "the {what} log was not written by CRIU 4.2:\n{}",
            log.lines().take(5).collect::<Vec<_>>().join("\n")
        );
        Ok(())
    }

    /// The backend the options file chose did the work: the utility ran, or never did.
    fn expect_backend_used(&self) -> R<usize> {
        let runs = cli_runs(&read(&self.world.join("trace.log")));
        match self.backend {
            "cuda-checkpoint" => ensure!(runs > 0, "cuda-checkpoint never ran"),
            _ => ensure!(
                runs == 0,
                "cuda-checkpoint ran {runs} times with the driver API"
            ),
        }
        Ok(runs)
    }

    /// `podman rm -f -t 0` of every container of the case, then checks that no process of the
    /// case remains (the guardian ends on its own, bounded, after CRIU).
    fn teardown(&mut self) -> R {
        let mut result = Ok(());
        if !self.names.is_empty() {
            let mut args = vec!["rm", "-f", "-t", "0", "--ignore"];
            let names = std::mem::take(&mut self.names);
            args.extend(names.iter().map(String::as_str));
            match self.podman_run(&args, Duration::from_secs(60)) {
                Ok(out) if out.status.success() => {}
                Ok(out) => {
                    result = Err(format!(
                        "podman rm -f failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    ))
                }
                Err(e) => result = Err(e),
            }
        }
        // conmon and the `podman container cleanup` it runs when a container exits name the
        // case's directory; they end on their own (and would make directories in it again).
        let case_dir = self.path.display().to_string();
        let settled = wait_until(Duration::from_secs(30), || {
            reap();
            processes_naming(&case_dir).is_empty()
        });
        if !settled && result.is_ok() {
            result = Err(format!(
                "podman's processes of the case did not end: {:?}",
                processes_naming(&case_dir)
            ));
        }
        if let Err(e) = end_marked_processes(&self.marker(), Duration::from_secs(90)) {
            if result.is_ok() {
                result = Err(e);
            }
        }
        result
    }
}

impl Drop for Case<'_> {
    fn drop(&mut self) {
        let _ = self.teardown();
        if self.keep {
            if let Some(d) = self.dir.take() {
                eprintln!("    kept {} for inspection", d.keep().display());
            }
        }
    }
}

/// The processes whose command line has an argument containing `text`.
fn processes_naming(text: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
                .filter(|&p| p != me)
                .filter(|p| {
                    std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                        c.split(|&b| b == 0)
                            .any(|a| String::from_utf8_lossy(a).contains(text))
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `pid` and its descendants (through `/proc/<pid>/task/<tid>/children`).
fn descendants(pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        for tid in threads(p) {
            let kids = read(Path::new(&format!("/proc/{p}/task/{tid}/children")));
            out.extend(
                kids.split_whitespace()
                    .filter_map(|k| k.parse::<i32>().ok()),
            );
        }
        i += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The cases

fn checkpoint_restore(c: &mut Case<'_>) -> R<String> {
    let name = c.name("ctr");
    c.start(&name)?;
    let (log, dump_ms) = c.checkpoint_ok(&name, &["--keep"])?;
    c.expect_options_file("dump", &log)?;
    c.expect_status(&name, "exited", "after podman container checkpoint")?;
    // The tasks are gone; the world keeps what CRIU's plugin left: both checkpointed.
    c.expect_checkpointed()?;
    let (log, restore_ms) = c.restore(&name, &[&name])?;
    c.expect_options_file("restore", &log)?;
    c.expect_status(&name, "running", "after podman container restore")?;
    c.expect_cuda("running")?;
    c.verify_data(&name)?;
    let runs = c.expect_backend_used()?;
    Ok(format!(
        "checkpoint {dump_ms:.0} ms, restore {restore_ms:.0} ms, {runs} cuda-checkpoint runs"
    ))
}

fn export_import(c: &mut Case<'_>) -> R<String> {
    let name = c.name("ctr");
    let new = c.name("imported");
    let tarball = c.path.join("checkpoint.tar.zst");
    let export = tarball.display().to_string();
    c.start(&name)?;
    let (log, dump_ms) = c.checkpoint_ok(&name, &["--keep", "--export", &export])?;
    c.expect_options_file("dump", &log)?;
    c.expect_status(
        &name,
        "exited",
        "after podman container checkpoint --export",
    )?;
    c.expect_checkpointed()?;
    let size = std::fs::metadata(&tarball)
        .map_err(|e| format!("the exported checkpoint {export}: {e}"))?
        .len();
    // The restore must come from the tarball alone: the original container, with its
    // checkpoint directory, is gone.
    c.podman_ok(&["rm", "-f", "-t", "0", &name])?;
    ensure!(
        c.status(&name)?.is_none(),
        "podman still knows {name} after podman rm"
    );
    let (log, restore_ms) = c.restore(&new, &["--import", &export, "--name", &new])?;
    c.expect_options_file("restore", &log)?;
    c.expect_status(&new, "running", "after podman container restore --import")?;
    c.expect_cuda("running")?;
    c.verify_data(&new)?;
    c.expect_backend_used()?;
    Ok(format!(
        "checkpoint --export {dump_ms:.0} ms ({} KiB), restore --import {restore_ms:.0} ms",
        size / 1024
    ))
}

fn checkpoint_fails(c: &mut Case<'_>) -> R<String> {
    let name = c.name("ctr");
    c.start(&name)?;
    let userdata = c.userdata(&name)?;
    let (out, log, dump_ms) = c.checkpoint(&name, &[])?;
    ensure!(
        !out.status.success(),
        "podman container checkpoint succeeded although the 2nd task's lock fails"
    );
    // What the user sees: runc's summary and where CRIU's log is, not the plugin's error.
    let printed = String::from_utf8_lossy(&out.stderr);
    let log_file = format!("log file: {}", userdata.join("dump.log").display());
    ensure!(
        printed.contains("criu failed: type NOTIFY errno 0") && printed.contains(&log_file),
        "podman did not print runc's \"criu failed ... {log_file}\":\n{printed}"
    );
    ensure!(
        !printed.contains("CUDA_ERROR_NOT_READY"),
        "podman printed the plugin's error (the runtimes only name the log):\n{printed}"
    );
    c.expect_options_file("dump", &log)?;
    ensure!(
        log.contains("cuda_plugin: Error") && log.contains("CUDA_ERROR_NOT_READY"),
        "the dump log does not show the plugin's lock failure:\n{}",
        tail(&log, 30)
    );
    c.expect_status(&name, "running", "after the failed checkpoint")?;
    c.expect_cuda("running")?;
    c.verify_data(&name)?;
    Ok(format!("failed checkpoint {dump_ms:.0} ms"))
}

// ---------------------------------------------------------------------------------------------
// The trials

/// A case's body: what it checks, with its times for the report line.
type CaseBody = fn(&mut Case<'_>) -> R<String>;

fn run_case(
    podman: &Path,
    runc: &Path,
    node: &SharedNode,
    criu: &Criu,
    backend: &'static str,
    faults: &str,
    body: CaseBody,
) -> Result<(), Failed> {
    let t = Instant::now();
    let node = node
        .get_or_init(Node::set_up)
        .as_ref()
        .map_err(|e| Failed::from(format!("setting up the node: {e}")))?;
    let mut c = Case::new(podman, runc, node, criu, backend, faults).map_err(Failed::from)?;
    let r = body(&mut c);
    let down = c.teardown();
    let r = r.and_then(|s| down.map(|()| s));
    c.keep = r.is_err() || criu_cuda_env::is_on(criu_cuda_env::PODMAN_KEEP);
    let r = r.map(|s| {
        println!(
            "    CRIU {} {backend}: {s}; case {:.1} s",
            criu.version,
            t.elapsed().as_secs_f64()
        )
    });
    drop(c);
    r.map_err(Failed::from)
}

/// The node, set up by the first trial that runs (on the main thread: libtest-mimic runs them
/// there, one at a time, and the process still has a single thread).
type SharedNode = Arc<OnceLock<R<Node>>>;

fn trials(podman: PathBuf, runc: PathBuf, criu: Criu, node: &SharedNode) -> Vec<Trial> {
    let mut out = Vec::new();
    for backend in BACKENDS {
        let cases: [(&str, String, CaseBody); 3] = [
            ("checkpoint-restore", String::new(), checkpoint_restore),
            ("export-import", String::new(), export_import),
            ("checkpoint-fails", lock_fails(backend, 2), checkpoint_fails),
        ];
        for (case, faults, body) in cases {
            let (p, r, n, cr) = (podman.clone(), runc.clone(), Arc::clone(node), criu.clone());
            out.push(Trial::test(
                format!("podman/criu-{}/{backend}/{case}", criu.series),
                move || run_case(&p, &r, &n, &cr, backend, &faults, body),
            ));
        }
    }
    out
}

fn skipped(reason: String) -> Vec<Trial> {
    eprintln!("podman: skipping: {reason}");
    vec![Trial::ignorable_test("podman", move || {
        Ok(Completion::ignored_with(reason))
    })]
}

fn failing(reason: String) -> Vec<Trial> {
    vec![Trial::test("podman", move || Err(reason.into()))]
}

/// runc, which podman is told to use: `/usr/sbin/runc` or `runc` in `NODE_PATH`.
fn find_runc() -> Option<PathBuf> {
    std::env::split_paths(NODE_PATH)
        .map(|d| d.join("runc"))
        .find(|p| p.is_file())
}

fn main() {
    let mut args = Arguments::from_args();
    // One at a time, on the main thread: the cases share the node's files and the private
    // mount namespace this thread enters, and the machine has few cores.
    args.test_threads = Some(1);
    let in_ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false");
    let require_podman = in_ci || criu_cuda_env::is_on(criu_cuda_env::REQUIRE_PODMAN);
    let require_criu = criu_cuda_env::is_on(criu_cuda_env::REQUIRE_CRIU);
    let criu = find_criu().into_iter().find(|c| c.series == "4.2");
    let podman = find_podman().map(|p| program_version(&p).map(|v| (p, v)));
    let node = SharedNode::default();
    let trials = if !is_root() {
        skipped("not root (podman and CRIU need root to checkpoint and restore)".into())
    } else {
        match (podman, criu) {
            (_, None) => {
                let reason =
                    "no CRIU 4.2.x found (set CRIU_CUDA_CRIU_4_2 or run scripts/fetch-criu.sh)";
                if require_criu {
                    failing(format!("{reason}, and CRIU_CUDA_REQUIRE_CRIU=1"))
                } else {
                    skipped(reason.into())
                }
            }
            (None, _) if !require_podman => skipped(
                "podman is not installed (apt-get install podman; CRIU_CUDA_PODMAN=PATH names \
                 another)"
                    .into(),
            ),
            (Some(Err(e)), _) if !require_podman => skipped(e),
            (None, _) => failing(
                "podman is not installed, and this is CI (CI or CRIU_CUDA_REQUIRE_PODMAN=1 is \
                 set): .ci/run installs it with apt-get"
                    .into(),
            ),
            (Some(Err(e)), _) => failing(e),
            (Some(Ok((podman, version))), Some(criu)) => match find_runc() {
                None => failing(format!(
                    "podman is installed but runc is not in {NODE_PATH} (apt-get install runc)"
                )),
                Some(runc) => {
                    if !become_subreaper() {
                        eprintln!(
                            "podman: warning: cannot become a child subreaper; pids may free \
                             slowly"
                        );
                    }
                    eprintln!("podman: {version} at {}", podman.display());
                    eprintln!("podman: runc at {}", runc.display());
                    eprintln!("podman: CRIU {} at {}", criu.version, criu.path.display());
                    trials(podman, runc, criu, &node)
                }
            },
        }
    };
    let t = Instant::now();
    let conclusion = libtest_mimic::run(&args, trials);
    if !args.list {
        println!("podman: all cases took {:.1} s", t.elapsed().as_secs_f64());
    }
    drop(node);
    conclusion.exit();
}
