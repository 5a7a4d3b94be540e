//! `openshell-bench languages-rust`: the Rust arms of `openshell-bench
//! languages`, as a program of the per-language contract (`contract`): the
//! SDK (`openshell-sdk`) against plain tonic on the same proto, with a
//! tonic ForwardTcp pump (`tonic_pump`) as a tonic user would write it.
//!
//! Per round, each figure runs both clients in a fresh random order:
//! `GetSandbox` latency (batches of 10, interleaved), 100 concurrent
//! `GetSandbox` callers on one client, one iperf3 run through each forward,
//! one exec of `head -c` streaming its stdout. Figures are medians over the
//! rounds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openshell_proto::*;
use openshell_sdk::{CallOptions, Client, ClientConfig, ExecEvent, ExecRequest};
use tokio_stream::StreamExt;

use crate::contract::{Inputs, Row, json_line, median};
use crate::iperf::iperf3_gbit_s;
use crate::measure::{interleaved, percentile, sorted};
use crate::tonic_pump::{self, Tonic, tonic_client};

pub const UNARY_WARMUP: usize = 100;
/// Batches of `UNARY_BATCH` calls per client per round.
pub const UNARY_BATCHES: usize = 100;
pub const UNARY_BATCH: usize = 10;
/// Concurrent callers and calls per caller per round.
pub const CONCURRENT_CALLERS: usize = 100;
pub const CONCURRENT_CALLS_EACH: usize = 20;

