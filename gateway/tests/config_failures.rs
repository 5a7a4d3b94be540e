//! Push-config failure paths that cross processes, with real gateway
//! replicas: a peer that never answers costs a notification 5 s and at most
//! 8 run at once; a replica without PeerNotifyConfigUpdate (the hidden
//! `--no-peer-config-notify`, as an older replica) counts as
//! `unsupported_peer`; and a build still running when its session moved to
//! another replica is handed to the new owner, not left to its reconcile.
//! The single-replica deadlines (bootstrap, provider environment, backoff,
//! reconcile jitter) are unit tests on a paused clock
//! (`config::delivery::tests`).

mod common;
mod config_util;

use std::time::{Duration, Instant};

use common::*;
use config_util::*;
use openshell_proto::*;
use openshell_testkit::cluster::{ClusterOptions, TestCluster};
use openshell_testkit::{Gateway, GatewayOptions};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const MEMBERSHIP: [&str; 5] = [
    "--allow-test-flags",
    "--member-refresh-ms",
    "300",
    "--member-ttl-ms",
    "3000",
];

fn cluster_args(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = MEMBERSHIP.map(String::from).to_vec();
    args.extend(push_args(None));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// One replica, gw-0, of a cluster the test grows by hand.
fn one_replica(extra: &[&str]) -> TestCluster {
    TestCluster::start(ClusterOptions {
        replicas: 1,
        tokens: vec![TOKEN.into()],
        extra_args: cluster_args(extra),
        ..ClusterOptions::default()
    })
}

/// Adds gw-1 to the cluster with its own extra arguments.
fn add_gw1(cluster: &mut TestCluster, extra: &[&str]) {
    let gw = Gateway::start(GatewayOptions {
        tokens: vec![TOKEN.into()],
        replica_id: Some("gw-1".into()),
        data_dir: Some(cluster.shared_dir().join("data")),
        peer_token: Some(cluster.peer_token.clone()),
        supervisor_url: Some(cluster.replicas[0].url.clone()),
        extra_args: cluster_args(extra),
        ..GatewayOptions::default()
    });
    cluster.replicas.push(gw);
}

async fn wait_ring(cluster: &TestCluster, members: f64) {
    for gw in &cluster.replicas {
        wait_metric(
            gw,
            "openshell_server_ring_members",
            members,
            Duration::from_secs(15),
        )
        .await;
    }
}

fn notified(gw: &Gateway, scope: &str, outcome: &str) -> f64 {
    metric(
        gw,
        &format!(
            r#"openshell_server_config_peer_notifies_total{{scope="{scope}",outcome="{outcome}"}}"#
        ),
    )
}

fn provider(name: &str, value: &str) -> Option<Provider> {
    Some(Provider {
        name: name.into(),
        environment: [("VALUE".to_owned(), value.to_owned())].into(),
        ..Default::default()
    })
}

/// A loopback listener that accepts connections and never answers: a peer
/// that hangs. Holds at most 64 connections; ends with the test's runtime.
async fn blackhole() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while held.len() < 64 {
            match listener.accept().await {
                Ok((socket, _)) => held.push(socket),
                Err(_) => return,
            }
        }
    });
    format!("http://{addr}")
}

