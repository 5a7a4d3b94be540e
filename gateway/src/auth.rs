//! Who is calling: user bearer tokens for the client API, per-sandbox tokens
//! for the supervisor API. Tokens are compared in constant time and never
//! logged or echoed; sandbox tokens are stored only as SHA-256 hashes.

use sha2::{Digest, Sha256};
use tonic::Status;

use crate::store::Store;

/// The authenticated caller, attached to each request as an extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// A user holding a gateway token (or anyone in `--dev` mode).
    User,
    /// A supervisor holding the token of this sandbox id.
    Sandbox(String),
    /// Another replica of the cluster (peer service).
    Peer(String),
    /// No credentials needed (Health).
    Anonymous,
}

/// What a method needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Public,
    User,
    Sandbox,
    /// A user token, or a sandbox token (the method checks which sandbox).
    Dual,
    Peer,
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
        "ConnectSupervisor" | "RelayStream" | "GetSandboxProviderEnvironment" => Access::Sandbox,
        "GetSandboxConfig" => Access::Dual,
        _ => Access::User,
    }
}

pub struct Authenticator {
    user_token_hashes: Vec<[u8; 32]>,
    peer_token_hash: Option<[u8; 32]>,
    dev: bool,
    store: Store,
}

impl Authenticator {
    pub fn new(user_tokens: &[String], peer_token: Option<&str>, dev: bool, store: Store) -> Self {
        Self {
            user_token_hashes: user_tokens.iter().map(|t| sha256(t.as_bytes())).collect(),
            peer_token_hash: peer_token.map(|t| sha256(t.as_bytes())),
            dev,
            store,
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
            Access::User => {
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
                match self.store.sandbox_for_token(&hex::encode(hash)).await {
                    Ok(Some(id)) => Ok(Principal::Sandbox(id)),
                    Ok(None) => Err(Status::unauthenticated("invalid bearer token")),
                    Err(err) => {
                        tracing::error!(%err, "sandbox token lookup failed");
                        Err(Status::unavailable("credential store unavailable"))
                    }
                }
            }
            Access::Sandbox => {
                let token =
                    token.ok_or_else(|| Status::unauthenticated("missing sandbox token"))?;
                let hash = hex::encode(sha256(token));
                match self.store.sandbox_for_token(&hash).await {
                    Ok(Some(id)) => Ok(Principal::Sandbox(id)),
                    Ok(None) => Err(Status::unauthenticated("invalid sandbox token")),
                    Err(err) => {
                        tracing::error!(%err, "sandbox token lookup failed");
                        Err(Status::unavailable("credential store unavailable"))
                    }
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
    }
}
