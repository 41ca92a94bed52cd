use super::*;
use crate::pidns::{self, NsIdentity};
use crate::state::{CheckpointedGpu, ProcessEntry};
use crate::transfers::Progress;
use crate::transfers::{Direction, GpuProgress};
use abi::CUprocessState;
use proptest::prelude::*;
use std::collections::BTreeMap;

const BASE: &str = "schema = 1\n[driver]\nbranch = 580\n\n[[gpu]]\n\
    uuid = \"GPU-00000000-0000-4000-8000-000000000000\"\nname = \"NVIDIA H100 80GB HBM3\"\n\
    memory_mib = 64\nchip = \"GH100\"\n";

/// Any dynamically linked ELF stands in for the built libraries: the test executable.
fn an_elf() -> PathBuf {
    PathBuf::from("/proc/self/exe")
}

fn entry(pid: i32, ns: u64, nspid: i32, state: CUprocessState) -> ProcessEntry {
    crate::state::test_entry(pid, ns, nspid, state)
}

#[test]
fn init_configure_and_status_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("world");
    let w = MockWorld::init(&dir, BASE, &an_elf(), Some(&an_elf())).unwrap();
    assert_eq!(w.dir(), dir);
    for f in ["world.toml", "state.json", "trace.log", "lib/libcuda.so.1"] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    assert!(
        w.has_nvml(),
        "the config wants NVML and the stand-in was given"
    );
    let cfg = w.config().unwrap();
    assert_eq!(cfg.driver.branch, 580);
    assert_eq!(cfg.gpus.len(), 1);
    assert!(cfg.faults.is_empty());
    let before = w.state().unwrap();
    assert_eq!(before.host_pid_ns, pidns::own_pid_ns().unwrap_or(0));
    assert_eq!(w.trace(), "");

    // A fault added by TOML table, then NVML taken away by typed config: the state stays.
    let mut t: toml::Table = toml::from_str(BASE).unwrap();
    let fault: toml::Table = toml::from_str(
        "function = \"cuInit\"\nnth = 2\naction = { kind = \"return\", code = \"CUDA_ERROR_UNKNOWN\" }",
    )
    .unwrap();
    t.insert(
        "fault".into(),
        toml::Value::Array(vec![toml::Value::Table(fault)]),
    );
    w.configure(&t).unwrap();
    let cfg = w.config().unwrap();
    assert_eq!(cfg.faults.len(), 1);
    assert_eq!(cfg.faults[0].function, "cuInit");
    assert_eq!(cfg.faults[0].nth, 2);
    assert!(w.has_nvml(), "still wanted: kept");
    let mut no_nvml = cfg.clone();
    no_nvml.nvml.present = false;
    w.configure(&no_nvml).unwrap();
    assert!(!w.has_nvml(), "[nvml] present = false removes it");
    assert_eq!(w.state().unwrap(), before, "configure keeps the state");
    assert_eq!(w.fault_count(0).unwrap(), 0);

    // Fault counters and processes written by the driver show in the status.
    let world = w.world().unwrap();
    world
        .update(|st| {
            st.fault_counts.insert(0, 3);
            let id = st.new_id();
            st.processes
                .insert(id, entry(0, 1, 77, CUprocessState::CHECKPOINTED));
        })
        .unwrap();
    assert_eq!(w.fault_count(0).unwrap(), 3);
    assert_eq!(w.fault_count(1).unwrap(), 0);
    let st = w.status().unwrap();
    assert_eq!(st.fault_count(0), 3);
    assert_eq!(st.processes.len(), 1);
    let p = &st.processes[0];
    assert_eq!(p.state(), CudaState::Checkpointed);
    assert_eq!(p.host_pid(), None);
    assert_eq!(p.key(), format!("id{}", p.id));
    assert_eq!(p.restore_tid(), 78, "not found: the recorded tid");

    // Opened again, by directory: the same status.
    let again = MockWorld::open(&dir).unwrap();
    assert_eq!(again.status().unwrap(), st);
}

#[test]
fn a_world_without_processes_has_an_empty_status() {
    let tmp = tempfile::tempdir().unwrap();
    let w = MockWorld::init(tmp.path(), BASE, &an_elf(), None).unwrap();
    assert!(!w.has_nvml(), "no stand-in given: no NVML");
    let st = w.status().unwrap();
    assert!(st.processes.is_empty() && st.transfers.is_empty());
    assert!(st.fault_counts.is_empty());
    assert_eq!(st.state_of(std::process::id() as i32), CudaState::None);
    assert_eq!(st.process(1), None);
    assert_eq!(
        st.table(),
        "     pid      tid state          allocs           bytes          staged  nspid       pid-ns  gpus\n"
    );
    let v: serde_json::Value = serde_json::from_str(&st.to_json()).unwrap();
    assert_eq!(v["processes"], serde_json::json!({}));
    assert_eq!(v["transfers"], serde_json::json!([]));
    assert_eq!(v["format"], "mock-cuda-world-state");
    assert_eq!(v["version"], crate::state::STATE_VERSION);
    assert_eq!(
        Status::default().processes,
        st.processes,
        "the default is an empty world"
    );
}

