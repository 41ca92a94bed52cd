//! `zdtm-cuda`: real CUDA workloads checkpointed and restored through real CRIU with
//! `cuda_plugin.so`, in the style of CRIU's ZDTM static tests, and their runner.
//!
//! | Module | Role |
//! |---|---|
//! | [`workloads`] | The CUDA programs (embedded sources) and what each needs. |
//! | [`toolchain`] | Finding nvcc (system or Python wheels) and compiling the workloads. |
//! | [`detect`] | Driver, GPUs, nvcc, cuBLAS, CRIU 4.0+, root; the skip reason of each test. |
//! | [`runner`] | One test through `criu dump` / `criu restore`, with its timings. |
//! | [`plugin_log`] | The plugin's phase timings from CRIU's logs. |
//! | [`report`] | The human table and JUnit XML. |
//! | [`cli`] | The command line. |

pub mod cli;
pub mod detect;
pub mod plugin_log;
pub mod report;
pub mod runner;
pub mod toolchain;
pub mod workloads;
