//! `harness-engine-pr3076`: the engine emulating the Pr3076 host profile.

fn main() -> std::process::ExitCode {
    criu_emu::cli::engine_main(criu_emu::profile::HostProfile::Pr3076)
}
