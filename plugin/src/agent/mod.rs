//! CRIU's side of the plugin's helper process ([`crate::helper`]: its main loop, the guardian
//! and how it is started): the protocol ([`proto`]), the link ([`client`]), typed errors
//! ([`error`]), where driver work runs ([`Access`]) and what the engine tells the guardian
//! ([`Guard`]).
//!
//! The helper process runs the driver calls, so that CRIU stays single-threaded,
//! and it guards the CUDA tasks, so that CRIU's death cannot leave them locked or checkpointed.
//!
//! # Why a process
//!
//! * **CRIU must stay single-threaded.** After CHECKPOINT_DEVICES, CRIU dumps the tree's mount
//!   namespaces with `setns(CLONE_NEWNS)`, which fails with `EINVAL` in a process with other
//!   threads (they share its filesystem context). A driver call that can block needs a deadline,
//!   and a thread to be abandoned on timeout; `cuInit` itself may start driver threads in its
//!   caller. Here every driver call (the probe, `cuInit`, the GPU enumeration, NVML and the
//!   `cuCheckpointProcess*` calls) runs in the helper, one thread per call there, while CRIU waits
//!   on the channel with `poll` and a deadline. The `cuda-checkpoint` backend already needs no
//!   thread: its runs are child processes waited for with `poll`.
//! * **CRIU can die mid-operation** (the OOM killer, `kill -9` by a runtime whose checkpoint
//!   timed out, a crash, its own `BUG()`). The kernel then detaches the tree, but every task the
//!   plugin had locked or checkpointed would stay so, its next CUDA call blocking forever. The
//!   plugin tells the helper, before each state change, which task it is about to change and what
//!   that task's state was when the dump started ([`proto::ToAgent::Track`],
//!   [`proto::ToAgent::Intent`]), and at a normal end tells it to exit
//!   ([`proto::ToAgent::Finish`]). If the channel closes (or CRIU's pidfd fires) without that
//!   word, the helper is the *guardian* ([`crate::helper::guardian`]): it waits for calls in flight and for the
//!   tasks to be untraced, then drives each back to its dump-start state with the backend CRIU was
//!   using, with deadlines, logging to `cuda-plugin-guardian.log` in the image directory and to
//!   syslog. At restore it kills the surviving tasks (`on-restore-failure=kill`, CRIU's own rule
//!   for a failed restore) or finishes their restore (`leave`).
//!
//! # Its life
//!
//! It is forked (twice, see [`crate::ffi::agent`]) at `init` while CRIU is still single-threaded
//! and before any CUDA call in CRIU, so it never inherits a driver state it cannot use. It is in
//! a session of its own, holds no descriptor of CRIU's but its end of the channel, CRIU's pidfd
//! and the image directory, and is nobody's child in CRIU: CRIU reaps the intermediate child
//! before `init` returns, and its restore's SIGCHLD handler (installed after `init`) never sees
//! the helper. It exits when told, when CRIU has gone and there is nothing to put back, or when
//! the guardian has done its work; the guardian's own waits are bounded (see
//! [`crate::helper::guardian`]'s constants). `cuda_plugin.guardian=off` starts no helper at all: driver calls
//! then run on threads inside CRIU, as before.

pub mod client;
pub mod error;
pub mod proto;

pub use error::{AgentError, Gone};

/// What the engine tells the guardian before it changes a task's state (see the module's docs).
/// Each note returns an error when it could not be delivered.
pub trait Guard: Send {
    /// `pid` is about to be changed; `target` is the state to put it back to.
    fn track(
        &self,
        pid: crate::task::Pid,
        target: abi::CUprocessState,
        bytes: Option<u64>,
        pairs: &[crate::backend::GpuPair],
    ) -> Result<(), AgentError>;
    /// `op` is about to start on `pid`.
    fn intent(&self, pid: crate::task::Pid, op: crate::backend::Op) -> Result<(), AgentError>;
    /// `pid` is back in its target state (or gone).
    fn untrack(&self, pid: crate::task::Pid) -> Result<(), AgentError>;
}

/// Where the plugin's driver work runs: in the helper when one runs, else on `worker` threads.
#[derive(Debug, Clone)]
pub struct Access {
    pub worker: crate::worker::Worker,
    pub link: Option<std::sync::Arc<client::Link>>,
}

impl Access {
    /// Probes the driver API (see [`crate::backend::driver::probe_driver`]), giving up after
    /// `limit`.
    #[must_use]
    pub fn probe(
        &self,
        call_init: bool,
        limit: Option<std::time::Duration>,
    ) -> crate::backend::driver::DriverProbe {
        use crate::backend::driver::{DriverHandle, DriverProbe};
        let what = "cuDriverGetVersion/cuInit";
        let failed = |e: crate::worker::CallError| {
            DriverProbe::Error(format!("probing libcuda.so.1 ({what}): {e}"))
        };
        let Some(link) = &self.link else {
            return match self.worker.call(what, limit, move || {
                crate::backend::driver::probe_driver(crate::ffi::cuda::load(), call_init)
            }) {
                Ok(p) => p,
                Err(e) => failed(e),
            };
        };
        match link.call(what, proto::Call::Probe { call_init }, limit) {
            Ok(proto::Reply::Probe(proto::ProbeReply::Supported {
                version,
                init,
                custom_storage,
            })) => DriverProbe::Supported {
                driver: DriverHandle::Exec(std::sync::Arc::clone(link) as _),
                version,
                init: init.map(abi::CUresult),
                custom_storage,
            },
            Ok(proto::Reply::Probe(proto::ProbeReply::Unsupported(why))) => {
                DriverProbe::Unsupported(why)
            }
            Ok(proto::Reply::Probe(proto::ProbeReply::Error(why))) => DriverProbe::Error(why),
            Ok(other) => DriverProbe::Error(format!(
                "probing libcuda.so.1: the helper answered {other:?}"
            )),
            Err(e) => failed(e),
        }
    }

    /// The GPUs of CRIU's view (see [`crate::ffi::cuda::enumerate_gpus`]), within `limit`.
    pub fn current_gpus(
        &self,
        limit: Option<std::time::Duration>,
    ) -> Result<Vec<crate::inventory::GpuInfo>, crate::machine::GpuError> {
        use crate::machine::GpuError;
        let Some(link) = &self.link else {
            return crate::machine::enumerate_gpus_within(&self.worker, limit);
        };
        match link.call("cuInit/GPU enumeration", proto::Call::Gpus, limit) {
            Ok(proto::Reply::Gpus(r)) => r
                .map(|g| g.into_iter().map(Into::into).collect())
                .map_err(GpuError::Relayed),
            Ok(other) => Err(GpuError::Protocol(format!("{other:?}"))),
            Err(e) => Err(GpuError::Call(e)),
        }
    }

    /// NVML's view of the GPUs' memory, within `limit`.
    pub fn gpu_memory(
        &self,
        limit: Option<std::time::Duration>,
    ) -> Result<crate::nvml::Snapshot, crate::nvml::NvmlError> {
        use crate::nvml::NvmlError;
        let Some(link) = &self.link else {
            return crate::ffi::nvml::snapshot_within(&self.worker, limit);
        };
        match link.call("NVML memory query", proto::Call::Nvml, limit) {
            Ok(proto::Reply::Nvml(r)) => r.map(Into::into).map_err(NvmlError::Helper),
            Ok(other) => Err(NvmlError::Helper(format!(
                "NVML: the helper answered {other:?}"
            ))),
            Err(e) => Err(NvmlError::Stuck(e.to_string())),
        }
    }
}
