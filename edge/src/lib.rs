//! `openshell-gateway edge`: the local edge proxy in front of gateway replicas.
//!
//! An HTTP/2 (h2c, prior knowledge) reverse proxy for gRPC. A request that
//! names a replica in `x-openshell-replica` goes to that replica; one without
//! the header goes to any live replica (round robin, skipping replicas whose
//! connect failed a moment ago). The header only ever selects an entry of the
//! configured route map: the edge never dials an address taken from a request.
//!
//! Errors the edge produces itself are trailers-only gRPC answers and never
//! carry `x-openshell-served-by` (that header means "a replica answered"):
//!
//! | case | answer |
//! |---|---|
//! | header names no configured replica | NOT_FOUND "unknown replica" |
//! | the named replica cannot be reached | UNAVAILABLE with an empty message (the edge signature clients retry once without the header) |
//! | no header and no replica reachable | UNAVAILABLE "no healthy upstream" |
//! | the replica failed after the request was sent, before answering | UNAVAILABLE "upstream failed before response headers" (not retryable: the call may have run) |
//! | the peer service (`/openshell.peer.v1.*`) | PERMISSION_DENIED |
//!
//! Bodies stream both ways frame by frame (trailers included); dropping
//! either side resets the other. Routes come from `--replica ID=URL` and
//! `--routes-file` (re-read on SIGHUP).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use clap::Args;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::Code;

/// Request header naming the replica a call should be routed to.
pub const REPLICA_HEADER: &str = "x-openshell-replica";
/// Replica-to-replica service: never routed from outside.
const PEER_SERVICE_PREFIX: &str = "/openshell.peer.v1.";
/// HTTP/2 windows on both sides: the 64 KiB default throttles bulk forwards.
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;
const KEEPALIVE: Duration = Duration::from_secs(20);
/// How long open client connections may drain after SIGTERM.
const DRAIN: Duration = Duration::from_secs(5);
/// HTTP/2 connections per replica: another one is opened only when every
/// open one is at the replica's concurrent-stream limit (long-lived streams
/// such as supervisor sessions must not starve new calls).
const MAX_CONNECTIONS_PER_REPLICA: usize = 16;

type EdgeBody = UnsyncBoxBody<Bytes, hyper::Error>;
type ServerBuilder = hyper::server::conn::http2::Builder<TokioExecutor>;
type ClientBuilder = hyper::client::conn::http2::Builder<TokioExecutor>;

#[derive(Args, Debug)]
pub struct EdgeArgs {
    /// gRPC (h2c) listen address. Loopback only, unless --allow-public.
    #[arg(long, default_value = "127.0.0.1:17670")]
    listen: SocketAddr,
    /// Allow a non-loopback --listen. The edge authenticates nobody: every
    /// replica behind it must require authentication (no --dev).
    #[arg(long)]
    allow_public: bool,
    /// A replica route `ID=URL`, e.g. `gw-0=http://127.0.0.1:50061` (repeatable).
    #[arg(long = "replica", value_name = "ID=URL")]
    replicas: Vec<String>,
    /// JSON routes `{"replicas":{"gw-0":"http://127.0.0.1:50061",...}}`, re-read
    /// on SIGHUP. Its entries are added to (and override) the --replica ones.
    #[arg(long, value_name = "FILE")]
    routes_file: Option<PathBuf>,
    /// Write `{"url":..,"grpc":..,"metrics":..,"pid":..}` here once listening.
    #[arg(long, value_name = "PATH")]
    ready_file: Option<PathBuf>,
    /// Serve Prometheus `/metrics` on this address.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Give up connecting to a replica after this many milliseconds.
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    connect_timeout_ms: u64,
    /// Unrouted calls try a replica whose connect failed within this many
    /// milliseconds only after every other replica.
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    fail_timeout_ms: u64,
}

