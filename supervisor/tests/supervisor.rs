//! Runs the real `openshell-supervisor` (per-sandbox mode) against real
//! gateways started by testkit with `--driver none`, so the test starts
//! each supervisor itself (token file from the store, signals, its log),
//! and checks the supervisor's side through the gateway's API: session,
//! exec with stdin, the environment of sandbox processes, TCP relays,
//! cancelled and SIGTERMed execs, placement redirects and the fallback when
//! its replica dies, a killed supervisor, megabytes of output.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use openshell_sdk::{CallOptions, ExecRequest, ForwardTarget};
use openshell_testkit::cluster::{ClusterOptions, TestCluster, ring_owner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::time::timeout;

struct Supervisor {
    child: Child,
    log: std::path::PathBuf,
    token: String,
    _dir: tempfile::TempDir,
}

impl Supervisor {
    /// The supervisor of `sandbox_id` (its token from `store`), dialling
    /// `gateway`.
    fn start(gateway: &str, store: &std::path::Path, sandbox_id: &str) -> Self {
        let token = sandbox_token(store, sandbox_id).expect("sandbox token in the store");
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("supervisor.log");
        // The token arrives in a file the supervisor deletes once read.
        let token_file = dir.path().join(".token");
        std::fs::write(&token_file, &token).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_openshell-supervisor"))
            .args([
                "--gateway",
                gateway,
                "--sandbox-id",
                sandbox_id,
                "--workdir",
            ])
            .arg(dir.path())
            .arg("--token-file")
            .arg(&token_file)
            .args(["--isolation", "none"])
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self {
            child,
            log,
            token,
            _dir: dir,
        }
    }

    fn pid(&self) -> i32 {
        self.child.id().unwrap() as i32
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

#[tokio::test]
async fn session_relays_and_shutdown() {
    let gw = gateway("none");
    let client = client(&gw.url).await;
    let id = create(&client, "sup").await;
    let mut supervisor = Supervisor::start(&gw.url, &gw.store_dir(), &id);
    wait_ready(&client, "sup").await;
    // The token file is gone once read.
    assert!(!supervisor._dir.path().join(".token").exists());

    // Exec with stdin.
    let out = client
        .exec(
            ExecRequest::new("sup", ["sh", "-c", "echo hi; cat"]).stdin(&b"ab"[..]),
            CallOptions::new(),
        )
        .await
        .expect("exec");
    assert_eq!((out.stdout.as_ref(), out.exit_code), (&b"hi\nab"[..], 0));

    // The child's environment never holds the token; it names the sandbox.
    let (output, code) = sh(&client, "sup", "env").await;
    assert_eq!(code, 0);
    assert!(!output.contains("OPENSHELL_SANDBOX_TOKEN"), "{output}");
    assert!(!output.contains(&supervisor.token), "{output}");
    assert!(
        output.contains(&format!("OPENSHELL_SANDBOX_ID={id}")),
        "{output}"
    );

    // TCP to a closed port: the stream fails, nothing is relayed.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let (reader, _keep) = tokio::io::duplex(64);
    let failed = timeout(
        WAIT,
        client.forward_io(
            "sup",
            ForwardTarget::Tcp(closed_port),
            None,
            reader,
            tokio::io::sink(),
            CallOptions::new(),
        ),
    )
    .await
    .expect("a refused forward ends in time");
    let err = failed.expect_err("forward to a closed port");
    assert_eq!(err.code(), "unavailable", "{err}");
    assert!(err.to_string().contains("Connection refused"), "{err}");

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
    let mut echoed = Vec::new();
    let stats = timeout(
        WAIT,
        client.forward_io(
            "sup",
            ForwardTarget::Tcp(service_port),
            None,
            &b"ping"[..],
            &mut echoed,
            CallOptions::new(),
        ),
    )
    .await
    .expect("forward in time")
    .expect("forward");
    assert_eq!(echoed, b"ping!");
    assert_eq!((stats.bytes_out, stats.bytes_in), (4, 5));
    service_task.await.unwrap();

    // A cancelled exec (the client went away) is killed, its children too.
    let (pids, stream) = exec_with_pids(&client, "sup", "sleep 30 & echo $$ $!; wait").await;
    drop(stream);
    for pid in &pids {
        wait_gone(*pid).await;
    }

    // SIGTERM kills running execs, then the supervisor exits 0.
    let (pids, _stream) = exec_with_pids(&client, "sup", "sleep 30 & echo $$ $!; wait").await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(supervisor.pid()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
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
    assert!(
        !log.contains(&supervisor.token),
        "the token leaked into the log"
    );
}

/// Sessions `gw` holds.
fn sessions(gw: &openshell_testkit::Gateway) -> f64 {
    gw.metric("openshell_server_supervisor_sessions")
        .unwrap_or(0.0)
}

#[tokio::test]
async fn redirects_and_the_fallback_when_the_owner_dies() {
    let mut cluster = TestCluster::start(ClusterOptions {
        replicas: 2,
        tokens: vec![TOKEN.into()],
        extra_args: [
            "--allow-test-flags",
            "--member-refresh-ms",
            "300",
            "--member-ttl-ms",
            "5000",
            "--driver",
            "none",
        ]
        .map(String::from)
        .to_vec(),
        ..ClusterOptions::default()
    });
    for gw in &cluster.replicas {
        let ok = eventually(Duration::from_secs(15), || {
            gw.metric("openshell_server_ring_members") == Some(2.0)
        })
        .await;
        assert!(ok, "ring incomplete");
    }
    let home = cluster.replica("gw-0").url.clone();
    let store = cluster.shared_dir().join("data");
    let client = client(&home).await;
    // A sandbox the ring places on gw-1.
    let mut target = None;
    for n in 0..40 {
        let name = format!("away-{n}");
        let id = create(&client, &name).await;
        if ring_owner(&["gw-0", "gw-1"], &id) == "gw-1" {
            target = Some((name, id));
            break;
        }
    }
    let (name, id) = target.expect("one of 40 sandboxes is owned by gw-1");

    // Dialling gw-0, it is redirected to gw-1 and accepted there.
    let supervisor = Supervisor::start(&home, &store, &id);
    wait_ready(&client, &name).await;
    let on_owner = eventually(Duration::from_secs(10), || {
        sessions(cluster.replica("gw-1")) == 1.0
    })
    .await;
    assert!(on_owner, "not accepted on gw-1:\n{}", supervisor.log());
    assert_eq!(sessions(cluster.replica("gw-0")), 0.0);
    // The redirect was followed at once, without a backoff.
    let log = supervisor.log();
    let accepted = log.find("session accepted").expect("accepted in the log");
    assert!(log[..accepted].contains("session redirected"), "{log}");
    assert!(
        !log[..accepted].contains("reconnecting after backoff"),
        "{log}"
    );

    // gw-1 dies outright: the supervisor reconnects to its gateway
    // address, and once gw-1 has left the ring (its TTL) gw-0 accepts it.
    // The sandbox serves again.
    cluster.replica_mut("gw-1").kill();
    let back = eventually(Duration::from_secs(20), || {
        sessions(cluster.replica("gw-0")) == 1.0
    })
    .await;
    assert!(back, "not accepted on gw-0:\n{}", supervisor.log());
    // On the way gw-0, whose ring still held gw-1 until its TTL, sent it
    // to the dead replica; connecting there failed and it came back to
    // its gateway address.
    let log = supervisor.log();
    let rest = &log[accepted..];
    // An accepted session that was lost starts its backoff afresh (1 s).
    let lost = rest.find("session lost").expect("the session was lost");
    assert!(
        rest[lost..].contains("reconnecting after backoff delay_ms=1000"),
        "{log}"
    );
    let redirected = rest.find("session redirected").expect("a second redirect");
    assert!(
        rest[redirected..].contains("session connect failed"),
        "{log}"
    );
    assert_eq!(
        sh_eventually(&client, &name, "echo back").await,
        ("back\n".into(), 0)
    );
}

#[tokio::test]
async fn exec_dies_with_a_killed_supervisor() {
    let gw = gateway("none");
    let client = client(&gw.url).await;
    let id = create(&client, "orphan").await;
    let mut supervisor = Supervisor::start(&gw.url, &gw.store_dir(), &id);
    wait_ready(&client, "orphan").await;
    let (pids, _stream) = exec_with_pids(&client, "orphan", "echo $$; exec sleep 30").await;
    supervisor.child.start_kill().unwrap();
    supervisor.child.wait().await.unwrap();
    wait_gone(pids[0]).await;
}

#[tokio::test]
async fn megabytes_of_output_through_the_relay() {
    let gw = gateway("none");
    let client = client(&gw.url).await;
    let id = create(&client, "big").await;
    let _supervisor = Supervisor::start(&gw.url, &gw.store_dir(), &id);
    wait_ready(&client, "big").await;
    let script = "head -c 8000000 /dev/zero & head -c 8000000 /dev/zero >&2; wait";
    let out = client
        .exec(
            ExecRequest::new("big", ["sh", "-c", script]),
            CallOptions::new(),
        )
        .await
        .expect("exec");
    assert_eq!(out.exit_code, 0);
    assert_eq!((out.stdout.len(), out.stderr.len()), (8_000_000, 8_000_000));
}
