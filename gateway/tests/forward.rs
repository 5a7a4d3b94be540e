//! ForwardTcp through the gateway and the supervisor to a real TCP server.

mod common;

use common::*;
use openshell_proto::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

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
        payload: Some(tcp_forward_frame::Payload::Data(bytes.to_vec())),
    }
}

#[tokio::test]
async fn forward_relays_both_ways_and_respects_half_close() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "fwd").await;

    // Reads everything until EOF, then answers with a digest of what it read.
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
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
