//! A real multi-replica cluster: replicas sharing an SQLite file or a real
//! PostgreSQL server, supervisors placed on their ring owner by redirects,
//! streams relayed by peers, owner reporting, shutdown redirects, and
//! membership that survives a dead replica or a hung database.

mod common;

use std::time::Duration;

use common::*;
use openshell_proto::*;
use openshell_testkit::cluster::{ClusterOptions, Postgres, TestCluster, ring_owner};
use openshell_testkit::{Gateway, eventually, metric_value, sandbox_token};
use tonic::Code;

fn options(replicas: usize, database_url: Option<String>) -> ClusterOptions {
    ClusterOptions {
        replicas,
        database_url,
        tokens: vec![TOKEN.into()],
        extra_args: [
            "--allow-test-flags",
            "--member-refresh-ms",
            "300",
            "--member-ttl-ms",
            "3000",
        ]
        .map(String::from)
        .to_vec(),
        ..ClusterOptions::default()
    }
}

fn metric(gw: &Gateway, sample: &str) -> f64 {
    metric_value(&gw.metrics(), sample).unwrap_or(0.0)
}

const SHUTDOWN_REDIRECTS: &str = r#"openshell_server_session_redirects_total{reason="shutdown"}"#;
const OFFRING_ADMISSIONS: &str = "openshell_server_session_offring_admissions_total";

/// Replicas of these options write their final metrics into `dir` as they
/// exit (read with [`final_metric`]).
fn with_final_metrics(mut opts: ClusterOptions, dir: &std::path::Path) -> ClusterOptions {
    opts.extra_args
        .extend(["--metrics-on-exit".to_owned(), dir.display().to_string()]);
    opts
}

