//! `openshell-bench gateway`: starts the real gateway (binaries from
//! `OPENSHELL_BIN_DIR`, release builds via `make bench`) and prints, in one
//! run: exec round-trip latency of `true` (p50, p99), and ForwardTcp
//! throughput through the gateway as a ratio of a plain loopback TCP copy of
//! the same bytes.

use std::time::{Duration, Instant};

use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::*;
use openshell_testkit::{Gateway, GatewayOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::Channel;

const EXEC_ROUNDS: usize = 300;
const FORWARD_BYTES: usize = 256 * 1024 * 1024;
const CHUNK: usize = 64 * 1024;

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
    for _ in 0..FORWARD_BYTES / CHUNK {
        socket.write_all(&chunk).await.unwrap();
    }
    socket.shutdown().await.unwrap();
    let mut count = [0u8; 8];
    socket.read_exact(&mut count).await.unwrap();
    assert_eq!(u64::from_be_bytes(count), FORWARD_BYTES as u64);
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
        for _ in 0..FORWARD_BYTES / CHUNK {
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
        FORWARD_BYTES as u64
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
    let mib = FORWARD_BYTES as f64 / (1024.0 * 1024.0);
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

#[tokio::main]
async fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("gateway") | None => gateway_bench().await,
        Some(other) => {
            eprintln!("unknown benchmark {other:?}; try: gateway");
            std::process::exit(2);
        }
    }
}
