//! `scale_bench`: dump + restore of CUDA jobs at the sizes real GPUs hold, under real CRIU, with
//! the mock world's time model (`docs/mock-world.md`, "The mock world at scale").
//!
//! One **job** is a tree: a shell (the CRIU root) starting `--tasks` mock CUDA processes, task
//! `i` on GPU `i % --gpus`, each holding `--gib` GiB of virtual device memory. Every
//! configuration given (`--job NAME:TASKS:GPUS:GIB[:OPTIONS]`, repeatable) is run once per
//! round, in an order rotated per round; medians over the rounds are reported. Each sample
//! uses a fresh world and tree; the `criu dump` and `criu restore -d` processes
//! are timed, and after each restore every task must pass its data check.
//!
//! Reported per configuration: dump and restore wall time; the time the driver's modelled
//! copies take (each task's bytes over the world's rates); the plugin's hooks' total (from its
//! `done in X ms` lines); the plugin's own share (hook time minus the modelled copy time); and
//! CRIU's share (the rest). Virtual device memory stores only a sample of each allocation, so
//! CRIU's own page writing is not done at full size: the `real` option (`real_mib` raised so
//! every byte is stored, at most 4 GiB per allocation) makes a configuration real end to end.
//!
//! Run: `cargo bench -p cuda-plugin --bench scale_bench -- --bench [--rounds R] [--job ...]`
//! (root, real CRIU fetched by `scripts/fetch-criu.sh`). Without `--bench` (as `cargo test
//! --all-targets` runs it) it is a smoke test: one round of a 1 GiB job at a scaled rate.

use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testkit::criu::*;

#[derive(Debug, Parser)]
#[command(
    name = "scale_bench",
    about = "dump + restore of CUDA jobs at scale, real CRIU"
)]
struct Opts {
    /// A real benchmark run (cargo passes it); else a smoke test.
    #[arg(long)]
    bench: bool,
    /// Rounds.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// A configuration: NAME:TASKS:GPUS:GIB[:OPTION,...] where OPTION is a plugin option
    /// (`backend=cuda-checkpoint`), `scale=N` (the world's time_scale), `real` (every byte
    /// stored) or `c-plugin` (CRIU's own C plugin of the same CRIU, built by
    /// `scripts/fetch-criu.sh --c-plugin`, instead of ours; it takes no plugin options).
    /// Default: 1, 10 and 80 GiB in one task, and 1 GiB real.
    #[arg(long = "job", value_name = "SPEC")]
    jobs: Vec<String>,
    /// The CRIU to use (default: the 4.2.x of target/criu, else the 4.1.x).
    #[arg(long)]
    criu: Option<PathBuf>,
    /// Also write the table here (markdown).
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long, hide = true)]
    list: bool,
    /// Filters passed by cargo's test runner.
    #[arg(hide = true)]
    filter: Vec<String>,
}

#[derive(Debug, Clone)]
struct Job {
    name: String,
    tasks: usize,
    gpus: usize,
    gib: f64,
    options: Vec<String>,
    scale: f64,
    real: bool,
    /// CRIU's C plugin instead of ours.
    c_plugin: bool,
}

impl Job {
    fn parse(spec: &str) -> R<Job> {
        let parts: Vec<&str> = spec.split(':').collect();
        ensure!(
            (4..=5).contains(&parts.len()),
            "--job {spec:?}: expected NAME:TASKS:GPUS:GIB[:OPTIONS]"
        );
        let num = |i: usize, what: &str| -> R<f64> {
            parts[i]
                .parse::<f64>()
                .ok()
                .filter(|v| *v > 0.0)
                .ok_or_else(|| format!("--job {spec:?}: {what} {:?} is not positive", parts[i]))
        };
        let mut job = Job {
            name: parts[0].to_owned(),
            tasks: num(1, "TASKS")? as usize,
            gpus: num(2, "GPUS")? as usize,
            gib: num(3, "GIB")?,
            options: Vec::new(),
            scale: 1.0,
            real: false,
            c_plugin: false,
        };
        for o in parts.get(4).into_iter().flat_map(|o| o.split(',')) {
            if o == "real" {
                job.real = true;
            } else if o == "c-plugin" {
                job.c_plugin = true;
            } else if let Some(s) = o.strip_prefix("scale=") {
                job.scale = s
                    .parse()
                    .map_err(|_| format!("--job {spec:?}: scale={s} is not a number"))?;
            } else if !o.is_empty() {
                job.options.push(format!("cuda_plugin.{o}"));
            }
        }
        ensure!(
            job.gpus <= job.tasks.max(1) && job.gpus <= 16,
            "--job {spec:?}: GPUS must be at most TASKS and 16"
        );
        ensure!(
            !job.c_plugin || job.options.is_empty(),
            "--job {spec:?}: CRIU's C plugin takes no plugin options"
        );
        Ok(job)
    }

