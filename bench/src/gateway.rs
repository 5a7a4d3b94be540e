//! `openshell-bench gateway`: exec round-trip latency of `true` through a
//! plain tonic client, and ForwardTcp throughput through the gateway as a
//! ratio of a plain loopback TCP copy of the same bytes. The forward's sink
//! listens inside the sandbox's network (where its 127.0.0.1 is), the plain
//! copy's on the host's loopback.

use std::time::{Duration, Instant};

use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::*;
use openshell_testkit::{Gateway, GatewayOptions};
use tonic::transport::Channel;

use crate::loopback::{
    CHUNK, forward_bytes, forward_mib, rate, sandbox_net, sink_server, sink_server_in, tcp_copy,
};
use crate::measure::{interleaved, p50_p99, sorted};

const EXEC_ROUNDS: usize = 300;
const EXEC_WARMUP: usize = 20;
/// Measured copies per arm of the throughput comparison (best one kept).
const COPY_ROUNDS: usize = 3;

/// One ForwardTcp stream carrying `forward_bytes()` to the sink at `port`.
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
                payload: Some(tcp_forward_frame::Payload::Data(chunk.clone().into())),
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

async fn exec_true(client: &mut OpenShellClient<Channel>, sandbox: &str) -> Duration {
    let started = Instant::now();
    let mut stream = client
        .exec_sandbox(ExecSandboxRequest {
            sandbox: sandbox.into(),
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
    started.elapsed()
}

pub async fn run() {
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

    // Exec round trip of `true` (one arm, nothing to interleave).
    for _ in 0..EXEC_WARMUP {
        exec_true(&mut client, "bench").await;
    }
    let mut latencies = Vec::with_capacity(EXEC_ROUNDS);
    for _ in 0..EXEC_ROUNDS {
        latencies.push(exec_true(&mut client, "bench").await);
    }
    let latencies = sorted(latencies);

    // Throughput: plain copies and forwarded copies alternate in a random
    // order after one warm-up each; the best copy of each arm counts.
    let sdk = openshell_sdk::Client::connect(
        openshell_sdk::ClientConfig::builder(gw.url.clone())
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let net = sandbox_net(&sdk, "bench").await;
    let (port, _server) = sink_server().await;
    let (target, _target_server) = sink_server_in(&net);
    tcp_copy(port).await;
    forward_copy(&mut client, "bench", target).await;
    let (mut plain, mut forwarded) = (Duration::MAX, Duration::MAX);
    for arm in interleaved(2, COPY_ROUNDS) {
        if arm == 0 {
            plain = plain.min(tcp_copy(port).await);
        } else {
            forwarded = forwarded.min(forward_copy(&mut client, "bench", target).await);
        }
    }
    let (plain_rate, forward_rate) = (rate(plain), rate(forwarded));

    println!(
        "gateway benchmark ({} MiB per copy, best of {COPY_ROUNDS} interleaved copies per path; {EXEC_ROUNDS} execs)",
        forward_mib() as u64
    );
    println!("  exec `true` round trip: {}", p50_p99(&latencies));
    println!("  plain loopback TCP copy: {plain_rate:.0} MiB/s");
    println!("  ForwardTcp via gateway:  {forward_rate:.0} MiB/s");
    println!(
        "  ratio forward / plain TCP: {:.3}",
        forward_rate / plain_rate
    );
}
