//! Token-authenticated TCP forwards for the SSH session tests: an echo
//! service inside sandboxes' networks and a raw `ForwardTcp` stream to it.

use std::time::Duration;

use openshell_proto::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use super::Client;

/// An echo service on one port number in each of `sandboxes`' networks
/// (each its own under isolation; without, the first bind serves all).
pub async fn echo_service(client: &mut Client, sandboxes: &[&str]) -> u16 {
    let mut port = 0;
    for sandbox in sandboxes {
        let net = super::sandbox_net(client, sandbox).await;
        if port != 0 && net.is_own() {
            continue;
        }
        let listener = net.listen(("127.0.0.1", port)).unwrap();
        port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }
    port
}

/// An open forward: frames to send, frames received.
pub struct Forward {
    pub tx: mpsc::Sender<TcpForwardFrame>,
    pub rx: tonic::Streaming<TcpForwardFrame>,
}

pub fn init(sandbox: &str, port: u16, token: &str) -> TcpForwardFrame {
    TcpForwardFrame {
        payload: Some(tcp_forward_frame::Payload::Init(TcpForwardInit {
            sandbox: sandbox.into(),
            target: Some(tcp_forward_init::Target::Tcp(TcpRelayTarget {
                host: "127.0.0.1".into(),
                port: port.into(),
            })),
            authorization_token: token.into(),
            ..Default::default()
        })),
    }
}

pub async fn open(client: &mut Client, init: TcpForwardFrame) -> Result<Forward, tonic::Status> {
    let (tx, rx) = mpsc::channel(8);
    tx.send(init).await.unwrap();
    let rx = client
        .forward_tcp(ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok(Forward { tx, rx })
}

/// Opens a forward and proves it carries bytes both ways.
pub async fn echo(client: &mut Client, init: TcpForwardFrame) -> Result<Forward, tonic::Status> {
    let mut forward = open(client, init).await?;
    let data = TcpForwardFrame {
        payload: Some(tcp_forward_frame::Payload::Data(b"ping".to_vec().into())),
    };
    forward.tx.send(data).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(20), forward.rx.message())
        .await
        .expect("an answer within 20 s")?;
    match answer.and_then(|f| f.payload) {
        Some(tcp_forward_frame::Payload::Data(data)) => assert_eq!(&data[..], b"ping"),
        other => panic!("unexpected answer {other:?}"),
    }
    Ok(forward)
}

pub fn code(result: Result<Forward, tonic::Status>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}
