//! `openshell-bench languages`: one table for every language, each SDK
//! beside its language's native gRPC client, in one run against one
//! gateway replica (release, dev mode) with one sandbox, plus an edge in
//! front of it for the via-edge forward figure.
//!
//! Contenders, run in a fresh random order every round (the median of the
//! rounds is reported):
//! - one program per language (`contract`): Rust (`openshell-bench
//!   languages-rust`), Python (`sdk-python/bench/languages.py`),
//!   TypeScript (`sdk-typescript/dist/bench/languages.js`), Go
//!   (`openshell-go-bench`), JVM (`openshell-jvm-bench`, the launcher of
//!   `sdk-jvm/bench` that `make jvm-bench-program` writes); each interleaves its own SDK and native arms and
//!   runs one round per invocation here;
//! - the limits: iperf3 straight over loopback, iperf3 through a chain of 3
//!   and of 4 socat relays (as many hops as the SDK's path without and with
//!   the edge: local listener, [edge,] replica, supervisor);
//! - the Rust SDK's forward through the edge (4 hops).
//!
//! Every forward figure is iperf3 on both ends: `iperf3 -s` on 127.0.0.1
//! and one `iperf3 -c -t S` stream. The forwards' server listens inside
//! the sandbox's network (its own loopback, where a forward's target is;
//! started there by this process); the limits' server (raw loopback, the
//! relay chains) on the host's loopback, which no forward reaches.
//!
//! Environment: `OPENSHELL_BENCH_ROUNDS` (rounds, default 5),
//! `OPENSHELL_BENCH_FORWARD_SECONDS` (default 3), `OPENSHELL_BENCH_EXEC_MIB`
//! (default 64), `OPENSHELL_BENCH_LANGUAGES` (a comma-separated subset of
//! rust,python,typescript,go,jvm), `OPENSHELL_BENCH_PYTHON` (the interpreter,
//! default `.venv/bin/python`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox};
use openshell_testkit::{Edge, Gateway, GatewayOptions, bin_dir};
use rand::seq::SliceRandom;

use crate::contract::{Row, median, parse_output};
use crate::iperf::{self, iperf3_gbit_s};

const SANDBOX: &str = "bench-languages";
/// A program that runs longer than this in one round is stopped (by PID).
const PROGRAM_LIMIT: Duration = Duration::from_secs(900);

/// The native client each SDK row is compared with.
fn native_of(language: &str, client: &str) -> Option<&'static str> {
    match (language, client) {
        ("rust", "sdk") => Some("tonic"),
        ("python", "sdk-sync") => Some("grpcio-sync"),
        ("python", "sdk-async") => Some("grpcio-aio"),
        ("typescript", "sdk") => Some("grpc-js"),
        ("go", "sdk" | "sdk-raw") => Some("grpc-go"),
        ("jvm", "sdk" | "sdk-java" | "sdk-blocking") => Some("grpc-java"),
        _ => None,
    }
}

fn is_native(client: &str) -> bool {
    matches!(
        client,
        "tonic" | "grpcio-sync" | "grpcio-aio" | "grpc-js" | "grpc-go" | "grpc-java"
    )
}

