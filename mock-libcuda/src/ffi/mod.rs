//! Everything `unsafe` in the mock: the C ABI surface ([`exports`]) and the few system calls
//! without a safe wrapper ([`sys`]).

pub mod exports;
pub mod sys;

/// Every driver symbol the library exports (what a world can hide).
pub use mock_cuda_world::DRIVER_SYMBOLS as EXPORTED_SYMBOLS;
