//! The NVML stand-in as a consumer sees it: `libnvidia-ml.so.1` loaded from a world's `lib/`
//! (as a plugin on a node would), answering from the world that CUDA processes share: GPUs,
//! memory, the compute processes of each GPU with their memory, the size protocols, faults and
//! the trace.
//!
//! The CUDA processes are this test binary started again with only [`child_entry`] selected:
//! it allocates device memory through the mock driver and waits to be killed.

use abi::nvml::{
    NvmlDevice, NvmlEnableState, NvmlMemory, NvmlMemoryV2, NvmlProcessInfo, NvmlReturn,
    NVML_MEMORY_V2, NVML_VALUE_NOT_AVAILABLE_UINT,
};
use mock_libcuda::world::config::{WorldConfig, NVML_FUNCTIONS};
use mock_libcuda::world::{World, NVML_LIB};
use std::ffi::{c_char, c_uint, CStr, CString};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

const GPU0: &str = "GPU-00000000-0000-4000-8000-000000000000";
const GPU1: &str = "GPU-11111111-1111-4111-8111-111111111111";
const GIB: u64 = 1 << 30;

fn config(extra: &str) -> String {
    format!(
        r#"schema = 1
[driver]
branch = 580
version = "580.65.06"
request_timeout_ms = 5000
[rates]
time_scale = 1000
{extra}
[[gpu]]
uuid = "{GPU0}"
name = "NVIDIA H100 80GB HBM3"
memory_mib = 81920
chip = "GH100"
[[gpu]]
uuid = "{GPU1}"
name = "NVIDIA H200"
memory_mib = 144384
chip = "GH100"
"#
    )
}

/// The artifacts next to this test binary (`<profile>/deps/`).
fn deps() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

/// One test at a time: they share this process's environment (`MOCK_CUDA_WORLD`).
fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|p| p.into_inner())
}

/// A world with the NVML stand-in installed, and the CUDA processes started in it.
struct TestWorld {
    dir: tempfile::TempDir,
    world: World,
    children: Vec<Child>,
}

impl TestWorld {
    fn new(text: &str) -> TestWorld {
        let dir = tempfile::Builder::new()
            .prefix("mock-nvml-")
            .tempdir_in(if Path::new("/dev/shm").is_dir() {
                "/dev/shm"
            } else {
                "/tmp"
            })
            .unwrap();
        let cfg = WorldConfig::parse(text, "test").unwrap();
        let world = World::create(dir.path(), &cfg, &deps().join("libmock_libcuda.so")).unwrap();
        world
            .install_nvml(Some(&deps().join("libmock_nvml.so")))
            .unwrap();
        std::env::set_var("MOCK_CUDA_WORLD", dir.path());
        TestWorld {
            dir,
            world,
            children: Vec::new(),
        }
    }

    /// Starts a CUDA process holding `gib` GiB on host GPU `gpu`; its pid.
    fn spawn(&mut self, gpu: u32, gib: u64) -> u32 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{gpu}:{gib}"))
            .env("MOCK_CUDA_WORLD", self.dir.path())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let out = child.stdout.take().unwrap();
        let mut out = std::io::BufReader::new(out);
        while !line.contains("CHILD-READY") {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "the child ended before it was ready"
            );
        }
        let pid = child.id();
        self.children.push(child);
        pid
    }

    /// The NVML stand-in of this world, loaded as a consumer loads it.
    fn nvml(&self) -> Nvml {
        Nvml::load(&self.dir.path().join("lib").join(NVML_LIB))
    }
}

