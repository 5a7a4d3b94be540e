//! Sessions leaving this replica on purpose: all at once on shutdown or
//! when the replica is fenced, and one by one when idle and held off their
//! ring owner. Each may be sent a `SessionRedirect` first.

use std::sync::atomic::Ordering;
use std::time::Duration;

use openshell_proto::{GatewayMessage, SessionRedirect, gateway_message};

use super::Sessions;

impl Sessions {
    /// Refuses new sessions, sends each held session that can follow one the
    /// redirect `redirect_for` computes, and closes every session. Returns
    /// how many redirects were sent.
    pub fn shutdown(&self, redirect_for: impl Fn(&str) -> Option<SessionRedirect>) -> usize {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.end_all(redirect_for)
    }

    /// A fenced replica (its membership lapsed) hands every session off:
    /// like [`Sessions::shutdown`], but new sessions stay allowed (the
    /// fence stops the listener instead, until membership is back), and
    /// each end is a hand-off, not a lost supervisor.
    pub fn hand_off_all(&self, redirect_for: impl Fn(&str) -> Option<SessionRedirect>) -> usize {
        for session in self.sessions.lock().unwrap().values() {
            session.moving.store(true, Ordering::SeqCst);
        }
        self.end_all(redirect_for)
    }

    fn end_all(&self, redirect_for: impl Fn(&str) -> Option<SessionRedirect>) -> usize {
        let mut sent = 0;
        for (sandbox_id, session) in self.sessions.lock().unwrap().iter() {
            if session.supports_redirect
                && let Some(redirect) = redirect_for(sandbox_id)
            {
                let message = GatewayMessage {
                    payload: Some(gateway_message::Payload::SessionRedirect(redirect)),
                };
                // A full queue means a supervisor that is not reading; it
                // reconnects through the edge instead.
                if session.tx.try_send(Ok(message)).is_ok() {
                    sent += 1;
                }
            }
            session.closed.cancel();
        }
        sent
    }

    /// Sends idle sessions home: each session held here for at least
    /// `min_age`, with no relay open (moving would cut its streams), whose
    /// supervisor can follow a redirect and for which `redirect_for` names
    /// another replica (its live ring owner), is redirected there. This is
    /// how sessions that a shutdown or an outage moved off their ring owner
    /// return once it is back. Returns how many were sent.
    pub fn send_home(
        &self,
        min_age: Duration,
        redirect_for: impl Fn(&str) -> Option<SessionRedirect>,
    ) -> usize {
        if self.is_shutting_down() {
            return 0;
        }
        let busy = self.busy.lock().unwrap().clone();
        let mut sent = 0;
        for (sandbox_id, session) in self.sessions.lock().unwrap().iter() {
            if !session.supports_redirect
                || session.accepted_at.elapsed() < min_age
                || busy.get(sandbox_id).is_some_and(|n| *n > 0)
            {
                continue;
            }
            let Some(redirect) = redirect_for(sandbox_id) else {
                continue;
            };
            let message = GatewayMessage {
                payload: Some(gateway_message::Payload::SessionRedirect(redirect)),
            };
            if session.tx.try_send(Ok(message)).is_ok() {
                session.moving.store(true, Ordering::SeqCst);
                session.closed.cancel();
                sent += 1;
            }
        }
        sent
    }
}
