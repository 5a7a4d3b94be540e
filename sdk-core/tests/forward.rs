//! `Client::forward` against the real gateway and supervisor: a local
//! listener in the core, one `ForwardTcp` stream per connection, to an echo
//! server in the sandbox's own network.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use openshell_sdk::{CallOptions, CancellationToken, ForwardStats};
use openshell_testkit::eventually;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONNECTIONS: usize = 50;
const PER_CONNECTION: usize = 1024 * 1024;

/// `len` bytes that differ from one `seed` to the next (xorshift).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// Writes `data` (concurrently with reading), half-closes, reads to EOF.
async fn round_trip(addr: SocketAddr, data: Vec<u8>) -> Vec<u8> {
    let socket = TcpStream::connect(addr).await.expect("connect to forward");
    let (mut read, mut write) = socket.into_split();
    let writer = tokio::spawn(async move {
        write.write_all(&data).await.expect("write");
        write.shutdown().await.expect("half-close");
    });
    let mut back = Vec::with_capacity(PER_CONNECTION);
    read.read_to_end(&mut back).await.expect("read to end");
    writer.await.expect("writer");
    back
}

/// A connection attempt right after a close: refused, or accepted by the
/// kernel and then ended (EOF or reset) without a byte.
async fn ended_without_data(addr: SocketAddr) -> bool {
    match TcpStream::connect(addr).await {
        Err(_) => true,
        Ok(mut socket) => {
            let mut buf = [0u8; 16];
            matches!(
                tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf)).await,
                Ok(Ok(0)) | Ok(Err(_))
            )
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_connections_echo_one_mib_each_through_one_handle() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "fwd").await;
    let port = echo_in(&client, &["fwd"]).await;

    let handle = within(
        10,
        "forward",
        client.forward("fwd", port, "127.0.0.1:0", CallOptions::new()),
    )
    .await
    .expect("forward");
    let local = handle.local_addr();
    assert!(local.ip().is_loopback());
    assert_ne!(local.port(), 0);
    assert_eq!(handle.sandbox(), "fwd");
    assert_eq!(handle.remote_port(), port);
    assert!(!handle.is_closed());

    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|i| {
            tokio::spawn(async move {
                let data = pattern(i as u64 + 1, PER_CONNECTION);
                let back = round_trip(local, data.clone()).await;
                assert_eq!(back.len(), data.len(), "connection {i}: length");
                assert!(back == data, "connection {i}: data differs");
            })
        })
        .collect();
    within(240, "50 echo round trips", async {
        for task in tasks {
            task.await.expect("connection task");
        }
    })
    .await;

    let total = (CONNECTIONS * PER_CONNECTION) as u64;
    let want = ForwardStats {
        connections_accepted: CONNECTIONS as u64,
        connections_active: 0,
        connections_failed: 0,
        bytes_in: total,
        bytes_out: total,
    };
    assert!(
        eventually(Duration::from_secs(10), || handle.stats() == want).await,
        "stats {:?}, want {want:?}",
        handle.stats()
    );

    // Each connection was its own ForwardTcp relay through the gateway.
    let relays = gw.metric(r#"openshell_server_relays_opened_total{kind="tcp"}"#);
    assert_eq!(relays, Some(CONNECTIONS as f64));
    let ok = r#"openshell_server_requests_total{method="ForwardTcp",code="ok"}"#;
    assert!(
        eventually(Duration::from_secs(10), || gw.metric(ok)
            == Some(CONNECTIONS as f64))
        .await,
        "{ok} = {:?}",
        gw.metric(ok)
    );

    // Close twice is fine; afterwards new connections are refused.
    handle.close();
    handle.close();
    assert!(handle.is_closed());
    assert!(
        within(10, "connection after close", ended_without_data(local)).await,
        "a connection right after close() got data or hung"
    );
    within(10, "closed()", handle.closed()).await;
    handle.close();
    let refused = within(10, "connect after close", TcpStream::connect(local)).await;
    let err = refused.expect_err("the listener is closed after close()");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    assert_eq!(handle.stats().connections_failed, 0);
}

#[tokio::test]
async fn close_ends_active_connections_and_a_cancel_token_closes_the_forward() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "fwdclose").await;
    let port = echo_in(&client, &["fwdclose"]).await;

    let handle = client
        .forward("fwdclose", port, "127.0.0.1:0", CallOptions::new())
        .await
        .expect("forward");
    let mut socket = TcpStream::connect(handle.local_addr()).await.unwrap();
    socket.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    within(10, "echo", socket.read_exact(&mut buf))
        .await
        .unwrap();
    assert_eq!(&buf, b"ping");
    assert!(
        eventually(Duration::from_secs(5), || handle.stats().connections_active
            == 1)
        .await
    );

    // Closing ends the open connection, not only the listener.
    handle.close();
    within(10, "closed()", handle.closed()).await;
    let mut rest = Vec::new();
    let ended = within(10, "connection end", socket.read_to_end(&mut rest)).await;
    assert!(ended.is_err() || rest.is_empty(), "{ended:?} {rest:?}");
    assert_eq!(handle.stats().connections_active, 0);
    assert_eq!(
        handle.stats().connections_failed,
        0,
        "closing is not a failure"
    );

    // The cancellation token of the call options closes a forward too.
    let token = CancellationToken::new();
    let handle = client
        .forward(
            "fwdclose",
            port,
            "127.0.0.1:0",
            CallOptions::new().cancel_token(token.clone()),
        )
        .await
        .expect("forward");
    let local = handle.local_addr();
    let back = within(20, "round trip", round_trip(local, b"through".to_vec())).await;
    assert_eq!(back, b"through");
    token.cancel();
    assert!(handle.is_closed());
    within(10, "closed()", handle.closed()).await;
    let accepted = handle.stats().connections_accepted;
    match TcpStream::connect(local).await {
        Err(err) => assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused),
        // Another test's listener may have been given the freed port: what
        // counts is that this forward accepts nothing more.
        Ok(_) => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(
                handle.stats().connections_accepted,
                accepted,
                "closed by the token, yet it accepted"
            );
        }
    }

    // Dropping the handle closes it as well.
    let handle = client
        .forward("fwdclose", port, "127.0.0.1:0", CallOptions::new())
        .await
        .expect("forward");
    let local = handle.local_addr();
    drop(handle);
    let mut refused = false;
    for _ in 0..100 {
        if TcpStream::connect(local).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused, "a dropped forward still accepts connections");
}

