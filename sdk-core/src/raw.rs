//! The raw boundary: any method of the proto by path, with encoded request
//! bytes and string metadata in, response bytes and response metadata out.
//!
//! This is what the language bindings export, and it is also the only way
//! the curated surface talks to the gateway: `sandboxes`, `exec` and
//! `forward` encode prost messages and go through the same internal unary
//! and stream functions here, so auth, deadlines, cancellation and routing
//! behave the same for every caller.
//!
//! # One path for every call
//!
//! Each attempt of each call: get a token (single-flight, see
//! [`crate::auth`]) → ask the [`Router`](crate::routing::Router) (it sees the
//! method table entry and the first request message) → build the request
//! metadata (caller pairs, `authorization`, routing hints, `grpc-timeout`) →
//! send over the client's one channel with [`BytesCodec`] → map the outcome
//! to [`Error`] and report it to the router. An `UNAUTHENTICATED` answer to
//! a call whose request can be replayed (unary and server-streaming calls)
//! refreshes the token and retries exactly once.
//!
//! # Streams
//!
//! [`RawStream`] is opened by [`Client::raw_stream`]. The HTTP/2 call starts
//! when the first message is sent (or when the caller first receives, or
//! closes the send side): routing needs the first message, which names the
//! sandbox for owner-routed streams. For unary and server-streaming methods
//! the first message is the whole request and the send side closes by
//! itself. Dropping the receiving half (or the whole stream) cancels the RPC;
//! dropping every sending half only half-closes it.

use std::sync::{Arc, Mutex, OnceLock};

use bytes::{Buf, BufMut, Bytes};
use futures::StreamExt;
use futures::stream::BoxStream;
use http::uri::PathAndQuery;
use openshell_proto::{MethodInfo, StreamingKind};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::client::Grpc;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder, Streaming};
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;

use crate::auth::{IssuedToken, bearer_header};
use crate::client::{CallOptions, Client, DeadlineKind, Resolved};
use crate::error::Error;
use crate::metadata::{Metadata, SERVED_BY};
use crate::routing::RouteDecision;

/// Requests queued on a stream before `send` waits for the network.
const SEND_QUEUE: usize = 16;

// ---------------------------------------------------------------- codec

/// A tonic codec that passes encoded messages through as [`Bytes`], so one
/// client can call any method of any proto.
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesCodec;

/// Encoder half of [`BytesCodec`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesEncoder;

/// Decoder half of [`BytesCodec`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesDecoder;

impl Codec for BytesCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = BytesEncoder;
    type Decoder = BytesDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        BytesDecoder
    }
}

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.reserve(item.len());
        dst.put(item);
        Ok(())
    }
}

impl Decoder for BytesDecoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Self::Error> {
        // `src` holds exactly one message; gRPC framing is handled by tonic.
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

// ---------------------------------------------------------------- unary

/// The answer to a unary call.
#[derive(Debug, Clone)]
pub struct RawResponse {
    /// The encoded response message.
    pub bytes: Bytes,
    /// Response headers and trailers (for example `x-openshell-served-by`).
    pub metadata: Metadata,
}

impl RawResponse {
    /// The replica that answered (`x-openshell-served-by`), if it said.
    pub fn served_by(&self) -> Option<&str> {
        self.metadata.get(SERVED_BY)
    }
}

/// Everything the one call path needs to know about a call.
#[derive(Debug, Clone)]
pub(crate) struct CallContext {
    pub(crate) path: PathAndQuery,
    pub(crate) method: Option<&'static MethodInfo>,
    pub(crate) metadata: Metadata,
    pub(crate) resolved: Resolved,
}

impl CallContext {
    pub(crate) fn new(path: &str, metadata: Metadata, resolved: Resolved) -> Result<Self, Error> {
        if !path.starts_with('/') || path.matches('/').count() != 2 {
            return Err(Error::invalid_config(format!(
                "method path {path:?} must look like /package.Service/Method"
            )));
        }
        let parsed = PathAndQuery::try_from(path).map_err(|_| {
            Error::invalid_config(format!("method path {path:?} is not a valid path"))
        })?;
        Ok(Self {
            path: parsed,
            method: openshell_proto::method(path),
            metadata,
            resolved,
        })
    }

