//! Benchmarks against the real gateway (binaries from `OPENSHELL_BIN_DIR`,
//! release builds via `make bench`). Each prints its figures in one run;
//! every comparison runs its arms interleaved (`measure`): rounds of one
//! small batch per arm, the arms in a random order per round.
//!
//! - `openshell-bench gateway` (the default, `gateway.rs`): exec round-trip
//!   latency of `true`, and ForwardTcp throughput through the gateway as a
//!   ratio of a plain loopback TCP copy.
//! - `openshell-bench sdk` (`sdk.rs`): `Client::forward` throughput as a
//!   ratio of a plain copy, and `GetSandbox` latency through the SDK against
//!   a plain tonic client ("SDK vs native").
//! - `openshell-bench routing` (`routing.rs`): a 3-replica cluster behind
//!   the edge: hinted vs peer-relayed exec and forward, and the owner
//!   lookup's cost per exec measured with cold, default and warm caches.
//! - `openshell-bench config` (`config.rs`): push config delivery to N
//!   sdk-core `ConfigSession`s (N = 1000, or
//!   `OPENSHELL_BENCH_CONFIG_SESSIONS`) against one gateway with the test
//!   driver `none`: the time for one global setting change to reach every
//!   session, builds per second, and the ratio of writes to builds under
//!   bursts. `OPENSHELL_BENCH_CONFIG_BUILD_DELAY_MS` simulates a slower
//!   store.
//! - `openshell-bench isolation` (`isolation.rs`): exec round trips with
//!   `--isolation namespaces` against `none`.
//! - `openshell-bench all`: every one of them.
//!
//! `OPENSHELL_BENCH_FORWARD_MIB` sets the bytes per forward copy (default
//! 256 MiB).

mod config;
mod gateway;
mod isolation;
mod loopback;
mod measure;
mod routing;
mod sdk;

#[tokio::main]
async fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("gateway") | None => gateway::run().await,
        Some("sdk") => sdk::run().await,
        Some("routing") => routing::run().await,
        Some("config") => config::run().await,
        Some("isolation") => isolation::run().await,
        Some("all") => {
            gateway::run().await;
            sdk::run().await;
            routing::run().await;
            config::run().await;
            isolation::run().await;
        }
        Some(other) => {
            eprintln!(
                "unknown benchmark {other:?}; try: gateway, sdk, routing, config, isolation, all"
            );
            std::process::exit(2);
        }
    }
}
