//! `openshell-bench scale`: what one gateway replica pays per idle
//! supervisor session and per open forward, and how many exec round trips
//! per second it serves to 64 concurrent callers.
//!
//! - Sessions: a gateway in push mode with the test driver `none` (sandbox
//!   records and token files, no supervisor processes) and N sdk-core
//!   `ConfigSession`s in this process (default 1,000,
//!   `OPENSHELL_BENCH_SCALE_SESSIONS`), each on its own HTTP/2 connection.
//!   The gateway's RSS and PSS (`/proc/PID/smaps_rollup`) after the records
//!   exist and again once every session is accepted and idle: the
//!   difference over N.
//! - Forwards: a dev gateway with real supervisors, 50 sandboxes
//!   (`OPENSHELL_BENCH_SCALE_SANDBOXES`), one SDK client (one HTTP/2
//!   connection) and one forward listener per sandbox, and 20 TCP
//!   connections held open per sandbox (`OPENSHELL_BENCH_SCALE_FORWARDS`
//!   in total, default 1,000), each proven end to end by one echoed byte
//!   (an echo server this process binds in each sandbox's network).
//!   The gateway's memory before and with them open, over their count.
//! - Exec: `true` through the SDK, 1 caller and 64 concurrent callers (on
//!   one sandbox, and spread over the 50; one SDK client), 3 rounds in
//!   random order, the median of execs per second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::*;
use openshell_sdk::{
    ApplyOutcome, CallOptions, CancellationToken, Client, ClientConfig, ConfigSession,
    ConfigSnapshot, CreateSandbox, ExecRequest,
};
use openshell_testkit::{Gateway, GatewayOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::Channel;

use crate::contract::median;
use crate::measure::interleaved;

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// RSS and PSS of a process in KiB (`/proc/PID/smaps_rollup`).
#[derive(Clone, Copy, Debug)]
pub struct Memory {
    pub rss_kib: f64,
    pub pss_kib: f64,
}

pub fn memory(pid: i32) -> Memory {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/smaps_rollup: {e}"));
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in smaps_rollup"))
    };
    Memory {
        rss_kib: field("Rss:"),
        pss_kib: field("Pss:"),
    }
}

/// Memory once it stops moving: two readings 500 ms apart within 64 KiB
/// (at most 10 s).
async fn settled_memory(pid: i32) -> Memory {
    let started = Instant::now();
    let mut last = memory(pid);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = memory(pid);
        if (now.rss_kib - last.rss_kib).abs() <= 64.0 || started.elapsed() > Duration::from_secs(10)
        {
            return now;
        }
        last = now;
    }
}

fn per_item(label: &str, before: Memory, after: Memory, count: usize) {
    println!(
        "  gateway memory {label}: RSS {:.1} -> {:.1} MiB, PSS {:.1} -> {:.1} MiB; per item RSS {:.1} KiB, PSS {:.1} KiB ({count} items)",
        before.rss_kib / 1024.0,
        after.rss_kib / 1024.0,
        before.pss_kib / 1024.0,
        after.pss_kib / 1024.0,
        (after.rss_kib - before.rss_kib) / count as f64,
        (after.pss_kib - before.pss_kib) / count as f64,
    );
}

