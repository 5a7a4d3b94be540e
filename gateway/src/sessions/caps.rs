//! Per-sandbox caps on concurrent relays, enforced by the replica that
//! holds the sandbox's session (relayed streams reach it through the peer
//! service, so one count covers the whole cluster).
//!
//! Forwards opened with an SSH session token have two more caps, as in the
//! public protocol: [`SSH_SESSION_FORWARDS`] per token and
//! [`SSH_SANDBOX_FORWARDS`] per sandbox (counted among its relays too).
//!
//! A relay takes its slot before `RelayOpen` goes to the supervisor and
//! gives it back when it ends, however it ends; an open over the cap is
//! refused with RESOURCE_EXHAUSTED naming the count and the limit, and no
//! supervisor ever hears of it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tonic::Status;

/// Default of `--max-execs-per-sandbox`.
pub const DEFAULT_EXECS: u32 = 256;
/// Default of `--max-relays-per-sandbox` (execs and forwards together).
pub const DEFAULT_RELAYS: u32 = 512;
/// Concurrent forwards of one SSH session token.
pub const SSH_SESSION_FORWARDS: u32 = 3;
/// Concurrent forwards of one sandbox opened with SSH session tokens.
pub const SSH_SANDBOX_FORWARDS: u32 = 20;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Open {
    execs: u32,
    relays: u32,
    /// Forwards opened with an SSH session token.
    ssh: u32,
}

type OpenBySandbox = Arc<Mutex<HashMap<String, Open>>>;
type OpenBySession = Arc<Mutex<HashMap<String, u32>>>;

pub struct RelayCaps {
    limits: Mutex<Open>,
    open: OpenBySandbox,
    /// Open forwards per SSH session (by token hash).
    sessions: OpenBySession,
}

impl Default for RelayCaps {
    fn default() -> Self {
        Self::new(DEFAULT_EXECS, DEFAULT_RELAYS)
    }
}

impl RelayCaps {
    pub fn new(max_execs: u32, max_relays: u32) -> Self {
        Self {
            limits: Mutex::new(Open {
                execs: max_execs,
                relays: max_relays,
                ssh: SSH_SANDBOX_FORWARDS,
            }),
            open: Arc::default(),
            sessions: Arc::default(),
        }
    }

    pub fn set_limits(&self, max_execs: u32, max_relays: u32) {
        *self.limits.lock().unwrap() = Open {
            execs: max_execs,
            relays: max_relays,
            ssh: SSH_SANDBOX_FORWARDS,
        };
    }

    /// Takes a slot for one more relay of `sandbox_id` (`exec`: an exec
    /// relay, else a forward; `ssh_session`: a forward opened with that SSH
    /// session, by token hash), or says which limit is reached.
    pub fn reserve(
        &self,
        sandbox_id: &str,
        exec: bool,
        ssh_session: Option<&str>,
    ) -> Result<CapSlot, Status> {
        let limits = *self.limits.lock().unwrap();
        let mut open = self.open.lock().unwrap();
        let mut sessions = self.sessions.lock().unwrap();
        let session_count = ssh_session.map_or(0, |s| sessions.get(s).copied().unwrap_or(0));
        let count = open.entry(sandbox_id.to_owned()).or_default();
        let refusal = if exec && count.execs >= limits.execs {
            Some(format!(
                "sandbox {sandbox_id} has {} open execs (limit {})",
                count.execs, limits.execs
            ))
        } else if count.relays >= limits.relays {
            Some(format!(
                "sandbox {sandbox_id} has {} open relays (limit {})",
                count.relays, limits.relays
            ))
        } else if ssh_session.is_some() && session_count >= SSH_SESSION_FORWARDS {
            Some(format!(
                "this SSH session has {session_count} open forwards (limit {SSH_SESSION_FORWARDS})"
            ))
        } else if ssh_session.is_some() && count.ssh >= limits.ssh {
            Some(format!(
                "sandbox {sandbox_id} has {} open SSH session forwards (limit {})",
                count.ssh, limits.ssh
            ))
        } else {
            None
        };
        if let Some(message) = refusal {
            if *count == Open::default() {
                open.remove(sandbox_id);
            }
            return Err(Status::resource_exhausted(message));
        }
        count.relays += 1;
        if exec {
            count.execs += 1;
        }
        if let Some(session) = ssh_session {
            count.ssh += 1;
            *sessions.entry(session.to_owned()).or_default() += 1;
        }
        Ok(CapSlot {
            open: self.open.clone(),
            sessions: self.sessions.clone(),
            sandbox_id: sandbox_id.to_owned(),
            exec,
            ssh_session: ssh_session.map(str::to_owned),
        })
    }
}

