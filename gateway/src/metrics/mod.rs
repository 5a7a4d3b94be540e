//! Prometheus metrics (text format on `/metrics` of the metrics listener).
//! Label values are bounded enums or method names, never sandbox ids.
//!
//! The lowest layer beside `store`: imports no other module. `config` holds
//! the push config delivery families.

pub mod config;

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// RPC name from the generated method table, or `unknown`.
    pub method: &'static str,
    /// snake_case gRPC code name, or "cancelled" for a call the client dropped.
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RelayLabels {
    /// exec or tcp.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RedirectLabels {
    /// connect, shutdown, rebalance (an idle session sent home to its
    /// ring owner), or fenced (this replica's membership lapsed).
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// relay (exec, interactive exec and forward streams).
    pub operation: &'static str,
    /// local (this replica holds the session) or peer (relayed to the owner).
    pub route: &'static str,
    /// exec or tcp.
    pub relay_kind: &'static str,
    /// success, local_error or remote_error.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLookupLabels {
    /// store (a query) or unknown_cache (a hash the store did not know a
    /// moment ago, answered from memory).
    pub source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IsolationLabels {
    /// namespaces or none.
    pub mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// memory, cpu or pids.
    pub resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLostLabels {
    /// restarted, waiting, error (the sandbox stays on its host) or
    /// adopted (a sandbox of the other driver).
    pub outcome: &'static str,
}

pub struct Metrics {
    registry: Registry,
    /// Sandboxes of lost supervisor hosts (and of another driver), by what
    /// became of them.
    pub host_lost: Family<HostLostLabels, Counter>,
    /// Sandboxes created without a limit they asked for (or the gateway's
    /// defaults set) because this host cannot enforce it
    /// (`--resource-limits auto`).
    pub limits_unenforced: Family<LimitLabels, Counter>,
    /// 1 for the isolation mode sandboxes get on this replica.
    pub isolation: Family<IsolationLabels, Gauge>,
    pub ring_members: Gauge,
    pub session_redirects: Family<RedirectLabels, Counter>,
    pub offring_admissions: Counter,
    pub routed_requests: Family<RouteLabels, Counter>,
    pub supervisor_sessions: Gauge,
    /// Supervisor host sessions held by this replica.
    pub supervisor_hosts: Gauge,
    /// Sandboxes assigned to the busiest host this replica holds.
    pub supervisor_host_instances_max: Gauge,
    pub requests: Family<RequestLabels, Counter>,
    pub relays_active: Family<RelayLabels, Gauge>,
    pub relays_opened: Family<RelayLabels, Counter>,
    pub token_lookups: Family<TokenLookupLabels, Counter>,
    /// Push config delivery (config_delivery.rs).
    pub config: config::ConfigMetrics,
    /// The injected store fault in force (`--store-fault-file`): its delay
    /// in milliseconds, and 1 while the store is cut.
    pub store_fault_delay_ms: Gauge,
    pub store_fault_down: Gauge,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::default();
        let supervisor_sessions = Gauge::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let relays_active = Family::<RelayLabels, Gauge>::default();
        let relays_opened = Family::<RelayLabels, Counter>::default();
        let ring_members = Gauge::default();
        let session_redirects = Family::<RedirectLabels, Counter>::default();
        let offring_admissions = Counter::default();
        let routed_requests = Family::<RouteLabels, Counter>::default();
        let isolation = Family::<IsolationLabels, Gauge>::default();
        let limits_unenforced = Family::<LimitLabels, Counter>::default();
        let host_lost = Family::<HostLostLabels, Counter>::default();
        registry.register(
            "openshell_server_sandboxes_host_lost",
            "Sandboxes whose supervisor host was lost (or that another driver started), by \
             outcome: restarted on a live host, waiting for one with room, error (kept on \
             the lost host) or adopted (the driver changed)",
            host_lost.clone(),
        );
        for outcome in ["restarted", "waiting", "error", "adopted"] {
            let _ = host_lost.get_or_create(&HostLostLabels { outcome });
        }
        registry.register(
            "openshell_server_sandbox_limits_unenforced",
            "Sandboxes created without a resource limit they asked for (or the defaults set) \
             because this host cannot enforce it, by resource (memory, cpu, pids)",
            limits_unenforced.clone(),
        );
        for resource in ["memory", "cpu", "pids"] {
            let _ = limits_unenforced.get_or_create(&LimitLabels { resource });
        }
        registry.register(
            "openshell_server_sandbox_isolation",
            "Isolation of sandbox processes on this replica: 1 for the mode in force \
             (namespaces, none)",
            isolation.clone(),
        );
        registry.register(
            "openshell_server_ring_members",
            "Live replicas on this replica's placement ring",
            ring_members.clone(),
        );
        registry.register(
            "openshell_server_session_redirects",
            "Redirects sent to supervisors, by reason (connect, shutdown, rebalance; \
             host_connect, host_shutdown for supervisor host sessions)",
            session_redirects.clone(),
        );
        registry.register(
            "openshell_server_session_offring_admissions",
            "Redirected supervisors admitted by a replica that is not their ring owner",
            offring_admissions.clone(),
        );
        registry.register(
            "openshell_server_routed_request_attempts",
            "Owner-routed stream attempts by route (local, peer), relay kind and outcome",
            routed_requests.clone(),
        );
        for reason in [
            "connect",
            "shutdown",
            "rebalance",
            "fenced",
            "host_connect",
            "host_shutdown",
        ] {
            let _ = session_redirects.get_or_create(&RedirectLabels { reason });
        }
        for route in ["local", "peer"] {
            for relay_kind in ["exec", "tcp"] {
                let _ = routed_requests.get_or_create(&RouteLabels {
                    operation: "relay",
                    route,
                    relay_kind,
                    outcome: "success",
                });
            }
        }
        registry.register(
            "openshell_server_supervisor_sessions",
            "Supervisor sessions held by this replica",
            supervisor_sessions.clone(),
        );
        let supervisor_hosts = Gauge::default();
        registry.register(
            "openshell_server_supervisor_hosts",
            "Supervisor host sessions held by this replica",
            supervisor_hosts.clone(),
        );
        let supervisor_host_instances_max = Gauge::default();
        registry.register(
            "openshell_server_supervisor_host_instances_max",
            "Sandboxes assigned to the busiest supervisor host this replica holds",
            supervisor_host_instances_max.clone(),
        );
        registry.register(
            "openshell_server_requests",
            "gRPC requests answered, by method and status code",
            requests.clone(),
        );
        registry.register(
            "openshell_server_relays_active",
            "Relays (exec, tcp) currently open to supervisors",
            relays_active.clone(),
        );
        registry.register(
            "openshell_server_relays_opened",
            "Relays (exec, tcp) opened to supervisors",
            relays_opened.clone(),
        );
        for kind in ["exec", "tcp"] {
            let _ = relays_active.get_or_create(&RelayLabels { kind });
            let _ = relays_opened.get_or_create(&RelayLabels { kind });
        }
        let token_lookups = Family::<TokenLookupLabels, Counter>::default();
        registry.register(
            "openshell_server_sandbox_token_lookups",
            "Sandbox token lookups by where the answer came from (store, unknown_cache)",
            token_lookups.clone(),
        );
        for source in ["store", "unknown_cache"] {
            let _ = token_lookups.get_or_create(&TokenLookupLabels { source });
        }
        let config = config::ConfigMetrics::register(&mut registry);
        let store_fault_delay_ms = Gauge::default();
        let store_fault_down = Gauge::default();
        registry.register(
            "openshell_store_fault_delay_ms",
            "Delay injected before every store call, in milliseconds (test fault)",
            store_fault_delay_ms.clone(),
        );
        registry.register(
            "openshell_store_fault_down",
            "1 while the store is cut by an injected fault (test fault)",
            store_fault_down.clone(),
        );
        Arc::new(Self {
            limits_unenforced,
            host_lost,
            store_fault_delay_ms,
            store_fault_down,
            registry,
            isolation,
            ring_members,
            session_redirects,
            offring_admissions,
            routed_requests,
            supervisor_sessions,
            supervisor_hosts,
            supervisor_host_instances_max,
            requests,
            relays_active,
            relays_opened,
            token_lookups,
            config,
        })
    }

    pub fn record_route(
        &self,
        route: &'static str,
        relay_kind: &'static str,
        outcome: &'static str,
    ) {
        self.routed_requests
            .get_or_create(&RouteLabels {
                operation: "relay",
                route,
                relay_kind,
                outcome,
            })
            .inc();
    }

    pub fn record_token_lookup(&self, source: &'static str) {
        self.token_lookups
            .get_or_create(&TokenLookupLabels { source })
            .inc();
    }

    /// Records the isolation mode in force.
    pub fn set_isolation(&self, mode: &'static str) {
        for other in ["namespaces", "none"] {
            let value = i64::from(other == mode);
            self.isolation
                .get_or_create(&IsolationLabels { mode: other })
                .set(value);
        }
    }

    pub fn record_request(&self, method: &'static str, code: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                method,
                code: code.to_owned(),
            })
            .inc();
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// snake_case name of a gRPC status code.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "ok",
        Cancelled => "cancelled",
        Unknown => "unknown",
        InvalidArgument => "invalid_argument",
        DeadlineExceeded => "deadline_exceeded",
        NotFound => "not_found",
        AlreadyExists => "already_exists",
        PermissionDenied => "permission_denied",
        ResourceExhausted => "resource_exhausted",
        FailedPrecondition => "failed_precondition",
        Aborted => "aborted",
        OutOfRange => "out_of_range",
        Unimplemented => "unimplemented",
        Internal => "internal",
        Unavailable => "unavailable",
        DataLoss => "data_loss",
        Unauthenticated => "unauthenticated",
    }
}

