//! The helper's side: answer calls (each on a thread of its own), keep the guardian's ledger,
//! and notice CRIU's end.

use super::calls::{lock, wait_late_calls, Driver, InFlight};
use super::guardian::{self, Ledger};
use crate::agent::proto::{self, Call, FinishMode, FromAgent, ProbeReply, Reply, ToAgent, WireGpu};
use crate::backend::driver::{probe_driver, CudaDriver, DriverCall, DriverProbe, DriverReply};
use crate::ffi::agent::{poll, Channel};
use crate::task::Pid;
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// How long the helper waits for room in CRIU's queue before dropping an answer (CRIU then
/// times the call out).
const REPLY_LIMIT: Duration = Duration::from_secs(5);

/// The image directory, once the helper runs (a custom-storage copier writes and reads its
/// files there; the descriptor lives as long as the helper).
static IMAGE_DIR: OnceLock<std::os::fd::RawFd> = OnceLock::new();

/// The helper's channel, once it runs: log lines of code running in the helper go to CRIU's log
/// through it (see [`forward_log`]).
static SINK: OnceLock<Arc<Channel>> = OnceLock::new();

/// In the helper process: sends a log line to CRIU, which logs it as its own (the helper
/// registers this as the log's forward, [`crate::ffi::log::forward_to`]). Outside the helper
/// there is no channel, and the line is dropped.
pub fn forward_log(level: u32, msg: &str) {
    let Some(chan) = SINK.get() else {
        return;
    };
    let _ = chan.send(
        &proto::encode(&FromAgent::Log {
            level,
            msg: msg.to_owned(),
        }),
        REPLY_LIMIT,
    );
}

/// Calls in flight that CRIU stopped waiting for ([`ToAgent::Abandon`]).
type GivenUp = Arc<Mutex<BTreeSet<u64>>>;

/// At dump: each guarded task's dump-start state (`CUprocessState`), as the plugin's notes say
/// ([`ToAgent::Track`]); empty at restore. A rollback's restore that CRIU gave up on and that
/// lands late is finished with it (see [`undo_late_success`]).
type DumpTargets = Arc<Mutex<BTreeMap<Pid, u32>>>;

