//! Owner routing (ARCHITECTURE.md section 4): every owner-routed stream goes
//! straight to the replica that holds its sandbox's supervisor session.
//!
//! For each attempt of a call the raw layer asks [`Router::route`]. For a
//! method the contract marks `owner_routed` the router reads the sandbox name
//! from the first request message (the dotted field the generated method
//! table names), finds the sandbox's owner in a small, bounded, short-lived
//! cache, or else with `GetSandbox` carrying `x-openshell-want-owner: 1`
//! (answer in `x-openshell-owner`; concurrent streams for one sandbox share
//! one lookup), and hints the call with `x-openshell-replica: <owner>`. No
//! owner header (one replica, unknown owner, an older gateway) means no hint.
//!
//! [`Router::observe`] then decides whether a failed hinted attempt gets the
//! **single unrouted retry**. The rule is gRPC's transparent-retry rule:
//! retry only what never reached a server, so that no command runs twice.
//! A failure proves that no gateway saw the request only when it carries
//! the edge marker `x-openshell-edge: not-forwarded` (the built-in edge and
//! `deploy/nginx` set it when they never forwarded the request: no route,
//! connect refused or timed out) or is Envoy's `no healthy upstream` local
//! reply (gRPC `UNAVAILABLE` with that message, or HTTP 503 `text/plain`
//! with that body). Everything else, an empty `UNAVAILABLE`, an edge whose
//! upstream died after the request was sent, a proxy's HTML 502, any answer
//! carrying `x-openshell-served-by`, is surfaced to the caller. The table of
//! answers is in ARCHITECTURE.md section 4. Any failed hinted attempt that
//! no gateway stamped drops the sandbox's cache entry. The raw layer never
//! retries after the stream delivered data, and never twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use openshell_proto::MethodInfo;
use prost_reflect::{DescriptorPool, DynamicMessage, Value};
use tokio::sync::OnceCell;
use tonic::Code;

pub use crate::config::RoutingConfig;
use crate::error::{Error, proxy_answer_message};
use crate::metadata::{Metadata, OWNER, REPLICA, SERVED_BY, WANT_OWNER};

/// Response header an edge sets on answers it produced itself; the value
/// [`NOT_FORWARDED`] says the request was never forwarded to any gateway.
pub const EDGE: &str = "x-openshell-edge";
/// [`EDGE`] value: no byte of the request reached a gateway.
pub const NOT_FORWARDED: &str = "not-forwarded";
/// Envoy's local reply when no upstream host can be picked (nothing sent).
const ENVOY_NO_HEALTHY_UPSTREAM: &str = "no healthy upstream";

/// An owner lookup never holds a stream up for longer than this.
pub(crate) const LOOKUP_DEADLINE: Duration = Duration::from_secs(5);

/// Asks the gateway which replica owns a sandbox. The router decides *when*
/// to look an owner up; the call layer (`raw`) implements *how*, with a
/// `GetSandbox` carrying [`owner_lookup_metadata`] through the one call
/// path. Passing it in keeps this module below the call layer: routing
/// never makes a call itself.
pub(crate) trait OwnerLookup: Sync {
    /// The owner replica, `None` when the gateway names none.
    fn lookup_owner<'a>(&'a self, sandbox: &'a str)
    -> BoxFuture<'a, Result<Option<String>, Error>>;
}

/// Request metadata of an owner lookup (`x-openshell-want-owner: 1`).
pub(crate) fn owner_lookup_metadata() -> Metadata {
    Metadata::new().with(WANT_OWNER, "1")
}

/// The owner a lookup's answer names (`x-openshell-owner`), if any.
pub(crate) fn owner_from(metadata: &Metadata) -> Option<String> {
    metadata
        .get(OWNER)
        .filter(|o| !o.is_empty())
        .map(str::to_owned)
}

/// What the router decided for one attempt of one call.
#[derive(Debug, Clone, Default)]
pub struct RouteDecision {
    /// Metadata to add to the request (`x-openshell-replica`).
    pub metadata: Metadata,
    /// The replica the call was hinted to, if any.
    pub hinted_replica: Option<String>,
    /// The sandbox the call is for (owner-routed methods only).
    sandbox: Option<String>,
}

