//! The proxy itself: pick the replica a request names (or any live one),
//! forward it, stream both bodies, and answer gRPC errors of its own.

use crate::CONNECTION_WINDOW;
use crate::ClientBuilder;
use crate::EDGE_HEADER;
use crate::EdgeArgs;
use crate::EdgeBody;
use crate::KEEPALIVE;
use crate::MAX_CONNECTIONS_PER_REPLICA;
use crate::MAX_FRAME_SIZE;
use crate::NOT_FORWARDED;
use crate::PEER_SERVICE_PREFIX;
use crate::REPLICA_HEADER;
use crate::STREAM_WINDOW;
use crate::ServerBuilder;
use crate::metrics::EdgeMetrics;
use crate::metrics::Outcome;
use crate::metrics::Route;
use crate::routes::Target;
use crate::routes::load_routes;
use crate::upstream::CountedBody;
use crate::upstream::Replica;
use crate::upstream::Routes;
use crate::upstream::StreamSlot;
use crate::upstream::Upstream;
use std::collections::HashMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use anyhow::{Context, anyhow};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::Code;

/// HTTP/2 keepalive of connections to replicas (ping interval and answer
/// timeout): a replica cut off silently (its link, not its process) is
/// noticed within twice this, its connection dropped and dialled again,
/// instead of new calls waiting on it until TCP gives up.
const UPSTREAM_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(5);

pub(crate) enum Attempt {
    /// A response to relay (the upstream's, or an error the edge produced
    /// after the request had been handed to the replica).
    Answered(Response<EdgeBody>),
    /// The replica was not reached; the request (body untouched) comes back.
    NotSent(Request<Incoming>),
}

pub(crate) enum Hint {
    None,
    Replica(String),
    /// Present but not a printable string: matches no replica id.
    Invalid,
}

pub(crate) struct Edge {
    pub(crate) routes: RwLock<Arc<Routes>>,
    pub(crate) cli_routes: Vec<(String, Target)>,
    pub(crate) routes_file: Option<PathBuf>,
    pub(crate) next: AtomicUsize,
    pub(crate) connect_timeout: Duration,
    pub(crate) fail_timeout: Duration,
    pub(crate) server: ServerBuilder,
    pub(crate) client: ClientBuilder,
    /// Dials `https://` routes (`--upstream-ca`, else the system's roots).
    pub(crate) upstream_tls: TlsConnector,
    pub(crate) metrics: Arc<EdgeMetrics>,
}

