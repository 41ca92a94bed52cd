//! The transcript redactor: pids and tids to task names, paths and durations removed, the
//! driver trace put in an order that does not depend on scheduling.

use super::*;

impl Exec<'_> {
    /// New lines of the world's trace, without the workload's own calls, normalised.
    pub(super) fn take_driver_trace(&mut self) -> Vec<String> {
        let Some(w) = &self.world else {
            return Vec::new();
        };
        let text = std::fs::read_to_string(w.join("trace.log")).unwrap_or_default();
        let new = text.get(self.trace_offset..).unwrap_or("").to_owned();
        self.trace_offset = text.len();
        let tasks: BTreeSet<i32> = self.pids.values().copied().collect();
        // Calls made by others than the workload's tasks, as (caller, program, call): the
        // mock names the calling program in each line. A caller in another pid namespace than
        // the world's host is `<nspid>@pid:[<inode>]`: a task when the runner knows it, else
        // someone else (-1).
        let calls: Vec<(i32, &str, &str)> = new
            .lines()
            .filter_map(|l| {
                let t = mock_cuda_world::trace::parse_line(l)?;
                let pid = match t.caller.parse::<i32>() {
                    Ok(pid) => pid,
                    Err(_) => {
                        let (nspid, ns) = t.caller.split_once("@pid:[")?;
                        let key = (ns.strip_suffix(']')?.parse().ok()?, nspid.parse().ok()?);
                        let task = self.ns_names.get(&key).and_then(|n| self.pids.get(n));
                        task.copied().unwrap_or(-1)
                    }
                };
                Some((pid, t.program, t.entry))
            })
            .filter(|(caller, _, _)| !tasks.contains(caller))
            .collect();
        for (caller, program, _) in &calls {
            if *program == CLI_PROGRAM {
                self.cli_pids.insert(*caller);
            }
        }
        let lines: Vec<(i32, String)> = without_handshakes(&calls)
            .into_iter()
            .map(|(pid, program, call)| {
                (pid, format!("{} {}", label(program), self.normalise(call)))
            })
            .collect();
        let lines = state_polls(copier_calls(lines));
        if self.parallel_mode() {
            order_concurrent(lines, &self.cli_pids)
        } else {
            lines.into_iter().map(|(_, l)| l).collect()
        }
    }

    /// Whether the scenario runs the plugin's parallel mode (the default, `parallel=auto`: its
    /// last `cuda_plugin.parallel=` is not 1), whose concurrent driver calls and
    /// `cuda-checkpoint` runs land in the trace in any order (see [`order_concurrent`]).
    fn parallel_mode(&self) -> bool {
        self.s
            .options
            .iter()
            .rev()
            .find_map(|o| {
                o.trim_start_matches('-')
                    .strip_prefix("cuda_plugin.parallel=")
            })
            .is_none_or(|v| v != "1")
    }

    /// Pids and tids to task names, paths and durations removed.
    pub(super) fn normalise(&self, line: &str) -> String {
        let mut s = line.to_owned();
        for (path, label) in [
            (self.dir.display().to_string(), "<tmp>"),
            (self.art.workspace.display().to_string(), "<workspace>"),
        ] {
            if !path.is_empty() {
                s = s.replace(&path, label);
            }
        }
        for p in [
            &self.art.cuda_checkpoint,
            &self.art.plugin,
            &self.art.mock_lib,
        ] {
            if let Some(parent) = p.parent() {
                s = s.replace(&parent.display().to_string(), "<target>");
            }
        }
        let s = dump_ids(&s);
        let chars: Vec<char> = s.chars().collect();
        let mut out = String::with_capacity(s.len());
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if !c.is_ascii_digit() {
                out.push(c);
                i += 1;
                continue;
            }
            let mut j = i;
            while j < chars.len() && chars[j].is_ascii_digit() {
                j += 1;
            }
            let mut k = j;
            // A decimal with a time unit: a duration.
            if k + 1 < chars.len() && chars[k] == '.' && chars[k + 1].is_ascii_digit() {
                k += 1;
                while k < chars.len() && chars[k].is_ascii_digit() {
                    k += 1;
                }
            }
            let rest: String = chars[k..].iter().take(6).collect();
            let unit = ["ms", " ms", "s", " s", "µs", " µs", " GB/s"]
                .iter()
                .find(|u| {
                    rest.starts_with(*u)
                        && !rest[u.len()..]
                            .chars()
                            .next()
                            .is_some_and(char::is_alphanumeric)
                });
            let num: String = chars[i..j].iter().collect();
            let prev = i.checked_sub(1).map(|p| chars[p]);
            // Part of a word, a version or a UUID; `cuda-plugin-<pid>.img` is a pid.
            let hyphen_after_hex = prev == Some('-') && i >= 2 && chars[i - 2].is_ascii_hexdigit();
            // The integer part of a decimal (`1024.0 GiB`) is never a pid either.
            let decimal =
                chars.get(j) == Some(&'.') && chars.get(j + 1).is_some_and(char::is_ascii_digit);
            let before: String = chars[..i]
                .iter()
                .rev()
                .take(16)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let glued = !cs_file_pid(&before, &chars[j..])
                && (prev.is_some_and(|p| p.is_alphanumeric() || p == '.')
                    || hyphen_after_hex
                    || decimal
                    || chars
                        .get(j)
                        .is_some_and(|n| n.is_alphanumeric() || *n == '-'));
            let lock_timeout = before.ends_with("timeoutMs=") || before.ends_with("--timeout ");
            // Values that are never pids, whatever pid the number happens to equal (pids wrap
            // at 32768 here: a version, a size or a status can be some step's pid).
            let after: String = chars[k..].iter().take(9).collect();
            let value = never_a_pid(&before, &after);
            if k > j && unit.is_some() {
                out.push_str("N.N");
                i = k;
            } else if k == j && (unit == Some(&" ms") || unit == Some(&"ms")) {
                // Whole milliseconds (what is left of CRIU's freeze alarm, say): timing.
                out.push('N');
                i = j;
            } else if let (true, None | Some(&"ms" | &" ms"), Ok(ms)) =
                (lock_timeout, unit, num.parse::<u64>())
            {
                // A lock timeout the freeze alarm shortened depends on timing (how long the
                // freeze and the earlier locks took): keep the configured ones, name the rest.
                if self.lock_timeouts.contains(&ms) {
                    out.push_str(&num);
                } else {
                    out.push_str("<alarm>");
                }
                i = j;
            } else if value {
                out.push_str(&chars[i..k].iter().collect::<String>());
                i = k;
            } else if let (false, Some(name)) = (glued, self.names.get(&num)) {
                out.push_str(name);
                i = j;
            } else if !glued && self.cli_pids.contains(&num.parse().unwrap_or(-1)) {
                out.push_str("cuda-checkpoint");
                i = j;
            } else if let (false, Some(label)) = (glued, self.procs.get(&num.parse().unwrap_or(-1)))
            {
                out.push_str(label);
                i = j;
            } else {
                out.push_str(&chars[i..k].iter().collect::<String>());
                i = k;
            }
        }
        out
    }
}

