//! SSH sessions (`CreateSshSession`, `RevokeSshSession`): a token that lets
//! a client forward to one sandbox (its SSH server or a port in it) without
//! a user token, until it expires or is revoked.
//!
//! [`SshSession`] is an object, not a record, on purpose: a record becomes
//! a Kotlin data class whose generated `toString()` would print the token.
//! The token is read only through `token()`.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use crate::client::OpenShellClient;
use crate::errors::OpenShellError;

/// An issued SSH session.
#[derive(uniffi::Object)]
pub struct SshSession {
    inner: openshell_sdk::SshSession,
}

#[uniffi::export]
impl SshSession {
    /// The sandbox's id.
    pub fn sandbox_id(&self) -> String {
        self.inner.sandbox_id.clone()
    }

    /// The secret: pass it to `forward` as `ssh_session_token`.
    pub fn token(&self) -> String {
        self.inner.token.clone()
    }

    /// `SHA256:<base64>` of the sandbox's SSH host key (empty until its
    /// supervisor reported one): pin it.
    pub fn host_key_fingerprint(&self) -> String {
        self.inner.host_key_fingerprint.clone()
    }

    /// When the token stops working (Unix milliseconds); `None`: when revoked.
    pub fn expires_at_ms(&self) -> Option<i64> {
        self.inner
            .expires_at
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    /// The host of the gateway address that issued it.
    pub fn gateway_host(&self) -> String {
        self.inner.gateway_host.clone()
    }

    pub fn gateway_port(&self) -> u16 {
        self.inner.gateway_port
    }

    /// `http` or `https`.
    pub fn gateway_scheme(&self) -> String {
        self.inner.gateway_scheme.clone()
    }
}

#[uniffi::export(async_runtime = "tokio")]
impl OpenShellClient {
    /// Issues an SSH session token for `sandbox` (needs a user token when
    /// the gateway has auth).
    pub async fn create_ssh_session(
        &self,
        sandbox: String,
        timeout_ms: Option<u64>,
    ) -> Result<Arc<SshSession>, OpenShellError> {
        let (options, _) = self.options(timeout_ms);
        let inner = self
            .run(self.client.create_ssh_session(&sandbox, options))
            .await?;
        Ok(Arc::new(SshSession { inner }))
    }

    /// Revokes an SSH session token: true when it was live; an unknown,
    /// expired or already revoked token is `false`, not an error.
    pub async fn revoke_ssh_session(
        &self,
        token: String,
        timeout_ms: Option<u64>,
    ) -> Result<bool, OpenShellError> {
        let (options, _) = self.options(timeout_ms);
        self.run(self.client.revoke_ssh_session(&token, options))
            .await
    }
}
