//! The supervisor session: one long-lived `ConnectSupervisor` stream that
//! makes the gateway replica holding it this sandbox's owner.
//!
//! The protocol runs in sdk-core's
//! [`ConfigSession`](openshell_sdk::ConfigSession): hello (with
//! `supports_config_push` and `supports_session_redirect`), heartbeats,
//! redirects followed at once with `redirected` set, reconnects with a
//! backoff of 1 s doubling to 30 s (reset whenever a session was accepted),
//! and configuration: pushed over the session when the gateway pushes,
//! polled every 10 s when it does not, applied either way by
//! [`config_apply`](crate::config_apply).
//!
//! This module serves the relays the gateway announces on that session:
//! TCP (`forward`), exec (`exec`), SFTP (`sftp_relay`) and SSH (`ssh`, also
//! a relay without a target, as in the public protocol). It serves one sandbox; the caller
//! provides the session: a `ConfigSession` of its own on the sandbox's
//! connection (per-sandbox mode) or a sandbox session inside a host's
//! session (host mode, see the `host` module).
//!
//! How long a relay lives is the caller's choice ([`RelayScope`]). A
//! per-sandbox supervisor ties relays to the session that announced them:
//! when the session ends, for whatever reason, every relay it started is
//! cancelled (processes are killed, sockets closed). A host does not: its
//! session may move to another replica while the sandbox's processes and
//! streams go on, so a relay ends with its stream, a `relay_close`, or when
//! the caller drops [`run`] (the sandbox is unassigned or the host stops).
//! Relay claims ride the connection of the session that announced them and,
//! through an edge, carry the replica that holds that session.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;

use openshell_proto::{RelayOpen, gateway_message, relay_open};
use openshell_sdk::{ConfigSessionBuilder, SessionEvent};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};

use crate::exec::{self, ExecSettings};
use crate::forward;
use crate::relay::{self, RelayContext};
use crate::sftp_relay;
use crate::ssh::HostKey;
use crate::transport::{self, BearerToken};

/// Session events buffered between the protocol task and the relay loop.
const SESSION_EVENTS: usize = 64;

/// What ends a relay besides its own stream and `relay_close`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayScope {
    /// The end of the session that announced it (per-sandbox mode).
    Session,
    /// Only the end of [`run`] (host mode).
    Runtime,
}

/// One sandbox as its relays see it, fixed while it is served.
pub struct SandboxServing {
    pub exec: Arc<ExecSettings>,
    /// The embedded SSH server's key; `None` refuses SSH relays.
    pub ssh_host_key: Option<HostKey>,
    /// Bearer of relay claims: the sandbox token, or the host token.
    pub token: BearerToken,
    pub relay_scope: RelayScope,
}

/// Serves `sandbox` on the session `session` builds, until the protocol
/// fails to start or this future is dropped. The session gets the SSH host
/// key fingerprint, the config applier and the session events here.
/// `alive` is handed to every relay, so the caller can wait for all relays
/// to wind down after dropping this future. `connected` is true while a
/// session is accepted.
pub async fn run(
    sandbox: &SandboxServing,
    session: ConfigSessionBuilder,
    alive: mpsc::Sender<()>,
    connected: watch::Sender<bool>,
) -> anyhow::Result<()> {
    let (events_tx, mut events) = mpsc::channel(SESSION_EVENTS);
    let session = session
        .ssh_host_key_fingerprint(
            sandbox
                .ssh_host_key
                .as_ref()
                .map(HostKey::fingerprint)
                .unwrap_or_default(),
        )
        .apply(crate::config_apply::applier(sandbox.exec.clone()))
        .session_events(events_tx)
        .build()?;
    // Dropping this future stops the protocol task too.
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    let protocol = session.run(cancel);
    let per_session = sandbox.relay_scope == RelayScope::Session;
    let relays = async {
        // Dropped when this future is (and, per session, on every session
        // end), which cancels the relays it holds.
        let mut relays = Relays::default();
        let mut ctx: Option<RelayContext> = None;
        while let Some(event) = events.recv().await {
            match event {
                SessionEvent::Accepted(handle) => {
                    connected.send_replace(true);
                    if per_session {
                        relays = Relays::default();
                    }
                    ctx = Some(RelayContext {
                        channel: handle.client.channel(),
                        replica: handle.served_by,
                        token: sandbox.token.clone(),
                        session: handle.outbound,
                        alive: alive.clone(),
                    });
                }
                SessionEvent::Message(message) => match (message.payload, &ctx) {
                    (Some(gateway_message::Payload::RelayOpen(open)), Some(ctx)) => relays.open(
                        open,
                        ctx.clone(),
                        sandbox.exec.clone(),
                        sandbox.ssh_host_key.clone(),
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
                    if per_session {
                        relays = Relays::default();
                    }
                    ctx = None;
                }
            }
        }
        // The protocol task is gone; its result says why.
        std::future::pending::<()>().await;
    };
    tokio::select! {
        result = protocol => result?,
        _ = relays => {}
    }
    Ok(())
}

/// The relays of one session, by channel id: for each, the sender that
/// cancels it when used or dropped. A relay's task is detached, so its
/// memory (several KiB of future) is freed as soon as it ends, not when the
/// next relay opens; its receiver goes with it, which is how a finished
/// relay is told from a running one.
#[derive(Default)]
struct Relays {
    running: HashMap<String, oneshot::Sender<()>>,
}

impl Relays {
    fn open(
        &mut self,
        open: RelayOpen,
        ctx: RelayContext,
        exec: Arc<ExecSettings>,
        ssh: Option<HostKey>,
    ) {
        self.running.retain(|_, cancel| !cancel.is_closed());
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
        // Boxed before it is spawned: the relay's future (several KiB) is
        // moved into place once, not copied down the spawn calls' frames,
        // which would leave every runtime thread with that much more stack
        // touched for good.
        tokio::spawn(Box::pin(
            async move {
                let cancelled = async {
                    let _ = cancelled.await;
                };
                serve_relay(open, ctx, exec, ssh, cancelled).await;
                debug!("relay finished");
            }
            .instrument(span),
        ));
        self.running.insert(channel_id, cancel);
    }

    fn close(&mut self, channel_id: &str) {
        if let Some(cancel) = self.running.remove(channel_id) {
            let _ = cancel.send(());
        }
    }
}

/// Runs one announced relay until it ends or `cancel` resolves.
async fn serve_relay(
    open: RelayOpen,
    ctx: RelayContext,
    exec: Arc<ExecSettings>,
    ssh: Option<HostKey>,
    cancel: impl Future<Output = ()>,
) {
    let channel_id = open.channel_id;
    let mut cancel = pin!(cancel);
    match open.target {
        Some(relay_open::Target::Tcp(target)) => {
            forward::run(
                &ctx,
                &channel_id,
                target,
                exec.sandbox_init.as_ref(),
                cancel,
            )
            .await;
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
        Some(relay_open::Target::Sftp(_)) => {
            sftp_relay::run(&ctx, &channel_id, exec, cancel).await;
        }
        // The public protocol: no target means SSH.
        Some(relay_open::Target::Ssh(target)) => {
            crate::ssh::run(
                &ctx,
                &channel_id,
                ssh.as_ref(),
                exec,
                target.environment,
                cancel,
            )
            .await;
        }
        None => {
            crate::ssh::run(
                &ctx,
                &channel_id,
                ssh.as_ref(),
                exec,
                HashMap::new(),
                cancel,
            )
            .await;
        }
    }
}
