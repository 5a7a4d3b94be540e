//! Cluster membership and the placement ring.
//!
//! Each replica registers `{replica id, peer endpoint}` in the shared store
//! and refreshes it every 10 s; a member is live while its row was refreshed
//! within the 30 s TTL by the database's clock. Every store call of the
//! membership worker has a timeout, so a hung database cannot keep a stale
//! ring: if the ring could not be refreshed for longer than the TTL it is
//! cleared, and an empty ring means "serve everything locally".
//!
//! Folder: this module (membership) and `ring` (consistent-hash placement).
//! May import `metrics`, `secret` and `store` only.

pub mod ring;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

use crate::cluster::ring::Ring;
use crate::metrics::Metrics;
use crate::secret::Secret;
use crate::store::{Member, Store, StoreError};

#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub replica_id: String,
    /// URL other replicas and redirected supervisors use to reach this one.
    pub peer_endpoint: String,
    /// Shared secret replicas present to each other's peer service.
    pub peer_token: Secret,
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
        loop {
            tick.tick().await;
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
        view.endpoints = members
            .into_iter()
            .map(|m| (m.replica_id, m.peer_endpoint))
            .collect();
        view.ring = ring;
        view.refreshed = Instant::now();
    }

    /// A ring that could not be refreshed within the TTL is not trusted.
    fn clear_if_stale(&self) {
        let mut view = self.view.write().unwrap();
        if view.refreshed.elapsed() > self.config.member_ttl && !view.ring.is_empty() {
            tracing::warn!("membership stale for longer than the TTL; clearing the ring");
            view.ring = Ring::default();
            view.endpoints.clear();
            self.metrics.ring_members.set(0);
        }
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

    /// One lazily connected channel per peer endpoint.
    pub fn peer_channel(&self, endpoint: &str) -> Result<Channel, tonic::Status> {
        let mut peers = self.peers.lock().unwrap();
        if let Some(channel) = peers.get(endpoint) {
            return Ok(channel.clone());
        }
        let channel = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|_| tonic::Status::internal("invalid peer endpoint"))?
            .connect_timeout(Duration::from_secs(3))
            .tcp_nodelay(true)
            .initial_stream_window_size(2 << 20)
            .initial_connection_window_size(16 << 20)
            .connect_lazy();
        peers.insert(endpoint.to_owned(), channel.clone());
        Ok(channel)
    }
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
