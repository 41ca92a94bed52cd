//! Step execution: the harness's own steps, engine and CRIU runs, the step watchdog.

use super::*;

impl Exec<'_> {
    /// A step the harness carries out itself: reconfigure the world, remove or rewrite an image.
    fn harness_step(&mut self, i: usize, step: &Step) -> Result<(), String> {
        let verb = crate::scenario::name(step.action);
        let mut detail = String::new();
        match step.action {
            Action::ReconfigureWorld => {
                let given = step.world.clone().unwrap_or_default();
                let mut t = self.s.world.clone().unwrap_or_default();
                for (k, v) in &given {
                    t.insert(k.clone(), v.clone());
                }
                let t = self.complete_world(t, true)?;
                self.configure_world(&t)?;
                detail.push_str("-- world\n");
                for (k, v) in &given {
                    match (k.as_str(), v) {
                        ("gpu", toml::Value::Array(gpus)) => {
                            for (n, g) in gpus.iter().enumerate() {
                                let f = |key: &str| {
                                    g.get(key)
                                        .map(|v| {
                                            v.as_str().map_or_else(|| v.to_string(), str::to_owned)
                                        })
                                        .unwrap_or_default()
                                };
                                let _ = writeln!(
                                    detail,
                                    "gpu {n}: {} {} ({}, {} MiB)",
                                    f("uuid"),
                                    f("name"),
                                    f("chip"),
                                    f("memory_mib")
                                );
                            }
                            if gpus.is_empty() {
                                detail.push_str("no GPU\n");
                            }
                        }
                        _ => {
                            let _ = writeln!(detail, "{k} = {v}");
                        }
                    }
                }
            }
            Action::Signal => {
                let task = step.task.as_deref().unwrap_or_default();
                let pid = *self
                    .pids
                    .get(task)
                    .ok_or_else(|| format!("step {i}: no task `{task}`"))?;
                let name = step.signal.as_deref().unwrap_or_default();
                let sig: nix::sys::signal::Signal = format!("SIG{name}")
                    .parse()
                    .map_err(|e| format!("step {i}: {name}: {e}"))?;
                nix::sys::signal::kill(Pid::from_raw(pid), sig)
                    .map_err(|e| format!("step {i}: kill {task}: {e}"))?;
                if sig == nix::sys::signal::Signal::SIGSTOP {
                    let end = Instant::now() + Duration::from_secs(5);
                    while state(pid) != 'T' && Instant::now() < end {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                let _ = writeln!(detail, "-- signal\nSIG{name} to {task}");
            }
            Action::SpecialImage => {
                let name = self.image_name(step.name.as_deref().unwrap_or_default());
                let path = self.dir.join("img").join(&name);
                let kind = step.kind.ok_or_else(|| format!("step {i}: no kind"))?;
                let _ = std::fs::remove_file(&path);
                let made = match kind {
                    crate::scenario::SpecialKind::Fifo => {
                        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
                            .map_err(std::io::Error::from)
                    }
                    crate::scenario::SpecialKind::DevZero => {
                        std::os::unix::fs::symlink("/dev/zero", &path)
                    }
                    crate::scenario::SpecialKind::Directory => std::fs::create_dir(&path),
                };
                made.map_err(|e| format!("step {i}: {}: {e}", path.display()))?;
                let _ = writeln!(detail, "-- image\n{} -> {kind:?}", self.normalise(&name));
            }
            Action::RemoveImage | Action::WriteImage => {
                let name = self.image_name(step.name.as_deref().unwrap_or_default());
                let bytes = step
                    .hex
                    .as_deref()
                    .map(crate::scenario::decode_hex)
                    .transpose()
                    .map_err(|e| format!("step {i}: hex: {e}"))?;
                let remove = step.action == Action::RemoveImage;
                let source = match &step.from {
                    Some(f) => {
                        let f = self.image_name(f);
                        let mut got = None;
                        self.edit_image(&f, |b| {
                            got.clone_from(&b);
                            Ok(b)
                        })?;
                        Some(got.ok_or_else(|| format!("step {i}: there is no image `{f}`"))?)
                    }
                    None => None,
                };
                let (before, after, streamed) = self.edit_image(&name, |old| {
                    if remove {
                        return match old {
                            Some(_) => Ok(None),
                            None => Err(format!("step {i}: there is no image `{name}` to remove")),
                        };
                    }
                    let mut data = source.or(old).unwrap_or_default();
                    if let Some([from, to]) = &step.replace {
                        let text = String::from_utf8_lossy(&data).into_owned();
                        if !text.contains(from.as_str()) {
                            return Err(format!("step {i}: `{name}` has no `{from}` to replace"));
                        }
                        data = text.replacen(from.as_str(), to, 1).into_bytes();
                    }
                    match (step.offset, &bytes) {
                        (Some(at), Some(b)) => {
                            let at = usize::try_from(at).map_err(|e| e.to_string())?;
                            if data.len() < at + b.len() {
                                data.resize(at + b.len(), 0);
                            }
                            data[at..at + b.len()].copy_from_slice(b);
                        }
                        (None, Some(b)) => data.clone_from(b),
                        (_, None) => {}
                    }
                    match step.truncate {
                        Some(n) if n < 0 => {
                            let drop =
                                usize::try_from(n.unsigned_abs()).map_err(|e| e.to_string())?;
                            data.truncate(data.len().saturating_sub(drop));
                        }
                        Some(n) => data.truncate(usize::try_from(n).map_err(|e| e.to_string())?),
                        None => {}
                    }
                    Ok(Some(data))
                })?;
                // The plugin's task images and task list hold pids, which differ from run to
                // run: their sizes and bytes are left out.
                // So are custom-storage files (a dump id, CRCs), and any copy of one of these.
                let per_task = [step.name.as_deref(), step.from.as_deref()]
                    .into_iter()
                    .flatten()
                    .any(|n| {
                        n.contains('{')
                            || n.starts_with("cuda-plugin-")
                            || n.starts_with("cuda-cs-")
                    });
                let size = |b: &Option<Vec<u8>>, gone: &str| match b {
                    None => gone.to_owned(),
                    Some(_) if per_task => "present".to_owned(),
                    Some(b) => format!("{} bytes", b.len()),
                };
                let _ = writeln!(
                    detail,
                    "-- image\n{}{}: {} -> {}",
                    self.normalise(&name),
                    if streamed { " (in the stream)" } else { "" },
                    size(&before, "absent"),
                    size(&after, "removed"),
                );
                if let (Some(b), false) = (&after, per_task) {
                    for chunk in b.chunks(32) {
                        let line: Vec<String> = chunk.iter().map(|x| format!("{x:02x}")).collect();
                        let _ = writeln!(detail, "{}", line.join(" "));
                    }
                }
            }
            _ => return Err(format!("step {i}: {verb} is not a harness-side step")),
        }
        let _ = writeln!(self.transcript, "== step {i}: {verb} -> ok");
        self.transcript.push_str(&detail);
        Ok(())
    }

    /// Applies `f` to image `name` (its bytes, `None` when absent; it returns the new bytes or
    /// `None` to delete): a file of the image directory, or an entry of the stream file when the
    /// dump was streamed. Returns the bytes before and after, and whether it was streamed.
    #[expect(
        clippy::type_complexity,
        reason = "the bytes before and after and whether the dump was streamed, named once here"
    )]
    fn edit_image(
        &self,
        name: &str,
        f: impl FnOnce(Option<Vec<u8>>) -> Result<Option<Vec<u8>>, String>,
    ) -> Result<(Option<Vec<u8>>, Option<Vec<u8>>, bool), String> {
        let img = self.dir.join("img");
        let stream = img.join(crate::images::STREAM_FILE);
        if stream.exists() {
            let raw = std::fs::read(&stream).map_err(|e| format!("{}: {e}", stream.display()))?;
            let mut files = crate::images::decode(&raw, &stream.display().to_string())
                .map_err(|e| e.to_string())?;
            let at = files.iter().position(|(n, _)| n == name);
            let before = at.map(|k| files[k].1.clone());
            let after = f(before.clone())?;
            match (at, &after) {
                (Some(k), Some(b)) => files[k].1.clone_from(b),
                (Some(k), None) => {
                    files.remove(k);
                }
                (None, Some(b)) => files.push((name.to_owned(), b.clone())),
                (None, None) => {}
            }
            std::fs::write(&stream, crate::images::encode(&files))
                .map_err(|e| format!("{}: {e}", stream.display()))?;
            return Ok((before, after, true));
        }
        let path = img.join(name);
        let before = std::fs::read(&path).ok();
        let after = f(before.clone())?;
        match &after {
            Some(b) => std::fs::write(&path, b),
            None => std::fs::remove_file(&path),
        }
        .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok((before, after, false))
    }

    /// `[host] memory_gib` of the scenario's world, if it models the host's memory.
    fn world_host_memory_gib(&self) -> Option<u64> {
        let t = self.s.world.as_ref()?.get("host")?.get("memory_gib")?;
        t.as_integer()
            .and_then(|g| u64::try_from(g).ok())
            .or_else(|| t.as_float().map(|f| f as u64))
    }

    /// The arguments a CRIU step adds for its `criu_timeout` and `action_script`.
    fn criu_step_args(&self, c: &mut Command, step: &Step) -> Result<(), String> {
        if let Some(t) = step.criu_timeout {
            c.arg("--timeout").arg(t.to_string());
        }
        if let Some(text) = &step.action_script {
            let path = self.dir.join("action-script.sh");
            std::fs::write(&path, format!("#!/bin/sh\n{text}\n"))
                .map_err(|e| format!("{}: {e}", path.display()))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("{}: {e}", path.display()))?;
            c.arg("--action-script").arg(&path);
        }
        Ok(())
    }

    /// An image step's file name, with every `{task}` replaced by that task's pid.
    fn image_name(&self, name: &str) -> String {
        let mut out = name.to_owned();
        for (task, pid) in &self.pids {
            out = out.replace(&format!("{{{task}}}"), &pid.to_string());
        }
        out
    }

    pub(super) fn step(&mut self, i: usize, step: &Step, lib: &Path) -> Result<(), String> {
        if step.action.is_harness_side() {
            return self.harness_step(i, step);
        }
        let files = StepFiles::new(&self.dir, i);
        let (mut c, label, env_options) = if step.action == Action::CudaCheckpoint {
            (self.cuda_checkpoint_command(step), "cuda-checkpoint", None)
        } else if let Some(criu) = self.criu.clone() {
            self.criu_command(&criu, i, step, lib, &files)?
        } else {
            self.engine_command(step, lib, &files)?
        };
        self.step_env(&mut c, step, &files, env_options);
        // The CUDA tasks already checkpointed before a dump (by the user, not by the dump).
        let before = if step.action == Action::Dump {
            self.checkpointed_tasks()?
        } else {
            Vec::new()
        };
        // The step `[invariants]` judge: what its own checks find is a violation among others.
        let judged = self.s.invariants.is_some() && i + 1 == self.s.steps.len();
        let mut ran = self.run_step(&mut c, label, i, step, &files, judged)?;
        self.record_step(i, step, &mut ran, &files);
        self.last_ok = ran.got == Outcome::Ok;
        let checked = self.check_step(i, step, &ran, &files, &before);
        if !judged {
            return checked;
        }
        if let Err(e) = checked {
            self.violations
                .push(e.lines().next().unwrap_or_default().to_owned());
        }
        self.judged = Some(super::invariants::Judged {
            index: i,
            verb: crate::scenario::name(step.action),
            ok: ran.got == Outcome::Ok,
            log: format!("{}{}{}", ran.log_text, ran.stdout, ran.stderr),
            trace: std::fs::read_to_string(&files.trace).unwrap_or_default(),
        });
        Ok(())
    }

    /// A `cuda-checkpoint` run on the step's task.
    fn cuda_checkpoint_command(&self, step: &Step) -> Command {
        let task = step.task.as_deref().unwrap_or_default();
        let mut c = Command::new(&self.art.cuda_checkpoint);
        c.args(&step.args)
            .arg("--pid")
            .arg(self.pids[task].to_string());
        c
    }

    /// A real CRIU run, with the plugin options to pass in the environment.
    fn criu_command(
        &mut self,
        criu: &Path,
        i: usize,
        step: &Step,
        lib: &Path,
        files: &StepFiles,
    ) -> Result<(Command, &'static str, Option<String>), String> {
        let verb = crate::scenario::name(step.action);
        let root = self.pids[&self.s.workload.tasks[0].name];
        let options = self.put.options(self.s, &step.options);
        if step.action == Action::Restore {
            self.wait_tree_gone()?;
        }
        std::fs::create_dir_all(&files.img).map_err(|e| e.to_string())?;
        let mut c = Command::new(criu);
        c.arg(verb);
        if step.action != Action::Restore {
            c.arg("-t").arg(root.to_string());
        } else {
            c.arg("-d");
            // CRIU restores a mount namespace only onto a root it is given.
            if self.s.workload.has(Namespace::Mount) {
                c.arg("--root").arg("/");
            }
            if self.s.workload.has(Namespace::Pid) {
                c.arg("--pidfile")
                    .arg(self.dir.join(format!("step{i}.pid")));
            }
        }
        c.arg("-D")
            .arg(&files.img)
            .arg("-L")
            .arg(lib)
            .arg("-v4")
            .arg("-o")
            .arg(&files.log);
        if step.leave_running {
            c.arg("--leave-running");
        }
        self.criu_step_args(&mut c, step)?;
        let env_options = (!options.is_empty()).then(|| options.join(" "));
        Ok((c, "criu", env_options))
    }

    /// An emulated CRIU run (the `harness` engine), with the plugin options to pass in the
    /// environment where the emulated host has no `--plugin-option`.
    fn engine_command(
        &self,
        step: &Step,
        lib: &Path,
        files: &StepFiles,
    ) -> Result<(Command, &'static str, Option<String>), String> {
        let verb = crate::scenario::name(step.action);
        let root = self.pids[&self.s.workload.tasks[0].name];
        let options = self.put.options(self.s, &step.options);
        let mut c = Command::new(&self.art.harness);
        c.arg("--host").arg(&self.s.host.profile).arg(verb);
        c.arg("-D")
            .arg(&files.img)
            .arg("-L")
            .arg(lib)
            .arg("-v4")
            .arg("-o")
            .arg(&files.log);
        c.arg("--trace").arg(&files.trace);
        if let Some(r) = &self.s.host.rules {
            c.arg("--rules").arg(r);
        }
        if self.s.host.sentinel {
            c.arg("--device-sentinel");
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
        self.criu_step_args(&mut c, step)?;
        let native = self
            .s
            .host
            .profile
            .parse::<crate::profile::HostProfile>()
            .is_ok_and(crate::profile::HostProfile::has_plugin_options);
        let mut env_options = None;
        if native {
            for o in &options {
                c.arg("--plugin-option").arg(o);
            }
        } else if !options.is_empty() {
            env_options = Some(options.join(" "));
        }
        Ok((c, "criu", env_options))
    }

    /// The step process's environment: the world's, the modelled host memory, the step's own,
    /// the test plugins' log, the plugin options and the plugin's enable variables.
    fn step_env(
        &self,
        c: &mut Command,
        step: &Step,
        files: &StepFiles,
        env_options: Option<String>,
    ) {
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        // The plugin sizes the host by MemAvailable; it sees the world's modelled host instead
        // of this machine: `[host] memory_gib`, else a host of 1 TiB (the world's host memory
        // is unlimited by default), so that outcomes and snapshots do not depend on where the
        // corpus runs.
        c.env(
            criu_cuda_env::MEM_AVAILABLE_GIB,
            self.world_host_memory_gib().unwrap_or(1024).to_string(),
        );
        c.envs(&step.env);
        c.env("TP_LOG", &files.tp_log);
        c.env_remove("CRIU_LIBS_DIR").env_remove("CRIU_FAULT");
        match env_options {
            Some(o) => c.env("CRIU_PLUGIN_OPTIONS", o),
            None => c.env_remove("CRIU_PLUGIN_OPTIONS"),
        };
        for (k, v) in &self.put.enable {
            if self.s.host.force_enable {
                c.env(k, v);
            } else {
                c.env_remove(k);
            }
        }
    }

    /// Runs the step process under the watchdog, follows a restored pid namespace and waits
    /// for the plugin's guardians.
    fn run_step(
        &mut self,
        c: &mut Command,
        label: &'static str,
        i: usize,
        step: &Step,
        files: &StepFiles,
        judged: bool,
    ) -> Result<Ran, String> {
        let verb = crate::scenario::name(step.action);
        let started = Instant::now();
        let limit = step_limit(step);
        // A `hang` fault with a file waits for the world's `release` file.
        let release = step
            .release_after
            .map(Duration::from_secs_f64)
            .zip(self.world.as_ref().map(|w| w.join("release")));
        let released = std::cell::Cell::new(false);
        let release_now = || {
            if let (Some((_, f)), false) = (&release, released.get()) {
                let _ = std::fs::write(f, "");
                released.set(true);
            }
        };
        let mut procs = Vec::new();
        let (status, stdout, stderr) = run_bounded(
            c,
            limit,
            |pid| procs.push(pid),
            |t| {
                if release.as_ref().is_some_and(|(at, _)| t >= *at) {
                    release_now();
                }
            },
        )
        .map_err(|e| format!("step {i} ({verb}): {e}"))?;
        release_now();
        for pid in procs {
            self.procs.insert(pid, label);
        }
        let killed = format!(
            "step {i} ({verb}) did not finish within {} s\nkilled it and its process group \
             (log: {})",
            limit.as_secs(),
            files.log.display()
        );
        let status = match status {
            Some(s) => s,
            None if judged => {
                self.violations
                    .push(killed.lines().next().unwrap_or_default().to_owned());
                std::os::unix::process::ExitStatusExt::from_raw(libc::SIGKILL)
            }
            None => return Err(killed),
        };
        let took = started.elapsed();
        let got = if status.success() {
            Outcome::Ok
        } else {
            Outcome::Fail
        };
        // A pid namespace restored by a real CRIU: the tasks have new host pids.
        let restored_ns = step.action == Action::Restore
            && self.criu.is_some()
            && self.s.workload.has(Namespace::Pid);
        if restored_ns && got == Outcome::Ok {
            self.follow_restored_tree(&self.dir.join(format!("step{i}.pid")))?;
        }
        let log_text = std::fs::read_to_string(&files.log).unwrap_or_default();
        // The plugin's helper process runs its driver calls: name it in the driver's trace.
        // It outlives CRIU by design (it puts back the tasks of a CRIU that died, or that
        // resumed them checkpointed): the step ends when it has exited too.
        for pid in guardian_pids(&log_text) {
            self.procs.insert(pid, "guardian");
            wait_gone(pid, GUARDIAN_LIMIT)
                .map_err(|e| format!("step {i} ({verb}): the plugin's guardian {e}"))?;
        }
        Ok(Ran {
            status,
            stdout,
            stderr,
            took,
            got,
            log_text,
            backend: None,
        })
    }

    /// Appends the step's transcript: its heading, the engine's trace, the driver's trace, the
    /// plugin's log lines, the test plugins' log and a `cuda-checkpoint` run's output. Notes
    /// the backend the plugin chose in `ran`.
    fn record_step(&mut self, i: usize, step: &Step, ran: &mut Ran, files: &StepFiles) {
        let verb = crate::scenario::name(step.action);
        let got = ran.got;
        let _ = writeln!(
            self.transcript,
            "== step {i}: {verb}{}{} -> {}",
            if step.leave_running {
                " --leave-running"
            } else {
                ""
            },
            step.task
                .as_deref()
                .map(|t| format!(" {} {t}", step.args.join(" ")))
                .unwrap_or_default(),
            if got == Outcome::Ok { "ok" } else { "failed" }
        );
        let driver = self.take_driver_trace();
        self.refresh_tids();
        let engine_trace = std::fs::read_to_string(&files.trace).unwrap_or_default();
        if !engine_trace.is_empty() {
            self.transcript.push_str("-- engine\n");
            for l in engine_trace.lines() {
                let _ = writeln!(self.transcript, "{}", self.normalise(l));
            }
        }
        if !driver.is_empty() {
            self.transcript.push_str("-- driver\n");
            for l in &driver {
                let _ = writeln!(self.transcript, "{l}");
            }
        }
        let plugin_lines: Vec<String> = ran
            .log_text
            .lines()
            .filter_map(|l| l.find("cuda_plugin: ").map(|at| &l[at..]))
            .map(|l| self.normalise(l))
            .collect();
        let plugin_lines: Vec<String> = plugin_lines
            .iter()
            .filter_map(|l| normalise::plugin_line(l))
            .collect();
        if !plugin_lines.is_empty() {
            self.transcript.push_str("-- plugin log\n");
            for l in &plugin_lines {
                let _ = writeln!(self.transcript, "{l}");
            }
        }
        let tp = std::fs::read_to_string(&files.tp_log).unwrap_or_default();
        if !tp.is_empty() {
            self.transcript.push_str("-- test plugins\n");
            for l in tp.lines() {
                let _ = writeln!(self.transcript, "{}", self.normalise(l));
            }
        }
        if step.action == Action::CudaCheckpoint {
            let _ = writeln!(
                self.transcript,
                "-- output\n{}",
                self.normalise(ran.stdout.trim_end())
            );
        }
        ran.backend = plugin_lines.iter().find_map(|l| {
            let rest = l.strip_prefix("cuda_plugin: backend ")?;
            Some(rest.split_whitespace().next()?.to_owned())
        });
        if let Some(b) = &ran.backend {
            self.backends.push(b.clone());
        }
    }

    /// Checks what the step must do: end within its bound, with its outcome, leave the
    /// inventory a dump implies, and (this project's plugin only) log what it must and pick
    /// the backend it must.
    fn check_step(
        &self,
        i: usize,
        step: &Step,
        ran: &Ran,
        files: &StepFiles,
        before: &[String],
    ) -> Result<(), String> {
        let verb = crate::scenario::name(step.action);
        let Ran {
            status,
            stdout,
            stderr,
            took,
            got,
            log_text,
            backend,
        } = ran;
        let got = *got;
        let context = || {
            format!(
                "\n--- stderr:\n{stderr}\n--- log ({}):\n{log_text}",
                files.log.display()
            )
        };
        if let Some(w) = step.within {
            if took.as_secs_f64() > w {
                return Err(format!(
                    "step {i} ({verb}) took more than the {w} s it must end within\n\
                     it took {:.2} s{}",
                    took.as_secs_f64(),
                    context()
                ));
            }
        }
        if step.outcome() != Outcome::Any && got != step.outcome() {
            let shown = |o: Outcome| if o == Outcome::Ok { "ok" } else { "failed" };
            return Err(format!(
                "step {i} ({verb}): expected {}, got {}\n({status}, {:.1} s){}",
                shown(step.outcome()),
                shown(got),
                took.as_secs_f64(),
                context()
            ));
        }
        if step.action == Action::Dump && got == Outcome::Ok && !step.leave_running {
            self.check_inventory(i, verb, before)?;
        }
        if !self.put.ours {
            // The log lines and the backend line are this project's plugin's.
            return Ok(());
        }
        if let Some(e) = &step.error {
            let hay = format!("{log_text}{stderr}{stdout}");
            if !hay.contains(e.as_str()) {
                return Err(format!("step {i} ({verb}): log lacks `{e}`{}", context()));
            }
        }
        for want in &step.log {
            if !log_text.contains(want.as_str()) && !stderr.contains(want.as_str()) {
                return Err(format!(
                    "step {i} ({verb}): log lacks `{want}`{}",
                    context()
                ));
            }
        }
        for bad in &step.absent {
            if log_text.contains(bad.as_str()) || stderr.contains(bad.as_str()) {
                return Err(format!(
                    "step {i} ({verb}): log contains `{bad}`{}",
                    context()
                ));
            }
        }
        if let Some(want) = &step.backend {
            let got = backend.as_deref().unwrap_or("none");
            if got != want {
                return Err(format!(
                    "step {i} ({verb}): backend {got}, expected {want}{}",
                    context()
                ));
            }
        }
        Ok(())
    }

    /// The CUDA tasks of the workload whose CUDA state is checkpointed now, by name.
    fn checkpointed_tasks(&self) -> Result<Vec<String>, String> {
        if self.world.is_none() {
            return Ok(Vec::new());
        }
        let st = self.world_status()?;
        Ok(self
            .s
            .workload
            .tasks
            .iter()
            .filter(|t| t.cuda)
            .filter(|t| {
                self.pids
                    .get(&t.name)
                    .is_some_and(|pid| st.state_of(*pid) == CudaState::Checkpointed)
            })
            .map(|t| t.name.clone())
            .collect())
    }

    /// After a dump that checkpointed a CUDA task (one not checkpointed before it, `before`;
    /// a tree the user checkpointed may be dumped without the plugin): the image requires the CUDA plugin by
    /// its inventory name (so a restore without it fails instead of releasing tasks without
    /// their GPU state). Read from the harness's `inventory.json`, or found in CRIU's
    /// `inventory.img`; nothing to check without either, or with an image of the older format
    /// (no plugin list).
    fn check_inventory(&self, i: usize, verb: &str, before: &[String]) -> Result<(), String> {
        let checkpointed = self
            .checkpointed_tasks()?
            .iter()
            .any(|t| !before.contains(t));
        if !checkpointed {
            return Ok(());
        }
        let img = self.dir.join("img");
        let name = &self.put.name;
        let listed =
            if let Ok(text) = std::fs::read_to_string(img.join(crate::inventory::FILE_NAME)) {
                let v: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| format!("step {i} ({verb}): inventory.json: {e}"))?;
                match v["plugins"].as_array() {
                    None => return Ok(()),
                    Some(list) => list.iter().any(|p| p.as_str() == Some(name.as_str())),
                }
            } else if let Ok(raw) = std::fs::read(img.join("inventory.img")) {
                raw.windows(name.len()).any(|w| w == name.as_bytes())
            } else {
                return Ok(());
            };
        if listed {
            Ok(())
        } else {
            Err(format!(
                "step {i} ({verb}): the image holds GPU state but does not require plugin {name}\n\
                 a restore without the plugin would release the tasks without their GPU state"
            ))
        }
    }
}

