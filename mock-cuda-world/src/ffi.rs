//! Everything `unsafe` in the world crate: ending the calling process with a signal, as a
//! driver bug or the kernel's OOM killer would.

/// Crashes the calling process with `signal` (default SIGSEGV), as a driver bug would.
pub fn crash(signal: Option<&str>) -> ! {
    use std::str::FromStr;
    let sig = signal
        .and_then(|s| {
            let s = s.to_ascii_uppercase();
            let s = if s.starts_with("SIG") {
                s
            } else {
                format!("SIG{s}")
            };
            nix::sys::signal::Signal::from_str(&s).ok()
        })
        .unwrap_or(nix::sys::signal::Signal::SIGSEGV);
    // Make sure the default action runs even if the host installed a handler.
    // SAFETY: resetting a signal disposition to SIG_DFL has no memory-safety preconditions.
    let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl) };
    let _ = nix::sys::signal::raise(sig);
    std::process::abort()
}
