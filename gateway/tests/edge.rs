//! The edge proxies in front of real replicas: the built-in
//! `openshell-gateway edge` and nginx rendered from `deploy/nginx`, each a
//! real process on loopback. Every replica here is an independent gateway
//! with its own store; `x-openshell-served-by` on each answer says which
//! replica produced it, and its absence marks an answer the edge produced.
//!
//! Scenarios that apply to both edges run once per edge
//! (`<scenario>::builtin`, `<scenario>::nginx`).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use common::{TOKEN, collect, create_ready, exec_request};
use http_body_util::Full;
use hyper::body::Body as _;
use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::*;
use openshell_testkit::{Edge, Gateway, GatewayOptions, Nginx, eventually, is_running};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

const SERVED_BY: &str = "x-openshell-served-by";
const HEALTH: &str = "/openshell.v1.OpenShell/Health";
const PEER_REFUSAL: &str = "the peer service is not routed from outside";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Builtin,
    Nginx,
}

/// An edge proxy in front of some replicas.
enum Front {
    Builtin(Edge),
    Nginx(Nginx),
}

impl Front {
    fn start(kind: Kind, replicas: &[(&str, &Gateway)]) -> Self {
        match kind {
            Kind::Builtin => {
                let routes: Vec<(&str, &str)> = replicas
                    .iter()
                    .map(|(id, gw)| (*id, gw.url.as_str()))
                    .collect();
                Front::Builtin(Edge::start(&routes))
            }
            Kind::Nginx => {
                let addrs: Vec<(&str, String)> = replicas
                    .iter()
                    .map(|(id, gw)| (*id, gw.grpc_addr.to_string()))
                    .collect();
                let routes: Vec<(&str, &str)> =
                    addrs.iter().map(|(id, a)| (*id, a.as_str())).collect();
                Front::Nginx(Nginx::start(&routes))
            }
        }
    }

    fn url(&self) -> &str {
        match self {
            Front::Builtin(edge) => &edge.url,
            Front::Nginx(nginx) => &nginx.url,
        }
    }

    fn log(&self) -> String {
        match self {
            Front::Builtin(edge) => edge.log(),
            Front::Nginx(nginx) => nginx.log(),
        }
    }
}

fn replica(id: &str) -> Gateway {
    Gateway::start(GatewayOptions {
        replica_id: Some(id.into()),
        tokens: vec![TOKEN.into()],
        ..Default::default()
    })
}

/// Bearer token plus an optional `x-openshell-replica` on every call.
#[derive(Clone)]
struct Hinted(Option<String>);

impl Interceptor for Hinted {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let bearer: MetadataValue<_> = format!("Bearer {TOKEN}").parse().unwrap();
        request.metadata_mut().insert("authorization", bearer);
        if let Some(replica) = &self.0 {
            request
                .metadata_mut()
                .insert("x-openshell-replica", replica.parse().unwrap());
        }
        Ok(request)
    }
}

type EdgeClient = OpenShellClient<InterceptedService<Channel, Hinted>>;

async fn client(url: &str, replica: Option<&str>) -> EdgeClient {
    let channel = Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .expect("connect to the edge");
    OpenShellClient::with_interceptor(channel, Hinted(replica.map(str::to_owned)))
        .max_decoding_message_size(16 * 1024 * 1024)
        .max_encoding_message_size(16 * 1024 * 1024)
}

fn served_by(metadata: &MetadataMap) -> Option<String> {
    metadata
        .get(SERVED_BY)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Health through the edge; the replica that answered.
async fn health(client: &mut EdgeClient) -> Result<String, Status> {
    let response = client.health(HealthRequest {}).await?;
    Ok(served_by(response.metadata()).expect("a replica's answer names the replica"))
}

/// An error the edge produced: the code, and no served-by.
fn assert_edge_error(status: &Status, code: Code) {
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(
        served_by(status.metadata()),
        None,
        "an edge error carries served-by: {status:?}"
    );
}

/// One call on a fresh HTTP/2 connection, seen at the HTTP level.
struct RawAnswer {
    status: http::StatusCode,
    headers: http::HeaderMap,
    /// The response ended with its HEADERS frame.
    trailers_only: bool,
}

impl RawAnswer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

async fn raw_call(url: &str, path: &str, replica: Option<&str>) -> RawAnswer {
    let addr = url.trim_start_matches("http://");
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    let mut request = http::Request::post(format!("{url}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {TOKEN}"));
    if let Some(replica) = replica {
        request = request.header("x-openshell-replica", replica);
    }
    // One empty gRPC message.
    let request = request
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), sender.send_request(request))
        .await
        .expect("answered within 20 s")
        .expect("an HTTP/2 answer");
    RawAnswer {
        status: response.status(),
        trailers_only: response.body().is_end_stream(),
        headers: response.headers().clone(),
    }
}

