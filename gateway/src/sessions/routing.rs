//! Where an owner-routed stream goes: to this replica's supervisor session
//! when it holds one ("local"), otherwise over the peer service to the
//! replica named by the sandbox's ownership record ("peer"). Unhinted
//! clients therefore always work; hinted ones avoid the extra hop.
//!
//! While no owner is known (a supervisor reconnecting, a replica stopping)
//! the open is retried with backoff (100 ms doubling to 2 s) until 15 s
//! have passed, then fails with UNAVAILABLE "supervisor session not connected".

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use openshell_proto::peer::peer_client::PeerClient;
use openshell_proto::peer::{PeerRelayFrame, PeerRelayInit, peer_relay_frame};
use openshell_proto::{RelayFrame, RelayOpen, relay_open};
use openshell_sdk::wire::{self, Outbound};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::cluster::Cluster;
use crate::metrics::Metrics;
use crate::sessions::{Relay, Sessions, frames, relay_kind};
use crate::store::Store;

/// Ownership records not renewed for this long are stale.
pub const OWNER_TTL: Duration = Duration::from_secs(45);
pub const OPEN_BUDGET: Duration = Duration::from_secs(15);
pub const PEER_REPLICA_HEADER: &str = "x-openshell-peer-replica";

pub struct RelayRouter {
    pub sessions: Arc<Sessions>,
    pub cluster: Option<Arc<Cluster>>,
    pub store: Store,
    pub metrics: Arc<Metrics>,
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
                let result = self
                    .open_peer(
                        cluster,
                        &owner.peer_endpoint,
                        sandbox_id,
                        target.clone(),
                        ssh_session,
                    )
                    .await;
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
        let channel = cluster.peer_channel(endpoint)?;
        let mut client = PeerClient::new(channel)
            .max_decoding_message_size(8 << 20)
            .max_encoding_message_size(8 << 20);
        let (tx, rx) = mpsc::channel(16);
        let init = PeerRelayFrame {
            payload: Some(peer_relay_frame::Payload::Init(PeerRelayInit {
                sandbox_id: sandbox_id.to_owned(),
                relay_open: Some(RelayOpen {
                    channel_id: String::new(),
                    target: Some(target),
                    service_id: String::new(),
                }),
                requester_replica_id: cluster.replica_id().to_owned(),
                ssh_session: ssh_session.unwrap_or_default().to_owned(),
            })),
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
        let bearer: MetadataValue<_> = format!("Bearer {}", cluster.config.peer_token.expose())
            .parse()
            .map_err(|_| Status::internal("peer token is not a valid header value"))?;
        request.metadata_mut().insert("authorization", bearer);
        let replica: MetadataValue<_> = cluster
            .replica_id()
            .parse()
            .map_err(|_| Status::internal("replica id is not a valid header value"))?;
        request.metadata_mut().insert(PEER_REPLICA_HEADER, replica);
        let response = client.peer_relay(request).await.map_err(|status| {
            // A certificate problem does not heal within the open budget:
            // answer at once, saying which hop failed.
            match cluster.peer_tls_failure(endpoint, &status) {
                Some(cause) => Status::unavailable(format!(
                    "relay to the owner replica failed: peer TLS: {cause}"
                )),
                None => status,
            }
        })?;
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
