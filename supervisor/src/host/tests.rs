//! Host runtimes against a fake gateway on loopback, with real processes:
//! each sandbox's session here is a plain `ConfigSession` (the runtime does
//! not care what carries it), so these tests run without the gateway's host
//! side.

#[path = "../../tests/fake_gateway/mod.rs"]
mod fake_gateway;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fake_gateway::*;
use openshell_proto::*;
use openshell_sdk::ConfigSession;

use super::pool::Pool;
use super::runtime::{HostSettings, SSH_HOST_KEY_FILE, WORK_DIR};
use crate::transport::BearerToken;

fn pool(gateway: &str, root: &Path) -> Pool {
    let client = crate::transport::client_config(gateway, TOKEN, None).unwrap();
    Pool::new(Arc::new(HostSettings {
        root: root.to_path_buf(),
        spawner: None,
        hide: Vec::new(),
        token: BearerToken::new(TOKEN).unwrap(),
        sessions: Arc::new(move |id: &str| {
            ConfigSession::builder(client.clone(), id).poll_interval(Duration::from_secs(3600))
        }),
    }))
}

/// The next sessions, by sandbox id, accepted.
async fn sessions(gateway: &mut Gateway, count: usize) -> Vec<Session> {
    let mut sessions = Vec::new();
    for _ in 0..count {
        let session = gateway.session().await;
        session.accept().await;
        sessions.push(session);
    }
    sessions.sort_by(|a, b| a.hello.sandbox_id.cmp(&b.hello.sandbox_id));
    sessions
}

/// Waits until the session's stream from the supervisor ends.
async fn wait_ended(session: &mut Session) {
    for _ in 0..100 {
        match tokio::time::timeout(WAIT, session.inbound.message()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(_) => return,
            Err(_) => panic!("session of {} did not end", session.hello.sandbox_id),
        }
    }
    panic!("session of {} did not end", session.hello.sandbox_id);
}

async fn exec(session: &Session, gateway: &mut Gateway, channel_id: &str, script: &str) -> Relay {
    session
        .open(channel_id, exec_target(&["sh", "-c", script]))
        .await;
    let relay = gateway.relay().await;
    assert_eq!(relay.channel_id, channel_id);
    relay
}

#[tokio::test]
async fn assignments_start_and_stop_sandboxes_and_unassigned_processes_die() {
    // As the host is: orphans of sandbox processes come back to it.
    crate::sandbox_processes::become_subreaper().unwrap();
    let mut gateway = Gateway::start().await;
    let root = tempfile::tempdir().unwrap();
    let mut pool = pool(&gateway.url, root.path());

    pool.assign(["sb-a", "sb-b", "../escape", ""]);
    assert_eq!(pool.serving(), ["sb-a", "sb-b"]);
    let mut sessions = sessions(&mut gateway, 2).await;
    assert_eq!(sessions[0].hello.sandbox_id, "sb-a");
    assert_eq!(sessions[1].hello.sandbox_id, "sb-b");
    for id in ["sb-a", "sb-b"] {
        assert!(root.path().join(id).join(WORK_DIR).is_dir());
        assert!(root.path().join(id).join(SSH_HOST_KEY_FILE).is_file());
    }
    // The host key is reported in the hello.
    assert!(
        sessions[0]
            .hello
            .ssh_host_key_fingerprint
            .starts_with("SHA256:")
    );

    // In sb-a: a process, and a daemon that left the exec's process group.
    let mut relay_a = exec(
        &sessions[0],
        &mut gateway,
        "ch-a",
        "setsid sleep 1000 & echo $$ $!; exec sleep 1000",
    )
    .await;
    let pids_a = read_pids(&mut relay_a).await;
    assert_eq!(pids_a.len(), 2);
    let mut relay_b = exec(
        &sessions[1],
        &mut gateway,
        "ch-b",
        "echo $$; exec sleep 1000",
    )
    .await;
    let pids_b = read_pids(&mut relay_b).await;

    // sb-a leaves the assignment: its session ends, its processes die and
    // its directory goes; sb-b goes on.
    pool.assign(["sb-b"]);
    assert_eq!(pool.serving(), ["sb-b"]);
    wait_ended(&mut sessions[0]).await;
    for pid in &pids_a {
        wait_gone(*pid).await;
    }
    for _ in 0..100 {
        if !root.path().join("sb-a").exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!root.path().join("sb-a").exists());
    assert!(!process_gone(pids_b[0]));

    // Shutdown kills sb-b's process but keeps its files (and key).
    pool.shutdown().await;
    wait_gone(pids_b[0]).await;
    assert!(root.path().join("sb-b").join(SSH_HOST_KEY_FILE).is_file());
}

#[tokio::test]
async fn relays_outlive_the_sandbox_session_in_host_mode() {
    let mut gateway = Gateway::start().await;
    let root = tempfile::tempdir().unwrap();
    let mut pool = pool(&gateway.url, root.path());
    pool.assign(["sb-moving"]);
    let mut session = sessions(&mut gateway, 1).await.pop().unwrap();
    let mut relay = exec(
        &session,
        &mut gateway,
        "ch-1",
        "echo $$; read line; echo got $line",
    )
    .await;
    let pid = read_pids(&mut relay).await[0];

    // The session ends (the host's session moved); the sandbox session
    // comes back, and the process and its relay went on meanwhile.
    let first_key = session.hello.ssh_host_key_fingerprint.clone();
    drop(session);
    session = sessions(&mut gateway, 1).await.pop().unwrap();
    assert_eq!(session.hello.sandbox_id, "sb-moving");
    assert_eq!(session.hello.ssh_host_key_fingerprint, first_key);
    assert!(!process_gone(pid));
    relay
        .send(relay_frame::Payload::ExecInput(ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Stdin(b"hi\n".to_vec().into())),
        }))
        .await;
    let (output, code) = relay.exec_output().await;
    assert_eq!((output.as_str(), code), ("got hi\n", 0));

    // A relay of the old session is closed from the new one like any other.
    let mut relay = exec(&session, &mut gateway, "ch-2", "echo $$; exec sleep 1000").await;
    let pid = read_pids(&mut relay).await[0];
    drop(session);
    let session = sessions(&mut gateway, 1).await.pop().unwrap();
    assert!(!process_gone(pid));
    session
        .send(gateway_message::Payload::RelayClose(RelayClose {
            channel_id: "ch-2".into(),
            reason: "test".into(),
        }))
        .await;
    wait_gone(pid).await;
    pool.shutdown().await;
}
