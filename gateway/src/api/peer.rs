//! The peer service (`openshell.peer.v1.Peer`): the owner side of a relayed
//! stream. Another replica asks this one, which holds the sandbox's
//! supervisor session, to open a relay and pipe frames both ways. Only
//! replicas get here: the request layer checks the peer token.
//!
//! Two forms of the same relay: `PeerRelayFrames` ([`relay_frames`], served
//! as a raw route, `raw_routes`) passes each frame on as the bytes it came
//! in; `PeerRelay` (tonic, each frame wrapped in a `PeerRelayFrame`) is
//! what replicas before it ask for, and is still served.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use openshell_proto::peer::peer_server::Peer;
use openshell_proto::peer::{
    PeerNotifyConfigUpdateRequest, PeerNotifyConfigUpdateResponse, PeerRelayFrame, PeerRelayInit,
    peer_relay_frame,
};
use openshell_sdk::wire::Outbound;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::Principal;
use crate::config::delivery::ConfigDelivery;
use crate::sessions::{FrameStream, Sessions, frames};

/// The request header carrying a `PeerRelayFrames` call's encoded
/// `PeerRelayInit` (a binary header: base64 on the wire).
pub const RELAY_INIT_HEADER: &str = "x-openshell-peer-relay-init-bin";

/// How long the owner waits for its own session (it may be reconnecting).
const OWNER_SESSION_WAIT: Duration = Duration::from_secs(5);

