//! `openshell-gateway`: the reference OpenShell gateway.
//!
//! `serve` runs one replica: the OpenShell gRPC API, the supervisor session
//! endpoint, the process sandbox driver, the store (SQLite under the data
//! directory, or PostgreSQL), and Prometheus metrics on a separate listener.
//! Given a peer token it joins a cluster: membership, ring placement,
//! redirects, the peer relay and owner reporting.

mod auth;
mod cluster;
mod config_delivery;
mod config_model;
mod driver;
mod edge;
mod flag_policy;
mod layout;
mod metrics;
mod peer_service;
mod relay_routing;
mod request_layer;
mod ring;
mod sandboxes;
mod secret;
mod service;
mod sessions;
mod store;
mod streams;
mod up;
mod validate;
mod watch_hub;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use openshell_proto::open_shell_server::OpenShellServer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::auth::Authenticator;
use crate::cluster::{Cluster, ClusterConfig};
use crate::config_delivery::{ConfigDelivery, DeliveryConfig, DeliveryMode};
use crate::config_model::ConfigModel;
use crate::driver::{DriverKind, IsolationArg, ProcessDriver};
use crate::metrics::Metrics;
use crate::peer_service::PeerService;
use crate::relay_routing::RelayRouter;
use crate::request_layer::GatewayLayer;
use crate::sandboxes::Sandboxes;
use crate::secret::Secret;
use crate::service::GatewayService;
use crate::sessions::Sessions;
use crate::store::Store;
use crate::streams::Streams;
use crate::watch_hub::WatchHub;
use openshell_proto::SessionRedirect;
use openshell_proto::peer::peer_server::PeerServer;

/// Largest request message the gateway decodes (exec stdin travels inline).
const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;

#[derive(Parser)]
#[command(
    name = "openshell-gateway",
    version,
    about = "Reference OpenShell gateway"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at startup: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run one gateway replica.
    Serve(ServeArgs),
    /// Run the developer cluster: replicas + edge + process sandboxes.
    Up(up::UpArgs),
    /// Run the edge proxy: routes gRPC by `x-openshell-replica` to replicas.
    Edge(edge::EdgeArgs),
}

