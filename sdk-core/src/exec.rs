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

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use openshell_proto as pb;
use openshell_proto::exec_sandbox_event::Payload as EventPayload;
use openshell_proto::exec_sandbox_input::Payload as InputPayload;

use crate::client::{CallOptions, Client, DeadlineKind, Resolved};
use crate::error::Error;
use crate::paths;
use crate::raw::{RawSender, decode};

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

/// What a buffered exec collected.
#[derive(Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Everything written to stdout.
    pub stdout: Vec<u8>,
    /// Everything written to stderr.
    pub stderr: Vec<u8>,
    /// Exit code.
    pub exit_code: i32,
}

impl ExecOutput {
    /// Whether the exit code is 0.
    pub fn success(&self) -> bool {
        self.exit_code == 0
    }

    /// stdout as text (lossy).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as text (lossy).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

impl fmt::Debug for ExecOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecOutput")
            .field("stdout_len", &self.stdout.len())
            .field("stderr_len", &self.stderr.len())
            .field("exit_code", &self.exit_code)
            .finish()
    }
}

/// Collects output up to a cap on stdout and stderr together: what
/// buffered exec uses, and what collecting a stream uses in every binding.
#[derive(Debug)]
pub struct OutputCollector {
    limit: usize,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl OutputCollector {
    /// An empty collector that holds at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }

    /// The cap in bytes (stdout and stderr together).
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn total(&self) -> usize {
        self.stdout.len() + self.stderr.len()
    }

    /// Adds an event; `Ok(Some(output))` at the exit event. Fails with
    /// `output_limit` when a chunk would take the output past the cap (the
    /// caller then drops the stream, which cancels the command).
    pub fn push(&mut self, event: ExecEvent) -> Result<Option<ExecOutput>, Error> {
        let total = self.total();
        let (buffer, chunk) = match event {
            ExecEvent::Stdout(chunk) => (&mut self.stdout, chunk),
            ExecEvent::Stderr(chunk) => (&mut self.stderr, chunk),
            ExecEvent::Exit(exit_code) => {
                return Ok(Some(ExecOutput {
                    stdout: std::mem::take(&mut self.stdout),
                    stderr: std::mem::take(&mut self.stderr),
                    exit_code,
                }));
            }
        };
        if total.saturating_add(chunk.len()) > self.limit {
            return Err(Error::OutputLimit { limit: self.limit });
        }
        buffer.extend_from_slice(&chunk);
        Ok(None)
    }
}

/// Turns encoded `ExecSandboxEvent` frames into events: the exit event is
/// yielded once the server closed the stream, and a stream that ends without
/// one yields a `protocol` error. Ends after the first error.
pub(crate) fn assemble_events(
    frames: BoxStream<'static, Result<Bytes, Error>>,
) -> BoxStream<'static, Result<ExecEvent, Error>> {
    struct State {
        frames: BoxStream<'static, Result<Bytes, Error>>,
        done: bool,
    }
    futures::stream::unfold(
        State {
            frames,
            done: false,
        },
        |mut state| async move {
            if state.done {
                return None;
            }
            loop {
                let item = match state.frames.next().await {
                    Some(Ok(frame)) => {
                        match decode::<pb::ExecSandboxEvent>(paths::EXEC_SANDBOX, frame) {
                            Ok(event) => event.payload,
                            Err(err) => {
                                state.done = true;
                                return Some((Err(err), state));
                            }
                        }
                    }
                    Some(Err(err)) => {
                        state.done = true;
                        return Some((Err(err), state));
                    }
                    None => {
                        state.done = true;
                        return Some((
                            Err(Error::protocol("exec stream ended without an exit event")),
                            state,
                        ));
                    }
                };
                match item {
                    Some(EventPayload::Stdout(out)) => {
                        return Some((Ok(ExecEvent::Stdout(Bytes::from(out.data))), state));
                    }
                    Some(EventPayload::Stderr(err)) => {
                        return Some((Ok(ExecEvent::Stderr(Bytes::from(err.data))), state));
                    }
                    Some(EventPayload::Exit(exit)) => {
                        // Let the server finish the call cleanly; anything after
                        // the exit event is not part of the result.
                        while let Some(rest) = state.frames.next().await {
                            if rest.is_err() {
                                break;
                            }
                            tracing::debug!("exec event after exit ignored");
                        }
                        state.done = true;
                        return Some((Ok(ExecEvent::Exit(exit.exit_code)), state));
                    }
                    // A payload this client does not know: skip it.
                    None => continue,
                }
            }
        },
    )
    // Fused: polling after the end keeps returning `None` (an `Unfold`
    // panics), as `next_event` promises.
    .fuse()
    .boxed()
}

