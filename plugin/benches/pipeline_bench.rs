//! The custom-storage file pipeline alone (`cstore::pipeline`), against `dd` on the same
//! filesystem in the same run: how close one GPU's copy gets to the disk's own sequential rate
//! when nothing else (the mock's copies, CRIU, the target) takes a share of the machine.
//!
//! The "device" is memory in this process: its copies are `memcpy` at `sync`, as a stream's
//! are. Each round writes `--mib` MiB of pseudo-random bytes with `dd_write`, then
//! reads it back, then, for each `--buffers` count (default 2 and 3: the copier uses 3),
//! [`dump_gpu`], then [`verify_file`] + [`restore_gpu`] (what the copier does per file at
//! restore), dropping the page cache before every read. The restored bytes are
//! compared with the device's.
//!
//! ```text
//! cargo bench -p cuda-plugin --bench pipeline_bench -- --rounds 3 --mib 1024 --dir /tmp
//! ```
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does nothing: it writes GiBs.

use clap::Parser;
use cuda_plugin::cstore::format::ALIGN;
use cuda_plugin::cstore::pipeline::{
    dump_gpu, open_for_dump, open_for_restore, restore_gpu, verify_file, AlignedBuf, DeviceCopy,
    DeviceError, DumpOptions, Expected, Identity, RestoreOptions,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

#[derive(Parser)]
struct Opts {
    /// Set by `cargo bench`; without it the bench does nothing.
    #[arg(long)]
    bench: bool,
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// The device's size, MiB.
    #[arg(long, default_value_t = 1024)]
    mib: u64,
    /// Where the files go (the filesystem measured).
    #[arg(long, default_value = "/tmp")]
    dir: PathBuf,
    /// The chunk (the copier's is 16 MiB).
    #[arg(long, default_value_t = 16)]
    chunk_mib: u32,
    /// Restore through the page cache with read-ahead.
    #[arg(long)]
    buffered: bool,
    /// The staging buffers, each count dumped and restored in turn every round (the copier uses
    /// 3: a chunk read or written while the one before is checked and the one before that
    /// copied; with 2 the file side waits for each copy).
    #[arg(long, value_delimiter = ',', default_value = "2,3")]
    buffers: Vec<usize>,
    #[arg(long, hide = true)]
    list: bool,
    #[arg(long, hide = true)]
    format: Option<String>,
    #[arg(hide = true)]
    filter: Option<String>,
}

/// Memory standing for a GPU; copies run at `sync`.
struct MemDev {
    mem: Vec<u8>,
    bufs: Vec<AlignedBuf>,
    pending: Vec<(bool, u64, u64, usize, AlignedBuf)>,
}

/// An [`AlignedBuf`] as the pipeline's staging buffer.
struct Buf(AlignedBuf);

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

impl AsMut<[u8]> for Buf {
    fn as_mut(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }
}

impl MemDev {
    /// `count` buffers of a chunk and one frame block, as the copier's.
    fn lend(&mut self, chunk: usize, count: usize) {
        self.bufs = (0..count).map(|_| AlignedBuf::new(chunk + ALIGN)).collect();
    }
}

impl DeviceCopy for MemDev {
    type Buf = Buf;
    fn size(&self) -> u64 {
        self.mem.len() as u64
    }
    fn take_buffers(&mut self) -> Vec<Buf> {
        self.bufs.drain(..).map(Buf).collect()
    }
    fn enqueue_to_host(&mut self, off: u64, buf: Buf, len: usize) -> Result<(), DeviceError> {
        self.pending.push((true, off, len as u64, len, buf.0));
        Ok(())
    }
    fn enqueue_to_device(
        &mut self,
        buf: Buf,
        off: u64,
        len: u64,
        piece: usize,
    ) -> Result<(), DeviceError> {
        self.pending.push((false, off, len, piece, buf.0));
        Ok(())
    }
    fn sync(&mut self) -> Result<Vec<Buf>, DeviceError> {
        let mut back = Vec::new();
        for (to_host, off, len, piece, mut buf) in self.pending.drain(..) {
            let b = buf.as_mut_slice();
            let (mut o, end) = (off as usize, (off + len) as usize);
            while o < end {
                let n = (end - o).min(piece);
                if to_host {
                    b[..n].copy_from_slice(&self.mem[o..o + n]);
                } else {
                    self.mem[o..o + n].copy_from_slice(&b[..n]);
                }
                o += n;
            }
            back.push(Buf(buf));
        }
        Ok(back)
    }
}

fn drop_caches() {
    let _ = Command::new("sync").status();
    if std::fs::write("/proc/sys/vm/drop_caches", "3").is_err() {
        eprintln!("pipeline_bench: warning: cannot drop the page cache");
    }
}

/// `dd` with O_DIRECT, 16 MiB blocks: seconds.
fn dd(args: &[String]) -> f64 {
    let t = Instant::now();
    let ok = Command::new("dd")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "dd {} failed", args.join(" "));
    t.elapsed().as_secs_f64()
}

