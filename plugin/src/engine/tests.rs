//! Engine tests against a simulated world: a fake driver state machine per task, a fake ptrace
//! (a frozen task's requests only make progress while its restore thread runs), a fake host, and
//! a tiny CRIU that calls the hooks in CRIU's order. Faults can be injected at any call.

use super::dump::Dump;
use super::error::collective_hint;
use super::restore::Restore;
use super::*;
use crate::backend::{Backend, BackendError, BackendKind, JobResult, LockLimits, Op, Tid};
use crate::host::{Criu, InventoryAnswer};
use crate::host::{FreezeAlarm, HostError, Level};
use crate::machine::Machine;
use crate::message::Report;
use crate::thread::Resumed;
use crate::thread::{ThreadControl, ThreadError};
use abi::{CUprocessState, CUresult, GpuUuid};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FaultKind {
    /// The call fails and changes nothing.
    Error,
    /// The call times out and changes nothing.
    Timeout,
    /// The call takes effect but reports a timeout (a lock that completed late).
    LateSuccess,
    /// The call times out and is abandoned (the driver-API backend): every later call is refused
    /// as busy until the backend settles, and then the call takes effect after all.
    Abandoned,
    /// The driver's own lock timeout: the call fails with `CUDA_ERROR_NOT_READY` and changes
    /// nothing.
    NotReady,
    /// Like `Abandoned`, but the call never returns: `settle` gives up on it.
    Hung,
    /// Another tool locks the task just before the call, which then fails with
    /// `CUDA_ERROR_ILLEGAL_STATE` (as a lock of a locked task does).
    ForeignLock,
}

#[derive(Debug, Clone)]
struct FakeTask {
    cuda: bool,
    state: CUprocessState,
    tid: Tid,
    /// CRIU holds the task ptrace-stopped.
    traced: bool,
    /// Our fake ptrace let the restore thread run.
    thread_running: bool,
    /// Stopped by a signal (`Some('T')`): its restore thread cannot serve requests.
    stopped: Option<char>,
    /// Killed (by `kill_task`) or exited.
    dead: bool,
}

impl FakeTask {
    fn new(cuda: bool, state: CUprocessState, tid: Tid) -> Self {
        FakeTask {
            cuda,
            state,
            tid,
            traced: false,
            thread_running: false,
            stopped: None,
            dead: false,
        }
    }
}

#[derive(Debug, Default)]
struct World {
    tasks: BTreeMap<Pid, FakeTask>,
    /// Every call, in order, as "what pid".
    calls: Vec<String>,
    fault_at: Option<(usize, FaultKind)>,
    inventory_adds: usize,
    images: HashMap<Pid, Vec<u8>>,
    task_list: Option<Vec<u8>>,
    gpu_inventory: Option<Vec<u8>>,
    /// CRIU's freeze alarm as the host reports it (`None`: the host has none).
    alarm: Option<FreezeAlarm>,
    /// The limits of every lock call, in order.
    lock_limits: Vec<LockLimits>,
    /// Every lock batch ([`Backend::lock_many`]): its pids and width.
    lock_batches: Vec<(Vec<Pid>, usize)>,
    /// The deadline of every checkpoint and restore call, in order.
    copy_deadlines: Vec<Option<Duration>>,
    /// What NVML says (`None`: NVML is not available).
    nvml: Option<crate::nvml::Snapshot>,
    /// Host memory available.
    mem_available: Option<u64>,
    /// How often NVML was asked.
    nvml_queries: usize,
    /// The call abandoned by a [`FaultKind::Abandoned`] or [`FaultKind::Hung`] fault, until
    /// `settle`; true when it never returns.
    abandoned: Option<(Op, Pid, bool)>,
    logs: Vec<(Level, String)>,
}

type Shared = Arc<Mutex<World>>;

impl World {
    /// Records a call; returns the fault to inject, if this is the chosen call.
    fn call(&mut self, what: String) -> Option<FaultKind> {
        let n = self.calls.len();
        self.calls.push(what);
        match self.fault_at {
            Some((k, kind)) if k == n => Some(kind),
            _ => None,
        }
    }
}

struct FakeBackend(Shared);
struct FakeThreads(Shared);
struct FakeHost(Shared);

fn timeout(op: Op, pid: Pid) -> BackendError {
    BackendError::Timeout {
        backend: BackendKind::DriverApi,
        op,
        pid,
        after: Duration::from_secs(1),
    }
}

fn cuda(op: Op, pid: Pid, code: CUresult) -> BackendError {
    BackendError::Cuda {
        backend: BackendKind::DriverApi,
        op,
        pid,
        code,
    }
}

impl FakeBackend {
    /// Runs `op` on `pid`: "a stopped task whose restore thread is not running never answers",
    /// then fault injection, then the state machine.
    fn op(
        &mut self,
        op: Op,
        pid: Pid,
        f: impl FnOnce(&mut FakeTask) -> Result<(), CUresult>,
    ) -> Result<(), BackendError> {
        let mut w = self.0.lock().unwrap();
        let fault = w.call(format!("{op:?} {pid}"));
        if let Some((bop, bpid, _)) = w.abandoned {
            return Err(BackendError::Busy {
                op,
                pid,
                blocked: format!("{bop} pid {bpid}"),
            });
        }
        if let Some(kind @ (FaultKind::Abandoned | FaultKind::Hung)) = fault {
            w.abandoned = Some((op, pid, kind == FaultKind::Hung));
            return Err(timeout(op, pid));
        }
        let task = w.tasks.get_mut(&pid).expect("known pid");
        // Requests are served by the restore thread, so they hang on a stopped task unless that
        // thread runs. The restore TID itself is readable without it (CRIU's C plugin queries it
        // in RESUME_DEVICES_LATE with the task stopped).
        if task.traced && !task.thread_running && op != Op::GetRestoreTid {
            return Err(timeout(op, pid));
        }
        if task.dead {
            return Err(cuda(op, pid, CUresult::ERROR_INVALID_VALUE));
        }
        match fault {
            Some(FaultKind::ForeignLock) => {
                if task.state == CUprocessState::RUNNING {
                    task.state = CUprocessState::LOCKED;
                }
            }
            Some(FaultKind::Error) => return Err(cuda(op, pid, CUresult::ERROR_UNKNOWN)),
            Some(FaultKind::Timeout) => return Err(timeout(op, pid)),
            Some(FaultKind::NotReady) => return Err(cuda(op, pid, CUresult::ERROR_NOT_READY)),
            Some(FaultKind::LateSuccess) => {
                let _ = f(task);
                return Err(timeout(op, pid));
            }
            Some(FaultKind::Abandoned | FaultKind::Hung) | None => {}
        }
        f(task).map_err(|code| cuda(op, pid, code))
    }
}

fn transition(t: &mut FakeTask, from: CUprocessState, to: CUprocessState) -> Result<(), CUresult> {
    if !t.cuda {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    if t.state != from {
        return Err(CUresult::ERROR_ILLEGAL_STATE);
    }
    t.state = to;
    Ok(())
}

impl Backend for FakeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::DriverApi
    }
    fn get_restore_tid(&mut self, pid: Pid) -> Result<Option<Tid>, BackendError> {
        let mut tid = None;
        self.op(Op::GetRestoreTid, pid, |t| {
            tid = t.cuda.then_some(t.tid);
            Ok(())
        })?;
        Ok(tid)
    }
    fn get_state(&mut self, pid: Pid) -> Result<CUprocessState, BackendError> {
        let mut st = CUprocessState::RUNNING;
        self.op(Op::GetState, pid, |t| {
            st = t.state;
            Ok(())
        })?;
        Ok(st)
    }
    fn lock(&mut self, pid: Pid, limits: LockLimits) -> Result<(), BackendError> {
        self.0.lock().unwrap().lock_limits.push(limits);
        let r = self.op(Op::Lock, pid, |t| {
            transition(t, CUprocessState::RUNNING, CUprocessState::LOCKED)
        });
        // A lock that times out does so after the driver's own limit (kept short in tests).
        if let (Err(e), Some(d)) = (&r, limits.driver) {
            if e.is_timeout() && d <= Duration::from_secs(1) {
                std::thread::sleep(d);
            }
        }
        r
    }
    fn lock_many(&mut self, pids: &[Pid], limits: LockLimits, width: usize) -> Vec<JobResult> {
        self.0
            .lock()
            .unwrap()
            .lock_batches
            .push((pids.to_vec(), width));
        pids.iter()
            .map(|&p| crate::backend::timed_job(|| self.lock(p, limits)))
            .collect()
    }
    fn checkpoint(&mut self, pid: Pid, deadline: Option<Duration>) -> Result<(), BackendError> {
        self.0.lock().unwrap().copy_deadlines.push(deadline);
        self.op(Op::Checkpoint, pid, |t| {
            transition(t, CUprocessState::LOCKED, CUprocessState::CHECKPOINTED)
        })
    }
    fn restore(
        &mut self,
        pid: Pid,
        pairs: &[GpuPair],
        deadline: Option<Duration>,
    ) -> Result<(), BackendError> {
        self.0.lock().unwrap().copy_deadlines.push(deadline);
        let n = pairs.len();
        self.0
            .lock()
            .unwrap()
            .logs
            .push((Level::Debug, format!("restore pairs={n}")));
        self.op(Op::Restore, pid, |t| {
            transition(t, CUprocessState::CHECKPOINTED, CUprocessState::LOCKED)
        })
    }
    fn unlock(&mut self, pid: Pid) -> Result<(), BackendError> {
        self.op(Op::Unlock, pid, |t| {
            transition(t, CUprocessState::LOCKED, CUprocessState::RUNNING)
        })
    }
    fn settle(&mut self, limit: Duration) -> crate::backend::Settled {
        let mut w = self.0.lock().unwrap();
        w.calls.push(format!("Settle {}ms", limit.as_millis()));
        match w.abandoned {
            // Never returns: the backend stops waiting for it.
            Some((_, _, true)) => {
                w.abandoned = None;
                return crate::backend::Settled::StillBlocked;
            }
            Some(_) => w.calls.push("Returned".into()),
            None => return crate::backend::Settled::Nothing,
        }
        // The abandoned call returns now, and takes effect after all.
        if let Some((op, pid, _)) = w.abandoned.take() {
            use CUprocessState as S;
            let t = w.tasks.get_mut(&pid).expect("known pid");
            let _ = match op {
                Op::Lock => transition(t, S::RUNNING, S::LOCKED),
                Op::Checkpoint => transition(t, S::LOCKED, S::CHECKPOINTED),
                Op::Restore => transition(t, S::CHECKPOINTED, S::LOCKED),
                Op::Unlock => transition(t, S::LOCKED, S::RUNNING),
                _ => Ok(()),
            };
        }
        crate::backend::Settled::Returned
    }
}