impl Drop for TestWorld {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

const CHILD_ENV: &str = "MOCK_NVML_CHILD";

/// Not a test of its own: the body of the CUDA processes of the tests below (a no-op unless
/// `MOCK_NVML_CHILD=<host gpu>:<GiB>` is set). Allocates, says `CHILD-READY`, waits.
#[test]
fn child_entry() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (gpu, gib) = spec.split_once(':').unwrap();
    let (gpu, gib): (i32, u64) = (gpu.parse().unwrap(), gib.parse().unwrap());
    mock_libcuda::driver::init(0).unwrap();
    mock_libcuda::driver::ctx_create("cuCtxCreate", gpu).unwrap();
    mock_libcuda::driver::mem_alloc(gib * GIB).unwrap();
    println!("CHILD-READY");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

type Init = unsafe extern "C" fn() -> NvmlReturn;
type InitFlags = unsafe extern "C" fn(c_uint) -> NvmlReturn;
type Str = unsafe extern "C" fn(*mut c_char, c_uint) -> NvmlReturn;
type Count = unsafe extern "C" fn(*mut c_uint) -> NvmlReturn;
type ByIndex = unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> NvmlReturn;
type ByUuid = unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> NvmlReturn;
type DevStr = unsafe extern "C" fn(NvmlDevice, *mut c_char, c_uint) -> NvmlReturn;
type Mem = unsafe extern "C" fn(NvmlDevice, *mut NvmlMemory) -> NvmlReturn;
type MemV2 = unsafe extern "C" fn(NvmlDevice, *mut NvmlMemoryV2) -> NvmlReturn;
type Procs = unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut NvmlProcessInfo) -> NvmlReturn;
type ErrStr = unsafe extern "C" fn(NvmlReturn) -> *const c_char;
type Persistence = unsafe extern "C" fn(NvmlDevice, *mut NvmlEnableState) -> NvmlReturn;
type MigMode = unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut c_uint) -> NvmlReturn;

/// The entry points, resolved from the loaded library.
struct Nvml {
    init: Init,
    init_flags: InitFlags,
    shutdown: Init,
    driver_version: Str,
    count: Count,
    by_index: ByIndex,
    by_uuid: ByUuid,
    uuid: DevStr,
    name: DevStr,
    memory: Mem,
    memory_v2: MemV2,
    procs: Procs,
    error_string: ErrStr,
    persistence: Persistence,
    mig: MigMode,
    _lib: libloading::Library,
}

