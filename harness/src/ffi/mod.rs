//! Every `unsafe` block of the harness lives under this module tree (the emulated CRIU's are in
//! `criu_emu::ffi`).
//!
//! * [`spawn`]: starting a workload tree that inherits no stray descriptor.

pub mod spawn;
