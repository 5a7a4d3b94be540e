//! `openshell-gateway up`: the developer cluster on one machine. It starts
//! N `serve` replicas (gw-0..gw-N-1) sharing the embedded SQLite store and a
//! generated peer token, then the edge on the public address with one route
//! per replica; supervisors dial the edge, so placement works as in
//! production. With `--hosts N` the replicas run `--driver hosts` and `up`
//! issues host tokens `h-0..h-(N-1)` and starts N shared supervisor hosts
//! (`openshell-supervisor host`) dialling the edge, which serve every
//! sandbox instead of one supervisor process each. It stays in the
//! foreground; Ctrl-C (or SIGTERM) stops the hosts, the edge, the replicas
//! and their sandboxes' supervisors, each by its PID.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use tokio::process::{Child, Command};

use crate::config::delivery::DeliveryMode;

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
}

struct Running {
    name: String,
    child: Child,
}

async fn wait_ready_file(
    path: &Path,
    child: &mut Child,
    name: &str,
) -> anyhow::Result<serde_json::Value> {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return Ok(serde_json::from_str(&text)?);
        }
        if let Some(status) = child.try_wait()? {
            bail!("{name} exited during start-up ({status}); see its log");
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("{name} not ready after 30 s; see its log");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    if args.replicas == 0 {
        bail!("--replicas must be at least 1");
    }
    if !args.listen.ip().is_loopback() {
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
    let mut running: Vec<Running> = Vec::new();
    let mut routes = Vec::new();
    let mut metrics_addrs = Vec::new();
    let result = async {
        for i in 0..args.replicas {
            let id = format!("gw-{i}");
            let ready = run_dir.join(format!("{id}.ready.json"));
            let _ = std::fs::remove_file(&ready);
            let log = std::fs::File::create(run_dir.join(format!("{id}.log")))?;
            let mut child = Command::new(&me)
                .args([
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
                .arg("--isolation")
                .arg(isolation)
                .args(["--driver", if args.hosts > 0 { "hosts" } else { "process" }])
                .args(
                    args.expose_sandbox_tokens
                        .then_some(["--allow-test-flags", "--expose-sandbox-tokens"])
                        .into_iter()
                        .flatten(),
                )
                .arg("--data-dir")
                .arg(&data_dir)
                .arg("--ready-file")
                .arg(&ready)
                .arg("--stop-sandboxes-on-exit")
                .env("OPENSHELL_PEER_TOKEN", &peer_token)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .kill_on_drop(false)
                .spawn()
                .with_context(|| format!("starting replica {id}"))?;
            let info = wait_ready_file(&ready, &mut child, &id).await;
            running.push(Running {
                name: id.clone(),
                child,
            });
            let info = info?;
            let url = info["url"].as_str().unwrap_or_default().to_owned();
            say(&format!(
                "  {id}: {url} (metrics http://{}/metrics)",
                info["metrics"].as_str().unwrap_or_default()
            ));
            routes.push(format!("{id}={url}"));
            metrics_addrs.push(info["metrics"].as_str().unwrap_or_default().to_owned());
        }
        let ready = run_dir.join("edge.ready.json");
        let _ = std::fs::remove_file(&ready);
        let log = std::fs::File::create(run_dir.join("edge.log"))?;
        let mut edge = Command::new(&me);
        edge.args(["edge", "--listen", &args.listen.to_string()])
            .arg("--ready-file")
            .arg(&ready);
        for route in &routes {
            edge.args(["--replica", route]);
        }
        let mut child = edge
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(false)
            .spawn()
            .context("starting the edge")?;
        let info = wait_ready_file(&ready, &mut child, "edge").await;
        running.push(Running {
            name: "edge".into(),
            child,
        });
        info?;
        if args.hosts > 0 {
            start_hosts(
                &mut running,
                args.hosts,
                &supervisor_bin,
                &data_dir,
                &edge_url,
                host_isolation,
                args.host_threads,
            )
            .await?;
            // Announced once every host holds its session: a sandbox created
            // right after the banner has somewhere to go.
            wait_hosts_connected(&mut running, &metrics_addrs, args.hosts).await?;
        }
        anyhow::Ok(())
    }
    .await;

    if let Err(err) = result {
        stop_all(&mut running).await;
        return Err(err);
    }
    let pool = match args.hosts {
        0 => String::new(),
        n => format!("; sandboxes on {n} supervisor hosts"),
    };
    say(&format!(
        "openshell-gateway cluster of {} replicas serving {edge_url} (dev mode: no auth; config delivery: {mode}{pool}). Logs: {}. Ctrl-C stops it.",
        args.replicas,
        run_dir.display()
    ));

    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut exited = None;
    {
        let waits = running.iter_mut().map(|r| {
            Box::pin(async {
                let status = r.child.wait().await;
                (r.name.clone(), status)
            })
        });
        let any_exit = futures::future::select_all(waits);
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            ((name, status), _, _) = any_exit => exited = Some((name, status)),
        }
    }
    if let Some((name, status)) = exited {
        tracing::error!("{name} exited unexpectedly ({status:?}); stopping the cluster");
    }
    say("stopping the cluster");
    stop_all(&mut running).await;
    Ok(())
}

/// Issues host tokens `h-0..h-(n-1)` into `<data>/up/` (mode 0600) and
/// starts one `openshell-supervisor host` per token, dialling the edge, its
/// sandboxes under `<data>/hosts/<id>`.
async fn start_hosts(
    running: &mut Vec<Running>,
    n: u64,
    supervisor_bin: &Path,
    data_dir: &Path,
    edge_url: &str,
    isolation: &str,
    threads: Option<u16>,
) -> anyhow::Result<()> {
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
    for (id, token_file) in tokens {
        let root = data_dir.join("hosts").join(&id);
        std::fs::create_dir_all(&root)?;
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let log = std::fs::File::create(run_dir.join(format!("{id}.log")))?;
        let mut host = Command::new(supervisor_bin);
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
        let child = host
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(false)
            .spawn()
            .with_context(|| format!("starting supervisor host {id}"))?;
        say(&format!(
            "  {id}: supervisor host (pid {})",
            child.id().unwrap_or_default()
        ));
        running.push(Running { name: id, child });
    }
    Ok(())
}

/// Waits (at most 30 s) until the replicas hold `n` host sessions between
/// them, by their `openshell_server_supervisor_hosts` gauges; fails at once
/// if a process exits meanwhile.
async fn wait_hosts_connected(
    running: &mut [Running],
    metrics_addrs: &[String],
    n: u64,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let mut held = 0.0;
        for addr in metrics_addrs {
            held += hosts_held(addr).await.unwrap_or(0.0);
        }
        if held >= n as f64 {
            return Ok(());
        }
        for r in running.iter_mut() {
            if let Some(status) = r.child.try_wait()? {
                bail!("{} exited during start-up ({status}); see its log", r.name);
            }
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("{held} of {n} supervisor hosts connected after 30 s; see their logs");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One replica's `openshell_server_supervisor_hosts` gauge.
async fn hosts_held(metrics_addr: &str) -> Option<f64> {
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
            .find_map(|l| l.strip_prefix("openshell_server_supervisor_hosts "))
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

/// SIGTERM to each process (edge first), then SIGKILL after 15 s.
async fn stop_all(running: &mut [Running]) {
    for r in running.iter().rev() {
        if let Some(pid) = r.child.id() {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            }
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    for r in running.iter_mut() {
        match tokio::time::timeout_at(deadline, r.child.wait()).await {
            Ok(_) => {}
            Err(_) => {
                tracing::warn!("{} did not stop in time; killing it", r.name);
                let _ = r.child.kill().await;
            }
        }
    }
}