impl Edge {
    pub(crate) fn new(
        args: &EdgeArgs,
        cli_routes: Vec<(String, Target)>,
        upstream_tls: TlsConnector,
    ) -> Self {
        let mut server = ServerBuilder::new(TokioExecutor::new());
        server
            .timer(TokioTimer::new())
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .adaptive_window(false)
            .max_frame_size(MAX_FRAME_SIZE)
            // One client connection cannot take unbounded streams (and the
            // memory behind them); the replicas bound theirs the same way.
            .max_concurrent_streams(args.max_streams_per_connection)
            .keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE);
        let mut client = ClientBuilder::new(TokioExecutor::new());
        client
            .timer(TokioTimer::new())
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .adaptive_window(false)
            .max_frame_size(MAX_FRAME_SIZE)
            .keep_alive_interval(UPSTREAM_KEEPALIVE)
            .keep_alive_timeout(UPSTREAM_KEEPALIVE)
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
            upstream_tls,
            metrics: Arc::default(),
        }
    }

    pub(crate) fn routes(&self) -> Arc<Routes> {
        self.routes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the route map. A replica whose id and address are unchanged
    /// keeps its connection and failure state.
    pub(crate) fn install(&self, routes: Vec<(String, Target)>) {
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

    pub(crate) fn reload(&self) {
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

    pub(crate) async fn handle(&self, mut req: Request<Incoming>) -> Response<EdgeBody> {
        if req.uri().path().starts_with(PEER_SERVICE_PREFIX) {
            self.metrics.count(Route::Peer, Outcome::Denied);
            tracing::debug!(path = %req.uri().path(), "refused: peer service");
            return not_forwarded(
                Code::PermissionDenied,
                "the peer service is not routed from outside",
            );
        }
        let hint = replica_hint(req.headers());
        set_forwarded_authority(&mut req);
        strip_hop_by_hop(req.headers_mut(), true);
        let routes = self.routes();
        match hint {
            Hint::None => self.forward_any(&routes, req).await,
            Hint::Invalid => {
                self.metrics.count(Route::Hinted, Outcome::UnknownReplica);
                tracing::debug!(path = %req.uri().path(), "unknown replica (unprintable header)");
                not_forwarded(Code::NotFound, "unknown replica")
            }
            Hint::Replica(id) => {
                let Some(replica) = routes.by_id.get(&id) else {
                    self.metrics.count(Route::Hinted, Outcome::UnknownReplica);
                    tracing::debug!(path = %req.uri().path(), replica = ?truncate(&id), "unknown replica");
                    return not_forwarded(Code::NotFound, "unknown replica");
                };
                // A replica whose connect timed out a moment ago, with no
                // connection open, is answered at once (never forwarded),
                // instead of each hinted call waiting out a connect timeout
                // while it is cut off; a dial keeps trying in the
                // background, and the first that succeeds ends this.
                if replica.unreachable(self.fail_timeout) {
                    drop(self.join_or_start_dial(replica));
                    self.metrics.count(Route::Hinted, Outcome::Unavailable);
                    tracing::debug!(replica = %replica.id, "replica unreachable (a connect timed out a moment ago)");
                    return not_forwarded(Code::Unavailable, "");
                }
                tracing::debug!(path = %req.uri().path(), replica = %replica.id, "routing by header");
                match self.attempt(replica, req, Route::Hinted).await {
                    Attempt::Answered(response) => response,
                    Attempt::NotSent(_) => {
                        self.metrics.count(Route::Hinted, Outcome::Unavailable);
                        tracing::debug!(replica = %replica.id, "replica unreachable");
                        // Never forwarded: clients may retry once without the
                        // header (the marker says so; the empty message is
                        // kept for clients that predate it).
                        not_forwarded(Code::Unavailable, "")
                    }
                }
            }
        }
    }

    /// Round robin over the replicas; those whose connect failed a moment
    /// ago go last. A replica that cannot be reached hands the untouched
    /// request on to the next one.
    pub(crate) async fn forward_any(
        &self,
        routes: &Routes,
        mut req: Request<Incoming>,
    ) -> Response<EdgeBody> {
        let count = routes.list.len();
        if count > 0 {
            let start = self.next.fetch_add(1, Ordering::Relaxed) % count;
            // Replicas whose connect failed a moment ago go last; before
            // them, those still waiting for a first connection, so an
            // unhinted call never waits on a replica that may not answer
            // while another one can take it now.
            let (failed, rest): (Vec<_>, Vec<_>) = (0..count)
                .map(|i| &routes.list[(start + i) % count])
                .partition(|r| r.recently_failed(self.fail_timeout));
            let (connecting, fresh): (Vec<_>, Vec<_>) =
                rest.into_iter().partition(|r| r.connecting());
            for replica in fresh.into_iter().chain(connecting).chain(failed) {
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
        not_forwarded(Code::Unavailable, "no healthy upstream")
    }

    pub(crate) async fn attempt(
        &self,
        replica: &Arc<Replica>,
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
            *req.uri_mut() = upstream_uri(&replica.target, req.uri());
            match sender.try_send_request(req).await {
                Ok(response) => {
                    self.metrics.count(route, Outcome::Forwarded);
                    return Attempt::Answered(relay(response, slot));
                }
                Err(mut err) => match err.take_message() {
                    Some(back) => {
                        tracing::debug!(replica = %replica.id, error = %err.error(), "connection closed before the request was sent");
                        replica
                            .pool()
                            .retain(|u| !Arc::ptr_eq(&u.streams, &slot.streams));
                        req = back;
                    }
                    None => {
                        self.metrics.count(route, Outcome::UpstreamFailed);
                        tracing::debug!(replica = %replica.id, error = %err.error(), "upstream failed before response headers");
                        // Forwarded: the call may have run, so no marker.
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
    /// least loaded one queues the stream). The pool is only locked to look
    /// and to count; dials run unlocked (see `upstream`).
    pub(crate) async fn checkout(
        &self,
        replica: &Arc<Replica>,
    ) -> anyhow::Result<(SendRequest<Incoming>, StreamSlot)> {
        let least_loaded =
            |pool: &[Upstream]| pool.iter().min_by_key(|u| u.load()).map(Upstream::checkout);
        // A new connection may be filled by other callers before this one
        // gets to it: a few rounds, then queue on the least loaded one.
        for _ in 0..3 {
            let mut dial = {
                let pool = replica.pool();
                if let Some(upstream) = pool.iter().find(|u| u.has_room()) {
                    return Ok(upstream.checkout());
                }
                if pool.len() >= MAX_CONNECTIONS_PER_REPLICA {
                    return Ok(least_loaded(&pool).expect("the pool is full"));
                }
                drop(pool);
                self.join_or_start_dial(replica)
            };
            let outcome = match dial.wait_for(Option::is_some).await {
                Ok(outcome) => outcome.clone().expect("waited for an outcome"),
                Err(_) => Err("the dial task ended without an outcome".to_owned()),
            };
            if let Err(err) = outcome {
                // Connections that are merely full still work: h2 queues.
                return least_loaded(&replica.pool()).ok_or_else(|| anyhow!(err));
            }
        }
        least_loaded(&replica.pool()).ok_or_else(|| anyhow!("every new connection closed"))
    }

    /// The dial in flight to the replica, or a new one in its own task: it
    /// adds the connection to the pool, records success or failure, and then
    /// publishes the outcome.
    fn join_or_start_dial(&self, replica: &Arc<Replica>) -> crate::upstream::DialOutcome {
        let mut dialing = replica
            .dialing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(outcome) = dialing.as_ref() {
            return outcome.clone();
        }
        let (publish, outcome) = tokio::sync::watch::channel(None);
        *dialing = Some(outcome.clone());
        drop(dialing);
        let replica = replica.clone();
        let client = self.client.clone();
        let tls = self.upstream_tls.clone();
        let metrics = self.metrics.clone();
        let timeout = self.connect_timeout;
        tokio::spawn(async move {
            let dialled =
                tokio::time::timeout(timeout, dial(&client, &tls, &metrics, &replica)).await;
            let timed_out = dialled.is_err();
            let dialled = dialled
                .unwrap_or_else(|_| Err(anyhow!("connect timed out after {timeout:?}").into()));
            let result = match dialled {
                Ok((sender, limit)) => {
                    replica.pool().push(Upstream {
                        sender,
                        streams: Arc::new(AtomicUsize::new(0)),
                        limit,
                    });
                    replica.set_dial_outcome(None);
                    replica.tls_failure_logged(None);
                    Ok(())
                }
                Err(err) => {
                    replica.set_dial_outcome(Some(timed_out));
                    metrics.connect_failures.fetch_add(1, Ordering::Relaxed);
                    let reason = format!("{:#}", err.error);
                    // A certificate that does not verify is configuration
                    // to fix: said at warn level, once per distinct reason.
                    if err.tls && replica.tls_failure_logged(Some(&reason)) {
                        tracing::warn!(
                            replica = %replica.id,
                            addr = %replica.target.authority,
                            error = %reason,
                            "TLS handshake with the replica failed; check --upstream-ca and the \
                             replica's certificate (its names must include the route's host)"
                        );
                    }
                    Err(reason)
                }
            };
            *replica
                .dialing
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
            publish.send_replace(Some(result));
        });
        outcome
    }
}

/// Why a dial failed, and whether it got as far as TLS (then the cause is
/// most likely a certificate, which the log should say once).
pub(crate) struct DialError {
    pub(crate) error: anyhow::Error,
    pub(crate) tls: bool,
}

impl From<anyhow::Error> for DialError {
    fn from(error: anyhow::Error) -> Self {
        Self { error, tls: false }
    }
}

/// A new connection to the replica (TLS for an `https://` route) and its
/// (live) concurrent-stream limit.
async fn dial(
    client: &ClientBuilder,
    tls: &TlsConnector,
    metrics: &Arc<EdgeMetrics>,
    replica: &Replica,
) -> Result<(SendRequest<Incoming>, Arc<AtomicUsize>), DialError> {
    let target = &replica.target;
    let stream = TcpStream::connect((target.host.as_str(), target.port))
        .await
        .with_context(|| format!("connecting to {}", target.authority))?;
    stream.set_nodelay(true).context("TCP_NODELAY")?;
    let Some(server_name) = &target.tls else {
        return Ok(handshake(client, metrics, replica, stream).await?);
    };
    let stream = tls
        .connect(server_name.clone(), stream)
        .await
        .map_err(|err| DialError {
            error: anyhow::Error::new(err)
                .context(format!("TLS handshake with {}", target.authority)),
            tls: true,
        })?;
    crate::tls::check_alpn(stream.get_ref().1.alpn_protocol()).map_err(|err| DialError {
        error: err.context(format!("TLS handshake with {}", target.authority)),
        tls: true,
    })?;
    Ok(handshake(client, metrics, replica, stream).await?)
}

/// HTTP/2 over an open connection; its driver runs in its own task.
async fn handshake<T>(
    client: &ClientBuilder,
    metrics: &Arc<EdgeMetrics>,
    replica: &Replica,
    stream: T,
) -> anyhow::Result<(SendRequest<Incoming>, Arc<AtomicUsize>)>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let target = &replica.target;
    let (sender, conn) = client
        .handshake(TokioIo::new(stream))
        .await
        .context("HTTP/2 handshake")?;
    let limit = Arc::new(AtomicUsize::new(conn.current_max_send_streams()));
    let id = replica.id.clone();
    let published = limit.clone();
    let metrics = metrics.clone();
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

pub(crate) fn replica_hint(headers: &HeaderMap) -> Hint {
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
pub(crate) fn truncate(text: &str) -> &str {
    match text.char_indices().nth(64) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

pub(crate) fn upstream_uri(target: &Target, uri: &Uri) -> Uri {
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(target.scheme());
    parts.authority = Some(target.authority.clone());
    parts.path_and_query = Some(
        uri.path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/")),
    );
    Uri::from_parts(parts).expect("scheme, authority and path make a valid URI")
}

/// Replaces any client-supplied `x-openshell-forwarded-authority` with the
/// authority the client addressed (`:authority`, else `host`), before the
/// upstream URI replaces it.
pub(crate) fn set_forwarded_authority<B>(req: &mut Request<B>) {
    let name = HeaderName::from_static(crate::FORWARDED_AUTHORITY_HEADER);
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned)
        })
        .and_then(|a| HeaderValue::from_str(&a).ok());
    let headers = req.headers_mut();
    headers.remove(&name);
    if let Some(authority) = authority {
        headers.insert(name, authority);
    }
}

/// Removes connection-level headers. Requests keep `te: trailers` (gRPC
/// needs it) and lose `host` (the upstream URI's authority replaces it).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap, request: bool) {
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

pub(crate) fn relay(response: Response<Incoming>, slot: StreamSlot) -> Response<EdgeBody> {
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    let body = CountedBody {
        inner: body,
        _slot: slot,
    };
    Response::from_parts(parts, body.boxed_unsync())
}

/// A trailers-only gRPC answer produced by the edge without forwarding the
/// request: no served-by header, and `x-openshell-edge: not-forwarded`, the
/// proof clients need before they send the call again.
pub(crate) fn not_forwarded(code: Code, message: &str) -> Response<EdgeBody> {
    let mut response = grpc_error(code, message);
    response.headers_mut().insert(
        HeaderName::from_static(EDGE_HEADER),
        HeaderValue::from_static(NOT_FORWARDED),
    );
    response
}

/// A trailers-only gRPC answer produced by the edge (no served-by header).
/// Without the marker of [`not_forwarded`]: the request may have reached a
/// replica.
pub(crate) fn grpc_error(code: Code, message: &str) -> Response<EdgeBody> {
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
pub(crate) fn percent_encode(text: &str) -> String {
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

pub(crate) fn write_atomically(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}