#[test]
fn bad_configs_are_named_errors_and_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("w");
    let bad = BASE.replace("schema = 1", "schema = 9");
    let e = MockWorld::init(&dir, &bad, &an_elf(), None).unwrap_err();
    assert!(matches!(e, ClientError::Config { .. }), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains(&dir.display().to_string())
            && m.contains("TOML text")
            && m.contains("schema 9 is not supported"),
        "{m}"
    );
    assert!(!dir.join("world.toml").exists(), "nothing written");

    let w = MockWorld::init(&dir, BASE, &an_elf(), None).unwrap();
    let before = std::fs::read_to_string(dir.join("world.toml")).unwrap();
    let e = w
        .configure(&format!("{BASE}\n[driver2]\nx = 1\n"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&dir.display().to_string()) && e.contains("driver2"),
        "{e}"
    );
    let missing = tmp.path().join("no-such.toml");
    let e = w.configure(ConfigSource::File(&missing)).unwrap_err();
    assert!(matches!(e, ClientError::ConfigFile { .. }), "{e:?}");
    assert!(e.to_string().contains("no-such.toml"), "{e}");
    let file = tmp.path().join("bad.toml");
    std::fs::write(&file, "schema = 1\n").unwrap();
    let e = w
        .configure(ConfigSource::File(&file))
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad.toml") && e.contains("driver"), "{e}");
    assert_eq!(
        std::fs::read_to_string(dir.join("world.toml")).unwrap(),
        before,
        "a refused config leaves the world as it was"
    );

    let e = MockWorld::open(tmp.path()).unwrap_err();
    assert!(matches!(e, ClientError::Open { .. }), "{e:?}");
    assert!(
        e.to_string().contains(&tmp.path().display().to_string()),
        "{e}"
    );
    std::fs::write(dir.join("state.json"), "{ not json").unwrap();
    let e = w.status().unwrap_err().to_string();
    assert!(
        e.contains("state.json") && e.contains("not valid JSON"),
        "{e}"
    );
}

