//! SSH sessions: a token from `CreateSshSession` lets a client forward to
//! one sandbox (its embedded SSH server, [`ForwardTarget::Ssh`], or a port
//! in it) without a user token, until it expires or is revoked.
//!
//! The token is a secret: [`SshSession`]'s `Debug` leaves it out, and the
//! core never logs it. Pin `host_key_fingerprint` (OpenSSH's `SHA256:`
//! form) as the sandbox's host key.
//!
//! [`ForwardTarget::Ssh`]: crate::ForwardTarget::Ssh

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openshell_proto as pb;

use crate::client::{CallOptions, Client, DeadlineKind, Resolved};
use crate::error::Error;
use crate::paths;

/// A token for one sandbox, as `CreateSshSession` issued it.
#[derive(Clone, PartialEq, Eq)]
pub struct SshSession {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The secret: `init.authorization_token` of `ForwardTcp`.
    pub token: String,
    /// `SHA256:<base64>` of the sandbox's SSH host key; empty when its
    /// supervisor has not reported one yet.
    pub host_key_fingerprint: String,
    /// When the token stops working; `None`: never (until revoked).
    pub expires_at: Option<SystemTime>,
    /// The host of the gateway address the session was issued by.
    pub gateway_host: String,
    /// Its port.
    pub gateway_port: u16,
    /// `http` or `https`.
    pub gateway_scheme: String,
}

impl fmt::Debug for SshSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SshSession")
            .field("sandbox_id", &self.sandbox_id)
            .field("token", &"<redacted>")
            .field("host_key_fingerprint", &self.host_key_fingerprint)
            .field("expires_at", &self.expires_at)
            .field("gateway_host", &self.gateway_host)
            .field("gateway_port", &self.gateway_port)
            .field("gateway_scheme", &self.gateway_scheme)
            .finish()
    }
}

impl Client {
    /// Issues an SSH session token for `sandbox` (`CreateSshSession`).
    pub async fn create_ssh_session(
        &self,
        sandbox: &str,
        options: CallOptions,
    ) -> Result<SshSession, Error> {
        let resolved = Resolved::new(self, &options, DeadlineKind::Bounded);
        let request = pb::CreateSshSessionRequest {
            sandbox: sandbox.to_owned(),
            workspace_scope: None,
        };
        let (response, _): (pb::CreateSshSessionResponse, _) = self
            .typed_unary(paths::CREATE_SSH_SESSION, &request, &resolved)
            .await?;
        let expires_at = response.expiration_time.map(|t| {
            UNIX_EPOCH
                + Duration::from_secs(t.seconds.max(0) as u64)
                + Duration::from_nanos(t.nanos.max(0) as u64)
        });
        Ok(SshSession {
            sandbox_id: response.sandbox_id,
            token: response.token,
            host_key_fingerprint: response.host_key_fingerprint,
            expires_at,
            gateway_host: response.gateway_host,
            gateway_port: u16::try_from(response.gateway_port).unwrap_or(0),
            gateway_scheme: response.gateway_scheme,
        })
    }

    /// Revokes an SSH session token (`RevokeSshSession`). True when it was
    /// live; revoking an unknown, expired or revoked token is `Ok(false)`.
    pub async fn revoke_ssh_session(
        &self,
        token: &str,
        options: CallOptions,
    ) -> Result<bool, Error> {
        let resolved = Resolved::new(self, &options, DeadlineKind::Bounded);
        let request = pb::RevokeSshSessionRequest {
            token: token.to_owned(),
        };
        let (response, _): (pb::RevokeSshSessionResponse, _) = self
            .typed_unary(paths::REVOKE_SSH_SESSION, &request, &resolved)
            .await?;
        Ok(response.revoked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_token() {
        let session = SshSession {
            sandbox_id: "id".into(),
            token: "0f0e-secret".into(),
            host_key_fingerprint: String::new(),
            expires_at: None,
            gateway_host: "127.0.0.1".into(),
            gateway_port: 1,
            gateway_scheme: "http".into(),
        };
        let text = format!("{session:?}");
        assert!(!text.contains("0f0e-secret"), "{text}");
    }
}
