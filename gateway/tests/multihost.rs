//! A cluster across hosts, and the faults between them. Every host is a
//! network namespace of testkit's lab (`testkit/src/lab.rs`): PostgreSQL on
//! `db`, three replicas on `gw-0..2` listening on their host addresses and
//! advertising them to peers and redirects, the built-in edge on `edge`,
//! shared supervisor hosts on `host-a` and `host-b`, and the SDK client on
//! `client`. Nothing runs on loopback but each process's own metrics.
//!
//! One test builds the cluster once and runs the faults in turn, each with
//! an exec driver running through it; it prints one evidence row per fault
//! (`cargo test -p openshell-gateway --test multihost -- --nocapture`). The
//! outcome each row must show is in docs/DEPLOYMENT.md.
//!
//! Membership runs on test timings (refresh 1 s, TTL 6 s) so the fenced
//! replica is seen within seconds; the production defaults are 10 s and
//! 30 s, and the docs give every figure in terms of them.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TOKEN;
use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, ExecRequest};
use openshell_testkit::cluster::Postgres;
use openshell_testkit::lab::Lab;
use openshell_testkit::tls::make_pki_for;
use openshell_testkit::{
    Edge, Gateway, GatewayOptions, HostOptions, SupervisorHost, issue_host_token_in_database,
    metric_value,
};
use tokio_util::sync::CancellationToken;

const HOSTS: [&str; 8] = [
    "db", "gw-0", "gw-1", "gw-2", "edge", "host-a", "host-b", "client",
];
const REPLICAS: [&str; 3] = ["gw-0", "gw-1", "gw-2"];
const GRPC_PORT: u16 = 50051;
const EDGE_PORT: u16 = 17670;
const SANDBOXES: usize = 6;
const MEMBER_TTL: Duration = Duration::from_secs(6);

/// Fields drop in order: processes first, the lab (their namespaces) last.
struct World {
    hosts: Vec<SupervisorHost>,
    _edge: Edge,
    replicas: Vec<Gateway>,
    /// Locked only to restart it.
    pg: Mutex<Postgres>,
    _pki_dir: tempfile::TempDir,
    /// The private CA's certificate, when TLS is on.
    ca_pem: Option<Vec<u8>>,
    lab: Lab,
}

impl World {
    /// `tls`: replicas serve TLS on a private CA (peers, hosts and the
    /// edge verify it); else everything is cleartext h2c.
    fn start(lab: Lab, tls: bool) -> Self {
        let pki_dir = tempfile::tempdir().unwrap();
        // One certificate names every replica's and the edge's address.
        let named: Vec<std::net::IpAddr> = REPLICAS
            .iter()
            .chain(&["edge"])
            .map(|host| lab.addr(host).into())
            .collect();
        let pki = make_pki_for(pki_dir.path(), &named);
        let pg = Postgres::start_in(&lab.launcher("db"), lab.addr("db"));
        let peer_token = format!("peer-{}", std::process::id());
        let replicas: Vec<Gateway> = REPLICAS
            .iter()
            .map(|id| {
                Gateway::start(GatewayOptions {
                    tokens: vec![TOKEN.into()],
                    replica_id: Some((*id).into()),
                    database_url: Some(pg.url()),
                    peer_token: Some(peer_token.clone()),
                    tls: tls.then(|| (pki.server_cert.clone(), pki.server_key.clone())),
                    launcher: lab.launcher(id),
                    listen: Some(SocketAddr::new(lab.addr(id).into(), GRPC_PORT)),
                    extra_args: [
                        "--driver",
                        "hosts",
                        "--member-refresh-ms",
                        "1000",
                        "--member-ttl-ms",
                        "6000",
                        "--trust-forwarded-authority",
                    ]
                    .map(String::from)
                    .into_iter()
                    .chain(["--peer-ca".into(), pki.ca_cert.display().to_string()])
                    .collect(),
                    ..GatewayOptions::default()
                })
            })
            .collect();
        let scheme = if tls { "https" } else { "http" };
        let routes: Vec<(&str, String)> = REPLICAS
            .iter()
            .map(|id| (*id, format!("{scheme}://{}:{GRPC_PORT}", lab.addr(id))))
            .collect();
        let routes: Vec<(&str, &str)> =
            routes.iter().map(|(id, url)| (*id, url.as_str())).collect();
        let edge = Edge::start_in(
            &lab.launcher("edge"),
            SocketAddr::new(lab.addr("edge").into(), EDGE_PORT),
            &routes,
            &if tls {
                vec![
                    "--allow-public",
                    "--upstream-ca",
                    pki.ca_cert.to_str().unwrap(),
                    "--tls-cert",
                    pki.server_cert.to_str().unwrap(),
                    "--tls-key",
                    pki.server_key.to_str().unwrap(),
                ]
            } else {
                vec!["--allow-public"]
            },
        );
        let mut world = Self {
            hosts: Vec::new(),
            _edge: edge,
            replicas,
            pg: Mutex::new(pg),
            ca_pem: tls.then(|| std::fs::read(&pki.ca_cert).unwrap()),
            _pki_dir: pki_dir,
            lab,
        };
        for host in ["host-a", "host-b"] {
            let url = world.pg.lock().unwrap().url();
            let dir = world._pki_dir.path().to_owned();
            // From a host that reaches the database.
            let token = world
                .lab
                .run_in("client", || issue_host_token_in_database(&url, &dir, host));
            world.hosts.push(SupervisorHost::start(HostOptions {
                gateway: world.edge_url(),
                host_id: host.into(),
                token,
                isolation: "none".into(),
                extra_args: vec!["--ca-file".into(), pki.ca_cert.display().to_string()],
                launcher: world.lab.launcher(host),
            }));
        }
        world
    }

