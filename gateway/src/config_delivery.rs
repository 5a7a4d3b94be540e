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
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::{Notify, Semaphore, SemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::metadata::MetadataValue;

use crate::cluster::Cluster;
use crate::config_model::{BuildError, ConfigModel, EnvIdentity, Scope, fingerprint};
use crate::relay_routing::{OWNER_TTL, PEER_REPLICA_HEADER};
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

// ---------------------------------------------------------------- metrics

const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0,
];

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// sandbox_config or provider_environment.
    pub part: &'static str,
    /// request (a poll RPC), bootstrap, mark, reconcile or retry.
    pub trigger: &'static str,
    /// ok or error.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// initial (the bootstrap) or update.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// applied, ignored_duplicate, rejected or unspecified.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NotifyLabels {
    /// sandbox, provider or all.
    pub scope: &'static str,
    /// ok, stale_owner, unsupported_peer or error.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLabels {
    /// sandbox, provider or all.
    pub scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    /// local (a write on this replica), peer (a notification) or reconcile.
    pub source: &'static str,
}

/// Config delivery metrics (registered by `Metrics::new`).
pub struct ConfigMetrics {
    pub push_sessions: Gauge,
    pub builds_waiting: Gauge,
    pub build_duration: Family<BuildLabels, Histogram, fn() -> Histogram>,
    pub build_wait: Histogram,
    pub updates_sent: Family<KindLabels, Counter>,
    pub unchanged: Counter,
    pub results: Family<OutcomeLabels, Counter>,
    /// Results the gateway refused (reason unknown_update, invalid_outcome).
    pub results_rejected: Family<ReasonLabels, Counter>,
    /// Push sessions closed by delivery (bootstrap_timeout, unknown_update,
    /// not_draining).
    pub sessions_closed: Family<ReasonLabels, Counter>,
    pub peer_notifies: Family<NotifyLabels, Counter>,
    pub marks: Family<SourceLabels, Counter>,
    /// Committed configuration writes on this replica (publications), by
    /// the scope they mark. With the build counts of
    /// `build_duration` this gives the writes-to-builds ratio of a burst.
    pub publications: Family<ScopeLabels, Counter>,
}

impl ConfigMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            push_sessions: Gauge::default(),
            builds_waiting: Gauge::default(),
            build_duration: Family::new_with_constructor(histogram as fn() -> Histogram),
            build_wait: histogram(),
            updates_sent: Family::default(),
            unchanged: Counter::default(),
            results: Family::default(),
            results_rejected: Family::default(),
            sessions_closed: Family::default(),
            peer_notifies: Family::default(),
            marks: Family::default(),
            publications: Family::default(),
        };
        registry.register(
            "openshell_server_config_push_sessions",
            "Supervisor sessions with pushed configuration on this replica",
            metrics.push_sessions.clone(),
        );
        registry.register(
            "openshell_server_config_builds_waiting",
            "Config builds waiting for a build permit",
            metrics.builds_waiting.clone(),
        );
        registry.register(
            "openshell_server_config_build_duration_seconds",
            "Config build time by part, trigger and outcome",
            metrics.build_duration.clone(),
        );
        registry.register(
            "openshell_server_config_build_wait_seconds",
            "Time config builds waited for a build permit",
            metrics.build_wait.clone(),
        );
        registry.register(
            "openshell_server_config_updates_sent",
            "ConfigUpdates sent to supervisors, by kind (initial, update)",
            metrics.updates_sent.clone(),
        );
        registry.register(
            "openshell_server_config_unchanged",
            "Config builds not sent because the supervisor has or will have them",
            metrics.unchanged.clone(),
        );
        registry.register(
            "openshell_server_config_results",
            "ConfigUpdateResults received, by outcome",
            metrics.results.clone(),
        );
        registry.register(
            "openshell_server_config_results_rejected",
            "ConfigUpdateResults the gateway refused, by reason",
            metrics.results_rejected.clone(),
        );
        registry.register(
            "openshell_server_config_sessions_closed",
            "Push sessions closed by config delivery, by reason",
            metrics.sessions_closed.clone(),
        );
        registry.register(
            "openshell_server_config_peer_notifies",
            "PeerNotifyConfigUpdate calls sent, by scope and outcome",
            metrics.peer_notifies.clone(),
        );
        registry.register(
            "openshell_server_config_marks",
            "Push sessions marked dirty, by source (local, peer, reconcile)",
            metrics.marks.clone(),
        );
        registry.register(
            "openshell_server_config_publications",
            "Committed configuration writes on this replica, by scope (sandbox, provider, all)",
            metrics.publications.clone(),
        );
        // Fixed series start at zero.
        for kind in ["initial", "update"] {
            let _ = metrics.updates_sent.get_or_create(&KindLabels { kind });
        }
        for outcome in ["applied", "ignored_duplicate", "rejected"] {
            let _ = metrics.results.get_or_create(&OutcomeLabels { outcome });
        }
        for source in ["local", "peer", "reconcile"] {
            let _ = metrics.marks.get_or_create(&SourceLabels { source });
        }
        for scope in ["sandbox", "provider", "all"] {
            let _ = metrics.publications.get_or_create(&ScopeLabels { scope });
        }
        metrics
    }

    fn build(&self, part: &'static str, trigger: &'static str, ok: bool, took: Duration) {
        self.build_duration
            .get_or_create(&BuildLabels {
                part,
                trigger,
                outcome: if ok { "ok" } else { "error" },
            })
            .observe(took.as_secs_f64());
    }

    fn closed(&self, reason: &'static str) {
        self.sessions_closed
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    fn notified(&self, scope: &'static str, outcome: &'static str) {
        self.peer_notifies
            .get_or_create(&NotifyLabels { scope, outcome })
            .inc();
    }

    fn mark(&self, source: &'static str) {
        self.marks.get_or_create(&SourceLabels { source }).inc();
    }
}

