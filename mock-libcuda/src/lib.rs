//! `mock-libcuda`: a `libcuda.so.1` stand-in for hardware-free testing of CUDA checkpointing.
//!
//! * [`world`] is the scripted, cross-process world on disk (config, state, trace, faults, the
//!   time model), the `mock-cuda-world` crate, shared with the NVML stand-in (`mock-nvml`).
//! * [`driver`] holds the behaviour of every driver entry point, in safe Rust.
//! * [`target`] holds what lives inside a CUDA process: the restore thread, the API gate, device
//!   memory moves on checkpoint and restore.
//! * [`custom`] holds custom storage (CUDA 13.4), the caller's side: operations, their device
//!   pointers, streams, the caller's copies.
//! * [`devmem`] holds virtual device memory: allocations accounted at their size that store
//!   only a bounded sample of real bytes.
//! * [`cli`] holds the `cuda-checkpoint` command line the driver serves through its export table.
//! * [`visible`] holds `CUDA_VISIBLE_DEVICES`.
//! * [`elf`] (from `mock-cuda-world`) holds hiding exported symbols in a world's copy of the
//!   library.
//! * [`ffi`] holds the C ABI (all `unsafe` code).

#![deny(unsafe_code)]

pub mod cli;
pub mod cli_api;
pub mod cli_entry;
pub mod custom;
pub mod devmem;
pub mod driver;
#[expect(
    unsafe_code,
    reason = "the one module tree allowed to hold unsafe code"
)]
pub mod ffi;
pub mod target;
pub mod visible;

pub use mock_cuda_world as world;
pub use mock_cuda_world::elf;
