//! Runs `openshell-supervisor host` against an in-test gateway that speaks
//! the host protocol (`ConnectHost`, sandbox sessions inside it) and the
//! relay protocol, and checks the host's side: hello, assignment, sandboxes
//! started and stopped, relays surviving a session move, SIGTERM.

mod fake_gateway;

use std::path::Path;
use std::pin::Pin;
use std::process::Stdio;
use std::time::Duration;

use fake_gateway::*;
use futures::Stream;
use openshell_proto::open_shell_server::OpenShellServer;
use openshell_proto::supervisor_host::supervisor_host_server::{
    SupervisorHost, SupervisorHostServer,
};
use openshell_proto::supervisor_host::*;
use openshell_proto::*;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

type HostStreamOut = Pin<Box<dyn Stream<Item = Result<HostGatewayMessage, Status>> + Send>>;

/// One `ConnectHost` stream, as the fake gateway holds it.
struct HostStream {
    authorization: Option<String>,
    hello: HostHello,
    inbound: Streaming<HostMessage>,
    out: mpsc::Sender<Result<HostGatewayMessage, Status>>,
}

impl HostStream {
    async fn send(&self, payload: host_gateway_message::Payload) {
        self.out
            .send(Ok(HostGatewayMessage {
                payload: Some(payload),
            }))
            .await
            .unwrap();
    }

    async fn accept(&self) {
        self.send(host_gateway_message::Payload::Accepted(HostAccepted {
            session_id: "hs-1".into(),
            heartbeat_interval: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            replica_id: String::new(),
        }))
        .await;
    }

    async fn assign(&self, ids: &[&str]) {
        let sandboxes = ids
            .iter()
            .map(|id| AssignedSandbox {
                sandbox_id: id.to_string(),
                name: format!("name-{id}"),
                ..Default::default()
            })
            .collect();
        self.send(host_gateway_message::Payload::Assignment(HostAssignment {
            sandboxes,
        }))
        .await;
    }

    async fn to_sandbox(&self, sandbox_id: &str, payload: gateway_message::Payload) {
        self.send(host_gateway_message::Payload::Sandbox(
            SandboxGatewayMessage {
                sandbox_id: sandbox_id.into(),
                message: Some(GatewayMessage {
                    payload: Some(payload),
                }),
                end: false,
            },
        ))
        .await;
    }

    async fn open(&self, sandbox_id: &str, channel_id: &str, script: &str) {
        self.to_sandbox(
            sandbox_id,
            gateway_message::Payload::RelayOpen(RelayOpen {
                channel_id: channel_id.into(),
                target: Some(exec_target(&["sh", "-c", script])),
                service_id: String::new(),
            }),
        )
        .await;
    }

    /// The next sandbox envelope that is not a heartbeat.
    async fn next_sandbox(&mut self) -> SandboxSupervisorMessage {
        loop {
            let message = timeout(WAIT, self.inbound.message())
                .await
                .expect("host message in time")
                .expect("host stream ok")
                .expect("host stream open");
            if let Some(host_message::Payload::Sandbox(envelope)) = message.payload {
                let heartbeat = matches!(
                    &envelope.message,
                    Some(SupervisorMessage {
                        payload: Some(supervisor_message::Payload::Heartbeat(_))
                    })
                );
                if !heartbeat {
                    return envelope;
                }
            }
        }
    }

    /// Accepts the sessions of `count` sandboxes; their ids, sorted.
    async fn accept_sandboxes(&mut self, count: usize) -> Vec<String> {
        let mut ids = Vec::new();
        while ids.len() < count {
            let envelope = self.next_sandbox().await;
            let Some(SupervisorMessage {
                payload: Some(supervisor_message::Payload::Hello(hello)),
            }) = envelope.message
            else {
                continue;
            };
            assert_eq!(hello.sandbox_id, envelope.sandbox_id);
            assert!(hello.ssh_host_key_fingerprint.starts_with("SHA256:"));
            self.to_sandbox(
                &envelope.sandbox_id,
                gateway_message::Payload::SessionAccepted(SessionAccepted {
                    session_id: format!("s-{}", envelope.sandbox_id),
                    heartbeat_interval: Some(prost_types::Duration {
                        seconds: 1,
                        nanos: 0,
                    }),
                    ..Default::default()
                }),
            )
            .await;
            ids.push(envelope.sandbox_id);
        }
        ids.sort();
        ids
    }
}

#[derive(Clone)]
struct FakeHostGateway {
    hosts: mpsc::Sender<HostStream>,
}

#[tonic::async_trait]
impl SupervisorHost for FakeHostGateway {
    type ConnectHostStream = HostStreamOut;

