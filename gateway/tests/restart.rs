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
        assert_eq!(
            sh(&mut client, name, "echo back").await.stdout_text(),
            "back\n"
        );
    }
}
