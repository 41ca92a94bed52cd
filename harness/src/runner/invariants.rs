//! A run judged by the plugin's invariants (`[invariants]`, [`crate::scenario::Invariants`]):
//! the last step may succeed or fail, and what must hold afterwards depends on which. The fault
//! sweep ([`crate::sweep`]) is made of such scenarios; its invariants are checked here, by the
//! one executor every scenario runs on.

use super::*;
use crate::scenario::Invariants;

/// How long the plugin's guardian may take to exit after the judged step: it puts back a tree
/// the engine resumed checkpointed, then exits; one still waiting for a hung call is left to its
/// own bound (a later check names it if it is still there).
const GUARDIAN_SETTLE: Duration = Duration::from_secs(5);

/// The judged step, as it ran.
#[derive(Debug, Clone)]
pub(super) struct Judged {
    /// Its index.
    pub(super) index: usize,
    /// `dump` or `restore`.
    pub(super) verb: &'static str,
    /// Exit status 0 within its bound.
    pub(super) ok: bool,
    /// Its log (CRIU's, with the process's own output after it).
    pub(super) log: String,
    /// The engine's hook trace.
    pub(super) trace: String,
}

/// What invariants found: the outcome in one line (`dump failed at PAUSE_DEVICES; t1=running
/// t2=running`, with ` (not reached)` when the fault never fired), whether the fault fired, and
/// every violation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InvariantReport {
    /// The outcome.
    pub outcome: String,
    /// Whether the world's first fault fired (true when the scenario injects none).
    pub fired: bool,
    /// The invariants that did not hold (empty: all held).
    pub violations: Vec<String>,
}

