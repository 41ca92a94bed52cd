//! `harness-engine-41`: the engine emulating the Criu41 host profile.

fn main() -> std::process::ExitCode {
    harness::cli::engine_main(harness::profile::HostProfile::Criu41)
}
