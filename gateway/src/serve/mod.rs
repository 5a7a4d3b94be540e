//! `openshell-gateway serve`: one replica, wired together. Builds the store,
//! metrics, sessions, cluster membership, the sandbox driver, config
//! delivery and the API, serves them until SIGTERM or Ctrl-C, then leaves
//! the ring and hands its sessions to the remaining replicas.
//!
//! This is the top of the replica: it may import every other module.

pub mod args;
mod fence;
pub mod flag_policy;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use openshell_proto::open_shell_server::OpenShellServer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::api::hosts::HostService;
use crate::api::peer::PeerService;
use crate::api::raw_routes::RawRoutes;
use crate::api::request_layer::GatewayLayer;
use crate::api::service::GatewayService;
use crate::api::streams::Streams;
use crate::auth::Authenticator;
use crate::cluster::{Cluster, ClusterConfig};
use crate::config::delivery::{ConfigDelivery, DeliveryConfig};
use crate::config::model::ConfigModel;
use crate::metrics::Metrics;
use crate::sandboxes::Sandboxes;
use crate::sandboxes::driver::{DriverKind, ProcessDriver};
use crate::sandboxes::limits::LimitPolicy;
use crate::sandboxes::watch::WatchHub;
use crate::secret::Secret;
use crate::sessions::Sessions;
use crate::sessions::hosts::{HOST_TTL, HostSessions};
use crate::sessions::routing::RelayRouter;
use crate::store::{Store, StoreOptions};
use openshell_proto::SessionRedirect;
use openshell_proto::peer::peer_server::PeerServer;
use openshell_proto::supervisor_host::HostRedirect;
use openshell_proto::supervisor_host::supervisor_host_server::SupervisorHostServer;

pub use args::ServeArgs;
use args::{default_limits, hidden_paths, user_tokens};

