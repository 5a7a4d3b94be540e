//! A small raw `ConnectHost` client for the placement tests
//! (`hosts.rs`): tonic stubs of `openshell_proto::supervisor_host`, no
//! sdk-core. It dials, follows redirects with `stay`, beats, speaks sandbox
//! sessions in envelopes, and (`RunningHost`) keeps a host going the way
//! sdk-core's `HostSession` does, so placement is tested against the wire
//! contract itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openshell_proto::supervisor_host::supervisor_host_client::SupervisorHostClient;
use openshell_proto::supervisor_host::{
    HostGatewayMessage, HostHeartbeat, HostHello, HostMessage, HostRedirect,
    SandboxSupervisorMessage, host_gateway_message, host_message,
};
use openshell_proto::*;
use openshell_testkit::{eventually, issue_host_token};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::Bearer;

// ------------------------------------------------------------ raw host client

pub type HostClient =
    SupervisorHostClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

pub async fn host_client(url: &str, token: &str) -> Result<HostClient, tonic::transport::Error> {
    let channel = Channel::from_shared(url.to_owned())
        .unwrap()
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await?;
    Ok(SupervisorHostClient::with_interceptor(
        channel,
        Bearer(Some(token.to_owned())),
    ))
}

/// An accepted host session.
pub struct Session {
    /// The replica holding it (from `accepted`).
    pub replica: String,
    pub url: String,
    pub tx: mpsc::Sender<HostMessage>,
    pub inbound: tonic::Streaming<HostGatewayMessage>,
    pub beats: tokio::task::JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.beats.abort();
    }
}

pub enum Dialled {
    Accepted(Box<Session>),
    Redirect(HostRedirect),
}

pub fn hello(id: &str, stay: bool, redirected: bool, capacity: u32) -> HostMessage {
    HostMessage {
        payload: Some(host_message::Payload::Hello(HostHello {
            member_id: id.to_owned(),
            instance_id: format!("{id}-instance"),
            connection_epoch: 1,
            redirected,
            stay,
            capacity,
        })),
    }
}

/// One `ConnectHost` attempt: the gateway's first answer.
pub async fn dial(url: &str, token: &str, first: HostMessage) -> Result<Dialled, tonic::Status> {
    let mut client = host_client(url, token)
        .await
        .map_err(|err| tonic::Status::unavailable(err.to_string()))?;
    let (tx, rx) = mpsc::channel(64);
    tx.send(first).await.unwrap();
    let mut inbound = client
        .connect_host(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let answer = tokio::time::timeout(Duration::from_secs(10), inbound.message())
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("no answer to hello"))??;
    match answer.and_then(|m| m.payload) {
        Some(host_gateway_message::Payload::Accepted(accepted)) => {
            let beat_tx = tx.clone();
            let beats = tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    let beat = HostMessage {
                        payload: Some(host_message::Payload::Heartbeat(HostHeartbeat {})),
                    };
                    if beat_tx.send(beat).await.is_err() {
                        return;
                    }
                }
            });
            Ok(Dialled::Accepted(Box::new(Session {
                replica: accepted.replica_id,
                url: url.to_owned(),
                tx,
                inbound,
                beats,
            })))
        }
        Some(host_gateway_message::Payload::Redirect(redirect)) => {
            // The stream ends after a redirect: no session started.
            let rest = tokio::time::timeout(Duration::from_secs(5), inbound.message()).await;
            assert!(
                matches!(rest, Ok(Ok(None))),
                "a redirect must end the stream"
            );
            Ok(Dialled::Redirect(redirect))
        }
        Some(host_gateway_message::Payload::Rejected(rejected)) => {
            Err(tonic::Status::failed_precondition(rejected.reason))
        }
        other => panic!("unexpected first answer {other:?}"),
    }
}

/// Connects and follows placement redirects (with `stay`, at most 4).
/// Returns the session and how many redirects it followed.
pub async fn connect(
    url: &str,
    token: &str,
    id: &str,
    stay: bool,
    capacity: u32,
) -> Result<(Session, usize), tonic::Status> {
    let mut url = url.to_owned();
    let (mut stay, mut redirected) = (stay, false);
    for hops in 0..5 {
        match dial(&url, token, hello(id, stay, redirected, capacity)).await? {
            Dialled::Accepted(session) => return Ok((*session, hops)),
            Dialled::Redirect(redirect) => {
                url = redirect.peer_endpoint;
                stay = true;
                redirected = true;
            }
        }
    }
    panic!("host {id} redirected more than 4 times");
}

