//! Runs the real `openshell-supervisor` binary against an in-test gateway
//! that speaks the session and relay protocol, and checks the supervisor's
//! side of it: hello, bearer token, relays, redirects, reconnects, shutdown.

mod fake_gateway;

use std::process::Stdio;
use std::time::Duration;

use fake_gateway::*;
use openshell_proto::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::time::timeout;
use tonic::Status;

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
