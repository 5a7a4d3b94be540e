//! Running commands in a sandbox: buffered, streaming and interactive.
//!
//! - [`Client::exec`] collects stdout, stderr and the exit code inside the
//!   core, up to a cap (default 64 MiB, stdout and stderr together). Past the
//!   cap the call is cancelled and fails with `output_limit`; output never
//!   grows without bound.
//! - [`Client::exec_stream`] yields [`ExecEvent`]s as they arrive. The last
//!   event is always [`ExecEvent::Exit`]; a server stream that ends without
//!   one yields a `protocol` error, never a silent success. Collecting the
//!   rest of a stream ([`ExecStream::collect`], [`ExecStream::collect_into`])
//!   goes through the same [`OutputCollector`] and cap as buffered exec;
//!   the bindings use it too, so no language gathers output on its own.
//! - [`Client::exec_interactive`] adds an input side: stdin bytes, window
//!   resizes, and closing stdin.
//!
//! All three ride `ExecSandbox` / `ExecSandboxInput` streams opened through
//! [`crate::raw`], so they share auth, deadlines, cancellation and routing
//! with every other call.
//!
//! Files: this one has the requests, the interactive input side and the
//! `Client` methods; `stream` turns frames into events and collects them;
//! `output` holds the collected output and the collector with its cap.

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use openshell_proto as pb;
use openshell_proto::exec_sandbox_input::Payload as InputPayload;

use crate::client::{CallOptions, Client, DeadlineKind, Resolved};
use crate::error::Error;
use crate::paths;
use crate::raw::RawSender;

mod output;
mod stream;

pub use output::{ExecOutput, OutputCollector};
pub use stream::ExecStream;

/// Largest stdin chunk sent in one message.
pub const STDIN_CHUNK: usize = 64 * 1024;

/// A command to run in a sandbox.
///
/// `Debug` shows environment keys only, and the stdin length, never values.
#[derive(Clone, Default)]
pub struct ExecRequest {
    /// Sandbox name.
    pub sandbox: String,
    /// argv; required.
    pub command: Vec<String>,
    /// Working directory (relative to the sandbox's working directory).
    pub workdir: Option<String>,
    /// Extra environment of the process.
    pub environment: BTreeMap<String, String>,
    /// Bytes fed to stdin (buffered and streaming exec).
    pub stdin: Bytes,
    /// Run under a pseudo-terminal.
    pub tty: bool,
    /// Terminal size when `tty` is set.
    pub cols: u32,
    /// Terminal size when `tty` is set.
    pub rows: u32,
    /// Server-side execution timeout (exit code 124 when it expires).
    pub timeout: Option<Duration>,
    /// Cap on collected output (buffered exec, and collecting a stream);
    /// the client's when `None`.
    pub output_limit: Option<usize>,
}

impl ExecRequest {
    /// Runs `command` (argv, no shell parsing) in `sandbox`.
    pub fn new<I, S>(sandbox: impl Into<String>, command: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            sandbox: sandbox.into(),
            command: command.into_iter().map(Into::into).collect(),
            ..Default::default()
        }
    }

    /// Sets the working directory.
    pub fn workdir(mut self, dir: impl Into<String>) -> Self {
        self.workdir = Some(dir.into());
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.environment.insert(key.into(), value.into());
        self
    }

    /// Sets the bytes fed to stdin.
    pub fn stdin(mut self, data: impl Into<Bytes>) -> Self {
        self.stdin = data.into();
        self
    }

    /// Runs under a pseudo-terminal of the given size.
    pub fn tty(mut self, cols: u32, rows: u32) -> Self {
        self.tty = true;
        self.cols = cols;
        self.rows = rows;
        self
    }

    /// Sets the server-side execution timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets the cap on buffered output for this call.
    pub fn output_limit(mut self, bytes: usize) -> Self {
        self.output_limit = Some(bytes);
        self
    }

    /// The wire request.
    pub fn to_proto(&self) -> pb::ExecSandboxRequest {
        pb::ExecSandboxRequest {
            sandbox: self.sandbox.clone(),
            command: self.command.clone(),
            workdir: self.workdir.clone().unwrap_or_default(),
            environment: self.environment.clone().into_iter().collect(),
            stdin: self.stdin.to_vec(),
            tty: self.tty,
            cols: self.cols,
            rows: self.rows,
            request_id: uuid::Uuid::new_v4().to_string(),
            execution_timeout: self.timeout.map(|t| prost_types::Duration {
                seconds: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(t.subsec_nanos()).unwrap_or(0),
            }),
            ..Default::default()
        }
    }

    fn validate(&self) -> Result<(), Error> {
        if self.sandbox.is_empty() {
            return Err(Error::invalid_config("exec needs a sandbox name"));
        }
        if self.command.is_empty() {
            return Err(Error::invalid_config("exec needs a command"));
        }
        if self.output_limit == Some(0) {
            return Err(Error::invalid_config("exec output limit must be positive"));
        }
        Ok(())
    }
}

