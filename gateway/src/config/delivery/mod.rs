//! Push config delivery (seed 002; PROTOCOL.md sections 3 and 6).
//!
//! With `--config-delivery-mode push`, a supervisor whose hello says
//! `supports_config_push` gets a push session: its `SessionAccepted`
//! carries the bootstrap update (id 1), and from then on the gateway pushes
//! every change as a full snapshot. In poll mode (the default) nothing here
//! runs for sessions: supervisors poll `GetSandboxConfig`.
//!
//! How a change travels:
//!
//! 1. **Mark.** A committed write answers a [`Scope`]; [`ConfigDelivery::publish`]
//!    marks every affected push session on this replica dirty and, in a
//!    cluster, notifies the owner replica (sandbox scope) or every peer
//!    (provider and global scopes) with `PeerNotifyConfigUpdate`, which
//!    carries no configuration. Peers are the live members the store lists
//!    at notify time, read after the write committed: a replica registers
//!    before it accepts sessions, so one missing from that list holds only
//!    sessions whose bootstrap reads the write. The ring (refreshed every
//!    10 s) is only the fallback when the store cannot answer. A broadcast
//!    whose peer channel answered `UNAVAILABLE` is sent twice more (100 and
//!    200 ms later); one that timed out is not. A mark is one flag ([`tokio::sync::Notify`]'s
//!    single stored permit): later marks merge into it.
//! 2. **Permit.** Each push session has one delivery task. On a mark it
//!    waits for a build permit from one FIFO pool ([`Permits`], tokio's fair
//!    semaphore, sized 2 x the store pool, at least 4). More marks do not
//!    wake a waiting task, so it keeps its place in line.
//! 3. **Build.** Holding the permit, the task reads the store (so the build
//!    sees every write that marked it) and builds the sandbox configuration;
//!    the provider environment is rebuilt only when the identity the
//!    configuration names changed, else the session's cached one is reused.
//! 4. **Slots.** [`Slots`](session::Slots) keeps at most one update in flight; a newer build
//!    waits in one pending slot (the newest wins); a build identical to what
//!    the supervisor has or will have is not sent.
//! 5. **Result.** The supervisor answers every update in order; the
//!    answer frees the slot and sends the pending build, if any.
//!
//! Joining: the fallback can miss a replica that joined since the writer's
//! last ring refresh. So a replica that becomes a member (its first
//! membership refresh, or the first after its view was cleared) marks all
//! its push sessions once, one refresh period plus a store timeout later,
//! when every other replica's ring has it (marks source `join`).
//!
//! Repair: every session rebuilds on its own every 30 s (first pass at a
//! random point 30 to 60 s after it registered), which heals missed marks and
//! resends rejected updates. A failed build backs off 1, 2, 4, 8, 16, then
//! 30 s; a new mark or the session closing cuts the wait short.
//!
//! What closes a push session: no answer to the bootstrap within 2 minutes,
//! a result for an update that is not in flight, or a session stream that
//! stops draining (messages queued and the stream not polled for the drain
//! timeout, 30 s by default; see `sessions`). Updates have a queue of their
//! own in the session's stream, so relay opens never crowd them out. The
//! supervisor reconnects and gets a fresh bootstrap. A session that ends with
//! changes it never delivered (a build under way, a pending or unanswered
//! update) hands them over: a newer session here is marked, or the owner the
//! store names now is notified, so a supervisor that moved does not wait for
//! its reconcile.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::FutureExt;
use openshell_proto::peer::peer_client::PeerClient;
use openshell_proto::peer::{
    PeerConfigProviderTarget, PeerConfigSandboxTarget, PeerNotifyConfigUpdateRequest,
    PeerNotifyConfigUpdateResponse, peer_notify_config_update_request,
};
use openshell_proto::sandbox::GetSandboxConfigResponse;
use openshell_proto::{
    ConfigApplyOutcome, ConfigUpdate, ConfigUpdateResult, GatewayMessage,
    GetSandboxProviderEnvironmentResponse, gateway_message,
};
use tokio::sync::{Notify, Semaphore, SemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::metadata::MetadataValue;

use crate::cluster::Cluster;
use crate::config::model::{BuildError, ConfigModel, EnvIdentity, Scope, fingerprint};
use crate::metrics::config::*;
use crate::sessions::routing::{OWNER_TTL, PEER_REPLICA_HEADER};
use crate::sessions::{ConfigSink, Sessions};
use crate::store::OwnerRecord;

/// Deadline of the bootstrap build (permit wait included).
pub const BOOTSTRAP_BUILD_TIMEOUT: Duration = Duration::from_secs(45);
/// How long the supervisor has to answer the bootstrap.
pub const BOOTSTRAP_ANSWER_TIMEOUT: Duration = Duration::from_secs(120);
pub const PEER_NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(30);
/// Peer notifications running at once.
const PEER_NOTIFY_CONCURRENCY: usize = 8;
/// Owner lookups for peer notifications are cached this long by default.
pub const OWNER_CACHE_TTL: Duration = Duration::from_secs(3);
/// Error text in results is cut to this many characters.
const MAX_RESULT_ERROR: usize = 256;

/// Whether sessions get pushed configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeliveryMode {
    Poll,
    Push,
}

