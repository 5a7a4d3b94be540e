//! [`ConfigSession`]: the supervisor side of a sandbox's session (the core's
//! [`openshell_sdk::ConfigSession`]) for the JVM, authenticated with the
//! sandbox's own token: startup poll, hello, bootstrap, pushed updates
//! answered in order, heartbeats, redirects, reconnects, and polling when
//! the gateway does not push.
//!
//! # Two ways to answer a snapshot
//!
//! - **Callback**: a [`ConfigApplier`] implemented on the JVM. The core calls
//!   it on one of tokio's blocking threads (never a worker), one call at a
//!   time, only for a snapshot that differs from the last applied one. `Ok`
//!   applies it; an error rejects it with the error's detail as the reason.
//! - **Updates**: no applier. The core's apply function then queues the
//!   snapshot as a pending update and blocks its blocking thread until the
//!   JVM answers `ack(id)` or `reject(id, reason)`; `next_update()` hands
//!   the next pending one to the JVM. The next update waits until this one
//!   is answered.
//!
//! # Runs
//!
//! One `run` at a time: a second one while one is under way fails at once
//! with `failed_precondition` and changes nothing. `run` ends when `stop()`
//! or `shutdown()` is called (or its future is dropped), and only after an
//! apply call in flight returned (bounded by the core at 10 s). An update
//! still unanswered when the run stops is answered REJECTED.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openshell_sdk::proto::sandbox::{SettingValue as ProtoSettingValue, setting_value};
use openshell_sdk::{
    ApplyOutcome, CancellationToken, ClientConfig, ConfigSession as CoreSession,
    ConfigSnapshot as CoreSnapshot, DeliveryMode as CoreMode,
};
use prost::Message;
use tokio::sync::{mpsc, oneshot};

use crate::errors::OpenShellError;

/// How configuration arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum DeliveryMode {
    /// Pushed over the session.
    Push,
    /// Polled with `GetSandboxConfig`.
    Poll,
}

impl From<CoreMode> for DeliveryMode {
    fn from(mode: CoreMode) -> Self {
        match mode {
            CoreMode::Push => DeliveryMode::Push,
            CoreMode::Poll => DeliveryMode::Poll,
        }
    }
}

/// One setting's value.
#[derive(Debug, Clone, PartialEq, uniffi::Enum)]
pub enum SettingValue {
    StringValue { value: String },
    BoolValue { value: bool },
    IntValue { value: i64 },
    BytesValue { value: Vec<u8> },
}

impl SettingValue {
    fn from_proto(value: &ProtoSettingValue) -> Option<Self> {
        Some(match value.value.as_ref()? {
            setting_value::Value::StringValue(v) => SettingValue::StringValue { value: v.clone() },
            setting_value::Value::BoolValue(v) => SettingValue::BoolValue { value: *v },
            setting_value::Value::IntValue(v) => SettingValue::IntValue { value: *v },
            setting_value::Value::BytesValue(v) => SettingValue::BytesValue { value: v.clone() },
        })
    }

    pub(crate) fn into_proto(self) -> ProtoSettingValue {
        let value = match self {
            SettingValue::StringValue { value } => setting_value::Value::StringValue(value),
            SettingValue::BoolValue { value } => setting_value::Value::BoolValue(value),
            SettingValue::IntValue { value } => setting_value::Value::IntValue(value),
            SettingValue::BytesValue { value } => setting_value::Value::BytesValue(value),
        };
        ProtoSettingValue { value: Some(value) }
    }
}