/// One per-language program: how to run it, or why it cannot run.
struct Program {
    language: &'static str,
    command: Result<Command, String>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn programs(scratch: &Path) -> Vec<Program> {
    let root = root();
    let bins = bin_dir();
    let mut list = Vec::new();

    let rust = std::env::current_exe()
        .map(|exe| {
            let mut c = Command::new(exe);
            c.arg("languages-rust");
            c
        })
        .map_err(|e| format!("the benchmark's own path: {e}"));
    list.push(Program {
        language: "rust",
        command: rust,
    });

    let script = root.join("sdk-python/bench/languages.py");
    let python = std::env::var("OPENSHELL_BENCH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join(".venv/bin/python"));
    let python_command = if !script.exists() {
        Err(format!(
            "MISSING: {} is not on this branch (the Python program of this contract is written on perf/bindings); no Python figures in this run",
            script.display()
        ))
    } else if !python.exists() {
        Err(format!(
            "MISSING: no Python interpreter at {} (make bench makes the venv)",
            python.display()
        ))
    } else {
        let mut c = Command::new(python);
        c.arg(script);
        Ok(c)
    };
    list.push(Program {
        language: "python",
        command: python_command,
    });

    let js = root.join("sdk-typescript/dist/bench/languages.js");
    let addon = bins.join("libopenshell_sdk_node.so");
    let node_command = if !js.exists() {
        Err(format!(
            "{} is missing: run `make typescript`",
            js.display()
        ))
    } else if !addon.exists() {
        Err(format!(
            "{} is missing: `cargo build --release -p openshell-sdk-node` (make bench does)",
            addon.display()
        ))
    } else {
        // Node loads an addon only from a `.node` file.
        let native = scratch.join("openshell-sdk.node");
        std::fs::copy(&addon, &native).expect("copying the addon");
        let mut c = Command::new("node");
        c.arg(js)
            .env("OPENSHELL_SDK_NATIVE", native)
            .env("OPENSHELL_BENCH_PROTO", root.join("proto"));
        Ok(c)
    };
    list.push(Program {
        language: "typescript",
        command: node_command,
    });

    let go = bins.join("openshell-go-bench");
    list.push(Program {
        language: "go",
        command: if go.exists() {
            Ok(Command::new(go))
        } else {
            Err(format!(
                "{} is missing: make bench BENCH=languages builds it",
                go.display()
            ))
        },
    });

    let jvm = bins.join("openshell-jvm-bench");
    list.push(Program {
        language: "jvm",
        command: if jvm.exists() {
            Ok(Command::new(jvm))
        } else {
            Err(format!(
                "{} is missing: make bench BENCH=languages writes it (make jvm-bench-program)",
                jvm.display()
            ))
        },
    });

    if let Ok(only) = std::env::var("OPENSHELL_BENCH_LANGUAGES") {
        let only: Vec<&str> = only.split(',').map(str::trim).collect();
        list.retain(|p| only.contains(&p.language));
    }
    list
}

/// Runs one program for one round: its rows, or why there are none.
fn run_program(command: &mut Command, language: &str) -> Result<Vec<Row>, String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting the {language} program: {e}"))?;
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut text);
        text
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if started.elapsed() > PROGRAM_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the {language} program ran longer than {PROGRAM_LIMIT:?}: stopped"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = reader.join().unwrap_or_default();
    // The program's own table, indented under the round.
    for line in text.lines().filter(|l| !l.starts_with("BENCH_JSON")) {
        println!("    | {line}");
    }
    if !status.success() {
        return Err(format!("the {language} program failed: {status}"));
    }
    let (reported, rows) = parse_output(&text)?;
    if reported != language {
        return Err(format!(
            "the {language} program reported language {reported:?}"
        ));
    }
    if rows.is_empty() {
        return Err(format!("the {language} program reported no rows"));
    }
    Ok(rows)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Limit {
    Raw,
    Relay3,
    Relay4,
    EdgeForward,
}

impl Limit {
    fn label(self) -> &'static str {
        match self {
            Limit::Raw => "raw loopback iperf3",
            Limit::Relay3 => "socat chain, 3 relays",
            Limit::Relay4 => "socat chain, 4 relays",
            Limit::EdgeForward => "Rust SDK forward via the edge",
        }
    }
}

/// Per (language, client): the figures of every round.
#[derive(Default)]
struct Collected {
    p50: Vec<f64>,
    p99: Vec<f64>,
    concurrent: Vec<f64>,
    forward: Vec<f64>,
    exec: Vec<f64>,
}