    /// Requests of these methods are one message: the call can be replayed.
    fn single_request(&self) -> bool {
        matches!(
            self.method.map(|m| m.kind),
            Some(StreamingKind::Unary | StreamingKind::ServerStreaming)
        )
    }

    fn caller_sets_authorization(&self) -> bool {
        self.metadata.get("authorization").is_some()
    }
}

impl Client {
    /// Calls a unary method by path (`/openshell.v1.OpenShell/GetSandbox`)
    /// with an encoded request and caller metadata.
    ///
    /// An `authorization` pair in `metadata` replaces the client's token for
    /// this call. Fails with `invalid_config` for a path that is not
    /// `/package.Service/Method` or that the method table marks as streaming.
    pub async fn raw_unary(
        &self,
        path: &str,
        request: Bytes,
        metadata: impl Into<Metadata>,
        options: CallOptions,
    ) -> Result<RawResponse, Error> {
        let resolved = Resolved::new(self, &options, DeadlineKind::Bounded);
        let ctx = CallContext::new(path, metadata.into(), resolved)?;
        if let Some(m) = ctx.method
            && m.kind != StreamingKind::Unary
        {
            return Err(Error::invalid_config(format!(
                "{path} is a {:?} method; use raw_stream",
                m.kind
            )));
        }
        self.unary_call(ctx, request).await
    }

    /// Opens a stream on any method by path. See [`RawStream`] for when the
    /// call actually starts. The deadline in `options` (if any) bounds the
    /// whole stream; the client's default deadline does not apply.
    pub async fn raw_stream(
        &self,
        path: &str,
        metadata: impl Into<Metadata>,
        options: CallOptions,
    ) -> Result<RawStream, Error> {
        let resolved = Resolved::new(self, &options, DeadlineKind::Stream);
        let ctx = CallContext::new(path, metadata.into(), resolved)?;
        Ok(self.open_stream(ctx, None))
    }

    /// The unary call path used by raw and curated calls alike.
    #[tracing::instrument(name = "openshell.call", skip_all, fields(path = %ctx.path, replica = tracing::field::Empty))]
    pub(crate) async fn unary_call(
        &self,
        ctx: CallContext,
        request: Bytes,
    ) -> Result<RawResponse, Error> {
        let resolved = ctx.resolved.clone();
        let path = ctx.path.clone();
        let result = resolved
            .guard(async {
                let mut token = self.call_token(&ctx).await?;
                let mut refreshed = false;
                let mut unrouted = false;
                loop {
                    let route = self
                        .inner
                        .router
                        .route(self, ctx.method, Some(&request), unrouted)
                        .await;
                    record_replica(&route);
                    let req = self.build_request(&ctx, token.as_ref(), &route, request.clone())?;
                    let mut grpc = self.grpc().await?;
                    match grpc.unary(req, ctx.path.clone(), BytesCodec).await {
                        Ok(response) => {
                            let (md, bytes, _) = response.into_parts();
                            let metadata = Metadata::from_tonic(&md);
                            self.inner.router.observe(&route, Ok(&metadata));
                            return Ok(RawResponse { bytes, metadata });
                        }
                        Err(status) => {
                            let err = Error::from_status(status);
                            // A unary request is replayable: one unrouted retry.
                            if self.inner.router.observe(&route, Err(&err)) && !unrouted {
                                unrouted = true;
                                continue;
                            }
                            if err.is_unauthenticated() && !refreshed && self.can_refresh(&ctx) {
                                refreshed = true;
                                let rejected = token.as_ref().map_or(0, |t| t.generation);
                                token = self.inner.tokens.refresh_after(rejected).await?;
                                continue;
                            }
                            return Err(err);
                        }
                    }
                }
            })
            .await;
        if let Err(err) = &result {
            tracing::debug!(path = path.as_str(), code = err.code(), "unary call failed");
        }
        result
    }

    /// Opens a stream. `first`, when given, is sent as the first message and
    /// the call starts at once (curated streams know their first message).
    pub(crate) fn open_stream(&self, ctx: CallContext, first: Option<Bytes>) -> RawStream {
        let (tx, rx) = mpsc::channel::<Bytes>(SEND_QUEUE);
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

    /// Curated unary calls: encode, call through [`Client::unary_call`], decode.
    pub(crate) async fn typed_unary<Req, Resp>(
        &self,
        path: &'static str,
        request: &Req,
        resolved: &Resolved,
    ) -> Result<(Resp, Metadata), Error>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        self.typed_unary_with(path, request, Metadata::new(), resolved)
            .await
    }