fn rate(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

/// One round: dd's write and read, then a dump and a restore per `--buffers` count (MB/s):
/// `(dd write, dd read, [(dump, restore)])`.
fn round(o: &Opts, dev: &mut MemDev, want: &[u8]) -> (f64, f64, Vec<(f64, f64)>) {
    let bytes = o.mib << 20;
    let dd_file = o.dir.join("pipeline-bench-dd.bin");
    let name = "pipeline-bench.img";
    let _ = std::fs::remove_file(&dd_file);
    let _ = std::fs::remove_file(o.dir.join(name));
    let count = o.mib.div_ceil(16);
    let of = format!("of={}", dd_file.display());
    let dd_w = dd(&[
        "if=/dev/zero".into(),
        of,
        "bs=16M".into(),
        format!("count={count}"),
        "oflag=direct".into(),
        "conv=fsync".into(),
    ]);
    let id = Identity {
        dump_id: [7; 16],
        pid: 1,
        uuid: abi::GpuUuid([1; 16]),
        place: 0,
    };
    let chunk = (o.chunk_mib as usize) << 20;
    drop_caches();
    let dd_r = dd(&[
        format!("if={}", dd_file.display()),
        "of=/dev/null".into(),
        "bs=16M".into(),
        "iflag=direct".into(),
    ]);
    let expected = Expected {
        dump_id: id.dump_id,
        pid: id.pid,
        uuid: id.uuid,
        place: id.place,
        size: bytes,
    };
    let mut rates = Vec::new();
    for &count in &o.buffers {
        // The device holds `want` (set by the caller, then by each restore, checked below).
        let _ = std::fs::remove_file(o.dir.join(name));
        dev.lend(chunk, count);
        let mut out = open_for_dump(&o.dir, name).expect("create the image file");
        let t = Instant::now();
        dump_gpu(
            dev,
            &mut out,
            &id,
            &DumpOptions {
                chunk: o.chunk_mib << 20,
            },
        )
        .expect("dump");
        let dump = t.elapsed().as_secs_f64();
        drop(out);
        drop_caches();
        dev.mem.fill(0);
        dev.lend(chunk, count);
        let t = Instant::now();
        let mut f = open_for_restore(&o.dir.join(name)).expect("open the image file");
        if o.buffered {
            f = cuda_plugin::cstore::pipeline::ImageFile {
                file: std::fs::File::open(o.dir.join(name)).expect("open"),
                path: f.path,
                direct: false,
            };
        }
        verify_file(&mut f, &expected).expect("verify");
        let verified = t.elapsed().as_secs_f64();
        restore_gpu(dev, &mut f, &expected, &RestoreOptions::default()).expect("restore");
        let restore = t.elapsed().as_secs_f64();
        eprintln!(
            "  restore, {count} buffers: verify {:.0} ms, copy {:.0} ms (O_DIRECT {})",
            verified * 1e3,
            (restore - verified) * 1e3,
            f.direct
        );
        assert!(
            dev.mem == want,
            "the restored bytes differ from the dumped ones"
        );
        rates.push((rate(bytes, dump), rate(bytes, restore)));
    }
    let _ = std::fs::remove_file(&dd_file);
    let _ = std::fs::remove_file(o.dir.join(name));
    (rate(bytes, dd_w), rate(bytes, dd_r), rates)
}

fn main() {
    let o = Opts::parse();
    if o.list {
        println!("pipeline_bench: benchmark");
        return;
    }
    if !o.bench {
        return;
    }
    let bytes = usize::try_from(o.mib << 20).expect("size");
    let mut want = vec![0u8; bytes];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for w in want.chunks_exact_mut(8) {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        w.copy_from_slice(&(z ^ (z >> 31)).to_ne_bytes());
    }
    let t = Instant::now();
    let c = cuda_plugin::cstore::format::crc(&want);
    eprintln!(
        "crc32c of {} MiB: {:.0} ms ({c:08x})",
        o.mib,
        t.elapsed().as_secs_f64() * 1e3
    );
    assert!(
        o.buffers.iter().all(|&b| b >= 2),
        "--buffers: a copy needs at least two"
    );
    let mut dev = MemDev {
        mem: want.clone(),
        bufs: Vec::new(),
        pending: Vec::new(),
    };
    println!(
        "pipeline_bench: {} MiB random, chunk {} MiB, in {} (MB/s, 1e6 bytes); dumps and \
         restores with {:?} staging buffers",
        o.mib,
        o.chunk_mib,
        Path::new(&o.dir).display(),
        o.buffers
    );
    let heads: Vec<String> = o
        .buffers
        .iter()
        .map(|b| format!("dump {b} | ÷dd | restore {b} | ÷dd"))
        .collect();
    println!("round | dd write | dd read | {}", heads.join(" | "));
    let mut ratios = vec![(Vec::new(), Vec::new()); o.buffers.len()];
    for r in 1..=o.rounds {
        dev.mem.copy_from_slice(&want);
        let (dw, dr, rates) = round(&o, &mut dev, &want);
        let cells: Vec<String> = rates
            .iter()
            .map(|(d, rs)| format!("{d:.0} | {:.2} | {rs:.0} | {:.2}", d / dw, rs / dr))
            .collect();
        println!("{r} | {dw:.0} | {dr:.0} | {}", cells.join(" | "));
        for (v, (d, rs)) in ratios.iter_mut().zip(&rates) {
            v.0.push(d / dw);
            v.1.push(rs / dr);
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<String> = o
        .buffers
        .iter()
        .zip(&mut ratios)
        .map(|(b, (d, rs))| {
            format!(
                "{b} buffers: dump÷dd {:.2}, restore÷dd {:.2}",
                med(d),
                med(rs)
            )
        })
        .collect();
    println!("median: {}", medians.join("; "));
}
