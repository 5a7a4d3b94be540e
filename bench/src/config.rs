//! `openshell-bench config`: push config delivery to many supervisor
//! sessions. One gateway in push mode with the hidden test driver `none`
//! (sandbox records and token files, no supervisor processes); N sdk-core
//! `ConfigSession`s in this process stand in for N supervisors, each on its
//! own HTTP/2 connection with its sandbox's token. Prints the time for one
//! global setting change to reach every session, build throughput, and the
//! writes-to-builds ratio of bursts.

use std::time::{Duration, Instant};

use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::*;
use openshell_testkit::{Gateway, GatewayOptions};
use tonic::transport::Channel;

use crate::measure::{ms, percentile_or_zero};

/// Sessions of `openshell-bench config` (`OPENSHELL_BENCH_CONFIG_SESSIONS`
/// overrides).
const CONFIG_SESSIONS_DEFAULT: usize = 1000;
/// A burst: this many writes by `BURST_WRITERS` concurrent writers, to
/// `BURST_SANDBOXES` sandboxes (then to one).
const BURST_WRITES: usize = 1000;
const BURST_SANDBOXES: usize = 10;
const BURST_WRITERS: usize = 8;

fn config_sessions() -> usize {
    std::env::var("OPENSHELL_BENCH_CONFIG_SESSIONS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(CONFIG_SESSIONS_DEFAULT)
}

/// What the simulated supervisors applied, shared by every session's apply
/// function.
struct Fleet {
    /// The value of `bench_wave` being waited for, and when it was written.
    wave: std::sync::Mutex<(String, Instant)>,
    /// Per session: when it applied the current wave (since the write).
    arrivals: std::sync::Mutex<Vec<Duration>>,
    /// Per (sandbox name, `bench_burst_<writer>` key): the last value its
    /// session applied.
    burst: std::sync::Mutex<std::collections::HashMap<(String, String), String>>,
}

fn string_setting(snapshot: &openshell_sdk::ConfigSnapshot, key: &str) -> Option<String> {
    use openshell_proto::sandbox::setting_value::Value;
    match snapshot
        .sandbox_config
        .settings
        .get(key)?
        .value
        .as_ref()?
        .value
        .as_ref()?
    {
        Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn global_setting(key: &str, value: &str) -> UpdateConfigRequest {
    UpdateConfigRequest {
        global: true,
        setting_key: key.into(),
        setting_value: Some(openshell_proto::sandbox::SettingValue {
            value: Some(openshell_proto::sandbox::setting_value::Value::StringValue(
                value.into(),
            )),
        }),
        ..Default::default()
    }
}

fn metric(gw: &Gateway, sample: &str) -> f64 {
    gw.metric(sample).unwrap_or(0.0)
}

fn mark_builds(gw: &Gateway) -> (f64, f64) {
    let count = metric(
        gw,
        r#"openshell_server_config_build_duration_seconds_count{part="sandbox_config",trigger="mark",outcome="ok"}"#,
    );
    let sum = metric(
        gw,
        r#"openshell_server_config_build_duration_seconds_sum{part="sandbox_config",trigger="mark",outcome="ok"}"#,
    );
    (count, sum)
}

/// Runs the benchmark and prints its figures.
pub async fn run() {
    use openshell_sdk::{
        ApplyOutcome, CancellationToken, ClientConfig, ConfigSession, ConfigSnapshot, DeliveryMode,
    };
    use std::sync::Arc;

    let sessions = config_sessions();
    // A slower store, simulated: every push build holds its permit this
    // much longer (the gateway's hidden `--config-build-delay-ms`).
    let build_delay_ms: u64 = std::env::var("OPENSHELL_BENCH_CONFIG_BUILD_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut extra_args: Vec<String> = [
        "--config-delivery-mode",
        "push",
        "--allow-test-flags",
        "--driver",
        "none",
        // No reconcile pass during the run: every build is a mark's.
        "--config-reconcile-ms",
        "3600000",
    ]
    .map(String::from)
    .to_vec();
    if build_delay_ms > 0 {
        extra_args.push("--config-build-delay-ms".into());
        extra_args.push(build_delay_ms.to_string());
    }
    let gw = Gateway::start(GatewayOptions {
        extra_args,
        ..GatewayOptions::dev()
    });
    let channel = Channel::from_shared(gw.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = OpenShellClient::new(channel);

    // Sandbox records (no processes): 16 creates at a time.
    let started = Instant::now();
    let permits = Arc::new(tokio::sync::Semaphore::new(16));
    let mut creates = Vec::new();
    for i in 0..sessions {
        let mut client = client.clone();
        let permits = permits.clone();
        creates.push(tokio::spawn(async move {
            let _permit = permits.acquire().await.unwrap();
            let sandbox = client
                .create_sandbox(CreateSandboxRequest {
                    name: format!("cfg-{i}"),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .sandbox
                .unwrap();
            (format!("cfg-{i}"), sandbox.metadata.unwrap().id)
        }));
    }
    let mut sandboxes = Vec::with_capacity(sessions);
    for create in creates {
        sandboxes.push(create.await.unwrap());
    }
    let created = started.elapsed();

    // One ConfigSession per sandbox, on the token the driver wrote.
    let fleet = Arc::new(Fleet {
        wave: std::sync::Mutex::new((String::new(), Instant::now())),
        arrivals: std::sync::Mutex::new(Vec::with_capacity(sessions)),
        burst: std::sync::Mutex::new(std::collections::HashMap::new()),
    });
    let cancel = CancellationToken::new();
    let mut handles = Vec::with_capacity(sessions);
    let started = Instant::now();
    for (name, id) in &sandboxes {
        let token_path = gw.store_dir().join("sandboxes").join(id).join("token");
        let token = std::fs::read_to_string(&token_path).unwrap();
        let config = ClientConfig::builder(gw.url.clone())
            .token(token.as_str())
            .build()
            .unwrap();
        let fleet = fleet.clone();
        let name = name.clone();
        let apply = Arc::new(move |snapshot: ConfigSnapshot| {
            if let Some(wave) = string_setting(&snapshot, "bench_wave") {
                let (want, at) = fleet.wave.lock().unwrap().clone();
                if wave == want {
                    fleet.arrivals.lock().unwrap().push(at.elapsed());
                }
            }
            let mut burst = fleet.burst.lock().unwrap();
            for key in snapshot.sandbox_config.settings.keys() {
                if key.starts_with("bench_burst_")
                    && let Some(value) = string_setting(&snapshot, key)
                {
                    burst.insert((name.clone(), key.clone()), value);
                }
            }
            ApplyOutcome::Applied
        });
        let session = ConfigSession::builder(config, id.clone())
            .apply(apply)
            .build()
            .unwrap();
        let run = {
            let (session, cancel) = (session.clone(), cancel.clone());
            tokio::spawn(async move { session.run(cancel).await })
        };
        handles.push((session, run));
    }
    let connected = |handles: &[(ConfigSession, _)]| {
        handles
            .iter()
            .filter(|(s, _)| {
                let stats = s.stats();
                stats.mode == Some(DeliveryMode::Push) && stats.last_update_id >= 1
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    while connected(&handles) < sessions && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bootstrapped = connected(&handles);
    let connect_time = started.elapsed();
    let gauge = metric(&gw, "openshell_server_config_push_sessions");

    // One global setting change, to every session.
    let mut writer = client.clone();
    let (builds_before, sum_before) = mark_builds(&gw);
    let sent_before = metric(
        &gw,
        r#"openshell_server_config_updates_sent_total{kind="update"}"#,
    );
    *fleet.wave.lock().unwrap() = ("wave-1".into(), Instant::now());
    writer
        .update_config(global_setting("bench_wave", "wave-1"))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while fleet.arrivals.lock().unwrap().len() < bootstrapped && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut arrivals = fleet.arrivals.lock().unwrap().clone();
    arrivals.sort();
    let reached = arrivals.len();
    // Let trailing builds (if any) finish before reading the counters.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (builds_after, sum_after) = mark_builds(&gw);
    let wave_builds = builds_after - builds_before;
    let wave_sent = metric(
        &gw,
        r#"openshell_server_config_updates_sent_total{kind="update"}"#,
    ) - sent_before;
    let all = *arrivals.last().unwrap_or(&Duration::ZERO);

    let targets: Vec<String> = sandboxes
        .iter()
        .take(BURST_SANDBOXES)
        .map(|(name, _)| name.clone())
        .collect();
    // The burst alone (10 sandboxes, then one hot sandbox), then the
    // 10-sandbox burst while a global change to every session is being
    // built (builds wait for permits: marks merge).
    let alone = burst(&gw, &client, &fleet, &targets, "a", None).await;
    let hot = burst(&gw, &client, &fleet, &targets[..1], "h", None).await;
    *fleet.wave.lock().unwrap() = ("wave-2".into(), Instant::now());
    let during = burst(&gw, &client, &fleet, &targets, "b", Some("wave-2")).await;
    let unchanged = metric(&gw, "openshell_server_config_unchanged_total");

    cancel.cancel();
    for (_, run) in handles {
        let _ = run.await;
    }

    println!(
        "config push benchmark: 1 gateway (push, driver none, SQLite, {} build permits), {sessions} sdk-core ConfigSessions in this process (one HTTP/2 connection each){}",
        2 * 8,
        if build_delay_ms > 0 {
            format!("; simulated slow store: +{build_delay_ms} ms per build")
        } else {
            String::new()
        }
    );
    println!(
        "  sandboxes created: {sessions} in {:.2} s; sessions bootstrapped: {bootstrapped}/{sessions} in {:.2} s (push_sessions gauge {gauge})",
        created.as_secs_f64(),
        connect_time.as_secs_f64()
    );
    println!(
        "  global setting -> {reached}/{bootstrapped} sessions applied: all in {:.1} ms (p50 {:.1} ms, p99 {:.1} ms)",
        ms(all),
        ms(percentile_or_zero(&arrivals, 0.50)),
        ms(percentile_or_zero(&arrivals, 0.99)),
    );
    println!(
        "  builds for the change: {wave_builds} (one per session), {wave_sent} updates sent; {:.0} builds/s over the propagation, mean store read per build {:.2} ms",
        wave_builds / all.as_secs_f64().max(1e-9),
        1e3 * (sum_after - sum_before) / wave_builds.max(1.0)
    );
    for (label, b) in [
        ("burst, 10 sandboxes", &alone),
        ("burst, 1 sandbox", &hot),
        ("burst, 10 sandboxes + global change", &during),
    ] {
        println!(
            "  {label}: {} writes ({} to {} sandbox(es) by {BURST_WRITERS} writers{}) in {:.2} s ({:.0} writes/s); {} builds, {} updates sent; every session on its last value: {} after {:.2} s",
            b.writes,
            b.sandbox_writes,
            b.sandboxes,
            if b.global { ", 1 global" } else { "" },
            b.write_time.as_secs_f64(),
            b.writes / b.write_time.as_secs_f64(),
            b.builds,
            b.sent,
            b.converged,
            b.converge_time.as_secs_f64()
        );
        println!(
            "  ratio writes / builds ({label}): {:.2}{}",
            b.writes / b.builds.max(1.0),
            if b.global {
                format!(
                    " (as session-writes: {:.0} sessions marked / {} builds = {:.2})",
                    b.sandbox_writes + bootstrapped as f64,
                    b.builds,
                    (b.sandbox_writes + bootstrapped as f64) / b.builds.max(1.0)
                )
            } else {
                String::new()
            }
        );
    }
    println!("  builds not sent because unchanged (whole run): {unchanged}");
}

struct Burst {
    /// Committed writes (the gateway's publications counter).
    writes: f64,
    sandbox_writes: f64,
    sandboxes: usize,
    global: bool,
    builds: f64,
    sent: f64,
    write_time: Duration,
    converged: bool,
    converge_time: Duration,
}

/// BURST_WRITES writes to `targets` by BURST_WRITERS concurrent writers
/// (each writer its own key, in order, so every last value is known),
/// optionally with a global write of `bench_wave` at the start.
/// Waits until every target's session applied its last value (and every
/// session the wave).
async fn burst(
    gw: &Gateway,
    client: &OpenShellClient<Channel>,
    fleet: &std::sync::Arc<Fleet>,
    targets: &[String],
    tag: &str,
    global: Option<&str>,
) -> Burst {
    let publications = |gw: &Gateway| {
        metric(
            gw,
            r#"openshell_server_config_publications_total{scope="sandbox"}"#,
        ) + metric(
            gw,
            r#"openshell_server_config_publications_total{scope="all"}"#,
        )
    };
    let sent = |gw: &Gateway| {
        metric(
            gw,
            r#"openshell_server_config_updates_sent_total{kind="update"}"#,
        )
    };
    let (published_before, builds_before, sent_before) =
        (publications(gw), mark_builds(gw).0, sent(gw));
    let sessions_before = fleet.arrivals.lock().unwrap().len();
    fleet.arrivals.lock().unwrap().clear();
    // Who writes what: with at least as many sandboxes as writers each
    // sandbox has one writer; otherwise every writer writes every sandbox.
    // Each writer writes its own key (`bench_burst_<writer>`), in order, so
    // the last value of every (sandbox, key) is known.
    let assignment: Vec<Vec<String>> = (0..BURST_WRITERS)
        .map(|w| {
            targets
                .iter()
                .enumerate()
                .filter(|(t, _)| targets.len() < BURST_WRITERS || t % BURST_WRITERS == w)
                .map(|(_, name)| name.clone())
                .collect()
        })
        .collect();
    let pairs: usize = assignment.iter().map(Vec::len).sum();
    let per_pair = BURST_WRITES / pairs;
    let started = Instant::now();
    if let Some(wave) = global {
        client
            .clone()
            .update_config(global_setting("bench_wave", wave))
            .await
            .unwrap();
    }
    let mut writers = Vec::new();
    for (w, mine) in assignment.iter().enumerate() {
        let mut client = client.clone();
        let tag = tag.to_owned();
        let mine = mine.clone();
        writers.push(tokio::spawn(async move {
            for j in 0..per_pair {
                for sandbox in &mine {
                    client
                        .update_config(UpdateConfigRequest {
                            sandbox: sandbox.clone(),
                            setting_key: format!("bench_burst_{w}"),
                            setting_value: Some(openshell_proto::sandbox::SettingValue {
                                value: Some(
                                    openshell_proto::sandbox::setting_value::Value::StringValue(
                                        format!("{tag}-{j}"),
                                    ),
                                ),
                            }),
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                }
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let write_time = started.elapsed();
    let last: std::collections::HashMap<(String, String), String> = assignment
        .iter()
        .enumerate()
        .flat_map(|(w, mine)| {
            let want = format!("{tag}-{}", per_pair - 1);
            mine.iter()
                .map(move |name| ((name.clone(), format!("bench_burst_{w}")), want.clone()))
        })
        .collect();
    let settled = |fleet: &Fleet| {
        let burst = fleet.burst.lock().unwrap();
        last.iter()
            .all(|(slot, want)| burst.get(slot) == Some(want))
            && (global.is_none() || fleet.arrivals.lock().unwrap().len() >= sessions_before)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !settled(fleet) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let converged = settled(fleet);
    let converge_time = started.elapsed();
    // Trailing builds (a mark that arrived during the last build) finish.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Burst {
        writes: publications(gw) - published_before,
        sandbox_writes: (per_pair * pairs) as f64,
        sandboxes: targets.len(),
        global: global.is_some(),
        builds: mark_builds(gw).0 - builds_before,
        sent: sent(gw) - sent_before,
        write_time,
        converged,
        converge_time,
    }
}