    fn edge_url(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}:{EDGE_PORT}", self.lab.addr("edge"))
    }

    /// A client of the edge from the client host: over TLS on the private
    /// CA, or cleartext (the token allowed over it, off loopback).
    async fn client(&self, owner_routing: bool) -> Client {
        let mut config = ClientConfig::builder(self.edge_url())
            .token(TOKEN)
            .owner_routing(owner_routing);
        config = match &self.ca_pem {
            Some(pem) => config.ca_pem(pem.clone()),
            None => config.allow_cleartext_token(true),
        };
        Client::connect(config.build().unwrap())
            .await
            .expect("connect to the edge")
    }

    fn replica(&self, id: &str) -> &Gateway {
        &self.replicas[REPLICAS.iter().position(|r| *r == id).unwrap()]
    }

    fn metric(&self, id: &str, sample: &str) -> f64 {
        metric_value(&self.replica(id).metrics(), sample).unwrap_or(0.0)
    }

    fn ready(&self, id: &str) -> bool {
        openshell_testkit::http_get(self.replica(id).metrics_addr, "/readyz") == "ready\n"
    }

    /// Peer relays summed over the replicas: requests that paid a hop.
    fn peer_relays(&self) -> f64 {
        REPLICAS
            .iter()
            .map(|id| {
                ["exec", "tcp"]
                    .iter()
                    .map(|kind| {
                        self.metric(
                            id,
                            &format!(
                                "openshell_server_routed_request_attempts_total{{route=\"peer\",relay_kind=\"{kind}\",outcome=\"success\"}}"
                            ),
                        )
                    })
                    .sum::<f64>()
            })
            .sum()
    }

    /// Every line of every sandbox's marks file, on either host.
    fn marks(&self, ids: &[String]) -> HashMap<String, usize> {
        let mut seen = HashMap::new();
        for host in &self.hosts {
            for id in ids {
                let Ok(text) = std::fs::read_to_string(host.workdir(id).join("marks")) else {
                    continue;
                };
                for line in text.lines() {
                    *seen.entry(line.to_owned()).or_insert(0) += 1;
                }
            }
        }
        seen
    }
}

/// One exec of the driver.
#[derive(Debug, Clone)]
struct Outcome {
    at: Instant,
    mark: String,
    /// `None`: it succeeded; else the error's code.
    failed: Option<String>,
}

