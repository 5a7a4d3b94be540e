//! The host side of a shared supervisor host's session (`host_session`):
//! one `ConnectHost` stream for a process that serves many sandboxes.
//!
//! A [`HostSession`] holds the host's session with the gateway and carries
//! every assigned sandbox's ordinary session (a [`ConfigSession`], built by
//! [`HostSession::sandbox_session`]) inside it. What it does:
//!
//! 1. **Hello.** `HostHello{member_id, instance_id, connection_epoch,
//!    redirected, stay, capacity}`; the gateway answers `accepted`,
//!    `rejected` or `redirect`.
//! 2. **Placement.** A hello without `stay` may be redirected to the replica
//!    the ring and the cap choose. A redirect (at connect, or when a replica
//!    stops) is followed at once, without backoff, with `stay` and
//!    `redirected` set; at most 4 in a row without an accepted session, then
//!    the backoff applies.
//! 3. **Sticky redial.** When an accepted session is lost (a connection blip,
//!    a token refresh), the host dials the same replica again, with `stay`:
//!    the peer URL it was redirected to, or, when it came in through the
//!    shared address, that address with `x-openshell-replica` naming the
//!    replica that accepted it. A stale ring cannot bounce it around.
//! 4. **Fallbacks.** If following a redirect cannot connect, the host falls
//!    back to the shared address *with* `stay` (the target is down; the
//!    replica the edge picks keeps it). If a sticky redial cannot connect
//!    (the replica is gone), the host falls back to the shared address
//!    *without* `stay`, so placement runs again and crashes end even.
//!    Other failures retry after a backoff of 1 s doubling to 30 s, reset
//!    by an accepted session.
//! 5. **Assignment.** The gateway sends the full list of sandboxes assigned
//!    to the host, again whenever it changes ([`HostEvent::Assignment`]).
//!    Sandboxes outlive the host's session: when it moves to another
//!    replica their sessions reopen inside the new one and their processes
//!    go on.
//!
//! With [`HostSessionBuilder::apply`] and no events consumer, [`run`](
//! HostSession::run) serves configuration for every assigned sandbox itself
//! (what the language bindings export); the reference supervisor instead
//! takes [`HostSession::events`] and runs one session per sandbox, with its
//! relays.
//!
//! # Files
//!
//! - this file: the public types, the builder, `run`, and the carrier that
//!   sandbox sessions ride on;
//! - `host_loop`: dialling, hello, redirects, sticky redials and fallbacks,
//!   heartbeats, assignment and the sandbox envelopes.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use openshell_proto::supervisor_host::{HostMessage, SandboxSupervisorMessage, host_message};
use openshell_proto::{GatewayMessage, SupervisorMessage};
use tokio::sync::{OnceCell, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::config::ClientConfig;
use crate::config_session::{
    ApplyOutcome, CarriedSend, CarriedSession, Carrier, ConfigSession, ConfigSessionBuilder,
    ConfigSnapshot,
};
use crate::error::Error;

mod host_loop;

/// Messages queued for one sandbox's session before it is considered stuck
/// (and ended, so one slow sandbox never stalls the host's session).
const SANDBOX_INBOUND: usize = 256;
/// Messages queued towards the gateway on the host's session.
const HOST_OUTBOUND: usize = 256;

/// A sandbox assigned to the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignedSandbox {
    /// The sandbox id.
    pub sandbox_id: String,
    /// The sandbox name.
    pub name: String,
    /// The spec's environment, for the sandbox's processes.
    pub environment: BTreeMap<String, String>,
    /// What the host must limit the sandbox to.
    pub limits: ResourceLimits,
}

/// A sandbox's resource limits, as the gateway resolved them; `None`: no
/// limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceLimits {
    /// Memory of all its processes together, in bytes.
    pub memory_bytes: Option<u64>,
    /// CPU in thousandths of a core.
    pub cpu_millis: Option<u64>,
    /// Processes and threads at once.
    pub pids: Option<u64>,
}

/// Host session life.
#[derive(Debug, Clone)]
pub enum HostEvent {
    /// The host's session was accepted.
    Accepted {
        /// The gateway's session id.
        session_id: String,
        /// The replica holding it.
        served_by: Option<String>,
    },
    /// The full list of sandboxes assigned to the host (sent after every
    /// acceptance and whenever it changes).
    Assignment(Vec<AssignedSandbox>),
    /// The accepted session ended (sandboxes keep running; their sessions
    /// reopen inside the next one).
    Ended,
}

