//! `openshell-bench isolation`: what a sandbox's network namespace costs.
//! Under `--isolation namespaces` every sandbox has a network namespace of
//! its own (besides its user, mount and PID namespaces), and a forward's
//! target is dialed from inside it. The comparison that isolates the
//! network namespace is against the same isolation keeping the host's
//! network (`--sandbox-host-network`, a benchmark flag): every other
//! namespace, the same exec helper, one `setns` fewer.
//!
//! Two gateways (dev mode), one per arm, each with one sandbox:
//!
//! - exec: `true` through the SDK in rounds of one batch per gateway, the
//!   two in a random order per round;
//! - forward: iperf3 (one stream) through the SDK's forward, direct to the
//!   replica, into an `iperf3 -s` in the sandbox's network (without the
//!   namespace that is the host's loopback), one warm-up run each, then
//!   rounds of one run per gateway in a random order; medians.
//!
//! Prints both and their ratios against the goals: forward with the
//! namespace at least 0.95 of without, exec p50 within 10%; then, for
//! context, exec under `--isolation none` (no namespace at all).
//! `OPENSHELL_BENCH_ROUNDS` (default 5) and `OPENSHELL_BENCH_FORWARD_SECONDS`
//! (default 3) size the forward comparison. Needs root (the namespaces) and
//! iperf3 (`make bench` installs it). `openshell-bench dataplane` prints the
//! same ratio lines for its direct forward.

use std::time::Duration;

use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, ForwardHandle};
use openshell_testkit::{Gateway, GatewayOptions};

use crate::iperf::{self, Process};
use crate::measure::{exec_round_trips, interleaved, ms, p50_p99, percentile, sorted};

const ROUNDS: usize = 30;
const BATCH: usize = 10;
const WARMUP: usize = 20;
/// The arms compared, in the order of every pair here: with the sandbox's
/// network namespace, then without it (the same isolation otherwise).
pub const ARMS: [&str; 2] = ["own network namespace", "host's network"];
/// Each arm's gateway flags; `NONE` is the context arm.
const ARM_FLAGS: [&[&str]; 2] = [
    &["--isolation", "namespaces"],
    &[
        "--isolation",
        "namespaces",
        "--allow-test-flags",
        "--sandbox-host-network",
    ],
];
const NONE: &[&str] = &["--isolation", "none"];
/// Goals: forward with / without at least this, exec p50 with / without at
/// most this.
const FORWARD_GOAL: f64 = 0.95;
const EXEC_GOAL: f64 = 1.10;

/// A dev gateway of arm `arm` (an index into [`ARMS`]) and one READY
/// sandbox, `bench`, with a client connected to it.
pub async fn gateway(arm: usize) -> (Gateway, Client) {
    gateway_with(ARM_FLAGS[arm]).await
}

