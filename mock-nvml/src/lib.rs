//! `mock-nvml`: a `libnvidia-ml.so.1` stand-in served by the mock CUDA world
//! (`MOCK_CUDA_WORLD`, the `mock-cuda-world` crate, shared with `mock-libcuda`), for hardware-free testing of code that asks NVML
//! how much GPU memory each process holds.
//!
//! * [`nvml`] holds the behaviour of every entry point, in safe Rust: initialisation, the
//!   world's GPUs (host order, as NVML enumerates them; `CUDA_VISIBLE_DEVICES` does not apply),
//!   their memory (logical sizes: a virtual allocation counts in full), and the compute
//!   processes of each GPU with the memory they use, by pid.
//! * [`ffi`] holds the C ABI (all `unsafe` code), every export under one panic guard.
//!
//! Every call is traced in the world's `trace.log` like a driver call
//! (`<pid> nvmlDeviceGetCount_v2() = NVML_SUCCESS`), and the world's `[[fault]]`s can make any
//! of them (but `nvmlErrorString`) return a code, fail after doing its work, hang, sleep or
//! crash. `mock-world init` installs this library as `<world>/lib/libnvidia-ml.so.1` unless the
//! world says `[nvml] present = false`.

#![deny(unsafe_code)]

#[expect(unsafe_code, reason = "the one module allowed to hold unsafe code")]
pub mod ffi;
pub mod nvml;
