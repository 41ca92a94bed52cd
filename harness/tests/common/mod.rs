//! Shared fixtures for the engine tests: C test plugins compiled at test time, a process tree,
//! and a runner for the `harness` executables.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;
use testkit::proc::{thread_status, threads};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub const HARNESS: &str = env!("CARGO_BIN_EXE_harness");
const SUPPORT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support");

/// A temporary directory with a plugin dir, an image dir, and the logs of one scenario.
pub struct Fixture {
    pub dir: tempfile::TempDir,
}

impl Fixture {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("lib")).expect("mkdir lib");
        Self { dir }
    }

    pub fn lib(&self) -> PathBuf {
        self.dir.path().join("lib")
    }

    pub fn img(&self) -> PathBuf {
        self.dir.path().join("img")
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Compiles the test plugin named `name` into `lib/<file>`.
    pub fn plugin(&self, file: &str, name: &str, defines: &[&str]) -> PathBuf {
        let out = self.lib().join(file);
        compile_plugin(&out, name, defines);
        out
    }

    /// A `harness` command for `verb` with `-D`, `-L`, `-v4`, a log file and a trace.
    pub fn cmd(&self, host: &str, verb: &str) -> Command {
        let mut c = Command::new(HARNESS);
        c.arg("--host").arg(host).arg(verb);
        c.arg("-D").arg(self.img());
        c.arg("-L").arg(self.lib());
        c.arg("-v4").arg("-o").arg(self.path("harness.log"));
        c.arg("--trace").arg(self.path("trace"));
        c.env("TP_LOG", self.path("tp.log"));
        c.env_remove("CRIU_LIBS_DIR").env_remove("CRIU_FAULT");
        c.stdin(Stdio::null());
        c
    }

    /// Lines the test plugins logged (clearing the log).
    pub fn take_tp_log(&self) -> Vec<String> {
        let p = self.path("tp.log");
        let s = std::fs::read_to_string(&p).unwrap_or_default();
        let _ = std::fs::remove_file(&p);
        s.lines().map(str::to_owned).collect()
    }

    /// The engine's trace (clearing it).
    pub fn take_trace(&self) -> Vec<String> {
        let p = self.path("trace");
        let s = std::fs::read_to_string(&p).unwrap_or_default();
        let _ = std::fs::remove_file(&p);
        s.lines().map(str::to_owned).collect()
    }

    /// The engine's log of the last run.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("harness.log")).unwrap_or_default()
    }

    /// Writes an inventory for a restore of no task (exercises init/exit without a tree).
    pub fn empty_image(&self, plugins: Option<&[&str]>) {
        std::fs::create_dir_all(self.img()).expect("mkdir img");
        let plugins = plugins.map_or(String::new(), |p| {
            let names: Vec<String> = p.iter().map(|n| format!("\"{n}\"")).collect();
            format!(",\n  \"plugins\": [{}]", names.join(", "))
        });
        let text = format!(
            "{{\n  \"format\": \"criu-cuda-harness-inventory\",\n  \"version\": 1,\n  \"host\": \"pr3076\",\n  \"stage\": \"dump\",\n  \"stream\": false,\n  \"final_state\": 2,\n  \"tasks\": []{plugins}\n}}\n"
        );
        std::fs::write(self.img().join("inventory.json"), text).expect("write inventory");
    }

    /// Names of the `*.so` files of the plugin dir in raw readdir order.
    pub fn readdir_order(&self) -> Vec<String> {
        std::fs::read_dir(self.lib())
            .expect("read lib")
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".so"))
            .collect()
    }
}

pub fn compile_plugin(out: &Path, name: &str, defines: &[&str]) {
    let mut c = Command::new("cc");
    c.args(["-shared", "-fPIC", "-O0", "-w"])
        .arg(format!("-DTP_NAME=\"{name}\""))
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg(format!("{SUPPORT}/testplugin.c"))
        .arg("-o")
        .arg(out);
    let st = c.status().expect("run cc");
    assert!(st.success(), "cc failed for {name}");
}

pub fn run(mut c: impl std::borrow::BorrowMut<Command>) -> Output {
    c.borrow_mut().output().expect("run harness")
}

pub fn ok(out: &Output, log: &str) {
    assert!(
        out.status.success(),
        "harness failed: {:?}\nstderr:\n{}\nlog:\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn failed(out: &Output, log: &str) {
    assert_eq!(
        out.status.code(),
        Some(1),
        "harness should fail\nstderr:\n{}\nlog:\n{log}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The tree of `support/tree.c`: root, A, A1 (A's child), B (3 threads).
pub struct Tree {
    child: Child,
    pub pids: Vec<i32>,
}

impl Tree {
    pub fn spawn(fx: &Fixture) -> Self {
        let bin = fx.path("tree");
        let st = Command::new("cc")
            .args(["-O0", "-w", "-pthread"])
            .arg(format!("{SUPPORT}/tree.c"))
            .arg("-o")
            .arg(&bin)
            .status()
            .expect("cc tree");
        assert!(st.success());
        Self::spawn_bin(Command::new(bin))
    }

    /// One sleeping process.
    pub fn single() -> Self {
        let mut c = Command::new("sh");
        c.args(["-c", "echo $$; exec sleep 1000"]);
        Self::spawn_bin(c)
    }

    fn spawn_bin(mut c: Command) -> Self {
        use std::os::unix::process::CommandExt;
        c.stdout(Stdio::piped())
            .stdin(Stdio::null())
            .process_group(0);
        let mut child = c.spawn().expect("spawn tree");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("tree pids");
        let pids = line
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        Self { child, pids }
    }

    pub fn root(&self) -> i32 {
        self.pids[0]
    }

    /// Every task untraced and not stopped.
    pub fn assert_running(&self) {
        for &p in &self.pids {
            wait_until(|| harness::pstree::running_untraced(p).is_ok());
            harness::pstree::running_untraced(p).unwrap_or_else(|e| panic!("task {p}: {e}"));
        }
    }

    /// Every task group-stopped and untraced.
    pub fn assert_parked(&self) {
        for &p in &self.pids {
            wait_until(|| parked(p));
            assert!(parked(p), "task {p} is not parked: {}", status(p));
        }
    }
}

fn status(pid: i32) -> String {
    format!("{:?}", thread_status(pid, pid))
}

fn parked(pid: i32) -> bool {
    let tids = threads(pid);
    !tids.is_empty()
        && tids
            .iter()
            .all(|&t| thread_status(pid, t).is_some_and(|s| s.state == 'T' && s.tracer == 0))
}

fn wait_until(f: impl FnMut() -> bool) {
    testkit::wait::wait_until(Duration::from_secs(3), f);
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(-self.root()), Signal::SIGKILL);
        for &p in &self.pids {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// Lines of `log` that start with `prefix`.
pub fn lines_with<'a>(log: &'a [String], needle: &str) -> Vec<&'a str> {
    log.iter()
        .filter(|l| l.contains(needle))
        .map(String::as_str)
        .collect()
}