#[tokio::test]
async fn a_connection_to_a_closed_remote_port_ends_and_counts_as_failed() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "fwdfail").await;
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let handle = client
        .forward("fwdfail", closed_port, "127.0.0.1:0", CallOptions::new())
        .await
        .expect("forward binds even if the remote port is closed");
    let mut socket = TcpStream::connect(handle.local_addr()).await.unwrap();
    let mut rest = Vec::new();
    let ended = within(20, "connection end", socket.read_to_end(&mut rest)).await;
    assert!(ended.is_err() || rest.is_empty(), "{ended:?}");
    assert!(
        eventually(Duration::from_secs(10), || {
            let s = handle.stats();
            s.connections_failed == 1 && s.connections_active == 0
        })
        .await,
        "{:?}",
        handle.stats()
    );
    assert_eq!(handle.stats().connections_accepted, 1);

    // A forward to a sandbox that does not exist fails per connection too.
    let handle = client
        .forward(
            "no-such-box",
            closed_port,
            "127.0.0.1:0",
            CallOptions::new(),
        )
        .await
        .expect("forward");
    let mut socket = TcpStream::connect(handle.local_addr()).await.unwrap();
    let mut rest = Vec::new();
    let ended = within(20, "connection end", socket.read_to_end(&mut rest)).await;
    assert!(ended.is_err() || rest.is_empty(), "{ended:?}");
    assert!(
        eventually(Duration::from_secs(10), || handle
            .stats()
            .connections_failed
            == 1)
        .await,
        "{:?}",
        handle.stats()
    );

    // Bad arguments fail before binding.
    let err = client
        .forward("", 80, "127.0.0.1:0", CallOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "invalid_config");
    let err = client
        .forward("fwdfail", 0, "127.0.0.1:0", CallOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "invalid_config");
    // A local address that cannot be bound is `io`.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let err = client
        .forward(
            "fwdfail",
            80,
            taken.local_addr().unwrap(),
            CallOptions::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "io", "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_io_pumps_one_stream_over_any_reader_and_writer() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "fwd-io").await;
    let port = echo_in(&client, &["fwd-io"]).await;

    // 1 MiB through a duplex pipe, both ways at once, with half-close.
    let data = pattern(99, PER_CONNECTION);
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let (read, write) = tokio::io::split(theirs);
    let pumping = client.forward_io(
        "fwd-io",
        openshell_sdk::ForwardTarget::Tcp(port),
        None,
        read,
        write,
        CallOptions::new(),
    );
    let (mut our_read, mut our_write) = tokio::io::split(ours);
    let sent = data.clone();
    let talking = async move {
        let writer = async {
            our_write.write_all(&sent).await.unwrap();
            our_write.shutdown().await.unwrap();
        };
        let reader = async {
            let mut back = Vec::new();
            our_read.read_to_end(&mut back).await.unwrap();
            back
        };
        let ((), back) = tokio::join!(writer, reader);
        back
    };
    let (stats, back) = within(60, "forward_io", async { tokio::join!(pumping, talking) }).await;
    let stats = stats.expect("forward_io");
    assert!(back == data, "data differs");
    assert_eq!(stats.bytes_out, PER_CONNECTION as u64);
    assert_eq!(stats.bytes_in, PER_CONNECTION as u64);
    assert_eq!(stats.connections_failed, 0);

    // A missing sandbox fails with the gateway's code.
    let (_ours, theirs) = tokio::io::duplex(1024);
    let (read, write) = tokio::io::split(theirs);
    let err = within(
        30,
        "forward_io to a missing sandbox",
        client.forward_io(
            "no-such",
            openshell_sdk::ForwardTarget::Tcp(port),
            None,
            read,
            write,
            CallOptions::new(),
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");

    // Cancelling ends it with `cancelled`.
    let token = CancellationToken::new();
    let (_ours, theirs) = tokio::io::duplex(1024);
    let (read, write) = tokio::io::split(theirs);
    let pumping = client.forward_io(
        "fwd-io",
        openshell_sdk::ForwardTarget::Tcp(port),
        None,
        read,
        write,
        CallOptions::new().cancel_token(token.clone()),
    );
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        token.cancel();
    };
    let (result, ()) = within(30, "cancelled forward_io", async {
        tokio::join!(pumping, cancel)
    })
    .await;
    assert_eq!(result.unwrap_err().code(), "cancelled");

    // Bad arguments are refused before any I/O.
    for (sandbox, target) in [
        ("", openshell_sdk::ForwardTarget::Tcp(1)),
        ("fwd-io", openshell_sdk::ForwardTarget::Tcp(0)),
    ] {
        let (_ours, theirs) = tokio::io::duplex(16);
        let (read, write) = tokio::io::split(theirs);
        let err = client
            .forward_io(sandbox, target, None, read, write, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(err.code(), "invalid_config");
    }
}
