//! TCP forwarding: a local listener whose connections reach a loopback port
//! inside a sandbox (its own loopback), or one stream over any reader and writer
//! ([`Client::forward_io`], what an ssh `ProxyCommand` needs).
//!
//! The data plane stays in Rust: [`Client::forward`] binds the listener, and
//! every accepted connection is pumped over its own `ForwardTcp` stream in
//! both directions by the core. The host language only holds a
//! [`ForwardHandle`] (address, counters, `close()`), never a per-chunk
//! callback.
//!
//! Per connection: the first frame is `init{sandbox, tcp{127.0.0.1, port}}`
//! (or `ssh{}` for the sandbox's SSH server, [`ForwardTarget::Ssh`], or
//! `sftp{}` for its SFTP server, [`ForwardTarget::Sftp`], and the SSH
//! session token when there is one), then `data` frames of at most
//! 64 KiB. Half-close is kept end to end: EOF
//! on the local socket closes the request stream; an `eof` frame from the
//! gateway shuts down the local socket's write side; the end of the gateway's
//! stream closes the socket.
//!
//! Bytes are copied as little as the transport allows: a socket read lands
//! behind a few bytes of headroom, where the gRPC prefix and the frame's
//! protobuf header are written, so the read buffer is the whole gRPC
//! message and goes to HTTP/2 as it is; received frames are
//! decoded as slices of the buffer they arrived in, and the frames that are
//! ready together go to the socket in one vectored write.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use openshell_proto as pb;
use openshell_proto::tcp_forward_frame::Payload as FramePayload;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::{CallOptions, Client, DeadlineKind, Resolved};
use crate::error::Error;
use crate::metadata::Metadata;
use crate::paths;
use crate::raw::{CallContext, RawSender, decode};

mod frames;

use crate::wire::write_all_vectored;
use frames::{ReadBlocks, read_data_frame};

/// Largest payload of one `data` frame: the chunk size of the public
/// protocol, which every gateway accepts.
pub const MAX_FRAME: usize = 64 * 1024;
/// Frames from the gateway written to the socket in one vectored write, at
/// most.
const WRITE_BATCH: usize = 16;
/// What a forward reaches inside the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardTarget {
    /// A TCP port on the sandbox's own loopback.
    Tcp(u16),
    /// The sandbox's SSH server (the supervisor's embedded one).
    Ssh,
    /// The sandbox's SFTP server, run as an exec of the sandbox: what the
    /// file transfer ([`Client::upload`] and friends) speaks over the stream.
    Sftp,
}

/// Counters of a forward, as of the moment [`ForwardHandle::stats`] was called.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ForwardStats {
    /// Connections accepted on the local listener.
    pub connections_accepted: u64,
    /// Connections currently being pumped.
    pub connections_active: u64,
    /// Connections that ended with an error (stream or socket).
    pub connections_failed: u64,
    /// Bytes from the sandbox written to local clients.
    pub bytes_in: u64,
    /// Bytes from local clients sent to the sandbox.
    pub bytes_out: u64,
}

#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    active: AtomicU64,
    failed: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

