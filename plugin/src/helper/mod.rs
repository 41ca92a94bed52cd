//! The plugin's helper process itself: how it is started ([`spawn`], forked twice by
//! [`crate::ffi::agent`]), its main loop ([`server`]), the calls it runs for CRIU ([`calls`])
//! and the guardian that puts the tasks back should CRIU die ([`guardian`]). Why a process, and
//! CRIU's side of it, are in [`crate::agent`]. It sits above custom storage's copier
//! ([`crate::cstore::copier`]), which it runs when started as `cuda-copier`.

pub mod calls;
pub mod guardian;
pub mod server;

use crate::agent::client;
use crate::agent::AgentError;
use crate::ffi::agent::{self as sys, Channel};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// Starts a helper process and connects to it. `image_dir` (CRIU's image directory, duplicated
/// for the helper) is where the guardian writes its log.
pub fn spawn(image_dir: Option<RawFd>) -> Result<client::Link, AgentError> {
    let link = spawn_named(image_dir, c"cuda-guardian")?;
    // Should this helper die with work left (killed by an operator, a cgroup's OOM killer, a
    // node agent), a fresh one takes over; CRIU's image directory stays open for CRIU's whole
    // run, so the number stays good.
    Ok(link.revivable(Box::new(move || start_named(image_dir, c"cuda-guardian"))))
}

/// [`spawn`] with the process name `name` (`cuda-copier` for custom storage's copier, see
/// [`crate::cstore`]).
pub fn spawn_named(
    image_dir: Option<RawFd>,
    name: &'static std::ffi::CStr,
) -> Result<client::Link, AgentError> {
    client::Link::connect(start_named(image_dir, name)?, client::HELLO_LIMIT)
}

/// Forks a helper named `name` and returns CRIU's end of its channel (the hello is still to
/// come).
fn start_named(
    image_dir: Option<RawFd>,
    name: &'static std::ffi::CStr,
) -> Result<Channel, AgentError> {
    let (criu_end, agent_end) = Channel::pair().map_err(|e| AgentError::Channel(Arc::new(e)))?;
    let pidfd = sys::self_pidfd();
    let dir: Option<OwnedFd> = image_dir.and_then(|fd| sys::dup(fd).ok());
    let criu_pid = crate::backend::Pid::try_from(std::process::id()).unwrap_or(0);
    let mut keep = vec![agent_end.fd().as_raw_fd()];
    keep.extend(pidfd.as_ref().map(AsRawFd::as_raw_fd));
    keep.extend(dir.as_ref().map(AsRawFd::as_raw_fd));
    let spawned = sys::spawn_detached(&keep, name, move || {
        server::serve(agent_end, pidfd, dir, criu_pid)
    });
    // The closure (and with it the helper's descriptors) was moved into the fork and dropped
    // here: CRIU keeps only its own end.
    spawned.map_err(|e| AgentError::Spawn(Arc::new(e)))?;
    Ok(criu_end)
}
