//! `openshell_sdk::testing::LocalCluster` against the real gateway: a
//! cluster started in one call serves execs on every replica, its faults
//! do what a user of a multi-replica gateway would see (a killed owner: the
//! next exec runs once, on the replica its supervisor reconnected to), a
//! clean stop leaves no process and no data directory, and a test process
//! killed with SIGKILL takes its cluster with it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use openshell_sdk::testing::{LocalCluster, LocalClusterOptions};
use openshell_sdk::{CallOptions, Client, CreateSandbox, ExecRequest};
use openshell_testkit::up::assert_stopped;
use openshell_testkit::{bin, bin_dir, is_running, signal};

fn options() -> LocalClusterOptions {
    LocalClusterOptions::new()
        .isolation("none")
        .gateway_bin(bin("openshell-gateway"))
}

async fn ready_sandbox(client: &Client) -> String {
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

/// Appends a line to a file in the sandbox and answers how many lines it
/// holds: a run that happened twice shows as a count one too high.
async fn count_run(client: &Client, sandbox: &str, file: &str) -> String {
    let script = format!("echo run >> {file}; wc -l < {file}");
    let out = client
        .exec(
            ExecRequest::new(sandbox, ["sh", "-c", &script]),
            CallOptions::new(),
        )
        .await
        .unwrap();
    out.stdout_text().trim().to_owned()
}

/// Every PID in `up`'s status file, and the sandboxes' supervisors.
fn cluster_pids(data_dir: &Path) -> Vec<i32> {
    let text = std::fs::read_to_string(data_dir.join("up").join("status.json")).unwrap();
    let status: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut pids: Vec<i32> = status["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["pid"].as_i64().map(|p| p as i32))
        .collect();
    pids.push(status["pid"].as_i64().unwrap() as i32);
    if let Ok(entries) = std::fs::read_dir(data_dir.join("sandboxes")) {
        pids.extend(entries.filter_map(|e| {
            let text = std::fs::read_to_string(e.ok()?.path().join("supervisor.pid")).ok()?;
            text.trim().parse::<i32>().ok()
        }));
    }
    pids
}

#[tokio::test]
async fn a_local_cluster_serves_every_replica_and_survives_a_killed_owner() {
    let started = Instant::now();
    let cluster = LocalCluster::start(options()).await.unwrap();
    let ready_in = started.elapsed();
    assert_eq!(cluster.replica_ids(), ["gw-0", "gw-1", "gw-2"]);
    assert!(cluster.endpoint().starts_with("http://127.0.0.1:"));
    assert_ne!(cluster.endpoint(), "http://127.0.0.1:17670");
    let client = cluster.client().await.unwrap();

    // An exec on each replica: sandboxes until every replica owns one
    // (the ring spreads them; at most 40, each misses a given replica with
    // p < 0.7: 15 tries missed one in 1 run of 140).
    let mut on: std::collections::BTreeMap<String, String> = Default::default();
    for _ in 0..40 {
        let name = ready_sandbox(&client).await;
        let owner = cluster.owner_of(&name).await.unwrap().expect("an owner");
        on.entry(owner).or_insert(name);
        if on.len() == 3 {
            break;
        }
    }
    assert_eq!(on.len(), 3, "owners seen: {on:?}");
    for sandbox in on.values() {
        assert_eq!(count_run(&client, sandbox, "runs").await, "1");
    }

    // The owner of one sandbox dies: the next exec runs, once.
    let (owner, sandbox) = on
        .iter()
        .next()
        .map(|(o, s)| (o.clone(), s.clone()))
        .unwrap();
    cluster.kill_replica(&owner).await.unwrap();
    assert_eq!(count_run(&client, &sandbox, "runs").await, "2");
    let moved = cluster.owner_of(&sandbox).await.unwrap();
    assert!(
        moved.is_some() && moved.as_deref() != Some(owner.as_str()),
        "{moved:?}"
    );

    cluster.start_replica(&owner).await.unwrap();
    // The edge loses a route the client (from a stale cache) hints to: one
    // unrouted retry, and the exec runs once.
    let moved = moved.unwrap();
    let stale = cluster
        .replica_ids()
        .iter()
        .find(|r| **r != moved)
        .unwrap()
        .clone();
    cluster.cut_route(&stale).await.unwrap();
    client.assume_owner(&sandbox, &stale).unwrap();
    let retries = client.routing_stats().unrouted_retries;
    assert_eq!(count_run(&client, &sandbox, "runs").await, "3");
    assert_eq!(client.routing_stats().unrouted_retries, retries + 1);
    cluster.restore_route(&stale).await.unwrap();
    cluster.restart_edge().await.unwrap();
    // Every connection through the edge broke; the supervisors dial again.
    let begun = Instant::now();
    let counted = loop {
        let script = "wc -l < runs";
        let request = ExecRequest::new(&sandbox, ["sh", "-c", script]);
        match client.exec(request, CallOptions::new()).await {
            Ok(out) => break out.stdout_text().trim().to_owned(),
            Err(err) if begun.elapsed() < Duration::from_secs(60) => {
                let _ = err;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(err) => panic!("no exec after the edge restart: {err}"),
        }
    };
    assert_eq!(counted, "3", "an exec ran twice");

    // Bad orders say what is wrong and change nothing.
    let err = cluster.kill_replica("gw-9").await.unwrap_err();
    assert!(err.to_string().contains(r#"no replica "gw-9""#), "{err}");
    assert_eq!(err.code(), "invalid_config");
    let err = cluster.kill_host("h-0").await.unwrap_err();
    assert!(err.to_string().contains("the hosts are []"), "{err}");

    let data_dir = cluster.data_dir().to_owned();
    let pids = cluster_pids(&data_dir);
    cluster.stop().await.unwrap();
    assert!(
        !data_dir.exists(),
        "a clean stop removes the data directory"
    );
    assert_stopped(&pids, Duration::from_secs(10)).await;
    println!("3 replicas ready in {ready_in:?}");
}

#[tokio::test]
async fn two_clusters_run_at_once_and_bad_options_are_refused() {
    let err = LocalCluster::start(options().replicas(0))
        .await
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("replicas must be at least 1"),
        "{err}"
    );
    assert_eq!(err.code(), "invalid_config");
    for bad in [
        options().isolation("bogus"),
        options().config_delivery("sometimes"),
    ] {
        let err = LocalCluster::start(bad).await.err().unwrap();
        assert_eq!(err.code(), "invalid_config", "{err}");
        assert!(err.to_string().contains("must be"), "{err}");
    }
    let err = LocalCluster::start(options().gateway_bin("/nonexistent/openshell-gateway"))
        .await
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("/nonexistent/openshell-gateway does not exist"),
        "{err}"
    );
    // A gateway that exits at once: the start fails and keeps its logs.
    let err = LocalCluster::start(options().gateway_bin("/bin/false"))
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("did not start"), "{err}");
    assert_eq!(err.code(), "cluster");
    let logs = err
        .logs()
        .expect("a failed start keeps its logs")
        .to_owned();
    assert!(logs.join("up.log").exists());
    let _ = std::fs::remove_dir_all(logs);

    let (a, b) = tokio::join!(
        LocalCluster::start(options().replicas(1)),
        LocalCluster::start(options().replicas(2)),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_ne!(a.endpoint(), b.endpoint());
    for cluster in [&a, &b] {
        let client = cluster.client().await.unwrap();
        let name = ready_sandbox(&client).await;
        assert_eq!(count_run(&client, &name, "f").await, "1");
    }
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// The example holds its cluster until it is killed; SIGKILL of that test
/// process (no drop, no cleanup of its own) still stops every process of
/// the cluster: `up` sees its input end.
#[tokio::test]
async fn a_test_process_killed_with_sigkill_leaves_no_cluster() {
    let example = bin_dir().join("examples").join("local_cluster");
    assert!(
        example.exists(),
        "{} is built by cargo test",
        example.display()
    );
    let mut child = Command::new(&example)
        .env("OPENSHELL_GATEWAY_BIN", bin("openshell-gateway"))
        .env("OPENSHELL_EXAMPLE_HOLD", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut seen = Vec::new();
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let done = line == "holding";
            seen.push(line);
            if done {
                break;
            }
        }
        seen
    })
    .join()
    .unwrap();
    assert_eq!(
        lines.last().map(String::as_str),
        Some("holding"),
        "{lines:?}"
    );
    let data_dir = lines[0]
        .split("(data ")
        .nth(1)
        .and_then(|rest| rest.strip_suffix(')'))
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| panic!("{lines:?}"));
    let pids = cluster_pids(&data_dir);
    assert!(
        pids.len() >= 6,
        "up, 3 replicas, the edge, a supervisor: {pids:?}"
    );
    assert!(pids.iter().all(|p| is_running(*p)));

    signal(child.id() as i32, libc::SIGKILL);
    let _ = child.wait();
    assert_stopped(&pids, Duration::from_secs(60)).await;
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// Dropping a cluster without `stop()` stops it too (on the dropping
/// thread, bounded) and removes its data directory.
#[tokio::test]
async fn a_dropped_cluster_stops_and_cleans_up() {
    let cluster = LocalCluster::start(options().replicas(2)).await.unwrap();
    let client = cluster.client().await.unwrap();
    let name = ready_sandbox(&client).await;
    assert_eq!(count_run(&client, &name, "f").await, "1");
    let data_dir = cluster.data_dir().to_owned();
    let pids = cluster_pids(&data_dir);
    drop(cluster);
    assert!(!data_dir.exists(), "the drop removes the data directory");
    assert_stopped(&pids, Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_slow_or_cut_store_is_what_clients_see_and_heals() {
    let cluster = LocalCluster::start(options().replicas(2)).await.unwrap();
    let client = cluster.client().await.unwrap();
    let sandbox = ready_sandbox(&client).await;
    let exec = || ExecRequest::new(&sandbox, ["true"]);
    let begun = Instant::now();
    client.exec(exec(), CallOptions::new()).await.unwrap();
    let fast = begun.elapsed();

    // Slow: every call that reads the store waits, and still succeeds.
    cluster
        .slow_store(Duration::from_millis(400))
        .await
        .unwrap();
    let begun = Instant::now();
    client.exec(exec(), CallOptions::new()).await.unwrap();
    let slow = begun.elapsed();
    assert!(
        slow >= Duration::from_millis(400),
        "{slow:?} (unfaulted {fast:?})"
    );

    // Cut: a create fails `unavailable` after the store's deadline, naming
    // the store and nothing of its address; nothing is created.
    cluster.cut_store().await.unwrap();
    let begun = Instant::now();
    let err = client
        .sandboxes()
        .create(
            CreateSandbox::new().name("during-the-cut"),
            CallOptions::new(),
        )
        .await
        .unwrap_err();
    // No session (unavailable), or the sandbox already marked not ready.
    assert!(
        matches!(err.code(), "unavailable" | "failed_precondition"),
        "{err}"
    );
    assert!(err.to_string().contains("store"), "{err}");
    assert!(
        begun.elapsed() < Duration::from_secs(15),
        "{:?}",
        begun.elapsed()
    );

    // Restored: the cluster serves again without a manual step.
    cluster.restore_store().await.unwrap();
    client.exec(exec(), CallOptions::new()).await.unwrap();
    let err = client
        .sandboxes()
        .get("during-the-cut", CallOptions::new())
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        "not_found",
        "the cut create left a sandbox: {err}"
    );
    let err = cluster
        .slow_store(Duration::from_secs(601))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "cluster", "{err}");
    cluster.stop().await.unwrap();
}

/// An exec that is retried (bounded) until it succeeds; the attempts it took.
async fn exec_eventually(client: &Client, sandbox: &str, within: Duration) -> (String, u32) {
    let begun = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let request = ExecRequest::new(sandbox, ["sh", "-c", "echo run >> runs; wc -l < runs"]);
        match client.exec(request, CallOptions::new()).await {
            Ok(out) => return (out.stdout_text().trim().to_owned(), attempts),
            Err(err) if begun.elapsed() < within => {
                let _ = err;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => panic!("no exec on {sandbox} within {within:?}: {err}"),
        }
    }
}

#[tokio::test]
async fn a_stopped_replica_and_a_killed_host_are_what_clients_see() {
    let cluster = LocalCluster::start(options().replicas(2).hosts(2))
        .await
        .unwrap();
    assert_eq!(cluster.host_ids(), ["h-0", "h-1"]);
    let client = cluster.client().await.unwrap();
    let sandbox = ready_sandbox(&client).await;
    assert_eq!(count_run(&client, &sandbox, "runs").await, "1");

    // SIGTERM to the owner: its sessions are redirected before it goes,
    // so the next exec needs no retry and runs once.
    let owner = cluster.owner_of(&sandbox).await.unwrap().expect("an owner");
    cluster.stop_replica(&owner).await.unwrap();
    assert_eq!(count_run(&client, &sandbox, "runs").await, "2");
    cluster.start_replica(&owner).await.unwrap();

    // Both hosts die: an exec is refused; started again, the hosts serve
    // the sandbox again.
    for host in ["h-0", "h-1"] {
        cluster.kill_host(host).await.unwrap();
    }
    let request = ExecRequest::new(&sandbox, ["true"]);
    let err = client
        .exec(
            request,
            CallOptions::new().deadline(Duration::from_secs(20)),
        )
        .await
        .unwrap_err();
    // No session (unavailable), or the sandbox already marked not ready.
    assert!(
        matches!(err.code(), "unavailable" | "failed_precondition"),
        "{err}"
    );
    for host in ["h-0", "h-1"] {
        cluster.start_host(host).await.unwrap();
    }
    // The sandbox's files outlive its host process; the refused exec never ran.
    let (count, attempts) = exec_eventually(&client, &sandbox, Duration::from_secs(60)).await;
    assert_eq!(count, "3", "after {attempts} attempts");
    cluster.stop().await.unwrap();
}
