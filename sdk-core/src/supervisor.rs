//! The supervisor side of the session protocol, with push configuration.
//!
//! A supervisor keeps one `ConnectSupervisor` session per sandbox and
//! applies the gateway's configuration for that sandbox. [`ConfigSession`]
//! does both, so every language (and the reference supervisor) gets the same
//! protocol:
//!
//! 1. **Startup.** One `GetSandboxConfig` poll (plus
//!    `GetSandboxProviderEnvironment` for the environment it names), applied
//!    through the host's apply function, as supervisors always started.
//! 2. **Hello.** The session opens with `SupervisorHello{sandbox_id,
//!    instance_id, connection_epoch (increases every attempt), redirected,
//!    supports_session_redirect: true, supports_config_push (true unless
//!    [`ConfigSessionBuilder::config_push`] turned it off), stay}`.
//! 3. **Accepted.** With `config_push_enabled`, `SessionAccepted.bootstrap`
//!    is update 1: it is applied like any update (usually an
//!    `IGNORED_DUPLICATE` of the startup config) and polling stops. Without
//!    it, the session polls `GetSandboxConfig` every 10 s (default), so both
//!    modes deliver the same snapshots through the same apply function; an
//!    application can only tell them apart by latency.
//! 4. **Updates.** Each pushed `ConfigUpdate` is a full snapshot (sandbox
//!    configuration and provider environment). Updates are applied one at a
//!    time, in order, and every one is answered with a `ConfigUpdateResult`
//!    (APPLIED, IGNORED_DUPLICATE when it equals the last applied snapshot,
//!    or REJECTED with a bounded reason that never carries configuration
//!    values) on the session that delivered it.
//! 5. **Redirects.** A `SessionRedirect` is followed at once to its peer with
//!    `redirected` set (at most 4 in a row without an accepted session, then
//!    the backoff applies); if the peer cannot be reached the next attempt
//!    goes back to the configured gateway.
//! 6. **Reconnects.** A lost or rejected session is retried after a backoff
//!    of 1 s doubling to 30 s, reset whenever a session was accepted. While
//!    no push session is up, polling continues.
//!
//! Heartbeats go out at the interval `SessionAccepted` advertises, never
//! more often than every 5 s. Gateway messages this module does not handle
//! (`RelayOpen`, `RelayClose`) go to the host through
//! [`ConfigSessionBuilder::session_events`], with a sender for
//! `SupervisorMessage`s on the same session; without that hook relays are
//! refused.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use openshell_proto::sandbox::{GetSandboxConfigRequest, GetSandboxConfigResponse};
use openshell_proto::{
    ConfigApplyOutcome, ConfigUpdate, ConfigUpdateResult, GatewayMessage,
    GetSandboxProviderEnvironmentRequest, GetSandboxProviderEnvironmentResponse, PolicyStatus,
    RelayOpenResult, SupervisorHeartbeat, SupervisorHello, SupervisorMessage, gateway_message,
    supervisor_message,
};
use prost::Message;
use tokio::sync::{Notify, broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::client::{CallOptions, Client, DeadlineKind, Resolved};
use crate::config::ClientConfig;
use crate::error::Error;
use crate::metadata::{Metadata, SERVED_BY};

const CONNECT_SUPERVISOR: &str = "/openshell.v1.OpenShell/ConnectSupervisor";
const GET_SANDBOX_CONFIG: &str = "/openshell.v1.OpenShell/GetSandboxConfig";
const GET_PROVIDER_ENVIRONMENT: &str = "/openshell.v1.OpenShell/GetSandboxProviderEnvironment";

/// Default interval of `GetSandboxConfig` polls when the gateway does not push.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(10);
/// Heartbeats never go out more often than this.
const MIN_HEARTBEAT: Duration = Duration::from_secs(5);
const MAX_HEARTBEAT: Duration = Duration::from_secs(3600);
/// Redirects followed back to back without an accepted session before the
/// next one waits for the backoff (guards against a redirect loop).
const MAX_IMMEDIATE_REDIRECTS: u32 = 4;
/// Messages buffered towards the gateway (heartbeats, results, relay answers).
const OUTBOUND_MESSAGES: usize = 64;
/// Reasons sent with REJECTED are cut to this many characters.
const MAX_REASON: usize = 256;

// ---------------------------------------------------------------- public types

/// One full configuration: what the host applies.
#[derive(Clone, PartialEq, Default)]
pub struct ConfigSnapshot {
    /// Policy, settings and revisions of the sandbox.
    pub sandbox_config: GetSandboxConfigResponse,
    /// The provider environment the configuration names. Values are secrets.
    pub provider_environment: GetSandboxProviderEnvironmentResponse,
}

impl fmt::Debug for ConfigSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys: Vec<&String> = self.provider_environment.environment.keys().collect();
        keys.sort();
        f.debug_struct("ConfigSnapshot")
            .field("sandbox_config", &self.sandbox_config)
            .field("provider_environment_keys", &keys)
            .field(
                "provider_env_revision",
                &self.provider_environment.provider_env_revision,
            )
            .finish()
    }
}

