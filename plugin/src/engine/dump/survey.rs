//! What the dump learns about sizes once, before its first lock: the GPU memory of the tree
//! (NVML), checked against the host's available memory and for GPUs in MIG mode.

use super::Dump;
use crate::backend::Pid;
use crate::engine::EngineError;
use crate::host::Level;

/// What the dump learnt about sizes, once, before its first lock.
#[derive(Debug, Default)]
pub(super) struct Sizes {
    /// The first pid CRIU paused: the root of the tree.
    pub(super) root: Option<Pid>,
    /// Whether the tree was surveyed (at its first CUDA task).
    pub(super) surveyed: bool,
    /// NVML's answer, when it gave one.
    pub(super) snapshot: Option<crate::nvml::Snapshot>,
}

impl Dump {
    /// Once per dump, before its first lock: how much GPU memory the tree holds (NVML), checked
    /// against the host's available memory (see [`crate::nvml`]).
    pub(super) fn survey(&mut self, pid: Pid) -> Result<(), EngineError> {
        if std::mem::replace(&mut self.sizes.surveyed, true) {
            return Ok(());
        }
        let root = self.sizes.root.unwrap_or(pid);
        let tree = self.core.host.tree(root);
        let snapshot = match self.core.host.gpu_memory(self.core.cfg.timeout) {
            Ok(s) => s,
            Err(e) => {
                self.core.log(
                    Level::Warn,
                    &format!(
                        "{e}: the host-memory check is skipped, and each checkpoint's deadline \
                         assumes it moves all the memory of all GPUs"
                    ),
                );
                return Ok(());
            }
        };
        let mut need = 0u64;
        let mut holders = 0usize;
        let mut unknown = 0usize;
        for &p in &tree {
            match snapshot.task_bytes(p) {
                Some(m) if !m.is_empty() => {
                    holders += 1;
                    need = need.saturating_add(m.values().sum());
                }
                Some(_) => {}
                None => unknown += 1,
            }
        }
        let available = self.core.host.memory_available();
        self.core.log(
            Level::Info,
            &format!(
                "GPU memory of the tree (NVML): {} in {holders} process(es){}; host memory \
                 available: {}",
                crate::nvml::gib(need),
                if unknown > 0 {
                    format!(" ({unknown} more that NVML cannot account)")
                } else {
                    String::new()
                },
                available.map_or_else(|| "unknown".to_owned(), crate::nvml::gib)
            ),
        );
        // The driver cannot checkpoint a process on a MIG instance: refused before any lock.
        let on_mig: Vec<(Pid, abi::GpuUuid)> = tree
            .iter()
            .flat_map(|&p| snapshot.mig_gpus_of(p).into_iter().map(move |g| (p, g)))
            .collect();
        self.core.all_gpus = Some(snapshot.all_memory());
        self.sizes.snapshot = Some(snapshot);
        if !on_mig.is_empty() {
            return Err(EngineError::MigGpu { on_mig });
        }
        match available {
            Some(available) if need > available && !self.core.cfg.skip_capacity_check => {
                Err(EngineError::HostTooSmall {
                    pid,
                    need,
                    available,
                })
            }
            _ => Ok(()),
        }
    }

    /// The device memory of `pid`, when the survey knows it.
    pub(super) fn known_bytes(&self, pid: Pid) -> Option<u64> {
        self.sizes
            .snapshot
            .as_ref()
            .and_then(|s| s.task_bytes(pid))
            .map(|m| m.values().sum())
    }

    /// The device memory of `pid` per GPU, as NVML reported it at the survey.
    pub(super) fn task_bytes(&self, pid: Pid) -> Vec<(abi::GpuUuid, u64)> {
        self.sizes
            .snapshot
            .as_ref()
            .and_then(|s| s.task_bytes(pid))
            .map(|m| m.into_iter().collect())
            .unwrap_or_default()
    }

    /// What a copy of `pid`'s GPU memory moves, for its deadline: its memory by the survey,
    /// when NVML answered (0 where NVML knows nothing of it); else unknown.
    pub(super) fn copy_bytes(&self, pid: Pid) -> Option<u64> {
        self.sizes
            .snapshot
            .is_some()
            .then(|| self.task_bytes(pid).iter().map(|(_, b)| b).sum())
    }
}