/// Polls every 20 ms until `check` holds; panics after `limit`.
async fn until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) -> Instant {
    let started = Instant::now();
    loop {
        if check() {
            return Instant::now();
        }
        assert!(started.elapsed() < limit, "{what} not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn notifications_to_a_hung_peer_time_out_after_5_s_with_at_most_8_running() {
    let mut cluster = one_replica(&[]);
    // gw-1 is a live member whose advertised peer endpoint never answers.
    let hung = blackhole().await;
    add_gw1(&mut cluster, &["--peer-endpoint", &hung]);
    wait_ring(&cluster, 2.0).await;
    let gw0 = &cluster.replicas[0];
    let mut client = client(gw0).await;
    const PROVIDERS: usize = 12;
    for i in 0..PROVIDERS {
        client
            .create_provider(CreateProviderRequest {
                provider: provider(&format!("p{i}"), "one"),
            })
            .await
            .unwrap();
    }
    // Twelve provider changes: twelve notifications (one per scope) to
    // every peer.
    let started = Instant::now();
    for i in 0..PROVIDERS {
        client
            .update_provider(UpdateProviderRequest {
                provider: provider(&format!("p{i}"), "two"),
            })
            .await
            .unwrap();
    }
    let errors = || notified(gw0, "provider", "error");
    let first = until(Duration::from_secs(10), "the first timeouts", || {
        errors() >= 1.0
    })
    .await;
    let first_after = first - started;
    // The first eight give up together; the other four only start then.
    let eight = until(Duration::from_secs(2), "eight timeouts", || errors() >= 8.0).await;
    assert_eq!(errors(), 8.0, "more than 8 ran at once:\n{}", gw0.metrics());
    let all = until(Duration::from_secs(10), "all timeouts", || {
        errors() >= PROVIDERS as f64
    })
    .await;
    let second_batch_after = all - eight;
    eprintln!(
        "FIGURE hung peer: first notification gave up after {:.2} s, the queued ones {:.2} s later",
        first_after.as_secs_f64(),
        second_batch_after.as_secs_f64()
    );
    assert!(
        first_after >= Duration::from_millis(4900) && first_after < Duration::from_secs(7),
        "first timeout after {first_after:?}"
    );
    assert!(
        second_batch_after >= Duration::from_millis(4500),
        "the queued notifications did not wait for a free slot: {second_batch_after:?}"
    );
    assert_eq!(errors(), PROVIDERS as f64);
    assert_eq!(notified(gw0, "provider", "ok"), 0.0);
}

#[tokio::test]
async fn a_replica_without_config_notify_counts_as_unsupported_peer() {
    let mut cluster = one_replica(&[]);
    add_gw1(&mut cluster, &["--no-peer-config-notify"]);
    wait_ring(&cluster, 2.0).await;
    let (gw0, gw1) = (&cluster.replicas[0], &cluster.replicas[1]);
    let global = |value: &str| UpdateConfigRequest {
        global: true,
        setting_key: "fleet".into(),
        setting_value: Some(sandbox::SettingValue {
            value: Some(string(value)),
        }),
        ..Default::default()
    };
    client(gw0).await.update_config(global("a")).await.unwrap();
    wait_metric(
        gw0,
        r#"openshell_server_config_peer_notifies_total{scope="all",outcome="unsupported_peer"}"#,
        1.0,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(notified(gw0, "all", "ok"), 0.0);
    assert_eq!(notified(gw0, "all", "error"), 0.0);
    // The other way round gw-0 serves it.
    client(gw1).await.update_config(global("b")).await.unwrap();
    wait_metric(
        gw1,
        r#"openshell_server_config_peer_notifies_total{scope="all",outcome="ok"}"#,
        1.0,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(notified(gw1, "all", "unsupported_peer"), 0.0);
}

/// A test-driven supervisor session.
struct Session {
    tx: mpsc::Sender<SupervisorMessage>,
    inbound: tonic::Streaming<GatewayMessage>,
}

impl Session {
    /// Opens a push session (no redirects) and answers its bootstrap.
    async fn open(gw: &Gateway, token: &str, sandbox_id: &str, epoch: u64) -> Self {
        let mut supervisor = client_with(gw, Some(token)).await;
        let (tx, rx) = mpsc::channel(8);
        tx.send(SupervisorMessage {
            payload: Some(supervisor_message::Payload::Hello(SupervisorHello {
                sandbox_id: sandbox_id.into(),
                instance_id: "handover-test".into(),
                connection_epoch: epoch,
                supports_config_push: true,
                ..Default::default()
            })),
        })
        .await
        .unwrap();
        let mut inbound = supervisor
            .connect_supervisor(ReceiverStream::new(rx))
            .await
            .expect("session")
            .into_inner();
        let accepted = match inbound.message().await.unwrap().unwrap().payload {
            Some(gateway_message::Payload::SessionAccepted(accepted)) => accepted,
            other => panic!("expected SessionAccepted, got {other:?}"),
        };
        let bootstrap = accepted.bootstrap.expect("a push bootstrap");
        let session = Self { tx, inbound };
        session.answer(bootstrap.update_id).await;
        session
    }

    async fn answer(&self, update_id: u64) {
        self.tx
            .send(SupervisorMessage {
                payload: Some(supervisor_message::Payload::ConfigUpdateResult(
                    ConfigUpdateResult {
                        update_id,
                        outcome: ConfigApplyOutcome::Applied as i32,
                        ..Default::default()
                    },
                )),
            })
            .await
            .unwrap();
    }

    /// The next ConfigUpdate within `limit` (heartbeats skipped).
    async fn next_update(&mut self, limit: Duration) -> Option<ConfigUpdate> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let message = tokio::time::timeout_at(deadline, self.inbound.message())
                .await
                .ok()?
                .ok()??;
            if let Some(gateway_message::Payload::ConfigUpdate(update)) = message.payload {
                return Some(update);
            }
        }
    }
}

#[tokio::test]
async fn a_build_under_way_when_the_session_moves_notifies_the_new_owner() {
    // Builds hold their permit 1.5 s before reading the store, so the
    // session can move while one is under way; no reconcile within the test.
    let extra = [
        "--driver",
        "none",
        "--config-build-delay-ms",
        "1500",
        "--config-reconcile-ms",
        "600000",
    ];
    let mut cluster = one_replica(&extra);
    add_gw1(&mut cluster, &extra);
    wait_ring(&cluster, 2.0).await;
    let (gw0, gw1) = (&cluster.replicas[0], &cluster.replicas[1]);
    let mut client0 = client(gw0).await;
    let sandbox = client0
        .create_sandbox(CreateSandboxRequest {
            name: "mover".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    let sandbox_id = id(&sandbox);
    let token = sandbox_token(&cluster.shared_dir().join("data"), &sandbox_id);

    // The supervisor's old session on gw-0 lingers while its new one on
    // gw-1 (a later connection epoch) already bootstrapped and owns it.
    let old = Session::open(gw0, &token, &sandbox_id, 1).await;
    let mut new = Session::open(gw1, &token, &sandbox_id, 2).await;

    // A write on gw-0 marks the session gw-0 still holds; its build starts.
    let marks = metric(
        gw0,
        r#"openshell_server_config_marks_total{source="local"}"#,
    );
    set(&mut client0, "mover", "moved", string("yes")).await;
    let written = Instant::now();
    until(Duration::from_secs(5), "the mark on gw-0", || {
        metric(
            gw0,
            r#"openshell_server_config_marks_total{source="local"}"#,
        ) > marks
    })
    .await;
    // The old session ends with that build under way.
    drop(old);

    let update = new
        .next_update(Duration::from_secs(8))
        .await
        .expect("the new owner never heard of the write");
    let took = written.elapsed();
    let settings = &update.sandbox_config.as_ref().unwrap().settings;
    assert_eq!(
        settings.get("moved").and_then(|s| s.value.clone()),
        Some(sandbox::SettingValue {
            value: Some(string("yes"))
        }),
        "{settings:?}"
    );
    new.answer(update.update_id).await;
    eprintln!(
        "FIGURE write->applied on the new owner, handed over by the old one: {:.0} ms (1.5 s build delay on each)",
        took.as_secs_f64() * 1000.0
    );
    assert_eq!(metric(gw0, "openshell_server_config_handovers_total"), 1.0);
    wait_metric(
        gw0,
        r#"openshell_server_config_peer_notifies_total{scope="sandbox",outcome="ok"}"#,
        1.0,
        Duration::from_secs(5),
    )
    .await;
    assert!(metric(gw1, r#"openshell_server_config_marks_total{source="peer"}"#) >= 1.0);
}
