//! Every backend's facts, in one place: its name (the `backend=` option's value, the log's, the
//! messages'), what it drives, the call each operation makes (the driver entry point, or the
//! utility's `--action`), and its capabilities. The plugin (option parsing, the log, the
//! selection's messages), the helper process and the harness (the conformance kit's columns, the
//! fault sweep's call lists) read them from here.
//!
//! A new backend is a [`BackendKind`] variant, one [`Facts`] entry in [`BACKENDS`], its
//! [`super::Backend`] implementation in a module of its own and its probe arm in
//! [`crate::select`]; `CONTRIBUTING.md` ("Adding a backend") walks through it.

use super::Op;
use std::fmt;

/// Which backend is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BackendKind {
    DriverApi,
    CudaCheckpoint,
}

/// How a backend's calls for several tasks overlap (`parallel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// Each call blocks its caller: overlapping calls need threads, which run in the helper
    /// process (inside CRIU only with `guardian=off`, where the plugin keeps them one at a
    /// time: CRIU must stay single-threaded).
    Threads,
    /// Each call is a child process, waited for with one `poll`: they overlap without threads.
    Processes,
}

/// What the plugin knows about one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    pub kind: BackendKind,
    /// The `backend=` option's value, and the backend's name in every message.
    pub name: &'static str,
    /// What it drives, for a heading (the conformance kit's column, the doctor).
    pub title: &'static str,
    /// The call each operation makes, by the name the mock driver's fault injection and the
    /// call trace use: the driver entry point, or `cuda-checkpoint:<action>`.
    pub calls: [(Op, &'static str); 6],
    /// The call that tells whether it can run at all (no target task).
    pub probe_call: &'static str,
    pub overlap: Overlap,
    /// Whether it can move GPU memory through custom storage (CUDA 13.4's
    /// `customStorageInfo_out`), when the driver has it.
    pub custom_storage: bool,
    /// Whether it is a program the plugin runs (so it can crash, or print garbage, on its own).
    pub is_program: bool,
}

impl Facts {
    /// The calls that name a target task, in [`Op`] order.
    pub fn task_calls(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.calls.iter().map(|(_, c)| *c)
    }
}

/// The driver API: `libcuda.so.1`'s `cuCheckpointProcess*` entry points (CUDA 13.0+).
pub const DRIVER_API: Facts = Facts {
    kind: BackendKind::DriverApi,
    name: "driver-api",
    title: "driver API",
    calls: [
        (Op::GetRestoreTid, "cuCheckpointProcessGetRestoreThreadId"),
        (Op::GetState, "cuCheckpointProcessGetState"),
        (Op::Lock, "cuCheckpointProcessLock"),
        (Op::Checkpoint, "cuCheckpointProcessCheckpoint"),
        (Op::Restore, "cuCheckpointProcessRestore"),
        (Op::Unlock, "cuCheckpointProcessUnlock"),
    ],
    probe_call: "cuDriverGetVersion",
    overlap: Overlap::Threads,
    custom_storage: true,
    is_program: false,
};

/// NVIDIA's `cuda-checkpoint` utility (r555+; `--device-map` from r580).
pub const CUDA_CHECKPOINT: Facts = Facts {
    kind: BackendKind::CudaCheckpoint,
    name: "cuda-checkpoint",
    title: "cuda-checkpoint",
    calls: [
        (Op::GetRestoreTid, "cuda-checkpoint:get-restore-tid"),
        (Op::GetState, "cuda-checkpoint:get-state"),
        (Op::Lock, "cuda-checkpoint:lock"),
        (Op::Checkpoint, "cuda-checkpoint:checkpoint"),
        (Op::Restore, "cuda-checkpoint:restore"),
        (Op::Unlock, "cuda-checkpoint:unlock"),
    ],
    probe_call: "cuda-checkpoint:help",
    overlap: Overlap::Processes,
    custom_storage: false,
    is_program: true,
};

/// Every backend, in the order `backend=auto` prefers them ([`crate::select::select`] probes
/// them in this order and takes the first that is supported).
pub const BACKENDS: [Facts; 2] = [DRIVER_API, CUDA_CHECKPOINT];

impl BackendKind {
    /// Its facts.
    #[must_use]
    pub fn facts(self) -> &'static Facts {
        match self {
            BackendKind::DriverApi => &DRIVER_API,
            BackendKind::CudaCheckpoint => &CUDA_CHECKPOINT,
        }
    }

    /// The backend named `name` (the `backend=` option's spelling).
    #[must_use]
    pub fn from_name(name: &str) -> Option<BackendKind> {
        BACKENDS.iter().find(|f| f.name == name).map(|f| f.kind)
    }

    /// Every backend's name, in [`BACKENDS`] order, joined with `", "`.
    #[must_use]
    pub fn names() -> String {
        BACKENDS
            .iter()
            .map(|f| f.name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.facts().name)
    }
}

/// The backend whose call `call` is (a name of [`Facts::calls`] or [`Facts::probe_call`]).
#[must_use]
pub fn backend_of_call(call: &str) -> Option<&'static Facts> {
    BACKENDS
        .iter()
        .find(|f| f.probe_call == call || f.task_calls().any(|c| c == call))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_is_listed_once_with_its_own_facts() {
        for (i, f) in BACKENDS.iter().enumerate() {
            assert_eq!(f.kind.facts(), f, "{} is its kind's facts", f.name);
            assert_eq!(BackendKind::from_name(f.name), Some(f.kind));
            assert_eq!(f.kind.to_string(), f.name);
            assert!(
                BACKENDS[i + 1..]
                    .iter()
                    .all(|g| g.kind != f.kind && g.name != f.name),
                "{} listed twice",
                f.name
            );
            let ops: Vec<Op> = f.calls.iter().map(|(o, _)| *o).collect();
            assert_eq!(
                ops,
                [
                    Op::GetRestoreTid,
                    Op::GetState,
                    Op::Lock,
                    Op::Checkpoint,
                    Op::Restore,
                    Op::Unlock
                ],
                "{}: one call per task operation, in Op order",
                f.name
            );
            for c in f.task_calls().chain([f.probe_call]) {
                assert_eq!(backend_of_call(c).map(|b| b.kind), Some(f.kind), "{c}");
            }
        }
        assert_eq!(BackendKind::names(), "driver-api, cuda-checkpoint");
        assert_eq!(BackendKind::from_name("auto"), None);
        assert!(
            DRIVER_API
                .task_calls()
                .eq(crate::ffi::cuda::CHECKPOINT_SYMBOLS),
            "the driver API's calls are the entry points the plugin resolves"
        );
    }
}
