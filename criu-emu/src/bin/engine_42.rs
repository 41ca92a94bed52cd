//! `harness-engine-42`: the engine emulating the Criu42 host profile.

fn main() -> std::process::ExitCode {
    criu_emu::cli::engine_main(criu_emu::profile::HostProfile::Criu42)
}