// ---------------------------------------------------------------- permits

/// One FIFO pool of build permits. tokio's semaphore is fair: waiters get
/// permits in the order they asked.
pub struct Permits {
    semaphore: Semaphore,
    size: usize,
}

impl Permits {
    /// 2 x the store pool, at least 4.
    pub fn sized_for_pool(pool: u32) -> Self {
        Self::new((2 * pool as usize).max(4))
    }

    pub fn new(size: usize) -> Self {
        Self {
            semaphore: Semaphore::new(size),
            size,
        }
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Waits for a permit in line, counted in `builds_waiting`.
    pub async fn acquire(&self, metrics: &ConfigMetrics) -> SemaphorePermit<'_> {
        metrics.builds_waiting.inc();
        let _waiting = scopeguard(|| {
            metrics.builds_waiting.dec();
        });
        let started = Instant::now();
        let permit = self
            .semaphore
            .acquire()
            .await
            .expect("the permit pool is never closed");
        metrics.build_wait.observe(started.elapsed().as_secs_f64());
        permit
    }
}

/// Runs `f` when dropped (also when the waiting future is cancelled).
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

// ---------------------------------------------------------------- backoff

/// Build failure backoff: 1, 2, 4, 8, 16, then 30 s; reset by a success.
#[derive(Debug, Default)]
pub struct BuildBackoff {
    failures: u32,
}

impl BuildBackoff {
    pub fn next_delay(&mut self) -> Duration {
        let delay = match self.failures {
            n @ 0..=4 => Duration::from_secs(1 << n),
            _ => Duration::from_secs(30),
        };
        self.failures = self.failures.saturating_add(1);
        delay
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

// ---------------------------------------------------------------- slots

/// A built update waiting to be sent. Holds provider secrets: its `Debug`
/// shows revisions and the fingerprint only.
#[derive(Clone)]
pub struct Built {
    pub config: GetSandboxConfigResponse,
    pub env: GetSandboxProviderEnvironmentResponse,
    pub fingerprint: Fingerprint,
}

impl Built {
    pub fn new(
        config: GetSandboxConfigResponse,
        env: GetSandboxProviderEnvironmentResponse,
    ) -> Self {
        let fingerprint = fingerprint(&config, &env);
        Self {
            config,
            env,
            fingerprint,
        }
    }
}

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Built")
            .field("config_revision", &self.config.config_revision)
            .field("provider_env_revision", &self.env.provider_env_revision)
            .field("fingerprint", &hex::encode(&self.fingerprint[..8]))
            .finish()
    }
}

