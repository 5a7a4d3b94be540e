//! Shared supervisor hosts end to end, with real processes only: gateway
//! replicas (`--driver hosts`) behind the built-in edge, real
//! `openshell-supervisor host` processes dialling the edge with host tokens
//! from `openshell-gateway host-token`, and the SDK as the client.
//!
//! - exec and forward to a pooled sandbox are hinted to its host's replica
//!   and served there (with and without namespace isolation);
//! - a host moving to another replica (its replica stops) keeps its
//!   sandboxes' processes; what happens to streams open on the stopping
//!   replica; exec and forward afterwards are hinted to the new replica;
//! - sdk-core's `HostSession` follows a redirect with `stay` and falls back
//!   to the shared address with `stay` when the target is down;
//! - a host killed and started again restarts its sandboxes.

mod common;

use std::time::Duration;

use common::TOKEN;
use common::hosts::*;
use futures::StreamExt;
use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, ExecEvent, ExecRequest};
use openshell_testkit::cluster::ring_owner;
use openshell_testkit::{eventually, is_running, issue_host_token, marker, pids_with_env};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ------------------------------------------------------------------- tests

/// A host logs about a sandbox after it was deleted ("sandbox unassigned:
/// stopping", "sandbox stopped"); the gateway refuses those lines for good
/// (NOT_FOUND) and the host drops them, so the lines of its other sandboxes
/// keep arriving instead of waiting behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hosts_log_lines_keep_flowing_after_one_of_its_sandboxes_is_deleted() {
    let setup = Setup::start(1, 3000).await;
    let _host = setup.host("h-0", "none");
    setup.holder().await;
    let client = setup.client().await;
    ready_sandbox(&client, "logs-gone").await;
    ready_sandbox(&client, "logs-stays").await;
    let sandboxes = client.sandboxes();
    sandboxes
        .delete("logs-gone", CallOptions::new())
        .await
        .expect("delete");
    sandboxes
        .wait_deleted(
            "logs-gone",
            CallOptions::new().deadline(Duration::from_secs(30)),
        )
        .await
        .expect("deleted");
    for round in 0..3 {
        let code = 40 + round;
        let out = client
            .exec(
                ExecRequest::new("logs-stays", ["sh", "-c", &format!("exit {code}")]),
                CallOptions::new(),
            )
            .await
            .expect("exec");
        assert_eq!(out.exit_code, code);
        let want = code.to_string();
        let mut seen = false;
        for _ in 0..100 {
            let logs = sandboxes
                .logs(
                    "logs-stays",
                    &openshell_sdk::LogQuery::new().source("sandbox"),
                    CallOptions::new(),
                )
                .await
                .expect("logs");
            seen = logs.lines.iter().any(|line| {
                line.message == "exec finished" && line.fields.get("exit_code") == Some(&want)
            });
            if seen {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(seen, "round {round}: the exit {code} line never arrived");
    }
}

async fn exec_and_forward_are_served_by_the_hosts_replica(isolation: &str) {
    let setup = Setup::start(2, 3000).await;
    let host = setup.host("h-0", isolation);
    let holder = setup.holder().await;
    let client = setup.client().await;
    let mut sandboxes = Vec::new();
    for i in 0..3 {
        let name = format!("pooled-{i}");
        let id = ready_sandbox(&client, &name).await;
        sandboxes.push((name, id));
    }
    let names: Vec<&str> = sandboxes.iter().map(|(name, _)| name.as_str()).collect();
    let port = echo_server(&client, &names).await;
    let hinted_before = client.routing_stats().hinted;
    let peer_before = setup.peer_relays();
    let local_before =
        setup.routed(&holder, "local", "exec") + setup.routed(&holder, "local", "tcp");
    for (name, id) in &sandboxes {
        // Run by the host, in the sandbox's directory under its --root.
        assert_eq!(
            sh(&client, name, "echo here > made-here; echo ok").await,
            "ok\n"
        );
        let made = host.workdir(id).join("made-here");
        assert_eq!(std::fs::read_to_string(&made).unwrap(), "here\n");
        forward_once(&client, name, port).await;
    }
    let n = sandboxes.len() as f64;
    let stats = client.routing_stats();
    assert_eq!(
        stats.hinted - hinted_before,
        2 * sandboxes.len() as u64,
        "{stats:?}"
    );
    assert_eq!(stats.unrouted_retries, 0, "{stats:?}");
    assert_eq!(
        setup.peer_relays(),
        peer_before,
        "a hinted stream was relayed"
    );
    assert_eq!(
        setup.routed(&holder, "local", "exec") + setup.routed(&holder, "local", "tcp")
            - local_before,
        2.0 * n,
        "not every stream was served on {holder}"
    );
    held_to_limits(&client, &sandboxes[0]).await;
    if isolation == "namespaces" {
        egress_by_policy(&setup, &client).await;
    }
    drop(host);
}

/// A pooled sandbox whose policy names an outside address reaches it, and
/// nothing else outside.
async fn egress_by_policy(setup: &Setup, client: &Client) {
    use openshell_proto::sandbox::{NetworkEndpoint, NetworkPolicyRule, SandboxPolicy};
    let outside = openshell_testkit::outside::Outside::start().expect("an outside namespace");
    let listener = outside
        .listen((std::net::Ipv4Addr::UNSPECIFIED, 0).into())
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            let _ = std::io::Write::write_all(&mut conn, b"outside");
        }
    });
    let policy = SandboxPolicy {
        network_policies: [(
            "out".to_owned(),
            NetworkPolicyRule {
                name: "out".into(),
                endpoints: vec![NetworkEndpoint {
                    host: outside.addr.to_string(),
                    port: u32::from(port),
                    protocol: "tcp".into(),
                }],
                binaries: Vec::new(),
            },
        )]
        .into(),
        ..Default::default()
    };
    let channel = tonic::transport::Channel::from_shared(setup.edge.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raw = openshell_proto::open_shell_client::OpenShellClient::with_interceptor(
        channel,
        common::Bearer(Some(TOKEN.into())),
    );
    raw.create_sandbox(openshell_proto::CreateSandboxRequest {
        name: "pooled-out".into(),
        spec: Some(openshell_proto::SandboxSpec {
            policy: Some(policy),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .expect("create");
    wait_ready(client, "pooled-out").await;
    let read = |addr: std::net::Ipv4Addr| {
        format!(
            "python3 -c 'import socket; print(socket.create_connection((\"{addr}\", {port}), \
             timeout=3).recv(16).decode())' 2>&1 || true"
        )
    };
    // The policy reaches the supervisor through its configuration, which
    // may come a moment after READY.
    let mut reached = String::new();
    for _ in 0..50 {
        reached = sh(client, "pooled-out", &read(outside.addr)).await;
        if reached.trim() == "outside" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(reached.trim(), "outside");
    let other = sh(client, "pooled-out", &read(outside.spare)).await;
    assert_ne!(
        other.trim(),
        "outside",
        "reached an address not in the policy"
    );
}

/// A pooled sandbox runs in a cgroup of its own with the gateway's default
/// limits, and one created with a memory limit has its hog killed.
async fn held_to_limits(client: &Client, (name, id): &(String, String)) {
    let groups = sh(client, name, "cat /proc/self/cgroup").await;
    for controller in ["memory", "pids"] {
        assert!(
            groups.lines().any(
                |line| line.contains(controller) && line.ends_with(&format!("/openshell/{id}"))
            ),
            "not in the sandbox's {controller} cgroup: {groups}"
        );
    }
    let limits = prost_types::Struct {
        fields: [(
            "memory".to_owned(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue("64Mi".into())),
            },
        )]
        .into(),
    };
    let resources = prost_types::Struct {
        fields: [(
            "limits".to_owned(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StructValue(limits)),
            },
        )]
        .into(),
    };
    let template = openshell_proto::SandboxTemplate {
        resources: Some(resources),
        ..Default::default()
    };
    client
        .sandboxes()
        .create(
            CreateSandbox::new()
                .name("pooled-limited")
                .template(template),
            CallOptions::new(),
        )
        .await
        .expect("create");
    wait_ready(client, "pooled-limited").await;
    let hog = client
        .exec(
            ExecRequest::new(
                "pooled-limited",
                ["python3", "-c", "b = b'\\x01' * (256 << 20)"],
            ),
            CallOptions::new(),
        )
        .await
        .expect("exec");
    assert_eq!(hog.exit_code, 137, "{hog:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exec_and_forward_are_served_by_the_hosts_replica_with_namespaces() {
    exec_and_forward_are_served_by_the_hosts_replica("namespaces").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exec_and_forward_are_served_by_the_hosts_replica_without_isolation() {
    exec_and_forward_are_served_by_the_hosts_replica("none").await;
}

/// A line-per-tick exec: `n` lines, one every 100 ms.
fn ticker(sandbox: &str, n: u32) -> ExecRequest {
    ExecRequest::new(
        sandbox,
        [
            "sh",
            "-c",
            &format!("i=0; while [ $i -lt {n} ]; do echo $i; i=$((i+1)); sleep 0.1; done"),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pooled_sandbox_survives_its_host_moving() {
    // Three replicas, so two are left after the move: a single replica
    // gives no owner hints.
    let mut setup = Setup::start(3, 3000).await;
    let host = setup.host("h-0", "namespaces");
    let holder = setup.holder().await;
    let client = setup.client().await;
    ready_sandbox(&client, "mover").await;
    let port = echo_server(&client, &["mover"]).await;

    // A background process, found by a marker in its environment.
    let mark = marker();
    let out = client
        .exec(
            ExecRequest::new(
                "mover",
                [
                    "sh",
                    "-c",
                    "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo started",
                ],
            )
            .env("OPENSHELL_TEST_MARK", &mark),
            CallOptions::new(),
        )
        .await
        .expect("exec");
    assert_eq!(out.stdout, b"started\n");
    let mut background = Vec::new();
    assert!(
        eventually(Duration::from_secs(5), || {
            background = pids_with_env("OPENSHELL_TEST_MARK", &mark);
            !background.is_empty()
        })
        .await,
        "the background process is not running"
    );

    // Streams opened before the move, served by the holder.
    let tick_mark = marker();
    let mut ticks = client
        .exec_stream(
            ticker("mover", 100).env("OPENSHELL_TEST_MARK", &tick_mark),
            CallOptions::new(),
        )
        .await
        .expect("exec stream");
    match within(10, "first tick", ticks.next()).await {
        Some(Ok(ExecEvent::Stdout(line))) => assert_eq!(&line[..], b"0\n"),
        other => panic!("expected the first tick, got {other:?}"),
    }
    let forward = client
        .forward("mover", port, "127.0.0.1:0", CallOptions::new())
        .await
        .expect("forward");
    let mut socket = tokio::net::TcpStream::connect(forward.local_addr())
        .await
        .unwrap();
    socket.write_all(b"before").await.unwrap();
    let mut buf = [0u8; 6];
    within(10, "echo before", socket.read_exact(&mut buf))
        .await
        .unwrap();
    assert_eq!(&buf, b"before");

    // The holder stops gracefully: it hands the host to the other replica.
    setup.cluster.replica_mut(&holder).stop();
    let other = setup.holder().await;
    assert_ne!(other, holder, "the host did not move:\n{}", host.log());

    // Streams open on the stopping replica end with it: there is no
    // drain. The exec ends UNAVAILABLE and its process is killed with its
    // relay; the forwarded connection is closed.
    let rest = within(20, "the ticker's end", async {
        let mut events = Vec::new();
        while let Some(event) = ticks.next().await {
            events.push(event.map_err(|e| e.code()));
        }
        events
    })
    .await;
    assert_eq!(rest.last(), Some(&Err("unavailable")), "{rest:?}");
    assert!(
        rest.iter().all(|e| !matches!(e, Ok(ExecEvent::Exit(_)))),
        "{rest:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || pids_with_env(
            "OPENSHELL_TEST_MARK",
            &tick_mark
        )
        .is_empty())
        .await,
        "the exec's process outlived its stream"
    );
    let _ = socket.write_all(b"after!").await;
    let mut back = Vec::new();
    let read = within(10, "forward after the stop", socket.read_to_end(&mut back)).await;
    assert!(
        read.is_err() || back.is_empty(),
        "the forward went on after its replica stopped: {back:?}"
    );
    forward.close();

    // The background process went on.
    assert!(
        background.iter().all(|pid| is_running(*pid)),
        "the background process died with the move"
    );
    // Exec and forward now: hinted to the new replica, served there.
    let routes = routes(&setup.cluster);
    let routes: Vec<(&str, &str)> = routes
        .iter()
        .filter(|(id, _)| *id != holder)
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    setup.edge.set_routes(&routes);
    let fresh = setup.client().await;
    let local_before = setup.routed(&other, "local", "exec") + setup.routed(&other, "local", "tcp");
    let peer_before = setup.peer_relays();
    wait_ready(&fresh, "mover").await;
    let pids = sh(&fresh, "mover", "echo alive").await;
    assert_eq!(pids, "alive\n");
    forward_once(&fresh, "mover", port).await;
    let stats = fresh.routing_stats();
    assert_eq!(stats.hinted, 2, "{stats:?}");
    assert_eq!(stats.unrouted_retries, 0, "{stats:?}");
    assert_eq!(setup.peer_relays(), peer_before);
    assert_eq!(
        setup.routed(&other, "local", "exec") + setup.routed(&other, "local", "tcp") - local_before,
        2.0
    );
    drop(host);
}

async fn a_host_restart_restarts_its_sandboxes(isolation: &str) {
    let setup = Setup::start(2, 3000).await;
    let mut host = setup.host("h-0", isolation);
    setup.holder().await;
    let client = setup.client().await;
    let names = ["again-0", "again-1"];
    let mut ids = Vec::new();
    for name in names {
        ids.push(ready_sandbox(&client, name).await);
    }
    let old = keep_a_file_and_a_sleeper(&client, names[0]).await;
    let old_pid = host.pid().unwrap();

    // kill -9: the sandboxes' processes die with the host.
    host.kill();
    assert!(!is_running(old_pid));
    // Under namespaces every process of a sandbox lives in its PID
    // namespace, whose init dies with the host. Without isolation nothing
    // holds a detached (setsid) process: it outlives the host's SIGKILL
    // and its restart (docs/ARCHITECTURE.md, shared supervisor hosts).
    let isolated = isolation == "namespaces";
    let limit = Duration::from_secs(if isolated { 10 } else { 1 });
    let died = eventually(limit, || old.iter().all(|p| !is_running(*p))).await;
    assert_eq!(died, isolated, "{isolation}: {old:?}");
    // Started again (same id, token and root): its sandboxes are served
    // again, with their files, by new processes.
    host.restart();
    setup.holder().await;
    for (name, id) in names.iter().zip(&ids) {
        let ready = eventually(Duration::from_secs(30), || {
            std::fs::metadata(host.workdir(id)).is_ok()
        })
        .await;
        assert!(ready, "{name}'s directory is gone");
        wait_ready(&client, name).await;
        // The session is the new host's: exec works.
        let out = within(30, "exec after the restart", async {
            loop {
                match client
                    .exec(
                        ExecRequest::new(*name, ["sh", "-c", "cat kept 2>/dev/null; echo new"]),
                        CallOptions::new(),
                    )
                    .await
                {
                    Ok(out) => break out,
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        })
        .await;
        let want = if *name == names[0] {
            "kept\nnew\n"
        } else {
            "new\n"
        };
        assert_eq!(String::from_utf8_lossy(&out.stdout), want);
    }
    assert_eq!(
        old.iter().all(|pid| !is_running(*pid)),
        isolated,
        "{isolation}: {old:?}"
    );
    for pid in old {
        openshell_testkit::signal(pid, libc::SIGKILL);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_restart_restarts_its_sandboxes_with_namespaces() {
    a_host_restart_restarts_its_sandboxes("namespaces").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_restart_restarts_its_sandboxes_without_isolation() {
    a_host_restart_restarts_its_sandboxes("none").await;
}

/// Runs sdk-core's `HostSession` for `host_id` against `url` until it is
/// accepted; returns its stats then, and its cancel token and task.
async fn run_host_session(
    url: &str,
    token: &str,
    host_id: &str,
) -> (
    openshell_sdk::HostSession,
    openshell_sdk::CancellationToken,
    tokio::task::JoinHandle<Result<(), openshell_sdk::Error>>,
) {
    use openshell_sdk::{ApplyOutcome, CancellationToken, HostSession};
    use std::sync::Arc;
    let config = ClientConfig::builder(url.to_owned())
        .token(token.to_owned())
        .build()
        .unwrap();
    let host = HostSession::builder(config, host_id)
        .apply(Arc::new(|_: &str, _| ApplyOutcome::Applied))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let host = host.clone();
        let cancel = cancel.clone();
        async move { host.run(cancel).await }
    });
    let accepted = eventually(Duration::from_secs(20), || host.stats().served_by.is_some()).await;
    assert!(accepted, "{host_id} not accepted: {:?}", host.stats());
    (host, cancel, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_host_session_follows_a_redirect_with_stay_and_falls_back_with_stay() {
    // Long enough a member TTL that a killed replica stays in the ring
    // (its membership row live) while the host arrives.
    let mut setup = Setup::start(2, 8000).await;
    let data = setup.cluster.shared_dir().join("data");
    // A host id whose ring point maps to gw-1: placement on gw-0 (cap 1,
    // gw-1 serving none) redirects it there.
    let host_id = (0..200)
        .map(|n| format!("h-{n}"))
        .find(|id| ring_owner(&["gw-0", "gw-1"], id) == "gw-1")
        .expect("an id owned by gw-1");
    let token = issue_host_token(&data, &host_id);
    let shared = setup.cluster.replica("gw-0").url.clone();

    // Both replicas up: the redirect is followed at once, with `stay`.
    let (host, cancel, task) = run_host_session(&shared, &token, &host_id).await;
    let stats = host.stats();
    assert_eq!(stats.served_by.as_deref(), Some("gw-1"), "{stats:?}");
    assert_eq!((stats.redirects, stats.fallbacks), (1, 0), "{stats:?}");
    assert!(stats.stay, "{stats:?}");
    cancel.cancel();
    within(10, "host session end", task).await.unwrap().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || held(
            setup.cluster.replica("gw-1")
        ) == 0.0)
        .await
    );

    // gw-1 crashes; its membership row is live until its TTL, so gw-0
    // still places the host there. Following the redirect fails to
    // connect: the host falls back to the shared address with `stay`, and
    // gw-0 accepts it.
    setup.cluster.replica_mut("gw-1").kill();
    let (host, cancel, task) = run_host_session(&shared, &token, &host_id).await;
    let stats = host.stats();
    assert_eq!(stats.served_by.as_deref(), Some("gw-0"), "{stats:?}");
    assert_eq!((stats.redirects, stats.fallbacks), (1, 1), "{stats:?}");
    assert!(stats.stay, "the fallback carries stay: {stats:?}");
    assert_eq!(held(setup.cluster.replica("gw-0")), 1.0);
    // And it serves: a new sandbox is assigned to it.
    let config = ClientConfig::builder(shared.clone())
        .token(TOKEN)
        .build()
        .unwrap();
    let client = Client::connect(config).await.unwrap();
    ready_sandbox(&client, "after-fallback").await;
    assert_eq!(host.stats().assigned, 1);
    cancel.cancel();
    within(10, "host session end", task).await.unwrap().unwrap();
}