pub async fn run(args: EdgeArgs) -> anyhow::Result<()> {
    if !args.listen.ip().is_loopback() && !args.allow_public {
        bail!(
            "--listen {} is not a loopback address: the edge does no authentication of its own, \
             so pass --allow-public only when every replica behind it requires authentication \
             (none runs with --dev)",
            args.listen
        );
    }
    let cli_routes = args
        .replicas
        .iter()
        .map(|spec| parse_replica_arg(spec))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut seen = std::collections::HashSet::new();
    for (id, _) in &cli_routes {
        if !seen.insert(id.as_str()) {
            bail!("--replica {id} is given twice");
        }
    }
    if cli_routes.is_empty() && args.routes_file.is_none() {
        bail!("no replicas: pass --replica ID=URL (repeatable) or --routes-file FILE");
    }
    let routes = load_routes(&cli_routes, args.routes_file.as_deref())?;
    if routes.is_empty() {
        tracing::warn!("no replicas configured yet: every call answers UNAVAILABLE");
    }
    let edge = Arc::new(Edge::new(&args, cli_routes));
    edge.install(routes);

    // Handlers first: SIGHUP's default action would end the process, and a
    // test may send it as soon as the ready file appears.
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    {
        let edge = edge.clone();
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                edge.reload();
            }
        });
    }

    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    let stop = CancellationToken::new();
    let metrics_addr = match args.metrics_listen {
        Some(metrics_listen) => {
            let metrics_listener = TcpListener::bind(metrics_listen)
                .await
                .with_context(|| format!("binding {metrics_listen}"))?;
            let metrics_addr = metrics_listener.local_addr()?;
            tokio::spawn(serve_metrics(metrics_listener, edge.clone(), stop.clone()));
            Some(metrics_addr)
        }
        None => None,
    };

    if let Some(path) = &args.ready_file {
        let ready = serde_json::json!({
            "url": format!("http://{addr}"),
            "grpc": addr.to_string(),
            "metrics": metrics_addr.map(|a| a.to_string()),
            "pid": std::process::id(),
        });
        write_atomically(path, ready.to_string().as_bytes())?;
    }
    println!(
        "openshell-gateway edge serving http://{addr} -> {}",
        edge.routes().describe()
    );

    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if let Err(err) = stream.set_nodelay(true) {
                        tracing::debug!(%peer, %err, "TCP_NODELAY on an accepted socket");
                    }
                    connections.spawn(serve_connection(edge.clone(), stream, stop.clone()));
                }
                Err(err) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
        while connections.try_join_next().is_some() {}
    }
    tracing::info!("shutting down");
    drop(listener);
    stop.cancel();
    let drained = tokio::time::timeout(DRAIN, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!("client connections still open after {DRAIN:?}; exiting anyway");
    }
    Ok(())
}

async fn serve_connection(edge: Arc<Edge>, stream: TcpStream, stop: CancellationToken) {
    let server = edge.server.clone();
    let service = service_fn(move |req: Request<Incoming>| {
        let edge = edge.clone();
        async move { Ok::<_, Infallible>(edge.handle(req).await) }
    });
    let conn = server.serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(err) = result {
                tracing::debug!(%err, "client connection ended with an error");
            }
            return;
        }
        () = stop.cancelled() => {}
    }
    // GOAWAY: running streams finish, no new ones start.
    conn.as_mut().graceful_shutdown();
    if let Err(err) = conn.await {
        tracing::debug!(%err, "client connection ended with an error while draining");
    }
}

// ---------------------------------------------------------------------------
// Routes

/// Where a replica is reached: always taken from configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    host: String,
    port: u16,
    authority: Authority,
}

fn validate_id(id: &str) -> anyhow::Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 63
        && id.as_bytes()[0].is_ascii_alphanumeric()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !ok {
        bail!("invalid replica id {id:?}: use up to 63 letters, digits, '-', '_' or '.'");
    }
    Ok(())
}

fn parse_url(url: &str) -> anyhow::Result<Target> {
    let uri: Uri = url
        .parse()
        .with_context(|| format!("invalid replica URL {url:?}"))?;
    if uri.scheme() != Some(&Scheme::HTTP) {
        bail!("replica URL {url:?}: only http://host:port (h2c) is supported");
    }
    let authority = uri
        .authority()
        .with_context(|| format!("replica URL {url:?} has no host"))?
        .clone();
    if authority.as_str().contains('@') {
        bail!("replica URL {url:?} must not carry credentials");
    }
    let port = authority
        .port_u16()
        .with_context(|| format!("replica URL {url:?} needs an explicit port"))?;
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        bail!("replica URL {url:?} must not have a path or query");
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    if host.is_empty() {
        bail!("replica URL {url:?} has no host");
    }
    Ok(Target {
        host,
        port,
        authority,
    })
}

