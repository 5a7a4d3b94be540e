//! Supervisor host sessions held by this replica (`ConnectHost`,
//! PROTOCOL.md section 4): one entry per host, with the queue its stream
//! drains and its close signal. The sessions of the host's sandboxes are
//! ordinary entries of [`super::Sessions`] whose supervisor stream is the
//! host's; they are not redirectable, so neither shutdown nor `send_home`
//! moves them one by one: they move with their host.
//!
//! Assignment changes made here (a sandbox created on or deleted from a
//! host) are announced on [`HostSessions::changes`], so each host's task
//! re-reads its assignment at once instead of on its next tick.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use openshell_proto::supervisor_host::{HostGatewayMessage, HostRedirect, host_gateway_message};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::metrics::Metrics;
use crate::sessions::{is_stale, stale_status};

/// A host seat not renewed for this long (database time) is free: the
/// host no longer counts for placement and gets no new sandboxes.
pub const HOST_TTL: std::time::Duration = std::time::Duration::from_secs(20);

pub type HostOutbound = mpsc::Sender<Result<HostGatewayMessage, Status>>;

struct HostEntry {
    session_id: String,
    /// The host instance and connection attempt that opened it.
    instance_id: String,
    epoch: u64,
    tx: HostOutbound,
    closed: CancellationToken,
    /// Sandboxes in the assignment last sent.
    assigned: usize,
}

pub struct HostSessions {
    hosts: Mutex<HashMap<String, HostEntry>>,
    changes: watch::Sender<u64>,
    shutting_down: AtomicBool,
    metrics: Arc<Metrics>,
}

impl HostSessions {
    pub fn new(metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            hosts: Mutex::new(HashMap::new()),
            changes: watch::channel(0).0,
            shutting_down: AtomicBool::new(false),
            metrics,
        })
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Refuses a hello from an attempt older than the live session of the
    /// same host instance here ([`crate::sessions::is_stale`]).
    pub fn refuse_stale(&self, host_id: &str, instance_id: &str, epoch: u64) -> Result<(), Status> {
        match self.hosts.lock().unwrap().get(host_id) {
            Some(live) if is_stale((&live.instance_id, live.epoch), instance_id, epoch) => {
                Err(stale_status(epoch, live.epoch))
            }
            _ => Ok(()),
        }
    }

    /// Registers a host's accepted session; an older session of the same
    /// host here is closed. A hello from an attempt older than the live
    /// session of the same host instance is refused instead.
    pub fn register(
        &self,
        host_id: &str,
        session_id: &str,
        (instance_id, epoch): (&str, u64),
        tx: HostOutbound,
        closed: CancellationToken,
    ) -> Result<(), Status> {
        if self.is_shutting_down() {
            return Err(Status::unavailable("gateway is shutting down"));
        }
        let previous = {
            let mut hosts = self.hosts.lock().unwrap();
            if let Some(live) = hosts.get(host_id)
                && is_stale((&live.instance_id, live.epoch), instance_id, epoch)
            {
                return Err(stale_status(epoch, live.epoch));
            }
            hosts.insert(
                host_id.to_owned(),
                HostEntry {
                    session_id: session_id.to_owned(),
                    instance_id: instance_id.to_owned(),
                    epoch,
                    tx,
                    closed,
                    assigned: 0,
                },
            )
        };
        match previous {
            Some(old) => old.closed.cancel(),
            None => {
                self.metrics.supervisor_hosts.inc();
            }
        }
        self.update_max();
        Ok(())
    }

    /// Removes the host's entry if it is still this session's.
    pub fn unregister(&self, host_id: &str, session_id: &str) {
        let mut hosts = self.hosts.lock().unwrap();
        if hosts
            .get(host_id)
            .is_some_and(|h| h.session_id == session_id)
        {
            hosts.remove(host_id);
            drop(hosts);
            self.metrics.supervisor_hosts.dec();
            self.update_max();
        }
    }

    /// Records how many sandboxes the host's last assignment held.
    pub fn set_assigned(&self, host_id: &str, session_id: &str, assigned: usize) {
        if let Some(entry) = self.hosts.lock().unwrap().get_mut(host_id)
            && entry.session_id == session_id
        {
            entry.assigned = assigned;
        }
        self.update_max();
    }

    fn update_max(&self) {
        let max = self
            .hosts
            .lock()
            .unwrap()
            .values()
            .map(|h| h.assigned)
            .max()
            .unwrap_or(0);
        self.metrics.supervisor_host_instances_max.set(max as i64);
    }

    /// Announces that some host's assignment changed.
    pub fn assignment_changed(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Refuses new host sessions and returns the hosts held here, for the
    /// shutdown hand-off.
    pub fn begin_shutdown(&self) -> Vec<String> {
        self.shutting_down.store(true, Ordering::SeqCst);
        let mut ids: Vec<String> = self.hosts.lock().unwrap().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Ends one host's session with `redirect` (when given). Returns whether
    /// the redirect was queued.
    pub fn end(&self, host_id: &str, redirect: Option<HostRedirect>) -> bool {
        let hosts = self.hosts.lock().unwrap();
        let Some(entry) = hosts.get(host_id) else {
            return false;
        };
        let mut sent = false;
        if let Some(redirect) = redirect {
            let message = HostGatewayMessage {
                payload: Some(host_gateway_message::Payload::Redirect(redirect)),
            };
            // A full queue is a host that is not reading; it comes back
            // through the shared address instead.
            sent = entry.tx.try_send(Ok(message)).is_ok();
        }
        entry.closed.cancel();
        sent
    }

    /// Closes every host session still held.
    pub fn close_all(&self) {
        for entry in self.hosts.lock().unwrap().values() {
            entry.closed.cancel();
        }
    }
}