/// Counters of a [`HostSession`].
#[derive(Debug, Clone, Default)]
pub struct HostStats {
    /// Host sessions accepted.
    pub sessions_accepted: u64,
    /// Redirects followed.
    pub redirects: u64,
    /// Redials of the replica that held a lost session (with `stay`).
    pub sticky_redials: u64,
    /// Falls back to the shared address after a redirect target or a
    /// sticky redial could not be reached.
    pub fallbacks: u64,
    /// Whether the last hello carried `stay`.
    pub stay: bool,
    /// The current session id, while one is accepted.
    pub session_id: Option<String>,
    /// The replica holding the current session.
    pub served_by: Option<String>,
    /// Sandboxes in the last assignment.
    pub assigned: usize,
}

/// A host's apply function: the sandbox id, then the snapshot. Called on a
/// blocking thread, one call at a time per sandbox.
pub type HostApplyFn = Arc<dyn Fn(&str, ConfigSnapshot) -> ApplyOutcome + Send + Sync>;

/// Builds a [`HostSession`].
pub struct HostSessionBuilder {
    config: ClientConfig,
    member_id: String,
    instance_id: Option<String>,
    capacity: u32,
    config_push: bool,
    events: Option<mpsc::Sender<HostEvent>>,
    apply: Option<HostApplyFn>,
}

impl HostSessionBuilder {
    /// The host instance id (default: a new UUID). Stable for the life of
    /// the process.
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.instance_id = Some(id.into());
        self
    }

    /// Most sandboxes this host serves at once (0, the default: no limit).
    pub fn capacity(mut self, capacity: u32) -> Self {
        self.capacity = capacity;
        self
    }

    /// Whether sandbox sessions announce `supports_config_push` (default
    /// true; off, they poll `GetSandboxConfig`).
    pub fn config_push(mut self, announce: bool) -> Self {
        self.config_push = announce;
        self
    }

    /// Receives host session life and assignments (see [`HostEvent`]). The
    /// receiver then runs the sandbox sessions itself.
    pub fn events(mut self, events: mpsc::Sender<HostEvent>) -> Self {
        self.events = Some(events);
        self
    }

    /// Serves configuration for every assigned sandbox through `apply`
    /// (used when no [`events`](Self::events) consumer is set).
    pub fn apply(mut self, apply: HostApplyFn) -> Self {
        self.apply = Some(apply);
        self
    }

    /// Validates and returns the session (nothing connects until `run`).
    pub fn build(self) -> Result<HostSession, Error> {
        let member_id = self.member_id.trim();
        if member_id.is_empty() {
            return Err(Error::invalid_config("host member id is empty"));
        }
        if member_id.len() > 128 || member_id.chars().any(char::is_control) {
            return Err(Error::invalid_config(
                "host member id must be at most 128 characters, none of them control characters",
            ));
        }
        if self.events.is_none() && self.apply.is_none() {
            return Err(Error::invalid_config(
                "a host session needs an events receiver or an apply function",
            ));
        }
        Ok(HostSession {
            inner: Arc::new(HostInner {
                config: self.config,
                member_id: member_id.to_owned(),
                instance_id: self
                    .instance_id
                    .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
                capacity: self.capacity,
                config_push: self.config_push,
                events: self.events,
                apply: self.apply,
                home: OnceCell::new(),
                link: watch::channel(None).0,
                assignment: watch::channel(None).0,
                stats: Mutex::new(HostStats::default()),
                sandbox_tasks: tokio_util::task::TaskTracker::new(),
            }),
        })
    }
}

/// The host side of a shared supervisor host's session. Cheap to clone;
/// clones share state.
#[derive(Clone)]
pub struct HostSession {
    inner: Arc<HostInner>,
}

/// An accepted host session, as sandbox sessions see it.
#[derive(Clone)]
struct Link {
    client: Client,
    served_by: Option<String>,
    outbound: mpsc::Sender<HostMessage>,
    /// The gateway's messages per sandbox session open inside this one.
    routes: Arc<Mutex<HashMap<String, mpsc::Sender<Box<GatewayMessage>>>>>,
    ended: CancellationToken,
}

