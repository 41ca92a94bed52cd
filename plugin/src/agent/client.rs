//! CRIU's side of the helper process: [`Link`] sends calls and notes and waits for answers on
//! the calling thread, with deadlines, so CRIU never gets a thread of the plugin's.

use super::error::{AgentError, Gone};
use super::proto::{self, Call, FinishMode, FromAgent, Reply, ToAgent};
use crate::backend::driver::{DriverCall, DriverExec, DriverReply};
use crate::ffi::agent::{poll, Channel};
use crate::task::Pid;
use crate::worker::CallError;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long CRIU waits for a new helper to say it runs.
pub const HELLO_LIMIT: Duration = Duration::from_secs(5);
/// How long a note (which has no answer) may wait for room in the channel.
const NOTE_LIMIT: Duration = Duration::from_secs(1);
/// How many times a link starts a fresh helper after its helper died, in one CRIU run.
pub const MAX_REVIVALS: u32 = 2;
/// How long a fresh helper may take to load the driver again (its probe) before the link
/// gives up on it.
pub const REVIVE_PROBE_LIMIT: Duration = Duration::from_secs(10);

/// Starts a fresh helper and returns CRIU's end of its channel (see [`Link::revivable`]).
pub type Respawn = Box<dyn Fn() -> Result<Channel, AgentError> + Send + Sync>;

/// What a fresh helper must be told to take over from a dead one: the driver probe it must
/// repeat, the guardian's configuration and the tasks it guards.
#[derive(Debug, Default)]
struct Memo {
    /// The probes' `call_init` (every driver call needs the library loaded).
    probe: Option<bool>,
    /// Whether `cuInit` was called (a restore needs it in the caller).
    init: bool,
    config: Option<proto::GuardConfig>,
    tracked: BTreeMap<Pid, proto::Tracked>,
    revivals: u32,
}

/// A request in flight.
pub type Ticket = u64;

#[derive(Debug)]
struct State {
    chan: Channel,
    agent: Pid,
    next: Ticket,
    /// Calls sent and still to be waited for.
    pending: BTreeSet<Ticket>,
    /// Answers of pending calls that came in while another was waited for.
    replies: BTreeMap<Ticket, Reply>,
    /// Calls abandoned on timeout whose answer has not come, with what they were.
    abandoned: BTreeMap<Ticket, String>,
    /// The calls that change or read a task's checkpoint state (`Call::Driver`): while one of
    /// them is abandoned and blocked, further calls are refused. A blocked GPU enumeration,
    /// NVML query or probe refuses nothing (the dump goes on without what it would have said).
    state_calls: BTreeSet<Ticket>,
    /// Why the helper is gone, once it is.
    gone: Option<Gone>,
    /// Notes that could not be sent (the guardian then knows less; logged once).
    lost_notes: usize,
    buf: Vec<u8>,
    memo: Memo,
}

