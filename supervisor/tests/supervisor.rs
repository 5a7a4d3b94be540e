//! Runs the real `openshell-supervisor` binary against an in-test gateway
//! that speaks the session and relay protocol, and checks the supervisor's
//! side of it: hello, bearer token, relays, redirects, reconnects, shutdown.

use std::pin::Pin;
use std::process::Stdio;
use std::time::Duration;

use futures::Stream;
use openshell_proto::open_shell_server::{OpenShell, OpenShellServer};
use openshell_proto::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

const TOKEN: &str = "test-token-7f3a";
const WAIT: Duration = Duration::from_secs(10);

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

struct Session {
    authorization: Option<String>,
    hello: SupervisorHello,
    inbound: Streaming<SupervisorMessage>,
    out: mpsc::Sender<Result<GatewayMessage, Status>>,
}

impl Session {
    async fn send(&self, payload: gateway_message::Payload) {
        self.out
            .send(Ok(GatewayMessage {
                payload: Some(payload),
            }))
            .await
            .unwrap();
    }

    async fn accept(&self) {
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

    async fn open(&self, channel_id: &str, target: relay_open::Target) {
        self.send(gateway_message::Payload::RelayOpen(RelayOpen {
            channel_id: channel_id.into(),
            target: Some(target),
            service_id: String::new(),
        }))
        .await;
    }

    /// Next message that is not a heartbeat.
    async fn next(&mut self) -> supervisor_message::Payload {
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

struct Relay {
    authorization: Option<String>,
    channel_id: String,
    inbound: Streaming<RelayFrame>,
    out: mpsc::Sender<Result<RelayFrame, Status>>,
}

impl Relay {
    async fn send(&self, payload: relay_frame::Payload) {
        self.out
            .send(Ok(RelayFrame {
                payload: Some(payload),
            }))
            .await
            .unwrap();
    }

    async fn next(&mut self) -> Option<relay_frame::Payload> {
        timeout(WAIT, self.inbound.message())
            .await
            .expect("relay frame in time")
            .expect("relay stream ok")
            .map(|frame| frame.payload.expect("frame has a payload"))
    }

    /// Collects an exec relay's stdout until its exit event.
    async fn exec_output(&mut self) -> (String, i32) {
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
struct FakeGateway {
    sessions: mpsc::Sender<Session>,
    relays: mpsc::Sender<Relay>,
}

fn authorization<T>(request: &Request<T>) -> Option<String> {
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

struct Gateway {
    url: String,
    sessions: mpsc::Receiver<Session>,
    relays: mpsc::Receiver<Relay>,
}

impl Gateway {
    async fn start() -> Self {
        Self::start_with(None).await
    }

    /// With `tls`, serves https with that identity on `localhost`.
    async fn start_with(tls: Option<tonic::transport::Identity>) -> Self {
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

    async fn session(&mut self) -> Session {
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

    async fn relay(&mut self) -> Relay {
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

struct Supervisor {
    child: Child,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Supervisor {
    fn start(gateway: &str) -> Self {
        Self::start_with(gateway, &[])
    }

    fn start_with(gateway: &str, extra_args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("supervisor.log");
        // The token arrives in a file the supervisor deletes once read.
        let token_file = dir.path().join(".token");
        std::fs::write(&token_file, TOKEN).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_openshell-supervisor"))
            .args([
                "--gateway",
                gateway,
                "--sandbox-id",
                "sandbox-1",
                "--workdir",
            ])
            .arg(dir.path())
            .arg("--token-file")
            .arg(&token_file)
            .args(extra_args)
            .env("RUST_LOG", "trace")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self {
            child,
            log,
            _dir: dir,
        }
    }

    fn terminate(&self) {
        let pid = self.child.id().unwrap() as i32;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

fn exec_target(argv: &[&str]) -> relay_open::Target {
    relay_open::Target::Exec(ExecSandboxRequest {
        command: argv.iter().map(|arg| arg.to_string()).collect(),
        ..Default::default()
    })
}

fn process_gone(pid: i32) -> bool {
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

async fn wait_gone(pid: i32) {
    for _ in 0..100 {
        if process_gone(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("process {pid} is still running");
}

/// Reads the pids an exec printed first (`echo $$ ...`).
async fn read_pids(relay: &mut Relay) -> Vec<i32> {
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

#[tokio::test]
async fn session_relays_and_shutdown() {
    let mut gateway = Gateway::start().await;
    let mut supervisor = Supervisor::start(&gateway.url);

    let mut session = gateway.session().await;
    assert_eq!(session.hello.sandbox_id, "sandbox-1");
    assert_eq!(session.hello.connection_epoch, 1);
    assert!(session.hello.supports_session_redirect);
    assert!(session.hello.supports_config_push);
    assert!(!session.hello.redirected);
    uuid::Uuid::parse_str(&session.hello.instance_id).expect("instance id is a UUID");
    session.accept().await;

    // Exec: request stdin, relay stdin, eof, output, exit.
    let mut request = ExecSandboxRequest {
        command: vec!["sh".into(), "-c".into(), "echo hi; cat".into()],
        stdin: b"a".to_vec(),
        ..Default::default()
    };
    request
        .environment
        .insert("OPENSHELL_SANDBOX_TOKEN".into(), "nope".into());
    session
        .open("exec-1", relay_open::Target::Exec(request))
        .await;
    let mut relay = gateway.relay().await;
    assert_eq!(relay.channel_id, "exec-1");
    relay
        .send(relay_frame::Payload::ExecInput(ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Stdin(b"b".to_vec().into())),
        }))
        .await;
    relay.send(relay_frame::Payload::Eof(RelayEof {})).await;
    let (output, code) = relay.exec_output().await;
    assert_eq!(output, "hi\nab");
    assert_eq!(code, 0);
    // The supervisor ends its request stream after the exit event.
    assert!(relay.next().await.is_none());
    drop(relay);

    // The child's environment never holds the token.
    session
        .open("exec-env", exec_target(&["sh", "-c", "env"]))
        .await;
    let mut relay = gateway.relay().await;
    relay.send(relay_frame::Payload::Eof(RelayEof {})).await;
    let (output, code) = relay.exec_output().await;
    assert_eq!(code, 0);
    assert!(!output.contains("OPENSHELL_SANDBOX_TOKEN"), "{output}");
    assert!(!output.contains(TOKEN), "{output}");
    assert!(
        output.contains("OPENSHELL_SANDBOX_ID=sandbox-1"),
        "{output}"
    );
    drop(relay);

    // TCP to a closed port: failure on the session, no relay claimed.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    session
        .open(
            "tcp-refused",
            relay_open::Target::Tcp(TcpRelayTarget {
                host: "localhost".into(),
                port: closed_port.into(),
            }),
        )
        .await;
    let supervisor_message::Payload::RelayOpenResult(result) = session.next().await else {
        panic!("expected relay_open_result");
    };
    assert_eq!(result.channel_id, "tcp-refused");
    assert!(!result.success);
    assert_eq!(
        result.error,
        format!("connect 127.0.0.1:{closed_port}: Connection refused")
    );

    // TCP to a service that answers after reading everything.
    let service = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let service_port = service.local_addr().unwrap().port();
    let service_task = tokio::spawn(async move {
        let (mut conn, _) = service.accept().await.unwrap();
        let mut request = Vec::new();
        conn.read_to_end(&mut request).await.unwrap();
        conn.write_all(&request).await.unwrap();
        conn.write_all(b"!").await.unwrap();
    });
    session
        .open(
            "tcp-1",
            relay_open::Target::Tcp(TcpRelayTarget {
                host: "127.0.0.1".into(),
                port: service_port.into(),
            }),
        )
        .await;
    let mut relay = gateway.relay().await;
    assert_eq!(relay.channel_id, "tcp-1");
    relay
        .send(relay_frame::Payload::Data(b"ping".to_vec().into()))
        .await;
    relay.send(relay_frame::Payload::Eof(RelayEof {})).await;
    let mut echoed = Vec::new();
    loop {
        match relay.next().await {
            Some(relay_frame::Payload::Data(data)) => echoed.extend(data),
            Some(relay_frame::Payload::Eof(_)) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(echoed, b"ping!");
    assert!(relay.next().await.is_none());
    service_task.await.unwrap();
    drop(relay);

    // relay_close kills a running exec.
    session
        .open(
            "exec-close",
            exec_target(&["sh", "-c", "sleep 30 & echo $$ $!; wait"]),
        )
        .await;
    let mut relay = gateway.relay().await;
    let pids = read_pids(&mut relay).await;
    session
        .send(gateway_message::Payload::RelayClose(RelayClose {
            channel_id: "exec-close".into(),
            reason: "client went away".into(),
        }))
        .await;
    for pid in &pids {
        wait_gone(*pid).await;
    }
    drop(relay);

    // Heartbeats arrive (at most every 5 s even though 1 s was advertised).
    let beat = timeout(Duration::from_secs(8), async {
        loop {
            let message = session.inbound.message().await.unwrap().unwrap();
            if let Some(supervisor_message::Payload::Heartbeat(_)) = message.payload {
                return;
            }
        }
    })
    .await;
    assert!(beat.is_ok(), "no heartbeat");

    // SIGTERM kills running execs, then the supervisor exits 0.
    session
        .open(
            "exec-term",
            exec_target(&["sh", "-c", "sleep 30 & echo $$ $!; wait"]),
        )
        .await;
    let mut relay = gateway.relay().await;
    let pids = read_pids(&mut relay).await;
    supervisor.terminate();
    let status = timeout(WAIT, supervisor.child.wait())
        .await
        .expect("supervisor exits in time")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    for pid in &pids {
        wait_gone(*pid).await;
    }

    let log = supervisor.log();
    assert!(log.contains("session accepted"), "{log}");
    assert!(!log.contains(TOKEN), "the token leaked into the log");
}

#[tokio::test]
async fn redirects_fallbacks_and_reconnects() {
    let mut home = Gateway::start().await;
    let mut peer = Gateway::start().await;
    let supervisor = Supervisor::start(&home.url);

    // Redirected to a live peer: connect there at once, redirected=true.
    let session = home.session().await;
    let instance = session.hello.instance_id.clone();
    session
        .send(gateway_message::Payload::SessionRedirect(SessionRedirect {
            peer_endpoint: peer.url.clone(),
            owner_replica_id: "gw-1".into(),
        }))
        .await;
    let started = tokio::time::Instant::now();
    let session = peer.session().await;
    assert!(started.elapsed() < Duration::from_millis(900), "no backoff");
    assert_eq!(session.hello.connection_epoch, 2);
    assert!(session.hello.redirected);
    assert_eq!(session.hello.instance_id, instance);

    // Rejected before acceptance: back to home after backoff, still redirected.
    session
        .send(gateway_message::Payload::SessionRejected(SessionRejected {
            reason: "not the owner".into(),
        }))
        .await;
    let session = home.session().await;
    assert_eq!(session.hello.connection_epoch, 3);
    assert!(session.hello.redirected);

    // An accepted session that is lost: reconnect with redirected=false.
    // It is lost only once the supervisor has taken the acceptance in (its
    // log says so).
    let accepted = supervisor.log().matches("session accepted").count();
    session.accept().await;
    let taken_in = timeout(WAIT, async {
        while supervisor.log().matches("session accepted").count() == accepted {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        taken_in.is_ok(),
        "no acceptance in the log:\n{}",
        supervisor.log()
    );
    session
        .out
        .send(Err(Status::unavailable("replica stopping")))
        .await
        .unwrap();
    drop(session);
    let started = tokio::time::Instant::now();
    let session = home.session().await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(3),
        "backoff reset to 1 s, waited {waited:?}"
    );
    assert_eq!(session.hello.connection_epoch, 4);
    assert!(!session.hello.redirected);

    // Redirected to a dead peer: fall back to home, still redirected.
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    session
        .send(gateway_message::Payload::SessionRedirect(SessionRedirect {
            peer_endpoint: dead_url,
            owner_replica_id: "gw-9".into(),
        }))
        .await;
    let session = home.session().await;
    assert_eq!(session.hello.connection_epoch, 6);
    assert!(session.hello.redirected);
    drop(session);
    drop(supervisor);
}

#[tokio::test]
async fn exec_dies_with_a_killed_supervisor() {
    let mut gateway = Gateway::start().await;
    let mut supervisor = Supervisor::start(&gateway.url);
    let session = gateway.session().await;
    session.accept().await;
    session
        .open(
            "exec-orphan",
            exec_target(&["sh", "-c", "echo $$; exec sleep 30"]),
        )
        .await;
    let mut relay = gateway.relay().await;
    let pids = read_pids(&mut relay).await;
    supervisor.child.start_kill().unwrap();
    supervisor.child.wait().await.unwrap();
    wait_gone(pids[0]).await;
}

#[tokio::test]
async fn megabytes_of_output_through_the_relay() {
    let mut gateway = Gateway::start().await;
    let _supervisor = Supervisor::start(&gateway.url);
    let session = gateway.session().await;
    session.accept().await;
    let script = "head -c 8000000 /dev/zero & head -c 8000000 /dev/zero >&2; wait";
    session
        .open("exec-big", exec_target(&["sh", "-c", script]))
        .await;
    let mut relay = gateway.relay().await;
    relay.send(relay_frame::Payload::Eof(RelayEof {})).await;
    let (mut stdout, mut stderr) = (0usize, 0usize);
    loop {
        let Some(relay_frame::Payload::ExecEvent(event)) = relay.next().await else {
            panic!("expected exec events");
        };
        match event.payload.unwrap() {
            exec_sandbox_event::Payload::Stdout(chunk) => stdout += chunk.data.len(),
            exec_sandbox_event::Payload::Stderr(chunk) => stderr += chunk.data.len(),
            exec_sandbox_event::Payload::Exit(exit) => {
                assert_eq!(exit.exit_code, 0);
                break;
            }
        }
    }
    assert_eq!((stdout, stderr), (8_000_000, 8_000_000));
}
