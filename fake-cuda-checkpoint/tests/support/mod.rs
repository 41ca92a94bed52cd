//! Test support for driving the real `cuda-checkpoint` binary against real mock worlds.
//!
//! # Where the mock comes from
//!
//! The mock driver (`libmock_libcuda.so`) and `mock-cuda-app` belong to the `mock-libcuda`
//! package, which this package does not depend on (the utility must not know the mock). They
//! are taken from the target directory this test binary was built in:
//! `std::env::current_exe()` is `<target>/<profile>/deps/<test>-<hash>`, the library is
//! `<target>/<profile>/deps/libmock_libcuda.so` (`cargo test` refreshes `deps/` but not the
//! copy in `<profile>/`; the newer of the two is used, as `mock-world` itself does; the NVML
//! stand-in `libmock_nvml.so` likewise, when it was built) and the program is
//! `<target>/<profile>/mock-cuda-app`. The tests make and read their worlds in-process, with
//! `mock_cuda_world::client` (through `testkit`, a dev-dependency only).
//!
//! Once per test process ([`OnceLock`]) they are checked, and when one is missing or older than
//! the mock's sources (`mock-libcuda/src`, `abi/src`, their manifests, `Cargo.lock`) — as after
//! `cargo test -p fake-cuda-checkpoint`, which does not build the mock — the test runs
//! `$CARGO build -p mock-libcuda --lib --bins` (the cargo that runs the tests, `cargo` if `CARGO`
//! is unset) for the same profile and with `CARGO_TARGET_DIR` set to this target directory.
//! After `cargo test --workspace` nothing needs building and cargo is not run.
//!
//! # The API probe
//!
//! `support/api_probe.c` is a minimal C client of the driver's checkpoint API (dlopen of
//! `libcuda.so.1`, `cuInit`, one `cuCheckpointProcess*` call, print the `CUresult`). It is a
//! second, independent process talking to the world through the API, where the utility talks
//! through the export table's command line. It is compiled once per test process with the
//! system C compiler (`$CC`, default `cc`) into `<target>/<profile>/fake-cuda-checkpoint-tests/`
//! when missing or older than its source.

use std::ffi::c_int;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use testkit::artifacts::{fresh, mtime, newest_of, workspace, Layout};
pub use testkit::proc::{signal, stat_state, SIGABRT, SIGCONT, SIGSEGV, SIGSTOP, SIGUSR1};
pub use testkit::read;
pub use testkit::wait::wait_for;
use testkit::world;
pub use testkit::world::{CudaState, MockWorld, GPU0, GPU1, GPU2};

/// The built artifacts the tests run.
#[derive(Debug)]
pub struct Artifacts {
    pub cuda_checkpoint: PathBuf,
    pub mock_so: PathBuf,
    /// The NVML stand-in, when it was built (the world has NVML only then).
    pub mock_nvml: Option<PathBuf>,
    pub mock_app: PathBuf,
    pub api_probe: PathBuf,
}

/// The artifacts, located (and built when needed) once per test process.
pub fn artifacts() -> &'static Artifacts {
    static A: OnceLock<Artifacts> = OnceLock::new();
    A.get_or_init(locate_or_build)
}

fn locate_or_build() -> Artifacts {
    let (layout, prebuilt) = Layout::for_tests().expect("locating the target directory");
    let ws = workspace();
    let libs = layout.both("libmock_libcuda.so");
    let mock_app = layout.profile_dir.join("mock-cuda-app");
    let sources = [
        "mock-libcuda/src",
        "mock-libcuda/Cargo.toml",
        "abi/src",
        "abi/Cargo.toml",
        "Cargo.lock",
    ]
    .map(|s| ws.join(s));
    let newest_lib = newest_of(&libs).map(|(t, _)| t);
    if !prebuilt && !fresh(&[newest_lib, mtime(&mock_app)], &sources) {
        layout
            .cargo_build(&ws, &["-p", "mock-libcuda", "--lib", "--bins"])
            .unwrap_or_else(|e| panic!("building mock-libcuda: {e}"));
    }
    let mock_so = newest_of(&libs)
        .map(|(_, l)| l)
        .expect("libmock_libcuda.so was built");
    assert!(mock_app.exists(), "{} was built", mock_app.display());
    Artifacts {
        cuda_checkpoint: PathBuf::from(env!("CARGO_BIN_EXE_cuda-checkpoint")),
        mock_so,
        mock_nvml: newest_of(&layout.both("libmock_nvml.so")).map(|(_, l)| l),
        mock_app,
        api_probe: build_probe(&layout.profile_dir.join("fake-cuda-checkpoint-tests")),
    }
}