impl Nvml {
    fn load(path: &Path) -> Nvml {
        // SAFETY: the stand-in's constructors have no preconditions.
        let lib = unsafe { libloading::Library::new(path) }.unwrap();
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the field type spells out the NVML signature of the symbol.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.unwrap()
            };
        }
        Nvml {
            init: sym!("nvmlInit_v2"),
            init_flags: sym!("nvmlInitWithFlags"),
            shutdown: sym!("nvmlShutdown"),
            driver_version: sym!("nvmlSystemGetDriverVersion"),
            count: sym!("nvmlDeviceGetCount_v2"),
            by_index: sym!("nvmlDeviceGetHandleByIndex_v2"),
            by_uuid: sym!("nvmlDeviceGetHandleByUUID"),
            uuid: sym!("nvmlDeviceGetUUID"),
            name: sym!("nvmlDeviceGetName"),
            memory: sym!("nvmlDeviceGetMemoryInfo"),
            memory_v2: sym!("nvmlDeviceGetMemoryInfo_v2"),
            procs: sym!("nvmlDeviceGetComputeRunningProcesses_v3"),
            error_string: sym!("nvmlErrorString"),
            persistence: sym!("nvmlDeviceGetPersistenceMode"),
            mig: sym!("nvmlDeviceGetMigMode"),
            _lib: lib,
        }
    }

    /// `nvmlDeviceGetPersistenceMode`.
    fn persistence(&self, d: NvmlDevice) -> Result<NvmlEnableState, NvmlReturn> {
        let mut m = NvmlEnableState(7);
        // SAFETY: valid out-pointer.
        let r = unsafe { (self.persistence)(d, &mut m) };
        r.is_success().then_some(m).ok_or(r)
    }

    /// `nvmlDeviceGetMigMode`: (current, pending).
    fn mig(&self, d: NvmlDevice) -> Result<(c_uint, c_uint), NvmlReturn> {
        let (mut cur, mut pending) = (7, 7);
        // SAFETY: valid out-pointers.
        let r = unsafe { (self.mig)(d, &mut cur, &mut pending) };
        r.is_success().then_some((cur, pending)).ok_or(r)
    }

    fn init(&self) -> NvmlReturn {
        // SAFETY: no arguments.
        unsafe { (self.init)() }
    }

    fn shutdown(&self) -> NvmlReturn {
        // SAFETY: no arguments.
        unsafe { (self.shutdown)() }
    }

    fn count(&self) -> Result<u32, NvmlReturn> {
        let mut n = 0;
        // SAFETY: valid out-pointer.
        let r = unsafe { (self.count)(&mut n) };
        r.is_success().then_some(n).ok_or(r)
    }

    fn by_index(&self, i: u32) -> Result<NvmlDevice, NvmlReturn> {
        let mut d = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let r = unsafe { (self.by_index)(i, &mut d) };
        r.is_success().then_some(d).ok_or(r)
    }

    fn by_uuid(&self, uuid: &str) -> Result<NvmlDevice, NvmlReturn> {
        let mut d = std::ptr::null_mut();
        let c = CString::new(uuid).unwrap();
        // SAFETY: a NUL-terminated string and a valid out-pointer.
        let r = unsafe { (self.by_uuid)(c.as_ptr(), &mut d) };
        r.is_success().then_some(d).ok_or(r)
    }

    /// A string query with a buffer of `len` bytes.
    fn string(
        &self,
        f: impl FnOnce(*mut c_char, c_uint) -> NvmlReturn,
        len: usize,
    ) -> Result<String, NvmlReturn> {
        let mut buf = vec![0 as c_char; len];
        let r = f(buf.as_mut_ptr(), len as c_uint);
        if !r.is_success() {
            return Err(r);
        }
        // SAFETY: on success the buffer holds a NUL-terminated string.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_str()
            .unwrap()
            .to_owned())
    }

    fn uuid(&self, d: NvmlDevice, len: usize) -> Result<String, NvmlReturn> {
        // SAFETY: `p` is valid for `n` bytes (the buffer `string` made).
        self.string(|p, n| unsafe { (self.uuid)(d, p, n) }, len)
    }

    fn name(&self, d: NvmlDevice) -> Result<String, NvmlReturn> {
        // SAFETY: as for `uuid`.
        self.string(|p, n| unsafe { (self.name)(d, p, n) }, 96)
    }

    fn driver_version(&self, len: usize) -> Result<String, NvmlReturn> {
        // SAFETY: as for `uuid`.
        self.string(|p, n| unsafe { (self.driver_version)(p, n) }, len)
    }

    fn memory(&self, d: NvmlDevice) -> Result<NvmlMemory, NvmlReturn> {
        let mut m = NvmlMemory::default();
        // SAFETY: valid out-pointer.
        let r = unsafe { (self.memory)(d, &mut m) };
        r.is_success().then_some(m).ok_or(r)
    }

    fn memory_v2(&self, d: NvmlDevice, version: u32) -> Result<NvmlMemoryV2, NvmlReturn> {
        let mut m = NvmlMemoryV2 {
            version,
            ..Default::default()
        };
        // SAFETY: valid out-pointer.
        let r = unsafe { (self.memory_v2)(d, &mut m) };
        r.is_success().then_some(m).ok_or(r)
    }

    /// The process query with room for `room` entries: its code, the count it set, the
    /// entries it wrote.
    fn procs(&self, d: NvmlDevice, room: u32) -> (NvmlReturn, u32, Vec<NvmlProcessInfo>) {
        let mut infos = vec![NvmlProcessInfo::default(); room as usize];
        let mut n = room;
        let ptr = if room == 0 {
            std::ptr::null_mut()
        } else {
            infos.as_mut_ptr()
        };
        // SAFETY: `ptr` is NULL or valid for `room` entries; `n` is a valid count.
        let r = unsafe { (self.procs)(d, &mut n, ptr) };
        infos.truncate(if r.is_success() { n as usize } else { 0 });
        (r, n, infos)
    }

    fn error_string(&self, r: NvmlReturn) -> String {
        // SAFETY: returns a static NUL-terminated string.
        unsafe { CStr::from_ptr((self.error_string)(r)) }
            .to_str()
            .unwrap()
            .to_owned()
    }
}

