//! Connection epochs (PROTOCOL.md section 3): a hello from an attempt
//! older than the live session of the same supervisor instance is refused.
//! The rule itself is [`crate::store::is_stale`]; here are its refusal and
//! the early check of a sandbox session's hello.

use openshell_proto::SupervisorHello;
use tonic::Status;

use super::{Sessions, is_stale};

/// The refusal of a stale hello.
pub fn stale_status(epoch: u64, newer: u64) -> Status {
    Status::aborted(format!(
        "connection epoch {epoch} is older than this supervisor's live session \
         (epoch {newer}): a newer connection holds the session"
    ))
}

impl Sessions {
    /// Refuses a hello from an attempt older than the live session of the
    /// same supervisor instance here (see [`is_stale`]), before any work is
    /// done for it. [`Sessions::accept`] checks again as it registers.
    pub fn refuse_stale(&self, sandbox_id: &str, hello: &SupervisorHello) -> Result<(), Status> {
        match self.sessions.lock().unwrap().get(sandbox_id) {
            Some(live)
                if is_stale(
                    (&live.instance_id, live.epoch),
                    &hello.instance_id,
                    hello.connection_epoch,
                ) =>
            {
                Err(stale_status(hello.connection_epoch, live.epoch))
            }
            _ => Ok(()),
        }
    }
}
