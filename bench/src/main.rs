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
//! - `openshell-bench typescript` (`typescript.rs`): `@openshell/sdk`
//!   against a `@grpc/grpc-js` client: the TypeScript program of
//!   `languages` alone.
//! - `openshell-bench languages` (`languages.rs`): one table for every
//!   language, each SDK beside its native gRPC client (unary p50/p99, 100
//!   concurrent callers, forward with iperf3 on both ends, exec stdout),
//!   with raw loopback and equal-hop socat relay chains as limits. The
//!   per-language programs follow `contract`; the Rust one is
//!   `openshell-bench languages-rust` (`lang_rust.rs`).
//! - `openshell-bench scale` (`scale.rs`): gateway memory per idle
//!   supervisor session and per open forward, exec round trips per second
//!   at 64 concurrent callers.
//! - `openshell-bench dataplane` (`dataplane.rs`): iperf3 through the
//!   SDK's forward via the edge and direct to the replica, against raw
//!   loopback and chains of plain TCP relays (socat) with as many hops, and
//!   the CPU time each process on the path spends per GB.
//! - `openshell-bench hosts` (`hosts.rs`): the memory of 100 sandboxes on
//!   the supervisor side, one supervisor per sandbox against 4 shared
//!   supervisor hosts (PSS of every process, namespace isolation on), and
//!   a host on one runtime thread against two workers (PSS and forward).
//! - `openshell-bench start` (`start.rs`): a local cluster's start to
//!   ready and clean stop, 1 and 3 replicas, p50 and max of 10 starts.
//! - `openshell-bench files` (`files.rs`): `Client::upload` / `download`
//!   of a 1 GiB file against `scp` through `openshell ssh-proxy`, MB/s and
//!   the ratios.
//! - `openshell-bench all`: every one of them but `languages`, `scale`, `start`,
//!   `hosts` and `files`.
//!
//! `OPENSHELL_BENCH_FORWARD_MIB` sets the bytes per forward copy (default
//! 256 MiB).

mod config;
mod contract;
mod dataplane;
mod files;
mod gateway;
mod hosts;
mod iperf;
mod isolation;
mod lang_rust;
mod languages;
mod loopback;
mod measure;
mod routing;
mod scale;
mod sdk;
mod start;
mod tonic_pump;
mod typescript;

#[tokio::main]
async fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("gateway") | None => gateway::run().await,
        Some("sdk") => sdk::run().await,
        Some("routing") => routing::run().await,
        Some("config") => config::run().await,
        Some("isolation") => isolation::run().await,
        Some("typescript") => typescript::run().await,
        Some("languages") => languages::run().await,
        Some("languages-rust") => lang_rust::run().await,
        Some("scale") => scale::run().await,
        Some("dataplane") => dataplane::run().await,
        Some("hosts") => hosts::run().await,
        Some("start") => start::run().await,
        Some("files") => files::run_bench().await,
        Some("all") => {
            gateway::run().await;
            sdk::run().await;
            routing::run().await;
            config::run().await;
            isolation::run().await;
            typescript::run().await;
            dataplane::run().await;
        }
        Some(other) => {
            eprintln!(
                "unknown benchmark {other:?}; try: gateway, sdk, routing, config, isolation, typescript, languages, scale, dataplane, hosts, start, files, all"
            );
            std::process::exit(2);
        }
    }
}
