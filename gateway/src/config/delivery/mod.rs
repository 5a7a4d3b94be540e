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
//!    carries no configuration. A mark is one flag ([`tokio::sync::Notify`]'s
//!    single stored permit): later marks merge into it.
//! 2. **Permit.** Each push session has one delivery task. On a mark it
//!    waits for a build permit from one FIFO pool ([`Permits`], tokio's fair
//!    semaphore, sized 2 x the store pool, at least 4). More marks do not
//!    wake a waiting task, so it keeps its place in line.
//! 3. **Build.** Holding the permit, the task reads the store (so the build
//!    sees every write that marked it) and builds the sandbox configuration;
//!    the provider environment is rebuilt only when the identity the
//!    configuration names changed, else the session's cached one is reused.
//! 4. **Slots.** [`Slots`] keeps at most one update in flight; a newer build
//!    waits in one pending slot (the newest wins); a build identical to what
//!    the supervisor has or will have is not sent.
//! 5. **Result.** The supervisor answers every update in order; the
//!    answer frees the slot and sends the pending build, if any.
//!
//! Repair: every session rebuilds on its own every 30 s (first pass at a
//! random point 30 to 60 s after it registered), which heals missed marks and
//! resends rejected updates. A failed build backs off 1, 2, 4, 8, 16, then
//! 30 s; a new mark or the session closing cuts the wait short.
//!
//! What closes a push session: no answer to the bootstrap within 2 minutes,
//! a result for an update that is not in flight, or an outbound queue that
//! stays full (a supervisor that stopped reading). The supervisor reconnects
//! and gets a fresh bootstrap.

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
        Arc::new(Self {
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
        })
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
        let update = match session.state.lock().unwrap().slots.offer(built) {
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
                    self.cm().notified("sandbox", outcome);
                    return;
                }
            }
        }
    }

    async fn broadcast(
        &self,
        label: &'static str,
        scope: peer_notify_config_update_request::Scope,
    ) {
        let cluster = self.cluster.as_ref().expect("cluster notifications");
        let peers: Vec<String> = cluster
            .ring()
            .members()
            .into_iter()
            .filter(|m| m != cluster.replica_id())
            .filter_map(|m| cluster.endpoint_of(&m))
            .collect();
        let sends = peers.iter().map(|endpoint| {
            let scope = scope.clone();
            async move {
                let outcome = match self.send_notify(cluster, endpoint, scope).await {
                    Ok(_) => "ok",
                    Err(outcome) => outcome,
                };
                self.cm().notified(label, outcome);
            }
        });
        futures::future::join_all(sends).await;
    }

    /// One PeerNotifyConfigUpdate; errors are metric outcomes.
    async fn send_notify(
        &self,
        cluster: &Cluster,
        endpoint: &str,
        scope: peer_notify_config_update_request::Scope,
    ) -> Result<PeerNotifyConfigUpdateResponse, &'static str> {
        let channel = cluster.peer_channel(endpoint).map_err(|_| "error")?;
        let mut client = PeerClient::new(channel);
        let mut request = tonic::Request::new(PeerNotifyConfigUpdateRequest {
            scope: Some(scope),
            sandbox_config: true,
            provider_environment: true,
        });
        request.set_timeout(PEER_NOTIFY_TIMEOUT);
        let bearer: MetadataValue<_> = format!("Bearer {}", cluster.config.peer_token.expose())
            .parse()
            .map_err(|_| "error")?;
        request.metadata_mut().insert("authorization", bearer);
        let replica: MetadataValue<_> = cluster.replica_id().parse().map_err(|_| "error")?;
        request.metadata_mut().insert(PEER_REPLICA_HEADER, replica);
        match tokio::time::timeout(
            PEER_NOTIFY_TIMEOUT,
            client.peer_notify_config_update(request),
        )
        .await
        {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                Err("unsupported_peer")
            }
            Ok(Err(status)) => {
                tracing::debug!(%status, "config notification failed");
                Err("error")
            }
            Err(_) => Err("error"),
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
mod tests {
    use super::permits::*;
    use super::session::*;
    use super::*;
    use prometheus_client::registry::Registry;

    fn built(revision: u64) -> Built {
        Built::new(
            GetSandboxConfigResponse {
                config_revision: revision,
                ..Default::default()
            },
            GetSandboxProviderEnvironmentResponse::default(),
        )
    }

    fn sent(offer: Offer) -> ConfigUpdate {
        match offer {
            Offer::Send(update) => *update,
            other => panic!("expected a send, got {other:?}"),
        }
    }

    fn revision(update: &ConfigUpdate) -> u64 {
        update.sandbox_config.as_ref().unwrap().config_revision
    }