/// A trailers-only gRPC error produced by the edge.
fn assert_trailers_only_error(answer: &RawAnswer, code: u32, message: &str) {
    let shown = format!("{:?} {:?}", answer.status, answer.headers);
    assert_eq!(answer.status, http::StatusCode::OK, "{shown}");
    assert_eq!(
        answer.header("content-type"),
        Some("application/grpc"),
        "{shown}"
    );
    assert_eq!(
        answer.header("grpc-status"),
        Some(code.to_string().as_str()),
        "{shown}"
    );
    assert_eq!(
        answer.header("grpc-message").unwrap_or(""),
        message,
        "{shown}"
    );
    assert_eq!(answer.header(SERVED_BY), None, "{shown}");
    assert!(answer.trailers_only, "not trailers-only: {shown}");
}

// ---------------------------------------------------------------------------
// Scenarios for both edges

macro_rules! for_both_edges {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test]
            async fn builtin() {
                super::$scenario(super::Kind::Builtin).await;
            }

            #[tokio::test]
            async fn nginx() {
                super::$scenario(super::Kind::Nginx).await;
            }
        }
    )*};
}

for_both_edges!(
    routes_by_header_to_each_replica,
    unhinted_calls_reach_a_live_replica,
    unknown_replica_is_not_found,
    down_replica_is_unavailable,
    peer_service_is_refused,
    address_like_header_is_not_dialed,
    exec_streams_and_cancels_through_the_edge,
    forward_tcp_is_bidirectional_through_the_edge,
    ssh_session_names_the_edge,
);

async fn routes_by_header_to_each_replica(kind: Kind) {
    let (gw0, gw1, gw2) = (replica("gw-0"), replica("gw-1"), replica("gw-2"));
    let front = Front::start(kind, &[("gw-0", &gw0), ("gw-1", &gw1), ("gw-2", &gw2)]);
    for id in ["gw-0", "gw-1", "gw-2", "gw-1", "gw-0"] {
        let mut client = client(front.url(), Some(id)).await;
        for _ in 0..3 {
            assert_eq!(health(&mut client).await.unwrap(), id);
        }
    }
}

async fn unhinted_calls_reach_a_live_replica(kind: Kind) {
    let (gw0, gw1) = (replica("gw-0"), replica("gw-1"));
    let front = Front::start(kind, &[("gw-0", &gw0), ("gw-1", &gw1)]);
    let mut client = client(front.url(), None).await;
    let mut seen = BTreeSet::new();
    for _ in 0..6 {
        let id = health(&mut client).await.unwrap();
        assert!(id == "gw-0" || id == "gw-1", "{id}");
        seen.insert(id);
    }
    assert_eq!(seen.len(), 2, "round robin reaches every replica: {seen:?}");
    // An empty header counts as no header.
    let answer = raw_call(front.url(), HEALTH, Some("")).await;
    assert_eq!(answer.status, http::StatusCode::OK);
    assert!(answer.header(SERVED_BY).is_some(), "{:?}", answer.headers);
}

async fn unknown_replica_is_not_found(kind: Kind) {
    let gw0 = replica("gw-0");
    let front = Front::start(kind, &[("gw-0", &gw0)]);
    // ("default" is a keyword of nginx's map: it must not select anything.)
    for unknown in ["gw-7", "GW-0", "gw-00", "default"] {
        let mut client = client(front.url(), Some(unknown)).await;
        let status = health(&mut client).await.unwrap_err();
        assert_edge_error(&status, Code::NotFound);
        assert_eq!(status.message(), "unknown replica");
    }
    let answer = raw_call(front.url(), HEALTH, Some("gw-7")).await;
    assert_trailers_only_error(&answer, 5, "unknown replica");
    // The known one still works.
    let mut client = client(front.url(), Some("gw-0")).await;
    assert_eq!(health(&mut client).await.unwrap(), "gw-0");
}

