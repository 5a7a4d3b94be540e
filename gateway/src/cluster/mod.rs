//! Cluster membership and the placement ring.
//!
//! Each replica registers `{replica id, peer endpoint}` in the shared store
//! and refreshes it every 10 s (and re-reads the members every 500 ms for
//! its first 30 s, while a cluster starting together fills in); a member is
//! live while its row was refreshed within the 30 s TTL by the database's
//! clock. Every store call of the membership worker has a timeout, so a
//! hung database cannot keep a stale ring: if the ring could not be
//! refreshed for longer than the TTL it is cleared and the replica is
//! **fenced** ([`Cluster::fenced`]): the others have dropped it from their
//! rings by then, so it must stop acting as an owner. `serve::fence` hands
//! its sessions to the replicas of its last ring and stops listening until
//! a refresh succeeds again.
//!
//! The ring is a view up to one refresh old. Whoever must reach every
//! member right now (config notifications) reads the store instead
//! ([`Cluster::live_members_now`]), and whoever must hear that this replica
//! became a member again (to catch up on what a stale view made others skip)
//! watches [`Cluster::joins`].
//!
//! Folder: this module (membership), `ring` (consistent-hash placement) and
//! `placement` (where a supervisor host's session goes: the ring and a cap).
//! May import `metrics`, `secret` and `store` only.

pub mod placement;
pub mod ring;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::cluster::ring::Ring;
use crate::metrics::Metrics;
use crate::secret::Secret;
use crate::store::{Member, Store, StoreError};

/// Largest HTTP/2 frame a peer may send on a peer channel: one relayed
/// 64 KiB data frame fits one HTTP/2 frame (the replicas' own setting).
const PEER_H2_MAX_FRAME_SIZE: u32 = 256 * 1024;
/// HTTP/2 keepalive of peer channels: ping interval and answer timeout.
const PEER_KEEPALIVE: Duration = Duration::from_secs(5);
/// How long after start the view is re-read often, and how often.
const STARTUP_WINDOW: Duration = Duration::from_secs(30);
const STARTUP_RESYNC: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub replica_id: String,
    /// URL other replicas and redirected supervisors use to reach this one.
    pub peer_endpoint: String,
    /// Shared secret replicas present to each other's peer service.
    pub peer_token: Secret,
    /// PEM CA bundle trusted for `https` peer endpoints (`--peer-ca`);
    /// `None`: the system roots.
    pub peer_ca: Option<Vec<u8>>,
    pub member_ttl: Duration,
    pub refresh_every: Duration,
    pub store_timeout: Duration,
}

impl ClusterConfig {
    pub fn new(replica_id: String, peer_endpoint: String, peer_token: Secret) -> Self {
        Self {
            replica_id,
            peer_endpoint,
            peer_token,
            peer_ca: None,
            member_ttl: Duration::from_secs(30),
            refresh_every: Duration::from_secs(10),
            store_timeout: Duration::from_secs(5),
        }
    }
}

struct View {
    ring: Ring,
    endpoints: HashMap<String, String>,
    refreshed: Instant,
}

pub struct Cluster {
    pub config: ClusterConfig,
    store: Store,
    view: RwLock<View>,
    leaving: AtomicBool,
    metrics: Arc<Metrics>,
    peers: Mutex<HashMap<String, Channel>>,
    /// Bumped each time this replica becomes visible as a member: its first
    /// refresh, and the first one after its view was cleared.
    joined: watch::Sender<u64>,
    /// Whether the view was cleared for want of a refresh (fenced), and the
    /// ring (without this replica) and endpoints it had before, where the
    /// sessions held here are sent.
    fenced: watch::Sender<bool>,
    before_fence: Mutex<(Ring, HashMap<String, String>)>,
}

#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("store call timed out")]
    Timeout,
}

impl Cluster {
    /// Registers this replica, reads the ring once, and starts the worker.
    pub async fn start(config: ClusterConfig, store: Store, metrics: Arc<Metrics>) -> Arc<Self> {
        let cluster = Arc::new(Self {
            config,
            store,
            view: RwLock::new(View {
                ring: Ring::default(),
                endpoints: HashMap::new(),
                refreshed: Instant::now(),
            }),
            leaving: AtomicBool::new(false),
            metrics,
            peers: Mutex::new(HashMap::new()),
            joined: watch::channel(0).0,
            fenced: watch::channel(false).0,
            before_fence: Mutex::new((Ring::default(), HashMap::new())),
        });
        if let Err(err) = cluster.refresh().await {
            tracing::warn!(%err, "first membership refresh failed");
        }
        let worker = cluster.clone();
        tokio::spawn(async move { worker.run().await });
        cluster
    }

