//! Sandboxes of lost supervisor hosts, and sandboxes of the other driver.
//!
//! Under `--driver hosts` every replica sweeps the store every few seconds
//! for pooled sandboxes whose host has had no session renewing its seat for
//! `--host-lost-after`. By `--host-lost-policy`:
//!
//! - `restart` (default): each is assigned to a live host with room (the
//!   placement cap as at create) and starts there from nothing: phase
//!   PROVISIONING until the new host's session makes it READY, and a
//!   `HostLost` condition (reason `Restarted`) saying its files and
//!   processes stayed with the lost host. With no room anywhere it waits
//!   (reason `WaitingForHost`) and moves as soon as a host has room.
//! - `error`: phase ERROR with a `HostLost` condition (reason `HostGone`);
//!   it stays assigned to its host and comes back, files and all, if that
//!   host returns.
//!
//! A host that returns after its sandboxes moved gets an assignment without
//! them, and stops them (their processes and directories go).
//!
//! Sandboxes that the process driver started (assigned to no host) are
//! adopted the same way, restarted on a live host (reason `DriverChanged`).
//! The other way round, `recover` under the process driver takes pooled
//! sandboxes off their hosts and starts a supervisor for each.
//!
//! Nothing is judged until this replica has read the store without a
//! failure for `--host-lost-after`: after the whole cluster was down, or
//! the store was, seats are old because nobody could renew them, not
//! because their hosts are gone; the hosts reconnect within that time.

use super::*;
use crate::metrics::HostLostLabels;
use crate::store::{Placement, Stranded};

/// Condition type on a sandbox whose supervisor host was lost, or that
/// another driver started.
pub const HOST_LOST: &str = "HostLost";
/// `HostLost` reasons.
const RESTARTED: &str = "Restarted";
const WAITING: &str = "WaitingForHost";
const HOST_GONE: &str = "HostGone";
const DRIVER_CHANGED: &str = "DriverChanged";

/// What becomes of the sandboxes of a lost host (`--host-lost-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HostLostPolicy {
    /// Start them again on a live host (their files are gone).
    Restart,
    /// Leave them on their host in ERROR until it returns.
    Error,
}

#[derive(Debug, Clone, Copy)]
pub struct Failover {
    /// How long a host may have no live session before it counts as lost.
    pub lost_after: Duration,
    pub policy: HostLostPolicy,
}

impl Failover {
    /// How often the store is swept.
    fn every(&self) -> Duration {
        (self.lost_after / 4).clamp(Duration::from_millis(250), Duration::from_secs(5))
    }
}

