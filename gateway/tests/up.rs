//! `openshell-gateway up`, as a user runs it (`testkit::up::Up`): the
//! developer cluster starts replicas, the edge and shared hosts, places the
//! hosts evenly, serves sandboxes through the edge, keeps serving (and
//! restarts, or leaves down) when one of its processes dies, takes orders
//! on stdin, and Ctrl-C stops every process it started.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use openshell_proto::open_shell_client::OpenShellClient;
use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, Error, ExecRequest};
use openshell_testkit::up::{Up, assert_stopped};
use openshell_testkit::{bin, eventually, http_get, is_running, metric_value, signal, threads};
use tonic::transport::Channel;

#[tokio::test]
async fn up_serves_through_the_edge_and_stops_everything_on_ctrl_c() {
    let mut up = Up::start(&["--replicas", "3"]);
    let banner = up.output();
    assert!(
        banner
            .iter()
            .any(|l| l.contains(&format!("serving {}", up.endpoint()))),
        "{banner:?}"
    );
    assert_eq!(
        banner
            .iter()
            .filter(|l| l.trim_start().starts_with("gw-"))
            .count(),
        3
    );

    let channel = Channel::from_shared(up.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = OpenShellClient::with_interceptor(channel, Bearer(None));
    create_ready(&mut client, "via-edge").await;
    assert_eq!(
        sh(&mut client, "via-edge", "echo hi").await.stdout_text(),
        "hi\n"
    );

    let run_dir = up.data_dir().join("up");
    let mut pids: Vec<i32> = std::fs::read_dir(&run_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".ready.json"))
        .map(|e| {
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap();
            v["pid"].as_i64().unwrap() as i32
        })
        .collect();
    assert_eq!(pids.len(), 4, "three replicas and the edge");
    let supervisors = up.supervisor_pids();
    assert_eq!(supervisors.len(), 1, "a supervisor");
    pids.extend(supervisors);
    assert!(pids.iter().all(|p| is_running(*p)));

    assert_eq!(up.interrupt(), Some(0));
    assert_all_stopped(&pids).await;
}

