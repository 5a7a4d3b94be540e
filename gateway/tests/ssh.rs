//! SSH into sandboxes through a real 3-replica cluster and its edge, with
//! the system's own OpenSSH client (ssh, scp, sftp, rsync) and nothing but
//! an SSH session token: no user token reaches the client side.
//!
//! The client side is sdk-core's forward to [`ForwardTarget::Ssh`]: a
//! local listener whose every connection is one `ForwardTcp` stream to the
//! sandbox's embedded SSH server, carrying the token. `ssh -p <port>` to
//! it is what `ProxyCommand` does with stdin and stdout.
//!
//! The sandboxes run with `--isolation namespaces`; the isolation probes
//! are repeated over ssh and sftp: both see the sandbox's files as its uid,
//! and neither reaches the store, the host key or another sandbox.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use common::*;
use openshell_proto::*;
use openshell_sdk::{CallOptions, ClientConfig, ForwardTarget};
use openshell_testkit::cluster::{ClusterOptions, TestCluster};
use openshell_testkit::{Edge, Gateway, GatewayOptions};
use sha2::{Digest, Sha256};

const COMMAND_LIMIT: Duration = Duration::from_secs(90);

/// Everything the OpenSSH tools need to reach one sandbox.
struct Target {
    port: u16,
    known_hosts: PathBuf,
}

impl Target {
    /// Options every tool takes (`-o`), pinning the host key.
    fn options(&self) -> Vec<String> {
        [
            "UserKnownHostsFile=".to_owned() + &self.known_hosts.display().to_string(),
            "StrictHostKeyChecking=yes".into(),
            "HostKeyAlias=sshbox".into(),
            "BatchMode=yes".into(),
            "ConnectTimeout=30".into(),
            "LogLevel=ERROR".into(),
        ]
        .into_iter()
        .flat_map(|o| ["-o".to_owned(), o])
        .collect()
    }

    fn ssh(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("ssh");
        command
            .args(["-F", "/dev/null", "-p", &self.port.to_string()])
            .args(self.options());
        command
    }

    /// The `-e` of rsync.
    fn rsync_shell(&self) -> String {
        let mut parts = vec![
            "ssh".to_owned(),
            "-F".into(),
            "/dev/null".into(),
            "-p".into(),
            self.port.to_string(),
        ];
        parts.extend(self.options());
        parts.join(" ")
    }

    fn scp(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("scp");
        command
            .args(["-F", "/dev/null", "-P", &self.port.to_string()])
            .args(self.options());
        command
    }

    fn sftp(&self, batch: &Path) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("sftp");
        command
            .args(["-F", "/dev/null", "-P", &self.port.to_string()])
            .args(self.options())
            .arg("-b")
            .arg(batch);
        command
    }
}

const HOST: &str = "sandbox@127.0.0.1";

async fn run(command: &mut tokio::process::Command, stdin: Option<&[u8]>) -> Output {
    use tokio::io::AsyncWriteExt;
    command
        .stdin(if stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("spawn an OpenSSH tool");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input).await.unwrap();
        drop(pipe);
    }
    tokio::time::timeout(COMMAND_LIMIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{command:?} did not finish within {COMMAND_LIMIT:?}"))
        .expect("wait")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn show(output: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        text(&output.stdout),
        text(&output.stderr)
    )
}

