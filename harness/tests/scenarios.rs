//! The regression corpus: one libtest-mimic trial per `scenarios/**/*.toml`, named by its path
//! relative to `scenarios/` and filterable with `cargo test --test scenarios -- NAME`.
//!
//! Each trial drives real processes: the workload tree, and one engine process per step (the
//! plugins live and die with the engine, so scenarios share no plugin state). Scenarios on a real
//! CRIU are skipped with a reason unless a CRIU >= 4.0 is found, and fail instead when
//! `CRIU_CUDA_REQUIRE_CRIU=1`. Scenarios that need the mock CUDA world are skipped until the
//! mock-world executor lands (the reason is printed).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use harness::scenario::{Action, EngineKind, Outcome, PluginKind, Scenario, TaskState};
use libtest_mimic::{Arguments, Failed, Trial};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const HARNESS: &str = env!("CARGO_BIN_EXE_harness");
const MANIFEST: &str = env!("CARGO_MANIFEST_DIR");

fn corpus_dir() -> PathBuf {
    Path::new(MANIFEST).join("../scenarios")
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|x| x == "toml") {
            out.push(p);
        }
    }
}

fn criu_version() -> Option<(u32, u32)> {
    let out = Command::new("criu").arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text
        .lines()
        .find_map(|l| l.strip_prefix("Version:"))?
        .trim()
        .to_owned();
    let mut it = v.split('.').map(|n| n.parse::<u32>().ok());
    Some((it.next()??, it.next().flatten().unwrap_or(0)))
}

