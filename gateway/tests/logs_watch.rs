//! Sandbox logs and resumable watches on real gateways: the lines a
//! gateway and a supervisor record about a sandbox, their filters and bad
//! input, and `WatchSandbox` cursors that let a watcher on any replica
//! resume after a replica died or restarted without losing or repeating
//! an event, or be told (OUT_OF_RANGE) when what it missed is gone.

mod common;

use std::time::{Duration, Instant};

use common::*;
use openshell_proto::*;
use openshell_testkit::cluster::{ClusterOptions, Postgres, TestCluster};
use openshell_testkit::{Gateway, GatewayOptions, sandbox_token};
use tonic::Code;

fn id_of(sandbox: &Sandbox) -> String {
    sandbox.metadata.as_ref().unwrap().id.clone()
}

async fn logs(
    client: &mut Client,
    req: GetSandboxLogsRequest,
) -> Result<GetSandboxLogsResponse, tonic::Status> {
    client.get_sandbox_logs(req).await.map(|r| r.into_inner())
}

fn logs_of(name: &str) -> GetSandboxLogsRequest {
    GetSandboxLogsRequest {
        sandbox: name.into(),
        ..Default::default()
    }
}

/// Pushes `lines` as the sandbox's supervisor would.
async fn push(
    client: &mut Client,
    sandbox_id: &str,
    lines: Vec<SandboxLogLine>,
) -> Result<(), tonic::Status> {
    let message = PushSandboxLogsRequest {
        sandbox_id: sandbox_id.into(),
        logs: lines,
        ..Default::default()
    };
    push_message(client, message).await
}

async fn push_message(
    client: &mut Client,
    message: PushSandboxLogsRequest,
) -> Result<(), tonic::Status> {
    client
        .push_sandbox_logs(tokio_stream::iter(vec![message]))
        .await
        .map(|_| ())
}

fn line(message: &str) -> SandboxLogLine {
    SandboxLogLine {
        level: "INFO".into(),
        message: message.into(),
        ..Default::default()
    }
}

/// Waits (bounded) until the sandbox's logs satisfy `done`.
async fn logs_until(
    client: &mut Client,
    name: &str,
    done: impl Fn(&[SandboxLogLine]) -> bool,
) -> Vec<SandboxLogLine> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let got = logs(client, logs_of(name))
            .await
            .expect("GetSandboxLogs")
            .logs;
        if done(&got) {
            return got;
        }
        assert!(Instant::now() < deadline, "logs never got there: {got:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_sandbox_records_gateway_and_supervisor_lines() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "logged").await;
    let result = sh(&mut client, "logged", "exit 3").await;
    assert_eq!(result.exit_code, Some(3));
    let all = logs_until(&mut client, "logged", |lines| {
        lines.iter().any(|l| {
            l.message == "exec finished"
                && l.fields.get("exit_code").map(String::as_str) == Some("3")
        })
    })
    .await;
    let gateway: Vec<&str> = all
        .iter()
        .filter(|l| l.source == "gateway")
        .map(|l| l.message.as_str())
        .collect();
    assert!(
        gateway.iter().any(|m| m.starts_with("sandbox created")),
        "{gateway:?}"
    );
    assert!(
        gateway.contains(&"supervisor session accepted"),
        "{gateway:?}"
    );
    assert!(
        all.iter()
            .any(|l| l.source == "sandbox" && l.message == "exec started")
    );
    assert!(
        all.iter()
            .all(|l| l.event_time.is_some() && !l.level.is_empty())
    );

    let sandbox_only = logs(
        &mut client,
        GetSandboxLogsRequest {
            sources: vec!["sandbox".into()],
            ..logs_of("logged")
        },
    )
    .await
    .unwrap();
    assert!(!sandbox_only.logs.is_empty());
    assert!(sandbox_only.logs.iter().all(|l| l.source == "sandbox"));
    assert!(sandbox_only.buffer_total as usize >= all.len());

    let warnings = logs(
        &mut client,
        GetSandboxLogsRequest {
            min_level: "warn".into(),
            ..logs_of("logged")
        },
    )
    .await
    .unwrap();
    assert!(
        warnings
            .logs
            .iter()
            .all(|l| l.level == "WARN" || l.level == "ERROR")
    );

    let newest = logs(
        &mut client,
        GetSandboxLogsRequest {
            lines: 1,
            ..logs_of("logged")
        },
    )
    .await
    .unwrap();
    assert_eq!(newest.logs.len(), 1);
    let last = logs(&mut client, logs_of("logged")).await.unwrap().logs;
    assert_eq!(newest.logs[0], *last.last().unwrap());

    let future_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        + 3_600_000;
    let none = logs(
        &mut client,
        GetSandboxLogsRequest {
            since_ms: future_ms,
            ..logs_of("logged")
        },
    )
    .await
    .unwrap();
    assert!(none.logs.is_empty());
}

