//! A fake gateway for supervisor tests: speaks the session and relay
//! protocol over real gRPC on loopback and hands each session and relay to
//! the test. Shared by the binary's integration tests and the host-mode unit
//! tests (included there by path).
#![allow(dead_code)]

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use openshell_proto::open_shell_server::{OpenShell, OpenShellServer};
use openshell_proto::*;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

pub const TOKEN: &str = "test-token-7f3a";
pub const WAIT: Duration = Duration::from_secs(10);

pub type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

pub struct Session {
    pub authorization: Option<String>,
    pub hello: SupervisorHello,
    pub inbound: Streaming<SupervisorMessage>,
    pub out: mpsc::Sender<Result<GatewayMessage, Status>>,
}

impl Session {
    pub async fn send(&self, payload: gateway_message::Payload) {
        self.out
            .send(Ok(GatewayMessage {
                payload: Some(payload),
            }))
            .await
            .unwrap();
    }

    pub async fn accept(&self) {
        self.send(gateway_message::Payload::SessionAccepted(SessionAccepted {
            session_id: "s-1".into(),
            heartbeat_interval: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        }))
        .await;
    }

    pub async fn open(&self, channel_id: &str, target: relay_open::Target) {
        self.send(gateway_message::Payload::RelayOpen(RelayOpen {
            channel_id: channel_id.into(),
            target: Some(target),
            service_id: String::new(),
        }))
        .await;
    }

    /// Next message that is not a heartbeat.
    pub async fn next(&mut self) -> supervisor_message::Payload {
        loop {
            let message = timeout(WAIT, self.inbound.message())
                .await
                .expect("supervisor message in time")
                .expect("session stream ok")
                .expect("session stream open");
            match message.payload {
                Some(supervisor_message::Payload::Heartbeat(_)) | None => continue,
                Some(payload) => return payload,
            }
        }
    }
}

pub struct Relay {
    pub authorization: Option<String>,
    pub channel_id: String,
    pub inbound: Streaming<RelayFrame>,
    pub out: mpsc::Sender<Result<RelayFrame, Status>>,
}

impl Relay {
    pub async fn send(&self, payload: relay_frame::Payload) {
        self.out
            .send(Ok(RelayFrame {
                payload: Some(payload),
            }))
            .await
            .unwrap();
    }

    pub async fn next(&mut self) -> Option<relay_frame::Payload> {
        timeout(WAIT, self.inbound.message())
            .await
            .expect("relay frame in time")
            .expect("relay stream ok")
            .map(|frame| frame.payload.expect("frame has a payload"))
    }

    /// Collects an exec relay's stdout until its exit event.
    pub async fn exec_output(&mut self) -> (String, i32) {
        let mut stdout = Vec::new();
        loop {
            let Some(relay_frame::Payload::ExecEvent(event)) = self.next().await else {
                panic!("expected exec events");
            };
            match event.payload.unwrap() {
                exec_sandbox_event::Payload::Stdout(chunk) => stdout.extend(chunk.data),
                exec_sandbox_event::Payload::Stderr(chunk) => stdout.extend(chunk.data),
                exec_sandbox_event::Payload::Exit(exit) => {
                    return (String::from_utf8(stdout).unwrap(), exit.exit_code);
                }
            }
        }
    }
}

#[derive(Clone)]
pub struct FakeGateway {
    pub sessions: mpsc::Sender<Session>,
    pub relays: mpsc::Sender<Relay>,
}

pub fn authorization<T>(request: &Request<T>) -> Option<String> {
    request
        .metadata()
        .get("authorization")
        .map(|value| value.to_str().unwrap().to_owned())
}

