//! `openshell-gateway edge`: the local edge proxy in front of gateway replicas.
//!
//! An HTTP/2 reverse proxy for gRPC: h2c (prior knowledge) or, with
//! `--tls-cert`/`--tls-key`, TLS with ALPN `h2`, on both sides; an
//! `https://` replica route is dialled with TLS verified against
//! `--upstream-ca` (else the system's roots). See `tls`. A request that
//! names a replica in `x-openshell-replica` goes to that replica; one without
//! the header goes to any live replica (round robin, skipping replicas whose
//! connect failed a moment ago). The header only ever selects an entry of the
//! configured route map: the edge never dials an address taken from a request.
//!
//! Errors the edge produces itself are trailers-only gRPC answers and never
//! carry `x-openshell-served-by` (that header means "a replica answered").
//! Those it answers without having forwarded the request carry
//! `x-openshell-edge: not-forwarded`: the proof a client needs before it
//! sends the call again (gRPC's transparent-retry rule, ARCHITECTURE.md
//! section 4). An answer without the marker may come after a replica got
//! the request.
//!
//! | case | answer | `x-openshell-edge` |
//! |---|---|---|
//! | header names no configured replica | NOT_FOUND "unknown replica" | `not-forwarded` |
//! | the named replica cannot be reached (connect refused or timed out, its TLS certificate did not verify, or its connection closed before the request was sent) | UNAVAILABLE with an empty message | `not-forwarded` |
//! | no header and no replica reachable | UNAVAILABLE "no healthy upstream" | `not-forwarded` |
//! | the replica failed after the request was sent, before answering | UNAVAILABLE "upstream failed before response headers" | absent (the call may have run) |
//! | the peer service (`/openshell.peer.v1.*`) | PERMISSION_DENIED | `not-forwarded` |
//!
//! Every forwarded request carries `x-openshell-forwarded-authority`: the
//! `:authority` (or `host`) the client sent, which the upstream URI
//! replaces. The edge drops any copy the client sent, so a replica that
//! trusts the header (`serve --trust-forwarded-authority`) learns the
//! address the client dialled.
//!
//! Bodies stream both ways frame by frame (trailers included); dropping
//! either side resets the other. Routes come from `--replica ID=URL` and
//! `--routes-file` (re-read on SIGHUP).

mod metrics;
mod proxy;
mod routes;
mod tls;
mod upstream;

use crate::metrics::serve_metrics;
use crate::proxy::Edge;
use crate::proxy::write_atomically;
use crate::routes::load_routes;
use crate::routes::parse_replica_arg;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;
use http::Request;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;

/// Request header naming the replica a call should be routed to.
pub const REPLICA_HEADER: &str = "x-openshell-replica";
/// Request header the edge sets to the authority the client addressed.
pub const FORWARDED_AUTHORITY_HEADER: &str = "x-openshell-forwarded-authority";
/// Response header on the edge's own answers; see [`NOT_FORWARDED`].
pub const EDGE_HEADER: &str = "x-openshell-edge";
/// [`EDGE_HEADER`] value: the edge never forwarded the request to a replica.
pub const NOT_FORWARDED: &str = "not-forwarded";
/// Replica-to-replica service: never routed from outside.
const PEER_SERVICE_PREFIX: &str = "/openshell.peer.v1.";
/// HTTP/2 windows on both sides: the 64 KiB default throttles bulk forwards.
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;
/// Largest HTTP/2 frame the edge accepts, from clients and from replicas.
/// A DATA frame is passed on as it arrived, so with the replicas' and the
/// SDK's same setting one 64 KiB gRPC data frame crosses every hop as one
/// HTTP/2 frame instead of five (the 16 KiB default).
const MAX_FRAME_SIZE: u32 = 256 * 1024;
const KEEPALIVE: Duration = Duration::from_secs(20);
/// How long a client may take over its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
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
    /// gRPC listen address (h2c, or TLS with --tls-cert). Loopback only,
    /// unless --allow-public.
    #[arg(long, default_value = "127.0.0.1:17670")]
    listen: SocketAddr,
    /// Allow a non-loopback --listen. The edge authenticates nobody: every
    /// replica behind it must require authentication (no --dev).
    #[arg(long)]
    allow_public: bool,
    /// Serve TLS (HTTP/2 by ALPN) to clients with this PEM certificate
    /// chain instead of h2c. Needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Verify `https://` replicas against the CA certificates in this PEM
    /// bundle instead of the system's roots.
    #[arg(long, value_name = "FILE")]
    upstream_ca: Option<PathBuf>,
    /// A replica route `ID=URL`, e.g. `gw-0=http://127.0.0.1:50061` (h2c)
    /// or `gw-0=https://gw-0.example:50061` (TLS) (repeatable).
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
    /// milliseconds only after every other replica; a hinted call to a
    /// replica whose connect timed out within it (and that has no open
    /// connection) is answered `not-forwarded` at once while a dial retries
    /// in the background.
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    fail_timeout_ms: u64,
    /// Concurrent HTTP/2 streams one client connection may open (further
    /// streams wait for a free slot on the client side).
    #[arg(long, default_value_t = 4096, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_streams_per_connection: u32,
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
    let (upstream_tls, trusted) = tls::upstream_config(args.upstream_ca.as_deref())?;
    if trusted == 0 && routes.iter().any(|(_, t)| t.tls.is_some()) {
        tracing::warn!(
            "no system root certificates found: https replicas will not verify (pass --upstream-ca)"
        );
    }
    let acceptor = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(TlsAcceptor::from(tls::serving_config(cert, key)?)),
        (None, None) => None,
        _ => bail!("--tls-cert and --tls-key go together"),
    };
    let edge = Arc::new(Edge::new(
        &args,
        cli_routes,
        TlsConnector::from(upstream_tls),
    ));
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
            let shown = edge.clone();
            let render: metrics::Render =
                Arc::new(move || shown.metrics.render(shown.routes().list.len()));
            tokio::spawn(serve_metrics(metrics_listener, render, stop.clone()));
            Some(metrics_addr)
        }
        None => None,
    };

    let scheme = if acceptor.is_some() { "https" } else { "http" };
    if let Some(path) = &args.ready_file {
        let ready = serde_json::json!({
            "url": format!("{scheme}://{addr}"),
            "grpc": addr.to_string(),
            "metrics": metrics_addr.map(|a| a.to_string()),
            "pid": std::process::id(),
        });
        write_atomically(path, ready.to_string().as_bytes())?;
    }
    println!(
        "openshell-gateway edge serving {scheme}://{addr} -> {}",
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
                    connections.spawn(accept_connection(
                        edge.clone(),
                        acceptor.clone(),
                        stream,
                        stop.clone(),
                    ));
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

/// A client connection: TLS first when the edge serves it, then HTTP/2.
async fn accept_connection(
    edge: Arc<Edge>,
    acceptor: Option<TlsAcceptor>,
    stream: TcpStream,
    stop: CancellationToken,
) {
    let Some(acceptor) = acceptor else {
        return serve_connection(edge, stream, stop).await;
    };
    let peer = stream.peer_addr().ok();
    let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream));
    let stream = tokio::select! {
        accepted = handshake => match accepted {
            Ok(Ok(stream)) => stream,
            Ok(Err(err)) => {
                tracing::debug!(?peer, %err, "client TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(?peer, "client TLS handshake timed out");
                return;
            }
        },
        () = stop.cancelled() => return,
    };
    if let Err(err) = tls::check_alpn(stream.get_ref().1.alpn_protocol()) {
        tracing::debug!(?peer, %err, "client connection refused");
        return;
    }
    serve_connection(edge, stream, stop).await;
}