/// Largest request message the gateway decodes (exec stdin travels inline).
const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;
/// Largest HTTP/2 frame this replica accepts (SETTINGS_MAX_FRAME_SIZE). The
/// default, 16 KiB, cuts every 64 KiB data frame into five HTTP/2 frames;
/// this fits one in one (ARCHITECTURE.md, "The data path").
pub const H2_MAX_FRAME_SIZE: u32 = 256 * 1024;

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Who started this replica: `--stop-sandboxes-if-orphaned` compares at
    // exit (a parent that died has handed this process to another).
    // SAFETY: getppid(2) has no preconditions.
    let parent = unsafe { libc::getppid() };
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
            let path =
                crate::store::layout::prepare(&data_dir).context("preparing the data directory")?;
            format!("sqlite://{}", path.display())
        }
    };
    // The URL may hold a password: never print it.
    let store_options = StoreOptions {
        max_connections: args.database_max_connections,
        deadline: Duration::from_millis(args.database_timeout_ms),
    };
    let store = Store::open(&database_url, store_options)
        .await
        .map_err(|err| {
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
        (Some(cert), Some(key)) => {
            let pem = std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
            check_server_certificate(&pem)
                .with_context(|| format!("--tls-cert {}", cert.display()))?;
            Some(Identity::from_pem(
                pem,
                std::fs::read(key).with_context(|| format!("reading {}", key.display()))?,
            ))
        }
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
    if let Some(file) = args.store_fault_file.clone() {
        tokio::spawn(follow_store_fault(
            file,
            store.fault().clone(),
            metrics.clone(),
        ));
    }
    let sessions = Sessions::new(
        metrics.clone(),
        Duration::from_millis(args.heartbeat_ms.max(100)),
        Duration::from_millis(args.session_drain_timeout_ms.max(200)),
    );
    sessions
        .caps
        .set_limits(args.max_execs_per_sandbox, args.max_relays_per_sandbox);
    let host_sessions = HostSessions::new(metrics.clone());
    let cluster = match &peer_token {
        Some(token) => {
            let peer_endpoint = args
                .peer_endpoint
                .clone()
                .unwrap_or_else(|| format!("{scheme}://{grpc_addr}"));
            let mut config =
                ClusterConfig::new(args.replica_id.clone(), peer_endpoint, token.clone());
            config.peer_ca = peer_ca(&args, supervisor_ca.as_deref())?;
            config.refresh_every = Duration::from_millis(args.member_refresh_ms.max(100));
            config.member_ttl = Duration::from_millis(args.member_ttl_ms.max(500));
            config.store_timeout = config.store_timeout.min(config.member_ttl / 2);
            Some(Cluster::start(config, store.clone(), metrics.clone()).await)
        }
        None => None,
    };
    let (isolation, fallback) =
        crate::sandboxes::driver::resolve_isolation(args.isolation, &supervisor_bin)
            .map_err(anyhow::Error::msg)?;
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
    let limits = limit_policy(&args, &supervisor_bin)?;
    let (driver, mut exits) = ProcessDriver::new(
        data_dir.clone(),
        supervisor_bin,
        supervisor_url,
        supervisor_ca,
    );
    let driver = driver
        .with_isolation(isolation, hidden_paths(&args, &data_dir))
        .with_egress_deny(args.sandbox_egress_deny.clone())
        .with_host_network(args.sandbox_host_network);
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
        DriverKind::Hosts => {
            tracing::info!("--driver hosts: sandboxes run on shared supervisor hosts");
            driver.without_processes()
        }
        DriverKind::None => {
            tracing::warn!(
                "--driver none: no supervisors are started and sandbox tokens are written \
                 to <data-dir>/sandboxes/<id>/token (tests and benchmarks only)"
            );
            driver.without_processes()
        }
    };
    let event_space = store
        .event_space()
        .await
        .context("reading the event log's sequence space")?;
    let sandboxes = Arc::new(Sandboxes {
        store: store.clone(),
        hub: WatchHub::new(event_space, i64::from(args.sandbox_log_lines)),
        driver,
        sessions: sessions.clone(),
        cluster: cluster.clone(),
        host: host_name(),
        pool: (args.driver == DriverKind::Hosts).then(|| host_sessions.clone()),
        limits,
        limits_unenforced: metrics.limits_unenforced.clone(),
        host_lost: metrics.host_lost.clone(),
    });
    sandboxes.recover().await.context("recovering sandboxes")?;
    if args.driver == DriverKind::Hosts {
        let failover = crate::sandboxes::Failover {
            lost_after: args.host_lost_after(),
            policy: args.host_lost_policy,
        };
        // A live host's seat is renewed this often: a bound that is not
        // well past it would count live hosts as lost.
        let renewal = Duration::from_millis(args.heartbeat_ms.max(100))
            .min(crate::sessions::hosts::HOST_TTL / 4);
        if failover.lost_after <= renewal * 2 {
            anyhow::bail!(
                "the host-lost bound ({} ms) must be more than twice the host seat renewal \
                 period ({} ms)",
                failover.lost_after.as_millis(),
                renewal.as_millis()
            );
        }
        tracing::info!(
            lost_after_s = failover.lost_after.as_secs_f64(),
            policy = ?failover.policy,
            "sandboxes of lost supervisor hosts"
        );
        tokio::spawn(sandboxes.clone().watch_lost_hosts(failover));
    }
    tokio::spawn(sandboxes.clone().follow_events());
    tokio::spawn(sandboxes.clone().report_unreachable_gateways());
    tokio::spawn(crate::api::ssh_sessions::purge_ended(
        store.clone(),
        Duration::from_secs(args.ssh_session_purge_secs),
    ));
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
            pool_size: args.database_max_connections,
            build_delay: Duration::from_millis(args.config_build_delay_ms),
        },
        config_model.clone(),
        sessions.clone(),
        cluster.clone(),
        metrics.clone(),
    );
    tracing::info!(
        mode = ?args.config_delivery_mode,
        database_max_connections = args.database_max_connections,
        build_permits = delivery.permits.size(),
        "config delivery"
    );
    let router = Arc::new(RelayRouter {
        sessions: sessions.clone(),
        cluster: cluster.clone(),
        store: store.clone(),
        metrics: metrics.clone(),
        legacy_peers: Default::default(),
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
    let service = Arc::new(GatewayService {
        sandboxes: sandboxes.clone(),
        sessions: sessions.clone(),
        streams: Streams {
            sandboxes: sandboxes.clone(),
            router: router.clone(),
            shutdown: shutdown.clone(),
            ssh_forwards: Default::default(),
        },
        router: router.clone(),
        cluster: cluster.clone(),
        config: config_model,
        delivery: delivery.clone(),
        ssh: crate::api::ssh_sessions::SshSessionConfig {
            ttl: Duration::from_secs(args.ssh_session_ttl_secs),
            scheme,
        },
    });
    let host_service = HostService {
        gateway: service.clone(),
        hosts: host_sessions.clone(),
        replica_id: args.replica_id.clone(),
        heartbeat: Duration::from_millis(args.heartbeat_ms.max(100)),
    };
    let layer = GatewayLayer {
        replica_id: replica_header,
        trust_forwarded_authority: args.trust_forwarded_authority,
        auth: Arc::new(Authenticator::new(
            &tokens,
            peer_token.as_ref().map(Secret::expose),
            args.dev,
            store.clone(),
            metrics.clone(),
        )),
        metrics: metrics.clone(),
    };
    // Relays carry bulk data: the HTTP/2 default window (64 KiB) throttles them.
    let mut builder = Server::builder()
        .initial_stream_window_size(Some(2 << 20))
        .initial_connection_window_size(Some(16 << 20))
        .max_frame_size(Some(H2_MAX_FRAME_SIZE))
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(args.max_streams_per_connection);
    if let Some(identity) = tls {
        builder = builder
            .tls_config(ServerTlsConfig::new().identity(identity))
            .context("TLS configuration")?;
    }
    let server_stop = CancellationToken::new();
    let peer_routes = |server| {
        let routes = RawRoutes::new(server, service.clone(), MAX_MESSAGE_BYTES);
        if args.no_peer_relay_frames {
            routes.without_peer_relay_frames()
        } else {
            routes
        }
    };
    let peer_routes = peer_routes(
        PeerServer::new(PeerService {
            sessions: sessions.clone(),
            delivery: delivery.clone(),
            config_notify: !args.no_peer_config_notify,
        })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES),
    );
    let router = builder
        .layer(layer)
        .add_service(RawRoutes::new(
            OpenShellServer::from_arc(service.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            service,
            MAX_MESSAGE_BYTES,
        ))
        .add_service(
            SupervisorHostServer::new(host_service)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(peer_routes);
    let serve_one = move |listener: TcpListener, stop: CancellationToken| {
        router
            .clone()
            .serve_with_incoming_shutdown(accept_nodelay(listener), stop.cancelled_owned())
    };
    let on_fence = {
        let (cluster, sessions, hosts, metrics) = (
            cluster.clone(),
            sessions.clone(),
            host_sessions.clone(),
            metrics.clone(),
        );
        move || {
            let Some(cluster) = &cluster else { return };
            let sent = sessions.hand_off_all(|sandbox_id| {
                let (owner, endpoint) = cluster.placement_before_fence(sandbox_id)?;
                Some(SessionRedirect {
                    peer_endpoint: endpoint,
                    owner_replica_id: owner,
                })
            });
            hosts.close_all();
            metrics
                .session_redirects
                .get_or_create(&crate::metrics::RedirectLabels { reason: "fenced" })
                .inc_by(sent as u64);
        }
    };
    let server = tokio::spawn(fence::serve(
        serve_one,
        listener,
        cluster.as_ref().map(|c| c.fenced()),
        on_fence,
        server_stop.clone(),
    ));
    let metrics_stop = CancellationToken::new();
    let ready = {
        let (cluster, sessions) = (cluster.clone(), sessions.clone());
        move || !sessions.is_shutting_down() && !cluster.as_ref().is_some_and(|c| c.is_fenced())
    };
    tokio::spawn(crate::metrics::serve(
        metrics_listener,
        metrics.clone(),
        ready,
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
            sessions.refuse_new();
            hand_off_hosts(cluster, &ring, &host_sessions, &store, &metrics).await;
            sessions.shutdown(|sandbox_id| {
                cluster
                    .placement(&ring, sandbox_id)
                    .map(|(owner, endpoint)| SessionRedirect {
                        peer_endpoint: endpoint,
                        owner_replica_id: owner,
                    })
            })
        }
        None => {
            sessions.refuse_new();
            host_sessions.begin_shutdown();
            host_sessions.close_all();
            sessions.shutdown(|_| None)
        }
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
    // SAFETY: getppid(2) has no preconditions.
    let orphaned = unsafe { libc::getppid() } != parent;
    if args.stop_sandboxes_on_exit || (args.stop_sandboxes_if_orphaned && orphaned) {
        if orphaned {
            tracing::info!(
                "the process that started this gateway is gone; stopping every supervisor"
            );
        }
        sandboxes.stop_all_supervisors().await;
    }
    server_stop.cancel();
    match tokio::time::timeout(Duration::from_secs(5), server).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::warn!(%err, "server task failed"),
        Err(_) => tracing::warn!("connections still open after 5 s; exiting anyway"),
    }
    metrics_stop.cancel();
    if let Some(dir) = &args.metrics_on_exit {
        let path = dir.join(format!("{}.metrics", args.replica_id));
        if let Err(err) = std::fs::write(&path, metrics.render()) {
            tracing::warn!(%err, path = %path.display(), "writing the final metrics");
        }
    }
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

/// How long a stopping replica spends placing its hosts elsewhere.
const HOST_HAND_OFF_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Ends every host session held here with a redirect, each placed like an
/// arriving host on the ring without this replica (`ring`): first below the
/// cap, each seated on its target in the store before the next is placed,
/// so the hosts handed off so far count.
async fn hand_off_hosts(
    cluster: &Cluster,
    ring: &crate::cluster::ring::Ring,
    hosts: &HostSessions,
    store: &Store,
    metrics: &Metrics,
) {
    let mut sent = 0u64;
    // Placing goes through the store, one host after another: past the
    // deadline the rest end without a redirect (they come back through the
    // shared address), so a slow store cannot hold the shutdown up.
    let deadline = tokio::time::Instant::now() + HOST_HAND_OFF_DEADLINE;
    for host_id in hosts.begin_shutdown() {
        let placed = tokio::time::timeout_at(
            deadline,
            store.place_host(&host_id, HOST_TTL, None, |seats| {
                crate::cluster::placement::place(ring, &host_id, seats)
            }),
        )
        .await;
        let redirect = match placed {
            Err(_) => {
                tracing::warn!(host_id, "no time left to place this host on shutdown");
                None
            }
            Ok(Ok(Some(target))) => {
                cluster
                    .endpoint_of(&target)
                    .map(|peer_endpoint| HostRedirect {
                        peer_endpoint,
                        replica_id: target,
                    })
            }
            Ok(Ok(None)) => None,
            Ok(Err(err)) => {
                tracing::warn!(host_id, %err, "placing a host on shutdown");
                None
            }
        };
        if hosts.end(&host_id, redirect) {
            sent += 1;
        }
    }
    hosts.close_all();
    metrics
        .session_redirects
        .get_or_create(&crate::metrics::RedirectLabels {
            reason: "host_shutdown",
        })
        .inc_by(sent);
    if sent > 0 {
        tracing::info!(
            sent,
            "redirected supervisor hosts to the remaining replicas"
        );
    }
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

/// The CA bundle peer channels trust: `--peer-ca`, else the supervisors' CA
/// (`--supervisor-ca`, else `--tls-cert`), else none (the system roots).
/// Checked here, so a wrong file stops the replica instead of every relay.
fn peer_ca(
    args: &ServeArgs,
    supervisor_ca: Option<&std::path::Path>,
) -> anyhow::Result<Option<Vec<u8>>> {
    let (flag, path) = match (&args.peer_ca, supervisor_ca) {
        (Some(path), _) => ("--peer-ca", path.as_path()),
        (None, Some(path)) if args.supervisor_ca.is_some() => ("--supervisor-ca", path),
        (None, Some(path)) => ("--tls-cert", path),
        (None, None) => return Ok(None),
    };
    let pem = std::fs::read(path).with_context(|| format!("reading {flag} {}", path.display()))?;
    let certificates = x509_parser::pem::Pem::iter_from_buffer(&pem)
        .take_while(Result::is_ok)
        .count();
    if certificates == 0 {
        bail!("{flag} {} holds no PEM certificate", path.display());
    }
    Ok(Some(pem))
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

/// A server certificate must be a leaf: clients and supervisors (rustls,
/// webpki) refuse a CA certificate presented by a server
/// (`CaUsedAsEndEntity`), so a gateway started with one would serve nobody
/// and its sandboxes would never leave PROVISIONING.
fn check_server_certificate(pem: &[u8]) -> anyhow::Result<()> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem)
        .map_err(|_| anyhow::anyhow!("holds no PEM certificate"))?;
    let cert = block
        .parse_x509()
        .map_err(|_| anyhow::anyhow!("the first certificate cannot be parsed"))?;
    if cert.is_ca() {
        bail!(
            "the first certificate is a CA certificate (basicConstraints CA:TRUE), which \
             clients refuse from a server. Make a CA and a server certificate signed by it, \
             for example: `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
             -nodes -keyout ca.key -out ca.pem -subj /CN=my-ca`, then `openssl req -newkey ec \
             -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key -out server.csr \
             -subj /CN=localhost` and `openssl x509 -req -in server.csr -CA ca.pem -CAkey \
             ca.key -out server.pem -days 365 -extfile <(printf \
             'subjectAltName=DNS:localhost,IP:127.0.0.1')`; serve with --tls-cert server.pem \
             --tls-key server.key and give clients and --supervisor-ca the CA (ca.pem)"
        );
    }
    Ok(())
}

/// Applies the store fault file (`--store-fault-file`) as it changes, every
/// 100 ms, for the life of the process; a missing or unreadable file is no
/// fault.
async fn follow_store_fault(
    file: std::path::PathBuf,
    fault: Arc<crate::store::StoreFault>,
    metrics: Arc<Metrics>,
) {
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    loop {
        ticks.tick().await;
        let wanted: serde_json::Value = std::fs::read_to_string(&file)
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
        let delay = Duration::from_millis(wanted["delay_ms"].as_u64().unwrap_or(0));
        let down = wanted["down"].as_bool().unwrap_or(false);
        if fault.delay() != delay || fault.down() != down {
            tracing::warn!(
                delay_ms = delay.as_millis() as u64,
                down,
                "test fault: the store is slowed or cut"
            );
        }
        fault.set(delay, down);
        metrics.store_fault_delay_ms.set(delay.as_millis() as i64);
        metrics.store_fault_down.set(i64::from(down));
    }
}

/// The limit defaults, and (process driver) which limits this host can
/// enforce, asked of the supervisor binary as isolation is.
fn limit_policy(args: &ServeArgs, supervisor_bin: &std::path::Path) -> anyhow::Result<LimitPolicy> {
    let defaults = default_limits(args);
    let available = match args.driver {
        DriverKind::Process => {
            let available = crate::sandboxes::limits::check_available(supervisor_bin)
                .map_err(|reason| anyhow::anyhow!("checking cgroup controllers: {reason}"))?;
            let names: Vec<&str> = available.iter().map(|r| r.name()).collect();
            tracing::info!(
                controllers = names.join(","),
                mode = ?args.resource_limits,
                "sandbox resource limits"
            );
            Some(available)
        }
        // A shared host enforces what its own cgroups allow.
        DriverKind::Hosts | DriverKind::None => None,
    };
    Ok(LimitPolicy {
        defaults,
        mode: args.resource_limits,
        available,
    })
}