type Fingerprint = [u8; 32];
type SessionTx = mpsc::Sender<Result<GatewayMessage, Status>>;

mod permits;
mod session;

pub use permits::{BuildBackoff, Permits};
pub use session::{Offer, PushSession};
use session::{SessionState, Trigger};

// ---------------------------------------------------------------- delivery

/// The replica's config delivery: push sessions, marks, permits and peer
/// notifications.
pub struct ConfigDelivery {
    pub mode: DeliveryMode,
    pub model: ConfigModel,
    sessions: Arc<Sessions>,
    cluster: Option<Arc<Cluster>>,
    metrics: Arc<crate::metrics::Metrics>,
    pub permits: Permits,
    reconcile_interval: Duration,
    build_delay: Duration,
    /// Push sessions by sandbox. Usually one; a supervisor reconnecting may
    /// briefly have two (the older ends when the newer supersedes it), and
    /// marks go to both.
    push: Mutex<HashMap<String, Vec<Arc<PushSession>>>>,
    notifier: Notifier,
}

struct Notifier {
    pending: Mutex<HashSet<Scope>>,
    running: Semaphore,
    owners: Mutex<HashMap<String, (OwnerRecord, Instant)>>,
    owner_ttl: Duration,
}

pub struct DeliveryConfig {
    pub mode: DeliveryMode,
    pub reconcile_interval: Duration,
    pub owner_cache_ttl: Duration,
    pub pool_size: u32,
    /// Test and benchmark knob (hidden `--config-build-delay-ms`): every
    /// push build holds its permit this much longer before it reads the
    /// store, as a slow store would. Zero in production.
    pub build_delay: Duration,
}