async fn down_replica_is_unavailable(kind: Kind) {
    let gw0 = replica("gw-0");
    let mut gw1 = replica("gw-1");
    let front = Front::start(kind, &[("gw-0", &gw0), ("gw-1", &gw1)]);
    let mut to_gw1 = client(front.url(), Some("gw-1")).await;
    // The edge now holds a connection to gw-1.
    assert_eq!(health(&mut to_gw1).await.unwrap(), "gw-1");

    gw1.stop();
    let status = health(&mut to_gw1).await.unwrap_err();
    assert_edge_error(&status, Code::Unavailable);
    // The edge never forwarded it: no message, and the not-forwarded marker
    // (checked by the sdk-core routing tests) that allows the one retry.
    assert_eq!(
        status.message(),
        "",
        "{status:?}; edge log:\n{}",
        front.log()
    );
    let answer = raw_call(front.url(), HEALTH, Some("gw-1")).await;
    assert_trailers_only_error(&answer, 14, "");

    // Unrouted calls go to the replica that is up.
    let mut any = client(front.url(), None).await;
    for _ in 0..4 {
        assert_eq!(health(&mut any).await.unwrap(), "gw-0");
    }
    let mut to_gw0 = client(front.url(), Some("gw-0")).await;
    assert_eq!(health(&mut to_gw0).await.unwrap(), "gw-0");
}

async fn peer_service_is_refused(kind: Kind) {
    let gw0 = replica("gw-0");
    let front = Front::start(kind, &[("gw-0", &gw0)]);
    for hint in [None, Some("gw-0")] {
        for path in [
            "/openshell.peer.v1.Peer/RelayStream",
            "/openshell.peer.v1.GatewayPeer/NotifyConfigChanged",
        ] {
            let answer = raw_call(front.url(), path, hint).await;
            assert_trailers_only_error(&answer, 7, PEER_REFUSAL);
        }
    }
    // The client API next to it is routed.
    let answer = raw_call(front.url(), HEALTH, Some("gw-0")).await;
    assert_eq!(answer.header(SERVED_BY), Some("gw-0"));
}

async fn address_like_header_is_not_dialed(kind: Kind) {
    // A listener nobody is told about except through the header.
    let trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    trap.set_nonblocking(true).unwrap();
    let port = trap.local_addr().unwrap().port();
    let gw0 = replica("gw-0");
    let front = Front::start(kind, &[("gw-0", &gw0)]);
    let values = [
        "127.0.0.1:1".to_owned(),
        format!("127.0.0.1:{port}"),
        format!("http://127.0.0.1:{port}"),
        format!("localhost:{port}"),
        // Even a real replica's address is not a replica id.
        gw0.grpc_addr.to_string(),
        gw0.url.clone(),
    ];
    for value in &values {
        let mut client = client(front.url(), Some(value)).await;
        let status = health(&mut client).await.unwrap_err();
        assert_edge_error(&status, Code::NotFound);
        assert_eq!(status.message(), "unknown replica", "{value}");
    }
    // No wait needed: an edge dials before it answers, and the kernel queues
    // a completed connect on the listener by itself, so a dial from any of
    // the calls above would already be waiting here.
    match trap.accept() {
        Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("something dialled the address from the header: {other:?}"),
    }
}

