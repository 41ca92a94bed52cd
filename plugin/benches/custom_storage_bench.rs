//! `custom_storage_bench`: host staging against custom storage (CUDA 13.4), side by side in one
//! run, under real CRIU (`docs/performance.md`, "Custom storage against host staging").
//!
//! **Real part.** Trees of 1 and 4 mock CUDA tasks, each holding one `--gib` (default 1) GiB
//! allocation on a GPU of its own, filled by `mock-cuda-app --fill half-zero` (the first half
//! zeros, the second half pseudo-random). The world's `[memory] real_mib` is raised to the
//! allocation's size, so every byte is real: stored in the world's `devmem/` (in `/dev/shm`,
//! standing in for the GPU's memory), moved into the task by a host-staged checkpoint (CRIU then
//! dumps it as pages) or into `cuda-cs-*.img` by the plugin's copier. The time model is switched
//! off (`time_scale` 1e6): only real work is timed. Each round runs every configuration once, in
//! an order rotated per round, each in a fresh world and tree; `criu dump` and `criu restore -d`
//! are timed, every restored task must pass its data check. Per sample:
//! - the tasks' host memory during the dump: `/proc/<pid>/status` of each task sampled every
//!   2 ms while `criu dump` runs (peak `RssAnon`, last `VmHWM`), against the same before it;
//! - dump and restore wall time, and `syncfs` of the image directory right after the dump (the
//!   pages CRIU wrote are in the page cache; O_DIRECT files are already on disk);
//! - the bytes in the image directory: CRIU's `pages-*.img`, the copier's `cuda-cs-*.img`, the
//!   rest;
//! - with custom storage, each GPU's copy (the plugin's `custom storage dump|restore pid N gpu
//!   K: B bytes (D data, F fill) in U us` lines), against `dd` with O_DIRECT on the image
//!   directory's filesystem, measured in the same round.
//!
//! The page cache is dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`) before every dump and
//! every restore unless `--keep-caches`.
//!
//! **Virtual part.** `--virtual-tasks` (8) tasks × `--virtual-gib` (80) GiB on as many GPUs,
//! virtual allocations under the time model (`time_scale` `--virtual-scale`), host memory
//! `[host] memory_gib` large enough for host staging: the modelled copy times, and the wall
//! times, of both.
//!
//! Run: `cargo bench -p cuda-plugin --bench custom_storage_bench -- --bench [--rounds R]`
//! (root, real CRIU fetched by `scripts/fetch-criu.sh`). Without `--bench` (as `cargo test
//! --all-targets` runs it) it only says it is a benchmark and exits: it writes GiBs.

use clap::Parser;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::criu::*;

#[derive(Debug, Parser)]
#[command(
    name = "custom_storage_bench",
    about = "host staging against custom storage, real CRIU"
)]
struct Opts {
    /// A real benchmark run (cargo passes it); else nothing is run.
    #[arg(long)]
    bench: bool,
    /// Rounds of the real part.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Task counts of the real part.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    tasks: Vec<usize>,
    /// GiB per task in the real part (at most 4: `real_mib` ≤ 4096).
    #[arg(long, default_value_t = 1.0)]
    gib: f64,
    /// The workload's fill in the real part (`mock-cuda-app --fill`).
    #[arg(long, default_value = "half-zero")]
    fill: String,
    /// Tasks of the virtual part (0: none).
    #[arg(long, default_value_t = 8)]
    virtual_tasks: usize,
    /// GiB per task in the virtual part.
    #[arg(long, default_value_t = 80.0)]
    virtual_gib: f64,
    /// The virtual part's time_scale.
    #[arg(long, default_value_t = 20.0)]
    virtual_scale: f64,
    /// Rounds of the virtual part.
    #[arg(long, default_value_t = 1)]
    virtual_rounds: usize,
    /// Extra plugin options for every configuration (e.g. `parallel=1`).
    #[arg(long, value_delimiter = ',', default_value = "parallel=auto")]
    options: Vec<String>,
    /// Do not drop the page cache before each dump and restore.
    #[arg(long)]
    keep_caches: bool,
    /// Where the mock worlds live (default /dev/shm).
    #[arg(long, default_value = "/dev/shm")]
    world_dir: PathBuf,
    /// Where the images go (default: the temporary directory).
    #[arg(long)]
    image_dir: Option<PathBuf>,
    /// The CRIU to use (default: the 4.2.x of target/criu, else the 4.1.x).
    #[arg(long)]
    criu: Option<PathBuf>,
    /// Also write the tables here (markdown).
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long, hide = true)]
    list: bool,
    /// Filters passed by cargo's test runner.
    #[arg(hide = true)]
    filter: Vec<String>,
}