/// What the host's apply function answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// The configuration is in force.
    Applied,
    /// Refused; the reason goes back to the gateway (bounded, and scrubbed
    /// of provider environment values). The previous configuration stays.
    Rejected(String),
}

/// The host's apply function. Called on a blocking thread, one call at a
/// time, only for a snapshot that differs from the last applied one.
pub type ApplyFn = Arc<dyn Fn(ConfigSnapshot) -> ApplyOutcome + Send + Sync>;

/// An apply function that is also told how the snapshot arrived (bindings
/// show it to the host). Same contract as [`ApplyFn`].
pub type ApplyWithModeFn = Arc<dyn Fn(ConfigSnapshot, DeliveryMode) -> ApplyOutcome + Send + Sync>;

/// How configuration currently arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryMode {
    /// Pushed over the session.
    Push,
    /// Polled with `GetSandboxConfig`.
    Poll,
}

/// Something the host may want to know.
#[derive(Debug, Clone)]
pub enum ConfigEvent {
    /// A new configuration was applied.
    Applied {
        /// How it arrived.
        mode: DeliveryMode,
        /// Its `config_revision`.
        config_revision: u64,
        /// Its `provider_env_revision`.
        provider_env_revision: u64,
    },
    /// The apply function refused a configuration.
    Rejected {
        /// How it arrived.
        mode: DeliveryMode,
        /// The (scrubbed, bounded) reason.
        reason: String,
    },
    /// Delivery switched between push and poll.
    ModeChanged(DeliveryMode),
}

/// Counters of a [`ConfigSession`].
#[derive(Debug, Clone, Default)]
pub struct ConfigSessionStats {
    /// How configuration arrives now.
    pub mode: Option<DeliveryMode>,
    /// Configurations the apply function accepted.
    pub applied: u64,
    /// Configurations the apply function refused.
    pub rejected: u64,
    /// Updates answered IGNORED_DUPLICATE (equal to the last applied).
    pub duplicates: u64,
    /// Pushed updates received (bootstraps included).
    pub updates_received: u64,
    /// The last pushed update id answered.
    pub last_update_id: u64,
    /// `config_revision` of the applied configuration.
    pub config_revision: u64,
    /// Successful `GetSandboxConfig` polls.
    pub polls: u64,
    /// Sessions accepted.
    pub sessions_accepted: u64,
    /// Redirects followed.
    pub redirects: u64,
    /// The current session id, while one is accepted.
    pub session_id: Option<String>,
    /// The replica holding the current session (`x-openshell-served-by`).
    pub served_by: Option<String>,
}

/// An accepted session, for hosts that serve relays on it.
#[derive(Clone)]
pub struct SessionHandle {
    /// The gateway's session id.
    pub session_id: String,
    /// The replica holding the session (`x-openshell-served-by`): relay
    /// claims through an edge carry it as `x-openshell-replica`.
    pub served_by: Option<String>,
    /// The client the session runs on: relay claims use its channel, so
    /// they ride the same HTTP/2 connection.
    pub client: Client,
    /// Sends `SupervisorMessage`s on this session (relay results, closes).
    pub outbound: mpsc::Sender<SupervisorMessage>,
    /// Whether the gateway pushes configuration on this session.
    pub config_push: bool,
}

impl fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionHandle")
            .field("session_id", &self.session_id)
            .field("served_by", &self.served_by)
            .field("config_push", &self.config_push)
            .finish_non_exhaustive()
    }
}

/// Session life, for hosts that serve relays.
#[derive(Debug)]
pub enum SessionEvent {
    /// A session was accepted.
    Accepted(SessionHandle),
    /// A gateway message [`ConfigSession`] does not handle (`RelayOpen`,
    /// `RelayClose`), on the current session.
    Message(Box<GatewayMessage>),
    /// The accepted session ended: whatever it started should stop.
    Ended,
}

// ---------------------------------------------------------------- builder

/// Builds a [`ConfigSession`].
pub struct ConfigSessionBuilder {
    config: ClientConfig,
    sandbox_id: String,
    instance_id: Option<String>,
    apply: Option<ApplyWithModeFn>,
    poll_interval: Duration,
    events: Option<mpsc::Sender<SessionEvent>>,
    stay: bool,
    config_push: bool,
}

impl ConfigSessionBuilder {
    /// The host's apply function (required).
    pub fn apply(mut self, apply: ApplyFn) -> Self {
        self.apply = Some(Arc::new(move |snapshot, _mode| apply(snapshot)));
        self
    }

