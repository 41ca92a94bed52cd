//! End-of-scenario checks (the expected end state, host pids, data, leftovers) and cleanup.

use super::*;

impl Exec<'_> {
    pub(super) fn wait_tree_gone(&mut self) -> Result<(), String> {
        let pids: Vec<i32> = self.pids.values().copied().collect();
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            for &p in &pids {
                let _ = waitpid(Pid::from_raw(p), Some(WaitPidFlag::WNOHANG));
            }
            if let Some(c) = self.root_child.as_mut() {
                let _ = c.try_wait();
            }
            if pids
                .iter()
                .all(|p| !Path::new(&format!("/proc/{p}")).exists())
            {
                return Ok(());
            }
            if Instant::now() > end {
                return Err("the dumped tree did not go away before the restore".to_owned());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub(super) fn check_end(&mut self) -> Result<(), String> {
        let s = self.s;
        let alive: Vec<(String, i32)> = self
            .pids
            .iter()
            .filter(|(n, _)| !s.expect.dead.contains(n))
            .map(|(n, p)| (n.clone(), *p))
            .collect();
        let end = Instant::now() + Duration::from_secs(3);
        for (name, pid) in &alive {
            let good = || match s.expect.tasks {
                TaskState::Running => crate::pstree::running_untraced(*pid).is_ok(),
                TaskState::Parked => parked(*pid),
                TaskState::Gone => {
                    !Path::new(&format!("/proc/{pid}")).exists() || comm(*pid).is_empty()
                }
            };
            while !good() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
            if !good() {
                let detail = crate::pstree::running_untraced(*pid)
                    .err()
                    .unwrap_or_default();
                let is = if !Path::new(&format!("/proc/{pid}")).exists() || state(*pid) == 'Z' {
                    "gone"
                } else if detail.contains("TracerPid") && !detail.ends_with("TracerPid 0") {
                    "traced"
                } else if parked(*pid) || !detail.is_empty() {
                    "stopped"
                } else {
                    "running"
                };
                return Err(format!(
                    "task {name} is {is}, expected {}\n({pid}) {detail}",
                    match s.expect.tasks {
                        TaskState::Running => "running",
                        TaskState::Parked => "parked",
                        TaskState::Gone => "gone",
                    }
                ));
            }
        }
        for name in &s.expect.dead {
            let pid = self.pids[name];
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
            if crate::pstree::start_time(pid).is_some()
                && !comm(pid).is_empty()
                && state(pid) != 'Z'
            {
                return Err(format!("task {name} should have died\n(pid {pid})"));
            }
        }
        self.check_images_absent()?;
        if !s.expect.cuda_state.is_empty() {
            let st = self.world_status()?;
            for (name, want) in &s.expect.cuda_state {
                let pid = self.pids[name];
                let got = st.state_of(pid).name();
                if got != want {
                    return Err(format!(
                        "task {name}: CUDA state {got}, expected {want}\n{}",
                        self.transcript
                    ));
                }
            }
        }
        if s.expect.tasks == TaskState::Running && self.world.is_some() {
            // Nothing left locked: a running CUDA task whose state the scenario does not pin is
            // running in the world too (or not a CUDA process at all).
            let st = self.world_status()?;
            for t in s.workload.tasks.iter().filter(|t| t.cuda) {
                if s.expect.cuda_state.contains_key(&t.name) || s.expect.dead.contains(&t.name) {
                    continue;
                }
                let pid = self.pids[&t.name];
                let got = st.state_of(pid).name();
                if !["running", "none"].contains(&got) {
                    return Err(format!(
                        "task {}: CUDA state {got}, expected running (nothing may be left {got})\n{}",
                        t.name, self.transcript
                    ));
                }
            }
        }
        if s.expect.gpu_data_verified.is_some() || !s.expect.gpus.is_empty() {
            let verdicts = self.verify_data(&alive)?;
            if let Some(want) = s.expect.gpu_data_verified {
                let all_pass = verdicts.iter().all(|(_, v)| v.starts_with("PASS"));
                if all_pass != want {
                    let bad: Vec<String> = verdicts
                        .iter()
                        .filter(|(_, v)| !v.starts_with("PASS"))
                        .map(|(n, v)| {
                            let v = v.split_once("reason=").map_or(v.as_str(), |(_, r)| r);
                            format!("{n}: {v}")
                        })
                        .collect();
                    return Err(format!(
                        "GPU data check: {}\n{verdicts:?}",
                        if want {
                            bad.join("; ")
                        } else {
                            "every task passed".to_owned()
                        }
                    ));
                }
            }
            if !s.expect.gpus.is_empty() {
                self.transcript.push_str("== end\n-- gpus\n");
            }
            for (name, want) in &s.expect.gpus {
                let line = verdicts
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, l)| l.as_str())
                    .unwrap_or("not running");
                let got: Vec<&str> = match (line.starts_with("PASS"), field(line, "gpus")) {
                    (true, Some(g)) => g.split(',').filter(|u| !u.is_empty()).collect(),
                    _ => {
                        let why = line.split_once("reason=").map_or(line, |(_, r)| r);
                        return Err(format!(
                            "task {name}: no PASS line with GPUs: {why}\n{line}"
                        ));
                    }
                };
                let _ = writeln!(self.transcript, "{name}: {}", got.join(","));
                if got != *want {
                    return Err(format!(
                        "task {name}: on GPUs {got:?}, expected {want:?}\n{}",
                        self.transcript
                    ));
                }
            }
        }
        if let Some(want) = s.expect.host_pids {
            self.check_host_pids(want)?;
        }
        self.check_leftovers()
    }

    /// `expect.host_pids`: each task's host pid now against the one it started with, and its
    /// namespace pid now against the one it had (a restore keeps namespace pids).
    fn check_host_pids(&mut self, want: HostPids) -> Result<(), String> {
        if self.s.expect.gpus.is_empty() {
            self.transcript.push_str("== end\n");
        }
        self.transcript.push_str("-- pids\n");
        for t in &self.s.workload.tasks {
            if self.s.expect.dead.contains(&t.name) {
                continue;
            }
            let (start, now) = (self.start_pids[&t.name], self.pids[&t.name]);
            let nspid_now = identity_of(now).map(|i| i.pid);
            let same_ns = nspid_now == self.nspids.get(&t.name).copied();
            let line = format!(
                "{}: {} host pid, {} namespace pid",
                t.name,
                if start == now { "same" } else { "new" },
                if same_ns { "same" } else { "other" }
            );
            let _ = writeln!(self.transcript, "{line}");
            let ok = match want {
                HostPids::Changed => start != now && same_ns,
                HostPids::Kept => start == now,
            };
            if !ok {
                return Err(format!(
                    "expect.host_pids = {want:?}: task {} started as host pid {start}, is {now} \
                     now (namespace pid {nspid_now:?}, was {:?})",
                    t.name,
                    self.nspids.get(&t.name)
                ));
            }
        }
        Ok(())
    }

    /// SIGUSR1 to every task; each appends PASS or FAIL to its report.
    pub(super) fn verify_data(
        &self,
        tasks: &[(String, i32)],
    ) -> Result<Vec<(String, String)>, String> {
        let index = |name: &str| {
            self.s
                .workload
                .tasks
                .iter()
                .position(|t| t.name == name)
                .ok_or_else(|| format!("no task {name} in the workload"))
        };
        let by_index = tasks
            .iter()
            .map(|(name, pid)| Ok((index(name)?, *pid)))
            .collect::<Result<Vec<_>, String>>()?;
        let verdicts = verify_data(&self.dir, &by_index);
        Ok(tasks
            .iter()
            .map(|(name, _)| name.clone())
            .zip(verdicts)
            .collect())
    }

    /// Processes of this world other than the workload (a `cuda-checkpoint` left behind).
    pub(super) fn check_leftovers(&self) -> Result<(), String> {
        let Some(w) = &self.world else {
            return Ok(());
        };
        let mut ours: BTreeSet<i32> = self.pids.values().copied().collect();
        // The `unshare` that waits for a tree in its own pid namespace.
        ours.extend(self.root_child.as_ref().map(|c| c.id() as i32));
        let extra: Vec<i32> = world_processes(w)
            .into_iter()
            .filter(|pid| !ours.contains(pid))
            .collect();
        if extra.is_empty() {
            return Ok(());
        }
        let names: BTreeSet<String> = extra.iter().map(|&p| comm(p)).collect();
        let pids: Vec<String> = extra
            .iter()
            .map(|p| format!("{p} ({})", comm(*p)))
            .collect();
        Err(format!(
            "processes left behind: {}\n{}",
            names.into_iter().collect::<Vec<_>>().join(", "),
            pids.join(", ")
        ))
    }

    /// The world's `timeouts.log` as a section to append to a failure's text (see
    /// [`timeouts_section`]).
    pub(super) fn timeouts(&self) -> String {
        self.world
            .as_deref()
            .map(timeouts_section)
            .unwrap_or_default()
    }

    /// `[host] image_fs_kib`: mounts a tmpfs of `kib` KiB over the (new) image directory.
    pub(super) fn mount_image_fs(&mut self, kib: u64) -> Result<(), String> {
        let img = self.dir.join("img");
        std::fs::create_dir_all(&img).map_err(|e| format!("{}: {e}", img.display()))?;
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={kib}k,mode=0755"),
                "tmpfs",
            ])
            .arg(&img)
            .output()
            .map_err(|e| format!("host.image_fs_kib: mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "host.image_fs_kib: mount -t tmpfs -o size={kib}k over {}: {}",
                img.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        self.image_fs = Some(img);
        Ok(())
    }

    /// `expect.images_absent`: no file of the image directory matches any of the patterns.
    fn check_images_absent(&self) -> Result<(), String> {
        let patterns = &self.s.expect.images_absent;
        if patterns.is_empty() {
            return Ok(());
        }
        let img = self.dir.join("img");
        let mut names: Vec<String> = match std::fs::read_dir(&img) {
            Ok(rd) => rd
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(format!("expect.images_absent: {}: {e}", img.display())),
        };
        names.sort();
        let found: Vec<String> = names
            .iter()
            .filter(|n| patterns.iter().any(|p| crate::scenario::glob_match(p, n)))
            .map(|n| self.normalise(n))
            .collect();
        if found.is_empty() {
            return Ok(());
        }
        Err(format!(
            "expect.images_absent {patterns:?}: the image directory holds {}\n{}",
            found.join(", "),
            self.transcript
        ))
    }

    pub(super) fn cleanup(&mut self) {
        let mut victims: Vec<i32> = self.pids.values().copied().collect();
        let old: Vec<i32> = self
            .start_pids
            .values()
            .copied()
            .filter(|p| !victims.contains(p))
            .collect();
        victims.extend(old);
        if let Some(w) = &self.world {
            victims.extend(world_processes(w));
        }
        kill_and_reap(&victims, self.root_child.take());
        if let Some(img) = self.image_fs.take() {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&img)
                .status();
        }
    }
}