/// One configuration.
#[derive(Debug, Clone)]
struct Job {
    custom: bool,
    tasks: usize,
    gib: f64,
    /// Real bytes (real_mib raised, time model off) or virtual under the model.
    real: bool,
    scale: f64,
    fill: String,
    options: Vec<String>,
}

impl Job {
    fn name(&self) -> String {
        format!(
            "{} {}×{} GiB {}",
            if self.custom {
                "custom storage"
            } else {
                "host staging"
            },
            self.tasks,
            self.gib,
            if self.real { &self.fill } else { "(virtual)" }
        )
    }

    fn plugin_options(&self) -> String {
        let mut o = vec![
            "cuda_plugin.backend=driver-api".to_owned(),
            format!(
                "cuda_plugin.custom-storage={}",
                if self.custom { "on" } else { "off" }
            ),
        ];
        o.extend(self.options.iter().map(|x| format!("cuda_plugin.{x}")));
        o.join(" ")
    }

    fn world_config(&self) -> String {
        let mut t = format!(
            "schema = 1\n[driver]\nbranch = 615\n[rates]\ntime_scale = {:?}\n",
            self.scale
        );
        if self.real {
            let mib = (self.gib * 1024.0).ceil() as u64;
            t.push_str(&format!("[memory]\nreal_mib = {mib}\n"));
        } else {
            // Host staging holds every task's bytes at once.
            let gib = (self.gib * self.tasks as f64 * 1.25).ceil() + 64.0;
            t.push_str(&format!("[host]\nmemory_gib = {gib}\n"));
        }
        for g in 0..self.tasks {
            t.push_str(&format!(
                "[[gpu]]\nuuid = \"GPU-{g:08x}-0000-4000-8000-000000000000\"\nname = \"NVIDIA H200\"\nmemory_mib = 144384\nchip = \"GH100\"\n"
            ));
        }
        t
    }

    /// The modelled copy of a dump (or a restore), seconds at time_scale 1: every task at
    /// once (parallel=auto), through the driver's path (host staging) or its GPU's link alone
    /// (custom storage), all under the host ceiling.
    fn modelled_copy(&self) -> f64 {
        use mock_cuda_world::rates::{simulate, Limits};
        let bytes = (self.gib * f64::from(1u32 << 30)) as u64;
        let mut rates = mock_cuda_world::config::RatesConfig::default();
        if self.custom {
            // Custom storage bypasses the driver's copy path (docs/custom-storage.md).
            rates.driver_gbps = f64::INFINITY;
        }
        let limits = Limits::of(&rates);
        let transfers: Vec<Vec<(usize, u64)>> = (0..self.tasks).map(|i| vec![(i, bytes)]).collect();
        simulate(&transfers, &limits)
            .into_iter()
            .fold(0.0, f64::max)
    }
}

/// Host memory of one task, KiB.
#[derive(Debug, Clone, Copy, Default)]
struct Mem {
    rss_anon: u64,
    hwm: u64,
}

fn mem_of(pid: i32) -> Option<Mem> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |k: &str| -> Option<u64> {
        s.lines()
            .find_map(|l| l.strip_prefix(k))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some(Mem {
        rss_anon: field("RssAnon:")?,
        hwm: field("VmHWM:")?,
    })
}

/// A copier line: (dump?, pid, gpu, bytes, data, fill, micros, direct).
#[derive(Debug, Clone, Copy)]
struct Copy {
    bytes: u64,
    data: u64,
    micros: u64,
    direct: bool,
}

