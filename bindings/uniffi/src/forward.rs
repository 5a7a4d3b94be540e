//! [`ForwardHandle`]: a local TCP listener whose connections the core pumps
//! to a port (or the SSH server) inside a sandbox, over `ForwardTcp`.
//!
//! The listener and its connections run on the core's runtime; the JVM only
//! holds the handle. `shutdown()` (or the last reference going away, or the
//! client's `cancel_all()`) closes the listener, so new connections are
//! refused, and ends the active ones.

use std::sync::Arc;

use openshell_sdk::{ForwardTarget as CoreTarget, Sandboxes};

use crate::client::{OpenShellClient, counter};
use crate::errors::{OpenShellError, invalid};

/// What a forward reaches inside the sandbox.
#[derive(Debug, Clone, uniffi::Enum)]
pub enum ForwardTarget {
    /// A TCP port on the sandbox's own loopback (1-65535).
    Tcp { port: u16 },
    /// The sandbox's embedded SSH server.
    Ssh,
}

/// A forward's counters, as of the call.
#[derive(Debug, Clone, uniffi::Record)]
pub struct ForwardStats {
    /// Connections accepted on the local listener.
    pub connections_accepted: i64,
    /// Connections being pumped now.
    pub connections_active: i64,
    /// Connections that ended with an error (the stream or the socket).
    pub connections_failed: i64,
    /// Bytes from the sandbox written to local clients.
    pub bytes_in: i64,
    /// Bytes from local clients sent to the sandbox.
    pub bytes_out: i64,
}

/// A running forward.
#[derive(uniffi::Object)]
pub struct ForwardHandle {
    inner: openshell_sdk::ForwardHandle,
}

#[uniffi::export(async_runtime = "tokio")]
impl ForwardHandle {
    /// The local listener's address, `host:port`.
    pub fn local_address(&self) -> String {
        self.inner.local_addr().to_string()
    }

    /// The local listener's port.
    pub fn local_port(&self) -> u16 {
        self.inner.local_addr().port()
    }

    /// The sandbox this forward reaches.
    pub fn sandbox(&self) -> String {
        self.inner.sandbox().to_owned()
    }

    /// The port inside the sandbox (0 for the SSH server).
    pub fn remote_port(&self) -> u16 {
        self.inner.remote_port()
    }

    pub fn stats(&self) -> ForwardStats {
        let s = self.inner.stats();
        ForwardStats {
            connections_accepted: counter(s.connections_accepted),
            connections_active: counter(s.connections_active),
            connections_failed: counter(s.connections_failed),
            bytes_in: counter(s.bytes_in),
            bytes_out: counter(s.bytes_out),
        }
    }

    /// Stops the forward: the listener closes (new connections are
    /// refused) and active connections end. Idempotent; returns at once.
    /// (Not `close`: that name is the generated class's `AutoCloseable`.)
    pub fn shutdown(&self) {
        self.inner.close();
    }

    /// Whether the forward was shut down (or its client cancelled).
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Waits until the forward has stopped: the listener is closed and
    /// every connection has ended. Returns only after a shutdown.
    pub async fn wait_closed(&self) {
        self.inner.closed().await;
    }
}

#[uniffi::export(async_runtime = "tokio")]
impl OpenShellClient {
    /// Listens on `local_address` (`127.0.0.1:0` when `None`) and forwards
    /// every connection to `target` inside `sandbox`.
    ///
    /// Without an SSH session token the sandbox is looked up first (which
    /// also learns its owner for routing), so a missing sandbox is
    /// `not_found` here rather than a failed connection later. With one,
    /// each connection's stream carries it (a client without a user token
    /// may forward to that token's sandbox) and the gateway checks it per
    /// connection. `timeout_ms`, when set, closes the forward once it passes.
    pub async fn forward(
        &self,
        sandbox: String,
        target: ForwardTarget,
        local_address: Option<String>,
        ssh_session_token: Option<String>,
        timeout_ms: Option<u64>,
    ) -> Result<Arc<ForwardHandle>, OpenShellError> {
        if sandbox.is_empty() {
            return Err(invalid("forward needs a sandbox name"));
        }
        let target = match target {
            ForwardTarget::Tcp { port: 0 } => {
                return Err(invalid("forward needs a remote port (1-65535)"));
            }
            ForwardTarget::Tcp { port } => CoreTarget::Tcp(port),
            ForwardTarget::Ssh => CoreTarget::Ssh,
        };
        if ssh_session_token.is_none() {
            let (lookup, _) = self.options(None);
            let sandboxes: Sandboxes = self.client.sandboxes();
            self.run(sandboxes.get_with_owner(&sandbox, lookup)).await?;
        }
        let local = local_address.unwrap_or_else(|| "127.0.0.1:0".to_owned());
        let (options, _) = self.options(timeout_ms);
        let inner = self
            .run(self.client.forward_to(
                &sandbox,
                target,
                ssh_session_token.as_deref(),
                local.as_str(),
                options,
            ))
            .await?;
        Ok(Arc::new(ForwardHandle { inner }))
    }
}
