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
//! keep calling into the driver, `--seccomp` runs the process under a seccomp filter (as a
//! container does) and checks that the filter survives.
//!
//! Sizes: `--kib K` allocates K KiB per GPU and writes and checks every byte. `--gib G` (a
//! decimal, e.g. `0.5`, `80`, `141`) allocates G GiB per GPU, sets all of it with one
//! `cuMemsetD8` to a value of the allocation, writes a pattern into 16 windows of 1 KiB spread
//! over it, and checks the windows and a probe of the set value between each two: a few KiB
//! of real data that still tell the allocations apart, which is what a mock world stores of a
//! virtual allocation (and what a real GPU checks in microseconds). Its background checks
//! take one window and one probe at a time, in turn; SIGUSR1 and SIGTERM check them all.
//!
//! `--fill random|half-zero` (with `--gib`) writes every byte instead of one memset:
//! pseudo-random bytes (a function of the allocation and the offset), or the first half zeros
//! and the second half random, uploaded in 16 MiB pieces (the workload's own host memory stays
//! small). The same windows and probes are checked, against those bytes. Only a real
//! allocation (`[memory] real_mib` at least its size) stores them all; a virtual one refuses
//! the upload.
//!
//! `--kernel-ms MS` keeps a "kernel" in flight: a thread calls `cuCtxSynchronize` in a loop,
//! and the process's environment gets `MOCK_CUDA_KERNEL_MS=MS`, with which the mock driver
//! keeps each of those calls inside its API gate for MS milliseconds (a lock waits for it). On
//! a real driver no kernel is launched and the option has no effect.
//!
//! `--collective NAME:SIZE` makes the process a member (a rank) of the collective NAME of SIZE
//! members: the process's environment gets `MOCK_CUDA_COLLECTIVE=NAME:SIZE`, with which the
//! mock driver holds a lock of it until every member has a lock requested, as an NCCL rank's
//! kernel waits for its peers. On a real driver the option has no effect.

#![deny(unsafe_code)]

#[expect(unsafe_code, reason = "the one module allowed to hold unsafe code")]
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
    /// KiB allocated on each GPU (every byte written and checked).
    #[arg(long, default_value_t = 256, conflicts_with = "gib")]
    kib: usize,
    /// GiB allocated on each GPU (a decimal): set with one memset, a pattern in 16 windows.
    #[arg(long, value_parser = parse_gib)]
    gib: Option<f64>,
    /// What a `--gib` allocation holds: one memset value (`set`), every byte pseudo-random
    /// (`random`), or the first half zeros and the second half random (`half-zero`).
    #[arg(long, value_enum, default_value_t = Fill::Set, requires = "gib")]
    fill: Fill,
    /// Keep a kernel of this many milliseconds in flight (see the module documentation).
    #[arg(long)]
    kernel_ms: Option<u64>,
    /// Be a member of the collective NAME of SIZE members (`NAME:SIZE`; see the module
    /// documentation).
    #[arg(long, value_name = "NAME:SIZE")]
    collective: Option<String>,
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
    /// Run under a seccomp filter, as a container does (installed before the driver loads, so
    /// every thread has it, its restore thread included); every check verifies it is still in
    /// force, and READY/PASS lines say `seccomp=filter`.
    #[arg(long)]
    seccomp: bool,
    /// With `--seccomp`: also refuse `userfaultfd` and `io_uring_setup` with `EPERM`, as the
    /// default seccomp profiles of podman and Docker do. The mock driver then cannot open its
    /// stand-in GPU handle and refuses to make this a CUDA process (the workload fails to
    /// start, naming why) unless `MOCK_CUDA_NO_GPU_HANDLE` is set.
    #[arg(long, requires = "seccomp")]
    seccomp_container: bool,
}

fn parse_gib(s: &str) -> Result<f64, String> {
    let g: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of GiB"))?;
    if !(g.is_finite() && g > 0.0 && g * GIB as f64 >= 1.0) {
        return Err(format!(
            "{s}: the size must be positive (at least one byte)"
        ));
    }
    Ok(g)
}

const GIB: u64 = 1 << 30;
/// Windows of pattern in a `--gib` allocation, and their size.
const WINDOWS: u64 = 16;
const WINDOW: u64 = 1024;
/// Bytes of the set value checked between two windows.
const PROBE: u64 = 64;
/// The environment variable the mock driver reads for `--kernel-ms`.
const KERNEL_MS_ENV: &str = "MOCK_CUDA_KERNEL_MS";
/// The environment variable the mock driver reads for `--collective`.
const COLLECTIVE_ENV: &str = "MOCK_CUDA_COLLECTIVE";

