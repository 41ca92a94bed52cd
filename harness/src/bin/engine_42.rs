//! `harness-engine-42`: the engine emulating the Criu42 host profile.

fn main() -> std::process::ExitCode {
    harness::cli::engine_main(harness::profile::HostProfile::Criu42)
}