/// `line` with every dump id (32 lowercase hex digits standing alone, which the custom-storage
/// log lines and images carry: random per dump) as `<dump-id>`.
/// Whether a number, after `before` and followed by `rest`, is the pid of a custom-storage file
/// name, `cuda-cs-<pid>-<n>.img` (glued to its hyphens, yet a pid).
fn cs_file_pid(before: &str, rest: &[char]) -> bool {
    before.ends_with("cuda-cs-")
        && rest.first() == Some(&'-')
        && rest.get(1).is_some_and(char::is_ascii_digit)
}

fn dump_ids(line: &str) -> String {
    let b = line.as_bytes();
    let hex = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < b.len() {
        let start_ok = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        if start_ok && i + 32 <= b.len() && b[i..i + 32].iter().all(|&c| hex(c)) {
            let end_ok = b.get(i + 32).is_none_or(|c| !c.is_ascii_alphanumeric());
            if end_ok {
                out.push_str("<dump-id>");
                i += 32;
                continue;
            }
        }
        let ch = line[i..].chars().next().unwrap_or(' ');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// The custom-storage copier's calls, which its threads (one per GPU, and one job per task in
/// parallel mode) make side by side with addresses that change from run to run: each run of
/// consecutive copier lines becomes the set of its distinct `function = RESULT` pairs, sorted
/// (`copier cuMemcpyDtoHAsync_v2 = CUDA_SUCCESS`). What the copier did, not how often or in
/// which order its threads got there.
fn copier_calls(lines: Vec<(i32, String)>) -> Vec<(i32, String)> {
    let mut out = Vec::with_capacity(lines.len());
    let mut run: BTreeSet<String> = BTreeSet::new();
    let mut pid = 0;
    let flush = |run: &mut BTreeSet<String>, out: &mut Vec<(i32, String)>, pid: i32| {
        out.extend(std::mem::take(run).into_iter().map(|l| (pid, l)));
    };
    for (p, line) in lines {
        if let Some(call) = line.strip_prefix("copier ") {
            let function = call.split('(').next().unwrap_or(call);
            let result = call.rsplit_once(") = ").map_or("", |(_, r)| r);
            run.insert(format!("copier {function} = {result}"));
            pid = p;
        } else {
            flush(&mut run, &mut out, pid);
            out.push((p, line));
        }
    }
    flush(&mut run, &mut out, pid);
    out
}

/// A run of identical consecutive `cuCheckpointProcessGetState` lines (the plugin polling a
/// task, e.g. the dump's rollback waiting for an aborted custom-storage operation to leave
/// CHECKPOINTING) becomes one line: how many polls it took is timing.
fn state_polls(lines: Vec<(i32, String)>) -> Vec<(i32, String)> {
    let mut out: Vec<(i32, String)> = Vec::with_capacity(lines.len());
    for (p, line) in lines {
        let poll = line.contains(" cuCheckpointProcessGetState(");
        if poll && out.last().is_some_and(|(_, l)| *l == line) {
            continue;
        }
        out.push((p, line));
    }
    out
}

/// The name the mock's trace gives a `cuda-checkpoint` run (its process name).
const CLI_PROGRAM: &str = "cuda-checkpoint";

/// How the transcript names the program that made a driver call (the process name the mock's
/// trace records): CRIU, real or emulated (`harness-engine-…`, cut to 15 bytes by the kernel),
/// is `criu`; the plugin's helper process `guardian`, its custom-storage copier `copier`; the
/// utility `cuda-checkpoint`; anyone else `other`.
fn label(program: &str) -> &'static str {
    match program {
        CLI_PROGRAM => "cuda-checkpoint",
        "cuda-guardian" => "guardian",
        "cuda-copier" => "copier",
        p if p == "criu" || p.starts_with("harness-engine") => "criu",
        _ => "other",
    }
}

/// The calls (caller, program, call) a transcript keeps: all but the successful start-up calls
/// ([`is_handshake`]) of the utility's runs that got to their own `cuda-checkpoint(...)` line.
fn without_handshakes<'a>(calls: &[(i32, &'a str, &'a str)]) -> Vec<(i32, &'a str, &'a str)> {
    let finished: BTreeSet<i32> = calls
        .iter()
        .filter(|(_, program, call)| {
            *program == CLI_PROGRAM && call.starts_with("cuda-checkpoint(")
        })
        .map(|(pid, _, _)| *pid)
        .collect();
    calls
        .iter()
        .filter(|(pid, program, call)| {
            !(*program == CLI_PROGRAM && finished.contains(pid) && is_handshake(call))
        })
        .copied()
        .collect()
}

