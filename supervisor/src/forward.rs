//! TCP relays: one gateway relay stream <-> one loopback TCP connection.
//!
//! Only loopback targets are connected, whatever the gateway asks. An
//! isolated sandbox's loopback is its own (its network namespace, which the
//! socket is made in); without isolation it is the host's. Never the network
//! beyond.
//! The connection is made before the relay is claimed, so a refused port is
//! reported as a failed `relay_open_result` instead of an empty stream.
//!
//! Both directions run concurrently and keep TCP half-close: socket EOF is
//! sent as an `eof` frame while inbound data keeps flowing, and an inbound
//! `eof` shuts down the socket's write side. Once both sides said `eof` the
//! request stream ends; the inbound stream ending first closes the socket.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use openshell_proto::{RelayEof, RelayFrame, TcpRelayTarget, relay_frame};
use openshell_sdk::wire::write_all_vectored;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::relay::{self, RelayContext};
use crate::transport;

/// Largest data frame sent to the gateway. The gateway takes frames up to
/// 1 MiB; 64 KiB is the public protocol's chunk and measured as fast here
/// (BENCHMARKS.md, "Data plane").
const CHUNK: usize = 64 * 1024;
/// Frames from the gateway written to the socket in one vectored write, at
/// most.
const WRITE_BATCH: usize = 16;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects, claims the relay, and pumps until done or cancelled.
/// `netns`: the sandbox's PID 1 (see [`connect`]).
pub async fn run(
    ctx: &RelayContext,
    channel_id: &str,
    target: TcpRelayTarget,
    netns: Option<&Arc<OwnedFd>>,
    cancel: impl Future<Output = ()>,
) {
    let mut cancel = pin!(cancel);
    let socket = tokio::select! {
        _ = cancel.as_mut() => return,
        socket = connect(&target, netns) => socket,
    };
    let socket = match socket {
        Ok(socket) => socket,
        Err(error) => {
            debug!(channel_id, error, "tcp relay target unreachable");
            relay::report_failure(ctx, channel_id, error).await;
            return;
        }
    };
    let claimed = tokio::select! {
        _ = cancel.as_mut() => return,
        claimed = relay::claim(ctx, channel_id) => claimed,
    };
    match claimed {
        Ok(claimed) => pump(socket, claimed.out, claimed.inbound, cancel).await,
        Err(status) => {
            debug!(channel_id, error = %transport::describe_status(&status), "claiming tcp relay failed");
            relay::report_failure(
                ctx,
                channel_id,
                format!("claim relay: {}", transport::describe_status(&status)),
            )
            .await;
        }
    }
}

/// Connects to a loopback target: the sandbox's own loopback when it has a
/// network namespace (`netns`, its PID 1's pidfd), else the host's. The
/// error is the `relay_open_result` text.
async fn connect(
    target: &TcpRelayTarget,
    netns: Option<&Arc<OwnedFd>>,
) -> Result<TcpStream, String> {
    let addr = loopback_addr(&target.host, target.port)
        .map_err(|reason| format!("connect {}:{}: {reason}", target.host, target.port))?;
    let dial = async {
        let Some(init) = netns else {
            return TcpStream::connect(addr).await;
        };
        let domain = if addr.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        let socket = crate::isolation::socket_in(init, domain).await?;
        TcpSocket::from_std_stream(std::net::TcpStream::from(socket))
            .connect(addr)
            .await
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, dial).await {
        Ok(Ok(socket)) => {
            let _ = socket.set_nodelay(true);
            Ok(socket)
        }
        Ok(Err(err)) => Err(format!(
            "connect {addr}: {}",
            crate::os_error::describe(&err)
        )),
        Err(_) => Err(format!("connect {addr}: timed out")),
    }
}

/// Resolves a relay target without DNS: loopback addresses only, and
/// "localhost" (or no host at all) means 127.0.0.1.
fn loopback_addr(host: &str, port: u32) -> Result<SocketAddr, &'static str> {
    let port = u16::try_from(port)
        .ok()
        .filter(|port| *port != 0)
        .ok_or("invalid port")?;
    let ip = if host.is_empty() || host.eq_ignore_ascii_case("localhost") {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        bare.parse::<IpAddr>()
            .map_err(|_| "not a loopback address")?
            .to_canonical()
    };
    if !ip.is_loopback() {
        return Err("not a loopback address");
    }
    Ok(SocketAddr::new(ip, port))
}

fn data_frame(data: Bytes) -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::Data(data)),
    }
}

fn eof_frame() -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::Eof(RelayEof {})),
    }
}