impl State {
    /// The state of a channel whose other end a new helper holds, once the helper said hello
    /// (at most `limit`).
    fn connect(chan: Channel, limit: Duration) -> Result<State, AgentError> {
        let mut st = State {
            chan,
            agent: 0,
            next: 1,
            pending: BTreeSet::new(),
            replies: BTreeMap::new(),
            abandoned: BTreeMap::new(),
            state_calls: BTreeSet::new(),
            gone: None,
            lost_notes: 0,
            buf: Vec::new(),
            memo: Memo::default(),
        };
        let deadline = Instant::now() + limit;
        while st.agent == 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Some(g) = &st.gone {
                return Err(AgentError::DiedStarting(g.clone()));
            }
            if left.is_zero() {
                return Err(AgentError::NoHello(limit));
            }
            st.pump(Some(left));
        }
        Ok(st)
    }

    /// One call answered within `limit`, with the state already locked (a revival's probe).
    fn call_locked(&mut self, call: Call, limit: Duration) -> Result<Reply, AgentError> {
        let id = self.next;
        self.next += 1;
        self.send(
            &ToAgent::Call {
                id,
                deadline: Some(limit),
                call,
            },
            NOTE_LIMIT,
        )?;
        self.pending.insert(id);
        let deadline = Instant::now() + limit;
        loop {
            if let Some(r) = self.replies.remove(&id) {
                self.pending.remove(&id);
                return Ok(r);
            }
            if let Some(g) = &self.gone {
                return Err(AgentError::Gone(g.clone()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.pending.remove(&id);
                return Err(AgentError::NoAnswer(limit));
            }
            self.pump(Some(left));
        }
    }

    /// Remembers what a fresh helper must be told (see [`Memo`]).
    fn remember(&mut self, msg: &ToAgent) {
        match msg {
            ToAgent::Configure(c) => self.memo.config = Some(c.clone()),
            ToAgent::Track(t) => {
                self.memo.tracked.insert(t.pid, t.clone());
            }
            ToAgent::Untrack { pid } => {
                self.memo.tracked.remove(pid);
            }
            ToAgent::Call {
                call: Call::Probe { call_init },
                ..
            } => {
                let first = self.memo.probe.get_or_insert(*call_init);
                *first |= *call_init;
            }
            ToAgent::Call {
                call: Call::Driver(DriverCall::Init),
                ..
            } => self.memo.init = true,
            _ => {}
        }
    }

    /// Reads every queued message; with `wait`, first waits up to that long for one.
    fn pump(&mut self, wait: Option<Duration>) {
        if self.gone.is_some() {
            return;
        }
        if let Some(w) = wait {
            if let Err(e) = poll(&[(self.chan.fd(), libc::POLLIN)], Some(w)) {
                self.gone = Some(Gone::Wait(std::sync::Arc::new(e)));
                return;
            }
        }
        loop {
            let mut buf = std::mem::take(&mut self.buf);
            let got = self.chan.try_recv(&mut buf);
            let msg = match got {
                Ok(None) => {
                    self.buf = buf;
                    return;
                }
                Ok(Some(())) => proto::decode::<FromAgent>(&buf),
                Err(e) => {
                    self.buf = buf;
                    self.gone = Some(Gone::from_io(e, &[io::ErrorKind::UnexpectedEof]));
                    return;
                }
            };
            self.buf = buf;
            match msg {
                Ok(FromAgent::Reply { id, reply }) => {
                    if self.pending.contains(&id) {
                        self.replies.insert(id, reply);
                    } else {
                        // The late answer of an abandoned call (or of one given up on).
                        self.abandoned.remove(&id);
                        self.state_calls.remove(&id);
                    }
                }
                Ok(FromAgent::Hello { pid }) => self.agent = pid,
                Ok(FromAgent::Log { level, msg }) => crate::ffi::log::log(level, &msg),
                Err(e) => {
                    self.gone = Some(Gone::Undecodable(e));
                    return;
                }
            }
        }
    }

    fn send(&mut self, msg: &ToAgent, limit: Duration) -> Result<(), AgentError> {
        if let Some(g) = &self.gone {
            return Err(AgentError::Gone(g.clone()));
        }
        self.chan.send(&proto::encode(msg), limit).map_err(|e| {
            AgentError::Gone(Gone::from_io(
                e,
                &[io::ErrorKind::BrokenPipe, io::ErrorKind::ConnectionReset],
            ))
        })
    }
}

/// How long [`Link::finish`] waits for the helper to exit.
pub const FINISH_LIMIT: Duration = Duration::from_secs(2);

/// The plugin's end of the channel to its helper process.
pub struct Link {
    state: Mutex<State>,
    respawn: Option<Respawn>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("state", &self.state)
            .field("revivable", &self.respawn.is_some())
            .finish()
    }
}

impl Link {
    /// Wraps CRIU's end of a channel whose other end a new helper holds, and waits (at most
    /// `limit`) for the helper's hello.
    pub fn connect(chan: Channel, limit: Duration) -> Result<Link, AgentError> {
        Ok(Link {
            state: Mutex::new(State::connect(chan, limit)?),
            respawn: None,
        })
    }

