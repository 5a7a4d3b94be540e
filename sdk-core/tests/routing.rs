//! Owner routing against a real 3-replica cluster, through the built-in edge
//! and through nginx: hints land every stream on its owner, the single
//! unrouted retry rescues a hinted call the edge never forwarded (and the
//! command runs once), a call the edge forwarded is never sent again, a
//! plain proxy's HTML 502 is `unavailable`, gateway failures and
//! half-delivered streams are never retried, owner moves cost at most one
//! failed attempt, and concurrent streams share one lookup.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{TOKEN, within};
use futures::StreamExt;
use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, ExecEvent, ExecRequest};
use openshell_testkit::cluster::{ClusterOptions, TestCluster, ring_owner};
use openshell_testkit::edge::{Edge, Nginx};
use openshell_testkit::{Gateway, GatewayOptions, eventually};

#[derive(Clone, Copy, Debug, PartialEq)]
enum EdgeKind {
    BuiltIn,
    Nginx,
}

/// Three replicas. Supervisors dial their own edge (as in a deployment,
/// where they reach the gateway Service and follow redirects), so breaking
/// a client route never cuts a supervisor off; clients use `kind`.
struct Setup {
    cluster: TestCluster,
    edge: Edge,
    nginx: Option<Nginx>,
    _supervisor_edge: Edge,
}

impl Setup {
    async fn start(kind: EdgeKind) -> Self {
        let supervisor_edge = Edge::start(&[]);
        let cluster = TestCluster::start(ClusterOptions {
            replicas: 3,
            database_url: None,
            tokens: vec![TOKEN.into()],
            extra_args: [
                "--allow-test-flags",
                "--member-refresh-ms",
                "300",
                "--member-ttl-ms",
                "3000",
            ]
            .map(String::from)
            .to_vec(),
            supervisor_url: Some(supervisor_edge.url.clone()),
            ..ClusterOptions::default()
        });
        supervisor_edge.set_routes(&Self::routes(&cluster, None));
        let edge = Edge::start(&Self::routes(&cluster, None));
        let nginx = (kind == EdgeKind::Nginx).then(|| Nginx::start(&Self::routes(&cluster, None)));
        for gw in &cluster.replicas {
            let ok = eventually(Duration::from_secs(15), || {
                gw.metric("openshell_server_ring_members") == Some(3.0)
            })
            .await;
            assert!(ok, "ring incomplete");
        }
        Self {
            cluster,
            edge,
            nginx,
            _supervisor_edge: supervisor_edge,
        }
    }

    /// Routes to every replica, with `dead` (if any) pointing at a closed port.
    fn routes(cluster: &TestCluster, dead: Option<&str>) -> Vec<(&'static str, &'static str)> {
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        cluster
            .ids()
            .into_iter()
            .zip(&cluster.replicas)
            .map(|(id, gw)| {
                let url = if dead == Some(id.as_str()) {
                    closed.clone()
                } else {
                    gw.url.clone()
                };
                (
                    &*Box::leak(id.into_boxed_str()),
                    &*Box::leak(url.into_boxed_str()),
                )
            })
            .collect()
    }

    /// The owner replica's route loses its endpoint; the replica stays up.
    async fn break_route(&self, owner: &str) {
        self.set_client_routes(&Self::routes(&self.cluster, Some(owner)))
            .await;
    }

    /// Routes of the client's edge (built-in or nginx); returns once applied.
    async fn set_client_routes(&self, routes: &[(&str, &str)]) {
        match &self.nginx {
            None => self.edge.set_routes(routes),
            Some(nginx) => nginx.set_routes(routes).await,
        }
    }

    /// The sandbox's working directory on the host (every replica of the
    /// test cluster shares one data directory).
    fn workdir(&self, sandbox_id: &str) -> PathBuf {
        self.cluster
            .shared_dir()
            .join("data")
            .join("sandboxes")
            .join(sandbox_id)
            .join("work")
    }

    fn client_url(&self) -> String {
        match &self.nginx {
            Some(nginx) => nginx.url.clone(),
            None => self.edge.url.clone(),
        }
    }

    async fn client(&self, routing: bool) -> Client {
        let config = ClientConfig::builder(self.client_url())
            .token(TOKEN)
            .owner_routing(routing)
            .default_deadline(Some(Duration::from_secs(30)))
            .build()
            .unwrap();
        within(10, "connect", Client::connect(config))
            .await
            .unwrap()
    }

