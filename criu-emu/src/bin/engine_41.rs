//! `harness-engine-41`: the engine emulating the Criu41 host profile.

fn main() -> std::process::ExitCode {
    criu_emu::cli::engine_main(criu_emu::profile::HostProfile::Criu41)
}
