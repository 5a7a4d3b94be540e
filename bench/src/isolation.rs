//! `openshell-bench isolation`: what `--isolation namespaces` costs against
//! `--isolation none`, whose sandbox shares the host's network: with
//! namespaces every sandbox has a network namespace of its own (and its
//! own user, mount and PID namespaces), and a forward's target is dialed
//! from inside it.
//!
//! Two gateways (dev mode), one per mode, each with one sandbox:
//!
//! - exec: `true` through the SDK in rounds of one batch per gateway, the
//!   two in a random order per round;
//! - forward: iperf3 (one stream) through the SDK's forward, direct to the
//!   replica, into an `iperf3 -s` in the sandbox's network (under `none`
//!   that is the host's loopback), one warm-up run each, then rounds of one
//!   run per gateway in a random order; medians.
//!
//! Prints both and their ratios against the goals: forward with the
//! namespace at least 0.95 of without, exec p50 within 10%.
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
/// The modes compared, in the order of every pair here: with the sandbox's
/// network namespace, then without.
const MODES: [&str; 2] = ["namespaces", "none"];
/// Goals: forward with / without at least this, exec p50 with / without at
/// most this.
const FORWARD_GOAL: f64 = 0.95;
const EXEC_GOAL: f64 = 1.10;

/// A dev gateway with `--isolation MODE` and one READY sandbox, `bench`,
/// with a client connected to it.
pub async fn gateway(mode: &str) -> (Gateway, Client) {
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

/// `true` round trips through each client (one per mode), in rounds of one
/// batch per client in a random order, after a warm-up: sorted.
pub async fn exec_comparison(clients: [&Client; 2]) -> [Vec<Duration>; 2] {
    for client in clients {
        exec_round_trips(client, "bench", WARMUP).await;
    }
    let mut samples = [Vec::new(), Vec::new()];
    for arm in interleaved(2, ROUNDS) {
        samples[arm].extend(exec_round_trips(clients[arm], "bench", BATCH).await);
    }
    samples.map(sorted)
}

/// The exec figures and both ratio lines (with / without the namespace)
/// of `forward` (Gbit/s, by mode) and `exec` (sorted round trips, by mode).
pub fn report(forward: [f64; 2], exec: &[Vec<Duration>; 2]) {
    println!(
        "  exec `true`, {} per mode in {ROUNDS} rounds of a batch of {BATCH}, random order per round:",
        ROUNDS * BATCH
    );
    for (mode, samples) in MODES.iter().zip(exec) {
        println!(
            "    {:<25} {}",
            format!("--isolation {mode}:"),
            p50_p99(samples)
        );
    }
    let met = |ok: bool| if ok { "met" } else { "NOT MET" };
    let forward_ratio = forward[0] / forward[1];
    println!(
        "  ratio forward namespaces / none:  {forward_ratio:.3} (goal >= {FORWARD_GOAL:.2}: {})",
        met(forward_ratio >= FORWARD_GOAL)
    );
    let [with, without] = exec.each_ref().map(|s| percentile(s, 0.5));
    let exec_ratio = with.as_secs_f64() / without.as_secs_f64();
    println!(
        "  ratio exec p50 namespaces / none: {exec_ratio:.3} (difference {:.3} ms; goal <= {EXEC_GOAL:.2}: {})",
        ms(with) - ms(without),
        met(exec_ratio <= EXEC_GOAL)
    );
    println!(
        "  (namespaces differ from none in the user, mount and PID namespaces too: an exec's enter helper joins them all, so the exec ratio is theirs together, not the network namespace's alone)"
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
    for mode in MODES {
        let (gw, client) = gateway(mode).await;
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
        "isolation benchmark (--isolation namespaces: a network namespace per sandbox; none: the host's network)"
    );
    println!(
        "  forward (SDK, direct to the replica; iperf3 one stream, {seconds} s per run, median of {rounds} interleaved runs per mode):"
    );
    for (mode, gbit) in MODES.iter().zip(forward) {
        println!(
            "    {:<25} {gbit:.2} Gbit/s",
            format!("--isolation {mode}:")
        );
    }
    report(forward, &exec);
}