#[test]
fn gpus_memory_and_the_compute_processes_of_each_gpu_by_pid() {
    let _s = serial();
    let mut w = TestWorld::new(&config(""));
    let a = w.spawn(0, 40);
    let b = w.spawn(0, 10);
    let c = w.spawn(1, 100);
    let nvml = w.nvml();
    assert_eq!(nvml.init(), NvmlReturn::SUCCESS);
    assert_eq!(nvml.driver_version(80).unwrap(), "580.65.06");
    assert_eq!(nvml.count(), Ok(2));
    let d0 = nvml.by_index(0).unwrap();
    let d1 = nvml.by_index(1).unwrap();
    assert_eq!(nvml.uuid(d0, 80).unwrap(), GPU0);
    assert_eq!(nvml.uuid(d1, 80).unwrap(), GPU1);
    assert_eq!(nvml.by_uuid(GPU1), Ok(d1));
    assert_eq!(nvml.name(d1).unwrap(), "NVIDIA H200");

    let m0 = nvml.memory(d0).unwrap();
    assert_eq!((m0.total, m0.used, m0.free), (80 * GIB, 50 * GIB, 30 * GIB));
    let m1 = nvml.memory_v2(d1, NVML_MEMORY_V2).unwrap();
    assert_eq!((m1.total, m1.used, m1.reserved), (141 * GIB, 100 * GIB, 0));
    assert_eq!(m1.free, 41 * GIB);

    // How many? Then all of them.
    let (r, n, _) = nvml.procs(d0, 0);
    assert_eq!((r, n), (NvmlReturn::ERROR_INSUFFICIENT_SIZE, 2));
    let (r, n, _) = nvml.procs(d0, 1);
    assert_eq!((r, n), (NvmlReturn::ERROR_INSUFFICIENT_SIZE, 2));
    let (r, n, infos) = nvml.procs(d0, 4);
    assert_eq!((r, n), (NvmlReturn::SUCCESS, 2));
    let mut want = vec![(a, 40 * GIB), (b, 10 * GIB)];
    want.sort_unstable();
    let got: Vec<(u32, u64)> = infos.iter().map(|p| (p.pid, p.used_gpu_memory)).collect();
    assert_eq!(got, want);
    assert!(infos
        .iter()
        .all(|p| p.gpu_instance_id == NVML_VALUE_NOT_AVAILABLE_UINT
            && p.compute_instance_id == NVML_VALUE_NOT_AVAILABLE_UINT));
    let (r, n, infos) = nvml.procs(d1, 1);
    assert_eq!((r, n), (NvmlReturn::SUCCESS, 1));
    assert_eq!((infos[0].pid, infos[0].used_gpu_memory), (c, 100 * GIB));
    assert_eq!(nvml.shutdown(), NvmlReturn::SUCCESS);

    let trace = w.world.read_trace();
    let mine = mock_cuda_world::trace::calls_by(&trace, &std::process::id().to_string());
    for line in [
        "nvmlInit_v2() = NVML_SUCCESS",
        "nvmlDeviceGetCount_v2() = NVML_SUCCESS",
        "nvmlDeviceGetHandleByIndex_v2(index=1) = NVML_SUCCESS",
        &format!("nvmlDeviceGetHandleByUUID(uuid={GPU1}) = NVML_SUCCESS"),
        "nvmlDeviceGetMemoryInfo_v2(dev=1) = NVML_SUCCESS",
        "nvmlDeviceGetComputeRunningProcesses_v3(dev=0, infoCount=0) = NVML_ERROR_INSUFFICIENT_SIZE",
        "nvmlDeviceGetComputeRunningProcesses_v3(dev=0, infoCount=4) = NVML_SUCCESS",
        "nvmlShutdown() = NVML_SUCCESS",
    ] {
        assert!(
            mine.contains(&line),
            "no {line:?} of this process in the trace:\n{trace}"
        );
    }
}

#[test]
fn a_checkpointed_process_leaves_its_gpu_until_it_is_restored() {
    let _s = serial();
    let mut w = TestWorld::new(&config(""));
    let a = w.spawn(0, 30);
    let nvml = w.nvml();
    assert_eq!(nvml.init(), NvmlReturn::SUCCESS);
    let d0 = nvml.by_index(0).unwrap();
    let pid = a as i32;
    mock_libcuda::driver::lock(pid, 0).unwrap();
    let (_, n, _) = nvml.procs(d0, 4);
    assert_eq!(n, 1, "a locked process still holds its memory");
    mock_libcuda::driver::checkpoint(pid).unwrap();
    assert_eq!(nvml.procs(d0, 4), (NvmlReturn::SUCCESS, 0, vec![]));
    assert_eq!(nvml.memory(d0).unwrap().used, 0);
    mock_libcuda::driver::init(0).unwrap();
    mock_libcuda::driver::restore(pid, &[]).unwrap();
    let (_, _, infos) = nvml.procs(d0, 4);
    assert_eq!(
        infos
            .iter()
            .map(|p| (p.pid, p.used_gpu_memory))
            .collect::<Vec<_>>(),
        vec![(a, 30 * GIB)]
    );
    assert_eq!(nvml.memory(d0).unwrap().used, 30 * GIB);
}