fn parse_replica_arg(spec: &str) -> anyhow::Result<(String, Target)> {
    let (id, url) = spec
        .split_once('=')
        .with_context(|| format!("--replica expects ID=URL, got {spec:?}"))?;
    validate_id(id)?;
    let target = parse_url(url).with_context(|| format!("--replica {id}"))?;
    Ok((id.to_owned(), target))
}

#[derive(serde::Deserialize)]
struct RoutesFile {
    replicas: BTreeMap<String, String>,
}

/// The command-line routes plus the routes file (which wins on the same id),
/// ordered by id.
fn load_routes(
    cli: &[(String, Target)],
    file: Option<&Path>,
) -> anyhow::Result<Vec<(String, Target)>> {
    let mut routes: BTreeMap<String, Target> = cli.iter().cloned().collect();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading routes file {}", path.display()))?;
        let parsed: RoutesFile = serde_json::from_str(&text)
            .with_context(|| format!("parsing routes file {}", path.display()))?;
        for (id, url) in parsed.replicas {
            validate_id(&id).with_context(|| format!("routes file {}", path.display()))?;
            let target = parse_url(&url)
                .with_context(|| format!("routes file {}: replica {id}", path.display()))?;
            routes.insert(id, target);
        }
    }
    Ok(routes.into_iter().collect())
}

/// One configured replica: its address, a small pool of HTTP/2 connections
/// (opened on demand, dropped when they close) and when a connect last failed.
struct Replica {
    id: String,
    target: Target,
    pool: tokio::sync::Mutex<Vec<Upstream>>,
    failed_at: Mutex<Option<Instant>>,
}

/// One HTTP/2 connection to a replica, the streams open on it, and the
/// replica's concurrent-stream limit (SETTINGS_MAX_CONCURRENT_STREAMS).
struct Upstream {
    sender: SendRequest<Incoming>,
    streams: Arc<AtomicUsize>,
    limit: Arc<AtomicUsize>,
}

impl Upstream {
    fn load(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    fn has_room(&self) -> bool {
        self.load() < self.limit.load(Ordering::Relaxed)
    }

    fn checkout(&self) -> (SendRequest<Incoming>, StreamSlot) {
        self.streams.fetch_add(1, Ordering::Relaxed);
        (
            self.sender.clone(),
            StreamSlot {
                streams: self.streams.clone(),
            },
        )
    }
}

/// Counts one stream on an upstream connection until dropped (with the
/// response body, or when the request fails).
struct StreamSlot {
    streams: Arc<AtomicUsize>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An upstream response body that keeps its stream counted while it lives.
struct CountedBody {
    inner: Incoming,
    _slot: StreamSlot,
}

impl http_body::Body for CountedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Replica {
    fn new(id: String, target: Target) -> Self {
        Self {
            id,
            target,
            pool: tokio::sync::Mutex::new(Vec::new()),
            failed_at: Mutex::new(None),
        }
    }

    fn recently_failed(&self, window: Duration) -> bool {
        self.failed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < window)
    }

    fn set_failed(&self, failed: bool) {
        *self
            .failed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = failed.then(Instant::now);
    }
}

struct Routes {
    list: Vec<Arc<Replica>>,
    by_id: HashMap<String, Arc<Replica>>,
}

impl Routes {
    fn describe(&self) -> String {
        if self.list.is_empty() {
            return "(no replicas)".into();
        }
        self.list
            .iter()
            .map(|r| format!("{}=http://{}", r.id, r.target.authority))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

// ---------------------------------------------------------------------------
// The proxy

enum Attempt {
    /// A response to relay (the upstream's, or an error the edge produced
    /// after the request had been handed to the replica).
    Answered(Response<EdgeBody>),
    /// The replica was not reached; the request (body untouched) comes back.
    NotSent(Request<Incoming>),
}

enum Hint {
    None,
    Replica(String),
    /// Present but not a printable string: matches no replica id.
    Invalid,
}

struct Edge {
    routes: RwLock<Arc<Routes>>,
    cli_routes: Vec<(String, Target)>,
    routes_file: Option<PathBuf>,
    next: AtomicUsize,
    connect_timeout: Duration,
    fail_timeout: Duration,
    server: ServerBuilder,
    client: ClientBuilder,
    metrics: Arc<EdgeMetrics>,
}

impl Edge {
    fn new(args: &EdgeArgs, cli_routes: Vec<(String, Target)>) -> Self {
        let mut server = ServerBuilder::new(TokioExecutor::new());
        server
            .timer(TokioTimer::new())
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .adaptive_window(false)
            // No per-connection stream limit, like the replicas behind it.
            .max_concurrent_streams(None)
            .keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE);
        let mut client = ClientBuilder::new(TokioExecutor::new());
        client
            .timer(TokioTimer::new())
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .adaptive_window(false)
            .keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE)
            .keep_alive_while_idle(true);
        Self {
            routes: RwLock::new(Arc::new(Routes {
                list: Vec::new(),
                by_id: HashMap::new(),
            })),
            cli_routes,
            routes_file: args.routes_file.clone(),
            next: AtomicUsize::new(0),
            connect_timeout: Duration::from_millis(args.connect_timeout_ms.max(1)),
            fail_timeout: Duration::from_millis(args.fail_timeout_ms),
            server,
            client,
            metrics: Arc::default(),
        }
    }