impl RouteDecision {
    /// Whether the attempt carries a replica hint.
    pub fn is_hinted(&self) -> bool {
        self.hinted_replica.is_some()
    }
}

/// Client-side routing counters, readable with
/// [`Client::routing_stats`](crate::Client::routing_stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoutingStats {
    /// Owner-routed attempts sent with a replica hint.
    pub hinted: u64,
    /// Owner-routed attempts sent without one (no owner known, routing off,
    /// or the unrouted retry).
    pub unhinted: u64,
    /// Hinted attempts that provably never reached a gateway and were
    /// retried unhinted.
    pub unrouted_retries: u64,
    /// `GetSandbox` owner lookups sent.
    pub owner_lookups: u64,
    /// Owner-routed attempts answered from the owner cache.
    pub cache_hits: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hinted: AtomicU64,
    unhinted: AtomicU64,
    unrouted_retries: AtomicU64,
    owner_lookups: AtomicU64,
    cache_hits: AtomicU64,
}

type Lookup = Arc<OnceCell<Option<String>>>;

/// The routing state of a client: owner cache, lookups in flight, counters.
#[derive(Debug)]
pub struct Router {
    config: RoutingConfig,
    cache: Mutex<HashMap<String, (Option<String>, Instant)>>,
    in_flight: Mutex<HashMap<String, Lookup>>,
    counters: Counters,
}

impl Default for Router {
    fn default() -> Self {
        Self::new(RoutingConfig::default())
    }
}

impl Router {
    /// A router with an empty owner cache.
    pub fn new(config: RoutingConfig) -> Self {
        Self {
            config,
            cache: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> RoutingStats {
        let c = &self.counters;
        RoutingStats {
            hinted: c.hinted.load(Ordering::Relaxed),
            unhinted: c.unhinted.load(Ordering::Relaxed),
            unrouted_retries: c.unrouted_retries.load(Ordering::Relaxed),
            owner_lookups: c.owner_lookups.load(Ordering::Relaxed),
            cache_hits: c.cache_hits.load(Ordering::Relaxed),
        }
    }

    /// Decides how to send one attempt of a call. `method` is `None` for a
    /// raw call to a path outside the generated method table; `unrouted`
    /// is set for the retry, which goes out without a hint. `owner_of`
    /// routes a call of a method that is not owner-routed to that
    /// sandbox's owner.
    pub(crate) async fn route(
        &self,
        lookup: &dyn OwnerLookup,
        method: Option<&'static MethodInfo>,
        first_message: Option<&Bytes>,
        unrouted: bool,
        owner_of: Option<&str>,
    ) -> RouteDecision {
        let sandbox = match owner_of {
            Some(sandbox) => Some(sandbox.to_owned()),
            None => {
                let Some((method, field)) =
                    method.and_then(|m| m.owner_routed_field.map(|f| (m, f)))
                else {
                    return RouteDecision::default();
                };
                first_message.and_then(|bytes| sandbox_name(method, field, bytes))
            }
        };
        let mut decision = RouteDecision {
            sandbox: sandbox.clone(),
            ..RouteDecision::default()
        };
        let owner = match (&sandbox, self.config.enabled && !unrouted) {
            (Some(sandbox), true) => self.owner(lookup, sandbox).await,
            _ => None,
        };
        match owner {
            Some(owner) => {
                self.counters.hinted.fetch_add(1, Ordering::Relaxed);
                decision.metadata.append(REPLICA, owner.clone());
                decision.hinted_replica = Some(owner);
            }
            None => {
                self.counters.unhinted.fetch_add(1, Ordering::Relaxed);
            }
        }
        decision
    }

    /// The sandbox's owner from the cache or one shared lookup.
    async fn owner(&self, lookup: &dyn OwnerLookup, sandbox: &str) -> Option<String> {
        if let Some(owner) = self.cached(sandbox) {
            self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
            return owner;
        }
        let shared = self
            .in_flight
            .lock()
            .unwrap()
            .entry(sandbox.to_owned())
            .or_default()
            .clone();
        let owner = shared
            .get_or_init(|| async {
                self.counters.owner_lookups.fetch_add(1, Ordering::Relaxed);
                let owner = lookup.lookup_owner(sandbox).await;
                if let Ok(owner) = &owner {
                    self.remember(sandbox, owner.clone());
                }
                owner.unwrap_or(None)
            })
            .await
            .clone();
        // Later streams read the cache; the next miss starts a new lookup.
        let mut in_flight = self.in_flight.lock().unwrap();
        if in_flight
            .get(sandbox)
            .is_some_and(|l| Arc::ptr_eq(l, &shared))
        {
            in_flight.remove(sandbox);
        }
        owner
    }

    /// `Some(owner or None)` for a fresh entry; `None` on a miss.
    fn cached(&self, sandbox: &str) -> Option<Option<String>> {
        let cache = self.cache.lock().unwrap();
        cache
            .get(sandbox)
            .filter(|(_, at)| at.elapsed() < self.config.cache_ttl)
            .map(|(owner, _)| owner.clone())
    }

    pub(crate) fn remember(&self, sandbox: &str, owner: Option<String>) {
        let mut cache = self.cache.lock().unwrap();
        if cache.len() >= self.config.cache_capacity && !cache.contains_key(sandbox) {
            let ttl = self.config.cache_ttl;
            cache.retain(|_, (_, at)| at.elapsed() < ttl);
            if cache.len() >= self.config.cache_capacity
                && let Some(oldest) = cache
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| k.clone())
            {
                cache.remove(&oldest);
            }
        }
        cache.insert(sandbox.to_owned(), (owner, Instant::now()));
    }

    /// Forgets a sandbox's owner (after a routing failure).
    pub fn forget(&self, sandbox: &str) {
        self.cache.lock().unwrap().remove(sandbox);
    }

    /// Learns from the outcome of an attempt. Returns whether the call should
    /// be retried once without a hint: only a hinted attempt whose failure
    /// proves that no gateway saw it (see [`never_forwarded`]). The caller
    /// checks that no data was delivered and that it has not retried already.
    pub fn observe(&self, decision: &RouteDecision, outcome: Result<&Metadata, &Error>) -> bool {
        let Err(err) = outcome else { return false };
        if !decision.is_hinted() || err.served_by().is_some() {
            return false;
        }
        // No gateway stamped the failure: the cached owner is suspect.
        if let Some(sandbox) = &decision.sandbox {
            self.forget(sandbox);
        }
        let Some(proof) = never_forwarded(err) else {
            tracing::debug!(
                replica = decision.hinted_replica.as_deref().unwrap_or_default(),
                code = err.code(),
                "hinted call failed outside a gateway; not retried: it may have reached one"
            );
            return false;
        };
        self.counters
            .unrouted_retries
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            replica = decision.hinted_replica.as_deref().unwrap_or_default(),
            code = err.code(),
            proof = proof.as_str(),
            "the edge never forwarded the hinted call; retrying once without the hint"
        );
        true
    }
}