/// A live process (this one, with a thread named as a restore thread), a dead one and one whose
/// host pid was never known, with a transfer in progress: located, keyed and printed as
/// `mock-world status` always did.
#[test]
fn status_locates_processes_and_keys_them_by_host_pid() {
    let tmp = tempfile::tempdir().unwrap();
    let w = MockWorld::init(tmp.path(), BASE, &an_elf(), None).unwrap();
    let world = w.world().unwrap();
    let me = std::process::id() as i32;
    let ns = pidns::own_pid_ns().unwrap();
    // A child that is gone (reaped): its pid names no process of the world.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    let dead = child.id() as i32;
    let (live, gone, unknown) = world
        .update(|st| {
            let ids = (st.new_id(), st.new_id(), st.new_id());
            let mut e = entry(me, ns, me, CUprocessState::LOCKED);
            e.allocations.push(crate::state::Allocation {
                id: 1,
                size: 4096,
                gpu: cfg_gpu(),
                sampled: false,
            });
            e.contexts.push(cfg_gpu());
            st.processes.insert(ids.0, e);
            let mut e = entry(dead, ns, dead, CUprocessState::CHECKPOINTED);
            e.checkpointed.push(CheckpointedGpu {
                uuid: cfg_gpu(),
                chip: "GH100".into(),
                bytes: 1000,
            });
            st.processes.insert(ids.1, e);
            st.processes
                .insert(ids.2, entry(0, ns, 999_999, CUprocessState::RUNNING));
            ids
        })
        .unwrap();
    world
        .write_progress(&Progress {
            id: live,
            pid: me,
            identity: NsIdentity { ns, pid: me },
            request: 1,
            direction: Direction::Checkpoint,
            gpus: vec![GpuProgress {
                uuid: cfg_gpu(),
                total: 4096,
                moved: 1024,
            }],
        })
        .unwrap();

    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, park) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name(pidns::restore_thread_name(live))
        .spawn(move || {
            tx.send(nix::unistd::gettid().as_raw()).unwrap();
            let _ = park.recv();
        })
        .unwrap();
    let tid = rx.recv().unwrap();
    let st = w.status();
    stop.send(()).unwrap();
    thread.join().unwrap();
    let st = st.unwrap();

    let p = st.process(me).expect("this process, by its pid");
    assert_eq!(p.id, live);
    assert_eq!(p.present, Presence::Here);
    assert_eq!(p.state(), CudaState::Locked);
    assert_eq!(p.restore_tid_here(), Some(tid));
    assert_eq!(p.restore_tid(), tid, "the tid seen from here");
    assert_eq!(p.allocated_bytes(), 4096);
    assert_eq!(p.staged_bytes(), 1024, "what the checkpoint staged so far");
    assert_eq!(p.transfer().map(Progress::moved), Some(1024));
    let d = st.process(dead).expect("the dead process, by its last pid");
    assert_eq!((d.id, d.present), (gone, Presence::Gone));
    assert_eq!(d.restore_tid_here(), None);
    assert_eq!(d.restore_tid(), dead + 1, "the recorded tid");
    assert_eq!(d.staged_bytes(), 1000, "a checkpoint holds all of it");
    assert_eq!(st.state_of(dead), CudaState::Checkpointed);
    let u = &st.keyed()[&format!("id{unknown}")];
    assert_eq!((u.host_pid(), u.present), (None, Presence::Gone));
    assert_eq!(st.transfers.len(), 1);

    let v: serde_json::Value = serde_json::from_str(&st.to_json()).unwrap();
    let here = &v["processes"][me.to_string()];
    assert_eq!(here["id"], live);
    assert_eq!(here["present"], "here");
    assert_eq!(here["restore_tid"], tid);
    assert_eq!(here["state"], 1);
    assert_eq!(here["pid"], me);
    assert_eq!(v["processes"][dead.to_string()]["present"], "gone");
    assert_eq!(v["processes"][format!("id{unknown}")]["state"], 0);
    assert_eq!(v["transfers"][0]["id"], live);

    let table = st.table();
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    let me_s = me.to_string();
    let tid_s = tid.to_string();
    let ns_s = ns.to_string();
    assert_eq!(
        rows[0],
        [
            me_s.as_str(),
            &tid_s,
            "locked",
            "1",
            "4096",
            "1024",
            &me_s,
            &ns_s,
            &cfg_gpu().0.to_string()
        ],
        "{table}"
    );
    assert_eq!(
        rows[1],
        [
            "checkpoint",
            "in",
            "progress:",
            "1024",
            "of",
            "4096",
            "bytes",
            "moved"
        ],
        "{table}"
    );
    assert_eq!(
        rows[2][..4],
        [dead.to_string().as_str(), "-", "checkpointed", "0"]
    );
    assert_eq!(rows[3][..3], ["?", "-", "running"], "{table}");
}

fn cfg_gpu() -> crate::config::GpuUuidText {
    let cfg = WorldConfig::parse(BASE, "t").unwrap();
    cfg.gpus[0].uuid
}

#[test]
fn cuda_state_names_are_the_harness_s_words() {
    for (raw, name) in [
        (0, "running"),
        (1, "locked"),
        (2, "checkpointed"),
        (3, "failed"),
        (4, "checkpointing"),
        (5, "restoring"),
        (77, "other"),
    ] {
        assert_eq!(CudaState::from_raw(raw).name(), name, "{raw}");
        assert_eq!(CudaState::from(CUprocessState(raw)).to_string(), name);
    }
    assert_eq!(CudaState::None.name(), "none");
    assert_eq!(CudaState::from_raw(9), CudaState::Other(9));
}

/// The JSON status is the state file with the processes (their entry files, keyed by host pid)
/// and `transfers` added; each process is its state entry with `id` and `present` added: a
/// field added to either shows.
#[test]
fn the_json_status_has_every_field_of_the_state() {
    let mut state = StateFile::default();
    let mut e = entry(5, 1, 5, CUprocessState::RUNNING);
    e.reserved.push(CheckpointedGpu {
        uuid: cfg_gpu(),
        chip: "GH100".into(),
        bytes: 1,
    });
    state.processes.insert(1, e.clone());
    let keys = |v: &serde_json::Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    let st = Status::assemble(state.clone(), Vec::new(), |_, _| {
        (pidns::Presence::Gone, None)
    });
    let v = serde_json::to_value(&st).unwrap();
    let mut want = keys(&serde_json::to_value(&state).unwrap());
    want.extend(["processes".to_owned(), "transfers".to_owned()]);
    want.sort();
    assert_eq!(keys(&v), want);
    let mut want = keys(&serde_json::to_value(&e).unwrap());
    want.extend(["id".to_owned(), "present".to_owned()]);
    want.sort();
    assert_eq!(keys(&v["processes"]["5"]), want);
}

fn presence() -> impl Strategy<Value = pidns::Presence> {
    prop_oneof![
        (1i32..6).prop_map(pidns::Presence::Here),
        Just(pidns::Presence::Gone),
        Just(pidns::Presence::Unknown),
    ]
}