    #[test]
    fn one_in_flight_and_the_newest_pending_wins() {
        let mut slots = Slots::default();
        let first = sent(slots.offer(built(1)));
        assert_eq!(first.update_id, 1);
        assert!(matches!(slots.offer(built(2)), Offer::Pending));
        assert!(matches!(slots.offer(built(3)), Offer::Pending));
        // 3 replaced 2: answering 1 sends 3 as update 2.
        let next = slots
            .answer(1, ConfigApplyOutcome::Applied)
            .unwrap()
            .unwrap();
        assert_eq!((next.update_id, revision(&next)), (2, 3));
        assert!(!slots.has_pending());
        assert_eq!(
            slots
                .answer(2, ConfigApplyOutcome::Applied)
                .unwrap()
                .map(|u| u.update_id),
            None
        );
        assert_eq!(slots.in_flight_id(), None);
    }

    #[test]
    fn identical_updates_are_not_sent() {
        let mut slots = Slots::default();
        sent(slots.offer(built(1)));
        // Identical to the one in flight.
        assert!(matches!(slots.offer(built(1)), Offer::Unchanged));
        slots.answer(1, ConfigApplyOutcome::Applied).unwrap();
        // Identical to the applied one.
        assert!(matches!(slots.offer(built(1)), Offer::Unchanged));
        // A change goes out with the next id.
        assert_eq!(sent(slots.offer(built(2))).update_id, 2);
        // A pending build equal to what was just applied is dropped.
        assert!(matches!(slots.offer(built(3)), Offer::Pending));
        assert!(matches!(slots.offer(built(2)), Offer::Pending));
        assert!(
            slots
                .answer(2, ConfigApplyOutcome::IgnoredDuplicate)
                .unwrap()
                .is_none()
        );
        assert!(matches!(slots.offer(built(2)), Offer::Unchanged));
    }

    #[test]
    fn rejected_updates_are_sent_again_by_the_next_build() {
        let mut slots = Slots::default();
        sent(slots.offer(built(1)));
        slots.answer(1, ConfigApplyOutcome::Applied).unwrap();
        sent(slots.offer(built(2)));
        assert!(
            slots
                .answer(2, ConfigApplyOutcome::Rejected)
                .unwrap()
                .is_none()
        );
        // Reconcile rebuilds the same content: it goes out again.
        let resent = sent(slots.offer(built(2)));
        assert_eq!((resent.update_id, revision(&resent)), (3, 2));
        // Back to the applied content is unchanged once answered.
        slots.answer(3, ConfigApplyOutcome::Rejected).unwrap();
        assert!(matches!(slots.offer(built(1)), Offer::Unchanged));
    }

    #[test]
    fn answers_must_match_the_update_in_flight() {
        let mut slots = Slots::default();
        assert_eq!(
            slots.answer(1, ConfigApplyOutcome::Applied).unwrap_err(),
            ResultError::UnknownUpdate
        );
        sent(slots.offer(built(1)));
        assert_eq!(
            slots.answer(2, ConfigApplyOutcome::Applied).unwrap_err(),
            ResultError::UnknownUpdate
        );
        assert_eq!(
            slots.answer(0, ConfigApplyOutcome::Applied).unwrap_err(),
            ResultError::UnknownUpdate
        );
        slots.answer(1, ConfigApplyOutcome::Applied).unwrap();
        // Answered once: a second answer is unknown.
        assert_eq!(
            slots.answer(1, ConfigApplyOutcome::Applied).unwrap_err(),
            ResultError::UnknownUpdate
        );
    }

    #[test]
    fn build_backoff_steps_and_resets() {
        let mut backoff = BuildBackoff::default();
        let delays: Vec<u64> = (0..8).map(|_| backoff.next_delay().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_secs(1));
    }

    #[test]
    fn permit_pool_is_sized_from_the_store_pool() {
        assert_eq!(Permits::sized_for_pool(10).size(), 20);
        assert_eq!(Permits::sized_for_pool(5).size(), 10);
        assert_eq!(Permits::sized_for_pool(1).size(), 4);
        assert_eq!(Permits::sized_for_pool(0).size(), 4);
    }

    #[tokio::test]
    async fn permits_are_granted_in_fifo_order() {
        let mut registry = Registry::default();
        let metrics = Arc::new(ConfigMetrics::register(&mut registry));
        let permits = Arc::new(Permits::new(1));
        let held = permits.acquire(&metrics).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (permits, task_metrics, order) = (permits.clone(), metrics.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = permits.acquire(&task_metrics).await;
                order.lock().unwrap().push(i);
                tokio::task::yield_now().await;
            }));
            // Each waiter is queued before the next one asks.
            while metrics.builds_waiting.get() != i + 1 {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(metrics.builds_waiting.get(), 5);
        drop(held);
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
        assert_eq!(metrics.builds_waiting.get(), 0);
    }

    #[tokio::test]
    async fn marks_merge_into_one() {
        let notify = Notify::new();
        for _ in 0..5 {
            notify.notify_one();
        }
        // One stored permit: the first wait returns, the second does not.
        notify.notified().await;
        let second = tokio::time::timeout(Duration::from_millis(50), notify.notified()).await;
        assert!(second.is_err());
    }
}