/// A sample of the metrics `replica` wrote into `dir` when it last exited.
fn final_metric(dir: &std::path::Path, replica: &str, sample: &str) -> f64 {
    let path = dir.join(format!("{replica}.metrics"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("{replica} left no final metrics ({err})"));
    metric_value(&text, sample).unwrap_or_else(|| panic!("no {sample} in:\n{text}"))
}

async fn wait_ring(cluster: &TestCluster, members: f64) {
    for gw in &cluster.replicas {
        let ok = eventually(Duration::from_secs(15), || {
            metric(gw, "openshell_server_ring_members") == members
        })
        .await;
        assert!(
            ok,
            "ring never reached {members} members:\n{}",
            gw.metrics()
        );
    }
}

fn route(gw: &Gateway, route: &str) -> f64 {
    metric(
        gw,
        &format!(
            r#"openshell_server_routed_request_attempts_total{{operation="relay",route="{route}",relay_kind="exec",outcome="success"}}"#
        ),
    )
}

async fn owner_via(client: &mut Client, name: &str) -> Option<String> {
    let mut request = tonic::Request::new(GetSandboxRequest {
        name: name.into(),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("x-openshell-want-owner", "1".parse().unwrap());
    let response = client.get_sandbox(request).await.expect("get");
    response
        .metadata()
        .get("x-openshell-owner")
        .map(|v| v.to_str().unwrap().to_owned())
}

async fn placement_routing_and_owner_reporting(cluster: &TestCluster) {
    wait_ring(cluster, 3.0).await;
    let ids = cluster.ids();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut clients = Vec::new();
    for gw in &cluster.replicas {
        clients.push(client(gw).await);
    }
    let mut expected = Vec::new();
    for i in 0..6 {
        let name = format!("placed-{i}");
        let sandbox = create_ready(&mut clients[0], &name).await;
        let id = sandbox.metadata.unwrap().id;
        expected.push((name, ring_owner(&ids, &id)));
    }
    let not_on_gw0 = expected.iter().filter(|(_, o)| o != "gw-0").count() as f64;
    assert_eq!(
        metric(
            &cluster.replicas[0],
            r#"openshell_server_session_redirects_total{reason="connect"}"#
        ),
        not_on_gw0
    );
    for (name, owner) in &expected {
        // Every replica reports the same owner: the ring owner.
        for client in clients.iter_mut() {
            let reported = owner_via(client, name).await;
            assert_eq!(reported.as_deref(), Some(owner.as_str()), "{name}");
        }
    }
    // An exec through every replica works; only the owner runs it locally.
    for (name, owner) in &expected {
        let before: Vec<(f64, f64)> = cluster
            .replicas
            .iter()
            .map(|gw| (route(gw, "local"), route(gw, "peer")))
            .collect();
        for client in clients.iter_mut() {
            let out = sh(client, name, "echo routed").await;
            assert_eq!(out.stdout_text(), "routed\n");
        }
        for (i, gw) in cluster.replicas.iter().enumerate() {
            let (local, peer) = (
                route(gw, "local") - before[i].0,
                route(gw, "peer") - before[i].1,
            );
            // The owner serves its own client's stream locally; the others
            // relay theirs to it (the owner's side of a relay is not a route).
            if format!("gw-{i}") == *owner {
                assert_eq!((local, peer), (1.0, 0.0), "owner {owner}");
            } else {
                assert_eq!((local, peer), (0.0, 1.0), "gw-{i} for {name}");
            }
        }
    }
}

#[tokio::test]
async fn sqlite_cluster_places_routes_and_reports_owners() {
    let cluster = TestCluster::start(options(3, None));
    placement_routing_and_owner_reporting(&cluster).await;
}

#[tokio::test]
async fn postgres_cluster_places_routes_and_reports_owners() {
    let pg = Postgres::start();
    let cluster = TestCluster::start(options(3, Some(pg.url())));
    placement_routing_and_owner_reporting(&cluster).await;
}

#[tokio::test]
async fn a_stopping_replica_redirects_its_supervisors_to_the_remaining_ring() {
    let exits = tempfile::tempdir().unwrap();
    let mut cluster = TestCluster::start(with_final_metrics(options(3, None), exits.path()));
    wait_ring(&cluster, 3.0).await;
    let mut gw0 = client(&cluster.replicas[0]).await;
    // A sandbox owned by a replica other than gw-0 (the supervisors' address).
    let ids = ["gw-0", "gw-1", "gw-2"];
    let mut chosen = None;
    for i in 0..12 {
        let name = format!("mover-{i}");
        let id = create_ready(&mut gw0, &name).await.metadata.unwrap().id;
        let owner = ring_owner(&ids, &id);
        if owner != "gw-0" {
            chosen = Some((name, id, owner));
            break;
        }
    }
    let (name, id, owner) = chosen.expect("a sandbox off gw-0");
    let remaining: Vec<&str> = ids.iter().copied().filter(|r| *r != owner).collect();
    let next = ring_owner(&remaining, &id);
    let held = metric(
        cluster.replica(&owner),
        "openshell_server_supervisor_sessions",
    );
    assert!(held >= 1.0, "{owner} holds no session");
    cluster.replica_mut(&owner).stop();
    // Every session it held was redirected, and counted as such.
    assert_eq!(final_metric(exits.path(), &owner, SHUTDOWN_REDIRECTS), held);

    let mut new_owner = None;
    for _ in 0..100 {
        new_owner = owner_via(&mut gw0, &name).await;
        if new_owner.as_deref() == Some(next.as_str()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(new_owner.as_deref(), Some(next.as_str()));
    assert_eq!(
        wait_phase(&mut gw0, &name, SandboxPhase::Ready)
            .await
            .metadata
            .unwrap()
            .id,
        id
    );
    assert_eq!(
        sh(&mut gw0, &name, "echo still here").await.stdout_text(),
        "still here\n"
    );
}

#[tokio::test]
async fn a_stranger_cannot_take_over_a_live_session() {
    let cluster = TestCluster::start(options(2, None));
    wait_ring(&cluster, 2.0).await;
    let mut gw0 = client(&cluster.replicas[0]).await;
    let sandbox = create_ready(&mut gw0, "guarded").await;
    let id = sandbox.metadata.unwrap().id;
    let owner = ring_owner(&["gw-0", "gw-1"], &id);
    let other = if owner == "gw-0" { "gw-1" } else { "gw-0" };
    let token = sandbox_token(&cluster.replicas[0].store_dir(), &id).expect("sandbox token");
    let mut as_supervisor = client_with(cluster.replica(other), Some(&token)).await;
    let hello = SupervisorMessage {
        payload: Some(supervisor_message::Payload::Hello(SupervisorHello {
            sandbox_id: id.clone(),
            instance_id: "a-stranger".into(),
            connection_epoch: 99,
            redirected: true,
            supports_session_redirect: true,
            ..Default::default()
        })),
    };
    let err = match as_supervisor
        .connect_supervisor(tokio_stream::iter(vec![hello]))
        .await
    {
        Err(status) => status,
        Ok(response) => response
            .into_inner()
            .message()
            .await
            .expect_err("a stranger is refused"),
    };
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("owned by another"), "{err:?}");
    // A refused redirected hello is no off-ring admission.
    assert_eq!(
        metric_value(&cluster.replica(other).metrics(), OFFRING_ADMISSIONS),
        Some(0.0)
    );
    // The real session is untouched.
    assert_eq!(
        owner_via(&mut gw0, "guarded").await.as_deref(),
        Some(owner.as_str())
    );
    assert_eq!(
        sh(&mut gw0, "guarded", "echo mine").await.stdout_text(),
        "mine\n"
    );
}

#[tokio::test]
async fn a_redirected_supervisor_off_its_ring_owner_is_admitted_and_counted() {
    // No supervisors of our own: the test speaks for the sandbox.
    let mut opts = options(2, None);
    opts.extra_args
        .extend(["--driver", "none"].map(String::from));
    let cluster = TestCluster::start(opts);
    wait_ring(&cluster, 2.0).await;
    let mut gw0 = client(&cluster.replicas[0]).await;
    let sandbox = gw0
        .create_sandbox(CreateSandboxRequest {
            name: "landed".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    let id = sandbox.metadata.unwrap().id;
    let owner = ring_owner(&["gw-0", "gw-1"], &id);
    let other = if owner == "gw-0" { "gw-1" } else { "gw-0" };
    let token = sandbox_token(&cluster.replicas[0].store_dir(), &id).expect("sandbox token");
    let hello = |redirected: bool| SupervisorMessage {
        payload: Some(supervisor_message::Payload::Hello(SupervisorHello {
            sandbox_id: id.clone(),
            instance_id: "landed-supervisor".into(),
            connection_epoch: 1,
            redirected,
            supports_session_redirect: true,
            ..Default::default()
        })),
    };
    let first = |gw: &'static str, redirected: bool| {
        let (cluster, token, hello) = (&cluster, &token, hello(redirected));
        async move {
            let mut supervisor = client_with(cluster.replica(gw), Some(token)).await;
            let mut inbound = supervisor
                .connect_supervisor(tokio_stream::iter(vec![hello]))
                .await
                .expect("session")
                .into_inner();
            inbound.message().await.unwrap().unwrap().payload
        }
    };

    // Not yet redirected: sent to the ring owner, nothing admitted.
    match first(other, false).await {
        Some(gateway_message::Payload::SessionRedirect(redirect)) => {
            assert_eq!(redirect.owner_replica_id, owner);
        }
        other => panic!("expected a redirect, got {other:?}"),
    }
    assert_eq!(
        metric(cluster.replica(other), OFFRING_ADMISSIONS),
        0.0,
        "a redirect is no admission"
    );
    // Redirected, but landing off the ring owner (the ring changed in
    // between, as it does in a rolling restart): admitted where it landed,
    // and counted there only.
    assert!(
        matches!(
            first(other, true).await,
            Some(gateway_message::Payload::SessionAccepted(_))
        ),
        "a redirected supervisor is admitted where it lands"
    );
    assert_eq!(metric(cluster.replica(other), OFFRING_ADMISSIONS), 1.0);
    assert_eq!(metric(cluster.replica(&owner), OFFRING_ADMISSIONS), 0.0);
}

#[tokio::test]
async fn dead_replicas_leave_the_ring_and_a_hung_database_clears_it() {
    let pg = Postgres::start();
    let mut cluster = TestCluster::start(options(2, Some(pg.url())));
    wait_ring(&cluster, 2.0).await;

    // A replica killed without leaving drops out once its row is older than
    // the TTL by the database's clock.
    cluster.replica_mut("gw-1").kill();
    let gw0 = cluster.replica("gw-0");
    assert!(
        eventually(Duration::from_secs(15), || metric(
            gw0,
            "openshell_server_ring_members"
        ) == 1.0)
        .await,
        "{}",
        gw0.metrics()
    );

    // A database that hangs (SIGSTOP) makes every membership call time out;
    // after the TTL the ring is cleared rather than trusted, and the replica
    // is fenced: not ready, and its gRPC port refuses connections.
    let ready = |gw: &Gateway| openshell_testkit::http_get(gw.metrics_addr, "/readyz");
    assert_eq!(ready(gw0), "ready\n");
    assert!(std::net::TcpStream::connect(gw0.grpc_addr).is_ok());
    pg.pause();
    let cleared = eventually(Duration::from_secs(20), || {
        metric(gw0, "openshell_server_ring_members") == 0.0
    })
    .await;
    let fenced = cleared
        && eventually(Duration::from_secs(5), || {
            std::net::TcpStream::connect(gw0.grpc_addr).is_err()
        })
        .await;
    let not_ready = ready(gw0);
    pg.resume();
    assert!(
        cleared,
        "ring not cleared while the database hung:\n{}",
        gw0.metrics()
    );
    assert!(fenced, "a fenced replica still accepts connections");
    assert_eq!(not_ready, "not ready\n");
    assert!(
        eventually(Duration::from_secs(15), || metric(
            gw0,
            "openshell_server_ring_members"
        ) == 1.0)
        .await,
        "ring did not come back after the database did"
    );
    assert!(
        eventually(Duration::from_secs(5), || {
            std::net::TcpStream::connect(gw0.grpc_addr).is_ok()
        })
        .await,
        "the replica did not listen again once its membership was back"
    );
    assert_eq!(ready(gw0), "ready\n");
    client(gw0)
        .await
        .list_sandboxes(ListSandboxesRequest::default())
        .await
        .expect("calls are served again");
}

#[tokio::test]
async fn the_peer_service_answers_only_replicas() {
    use openshell_proto::peer::peer_client::PeerClient;
    use openshell_proto::peer::{PeerRelayFrame, PeerRelayInit, peer_relay_frame};
    use tonic::transport::Channel;

    let cluster = TestCluster::start(options(2, None));
    let gw = &cluster.replicas[0];
    let channel = Channel::from_shared(gw.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let init = |requester: &str| PeerRelayFrame {
        payload: Some(peer_relay_frame::Payload::Init(PeerRelayInit {
            sandbox_id: "00000000-0000-0000-0000-000000000000".into(),
            relay_open: None,
            requester_replica_id: requester.into(),
            ..Default::default()
        })),
    };
    let call =
        |token: Option<String>, replica: Option<&'static str>, frames: Vec<PeerRelayFrame>| {
            let channel = channel.clone();
            async move {
                let mut request = tonic::Request::new(tokio_stream::iter(frames));
                if let Some(token) = token {
                    request
                        .metadata_mut()
                        .insert("authorization", format!("Bearer {token}").parse().unwrap());
                }
                if let Some(replica) = replica {
                    request
                        .metadata_mut()
                        .insert("x-openshell-peer-replica", replica.parse().unwrap());
                }
                match PeerClient::new(channel).peer_relay(request).await {
                    Err(status) => status,
                    Ok(response) => response.into_inner().message().await.expect_err("refused"),
                }
            }
        };
    // A user token, no token, or a wrong peer token: not a replica.
    let err = call(Some(TOKEN.into()), Some("gw-1"), vec![init("gw-1")]).await;
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let err = call(None, Some("gw-1"), vec![init("gw-1")]).await;
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let err = call(
        Some("not-the-peer-token".into()),
        Some("gw-1"),
        vec![init("gw-1")],
    )
    .await;
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(!err.message().contains("not-the-peer-token"));
    // The right token must name the calling replica, and the init must agree.
    let token = Some(cluster.peer_token.clone());
    let err = call(token.clone(), None, vec![init("gw-1")]).await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = call(token.clone(), Some("gw-1"), vec![init("gw-2")]).await;
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // The first frame must be init; an init needs a target.
    let data = PeerRelayFrame {
        payload: Some(peer_relay_frame::Payload::Frame(RelayFrame::default())),
    };
    let err = call(token.clone(), Some("gw-1"), vec![data]).await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = call(token, Some("gw-1"), vec![init("gw-1")]).await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    // A single replica without a peer token has no peer service at all.
    let single = Gateway::start(openshell_testkit::GatewayOptions::with_token(TOKEN));
    let channel = Channel::from_shared(single.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut request = tonic::Request::new(tokio_stream::iter(vec![init("gw-1")]));
    request
        .metadata_mut()
        .insert("authorization", "Bearer anything".parse().unwrap());
    let err = match PeerClient::new(channel).peer_relay(request).await {
        Err(status) => status,
        Ok(_) => panic!("a single replica answered the peer service"),
    };
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
}

/// Every sandbox reported (through `client`) on its ring owner, within `limit`.
async fn all_on_ring_owner(
    client: &mut Client,
    sandboxes: &[(String, String)],
    ring: &[&str],
    limit: Duration,
) -> Vec<String> {
    let started = std::time::Instant::now();
    loop {
        let mut off = Vec::new();
        for (name, id) in sandboxes {
            let want = ring_owner(ring, id);
            if owner_via(client, name).await.as_deref() != Some(want.as_str()) {
                off.push(name.clone());
            }
        }
        if off.is_empty() || started.elapsed() > limit {
            return off;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits (up to `limit`) until every sandbox is reported on its ring owner
/// and every replica holds exactly the sessions of the sandboxes it owns,
/// so that no session is still on its way home (sent home by a rebalance,
/// its old stream not yet closed where it was). Returns what is still off.
async fn wait_all_home(
    cluster: &TestCluster,
    client: &mut Client,
    sandboxes: &[(String, String)],
    ring: &[&str],
    limit: Duration,
) -> Vec<String> {
    let started = std::time::Instant::now();
    loop {
        let mut off = all_on_ring_owner(client, sandboxes, ring, Duration::ZERO).await;
        for replica in ring {
            let owned = sandboxes
                .iter()
                .filter(|(_, id)| ring_owner(ring, id) == *replica)
                .count() as f64;
            let held = metric(
                cluster.replica(replica),
                "openshell_server_supervisor_sessions",
            );
            if held != owned {
                off.push(format!("{replica} holds {held} sessions, owns {owned}"));
            }
        }
        if off.is_empty() || started.elapsed() > limit {
            return off;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_rolling_restart_loses_nothing_and_ends_on_the_ring() {
    let exits = tempfile::tempdir().unwrap();
    let mut cluster = TestCluster::start(with_final_metrics(options(3, None), exits.path()));
    wait_ring(&cluster, 3.0).await;
    let ring = ["gw-0", "gw-1", "gw-2"];
    let mut sandboxes = Vec::new();
    {
        let mut gw0 = client(&cluster.replicas[0]).await;
        for i in 0..30 {
            let name = format!("roll-{i}");
            let sandbox = create_ready(&mut gw0, &name).await;
            sandboxes.push((name, sandbox.metadata.unwrap().id));
        }
        assert!(
            all_on_ring_owner(&mut gw0, &sandboxes, &ring, Duration::from_secs(10))
                .await
                .is_empty()
        );
    }
    for replica in ring {
        // The replica that stays up answers while this one restarts.
        let other = if replica == "gw-0" { 1 } else { 0 };
        // The sessions the last restart sent elsewhere go home only on the
        // others' next rebalance ticks after it rejoined: read what this
        // replica holds once they have all arrived (and left where they
        // were), or a homecoming between the read and the stop makes the
        // shutdown redirect fewer sessions than were counted.
        let mut via = client(&cluster.replicas[other]).await;
        let off = wait_all_home(
            &cluster,
            &mut via,
            &sandboxes,
            &ring,
            Duration::from_secs(30),
        )
        .await;
        assert!(
            off.is_empty(),
            "before stopping {replica}, not home: {off:?}"
        );
        let held = metric(
            cluster.replica(replica),
            "openshell_server_supervisor_sessions",
        );
        cluster.replica_mut(replica).stop();
        assert_eq!(
            final_metric(exits.path(), replica, SHUTDOWN_REDIRECTS),
            held,
            "{replica}: the shutdown redirect count matches its sessions"
        );
        cluster.replica_mut(replica).restart();
        wait_ring(&cluster, 3.0).await;
        let mut client = client(&cluster.replicas[other]).await;
        let listed = client
            .list_sandboxes(ListSandboxesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .sandboxes
            .len();
        assert_eq!(listed, 30, "no sandbox lost after restarting {replica}");
    }
    let mut gw1 = client(&cluster.replicas[1]).await;
    let off = all_on_ring_owner(&mut gw1, &sandboxes, &ring, Duration::from_secs(30)).await;
    assert!(off.is_empty(), "not back on their ring owner: {off:?}");
    for (name, _) in &sandboxes {
        assert_eq!(
            sh(&mut gw1, name, "echo ok").await.stdout_text(),
            "ok\n",
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_killed_owner_s_sandboxes_come_back_on_the_survivors() {
    let mut cluster = TestCluster::start(options(3, None));
    wait_ring(&cluster, 3.0).await;
    let ring = ["gw-0", "gw-1", "gw-2"];
    let mut gw0 = client(&cluster.replicas[0]).await;
    // Sandboxes owned by gw-2 (the supervisors' address is gw-0's).
    // Random ids: create until gw-2 owns a few (bounded; a third of the
    // ring is gw-2's, so 40 creates leave it none with odds below 1e-7).
    let mut victims = Vec::new();
    for i in 0..40 {
        let name = format!("orphan-{i}");
        let id = create_ready(&mut gw0, &name).await.metadata.unwrap().id;
        if ring_owner(&ring, &id) == "gw-2" {
            victims.push((name, id));
        }
        if i >= 11 && victims.len() >= 2 {
            break;
        }
    }
    assert!(!victims.is_empty());
    cluster.replica_mut("gw-2").kill();
    let survivors = ["gw-0", "gw-1"];
    let off = all_on_ring_owner(&mut gw0, &victims, &survivors, Duration::from_secs(60)).await;
    assert!(off.is_empty(), "not re-homed after kill -9: {off:?}");
    for (name, _) in &victims {
        wait_phase(&mut gw0, name, SandboxPhase::Ready).await;
        assert_eq!(
            sh(&mut gw0, name, "echo back").await.stdout_text(),
            "back\n"
        );
    }
}

async fn client_with_url(
    url: &str,
) -> openshell_proto::open_shell_client::OpenShellClient<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    openshell_proto::open_shell_client::OpenShellClient::new(channel)
}

/// libfaketime from Debian's `faketime` package (make test installs it).
fn libfaketime() -> String {
    let path = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
    assert!(
        std::path::Path::new(path).exists(),
        "{path} is missing: install faketime (make test does)"
    );
    path.to_owned()
}

#[tokio::test]
async fn a_skewed_clock_neither_keeps_a_dead_replica_nor_drops_a_live_one() {
    // PostgreSQL's clock judges freshness: gw-1 runs ten minutes ahead, gw-2
    // ten minutes behind (libfaketime; monotonic time left alone).
    let pg = Postgres::start();
    // `env` execs the gateway itself (the `faketime` wrapper would fork, and
    // the test must stop the gateway by its own PID).
    let faketime = |offset: &str| {
        vec![
            "env".to_owned(),
            format!("LD_PRELOAD={}", libfaketime()),
            format!("FAKETIME={offset}"),
            "DONT_FAKE_MONOTONIC=1".to_owned(),
        ]
    };
    let mut opts = options(2, Some(pg.url()));
    opts.launcher = Some((1, faketime("+600s")));
    let mut cluster = TestCluster::start(opts);
    // A third replica, ten minutes behind.
    let behind = Gateway::start(openshell_testkit::GatewayOptions {
        tokens: vec![TOKEN.into()],
        replica_id: Some("gw-2".into()),
        data_dir: Some(cluster.shared_dir().join("data")),
        database_url: Some(pg.url()),
        peer_token: Some(cluster.peer_token.clone()),
        extra_args: options(1, None).extra_args,
        launcher: faketime("-600s"),
        ..Default::default()
    });
    // The skew is real: the replicas' HTTP Date headers are 10 minutes apart.
    let seconds_of_day = |gw: &Gateway| {
        let gw_url = gw.url.clone();
        async move {
            let mut client = client_with_url(&gw_url).await;
            let response = client.health(HealthRequest {}).await.unwrap();
            let date = response
                .metadata()
                .get("date")
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned();
            // "Mon, 30 Nov 2026 07:21:05 GMT"
            let hms: Vec<i64> = date
                .split(' ')
                .nth(4)
                .unwrap()
                .split(':')
                .map(|p| p.parse().unwrap())
                .collect();
            hms[0] * 3600 + hms[1] * 60 + hms[2]
        }
    };
    let skew = (seconds_of_day(cluster.replica("gw-1")).await
        - seconds_of_day(cluster.replica("gw-0")).await)
        .rem_euclid(86_400);
    assert!((590..=610).contains(&skew), "gw-1 is {skew} s ahead");
    // Everyone sees everyone, and keeps seeing everyone: sampled all along
    // two member TTLs (3 s each, 20 refreshes), no replica's view ever drops
    // a member, whatever its clock says.
    wait_ring(&cluster, 3.0).await;
    assert!(
        eventually(Duration::from_secs(10), || metric(
            &behind,
            "openshell_server_ring_members"
        ) == 3.0)
        .await
    );
    let span = std::time::Instant::now();
    while span.elapsed() < Duration::from_secs(6) {
        for gw in cluster.replicas.iter().chain([&behind]) {
            let seen = metric(gw, "openshell_server_ring_members");
            assert_eq!(seen, 3.0, "a replica's ring dropped a member");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The fast replica dies: the others drop it within the TTL.
    cluster.replica_mut("gw-1").kill();
    for gw in [cluster.replica("gw-0"), &behind] {
        assert!(
            eventually(Duration::from_secs(15), || metric(
                gw,
                "openshell_server_ring_members"
            ) == 2.0)
            .await,
            "a dead replica with a fast clock stayed in the ring"
        );
    }
    drop(behind);
    let gw0 = cluster.replica("gw-0");
    assert!(
        eventually(Duration::from_secs(15), || metric(
            gw0,
            "openshell_server_ring_members"
        ) == 1.0)
        .await,
        "a dead replica with a slow clock stayed in the ring"
    );
}

#[tokio::test]
async fn a_dropped_supervisor_connection_comes_back_to_the_same_owner() {
    let mut opts = options(3, None);
    opts.extra_args
        .extend(["--heartbeat-ms".to_owned(), "1000".to_owned()]);
    let cluster = TestCluster::start(opts);
    wait_ring(&cluster, 3.0).await;
    let ring = ["gw-0", "gw-1", "gw-2"];
    let mut gw0 = client(&cluster.replicas[0]).await;
    let id = create_ready(&mut gw0, "steady").await.metadata.unwrap().id;
    let owner = ring_owner(&ring, &id);
    assert_eq!(
        owner_via(&mut gw0, "steady").await.as_deref(),
        Some(owner.as_str())
    );
    let holder = cluster.replica(&owner);
    let accepted_before = metric(holder, "openshell_server_supervisor_sessions");
    assert_eq!(accepted_before, 1.0);
    // Freeze the supervisor past the idle limit: the owner closes the session.
    let pid = cluster.replicas[0].supervisor_pids()[0];
    openshell_testkit::signal(pid, libc::SIGSTOP);
    let closed = eventually(Duration::from_secs(30), || {
        metric(holder, "openshell_server_supervisor_sessions") == 0.0
    })
    .await;
    assert!(closed, "the idle session was not closed");
    // Lost, not replaced: the sandbox shows UNKNOWN until it is back (asked
    // of the replica that held the session).
    let mut at_owner = client(holder).await;
    wait_phase(&mut at_owner, "steady", SandboxPhase::Unknown).await;
    openshell_testkit::signal(pid, libc::SIGCONT);
    // It reconnects (through gw-0, redirected) to the same owner.
    assert!(
        eventually(Duration::from_secs(30), || metric(
            holder,
            "openshell_server_supervisor_sessions"
        ) == 1.0)
        .await
    );
    assert_eq!(
        owner_via(&mut gw0, "steady").await.as_deref(),
        Some(owner.as_str())
    );
    // READY again, and it stays so: the lost session's end never marks the
    // reconnected sandbox UNKNOWN.
    wait_phase(&mut at_owner, "steady", SandboxPhase::Ready).await;
    assert_eq!(
        sh(&mut gw0, "steady", "echo same").await.stdout_text(),
        "same\n"
    );
}

/// A cluster of one reports no owner: there is no other replica to route
/// to, so clients should not pay for hints (docs/ARCHITECTURE.md section 4).
#[tokio::test]
async fn a_cluster_of_one_reports_no_owner() {
    let cluster = TestCluster::start(options(1, None));
    wait_ring(&cluster, 1.0).await;
    let mut client = client(&cluster.replicas[0]).await;
    create_ready(&mut client, "alone").await;
    assert_eq!(owner_via(&mut client, "alone").await, None);
    // The exec works all the same, served where the session is.
    assert_eq!(
        sh(&mut client, "alone", "echo ok").await.stdout_text(),
        "ok\n"
    );
}