impl ThreadControl for FakeThreads {
    fn resume(&mut self, pid: Pid, tid: Tid) -> Result<Resumed, ThreadError> {
        let mut w = self.0.lock().unwrap();
        let fault = w.call(format!("Resume {pid}"));
        let t = w.tasks.get_mut(&pid).unwrap();
        assert_eq!(t.tid, tid, "resume uses the recorded restore thread");
        if fault.is_some() {
            return Err(ThreadError::Ptrace {
                step: "PTRACE_CONT",
                tid,
                errno: libc::ESRCH,
            });
        }
        if !t.traced {
            return Ok(Resumed {
                pid,
                tid,
                saved_sigmask: None,
                seccomp: false,
            });
        }
        if t.thread_running {
            // Like PTRACE_GETSIGMASK on a thread that is not stopped.
            return Err(ThreadError::Ptrace {
                step: "PTRACE_GETSIGMASK",
                tid,
                errno: libc::ESRCH,
            });
        }
        t.thread_running = true;
        Ok(Resumed {
            pid,
            tid,
            saved_sigmask: Some(0x5a5a),
            seccomp: false,
        })
    }
    fn restop(&mut self, r: Resumed) -> Result<(), ThreadError> {
        let mut w = self.0.lock().unwrap();
        let fault = w.call(format!("Restop {}", r.pid));
        if r.saved_sigmask.is_none() {
            return Ok(());
        }
        let t = w.tasks.get_mut(&r.pid).unwrap();
        if fault.is_some() {
            return Err(ThreadError::StopTimeout {
                tid: r.tid,
                secs: 1,
            });
        }
        t.thread_running = false;
        Ok(())
    }
    fn thread_exists(&self, pid: Pid, tid: Tid) -> bool {
        self.0
            .lock()
            .unwrap()
            .tasks
            .get(&pid)
            .is_some_and(|t| t.tid == tid && !t.dead)
    }
    fn task_exists(&self, pid: Pid) -> bool {
        self.0
            .lock()
            .unwrap()
            .tasks
            .get(&pid)
            .is_some_and(|t| !t.dead)
    }
    fn stopped(&self, pid: Pid, _tid: Tid) -> Option<char> {
        self.0
            .lock()
            .unwrap()
            .tasks
            .get(&pid)
            .and_then(|t| t.stopped)
    }
    fn kill_task(&mut self, pid: Pid) -> Result<(), ThreadError> {
        let mut w = self.0.lock().unwrap();
        w.calls.push(format!("Kill {pid}"));
        if let Some(t) = w.tasks.get_mut(&pid) {
            t.dead = true;
            t.thread_running = false;
        }
        Ok(())
    }
}

impl Criu for FakeHost {
    fn log(&self, level: Level, msg: &str) {
        self.0.lock().unwrap().logs.push((level, msg.to_owned()));
    }
    fn add_inventory_entry(&mut self) -> Result<(), HostError> {
        let mut w = self.0.lock().unwrap();
        if w.call("Inventory".into()).is_some() {
            return Err(HostError::Failed {
                service: "add_inventory_plugin",
            });
        }
        w.inventory_adds += 1;
        Ok(())
    }
    fn write_task_image(&mut self, pid: Pid, data: &[u8]) -> Result<(), HostError> {
        let mut w = self.0.lock().unwrap();
        if w.call(format!("WriteImage {pid}")).is_some() {
            return Err(HostError::Failed { service: "openat" });
        }
        assert!(
            w.images.insert(pid, data.to_vec()).is_none(),
            "one image per task"
        );
        Ok(())
    }
    fn write_task_list(&mut self, data: &[u8]) -> Result<(), HostError> {
        let mut w = self.0.lock().unwrap();
        if w.call("WriteTaskList".into()).is_some() {
            return Err(HostError::Failed { service: "openat" });
        }
        assert!(w.task_list.is_none(), "one task list per dump");
        w.task_list = Some(data.to_vec());
        Ok(())
    }
    fn read_image(&mut self, name: &str, limit: usize) -> Result<Option<Vec<u8>>, HostError> {
        let w = self.0.lock().unwrap();
        let data = if name == crate::image::LIST_FILE_NAME {
            w.task_list.clone()
        } else if name == crate::inventory::FILE_NAME {
            w.gpu_inventory.clone()
        } else {
            w.images
                .iter()
                .find(|(&pid, _)| crate::image::file_name(pid) == name)
                .map(|(_, d)| d.clone())
        };
        match data {
            Some(d) if d.len() > limit => Err(HostError::TooLarge {
                name: name.to_owned(),
                limit,
            }),
            d => Ok(d),
        }
    }
    fn inventory_query(&mut self) -> InventoryAnswer {
        if self.0.lock().unwrap().inventory_adds > 0 {
            InventoryAnswer::Listed { consumed: false }
        } else {
            InventoryAnswer::NotListed
        }
    }
    fn inventory_consume(&mut self) -> Result<(), HostError> {
        let mut w = self.0.lock().unwrap();
        if w.inventory_adds == 0 {
            return Err(HostError::NoEntry {
                service: "check_and_remove_inventory_plugin",
            });
        }
        w.inventory_adds -= 1;
        Ok(())
    }
    fn freeze_alarm(&self) -> FreezeAlarm {
        self.0.lock().unwrap().alarm.unwrap_or(FreezeAlarm::Unknown)
    }
    fn write_gpu_inventory(&mut self, data: &[u8]) -> Result<(), HostError> {
        let mut w = self.0.lock().unwrap();
        if w.call("GpuInventory".into()).is_some() {
            return Err(HostError::Failed { service: "openat" });
        }
        assert!(
            w.gpu_inventory.is_none(),
            "the GPU inventory is written once per dump"
        );
        w.gpu_inventory = Some(data.to_vec());
        Ok(())
    }
}

impl Machine for FakeHost {
    fn gpu_memory(
        &mut self,
        _: Option<Duration>,
    ) -> Result<crate::nvml::Snapshot, crate::nvml::NvmlError> {
        let mut w = self.0.lock().unwrap();
        w.nvml_queries += 1;
        w.nvml
            .clone()
            .ok_or_else(|| crate::nvml::NvmlError::Absent("no NVML here".into()))
    }
    fn memory_available(&self) -> Option<u64> {
        self.0.lock().unwrap().mem_available
    }
    fn tree(&self, root: Pid) -> Vec<Pid> {
        let w = self.0.lock().unwrap();
        let mut v: Vec<Pid> = w.tasks.keys().copied().filter(|&p| p >= root).collect();
        v.sort_unstable();
        v
    }
    fn current_gpus(
        &mut self,
        _: Option<std::time::Duration>,
    ) -> Result<Vec<crate::inventory::GpuInfo>, crate::machine::GpuError> {
        Ok(vec![crate::inventory::GpuInfo {
            ordinal: 0,
            uuid: abi::GpuUuid([7; 16]),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_bytes: 80 << 30,
        }])
    }
}

/// Tree of the issue: two CUDA processes and one without CUDA (pids 100, 101, 102).
fn world(initial: [CUprocessState; 2]) -> Shared {
    let mut w = World::default();
    for (i, st) in initial.iter().enumerate() {
        let pid = 100 + i as Pid;
        w.tasks.insert(pid, FakeTask::new(true, *st, pid + 50));
    }
    w.tasks
        .insert(102, FakeTask::new(false, CUprocessState::RUNNING, 0));
    Arc::new(Mutex::new(w))
}

fn core(w: &Shared, cfg: EngineConfig) -> Core {
    Core::new(
        Box::new(FakeBackend(w.clone())),
        Box::new(FakeThreads(w.clone())),
        Box::new(FakeHost(w.clone())),
        cfg,
    )
}

fn new_dump(w: &Shared, cfg: EngineConfig) -> Dump {
    Dump::new(core(w, cfg))
}

fn new_restore(w: &Shared, cfg: EngineConfig) -> Restore {
    Restore::new(core(w, cfg))
}

const PIDS: [Pid; 3] = [100, 101, 102];

/// CRIU's dump order: PAUSE then seize per task; CHECKPOINT per task; finish; release.
fn criu_dump(w: &Shared, e: &mut Dump) -> (i32, Option<EngineError>) {
    criu_dump_pids(w, e, &PIDS)
}

