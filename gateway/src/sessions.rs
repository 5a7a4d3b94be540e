//! Supervisor sessions held by this replica, and the relays opened over them.
//!
//! A relay is how exec and forward reach a sandbox: the gateway registers a
//! pending channel, sends `RelayOpen` on the sandbox's session, and the
//! supervisor claims the channel by opening `RelayStream` with `init`. The
//! waiter then owns both directions of that stream. Pending channels are
//! removed when the waiter gives up, so a late claim finds nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openshell_proto::{
    GatewayHeartbeat, GatewayMessage, RelayClose, RelayFrame, RelayOpen, SessionAccepted,
    SupervisorMessage, gateway_message, relay_frame, relay_open, supervisor_message,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use crate::metrics::{Metrics, RelayLabels};

pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(15);
/// A session with no message for this long is considered dead.
const SESSION_IDLE_LIMIT: Duration = Duration::from_secs(45);
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);

pub type GatewayStream = ReceiverStream<Result<GatewayMessage, Status>>;
pub type RelayStreamOut = ReceiverStream<Result<RelayFrame, Status>>;

struct Session {
    id: String,
    tx: mpsc::Sender<Result<GatewayMessage, Status>>,
    closed: CancellationToken,
}

struct Pending {
    sandbox_id: String,
    session_id: String,
    reply: oneshot::Sender<Result<Relay, Status>>,
}

/// Both directions of a claimed relay. Dropping it ends the relay, which the
/// supervisor treats as cancellation.
pub struct Relay {
    pub inbound: Streaming<RelayFrame>,
    pub outbound: mpsc::Sender<Result<RelayFrame, Status>>,
    _gauge: Option<RelayGauge>,
}

struct RelayGauge {
    metrics: Arc<Metrics>,
    kind: &'static str,
}

impl Drop for RelayGauge {
    fn drop(&mut self) {
        self.metrics
            .relays_active
            .get_or_create(&RelayLabels { kind: self.kind })
            .dec();
    }
}

/// Lifecycle callbacks of a session, run in order on its task.
#[tonic::async_trait]
pub trait SessionHooks: Send + Sync + 'static {
    async fn accepted(&self, sandbox_id: &str);
    async fn ended(&self, end: SessionEnd);
}

/// What happened to a session when its task ended.
pub enum SessionEnd {
    /// Disconnected or timed out: the sandbox lost its supervisor.
    Lost { sandbox_id: String },
    /// Replaced by a newer session or closed by shutdown/deletion.
    Replaced,
}

pub struct Sessions {
    sessions: Mutex<HashMap<String, Session>>,
    pending: Mutex<HashMap<String, Pending>>,
    registered: watch::Sender<u64>,
    shutting_down: AtomicBool,
    metrics: Arc<Metrics>,
}