/// `up --hosts 2`: the replicas run `--driver hosts`, two real
/// `openshell-supervisor host` processes (one per replica after placement)
/// serve every sandbox, exec works through the edge and a host's relay, no
/// supervisor process is started per sandbox, and Ctrl-C stops the hosts
/// by their PIDs.
#[tokio::test]
async fn up_with_hosts_runs_sandboxes_on_shared_hosts() {
    let mut up = Up::start(&[
        "--replicas",
        "2",
        "--hosts",
        "2",
        "--host-threads",
        "2",
        "--isolation",
        "none",
    ]);
    let banner = up.output();
    assert!(
        banner.iter().any(|l| l.contains("on 2 supervisor hosts")),
        "{banner:?}"
    );
    let hosts: Vec<i32> = banner
        .iter()
        .filter(|l| l.trim_start().starts_with("h-"))
        .filter_map(|l| l.rsplit("pid ").next()?.trim_end_matches(')').parse().ok())
        .collect();
    assert_eq!(hosts.len(), 2, "{banner:?}");
    assert!(hosts.iter().all(|p| is_running(*p)));
    // --host-threads 2 reached the hosts: two workers beside the main
    // thread (a default host runs on its main thread alone).
    for pid in &hosts {
        let threads = threads(*pid);
        assert!(threads >= 3, "host {pid} runs {threads} threads");
    }
    // The host tokens: files only the owner reads, never printed.
    for id in ["h-0", "h-1"] {
        let path = up.data_dir().join("up").join(format!("{id}.token"));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{id}");
        let token = std::fs::read_to_string(&path).unwrap();
        assert!(banner.iter().all(|l| !l.contains(token.trim())));
    }

    let channel = Channel::from_shared(up.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = OpenShellClient::with_interceptor(channel, Bearer(None));
    let mut ids = Vec::new();
    for name in ["pooled-a", "pooled-b"] {
        ids.push(create_ready(&mut client, name).await.metadata.unwrap().id);
        assert_eq!(
            sh(&mut client, name, "echo from-a-host")
                .await
                .stdout_text(),
            "from-a-host\n"
        );
    }
    // Each sandbox lives under a host's root; none has a supervisor of its own.
    for id in &ids {
        let on_host = ["h-0", "h-1"]
            .iter()
            .any(|h| up.data_dir().join("hosts").join(h).join(id).exists());
        assert!(on_host, "{id} is under no host's root");
        assert!(
            !up.data_dir()
                .join("sandboxes")
                .join(id)
                .join("supervisor.pid")
                .exists(),
            "{id} got a supervisor process"
        );
    }

    assert_eq!(up.interrupt(), Some(0));
    assert_all_stopped(&hosts).await;
}

/// Waits (at most 10 s) until none of `pids` runs.
async fn assert_all_stopped(pids: &[i32]) {
    assert_stopped(pids, Duration::from_secs(10)).await;
}

/// `openshell-gateway status --data-dir` of `up`: exit code and output.
fn status_command(up: &Up) -> (Option<i32>, String) {
    let out = Command::new(bin("openshell-gateway"))
        .arg("status")
        .arg("--data-dir")
        .arg(up.data_dir())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `--host-threads` needs `--hosts` and a count the host accepts; a refused
/// command line starts nothing and says which flag is wrong.
#[test]
fn up_refuses_bad_host_threads_before_starting_anything() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 2] = [
        (&["--host-threads", "2"], "--hosts"),
        (
            &["--hosts", "1", "--host-threads", "0"],
            "0 is not in 1..=256",
        ),
    ];
    for (args, says) in cases {
        let out = Command::new(bin("openshell-gateway"))
            .arg("up")
            .args(args)
            .arg("--data-dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(stderr.contains("--host-threads"), "{args:?}: {stderr}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// A client of `up`'s edge: owner routing on, calls bounded to 30 s.
async fn sdk_client(up: &Up) -> Client {
    let config = ClientConfig::builder(up.endpoint())
        .owner_routing(true)
        .default_deadline(Some(Duration::from_secs(30)))
        .build()
        .unwrap();
    Client::connect(config).await.unwrap()
}

async fn sdk_create_ready(client: &Client) -> String {
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

async fn sdk_echo(client: &Client, sandbox: &str, word: &str) -> Result<String, Error> {
    let out = client
        .exec(
            ExecRequest::new(sandbox, ["echo", word]),
            CallOptions::new(),
        )
        .await?;
    Ok(out.stdout_text())
}

/// Retries `echo` (at most `limit`, 250 ms apart) until it answers; the
/// attempts are counted by the caller's client.
async fn echo_within(client: &Client, sandbox: &str, limit: Duration) -> String {
    let started = Instant::now();
    loop {
        match sdk_echo(client, sandbox, "back").await {
            Ok(text) => return text,
            Err(err) if started.elapsed() < limit => {
                let _ = err;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(err) => panic!("exec in {sandbox} still failing after {limit:?}: {err}"),
        }
    }
}

const PEER_ATTEMPTS: &str =
    r#"openshell_server_routed_request_attempts_total{operation="relay",route="peer""#;

/// `up --replicas 3 --hosts 7`, five starts in a row: when the banner
/// prints, the hosts are spread evenly (at most ceil(7/3) = 3 on a replica,
/// and no two replicas more than one apart), and a hinted exec in each of
/// six pooled sandboxes runs on the replica holding its host's session: no
/// peer relay at all. Before placement read the live members from the store,
/// the replicas that started first (their rings not yet refreshed) kept
/// most hosts: 4, 2, 1 and 5, 1, 1.
#[tokio::test]
async fn up_places_hosts_evenly_and_pooled_execs_are_never_relayed() {
    for round in 0..5 {
        let mut up = Up::start(&["--replicas", "3", "--hosts", "7", "--isolation", "none"]);
        let at_banner = up.replica_metric("openshell_server_supervisor_hosts");
        let even = |held: &[f64]| {
            let most = held.iter().copied().fold(0.0, f64::max);
            let least = held.iter().copied().fold(f64::MAX, f64::min);
            held.iter().sum::<f64>() == 7.0 && most <= 3.0 && most - least <= 1.0
        };
        assert!(
            even(&at_banner),
            "round {round}: hosts per replica {at_banner:?}"
        );

        let client = sdk_client(&up).await;
        for _ in 0..6 {
            let name = sdk_create_ready(&client).await;
            assert_eq!(
                sdk_echo(&client, &name, "pooled").await.unwrap(),
                "pooled\n"
            );
        }
        let stats = client.routing_stats();
        assert_eq!(
            (stats.hinted, stats.unhinted),
            (6, 0),
            "round {round}: {stats:?}"
        );
        assert_eq!(
            up.replica_sum(PEER_ATTEMPTS),
            0.0,
            "round {round}: pooled execs were relayed through a peer"
        );
        let after = up.replica_metric("openshell_server_supervisor_hosts");
        assert_eq!(after, at_banner, "round {round}: hosts moved");
        assert_eq!(up.interrupt(), Some(0));
    }
}

/// Everything `up` started, by PID: the processes in its status file and
/// the sandbox supervisors.
fn every_pid(up: &Up) -> Vec<i32> {
    let mut pids: Vec<i32> = up.status()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["pid"].as_i64().map(|p| p as i32))
        .collect();
    pids.extend(up.supervisor_pids());
    pids
}

fn up_metric(up: &Up, sample: &str) -> Option<f64> {
    metric_value(
        &http_get(up.metrics_addr().parse().unwrap(), "/metrics"),
        sample,
    )
}

/// `up` (default `--restart always`) keeps serving when one of its
/// processes is killed, and starts it again: a shared host, a replica and
/// the edge in turn get SIGKILL. Meanwhile the cluster answers through the
/// edge and the sandboxes on the other hosts run execs; each killed process
/// comes back with a new PID (a replica on its old ports), counted in `up`'s
/// metrics and status file; the sandbox of the killed host runs execs again
/// once its host is back. Ctrl-C then leaves no process behind.
#[tokio::test]
async fn up_restarts_a_killed_host_replica_and_edge() {
    let mut up = Up::start(&["--replicas", "3", "--hosts", "3", "--isolation", "none"]);
    let client = sdk_client(&up).await;
    let mut sandboxes = Vec::new();
    for _ in 0..3 {
        sandboxes.push(sdk_create_ready(&client).await);
    }
    let mut hosts = Vec::new();
    for name in &sandboxes {
        let id = client
            .sandboxes()
            .get(name, CallOptions::new())
            .await
            .unwrap()
            .id;
        let host = ["h-0", "h-1", "h-2"]
            .into_iter()
            .find(|h| up.data_dir().join("hosts").join(h).join(&id).exists())
            .unwrap_or_else(|| panic!("{name} is under no host"));
        hosts.push(host.to_owned());
    }
    let mut seen = every_pid(&up);

    // A host.
    let victim = hosts[0].clone();
    let old = up.pid_of(&victim).unwrap();
    signal(old, libc::SIGKILL);
    up.wait_state(&victim, "restarting", Duration::from_secs(10));
    for (sandbox, host) in sandboxes.iter().zip(&hosts).skip(1) {
        assert_ne!(host, &victim);
        assert_eq!(
            sdk_echo(&client, sandbox, "still").await.unwrap(),
            "still\n"
        );
    }
    let entry = up.wait_restarted(&victim, old, Duration::from_secs(30));
    assert_eq!(
        (entry["exits"].as_u64(), entry["restarts"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(
        entry["last_exit"].as_str().unwrap().contains("9"),
        "{entry}"
    );
    assert_eq!(
        echo_within(&client, &sandboxes[0], Duration::from_secs(60)).await,
        "back\n"
    );
    seen.extend(every_pid(&up));

    // A replica: the edge keeps answering, every sandbox runs execs again
    // (hosts on the killed replica come back through the edge).
    let old = up.pid_of("gw-1").unwrap();
    signal(old, libc::SIGKILL);
    // A call the edge sent to gw-1 in the moment it died may fail (it may
    // have run, so nothing retries it); the next ones go to the others.
    let mut raced = 0;
    while let Err(err) = client.health(CallOptions::new()).await {
        assert!(
            raced < 3
                && err
                    .to_string()
                    .contains("upstream failed before response headers"),
            "health through the edge after a replica was killed: {err}"
        );
        raced += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for sandbox in &sandboxes {
        assert_eq!(
            echo_within(&client, sandbox, Duration::from_secs(60)).await,
            "back\n"
        );
    }
    up.wait_restarted("gw-1", old, Duration::from_secs(30));
    // On its old ports: the banner's metrics address answers again.
    let gw1_metrics = up.replica_metrics()[1].clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            std::net::TcpStream::connect(&gw1_metrics).is_ok()
        })
        .await
    );
    seen.extend(every_pid(&up));

    // The edge: nothing answers until it is back, then everything does.
    let old = up.pid_of("edge").unwrap();
    signal(old, libc::SIGKILL);
    up.wait_restarted("edge", old, Duration::from_secs(30));
    for sandbox in &sandboxes {
        assert_eq!(
            echo_within(&client, sandbox, Duration::from_secs(60)).await,
            "back\n"
        );
    }
    seen.extend(every_pid(&up));

    for (process, kind) in [
        (victim.as_str(), "host"),
        ("gw-1", "replica"),
        ("edge", "edge"),
    ] {
        let labels = format!(r#"{{process="{process}",kind="{kind}"}}"#);
        assert_eq!(
            up_metric(&up, &format!("openshell_up_process_exits_total{labels}")),
            Some(1.0)
        );
        assert_eq!(
            up_metric(&up, &format!("openshell_up_process_restarts_total{labels}")),
            Some(1.0)
        );
        assert_eq!(
            up_metric(&up, &format!("openshell_up_process_up{labels}")),
            Some(1.0)
        );
    }
    assert_eq!(
        up_metric(
            &up,
            r#"openshell_up_process_exits_total{process="gw-0",kind="replica"}"#
        ),
        Some(0.0)
    );
    let (code, text) = status_command(&up);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("7 of 7 processes running"), "{text}");

    assert_eq!(up.interrupt(), Some(0));
    seen.sort();
    seen.dedup();
    assert_all_stopped(&seen).await;
}

/// `up --restart never` leaves a killed process down and keeps serving
/// with the rest: a replica of two gets SIGKILL; it stays down (status file,
/// `openshell-gateway status` exits 1 naming it, `up` says so), both
/// sandboxes (per-sandbox supervisors) run execs through the other replica,
/// and Ctrl-C still stops everything, the supervisors included.
#[tokio::test]
async fn up_restart_never_leaves_a_killed_replica_down() {
    let mut up = Up::start(&[
        "--replicas",
        "2",
        "--restart",
        "never",
        "--isolation",
        "none",
    ]);
    let client = sdk_client(&up).await;
    let mut sandboxes = Vec::new();
    for _ in 0..2 {
        sandboxes.push(sdk_create_ready(&client).await);
    }
    let mut seen = every_pid(&up);
    let old = up.pid_of("gw-1").unwrap();
    signal(old, libc::SIGKILL);
    let entry = up.wait_state("gw-1", "down", Duration::from_secs(10));
    assert!(entry["pid"].is_null(), "{entry}");
    for sandbox in &sandboxes {
        assert_eq!(
            echo_within(&client, sandbox, Duration::from_secs(60)).await,
            "back\n"
        );
    }
    // Still down a while later, and said so.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(up.process("gw-1")["state"], "down");
    assert!(!is_running(old));
    assert!(up.printed("gw-1 exited unexpectedly"), "{:?}", up.output());
    assert!(up.printed("not running: gw-1 (down)"), "{:?}", up.output());
    let (code, text) = status_command(&up);
    assert_eq!(code, Some(1), "{text}");
    let line = text.lines().find(|l| l.starts_with("gw-1")).unwrap();
    assert!(line.contains("down") && line.contains("SIGKILL"), "{text}");
    assert_eq!(
        up_metric(
            &up,
            r#"openshell_up_process_up{process="gw-1",kind="replica"}"#
        ),
        Some(0.0)
    );
    seen.extend(every_pid(&up));

    assert_eq!(up.interrupt(), Some(0));
    assert_all_stopped(&seen).await;
}

/// `up --control stdin` takes orders, one a line, and answers each: `kill`
/// and `stop` hold a process down (no restart) until `start`, `restart`
/// stops and starts it; a bad order is refused with a reason and changes
/// nothing. When its standard input ends (the harness holding it died),
/// `up` stops everything as Ctrl-C does.
#[tokio::test]
async fn up_takes_orders_on_stdin_and_stops_when_it_ends() {
    let mut up = Up::start(&[
        "--replicas",
        "2",
        "--control",
        "stdin",
        "--isolation",
        "none",
    ]);
    let client = sdk_client(&up).await;
    let sandbox = sdk_create_ready(&client).await;
    let mut seen = every_pid(&up);

    for (order, says) in [
        ("explode gw-1", "control: error unknown order \"explode\""),
        ("kill gw-9", "control: error no process named \"gw-9\""),
        (
            "kill",
            "control: error an order is `stop|kill|start|restart NAME`",
        ),
        ("cut-route gw-9", "control: error no replica named \"gw-9\""),
        ("start gw-1", "control: ok gw-1 is running"),
    ] {
        assert!(
            up.order(order).starts_with(says),
            "{order}: {:?}",
            up.output()
        );
    }
    assert!(
        up.status()["processes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["state"] == "running")
    );

    let old = up.pid_of("gw-1").unwrap();
    assert_eq!(up.order("kill gw-1"), "control: ok gw-1 killed");
    assert!(!is_running(old));
    assert_eq!(
        echo_within(&client, &sandbox, Duration::from_secs(60)).await,
        "back\n"
    );
    // Held down: the restart policy does not bring it back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let entry = up.process("gw-1");
    assert_eq!(
        (entry["state"].as_str(), entry["pid"].as_i64()),
        (Some("stopped"), None)
    );
    assert!(
        up.order("start gw-1")
            .starts_with("control: ok gw-1 started (pid ")
    );
    assert_eq!(up.process("gw-1")["state"], "running");

    // A crash (restart always) and then an order during the restart's
    // backoff: the order wins, the replica stays down until started.
    let old = up.pid_of("gw-1").unwrap();
    signal(old, libc::SIGKILL);
    up.wait_state("gw-1", "restarting", Duration::from_secs(10));
    assert_eq!(up.order("stop gw-1"), "control: ok gw-1 stopped");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(up.process("gw-1")["state"], "stopped");
    assert!(
        up.order("start gw-1")
            .starts_with("control: ok gw-1 started (pid ")
    );

    let old = up.pid_of("edge").unwrap();
    assert!(
        up.order("restart edge")
            .starts_with("control: ok edge started (pid ")
    );
    assert_ne!(up.pid_of("edge"), Some(old));
    assert_eq!(
        echo_within(&client, &sandbox, Duration::from_secs(60)).await,
        "back\n"
    );
    // The edge loses its route to the replica that does not own the
    // sandbox, and the client believes that one is the owner (a stale
    // cache): the hinted exec is answered "not forwarded" by the edge and
    // retried once unhinted. (Cutting the owner's route would also cut its
    // supervisor's relay claims, which come through the edge: that exec
    // fails UNAVAILABLE.)
    let (_, owner) = client
        .sandboxes()
        .get_with_owner(&sandbox, CallOptions::new())
        .await
        .unwrap();
    let other = match owner.as_deref() {
        Some("gw-0") => "gw-1",
        Some("gw-1") => "gw-0",
        other => panic!("owner {other:?}"),
    };
    assert_eq!(
        up.order(&format!("cut-route {other}")),
        format!("control: ok route to {other} cut")
    );
    let retries = client.routing_stats().unrouted_retries;
    client.assume_owner(&sandbox, other).unwrap();
    assert_eq!(
        sdk_echo(&client, &sandbox, "around").await.unwrap(),
        "around\n"
    );
    assert_eq!(client.routing_stats().unrouted_retries, retries + 1);
    assert_eq!(
        up.order(&format!("restore-route {other}")),
        format!("control: ok route to {other} restored")
    );
    client.assume_owner(&sandbox, other).unwrap();
    assert_eq!(
        sdk_echo(&client, &sandbox, "relayed").await.unwrap(),
        "relayed\n"
    );
    assert_eq!(client.routing_stats().unrouted_retries, retries + 1);
    assert!(
        up.order("cut-route edge")
            .starts_with("control: error no replica named \"edge\"")
    );

    assert_eq!(up.order("stop gw-0"), "control: ok gw-0 stopped");
    assert_eq!(
        echo_within(&client, &sandbox, Duration::from_secs(60)).await,
        "back\n"
    );
    seen.extend(every_pid(&up));

    up.close_control();
    assert_eq!(up.wait_exit(Duration::from_secs(60)), Some(0));
    assert!(up.printed("stopping the cluster"));
    seen.sort();
    seen.dedup();
    assert_all_stopped(&seen).await;
}

/// `up` killed with SIGKILL (no chance to stop anything) still takes its
/// replicas, edge and hosts with it: each gets SIGTERM from the kernel
/// when its parent dies, and stops as it would on Ctrl-C.
#[tokio::test]
async fn up_killed_with_sigkill_takes_its_processes_with_it() {
    let up = Up::start(&["--replicas", "2", "--hosts", "1", "--isolation", "none"]);
    let mut pids: Vec<i32> = up.status()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["pid"].as_i64().map(|p| p as i32))
        .collect();
    assert_eq!(pids.len(), 4, "2 replicas, the edge, a host");
    signal(up.pid(), libc::SIGKILL);
    pids.push(up.pid());
    assert_all_stopped(&pids).await;
}

/// The same with one supervisor per sandbox: the replicas, orphaned by the
/// dead `up`, stop every sandbox supervisor as they exit
/// (`--stop-sandboxes-if-orphaned`), though a replica that `up` itself
/// stops leaves them to the others.
#[tokio::test]
async fn up_killed_with_sigkill_takes_its_sandbox_supervisors_too() {
    let up = Up::start(&["--replicas", "2", "--isolation", "none"]);
    let client = sdk_client(&up).await;
    for _ in 0..2 {
        sdk_create_ready(&client).await;
    }
    let mut pids = every_pid(&up);
    assert_eq!(
        pids.len(),
        5,
        "2 replicas, the edge, 2 supervisors: {pids:?}"
    );
    signal(up.pid(), libc::SIGKILL);
    pids.push(up.pid());
    assert_all_stopped(&pids).await;
}

/// `up --hosts 2 --restart never --host-lost-after 20`: a killed host stays
/// down, and after 20 s its sandbox starts again on the other host, with a
/// `HostLost` condition saying so; `--host-lost-after` needs `--hosts`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_restarts_a_dead_hosts_sandbox_on_a_live_host() {
    let dir = tempfile::tempdir().unwrap();
    let refused = Command::new(bin("openshell-gateway"))
        .args(["up", "--host-lost-after", "20", "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--hosts"));

    let mut up = Up::start(&[
        "--replicas",
        "2",
        "--hosts",
        "2",
        "--restart",
        "never",
        "--host-lost-after",
        "20",
        "--isolation",
        "none",
    ]);
    let client = sdk_client(&up).await;
    let name = sdk_create_ready(&client).await;
    let id = client
        .sandboxes()
        .get(&name, CallOptions::new())
        .await
        .unwrap()
        .id;
    let on = |host: &str| up.data_dir().join("hosts").join(host).join(&id).exists();
    let (victim, survivor) = if on("h-0") {
        ("h-0", "h-1")
    } else {
        ("h-1", "h-0")
    };
    assert!(on(victim), "{name} is under no host");
    let mut seen = every_pid(&up);
    signal(up.pid_of(victim).unwrap(), libc::SIGKILL);
    up.wait_state(victim, "down", Duration::from_secs(10));

    let moved = tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            let sandbox = client.sandboxes().get(&name, CallOptions::new()).await;
            if let Ok(sandbox) = sandbox
                && sandbox.is_ready()
                && let Some(lost) = sandbox
                    .proto
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.iter().find(|c| c.r#type == "HostLost"))
            {
                break lost.clone();
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await
    .expect("the sandbox never came back on the live host");
    assert_eq!(moved.reason, "Restarted", "{moved:?}");
    assert!(moved.message.contains(survivor), "{moved:?}");
    assert_eq!(
        echo_within(&client, &name, Duration::from_secs(30)).await,
        "back\n"
    );
    assert!(on(survivor));
    seen.extend(every_pid(&up));
    assert_eq!(up.interrupt(), Some(0));
    assert_all_stopped(&seen).await;
}
