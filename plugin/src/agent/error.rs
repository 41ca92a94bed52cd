//! What can go wrong between the plugin and its helper process, typed: why a helper is gone
//! ([`Gone`]) and why the plugin could not use one ([`AgentError`]). The messages are the ones
//! CRIU's log has always shown; callers that hand a reason on as text ([`crate::worker::CallError`])
//! use their `Display`.

use super::proto::{DecodeError, Reply};
use crate::message::Span;
use crate::task::Pid;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// Why the helper process is gone (its end of the channel closed, or the channel failed).
#[derive(Debug, Clone, thiserror::Error)]
pub enum Gone {
    /// Its end of the channel closed: it exited or was killed.
    #[error("it exited")]
    Exited,
    /// Waiting on the channel failed.
    #[error("cannot wait for it: {0}")]
    Wait(Arc<io::Error>),
    /// Sending or receiving failed otherwise.
    #[error("{0}")]
    Channel(Arc<io::Error>),
    /// It sent what does not decode (a bug, or the plugin's two halves from different builds).
    #[error(transparent)]
    Undecodable(DecodeError),
}

impl Gone {
    /// The reason an I/O error on the channel gives: [`Gone::Exited`] for the kinds that mean
    /// the other end closed (`eof` for a receive, a broken pipe or reset for a send).
    pub(crate) fn from_io(e: io::Error, closed: &[io::ErrorKind]) -> Gone {
        if closed.contains(&e.kind()) {
            Gone::Exited
        } else {
            Gone::Channel(Arc::new(e))
        }
    }
}

/// Why the plugin could not start, reach or replace its helper process.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    /// The socket pair could not be made.
    #[error("cannot create the helper's channel: {0}")]
    Channel(Arc<io::Error>),
    /// The fork failed.
    #[error("cannot start the helper process: {0}")]
    Spawn(Arc<io::Error>),
    /// The new helper went away before its hello.
    #[error("the helper process failed to start: {0}")]
    DiedStarting(Gone),
    /// The new helper said nothing within the limit.
    #[error("the helper process did not start within {}", Span(*.0))]
    NoHello(Duration),
    /// The helper is gone.
    #[error("{0}")]
    Gone(Gone),
    /// A call of a revival got no answer within the limit.
    #[error("no answer within {}", Span(*.0))]
    NoAnswer(Duration),
    /// A revival's call got an answer of the wrong kind.
    #[error("{0:?}")]
    UnexpectedReply(Box<Reply>),
    /// The helper did not exit when told to.
    #[error("the helper process did not exit within {} of being told to", Span(*.0))]
    NoExit(Duration),
    /// The helper died and this run already started as many fresh ones as it may.
    #[error("{why}; {max} fresh helper(s) were already started in this run")]
    RevivalsSpent { why: Gone, max: u32 },
    /// The helper died and no fresh one could be started.
    #[error("{why}; no fresh helper could take over: {cause}")]
    NoTakeover { why: Gone, cause: Box<AgentError> },
    /// The fresh helper could not load the driver.
    #[error("{why}; the fresh helper {pid} could not load the driver: {cause}")]
    FreshProbe {
        why: Gone,
        pid: Pid,
        cause: Box<AgentError>,
    },
    /// `cuInit` failed in the fresh helper.
    #[error("{why}; cuInit failed in the fresh helper {pid}: {cause}")]
    FreshInit {
        why: Gone,
        pid: Pid,
        cause: Box<AgentError>,
    },
    /// The fresh helper could not be told the guardian's configuration and tasks.
    #[error("{why}; the fresh helper {pid} did not take its notes: {cause}")]
    FreshNotes {
        why: Gone,
        pid: Pid,
        cause: Box<AgentError>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_as_before() {
        assert_eq!(Gone::Exited.to_string(), "it exited");
        let e = AgentError::NoTakeover {
            why: Gone::Exited,
            cause: Box::new(AgentError::NoHello(Duration::from_secs(5))),
        };
        assert_eq!(
            e.to_string(),
            "it exited; no fresh helper could take over: the helper process did not start \
             within 5s"
        );
        assert_eq!(
            AgentError::RevivalsSpent {
                why: Gone::Exited,
                max: 2
            }
            .to_string(),
            "it exited; 2 fresh helper(s) were already started in this run"
        );
        assert_eq!(
            Gone::from_io(
                io::Error::from(io::ErrorKind::UnexpectedEof),
                &[io::ErrorKind::UnexpectedEof]
            )
            .to_string(),
            "it exited"
        );
    }
}