pub async fn run() {
    for tool in ["iperf3", "socat"] {
        assert!(
            iperf::installed(tool),
            "{tool} is not installed: `bash scripts/bench-setup.sh` (make bench runs it)"
        );
    }
    let rounds: usize = std::env::var("OPENSHELL_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(5);
    let seconds: u64 = std::env::var("OPENSHELL_BENCH_FORWARD_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3);
    let load_before = load_average();
    let started = Instant::now();

    let gw = Gateway::start(GatewayOptions::dev());
    let client = Client::connect(ClientConfig::builder(gw.url.clone()).build().unwrap())
        .await
        .unwrap();
    client
        .sandboxes()
        .create(CreateSandbox::new().name(SANDBOX), CallOptions::new())
        .await
        .unwrap();
    client
        .sandboxes()
        .wait_ready(SANDBOX, CallOptions::new())
        .await
        .unwrap();
    let edge = Edge::start(&[("gw-0", gw.url.as_str())]);
    let via_edge = Client::connect(ClientConfig::builder(edge.url.clone()).build().unwrap())
        .await
        .unwrap();

    // The forwards' iperf3 server in the sandbox's network, the limits' on
    // the host (each a port free on the host, so both work without
    // isolation too).
    let iperf_port = iperf::free_port();
    let _iperf_server = iperf::iperf3_server_in(
        &crate::loopback::sandbox_net(&client, SANDBOX).await,
        iperf_port,
    );
    let raw_port = iperf::free_port();
    let _raw_server = iperf::iperf3_server(raw_port);
    let relay3 = iperf::relay_chain(3, raw_port);
    let relay4 = iperf::relay_chain(4, raw_port);
    let edge_forward = via_edge
        .forward(SANDBOX, iperf_port, "127.0.0.1:0", CallOptions::new())
        .await
        .unwrap();
    let edge_port = edge_forward.local_addr().port();

    let scratch = tempfile::tempdir().unwrap();
    let mut programs = programs(scratch.path());
    for program in &mut programs {
        if let Ok(command) = &mut program.command {
            command
                .env("OPENSHELL_ENDPOINT", &gw.url)
                .env_remove("OPENSHELL_TOKEN")
                .env("OPENSHELL_BENCH_SANDBOX", SANDBOX)
                .env("OPENSHELL_BENCH_IPERF_PORT", iperf_port.to_string())
                .env("OPENSHELL_BENCH_ROUNDS", "1")
                .env("OPENSHELL_BENCH_FORWARD_SECONDS", seconds.to_string())
                .env(
                    "OPENSHELL_BENCH_EXEC_MIB",
                    crate::lang_rust::exec_mib().to_string(),
                );
        }
    }

    // Warm-up: one run of each limit (a program warms itself up).
    for port in [raw_port, relay3.port, relay4.port, edge_port] {
        let _ = tokio::task::spawn_blocking(move || iperf3_gbit_s(port, 1))
            .await
            .unwrap();
    }

    let mut collected: BTreeMap<(String, String), Collected> = BTreeMap::new();
    let mut failures: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let mut limits: BTreeMap<Limit, Vec<f64>> = BTreeMap::new();
    // Contenders: the programs (by index) and the limits.
    enum Contender {
        Program(usize),
        Limit(Limit, u16),
    }
    for round in 1..=rounds {
        let mut order: Vec<Contender> = (0..programs.len()).map(Contender::Program).collect();
        order.extend([
            Contender::Limit(Limit::Raw, raw_port),
            Contender::Limit(Limit::Relay3, relay3.port),
            Contender::Limit(Limit::Relay4, relay4.port),
            Contender::Limit(Limit::EdgeForward, edge_port),
        ]);
        order.shuffle(&mut rand::rng());
        println!(
            "round {round} of {rounds} (load average {})",
            load_average()
        );
        for contender in order {
            match contender {
                Contender::Program(i) => {
                    let program = &mut programs[i];
                    let language = program.language;
                    let Ok(command) = &mut program.command else {
                        continue;
                    };
                    println!("  {language}:");
                    let result = tokio::task::block_in_place(|| run_program(command, language));
                    match result {
                        Ok(rows) => {
                            for row in rows {
                                let c = collected
                                    .entry((language.to_owned(), row.client.clone()))
                                    .or_default();
                                c.p50.push(row.unary_p50_us);
                                c.p99.push(row.unary_p99_us);
                                c.concurrent.push(row.concurrent_per_s);
                                c.forward.extend(row.forward_gbit_s);
                                c.exec.extend(row.exec_stdout_mib_s);
                            }
                        }
                        Err(e) => {
                            println!("  {language}: FAILED: {e}");
                            failures
                                .entry(language)
                                .or_default()
                                .push(format!("round {round}: {e}"));
                        }
                    }
                }
                Contender::Limit(limit, port) => {
                    let gbit = tokio::task::spawn_blocking(move || iperf3_gbit_s(port, seconds))
                        .await
                        .unwrap()
                        .unwrap_or_else(|e| panic!("{}: {e}", limit.label()));
                    println!("  {}: {gbit:.2} Gbit/s", limit.label());
                    limits.entry(limit).or_default().push(gbit);
                }
            }
        }
    }
    let stats = edge_forward.stats();
    assert_eq!(stats.connections_failed, 0, "{stats:?}");
    edge_forward.close();
    edge_forward.closed().await;
    let load_after = load_average();

    print_table(&TableInput {
        rounds,
        seconds,
        load_before,
        load_after,
        minutes: started.elapsed().as_secs_f64() / 60.0,
        programs: &programs,
        collected: &collected,
        failures: &failures,
        limits: &limits,
    });
    drop(edge);
}

struct TableInput<'a> {
    rounds: usize,
    seconds: u64,
    load_before: String,
    load_after: String,
    minutes: f64,
    programs: &'a [Program],
    collected: &'a BTreeMap<(String, String), Collected>,
    failures: &'a BTreeMap<&'static str, Vec<String>>,
    limits: &'a BTreeMap<Limit, Vec<f64>>,
}

/// A client's medians: p50, concurrent calls per second, forward, exec.
type Figures = (Option<f64>, Option<f64>, Option<f64>, Option<f64>);
/// One of them.
type Pick = fn(&Figures) -> Option<f64>;

fn fmt(value: Option<f64>, digits: usize) -> String {
    value.map_or("-".into(), |v| format!("{v:.digits$}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn print_table(t: &TableInput) {
    let limit = |l: Limit| t.limits.get(&l).and_then(|v| median(v));
    let (raw, relay3, relay4, edge) = (
        limit(Limit::Raw),
        limit(Limit::Relay3),
        limit(Limit::Relay4),
        limit(Limit::EdgeForward),
    );
    println!();
    println!(
        "languages benchmark: 1 gateway replica (release, dev mode), 1 sandbox, edge for the via-edge figure; median of {} rounds, contenders in random order per round; load average {} at start, {} at end (1/5/15 min, 2 cores shared); {:.1} min",
        t.rounds, t.load_before, t.load_after, t.minutes
    );
    println!(
        "unary: GetSandbox, 1,000 calls per client per round (batches of 10, interleaved); concurrent: 100 callers x 20 calls on one client; forward: iperf3 -t {} one stream, both ends iperf3, direct to the replica; exec: head -c {} MiB /dev/zero, stdout streamed",
        t.seconds,
        crate::lang_rust::exec_mib()
    );
    println!(
        "{:<11} {:<12} {:>8} {:>8} {:>9} {:>8} {:>8} | {:>7} {:>7} {:>7} {:>7} | {:>7} {:>8}",
        "language",
        "client",
        "p50 us",
        "p99 us",
        "conc/s",
        "fwd Gb/s",
        "exec MiB",
        "p50 x",
        "conc x",
        "fwd x",
        "exec x",
        "fwd/raw",
        "fwd/3hop"
    );
    for program in t.programs {
        let language = program.language;
        let rows: Vec<(&String, &Collected)> = t
            .collected
            .iter()
            .filter(|((l, _), _)| l == language)
            .map(|((_, c), v)| (c, v))
            .collect();
        if let Err(why) = &program.command {
            println!("{language:<11} {why}");
            continue;
        }
        if rows.is_empty() {
            println!("{language:<11} no figures: every round failed (see below)");
            continue;
        }
        let figures = |client: &str| {
            rows.iter()
                .find(|(c, _)| c.as_str() == client)
                .map(|(_, v)| {
                    (
                        median(&v.p50),
                        median(&v.concurrent),
                        median(&v.forward),
                        median(&v.exec),
                    )
                })
        };
        // The native row a metric is compared with: the paired client, or
        // any native row of the language that has the figure.
        let native_figure = |client: &str, pick: Pick| {
            native_of(language, client)
                .and_then(figures)
                .as_ref()
                .and_then(pick)
                .or_else(|| {
                    rows.iter()
                        .filter(|(c, _)| is_native(c))
                        .filter_map(|(c, _)| figures(c).as_ref().and_then(pick))
                        .next()
                })
        };
        // SDK rows first, then the native ones.
        let mut ordered: Vec<&(&String, &Collected)> =
            rows.iter().filter(|(c, _)| !is_native(c)).collect();
        ordered.extend(rows.iter().filter(|(c, _)| is_native(c)));
        for (client, v) in ordered {
            let (p50, conc, fwd, exec) = (
                median(&v.p50),
                median(&v.concurrent),
                median(&v.forward),
                median(&v.exec),
            );
            let sdk = !is_native(client);
            let vs = |mine: Option<f64>, pick: Pick| {
                if sdk {
                    fmt(ratio(mine, native_figure(client, pick)), 2)
                } else {
                    String::new()
                }
            };
            println!(
                "{:<11} {:<12} {:>8} {:>8} {:>9} {:>8} {:>8} | {:>7} {:>7} {:>7} {:>7} | {:>7} {:>8}",
                language,
                client,
                fmt(p50, 0),
                fmt(median(&v.p99), 0),
                fmt(conc, 0),
                fmt(fwd, 2),
                fmt(exec, 0),
                vs(p50, |f| f.0),
                vs(conc, |f| f.1),
                vs(fwd, |f| f.2),
                vs(exec, |f| f.3),
                fmt(ratio(fwd, raw), 3),
                fmt(ratio(fwd, relay3), 2),
            );
        }
    }
    println!(
        "(x = SDK / its native client in the same run: p50 below 1 is faster, the others above 1 are faster; fwd/3hop = forward / the 3-relay chain)"
    );
    println!("limits, same run (iperf3 -t {}, one stream):", t.seconds);
    println!(
        "  raw loopback iperf3:                      {} Gbit/s",
        fmt(raw, 2)
    );
    println!(
        "  socat chain, 3 relays (SDK path, direct): {} Gbit/s ({} x raw)",
        fmt(relay3, 2),
        fmt(ratio(relay3, raw), 3)
    );
    println!(
        "  socat chain, 4 relays (SDK path, edge):   {} Gbit/s ({} x raw)",
        fmt(relay4, 2),
        fmt(ratio(relay4, raw), 3)
    );
    println!(
        "  Rust SDK forward via the edge:            {} Gbit/s ({} x the 4-relay chain, {} x raw)",
        fmt(edge, 2),
        fmt(ratio(edge, relay4), 2),
        fmt(ratio(edge, raw), 3)
    );
    // The targets of the performance issues, judged on this run's medians.
    let fig = |language: &str, client: &str, pick: fn(&Collected) -> Option<f64>| {
        t.collected
            .get(&(language.to_owned(), client.to_owned()))
            .and_then(pick)
    };
    let p50 = |c: &Collected| median(&c.p50);
    let fwd = |c: &Collected| median(&c.forward);
    let conc = |c: &Collected| median(&c.concurrent);
    let targets: [(&str, Option<f64>, bool, f64); 16] = [
        (
            "Rust SDK unary p50 / tonic <= 1.05",
            ratio(fig("rust", "sdk", p50), fig("rust", "tonic", p50)),
            false,
            1.05,
        ),
        (
            "Python sync unary p50 / grpcio <= 1.0",
            ratio(
                fig("python", "sdk-sync", p50),
                fig("python", "grpcio-sync", p50),
            ),
            false,
            1.0,
        ),
        (
            "Python async unary p50 / grpcio aio <= 1.0",
            ratio(
                fig("python", "sdk-async", p50),
                fig("python", "grpcio-aio", p50),
            ),
            false,
            1.0,
        ),
        (
            "Python forward / grpcio pump >= 2",
            ratio(
                fig("python", "sdk-sync", fwd).or(fig("python", "sdk-async", fwd)),
                fig("python", "grpcio-sync", fwd).or(fig("python", "grpcio-aio", fwd)),
            ),
            true,
            2.0,
        ),
        (
            "TypeScript unary p50 / grpc-js <= 1.0",
            ratio(
                fig("typescript", "sdk", p50),
                fig("typescript", "grpc-js", p50),
            ),
            false,
            1.0,
        ),
        (
            "TypeScript forward / grpc-js pump >= 3",
            ratio(
                fig("typescript", "sdk", fwd),
                fig("typescript", "grpc-js", fwd),
            ),
            true,
            3.0,
        ),
        (
            "Go raw stub unary p50 / grpc-go <= 1.3",
            ratio(fig("go", "sdk-raw", p50), fig("go", "grpc-go", p50)),
            false,
            1.3,
        ),
        (
            "Go curated Get unary p50 / grpc-go <= 1.3",
            ratio(fig("go", "sdk", p50), fig("go", "grpc-go", p50)),
            false,
            1.3,
        ),
        (
            "Go curated Get, 100 callers / grpc-go >= 0.9",
            ratio(fig("go", "sdk", conc), fig("go", "grpc-go", conc)),
            true,
            0.9,
        ),
        (
            "Go raw stub, 100 callers / grpc-go >= 0.9",
            ratio(fig("go", "sdk-raw", conc), fig("go", "grpc-go", conc)),
            true,
            0.9,
        ),
        (
            "Go forward / grpc-go pump >= 0.95",
            ratio(fig("go", "sdk", fwd), fig("go", "grpc-go", fwd)),
            true,
            0.95,
        ),
        (
            "JVM SDK blocking unary p50 / grpc-java blocking stub <= 1.0",
            ratio(
                fig("jvm", "sdk-blocking", p50),
                fig("jvm", "grpc-java", p50),
            ),
            false,
            1.0,
        ),
        (
            "JVM SDK forward / grpc-java pump >= 1.0",
            ratio(fig("jvm", "sdk", fwd), fig("jvm", "grpc-java", fwd)),
            true,
            1.0,
        ),
        (
            "Rust SDK forward direct / 3-relay chain >= 0.5",
            ratio(fig("rust", "sdk", fwd), relay3),
            true,
            0.5,
        ),
        (
            "Rust SDK forward via edge / 4-relay chain >= 0.5",
            ratio(edge, relay4),
            true,
            0.5,
        ),
        (
            "Rust SDK forward via edge / raw >= 0.18 (2x 0.09)",
            ratio(edge, raw),
            true,
            0.18,
        ),
    ];
    println!("targets (this run):");
    for (label, value, at_least, threshold) in targets {
        let verdict = match value {
            None => "no figure".to_owned(),
            Some(v) if (at_least && v >= threshold) || (!at_least && v <= threshold) => {
                format!("{v:.2} met")
            }
            Some(v) => format!("{v:.2} NOT met"),
        };
        println!("  {label:<52} {verdict}");
    }
    if !t.failures.is_empty() {
        println!("failures (those rounds are not in the medians):");
        for (language, list) in t.failures {
            for failure in list {
                println!("  {language}: {failure}");
            }
        }
    }
}
