//! The `SupervisorHost` service (`ConnectHost`, PROTOCOL.md section 4): one
//! stream per shared supervisor host, carrying the sessions of the sandboxes
//! assigned to it.
//!
//! A hello without `stay` is placed first ([`placement`], over the live
//! members read from the store at that moment): in one store transaction
//! the host is seated on the replica the ring and the cap pick, and if that
//! is another replica the stream answers `redirect` and ends before any
//! session starts. A hello with `stay` is accepted where it lands.
//!
//! An accepted host session's task sends heartbeats and renews the host's
//! seat, re-reads the host's assignment every second (at once when this
//! replica changed one) and sends the full list when it changed, and
//! demultiplexes `sandbox` envelopes: a sandbox's first envelope carries its
//! `SupervisorHello` and starts an ordinary sandbox session through
//! [`GatewayService::start_session`] (owner record, push bootstrap, hooks,
//! relays, caps) whose messages go back wrapped the same way. Such sessions
//! cannot be redirected one by one; they move with their host. When the host
//! session ends, so do they (their sandboxes lost their supervisor).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use openshell_proto::supervisor_host::supervisor_host_server::SupervisorHost;
use openshell_proto::supervisor_host::{
    AssignedSandbox, HostAccepted, HostAssignment, HostGatewayMessage, HostHeartbeat, HostHello,
    HostMessage, HostRedirect, ResourceLimits, SandboxGatewayMessage, SandboxSupervisorMessage,
    host_gateway_message, host_message,
};
use openshell_proto::{
    GatewayMessage, SessionRejected, SupervisorMessage, gateway_message, supervisor_message,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::api::service::GatewayService;
use crate::auth::Principal;
use crate::cluster::placement;
use crate::sandboxes::limits::Limits;
use crate::sandboxes::{id_of, merged_environment, store_status};
use crate::sessions::hosts::{HOST_TTL, HostOutbound, HostSessions};

const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// A host session with no message for this many heartbeat periods (and at
/// least 15 s) is dead, as a sandbox session is.
const IDLE_HEARTBEATS: u32 = 3;
/// The host's assignment is re-read at least this often.
const ASSIGNMENT_EVERY: Duration = Duration::from_secs(1);
/// Room on a host stream: acceptance, beats, assignments and every
/// sandbox session's messages.
const HOST_QUEUE: usize = 256;
/// Room for one sandbox session's messages on their way in.
const SANDBOX_INBOUND_QUEUE: usize = 64;
/// How long a message may wait for room on the host's stream before the
/// host session is closed (its host stopped reading). The host's task waits
/// this long at most between two renewals of its seat, so it is well under
/// the seat's TTL: a slow host loses its session, never its seat to a
/// session that still runs.
const HOST_SEND_TIMEOUT: Duration = Duration::from_secs(10);
const _: () = assert!(HOST_SEND_TIMEOUT.as_secs() * 2 <= HOST_TTL.as_secs());
/// Longest host id a hello may carry.
const MAX_HOST_ID: usize = 128;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

pub struct HostService {
    pub gateway: Arc<GatewayService>,
    pub hosts: Arc<HostSessions>,
    pub replica_id: String,
    pub heartbeat: Duration,
}

fn host_message(payload: host_gateway_message::Payload) -> Result<HostGatewayMessage, Status> {
    Ok(HostGatewayMessage {
        payload: Some(payload),
    })
}

fn envelope(sandbox_id: &str, message: Option<GatewayMessage>, end: bool) -> HostGatewayMessage {
    HostGatewayMessage {
        payload: Some(host_gateway_message::Payload::Sandbox(
            SandboxGatewayMessage {
                sandbox_id: sandbox_id.to_owned(),
                message,
                end,
            },
        )),
    }
}

async fn read_hello(inbound: &mut Streaming<HostMessage>) -> Result<HostHello, Status> {
    let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no hello within 10 s"))??;
    match first.and_then(|m| m.payload) {
        Some(host_message::Payload::Hello(hello)) => Ok(hello),
        _ => Err(Status::invalid_argument(
            "the first host message must be hello",
        )),
    }
}

#[tonic::async_trait]
impl SupervisorHost for HostService {
    type ConnectHostStream = BoxStream<HostGatewayMessage>;

    async fn connect_host(
        &self,
        request: Request<Streaming<HostMessage>>,
    ) -> Result<Response<Self::ConnectHostStream>, Status> {
        let host_id = match request.extensions().get::<Principal>() {
            Some(Principal::Host(id)) => id.clone(),
            _ => return Err(Status::unauthenticated("a host token is required")),
        };
        let mut inbound = request.into_inner();
        let hello = read_hello(&mut inbound).await?;
        if hello.member_id.is_empty() {
            return Err(Status::invalid_argument("hello.member_id is required"));
        }
        if hello.member_id.len() > MAX_HOST_ID {
            return Err(Status::invalid_argument(format!(
                "hello.member_id is longer than {MAX_HOST_ID} bytes"
            )));
        }
        if hello.member_id != host_id {
            return Err(Status::permission_denied(
                "the host token does not belong to hello.member_id",
            ));
        }
        if self.hosts.is_shutting_down() || self.gateway.sessions.is_shutting_down() {
            return Err(Status::unavailable("gateway is shutting down"));
        }
        let attempt = (hello.instance_id.as_str(), hello.connection_epoch);
        self.hosts.refuse_stale(&host_id, attempt.0, attempt.1)?;
        let store = &self.gateway.sandboxes.store;
        if let Some(cluster) = &self.gateway.cluster
            && !hello.stay
        {
            // Placement counts the replicas the store knows now: a replica
            // that joined since this one's last refresh (all of them, right
            // after a cluster starts) must count towards the cap and be
            // eligible, or the first hosts pile up on the replica that
            // started first. A store that cannot answer leaves the view as
            // it was; `place_host` then reports the store's state.
            if let Err(err) = cluster.sync_view().await {
                tracing::warn!(host_id, %err, "reading the live members for host placement");
            }
            let ring = cluster.ring();
            let target = store
                .place_host(&host_id, HOST_TTL, Some(attempt), |seats| {
                    placement::place(&ring, &host_id, seats)
                })
                .await
                .map_err(store_status)?;
            if let Some(target) = target
                && target != self.replica_id
                && let Some(endpoint) = cluster.endpoint_of(&target)
            {
                tracing::info!(host_id, target, "redirecting supervisor host");
                self.gateway
                    .sessions
                    .metrics()
                    .session_redirects
                    .get_or_create(&crate::metrics::RedirectLabels {
                        reason: "host_connect",
                    })
                    .inc();
                let (tx, rx) = mpsc::channel(1);
                tx.try_send(host_message(host_gateway_message::Payload::Redirect(
                    HostRedirect {
                        peer_endpoint: endpoint,
                        replica_id: target,
                    },
                )))
                .expect("fresh channel has room");
                return Ok(Response::new(Box::pin(ReceiverStream::new(rx))));
            }
        }
        let session_id = uuid::Uuid::new_v4().to_string();
        store
            .hold_host(
                &host_id,
                &self.replica_id,
                &session_id,
                attempt,
                hello.capacity,
                HOST_TTL,
            )
            .await
            .map_err(store_status)?;
        let (tx, rx) = mpsc::channel(HOST_QUEUE);
        tx.try_send(host_message(host_gateway_message::Payload::Accepted(
            HostAccepted {
                session_id: session_id.clone(),
                heartbeat_interval: Some(prost_types::Duration {
                    seconds: self.heartbeat.as_secs() as i64,
                    nanos: self.heartbeat.subsec_nanos() as i32,
                }),
                replica_id: self.replica_id.clone(),
            },
        )))
        .expect("fresh channel has room");
        let closed = CancellationToken::new();
        let ended = CancellationToken::new();
        if let Err(status) =
            self.hosts
                .register(&host_id, &session_id, attempt, tx.clone(), closed.clone())
        {
            // No session will hold the seat: free it now rather than let it
            // look live (and take sandboxes) until it expires.
            let _ = store.release_host(&host_id, &session_id).await;
            return Err(status);
        }
        tracing::info!(
            host_id,
            session_id,
            stay = hello.stay,
            capacity = hello.capacity,
            "supervisor host session accepted"
        );
        let task = HostTask {
            gateway: self.gateway.clone(),
            hosts: self.hosts.clone(),
            host_id,
            session_id,
            tx,
            closed,
            ended,
            heartbeat: self.heartbeat,
            sandboxes: Arc::new(Mutex::new(HashMap::new())),
        };
        tokio::spawn(task.run(inbound));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The inbound side of one sandbox session inside the host session.
struct SandboxInbound {
    /// Tells this session apart from a later one of the same sandbox.
    generation: u64,
    tx: mpsc::Sender<Result<SupervisorMessage, Status>>,
}

type SandboxMap = Arc<Mutex<HashMap<String, SandboxInbound>>>;

struct HostTask {
    gateway: Arc<GatewayService>,
    hosts: Arc<HostSessions>,
    host_id: String,
    session_id: String,
    tx: HostOutbound,
    closed: CancellationToken,
    /// Cancelled when the task ends, whatever ended it: the pumps of its
    /// sandbox sessions stop with it.
    ended: CancellationToken,
    heartbeat: Duration,
    sandboxes: SandboxMap,
}

impl HostTask {
    async fn run(self, mut inbound: Streaming<HostMessage>) {
        let _ended = self.ended.clone().drop_guard();
        let host_id = self.host_id.clone();
        let session_id = self.session_id.clone();
        let store = self.gateway.sandboxes.store.clone();
        let mut beat = tokio::time::interval(self.heartbeat);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        beat.tick().await;
        // The seat is renewed well within its TTL whatever the heartbeat.
        let mut renew = tokio::time::interval(self.heartbeat.min(HOST_TTL / 4));
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        renew.tick().await;
        let mut reread = tokio::time::interval(ASSIGNMENT_EVERY);
        reread.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut changes = self.hosts.changes();
        let idle_limit = (self.heartbeat * IDLE_HEARTBEATS).max(Duration::from_secs(15));
        let mut idle_deadline = tokio::time::Instant::now() + idle_limit;
        let mut last_sent: Option<Vec<AssignedSandbox>> = None;
        let mut generation = 0u64;
        loop {
            tokio::select! {
                _ = self.closed.cancelled() => break,
                _ = tokio::time::sleep_until(idle_deadline) => {
                    tracing::warn!(host_id, "supervisor host session idle; closing");
                    break;
                }
                _ = beat.tick() => {
                    let beat = host_message(host_gateway_message::Payload::Heartbeat(HostHeartbeat {}));
                    if let Err(mpsc::error::TrySendError::Closed(_)) = self.tx.try_send(beat) {
                        break;
                    }
                }
                _ = renew.tick() => {
                    // A store hiccup is not a lost seat; the next tick retries.
                    if let Ok(false) = store.renew_host(&host_id, &session_id).await {
                        tracing::warn!(host_id, "host session lost its seat; closing");
                        break;
                    }
                }
                _ = reread.tick() => {
                    if !self.send_assignment(&mut last_sent).await {
                        break;
                    }
                }
                changed = changes.changed() => {
                    if changed.is_err() || !self.send_assignment(&mut last_sent).await {
                        break;
                    }
                }
                message = inbound.next() => {
                    idle_deadline = tokio::time::Instant::now() + idle_limit;
                    match message.and_then(|m| m.ok()).map(|m| m.payload) {
                        Some(Some(host_message::Payload::Sandbox(envelope))) => {
                            generation += 1;
                            if !self.on_envelope(envelope, generation).await {
                                tracing::warn!(host_id, "host not reading its stream; closing");
                                break;
                            }
                        }
                        Some(Some(host_message::Payload::Hello(_))) => {
                            let _ = self.tx.try_send(Err(Status::invalid_argument(
                                "hello may only be the first host message",
                            )));
                            break;
                        }
                        Some(_) => {}
                        None => break,
                    }
                }
            }
        }
        // Ends every sandbox session inside: their inbound streams close.
        self.sandboxes.lock().unwrap().clear();
        self.hosts.unregister(&host_id, &session_id);
        let _ = store.release_host(&host_id, &session_id).await;
        tracing::info!(host_id, session_id, "supervisor host session ended");
    }

    /// Sends the host's assignment if it changed since `last_sent`. False
    /// when the host stream is gone.
    async fn send_assignment(&self, last_sent: &mut Option<Vec<AssignedSandbox>>) -> bool {
        let store = &self.gateway.sandboxes.store;
        let sandboxes = match store.host_assignment(&self.host_id).await {
            Ok(sandboxes) => sandboxes,
            Err(err) => {
                tracing::warn!(host_id = self.host_id, %err, "reading a host's assignment");
                return true;
            }
        };
        let assigned: Vec<AssignedSandbox> = sandboxes
            .iter()
            .map(|sandbox| AssignedSandbox {
                sandbox_id: id_of(sandbox).to_owned(),
                name: sandbox
                    .metadata
                    .as_ref()
                    .map(|m| m.name.clone())
                    .unwrap_or_default(),
                environment: merged_environment(sandbox.spec.as_ref(), &Default::default())
                    .into_iter()
                    .collect(),
                limits: resource_limits(sandbox.spec.as_ref()),
            })
            .collect();
        if last_sent.as_ref() == Some(&assigned) {
            return true;
        }
        // Sessions of sandboxes that left the assignment end here too.
        {
            let ids: Vec<&str> = assigned.iter().map(|a| a.sandbox_id.as_str()).collect();
            self.sandboxes
                .lock()
                .unwrap()
                .retain(|id, _| ids.contains(&id.as_str()));
        }
        self.hosts
            .set_assigned(&self.host_id, &self.session_id, assigned.len());
        let message = host_message(host_gateway_message::Payload::Assignment(HostAssignment {
            sandboxes: assigned.clone(),
        }));
        *last_sent = Some(assigned);
        self.send(message).await
    }

    /// Queues `message` on the host's stream. False when the stream is gone,
    /// the session was closed, or the host left it full for
    /// [`HOST_SEND_TIMEOUT`].
    async fn send(&self, message: Result<HostGatewayMessage, Status>) -> bool {
        tokio::select! {
            sent = tokio::time::timeout(HOST_SEND_TIMEOUT, self.tx.send(message)) => {
                matches!(sent, Ok(Ok(())))
            }
            _ = self.closed.cancelled() => false,
        }
    }

    /// Handles one sandbox envelope from the host. False when the host's
    /// stream cannot take an answer (see [`HostTask::send`]).
    async fn on_envelope(&self, incoming: SandboxSupervisorMessage, generation: u64) -> bool {
        let sandbox_id = incoming.sandbox_id;
        if sandbox_id.is_empty() {
            return true;
        }
        if incoming.end {
            self.sandboxes.lock().unwrap().remove(&sandbox_id);
            return true;
        }
        let Some(message) = incoming.message else {
            return true;
        };
        let existing = self
            .sandboxes
            .lock()
            .unwrap()
            .get(&sandbox_id)
            .map(|s| s.tx.clone());
        if let Some(tx) = existing {
            let hello = matches!(message.payload, Some(supervisor_message::Payload::Hello(_)));
            if !hello {
                // Never waited for: the host's other sandboxes (and its
                // seat) must not wait on one session. A full queue is a
                // session task that stopped reading: it ends, and the
                // host's sandbox session opens again.
                match tx.try_send(Ok(message)) {
                    Ok(()) => {}
                    Err(full_or_closed) => {
                        if let mpsc::error::TrySendError::Full(_) = full_or_closed {
                            tracing::warn!(sandbox_id, "sandbox session inside a host not reading");
                        }
                        self.sandboxes.lock().unwrap().remove(&sandbox_id);
                    }
                }
                return true;
            }
            // A new hello replaces the sandbox's session.
            self.sandboxes.lock().unwrap().remove(&sandbox_id);
        }
        let Some(supervisor_message::Payload::Hello(mut hello)) = message.payload else {
            return self
                .reject(
                    &sandbox_id,
                    "the first message of a sandbox session must be hello",
                )
                .await;
        };
        if hello.sandbox_id != sandbox_id {
            return self
                .reject(
                    &sandbox_id,
                    "hello.sandbox_id must name the envelope's sandbox",
                )
                .await;
        }
        // Inside a host the session moves with its host, never alone.
        hello.supports_session_redirect = false;
        hello.redirected = false;
        let (in_tx, in_rx) = mpsc::channel(SANDBOX_INBOUND_QUEUE);
        self.sandboxes.lock().unwrap().insert(
            sandbox_id.clone(),
            SandboxInbound {
                generation,
                tx: in_tx,
            },
        );
        let gateway = self.gateway.clone();
        let host_id = self.host_id.clone();
        let out = self.tx.clone();
        let host_ended = self.ended.clone();
        let sandboxes = self.sandboxes.clone();
        tokio::spawn(async move {
            // Replaced by a newer hello for the same sandbox: whatever this
            // session still has to say (a rejection, its end) would land on
            // the host's route for the new one, so it says nothing.
            let superseded = || {
                sandboxes
                    .lock()
                    .unwrap()
                    .get(&sandbox_id)
                    .is_some_and(|s| s.generation != generation)
            };
            let started = async {
                let assigned = gateway
                    .sandboxes
                    .store
                    .sandbox_host(&sandbox_id)
                    .await
                    .map_err(store_status)?;
                if assigned.as_deref() != Some(host_id.as_str()) {
                    return Err(Status::permission_denied(
                        "the sandbox is not assigned to this host",
                    ));
                }
                gateway
                    .start_session(sandbox_id.clone(), &hello, ReceiverStream::new(in_rx))
                    .await
            }
            .await;
            match started {
                Ok(mut stream) => loop {
                    let item = tokio::select! {
                        _ = host_ended.cancelled() => break,
                        item = stream.next() => item,
                    };
                    let Some(Ok(message)) = item else { break };
                    let sent = tokio::select! {
                        _ = host_ended.cancelled() => break,
                        sent = out.send(Ok(envelope(&sandbox_id, Some(message), false))) => sent,
                    };
                    if sent.is_err() {
                        break;
                    }
                },
                Err(_) if superseded() => {}
                Err(status) => {
                    tracing::info!(sandbox_id, host_id, %status, "sandbox session inside a host rejected");
                    let rejected = GatewayMessage {
                        payload: Some(gateway_message::Payload::SessionRejected(SessionRejected {
                            reason: status.message().to_owned(),
                        })),
                    };
                    let _ = tokio::time::timeout(
                        HOST_SEND_TIMEOUT,
                        out.send(Ok(envelope(&sandbox_id, Some(rejected), false))),
                    )
                    .await;
                }
            }
            if !host_ended.is_cancelled() && !superseded() {
                let _ = tokio::time::timeout(
                    HOST_SEND_TIMEOUT,
                    out.send(Ok(envelope(&sandbox_id, None, true))),
                )
                .await;
            }
            let mut map = sandboxes.lock().unwrap();
            if map
                .get(&sandbox_id)
                .is_some_and(|s| s.generation == generation)
            {
                map.remove(&sandbox_id);
            }
        });
        true
    }

    /// Rejects a sandbox session: `SessionRejected`, then its end.
    async fn reject(&self, sandbox_id: &str, reason: &str) -> bool {
        let rejected = GatewayMessage {
            payload: Some(gateway_message::Payload::SessionRejected(SessionRejected {
                reason: reason.to_owned(),
            })),
        };
        self.send(Ok(envelope(sandbox_id, Some(rejected), false)))
            .await
            && self.send(Ok(envelope(sandbox_id, None, true))).await
    }
}

/// The limits the host enforces for a sandbox (stored in its template at
/// creation, defaults included); unset without any.
fn resource_limits(spec: Option<&openshell_proto::SandboxSpec>) -> Option<ResourceLimits> {
    let limits = Limits::of_template(spec.and_then(|spec| spec.template.as_ref()));
    (limits != Limits::default()).then_some(ResourceLimits {
        memory_bytes: limits.memory,
        cpu_millis: limits.cpu_millis,
        pids: limits.pids,
    })
}