/// A running forward. Closing it (or dropping it) stops the listener, so new
/// connections are refused, and ends every active connection.
pub struct ForwardHandle {
    local_addr: SocketAddr,
    sandbox: String,
    remote_port: u16,
    counters: Arc<Counters>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl ForwardHandle {
    /// The address the local listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The sandbox this forward reaches.
    pub fn sandbox(&self) -> &str {
        &self.sandbox
    }

    /// The port on the sandbox's loopback (0 for [`ForwardTarget::Ssh`] and
    /// [`ForwardTarget::Sftp`]).
    pub fn remote_port(&self) -> u16 {
        self.remote_port
    }

    /// Current counters.
    pub fn stats(&self) -> ForwardStats {
        let c = &self.counters;
        ForwardStats {
            connections_accepted: c.accepted.load(Ordering::Relaxed),
            connections_active: c.active.load(Ordering::Relaxed),
            connections_failed: c.failed.load(Ordering::Relaxed),
            bytes_in: c.bytes_in.load(Ordering::Relaxed),
            bytes_out: c.bytes_out.load(Ordering::Relaxed),
        }
    }

    /// Stops the forward. Idempotent; returns at once (see [`closed`](Self::closed)).
    pub fn close(&self) {
        self.shutdown.cancel();
    }

    /// Whether [`close`](Self::close) was called (or the call was cancelled).
    pub fn is_closed(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Waits until the forward has stopped: the listener is closed and every
    /// connection has ended. Only returns after a close or cancellation.
    pub async fn closed(&self) {
        self.shutdown.cancelled().await;
        self.tasks.wait().await;
    }
}

impl Drop for ForwardHandle {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl fmt::Debug for ForwardHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForwardHandle")
            .field("local_addr", &self.local_addr)
            .field("sandbox", &self.sandbox)
            .field("remote_port", &self.remote_port)
            .field("closed", &self.is_closed())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Client {
    /// Pumps one `ForwardTcp` stream between `reader` / `writer` and
    /// `target` inside `sandbox`, until the gateway ends the stream: bytes
    /// read go to the target, bytes from the target are written (and
    /// flushed) to `writer`. EOF on `reader` half-closes the stream; the
    /// target's EOF shuts `writer` down. This is what an ssh
    /// `ProxyCommand` runs over its stdin and stdout. With an SSH session
    /// token ([`Client::create_ssh_session`]) the stream carries it, as
    /// [`forward_to`](Self::forward_to)'s do.
    ///
    /// The stream is owner-routed like every forward: hinted to the
    /// sandbox's owner (from the cache, a lookup, or
    /// [`Client::assume_owner`]), with the single unrouted retry when the
    /// edge proves it never forwarded the hinted attempt. `options.cancel`
    /// ends the stream (`cancelled`); `options.deadline` bounds it.
    /// Returns the bytes moved each way.
    pub async fn forward_io<R, W>(
        &self,
        sandbox: &str,
        target: ForwardTarget,
        ssh_session_token: Option<&str>,
        reader: R,
        writer: W,
        options: CallOptions,
    ) -> Result<ForwardStats, Error>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        if sandbox.is_empty() {
            return Err(Error::invalid_config("forward needs a sandbox name"));
        }
        if target == ForwardTarget::Tcp(0) {
            return Err(Error::invalid_config(
                "forward needs a remote port (1-65535)",
            ));
        }
        let resolved = Resolved::new(self, &options, DeadlineKind::Stream);
        let ctx = CallContext::new(paths::FORWARD_TCP, Metadata::new(), resolved.clone())?;
        let stream = self.open_stream(ctx, Some(init_frame(sandbox, target, ssh_session_token)));
        let (sender, receiver) = stream.split();
        let counters = Counters::default();
        let pumped = pump_io(reader, writer, sender, receiver.into_stream(), &counters);
        let result = resolved.guard(pumped).await;
        let stats = ForwardStats {
            connections_accepted: 1,
            connections_active: 0,
            connections_failed: u64::from(result.is_err()),
            bytes_in: counters.bytes_in.load(Ordering::Relaxed),
            bytes_out: counters.bytes_out.load(Ordering::Relaxed),
        };
        result.map(|()| stats)
    }

    /// Binds `local_addr` (for example `"127.0.0.1:0"`) and forwards every
    /// connection to `remote_port` on loopback inside `sandbox`'s host.
    ///
    /// `options.cancel` closes the forward like [`ForwardHandle::close`];
    /// `options.deadline`, if set, closes it when it passes.
    pub async fn forward(
        &self,
        sandbox: &str,
        remote_port: u16,
        local_addr: impl ToSocketAddrs,
        options: CallOptions,
    ) -> Result<ForwardHandle, Error> {
        self.forward_to(
            sandbox,
            ForwardTarget::Tcp(remote_port),
            None,
            local_addr,
            options,
        )
        .await
    }

    /// Like [`forward`](Self::forward), to any [`ForwardTarget`], and with
    /// an SSH session token ([`Client::create_ssh_session`]) when given:
    /// each connection's stream carries it, so a client without a user
    /// token can forward to that one sandbox.
    pub async fn forward_to(
        &self,
        sandbox: &str,
        target: ForwardTarget,
        ssh_session_token: Option<&str>,
        local_addr: impl ToSocketAddrs,
        options: CallOptions,
    ) -> Result<ForwardHandle, Error> {
        if sandbox.is_empty() {
            return Err(Error::invalid_config("forward needs a sandbox name"));
        }
        if target == ForwardTarget::Tcp(0) {
            return Err(Error::invalid_config(
                "forward needs a remote port (1-65535)",
            ));
        }
        let remote_port = match target {
            ForwardTarget::Tcp(port) => port,
            ForwardTarget::Ssh | ForwardTarget::Sftp => 0,
        };
        let listener = TcpListener::bind(local_addr)
            .await
            .map_err(|e| Error::io("binding the forward listener", &e))?;
        let bound = listener
            .local_addr()
            .map_err(|e| Error::io("reading the listener address", &e))?;
        let resolved = Resolved::new(self, &options, DeadlineKind::Stream);
        let shutdown = resolved.cancel.clone();
        let counters = Arc::new(Counters::default());
        let tasks = TaskTracker::new();
        let accept = AcceptLoop {
            client: self.clone(),
            listener,
            init: init_frame(sandbox, target, ssh_session_token),
            resolved,
            counters: Arc::clone(&counters),
            tasks: tasks.clone(),
        };
        tasks.spawn(accept.run());
        tasks.close();
        tracing::debug!(%bound, sandbox, remote_port, "forward listening");
        Ok(ForwardHandle {
            local_addr: bound,
            sandbox: sandbox.to_owned(),
            remote_port,
            counters,
            shutdown,
            tasks,
        })
    }
}

/// The first frame of every connection's stream.
fn init_frame(sandbox: &str, target: ForwardTarget, token: Option<&str>) -> Bytes {
    let target = match target {
        ForwardTarget::Tcp(port) => pb::tcp_forward_init::Target::Tcp(pb::TcpRelayTarget {
            host: "127.0.0.1".into(),
            port: u32::from(port),
        }),
        ForwardTarget::Ssh => pb::tcp_forward_init::Target::Ssh(pb::SshRelayTarget::default()),
        ForwardTarget::Sftp => pb::tcp_forward_init::Target::Sftp(pb::SftpRelayTarget::default()),
    };
    let frame = pb::TcpForwardFrame {
        payload: Some(FramePayload::Init(pb::TcpForwardInit {
            sandbox: sandbox.to_owned(),
            target: Some(target),
            authorization_token: token.unwrap_or_default().to_owned(),
            ..Default::default()
        })),
    };
    Bytes::from(prost::Message::encode_to_vec(&frame))
}

struct AcceptLoop {
    client: Client,
    listener: TcpListener,
    init: Bytes,
    resolved: Resolved,
    counters: Arc<Counters>,
    tasks: TaskTracker,
}

impl AcceptLoop {
    async fn run(self) {
        let AcceptLoop {
            client,
            listener,
            init,
            resolved,
            counters,
            tasks,
        } = self;
        let deadline = async {
            match resolved.deadline {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(deadline);
        loop {
            let accepted = tokio::select! {
                _ = resolved.cancel.cancelled() => break,
                _ = &mut deadline => {
                    resolved.cancel.cancel();
                    break;
                }
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((socket, peer)) => {
                    counters.accepted.fetch_add(1, Ordering::Relaxed);
                    counters.active.fetch_add(1, Ordering::Relaxed);
                    let _ = socket.set_nodelay(true);
                    let ctx = match CallContext::new(
                        paths::FORWARD_TCP,
                        Metadata::new(),
                        resolved.clone(),
                    ) {
                        Ok(ctx) => ctx,
                        Err(err) => {
                            tracing::warn!(code = err.code(), "forward: bad call context");
                            break;
                        }
                    };
                    let stream = client.open_stream(ctx, Some(init.clone()));
                    let (sender, receiver) = stream.split();
                    let counters = Arc::clone(&counters);
                    tasks.spawn(async move {
                        let result = pump(socket, sender, receiver.into_stream(), &counters).await;
                        match &result {
                            // Closing the forward is not a failure.
                            Err(err) if err.code() != "cancelled" => {
                                counters.failed.fetch_add(1, Ordering::Relaxed);
                                tracing::debug!(%peer, code = err.code(), error = %err, "forward connection ended with an error");
                            }
                            _ => {}
                        }
                        counters.active.fetch_sub(1, Ordering::Relaxed);
                    });
                }
                Err(err) => {
                    // Per-connection failures (aborted handshakes) and fd
                    // exhaustion: pause briefly so that a persistent error
                    // does not spin.
                    tracing::debug!(error = %err, "forward accept failed");
                    tokio::select! {
                        _ = resolved.cancel.cancelled() => break,
                        _ = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
                    }
                }
            }
        }
        // Dropping the listener here refuses new connections; the cancel
        // token (already fired) ends the active ones.
        drop(listener);
    }
}

/// Pumps one connection over its stream until the gateway ends the stream,
/// either side fails, or the forward closes.
async fn pump(
    socket: TcpStream,
    sender: RawSender,
    frames: BoxStream<'static, Result<Bytes, Error>>,
    counters: &Counters,
) -> Result<(), Error> {
    let (local_read, local_write) = socket.into_split();
    pump_io(local_read, local_write, sender, frames, counters).await
}

/// [`pump`] over any reader and writer: the local side's bytes go up as
/// `data` frames, its EOF closes the request stream; the gateway's `data`
/// frames are written down, its `eof` shuts the writer down.
async fn pump_io<R, W>(
    mut local_read: R,
    mut local_write: W,
    sender: RawSender,
    frames: BoxStream<'static, Result<Bytes, Error>>,
    counters: &Counters,
) -> Result<(), Error>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let upstream = async {
        let mut blocks = ReadBlocks::default();
        loop {
            let read = read_data_frame(&mut local_read, &mut blocks)
                .await
                .map_err(|e| Error::io("reading from the local connection", &e))?;
            let Some((frame, n)) = read else {
                // Local EOF: half-close the request stream.
                sender.close();
                return Ok::<(), Error>(());
            };
            sender.send_framed(frame).await?;
            counters.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
        }
    };

    let downstream = async {
        // The frames that are ready together (at most WRITE_BATCH) are
        // decoded, then their data goes out in one vectored write.
        let mut batches = frames.ready_chunks(WRITE_BATCH);
        let mut data = Vec::with_capacity(WRITE_BATCH);
        while let Some(batch) = batches.next().await {
            let mut eof = false;
            let mut failed = None;
            for frame in batch {
                let frame = match frame
                    .and_then(|f| decode::<pb::TcpForwardFrame>(paths::FORWARD_TCP, f))
                {
                    Ok(frame) => frame,
                    Err(err) => {
                        failed = Some(err);
                        break;
                    }
                };
                match frame.payload {
                    Some(FramePayload::Data(bytes)) if !eof => data.push(bytes),
                    Some(FramePayload::Data(_)) => {}
                    Some(FramePayload::Eof(_)) => eof = true,
                    Some(FramePayload::Init(_)) => {
                        failed = Some(Error::protocol(
                            "ForwardTcp: unexpected init frame from the gateway",
                        ));
                        break;
                    }
                    None => {}
                }
            }
            // What arrived before a failure is still delivered.
            let len: usize = data.iter().map(Bytes::len).sum();
            write_all_vectored(&mut local_write, &mut data)
                .await
                .map_err(|e| Error::io("writing to the local connection", &e))?;
            // A pipe or a buffered writer (`forward_io`'s stdout) holds bytes
            // until flushed; a socket's flush is free.
            local_write
                .flush()
                .await
                .map_err(|e| Error::io("writing to the local connection", &e))?;
            data.clear();
            counters.bytes_in.fetch_add(len as u64, Ordering::Relaxed);
            if let Some(err) = failed {
                return Err(err);
            }
            if eof {
                // The sandbox side will send no more: pass the half-close on.
                let _ = local_write.shutdown().await;
            }
        }
        Ok::<(), Error>(())
    };

    tokio::pin!(upstream, downstream);
    let mut upstream_done = false;
    loop {
        tokio::select! {
            result = &mut upstream, if !upstream_done => {
                upstream_done = true;
                if let Err(err) = result {
                    // A local read failure or a dead stream: end the call.
                    sender.cancel();
                    if err.code() == "stream_closed" {
                        // The gateway ended the stream; downstream reports why.
                        continue;
                    }
                    return Err(err);
                }
            }
            result = &mut downstream => {
                // The gateway's stream is over: the connection is over.
                return result;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::frames::unframe;
    use super::*;
    use crate::wire::Outbound;
    use prost::Message;
    use tokio::io::AsyncReadExt;
    use tokio::sync::mpsc;

    fn frame(payload: FramePayload) -> Result<Bytes, Error> {
        Ok(Bytes::from(
            pb::TcpForwardFrame {
                payload: Some(payload),
            }
            .encode_to_vec(),
        ))
    }

    async fn socket_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    /// A request message as the pump sent it.
    fn sent_message(outbound: Outbound) -> Bytes {
        match outbound {
            Outbound::Framed(frame) => unframe(frame),
            Outbound::Message(message) => message,
        }
    }

    #[test]
    fn init_frame_targets_loopback() {
        let frame =
            pb::TcpForwardFrame::decode(init_frame("box", ForwardTarget::Tcp(8080), None)).unwrap();
        let Some(FramePayload::Init(init)) = frame.payload else {
            panic!("not init")
        };
        assert_eq!(init.sandbox, "box");
        let Some(pb::tcp_forward_init::Target::Tcp(tcp)) = init.target else {
            panic!("not tcp")
        };
        assert_eq!((tcp.host.as_str(), tcp.port), ("127.0.0.1", 8080));
        let frame =
            pb::TcpForwardFrame::decode(init_frame("box", ForwardTarget::Ssh, Some("t"))).unwrap();
        let Some(FramePayload::Init(init)) = frame.payload else {
            panic!("not init")
        };
        assert!(matches!(
            init.target,
            Some(pb::tcp_forward_init::Target::Ssh(_))
        ));
        assert_eq!(init.authorization_token, "t");
    }

    #[tokio::test]
    async fn pumps_both_ways_and_keeps_half_close() {
        let (mut local_client, accepted) = socket_pair().await;
        let (up_tx, mut up_rx) = mpsc::channel::<Outbound>(16);
        let sender = RawSender::detached(up_tx, CancellationToken::new());
        let (down_tx, down_rx) = mpsc::channel::<Result<Bytes, Error>>(16);
        let frames = tokio_stream::wrappers::ReceiverStream::new(down_rx).boxed();
        let counters = Arc::new(Counters::default());
        let pump_counters = Arc::clone(&counters);
        let pumping =
            tokio::spawn(async move { pump(accepted, sender, frames, &pump_counters).await });

        // Local -> gateway, then local EOF half-closes the request stream.
        local_client.write_all(b"hello").await.unwrap();
        let sent = pb::TcpForwardFrame::decode(sent_message(up_rx.recv().await.unwrap())).unwrap();
        assert_eq!(
            sent.payload,
            Some(FramePayload::Data(Bytes::from_static(b"hello")))
        );
        local_client.shutdown().await.unwrap();
        assert!(
            up_rx.recv().await.is_none(),
            "request stream not half-closed"
        );

        // Gateway -> local still flows after the local half-close; eof ends
        // the local read side.
        down_tx
            .send(frame(FramePayload::Data(Bytes::from_static(b"world"))))
            .await
            .unwrap();
        down_tx
            .send(frame(FramePayload::Eof(pb::TcpForwardEof {})))
            .await
            .unwrap();
        let mut got = Vec::new();
        local_client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"world");

        // The gateway ends the stream: the pump finishes cleanly.
        drop(down_tx);
        pumping.await.unwrap().unwrap();
        assert_eq!(counters.bytes_out.load(Ordering::Relaxed), 5);
        assert_eq!(counters.bytes_in.load(Ordering::Relaxed), 5);
    }

    #[tokio::test]
    async fn a_stream_error_closes_the_local_socket() {
        let (mut local_client, accepted) = socket_pair().await;
        let (up_tx, _up_rx) = mpsc::channel::<Outbound>(16);
        let sender = RawSender::detached(up_tx, CancellationToken::new());
        let frames = futures::stream::iter(vec![
            frame(FramePayload::Data(Bytes::from_static(b"partial"))),
            Err(Error::from(tonic::Status::unavailable("supervisor gone"))),
        ])
        .boxed();
        let counters = Counters::default();
        let err = pump(accepted, sender, frames, &counters).await.unwrap_err();
        assert_eq!(err.code(), "unavailable");
        let mut got = Vec::new();
        local_client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"partial");
    }

    #[tokio::test]
    async fn close_refuses_new_connections_and_is_idempotent() {
        // A gateway address where nobody listens: connections fail to open
        // their stream, which must end them (and count them) cleanly.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let config = crate::ClientConfig::builder(format!("http://127.0.0.1:{port}"))
            .connect_timeout(std::time::Duration::from_millis(500))
            .build()
            .unwrap();
        let client = Client::connect_lazy(config).await.unwrap();
        let handle = client
            .forward("box", 8080, "127.0.0.1:0", CallOptions::new())
            .await
            .unwrap();
        let addr = handle.local_addr();
        assert_ne!(addr.port(), 0);

        // The stream cannot open: the core closes the local connection,
        // and the listener keeps accepting.
        for _ in 0..2 {
            let mut conn = TcpStream::connect(addr).await.unwrap();
            let mut buf = Vec::new();
            conn.read_to_end(&mut buf).await.unwrap();
        }
        assert_eq!(handle.stats().connections_accepted, 2);
        assert!(!handle.is_closed());
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while handle.stats().connections_active != 0 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap();
        assert_eq!(handle.stats().connections_failed, 2);

        handle.close();
        handle.close();
        assert!(handle.is_closed());
        tokio::time::timeout(std::time::Duration::from_secs(5), handle.closed())
            .await
            .unwrap();
        assert!(TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn rejects_bad_arguments() {
        let config = crate::ClientConfig::builder("http://127.0.0.1:1")
            .build()
            .unwrap();
        let client = Client::connect_lazy(config).await.unwrap();
        let err = client
            .forward("box", 0, "127.0.0.1:0", CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(err.code(), "invalid_config");
        let err = client
            .forward("", 1, "127.0.0.1:0", CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(err.code(), "invalid_config");
        let err = client
            .forward("box", 1, "203.0.113.1:0", CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(err.code(), "io");
    }
}
