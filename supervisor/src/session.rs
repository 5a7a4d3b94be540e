//! The supervisor session: one long-lived `ConnectSupervisor` stream that
//! makes the gateway replica holding it this sandbox's owner.
//!
//! The protocol runs in sdk-core's [`ConfigSession`]: hello (with
//! `supports_config_push` and `supports_session_redirect`), heartbeats,
//! redirects followed at once with `redirected` set, reconnects with a
//! backoff of 1 s doubling to 30 s (reset whenever a session was accepted),
//! and configuration: pushed over the session when the gateway pushes,
//! polled every 10 s when it does not, applied either way by
//! [`config_apply`](crate::config_apply).
//!
//! This module serves the relays the gateway announces on that session:
//! TCP (`forward`), exec (`exec`) and SSH (`ssh`, also a relay without a
//! target, as in the public protocol).
//! Relays belong to the session that announced them: when the session ends,
//! for whatever reason, every relay it started is cancelled (processes are
//! killed, sockets closed). Relay claims ride the session's connection and,
//! through an edge, carry the replica that holds the session.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;

use openshell_proto::{RelayOpen, gateway_message, relay_open};
use openshell_sdk::{ClientConfig, ConfigSession, SessionEvent};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};

use crate::exec::{self, ExecSettings};
use crate::forward;
use crate::relay::{self, RelayContext};
use crate::transport::{self, BearerToken};

/// Session events buffered between the protocol task and the relay loop.
const SESSION_EVENTS: usize = 64;

/// Everything the session needs, fixed for the life of the process.
pub struct SessionConfig {
    /// The configured gateway (`--gateway`), with the sandbox token.
    pub client: ClientConfig,
    pub sandbox_id: String,
    pub instance_id: String,
    pub token: BearerToken,
    pub exec: Arc<ExecSettings>,
    /// Reported in the hello; empty without an SSH server.
    pub ssh_host_key_fingerprint: String,
    /// The embedded SSH server's settings (host key included); `None`
    /// refuses SSH relays.
    pub ssh_server: Option<Arc<russh::server::Config>>,
}

/// Runs the session forever. `alive` is handed to every relay, so the
/// caller can wait for all relays to wind down after dropping this future.
/// `connected` is true while a session is accepted.
pub async fn run(
    config: SessionConfig,
    alive: mpsc::Sender<()>,
    connected: watch::Sender<bool>,
) -> anyhow::Result<()> {
    let (events_tx, mut events) = mpsc::channel(SESSION_EVENTS);
    let session = ConfigSession::builder(config.client.clone(), config.sandbox_id.clone())
        .instance_id(config.instance_id.clone())
        .ssh_host_key_fingerprint(config.ssh_host_key_fingerprint.clone())
        .apply(crate::config_apply::applier(config.exec.clone()))
        .session_events(events_tx)
        .build()?;
    // Dropping this future stops the protocol task too.
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    let protocol = session.run(cancel);
    let relays = async {
        // Dropped on every session end, which cancels that session's relays.
        let mut relays = Relays::default();
        let mut ctx: Option<RelayContext> = None;
        while let Some(event) = events.recv().await {
            match event {
                SessionEvent::Accepted(handle) => {
                    connected.send_replace(true);
                    relays = Relays::default();
                    ctx = Some(RelayContext {
                        channel: handle.client.channel(),
                        replica: handle.served_by,
                        token: config.token.clone(),
                        session: handle.outbound,
                        alive: alive.clone(),
                    });
                }
                SessionEvent::Message(message) => match (message.payload, &ctx) {
                    (Some(gateway_message::Payload::RelayOpen(open)), Some(ctx)) => relays.open(
                        open,
                        ctx.clone(),
                        config.exec.clone(),
                        config.ssh_server.clone(),
                    ),
                    (Some(gateway_message::Payload::RelayClose(close)), _) => {
                        debug!(
                            channel_id = close.channel_id,
                            reason = close.reason,
                            "relay closed by the gateway"
                        );
                        relays.close(&close.channel_id);
                    }
                    _ => {}
                },
                SessionEvent::Ended => {
                    connected.send_replace(false);
                    relays = Relays::default();
                    ctx = None;
                }
            }
        }
    };
    tokio::select! {
        result = protocol => result?,
        _ = relays => {}
    }
    Ok(())
}

struct RunningRelay {
    /// Sending, or dropping, cancels the relay.
    cancel: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// The relays of one session, by channel id.
#[derive(Default)]
struct Relays {
    running: HashMap<String, RunningRelay>,
}

impl Relays {
    fn open(
        &mut self,
        open: RelayOpen,
        ctx: RelayContext,
        exec: Arc<ExecSettings>,
        ssh: Option<Arc<russh::server::Config>>,
    ) {
        self.running.retain(|_, relay| !relay.task.is_finished());
        let channel_id = open.channel_id.clone();
        if self.running.contains_key(&channel_id) {
            warn!(
                channel_id,
                "ignoring a second relay_open for a running relay"
            );
            return;
        }
        debug!(channel_id, "relay opened");
        let (cancel, cancelled) = oneshot::channel::<()>();
        let span = info_span!("relay", channel_id);
        let task = tokio::spawn(
            async move {
                let cancelled = async {
                    let _ = cancelled.await;
                };
                serve_relay(open, ctx, exec, ssh, cancelled).await;
                debug!("relay finished");
            }
            .instrument(span),
        );
        self.running
            .insert(channel_id, RunningRelay { cancel, task });
    }

    fn close(&mut self, channel_id: &str) {
        if let Some(relay) = self.running.remove(channel_id) {
            let _ = relay.cancel.send(());
        }
    }
}

/// Runs one announced relay until it ends or `cancel` resolves.
async fn serve_relay(
    open: RelayOpen,
    ctx: RelayContext,
    exec: Arc<ExecSettings>,
    ssh: Option<Arc<russh::server::Config>>,
    cancel: impl Future<Output = ()>,
) {
    let channel_id = open.channel_id;
    let mut cancel = pin!(cancel);
    match open.target {
        Some(relay_open::Target::Tcp(target)) => {
            forward::run(&ctx, &channel_id, target, cancel).await;
        }
        Some(relay_open::Target::Exec(request)) => {
            let claimed = tokio::select! {
                _ = cancel.as_mut() => return,
                claimed = relay::claim(&ctx, &channel_id) => claimed,
            };
            let claimed = match claimed {
                Ok(claimed) => claimed,
                Err(status) => {
                    warn!(channel_id, error = %transport::describe_status(&status), "claiming exec relay failed");
                    relay::report_failure(
                        &ctx,
                        &channel_id,
                        format!("claim relay: {}", transport::describe_status(&status)),
                    )
                    .await;
                    return;
                }
            };
            exec::run(request, &exec, claimed.out, claimed.inbound, cancel).await;
        }
        // The public protocol: no target means SSH.
        Some(relay_open::Target::Ssh(target)) => {
            crate::ssh::run(&ctx, &channel_id, ssh, exec, target.environment, cancel).await;
        }
        None => {
            crate::ssh::run(&ctx, &channel_id, ssh, exec, HashMap::new(), cancel).await;
        }
    }
}