    /// The host's apply function, told whether the snapshot was pushed or
    /// polled (instead of [`apply`](Self::apply)).
    pub fn apply_with_mode(mut self, apply: ApplyWithModeFn) -> Self {
        self.apply = Some(apply);
        self
    }

    /// Interval of `GetSandboxConfig` polls when the gateway does not push.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The supervisor instance id (default: a new UUID). Stable for the life
    /// of the process.
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.instance_id = Some(id.into());
        self
    }

    /// Receives session life and relay messages (see [`SessionEvent`]).
    pub fn session_events(mut self, events: mpsc::Sender<SessionEvent>) -> Self {
        self.events = Some(events);
        self
    }

    /// Sets `stay` in the hello (a shared host asking to stay where it landed).
    pub fn stay(mut self, stay: bool) -> Self {
        self.stay = stay;
        self
    }

    /// Whether the hello announces `supports_config_push` (default true).
    /// Off, the session never gets pushed configuration and keeps polling
    /// `GetSandboxConfig`, whatever the gateway's mode: what a supervisor
    /// that predates push does.
    pub fn config_push(mut self, announce: bool) -> Self {
        self.config_push = announce;
        self
    }

    /// Validates and returns the session (nothing connects until `run`).
    pub fn build(self) -> Result<ConfigSession, Error> {
        if self.sandbox_id.trim().is_empty() {
            return Err(Error::invalid_config("sandbox id is empty"));
        }
        let apply = self
            .apply
            .ok_or_else(|| Error::invalid_config("an apply function is required"))?;
        if self.poll_interval < Duration::from_millis(100) {
            return Err(Error::invalid_config(
                "poll interval must be at least 100 ms",
            ));
        }
        let (events_tx, _) = broadcast::channel(64);
        Ok(ConfigSession {
            inner: Arc::new(Inner {
                config: self.config,
                sandbox_id: self.sandbox_id,
                instance_id: self
                    .instance_id
                    .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
                poll_interval: self.poll_interval,
                session_events: self.events,
                stay: self.stay,
                config_push: self.config_push,
                applier: Applier {
                    apply,
                    last: tokio::sync::Mutex::new(None),
                },
                stats: Mutex::new(ConfigSessionStats::default()),
                events: events_tx,
                pushing: watch::channel(false).0,
                poll_now: Notify::new(),
            }),
        })
    }
}

// ---------------------------------------------------------------- session

/// The supervisor side of the session protocol with push configuration.
/// Cheap to clone; clones share state.
#[derive(Clone)]
pub struct ConfigSession {
    inner: Arc<Inner>,
}

struct Inner {
    config: ClientConfig,
    sandbox_id: String,
    instance_id: String,
    poll_interval: Duration,
    session_events: Option<mpsc::Sender<SessionEvent>>,
    stay: bool,
    /// Announce `supports_config_push` in the hello.
    config_push: bool,
    applier: Applier,
    stats: Mutex<ConfigSessionStats>,
    events: broadcast::Sender<ConfigEvent>,
    /// True while a push session is accepted: polling pauses.
    pushing: watch::Sender<bool>,
    /// Wakes the poll loop (a push session ended).
    poll_now: Notify,
}

impl fmt::Debug for ConfigSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigSession")
            .field("sandbox_id", &self.inner.sandbox_id)
            .field("instance_id", &self.inner.instance_id)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl ConfigSession {
    /// Starts a builder. `config` names the gateway (through an edge in a
    /// cluster) and carries the sandbox token as its bearer token.
    pub fn builder(config: ClientConfig, sandbox_id: impl Into<String>) -> ConfigSessionBuilder {
        ConfigSessionBuilder {
            config,
            sandbox_id: sandbox_id.into(),
            instance_id: None,
            apply: None,
            poll_interval: DEFAULT_POLL_INTERVAL,
            events: None,
            stay: false,
            config_push: true,
        }
    }

    /// A copy of the counters.
    pub fn stats(&self) -> ConfigSessionStats {
        self.inner.stats.lock().unwrap().clone()
    }

    /// Configuration events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ConfigEvent> {
        self.inner.events.subscribe()
    }

    /// The instance id sent in every hello.
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }

    /// Runs until `cancel` fires: the startup poll, then the session loop
    /// and the poll loop. Returns an error only when the gateway endpoint is
    /// unusable (`invalid_config`, `tls`).
    pub async fn run(&self, cancel: CancellationToken) -> Result<(), Error> {
        let home = Client::connect_lazy(self.inner.config.clone()).await?;
        let inner = self.inner.clone();
        let work = async move {
            // Supervisors start as they always did: from polled configuration.
            inner.poll_and_apply(&home).await;
            tokio::join!(inner.poll_loop(&home), inner.session_loop(&home));
        };
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = work => {}
        }
        self.inner.pushing.send_replace(false);
        Ok(())
    }
}