fn copies(log: &str, what: &str) -> Vec<Copy> {
    let key = format!("cuda_plugin: custom storage {what} pid ");
    log.lines()
        .filter_map(|l| {
            let rest = &l[l.find(&key)? + key.len()..];
            let (_, rest) = rest.split_once(": ")?;
            let (bytes, rest) = rest.split_once(" bytes (")?;
            let (data, rest) = rest.split_once(" data, ")?;
            let (_fill, rest) = rest.split_once(" fill) in ")?;
            let (us, rest) = rest.split_once(" us")?;
            Some(Copy {
                bytes: bytes.parse().ok()?,
                data: data.parse().ok()?,
                micros: us.parse().ok()?,
                direct: rest.contains("O_DIRECT"),
            })
        })
        .collect()
}

/// One sample's measurements.
#[derive(Debug, Clone, Default)]
struct Sample {
    dump_ms: f64,
    sync_ms: f64,
    restore_ms: f64,
    /// Sum over tasks of RssAnon before the dump, and its peak during it (KiB).
    anon_before: u64,
    anon_peak: u64,
    /// Largest VmHWM of a task, last seen during the dump (KiB).
    hwm_peak: u64,
    pages_bytes: u64,
    cs_bytes: u64,
    other_bytes: u64,
    /// Copier figures: (sum of data bytes, sum of device bytes, longest micros, all direct).
    dump_copy: Option<(u64, u64, u64, bool)>,
    restore_copy: Option<(u64, u64, u64, bool)>,
    /// Hooks' total, ms (dump, restore).
    hooks: (f64, f64),
}

fn drop_caches() {
    // A failure only leaves the caches warm (said once).
    let _ = Command::new("sync").status();
    if std::fs::write("/proc/sys/vm/drop_caches", "3").is_err() {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| eprintln!("custom_storage_bench: warning: cannot drop the page cache"));
    }
}

/// Removes a failed sample's image files (GiBs), keeping its logs.
fn drop_images(img: &Path) {
    for e in std::fs::read_dir(img).into_iter().flatten().flatten() {
        let _ = std::fs::remove_file(e.path());
    }
}

fn first_line(e: &str) -> String {
    let tail: Vec<&str> = e
        .lines()
        .filter(|l| l.contains("Error") || l.contains("Warn"))
        .take(2)
        .collect();
    format!("{} {}", e.lines().next().unwrap_or(""), tail.join(" / "))
}

fn syncfs(dir: &Path) -> R<f64> {
    let t = Instant::now();
    let st = Command::new("sync")
        .arg("-f")
        .arg(dir)
        .status()
        .map_err(|e| e.to_string())?;
    ensure!(st.success(), "sync -f {} failed", dir.display());
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

fn image_bytes(img: &Path) -> (u64, u64, u64) {
    let (mut pages, mut cs, mut other) = (0, 0, 0);
    for e in std::fs::read_dir(img).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let len = e.metadata().map(|m| m.len()).unwrap_or(0);
        if name.starts_with("pages-") {
            pages += len;
        } else if name.starts_with("cuda-cs-") {
            cs += len;
        } else {
            other += len;
        }
    }
    (pages, cs, other)
}

fn sum_copies(c: &[Copy]) -> Option<(u64, u64, u64, bool)> {
    (!c.is_empty()).then(|| {
        (
            c.iter().map(|c| c.data).sum(),
            c.iter().map(|c| c.bytes).sum(),
            c.iter().map(|c| c.micros).max().unwrap_or(0),
            c.iter().all(|c| c.direct),
        )
    })
}