#[tonic::async_trait]
impl OpenShell for FakeGateway {
    async fn get_sandbox_config(
        &self,
        _: Request<sandbox::GetSandboxConfigRequest>,
    ) -> Result<Response<sandbox::GetSandboxConfigResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn get_sandbox_provider_environment(
        &self,
        _: Request<GetSandboxProviderEnvironmentRequest>,
    ) -> Result<Response<GetSandboxProviderEnvironmentResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn update_config(
        &self,
        _: Request<UpdateConfigRequest>,
    ) -> Result<Response<UpdateConfigResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn create_provider(
        &self,
        _: Request<CreateProviderRequest>,
    ) -> Result<Response<ProviderResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn update_provider(
        &self,
        _: Request<UpdateProviderRequest>,
    ) -> Result<Response<ProviderResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn attach_provider(
        &self,
        _: Request<AttachProviderRequest>,
    ) -> Result<Response<AttachProviderResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn detach_provider(
        &self,
        _: Request<DetachProviderRequest>,
    ) -> Result<Response<AttachProviderResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn health(&self, _: Request<HealthRequest>) -> Result<Response<HealthResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn create_sandbox(
        &self,
        _: Request<CreateSandboxRequest>,
    ) -> Result<Response<SandboxResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn get_sandbox(
        &self,
        _: Request<GetSandboxRequest>,
    ) -> Result<Response<SandboxResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn list_sandboxes(
        &self,
        _: Request<ListSandboxesRequest>,
    ) -> Result<Response<ListSandboxesResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn delete_sandbox(
        &self,
        _: Request<DeleteSandboxRequest>,
    ) -> Result<Response<DeleteSandboxResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    type WatchSandboxStream = BoxStream<SandboxStreamEvent>;
    async fn watch_sandbox(
        &self,
        _: Request<WatchSandboxRequest>,
    ) -> Result<Response<Self::WatchSandboxStream>, Status> {
        Err(Status::unimplemented("fake"))
    }
    type ExecSandboxStream = BoxStream<ExecSandboxEvent>;
    async fn exec_sandbox(
        &self,
        _: Request<ExecSandboxRequest>,
    ) -> Result<Response<Self::ExecSandboxStream>, Status> {
        Err(Status::unimplemented("fake"))
    }
    type ExecSandboxInteractiveStream = BoxStream<ExecSandboxEvent>;
    async fn exec_sandbox_interactive(
        &self,
        _: Request<Streaming<ExecSandboxInput>>,
    ) -> Result<Response<Self::ExecSandboxInteractiveStream>, Status> {
        Err(Status::unimplemented("fake"))
    }
    type ForwardTcpStream = BoxStream<TcpForwardFrame>;
    async fn forward_tcp(
        &self,
        _: Request<Streaming<TcpForwardFrame>>,
    ) -> Result<Response<Self::ForwardTcpStream>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn create_ssh_session(
        &self,
        _: Request<CreateSshSessionRequest>,
    ) -> Result<Response<CreateSshSessionResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn revoke_ssh_session(
        &self,
        _: Request<RevokeSshSessionRequest>,
    ) -> Result<Response<RevokeSshSessionResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    type ConnectSupervisorStream = BoxStream<GatewayMessage>;
    async fn connect_supervisor(
        &self,
        request: Request<Streaming<SupervisorMessage>>,
    ) -> Result<Response<Self::ConnectSupervisorStream>, Status> {
        let authorization = authorization(&request);
        let mut inbound = request.into_inner();
        let Some(SupervisorMessage {
            payload: Some(supervisor_message::Payload::Hello(hello)),
        }) = inbound.message().await?
        else {
            return Err(Status::invalid_argument("first message must be hello"));
        };
        let (out, rx) = mpsc::channel(16);
        let session = Session {
            authorization,
            hello,
            inbound,
            out,
        };
        self.sessions.send(session).await.unwrap();
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type RelayStreamStream = BoxStream<RelayFrame>;
    async fn relay_stream(
        &self,
        request: Request<Streaming<RelayFrame>>,
    ) -> Result<Response<Self::RelayStreamStream>, Status> {
        let authorization = authorization(&request);
        let mut inbound = request.into_inner();
        let Some(RelayFrame {
            payload: Some(relay_frame::Payload::Init(init)),
        }) = inbound.message().await?
        else {
            return Err(Status::invalid_argument("first frame must be init"));
        };
        let (out, rx) = mpsc::channel(16);
        let relay = Relay {
            authorization,
            channel_id: init.channel_id,
            inbound,
            out,
        };
        self.relays.send(relay).await.unwrap();
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

pub struct Gateway {
    pub url: String,
    pub sessions: mpsc::Receiver<Session>,
    pub relays: mpsc::Receiver<Relay>,
}

impl Gateway {
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// With `tls`, serves https with that identity on `localhost`.
    pub async fn start_with(tls: Option<tonic::transport::Identity>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = match tls {
            Some(_) => format!("https://localhost:{port}"),
            None => format!("http://127.0.0.1:{port}"),
        };
        let (sessions_tx, sessions) = mpsc::channel(4);
        let (relays_tx, relays) = mpsc::channel(4);
        let fake = FakeGateway {
            sessions: sessions_tx,
            relays: relays_tx,
        };
        let mut server = tonic::transport::Server::builder();
        if let Some(identity) = tls {
            server = server
                .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                .unwrap();
        }
        tokio::spawn(
            server
                .add_service(OpenShellServer::new(fake))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        Self {
            url,
            sessions,
            relays,
        }
    }

    pub async fn session(&mut self) -> Session {
        let session = timeout(WAIT, self.sessions.recv())
            .await
            .expect("supervisor connects in time")
            .unwrap();
        assert_eq!(
            session.authorization.as_deref(),
            Some(format!("Bearer {TOKEN}").as_str())
        );
        session
    }

    pub async fn relay(&mut self) -> Relay {
        let relay = timeout(WAIT, self.relays.recv())
            .await
            .expect("relay claimed in time")
            .unwrap();
        assert_eq!(
            relay.authorization.as_deref(),
            Some(format!("Bearer {TOKEN}").as_str())
        );
        relay
    }
}

pub fn exec_target(argv: &[&str]) -> relay_open::Target {
    relay_open::Target::Exec(ExecSandboxRequest {
        command: argv.iter().map(|arg| arg.to_string()).collect(),
        ..Default::default()
    })
}

pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .unwrap()
            .trim_start()
            .starts_with('Z'),
    }
}

pub async fn wait_gone(pid: i32) {
    for _ in 0..100 {
        if process_gone(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("process {pid} is still running");
}

/// Reads the pids an exec printed first (`echo $$ ...`).
pub async fn read_pids(relay: &mut Relay) -> Vec<i32> {
    let Some(relay_frame::Payload::ExecEvent(ExecSandboxEvent {
        payload: Some(exec_sandbox_event::Payload::Stdout(chunk)),
    })) = relay.next().await
    else {
        panic!("expected the pids on stdout");
    };
    String::from_utf8(chunk.data)
        .unwrap()
        .split_whitespace()
        .map(|pid| pid.parse().unwrap())
        .collect()
}