    /// This link starts a fresh helper with `respawn` when its helper died and a call is still
    /// to be made (the rollback's, above all), at most [`MAX_REVIVALS`] times in a run; the
    /// fresh helper repeats the driver probe and is told the guardian's configuration and the
    /// tasks it guards. The copier's link is not revivable: its death is how a failed job's
    /// operation is aborted.
    #[must_use]
    pub fn revivable(mut self, respawn: Respawn) -> Link {
        self.respawn = Some(respawn);
        self
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces a dead helper with a fresh one (see [`Link::revivable`]); the error says why
    /// that was not possible, the dead helper's reason first.
    fn revive(&self, st: &mut State) -> Result<(), AgentError> {
        let Some(why) = st.gone.clone() else {
            return Ok(());
        };
        let Some(respawn) = &self.respawn else {
            return Err(AgentError::Gone(why));
        };
        if st.memo.revivals >= MAX_REVIVALS {
            return Err(AgentError::RevivalsSpent {
                why,
                max: MAX_REVIVALS,
            });
        }
        st.memo.revivals += 1;
        let started = Instant::now();
        let old = st.agent;
        let fresh = respawn()
            .and_then(|chan| State::connect(chan, HELLO_LIMIT))
            .map_err(|e| AgentError::NoTakeover {
                why: why.clone(),
                cause: Box::new(e),
            })?;
        let memo = std::mem::take(&mut st.memo);
        let next = st.next;
        *st = fresh;
        st.next = next;
        st.memo = memo;
        if let Some(call_init) = st.memo.probe {
            let loaded = match st.call_locked(Call::Probe { call_init }, REVIVE_PROBE_LIMIT) {
                Ok(Reply::Probe(proto::ProbeReply::Supported { .. })) => Ok(()),
                Ok(other) => Err(AgentError::UnexpectedReply(Box::new(other))),
                Err(e) => Err(e),
            };
            loaded.map_err(|e| AgentError::FreshProbe {
                why: why.clone(),
                pid: st.agent,
                cause: Box::new(e),
            })?;
        }
        if st.memo.init {
            let init = match st.call_locked(Call::Driver(DriverCall::Init), REVIVE_PROBE_LIMIT) {
                Ok(Reply::Driver(DriverReply::Code(0))) => Ok(()),
                Ok(other) => Err(AgentError::UnexpectedReply(Box::new(other))),
                Err(e) => Err(e),
            };
            init.map_err(|e| AgentError::FreshInit {
                why: why.clone(),
                pid: st.agent,
                cause: Box::new(e),
            })?;
        }
        let mut notes: Vec<ToAgent> = st
            .memo
            .config
            .clone()
            .map(ToAgent::Configure)
            .into_iter()
            .collect();
        notes.extend(st.memo.tracked.values().cloned().map(ToAgent::Track));
        for n in &notes {
            st.send(n, NOTE_LIMIT).map_err(|e| AgentError::FreshNotes {
                why: why.clone(),
                pid: st.agent,
                cause: Box::new(e),
            })?;
        }
        // The same start line as the first helper's (tools that follow the helpers key on it).
        crate::ffi::log::log(
            crate::ffi::log::Level::Debug.criu(),
            &format!("helper process {} started", st.agent),
        );
        crate::ffi::log::log(
            crate::ffi::log::Level::Warn.criu(),
            &format!(
                "helper process {old} is gone ({why}); helper process {} took over for the rest \
                 of this run (driver loaded, {} task(s) guarded) in {:.1} ms (bounds: {} to \
                 start, {} to load the driver)",
                st.agent,
                st.memo.tracked.len(),
                started.elapsed().as_secs_f64() * 1e3,
                crate::message::Span(HELLO_LIMIT),
                crate::message::Span(REVIVE_PROBE_LIMIT),
            ),
        );
        Ok(())
    }

    /// The helper's pid.
    #[must_use]
    pub fn agent_pid(&self) -> Pid {
        self.st().agent
    }

    /// Why the helper is gone, if it is.
    #[must_use]
    pub fn gone(&self) -> Option<Gone> {
        let mut st = self.st();
        st.pump(None);
        st.gone.clone()
    }

    /// Sends `call` without waiting for its answer; refused while an abandoned driver call (see
    /// `state_calls`) is blocked.
    pub fn submit(&self, call: Call, deadline: Option<Duration>) -> Result<Ticket, CallError> {
        let mut st = self.st();
        st.pump(None);
        if st.gone.is_some() {
            self.revive(&mut st)
                .map_err(|e| CallError::Lost(e.to_string()))?;
        }
        let state = &st.state_calls;
        if let Some((_, blocked)) = st.abandoned.iter().find(|(id, _)| state.contains(id)) {
            return Err(CallError::Busy {
                blocked: blocked.clone(),
            });
        }
        let id = st.next;
        st.next += 1;
        if matches!(call, Call::Driver(_)) {
            st.state_calls.insert(id);
        }
        let msg = ToAgent::Call { id, deadline, call };
        st.remember(&msg);
        st.send(&msg, NOTE_LIMIT)
            .map_err(|e| CallError::Lost(e.to_string()))?;
        st.pending.insert(id);
        Ok(id)
    }

    /// Waits at most `deadline` (`None`: until it comes) for the answer to `id`. On timeout the
    /// call is abandoned: further calls are refused until its answer comes or [`Link::settle`]
    /// gives up on it.
    pub fn wait(
        &self,
        id: Ticket,
        what: &str,
        deadline: Option<Duration>,
    ) -> Result<Reply, CallError> {
        self.wait_since(id, what, deadline, Instant::now())
    }

    /// [`Link::wait`] with the deadline counted from `started` (when the call was submitted),
    /// for calls of a batch that were waited for one after another.
    pub(crate) fn wait_since(
        &self,
        id: Ticket,
        what: &str,
        deadline: Option<Duration>,
        started: Instant,
    ) -> Result<Reply, CallError> {
        let mut st = self.st();
        loop {
            if let Some(r) = st.replies.remove(&id) {
                st.pending.remove(&id);
                st.state_calls.remove(&id);
                return match r {
                    Reply::Panicked => Err(CallError::Panicked),
                    r => Ok(r),
                };
            }
            if let Some(g) = st.gone.clone() {
                st.pending.remove(&id);
                st.state_calls.remove(&id);
                return Err(CallError::Lost(g.to_string()));
            }
            let left = match deadline {
                Some(d) => {
                    let left = d.saturating_sub(started.elapsed());
                    if left.is_zero() {
                        st.pending.remove(&id);
                        st.abandoned.insert(id, what.to_owned());
                        // Should it still land, the helper undoes it (see ToAgent::Abandon).
                        if st.send(&ToAgent::Abandon { id }, NOTE_LIMIT).is_err() {
                            st.lost_notes += 1;
                        }
                        return Err(CallError::TimedOut { after: d });
                    }
                    Some(left)
                }
                None => None,
            };
            st.pump(Some(left.unwrap_or(Duration::from_secs(3600))));
        }
    }

    /// Sends `call` and waits for its answer (see [`Link::submit`], [`Link::wait`]).
    pub fn call(
        &self,
        what: &str,
        call: Call,
        deadline: Option<Duration>,
    ) -> Result<Reply, CallError> {
        let id = self.submit(call, deadline)?;
        self.wait(id, what, deadline)
    }

    /// Sends a note (no answer). A note that cannot be sent is counted, and the count is in
    /// the error.
    pub fn note(&self, msg: &ToAgent) -> Result<(), AgentError> {
        let mut st = self.st();
        st.pump(None);
        st.remember(msg);
        let r = st.send(msg, NOTE_LIMIT);
        if r.is_err() {
            st.lost_notes += 1;
        }
        r
    }

    /// The plugin's last word: the helper exits (or, with [`FinishMode::WatchTasks`], watches
    /// the tasks until CRIU has exited).
    ///
    /// With [`FinishMode::Done`] it waits, at most [`FINISH_LIMIT`], for the helper to exit
    /// (its end of the channel closes), so that CRIU does not return with the helper still
    /// running; a call still blocked in the driver does not hold the helper up.
    pub fn finish(&self, mode: FinishMode) -> Result<(), AgentError> {
        self.note(&ToAgent::Finish(mode))?;
        if mode != FinishMode::Done {
            return Ok(());
        }
        let deadline = Instant::now() + FINISH_LIMIT;
        let mut st = self.st();
        loop {
            st.pump(None);
            if st.gone.is_some() {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(AgentError::NoExit(FINISH_LIMIT));
            }
            st.pump(Some(left));
        }
    }
}

fn driver_reply(r: Reply) -> Result<DriverReply, CallError> {
    match r {
        Reply::Driver(r) => Ok(r),
        other => Err(CallError::Lost(format!(
            "it answered {other:?} to a driver call"
        ))),
    }
}

impl DriverExec for Link {
    fn exec(
        &self,
        what: &str,
        call: DriverCall,
        deadline: Option<Duration>,
    ) -> Result<DriverReply, CallError> {
        driver_reply(self.call(what, Call::Driver(call), deadline)?)
    }