impl Session {
    /// The next message that is not a heartbeat (at most 15 s).
    pub async fn next(&mut self) -> Option<host_gateway_message::Payload> {
        loop {
            let message = tokio::time::timeout(Duration::from_secs(15), self.inbound.message())
                .await
                .expect("a host message within 15 s");
            match message {
                Ok(Some(HostGatewayMessage {
                    payload: Some(host_gateway_message::Payload::Heartbeat(_)),
                })) => continue,
                Ok(Some(message)) => return message.payload,
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// Waits for an assignment for which `want` holds.
    pub async fn assignment_where(&mut self, want: impl Fn(&[String]) -> bool) -> Vec<String> {
        for _ in 0..100 {
            match self.next().await {
                Some(host_gateway_message::Payload::Assignment(assignment)) => {
                    let ids: Vec<String> = assignment
                        .sandboxes
                        .iter()
                        .map(|s| s.sandbox_id.clone())
                        .collect();
                    if want(&ids) {
                        return ids;
                    }
                }
                Some(_) => {}
                None => panic!("host stream ended while waiting for an assignment"),
            }
        }
        panic!("no matching assignment");
    }

    pub async fn send_sandbox(&self, sandbox_id: &str, message: supervisor_message::Payload) {
        self.tx
            .send(HostMessage {
                payload: Some(host_message::Payload::Sandbox(SandboxSupervisorMessage {
                    sandbox_id: sandbox_id.to_owned(),
                    message: Some(SupervisorMessage {
                        payload: Some(message),
                    }),
                    end: false,
                })),
            })
            .await
            .unwrap();
    }

    pub async fn sandbox_hello(&self, sandbox_id: &str) {
        self.send_sandbox(
            sandbox_id,
            supervisor_message::Payload::Hello(SupervisorHello {
                sandbox_id: sandbox_id.to_owned(),
                instance_id: format!("{sandbox_id}-in-host"),
                connection_epoch: 1,
                // Asked for, but a session inside a host is never redirected.
                supports_session_redirect: true,
                ..Default::default()
            }),
        )
        .await;
    }

    /// The next message of `sandbox_id`'s session (`None`: its end).
    pub async fn sandbox_message(&mut self, sandbox_id: &str) -> Option<gateway_message::Payload> {
        for _ in 0..200 {
            match self.next().await {
                Some(host_gateway_message::Payload::Sandbox(envelope))
                    if envelope.sandbox_id == sandbox_id =>
                {
                    if envelope.end {
                        return None;
                    }
                    match envelope.message.and_then(|m| m.payload) {
                        Some(gateway_message::Payload::Heartbeat(_)) => continue,
                        other => return other,
                    }
                }
                Some(_) => {}
                None => panic!("host stream ended while waiting for {sandbox_id}"),
            }
        }
        panic!("no message for {sandbox_id}");
    }
}

// ---------------------------------------------------- a host that keeps going

/// A host process in miniature: connects (placement), follows redirects at
/// once with `stay`, redials its replica with `stay` after a lost session
/// and falls back to the shared addresses (`stay` after a failed redirect,
/// none after a failed sticky redial). `replica` is where it is accepted.
pub struct RunningHost {
    replica: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RunningHost {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RunningHost {
    pub fn start(shared: Vec<String>, token: String, id: String) -> Self {
        let replica = Arc::new(Mutex::new(None));
        let seen = replica.clone();
        let task = tokio::spawn(async move {
            // (url, stay, redirected) of the next attempt; None: shared.
            let mut next: Option<(String, bool, bool)> = None;
            let mut shared_stay = false;
            for _ in 0..10_000 {
                let attempt = match next.take() {
                    Some((url, stay, redirected)) => {
                        let result = dial(&url, &token, hello(&id, stay, redirected, 0)).await;
                        if result.is_err() {
                            // A failed redirect keeps `stay`; a failed
                            // sticky redial places the host again.
                            shared_stay = redirected;
                        }
                        result
                    }
                    None => {
                        let mut result = Err(tonic::Status::unavailable("no shared address"));
                        for url in &shared {
                            result = dial(url, &token, hello(&id, shared_stay, false, 0)).await;
                            if result.is_ok() {
                                break;
                            }
                        }
                        shared_stay = false;
                        result
                    }
                };
                let mut session = match attempt {
                    Ok(Dialled::Redirect(redirect)) => {
                        next = Some((redirect.peer_endpoint, true, true));
                        continue;
                    }
                    Ok(Dialled::Accepted(session)) => session,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                };
                *seen.lock().unwrap() = Some(session.replica.clone());
                let redirect = loop {
                    match session.inbound.message().await {
                        Ok(Some(HostGatewayMessage {
                            payload: Some(host_gateway_message::Payload::Redirect(redirect)),
                        })) => break Some(redirect),
                        Ok(Some(_)) => continue,
                        Ok(None) | Err(_) => break None,
                    }
                };
                *seen.lock().unwrap() = None;
                next = match redirect {
                    Some(redirect) => Some((redirect.peer_endpoint, true, true)),
                    None => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Some((session.url.clone(), true, false))
                    }
                };
            }
        });
        Self { replica, task }
    }

    pub fn replica(&self) -> Option<String> {
        self.replica.lock().unwrap().clone()
    }
}

/// Hosts per replica as the hosts see it, once every host is accepted.
pub async fn placement_of(hosts: &[RunningHost]) -> HashMap<String, usize> {
    let ok = eventually(Duration::from_secs(30), || {
        hosts.iter().all(|h| h.replica().is_some())
    })
    .await;
    assert!(ok, "not every host was accepted within 30 s");
    let mut counts = HashMap::new();
    for host in hosts {
        *counts.entry(host.replica().unwrap()).or_insert(0) += 1;
    }
    counts
}

pub fn tokens(dir: &std::path::Path, n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            let id = format!("h-{i}");
            let token = issue_host_token(dir, &id);
            (id, token)
        })
        .collect()
}