/// Why a failed attempt is known never to have reached a gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NeverForwarded {
    /// `x-openshell-edge: not-forwarded` (built-in edge, `deploy/nginx`).
    EdgeMarker,
    /// Envoy's `no healthy upstream` local reply.
    EnvoyNoHealthyUpstream,
}

impl NeverForwarded {
    fn as_str(self) -> &'static str {
        match self {
            NeverForwarded::EdgeMarker => "edge marker",
            NeverForwarded::EnvoyNoHealthyUpstream => "envoy no healthy upstream",
        }
    }
}

/// The unrouted-retry classifier: `Some` only on proof that the request
/// never reached a gateway. Anything a gateway stamped, and anything that
/// may have been forwarded (an empty `UNAVAILABLE`, an upstream that failed
/// after the request was sent, a proxy's HTML 502), is `None`.
pub(crate) fn never_forwarded(err: &Error) -> Option<NeverForwarded> {
    let Error::Rpc {
        code,
        message,
        metadata,
    } = err
    else {
        return None;
    };
    if metadata.get(SERVED_BY).is_some() {
        return None;
    }
    let marked = metadata
        .iter()
        .any(|(k, v)| k == EDGE && v.trim().eq_ignore_ascii_case(NOT_FORWARDED));
    if marked {
        return Some(NeverForwarded::EdgeMarker);
    }
    // Envoy answers a gRPC request with a gRPC local reply, any other with
    // its plain-text page (which the call layer reports as a proxy answer).
    let envoy = *code == Code::Unavailable
        && (message == ENVOY_NO_HEALTHY_UPSTREAM
            || *message
                == proxy_answer_message(
                    http::StatusCode::SERVICE_UNAVAILABLE,
                    Some(ENVOY_NO_HEALTHY_UPSTREAM),
                ));
    envoy.then_some(NeverForwarded::EnvoyNoHealthyUpstream)
}

