//! `cuda_plugin.so` under real runc (Debian's 1.1.x) and real CRIU (4.1.x and 4.2.x): a mock CUDA
//! workload tree in a container is checkpointed with `runc checkpoint` and brought back with
//! `runc restore -d`, the way a node's container runtime drives CRIU. One trial per CRIU version
//! × backend × case:
//!
//! | Case | What it checks |
//! |---|---|
//! | `checkpoint-restore` | the 3-process tree (a multi-threaded CUDA root, a CPU-only child, a CUDA grandchild) runs as a container; `runc checkpoint` succeeds and leaves both CUDA tasks CHECKPOINTED in the world, the container gone; `runc restore -d` brings it back running, both CUDA tasks RUNNING (unlocked) again, and every task answers SIGUSR1 with a PASS line (its GPU data intact); the world's trace shows `cuda-checkpoint` runs exactly when the file chose that backend |
//! | `checkpoint-fails` | the 2nd CUDA task's lock fails (`NOT_READY`, injected through the world): `runc checkpoint` fails, printing only `criu failed: type NOTIFY errno 0` and `log file: IMAGES/dump.log` (the plugin's message is in that log, not on runc's stderr), the container keeps running, both CUDA tasks are RUNNING (nothing left locked) and the data checks PASS |
//! | `custom-storage` (driver API only, CUDA 13.4 world) | `checkpoint-restore` with `custom-storage = on` in the options file: `runc checkpoint` leaves the GPU memory in `cuda-cs-*.img` files of the image path (the dump log says what each task moved), and `runc restore -d` brings the tree back from them, data intact |
//! | `untrusted-options-file` (driver API only) | the trust rule (`plugin/src/trust.rs`): `cuda_plugin.conf` owned by another user, then group-writable, then in a world-writable directory: each `runc checkpoint` fails at `init` with CRIU's log naming the file (or directory), its owner, its mode and the fix, nothing locked, the container running; put right, checkpoint and restore work |
//! | `untrusted-utility` (cuda-checkpoint only) | a world-writable `cuda-checkpoint` named by the options file is never run: `runc checkpoint` fails at `init` naming it and the fix |
//! | `bad-options-file` (driver API only) | `cuda_plugin.conf` has an invalid value on its 5th line: `runc checkpoint` fails before any task is touched, CRIU's log names the file and the line, the container keeps running with its data |
//!
//! What makes it a deployment test rather than another CRIU test: nothing is set up through
//! CRIU's command line or the plugin's environment variables. runc reads the bundle's
//! `org.criu.config` annotation and hands that CRIU configuration file (`libdir <dir>`) to
//! `criu swrk`; CRIU loads the plugin from that directory; the plugin takes its backend (and the
//! utility's path) from `cuda_plugin.conf` next to itself. The CRIU logs (`dump.log`,
//! `restore.log` in the image directory) must name that file. `CRIU_PLUGIN_OPTIONS` and
//! `CRIU_CUDA_PLUGIN_CONFIG` are removed from runc's environment. Only the mock world's
//! variables and `CRIU_CUDA_FORCE_ENABLE=1` (there is no NVIDIA GPU here) are given to runc,
//! which passes its environment to CRIU.
//!
//! The bundle: a root file system in the case's directory (writable: CRIU makes a directory in it
//! at restore) with the host's `/usr` bound read-only (`/bin`, `/lib`, `/lib64` and `/sbin` are
//! links into it, as on the host), the built programs' directory read-only, and the case's
//! `shared/` directory (the mock world and the workload's report) read-write, each at its own
//! path; pid, mount, ipc and uts namespaces, no network namespace (CRIU would need `iptables`
//! to lock it). The container's standard streams are pipes this test holds (runc records them as
//! external pipes and restores them from `runc restore`'s own), since a file or `/dev/null` of
//! the host lies on a mount the container does not have. runc keeps its state under the case's
//! directory (`runc --root`), so no other container of the machine is ever seen or touched, and
//! every case ends with `runc delete -f` (also when it fails or panics).
//!
//! Skips (with the reason) when not root, when no CRIU is found (unless
//! `CRIU_CUDA_REQUIRE_CRIU=1`), or when `runc` is not installed, unless `CRIU_CUDA_REQUIRE_RUNC=1`
//! or `CI` is set (then a missing runc fails). `CRIU_CUDA_RUNC=PATH` names the runc to use
//! (default: `runc` in `PATH`). A failed case keeps its directory and prints its path.
//!
//! Run: `cargo test -p cuda-plugin --test runc [-- FILTER]`.

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use testkit::criu::*;
use testkit::wait::output_within;

