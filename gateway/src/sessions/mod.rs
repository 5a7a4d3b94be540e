//! Supervisor sessions held by this replica, and the relays opened over them.
//!
//! A relay is how exec and forward reach a sandbox: the gateway registers a
//! pending channel, sends `RelayOpen` on the sandbox's session, and the
//! supervisor claims the channel by opening `RelayStream` with `init`. The
//! waiter then owns both directions of that stream ([`Relay`]). A relay to a
//! sandbox whose session another replica holds has the same shape, built on
//! the peer service instead (see `relay_routing`). Pending channels are
//! removed when the waiter gives up, so a late claim finds nothing.
//!
//! Outbound traffic of a session has two queues merged into its response
//! stream ([`GatewayStream`]): one for acceptance, heartbeats, relay opens
//! and redirects, and a small one of its own for pushed configuration
//! updates (at most one is in flight, see `config::delivery`). A burst of
//! relay opens therefore never takes the config path's room, nor the other
//! way round. Nothing on the session task waits on a queue: a heartbeat that
//! finds its queue full is skipped (the queue is busy anyway), and a relay
//! open waits at most [`RELAY_OPEN_SEND_TIMEOUT`] for room. What closes a
//! session for load is only a stream that stops draining: messages queued
//! and the stream not polled by the transport (HTTP/2 flow control stops
//! polling once the supervisor stops reading) for the drain timeout (30 s
//! by default), counted as
//! `not_draining` in `openshell_server_config_sessions_closed_total`.
//!
//! Folder: this module (the sessions a replica holds and their relays),
//! `frames` (relay frames as the bytes they arrived in) and `routing`
//! (whether a relay is served here or by the owner replica through the peer
//! service). May import `cluster`, `metrics` and `store`; never
//! `sandboxes`, `config`, `api` or `serve` (they are told of session events
//! through `ConfigSink` and channels).

pub mod caps;
mod epochs;
pub mod frames;
mod hand_off;
pub mod hosts;
pub mod routing;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use openshell_proto::{
    ConfigUpdate, ConfigUpdateResult, GatewayHeartbeat, GatewayMessage, RelayClose, RelayFrame,
    RelayOpen, SessionAccepted, SessionRedirect, SupervisorHello, SupervisorMessage,
    gateway_message, relay_frame, relay_open, supervisor_message,
};
use openshell_sdk::wire;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use crate::metrics::{Metrics, RelayLabels};

/// A session with no message for this many heartbeat periods is dead.
const IDLE_HEARTBEATS: u32 = 3;
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);
/// Room for acceptance, heartbeats, relay opens and redirects.
const OUTBOUND_QUEUE: usize = 64;
/// Room for pushed config updates. Delivery keeps one update in flight and
/// sends the next only once the supervisor answered the previous one (so
/// read it): one slot would do, the rest is slack.
const CONFIG_QUEUE: usize = 4;
/// How long a relay open may wait for room on the session's queue.
pub const RELAY_OPEN_SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// How a relay open that found no room within that time fails. Not retried
/// by the router: the session is connected, its supervisor is not reading.
pub(crate) const NOT_TAKING_RELAY_OPENS: &str =
    "the sandbox's supervisor session is not taking relay opens";
/// A session whose stream has messages queued and has taken none for this
/// long is closed: its supervisor stopped reading.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

pub type Outbound = mpsc::Sender<Result<GatewayMessage, Status>>;
/// What a relay sends: encoded `RelayFrame`s (see [`frames`]).
pub type RelaySender = mpsc::Sender<Result<wire::Outbound, Status>>;
/// The answer of a supervisor's `RelayStream`: the frames its relay sends.
pub type RelayStreamOut = ReceiverStream<Result<wire::Outbound, Status>>;
/// What a relay receives: encoded `RelayFrame`s behind their gRPC prefix,
/// as they arrived.
pub type FrameStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

/// When the transport last polled a session's response stream. HTTP/2 flow
/// control stops the polling once the supervisor stops reading.
struct DrainClock {
    origin: Instant,
    last_ms: AtomicU64,
}

