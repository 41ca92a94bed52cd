//! The NVML stand-in reports the compute processes of a GPU by host pid, as the real NVML does
//! from the root namespace, also for a process that runs in a pid namespace of its own (where
//! it is pid 1) and registered there without knowing its host pid.
//!
//! The CUDA processes are this test binary started again with `MOCK_NVML_NS_CHILD` set, some
//! through `unshare -p -m -f --mount-proc`. That needs the right to create namespaces (root):
//! without it the trial is reported as ignored with the reason (failed instead when
//! `CRIU_CUDA_REQUIRE_NAMESPACES=1`).

use abi::nvml::{NvmlDevice, NvmlProcessInfo, NvmlReturn};
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use mock_libcuda::world::config::WorldConfig;
use mock_libcuda::world::{World, NVML_LIB};
use std::ffi::c_uint;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const GIB: u64 = 1 << 30;
const CHILD_ENV: &str = "MOCK_NVML_NS_CHILD";

const CONFIG: &str = r#"schema = 1
[driver]
branch = 580
request_timeout_ms = 5000
[[gpu]]
uuid = "GPU-00000000-0000-4000-8000-000000000000"
name = "NVIDIA H100 80GB HBM3"
memory_mib = 81920
chip = "GH100"
"#;

/// The artifacts next to this test binary (`<profile>/deps/`).
fn deps() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The body of a CUDA process: `<GiB>` on GPU 0, `CHILD-READY`, then it waits to be killed.
fn child(gib: &str) -> ! {
    let gib: u64 = gib.parse().expect("GiB");
    mock_libcuda::driver::init(0).expect("cuInit");
    mock_libcuda::driver::ctx_create("cuCtxCreate", 0).expect("context");
    mock_libcuda::driver::mem_alloc(gib * GIB).expect("allocation");
    println!("CHILD-READY pid={}", std::process::id());
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Starts a CUDA process holding `gib` GiB, in namespaces of its own with `unshare`; its
/// process (unshare's, or its own) and its host pid.
fn spawn(world: &Path, gib: u64, unshare: bool) -> Result<(Child, u32), Failed> {
    let me = std::env::current_exe()?;
    let mut cmd = if unshare {
        let mut c = Command::new("unshare");
        c.args(["-p", "-m", "-f", "--mount-proc", "--kill-child", "--"])
            .arg(me);
        c
    } else {
        Command::new(me)
    };
    let mut child = cmd
        .env(CHILD_ENV, gib.to_string())
        .env("MOCK_CUDA_WORLD", world)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?);
    let mut line = String::new();
    while !line.starts_with("CHILD-READY") {
        line.clear();
        if out.read_line(&mut line)? == 0 {
            return Err("the child ended before it was ready".into());
        }
    }
    if !unshare {
        let pid = child.id();
        return Ok((child, pid));
    }
    if line.trim() != "CHILD-READY pid=1" {
        return Err(format!("not pid 1 of its namespace: {line}").into());
    }
    let u = child.id();
    let kids = std::fs::read_to_string(format!("/proc/{u}/task/{u}/children"))?;
    let pid = kids
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("unshare {u} has no child"))?;
    Ok((child, pid))
}

type Init = unsafe extern "C" fn() -> NvmlReturn;
type ByIndex = unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> NvmlReturn;
type Procs = unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut NvmlProcessInfo) -> NvmlReturn;

