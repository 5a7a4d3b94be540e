//! Push sessions under relay load, against the real gateway: config updates
//! have their own queue in the session stream, so a burst of relay opens
//! (200 concurrent execs on one sandbox) neither closes the session nor
//! cuts a stream while updates keep flowing; a supervisor that stops
//! reading its stream gets relay opens that fail fast with `unavailable`
//! and is closed once its stream has not drained for the drain timeout.

mod common;
mod config_util;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use config_util::*;
use openshell_proto::*;
use openshell_testkit::cluster::{ClusterOptions, TestCluster};
use openshell_testkit::{Gateway, GatewayOptions, eventually};

const EXECS: usize = 200;

fn closed_sessions(gw: &Gateway) -> Vec<String> {
    gw.metrics()
        .lines()
        .filter(|l| l.starts_with("openshell_server_config_sessions_closed_total{"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn two_hundred_execs_do_not_close_a_push_session_while_updates_flow() {
    let gw = Gateway::start(GatewayOptions {
        extra_args: push_args(None),
        ..GatewayOptions::with_token(TOKEN)
    });
    let mut client = client(&gw).await;
    let sandbox = create_ready(&mut client, "busy").await;
    let path = config_path(&gw.store_dir(), &id(&sandbox));
    let bootstrapped = eventually(Duration::from_secs(10), || {
        results(&gw, "applied") + results(&gw, "ignored_duplicate") >= 1.0
    })
    .await;
    assert!(bootstrapped, "bootstrap never answered:\n{}", gw.metrics());
    assert_eq!(sent(&gw, "initial"), 1.0);

    // Config updates flow for as long as the execs run.
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let mut client = client.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut writes = 0u32;
            let started = Instant::now();
            while !done.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(120) {
                set(&mut client, "busy", "tick", string(&format!("t-{writes}"))).await;
                writes += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            writes
        })
    };

    let started = Instant::now();
    let execs = (0..EXECS).map(|i| {
        let mut client = client.clone();
        async move {
            // About 50 KB of arguments (the script ignores them): each
            // RelayOpen weighs on the session's stream like a real burst.
            let mut request =
                exec_request("busy", &["sh", "-c", &format!("sleep 1; echo out-{i}")]);
            request.command.extend((0..500).map(|_| "a".repeat(100)));
            (i, exec(&mut client, request).await)
        }
    });
    let outcomes = futures::future::join_all(execs).await;
    let took = started.elapsed();
    done.store(true, Ordering::SeqCst);
    let writes = writer.await.unwrap();

    let mut failed = Vec::new();
    for (i, outcome) in outcomes {
        match outcome {
            Ok(result) if result.exit_code == Some(0) => {
                assert_eq!(result.stdout_text(), format!("out-{i}\n"), "exec {i}")
            }
            other => failed.push(format!("exec {i}: {other:?}")),
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {EXECS} execs failed or were cut: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    eprintln!(
        "FIGURE {EXECS} concurrent execs on one push sandbox: {:.1} s, {writes} config writes meanwhile",
        took.as_secs_f64()
    );

    // The last write still arrives promptly, on the same session.
    let last = format!("t-{}", writes - 1);
    wait_config(&path, Duration::from_secs(2), |c| {
        c["settings"]["tick"]["value"] == last.as_str()
    })
    .await;
    assert!(writes >= 5, "only {writes} writes while the execs ran");
    assert!(sent(&gw, "update") >= 1.0, "{}", gw.metrics());
    assert_eq!(closed_sessions(&gw), Vec::<String>::new());
    assert_eq!(sent(&gw, "initial"), 1.0, "the session was re-accepted");
    assert_eq!(metric(&gw, "openshell_server_config_push_sessions"), 1.0);
    assert!(!gw.log().contains("closing push session"), "{}", gw.log());
}

/// An exec whose RelayOpen is about 100 KB: a few fill a stream that is
/// not read.
fn heavy_exec(sandbox: &str) -> ExecSandboxRequest {
    let filler = "x".repeat(100);
    let mut argv = vec!["true".to_owned()];
    argv.extend((0..1000).map(|_| filler.clone()));
    ExecSandboxRequest {
        sandbox: sandbox.to_owned(),
        command: argv,
        ..Default::default()
    }
}

/// A supervisor's side that stops reading: a small receive window, a
/// hello, the acceptance read, then heartbeats only (so it is not idle).
/// Dropping the returned pair ends it.
async fn deaf_supervisor(
    gw: &Gateway,
    token: String,
    sandbox_id: &str,
) -> (
    tonic::Streaming<GatewayMessage>,
    tokio::task::JoinHandle<()>,
) {
    let channel = tonic::transport::Channel::from_shared(gw.url.clone())
        .unwrap()
        .initial_stream_window_size(16 * 1024)
        .connect()
        .await
        .unwrap();
    let mut supervisor =
        open_shell_client::OpenShellClient::with_interceptor(channel, Bearer(Some(token)));
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tx.send(SupervisorMessage {
        payload: Some(supervisor_message::Payload::Hello(SupervisorHello {
            sandbox_id: sandbox_id.to_owned(),
            instance_id: "deaf-supervisor".into(),
            connection_epoch: 1,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut session = supervisor
        .connect_supervisor(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("session")
        .into_inner();
    let first = session.message().await.unwrap().unwrap();
    assert!(matches!(
        first.payload,
        Some(gateway_message::Payload::SessionAccepted(_))
    ));
    let beats = tokio::spawn(async move {
        for _ in 0..60 {
            let beat = SupervisorMessage {
                payload: Some(supervisor_message::Payload::Heartbeat(
                    SupervisorHeartbeat {},
                )),
            };
            if tx.send(beat).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    (session, beats)
}

/// Enough execs to fill an unread stream and its session's queue, sent
/// through `client`; returns when each of those that failed for the full
/// queue failed, and every other error message. Asserts that some failed
/// for the full queue within 8 s (the 5 s send timeout).
async fn relay_opens_fail_fast(client: &Client, sandbox: &str) -> (Vec<Duration>, Vec<String>) {
    let started = Instant::now();
    let execs = (0..90).map(|_| {
        let mut client = client.clone();
        async move {
            let outcome = exec(&mut client, heavy_exec(sandbox)).await;
            (outcome, started.elapsed())
        }
    });
    let outcomes = futures::future::join_all(execs).await;
    let fast_unavailable: Vec<Duration> = outcomes
        .iter()
        .filter_map(|(outcome, at)| match outcome {
            Err(status)
                if status.code() == tonic::Code::Unavailable
                    && status.message().contains("not taking relay opens") =>
            {
                Some(*at)
            }
            _ => None,
        })
        .collect();
    assert!(
        !fast_unavailable.is_empty(),
        "no relay open failed for a full queue: {:?}",
        outcomes
            .iter()
            .map(|(o, _)| o.as_ref().map(|_| ()).map_err(|s| s.code()))
            .collect::<Vec<_>>()
    );
    let fastest = fast_unavailable.iter().min().unwrap();
    assert!(*fastest < Duration::from_secs(8), "{fastest:?}");
    let others = outcomes
        .iter()
        .filter_map(|(outcome, _)| outcome.as_ref().err())
        .filter(|status| !status.message().contains("not taking relay opens"))
        .map(|status| status.message().to_owned())
        .collect();
    (fast_unavailable, others)
}

async fn create_bare(client: &mut Client, name: &str) -> String {
    let sandbox = client
        .create_sandbox(CreateSandboxRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    id(&sandbox)
}

#[tokio::test]
async fn a_supervisor_that_stops_reading_fails_relay_opens_fast_and_is_closed() {
    const DRAIN_MS: u64 = 8_000;
    let gw = Gateway::start(GatewayOptions {
        extra_args: [
            "--allow-test-flags",
            "--driver",
            "none",
            "--session-drain-timeout-ms",
            &DRAIN_MS.to_string(),
            "--heartbeat-ms",
            "1000",
        ]
        .map(String::from)
        .to_vec(),
        ..GatewayOptions::with_token(TOKEN)
    });
    let mut client = client(&gw).await;
    let id = create_bare(&mut client, "deaf").await;
    let token = sandbox_token(&gw.store_dir(), &id);
    let (session, beats) = deaf_supervisor(&gw, token, &id).await;
    wait_phase(&mut client, "deaf", SandboxPhase::Ready).await;

    let started = Instant::now();
    let (fast_unavailable, _) = relay_opens_fail_fast(&client, "deaf").await;
    // One replica: every open is one attempt, bounded by the 5 s send
    // timeout (not the 10 s claim timeout).
    let slowest = fast_unavailable.iter().max().unwrap();
    assert!(*slowest < Duration::from_secs(8), "{slowest:?}");
    eprintln!(
        "FIGURE relay opens on an unread session: {} of 90 failed unavailable, the last after {:.1} s",
        fast_unavailable.len(),
        fast_unavailable.iter().max().unwrap().as_secs_f64()
    );

    // The session closes once its stream has not drained for the timeout.
    wait_metric(
        &gw,
        r#"openshell_server_config_sessions_closed_total{reason="not_draining"}"#,
        1.0,
        Duration::from_millis(DRAIN_MS + 10_000),
    )
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(DRAIN_MS),
        "closed before the drain timeout"
    );
    assert!(gw.log().contains("stopped draining its stream"));
    let idle = eventually(Duration::from_secs(5), || {
        metric(&gw, "openshell_server_supervisor_sessions") == 0.0
    })
    .await;
    assert!(idle, "{}", gw.metrics());
    beats.abort();
    drop(session);
}

#[tokio::test]
async fn a_relayed_open_to_a_session_that_stops_reading_is_not_retried() {
    // Two replicas: the unread session is on gw-0, the execs arrive on gw-1
    // and are relayed to it over the peer service. The full-queue failure
    // comes back as it is, once, instead of being retried for the router's
    // whole open budget.
    let cluster = TestCluster::start(ClusterOptions {
        replicas: 2,
        tokens: vec![TOKEN.into()],
        extra_args: [
            "--allow-test-flags",
            "--driver",
            "none",
            "--member-refresh-ms",
            "300",
            "--member-ttl-ms",
            "3000",
        ]
        .map(String::from)
        .to_vec(),
        ..ClusterOptions::default()
    });
    let (gw0, gw1) = (&cluster.replicas[0], &cluster.replicas[1]);
    let mut client0 = client(gw0).await;
    let id = create_bare(&mut client0, "deaf").await;
    let token = sandbox_token(&cluster.replicas[0].store_dir(), &id);
    let (session, beats) = deaf_supervisor(gw0, token, &id).await;
    wait_phase(&mut client0, "deaf", SandboxPhase::Ready).await;
    let client1 = client(gw1).await;
    let (fast_unavailable, others) = relay_opens_fail_fast(&client1, "deaf").await;
    // A retried full-queue failure would fail again and again until the
    // router's open budget ran out, and end as "not connected".
    assert!(
        !others.iter().any(|m| m.contains("not connected")),
        "{others:?}"
    );
    eprintln!(
        "FIGURE relayed opens on an unread session: {} of 90 failed unavailable, the last after {:.1} s",
        fast_unavailable.len(),
        fast_unavailable.iter().max().unwrap().as_secs_f64()
    );
    let remote_errors = metric(
        gw1,
        r#"openshell_server_routed_request_attempts_total{operation="relay",route="peer",relay_kind="exec",outcome="remote_error"}"#,
    );
    assert!(
        remote_errors >= fast_unavailable.len() as f64,
        "the failures did not come over the peer route:\n{}",
        gw1.metrics()
    );
    beats.abort();
    drop(session);
}