    /// [`typed_unary`](Self::typed_unary) with caller metadata.
    pub(crate) async fn typed_unary_with<Req, Resp>(
        &self,
        path: &'static str,
        request: &Req,
        metadata: Metadata,
        resolved: &Resolved,
    ) -> Result<(Resp, Metadata), Error>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let ctx = CallContext::new(path, metadata, resolved.clone())?;
        let response = self
            .unary_call(ctx, Bytes::from(request.encode_to_vec()))
            .await?;
        Ok((decode(path, response.bytes)?, response.metadata))
    }

    /// Curated streams: the encoded first message opens the call at once.
    pub(crate) fn typed_stream(
        &self,
        path: &'static str,
        first: &impl prost::Message,
        resolved: &Resolved,
    ) -> Result<RawStream, Error> {
        let ctx = CallContext::new(path, Metadata::new(), resolved.clone())?;
        Ok(self.open_stream(ctx, Some(Bytes::from(first.encode_to_vec()))))
    }

    fn can_refresh(&self, ctx: &CallContext) -> bool {
        self.inner.tokens.can_refresh() && !ctx.caller_sets_authorization()
    }

    async fn call_token(&self, ctx: &CallContext) -> Result<Option<IssuedToken>, Error> {
        if ctx.caller_sets_authorization() {
            return Ok(None);
        }
        self.inner.tokens.token().await
    }

    async fn grpc(&self) -> Result<Grpc<Channel>, Error> {
        let mut grpc = Grpc::new(self.inner.channel.clone())
            .max_decoding_message_size(self.inner.config.max_message_size);
        grpc.ready().await.map_err(|e| Error::from_transport(&e))?;
        Ok(grpc)
    }

    /// The one place request metadata is built.
    fn build_request<S>(
        &self,
        ctx: &CallContext,
        token: Option<&IssuedToken>,
        route: &RouteDecision,
        body: S,
    ) -> Result<tonic::Request<S>, Error> {
        let mut headers = http::HeaderMap::new();
        ctx.metadata.write_to(&mut headers)?;
        route.metadata.write_to(&mut headers)?;
        if let Some(token) = token {
            headers.insert(http::header::AUTHORIZATION, bearer_header(&token.token)?);
        }
        let mut request = tonic::Request::new(body);
        *request.metadata_mut() = MetadataMap::from_headers(headers);
        if let Some(remaining) = ctx.resolved.remaining() {
            request.set_timeout(remaining);
        }
        Ok(request)
    }
}

/// Decodes a response message; a message that does not decode is a
/// `protocol` error.
pub(crate) fn decode<M: prost::Message + Default>(path: &str, bytes: Bytes) -> Result<M, Error> {
    M::decode(bytes).map_err(|e| Error::protocol(format!("{path}: undecodable message: {e}")))
}

/// Ends a stream after its first error.
pub(crate) fn stop_after_error<T: Send + 'static>(
    stream: BoxStream<'static, Result<T, Error>>,
) -> BoxStream<'static, Result<T, Error>> {
    futures::stream::unfold((stream, false), |(mut stream, failed)| async move {
        if failed {
            return None;
        }
        let item = stream.next().await?;
        let failed = item.is_err();
        Some((item, (stream, failed)))
    })
    // Fused: polling after the end keeps returning `None` instead of panicking.
    .fuse()
    .boxed()
}

// ---------------------------------------------------------------- streams

/// State shared by the halves of one stream and its driver task.
#[derive(Debug)]
struct StreamShared {
    cancel: CancellationToken,
    /// Why the stream was cancelled, when the core cancelled it (deadline).
    reason: OnceLock<Error>,
    /// Tells the driver to start the call without waiting for a first message.
    kick: Notify,
}

impl StreamShared {
    fn fail(&self, err: Error) {
        let _ = self.reason.set(err);
        self.cancel.cancel();
    }