/// One full configuration of a sandbox. `environment` holds the provider
/// environment: secret values (the Kotlin wrapper never prints them).
#[derive(Debug, Clone, uniffi::Record)]
pub struct ConfigSnapshot {
    /// Increases whenever anything but the provider environment changes.
    pub config_revision: i64,
    /// Identity of the provider environment.
    pub provider_env_revision: i64,
    /// Version of the effective policy in its scope.
    pub policy_version: i64,
    /// SHA-256 (hex) of the effective policy.
    pub policy_hash: String,
    /// `SANDBOX`, `GLOBAL` or `UNSPECIFIED`.
    pub policy_source: String,
    /// The effective settings (a global value overrides the sandbox's).
    pub settings: HashMap<String, SettingValue>,
    /// Keys of the settings whose value comes from the global scope.
    pub global_keys: Vec<String>,
    /// The provider environment (secret values).
    pub environment: HashMap<String, String>,
    /// How it arrived; `None` for a host session's snapshots.
    pub mode: Option<DeliveryMode>,
    /// The encoded `openshell.sandbox.v1.GetSandboxConfigResponse`.
    pub sandbox_config_proto: Vec<u8>,
    /// The encoded `openshell.v1.GetSandboxProviderEnvironmentResponse`.
    pub provider_environment_proto: Vec<u8>,
}

pub(crate) fn snapshot(snapshot: CoreSnapshot, mode: Option<CoreMode>) -> ConfigSnapshot {
    use openshell_sdk::proto::sandbox::SettingScope;
    let config = &snapshot.sandbox_config;
    let mut settings = HashMap::new();
    let mut global_keys = Vec::new();
    for (key, effective) in &config.settings {
        if let Some(value) = effective.value.as_ref().and_then(SettingValue::from_proto) {
            settings.insert(key.clone(), value);
        }
        if effective.scope == SettingScope::Global as i32 {
            global_keys.push(key.clone());
        }
    }
    global_keys.sort();
    let source = config.policy_source().as_str_name();
    ConfigSnapshot {
        config_revision: crate::client::counter(config.config_revision),
        provider_env_revision: crate::client::counter(
            snapshot.provider_environment.provider_env_revision,
        ),
        policy_version: i64::from(config.version),
        policy_hash: config.policy_hash.clone(),
        policy_source: source
            .strip_prefix("POLICY_SOURCE_")
            .unwrap_or(source)
            .to_owned(),
        settings,
        global_keys,
        environment: snapshot
            .provider_environment
            .environment
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        mode: mode.map(DeliveryMode::from),
        sandbox_config_proto: config.encode_to_vec(),
        provider_environment_proto: snapshot.provider_environment.encode_to_vec(),
    }
}

/// Applies a sandbox's configuration, implemented on the JVM. Called on a
/// blocking thread, one call at a time; an error rejects the snapshot, its
/// detail going to the gateway as the reason (scrubbed of provider values
/// and bounded by the core; never put configuration values in it).
#[uniffi::export(with_foreign)]
pub trait ConfigApplier: Send + Sync {
    fn apply(&self, snapshot: ConfigSnapshot) -> Result<(), OpenShellError>;
}

/// The reason a rejecting error carries.
pub(crate) fn rejection(err: OpenShellError) -> ApplyOutcome {
    let detail = err.detail();
    ApplyOutcome::Rejected(if detail.trim().is_empty() {
        "rejected by the application".into()
    } else {
        detail
    })
}

/// How to connect a session.
#[derive(Debug, Clone, uniffi::Record)]
pub struct SessionOptions {
    /// The gateway (the edge of a cluster): `http://host:port` or `https://...`.
    pub endpoint: String,
    /// The sandbox's token (a host session: the host's token).
    pub token: String,
    pub ca_pem: Option<Vec<u8>>,
    pub tls_server_name: Option<String>,
    pub connect_timeout_ms: Option<u64>,
    /// Send the token over cleartext HTTP (loopback development only).
    pub allow_cleartext_token: bool,
    /// `GetSandboxConfig` interval while nothing is pushed (default 10 s,
    /// at least 100 ms).
    pub poll_interval_ms: Option<u64>,
    /// Announce `supports_config_push` in the hello (off: always polled).
    pub announce_push: bool,
    /// The instance id every hello carries (default: a new UUID).
    pub instance_id: Option<String>,
}