struct HostInner {
    config: ClientConfig,
    member_id: String,
    instance_id: String,
    capacity: u32,
    config_push: bool,
    events: Option<mpsc::Sender<HostEvent>>,
    apply: Option<HostApplyFn>,
    /// The client on the shared address (polls, and the first dial).
    home: OnceCell<Client>,
    /// The accepted session, while there is one.
    link: watch::Sender<Option<Link>>,
    /// The last assignment (kept across sessions).
    assignment: watch::Sender<Option<Vec<AssignedSandbox>>>,
    stats: Mutex<HostStats>,
    /// The assigned sandboxes' sessions (auto mode): `run` waits for them.
    sandbox_tasks: tokio_util::task::TaskTracker,
}

impl fmt::Debug for HostSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostSession")
            .field("member_id", &self.inner.member_id)
            .field("instance_id", &self.inner.instance_id)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl HostSession {
    /// Starts a builder. `config` names the gateway's shared address (the
    /// edge in a cluster) and carries the host token as its bearer token.
    pub fn builder(config: ClientConfig, member_id: impl Into<String>) -> HostSessionBuilder {
        HostSessionBuilder {
            config,
            member_id: member_id.into(),
            instance_id: None,
            capacity: 0,
            config_push: true,
            events: None,
            apply: None,
        }
    }

    /// A copy of the counters.
    pub fn stats(&self) -> HostStats {
        self.inner.stats.lock().unwrap().clone()
    }

    /// The host's member id.
    pub fn member_id(&self) -> &str {
        &self.inner.member_id
    }

    /// The instance id sent in every hello.
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }

    /// A builder of the session of one assigned sandbox, riding inside this
    /// host's session: give it an apply function (and session events, to
    /// serve relays) and run it for as long as the sandbox is assigned.
    pub fn sandbox_session(&self, sandbox_id: impl Into<String>) -> ConfigSessionBuilder {
        ConfigSession::builder(self.inner.config.clone(), sandbox_id)
            .config_push(self.inner.config_push)
            .carried_by(self.inner.clone())
    }

    /// Runs until `cancel` fires. Returns an error only when the gateway
    /// endpoint is unusable (`invalid_config`, `tls`).
    pub async fn run(&self, cancel: CancellationToken) -> Result<(), Error> {
        let home = self.inner.home().await?;
        let inner = self.inner.clone();
        let auto = inner.events.is_none();
        let work = async move {
            if auto {
                tokio::join!(inner.host_loop(&home), inner.serve_assigned());
            } else {
                inner.host_loop(&home).await;
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = work => {}
        }
        // Dropping `work` cancelled the sandboxes' sessions (auto mode);
        // return once they are gone, so no apply runs after `run` did.
        self.inner.sandbox_tasks.close();
        self.inner.sandbox_tasks.wait().await;
        self.inner.sandbox_tasks.reopen();
        Ok(())
    }
}

/// `run` must be spawnable on a multi-threaded runtime (bindings do).
#[allow(dead_code)]
fn assert_run_is_send(session: &HostSession) {
    fn send<T: Send>(_: T) {}
    send(session.run(CancellationToken::new()));
}

impl HostInner {
    async fn home(&self) -> Result<Client, Error> {
        self.home
            .get_or_try_init(|| Client::connect_lazy(self.config.clone()))
            .await
            .cloned()
    }

    async fn emit(&self, event: HostEvent) {
        if let Some(events) = &self.events {
            let _ = events.send(event).await;
        }
    }