/// The events of a running command. The last item is either
/// [`ExecEvent::Exit`] or an error. Dropping it cancels the command's stream.
pub struct ExecStream {
    inner: BoxStream<'static, Result<ExecEvent, Error>>,
    output_limit: usize,
}

impl ExecStream {
    fn new(frames: BoxStream<'static, Result<Bytes, Error>>, output_limit: usize) -> Self {
        Self {
            inner: assemble_events(frames),
            output_limit,
        }
    }

    /// The cap [`collect`](Self::collect) applies: the request's
    /// `output_limit`, else the client's `exec_output_limit`.
    pub fn output_limit(&self) -> usize {
        self.output_limit
    }

    /// Collects the rest of the stream under [`output_limit`](Self::output_limit).
    /// Past the cap it fails with `output_limit` and, by dropping the
    /// stream, cancels the command, as buffered exec does.
    pub async fn collect(self) -> Result<ExecOutput, Error> {
        let limit = self.output_limit;
        self.collect_output(limit).await
    }

    /// Collects the rest of the stream up to `limit` bytes of output.
    pub async fn collect_output(mut self, limit: usize) -> Result<ExecOutput, Error> {
        self.collect_into(OutputCollector::new(limit)).await
    }

    /// Feeds the rest of the stream to `collector`, which may already hold
    /// events taken from this stream. On an error the stream must not be
    /// polled again; drop it to cancel the command (bindings that keep the
    /// stream in a handle do so).
    pub async fn collect_into(
        &mut self,
        mut collector: OutputCollector,
    ) -> Result<ExecOutput, Error> {
        while let Some(event) = self.inner.next().await {
            if let Some(output) = collector.push(event?)? {
                return Ok(output);
            }
        }
        // Unreachable with assemble_events (it always ends in Exit or Err).
        Err(Error::protocol("exec stream ended without an exit event"))
    }
}