proptest! {
    /// Processes are keyed by host pid (found now, else recorded; `id<N>` when never known),
    /// a live process wins a reused pid, else the first by world id; the JSON, `keyed`,
    /// `process` and `state_of` agree.
    #[test]
    fn processes_are_keyed_as_the_json_status_files_them(
        procs in proptest::collection::vec((0i32..6, 0u32..5, presence()), 0..8),
    ) {
        let mut state = StateFile::default();
        let mut found = BTreeMap::new();
        for (i, (pid, s, p)) in procs.iter().enumerate() {
            let id = 100 + i as u64;
            state.processes.insert(id, entry(*pid, 1, 1, CUprocessState(*s)));
            found.insert(id, *p);
        }
        let st = Status::assemble(state, Vec::new(), |id, _| (found[&id], None));
        let keyed = st.keyed();
        let v = serde_json::to_value(&st).unwrap();
        let json: Vec<&String> = v["processes"].as_object().unwrap().keys().collect();
        prop_assert_eq!(json, keyed.keys().collect::<Vec<_>>());
        for p in &st.processes {
            let want_pid = match found[&p.id] {
                pidns::Presence::Here(h) => h,
                _ => p.entry.pid,
            };
            prop_assert_eq!(p.host_pid(), (want_pid > 0).then_some(want_pid));
            let same: Vec<&ProcessStatus> =
                st.processes.iter().filter(|q| q.key() == p.key()).collect();
            let winner = same
                .iter()
                .rev()
                .find(|q| q.present == Presence::Here)
                .unwrap_or(&same[0]);
            prop_assert_eq!(keyed[&p.key()].id, winner.id);
            prop_assert_eq!(&v["processes"][p.key()]["id"], &serde_json::json!(winner.id));
            if let Some(h) = p.host_pid() {
                prop_assert_eq!(st.process(h).map(|q| q.id), Some(winner.id));
                prop_assert_eq!(st.state_of(h), winner.state());
            }
        }
        for pid in 0..6 {
            if !keyed.contains_key(&pid.to_string()) {
                prop_assert_eq!(st.state_of(pid), CudaState::None);
            }
        }
    }

    /// A config given as text, as a TOML table, as a typed config or in a file loads to the
    /// same config; one each refuses is refused by all, naming the world and the source.
    #[test]
    fn every_config_source_loads_the_same_config(
        branch in prop_oneof![Just(550u32), Just(570), Just(580), Just(590)],
        gpus in 0usize..3,
        timeout in proptest::option::of(1u64..100_000),
        nth in 0u32..4,
        schema in prop_oneof![3 => Just(1u32), 1 => 0u32..4],
    ) {
        let mut text = format!("schema = {schema}\n[driver]\nbranch = {branch}\n");
        if let Some(t) = timeout {
            text.push_str(&format!("request_timeout_ms = {t}\n"));
        }
        for g in 0..gpus {
            text.push_str(&format!(
                "\n[[gpu]]\nuuid = \"GPU-0000000{g}-0000-4000-8000-000000000000\"\n\
                 name = \"G\"\nmemory_mib = 64\nchip = \"GH100\"\n"
            ));
        }
        text.push_str(&format!(
            "\n[[fault]]\nfunction = \"cuInit\"\nnth = {nth}\n\
             action = {{ kind = \"return\", code = \"CUDA_ERROR_UNKNOWN\" }}\n"
        ));
        let dir = Path::new("/nonexistent/world");
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("c.toml");
        std::fs::write(&file, &text).unwrap();
        let table: toml::Table = toml::from_str(&text).unwrap();
        let from_text = ConfigSource::Text(&text).load(dir);
        let from_table = ConfigSource::Table(&table).load(dir);
        let from_file = ConfigSource::File(&file).load(dir);
        match from_text {
            Ok(c) => {
                prop_assert_eq!(c.driver.branch, branch);
                prop_assert_eq!(c.gpus.len(), gpus);
                prop_assert_eq!(&from_table.unwrap(), &c);
                prop_assert_eq!(&from_file.unwrap(), &c);
                prop_assert_eq!(&ConfigSource::Typed(&c).load(dir).unwrap(), &c);
            }
            Err(e) => {
                for (got, origin) in [
                    (Err(e), "TOML text".to_owned()),
                    (from_table, "TOML table".to_owned()),
                    (from_file, file.display().to_string()),
                ] {
                    let m = got.unwrap_err().to_string();
                    prop_assert!(
                        m.starts_with("mock world /nonexistent/world: bad config (")
                            && m.contains(&origin),
                        "{}", m
                    );
                }
                prop_assert!(schema != 1 || nth == 0, "refused a valid config");
            }
        }
    }
}
