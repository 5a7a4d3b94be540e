//! Sandbox logs and resuming watches through the SDK, against a real
//! 3-replica cluster behind its edge (`LocalCluster`, what `up` runs): the
//! lines a sandbox's supervisor records about execs, their filters, and a
//! watch that follows them while the sandbox's owner is killed and comes
//! back, resuming by itself without losing or repeating a line.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use openshell_sdk::testing::{LocalCluster, LocalClusterOptions};
use openshell_sdk::{
    CallOptions, Client, CreateSandbox, ExecRequest, LogQuery, WatchEvent, WatchOptions,
};
use openshell_testkit::bin;

async fn cluster() -> (LocalCluster, Client) {
    let cluster = LocalCluster::start(
        LocalClusterOptions::new()
            .isolation("none")
            .gateway_bin(bin("openshell-gateway")),
    )
    .await
    .unwrap();
    let client = cluster.client().await.unwrap();
    (cluster, client)
}

async fn ready(client: &Client) -> String {
    let sandboxes = client.sandboxes();
    let sandbox = sandboxes
        .create(CreateSandbox::new(), CallOptions::new())
        .await
        .unwrap();
    sandboxes
        .wait_ready(&sandbox.name, CallOptions::new())
        .await
        .unwrap();
    sandbox.name
}

async fn exit_with(client: &Client, sandbox: &str, code: i32) -> Result<i32, openshell_sdk::Error> {
    let script = format!("exit {code}");
    client
        .exec(
            ExecRequest::new(sandbox, ["sh", "-c", &script]),
            CallOptions::new().deadline(Duration::from_secs(20)),
        )
        .await
        .map(|out| out.exit_code)
}

