//! The plain loopback TCP side of the forward benchmarks: a sink server and
//! a timed copy into it, and the sandbox's network a forward's target
//! listens in.
//!
//! Every isolated sandbox has a network namespace of its own (loopback
//! only): a forward to 127.0.0.1:PORT reaches the sandbox's port, never a
//! listener of this process on the host. So a forward's target is bound
//! inside the sandbox's namespace ([`sandbox_net`], [`sink_server_in`]) by
//! this process, as before but in the right namespace: nothing else on the
//! data path changes. A plain copy's sink (the baseline) stays on the
//! host's loopback ([`sink_server`]): the same kernel loopback, no forward.

use std::time::{Duration, Instant};

use openshell_sdk::{CallOptions, Client, ExecRequest};
use openshell_testkit::netns::{PRINT_NETNS, SandboxNet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const CHUNK: usize = 64 * 1024;
const FORWARD_MIB_DEFAULT: usize = 256;

/// Bytes per copy: 256 MiB, or `OPENSHELL_BENCH_FORWARD_MIB` MiB (a smaller
/// figure makes a quick smoke run of debug builds practical).
pub fn forward_bytes() -> usize {
    std::env::var("OPENSHELL_BENCH_FORWARD_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&mib| mib > 0)
        .unwrap_or(FORWARD_MIB_DEFAULT)
        * 1024
        * 1024
}

pub fn forward_mib() -> f64 {
    forward_bytes() as f64 / (1024.0 * 1024.0)
}

/// MiB/s of one copy of `forward_bytes()` that took `took`.
pub fn rate(took: Duration) -> f64 {
    forward_mib() / took.as_secs_f64()
}

/// The network namespace of `sandbox` (its own under isolation, else this
/// process's): what its forwards to 127.0.0.1 reach.
pub async fn sandbox_net(client: &Client, sandbox: &str) -> SandboxNet {
    let out = client
        .exec(
            ExecRequest::new(sandbox, PRINT_NETNS),
            CallOptions::new().deadline(Duration::from_secs(30)),
        )
        .await
        .unwrap_or_else(|e| panic!("reading the network namespace of {sandbox}: {e}"));
    SandboxNet::from_link(&String::from_utf8_lossy(&out.stdout))
        .unwrap_or_else(|e| panic!("the network namespace of {sandbox}: {e}"))
}

/// Accepts connections on the host's loopback and discards everything;
/// replies with the count. The plain copy's sink.
pub async fn sink_server() -> (u16, tokio::task::JoinHandle<()>) {
    serve_sink(TcpListener::bind("127.0.0.1:0").await.unwrap())
}

/// [`sink_server`] inside a sandbox's network: a forward's target.
pub fn sink_server_in(net: &SandboxNet) -> (u16, tokio::task::JoinHandle<()>) {
    serve_sink(
        net.listen("127.0.0.1:0")
            .expect("a sink in the sandbox's network"),
    )
}

fn serve_sink(listener: TcpListener) -> (u16, tokio::task::JoinHandle<()>) {
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

/// Copies `forward_bytes()` into `port` (the sink, or a local forward
/// listener in front of it) and waits for the sink's count.
pub async fn tcp_copy(port: u16) -> Duration {
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