fn build_probe(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/api_probe.c");
    let out = dir.join("api_probe");
    if matches!((mtime(&out), mtime(&src)), (Some(o), Some(s)) if o >= s) {
        return out;
    }
    std::fs::create_dir_all(dir).expect("creating the probe's directory");
    let tmp = dir.join(format!("api_probe.tmp.{}", std::process::id()));
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let status = Command::new(&cc)
        .args(["-O1", "-Wall", "-o"])
        .arg(&tmp)
        .arg(&src)
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler {cc:?} for the API probe: {e}"));
    assert!(status.success(), "compiling {} failed", src.display());
    std::fs::rename(&tmp, &out).expect("installing the probe");
    out
}

extern "C" {
    fn setrlimit(resource: c_int, rlim: *const [u64; 2]) -> c_int;
}

/// Makes `cmd`'s process unable to dump core (the crash faults kill it with SIGSEGV/SIGABRT;
/// a core dump would only cost time).
pub fn no_core(cmd: &mut Command) {
    const RLIMIT_CORE: c_int = 4;
    // SAFETY: the closure runs between fork and exec and only calls setrlimit(2), which is
    // async-signal-safe, with a pointer to a local array that lives for the call.
    unsafe {
        cmd.pre_exec(|| {
            let zero = [0u64, 0u64];
            let _ = setrlimit(RLIMIT_CORE, &zero);
            Ok(())
        });
    }
}

/// A world config: `branch`, two GPUs of one chip, an optional third of another, and `extra`
/// TOML appended (faults, `cuda_version`).
pub fn config(branch: u32, driver_extra: &str, third_gpu: bool, extra: &str) -> String {
    let mut c = world::two_h100(branch, &format!("request_timeout_ms = 800\n{driver_extra}"));
    if third_gpu {
        c.push_str(&world::a100(GPU2));
    }
    c.push_str(extra);
    c
}

/// One finished run of a program.
#[derive(Debug)]
pub struct Run {
    pub pid: i32,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    /// The exit code; panics if the program was killed by a signal.
    pub fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("killed by a signal: {self:?}"))
    }
}

fn run_to_end(mut cmd: Command) -> Run {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t = Instant::now();
    let child = cmd.spawn().expect("starting a program");
    let pid = child.id() as i32;
    let out = child.wait_with_output().expect("waiting for a program");
    Run {
        pid,
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: t.elapsed(),
    }
}

/// A world in a temporary directory, created as `mock-world init` creates one, and the
/// workloads in it.
#[derive(Debug)]
pub struct World {
    tmp: tempfile::TempDir,
    apps: Vec<Child>,
}

impl World {
    /// Creates a world from `config_text` with the built mock library.
    pub fn new(config_text: &str) -> World {
        let a = artifacts();
        let tmp = tempfile::tempdir().expect("a temporary directory");
        if let Err(e) = MockWorld::init(
            tmp.path().join("world"),
            config_text,
            &a.mock_so,
            a.mock_nvml.as_deref(),
        ) {
            panic!("{e}");
        }
        World {
            tmp,
            apps: Vec::new(),
        }
    }

    /// The world directory.
    pub fn dir(&self) -> PathBuf {
        self.tmp.path().join("world")
    }

    /// Points `cmd` at this world: `MOCK_CUDA_WORLD` and the world's `libcuda.so.1`.
    pub fn env(&self, cmd: &mut Command) {
        world::env(cmd, &self.dir());
        cmd.env_remove("CUDA_VISIBLE_DEVICES");
    }