async fn serve_connection<T>(edge: Arc<Edge>, stream: T, stop: CancellationToken)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
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

#[cfg(test)]
mod tests {
    use http::header::{HeaderMap, HeaderValue};

    use crate::REPLICA_HEADER;
    use crate::proxy::*;
    use crate::routes::*;

    #[test]
    fn replica_urls_are_http_or_https_host_port() {
        let t = parse_url("http://127.0.0.1:50061").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("127.0.0.1", 50061));
        assert!(t.tls.is_none());
        let t = parse_url("http://[::1]:7/").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 7));
        // https: the certificate must name the URL's host, IP or DNS name.
        let t = parse_url("https://127.0.0.1:50061").unwrap();
        assert_eq!(t.tls.unwrap().to_str(), "127.0.0.1");
        let t = parse_url("https://[::1]:7").unwrap();
        assert_eq!(t.tls.unwrap().to_str(), "::1");
        let t = parse_url("https://gw-0.example:443").unwrap();
        assert_eq!(t.tls.unwrap().to_str(), "gw-0.example");
        assert_ne!(
            parse_url("http://127.0.0.1:1").unwrap(),
            parse_url("https://127.0.0.1:1").unwrap(),
            "a scheme change is a new route"
        );
        for bad in [
            "ftp://127.0.0.1:1",
            "https://127.0.0.1",
            "https://bad_name!:1",
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
    fn the_forwarded_authority_is_the_edge_s_never_the_client_s() {
        let mut req = http::Request::builder()
            .uri("http://edge.example:8080/openshell.v1.OpenShell/Health")
            .header(crate::FORWARDED_AUTHORITY_HEADER, "evil.example:1")
            .body(())
            .unwrap();
        set_forwarded_authority(&mut req);
        let values: Vec<_> = req
            .headers()
            .get_all(crate::FORWARDED_AUTHORITY_HEADER)
            .iter()
            .collect();
        assert_eq!(values, ["edge.example:8080"]);
        // No authority at all: the client's copy still goes.
        let mut req = http::Request::builder()
            .uri("/openshell.v1.OpenShell/Health")
            .header(crate::FORWARDED_AUTHORITY_HEADER, "evil.example:1")
            .body(())
            .unwrap();
        set_forwarded_authority(&mut req);
        assert!(
            !req.headers()
                .contains_key(crate::FORWARDED_AUTHORITY_HEADER)
        );
    }

    #[test]
    fn only_answers_that_never_forwarded_carry_the_marker() {
        let marked = not_forwarded(tonic::Code::Unavailable, "");
        let headers = marked.headers();
        assert_eq!(headers["grpc-status"], "14");
        assert_eq!(headers["grpc-message"], "");
        assert_eq!(headers[crate::EDGE_HEADER], crate::NOT_FORWARDED);
        assert_eq!(headers["content-type"], "application/grpc");
        assert!(!headers.contains_key("x-openshell-served-by"));
        let forwarded = grpc_error(
            tonic::Code::Unavailable,
            "upstream failed before response headers",
        );
        assert!(!forwarded.headers().contains_key(crate::EDGE_HEADER));
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(percent_encode("unknown replica"), "unknown replica");
        assert_eq!(percent_encode("100% é"), "100%25 %C3%A9");
    }
}