fn criu_dump_pids(w: &Shared, e: &mut Dump, pids: &[Pid]) -> (i32, Option<EngineError>) {
    let mut ret = 0;
    let mut first_err = None;
    for &pid in pids {
        match e.pause_devices(pid) {
            Ok(_) => w.lock().unwrap().tasks.get_mut(&pid).unwrap().traced = true,
            Err(err) => {
                ret = -1;
                first_err = Some(err);
                break;
            }
        }
    }
    if ret == 0 {
        for &pid in pids {
            if let Err(err) = e.checkpoint_devices(pid) {
                ret = -1;
                first_err = Some(err);
                break;
            }
        }
    }
    let fin = e.dump_finish(ret);
    if let Err(err) = fin {
        first_err.get_or_insert(err);
    }
    for t in w.lock().unwrap().tasks.values_mut() {
        t.traced = false;
    }
    (ret, first_err)
}

fn states(w: &Shared) -> Vec<CUprocessState> {
    w.lock().unwrap().tasks.values().map(|t| t.state).collect()
}

fn any_thread_running(w: &Shared) -> bool {
    w.lock().unwrap().tasks.values().any(|t| t.thread_running)
}

#[test]
fn successful_dump_checkpoints_cuda_tasks_only() {
    let w = world([CUprocessState::RUNNING; 2]);
    let mut e = new_dump(&w, EngineConfig::default());
    assert_eq!(
        e.pause_devices(102).unwrap(),
        Outcome::NotMine,
        "no CUDA -> -ENOTSUP"
    );
    let (ret, err) = criu_dump(&w, &mut e);
    assert_eq!((ret, err.map(|e| e.to_string())), (0, None));
    assert_eq!(
        states(&w),
        vec![
            CUprocessState::CHECKPOINTED,
            CUprocessState::CHECKPOINTED,
            CUprocessState::RUNNING
        ]
    );
    let world = w.lock().unwrap();
    assert_eq!(
        world.inventory_adds, 1,
        "inventory entry added exactly once per dump"
    );
    assert_eq!(world.images.len(), 2);
    let inventory = crate::inventory::read(
        &mut &world.gpu_inventory.as_ref().expect("GPU inventory written")[..],
    )
    .unwrap();
    assert_eq!(inventory.len(), 1, "the GPUs of CRIU's view, once per dump");
    assert!(
        !world.tasks.values().any(|t| t.thread_running),
        "every restore thread stopped again"
    );
    assert_eq!(
        world.calls.iter().filter(|c| c.starts_with("GetRestoreTid")).count(),
        4,
        "102 probed twice (the extra pause above), CUDA tasks once: the TID is cached in the record"
    );
}

#[test]
fn parallel_mode_checkpoints_every_task_at_the_first_call_and_each_call_gets_its_own_result() {
    let w = world([CUprocessState::RUNNING; 2]);
    let mut e = new_dump(
        &w,
        EngineConfig {
            parallel: 4,
            ..EngineConfig::default()
        },
    );
    for pid in PIDS {
        e.pause_devices(pid).unwrap();
        w.lock().unwrap().tasks.get_mut(&pid).unwrap().traced = true;
    }
    let before = w.lock().unwrap().calls.len();
    // CRIU's loop starts with the CPU-only task: the batch still starts there.
    assert_eq!(e.checkpoint_devices(102).unwrap(), Outcome::NotMine);
    assert!(
        e.core_mut().take_batch_ran(),
        "the first call ran the batch"
    );
    let calls: Vec<String> = w.lock().unwrap().calls[before..].to_vec();
    assert_eq!(
        calls,
        [
            "Resume 100",
            "Resume 101",
            "Checkpoint 100",
            "Checkpoint 101",
            "Restop 100",
            "Restop 101"
        ],
        "both threads run while both checkpoints are made, then stop"
    );
    assert_eq!(
        states(&w)[..2],
        [CUprocessState::CHECKPOINTED, CUprocessState::CHECKPOINTED]
    );
    assert!(!any_thread_running(&w));
    for pid in [100, 101] {
        assert_eq!(e.checkpoint_devices(pid).unwrap(), Outcome::Handled);
        assert!(!e.core_mut().take_batch_ran());
    }
    let later: Vec<String> = w.lock().unwrap().calls[before + 6..].to_vec();
    assert!(
        !later.iter().any(|c| ["Checkpoint", "Resume", "Restop"]
            .iter()
            .any(|op| c.starts_with(op))),
        "the tasks' own calls checkpoint nothing again: {later:?}"
    );
    assert_eq!(
        w.lock().unwrap().images.len(),
        2,
        "each call writes its task's image"
    );
}

#[test]
fn leave_running_puts_every_task_back_in_its_initial_state() {
    for initial in [
        [CUprocessState::RUNNING, CUprocessState::RUNNING],
        [CUprocessState::LOCKED, CUprocessState::RUNNING],
        [CUprocessState::RUNNING, CUprocessState::CHECKPOINTED],
    ] {
        let w = world(initial);
        let mut e = new_dump(
            &w,
            EngineConfig {
                leave_running: true,
                ..Default::default()
            },
        );
        let (ret, err) = criu_dump(&w, &mut e);
        assert_eq!(ret, 0, "{initial:?}: {err:?}");
        assert!(err.is_none(), "{initial:?}: {err:?}");
        assert_eq!(
            states(&w),
            vec![initial[0], initial[1], CUprocessState::RUNNING],
            "{initial:?}"
        );
        assert!(!any_thread_running(&w));
    }
}