// Secrets are `Secret`s: `Debug` redacts them.
#[derive(Args, Debug)]
struct ServeArgs {
    /// gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:17670")]
    listen: SocketAddr,
    /// Prometheus `/metrics` listen address.
    #[arg(long, default_value = "127.0.0.1:9090")]
    metrics_listen: SocketAddr,
    /// Directory for the SQLite store and sandbox directories. Replicas on
    /// one host may share it.
    #[arg(long, default_value = "openshell-data")]
    data_dir: PathBuf,
    /// Store URL: `sqlite://PATH` (default `<data-dir>/gateway.db`) or
    /// `postgres://...` for replicas on several hosts.
    #[arg(long, env = "OPENSHELL_DATABASE_URL", hide_env_values = true)]
    database_url: Option<Secret>,
    /// Shared secret of the cluster's peer service. Setting it makes this
    /// replica a cluster member.
    #[arg(long, env = "OPENSHELL_PEER_TOKEN", hide_env_values = true)]
    peer_token: Option<Secret>,
    /// URL other replicas and redirected supervisors use to reach this
    /// replica (default: its listen address).
    #[arg(long)]
    peer_endpoint: Option<String>,
    /// Heartbeat period advertised to supervisors; a session silent for
    /// three periods (at least 15 s) is closed.
    #[arg(long, default_value_t = 15_000, hide = true)]
    heartbeat_ms: u64,
    /// How often membership is refreshed.
    #[arg(long, default_value_t = 10_000, hide = true)]
    member_refresh_ms: u64,
    /// How long a member stays live without a refresh (database time).
    #[arg(long, default_value_t = 30_000, hide = true)]
    member_ttl_ms: u64,
    /// This replica's id, sent as `x-openshell-served-by`.
    #[arg(long, default_value = "gw-0")]
    replica_id: String,
    /// A user bearer token (repeatable).
    #[arg(
        long = "token",
        env = "OPENSHELL_GATEWAY_TOKENS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    tokens: Vec<Secret>,
    /// File with one user token per line.
    #[arg(long)]
    tokens_file: Option<PathBuf>,
    /// No user authentication. Only allowed on a loopback listen address.
    #[arg(long)]
    dev: bool,
    /// Allow the hidden test and benchmark flags (`--driver none`, the
    /// `--*-ms` tuning knobs); without it they are refused. Never in
    /// production.
    #[arg(long)]
    allow_test_flags: bool,
    /// PEM certificate chain; serve TLS with --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The supervisor binary (default: next to this binary).
    #[arg(long)]
    supervisor_bin: Option<PathBuf>,
    /// URL supervisors dial (default: this replica's listen address).
    #[arg(long)]
    supervisor_url: Option<String>,
    /// CA file supervisors trust for an https supervisor URL (default: --tls-cert).
    #[arg(long)]
    supervisor_ca: Option<PathBuf>,
    /// Stop every supervisor when the gateway exits (they restart with it).
    #[arg(long)]
    stop_sandboxes_on_exit: bool,
    /// Write `{"grpc":..,"metrics":..,"replica_id":..,"pid":..}` here once serving.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// How supervisors get configuration changes: `poll` (they ask every
    /// 10 s) or `push` (this replica pushes each change over the session to
    /// supervisors that support it). Setting poll and restarting rolls back.
    #[arg(
        long,
        value_enum,
        env = "OPENSHELL_CONFIG_DELIVERY_MODE",
        default_value = "poll"
    )]
    config_delivery_mode: DeliveryMode,
    /// Interval of the per-session config reconcile (push mode).
    #[arg(long, default_value_t = config_delivery::RECONCILE_INTERVAL.as_millis() as u64, hide = true)]
    config_reconcile_ms: u64,
    /// How long owner lookups for config notifications are cached.
    #[arg(long, default_value_t = config_delivery::OWNER_CACHE_TTL.as_millis() as u64, hide = true)]
    config_owner_cache_ms: u64,
    /// Tests and benchmarks only: every push build waits this long (holding
    /// its build permit) before reading the store, as a slow store would.
    #[arg(long, default_value_t = 0, hide = true)]
    config_build_delay_ms: u64,
    /// Tests and benchmarks only: `none` creates sandbox records and
    /// directories but starts no supervisor, and writes each sandbox's
    /// token to `<data-dir>/sandboxes/<id>/token` (mode 0600) so that a
    /// test can run the supervisor side itself. Default `process`.
    #[arg(long, value_enum, default_value = "process", hide = true)]
    driver: DriverKind,
    /// How sandbox processes are isolated: `namespaces` (their own user, PID
    /// and mount namespaces as an unprivileged uid, the data directory and
    /// the gateway's secret files hidden; needs root), `none`, or `auto`
    /// (namespaces where available, else none with a warning).
    #[arg(long, value_enum, env = "OPENSHELL_ISOLATION", default_value = "auto")]
    isolation: IsolationArg,
    /// Tests only: keep a copy of each sandbox token in
    /// `<data-dir>/sandboxes/<id>/token` (mode 0600, hidden from sandboxes)
    /// so a test can act as the sandbox's supervisor.
    #[arg(long, hide = true)]
    expose_sandbox_tokens: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mut cli = Cli::command();
    let matches = cli.get_matches_mut();
    let parsed = Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.format(&mut cli).exit());
    match parsed.command {
        Command::Serve(args) => {
            flag_policy::check_serve(
                cli.find_subcommand("serve").expect("serve is a subcommand"),
                matches
                    .subcommand_matches("serve")
                    .expect("serve was parsed"),
                args.allow_test_flags,
            )?;
            serve(args).await
        }
        Command::Up(args) => up::run(args).await,
        Command::Edge(args) => edge::run(args).await,
    }
}

/// What sandbox processes must not see besides the data directory: the
/// store when it lives elsewhere, the tokens file, the TLS key.
fn hidden_paths(args: &ServeArgs, data_dir: &Path) -> Vec<PathBuf> {
    let mut hide = Vec::new();
    if let Some(path) = args
        .database_url
        .as_ref()
        .and_then(|url| url.expose().strip_prefix("sqlite://"))
        .map(|rest| rest.split('?').next().unwrap_or(rest))
        .and_then(|path| std::path::absolute(path).ok())
        .filter(|path| !path.starts_with(data_dir))
    {
        // The database and its -wal and -shm companions.
        hide.extend(path.parent().map(Path::to_path_buf));
    }
    for file in [&args.tokens_file, &args.tls_key].into_iter().flatten() {
        hide.extend(std::path::absolute(file).ok());
    }
    hide
}

