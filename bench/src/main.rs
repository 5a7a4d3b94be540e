//! Benchmarks against the real gateway (binaries from `OPENSHELL_BIN_DIR`,
//! release builds via `make bench`). Each prints its figures in one run.
//!
//! - `openshell-bench gateway` (the default): exec round-trip latency of
//!   `true` (p50, p99), and ForwardTcp throughput through the gateway as a
//!   ratio of a plain loopback TCP copy of the same bytes.
//! - `openshell-bench sdk`: the core client (`openshell-sdk`). Forward
//!   throughput through `Client::forward` (bytes pushed into the core's local
//!   listener, through the gateway and supervisor, to a sink server) as a
//!   ratio of a plain loopback TCP copy; and unary `GetSandbox` latency (p50,
//!   p99) through the SDK against a plain tonic client ("SDK vs native").
//! - `openshell-bench all`: both.
//!
//! `OPENSHELL_BENCH_FORWARD_MIB` sets the bytes per forward copy (default
//! 256 MiB).

use std::time::{Duration, Instant};

use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::*;
use openshell_testkit::{Gateway, GatewayOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::Channel;

const EXEC_ROUNDS: usize = 300;
const FORWARD_MIB_DEFAULT: usize = 256;
const CHUNK: usize = 64 * 1024;

/// Bytes per copy: 256 MiB, or `OPENSHELL_BENCH_FORWARD_MIB` MiB (a smaller
/// figure makes a quick smoke run of debug builds practical).
fn forward_bytes() -> usize {
    std::env::var("OPENSHELL_BENCH_FORWARD_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&mib| mib > 0)
        .unwrap_or(FORWARD_MIB_DEFAULT)
        * 1024
        * 1024
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

async fn sink_server() -> (u16, tokio::task::JoinHandle<()>) {
    // Accepts connections and discards everything; replies with the count.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; CHUNK];
                let mut total: u64 = 0;
                loop {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => total += n as u64,
                    }
                }
                let _ = socket.write_all(&total.to_be_bytes()).await;
            });
        }
    });
    (port, task)
}

async fn plain_tcp_copy(port: u16) -> Duration {
    let chunk = vec![7u8; CHUNK];
    let started = Instant::now();
    let mut socket = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    socket.set_nodelay(true).unwrap();
    for _ in 0..forward_bytes() / CHUNK {
        socket.write_all(&chunk).await.unwrap();
    }
    socket.shutdown().await.unwrap();
    let mut count = [0u8; 8];
    socket.read_exact(&mut count).await.unwrap();
    assert_eq!(u64::from_be_bytes(count), forward_bytes() as u64);
    started.elapsed()
}

