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
        Self::start_with(gateway, dir, root, &[])
    }

    fn start_with(gateway: &str, dir: &Path, root: &Path, extra: &[&str]) -> Self {
        let log = dir.join("host.log");
        let token_file = dir.join(".token");
        write_private(&token_file, TOKEN);
        let child = Command::new(env!("CARGO_BIN_EXE_openshell-supervisor"))
            .args(["host", "--gateway", gateway, "--host-id", "h-1"])
            .arg("--token-file")
            .arg(&token_file)
            .arg("--root")
            .arg(root)
            .args(["--capacity", "8"])
            .args(extra)
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

/// Writes `text` to `path`, readable by its owner only.
fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
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
    // Left by an earlier life of the host: a sandbox deleted meanwhile, and
    // something that is not a sandbox.
    std::fs::create_dir_all(root.join("sb-gone").join("work")).unwrap();
    std::fs::create_dir_all(root.join("not-a-sandbox")).unwrap();
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
    wait_missing(&root.join("sb-gone")).await;
    assert!(root.join("not-a-sandbox").is_dir());

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
    // The host token file stays for the next start.
    assert!(dir.path().join(".token").is_file());
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

    // A token file others may read is refused, naming the file, not the
    // token.
    let token_file = dir.path().join(".token");
    write_private(&token_file, TOKEN);
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_openshell-supervisor"))
        .args([
            "host",
            "--gateway",
            "http://127.0.0.1:1",
            "--host-id",
            "h-1",
        ])
        .arg("--token-file")
        .arg(&token_file)
        .arg("--root")
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("may be read by group or others"),
        "{stderr}"
    );
    assert!(!stderr.contains(TOKEN), "{stderr}");

    write_private(&token_file, "");
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
    assert!(
        stderr.contains("the host token is invalid: it is empty"),
        "{stderr}"
    );
}

/// Host pids of the host's sandbox inits (the parents of the sandboxes'
/// PID 1s): the children of its init fork server.
fn sandbox_inits(host_pid: u32) -> Vec<i32> {
    let servers: Vec<i32> = descendants(host_pid as i32)
        .into_iter()
        .filter(|pid| {
            parent(*pid) == Some(host_pid as i32)
                && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                    cmdline
                        .split(|b| *b == 0)
                        .any(|arg| arg == b"--zygote" || arg == b"__sandbox-zygote")
                })
        })
        .collect();
    descendants(host_pid as i32)
        .into_iter()
        .filter(|pid| parent(*pid).is_some_and(|ppid| servers.contains(&ppid)))
        .collect()
}

fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// `root` and every process below it.
fn descendants(root: i32) -> Vec<i32> {
    let all: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, parent(pid)?)))
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let pid = found[i];
        found.extend(all.iter().filter(|(_, ppid)| *ppid == pid).map(|(p, _)| *p));
        i += 1;
    }
    found
}

