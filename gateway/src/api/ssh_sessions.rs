//! `CreateSshSession` and `RevokeSshSession`: tokens that let a client open
//! `ForwardTcp` to one sandbox (its embedded SSH server, or a port inside
//! it) without a user token.
//!
//! A token is a random UUIDv4 (what the public protocol's clients expect);
//! the store keeps only its SHA-256, the sandbox id, and an expiry by the
//! database's clock (`--ssh-session-ttl-secs`, 0 for none). Neither the
//! token nor its hash appears in a log line or an error. Deleting a sandbox
//! deletes its tokens.

use std::time::{Duration, UNIX_EPOCH};

use openshell_proto::{
    CreateSshSessionRequest, CreateSshSessionResponse, RevokeSshSessionRequest,
    RevokeSshSessionResponse,
};
use tonic::Status;

use crate::auth;
use crate::sandboxes::{Sandboxes, id_of, store_status};
use crate::validate;

/// Default of `--ssh-session-ttl-secs`.
pub const DEFAULT_TTL_SECS: u64 = 24 * 3600;

/// How this replica issues SSH session tokens.
#[derive(Debug, Clone)]
pub struct SshSessionConfig {
    /// Zero: tokens do not expire.
    pub ttl: Duration,
    /// "http" or "https": what this replica serves.
    pub scheme: &'static str,
}

/// Issues a token for the sandbox `request` names. `authority` is the
/// `host[:port]` the client dialled, reported back as the gateway address.
pub async fn create(
    sandboxes: &Sandboxes,
    config: &SshSessionConfig,
    authority: Option<&str>,
    request: CreateSshSessionRequest,
) -> Result<CreateSshSessionResponse, Status> {
    validate::workspace(request.workspace_scope.as_ref())?;
    validate::sandbox_name(&request.sandbox)?;
    let sandbox = sandboxes.by_name(&request.sandbox).await?;
    let sandbox_id = id_of(&sandbox).to_owned();
    let (token, hash) = auth::new_ssh_session_token();
    let ttl_ms = i64::try_from(config.ttl.as_millis()).unwrap_or(i64::MAX);
    let expires_ms = sandboxes
        .store
        .insert_ssh_session(&hash, &sandbox_id, ttl_ms)
        .await
        .map_err(store_status)?;
    let (gateway_host, gateway_port) = split_authority(authority.unwrap_or_default(), config);
    tracing::info!(
        sandbox_id,
        ttl_secs = config.ttl.as_secs(),
        "ssh session created"
    );
    Ok(CreateSshSessionResponse {
        sandbox_id,
        token,
        gateway_host,
        gateway_port,
        gateway_scheme: config.scheme.to_owned(),
        host_key_fingerprint: sandbox.host_key_fingerprint,
        expiration_time: (expires_ms > 0).then(|| {
            prost_types::Timestamp::from(UNIX_EPOCH + Duration::from_millis(expires_ms as u64))
        }),
    })
}

/// Revokes a token. Idempotent: an unknown, expired or revoked token is
/// `revoked: false`, not an error, and changes nothing.
pub async fn revoke(
    sandboxes: &Sandboxes,
    request: RevokeSshSessionRequest,
) -> Result<RevokeSshSessionResponse, Status> {
    if request.token.is_empty() {
        return Err(Status::invalid_argument("token is required"));
    }
    if request.token.len() > 256 {
        return Ok(RevokeSshSessionResponse { revoked: false });
    }
    let revoked = sandboxes
        .store
        .revoke_ssh_session(&auth::ssh_session_hash(&request.token))
        .await
        .map_err(store_status)?;
    if revoked {
        tracing::info!("ssh session revoked");
    }
    Ok(RevokeSshSessionResponse { revoked })
}

/// `host[:port]` (IPv6 in brackets) into host and port; the scheme's
/// default port when none is given.
fn split_authority(authority: &str, config: &SshSessionConfig) -> (String, u32) {
    let default_port = if config.scheme == "https" { 443 } else { 80 };
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => match port.parse::<u16>() {
            Ok(port) => (host, u32::from(port)),
            Err(_) => (authority, default_port),
        },
        _ => (authority, default_port),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host.to_owned(), port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split() {
        let config = SshSessionConfig {
            ttl: Duration::ZERO,
            scheme: "http",
        };
        assert_eq!(
            split_authority("127.0.0.1:17670", &config),
            ("127.0.0.1".into(), 17670)
        );
        assert_eq!(split_authority("[::1]:9", &config), ("::1".into(), 9));
        assert_eq!(split_authority("[::1]", &config), ("::1".into(), 80));
        assert_eq!(
            split_authority("gw.example", &config),
            ("gw.example".into(), 80)
        );
        assert_eq!(split_authority("", &config), ("".into(), 80));
    }
}