const BACKENDS: [&str; 2] = ["driver-api", "cuda-checkpoint"];

/// Which runc to run: `CRIU_CUDA_RUNC`, else `runc` found in `PATH`.
fn find_runc() -> Option<PathBuf> {
    find_program(criu_cuda_env::RUNC, "runc")
}

/// One container, from bundle to `runc delete -f`.
struct Container {
    runc: PathBuf,
    criu: Criu,
    backend: &'static str,
    id: String,
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
    keep: bool,
    state_root: PathBuf,
    bundle: PathBuf,
    plugins: PathBuf,
    world: PathBuf,
    report: PathBuf,
    images: PathBuf,
    /// The standard streams of the container's processes (our ends of the pipes), from the
    /// latest `runc run` or `runc restore`.
    stdio: Vec<Child>,
    /// Whether `runc run` was ever started (and so `runc delete -f` is owed).
    started: bool,
}

impl Container {
    fn new(
        runc: &Path,
        criu: &Criu,
        backend: &'static str,
        faults: &str,
        custom_storage: bool,
    ) -> R<Container> {
        static N: AtomicU32 = AtomicU32::new(0);
        let a = artifacts().as_ref().map_err(Clone::clone)?;
        let dir = tempfile::Builder::new()
            .prefix("runc-cuda-")
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?;
        let path = dir.path().to_path_buf();
        let c = Container {
            runc: runc.to_path_buf(),
            criu: criu.clone(),
            backend,
            id: format!(
                "criu-cuda-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ),
            state_root: path.join("runc-state"),
            bundle: path.join("bundle"),
            plugins: path.join("plugins"),
            world: path.join("shared/world"),
            report: path.join("shared/report.txt"),
            images: path.join("images"),
            path,
            dir: Some(dir),
            keep: false,
            stdio: Vec::new(),
            started: false,
        };
        for d in [
            &c.state_root,
            &c.plugins,
            &c.images,
            &c.bundle.join("rootfs"),
        ] {
            mkdir(d)?;
        }
        // The plugin, found by CRIU through the configuration file the annotation names, and its
        // options file next to it.
        std::fs::copy(&a.plugin_so, c.plugins.join("cuda_plugin.so"))
            .map_err(|e| format!("copying {}: {e}", a.plugin_so.display()))?;
        write(
            &c.plugins.join("cuda_plugin.conf"),
            &format!(
                "# the node's options for cuda_plugin (written by plugin/tests/runc.rs)\n\n\
                 backend = {backend}\n\
                 cuda-checkpoint = {}\n{}",
                a.cuda_checkpoint.display(),
                if custom_storage {
                    "custom-storage = on\n"
                } else {
                    ""
                }
            ),
        )?;
        write(
            &c.criu_conf(),
            &format!(
                "# CRIU configuration for runc (org.criu.config)\nlibdir {}\n",
                c.plugins.display()
            ),
        )?;
        // The mock world, shared with the container at the same path.
        let branch = if custom_storage { 615 } else { 580 };
        init_world(a, &c.world, &world_config_on(branch, faults))?;
        c.write_bundle(&a.mock_app)?;
        Ok(c)
    }

    fn criu_conf(&self) -> PathBuf {
        self.path.join("criu-runc.conf")
    }

    fn shared(&self) -> PathBuf {
        self.path.join("shared")
    }

    /// `MOCK_CUDA_WORLD=<world>`: marks every process of this case (the container's, CRIU's,
    /// the guardian's, the utility's).
    fn marker(&self) -> String {
        format!("MOCK_CUDA_WORLD={}", self.world.display())
    }

    fn write_bundle(&self, mock_app: &Path) -> R {
        let rootfs = self.bundle.join("rootfs");
        for l in ["bin", "lib", "lib64", "sbin"] {
            std::os::unix::fs::symlink(format!("usr/{l}"), rootfs.join(l))
                .map_err(|e| format!("linking {l} in the root file system: {e}"))?;
        }
        for d in ["usr", "proc", "dev", "tmp", "etc"] {
            mkdir(&rootfs.join(d))?;
        }
        let programs = mock_app.parent().ok_or("mock-cuda-app has no directory")?;
        let shared = self.shared();
        let bind = |p: &Path, rw: bool| {
            json!({
                "destination": p, "type": "bind", "source": p,
                "options": ["rbind", if rw { "rw" } else { "ro" }],
            })
        };
        let mut args: Vec<String> = vec![mock_app.display().to_string()];
        args.extend(TREE3.iter().map(|s| (*s).to_owned()));
        args.extend(["--report".to_owned(), self.report.display().to_string()]);
        let config = json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                "user": { "uid": 0, "gid": 0 },
                "args": args,
                "env": [
                    "PATH=/usr/bin:/usr/sbin",
                    format!("MOCK_CUDA_WORLD={}", self.world.display()),
                    format!("LD_LIBRARY_PATH={}", self.world.join("lib").display()),
                ],
                "cwd": "/",
                "noNewPrivileges": true,
            },
            "root": { "path": "rootfs", "readonly": false },
            "hostname": "cuda",
            "mounts": [
                { "destination": "/proc", "type": "proc", "source": "proc" },
                { "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                  "options": ["nosuid", "strictatime", "mode=755", "size=1024k"] },
                bind(Path::new("/usr"), false),
                bind(programs, false),
                bind(&shared, true),
            ],
            "annotations": { "org.criu.config": self.criu_conf() },
            "linux": {
                "namespaces": [
                    { "type": "pid" }, { "type": "mount" }, { "type": "ipc" }, { "type": "uts" }
                ],
            },
        });
        let text = serde_json::to_string_pretty(&config).map_err(|e| e.to_string())?;
        mkdir(&shared)?;
        write(&self.bundle.join("config.json"), &text)
    }

    /// A runc command with the case's state root and log, and the environment CRIU inherits.
    fn runc(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.runc);
        cmd.arg("--root")
            .arg(&self.state_root)
            .arg("--log")
            .arg(self.path.join("runc.log"))
            .arg("--criu")
            .arg(&self.criu.path)
            .args(args)
            .current_dir(&self.bundle)
            .env("MOCK_CUDA_WORLD", &self.world)
            .env("LD_LIBRARY_PATH", self.world.join("lib"))
            .env(criu_cuda_env::FORCE_ENABLE, "1")
            .env_remove("CRIU_PLUGIN_OPTIONS")
            .env_remove(criu_cuda_env::PLUGIN_CONFIG)
            .env_remove("CRIU_LIBS_DIR")
            .env_remove("CRIU_CONFIG_FILE")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove(criu_cuda_env::PLUGIN_MAX_HOOKS);
        cmd
    }

    /// Runs a runc command that does not start container processes, bounded by `limit`.
    fn run(&self, args: &[&str], limit: Duration) -> R<Output> {
        output_within(
            self.runc(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
            limit,
            &format!("runc {args:?}"),
        )
    }

    /// `runc run -d` or `runc restore -d`: the container's standard streams are pipes whose
    /// other ends this test keeps (see the module docs); waits for runc itself to return.
    fn start_detached(&mut self, args: &[&str]) -> R {
        self.started = true;
        let mut child = self
            .runc(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting runc {args:?}: {e}"))?;
        let limit = Duration::from_secs(60);
        let ok = wait_until(limit, || matches!(child.try_wait(), Ok(Some(_))));
        if !ok {
            let _ = child.kill();
        }
        let status = child.wait().map_err(|e| format!("waiting for runc: {e}"))?;
        self.stdio.push(child);
        ensure!(ok, "runc {args:?} ran over {limit:?}; killed");
        ensure!(
            status.success(),
            "runc {args:?} failed ({status}); runc.log:\n{}",
            tail(&read(&self.path.join("runc.log")), 10)
        );
        Ok(())
    }

    /// The container's status (`running`, ...), or `None` when runc does not know it.
    fn status(&self) -> R<Option<String>> {
        let out = self.run(&["state", &self.id], Duration::from_secs(20))?;
        if !out.status.success() {
            return Ok(None);
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("runc state printed no JSON: {e}"))?;
        Ok(v["status"].as_str().map(str::to_owned))
    }

    fn ready_lines(&self) -> usize {
        read(&self.report)
            .lines()
            .filter(|l| l.starts_with("READY "))
            .count()
    }

    fn start(&mut self) -> R {
        let id = self.id.clone();
        self.start_detached(&["run", "-d", &id])?;
        ensure!(
            wait_until(Duration::from_secs(15), || self.ready_lines() >= 3),
            "the workload tree in the container did not report 3 READY lines:\n{}",
            read(&self.report)
        );
        ensure!(
            self.status()?.as_deref() == Some("running"),
            "the container is not running after runc run"
        );
        Ok(())
    }

    /// Both CUDA tasks alive and in `want` in the world (waits up to 3 s for it).
    fn expect_cuda(&self, want: &str) -> R {
        expect_live_cuda(&self.world, want)
    }

    /// Every process of the container answers SIGUSR1 with a PASS line (`runc kill --all`).
    fn verify_data(&self) -> R {
        let lines = |k: &str| {
            read(&self.report)
                .lines()
                .filter(|l| l.starts_with(k))
                .count()
        };
        let before = lines("PASS");
        let out = self.run(
            &["kill", "--all", &self.id, "USR1"],
            Duration::from_secs(20),
        )?;
        ensure!(
            out.status.success(),
            "runc kill --all USR1 failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let all = wait_until(Duration::from_secs(10), || {
            lines("PASS") >= before + 3 || lines("FAIL") > 0
        });
        let report = read(&self.report);
        ensure!(
            lines("FAIL") == 0,
            "a task failed its data check:\n{report}"
        );
        ensure!(all, "not every task answered SIGUSR1:\n{report}");
        Ok(())
    }

    fn images_arg(&self) -> String {
        self.images.display().to_string()
    }

    fn checkpoint(&self) -> R<(Output, String, f64)> {
        let t = Instant::now();
        let img = self.images_arg();
        let out = self.run(
            &[
                "checkpoint",
                "--image-path",
                &img,
                "--work-path",
                &img,
                &self.id,
            ],
            Duration::from_secs(120),
        )?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        reap();
        Ok((out, read(&self.images.join("dump.log")), ms))
    }

    fn restore(&mut self) -> R<(String, f64)> {
        let t = Instant::now();
        let img = self.images_arg();
        let id = self.id.clone();
        let bundle = self.bundle.display().to_string();
        let r = self.start_detached(&[
            "restore",
            "-d",
            "--image-path",
            &img,
            "--work-path",
            &img,
            "--bundle",
            &bundle,
            &id,
        ]);
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let log = read(&self.images.join("restore.log"));
        r.map_err(|e| format!("{e}\nrestore.log tail:\n{}", tail(&log, 25)))?;
        Ok((log, ms))
    }

    /// The plugin logged that its options came from the file next to it.
    fn expect_options_file(&self, what: &str, log: &str) -> R {
        let file = self.plugins.join("cuda_plugin.conf");
        let used = format!(
            "cuda_plugin: options file {} (next to the plugin): 2 option(s)",
            file.display()
        );
        let from = format!(
            "cuda_plugin: options from {}: backend={}",
            file.display(),
            self.backend
        );
        ensure!(
            log.contains(&used) && log.contains(&from),
            "the {what} log does not show the plugin loaded from the libdir of {} with its \
             options file ({used:?}, {from:?}):\n{}",
            self.criu_conf().display(),
            tail(log, 30)
        );
        Ok(())
    }

    /// `runc delete -f`, then checks that no process of the case remains (the guardian ends on
    /// its own, bounded, after CRIU) and that none but the container's was left running.
    fn teardown(&mut self) -> R {
        let mut result = Ok(());
        if self.started {
            let id = self.id.clone();
            match self.run(&["delete", "-f", &id], Duration::from_secs(30)) {
                Ok(out) if out.status.success() || self.status().ok().flatten().is_none() => {
                    self.started = false;
                }
                Ok(out) => {
                    result = Err(format!(
                        "runc delete -f failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    ))
                }
                Err(e) => result = Err(e),
            }
        }
        self.stdio.clear();
        if let Err(e) = end_marked_processes(&self.marker(), Duration::from_secs(90)) {
            if result.is_ok() {
                result = Err(e);
            }
        }
        result
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.teardown();
        if self.keep {
            if let Some(d) = self.dir.take() {
                eprintln!("    kept {} for inspection", d.keep().display());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The cases

fn checkpoint_restore(c: &mut Container) -> R<String> {
    c.start()?;
    let (out, log, dump_ms) = c.checkpoint()?;
    ensure!(
        out.status.success(),
        "runc checkpoint failed ({}): {}\ndump.log tail:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        tail(&log, 30)
    );
    c.expect_options_file("dump", &log)?;
    ensure!(
        c.status()?.is_none(),
        "runc still knows the container after a checkpoint without --leave-running"
    );
    // The tasks are gone; the world keeps what CRIU's plugin left: both checkpointed. (A
    // process that no longer exists has no restore thread, so read the world's records.)
    let states = world_states(&c.world)?;
    ensure!(
        states.len() == 2 && states.iter().all(|(_, s)| *s == CudaState::Checkpointed),
        "after the checkpoint the world should hold 2 checkpointed tasks: {states:?}"
    );
    let (log, restore_ms) = c.restore()?;
    c.expect_options_file("restore", &log)?;
    ensure!(
        c.status()?.as_deref() == Some("running"),
        "the container is not running after runc restore"
    );
    c.expect_cuda("running")?;
    c.verify_data()?;
    // The backend the options file chose did the work: the utility ran, or never did.
    let runs = cli_runs(&read(&c.world.join("trace.log")));
    match c.backend {
        "cuda-checkpoint" => ensure!(runs > 0, "cuda-checkpoint never ran"),
        _ => ensure!(
            runs == 0,
            "cuda-checkpoint ran {runs} times with the driver API"
        ),
    }
    Ok(format!(
        "checkpoint {dump_ms:.0} ms, restore {restore_ms:.0} ms, {runs} cuda-checkpoint runs"
    ))
}

/// `checkpoint_restore` through custom storage: the GPU memory goes to `cuda-cs-*.img` in the
/// image path and comes back from there.
fn custom_storage(c: &mut Container) -> R<String> {
    c.start()?;
    let (out, log, dump_ms) = c.checkpoint()?;
    ensure!(
        out.status.success(),
        "runc checkpoint failed ({}): {}\ndump.log tail:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        tail(&log, 30)
    );
    ensure!(
        log.matches("checkpointed into custom storage").count() == 2,
        "the dump log does not show both CUDA tasks checkpointed into custom storage:\n{}",
        tail(&log, 30)
    );
    let files: Vec<u64> = std::fs::read_dir(&c.images)
        .map_err(|e| format!("reading {}: {e}", c.images.display()))?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("cuda-cs-"))
        .filter_map(|e| e.metadata().ok().map(|m| m.len()))
        .collect();
    ensure!(
        files.len() == 2 && files.iter().all(|&n| n >= 3 * 4096),
        "the image path should hold one custom-storage file per CUDA task: {files:?}"
    );
    // Two checkpointed tasks holding nothing staged (the copier, a CUDA process of its own
    // with no memory, has exited and is not one of them).
    let status = MockWorld::open(&c.world)
        .and_then(|w| w.status())
        .map_err(|e| e.to_string())?;
    let held: Vec<(CudaState, u64)> = status
        .processes
        .iter()
        .filter(|p| p.state() != CudaState::Running)
        .map(|p| (p.state(), p.staged_bytes()))
        .collect();
    ensure!(
        held == [(CudaState::Checkpointed, 0), (CudaState::Checkpointed, 0)],
        "after the checkpoint the world should hold 2 checkpointed tasks with nothing staged: {held:?}"
    );
    let (log, restore_ms) = c.restore()?;
    ensure!(
        log.matches("restored from custom storage").count() == 2,
        "the restore log does not show both tasks restored from custom storage:\n{}",
        tail(&log, 30)
    );
    ensure!(
        c.status()?.as_deref() == Some("running"),
        "the container is not running after runc restore"
    );
    c.expect_cuda("running")?;
    c.verify_data()?;
    Ok(format!(
        "checkpoint {dump_ms:.0} ms, restore {restore_ms:.0} ms, {} custom-storage files",
        files.len()
    ))
}

fn checkpoint_fails(c: &mut Container) -> R<String> {
    c.start()?;
    let (out, log, dump_ms) = c.checkpoint()?;
    ensure!(
        !out.status.success(),
        "runc checkpoint succeeded although the 2nd task's lock fails"
    );
    // What runc shows (docs/troubleshooting.md): that CRIU failed, and where its log is; the
    // plugin's message is in that log only.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let dump_log = format!("log file: {}", c.images.join("dump.log").display());
    ensure!(
        stderr.contains("criu failed: type NOTIFY errno 0") && stderr.contains(&dump_log),
        "runc checkpoint's stderr does not say `criu failed: type NOTIFY errno 0` and \
         `{dump_log}`:\n{stderr}"
    );
    ensure!(
        !stderr.contains("CUDA_ERROR_NOT_READY") && !stderr.contains("cuda_plugin"),
        "runc checkpoint's stderr shows the plugin's message, which docs/troubleshooting.md says \
         runc does not (update it):\n{stderr}"
    );
    c.expect_options_file("dump", &log)?;
    ensure!(
        log.contains("cuda_plugin: Error") && log.contains("CUDA_ERROR_NOT_READY"),
        "the dump log does not show the plugin's lock failure:\n{}",
        tail(&log, 30)
    );
    ensure!(
        c.status()?.as_deref() == Some("running"),
        "the container is not running after the failed checkpoint"
    );
    c.expect_cuda("running")?;
    c.verify_data()?;
    Ok(format!("failed checkpoint {dump_ms:.0} ms"))
}

fn bad_options_file(c: &mut Container) -> R<String> {
    let file = c.plugins.join("cuda_plugin.conf");
    let mut text = read(&file);
    text.push_str("guardian = perhaps\n");
    write(&file, &text)?;
    c.start()?;
    let (out, log, dump_ms) = c.checkpoint()?;
    ensure!(
        !out.status.success(),
        "runc checkpoint succeeded with an invalid options file"
    );
    let want = format!(
        "options file {}, line 5: invalid value \"perhaps\" for option cuda_plugin.guardian",
        file.display()
    );
    ensure!(
        log.contains(&want),
        "the dump log does not name the file and line ({want:?}):\n{}",
        tail(&log, 20)
    );
    ensure!(
        c.status()?.as_deref() == Some("running"),
        "the container is not running after the refused checkpoint"
    );
    c.expect_cuda("running")?;
    let trace = read(&c.world.join("trace.log"));
    ensure!(
        !trace.contains("cuCheckpointProcessLock"),
        "a task was locked although init failed:\n{trace}"
    );
    c.verify_data()?;
    Ok(format!("refused checkpoint {dump_ms:.0} ms"))
}

/// Sets `p`'s mode.
fn chmod(p: &Path, mode: u32) -> R {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {mode:o} {}: {e}", p.display()))
}

/// Sets `p`'s owner (uid; the group stays).
fn chown(p: &Path, uid: u32) -> R {
    std::os::unix::fs::chown(p, Some(uid), None)
        .map_err(|e| format!("chown {uid} {}: {e}", p.display()))
}

/// `runc checkpoint` must fail at the plugin's `init` because of `bad`, with CRIU's log naming
/// it as `want` says; the container keeps running and no task was locked.
fn refused_for(c: &mut Container, bad: &str, want: &[String]) -> R<f64> {
    let (out, log, ms) = c.checkpoint()?;
    ensure!(
        !out.status.success(),
        "runc checkpoint succeeded with {bad}"
    );
    for w in want {
        ensure!(
            log.contains(w.as_str()),
            "with {bad}, the dump log does not say {w:?}:\n{}",
            tail(&log, 20)
        );
    }
    ensure!(
        c.status()?.as_deref() == Some("running"),
        "the container is not running after the checkpoint refused for {bad}"
    );
    c.expect_cuda("running")?;
    let trace = read(&c.world.join("trace.log"));
    ensure!(
        !trace.contains("cuCheckpointProcessLock") && !trace.contains("cuda-checkpoint:lock"),
        "a task was locked although init failed for {bad}:\n{trace}"
    );
    Ok(ms)
}

/// The trust rule (`plugin/src/trust.rs`) on the options file next to the plugin: owned by
/// another user, group-writable, and in a directory everyone can write, each refused at
/// `init` naming the file, the owner, the mode and the fix; put right, the checkpoint works.
fn untrusted_options_file(c: &mut Container) -> R<String> {
    let file = c.plugins.join("cuda_plugin.conf");
    let shown = file.display().to_string();
    let dir = c.plugins.display().to_string();
    c.start()?;
    let mut times = Vec::new();
    chown(&file, 65534)?;
    times.push(refused_for(
        c,
        "an options file owned by uid 65534",
        &[
            format!("options file {shown} is not trusted: the file {shown} is owned by uid 65534"),
            format!("fix: chown root {shown}"),
        ],
    )?);
    chown(&file, 0)?;
    chmod(&file, 0o664)?;
    times.push(refused_for(
        c,
        "a group-writable options file",
        &[
            format!("the file {shown} is writable by its group (mode 0664"),
            format!("fix: chmod go-w {shown}"),
        ],
    )?);
    chmod(&file, 0o644)?;
    chmod(&c.plugins, 0o777)?;
    times.push(refused_for(
        c,
        "an options file in a world-writable directory",
        &[format!(
            "options file {shown} is not trusted: its directory {dir} is writable by everyone \
             (mode 0777"
        )],
    )?);
    chmod(&c.plugins, 0o755)?;
    let (out, log, ms) = c.checkpoint()?;
    ensure!(
        out.status.success(),
        "runc checkpoint failed with the options file put right:\n{}",
        tail(&log, 20)
    );
    c.restore()?;
    c.verify_data()?;
    Ok(format!(
        "3 refusals {:.0}/{:.0}/{:.0} ms, then a checkpoint {ms:.0} ms",
        times[0], times[1], times[2]
    ))
}

/// The trust rule on the program the plugin runs: a world-writable `cuda-checkpoint` named by
/// the options file is never run; `init` fails naming it.
fn untrusted_utility(c: &mut Container) -> R<String> {
    let a = artifacts().as_ref().map_err(Clone::clone)?;
    let copy = c.plugins.join("cuda-checkpoint");
    std::fs::copy(&a.cuda_checkpoint, &copy)
        .map_err(|e| format!("copying {}: {e}", a.cuda_checkpoint.display()))?;
    chmod(&copy, 0o757)?;
    let file = c.plugins.join("cuda_plugin.conf");
    let text = read(&file).replace(
        &format!("cuda-checkpoint = {}", a.cuda_checkpoint.display()),
        &format!("cuda-checkpoint = {}", copy.display()),
    );
    write(&file, &text)?;
    c.start()?;
    let shown = copy.display().to_string();
    let ms = refused_for(
        c,
        "a world-writable cuda-checkpoint",
        &[
            format!("program {shown} is not trusted: the file {shown} is writable by everyone"),
            format!("fix: chmod go-w {shown}"),
        ],
    )?;
    let trace = read(&c.world.join("trace.log"));
    ensure!(
        !trace.contains("cuda-checkpoint:"),
        "the untrusted utility ran:\n{trace}"
    );
    Ok(format!("refused checkpoint {ms:.0} ms"))
}

// ---------------------------------------------------------------------------------------------
// The trials

/// A case's body: what it checks, with its times for the report line.
type CaseBody = fn(&mut Container) -> R<String>;

fn run_case(
    runc: PathBuf,
    criu: Criu,
    backend: &'static str,
    faults: String,
    body: CaseBody,
    custom: bool,
) -> Result<(), Failed> {
    let t = Instant::now();
    let mut c = Container::new(&runc, &criu, backend, &faults, custom).map_err(Failed::from)?;
    let r = body(&mut c);
    let down = c.teardown();
    let r = r.and_then(|s| down.map(|()| s));
    c.keep = r.is_err() || criu_cuda_env::is_on(criu_cuda_env::RUNC_KEEP);
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

fn trials(runc: &Path, criu_list: &[Criu]) -> Vec<Trial> {
    let mut out = Vec::new();
    for criu in criu_list {
        for backend in BACKENDS {
            let cases: [(&str, String, CaseBody); 2] = [
                ("checkpoint-restore", String::new(), checkpoint_restore),
                ("checkpoint-fails", lock_fails(backend, 2), checkpoint_fails),
            ];
            let driver_only: Vec<(&str, String, CaseBody)> = if backend == "driver-api" {
                vec![
                    (
                        "bad-options-file",
                        String::new(),
                        bad_options_file as CaseBody,
                    ),
                    (
                        "untrusted-options-file",
                        String::new(),
                        untrusted_options_file as CaseBody,
                    ),
                    ("custom-storage", String::new(), custom_storage as CaseBody),
                ]
            } else {
                vec![(
                    "untrusted-utility",
                    String::new(),
                    untrusted_utility as CaseBody,
                )]
            };
            for (case, faults, body) in cases.into_iter().chain(driver_only) {
                let (r, cr) = (runc.to_path_buf(), criu.clone());
                out.push(Trial::test(
                    format!("runc/criu-{}/{backend}/{case}", criu.series),
                    move || run_case(r, cr, backend, faults, body, case == "custom-storage"),
                ));
            }
        }
    }
    out
}

fn skipped(reason: String) -> Vec<Trial> {
    eprintln!("runc: skipping: {reason}");
    vec![Trial::ignorable_test("runc", move || {
        Ok(Completion::ignored_with(reason))
    })]
}

fn failing(reason: String) -> Vec<Trial> {
    vec![Trial::test("runc", move || Err(reason.into()))]
}

fn main() {
    let mut args = Arguments::from_args();
    // One at a time: the cases measure times, and the machine has few cores.
    args.test_threads = Some(1);
    let in_ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false");
    let require_runc = in_ci || criu_cuda_env::is_on(criu_cuda_env::REQUIRE_RUNC);
    let require_criu = criu_cuda_env::is_on(criu_cuda_env::REQUIRE_CRIU);
    let criu = find_criu();
    let runc = find_runc();
    let trials = if !is_root() {
        skipped("not root (runc and CRIU need root to checkpoint and restore)".into())
    } else if criu.is_empty() {
        let reason =
            "no CRIU 4.1.x/4.2.x found (set CRIU_CUDA_CRIU_4_1/_4_2 or run scripts/fetch-criu.sh)";
        if require_criu {
            failing(format!("{reason}, and CRIU_CUDA_REQUIRE_CRIU=1"))
        } else {
            skipped(reason.into())
        }
    } else {
        match runc.map(|r| program_version(&r).map(|v| (r, v))) {
            None if !require_runc => skipped(
                "runc is not installed (apt-get install runc; CRIU_CUDA_RUNC=PATH names another)"
                    .into(),
            ),
            Some(Err(e)) if !require_runc => skipped(e),
            None => failing(
                "runc is not installed, and this is CI (CI or CRIU_CUDA_REQUIRE_RUNC=1 is set): \
                 .ci/run installs it with apt-get"
                    .into(),
            ),
            Some(Err(e)) => failing(e),
            Some(Ok((runc, version))) => {
                if !become_subreaper() {
                    eprintln!(
                        "runc: warning: cannot become a child subreaper; pids may free slowly"
                    );
                }
                if !args.list {
                    eprintln!("runc: {version} at {}", runc.display());
                    for c in &criu {
                        eprintln!("runc: CRIU {} at {}", c.version, c.path.display());
                    }
                }
                trials(&runc, &criu)
            }
        }
    };
    let t = Instant::now();
    let conclusion = libtest_mimic::run(&args, trials);
    if !args.list {
        println!("runc: all cases took {:.1} s", t.elapsed().as_secs_f64());
    }
    conclusion.exit();
}
