//! [`HostSession`]: a shared supervisor host's session (the core's
//! [`openshell_sdk::HostSession`]) for the JVM: one `ConnectHost` stream,
//! authenticated with the host's token, carrying the session of every
//! sandbox the gateway assigns to the host (placement redirects, sticky
//! redials, fallbacks). The core serves each assigned sandbox's
//! configuration through one [`HostApplier`] implemented on the JVM, called
//! on a blocking thread, one call at a time per sandbox (calls for
//! different sandboxes may overlap). Runs follow [`crate::ConfigSession`]'s
//! rules: one at a time, ended by `stop()`, `shutdown()` or the caller's
//! cancellation, returning once every sandbox session ended.

use std::sync::Arc;

use openshell_sdk::{ApplyOutcome, CancellationToken, HostSession as CoreHost};

use crate::config_session::{
    RunSlot, SessionOptions, client_config, rejection, run_claimed, snapshot,
};
use crate::errors::OpenShellError;

/// Applies an assigned sandbox's configuration, implemented on the JVM; an
/// error rejects it, its detail being the reason. The snapshot's `mode` is
/// `None` (a host session does not report it).
#[uniffi::export(with_foreign)]
pub trait HostApplier: Send + Sync {
    fn apply(
        &self,
        sandbox_id: String,
        snapshot: crate::config_session::ConfigSnapshot,
    ) -> Result<(), OpenShellError>;
}

/// The counters of a [`HostSession`].
#[derive(Debug, Clone, uniffi::Record)]
pub struct HostSessionStats {
    pub sessions_accepted: i64,
    /// Redirects followed.
    pub redirects: i64,
    /// Redials of the replica that held a lost session (with `stay`).
    pub sticky_redials: i64,
    /// Falls back to the shared address.
    pub fallbacks: i64,
    /// Whether the last hello carried `stay`.
    pub stay: bool,
    /// The current session id, while one is accepted.
    pub session_id: Option<String>,
    /// The replica holding the current session.
    pub served_by: Option<String>,
    /// Sandboxes in the last assignment.
    pub assigned: i64,
}

/// A shared supervisor host's session.
#[derive(uniffi::Object)]
pub struct HostSession {
    session: CoreHost,
    slot: RunSlot,
    closed: CancellationToken,
}

#[uniffi::export(async_runtime = "tokio")]
impl HostSession {
    /// Builds the session of host `member_id` (the id its host token was
    /// issued for); `options.token` is the host token. `capacity`: most
    /// sandboxes served at once (0: no limit). Nothing connects until `run`.
    #[uniffi::constructor]
    pub fn new(
        options: SessionOptions,
        member_id: String,
        capacity: u32,
        applier: Arc<dyn HostApplier>,
    ) -> Result<Arc<Self>, OpenShellError> {
        let config = client_config(&options)?;
        let mut builder = CoreHost::builder(config, member_id)
            .capacity(capacity)
            .config_push(options.announce_push)
            .apply(Arc::new(move |sandbox_id: &str, snap| {
                match applier.apply(sandbox_id.to_owned(), snapshot(snap, None)) {
                    Ok(()) => ApplyOutcome::Applied,
                    Err(err) => rejection(err),
                }
            }));
        if let Some(id) = options.instance_id {
            builder = builder.instance_id(id);
        }
        Ok(Arc::new(Self {
            session: builder.build()?,
            slot: RunSlot::default(),
            closed: CancellationToken::new(),
        }))
    }

    /// Holds the host's session and serves its sandboxes until `stop()`,
    /// `shutdown()` or the caller's cancellation. A second run while one is
    /// under way fails with `failed_precondition`.
    pub async fn run(&self) -> Result<(), OpenShellError> {
        if self.closed.is_cancelled() {
            return Ok(());
        }
        let (guard, stop) = self.slot.claim("host session", &self.closed)?;
        let session = self.session.clone();
        run_claimed(guard, stop.clone(), async move { session.run(stop).await }).await
    }

    /// Stops the current run.
    pub fn stop(&self) {
        self.slot.stop();
    }

    /// Returns once no run is under way.
    pub async fn wait_stopped(&self) {
        self.slot.idle().await;
    }

    pub fn stats(&self) -> HostSessionStats {
        let s = self.session.stats();
        let c = crate::client::counter;
        HostSessionStats {
            sessions_accepted: c(s.sessions_accepted),
            redirects: c(s.redirects),
            sticky_redials: c(s.sticky_redials),
            fallbacks: c(s.fallbacks),
            stay: s.stay,
            session_id: s.session_id,
            served_by: s.served_by,
            assigned: i64::try_from(s.assigned).unwrap_or(i64::MAX),
        }
    }

    pub fn member_id(&self) -> String {
        self.session.member_id().to_owned()
    }

    pub fn instance_id(&self) -> String {
        self.session.instance_id().to_owned()
    }

    /// Stops any run for good. Idempotent.
    pub fn shutdown(&self) {
        self.closed.cancel();
    }
}

impl Drop for HostSession {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}
