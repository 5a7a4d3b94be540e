//! Where an owner-routed stream goes: to this replica's supervisor session
//! when it holds one ("local"), otherwise over the peer service to the
//! replica named by the sandbox's ownership record ("peer"). Unhinted
//! clients therefore always work; hinted ones avoid the extra hop.
//!
//! A peer relay is asked for with `PeerRelayFrames`, which passes frames on
//! as the bytes they came in on both replicas; an owner that answers
//! UNIMPLEMENTED (a replica from before it) is asked with `PeerRelay`, and
//! remembered as such for a while.
//!
//! While no owner is known (a supervisor reconnecting, a replica stopping)
//! the open is retried with backoff (100 ms doubling to 2 s) until 15 s
//! have passed, then fails with UNAVAILABLE "supervisor session not connected".

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use http::uri::PathAndQuery;
use openshell_proto::peer::peer_client::PeerClient;
use openshell_proto::peer::{PeerRelayFrame, PeerRelayInit, peer_relay_frame};
use openshell_proto::{RelayFrame, RelayOpen, relay_open};
use openshell_sdk::wire::{self, FramedBody, GrpcFrames, Outbound};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};
use tower::{Service, ServiceExt};

use crate::cluster::Cluster;
use crate::metrics::Metrics;
use crate::sessions::{Relay, Sessions, frames, relay_kind};
use crate::store::Store;

/// Ownership records not renewed for this long are stale.
pub const OWNER_TTL: Duration = Duration::from_secs(45);
pub const OPEN_BUDGET: Duration = Duration::from_secs(15);
pub const PEER_REPLICA_HEADER: &str = "x-openshell-peer-replica";
/// `PeerRelayFrames` (raw), and the header of its init.
const PEER_RELAY_FRAMES: &str = "/openshell.peer.v1.Peer/PeerRelayFrames";
const PEER_RELAY_INIT_HEADER: &str = "x-openshell-peer-relay-init-bin";
/// The largest frame taken from a peer.
const MAX_PEER_FRAME: usize = 8 << 20;
/// How long an owner that answered `PeerRelayFrames` with UNIMPLEMENTED is
/// asked with `PeerRelay` only (it may be upgraded meanwhile).
const LEGACY_PEER_TTL: Duration = Duration::from_secs(60);
/// The largest encoded init sent in a header (base64 makes it a third
/// larger; HTTP/2 peers take header lists of 16 KiB by default). A larger
/// one (an exec with a long command line or environment) goes in the
/// wrapped `PeerRelay`, whose init is a message.
const MAX_HEADER_INIT: usize = 8 * 1024;

pub struct RelayRouter {
    pub sessions: Arc<Sessions>,
    pub cluster: Option<Arc<Cluster>>,
    pub store: Store,
    pub metrics: Arc<Metrics>,
    /// Peer endpoints that do not serve `PeerRelayFrames`, and since when.
    pub legacy_peers: Mutex<HashMap<String, Instant>>,
}

impl RelayRouter {
    /// The replica holding the sandbox's session, if known: this one when it
    /// holds it locally, else the fresh ownership record's replica.
    /// The replica holding `sandbox_id`'s session, for owner reporting.
    /// `None` without a cluster and in a cluster of one: with nowhere else
    /// to go, a hint would only cost the client a lookup.
    pub async fn owner_of(&self, sandbox_id: &str) -> Option<String> {
        let cluster = self.cluster.as_ref()?;
        if cluster.alone().await {
            return None;
        }
        if self.sessions.has_session(sandbox_id) {
            return Some(cluster.replica_id().to_owned());
        }
        match self.store.owner(sandbox_id, OWNER_TTL).await {
            Ok(record) => record.map(|r| r.replica_id),
            Err(err) => {
                tracing::warn!(%err, "owner lookup failed");
                None
            }
        }
    }

