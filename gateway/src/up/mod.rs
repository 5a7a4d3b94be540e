//! `openshell-gateway up`: the developer cluster on one machine. It starts
//! N `serve` replicas (gw-0..gw-N-1) sharing the embedded SQLite store and a
//! generated peer token, then the edge on the public address with one route
//! per replica; supervisors dial the edge, so placement works as in
//! production. With `--hosts N` the replicas run `--driver hosts` and `up`
//! issues host tokens `h-0..h-(N-1)` and starts N shared supervisor hosts
//! (`openshell-supervisor host`) dialling the edge, which serve every
//! sandbox instead of one supervisor process each.
//!
//! It stays in the foreground and keeps the cluster serving: a process that
//! exits without being asked to is logged, counted and (by `--restart`)
//! started again on the same ports, or left down while the rest carry on
//! ([`process`]). Its state is in `<data>/up/status.json`, on `up`'s own
//! listener ([`board`]) and in `openshell-gateway status` ([`status`]).
//! Ctrl-C (or SIGTERM) stops the hosts, then the edge and the replicas,
//! each by its PID, and last the sandbox supervisors.
//!
//! Folder: this module (arguments, start, banner, stop), `process` (one
//! process kept running), `board` (their state, file and metrics),
//! `control` (orders on stdin, the edge's routes), `status` (the `status`
//! command).

mod board;
mod control;
mod process;
pub mod status;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use tokio::process::Child;
use tokio_util::sync::CancellationToken;

use crate::config::delivery::DeliveryMode;
use board::Board;
use process::{Kind, Restart, Spec};

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Number of replicas.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// The edge's address: the one clients and supervisors use.
    #[arg(long, default_value = "127.0.0.1:17670")]
    listen: SocketAddr,
    /// Shared data directory (store and sandboxes); logs go under it.
    #[arg(long, default_value = ".run/data")]
    data_dir: PathBuf,
    /// Passed to every replica: `poll` (supervisors poll every 10 s) or
    /// `push` (configuration changes are pushed over the session).
    #[arg(
        long,
        value_enum,
        env = "OPENSHELL_CONFIG_DELIVERY_MODE",
        default_value = "poll"
    )]
    config_delivery_mode: DeliveryMode,
    /// Passed to every replica (see `serve --isolation`).
    #[arg(long, value_enum, env = "OPENSHELL_ISOLATION", default_value = "auto")]
    isolation: crate::sandboxes::driver::IsolationArg,
    /// Passed to every replica (see `serve --database-max-connections`).
    #[arg(long, default_value_t = crate::store::POOL_SIZE,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    database_max_connections: u32,
    /// Passed to every replica (see `serve --database-timeout-ms`).
    #[arg(long, default_value_t = crate::store::DEFAULT_DEADLINE.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    database_timeout_ms: u64,
    /// Tests only: passed to every replica (see `serve`).
    #[arg(long, hide = true)]
    expose_sandbox_tokens: bool,
    /// Shared supervisor hosts to run (0: one supervisor process per
    /// sandbox, the default). Each gets a host token and serves a pool of
    /// the cluster's sandboxes.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=64))]
    hosts: u64,
    /// With --hosts: the runtime threads of every host (its
    /// `--worker-threads`; default: the host's own, one).
    #[arg(long, value_name = "N", requires = "hosts",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    host_threads: Option<u16>,
    /// With --hosts: the replicas' `--host-lost-after` (seconds a host may
    /// be gone before its sandboxes are restarted elsewhere or wait in
    /// ERROR; default 45, at least 20).
    #[arg(long, value_name = "SECONDS", requires = "hosts",
          value_parser = clap::value_parser!(u64).range(20..=86_400))]
    host_lost_after: Option<u64>,
    /// With --hosts: the replicas' `--host-lost-policy` (`restart` or
    /// `error`).
    #[arg(long, value_enum, requires = "hosts")]
    host_lost_policy: Option<crate::sandboxes::HostLostPolicy>,
    /// What to do with a replica, host or the edge that exits without
    /// being asked to: `always` starts it again after a backoff (1 s,
    /// doubling to 30 s), `never` leaves it down (for failover tests).
    #[arg(long, value_enum, default_value = "always")]
    restart: Restart,
    /// `up`'s own status (`/status`, JSON) and metrics (`/metrics`).
    #[arg(long, default_value = "127.0.0.1:0")]
    metrics_listen: SocketAddr,
    /// `stdin`: take orders on standard input, one a line (`stop NAME`,
    /// `kill NAME`, `start NAME`, `restart NAME`, `cut-route ID`,
    /// `restore-route ID`), each answered with a line `control: ok ...` or
    /// `control: error ...`; the end of standard input stops the cluster as
    /// Ctrl-C does (a test harness that dies takes its cluster with it).
    #[arg(long, value_enum, default_value = "none")]
    control: Control,
}

