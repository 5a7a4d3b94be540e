//! Who is calling: user bearer tokens for the client API, per-sandbox tokens
//! for the supervisor API, host tokens for shared supervisor hosts. Tokens
//! are compared in constant time and never logged or echoed; sandbox and
//! host tokens are stored only as SHA-256 hashes.
//!
//! A host token (`osht_...`, `openshell-gateway host-token`) opens
//! `ConnectHost` as its own host and acts on the supervisor API
//! (`RelayStream`, `GetSandboxConfig`, `GetSandboxProviderEnvironment`) only
//! for sandboxes assigned to that host; the methods check the assignment.
//! It is no user token and no sandbox token: every other method refuses it.
//!
//! `ForwardTcp` alone may also be called without a bearer token: the caller
//! is then [`Principal::SshSessionOnly`], and the stream's `init` must carry
//! an SSH session token (`CreateSshSession`) for the sandbox it names; the
//! stream checks it (`api::streams`), since it is in the body, not the
//! metadata. Such a caller can do nothing else.
//!
//! Sandbox tokens are looked up in the store per request. Hashes the store
//! did not know are remembered for at most [`UNKNOWN_TOKEN_TTL`]
//! ([`UnknownTokens`]), so a caller repeating a bad token costs no store
//! query; the memory is forgotten whenever this replica writes a sandbox
//! token, so a fresh sandbox's supervisor is never turned away.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tonic::Status;

use crate::metrics::Metrics;
use crate::store::{Store, StoreError};

/// How long a token hash the store did not know is answered from memory.
pub const UNKNOWN_TOKEN_TTL: Duration = Duration::from_secs(2);
/// At most this many unknown hashes are remembered.
const UNKNOWN_TOKEN_CAP: usize = 4096;

/// The authenticated caller, attached to each request as an extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// A user holding a gateway token (or anyone in `--dev` mode).
    User,
    /// A supervisor holding the token of this sandbox id.
    Sandbox(String),
    /// A shared supervisor host holding the token of this host id.
    Host(String),
    /// Another replica of the cluster (peer service).
    Peer(String),
    /// No bearer token on a `ForwardTcp` call: allowed only with an SSH
    /// session token for the sandbox in the stream's `init`.
    SshSessionOnly,
    /// No credentials needed (Health).
    Anonymous,
}

/// What a method needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Public,
    User,
    /// A sandbox token, or a host token (the method checks the sandbox).
    Sandbox,
    /// A user token, a sandbox token or a host token (the method checks
    /// which sandbox).
    Dual,
    /// A host token only: `ConnectHost`.
    Host,
    Peer,
    /// A user token, or none at all (the method then requires an SSH
    /// session token in the request body): `ForwardTcp`.
    UserOrSshSession,
}

/// Paths outside the generated method table need a user token (tonic then
/// answers UNIMPLEMENTED): `/any.Service/Health` is not public.
pub fn access_for(path: &str) -> Access {
    if path.starts_with("/openshell.peer.v1.") {
        return Access::Peer;
    }
    let Some(method) = openshell_proto::method(path) else {
        return Access::User;
    };
    match method.name {
        "Health" => Access::Public,
        "ConnectSupervisor"
        | "RelayStream"
        | "GetSandboxProviderEnvironment"
        | "PushSandboxLogs" => Access::Sandbox,
        "GetSandboxConfig" => Access::Dual,
        "ConnectHost" => Access::Host,
        "ForwardTcp" => Access::UserOrSshSession,
        _ => Access::User,
    }
}

/// Sandbox token hashes the store answered "unknown" for, each for at most
/// [`UNKNOWN_TOKEN_TTL`], all valid only while the store's token write count
/// ([`Store::token_writes`]) stays what it was when they were looked up.
#[derive(Default)]
pub struct UnknownTokens {
    inner: Mutex<UnknownInner>,
}

#[derive(Default)]
struct UnknownInner {
    /// The token write count the entries belong to.
    writes: u64,
    entries: HashMap<[u8; 32], Instant>,
}

impl UnknownTokens {
    /// Whether `hash` was unknown less than the TTL ago and no token was
    /// written since (`writes` is the store's count now).
    pub fn contains(&self, hash: &[u8; 32], writes: u64) -> bool {
        let mut inner = self.inner.lock().expect("unknown tokens lock");
        if inner.writes != writes {
            inner.entries.clear();
            inner.writes = writes;
            return false;
        }
        match inner.entries.get(hash) {
            Some(at) if at.elapsed() < UNKNOWN_TOKEN_TTL => true,
            Some(_) => {
                inner.entries.remove(hash);
                false
            }
            None => false,
        }
    }