    fn ids(&self) -> Vec<String> {
        self.cluster.ids()
    }

    fn owner_of(&self, sandbox_id: &str) -> String {
        let ids = self.ids();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        ring_owner(&ids, sandbox_id)
    }

    /// Sum over replicas of a routed-attempt counter.
    fn routed(&self, route: &str, kind: &str) -> f64 {
        self.cluster
            .replicas
            .iter()
            .map(|gw| routed_on(gw, route, kind))
            .sum()
    }
}

fn routed_on(gw: &Gateway, route: &str, kind: &str) -> f64 {
    gw.metric(&format!(
        r#"openshell_server_routed_request_attempts_total{{operation="relay",route="{route}",relay_kind="{kind}",outcome="success"}}"#
    ))
    .unwrap_or(0.0)
}

async fn ready_sandbox(client: &Client, name: &str) -> String {
    client
        .sandboxes()
        .create(CreateSandbox::new().name(name), CallOptions::new())
        .await
        .expect("create");
    let sandbox = client
        .sandboxes()
        .wait_ready(name, CallOptions::new().deadline(Duration::from_secs(30)))
        .await
        .expect("ready");
    sandbox.id
}

async fn forward_once(client: &Client, sandbox: &str, port: u16) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let handle = client
        .forward(sandbox, port, "127.0.0.1:0", CallOptions::new())
        .await
        .expect("forward");
    let mut socket = tokio::net::TcpStream::connect(handle.local_addr())
        .await
        .unwrap();
    socket.write_all(b"ping").await.unwrap();
    socket.shutdown().await.unwrap();
    let mut back = Vec::new();
    within(10, "echo", socket.read_to_end(&mut back))
        .await
        .unwrap();
    assert_eq!(back, b"ping");
    handle.close();
}

async fn hints_land_every_stream_on_its_owner(kind: EdgeKind) {
    let setup = Setup::start(kind).await;
    let routed_client = setup.client(true).await;
    let mut names = Vec::new();
    for i in 0..30 {
        let name = format!("own-{i}");
        ready_sandbox(&routed_client, &name).await;
        names.push(name);
    }
    // Echo servers in the sandboxes' networks, set up through a client of
    // their own (its calls do not count below).
    let names_ref: Vec<&str> = names.iter().map(String::as_str).collect();
    let port = common::echo_in(&setup.client(true).await, &names_ref).await;
    let peer_before = setup.routed("peer", "exec") + setup.routed("peer", "tcp");
    let local_before = setup.routed("local", "exec") + setup.routed("local", "tcp");
    for name in &names {
        let out = routed_client
            .exec(ExecRequest::new(name, ["echo", "hi"]), CallOptions::new())
            .await
            .expect("exec");
        assert_eq!(out.stdout, b"hi\n");
        forward_once(&routed_client, name, port).await;
    }
    let stats = routed_client.routing_stats();
    assert_eq!(stats.hinted, 60, "{stats:?}");
    assert_eq!(stats.unrouted_retries, 0);
    assert_eq!(
        setup.routed("peer", "exec") + setup.routed("peer", "tcp"),
        peer_before,
        "a hinted stream was relayed"
    );
    assert_eq!(
        setup.routed("local", "exec") + setup.routed("local", "tcp") - local_before,
        60.0
    );

    // Hints off: the edge spreads streams, so about two thirds are relayed.
    let plain = setup.client(false).await;
    let peer_before = setup.routed("peer", "exec");
    for name in &names {
        plain
            .exec(ExecRequest::new(name, ["true"]), CallOptions::new())
            .await
            .expect("exec");
    }
    let relayed = setup.routed("peer", "exec") - peer_before;
    assert!((10.0..=28.0).contains(&relayed), "{relayed} of 30 relayed");
    assert_eq!(plain.routing_stats().hinted, 0);
    assert_eq!(plain.routing_stats().unhinted, 30);
}

#[tokio::test]
async fn hints_land_every_stream_on_its_owner_through_the_builtin_edge() {
    hints_land_every_stream_on_its_owner(EdgeKind::BuiltIn).await;
}

#[tokio::test]
async fn hints_land_every_stream_on_its_owner_through_nginx() {
    hints_land_every_stream_on_its_owner(EdgeKind::Nginx).await;
}

