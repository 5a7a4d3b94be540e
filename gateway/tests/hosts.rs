//! Shared supervisor hosts against real replicas: placement with the ring
//! and the cap (hosts arriving at once, `stay`, a stopping replica handing
//! its hosts off, restarts and rolls), sandbox sessions inside a host
//! session, and what a host token may and may not do.
//!
//! The host side is a small raw `ConnectHost` client (`common/raw_host.rs`,
//! tonic stubs of `openshell_proto::supervisor_host`): it follows redirects
//! with `stay`, beats, and speaks sandbox sessions in envelopes. Exec and forward to a
//! pooled sandbox need a host that serves relays (the reference supervisor's
//! host mode); `hosts_e2e.rs` tests them with real host processes.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::raw_host::*;
use common::*;
use openshell_proto::supervisor_host::supervisor_host_client::SupervisorHostClient;
use openshell_proto::supervisor_host::{
    HostHeartbeat, HostMessage, host_gateway_message, host_message,
};
use openshell_proto::*;
use openshell_testkit::cluster::{ClusterOptions, Postgres, TestCluster, ring_owner};
use openshell_testkit::{
    Gateway, GatewayOptions, eventually, issue_host_token, issue_host_token_in_database,
    metric_value, sandbox_token,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::Channel;

const HOSTS_HELD: &str = "openshell_server_supervisor_hosts";
const INSTANCES_MAX: &str = "openshell_server_supervisor_host_instances_max";

fn cluster_options(replicas: usize) -> ClusterOptions {
    ClusterOptions {
        replicas,
        tokens: vec![TOKEN.into()],
        extra_args: [
            "--allow-test-flags",
            "--member-refresh-ms",
            "300",
            "--member-ttl-ms",
            "3000",
            "--driver",
            "hosts",
        ]
        .map(String::from)
        .to_vec(),
        ..ClusterOptions::default()
    }
}

fn metric(gw: &Gateway, sample: &str) -> f64 {
    metric_value(&gw.metrics(), sample).unwrap_or(0.0)
}

async fn wait_ring(cluster: &TestCluster, members: f64) {
    for gw in cluster.replicas.iter().filter(|gw| gw.pid().is_some()) {
        let ok = eventually(Duration::from_secs(15), || {
            metric(gw, "openshell_server_ring_members") == members
        })
        .await;
        assert!(ok, "ring never reached {members} members");
    }
}

// ------------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_arriving_at_once_never_overfill_a_replica() {
    let cluster = TestCluster::start(cluster_options(3));
    let data = cluster.shared_dir().join("data");
    let creds = tokens(&data, 7);
    let shared = cluster.replicas[0].url.clone();
    seven_hosts_on_three_replicas(&cluster, &shared, creds).await;
}

/// The deployment's shape: hosts dial the edge (the shared address), which
/// hands each hello to any replica; redirects name the replicas directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_arriving_at_once_through_the_edge_never_overfill_a_replica() {
    let cluster = TestCluster::start(cluster_options(3));
    let routes: Vec<(String, String)> = cluster
        .ids()
        .into_iter()
        .zip(cluster.replicas.iter().map(|g| g.url.clone()))
        .collect();
    let routes: Vec<(&str, &str)> = routes
        .iter()
        .map(|(id, url)| (id.as_str(), url.as_str()))
        .collect();
    let edge = openshell_testkit::Edge::start(&routes);
    let data = cluster.shared_dir().join("data");
    let creds = tokens(&data, 7);
    seven_hosts_on_three_replicas(&cluster, &edge.url, creds).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_arriving_at_once_never_overfill_a_replica_on_postgres() {
    let pg = Postgres::start();
    let mut options = cluster_options(3);
    options.database_url = Some(pg.url());
    let cluster = TestCluster::start(options);
    let creds = (0..7)
        .map(|i| {
            let id = format!("h-{i}");
            let token = issue_host_token_in_database(&pg.url(), cluster.shared_dir(), &id);
            (id, token)
        })
        .collect();
    let shared = cluster.replicas[0].url.clone();
    seven_hosts_on_three_replicas(&cluster, &shared, creds).await;
}

