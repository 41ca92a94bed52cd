//! `mock-cuda-app`: a CUDA workload for the mock driver (and for any driver: it only uses the
//! public driver API through `libcuda.so.1`).
//!
//! It allocates device memory on the chosen GPUs, fills it with a known pattern, and checks the
//! pattern continuously and whenever asked, so a checkpoint/restore that loses or corrupts GPU
//! data is caught. Report lines go to `--report FILE` (appended) and to stdout:
//!
//! ```text
//! READY pid=<pid> cuda=<yes|no> gpus=<uuid,...>
//! PASS pid=<pid> checks=<n> gpus=<uuid,...>      (on SIGUSR1 and at SIGTERM)
//! FAIL pid=<pid> reason=<text>                   (and exit status 1)
//! ```
//!
//! `--children N` starts N copies of itself as child processes (with `--children 0`),
//! `--cpu-only` never touches CUDA (for mixed trees), `--threads N` adds worker threads that
//! keep calling into the driver.

mod ffi;

use anyhow::{Context, Result};
use clap::Parser;
use ffi::Driver;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "mock-cuda-app",
    about = "A CUDA workload that verifies its GPU data across checkpoints"
)]
struct Args {
    /// Device ordinals to allocate on, comma-separated.
    #[arg(long, default_value = "0", value_delimiter = ',')]
    gpus: Vec<i32>,
    /// KiB allocated on each GPU.
    #[arg(long, default_value_t = 256)]
    kib: usize,
    /// Extra worker threads that keep calling into the driver.
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Child processes to start (copies of this program without children).
    #[arg(long, default_value_t = 0)]
    children: usize,
    /// Options for the children instead of this process's (e.g. "--cpu-only").
    #[arg(long, allow_hyphen_values = true)]
    child_args: Option<String>,
    /// Never load the driver.
    #[arg(long)]
    cpu_only: bool,
    /// File the report lines are appended to.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Milliseconds between background checks.
    #[arg(long, default_value_t = 50)]
    check_ms: u64,
}

fn pattern(alloc: usize, i: usize) -> u8 {
    ((i as u64 * 131 + alloc as u64 * 17 + 7) % 251) as u8
}

fn uuid_text(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

struct Workload {
    driver: Driver,
    /// (context, device pointer) per GPU.
    allocs: Vec<(usize, u64)>,
    bytes: usize,
}

impl Workload {
    fn start(args: &Args) -> Result<Workload> {
        let driver = Driver::load()?;
        driver.init()?;
        let bytes = args.kib * 1024;
        let mut allocs = Vec::new();
        for (k, &ordinal) in args.gpus.iter().enumerate() {
            let ctx = driver
                .context(ordinal)
                .with_context(|| format!("GPU ordinal {ordinal}"))?;
            let dptr = driver.alloc(bytes)?;
            let data: Vec<u8> = (0..bytes).map(|i| pattern(k, i)).collect();
            driver.upload(dptr, &data)?;
            allocs.push((ctx, dptr));
        }
        Ok(Workload {
            driver,
            allocs,
            bytes,
        })
    }

    fn verify(&self) -> Result<()> {
        let mut buf = vec![0u8; self.bytes];
        for (k, &(ctx, dptr)) in self.allocs.iter().enumerate() {
            self.driver.set_current(ctx)?;
            self.driver.download(dptr, &mut buf)?;
            if let Some(i) = (0..self.bytes).find(|&i| buf[i] != pattern(k, i)) {
                anyhow::bail!(
                    "GPU data of allocation {k} differs at byte {i}: {} != {}",
                    buf[i],
                    pattern(k, i)
                );
            }
        }
        Ok(())
    }

    fn gpus(&self) -> Result<String> {
        let mut out = Vec::new();
        for &(ctx, _) in &self.allocs {
            self.driver.set_current(ctx)?;
            out.push(uuid_text(&self.driver.current_uuid()?));
        }
        Ok(out.join(","))
    }
}

fn report(args: &Args, line: &str) {
    println!("{line}");
    let _ = std::io::stdout().flush();
    if let Some(path) = &args.report {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // One write(2) per line on an O_APPEND file: lines of concurrent workloads sharing
            // the report never interleave (writeln! would write the newline separately).
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
    }
}

fn main() {
    let args = Args::parse();
    let pid = std::process::id();
    if let Err(e) = run(&args, pid) {
        report(&args, &format!("FAIL pid={pid} reason={e:#}"));
        std::process::exit(1);
    }
}

fn run(args: &Args, pid: u32) -> Result<()> {
    ffi::install_signal_handlers()?;
    let workload = if args.cpu_only {
        None
    } else {
        Some(Arc::new(Workload::start(args)?))
    };
    let mut children = Vec::new();
    for _ in 0..args.children {
        let exe = std::env::current_exe().context("locating mock-cuda-app")?;
        let mut cmd = std::process::Command::new(exe);
        match &args.child_args {
            Some(a) => {
                cmd.args(a.split_whitespace());
            }
            None => {
                cmd.arg("--gpus").arg(
                    args.gpus
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                );
                cmd.arg("--kib")
                    .arg(args.kib.to_string())
                    .arg("--threads")
                    .arg(args.threads.to_string());
            }
        }
        if let Some(r) = &args.report {
            cmd.arg("--report").arg(r);
        }
        children.push(cmd.spawn().context("starting a child")?);
    }
    for t in 0..args.threads {
        let Some(w) = workload.clone() else { break };
        std::thread::Builder::new()
            .name(format!("worker{t}"))
            .spawn(move || loop {
                if let Some(&(ctx, _)) = w.allocs.first() {
                    let _ = w.driver.set_current(ctx);
                    let _ = w.driver.synchronize();
                }
                std::thread::sleep(Duration::from_millis(5));
            })?;
    }
    let gpus = match &workload {
        Some(w) => w.gpus()?,
        None => String::new(),
    };
    report(
        args,
        &format!(
            "READY pid={pid} cuda={} gpus={gpus}",
            if workload.is_some() { "yes" } else { "no" }
        ),
    );
    let mut checks = 0u64;
    loop {
        std::thread::sleep(Duration::from_millis(args.check_ms));
        if let Some(w) = &workload {
            w.verify()?;
            checks += 1;
        }
        let stop = ffi::STOP.load(Ordering::SeqCst);
        if ffi::VERIFY.swap(false, Ordering::SeqCst) || stop {
            let gpus = match &workload {
                Some(w) => {
                    w.verify()?;
                    checks += 1;
                    w.gpus()?
                }
                None => String::new(),
            };
            report(args, &format!("PASS pid={pid} checks={checks} gpus={gpus}"));
        }
        if stop {
            for mut c in children {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(c.id() as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
                let _ = c.wait();
            }
            return Ok(());
        }
    }
}
