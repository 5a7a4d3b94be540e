//! The peer relay between real replicas: a stream (a forward, an
//! interactive exec) opened on a replica that does not hold the sandbox's
//! session is relayed by the owner with
//! `PeerRelayFrames` (frames pass as the bytes they came in); an owner that
//! answers it UNIMPLEMENTED (`--no-peer-relay-frames`, as a replica from
//! before it) is asked with `PeerRelay`, and the stream works the same.
//! `PeerRelayFrames` answers only replicas, and refuses a bad init.

mod common;

use common::*;
use openshell_proto::peer::PeerRelayInit;
use openshell_proto::peer::peer_client::PeerClient;
use openshell_proto::*;
use openshell_testkit::cluster::{ClusterOptions, TestCluster, ring_owner};
use openshell_testkit::{Gateway, metric_value};
use prost::Message;
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

fn cluster(extra: &[&str]) -> TestCluster {
    let mut extra_args: Vec<String> = [
        "--allow-test-flags",
        "--member-refresh-ms",
        "300",
        "--member-ttl-ms",
        "3000",
    ]
    .map(String::from)
    .to_vec();
    extra_args.extend(extra.iter().map(|arg| arg.to_string()));
    TestCluster::start(ClusterOptions {
        replicas: 2,
        tokens: vec![TOKEN.into()],
        extra_args,
        ..ClusterOptions::default()
    })
}

async fn wait_ring(cluster: &TestCluster) {
    for gw in &cluster.replicas {
        let ok = openshell_testkit::eventually(std::time::Duration::from_secs(15), || {
            gw.metric("openshell_server_ring_members") == Some(2.0)
        })
        .await;
        assert!(ok, "ring never reached 2 members");
    }
}