    fn cancelled_error(&self) -> Error {
        self.reason.get().cloned().unwrap_or(Error::Cancelled)
    }
}

type Started = Result<(Metadata, mpsc::Receiver<Delivery>), Error>;

/// What the driver hands the receiver. The driver task owns the tonic
/// `Streaming`, so a cancellation or deadline drops it (an HTTP/2 reset)
/// even while nobody is receiving.
#[derive(Debug)]
enum Delivery {
    Message(Bytes),
    End(Option<Metadata>),
    Failed(Error),
}

/// Messages buffered between the driver and the receiver.
const RECV_QUEUE: usize = 4;

/// Starts the call, hands the response stream to the receiver, then watches
/// for cancellation and the deadline for the life of the stream.
async fn drive_stream(
    client: Client,
    ctx: CallContext,
    first: Option<Bytes>,
    mut rx: mpsc::Receiver<Bytes>,
    shared: Arc<StreamShared>,
    start_tx: oneshot::Sender<Started>,
) {
    let deadline = async {
        match ctx.resolved.deadline {
            Some((at, d)) => {
                tokio::time::sleep_until(at).await;
                d
            }
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);

    let first = match first {
        Some(first) => Some(first),
        None => tokio::select! {
            biased;
            message = rx.recv() => message,
            // Kicked by a receive: take a message already queued, if any
            // (a send that returned before the receive started).
            _ = shared.kick.notified() => rx.try_recv().ok(),
            _ = shared.cancel.cancelled() => return,
            d = &mut deadline => {
                shared.fail(Error::DeadlineExceeded { deadline: d });
                return;
            }
        },
    };

    let start = start_call(&client, &ctx, first, rx);
    let started = tokio::select! {
        started = start => started,
        _ = shared.cancel.cancelled() => return,
        d = &mut deadline => {
            shared.fail(Error::DeadlineExceeded { deadline: d });
            return;
        }
    };
    let (handle, mut streaming, deliveries) = match started {
        Ok((metadata, streaming, handle)) => {
            let (deliveries, receiver) = mpsc::channel(RECV_QUEUE);
            if start_tx.send(Ok((metadata, receiver))).is_err() {
                handle.cancel();
                return;
            }
            (handle, streaming, deliveries)
        }
        Err(err) => {
            tracing::debug!(
                path = ctx.path.as_str(),
                code = err.code(),
                "stream failed to start"
            );
            let _ = start_tx.send(Err(err));
            return;
        }
    };
    // Returning drops `streaming`, which resets the HTTP/2 stream.
    loop {
        let next = tokio::select! {
            biased;
            _ = shared.cancel.cancelled() => return handle.cancel(),
            d = &mut deadline => {
                shared.fail(Error::DeadlineExceeded { deadline: d });
                return handle.cancel();
            }
            next = streaming.message() => next,
        };
        let delivery = match next {
            Ok(Some(message)) => Delivery::Message(message),
            Ok(None) => {
                let trailers = tokio::select! {
                    t = streaming.trailers() => t.ok().flatten(),
                    _ = shared.cancel.cancelled() => None,
                };
                Delivery::End(trailers.map(|t| Metadata::from_tonic(&t)))
            }
            Err(status) => Delivery::Failed(Error::from_status(status)),
        };
        let last = !matches!(delivery, Delivery::Message(_));
        tokio::select! {
            biased;
            _ = shared.cancel.cancelled() => return handle.cancel(),
            d = &mut deadline => {
                shared.fail(Error::DeadlineExceeded { deadline: d });
                return handle.cancel();
            }
            sent = deliveries.send(delivery) => {
                if sent.is_err() {
                    return handle.cancel();
                }
            }
        }
        if last {
            return;
        }
    }
}

#[tracing::instrument(name = "openshell.call", skip_all, fields(path = %ctx.path, replica = tracing::field::Empty))]
async fn start_call(
    client: &Client,
    ctx: &CallContext,
    first: Option<Bytes>,
    rx: mpsc::Receiver<Bytes>,
) -> Result<(Metadata, Streaming<Bytes>, tonic::CancellationHandle), Error> {
    let single = ctx.single_request();
    // Shared by attempts: a retried stream continues with the same sender.
    let rx = (!single).then(|| Arc::new(tokio::sync::Mutex::new(rx)));
    let mut token = client.call_token(ctx).await?;
    let mut refreshed = false;
    let mut unrouted = false;
    loop {
        let route = client
            .inner
            .router
            .route(client, ctx.method, first.as_ref(), unrouted)
            .await;
        record_replica(&route);
        let gate = AttemptGate::new(route.is_hinted());
        let body: BoxStream<'static, Bytes> = match (&first, rx.clone()) {
            (Some(first), Some(rx)) => futures::stream::once(std::future::ready(first.clone()))
                .chain(gate.clone().gated(rx))
                .boxed(),
            (None, Some(rx)) => gate.clone().gated(rx).boxed(),
            (Some(first), None) => futures::stream::once(std::future::ready(first.clone())).boxed(),
            (None, None) => futures::stream::empty().boxed(),
        };
        let mut request = client.build_request(ctx, token.as_ref(), &route, body)?;
        let handle = request.cancellation_handle();
        let mut grpc = client.grpc().await?;
        match grpc.streaming(request, ctx.path.clone(), BytesCodec).await {
            Ok(response) => {
                gate.open();
                let (md, streaming, _) = response.into_parts();
                let metadata = Metadata::from_tonic(&md);
                client.inner.router.observe(&route, Ok(&metadata));
                return Ok((metadata, streaming, handle));
            }
            Err(status) => {
                let err = Error::from_status(status);
                gate.close();
                let edge_failure = client.inner.router.observe(&route, Err(&err));
                // Never after the stream carried more than its first message.
                if edge_failure && !unrouted && !gate.delivered() {
                    unrouted = true;
                    continue;
                }
                if err.is_unauthenticated() && !refreshed && client.can_refresh(ctx) {
                    refreshed = true;
                    let rejected = token.as_ref().map_or(0, |t| t.generation);
                    let fresh = client.inner.tokens.refresh_after(rejected).await?;
                    if single {
                        // The request is one known message: replay it.
                        token = fresh;
                        continue;
                    }
                }
                return Err(err);
            }
        }
    }
}

