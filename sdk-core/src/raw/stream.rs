//! The caller's side of a stream: [`RawStream`] and its halves.

use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use openshell_proto::MethodInfo;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::CallContext;
use super::attempt::drive_stream;
use crate::client::Client;
use crate::error::Error;
use crate::metadata::Metadata;
use crate::wire::Outbound;

/// Requests queued on a stream before `send` waits for the network.
const SEND_QUEUE: usize = 16;

impl Client {
    /// the call starts at once (curated streams know their first message).
    pub(crate) fn open_stream(&self, ctx: CallContext, first: Option<Bytes>) -> RawStream {
        let (tx, rx) = mpsc::channel::<Outbound>(SEND_QUEUE);
        let (start_tx, start_rx) = oneshot::channel();
        let shared = Arc::new(StreamShared {
            // A child: ending this stream must not cancel the operation it
            // belongs to (a forward's other connections, a wait's next call).
            cancel: ctx.resolved.cancel.child_token(),
            reason: OnceLock::new(),
            kick: Notify::new(),
        });
        let single = ctx.single_request();
        let sender = RawSender {
            tx: Arc::new(Mutex::new(Some(tx))),
            shared: Arc::clone(&shared),
            single,
        };
        let receiver = RawReceiver {
            state: RecvState::Starting(start_rx),
            shared: Arc::clone(&shared),
            headers: None,
            trailers: None,
        };
        let method = ctx.method;
        tokio::spawn(drive_stream(self.clone(), ctx, first, rx, shared, start_tx));
        RawStream {
            sender,
            receiver,
            method,
        }
    }
}

/// State shared by the halves of one stream and its driver task.
#[derive(Debug)]
pub(super) struct StreamShared {
    pub(super) cancel: CancellationToken,
    /// Why the stream was cancelled, when the core cancelled it (deadline).
    pub(super) reason: OnceLock<Error>,
    /// Tells the driver to start the call without waiting for a first message.
    pub(super) kick: Notify,
}

impl StreamShared {
    pub(super) fn fail(&self, err: Error) {
        let _ = self.reason.set(err);
        self.cancel.cancel();
    }

    pub(super) fn cancelled_error(&self) -> Error {
        self.reason.get().cloned().unwrap_or(Error::Cancelled)
    }
}

pub(super) type Started = Result<(Metadata, mpsc::Receiver<Delivery>), Error>;

/// What the driver hands the receiver. The driver task owns the tonic
/// `Streaming`, so a cancellation or deadline drops it (an HTTP/2 reset)
/// even while nobody is receiving.
#[derive(Debug)]
pub(super) enum Delivery {
    Message(Bytes),
    End(Option<Metadata>),
    Failed(Error),
}

/// A stream on any method: send encoded messages, receive encoded messages.
///
/// Dropping it cancels the RPC. Use [`split`](Self::split) to send and
/// receive from different tasks.
#[derive(Debug)]
pub struct RawStream {
    sender: RawSender,
    receiver: RawReceiver,
    method: Option<&'static MethodInfo>,
}

impl RawStream {
    /// Sends one encoded message; waits while the send queue is full.
    pub async fn send(&self, message: Bytes) -> Result<(), Error> {
        self.sender.send(message).await
    }

    /// Closes the send side (a client half-close). Idempotent.
    pub fn close_send(&self) {
        self.sender.close();
    }

    /// The next encoded message; `Ok(None)` once the server ended the stream
    /// with OK. After an error, every later call returns the same error.
    pub async fn recv(&mut self) -> Result<Option<Bytes>, Error> {
        self.receiver.recv().await
    }

    /// Response headers (initial metadata); waits for them if needed.
    pub async fn response_metadata(&mut self) -> Result<Metadata, Error> {
        self.receiver.response_metadata().await
    }

    /// Trailers, once the stream ended with OK.
    pub fn trailers(&self) -> Option<&Metadata> {
        self.receiver.trailers()
    }

    /// Cancels the RPC; pending and later receives fail with `cancelled`.
    pub fn cancel(&self) {
        self.receiver.cancel();
    }

    /// The method table entry, when the path is part of the contract.
    pub fn method(&self) -> Option<&'static MethodInfo> {
        self.method
    }

    /// Separates the halves. The sender is cloneable; dropping every sender
    /// half-closes the call, dropping the receiver cancels it.
    pub fn split(self) -> (RawSender, RawReceiver) {
        (self.sender, self.receiver)
    }
}