#[test]
fn an_abandoned_call_is_waited_for_before_the_rollback() {
    // With a timeout, a driver call that times out is abandoned and blocks every later call
    // until it returns (and may then take effect, e.g. a late lock). The rollback settles it
    // first (or gives up on one that never returns), so every task still goes back to how it
    // was found.
    let cfg = || EngineConfig {
        timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let clean = world([CUprocessState::RUNNING; 2]);
    let mut e = new_dump(&clean, cfg());
    assert_eq!(criu_dump(&clean, &mut e).0, 0);
    let names = clean.lock().unwrap().calls.clone();
    for (k, name) in names.iter().enumerate() {
        let backend_call = ["GetRestoreTid", "GetState", "Lock", "Checkpoint"]
            .iter()
            .any(|p| name.starts_with(&format!("{p} ")));
        if !backend_call {
            continue;
        }
        for kind in [FaultKind::Abandoned, FaultKind::Hung] {
            let case = format!("call {k} ({name}): {kind:?}");
            let w = world([CUprocessState::RUNNING; 2]);
            w.lock().unwrap().fault_at = Some((k, kind));
            let mut e = new_dump(&w, cfg());
            let (ret, _) = criu_dump(&w, &mut e);
            assert_eq!(ret, -1, "{case}: the dump must fail");
            let calls = w.lock().unwrap().calls.clone();
            assert_eq!(
                states(&w),
                vec![CUprocessState::RUNNING; 3],
                "{case}: every task back as found (calls: {calls:?})"
            );
            assert!(!any_thread_running(&w), "{case}");
        }
    }
    // A rollback asks once for a bounded wait on abandoned calls (which returns at once when
    // there is none), and never waits before each put-back.
    let w = world([CUprocessState::RUNNING; 2]);
    let lock = names
        .iter()
        .position(|c| c == "Lock 101")
        .expect("a lock call");
    w.lock().unwrap().fault_at = Some((lock, FaultKind::Error));
    let mut e = new_dump(&w, EngineConfig::default());
    let _ = criu_dump(&w, &mut e);
    let calls = w.lock().unwrap().calls.clone();
    assert!(
        calls
            .iter()
            .filter(|c| c.starts_with("Settle"))
            .map(String::as_str)
            .eq(["Settle 500ms", "Settle 0ms"]),
        "{calls:?}"
    );
    assert_eq!(states(&w), vec![CUprocessState::RUNNING; 3]);
}

#[test]
fn a_fault_at_any_step_leaves_every_task_as_found() {
    // One task at a time, and the parallel mode (both checkpoints at the first call).
    for (initial, parallel) in [
        ([CUprocessState::RUNNING, CUprocessState::RUNNING], 1),
        ([CUprocessState::LOCKED, CUprocessState::RUNNING], 1),
        ([CUprocessState::RUNNING, CUprocessState::RUNNING], 2),
        ([CUprocessState::LOCKED, CUprocessState::RUNNING], 2),
    ] {
        let cfg = || EngineConfig {
            parallel,
            ..EngineConfig::default()
        };
        // A clean run tells how many calls a dump makes.
        let clean = world(initial);
        let mut e = new_dump(&clean, cfg());
        assert_eq!(criu_dump(&clean, &mut e).0, 0);
        let names = clean.lock().unwrap().calls.clone();
        assert!(names.len() >= 12, "{names:?}");
        for (k, name) in names.iter().enumerate() {
            for kind in [FaultKind::Error, FaultKind::Timeout, FaultKind::LateSuccess] {
                let case = format!(
                    "parallel {parallel}, initial {initial:?}, fault {kind:?} at call {k} ({})",
                    name
                );
                let w = world(initial);
                w.lock().unwrap().fault_at = Some((k, kind));
                let mut e = new_dump(&w, cfg());
                let (ret, err) = criu_dump(&w, &mut e);
                let restop_fault = name.starts_with("Restop");
                assert_eq!(ret, -1, "{case}: the dump must fail");
                let err = err.expect("an error is reported");
                let msg = Report(&err).to_string();
                assert!(
                    msg.contains("pid 10") || msg.contains("inventory"),
                    "{case}: {msg}"
                );
                if restop_fault {
                    // The thread could not be stopped again, so it cannot be driven through the
                    // ptrace dance either: that task is reported, every other one recovers.
                    let pid: Pid = name.trim_start_matches("Restop ").parse().unwrap();
                    let logs = w.lock().unwrap().logs.clone();
                    assert!(
                        logs.iter().any(
                            |(l, m)| *l == Level::Error && m.contains(&format!("pids [{pid}]"))
                        ),
                        "{case}: the unrecovered task is logged: {logs:?}"
                    );
                    let other = if pid == 100 { 1 } else { 0 };
                    assert_eq!(
                        states(&w)[other],
                        initial[other],
                        "{case}: the other task recovers"
                    );
                    continue;
                }
                assert_eq!(
                    states(&w),
                    vec![initial[0], initial[1], CUprocessState::RUNNING],
                    "{case}: every task back as found (calls: {:?})",
                    w.lock().unwrap().calls
                );
                assert!(
                    !any_thread_running(&w),
                    "{case}: no restore thread left running"
                );
                let errors: Vec<_> = w
                    .lock()
                    .unwrap()
                    .logs
                    .iter()
                    .filter(|(l, m)| *l == Level::Error && m.contains("could not"))
                    .cloned()
                    .collect();
                assert!(errors.is_empty(), "{case}: nothing unrecovered: {errors:?}");
            }
        }
    }
}

#[test]
fn a_fault_during_rollback_is_reported_and_other_tasks_still_recover() {
    let w = world([CUprocessState::RUNNING; 2]);
    // Fail the checkpoint of 101, then fail the first rollback step of 100.
    let mut e = new_dump(&w, EngineConfig::default());
    assert!(e.pause_devices(100).is_ok());
    assert!(e.pause_devices(101).is_ok());
    for pid in [100, 101] {
        w.lock().unwrap().tasks.get_mut(&pid).unwrap().traced = true;
    }
    assert!(e.checkpoint_devices(100).is_ok());
    let n = w.lock().unwrap().calls.len();
    // Call n is CHECKPOINT 101's resume; n+1 its checkpoint.
    w.lock().unwrap().fault_at = Some((n + 1, FaultKind::Error));
    let err = e.checkpoint_devices(101).unwrap_err();
    let msg = Report(&err).to_string();
    assert!(
        msg.starts_with("CHECKPOINT_DEVICES: failed to checkpoint pid 101 via "),
        "{msg}"
    );
    assert!(msg.contains("CUDA_ERROR_UNKNOWN"), "{msg}");
    // Rollback: the settle for abandoned calls, the settle before 100, 100's resume, then its
    // state query fails.
    let n = w.lock().unwrap().calls.len();
    w.lock().unwrap().fault_at = Some((n + 3, FaultKind::Timeout));
    let err = e.dump_finish(-1).unwrap_err();
    assert!(
        matches!(err, EngineError::RollbackIncomplete { ref pids } if pids == &vec![100]),
        "{err}"
    );
    assert_eq!(
        states(&w)[0],
        CUprocessState::CHECKPOINTED,
        "100 could not be recovered"
    );
    assert_eq!(
        states(&w)[1],
        CUprocessState::RUNNING,
        "101 recovered anyway"
    );
    assert!(
        !any_thread_running(&w),
        "threads stopped again even when a step failed"
    );
    let logs = w.lock().unwrap().logs.clone();
    assert!(
        logs.iter()
            .any(|(l, m)| *l == Level::Error && m.contains("pids [100]")),
        "{logs:?}"
    );
    // Finishing twice (DUMP_FINISH then exit) does nothing the second time.
    let calls = w.lock().unwrap().calls.len();
    e.dump_finish(-1).unwrap();
    assert_eq!(w.lock().unwrap().calls.len(), calls);
}

#[test]
fn pause_on_a_failed_process_fails_without_touching_it() {
    let w = world([CUprocessState::FAILED, CUprocessState::RUNNING]);
    let mut e = new_dump(&w, EngineConfig::default());
    let err = e.pause_devices(100).unwrap_err();
    assert!(matches!(err, EngineError::BadState { .. }), "{err}");
    assert!(err.to_string().contains("failed"), "{err}");
}

fn restored_world(initial: [CUprocessState; 2], with_images: bool) -> (Shared, Restore) {
    let w = world(initial);
    let mut e = new_dump(&w, EngineConfig::default());
    assert_eq!(criu_dump(&w, &mut e).0, 0);
    let mut guard = w.lock().unwrap();
    if !with_images {
        guard.images.clear();
    }
    guard.calls.clear();
    for t in guard.tasks.values_mut() {
        t.traced = true; // restored tasks are ptrace-stopped at RESUME_DEVICES_LATE
    }
    drop(guard);
    let pairs = vec![(GpuUuid([1; 16]), GpuUuid([2; 16]))];
    let e = new_restore(
        &w,
        EngineConfig {
            pairs,
            ..Default::default()
        },
    );
    (w, e)
}

#[test]
fn resume_uses_the_task_image_and_restores_the_dump_time_state() {
    let (w, mut e) = restored_world([CUprocessState::RUNNING, CUprocessState::LOCKED], true);
    for pid in PIDS {
        let want = if pid == 102 {
            Outcome::NotMine
        } else {
            Outcome::Handled
        };
        assert_eq!(e.resume_devices_late(pid).unwrap(), want, "pid {pid}");
    }
    assert_eq!(
        states(&w),
        vec![
            CUprocessState::RUNNING,
            CUprocessState::LOCKED,
            CUprocessState::RUNNING
        ]
    );
    let calls = w.lock().unwrap().calls.clone();
    assert_eq!(
        calls,
        vec![
            "Resume 100",
            "Restore 100",
            "Unlock 100",
            "Restop 100",
            "Resume 101",
            "Restore 101",
            "Restop 101",
            "GetRestoreTid 102",
        ],
        "no TID probe for recorded tasks; a task LOCKED at dump time stays locked"
    );
    assert!(!any_thread_running(&w));
    let logs = w.lock().unwrap().logs.clone();
    assert!(
        logs.iter().any(|(_, m)| m == "restore pairs=1"),
        "the device map reaches restore"
    );
}

#[test]
fn resume_without_images_probes_and_assumes_running() {
    let (w, mut e) = restored_world([CUprocessState::RUNNING, CUprocessState::RUNNING], false);
    for pid in PIDS {
        e.resume_devices_late(pid).unwrap();
    }
    assert_eq!(states(&w), vec![CUprocessState::RUNNING; 3]);
    let probes = w
        .lock()
        .unwrap()
        .calls
        .iter()
        .filter(|c| c.starts_with("GetRestoreTid"))
        .count();
    assert_eq!(probes, 3);
}

#[test]
fn resume_leaves_a_task_checkpointed_at_dump_time_alone() {
    let (w, mut e) = restored_world(
        [CUprocessState::CHECKPOINTED, CUprocessState::RUNNING],
        true,
    );
    assert_eq!(e.resume_devices_late(100).unwrap(), Outcome::Handled);
    assert_eq!(states(&w)[0], CUprocessState::CHECKPOINTED);
    assert!(w.lock().unwrap().calls.is_empty());
}

#[test]
fn resume_failures_are_errors_and_the_thread_is_stopped_again() {
    for (k, what) in [(1, "Restore"), (2, "Unlock")] {
        let (w, mut e) = restored_world([CUprocessState::RUNNING; 2], true);
        w.lock().unwrap().fault_at = Some((k, FaultKind::Error));
        let err = e.resume_devices_late(100).unwrap_err();
        let m = Report(&err).to_string();
        assert!(m.starts_with("RESUME_DEVICES_LATE: failed to "), "{m}");
        assert!(m.contains("pid 100"), "{m}");
        assert_eq!(m.matches("pid 100").count(), 1, "the pid once: {m}");
        assert!(m.contains(&what.to_lowercase()), "{m}");
        assert!(!any_thread_running(&w), "{what}: thread stopped again");
    }
    let (w, mut e) = restored_world([CUprocessState::RUNNING; 2], true);
    w.lock().unwrap().images.insert(100, b"garbage".to_vec());
    assert!(matches!(
        e.resume_devices_late(100).unwrap_err(),
        EngineError::ImageFormat { .. }
    ));
    drop(w);
}

#[test]
fn a_recorded_tid_that_no_longer_exists_is_reprobed() {
    let (w, mut e) = restored_world([CUprocessState::RUNNING; 2], true);
    let img = TaskImage::new(100, 9999, CUprocessState::LOCKED);
    w.lock().unwrap().images.insert(100, img.encode());
    e.resume_devices_late(100).unwrap();
    let calls = w.lock().unwrap().calls.clone();
    assert_eq!(calls[0], "GetRestoreTid 100");
    assert_eq!(
        states(&w)[0],
        CUprocessState::LOCKED,
        "the recorded dump-time state still applies"
    );
}

/// A simulated `cuda-checkpoint` over the same world: parses the argv the CLI backend builds,
/// answers like the utility (TID / state word on stdout, the CUresult modulo 256 as exit status),
/// and hangs (times out) on a stopped task whose restore thread is not running.
struct SimCli(Shared);

impl crate::backend::cli::CommandRunner for SimCli {
    fn run(
        &mut self,
        _program: &std::path::Path,
        args: &[String],
        _deadline: Option<Duration>,
    ) -> Result<crate::backend::cli::RunOutput, crate::backend::cli::RunError> {
        use crate::backend::cli::{RunError, RunOutput};
        use crate::backend::ExitInfo;
        let ok = |output: String| {
            Ok(RunOutput {
                status: ExitInfo::Code(0),
                output,
            })
        };
        let fail = |code: CUresult| {
            Ok(RunOutput {
                status: ExitInfo::Code(i32::from(code.exit_status())),
                output: code.to_string(),
            })
        };
        if args == ["-h"] {
            return ok("--action lock|checkpoint|restore|unlock --device-map".into());
        }
        let pid: Pid = args[args.iter().position(|a| a == "--pid").unwrap() + 1]
            .parse()
            .unwrap();
        let mut w = self.0.lock().unwrap();
        w.calls.push(format!("cli {}", args.join(" ")));
        let t = w.tasks.get_mut(&pid).unwrap();
        if args[0] == "--get-restore-tid" {
            return if t.cuda {
                ok(format!("{}\n", t.tid))
            } else {
                fail(CUresult::ERROR_INVALID_VALUE)
            };
        }
        if t.traced && !t.thread_running {
            return Err(RunError::TimedOut(Duration::from_secs(1)));
        }
        let r = match (args[0].as_str(), args[1].as_str()) {
            ("--get-state", _) => return ok(format!("{}\n", t.state)),
            ("--action", "lock") => transition(t, CUprocessState::RUNNING, CUprocessState::LOCKED),
            ("--action", "checkpoint") => {
                transition(t, CUprocessState::LOCKED, CUprocessState::CHECKPOINTED)
            }
            ("--action", "restore") => {
                transition(t, CUprocessState::CHECKPOINTED, CUprocessState::LOCKED)
            }
            ("--action", "unlock") => {
                transition(t, CUprocessState::LOCKED, CUprocessState::RUNNING)
            }
            other => panic!("unexpected argv {other:?}"),
        };
        match r {
            Ok(()) => ok(String::new()),
            Err(code) => fail(code),
        }
    }
}

fn cli_world(n: usize) -> (Shared, Vec<Pid>) {
    let mut w = World::default();
    let pids: Vec<Pid> = (0..n as Pid).map(|i| 1000 + i).collect();
    for &pid in &pids {
        w.tasks.insert(
            pid,
            FakeTask::new(true, CUprocessState::RUNNING, pid + 5000),
        );
    }
    (Arc::new(Mutex::new(w)), pids)
}

fn cli_core(w: &Shared, cfg: EngineConfig) -> Core {
    let cli = crate::backend::cli::Cli::new(
        "/sim/cuda-checkpoint".into(),
        Box::new(SimCli(w.clone())),
        None,
        true,
    );
    Core::new(
        Box::new(cli),
        Box::new(FakeThreads(w.clone())),
        Box::new(FakeHost(w.clone())),
        cfg,
    )
}

fn cli_dump(w: &Shared, cfg: EngineConfig) -> Dump {
    Dump::new(cli_core(w, cfg))
}

fn cli_restore(w: &Shared, cfg: EngineConfig) -> Restore {
    Restore::new(cli_core(w, cfg))
}

#[test]
fn cli_executions_stay_within_4n_plus_1_per_dump_and_2n_plus_1_per_restore() {
    for n in [1usize, 8, 32] {
        let (w, pids) = cli_world(n);
        let mut e = cli_dump(&w, EngineConfig::default());
        let (ret, err) = criu_dump_pids(&w, &mut e, &pids);
        assert_eq!(ret, 0, "{err:?}");
        let dump_runs = e.core().backend().executions().unwrap();
        assert_eq!(
            dump_runs,
            4 * n + 1,
            "N={n}: -h, then tid+state+lock+checkpoint per task"
        );
        assert!(w
            .lock()
            .unwrap()
            .tasks
            .values()
            .all(|t| t.state == CUprocessState::CHECKPOINTED));
        // Restore from the images the dump wrote.
        for t in w.lock().unwrap().tasks.values_mut() {
            t.traced = true;
        }
        let mut e = cli_restore(&w, EngineConfig::default());
        for &pid in &pids {
            assert_eq!(e.resume_devices_late(pid).unwrap(), Outcome::Handled);
        }
        let restore_runs = e.core().backend().executions().unwrap();
        assert_eq!(
            restore_runs,
            2 * n + 1,
            "N={n}: -h, then restore+unlock per task"
        );
        assert!(w
            .lock()
            .unwrap()
            .tasks
            .values()
            .all(|t| t.state == CUprocessState::RUNNING && !t.thread_running));
    }
}

#[test]
fn cli_leave_running_round_trip_and_a_failing_lock_leave_tasks_running() {
    let (w, pids) = cli_world(3);
    let mut e = cli_dump(
        &w,
        EngineConfig {
            leave_running: true,
            ..Default::default()
        },
    );
    assert_eq!(criu_dump_pids(&w, &mut e, &pids).0, 0);
    assert!(w
        .lock()
        .unwrap()
        .tasks
        .values()
        .all(|t| t.state == CUprocessState::RUNNING));
    assert_eq!(
        e.core().backend().executions(),
        Some(1 + 4 * 3 + 3 * 3),
        "rollback: state+restore+unlock per task"
    );
    // A PAUSE failure on the second task (its CUDA state is FAILED) rolls the first back.
    let (w, pids) = cli_world(3);
    let mut e = cli_dump(&w, EngineConfig::default());
    e.pause_devices(pids[0]).unwrap();
    w.lock().unwrap().tasks.get_mut(&pids[0]).unwrap().traced = true;
    w.lock().unwrap().tasks.get_mut(&pids[1]).unwrap().state = CUprocessState::FAILED;
    let err = e.pause_devices(pids[1]).unwrap_err();
    assert!(err.to_string().contains("PAUSE_DEVICES pid 1001"), "{err}");
    e.dump_finish(-1).unwrap();
    assert_eq!(
        w.lock().unwrap().tasks[&pids[0]].state,
        CUprocessState::RUNNING,
        "first task unlocked again"
    );
}

fn lock_calls(w: &Shared) -> Vec<String> {
    w.lock()
        .unwrap()
        .calls
        .iter()
        .filter(|c| c.starts_with("Lock ") || c.starts_with("Unlock "))
        .cloned()
        .collect()
}

#[test]
fn the_lock_ends_before_criu_s_freeze_alarm_fires() {
    let cfg = || EngineConfig {
        timeout: Some(Duration::from_secs(30)),
        criu_timeout: Some(10),
        ..Default::default()
    };
    // Plenty of alarm left: the usual limits.
    let w = world([CUprocessState::RUNNING; 2]);
    w.lock().unwrap().alarm = Some(FreezeAlarm::Armed {
        left: Duration::from_secs(60),
    });
    let mut e = new_dump(&w, cfg());
    e.pause_devices(100).unwrap();
    assert_eq!(
        w.lock().unwrap().lock_limits[0],
        LockLimits::from_timeout(Some(Duration::from_secs(30)))
    );
    // 3 s left of a 10 s alarm with a 30 s plugin timeout: the plugin waits 2 s (the reserve
    // keeps 1 s) and gives the driver 1.6 s (a fifth of the window to report its own timeout).
    let w = world([CUprocessState::RUNNING; 2]);
    w.lock().unwrap().alarm = Some(FreezeAlarm::Armed {
        left: Duration::from_secs(3),
    });
    let mut e = new_dump(&w, cfg());
    e.pause_devices(100).unwrap();
    assert_eq!(
        w.lock().unwrap().lock_limits[0],
        LockLimits {
            driver: Some(Duration::from_millis(1600)),
            wait: Some(Duration::from_secs(2)),
        }
    );
    // A lock that times out within the window (1.5 s left: the driver gets 0.4 s) names CRIU's
    // timeout and how to raise it, and the other task is put back.
    let w = world([CUprocessState::RUNNING; 2]);
    let mut e = new_dump(&w, cfg());
    e.pause_devices(100).unwrap();
    w.lock().unwrap().alarm = Some(FreezeAlarm::Armed {
        left: Duration::from_millis(1500),
    });
    let n = w.lock().unwrap().calls.len();
    w.lock().unwrap().fault_at = Some((n + 2, FaultKind::Timeout));
    let err = e.pause_devices(101).unwrap_err();
    assert_eq!(
        w.lock().unwrap().lock_limits[1],
        LockLimits {
            driver: Some(Duration::from_millis(400)),
            wait: Some(Duration::from_millis(500)),
        }
    );
    let m = err.to_string();
    assert!(matches!(err, EngineError::FreezeTimeout { .. }), "{m}");
    assert!(
        m.contains("pid 101")
            && m.contains("--timeout 10 s")
            && m.contains("1500 ms left")
            && m.contains("criu dump --timeout SECONDS"),
        "{m}"
    );
    // A lock the driver refuses at once is not blamed on the alarm, though the alarm limited it.
    let w2 = world([CUprocessState::RUNNING; 2]);
    w2.lock().unwrap().alarm = Some(FreezeAlarm::Armed {
        left: Duration::from_secs(5),
    });
    w2.lock().unwrap().fault_at = Some((2, FaultKind::Error));
    let err = new_dump(&w2, cfg()).pause_devices(100).unwrap_err();
    assert!(matches!(err, EngineError::Backend { .. }), "{err}");
    e.dump_finish(-1).unwrap();
    assert_eq!(states(&w), vec![CUprocessState::RUNNING; 3]);
}

#[test]
fn no_lock_is_tried_once_the_alarm_fired_or_too_little_is_left() {
    for (alarm, want) in [
        (FreezeAlarm::Expired, "has already expired"),
        (
            FreezeAlarm::Armed {
                left: Duration::from_millis(1050),
            },
            "only 1050 ms are left",
        ),
    ] {
        let w = world([CUprocessState::RUNNING; 2]);
        w.lock().unwrap().alarm = Some(alarm);
        let mut e = new_dump(&w, EngineConfig::default());
        let err = e.pause_devices(100).unwrap_err();
        assert!(err.to_string().contains(want), "{alarm:?}: {err}");
        assert!(lock_calls(&w).is_empty(), "{alarm:?}: never locked");
        e.dump_finish(-1).unwrap();
        assert_eq!(states(&w), vec![CUprocessState::RUNNING; 3]);
    }
    // A host without an alarm (or with none armed) leaves the limits alone.
    for alarm in [FreezeAlarm::Unknown, FreezeAlarm::Disarmed] {
        let w = world([CUprocessState::RUNNING; 2]);
        w.lock().unwrap().alarm = Some(alarm);
        let mut e = new_dump(&w, EngineConfig::default());
        e.pause_devices(100).unwrap();
        assert_eq!(
            w.lock().unwrap().lock_limits[0],
            LockLimits::from_timeout(None)
        );
    }
}

#[test]
fn someone_else_s_lock_is_never_undone() {
    let w = world([CUprocessState::RUNNING; 2]);
    let mut e = new_dump(&w, EngineConfig::default());
    e.pause_devices(100).unwrap();
    w.lock().unwrap().tasks.get_mut(&100).unwrap().traced = true;
    // 101: tid, state, then the lock, which another tool beats.
    let n = w.lock().unwrap().calls.len();
    w.lock().unwrap().fault_at = Some((n + 2, FaultKind::ForeignLock));
    let err = e.pause_devices(101).unwrap_err();
    let m = err.to_string();
    assert!(matches!(err, EngineError::ForeignLock { .. }), "{m}");
    assert!(
        m.contains("another tool locked") && m.contains("CUDA_ERROR_ILLEGAL_STATE"),
        "{m}"
    );
    e.dump_finish(-1).unwrap();
    assert_eq!(
        states(&w),
        vec![
            CUprocessState::RUNNING,
            CUprocessState::LOCKED,
            CUprocessState::RUNNING
        ],
        "ours undone, theirs kept"
    );
    assert_eq!(lock_calls(&w), vec!["Lock 100", "Lock 101", "Unlock 100"]);
}

#[test]
fn a_lock_that_landed_despite_an_error_is_undone_and_logged() {
    let w = world([CUprocessState::RUNNING; 2]);
    let mut e = new_dump(&w, EngineConfig::default());
    // LateSuccess: the lock takes effect but reports a timeout.
    w.lock().unwrap().fault_at = Some((2, FaultKind::LateSuccess));
    e.pause_devices(100).unwrap_err();
    assert_eq!(states(&w)[0], CUprocessState::RUNNING);
    assert_eq!(lock_calls(&w), vec!["Lock 100", "Unlock 100"]);
    let logs = w.lock().unwrap().logs.clone();
    assert!(
        logs.iter()
            .any(|(l, m)| *l == Level::Warn && m.contains("landed after all; unlocked")),
        "{logs:?}"
    );
}

#[test]
fn a_stopped_task_fails_at_once_with_a_word_about_why() {
    let w = world([CUprocessState::RUNNING; 2]);
    w.lock().unwrap().tasks.get_mut(&100).unwrap().stopped = Some('T');
    let mut e = new_dump(&w, EngineConfig::default());
    let err = e.pause_devices(100).unwrap_err();
    let m = err.to_string();
    assert!(
        m.contains("the task is stopped") && m.contains("kill -CONT 100"),
        "{m}"
    );
    assert!(lock_calls(&w).is_empty());
}

#[test]
fn dump_finish_success_then_a_failed_dump_still_rolls_back() {
    let w = world([CUprocessState::RUNNING, CUprocessState::LOCKED]);
    let mut e = new_dump(&w, EngineConfig::default());
    for pid in PIDS {
        e.pause_devices(pid).unwrap();
        w.lock().unwrap().tasks.get_mut(&pid).unwrap().traced = true;
    }
    for pid in PIDS {
        e.checkpoint_devices(pid).unwrap();
    }
    // DUMP_FINISH(0): the tasks stay checkpointed for now.
    e.dump_finish(0).unwrap();
    assert_eq!(states(&w)[0], CUprocessState::CHECKPOINTED);
    // Then something after it fails (another plugin's DUMP_FINISH, a post-dump script), and CRIU
    // calls exit(DUMP, ret != 0) before resuming the tree.
    e.dump_finish(-5).unwrap();
    assert_eq!(
        states(&w),
        vec![
            CUprocessState::RUNNING,
            CUprocessState::LOCKED,
            CUprocessState::RUNNING
        ]
    );
    let logs = w.lock().unwrap().logs.clone();
    assert!(
        logs.iter().any(|(_, m)| m.contains(
            "back to running (the dump failed after DUMP_FINISH reported success): restored, unlocked"
        )),
        "{logs:?}"
    );
    // Once rolled back, nothing more happens.
    let n = w.lock().unwrap().calls.len();
    e.dump_finish(-1).unwrap();
    assert_eq!(w.lock().unwrap().calls.len(), n);
}

#[test]
fn a_task_that_exited_during_the_dump_is_not_reported_as_stuck() {
    let w = world([CUprocessState::RUNNING; 2]);
    let mut e = new_dump(&w, EngineConfig::default());
    for pid in PIDS {
        e.pause_devices(pid).unwrap();
    }
    w.lock().unwrap().tasks.get_mut(&100).unwrap().dead = true;
    e.dump_finish(-1).unwrap();
    let logs = w.lock().unwrap().logs.clone();
    assert!(
        logs.iter()
            .any(|(l, m)| *l == Level::Warn && m.contains("pid 100: the task exited")),
        "{logs:?}"
    );
    assert!(
        !logs.iter().any(|(l, _)| *l == Level::Error),
        "nothing is stuck: {logs:?}"
    );
    assert_eq!(states(&w)[1], CUprocessState::RUNNING);
}

/// The records a restore's `init` reads back from what the dump wrote (as
/// [`crate::session`] does), for the task-list tests.
fn records_from(w: &Shared) -> BTreeMap<Pid, TaskImage> {
    let g = w.lock().unwrap();
    let list = crate::image::TaskList::decode(g.task_list.as_ref().expect("a task list")).unwrap();
    list.pids
        .iter()
        .map(|&p| (p, TaskImage::decode(&g.images[&p], p).unwrap()))
        .collect()
}

fn listed_restore(
    initial: [CUprocessState; 2],
    cfg: impl FnOnce(BTreeMap<Pid, TaskImage>) -> EngineConfig,
) -> (Shared, Restore) {
    let (w, _) = restored_world(initial, true);
    let records = records_from(&w);
    let e = new_restore(&w, cfg(records));
    (w, e)
}

#[test]
fn the_task_list_names_the_cuda_tasks_so_others_are_never_probed() {
    let (w, mut e) = listed_restore([CUprocessState::RUNNING; 2], |r| EngineConfig {
        restore_tasks: Some(r),
        ..Default::default()
    });
    for pid in PIDS {
        e.resume_devices_late(pid).unwrap();
    }
    let calls = w.lock().unwrap().calls.clone();
    assert!(
        !calls.iter().any(|c| c.contains("102")),
        "the CPU-only task costs nothing: {calls:?}"
    );
    assert_eq!(states(&w), vec![CUprocessState::RUNNING; 3]);
    e.restore_finish(0);
    assert!(!w
        .lock()
        .unwrap()
        .logs
        .iter()
        .any(|(l, _)| *l == Level::Error));
}

#[test]
fn a_failed_restore_kills_the_task_where_criu_would_release_it_anyway() {
    for (ignored, policy, killed) in [
        (true, RestoreFailure::Kill, true),
        (true, RestoreFailure::Leave, false),
        (false, RestoreFailure::Kill, false),
    ] {
        let case = format!("late errors ignored: {ignored}, {policy}");
        let (w, mut e) = listed_restore([CUprocessState::RUNNING; 2], |r| EngineConfig {
            restore_tasks: Some(r),
            on_restore_failure: policy,
            late_errors_ignored: ignored,
            ..Default::default()
        });
        // 100: resume, then the restore fails.
        w.lock().unwrap().fault_at = Some((1, FaultKind::Error));
        e.resume_devices_late(100).unwrap_err();
        let g = w.lock().unwrap();
        assert_eq!(g.tasks[&100].dead, killed, "{case}");
        assert!(!g.tasks[&100].thread_running, "{case}");
        let logs: Vec<_> = g.logs.iter().map(|(_, m)| m.clone()).collect();
        if killed {
            assert!(
                logs.iter().any(|m| m.contains("killed the task")
                    && m.contains("on-restore-failure=kill")
                    && m.contains("can be retried")),
                "{case}: {logs:?}"
            );
        }
        if ignored && !killed {
            assert!(
                logs.iter().any(|m| m.contains("left checkpointed")
                    && m.contains("cuda-checkpoint --action restore --pid 100")),
                "{case}: {logs:?}"
            );
        }
    }
}

#[test]
fn restore_finish_reports_listed_tasks_criu_never_resumed() {
    let (w, mut e) = listed_restore([CUprocessState::RUNNING; 2], |r| EngineConfig {
        restore_tasks: Some(r),
        ..Default::default()
    });
    e.resume_devices_late(100).unwrap();
    e.restore_finish(0);
    let logs = w.lock().unwrap().logs.clone();
    assert!(
        logs.iter()
            .any(|(l, m)| *l == Level::Error && m.contains("[101]")),
        "{logs:?}"
    );
}

#[test]
fn a_listed_task_without_a_restore_thread_is_an_error_not_someone_else_s() {
    let (w, mut e) = listed_restore([CUprocessState::RUNNING; 2], |r| EngineConfig {
        restore_tasks: Some(r),
        ..Default::default()
    });
    {
        let mut g = w.lock().unwrap();
        let t = g.tasks.get_mut(&100).unwrap();
        t.tid = 4242; // the recorded TID is gone
        t.cuda = false; // and the driver knows no CUDA state
    }
    let err = e.resume_devices_late(100).unwrap_err();
    assert!(
        matches!(err, EngineError::NoRestoreThread { pid: 100 }),
        "{err}"
    );
}

fn nvml_with(gib_per_task: u64) -> crate::nvml::Snapshot {
    crate::nvml::Snapshot {
        gpus: vec![crate::nvml::GpuMemory {
            uuid: abi::GpuUuid([7; 16]),
            total: 141 << 30,
            free: 1 << 30,
            processes: vec![
                (100, Some(gib_per_task << 30)),
                (101, Some(gib_per_task << 30)),
            ],
            mig: Some(false),
        }],
    }
}

#[test]
fn a_tree_that_would_not_fit_in_host_memory_is_refused_before_any_lock() {
    let w = world([CUprocessState::RUNNING; 2]);
    {
        let mut g = w.lock().unwrap();
        g.nvml = Some(nvml_with(40));
        g.mem_available = Some(64 << 30);
    }
    let mut e = new_dump(&w, EngineConfig::default());
    let err = e.pause_devices(100).unwrap_err();
    let m = err.to_string();
    assert!(matches!(err, EngineError::HostTooSmall { .. }), "{m}");
    assert!(
        m.contains("80.0 GiB") && m.contains("64.0 GiB") && m.contains("check-capacity=off"),
        "{m}"
    );
    assert!(lock_calls(&w).is_empty(), "refused before any lock");
    // The check can be turned off; and it runs once per dump.
    let w = world([CUprocessState::RUNNING; 2]);
    {
        let mut g = w.lock().unwrap();
        g.nvml = Some(nvml_with(40));
        g.mem_available = Some(64 << 30);
    }
    let mut e = new_dump(
        &w,
        EngineConfig {
            skip_capacity_check: true,
            ..Default::default()
        },
    );
    assert_eq!(criu_dump(&w, &mut e).0, 0);
    assert_eq!(w.lock().unwrap().nvml_queries, 1);
}

#[test]
fn a_tree_with_a_task_on_a_mig_gpu_is_refused_before_any_lock() {
    for parallel in [1, 4] {
        let w = world([CUprocessState::RUNNING; 2]);
        {
            let mut g = w.lock().unwrap();
            let mut nvml = nvml_with(1);
            let mut mig = nvml.gpus[0].clone();
            mig.uuid = abi::GpuUuid([9; 16]);
            mig.mig = Some(true);
            mig.processes = vec![(101, Some(1 << 30))];
            nvml.gpus.push(mig);
            g.nvml = Some(nvml);
        }
        // Not a capacity check: check-capacity=off does not turn it off.
        let mut e = new_dump(
            &w,
            EngineConfig {
                skip_capacity_check: true,
                parallel,
                ..Default::default()
            },
        );
        let err = e.pause_devices(100).unwrap_err();
        let m = err.to_string();
        assert!(
            matches!(err, EngineError::MigGpu { .. }),
            "{parallel:?}: {m}"
        );
        assert!(
            m.contains("1 task(s) of the tree run on a GPU in MIG mode")
                && m.contains("pid 101 on GPU-09090909-")
                && m.contains("MIG mode")
                && m.contains("before any task is locked"),
            "{parallel:?}: {m}"
        );
        assert!(
            lock_calls(&w).is_empty(),
            "{parallel:?}: refused before any lock"
        );
        assert_eq!(
            crate::error::PluginError::Engine(err).to_errno(),
            -libc::ENODEV
        );
    }
}

#[test]
fn copy_deadlines_grow_with_the_task_s_memory_and_images_record_it() {
    let timeout = Some(Duration::from_secs(10));
    let w = world([CUprocessState::RUNNING; 2]);
    {
        let mut g = w.lock().unwrap();
        g.nvml = Some(nvml_with(80));
        g.mem_available = Some(1 << 40);
    }
    let mut e = new_dump(
        &w,
        EngineConfig {
            timeout,
            ..Default::default()
        },
    );
    assert_eq!(criu_dump(&w, &mut e).0, 0);
    let g = w.lock().unwrap();
    // 80 GiB at 1 GB/s: 10 s + 85.9 s.
    for d in &g.copy_deadlines {
        let d = d.unwrap();
        assert!(
            d > Duration::from_secs(95) && d < Duration::from_secs(97),
            "{d:?}"
        );
    }
    let img = TaskImage::decode(&g.images[&100], 100).unwrap();
    assert_eq!(img.gpu_bytes, vec![(abi::GpuUuid([7; 16]), 80 << 30)]);
    assert!(img.checkpoint_ms.is_some());
    drop(g);
    // Without NVML a copy is bounded by all the GPUs' memory (here one 80 GiB GPU).
    let w = world([CUprocessState::RUNNING; 2]);
    let mut e = new_dump(
        &w,
        EngineConfig {
            timeout,
            min_copy_rate: 8e9,
            ..Default::default()
        },
    );
    assert_eq!(criu_dump(&w, &mut e).0, 0);
    let g = w.lock().unwrap();
    let d = g.copy_deadlines[0].unwrap();
    assert!(
        d > Duration::from_secs(20) && d < Duration::from_secs(21),
        "{d:?}"
    );
    let logs: Vec<_> = g.logs.iter().map(|(_, m)| m.clone()).collect();
    assert!(
        logs.iter()
            .any(|m| m.contains("the host-memory check is skipped")),
        "{logs:?}"
    );
}

/// Parallel mode: the tree of [`world`] with `n` CUDA tasks (100..) and the CPU-only task last.
fn ahead_world(n: usize) -> (Shared, Vec<Pid>) {
    let mut w = World::default();
    let mut pids: Vec<Pid> = (0..n as Pid).map(|i| 100 + i).collect();
    for &pid in &pids {
        w.tasks
            .insert(pid, FakeTask::new(true, CUprocessState::RUNNING, pid + 50));
    }
    let cpu = 100 + n as Pid;
    w.tasks
        .insert(cpu, FakeTask::new(false, CUprocessState::RUNNING, 0));
    pids.push(cpu);
    (Arc::new(Mutex::new(w)), pids)
}

fn parallel(n: usize) -> EngineConfig {
    EngineConfig {
        parallel: n,
        ..EngineConfig::default()
    }
}

/// The index, in a clean parallel dump of `world`, of the call named `name`.
fn clean_call_index(n: usize, name: &str) -> usize {
    let (w, pids) = ahead_world(n);
    let mut e = new_dump(&w, parallel(4));
    assert_eq!(criu_dump_pids(&w, &mut e, &pids).0, 0);
    let calls = w.lock().unwrap().calls.clone();
    calls.iter().position(|c| c == name).expect(name)
}

#[test]
fn lock_ahead_locks_the_tree_s_cuda_tasks_together_at_the_first_pause() {
    let (w, pids) = ahead_world(2);
    let mut e = new_dump(&w, parallel(4));
    assert_eq!(e.pause_devices(100).unwrap(), Outcome::Handled);
    assert!(
        e.core_mut().take_batch_ran(),
        "the first call locked the tree"
    );
    assert_eq!(w.lock().unwrap().lock_batches, vec![(vec![100, 101], 2)]);
    assert_eq!(
        states(&w),
        [
            CUprocessState::LOCKED,
            CUprocessState::LOCKED,
            CUprocessState::RUNNING
        ]
    );
    let before = w.lock().unwrap().calls.len();
    assert_eq!(e.pause_devices(101).unwrap(), Outcome::Handled);
    assert_eq!(e.pause_devices(102).unwrap(), Outcome::NotMine);
    assert!(!e.core_mut().take_batch_ran());
    assert_eq!(
        w.lock().unwrap().calls.len(),
        before,
        "each later call takes its task's result: no probe, no lock"
    );
    assert!(e.tasks().iter().all(|t| t.locked_by_us));
    // The rest of the dump, and sequential mode never locks ahead.
    let (w, pids2) = ahead_world(2);
    let mut e = new_dump(&w, parallel(4));
    assert_eq!(criu_dump_pids(&w, &mut e, &pids2).0, 0);
    assert_eq!(states(&w)[..2], [CUprocessState::CHECKPOINTED; 2]);
    let (w, _) = ahead_world(2);
    let mut e = new_dump(&w, parallel(1));
    assert_eq!(criu_dump_pids(&w, &mut e, &pids).0, 0);
    assert!(w.lock().unwrap().lock_batches.is_empty());
}

#[test]
fn lock_ahead_leaves_a_foreign_lock_alone_and_reports_it_for_its_own_task() {
    let k = clean_call_index(2, "Lock 101");
    let (w, pids) = ahead_world(2);
    w.lock().unwrap().fault_at = Some((k, FaultKind::ForeignLock));
    let mut e = new_dump(&w, parallel(4));
    let (ret, err) = criu_dump_pids(&w, &mut e, &pids);
    assert_eq!(ret, -1);
    let err = err.unwrap();
    assert!(
        matches!(err, EngineError::ForeignLock { pid: 101, .. }),
        "{err}"
    );
    assert_eq!(
        states(&w),
        [
            CUprocessState::RUNNING,
            CUprocessState::LOCKED,
            CUprocessState::RUNNING
        ],
        "ours undone, theirs kept"
    );
    assert_eq!(lock_calls(&w), ["Lock 100", "Lock 101", "Unlock 100"]);
}

#[test]
fn a_late_lock_ahead_is_undone_and_the_others_still_wait_for_their_calls() {
    let k = clean_call_index(3, "Lock 101");
    let (w, pids) = ahead_world(3);
    w.lock().unwrap().fault_at = Some((k, FaultKind::LateSuccess));
    let mut e = new_dump(&w, parallel(4));
    e.pause_devices(100).unwrap();
    assert_eq!(
        states(&w)[..3],
        [
            CUprocessState::LOCKED,
            CUprocessState::RUNNING,
            CUprocessState::LOCKED
        ],
        "the late lock is undone at once"
    );
    let err = e.pause_devices(101).unwrap_err();
    assert!(
        matches!(err, EngineError::Backend { pid: 101, .. }),
        "{err}"
    );
    // CRIU fails: 102, never paused, is unlocked first, then the rollback puts 100 back.
    e.dump_finish(-1).unwrap();
    assert_eq!(states(&w), vec![CUprocessState::RUNNING; 4]);
    assert_eq!(
        lock_calls(&w),
        [
            "Lock 100",
            "Lock 101",
            "Lock 102",
            "Unlock 101",
            "Unlock 102",
            "Unlock 100"
        ]
    );
    let _ = pids;
}

#[test]
fn a_task_locked_ahead_but_never_paused_is_unlocked_before_the_checkpoints() {
    let (w, _) = ahead_world(2);
    let mut e = new_dump(&w, parallel(4));
    // 101 left the tree after the walk: CRIU pauses and checkpoints 100 and 102 only.
    let (ret, err) = criu_dump_pids(&w, &mut e, &[100, 102]);
    assert_eq!(ret, 0, "{err:?}");
    assert_eq!(
        states(&w),
        [
            CUprocessState::CHECKPOINTED,
            CUprocessState::RUNNING,
            CUprocessState::RUNNING
        ]
    );
    let calls = w.lock().unwrap().calls.clone();
    let unlock = calls.iter().position(|c| c == "Unlock 101").unwrap();
    let checkpoint = calls.iter().position(|c| c == "Checkpoint 100").unwrap();
    assert!(unlock < checkpoint, "{calls:?}");
    let list =
        crate::image::TaskList::decode(&w.lock().unwrap().task_list.clone().unwrap()).unwrap();
    assert_eq!(list.pids, vec![100], "only what CRIU dumped is listed");
}

#[test]
fn lock_ahead_divides_the_freeze_alarm_among_its_rounds_and_blames_it_by_pid() {
    let cfg = || EngineConfig {
        timeout: Some(Duration::from_secs(30)),
        criu_timeout: Some(10),
        parallel: 2,
        ..Default::default()
    };
    // 4 tasks, 2 at a time: two rounds share the 2 s window (3 s left less the reserve).
    let (w, pids) = ahead_world(4);
    w.lock().unwrap().alarm = Some(FreezeAlarm::Armed {
        left: Duration::from_secs(3),
    });
    let mut e = new_dump(&w, cfg());
    e.pause_devices(100).unwrap();
    assert_eq!(
        w.lock().unwrap().lock_batches,
        vec![(pids[..4].to_vec(), 2)]
    );
    assert_eq!(
        w.lock().unwrap().lock_limits,
        vec![
            LockLimits {
                driver: Some(Duration::from_millis(800)),
                wait: Some(Duration::from_secs(1)),
            };
            4
        ]
    );
    // A lock that runs into that limit is a freeze timeout of its own task.
    let k = clean_call_index(4, "Lock 102");
    let (w, pids) = ahead_world(4);
    {
        let mut g = w.lock().unwrap();
        g.alarm = Some(FreezeAlarm::Armed {
            left: Duration::from_millis(1500),
        });
        g.fault_at = Some((k, FaultKind::Timeout));
    }
    let mut e = new_dump(&w, cfg());
    let (ret, err) = criu_dump_pids(&w, &mut e, &pids);
    assert_eq!(ret, -1);
    let err = err.unwrap();
    assert!(
        matches!(err, EngineError::FreezeTimeout { pid: 102, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("--timeout 10 s"), "{err}");
    assert_eq!(states(&w), vec![CUprocessState::RUNNING; 5]);
    // Too little left to share: nothing locked ahead, the first task fails as it would alone.
    let (w, _) = ahead_world(4);
    w.lock().unwrap().alarm = Some(FreezeAlarm::Expired);
    let mut e = new_dump(&w, cfg());
    let err = e.pause_devices(100).unwrap_err();
    assert!(
        matches!(err, EngineError::FreezeTimeout { pid: 100, .. }),
        "{err}"
    );
    assert!(lock_calls(&w).is_empty());
}

/// A lock that the driver gives up at its timeout while the tree's tasks are locked fewer at a
/// time than it has names the likely cause (ranks of a collective, which wait for their peers)
/// and the fix (parallel=auto); one that times out in a batch of every task, or a lock that
/// fails otherwise (or that the plugin stopped waiting for), does not.
#[test]
fn a_lock_timing_out_one_at_a_time_names_a_collective_as_the_likely_cause() {
    use crate::message::Report;
    let hint = "if these tasks are ranks of a collective (NCCL ranks, say), they cannot be locked";
    // Sequential mode, no freeze alarm: the backend's timeout, then the hint.
    let w = world([CUprocessState::RUNNING; 2]);
    let mut e = new_dump(&w, EngineConfig::default());
    e.pause_devices(100).unwrap();
    let n = w.lock().unwrap().calls.len();
    w.lock().unwrap().fault_at = Some((n + 2, FaultKind::NotReady));
    let err = e.pause_devices(101).unwrap_err();
    let m = Report(&err).to_string();
    assert!(
        matches!(
            err,
            EngineError::LockTimeout {
                pid: 101,
                width: 1,
                ..
            }
        ),
        "{m}"
    );
    assert!(
        m.starts_with(
            "PAUSE_DEVICES: failed to lock pid 101 via driver-api: CUDA_ERROR_NOT_READY; "
        ) && m.contains(&format!("{hint} one at a time: "))
            && m.contains("cuda_plugin.parallel=auto"),
        "{m}"
    );
    assert_eq!(
        crate::error::PluginError::from(err).to_errno(),
        -libc::EIO,
        "the errno of the backend's failure"
    );
    // Sequential mode, the lock run into CRIU's freeze alarm: the freeze timeout, then the hint.
    let w = world([CUprocessState::RUNNING; 2]);
    let mut e = new_dump(&w, EngineConfig::default());
    e.pause_devices(100).unwrap();
    w.lock().unwrap().alarm = Some(FreezeAlarm::Armed {
        left: Duration::from_millis(1500),
    });
    let n = w.lock().unwrap().calls.len();
    w.lock().unwrap().fault_at = Some((n + 2, FaultKind::NotReady));
    let err = e.pause_devices(101).unwrap_err();
    let m = err.to_string();
    assert!(
        matches!(
            err,
            EngineError::FreezeTimeout {
                narrow: Some(1),
                ..
            }
        ),
        "{m}"
    );
    assert!(
        m.contains("criu dump --timeout SECONDS") && m.contains(hint),
        "{m}"
    );
    // Sequential mode, a lock that fails otherwise, or that the plugin stopped waiting for (a
    // driver that does not answer): no hint.
    for kind in [FaultKind::Error, FaultKind::Timeout] {
        let w = world([CUprocessState::RUNNING; 2]);
        let mut e = new_dump(&w, EngineConfig::default());
        e.pause_devices(100).unwrap();
        let n = w.lock().unwrap().calls.len();
        w.lock().unwrap().fault_at = Some((n + 2, kind));
        let err = e.pause_devices(101).unwrap_err();
        assert!(
            matches!(err, EngineError::Backend { .. }),
            "{kind:?}: {err}"
        );
        assert!(!Report(&err).to_string().contains(hint), "{kind:?}: {err}");
    }
    // Parallel mode, every task locked at once: a timeout is the backend's, without the hint.
    let k = clean_call_index(4, "Lock 102");
    let (w, pids) = ahead_world(4);
    w.lock().unwrap().fault_at = Some((k, FaultKind::NotReady));
    let mut e = new_dump(&w, parallel(4));
    let err = criu_dump_pids(&w, &mut e, &pids).1.unwrap();
    assert!(
        matches!(err, EngineError::Backend { pid: 102, .. }),
        "{err}"
    );
    assert!(!Report(&err).to_string().contains(hint), "{err}");
    // Parallel mode, 2 at a time of 4: the hint says so.
    let (w, pids) = ahead_world(4);
    let mut e = new_dump(&w, parallel(2));
    assert_eq!(criu_dump_pids(&w, &mut e, &pids).0, 0);
    let k = w
        .lock()
        .unwrap()
        .calls
        .iter()
        .position(|c| c == "Lock 102")
        .unwrap();
    let (w, pids) = ahead_world(4);
    w.lock().unwrap().fault_at = Some((k, FaultKind::NotReady));
    let mut e = new_dump(&w, parallel(2));
    let err = criu_dump_pids(&w, &mut e, &pids).1.unwrap();
    assert!(
        matches!(
            err,
            EngineError::LockTimeout {
                pid: 102,
                width: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains(&format!("{hint} 2 at a time: ")),
        "{err}"
    );
    // The hint's "up to 16 tasks" is parallel=auto's cap.
    assert!(collective_hint(1).contains(&format!(
        "up to {} tasks",
        crate::options::Parallel::AUTO_CAP
    )));
}
