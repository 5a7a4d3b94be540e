//! Per-sandbox caps on concurrent execs and relays, lowered for the test:
//! the replica holding the sandbox's session counts every relay to it,
//! whether the stream landed there or was relayed by another replica, and
//! refuses one over a cap with RESOURCE_EXHAUSTED naming the count and the
//! limit. Calls under the caps succeed, and a slot comes back when its
//! stream ends. Also the per-connection HTTP/2 stream limit of a replica
//! and of the edge: a call beyond it waits for a free slot.

mod common;

use std::time::{Duration, Instant};

use common::*;
use openshell_proto::*;
use openshell_testkit::cluster::{ClusterOptions, TestCluster, ring_owner};
use openshell_testkit::{eventually, metric_value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status, Streaming};

async fn hold_exec(
    client: &mut Client,
    sandbox: &str,
) -> Result<Streaming<ExecSandboxEvent>, Status> {
    client
        .exec_sandbox(exec_request(sandbox, &["sleep", "60"]))
        .await
        .map(tonic::Response::into_inner)
}

/// Opens a forward to `port` and keeps it open while the returned sender
/// and stream live.
async fn hold_forward(
    client: &mut Client,
    sandbox: &str,
    port: u16,
) -> Result<(mpsc::Sender<TcpForwardFrame>, Streaming<TcpForwardFrame>), Status> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(TcpForwardFrame {
        payload: Some(tcp_forward_frame::Payload::Init(TcpForwardInit {
            sandbox: sandbox.to_owned(),
            target: Some(tcp_forward_init::Target::Tcp(TcpRelayTarget {
                host: "127.0.0.1".into(),
                port: port.into(),
            })),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let stream = client
        .forward_tcp(ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok((tx, stream))
}

fn refused(result: Result<impl std::fmt::Debug, Status>, want: &str) {
    let status = result.expect_err("a call over the cap");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), want);
}

#[tokio::test]
async fn lowered_caps_refuse_execs_and_relays_across_replicas() {
    let cluster = TestCluster::start(ClusterOptions {
        replicas: 2,
        tokens: vec![TOKEN.into()],
        extra_args: [
            "--allow-test-flags",
            "--member-refresh-ms",
            "300",
            "--member-ttl-ms",
            "3000",
            "--max-execs-per-sandbox",
            "2",
            "--max-relays-per-sandbox",
            "3",
        ]
        .map(String::from)
        .to_vec(),
        ..ClusterOptions::default()
    });
    for gw in &cluster.replicas {
        let ok = eventually(Duration::from_secs(15), || {
            metric_value(&gw.metrics(), "openshell_server_ring_members") == Some(2.0)
        })
        .await;
        assert!(ok, "ring never formed");
    }
    let mut gw0 = client(&cluster.replicas[0]).await;
    let mut gw1 = client(&cluster.replicas[1]).await;
    // A sandbox whose session gw-1 holds: gw-0 relays to it.
    let mut chosen = None;
    for i in 0..12 {
        let name = format!("capped-{i}");
        let sandbox = create_ready(&mut gw0, &name).await;
        let id = sandbox.metadata.unwrap().id;
        if ring_owner(&["gw-0", "gw-1"], &id) == "gw-1" {
            chosen = Some((name, id));
            break;
        }
    }
    let (name, id) = chosen.expect("some sandbox lands on gw-1");
    let listener = sandbox_net(&mut gw0, &name)
        .await
        .listen("127.0.0.1:0")
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let _accepting = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });

    // Two execs, one on the owner and one relayed: both under the cap.
    let local = hold_exec(&mut gw1, &name).await.expect("first exec");
    let _relayed = hold_exec(&mut gw0, &name).await.expect("second exec");
    let execs_full = format!("sandbox {id} has 2 open execs (limit 2)");
    refused(hold_exec(&mut gw0, &name).await, &execs_full);
    refused(hold_exec(&mut gw1, &name).await, &execs_full);

    // A forward is the third relay: allowed; a fourth relay is not.
    let _forward = hold_forward(&mut gw0, &name, port)
        .await
        .expect("third relay");
    refused(
        hold_forward(&mut gw1, &name, port).await,
        &format!("sandbox {id} has 3 open relays (limit 3)"),
    );
    // Counts are per sandbox: another sandbox is unaffected.
    let other = create_ready(&mut gw0, "uncapped").await;
    drop(other);
    assert_eq!(
        sh(&mut gw0, "uncapped", "echo free").await.stdout_text(),
        "free\n"
    );

    // Ending a stream gives its slot back.
    drop(local);
    let started = Instant::now();
    let out = loop {
        match exec(&mut gw0, exec_request(&name, &["echo", "again"])).await {
            Ok(out) => break out,
            Err(status) if status.code() == Code::ResourceExhausted => {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "the slot never came back: {status:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("exec after a slot came back: {status:?}"),
        }
    };
    assert_eq!(out.stdout_text(), "again\n");
}

/// Opens `streams` watch streams on one connection to `url`, then checks
/// that one more call on that connection waits while they are open and is
/// answered once one of them ends.
async fn one_connection_is_limited_to(url: &str, streams: usize) {
    let channel = tonic::transport::Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = openshell_proto::open_shell_client::OpenShellClient::with_interceptor(
        channel,
        Bearer(Some(TOKEN.into())),
    );
    let mut held = Vec::new();
    for _ in 0..streams {
        let mut stream = client
            .watch_sandbox(WatchSandboxRequest {
                sandbox: "watched".into(),
                follow_status: true,
                ..Default::default()
            })
            .await
            .expect("watch under the limit")
            .into_inner();
        let first = tokio::time::timeout(Duration::from_secs(10), stream.message()).await;
        assert!(matches!(first, Ok(Ok(Some(_)))), "{first:?}");
        held.push(stream);
    }
    let mut waiting = client.clone();
    let call = tokio::spawn(async move { waiting.health(HealthRequest {}).await });
    // Bounded wait for the opposite of what must happen: the call stays
    // queued while every stream slot of the connection is taken.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !call.is_finished(),
        "a call beyond the stream limit ran at once"
    );
    drop(held.pop());
    let answered = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("answered once a stream slot was free")
        .unwrap();
    answered.expect("health");
}

#[tokio::test]
async fn a_connection_gets_at_most_the_configured_streams() {
    let limited = openshell_testkit::Gateway::start(openshell_testkit::GatewayOptions {
        tokens: vec![TOKEN.into()],
        extra_args: vec!["--max-streams-per-connection".into(), "2".into()],
        ..Default::default()
    });
    let mut setup = client(&limited).await;
    setup
        .create_sandbox(CreateSandboxRequest {
            name: "watched".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    one_connection_is_limited_to(&limited.url, 2).await;

    // The edge bounds its client connections the same way, in front of a
    // replica with the default limit.
    let open =
        openshell_testkit::Gateway::start(openshell_testkit::GatewayOptions::with_token(TOKEN));
    let mut setup = client(&open).await;
    setup
        .create_sandbox(CreateSandboxRequest {
            name: "watched".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let edge = openshell_testkit::Edge::start_with(
        &[("gw-0", open.url.as_str())],
        &["--max-streams-per-connection", "3"],
    );
    one_connection_is_limited_to(&edge.url, 3).await;
}
