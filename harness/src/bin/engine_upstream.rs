//! `harness-engine-upstream`: the engine emulating the Upstream host profile.

fn main() -> std::process::ExitCode {
    harness::cli::engine_main(harness::profile::HostProfile::Upstream)
}
