//! Restart safety: sandboxes survive a gateway restart, supervisors come
//! back, and a stream running at shutdown ends with UNAVAILABLE.

mod common;

use std::time::Duration;

use common::*;
use openshell_proto::*;
use openshell_testkit::is_running;

#[tokio::test]
async fn restart_keeps_sandboxes_and_ends_running_execs_with_unavailable() {
    let mut gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "keeper").await;
    sh(&mut client, "keeper", "echo kept > state.txt").await;
    let supervisor = gw.supervisor_pids()[0];

    let mut running = client
        .exec_sandbox(exec_request("keeper", &["sh", "-c", "echo up; sleep 60"]))
        .await
        .unwrap()
        .into_inner();
    assert!(running.message().await.unwrap().is_some());

    let stopper = std::thread::spawn(move || {
        gw.stop();
        gw
    });
    let ended = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match running.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    })
    .await
    .expect("the running exec ended when the gateway stopped");
    let status = ended.expect("ended with an error, not a silent success");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let mut gw = stopper.join().unwrap();

    // The supervisor outlives the gateway and reconnects to the new one.
    assert!(is_running(supervisor));
    gw.restart();
    let mut client = common::client(&gw).await;
    wait_phase(&mut client, "keeper", SandboxPhase::Ready).await;
    assert_eq!(gw.supervisor_pids(), vec![supervisor]);
    assert_eq!(
        sh(&mut client, "keeper", "cat state.txt")
            .await
            .stdout_text(),
        "kept\n"
    );
}

#[tokio::test]
async fn a_crashed_gateway_recovers_its_sandboxes() {
    let mut gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "crash-a").await;
    create_ready(&mut client, "crash-b").await;
    gw.kill();
    gw.restart();
    let mut client = common::client(&gw).await;
    for name in ["crash-a", "crash-b"] {
        wait_phase(&mut client, name, SandboxPhase::Ready).await;
        let back = sh(&mut client, name, "echo back").await;
        assert_eq!(back.stdout_text(), "back\n", "{name}: {back:?}");
    }
}

/// A data directory of an earlier release (the store as `gateway.db` at the
/// top, beside `sandboxes/<id>` with its pid file) is moved into place on
/// start with nothing lost; a supervisor started without isolation is
/// replaced by an isolated one when the gateway now isolates.
#[tokio::test]
async fn an_earlier_data_layout_is_migrated_and_supervisors_come_back_isolated() {
    let mut gw = openshell_testkit::Gateway::start(openshell_testkit::GatewayOptions {
        extra_args: vec!["--isolation".into(), "none".into()],
        ..openshell_testkit::GatewayOptions::with_token(TOKEN)
    });
    let mut client = client(&gw).await;
    create_ready(&mut client, "mover").await;
    sh(&mut client, "mover", "echo kept > state.txt").await;
    let before = gw.supervisor_pids();
    assert_eq!(before.len(), 1);
    drop(client);
    gw.stop();

    // Lay out the earlier release's data directory by hand.
    let data = gw.store_dir();
    for suffix in ["", "-wal", "-shm"] {
        let from = data.join(format!("store/gateway.db{suffix}"));
        if from.exists() {
            std::fs::rename(&from, data.join(format!("gateway.db{suffix}"))).unwrap();
        }
    }
    std::fs::remove_dir(data.join("store")).unwrap();
    assert!(data.join("gateway.db").exists());

    gw.set_extra_args(vec!["--isolation".into(), "namespaces".into()]);
    gw.restart();
    assert!(data.join("store/gateway.db").exists(), "{}", gw.log());
    assert!(!data.join("gateway.db").exists());
    let mut client = common::client(&gw).await;
    wait_phase(&mut client, "mover", SandboxPhase::Ready).await;
    let after = gw.supervisor_pids();
    assert_eq!(after.len(), 1);
    assert_ne!(after, before, "the unisolated supervisor was kept");
    assert!(!is_running(before[0]));
    let out = sh(&mut client, "mover", "cat state.txt; id -u").await;
    assert_eq!(out.stdout_text(), "kept\n1000\n");
}

/// An explicit `--database-url sqlite://PATH` is the operator's choice: it
/// is never moved, even when it names the old place.
#[tokio::test]
async fn an_explicit_sqlite_path_is_never_moved() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let db = data.join("gateway.db");
    let gw = openshell_testkit::Gateway::start(openshell_testkit::GatewayOptions {
        data_dir: Some(data.clone()),
        database_url: Some(format!("sqlite://{}", db.display())),
        ..openshell_testkit::GatewayOptions::with_token(TOKEN)
    });
    let mut client = client(&gw).await;
    create_ready(&mut client, "stays").await;
    assert!(db.exists());
    assert!(!data.join("store/gateway.db").exists());
}
