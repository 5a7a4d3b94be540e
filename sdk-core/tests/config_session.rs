//! `ConfigSession` against the real gateway: it takes over a sandbox's
//! session with the sandbox's own token (the real supervisor is frozen),
//! gets pushed updates from a push gateway and answers them (a rejection is
//! counted by the gateway); against a poll gateway it polls. Both deliver
//! the same snapshots, in the same order, to the same apply function.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use openshell_sdk::proto::sandbox::{SettingValue, setting_value};
use openshell_sdk::proto::{UpdateConfigRequest, UpdateConfigResponse};
use openshell_sdk::{
    ApplyOutcome, CallOptions, Client, ClientConfig, ConfigSession, ConfigSessionStats,
    ConfigSnapshot, DeliveryMode,
};
use openshell_testkit::{Gateway, GatewayOptions, eventually, metric_value, sandbox_token, signal};
use prost::Message;
use tokio_util::sync::CancellationToken;

fn gateway(mode: &str) -> Gateway {
    Gateway::start(GatewayOptions {
        replica_id: Some(REPLICA.into()),
        extra_args: vec!["--config-delivery-mode".into(), mode.into()],
        ..GatewayOptions::with_token(TOKEN)
    })
}

async fn set(client: &Client, sandbox: &str, key: &str, value: &str) -> UpdateConfigResponse {
    let request = UpdateConfigRequest {
        sandbox: sandbox.into(),
        setting_key: key.into(),
        setting_value: Some(SettingValue {
            value: Some(setting_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    };
    let response = client
        .raw_unary(
            "/openshell.v1.OpenShell/UpdateConfig",
            Bytes::from(request.encode_to_vec()),
            openshell_sdk::Metadata::new(),
            CallOptions::new(),
        )
        .await
        .expect("update config");
    UpdateConfigResponse::decode(response.bytes).unwrap()
}

/// Stops (SIGSTOP) the sandbox's real supervisor; returns its PID and the
/// sandbox token a test session takes over with.
fn freeze_supervisor(gw: &Gateway, sandbox_id: &str) -> (i32, String) {
    let pid: i32 = std::fs::read_to_string(
        gw.store_dir()
            .join("sandboxes")
            .join(sandbox_id)
            .join("supervisor.pid"),
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    let token = sandbox_token(&gw.store_dir(), sandbox_id).expect("sandbox token");
    signal(pid, libc::SIGSTOP);
    (pid, token)
}

fn setting(snapshot: &ConfigSnapshot, key: &str) -> Option<String> {
    match snapshot
        .sandbox_config
        .settings
        .get(key)?
        .value
        .as_ref()?
        .value
        .as_ref()?
    {
        setting_value::Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

async fn wait_applied(applied: &Mutex<Vec<ConfigSnapshot>>, key: &str, want: &str) -> Duration {
    let started = Instant::now();
    let ok = eventually(Duration::from_secs(5), || {
        applied
            .lock()
            .unwrap()
            .last()
            .is_some_and(|s| setting(s, key).as_deref() == Some(want))
    })
    .await;
    assert!(ok, "{key}={want} was never applied");
    started.elapsed()
}

struct Run {
    applied: Vec<ConfigSnapshot>,
    stats: ConfigSessionStats,
    events: Vec<String>,
}

/// Takes over a fresh sandbox's session with a `ConfigSession` (the real
/// supervisor frozen), then writes settings and collects what was applied.
/// `announce_push` false is a supervisor that predates push: it must poll
/// whatever the gateway's mode.
async fn drive(mode: &str, announce_push: bool) -> Run {
    let pushing = mode == "push" && announce_push;
    let gw = gateway(mode);
    let client = client(&gw).await;
    let sandbox = create_ready(&client, "session").await;
    // Freeze the real supervisor: this test's session supersedes its one.
    let (pid, token) = freeze_supervisor(&gw, &sandbox.id);

    let bootstraps = |gw: &Gateway| {
        metric_value(
            &gw.metrics(),
            r#"openshell_server_config_updates_sent_total{kind="initial"}"#,
        )
    };
    let bootstraps_before = bootstraps(&gw);
    let applied: Arc<Mutex<Vec<ConfigSnapshot>>> = Arc::default();
    let record = applied.clone();
    let config = ClientConfig::builder(gw.url.clone())
        .token(token.as_str())
        .build()
        .unwrap();
    let session = ConfigSession::builder(config, sandbox.id.clone())
        .apply(Arc::new(move |snapshot: ConfigSnapshot| {
            if setting(&snapshot, "verdict").as_deref() == Some("no") {
                return ApplyOutcome::Rejected("verdict is no".into());
            }
            record.lock().unwrap().push(snapshot);
            ApplyOutcome::Applied
        }))
        .poll_interval(Duration::from_millis(300))
        .config_push(announce_push)
        .build()
        .unwrap();
    let mut events = session.subscribe();
    let cancel = CancellationToken::new();
    let runner = {
        let session = session.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move { session.run(cancel).await })
    };
    let want = if pushing {
        DeliveryMode::Push
    } else {
        DeliveryMode::Poll
    };
    let connected = eventually(Duration::from_secs(10), || {
        let stats = session.stats();
        stats.mode == Some(want) && stats.sessions_accepted == 1
    })
    .await;
    assert!(connected, "{mode}: {:?}", session.stats());
    assert_eq!(session.stats().served_by.as_deref(), Some(REPLICA));
    if pushing {
        // The bootstrap (update 1) equals the startup poll's snapshot.
        assert!(
            eventually(Duration::from_secs(5), || session.stats().last_update_id
                == 1)
            .await
        );
        assert_eq!(session.stats().duplicates, 1);
    }
    assert_eq!(applied.lock().unwrap().len(), 1);

    let mut latencies = Vec::new();
    set(&client, "session", "color", "blue").await;
    latencies.push(wait_applied(&applied, "color", "blue").await);
    // A rejection is answered (and, when pushed, counted by the gateway).
    set(&client, "session", "verdict", "no").await;
    assert!(eventually(Duration::from_secs(5), || session.stats().rejected >= 1).await);
    if pushing {
        let counted = eventually(Duration::from_secs(5), || {
            metric_value(
                &gw.metrics(),
                r#"openshell_server_config_results_total{outcome="rejected"}"#,
            ) == Some(1.0)
        })
        .await;
        assert!(counted, "{}", gw.metrics());
    } else {
        assert_eq!(
            metric_value(&gw.metrics(), "openshell_server_config_push_sessions"),
            Some(0.0)
        );
        // No bootstrap went to this session (the frozen supervisor's, if
        // any, was sent before it started).
        assert_eq!(bootstraps(&gw), bootstraps_before);
    }
    set(&client, "session", "verdict", "yes").await;
    latencies.push(wait_applied(&applied, "verdict", "yes").await);
    set(&client, "session", "color", "green").await;
    latencies.push(wait_applied(&applied, "color", "green").await);
    let worst = latencies.iter().max().unwrap();
    eprintln!(
        "FIGURE ConfigSession {mode} gateway, announce push {announce_push}: write->apply worst of 3 {:.1} ms (poll interval 300 ms)",
        worst.as_secs_f64() * 1000.0
    );

    // The apply function records a snapshot a moment before the session
    // counts it (the count follows the function's return): wait, bounded,
    // for the count to catch up, so the cancel below cannot cut it short.
    let recorded = applied.lock().unwrap().len() as u64;
    assert!(
        eventually(Duration::from_secs(5), || session.stats().applied
            >= recorded)
        .await,
        "{mode}: {recorded} recorded, {:?}",
        session.stats()
    );
    cancel.cancel();
    runner.await.unwrap().unwrap();
    signal(pid, libc::SIGKILL);
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(format!("{event:?}"));
    }
    let applied = applied.lock().unwrap().clone();
    Run {
        applied,
        stats: session.stats(),
        events: seen,
    }
}

#[tokio::test]
async fn config_session_push_and_poll_deliver_the_same_snapshots() {
    let pushed = drive("push", true).await;
    assert_eq!(pushed.stats.applied, 4);
    assert!(pushed.stats.last_update_id >= 4, "{:?}", pushed.stats);
    assert!(
        pushed
            .events
            .iter()
            .any(|e| e.starts_with("ModeChanged(Push)")),
        "{:?}",
        pushed.events
    );
    assert!(pushed.events.iter().any(|e| e.starts_with("Rejected")));
    let polled = drive("poll", true).await;
    assert_eq!(polled.stats.applied, 4);
    assert_eq!(polled.stats.updates_received, 0);
    assert!(polled.stats.polls >= 4);
    assert!(
        !polled
            .events
            .iter()
            .any(|e| e.starts_with("ModeChanged(Push)"))
    );
    // The host cannot tell the modes apart: the same snapshots, in order.
    assert_eq!(pushed.applied, polled.applied);
}

/// Mixed versions: a supervisor that does not announce push keeps polling
/// against a push gateway (and gets the same snapshots). The other pairing,
/// a push supervisor against a poll gateway, is the `poll` half above.
#[tokio::test]
async fn a_session_that_does_not_announce_push_polls_against_a_push_gateway() {
    let old = drive("push", false).await;
    assert_eq!(old.stats.mode, Some(DeliveryMode::Poll));
    assert_eq!(old.stats.applied, 4);
    assert_eq!(old.stats.updates_received, 0);
    assert!(old.stats.polls >= 4, "{:?}", old.stats);
    assert!(
        !old.events
            .iter()
            .any(|e| e.starts_with("ModeChanged(Push)")),
        "{:?}",
        old.events
    );
}

/// `run` returns only after an apply call in flight has returned, so a host
/// that tears its state down once `run` is over never races its own apply
/// function.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_returns_only_after_the_apply_call_in_flight() {
    let gw = gateway("push");
    let client = client(&gw).await;
    let sandbox = create_ready(&client, "in-flight").await;
    // Freeze the real supervisor: this test's session supersedes its one.
    let (pid, token) = freeze_supervisor(&gw, &sandbox.id);

    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    let started_tx = Mutex::new(started_tx);
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = finished.clone();
    let config = ClientConfig::builder(gw.url.clone())
        .token(token.as_str())
        .build()
        .unwrap();
    let session = ConfigSession::builder(config, sandbox.id.clone())
        .apply(Arc::new(move |_snapshot: ConfigSnapshot| {
            let _ = started_tx.lock().unwrap().send(());
            std::thread::sleep(Duration::from_millis(1500));
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            ApplyOutcome::Applied
        }))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let runner = {
        let (session, cancel) = (session.clone(), cancel.clone());
        tokio::spawn(async move { session.run(cancel).await })
    };
    // The first apply (the start-up poll) is under way: end the session.
    tokio::task::spawn_blocking(move || started_rx.recv_timeout(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the apply function was called");
    cancel.cancel();
    runner.await.unwrap().unwrap();
    assert!(
        finished.load(std::sync::atomic::Ordering::SeqCst),
        "run returned while its apply call was still running"
    );
    signal(pid, libc::SIGKILL);
}