pub(crate) fn client_config(options: &SessionOptions) -> Result<ClientConfig, OpenShellError> {
    let mut builder = ClientConfig::builder(options.endpoint.clone())
        .token(options.token.clone())
        .allow_cleartext_token(options.allow_cleartext_token);
    if let Some(pem) = &options.ca_pem {
        builder = builder.ca_pem(pem.clone());
    }
    if let Some(name) = &options.tls_server_name {
        builder = builder.tls_server_name(name.clone());
    }
    if let Some(ms) = options.connect_timeout_ms {
        builder = builder.connect_timeout(Duration::from_millis(ms));
    }
    Ok(builder.build()?)
}

/// The counters of a [`ConfigSession`].
#[derive(Debug, Clone, uniffi::Record)]
pub struct ConfigSessionStats {
    /// How configuration arrives now (`None` before anything arrived).
    pub mode: Option<DeliveryMode>,
    pub applied: i64,
    pub rejected: i64,
    /// Pushed updates equal to the last applied snapshot (answered by the core).
    pub duplicates: i64,
    /// Pushed updates received, bootstraps included.
    pub updates_received: i64,
    /// The last pushed update id answered.
    pub last_update_id: i64,
    /// `config_revision` of the applied configuration.
    pub config_revision: i64,
    /// Successful `GetSandboxConfig` polls.
    pub polls: i64,
    pub sessions_accepted: i64,
    pub redirects: i64,
    /// The current session id, while one is accepted.
    pub session_id: Option<String>,
    /// The replica holding the current session.
    pub served_by: Option<String>,
}

/// A snapshot waiting for the JVM's answer (updates mode).
#[derive(Debug, Clone, uniffi::Record)]
pub struct PendingUpdate {
    /// Answer it with `ack(id)` or `reject(id, reason)`.
    pub id: u64,
    pub snapshot: ConfigSnapshot,
}

/// The answer channels of the pending updates, by id.
type Acks = Arc<Mutex<HashMap<u64, oneshot::Sender<ApplyOutcome>>>>;

/// The running run's stop token (`None` between runs).
type Gate = Arc<Mutex<Option<CancellationToken>>>;

fn answerable(gate: &Gate) -> bool {
    gate.lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_some_and(|t| !t.is_cancelled())
}

fn drop_pending(acks: &Acks) {
    // Dropping the senders answers every waiting apply REJECTED.
    acks.lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// The refusal of a second concurrent run.
pub(crate) fn already_running(what: &str) -> OpenShellError {
    OpenShellError::FailedPrecondition {
        code: "failed_precondition".into(),
        detail: format!(
            "the {what} is already running: one run at a time (the running one goes on)"
        ),
        grpc_status: 9,
        retryable: false,
        served_by: None,
    }
}

/// One run at a time: held by a run (its spawned task) until it returned.
#[derive(Default)]
pub(crate) struct RunSlot {
    lock: Arc<tokio::sync::Mutex<()>>,
    /// The current run's stop token.
    gate: Gate,
}

impl RunSlot {
    /// Claims the slot, or `failed_precondition`.
    pub(crate) fn claim(
        &self,
        what: &str,
        closed: &CancellationToken,
    ) -> Result<(tokio::sync::OwnedMutexGuard<()>, CancellationToken), OpenShellError> {
        let guard = self
            .lock
            .clone()
            .try_lock_owned()
            .map_err(|_| already_running(what))?;
        let stop = closed.child_token();
        *self.gate.lock().unwrap_or_else(|p| p.into_inner()) = Some(stop.clone());
        Ok((guard, stop))
    }

    /// Stops the current run, if any.
    pub(crate) fn stop(&self) {
        if let Some(stop) = self.gate.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            stop.cancel();
        }
    }

    /// Returns once no run is under way.
    pub(crate) async fn idle(&self) {
        let _ = self.lock.lock().await;
    }
}