impl Sessions {
    pub fn new(metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            sessions: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            registered: watch::channel(0).0,
            shutting_down: AtomicBool::new(false),
            metrics,
        })
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Reads the hello of a new session. Returns it with the inbound stream.
    pub async fn read_hello(
        inbound: &mut Streaming<SupervisorMessage>,
    ) -> Result<openshell_proto::SupervisorHello, Status> {
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

    /// Registers an accepted session and starts its task, which calls
    /// `hooks.accepted` first and `hooks.ended` when the session ends.
    pub fn accept(
        self: &Arc<Self>,
        sandbox_id: String,
        mut inbound: Streaming<SupervisorMessage>,
        hooks: Arc<dyn SessionHooks>,
    ) -> Result<GatewayStream, Status> {
        if self.is_shutting_down() {
            return Err(Status::unavailable("gateway is shutting down"));
        }
        let session_id = uuid::Uuid::new_v4().to_string();
        let (tx, rx) = mpsc::channel(64);
        let accepted = GatewayMessage {
            payload: Some(gateway_message::Payload::SessionAccepted(SessionAccepted {
                session_id: session_id.clone(),
                heartbeat_interval: Some(prost_types::Duration {
                    seconds: HEARTBEAT_INTERVAL.as_secs() as i64,
                    nanos: 0,
                }),
            })),
        };
        tx.try_send(Ok(accepted)).expect("fresh channel has room");
        let closed = CancellationToken::new();
        let previous = self.sessions.lock().unwrap().insert(
            sandbox_id.clone(),
            Session {
                id: session_id.clone(),
                tx: tx.clone(),
                closed: closed.clone(),
            },
        );
        match previous {
            Some(old) => old.closed.cancel(),
            None => {
                self.metrics.supervisor_sessions.inc();
            }
        };
        self.registered.send_modify(|n| *n += 1);
        tracing::info!(sandbox_id, session_id, "supervisor session accepted");

        let this = self.clone();
        tokio::spawn(async move {
            hooks.accepted(&sandbox_id).await;
            let mut heartbeat = tokio::time::interval(HEARTBEAT_INTERVAL);
            heartbeat.tick().await;
            loop {
                tokio::select! {
                    _ = closed.cancelled() => break,
                    _ = heartbeat.tick() => {
                        let beat = GatewayMessage {
                            payload: Some(gateway_message::Payload::Heartbeat(GatewayHeartbeat {})),
                        };
                        if tx.send(Ok(beat)).await.is_err() {
                            break;
                        }
                    }
                    message = tokio::time::timeout(SESSION_IDLE_LIMIT, inbound.message()) => {
                        match message {
                            Ok(Ok(Some(message))) => this.on_supervisor_message(message),
                            Ok(Ok(None)) | Ok(Err(_)) => break,
                            Err(_) => {
                                tracing::warn!(sandbox_id, "supervisor session idle; closing");
                                break;
                            }
                        }
                    }
                }
            }
            let end = this.unregister(&sandbox_id, &session_id);
            hooks.ended(end).await;
        });
        Ok(ReceiverStream::new(rx))
    }

    fn on_supervisor_message(&self, message: SupervisorMessage) {
        match message.payload {
            Some(supervisor_message::Payload::RelayOpenResult(result)) if !result.success => {
                let error = result.error.chars().take(512).collect::<String>();
                self.fail_pending(
                    &result.channel_id,
                    Status::unavailable(format!("supervisor relay failed: {error}")),
                );
            }
            Some(supervisor_message::Payload::RelayClose(close)) => {
                let reason = close.reason.chars().take(512).collect::<String>();
                self.fail_pending(
                    &close.channel_id,
                    Status::unavailable(format!("supervisor closed the relay: {reason}")),
                );
            }
            _ => {}
        }
    }

    fn fail_pending(&self, channel_id: &str, status: Status) {
        if let Some(pending) = self.pending.lock().unwrap().remove(channel_id) {
            let _ = pending.reply.send(Err(status));
        }
    }

    fn unregister(&self, sandbox_id: &str, session_id: &str) -> SessionEnd {
        let mut sessions = self.sessions.lock().unwrap();
        let mine = sessions.get(sandbox_id).is_some_and(|s| s.id == session_id);
        if !mine {
            return SessionEnd::Replaced;
        }
        sessions.remove(sandbox_id);
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
        if self.is_shutting_down() {
            SessionEnd::Replaced
        } else {
            SessionEnd::Lost {
                sandbox_id: sandbox_id.to_owned(),
            }
        }
    }

    /// Closes the session of one sandbox (on delete).
    pub fn close(&self, sandbox_id: &str) {
        if let Some(session) = self.sessions.lock().unwrap().get(sandbox_id) {
            session.closed.cancel();
        }
    }

    /// Refuses new sessions and closes every held one.
    pub fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        for session in self.sessions.lock().unwrap().values() {
            session.closed.cancel();
        }
    }

    async fn wait_session(
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

    /// Opens a relay to the sandbox's supervisor and waits for the claim.
    pub async fn open_relay(
        &self,
        sandbox_id: &str,
        target: relay_open::Target,
        session_wait: Duration,
    ) -> Result<Relay, Status> {
        let kind = match target {
            relay_open::Target::Exec(_) => "exec",
            _ => "tcp",
        };
        let (session_id, session_tx) = self.wait_session(sandbox_id, session_wait).await?;
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
        if session_tx.send(Ok(open)).await.is_err() {
            return Err(Status::unavailable("supervisor session closed"));
        }
        let result = match tokio::time::timeout(CLAIM_TIMEOUT, claimed).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Status::unavailable("supervisor session closed")),
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
        };
        let mut relay = result?;
        relay._gauge = Some(RelayGauge {
            metrics: self.metrics.clone(),
            kind,
        });
        self.metrics
            .relays_active
            .get_or_create(&RelayLabels { kind })
            .inc();
        self.metrics
            .relays_opened
            .get_or_create(&RelayLabels { kind })
            .inc();
        Ok(relay)
    }

    /// Serves a supervisor's `RelayStream`: hands it to the waiting opener.
    pub async fn claim(
        &self,
        principal_sandbox: &str,
        mut inbound: Streaming<RelayFrame>,
    ) -> Result<RelayStreamOut, Status> {
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no relay init within 10 s"))??;
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
                Some(p) if p.sandbox_id == principal_sandbox => p,
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
        let relay = Relay {
            inbound,
            outbound: tx,
            _gauge: None,
        };
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