/// One relay's place under its sandbox's caps, given back when dropped.
#[derive(Debug)]
pub struct CapSlot {
    open: OpenBySandbox,
    sessions: OpenBySession,
    sandbox_id: String,
    exec: bool,
    ssh_session: Option<String>,
}

impl Drop for CapSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap();
        if let Some(session) = &self.ssh_session {
            let mut sessions = self.sessions.lock().unwrap();
            if let Some(n) = sessions.get_mut(session) {
                *n -= 1;
                if *n == 0 {
                    sessions.remove(session);
                }
            }
        }
        if let Some(count) = open.get_mut(&self.sandbox_id) {
            count.relays -= 1;
            if self.exec {
                count.execs -= 1;
            }
            if self.ssh_session.is_some() {
                count.ssh -= 1;
            }
            if *count == Open::default() {
                open.remove(&self.sandbox_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RelayCaps;

    #[test]
    fn slots_are_given_back_and_each_limit_is_named() {
        let caps = RelayCaps::new(2, 3);
        let first = caps.reserve("s", true, None).unwrap();
        let _second = caps.reserve("s", true, None).unwrap();
        let refused = caps.reserve("s", true, None).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(refused.message(), "sandbox s has 2 open execs (limit 2)");
        let _forward = caps.reserve("s", false, None).unwrap();
        let refused = caps.reserve("s", false, None).unwrap_err();
        assert_eq!(refused.message(), "sandbox s has 3 open relays (limit 3)");
        // Another sandbox has its own count.
        let _other = caps.reserve("t", true, None).unwrap();
        drop(first);
        assert!(caps.reserve("s", false, None).is_ok());
        assert!(caps.open.lock().unwrap().contains_key("s"));
    }

    #[test]
    fn ssh_sessions_have_their_own_caps() {
        let caps = RelayCaps::new(10, 100);
        let slots: Vec<_> = (0..super::SSH_SESSION_FORWARDS)
            .map(|_| caps.reserve("s", false, Some("a")).unwrap())
            .collect();
        let refused = caps.reserve("s", false, Some("a")).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            refused.message(),
            "this SSH session has 3 open forwards (limit 3)"
        );
        // Tokenless forwards and other sessions are not held back.
        let _plain = caps.reserve("s", false, None).unwrap();
        let mut others = Vec::new();
        for n in 0..(super::SSH_SANDBOX_FORWARDS - super::SSH_SESSION_FORWARDS) {
            others.push(caps.reserve("s", false, Some(&format!("t{n}"))).unwrap());
        }
        let refused = caps.reserve("s", false, Some("z")).unwrap_err();
        assert_eq!(
            refused.message(),
            "sandbox s has 20 open SSH session forwards (limit 20)"
        );
        drop(slots);
        assert!(caps.reserve("s", false, Some("a")).is_ok());
        drop(others);
        assert!(caps.sessions.lock().unwrap().is_empty());
    }

    #[test]
    fn counts_go_away_with_their_last_slot() {
        let caps = RelayCaps::new(1, 1);
        drop(caps.reserve("s", true, None).unwrap());
        assert!(caps.open.lock().unwrap().is_empty());
        caps.set_limits(0, 0);
        assert!(caps.reserve("s", false, None).is_err());
        assert!(caps.open.lock().unwrap().is_empty());
    }
}