fn requests(gw: &Gateway, method: &str) -> f64 {
    metric_value(
        &gw.metrics(),
        &format!(r#"openshell_server_requests_total{{method="{method}",code="ok"}}"#),
    )
    .unwrap_or(0.0)
}

/// A forward (200 kB echoed) and an interactive exec opened on gw-0 for a
/// sandbox whose session gw-1 holds; returns the sandbox's name after
/// checking both.
async fn relay_through_the_other_replica(cluster: &TestCluster) -> String {
    let mut gw0 = client(&cluster.replicas[0]).await;
    let mut name = None;
    for i in 0..12 {
        let candidate = format!("peer-{i}");
        let sandbox = create_ready(&mut gw0, &candidate).await;
        if ring_owner(&["gw-0", "gw-1"], &sandbox.metadata.unwrap().id) == "gw-1" {
            name = Some(candidate);
            break;
        }
    }
    let name = name.expect("some sandbox lands on gw-1");
    let listener = sandbox_net(&mut gw0, &name)
        .await
        .listen("127.0.0.1:0")
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut received = Vec::new();
        socket.read_to_end(&mut received).await.unwrap();
        socket.write_all(&received).await.unwrap();
    });
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let mut frames = vec![TcpForwardFrame {
        payload: Some(tcp_forward_frame::Payload::Init(TcpForwardInit {
            sandbox: name.clone(),
            target: Some(tcp_forward_init::Target::Tcp(TcpRelayTarget {
                host: "127.0.0.1".into(),
                port: port.into(),
            })),
            ..Default::default()
        })),
    }];
    frames.extend(payload.chunks(70_000).map(|c| TcpForwardFrame {
        payload: Some(tcp_forward_frame::Payload::Data(c.to_vec().into())),
    }));
    let mut stream = gw0
        .forward_tcp(tokio_stream::iter(frames))
        .await
        .unwrap()
        .into_inner();
    let mut echoed = Vec::new();
    while let Some(frame) = stream.message().await.unwrap() {
        if let Some(tcp_forward_frame::Payload::Data(d)) = frame.payload {
            echoed.extend(d);
        }
    }
    assert_eq!(echoed, payload);

    let messages = vec![
        ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Start(exec_request(
                &name,
                &["sh", "-c", "wc -c; echo err >&2; exit 3"],
            ))),
        },
        ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Stdin(vec![b'z'; 4321].into())),
        },
    ];
    let out = collect(
        gw0.exec_sandbox_interactive(tokio_stream::iter(messages))
            .await
            .unwrap()
            .into_inner(),
    )
    .await
    .unwrap();
    assert_eq!(out.stdout_text().trim(), "4321");
    assert_eq!(out.exit_code, Some(3));
    for kind in ["tcp", "exec"] {
        let sample = format!(
            r#"openshell_server_routed_request_attempts_total{{operation="relay",route="peer",relay_kind="{kind}",outcome="success"}}"#
        );
        let relayed = metric_value(&cluster.replicas[0].metrics(), &sample).unwrap_or(0.0);
        assert!(relayed >= 1.0, "{kind}: {relayed}");
    }
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_stream_crosses_the_owner_with_peer_relay_frames() {
    let cluster = cluster(&[]);
    wait_ring(&cluster).await;
    let name = relay_through_the_other_replica(&cluster).await;
    let owner = &cluster.replicas[1];
    assert!(
        requests(owner, "PeerRelayFrames") >= 2.0,
        "{}",
        owner.metrics()
    );
    assert_eq!(requests(owner, "PeerRelay"), 0.0);

    // An init too large for a header (an exec whose command line is 40 kB)
    // goes in the wrapped PeerRelay, whose init is a message.
    let mut gw0 = client(&cluster.replicas[0]).await;
    let long = "x".repeat(40_000);
    let out = exec(
        &mut gw0,
        exec_request(&name, &["sh", "-c", "echo ${#1}", "sh", &long]),
    )
    .await
    .expect("a relayed exec with a long command line");
    assert_eq!(out.stdout_text().trim(), "40000");
    assert_eq!(requests(owner, "PeerRelay"), 1.0, "{}", owner.metrics());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_without_peer_relay_frames_is_asked_with_peer_relay() {
    let cluster = cluster(&["--no-peer-relay-frames"]);
    wait_ring(&cluster).await;
    relay_through_the_other_replica(&cluster).await;
    let owner = &cluster.replicas[1];
    assert!(requests(owner, "PeerRelay") >= 2.0, "{}", owner.metrics());
    assert_eq!(requests(owner, "PeerRelayFrames"), 0.0);
}

#[tokio::test]
async fn peer_relay_frames_answers_only_replicas_with_a_good_init() {
    let cluster = cluster(&[]);
    let gw = &cluster.replicas[0];
    let channel = Channel::from_shared(gw.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let init = |requester: &str, target: bool| PeerRelayInit {
        sandbox_id: "00000000-0000-0000-0000-000000000000".into(),
        relay_open: target.then(|| RelayOpen {
            target: Some(relay_open::Target::Tcp(TcpRelayTarget {
                host: "127.0.0.1".into(),
                port: 1,
            })),
            ..Default::default()
        }),
        requester_replica_id: requester.into(),
        ..Default::default()
    };
    let call = |token: Option<String>, replica: Option<&'static str>, init: Option<Vec<u8>>| {
        let channel = channel.clone();
        async move {
            let mut request = tonic::Request::new(tokio_stream::iter(Vec::<RelayFrame>::new()));
            let metadata = request.metadata_mut();
            if let Some(token) = token {
                metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
            }
            if let Some(replica) = replica {
                metadata.insert("x-openshell-peer-replica", replica.parse().unwrap());
            }
            if let Some(init) = init {
                metadata.insert_bin(
                    "x-openshell-peer-relay-init-bin",
                    MetadataValue::from_bytes(&init),
                );
            }
            match PeerClient::new(channel).peer_relay_frames(request).await {
                Err(status) => status,
                Ok(response) => response.into_inner().message().await.expect_err("refused"),
            }
        }
    };
    let good = Some(init("gw-1", true).encode_to_vec());
    // Not a replica: a user token, or none.
    let err = call(Some(TOKEN.into()), Some("gw-1"), good.clone()).await;
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let err = call(None, Some("gw-1"), good.clone()).await;
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let token = Some(cluster.peer_token.clone());
    // No init, an init that does not decode, one from another replica, one
    // without a target.
    let err = call(token.clone(), Some("gw-1"), None).await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = call(token.clone(), Some("gw-1"), Some(vec![0xff, 0xff, 0xff])).await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = call(
        token.clone(),
        Some("gw-1"),
        Some(init("gw-2", true).encode_to_vec()),
    )
    .await;
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let err = call(
        token.clone(),
        Some("gw-1"),
        Some(init("gw-1", false).encode_to_vec()),
    )
    .await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    // A good init for a sandbox this replica holds no session of.
    let err = call(token, Some("gw-1"), good).await;
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
}