    /// Without an events consumer: one config session per assigned
    /// sandbox, started and stopped as the assignment changes.
    async fn serve_assigned(self: &Arc<Self>) {
        let Some(apply) = self.apply.clone() else {
            return;
        };
        let mut assignment = self.assignment.subscribe();
        // Every sandbox session stops when this future ends or is dropped
        // (the host session's run was cancelled).
        let scope = CancellationToken::new();
        let _stop_all = scope.clone().drop_guard();
        let mut running: HashMap<String, CancellationToken> = HashMap::new();
        loop {
            let wanted: Vec<String> = assignment
                .borrow_and_update()
                .iter()
                .flatten()
                .map(|s| s.sandbox_id.clone())
                .collect();
            running.retain(|id, stop| {
                let keep = wanted.contains(id);
                if !keep {
                    stop.cancel();
                }
                keep
            });
            for id in wanted {
                if running.contains_key(&id) {
                    continue;
                }
                let apply = apply.clone();
                let sandbox = id.clone();
                let built = ConfigSession::builder(self.config.clone(), id.clone())
                    .config_push(self.config_push)
                    .carried_by(self.clone())
                    .apply(Arc::new(move |snapshot| apply(&sandbox, snapshot)))
                    .build();
                let session = match built {
                    Ok(session) => session,
                    Err(err) => {
                        tracing::warn!(sandbox_id = id, error = %err, "cannot serve sandbox");
                        continue;
                    }
                };
                let stop = scope.child_token();
                running.insert(id, stop.clone());
                self.sandbox_tasks.spawn(async move {
                    let _ = session.run(stop).await;
                });
            }
            if assignment.changed().await.is_err() {
                break;
            }
        }
        for stop in running.values() {
            stop.cancel();
        }
    }
}

/// Ends one sandbox's session inside the host's when dropped.
struct Registration {
    sandbox_id: String,
    link: Link,
    inbound: mpsc::WeakSender<Box<GatewayMessage>>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut routes = self.link.routes.lock().unwrap();
        // Only our own route: a newer session of the sandbox may own it.
        let ours = routes.get(&self.sandbox_id).is_some_and(|tx| {
            self.inbound
                .upgrade()
                .is_some_and(|mine| mine.same_channel(tx))
        });
        if ours {
            routes.remove(&self.sandbox_id);
            drop(routes);
            let end = HostMessage {
                payload: Some(host_message::Payload::Sandbox(SandboxSupervisorMessage {
                    sandbox_id: self.sandbox_id.clone(),
                    message: None,
                    end: true,
                })),
            };
            // A full queue or a closed session: the gateway ends the
            // sandbox's session with the host's anyway.
            let _ = self.link.outbound.try_send(end);
        }
    }
}

impl Carrier for HostInner {
    fn home(&self) -> BoxFuture<'_, Result<Client, Error>> {
        Box::pin(HostInner::home(self))
    }

    fn open(&self, sandbox_id: String, hello: SupervisorMessage) -> BoxFuture<'_, CarriedSession> {
        Box::pin(async move {
            let mut links = self.link.subscribe();
            loop {
                let link = links.borrow_and_update().clone();
                if let Some(link) = link.filter(|l| !l.ended.is_cancelled()) {
                    let (inbound_tx, inbound) = mpsc::channel(SANDBOX_INBOUND);
                    let weak = inbound_tx.downgrade();
                    link.routes
                        .lock()
                        .unwrap()
                        .insert(sandbox_id.clone(), inbound_tx);
                    // The hello goes first; then each message is wrapped as
                    // the session's pump sends it (no queue or task of its
                    // own: a host holds one session per sandbox).
                    let _ = link.outbound.send(envelope(&sandbox_id, hello)).await;
                    let to = link.outbound.clone();
                    let wrapped_id = sandbox_id.clone();
                    let outbound: CarriedSend = Box::new(move |message| {
                        let (to, envelope) = (to.clone(), envelope(&wrapped_id, message));
                        Box::pin(async move { to.send(envelope).await.is_ok() })
                    });
                    return CarriedSession {
                        client: link.client.clone(),
                        served_by: link.served_by.clone(),
                        inbound,
                        outbound,
                        carrier_ended: link.ended.clone(),
                        _registration: Box::new(Registration {
                            sandbox_id,
                            link,
                            inbound: weak,
                        }),
                    };
                }
                if links.changed().await.is_err() {
                    // The host session is gone for good; nothing will come.
                    std::future::pending::<()>().await;
                }
            }
        })
    }
}

/// A sandbox's message inside the host's session.
fn envelope(sandbox_id: &str, message: SupervisorMessage) -> HostMessage {
    HostMessage {
        payload: Some(host_message::Payload::Sandbox(SandboxSupervisorMessage {
            sandbox_id: sandbox_id.to_owned(),
            message: Some(message),
            end: false,
        })),
    }
}