impl Exec<'_> {
    /// Checks the invariants after the judged step; the report is kept in `self.invariants`.
    pub(super) fn check_invariants(&mut self, inv: &Invariants, lib: &Path) -> Result<(), String> {
        let Some(j) = self.judged.clone() else {
            return Err("[invariants]: the judged step did not run".to_owned());
        };
        for pid in guardian_pids(&j.log) {
            let _ = wait_gone(pid, GUARDIAN_SETTLE);
        }
        let fired = self.fault_fired(j.index);
        let mut v: Vec<String> = std::mem::take(&mut self.violations);
        let states = self.cuda_states()?;
        let mut skip = self.exempt(inv, &states);
        let mut outcome = if j.ok {
            format!("{} ok", j.verb)
        } else {
            format!("{} failed at {}", j.verb, failed_at(&j.trace))
        };
        let _ = write!(outcome, "; {}", self.states_text(&states));
        if !fired {
            outcome.push_str(" (not reached)");
        }
        // Someone else's lock is theirs: it must be left in place, and is undone below.
        let foreign = inv
            .foreign_lock
            .as_ref()
            .map(|t| (t.clone(), self.pids[t]))
            .filter(|_| fired);
        if let Some((name, p)) = &foreign {
            let st = states.get(p).map_or("?", String::as_str);
            if st != "locked" {
                v.push(format!(
                    "another tool's lock of {name} was not left alone ({st})"
                ));
            }
            skip.push(*p);
        }
        let named = |v: &mut Vec<String>, this: &Self| {
            if let Some(missing) = this.error_not_named(inv, &j, fired) {
                v.push(missing);
            }
        };
        match (j.verb, j.ok) {
            ("dump", false) => {
                named(&mut v, self);
                // Tasks the rollback reports it could not put back.
                let reported: Vec<i32> = self
                    .pids
                    .values()
                    .copied()
                    .filter(|p| {
                        j.log.lines().any(|l| {
                            l.contains("could not be put back") && l.contains(&p.to_string())
                        })
                    })
                    .collect();
                let mut skip2 = skip.clone();
                skip2.extend(&reported);
                self.check_running_all(&mut v, "after the failed dump", &states, &skip2);
                if !reported.is_empty() {
                    outcome.push_str(" (reported stuck)");
                }
            }
            ("dump", true) => {
                self.check_parked_all(&mut v, "after the dump", &skip);
                for (name, p) in self.cuda_tasks() {
                    let st = states.get(&p).map_or("?", String::as_str);
                    if !skip.contains(&p) && st != "checkpointed" {
                        v.push(format!("the dump succeeded but {name} is {st}"));
                    }
                }
                self.clear_faults()?;
                let restore: Step = toml::from_str("action = \"restore\"\nexpect = \"any\"")
                    .map_err(|e| format!("the fault-free restore step: {e}"))?;
                let i = self.s.steps.len();
                let t = Instant::now();
                let r = self.step(i, &restore, lib);
                self.records.push(StepRecord {
                    name: format!("step {i}: restore (fault-free, after the dump)"),
                    elapsed: t.elapsed(),
                    failure: r.as_ref().err().cloned(),
                    skipped: None,
                });
                let ok = self.last_ok;
                if ok {
                    let st = self.cuda_states()?;
                    self.check_running_all(&mut v, "after a fault-free restore", &st, &skip);
                } else {
                    let trace = std::fs::read_to_string(self.dir.join(format!("step{i}.trace")))
                        .unwrap_or_default();
                    v.push(format!(
                        "the fault-free restore of that dump failed at {}",
                        failed_at(&trace)
                    ));
                }
            }
            ("restore", true) => {
                let not_running: Vec<(String, i32)> = self
                    .cuda_tasks()
                    .into_iter()
                    .filter(|(_, p)| {
                        !skip.contains(p) && states.get(p).map(String::as_str) != Some("running")
                    })
                    .collect();
                if not_running.is_empty() {
                    self.check_running_all(&mut v, "after the restore", &states, &skip);
                } else {
                    // The 4.1 rules: RESUME_DEVICES_LATE errors are only logged.
                    let rules_41 = self.rules_41();
                    for (name, p) in &not_running {
                        let logged = j.log.lines().any(|l| {
                            l.contains("RESUME_DEVICES_LATE") && l.contains(&format!("pid {p}"))
                        });
                        if !logged || !rules_41 {
                            v.push(format!(
                                "the restore succeeded but {name} is {}{}",
                                states.get(p).map_or("?", String::as_str),
                                if logged { "" } else { " (no error logged)" }
                            ));
                        }
                    }
                    outcome.push_str(" (logged)");
                    let mut skip2 = skip.clone();
                    skip2.extend(not_running.iter().map(|(_, p)| *p));
                    self.check_running_all(&mut v, "after the restore", &states, &skip2);
                }
            }
            _ => {
                named(&mut v, self);
                self.check_parked_all(&mut v, "after the failed restore", &skip);
                for (name, p) in self.cuda_tasks() {
                    let st = states.get(&p).map_or("?", String::as_str);
                    if !skip.contains(&p) && !["checkpointed", "locked", "running"].contains(&st) {
                        v.push(format!("after the failed restore {name} is {st}"));
                    }
                }
                match self.recover(&skip) {
                    Ok(()) => {
                        let st = self.cuda_states()?;
                        self.check_running_all(
                            &mut v,
                            "recovered after the failed restore",
                            &st,
                            &skip,
                        );
                    }
                    Err(e) => v.push(format!("recovery: {e}")),
                }
            }
        }
        if let Some((name, p)) = foreign.filter(|(_, p)| self.alive(*p)) {
            // Undo the other tool's lock; then its data must be intact.
            self.clear_faults()?;
            self.cuda_checkpoint(p, "unlock")?;
            for (_, verdict) in self.verify_data(&[(name.clone(), p)])? {
                if !verdict.starts_with("PASS") {
                    v.push(format!(
                        "{name} data check after the other tool's unlock: {verdict}"
                    ));
                }
            }
        }
        if let Err(e) = self.check_leftovers() {
            v.push(e.lines().next().unwrap_or_default().to_owned());
        }
        let failed = !v.is_empty();
        let why = v.join("; ");
        self.invariants = Some(InvariantReport {
            outcome,
            fired,
            violations: v,
        });
        if failed {
            Err(format!("{why}\n--- {} log\n{}", j.verb, j.log))
        } else {
            Ok(())
        }
    }

    /// Whether the world's first fault (the one the scenario installs before the judged step)
    /// fired as often as its `nth` asks; true when none is installed.
    fn fault_fired(&self, judged: usize) -> bool {
        let faults = self.s.steps[..judged]
            .iter()
            .rev()
            .find_map(|st| st.world.as_ref()?.get("fault")?.as_array().cloned())
            .or_else(|| {
                self.s
                    .world
                    .as_ref()
                    .and_then(|w| w.get("fault")?.as_array().cloned())
            })
            .unwrap_or_default();
        let Some(first) = faults.first() else {
            return true;
        };
        let nth = first
            .get("nth")
            .and_then(toml::Value::as_integer)
            .unwrap_or(1);
        let Some(w) = &self.world else { return false };
        mock_cuda_world::client::MockWorld::open(w)
            .and_then(|m| m.fault_count(0))
            .is_ok_and(|n| i64::try_from(n).is_ok_and(|n| n >= nth))
    }

    /// The CUDA state of every task, by host pid.
    fn cuda_states(&self) -> Result<BTreeMap<i32, String>, String> {
        let st = self.world_status()?;
        Ok(self
            .pids
            .values()
            .map(|&p| (p, st.state_of(p).name().to_owned()))
            .collect())
    }

    /// The CUDA tasks, in workload order, with their pids.
    fn cuda_tasks(&self) -> Vec<(String, i32)> {
        self.s
            .workload
            .tasks
            .iter()
            .filter(|t| t.cuda)
            .map(|t| (t.name.clone(), self.pids[&t.name]))
            .collect()
    }

    /// Tasks the fault itself took out of the checks: dead, or (a `fail` fault) FAILED.
    fn exempt(&self, inv: &Invariants, states: &BTreeMap<i32, String>) -> Vec<i32> {
        self.pids
            .values()
            .copied()
            .filter(|&p| {
                !self.alive(p) || (inv.may_fail && states.get(&p).is_some_and(|s| s == "failed"))
            })
            .collect()
    }

    fn alive(&self, pid: i32) -> bool {
        let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        Path::new(&format!("/proc/{pid}")).exists() && !matches!(state(pid), 'Z' | 'X' | '?')
    }

    /// `t1=running t2=dead`: every CUDA task's state after the step.
    fn states_text(&self, states: &BTreeMap<i32, String>) -> String {
        self.cuda_tasks()
            .iter()
            .map(|(name, p)| {
                let s = if self.alive(*p) {
                    states.get(p).map_or("?", String::as_str)
                } else {
                    "dead"
                };
                format!("{name}={s}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Whether the host's rules are CRIU 4.1's (RESUME_DEVICES_LATE errors only logged).
    fn rules_41(&self) -> bool {
        match &self.s.host.rules {
            Some(r) => r == "4.1",
            None => matches!(self.s.host.profile.as_str(), "4.1" | "4.2"),
        }
    }

    /// Why the judged step's failure is not reported as it must be: by the plugin, naming the
    /// hook, the pid of the fault's task (a rollback's failure may name the other task) and the
    /// fault's reason; or `None` when it is.
    fn error_not_named(&self, inv: &Invariants, j: &Judged, fired: bool) -> Option<String> {
        let hooks = [
            "PAUSE_DEVICES",
            "CHECKPOINT_DEVICES",
            "RESUME_DEVICES_LATE",
            "dump finish",
        ];
        let pid = inv.task.as_ref().map(|t| self.pids[t]);
        let cli = self.s.pinned_backend() == Some("cuda-checkpoint");
        let reason_in =
            |l: &str| !fired || inv.reason.as_ref().is_none_or(|r| l.contains(r.as_str()));
        let lines: Vec<&str> = j
            .log
            .lines()
            .filter(|l| l.contains("cuda_plugin"))
            .collect();
        let named = lines.iter().any(|l| {
            hooks.iter().any(|h| l.contains(h))
                && (pid.is_none()
                    || !fired
                    || inv.rollback
                    || l.contains(&format!("pid {}", pid.unwrap_or(0))))
                && reason_in(l)
        });
        let init_named = lines
            .iter()
            .any(|l| l.contains("init") && (reason_in(l) || cli));
        // A "no CUDA state" answer for a CUDA task makes the plugin decline it; CRIU's file
        // dump then refuses the task's GPU descriptor and names the task: a clean failure.
        let refused = pid.is_some_and(|p| j.log.contains(&format!("Dump files (pid: {p})")));
        (!named && !init_named && !refused).then(|| {
            format!(
                "the failure is not reported naming step, pid and {}",
                inv.reason.as_deref().unwrap_or("cause")
            )
        })
    }

    /// Running, untraced, with the CUDA state it should have (running; none for a task without
    /// CUDA), its data verified; every task but `skip`.
    fn check_running_all(
        &self,
        v: &mut Vec<String>,
        what: &str,
        states: &BTreeMap<i32, String>,
        skip: &[i32],
    ) {
        let end = Instant::now() + Duration::from_secs(3);
        let mut live = Vec::new();
        for t in &self.s.workload.tasks {
            let p = self.pids[&t.name];
            if skip.contains(&p) {
                continue;
            }
            while crate::pstree::running_untraced(p).is_err() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
            if let Err(e) = crate::pstree::running_untraced(p) {
                v.push(format!("{what}: {} not running untraced ({e})", t.name));
            }
            let want = if t.cuda { "running" } else { "none" };
            let got = states.get(&p).map_or("?", String::as_str);
            if got != want {
                v.push(format!("{what}: {} CUDA state {got}, not {want}", t.name));
            }
            live.push((t.name.clone(), p));
        }
        match self.verify_data(&live) {
            Ok(verdicts) => {
                for (name, verdict) in verdicts {
                    if !verdict.starts_with("PASS") {
                        v.push(format!("{what}: {name} data check: {verdict}"));
                    }
                }
            }
            Err(e) => v.push(format!("{what}: data check: {e}")),
        }
    }

    /// Parked: every thread group-stopped and untraced; every task but `skip`.
    fn check_parked_all(&self, v: &mut Vec<String>, what: &str, skip: &[i32]) {
        let end = Instant::now() + Duration::from_secs(3);
        for t in &self.s.workload.tasks {
            let p = self.pids[&t.name];
            if skip.contains(&p) {
                continue;
            }
            while !parked(p) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
            if !parked(p) {
                v.push(format!(
                    "{what}: {} is not parked ({})",
                    t.name,
                    crate::pstree::running_untraced(p).err().unwrap_or_default()
                ));
            }
        }
    }

    /// The world as the scenario declared it, without faults.
    fn clear_faults(&self) -> Result<(), String> {
        let mut t = self.s.world.clone().unwrap_or_default();
        t.remove("fault");
        let t = self.complete_world(t, false)?;
        self.configure_world(&t)
    }

    /// A fault-free `cuda-checkpoint --action ACTION --pid PID` in the world.
    fn cuda_checkpoint(&self, pid: i32, action: &str) -> Result<(), String> {
        run_checked(
            Command::new(&self.art.cuda_checkpoint)
                .args(["--action", action, "--pid", &pid.to_string()])
                .envs(self.env.iter().map(|(k, v)| (k, v))),
            &format!("cuda-checkpoint --action {action}"),
        )
        .map(drop)
    }

    /// Drives each CUDA task back to running with a fault-free `cuda-checkpoint` after a
    /// SIGCONT to every task.
    fn recover(&self, skip: &[i32]) -> Result<(), String> {
        self.clear_faults()?;
        for &p in self.pids.values() {
            let _ = nix::sys::signal::kill(Pid::from_raw(p), nix::sys::signal::Signal::SIGCONT);
        }
        // A request the failed restore abandoned may still complete: let it, then look.
        std::thread::sleep(Duration::from_millis(100));
        let states = self.cuda_states()?;
        for (_, p) in self.cuda_tasks() {
            if skip.contains(&p) {
                continue;
            }
            let actions: &[&str] = match states.get(&p).map(String::as_str) {
                Some("checkpointed") => &["restore", "unlock"],
                Some("locked") => &["unlock"],
                _ => &[],
            };
            for a in actions {
                self.cuda_checkpoint(p, a)?;
            }
        }
        Ok(())
    }
}

/// Where a step failed, from the engine's hook trace: the first hook (or init) that returned an
/// error (not -ENOTSUP, a plugin declining a task), else `engine` when the engine itself failed.
pub(super) fn failed_at(trace: &str) -> String {
    for l in trace.lines() {
        if let Some(at) = l.find(" -> -").filter(|_| !l.ends_with(" -> -95")) {
            let mut w = l[..at].split_whitespace();
            return match (w.next(), w.next()) {
                (Some("hook"), Some(h)) => h.to_owned(),
                (Some("init"), _) => "init".to_owned(),
                (Some(x), _) => x.to_owned(),
                _ => "?".to_owned(),
            };
        }
    }
    if trace.contains("-> failed") {
        "engine".to_owned()
    } else {
        "?".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failing_hook_comes_from_the_engine_trace() {
        let trace = "load cuda_plugin\ninit cuda_plugin stage=dump -> 0\n\
                     hook PAUSE_DEVICES cuda_plugin pid=1 -> -95\n\
                     hook CHECKPOINT_DEVICES cuda_plugin pid=2 -> -5\n";
        assert_eq!(failed_at(trace), "CHECKPOINT_DEVICES");
        assert_eq!(failed_at("init cuda_plugin stage=restore -> -22\n"), "init");
        assert_eq!(failed_at("dump -> failed\n"), "engine");
        assert_eq!(
            failed_at("hook PAUSE_DEVICES cuda_plugin pid=1 -> -95\n"),
            "?"
        );
    }
}