impl Stream for ExecStream {
    type Item = Result<ExecEvent, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

impl fmt::Debug for ExecStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecStream").finish_non_exhaustive()
    }
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
            self.send(InputPayload::Stdin(chunk.to_vec())).await?;
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
    use prost::Message;

    fn ev(payload: EventPayload) -> Result<Bytes, Error> {
        Ok(Bytes::from(
            pb::ExecSandboxEvent {
                payload: Some(payload),
            }
            .encode_to_vec(),
        ))
    }

    fn out(data: &[u8]) -> Result<Bytes, Error> {
        ev(EventPayload::Stdout(pb::ExecSandboxStdout {
            data: data.to_vec(),
        }))
    }

    fn err(data: &[u8]) -> Result<Bytes, Error> {
        ev(EventPayload::Stderr(pb::ExecSandboxStderr {
            data: data.to_vec(),
        }))
    }

    fn exit(code: i32) -> Result<Bytes, Error> {
        ev(EventPayload::Exit(pb::ExecSandboxExit { exit_code: code }))
    }

    async fn events(frames: Vec<Result<Bytes, Error>>) -> Vec<Result<ExecEvent, Error>> {
        assemble_events(futures::stream::iter(frames).boxed())
            .collect()
            .await
    }

    #[tokio::test]
    async fn assembles_stdout_stderr_and_exit() {
        let got = events(vec![out(b"a"), err(b"b"), out(b"c"), exit(3)]).await;
        let got: Vec<_> = got.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            got,
            vec![
                ExecEvent::Stdout(Bytes::from_static(b"a")),
                ExecEvent::Stderr(Bytes::from_static(b"b")),
                ExecEvent::Stdout(Bytes::from_static(b"c")),
                ExecEvent::Exit(3),
            ]
        );
    }

    #[tokio::test]
    async fn a_stream_without_exit_is_a_protocol_error() {
        let got = events(vec![out(b"a")]).await;
        assert_eq!(got.len(), 2);
        let err = got[1].as_ref().unwrap_err();
        assert_eq!(err.code(), "protocol");
        assert!(err.to_string().contains("without an exit event"));
        // Even an empty stream.
        let got = events(vec![]).await;
        assert_eq!(got[0].as_ref().unwrap_err().code(), "protocol");
    }

    #[tokio::test]
    async fn errors_and_garbage_end_the_stream() {
        let got = events(vec![
            out(b"a"),
            Err(Error::from(tonic::Status::not_found("no sandbox"))),
            exit(0),
        ])
        .await;
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].as_ref().unwrap_err().code(), "not_found");
        let got = events(vec![Ok(Bytes::from_static(b"\xff\xff\xff")), exit(0)]).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap_err().code(), "protocol");
    }

    #[tokio::test]
    async fn events_after_exit_are_ignored_and_exit_is_last() {
        let got = events(vec![exit(0), out(b"late")]).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap(), &ExecEvent::Exit(0));
    }

    #[test]
    fn output_cap_counts_stdout_and_stderr_together() {
        let mut c = OutputCollector::new(10);
        assert!(
            c.push(ExecEvent::Stdout(Bytes::from_static(b"12345")))
                .unwrap()
                .is_none()
        );
        assert!(
            c.push(ExecEvent::Stderr(Bytes::from_static(b"12345")))
                .unwrap()
                .is_none()
        );
        // Exactly at the cap is fine; one more byte is not.
        let err = c
            .push(ExecEvent::Stdout(Bytes::from_static(b"x")))
            .unwrap_err();
        assert_eq!(err.code(), "output_limit");
        assert!(err.to_string().contains("10 bytes"));
        let mut c = OutputCollector::new(10);
        c.push(ExecEvent::Stdout(Bytes::from_static(b"abc")))
            .unwrap();
        c.push(ExecEvent::Stderr(Bytes::from_static(b"de")))
            .unwrap();
        let output = c.push(ExecEvent::Exit(2)).unwrap().unwrap();
        assert_eq!(output.stdout, b"abc");
        assert_eq!(output.stderr, b"de");
        assert_eq!(output.exit_code, 2);
        assert!(!output.success());
    }

    #[tokio::test]
    async fn collect_output_stops_at_the_cap() {
        let frames =
            futures::stream::iter(vec![out(&[b'x'; 600]), err(&[b'y'; 600]), exit(0)]).boxed();
        let err = ExecStream::new(frames, 1000).collect().await.unwrap_err();
        assert_eq!(err.code(), "output_limit");
        let frames = futures::stream::iter(vec![out(b"hi\n"), exit(0)]).boxed();
        let output = ExecStream::new(frames, usize::MAX)
            .collect_output(1000)
            .await
            .unwrap();
        assert_eq!(output.stdout_text(), "hi\n");
        assert!(output.success());
    }

    #[tokio::test]
    async fn collect_into_continues_a_partly_read_stream_under_one_cap() {
        let frames =
            futures::stream::iter(vec![out(&[b'x'; 400]), err(&[b'y'; 400]), exit(0)]).boxed();
        let mut stream = ExecStream::new(frames, 1000);
        let mut collector = OutputCollector::new(stream.output_limit());
        // An event the caller already took (a binding's buffer) counts too.
        let first = stream.next().await.unwrap().unwrap();
        assert!(collector.push(first).unwrap().is_none());
        let output = stream.collect_into(collector).await.unwrap();
        assert_eq!((output.stdout.len(), output.stderr.len()), (400, 400));

        let frames =
            futures::stream::iter(vec![out(&[b'x'; 600]), err(&[b'y'; 600]), exit(0)]).boxed();
        let mut stream = ExecStream::new(frames, 1000);
        let mut collector = OutputCollector::new(1000);
        collector
            .push(stream.next().await.unwrap().unwrap())
            .unwrap();
        let err = stream.collect_into(collector).await.unwrap_err();
        assert_eq!(err.code(), "output_limit");
    }

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
