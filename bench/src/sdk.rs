//! `openshell-bench sdk`: the core client (`openshell-sdk`). Forward
//! throughput through `Client::forward` (bytes pushed into the core's local
//! listener, through the gateway and supervisor, to a sink server inside
//! the sandbox's network) as a ratio of a plain loopback TCP copy (to a sink
//! on the host's loopback); and unary `GetSandbox` latency
//! through the SDK against a plain tonic client on its own connection
//! ("SDK vs native"). Both comparisons interleave their arms.

use std::time::{Duration, Instant};

use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::*;
use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox};
use openshell_testkit::{Gateway, GatewayOptions};
use tonic::transport::Channel;

use crate::loopback::{
    forward_bytes, forward_mib, rate, sandbox_net, sink_server, sink_server_in, tcp_copy,
};
use crate::measure::{interleaved, ms, p50_p99, percentile, sorted};

/// Measured copies per arm of the throughput comparison (best one kept).
const COPY_ROUNDS: usize = 3;
/// `GetSandbox`: warm-up calls per client, then rounds of one batch each.
const UNARY_WARMUP: usize = 100;
const UNARY_ROUNDS: usize = 200;
const UNARY_BATCH: usize = 10;

async fn sdk_get(client: &Client, sandbox: &str) -> Duration {
    let started = Instant::now();
    let got = client
        .sandboxes()
        .get(sandbox, CallOptions::new())
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(got.name, sandbox);
    elapsed
}

async fn native_get(client: &mut OpenShellClient<Channel>, sandbox: &str) -> Duration {
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
    elapsed
}

pub async fn run() {
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

    // Forward throughput: the same copy straight to the sink, or into the
    // core's local listener (core -> gateway -> supervisor -> sink); one
    // warm-up each, then alternating in a random order, best copy counts.
    let (port, _server) = sink_server().await;
    let (target, _target_server) = sink_server_in(&sandbox_net(&client, "bench").await);
    let forward = client
        .forward("bench", target, "127.0.0.1:0", CallOptions::new())
        .await
        .unwrap();
    let local_port = forward.local_addr().port();
    tcp_copy(port).await;
    tcp_copy(local_port).await;
    let (mut plain, mut forwarded) = (Duration::MAX, Duration::MAX);
    for arm in interleaved(2, COPY_ROUNDS) {
        if arm == 0 {
            plain = plain.min(tcp_copy(port).await);
        } else {
            forwarded = forwarded.min(tcp_copy(local_port).await);
        }
    }
    // Every forwarded copy went through the core: the warm-up and the rounds.
    let copies = 1 + COPY_ROUNDS as u64;
    let stats = forward.stats();
    assert_eq!(stats.connections_accepted, copies, "{stats:?}");
    assert_eq!(stats.connections_failed, 0, "{stats:?}");
    assert_eq!(
        stats.bytes_out,
        copies * forward_bytes() as u64,
        "{stats:?}"
    );
    forward.close();
    forward.closed().await;
    let (plain_rate, forward_rate) = (rate(plain), rate(forwarded));

    // Unary latency: rounds of one batch through each client, the two in a
    // random order per round.
    let channel = Channel::from_shared(gw.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut native = OpenShellClient::new(channel);
    for _ in 0..UNARY_WARMUP {
        sdk_get(&client, "bench").await;
        native_get(&mut native, "bench").await;
    }
    let (mut sdk, mut plain_grpc) = (Vec::new(), Vec::new());
    for arm in interleaved(2, UNARY_ROUNDS) {
        for _ in 0..UNARY_BATCH {
            if arm == 0 {
                sdk.push(sdk_get(&client, "bench").await);
            } else {
                plain_grpc.push(native_get(&mut native, "bench").await);
            }
        }
    }
    let (sdk, plain_grpc) = (sorted(sdk), sorted(plain_grpc));
    let ratio =
        |p: f64| percentile(&sdk, p).as_secs_f64() / percentile(&plain_grpc, p).as_secs_f64();

    println!(
        "sdk benchmark ({} MiB per copy, best of {COPY_ROUNDS} interleaved copies per path; {} GetSandbox calls per client in {UNARY_ROUNDS} rounds of a batch of {UNARY_BATCH} each, random order per round)",
        forward_mib() as u64,
        sdk.len()
    );
    println!("  plain loopback TCP copy:      {plain_rate:.0} MiB/s");
    println!("  Client::forward via gateway:  {forward_rate:.0} MiB/s");
    println!(
        "  ratio SDK forward / plain TCP: {:.3}",
        forward_rate / plain_rate
    );
    println!("  GetSandbox via SDK:           {}", p50_p99(&sdk));
    println!("  GetSandbox via plain tonic:   {}", p50_p99(&plain_grpc));
    println!(
        "  ratio SDK vs native:          p50 {:.3}, p99 {:.3} (p50 difference {:.3} ms)",
        ratio(0.50),
        ratio(0.99),
        ms(percentile(&sdk, 0.5)) - ms(percentile(&plain_grpc, 0.5))
    );
}
