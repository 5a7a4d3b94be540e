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
//! - `openshell-bench routing`: a 3-replica cluster behind the edge:
//!   hinted vs peer-relayed exec and forward, and the owner lookup's cost.
//! - `openshell-bench config`: push config delivery. One gateway in push
//!   mode with the hidden test driver `none` (sandbox records and token
//!   files, no supervisor processes) and N sdk-core `ConfigSession`s in
//!   this process, one per sandbox (N = 1000, or
//!   `OPENSHELL_BENCH_CONFIG_SESSIONS`): the time for one global setting
//!   change to reach every session, builds per second, and the ratio of
//!   writes to builds under bursts of 1000 writes (to 10 sandboxes, to one,
//!   and to 10 during a global change).
//!   `OPENSHELL_BENCH_CONFIG_BUILD_DELAY_MS` simulates a slower store.
//! - `openshell-bench all`: every one of them.
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

/// `openshell-bench isolation`: what `--isolation namespaces` costs an exec.
/// Two gateways, one isolated and one not, each with one sandbox; `true`
/// execs through the SDK, interleaved in batches so both see the same
/// machine load. Prints both and their ratio.
async fn isolation_bench() {
    use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox};

    let mut clients = Vec::new();
    let mut gateways = Vec::new();
    for mode in ["namespaces", "none"] {
        let gw = Gateway::start(GatewayOptions {
            extra_args: vec!["--isolation".into(), mode.into()],
            ..GatewayOptions::dev()
        });
        let client = Client::connect(ClientConfig::builder(gw.url.clone()).build().unwrap())
            .await
            .unwrap();
        client
            .sandboxes()
            .create(CreateSandbox::new().name("bench"), CallOptions::new())
            .await
            .unwrap();
        client
            .sandboxes()
            .wait_ready("bench", CallOptions::new())
            .await
            .unwrap();
        exec_latencies(&client, "bench", 20).await;
        clients.push(client);
        gateways.push(gw);
    }
    let (mut isolated, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..EXEC_ROUNDS / 20 {
        isolated.extend(exec_latencies(&clients[0], "bench", 20).await);
        plain.extend(exec_latencies(&clients[1], "bench", 20).await);
    }
    isolated.sort();
    plain.sort();
    let (iso50, plain50) = (percentile(&isolated, 0.50), percentile(&plain, 0.50));
    println!("isolation benchmark ({EXEC_ROUNDS} `true` execs each, interleaved)");
    println!(
        "  --isolation namespaces: p50 {:.2} ms, p99 {:.2} ms",
        ms(iso50),
        ms(percentile(&isolated, 0.99))
    );
    println!(
        "  --isolation none:       p50 {:.2} ms, p99 {:.2} ms",
        ms(plain50),
        ms(percentile(&plain, 0.99))
    );
    println!(
        "  ratio namespaces / none (p50): {:.2}",
        iso50.as_secs_f64() / plain50.as_secs_f64()
    );
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
        extra_args: ["--dev", "--allow-test-flags", "--member-refresh-ms", "300"]
            .map(String::from)
            .to_vec(),
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
    // Interleaved, so both see the same machine load.
    let (mut hinted_exec, mut unhinted_exec) = (Vec::new(), Vec::new());
    for _ in 0..200 {
        hinted_exec.extend(exec_latencies(&hinted, "bench", 1).await);
        unhinted_exec.extend(exec_latencies(&unhinted, "bench", 1).await);
    }
    hinted_exec.sort();
    unhinted_exec.sort();
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

// ---------------------------------------------------------------- config

/// Sessions of `openshell-bench config` (`OPENSHELL_BENCH_CONFIG_SESSIONS`
/// overrides).
const CONFIG_SESSIONS_DEFAULT: usize = 1000;
/// A burst: this many writes by `BURST_WRITERS` concurrent writers, to
/// `BURST_SANDBOXES` sandboxes (then to one).
const BURST_WRITES: usize = 1000;
const BURST_SANDBOXES: usize = 10;
const BURST_WRITERS: usize = 8;

fn config_sessions() -> usize {
    std::env::var("OPENSHELL_BENCH_CONFIG_SESSIONS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(CONFIG_SESSIONS_DEFAULT)
}

/// What the simulated supervisors applied, shared by every session's apply
/// function.
struct Fleet {
    /// The value of `bench_wave` being waited for, and when it was written.
    wave: std::sync::Mutex<(String, Instant)>,
    /// Per session: when it applied the current wave (since the write).
    arrivals: std::sync::Mutex<Vec<Duration>>,
    /// Per (sandbox name, `bench_burst_<writer>` key): the last value its
    /// session applied.
    burst: std::sync::Mutex<std::collections::HashMap<(String, String), String>>,
}

fn string_setting(snapshot: &openshell_sdk::ConfigSnapshot, key: &str) -> Option<String> {
    use openshell_proto::sandbox::setting_value::Value;
    match snapshot
        .sandbox_config
        .settings
        .get(key)?
        .value
        .as_ref()?
        .value
        .as_ref()?
    {
        Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn global_setting(key: &str, value: &str) -> UpdateConfigRequest {
    UpdateConfigRequest {
        global: true,
        setting_key: key.into(),
        setting_value: Some(openshell_proto::sandbox::SettingValue {
            value: Some(openshell_proto::sandbox::setting_value::Value::StringValue(
                value.into(),
            )),
        }),
        ..Default::default()
    }
}

fn metric(gw: &Gateway, sample: &str) -> f64 {
    gw.metric(sample).unwrap_or(0.0)
}

fn mark_builds(gw: &Gateway) -> (f64, f64) {
    let count = metric(
        gw,
        r#"openshell_server_config_build_duration_seconds_count{part="sandbox_config",trigger="mark",outcome="ok"}"#,
    );
    let sum = metric(
        gw,
        r#"openshell_server_config_build_duration_seconds_sum{part="sandbox_config",trigger="mark",outcome="ok"}"#,
    );
    (count, sum)
}

/// `openshell-bench config`: push config delivery to many supervisor
/// sessions. One gateway in push mode with the hidden test driver `none`
/// (sandbox records and token files, no supervisor processes); N sdk-core
/// `ConfigSession`s in this process stand in for N supervisors, each on
/// its own HTTP/2 connection with its sandbox's token. Prints the time for
/// one global setting change to reach every session, build throughput, and
/// the writes-to-builds ratio of a burst.
async fn config_bench() {
    use openshell_sdk::{
        ApplyOutcome, CancellationToken, ClientConfig, ConfigSession, ConfigSnapshot, DeliveryMode,
    };
    use std::sync::Arc;

    let sessions = config_sessions();
    // A slower store, simulated: every push build holds its permit this
    // much longer (the gateway's hidden `--config-build-delay-ms`).
    let build_delay_ms: u64 = std::env::var("OPENSHELL_BENCH_CONFIG_BUILD_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut extra_args: Vec<String> = [
        "--config-delivery-mode",
        "push",
        "--allow-test-flags",
        "--driver",
        "none",
        // No reconcile pass during the run: every build is a mark's.
        "--config-reconcile-ms",
        "3600000",
    ]
    .map(String::from)
    .to_vec();
    if build_delay_ms > 0 {
        extra_args.push("--config-build-delay-ms".into());
        extra_args.push(build_delay_ms.to_string());
    }
    let gw = Gateway::start(GatewayOptions {
        extra_args,
        ..GatewayOptions::dev()
    });
    let channel = Channel::from_shared(gw.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = OpenShellClient::new(channel);

    // Sandbox records (no processes): 16 creates at a time.
    let started = Instant::now();
    let permits = Arc::new(tokio::sync::Semaphore::new(16));
    let mut creates = Vec::new();
    for i in 0..sessions {
        let mut client = client.clone();
        let permits = permits.clone();
        creates.push(tokio::spawn(async move {
            let _permit = permits.acquire().await.unwrap();
            let sandbox = client
                .create_sandbox(CreateSandboxRequest {
                    name: format!("cfg-{i}"),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .sandbox
                .unwrap();
            (format!("cfg-{i}"), sandbox.metadata.unwrap().id)
        }));
    }
    let mut sandboxes = Vec::with_capacity(sessions);
    for create in creates {
        sandboxes.push(create.await.unwrap());
    }
    let created = started.elapsed();

    // One ConfigSession per sandbox, on the token the driver wrote.
    let fleet = Arc::new(Fleet {
        wave: std::sync::Mutex::new((String::new(), Instant::now())),
        arrivals: std::sync::Mutex::new(Vec::with_capacity(sessions)),
        burst: std::sync::Mutex::new(std::collections::HashMap::new()),
    });
    let cancel = CancellationToken::new();
    let mut handles = Vec::with_capacity(sessions);
    let started = Instant::now();
    for (name, id) in &sandboxes {
        let token_path = gw.store_dir().join("sandboxes").join(id).join("token");
        let token = std::fs::read_to_string(&token_path).unwrap();
        let config = ClientConfig::builder(gw.url.clone())
            .token(token.as_str())
            .build()
            .unwrap();
        let fleet = fleet.clone();
        let name = name.clone();
        let apply = Arc::new(move |snapshot: ConfigSnapshot| {
            if let Some(wave) = string_setting(&snapshot, "bench_wave") {
                let (want, at) = fleet.wave.lock().unwrap().clone();
                if wave == want {
                    fleet.arrivals.lock().unwrap().push(at.elapsed());
                }
            }
            let mut burst = fleet.burst.lock().unwrap();
            for key in snapshot.sandbox_config.settings.keys() {
                if key.starts_with("bench_burst_")
                    && let Some(value) = string_setting(&snapshot, key)
                {
                    burst.insert((name.clone(), key.clone()), value);
                }
            }
            ApplyOutcome::Applied
        });
        let session = ConfigSession::builder(config, id.clone())
            .apply(apply)
            .build()
            .unwrap();
        let run = {
            let (session, cancel) = (session.clone(), cancel.clone());
            tokio::spawn(async move { session.run(cancel).await })
        };
        handles.push((session, run));
    }
    let connected = |handles: &[(ConfigSession, _)]| {
        handles
            .iter()
            .filter(|(s, _)| {
                let stats = s.stats();
                stats.mode == Some(DeliveryMode::Push) && stats.last_update_id >= 1
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    while connected(&handles) < sessions && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bootstrapped = connected(&handles);
    let connect_time = started.elapsed();
    let gauge = metric(&gw, "openshell_server_config_push_sessions");

    // One global setting change, to every session.
    let mut writer = client.clone();
    let (builds_before, sum_before) = mark_builds(&gw);
    let sent_before = metric(
        &gw,
        r#"openshell_server_config_updates_sent_total{kind="update"}"#,
    );
    *fleet.wave.lock().unwrap() = ("wave-1".into(), Instant::now());
    writer
        .update_config(global_setting("bench_wave", "wave-1"))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while fleet.arrivals.lock().unwrap().len() < bootstrapped && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut arrivals = fleet.arrivals.lock().unwrap().clone();
    arrivals.sort();
    let reached = arrivals.len();
    // Let trailing builds (if any) finish before reading the counters.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (builds_after, sum_after) = mark_builds(&gw);
    let wave_builds = builds_after - builds_before;
    let wave_sent = metric(
        &gw,
        r#"openshell_server_config_updates_sent_total{kind="update"}"#,
    ) - sent_before;
    let all = *arrivals.last().unwrap_or(&Duration::ZERO);

    let targets: Vec<String> = sandboxes
        .iter()
        .take(BURST_SANDBOXES)
        .map(|(name, _)| name.clone())
        .collect();
    // The burst alone (10 sandboxes, then one hot sandbox), then the
    // 10-sandbox burst while a global change to every session is being
    // built (builds wait for permits: marks merge).
    let alone = burst(&gw, &client, &fleet, &targets, "a", None).await;
    let hot = burst(&gw, &client, &fleet, &targets[..1], "h", None).await;
    *fleet.wave.lock().unwrap() = ("wave-2".into(), Instant::now());
    let during = burst(&gw, &client, &fleet, &targets, "b", Some("wave-2")).await;
    let unchanged = metric(&gw, "openshell_server_config_unchanged_total");

    cancel.cancel();
    for (_, run) in handles {
        let _ = run.await;
    }

    println!(
        "config push benchmark: 1 gateway (push, driver none, SQLite, {} build permits), {sessions} sdk-core ConfigSessions in this process (one HTTP/2 connection each){}",
        2 * 8,
        if build_delay_ms > 0 {
            format!("; simulated slow store: +{build_delay_ms} ms per build")
        } else {
            String::new()
        }
    );
    println!(
        "  sandboxes created: {sessions} in {:.2} s; sessions bootstrapped: {bootstrapped}/{sessions} in {:.2} s (push_sessions gauge {gauge})",
        created.as_secs_f64(),
        connect_time.as_secs_f64()
    );
    println!(
        "  global setting -> {reached}/{bootstrapped} sessions applied: all in {:.1} ms (p50 {:.1} ms, p99 {:.1} ms)",
        ms(all),
        ms(percentile_or_zero(&arrivals, 0.50)),
        ms(percentile_or_zero(&arrivals, 0.99)),
    );
    println!(
        "  builds for the change: {wave_builds} (one per session), {wave_sent} updates sent; {:.0} builds/s over the propagation, mean store read per build {:.2} ms",
        wave_builds / all.as_secs_f64().max(1e-9),
        1e3 * (sum_after - sum_before) / wave_builds.max(1.0)
    );
    for (label, b) in [
        ("burst, 10 sandboxes", &alone),
        ("burst, 1 sandbox", &hot),
        ("burst, 10 sandboxes + global change", &during),
    ] {
        println!(
            "  {label}: {} writes ({} to {} sandbox(es) by {BURST_WRITERS} writers{}) in {:.2} s ({:.0} writes/s); {} builds, {} updates sent; every session on its last value: {} after {:.2} s",
            b.writes,
            b.sandbox_writes,
            b.sandboxes,
            if b.global { ", 1 global" } else { "" },
            b.write_time.as_secs_f64(),
            b.writes / b.write_time.as_secs_f64(),
            b.builds,
            b.sent,
            b.converged,
            b.converge_time.as_secs_f64()
        );
        println!(
            "  ratio writes / builds ({label}): {:.2}{}",
            b.writes / b.builds.max(1.0),
            if b.global {
                format!(
                    " (as session-writes: {:.0} sessions marked / {} builds = {:.2})",
                    b.sandbox_writes + bootstrapped as f64,
                    b.builds,
                    (b.sandbox_writes + bootstrapped as f64) / b.builds.max(1.0)
                )
            } else {
                String::new()
            }
        );
    }
    println!("  builds not sent because unchanged (whole run): {unchanged}");
}

struct Burst {
    /// Committed writes (the gateway's publications counter).
    writes: f64,
    sandbox_writes: f64,
    sandboxes: usize,
    global: bool,
    builds: f64,
    sent: f64,
    write_time: Duration,
    converged: bool,
    converge_time: Duration,
}

/// BURST_WRITES writes to `targets` by BURST_WRITERS concurrent writers
/// (each writer its own key, in order, so every last value is known),
/// optionally with a global write of `bench_wave` at the start.
/// Waits until every target's session applied its last value (and every
/// session the wave).
async fn burst(
    gw: &Gateway,
    client: &OpenShellClient<Channel>,
    fleet: &std::sync::Arc<Fleet>,
    targets: &[String],
    tag: &str,
    global: Option<&str>,
) -> Burst {
    let publications = |gw: &Gateway| {
        metric(
            gw,
            r#"openshell_server_config_publications_total{scope="sandbox"}"#,
        ) + metric(
            gw,
            r#"openshell_server_config_publications_total{scope="all"}"#,
        )
    };
    let sent = |gw: &Gateway| {
        metric(
            gw,
            r#"openshell_server_config_updates_sent_total{kind="update"}"#,
        )
    };
    let (published_before, builds_before, sent_before) =
        (publications(gw), mark_builds(gw).0, sent(gw));
    let sessions_before = fleet.arrivals.lock().unwrap().len();
    fleet.arrivals.lock().unwrap().clear();
    // Who writes what: with at least as many sandboxes as writers each
    // sandbox has one writer; otherwise every writer writes every sandbox.
    // Each writer writes its own key (`bench_burst_<writer>`), in order, so
    // the last value of every (sandbox, key) is known.
    let assignment: Vec<Vec<String>> = (0..BURST_WRITERS)
        .map(|w| {
            targets
                .iter()
                .enumerate()
                .filter(|(t, _)| targets.len() < BURST_WRITERS || t % BURST_WRITERS == w)
                .map(|(_, name)| name.clone())
                .collect()
        })
        .collect();
    let pairs: usize = assignment.iter().map(Vec::len).sum();
    let per_pair = BURST_WRITES / pairs;
    let started = Instant::now();
    if let Some(wave) = global {
        client
            .clone()
            .update_config(global_setting("bench_wave", wave))
            .await
            .unwrap();
    }
    let mut writers = Vec::new();
    for (w, mine) in assignment.iter().enumerate() {
        let mut client = client.clone();
        let tag = tag.to_owned();
        let mine = mine.clone();
        writers.push(tokio::spawn(async move {
            for j in 0..per_pair {
                for sandbox in &mine {
                    client
                        .update_config(UpdateConfigRequest {
                            sandbox: sandbox.clone(),
                            setting_key: format!("bench_burst_{w}"),
                            setting_value: Some(openshell_proto::sandbox::SettingValue {
                                value: Some(
                                    openshell_proto::sandbox::setting_value::Value::StringValue(
                                        format!("{tag}-{j}"),
                                    ),
                                ),
                            }),
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                }
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let write_time = started.elapsed();
    let last: std::collections::HashMap<(String, String), String> = assignment
        .iter()
        .enumerate()
        .flat_map(|(w, mine)| {
            let want = format!("{tag}-{}", per_pair - 1);
            mine.iter()
                .map(move |name| ((name.clone(), format!("bench_burst_{w}")), want.clone()))
        })
        .collect();
    let settled = |fleet: &Fleet| {
        let burst = fleet.burst.lock().unwrap();
        last.iter()
            .all(|(slot, want)| burst.get(slot) == Some(want))
            && (global.is_none() || fleet.arrivals.lock().unwrap().len() >= sessions_before)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !settled(fleet) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let converged = settled(fleet);
    let converge_time = started.elapsed();
    // Trailing builds (a mark that arrived during the last build) finish.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Burst {
        writes: publications(gw) - published_before,
        sandbox_writes: (per_pair * pairs) as f64,
        sandboxes: targets.len(),
        global: global.is_some(),
        builds: mark_builds(gw).0 - builds_before,
        sent: sent(gw) - sent_before,
        write_time,
        converged,
        converge_time,
    }
}

fn percentile_or_zero(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        Duration::ZERO
    } else {
        percentile(sorted, p)
    }
}

#[tokio::main]
async fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("gateway") | None => gateway_bench().await,
        Some("sdk") => sdk_bench().await,
        Some("routing") => routing_bench().await,
        Some("config") => config_bench().await,
        Some("isolation") => isolation_bench().await,
        Some("all") => {
            gateway_bench().await;
            sdk_bench().await;
            routing_bench().await;
            config_bench().await;
            isolation_bench().await;
        }
        Some(other) => {
            eprintln!(
                "unknown benchmark {other:?}; try: gateway, sdk, routing, config, isolation, all"
            );
            std::process::exit(2);
        }
    }
}
