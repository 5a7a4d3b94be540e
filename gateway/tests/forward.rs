//! ForwardTcp through the gateway and the supervisor to a real TCP server.

mod common;

use common::*;
use openshell_proto::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn init(sandbox: &str, port: u16) -> TcpForwardFrame {
    TcpForwardFrame {
        payload: Some(tcp_forward_frame::Payload::Init(TcpForwardInit {
            sandbox: sandbox.into(),
            target: Some(tcp_forward_init::Target::Tcp(TcpRelayTarget {
                host: "localhost".into(),
                port: port.into(),
            })),
            ..Default::default()
        })),
    }
}

fn data(bytes: &[u8]) -> TcpForwardFrame {
    TcpForwardFrame {
        payload: Some(tcp_forward_frame::Payload::Data(bytes.to_vec().into())),
    }
}

#[tokio::test]
async fn forward_relays_both_ways_and_respects_half_close() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "fwd").await;

    // Reads everything until EOF, then answers with a digest of what it read.
    let server = sandbox_net(&mut client, "fwd")
        .await
        .listen("127.0.0.1:0")
        .unwrap();
    let port = server.local_addr().unwrap().port();
    let served = tokio::spawn(async move {
        let (mut socket, _) = server.accept().await.unwrap();
        let mut received = Vec::new();
        socket.read_to_end(&mut received).await.unwrap();
        let reply = format!("read {} bytes", received.len());
        socket.write_all(reply.as_bytes()).await.unwrap();
        socket.shutdown().await.unwrap();
        received
    });

    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let mut frames = vec![init("fwd", port)];
    frames.extend(payload.chunks(65536).map(data));
    // The request stream ends after the data: the client's half-close.
    let mut stream = client
        .forward_tcp(tokio_stream::iter(frames))
        .await
        .expect("forward")
        .into_inner();
    let mut reply = Vec::new();
    let mut saw_eof = false;
    while let Some(frame) = stream.message().await.expect("frame") {
        match frame.payload {
            Some(tcp_forward_frame::Payload::Data(bytes)) => reply.extend(bytes),
            Some(tcp_forward_frame::Payload::Eof(_)) => saw_eof = true,
            _ => {}
        }
    }
    assert!(saw_eof);
    assert_eq!(String::from_utf8(reply).unwrap(), "read 300000 bytes");
    assert_eq!(served.await.unwrap(), payload);
}

#[tokio::test]
async fn a_closed_port_is_unavailable() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "closed").await;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let result = client
        .forward_tcp(tokio_stream::iter(vec![init("closed", port)]))
        .await;
    let status = match result {
        Err(status) => status,
        Ok(response) => {
            let mut stream = response.into_inner();
            loop {
                match stream.message().await {
                    Err(status) => break status,
                    Ok(None) => panic!("stream ended without an error"),
                    Ok(Some(_)) => {}
                }
            }
        }
    };
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
}

/// Sends `frames`, then reads the answer stream to its end: the data
/// received and how the stream ended.
async fn round_trip(
    client: &mut Client,
    frames: Vec<TcpForwardFrame>,
) -> (Vec<u8>, Result<(), tonic::Status>) {
    let mut stream = match client.forward_tcp(tokio_stream::iter(frames)).await {
        Ok(response) => response.into_inner(),
        Err(status) => return (Vec::new(), Err(status)),
    };
    let mut reply = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(frame)) => {
                if let Some(tcp_forward_frame::Payload::Data(bytes)) = frame.payload {
                    reply.extend_from_slice(&bytes);
                }
            }
            Ok(None) => return (reply, Ok(())),
            Err(status) => return (reply, Err(status)),
        }
    }
}

/// An echo server in `sandbox`'s network: everything it reads it writes
/// back, then half-closes.
async fn echo_server(client: &mut Client, sandbox: &str) -> u16 {
    let server = sandbox_net(client, sandbox)
        .await
        .listen("127.0.0.1:0")
        .unwrap();
    let port = server.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = server.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = socket.into_split();
                tokio::io::copy(&mut r, &mut w).await.unwrap();
                w.shutdown().await.unwrap();
            });
        }
    });
    port
}

/// The largest data frame the gateway takes (1 MiB) and the public 64 KiB
/// chunk both cross intact, straight to the replica and through the edge
/// (whose HTTP/2 frames are larger than the 16 KiB default on both sides).
#[tokio::test]
async fn large_and_public_size_frames_cross_the_gateway_and_the_edge() {
    let gw = start();
    let edge = openshell_testkit::Edge::start(&[("gw-0", gw.url.as_str())]);
    let mut direct = client(&gw).await;
    create_ready(&mut direct, "big").await;
    let channel = tonic::transport::Channel::from_shared(edge.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut via_edge = openshell_proto::open_shell_client::OpenShellClient::with_interceptor(
        channel,
        Bearer(Some(TOKEN.to_owned())),
    )
    .max_decoding_message_size(16 * 1024 * 1024)
    .max_encoding_message_size(16 * 1024 * 1024);
    let port = echo_server(&mut direct, "big").await;
    let payload: Vec<u8> = (0..(3 << 20) + 12_345u32)
        .map(|i| (i % 253) as u8)
        .collect();
    for client in [&mut direct, &mut via_edge] {
        for chunk in [1 << 20, 64 * 1024] {
            let mut frames = vec![init("big", port)];
            frames.extend(payload.chunks(chunk).map(data));
            let (reply, end) = round_trip(client, frames).await;
            end.expect("stream ends with OK");
            assert_eq!(reply.len(), payload.len(), "chunk {chunk}");
            assert!(reply == payload, "chunk {chunk}: bytes changed on the way");
        }
    }
}

/// Sends encoded messages on ForwardTcp; the status the stream ends with.
async fn raw_forward(
    gw: &openshell_testkit::Gateway,
    messages: Vec<bytes::Bytes>,
) -> tonic::Status {
    raw_call::raw_stream(gw, FORWARD_TCP, messages, &[]).await
}

const FORWARD_TCP: &str = "/openshell.v1.OpenShell/ForwardTcp";

/// A frame the gateway cannot decode is the client's fault, first or later.
#[tokio::test]
async fn a_malformed_frame_is_invalid_argument() {
    use prost::Message;
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "bad").await;
    let port = echo_server(&mut client, "bad").await;
    // Field 2 (data) announcing 255 bytes that never come.
    let truncated = bytes::Bytes::from_static(&[0x12, 0xff, 0x01, 0x00]);

    let status = raw_forward(&gw, vec![truncated.clone()]).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("malformed forward frame"),
        "{status:?}"
    );

    let init = bytes::Bytes::from(init("bad", port).encode_to_vec());
    let good = bytes::Bytes::from(data(b"fine").encode_to_vec());
    let status = raw_forward(&gw, vec![init, good, truncated]).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("malformed forward frame"),
        "{status:?}"
    );
}

