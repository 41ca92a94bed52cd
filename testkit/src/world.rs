//! Mock-world fixtures: the GPUs and config text the tests' worlds share, and the environment
//! that points a child process at a world.

use std::path::Path;
use std::process::Command;

pub use mock_cuda_world::client::{CudaState, MockWorld};

/// The three GPUs of the test worlds (two of one chip, one of another).
pub const GPU0: &str = "GPU-00000000-0000-4000-8000-000000000000";
/// The second H100.
pub const GPU1: &str = "GPU-11111111-1111-4111-8111-111111111111";
/// The A100.
pub const GPU2: &str = "GPU-22222222-2222-4222-8222-222222222222";

/// A `[[gpu]]` table: an H100 (GH100) with 64 MiB.
pub fn h100(uuid: &str) -> String {
    format!(
        "\n[[gpu]]\nuuid = \"{uuid}\"\nname = \"NVIDIA H100 80GB HBM3\"\nmemory_mib = 64\nchip = \"GH100\"\n"
    )
}

/// A `[[gpu]]` table: an A100 (GA100) with 64 MiB.
pub fn a100(uuid: &str) -> String {
    format!(
        "\n[[gpu]]\nuuid = \"{uuid}\"\nname = \"NVIDIA A100-SXM4-80GB\"\nmemory_mib = 64\nchip = \"GA100\"\n"
    )
}

/// A world config: driver `branch` with `driver_lines` (TOML of the `[driver]` table) and two
/// H100s ([`GPU0`], [`GPU1`]).
pub fn two_h100(branch: u32, driver_lines: &str) -> String {
    format!(
        "schema = 1\n[driver]\nbranch = {branch}\n{driver_lines}\n{}{}",
        h100(GPU0),
        h100(GPU1)
    )
}

/// Points `cmd` at the world in `dir`: `MOCK_CUDA_WORLD` and the world's `libcuda.so.1`.
pub fn env(cmd: &mut Command, dir: &Path) {
    cmd.env("MOCK_CUDA_WORLD", dir)
        .env("LD_LIBRARY_PATH", dir.join("lib"));
}