/// Whether a driver call (`<function>(<args>) = <RESULT>`) is one of the `cuda-checkpoint`
/// utility's successful start-up calls (`cuDriverGetVersion`, `cuGetExportTable`, `cuInit`),
/// which every run makes before its action: its `cuda-checkpoint(...)` line and its checkpoint
/// API call say what it did, so the transcript leaves them out of a run that got to that line. A
/// failed start-up call stays (it is behaviour), and so do the start-up calls of a run that
/// never finished: they are all that shows it ran.
fn is_handshake(call: &str) -> bool {
    call.ends_with(") = CUDA_SUCCESS")
        && ["cuDriverGetVersion(", "cuGetExportTable(", "cuInit("]
            .iter()
            .any(|f| call.starts_with(f))
}

/// A normalised plugin log line as the transcript records it: `None` for the per-hook timing
/// lines (`waited N.N ms on …`, `done in N.N ms`) and the copier's per-GPU figures (`custom
/// storage dump pid P gpu N: … in U us`), which say how long, not what; the plugin's
/// version left out of its init line (a version bump changes no behaviour); an exit line
/// without its duration.
pub(super) fn plugin_line(line: &str) -> Option<String> {
    let (_, rest) = line.split_once(": ").unwrap_or(("", line));
    let body = rest.split_once(": ").map_or(rest, |(_, b)| b);
    if body.starts_with("waited N.N ms on ") || body == "done in N.N ms" {
        return None;
    }
    if rest.starts_with("custom storage dump pid ")
        || rest.starts_with("custom storage restore pid ")
    {
        return None;
    }
    let mut out = line.to_owned();
    if let Some(at) = out.find("cuda_plugin: cuda_plugin ") {
        let from = at + "cuda_plugin: ".len();
        let version_end = out[from + "cuda_plugin ".len()..]
            .find(": ")
            .map(|e| from + "cuda_plugin ".len() + e);
        if let Some(end) = version_end {
            let version = &out[from + "cuda_plugin ".len()..end];
            if !version.is_empty() && version.chars().all(|c| c.is_ascii_digit() || c == '.') {
                out.replace_range(from..end + 2, "");
            }
        }
    }
    if let Some(at) = out.find(") after N.N ms") {
        if out[..at].contains("cuda_plugin: exit(") && out.len() == at + ") after N.N ms".len() {
            out.truncate(at + 1);
        }
    }
    Some(out)
}