/// `Some(reason)` when the scenario cannot run here.
fn skip_reason(s: &Scenario) -> Option<String> {
    if s.host.engine == EngineKind::Criu {
        return Some(match criu_version() {
            Some(v) if v.0 >= 4 => "real-CRIU execution is not implemented yet".to_owned(),
            _ => "no CRIU >= 4.0 found".to_owned(),
        });
    }
    if s.needs_cuda() {
        return Some("needs the mock CUDA world (mock-world executor pending)".to_owned());
    }
    None
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let root = corpus_dir();
    let mut files = Vec::new();
    collect(&root, &mut files);
    files.sort();
    let require_criu = std::env::var("CRIU_CUDA_REQUIRE_CRIU").is_ok_and(|v| v == "1");
    let trials = files
        .into_iter()
        .map(|path| {
            let name = path
                .strip_prefix(&root)
                .unwrap_or(&path)
                .with_extension("")
                .display()
                .to_string();
            match Scenario::load(&path) {
                Err(e) => Trial::test(name, move || Err(e.to_string().into())),
                Ok(s) => match skip_reason(&s) {
                    Some(r) if require_criu && s.host.engine == EngineKind::Criu => {
                        Trial::test(name, move || Err(format!("required: {r}").into()))
                    }
                    Some(r) => {
                        eprintln!("note: {name} is skipped: {r}");
                        Trial::test(name, || Ok(())).with_ignored_flag(true)
                    }
                    None => Trial::test(name, move || run_scenario(&s)),
                },
            }
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// A workload tree built from shell scripts (CPU-only tasks).
struct Workload {
    child: Child,
    pids: BTreeMap<String, i32>,
}

impl Drop for Workload {
    fn drop(&mut self) {
        let root = self.child.id() as i32;
        let _ = kill(Pid::from_raw(-root), Signal::SIGKILL);
        for &p in self.pids.values() {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

fn children_of(pid: i32) -> Vec<i32> {
    let mut v: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect();
    v.sort_unstable();
    v
}

fn is_sleeping_leaf(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
}

fn spawn_workload(s: &Scenario, dir: &Path) -> Result<Workload, Failed> {
    use std::os::unix::process::CommandExt;
    let tasks = &s.workload.tasks;
    for (i, t) in tasks.iter().enumerate() {
        let mut script = String::new();
        for (j, c) in tasks.iter().enumerate() {
            if c.parent.as_deref() == Some(t.name.as_str()) {
                script.push_str(&format!("sh {}/task{j}.sh &\n", dir.display()));
            }
        }
        script.push_str("exec sleep 100000\n");
        std::fs::write(dir.join(format!("task{i}.sh")), script)?;
    }
    let child = Command::new("sh")
        .arg(dir.join("task0.sh"))
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()?;
    let mut w = Workload {
        child,
        pids: BTreeMap::new(),
    };
    let root = w.child.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // Every task has exec'ed its sleep once the whole tree is up.
        let mut pids = BTreeMap::new();
        let ok = map_tasks(s, 0, root, &mut pids);
        if ok && pids.len() == tasks.len() && pids.values().all(|&p| is_sleeping_leaf(p)) {
            w.pids = pids;
            return Ok(w);
        }
        if Instant::now() > deadline {
            return Err("workload did not start".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn map_tasks(s: &Scenario, idx: usize, pid: i32, out: &mut BTreeMap<String, i32>) -> bool {
    let t = &s.workload.tasks[idx];
    out.insert(t.name.clone(), pid);
    let kids: Vec<usize> = s
        .workload
        .tasks
        .iter()
        .enumerate()
        .filter(|(_, c)| c.parent.as_deref() == Some(t.name.as_str()))
        .map(|(j, _)| j)
        .collect();
    let pids = children_of(pid);
    if pids.len() != kids.len() {
        return false;
    }
    kids.into_iter()
        .zip(pids)
        .all(|(j, p)| map_tasks(s, j, p, out))
}

fn parked(pid: i32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .all(|t| {
            let st = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            st.contains("State:\tT (stopped)") && st.contains("TracerPid:\t0")
        })
}

fn run_scenario(s: &Scenario) -> Result<(), Failed> {
    let tmp = tempfile::tempdir()?;
    let lib = tmp.path().join("lib");
    let img = tmp.path().join("img");
    std::fs::create_dir(&lib)?;
    let mut env: Vec<(String, String)> = Vec::new();
    for p in &s.plugins {
        if p.kind != PluginKind::Test {
            return Err("only test plugins run without the mock world".into());
        }
        let name = p.name.as_deref().unwrap_or("tp");
        let file = p.file.clone().unwrap_or_else(|| format!("{name}.so"));
        let st = Command::new("cc")
            .args(["-shared", "-fPIC", "-O0", "-w"])
            .arg(format!("-DTP_NAME=\"{name}\""))
            .args(p.defines.iter().map(|d| format!("-D{d}")))
            .arg(format!("{MANIFEST}/tests/support/testplugin.c"))
            .arg("-o")
            .arg(lib.join(file))
            .status()?;
        if !st.success() {
            return Err(format!("cc failed for test plugin {name}").into());
        }
        for (event, actions) in &p.script {
            env.push((format!("TP_{name}_{event}"), actions.clone()));
        }
    }
    let work = spawn_workload(s, tmp.path())?;
    let root = work.pids[&s.workload.tasks[0].name];
    for (i, step) in s.steps.iter().enumerate() {
        let log = tmp.path().join(format!("step{i}.log"));
        let mut c = Command::new(HARNESS);
        c.arg("--host").arg(&s.host.profile);
        c.arg(match step.action {
            Action::Dump => "dump",
            Action::PreDump => "pre-dump",
            Action::Restore => "restore",
        });
        c.arg("-D")
            .arg(&img)
            .arg("-L")
            .arg(&lib)
            .arg("-v4")
            .arg("-o")
            .arg(&log);
        c.arg("--trace").arg(tmp.path().join("trace"));
        if let Some(r) = &s.host.rules {
            c.arg("--rules").arg(r);
        }
        if step.action != Action::Restore {
            c.arg("-t").arg(root.to_string());
        }
        if step.leave_running {
            c.arg("--leave-running");
        }
        if step.stream {
            c.arg("--stream");
        }
        for o in s.options.iter().chain(&step.options) {
            c.arg("--plugin-option").arg(o);
        }
        c.env("TP_LOG", tmp.path().join("tp.log"));
        c.env_remove("CRIU_LIBS_DIR").env_remove("CRIU_FAULT");
        c.envs(env.iter().map(|(k, v)| (k, v)));
        let out = c.stdin(Stdio::null()).output()?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let got = if out.status.success() {
            Outcome::Ok
        } else {
            Outcome::Fail
        };
        if got != step.expect {
            return Err(format!(
                "step {i} ({:?}) expected {:?}, got {:?} ({})\nstderr: {}\nlog:\n{text}",
                step.action,
                step.expect,
                got,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        if let Some(e) = &step.error {
            if !text.contains(e.as_str()) {
                return Err(format!("step {i}: log lacks `{e}`:\n{text}").into());
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    for (name, &pid) in &work.pids {
        let good = || match s.expect.tasks {
            TaskState::Running => harness::pstree::running_untraced(pid).is_ok(),
            TaskState::Parked => parked(pid),
        };
        while !good() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !good() {
            return Err(format!("task {name} ({pid}) is not {:?}", s.expect.tasks).into());
        }
    }
    Ok(())
}