impl fmt::Debug for ExecRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecRequest")
            .field("sandbox", &self.sandbox)
            .field("command", &self.command)
            .field("workdir", &self.workdir)
            .field(
                "environment_keys",
                &self.environment.keys().collect::<Vec<_>>(),
            )
            .field("stdin_len", &self.stdin.len())
            .field("tty", &self.tty)
            .field("cols", &self.cols)
            .field("rows", &self.rows)
            .field("timeout", &self.timeout)
            .field("output_limit", &self.output_limit)
            .finish()
    }
}

/// One event of a running command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// A chunk of stdout.
    Stdout(Bytes),
    /// A chunk of stderr.
    Stderr(Bytes),
    /// The process ended (signals as 128+n, an expired timeout as 124).
    /// Always the last event.
    Exit(i32),
}

/// The input side of an interactive exec. Cloneable.
#[derive(Debug, Clone)]
pub struct ExecInput {
    sender: RawSender,
}

impl ExecInput {
    /// Writes bytes to the process's stdin (in chunks of at most 64 KiB).
    pub async fn write(&self, data: impl Into<Bytes>) -> Result<(), Error> {
        let mut data: Bytes = data.into();
        while !data.is_empty() {
            let chunk = data.split_to(data.len().min(STDIN_CHUNK));
            self.send(InputPayload::Stdin(chunk)).await?;
        }
        Ok(())
    }

    /// Resizes the terminal.
    pub async fn resize(&self, cols: u32, rows: u32) -> Result<(), Error> {
        self.send(InputPayload::Resize(pb::ExecSandboxWindowResize {
            cols,
            rows,
        }))
        .await
    }

    /// Closes stdin (the process reads EOF). No more writes or resizes can
    /// follow. Idempotent.
    pub fn close(&self) {
        self.sender.close();
    }

    async fn send(&self, payload: InputPayload) -> Result<(), Error> {
        let message = pb::ExecSandboxInput {
            payload: Some(payload),
        };
        self.sender
            .send(Bytes::from(prost::Message::encode_to_vec(&message)))
            .await
    }
}

/// A running interactive command: an input side and a stream of events.
///
/// Dropping it (or the events half after [`into_parts`](Self::into_parts))
/// cancels the command's stream.
#[derive(Debug)]
pub struct InteractiveExec {
    input: ExecInput,
    events: ExecStream,
}

impl InteractiveExec {
    /// A handle on the input side (stdin, resize, close).
    pub fn input(&self) -> ExecInput {
        self.input.clone()
    }

    /// Writes to stdin.
    pub async fn write(&self, data: impl Into<Bytes>) -> Result<(), Error> {
        self.input.write(data).await
    }

    /// Resizes the terminal.
    pub async fn resize(&self, cols: u32, rows: u32) -> Result<(), Error> {
        self.input.resize(cols, rows).await
    }

    /// Closes stdin.
    pub fn close_stdin(&self) {
        self.input.close();
    }

