//! Exec events from `ExecSandboxEvent` frames, and collecting them.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use openshell_proto as pb;
use openshell_proto::exec_sandbox_event::Payload as EventPayload;

use super::{ExecEvent, ExecOutput, OutputCollector};
use crate::error::Error;
use crate::paths;
use crate::raw::decode;

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
    pub(super) fn new(
        frames: BoxStream<'static, Result<Bytes, Error>>,
        output_limit: usize,
    ) -> Self {
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
        ev(EventPayload::Exit(pb::ExecSandboxExit {
            exit_code: code,
            oom_killed: false,
        }))
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
}