    /// Opens a relay to `sandbox_id`'s supervisor wherever its session is.
    /// `ssh_session`: the SSH session (token hash) a forward was opened with;
    /// the owner counts it against the session's caps.
    pub async fn open(
        &self,
        sandbox_id: &str,
        target: relay_open::Target,
        ssh_session: Option<&str>,
    ) -> Result<Relay, Status> {
        let kind = relay_kind(&target);
        let Some(cluster) = &self.cluster else {
            // One replica: the session is here or not at all.
            let result = self
                .sessions
                .open_local(sandbox_id, target, OPEN_BUDGET, ssh_session)
                .await;
            self.count("local", kind, &result);
            return result;
        };
        let deadline = tokio::time::Instant::now() + OPEN_BUDGET;
        let mut backoff = Duration::from_millis(100);
        loop {
            if self.sessions.has_session(sandbox_id) {
                let result = self
                    .sessions
                    .open_local(sandbox_id, target.clone(), Duration::ZERO, ssh_session)
                    .await;
                self.count("local", kind, &result);
                match result {
                    Err(status) if retryable(&status) => {}
                    other => return other,
                }
            } else if let Ok(Some(owner)) = self.store.owner(sandbox_id, OWNER_TTL).await
                && owner.replica_id != cluster.replica_id()
            {
                // A peer cut off after its connection was made answers
                // nothing: the open budget bounds the wait, as it bounds
                // the retries.
                let opened = tokio::time::timeout_at(
                    deadline,
                    self.open_peer(
                        cluster,
                        &owner.peer_endpoint,
                        sandbox_id,
                        target.clone(),
                        ssh_session,
                    ),
                )
                .await;
                let Ok(result) = opened else {
                    let timed_out = Err(Status::unavailable(format!(
                        "relay to the owner replica failed: {} did not answer within {} s",
                        owner.replica_id,
                        OPEN_BUDGET.as_secs()
                    )));
                    self.count("peer", kind, &timed_out);
                    return timed_out;
                };
                self.count("peer", kind, &result);
                match result {
                    Err(status) if retryable(&status) => {
                        tracing::debug!(sandbox_id, owner = owner.replica_id, %status, "peer relay failed; retrying");
                    }
                    other => return other,
                }
            }
            if self.sessions.is_shutting_down() {
                return Err(Status::unavailable("gateway is shutting down"));
            }
            if tokio::time::Instant::now() + backoff >= deadline {
                return Err(Status::unavailable("supervisor session not connected"));
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    fn count(&self, route: &'static str, kind: &'static str, result: &Result<Relay, Status>) {
        let outcome = match (route, result) {
            (_, Ok(_)) => "success",
            ("peer", Err(_)) => "remote_error",
            _ => "local_error",
        };
        self.metrics.record_route(route, kind, outcome);
    }

    async fn open_peer(
        &self,
        cluster: &Cluster,
        endpoint: &str,
        sandbox_id: &str,
        target: relay_open::Target,
        ssh_session: Option<&str>,
    ) -> Result<Relay, Status> {
        let init = PeerRelayInit {
            sandbox_id: sandbox_id.to_owned(),
            relay_open: Some(RelayOpen {
                channel_id: String::new(),
                target: Some(target),
                service_id: String::new(),
            }),
            requester_replica_id: cluster.replica_id().to_owned(),
            ssh_session: ssh_session.unwrap_or_default().to_owned(),
        };
        let legacy = self
            .legacy_peers
            .lock()
            .unwrap()
            .get(endpoint)
            .is_some_and(|since| since.elapsed() < LEGACY_PEER_TTL);
        let encoded = init.encode_to_vec();
        if !legacy && encoded.len() <= MAX_HEADER_INIT {
            match self.open_peer_frames(cluster, endpoint, &encoded).await {
                Err(status) if status.code() == Code::Unimplemented => {
                    tracing::info!(
                        endpoint,
                        "peer does not serve PeerRelayFrames; using PeerRelay"
                    );
                    self.legacy_peers
                        .lock()
                        .unwrap()
                        .insert(endpoint.to_owned(), Instant::now());
                }
                other => return other,
            }
        }
        self.open_peer_wrapped(cluster, endpoint, init).await
    }

    /// The peer's credentials as request metadata.
    fn peer_metadata(cluster: &Cluster) -> Result<MetadataMap, Status> {
        let mut metadata = MetadataMap::new();
        let bearer: MetadataValue<_> = format!("Bearer {}", cluster.config.peer_token.expose())
            .parse()
            .map_err(|_| Status::internal("peer token is not a valid header value"))?;
        metadata.insert("authorization", bearer);
        let replica: MetadataValue<_> = cluster
            .replica_id()
            .parse()
            .map_err(|_| Status::internal("replica id is not a valid header value"))?;
        metadata.insert(PEER_REPLICA_HEADER, replica);
        Ok(metadata)
    }

    /// A failed call to a peer, saying which hop failed when the peer's
    /// certificate is the cause (that does not heal within the open budget).
    fn peer_failure(cluster: &Cluster, endpoint: &str, status: Status) -> Status {
        match cluster.peer_tls_failure(endpoint, &status) {
            Some(cause) => Status::unavailable(format!(
                "relay to the owner replica failed: peer TLS: {cause}"
            )),
            None => status,
        }
    }

    /// `PeerRelayFrames`: the relay's frames cross this replica as the bytes
    /// they came in, each way (no wrapper, no decoding).
    async fn open_peer_frames(
        &self,
        cluster: &Cluster,
        endpoint: &str,
        init: &[u8],
    ) -> Result<Relay, Status> {
        let mut channel = cluster.peer_channel(endpoint)?;
        let mut metadata = Self::peer_metadata(cluster)?;
        metadata.insert_bin(
            PEER_RELAY_INIT_HEADER,
            tonic::metadata::MetadataValue::from_bytes(init),
        );
        let (tx, rx) = mpsc::channel::<Result<Outbound, Status>>(16);
        // A failed local frame ends the request stream (the owner then
        // cancels the relay).
        let frames = ReceiverStream::new(rx)
            .take_while(|f| futures::future::ready(f.is_ok()))
            .map(|f| f.expect("filtered"))
            .boxed();
        // Never cancelled: the stream ends when the relay is dropped.
        let body = FramedBody::new(frames, CancellationToken::new());
        let request = wire::request(
            &PathAndQuery::from_static(PEER_RELAY_FRAMES),
            metadata.into_headers(),
            body,
        );
        let called = async {
            channel
                .ready()
                .await
                .map_err(|e| Status::from_error(Box::new(e)))?
                .call(request)
                .await
                .map_err(|e| Status::from_error(Box::new(e)))
        };
        let response = called
            .await
            .map_err(|status| Self::peer_failure(cluster, endpoint, status))?;
        let (parts, body) = response.into_parts();
        let inbound = if wire::check_response(parts.status, &parts.headers)? {
            GrpcFrames::ended()
        } else {
            GrpcFrames::new(body, MAX_PEER_FRAME).with_prefixes()
        };
        // Not counted in relays_active: the owner counts its supervisor relay.
        Ok(Relay::new(Box::pin(inbound), tx))
    }

    /// `PeerRelay`, for owners from before `PeerRelayFrames`: each frame
    /// wrapped in a `PeerRelayFrame`.
    async fn open_peer_wrapped(
        &self,
        cluster: &Cluster,
        endpoint: &str,
        init: PeerRelayInit,
    ) -> Result<Relay, Status> {
        let channel = cluster.peer_channel(endpoint)?;
        let mut client = PeerClient::new(channel)
            .max_decoding_message_size(8 << 20)
            .max_encoding_message_size(8 << 20);
        let (tx, rx) = mpsc::channel(16);
        let init = PeerRelayFrame {
            payload: Some(peer_relay_frame::Payload::Init(init)),
        };
        // A failed local frame ends the peer request stream (the owner then
        // cancels the relay).
        let frames = ReceiverStream::new(rx)
            .map(|f: Result<Outbound, Status>| {
                f.and_then(|f| frames::decode_message::<RelayFrame>(f.into_message()))
            })
            .take_while(|f| futures::future::ready(f.is_ok()))
            .map(|f| PeerRelayFrame {
                payload: Some(peer_relay_frame::Payload::Frame(f.expect("filtered"))),
            });
        let outbound = futures::stream::once(async { init }).chain(frames);
        let mut request = tonic::Request::new(outbound);
        *request.metadata_mut() = Self::peer_metadata(cluster)?;
        let response = client
            .peer_relay(request)
            .await
            .map_err(|status| Self::peer_failure(cluster, endpoint, status))?;
        let inbound = response.into_inner().filter_map(|frame| async move {
            match frame {
                Ok(PeerRelayFrame {
                    payload: Some(peer_relay_frame::Payload::Frame(frame)),
                }) => Some(Ok(wire::frame_message(&frame))),
                Ok(_) => None,
                Err(status) => Some(Err(status)),
            }
        });
        // Not counted in relays_active: the owner counts its supervisor relay.
        Ok(Relay::new(Box::pin(inbound), tx))
    }
}

/// Failures worth another attempt within the open budget: the session or
/// owner is moving.
fn retryable(status: &Status) -> bool {
    matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded)
        && !status.message().starts_with("supervisor relay failed")
        && !status.message().starts_with("supervisor closed the relay")
        && !status
            .message()
            .starts_with("relay to the owner replica failed")
        && !status.message().starts_with(super::NOT_TAKING_RELAY_OPENS)
}
