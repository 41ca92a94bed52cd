//! Sizes: how much GPU memory each task holds (from NVML), what a checkpoint will stage in host
//! memory, what a restore needs on each GPU, and how long a copy of that size may take.
//!
//! A checkpoint copies a task's device memory into host memory (staged in the task), and a
//! restore copies it back, at the driver's copy rate (5–8 GB/s per GPU observed). Three rules
//! follow, each applied before anything is touched:
//!
//! * **Host memory at dump.** At the first PAUSE_DEVICES the plugin walks the tree, asks NVML
//!   how much device memory its processes hold, and refuses the dump when that exceeds the
//!   host's available memory (`MemAvailable`): a checkpoint that does not fit gets the task
//!   OOM-killed halfway.
//! * **GPU memory at restore.** At the restore's `init` every target GPU (after the device map)
//!   must have as much free memory (NVML) as the checkpointed tasks mapped to it held; otherwise
//!   the driver fails the restore with `CUDA_ERROR_OUT_OF_MEMORY`, leaving tasks checkpointed.
//! * **Deadlines that grow with the data.** A lock keeps the operation timeout, but a
//!   checkpoint or a restore moves the task's bytes: its deadline is the timeout plus the time
//!   those bytes take at [`DEFAULT_MIN_COPY_RATE`] (1 GB/s, a sixth of the driver's usual rate),
//!   so a copy that makes progress at any plausible rate is never cut off, and a hung one is
//!   still given up on after a bound that is known in advance (logged per task).
//! * **MIG at dump.** The same survey refuses the dump, before any lock, when a task of the tree
//!   has a context on a GPU in MIG mode (`nvmlDeviceGetMigMode`): the driver cannot checkpoint a
//!   process on a MIG instance (NVIDIA's cuda-checkpoint issue #42: the checkpoint fails with
//!   "out of memory", after the lock). `check-capacity=off` does not turn this off.
//!
//! Both capacity checks can be turned off (`cuda_plugin.check-capacity=off`). Without NVML all
//! three are skipped with a warning, and a copy's size is taken to be all the memory of all GPUs
//! (a bound, not an estimate).

use crate::task::Pid;
use abi::nvml::NvmlReturn;
use abi::GpuUuid;
use std::collections::BTreeMap;
use std::time::Duration;

/// The copy rate a deadline assumes, bytes per second (1 GB/s).
pub const DEFAULT_MIN_COPY_RATE: f64 = 1e9;

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuMemory {
    pub uuid: GpuUuid,
    /// Bytes.
    pub total: u64,
    /// Bytes not allocated.
    pub free: u64,
    /// The processes with a compute context on it (host pids) and the memory each uses
    /// (`None`: NVML cannot account it).
    pub processes: Vec<(u32, Option<u64>)>,
    /// `nvmlDeviceGetMigMode`'s current mode (`None`: unknown, e.g. an NVML without the
    /// function; a GPU without MIG support is `Some(false)`).
    pub mig: Option<bool>,
}

/// Every GPU NVML sees.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub gpus: Vec<GpuMemory>,
}

/// What NVML says of the node for `cuda-plugin-doctor` ([`crate::ffi::nvml::node`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReport {
    /// `nvmlSystemGetDriverVersion` (`580.65.06`), or why it failed.
    pub driver_version: Result<String, NvmlReturn>,
    /// Every GPU, in NVML's (host) order.
    pub gpus: Vec<NodeGpu>,
}

/// One GPU of a [`NodeReport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGpu {
    pub uuid: GpuUuid,
    /// `nvmlDeviceGetName`, or why it failed.
    pub name: Result<String, NvmlReturn>,
    /// Total memory, bytes.
    pub total: u64,
    /// `nvmlDeviceGetPersistenceMode`: on or off, or why it failed
    /// (`NVML_ERROR_FUNCTION_NOT_FOUND` when the library lacks the function).
    pub persistence: Result<bool, NvmlReturn>,
    /// `nvmlDeviceGetMigMode`'s current mode: on or off, or why it failed
    /// (`NVML_ERROR_NOT_SUPPORTED` on a GPU without MIG, which is never in MIG mode).
    pub mig: Result<bool, NvmlReturn>,
}