    /// The `cuda-checkpoint` command, in this world.
    pub fn cli_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&artifacts().cuda_checkpoint);
        cmd.args(args);
        self.env(&mut cmd);
        cmd
    }

    /// Runs `cuda-checkpoint args…` to the end.
    pub fn cli(&self, args: &[&str]) -> Run {
        run_to_end(self.cli_command(args))
    }

    /// Runs `cuda-checkpoint args…` and expects exit 0; returns its stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let r = self.cli(args);
        assert!(
            r.status.success() && r.stderr.is_empty(),
            "cuda-checkpoint {args:?}: {r:?}"
        );
        r.stdout
    }

    /// `cuda-checkpoint --get-state --pid <pid>`'s answer, trimmed.
    pub fn cli_state(&self, pid: i32) -> String {
        self.cli_ok(&["--get-state", "--pid", &pid.to_string()])
            .trim()
            .to_owned()
    }

    /// Runs the API probe (`op pid [arg]`) in this world; returns its output line.
    pub fn probe(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(&artifacts().api_probe);
        cmd.args(args);
        self.env(&mut cmd);
        let r = run_to_end(cmd);
        assert_eq!(r.code(), 0, "api_probe {args:?}: {r:?}");
        r.stdout.trim().to_owned()
    }

    /// The state of `pid` in the world's status (`None` when the world does not know it).
    pub fn status_state(&self, pid: i32) -> Option<CudaState> {
        let st = MockWorld::open(self.dir())
            .and_then(|w| w.status())
            .unwrap_or_else(|e| panic!("{e}"));
        st.processes
            .iter()
            .find(|p| p.host_pid() == Some(pid))
            .map(|p| p.state())
    }

    /// Starts `mock-cuda-app args…` in this world, waits for READY; returns its pid.
    pub fn spawn_app(&mut self, args: &[&str]) -> i32 {
        let report = self.report_path(self.apps.len());
        let mut cmd = Command::new(&artifacts().mock_app);
        cmd.args(args)
            .arg("--report")
            .arg(&report)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        self.env(&mut cmd);
        let child = cmd.spawn().expect("starting mock-cuda-app");
        let pid = child.id() as i32;
        self.apps.push(child);
        wait_for(
            Duration::from_secs(20),
            || read(&report).contains("READY"),
            "the workload's READY line",
        );
        pid
    }

    fn report_path(&self, n: usize) -> PathBuf {
        self.tmp.path().join(format!("report-{n}.txt"))
    }

    /// The report of workload `n`.
    pub fn report(&self, n: usize) -> String {
        read(&self.report_path(n))
    }

    /// Asks workload `n` (pid `pid`) to check its GPU data; returns its PASS/FAIL line.
    pub fn verify(&self, n: usize, pid: i32) -> String {
        let before = self.report(n).lines().count();
        assert!(signal(pid, SIGUSR1), "signalling workload {pid}");
        wait_for(
            Duration::from_secs(20),
            || self.report(n).lines().count() > before,
            "the workload's verification line",
        );
        self.report(n)
            .lines()
            .nth(before)
            .expect("a line")
            .to_owned()
    }

    /// The world's call trace.
    pub fn trace(&self) -> String {
        read(&self.dir().join("trace.log"))
    }

    /// Replaces the world's config (`world.toml`) with `config_text`, atomically. Processes
    /// read the config when they first use the world, so this scripts processes started from
    /// now on (workloads already running keep the config they read). Used for faults that
    /// name a pid, which is only known once the workload runs.
    pub fn rewrite_config(&self, config_text: &str) {
        let tmp = self.dir().join("world.toml.new");
        std::fs::write(&tmp, config_text).expect("writing the new config");
        std::fs::rename(&tmp, self.dir().join("world.toml")).expect("replacing world.toml");
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for c in &mut self.apps {
            signal(c.id() as i32, SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits until `pid` is in state `T` (stopped) in `/proc`.
pub fn wait_stopped(pid: i32) {
    wait_for(
        Duration::from_secs(5),
        || stat_state(pid) == Some('T'),
        "the workload to stop",
    );
}

/// Replaces every whole decimal number in `text` that one of `names` maps, by its label
/// (`1234` becomes `<APP>`, but `12345` is left alone).
pub fn name_numbers(text: &str, names: &[(i64, &str)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut digits = String::new();
    let flush = |digits: &mut String, out: &mut String| {
        if !digits.is_empty() {
            match digits
                .parse::<i64>()
                .ok()
                .and_then(|n| names.iter().find(|(k, _)| *k == n))
            {
                Some((_, label)) => out.push_str(label),
                None => out.push_str(digits),
            }
            digits.clear();
        }
    };
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            flush(&mut digits, &mut out);
            out.push(c);
        }
    }
    flush(&mut digits, &mut out);
    out
}

/// Runs `cmd` with core dumps off, expecting it to be killed by a signal; returns the signal.
pub fn death_signal(mut cmd: Command) -> (Option<i32>, Run) {
    no_core(&mut cmd);
    let r = run_to_end(cmd);
    (r.status.signal(), r)
}
