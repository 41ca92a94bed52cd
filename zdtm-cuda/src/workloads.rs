//! The CUDA workloads: their sources (embedded, so the binary can build them anywhere) and what
//! each one needs.
//!
//! Every workload follows the protocol of `workloads/zdtm_cuda.h`: it prints
//! `READY bytes=<device bytes>` once set up, waits for SIGUSR1 (sent after the restore), verifies
//! its state with data and ends with `PASS` (exit 0), `FAIL: <reason>` (exit 1) or, when a
//! precondition is missing, `SKIP: <reason>` (exit [`EXIT_SKIP`]).

/// Exit code of a workload that passed.
pub const EXIT_PASS: i32 = 0;
/// Exit code of a workload that failed.
pub const EXIT_FAIL: i32 = 1;
/// Exit code of a workload that skipped itself (a missing precondition; the line says which).
pub const EXIT_SKIP: i32 = 77;

/// The shared protocol header, as `(file name, contents)`.
pub const HEADER: (&str, &str) = ("zdtm_cuda.h", include_str!("../workloads/zdtm_cuda.h"));

/// One workload program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    /// The test name, also the binary's and the source's stem.
    pub name: &'static str,
    /// What it checks, in one line.
    pub summary: &'static str,
    /// The CUDA C++ source.
    pub source: &'static str,
    /// GPUs needed (the workload also skips itself with fewer).
    pub min_gpus: u32,
    /// Whether it needs cuBLAS at run time (loaded with `dlopen`; nothing at build time).
    pub needs_cublas: bool,
}

impl Workload {
    /// The source file name.
    #[must_use]
    pub fn source_file(&self) -> String {
        format!("{}.cu", self.name)
    }
}

macro_rules! workload {
    ($name:literal, $summary:literal, gpus = $g:literal, cublas = $c:literal) => {
        Workload {
            name: $name,
            summary: $summary,
            source: include_str!(concat!("../workloads/", $name, ".cu")),
            min_gpus: $g,
            needs_cublas: $c,
        }
    };
}

/// Every workload, in run order.
pub const ALL: &[Workload] = &[
    workload!("cuda00", "device memory contents", gpus = 1, cublas = false),
    workload!(
        "cuda_streams00",
        "streams and events, ordered work in flight at the dump",
        gpus = 1,
        cublas = false
    ),
    workload!(
        "cuda_zerocopy00",
        "mapped pinned host memory",
        gpus = 1,
        cublas = false
    ),
    workload!(
        "cuda_mempool00",
        "stream-ordered allocations and memory pools",
        gpus = 1,
        cublas = false
    ),
    workload!(
        "cuda_graph00",
        "a captured graph relaunched after the restore",
        gpus = 1,
        cublas = false
    ),
    workload!(
        "cuda_cublas00",
        "a cuBLAS handle and GEMMs checked against the CPU",
        gpus = 1,
        cublas = true
    ),
    workload!(
        "cuda_multigpu00",
        "one allocation per GPU (needs two or more)",
        gpus = 2,
        cublas = false
    ),
];

/// The workload called `name`.
#[must_use]
pub fn find(name: &str) -> Option<&'static Workload> {
    ALL.iter().find(|w| w.name == name)
}
