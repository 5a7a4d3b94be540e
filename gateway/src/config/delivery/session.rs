//! One push session: its delivery task (mark, permit, build, send), the
//! slots that keep one update in flight and the newest one pending, and the
//! results the supervisor answers.

use super::*;

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
pub(super) struct InFlight {
    pub(super) id: u64,
    pub(super) fingerprint: Fingerprint,
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
    pub(super) next_id: u64,
    pub(super) in_flight: Option<InFlight>,
    pub(super) pending: Option<Built>,
    pub(super) applied: Option<Fingerprint>,
    /// The content the supervisor last rejected, while nothing newer was
    /// offered: a mark that builds it again does not resend it (the same
    /// content would be refused the same way); reconcile does.
    pub(super) rejected: Option<Fingerprint>,
}

impl Default for Slots {
    fn default() -> Self {
        Self {
            next_id: 1,
            in_flight: None,
            pending: None,
            applied: None,
            rejected: None,
        }
    }
}

impl Slots {
    /// The content the supervisor has or will have once everything queued
    /// was delivered.
    pub(super) fn newest(&self) -> Option<&Fingerprint> {
        self.pending
            .as_ref()
            .map(|b| &b.fingerprint)
            .or(self.in_flight.as_ref().map(|f| &f.fingerprint))
            .or(self.applied.as_ref())
    }

    /// `resend_rejected`: whether content the supervisor rejected last goes
    /// out again (reconcile's retry) or counts as unchanged (a mark: some
    /// other write rebuilt the same content).
    pub fn offer(&mut self, built: Built, resend_rejected: bool) -> Offer {
        if self.newest() == Some(&built.fingerprint) {
            return Offer::Unchanged;
        }
        if self.rejected == Some(built.fingerprint) && !resend_rejected {
            return Offer::Unchanged;
        }
        self.rejected = None;
        if self.in_flight.is_some() {
            self.pending = Some(built);
            return Offer::Pending;
        }
        Offer::Send(Box::new(self.start(built)))
    }

    pub(super) fn start(&mut self, built: Built) -> ConfigUpdate {
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
        let next = self.pending.take();
        if matches!(
            outcome,
            ConfigApplyOutcome::Applied | ConfigApplyOutcome::IgnoredDuplicate
        ) {
            self.applied = Some(in_flight.fingerprint);
        } else if next.is_none() {
            // A rejected (or unreadable) answer leaves `applied` alone: the
            // next reconcile sends the same content again.
            self.rejected = Some(in_flight.fingerprint);
        }
        Ok(match next {
            Some(built) if self.applied != Some(built.fingerprint) => Some(self.start(built)),
            _ => None,
        })
    }
}

// ---------------------------------------------------------------- sessions

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Trigger {
    Bootstrap,
    Mark,
    Reconcile,
    Retry,
}

impl Trigger {
    pub(super) fn label(self) -> &'static str {
        match self {
            Trigger::Bootstrap => "bootstrap",
            Trigger::Mark => "mark",
            Trigger::Reconcile => "reconcile",
            Trigger::Retry => "retry",
        }
    }
}

#[derive(Default)]
pub(super) struct SessionState {
    pub(super) slots: Slots,
    /// The last provider environment built for this session and what it
    /// was built for.
    pub(super) env_cache: Option<(EnvIdentity, GetSandboxProviderEnvironmentResponse)>,
    pub(super) bootstrap_answered: bool,
}

/// One push session: its dirty mark, slots and delivery task.
pub struct PushSession {
    pub sandbox_id: String,
    pub session_id: String,
    pub(super) dirty: Notify,
    /// Ends the delivery task; cancelled when the session ends.
    pub(super) stop: CancellationToken,
    pub(super) tx: OnceLock<(SessionTx, CancellationToken)>,
    pub(super) state: Mutex<SessionState>,
    pub(super) delivery: Arc<ConfigDelivery>,
    pub(super) counted: std::sync::atomic::AtomicBool,
}

impl PushSession {
    /// Marks the session dirty. Marks merge: one stored flag.
    pub fn mark(&self) {
        self.dirty.notify_one();
    }

    pub(super) fn metrics(&self) -> &ConfigMetrics {
        &self.delivery.metrics.config
    }

    /// Closes the session (the supervisor reconnects and bootstraps again).
    pub(super) fn close(&self, reason: &'static str) {
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

    /// Queues an update on the session's config queue (its own: relay opens
    /// and heartbeats never take its room). One update is in flight at a
    /// time and the next goes out only once the supervisor answered it, so
    /// a full config queue means a supervisor answering updates it never
    /// read: the session closes. A supervisor that merely stopped reading
    /// is closed by the session's drain check.
    pub(super) fn send(&self, update: ConfigUpdate) {
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
    pub(super) async fn build(&self, trigger: Trigger) -> Result<Built, BuildError> {
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
    pub(super) fn offer(&self, built: Built, trigger: Trigger) {
        let resend_rejected = matches!(trigger, Trigger::Reconcile | Trigger::Retry);
        let offer = self
            .state
            .lock()
            .unwrap()
            .slots
            .offer(built, resend_rejected);
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
    pub(super) async fn run(self: Arc<Self>) {
        let interval = self.delivery.reconcile_interval;
        let mut reconcile_at = tokio::time::Instant::now() + jitter(interval);
        let mut backoff = BuildBackoff::default();
        let mut retry_at: Option<tokio::time::Instant> = None;
        let bootstrap_deadline = tokio::time::Instant::now() + BOOTSTRAP_ANSWER_TIMEOUT;
        loop {
            let bootstrap_pending = !self.state.lock().unwrap().bootstrap_answered;
            let trigger = tokio::select! {
                biased;
                _ = self.stop.cancelled() => return self.hand_over(false),
                _ = tokio::time::sleep_until(bootstrap_deadline), if bootstrap_pending => {
                    self.close("bootstrap_timeout");
                    return self.hand_over(false);
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
                _ = self.stop.cancelled() => return self.hand_over(true),
                built = async {
                    let _permit = self.delivery.permits.acquire(self.metrics()).await;
                    // This build reads after every mark so far: they merge
                    // into it. Marks from now on ask for another build.
                    let _ = self.dirty.notified().now_or_never();
                    self.build(trigger).await
                } => built,
            };
            if self.stop.is_cancelled() {
                // Finished after the session ended: nobody here takes it.
                return self.hand_over(true);
            }
            match built {
                Ok(built) => {
                    backoff.reset();
                    retry_at = None;
                    self.offer(built, trigger);
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

impl PushSession {
    /// The session ended. If it leaves changes the supervisor never
    /// confirmed (a build under way, a stored mark, a pending update or an
    /// unanswered one after the bootstrap), whoever holds the sandbox's
    /// session now is told, so a supervisor that moved does not wait for
    /// its next reconcile to see them. `building`: a build was under way.
    pub(super) fn hand_over(&self, building: bool) {
        let unconfirmed = building || self.dirty.notified().now_or_never().is_some() || {
            let state = self.state.lock().unwrap();
            state.slots.pending.is_some()
                || state.slots.in_flight.as_ref().is_some_and(|f| f.id > 1)
        };
        if unconfirmed {
            self.delivery.hand_over(&self.sandbox_id, &self.session_id);
        }
    }
}

pub(super) async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The first reconcile: a random point between one and two intervals after
/// registration, so a restart does not line every session up on one tick.
pub(super) fn jitter(interval: Duration) -> Duration {
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