    fn routes(&self) -> Arc<Routes> {
        self.routes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the route map. A replica whose id and address are unchanged
    /// keeps its connection and failure state.
    fn install(&self, routes: Vec<(String, Target)>) {
        let mut current = self.routes.write().unwrap_or_else(PoisonError::into_inner);
        let list: Vec<Arc<Replica>> = routes
            .into_iter()
            .map(|(id, target)| match current.by_id.get(&id) {
                Some(existing) if existing.target == target => existing.clone(),
                _ => Arc::new(Replica::new(id, target)),
            })
            .collect();
        let by_id = list.iter().map(|r| (r.id.clone(), r.clone())).collect();
        *current = Arc::new(Routes { list, by_id });
    }

    fn reload(&self) {
        let Some(path) = &self.routes_file else {
            tracing::info!("SIGHUP without --routes-file: routes unchanged");
            self.metrics.reloads_ok.fetch_add(1, Ordering::Relaxed);
            return;
        };
        match load_routes(&self.cli_routes, Some(path)) {
            Ok(routes) => {
                self.install(routes);
                self.metrics.reloads_ok.fetch_add(1, Ordering::Relaxed);
                tracing::info!(routes = %self.routes().describe(), "routes reloaded");
            }
            Err(err) => {
                self.metrics.reloads_failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %format!("{err:#}"), "routes file rejected; keeping the previous routes");
            }
        }
    }

    async fn handle(&self, mut req: Request<Incoming>) -> Response<EdgeBody> {
        if req.uri().path().starts_with(PEER_SERVICE_PREFIX) {
            self.metrics.count(Route::Peer, Outcome::Denied);
            tracing::debug!(path = %req.uri().path(), "refused: peer service");
            return grpc_error(
                Code::PermissionDenied,
                "the peer service is not routed from outside",
            );
        }
        let hint = replica_hint(req.headers());
        strip_hop_by_hop(req.headers_mut(), true);
        let routes = self.routes();
        match hint {
            Hint::None => self.forward_any(&routes, req).await,
            Hint::Invalid => {
                self.metrics.count(Route::Hinted, Outcome::UnknownReplica);
                tracing::debug!(path = %req.uri().path(), "unknown replica (unprintable header)");
                grpc_error(Code::NotFound, "unknown replica")
            }
            Hint::Replica(id) => {
                let Some(replica) = routes.by_id.get(&id) else {
                    self.metrics.count(Route::Hinted, Outcome::UnknownReplica);
                    tracing::debug!(path = %req.uri().path(), replica = ?truncate(&id), "unknown replica");
                    return grpc_error(Code::NotFound, "unknown replica");
                };
                tracing::debug!(path = %req.uri().path(), replica = %replica.id, "routing by header");
                match self.attempt(replica, req, Route::Hinted).await {
                    Attempt::Answered(response) => response,
                    Attempt::NotSent(_) => {
                        self.metrics.count(Route::Hinted, Outcome::Unavailable);
                        tracing::debug!(replica = %replica.id, "replica unreachable");
                        // The empty message is the edge signature clients retry
                        // once without the header.
                        grpc_error(Code::Unavailable, "")
                    }
                }
            }
        }
    }

