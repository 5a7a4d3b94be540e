//! Applying configuration: snapshots go to the host's apply function one
//! at a time, duplicates of the last applied one are not applied again,
//! and every pushed update gets its `ConfigUpdateResult` (the ack).

use openshell_proto::{ConfigApplyOutcome, ConfigUpdate, ConfigUpdateResult, PolicyStatus};

use super::{ApplyOutcome, ApplyWithModeFn, ConfigEvent, ConfigSnapshot, DeliveryMode, Inner};

/// Reasons sent with REJECTED are cut to this many characters.
const MAX_REASON: usize = 256;

pub(super) struct Applier {
    pub(super) apply: ApplyWithModeFn,
    /// The last applied snapshot.
    pub(super) last: tokio::sync::Mutex<Option<ConfigSnapshot>>,
    /// Held by the apply function's call for as long as it runs, even when
    /// the session that asked for it was cancelled meanwhile: the next call
    /// waits for it (one call at a time), and so does the end of `run`.
    pub(super) busy: std::sync::Arc<tokio::sync::Mutex<()>>,
}

/// Removes provider environment values (and anything past the bound) from
/// a rejection reason.
fn scrub(reason: &str, snapshot: &ConfigSnapshot) -> String {
    let mut text = reason.to_owned();
    for value in snapshot.provider_environment.environment.values() {
        if value.len() >= 4 && text.contains(value.as_str()) {
            text = text.replace(value.as_str(), "<redacted>");
        }
    }
    let mut bounded: String = text.chars().take(MAX_REASON).collect();
    if bounded.len() < text.len() {
        bounded.push_str("...");
    }
    bounded
}

impl Applier {
    /// Applies a snapshot unless it equals the last applied one. Returns
    /// the outcome, the reason (REJECTED) and the policy status.
    pub(super) async fn apply(
        &self,
        inner: &Inner,
        snapshot: ConfigSnapshot,
        mode: DeliveryMode,
    ) -> (ConfigApplyOutcome, String, PolicyStatus) {
        let mut last = self.last.lock().await;
        // A polled snapshot waits for this lock while a push session may
        // have started: its bootstrap (newer) wins, the poll applies nothing.
        if last.as_ref() == Some(&snapshot)
            || (mode == DeliveryMode::Poll && *inner.pushing.borrow())
        {
            return (
                ConfigApplyOutcome::IgnoredDuplicate,
                String::new(),
                PolicyStatus::Unspecified,
            );
        }
        let policy_changed = last
            .as_ref()
            .is_none_or(|l| l.sandbox_config.policy_hash != snapshot.sandbox_config.policy_hash);
        let apply = self.apply.clone();
        let given = snapshot.clone();
        let busy = self.busy.clone().lock_owned().await;
        let call = move || {
            let _busy = busy;
            apply(given, mode)
        };
        let outcome = match tokio::task::spawn_blocking(call).await {
            Ok(outcome) => outcome,
            Err(_) => ApplyOutcome::Rejected("the apply function panicked".into()),
        };
        match outcome {
            ApplyOutcome::Applied => {
                {
                    let mut stats = inner.stats.lock().unwrap();
                    stats.applied += 1;
                    stats.config_revision = snapshot.sandbox_config.config_revision;
                }
                inner.emit_config(ConfigEvent::Applied {
                    mode,
                    config_revision: snapshot.sandbox_config.config_revision,
                    provider_env_revision: snapshot.provider_environment.provider_env_revision,
                });
                *last = Some(snapshot);
                let status = if policy_changed {
                    PolicyStatus::Loaded
                } else {
                    PolicyStatus::Unspecified
                };
                (ConfigApplyOutcome::Applied, String::new(), status)
            }
            ApplyOutcome::Rejected(reason) => {
                let reason = scrub(&reason, &snapshot);
                inner.stats.lock().unwrap().rejected += 1;
                tracing::warn!(reason, "configuration rejected");
                inner.emit_config(ConfigEvent::Rejected {
                    mode,
                    reason: reason.clone(),
                });
                let status = if policy_changed {
                    PolicyStatus::Failed
                } else {
                    PolicyStatus::Unspecified
                };
                (ConfigApplyOutcome::Rejected, reason, status)
            }
        }
    }

