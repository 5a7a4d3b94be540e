//! The poll fallback: `GetSandboxConfig` (and the provider environment it
//! names) at startup, and every poll interval while no push session is up.

use openshell_proto::GetSandboxProviderEnvironmentRequest;
use openshell_proto::sandbox::GetSandboxConfigRequest;

use super::{
    ConfigSnapshot, DeliveryMode, GetSandboxConfigResponse, GetSandboxProviderEnvironmentResponse,
    Inner,
};
use crate::client::{CallOptions, Client, DeadlineKind, Resolved};
use crate::error::Error;
use crate::metadata::Metadata;

const GET_SANDBOX_CONFIG: &str = "/openshell.v1.OpenShell/GetSandboxConfig";
const GET_PROVIDER_ENVIRONMENT: &str = "/openshell.v1.OpenShell/GetSandboxProviderEnvironment";

impl Inner {
    pub(super) async fn poll_loop(&self, home: &Client) {
        let mut pushing = self.pushing.subscribe();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.poll_interval) => {}
                _ = self.poll_now.notified() => {}
            }
            if *pushing.borrow_and_update() {
                continue;
            }
            // Boxed: the call's state exists only while it runs, not in
            // every idle session's task (a host holds one per sandbox).
            Box::pin(self.poll_and_apply(home)).await;
        }
    }

    pub(super) async fn poll_and_apply(&self, home: &Client) {
        match self.poll(home).await {
            Ok(snapshot) => {
                // A push session may have started while the poll ran: its
                // updates win (decided under the lock its start takes).
                let polled = self.set_mode_with(|stats| {
                    if *self.pushing.borrow() {
                        return None;
                    }
                    stats.polls += 1;
                    Some(DeliveryMode::Poll)
                });
                if polled.is_some() {
                    self.applier.apply(self, snapshot, DeliveryMode::Poll).await;
                }
            }
            Err(err) => tracing::debug!(error = %err, "config poll failed"),
        }
    }

    /// One consistent snapshot: the configuration, and the environment it
    /// names (fetched again only when that identity changed).
    async fn poll(&self, home: &Client) -> Result<ConfigSnapshot, Error> {
        let cached = self.applier.last.lock().await.clone();
        for _ in 0..3 {
            let resolved = Resolved::new(home, &CallOptions::new(), DeadlineKind::Bounded);
            let (config, _): (GetSandboxConfigResponse, Metadata) = home
                .typed_unary(
                    GET_SANDBOX_CONFIG,
                    &GetSandboxConfigRequest {
                        sandbox_id: self.sandbox_id.clone(),
                    },
                    &resolved,
                )
                .await?;
            if let Some(last) = &cached
                && same_identity(&config, &last.provider_environment)
            {
                return Ok(ConfigSnapshot {
                    sandbox_config: config,
                    provider_environment: last.provider_environment.clone(),
                });
            }
            let (env, _): (GetSandboxProviderEnvironmentResponse, Metadata) = home
                .typed_unary(
                    GET_PROVIDER_ENVIRONMENT,
                    &GetSandboxProviderEnvironmentRequest {
                        sandbox_id: self.sandbox_id.clone(),
                    },
                    &resolved,
                )
                .await?;
            // A write between the two calls: read both again.
            if same_identity(&config, &env) {
                return Ok(ConfigSnapshot {
                    sandbox_config: config,
                    provider_environment: env,
                });
            }
        }
        Err(Error::protocol(
            "configuration kept changing between the config and environment reads",
        ))
    }
}

/// Whether an environment is the one a configuration names.
fn same_identity(
    config: &GetSandboxConfigResponse,
    env: &GetSandboxProviderEnvironmentResponse,
) -> bool {
    config.provider_env_revision == env.provider_env_revision
        && config.provider_attachment_epoch == env.provider_attachment_epoch
        && config.policy_hash == env.policy_hash
}