pub async fn run() {
    println!(
        "scale benchmark (release gateway, one replica, 2 cores shared; load average {})",
        load()
    );
    sessions().await;
    forwards_and_exec().await;
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

async fn sessions() {
    let count = env_count("OPENSHELL_BENCH_SCALE_SESSIONS", 1000);
    let gw = Gateway::start(GatewayOptions {
        extra_args: [
            "--config-delivery-mode",
            "push",
            "--allow-test-flags",
            "--driver",
            "none",
        ]
        .map(String::from)
        .to_vec(),
        ..GatewayOptions::dev()
    });
    let pid = gw.pid().unwrap();
    let channel = Channel::from_shared(gw.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = OpenShellClient::new(channel);
    let permits = Arc::new(tokio::sync::Semaphore::new(16));
    let mut creates = Vec::new();
    for i in 0..count {
        let (mut client, permits) = (client.clone(), permits.clone());
        creates.push(tokio::spawn(async move {
            let _permit = permits.acquire().await.unwrap();
            client
                .create_sandbox(CreateSandboxRequest {
                    name: format!("idle-{i}"),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .sandbox
                .unwrap()
                .metadata
                .unwrap()
                .id
        }));
    }
    let mut ids = Vec::with_capacity(count);
    for create in creates {
        ids.push(create.await.unwrap());
    }
    let before = settled_memory(pid).await;

    let cancel = CancellationToken::new();
    let mut sessions = Vec::with_capacity(count);
    for id in &ids {
        let token = openshell_testkit::sandbox_token(&gw.store_dir(), id).expect("sandbox token");
        let config = ClientConfig::builder(gw.url.clone())
            .token(token.as_str())
            .build()
            .unwrap();
        let session = ConfigSession::builder(config, id.clone())
            .apply(Arc::new(|_: ConfigSnapshot| ApplyOutcome::Applied))
            .build()
            .unwrap();
        let run = {
            let (session, cancel) = (session.clone(), cancel.clone());
            tokio::spawn(async move { session.run(cancel).await })
        };
        sessions.push((session, run));
    }
    let accepted = |sessions: &[(ConfigSession, _)]| {
        sessions
            .iter()
            .filter(|(s, _)| {
                let stats = s.stats();
                stats.session_id.is_some() && stats.applied >= 1
            })
            .count()
    };
    let started = Instant::now();
    while accepted(&sessions) < count && started.elapsed() < Duration::from_secs(300) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let held = accepted(&sessions);
    let connect_time = started.elapsed();
    // Idle: past the bootstrap, before the first heartbeat round matters.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = settled_memory(pid).await;
    let gauge = gw
        .metric("openshell_server_config_push_sessions")
        .unwrap_or(0.0);
    println!(
        "idle supervisor sessions: {held}/{count} ConfigSessions accepted in {:.1} s (push_sessions gauge {gauge}); gateway --driver none, push mode, one HTTP/2 connection per session",
        connect_time.as_secs_f64()
    );
    per_item("per idle session", before, after, held.max(1));
    cancel.cancel();
    for (_, run) in sessions {
        let _ = run.await;
    }
    let closed = settled_memory(pid).await;
    println!(
        "  after the sessions closed: RSS {:.1} MiB, PSS {:.1} MiB",
        closed.rss_kib / 1024.0,
        closed.pss_kib / 1024.0
    );
}

/// An echo server (holds every connection until its peer closes) on one
/// port number in the network of each of `sandboxes`, where their forwards
/// arrive: their own under isolation, this process's otherwise (then one
/// bind serves all).
async fn echo_servers(client: &Client, sandboxes: &[String]) -> u16 {
    let mut port = 0;
    for sandbox in sandboxes {
        let net = crate::loopback::sandbox_net(client, sandbox).await;
        if port != 0 && net.is_own() {
            continue;
        }
        let listener = net
            .listen(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("an echo server in {sandbox}'s network: {e}"));
        port = listener.local_addr().unwrap().port();
        openshell_testkit::netns::serve_echo(listener);
    }
    port
}

/// Execs of `true` by `callers` concurrent callers, `each` per caller:
/// successful execs per second, and the failures (count, first message).
/// A failure is counted, not hidden: the run goes on.
async fn exec_rate(
    clients: &[Client],
    sandboxes: &[String],
    callers: usize,
    each: usize,
) -> (f64, usize, Option<String>) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let client = clients[i % clients.len()].clone();
            let sandbox = sandboxes[i % sandboxes.len()].clone();
            tokio::spawn(async move {
                let (mut ok, mut failed, mut first) = (0usize, 0usize, None);
                for _ in 0..each {
                    match client
                        .exec(ExecRequest::new(&sandbox, ["true"]), CallOptions::new())
                        .await
                    {
                        Ok(out) if out.exit_code == 0 => ok += 1,
                        Ok(out) => {
                            failed += 1;
                            first.get_or_insert(format!("exit code {}", out.exit_code));
                        }
                        Err(e) => {
                            failed += 1;
                            first.get_or_insert(e.to_string());
                        }
                    }
                }
                (ok, failed, first)
            })
        })
        .collect();
    let (mut ok, mut failed, mut first) = (0, 0, None);
    for task in tasks {
        let (o, f, m) = task.await.unwrap();
        ok += o;
        failed += f;
        if first.is_none() {
            first = m;
        }
    }
    (ok as f64 / started.elapsed().as_secs_f64(), failed, first)
}

async fn forwards_and_exec() {
    let sandbox_count = env_count("OPENSHELL_BENCH_SCALE_SANDBOXES", 50);
    let forward_count = env_count("OPENSHELL_BENCH_SCALE_FORWARDS", 1000);
    let gw = Gateway::start(GatewayOptions::dev());
    let pid = gw.pid().unwrap();
    let connect = || async {
        Client::connect(ClientConfig::builder(gw.url.clone()).build().unwrap())
            .await
            .unwrap()
    };
    let admin = connect().await;
    let names: Vec<String> = (0..sandbox_count).map(|i| format!("fwd-{i}")).collect();
    let started = Instant::now();
    for chunk in names.chunks(8) {
        let creates: Vec<_> = chunk
            .iter()
            .map(|name| {
                let (admin, name) = (admin.clone(), name.clone());
                tokio::spawn(async move {
                    admin
                        .sandboxes()
                        .create(CreateSandbox::new().name(&name), CallOptions::new())
                        .await
                        .unwrap();
                    admin
                        .sandboxes()
                        .wait_ready(&name, CallOptions::new())
                        .await
                        .unwrap();
                })
            })
            .collect();
        for create in creates {
            create.await.unwrap();
        }
    }
    println!(
        "dev gateway with real supervisors: {sandbox_count} sandboxes READY in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // Exec round trips: 1 caller, 64 on one sandbox, 64 over all sandboxes.
    let clients = vec![admin.clone()];
    let one = &names[..1];
    exec_rate(&clients, one, 1, 20).await;
    exec_rate(&clients, &names, 64, 2).await;
    let labels = [
        "1 caller, 1 sandbox".to_string(),
        "64 callers, 1 sandbox".to_string(),
        format!("64 callers, {sandbox_count} sandboxes"),
    ];
    let mut rates: [Vec<f64>; 3] = Default::default();
    let mut failures: [(usize, Option<String>); 3] = Default::default();
    for arm in interleaved(3, 3) {
        let (rate, failed, first) = match arm {
            0 => exec_rate(&clients[..1], one, 1, 100).await,
            1 => exec_rate(&clients[..1], one, 64, 10).await,
            _ => exec_rate(&clients[..1], &names, 64, 10).await,
        };
        rates[arm].push(rate);
        failures[arm].0 += failed;
        if failures[arm].1.is_none() {
            failures[arm].1 = first;
        }
    }
    println!(
        "exec `true` round trips per second (median of 3 rounds, arms in random order; all callers share one SDK client, one HTTP/2 connection):"
    );
    for ((label, rates), (failed, first)) in labels.iter().zip(&rates).zip(&failures) {
        let failed = match first {
            Some(first) => format!(" ({failed} execs FAILED, first: {first})"),
            None => String::new(),
        };
        println!(
            "  {label:<24} {:.0} execs/s{failed}",
            median(rates).unwrap()
        );
    }
    let target = echo_servers(&admin, &names).await;
    let mut clients = Vec::with_capacity(sandbox_count);
    let mut forwards = Vec::with_capacity(sandbox_count);
    for name in &names {
        let client = connect().await;
        let forward = client
            .forward(name, target, "127.0.0.1:0", CallOptions::new())
            .await
            .unwrap();
        // One connection first, so each client's HTTP/2 connection exists
        // before the baseline.
        let mut probe = TcpStream::connect(forward.local_addr()).await.unwrap();
        probe.write_all(b"p").await.unwrap();
        let mut byte = [0u8; 1];
        probe.read_exact(&mut byte).await.unwrap();
        drop(probe);
        clients.push(client);
        forwards.push(forward);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = settled_memory(pid).await;
    let mut held = Vec::with_capacity(forward_count);
    for i in 0..forward_count {
        let forward = &forwards[i % forwards.len()];
        let mut socket = TcpStream::connect(forward.local_addr()).await.unwrap();
        socket.write_all(b"x").await.unwrap();
        let mut byte = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(30), socket.read_exact(&mut byte))
            .await
            .expect("an echoed byte within 30 s")
            .unwrap();
        assert_eq!(&byte, b"x");
        held.push(socket);
    }
    let after = settled_memory(pid).await;
    let open: u64 = forwards
        .iter()
        .map(|f| f.stats().connections_accepted)
        .sum();
    println!(
        "open forwards: {} forwarded connections open and idle over {sandbox_count} sandboxes, one SDK client and forward listener per sandbox ({open} accepted in all, probes included)",
        held.len()
    );
    per_item("per open forward", before, after, held.len());
    drop(held);
    for forward in forwards {
        forward.close();
        forward.closed().await;
    }

    println!("  (load average at the end {})", load());
}