fn run_sample(o: &Opts, criu: &Path, job: &Job, keep: bool) -> R<Sample> {
    let a = artifacts().as_ref().map_err(Clone::clone)?;
    let mut tb = tempfile::Builder::new();
    tb.prefix("cs-bench-");
    let dir = match &o.image_dir {
        Some(d) => tb.tempdir_in(d),
        None => tb.tempdir(),
    }
    .map_err(|e| e.to_string())?;
    let wdir = tempfile::Builder::new()
        .prefix("cs-bench-world-")
        .tempdir_in(&o.world_dir)
        .map_err(|e| e.to_string())?;
    let p = dir.path();
    let world = wdir.path().join("world");
    let (lib, img) = (p.join("plugins"), p.join("img"));
    for d in [&lib, &img] {
        std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    std::fs::copy(&a.plugin_so, lib.join("cuda_plugin.so")).map_err(|e| e.to_string())?;
    init_world(a, &world, &job.world_config())?;
    let bin = a.cuda_checkpoint.parent().unwrap_or(Path::new("/"));
    let env = |c: &mut Command| {
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        c.env("MOCK_CUDA_WORLD", &world)
            .env("LD_LIBRARY_PATH", world.join("lib"))
            .env("PATH", path)
            .env(criu_cuda_env::FORCE_ENABLE, "1")
            .env(criu_cuda_env::MEM_AVAILABLE_GIB, "4096")
            .env("CRIU_PLUGIN_OPTIONS", job.plugin_options())
            .env_remove("CUDA_VISIBLE_DEVICES");
    };
    let report = p.join("report.txt");
    let mut script = String::new();
    for i in 0..job.tasks {
        let fill = if job.real {
            format!(" --fill {}", job.fill)
        } else {
            String::new()
        };
        script.push_str(&format!(
            "{} --gpus {i} --gib {}{fill} --check-ms 200 --report {} </dev/null >/dev/null 2>&1 &\n",
            a.mock_app.display(),
            job.gib,
            report.display()
        ));
    }
    script.push_str("wait\n");
    let mut root = Command::new("/bin/sh");
    root.arg("-c").arg(&script).stdin(Stdio::null());
    root.stdout(Stdio::null()).stderr(Stdio::null());
    env(&mut root);
    in_new_session(&mut root);
    let root_pid = root.spawn().map_err(|e| e.to_string())?.id() as i32;
    let ready = |n: usize| read(&report).matches("READY ").count() >= n;
    let started = wait_until(Duration::from_secs(180), || {
        ready(job.tasks) || read(&report).contains("FAIL ")
    });
    let cleanup = || {
        for pid in processes_with_env(&format!("MOCK_CUDA_WORLD={}", world.display())) {
            signal(pid, SIGKILL);
        }
        reap();
    };
    if !started || read(&report).contains("FAIL ") {
        cleanup();
        return Err(format!("the job did not start: {}", read(&report)));
    }
    let pids: Vec<i32> = read(&report)
        .lines()
        .filter_map(|l| {
            l.strip_prefix("READY ")?
                .split_whitespace()
                .find_map(|f| f.strip_prefix("pid="))?
                .parse()
                .ok()
        })
        .collect();
    let run = |args: &[&str], log: &str| -> R<(f64, String)> {
        let mut c = Command::new(criu);
        c.args(args)
            .arg("-L")
            .arg(&lib)
            .args(["-v4", "-o"])
            .arg(p.join(log))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        env(&mut c);
        let t = Instant::now();
        let st = c.status().map_err(|e| e.to_string())?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        reap();
        let text = read(&p.join(log));
        ensure!(
            st.success(),
            "criu {} failed; log tail:\n{}",
            args[0],
            text.lines().rev().take(15).collect::<Vec<_>>().join("\n")
        );
        Ok((ms, text))
    };
    let imgs = img.display().to_string();
    let root_s = root_pid.to_string();
    let mut s = Sample {
        anon_before: pids
            .iter()
            .filter_map(|&p| mem_of(p))
            .map(|m| m.rss_anon)
            .sum(),
        ..Sample::default()
    };
    if !o.keep_caches {
        drop_caches();
    }
    // Sample the tasks' memory while CRIU dumps them.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, pids) = (stop.clone(), pids.clone());
        std::thread::spawn(move || {
            let (mut peak, mut hwm) = (0u64, 0u64);
            let mut last: BTreeMap<i32, Mem> = BTreeMap::new();
            while !stop.load(Ordering::Relaxed) {
                for &p in &pids {
                    if let Some(m) = mem_of(p) {
                        last.insert(p, m);
                    }
                }
                peak = peak.max(last.values().map(|m| m.rss_anon).sum());
                hwm = hwm.max(last.values().map(|m| m.hwm).max().unwrap_or(0));
                std::thread::sleep(Duration::from_millis(2));
            }
            (peak, hwm)
        })
    };
    let dumped = run(&["dump", "-t", &root_s, "-D", &imgs], "dump.log");
    stop.store(true, Ordering::Relaxed);
    let (peak, hwm) = sampler.join().unwrap_or((0, 0));
    let (dump_ms, dlog) = match dumped {
        Ok(x) => x,
        Err(e) => {
            cleanup();
            drop_images(&img);
            eprintln!(
                "    kept {} (logs; the world and the images removed)",
                dir.keep().display()
            );
            return Err(e);
        }
    };
    s.dump_ms = dump_ms;
    s.anon_peak = peak;
    s.hwm_peak = hwm;
    s.sync_ms = syncfs(&img)?;
    (s.pages_bytes, s.cs_bytes, s.other_bytes) = image_bytes(&img);
    s.dump_copy = sum_copies(&copies(&dlog, "dump"));
    let mut all = pids.clone();
    all.push(root_pid);
    wait_pids_gone(&all, Duration::from_secs(60))?;
    if !o.keep_caches {
        drop_caches();
    }
    let restored = run(&["restore", "-D", &imgs, "-d"], "restore.log");
    let (restore_ms, rlog) = match restored {
        Ok(x) => x,
        Err(e) => {
            cleanup();
            drop_images(&img);
            eprintln!(
                "    kept {} (logs; the world and the images removed)",
                dir.keep().display()
            );
            return Err(e);
        }
    };
    s.restore_ms = restore_ms;
    s.restore_copy = sum_copies(&copies(&rlog, "restore"));
    let before = read(&report).matches("PASS ").count();
    for &pid in &pids {
        signal(pid, SIGUSR1);
    }
    let passed = wait_until(Duration::from_secs(60), || {
        read(&report).matches("PASS ").count() >= before + pids.len()
            || read(&report).contains("FAIL ")
    });
    cleanup();
    ensure!(
        passed && !read(&report).contains("FAIL "),
        "data check after the restore: {}",
        read(&report)
    );
    let hooks = |log: &str| hook_times(log).iter().map(|(_, _, ms)| ms).sum::<f64>();
    s.hooks = (hooks(&dlog), hooks(&rlog));
    if keep {
        eprintln!(
            "    kept {} and {}",
            dir.keep().display(),
            wdir.keep().display()
        );
    }
    Ok(s)
}

