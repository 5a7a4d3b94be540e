//! The signals that end a command early: SIGINT (Ctrl-C outside raw mode),
//! SIGTERM, SIGHUP. Each becomes exit code 128 + n once the command's
//! future is dropped, so guards (raw mode, forwards) clean up first.

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::failure::{Failure, io};

pub struct Interrupts {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Interrupts {
    pub fn new() -> Result<Self, Failure> {
        let make =
            |kind: SignalKind| signal(kind).map_err(|e| io("installing a signal handler", &e));
        Ok(Self {
            int: make(SignalKind::interrupt())?,
            term: make(SignalKind::terminate())?,
            hup: make(SignalKind::hangup())?,
        })
    }

    /// The exit code of the first signal that arrives.
    pub async fn recv(&mut self) -> u8 {
        tokio::select! {
            _ = self.int.recv() => 128 + libc::SIGINT as u8,
            _ = self.term.recv() => 128 + libc::SIGTERM as u8,
            _ = self.hup.recv() => 128 + libc::SIGHUP as u8,
        }
    }
}