async fn one_unrouted_retry_when_the_owner_route_is_gone(kind: EdgeKind) {
    let setup = Setup::start(kind).await;
    let client = setup.client(true).await;
    let id = ready_sandbox(&client, "detour").await;
    let owner = setup.owner_of(&id);
    let (_, reported) = client
        .sandboxes()
        .get_with_owner("detour", CallOptions::new())
        .await
        .unwrap();
    assert_eq!(reported.as_deref(), Some(owner.as_str()));

    setup.break_route(&owner).await;
    let peer_before = setup.routed("peer", "exec");
    let before = client.routing_stats();
    let out = client
        .exec(counted("detour", "detoured"), CallOptions::new())
        .await
        .expect("exec succeeds through the unrouted retry");
    assert_eq!(out.stdout, b"detoured\n");
    let after = client.routing_stats();
    assert_eq!(
        after.unrouted_retries - before.unrouted_retries,
        1,
        "{after:?}"
    );
    assert_eq!(runs(&setup.workdir(&id)), 1, "the command ran once");
    assert_eq!(
        setup.routed("peer", "exec") - peer_before,
        1.0,
        "relayed by a peer"
    );
    // The owner replica itself is still up and still the owner.
    assert!(
        setup
            .cluster
            .replica(&owner)
            .metric("openshell_server_supervisor_sessions")
            >= Some(1.0)
    );
}

#[tokio::test]
async fn one_unrouted_retry_when_the_owner_route_is_gone_builtin_edge() {
    one_unrouted_retry_when_the_owner_route_is_gone(EdgeKind::BuiltIn).await;
}

#[tokio::test]
async fn one_unrouted_retry_when_the_owner_route_is_gone_nginx() {
    one_unrouted_retry_when_the_owner_route_is_gone(EdgeKind::Nginx).await;
}

/// An exec that appends a line to `ran.log` in the sandbox's working
/// directory, then prints `out`.
fn counted(sandbox: &str, out: &str) -> ExecRequest {
    ExecRequest::new(
        sandbox,
        ["sh", "-c", &format!("echo ran >> ran.log; echo {out}")],
    )
}

/// How many times a [`counted`] command ran in the sandbox.
fn runs(workdir: &Path) -> usize {
    std::fs::read_to_string(workdir.join("ran.log"))
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

/// A TCP proxy in front of a replica that forwards every byte it receives
/// and drops every byte coming back, until [`cut`](Self::cut) closes all its
/// connections: the replica gets (and runs) the request, the edge never sees
/// an answer, as when a replica dies after the request was sent.
struct CutProxy {
    addr: SocketAddr,
    cut: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = tokio_util::sync::CancellationToken::new();
        let stop = cut.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let (client, _) = tokio::select! {
                    _ = stop.cancelled() => break,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(_) => break,
                    },
                };
                let stop = stop.clone();
                connections.spawn(async move {
                    let Ok(upstream) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut from_client, _to_client) = client.into_split();
                    let (mut from_upstream, mut to_upstream) = upstream.into_split();
                    let forward = tokio::io::copy(&mut from_client, &mut to_upstream);
                    let mut sink = tokio::io::sink();
                    let discard = tokio::io::copy(&mut from_upstream, &mut sink);
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = async { tokio::join!(forward, discard) } => {}
                    }
                    // Dropping both halves of both sockets closes them.
                });
            }
            // Closes every connection still open.
            connections.shutdown().await;
        });
        Self { addr, cut, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Closes every connection and stops listening; returns once done.
    async fn cut(self) {
        self.cut.cancel();
        within(10, "cut proxy stop", self.task).await.unwrap();
    }
}