impl DrainClock {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            origin: Instant::now(),
            last_ms: AtomicU64::new(0),
        })
    }

    fn polled(&self) {
        let ms = self.origin.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn since_polled(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }
}

/// A session's response stream: its config queue and its main queue,
/// merged. Config goes first: an update only exists once the supervisor
/// answered the acceptance, so order across the two queues never matters.
pub struct GatewayStream {
    config: Option<mpsc::Receiver<Result<GatewayMessage, Status>>>,
    main: mpsc::Receiver<Result<GatewayMessage, Status>>,
    clock: Option<Arc<DrainClock>>,
}

impl Stream for GatewayStream {
    type Item = Result<GatewayMessage, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(clock) = &this.clock {
            clock.polled();
        }
        let mut next = Poll::Pending;
        if let Some(config) = &mut this.config {
            match config.poll_recv(cx) {
                Poll::Ready(Some(message)) => next = Poll::Ready(Some(message)),
                Poll::Ready(None) => this.config = None,
                Poll::Pending => {}
            }
        }
        if next.is_pending() {
            // The session is over once its main queue is closed.
            next = this.main.poll_recv(cx);
        }
        next
    }
}

/// Messages waiting in a queue.
fn queued(tx: &Outbound) -> usize {
    tx.max_capacity() - tx.capacity()
}

struct Session {
    id: String,
    tx: mpsc::Sender<Result<GatewayMessage, Status>>,
    closed: CancellationToken,
    supports_redirect: bool,
    accepted_at: std::time::Instant,
    /// Sent home to its ring owner: its end is not a lost supervisor.
    moving: Arc<AtomicBool>,
    /// The supervisor instance and connection attempt that opened it.
    instance_id: String,
    epoch: u64,
}

pub use crate::store::is_stale;
pub use epochs::stale_status;

struct Pending {
    sandbox_id: String,
    session_id: String,
    reply: oneshot::Sender<Result<Relay, Status>>,
}

/// Both directions of a relay to a supervisor. Dropping it ends the relay,
/// which the supervisor treats as cancellation.
pub struct Relay {
    pub inbound: FrameStream,
    pub outbound: RelaySender,
    gauge: Option<RelayGauge>,
    cap: Option<caps::CapSlot>,
}

impl Relay {
    pub fn new(inbound: FrameStream, outbound: RelaySender) -> Self {
        Self {
            inbound,
            outbound,
            gauge: None,
            cap: None,
        }
    }

    /// The next frame from the supervisor, decoded.
    pub async fn next_frame(&mut self) -> Option<Result<RelayFrame, Status>> {
        Some(self.inbound.next().await?.and_then(frames::decode))
    }

    /// Sends a frame built here to the supervisor; `false` once the relay
    /// is gone.
    pub fn send_frame(&self, frame: &RelayFrame) -> impl Future<Output = bool> + Send + 'static {
        let outbound = self.outbound.clone();
        let frame = frames::framed(frame);
        async move { outbound.send(Ok(frame)).await.is_ok() }
    }

    /// Keeps the relay's place under its sandbox's caps while it lives.
    fn holding(mut self, cap: caps::CapSlot) -> Self {
        self.cap = Some(cap);
        self
    }

    /// Counts the relay in `relays_active` / `relays_opened` and in its
    /// sandbox's busy count while it lives.
    fn counted(mut self, sessions: &Sessions, sandbox_id: &str, kind: &'static str) -> Self {
        let metrics = &sessions.metrics;
        *sessions
            .busy
            .lock()
            .unwrap()
            .entry(sandbox_id.to_owned())
            .or_default() += 1;
        metrics
            .relays_active
            .get_or_create(&RelayLabels { kind })
            .inc();
        metrics
            .relays_opened
            .get_or_create(&RelayLabels { kind })
            .inc();
        self.gauge = Some(RelayGauge {
            metrics: metrics.clone(),
            kind,
            busy: sessions.busy.clone(),
            sandbox_id: sandbox_id.to_owned(),
        });
        self
    }
}

