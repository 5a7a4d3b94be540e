//! `CreateSshSession` and `RevokeSshSession`: tokens that let a client open
//! `ForwardTcp` to one sandbox (its embedded SSH server, or a port inside
//! it) without a user token.
//!
//! A token is a random UUIDv4 (what the public protocol's clients expect);
//! the store keeps only its SHA-256, the sandbox id, and an expiry by the
//! database's clock (`--ssh-session-ttl-secs`, 0 for none). Neither the
//! token nor its hash appears in a log line or an error. Deleting a sandbox
//! deletes its tokens.
//!
//! A session's end also ends the forwards opened with it ([`OpenForwards`]):
//! at its expiry (a timer), at once when it is revoked on the replica that
//! holds the forward, and within [`RECHECK_INTERVAL`] (each forward re-reads
//! its row) when it is revoked on another replica or its sandbox is deleted.
//! Ended rows are deleted by [`purge_ended`], a bounded batch per pass.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use openshell_proto::{
    CreateSshSessionRequest, CreateSshSessionResponse, RevokeSshSessionRequest,
    RevokeSshSessionResponse,
};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::auth;
use crate::sandboxes::{Sandboxes, id_of, store_status};
use crate::store::Store;
use crate::validate;

/// How often an open forward re-reads its SSH session: the bound on how
/// long it outlives a revoke on another replica.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Default of `--ssh-session-purge-secs`.
pub const DEFAULT_PURGE_SECS: u64 = 60;

/// Ended sessions deleted per purge pass at most.
const PURGE_BATCH: i64 = 500;

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

/// Revokes a token and ends the forwards this replica holds open with it.
/// Idempotent: an unknown, expired or revoked token is `revoked: false`, not
/// an error, and changes nothing.
pub async fn revoke(
    sandboxes: &Sandboxes,
    forwards: &OpenForwards,
    request: RevokeSshSessionRequest,
) -> Result<RevokeSshSessionResponse, Status> {
    if request.token.is_empty() {
        return Err(Status::invalid_argument("token is required"));
    }
    if request.token.len() > 256 {
        return Ok(RevokeSshSessionResponse { revoked: false });
    }
    let hash = auth::ssh_session_hash(&request.token);
    let revoked = sandboxes
        .store
        .revoke_ssh_session(&hash)
        .await
        .map_err(store_status)?;
    if revoked {
        let ended = forwards.revoked(&hash);
        tracing::info!(forwards_ended = ended, "ssh session revoked");
    }
    Ok(RevokeSshSessionResponse { revoked })
}

/// Deletes ended SSH sessions every `every`, [`PURGE_BATCH`] at a time
/// (the next pass takes the rest). Every replica runs it; the deletes do
/// not conflict.
pub async fn purge_ended(store: Store, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match store.purge_ended_ssh_sessions(PURGE_BATCH).await {
            Ok(0) => {}
            Ok(purged) => tracing::debug!(purged, "ended ssh sessions deleted"),
            Err(err) => tracing::warn!(error = %err, "could not purge ended ssh sessions"),
        }
    }
}

/// Why a forward's SSH session ended. The messages never carry the token.
fn revoked_status() -> Status {
    Status::unauthenticated("the SSH session was revoked; the forward is closed")
}

fn expired_status() -> Status {
    Status::unauthenticated("the SSH session expired; the forward is closed")
}

fn gone_status() -> Status {
    Status::unauthenticated(
        "the SSH session ended (revoked, expired or its sandbox deleted); the forward is closed",
    )
}

/// The forwards this replica holds open with SSH session tokens, by token
/// hash, so that a revoke here ends them at once.
#[derive(Default)]
pub struct OpenForwards {
    by_hash: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    revoked: CancellationToken,
    forwards: usize,
}

/// One forward's place in [`OpenForwards`]; leaves it when dropped.
struct Registration {
    forwards: Arc<OpenForwards>,
    hash: String,
    revoked: CancellationToken,
}

impl Drop for Registration {
    fn drop(&mut self) {
        // A cancelled token's entry was taken out by `revoked`; any entry
        // there now is another one's.
        if self.revoked.is_cancelled() {
            return;
        }
        let mut map = self
            .forwards
            .by_hash
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = map.get_mut(&self.hash) {
            entry.forwards -= 1;
            if entry.forwards == 0 {
                map.remove(&self.hash);
            }
        }
    }
}

impl OpenForwards {
    fn register(self: &Arc<Self>, hash: &str) -> Registration {
        let mut map = self.by_hash.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = map.entry(hash.to_owned()).or_insert_with(|| Entry {
            revoked: CancellationToken::new(),
            forwards: 0,
        });
        entry.forwards += 1;
        Registration {
            forwards: self.clone(),
            hash: hash.to_owned(),
            revoked: entry.revoked.clone(),
        }
    }

    /// Ends the open forwards of a revoked session; returns how many.
    fn revoked(&self, hash: &str) -> usize {
        let entry = self
            .by_hash
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(hash);
        entry.map_or(0, |entry| {
            entry.revoked.cancel();
            entry.forwards
        })
    }

    /// Resolves when the session of `hash` ends, with the status its
    /// forward ends with: revoked here (at once), past `expires_in` (a
    /// timer), or revoked elsewhere, expired or deleted as the store says
    /// (re-read every `recheck`). A store that cannot answer keeps the
    /// forward open until the next re-read.
    pub fn session_end(
        self: &Arc<Self>,
        store: Store,
        hash: String,
        expires_in: Option<Duration>,
        recheck: Duration,
    ) -> impl Future<Output = Status> + Send + 'static {
        let registration = self.register(&hash);
        async move { watch(registration, store, expires_in, recheck).await }
    }
}

async fn watch(
    registration: Registration,
    store: Store,
    expires_in: Option<Duration>,
    recheck: Duration,
) -> Status {
    let hash = registration.hash.clone();
    let expiry = async {
        match expires_in {
            Some(left) => tokio::time::sleep(left).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expiry);
    let mut tick = tokio::time::interval_at(Instant::now() + recheck, recheck);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = registration.revoked.cancelled() => return revoked_status(),
            _ = &mut expiry => return expired_status(),
            _ = tick.tick() => match store.ssh_session(&hash).await {
                Ok(Some(state)) if state.revoked => return revoked_status(),
                Ok(Some(state)) if state.expired => return expired_status(),
                Ok(Some(_)) => {}
                Ok(None) => return gone_status(),
                Err(err) => {
                    tracing::warn!(error = %err, "could not re-read an ssh session; the forward stays open");
                }
            },
        }
    }
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
    fn a_revoke_reaches_every_open_forward_of_its_session_only() {
        let forwards = Arc::new(OpenForwards::default());
        let (a1, a2, b) = (
            forwards.register("a"),
            forwards.register("a"),
            forwards.register("b"),
        );
        assert_eq!(forwards.revoked("a"), 2);
        assert!(a1.revoked.is_cancelled() && a2.revoked.is_cancelled());
        assert!(!b.revoked.is_cancelled());
        assert_eq!(forwards.revoked("a"), 0, "nothing left to end");
        drop((a1, a2, b));
        assert!(
            forwards.by_hash.lock().unwrap().is_empty(),
            "closed forwards leave no entry"
        );
    }

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
