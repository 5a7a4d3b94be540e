//! The edge's own metrics (labels are bounded enums) and their listener.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy)]
pub(crate) enum Route {
    Hinted,
    Unhinted,
    Peer,
}

pub(crate) const ROUTE_NAMES: [&str; 3] = ["hinted", "unhinted", "peer"];

#[derive(Clone, Copy)]
pub(crate) enum Outcome {
    Forwarded,
    UnknownReplica,
    Unavailable,
    UpstreamFailed,
    Denied,
}

pub(crate) const OUTCOME_NAMES: [&str; 5] = [
    "forwarded",
    "unknown_replica",
    "unavailable",
    "upstream_failed",
    "denied",
];

#[derive(Default)]
pub(crate) struct EdgeMetrics {
    pub(crate) requests: [[AtomicU64; OUTCOME_NAMES.len()]; ROUTE_NAMES.len()],
    pub(crate) connect_failures: AtomicU64,
    pub(crate) upstream_connections: AtomicU64,
    pub(crate) reloads_ok: AtomicU64,
    pub(crate) reloads_failed: AtomicU64,
}

impl EdgeMetrics {
    pub(crate) fn count(&self, route: Route, outcome: Outcome) {
        self.requests[route as usize][outcome as usize].fetch_add(1, Ordering::Relaxed);
    }
}

impl EdgeMetrics {
    /// The metrics in Prometheus text, with `replicas` in the route map.
    pub(crate) fn render(&self, replicas: usize) -> String {
        use std::fmt::Write;
        let m = self;
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
            replicas,
            m.upstream_connections.load(Ordering::Relaxed),
        );
        out
    }
}

/// What `/metrics` answers.
pub(crate) type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `GET /metrics`, and `/healthz` and `/readyz` for probes, until
/// `stop`.
pub(crate) async fn serve_metrics(listener: TcpListener, render: Render, stop: CancellationToken) {
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
        let render = render.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let render = render.clone();
                async move {
                    let response = if req.uri().path() == "/metrics" {
                        Response::builder()
                            .header(header::CONTENT_TYPE, "text/plain; version=0.0.4")
                            .body(Full::new(Bytes::from(render())))
                    } else if matches!(req.uri().path(), "/healthz" | "/readyz") {
                        // The edge keeps no state that could make it unready:
                        // serving this listener is being alive and ready.
                        Response::builder()
                            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
                            .body(Full::new(Bytes::from_static(b"ok\n")))
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
