//! NVML's behaviour, in safe Rust: every entry point returns `Result<_, NvmlReturn>`;
//! [`crate::ffi`] only converts pointers and calls in here.
//!
//! What the stand-in answers, from the world:
//! * **Initialisation** is counted per process: each `nvmlInit_v2`/`nvmlInitWithFlags` needs
//!   an `nvmlShutdown`; every other call but `nvmlErrorString` is
//!   `NVML_ERROR_UNINITIALIZED` outside that. Without a world (`MOCK_CUDA_WORLD` unset or
//!   unreadable) initialisation fails with `NVML_ERROR_DRIVER_NOT_LOADED`, as without a driver.
//! * **Devices** are the world's GPUs in host order (`[[gpu]]` order, as `nvidia-smi` lists
//!   them); NVML ignores `CUDA_VISIBLE_DEVICES`. A device is named by its host index.
//! * **Memory**: total is the GPU's `memory_mib`; used is what is resident on it (the
//!   allocations of running and locked processes, logical sizes, and what restores in progress
//!   claimed); free is the rest. Nothing is reserved for the driver.
//! * **Compute processes** of a GPU: every live CUDA process of the world with a context on it
//!   that holds GPU state (running or locked, or restoring onto it), with the bytes it uses
//!   there, by host pid (its pid in the pid namespace of the world's host, whatever namespace
//!   the process or the caller lives in, as the real NVML reports from the root namespace), in
//!   increasing pid order. A caller that sees the host's pids finds them now; a caller inside
//!   a pid namespace reports the host pids the world last knew, and leaves out a process whose
//!   host pid no one has seen yet (it registered inside a pid namespace with its own `/proc`
//!   and no process of the host has asked about it). A checkpointed process released its GPU and is not
//!   listed. MIG instances are not modelled: the instance ids are "not available".
//! * **Persistence and MIG mode** of a GPU are its `persistence` (default on) and `mig` (default
//!   off) settings in the world's `[[gpu]]` table; a GPU in MIG mode reports the same mode as
//!   current and pending.
//!
//! Variable-length answers follow NVML's protocols: a string buffer shorter than the answer
//! (with its NUL) is `NVML_ERROR_INSUFFICIENT_SIZE`; a process list longer than the caller's
//! count sets the count to the length needed and returns `NVML_ERROR_INSUFFICIENT_SIZE`.

use abi::nvml::{NvmlReturn, NVML_INIT_FLAG_NO_ATTACH, NVML_INIT_FLAG_NO_GPUS};
use abi::CUprocessState;
use mock_cuda_world::config::{FaultAction, GpuConfig};
use mock_cuda_world::pidns::{self, Presence};
use mock_cuda_world::World;
use std::sync::{Arc, Mutex};
use std::time::Duration;

type R<T> = Result<T, NvmlReturn>;

/// How many times this process initialised NVML without shutting it down.
static INIT_COUNT: Mutex<u32> = Mutex::new(0);

fn init_count() -> std::sync::MutexGuard<'static, u32> {
    INIT_COUNT.lock().unwrap_or_else(|p| p.into_inner())
}

/// The world, or the code a call without one returns.
fn world(missing: NvmlReturn) -> R<Arc<World>> {
    World::from_env().map_err(|e| {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| eprintln!("mock-nvml: {e}"));
        missing
    })
}

/// Runs `op` for the NVML call `function` under the world's faults, and traces the outcome.
fn call<T>(world: &World, function: &str, args: &str, op: impl FnOnce() -> R<T>) -> R<T> {
    let result = match world.fault_for(&[function], None) {
        Err(_) => Err(NvmlReturn::ERROR_UNKNOWN),
        Ok(None) => op(),
        Ok(Some(action)) => apply_fault(world, &action, op),
    };
    let code = match &result {
        Ok(_) => NvmlReturn::SUCCESS,
        Err(c) => *c,
    };
    world.trace(function, args, &code.to_string());
    result
}