impl ConfigDelivery {
    pub fn new(
        config: DeliveryConfig,
        model: ConfigModel,
        sessions: Arc<Sessions>,
        cluster: Option<Arc<Cluster>>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Arc<Self> {
        let delivery = Arc::new(Self {
            mode: config.mode,
            model,
            sessions,
            cluster,
            metrics,
            permits: Permits::sized_for_pool(config.pool_size),
            reconcile_interval: config.reconcile_interval.max(Duration::from_millis(100)),
            build_delay: config.build_delay,
            push: Mutex::new(HashMap::new()),
            notifier: Notifier {
                pending: Mutex::new(HashSet::new()),
                running: Semaphore::new(PEER_NOTIFY_CONCURRENCY),
                owners: Mutex::new(HashMap::new()),
                owner_ttl: config.owner_cache_ttl,
            },
        });
        if let Some(cluster) = delivery.cluster.clone()
            && delivery.mode == DeliveryMode::Push
        {
            let settle = cluster.config.refresh_every + cluster.config.store_timeout;
            tokio::spawn(Self::catch_up_on_joins(
                Arc::downgrade(&delivery),
                cluster.joins(),
                settle,
            ));
        }
        delivery
    }

    fn cm(&self) -> &ConfigMetrics {
        &self.metrics.config
    }

    /// Whether a session with this hello gets pushed configuration.
    pub fn push_for(&self, supports_config_push: bool) -> bool {
        self.mode == DeliveryMode::Push && supports_config_push
    }

    /// Registers a push session and builds its bootstrap (update 1).
    /// Marks that arrive during the build are kept and rebuilt after.
    pub async fn bootstrap(
        self: &Arc<Self>,
        sandbox_id: &str,
        session_id: &str,
    ) -> Result<(ConfigUpdate, Arc<PushSession>), Status> {
        let session = Arc::new(PushSession {
            sandbox_id: sandbox_id.to_owned(),
            session_id: session_id.to_owned(),
            dirty: Notify::new(),
            stop: CancellationToken::new(),
            tx: OnceLock::new(),
            state: Mutex::new(SessionState::default()),
            delivery: self.clone(),
            counted: std::sync::atomic::AtomicBool::new(false),
        });
        // Registered before the bootstrap build: marks that arrive during it
        // are kept and rebuilt after.
        self.push
            .lock()
            .unwrap()
            .entry(sandbox_id.to_owned())
            .or_default()
            .push(session.clone());
        if !session
            .counted
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            self.cm().push_sessions.inc();
        }
        let built = tokio::time::timeout(BOOTSTRAP_BUILD_TIMEOUT, async {
            let _permit = self.permits.acquire(self.cm()).await;
            session.build(Trigger::Bootstrap).await
        })
        .await;
        let built = match built {
            Ok(Ok(built)) => built,
            Ok(Err(BuildError::NotFound)) => {
                self.unregister(&session);
                return Err(Status::not_found("sandbox not found"));
            }
            Ok(Err(err)) => {
                tracing::warn!(sandbox_id, error = %err, "config bootstrap build failed");
                self.unregister(&session);
                return Err(Status::unavailable(
                    "configuration bootstrap failed; reconnect later",
                ));
            }
            Err(_) => {
                self.unregister(&session);
                return Err(Status::unavailable(
                    "configuration bootstrap timed out; reconnect later",
                ));
            }
        };
        let update = match session.state.lock().unwrap().slots.offer(built, true) {
            Offer::Send(update) => *update,
            _ => unreachable!("a fresh session has nothing in flight"),
        };
        Ok((update, session))
    }

    /// Starts the delivery task of a session whose `SessionAccepted` (with
    /// the bootstrap) is queued.
    pub fn start(self: &Arc<Self>, session: &Arc<PushSession>) {
        tokio::spawn(session.clone().run());
    }