    /// Round robin over the replicas; those whose connect failed a moment
    /// ago go last. A replica that cannot be reached hands the untouched
    /// request on to the next one.
    async fn forward_any(&self, routes: &Routes, mut req: Request<Incoming>) -> Response<EdgeBody> {
        let count = routes.list.len();
        if count > 0 {
            let start = self.next.fetch_add(1, Ordering::Relaxed) % count;
            let (fresh, failed): (Vec<_>, Vec<_>) = (0..count)
                .map(|i| &routes.list[(start + i) % count])
                .partition(|r| !r.recently_failed(self.fail_timeout));
            for replica in fresh.into_iter().chain(failed) {
                tracing::debug!(path = %req.uri().path(), replica = %replica.id, "routing unhinted call");
                match self.attempt(replica, req, Route::Unhinted).await {
                    Attempt::Answered(response) => return response,
                    Attempt::NotSent(back) => {
                        tracing::debug!(replica = %replica.id, "replica unreachable; trying the next one");
                        req = back;
                    }
                }
            }
        }
        self.metrics.count(Route::Unhinted, Outcome::Unavailable);
        tracing::debug!(path = %req.uri().path(), "no replica reachable");
        grpc_error(Code::Unavailable, "no healthy upstream")
    }

    async fn attempt(
        &self,
        replica: &Replica,
        mut req: Request<Incoming>,
        route: Route,
    ) -> Attempt {
        // A cached connection can turn out to be closed when the request
        // reaches it; that (and only that) gets one fresh dial.
        for _ in 0..2 {
            let (mut sender, slot) = match self.checkout(replica).await {
                Ok(checked_out) => checked_out,
                Err(err) => {
                    tracing::debug!(replica = %replica.id, error = %format!("{err:#}"), "connect failed");
                    return Attempt::NotSent(req);
                }
            };
            *req.uri_mut() = upstream_uri(&replica.target.authority, req.uri());
            match sender.try_send_request(req).await {
                Ok(response) => {
                    self.metrics.count(route, Outcome::Forwarded);
                    return Attempt::Answered(relay(response, slot));
                }
                Err(mut err) => match err.take_message() {
                    Some(back) => {
                        tracing::debug!(replica = %replica.id, error = %err.error(), "connection closed before the request was sent");
                        replica
                            .pool
                            .lock()
                            .await
                            .retain(|u| !Arc::ptr_eq(&u.streams, &slot.streams));
                        req = back;
                    }
                    None => {
                        self.metrics.count(route, Outcome::UpstreamFailed);
                        tracing::debug!(replica = %replica.id, error = %err.error(), "upstream failed before response headers");
                        return Attempt::Answered(grpc_error(
                            Code::Unavailable,
                            "upstream failed before response headers",
                        ));
                    }
                },
            }
        }
        Attempt::NotSent(req)
    }

    /// A connection to the replica with room for one more stream: an open
    /// one, else a new one (up to MAX_CONNECTIONS_PER_REPLICA, after which the
    /// least loaded one queues the stream).
    async fn checkout(
        &self,
        replica: &Replica,
    ) -> anyhow::Result<(SendRequest<Incoming>, StreamSlot)> {
        let mut pool = replica.pool.lock().await;
        pool.retain(|u| !u.sender.is_closed());
        if let Some(upstream) = pool.iter().find(|u| u.has_room()) {
            return Ok(upstream.checkout());
        }
        let least_loaded =
            |pool: &[Upstream]| pool.iter().min_by_key(|u| u.load()).map(Upstream::checkout);
        if pool.len() >= MAX_CONNECTIONS_PER_REPLICA {
            return Ok(least_loaded(&pool).expect("the pool is full"));
        }
        let dialled = tokio::time::timeout(self.connect_timeout, self.dial(replica))
            .await
            .unwrap_or_else(|_| {
                Err(anyhow!(
                    "connect timed out after {:?}",
                    self.connect_timeout
                ))
            });
        match dialled {
            Ok((sender, limit)) => {
                replica.set_failed(false);
                let upstream = Upstream {
                    sender,
                    streams: Arc::new(AtomicUsize::new(0)),
                    limit,
                };
                let checked_out = upstream.checkout();
                pool.push(upstream);
                Ok(checked_out)
            }
            Err(err) => {
                replica.set_failed(true);
                self.metrics
                    .connect_failures
                    .fetch_add(1, Ordering::Relaxed);
                // Connections that are merely full still work: h2 queues.
                least_loaded(&pool).ok_or(err)
            }
        }
    }

