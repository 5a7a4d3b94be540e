//! The hidden test and benchmark driver (`serve --driver none`): a sandbox
//! gets its record, its directory and a token file (mode 0600) but no
//! supervisor process; it stays PROVISIONING until a session with that token
//! arrives, and deleting it removes the directory.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use openshell_proto::*;
use openshell_testkit::{Gateway, GatewayOptions};

#[tokio::test]
async fn driver_none_writes_a_private_token_and_starts_no_supervisor() {
    let gw = Gateway::start(GatewayOptions {
        extra_args: ["--allow-test-flags", "--driver", "none"]
            .map(String::from)
            .to_vec(),
        ..GatewayOptions::with_token(TOKEN)
    });
    let mut client = client(&gw).await;
    let sandbox = client
        .create_sandbox(CreateSandboxRequest {
            name: "recordonly".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(phase(&sandbox), SandboxPhase::Provisioning);
    let id = sandbox.metadata.unwrap().id;
    let dir = gw.store_dir().join("sandboxes").join(&id);
    let token_file = dir.join("token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "token file mode {mode:o}");
    assert!(!dir.join("supervisor.pid").exists());
    assert!(gw.supervisor_pids().is_empty());
    // Nothing connects on its own: no process was started that could (no
    // PID file, no supervisor above; waiting would prove no more), and the
    // gateway holds no session until the one below.
    assert_eq!(gw.metric("openshell_server_supervisor_sessions"), Some(0.0));
    let got = client
        .get_sandbox(GetSandboxRequest {
            name: "recordonly".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(phase(&got), SandboxPhase::Provisioning);

    // A session on the file's token makes it READY.
    let token = std::fs::read_to_string(&token_file).unwrap();
    let mut supervisor = client_with(&gw, Some(&token)).await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(SupervisorMessage {
        payload: Some(supervisor_message::Payload::Hello(SupervisorHello {
            sandbox_id: id.clone(),
            instance_id: "driver-none-test".into(),
            connection_epoch: 1,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut session = supervisor
        .connect_supervisor(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("session with the token from the file")
        .into_inner();
    let first = session.message().await.unwrap().unwrap();
    assert!(
        matches!(
            first.payload,
            Some(gateway_message::Payload::SessionAccepted(_))
        ),
        "{first:?}"
    );
    wait_phase(&mut client, "recordonly", SandboxPhase::Ready).await;
    assert_eq!(gw.metric("openshell_server_supervisor_sessions"), Some(1.0));
    drop(tx);

    client
        .delete_sandbox(DeleteSandboxRequest {
            name: "recordonly".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!dir.exists(), "the sandbox directory outlived the sandbox");
}