    fn unregister(&self, session: &PushSession) {
        session.stop.cancel();
        {
            let mut push = self.push.lock().unwrap();
            if let Some(sessions) = push.get_mut(&session.sandbox_id) {
                sessions.retain(|s| s.session_id != session.session_id);
                if sessions.is_empty() {
                    push.remove(&session.sandbox_id);
                }
            }
        }
        if session
            .counted
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            self.cm().push_sessions.dec();
        }
    }

    fn mark_local(&self, sandbox_id: &str, source: &'static str) -> bool {
        let sessions = self
            .push
            .lock()
            .unwrap()
            .get(sandbox_id)
            .cloned()
            .unwrap_or_default();
        for session in &sessions {
            session.mark();
            self.cm().mark(source);
        }
        !sessions.is_empty()
    }

    fn mark_all(&self, source: &'static str) {
        let sessions: Vec<_> = self
            .push
            .lock()
            .unwrap()
            .values()
            .flatten()
            .cloned()
            .collect();
        for session in sessions {
            session.mark();
            self.cm().mark(source);
        }
    }

    async fn mark_provider(&self, provider: &str, source: &'static str) {
        if self.push.lock().unwrap().is_empty() {
            return;
        }
        match self.model.sandboxes_attaching(provider).await {
            Ok(ids) => {
                for id in ids {
                    self.mark_local(&id, source);
                }
            }
            Err(err) => {
                // Reconcile repairs what this misses.
                tracing::warn!(%err, "could not resolve a provider change; marking every session");
                self.mark_all(source);
            }
        }
    }

    /// A push session ended with changes it never delivered: mark the
    /// sandbox's newer session here (it registered before its bootstrap
    /// build, which may have read the store before those changes), or, in a
    /// cluster, notify the replica the store now names as the owner, looked
    /// up afresh. Runs in the background.
    pub(super) fn hand_over(self: &Arc<Self>, sandbox_id: &str, ended_session: &str) {
        let newer: Vec<_> = self
            .push
            .lock()
            .unwrap()
            .get(sandbox_id)
            .map(|sessions| {
                sessions
                    .iter()
                    .filter(|s| s.session_id != ended_session)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if !newer.is_empty() {
            self.cm().handovers.inc();
            for session in newer {
                session.mark();
                self.cm().mark("local");
            }
            return;
        }
        // A replica alone has nobody to hand over to: the supervisor's next
        // session bootstraps from the store.
        if self.cluster.is_some() {
            self.cm().handovers.inc();
            self.notifier.owners.lock().unwrap().remove(sandbox_id);
            self.notify_peers(Scope::Sandbox(sandbox_id.to_owned()));
        }
    }

    /// A write committed: mark the sessions it affects here and tell the
    /// replicas holding the others. Runs in the background.
    pub fn publish(self: &Arc<Self>, scope: Scope) {
        let label = match &scope {
            Scope::Sandbox(_) => "sandbox",
            Scope::Provider(_) => "provider",
            Scope::All => "all",
        };
        self.cm()
            .publications
            .get_or_create(&ScopeLabels { scope: label })
            .inc();
        let this = self.clone();
        tokio::spawn(async move {
            match &scope {
                Scope::Sandbox(id) => {
                    if this.sessions.has_session(id) {
                        this.mark_local(id, "local");
                        return;
                    }
                }
                Scope::Provider(name) => this.mark_provider(name, "local").await,
                Scope::All => this.mark_all("local"),
            }
            if this.cluster.is_some() {
                this.notify_peers(scope);
            }
        });
    }

    /// A peer's notification: mark, answer stale_owner when the targeted
    /// sandbox's session is not here.
    pub fn on_peer_notify(self: &Arc<Self>, request: PeerNotifyConfigUpdateRequest) -> bool {
        use peer_notify_config_update_request::Scope as S;
        match request.scope {
            Some(S::Sandbox(target)) => {
                if !self.sessions.has_session(&target.sandbox_id) {
                    return true;
                }
                self.mark_local(&target.sandbox_id, "peer");
                false
            }
            Some(S::Provider(target)) => {
                let this = self.clone();
                tokio::spawn(async move { this.mark_provider(&target.name, "peer").await });
                false
            }
            Some(S::AllConnected(_)) | Some(S::Workspace(_)) => {
                self.mark_all("peer");
                false
            }
            None => false,
        }
    }

    // ------------------------------------------------------------ peers

    /// Queues a notification; one pending per scope (later writes merge
    /// into it), at most 8 running.
    fn notify_peers(self: &Arc<Self>, scope: Scope) {
        if !self.notifier.pending.lock().unwrap().insert(scope.clone()) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let _running = this.notifier.running.acquire().await;
            // Writes committed after this point queue a new notification.
            this.notifier.pending.lock().unwrap().remove(&scope);
            match scope {
                Scope::Sandbox(id) => this.notify_owner(&id).await,
                Scope::Provider(name) => {
                    this.broadcast(
                        "provider",
                        peer_notify_config_update_request::Scope::Provider(
                            PeerConfigProviderTarget {
                                workspace: "default".into(),
                                name,
                            },
                        ),
                    )
                    .await
                }
                Scope::All => {
                    this.broadcast(
                        "all",
                        peer_notify_config_update_request::Scope::AllConnected(true),
                    )
                    .await
                }
            }
        });
    }

    async fn owner(&self, sandbox_id: &str, fresh: bool) -> Option<OwnerRecord> {
        if !fresh
            && let Some((record, at)) = self.notifier.owners.lock().unwrap().get(sandbox_id)
            && at.elapsed() < self.notifier.owner_ttl
        {
            return Some(record.clone());
        }
        let record = match self.model.store.owner(sandbox_id, OWNER_TTL).await {
            Ok(record) => record,
            Err(err) => {
                tracing::warn!(%err, "owner lookup for a config notification failed");
                return None;
            }
        };
        let mut owners = self.notifier.owners.lock().unwrap();
        owners.retain(|_, (_, at)| at.elapsed() < self.notifier.owner_ttl);
        match &record {
            Some(record) => {
                owners.insert(sandbox_id.to_owned(), (record.clone(), Instant::now()));
            }
            None => {
                owners.remove(sandbox_id);
            }
        }
        record
    }

    /// Tells the replica holding the sandbox's session; a stale owner says
    /// so and the next owner is asked (at most three times).
    async fn notify_owner(&self, sandbox_id: &str) {
        let cluster = self.cluster.as_ref().expect("cluster notifications");
        for attempt in 0..3u32 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
            }
            let Some(owner) = self.owner(sandbox_id, attempt > 0).await else {
                // No session anywhere: the next one bootstraps from the store.
                return;
            };
            if owner.replica_id == cluster.replica_id() {
                self.mark_local(sandbox_id, "local");
                return;
            }
            let scope =
                peer_notify_config_update_request::Scope::Sandbox(PeerConfigSandboxTarget {
                    sandbox_id: sandbox_id.to_owned(),
                    session_id: owner.session_id.clone(),
                });
            match self.send_notify(cluster, &owner.peer_endpoint, scope).await {
                Ok(response) if response.stale_owner => {
                    self.cm().notified("sandbox", "stale_owner");
                    tracing::info!(
                        sandbox_id,
                        stale = owner.replica_id,
                        "config notification reached a stale owner; asking the new one"
                    );
                    self.notifier.owners.lock().unwrap().remove(sandbox_id);
                }
                Ok(_) => {
                    self.cm().notified("sandbox", "ok");
                    return;
                }
                Err(outcome) => {
                    // The owner may have just gone (a restart moves its
                    // sessions): ask the store again.
                    self.cm().notified("sandbox", outcome);
                    self.notifier.owners.lock().unwrap().remove(sandbox_id);
                }
            }
        }
    }

    /// Every other member, with its endpoint when known: the store's live
    /// members at this moment (the ring may be a refresh old and miss a
    /// replica that just joined), or the ring when the store cannot answer.
    async fn peers_now(&self, cluster: &Cluster) -> Vec<(String, Option<String>)> {
        let me = cluster.replica_id();
        match cluster.live_members_now().await {
            Ok(members) => {
                self.cm().notify_members("store");
                members
                    .into_iter()
                    .filter(|m| m.replica_id != me)
                    .map(|m| (m.replica_id, Some(m.peer_endpoint)))
                    .collect()
            }
            Err(err) => {
                // A replica that joined since the last ring refresh is
                // missed here; it catches up when it sees itself join.
                tracing::warn!(%err, "member lookup for a config notification failed; using the ring");
                self.cm().notify_members("ring");
                cluster
                    .ring()
                    .members()
                    .into_iter()
                    .filter(|m| m != me)
                    .map(|m| {
                        let endpoint = cluster.endpoint_of(&m);
                        (m, endpoint)
                    })
                    .collect()
            }
        }
    }

    async fn broadcast(
        &self,
        label: &'static str,
        scope: peer_notify_config_update_request::Scope,
    ) {
        let cluster = self.cluster.as_ref().expect("cluster notifications");
        let peers = self.peers_now(cluster).await;
        let sends = peers.iter().map(|(replica, endpoint)| {
            let scope = scope.clone();
            async move {
                let outcome = match endpoint {
                    Some(endpoint) => self.send_notify_retrying(cluster, endpoint, scope).await,
                    None => "skipped",
                };
                if outcome != "ok" {
                    tracing::info!(
                        peer = replica.as_str(),
                        scope = label,
                        outcome,
                        "config notification not delivered; the peer's reconcile repairs it"
                    );
                }
                self.cm().notified(label, outcome);
            }
        });
        futures::future::join_all(sends).await;
    }

    /// Catch-up after this replica (re)joins the cluster. Until every other
    /// replica has refreshed its view once, a writer whose store lookup
    /// failed notifies from a ring without this replica; one refresh period
    /// plus a store timeout after the join, every push session here is
    /// marked once, so its build reads every write that may have skipped it.
    /// Holds the delivery weakly: the task ends with it (or with the
    /// cluster's join signal).
    async fn catch_up_on_joins(
        delivery: std::sync::Weak<Self>,
        mut joins: tokio::sync::watch::Receiver<u64>,
        settle: Duration,
    ) {
        // The join of the first refresh happened before this task started.
        let mut joined = *joins.borrow_and_update() > 0;
        loop {
            if joined {
                tokio::time::sleep(settle).await;
                let Some(delivery) = delivery.upgrade() else {
                    return;
                };
                tracing::debug!("membership settled after a join; marking push sessions");
                delivery.mark_all("join");
            }
            if joins.changed().await.is_err() || delivery.strong_count() == 0 {
                return;
            }
            joined = true;
        }
    }

    /// A broadcast notification, sent up to three times when the peer's
    /// channel could not carry it (`UNAVAILABLE`: a connection that broke
    /// because the peer restarted fails its first call, and the next attempt
    /// reconnects). A notification carries no configuration and only marks
    /// sessions, so a repeat is harmless. A peer that does not answer within
    /// the timeout is not asked again: its reconcile repairs it. Without the
    /// retry, one broken connection left the peer's sessions waiting for
    /// their reconcile (30 to 60 s).
    async fn send_notify_retrying(
        &self,
        cluster: &Cluster,
        endpoint: &str,
        scope: peer_notify_config_update_request::Scope,
    ) -> &'static str {
        let mut outcome = "error";
        // Every attempt together within one timeout: a connection that a
        // hung peer's missed keepalive broke is not a reason to wait again.
        let deadline = tokio::time::Instant::now() + PEER_NOTIFY_TIMEOUT;
        for attempt in 0..3u64 {
            if attempt > 0 {
                let pause = Duration::from_millis(100 * attempt);
                if tokio::time::Instant::now() + pause >= deadline {
                    break;
                }
                tokio::time::sleep(pause).await;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let retry;
            (outcome, retry) = match self
                .send_notify_once(cluster, endpoint, scope.clone(), left)
                .await
            {
                Ok(_) => return "ok",
                Err(failed) => failed,
            };
            if !retry {
                break;
            }
        }
        outcome
    }

    /// One PeerNotifyConfigUpdate; errors are metric outcomes.
    async fn send_notify(
        &self,
        cluster: &Cluster,
        endpoint: &str,
        scope: peer_notify_config_update_request::Scope,
    ) -> Result<PeerNotifyConfigUpdateResponse, &'static str> {
        self.send_notify_once(cluster, endpoint, scope, PEER_NOTIFY_TIMEOUT)
            .await
            .map_err(|(outcome, _)| outcome)
    }

    /// One PeerNotifyConfigUpdate within `timeout`; an error is its metric
    /// outcome and whether the channel failed to carry the call (worth one
    /// more try).
    async fn send_notify_once(
        &self,
        cluster: &Cluster,
        endpoint: &str,
        scope: peer_notify_config_update_request::Scope,
        timeout: Duration,
    ) -> Result<PeerNotifyConfigUpdateResponse, (&'static str, bool)> {
        let channel = cluster
            .peer_channel(endpoint)
            .map_err(|_| ("error", false))?;
        let mut client = PeerClient::new(channel);
        let mut request = tonic::Request::new(PeerNotifyConfigUpdateRequest {
            scope: Some(scope),
            sandbox_config: true,
            provider_environment: true,
        });
        request.set_timeout(timeout);
        let bearer: MetadataValue<_> = format!("Bearer {}", cluster.config.peer_token.expose())
            .parse()
            .map_err(|_| ("error", false))?;
        request.metadata_mut().insert("authorization", bearer);
        let replica: MetadataValue<_> =
            cluster.replica_id().parse().map_err(|_| ("error", false))?;
        request.metadata_mut().insert(PEER_REPLICA_HEADER, replica);
        match tokio::time::timeout(timeout, client.peer_notify_config_update(request)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                Err(("unsupported_peer", false))
            }
            Ok(Err(status)) => {
                let tls = cluster.peer_tls_failure(endpoint, &status).is_some();
                if !tls {
                    tracing::debug!(%status, "config notification failed");
                }
                Err(("error", !tls && status.code() == tonic::Code::Unavailable))
            }
            Err(_) => Err(("error", false)),
        }
    }

    /// A build for a polling request (GetSandboxConfig and
    /// GetSandboxProviderEnvironment), counted with trigger `request`.
    pub async fn build_for_request(
        &self,
        sandbox_id: &str,
        environment: bool,
    ) -> Result<crate::config::model::Loaded, Status> {
        let started = Instant::now();
        let loaded = self.model.load(sandbox_id, |_| environment).await;
        match &loaded {
            Ok(loaded) => {
                self.cm()
                    .build("sandbox_config", "request", true, loaded.config_time);
                if environment {
                    self.cm()
                        .build("provider_environment", "request", true, loaded.env_time);
                }
            }
            Err(_) => self
                .cm()
                .build("sandbox_config", "request", false, started.elapsed()),
        }
        loaded.map_err(BuildError::status)
    }
}

#[cfg(test)]
mod tests;