async fn exec_streams_and_cancels_through_the_edge(kind: Kind) {
    let (gw0, gw1) = (replica("gw-0"), replica("gw-1"));
    let front = Front::start(kind, &[("gw-0", &gw0), ("gw-1", &gw1)]);
    let mut to_gw1 = client(front.url(), Some("gw-1")).await;
    create_ready(&mut to_gw1, "edge-exec").await;

    // 2 MB of stdout, stderr and an exit code, streamed through the edge.
    let response = to_gw1
        .exec_sandbox(exec_request(
            "edge-exec",
            &[
                "sh",
                "-c",
                "head -c 2000000 /dev/zero | tr '\\0' x; echo done >&2; exit 7",
            ],
        ))
        .await
        .expect("exec");
    assert_eq!(served_by(response.metadata()).as_deref(), Some("gw-1"));
    let out = tokio::time::timeout(Duration::from_secs(60), collect(response.into_inner()))
        .await
        .expect("exec finished within 60 s")
        .expect("exec stream");
    assert_eq!(out.stdout.len(), 2_000_000);
    assert!(out.stdout.iter().all(|b| *b == b'x'));
    assert_eq!(out.stderr, b"done\n");
    assert_eq!(out.exit_code, Some(7));

    // The sandbox lives on gw-1 only; gw-0's answer is a replica's error.
    let mut to_gw0 = client(front.url(), Some("gw-0")).await;
    let status = to_gw0
        .get_sandbox(GetSandboxRequest {
            name: "edge-exec".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert_eq!(served_by(status.metadata()).as_deref(), Some("gw-0"));

    // Dropping the stream at the client cancels the call on the replica.
    let marker = openshell_testkit::marker();
    let mut stream = to_gw1
        .exec_sandbox({
            // Found by a marker: a pid the sandbox reports is its own.
            let mut request =
                exec_request("edge-exec", &["sh", "-c", "echo started; exec sleep 300"]);
            request
                .environment
                .insert("TEST_MARKER".into(), marker.clone());
            request
        })
        .await
        .expect("exec")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(20), stream.message())
        .await
        .expect("first event within 20 s")
        .expect("event")
        .expect("not the end");
    assert!(
        matches!(first.payload, Some(exec_sandbox_event::Payload::Stdout(_))),
        "{first:?}"
    );
    let pids = openshell_testkit::pids_with_env("TEST_MARKER", &marker);
    assert!(!pids.is_empty(), "the exec's process is not running");
    drop(stream);
    assert!(
        eventually(Duration::from_secs(10), || pids
            .iter()
            .all(|p| !is_running(*p)))
        .await,
        "processes {pids:?} survived the cancelled exec; edge log:\n{}",
        front.log()
    );
}

async fn forward_tcp_is_bidirectional_through_the_edge(kind: Kind) {
    let (gw0, gw1) = (replica("gw-0"), replica("gw-1"));
    let front = Front::start(kind, &[("gw-0", &gw0), ("gw-1", &gw1)]);
    let mut to_gw0 = client(front.url(), Some("gw-0")).await;
    create_ready(&mut to_gw0, "edge-fwd").await;

    // Echoes until EOF, then closes its side; inside the sandbox's network.
    let link = to_gw0
        .exec_sandbox(exec_request(
            "edge-fwd",
            &openshell_testkit::netns::PRINT_NETNS,
        ))
        .await
        .expect("exec");
    let link = collect(link.into_inner())
        .await
        .expect("exec")
        .stdout_text();
    let server = openshell_testkit::netns::SandboxNet::from_link(&link)
        .expect("netns")
        .listen("127.0.0.1:0")
        .unwrap();
    let port = server.local_addr().unwrap().port();
    let echo = tokio::spawn(async move {
        let (mut socket, _) = server.accept().await.unwrap();
        socket.set_nodelay(true).unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0usize;
        loop {
            let n = socket.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            total += n;
            socket.write_all(&buf[..n]).await.unwrap();
        }
        socket.shutdown().await.unwrap();
        total
    });

    let frame = |payload| TcpForwardFrame {
        payload: Some(payload),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tx.send(frame(tcp_forward_frame::Payload::Init(TcpForwardInit {
        sandbox: "edge-fwd".into(),
        target: Some(tcp_forward_init::Target::Tcp(TcpRelayTarget {
            host: "localhost".into(),
            port: port.into(),
        })),
        ..Default::default()
    })))
    .await
    .unwrap();
    let response = to_gw0
        .forward_tcp(ReceiverStream::new(rx))
        .await
        .expect("forward");
    assert_eq!(served_by(response.metadata()).as_deref(), Some("gw-0"));
    let mut frames = response.into_inner();

    // Ping-pong: each answer arrives before the next request is sent, so
    // nothing on the path may hold frames back.
    for round in 0..5 {
        let ping = format!("ping-{round}");
        tx.send(frame(tcp_forward_frame::Payload::Data(
            ping.clone().into_bytes().into(),
        )))
        .await
        .unwrap();
        let mut got = Vec::new();
        while got.len() < ping.len() {
            let next = tokio::time::timeout(Duration::from_secs(20), frames.message())
                .await
                .unwrap_or_else(|_| panic!("no echo of {ping} within 20 s"))
                .expect("frame")
                .expect("stream open");
            if let Some(tcp_forward_frame::Payload::Data(bytes)) = next.payload {
                got.extend(bytes);
            }
        }
        assert_eq!(String::from_utf8(got).unwrap(), ping);
    }

    // Bulk both ways at once, then the client's half-close.
    let bulk: Vec<u8> = (0..1_500_000u32).map(|i| (i % 251) as u8).collect();
    let sending = {
        let bulk = bulk.clone();
        tokio::spawn(async move {
            for chunk in bulk.chunks(60_000) {
                tx.send(frame(tcp_forward_frame::Payload::Data(
                    chunk.to_vec().into(),
                )))
                .await
                .unwrap();
            }
        })
    };
    let mut echoed = Vec::new();
    let mut saw_eof = false;
    let finished = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(next) = frames.message().await.expect("frame") {
            match next.payload {
                Some(tcp_forward_frame::Payload::Data(bytes)) => echoed.extend(bytes),
                Some(tcp_forward_frame::Payload::Eof(_)) => saw_eof = true,
                _ => {}
            }
        }
    })
    .await;
    assert!(
        finished.is_ok(),
        "forward did not finish ({} bytes back); edge log:\n{}",
        echoed.len(),
        front.log()
    );
    sending.await.unwrap();
    assert!(saw_eof, "no eof frame");
    assert_eq!(echoed.len(), bulk.len());
    assert!(echoed == bulk, "echoed bytes differ");
    let total = echo.await.unwrap();
    assert_eq!(
        total,
        bulk.len() + (0..5).map(|r| format!("ping-{r}").len()).sum::<usize>()
    );
}