/// The sending half of a [`RawStream`].
#[derive(Debug, Clone)]
pub struct RawSender {
    tx: Arc<Mutex<Option<mpsc::Sender<Outbound>>>>,
    shared: Arc<StreamShared>,
    single: bool,
}

impl RawSender {
    /// A sender over a plain channel, not tied to a call (for tests of the
    /// code that drives senders).
    #[cfg(test)]
    pub(crate) fn detached(tx: mpsc::Sender<Outbound>, cancel: CancellationToken) -> Self {
        Self {
            tx: Arc::new(Mutex::new(Some(tx))),
            shared: Arc::new(StreamShared {
                cancel,
                reason: OnceLock::new(),
                kick: Notify::new(),
            }),
            single: false,
        }
    }

    /// Sends one encoded message; waits while the send queue is full.
    pub async fn send(&self, message: Bytes) -> Result<(), Error> {
        self.send_outbound(Outbound::Message(message)).await
    }

    /// Sends one complete gRPC message, its 5-byte prefix included
    /// ([`write_prefix`](crate::wire::write_prefix)): the bytes go to
    /// HTTP/2 as they are. Only ever after the stream's first message.
    pub(crate) async fn send_framed(&self, frame: Bytes) -> Result<(), Error> {
        self.send_outbound(Outbound::Framed(frame)).await
    }

    async fn send_outbound(&self, message: Outbound) -> Result<(), Error> {
        if self.shared.cancel.is_cancelled() {
            return Err(self.shared.cancelled_error());
        }
        let tx = self
            .tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| Error::StreamClosed {
                message: "the send side is closed".into(),
            })?;
        if self.single {
            // Unary and server-streaming methods take exactly one message.
            self.close();
        }
        tokio::select! {
            biased;
            _ = self.shared.cancel.cancelled() => Err(self.shared.cancelled_error()),
            sent = tx.send(message) => sent.map_err(|_| {
                if self.shared.cancel.is_cancelled() {
                    self.shared.cancelled_error()
                } else {
                    Error::StreamClosed {
                        message: "the call has ended; receive to learn its status".into(),
                    }
                }
            }),
        }
    }

    /// Closes the send side for every clone of this sender (a client
    /// half-close). Messages already queued are still delivered. Idempotent.
    pub fn close(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Whether the send side was closed.
    pub fn is_closed(&self) -> bool {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    /// Cancels the whole RPC.
    pub fn cancel(&self) {
        self.shared.cancel.cancel();
    }
}

#[derive(Debug)]
enum RecvState {
    Starting(oneshot::Receiver<Started>),
    Open(mpsc::Receiver<Delivery>),
    Ended,
    Failed(Error),
}

/// The receiving half of a [`RawStream`]. Dropping it cancels the RPC.
#[derive(Debug)]
pub struct RawReceiver {
    state: RecvState,
    shared: Arc<StreamShared>,
    headers: Option<Metadata>,
    trailers: Option<Metadata>,
}

impl RawReceiver {
    /// The next encoded message; `Ok(None)` once the server ended the stream
    /// with OK. After an error, every later call returns the same error.
    pub async fn recv(&mut self) -> Result<Option<Bytes>, Error> {
        loop {
            match &mut self.state {
                RecvState::Starting(_) => {
                    self.wait_started().await?;
                }
                RecvState::Open(deliveries) => {
                    let shared = Arc::clone(&self.shared);
                    let next = tokio::select! {
                        biased;
                        _ = shared.cancel.cancelled() => None,
                        next = deliveries.recv() => next,
                    };
                    match next {
                        Some(Delivery::Message(message)) => return Ok(Some(message)),
                        Some(Delivery::End(trailers)) => {
                            self.trailers = Some(trailers.unwrap_or_default());
                            self.state = RecvState::Ended;
                            return Ok(None);
                        }
                        Some(Delivery::Failed(err)) => return Err(self.fail(err)),
                        // Cancelled, or the driver stopped on its deadline.
                        None => {
                            let err = shared.cancelled_error();
                            return Err(self.fail(err));
                        }
                    }
                }
                RecvState::Ended => return Ok(None),
                RecvState::Failed(err) => return Err(err.clone()),
            }
        }
    }

    /// Response headers (initial metadata); waits for them if needed.
    pub async fn response_metadata(&mut self) -> Result<Metadata, Error> {
        if matches!(self.state, RecvState::Starting(_)) {
            self.wait_started().await?;
        }
        match (&self.headers, &self.state) {
            (Some(h), _) => Ok(h.clone()),
            (None, RecvState::Failed(err)) => Err(err.clone()),
            (None, _) => Ok(Metadata::new()),
        }
    }

    /// Trailers, once the stream ended with OK.
    pub fn trailers(&self) -> Option<&Metadata> {
        self.trailers.as_ref()
    }

    /// Cancels the RPC.
    pub fn cancel(&self) {
        self.shared.cancel.cancel();
    }

    /// The messages as a `Stream`, ending after the first error.
    pub fn into_stream(self) -> BoxStream<'static, Result<Bytes, Error>> {
        futures::stream::unfold(Some(self), |receiver| async move {
            let mut receiver = receiver?;
            match receiver.recv().await {
                Ok(Some(message)) => Some((Ok(message), Some(receiver))),
                Ok(None) => None,
                Err(err) => Some((Err(err), None)),
            }
        })
        // Fused: polling after the end keeps returning `None` instead of panicking.
        .fuse()
        .boxed()
    }

    async fn wait_started(&mut self) -> Result<(), Error> {
        let RecvState::Starting(start_rx) = &mut self.state else {
            return Ok(());
        };
        // The driver may be waiting for a first message that never comes.
        self.shared.kick.notify_one();
        let shared = Arc::clone(&self.shared);
        let started = tokio::select! {
            biased;
            _ = shared.cancel.cancelled() => Err(shared.cancelled_error()),
            started = start_rx => started.unwrap_or_else(|_| Err(shared.cancelled_error())),
        };
        match started {
            Ok((headers, deliveries)) => {
                self.headers = Some(headers);
                self.state = RecvState::Open(deliveries);
                Ok(())
            }
            Err(err) => Err(self.fail(err)),
        }
    }

    fn fail(&mut self, err: Error) -> Error {
        self.state = RecvState::Failed(err.clone());
        self.shared.cancel.cancel();
        err
    }
}