    /// Keeps up to `width` calls in flight in the helper (which runs each on a thread of its
    /// own), submitting the next as the oldest is answered; each call's deadline counts from
    /// its own submission. A call abandoned on timeout makes the calls not yet submitted fail
    /// as busy (the rule of [`Link::submit`]); those already in flight go on.
    fn exec_many(
        &self,
        calls: Vec<(String, DriverCall, Option<Duration>)>,
        width: usize,
    ) -> Vec<Result<DriverReply, CallError>> {
        let width = width.max(1);
        let mut out: Vec<Option<Result<DriverReply, CallError>>> =
            std::iter::repeat_with(|| None).take(calls.len()).collect();
        let mut flight: std::collections::VecDeque<(
            usize,
            String,
            Option<Duration>,
            Ticket,
            Instant,
        )> = std::collections::VecDeque::new();
        let mut todo = calls.into_iter().enumerate();
        loop {
            while flight.len() < width {
                let Some((i, (what, call, deadline))) = todo.next() else {
                    break;
                };
                let started = Instant::now();
                match self.submit(Call::Driver(call), deadline) {
                    Ok(id) => flight.push_back((i, what, deadline, id, started)),
                    Err(e) => out[i] = Some(Err(e)),
                }
            }
            let Some((i, what, deadline, id, started)) = flight.pop_front() else {
                break;
            };
            out[i] = Some(
                self.wait_since(id, &what, deadline, started)
                    .and_then(driver_reply),
            );
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(CallError::Lost("never submitted".to_owned()))))
            .collect()
    }