/// Serves over HTTP/1.1 until `stop` fires: `GET /metrics`; `/healthz`
/// (200 while the process serves this listener: liveness); `/readyz` (200
/// while `ready` says so, else 503: a fenced or stopping replica takes no
/// new calls).
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    ready: impl Fn() -> bool + Send + Sync + 'static,
    stop: CancellationToken,
) {
    let pages: Pages = Arc::new(move |path: &str| match path {
        "/metrics" => Some((200, PROMETHEUS_TEXT, metrics.render())),
        "/healthz" => Some((200, PLAIN_TEXT, "ok\n".into())),
        "/readyz" if ready() => Some((200, PLAIN_TEXT, "ready\n".into())),
        "/readyz" => Some((503, PLAIN_TEXT, "not ready\n".into())),
        _ => None,
    });
    serve_pages(listener, pages, stop).await
}

const PLAIN_TEXT: &str = "text/plain; charset=utf-8";

/// The content type of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a small read-only HTTP listener answers: for a path, its status,
/// content type and body; `None` is 404.
pub type Pages = Arc<dyn Fn(&str) -> Option<(u16, &'static str, String)> + Send + Sync>;

/// Serves `pages` to `GET`s over HTTP/1.1 until `stop` fires (the
/// replicas' metrics, `up`'s status and metrics).
pub async fn serve_pages(listener: TcpListener, pages: Pages, stop: CancellationToken) {
    loop {
        let (stream, _peer): (_, SocketAddr) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(err) => {
                    tracing::warn!(%err, "metrics listener accept failed");
                    continue;
                }
            },
        };
        let pages = pages.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let page = pages(req.uri().path());
                async move {
                    let response = match page {
                        Some((status, content_type, body)) => hyper::Response::builder()
                            .status(status)
                            .header("content-type", content_type)
                            .body(Full::new(Bytes::from(body))),
                        None => hyper::Response::builder()
                            .status(404)
                            .body(Full::new(Bytes::from_static(b"not found\n"))),
                    };
                    Ok::<_, http::Error>(response.expect("static response parts"))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
