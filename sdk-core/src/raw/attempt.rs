//! Starting a stream and pumping its answers: the driver task of every
//! [`RawStream`](super::RawStream). Each attempt asks the router, builds the
//! request through the one request builder, and may be retried once
//! unrouted (the edge proved it never forwarded the attempt, and nothing but
//! the first message was consumed) or once
//! with a fresh token (`UNAUTHENTICATED`, replayable requests only).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::CallContext;
use super::call::record_replica;
use super::stream::{Delivery, Started, StreamShared};
use crate::client::Client;
use crate::error::Error;
use crate::metadata::Metadata;
use crate::wire::{FramedBody, GrpcFrames, Outbound};

/// Messages buffered between the driver and the receiver.
const RECV_QUEUE: usize = 4;

/// Starts the call, hands the response stream to the receiver, then watches
/// for cancellation and the deadline for the life of the stream.
pub(super) async fn drive_stream(
    client: Client,
    ctx: CallContext,
    first: Option<Bytes>,
    mut rx: mpsc::Receiver<Outbound>,
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
            message = rx.recv() => message.map(Outbound::into_message),
            // Kicked by a receive: take a message already queued, if any
            // (a send that returned before the receive started).
            _ = shared.kick.notified() => rx.try_recv().ok().map(Outbound::into_message),
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
            next = streaming.next() => next,
        };
        let delivery = match next {
            Some(Ok(message)) => Delivery::Message(message),
            None => Delivery::End(streaming.trailers().map(Metadata::from_headers)),
            Some(Err(status)) => Delivery::Failed(Error::from_status(status)),
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
    rx: mpsc::Receiver<Outbound>,
) -> Result<(Metadata, GrpcFrames<tonic::body::Body>, CancellationToken), Error> {
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
            .route(
                client,
                ctx.method,
                first.as_ref(),
                unrouted,
                ctx.owner_of.as_deref(),
            )
            .await;
        record_replica(&route);
        let gate = AttemptGate::new(route.is_hinted());
        let first_message = first.clone().map(Outbound::Message);
        let body: BoxStream<'static, Outbound> = match (first_message, rx.clone()) {
            (Some(first), Some(rx)) => futures::stream::once(std::future::ready(first))
                .chain(gate.clone().gated(rx))
                .boxed(),
            (None, Some(rx)) => gate.clone().gated(rx).boxed(),
            (Some(first), None) => futures::stream::once(std::future::ready(first)).boxed(),
            (None, None) => futures::stream::empty().boxed(),
        };
        let metadata = client.request_metadata(ctx, token.as_ref(), &route)?;
        let handle = CancellationToken::new();
        let body = FramedBody::new(body, handle.clone());
        match client.start_framed(&ctx.path, metadata, body).await {
            Ok((metadata, streaming)) => {
                gate.open();
                client.inner.router.observe(&route, Ok(&metadata));
                return Ok((metadata, streaming, handle));
            }
            Err(err) => {
                gate.close();
                let never_forwarded = client.inner.router.observe(&route, Err(&err));
                // Never after the stream carried more than its first message.
                if never_forwarded && !unrouted && !gate.delivered() {
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
    open: AtomicBool,
    /// The attempt failed: its body must not take any more messages.
    dead: AtomicBool,
    delivered: AtomicBool,
}

const GATE_PATIENCE: Duration = Duration::from_secs(1);

impl AttemptGate {
    fn new(hinted: bool) -> Self {
        Self {
            state: hinted.then(|| {
                Arc::new(GateState {
                    opened: Notify::new(),
                    open: AtomicBool::new(false),
                    dead: AtomicBool::new(false),
                    delivered: AtomicBool::new(false),
                })
            }),
        }
    }

    fn open(&self) {
        if let Some(state) = &self.state {
            state.open.store(true, Ordering::SeqCst);
            state.opened.notify_waiters();
        }
    }

    /// The attempt failed: a body still being polled ends without taking
    /// messages meant for the next attempt.
    fn close(&self) {
        if let Some(state) = &self.state {
            state.dead.store(true, Ordering::SeqCst);
            state.opened.notify_waiters();
        }
    }

    /// Whether this attempt consumed messages beyond the first.
    fn delivered(&self) -> bool {
        self.state
            .as_ref()
            .is_some_and(|s| s.delivered.load(Ordering::SeqCst))
    }

    /// The caller's later messages, released by the gate.
    fn gated(
        self,
        rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Outbound>>>,
    ) -> impl futures::Stream<Item = Outbound> + Send + 'static {
        futures::stream::unfold((self, rx), |(gate, rx)| async move {
            if let Some(state) = &gate.state
                && !state.open.load(Ordering::SeqCst)
            {
                let opened = state.opened.notified();
                if !state.open.load(Ordering::SeqCst) {
                    let _ = tokio::time::timeout(GATE_PATIENCE, opened).await;
                }
            }
            let dead = |gate: &AttemptGate| {
                gate.state
                    .as_ref()
                    .is_some_and(|s| s.dead.load(Ordering::SeqCst))
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
                state.delivered.store(true, Ordering::SeqCst);
            }
            Some((next, (gate, rx)))
        })
    }
}