    fn blocked(&self) -> Option<String> {
        let mut st = self.st();
        st.pump(None);
        st.abandoned.values().next().cloned()
    }

    fn settle(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut st = self.st();
        loop {
            st.pump(None);
            if st.abandoned.is_empty() {
                return true;
            }
            if st.gone.is_some() {
                st.abandoned.clear();
                let State {
                    state_calls,
                    pending,
                    ..
                } = &mut *st;
                state_calls.retain(|id| pending.contains(id));
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Stop waiting: later calls are no longer refused because of them; their late
                // answers are dropped when they come.
                st.abandoned.clear();
                let State {
                    state_calls,
                    pending,
                    ..
                } = &mut *st;
                state_calls.retain(|id| pending.contains(id));
                return false;
            }
            st.pump(Some(left));
        }
    }
}

/// The engine's notes reach the guardian through the link.
#[derive(Debug)]
pub struct LinkGuard(pub std::sync::Arc<Link>);

impl crate::agent::Guard for LinkGuard {
    fn track(
        &self,
        pid: Pid,
        target: abi::CUprocessState,
        bytes: Option<u64>,
        pairs: &[crate::backend::GpuPair],
    ) -> Result<(), AgentError> {
        self.0.note(&ToAgent::Track(proto::Tracked {
            pid,
            target: target.0,
            bytes,
            pairs: pairs.iter().map(|(a, b)| (a.0, b.0)).collect(),
        }))
    }

    fn intent(&self, pid: Pid, op: crate::backend::Op) -> Result<(), AgentError> {
        self.0.note(&ToAgent::Intent {
            pid,
            op: op.to_string(),
        })
    }

    fn untrack(&self, pid: Pid) -> Result<(), AgentError> {
        self.0.note(&ToAgent::Untrack { pid })
    }
}
