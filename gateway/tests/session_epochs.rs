//! Connection epochs: a supervisor (or supervisor host) counts its connect
//! attempts in `connection_epoch`. A hello from an attempt older than the
//! live session of the same instance is a late arrival of an attempt the
//! supervisor gave up: it is refused (`ABORTED`) and the newer session goes
//! on. A newer attempt, or another instance (a restarted supervisor),
//! takes over as before. Against real gateways: one replica for sandbox
//! sessions (`--driver none`, so the test is the only supervisor) and for
//! host sessions, and two replicas sharing a store for a stale host hello
//! that lands on the other replica.

mod common;

use std::time::Duration;

use common::raw_host::*;
use common::*;
use openshell_proto::supervisor_host::{HostGatewayMessage, HostHello, HostMessage};
use openshell_proto::supervisor_host::{host_gateway_message, host_message};
use openshell_proto::*;
use openshell_testkit::cluster::{ClusterOptions, TestCluster};
use openshell_testkit::{Gateway, GatewayOptions, issue_host_token};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

/// Gateways advertise this heartbeat, so a live session shows it is alive
/// within a second.
const HEARTBEAT_MS: &str = "500";

fn gateway(driver: &str) -> Gateway {
    Gateway::start(GatewayOptions {
        extra_args: [
            "--allow-test-flags",
            "--driver",
            driver,
            "--heartbeat-ms",
            HEARTBEAT_MS,
        ]
        .map(String::from)
        .to_vec(),
        ..GatewayOptions::with_token(TOKEN)
    })
}

/// One supervisor session attempt: its stream, or the refusal.
struct Attempt {
    _tx: mpsc::Sender<SupervisorMessage>,
    inbound: tonic::Streaming<GatewayMessage>,
}