/// Whether a number between `before` and `after` (the text around it) is a value that is never
/// a pid: a driver version, a size, an exit status, a hook count.
fn never_a_pid(before: &str, after: &str) -> bool {
    [
        "libcuda.so.1 ",
        "version ",
        "status ",
        "exit=",
        "exceeds ",
        "FAULT=",
        "max_hooks ",
    ]
    .iter()
    .any(|p| before.ends_with(p))
        || [" bytes", " MiB", " hooks", " or later", " time(s)"]
            .iter()
            .any(|x| after.starts_with(x))
}

/// The lock timeouts (ms) a scenario configures: `cuda_plugin.timeout=S` options, CRIU's
/// `--timeout` (the plugin's default, 10 s unless a step sets it) and `--timeout MS` arguments
/// of `cuda-checkpoint` steps.
pub(super) fn known_lock_timeouts(s: &Scenario) -> BTreeSet<u64> {
    let mut out = BTreeSet::from([0, 10_000]);
    let opts = s
        .options
        .iter()
        .chain(s.steps.iter().flat_map(|st| &st.options));
    for o in opts {
        if let Some(v) = o.strip_prefix("cuda_plugin.timeout=") {
            if let Ok(secs) = v.parse::<u64>() {
                out.insert(secs * 1000);
            }
        }
    }
    for st in &s.steps {
        if let Some(t) = st.criu_timeout {
            out.insert(u64::from(t) * 1000);
        }
        for w in st.args.windows(2) {
            if w[0] == "--timeout" {
                if let Ok(ms) = w[1].parse::<u64>() {
                    out.insert(ms);
                }
            }
        }
    }
    out
}

