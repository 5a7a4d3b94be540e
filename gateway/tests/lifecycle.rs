//! Sandbox lifecycle against the real gateway and supervisors: health,
//! create/get/list/delete, watch, served-by metadata and metrics.

mod common;

use std::time::Duration;

use common::*;
use openshell_proto::*;
use openshell_testkit::{eventually, is_running};

#[tokio::test]
async fn health_answers_without_a_token_and_names_the_replica() {
    let gw = start();
    let mut anonymous = client_with(&gw, None).await;
    let response = anonymous.health(HealthRequest {}).await.expect("health");
    assert_eq!(
        response.metadata().get("x-openshell-served-by").unwrap(),
        "gw-0"
    );
    assert_eq!(response.get_ref().status(), ServiceStatus::Healthy);
    assert!(!response.get_ref().version.is_empty());
}

#[tokio::test]
async fn create_get_list_delete_round_trip() {
    let gw = start();
    let mut client = client(&gw).await;
    let created = client
        .create_sandbox(CreateSandboxRequest {
            name: "alpha".into(),
            labels: [("team".to_owned(), "a".to_owned())].into(),
            spec: Some(SandboxSpec {
                environment: [("GREETING".to_owned(), "hello".to_owned())].into(),
                template: Some(SandboxTemplate {
                    image: "process".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("create")
        .into_inner()
        .sandbox
        .unwrap();
    let meta = created.metadata.as_ref().unwrap();
    assert_eq!(meta.name, "alpha");
    assert!(!meta.id.is_empty());
    assert!(meta.created_time.is_some());

    let ready = wait_phase(&mut client, "alpha", SandboxPhase::Ready).await;
    assert_eq!(ready.metadata.as_ref().unwrap().id, meta.id);

    // Sandbox environment reaches exec'd processes.
    let out = sh(&mut client, "alpha", "printf %s \"$GREETING\"").await;
    assert_eq!(out.stdout_text(), "hello");

    // A server-generated name.
    let generated = client
        .create_sandbox(CreateSandboxRequest {
            labels: [("team".to_owned(), "b".to_owned())].into(),
            ..Default::default()
        })
        .await
        .expect("create unnamed")
        .into_inner()
        .sandbox
        .unwrap();
    let generated_name = generated.metadata.unwrap().name;
    assert!(generated_name.starts_with("sandbox-"), "{generated_name}");

    let got = client
        .get_sandbox(GetSandboxRequest {
            name: "alpha".into(),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(got.metadata.unwrap().labels.get("team").unwrap(), "a");

    let selected = client
        .list_sandboxes(ListSandboxesRequest {
            label_selector: "team=b".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(selected.sandboxes.len(), 1);
    assert_eq!(
        selected.sandboxes[0].metadata.as_ref().unwrap().name,
        generated_name
    );

    let deleted = client
        .delete_sandbox(DeleteSandboxRequest {
            name: "alpha".into(),
            ..Default::default()
        })
        .await
        .expect("delete")
        .into_inner();
    assert_eq!(deleted.outcome(), DeletionOutcome::Completed);
    assert_eq!(deleted.sandbox_id, meta.id);
    let missing = client
        .get_sandbox(GetSandboxRequest {
            name: "alpha".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let again = client
        .delete_sandbox(DeleteSandboxRequest {
            name: "alpha".into(),
            allow_missing: true,
            ..Default::default()
        })
        .await
        .expect("delete allow_missing")
        .into_inner();
    assert_eq!(again.outcome(), DeletionOutcome::AlreadyAbsent);
}

#[tokio::test]
async fn list_pages_through_every_sandbox() {
    let gw = start();
    let mut client = client(&gw).await;
    for i in 0..7 {
        client
            .create_sandbox(CreateSandboxRequest {
                name: format!("page-{i}"),
                ..Default::default()
            })
            .await
            .expect("create");
    }
    let mut names = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = client
            .list_sandboxes(ListSandboxesRequest {
                page_size: 3,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        assert!(page.sandboxes.len() <= 3);
        names.extend(page.sandboxes.into_iter().map(|s| s.metadata.unwrap().name));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    let want: Vec<String> = (0..7).map(|i| format!("page-{i}")).collect();
    assert_eq!(names, want);
}

#[tokio::test]
async fn watch_starts_with_a_snapshot_and_ends_when_deleted() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "watched").await;

    // Without follow_status: one snapshot, then the stream ends.
    let mut once = client
        .watch_sandbox(WatchSandboxRequest {
            sandbox: "watched".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = once.message().await.unwrap().unwrap();
    assert!(matches!(
        first.payload,
        Some(sandbox_stream_event::Payload::Sandbox(_))
    ));
    assert!(once.message().await.unwrap().is_none());

    let mut follow = client
        .watch_sandbox(WatchSandboxRequest {
            sandbox: "watched".into(),
            follow_status: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let snapshot = follow.message().await.unwrap().unwrap();
    match snapshot.payload {
        Some(sandbox_stream_event::Payload::Sandbox(s)) => {
            assert_eq!(phase(&s), SandboxPhase::Ready)
        }
        other => panic!("first event is not a snapshot: {other:?}"),
    }
    client
        .delete_sandbox(DeleteSandboxRequest {
            name: "watched".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut saw_deleting = false;
    let end = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match follow.message().await {
                Ok(Some(event)) => {
                    if let Some(sandbox_stream_event::Payload::Sandbox(s)) = event.payload {
                        saw_deleting |= phase(&s) == SandboxPhase::Deleting;
                    }
                }
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    })
    .await
    .expect("watch ended");
    assert!(saw_deleting);
    assert_eq!(
        end.expect("ends with a status").code(),
        tonic::Code::NotFound
    );
}

#[tokio::test]
async fn delete_stops_the_supervisor_and_its_processes() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "doomed").await;
    let supervisors = gw.supervisor_pids();
    assert_eq!(supervisors.len(), 1);
    // A process left running in the background after its exec returned,
    // found by a marker (a pid the sandbox reports is its namespace's).
    let marker = openshell_testkit::marker();
    let script = format!("TEST_MARKER={marker} sleep 300 >/dev/null 2>&1 & echo started");
    sh(&mut client, "doomed", &script).await;
    let sleepers = openshell_testkit::pids_with_env("TEST_MARKER", &marker);
    assert_eq!(sleepers.len(), 1, "{sleepers:?}");
    let sleeper = sleepers[0];
    assert!(is_running(sleeper));
    client
        .delete_sandbox(DeleteSandboxRequest {
            name: "doomed".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!is_running(supervisors[0]), "supervisor still running");
    assert!(
        eventually(Duration::from_secs(5), || !is_running(sleeper)).await,
        "sandbox process still running after delete"
    );
    assert!(gw.supervisor_pids().is_empty());
}

#[tokio::test]
async fn every_answer_names_the_replica_and_metrics_count_it() {
    let gw = start();
    let mut client = client(&gw).await;
    let err = client
        .get_sandbox(GetSandboxRequest {
            name: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert_eq!(err.metadata().get("x-openshell-served-by").unwrap(), "gw-0");

    let mut wrong = client_with(&gw, Some("wrong-token")).await;
    let err = wrong
        .list_sandboxes(ListSandboxesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert_eq!(err.metadata().get("x-openshell-served-by").unwrap(), "gw-0");

    create_ready(&mut client, "counted").await;
    let stream = client
        .exec_sandbox(exec_request("counted", &["true"]))
        .await
        .unwrap();
    assert_eq!(
        stream.metadata().get("x-openshell-served-by").unwrap(),
        "gw-0"
    );
    collect(stream.into_inner()).await.unwrap();

    let metrics = gw.metrics();
    assert_eq!(
        openshell_testkit::metric_value(&metrics, "openshell_server_supervisor_sessions"),
        Some(1.0),
        "{metrics}"
    );
    for sample in [
        r#"openshell_server_requests_total{method="GetSandbox",code="not_found"}"#,
        r#"openshell_server_requests_total{method="ListSandboxes",code="unauthenticated"}"#,
        r#"openshell_server_requests_total{method="ExecSandbox",code="ok"}"#,
        r#"openshell_server_relays_opened_total{kind="exec"}"#,
    ] {
        let value = openshell_testkit::metric_value(&metrics, sample);
        assert!(
            value.is_some_and(|v| v >= 1.0),
            "{sample} missing in\n{metrics}"
        );
    }
}

/// A supervisor that cannot reach the gateway (here: the URL it was given
/// refuses connections) says why in its sandbox's status, not only in its
/// own log; the sandbox stays PROVISIONING.
#[tokio::test]
async fn a_supervisor_that_cannot_connect_shows_why_in_the_status() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let gw = openshell_testkit::Gateway::start(openshell_testkit::GatewayOptions {
        extra_args: vec![
            "--supervisor-url".into(),
            format!("http://127.0.0.1:{port}"),
        ],
        ..openshell_testkit::GatewayOptions::with_token(TOKEN)
    });
    let mut client = client(&gw).await;
    client
        .create_sandbox(CreateSandboxRequest {
            name: "stranded".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let ready = loop {
        let sandbox = client
            .get_sandbox(GetSandboxRequest {
                name: "stranded".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .sandbox
            .unwrap();
        let status = sandbox.status.clone().unwrap_or_default();
        let ready = status
            .conditions
            .iter()
            .find(|c| c.r#type == "Ready")
            .cloned();
        if let Some(ready) = ready.filter(|c| c.reason == "SupervisorCannotConnect") {
            assert_eq!(phase(&sandbox), SandboxPhase::Provisioning);
            break ready;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no reason in the status: {status:?}\n{}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(ready.status, "False");
    assert!(
        ready
            .message
            .starts_with("the supervisor cannot reach the gateway: ")
            && ready.message.len() > "the supervisor cannot reach the gateway: ".len(),
        "{}",
        ready.message
    );
    assert!(!ready.message.contains(TOKEN));
}