/// Where `up` takes orders from (`--control`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Control {
    None,
    Stdin,
}

/// A process started by `up`: how to start it again, and the child.
struct Started {
    spec: Spec,
    child: Child,
}

/// Starts `spec`, records it (so a failure later still stops it) and waits
/// until it serves; returns its ready file's JSON.
async fn start(
    spec: Spec,
    started: &mut Vec<Started>,
    board: &Board,
) -> anyhow::Result<serde_json::Value> {
    let child = spec.spawn(true)?;
    board.add(
        &spec.name,
        spec.kind,
        child.id().unwrap_or_default(),
        spec.log.clone(),
    );
    started.push(Started { spec, child });
    let last = started.last_mut().expect("just pushed");
    last.spec.wait_ready(&mut last.child).await
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    if args.replicas == 0 {
        bail!("--replicas must be at least 1");
    }
    if !args.listen.ip().is_loopback() || !args.metrics_listen.ip().is_loopback() {
        bail!("`up` runs without authentication and only listens on loopback");
    }
    let me = std::env::current_exe()?;
    std::fs::create_dir_all(&args.data_dir)?;
    let data_dir = args.data_dir.canonicalize()?;
    let run_dir = data_dir.join("up");
    std::fs::create_dir_all(&run_dir)?;
    let peer_token = format!("{:032x}", rand::random::<u128>());
    let edge_url = format!("http://{}", args.listen);
    let mode = match args.config_delivery_mode {
        DeliveryMode::Poll => "poll",
        DeliveryMode::Push => "push",
    };

    let isolation = match args.isolation {
        crate::sandboxes::driver::IsolationArg::Auto => "auto",
        crate::sandboxes::driver::IsolationArg::Namespaces => "namespaces",
        crate::sandboxes::driver::IsolationArg::None => "none",
    };
    let supervisor_bin = me
        .parent()
        .context("binary has no directory")?
        .join("openshell-supervisor");
    // Hosts run their sandboxes with what the replicas would have used.
    let host_isolation = if args.hosts > 0 {
        let (resolved, fallback) =
            crate::sandboxes::driver::resolve_isolation(args.isolation, &supervisor_bin)
                .map_err(anyhow::Error::msg)?;
        if let Some(reason) = fallback {
            tracing::warn!(
                reason = reason.as_str(),
                "SANDBOXES ARE NOT ISOLATED: --isolation auto fell back to none"
            );
        }
        resolved.as_str()
    } else {
        "none"
    };
    let pages_listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding {}", args.metrics_listen))?;
    let pages_addr = pages_listener.local_addr()?;
    let board = Arc::new(Board::new(
        run_dir.join(board::STATUS_FILE),
        edge_url.clone(),
        pages_addr.to_string(),
    ));
    let pages_stop = CancellationToken::new();
    let pages_board = board.clone();
    let pages: crate::metrics::Pages = Arc::new(move |path: &str| match path {
        "/metrics" => Some((
            200,
            crate::metrics::PROMETHEUS_TEXT,
            pages_board.render_metrics(),
        )),
        "/status" => Some((200, "application/json", pages_board.render_json())),
        _ => None,
    });
    tokio::spawn(crate::metrics::serve_pages(
        pages_listener,
        pages,
        pages_stop.clone(),
    ));

    let mut started: Vec<Started> = Vec::new();
    let mut routes = control::EdgeRoutes::new(
        run_dir.join("edge-routes.json"),
        run_dir.join("edge.ready.json"),
    );
    let mut metrics_addrs = Vec::new();
    let mut store_faults = control::StoreFaults::new(run_dir.join("store-fault.json"));
    let result = async {
        for i in 0..args.replicas {
            let id = format!("gw-{i}");
            let mut spec = Spec::new(&id, Kind::Replica, &me, run_dir.join(format!("{id}.log")));
            spec.args([
                "serve",
                "--dev",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .args(["--replica-id", &id, "--supervisor-url", &edge_url])
            .arg("--trust-forwarded-authority")
            .args(["--config-delivery-mode", mode])
            .arg("--database-max-connections")
            .arg(args.database_max_connections.to_string())
            .arg("--database-timeout-ms")
            .arg(args.database_timeout_ms.to_string())
            .args(["--isolation", isolation])
            .args(["--driver", if args.hosts > 0 { "hosts" } else { "process" }])
            .args(
                args.host_lost_after
                    .map(|secs| ["--host-lost-after".to_owned(), secs.to_string()])
                    .into_iter()
                    .flatten(),
            )
            .args(
                args.host_lost_policy
                    .map(|policy| match policy {
                        crate::sandboxes::HostLostPolicy::Restart => "restart",
                        crate::sandboxes::HostLostPolicy::Error => "error",
                    })
                    .map(|policy| ["--host-lost-policy", policy])
                    .into_iter()
                    .flatten(),
            )
            .args(
                (args.expose_sandbox_tokens || args.control == Control::Stdin)
                    .then_some("--allow-test-flags"),
            )
            .args(
                args.expose_sandbox_tokens
                    .then_some("--expose-sandbox-tokens"),
            )
            // Orders on stdin may slow or cut the store (`slow-store`,
            // `cut-store`): every replica follows the fault file.
            .args(
                (args.control == Control::Stdin)
                    .then(|| ["--store-fault-file".into(), store_faults.file_arg()])
                    .into_iter()
                    .flatten(),
            )
            // No --stop-sandboxes-on-exit: that stops every supervisor on
            // the machine, and one replica stopping (an order, a crash
            // restart) must leave the sandboxes to the others. `up` stops
            // them itself once every replica is down; should `up` die, its
            // replicas get SIGTERM and, orphaned, stop them.
            .arg("--stop-sandboxes-if-orphaned")
            .arg("--data-dir")
            .arg(&data_dir);
            let ready = run_dir.join(format!("{id}.ready.json"));
            spec.arg("--ready-file").arg(&ready);
            spec.ready_file = Some(ready);
            spec.env
                .push(("OPENSHELL_PEER_TOKEN".into(), peer_token.clone()));
            let info = start(spec, &mut started, &board).await?;
            let url = info["url"].as_str().unwrap_or_default().to_owned();
            let metrics = info["metrics"].as_str().unwrap_or_default().to_owned();
            say(&format!("  {id}: {url} (metrics http://{metrics}/metrics)"));
            // A restart binds the same ports: the edge's route and the
            // banner stay right.
            let spec = &mut started.last_mut().expect("started").spec;
            spec.set_value("--listen", url.trim_start_matches("http://"));
            spec.set_value("--metrics-listen", &metrics);
            routes.add(&id, &url);
            store_faults.add(&id, &metrics);
            metrics_addrs.push(metrics);
        }
        if args.replicas > 1 {
            wait_rings_full(&metrics_addrs, args.replicas).await;
        }
        let mut edge = Spec::new("edge", Kind::Edge, &me, run_dir.join("edge.log"));
        // Routes from a file the edge re-reads on SIGHUP, so an order can
        // cut one (`cut-route`) without restarting the edge.
        routes.write()?;
        edge.args(["edge", "--listen", &args.listen.to_string()])
            .arg("--routes-file")
            .arg(routes.file())
            .args(["--metrics-listen", "127.0.0.1:0"]);
        let ready = run_dir.join("edge.ready.json");
        edge.arg("--ready-file").arg(&ready);
        edge.ready_file = Some(ready);
        start(edge, &mut started, &board).await?;
        if args.hosts > 0 {
            let hosts = host_specs(
                args.hosts,
                &supervisor_bin,
                &data_dir,
                &edge_url,
                host_isolation,
                args.host_threads,
            )
            .await?;
            for spec in hosts {
                let name = spec.name.clone();
                start(spec, &mut started, &board).await?;
                let pid = started
                    .last()
                    .and_then(|s| s.child.id())
                    .unwrap_or_default();
                say(&format!("  {name}: supervisor host (pid {pid})"));
            }
            // Announced once every host holds its session: a sandbox created
            // right after the banner has somewhere to go.
            wait_hosts_connected(&mut started, &metrics_addrs, args.hosts).await?;
        }
        anyhow::Ok(())
    }
    .await;

    if let Err(err) = result {
        stop_started(&mut started).await;
        pages_stop.cancel();
        return Err(err);
    }
    let pool = match args.hosts {
        0 => String::new(),
        n => format!("; sandboxes on {n} supervisor hosts"),
    };
    say(&format!(
        "  up: status http://{pages_addr}/status, metrics http://{pages_addr}/metrics (restart: {})",
        match args.restart {
            Restart::Always => "always",
            Restart::Never => "never",
        }
    ));
    say(&format!(
        "openshell-gateway cluster of {} replicas serving {edge_url} (dev mode: no auth; config delivery: {mode}{pool}). Logs: {}. Ctrl-C stops it.",
        args.replicas,
        run_dir.display()
    ));

    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // Hosts stop first (their sandboxes end while the replicas still serve
    // their sessions), then the edge and the replicas.
    let hosts_stop = CancellationToken::new();
    let rest_stop = CancellationToken::new();
    let (mut hosts, mut rest) = (Vec::new(), Vec::new());
    let mut orders = std::collections::HashMap::new();
    for Started { spec, child } in started {
        let (stop, tasks) = match spec.kind {
            Kind::Host => (&hosts_stop, &mut hosts),
            Kind::Replica | Kind::Edge => (&rest_stop, &mut rest),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        orders.insert(spec.name.clone(), tx);
        tasks.push(process::supervise(
            spec,
            child,
            board.clone(),
            args.restart,
            stop.clone(),
            rx,
        ));
    }
    let input_ended = CancellationToken::new();
    if args.control == Control::Stdin {
        tokio::spawn(control::take_orders(
            orders,
            routes,
            store_faults,
            board.clone(),
            input_ended.clone(),
        ));
    }
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        _ = input_ended.cancelled() => {}
    }
    say("stopping the cluster");
    hosts_stop.cancel();
    futures::future::join_all(hosts).await;
    rest_stop.cancel();
    futures::future::join_all(rest).await;
    stop_supervisors(&data_dir).await;
    pages_stop.cancel();
    Ok(())
}

/// Issues host tokens `h-0..h-(n-1)` into `<data>/up/` (mode 0600) and
/// returns how to start one `openshell-supervisor host` per token, dialling
/// the edge, its sandboxes under `<data>/hosts/<id>`.
async fn host_specs(
    n: u64,
    supervisor_bin: &Path,
    data_dir: &Path,
    edge_url: &str,
    isolation: &str,
    threads: Option<u16>,
) -> anyhow::Result<Vec<Spec>> {
    if !supervisor_bin.exists() {
        bail!(
            "{} not found: build the workspace (cargo build) first",
            supervisor_bin.display()
        );
    }
    let run_dir = data_dir.join("up");
    let store_path = crate::store::layout::prepare(data_dir)?;
    let store = crate::store::Store::open(
        &format!("sqlite://{}", store_path.display()),
        crate::store::StoreOptions::default(),
    )
    .await
    .map_err(|err| anyhow::anyhow!("opening the store: {err}"))?;
    let mut tokens = Vec::new();
    for i in 0..n {
        let id = format!("h-{i}");
        let token_file = run_dir.join(format!("{id}.token"));
        let issued = crate::host_token::issue(&store, &id, &token_file).await;
        if let Err(err) = issued {
            store.close().await;
            return Err(err);
        }
        tokens.push((id, token_file));
    }
    store.close().await;
    let mut specs = Vec::new();
    for (id, token_file) in tokens {
        let root = data_dir.join("hosts").join(&id);
        std::fs::create_dir_all(&root)?;
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let mut host = Spec::new(
            &id,
            Kind::Host,
            supervisor_bin,
            run_dir.join(format!("{id}.log")),
        );
        host.arg("host")
            .args(["--gateway", edge_url, "--host-id", &id])
            .arg("--token-file")
            .arg(&token_file)
            .arg("--root")
            .arg(&root)
            .args(["--isolation", isolation]);
        if let Some(threads) = threads {
            host.arg("--worker-threads").arg(threads.to_string());
        }
        if isolation == "namespaces" {
            // The store and the host tokens stay out of every sandbox's view.
            host.arg("--hide")
                .arg(data_dir.join(crate::store::layout::STORE_DIR))
                .arg("--hide")
                .arg(&run_dir);
        }
        specs.push(host);
    }
    Ok(specs)
}

/// Waits (at most 30 s) until the replicas hold `n` host sessions between
/// them, by their `openshell_server_supervisor_hosts` gauges; fails at once
/// if a process exits meanwhile.
async fn wait_hosts_connected(
    started: &mut [Started],
    metrics_addrs: &[String],
    n: u64,
) -> anyhow::Result<()> {
    let begun = Instant::now();
    loop {
        let mut held = 0.0;
        for addr in metrics_addrs {
            held += hosts_held(addr).await.unwrap_or(0.0);
        }
        if held >= n as f64 {
            return Ok(());
        }
        for s in started.iter_mut() {
            if let Some(status) = s.child.try_wait()? {
                bail!(
                    "{} exited during start-up ({status}); see {}",
                    s.spec.name,
                    s.spec.log.display()
                );
            }
        }
        if begun.elapsed() > Duration::from_secs(30) {
            bail!("{held} of {n} supervisor hosts connected after 30 s; see their logs");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (at most 10 s) until every replica's ring holds all `n`
/// replicas, so that placement right after the banner is the ring's.
async fn wait_rings_full(metrics_addrs: &[String], n: usize) {
    let begun = Instant::now();
    while begun.elapsed() < Duration::from_secs(10) {
        let mut full = true;
        for addr in metrics_addrs {
            full &= gauge(addr, "openshell_server_ring_members").await == Some(n as f64);
        }
        if full {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::warn!("the replicas' rings are not all full after 10 s; starting anyway");
}

/// One replica's `openshell_server_supervisor_hosts` gauge.
async fn hosts_held(metrics_addr: &str) -> Option<f64> {
    gauge(metrics_addr, "openshell_server_supervisor_hosts").await
}

/// One unlabelled gauge of a replica's metrics.
async fn gauge(metrics_addr: &str, name: &str) -> Option<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let read = async {
        let mut stream = tokio::net::TcpStream::connect(metrics_addr).await.ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    };
    tokio::time::timeout(Duration::from_secs(2), read)
        .await
        .ok()
        .flatten()
}

/// Prints a line; a closed stdout (the terminal or pipe went away) must not
/// stop `up` from stopping its processes.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// A start that failed half way: every process started is stopped at once
/// (SIGTERM, SIGKILL after 15 s).
async fn stop_started(started: &mut [Started]) {
    let stops = started
        .iter_mut()
        .rev()
        .map(|s| process::terminate(&s.spec.name, &mut s.child));
    futures::future::join_all(stops).await;
}

/// Stops every sandbox supervisor, once the replicas are down (the
/// supervisors outlive a replica by design, so that one replica stopping
/// leaves its sandboxes to the others). Each is named by its
/// `supervisor.pid` and checked to be that sandbox's supervisor before it
/// is signalled.
async fn stop_supervisors(data_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(data_dir.join("sandboxes")) else {
        return;
    };
    let mut stops = Vec::new();
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let pid = std::fs::read_to_string(entry.path().join("supervisor.pid"))
            .ok()
            .and_then(|text| text.trim().parse::<i32>().ok());
        if let Some(pid) = pid
            && crate::sandboxes::driver::is_our_supervisor(pid, &id)
        {
            stops.push(async move { crate::sandboxes::driver::terminate(&id, &[pid]).await });
        }
    }
    futures::future::join_all(stops).await;
}
