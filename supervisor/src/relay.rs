//! Relays: the data channels the gateway announces on the session.
//!
//! The gateway sends `RelayOpen{channel_id, target}` on the session; the
//! supervisor claims the channel by opening `RelayStream` on the same
//! connection with `init{channel_id}` as the first frame, then runs the
//! target over that stream. This module holds what every relay shares
//! (claiming, reporting a failure, draining); the targets build on it (TCP
//! connections in `forward`, processes in `exec`), and the session picks
//! the target.
//!
//! Every relay runs in its own task with a cancel signal owned by the
//! session: `relay_close`, the end of the session, and supervisor shutdown
//! all cancel through it. Outbound frames go through a bounded channel, so a
//! slow gateway slows the process or socket instead of growing a buffer.

use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use http::uri::PathAndQuery;
use openshell_proto::{
    RelayFrame, RelayInit, RelayOpenResult, SupervisorMessage, relay_frame, supervisor_message,
};
use openshell_sdk::CancellationToken;
use openshell_sdk::wire::{self, FramedBody, GrpcFrames, Outbound};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tower::{Service, ServiceExt};
use tracing::debug;

use crate::transport::BearerToken;

/// Outbound frames buffered per relay (each at most 64 KiB of payload).
const OUTBOUND_FRAMES: usize = 16;
/// After our side finished, how long the gateway gets to end the stream.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest inbound frame (tonic's default limit; frames carry 64 KiB).
const MAX_INBOUND_FRAME: usize = 4 << 20;
const RELAY_STREAM: &str = "/openshell.v1.OpenShell/RelayStream";

/// What a relay task needs from its session.
#[derive(Clone)]
pub struct RelayContext {
    /// The session's channel: relays ride the same HTTP/2 connection.
    pub channel: Channel,
    /// The replica holding the session (from `x-openshell-served-by`); relay
    /// claims carry it as `x-openshell-replica` so an edge routes them there.
    pub replica: Option<String>,
    pub token: BearerToken,
    /// The session's outbound side, for `relay_open_result`.
    pub session: mpsc::Sender<Box<SupervisorMessage>>,
    /// Never sent on: held for the life of the relay task, so shutdown can
    /// wait until every clone is dropped.
    #[allow(dead_code)]
    pub alive: mpsc::Sender<()>,
}

/// A claimed relay: outbound frames in, inbound frames out.
pub struct Claimed {
    pub out: mpsc::Sender<RelayFrame>,
    pub inbound: BoxStream<'static, Result<RelayFrame, tonic::Status>>,
}

/// Opens `RelayStream` for `channel_id` and sends `init` first.
///
/// The call is made with the suite's own gRPC framing
/// ([`openshell_sdk::wire`]) instead of the generated client: inbound
/// frames are decoded from the HTTP/2 chunks they arrive in, so their data
/// is not copied into a receive buffer first (the bulk direction of a
/// forward).
pub async fn claim(ctx: &RelayContext, channel_id: &str) -> Result<Claimed, tonic::Status> {
    let (out, rx) = mpsc::channel(OUTBOUND_FRAMES);
    let init = RelayFrame {
        payload: Some(relay_frame::Payload::Init(RelayInit {
            channel_id: channel_id.to_owned(),
        })),
    };
    out.try_send(init)
        .expect("a fresh channel has room for init");
    let mut metadata = ctx.token.request(()).into_parts().0;
    if let Some(replica) = ctx.replica.as_deref().and_then(|r| r.parse().ok()) {
        metadata.insert("x-openshell-replica", replica);
    }
    let frames = ReceiverStream::new(rx)
        .map(|frame| Outbound::Framed(wire::frame_message(&frame)))
        .boxed();
    // Never cancelled: the stream ends when `out` and `inbound` are dropped.
    let body = FramedBody::new(frames, CancellationToken::new());
    let request = wire::request(
        &PathAndQuery::from_static(RELAY_STREAM),
        metadata.into_headers(),
        body,
    );
    let mut channel = ctx.channel.clone();
    let response = channel
        .ready()
        .await
        .map_err(|e| tonic::Status::from_error(Box::new(e)))?
        .call(request)
        .await
        .map_err(|e| tonic::Status::from_error(Box::new(e)))?;
    let (parts, body) = response.into_parts();
    let inbound = if wire::check_response(parts.status, &parts.headers)? {
        GrpcFrames::ended()
    } else {
        GrpcFrames::new(body, MAX_INBOUND_FRAME)
    };
    let inbound = inbound
        .map(|message| {
            message.and_then(|bytes| {
                RelayFrame::decode(bytes).map_err(|e| {
                    tonic::Status::internal(format!("a relay frame did not decode: {e}"))
                })
            })
        })
        .boxed();
    Ok(Claimed { out, inbound })
}

/// Tells the gateway on the session that a relay could not be opened.
pub async fn report_failure(ctx: &RelayContext, channel_id: &str, error: String) {
    let message = SupervisorMessage {
        payload: Some(supervisor_message::Payload::RelayOpenResult(
            RelayOpenResult {
                channel_id: channel_id.to_owned(),
                success: false,
                error,
            },
        )),
    };
    if ctx.session.send(Box::new(message)).await.is_err() {
        debug!(channel_id, "session gone before relay_open_result");
    }
}

/// After our side ended its request stream: reads inbound to its end, so the
/// gateway receives everything we sent before the call is torn down.
pub async fn drain<S>(mut inbound: S, cancel: impl Future<Output = ()>)
where
    S: Stream<Item = Result<RelayFrame, tonic::Status>> + Unpin,
{
    let to_end = async { while let Some(Ok(_)) = inbound.next().await {} };
    tokio::select! {
        _ = to_end => {}
        _ = cancel => {}
        _ = tokio::time::sleep(DRAIN_TIMEOUT) => debug!("gateway did not end the relay stream"),
    }
}
