//! The supervisor side of the session protocol, with push configuration
//! (`config_session`: what a supervisor needs to hold its session and
//! receive its sandbox's configuration).
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
//!    [`ConfigSessionBuilder::config_push`] turned it off)}`.
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
//!
//! # Files
//!
//! - this file: the public types, the builder and [`ConfigSession::run`];
//! - `session_loop`: connect attempts, hello, redirects, heartbeats, relay
//!   messages (steps 2, 3, 5, 6);
//! - `poll`: the `GetSandboxConfig` fallback and the startup poll (step 1);
//! - `apply`: applying snapshots one at a time and answering each pushed
//!   update (step 4);
//! - `backoff`: the reconnect delays.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use openshell_proto::sandbox::GetSandboxConfigResponse;
use openshell_proto::{GatewayMessage, GetSandboxProviderEnvironmentResponse, SupervisorMessage};
use tokio::sync::{Notify, broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::config::ClientConfig;
use crate::error::Error;

mod apply;
mod backoff;
mod poll;
mod session_loop;

use apply::Applier;
pub use backoff::Backoff;
pub(crate) use session_loop::{AbortOnDrop, heartbeat_period, next_tick};

/// Default interval of `GetSandboxConfig` polls when the gateway does not push.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(10);
/// How long the end of `run` waits for an apply call still running.
const APPLY_DRAIN: Duration = Duration::from_secs(10);
/// Events kept for a subscriber that has not read them yet (a slower one
/// gets `Lagged`).
const EVENTS_BUFFERED: usize = 64;

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
    /// Sends `SupervisorMessage`s on this session (relay results, closes);
    /// boxed, so an idle session's queue stays small.
    pub outbound: mpsc::Sender<Box<SupervisorMessage>>,
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
    Accepted(Box<SessionHandle>),
    /// A gateway message [`ConfigSession`] does not handle (`RelayOpen`,
    /// `RelayClose`), on the current session.
    Message(Box<GatewayMessage>),
    /// The accepted session ended: whatever it started should stop.
    Ended,
}

// ---------------------------------------------------------------- carried sessions

/// What carries sandbox sessions inside another session: a shared host's
/// (`host_session`). The sandbox session's protocol is unchanged; only the
/// wire differs.
pub(crate) trait Carrier: Send + Sync + 'static {
    /// The client polls go through (the host's, with its token).
    fn home(&self) -> BoxFuture<'_, Result<Client, Error>>;
    /// Opens the sandbox's session once the carrier has an accepted session
    /// (waiting for one), sending `hello` first.
    fn open(&self, sandbox_id: String, hello: SupervisorMessage) -> BoxFuture<'_, CarriedSession>;
}

/// Sends one sandbox message through its carrier: false once the carrier's
/// session is gone.
pub(crate) type CarriedSend =
    Box<dyn Fn(SupervisorMessage) -> BoxFuture<'static, bool> + Send + Sync>;

/// One sandbox session inside a carrier's session. Dropping it ends the
/// sandbox's session towards the gateway.
pub(crate) struct CarriedSession {
    /// A client on the carrier's current connection (relay claims ride it).
    pub client: Client,
    /// The replica holding the carrier's session.
    pub served_by: Option<String>,
    /// The gateway's messages for this sandbox; closed when either the
    /// gateway ended the sandbox's session or the carrier's session ended.
    /// Boxed: a channel allocates room for 32 messages up front, and a
    /// host holds one per sandbox.
    pub inbound: mpsc::Receiver<Box<GatewayMessage>>,
    /// Sends a message for the gateway (the carrier wraps it); false once
    /// the carrier's session is gone.
    pub outbound: CarriedSend,
    /// Cancelled when the carrier's session ended.
    pub carrier_ended: CancellationToken,
    /// Whatever the carrier keeps while the sandbox's session is open.
    pub _registration: Box<dyn Send + Sync>,
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
    config_push: bool,
    ssh_host_key_fingerprint: String,
    carrier: Option<Arc<dyn Carrier>>,
}

impl ConfigSessionBuilder {
    /// The session rides inside `carrier`'s session (a shared host's).
    pub(crate) fn carried_by(mut self, carrier: Arc<dyn Carrier>) -> Self {
        self.carrier = Some(carrier);
        self
    }

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

    /// Whether the hello announces `supports_config_push` (default true).
    /// Off, the session never gets pushed configuration and keeps polling
    /// `GetSandboxConfig`, whatever the gateway's mode: what a supervisor
    /// that predates push does.
    pub fn config_push(mut self, announce: bool) -> Self {
        self.config_push = announce;
        self
    }