impl Drop for RawReceiver {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::lazy_client;
    use super::*;
    use crate::client::{CallOptions, DeadlineKind, Resolved};

    #[tokio::test]
    async fn a_stream_cancelled_before_it_starts_reports_cancelled() {
        let client = lazy_client().await;
        let token = CancellationToken::new();
        let mut stream = client
            .raw_stream(
                "/openshell.v1.OpenShell/ForwardTcp",
                Metadata::new(),
                CallOptions::new().cancel_token(token.clone()),
            )
            .await
            .unwrap();
        token.cancel();
        assert_eq!(stream.recv().await.unwrap_err().code(), "cancelled");
        // Stays failed.
        assert_eq!(stream.recv().await.unwrap_err().code(), "cancelled");
        assert_eq!(
            stream.send(Bytes::new()).await.unwrap_err().code(),
            "cancelled"
        );
    }

    #[tokio::test]
    async fn a_stream_to_a_closed_port_fails_with_connect() {
        let client = lazy_client().await;
        let mut stream = client
            .raw_stream(
                "/openshell.v1.OpenShell/WatchSandbox",
                Metadata::new(),
                CallOptions::new(),
            )
            .await
            .unwrap();
        stream.send(Bytes::new()).await.unwrap();
        // Single-request method: the send side closed itself.
        assert_eq!(
            stream.send(Bytes::new()).await.unwrap_err().code(),
            "stream_closed"
        );
        let err = stream.recv().await.unwrap_err();
        assert_eq!(err.code(), "connect", "{err}");
    }

    #[tokio::test]
    async fn dropping_a_stream_leaves_its_operation_running() {
        let client = lazy_client().await;
        let resolved = Resolved::new(&client, &CallOptions::new(), DeadlineKind::Stream);
        let ctx =
            CallContext::new(crate::paths::FORWARD_TCP, Metadata::new(), resolved.clone()).unwrap();
        let stream = client.open_stream(ctx, None);
        drop(stream);
        assert!(!resolved.cancel.is_cancelled());
    }

    #[tokio::test]
    async fn a_stream_deadline_fires_while_waiting() {
        let client = lazy_client().await;
        let mut stream = client
            .raw_stream(
                "/openshell.v1.OpenShell/ForwardTcp",
                Metadata::new(),
                CallOptions::new().deadline(std::time::Duration::from_millis(20)),
            )
            .await
            .unwrap();
        // Nothing sent and not kicked by recv: the driver waits for a first
        // message until the deadline.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let err = stream.recv().await.unwrap_err();
        assert_eq!(err.code(), "deadline_exceeded", "{err}");
    }
}
