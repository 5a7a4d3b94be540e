//! A cluster serving TLS on certificates from a private CA the test makes:
//! supervisors redirected to their ring owner reconnect over TLS trusting
//! that CA, streams that land on a non-owner are relayed to the owner over
//! peer channels that trust `--peer-ca`, and configuration writes on one
//! replica notify the owner over the same channels. A replica that does
//! not trust its peers' CA says so at once, in its answer and its log.

mod common;
mod config_util;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use config_util::{config_path, id, push_args, set, string, wait_config, wait_metric};
use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::*;
use openshell_testkit::cluster::{ClusterOptions, TestCluster, ring_owner};
use openshell_testkit::tls::{TestPki, make_pki};
use openshell_testkit::{Gateway, metric_value};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

/// Every replica serves the same leaf (127.0.0.1 and localhost) signed by
/// the test's CA; supervisors and peers are told to trust that CA.
fn tls_options(replicas: usize, pki: &TestPki, peer_ca: &Path) -> ClusterOptions {
    let mut extra_args: Vec<String> = [
        "--allow-test-flags",
        "--member-refresh-ms",
        "300",
        "--member-ttl-ms",
        "3000",
    ]
    .map(String::from)
    .to_vec();
    for (flag, path) in [
        ("--tls-cert", &pki.server_cert),
        ("--tls-key", &pki.server_key),
        ("--supervisor-ca", &pki.ca_cert),
    ] {
        extra_args.push(flag.into());
        extra_args.push(path.display().to_string());
    }
    extra_args.push("--peer-ca".into());
    extra_args.push(peer_ca.display().to_string());
    extra_args.extend(push_args(None));
    ClusterOptions {
        replicas,
        tokens: vec![TOKEN.into()],
        extra_args,
        ..ClusterOptions::default()
    }
}

async fn tls_client(gw: &Gateway, ca: &Path) -> Client {
    assert!(gw.url.starts_with("https://"), "{}", gw.url);
    let channel = Channel::from_shared(gw.url.clone())
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap())),
        )
        .unwrap()
        .connect()
        .await
        .expect("TLS connect");
    OpenShellClient::with_interceptor(channel, Bearer(Some(TOKEN.into())))
}

fn metric(gw: &Gateway, sample: &str) -> f64 {
    metric_value(&gw.metrics(), sample).unwrap_or(0.0)
}

async fn wait_ring(cluster: &TestCluster, members: f64) {
    for gw in &cluster.replicas {
        wait_metric(
            gw,
            "openshell_server_ring_members",
            members,
            Duration::from_secs(15),
        )
        .await;
    }
}

fn peer_route(gw: &Gateway, kind: &str) -> f64 {
    metric(
        gw,
        &format!(
            r#"openshell_server_routed_request_attempts_total{{operation="relay",route="peer",relay_kind="{kind}",outcome="success"}}"#
        ),
    )
}

async fn owner_via(client: &mut Client, name: &str) -> Option<String> {
    let mut request = tonic::Request::new(GetSandboxRequest {
        name: name.into(),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("x-openshell-want-owner", "1".parse().unwrap());
    let response = client.get_sandbox(request).await.expect("get");
    response
        .metadata()
        .get("x-openshell-owner")
        .map(|v| v.to_str().unwrap().to_owned())
}

/// Forwards `payload` through `client` to an echo server on the sandbox's
/// loopback and returns what came back.
async fn forward_echo(
    client: &mut Client,
    sandbox: &str,
    net: &openshell_testkit::netns::SandboxNet,
    payload: &[u8],
) -> Vec<u8> {
    let listener = net.listen("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let echo = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut received = Vec::new();
        socket.read_to_end(&mut received).await.unwrap();
        socket.write_all(&received).await.unwrap();
    });
    let mut frames = vec![TcpForwardFrame {
        payload: Some(tcp_forward_frame::Payload::Init(TcpForwardInit {
            sandbox: sandbox.to_owned(),
            target: Some(tcp_forward_init::Target::Tcp(TcpRelayTarget {
                host: "127.0.0.1".into(),
                port: port.into(),
            })),
            ..Default::default()
        })),
    }];
    frames.extend(payload.chunks(40_000).map(|c| TcpForwardFrame {
        payload: Some(tcp_forward_frame::Payload::Data(c.to_vec().into())),
    }));
    frames.push(TcpForwardFrame {
        payload: Some(tcp_forward_frame::Payload::Eof(TcpForwardEof {})),
    });
    let mut stream = client
        .forward_tcp(tokio_stream::iter(frames))
        .await
        .expect("forward")
        .into_inner();
    let mut echoed = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(frame) = stream.message().await.expect("forward frame") {
            if let Some(tcp_forward_frame::Payload::Data(d)) = frame.payload {
                echoed.extend(d);
            }
        }
    })
    .await;
    read.expect("forward finished within 30 s");
    tokio::time::timeout(Duration::from_secs(5), echo)
        .await
        .expect("echo server done")
        .unwrap();
    echoed
}

