//! The scenario's mock CUDA world, plugin directory and workload tree.

use super::*;

impl Exec<'_> {
    fn world_table(&self, with_faults: bool) -> Result<toml::Table, String> {
        self.complete_world(self.s.world.clone().unwrap_or_default(), with_faults)
    }

    /// `t` with `schema = 1` and the default GPU added when absent; faults dropped, or kept with
    /// task names turned into pids.
    pub(super) fn complete_world(
        &self,
        mut t: toml::Table,
        with_faults: bool,
    ) -> Result<toml::Table, String> {
        t.entry("schema").or_insert(toml::Value::Integer(1));
        if !t.contains_key("gpu") {
            let g: toml::Table = toml::from_str(DEFAULT_GPU).map_err(|e| e.to_string())?;
            t.insert("gpu".to_owned(), g["gpu"].clone());
        }
        if !with_faults {
            t.remove("fault");
            return Ok(t);
        }
        if let Some(toml::Value::Array(faults)) = t.get_mut("fault") {
            for f in faults {
                let Some(ft) = f.as_table_mut() else { continue };
                if let Some(toml::Value::String(task)) = ft.remove("task") {
                    let pid = self
                        .pids
                        .get(&task)
                        .ok_or_else(|| format!("fault names unknown task `{task}`"))?;
                    ft.insert("pid".to_owned(), toml::Value::Integer(i64::from(*pid)));
                }
            }
        }
        Ok(t)
    }

    pub(super) fn init_world(&mut self) -> Result<(), String> {
        let w = self.dir.join("world");
        let t = self.world_table(false)?;
        MockWorld::init(&w, &t, &self.art.mock_lib, Some(&self.art.mock_nvml))
            .map_err(|e| e.to_string())?;
        let bin = self.dir.join("bin");
        std::fs::create_dir(&bin).map_err(|e| e.to_string())?;
        if self.s.host.cuda_checkpoint {
            std::os::unix::fs::symlink(&self.art.cuda_checkpoint, bin.join("cuda-checkpoint"))
                .map_err(|e| e.to_string())?;
        }
        self.env = mock_env(&w, &bin);
        self.world = Some(w);
        Ok(())
    }

    /// Gives the world the config `t` (the world keeps it as its own `world.toml`).
    pub(super) fn configure_world(&self, t: &toml::Table) -> Result<(), String> {
        let w = self.world.clone().ok_or("no mock world")?;
        MockWorld::open(&w)
            .map(|m| m.with_libs(Some(&self.art.mock_lib), Some(&self.art.mock_nvml)))
            .and_then(|m| m.configure(t))
            .map_err(|e| e.to_string())
    }

    pub(super) fn install_faults(&mut self) -> Result<(), String> {
        if self.world.is_none() {
            return Ok(());
        }
        if !self
            .s
            .world
            .as_ref()
            .is_some_and(|t| t.contains_key("fault"))
        {
            return Ok(());
        }
        let t = self.world_table(true)?;
        self.configure_world(&t)
    }

    pub(super) fn install_plugins(&mut self, lib: &Path) -> Result<(), String> {
        for p in &self.s.plugins {
            match p.kind {
                PluginKind::Cuda => {
                    let file = p
                        .file
                        .clone()
                        .unwrap_or_else(|| "cuda_plugin.so".to_owned());
                    let so = p.path.as_deref().map_or_else(
                        || crate::kit::plugin_file(self.s, self.put, self.art),
                        |x| self.art.workspace.join(x),
                    );
                    // Hard-linked where it can be (the plugin is read, never written: a debug
                    // build is 18 MB, and every scenario installs one), else copied.
                    let dest = lib.join(file);
                    if std::fs::hard_link(&so, &dest).is_err() {
                        std::fs::copy(&so, &dest)
                            .map_err(|e| format!("copy {}: {e}", so.display()))?;
                    }
                }
                PluginKind::Test => {
                    let name = p.name.as_deref().unwrap_or("tp");
                    let file = p.file.clone().unwrap_or_else(|| format!("{name}.so"));
                    let src = self
                        .art
                        .workspace
                        .join("harness/tests/support/testplugin.c");
                    run_checked(
                        Command::new("cc")
                            .args(["-shared", "-fPIC", "-O0", "-w"])
                            .arg(format!("-DTP_NAME=\"{name}\""))
                            .args(p.defines.iter().map(|d| format!("-D{d}")))
                            .arg(src)
                            .arg("-o")
                            .arg(lib.join(file)),
                        &format!("cc test plugin {name}"),
                    )?;
                    for (event, actions) in &p.script {
                        self.env
                            .push((format!("TP_{name}_{event}"), actions.clone()));
                    }
                }
            }
        }
        Ok(())
    }

    fn children_of(&self, idx: usize) -> Vec<usize> {
        let name = &self.s.workload.tasks[idx].name;
        self.s
            .workload
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.parent.as_deref() == Some(name.as_str()))
            .map(|(j, _)| j)
            .collect()
    }

    fn spawn_tree(&mut self, exec_line: &dyn Fn(usize) -> String) -> Result<(), String> {
        let n = self.s.workload.tasks.len();
        for i in 0..n {
            let mut script = String::new();
            for j in self.children_of(i) {
                let _ = writeln!(script, "sh {}/task{j}.sh &", self.dir.display());
            }
            script.push_str(&exec_line(i));
            script.push('\n');
            std::fs::write(self.dir.join(format!("task{i}.sh")), script)
                .map_err(|e| e.to_string())?;
        }
        self.root_child = Some(spawn_root(
            &self.dir,
            &self.env,
            &self.s.workload.namespaces,
        )?);
        Ok(())
    }

    /// The host pid of the tree's root.
    fn root_pid(&self, deadline: Instant) -> Result<i32, String> {
        let child = self.root_child.as_ref().ok_or("the tree was not started")?;
        tree_root(child, &self.s.workload.namespaces, deadline)
    }

    /// The host pid of a task whose READY line says `pid` (its pid in its own namespace).
    fn host_pid_of(&self, pid: i32, deadline: Instant) -> Result<i32, String> {
        if !self.s.workload.has(Namespace::Pid) {
            return Ok(pid);
        }
        let root = self.root_pid(deadline)?;
        let ns = pid_ns_of(root).ok_or_else(|| format!("no pid namespace of the root {root}"))?;
        loop {
            if let Some(h) = host_pid_in(ns, pid) {
                return Ok(h);
            }
            if Instant::now() > deadline {
                return Err(format!("no process is pid {pid} of pid namespace {ns}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Records where task `name` lives now: its host pid, and its namespace pid.
    fn place_task(&mut self, name: &str, host: i32) {
        self.add_task(name, host);
        if let Some(id) = identity_of(host) {
            // The namespace pid it started with (a restore keeps it).
            self.nspids.entry(name.to_owned()).or_insert(id.pid);
            self.ns_names.insert((id.ns, id.pid), name.to_owned());
        }
    }

    /// After a real CRIU restored a tree with its own pid namespace: the tasks' new host pids,
    /// found by their namespace pids (CRIU keeps them) in the namespace of the restored root
    /// (`--pidfile`). Task names keep naming the old pids too.
    pub(super) fn follow_restored_tree(&mut self, pidfile: &Path) -> Result<(), String> {
        let text =
            std::fs::read_to_string(pidfile).map_err(|e| format!("{}: {e}", pidfile.display()))?;
        let root: i32 = text
            .trim()
            .parse()
            .map_err(|_| format!("{}: not a pid: {text:?}", pidfile.display()))?;
        let ns = pid_ns_of(root)
            .ok_or_else(|| format!("no pid namespace of the restored root {root}"))?;
        for (name, nspid) in self.nspids.clone() {
            let host = host_pid_in(ns, nspid).ok_or_else(|| {
                format!("task {name} (pid {nspid} of its namespace) was not restored")
            })?;
            self.place_task(&name, host);
        }
        Ok(())
    }

    pub(super) fn spawn_apps(&mut self) -> Result<(), String> {
        let app = self.art.mock_app.display().to_string();
        let dir = self.dir.display().to_string();
        let tasks = self.s.workload.tasks.clone();
        self.spawn_tree(&|i| {
            let t = &tasks[i];
            let mut line = String::new();
            for (k, v) in &t.env {
                let _ = write!(line, "export {k}='{}'; ", v.replace('\'', "'\\''"));
            }
            let _ = write!(
                line,
                "exec {app} --report {dir}/report{i} --threads {}",
                t.threads
            );
            if t.cuda {
                let gpus = t.gpus.clone().unwrap_or_else(|| vec![0]);
                let gpus: Vec<String> = gpus.iter().map(u32::to_string).collect();
                let _ = write!(line, " --gpus {}", gpus.join(","));
                match t.gib {
                    Some(g) => {
                        let _ = write!(line, " --gib {g}");
                    }
                    None => {
                        let _ = write!(line, " --kib {}", t.kib.unwrap_or(64));
                    }
                }
                if let Some(ms) = t.kernel_ms {
                    let _ = write!(line, " --kernel-ms {ms}");
                }
                if let Some(c) = &t.collective {
                    let size = tasks
                        .iter()
                        .filter(|o| o.collective.as_ref() == Some(c))
                        .count();
                    let _ = write!(line, " --collective {c}:{size}");
                }
            } else {
                line.push_str(" --cpu-only");
            }
            if t.seccomp {
                line.push_str(" --seccomp");
            }
            line
        })?;
        let deadline = Instant::now() + Duration::from_secs(20);
        for (i, t) in tasks.iter().enumerate() {
            let (nspid, ready) = wait_ready(&self.dir, i, &t.name, deadline)?;
            let pid = self.host_pid_of(nspid, deadline)?;
            if let Some(want) = self.s.expect.start_gpus.get(&t.name) {
                let got: Vec<&str> = field(&ready, "gpus")
                    .map(|g| g.split(',').filter(|u| !u.is_empty()).collect())
                    .unwrap_or_default();
                if got != *want {
                    return Err(format!(
                        "task {}: started on GPUs {got:?}, expected {want:?}",
                        t.name
                    ));
                }
                if self.transcript.is_empty() {
                    self.transcript.push_str("== start\n-- gpus\n");
                }
                let _ = writeln!(self.transcript, "{}: {}", t.name, got.join(","));
            }
            self.place_task(&t.name, pid);
            self.start_pids.insert(t.name.clone(), pid);
        }
        // Threads settle after READY: wait until each task has its extra threads (and, for
        // CUDA tasks, the restore thread and the driver's internal threads) so that the freeze
        // sees a stable tree.
        let internal = self
            .s
            .world
            .as_ref()
            .and_then(|w| w.get("driver")?.get("internal_threads")?.as_integer())
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        for (i, t) in tasks.iter().enumerate() {
            let pid = self.pids[&t.name];
            let want = 1
                + t.threads as usize
                + usize::from(t.cuda) * (1 + internal)
                + usize::from(t.cuda && t.kernel_ms.is_some());
            let end = Instant::now() + Duration::from_secs(5);
            while thread_count(pid) < want && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = i;
        }
        self.refresh_tids();
        Ok(())
    }

    pub(super) fn spawn_sleepers(&mut self) -> Result<(), String> {
        self.spawn_tree(&|_| "exec sleep 100000".to_owned())?;
        let deadline = Instant::now() + Duration::from_secs(5);
        let root = self.root_pid(deadline)?;
        loop {
            let mut pids = BTreeMap::new();
            if self.map_sleepers(0, root, &mut pids)
                && pids.len() == self.s.workload.tasks.len()
                && pids.values().all(|&p| comm(p) == "sleep")
            {
                for (n, p) in pids {
                    self.place_task(&n, p);
                    self.start_pids.insert(n, p);
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("workload did not start".to_owned());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn map_sleepers(&self, idx: usize, pid: i32, out: &mut BTreeMap<String, i32>) -> bool {
        out.insert(self.s.workload.tasks[idx].name.clone(), pid);
        let kids = self.children_of(idx);
        let pids = proc_children(pid);
        if pids.len() != kids.len() {
            return false;
        }
        // Children start in declaration order but may be reported in any; map by start time.
        let mut pids = pids;
        pids.sort_by_key(|&p| crate::pstree::start_time(p).unwrap_or(0));
        kids.into_iter()
            .zip(pids)
            .all(|(j, p)| self.map_sleepers(j, p, out))
    }

    fn add_task(&mut self, name: &str, pid: i32) {
        self.pids.insert(name.to_owned(), pid);
        self.names.insert(pid.to_string(), name.to_owned());
    }

    /// The world's status (an empty one without a world).
    pub(super) fn world_status(&self) -> Result<Status, String> {
        let Some(w) = &self.world else {
            return Ok(Status::default());
        };
        MockWorld::open(w)
            .and_then(|m| m.status())
            .map_err(|e| e.to_string())
    }

    pub(super) fn refresh_tids(&mut self) {
        let Ok(st) = self.world_status() else { return };
        for (name, pid) in self.pids.clone() {
            if let Some(tid) = st.process(pid).map(|p| p.restore_tid()) {
                self.tids.insert(name.clone(), tid);
                self.names
                    .insert(tid.to_string(), format!("{name}.restore"));
            }
        }
    }
}

fn proc_children(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}