impl NodeReport {
    /// The driver branch, from the driver version's first number (`580.65.06` is 580).
    #[must_use]
    pub fn branch(&self) -> Option<u32> {
        let v = self.driver_version.as_ref().ok()?;
        v.split('.').next()?.trim().parse().ok()
    }
}

/// Why NVML could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlError {
    #[error("NVML is not available: {0}")]
    Absent(String),
    #[error("{what} failed with {code}")]
    Call {
        what: &'static str,
        code: NvmlReturn,
    },
    #[error("NVML reported the GPU UUID {text:?}, which does not parse: {why}")]
    BadUuid { text: String, why: String },
    #[error("NVML did not answer: {0}")]
    Stuck(String),
    /// NVML's failure as the plugin's helper process reported it (its message, unchanged).
    #[error("{0}")]
    Helper(String),
}

impl Snapshot {
    /// The device memory of `pid` on each GPU it uses; `None` when NVML cannot account it.
    #[must_use]
    pub fn task_bytes(&self, pid: Pid) -> Option<BTreeMap<GpuUuid, u64>> {
        let pid = u32::try_from(pid).ok()?;
        let mut out = BTreeMap::new();
        for g in &self.gpus {
            for &(p, bytes) in &g.processes {
                if p == pid {
                    *out.entry(g.uuid).or_insert(0) += bytes?;
                }
            }
        }
        Some(out)
    }

    /// The GPUs in MIG mode on which `pid` has a compute context (NVML's process list).
    #[must_use]
    pub fn mig_gpus_of(&self, pid: Pid) -> Vec<GpuUuid> {
        let Ok(pid) = u32::try_from(pid) else {
            return Vec::new();
        };
        self.gpus
            .iter()
            .filter(|g| g.mig == Some(true) && g.processes.iter().any(|&(p, _)| p == pid))
            .map(|g| g.uuid)
            .collect()
    }

    /// All the memory of all GPUs: the most any copy can move.
    #[must_use]
    pub fn all_memory(&self) -> u64 {
        self.gpus.iter().map(|g| g.total).sum()
    }

    /// The GPU with this UUID.
    #[must_use]
    pub fn gpu(&self, uuid: GpuUuid) -> Option<&GpuMemory> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }
}

/// The deadline of a copy of `bytes` at `rate` bytes per second after `timeout` (`None`: no
/// timeout, no deadline).
#[must_use]
pub fn copy_deadline(timeout: Option<Duration>, bytes: u64, rate: f64) -> Option<Duration> {
    let t = timeout?;
    // Bytes fit in f64's 53-bit mantissa up to 8 PiB; beyond that the deadline is approximate.
    #[allow(clippy::cast_precision_loss)]
    let secs = bytes as f64 / rate.max(1.0);
    Some(t.saturating_add(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)))
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
#[must_use]
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut w = line.split_whitespace().skip(1);
    let n: u64 = w.next()?.parse().ok()?;
    match w.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// Bytes as GiB with one decimal, for messages.
#[must_use]
pub fn gib(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let g = bytes as f64 / f64::from(1u32 << 30);
    format!("{} GiB", crate::message::Tenths(g))
}

/// A GPU of the restore host without room for what is mapped onto it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    pub gpu: GpuUuid,
    pub need: u64,
    pub free: u64,
}

