//! The curated sandbox calls against the real gateway: health, create (named
//! and server-generated; image, template, environment, command, labels), get,
//! list over every page, delete, wait_ready, wait_deleted and watch.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use openshell_sdk::proto::SandboxTemplate;
use openshell_sdk::{
    CallOptions, CreateSandbox, DeletionOutcome, ExecRequest, ListSandboxes, SandboxPhase,
    ServiceStatus,
};

#[tokio::test]
async fn health_reports_status_version_and_the_serving_replica() {
    let gw = start();
    let client = client(&gw).await;
    let health = within(10, "health", client.health(CallOptions::new()))
        .await
        .expect("health");
    assert_eq!(health.status, ServiceStatus::Healthy);
    assert!(!health.version.is_empty());
    assert_eq!(health.served_by.as_deref(), Some(REPLICA));

    // Health needs no token.
    let anonymous = client_with_token(&gw, None).await;
    let health = within(10, "health", anonymous.health(CallOptions::new()))
        .await
        .expect("anonymous health");
    assert_eq!(health.served_by.as_deref(), Some(REPLICA));
}

#[tokio::test]
async fn create_named_with_everything_then_get_and_exec_sees_the_environment() {
    let gw = start();
    let client = client(&gw).await;
    let sandboxes = client.sandboxes();

    let template = SandboxTemplate {
        image: "registry.example/tools:1".into(),
        environment: [("FROM_TEMPLATE".to_owned(), "tmpl".to_owned())].into(),
        ..Default::default()
    };
    let created = within(
        10,
        "create",
        sandboxes.create(
            CreateSandbox::new()
                .name("alpha")
                .template(template)
                .env("GREETING", "hello")
                .command(["sleep", "infinity"])
                .label("team", "a")
                .label("tier", "test"),
            CallOptions::new(),
        ),
    )
    .await
    .expect("create");
    assert_eq!(created.name, "alpha");
    assert!(!created.id.is_empty());
    assert_eq!(created.labels.get("team").map(String::as_str), Some("a"));
    assert_eq!(created.labels.get("tier").map(String::as_str), Some("test"));
    assert!(
        matches!(
            created.phase,
            SandboxPhase::Provisioning | SandboxPhase::Ready
        ),
        "{:?}",
        created.phase
    );

    let ready = within(
        40,
        "wait_ready",
        sandboxes.wait_ready("alpha", CallOptions::new()),
    )
    .await
    .expect("ready");
    assert!(ready.is_ready());
    assert_eq!(ready.id, created.id);

    let got = within(10, "get", sandboxes.get("alpha", CallOptions::new()))
        .await
        .expect("get");
    assert_eq!(got.id, created.id);
    assert_eq!(got.phase, SandboxPhase::Ready);
    assert!(got.resource_version > created.resource_version);
    assert_eq!(got.labels, created.labels);
    let spec = got.proto.spec.as_ref().expect("spec");
    assert_eq!(spec.command, vec!["sleep", "infinity"]);
    let template = spec.template.as_ref().expect("template");
    assert_eq!(template.image, "registry.example/tools:1");
    assert_eq!(spec.environment.get("GREETING").unwrap(), "hello");

    // Template and sandbox environment reach exec'd processes.
    let out = within(
        30,
        "exec",
        client.exec(
            ExecRequest::new(
                "alpha",
                [
                    "sh",
                    "-c",
                    "printf '%s/%s' \"$FROM_TEMPLATE\" \"$GREETING\"",
                ],
            ),
            CallOptions::new(),
        ),
    )
    .await
    .expect("exec");
    assert_eq!(out.stdout_text(), "tmpl/hello");

    // The image shortcut sets the template image.
    let imaged = within(
        10,
        "create",
        sandboxes.create(
            CreateSandbox::new().name("beta").image("alpine:3"),
            CallOptions::new(),
        ),
    )
    .await
    .expect("create with image");
    let image = imaged
        .proto
        .spec
        .as_ref()
        .and_then(|s| s.template.as_ref())
        .map(|t| t.image.clone());
    assert_eq!(image.as_deref(), Some("alpine:3"));

    // A second create with the same name is refused.
    let err = within(
        10,
        "create",
        sandboxes.create(CreateSandbox::new().name("alpha"), CallOptions::new()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "already_exists", "{err}");
    assert_eq!(err.served_by(), Some(REPLICA));
}

#[tokio::test]
async fn create_without_a_name_gets_a_server_generated_one() {
    let gw = start();
    let client = client(&gw).await;
    let sandboxes = client.sandboxes();
    let created = within(
        10,
        "create",
        sandboxes.create(
            CreateSandbox::new().label("kind", "generated"),
            CallOptions::new(),
        ),
    )
    .await
    .expect("create");
    assert!(created.name.starts_with("sandbox-"), "{}", created.name);
    let ready = within(
        40,
        "wait_ready",
        sandboxes.wait_ready(&created.name, CallOptions::new()),
    )
    .await
    .expect("ready");
    assert_eq!(ready.id, created.id);
    let got = within(10, "get", sandboxes.get(&created.name, CallOptions::new()))
        .await
        .expect("get");
    assert_eq!(
        got.labels.get("kind").map(String::as_str),
        Some("generated")
    );
}

#[tokio::test]
async fn list_follows_every_page() {
    let gw = start();
    let client = client(&gw).await;
    let sandboxes = client.sandboxes();
    // 7 sandboxes, 5 of them labelled; pages of 2.
    let mut expected = BTreeSet::new();
    for i in 0..7 {
        let name = format!("page-{i}");
        let mut request = CreateSandbox::new().name(&name);
        if i % 3 != 0 {
            request = request.label("group", "listed");
        }
        within(10, "create", sandboxes.create(request, CallOptions::new()))
            .await
            .expect("create");
        expected.insert(name);
    }

    let all = within(
        20,
        "list",
        sandboxes.list(
            ListSandboxes {
                page_size: Some(2),
                ..Default::default()
            },
            CallOptions::new(),
        ),
    )
    .await
    .expect("list");
    let names: Vec<String> = all.iter().map(|s| s.name.clone()).collect();
    let unique: BTreeSet<String> = names.iter().cloned().collect();
    assert_eq!(
        names.len(),
        unique.len(),
        "a sandbox listed twice: {names:?}"
    );
    assert_eq!(unique, expected);

    let labelled = within(
        20,
        "list",
        sandboxes.list(
            ListSandboxes {
                page_size: Some(2),
                label_selector: Some("group=listed".into()),
            },
            CallOptions::new(),
        ),
    )
    .await
    .expect("list with selector");
    let names: BTreeSet<String> = labelled.iter().map(|s| s.name.clone()).collect();
    let want: BTreeSet<String> = [1, 2, 4, 5].iter().map(|i| format!("page-{i}")).collect();
    assert_eq!(names, want);
    assert_eq!(labelled.len(), 4);

    // Page size 1 and the server default agree with pages of 2.
    for page_size in [Some(1), None] {
        let listed = within(
            20,
            "list",
            sandboxes.list(
                ListSandboxes {
                    page_size,
                    ..Default::default()
                },
                CallOptions::new(),
            ),
        )
        .await
        .expect("list");
        assert_eq!(listed.len(), 7, "page size {page_size:?}");
    }

    // The gateway really answered more than one page per listing.
    let pages = gw
        .metric(r#"openshell_server_requests_total{method="ListSandboxes",code="ok"}"#)
        .unwrap_or(0.0);
    // 4 pages of 2 + 2 pages of 2 (4 labelled) + 7 pages of 1 + 1 default page.
    assert!(pages >= 4.0 + 2.0 + 7.0 + 1.0, "ListSandboxes ok = {pages}");
}

#[tokio::test]
async fn delete_then_wait_deleted_and_not_found_afterwards() {
    let gw = start();
    let client = client(&gw).await;
    let sandboxes = client.sandboxes();
    let ready = create_ready(&client, "doomed").await;
    let supervisors = gw.supervisor_pids();
    assert_eq!(supervisors.len(), 1);

    let outcome = within(10, "delete", sandboxes.delete("doomed", CallOptions::new()))
        .await
        .expect("delete");
    assert_eq!(outcome, DeletionOutcome::Completed);
    within(
        20,
        "wait_deleted",
        sandboxes.wait_deleted("doomed", CallOptions::new()),
    )
    .await
    .expect("wait_deleted");

    let err = within(10, "get", sandboxes.get("doomed", CallOptions::new()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
    assert_eq!(err.served_by(), Some(REPLICA));
    let err = within(10, "delete", sandboxes.delete("doomed", CallOptions::new()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
    // wait_deleted of a sandbox that does not exist returns at once.
    within(
        10,
        "wait_deleted",
        sandboxes.wait_deleted("never-existed", CallOptions::new()),
    )
    .await
    .expect("wait_deleted of a missing sandbox");
    // wait_ready of a missing sandbox fails with not_found.
    let err = within(
        10,
        "wait_ready",
        sandboxes.wait_ready("never-existed", CallOptions::new()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
    // The supervisor is gone with the sandbox.
    assert!(
        openshell_testkit::eventually(Duration::from_secs(10), || {
            supervisors
                .iter()
                .all(|pid| !openshell_testkit::is_running(*pid))
        })
        .await,
        "supervisor of {} survived its deletion",
        ready.id
    );
}

#[tokio::test]
async fn watch_streams_the_snapshot_then_changes_until_deletion() {
    let gw = start();
    let client = client(&gw).await;
    let sandboxes = client.sandboxes();
    within(
        10,
        "create",
        sandboxes.create(CreateSandbox::new().name("watched"), CallOptions::new()),
    )
    .await
    .expect("create");
    let mut watch = within(10, "watch", sandboxes.watch("watched", CallOptions::new()))
        .await
        .expect("watch");

    // Snapshots until READY, resource versions increasing.
    let mut last_version = 0;
    loop {
        let sandbox = within(30, "watch event", watch.next())
            .await
            .expect("watch ended early")
            .expect("watch event");
        assert_eq!(sandbox.name, "watched");
        assert!(sandbox.resource_version > last_version);
        last_version = sandbox.resource_version;
        if sandbox.phase == SandboxPhase::Ready {
            break;
        }
        assert_eq!(sandbox.phase, SandboxPhase::Provisioning);
    }

    // Delete from another clone; the watch shows DELETING, then not_found.
    let deleter = client.clone();
    within(
        10,
        "delete",
        deleter.sandboxes().delete("watched", CallOptions::new()),
    )
    .await
    .expect("delete");
    let mut saw_deleting = false;
    let end = loop {
        match within(20, "watch event", watch.next()).await {
            Some(Ok(sandbox)) => {
                assert_eq!(sandbox.phase, SandboxPhase::Deleting);
                saw_deleting = true;
            }
            Some(Err(err)) => break err,
            None => panic!("watch ended without reporting the deletion"),
        }
    };
    assert!(saw_deleting);
    assert_eq!(end.code(), "not_found", "{end}");
    assert!(within(5, "watch end", watch.next()).await.is_none());
    // And keeps ending: a finished watch may be polled again.
    assert!(within(5, "watch end", watch.next()).await.is_none());
}

#[tokio::test]
async fn a_watch_ends_with_deadline_exceeded_or_cancelled() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "quiet").await;
    let started = std::time::Instant::now();
    let mut watch = client
        .sandboxes()
        .watch(
            "quiet",
            CallOptions::new().deadline(Duration::from_millis(800)),
        )
        .await
        .expect("watch");
    let first = within(10, "snapshot", watch.next())
        .await
        .expect("snapshot")
        .expect("snapshot");
    assert!(first.is_ready());
    let err = within(10, "watch end", watch.next())
        .await
        .expect("an error, not the end of the stream")
        .unwrap_err();
    assert_eq!(err.code(), "deadline_exceeded", "{err}");
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert!(started.elapsed() < Duration::from_secs(8));

    // A cancellation token ends a watch with `cancelled`.
    let token = openshell_sdk::CancellationToken::new();
    let mut watch = client
        .sandboxes()
        .watch("quiet", CallOptions::new().cancel_token(token.clone()))
        .await
        .expect("watch");
    within(10, "snapshot", watch.next())
        .await
        .expect("snapshot")
        .expect("snapshot");
    token.cancel();
    let err = within(10, "watch end", watch.next())
        .await
        .expect("an error, not the end of the stream")
        .unwrap_err();
    assert_eq!(err.code(), "cancelled", "{err}");
    assert!(within(5, "watch end", watch.next()).await.is_none());

    // A deadline bounds wait_ready too (here it passes: the sandbox is ready).
    let ready = within(
        10,
        "wait_ready",
        client
            .sandboxes()
            .wait_ready("quiet", CallOptions::new().deadline(Duration::from_secs(5))),
    )
    .await
    .expect("ready");
    assert!(ready.is_ready());
}