#[derive(Debug)]
struct InFlight {
    id: u64,
    fingerprint: Fingerprint,
}

/// What to do with a fresh build.
pub enum Offer {
    /// Send this now (nothing was in flight).
    Send(Box<ConfigUpdate>),
    /// Waits in the pending slot (replacing an older pending build).
    Pending,
    /// The supervisor has or will have exactly this: not sent.
    Unchanged,
}

impl std::fmt::Debug for Offer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Offer::Send(update) => write!(f, "Send(update {})", update.update_id),
            Offer::Pending => f.write_str("Pending"),
            Offer::Unchanged => f.write_str("Unchanged"),
        }
    }
}

/// How the gateway took a result.
#[derive(Debug, PartialEq, Eq)]
pub enum ResultError {
    /// No update with this id is in flight: the session must close.
    UnknownUpdate,
}

/// The per-session delivery slots: at most one update in flight, one
/// pending build (the newest wins), and the fingerprint the supervisor last
/// applied.
#[derive(Debug)]
pub struct Slots {
    next_id: u64,
    in_flight: Option<InFlight>,
    pending: Option<Built>,
    applied: Option<Fingerprint>,
}

impl Default for Slots {
    fn default() -> Self {
        Self {
            next_id: 1,
            in_flight: None,
            pending: None,
            applied: None,
        }
    }
}

impl Slots {
    /// The content the supervisor has or will have once everything queued
    /// was delivered.
    fn newest(&self) -> Option<&Fingerprint> {
        self.pending
            .as_ref()
            .map(|b| &b.fingerprint)
            .or(self.in_flight.as_ref().map(|f| &f.fingerprint))
            .or(self.applied.as_ref())
    }

    pub fn offer(&mut self, built: Built) -> Offer {
        if self.newest() == Some(&built.fingerprint) {
            return Offer::Unchanged;
        }
        if self.in_flight.is_some() {
            self.pending = Some(built);
            return Offer::Pending;
        }
        Offer::Send(Box::new(self.start(built)))
    }

    fn start(&mut self, built: Built) -> ConfigUpdate {
        let id = self.next_id;
        self.next_id += 1;
        self.in_flight = Some(InFlight {
            id,
            fingerprint: built.fingerprint,
        });
        ConfigUpdate {
            update_id: id,
            sandbox_config: Some(built.config),
            provider_environment: Some(built.env),
        }
    }

    #[cfg(test)]
    pub fn in_flight_id(&self) -> Option<u64> {
        self.in_flight.as_ref().map(|f| f.id)
    }

    #[cfg(test)]
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Takes the supervisor's answer to the update in flight. Returns the
    /// pending update to send next, if any.
    pub fn answer(
        &mut self,
        update_id: u64,
        outcome: ConfigApplyOutcome,
    ) -> Result<Option<ConfigUpdate>, ResultError> {
        let in_flight = match &self.in_flight {
            Some(f) if f.id == update_id => self.in_flight.take().expect("checked"),
            _ => return Err(ResultError::UnknownUpdate),
        };
        if matches!(
            outcome,
            ConfigApplyOutcome::Applied | ConfigApplyOutcome::IgnoredDuplicate
        ) {
            self.applied = Some(in_flight.fingerprint);
        }
        // A rejected (or unreadable) answer leaves `applied` alone, so the
        // same build is sent again by the next rebuild.
        let next = self.pending.take();
        Ok(match next {
            Some(built) if self.applied != Some(built.fingerprint) => Some(self.start(built)),
            _ => None,
        })
    }
}

// ---------------------------------------------------------------- sessions

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Bootstrap,
    Mark,
    Reconcile,
    Retry,
}

impl Trigger {
    fn label(self) -> &'static str {
        match self {
            Trigger::Bootstrap => "bootstrap",
            Trigger::Mark => "mark",
            Trigger::Reconcile => "reconcile",
            Trigger::Retry => "retry",
        }
    }
}

#[derive(Default)]
struct SessionState {
    slots: Slots,
    /// The last provider environment built for this session and what it
    /// was built for.
    env_cache: Option<(EnvIdentity, GetSandboxProviderEnvironmentResponse)>,
    bootstrap_answered: bool,
}