/// Carries a fault out around `op` (the world's validation lets only these kinds through).
fn apply_fault<T>(world: &World, action: &FaultAction, op: impl FnOnce() -> R<T>) -> R<T> {
    match action {
        FaultAction::Return { code } => Err(code.nvml()),
        FaultAction::ErrorAfter { code } => {
            let _ = op();
            Err(code.nvml())
        }
        FaultAction::Delay { ms } => {
            std::thread::sleep(Duration::from_millis(*ms));
            op()
        }
        FaultAction::Hang { file } => {
            world.hang(file.as_deref());
            op()
        }
        FaultAction::Crash { signal } => mock_cuda_world::ffi::crash(signal.as_deref()),
        FaultAction::Fail { .. }
        | FaultAction::KillTarget
        | FaultAction::ForeignLock
        | FaultAction::Garbage { .. } => Err(NvmlReturn::ERROR_UNKNOWN),
    }
}

/// A call that needs NVML initialised: the world, or `NVML_ERROR_UNINITIALIZED`.
fn initialised<T>(function: &str, args: &str, op: impl FnOnce(&World) -> R<T>) -> R<T> {
    let w = world(NvmlReturn::ERROR_UNINITIALIZED)?;
    call(&w, function, args, || {
        if *init_count() == 0 {
            return Err(NvmlReturn::ERROR_UNINITIALIZED);
        }
        op(&w)
    })
}

/// `nvmlInit_v2` (`flags` 0) and `nvmlInitWithFlags`.
pub fn init(function: &str, flags: u32) -> R<()> {
    let w = world(NvmlReturn::ERROR_DRIVER_NOT_LOADED)?;
    let args = if function == "nvmlInitWithFlags" {
        format!("flags={flags}")
    } else {
        String::new()
    };
    call(&w, function, &args, || {
        if flags & !(NVML_INIT_FLAG_NO_GPUS | NVML_INIT_FLAG_NO_ATTACH) != 0 {
            return Err(NvmlReturn::ERROR_INVALID_ARGUMENT);
        }
        *init_count() += 1;
        Ok(())
    })
}

/// `nvmlShutdown`: one initialisation less; `NVML_ERROR_UNINITIALIZED` when there is none.
pub fn shutdown() -> R<()> {
    let w = world(NvmlReturn::ERROR_UNINITIALIZED)?;
    call(&w, "nvmlShutdown", "", || {
        let mut n = init_count();
        if *n == 0 {
            return Err(NvmlReturn::ERROR_UNINITIALIZED);
        }
        *n -= 1;
        Ok(())
    })
}

/// `nvmlSystemGetDriverVersion`: the world's full driver version (`580.65.06`).
pub fn driver_version() -> R<String> {
    initialised("nvmlSystemGetDriverVersion", "", |w| {
        Ok(w.config().driver.version_string())
    })
}

/// `nvmlDeviceGetCount_v2`.
pub fn device_count() -> R<u32> {
    initialised("nvmlDeviceGetCount_v2", "", |w| {
        Ok(w.config().gpus.len() as u32)
    })
}

fn gpu(w: &World, index: usize) -> R<&GpuConfig> {
    w.config()
        .gpus
        .get(index)
        .ok_or(NvmlReturn::ERROR_INVALID_ARGUMENT)
}

/// `nvmlDeviceGetHandleByIndex_v2`: the device of host index `index`.
pub fn handle_by_index(index: u32) -> R<usize> {
    initialised(
        "nvmlDeviceGetHandleByIndex_v2",
        &format!("index={index}"),
        |w| {
            let i = index as usize;
            gpu(w, i)?;
            Ok(i)
        },
    )
}

/// `nvmlDeviceGetHandleByUUID`: the device whose UUID text is exactly `uuid`.
pub fn handle_by_uuid(uuid: &str) -> R<usize> {
    initialised("nvmlDeviceGetHandleByUUID", &format!("uuid={uuid}"), |w| {
        w.config()
            .gpus
            .iter()
            .position(|g| g.uuid.0.to_string() == uuid)
            .ok_or(NvmlReturn::ERROR_NOT_FOUND)
    })
}

/// A property of device `dev` (a host index from a handle; `None`: not a handle); `extra`
/// arguments for the trace.
fn device<T>(
    function: &str,
    dev: Option<usize>,
    extra: &str,
    f: impl FnOnce(&World, usize) -> R<T>,
) -> R<T> {
    let mut args = dev.map_or_else(|| "dev=?".to_owned(), |d| format!("dev={d}"));
    args.push_str(extra);
    initialised(function, &args, |w| {
        let d = dev.ok_or(NvmlReturn::ERROR_INVALID_ARGUMENT)?;
        gpu(w, d)?;
        f(w, d)
    })
}

