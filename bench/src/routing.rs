//! `openshell-bench routing`: a 3-replica cluster behind the built-in edge.
//!
//! - Hinted (routing on, so the edge sends every stream to the owner) vs
//!   relayed (routing off, through a second edge whose default route holds
//!   only the other replicas, so every stream is relayed by a peer): the
//!   same hops but the peer relay. Exec round trips in rounds of one batch
//!   per arm, random order per round; forward copies alternating likewise.
//! - The owner lookup's cost per exec, measured over sequences of execs by
//!   three hinted clients that differ only in their owner cache: cold (TTL
//!   zero: a `GetSandbox` lookup before every exec), the default TTL (5 s:
//!   a real client, which looks up again whenever its entry expired) and
//!   warm (TTL of an hour: looked up once, before the measurement). Cold
//!   minus warm is what one lookup adds to an exec; the default client's
//!   lookups per exec (its routing counters) times that is the cost per exec
//!   of a real sequence, and its mean minus warm's measures the same
//!   directly.
//!
//! `OPENSHELL_BENCH_PEER_RELAY=wrapped` runs the replicas with
//! `--no-peer-relay-frames`, so the relayed arm takes the wrapped
//! `PeerRelay`: the comparison for CPU per GB on the relaying replica.

use std::time::{Duration, Instant};

use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox};
use openshell_testkit::cluster::{ClusterOptions, TestCluster, ring_owner};
use openshell_testkit::edge::Edge;

use crate::loopback::{forward_bytes, rate, sandbox_net, sink_server_in, tcp_copy};
use crate::measure::{
    cpu_seconds, exec_round_trips, interleaved, mean, ms, p50_p99, percentile, sorted,
};

const EXEC_ROUNDS: usize = 80;
const EXEC_BATCH: usize = 5;
const COPY_ROUNDS: usize = 3;
/// Owner-lookup arms: cold, default TTL, warm.
const LOOKUP_ROUNDS: usize = 100;
const LOOKUP_BATCH: usize = 4;

async fn connect(url: String, routing: bool, owner_ttl: Option<Duration>) -> Client {
    let mut config = ClientConfig::builder(url).owner_routing(routing);
    if let Some(ttl) = owner_ttl {
        config = config.owner_cache_ttl(ttl);
    }
    Client::connect(config.build().unwrap()).await.unwrap()
}