/// One push session: its dirty mark, slots and delivery task.
pub struct PushSession {
    pub sandbox_id: String,
    pub session_id: String,
    dirty: Notify,
    /// Ends the delivery task; cancelled when the session ends.
    stop: CancellationToken,
    tx: OnceLock<(SessionTx, CancellationToken)>,
    state: Mutex<SessionState>,
    delivery: Arc<ConfigDelivery>,
    counted: std::sync::atomic::AtomicBool,
}

impl PushSession {
    /// Marks the session dirty. Marks merge: one stored flag.
    pub fn mark(&self) {
        self.dirty.notify_one();
    }

    fn metrics(&self) -> &ConfigMetrics {
        &self.delivery.metrics.config
    }

    /// Closes the session (the supervisor reconnects and bootstraps again).
    fn close(&self, reason: &'static str) {
        tracing::warn!(
            sandbox_id = self.sandbox_id,
            session_id = self.session_id,
            reason,
            "closing push session"
        );
        self.metrics().closed(reason);
        if let Some((_, closed)) = self.tx.get() {
            closed.cancel();
        }
        self.stop.cancel();
    }

    /// Queues an update on the session. A queue that stays full means a
    /// supervisor that stopped reading: the session closes.
    fn send(&self, update: ConfigUpdate) {
        let Some((tx, _)) = self.tx.get() else {
            return;
        };
        let message = GatewayMessage {
            payload: Some(gateway_message::Payload::ConfigUpdate(update)),
        };
        match tx.try_send(Ok(message)) {
            Ok(()) => {
                self.metrics()
                    .updates_sent
                    .get_or_create(&KindLabels { kind: "update" })
                    .inc();
            }
            Err(mpsc::error::TrySendError::Full(_)) => self.close("not_draining"),
            Err(mpsc::error::TrySendError::Closed(_)) => self.stop.cancel(),
        }
    }

    /// Builds a full update: the sandbox configuration, and the provider
    /// environment it names (the cached one unless its identity changed).
    async fn build(&self, trigger: Trigger) -> Result<Built, BuildError> {
        let cached = self
            .state
            .lock()
            .unwrap()
            .env_cache
            .as_ref()
            .map(|(identity, _)| identity.clone());
        if !self.delivery.build_delay.is_zero() {
            tokio::time::sleep(self.delivery.build_delay).await;
        }
        let started = Instant::now();
        let loaded = self
            .delivery
            .model
            .load(&self.sandbox_id, |identity| {
                cached.as_ref() != Some(identity)
            })
            .await;
        let metrics = self.metrics();
        let loaded = match loaded {
            Ok(loaded) => loaded,
            Err(err) => {
                let part = match err {
                    BuildError::EnvTimeout => "provider_environment",
                    _ => "sandbox_config",
                };
                metrics.build(part, trigger.label(), false, started.elapsed());
                return Err(err);
            }
        };
        metrics.build("sandbox_config", trigger.label(), true, loaded.config_time);
        let identity = EnvIdentity::of(&loaded.config);
        let env = {
            let mut state = self.state.lock().unwrap();
            match loaded.environment {
                Some(env) => {
                    metrics.build(
                        "provider_environment",
                        trigger.label(),
                        true,
                        loaded.env_time,
                    );
                    state.env_cache = Some((identity, env.clone()));
                    env
                }
                None => state
                    .env_cache
                    .as_ref()
                    .map(|(_, env)| env.clone())
                    .expect("the cached identity matched"),
            }
        };
        Ok(Built::new(loaded.config, env))
    }

    /// Offers a build to the slots and sends what they say.
    fn offer(&self, built: Built) {
        let offer = self.state.lock().unwrap().slots.offer(built);
        match offer {
            Offer::Send(update) => self.send(*update),
            Offer::Pending => {}
            Offer::Unchanged => {
                self.metrics().unchanged.inc();
            }
        }
    }

