//! One call's options and cancellation, and the request decoding shared by
//! unary operations and streams.

use std::time::Duration;

use openshell_sdk::proto as pb;
use openshell_sdk::{CallOptions, CancellationToken, Client, Error, ExecRequest};
use prost::Message;

use crate::types::OsCancel;

/// Per-call options, passed by value.
#[repr(C)]
pub struct OsCallOptions {
    /// Deadline of the call in milliseconds; 0: the client's default for
    /// unary calls, none for streams.
    pub timeout_ms: u64,
    /// Cancels the call (and the stream or forward it makes); may be null.
    pub cancel: *const OsCancel,
    /// Cap on buffered exec output; 0: the client's.
    pub output_limit: u64,
}

/// A client. Free with [`openshell_client_free`].
pub struct OsClient {
    pub(crate) client: Client,
    pub(crate) closed: CancellationToken,
}

/// One call's options and cancellation, taken from `OsCallOptions`.
pub(crate) struct Call {
    pub options: CallOptions,
    /// The call's cancellation: its own token (a child of the caller's
    /// token when there is one, else of the client's) and the client's.
    pub token: CallCancel,
    pub output_limit: Option<usize>,
}

/// Cancels a call: the call's token, or the client's (`close`). No task
/// links the two: whoever waits selects on both.
#[derive(Clone)]
pub(crate) struct CallCancel {
    own: CancellationToken,
    closed: CancellationToken,
}

impl CallCancel {
    /// Cancels this call (and what it made) only.
    pub(crate) fn cancel(&self) {
        self.own.cancel();
    }

    /// Resolves once the call or the client is cancelled.
    pub(crate) async fn cancelled(&self) {
        tokio::select! {
            _ = self.own.cancelled() => {}
            _ = self.closed.cancelled() => {}
        }
    }
}

impl Call {
    pub(crate) fn new(client: &OsClient, options: &OsCallOptions) -> Self {
        let own = match unsafe { options.cancel.as_ref() } {
            Some(user) => user.0.child_token(),
            None => client.closed.child_token(),
        };
        let mut call = CallOptions::new().cancel_token(own.clone());
        if options.timeout_ms > 0 {
            call = call.deadline(Duration::from_millis(options.timeout_ms));
        }
        Self {
            options: call,
            token: CallCancel {
                own,
                closed: client.closed.clone(),
            },
            output_limit: (options.output_limit > 0).then_some(options.output_limit as usize),
        }
    }

    /// Runs `fut` until it ends or the call is cancelled; cancelling drops
    /// `fut`, which cancels the RPC.
    pub(crate) async fn run<T>(
        token: &CallCancel,
        fut: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        tokio::select! {
            biased;
            _ = token.cancelled() => Err(Error::Cancelled),
            out = fut => out,
        }
    }
}

pub(crate) fn decode<M: Message + Default>(bytes: &[u8], what: &str) -> Result<M, Error> {
    M::decode(bytes)
        .map_err(|e| Error::invalid_config(format!("{what} is not a valid message: {e}")))
}

pub(crate) fn exec_request(bytes: &[u8], limit: Option<usize>) -> Result<ExecRequest, Error> {
    let r: pb::ExecSandboxRequest = decode(bytes, "ExecSandboxRequest")?;
    let mut out = ExecRequest::new(r.sandbox, r.command);
    out.workdir = (!r.workdir.is_empty()).then_some(r.workdir);
    out.environment = r.environment.into_iter().collect();
    out.stdin = r.stdin.into();
    out.tty = r.tty;
    out.cols = r.cols;
    out.rows = r.rows;
    if let Some(t) = r.execution_timeout {
        if t.seconds < 0 || t.nanos < 0 {
            return Err(Error::invalid_config("exec timeout must not be negative"));
        }
        out.timeout = Some(Duration::new(t.seconds as u64, t.nanos as u32));
    }
    out.output_limit = limit;
    Ok(out)
}