#[test]
fn uninitialised_calls_bad_arguments_and_short_buffers_fail_as_documented() {
    let _s = serial();
    let w = TestWorld::new(&config(""));
    let nvml = w.nvml();
    assert_eq!(nvml.count(), Err(NvmlReturn::ERROR_UNINITIALIZED));
    assert_eq!(nvml.shutdown(), NvmlReturn::ERROR_UNINITIALIZED);
    // Initialisations are counted: two need two shutdowns.
    assert_eq!(nvml.init(), NvmlReturn::SUCCESS);
    // SAFETY: plain value argument.
    assert_eq!(unsafe { (nvml.init_flags)(1) }, NvmlReturn::SUCCESS);
    // SAFETY: plain value argument.
    let unknown_flag = unsafe { (nvml.init_flags)(0x80) };
    assert_eq!(unknown_flag, NvmlReturn::ERROR_INVALID_ARGUMENT);
    assert_eq!(nvml.shutdown(), NvmlReturn::SUCCESS);
    assert_eq!(nvml.count(), Ok(2));
    let d0 = nvml.by_index(0).unwrap();
    assert_eq!(nvml.by_index(2), Err(NvmlReturn::ERROR_INVALID_ARGUMENT));
    assert_eq!(
        nvml.by_uuid("GPU-99999999-9999-4999-8999-999999999999"),
        Err(NvmlReturn::ERROR_NOT_FOUND)
    );
    assert_eq!(nvml.uuid(d0, 40), Err(NvmlReturn::ERROR_INSUFFICIENT_SIZE));
    assert_eq!(nvml.uuid(d0, 41).unwrap(), GPU0);
    assert_eq!(
        nvml.driver_version(9),
        Err(NvmlReturn::ERROR_INSUFFICIENT_SIZE)
    );
    let bogus = std::ptr::null_mut();
    assert_eq!(nvml.memory(bogus), Err(NvmlReturn::ERROR_INVALID_ARGUMENT));
    assert_eq!(
        nvml.memory_v2(d0, 1),
        Err(NvmlReturn::ERROR_ARGUMENT_VERSION_MISMATCH)
    );
    // SAFETY: a NULL count is what is being tested; the stand-in must not write through it.
    let r = unsafe { (nvml.procs)(d0, std::ptr::null_mut(), std::ptr::null_mut()) };
    assert_eq!(r, NvmlReturn::ERROR_INVALID_ARGUMENT);
    assert_eq!(
        nvml.error_string(NvmlReturn::ERROR_INSUFFICIENT_SIZE),
        "Insufficient Size"
    );
    assert_eq!(nvml.shutdown(), NvmlReturn::SUCCESS);
    assert_eq!(nvml.count(), Err(NvmlReturn::ERROR_UNINITIALIZED));
}