struct RelayGauge {
    metrics: Arc<Metrics>,
    kind: &'static str,
    busy: Arc<Mutex<HashMap<String, usize>>>,
    sandbox_id: String,
}

impl Drop for RelayGauge {
    fn drop(&mut self) {
        self.metrics
            .relays_active
            .get_or_create(&RelayLabels { kind: self.kind })
            .dec();
        let mut busy = self.busy.lock().unwrap();
        if let Some(count) = busy.get_mut(&self.sandbox_id) {
            *count -= 1;
            if *count == 0 {
                busy.remove(&self.sandbox_id);
            }
        }
    }
}

pub fn relay_kind(target: &relay_open::Target) -> &'static str {
    match target {
        relay_open::Target::Exec(_) => "exec",
        relay_open::Target::Ssh(_) => "ssh",
        relay_open::Target::Tcp(_) => "tcp",
        relay_open::Target::Sftp(_) => "sftp",
    }
}

/// What happened to a session when its task ended.
pub enum SessionEnd {
    /// Disconnected, timed out or lost its ownership: the sandbox lost its
    /// supervisor here.
    Lost {
        sandbox_id: String,
        session_id: String,
    },
    /// Replaced by a newer session here, or closed by shutdown or deletion.
    Replaced {
        sandbox_id: String,
        session_id: String,
    },
}

/// Lifecycle callbacks of a session, run in order on its task.
#[tonic::async_trait]
pub trait SessionHooks: Send + Sync + 'static {
    /// `ssh_host_key_fingerprint`: what the supervisor's hello reported.
    async fn accepted(&self, sandbox_id: &str, ssh_host_key_fingerprint: &str);
    /// Called on every supervisor heartbeat; false means the session lost
    /// its ownership and must close.
    async fn heartbeat(&self, sandbox_id: &str, session_id: &str) -> bool;
    async fn ended(&self, end: SessionEnd);
}

/// The push-config side of a session (config_delivery.rs): told when the
/// session is registered, handed every `ConfigUpdateResult`, told when it
/// ends.
pub trait ConfigSink: Send + Sync + 'static {
    /// The session's config queue (its own, not shared with relay opens or
    /// heartbeats) and its close signal.
    fn started(&self, tx: Outbound, closed: CancellationToken);
    fn result(&self, result: ConfigUpdateResult);
    fn ended(&self);
}

/// Push configuration for a new session: the bootstrap that goes inside
/// `SessionAccepted`, and who takes the results.
pub struct PushSetup {
    pub bootstrap: ConfigUpdate,
    pub sink: Arc<dyn ConfigSink>,
}

pub struct Sessions {
    sessions: Mutex<HashMap<String, Session>>,
    pending: Mutex<HashMap<String, Pending>>,
    /// Open relays per sandbox on this replica.
    busy: Arc<Mutex<HashMap<String, usize>>>,
    registered: watch::Sender<u64>,
    shutting_down: AtomicBool,
    metrics: Arc<Metrics>,
    heartbeat: Duration,
    /// Per-sandbox limits on concurrent relays opened here.
    pub caps: caps::RelayCaps,
    drain_timeout: Duration,
}

