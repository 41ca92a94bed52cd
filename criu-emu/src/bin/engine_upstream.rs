//! `harness-engine-upstream`: the engine emulating the Upstream host profile.

fn main() -> std::process::ExitCode {
    criu_emu::cli::engine_main(criu_emu::profile::HostProfile::Upstream)
}