/// Sets (or replaces) the `HostLost` condition.
fn set_host_lost(sandbox: &mut Sandbox, reason: &str, message: &str) {
    let status = sandbox.status.get_or_insert_with(SandboxStatus::default);
    status.conditions.retain(|c| c.r#type != HOST_LOST);
    status.conditions.push(SandboxCondition {
        r#type: HOST_LOST.into(),
        status: "True".into(),
        reason: reason.into(),
        message: message.into(),
        transition_time: Some(now()),
    });
}

/// The `HostLost` condition's reason and message, if any.
fn host_lost_of(sandbox: &Sandbox) -> Option<(&str, &str)> {
    sandbox
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.r#type == HOST_LOST)
        .map(|c| (c.reason.as_str(), c.message.as_str()))
}

/// On an accepted session: a `HostLost` condition that said the sandbox
/// waits for its host (or for room) is over, since it is served again. One
/// that says it was restarted stays: its files are still gone.
pub(super) fn clear_host_wait(sandbox: &mut Sandbox) {
    if let Some(status) = sandbox.status.as_mut() {
        status
            .conditions
            .retain(|c| !(c.r#type == HOST_LOST && (c.reason == WAITING || c.reason == HOST_GONE)));
    }
}

/// Decides a stranded sandbox's new record for `placement`; false leaves
/// it unchanged (nothing new to say, or being deleted).
fn on_stranded(
    sandbox: &mut Sandbox,
    stranded: &Stranded,
    failover: &Failover,
    placement: &Placement,
) -> bool {
    if phase_of(sandbox) == SandboxPhase::Deleting {
        return false;
    }
    let gone = failover.lost_after.as_secs();
    let lost = match &stranded.host_id {
        Some(host) => format!(
            "supervisor host {} has had no session for more than {gone} s",
            validate::quote(host)
        ),
        None => "the sandbox was started by the process driver and this gateway now runs \
                 sandboxes on supervisor hosts (--driver hosts)"
            .to_owned(),
    };
    let (phase, reason, message) = match placement {
        Placement::Moved(host) => {
            let reason = if stranded.host_id.is_some() {
                RESTARTED
            } else {
                DRIVER_CHANGED
            };
            let message = format!(
                "{lost}; started again on supervisor host {}. Its files and processes \
                 from before were not carried over.",
                validate::quote(host)
            );
            (SandboxPhase::Provisioning, reason, message)
        }
        Placement::NoRoom(err) => {
            let message = format!(
                "{lost}; waiting for a live supervisor host with room ({err}). It starts \
                 on the first one that has room; its files from before are not carried over."
            );
            let phase = match phase_of(sandbox) {
                SandboxPhase::Ready => SandboxPhase::Unknown,
                other => other,
            };
            (phase, WAITING, message)
        }
        Placement::Kept => {
            let message = format!(
                "{lost}; the sandbox stays assigned to it (--host-lost-policy error) and \
                 comes back, with its files, if the host returns."
            );
            (SandboxPhase::Error, HOST_GONE, message)
        }
    };
    if host_lost_of(sandbox) == Some((reason, message.as_str())) && phase_of(sandbox) == phase {
        return false;
    }
    set_phase(sandbox, phase, HOST_LOST, &message);
    set_host_lost(sandbox, reason, &message);
    true
}

impl Sandboxes {
    /// Sweeps for sandboxes of lost hosts (and of the process driver) and
    /// resolves each by `failover`'s policy; runs for the process's life
    /// (`--driver hosts` only).
    pub async fn watch_lost_hosts(self: Arc<Self>, failover: Failover) {
        let Some(pool) = self.pool.clone() else {
            return;
        };
        let mut tick = tokio::time::interval(failover.every());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Judging starts once the store answered for `lost_after` in a row.
        let mut trusted_from = tokio::time::Instant::now() + failover.lost_after;
        loop {
            tick.tick().await;
            let stranded = match self
                .store
                .stranded_sandboxes(failover.lost_after, true)
                .await
            {
                Ok(stranded) => stranded,
                Err(err) => {
                    tracing::warn!(%err, "sweeping for sandboxes of lost hosts");
                    trusted_from = tokio::time::Instant::now() + failover.lost_after;
                    continue;
                }
            };
            if tokio::time::Instant::now() < trusted_from || pool.is_shutting_down() {
                continue;
            }
            let mut moved = false;
            for one in stranded {
                match self.resolve(&one, &failover).await {
                    Ok(changed) => moved |= changed,
                    Err(err) => {
                        tracing::warn!(sandbox_id = one.sandbox_id, %err, "resolving a sandbox of a lost host");
                        trusted_from = tokio::time::Instant::now() + failover.lost_after;
                        break;
                    }
                }
            }
            if moved {
                pool.assignment_changed();
            }
        }
    }

    /// Resolves one stranded sandbox. True when it moved to another host.
    async fn resolve(&self, stranded: &Stranded, failover: &Failover) -> Result<bool, StoreError> {
        // Sandboxes of another driver are always adopted; a lost host's by
        // policy.
        let place = (stranded.host_id.is_none() || failover.policy == HostLostPolicy::Restart)
            .then_some(HOST_TTL);
        let resolved = self
            .store
            .resolve_stranded(
                stranded,
                failover.lost_after,
                place,
                |sandbox, placement| on_stranded(sandbox, stranded, failover, placement),
            )
            .await?;
        let Some((sandbox, placement)) = resolved else {
            return Ok(false);
        };
        let id = id_of(&sandbox).to_owned();
        let message = host_lost_of(&sandbox)
            .map(|(_, message)| message.to_owned())
            .unwrap_or_default();
        let outcome = match (&placement, &stranded.host_id) {
            (Placement::Moved(_), None) => "adopted",
            (Placement::Moved(_), Some(_)) => "restarted",
            (Placement::NoRoom(_), _) => "waiting",
            (Placement::Kept, _) => "error",
        };
        self.host_lost
            .get_or_create(&HostLostLabels { outcome })
            .inc();
        tracing::warn!(
            sandbox_id = id,
            from = stranded.host_id.as_deref(),
            outcome,
            "sandbox of a lost supervisor host"
        );
        let level = if outcome == "error" { "ERROR" } else { "WARN" };
        self.note(&id, level, message);
        self.hub.wake(&id);
        Ok(matches!(placement, Placement::Moved(_)))
    }

    /// Under the process driver at start-up: a sandbox a supervisor host
    /// ran (the gateway ran `--driver hosts` before) is taken off its host
    /// and gets a supervisor of its own, like any sandbox whose supervisor
    /// is gone. Its host, if it still connects, gets an assignment without
    /// it and stops its copy. Returns whether it was on a host.
    pub(super) async fn adopt_from_host(&self, id: &str) -> Result<bool, StoreError> {
        let taken = self
            .store
            .take_off_host(id, |sandbox, host| {
                let message = format!(
                    "the sandbox ran on supervisor host {} and this gateway now runs a \
                     supervisor per sandbox (--driver process); started again here. Its \
                     files and processes from before were not carried over.",
                    validate::quote(host)
                );
                set_phase(sandbox, SandboxPhase::Provisioning, HOST_LOST, &message);
                set_host_lost(sandbox, DRIVER_CHANGED, &message);
            })
            .await?;
        let Some(host) = taken else {
            return Ok(false);
        };
        tracing::warn!(
            sandbox_id = id,
            host,
            "adopting a pooled sandbox (driver changed)"
        );
        self.host_lost
            .get_or_create(&HostLostLabels { outcome: "adopted" })
            .inc();
        self.note(
            id,
            "WARN",
            format!("taken off supervisor host {host}: the driver changed to process"),
        );
        self.hub.wake(id);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(phase: SandboxPhase) -> Sandbox {
        let mut sandbox = Sandbox::default();
        set_phase(&mut sandbox, phase, "x", "y");
        sandbox
    }

    fn failover() -> Failover {
        Failover {
            lost_after: Duration::from_secs(45),
            policy: HostLostPolicy::Restart,
        }
    }

    #[test]
    fn a_move_says_where_and_that_the_files_stayed_behind() {
        let mut s = sandbox(SandboxPhase::Unknown);
        let stranded = Stranded {
            sandbox_id: "id".into(),
            host_id: Some("h-0".into()),
        };
        assert!(on_stranded(
            &mut s,
            &stranded,
            &failover(),
            &Placement::Moved("h-1".into())
        ));
        assert_eq!(phase_of(&s), SandboxPhase::Provisioning);
        let (reason, message) = host_lost_of(&s).unwrap();
        assert_eq!(reason, RESTARTED);
        assert!(
            message.contains("\"h-0\"") && message.contains("\"h-1\""),
            "{message}"
        );
        assert!(message.contains("not carried over"), "{message}");
        // Served again: a restart's condition stays.
        clear_host_wait(&mut s);
        assert!(host_lost_of(&s).is_some());
    }

    #[test]
    fn waiting_is_written_once_and_cleared_when_served() {
        let mut s = sandbox(SandboxPhase::Ready);
        let stranded = Stranded {
            sandbox_id: "id".into(),
            host_id: Some("h-0".into()),
        };
        let full = Placement::NoRoom(StoreError::HostsFull);
        assert!(on_stranded(&mut s, &stranded, &failover(), &full));
        assert_eq!(phase_of(&s), SandboxPhase::Unknown);
        assert!(!on_stranded(&mut s, &stranded, &failover(), &full));
        clear_host_wait(&mut s);
        assert!(host_lost_of(&s).is_none());
    }

    #[test]
    fn a_sandbox_being_deleted_is_left_alone() {
        let mut s = sandbox(SandboxPhase::Deleting);
        let stranded = Stranded {
            sandbox_id: "id".into(),
            host_id: Some("h-0".into()),
        };
        assert!(!on_stranded(
            &mut s,
            &stranded,
            &failover(),
            &Placement::Kept
        ));
    }
}