/// How long a step may run before the watchdog kills it: 120 s, or twice its `within` plus
/// 10 s. A step past its `within` has failed already; the margin only tells "took too long"
/// from "hung" (a plugin without a timeout of its own hangs for ever: the kit's hung-call
/// scenarios run every plugin into that).
fn step_limit(step: &Step) -> Duration {
    step.within.map_or(Duration::from_secs(120), |w| {
        Duration::from_secs_f64(w * 2.0 + 10.0)
    })
}

/// Runs `c` in its own process group with its output captured, for at most `limit`: on
/// expiry the whole group is killed and the status is `None`. `on_spawn` learns the pid.
fn run_bounded(
    c: &mut Command,
    limit: Duration,
    on_spawn: impl FnOnce(i32),
    mut tick: impl FnMut(Duration),
) -> Result<(Option<std::process::ExitStatus>, String, String), String> {
    use std::os::unix::process::CommandExt;
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = c.spawn().map_err(|e| format!("spawn: {e}"))?;
    let pid = child.id() as i32;
    on_spawn(pid);
    let reader = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let out = reader(child.stdout.take().map(|o| Box::new(o) as _));
    let err = reader(child.stderr.take().map(|e| Box::new(e) as _));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(st);
        }
        tick(start.elapsed());
        if start.elapsed() >= limit {
            let _ = nix::sys::signal::killpg(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // A process the step left behind may hold the pipes: do not wait for it.
    let collect = |h: std::thread::JoinHandle<String>| {
        let t = Instant::now();
        while !h.is_finished() && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if h.is_finished() {
            h.join().unwrap_or_default()
        } else {
            String::new()
        }
    };
    Ok((status, collect(out), collect(err)))
}

/// How long the plugin's guardian may outlive the CRIU run that started it: its own bound on
/// watching CRIU (60 s) and on putting a task back, with room to spare.
const GUARDIAN_LIMIT: Duration = Duration::from_secs(90);

/// The pids of the plugin's guardian helpers a CRIU log names (the plugin logs
/// `helper process PID started` when it starts one).
pub(crate) fn guardian_pids(log: &str) -> Vec<i32> {
    log.lines()
        .filter_map(|l| l.split("helper process ").nth(1))
        .filter_map(|rest| rest.strip_suffix(" started")?.parse().ok())
        .collect()
}

/// Waits until the guardian `pid` has exited (gone, a zombie nobody reaped yet, or its pid
/// taken by a process of another name), for at most `limit`; reaps it when it is our child.
pub(crate) fn wait_gone(pid: i32, limit: Duration) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let rest = s.rsplit_once(')')?.1.trim_start().to_owned();
                rest.chars().next()
            });
        // A pid taken again by another process: the guardian (named so) is gone.
        let ours = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim_end() == "cuda-guardian");
        if ours && state == Some('Z') {
            // A test process that is a subreaper inherits the orphaned guardian: reap it.
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        }
        if !ours || matches!(state, None | Some('Z' | 'X')) {
            return Ok(());
        }
        if started.elapsed() > limit {
            return Err(format!(
                "{pid} still runs {} s after the step ended",
                limit.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The files of step `i` in the scenario's directory.
struct StepFiles {
    /// The image directory.
    img: PathBuf,
    /// CRIU's (or the engine's) log.
    log: PathBuf,
    /// The engine's hook trace.
    trace: PathBuf,
    /// The test plugins' log.
    tp_log: PathBuf,
}

impl StepFiles {
    fn new(dir: &Path, i: usize) -> Self {
        Self {
            img: dir.join("img"),
            log: dir.join(format!("step{i}.log")),
            trace: dir.join(format!("step{i}.trace")),
            tp_log: dir.join(format!("step{i}.tp")),
        }
    }
}

/// How a step process ended.
struct Ran {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
    got: Outcome,
    /// CRIU's (or the engine's) log.
    log_text: String,
    /// The backend the plugin logged it chose, once the transcript is recorded.
    backend: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guardian_pids_come_from_the_plugins_start_lines() {
        let log = "(00.001) cuda_plugin: helper process 4711 started\n\
                   (00.002) cuda_plugin: helper process 12 started late\n\
                   (00.003) cuda_plugin: helper process x started\n\
                   (00.004) cuda_plugin: pid 9: restored\n\
                   (00.005) cuda_plugin: helper process 99 started\n";
        assert_eq!(guardian_pids(log), vec![4711, 99]);
        assert!(guardian_pids("").is_empty());
    }

    proptest::proptest! {
        #[test]
        fn guardian_pid_parser_finds_every_start_line(pids in proptest::collection::vec(1i32.., 0..6), junk in "[ -~]{0,30}") {
            let log: String = pids.iter().map(|p| format!("(00.1) cuda_plugin: helper process {p} started\n{junk}\n")).collect();
            let got = guardian_pids(&log);
            // Junk that itself reads as a start line may add pids, never drop one.
            proptest::prop_assert!(pids.iter().all(|p| got.contains(p)));
            let _ = guardian_pids(&junk);
        }
    }

    #[test]
    fn the_step_watchdog_kills_a_hung_step_and_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("child.pid");
        // A step that starts a process of its own, then hangs.
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg(format!(
            "sleep 60 & echo $! > {}; sleep 60",
            pidfile.display()
        ));
        let start = Instant::now();
        let mut seen = None;
        let (status, _, _) = run_bounded(
            &mut c,
            Duration::from_millis(300),
            |p| seen = Some(p),
            |_| {},
        )
        .unwrap();
        assert!(status.is_none(), "reported as not finished");
        assert!(seen.is_some());
        assert!(start.elapsed() < Duration::from_secs(10), "bounded");
        let child: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        while Path::new(&format!("/proc/{child}")).exists()
            && !matches!(state(child), 'Z' | 'X')
            && Instant::now() < end
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            matches!(state(child), 'Z' | 'X' | '?'),
            "the step's own process was killed with its group"
        );
        // A step that ends in time reports its status and output.
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg("echo out; echo err >&2; exit 3");
        let (status, out, err) =
            run_bounded(&mut c, Duration::from_secs(20), |_| {}, |_| {}).unwrap();
        assert_eq!(status.and_then(|s| s.code()), Some(3));
        assert_eq!((out.trim(), err.trim()), ("out", "err"));
    }
}