fn user_tokens(args: &ServeArgs) -> anyhow::Result<Vec<String>> {
    let mut tokens: Vec<String> = args
        .tokens
        .iter()
        .map(|t| t.expose().trim().to_owned())
        .filter(|t| !t.is_empty())
        .collect();
    if let Some(path) = &args.tokens_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading tokens file {}", path.display()))?;
        tokens.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned),
        );
    }
    Ok(tokens)
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Other processes of this user (sandbox code among them, without
    // isolation) cannot read this process's memory, environment or
    // descriptors.
    // SAFETY: prctl with PR_SET_DUMPABLE takes plain integers.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0);
    }
    let tokens = user_tokens(&args)?;
    if args.dev && !args.listen.ip().is_loopback() {
        bail!("--dev (no authentication) is only allowed on a loopback listen address");
    }
    if !args.dev && tokens.is_empty() {
        bail!(
            "no user tokens configured: pass --token, OPENSHELL_GATEWAY_TOKENS or --tokens-file \
             (or --dev on a loopback address)"
        );
    }
    let replica_header = http::HeaderValue::from_str(&args.replica_id)
        .context("--replica-id must be a valid header value")?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating data directory {}", args.data_dir.display()))?;
    let data_dir = args.data_dir.canonicalize()?;
    let database_url = match &args.database_url {
        Some(url) => url.expose().to_owned(),
        None => {
            let path = layout::prepare(&data_dir).context("preparing the data directory")?;
            format!("sqlite://{}", path.display())
        }
    };
    // The URL may hold a password: never print it.
    let store = Store::open(&database_url).await.map_err(|err| {
        anyhow::anyhow!("opening the store ({:?}): {err}", store_kind(&database_url))
    })?;
    let peer_token = args
        .peer_token
        .clone()
        .filter(|t| !t.expose().trim().is_empty());

    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let grpc_addr = listener.local_addr()?;
    let metrics_listener = TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding {}", args.metrics_listen))?;
    let metrics_addr = metrics_listener.local_addr()?;

    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(Identity::from_pem(
            std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?,
            std::fs::read(key).with_context(|| format!("reading {}", key.display()))?,
        )),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let supervisor_url = args
        .supervisor_url
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{grpc_addr}"));
    let supervisor_bin = match &args.supervisor_bin {
        Some(bin) => bin.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("binary has no directory")?
            .join("openshell-supervisor"),
    };
    let supervisor_ca = args.supervisor_ca.clone().or_else(|| args.tls_cert.clone());

    let metrics = Metrics::new();
    let sessions = Sessions::new(
        metrics.clone(),
        Duration::from_millis(args.heartbeat_ms.max(100)),
    );
    let cluster = match &peer_token {
        Some(token) => {
            let peer_endpoint = args
                .peer_endpoint
                .clone()
                .unwrap_or_else(|| format!("{scheme}://{grpc_addr}"));
            let mut config =
                ClusterConfig::new(args.replica_id.clone(), peer_endpoint, token.clone());
            config.refresh_every = Duration::from_millis(args.member_refresh_ms.max(100));
            config.member_ttl = Duration::from_millis(args.member_ttl_ms.max(500));
            config.store_timeout = config.store_timeout.min(config.member_ttl / 2);
            Some(Cluster::start(config, store.clone(), metrics.clone()).await)
        }
        None => None,
    };
    let (isolation, fallback) =
        driver::resolve_isolation(args.isolation, &supervisor_bin).map_err(anyhow::Error::msg)?;
    if args.driver == DriverKind::Process {
        match &fallback {
            Some(reason) => tracing::warn!(
                reason = reason.as_str(),
                "SANDBOXES ARE NOT ISOLATED: --isolation auto fell back to none; sandbox code \
                 runs as the supervisor's user and can read this gateway's data directory"
            ),
            None => tracing::info!(isolation = isolation.as_str(), "sandbox isolation"),
        }
    }
    metrics.set_isolation(isolation.as_str());
    let (driver, mut exits) = ProcessDriver::new(
        data_dir.clone(),
        supervisor_bin,
        supervisor_url,
        supervisor_ca,
    );
    let driver = driver.with_isolation(isolation, hidden_paths(&args, &data_dir));
    let driver = if args.expose_sandbox_tokens {
        tracing::warn!(
            "--expose-sandbox-tokens: sandbox tokens are kept in <data-dir>/sandboxes/<id>/token \
             (tests only)"
        );
        driver.exposing_tokens()
    } else {
        driver
    };
    let driver = match args.driver {
        DriverKind::Process => driver,
        DriverKind::None => {
            tracing::warn!(
                "--driver none: no supervisors are started and sandbox tokens are written \
                 to <data-dir>/sandboxes/<id>/token (tests and benchmarks only)"
            );
            driver.without_processes()
        }
    };
    let sandboxes = Arc::new(Sandboxes {
        store: store.clone(),
        hub: WatchHub::new(),
        driver,
        sessions: sessions.clone(),
        cluster: cluster.clone(),
        host: host_name(),
    });
    sandboxes.recover().await.context("recovering sandboxes")?;
    tokio::spawn(sandboxes.clone().follow_events());
    if let Some(cluster) = &cluster {
        tokio::spawn(send_sessions_home(
            cluster.clone(),
            sessions.clone(),
            metrics.clone(),
        ));
    }
    let config_model = ConfigModel::new(store.clone());
    let delivery = ConfigDelivery::new(
        DeliveryConfig {
            mode: args.config_delivery_mode,
            reconcile_interval: Duration::from_millis(args.config_reconcile_ms),
            owner_cache_ttl: Duration::from_millis(args.config_owner_cache_ms),
            pool_size: crate::store::POOL_SIZE,
            build_delay: Duration::from_millis(args.config_build_delay_ms),
        },
        config_model.clone(),
        sessions.clone(),
        cluster.clone(),
        metrics.clone(),
    );
    tracing::info!(
        mode = ?args.config_delivery_mode,
        build_permits = delivery.permits.size(),
        "config delivery"
    );
    let router = Arc::new(RelayRouter {
        sessions: sessions.clone(),
        cluster: cluster.clone(),
        store: store.clone(),
        metrics: metrics.clone(),
    });
    {
        let sandboxes = sandboxes.clone();
        tokio::spawn(async move {
            while let Some(exit) = exits.recv().await {
                sandboxes.on_supervisor_exit(exit).await;
            }
        });
    }

    let shutdown = CancellationToken::new();
    let service = GatewayService {
        sandboxes: sandboxes.clone(),
        sessions: sessions.clone(),
        streams: Streams {
            sandboxes: sandboxes.clone(),
            router: router.clone(),
            shutdown: shutdown.clone(),
        },
        router: router.clone(),
        cluster: cluster.clone(),
        config: config_model,
        delivery: delivery.clone(),
    };
    let layer = GatewayLayer {
        replica_id: replica_header,
        auth: Arc::new(Authenticator::new(
            &tokens,
            peer_token.as_ref().map(Secret::expose),
            args.dev,
            store.clone(),
        )),
        metrics: metrics.clone(),
    };
    // Relays carry bulk data: the HTTP/2 default window (64 KiB) throttles them.
    let mut builder = Server::builder()
        .initial_stream_window_size(Some(2 << 20))
        .initial_connection_window_size(Some(16 << 20))
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)));
    if let Some(identity) = tls {
        builder = builder
            .tls_config(ServerTlsConfig::new().identity(identity))
            .context("TLS configuration")?;
    }
    let server_stop = CancellationToken::new();
    let router = builder
        .layer(layer)
        .add_service(
            OpenShellServer::new(service)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            PeerServer::new(PeerService {
                sessions: sessions.clone(),
                delivery: delivery.clone(),
            })
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        );
    let stop = server_stop.clone();
    let server = tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(accept_nodelay(listener), stop.cancelled_owned())
            .await
    });
    let metrics_stop = CancellationToken::new();
    tokio::spawn(metrics::serve(
        metrics_listener,
        metrics.clone(),
        metrics_stop.clone(),
    ));

    let ready = serde_json::json!({
        "grpc": grpc_addr.to_string(),
        "url": format!("{scheme}://{grpc_addr}"),
        "metrics": metrics_addr.to_string(),
        "replica_id": args.replica_id,
        "pid": std::process::id(),
    });
    if let Some(path) = &args.ready_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, ready.to_string())?;
        std::fs::rename(&tmp, path)?;
    }
    println!(
        "openshell-gateway {} serving {scheme}://{grpc_addr} (metrics http://{metrics_addr}/metrics, data {})",
        args.replica_id,
        data_dir.display()
    );

    wait_for_signal().await;
    tracing::info!("shutting down");
    // Leave the ring first, so the redirects below point at the replicas
    // that stay; then streams end with UNAVAILABLE, sessions are redirected
    // and closed, and the server drains.
    let redirects = match &cluster {
        Some(cluster) => {
            let ring = cluster.leave().await;
            sessions.shutdown(|sandbox_id| {
                cluster
                    .placement(&ring, sandbox_id)
                    .map(|(owner, endpoint)| SessionRedirect {
                        peer_endpoint: endpoint,
                        owner_replica_id: owner,
                    })
            })
        }
        None => sessions.shutdown(|_| None),
    };
    metrics
        .session_redirects
        .get_or_create(&crate::metrics::RedirectLabels { reason: "shutdown" })
        .inc_by(redirects as u64);
    if redirects > 0 {
        tracing::info!(
            redirects,
            "redirected supervisors to the remaining replicas"
        );
    }
    shutdown.cancel();
    if args.stop_sandboxes_on_exit {
        sandboxes.stop_all_supervisors().await;
    }
    server_stop.cancel();
    match tokio::time::timeout(Duration::from_secs(5), server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(err))) => tracing::warn!(%err, "server ended with an error"),
        Ok(Err(err)) => tracing::warn!(%err, "server task failed"),
        Err(_) => tracing::warn!("connections still open after 5 s; exiting anyway"),
    }
    metrics_stop.cancel();
    store.close().await;
    Ok(())
}

