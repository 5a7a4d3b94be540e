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
//! **single unrouted retry**: only when the edge, not a gateway, produced the
//! failure. Every answer of the reference gateway, errors included, carries
//! `x-openshell-served-by`; a failure without it did not come from a
//! gateway. For gateways that never send it (the client has not seen it on
//! any answer yet), the known edge signatures decide: UNAVAILABLE with an
//! empty message, `no healthy upstream`, `connection failure`, or an HTTP
//! 502/503/504 answer without grpc-status (tonic reports it as INTERNAL with
//! the HTTP status in the message). A retry drops the cache entry. The raw
//! layer never retries after the stream delivered data, and never twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use openshell_proto::MethodInfo;
use prost_reflect::{DescriptorPool, DynamicMessage, Value};
use tokio::sync::OnceCell;
use tonic::Code;

pub use crate::config::RoutingConfig;
use crate::error::Error;
use crate::metadata::{Metadata, OWNER, REPLICA, SERVED_BY, WANT_OWNER};

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
    /// Hinted attempts that failed at the edge and were retried unhinted.
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
    /// Set once any answer carried `x-openshell-served-by`: from then on a
    /// failure without it is known to come from the edge.
    gateway_sends_served_by: AtomicBool,
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
            gateway_sends_served_by: AtomicBool::new(false),
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
    /// is set for the retry, which goes out without a hint.
    pub(crate) async fn route(
        &self,
        lookup: &dyn OwnerLookup,
        method: Option<&'static MethodInfo>,
        first_message: Option<&Bytes>,
        unrouted: bool,
    ) -> RouteDecision {
        let Some((method, field)) = method.and_then(|m| m.owner_routed_field.map(|f| (m, f)))
        else {
            return RouteDecision::default();
        };
        let sandbox = first_message.and_then(|bytes| sandbox_name(method, field, bytes));
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
    /// be retried once without a hint (the caller checks that no data was
    /// delivered and that it has not retried already).
    pub fn observe(&self, decision: &RouteDecision, outcome: Result<&Metadata, &Error>) -> bool {
        let served_by = match outcome {
            Ok(metadata) => metadata.get(SERVED_BY).is_some(),
            Err(err) => err.served_by().is_some(),
        };
        if served_by {
            self.gateway_sends_served_by.store(true, Ordering::Relaxed);
        }
        let Err(err) = outcome else { return false };
        if !decision.is_hinted() || served_by {
            return false;
        }
        let retry = if self.gateway_sends_served_by.load(Ordering::Relaxed) {
            edge_failure_code(err.grpc_code())
        } else {
            edge_signature(err)
        };
        if retry {
            if let Some(sandbox) = &decision.sandbox {
                self.forget(sandbox);
            }
            self.counters
                .unrouted_retries
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                replica = decision.hinted_replica.as_deref().unwrap_or_default(),
                code = err.code(),
                "edge could not route the hinted call; retrying once without the hint"
            );
        }
        retry
    }
}

/// Codes an edge answers with when it cannot route (the gateway's own
/// failures carry `x-openshell-served-by` and never get here).
fn edge_failure_code(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::NotFound | Code::Internal | Code::Unknown
    )
}

/// Edges that are known to answer routing failures this way.
fn edge_signature(err: &Error) -> bool {
    let Error::Rpc { code, message, .. } = err else {
        return false;
    };
    let lower = message.to_ascii_lowercase();
    match code {
        Code::Unavailable => {
            message.is_empty()
                || lower.contains("no healthy upstream")
                || lower.contains("connection failure")
        }
        Code::Internal | Code::Unknown => ["502", "503", "504"].iter().any(|status| {
            lower.contains(&format!("status: {status}"))
                || lower.contains(&format!("http status {status}"))
        }),
        _ => false,
    }
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
            payload: Some(tcp_forward_frame::Payload::Data(vec![1, 2])),
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

    #[test]
    fn gateway_failures_are_never_retried() {
        let router = Router::default();
        let err = rpc(
            Code::Unavailable,
            "supervisor session not connected",
            Some("gw-1"),
        );
        assert!(!router.observe(&hinted(), Err(&err)));
        let err = rpc(Code::Unavailable, "", Some("gw-1"));
        assert!(!router.observe(&hinted(), Err(&err)));
        // Unhinted calls are never retried either.
        let err = rpc(Code::Unavailable, "", None);
        assert!(!router.observe(&RouteDecision::default(), Err(&err)));
        assert_eq!(router.stats().unrouted_retries, 0);
    }

    #[test]
    fn edge_signatures_without_served_by() {
        let router = Router::default();
        for (code, message) in [
            (Code::Unavailable, ""),
            (
                Code::Unavailable,
                "upstream connect error: no healthy upstream",
            ),
            (Code::Unavailable, "connection failure"),
            (
                Code::Internal,
                "protocol error: invalid compression flag: 60 (valid flags are 0 and 1) while receiving response with status: 502 Bad Gateway",
            ),
        ] {
            assert!(
                router.observe(&hinted(), Err(&rpc(code, message, None))),
                "{message}"
            );
        }
        // Envoy's stream reset is not a routing failure.
        let reset = rpc(
            Code::Unavailable,
            "upstream reset: reset reason: connection termination",
            None,
        );
        assert!(!router.observe(&hinted(), Err(&reset)));
        assert_eq!(router.stats().unrouted_retries, 4);
    }

    #[test]
    fn once_served_by_is_seen_any_unstamped_failure_is_the_edge() {
        let router = Router::default();
        router.observe(
            &RouteDecision::default(),
            Ok(&Metadata::new().with(SERVED_BY, "gw-0")),
        );
        let unknown_replica = rpc(Code::NotFound, "unknown replica", None);
        assert!(router.observe(&hinted(), Err(&unknown_replica)));
        let unavailable = rpc(Code::Unavailable, "replica unavailable", None);
        assert!(router.observe(&hinted(), Err(&unavailable)));
        let invalid = rpc(Code::InvalidArgument, "bad", None);
        assert!(!router.observe(&hinted(), Err(&invalid)));
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