impl Sessions {
    pub fn new(metrics: Arc<Metrics>, heartbeat: Duration, drain_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            sessions: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            busy: Arc::new(Mutex::new(HashMap::new())),
            registered: watch::channel(0).0,
            shutting_down: AtomicBool::new(false),
            metrics,
            heartbeat,
            caps: caps::RelayCaps::default(),
            drain_timeout,
        })
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    pub fn has_session(&self, sandbox_id: &str) -> bool {
        self.sessions.lock().unwrap().contains_key(sandbox_id)
    }

    /// Reads the hello of a new session.
    pub async fn read_hello(
        inbound: &mut Streaming<SupervisorMessage>,
    ) -> Result<SupervisorHello, Status> {
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no hello within 10 s"))??;
        match first.and_then(|m| m.payload) {
            Some(supervisor_message::Payload::Hello(hello)) => Ok(hello),
            _ => Err(Status::invalid_argument(
                "the first supervisor message must be hello",
            )),
        }
    }

    /// A response stream carrying one redirect and nothing else: no session
    /// starts.
    pub fn redirect_stream(redirect: SessionRedirect) -> GatewayStream {
        let (tx, rx) = mpsc::channel(1);
        let message = GatewayMessage {
            payload: Some(gateway_message::Payload::SessionRedirect(redirect)),
        };
        tx.try_send(Ok(message)).expect("fresh channel has room");
        GatewayStream {
            config: None,
            main: rx,
            clock: None,
        }
    }

    /// Registers an accepted session and starts its task. `inbound` is the
    /// supervisor's side: a `ConnectSupervisor` stream, or the messages of
    /// one sandbox taken out of its host's `ConnectHost` envelopes. With
    /// `push`, the acceptance carries the bootstrap and results go to its
    /// sink.
    pub fn accept(
        self: &Arc<Self>,
        sandbox_id: String,
        session_id: String,
        hello: &SupervisorHello,
        inbound: impl Stream<Item = Result<SupervisorMessage, Status>> + Send + Unpin + 'static,
        hooks: Arc<dyn SessionHooks>,
        push: Option<PushSetup>,
    ) -> Result<GatewayStream, Status> {
        let mut inbound = inbound;
        if self.is_shutting_down() {
            return Err(Status::unavailable("gateway is shutting down"));
        }
        let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
        let (config_tx, config_rx) = mpsc::channel(CONFIG_QUEUE);
        let clock = DrainClock::new();
        let (bootstrap, sink) = match push {
            Some(push) => (Some(push.bootstrap), Some(push.sink)),
            None => (None, None),
        };
        let accepted = GatewayMessage {
            payload: Some(gateway_message::Payload::SessionAccepted(SessionAccepted {
                session_id: session_id.clone(),
                heartbeat_interval: Some(prost_types::Duration {
                    seconds: self.heartbeat.as_secs() as i64,
                    nanos: self.heartbeat.subsec_nanos() as i32,
                }),
                config_push_enabled: bootstrap.is_some(),
                bootstrap,
            })),
        };
        tx.try_send(Ok(accepted)).expect("fresh channel has room");
        let closed = CancellationToken::new();
        let previous = {
            let mut sessions = self.sessions.lock().unwrap();
            // Checked and replaced under one lock: of two attempts of one
            // supervisor racing here, the older never displaces the newer.
            if let Some(live) = sessions.get(&sandbox_id)
                && is_stale(
                    (&live.instance_id, live.epoch),
                    &hello.instance_id,
                    hello.connection_epoch,
                )
            {
                return Err(stale_status(hello.connection_epoch, live.epoch));
            }
            sessions.insert(
                sandbox_id.clone(),
                Session {
                    id: session_id.clone(),
                    tx: tx.clone(),
                    closed: closed.clone(),
                    supports_redirect: hello.supports_session_redirect,
                    accepted_at: std::time::Instant::now(),
                    moving: Arc::new(AtomicBool::new(false)),
                    instance_id: hello.instance_id.clone(),
                    epoch: hello.connection_epoch,
                },
            )
        };
        match previous {
            Some(old) => old.closed.cancel(),
            None => {
                self.metrics.supervisor_sessions.inc();
            }
        };
        self.registered.send_modify(|n| *n += 1);
        tracing::info!(
            sandbox_id,
            session_id,
            config_push = sink.is_some(),
            "supervisor session accepted"
        );
        if let Some(sink) = &sink {
            sink.started(config_tx.clone(), closed.clone());
        }
        let stream = GatewayStream {
            config: sink.is_some().then_some(config_rx),
            main: rx,
            clock: Some(clock.clone()),
        };

        let this = self.clone();
        let fingerprint = hello.ssh_host_key_fingerprint.clone();
        tokio::spawn(async move {
            hooks.accepted(&sandbox_id, &fingerprint).await;
            let mut heartbeat = tokio::time::interval(this.heartbeat);
            heartbeat.tick().await;
            // Supervisors beat at least every 5 s; whatever arrives resets it.
            let idle_limit = (this.heartbeat * IDLE_HEARTBEATS).max(Duration::from_secs(15));
            let mut idle_deadline = tokio::time::Instant::now() + idle_limit;
            let mut drain_check = tokio::time::interval(
                (this.drain_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1)),
            );
            drain_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Checks in a row that found messages queued and the stream not
            // polled for the drain timeout: two, so that a message queued
            // just before a check is not mistaken for a stuck stream.
            let mut stuck_checks = 0u32;
            let mut lost = false;
            loop {
                tokio::select! {
                    // First: once replaced, no late message of this session
                    // is handled (a newer session owns the sandbox).
                    biased;
                    _ = closed.cancelled() => break,
                    _ = tokio::time::sleep_until(idle_deadline) => {
                        tracing::warn!(sandbox_id, "supervisor session idle; closing");
                        break;
                    }
                    _ = drain_check.tick() => {
                        let waiting = queued(&tx) + queued(&config_tx);
                        let stuck = waiting > 0 && clock.since_polled() >= this.drain_timeout;
                        stuck_checks = if stuck { stuck_checks + 1 } else { 0 };
                        if stuck_checks >= 2 {
                            tracing::warn!(
                                sandbox_id,
                                session_id,
                                waiting,
                                drain_timeout_ms = this.drain_timeout.as_millis() as u64,
                                "supervisor session stopped draining its stream; closing"
                            );
                            this.metrics.config.closed("not_draining");
                            break;
                        }
                    }
                    _ = heartbeat.tick() => {
                        let beat = GatewayMessage {
                            payload: Some(gateway_message::Payload::Heartbeat(GatewayHeartbeat {})),
                        };
                        // A full queue is traffic the supervisor has yet to
                        // read: this beat adds nothing, and waiting for room
                        // would stop this task from reading the supervisor.
                        if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(Ok(beat)) {
                            break;
                        }
                    }
                    message = inbound.next() => {
                        idle_deadline = tokio::time::Instant::now() + idle_limit;
                        match message {
                            Some(Ok(message)) => {
                                if matches!(message.payload, Some(supervisor_message::Payload::Heartbeat(_)))
                                    && !hooks.heartbeat(&sandbox_id, &session_id).await
                                {
                                    tracing::warn!(sandbox_id, "session lost its ownership; closing");
                                    lost = true;
                                    break;
                                }
                                if let Some(supervisor_message::Payload::ConfigUpdateResult(result)) = message.payload {
                                    match &sink {
                                        Some(sink) => sink.result(result),
                                        None => tracing::debug!(sandbox_id, "config result on a poll session; ignored"),
                                    }
                                    continue;
                                }
                                this.on_supervisor_message(&session_id, message);
                            }
                            None | Some(Err(_)) => break,
                        }
                    }
                }
            }
            let end = this.unregister(&sandbox_id, &session_id, lost);
            if let Some(sink) = &sink {
                sink.ended();
            }
            hooks.ended(end).await;
        });
        Ok(stream)
    }

    /// Unit-test seam: registers a session entry without a supervisor
    /// stream (no task reads or beats it). Returns its outbound queue and
    /// close signal, as `ConfigSink::started` gets them.
    #[cfg(test)]
    pub(crate) fn register_for_test(
        &self,
        sandbox_id: &str,
        session_id: &str,
    ) -> (Outbound, GatewayStream, CancellationToken) {
        let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
        let closed = CancellationToken::new();
        self.sessions.lock().unwrap().insert(
            sandbox_id.to_owned(),
            Session {
                id: session_id.to_owned(),
                tx: tx.clone(),
                closed: closed.clone(),
                supports_redirect: false,
                accepted_at: std::time::Instant::now(),
                moving: Arc::new(AtomicBool::new(false)),
                instance_id: String::new(),
                epoch: 0,
            },
        );
        let stream = GatewayStream {
            config: None,
            main: rx,
            clock: None,
        };
        (tx, stream, closed)
    }

    fn on_supervisor_message(&self, session_id: &str, message: SupervisorMessage) {
        match message.payload {
            Some(supervisor_message::Payload::RelayOpenResult(result)) if !result.success => {
                let error = result.error.chars().take(512).collect::<String>();
                self.fail_pending(
                    session_id,
                    &result.channel_id,
                    Status::unavailable(format!("supervisor relay failed: {error}")),
                );
            }
            Some(supervisor_message::Payload::RelayClose(close)) => {
                let reason = close.reason.chars().take(512).collect::<String>();
                self.fail_pending(
                    session_id,
                    &close.channel_id,
                    Status::unavailable(format!("supervisor closed the relay: {reason}")),
                );
            }
            _ => {}
        }
    }

    /// Fails a relay waiting for its supervisor, if session `session_id`
    /// was asked to open it (another session's word does not count).
    fn fail_pending(&self, session_id: &str, channel_id: &str, status: Status) {
        let mut pending = self.pending.lock().unwrap();
        if pending
            .get(channel_id)
            .is_some_and(|p| p.session_id == session_id)
            && let Some(pending) = pending.remove(channel_id)
        {
            let _ = pending.reply.send(Err(status));
        }
    }

    fn unregister(&self, sandbox_id: &str, session_id: &str, lost: bool) -> SessionEnd {
        let replaced = SessionEnd::Replaced {
            sandbox_id: sandbox_id.to_owned(),
            session_id: session_id.to_owned(),
        };
        let mut sessions = self.sessions.lock().unwrap();
        let mine = sessions.get(sandbox_id).is_some_and(|s| s.id == session_id);
        if !mine {
            return replaced;
        }
        let moving = sessions
            .remove(sandbox_id)
            .is_some_and(|s| s.moving.load(Ordering::SeqCst));
        drop(sessions);
        self.metrics.supervisor_sessions.dec();
        // Waiters on this session's relays will never be claimed.
        let mut pending = self.pending.lock().unwrap();
        let dead: Vec<String> = pending
            .iter()
            .filter(|(_, p)| p.session_id == session_id)
            .map(|(k, _)| k.clone())
            .collect();
        for channel in dead {
            if let Some(p) = pending.remove(&channel) {
                let _ = p
                    .reply
                    .send(Err(Status::unavailable("supervisor session closed")));
            }
        }
        tracing::info!(sandbox_id, session_id, "supervisor session ended");
        if (self.is_shutting_down() || moving) && !lost {
            replaced
        } else {
            SessionEnd::Lost {
                sandbox_id: sandbox_id.to_owned(),
                session_id: session_id.to_owned(),
            }
        }
    }

    /// Closes the session of one sandbox (on delete).
    pub fn close(&self, sandbox_id: &str) {
        if let Some(session) = self.sessions.lock().unwrap().get(sandbox_id) {
            session.closed.cancel();
        }
    }

    /// Refuses new sessions from now on, and makes every session that ends
    /// from now on a hand-off rather than a lost supervisor (before host
    /// sessions are handed off, ending the sandbox sessions inside them).
    pub fn refuse_new(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Waits up to `wait` for a local session of the sandbox.
    pub async fn wait_session(
        &self,
        sandbox_id: &str,
        wait: Duration,
    ) -> Result<(String, mpsc::Sender<Result<GatewayMessage, Status>>), Status> {
        let mut registered = self.registered.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(s) = self.sessions.lock().unwrap().get(sandbox_id) {
                return Ok((s.id.clone(), s.tx.clone()));
            }
            if self.is_shutting_down() {
                return Err(Status::unavailable("gateway is shutting down"));
            }
            match tokio::time::timeout_at(deadline, registered.changed()).await {
                Ok(Ok(())) => continue,
                _ => return Err(Status::unavailable("supervisor session not connected")),
            }
        }
    }

    /// Opens a relay over this replica's session of the sandbox and waits for
    /// the supervisor's claim. `ssh_session`: the SSH session (token hash) a
    /// forward was opened with, counted against its caps.
    pub async fn open_local(
        &self,
        sandbox_id: &str,
        target: relay_open::Target,
        session_wait: Duration,
        ssh_session: Option<&str>,
    ) -> Result<Relay, Status> {
        let kind = relay_kind(&target);
        let (session_id, session_tx) = self.wait_session(sandbox_id, session_wait).await?;
        let cap = self.caps.reserve(sandbox_id, kind == "exec", ssh_session)?;
        let channel_id = uuid::Uuid::new_v4().to_string();
        let (reply, claimed) = oneshot::channel();
        self.pending.lock().unwrap().insert(
            channel_id.clone(),
            Pending {
                sandbox_id: sandbox_id.to_owned(),
                session_id,
                reply,
            },
        );
        // Removes the pending entry however this function ends.
        let _cleanup = PendingCleanup {
            sessions: self,
            channel_id: &channel_id,
        };
        let open = GatewayMessage {
            payload: Some(gateway_message::Payload::RelayOpen(RelayOpen {
                channel_id: channel_id.clone(),
                target: Some(target),
                service_id: String::new(),
            })),
        };
        match tokio::time::timeout(RELAY_OPEN_SEND_TIMEOUT, session_tx.send(Ok(open))).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(Status::unavailable("supervisor session closed")),
            Err(_) => {
                return Err(Status::unavailable(format!(
                    "{NOT_TAKING_RELAY_OPENS} (its queue stayed full for {} s); try again",
                    RELAY_OPEN_SEND_TIMEOUT.as_secs()
                )));
            }
        }
        let mut claimed = claimed;
        let result = match tokio::time::timeout(CLAIM_TIMEOUT, &mut claimed).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Status::unavailable("supervisor session closed")),
            Err(_) => {
                // A claim racing the timer: closing the receiver decides it.
                // Either the claim got in first (its relay is used: the
                // target may already run, so this open must not fail and be
                // retried) or it finds the waiter gone, and its supervisor
                // never starts the target.
                claimed.close();
                match claimed.try_recv() {
                    Ok(result) => result,
                    Err(_) => {
                        let close = GatewayMessage {
                            payload: Some(gateway_message::Payload::RelayClose(RelayClose {
                                channel_id: channel_id.clone(),
                                reason: "relay open timed out".into(),
                            })),
                        };
                        let _ = session_tx.try_send(Ok(close));
                        Err(Status::deadline_exceeded("relay open timed out"))
                    }
                }
            }
        };
        Ok(result?.counted(self, sandbox_id, kind).holding(cap))
    }

    /// Serves a supervisor's `RelayStream`: hands it to the waiting opener
    /// if `may_claim` says the caller acts for the channel's sandbox.
    pub async fn claim(
        &self,
        may_claim: impl Fn(&str) -> bool,
        mut inbound: FrameStream,
    ) -> Result<RelayStreamOut, Status> {
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.next())
            .await
            .map_err(|_| Status::deadline_exceeded("no relay init within 10 s"))?
            .transpose()?
            .map(frames::decode::<RelayFrame>)
            .transpose()?;
        let channel_id = match first.and_then(|f| f.payload) {
            Some(relay_frame::Payload::Init(init)) => init.channel_id,
            _ => {
                return Err(Status::invalid_argument(
                    "the first relay frame must be init",
                ));
            }
        };
        let pending = {
            let mut map = self.pending.lock().unwrap();
            match map.remove(&channel_id) {
                Some(p) if may_claim(&p.sandbox_id) => p,
                Some(p) => {
                    map.insert(channel_id, p);
                    return Err(Status::permission_denied(
                        "relay channel belongs to another sandbox",
                    ));
                }
                None => return Err(Status::not_found("unknown or expired relay channel")),
            }
        };
        let (tx, rx) = mpsc::channel(16);
        let relay = Relay::new(inbound, tx);
        if pending.reply.send(Ok(relay)).is_err() {
            return Err(Status::cancelled("relay waiter went away"));
        }
        Ok(ReceiverStream::new(rx))
    }
}

struct PendingCleanup<'a> {
    sessions: &'a Sessions,
    channel_id: &'a str,
}

impl Drop for PendingCleanup<'_> {
    fn drop(&mut self) {
        self.sessions
            .pending
            .lock()
            .unwrap()
            .remove(self.channel_id);
    }
}