/// Names the replica a call was routed to in the current tracing span.
fn record_replica(route: &RouteDecision) {
    if let Some(replica) = &route.hinted_replica {
        tracing::Span::current().record("replica", replica.as_str());
    }
}

/// Holds back a hinted stream's messages after the first until the gateway
/// answered, so that if the edge cannot route the attempt, nothing but the
/// first message (which the retry resends) was consumed. A server that
/// wants more than one message before answering gets them after a second.
#[derive(Clone)]
struct AttemptGate {
    state: Option<Arc<GateState>>,
}

struct GateState {
    opened: Notify,
    open: std::sync::atomic::AtomicBool,
    /// The attempt failed: its body must not take any more messages.
    dead: std::sync::atomic::AtomicBool,
    delivered: std::sync::atomic::AtomicBool,
}

const GATE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

impl AttemptGate {
    fn new(hinted: bool) -> Self {
        Self {
            state: hinted.then(|| {
                Arc::new(GateState {
                    opened: Notify::new(),
                    open: std::sync::atomic::AtomicBool::new(false),
                    dead: std::sync::atomic::AtomicBool::new(false),
                    delivered: std::sync::atomic::AtomicBool::new(false),
                })
            }),
        }
    }

    fn open(&self) {
        if let Some(state) = &self.state {
            state.open.store(true, std::sync::atomic::Ordering::SeqCst);
            state.opened.notify_waiters();
        }
    }

    /// The attempt failed: a body still being polled ends without taking
    /// messages meant for the next attempt.
    fn close(&self) {
        if let Some(state) = &self.state {
            state.dead.store(true, std::sync::atomic::Ordering::SeqCst);
            state.opened.notify_waiters();
        }
    }