/// The byte at offset `i` of allocation `alloc` (the pattern the workload writes).
fn pattern(alloc: usize, i: u64) -> u8 {
    ((i * 131 + alloc as u64 * 17 + 7) % 251) as u8
}

/// The value a `--gib` allocation is set to outside its windows.
fn fill(alloc: usize) -> u8 {
    0x5a ^ (alloc as u8).wrapping_mul(37)
}

/// The content of a `--gib` allocation (`--fill`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// One memset value, pattern in 16 windows.
    Set,
    /// Every byte pseudo-random.
    Random,
    /// The first half zeros, the second half pseudo-random.
    HalfZero,
}

/// Bytes uploaded per call by a `random` or `half-zero` fill.
const FILL_PIECE: u64 = 16 << 20;

/// SplitMix64: the pseudo-random words of `--fill random`.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Byte `i` of allocation `alloc` (of `bytes`) under a `random` or `half-zero` fill.
fn filled(fill: Fill, alloc: usize, bytes: u64, i: u64) -> u8 {
    if fill == Fill::HalfZero && i < bytes / 2 {
        return 0;
    }
    let word = splitmix64(((alloc as u64) << 56) ^ (i / 8));
    (word >> ((i % 8) * 8)) as u8
}

/// Bytes `off..off + len` of allocation `alloc` under a `random` or `half-zero` fill (a word at
/// a time; the same bytes as [`filled`]).
fn filled_range(fill: Fill, alloc: usize, bytes: u64, off: u64, len: u64) -> Vec<u8> {
    let first = off / 8;
    let last = (off + len).div_ceil(8);
    let mut out = Vec::with_capacity(((last - first) * 8) as usize);
    for w in first..last {
        out.extend_from_slice(&splitmix64(((alloc as u64) << 56) ^ w).to_le_bytes());
    }
    let skip = (off - first * 8) as usize;
    let mut out = out[skip..skip + len as usize].to_vec();
    if fill == Fill::HalfZero {
        let zeros = (bytes / 2).saturating_sub(off).min(len) as usize;
        out[..zeros].fill(0);
    }
    out
}

/// What a workload writes into each allocation and checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Every byte is pattern.
    Whole,
    /// A memset of the whole allocation, then pattern windows.
    Windows,
    /// Every byte written by a `random` or `half-zero` fill; windows and probes checked.
    Filled(Fill),
}

/// A range of an allocation: (offset, length).
type Range = (u64, u64);

/// The windows of an allocation of `bytes`: the range of each pattern window, and of each
/// probe of the set value between two windows.
fn windows(bytes: u64) -> (Vec<Range>, Vec<Range>) {
    let step = (bytes - WINDOW) / (WINDOWS - 1);
    let wins: Vec<Range> = (0..WINDOWS).map(|j| ((step * j) & !63, WINDOW)).collect();
    let probes = wins
        .windows(2)
        .filter_map(|p| {
            let gap_start = p[0].0 + p[0].1;
            let gap = p[1].0.checked_sub(gap_start)?;
            (gap >= PROBE).then(|| (gap_start + (gap - PROBE) / 2, PROBE))
        })
        .collect();
    (wins, probes)
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
    bytes: u64,
    layout: Layout,
}

impl Workload {
    fn start(args: &Args) -> Result<Workload> {
        let driver = Driver::load()?;
        driver.init()?;
        let (bytes, layout) = match args.gib {
            Some(g) => {
                let bytes = (g * GIB as f64).round() as u64;
                // Too small for 16 windows with room between them: write it whole.
                if bytes < 2 * WINDOWS * WINDOW {
                    (bytes, Layout::Whole)
                } else if args.fill == Fill::Set {
                    (bytes, Layout::Windows)
                } else {
                    (bytes, Layout::Filled(args.fill))
                }
            }
            None => (args.kib as u64 * 1024, Layout::Whole),
        };
        let mut allocs = Vec::new();
        for (k, &ordinal) in args.gpus.iter().enumerate() {
            let ctx = driver
                .context(ordinal)
                .with_context(|| format!("GPU ordinal {ordinal}"))?;
            let dptr = driver.alloc(bytes)?;
            match layout {
                Layout::Whole => {
                    let data: Vec<u8> = (0..bytes).map(|i| pattern(k, i)).collect();
                    driver.upload(dptr, &data)?;
                }
                Layout::Windows => {
                    driver.memset(dptr, fill(k), bytes)?;
                    for (off, len) in windows(bytes).0 {
                        let data: Vec<u8> = (off..off + len).map(|i| pattern(k, i)).collect();
                        driver.upload(dptr + off, &data)?;
                    }
                }
                Layout::Filled(f) => {
                    for off in (0..bytes).step_by(FILL_PIECE as usize) {
                        let len = FILL_PIECE.min(bytes - off);
                        driver.upload(dptr + off, &filled_range(f, k, bytes, off, len))?;
                    }
                }
            }
            allocs.push((ctx, dptr));
        }
        Ok(Workload {
            driver,
            allocs,
            bytes,
            layout,
        })
    }