/// `run` must be spawnable on a multi-threaded runtime (bindings do).
#[allow(dead_code)]
fn assert_run_is_send(session: &ConfigSession) {
    fn send<T: Send>(_: T) {}
    send(session.run(CancellationToken::new()));
}

/// How one connect attempt ended.
#[derive(Debug, PartialEq, Eq)]
enum AttemptEnd {
    Lost { accepted: bool },
    Rejected { accepted: bool },
    Redirect { peer: String, accepted: bool },
}

impl Inner {
    fn set_mode(&self, mode: DeliveryMode) {
        let changed = {
            let mut stats = self.stats.lock().unwrap();
            let changed = stats.mode != Some(mode);
            stats.mode = Some(mode);
            changed
        };
        if changed {
            tracing::info!(?mode, "config delivery mode");
            let _ = self.events.send(ConfigEvent::ModeChanged(mode));
        }
    }

    // ------------------------------------------------------------ polling

    async fn poll_loop(&self, home: &Client) {
        let mut pushing = self.pushing.subscribe();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.poll_interval) => {}
                _ = self.poll_now.notified() => {}
            }
            if *pushing.borrow_and_update() {
                continue;
            }
            self.poll_and_apply(home).await;
        }
    }

    async fn poll_and_apply(&self, home: &Client) {
        match self.poll(home).await {
            Ok(snapshot) => {
                // A push session may have started while the poll ran: its
                // updates win.
                if *self.pushing.borrow() {
                    return;
                }
                self.stats.lock().unwrap().polls += 1;
                self.set_mode(DeliveryMode::Poll);
                self.applier.apply(self, snapshot, DeliveryMode::Poll).await;
            }
            Err(err) => tracing::debug!(error = %err, "config poll failed"),
        }
    }

    /// One consistent snapshot: the configuration, and the environment it
    /// names (fetched again only when that identity changed).
    async fn poll(&self, home: &Client) -> Result<ConfigSnapshot, Error> {
        let cached = self.applier.last.lock().await.clone();
        for _ in 0..3 {
            let resolved = Resolved::new(home, &CallOptions::new(), DeadlineKind::Bounded);
            let (config, _): (GetSandboxConfigResponse, Metadata) = home
                .typed_unary(
                    GET_SANDBOX_CONFIG,
                    &GetSandboxConfigRequest {
                        sandbox_id: self.sandbox_id.clone(),
                    },
                    &resolved,
                )
                .await?;
            if let Some(last) = &cached
                && same_identity(&config, &last.provider_environment)
            {
                return Ok(ConfigSnapshot {
                    sandbox_config: config,
                    provider_environment: last.provider_environment.clone(),
                });
            }
            let (env, _): (GetSandboxProviderEnvironmentResponse, Metadata) = home
                .typed_unary(
                    GET_PROVIDER_ENVIRONMENT,
                    &GetSandboxProviderEnvironmentRequest {
                        sandbox_id: self.sandbox_id.clone(),
                    },
                    &resolved,
                )
                .await?;
            // A write between the two calls: read both again.
            if same_identity(&config, &env) {
                return Ok(ConfigSnapshot {
                    sandbox_config: config,
                    provider_environment: env,
                });
            }
        }
        Err(Error::protocol(
            "configuration kept changing between the config and environment reads",
        ))
    }

    // ------------------------------------------------------------ session

    async fn session_loop(self: &Arc<Self>, home: &Client) {
        let mut backoff = Backoff::reconnect();
        let mut epoch = 0u64;
        let mut target: Option<String> = None;
        let mut peer: Option<(String, Client)> = None;
        let mut redirected = false;
        let mut redirects_in_a_row = 0u32;
        loop {
            let client = match &target {
                None => home.clone(),
                Some(url) => match self.peer_client(&mut peer, url).await {
                    Ok(client) => client,
                    Err(err) => {
                        tracing::warn!(peer = url, error = %err, "cannot follow redirect");
                        target = None;
                        tokio::time::sleep(backoff.next_delay()).await;
                        continue;
                    }
                },
            };
            epoch += 1;
            let url = target
                .clone()
                .unwrap_or_else(|| self.config.endpoint().to_string());
            let end = self.attempt(&client, epoch, redirected, &mut backoff).await;
            tracing::debug!(gateway = url, epoch, ?end, "session attempt ended");
            target = match end {
                AttemptEnd::Redirect { peer, accepted } => {
                    if accepted {
                        redirects_in_a_row = 0;
                    }
                    redirects_in_a_row += 1;
                    redirected = true;
                    self.stats.lock().unwrap().redirects += 1;
                    if redirects_in_a_row > MAX_IMMEDIATE_REDIRECTS {
                        tokio::time::sleep(backoff.next_delay()).await;
                    }
                    Some(peer)
                }
                AttemptEnd::Lost { accepted } | AttemptEnd::Rejected { accepted } => {
                    if accepted {
                        redirected = false;
                    }
                    redirects_in_a_row = 0;
                    let delay = backoff.next_delay();
                    tracing::debug!(
                        delay_ms = delay.as_millis() as u64,
                        "reconnecting after backoff"
                    );
                    tokio::time::sleep(delay).await;
                    None
                }
            };
        }
    }

    async fn peer_client(
        &self,
        peer: &mut Option<(String, Client)>,
        url: &str,
    ) -> Result<Client, Error> {
        if let Some((known, client)) = peer
            && known == url
        {
            return Ok(client.clone());
        }
        let client = Client::connect_lazy(self.config.for_endpoint(url)?).await?;
        *peer = Some((url.to_owned(), client.clone()));
        Ok(client)
    }

    fn hello(&self, epoch: u64, redirected: bool) -> SupervisorMessage {
        SupervisorMessage {
            payload: Some(supervisor_message::Payload::Hello(SupervisorHello {
                sandbox_id: self.sandbox_id.clone(),
                instance_id: self.instance_id.clone(),
                connection_epoch: epoch,
                supports_provider_readiness: false,
                redirected,
                supports_session_redirect: true,
                supports_config_push: self.config_push,
                stay: self.stay,
            })),
        }
    }

    async fn emit(&self, event: SessionEvent) {
        if let Some(events) = &self.session_events {
            let _ = events.send(event).await;
        }
    }

    /// One connect attempt, running until the session ends.
    async fn attempt(
        self: &Arc<Self>,
        client: &Client,
        epoch: u64,
        redirected: bool,
        backoff: &mut Backoff,
    ) -> AttemptEnd {
        let opened = async {
            let mut stream = client
                .raw_stream(CONNECT_SUPERVISOR, Metadata::new(), CallOptions::new())
                .await?;
            stream
                .send(Bytes::from(self.hello(epoch, redirected).encode_to_vec()))
                .await?;
            let metadata = stream.response_metadata().await?;
            Ok::<_, Error>((stream, metadata))
        };
        let (stream, metadata) = match opened.await {
            Ok(opened) => opened,
            Err(err) => {
                tracing::warn!(error = %err, "session connect failed");
                return AttemptEnd::Lost { accepted: false };
            }
        };
        let served_by = metadata.get(SERVED_BY).map(str::to_owned);
        let (sender, mut receiver) = stream.split();

        // Everything towards the gateway goes through one queue.
        let (outbound, mut outbound_rx) = mpsc::channel::<SupervisorMessage>(OUTBOUND_MESSAGES);
        let pump_sender = sender.clone();
        let pump = tokio::spawn(async move {
            while let Some(message) = outbound_rx.recv().await {
                if pump_sender
                    .send(Bytes::from(message.encode_to_vec()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        let _stop_pump = AbortOnDrop(pump);
        // Config updates are applied one at a time, in order, beside the
        // receive loop (relay opens are never held up by an apply).
        let (updates, mut updates_rx) = mpsc::unbounded_channel::<ConfigUpdate>();
        let worker = {
            let outbound = outbound.clone();
            let this = self.clone();
            tokio::spawn(async move {
                while let Some(update) = updates_rx.recv().await {
                    let result = this.applier.apply_update(&this, update).await;
                    if outbound
                        .send(SupervisorMessage {
                            payload: Some(supervisor_message::Payload::ConfigUpdateResult(result)),
                        })
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            })
        };
        let _stop_worker = AbortOnDrop(worker);

        let mut heartbeat: Option<tokio::time::Interval> = None;
        let mut accepted = false;
        let mut push = false;
        let end = loop {
            let message = tokio::select! {
                message = receiver.recv() => message,
                _ = next_tick(&mut heartbeat) => {
                    let beat = SupervisorMessage {
                        payload: Some(supervisor_message::Payload::Heartbeat(SupervisorHeartbeat {})),
                    };
                    // A full queue already tells the gateway we are alive.
                    let _ = outbound.try_send(beat);
                    continue;
                }
            };
            let payload = match message {
                Ok(Some(bytes)) => match GatewayMessage::decode(bytes) {
                    Ok(GatewayMessage {
                        payload: Some(payload),
                    }) => payload,
                    Ok(_) => continue,
                    Err(err) => {
                        tracing::warn!(error = %err, "undecodable gateway message");
                        break AttemptEnd::Lost { accepted };
                    }
                },
                Ok(None) => {
                    tracing::info!(accepted, "session ended by the gateway");
                    break AttemptEnd::Lost { accepted };
                }
                Err(err) => {
                    tracing::warn!(accepted, error = %err, "session lost");
                    break AttemptEnd::Lost { accepted };
                }
            };
            match payload {
                gateway_message::Payload::SessionAccepted(accept) => {
                    let period = heartbeat_period(accept.heartbeat_interval);
                    push = accept.config_push_enabled;
                    tracing::info!(
                        session_id = accept.session_id,
                        heartbeat_secs = period.as_secs_f64(),
                        config_push = push,
                        "session accepted"
                    );
                    accepted = true;
                    backoff.reset();
                    let mut interval =
                        tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    heartbeat = Some(interval);
                    {
                        let mut stats = self.stats.lock().unwrap();
                        stats.sessions_accepted += 1;
                        stats.session_id = Some(accept.session_id.clone());
                        stats.served_by = served_by.clone();
                    }
                    if push {
                        self.pushing.send_replace(true);
                        self.set_mode(DeliveryMode::Push);
                        match accept.bootstrap {
                            Some(bootstrap) => {
                                let _ = updates.send(bootstrap);
                            }
                            None => tracing::warn!("push session accepted without a bootstrap"),
                        }
                    } else {
                        self.set_mode(DeliveryMode::Poll);
                    }
                    self.emit(SessionEvent::Accepted(SessionHandle {
                        session_id: accept.session_id,
                        served_by: served_by.clone(),
                        client: client.clone(),
                        outbound: outbound.clone(),
                        config_push: push,
                    }))
                    .await;
                }
                gateway_message::Payload::SessionRejected(reject) => {
                    tracing::warn!(reason = reject.reason, "session rejected");
                    break AttemptEnd::Rejected { accepted };
                }
                gateway_message::Payload::SessionRedirect(redirect) => {
                    if redirect.peer_endpoint.is_empty() {
                        tracing::warn!("redirect without a peer endpoint");
                        break AttemptEnd::Lost { accepted };
                    }
                    tracing::info!(
                        peer = redirect.peer_endpoint,
                        owner = redirect.owner_replica_id,
                        "session redirected"
                    );
                    break AttemptEnd::Redirect {
                        peer: redirect.peer_endpoint,
                        accepted,
                    };
                }
                gateway_message::Payload::Heartbeat(_) => {}
                gateway_message::Payload::ConfigUpdate(update) => {
                    let _ = updates.send(update);
                }
                other @ (gateway_message::Payload::RelayOpen(_)
                | gateway_message::Payload::RelayClose(_)) => {
                    if self.session_events.is_some() {
                        self.emit(SessionEvent::Message(Box::new(GatewayMessage {
                            payload: Some(other),
                        })))
                        .await;
                    } else if let gateway_message::Payload::RelayOpen(open) = other {
                        let _ = outbound.try_send(SupervisorMessage {
                            payload: Some(supervisor_message::Payload::RelayOpenResult(
                                RelayOpenResult {
                                    channel_id: open.channel_id,
                                    success: false,
                                    error: "this supervisor serves no relays".into(),
                                },
                            )),
                        });
                    }
                }
            }
        };
        if push {
            self.pushing.send_replace(false);
            self.poll_now.notify_one();
        }
        if accepted {
            {
                let mut stats = self.stats.lock().unwrap();
                stats.session_id = None;
                stats.served_by = None;
            }
            self.emit(SessionEvent::Ended).await;
        }
        sender.cancel();
        end
    }
}

/// Whether an environment is the one a configuration names.
fn same_identity(
    config: &GetSandboxConfigResponse,
    env: &GetSandboxProviderEnvironmentResponse,
) -> bool {
    config.provider_env_revision == env.provider_env_revision
        && config.provider_attachment_epoch == env.provider_attachment_epoch
        && config.policy_hash == env.policy_hash
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn next_tick(heartbeat: &mut Option<tokio::time::Interval>) {
    match heartbeat {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The advertised heartbeat interval, but never below 5 s (nor above an
/// hour, which keeps timer arithmetic sane whatever the gateway sends).
pub(crate) fn heartbeat_period(advertised: Option<prost_types::Duration>) -> Duration {
    let advertised = advertised
        .and_then(|d| {
            let seconds = Duration::from_secs(u64::try_from(d.seconds).ok()?);
            Some(seconds.saturating_add(Duration::from_nanos(u64::try_from(d.nanos).ok()?)))
        })
        .unwrap_or(MIN_HEARTBEAT);
    advertised.clamp(MIN_HEARTBEAT, MAX_HEARTBEAT)
}

// ---------------------------------------------------------------- applying

struct Applier {
    apply: ApplyWithModeFn,
    /// The last applied snapshot.
    last: tokio::sync::Mutex<Option<ConfigSnapshot>>,
}

/// Removes provider environment values (and anything past the bound) from
/// a rejection reason.
fn scrub(reason: &str, snapshot: &ConfigSnapshot) -> String {
    let mut text = reason.to_owned();
    for value in snapshot.provider_environment.environment.values() {
        if value.len() >= 4 && text.contains(value.as_str()) {
            text = text.replace(value.as_str(), "<redacted>");
        }
    }
    let mut bounded: String = text.chars().take(MAX_REASON).collect();
    if bounded.len() < text.len() {
        bounded.push_str("...");
    }
    bounded
}

impl Applier {
    /// Applies a snapshot unless it equals the last applied one. Returns
    /// the outcome, the reason (REJECTED) and the policy status.
    async fn apply(
        &self,
        inner: &Inner,
        snapshot: ConfigSnapshot,
        mode: DeliveryMode,
    ) -> (ConfigApplyOutcome, String, PolicyStatus) {
        let mut last = self.last.lock().await;
        if last.as_ref() == Some(&snapshot) {
            return (
                ConfigApplyOutcome::IgnoredDuplicate,
                String::new(),
                PolicyStatus::Unspecified,
            );
        }
        let policy_changed = last
            .as_ref()
            .is_none_or(|l| l.sandbox_config.policy_hash != snapshot.sandbox_config.policy_hash);
        let apply = self.apply.clone();
        let given = snapshot.clone();
        let outcome = match tokio::task::spawn_blocking(move || apply(given, mode)).await {
            Ok(outcome) => outcome,
            Err(_) => ApplyOutcome::Rejected("the apply function panicked".into()),
        };
        match outcome {
            ApplyOutcome::Applied => {
                {
                    let mut stats = inner.stats.lock().unwrap();
                    stats.applied += 1;
                    stats.config_revision = snapshot.sandbox_config.config_revision;
                }
                let _ = inner.events.send(ConfigEvent::Applied {
                    mode,
                    config_revision: snapshot.sandbox_config.config_revision,
                    provider_env_revision: snapshot.provider_environment.provider_env_revision,
                });
                *last = Some(snapshot);
                let status = if policy_changed {
                    PolicyStatus::Loaded
                } else {
                    PolicyStatus::Unspecified
                };
                (ConfigApplyOutcome::Applied, String::new(), status)
            }
            ApplyOutcome::Rejected(reason) => {
                let reason = scrub(&reason, &snapshot);
                inner.stats.lock().unwrap().rejected += 1;
                tracing::warn!(reason, "configuration rejected");
                let _ = inner.events.send(ConfigEvent::Rejected {
                    mode,
                    reason: reason.clone(),
                });
                let status = if policy_changed {
                    PolicyStatus::Failed
                } else {
                    PolicyStatus::Unspecified
                };
                (ConfigApplyOutcome::Rejected, reason, status)
            }
        }
    }

    async fn apply_update(&self, inner: &Inner, update: ConfigUpdate) -> ConfigUpdateResult {
        inner.stats.lock().unwrap().updates_received += 1;
        let (outcome, error, policy_status) =
            match (update.sandbox_config, update.provider_environment) {
                (Some(sandbox_config), Some(provider_environment)) => {
                    let snapshot = ConfigSnapshot {
                        sandbox_config,
                        provider_environment,
                    };
                    self.apply(inner, snapshot, DeliveryMode::Push).await
                }
                _ => (
                    ConfigApplyOutcome::Rejected,
                    "update without a full snapshot".to_owned(),
                    PolicyStatus::Unspecified,
                ),
            };
        {
            let mut stats = inner.stats.lock().unwrap();
            stats.last_update_id = update.update_id;
            if outcome == ConfigApplyOutcome::IgnoredDuplicate {
                stats.duplicates += 1;
            }
        }
        ConfigUpdateResult {
            update_id: update.update_id,
            outcome: outcome as i32,
            error,
            policy_status: policy_status as i32,
        }
    }
}

// ---------------------------------------------------------------- backoff

/// Reconnect backoff: each delay doubles the previous one up to `max`;
/// reset once a session was accepted.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `initial`, doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial.min(max),
        }
    }

    /// The session reconnect policy: 1 s doubling to 30 s.
    pub fn reconnect() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(30))
    }

    /// Delay to wait now; the following one doubles.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = delay.saturating_mul(2).min(self.max);
        delay
    }

    /// Back to the initial delay (after a session was accepted).
    pub fn reset(&mut self) {
        self.next = self.initial.min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn duration(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
        Some(prost_types::Duration { seconds, nanos })
    }

    #[test]
    fn heartbeat_is_never_faster_than_five_seconds() {
        assert_eq!(heartbeat_period(None), Duration::from_secs(5));
        assert_eq!(heartbeat_period(duration(1, 0)), Duration::from_secs(5));
        assert_eq!(heartbeat_period(duration(-3, 0)), Duration::from_secs(5));
        assert_eq!(heartbeat_period(duration(12, 0)), Duration::from_secs(12));
        assert_eq!(
            heartbeat_period(duration(7, 500_000_000)),
            Duration::from_millis(7500)
        );
        assert_eq!(
            heartbeat_period(duration(i64::MAX, 999_999_999)),
            Duration::from_secs(3600)
        );
    }

    fn secs(delays: &[Duration]) -> Vec<u64> {
        delays.iter().map(Duration::as_secs).collect()
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut backoff = Backoff::reconnect();
        let delays: Vec<_> = (0..8).map(|_| backoff.next_delay()).collect();
        assert_eq!(secs(&delays), [1, 2, 4, 8, 16, 30, 30, 30]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_secs(1));
        assert_eq!(backoff.next_delay(), Duration::from_secs(2));
        let mut capped = Backoff::new(Duration::from_secs(10), Duration::from_secs(3));
        assert_eq!(capped.next_delay(), Duration::from_secs(3));
        assert_eq!(capped.next_delay(), Duration::from_secs(3));
    }

    fn snapshot(revision: u64, secret: &str) -> ConfigSnapshot {
        let mut snapshot = ConfigSnapshot::default();
        snapshot.sandbox_config.config_revision = revision;
        snapshot.sandbox_config.policy_hash = format!("hash-{revision}");
        snapshot
            .provider_environment
            .environment
            .insert("TOKEN".into(), secret.into());
        snapshot
    }

    #[test]
    fn snapshots_never_show_environment_values() {
        let text = format!("{:?}", snapshot(1, "very-secret-value"));
        assert!(!text.contains("very-secret-value"), "{text}");
        assert!(text.contains("TOKEN"));
    }

    #[test]
    fn rejection_reasons_are_scrubbed_and_bounded() {
        let s = snapshot(1, "very-secret-value");
        assert_eq!(
            scrub("bad value very-secret-value here", &s),
            "bad value <redacted> here"
        );
        let long = "x".repeat(1000);
        assert_eq!(scrub(&long, &s).chars().count(), MAX_REASON + 3);
    }

    async fn session(apply: ApplyFn) -> ConfigSession {
        let config = ClientConfig::builder("http://127.0.0.1:1").build().unwrap();
        ConfigSession::builder(config, "sb-1")
            .apply(apply)
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn updates_are_answered_applied_duplicate_or_rejected() {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let apply: ApplyFn = Arc::new(move |snapshot: ConfigSnapshot| {
            seen.fetch_add(1, Ordering::SeqCst);
            if snapshot.sandbox_config.config_revision == 3 {
                ApplyOutcome::Rejected("revision 3 holds very-secret-value".into())
            } else {
                ApplyOutcome::Applied
            }
        });
        let session = session(apply).await;
        let inner = &session.inner;
        let update = |id: u64, revision: u64| {
            let s = snapshot(revision, "very-secret-value");
            ConfigUpdate {
                update_id: id,
                sandbox_config: Some(s.sandbox_config),
                provider_environment: Some(s.provider_environment),
            }
        };
        let first = inner.applier.apply_update(inner, update(1, 1)).await;
        assert_eq!(first.outcome, ConfigApplyOutcome::Applied as i32);
        assert_eq!(first.policy_status, PolicyStatus::Loaded as i32);
        let again = inner.applier.apply_update(inner, update(2, 1)).await;
        assert_eq!(again.outcome, ConfigApplyOutcome::IgnoredDuplicate as i32);
        let rejected = inner.applier.apply_update(inner, update(3, 3)).await;
        assert_eq!(rejected.outcome, ConfigApplyOutcome::Rejected as i32);
        assert_eq!(rejected.policy_status, PolicyStatus::Failed as i32);
        assert!(
            !rejected.error.contains("very-secret-value"),
            "{}",
            rejected.error
        );
        // A rejected snapshot is tried again when it comes again.
        let retried = inner.applier.apply_update(inner, update(4, 3)).await;
        assert_eq!(retried.outcome, ConfigApplyOutcome::Rejected as i32);
        let partial = inner
            .applier
            .apply_update(
                inner,
                ConfigUpdate {
                    update_id: 5,
                    sandbox_config: None,
                    provider_environment: None,
                },
            )
            .await;
        assert_eq!(partial.outcome, ConfigApplyOutcome::Rejected as i32);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        let stats = session.stats();
        assert_eq!((stats.applied, stats.rejected, stats.duplicates), (1, 2, 1));
        assert_eq!(stats.last_update_id, 5);
        assert_eq!(stats.config_revision, 1);
    }

    #[tokio::test]
    async fn the_builder_validates() {
        let config = ClientConfig::builder("http://127.0.0.1:1").build().unwrap();
        let apply: ApplyFn = Arc::new(|_| ApplyOutcome::Applied);
        let err = ConfigSession::builder(config.clone(), "sb")
            .build()
            .unwrap_err();
        assert_eq!(err.code(), "invalid_config");
        let err = ConfigSession::builder(config.clone(), " ")
            .apply(apply.clone())
            .build()
            .unwrap_err();
        assert_eq!(err.code(), "invalid_config");
        let err = ConfigSession::builder(config, "sb")
            .apply(apply)
            .poll_interval(Duration::ZERO)
            .build()
            .unwrap_err();
        assert_eq!(err.code(), "invalid_config");
    }
}