/// Accepted connections with Nagle off: small frames (exec events, acks)
/// must not wait for delayed ACKs. (`Server::tcp_nodelay` only applies to
/// listeners tonic binds itself.)
fn accept_nodelay(
    listener: TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use futures::StreamExt;
    TcpListenerStream::new(listener).map(|accepted| {
        let stream = accepted?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
}

/// Every refresh interval, sends idle sessions whose live ring owner is
/// another replica back to it (after shutdowns and outages moved them), so
/// placement converges on the ring without cutting running streams.
async fn send_sessions_home(cluster: Arc<Cluster>, sessions: Arc<Sessions>, metrics: Arc<Metrics>) {
    let every = cluster.config.refresh_every;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if sessions.is_shutting_down() {
            return;
        }
        let ring = cluster.ring();
        let me = cluster.replica_id().to_owned();
        // Young sessions stay: the replicas' views of the ring may still differ.
        let sent = sessions.send_home(every * 2, |sandbox_id| {
            let (owner, endpoint) = cluster.placement(&ring, sandbox_id)?;
            (owner != me).then_some(SessionRedirect {
                peer_endpoint: endpoint,
                owner_replica_id: owner,
            })
        });
        if sent > 0 {
            tracing::info!(sent, "sent idle sessions home to their ring owners");
            metrics
                .session_redirects
                .get_or_create(&crate::metrics::RedirectLabels {
                    reason: "rebalance",
                })
                .inc_by(sent as u64);
        }
    }
}

/// "sqlite" or "postgres": what to say about a store URL without showing it.
fn store_kind(url: &str) -> &'static str {
    if url.starts_with("postgres") {
        "postgres"
    } else {
        "sqlite"
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, Command};

    #[test]
    fn serve_args_debug_redacts_secrets() {
        let cli = Cli::try_parse_from([
            "openshell-gateway",
            "serve",
            "--token",
            "user-token-aaa,user-token-bbb",
            "--peer-token",
            "peer-token-ccc",
            "--database-url",
            "postgres://gw:db-password-ddd@db.example/openshell",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("serve");
        };
        assert_eq!(args.tokens.len(), 2);
        let shown = format!("{args:?}");
        for secret in ["user-token", "peer-token-ccc", "db-password", "db.example"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}
