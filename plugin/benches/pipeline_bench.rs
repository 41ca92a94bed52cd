//! The custom-storage file pipeline alone (`cstore::pipeline`), against `dd` on the same
//! filesystem in the same run: how close one GPU's copy gets to the disk's own sequential rate
//! when nothing else (the mock's copies, CRIU, the target) takes a share of the machine.
//!
//! The "device" is memory in this process: its copies are `memcpy` at `sync`, as a stream's
//! are. Each round writes `--mib` MiB of pseudo-random bytes with `dd_write`, then
//! [`dump_gpu`], then reads the `dd` file back, then [`verify_file`] + [`restore_gpu`] (what the
//! copier does per file at restore), dropping the page cache before every read. The restored
//! bytes are compared with the device's.
//!
//! ```text
//! cargo bench -p cuda-plugin --bench pipeline_bench -- --rounds 3 --mib 1024 --dir /tmp
//! ```
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does nothing: it writes GiBs.

use clap::Parser;
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
    bufs: [AlignedBuf; 2],
    pending: Vec<(bool, u64, usize, usize)>,
}

impl DeviceCopy for MemDev {
    fn size(&self) -> u64 {
        self.mem.len() as u64
    }
    fn buffer(&mut self, which: usize) -> &mut [u8] {
        self.bufs[which].as_mut_slice()
    }
    fn enqueue_to_host(&mut self, off: u64, which: usize, len: usize) -> Result<(), DeviceError> {
        self.pending.push((true, off, which, len));
        Ok(())
    }
    fn enqueue_to_device(&mut self, which: usize, off: u64, len: usize) -> Result<(), DeviceError> {
        self.pending.push((false, off, which, len));
        Ok(())
    }
    fn sync(&mut self) -> Result<(), DeviceError> {
        for (to_host, off, which, len) in self.pending.drain(..) {
            let d = &mut self.mem[off as usize..off as usize + len];
            let b = &mut self.bufs[which].as_mut_slice()[..len];
            if to_host {
                b.copy_from_slice(d);
            } else {
                d.copy_from_slice(b);
            }
        }
        Ok(())
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

fn round(o: &Opts, dev: &mut MemDev, want: &[u8]) -> [f64; 4] {
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
    let dd_r = dd(&[
        format!("if={}", dd_file.display()),
        "of=/dev/null".into(),
        "bs=16M".into(),
        "iflag=direct".into(),
    ]);
    drop_caches();
    dev.mem.fill(0);
    let expected = Expected {
        dump_id: id.dump_id,
        pid: id.pid,
        uuid: id.uuid,
        place: id.place,
        size: bytes,
    };
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
        "  restore: verify {:.0} ms, copy {:.0} ms (O_DIRECT {})",
        verified * 1e3,
        (restore - verified) * 1e3,
        f.direct
    );
    assert!(
        dev.mem == want,
        "the restored bytes differ from the dumped ones"
    );
    let _ = std::fs::remove_file(&dd_file);
    let _ = std::fs::remove_file(o.dir.join(name));
    [
        rate(bytes, dd_w),
        rate(bytes, dump),
        rate(bytes, dd_r),
        rate(bytes, restore),
    ]
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
    let chunk = (o.chunk_mib as usize) << 20;
    let mut dev = MemDev {
        mem: want.clone(),
        bufs: [AlignedBuf::new(chunk), AlignedBuf::new(chunk)],
        pending: Vec::new(),
    };
    println!(
        "pipeline_bench: {} MiB random, chunk {} MiB, in {} (MB/s, 1e6 bytes)",
        o.mib,
        o.chunk_mib,
        Path::new(&o.dir).display()
    );
    println!("round | dd write | dump | dump÷dd | dd read | restore | restore÷dd");
    let mut ratios = (Vec::new(), Vec::new());
    for r in 1..=o.rounds {
        dev.mem.copy_from_slice(&want);
        let [dw, d, dr, rs] = round(&o, &mut dev, &want);
        println!(
            "{r} | {dw:.0} | {d:.0} | {:.2} | {dr:.0} | {rs:.0} | {:.2}",
            d / dw,
            rs / dr
        );
        ratios.0.push(d / dw);
        ratios.1.push(rs / dr);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "median: dump÷dd {:.2}, restore÷dd {:.2}",
        med(&mut ratios.0),
        med(&mut ratios.1)
    );
}