    /// The modelled copy time of a dump (or a restore) under the world's default rates: one
    /// task's transfer after another with `parallel=1`, or with `parallel=` N > 1 or auto (the
    /// default, also when no `parallel=` is given) all of them at once
    /// sharing the links and the host ceiling (`mock_cuda_world::rates::simulate`; `auto` and
    /// N >= TASKS start every task together, smaller N is modelled as waves of N).
    fn modelled_copy(&self) -> Duration {
        use mock_cuda_world::rates::{simulate, Limits};
        let bytes = (self.gib * f64::from(1u32 << 30)) as u64;
        let limits = Limits::of(&mock_cuda_world::config::RatesConfig::default());
        let width = self
            .options
            .iter()
            .find_map(|o| o.strip_prefix("cuda_plugin.parallel="))
            .map_or(16, |w| {
                if w == "auto" {
                    16
                } else {
                    w.parse().unwrap_or(1)
                }
            })
            .clamp(1, self.tasks.max(1));
        let tasks: Vec<usize> = (0..self.tasks).collect();
        let secs: f64 = tasks
            .chunks(width)
            .map(|wave| {
                let transfers: Vec<Vec<(usize, u64)>> = wave
                    .iter()
                    .map(|&i| vec![(i % self.gpus.max(1), bytes)])
                    .collect();
                simulate(&transfers, &limits)
                    .into_iter()
                    .fold(0.0, f64::max)
            })
            .sum();
        Duration::from_secs_f64(secs / self.scale)
    }
}

/// One sample's measurements.
#[derive(Debug, Clone, Default)]
struct Sample {
    dump: f64,
    restore: f64,
    hooks_dump: f64,
    hooks_restore: f64,
}

fn world_config(job: &Job) -> String {
    let mut t = format!(
        "schema = 1\n[driver]\nbranch = 580\n[rates]\ntime_scale = {}\n",
        job.scale
    );
    if job.real {
        let mib = (job.gib * 1024.0).ceil() as u64;
        t.push_str(&format!("[memory]\nreal_mib = {mib}\n"));
    }
    for g in 0..job.gpus {
        t.push_str(&format!(
            "[[gpu]]\nuuid = \"GPU-{g:08x}-0000-4000-8000-000000000000\"\nname = \"NVIDIA H200\"\nmemory_mib = 144384\nchip = \"GH100\"\n"
        ));
    }
    t
}