    async fn connect_host(
        &self,
        request: Request<Streaming<HostMessage>>,
    ) -> Result<Response<Self::ConnectHostStream>, Status> {
        let authorization = request
            .metadata()
            .get("authorization")
            .map(|value| value.to_str().unwrap().to_owned());
        let mut inbound = request.into_inner();
        let Some(HostMessage {
            payload: Some(host_message::Payload::Hello(hello)),
        }) = inbound.message().await?
        else {
            return Err(Status::invalid_argument("first message must be hello"));
        };
        let (out, rx) = mpsc::channel(64);
        self.hosts
            .send(HostStream {
                authorization,
                hello,
                inbound,
                out,
            })
            .await
            .unwrap();
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

struct HostGateway {
    url: String,
    hosts: mpsc::Receiver<HostStream>,
    relays: mpsc::Receiver<Relay>,
}

impl HostGateway {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let (hosts_tx, hosts) = mpsc::channel(4);
        let (sessions, _) = mpsc::channel(1);
        let (relays_tx, relays) = mpsc::channel(4);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(SupervisorHostServer::new(FakeHostGateway {
                    hosts: hosts_tx,
                }))
                .add_service(OpenShellServer::new(FakeGateway {
                    sessions,
                    relays: relays_tx,
                }))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        Self { url, hosts, relays }
    }

    async fn host(&mut self) -> HostStream {
        let host = timeout(WAIT, self.hosts.recv())
            .await
            .expect("host connects in time")
            .unwrap();
        assert_eq!(
            host.authorization.as_deref(),
            Some(format!("Bearer {TOKEN}").as_str())
        );
        host
    }

    async fn relay(&mut self, channel_id: &str) -> Relay {
        let relay = timeout(WAIT, self.relays.recv())
            .await
            .expect("relay claimed in time")
            .unwrap();
        assert_eq!(relay.channel_id, channel_id);
        assert_eq!(
            relay.authorization.as_deref(),
            Some(format!("Bearer {TOKEN}").as_str())
        );
        relay
    }
}

struct Host {
    child: Child,
    log: std::path::PathBuf,
}

impl Host {
    fn start(gateway: &str, dir: &Path, root: &Path) -> Self {
        let log = dir.join("host.log");
        let token_file = dir.join(".token");
        std::fs::write(&token_file, TOKEN).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_openshell-supervisor"))
            .args(["host", "--gateway", gateway, "--host-id", "h-1"])
            .arg("--token-file")
            .arg(&token_file)
            .arg("--root")
            .arg(root)
            .args(["--capacity", "8"])
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        assert!(!token_file.exists() || wait_removed(&token_file));
        Self { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

fn wait_removed(path: &Path) -> bool {
    for _ in 0..250 {
        if !path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

async fn wait_missing(path: &Path) {
    for _ in 0..250 {
        if !path.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{} is still there", path.display());
}

#[tokio::test]
async fn host_serves_its_assignment_across_a_session_move() {
    let mut gateway = HostGateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut host = Host::start(&gateway.url, dir.path(), &root);

    // Hello, acceptance, assignment: one sandbox session per sandbox.
    let mut stream = gateway.host().await;
    assert_eq!(stream.hello.member_id, "h-1");
    assert_eq!(stream.hello.capacity, 8);
    assert!(!stream.hello.stay);
    stream.accept().await;
    stream.assign(&["sb-1", "sb-2"]).await;
    assert_eq!(stream.accept_sandboxes(2).await, ["sb-1", "sb-2"]);
    for id in ["sb-1", "sb-2"] {
        assert!(root.join(id).join("work").is_dir());
        assert!(root.join(id).join("ssh_host_ed25519_key").is_file());
    }

    // A process in each sandbox, over relays claimed with the host token.
    stream
        .open(
            "sb-1",
            "ch-1",
            "echo $$; read line; echo got $line in $HOME",
        )
        .await;
    let mut relay_1 = gateway.relay("ch-1").await;
    let pid_1 = read_pids(&mut relay_1).await[0];
    stream
        .open("sb-2", "ch-2", "echo $$; exec sleep 1000")
        .await;
    let mut relay_2 = gateway.relay("ch-2").await;
    let pid_2 = read_pids(&mut relay_2).await[0];

    // The host's session ends (its replica went): the host dials again
    // with `stay`, its sandboxes' sessions reopen, and the processes and
    // relays went on meanwhile.
    drop(stream);
    let mut stream = gateway.host().await;
    assert!(stream.hello.stay);
    stream.accept().await;
    stream.assign(&["sb-1", "sb-2"]).await;
    assert_eq!(stream.accept_sandboxes(2).await, ["sb-1", "sb-2"]);
    assert!(!process_gone(pid_1) && !process_gone(pid_2));
    relay_1
        .send(relay_frame::Payload::ExecInput(ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Stdin(b"hi\n".to_vec().into())),
        }))
        .await;
    let (output, code) = relay_1.exec_output().await;
    let home = root.join("sb-1").join("work");
    assert_eq!(output, format!("got hi in {}\n", home.display()));
    assert_eq!(code, 0);

    // sb-2 leaves the assignment: its process dies, its directory goes.
    stream.assign(&["sb-1"]).await;
    wait_gone(pid_2).await;
    wait_missing(&root.join("sb-2")).await;
    assert!(root.join("sb-1").is_dir());

    // SIGTERM: every sandbox's processes die, files stay, exit 0.
    stream
        .open("sb-1", "ch-3", "echo $$; exec sleep 1000")
        .await;
    let mut relay_3 = gateway.relay("ch-3").await;
    let pid_3 = read_pids(&mut relay_3).await[0];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(host.child.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = timeout(WAIT, host.child.wait())
        .await
        .expect("host exits in time")
        .unwrap();
    assert!(status.success(), "{status}: {}", host.log());
    wait_gone(pid_3).await;
    assert!(root.join("sb-1").join("ssh_host_ed25519_key").is_file());
    let log = host.log();
    assert!(!log.contains(TOKEN), "the token leaked into the log");
    assert!(log.contains("sandbox unassigned"), "{log}");
}

#[tokio::test]
async fn host_refuses_bad_arguments_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_openshell-supervisor"))
        .args([
            "host",
            "--gateway",
            "http://127.0.0.1:1",
            "--host-id",
            "h-1",
        ])
        .arg("--root")
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("the host token is required"), "{stderr}");

    let token_file = dir.path().join(".token");
    std::fs::write(&token_file, "").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_openshell-supervisor"))
        .args(["host", "--gateway", "http://127.0.0.1:1", "--host-id", ""])
        .arg("--token-file")
        .arg(&token_file)
        .arg("--root")
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("the host token is invalid: it is empty"), "{stderr}");
}
