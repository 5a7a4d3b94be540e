//! What a tonic user writes to forward a local port without the SDK: a
//! listener whose every connection is pumped over one `ForwardTcp` stream
//! (`init` first, then 64 KiB `data` frames; local EOF sends `eof` and
//! half-closes the stream; the gateway's `eof` half-closes the socket).
//! The native arm of the Rust forward figure in `openshell-bench
//! languages`.

use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const FRAME: usize = 64 * 1024;

pub struct Pump {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Pump {
    pub fn stop(self) {
        self.task.abort();
    }
}

pub async fn start(client: Tonic, sandbox: String, target: u16) -> Pump {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("pump listener");
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        while let Ok((socket, _)) = listener.accept().await {
            connections.spawn(pump(client.clone(), socket, sandbox.clone(), target));
        }
    });
    Pump { port, task }
}

fn frame(payload: tcp_forward_frame::Payload) -> TcpForwardFrame {
    TcpForwardFrame {
        payload: Some(payload),
    }
}

async fn pump(mut client: Tonic, socket: TcpStream, sandbox: String, target: u16) {
    let _ = socket.set_nodelay(true);
    let (tx, rx) = mpsc::channel(16);
    let init = TcpForwardInit {
        sandbox,
        target: Some(tcp_forward_init::Target::Tcp(TcpRelayTarget {
            host: "127.0.0.1".into(),
            port: target.into(),
        })),
        ..Default::default()
    };
    if tx
        .send(frame(tcp_forward_frame::Payload::Init(init)))
        .await
        .is_err()
    {
        return;
    }
    let Ok(response) = client.forward_tcp(ReceiverStream::new(rx)).await else {
        return;
    };
    let mut inbound = response.into_inner();
    let (mut reader, mut writer) = socket.into_split();
    let upload = tokio::spawn(async move {
        let mut buf = vec![0u8; FRAME];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) => {
                    let eof = tcp_forward_frame::Payload::Eof(TcpForwardEof {});
                    let _ = tx.send(frame(eof)).await;
                    return;
                }
                Ok(n) => {
                    // `into`: the payload is `Vec<u8>` or `Bytes`, as
                    // prost is configured.
                    #[allow(clippy::useless_conversion)]
                    let data = tcp_forward_frame::Payload::Data(buf[..n].to_vec().into());
                    if tx.send(frame(data)).await.is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
    while let Ok(Some(message)) = inbound.message().await {
        match message.payload {
            Some(tcp_forward_frame::Payload::Data(data))
                if writer.write_all(&data).await.is_err() =>
            {
                break;
            }
            Some(tcp_forward_frame::Payload::Eof(_)) => {
                let _ = writer.shutdown().await;
            }
            _ => {}
        }
    }
    upload.abort();
}

/// Adds the bearer token, as a tonic user does.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

pub type Tonic = OpenShellClient<InterceptedService<Channel, Bearer>>;

pub async fn tonic_client(endpoint: &str, token: Option<&str>) -> Tonic {
    let channel = Channel::from_shared(endpoint.to_owned())
        .expect("endpoint URL")
        .connect()
        .await
        .expect("tonic connect");
    let bearer = Bearer(token.map(|t| format!("Bearer {t}").parse().expect("token as metadata")));
    OpenShellClient::with_interceptor(channel, bearer)
}
