//! Dev-only support shared by the workspace's tests (issue 18, "Test support"): each test crate
//! takes it as a `[dev-dependency]` instead of carrying its own copy.
//!
//! - [`artifacts`]: where the built programs and libraries are (the target directory of the
//!   running test binary, or `$CRIU_CUDA_ARTIFACTS` where `scripts/test.sh` built them) and
//!   the nested `cargo build` that refreshes them when the variable is unset;
//! - [`criu`]: the plugin's real-CRIU tests and benchmarks (CRIU binaries, worlds, logs);
//! - [`wait`]: the one "poll a condition until a deadline" helper;
//! - [`proc`]: signals and `/proc/<pid>` (threads, states, tracers, environments);
//! - [`stage`]: programs another user must run, staged where that user can reach them;
//! - [`world`]: mock-world fixtures (GPUs, config text, the environment of a child);
//! - [`read`]: a file's text, or "" when it cannot be read.

pub mod artifacts;
pub mod criu;
pub mod proc;
pub mod stage;
pub mod wait;
pub mod world;

use std::path::Path;

/// The text of `p`, or "" when it cannot be read (reports and logs that may not exist yet).
pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}