pub struct PeerService {
    pub sessions: Arc<Sessions>,
    pub delivery: Arc<ConfigDelivery>,
    /// False only with the hidden `--no-peer-config-notify` (tests): this
    /// replica answers config notifications as an older one would.
    pub config_notify: bool,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Peer for PeerService {
    /// Another replica committed a configuration change: mark the affected
    /// push sessions here. No configuration crosses replicas.
    async fn peer_notify_config_update(
        &self,
        request: Request<PeerNotifyConfigUpdateRequest>,
    ) -> Result<Response<PeerNotifyConfigUpdateResponse>, Status> {
        if !matches!(
            request.extensions().get::<Principal>(),
            Some(Principal::Peer(_))
        ) {
            return Err(Status::permission_denied("peer credentials required"));
        }
        if !self.config_notify {
            return Err(Status::unimplemented(
                "PeerNotifyConfigUpdate is not served by this replica",
            ));
        }
        let stale_owner = self.delivery.on_peer_notify(request.into_inner());
        Ok(Response::new(PeerNotifyConfigUpdateResponse {
            stale_owner,
        }))
    }

    type PeerRelayStream = BoxStream<PeerRelayFrame>;
    type PeerRelayFramesStream = BoxStream<openshell_proto::RelayFrame>;

    /// Served by the raw route ([`relay_frames`]) before tonic sees it;
    /// reached only where that route is off (`--no-peer-relay-frames`).
    async fn peer_relay_frames(
        &self,
        _request: Request<Streaming<openshell_proto::RelayFrame>>,
    ) -> Result<Response<Self::PeerRelayFramesStream>, Status> {
        Err(Status::unimplemented(
            "PeerRelayFrames is not served by this replica",
        ))
    }

    async fn peer_relay(
        &self,
        request: Request<Streaming<PeerRelayFrame>>,
    ) -> Result<Response<Self::PeerRelayStream>, Status> {
        let requester = match request.extensions().get::<Principal>() {
            Some(Principal::Peer(replica)) => replica.clone(),
            _ => return Err(Status::permission_denied("peer credentials required")),
        };
        let mut inbound = request.into_inner();
        let init = match inbound.message().await? {
            Some(PeerRelayFrame {
                payload: Some(peer_relay_frame::Payload::Init(init)),
            }) => init,
            _ => {
                return Err(Status::invalid_argument(
                    "the first peer relay frame must be init",
                ));
            }
        };
        let relay = open_for(&self.sessions, &requester, init).await?;
        let (tx, rx) = mpsc::channel::<Result<PeerRelayFrame, Status>>(16);
        // The requester ending its stream, cleanly or not, ends the relay:
        // half-closes travel as `eof` frames, never as stream ends.
        let requester_gone = CancellationToken::new();
        let outbound = relay.outbound.clone();
        let gone = requester_gone.clone();
        tokio::spawn(async move {
            let _gone = gone.drop_guard();
            while let Some(frame) = inbound.next().await {
                match frame {
                    Ok(PeerRelayFrame {
                        payload: Some(peer_relay_frame::Payload::Frame(frame)),
                    }) => {
                        if outbound.send(Ok(frames::framed(&frame))).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => continue,
                    Err(_) => return,
                }
            }
        });
        tokio::spawn(async move {
            let mut relay = relay;
            loop {
                tokio::select! {
                    _ = requester_gone.cancelled() => return,
                    _ = tx.closed() => return,
                    frame = relay.next_frame() => match frame {
                        Some(Ok(frame)) => {
                            let frame = PeerRelayFrame {
                                payload: Some(peer_relay_frame::Payload::Frame(frame)),
                            };
                            if tx.send(Ok(frame)).await.is_err() {
                                return;
                            }
                        }
                        Some(Err(status)) => {
                            let _ = tx.send(Err(status)).await;
                            return;
                        }
                        None => return,
                    },
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Opens the relay a peer's init asks for, on this replica's session.
async fn open_for(
    sessions: &Sessions,
    requester: &str,
    init: PeerRelayInit,
) -> Result<crate::sessions::Relay, Status> {
    if init.requester_replica_id != requester {
        return Err(Status::permission_denied(
            "requester_replica_id does not match the calling replica",
        ));
    }
    let target = init
        .relay_open
        .and_then(|open| open.target)
        .ok_or_else(|| Status::invalid_argument("peer relay init needs a target"))?;
    sessions
        .open_local(
            &init.sandbox_id,
            target,
            OWNER_SESSION_WAIT,
            (!init.ssh_session.is_empty()).then_some(init.ssh_session.as_str()),
        )
        .await
}

/// `PeerRelayFrames`, the owner side: the init from its header, then the
/// requester's frames go to the supervisor and the supervisor's come back,
/// each as the framed bytes it arrived in. The requester's stream ending,
/// cleanly or not, ends the relay (half-closes travel as `eof` frames).
pub async fn relay_frames(
    sessions: &Sessions,
    principal: Option<Principal>,
    headers: &http::HeaderMap,
    mut inbound: FrameStream,
) -> Result<ReceiverStream<Result<Outbound, Status>>, Status> {
    let Some(Principal::Peer(requester)) = principal else {
        return Err(Status::permission_denied("peer credentials required"));
    };
    let init = tonic::metadata::MetadataMap::from_headers(headers.clone())
        .get_bin(RELAY_INIT_HEADER)
        .ok_or_else(|| Status::invalid_argument(format!("{RELAY_INIT_HEADER} is required")))?
        .to_bytes()
        .map_err(|_| Status::invalid_argument(format!("{RELAY_INIT_HEADER} is not base64")))?;
    let init = PeerRelayInit::decode(init).map_err(|_| {
        Status::invalid_argument(format!("{RELAY_INIT_HEADER} is not a PeerRelayInit"))
    })?;
    let relay = open_for(sessions, &requester, init).await?;
    let (tx, rx) = mpsc::channel::<Result<Outbound, Status>>(16);
    let requester_gone = CancellationToken::new();
    let outbound = relay.outbound.clone();
    let gone = requester_gone.clone();
    tokio::spawn(async move {
        let _gone = gone.drop_guard();
        while let Some(Ok(frame)) = inbound.next().await {
            if outbound.send(Ok(Outbound::Framed(frame))).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        let mut relay = relay;
        loop {
            tokio::select! {
                _ = requester_gone.cancelled() => return,
                _ = tx.closed() => return,
                frame = relay.inbound.next() => match frame {
                    Some(Ok(frame)) => {
                        if tx.send(Ok(Outbound::Framed(frame))).await.is_err() {
                            return;
                        }
                    }
                    Some(Err(status)) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                    None => return,
                },
            }
        }
    });
    Ok(ReceiverStream::new(rx))
}