    /// The delivery task: wait for a mark (or reconcile, or a retry), take
    /// a permit, build, offer.
    async fn run(self: Arc<Self>) {
        let interval = self.delivery.reconcile_interval;
        let mut reconcile_at = tokio::time::Instant::now() + jitter(interval);
        let mut backoff = BuildBackoff::default();
        let mut retry_at: Option<tokio::time::Instant> = None;
        let bootstrap_deadline = tokio::time::Instant::now() + BOOTSTRAP_ANSWER_TIMEOUT;
        loop {
            let bootstrap_pending = !self.state.lock().unwrap().bootstrap_answered;
            let trigger = tokio::select! {
                biased;
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep_until(bootstrap_deadline), if bootstrap_pending => {
                    self.close("bootstrap_timeout");
                    return;
                }
                _ = self.dirty.notified() => Trigger::Mark,
                _ = sleep_until_opt(retry_at), if retry_at.is_some() => Trigger::Retry,
                _ = tokio::time::sleep_until(reconcile_at) => {
                    reconcile_at = tokio::time::Instant::now() + interval;
                    self.metrics().mark("reconcile");
                    Trigger::Reconcile
                }
            };
            let built = tokio::select! {
                _ = self.stop.cancelled() => return,
                built = async {
                    let _permit = self.delivery.permits.acquire(self.metrics()).await;
                    // This build reads after every mark so far: they merge
                    // into it. Marks from now on ask for another build.
                    let _ = self.dirty.notified().now_or_never();
                    self.build(trigger).await
                } => built,
            };
            match built {
                Ok(built) => {
                    backoff.reset();
                    retry_at = None;
                    self.offer(built);
                }
                Err(BuildError::NotFound) => {
                    // The sandbox is being deleted; its session ends soon.
                    retry_at = None;
                }
                Err(err) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(
                        sandbox_id = self.sandbox_id,
                        error = %err,
                        retry_in_s = delay.as_secs(),
                        "config build failed"
                    );
                    retry_at = Some(tokio::time::Instant::now() + delay);
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The first reconcile: a random point between one and two intervals after
/// registration, so a restart does not line every session up on one tick.
fn jitter(interval: Duration) -> Duration {
    let ms = interval.as_millis().max(1) as u64;
    Duration::from_millis(ms + rand::random_range(0..ms))
}

impl ConfigSink for PushSession {
    fn started(&self, tx: SessionTx, closed: CancellationToken) {
        let _ = self.tx.set((tx, closed));
        self.metrics()
            .updates_sent
            .get_or_create(&KindLabels { kind: "initial" })
            .inc();
    }

    fn result(&self, result: ConfigUpdateResult) {
        let outcome =
            ConfigApplyOutcome::try_from(result.outcome).unwrap_or(ConfigApplyOutcome::Unspecified);
        let label = match outcome {
            ConfigApplyOutcome::Applied => "applied",
            ConfigApplyOutcome::IgnoredDuplicate => "ignored_duplicate",
            ConfigApplyOutcome::Rejected => "rejected",
            ConfigApplyOutcome::Unspecified => "unspecified",
        };
        let answered = {
            let mut state = self.state.lock().unwrap();
            let answered = state.slots.answer(result.update_id, outcome);
            if answered.is_ok() {
                state.bootstrap_answered = true;
            }
            answered
        };
        let next = match answered {
            Ok(next) => next,
            Err(ResultError::UnknownUpdate) => {
                self.metrics()
                    .results_rejected
                    .get_or_create(&ReasonLabels {
                        reason: "unknown_update",
                    })
                    .inc();
                self.close("unknown_update");
                return;
            }
        };
        self.metrics()
            .results
            .get_or_create(&OutcomeLabels { outcome: label })
            .inc();
        match outcome {
            ConfigApplyOutcome::Rejected => {
                // The error text is the supervisor's, bounded; it never
                // carries configuration values by contract.
                let error: String = result.error.chars().take(MAX_RESULT_ERROR).collect();
                tracing::info!(
                    sandbox_id = self.sandbox_id,
                    update_id = result.update_id,
                    error,
                    "supervisor rejected a config update"
                );
            }
            ConfigApplyOutcome::Unspecified => {
                self.metrics()
                    .results_rejected
                    .get_or_create(&ReasonLabels {
                        reason: "invalid_outcome",
                    })
                    .inc();
            }
            _ => {}
        }
        if let Some(update) = next {
            self.send(update);
        }
    }

    fn ended(&self) {
        self.stop.cancel();
        self.delivery.unregister(self);
    }
}

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
    ) -> Result<crate::config_model::Loaded, Status> {
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
    use super::*;

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