pub async fn run() {
    let edge = Edge::start(&[]);
    let cluster = TestCluster::start(ClusterOptions {
        replicas: 3,
        supervisor_url: Some(edge.url.clone()),
        extra_args: ["--dev", "--allow-test-flags", "--member-refresh-ms", "300"]
            .into_iter()
            .map(String::from)
            // `OPENSHELL_BENCH_PEER_RELAY=wrapped`: the owner answers
            // PeerRelayFrames UNIMPLEMENTED, so relays take the wrapped
            // PeerRelay (the comparison for the raw one).
            .chain(
                (std::env::var("OPENSHELL_BENCH_PEER_RELAY").as_deref() == Ok("wrapped"))
                    .then(|| "--no-peer-relay-frames".to_owned()),
            )
            .collect(),
        ..ClusterOptions::default()
    });
    let ids = cluster.ids();
    let routes: Vec<(&str, &str)> = ids
        .iter()
        .zip(&cluster.replicas)
        .map(|(id, gw)| (id.as_str(), gw.url.as_str()))
        .collect();
    edge.set_routes(&routes);
    for gw in &cluster.replicas {
        while gw.metric("openshell_server_ring_members") != Some(3.0) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let hinted = connect(edge.url.clone(), true, None).await;
    hinted
        .sandboxes()
        .create(CreateSandbox::new().name("bench"), CallOptions::new())
        .await
        .unwrap();
    let sandbox = hinted
        .sandboxes()
        .wait_ready("bench", CallOptions::new())
        .await
        .unwrap();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let owner = ring_owner(&id_refs, &sandbox.id);
    let others: Vec<(&str, &str)> = routes
        .iter()
        .copied()
        .filter(|(id, _)| *id != owner)
        .collect();
    let relaying_edge = Edge::start(&others);
    let unhinted = connect(relaying_edge.url.clone(), false, None).await;

    // Exec: hinted vs relayed.
    exec_round_trips(&hinted, "bench", 20).await;
    exec_round_trips(&unhinted, "bench", 20).await;
    let pair = [&hinted, &unhinted];
    let mut samples = [Vec::new(), Vec::new()];
    for arm in interleaved(2, EXEC_ROUNDS) {
        samples[arm].extend(exec_round_trips(pair[arm], "bench", EXEC_BATCH).await);
    }
    let [hinted_exec, relayed_exec] = samples.map(sorted);
    let relayed: f64 = cluster
        .replicas
        .iter()
        .map(|gw| {
            gw.metric(r#"openshell_server_routed_request_attempts_total{operation="relay",route="peer",relay_kind="exec",outcome="success"}"#)
                .unwrap_or(0.0)
        })
        .sum();

    // Forward: one warm-up copy each, then alternating in a random order;
    // the best copy of each counts. The sink listens in the sandbox's network.
    let (port, _server) = sink_server_in(&sandbox_net(&hinted, "bench").await);
    let mut forwards = Vec::new();
    for client in pair {
        let forward = client
            .forward("bench", port, "127.0.0.1:0", CallOptions::new())
            .await
            .unwrap();
        tcp_copy(forward.local_addr().port()).await;
        forwards.push(forward);
    }
    // CPU each process spent per GB moved, per arm: the replicas, both
    // edges, the supervisor (the sandbox's), summed over the arm's copies.
    let mut watched: Vec<(String, i32)> = ids
        .iter()
        .zip(&cluster.replicas)
        .filter_map(|(id, gw)| Some((id.clone(), gw.pid()?)))
        .collect();
    watched.extend(edge.pid().map(|pid| ("edge".to_owned(), pid)));
    watched.extend(
        relaying_edge
            .pid()
            .map(|pid| ("relaying edge".to_owned(), pid)),
    );
    let mut cpu = [vec![0.0; watched.len()], vec![0.0; watched.len()]];
    let mut best = [Duration::MAX; 2];
    for arm in interleaved(2, COPY_ROUNDS) {
        let before: Vec<f64> = watched.iter().map(|(_, pid)| cpu_seconds(*pid)).collect();
        best[arm] = best[arm].min(tcp_copy(forwards[arm].local_addr().port()).await);
        for (i, (_, pid)) in watched.iter().enumerate() {
            cpu[arm][i] += cpu_seconds(*pid) - before[i];
        }
    }
    let gb = (forward_bytes() * COPY_ROUNDS) as f64 / 1e9;
    for forward in &forwards {
        forward.close();
    }
    let rates = best.map(rate);

    // Owner lookup: three hinted clients that differ only in their cache.
    let lookup_clients = [
        connect(edge.url.clone(), true, Some(Duration::ZERO)).await,
        connect(edge.url.clone(), true, None).await,
        connect(edge.url.clone(), true, Some(Duration::from_secs(3600))).await,
    ];
    for client in &lookup_clients {
        exec_round_trips(client, "bench", 10).await;
    }
    let before = lookup_clients.each_ref().map(|c| c.routing_stats());
    let mut lookup_samples = [Vec::new(), Vec::new(), Vec::new()];
    let started = Instant::now();
    for arm in interleaved(3, LOOKUP_ROUNDS) {
        let round_trips = exec_round_trips(&lookup_clients[arm], "bench", LOOKUP_BATCH).await;
        lookup_samples[arm].extend(round_trips);
    }
    let sequence = started.elapsed();
    let lookups: Vec<u64> = lookup_clients
        .iter()
        .zip(&before)
        .map(|(c, b)| c.routing_stats().owner_lookups - b.owner_lookups)
        .collect();
    let execs = (LOOKUP_ROUNDS * LOOKUP_BATCH) as f64;
    let means = lookup_samples.each_ref().map(|s| mean(s));
    let [cold, default_ttl, warm] = lookup_samples.map(sorted);
    let per_lookup = ms(means[0]) - ms(means[2]);
    let lookups_per_exec = lookups[1] as f64 / execs;
    let exec_p50 = percentile(&hinted_exec, 0.5);

    let relay_form = match std::env::var("OPENSHELL_BENCH_PEER_RELAY").as_deref() {
        Ok("wrapped") => "PeerRelay (wrapped frames)",
        _ => "PeerRelayFrames",
    };
    println!(
        "routing benchmark (3 replicas behind the built-in edge; sandbox owned by {owner}; peer relay: {relay_form})"
    );
    println!(
        "  exec `true` hinted:    {} ({} execs in {EXEC_ROUNDS} rounds of a batch of {EXEC_BATCH} per arm, random order per round)",
        p50_p99(&hinted_exec),
        hinted_exec.len()
    );
    println!(
        "  exec `true` relayed:   {} ({relayed} execs relayed by a peer)",
        p50_p99(&relayed_exec)
    );
    println!(
        "  ratio exec p50 relayed / hinted: {:.3}",
        percentile(&relayed_exec, 0.5).as_secs_f64() / exec_p50.as_secs_f64()
    );
    println!(
        "  forward hinted:   {:.0} MiB/s (best of {COPY_ROUNDS} interleaved copies)",
        rates[0]
    );
    println!("  forward relayed:  {:.0} MiB/s", rates[1]);
    println!(
        "  ratio forward relayed / hinted: {:.3} (hinted / relayed {:.3})",
        rates[1] / rates[0],
        rates[0] / rates[1]
    );
    println!("  CPU seconds per GB forwarded ({COPY_ROUNDS} copies per arm):");
    for (i, (name, _)) in watched.iter().enumerate() {
        let role = if *name == owner { " (owner)" } else { "" };
        println!(
            "    {name}{role}: hinted {:.2}, relayed {:.2}",
            cpu[0][i] / gb,
            cpu[1][i] / gb
        );
    }
    println!(
        "  owner lookup, {execs} execs per client in {LOOKUP_ROUNDS} rounds of a batch of {LOOKUP_BATCH}, random order per round, over {:.1} s:",
        sequence.as_secs_f64()
    );
    println!(
        "    cold cache (TTL 0):     {}, mean {:.3} ms, {} lookups",
        p50_p99(&cold),
        ms(means[0]),
        lookups[0]
    );
    println!(
        "    default TTL (5 s):      {}, mean {:.3} ms, {} lookups",
        p50_p99(&default_ttl),
        ms(means[1]),
        lookups[1]
    );
    println!(
        "    warm cache (TTL 1 h):   {}, mean {:.3} ms, {} lookups",
        p50_p99(&warm),
        ms(means[2]),
        lookups[2]
    );
    println!(
        "    one lookup adds {per_lookup:.3} ms to an exec (mean cold - mean warm; p50 difference {:.3} ms)",
        ms(percentile(&cold, 0.5)) - ms(percentile(&warm, 0.5))
    );
    println!(
        "    default TTL: {lookups_per_exec:.4} lookups per exec -> {:.4} ms per exec ({:.2}% of an exec p50); measured mean default - warm: {:.4} ms",
        per_lookup * lookups_per_exec,
        100.0 * per_lookup * lookups_per_exec / ms(exec_p50),
        ms(means[1]) - ms(means[2])
    );
}