async fn ssh_ok(target: &Target, command: &str) -> String {
    let output = run(target.ssh().arg(HOST).arg(command), None).await;
    assert!(output.status.success(), "ssh {command}: {}", show(&output));
    text(&output.stdout)
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Scans the server's host key through the forward at `port`, checks it is
/// the one the gateway reported, and writes a known_hosts file for it
/// (under the alias `sshbox`).
async fn pin_host_key(port: u16, dir: &Path, fingerprint: &str) -> PathBuf {
    let scan = run(
        tokio::process::Command::new("ssh-keyscan").args([
            "-T",
            "30",
            "-t",
            "ed25519",
            "-p",
            &port.to_string(),
            "127.0.0.1",
        ]),
        None,
    )
    .await;
    let scanned = text(&scan.stdout);
    let key = scanned
        .lines()
        .find_map(|line| line.split_once(' ').map(|(_, key)| key.to_owned()))
        .unwrap_or_else(|| panic!("no host key scanned: {}", show(&scan)));
    let known_hosts = dir.join("known_hosts");
    std::fs::write(&known_hosts, format!("sshbox {key}\n")).unwrap();
    let printed = run(
        tokio::process::Command::new("ssh-keygen")
            .arg("-lf")
            .arg(&known_hosts),
        None,
    )
    .await;
    assert!(
        text(&printed.stdout).contains(fingerprint),
        "the server's key is not the one the gateway reported: {}",
        show(&printed)
    );
    known_hosts
}

/// A forward to `sandbox`'s SSH server opened with the session token alone
/// (a client with no user token), a work directory, and the target the tools
/// use with the host key pinned to the session's fingerprint. The forward
/// and the directory must outlive the target's use.
async fn ssh_through(
    url: &str,
    sandbox: &str,
    session: &CreateSshSessionResponse,
) -> (openshell_sdk::ForwardHandle, tempfile::TempDir, Target) {
    let config = ClientConfig::builder(url).build().unwrap();
    let client = openshell_sdk::Client::connect_lazy(config).await.unwrap();
    let forward = client
        .forward_to(
            sandbox,
            ForwardTarget::Ssh,
            Some(&session.token),
            "127.0.0.1:0",
            CallOptions::default(),
        )
        .await
        .unwrap();
    let port = forward.local_addr().port();
    let work = tempfile::tempdir().unwrap();
    let known_hosts = pin_host_key(port, work.path(), &session.host_key_fingerprint).await;
    (forward, work, Target { port, known_hosts })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_scp_sftp_and_rsync_with_a_session_token_alone() {
    let cluster = TestCluster::start(ClusterOptions {
        replicas: 3,
        tokens: vec![TOKEN.into()],
        extra_args: vec!["--isolation".into(), "namespaces".into()],
        ..ClusterOptions::default()
    });
    let routes: Vec<(String, String)> = cluster
        .replicas
        .iter()
        .enumerate()
        .map(|(i, gw)| (format!("gw-{i}"), gw.url.clone()))
        .collect();
    let route_refs: Vec<(&str, &str)> = routes
        .iter()
        .map(|(id, url)| (id.as_str(), url.as_str()))
        .collect();
    let edge = Edge::start(&route_refs);

    // A user sets up: two sandboxes and a session token for one of them.
    let channel = tonic::transport::Channel::from_shared(edge.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut user = openshell_proto::open_shell_client::OpenShellClient::with_interceptor(
        channel,
        Bearer(Some(TOKEN.into())),
    );
    let sandbox = create_ready(&mut user, "sshbox").await;
    let neighbour = create_ready(&mut user, "neighbour").await;
    let (my_id, other_id) = (sandbox.metadata.unwrap().id, neighbour.metadata.unwrap().id);
    sh(&mut user, "neighbour", "echo neighbour-secret > secret.txt").await;
    let session = user
        .create_ssh_session(CreateSshSessionRequest {
            sandbox: "sshbox".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(session.host_key_fingerprint.starts_with("SHA256:"));

    // The client side holds the session token and nothing else; the host
    // key is pinned to what the gateway said.
    let (forward, work, target) = ssh_through(&edge.url, "sshbox", &session).await;

    // A command: output, the sandbox's uid, the exit status.
    let output = run(
        target
            .ssh()
            .arg(HOST)
            .arg("echo hello; id -u; echo oops >&2; exit 7"),
        None,
    )
    .await;
    assert_eq!(output.status.code(), Some(7), "{}", show(&output));
    assert_eq!(text(&output.stdout), "hello\n1000\n");
    assert_eq!(text(&output.stderr), "oops\n");
    // Environment requests.
    let env = run(
        target
            .ssh()
            .args(["-o", "SetEnv=SSH_PROBE_VAR=from-client"])
            .arg(HOST)
            .arg("echo $SSH_PROBE_VAR"),
        None,
    )
    .await;
    assert_eq!(text(&env.stdout), "from-client\n", "{}", show(&env));
    // Stdin reaches a command and its EOF ends it.
    let cat = run(target.ssh().arg(HOST).arg("wc -c"), Some(&[7u8; 12345])).await;
    assert_eq!(text(&cat.stdout).trim(), "12345", "{}", show(&cat));

    // A pty shell: a terminal of the default size, the exit status.
    let shell = run(
        target.ssh().arg("-tt").arg(HOST),
        Some(b"stty size; tty; echo $TERM; exit 3\n"),
    )
    .await;
    let screen = text(&shell.stdout);
    assert_eq!(shell.status.code(), Some(3), "{}", show(&shell));
    assert!(screen.contains("24 80"), "{screen}");
    assert!(screen.contains("/dev/pts/"), "{screen}");

    // scp: 10 MiB each way, intact.
    let payload: Vec<u8> = (0..10 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let digest = sha256_hex(&payload);
    let upload = work.path().join("up.bin");
    std::fs::write(&upload, &payload).unwrap();
    let up = run(
        target.scp().arg(&upload).arg(format!("{HOST}:up.bin")),
        None,
    )
    .await;
    assert!(up.status.success(), "scp up: {}", show(&up));
    let remote = ssh_ok(&target, "sha256sum up.bin").await;
    assert!(remote.starts_with(&digest), "{remote} vs {digest}");
    let download = work.path().join("down.bin");
    let down = run(
        target.scp().arg(format!("{HOST}:up.bin")).arg(&download),
        None,
    )
    .await;
    assert!(down.status.success(), "scp down: {}", show(&down));
    assert_eq!(sha256_hex(&std::fs::read(&download).unwrap()), digest);

    // sftp lists the sandbox's directory.
    let batch = work.path().join("batch");
    std::fs::write(&batch, "pwd\nls -l\n").unwrap();
    let listing = run(target.sftp(&batch).arg(HOST), None).await;
    assert!(listing.status.success(), "sftp: {}", show(&listing));
    let listed = text(&listing.stdout);
    assert!(listed.contains("up.bin"), "{listed}");
    assert!(listed.contains(&format!("{my_id}/work")), "{listed}");

    // rsync, both ways.
    let source = work.path().join("tree");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    std::fs::write(source.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(source.join("sub/b.txt"), "beta\n").unwrap();
    let shell = target.rsync_shell();
    let push = run(
        tokio::process::Command::new("rsync")
            .args(["-a", "-e", &shell])
            .arg(format!("{}/", source.display()))
            .arg(format!("{HOST}:synced/")),
        None,
    )
    .await;
    assert!(push.status.success(), "rsync up: {}", show(&push));
    assert_eq!(
        ssh_ok(&target, "cat synced/a.txt synced/sub/b.txt").await,
        "alpha\nbeta\n"
    );
    let back = work.path().join("back");
    let pull = run(
        tokio::process::Command::new("rsync")
            .args(["-a", "-e", &shell])
            .arg(format!("{HOST}:synced/"))
            .arg(format!("{}/", back.display())),
        None,
    )
    .await;
    assert!(pull.status.success(), "rsync down: {}", show(&pull));
    assert_eq!(
        std::fs::read_to_string(back.join("sub/b.txt")).unwrap(),
        "beta\n"
    );

    // Isolation, over ssh and over sftp: each attack fails, each control
    // (the same operation on the sandbox's own file) succeeds.
    let data = cluster.replicas[0].store_dir();
    let store = data.join("store/gateway.db");
    let host_key = data
        .join("sandboxes")
        .join(&my_id)
        .join("ssh_host_ed25519_key");
    let other_file = data
        .join("sandboxes")
        .join(&other_id)
        .join("work/secret.txt");
    assert!(store.exists() && host_key.exists() && other_file.exists());
    ssh_ok(&target, "echo mine > mine.txt").await;
    let attacks = [&store, &host_key, &other_file];
    for path in attacks {
        let output = run(
            target
                .ssh()
                .arg(HOST)
                .arg(format!("cat '{}'", path.display())),
            None,
        )
        .await;
        assert!(
            !output.status.success() && output.stdout.is_empty(),
            "ssh read {}: {}",
            path.display(),
            show(&output)
        );
        let batch = work.path().join("attack");
        std::fs::write(
            &batch,
            format!(
                "get '{}' {}/stolen\n",
                path.display(),
                work.path().display()
            ),
        )
        .unwrap();
        let output = run(target.sftp(&batch).arg(HOST), None).await;
        assert!(
            !output.status.success() && !work.path().join("stolen").exists(),
            "sftp read {}: {}",
            path.display(),
            show(&output)
        );
    }
    std::fs::write(
        &batch,
        format!("get mine.txt {}/mine.txt\n", work.path().display()),
    )
    .unwrap();
    let control = run(target.sftp(&batch).arg(HOST), None).await;
    assert!(control.status.success(), "sftp control: {}", show(&control));
    assert_eq!(
        std::fs::read_to_string(work.path().join("mine.txt")).unwrap(),
        "mine\n"
    );
    // Files sftp and scp made belong to the sandbox's uid on the host.
    use std::os::unix::fs::MetadataExt;
    let workdir = data.join("sandboxes").join(&my_id).join("work");
    let owner = std::fs::metadata(&workdir).unwrap().uid();
    assert!(owner >= 200_000, "workdir owned by {owner}");
    assert_eq!(
        std::fs::metadata(workdir.join("up.bin")).unwrap().uid(),
        owner
    );
    assert_eq!(
        std::fs::metadata(workdir.join("synced/a.txt"))
            .unwrap()
            .uid(),
        owner
    );
    // The host key is the gateway's, not the sandbox's.
    let key_meta = std::fs::metadata(&host_key).unwrap();
    assert_eq!(key_meta.uid(), 0);
    assert_eq!(
        key_meta.mode() & 0o077,
        0,
        "host key mode {:o}",
        key_meta.mode()
    );

    forward.close();
    forward.closed().await;

    // The token never reached a log line.
    let mut logs = String::new();
    for gw in &cluster.replicas {
        logs.push_str(&gw.log());
    }
    for entry in std::fs::read_dir(data.join("sandboxes")).unwrap() {
        let log = entry.unwrap().path().join("supervisor.log");
        logs.push_str(&std::fs::read_to_string(log).unwrap_or_default());
    }
    assert!(logs.contains("ssh session created"), "the logs were read");
    assert!(!logs.contains(&session.token), "the token is in a log");
    drop(edge);
}

/// `Target::ssh` over one shared connection: `ssh -o ControlPath=...`
/// opens a channel on the master's connection.
fn mux(target: &Target, control: &Path) -> tokio::process::Command {
    let mut command = target.ssh();
    command.args([
        "-o",
        "ControlMaster=no",
        "-o",
        &format!("ControlPath={}", control.display()),
    ]);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_environment_symlinks_and_channels_of_one_connection() {
    let gw = Gateway::start(GatewayOptions::with_token(TOKEN));
    let mut user = client(&gw).await;
    let environment: HashMap<String, String> =
        [("SPEC_ONLY", "from-spec"), ("SPEC_AND_CLIENT", "spec")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
    user.create_sandbox(CreateSandboxRequest {
        name: "envbox".into(),
        spec: Some(SandboxSpec {
            environment,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    wait_phase(&mut user, "envbox", SandboxPhase::Ready).await;
    let session = user
        .create_ssh_session(CreateSshSessionRequest {
            sandbox: "envbox".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (forward, work, target) = ssh_through(&gw.url, "envbox", &session).await;

    // The sandbox's spec environment, as exec has it; the client's `env`
    // requests go over it.
    let exec_env = sh(&mut user, "envbox", "printenv SPEC_ONLY").await;
    assert_eq!(exec_env.stdout_text(), "from-spec\n");
    assert_eq!(ssh_ok(&target, "printenv SPEC_ONLY").await, "from-spec\n");
    let both = run(
        target
            .ssh()
            .args(["-o", "SetEnv=SPEC_AND_CLIENT=client"])
            .arg(HOST)
            .arg("printenv SPEC_AND_CLIENT"),
        None,
    )
    .await;
    assert_eq!(text(&both.stdout), "client\n", "{}", show(&both));

    // A symlink made over sftp points where it was told to.
    ssh_ok(&target, "mkdir -p dir && echo pointed-at > dir/target.txt").await;
    let batch = work.path().join("links");
    std::fs::write(&batch, "ln -s dir/target.txt link.txt\n").unwrap();
    let linked = run(target.sftp(&batch).arg(HOST), None).await;
    assert!(linked.status.success(), "sftp ln -s: {}", show(&linked));
    let read = sh(&mut user, "envbox", "readlink link.txt; cat link.txt").await;
    assert_eq!(read.stdout_text(), "dir/target.txt\npointed-at\n");

    // One connection, many channels: a master connection and clients
    // that open channels on it.
    let control = work.path().join("cm");
    let mut master = target
        .ssh()
        .args([
            "-N",
            "-o",
            "ControlMaster=yes",
            "-o",
            &format!("ControlPath={}", control.display()),
        ])
        .arg(HOST)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    for _ in 0..300 {
        if control.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(control.exists(), "no control socket after 30 s");
    let alive = run(mux(&target, &control).arg(HOST).arg("echo alive"), None).await;
    assert_eq!(text(&alive.stdout), "alive\n", "{}", show(&alive));

    // A process that never reads its stdin, fed 8 MiB: the input waits
    // within the supervisor's input budget (64 MiB by default; past it the
    // connection is no longer read, see ssh_input_budget.rs), and the
    // connection's other channels keep working meanwhile.
    let mut staller = mux(&target, &control)
        .arg(HOST)
        .arg("sleep 120")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = staller.stdin.take().unwrap();
    let feeder = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..8 {
            stdin.write_all(&chunk).await.unwrap();
        }
        stdin
    });
    let stdin = tokio::time::timeout(COMMAND_LIMIT, feeder)
        .await
        .expect("8 MiB fed")
        .unwrap();
    let alive = run(mux(&target, &control).arg(HOST).arg("echo alive"), None).await;
    assert_eq!(text(&alive.stdout), "alive\n", "{}", show(&alive));
    drop(stdin);
    staller.kill().await.unwrap();

    // At most 16 channels at once: the 17th is refused until one closes.
    let mut sleepers = Vec::new();
    for _ in 0..16 {
        let mut sleeper = mux(&target, &control)
            .arg(HOST)
            .arg("echo up; sleep 120")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut out = tokio::io::BufReader::new(sleeper.stdout.take().unwrap());
        let mut line = String::new();
        use tokio::io::AsyncBufReadExt;
        tokio::time::timeout(COMMAND_LIMIT, out.read_line(&mut line))
            .await
            .expect("a channel started")
            .unwrap();
        assert_eq!(line, "up\n");
        sleepers.push((sleeper, out));
    }
    // (OpenSSH then falls back to a connection of its own.)
    const REFUSED: &str = "Session open refused by peer";
    let extra = run(mux(&target, &control).arg(HOST).arg("echo extra"), None).await;
    assert!(
        text(&extra.stderr).contains(REFUSED),
        "a 17th channel: {}",
        show(&extra)
    );
    let (mut first, _) = sleepers.remove(0);
    first.kill().await.unwrap();
    let mut admitted = false;
    for _ in 0..50 {
        let extra = run(mux(&target, &control).arg(HOST).arg("echo extra"), None).await;
        if !text(&extra.stderr).contains(REFUSED) && text(&extra.stdout) == "extra\n" {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(admitted, "a channel was still refused after one closed");
    drop(sleepers);
    master.kill().await.unwrap();
    forward.close();
    forward.closed().await;
}