fn run_sample(criu: &Path, job: &Job, keep: bool) -> R<Sample> {
    let a = artifacts().as_ref().map_err(Clone::clone)?;
    let dir = tempfile::Builder::new()
        .prefix("scale-bench-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let p = dir.path();
    let (world, lib, img) = (p.join("world"), p.join("plugins"), p.join("img"));
    for d in [&lib, &img] {
        std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    let so = if job.c_plugin {
        // Built beside the CRIU wrapper: target/criu/<version>/c-plugin/cuda_plugin.so.
        let so = criu
            .parent()
            .unwrap_or(Path::new("/"))
            .join("c-plugin/cuda_plugin.so");
        ensure!(
            so.is_file(),
            "{}: no C plugin (scripts/fetch-criu.sh --c-plugin builds it)",
            so.display()
        );
        so
    } else {
        a.plugin_so.clone()
    };
    std::fs::copy(&so, lib.join("cuda_plugin.so")).map_err(|e| e.to_string())?;
    init_world(a, &world, &world_config(job))?;
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
            .env("CRIU_PLUGIN_OPTIONS", job.options.join(" "))
            .env_remove("CUDA_VISIBLE_DEVICES");
        if job.c_plugin {
            // CRIU's FI_PLUGIN_CUDA_FORCE_ENABLE: the C plugin's switch for hosts without a GPU.
            c.env("CRIU_FAULT", "138");
        }
    };
    let report = p.join("report.txt");
    let mut script = String::new();
    for i in 0..job.tasks {
        script.push_str(&format!(
            "{} --gpus {} --gib {} --report {} </dev/null >/dev/null 2>&1 &\n",
            a.mock_app.display(),
            i % job.gpus,
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
    ensure!(
        wait_until(Duration::from_secs(60), || ready(job.tasks)),
        "the job did not start: {}",
        read(&report)
    );
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
    let (dump, dlog) = run(&["dump", "-t", &root_s, "-D", &imgs], "dump.log")?;
    let mut all = pids.clone();
    all.push(root_pid);
    wait_pids_gone(&all, Duration::from_secs(30))?;
    let (restore, rlog) = run(&["restore", "-D", &imgs, "-d"], "restore.log")?;
    let before = read(&report).matches("PASS ").count();
    for &pid in &pids {
        signal(pid, SIGUSR1);
    }
    let passed = wait_until(Duration::from_secs(60), || {
        read(&report).matches("PASS ").count() >= before + pids.len()
    });
    for pid in processes_with_env(&format!("MOCK_CUDA_WORLD={}", world.display())) {
        signal(pid, SIGKILL);
    }
    reap();
    ensure!(
        passed && !read(&report).contains("FAIL "),
        "data check after the restore: {}",
        read(&report)
    );
    let hooks = |log: &str| hook_times(log).iter().map(|(_, _, ms)| ms).sum::<f64>();
    if keep {
        eprintln!("    kept {}", dir.keep().display());
    }
    Ok(Sample {
        dump,
        restore,
        hooks_dump: hooks(&dlog),
        hooks_restore: hooks(&rlog),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn main() -> std::process::ExitCode {
    let o = Opts::parse();
    if o.list {
        println!("scale_bench: benchmark");
        return std::process::ExitCode::SUCCESS;
    }
    if !is_root() {
        eprintln!("scale_bench: skipped: not root");
        return std::process::ExitCode::SUCCESS;
    }
    let criu = match o.criu.clone().or_else(|| {
        let mut c = find_criu();
        c.sort_by_key(|c| std::cmp::Reverse(c.series));
        c.into_iter().next().map(|c| c.path)
    }) {
        Some(c) => c,
        None => {
            eprintln!("scale_bench: skipped: no CRIU (run scripts/fetch-criu.sh)");
            return std::process::ExitCode::SUCCESS;
        }
    };
    let specs: Vec<String> = if !o.jobs.is_empty() {
        o.jobs.clone()
    } else if o.bench {
        [
            "1 GiB:1:1:1",
            "10 GiB:1:1:10",
            "80 GiB:1:1:80",
            "1 GiB real:1:1:1:real",
        ]
        .map(String::from)
        .to_vec()
    } else {
        vec!["smoke 1 GiB:1:1:1:scale=10".to_owned()]
    };
    let jobs: Vec<Job> = match specs.iter().map(|s| Job::parse(s)).collect() {
        Ok(j) => j,
        Err(e) => {
            eprintln!("scale_bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let rounds = if o.bench { o.rounds.max(1) } else { 1 };
    if !become_subreaper() {
        eprintln!("scale_bench: warning: cannot become a child subreaper");
    }
    let keep = std::env::var("CRIU_BENCH_KEEP").is_ok_and(|v| v == "1");
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); jobs.len()];
    for round in 0..rounds {
        for k in 0..jobs.len() {
            let i = (k + round) % jobs.len();
            match run_sample(&criu, &jobs[i], keep) {
                Ok(s) => {
                    eprintln!(
                        "round {}: {}: dump {:.0} ms, restore {:.0} ms",
                        round + 1,
                        jobs[i].name,
                        s.dump,
                        s.restore
                    );
                    samples[i].push(s);
                }
                Err(e) => {
                    eprintln!("scale_bench: {}: {e}", jobs[i].name);
                    return std::process::ExitCode::FAILURE;
                }
            }
        }
    }
    let mut table = format!(
        "CRIU {}, {rounds} round(s), medians (ms)\n\n| job | dump | restore | dump+restore | modelled copies | plugin hooks | plugin's own share | CRIU's share |\n|---|---|---|---|---|---|---|---|\n",
        criu.display()
    );
    for (job, s) in jobs.iter().zip(&samples) {
        let m = |f: fn(&Sample) -> f64| median(s.iter().map(f).collect());
        let total = m(|s| s.dump + s.restore);
        let hooks = m(|s| s.hooks_dump + s.hooks_restore);
        let copies = 2.0 * job.modelled_copy().as_secs_f64() * 1000.0;
        // CRIU's C plugin logs no hook times: its hooks' and CRIU's shares are unknown.
        let (hooks, own, criu_share) = if job.c_plugin {
            ("-".to_owned(), "-".to_owned(), "-".to_owned())
        } else {
            (
                format!("{hooks:.0}"),
                format!("{:.0}", hooks - copies),
                format!("{:.0}", total - hooks),
            )
        };
        table.push_str(&format!(
            "| {} | {:.0} | {:.0} | {total:.0} | {copies:.0} | {hooks} | {own} | {criu_share} |\n",
            job.name,
            m(|s| s.dump),
            m(|s| s.restore),
        ));
    }
    print!("{table}");
    if let Some(out) = &o.out {
        if let Err(e) = std::fs::write(out, &table) {
            eprintln!("scale_bench: {}: {e}", out.display());
            return std::process::ExitCode::FAILURE;
        }
    }
    std::process::ExitCode::SUCCESS
}