// ---------------------------------------------------------------------------
// Built-in edge only

#[tokio::test]
async fn builtin_route_removed_by_sighup_is_not_found() {
    let (gw0, gw1) = (replica("gw-0"), replica("gw-1"));
    let edge = Edge::start(&[("gw-0", &gw0.url), ("gw-1", &gw1.url)]);
    let mut to_gw1 = client(&edge.url, Some("gw-1")).await;
    let mut to_gw0 = client(&edge.url, Some("gw-0")).await;
    assert_eq!(health(&mut to_gw1).await.unwrap(), "gw-1");

    edge.set_routes(&[("gw-0", &gw0.url)]);
    let status = health(&mut to_gw1).await.unwrap_err();
    assert_edge_error(&status, Code::NotFound);
    assert_eq!(status.message(), "unknown replica");
    assert_eq!(health(&mut to_gw0).await.unwrap(), "gw-0");
    let mut any = client(&edge.url, None).await;
    for _ in 0..4 {
        assert_eq!(health(&mut any).await.unwrap(), "gw-0");
    }
    assert_eq!(edge.metric("openshell_edge_replicas"), Some(1.0));

    // A broken routes file is rejected and the routes stay as they were.
    assert!(!edge.reload_with("{\"replicas\": {\"gw-1\": \"not a url\"}}"));
    assert!(!edge.reload_with("not json"));
    assert_eq!(health(&mut to_gw0).await.unwrap(), "gw-0");
    assert_edge_error(&health(&mut to_gw1).await.unwrap_err(), Code::NotFound);

    // The route comes back.
    edge.set_routes(&[("gw-0", &gw0.url), ("gw-1", &gw1.url)]);
    assert_eq!(health(&mut to_gw1).await.unwrap(), "gw-1");
    // A route can also move to another address under the same id.
    edge.set_routes(&[("gw-0", &gw0.url), ("gw-1", &gw0.url)]);
    assert_eq!(health(&mut to_gw1).await.unwrap(), "gw-0");
    assert!(
        is_running(edge.pid().unwrap()),
        "SIGHUP must not stop the edge"
    );
    // Probes (a Kubernetes deployment's) read its metrics listener.
    for path in ["/healthz", "/readyz"] {
        assert_eq!(openshell_testkit::http_get(edge.metrics_addr, path), "ok\n");
    }
}