/// `dd` of `mib` MiB with O_DIRECT in `dir`: (write MB/s, read MB/s), 1e6 bytes per MB.
fn dd(dir: &Path, mib: u64) -> R<(f64, f64)> {
    let file = dir.join("cs-bench-dd.bin");
    let count = mib.div_ceil(16).max(1);
    let timed = |args: Vec<String>| -> R<f64> {
        let t = Instant::now();
        let out = Command::new("dd")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| e.to_string())?;
        let secs = t.elapsed().as_secs_f64();
        ensure!(
            out.status.success(),
            "dd {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((count * 16 * (1 << 20)) as f64 / secs / 1e6)
    };
    let w = timed(vec![
        "if=/dev/zero".into(),
        format!("of={}", file.display()),
        "bs=16M".into(),
        format!("count={count}"),
        "oflag=direct".into(),
        "conv=fsync".into(),
    ]);
    drop_caches();
    let r = timed(vec![
        format!("if={}", file.display()),
        "of=/dev/null".into(),
        "bs=16M".into(),
        "iflag=direct".into(),
    ]);
    let _ = std::fs::remove_file(&file);
    Ok((w?, r?))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn mib(b: f64) -> f64 {
    b / f64::from(1u32 << 20)
}

fn main() -> std::process::ExitCode {
    let o = Opts::parse();
    if o.list {
        println!("custom_storage_bench: benchmark");
        return std::process::ExitCode::SUCCESS;
    }
    if !o.bench {
        eprintln!("custom_storage_bench: skipped: a benchmark (writes GiBs); run it with --bench");
        return std::process::ExitCode::SUCCESS;
    }
    if !is_root() {
        eprintln!("custom_storage_bench: skipped: not root");
        return std::process::ExitCode::SUCCESS;
    }
    let criu = match o.criu.clone().or_else(|| {
        let mut c = find_criu();
        c.sort_by_key(|c| std::cmp::Reverse(c.series));
        c.into_iter().next().map(|c| c.path)
    }) {
        Some(c) => c,
        None => {
            eprintln!("custom_storage_bench: skipped: no CRIU (run scripts/fetch-criu.sh)");
            return std::process::ExitCode::SUCCESS;
        }
    };
    if !become_subreaper() {
        eprintln!("custom_storage_bench: warning: cannot become a child subreaper");
    }
    let keep = std::env::var("CRIU_BENCH_KEEP").is_ok_and(|v| v == "1");
    let image_fs = o.image_dir.clone().unwrap_or_else(std::env::temp_dir);
    // Per task count: host staging and custom storage with --fill, then custom storage with
    // every byte random (the copier's rate against dd with no fills to skip).
    let mut real = Vec::new();
    let random = "random".to_owned();
    for &n in &o.tasks {
        for (custom, fill) in [(false, &o.fill), (true, &o.fill), (true, &random)] {
            real.push(Job {
                custom,
                tasks: n,
                gib: o.gib,
                real: true,
                scale: 1e6,
                fill: fill.clone(),
                options: o.options.clone(),
            });
        }
    }
    let fail = |what: &str, e: String| {
        eprintln!("custom_storage_bench: {what}: {e}");
        std::process::ExitCode::FAILURE
    };
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); real.len()];
    // A failed sample (an OOM kill on a shared machine, say) is reported, not fatal.
    let mut failures: Vec<String> = Vec::new();
    let mut dds: Vec<(f64, f64)> = Vec::new();
    let dd_mib = (o.gib * 1024.0).round() as u64;
    for round in 0..o.rounds {
        match dd(&image_fs, dd_mib) {
            Ok(r) => {
                eprintln!(
                    "round {}: dd {dd_mib} MiB O_DIRECT: write {:.0} MB/s, read {:.0} MB/s",
                    round + 1,
                    r.0,
                    r.1
                );
                dds.push(r);
            }
            Err(e) => return fail("dd", e),
        }
        for k in 0..real.len() {
            let i = (k + round) % real.len();
            match run_sample(&o, &criu, &real[i], keep) {
                Ok(s) => {
                    eprintln!(
                        "round {}: {}: dump {:.0} ms (+sync {:.0}), restore {:.0} ms, RssAnon {} -> peak {} MiB, images {:.0} MiB",
                        round + 1,
                        real[i].name(),
                        s.dump_ms,
                        s.sync_ms,
                        s.restore_ms,
                        s.anon_before / 1024,
                        s.anon_peak / 1024,
                        mib((s.pages_bytes + s.cs_bytes + s.other_bytes) as f64)
                    );
                    samples[i].push(s);
                }
                Err(e) => {
                    eprintln!("round {}: {}: FAILED: {e}", round + 1, real[i].name());
                    failures.push(format!(
                        "round {}: {}: {}",
                        round + 1,
                        real[i].name(),
                        first_line(&e)
                    ));
                }
            }
        }
    }
    // Tables.
    let m = |s: &[Sample], f: &dyn Fn(&Sample) -> f64| median(s.iter().map(f).collect());
    let dd_w = median(dds.iter().map(|d| d.0).collect());
    let dd_r = median(dds.iter().map(|d| d.1).collect());
    let mut t = format!(
        "CRIU {}, {} round(s) of the real part, medians; fill `{}`; dd O_DIRECT {dd_mib} MiB on {}: write {dd_w:.0} MB/s, read {dd_r:.0} MB/s (medians of {:?})\n\n",
        criu.display(),
        o.rounds,
        o.fill,
        image_fs.display(),
        dds.iter().map(|d| (d.0.round(), d.1.round())).collect::<Vec<_>>()
    );
    t.push_str("### Real allocations: absolute (medians)\n\n| configuration | dump ms | dump+syncfs ms | restore ms | tasks' RssAnon before → peak during dump, MiB | max task VmHWM, MiB | pages-*.img MiB | cuda-cs-*.img MiB | other MiB |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (job, s) in real.iter().zip(&samples) {
        t.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} → {:.0} | {:.0} | {:.1} | {:.1} | {:.1} |\n",
            job.name(),
            m(s, &|s| s.dump_ms),
            m(s, &|s| s.dump_ms + s.sync_ms),
            m(s, &|s| s.restore_ms),
            m(s, &|s| s.anon_before as f64 / 1024.0),
            m(s, &|s| s.anon_peak as f64 / 1024.0),
            m(s, &|s| s.hwm_peak as f64 / 1024.0),
            m(s, &|s| mib(s.pages_bytes as f64)),
            m(s, &|s| mib(s.cs_bytes as f64)),
            m(s, &|s| mib(s.other_bytes as f64)),
        ));
    }
    t.push_str("\n### Real allocations: custom storage ÷ host staging (ratios of the medians)\n\n| tasks | dump | dump+syncfs | restore | dump+restore | peak GPU bytes staged in the tasks (RssAnon peak − before) | image bytes |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    for pair in real.chunks(3).zip(samples.chunks(3)) {
        let (jobs, ss) = pair;
        let (h, c) = (&ss[0], &ss[1]);
        let ratio = |f: &dyn Fn(&Sample) -> f64| {
            median(c.iter().map(f).collect()) / median(h.iter().map(f).collect())
        };
        let staged = |s: &Sample| s.anon_peak.saturating_sub(s.anon_before) as f64 / 1024.0;
        t.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} MiB vs {:.0} MiB | {:.2} |\n",
            jobs[0].tasks,
            ratio(&|s| s.dump_ms),
            ratio(&|s| s.dump_ms + s.sync_ms),
            ratio(&|s| s.restore_ms),
            ratio(&|s| s.dump_ms + s.restore_ms),
            m(c, &staged),
            m(h, &staged),
            ratio(&|s| (s.pages_bytes + s.cs_bytes + s.other_bytes) as f64),
        ));
    }
    t.push_str("\n### Custom storage: the copier's rate against dd (O_DIRECT, same filesystem, same run)\n\n`data` is the bytes written to (read from) the files; `device` the GPU bytes covered (fills included). Several tasks: the sum of their bytes over the longest GPU copy.\n\n| tasks | fill | dump data MB/s | dump device MB/s | data ÷ dd write | restore data MB/s | restore device MB/s | data ÷ dd read | O_DIRECT |\n|---:|---|---:|---:|---:|---:|---:|---:|---|\n");
    for (job, s) in real.iter().zip(&samples).filter(|(j, _)| j.custom) {
        let rate = |c: Option<(u64, u64, u64, bool)>, device: bool| {
            c.map_or(f64::NAN, |(d, b, us, _)| {
                (if device { b } else { d }) as f64 / us.max(1) as f64
            })
        };
        let dw = m(s, &|s| rate(s.dump_copy, false));
        let rw = m(s, &|s| rate(s.restore_copy, false));
        let direct = s
            .iter()
            .all(|s| s.dump_copy.is_some_and(|c| c.3) && s.restore_copy.is_some_and(|c| c.3));
        t.push_str(&format!(
            "| {} | {} | {dw:.0} | {:.0} | {:.2} | {rw:.0} | {:.0} | {:.2} | {} |\n",
            job.tasks,
            job.fill,
            m(s, &|s| rate(s.dump_copy, true)),
            dw / dd_w,
            m(s, &|s| rate(s.restore_copy, true)),
            rw / dd_r,
            if direct { "yes" } else { "no" },
        ));
    }
    // The real part's tables now: the virtual part can take minutes.
    print!("{t}");
    if let Some(out) = &o.out {
        let _ = std::fs::write(out, &t);
    }
    let real_len = t.len();
    let mut virt = Vec::new();
    if o.virtual_tasks > 0 {
        for custom in [false, true] {
            virt.push(Job {
                custom,
                tasks: o.virtual_tasks,
                gib: o.virtual_gib,
                real: false,
                scale: o.virtual_scale,
                fill: "set".into(),
                options: o.options.clone(),
            });
        }
    }
    let mut vsamples: Vec<Vec<Sample>> = vec![Vec::new(); virt.len()];
    for round in 0..o.virtual_rounds {
        for k in 0..virt.len() {
            let i = (k + round) % virt.len();
            match run_sample(&o, &criu, &virt[i], keep) {
                Ok(s) => {
                    eprintln!(
                        "virtual round {}: {}: dump {:.0} ms, restore {:.0} ms",
                        round + 1,
                        virt[i].name(),
                        s.dump_ms,
                        s.restore_ms
                    );
                    vsamples[i].push(s);
                }
                Err(e) => {
                    eprintln!(
                        "virtual round {}: {}: FAILED: {e}",
                        round + 1,
                        virt[i].name()
                    );
                    failures.push(format!(
                        "virtual round {}: {}: {}",
                        round + 1,
                        virt[i].name(),
                        first_line(&e)
                    ));
                }
            }
        }
    }

    if !virt.is_empty() {
        t.push_str(&format!(
            "\n### Virtual allocations under the time model: {} tasks × {} GiB on {} GPUs, time_scale {}\n\nModelled copy: each way, at time_scale 1, every task at once. Wall times are measured at time_scale {} (what the model makes them, plus the plugin, the mock and CRIU).\n\n| configuration | modelled copy s (each way) | dump ms | restore ms | dump+restore ms | images MiB |\n|---|---:|---:|---:|---:|---:|\n",
            o.virtual_tasks, o.virtual_gib, o.virtual_tasks, o.virtual_scale, o.virtual_scale
        ));
        for (job, s) in virt.iter().zip(&vsamples) {
            t.push_str(&format!(
                "| {} | {:.2} | {:.0} | {:.0} | {:.0} | {:.1} |\n",
                job.name(),
                job.modelled_copy(),
                m(s, &|s| s.dump_ms),
                m(s, &|s| s.restore_ms),
                m(s, &|s| s.dump_ms + s.restore_ms),
                m(s, &|s| mib(
                    (s.pages_bytes + s.cs_bytes + s.other_bytes) as f64
                )),
            ));
        }
        if virt.len() == 2 && vsamples.iter().all(|s| !s.is_empty()) {
            let (h, c) = (&vsamples[0], &vsamples[1]);
            t.push_str(&format!(
                "\ncustom storage ÷ host staging: modelled copy {:.2}, dump {:.2}, restore {:.2}, dump+restore {:.2}\n",
                virt[1].modelled_copy() / virt[0].modelled_copy(),
                m(c, &|s| s.dump_ms) / m(h, &|s| s.dump_ms),
                m(c, &|s| s.restore_ms) / m(h, &|s| s.restore_ms),
                m(c, &|s| s.dump_ms + s.restore_ms) / m(h, &|s| s.dump_ms + s.restore_ms),
            ));
        }
    }
    t.push_str(&format!(
        "\nSamples: {} per real configuration ({}), {} per virtual one; failed samples: {}\n",
        o.rounds,
        samples
            .iter()
            .map(|s| s.len().to_string())
            .collect::<Vec<_>>()
            .join("/"),
        o.virtual_rounds,
        if failures.is_empty() {
            "none".to_owned()
        } else {
            failures.join("; ")
        }
    ));
    print!("{}", &t[real_len..]);
    if let Some(out) = &o.out {
        if let Err(e) = std::fs::write(out, &t) {
            return fail(&out.display().to_string(), e.to_string());
        }
    }
    std::process::ExitCode::SUCCESS
}