#[tokio::test]
async fn a_private_ca_cluster_redirects_relays_and_notifies_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let cluster = TestCluster::start(tls_options(3, &pki, &pki.ca_cert));
    wait_ring(&cluster, 3.0).await;
    let ids = cluster.ids();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut clients = Vec::new();
    for gw in &cluster.replicas {
        clients.push(tls_client(gw, &pki.ca_cert).await);
    }

    // Supervisors dial gw-0 (https) and are redirected to their ring owner,
    // whose peer endpoint is https too: they only reach READY if they
    // trust the CA for the endpoint the redirect names.
    let mut placed = Vec::new();
    for i in 0..6 {
        let name = format!("tls-{i}");
        let sandbox = create_ready(&mut clients[0], &name).await;
        let owner = ring_owner(&ids, &id(&sandbox));
        placed.push((name, owner, id(&sandbox)));
    }
    let redirected = placed.iter().filter(|(_, o, _)| o != "gw-0").count();
    assert!(redirected > 0, "every sandbox landed on gw-0: {placed:?}");
    assert_eq!(
        metric(
            &cluster.replicas[0],
            r#"openshell_server_session_redirects_total{reason="connect"}"#
        ),
        redirected as f64
    );
    for (name, owner, _) in &placed {
        for client in clients.iter_mut() {
            assert_eq!(
                owner_via(client, name).await.as_deref(),
                Some(owner.as_str()),
                "{name}"
            );
        }
    }

    // Exec and forward through every non-owner replica are relayed to the
    // owner over the peer channel (TLS, --peer-ca).
    let payload: Vec<u8> = (0..120_000u32).map(|i| (i % 251) as u8).collect();
    for (name, owner, _) in &placed {
        let net = sandbox_net(&mut clients[0], name).await;
        for (i, client) in clients.iter_mut().enumerate() {
            let via = &cluster.replicas[i];
            if format!("gw-{i}") == *owner {
                continue;
            }
            let (execs, forwards) = (peer_route(via, "exec"), peer_route(via, "tcp"));
            let out = sh(client, name, "echo relayed over tls").await;
            assert_eq!(out.stdout_text(), "relayed over tls\n", "{name} via gw-{i}");
            assert_eq!(forward_echo(client, name, &net, &payload).await, payload);
            assert_eq!(peer_route(via, "exec"), execs + 1.0, "gw-{i} exec route");
            assert_eq!(peer_route(via, "tcp"), forwards + 1.0, "gw-{i} tcp route");
        }
    }

    // A configuration write on a non-owner notifies the owner over TLS,
    // which pushes it to the supervisor.
    let (name, owner, sandbox_id) = &placed
        .iter()
        .find(|(_, o, _)| o != "gw-1")
        .expect("a sandbox not on gw-1")
        .clone();
    let owner_gw = cluster.replica(owner);
    let marks = metric(
        owner_gw,
        r#"openshell_server_config_marks_total{source="peer"}"#,
    );
    set(&mut clients[1], name, "written-on", string("gw-1")).await;
    let path = config_path(&cluster.shared_dir().join("data"), sandbox_id);
    wait_config(&path, Duration::from_secs(5), |c| {
        c["settings"]["written-on"]["value"] == "gw-1"
    })
    .await;
    assert!(
        metric(
            owner_gw,
            r#"openshell_server_config_marks_total{source="peer"}"#
        ) > marks,
        "{owner} was not notified"
    );
    let notified = r#"openshell_server_config_peer_notifies_total{scope="sandbox",outcome="ok"}"#;
    assert!(metric(&cluster.replicas[1], notified) >= 1.0);
    for gw in &cluster.replicas {
        assert_eq!(
            metric(
                gw,
                r#"openshell_server_config_peer_notifies_total{scope="sandbox",outcome="error"}"#
            ),
            0.0
        );
        assert!(!gw.log().contains("peer TLS handshake failed"));
    }
}

/// Replicas whose `--peer-ca` is another CA: supervisors (which trust the
/// right one) still connect, but a relay to the owner fails at once with
/// UNAVAILABLE naming peer TLS, instead of waiting out the open budget,
/// and the replica's log says what to check, without the peer token.
#[tokio::test]
async fn a_replica_that_does_not_trust_its_peers_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let other_dir = dir.path().join("other");
    std::fs::create_dir_all(&other_dir).unwrap();
    let other = make_pki(&other_dir);
    let cluster = TestCluster::start(tls_options(2, &pki, &other.ca_cert));
    wait_ring(&cluster, 2.0).await;
    let mut gw0 = tls_client(&cluster.replicas[0], &pki.ca_cert).await;
    let mut name = None;
    for i in 0..12 {
        let candidate = format!("distrust-{i}");
        let sandbox = create_ready(&mut gw0, &candidate).await;
        if ring_owner(&["gw-0", "gw-1"], &id(&sandbox)) == "gw-1" {
            name = Some(candidate);
            break;
        }
    }
    let name = name.expect("some sandbox lands on gw-1");
    let started = Instant::now();
    let status = exec(&mut gw0, exec_request(&name, &["true"]))
        .await
        .expect_err("a relay over an untrusted peer channel");
    let took = started.elapsed();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("peer TLS"),
        "message: {}",
        status.message()
    );
    assert!(took < Duration::from_secs(5), "failed after {took:?}");
    let log = cluster.replicas[0].log();
    assert!(log.contains("peer TLS handshake failed"), "{log}");
    assert!(log.contains("--peer-ca"), "{log}");
    assert!(
        !log.contains(&cluster.peer_token),
        "the peer token was logged"
    );
}