/// Pumps bytes between `socket` and a claimed relay until both directions
/// are done, the inbound stream ends, or `cancel` resolves.
/// `socket` is any byte stream: a TCP connection, or the SSH server's end of
/// an in-memory pipe (`ssh`).
pub async fn pump<T, S>(
    socket: T,
    out: mpsc::Sender<RelayFrame>,
    inbound: S,
    cancel: impl Future<Output = ()>,
) where
    T: AsyncRead + AsyncWrite + Send + 'static,
    S: Stream<Item = Result<RelayFrame, tonic::Status>> + Unpin,
{
    pump_watching(socket, out, inbound, cancel, CancellationToken::new()).await;
}

/// [`pump`], cancelling `outbound_gone` once the gateway dropped the
/// request stream (the relay ended on its side), even while the socket is
/// quiet: the inbound direction may be stuck behind a socket that does not
/// read (the SSH server stops reading past its input budget), and this is
/// how its owner learns the relay is over.
pub async fn pump_watching<T, S>(
    socket: T,
    out: mpsc::Sender<RelayFrame>,
    inbound: S,
    cancel: impl Future<Output = ()>,
    outbound_gone: CancellationToken,
) where
    T: AsyncRead + AsyncWrite + Send + 'static,
    S: Stream<Item = Result<RelayFrame, tonic::Status>> + Unpin,
{
    let (mut reader, mut writer) = tokio::io::split(socket);
    let (inbound_eof_tx, inbound_eof_rx) = oneshot::channel::<()>();

    // Socket -> gateway. Ends the request stream only once the gateway also
    // sent its eof (or its side ended), not at our own EOF.
    let upstream = async move {
        // Each read lands in a buffer of its own, which becomes the frame's
        // payload as is. Reads are cut from blocks of several chunks, each
        // used again once the frames cut from it are sent.
        let mut buf = BytesMut::new();
        loop {
            if buf.capacity() < CHUNK {
                buf.reserve(4 * CHUNK);
            }
            // Nothing can be sent once the request stream is gone: this side
            // is done, what the gateway still sends goes on to the socket.
            let mut room = (&mut buf).limit(CHUNK);
            let n = tokio::select! {
                read = reader.read_buf(&mut room) => {
                    read.map_err(|err| format!("socket read: {err}"))?
                }
                () = out.closed() => {
                    outbound_gone.cancel();
                    return Ok(());
                }
            };
            if n == 0 {
                break;
            }
            out.send(data_frame(buf.split().freeze()))
                .await
                .map_err(|_| "relay closed".to_owned())?;
        }
        out.send(eof_frame())
            .await
            .map_err(|_| "relay closed".to_owned())?;
        let _ = inbound_eof_rx.await;
        drop(out);
        Ok::<(), String>(())
    };

    // Gateway -> socket. Runs until the inbound stream ends. The frames
    // that are ready together go out in one vectored write.
    let downstream = async move {
        let mut inbound_eof_tx = Some(inbound_eof_tx);
        let mut batches = inbound.ready_chunks(WRITE_BATCH);
        let mut data = Vec::with_capacity(WRITE_BATCH);
        while let Some(batch) = batches.next().await {
            let mut eof = false;
            let mut failed = None;
            for frame in batch {
                match frame {
                    Ok(frame) => match frame.payload {
                        Some(relay_frame::Payload::Data(bytes))
                            if inbound_eof_tx.is_some() && !eof =>
                        {
                            data.push(bytes)
                        }
                        Some(relay_frame::Payload::Eof(_)) => eof = true,
                        _ => debug!("ignoring an unexpected frame on a tcp relay"),
                    },
                    Err(status) => {
                        failed = Some(format!(
                            "relay stream: {}",
                            transport::describe_status(&status)
                        ));
                        break;
                    }
                }
            }
            write_all_vectored(&mut writer, &mut data)
                .await
                .map_err(|err| format!("socket write: {err}"))?;
            data.clear();
            if let Some(why) = failed {
                return Err(why);
            }
            if eof && let Some(tx) = inbound_eof_tx.take() {
                // TCP half-close: the peer reads EOF, may still write.
                let _ = writer.shutdown().await;
                let _ = tx.send(());
            }
        }
        Ok::<(), String>(())
    };

    let mut cancel = pin!(cancel);
    let mut upstream = pin!(upstream);
    let mut downstream = pin!(downstream);
    let mut upstream_done = false;
    loop {
        tokio::select! {
            _ = cancel.as_mut() => {
                debug!("tcp relay cancelled");
                return;
            }
            result = &mut upstream, if !upstream_done => match result {
                Ok(()) => upstream_done = true,
                Err(why) => {
                    debug!(why, "tcp relay aborted");
                    return;
                }
            },
            result = &mut downstream => {
                if let Err(why) = result {
                    debug!(why, "tcp relay aborted");
                }
                return;
            }
            _ = tokio::time::sleep(relay::DRAIN_TIMEOUT), if upstream_done => {
                debug!("gateway did not end the tcp relay stream");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;
    use tokio_stream::wrappers::ReceiverStream;

    #[test]
    fn only_loopback_targets_resolve() {
        let v4 = |port| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        assert_eq!(loopback_addr("localhost", 8080), Ok(v4(8080)));
        assert_eq!(loopback_addr("LOCALHOST", 1), Ok(v4(1)));
        assert_eq!(loopback_addr("127.0.0.1", 22), Ok(v4(22)));
        assert_eq!(loopback_addr("", 22), Ok(v4(22)));
        assert!(loopback_addr("127.1.2.3", 22).is_ok());
        assert!(loopback_addr("::1", 22).is_ok());
        assert!(loopback_addr("[::1]", 22).is_ok());
        assert!(loopback_addr("::ffff:127.0.0.1", 22).is_ok());
        assert_eq!(loopback_addr("10.0.0.1", 22), Err("not a loopback address"));
        assert_eq!(loopback_addr("0.0.0.0", 22), Err("not a loopback address"));
        assert_eq!(
            loopback_addr("example.com", 22),
            Err("not a loopback address")
        );
        assert_eq!(loopback_addr("localhost", 0), Err("invalid port"));
        assert_eq!(loopback_addr("localhost", 70000), Err("invalid port"));
    }

    #[tokio::test]
    async fn refused_connect_names_the_address() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let target = TcpRelayTarget {
            host: "localhost".into(),
            port: port.into(),
        };
        let err = connect(&target, None).await.unwrap_err();
        assert_eq!(err, format!("connect 127.0.0.1:{port}: Connection refused"));
        let target = TcpRelayTarget {
            host: "192.0.2.1".into(),
            port: 80,
        };
        let err = connect(&target, None).await.unwrap_err();
        assert_eq!(err, "connect 192.0.2.1:80: not a loopback address");
    }

    /// The local service reads to EOF, then answers: works only if the
    /// relay half-closes instead of closing.
    #[tokio::test]
    async fn half_close_both_ways() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            conn.read_to_end(&mut request).await.unwrap();
            let answer = format!("got {} bytes", request.len());
            conn.write_all(answer.as_bytes()).await.unwrap();
        });
        let socket = TcpStream::connect(addr).await.unwrap();
        let (out_tx, mut out_rx) = mpsc::channel(4);
        let (in_tx, in_rx) = mpsc::channel(4);
        let relay = tokio::spawn(pump(
            socket,
            out_tx,
            ReceiverStream::new(in_rx),
            std::future::pending(),
        ));

        let payload = vec![7u8; 300_000];
        for chunk in payload.chunks(50_000) {
            in_tx
                .send(Ok(data_frame(Bytes::copy_from_slice(chunk))))
                .await
                .unwrap();
        }
        in_tx.send(Ok(eof_frame())).await.unwrap();

        let mut received = Vec::new();
        let mut saw_eof = false;
        while let Some(frame) = out_rx.recv().await {
            match frame.payload {
                Some(relay_frame::Payload::Data(data)) => {
                    assert!(!saw_eof, "data after eof");
                    assert!(data.len() <= CHUNK);
                    received.extend(data);
                }
                Some(relay_frame::Payload::Eof(_)) => saw_eof = true,
                other => panic!("unexpected frame {other:?}"),
            }
        }
        // The request stream ended (all senders dropped) after both eofs.
        assert!(saw_eof);
        assert_eq!(received, b"got 300000 bytes");
        service.await.unwrap();
        drop(in_tx);
        relay.await.unwrap();
    }

    #[tokio::test]
    async fn inbound_end_closes_the_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let socket = TcpStream::connect(addr).await.unwrap();
        let (mut conn, _) = listener.accept().await.unwrap();
        let (out_tx, _out_rx) = mpsc::channel(4);
        let (in_tx, in_rx) = mpsc::channel::<Result<RelayFrame, tonic::Status>>(4);
        let relay = tokio::spawn(pump(
            socket,
            out_tx,
            ReceiverStream::new(in_rx),
            std::future::pending(),
        ));
        in_tx
            .send(Err(tonic::Status::cancelled("gone")))
            .await
            .unwrap();
        relay.await.unwrap();
        let mut rest = Vec::new();
        conn.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }
}