/// The helper's main loop; returns its exit status.
pub fn serve(
    chan: Channel,
    criu: Option<OwnedFd>,
    image_dir: Option<OwnedFd>,
    criu_pid: Pid,
) -> i32 {
    let chan = Arc::new(chan);
    let _ = SINK.set(Arc::clone(&chan));
    if let Some(d) = &image_dir {
        let _ = IMAGE_DIR.set(std::os::fd::AsRawFd::as_raw_fd(d));
    }
    crate::ffi::log::forward_to(forward_log);
    let me = Pid::try_from(std::process::id()).unwrap_or(0);
    if chan
        .send(&proto::encode(&FromAgent::Hello { pid: me }), REPLY_LIMIT)
        .is_err()
    {
        return 1;
    }
    let inflight: InFlight = Arc::default();
    let given_up: GivenUp = Arc::default();
    let targets: DumpTargets = Arc::default();
    let driver: Driver = Arc::default();
    let mut ledger = Ledger::default();
    let mut finish = None;
    let mut buf = Vec::new();
    loop {
        let mut fds = vec![(chan.fd(), libc::POLLIN)];
        if let Some(p) = &criu {
            fds.push((p.as_fd(), libc::POLLIN));
        }
        let ready = match poll(&fds, None) {
            Ok(r) => r,
            Err(_) => break,
        };
        let mut closed = false;
        loop {
            match chan.try_recv(&mut buf) {
                Ok(Some(())) => match proto::decode::<ToAgent>(&buf) {
                    Ok(ToAgent::Call { id, deadline, call }) => start_call(
                        &chan,
                        &inflight,
                        (&given_up, &targets),
                        &driver,
                        id,
                        deadline,
                        call,
                    ),
                    Ok(ToAgent::Abandon { id }) => {
                        if lock(&inflight).contains_key(&id) {
                            lock(&given_up).insert(id);
                        }
                    }
                    Ok(ToAgent::Finish(FinishMode::Done)) => {
                        return finish_late_calls(&chan, &inflight);
                    }
                    Ok(ToAgent::Finish(mode)) => finish = Some(mode),
                    Ok(note) => {
                        note_target(&targets, &ledger, &note);
                        ledger.apply(note);
                    }
                    Err(e) => ledger.note_error(e.to_string()),
                },
                Ok(None) => break,
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        let criu_exited = ready.get(1).is_some_and(|r| *r != 0);
        if closed || criu_exited {
            break;
        }
    }
    guardian::after_criu(guardian::Ending {
        ledger,
        finish,
        inflight,
        driver,
        image_dir,
        criu_pid,
        criu_pidfd: criu,
    })
}

/// Keeps [`DumpTargets`] in step with the notes (a dump's only: the ledger's configuration says
/// which stage this is, and comes first).
fn note_target(targets: &DumpTargets, ledger: &Ledger, note: &ToAgent) {
    let dump = match note {
        ToAgent::Configure(c) => c.stage == proto::GuardStage::Dump,
        _ => ledger
            .config
            .as_ref()
            .is_some_and(|c| c.stage == proto::GuardStage::Dump),
    };
    match note {
        ToAgent::Track(t) if dump => {
            // The dump-start state does not change once noted.
            lock(targets).entry(t.pid).or_insert(t.target);
        }
        ToAgent::Untrack { pid } => {
            lock(targets).remove(pid);
        }
        _ => {}
    }
}

/// Told to finish with calls still in flight: closes the channel (CRIU's `exit` returns), waits
/// for them, each at most as long again as CRIU did (at least [`LATE_FLOOR`](super::calls::LATE_FLOOR)) and all within
/// [`LATE_LIMIT`](super::calls::LATE_LIMIT) (so that one
/// CRIU gave up on and that lands late is undone), then exits.
fn finish_late_calls(chan: &Channel, inflight: &InFlight) -> i32 {
    if lock(inflight).is_empty() {
        return 0;
    }
    chan.shutdown();
    wait_late_calls(inflight);
    0
}

/// A call CRIU gave up on has ended. At dump (the task's dump-start state is in
/// [`DumpTargets`]) the task is put back to that state, whatever the call did
/// ([`put_back_late`]). Otherwise a lock or a checkpoint that succeeded is undone: CRIU counted
/// it as failed and its rollback may have seen the task before it landed.
fn undo_late_success(driver: &Driver, call: &Call, reply: &Reply, targets: &DumpTargets) {
    if let Call::Driver(
        DriverCall::Lock { pid, .. }
        | DriverCall::Checkpoint(pid)
        | DriverCall::Restore { pid, .. }
        | DriverCall::Unlock(pid),
    ) = call
    {
        let target = lock(targets).get(pid).copied();
        if let Some(target) = target {
            return put_back_late(driver, *pid, abi::CUprocessState(target), call, reply);
        }
    }
    let (Call::Driver(c), Reply::Driver(DriverReply::Code(0))) = (call, reply) else {
        return;
    };
    let Ok(d) = super::calls::loaded(driver) else {
        return;
    };
    let (pid, undo) = match c {
        DriverCall::Lock { pid, .. } => (*pid, vec![DriverCall::Unlock(*pid)]),
        DriverCall::Checkpoint(pid) => (
            *pid,
            vec![
                DriverCall::Restore {
                    pid: *pid,
                    pairs: Vec::new(),
                },
                DriverCall::Unlock(*pid),
            ],
        ),
        _ => return,
    };
    let what = match c {
        DriverCall::Lock { .. } => "lock",
        _ => "checkpoint",
    };
    carry_out(
        &*d,
        &undo,
        Duration::ZERO,
        &format!("pid {pid}: the {what} CRIU gave up on landed late"),
        ("undoing it", "the helper undid it"),
    );
}

/// Makes `steps` in order, each tried again (every 100 ms, for up to `retry`) while it fails,
/// and says how it went, to CRIU's log and to syslog (CRIU may have exited already): `{head};
/// {done} (restored, unlocked)`, or `{head}; {doing} failed (REPLY after …)` at the first step
/// that kept failing.
fn carry_out(
    d: &dyn CudaDriver,
    steps: &[DriverCall],
    retry: Duration,
    head: &str,
    (doing, done_word): (&str, &str),
) {
    let mut done = Vec::new();
    for step in steps {
        let started = Instant::now();
        let mut r = step.apply(d);
        while r != DriverReply::Code(0) && started.elapsed() < retry {
            std::thread::sleep(Duration::from_millis(100));
            r = step.apply(d);
        }
        if r != DriverReply::Code(0) {
            let msg = format!(
                "{head}; {doing} failed ({r:?} after {})",
                if done.is_empty() {
                    "nothing".to_owned()
                } else {
                    done.join(", ")
                }
            );
            forward_log(crate::ffi::log::Level::Error.criu(), &msg);
            crate::ffi::agent::syslog(true, &msg);
            return;
        }
        done.push(match step {
            DriverCall::Unlock(_) => "unlocked",
            _ => "restored",
        });
    }
    let msg = format!("{head}; {done_word} ({})", done.join(", "));
    forward_log(crate::ffi::log::Level::Info.criu(), &msg);
    crate::ffi::agent::syslog(false, &msg);
}

/// At dump: a task call CRIU gave up on has ended, whatever it returned (a checkpoint that
/// failed late leaves its task LOCKED as surely as one that succeeded leaves it CHECKPOINTED,
/// and CRIU's rollback could not touch the task while the call was in flight). The task is
/// driven from the state it is in now to its dump-start state `target`: restored if
/// checkpointed, then unlocked if it was running.
fn put_back_late(
    driver: &Driver,
    pid: Pid,
    target: abi::CUprocessState,
    call: &Call,
    reply: &Reply,
) {
    use abi::CUprocessState as S;
    let Ok(d) = super::calls::loaded(driver) else {
        return;
    };
    let what = match call {
        Call::Driver(DriverCall::Lock { .. }) => "lock",
        Call::Driver(DriverCall::Checkpoint(_)) => "checkpoint",
        Call::Driver(DriverCall::Restore { .. }) => "restore",
        _ => "unlock",
    };
    let ended = match reply {
        Reply::Driver(DriverReply::Code(0)) => "landed".to_owned(),
        Reply::Driver(DriverReply::Code(c)) => format!("failed ({})", abi::CUresult(*c)),
        other => format!("ended ({other:?})"),
    };
    let mut state = match DriverCall::State(pid).apply(&*d) {
        DriverReply::State(Ok(s)) => S(s),
        _ => return, // gone, or not a CUDA task any more: nothing to put back
    };
    let mut steps = Vec::new();
    if state == S::CHECKPOINTED && target != S::CHECKPOINTED {
        steps.push(DriverCall::Restore {
            pid,
            pairs: Vec::new(),
        });
        state = S::LOCKED;
    }
    if state == S::LOCKED && target == S::RUNNING {
        steps.push(DriverCall::Unlock(pid));
    }
    if steps.is_empty() {
        return;
    }
    // CRIU may still hold the task (its restore thread stopped) for a moment after giving up on
    // the call: each step is tried again until it lets go, within PUT_BACK_LIMIT.
    carry_out(
        &*d,
        &steps,
        PUT_BACK_LIMIT,
        &format!("pid {pid}: the {what} CRIU gave up on {ended} late"),
        ("putting the task back", "the helper put the task back"),
    );
}

/// How long [`put_back_late`] tries a step again while CRIU still holds the task.
const PUT_BACK_LIMIT: Duration = Duration::from_secs(5);

/// The copier's custom-storage jobs: how many run, and whether one has failed.
#[derive(Default)]
struct CustomJobs {
    state: Mutex<(usize, bool)>,
}

impl CustomJobs {
    /// Counts a job in; `false` (not counted) once a job has failed.
    fn start(&self) -> bool {
        let mut s = lock(&self.state);
        if s.1 {
            return false;
        }
        s.0 += 1;
        true
    }

    /// Counts a job out (`started`: it was counted in); whether the copier is to end now: a
    /// job has failed and none is left running.
    fn finish(&self, started: bool, failed: bool) -> bool {
        let mut s = lock(&self.state);
        if started {
            s.0 = s.0.saturating_sub(1);
        }
        s.1 |= failed;
        s.1 && s.0 == 0
    }
}

fn custom_jobs() -> &'static CustomJobs {
    static JOBS: std::sync::OnceLock<CustomJobs> = std::sync::OnceLock::new();
    JOBS.get_or_init(CustomJobs::default)
}

fn start_call(
    chan: &Arc<Channel>,
    inflight: &InFlight,
    (given_up, targets): (&GivenUp, &DumpTargets),
    driver: &Driver,
    id: u64,
    deadline: Option<Duration>,
    call: Call,
) {
    // A deadline past what an Instant can hold is no deadline.
    let until = deadline.and_then(|d| Some((Instant::now().checked_add(d)?, d)));
    lock(inflight).insert(id, until);
    let (chan, inflight, given_up, targets, driver) = (
        Arc::clone(chan),
        Arc::clone(inflight),
        Arc::clone(given_up),
        Arc::clone(targets),
        Arc::clone(driver),
    );
    let custom = matches!(call, Call::Custom(_));
    let work = move || {
        // A custom-storage job after an earlier one failed is not started: the copier is
        // ending (see below) and must not open an operation its exit would abort halfway.
        let refused = custom && !custom_jobs().start();
        let reply = if refused {
            Reply::Custom(Err(
                "not started: an earlier job of this copier failed and it is ending".into(),
            ))
        } else {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&driver, call.clone())))
                .unwrap_or(Reply::Panicked)
        };
        if lock(&given_up).remove(&id) {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                undo_late_success(&driver, &call, &reply, &targets);
            }));
        }
        // A custom-storage job that failed leaves its operation open; the copier ends itself
        // once every answer is out, and the driver aborts what it had open (see
        // crate::cstore). The other jobs in flight run to their end first: each then answers
        // for itself (its task checkpointed with whole files, or restored), so what CRIU rolls
        // back never depends on how far a killed job had got.
        let abort = custom
            && custom_jobs().finish(
                !refused,
                matches!(reply, Reply::Custom(Err(_)) | Reply::Panicked),
            );
        let _ = chan.send(&proto::encode(&FromAgent::Reply { id, reply }), REPLY_LIMIT);
        lock(&inflight).remove(&id);
        if abort {
            crate::ffi::agent::exit_now(3);
        }
    };
    // A thread per call: a call blocked in the driver never holds up another. Should no thread
    // start, the call runs here (CRIU's deadline still bounds its wait).
    let work = std::sync::Arc::new(Mutex::new(Some(work)));
    let w2 = Arc::clone(&work);
    let spawned = std::thread::Builder::new()
        .name("cuda-guardian-call".into())
        .spawn(move || {
            if let Some(f) = w2.lock().unwrap_or_else(PoisonError::into_inner).take() {
                f();
            }
        });
    if spawned.is_err() {
        if let Some(f) = work.lock().unwrap_or_else(PoisonError::into_inner).take() {
            f();
        }
    }
}