async fn a_forwarded_call_is_never_sent_twice(kind: EdgeKind) {
    let setup = Setup::start(kind).await;
    let client = setup.client(true).await;
    let id = ready_sandbox(&client, "once").await;
    let owner = setup.owner_of(&id);
    let workdir = setup.workdir(&id);
    // Learn the owner and check where counted commands leave their lines.
    client
        .exec(counted("once", "warm"), CallOptions::new())
        .await
        .expect("exec");
    assert_eq!(runs(&workdir), 1, "ran.log not in {}", workdir.display());

    // The owner's route now goes through the proxy.
    let proxy = CutProxy::start(setup.cluster.replica(&owner).grpc_addr).await;
    let mut routes = Setup::routes(&setup.cluster, None);
    for (id, url) in &mut routes {
        if *id == owner {
            *url = Box::leak(proxy.url().into_boxed_str());
        }
    }
    setup.set_client_routes(&routes).await;

    let before = client.routing_stats();
    let exec = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .exec(
                    counted("once", "second"),
                    CallOptions::new().deadline(Duration::from_secs(30)),
                )
                .await
        }
    });
    // The replica got the request and ran the command; no answer got back.
    assert!(
        eventually(Duration::from_secs(20), || runs(&workdir) == 2).await,
        "the forwarded exec did not run"
    );
    proxy.cut().await;
    let err = within(30, "exec", exec)
        .await
        .unwrap()
        .expect_err("the edge lost the replica after forwarding");
    assert_eq!(err.code(), "unavailable", "{err}");
    assert_eq!(
        err.message(),
        "upstream failed before response headers",
        "{kind:?}"
    );
    assert_eq!(err.served_by(), None);
    let after = client.routing_stats();
    assert_eq!(after.unrouted_retries, before.unrouted_retries, "{after:?}");
    assert_eq!(after.hinted - before.hinted, 1, "{after:?}");
    assert_eq!(runs(&workdir), 2, "the command ran exactly once more");
}

#[tokio::test]
async fn a_forwarded_call_is_never_sent_twice_builtin_edge() {
    a_forwarded_call_is_never_sent_twice(EdgeKind::BuiltIn).await;
}

#[tokio::test]
async fn a_forwarded_call_is_never_sent_twice_nginx() {
    a_forwarded_call_is_never_sent_twice(EdgeKind::Nginx).await;
}

/// nginx without gRPC error mapping: unhinted calls reach replica gw-0,
/// hinted ones a dead port, which nginx answers with its HTML 502 page.
const PLAIN_NGINX: &str = r#"
worker_processes 1;
error_log @@PREFIX@@/error.log notice;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path @@PREFIX@@/tmp;
    proxy_temp_path @@PREFIX@@/tmp;
    fastcgi_temp_path @@PREFIX@@/tmp;
    uwsgi_temp_path @@PREFIX@@/tmp;
    scgi_temp_path @@PREFIX@@/tmp;
    map $http_x_openshell_replica $backend {
        default @@DEAD@@;
        "" @@LIVE@@;
    }
    server {
        listen @@LISTEN@@ http2;
        location / {
            grpc_pass grpc://$backend;
        }
    }
}
"#;

#[tokio::test]
async fn a_plain_proxys_html_502_is_unavailable_and_not_retried() {
    let setup = Setup::start(EdgeKind::BuiltIn).await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let nginx = Nginx::start_config(
        &PLAIN_NGINX
            .replace("@@DEAD@@", &dead)
            .replace("@@LIVE@@", &setup.cluster.replicas[0].grpc_addr.to_string()),
    );
    let config = ClientConfig::builder(nginx.url.clone())
        .token(TOKEN)
        .default_deadline(Some(Duration::from_secs(30)))
        .build()
        .unwrap();
    let client = within(10, "connect", Client::connect(config))
        .await
        .unwrap();
    let id = ready_sandbox(&client, "plain").await;

    // Hinted (the owner lookup went through to gw-0): nginx's HTML 502.
    let err = client
        .exec(counted("plain", "never"), CallOptions::new())
        .await
        .expect_err("the hinted route is dead");
    assert_eq!(err.code(), "unavailable", "{err}");
    assert!(err.retryable());
    assert_eq!(
        err.message(),
        "a proxy answered HTTP 502 Bad Gateway instead of gRPC"
    );
    let stats = client.routing_stats();
    assert_eq!((stats.hinted, stats.unrouted_retries), (1, 0), "{stats:?}");
    assert_eq!(runs(&setup.workdir(&id)), 0);

    // A unary call gets the same answer.
    let request = openshell_sdk::proto::GetSandboxRequest {
        name: "plain".into(),
        workspace_scope: None,
    };
    let err = client
        .raw_unary(
            "/openshell.v1.OpenShell/GetSandbox",
            prost::Message::encode_to_vec(&request).into(),
            [("x-openshell-replica", "gw-0")],
            CallOptions::new(),
        )
        .await
        .expect_err("dead route");
    assert_eq!(err.code(), "unavailable", "{err}");
    assert!(err.message().contains("HTTP 502"), "{err}");
    assert!(nginx.log().contains("connect() failed"), "{}", nginx.log());
}