    pub(super) async fn apply_update(
        &self,
        inner: &Inner,
        update: ConfigUpdate,
    ) -> ConfigUpdateResult {
        inner.stats.lock().unwrap().updates_received += 1;
        let (outcome, error, policy_status) =
            match (update.sandbox_config, update.provider_environment) {
                (Some(sandbox_config), Some(provider_environment)) => {
                    let snapshot = ConfigSnapshot {
                        sandbox_config,
                        provider_environment,
                    };
                    self.apply(inner, snapshot, DeliveryMode::Push).await
                }
                _ => (
                    ConfigApplyOutcome::Rejected,
                    "update without a full snapshot".to_owned(),
                    PolicyStatus::Unspecified,
                ),
            };
        {
            let mut stats = inner.stats.lock().unwrap();
            stats.last_update_id = update.update_id;
            if outcome == ConfigApplyOutcome::IgnoredDuplicate {
                stats.duplicates += 1;
            }
        }
        ConfigUpdateResult {
            update_id: update.update_id,
            outcome: outcome as i32,
            error,
            policy_status: policy_status as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ApplyFn, ConfigSession};
    use super::*;
    use crate::config::ClientConfig;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn snapshot(revision: u64, secret: &str) -> ConfigSnapshot {
        let mut snapshot = ConfigSnapshot::default();
        snapshot.sandbox_config.config_revision = revision;
        snapshot.sandbox_config.policy_hash = format!("hash-{revision}");
        snapshot
            .provider_environment
            .environment
            .insert("TOKEN".into(), secret.into());
        snapshot
    }

    #[test]
    fn snapshots_never_show_environment_values() {
        let text = format!("{:?}", snapshot(1, "very-secret-value"));
        assert!(!text.contains("very-secret-value"), "{text}");
        assert!(text.contains("TOKEN"));
    }

    #[test]
    fn rejection_reasons_are_scrubbed_and_bounded() {
        let s = snapshot(1, "very-secret-value");
        assert_eq!(
            scrub("bad value very-secret-value here", &s),
            "bad value <redacted> here"
        );
        let long = "x".repeat(1000);
        assert_eq!(scrub(&long, &s).chars().count(), MAX_REASON + 3);
    }

    async fn session(apply: ApplyFn) -> ConfigSession {
        let config = ClientConfig::builder("http://127.0.0.1:1").build().unwrap();
        ConfigSession::builder(config, "sb-1")
            .apply(apply)
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn updates_are_answered_applied_duplicate_or_rejected() {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let apply: ApplyFn = Arc::new(move |snapshot: ConfigSnapshot| {
            seen.fetch_add(1, Ordering::SeqCst);
            if snapshot.sandbox_config.config_revision == 3 {
                ApplyOutcome::Rejected("revision 3 holds very-secret-value".into())
            } else {
                ApplyOutcome::Applied
            }
        });
        let session = session(apply).await;
        let inner = &session.inner;
        let update = |id: u64, revision: u64| {
            let s = snapshot(revision, "very-secret-value");
            ConfigUpdate {
                update_id: id,
                sandbox_config: Some(s.sandbox_config),
                provider_environment: Some(s.provider_environment),
            }
        };
        let first = inner.applier.apply_update(inner, update(1, 1)).await;
        assert_eq!(first.outcome, ConfigApplyOutcome::Applied as i32);
        assert_eq!(first.policy_status, PolicyStatus::Loaded as i32);
        let again = inner.applier.apply_update(inner, update(2, 1)).await;
        assert_eq!(again.outcome, ConfigApplyOutcome::IgnoredDuplicate as i32);
        let rejected = inner.applier.apply_update(inner, update(3, 3)).await;
        assert_eq!(rejected.outcome, ConfigApplyOutcome::Rejected as i32);
        assert_eq!(rejected.policy_status, PolicyStatus::Failed as i32);
        assert!(
            !rejected.error.contains("very-secret-value"),
            "{}",
            rejected.error
        );
        // A rejected snapshot is tried again when it comes again.
        let retried = inner.applier.apply_update(inner, update(4, 3)).await;
        assert_eq!(retried.outcome, ConfigApplyOutcome::Rejected as i32);
        let partial = inner
            .applier
            .apply_update(
                inner,
                ConfigUpdate {
                    update_id: 5,
                    sandbox_config: None,
                    provider_environment: None,
                },
            )
            .await;
        assert_eq!(partial.outcome, ConfigApplyOutcome::Rejected as i32);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        let stats = session.stats();
        assert_eq!((stats.applied, stats.rejected, stats.duplicates), (1, 2, 1));
        assert_eq!(stats.last_update_id, 5);
        assert_eq!(stats.config_revision, 1);
    }
}