    /// Checks `len` bytes at `off` of allocation `k` against `expect(i)`.
    fn check(
        &self,
        k: usize,
        dptr: u64,
        (off, len): Range,
        expect: impl Fn(u64) -> u8,
    ) -> Result<()> {
        let mut buf = vec![0u8; len as usize];
        self.driver.download(dptr + off, &mut buf)?;
        if let Some(i) = (0..len).find(|&i| buf[i as usize] != expect(off + i)) {
            anyhow::bail!(
                "GPU data of allocation {k} differs at byte {}: {} != {}",
                off + i,
                buf[i as usize],
                expect(off + i)
            );
        }
        Ok(())
    }

    /// Checks the data: all of it, or (`round = Some(n)`, the background checks) every byte
    /// of a whole allocation but only window and probe `n` (rotating) of a windowed one.
    fn verify(&self, round: Option<u64>) -> Result<()> {
        for (k, &(ctx, dptr)) in self.allocs.iter().enumerate() {
            self.driver.set_current(ctx)?;
            match self.layout {
                Layout::Whole => self.check(k, dptr, (0, self.bytes), |i| pattern(k, i))?,
                Layout::Windows => {
                    let (wins, probes) = windows(self.bytes);
                    let wanted =
                        |j: usize, n: usize| round.is_none_or(|r| j as u64 == r % n as u64);
                    let (nw, np) = (wins.len(), probes.len());
                    for (j, w) in wins.into_iter().enumerate() {
                        if wanted(j, nw) {
                            self.check(k, dptr, w, |i| pattern(k, i))?;
                        }
                    }
                    for (j, p) in probes.into_iter().enumerate() {
                        if wanted(j, np) {
                            self.check(k, dptr, p, |_| fill(k))?;
                        }
                    }
                }
                Layout::Filled(f) => {
                    let (wins, probes) = windows(self.bytes);
                    let n = wins.len() + probes.len();
                    for (j, w) in wins.into_iter().chain(probes).enumerate() {
                        if round.is_none_or(|r| j as u64 == r % n as u64) {
                            self.check(k, dptr, w, |i| filled(f, k, self.bytes, i))?;
                        }
                    }
                }
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
    if let Some(ms) = args.kernel_ms {
        // Read by the mock driver; set before the driver is loaded and any thread starts.
        std::env::set_var(KERNEL_MS_ENV, ms.to_string());
    }
    if let Some(c) = &args.collective {
        // Read by the mock driver when the process registers.
        std::env::set_var(COLLECTIVE_ENV, c);
    }
    let pid = std::process::id();
    if let Err(e) = run(&args, pid) {
        report(&args, &format!("FAIL pid={pid} reason={e:#}"));
        std::process::exit(1);
    }
}

fn run(args: &Args, pid: u32) -> Result<()> {
    if args.seccomp {
        ffi::install_seccomp_filter(args.seccomp_container)?;
    }
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
        // Children keep a kernel in flight, or join a collective, only when their own options
        // say so.
        cmd.env_remove(KERNEL_MS_ENV);
        cmd.env_remove(COLLECTIVE_ENV);
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
                match args.gib {
                    Some(g) => cmd.arg("--gib").arg(g.to_string()).arg("--fill").arg(
                        clap::ValueEnum::to_possible_value(&args.fill)
                            .map_or_else(|| "set".to_owned(), |v| v.get_name().to_owned()),
                    ),
                    None => cmd.arg("--kib").arg(args.kib.to_string()),
                };
                cmd.arg("--threads").arg(args.threads.to_string());
                if let Some(ms) = args.kernel_ms {
                    cmd.arg("--kernel-ms").arg(ms.to_string());
                }
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
    if args.kernel_ms.is_some() {
        if let Some(w) = workload.clone() {
            std::thread::Builder::new()
                .name("kernel".to_owned())
                .spawn(move || loop {
                    if let Some(&(ctx, _)) = w.allocs.first() {
                        let _ = w.driver.set_current(ctx);
                        // Each call is a kernel of --kernel-ms in flight (see the module docs).
                        if w.driver.synchronize().is_err() {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                })?;
        }
    }
    let gpus = match &workload {
        Some(w) => w.gpus()?,
        None => String::new(),
    };
    let filtered = if args.seccomp { " seccomp=filter" } else { "" };
    report(
        args,
        &format!(
            "READY pid={pid} cuda={} gpus={gpus}{filtered}",
            if workload.is_some() { "yes" } else { "no" }
        ),
    );
    let mut checks = 0u64;
    loop {
        std::thread::sleep(Duration::from_millis(args.check_ms));
        if let Some(w) = &workload {
            w.verify(Some(checks))?;
            checks += 1;
        }
        let stop = ffi::STOP.load(Ordering::SeqCst);
        if args.seccomp && !ffi::seccomp_filter_active() {
            anyhow::bail!("the seccomp filter is no longer in force");
        }
        if ffi::VERIFY.swap(false, Ordering::SeqCst) || stop {
            let gpus = match &workload {
                Some(w) => {
                    w.verify(None)?;
                    checks += 1;
                    w.gpus()?
                }
                None => String::new(),
            };
            report(
                args,
                &format!("PASS pid={pid} checks={checks} gpus={gpus}{filtered}"),
            );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_probes_lie_inside_apart_and_in_order() {
        for bytes in [2 * WINDOWS * WINDOW, 1 << 20, 80 * GIB, 141 * GIB + 12345] {
            let (wins, probes) = windows(bytes);
            assert_eq!(wins.len() as u64, WINDOWS);
            assert_eq!(wins[0].0, 0);
            let mut all: Vec<Range> = wins.iter().chain(&probes).copied().collect();
            all.sort_unstable();
            for pair in all.windows(2) {
                assert!(
                    pair[0].0 + pair[0].1 <= pair[1].0,
                    "{bytes}: {pair:?} overlap"
                );
            }
            let last = all.last().unwrap();
            assert!(last.0 + last.1 <= bytes, "{bytes}: {last:?} is outside");
            assert!(
                bytes - (last.0 + last.1) < WINDOW + 64,
                "the last window ends near the end"
            );
            assert_eq!(
                probes.len() as u64,
                WINDOWS - 1,
                "{bytes}: a probe in every gap"
            );
        }
    }

    #[test]
    fn fills_write_the_bytes_they_check() {
        let bytes = 1 << 20;
        for f in [Fill::Random, Fill::HalfZero] {
            for k in [0, 3] {
                for (off, len) in [(0, 4096), (bytes / 2 - 5, 13), (12345, 999), (bytes - 7, 7)] {
                    let r = filled_range(f, k, bytes, off, len);
                    assert_eq!(r.len() as u64, len);
                    for (j, b) in r.iter().enumerate() {
                        assert_eq!(
                            *b,
                            filled(f, k, bytes, off + j as u64),
                            "{f:?} {k} {off}+{j}"
                        );
                    }
                }
            }
        }
        let half = filled_range(Fill::HalfZero, 0, bytes, 0, bytes);
        assert!(half[..(bytes / 2) as usize].iter().all(|&b| b == 0));
        let upper = &half[(bytes / 2) as usize..];
        let zeros = upper.iter().filter(|&&b| b == 0).count();
        assert!(
            zeros < upper.len() / 128,
            "the random half is random: {zeros} zeros"
        );
        assert_eq!(
            upper,
            &filled_range(Fill::Random, 0, bytes, bytes / 2, bytes / 2)[..]
        );
        assert_ne!(
            filled_range(Fill::Random, 0, bytes, 0, 64),
            filled_range(Fill::Random, 1, bytes, 0, 64),
            "allocations differ"
        );
    }

    #[test]
    fn fill_needs_gib() {
        assert!(Args::try_parse_from(["a", "--fill", "random"]).is_err());
        let a = Args::try_parse_from(["a", "--gib", "1", "--fill", "half-zero"]).unwrap();
        assert_eq!(a.fill, Fill::HalfZero);
        assert_eq!(
            Args::try_parse_from(["a", "--gib", "1"]).unwrap().fill,
            Fill::Set
        );
    }

    #[test]
    fn sizes_in_gib_must_be_positive() {
        assert_eq!(parse_gib("0.5"), Ok(0.5));
        assert_eq!(parse_gib("141"), Ok(141.0));
        for bad in ["0", "-1", "nan", "inf", "1e-12", "many"] {
            assert!(parse_gib(bad).is_err(), "{bad}");
        }
    }
}