#[tokio::test]
async fn builtin_unhinted_calls_are_unavailable_when_every_replica_is_down() {
    let mut gw0 = replica("gw-0");
    let edge = Edge::start(&[("gw-0", &gw0.url)]);
    let mut any = client(&edge.url, None).await;
    assert_eq!(health(&mut any).await.unwrap(), "gw-0");
    gw0.stop();
    let status = health(&mut any).await.unwrap_err();
    assert_edge_error(&status, Code::Unavailable);
    let answer = raw_call(&edge.url, HEALTH, None).await;
    assert_trailers_only_error(&answer, 14, "no healthy upstream");
    assert!(
        edge.metric("openshell_edge_connect_failures_total")
            .unwrap()
            >= 1.0
    );
}

#[tokio::test]
async fn builtin_opens_another_connection_when_a_replica_limits_streams() {
    // An upstream that allows 16 concurrent streams per HTTP/2 connection
    // (nginx with http2_max_concurrent_streams 16). With more long-lived
    // streams than that open through the edge, new calls must not queue
    // behind them.
    let gw0 = replica("gw-0");
    let nginx = Nginx::start_with(
        &[("gw-0", &gw0.grpc_addr.to_string())],
        &["--max-concurrent-streams", "16"],
    );
    let edge = Edge::start(&[("gw-0", &nginx.url)]);
    let mut to_gw0 = client(&edge.url, Some("gw-0")).await;
    create_ready(&mut to_gw0, "watched").await;
    let mut watches = Vec::new();
    for n in 0..40 {
        let call = to_gw0.watch_sandbox(WatchSandboxRequest {
            sandbox: "watched".into(),
            follow_status: true,
            ..Default::default()
        });
        let mut stream = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .unwrap_or_else(|_| panic!("watch {n} not answered within 20 s"))
            .unwrap_or_else(|status| panic!("watch {n}: {status:?}"))
            .into_inner();
        let first = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .unwrap_or_else(|_| panic!("watch {n} got no event within 20 s"));
        assert!(matches!(first, Ok(Some(_))), "watch {n}: {first:?}");
        watches.push(stream);
    }
    let answered = tokio::time::timeout(Duration::from_secs(10), health(&mut to_gw0)).await;
    let served = answered
        .expect("a call next to 40 open streams answered within 10 s")
        .expect("health");
    assert_eq!(served, "gw-0");
    let connections = edge.metric("openshell_edge_upstream_connections").unwrap();
    assert!(connections >= 3.0, "{connections} upstream connections");
    drop(watches);
}

/// `CreateSshSession` through the edge names the edge's address (which
/// the edge passes in `x-openshell-forwarded-authority`), never a copy of
/// that header the client sent.
async fn ssh_session_names_the_edge(kind: Kind) {
    let gw = Gateway::start(GatewayOptions {
        replica_id: Some("gw-0".into()),
        tokens: vec![TOKEN.into()],
        extra_args: vec!["--trust-forwarded-authority".into()],
        ..Default::default()
    });
    let front = Front::start(kind, &[("gw-0", &gw)]);
    let mut client = client(front.url(), None).await;
    client
        .create_sandbox(CreateSandboxRequest {
            name: "edge-ssh".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut request = Request::new(CreateSshSessionRequest {
        sandbox: "edge-ssh".into(),
        ..Default::default()
    });
    request.metadata_mut().insert(
        "x-openshell-forwarded-authority",
        "evil.example:1".parse().unwrap(),
    );
    let session = client
        .create_ssh_session(request)
        .await
        .unwrap()
        .into_inner();
    let edge_addr = front.url().trim_start_matches("http://").to_owned();
    assert_eq!(
        format!("{}:{}", session.gateway_host, session.gateway_port),
        edge_addr,
        "{kind:?}"
    );
}