/// `nvmlDeviceGetUUID`.
pub fn uuid(dev: Option<usize>) -> R<String> {
    device("nvmlDeviceGetUUID", dev, "", |w, d| {
        Ok(gpu(w, d)?.uuid.0.to_string())
    })
}

/// `nvmlDeviceGetName`.
pub fn name(dev: Option<usize>) -> R<String> {
    device("nvmlDeviceGetName", dev, "", |w, d| {
        Ok(gpu(w, d)?.name.clone())
    })
}

/// `nvmlDeviceGetPersistenceMode`: the GPU's `persistence` setting (default on).
pub fn persistence_mode(dev: Option<usize>) -> R<bool> {
    device("nvmlDeviceGetPersistenceMode", dev, "", |w, d| {
        Ok(gpu(w, d)?.persistence)
    })
}

/// `nvmlDeviceGetMigMode`: the GPU's `mig` setting (default off), as both the current and the
/// pending mode.
pub fn mig_mode(dev: Option<usize>) -> R<bool> {
    device("nvmlDeviceGetMigMode", dev, "", |w, d| Ok(gpu(w, d)?.mig))
}

/// A GPU's memory, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlDeviceGetMemoryInfo` and `nvmlDeviceGetMemoryInfo_v2` (`function`).
pub fn memory(function: &str, dev: Option<usize>) -> R<Memory> {
    device(function, dev, "", |w, d| {
        let g = gpu(w, d)?;
        let total = g.capacity_bytes();
        let st = w.read_state().map_err(|_| NvmlReturn::ERROR_UNKNOWN)?;
        let used = st.resident_bytes(g.uuid.0, None).min(total);
        Ok(Memory {
            total,
            free: total - used,
            used,
        })
    })
}

/// One compute process of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComputeProcess {
    pub pid: u32,
    /// Bytes it uses on the GPU.
    pub used: u64,
}

/// The compute processes of device `dev` (module documentation).
fn compute_processes(w: &World, d: usize) -> R<Vec<ComputeProcess>> {
    let g = gpu(w, d)?.uuid;
    let st = w.read_state().map_err(|_| NvmlReturn::ERROR_UNKNOWN)?;
    let host_view = w.host_view();
    let mut out = Vec::new();
    for (&id, e) in &st.processes {
        // Host pids, as NVML reports from any namespace: the one found now when this process
        // sees the host's pids, else the last one the world knew.
        let pid = match (pidns::locate(&e.whereabouts(id), host_view), host_view) {
            (Presence::Gone, _) => continue,
            (Presence::Here(p), true) => p,
            _ => e.pid,
        };
        if pid <= 0 {
            continue;
        }
        let holds = matches!(e.state(), CUprocessState::RUNNING | CUprocessState::LOCKED);
        let used = if holds && e.contexts.contains(&g) {
            Some(
                e.allocations
                    .iter()
                    .filter(|a| a.gpu == g)
                    .map(|a| a.size)
                    .sum(),
            )
        } else {
            e.reserved.iter().find(|r| r.uuid == g).map(|r| r.bytes)
        };
        if let (Some(used), Ok(pid)) = (used, u32::try_from(pid)) {
            out.push(ComputeProcess { pid, used });
        }
    }
    out.sort_by_key(|p| p.pid);
    Ok(out)
}

/// `nvmlDeviceGetComputeRunningProcesses_v3` with the caller's `capacity` (its `*infoCount`):
/// the processes when they fit, else `Err((NVML_ERROR_INSUFFICIENT_SIZE, needed))`; other
/// errors come with no count.
pub fn running_processes(
    dev: Option<usize>,
    capacity: u32,
) -> Result<Vec<ComputeProcess>, (NvmlReturn, Option<u32>)> {
    let needed = std::cell::Cell::new(None);
    let r = device(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        dev,
        &format!(", infoCount={capacity}"),
        |w, d| {
            let procs = compute_processes(w, d)?;
            if procs.len() > capacity as usize {
                needed.set(Some(procs.len() as u32));
                return Err(NvmlReturn::ERROR_INSUFFICIENT_SIZE);
            }
            Ok(procs)
        },
    );
    r.map_err(|code| (code, needed.get()))
}