/// Runs `run` to its end in a task of its own: dropping the caller's
/// future stops the run, which still finishes (waiting for an apply in
/// flight) before the slot frees.
pub(crate) async fn run_claimed<F>(
    guard: tokio::sync::OwnedMutexGuard<()>,
    stop: CancellationToken,
    run: F,
) -> Result<(), OpenShellError>
where
    F: Future<Output = Result<(), openshell_sdk::Error>> + Send + 'static,
{
    let _stop_on_drop = stop.clone().drop_guard();
    let task = tokio::spawn(async move {
        let _guard = guard;
        run.await
    });
    match task.await {
        Ok(result) => Ok(result?),
        Err(_) => Err(openshell_sdk::Error::protocol("the session's run task failed").into()),
    }
}

/// The supervisor side of one sandbox's session.
#[derive(uniffi::Object)]
pub struct ConfigSession {
    session: CoreSession,
    /// Pending updates (updates mode only).
    updates: Option<tokio::sync::Mutex<mpsc::UnboundedReceiver<PendingUpdate>>>,
    acks: Acks,
    slot: RunSlot,
    closed: CancellationToken,
}

#[uniffi::export(async_runtime = "tokio")]
impl ConfigSession {
    /// Builds the session of sandbox `sandbox_id` (nothing connects until
    /// `run`). Without `applier`, snapshots are handed out by `next_update`.
    #[uniffi::constructor]
    pub fn new(
        options: SessionOptions,
        sandbox_id: String,
        applier: Option<Arc<dyn ConfigApplier>>,
    ) -> Result<Arc<Self>, OpenShellError> {
        let config = client_config(&options)?;
        let acks: Acks = Arc::default();
        let slot = RunSlot::default();
        let mut builder =
            CoreSession::builder(config, sandbox_id).config_push(options.announce_push);
        let updates = match applier {
            Some(applier) => {
                builder = builder.apply_with_mode(Arc::new(move |snap, mode| {
                    match applier.apply(snapshot(snap, Some(mode))) {
                        Ok(()) => ApplyOutcome::Applied,
                        Err(err) => rejection(err),
                    }
                }));
                None
            }
            None => {
                let (queue, updates) = mpsc::unbounded_channel::<PendingUpdate>();
                let next_id = AtomicU64::new(1);
                let (acks, gate) = (acks.clone(), slot.gate.clone());
                builder = builder.apply_with_mode(Arc::new(move |snap, mode| {
                    let closing = || ApplyOutcome::Rejected("the session is stopping".into());
                    if !answerable(&gate) {
                        return closing();
                    }
                    let id = next_id.fetch_add(1, Ordering::Relaxed);
                    let (answer, answered) = oneshot::channel();
                    acks.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id, answer);
                    // A stop clears the senders after cancelling: checked
                    // after the insert, one of the two frees this thread.
                    let forget = || acks.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                    if !answerable(&gate) {
                        forget();
                        return closing();
                    }
                    let pending = PendingUpdate {
                        id,
                        snapshot: snapshot(snap, Some(mode)),
                    };
                    if queue.send(pending).is_err() {
                        forget();
                        return closing();
                    }
                    answered.blocking_recv().unwrap_or_else(|_| {
                        ApplyOutcome::Rejected(
                            "the session stopped before the update was answered".into(),
                        )
                    })
                }));
                Some(tokio::sync::Mutex::new(updates))
            }
        };
        if let Some(ms) = options.poll_interval_ms {
            builder = builder.poll_interval(Duration::from_millis(ms));
        }
        if let Some(id) = options.instance_id {
            builder = builder.instance_id(id);
        }
        Ok(Arc::new(Self {
            session: builder.build()?,
            updates,
            acks,
            slot,
            closed: CancellationToken::new(),
        }))
    }

    /// Holds the session until `stop()`, `shutdown()` or the caller's
    /// cancellation; returns after an apply in flight returned. A second
    /// run while one is under way fails with `failed_precondition`. Fails
    /// only when the endpoint is unusable (`invalid_config`, `tls`).
    pub async fn run(&self) -> Result<(), OpenShellError> {
        if self.closed.is_cancelled() {
            return Ok(());
        }
        let (guard, stop) = self.slot.claim("config session", &self.closed)?;
        let (session, acks) = (self.session.clone(), self.acks.clone());
        run_claimed(guard, stop.clone(), async move {
            let run = session.run(stop.clone());
            tokio::pin!(run);
            let result = tokio::select! {
                result = &mut run => result,
                _ = stop.cancelled() => {
                    drop_pending(&acks);
                    run.await
                }
            };
            stop.cancel();
            drop_pending(&acks);
            result
        })
        .await
    }

    /// Stops the current run (it returns once an apply in flight returned).
    pub fn stop(&self) {
        self.slot.stop();
    }

    /// Returns once no run is under way.
    pub async fn wait_stopped(&self) {
        self.slot.idle().await;
    }

    /// The next update to answer (updates mode), or `None` once the session
    /// is shut down. `invalid_config` when the session has an applier.
    pub async fn next_update(&self) -> Result<Option<PendingUpdate>, OpenShellError> {
        let Some(updates) = &self.updates else {
            return Err(crate::errors::invalid(
                "this session answers through its applier, not next_update",
            ));
        };
        let mut updates = tokio::select! {
            biased;
            _ = self.closed.cancelled() => return Ok(None),
            updates = updates.lock() => updates,
        };
        Ok(tokio::select! {
            biased;
            _ = self.closed.cancelled() => None,
            next = updates.recv() => next,
        })
    }

    /// Answers update `id` applied; false when it was already answered or
    /// the run stopped meanwhile (it was answered REJECTED then).
    pub fn ack(&self, id: u64) -> bool {
        self.answer(id, ApplyOutcome::Applied)
    }

    /// Answers update `id` rejected with `reason` (scrubbed and bounded;
    /// never put configuration values in it). False as for `ack`.
    pub fn reject(&self, id: u64, reason: String) -> bool {
        let reason = if reason.trim().is_empty() {
            "rejected by the application".into()
        } else {
            reason
        };
        self.answer(id, ApplyOutcome::Rejected(reason))
    }

    /// A copy of the counters.
    pub fn stats(&self) -> ConfigSessionStats {
        let s = self.session.stats();
        let c = crate::client::counter;
        ConfigSessionStats {
            mode: s.mode.map(DeliveryMode::from),
            applied: c(s.applied),
            rejected: c(s.rejected),
            duplicates: c(s.duplicates),
            updates_received: c(s.updates_received),
            last_update_id: c(s.last_update_id),
            config_revision: c(s.config_revision),
            polls: c(s.polls),
            sessions_accepted: c(s.sessions_accepted),
            redirects: c(s.redirects),
            session_id: s.session_id,
            served_by: s.served_by,
        }
    }

    /// The instance id every hello carries.
    pub fn instance_id(&self) -> String {
        self.session.instance_id().to_owned()
    }

    /// Stops any run for good and answers every pending update REJECTED;
    /// later runs return at once. Idempotent. (Not `close`: that name is
    /// the generated class's `AutoCloseable`.)
    pub fn shutdown(&self) {
        self.closed.cancel();
        drop_pending(&self.acks);
    }

    /// Whether `shutdown()` was called.
    pub fn is_shut_down(&self) -> bool {
        self.closed.is_cancelled()
    }
}

impl ConfigSession {
    fn answer(&self, id: u64, outcome: ApplyOutcome) -> bool {
        let sender = self
            .acks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        sender.is_some_and(|s| s.send(outcome).is_ok())
    }
}

impl Drop for ConfigSession {
    fn drop(&mut self) {
        self.closed.cancel();
        drop_pending(&self.acks);
    }
}