async fn attempt(
    gw: &Gateway,
    token: &str,
    sandbox_id: &str,
    instance: &str,
    epoch: u64,
) -> Result<Attempt, tonic::Status> {
    let mut supervisor = client_with(gw, Some(token)).await;
    let (tx, rx) = mpsc::channel(4);
    tx.send(SupervisorMessage {
        payload: Some(supervisor_message::Payload::Hello(SupervisorHello {
            sandbox_id: sandbox_id.into(),
            instance_id: instance.into(),
            connection_epoch: epoch,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut inbound = supervisor
        .connect_supervisor(ReceiverStream::new(rx))
        .await?
        .into_inner();
    match inbound.message().await? {
        Some(GatewayMessage {
            payload: Some(gateway_message::Payload::SessionAccepted(_)),
        }) => Ok(Attempt { _tx: tx, inbound }),
        other => panic!("expected SessionAccepted or a refusal, got {other:?}"),
    }
}

/// Whether the session's stream is still open: a gateway heartbeat arrives
/// (the gateway beats every 500 ms) before it ends.
async fn beats(inbound: &mut tonic::Streaming<GatewayMessage>) -> bool {
    for _ in 0..20 {
        match tokio::time::timeout(Duration::from_secs(5), inbound.message()).await {
            Ok(Ok(Some(GatewayMessage {
                payload: Some(gateway_message::Payload::Heartbeat(_)),
            }))) => return true,
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => return false,
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_hello_from_an_older_attempt_never_displaces_the_newer_sandbox_session() {
    let gw = gateway("none");
    let mut client = client(&gw).await;
    let sandbox = client
        .create_sandbox(CreateSandboxRequest {
            name: "epochs".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    let id = sandbox.metadata.unwrap().id;
    let token =
        std::fs::read_to_string(gw.store_dir().join("sandboxes").join(&id).join("token")).unwrap();

    let mut fifth = attempt(&gw, &token, &id, "sup-a", 5)
        .await
        .expect("epoch 5");
    wait_phase(&mut client, "epochs", SandboxPhase::Ready).await;

    // Attempt 4 of the same supervisor arrives late: refused, and the
    // session of attempt 5 goes on.
    let stale = attempt(&gw, &token, &id, "sup-a", 4).await;
    let status = stale.err().expect("a stale hello must be refused");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().contains("epoch 4"), "{status:?}");
    assert!(
        beats(&mut fifth.inbound).await,
        "the newer session was displaced"
    );
    assert_eq!(gw.metric("openshell_server_supervisor_sessions"), Some(1.0));

    // Attempt 6 takes over, and attempt 5's stream ends.
    let mut sixth = attempt(&gw, &token, &id, "sup-a", 6)
        .await
        .expect("epoch 6");
    assert!(
        !beats(&mut fifth.inbound).await,
        "the replaced session still runs"
    );
    // A restarted supervisor (another instance) starts counting again and
    // still takes over.
    let mut restarted = attempt(&gw, &token, &id, "sup-b", 1)
        .await
        .expect("a new instance takes over");
    assert!(!beats(&mut sixth.inbound).await);
    assert!(beats(&mut restarted.inbound).await);
    let ready = wait_phase(&mut client, "epochs", SandboxPhase::Ready).await;
    assert_eq!(phase(&ready), SandboxPhase::Ready);
}

fn host_hello(id: &str, instance: &str, epoch: u64) -> HostMessage {
    HostMessage {
        payload: Some(host_message::Payload::Hello(HostHello {
            member_id: id.into(),
            instance_id: instance.into(),
            connection_epoch: epoch,
            stay: true,
            ..Default::default()
        })),
    }
}

/// Whether a host session's stream is still open (a heartbeat arrives).
async fn host_beats(inbound: &mut tonic::Streaming<HostGatewayMessage>) -> bool {
    for _ in 0..20 {
        match tokio::time::timeout(Duration::from_secs(5), inbound.message()).await {
            Ok(Ok(Some(HostGatewayMessage {
                payload: Some(host_gateway_message::Payload::Heartbeat(_)),
            }))) => return true,
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => return false,
        }
    }
    false
}

async fn host_attempt(
    url: &str,
    token: &str,
    instance: &str,
    epoch: u64,
) -> Result<Box<Session>, tonic::Status> {
    match dial(url, token, host_hello("h-epochs", instance, epoch)).await? {
        Dialled::Accepted(session) => Ok(session),
        Dialled::Redirect(redirect) => panic!("a hello with stay was redirected: {redirect:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_host_hello_never_displaces_the_newer_host_session() {
    let gw = gateway("hosts");
    let token = issue_host_token(&gw.store_dir(), "h-epochs");

    let mut fifth = host_attempt(&gw.url, &token, "host-a", 5)
        .await
        .expect("epoch 5");
    let stale = host_attempt(&gw.url, &token, "host-a", 4).await;
    let status = stale.err().expect("a stale host hello must be refused");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(
        host_beats(&mut fifth.inbound).await,
        "the newer host session was displaced"
    );
    assert_eq!(gw.metric("openshell_server_supervisor_hosts"), Some(1.0));

    let _sixth = host_attempt(&gw.url, &token, "host-a", 6)
        .await
        .expect("epoch 6");
    assert!(
        !host_beats(&mut fifth.inbound).await,
        "the replaced host session still runs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_host_hello_on_another_replica_never_takes_the_seat() {
    let cluster = TestCluster::start(ClusterOptions {
        replicas: 2,
        tokens: vec![TOKEN.into()],
        extra_args: [
            "--allow-test-flags",
            "--member-refresh-ms",
            "300",
            "--member-ttl-ms",
            "3000",
            "--driver",
            "hosts",
            "--heartbeat-ms",
            HEARTBEAT_MS,
        ]
        .map(String::from)
        .to_vec(),
        ..ClusterOptions::default()
    });
    let token = issue_host_token(&cluster.shared_dir().join("data"), "h-epochs");
    let (a, b) = (&cluster.replicas[0], &cluster.replicas[1]);

    let mut fifth = host_attempt(&a.url, &token, "host-a", 5)
        .await
        .expect("epoch 5 on replica 0");
    let stale = host_attempt(&b.url, &token, "host-a", 4).await;
    let status = stale.err().expect("a stale host hello must be refused");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    // The seat stays with attempt 5: its replica renews it (at least every
    // 500 ms here) without losing it, for longer than a few renewals.
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < until {
        assert!(
            host_beats(&mut fifth.inbound).await,
            "the newer host session lost its seat"
        );
    }
    assert_eq!(a.metric("openshell_server_supervisor_hosts"), Some(1.0));
    assert_eq!(b.metric("openshell_server_supervisor_hosts"), Some(0.0));
}