async fn seven_hosts_on_three_replicas(
    cluster: &TestCluster,
    shared: &str,
    creds: Vec<(String, String)>,
) {
    wait_ring(cluster, 3.0).await;
    let mut arrivals = Vec::new();
    for (id, token) in creds {
        let shared = shared.to_owned();
        arrivals.push(tokio::spawn(async move {
            connect(&shared, &token, &id, false, 0)
                .await
                .expect("connect")
        }));
    }
    let mut sessions = Vec::new();
    for arrival in arrivals {
        sessions.push(arrival.await.unwrap());
    }
    let mut counts: HashMap<String, usize> = HashMap::new();
    for (session, _) in &sessions {
        *counts.entry(session.replica.clone()).or_insert(0) += 1;
    }
    assert!(counts.values().all(|n| *n <= 3), "{counts:?}");
    assert_eq!(counts.values().sum::<usize>(), 7);
    // The replicas agree: each holds what the hosts say, none above 3.
    for (i, gw) in cluster.replicas.iter().enumerate() {
        let id = format!("gw-{i}");
        let want = counts.get(&id).copied().unwrap_or(0) as f64;
        assert_eq!(metric(gw, HOSTS_HELD), want, "{id}");
    }
    if shared == cluster.replicas[0].url {
        // One replica's address for all: at most 3 stay, the rest moved.
        let redirected = sessions.iter().filter(|(_, hops)| *hops > 0).count();
        assert!(redirected >= 4, "{redirected} redirected");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stay_is_accepted_where_it_lands_and_placement_fills_the_rest() {
    let cluster = TestCluster::start(cluster_options(2));
    wait_ring(&cluster, 2.0).await;
    let data = cluster.shared_dir().join("data");
    let hosts = tokens(&data, 3);
    let gw0 = cluster.replicas[0].url.clone();
    // Two hosts that ask to stay are both kept on gw-0 (above the cap).
    let (a, hops_a) = connect(&gw0, &hosts[0].1, &hosts[0].0, true, 0)
        .await
        .unwrap();
    let (b, hops_b) = connect(&gw0, &hosts[1].1, &hosts[1].0, true, 0)
        .await
        .unwrap();
    assert_eq!((hops_a, hops_b), (0, 0));
    assert_eq!((a.replica.as_str(), b.replica.as_str()), ("gw-0", "gw-0"));
    // A third without stay: gw-0 is at the cap (2 of ceil(3/2)), so it is
    // redirected to gw-1 before any session starts, and accepted there.
    let (c, hops_c) = connect(&gw0, &hosts[2].1, &hosts[2].0, false, 0)
        .await
        .unwrap();
    assert_eq!(hops_c, 1);
    assert_eq!(c.replica, "gw-1");
    assert_eq!(metric(&cluster.replicas[0], HOSTS_HELD), 2.0);
    assert_eq!(metric(&cluster.replicas[1], HOSTS_HELD), 1.0);
    assert_eq!(
        metric(
            &cluster.replicas[0],
            r#"openshell_server_session_redirects_total{reason="host_connect"}"#
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopping_replica_redirects_its_hosts_below_the_cap() {
    let mut cluster = TestCluster::start(cluster_options(3));
    wait_ring(&cluster, 3.0).await;
    let data = cluster.shared_dir().join("data");
    let shared = cluster.replicas[0].url.clone();
    let mut sessions = Vec::new();
    for (id, token) in tokens(&data, 3) {
        sessions.push(connect(&shared, &token, &id, false, 0).await.unwrap().0);
    }
    let mut held: Vec<String> = sessions.iter().map(|s| s.replica.clone()).collect();
    held.sort();
    assert_eq!(held, ["gw-0", "gw-1", "gw-2"], "three hosts, one each");
    let leaving = sessions[0].replica.clone();
    let others: Vec<String> = cluster
        .ids()
        .into_iter()
        .filter(|r| *r != leaving)
        .collect();
    cluster.replica_mut(&leaving).stop();
    // Its host is told where to go before its stream ends.
    let redirect = loop {
        match sessions[0].next().await {
            Some(host_gateway_message::Payload::Redirect(redirect)) => break redirect,
            Some(_) => continue,
            None => panic!("the stopping replica ended the host stream without a redirect"),
        }
    };
    assert!(others.contains(&redirect.replica_id), "{redirect:?}");
    assert_eq!(
        redirect.peer_endpoint,
        cluster.replica(&redirect.replica_id).url
    );
    let token = issue_host_token(&data, "h-0");
    let (moved, hops) = connect(&redirect.peer_endpoint, &token, "h-0", true, 0)
        .await
        .unwrap();
    assert_eq!(hops, 0);
    assert_eq!(moved.replica, redirect.replica_id);
    // Cap ceil(3/2) = 2: nobody above it.
    for id in &others {
        let n = metric(cluster.replica(id), HOSTS_HELD);
        assert!(n <= 2.0, "{id} holds {n}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn host_restarts_spread_hosts_and_rolls_keep_them_served() {
    let mut cluster = TestCluster::start(cluster_options(2));
    wait_ring(&cluster, 2.0).await;
    let data = cluster.shared_dir().join("data");
    let creds = tokens(&data, 2);
    let live_urls = |cluster: &TestCluster| -> Vec<String> {
        cluster
            .live_ids()
            .iter()
            .map(|id| cluster.replica(id).url.clone())
            .collect()
    };
    let mut hosts: Vec<RunningHost> = Vec::new();
    for run in 0..3 {
        // Restart each host: it arrives without `stay` and is placed below
        // the cap, on the replica the other host is not on.
        for (i, (id, token)) in creds.iter().enumerate() {
            let host = RunningHost::start(live_urls(&cluster), token.clone(), id.clone());
            if i < hosts.len() {
                hosts[i] = host;
            } else {
                hosts.push(host);
            }
            let ok = eventually(Duration::from_secs(30), || hosts[i].replica().is_some()).await;
            assert!(ok, "run {run}: {id} not accepted after its restart");
        }
        let counts = placement_of(&hosts).await;
        assert_eq!(
            counts.values().copied().collect::<Vec<_>>(),
            [1, 1],
            "run {run}: {counts:?}"
        );
        // Roll the replicas with surge, as a Deployment does: a new replica
        // id joins before each old one stops. The stopping replica hands its
        // host to the first replica below the cap on the ring without it:
        // the new one, since the other old replica already holds one.
        let old = cluster.live_ids();
        let mut new = Vec::new();
        for id in &old {
            let added = cluster.add_replica();
            wait_ring(&cluster, 3.0).await;
            cluster.replica_mut(id).stop();
            let moved = eventually(Duration::from_secs(30), || {
                hosts.iter().all(|h| h.replica().is_some_and(|r| r != *id))
            })
            .await;
            assert!(moved, "run {run}: a host is still on {id} after it stopped");
            wait_ring(&cluster, 2.0).await;
            new.push(added);
        }
        // One host on each new replica.
        let counts = placement_of(&hosts).await;
        for id in &new {
            assert_eq!(counts.get(id), Some(&1), "run {run}: {counts:?}");
            let held = eventually(Duration::from_secs(10), || {
                metric(cluster.replica(id), HOSTS_HELD) == 1.0
            })
            .await;
            assert!(held, "run {run}: {id} does not hold exactly one host");
        }
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hosts_sandbox_session_rides_its_stream_and_reports_its_replica() {
    let cluster = TestCluster::start(cluster_options(2));
    wait_ring(&cluster, 2.0).await;
    let data = cluster.shared_dir().join("data");
    let creds = tokens(&data, 1);
    let (mut host, _) = connect(&cluster.replicas[0].url, &creds[0].1, "h-0", false, 0)
        .await
        .unwrap();
    let holder = host.replica.clone();
    let other = cluster.ids().into_iter().find(|r| *r != holder).unwrap();
    let mut user = client(cluster.replica(&other)).await;
    // A sandbox whose ring owner is the other replica: were its session
    // one of its own, the rebalancer would send it there.
    let mut names = Vec::new();
    let mut target = None;
    for n in 0..20 {
        let name = format!("pooled-{n}");
        let created = user
            .create_sandbox(CreateSandboxRequest {
                name: name.clone(),
                ..Default::default()
            })
            .await
            .expect("create on a pooled cluster")
            .into_inner()
            .sandbox
            .unwrap();
        names.push(name.clone());
        let id = created.metadata.unwrap().id;
        if ring_owner(&["gw-0", "gw-1"], &id) == other {
            target = Some((name, id));
            break;
        }
    }
    let (name, id) = target.expect("one of 20 sandboxes is owned by the other replica");
    // Created on the other replica, announced to the host within a second
    // or two (the holder re-reads its assignment every second).
    host.assignment_where(|ids| ids.contains(&id)).await;
    assert_eq!(
        metric(cluster.replica(&holder), INSTANCES_MAX),
        names.len() as f64
    );
    host.sandbox_hello(&id).await;
    match host.sandbox_message(&id).await {
        Some(gateway_message::Payload::SessionAccepted(accepted)) => {
            assert!(!accepted.session_id.is_empty());
        }
        other => panic!("expected SessionAccepted, got {other:?}"),
    }
    wait_phase(&mut user, &name, SandboxPhase::Ready).await;
    // Owner reporting points at the replica holding the host's session,
    // asked of either replica.
    assert_eq!(owner_via(&mut user, &name).await, Some(holder.clone()));
    let mut on_holder = client(cluster.replica(&holder)).await;
    assert_eq!(owner_via(&mut on_holder, &name).await, Some(holder.clone()));
    // Several rebalancer rounds later (every 300 ms, sessions older than
    // 600 ms) the session is still inside the host's stream on the holder:
    // neither it nor the host session was sent anywhere.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(owner_via(&mut user, &name).await, Some(holder.clone()));
    assert_eq!(
        metric(
            cluster.replica(&holder),
            r#"openshell_server_session_redirects_total{reason="rebalance"}"#
        ),
        0.0
    );
    // A second hello replaces the sandbox's session; the replaced one's end
    // never reaches the host (it would end the new one).
    host.sandbox_hello(&id).await;
    match host.sandbox_message(&id).await {
        Some(gateway_message::Payload::SessionAccepted(_)) => {}
        other => panic!("expected SessionAccepted, got {other:?}"),
    }
    if let Ok(message) =
        tokio::time::timeout(Duration::from_millis(1500), host.sandbox_message(&id)).await
    {
        assert!(
            message.is_some(),
            "the replaced session's end reached the host"
        );
    }
    assert_eq!(owner_via(&mut user, &name).await, Some(holder.clone()));
    // A sandbox that is not assigned to this host: rejected, then ended.
    let stranger = "00000000-0000-4000-8000-000000000000";
    host.sandbox_hello(stranger).await;
    match host.sandbox_message(stranger).await {
        Some(gateway_message::Payload::SessionRejected(rejected)) => {
            assert!(rejected.reason.contains("not assigned"), "{rejected:?}");
        }
        other => panic!("expected SessionRejected, got {other:?}"),
    }
    assert!(host.sandbox_message(stranger).await.is_none());
    // Deleting the sandbox takes it out of the assignment and ends its
    // session inside the host stream.
    user.delete_sandbox(DeleteSandboxRequest {
        name: name.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let (mut ended, mut unassigned) = (false, false);
    for _ in 0..200 {
        if ended && unassigned {
            break;
        }
        match host.next().await {
            Some(host_gateway_message::Payload::Sandbox(envelope)) if envelope.sandbox_id == id => {
                ended |= envelope.end;
            }
            Some(host_gateway_message::Payload::Assignment(assignment)) => {
                unassigned = assignment.sandboxes.iter().all(|s| s.sandbox_id != id);
            }
            Some(_) => {}
            None => panic!("the host stream ended"),
        }
    }
    assert!(ended, "the deleted sandbox's session did not end");
    assert!(unassigned, "the deleted sandbox stayed in the assignment");
}

// ------------------------------------------------------------------- tokens

fn pooled_gateway() -> Gateway {
    Gateway::start(GatewayOptions {
        tokens: vec![TOKEN.into()],
        // testkit's gateways keep sandbox tokens readable (tests only).
        extra_args: ["--allow-test-flags", "--driver", "hosts"]
            .map(String::from)
            .to_vec(),
        ..GatewayOptions::default()
    })
}

async fn config_for(gw: &Gateway, token: &str, sandbox_id: &str) -> Result<(), tonic::Status> {
    let mut client = client_with(gw, Some(token)).await;
    client
        .get_sandbox_config(openshell_proto::sandbox::GetSandboxConfigRequest {
            sandbox_id: sandbox_id.to_owned(),
        })
        .await
        .map(|_| ())
}

async fn provider_env_for(
    gw: &Gateway,
    token: &str,
    sandbox_id: &str,
) -> Result<(), tonic::Status> {
    let mut client = client_with(gw, Some(token)).await;
    client
        .get_sandbox_provider_environment(GetSandboxProviderEnvironmentRequest {
            sandbox_id: sandbox_id.to_owned(),
        })
        .await
        .map(|_| ())
}

/// Claims relay `channel_id` with `token`: the gateway's answer.
async fn claim(gw: &Gateway, token: &str, channel_id: &str) -> Result<(), tonic::Status> {
    let mut client = client_with(gw, Some(token)).await;
    let (tx, rx) = mpsc::channel(4);
    tx.send(RelayFrame {
        payload: Some(relay_frame::Payload::Init(RelayInit {
            channel_id: channel_id.to_owned(),
        })),
    })
    .await
    .unwrap();
    let mut stream = client
        .relay_stream(ReceiverStream::new(rx))
        .await?
        .into_inner();
    // A refused claim may arrive as the stream's first answer.
    match tokio::time::timeout(Duration::from_millis(500), stream.message()).await {
        Ok(Err(status)) => Err(status),
        _ => {
            drop(tx);
            Ok(())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_token_acts_only_as_its_host_for_its_sandboxes() {
    let gw = pooled_gateway();
    let mut user = client(&gw).await;
    // No host connected: nowhere to put a sandbox.
    let err = user
        .create_sandbox(CreateSandboxRequest {
            name: "nowhere".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("no supervisor host"), "{err:?}");
    let creds = tokens(&gw.store_dir(), 2);
    let (a_id, a_token) = &creds[0];
    let (b_id, b_token) = &creds[1];

    // Wrong token, no token, and another host's id.
    let err = dial(
        &gw.url,
        "osht_not-a-real-token",
        hello(a_id, false, false, 1),
    )
    .await
    .err()
    .expect("a wrong host token is refused");
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let err = dial(&gw.url, b_token, hello(a_id, false, false, 1))
        .await
        .err()
        .expect("a host token names its own host only");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    for secret in [a_token.as_str(), b_token.as_str()] {
        assert!(!err.message().contains(secret));
        assert!(!gw.log().contains(secret), "a host token reached the log");
    }

    let (mut a, _) = connect(&gw.url, a_token, a_id, false, 1).await.unwrap();
    let (mut b, _) = connect(&gw.url, b_token, b_id, false, 1).await.unwrap();
    // Capacity 1 each: the fewest-first placement fills both, then refuses.
    let mut ids = Vec::new();
    for name in ["pool-a", "pool-b"] {
        let sandbox = user
            .create_sandbox(CreateSandboxRequest {
                name: name.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .sandbox
            .unwrap();
        ids.push(sandbox.metadata.unwrap().id);
    }
    let err = user
        .create_sandbox(CreateSandboxRequest {
            name: "pool-full".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let on_a = a.assignment_where(|ids| ids.len() == 1).await;
    let on_b = b.assignment_where(|ids| ids.len() == 1).await;
    assert_ne!(on_a, on_b, "one sandbox per host");
    let (mine, theirs) = (on_a[0].clone(), on_b[0].clone());
    let mine_name = if mine == ids[0] { "pool-a" } else { "pool-b" };

    // A sandbox token never opens a host session.
    let mine_token = sandbox_token(&gw.store_dir(), &mine).expect("exposed sandbox token");
    let err = dial(&gw.url, &mine_token, hello(a_id, false, false, 1))
        .await
        .err()
        .expect("a sandbox token is no host token");
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    // A host token is no user token.
    let mut as_host = client_with(&gw, Some(a_token)).await;
    let err = as_host
        .list_sandboxes(ListSandboxesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let err = as_host
        .delete_sandbox(DeleteSandboxRequest {
            name: "pool-b".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");

    // Configuration: its own sandboxes only.
    config_for(&gw, a_token, &mine)
        .await
        .expect("own sandbox's config");
    let err = config_for(&gw, a_token, &theirs).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    provider_env_for(&gw, a_token, &mine)
        .await
        .expect("own sandbox's provider environment");
    let err = provider_env_for(&gw, a_token, &theirs).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // Sessions: another host's sandbox is rejected inside the stream.
    b.sandbox_hello(&mine).await;
    match b.sandbox_message(&mine).await {
        Some(gateway_message::Payload::SessionRejected(_)) => {}
        other => panic!("expected SessionRejected, got {other:?}"),
    }
    assert!(b.sandbox_message(&mine).await.is_none());
    a.sandbox_hello(&mine).await;
    assert!(matches!(
        a.sandbox_message(&mine).await,
        Some(gateway_message::Payload::SessionAccepted(_))
    ));
    wait_phase(&mut user, mine_name, SandboxPhase::Ready).await;

    // Relays: an exec opens a relay on host a's session; host b cannot
    // claim it, host a can.
    let mut exec_user = client(&gw).await;
    let exec = tokio::spawn(async move {
        let _ = exec_user
            .exec_sandbox(exec_request(mine_name, &["true"]))
            .await;
    });
    let channel_id = loop {
        match a.sandbox_message(&mine).await {
            Some(gateway_message::Payload::RelayOpen(open)) => break open.channel_id,
            Some(_) => continue,
            None => panic!("the sandbox session ended before the relay open"),
        }
    };
    let err = claim(&gw, b_token, &channel_id).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let err = claim(
        &gw,
        &sandbox_token(&gw.store_dir(), &theirs).unwrap(),
        &channel_id,
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    claim(&gw, a_token, &channel_id)
        .await
        .expect("the host of the sandbox claims its relay");
    exec.abort();

    // Rotating a host's token takes its live session with it (within a
    // seat renewal), and the old token opens no new one.
    openshell_testkit::issue_host_token(&gw.store_dir(), a_id);
    let mut ended = false;
    for _ in 0..8 {
        if a.next().await.is_none() {
            ended = true;
            break;
        }
    }
    assert!(ended, "the session of a rotated host token went on");
    let err = dial(&gw.url, a_token, hello(a_id, true, false, 1))
        .await
        .err()
        .expect("a rotated host token is refused");
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
}

// ------------------------------------------------ with sdk-core's HostSession

/// sdk-core's `HostSession` (what the reference supervisor's host mode and
/// the language bindings use) against real replicas: placed, serving its
/// sandboxes' configuration by polling with its host token, and moved with
/// its sandboxes' sessions when the replica holding it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sdk_host_session_serves_its_sandboxes_and_follows_a_stopping_replica() {
    use openshell_sdk::{ApplyOutcome, CancellationToken, ClientConfig, HostSession};

    let mut cluster = TestCluster::start(cluster_options(2));
    wait_ring(&cluster, 2.0).await;
    let data = cluster.shared_dir().join("data");
    let creds = tokens(&data, 1);
    let config = ClientConfig::builder(cluster.replicas[0].url.clone())
        .token(creds[0].1.clone())
        .build()
        .unwrap();
    let applied: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = applied.clone();
    // Lives as long as the apply function does (below: not past the end of
    // `run` and the last handle).
    let marker = Arc::new(());
    let held = Arc::downgrade(&marker);
    let host = HostSession::builder(config, "h-0")
        .apply(Arc::new(move |sandbox_id: &str, _snapshot| {
            let _ = &marker;
            seen.lock().unwrap().push(sandbox_id.to_owned());
            ApplyOutcome::Applied
        }))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let run = tokio::spawn({
        let host = host.clone();
        let cancel = cancel.clone();
        async move { host.run(cancel).await }
    });
    assert!(eventually(Duration::from_secs(20), || host.stats().served_by.is_some()).await);
    let holder = host.stats().served_by.unwrap();
    let other = cluster.ids().into_iter().find(|r| *r != holder).unwrap();
    let mut user = client(cluster.replica(&other)).await;
    let mut ids = Vec::new();
    for name in ["sdk-pool-0", "sdk-pool-1"] {
        ids.push(create_ready(&mut user, name).await.metadata.unwrap().id);
        assert_eq!(owner_via(&mut user, name).await, Some(holder.clone()));
    }
    // Poll mode: each sandbox's configuration was read with the host token
    // and applied.
    let all_applied = eventually(Duration::from_secs(20), || {
        let applied = applied.lock().unwrap();
        ids.iter().all(|id| applied.contains(id))
    })
    .await;
    assert!(all_applied, "configuration not applied for every sandbox");
    assert_eq!(metric(cluster.replica(&holder), INSTANCES_MAX), 2.0);

    // The holder stops: the host follows its redirect with `stay`, and its
    // sandboxes' sessions reopen inside the new host session. A hand-off is
    // no lost supervisor: the sandboxes never show UNKNOWN on the way.
    let mut watch = user
        .watch_sandbox(WatchSandboxRequest {
            sandbox: "sdk-pool-0".into(),
            follow_status: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let phases = tokio::spawn(async move {
        let mut phases = Vec::new();
        let until = tokio::time::Instant::now() + Duration::from_secs(4);
        while let Ok(Ok(Some(event))) = tokio::time::timeout_at(until, watch.message()).await {
            if let Some(sandbox_stream_event::Payload::Sandbox(sandbox)) = event.payload {
                phases.push(phase(&sandbox));
            }
        }
        phases
    });
    cluster.replica_mut(&holder).stop();
    let moved = eventually(Duration::from_secs(30), || {
        host.stats().served_by.as_deref() == Some(other.as_str())
    })
    .await;
    assert!(
        moved,
        "the host did not move to {other}: {:?}",
        host.stats()
    );
    assert!(host.stats().stay, "a followed redirect carries stay");
    for name in ["sdk-pool-0", "sdk-pool-1"] {
        let mut owner = None;
        // At most 30 s, as for the host's move (a loaded machine).
        for _ in 0..300 {
            owner = owner_via(&mut user, name).await;
            if owner.as_deref() == Some(other.as_str()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(owner, Some(other.clone()), "{name}");
        wait_phase(&mut user, name, SandboxPhase::Ready).await;
    }
    assert_eq!(metric(cluster.replica(&other), HOSTS_HELD), 1.0);
    let phases = phases.await.unwrap();
    assert!(
        !phases.contains(&SandboxPhase::Unknown),
        "a handed-off sandbox showed UNKNOWN: {phases:?}"
    );
    // Cancelled, `run` returns once its sandboxes' sessions are gone:
    // nothing of the host session (its apply function included) outlives
    // the last handle.
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(15), run)
        .await
        .expect("run returns after its cancel")
        .unwrap()
        .expect("run");
    drop(host);
    assert!(
        eventually(Duration::from_secs(5), || held.upgrade().is_none()).await,
        "a sandbox session outlived its cancelled host session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_host_hellos_are_refused_and_change_nothing() {
    let gw = pooled_gateway();
    let creds = tokens(&gw.store_dir(), 1);
    let (id, token) = &creds[0];
    let heartbeat_first = HostMessage {
        payload: Some(host_message::Payload::Heartbeat(HostHeartbeat {})),
    };
    let err = dial(&gw.url, token, heartbeat_first).await.err().unwrap();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("must be hello"), "{err:?}");
    let err = dial(&gw.url, token, hello("", false, false, 0))
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("member_id"), "{err:?}");
    let long = "h".repeat(200);
    let err = dial(&gw.url, token, hello(&long, false, false, 0))
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    // No token at all.
    let mut bare = SupervisorHostClient::new(
        Channel::from_shared(gw.url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let (tx, rx) = mpsc::channel(1);
    tx.send(hello(id, false, false, 0)).await.unwrap();
    let err = bare
        .connect_host(ReceiverStream::new(rx))
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert_eq!(metric(&gw, HOSTS_HELD), 0.0, "a refused hello seats nobody");
    // A second hello on an accepted session ends it.
    let (mut session, _) = connect(&gw.url, token, id, false, 0).await.unwrap();
    assert_eq!(metric(&gw, HOSTS_HELD), 1.0);
    session.tx.send(hello(id, false, false, 0)).await.unwrap();
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(10), session.inbound.message())
            .await
            .expect("an answer within 10 s")
        {
            Ok(Some(_)) => continue,
            other => break other,
        }
    };
    let err = end.expect_err("the session ends with an error");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        eventually(Duration::from_secs(10), || metric(&gw, HOSTS_HELD) == 0.0).await,
        "the host session was not closed"
    );
}