/// A compressed request is refused before anything runs, and a message over
/// the gateway's size limit (8 MiB) ends the forward with OUT_OF_RANGE.
#[tokio::test]
async fn compressed_and_oversized_messages_are_refused() {
    use prost::Message;
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "big").await;
    let port = echo_server(&mut client, "big").await;
    let init = bytes::Bytes::from(init("big", port).encode_to_vec());

    let status = raw_call::raw_stream(
        &gw,
        FORWARD_TCP,
        vec![init.clone()],
        &[("grpc-encoding", "gzip")],
    )
    .await;
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");

    let huge = bytes::Bytes::from(data(&vec![1; (8 << 20) + 1]).encode_to_vec());
    let status = raw_forward(&gw, vec![init, huge]).await;
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
}

fn rss_bytes(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// A target that does not read stops the sender: what the whole path
/// (HTTP/2 windows, the relay queues, socket buffers) takes in is bounded,
/// the gateway's memory does not grow with what the client would send, and
/// every byte arrives once the target reads again.
#[tokio::test]
async fn a_slow_receiver_bounds_what_the_path_buffers() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    const FRAME: usize = 64 * 1024;
    const LIMIT: u64 = 1 << 30;

    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "slow").await;
    let server = sandbox_net(&mut client, "slow")
        .await
        .listen("127.0.0.1:0")
        .unwrap();
    let port = server.local_addr().unwrap().port();
    let (start_reading, reading) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        let (mut socket, _) = server.accept().await.unwrap();
        let _ = reading.await;
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match socket.read(&mut buf).await.unwrap() {
                0 => return total,
                n => total += n as u64,
            }
        }
    });

    // Frames are made as the transport pulls them, so `pulled` is what the
    // path has taken in.
    let pulled = Arc::new(AtomicU64::new(0));
    let chunk = bytes::Bytes::from(vec![5u8; FRAME]);
    let counter = pulled.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let frames = futures::StreamExt::chain(
        futures::stream::iter(std::iter::once(init("slow", port))),
        futures::stream::unfold((), move |()| {
            let counter = counter.clone();
            let chunk = chunk.clone();
            let stopped = stopped.clone();
            async move {
                if stopped.load(Ordering::SeqCst) || counter.load(Ordering::SeqCst) >= LIMIT {
                    return None;
                }
                counter.fetch_add(FRAME as u64, Ordering::SeqCst);
                Some((
                    TcpForwardFrame {
                        payload: Some(tcp_forward_frame::Payload::Data(chunk)),
                    },
                    (),
                ))
            }
        }),
    );
    let gateway_pid = gw.pid().unwrap();
    let rss_before = rss_bytes(gateway_pid);
    let mut stream = client.forward_tcp(frames).await.unwrap().into_inner();

    // Wait (at most 30 s) until the path stops taking bytes for 2 s.
    let started = std::time::Instant::now();
    let mut last = 0;
    let mut still_since = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(30) {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let now = pulled.load(Ordering::SeqCst);
        if now != last {
            last = now;
            still_since = std::time::Instant::now();
        } else if still_since.elapsed() > std::time::Duration::from_secs(2) {
            break;
        }
    }
    let taken = pulled.load(Ordering::SeqCst);
    let grown = rss_bytes(gateway_pid).saturating_sub(rss_before);
    assert!(
        taken < LIMIT,
        "the path never pushed back ({taken} bytes taken)"
    );
    // HTTP/2 windows (2 MiB a stream on each hop), the relay queues (16
    // frames each) and the sockets' buffers (the kernel may grow a loopback
    // receive buffer to 32 MiB here) hold it all; 1 GiB was on offer.
    assert!(
        taken <= 128 << 20,
        "the path took {} MiB before pushing back",
        taken >> 20
    );
    assert!(
        grown <= 48 << 20,
        "the gateway grew by {} MiB while the target did not read",
        grown >> 20
    );

    // The target reads again: everything taken arrives, then the stream ends.
    stop.store(true, Ordering::SeqCst);
    start_reading.send(()).unwrap();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(_frame) = stream.message().await.unwrap() {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stream did not end after the target read"
    );
    let total = served.await.unwrap();
    assert_eq!(total, pulled.load(Ordering::SeqCst));
}