#[test]
fn world_faults_make_nvml_calls_fail_or_hang() {
    let _s = serial();
    let w = TestWorld::new(&config(""));
    let nvml = w.nvml();
    assert_eq!(nvml.init(), NvmlReturn::SUCCESS);
    let d0 = nvml.by_index(0).unwrap();
    let faulty = config(
        r#"[[fault]]
function = "nvmlDeviceGetComputeRunningProcesses_v3"
action = { kind = "return", code = "NVML_ERROR_TIMEOUT" }
[[fault]]
function = "nvmlDeviceGetMemoryInfo"
action = { kind = "hang", file = "go" }
"#,
    );
    World::reconfigure(
        w.dir.path(),
        &WorldConfig::parse(&faulty, "f").unwrap(),
        None,
    )
    .unwrap();
    assert_eq!(nvml.procs(d0, 0).0, NvmlReturn::ERROR_TIMEOUT);
    assert_eq!(nvml.procs(d0, 0).0, NvmlReturn::SUCCESS, "one-shot");
    let handle = d0 as usize;
    let path = w.nvml_path();
    let hung = std::thread::spawn(move || {
        let nvml = Nvml::load(&path);
        nvml.memory(handle as NvmlDevice).map(|m| m.total)
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(!hung.is_finished(), "the call hangs until the file exists");
    std::fs::write(w.dir.path().join("go"), "").unwrap();
    assert_eq!(hung.join().unwrap(), Ok(80 * GIB));
    let trace = w.world.read_trace();
    assert!(
        trace.contains(
            "nvmlDeviceGetComputeRunningProcesses_v3(dev=0, infoCount=0) = NVML_ERROR_TIMEOUT"
        ),
        "{trace}"
    );
}

impl TestWorld {
    fn nvml_path(&self) -> PathBuf {
        self.dir.path().join("lib").join(NVML_LIB)
    }
}

#[test]
fn the_installed_library_is_libnvidia_ml_with_nvml_symbols_only_unless_absent() {
    let _s = serial();
    let w = TestWorld::new(&config(""));
    let image = std::fs::read(w.nvml_path()).unwrap();
    let mut names = mock_libcuda::elf::exported_names(&image).unwrap();
    names.retain(|n| n.starts_with("nvml") || n.starts_with("cu"));
    names.sort();
    let mut want: Vec<String> = NVML_FUNCTIONS.iter().map(|s| (*s).to_owned()).collect();
    want.sort();
    assert_eq!(
        names, want,
        "libnvidia-ml.so.1 exports NVML and nothing of the driver"
    );
    assert_eq!(
        mock_libcuda::elf::soname(&image).unwrap().as_deref(),
        Some(NVML_LIB),
        "the dynamic loader knows it as libnvidia-ml.so.1"
    );

    // A world without NVML has no library; configured with NVML again, it has one.
    let absent = config("[nvml]\npresent = false");
    let cfg = WorldConfig::parse(&absent, "absent").unwrap();
    let w2 = World::reconfigure(w.dir.path(), &cfg, None).unwrap();
    w2.install_nvml(None).unwrap();
    assert!(!w.nvml_path().exists());
    let e = World::create(
        w.dir.path(),
        &WorldConfig::parse(&config(""), "x").unwrap(),
        &deps().join("libmock_libcuda.so"),
    )
    .unwrap()
    .install_nvml(None)
    .unwrap_err()
    .to_string();
    assert!(e.contains("present = true") && e.contains(NVML_LIB), "{e}");
}

#[test]
fn persistence_and_mig_mode_are_the_gpus_settings() {
    use abi::nvml::{NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE};
    let _s = serial();
    // The first GPU: persistence off and MIG on; the second: the defaults (on, off).
    let text = config("").replacen(
        "chip = \"GH100\"\n[[gpu]]",
        "chip = \"GH100\"\npersistence = false\nmig = true\n[[gpu]]",
        1,
    );
    let w = TestWorld::new(&text);
    let n = w.nvml();
    let d0 = n.by_index(0);
    assert_eq!(d0, Err(NvmlReturn::ERROR_UNINITIALIZED));
    assert!(n.init().is_success());
    let (d0, d1) = (n.by_index(0).unwrap(), n.by_index(1).unwrap());
    assert_eq!(n.persistence(d0), Ok(NvmlEnableState::DISABLED));
    assert_eq!(n.persistence(d1), Ok(NvmlEnableState::ENABLED));
    assert_eq!(
        n.mig(d0),
        Ok((NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE))
    );
    assert_eq!(
        n.mig(d1),
        Ok((NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_DISABLE))
    );
    // NULL out-pointers and a pointer that is no handle.
    // SAFETY: the stand-in checks its pointers (NULL is an argument error, not a write).
    let r = unsafe { (n.persistence)(d0, std::ptr::null_mut()) };
    assert_eq!(r, NvmlReturn::ERROR_INVALID_ARGUMENT);
    let mut cur = 0;
    // SAFETY: as above; `cur` is a valid out-pointer.
    let r = unsafe { (n.mig)(d0, &mut cur, std::ptr::null_mut()) };
    assert_eq!(r, NvmlReturn::ERROR_INVALID_ARGUMENT);
    assert_eq!(
        n.persistence(std::ptr::null_mut()),
        Err(NvmlReturn::ERROR_INVALID_ARGUMENT)
    );
    let trace = std::fs::read_to_string(w.dir.path().join("trace.log")).unwrap();
    assert!(
        trace.contains("nvmlDeviceGetMigMode(dev=0) = NVML_SUCCESS"),
        "traced like every call:\n{trace}"
    );
    assert!(n.shutdown().is_success());
}