/// Checks that every target GPU has `need` bytes free: the GPUs that do not, and the target
/// GPUs NVML does not know (reported with `free` 0).
#[must_use]
pub fn shortfalls(snapshot: &Snapshot, need: &BTreeMap<GpuUuid, u64>) -> Vec<Shortfall> {
    need.iter()
        .filter_map(|(&gpu, &need)| {
            let free = snapshot.gpu(gpu).map_or(0, |g| g.free);
            (need > free).then_some(Shortfall { gpu, need, free })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn uuid(n: u8) -> GpuUuid {
        GpuUuid([n; 16])
    }

    #[test]
    fn the_branch_is_the_driver_versions_first_number() {
        let report = |v: Result<&str, NvmlReturn>| NodeReport {
            driver_version: v.map(str::to_owned),
            gpus: Vec::new(),
        };
        assert_eq!(report(Ok("580.65.06")).branch(), Some(580));
        assert_eq!(report(Ok("615")).branch(), Some(615));
        assert_eq!(report(Ok("r580")).branch(), None);
        assert_eq!(report(Err(NvmlReturn::ERROR_UNKNOWN)).branch(), None);
    }

    #[test]
    fn task_bytes_sum_per_gpu_and_unknown_accounting_is_none() {
        let s = Snapshot {
            gpus: vec![
                GpuMemory {
                    uuid: uuid(1),
                    total: 80 << 30,
                    free: 10 << 30,
                    processes: vec![(10, Some(40 << 30)), (11, Some(30 << 30))],
                    mig: Some(false),
                },
                GpuMemory {
                    uuid: uuid(2),
                    total: 80 << 30,
                    free: 70 << 30,
                    processes: vec![(10, Some(10 << 30)), (12, None)],
                    mig: Some(true),
                },
            ],
        };
        let t = s.task_bytes(10).unwrap();
        assert_eq!(t[&uuid(1)], 40 << 30);
        assert_eq!(t[&uuid(2)], 10 << 30);
        assert_eq!(s.task_bytes(12), None, "NVML cannot account it");
        assert_eq!(s.task_bytes(99), Some(BTreeMap::new()), "not on any GPU");
        assert_eq!(s.mig_gpus_of(10), vec![uuid(2)], "on the MIG GPU too");
        assert_eq!(s.mig_gpus_of(12), vec![uuid(2)], "listed, unaccounted");
        assert_eq!(s.mig_gpus_of(11), Vec::<GpuUuid>::new(), "not in MIG mode");
        assert_eq!(s.mig_gpus_of(-1), Vec::<GpuUuid>::new());
        assert_eq!(s.all_memory(), 160 << 30);
        let need = BTreeMap::from([(uuid(1), 20 << 30), (uuid(2), 20 << 30), (uuid(3), 1)]);
        let short = shortfalls(&s, &need);
        assert_eq!(
            short,
            vec![
                Shortfall {
                    gpu: uuid(1),
                    need: 20 << 30,
                    free: 10 << 30
                },
                Shortfall {
                    gpu: uuid(3),
                    need: 1,
                    free: 0
                }
            ]
        );
        assert_eq!(gib(80 << 30), "80.0 GiB");
    }

    #[test]
    fn copy_deadlines_grow_with_the_bytes() {
        let t = Some(Duration::from_secs(10));
        assert_eq!(copy_deadline(None, 1 << 40, 1e9), None);
        assert_eq!(copy_deadline(t, 0, 1e9), t);
        // 80 GiB at 1 GB/s: 85.9 s more.
        let d = copy_deadline(t, 80 << 30, DEFAULT_MIN_COPY_RATE).unwrap();
        assert!(
            d > Duration::from_secs(95) && d < Duration::from_secs(97),
            "{d:?}"
        );
        assert!(copy_deadline(t, u64::MAX, 1e-9).is_some(), "saturates");
    }

    #[test]
    fn mem_available_parses_kb() {
        let m = "MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_mem_available(m), Some(20_000_000 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: x kB\n"), None);
        let real = std::fs::read_to_string("/proc/meminfo").unwrap();
        assert!(parse_mem_available(&real).unwrap() > 0);
    }

    proptest! {
        #[test]
        fn deadlines_are_monotone_in_bytes(a in any::<u64>(), b in any::<u64>(), rate in 1e6f64..1e12) {
            let t = Some(Duration::from_secs(1));
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert!(copy_deadline(t, lo, rate) <= copy_deadline(t, hi, rate));
        }

        #[test]
        fn meminfo_parser_never_panics(s in "\\PC{0,200}") {
            let _ = parse_mem_available(&s);
        }
    }
}
