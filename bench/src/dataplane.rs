//! `openshell-bench dataplane`: how close the forward data plane gets to what
//! this machine can move, with iperf3 as the program on both ends.
//!
//! One gateway replica (dev mode, `--isolation namespaces`), the built-in
//! edge in front of it, one sandbox; the forwards' `iperf3 -s` listens on
//! the loopback of the sandbox's own network namespace (started there by
//! this process), the limits' on the host's loopback. Beside it a second
//! replica with the same isolation keeping the host's network
//! (`--sandbox-host-network`, a benchmark flag). Arms, each one iperf3 client run of a few seconds to a server:
//!
//! - `raw`: straight to a server over the host's loopback;
//! - `socat xN`: through a chain of N plain TCP relays
//!   (`socat -b 1048576`, one process each) on the host, N = 4 and 3;
//! - `sdk via edge`: into `Client::forward`'s listener with the client
//!   connected to the edge: SDK listener -> edge -> replica -> supervisor ->
//!   server in the sandbox, 4 relays (compared with socat x4);
//! - `sdk direct`: the same with the client connected to the replica: 3
//!   relays (compared with socat x3);
//! - `no netns: sdk direct`: `sdk direct` through the second replica,
//!   whose sandbox's server is on the host's loopback: the forward without
//!   the sandbox's network namespace.
//!
//! Then exec round trips of `true` through both replicas (`isolation`), and
//! the ratios with / without the namespace of the direct forward and of the
//! exec p50 (goals: forward >= 0.95, exec p50 within 10%).
//!
//! One warm-up run per arm, then rounds of every arm in a fresh random order;
//! each arm's median counts. Beside the rates it prints the CPU time each
//! process spent per GB moved (from `/proc/<pid>/stat`): this benchmark
//! process (the SDK's forward, nothing else runs here during a run), the
//! edge, the replica and the supervisor. Every process it starts (gateway,
//! edge, iperf3 servers, socat relays) is stopped by its PID. Needs root
//! (the namespaces).
//!
//! `OPENSHELL_BENCH_DATAPLANE_SECONDS` (default 3) and
//! `OPENSHELL_BENCH_DATAPLANE_ROUNDS` (default 5) size the run;
//! `OPENSHELL_BENCH_DATAPLANE_ARMS` (names or prefixes, comma-separated, for
//! example `sdk via edge`) runs only those arms, with the PIDs printed first,
//! so that a profiler can be attached to one path for a long run.

use std::process::{Command, Stdio};
use std::time::Duration;

use openshell_sdk::{CallOptions, Client, ClientConfig, ForwardHandle};
use openshell_testkit::Edge;
use openshell_testkit::netns::SandboxNet;

use crate::iperf::{free_port, iperf3_server, iperf3_server_in, relay_chain};
use crate::isolation;
use crate::loopback::sandbox_net;
use crate::measure::{cpu_seconds, interleaved};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

fn require(tool: &str) {
    let found = Command::new(tool)
        .arg("-h")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        eprintln!("{tool} is not on PATH: apt-get install -y iperf3 socat");
        std::process::exit(2);
    }
}

/// One iperf3 client run into `port`: bits per second the server received.
/// A run that fails is tried again once, a moment later (a server still
/// finishing the previous test refuses the next one).
fn iperf(port: u16, seconds: u64) -> f64 {
    match iperf_once(port, seconds) {
        Ok(bps) => bps,
        Err(_) => {
            std::thread::sleep(Duration::from_millis(500));
            iperf_once(port, seconds)
                .unwrap_or_else(|why| panic!("iperf3 to port {port} failed: {why}"))
        }
    }
}

fn iperf_once(port: u16, seconds: u64) -> Result<f64, String> {
    let out = Command::new("iperf3")
        .args([
            "-c",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            &seconds.to_string(),
            "-J",
        ])
        .stderr(Stdio::null())
        .output()
        .expect("run iperf3 -c");
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("iperf3 -J output: {e}"))?;
    report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| report["error"].as_str().unwrap_or("no result").to_owned())
}