    /// Whether this attempt consumed messages beyond the first.
    fn delivered(&self) -> bool {
        self.state
            .as_ref()
            .is_some_and(|s| s.delivered.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// The caller's later messages, released by the gate.
    fn gated(
        self,
        rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Bytes>>>,
    ) -> impl futures::Stream<Item = Bytes> + Send + 'static {
        futures::stream::unfold((self, rx), |(gate, rx)| async move {
            if let Some(state) = &gate.state
                && !state.open.load(std::sync::atomic::Ordering::SeqCst)
            {
                let opened = state.opened.notified();
                if !state.open.load(std::sync::atomic::Ordering::SeqCst) {
                    let _ = tokio::time::timeout(GATE_PATIENCE, opened).await;
                }
            }
            let dead = |gate: &AttemptGate| {
                gate.state
                    .as_ref()
                    .is_some_and(|s| s.dead.load(std::sync::atomic::Ordering::SeqCst))
            };
            if dead(&gate) {
                return None;
            }
            let mut receiver = rx.lock().await;
            if dead(&gate) {
                return None;
            }
            let next = receiver.recv().await?;
            drop(receiver);
            if let Some(state) = &gate.state {
                state
                    .delivered
                    .store(true, std::sync::atomic::Ordering::SeqCst);
            }
            Some((next, (gate, rx)))
        })
    }
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
    tx: Arc<Mutex<Option<mpsc::Sender<Bytes>>>>,
    shared: Arc<StreamShared>,
    single: bool,
}

impl RawSender {
    /// A sender over a plain channel, not tied to a call (for tests of the
    /// code that drives senders).
    #[cfg(test)]
    pub(crate) fn detached(tx: mpsc::Sender<Bytes>, cancel: CancellationToken) -> Self {
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
    use super::*;
    use http_body_util::BodyExt;
    use tonic::codec::EncodeBody;

    #[tokio::test]
    async fn bytes_codec_round_trips_through_grpc_framing() {
        let messages = vec![
            Bytes::from_static(b""),
            Bytes::from_static(b"\x0a\x03abc"),
            Bytes::from(vec![7u8; 100_000]),
        ];
        let source = futures::stream::iter(messages.clone().into_iter().map(Ok));
        let body = EncodeBody::new_client(BytesEncoder, source, None, None);
        let framed = body.collect().await.unwrap().to_bytes();
        // Each message is framed as: flag (0), length (u32 BE), payload.
        assert_eq!(
            framed.len(),
            messages.iter().map(|m| 5 + m.len()).sum::<usize>()
        );
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 0]);
        assert_eq!(&framed[5..10], &[0, 0, 0, 0, 5]);

        let body = http_body_util::Full::new(framed);
        let mut decoded = Streaming::new_request(BytesDecoder, body, None, None);
        let mut out = Vec::new();
        while let Some(m) = decoded.message().await.unwrap() {
            out.push(m);
        }
        assert_eq!(out, messages);
    }

    #[test]
    fn call_context_validates_paths_and_finds_methods() {
        let resolved = Resolved {
            deadline: None,
            cancel: CancellationToken::new(),
        };
        let ctx = CallContext::new(
            "/openshell.v1.OpenShell/ExecSandbox",
            Metadata::new(),
            resolved.clone(),
        )
        .unwrap();
        assert_eq!(ctx.method.unwrap().owner_routed_field, Some("sandbox"));
        assert!(ctx.single_request());
        let ctx = CallContext::new(
            "/openshell.v1.OpenShell/ForwardTcp",
            Metadata::new(),
            resolved.clone(),
        )
        .unwrap();
        assert!(!ctx.single_request());
        let unknown =
            CallContext::new("/other.v1.Svc/Call", Metadata::new(), resolved.clone()).unwrap();
        assert!(unknown.method.is_none());
        for bad in ["", "Health", "/openshell.v1.OpenShell", "/a/b/c", "/a b/c"] {
            let err = CallContext::new(bad, Metadata::new(), resolved.clone()).unwrap_err();
            assert_eq!(err.code(), "invalid_config", "{bad}");
        }
    }

    async fn lazy_client() -> Client {
        let config = crate::ClientConfig::builder("http://127.0.0.1:1")
            .connect_timeout(std::time::Duration::from_millis(200))
            .build()
            .unwrap();
        Client::connect_lazy(config).await.unwrap()
    }

    #[tokio::test]
    async fn raw_unary_rejects_streaming_methods_before_any_io() {
        let client = lazy_client().await;
        let err = client
            .raw_unary(
                "/openshell.v1.OpenShell/ExecSandbox",
                Bytes::new(),
                Metadata::new(),
                CallOptions::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), "invalid_config");
    }

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