/// MiB an exec writes to stdout (`OPENSHELL_BENCH_EXEC_MIB`, default 64).
pub fn exec_mib() -> u64 {
    std::env::var("OPENSHELL_BENCH_EXEC_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&mib| mib > 0)
        .unwrap_or(64)
}

#[derive(Clone)]
enum Arm {
    Sdk(Client),
    Tonic(Tonic),
}

impl Arm {
    async fn get(&self, sandbox: &str) {
        match self {
            Arm::Sdk(client) => {
                let got = client
                    .sandboxes()
                    .get(sandbox, CallOptions::new())
                    .await
                    .expect("GetSandbox via the SDK");
                assert_eq!(got.name, sandbox);
            }
            Arm::Tonic(client) => {
                let got = client
                    .clone()
                    .get_sandbox(GetSandboxRequest {
                        name: sandbox.into(),
                        ..Default::default()
                    })
                    .await
                    .expect("GetSandbox via tonic")
                    .into_inner();
                assert!(got.sandbox.is_some());
            }
        }
    }

    /// Stdout bytes of `head -c BYTES /dev/zero`, streamed.
    async fn exec_stdout(&self, sandbox: &str, bytes: u64) -> u64 {
        let command = ["head", "-c", &bytes.to_string(), "/dev/zero"].map(String::from);
        let mut total = 0u64;
        match self {
            Arm::Sdk(client) => {
                let mut stream = client
                    .exec_stream(ExecRequest::new(sandbox, command), CallOptions::new())
                    .await
                    .expect("exec via the SDK");
                while let Some(event) = stream.next().await {
                    match event.expect("exec event") {
                        ExecEvent::Stdout(data) => total += data.len() as u64,
                        ExecEvent::Stderr(_) => {}
                        ExecEvent::Exit(code) => assert_eq!(code, 0, "head exited with {code}"),
                    }
                }
            }
            Arm::Tonic(client) => {
                let mut stream = client
                    .clone()
                    .exec_sandbox(ExecSandboxRequest {
                        sandbox: sandbox.into(),
                        command: command.to_vec(),
                        ..Default::default()
                    })
                    .await
                    .expect("exec via tonic")
                    .into_inner();
                let mut exit = None;
                while let Some(event) = stream.message().await.expect("exec event") {
                    match event.payload {
                        Some(exec_sandbox_event::Payload::Stdout(out)) => {
                            total += out.data.len() as u64
                        }
                        Some(exec_sandbox_event::Payload::Exit(e)) => exit = Some(e.exit_code),
                        _ => {}
                    }
                }
                assert_eq!(exit, Some(0));
            }
        }
        total
    }
}

/// `callers` tasks making `each` calls on clones of one client: calls per
/// second over the whole batch.
async fn concurrent(arm: &Arm, sandbox: &Arc<str>, callers: usize, each: usize) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (arm, sandbox) = (arm.clone(), sandbox.clone());
            tokio::spawn(async move {
                for _ in 0..each {
                    arm.get(&sandbox).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("caller task");
    }
    (callers * each) as f64 / started.elapsed().as_secs_f64()
}

#[derive(Default)]
struct Samples {
    unary_p50: Vec<f64>,
    unary_p99: Vec<f64>,
    concurrent: Vec<f64>,
    forward: Vec<f64>,
    exec: Vec<f64>,
}

pub async fn run() {
    let inputs = Inputs::from_env();
    let mut config = ClientConfig::builder(inputs.endpoint.clone());
    if let Some(token) = &inputs.token {
        config = config.token(token.as_str());
    }
    let sdk = Client::connect(config.build().expect("client config"))
        .await
        .expect("SDK connect");
    let tonic = tonic_client(&inputs.endpoint, inputs.token.as_deref()).await;
    let arms = [Arm::Sdk(sdk.clone()), Arm::Tonic(tonic.clone())];
    let names = ["sdk", "tonic"];
    let sandbox: Arc<str> = inputs.sandbox.as_str().into();

    // Forwards to the iperf3 server: the SDK's listener and the tonic pump.
    let forward_ports = if inputs.iperf_port > 0 {
        let forward = sdk
            .forward(
                &sandbox,
                inputs.iperf_port,
                "127.0.0.1:0",
                CallOptions::new(),
            )
            .await
            .expect("SDK forward");
        let pump = tonic_pump::start(tonic.clone(), sandbox.to_string(), inputs.iperf_port).await;
        Some((forward, pump))
    } else {
        None
    };

    for arm in &arms {
        for _ in 0..UNARY_WARMUP {
            arm.get(&sandbox).await;
        }
        concurrent(arm, &sandbox, CONCURRENT_CALLERS, 1).await;
    }
    let exec_bytes = exec_mib() * 1024 * 1024;
    let mut samples: [Samples; 2] = Default::default();
    for round in 0..inputs.rounds {
        let mut unary: [Vec<Duration>; 2] = Default::default();
        for arm in interleaved(2, UNARY_BATCHES) {
            for _ in 0..UNARY_BATCH {
                let started = Instant::now();
                arms[arm].get(&sandbox).await;
                unary[arm].push(started.elapsed());
            }
        }
        for (arm, latencies) in unary.into_iter().enumerate() {
            let latencies = sorted(latencies);
            samples[arm]
                .unary_p50
                .push(percentile(&latencies, 0.50).as_secs_f64() * 1e6);
            samples[arm]
                .unary_p99
                .push(percentile(&latencies, 0.99).as_secs_f64() * 1e6);
        }
        for arm in interleaved(2, 1) {
            let rate = concurrent(
                &arms[arm],
                &sandbox,
                CONCURRENT_CALLERS,
                CONCURRENT_CALLS_EACH,
            )
            .await;
            samples[arm].concurrent.push(rate);
        }
        if let Some((forward, pump)) = &forward_ports {
            let ports = [forward.local_addr().port(), pump.port];
            for arm in interleaved(2, 1) {
                let (port, seconds) = (ports[arm], inputs.forward_seconds);
                let gbit = tokio::task::spawn_blocking(move || iperf3_gbit_s(port, seconds))
                    .await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{} forward: {e}", names[arm]));
                samples[arm].forward.push(gbit);
            }
        }
        for arm in interleaved(2, 1) {
            let started = Instant::now();
            let got = arms[arm].exec_stdout(&sandbox, exec_bytes).await;
            let took = started.elapsed();
            assert_eq!(got, exec_bytes, "{} exec stdout bytes", names[arm]);
            samples[arm]
                .exec
                .push(exec_bytes as f64 / (1024.0 * 1024.0) / took.as_secs_f64());
        }
        eprintln!("rust: round {} of {} done", round + 1, inputs.rounds);
    }
    if let Some((forward, pump)) = forward_ports {
        let stats = forward.stats();
        assert_eq!(stats.connections_failed, 0, "{stats:?}");
        forward.close();
        forward.closed().await;
        pump.stop();
    }

    let rows: Vec<Row> = names
        .iter()
        .zip(&samples)
        .map(|(name, s)| Row {
            client: (*name).into(),
            unary_p50_us: median(&s.unary_p50).unwrap(),
            unary_p99_us: median(&s.unary_p99).unwrap(),
            concurrent_per_s: median(&s.concurrent).unwrap(),
            forward_gbit_s: median(&s.forward),
            exec_stdout_mib_s: median(&s.exec),
        })
        .collect();
    println!(
        "rust: openshell-sdk vs tonic, {} rounds (medians); per round {} GetSandbox calls per client, {CONCURRENT_CALLERS} concurrent callers x {CONCURRENT_CALLS_EACH}, one iperf3 -t {} per forward, one exec of {} MiB stdout",
        inputs.rounds,
        UNARY_BATCHES * UNARY_BATCH,
        inputs.forward_seconds,
        exec_mib()
    );
    println!(
        "  {:<8} {:>10} {:>10} {:>12} {:>12} {:>12}",
        "client", "p50 us", "p99 us", "conc/s", "fwd Gbit/s", "exec MiB/s"
    );
    let opt = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
    for row in &rows {
        println!(
            "  {:<8} {:>10.1} {:>10.1} {:>12.0} {:>12} {:>12}",
            row.client,
            row.unary_p50_us,
            row.unary_p99_us,
            row.concurrent_per_s,
            opt(row.forward_gbit_s, 2),
            opt(row.exec_stdout_mib_s, 0)
        );
    }
    println!("{}", json_line("rust", &rows));
}