async fn gateway_with(flags: &[&str]) -> (Gateway, Client) {
    let gw = Gateway::start(GatewayOptions {
        extra_args: flags.iter().map(|f| (*f).to_owned()).collect(),
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
    (gw, client)
}

/// A forward of `client` into an `iperf3 -s` in the network of its sandbox
/// `bench` (both stop when dropped: the server by its PID).
struct IperfForward {
    forward: ForwardHandle,
    _server: Process,
}

impl IperfForward {
    async fn start(client: &Client) -> Self {
        let net = crate::loopback::sandbox_net(client, "bench").await;
        let port = iperf::free_port();
        let server = iperf::iperf3_server_in(&net, port);
        let forward = client
            .forward("bench", port, "127.0.0.1:0", CallOptions::new())
            .await
            .unwrap();
        Self {
            forward,
            _server: server,
        }
    }

    /// The local port to run `iperf3 -c` into.
    fn port(&self) -> u16 {
        self.forward.local_addr().port()
    }
}

/// `true` round trips through each client (one per arm), in rounds of one
/// batch per client in a random order, after a warm-up: sorted.
pub async fn exec_comparison<const N: usize>(clients: [&Client; N]) -> [Vec<Duration>; N] {
    for client in clients {
        exec_round_trips(client, "bench", WARMUP).await;
    }
    let mut samples = std::array::from_fn(|_| Vec::new());
    for arm in interleaved(N, ROUNDS) {
        samples[arm].extend(exec_round_trips(clients[arm], "bench", BATCH).await);
    }
    samples.map(sorted)
}

/// The exec figures and both ratio lines (with / without the namespace)
/// of `forward` (Gbit/s, by mode) and `exec` (sorted round trips, by mode).
pub fn report(forward: [f64; 2], exec: &[Vec<Duration>; 2]) {
    println!(
        "  exec `true`, {} per arm in {ROUNDS} rounds of a batch of {BATCH}, random order per round:",
        ROUNDS * BATCH
    );
    for (arm, samples) in ARMS.iter().zip(exec) {
        println!("    {:<25} {}", format!("{arm}:"), p50_p99(samples));
    }
    let met = |ok: bool| if ok { "met" } else { "NOT MET" };
    let forward_ratio = forward[0] / forward[1];
    println!(
        "  ratio forward own netns / host's network:  {forward_ratio:.3} (goal >= {FORWARD_GOAL:.2}: {})",
        met(forward_ratio >= FORWARD_GOAL)
    );
    let [with, without] = exec.each_ref().map(|s| percentile(s, 0.5));
    let exec_ratio = with.as_secs_f64() / without.as_secs_f64();
    println!(
        "  ratio exec p50 own netns / host's network: {exec_ratio:.3} (difference {:.3} ms; goal <= {EXEC_GOAL:.2}: {})",
        ms(with) - ms(without),
        met(exec_ratio <= EXEC_GOAL)
    );
}

/// For context: exec under `--isolation none` (no namespace at all)
/// against the sandbox with its own network namespace, measured
/// interleaved like the arms.
pub async fn none_context(with_netns: &Client) {
    let (_gw, none) = gateway_with(NONE).await;
    let [with, without] = exec_comparison([with_netns, &none])
        .await
        .map(|s| percentile(&s, 0.5));
    println!(
        "  context: exec p50 own netns {:.3} ms, --isolation none {:.3} ms ({:.2}x: the user, mount and PID namespaces and the enter helper, not the network)",
        ms(with),
        ms(without),
        with.as_secs_f64() / without.as_secs_f64()
    );
}

/// One `iperf3 -c` run into `port` (Gbit/s), tried again once a moment
/// later if it fails (a server still finishing the previous test refuses
/// the next one).
async fn iperf_run(port: u16, seconds: u64) -> f64 {
    tokio::task::spawn_blocking(move || {
        iperf::iperf3_gbit_s(port, seconds).unwrap_or_else(|_| {
            std::thread::sleep(Duration::from_millis(500));
            iperf::iperf3_gbit_s(port, seconds)
                .unwrap_or_else(|e| panic!("iperf3 through the forward: {e}"))
        })
    })
    .await
    .unwrap()
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

pub async fn run() {
    let rounds = env_or("OPENSHELL_BENCH_ROUNDS", 5) as usize;
    let seconds = env_or("OPENSHELL_BENCH_FORWARD_SECONDS", 3);
    let mut gateways = Vec::new();
    let mut clients = Vec::new();
    for arm in 0..ARMS.len() {
        let (gw, client) = gateway(arm).await;
        gateways.push(gw);
        clients.push(client);
    }
    let exec = exec_comparison([&clients[0], &clients[1]]).await;

    let mut forwards = Vec::new();
    for client in &clients {
        let forward = IperfForward::start(client).await;
        iperf_run(forward.port(), 1).await;
        forwards.push(forward);
    }
    let mut rates = [Vec::new(), Vec::new()];
    for arm in interleaved(2, rounds) {
        rates[arm].push(iperf_run(forwards[arm].port(), seconds).await);
    }
    for forward in &forwards {
        let stats = forward.forward.stats();
        assert_eq!(stats.connections_failed, 0, "{stats:?}");
        forward.forward.close();
    }
    let forward = rates.map(|r| crate::contract::median(&r).unwrap_or(f64::NAN));

    println!(
        "isolation benchmark (--isolation namespaces, the sandbox with its own network namespace against the same isolation keeping the host's network)"
    );
    println!(
        "  forward (SDK, direct to the replica; iperf3 one stream, {seconds} s per run, median of {rounds} interleaved runs per mode):"
    );
    for (arm, gbit) in ARMS.iter().zip(forward) {
        println!("    {:<25} {gbit:.2} Gbit/s", format!("{arm}:"));
    }
    report(forward, &exec);
    none_context(&clients[0]).await;
}
