//! Giving up on a sandbox that is gone.
//!
//! A supervisor can outlive its sandbox: the gateway deleted the sandbox (or
//! replaced its token) while the supervisor was unreachable, or lost track of
//! it. Such a supervisor would reconnect forever. While no session is
//! accepted, this module asks the gateway about the sandbox
//! (`GetSandboxConfig` with the sandbox token) at a fraction of the give-up
//! period; once every answer for at least that period was `UNAUTHENTICATED`
//! or `NOT_FOUND`, the supervisor gives up and exits non-zero.
//!
//! Only those two codes count: the gateway says it does not know this
//! sandbox or this token. Any other answer (success, an unavailable store, a
//! gateway that cannot be reached) breaks the streak, and so does any
//! accepted session, so a restarting gateway or a network partition never
//! makes a supervisor of a live sandbox leave.
//!
//! The session itself runs in sdk-core's `ConfigSession`, which reports
//! accepted and ended sessions but not why an attempt failed; probing here
//! keeps that shared protocol code unchanged.

use std::path::PathBuf;
use std::time::Duration;

use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::sandbox::GetSandboxConfigRequest;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Channel;
use tracing::{debug, warn};

use crate::transport::{self, BearerToken};

/// The default give-up period (`--give-up-after-ms`). Never lower: a
/// gateway restart or a store failover must not cost a live sandbox its
/// supervisor.
pub const DEFAULT_AFTER: Duration = Duration::from_secs(30);
/// How long one probe may take; no answer is not a denial.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Consecutive denials, by when the first one came.
#[derive(Debug, Default)]
struct Streak {
    since: Option<Instant>,
}

impl Streak {
    /// Records one answer; returns for how long the gateway has been
    /// denying the sandbox (zero when this answer was not a denial).
    fn answer(&mut self, denied: bool, now: Instant) -> Duration {
        if !denied {
            self.since = None;
            return Duration::ZERO;
        }
        now.duration_since(*self.since.get_or_insert(now))
    }

    fn reset(&mut self) {
        self.since = None;
    }
}

/// The gateway does not know this sandbox or this token.
fn is_denial(code: Code) -> bool {
    matches!(code, Code::Unauthenticated | Code::NotFound)
}

/// How often to probe: six probes per period, between 100 ms and 5 s apart.
fn probe_interval(after: Duration) -> Duration {
    (after / 6).clamp(Duration::from_millis(100), Duration::from_secs(5))
}

/// What the give-up check needs.
pub struct GiveUp {
    /// A channel to the configured gateway.
    pub channel: Channel,
    pub token: BearerToken,
    pub sandbox_id: String,
    pub after: Duration,
    /// True while a session is accepted.
    pub connected: watch::Receiver<bool>,
    /// Where to say why the gateway cannot be reached (`--status-file`).
    pub status_file: Option<PathBuf>,
}

/// Longest reason written to the status file.
const MAX_STATUS: usize = 240;

impl GiveUp {
    /// Writes `reason` to the status file (replacing it atomically), or
    /// removes the file when there is nothing to report.
    fn report(&self, reason: Option<&str>) {
        let Some(path) = &self.status_file else {
            return;
        };
        let result = match reason {
            Some(reason) => {
                let mut line: String = reason.chars().take(MAX_STATUS).collect();
                line.push('\n');
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, line).and_then(|()| std::fs::rename(&tmp, path))
            }
            None => match std::fs::remove_file(path) {
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
                other => other,
            },
        };
        if let Err(err) = result {
            debug!(%err, "could not update the status file");
        }
    }

    /// Resolves once the gateway has denied the sandbox for `after`, with
    /// the reason to exit with. Never resolves for a sandbox the gateway
    /// knows.
    pub async fn wait(mut self) -> String {
        let mut client = OpenShellClient::new(self.channel.clone());
        let every = probe_interval(self.after);
        let mut streak = Streak::default();
        loop {
            if *self.connected.borrow_and_update() {
                streak.reset();
                self.report(None);
                if self.connected.changed().await.is_err() {
                    // The session is gone for good: nothing to watch.
                    return std::future::pending().await;
                }
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                changed = self.connected.changed() => {
                    if changed.is_err() {
                        return std::future::pending().await;
                    }
                    continue;
                }
            }
            let request = self.token.request(GetSandboxConfigRequest {
                sandbox_id: self.sandbox_id.clone(),
            });
            let answer =
                tokio::time::timeout(PROBE_TIMEOUT, client.get_sandbox_config(request)).await;
            let (denied, code) = match &answer {
                Ok(Err(status)) => {
                    let reason = transport::describe_status(status);
                    debug!(error = %reason, "sandbox probe failed");
                    // No replica answered: the gateway cannot be reached
                    // (refused, TLS, DNS...). Say so where the driver looks.
                    let answered = status.metadata().contains_key("x-openshell-served-by");
                    self.report((!answered).then_some(reason.as_str()));
                    (is_denial(status.code()), Some(status.code()))
                }
                Ok(Ok(_)) => {
                    self.report(None);
                    (false, None)
                }
                Err(_) => {
                    self.report(Some("no answer within 5 s"));
                    (false, None)
                }
            };
            let denied_for = streak.answer(denied, Instant::now());
            if denied {
                warn!(
                    code = ?code.unwrap_or(Code::Unknown),
                    denied_for_ms = denied_for.as_millis() as u64,
                    give_up_after_ms = self.after.as_millis() as u64,
                    "the gateway does not know this sandbox"
                );
            }
            if denied && denied_for >= self.after {
                return format!(
                    "giving up: the gateway has answered UNAUTHENTICATED or NOT_FOUND for sandbox \
                     {} for {} s (it was deleted or its token revoked)",
                    self.sandbox_id,
                    denied_for.as_secs()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_consecutive_denials_for_the_whole_period_count() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut streak = Streak::default();
        assert_eq!(streak.answer(true, at(0)), Duration::ZERO);
        assert_eq!(streak.answer(true, at(10_000)), Duration::from_secs(10));
        // An answer that is not a denial starts over.
        assert_eq!(streak.answer(false, at(20_000)), Duration::ZERO);
        assert_eq!(streak.answer(true, at(25_000)), Duration::ZERO);
        assert_eq!(streak.answer(true, at(55_000)), Duration::from_secs(30));
        // So does an accepted session.
        streak.reset();
        assert_eq!(streak.answer(true, at(60_000)), Duration::ZERO);
    }

    #[test]
    fn only_unknown_sandbox_or_token_is_a_denial() {
        assert!(is_denial(Code::Unauthenticated));
        assert!(is_denial(Code::NotFound));
        for code in [
            Code::Unavailable,
            Code::PermissionDenied,
            Code::FailedPrecondition,
            Code::DeadlineExceeded,
            Code::Internal,
        ] {
            assert!(!is_denial(code), "{code:?}");
        }
    }

    #[test]
    fn probes_come_six_times_a_period_within_bounds() {
        assert_eq!(probe_interval(DEFAULT_AFTER), Duration::from_secs(5));
        assert_eq!(
            probe_interval(Duration::from_secs(3)),
            Duration::from_millis(500)
        );
        assert_eq!(
            probe_interval(Duration::from_millis(100)),
            Duration::from_millis(100)
        );
        assert_eq!(
            probe_interval(Duration::from_secs(3600)),
            Duration::from_secs(5)
        );
    }
}