async fn forward_copy(client: &mut OpenShellClient<Channel>, sandbox: &str, port: u16) -> Duration {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let started = Instant::now();
    tx.send(TcpForwardFrame {
        payload: Some(tcp_forward_frame::Payload::Init(TcpForwardInit {
            sandbox: sandbox.into(),
            target: Some(tcp_forward_init::Target::Tcp(TcpRelayTarget {
                host: "127.0.0.1".into(),
                port: port.into(),
            })),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut stream = client
        .forward_tcp(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let writer = tokio::spawn(async move {
        let chunk = vec![7u8; CHUNK];
        for _ in 0..forward_bytes() / CHUNK {
            let frame = TcpForwardFrame {
                payload: Some(tcp_forward_frame::Payload::Data(chunk.clone())),
            };
            if tx.send(frame).await.is_err() {
                return;
            }
        }
    });
    let mut reply = Vec::new();
    while let Some(frame) = stream.message().await.unwrap() {
        if let Some(tcp_forward_frame::Payload::Data(bytes)) = frame.payload {
            reply.extend(bytes);
        }
    }
    writer.await.unwrap();
    assert_eq!(reply.len(), 8);
    assert_eq!(
        u64::from_be_bytes(reply.try_into().unwrap()),
        forward_bytes() as u64
    );
    started.elapsed()
}

async fn gateway_bench() {
    let gw = Gateway::start(GatewayOptions::dev());
    let channel = Channel::from_shared(gw.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = OpenShellClient::new(channel);
    client
        .create_sandbox(CreateSandboxRequest {
            name: "bench".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut watch = client
        .watch_sandbox(WatchSandboxRequest {
            sandbox: "bench".into(),
            follow_status: true,
            stop_on_terminal: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    while watch.message().await.unwrap().is_some() {}

    // Exec round trip of `true`.
    let mut latencies = Vec::with_capacity(EXEC_ROUNDS);
    for round in 0..EXEC_ROUNDS + 20 {
        let started = Instant::now();
        let mut stream = client
            .exec_sandbox(ExecSandboxRequest {
                sandbox: "bench".into(),
                command: vec!["true".into()],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let mut exit = None;
        while let Some(event) = stream.message().await.unwrap() {
            if let Some(exec_sandbox_event::Payload::Exit(e)) = event.payload {
                exit = Some(e.exit_code);
            }
        }
        assert_eq!(exit, Some(0));
        if round >= 20 {
            latencies.push(started.elapsed());
        }
    }
    latencies.sort();

    let (port, _server) = sink_server().await;
    // Warm up both paths once, then measure each twice and keep the best.
    plain_tcp_copy(port).await;
    forward_copy(&mut client, "bench", port).await;
    let plain = plain_tcp_copy(port).await.min(plain_tcp_copy(port).await);
    let forwarded = forward_copy(&mut client, "bench", port)
        .await
        .min(forward_copy(&mut client, "bench", port).await);
    let mib = forward_bytes() as f64 / (1024.0 * 1024.0);
    let plain_rate = mib / plain.as_secs_f64();
    let forward_rate = mib / forwarded.as_secs_f64();

    println!(
        "gateway benchmark ({} MiB per copy, {EXEC_ROUNDS} execs)",
        mib as u64
    );
    println!(
        "  exec `true` round trip: p50 {:.2} ms, p99 {:.2} ms",
        percentile(&latencies, 0.50).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3
    );
    println!("  plain loopback TCP copy: {plain_rate:.0} MiB/s");
    println!("  ForwardTcp via gateway:  {forward_rate:.0} MiB/s");
    println!(
        "  ratio forward / plain TCP: {:.3}",
        forward_rate / plain_rate
    );
}

const UNARY_ROUNDS: usize = 1000;
const UNARY_WARMUP: usize = 100;

/// `GetSandbox` latencies through the SDK, sorted.
async fn sdk_get_latencies(client: &openshell_sdk::Client, sandbox: &str) -> Vec<Duration> {
    let sandboxes = client.sandboxes();
    let mut latencies = Vec::with_capacity(UNARY_ROUNDS);
    for round in 0..UNARY_WARMUP + UNARY_ROUNDS {
        let started = Instant::now();
        let got = sandboxes
            .get(sandbox, openshell_sdk::CallOptions::new())
            .await
            .unwrap();
        let elapsed = started.elapsed();
        assert_eq!(got.name, sandbox);
        if round >= UNARY_WARMUP {
            latencies.push(elapsed);
        }
    }
    latencies.sort();
    latencies
}

/// `GetSandbox` latencies through a plain tonic client, sorted.
async fn native_get_latencies(
    client: &mut OpenShellClient<Channel>,
    sandbox: &str,
) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(UNARY_ROUNDS);
    for round in 0..UNARY_WARMUP + UNARY_ROUNDS {
        let started = Instant::now();
        let got = client
            .get_sandbox(GetSandboxRequest {
                name: sandbox.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let elapsed = started.elapsed();
        assert!(got.sandbox.is_some());
        if round >= UNARY_WARMUP {
            latencies.push(elapsed);
        }
    }
    latencies.sort();
    latencies
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn sdk_bench() {
    use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox};

    let gw = Gateway::start(GatewayOptions::dev());
    let config = ClientConfig::builder(gw.url.clone()).build().unwrap();
    let client = Client::connect(config).await.unwrap();
    let sandboxes = client.sandboxes();
    sandboxes
        .create(CreateSandbox::new().name("bench"), CallOptions::new())
        .await
        .unwrap();
    sandboxes
        .wait_ready("bench", CallOptions::new())
        .await
        .unwrap();

    // Forward throughput: the same copy, once straight to the sink and once
    // into the core's local listener (core -> gateway -> supervisor -> sink).
    let (port, _server) = sink_server().await;
    let forward = client
        .forward("bench", port, "127.0.0.1:0", CallOptions::new())
        .await
        .unwrap();
    let local_port = forward.local_addr().port();
    // Warm up both paths once, then measure each twice and keep the best.
    plain_tcp_copy(port).await;
    plain_tcp_copy(local_port).await;
    let plain = plain_tcp_copy(port).await.min(plain_tcp_copy(port).await);
    let forwarded = plain_tcp_copy(local_port)
        .await
        .min(plain_tcp_copy(local_port).await);
    // Three copies went through the core: the warm-up and two measured.
    let stats = forward.stats();
    assert_eq!(stats.connections_accepted, 3, "{stats:?}");
    assert_eq!(stats.connections_failed, 0, "{stats:?}");
    assert_eq!(stats.bytes_out, 3 * forward_bytes() as u64, "{stats:?}");
    forward.close();
    forward.closed().await;
    let mib = forward_bytes() as f64 / (1024.0 * 1024.0);
    let plain_rate = mib / plain.as_secs_f64();
    let forward_rate = mib / forwarded.as_secs_f64();

    // Unary latency: SDK and plain tonic, alternating so both see the same
    // machine load.
    let channel = Channel::from_shared(gw.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut native = OpenShellClient::new(channel);
    let mut sdk = sdk_get_latencies(&client, "bench").await;
    let mut plain_grpc = native_get_latencies(&mut native, "bench").await;
    sdk.extend(sdk_get_latencies(&client, "bench").await);
    plain_grpc.extend(native_get_latencies(&mut native, "bench").await);
    sdk.sort();
    plain_grpc.sort();
    let (sdk_p50, sdk_p99) = (percentile(&sdk, 0.50), percentile(&sdk, 0.99));
    let (native_p50, native_p99) = (percentile(&plain_grpc, 0.50), percentile(&plain_grpc, 0.99));

    println!(
        "sdk benchmark ({} MiB per copy, {} GetSandbox calls per client)",
        mib as u64,
        sdk.len()
    );
    println!("  plain loopback TCP copy:      {plain_rate:.0} MiB/s");
    println!("  Client::forward via gateway:  {forward_rate:.0} MiB/s");
    println!(
        "  ratio SDK forward / plain TCP: {:.3}",
        forward_rate / plain_rate
    );
    println!(
        "  GetSandbox via SDK:           p50 {:.3} ms, p99 {:.3} ms",
        ms(sdk_p50),
        ms(sdk_p99)
    );
    println!(
        "  GetSandbox via plain tonic:   p50 {:.3} ms, p99 {:.3} ms",
        ms(native_p50),
        ms(native_p99)
    );
    println!(
        "  ratio SDK vs native:          p50 {:.3}, p99 {:.3}",
        sdk_p50.as_secs_f64() / native_p50.as_secs_f64(),
        sdk_p99.as_secs_f64() / native_p99.as_secs_f64()
    );
}

/// Exec round trips of `true` through `client`, sorted.
async fn exec_latencies(
    client: &openshell_sdk::Client,
    sandbox: &str,
    rounds: usize,
) -> Vec<Duration> {
    use openshell_sdk::{CallOptions, ExecRequest};
    let mut latencies = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let out = client
            .exec(ExecRequest::new(sandbox, ["true"]), CallOptions::new())
            .await
            .unwrap();
        assert_eq!(out.exit_code, 0);
        latencies.push(started.elapsed());
    }
    latencies.sort();
    latencies
}

/// `openshell-bench routing`: a 3-replica cluster behind the built-in edge.
/// Hinted (routing on, so the edge sends every stream to the owner) vs
/// unhinted (routing off, through a second edge whose default route holds
/// only the other replicas, so every stream is relayed by a peer): the same
/// hops but the peer relay. Plus the owner lookup's cost amortised over a
/// session of 100 execs.
async fn routing_bench() {
    use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox};
    use openshell_testkit::cluster::{ClusterOptions, TestCluster, ring_owner};
    use openshell_testkit::edge::Edge;

    let edge = Edge::start(&[]);
    let cluster = TestCluster::start(ClusterOptions {
        replicas: 3,
        supervisor_url: Some(edge.url.clone()),
        extra_args: vec!["--dev".into(), "--member-refresh-ms".into(), "300".into()],
        ..ClusterOptions::default()
    });
    let ids = cluster.ids();
    let routes: Vec<(&str, &str)> = ids
        .iter()
        .zip(&cluster.replicas)
        .map(|(id, gw)| (id.as_str(), gw.url.as_str()))
        .collect();
    edge.set_routes(&routes);
    for gw in &cluster.replicas {
        while gw.metric("openshell_server_ring_members") != Some(3.0) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let connect = |url: String, routing: bool| async move {
        let config = ClientConfig::builder(url)
            .owner_routing(routing)
            .build()
            .unwrap();
        Client::connect(config).await.unwrap()
    };
    let hinted = connect(edge.url.clone(), true).await;
    hinted
        .sandboxes()
        .create(CreateSandbox::new().name("bench"), CallOptions::new())
        .await
        .unwrap();
    let sandbox = hinted
        .sandboxes()
        .wait_ready("bench", CallOptions::new())
        .await
        .unwrap();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let owner = ring_owner(&id_refs, &sandbox.id);
    let others: Vec<(&str, &str)> = routes
        .iter()
        .copied()
        .filter(|(id, _)| *id != owner)
        .collect();
    let relaying_edge = Edge::start(&others);
    let unhinted = connect(relaying_edge.url.clone(), false).await;

    exec_latencies(&hinted, "bench", 20).await;
    exec_latencies(&unhinted, "bench", 20).await;
    let hinted_exec = exec_latencies(&hinted, "bench", 200).await;
    let unhinted_exec = exec_latencies(&unhinted, "bench", 200).await;
    let relayed: f64 = cluster
        .replicas
        .iter()
        .map(|gw| {
            gw.metric(r#"openshell_server_routed_request_attempts_total{operation="relay",route="peer",relay_kind="exec",outcome="success"}"#)
                .unwrap_or(0.0)
        })
        .sum();

    // Forward: best of three copies each way.
    let (port, _server) = sink_server().await;
    let mut rates = Vec::new();
    for client in [&hinted, &unhinted] {
        let forward = client
            .forward("bench", port, "127.0.0.1:0", CallOptions::new())
            .await
            .unwrap();
        let local = forward.local_addr().port();
        plain_tcp_copy(local).await;
        let mut best = Duration::MAX;
        for _ in 0..3 {
            best = best.min(plain_tcp_copy(local).await);
        }
        forward.close();
        rates.push(forward_bytes() as f64 / (1024.0 * 1024.0) / best.as_secs_f64());
    }

    // Owner lookup: a fresh client's first exec pays GetSandbox with
    // want-owner; measure that call directly.
    let mut lookups = Vec::new();
    for _ in 0..200 {
        let started = Instant::now();
        hinted
            .sandboxes()
            .get_with_owner("bench", CallOptions::new())
            .await
            .unwrap();
        lookups.push(started.elapsed());
    }
    lookups.sort();
    let lookup = percentile(&lookups, 0.5);
    let exec_p50 = percentile(&hinted_exec, 0.5);

    println!("routing benchmark (3 replicas behind the built-in edge; sandbox owned by {owner})");
    println!(
        "  exec `true` hinted:    p50 {:.2} ms, p99 {:.2} ms",
        ms(exec_p50),
        ms(percentile(&hinted_exec, 0.99))
    );
    println!(
        "  exec `true` relayed:   p50 {:.2} ms, p99 {:.2} ms ({relayed} execs relayed by a peer)",
        ms(percentile(&unhinted_exec, 0.5)),
        ms(percentile(&unhinted_exec, 0.99)),
    );
    println!(
        "  ratio exec p50 relayed / hinted: {:.3}",
        percentile(&unhinted_exec, 0.5).as_secs_f64() / exec_p50.as_secs_f64()
    );
    println!("  forward hinted:   {:.0} MiB/s", rates[0]);
    println!("  forward relayed:  {:.0} MiB/s", rates[1]);
    println!(
        "  ratio forward hinted / relayed: {:.3}",
        rates[0] / rates[1]
    );
    println!(
        "  owner lookup p50 {:.3} ms; amortised over a session of 100 execs: {:.4} ms per exec ({:.2}% of an exec p50)",
        ms(lookup),
        ms(lookup) / 100.0,
        100.0 * lookup.as_secs_f64() / 100.0 / exec_p50.as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("gateway") | None => gateway_bench().await,
        Some("sdk") => sdk_bench().await,
        Some("routing") => routing_bench().await,
        Some("all") => {
            gateway_bench().await;
            sdk_bench().await;
            routing_bench().await;
        }
        Some(other) => {
            eprintln!("unknown benchmark {other:?}; try: gateway, sdk, routing, all");
            std::process::exit(2);
        }
    }
}
