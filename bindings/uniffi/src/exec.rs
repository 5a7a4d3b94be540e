//! [`ExecSession`]: a running command whose events the JVM pulls one at a
//! time (`next()`), with stdin for an interactive exec.
//!
//! `cancel()` (or the last reference going away) drops the core stream,
//! which resets the call: the gateway kills the process group. A `next()`
//! in flight when `cancel()` runs ends with `cancelled`; so does a
//! coroutine cancelled inside `next()`, whose Rust future is dropped (the
//! stream itself stays until `cancel()` or the handle is freed).

use futures::StreamExt;
use openshell_sdk::{CancellationToken, ExecInput, ExecStream};
use tokio::sync::Mutex;

use crate::errors::{OpenShellError, invalid};

/// One event of a running command; `Exit` is always the last.
#[derive(Debug, Clone, uniffi::Enum)]
pub enum ExecEvent {
    Stdout {
        data: Vec<u8>,
    },
    Stderr {
        data: Vec<u8>,
    },
    /// The process ended (signals as 128+n, an expired timeout as 124).
    Exit {
        exit_code: i32,
    },
}

struct Events {
    /// `None` once ended or cancelled.
    stream: Option<ExecStream>,
}

/// A running command.
#[derive(uniffi::Object)]
pub struct ExecSession {
    input: Option<ExecInput>,
    events: Mutex<Events>,
    cancel: CancellationToken,
}

impl ExecSession {
    pub(crate) fn new(
        input: Option<ExecInput>,
        stream: ExecStream,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            input,
            events: Mutex::new(Events {
                stream: Some(stream),
            }),
            cancel,
        }
    }

    fn input(&self) -> Result<&ExecInput, OpenShellError> {
        self.input
            .as_ref()
            .ok_or_else(|| invalid("stdin is only open on an interactive exec"))
    }
}

#[uniffi::export(async_runtime = "tokio")]
impl ExecSession {
    /// The next event; `None` after the exit event.
    pub async fn next(&self) -> Result<Option<ExecEvent>, OpenShellError> {
        let mut events = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Err(openshell_sdk::Error::Cancelled.into()),
            events = self.events.lock() => events,
        };
        let Some(stream) = events.stream.as_mut() else {
            if self.cancel.is_cancelled() {
                return Err(openshell_sdk::Error::Cancelled.into());
            }
            return Ok(None);
        };
        let next = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => {
                events.stream = None;
                return Err(openshell_sdk::Error::Cancelled.into());
            }
            next = stream.next() => next,
        };
        match next {
            None => {
                events.stream = None;
                Ok(None)
            }
            Some(Err(err)) => {
                events.stream = None;
                Err(err.into())
            }
            Some(Ok(event)) => Ok(Some(match event {
                openshell_sdk::ExecEvent::Stdout(data) => ExecEvent::Stdout {
                    data: data.to_vec(),
                },
                openshell_sdk::ExecEvent::Stderr(data) => ExecEvent::Stderr {
                    data: data.to_vec(),
                },
                openshell_sdk::ExecEvent::Exit(exit_code) => {
                    events.stream = None;
                    ExecEvent::Exit { exit_code }
                }
            })),
        }
    }

    /// Writes to the process's stdin (interactive exec only).
    pub async fn write(&self, data: Vec<u8>) -> Result<(), OpenShellError> {
        let input = self.input()?.clone();
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(openshell_sdk::Error::Cancelled.into()),
            out = input.write(data) => Ok(out?),
        }
    }

    /// Resizes the terminal of a `tty` exec (interactive exec only; not
    /// after `close_stdin`).
    pub async fn resize(&self, cols: u32, rows: u32) -> Result<(), OpenShellError> {
        let input = self.input()?.clone();
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(openshell_sdk::Error::Cancelled.into()),
            out = input.resize(cols, rows) => Ok(out?),
        }
    }

    /// Closes stdin: the process reads EOF. Idempotent.
    pub fn close_stdin(&self) -> Result<(), OpenShellError> {
        self.input()?.close();
        Ok(())
    }

    /// Ends the command: the call is reset and the gateway kills it.
    /// Idempotent.
    pub fn cancel(&self) {
        self.cancel.cancel();
        if let Ok(mut events) = self.events.try_lock() {
            events.stream = None;
        }
    }
}