    /// A new connection and its (live) concurrent-stream limit.
    async fn dial(
        &self,
        replica: &Replica,
    ) -> anyhow::Result<(SendRequest<Incoming>, Arc<AtomicUsize>)> {
        let target = &replica.target;
        let stream = TcpStream::connect((target.host.as_str(), target.port))
            .await
            .with_context(|| format!("connecting to {}", target.authority))?;
        stream.set_nodelay(true)?;
        let (sender, conn) = self
            .client
            .handshake(TokioIo::new(stream))
            .await
            .context("HTTP/2 handshake")?;
        let limit = Arc::new(AtomicUsize::new(conn.current_max_send_streams()));
        let id = replica.id.clone();
        let published = limit.clone();
        let metrics = self.metrics.clone();
        metrics.upstream_connections.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            // The limit arrives (and may change) in SETTINGS frames, which
            // only the connection task sees.
            let ended = std::future::poll_fn(|cx| {
                let poll = conn.as_mut().poll(cx);
                published.store(conn.current_max_send_streams(), Ordering::Relaxed);
                poll
            })
            .await;
            metrics.upstream_connections.fetch_sub(1, Ordering::Relaxed);
            if let Err(err) = ended {
                tracing::debug!(replica = %id, %err, "upstream connection ended with an error");
            }
        });
        tracing::debug!(replica = %replica.id, addr = %target.authority, "connected to replica");
        Ok((sender, limit))
    }
}

fn replica_hint(headers: &HeaderMap) -> Hint {
    match headers.get(REPLICA_HEADER) {
        None => Hint::None,
        Some(value) => match value.to_str() {
            Ok(text) if text.trim().is_empty() => Hint::None,
            Ok(text) => Hint::Replica(text.trim().to_owned()),
            Err(_) => Hint::Invalid,
        },
    }
}

/// A header value shown in a debug log, bounded.
fn truncate(text: &str) -> &str {
    match text.char_indices().nth(64) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

fn upstream_uri(authority: &Authority, uri: &Uri) -> Uri {
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(Scheme::HTTP);
    parts.authority = Some(authority.clone());
    parts.path_and_query = Some(
        uri.path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/")),
    );
    Uri::from_parts(parts).expect("scheme, authority and path make a valid URI")
}

/// Removes connection-level headers. Requests keep `te: trailers` (gRPC
/// needs it) and lose `host` (the upstream URI's authority replaces it).
fn strip_hop_by_hop(headers: &mut HeaderMap, request: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::TRAILER,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
    ] {
        headers.remove(name);
    }
    let trailers = headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("trailers"));
    headers.remove(header::TE);
    if request {
        headers.remove(header::HOST);
        if trailers {
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        }
    }
}

fn relay(response: Response<Incoming>, slot: StreamSlot) -> Response<EdgeBody> {
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    let body = CountedBody {
        inner: body,
        _slot: slot,
    };
    Response::from_parts(parts, body.boxed_unsync())
}

/// A trailers-only gRPC answer produced by the edge (no served-by header).
fn grpc_error(code: Code, message: &str) -> Response<EdgeBody> {
    let body = Empty::<Bytes>::new()
        .map_err(|never: Infallible| match never {})
        .boxed_unsync();
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from(code as i32));
    headers.insert(
        "grpc-message",
        HeaderValue::from_str(&percent_encode(message))
            .expect("percent-encoded text is a valid header value"),
    );
    response
}

/// grpc-message encoding: printable ASCII except '%' as is, the rest %XX.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn write_atomically(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Metrics (labels are bounded enums)

#[derive(Clone, Copy)]
enum Route {
    Hinted,
    Unhinted,
    Peer,
}

const ROUTE_NAMES: [&str; 3] = ["hinted", "unhinted", "peer"];

#[derive(Clone, Copy)]
enum Outcome {
    Forwarded,
    UnknownReplica,
    Unavailable,
    UpstreamFailed,
    Denied,
}

const OUTCOME_NAMES: [&str; 5] = [
    "forwarded",
    "unknown_replica",
    "unavailable",
    "upstream_failed",
    "denied",
];

#[derive(Default)]
struct EdgeMetrics {
    requests: [[AtomicU64; OUTCOME_NAMES.len()]; ROUTE_NAMES.len()],
    connect_failures: AtomicU64,
    upstream_connections: AtomicU64,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
}