    /// Cancels the command's stream.
    pub fn cancel(&self) {
        self.input.sender.cancel();
    }

    /// The next event (`None` after the exit event or an error).
    pub async fn next_event(&mut self) -> Option<Result<ExecEvent, Error>> {
        self.events.next().await
    }

    /// Separates the input side from the events.
    pub fn into_parts(self) -> (ExecInput, ExecStream) {
        (self.input, self.events)
    }
}

impl Stream for InteractiveExec {
    type Item = Result<ExecEvent, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.poll_next_unpin(cx)
    }
}

impl Client {
    /// Runs a command and collects its output (see the module docs for the
    /// cap). The deadline in `options`, if any, bounds the whole run.
    pub async fn exec(
        &self,
        request: ExecRequest,
        options: CallOptions,
    ) -> Result<ExecOutput, Error> {
        let stream = self.exec_stream(request, options).await?;
        // On error the stream is dropped here, which cancels the call.
        stream.collect().await
    }

    /// Runs a command and streams its events.
    pub async fn exec_stream(
        &self,
        request: ExecRequest,
        options: CallOptions,
    ) -> Result<ExecStream, Error> {
        request.validate()?;
        let resolved = Resolved::new(self, &options, DeadlineKind::Stream);
        let stream = self.typed_stream(paths::EXEC_SANDBOX, &request.to_proto(), &resolved)?;
        let (_sender, receiver) = stream.split();
        Ok(ExecStream::new(
            receiver.into_stream(),
            self.output_limit_of(&request),
        ))
    }

    /// Starts an interactive command. `request.stdin`, if set, is written
    /// first; use `request.tty(cols, rows)` for a terminal.
    pub async fn exec_interactive(
        &self,
        request: ExecRequest,
        options: CallOptions,
    ) -> Result<InteractiveExec, Error> {
        request.validate()?;
        let output_limit = self.output_limit_of(&request);
        let resolved = Resolved::new(self, &options, DeadlineKind::Stream);
        let mut start = request.to_proto();
        let initial_stdin = std::mem::take(&mut start.stdin);
        let first = pb::ExecSandboxInput {
            payload: Some(InputPayload::Start(start)),
        };
        let stream = self.typed_stream(paths::EXEC_SANDBOX_INTERACTIVE, &first, &resolved)?;
        let (sender, receiver) = stream.split();
        let input = ExecInput { sender };
        if !initial_stdin.is_empty() {
            input.write(initial_stdin).await?;
        }
        Ok(InteractiveExec {
            input,
            events: ExecStream::new(receiver.into_stream(), output_limit),
        })
    }

    fn output_limit_of(&self, request: &ExecRequest) -> usize {
        request
            .output_limit
            .unwrap_or(self.inner.config.exec_output_limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_map_to_the_wire_and_debug_hides_values() {
        let req = ExecRequest::new("box", ["env"])
            .env("PASSWORD", "pw-secret-value")
            .stdin("stdin-secret")
            .workdir("/tmp")
            .timeout(Duration::from_millis(1500))
            .tty(80, 24);
        let text = format!("{req:?}");
        assert!(!text.contains("pw-secret-value"), "{text}");
        assert!(!text.contains("stdin-secret"), "{text}");
        assert!(text.contains("PASSWORD"));
        let wire = req.to_proto();
        assert_eq!(wire.sandbox, "box");
        assert_eq!(wire.environment["PASSWORD"], "pw-secret-value");
        assert_eq!(wire.workdir, "/tmp");
        assert!(wire.tty);
        assert_eq!((wire.cols, wire.rows), (80, 24));
        let timeout = wire.execution_timeout.unwrap();
        assert_eq!((timeout.seconds, timeout.nanos), (1, 500_000_000));
        assert_eq!(
            ExecRequest::new("", ["x"]).validate().unwrap_err().code(),
            "invalid_config"
        );
        let empty: [&str; 0] = [];
        assert_eq!(
            ExecRequest::new("b", empty).validate().unwrap_err().code(),
            "invalid_config"
        );
    }
}