    /// The fingerprint (`SHA256:<base64>`) of the host key of the SSH server
    /// the supervisor runs for SSH relays; sent in the hello, and the
    /// gateway reports it to clients. Empty (the default): none.
    pub fn ssh_host_key_fingerprint(mut self, fingerprint: impl Into<String>) -> Self {
        self.ssh_host_key_fingerprint = fingerprint.into();
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
        Ok(ConfigSession {
            inner: Arc::new(Inner {
                config: self.config,
                sandbox_id: self.sandbox_id,
                instance_id: self
                    .instance_id
                    .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
                poll_interval: self.poll_interval,
                session_events: self.events,
                config_push: self.config_push,
                ssh_host_key_fingerprint: self.ssh_host_key_fingerprint,
                carrier: self.carrier,
                applier: Applier {
                    apply,
                    last: tokio::sync::Mutex::new(None),
                    busy: Arc::default(),
                },
                stats: Mutex::new(ConfigSessionStats::default()),
                events: std::sync::OnceLock::new(),
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
    /// Announce `supports_config_push` in the hello.
    config_push: bool,
    ssh_host_key_fingerprint: String,
    /// Set for a sandbox served by a shared host: the session rides inside
    /// the host's session.
    carrier: Option<Arc<dyn Carrier>>,
    applier: Applier,
    stats: Mutex<ConfigSessionStats>,
    /// Made by the first [`ConfigSession::subscribe`]: until someone
    /// listens, events are not buffered (a shared host holds one session per
    /// sandbox, and a broadcast channel allocates all its slots up front).
    events: std::sync::OnceLock<broadcast::Sender<ConfigEvent>>,
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
            config_push: true,
            ssh_host_key_fingerprint: String::new(),
            carrier: None,
        }
    }

    /// A copy of the counters.
    pub fn stats(&self) -> ConfigSessionStats {
        self.inner.stats.lock().unwrap().clone()
    }

    /// Configuration events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ConfigEvent> {
        self.inner
            .events
            .get_or_init(|| broadcast::channel(EVENTS_BUFFERED).0)
            .subscribe()
    }

    /// The instance id sent in every hello.
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }

    /// Runs until `cancel` fires: the startup poll, then the session loop
    /// and the poll loop. Returns an error only when the gateway endpoint is
    /// unusable (`invalid_config`, `tls`).
    pub async fn run(&self, cancel: CancellationToken) -> Result<(), Error> {
        let home = match &self.inner.carrier {
            Some(carrier) => carrier.home().await?,
            None => Client::connect_lazy(self.inner.config.clone()).await?,
        };
        let inner = self.inner.clone();
        let work = async move {
            // Supervisors start as they always did: from polled configuration.
            Box::pin(inner.poll_and_apply(&home)).await;
            tokio::join!(inner.poll_loop(&home), inner.session_loop(&home));
        };
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = work => {}
        }
        self.inner.pushing.send_replace(false);
        // An apply call still running returns before we do (within a bound:
        // a call stuck for good must not hold `run` forever; none starts
        // after this point either way).
        if tokio::time::timeout(APPLY_DRAIN, self.inner.applier.busy.lock())
            .await
            .is_err()
        {
            tracing::warn!("an apply call is still running after the session ended");
        }
        Ok(())
    }
}

/// `run` must be spawnable on a multi-threaded runtime (bindings do).
#[allow(dead_code)]
fn assert_run_is_send(session: &ConfigSession) {
    fn send<T: Send>(_: T) {}
    send(session.run(CancellationToken::new()));
}

impl Inner {
    /// Sends `event` to the subscribers, if there are any.
    fn emit_config(&self, event: ConfigEvent) {
        if let Some(events) = self.events.get() {
            let _ = events.send(event);
        }
    }

    /// Sets the mode `decide` returns (none: unchanged), deciding under the
    /// stats lock, so a push session's start and a poll's end are ordered.
    fn set_mode_with(
        &self,
        decide: impl FnOnce(&mut ConfigSessionStats) -> Option<DeliveryMode>,
    ) -> Option<DeliveryMode> {
        let (mode, changed) = {
            let mut stats = self.stats.lock().unwrap();
            let mode = decide(&mut stats)?;
            let changed = stats.mode != Some(mode);
            stats.mode = Some(mode);
            (mode, changed)
        };
        if changed {
            tracing::info!(?mode, "config delivery mode");
            self.emit_config(ConfigEvent::ModeChanged(mode));
        }
        Some(mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
