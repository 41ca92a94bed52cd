//! Shared test support: worlds in temporary directories and mock workloads in them.

#![allow(
    dead_code,
    reason = "shared by several test binaries, each of which uses only part of it: an item is \
              dead in some of them only"
)]

use mock_libcuda::world::config::WorldConfig;
use mock_libcuda::world::World;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use testkit::read;
use testkit::wait::wait_for;

/// The mock library built next to this package's binaries.
pub fn mock_so() -> PathBuf {
    // `cargo test` links the cdylib into deps/ without refreshing the copy next to the
    // binaries, so that one may be stale.
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_mock-world"));
    bin.parent()
        .unwrap()
        .join("deps")
        .join("libmock_libcuda.so")
}

/// A world config with `branch` and two H100s (plus `extra` TOML appended).
pub fn config(branch: u32, extra: &str) -> String {
    testkit::world::two_h100(branch, "request_timeout_ms = 1500") + extra
}

/// Tests that use the driver API in this process share its environment: one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|p| p.into_inner())
}

/// A world in a temporary directory, selected for this process's driver calls.
#[derive(Debug)]
pub struct TestWorld {
    pub dir: tempfile::TempDir,
    pub world: World,
    apps: Vec<Child>,
}

impl TestWorld {
    pub fn new(config_text: &str) -> TestWorld {
        // In memory where the host has a tmpfs: a disk busy with other builds can stall a file
        // write for seconds, longer than the short request timeouts of these tests.
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::Builder::new()
                .prefix("mock-world-")
                .tempdir_in(shm)
                .unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        let cfg = WorldConfig::parse(config_text, "test").unwrap();
        let world = World::create(dir.path(), &cfg, &mock_so()).unwrap();
        std::env::set_var("MOCK_CUDA_WORLD", dir.path());
        TestWorld {
            dir,
            world,
            apps: Vec::new(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn env(&self, cmd: &mut Command) {
        testkit::world::env(cmd, self.path());
    }

    /// Starts `mock-cuda-app` with `args`; waits for its READY line; returns its pid.
    pub fn spawn_app(&mut self, args: &[&str]) -> i32 {
        self.spawn_app_env(args, &[])
    }

    /// [`TestWorld::spawn_app`] with extra environment variables.
    pub fn spawn_app_env(&mut self, args: &[&str], env: &[(&str, &str)]) -> i32 {
        let report = self.path().join(format!("report-{}.txt", self.apps.len()));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mock-cuda-app"));
        cmd.args(args)
            .arg("--report")
            .arg(&report)
            .stdout(Stdio::null());
        self.env(&mut cmd);
        cmd.envs(env.iter().copied());
        let child = cmd.spawn().unwrap();
        let pid = child.id() as i32;
        self.apps.push(child);
        wait_for(
            Duration::from_secs(20),
            || read(&report).contains("READY") || read(&report).contains("FAIL"),
            "the workload to report READY",
        );
        pid
    }

    /// Waits for the `n`th workload to end; its exit status.
    pub fn wait(&mut self, n: usize) -> std::process::ExitStatus {
        self.apps[n].wait().unwrap()
    }

    /// The report file of the `n`th workload.
    pub fn report(&self, n: usize) -> String {
        read(&self.path().join(format!("report-{n}.txt")))
    }

    /// Asks workload `n` (pid `pid`) to verify its data; returns its PASS/FAIL line.
    pub fn verify(&self, n: usize, pid: i32) -> String {
        let before = self.report(n).lines().count();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGUSR1,
        )
        .unwrap();
        wait_for(
            Duration::from_secs(20),
            || self.report(n).lines().count() > before,
            "a verification line",
        );
        self.report(n).lines().nth(before).unwrap().to_owned()
    }
}

impl Drop for TestWorld {
    fn drop(&mut self) {
        for c in &mut self.apps {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGCONT,
            );
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