struct Arm {
    name: &'static str,
    port: u16,
    rates: Vec<f64>,
    /// CPU seconds per GB moved, per watched process, summed over runs.
    cpu: Vec<f64>,
    bytes: f64,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn forward(client: &Client, port: u16) -> ForwardHandle {
    client
        .forward("bench", port, "127.0.0.1:0", CallOptions::new())
        .await
        .unwrap()
}

pub async fn run() {
    require("iperf3");
    require("socat");
    let seconds = env_or("OPENSHELL_BENCH_DATAPLANE_SECONDS", 3);
    let rounds = env_or("OPENSHELL_BENCH_DATAPLANE_ROUNDS", 5) as usize;

    let (gw, direct) = isolation::gateway(0).await;
    let (_plain_gw, plain) = isolation::gateway(1).await;
    let edge = Edge::start(&[("gw-0", gw.url.as_str())]);
    let via_edge = Client::connect(ClientConfig::builder(edge.url.clone()).build().unwrap())
        .await
        .unwrap();

    // A server per arm: iperf3 serves one test at a time, and a test's
    // connections may still be closing along a path when the next begins.
    // The limits' servers are on the host's loopback, the forwards' where
    // the sandbox's 127.0.0.1 is (without its namespace, the host's
    // loopback too).
    let (net, plain_net) = (
        sandbox_net(&direct, "bench").await,
        sandbox_net(&plain, "bench").await,
    );
    let mut servers = Vec::new();
    let mut server = |net: Option<&SandboxNet>| {
        let port = free_port();
        servers.push(match net {
            Some(net) => iperf3_server_in(net, port),
            None => iperf3_server(port),
        });
        port
    };
    let raw = server(None);
    let socat4 = relay_chain(4, server(None));
    let socat3 = relay_chain(3, server(None));
    let forward_edge = forward(&via_edge, server(Some(&net))).await;
    let forward_direct = forward(&direct, server(Some(&net))).await;
    let forward_plain = forward(&plain, server(Some(&plain_net))).await;

    let supervisor = gw.supervisor_pids().first().copied().unwrap_or(0);
    let watched: [(&str, i32); 4] = [
        ("sdk (this process)", std::process::id() as i32),
        ("edge", edge.pid().unwrap_or(0)),
        ("replica", gw.pid().unwrap_or(0)),
        ("supervisor", supervisor),
    ];
    let mut arms: Vec<Arm> = [
        ("raw loopback", raw),
        ("socat x4", socat4.port),
        ("socat x3", socat3.port),
        ("sdk via edge (4 relays)", forward_edge.local_addr().port()),
        ("sdk direct (3 relays)", forward_direct.local_addr().port()),
        (
            "no netns: sdk direct (3 relays)",
            forward_plain.local_addr().port(),
        ),
    ]
    .into_iter()
    .map(|(name, port)| Arm {
        name,
        port,
        rates: Vec::new(),
        cpu: vec![0.0; watched.len()],
        bytes: 0.0,
    })
    .collect();
    if let Ok(only) = std::env::var("OPENSHELL_BENCH_DATAPLANE_ARMS") {
        let wanted: Vec<&str> = only.split(',').map(str::trim).collect();
        arms.retain(|arm| wanted.iter().any(|w| arm.name.starts_with(w)));
        let pids: Vec<String> = watched
            .iter()
            .map(|(name, pid)| format!("{name}={pid}"))
            .collect();
        println!("pids: {}", pids.join(" "));
    }

    // iperf3 blocks its thread: run it off the runtime, whose workers pump
    // the SDK's forwards meanwhile.
    let run_arm = |port: u16, secs: u64| tokio::task::spawn_blocking(move || iperf(port, secs));
    for arm in &arms {
        run_arm(arm.port, 1).await.unwrap();
    }
    for index in interleaved(arms.len(), rounds) {
        let before: Vec<f64> = watched.iter().map(|(_, pid)| cpu_seconds(*pid)).collect();
        let bps = run_arm(arms[index].port, seconds).await.unwrap();
        let after: Vec<f64> = watched.iter().map(|(_, pid)| cpu_seconds(*pid)).collect();
        let arm = &mut arms[index];
        arm.rates.push(bps);
        arm.bytes += bps / 8.0 * seconds as f64;
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            arm.cpu[i] += a - b;
        }
    }
    for forward in [&forward_edge, &forward_direct, &forward_plain] {
        let stats = forward.stats();
        assert_eq!(stats.connections_failed, 0, "{stats:?}");
        forward.close();
    }
    // Exec round trips with and without the namespace (an arms filter
    // skips them).
    let exec = if std::env::var_os("OPENSHELL_BENCH_DATAPLANE_ARMS").is_none() {
        Some(isolation::exec_comparison([&direct, &plain]).await)
    } else {
        None
    };

    let gbit = |arm: &Arm| median(arm.rates.clone()) / 1e9;
    let rate_of = |name: &str| arms.iter().find(|a| a.name.starts_with(name)).map(gbit);
    println!(
        "dataplane benchmark (iperf3, one stream, {seconds} s per run, median of {rounds} interleaved runs per arm, random order per round)"
    );
    for arm in &arms {
        println!("  {:<32} {:>6.2} Gbit/s", arm.name, gbit(arm));
    }
    let ratio = |label: &str, a: &str, b: &str| {
        if let (Some(a), Some(b)) = (rate_of(a), rate_of(b)) {
            println!("  ratio {label:<26} {:.3}", a / b);
        }
    };
    ratio("sdk via edge / socat x4:", "sdk via edge", "socat x4");
    ratio("sdk direct / socat x3:", "sdk direct", "socat x3");
    ratio("sdk via edge / raw:", "sdk via edge", "raw");
    ratio("sdk direct / raw:", "sdk direct", "raw");
    if let (Some(with), Some(without), Some(exec)) =
        (rate_of("sdk direct"), rate_of("no netns"), &exec)
    {
        println!(
            "  with / without the sandbox's network namespace (--isolation namespaces, keeping the host's network or not; forward: sdk direct):"
        );
        isolation::report([with, without], exec);
    }
    println!("  CPU seconds per GB moved (all runs of the arm):");
    print!("    {:<26}", "");
    for (name, _) in &watched {
        print!(" {name:>19}");
    }
    println!();
    for arm in arms.iter().filter(|a| a.name.starts_with("sdk")) {
        print!("    {:<26}", arm.name);
        for cpu in &arm.cpu {
            print!(" {:>19.3}", cpu / (arm.bytes / 1e9));
        }
        println!();
    }
}