fn run(driver: &Driver, call: Call) -> Reply {
    match call {
        Call::Probe { call_init } => Reply::Probe(
            match probe_driver(super::calls::loaded(driver), call_init) {
                DriverProbe::Supported {
                    version,
                    init,
                    custom_storage,
                    ..
                } => ProbeReply::Supported {
                    version,
                    init: init.map(|c| c.0),
                    custom_storage,
                },
                DriverProbe::Unsupported(why) => ProbeReply::Unsupported(why),
                DriverProbe::Error(why) => ProbeReply::Error(why),
            },
        ),
        Call::Driver(c) => Reply::Driver(match super::calls::loaded(driver) {
            Ok(d) => c.apply(&*d),
            // Unreachable after a successful probe; reads as "no CUDA here".
            Err(_) => DriverReply::Code(abi::CUresult::ERROR_NOT_INITIALIZED.0),
        }),
        Call::Gpus => Reply::Gpus(
            crate::ffi::cuda::enumerate_gpus()
                .map(|g| g.iter().map(WireGpu::from).collect())
                .map_err(|e| crate::machine::GpuError::from(e).to_string()),
        ),
        Call::Nvml => Reply::Nvml(
            crate::ffi::nvml::snapshot()
                .map(|s| proto::WireSnapshot::from(&s))
                .map_err(|e| e.to_string()),
        ),
        Call::Custom(job) => {
            Reply::Custom(crate::cstore::copier::run(&job, IMAGE_DIR.get().copied()))
        }
    }
}