#[tokio::test]
async fn logs_show_what_ran_in_a_sandbox_and_filter() {
    let (cluster, client) = cluster().await;
    let sandbox = ready(&client).await;
    assert_eq!(exit_with(&client, &sandbox, 7).await.unwrap(), 7);
    let sandboxes = client.sandboxes();
    let deadline = Instant::now() + Duration::from_secs(15);
    let lines = loop {
        let logs = sandboxes
            .logs(&sandbox, &LogQuery::new(), CallOptions::new())
            .await
            .unwrap();
        let finished = logs.lines.iter().any(|l| {
            l.message == "exec finished"
                && l.fields.get("exit_code").map(String::as_str) == Some("7")
        });
        if finished {
            break logs.lines;
        }
        assert!(Instant::now() < deadline, "no exec line: {:#?}", logs.lines);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(lines.iter().any(|l| l.source == "gateway"));
    let printed = lines
        .iter()
        .find(|l| l.message == "exec finished")
        .unwrap()
        .to_string();
    assert!(
        printed.contains(" INFO  sandbox exec finished"),
        "{printed}"
    );
    assert!(printed.contains("exit_code=7"), "{printed}");

    let only = sandboxes
        .logs(
            &sandbox,
            &LogQuery::new().source("sandbox").min_level("info").tail(1),
            CallOptions::new(),
        )
        .await
        .unwrap();
    assert_eq!(only.lines.len(), 1);
    assert_eq!(only.lines[0].source, "sandbox");
    assert!(only.buffer_total as usize >= lines.len());

    // A watch that follows logs is hinted to the owner; a status-only one
    // is not owner-routed. Fresh clients, so nothing else counts.
    let fresh = cluster.client().await.unwrap();
    let mut follow = fresh.sandboxes().events(
        &sandbox,
        WatchOptions::new().logs(LogQuery::new().tail(1)),
        CallOptions::new(),
    );
    tokio::time::timeout(Duration::from_secs(30), follow.next())
        .await
        .expect("no first event within 30 s")
        .unwrap()
        .unwrap();
    let stats = fresh.routing_stats();
    assert_eq!((stats.hinted, stats.owner_lookups), (1, 1), "{stats:?}");
    let fresh = cluster.client().await.unwrap();
    let mut status = fresh
        .sandboxes()
        .events(&sandbox, WatchOptions::new(), CallOptions::new());
    tokio::time::timeout(Duration::from_secs(30), status.next())
        .await
        .expect("no first event within 30 s")
        .unwrap()
        .unwrap();
    assert_eq!(
        fresh.routing_stats().hinted + fresh.routing_stats().unhinted,
        0
    );

    let err = sandboxes
        .logs(
            &sandbox,
            &LogQuery::new().min_level("LOUD"),
            CallOptions::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "invalid_argument", "{err}");
    let err = sandboxes
        .logs("no-such-sandbox", &LogQuery::new(), CallOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
    cluster.stop().await.unwrap();
}

/// Exit codes of the "exec finished" lines a watch delivered, by count.
fn finished_codes(events: &[WatchEvent]) -> BTreeMap<i32, usize> {
    let mut codes = BTreeMap::new();
    for event in events {
        if let WatchEvent::Log { line, .. } = event
            && line.message == "exec finished"
            && let Some(code) = line.fields.get("exit_code").and_then(|c| c.parse().ok())
        {
            *codes.entry(code).or_insert(0) += 1;
        }
    }
    codes
}

#[tokio::test]
async fn a_log_watch_resumes_by_itself_when_the_owner_dies() {
    let (cluster, client) = cluster().await;
    let sandbox = ready(&client).await;
    let mut watch = client.sandboxes().events(
        &sandbox,
        WatchOptions::new()
            .status(false)
            .logs(LogQuery::new().source("sandbox")),
        CallOptions::new(),
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let resumes = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let resumes_seen = resumes.clone();
    let reader = tokio::spawn(async move {
        while let Some(event) = watch.next().await {
            let failed = event.is_err();
            resumes_seen.store(watch.resumes(), std::sync::atomic::Ordering::Relaxed);
            let _ = tx.send(event);
            if failed {
                break;
            }
        }
    });

    // Execs exit with their own number, so each line names one exec.
    let mut completed = Vec::new();
    for code in 1..=12 {
        if let Ok(got) = exit_with(&client, &sandbox, code).await {
            assert_eq!(got, code);
            completed.push(code);
        }
    }
    let owner = cluster.owner_of(&sandbox).await.unwrap().expect("an owner");
    cluster.kill_replica(&owner).await.unwrap();
    for code in 13..=24 {
        if let Ok(got) = exit_with(&client, &sandbox, code).await {
            assert_eq!(got, code);
            completed.push(code);
        }
    }
    cluster.start_replica(&owner).await.unwrap();
    for code in 25..=36 {
        if let Ok(got) = exit_with(&client, &sandbox, code).await {
            assert_eq!(got, code);
            completed.push(code);
        }
    }
    assert!(
        completed.len() >= 30,
        "too few execs completed: {completed:?}"
    );

    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !completed
        .iter()
        .all(|code| finished_codes(&events).contains_key(code))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(Ok(event))) => events.push(event),
            Ok(Some(Err(err))) => panic!("the watch ended: {err}"),
            Ok(None) => panic!("the watch ended quietly"),
            Err(_) => panic!(
                "lines missing after 30 s: completed {completed:?}, seen {:?}",
                finished_codes(&events)
            ),
        }
    }
    // A little longer, so a line delivered twice would show.
    while let Ok(Some(Ok(event))) =
        tokio::time::timeout(Duration::from_millis(700), rx.recv()).await
    {
        events.push(event);
    }
    let codes = finished_codes(&events);
    let repeated: Vec<_> = codes.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.is_empty(), "lines delivered twice: {repeated:?}");
    let cursors: Vec<&str> = events.iter().map(WatchEvent::cursor).collect();
    assert!(
        cursors.windows(2).all(|w| w[0] <= w[1]),
        "cursors went back"
    );
    let resumed = resumes.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        resumed >= 1,
        "the watch never had to resume: the owner kill did not reach it"
    );
    eprintln!(
        "log watch across an owner kill: {} execs completed, each line seen once, 0 repeated, {resumed} resumes",
        completed.len()
    );
    reader.abort();
    cluster.stop().await.unwrap();
}
