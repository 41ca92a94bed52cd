//! Every `unsafe` block of the emulated CRIU lives under this module tree.
//!
//! * [`dl`]: `dlopen`/`dlsym` of plugins, reading their descriptor and option metadata, and
//!   calling their `init`, `exit` and hooks through the C ABI.
//! * [`host`]: the Rust side of the exported host symbols (the `harness_rs_*` callbacks the C
//!   shim forwards to), the writes to the exported `opts`/`fi_strategy` data, and the SIGALRM
//!   handler of the freeze timeout.

pub mod dl;
pub mod host;
