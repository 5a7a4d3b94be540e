//! Where owner routing plugs in. **Placeholder**: today every call goes out
//! unrouted.
//!
//! Every call of the client, raw or curated, unary or stream, passes through
//! [`Router::route`] exactly once per attempt, just before its request
//! metadata is built, and reports its outcome to [`Router::observe`]. The
//! router sees the method's [`MethodInfo`] (so its
//! [`owner_routed_field`](MethodInfo::owner_routed_field)) and the first
//! request message, which names the sandbox for owner-routed methods
//! (`sandbox` of `ExecSandboxRequest`, `start.sandbox` of the first
//! `ExecSandboxInput`, `init.sandbox` of the first `TcpForwardFrame`).
//!
//! The owner-routing work adds here (ARCHITECTURE.md section 4):
//! - an owner cache (`GetSandbox` with `x-openshell-want-owner: 1`, answer in
//!   `x-openshell-owner`), small, bounded and short-lived;
//! - the replica hint `x-openshell-replica` on owner-routed streams;
//! - the single unrouted retry when the edge could not route a hinted call
//!   (no `x-openshell-served-by` on the failure), with the cache entry dropped;
//! - the `hinted` / `unhinted` / `unrouted_retry` counters.
//!
//! Nothing outside this module needs to change for that: callers already
//! hand over the method and first message and apply the returned metadata.

use bytes::Bytes;
use openshell_proto::MethodInfo;

use crate::error::Error;
use crate::metadata::Metadata;

/// What the router decided for one attempt of one call.
#[derive(Debug, Clone, Default)]
pub struct RouteDecision {
    /// Metadata to add to the request (for example `x-openshell-replica`).
    pub metadata: Metadata,
    /// The replica the call was hinted to, if any.
    pub hinted_replica: Option<String>,
}

/// The routing state of a client. Today it holds nothing.
#[derive(Debug, Default)]
pub struct Router {}

impl Router {
    /// A router with an empty owner cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decides how to send one attempt of a call. `method` is `None` for a
    /// raw call to a path outside the generated method table.
    pub fn route(
        &self,
        method: Option<&'static MethodInfo>,
        first_message: Option<&Bytes>,
    ) -> RouteDecision {
        let _ = (method, first_message);
        RouteDecision::default()
    }

    /// Learns from the outcome of an attempt (response metadata on success,
    /// the error on failure). Returns whether the call should be retried
    /// once without a hint; never true today.
    pub fn observe(&self, decision: &RouteDecision, outcome: Result<&Metadata, &Error>) -> bool {
        let _ = (decision, outcome);
        false
    }
}

/// The dotted request field that names the sandbox for an owner-routed
/// method path, from the generated method table.
pub fn owner_routed_field(path: &str) -> Option<&'static str> {
    openshell_proto::method(path).and_then(|m| m.owner_routed_field)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            owner_routed_field("/openshell.v1.OpenShell/GetSandbox"),
            None
        );
        assert_eq!(owner_routed_field("/nope/Nope"), None);
    }

    #[test]
    fn placeholder_routes_nothing() {
        let router = Router::new();
        let method = openshell_proto::method("/openshell.v1.OpenShell/ExecSandbox");
        let decision = router.route(method, Some(&Bytes::from_static(b"x")));
        assert!(decision.metadata.is_empty());
        assert!(decision.hinted_replica.is_none());
        assert!(!router.observe(&decision, Ok(&Metadata::new())));
    }
}