/// The timeout log of the world at `world` (`timeouts.log`: the driver requests that gave up on
/// a target's restore thread, with what `/proc` showed of it), as a section to append to a
/// failure's text; empty when nothing timed out.
/// The world's error log (`errors.log`: what the mock answered with
/// `CUDA_ERROR_OPERATING_SYSTEM`, and why) follows, when it has lines.
pub(super) fn timeouts_section(world: &Path) -> String {
    let read = |f: &str| std::fs::read_to_string(world.join(f)).unwrap_or_default();
    let mut out = String::new();
    let text = read(mock_cuda_world::timeouts::FILE);
    if !text.trim().is_empty() {
        out.push_str(&format!(
            "\n--- the mock world's timeouts.log (requests that gave up on a restore thread):\n{}",
            text.trim_end()
        ));
    }
    let text = read(mock_cuda_world::timeouts::ERRORS_FILE);
    if !text.trim().is_empty() {
        out.push_str(&format!(
            "\n--- the mock world's errors.log (world errors answered as CUDA_ERROR_OPERATING_SYSTEM):\n{}",
            text.trim_end()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::timeouts_section;

    #[test]
    fn a_failure_shows_the_worlds_timeouts_when_there_are_any() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(timeouts_section(dir.path()), "", "no log");
        let log = dir.path().join("timeouts.log");
        std::fs::write(&log, "").unwrap();
        assert_eq!(timeouts_section(dir.path()), "", "an empty log");
        let line = "1750000000.123 4242 cuda-guardian cuCheckpointProcessCheckpoint gave up \
                    after 10000 ms waiting for the answer: target=4250 restore_tid=4253 \
                    taken=no state=t wchan=ptrace_stop tracer=4242";
        std::fs::write(&log, format!("{line}\n")).unwrap();
        let text = timeouts_section(dir.path());
        assert!(
            text.starts_with('\n'),
            "after the failure's own text: {text:?}"
        );
        assert!(text.contains("timeouts.log"), "{text}");
        assert!(text.ends_with(line), "{text}");
        let errors = "1750000000.200 4250 mock-cuda-app state update: mock world lock \
                      /w/state.lock: not acquired within 30000 ms";
        std::fs::write(dir.path().join("errors.log"), format!("{errors}\n")).unwrap();
        let both = timeouts_section(dir.path());
        assert!(both.starts_with(&text), "the timeouts first: {both}");
        assert!(both.contains("errors.log"), "{both}");
        assert!(both.ends_with(errors), "{both}");
    }
}