    /// Remembers `hash` as unknown, unless a token was written while it was
    /// looked up (`before` and `after`: the store's count around the query).
    pub fn remember(&self, hash: [u8; 32], before: u64, after: u64) {
        if before != after {
            return;
        }
        let mut inner = self.inner.lock().expect("unknown tokens lock");
        if inner.writes != after {
            inner.entries.clear();
            inner.writes = after;
        }
        if inner.entries.len() >= UNKNOWN_TOKEN_CAP {
            inner
                .entries
                .retain(|_, at| at.elapsed() < UNKNOWN_TOKEN_TTL);
            if inner.entries.len() >= UNKNOWN_TOKEN_CAP {
                // Full of fresh entries: start over rather than grow.
                inner.entries.clear();
            }
        }
        inner.entries.insert(hash, Instant::now());
    }
}

pub struct Authenticator {
    user_token_hashes: Vec<[u8; 32]>,
    peer_token_hash: Option<[u8; 32]>,
    dev: bool,
    store: Store,
    unknown: UnknownTokens,
    metrics: Arc<Metrics>,
}

impl Authenticator {
    pub fn new(
        user_tokens: &[String],
        peer_token: Option<&str>,
        dev: bool,
        store: Store,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            user_token_hashes: user_tokens.iter().map(|t| sha256(t.as_bytes())).collect(),
            peer_token_hash: peer_token.map(|t| sha256(t.as_bytes())),
            dev,
            store,
            unknown: UnknownTokens::default(),
            metrics,
        }
    }

    /// The sandbox (or, for an `osht_` token, the host) a token belongs
    /// to: from the negative cache when it was unknown a moment ago, else
    /// from the store.
    async fn supervisor_for_token(&self, token: &[u8]) -> Result<Option<Principal>, Status> {
        let hash = sha256(token);
        let is_host = token.starts_with(HOST_TOKEN_PREFIX.as_bytes());
        let before = self.store.token_writes();
        if self.unknown.contains(&hash, before) {
            self.metrics.record_token_lookup("unknown_cache");
            return Ok(None);
        }
        self.metrics.record_token_lookup("store");
        let found = if is_host {
            self.store
                .host_for_token(&hex::encode(hash))
                .await
                .map(|id| id.map(Principal::Host))
        } else {
            self.store
                .sandbox_for_token(&hex::encode(hash))
                .await
                .map(|id| id.map(Principal::Sandbox))
        };
        match found {
            Ok(Some(principal)) => Ok(Some(principal)),
            Ok(None) => {
                self.unknown
                    .remember(hash, before, self.store.token_writes());
                Ok(None)
            }
            Err(err @ StoreError::TimedOut { .. }) => {
                tracing::error!(%err, "supervisor token lookup failed");
                Err(Status::unavailable(format!("credential lookup: {err}")))
            }
            Err(err) => {
                tracing::error!(%err, "supervisor token lookup failed");
                Err(Status::unavailable("credential store unavailable"))
            }
        }
    }

    pub async fn authenticate(
        &self,
        access: Access,
        authorization: Option<&[u8]>,
        peer_replica: Option<&[u8]>,
    ) -> Result<Principal, Status> {
        if access == Access::Public {
            return Ok(Principal::Anonymous);
        }
        let token = authorization.and_then(bearer);
        match access {
            Access::Public => unreachable!(),
            Access::UserOrSshSession if self.dev => Ok(Principal::User),
            Access::UserOrSshSession if token.is_none() => Ok(Principal::SshSessionOnly),
            Access::User | Access::UserOrSshSession => {
                if self.dev {
                    return Ok(Principal::User);
                }
                let token = token.ok_or_else(|| {
                    Status::unauthenticated("missing bearer token (authorization: Bearer <token>)")
                })?;
                let hash = sha256(token);
                // Check every entry so timing does not depend on which matched.
                let matched = self
                    .user_token_hashes
                    .iter()
                    .fold(false, |acc, known| acc | constant_time_eq(known, &hash));
                if matched {
                    Ok(Principal::User)
                } else {
                    Err(Status::unauthenticated("invalid bearer token"))
                }
            }
            Access::Peer => {
                let Some(expected) = &self.peer_token_hash else {
                    return Err(Status::permission_denied(
                        "this replica has no peer service",
                    ));
                };
                let token = token.ok_or_else(|| Status::unauthenticated("missing peer token"))?;
                if !constant_time_eq(expected, &sha256(token)) {
                    return Err(Status::unauthenticated("invalid peer token"));
                }
                let replica = peer_replica
                    .and_then(|r| std::str::from_utf8(r).ok())
                    .filter(|r| !r.is_empty())
                    .ok_or_else(|| {
                        Status::invalid_argument("x-openshell-peer-replica is required")
                    })?;
                Ok(Principal::Peer(replica.to_owned()))
            }
            Access::Dual => {
                if self.dev {
                    return Ok(Principal::User);
                }
                let token = token.ok_or_else(|| {
                    Status::unauthenticated("missing bearer token (authorization: Bearer <token>)")
                })?;
                let hash = sha256(token);
                let user = self
                    .user_token_hashes
                    .iter()
                    .fold(false, |acc, known| acc | constant_time_eq(known, &hash));
                if user {
                    return Ok(Principal::User);
                }
                match self.supervisor_for_token(token).await? {
                    Some(principal) => Ok(principal),
                    None => Err(Status::unauthenticated("invalid bearer token")),
                }
            }
            Access::Sandbox => {
                let token =
                    token.ok_or_else(|| Status::unauthenticated("missing sandbox token"))?;
                match self.supervisor_for_token(token).await? {
                    Some(principal) => Ok(principal),
                    None => Err(Status::unauthenticated("invalid sandbox token")),
                }
            }
            Access::Host => {
                let token = token.ok_or_else(|| Status::unauthenticated("missing host token"))?;
                // A sandbox token (or anything else) is no host token.
                match self.supervisor_for_token(token).await? {
                    Some(principal @ Principal::Host(_)) => Ok(principal),
                    _ => Err(Status::unauthenticated("invalid host token")),
                }
            }
        }
    }
}