/// `(pid, bytes)` of every compute process of GPU 0, as NVML lists them.
fn compute_processes(lib: &Path) -> Result<Vec<(u32, u64)>, Failed> {
    // SAFETY: the stand-in's constructors have no preconditions.
    let lib = unsafe { libloading::Library::new(lib) }?;
    // SAFETY: the types spell out the NVML signatures of these symbols.
    let (init, by_index, procs) = unsafe {
        (
            *lib.get::<Init>(b"nvmlInit_v2\0")?,
            *lib.get::<ByIndex>(b"nvmlDeviceGetHandleByIndex_v2\0")?,
            *lib.get::<Procs>(b"nvmlDeviceGetComputeRunningProcesses_v3\0")?,
        )
    };
    // SAFETY: no arguments.
    let r = unsafe { init() };
    if r != NvmlReturn::SUCCESS {
        return Err(format!("nvmlInit_v2: {r:?}").into());
    }
    let mut dev = std::ptr::null_mut();
    // SAFETY: `dev` is a valid place for the handle.
    let r = unsafe { by_index(0, &mut dev) };
    if r != NvmlReturn::SUCCESS {
        return Err(format!("handle: {r:?}").into());
    }
    let mut infos = vec![NvmlProcessInfo::default(); 8];
    let mut n: c_uint = 8;
    // SAFETY: `infos` has room for `n` entries.
    let r = unsafe { procs(dev, &mut n, infos.as_mut_ptr()) };
    if r != NvmlReturn::SUCCESS {
        return Err(format!("processes: {r:?}").into());
    }
    infos.truncate(n as usize);
    Ok(infos.iter().map(|p| (p.pid, p.used_gpu_memory)).collect())
}

fn processes_in_pid_namespaces_are_listed_by_host_pid() -> Result<Completion, Failed> {
    let probe = Command::new("unshare")
        .args(["-p", "-m", "-f", "--mount-proc", "true"])
        .stdin(Stdio::null())
        .output();
    let refused = match probe {
        Err(e) => Some(format!("cannot run unshare: {e}")),
        Ok(o) if !o.status.success() => Some(format!(
            "unshare -p -m -f --mount-proc is refused: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => None,
    };
    if let Some(why) = refused {
        if criu_cuda_env::is_on(criu_cuda_env::REQUIRE_NAMESPACES) {
            return Err(format!("{why}, and CRIU_CUDA_REQUIRE_NAMESPACES=1").into());
        }
        return Ok(Completion::ignored_with(why));
    }
    let dir = tempfile::Builder::new().prefix("mock-nvml-ns-").tempdir()?;
    let cfg = WorldConfig::parse(CONFIG, "test")?;
    let world = World::create(dir.path(), &cfg, &deps().join("libmock_libcuda.so"))?;
    world.install_nvml(Some(&deps().join("libmock_nvml.so")))?;
    std::env::set_var("MOCK_CUDA_WORLD", dir.path());
    let (mut a, pa) = spawn(dir.path(), 3, true)?;
    let (mut b, pb) = spawn(dir.path(), 2, true)?;
    let (mut c, pc) = spawn(dir.path(), 1, false)?;
    let result = (|| {
        // They registered as pid 1 without their host pids: the world cannot know them yet.
        let st = world.read_state()?;
        let unknown = st.processes.values().filter(|e| e.pid == 0).count();
        if unknown != 2 {
            return Err(format!("{unknown} processes without a host pid, not 2").into());
        }
        let got = compute_processes(&dir.path().join("lib").join(NVML_LIB))?;
        let mut want = vec![(pa, 3 * GIB), (pb, 2 * GIB), (pc, GIB)];
        want.sort_unstable();
        if got != want {
            return Err(format!("NVML listed {got:?}, not {want:?} (host pids)").into());
        }
        Ok(Completion::Completed)
    })();
    for ch in [&mut a, &mut b, &mut c] {
        let _ = ch.kill();
        let _ = ch.wait();
    }
    result
}

fn main() -> std::process::ExitCode {
    if let Ok(gib) = std::env::var(CHILD_ENV) {
        child(&gib);
    }
    let args = Arguments::from_args();
    let trials = vec![Trial::ignorable_test(
        "processes_in_pid_namespaces_are_listed_by_host_pid",
        processes_in_pid_namespaces_are_listed_by_host_pid,
    )];
    libtest_mimic::run(&args, trials).exit_code()
}