/// `VmRSS` of `pid`, in KiB.
fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Summed `Pss:` of `pids`, in KiB.
fn pss_kib(pids: &[i32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok())
        .filter_map(|rollup| {
            rollup
                .lines()
                .find_map(|line| line.strip_prefix("Pss:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
        })
        .sum()
}

async fn exec_output(
    stream: &HostStream,
    gateway: &mut HostGateway,
    sandbox: &str,
    channel: &str,
    script: &str,
) -> (String, i32) {
    stream.open(sandbox, channel, script).await;
    gateway.relay(channel).await.exec_output().await
}

#[tokio::test]
async fn isolated_sandboxes_get_inits_of_their_own_and_lose_them_when_unassigned() {
    let mut gateway = HostGateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut host = Host::start_with(
        &gateway.url,
        dir.path(),
        &root,
        &["--isolation", "namespaces"],
    );
    let host_pid = host.child.id().unwrap();
    let mut stream = gateway.host().await;
    stream.accept().await;
    stream.assign(&["sb-1", "sb-2"]).await;
    assert_eq!(stream.accept_sandboxes(2).await, ["sb-1", "sb-2"]);
    assert_eq!(sandbox_inits(host_pid).len(), 2, "{}", host.log());

    // Inside: the sandbox uid, its own PID 1, and of the root only its own
    // working directory.
    let script = format!(
        "id -u; echo $$; ls -a {root}; ls -a {root}/sb-1; cat {root}/sb-1/ssh_host_ed25519_key",
        root = root.display()
    );
    let (output, code) = exec_output(&stream, &mut gateway, "sb-1", "ch-1", &script).await;
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines[0], "1000", "{output}");
    assert!(lines[1].parse::<i32>().unwrap() < 10, "{output}");
    assert!(!output.contains("sb-2"), "{output}");
    assert!(
        !output.contains("ssh_host_ed25519_key\n") || code != 0,
        "{output}"
    );
    assert!(!output.contains("OPENSSH PRIVATE KEY"), "{output}");
    assert_ne!(code, 0, "the key must not be readable: {output}");

    // A daemon in sb-2 dies with sb-2's init when sb-2 is unassigned.
    let (_, code) = exec_output(
        &stream,
        &mut gateway,
        "sb-2",
        "ch-2",
        "sleep 1000 >/dev/null 2>&1 &",
    )
    .await;
    assert_eq!(code, 0);
    let inits = sandbox_inits(host_pid);
    let below: Vec<i32> = inits.iter().flat_map(|pid| descendants(*pid)).collect();
    stream.assign(&["sb-1"]).await;
    for _ in 0..250 {
        if sandbox_inits(host_pid).len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sandbox_inits(host_pid).len(), 1);
    let left = descendants(host_pid as i32);
    let survivors: Vec<&i32> = below
        .iter()
        .filter(|pid| !process_gone(**pid) && !left.contains(pid))
        .collect();
    assert!(survivors.is_empty(), "{survivors:?}");
    wait_missing(&root.join("sb-2")).await;

    // sb-1's init dies: the sandbox starts again with a new one (a sandbox
    // without its PID 1 could run nothing) and its session reopens.
    let old_init = sandbox_inits(host_pid)[0];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old_init),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert_eq!(stream.accept_sandboxes(1).await, ["sb-1"]);
    let inits = sandbox_inits(host_pid);
    assert_eq!(inits.len(), 1);
    assert_ne!(inits[0], old_init);
    let (output, code) = exec_output(&stream, &mut gateway, "sb-1", "ch-4", "id -u").await;
    assert_eq!((output.as_str(), code), ("1000\n", 0));
    let below: Vec<i32> = inits.iter().flat_map(|pid| descendants(*pid)).collect();

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(host_pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = timeout(WAIT, host.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{}", host.log());
    for pid in below {
        wait_gone(pid).await;
    }
}

/// Sandboxes per host in the memory comparison: 100 sandboxes on 4 hosts.
const SANDBOXES_PER_HOST: usize = 25;

/// One host serving 25 idle isolated sandboxes against 25 per-sandbox
/// supervisors serving one each, side by side: the PSS of every process
/// involved (supervisors or host, sandbox inits and PID 1s). The issue's
/// figure (under a tenth, through real gateways) is `openshell-bench
/// hosts`; here, debug builds, a host measures about 0.08 (inits forked
/// from the standalone init's fork server), 0.1 with an exec'd standalone
/// init per sandbox and 0.4 with the supervisor binary exec'd per sandbox.
#[tokio::test]
async fn a_host_costs_under_a_tenth_of_per_sandbox_supervisors() {
    // More for a measurement by hand: OPENSHELL_TEST_HOST_SANDBOXES=100.
    let count = std::env::var("OPENSHELL_TEST_HOST_SANDBOXES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(SANDBOXES_PER_HOST);
    let ids: Vec<String> = (0..count).map(|i| format!("mem-{i}")).collect();
    let dir = tempfile::tempdir().unwrap();

    // Per-sandbox supervisors, each with its session accepted.
    let mut gateway = Gateway::start().await;
    let mut supervisors = Vec::new();
    for id in &ids {
        let token_file = dir.path().join(format!(".token-{id}"));
        std::fs::write(&token_file, TOKEN).unwrap();
        let workdir = dir.path().join("per-sandbox").join(id);
        std::fs::create_dir_all(&workdir).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_openshell-supervisor"))
            .args(["--gateway", &gateway.url, "--sandbox-id", id, "--workdir"])
            .arg(&workdir)
            .arg("--token-file")
            .arg(&token_file)
            .args(["--isolation", "namespaces"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        supervisors.push(child);
    }
    let mut sessions = Vec::new();
    for _ in &ids {
        let session = gateway.session().await;
        session.accept().await;
        sessions.push(session);
    }

    // One host with all of them.
    let mut host_gateway = HostGateway::start().await;
    let root = dir.path().join("root");
    let mut host = Host::start_with(
        &host_gateway.url,
        dir.path(),
        &root,
        &["--isolation", "namespaces"],
    );
    let host_pid = host.child.id().unwrap();
    let mut stream = host_gateway.host().await;
    stream.accept().await;
    stream.assign(&[]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = (rss_kib(host_pid as i32), pss_kib(&[host_pid as i32]));
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    stream.assign(&refs).await;
    assert_eq!(stream.accept_sandboxes(ids.len()).await.len(), ids.len());
    assert_eq!(sandbox_inits(host_pid).len(), ids.len(), "{}", host.log());

    // Idle for a moment: heartbeats flow, allocations settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let per_sandbox_pids: Vec<i32> = supervisors
        .iter()
        .flat_map(|child| descendants(child.id().unwrap() as i32))
        .collect();
    let host_pids = descendants(host_pid as i32);
    let per_sandbox = pss_kib(&per_sandbox_pids);
    let hosted = pss_kib(&host_pids);
    let host_alone = pss_kib(&[host_pid as i32]);
    let ratio = hosted as f64 / per_sandbox as f64;
    println!(
        "host serving 0 sandboxes: {} KiB RSS, {} KiB PSS; serving {}: {} KiB RSS",
        idle.0,
        idle.1,
        ids.len(),
        rss_kib(host_pid as i32)
    );
    println!(
        "{n} isolated sandboxes: per-sandbox supervisors {per_sandbox} KiB PSS in {pp} processes; \
         one host {hosted} KiB PSS in {hp} processes (host process {host_alone} KiB); ratio {ratio:.3}",
        n = ids.len(),
        pp = per_sandbox_pids.len(),
        hp = host_pids.len(),
    );
    // The host, its init fork server, and two processes per sandbox.
    assert_eq!(host_pids.len(), 2 + 2 * ids.len());
    assert!(ratio < 0.1, "ratio {ratio:.3}");
    drop(sessions);
    drop(supervisors);

    // A host killed outright takes every init and sandbox with it
    // (parent-death signals all the way down).
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(host_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = timeout(WAIT, host.child.wait()).await.unwrap();
    for pid in host_pids {
        wait_gone(pid).await;
    }
}