fn bearer(value: &[u8]) -> Option<&[u8]> {
    let rest = value
        .strip_prefix(b"Bearer ")
        .or_else(|| value.strip_prefix(b"bearer "))?;
    let rest = rest.trim_ascii();
    (!rest.is_empty()).then_some(rest)
}

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A new SSH session token (a random UUIDv4, as the public protocol's
/// clients expect) and the hash the store keeps.
pub fn new_ssh_session_token() -> (String, String) {
    let token = uuid::Uuid::new_v4().to_string();
    let hash = ssh_session_hash(&token);
    (token, hash)
}

/// The hash an SSH session token is stored and looked up by.
pub fn ssh_session_hash(token: &str) -> String {
    hex::encode(sha256(token.as_bytes()))
}

/// What every host token starts with (sandbox tokens start with `ossb_`).
pub const HOST_TOKEN_PREFIX: &str = "osht_";

/// A new random host token and the hash the store keeps.
pub fn new_host_token() -> (String, String) {
    let bytes: [u8; 32] = rand::random();
    let token = format!("{HOST_TOKEN_PREFIX}{}", hex::encode(bytes));
    let hash = hex::encode(sha256(token.as_bytes()));
    (token, hash)
}

/// A new random sandbox token and the hash the store keeps.
pub fn new_sandbox_token() -> (String, String) {
    let bytes: [u8; 32] = rand::random();
    let token = format!("ossb_{}", hex::encode(bytes));
    let hash = hex::encode(sha256(token.as_bytes()));
    (token, hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_tokens_are_forgotten_after_a_token_write() {
        let unknown = UnknownTokens::default();
        let hash = sha256(b"ossb_never_issued");
        assert!(!unknown.contains(&hash, 0));
        unknown.remember(hash, 0, 0);
        assert!(unknown.contains(&hash, 0));
        // A token was written: everything remembered is stale.
        assert!(!unknown.contains(&hash, 1));
        assert!(!unknown.contains(&hash, 1));
        // A write during the lookup: the answer is not remembered.
        unknown.remember(hash, 1, 2);
        assert!(!unknown.contains(&hash, 2));
    }

    #[test]
    fn unknown_tokens_stay_bounded() {
        let unknown = UnknownTokens::default();
        for n in 0..(UNKNOWN_TOKEN_CAP as u32 + 10) {
            unknown.remember(sha256(&n.to_be_bytes()), 0, 0);
        }
        let len = unknown.inner.lock().unwrap().entries.len();
        assert!(len <= UNKNOWN_TOKEN_CAP, "{len} entries");
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Basic abc"), None);
    }

    #[test]
    fn access_classes() {
        assert_eq!(access_for("/openshell.v1.OpenShell/Health"), Access::Public);
        assert_eq!(access_for("/made.Up/Health"), Access::User);
        assert_eq!(
            access_for("/openshell.v1.OpenShell/RelayStream"),
            Access::Sandbox
        );
        assert_eq!(
            access_for("/openshell.v1.OpenShell/ExecSandbox"),
            Access::User
        );
        assert_eq!(
            access_for("/openshell.v1.OpenShell/GetSandboxConfig"),
            Access::Dual
        );
        assert_eq!(
            access_for("/openshell.v1.OpenShell/GetSandboxProviderEnvironment"),
            Access::Sandbox
        );
        assert_eq!(
            access_for("/openshell.v1.OpenShell/UpdateConfig"),
            Access::User
        );
        assert_eq!(
            access_for("/openshell.supervisor_host.v1.SupervisorHost/ConnectHost"),
            Access::Host
        );
        assert_eq!(
            access_for("/openshell.v1.OpenShell/ForwardTcp"),
            Access::UserOrSshSession
        );
        assert_eq!(
            access_for("/openshell.v1.OpenShell/CreateSshSession"),
            Access::User
        );
        assert_eq!(
            access_for("/openshell.v1.OpenShell/RevokeSshSession"),
            Access::User
        );
    }
}
