//! `harness-engine-pr3076`: the engine emulating the Pr3076 host profile.

fn main() -> std::process::ExitCode {
    harness::cli::engine_main(harness::profile::HostProfile::Pr3076)
}