#[tokio::test]
async fn bad_log_requests_are_refused_and_change_nothing() {
    let gw = start();
    let mut client = client(&gw).await;
    let a = create_ready(&mut client, "mine").await;
    let b = create_ready(&mut client, "theirs").await;
    for (req, code) in [
        (
            GetSandboxLogsRequest {
                sources: vec!["kernel".into()],
                ..logs_of("mine")
            },
            Code::InvalidArgument,
        ),
        (
            GetSandboxLogsRequest {
                min_level: "LOUD".into(),
                ..logs_of("mine")
            },
            Code::InvalidArgument,
        ),
        (
            GetSandboxLogsRequest {
                since_ms: -5,
                ..logs_of("mine")
            },
            Code::InvalidArgument,
        ),
        (logs_of("Not A Name"), Code::InvalidArgument),
        (logs_of("missing"), Code::NotFound),
    ] {
        let err = logs(&mut client, req.clone()).await.unwrap_err();
        assert_eq!(err.code(), code, "{req:?}: {err:?}");
    }

    // A user token is not a supervisor's.
    let err = push(&mut client, &id_of(&a), vec![line("forged")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    // A sandbox's token pushes for that sandbox only.
    let token_a = sandbox_token(&gw.store_dir(), &id_of(&a)).expect("token of sandbox A");
    let mut as_a = client_with(&gw, Some(&token_a)).await;
    let err = push(&mut as_a, &id_of(&b), vec![line("into another sandbox")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let too_many = (0..1001).map(|i| line(&format!("flood {i}"))).collect();
    let err = push(&mut as_a, &id_of(&a), too_many).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let of_b = logs(&mut client, logs_of("theirs")).await.unwrap().logs;
    assert!(of_b.iter().all(|l| l.message != "into another sandbox"));
    let of_a = logs(&mut client, logs_of("mine")).await.unwrap().logs;
    assert!(of_a.iter().all(|l| !l.message.starts_with("flood")));

    // A supervisor cannot pass its lines off as the gateway's.
    let forged = SandboxLogLine {
        source: "gateway".into(),
        sandbox_id: id_of(&b),
        ..line("pretending")
    };
    push(&mut as_a, &id_of(&a), vec![forged]).await.unwrap();
    let kept = logs_until(&mut client, "mine", |lines| {
        lines.iter().any(|l| l.message == "pretending")
    })
    .await;
    let kept = kept.iter().find(|l| l.message == "pretending").unwrap();
    assert_eq!(kept.source, "sandbox");
    assert_eq!(kept.sandbox_id, id_of(&a));

    // A pusher name longer than 64 bytes is refused.
    let long = PushSandboxLogsRequest {
        sandbox_id: id_of(&a),
        logs: vec![line("long pusher")],
        pusher: "p".repeat(65),
        sequence: 1,
    };
    let err = push_message(&mut as_a, long).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
}

/// A retried push (the same pusher and number, as after an answer that
/// was lost) is acknowledged and not recorded again; older numbers are not
/// either, another pusher's are.
#[tokio::test]
async fn a_retried_push_is_recorded_once() {
    let gw = start();
    let mut client = client(&gw).await;
    let sandbox = create_ready(&mut client, "retried").await;
    let token = sandbox_token(&gw.store_dir(), &id_of(&sandbox)).expect("token");
    let mut supervisor = client_with(&gw, Some(&token)).await;
    let message = |pusher: &str, sequence: u64, text: &str| PushSandboxLogsRequest {
        sandbox_id: id_of(&sandbox),
        logs: vec![line(text)],
        pusher: pusher.into(),
        sequence,
    };
    for (pusher, sequence, text) in [
        ("one", 1, "first"),
        ("one", 1, "first"),
        ("one", 2, "second"),
        ("one", 1, "first"),
        ("two", 1, "other pusher"),
        ("two", 1, "other pusher"),
        // No mark: no check.
        ("", 0, "unmarked"),
        ("", 0, "unmarked"),
    ] {
        push_message(&mut supervisor, message(pusher, sequence, text))
            .await
            .unwrap_or_else(|e| panic!("{pusher} {sequence}: {e:?}"));
    }
    let got = logs_until(&mut client, "retried", |lines| {
        lines.iter().filter(|l| l.message == "unmarked").count() == 2
    })
    .await;
    let count = |text: &str| got.iter().filter(|l| l.message == text).count();
    assert_eq!(
        [count("first"), count("second"), count("other pusher")],
        [1, 1, 1],
        "{got:#?}"
    );
}

fn watch_logs(name: &str, cursor: &str) -> WatchSandboxRequest {
    WatchSandboxRequest {
        sandbox: name.into(),
        follow_status: true,
        follow_logs: true,
        resume_after_cursor: cursor.into(),
        ..Default::default()
    }
}

/// What a watcher got: the pushed lines (by message) and the last cursor.
#[derive(Default)]
struct Seen {
    lines: Vec<String>,
    cursors: Vec<String>,
}

/// Reads `stream` until `want` pushed lines arrived in total or the stream
/// ends (an error ends it too: returned).
async fn read_until(
    stream: &mut tonic::Streaming<SandboxStreamEvent>,
    seen: &mut Seen,
    want: usize,
) -> Option<tonic::Status> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.lines.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = tokio::time::timeout(left, stream.message())
            .await
            .unwrap_or_else(|_| panic!("only {} of {want} lines arrived", seen.lines.len()));
        match next {
            Ok(Some(event)) => {
                assert!(
                    !event.cursor.is_empty(),
                    "an event without a cursor: {event:?}"
                );
                if let Some(last) = seen.cursors.last() {
                    assert!(
                        event.cursor >= *last,
                        "cursors went back: {last} then {}",
                        event.cursor
                    );
                }
                seen.cursors.push(event.cursor.clone());
                if let Some(sandbox_stream_event::Payload::Log(line)) = event.payload
                    && line.message.starts_with("pushed ")
                {
                    seen.lines.push(line.message);
                }
            }
            Ok(None) => return None,
            Err(status) => return Some(status),
        }
    }
    None
}

/// Pushes the next 20 numbered lines, alternating between the pushers.
async fn push_batch(pushers: &mut [Client; 2], id: &str, sent: &mut usize) {
    let batch = (*sent..*sent + 20)
        .map(|i| line(&format!("pushed {i:05}")))
        .collect();
    push(&mut pushers[(*sent / 20) % 2], id, batch)
        .await
        .expect("push");
    *sent += 20;
}

fn cluster_options(database_url: Option<String>) -> ClusterOptions {
    ClusterOptions {
        replicas: 3,
        database_url,
        tokens: vec![TOKEN.into()],
        extra_args: ["--member-refresh-ms", "300", "--member-ttl-ms", "3000"]
            .map(String::from)
            .to_vec(),
        ..ClusterOptions::default()
    }
}

/// Lines pushed through two replicas reach a watcher on a third; the
/// watcher's replica is killed mid-watch, restarted, and the watcher
/// resumes from its last cursor (on another replica, then on the restarted
/// one): every line exactly once, in order.
async fn watch_survives_a_replica_restart(mut cluster: TestCluster, token_dir: std::path::PathBuf) {
    const TOTAL: usize = 600;
    let mut writer = client(&cluster.replicas[0]).await;
    let sandbox = create_ready(&mut writer, "watched").await;
    let id = id_of(&sandbox);
    let token = sandbox_token(&token_dir, &id).expect("sandbox token");
    let mut pushers = [
        client_with(&cluster.replicas[0], Some(&token)).await,
        client_with(&cluster.replicas[2], Some(&token)).await,
    ];
    let mut watcher = client(&cluster.replicas[1]).await;
    let mut stream = watcher
        .watch_sandbox(watch_logs("watched", ""))
        .await
        .expect("watch")
        .into_inner();
    let mut seen = Seen::default();
    // Pushes batches of 20 lines alternately through both replicas while
    // the watcher reads; the watcher's replica dies after a third.
    let mut sent = 0;
    while sent < TOTAL / 3 {
        push_batch(&mut pushers, &id, &mut sent).await;
    }
    assert!(
        read_until(&mut stream, &mut seen, TOTAL / 3)
            .await
            .is_none()
    );
    cluster.replicas[1].kill();
    while sent < 2 * TOTAL / 3 {
        push_batch(&mut pushers, &id, &mut sent).await;
    }
    // The dead replica's stream ends with an error; anything it delivered
    // before is counted.
    let ended = read_until(&mut stream, &mut seen, TOTAL).await;
    assert!(ended.is_some(), "the dead replica's stream ended quietly");
    let mut elsewhere = client(&cluster.replicas[2]).await;
    let cursor = seen.cursors.last().unwrap().clone();
    let mut resumed = elsewhere
        .watch_sandbox(watch_logs("watched", &cursor))
        .await
        .expect("resume on another replica")
        .into_inner();
    assert!(
        read_until(&mut resumed, &mut seen, 2 * TOTAL / 3)
            .await
            .is_none()
    );
    drop(resumed);
    cluster.replicas[1].restart();
    while sent < TOTAL {
        push_batch(&mut pushers, &id, &mut sent).await;
    }
    let mut restarted = client(&cluster.replicas[1]).await;
    let cursor = seen.cursors.last().unwrap().clone();
    let mut resumed = restarted
        .watch_sandbox(watch_logs("watched", &cursor))
        .await
        .expect("resume on the restarted replica")
        .into_inner();
    assert!(read_until(&mut resumed, &mut seen, TOTAL).await.is_none());
    let want: Vec<String> = (0..TOTAL).map(|i| format!("pushed {i:05}")).collect();
    assert_eq!(seen.lines.len(), TOTAL, "lines lost or repeated");
    assert_eq!(seen.lines, want, "lines out of order");
    // Nothing more arrives: no line was delivered twice after the end.
    let extra = tokio::time::timeout(Duration::from_millis(500), resumed.message()).await;
    if let Ok(Ok(Some(event))) = extra {
        assert!(
            !matches!(&event.payload, Some(sandbox_stream_event::Payload::Log(l)) if l.message.starts_with("pushed ")),
            "an extra line: {event:?}"
        );
    }
    eprintln!(
        "watch across replicas: {TOTAL} lines pushed, {} received, 0 lost, 0 repeated",
        seen.lines.len()
    );
}

#[tokio::test]
async fn a_watch_resumes_across_replicas_without_loss_sqlite() {
    let cluster = TestCluster::start(cluster_options(None));
    let dir = cluster.replicas[0].store_dir();
    watch_survives_a_replica_restart(cluster, dir).await;
}

#[tokio::test]
async fn a_watch_resumes_across_replicas_without_loss_postgres() {
    let pg = Postgres::start();
    let cluster = TestCluster::start(cluster_options(Some(pg.url())));
    let dir = cluster.replicas[0].store_dir();
    watch_survives_a_replica_restart(cluster, dir).await;
}

#[tokio::test]
async fn cursors_that_cannot_resume_are_refused() {
    let gw = Gateway::start(GatewayOptions {
        extra_args: vec!["--sandbox-log-lines".into(), "20".into()],
        ..GatewayOptions::with_token(TOKEN)
    });
    let mut client = client(&gw).await;
    let sandbox = create_ready(&mut client, "cursed").await;
    let mut first = client
        .watch_sandbox(watch_logs("cursed", ""))
        .await
        .unwrap()
        .into_inner();
    let snapshot = first.message().await.unwrap().unwrap();
    assert!(matches!(
        snapshot.payload,
        Some(sandbox_stream_event::Payload::Sandbox(_))
    ));
    let cursor = snapshot.cursor.clone();
    drop(first);

    for (bad, code) in [
        ("garbage", Code::InvalidArgument),
        ("0123456789abcdef.notanumber", Code::InvalidArgument),
        (
            "0123456789abcdef.-0000000000000000001",
            Code::InvalidArgument,
        ),
        // A replayed line after the snapshot it came with, and too many parts.
        (
            &*format!("{cursor}.{:020}", 99_999_999_999u64),
            Code::InvalidArgument,
        ),
        (
            &*format!("{cursor}.{:020}.{:020}", 1, 1),
            Code::InvalidArgument,
        ),
        // Another store's space.
        (
            &*format!("ffffffffffffffff{}", &cursor[16..]),
            Code::OutOfRange,
        ),
        // Ahead of the log.
        (
            &*format!("{}.{:020}", &cursor[..16], 99_999_999_999u64),
            Code::OutOfRange,
        ),
    ] {
        let err = client
            .watch_sandbox(watch_logs("cursed", bad))
            .await
            .err()
            .unwrap_or_else(|| panic!("{bad} was accepted"));
        assert_eq!(err.code(), code, "{bad}: {err:?}");
    }

    // Resuming after the snapshot delivers exactly what came later, with no
    // snapshot first.
    let token = sandbox_token(&gw.store_dir(), &id_of(&sandbox)).unwrap();
    let mut supervisor = client_with(&gw, Some(&token)).await;
    push(
        &mut supervisor,
        &id_of(&sandbox),
        vec![line("pushed 00000")],
    )
    .await
    .unwrap();
    let mut resumed = client
        .watch_sandbox(watch_logs("cursed", &cursor))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Seen::default();
    assert!(read_until(&mut resumed, &mut seen, 1).await.is_none());
    assert_eq!(seen.lines, ["pushed 00000"]);
    drop(resumed);

    // More lines than the gateway keeps: the old cursor missed some.
    let flood = (1..=40).map(|i| line(&format!("pushed {i:05}"))).collect();
    push(&mut supervisor, &id_of(&sandbox), flood)
        .await
        .unwrap();
    let mut behind = client
        .watch_sandbox(watch_logs("cursed", &cursor))
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(10), behind.message()).await {
            Ok(Ok(Some(event))) => got.push(event),
            Ok(Ok(None)) => panic!("the stream ended quietly after {} events", got.len()),
            Ok(Err(status)) => break status,
            Err(_) => panic!("no end after {} events", got.len()),
        }
    };
    assert_eq!(end.code(), Code::OutOfRange, "{end:?}");
    assert!(got.is_empty(), "events before the trimmed gap: {got:?}");
    let kept = logs(&mut client, logs_of("cursed")).await.unwrap();
    assert_eq!(kept.buffer_total, 20);

    // A watch from now still works, replaying the tail it asked for.
    let mut fresh = client
        .watch_sandbox(WatchSandboxRequest {
            log_tail_lines: 5,
            ..watch_logs("cursed", "")
        })
        .await
        .unwrap()
        .into_inner();
    let mut seen = Seen::default();
    assert!(read_until(&mut fresh, &mut seen, 5).await.is_none());
    assert_eq!(seen.lines.last().unwrap(), "pushed 00040");
    drop(fresh);

    // A replay cut short resumes after its last line: the rest of the
    // replay, then what came later.
    let second_line = seen.cursors[2].clone();
    assert!(
        second_line.starts_with(&seen.cursors[0]),
        "{seen_cursors:?}",
        seen_cursors = seen.cursors
    );
    let refused = client
        .watch_sandbox(WatchSandboxRequest {
            follow_logs: false,
            ..watch_logs("cursed", &second_line)
        })
        .await
        .expect_err("a replay cursor without follow_logs");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    push(
        &mut supervisor,
        &id_of(&sandbox),
        vec![line("pushed 00041")],
    )
    .await
    .unwrap();
    let mut rest = client
        .watch_sandbox(watch_logs("cursed", &second_line))
        .await
        .unwrap()
        .into_inner();
    let mut after = Seen::default();
    assert!(read_until(&mut rest, &mut after, 4).await.is_none());
    assert_eq!(
        after.lines,
        [
            "pushed 00038",
            "pushed 00039",
            "pushed 00040",
            "pushed 00041"
        ]
    );
    assert!(after.cursors[0] > second_line);
}