/// Execs, one sandbox after another, each appending its unique mark to the
/// sandbox's `marks` file, until stopped.
async fn drive(
    client: Client,
    names: Vec<String>,
    log: Arc<Mutex<Vec<Outcome>>>,
    stop: CancellationToken,
) {
    let mut n = 0u64;
    while !stop.is_cancelled() {
        for name in &names {
            n += 1;
            let mark = format!("{name}:{n}");
            let request = ExecRequest::new(
                name.as_str(),
                ["sh", "-c", &format!("echo {mark} >> marks")],
            );
            let result = client
                .exec(
                    request,
                    CallOptions::new().deadline(Duration::from_secs(20)),
                )
                .await;
            let failed = match result {
                Ok(out) if out.exit_code == 0 => None,
                Ok(out) => Some(format!("exit {}", out.exit_code)),
                Err(err) => Some(err.code().to_owned()),
            };
            log.lock().unwrap().push(Outcome {
                at: Instant::now(),
                mark,
                failed,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The evidence of one fault.
struct Row {
    fault: &'static str,
    detect: Option<Duration>,
    recover: Option<Duration>,
    attempted: usize,
    failed: Vec<String>,
}

impl Row {
    fn print(&self, run_twice: usize, lost: usize) {
        let secs = |d: Option<Duration>| {
            d.map(|d| format!("{:.1} s", d.as_secs_f64()))
                .unwrap_or_else(|| "-".into())
        };
        let mut codes: HashMap<&str, usize> = HashMap::new();
        for code in &self.failed {
            *codes.entry(code).or_insert(0) += 1;
        }
        let mut codes: Vec<String> = codes.iter().map(|(c, n)| format!("{n} {c}")).collect();
        codes.sort();
        println!(
            "| {} | {} | {} | {} | {} ({}) | {run_twice} | {lost} |",
            self.fault,
            secs(self.detect),
            secs(self.recover),
            self.attempted,
            self.failed.len(),
            if codes.is_empty() {
                "-".into()
            } else {
                codes.join(", ")
            },
        );
    }
}

/// The outcomes from `since`, and the time from `since` until the last
/// failure was followed by a full round of successes (`None`: no failure).
fn window(log: &Mutex<Vec<Outcome>>, since: Instant) -> (Vec<Outcome>, Option<Duration>) {
    let outcomes: Vec<Outcome> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|o| o.at >= since)
        .cloned()
        .collect();
    let last_failure = outcomes.iter().rposition(|o| o.failed.is_some());
    let recovered = last_failure.and_then(|i| outcomes.get(i + SANDBOXES).map(|o| o.at - since));
    (outcomes, recovered)
}

/// Waits (bounded) until `check` holds; returns how long it took.
async fn until(limit: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if check() {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Waits until the driver has logged `rounds` rounds of successes after now.
async fn steady(log: &Mutex<Vec<Outcome>>, rounds: usize, limit: Duration) -> bool {
    let since = Instant::now();
    until(limit, || {
        let outcomes = log.lock().unwrap();
        let recent: Vec<&Outcome> = outcomes.iter().filter(|o| o.at >= since).collect();
        recent.len() >= rounds * SANDBOXES
            && recent[recent.len() - rounds * SANDBOXES..]
                .iter()
                .all(|o| o.failed.is_none())
    })
    .await
    .is_some()
}

#[test]
fn a_cluster_across_hosts_survives_partitions() {
    if let Some(reason) = Lab::skip_reason() {
        eprintln!("{reason}");
        return;
    }
    let lab = Lab::start(&HOSTS).expect("the lab starts (root is here)");
    let tls = std::env::var("OPENSHELL_TEST_LAB_CLEARTEXT").is_err();
    let world = World::start(lab, tls);
    world.lab.run_in("client", || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(scenario(&world));
    });
}

async fn scenario(world: &World) {
    let client = world.client(true).await;
    let hosts_held = || -> f64 {
        REPLICAS
            .iter()
            .map(|r| world.metric(r, "openshell_server_supervisor_hosts"))
            .sum()
    };
    if until(Duration::from_secs(30), || hosts_held() == 2.0)
        .await
        .is_none()
    {
        let logs: Vec<String> = world.hosts.iter().map(SupervisorHost::log).collect();
        panic!(
            "the supervisor hosts did not connect:\n{}",
            logs.join("\n---\n")
        );
    }
    let mut ids = Vec::new();
    let names: Vec<String> = (0..SANDBOXES).map(|i| format!("multi-{i}")).collect();
    for name in &names {
        client
            .sandboxes()
            .create(CreateSandbox::new().name(name.as_str()), CallOptions::new())
            .await
            .expect("create");
    }
    for name in &names {
        let sandbox = client
            .sandboxes()
            .wait_ready(name, CallOptions::new().deadline(Duration::from_secs(60)))
            .await
            .unwrap_or_else(|err| panic!("{name} not ready: {err}"));
        ids.push(sandbox.id);
    }
    let owners = |client: Client, names: Vec<String>| async move {
        let mut owners = Vec::new();
        for name in &names {
            let (_, owner) = client
                .sandboxes()
                .get_with_owner(name, CallOptions::new())
                .await
                .expect("get with owner");
            owners.push(owner.expect("an owner is reported"));
        }
        owners
    };

    // Hinted execs through the edge reach each sandbox's owner: no peer hop.
    let relays_before = world.peer_relays();
    for name in &names {
        let out = client
            .exec(
                ExecRequest::new(name.as_str(), ["true"]),
                CallOptions::new(),
            )
            .await
            .expect("exec");
        assert_eq!(out.exit_code, 0);
    }
    let hops = world.peer_relays() - relays_before;
    let stats = client.routing_stats();
    println!(
        "hinted execs across hosts: {} hinted, {} peer hops, {} unrouted retries",
        stats.hinted, hops, stats.unrouted_retries
    );
    assert_eq!(hops, 0.0, "hinted execs paid peer hops");
    assert_eq!(stats.unrouted_retries, 0);

    let log = Arc::new(Mutex::new(Vec::new()));
    let stop = CancellationToken::new();
    let driver = tokio::spawn(drive(
        client.clone(),
        names.clone(),
        log.clone(),
        stop.clone(),
    ));
    assert!(
        steady(&log, 2, Duration::from_secs(30)).await,
        "the driver never ran cleanly"
    );
    let victim = owners(client.clone(), names.clone())
        .await
        .into_iter()
        .next()
        .unwrap();
    let mut rows = Vec::new();
    println!("victim replica: {victim}");
    println!("| fault | detected | recovered | execs | failed | run twice | sandboxes lost |");
    println!("|---|---|---|---|---|---|---|");

    // 1. A slow link between the edge and the victim: streams keep working,
    //    ownership does not move.
    let owners_before = owners(client.clone(), names.clone()).await;
    let since = Instant::now();
    world
        .lab
        .shape("edge", &victim, Duration::from_millis(200), 0.01);
    tokio::time::sleep(Duration::from_secs(8)).await;
    world.lab.unshape("edge", &victim);
    let (outcomes, recover) = window(&log, since);
    assert_eq!(
        owners(client.clone(), names.clone()).await,
        owners_before,
        "a slow link moved ownership"
    );
    assert!(REPLICAS.iter().all(|r| world.ready(r)));
    rows.push(row(
        "slow link edge-replica (200 ms, 1% loss)",
        None,
        recover,
        &outcomes,
    ));
    assert!(steady(&log, 1, Duration::from_secs(30)).await);

    // 2. The victim cut from its peers only: relays to it fail with a clear
    //    UNAVAILABLE, never hang; hinted execs still reach it directly.
    let unhinted = world.client(false).await;
    let since = Instant::now();
    for other in REPLICAS.iter().filter(|r| **r != victim) {
        world.lab.cut(&victim, other);
    }
    let victim_owned: Vec<String> = names
        .iter()
        .zip(&owners_before)
        .filter(|(_, o)| **o == victim)
        .map(|(n, _)| n.clone())
        .collect();
    let mut relay_failures = Vec::new();
    let mut detect = None;
    for _ in 0..6 {
        let begun = Instant::now();
        let result = unhinted
            .exec(
                ExecRequest::new(victim_owned[0].as_str(), ["true"]),
                CallOptions::new().deadline(Duration::from_secs(40)),
            )
            .await;
        if let Err(err) = result {
            assert_eq!(err.code(), "unavailable", "{err}");
            detect.get_or_insert(since.elapsed());
            relay_failures.push((begun.elapsed(), err.to_string()));
        }
    }
    for other in REPLICAS.iter().filter(|r| **r != victim) {
        world.lab.heal(&victim, other);
    }
    let (outcomes, recover) = window(&log, since);
    for (took, message) in &relay_failures {
        println!("  unhinted exec relayed to the cut owner: {took:?}: {message}");
        assert!(
            *took < Duration::from_secs(20),
            "a relay to a cut peer hung {took:?}"
        );
    }
    rows.push(row(
        "replica cut from its peers",
        detect,
        recover,
        &outcomes,
    ));
    assert!(steady(&log, 1, Duration::from_secs(30)).await);

    // 3. The victim cut from the edge only: hinted calls to it are not
    //    forwarded, retried once unrouted and relayed by another replica.
    let retries_before = client.routing_stats().unrouted_retries;
    let since = Instant::now();
    world.lab.cut("edge", &victim);
    let detect = until(Duration::from_secs(30), || {
        client.routing_stats().unrouted_retries > retries_before
    })
    .await;
    assert!(
        steady(&log, 2, Duration::from_secs(60)).await,
        "execs did not recover while the edge could not reach {victim}"
    );
    world.lab.heal("edge", &victim);
    let (outcomes, recover) = window(&log, since);
    let retries = client.routing_stats().unrouted_retries - retries_before;
    println!("  unrouted retries while the edge could not reach {victim}: {retries}");
    rows.push(row("replica cut from the edge", detect, recover, &outcomes));
    assert!(steady(&log, 1, Duration::from_secs(30)).await);

    // 4. The victim cut from the database: fenced within the TTL, its
    //    hosts move to the others; healed, it rejoins and sessions go home.
    let since = Instant::now();
    world.lab.cut("db", &victim);
    let fenced = until(MEMBER_TTL * 4, || !world.ready(&victim)).await;
    let fenced_at = since.elapsed();
    let others_moved = until(Duration::from_secs(60), || {
        world.metric(&victim, "openshell_server_supervisor_hosts") == 0.0
    })
    .await;
    let hosts_gone_at = since.elapsed();
    assert!(fenced.is_some(), "{victim} was not fenced");
    assert!(
        others_moved.is_some(),
        "{victim} kept its hosts while fenced"
    );
    let sessions_elsewhere = until(Duration::from_secs(90), || {
        let held: f64 = REPLICAS
            .iter()
            .filter(|r| **r != victim)
            .map(|r| world.metric(r, "openshell_server_supervisor_sessions"))
            .sum();
        held == SANDBOXES as f64
    })
    .await;
    println!(
        "  {victim} cut from the database: fenced {fenced_at:?}, hosts gone {hosts_gone_at:?}, \
         every sandbox session on another replica {:?} after the cut",
        sessions_elsewhere.map(|_| since.elapsed())
    );
    assert!(
        steady(&log, 2, Duration::from_secs(60)).await,
        "execs did not recover while {victim} was fenced"
    );
    let (outcomes, recover) = window(&log, since);
    rows.push(row(
        "replica cut from the database",
        fenced,
        recover,
        &outcomes,
    ));
    let healed = Instant::now();
    world.lab.heal("db", &victim);
    let rejoined = until(MEMBER_TTL * 4, || world.ready(&victim)).await;
    assert!(rejoined.is_some(), "{victim} did not come back");
    let members = |id: &str| world.metric(id, "openshell_server_ring_members");
    assert!(
        until(Duration::from_secs(30), || REPLICAS
            .iter()
            .all(|r| members(r) == 3.0))
        .await
        .is_some(),
        "the ring did not grow back"
    );
    // Host sessions stay where they landed (no host rebalancer): shown,
    // not asserted.
    let placement: Vec<String> = REPLICAS
        .iter()
        .map(|r| {
            format!(
                "{r}: {}",
                world.metric(r, "openshell_server_supervisor_hosts")
            )
        })
        .collect();
    println!("  hosts held after the heal: {}", placement.join(", "));
    let (outcomes, recover) = window(&log, healed);
    rows.push(row(
        "  ... and the link healed",
        rejoined,
        recover,
        &outcomes,
    ));
    assert!(steady(&log, 1, Duration::from_secs(30)).await);

    // 5. The database host restarted: store calls fail during the outage,
    //    the cluster recovers by itself.
    let since = Instant::now();
    world.pg.lock().unwrap().stop_immediately();
    let detect = until(Duration::from_secs(30), || {
        log.lock()
            .unwrap()
            .iter()
            .any(|o| o.at >= since && o.failed.is_some())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    world.pg.lock().unwrap().start_again();
    assert!(
        steady(&log, 2, Duration::from_secs(90)).await,
        "the cluster did not recover from the database restart"
    );
    let (outcomes, recover) = window(&log, since);
    rows.push(row(
        "database host restarted (3 s down)",
        detect,
        recover,
        &outcomes,
    ));

    stop.cancel();
    driver.await.unwrap();
    // Every mark at most once; every successful one exactly once.
    let marks = world.marks(&ids);
    let all: Vec<Outcome> = log.lock().unwrap().clone();
    let twice: Vec<&String> = marks
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(m, _)| m)
        .collect();
    let missing: Vec<&Outcome> = all
        .iter()
        .filter(|o| o.failed.is_none() && !marks.contains_key(&o.mark))
        .collect();
    let lost = names.len()
        - futures::future::join_all(names.iter().map(|name| {
            let client = client.clone();
            async move {
                client
                    .exec(
                        ExecRequest::new(name.as_str(), ["true"]),
                        CallOptions::new(),
                    )
                    .await
                    .is_ok()
            }
        }))
        .await
        .into_iter()
        .filter(|ok| *ok)
        .count();
    for row in &rows {
        row.print(twice.len(), lost);
    }
    assert!(twice.is_empty(), "execs ran twice: {twice:?}");
    assert!(
        missing.is_empty(),
        "successful execs left no mark: {missing:?}"
    );
    assert_eq!(lost, 0, "sandboxes were lost");
}

fn row(
    fault: &'static str,
    detect: Option<Duration>,
    recover: Option<Duration>,
    outcomes: &[Outcome],
) -> Row {
    Row {
        fault,
        detect,
        recover,
        attempted: outcomes.len(),
        failed: outcomes.iter().filter_map(|o| o.failed.clone()).collect(),
    }
}