#[tokio::test]
async fn gateway_failures_and_half_delivered_streams_are_not_retried() {
    let mut setup = Setup::start(EdgeKind::BuiltIn).await;
    let client = setup.client(true).await;
    let id = ready_sandbox(&client, "strict").await;
    let owner = setup.owner_of(&id);

    // A gateway-produced UNAVAILABLE: the owner's supervisor cannot reach
    // the port ("supervisor relay failed", stamped x-openshell-served-by).
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let handle = client
        .forward("strict", closed, "127.0.0.1:0", CallOptions::new())
        .await
        .unwrap();
    let mut socket = tokio::net::TcpStream::connect(handle.local_addr())
        .await
        .unwrap();
    let mut buf = [0u8; 1];
    let _ = within(
        10,
        "closed target",
        tokio::io::AsyncReadExt::read(&mut socket, &mut buf),
    )
    .await;
    assert!(
        eventually(Duration::from_secs(5), || handle.stats().connections_failed
            == 1)
        .await,
        "{:?}",
        handle.stats()
    );
    assert_eq!(client.routing_stats().unrouted_retries, 0);

    // A stream that delivered stdout and then fails is not retried.
    let mut stream = client
        .exec_stream(
            ExecRequest::new("strict", ["sh", "-c", "echo started; sleep 60"]),
            CallOptions::new(),
        )
        .await
        .unwrap();
    match stream.next().await {
        Some(Ok(ExecEvent::Stdout(out))) => assert_eq!(&out[..], b"started\n"),
        other => panic!("expected stdout first, got {other:?}"),
    }
    setup.cluster.replica_mut(&owner).kill();
    let end = within(20, "failed stream", stream.next()).await;
    assert!(matches!(end, Some(Err(_))), "{end:?}");
    assert_eq!(client.routing_stats().unrouted_retries, 0);
}

#[tokio::test]
async fn an_owner_move_costs_at_most_one_failed_attempt() {
    let mut setup = Setup::start(EdgeKind::BuiltIn).await;
    let client = setup.client(true).await;
    let id = ready_sandbox(&client, "mover").await;
    let owner = setup.owner_of(&id);
    client
        .exec(ExecRequest::new("mover", ["true"]), CallOptions::new())
        .await
        .unwrap();
    assert_eq!(client.routing_stats().hinted, 1);

    // The owner stops (its supervisors are redirected to the rest of the
    // ring); the client still has the old owner cached.
    setup.cluster.replica_mut(&owner).stop();
    let remaining: Vec<String> = setup.ids().into_iter().filter(|r| *r != owner).collect();
    let remaining: Vec<&str> = remaining.iter().map(String::as_str).collect();
    let next = ring_owner(&remaining, &id);
    let new_owner = setup.cluster.replica(&next);
    assert!(
        eventually(Duration::from_secs(20), || new_owner
            .metric("openshell_server_supervisor_sessions")
            >= Some(1.0))
        .await
    );
    let before = client.routing_stats();
    let local_before = routed_on(new_owner, "local", "exec");
    for _ in 0..3 {
        client
            .exec(ExecRequest::new("mover", ["true"]), CallOptions::new())
            .await
            .expect("exec after the move");
    }
    let after = client.routing_stats();
    assert!(
        after.unrouted_retries - before.unrouted_retries <= 1,
        "{after:?}"
    );
    // Once re-learned, streams go straight to the new owner.
    assert!(routed_on(new_owner, "local", "exec") - local_before >= 2.0);
}

#[tokio::test]
async fn a_hundred_concurrent_execs_share_one_owner_lookup() {
    let setup = Setup::start(EdgeKind::BuiltIn).await;
    let creator = setup.client(true).await;
    ready_sandbox(&creator, "busy").await;
    let client = setup.client(true).await;
    let runs = (0..100).map(|i| {
        let client = client.clone();
        async move {
            client
                .exec(
                    ExecRequest::new("busy", ["echo", &i.to_string()]),
                    CallOptions::new(),
                )
                .await
                .map(|out| out.exit_code)
        }
    });
    let results = within(120, "100 execs", futures::future::join_all(runs)).await;
    assert!(results.iter().all(|r| matches!(r, Ok(0))), "{results:?}");
    let stats = client.routing_stats();
    assert_eq!(stats.owner_lookups, 1, "{stats:?}");
    assert_eq!(stats.hinted, 100);
}

