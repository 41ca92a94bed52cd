//! The test orchestrator around the emulated CRIU ([`criu_emu`]) and real CRIU: the scenario
//! corpus, its runner, the conformance kit, the fault sweep and the chaos soak.
//!
//! * [`scenario`]: the regression scenario file format; [`runner`]: its executor; [`kit`]: the
//!   plugin under test and which scenarios apply to it (the conformance kit); [`junit`]: JUnit
//!   XML of a run; [`conformance`]: the conformance table of several plugins.
//! * [`sweep`]: the fault sweep (`harness sweep`); [`soak`]: the chaos soak (`harness soak`).
//! * `ffi`: every `unsafe` block (a workload tree's descriptor hygiene).
//!
//! The emulated CRIU's modules that the runner and the tests use are re-exported here
//! ([`profile`], [`pstree`], [`images`], [`inventory`]).

#![deny(unsafe_code)]

pub use criu_emu::{images, inventory, profile, pstree};

pub mod conformance;
#[expect(
    unsafe_code,
    reason = "the one module tree allowed to hold unsafe code"
)]
pub mod ffi;
pub mod junit;
pub mod kit;
mod procfs;
pub mod runner;
pub mod scenario;
pub mod soak;
pub mod sweep;
mod workload;
