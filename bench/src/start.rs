//! `openshell-bench start`: how long a local cluster takes from start to
//! ready (`testing::LocalCluster::start`: `up` started, every replica
//! serving, every ring full, the banner read), for 1 and 3 replicas, 10
//! starts each (`OPENSHELL_BENCH_START_ROUNDS`), interleaved; and how long
//! its clean stop takes. Prints p50 and max. The executables come from
//! `OPENSHELL_BIN_DIR` (release with `make bench BENCH=start`).

use std::time::{Duration, Instant};

use openshell_sdk::testing::{LocalCluster, LocalClusterOptions};

fn p50_max(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort();
    (
        samples[samples.len() / 2],
        *samples.last().expect("samples"),
    )
}

pub async fn run() {
    let rounds: usize = std::env::var("OPENSHELL_BENCH_START_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let gateway = openshell_testkit::bin("openshell-gateway");
    let arms = [1usize, 3];
    let mut ready: Vec<Vec<Duration>> = vec![Vec::new(); arms.len()];
    let mut stopped: Vec<Vec<Duration>> = vec![Vec::new(); arms.len()];
    for _ in 0..rounds {
        for (i, replicas) in arms.iter().enumerate() {
            let options = LocalClusterOptions::new()
                .replicas(*replicas)
                .isolation("none")
                .gateway_bin(&gateway);
            let begun = Instant::now();
            let cluster = LocalCluster::start(options).await.expect("cluster starts");
            ready[i].push(begun.elapsed());
            let begun = Instant::now();
            cluster.stop().await.expect("cluster stops");
            stopped[i].push(begun.elapsed());
        }
    }
    println!(
        "local cluster start to ready ({rounds} starts each, binaries from {}):",
        gateway.display()
    );
    for (i, replicas) in arms.iter().enumerate() {
        let (r50, rmax) = p50_max(&mut ready[i]);
        let (s50, smax) = p50_max(&mut stopped[i]);
        println!(
            "  {replicas} replica(s): ready p50 {:.0} ms, max {:.0} ms; clean stop p50 {:.0} ms, max {:.0} ms",
            r50.as_secs_f64() * 1e3,
            rmax.as_secs_f64() * 1e3,
            s50.as_secs_f64() * 1e3,
            smax.as_secs_f64() * 1e3
        );
    }
}