#[tokio::test]
async fn a_single_replica_gateway_gets_no_hints() {
    let gw = Gateway::start(GatewayOptions::with_token(TOKEN));
    let config = ClientConfig::builder(gw.url.clone())
        .token(TOKEN)
        .build()
        .unwrap();
    let client = Client::connect(config).await.unwrap();
    ready_sandbox(&client, "solo").await;
    for _ in 0..3 {
        client
            .exec(ExecRequest::new("solo", ["true"]), CallOptions::new())
            .await
            .unwrap();
    }
    let stats = client.routing_stats();
    assert_eq!((stats.hinted, stats.unhinted), (0, 3), "{stats:?}");
    assert_eq!(stats.owner_lookups, 1, "no owner is cached too");
}

/// One `forward_io` stream to the echo server: `payload` there and back.
async fn forward_io_once(client: &Client, sandbox: &str, port: u16, payload: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut ours, theirs) = tokio::io::duplex(64 * 1024);
    let (read, write) = tokio::io::split(theirs);
    let pumping = client.forward_io(
        sandbox,
        openshell_sdk::ForwardTarget::Tcp(port),
        None,
        read,
        write,
        CallOptions::new(),
    );
    let talking = async {
        ours.write_all(payload).await.unwrap();
        let mut back = vec![0u8; payload.len()];
        ours.read_exact(&mut back).await.unwrap();
        assert_eq!(back, payload);
        // Our EOF half-closes the stream; the echo server closes; the
        // stream ends.
        drop(ours);
    };
    let (stats, ()) = within(30, "forward_io round trip", async {
        tokio::join!(pumping, talking)
    })
    .await;
    let stats = stats.expect("forward_io");
    assert_eq!(stats.bytes_out, payload.len() as u64);
    assert_eq!(stats.bytes_in, payload.len() as u64);
}

#[tokio::test]
async fn an_assumed_owner_skips_the_lookup_and_a_wrong_one_costs_what_a_stale_cache_does() {
    let setup = Setup::start(EdgeKind::BuiltIn).await;
    let client = setup.client(true).await;
    let id = ready_sandbox(&client, "assumed").await;
    let owner = setup.owner_of(&id);
    let other = setup.ids().into_iter().find(|r| *r != owner).unwrap();
    let port = common::echo_in(&client, &["assumed"]).await;
    // A fresh client: nothing cached.
    let client = setup.client(true).await;

    // The right owner: hinted, no GetSandbox, lands on the owner.
    let local_before = routed_on(setup.cluster.replica(&owner), "local", "tcp");
    client.assume_owner("assumed", &owner).unwrap();
    forward_io_once(&client, "assumed", port, b"to the owner").await;
    let stats = client.routing_stats();
    assert_eq!(
        (stats.owner_lookups, stats.hinted, stats.unrouted_retries),
        (0, 1, 0),
        "{stats:?}"
    );
    assert_eq!(
        routed_on(setup.cluster.replica(&owner), "local", "tcp"),
        local_before + 1.0
    );

    // A live replica that is not the owner: relayed, never retried.
    let peer_before = setup.routed("peer", "tcp");
    client.assume_owner("assumed", &other).unwrap();
    forward_io_once(&client, "assumed", port, b"through a peer").await;
    let stats = client.routing_stats();
    assert_eq!(
        (stats.owner_lookups, stats.hinted, stats.unrouted_retries),
        (0, 2, 0),
        "{stats:?}"
    );
    assert_eq!(setup.routed("peer", "tcp"), peer_before + 1.0);

    // A replica the edge cannot reach: one unrouted retry, then it works.
    setup.break_route(&owner).await;
    client.assume_owner("assumed", &owner).unwrap();
    forward_io_once(&client, "assumed", port, b"after one retry").await;
    let stats = client.routing_stats();
    assert_eq!(
        (stats.owner_lookups, stats.unrouted_retries),
        (0, 1),
        "{stats:?}"
    );

    // Bad replica ids are refused before any I/O.
    for bad in ["", "a b", "gw/0", &"x".repeat(64)] {
        let err = client.assume_owner("assumed", bad).unwrap_err();
        assert_eq!(err.code(), "invalid_config", "{bad:?}");
    }
    assert_eq!(
        client.assume_owner("", "gw-0").unwrap_err().code(),
        "invalid_config"
    );
}