/// Puts a parallel-mode driver trace in an order that does not depend on scheduling. Each
/// `cuda-checkpoint` run's lines (`cli` names those processes; an unnamed `other` caller is
/// taken for a run that never finished) become one block, placed where its first line was;
/// any other line is a block of its own. Then every run of consecutive
/// blocks of one kind (the utility's action, or the called function, with the caller) is
/// sorted by its text: calls that ran side by side are listed by task name, while the order
/// of the batch's phases (all checkpoints, then the rollback; all restores, then all unlocks)
/// is kept. A run that never finished goes to the end (see below).
fn order_concurrent(lines: Vec<(i32, String)>, cli: &BTreeSet<i32>) -> Vec<String> {
    let mut blocks: Vec<Vec<String>> = Vec::new();
    let mut at: BTreeMap<i32, usize> = BTreeMap::new();
    for (pid, line) in lines {
        // A utility run's lines, and those of an unknown caller, are one block per process.
        if cli.contains(&pid) || line.starts_with("other ") {
            if let Some(&b) = at.get(&pid) {
                blocks[b].push(line);
                continue;
            }
            at.insert(pid, blocks.len());
        }
        blocks.push(vec![line]);
    }
    // A utility run without its closing `cuda-checkpoint(...)` line (killed on timeout, or
    // its target killed) has no kind of its own: it belongs with its neighbours.
    let kind_of = |b: &[String]| -> Option<String> {
        let head = match b.iter().find(|l| l.contains(" cuda-checkpoint(")) {
            Some(h) => h,
            None if b.len() > 1
                || b[0].starts_with("cuda-checkpoint ")
                || b[0].starts_with("other ") =>
            {
                return None
            }
            None => &b[0],
        };
        let (who, call) = head.split_once(' ').unwrap_or((head, ""));
        let what = match call.strip_prefix("cuda-checkpoint(") {
            Some(args) => args
                .split_whitespace()
                .take_while(|a| *a != "--pid")
                .collect::<Vec<_>>()
                .join(" "),
            None => call.split('(').next().unwrap_or(call).to_owned(),
        };
        Some(format!("{who} {what}"))
    };
    // A run that never got to its own line (hung and killed, or crashed) started among a
    // batch of concurrent runs: whether its first lines came before or after theirs, and
    // whether the batch it belonged to is the one before or after it, is timing (its lines
    // name neither its task nor its action). Such runs go after every finished block (where
    // they sort by their text with the last group), so the transcript is the same on every
    // run; the plugin log says which task's run it was.
    let unfinished = |b: &[String]| {
        (b[0].starts_with("cuda-checkpoint ") || b[0].starts_with("other ")) && kind_of(b).is_none()
    };
    let (done, mut cut): (Vec<Vec<String>>, Vec<Vec<String>>) =
        blocks.into_iter().partition(|b| !unfinished(b));
    cut.sort();
    let mut blocks = done;
    blocks.extend(cut);
    let mut kinds: Vec<Option<String>> = blocks.iter().map(|b| kind_of(b)).collect();
    for i in 1..kinds.len() {
        if kinds[i].is_none() {
            kinds[i] = kinds[i - 1].clone();
        }
    }
    for i in (0..kinds.len().saturating_sub(1)).rev() {
        if kinds[i].is_none() {
            kinds[i] = kinds[i + 1].clone();
        }
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < blocks.len() {
        let k = &kinds[i];
        let mut j = i + 1;
        while j < blocks.len() && kinds[j] == *k {
            j += 1;
        }
        let mut run: Vec<Vec<String>> = blocks[i..j].to_vec();
        run.sort();
        out.extend(run.into_iter().flatten());
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_state_polls_become_one_line() {
        let l = |s: &str| (1, s.to_owned());
        let poll = "guardian cuCheckpointProcessGetState(pid=root) = CUDA_SUCCESS";
        let got = state_polls(vec![
            l(poll),
            l(poll),
            l(poll),
            l("guardian cuCheckpointProcessUnlock(pid=root) = CUDA_SUCCESS"),
            l(poll),
            l("guardian cuCheckpointProcessGetState(pid=g1) = CUDA_SUCCESS"),
            l("guardian cuCheckpointProcessLock(pid=g1, timeoutMs=10) = CUDA_SUCCESS"),
            l("guardian cuCheckpointProcessLock(pid=g1, timeoutMs=10) = CUDA_SUCCESS"),
        ]);
        let got: Vec<&str> = got.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(
            got,
            [
                poll,
                "guardian cuCheckpointProcessUnlock(pid=root) = CUDA_SUCCESS",
                poll,
                "guardian cuCheckpointProcessGetState(pid=g1) = CUDA_SUCCESS",
                "guardian cuCheckpointProcessLock(pid=g1, timeoutMs=10) = CUDA_SUCCESS",
                "guardian cuCheckpointProcessLock(pid=g1, timeoutMs=10) = CUDA_SUCCESS",
            ],
            "only identical consecutive GetState lines collapse"
        );
    }

    #[test]
    fn the_pid_of_a_custom_storage_file_name_is_a_pid() {
        let r = |s: &str| s.chars().collect::<Vec<char>>();
        assert!(cs_file_pid("/fd/11/cuda-cs-", &r("-0.img: at byte 8192")));
        assert!(cs_file_pid("cuda-cs-", &r("-12.img")));
        assert!(
            !cs_file_pid("cuda-cs-", &r(".img")),
            "not the file name's form"
        );
        assert!(
            !cs_file_pid("cuda-cs-4-", &r(".img")),
            "the GPU place, not the pid"
        );
        assert!(!cs_file_pid("cuda-plugin-", &r("-0.img")));
    }

    #[test]
    fn a_run_that_never_closed_sorts_the_same_whether_it_started_first_or_last() {
        let l = |p: i32, s: &str| (p, s.to_owned());
        let cli: BTreeSet<i32> = [10, 11, 12, 13].into_iter().collect();
        let lock = l(
            10,
            "cuda-checkpoint cuda-checkpoint(--action lock --pid g1) = exit=0",
        );
        let hung = l(13, "cuda-checkpoint cuInit(flags=0) = CUDA_SUCCESS");
        let a = l(
            11,
            "cuda-checkpoint cuda-checkpoint(--action checkpoint --pid g1) = exit=0",
        );
        let b = l(
            12,
            "cuda-checkpoint cuda-checkpoint(--action checkpoint --pid g2) = exit=0",
        );
        let after = l(1, "guardian cuInit(flags=0) = CUDA_SUCCESS");
        let first = order_concurrent(
            vec![
                lock.clone(),
                hung.clone(),
                a.clone(),
                b.clone(),
                after.clone(),
            ],
            &cli,
        );
        let last = order_concurrent(vec![lock, a, b, hung, after], &cli);
        assert_eq!(first, last);
        // It goes after every finished block (the batch's phases keep their order), where it
        // sorts by its text with the last group.
        assert_eq!(
            first[1], "cuda-checkpoint cuda-checkpoint(--action checkpoint --pid g1) = exit=0",
            "{first:#?}"
        );
        assert_eq!(
            first[3], "cuda-checkpoint cuInit(flags=0) = CUDA_SUCCESS",
            "{first:#?}"
        );
        assert_eq!(first[4], "guardian cuInit(flags=0) = CUDA_SUCCESS");
    }

    #[test]
    fn concurrent_calls_are_listed_by_task_in_phase_order() {
        let l = |p: i32, s: &str| (p, s.to_owned());
        let cli: BTreeSet<i32> = [10, 11, 12].into_iter().collect();
        // Two utility runs interleaved (12's handshake first), then a guardian's calls.
        let got = order_concurrent(
            vec![
                l(12, "cuda-checkpoint cuInit(flags=0) = CUDA_SUCCESS"),
                l(11, "cuda-checkpoint cuInit(flags=0) = CUDA_SUCCESS"),
                l(
                    11,
                    "cuda-checkpoint cuCheckpointProcessCheckpoint(pid=g1) = CUDA_SUCCESS",
                ),
                l(
                    12,
                    "cuda-checkpoint cuCheckpointProcessCheckpoint(pid=g2) = CUDA_SUCCESS",
                ),
                l(
                    12,
                    "cuda-checkpoint cuda-checkpoint(--action checkpoint --pid g2) = exit=0",
                ),
                l(
                    11,
                    "cuda-checkpoint cuda-checkpoint(--action checkpoint --pid g1) = exit=0",
                ),
                l(
                    10,
                    "cuda-checkpoint cuda-checkpoint(--action restore --pid g1) = exit=0",
                ),
                l(
                    7,
                    "guardian cuCheckpointProcessUnlock(pid=g2) = CUDA_SUCCESS",
                ),
                l(
                    7,
                    "guardian cuCheckpointProcessUnlock(pid=g1) = CUDA_SUCCESS",
                ),
                l(
                    7,
                    "guardian cuCheckpointProcessGetState(pid=g3) = CUDA_SUCCESS",
                ),
                l(
                    7,
                    "guardian cuCheckpointProcessUnlock(pid=g0) = CUDA_SUCCESS",
                ),
            ],
            &cli,
        );
        assert_eq!(
            got,
            vec![
                "cuda-checkpoint cuInit(flags=0) = CUDA_SUCCESS",
                "cuda-checkpoint cuCheckpointProcessCheckpoint(pid=g1) = CUDA_SUCCESS",
                "cuda-checkpoint cuda-checkpoint(--action checkpoint --pid g1) = exit=0",
                "cuda-checkpoint cuInit(flags=0) = CUDA_SUCCESS",
                "cuda-checkpoint cuCheckpointProcessCheckpoint(pid=g2) = CUDA_SUCCESS",
                "cuda-checkpoint cuda-checkpoint(--action checkpoint --pid g2) = exit=0",
                "cuda-checkpoint cuda-checkpoint(--action restore --pid g1) = exit=0",
                "guardian cuCheckpointProcessUnlock(pid=g1) = CUDA_SUCCESS",
                "guardian cuCheckpointProcessUnlock(pid=g2) = CUDA_SUCCESS",
                "guardian cuCheckpointProcessGetState(pid=g3) = CUDA_SUCCESS",
                "guardian cuCheckpointProcessUnlock(pid=g0) = CUDA_SUCCESS",
            ]
        );
    }

    #[test]
    fn a_finished_run_loses_its_start_up_calls_and_an_unfinished_one_keeps_them() {
        let cli = "cuda-checkpoint";
        let calls = [
            (10, cli, "cuDriverGetVersion() = CUDA_SUCCESS"),
            (11, cli, "cuDriverGetVersion() = CUDA_SUCCESS"),
            (10, cli, "cuInit(flags=0) = CUDA_SUCCESS"),
            (11, cli, "cuInit(flags=0) = CUDA_SUCCESS"),
            (
                10,
                cli,
                "cuCheckpointProcessLock(pid=g1, timeoutMs=0) = CUDA_SUCCESS",
            ),
            (10, cli, "cuda-checkpoint(--action lock --pid g1) = exit=0"),
            (12, "cuda-guardian", "cuInit(flags=0) = CUDA_SUCCESS"),
        ];
        assert_eq!(
            without_handshakes(&calls),
            [
                (11, cli, "cuDriverGetVersion() = CUDA_SUCCESS"),
                (11, cli, "cuInit(flags=0) = CUDA_SUCCESS"),
                (
                    10,
                    cli,
                    "cuCheckpointProcessLock(pid=g1, timeoutMs=0) = CUDA_SUCCESS"
                ),
                (10, cli, "cuda-checkpoint(--action lock --pid g1) = exit=0"),
                (12, "cuda-guardian", "cuInit(flags=0) = CUDA_SUCCESS"),
            ]
        );
        assert_eq!(label("harness-engine-"), "criu");
        assert_eq!(label("cuda-guardian"), "guardian");
        assert_eq!(label("mock-world"), "other");
    }

    #[test]
    fn only_successful_start_up_calls_are_handshakes() {
        for folded in [
            "cuDriverGetVersion() = CUDA_SUCCESS",
            "cuGetExportTable(id=GPU-69a28e9f) = CUDA_SUCCESS",
            "cuInit(flags=0) = CUDA_SUCCESS",
        ] {
            assert!(is_handshake(folded), "{folded}");
        }
        for kept in [
            "cuInit(flags=0) = CUDA_ERROR_NO_DEVICE",
            "cuCheckpointProcessLock(pid=root, timeoutMs=0) = CUDA_SUCCESS",
            "cuda-checkpoint(--get-state --pid root) = exit=0",
        ] {
            assert!(!is_handshake(kept), "{kept}");
        }
    }

    #[test]
    fn plugin_lines_keep_what_happened_and_drop_how_long() {
        for dropped in [
            "cuda_plugin: PAUSE_DEVICES pid root: waited N.N ms on cuda-checkpoint, N.N ms on restore-thread control",
            "cuda_plugin: CHECKPOINT_DEVICES pid gpu: done in N.N ms",
        ] {
            assert_eq!(plugin_line(dropped), None, "{dropped}");
        }
        for (line, want) in [
            (
                "cuda_plugin: cuda_plugin 0.2.0: init(dump), max_hooks 12",
                "cuda_plugin: init(dump), max_hooks 12",
            ),
            (
                "cuda_plugin: exit(dump, -1) after N.N ms",
                "cuda_plugin: exit(dump, -1)",
            ),
            (
                "cuda_plugin: CHECKPOINT_DEVICES pid root: deadline N.N s for 0.0 GiB (its GPU memory)",
                "cuda_plugin: CHECKPOINT_DEVICES pid root: deadline N.N s for 0.0 GiB (its GPU memory)",
            ),
            (
                "cuda_plugin: dump finish: waited N.N ms for a timed-out driver call to end",
                "cuda_plugin: dump finish: waited N.N ms for a timed-out driver call to end",
            ),
            (
                "cuda_plugin: cuda_plugin is not loaded: x",
                "cuda_plugin: cuda_plugin is not loaded: x",
            ),
        ] {
            assert_eq!(plugin_line(line).as_deref(), Some(want), "{line}");
        }
    }

    #[test]
    fn versions_sizes_and_statuses_are_never_taken_for_pids() {
        for (before, after) in [
            ("(libcuda.so.1 ", ")"),
            ("cr_plugin_ctl is ", " bytes))"),
            ("GH100, ", " MiB)"),
            ("host has ", " hooks (cr"),
            ("--pid gpu) = exit=", ""),
            ("exited with status ", " (probably"),
            ("needs ", " or later)"),
        ] {
            assert!(never_a_pid(before, after), "{before}N{after}");
        }
        for (before, after) in [
            ("pid=", ", timeoutMs"),
            ("cuda_plugin: pid ", ": checkpointed"),
        ] {
            assert!(!never_a_pid(before, after), "{before}N{after}");
        }
    }
}