    async fn run(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.config.refresh_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        // Right after start the other replicas of a cluster starting
        // together are still registering: the view is re-read (nothing
        // written) every STARTUP_RESYNC for STARTUP_WINDOW, so a replica
        // that started first does not place by a ring of itself for a
        // whole refresh period.
        let started = tokio::time::Instant::now();
        let mut resync = tokio::time::interval(STARTUP_RESYNC.min(self.config.refresh_every));
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let young = started.elapsed() < STARTUP_WINDOW;
            tokio::select! {
                _ = tick.tick() => {}
                _ = resync.tick(), if young => {
                    if !self.leaving.load(Ordering::SeqCst) {
                        let _ = self.sync_view().await;
                    }
                    continue;
                }
            }
            if self.leaving.load(Ordering::SeqCst) {
                return;
            }
            if let Err(err) = self.refresh().await {
                tracing::warn!(%err, "membership refresh failed");
                self.clear_if_stale();
            }
        }
    }

    async fn timed<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, RefreshError> {
        match tokio::time::timeout(self.config.store_timeout, call).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(RefreshError::Timeout),
        }
    }

    /// Registers (unless leaving) and rebuilds the ring from live members.
    pub async fn refresh(&self) -> Result<(), RefreshError> {
        if !self.leaving.load(Ordering::SeqCst) {
            let me = Member {
                replica_id: self.config.replica_id.clone(),
                peer_endpoint: self.config.peer_endpoint.clone(),
            };
            self.timed(self.store.register_member(&me)).await?;
        }
        let members = self
            .timed(self.store.live_members(self.config.member_ttl))
            .await?;
        // Rows long dead are removed by whoever notices first.
        let _ = self
            .timed(self.store.sweep_members(self.config.member_ttl * 2))
            .await;
        self.install(members);
        Ok(())
    }

    fn install(&self, members: Vec<Member>) {
        let leaving = self.leaving.load(Ordering::SeqCst);
        let members: Vec<Member> = members
            .into_iter()
            .filter(|m| !(leaving && m.replica_id == self.config.replica_id))
            .collect();
        let ring = Ring::new(members.iter().map(|m| m.replica_id.as_str()));
        self.metrics.ring_members.set(ring.members().len() as i64);
        let mut view = self.view.write().unwrap();
        let was_member = view.endpoints.contains_key(&self.config.replica_id);
        view.endpoints = members
            .into_iter()
            .map(|m| (m.replica_id, m.peer_endpoint))
            .collect();
        view.ring = ring;
        view.refreshed = Instant::now();
        if !was_member && view.endpoints.contains_key(&self.config.replica_id) {
            self.joined.send_modify(|n| *n += 1);
        }
        drop(view);
        self.fenced.send_if_modified(|fenced| {
            let was = *fenced;
            if was {
                tracing::info!("membership refreshed again; no longer fenced");
            }
            *fenced = false;
            was
        });
    }

    /// Counts this replica's joins (see the field); a receiver that sees a
    /// non-zero value it has not marked seen was told of a join.
    pub fn joins(&self) -> watch::Receiver<u64> {
        self.joined.subscribe()
    }

    /// The live members as the store knows them now (bounded by the store
    /// timeout), this replica included when registered.
    pub async fn live_members_now(&self) -> Result<Vec<Member>, RefreshError> {
        self.timed(self.store.live_members(self.config.member_ttl))
            .await
    }

    /// Re-reads the live members now (bounded by the store timeout) and
    /// installs them as the view, so a decision taken right after (where a
    /// supervisor host goes) sees every member that registered since the
    /// last refresh, not a ring up to one refresh old. Registers nothing.
    pub async fn sync_view(&self) -> Result<(), RefreshError> {
        let members = self.live_members_now().await?;
        self.install(members);
        Ok(())
    }

    /// A ring that could not be refreshed within the TTL is not trusted:
    /// it is cleared and this replica fenced (see the module docs).
    fn clear_if_stale(&self) {
        let mut view = self.view.write().unwrap();
        if view.refreshed.elapsed() > self.config.member_ttl && !view.ring.is_empty() {
            tracing::warn!(
                "membership stale for longer than the TTL; clearing the ring and fencing this replica"
            );
            let ring = std::mem::take(&mut view.ring).without(&self.config.replica_id);
            let endpoints = std::mem::take(&mut view.endpoints);
            *self.before_fence.lock().unwrap() = (ring, endpoints);
            self.metrics.ring_members.set(0);
            drop(view);
            self.fenced.send_replace(true);
        }
    }

    /// True while fenced; changes when this replica is fenced or refreshes
    /// its membership again.
    pub fn fenced(&self) -> watch::Receiver<bool> {
        self.fenced.subscribe()
    }

    pub fn is_fenced(&self) -> bool {
        *self.fenced.borrow()
    }

    /// Where a session held here goes when this replica is fenced: the
    /// sandbox's owner on the last ring this replica had, without itself.
    pub fn placement_before_fence(&self, sandbox_id: &str) -> Option<(String, String)> {
        let before = self.before_fence.lock().unwrap();
        let owner = before.0.owner(sandbox_id)?.to_owned();
        let endpoint = before.1.get(&owner)?.clone();
        Some((owner, endpoint))
    }

    /// Whether this replica is the cluster's only live member. The ring
    /// alone cannot say so right after start (others may have joined since
    /// its last refresh), so a one-member ring is confirmed in the store;
    /// when the store cannot answer, the answer is no.
    pub async fn alone(&self) -> bool {
        if self.ring().members().len() > 1 {
            return false;
        }
        match self
            .timed(self.store.live_members(self.config.member_ttl))
            .await
        {
            Ok(members) => members.len() <= 1,
            Err(_) => false,
        }
    }

    pub fn replica_id(&self) -> &str {
        &self.config.replica_id
    }

    pub fn ring(&self) -> Ring {
        self.view.read().unwrap().ring.clone()
    }

    pub fn endpoint_of(&self, replica: &str) -> Option<String> {
        self.view.read().unwrap().endpoints.get(replica).cloned()
    }

    pub fn is_live(&self, replica: &str) -> bool {
        self.view.read().unwrap().endpoints.contains_key(replica)
    }

    /// The replica (and its endpoint) the ring places `sandbox_id` on, on the
    /// given ring.
    pub fn placement(&self, ring: &Ring, sandbox_id: &str) -> Option<(String, String)> {
        let owner = ring.owner(sandbox_id)?.to_owned();
        let endpoint = self.endpoint_of(&owner)?;
        Some((owner, endpoint))
    }

    /// Leaves the ring: stops refreshing, deletes this member, re-reads the
    /// others (bounded), and returns the ring without this replica.
    pub async fn leave(&self) -> Ring {
        self.leaving.store(true, Ordering::SeqCst);
        let _ = self
            .timed(self.store.remove_member(&self.config.replica_id))
            .await;
        if let Ok(members) = self
            .timed(self.store.live_members(self.config.member_ttl))
            .await
        {
            self.install(members);
        }
        self.ring().without(&self.config.replica_id)
    }

    /// One lazily connected channel per peer endpoint. An `https` endpoint
    /// is verified against `--peer-ca` (else the system roots), so a
    /// cluster on a private CA relays and notifies like a cleartext one.
    pub fn peer_channel(&self, endpoint: &str) -> Result<Channel, tonic::Status> {
        let mut peers = self.peers.lock().unwrap();
        if let Some(channel) = peers.get(endpoint) {
            return Ok(channel.clone());
        }
        let mut builder = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|_| tonic::Status::internal("invalid peer endpoint"))?
            .connect_timeout(Duration::from_secs(3))
            // A peer cut off (its link, not its process) is noticed within
            // PEER_KEEPALIVE twice, and the channel dials again.
            .http2_keep_alive_interval(PEER_KEEPALIVE)
            .keep_alive_timeout(PEER_KEEPALIVE)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true)
            .initial_stream_window_size(2 << 20)
            .initial_connection_window_size(16 << 20)
            .max_frame_size(PEER_H2_MAX_FRAME_SIZE);
        if endpoint.starts_with("https://") {
            let tls = match &self.config.peer_ca {
                Some(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
                None => ClientTlsConfig::new().with_native_roots(),
            };
            builder = builder
                .tls_config(tls.timeout(Duration::from_secs(3)))
                .map_err(|err| {
                    tracing::warn!(endpoint, %err, "peer TLS settings rejected");
                    tonic::Status::unavailable("peer TLS settings rejected")
                })?;
        }
        let channel = builder.connect_lazy();
        peers.insert(endpoint.to_owned(), channel.clone());
        Ok(channel)
    }

    /// Logs a peer call that failed on TLS (an untrusted or mismatched
    /// certificate) with what to check, and returns the cause. Other
    /// failures return `None`; they are routine while replicas come and go.
    pub fn peer_tls_failure(&self, endpoint: &str, status: &tonic::Status) -> Option<String> {
        let cause = tls_cause(status)?;
        tracing::warn!(
            endpoint,
            cause,
            "peer TLS handshake failed: the peer's certificate must be signed by a CA this \
             replica trusts (--peer-ca, else --supervisor-ca, else --tls-cert, else the system \
             roots) and name the \
             peer endpoint's host"
        );
        Some(cause)
    }
}

/// The TLS part of a failed call's error chain, if the failure was TLS.
fn tls_cause(status: &tonic::Status) -> Option<String> {
    let mut chain = vec![status.message().to_owned()];
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        chain.push(cause.to_string());
        source = cause.source();
    }
    chain.into_iter().find(|text| {
        let lower = text.to_ascii_lowercase();
        lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake")
    })
}

#[cfg(test)]
mod tests {
    use super::ClusterConfig;
    use crate::secret::Secret;

    #[test]
    fn debug_redacts_the_peer_token() {
        let config = ClusterConfig::new(
            "gw-0".into(),
            "http://127.0.0.1:1".into(),
            Secret::new("peer-secret-0b7e"),
        );
        let shown = format!("{config:?}");
        assert!(!shown.contains("peer-secret"), "{shown}");
        assert!(shown.contains("gw-0"), "{shown}");
    }
}