fn descriptors() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(openshell_proto::FILE_DESCRIPTOR_SET)
            .expect("the contract's descriptor set decodes")
    })
}

/// Reads the dotted string field naming the sandbox from an encoded request.
pub(crate) fn sandbox_name(method: &MethodInfo, field: &str, message: &Bytes) -> Option<String> {
    let descriptor = descriptors().get_message_by_name(method.request)?;
    let mut current = DynamicMessage::decode(descriptor, message.clone()).ok()?;
    let mut parts = field.split('.').peekable();
    while let Some(part) = parts.next() {
        let value = current.get_field_by_name(part)?.into_owned();
        match (value, parts.peek().is_some()) {
            (Value::Message(inner), true) => current = inner,
            (Value::String(name), false) => return (!name.is_empty()).then_some(name),
            _ => return None,
        }
    }
    None
}

/// The dotted request field that names the sandbox for an owner-routed
/// method path, from the generated method table.
pub fn owner_routed_field(path: &str) -> Option<&'static str> {
    openshell_proto::method(path).and_then(|m| m.owner_routed_field)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    const GET_SANDBOX: &str = "/openshell.v1.OpenShell/GetSandbox";

    #[test]
    fn owner_routed_fields_come_from_the_method_table() {
        assert_eq!(
            owner_routed_field("/openshell.v1.OpenShell/ExecSandbox"),
            Some("sandbox")
        );
        assert_eq!(
            owner_routed_field("/openshell.v1.OpenShell/ForwardTcp"),
            Some("init.sandbox")
        );
        assert_eq!(owner_routed_field(GET_SANDBOX), None);
        assert_eq!(owner_routed_field("/nope/Nope"), None);
    }

    #[test]
    fn sandbox_names_are_read_from_first_messages() {
        use openshell_proto::*;
        let exec = method("/openshell.v1.OpenShell/ExecSandbox").unwrap();
        let request = ExecSandboxRequest {
            sandbox: "box-1".into(),
            stdin: vec![7; 1000],
            ..Default::default()
        };
        let bytes = Bytes::from(request.encode_to_vec());
        assert_eq!(
            sandbox_name(exec, "sandbox", &bytes).as_deref(),
            Some("box-1")
        );

        let forward = method("/openshell.v1.OpenShell/ForwardTcp").unwrap();
        let frame = TcpForwardFrame {
            payload: Some(tcp_forward_frame::Payload::Init(TcpForwardInit {
                sandbox: "box-2".into(),
                ..Default::default()
            })),
        };
        let bytes = Bytes::from(frame.encode_to_vec());
        assert_eq!(
            sandbox_name(forward, "init.sandbox", &bytes).as_deref(),
            Some("box-2")
        );

        // A data frame first (not init): no sandbox, no hint.
        let data = TcpForwardFrame {
            payload: Some(tcp_forward_frame::Payload::Data(vec![1, 2].into())),
        };
        assert_eq!(
            sandbox_name(forward, "init.sandbox", &Bytes::from(data.encode_to_vec())),
            None
        );
        assert_eq!(
            sandbox_name(exec, "sandbox", &Bytes::from_static(b"\xff\xff")),
            None
        );
    }

    fn rpc(code: Code, message: &str, served_by: Option<&str>) -> Error {
        let mut metadata = Metadata::new();
        if let Some(replica) = served_by {
            metadata.append(SERVED_BY, replica);
        }
        Error::Rpc {
            code,
            message: message.into(),
            metadata,
        }
    }

    fn hinted() -> RouteDecision {
        RouteDecision {
            metadata: Metadata::new().with(REPLICA, "gw-1"),
            hinted_replica: Some("gw-1".into()),
            sandbox: Some("s".into()),
        }
    }

    fn marked(mut err: Error) -> Error {
        if let Error::Rpc { metadata, .. } = &mut err {
            metadata.append(EDGE, NOT_FORWARDED);
        }
        err
    }

    #[test]
    fn only_the_edge_marker_or_envoys_no_healthy_upstream_is_retried() {
        let router = Router::default();
        // The built-in edge and deploy/nginx: the marker, whatever the code.
        for (code, message) in [
            (Code::Unavailable, ""),
            (Code::Unavailable, "upstream timed out"),
            (Code::NotFound, "unknown replica"),
        ] {
            let err = marked(rpc(code, message, None));
            assert_eq!(never_forwarded(&err), Some(NeverForwarded::EdgeMarker));
            assert!(router.observe(&hinted(), Err(&err)), "{message}");
        }
        // Envoy's gRPC local reply.
        let envoy = rpc(Code::Unavailable, "no healthy upstream", None);
        assert_eq!(
            never_forwarded(&envoy),
            Some(NeverForwarded::EnvoyNoHealthyUpstream)
        );
        assert!(router.observe(&hinted(), Err(&envoy)));
        assert_eq!(router.stats().unrouted_retries, 4);
    }

    #[test]
    fn unmarked_failures_are_surfaced() {
        let router = Router::default();
        for (code, message) in [
            // Today's unmarked edge answers: an older edge, or nginx whose
            // upstream failed after the request went out.
            (Code::Unavailable, ""),
            // The built-in edge, forwarded and then failed.
            (Code::Unavailable, "upstream failed before response headers"),
            (Code::NotFound, "unknown replica"),
            // Envoy: the upstream connection broke, the request may be there.
            (
                Code::Unavailable,
                "upstream connect error or disconnect/reset before headers. reset reason: connection termination",
            ),
            (Code::Unavailable, "connection failure"),
            // A proxy's HTML 502 (see raw::proxy_answer).
            (
                Code::Unavailable,
                "a proxy answered HTTP 502 Bad Gateway instead of gRPC",
            ),
            (Code::Internal, "h2 protocol error"),
        ] {
            let err = rpc(code, message, None);
            assert_eq!(never_forwarded(&err), None, "{message}");
            assert!(!router.observe(&hinted(), Err(&err)), "{message}");
        }
        assert_eq!(router.stats().unrouted_retries, 0);
    }

    #[test]
    fn gateway_failures_are_never_retried() {
        let router = Router::default();
        let err = rpc(
            Code::Unavailable,
            "supervisor session not connected",
            Some("gw-1"),
        );
        assert!(!router.observe(&hinted(), Err(&err)));
        // A served-by outweighs a marker (a gateway did see the request).
        let err = marked(rpc(Code::Unavailable, "", Some("gw-1")));
        assert_eq!(never_forwarded(&err), None);
        assert!(!router.observe(&hinted(), Err(&err)));
        // Unhinted calls are never retried either.
        let err = marked(rpc(Code::Unavailable, "", None));
        assert!(!router.observe(&RouteDecision::default(), Err(&err)));
        // Nor local failures.
        let err = Error::Connect {
            message: "refused".into(),
        };
        assert!(!router.observe(&hinted(), Err(&err)));
        assert_eq!(router.stats().unrouted_retries, 0);
    }

    #[test]
    fn an_unstamped_failure_drops_the_cached_owner() {
        let router = Router::default();
        router.remember("s", Some("gw-1".into()));
        let stamped = rpc(Code::Unavailable, "busy", Some("gw-1"));
        router.observe(&hinted(), Err(&stamped));
        assert_eq!(router.cached("s"), Some(Some("gw-1".into())));
        let unstamped = rpc(Code::Unavailable, "", None);
        assert!(!router.observe(&hinted(), Err(&unstamped)));
        assert_eq!(router.cached("s"), None);
    }

    #[test]
    fn cache_is_bounded_and_expires() {
        let router = Router::new(RoutingConfig {
            enabled: true,
            cache_ttl: Duration::from_millis(50),
            cache_capacity: 3,
        });
        for i in 0..10 {
            router.remember(&format!("s{i}"), Some("gw-0".into()));
        }
        assert!(router.cache.lock().unwrap().len() <= 3);
        assert_eq!(router.cached("s9"), Some(Some("gw-0".into())));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(router.cached("s9"), None);
        router.remember("x", None);
        assert_eq!(router.cached("x"), Some(None));
        router.forget("x");
        assert_eq!(router.cached("x"), None);
    }
}