impl EdgeMetrics {
    fn count(&self, route: Route, outcome: Outcome) {
        self.requests[route as usize][outcome as usize].fetch_add(1, Ordering::Relaxed);
    }
}

impl Edge {
    fn metrics_text(&self) -> String {
        use std::fmt::Write;
        let m = &self.metrics;
        let mut out = String::new();
        out.push_str(
            "# HELP openshell_edge_requests_total Calls seen by the edge, by route and outcome.\n\
             # TYPE openshell_edge_requests_total counter\n",
        );
        for (r, route) in ROUTE_NAMES.iter().enumerate() {
            for (o, outcome) in OUTCOME_NAMES.iter().enumerate() {
                let value = m.requests[r][o].load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "openshell_edge_requests_total{{route=\"{route}\",outcome=\"{outcome}\"}} {value}"
                );
            }
        }
        let _ = write!(
            out,
            "# HELP openshell_edge_connect_failures_total Failed connects to replicas.\n\
             # TYPE openshell_edge_connect_failures_total counter\n\
             openshell_edge_connect_failures_total {}\n\
             # HELP openshell_edge_route_reloads_total Route reloads on SIGHUP, by result.\n\
             # TYPE openshell_edge_route_reloads_total counter\n\
             openshell_edge_route_reloads_total{{result=\"ok\"}} {}\n\
             openshell_edge_route_reloads_total{{result=\"error\"}} {}\n\
             # HELP openshell_edge_replicas Replicas in the route map.\n\
             # TYPE openshell_edge_replicas gauge\n\
             openshell_edge_replicas {}\n\
             # HELP openshell_edge_upstream_connections Open HTTP/2 connections to replicas.\n\
             # TYPE openshell_edge_upstream_connections gauge\n\
             openshell_edge_upstream_connections {}\n",
            m.connect_failures.load(Ordering::Relaxed),
            m.reloads_ok.load(Ordering::Relaxed),
            m.reloads_failed.load(Ordering::Relaxed),
            self.routes().list.len(),
            m.upstream_connections.load(Ordering::Relaxed),
        );
        out
    }
}

async fn serve_metrics(listener: TcpListener, edge: Arc<Edge>, stop: CancellationToken) {
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    tracing::warn!(%err, "metrics accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let edge = edge.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let edge = edge.clone();
                async move {
                    let response = if req.uri().path() == "/metrics" {
                        Response::builder()
                            .header(header::CONTENT_TYPE, "text/plain; version=0.0.4")
                            .body(Full::new(Bytes::from(edge.metrics_text())))
                    } else {
                        Response::builder()
                            .status(StatusCode::NOT_FOUND)
                            .body(Full::new(Bytes::from_static(b"not found\n")))
                    };
                    Ok::<_, Infallible>(response.expect("static response parts"))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_urls_must_be_plain_http_host_port() {
        let t = parse_url("http://127.0.0.1:50061").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("127.0.0.1", 50061));
        let t = parse_url("http://[::1]:7/").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 7));
        for bad in [
            "https://127.0.0.1:1",
            "127.0.0.1:1",
            "http://127.0.0.1",
            "http://a@127.0.0.1:1",
            "http://127.0.0.1:1/x",
            "http://127.0.0.1:1/?q",
        ] {
            assert!(parse_url(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn replica_ids_are_short_names() {
        for good in ["gw-0", "openshell-2", "a", "r1.b_c"] {
            validate_id(good).unwrap();
        }
        for bad in ["", "-x", "127.0.0.1:1", "a b", "a/b", &"x".repeat(64)] {
            assert!(validate_id(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn hop_by_hop_headers_go_and_te_trailers_stays() {
        let mut headers = HeaderMap::new();
        headers.insert("te", HeaderValue::from_static("trailers"));
        headers.insert("connection", HeaderValue::from_static("x-private"));
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("1"));
        headers.insert("host", HeaderValue::from_static("edge"));
        headers.insert("authorization", HeaderValue::from_static("Bearer t"));
        headers.insert(REPLICA_HEADER, HeaderValue::from_static("gw-0"));
        strip_hop_by_hop(&mut headers, true);
        let mut names: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["authorization", "te", REPLICA_HEADER]);
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(percent_encode("unknown replica"), "unknown replica");
        assert_eq!(percent_encode("100% é"), "100%25 %C3%A9");
    }
}
