//! The supervisor session: one long-lived `ConnectSupervisor` stream that
//! makes the gateway replica holding it this sandbox's owner.
//!
//! The loop here never gives up: a lost or rejected session is retried with
//! [`Backoff`], reset whenever a session was accepted. A `SessionRedirect`
//! (the replica is not the sandbox's ring owner, or it is stopping) is
//! followed at once to the named peer with `redirected` set; if that peer
//! cannot be reached the next attempt falls back to the configured gateway.
//!
//! Relays belong to the session that announced them: when the session ends,
//! for whatever reason, every relay it started is cancelled (processes are
//! killed, sockets closed). Each connect attempt gets a new
//! `connection_epoch`; the `instance_id` stays fixed for the process.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::{
    GatewayMessage, RelayOpen, SupervisorHeartbeat, SupervisorHello, SupervisorMessage,
    gateway_message, supervisor_message,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Interval, MissedTickBehavior};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::backoff::Backoff;
use crate::exec::ExecSettings;
use crate::relay::{self, RelayContext};
use crate::transport::{self, BearerToken, TlsSettings};

/// Response metadata naming the replica that answered.
const SERVED_BY: &str = "x-openshell-served-by";

/// Messages buffered towards the gateway (heartbeats, relay results).
const OUTBOUND_MESSAGES: usize = 64;
/// Heartbeats never go out more often than this.
const MIN_HEARTBEAT: Duration = Duration::from_secs(5);
const MAX_HEARTBEAT: Duration = Duration::from_secs(3600);
/// Redirects followed back to back without an accepted session before the
/// next one waits for the backoff (guards against a redirect loop).
const MAX_IMMEDIATE_REDIRECTS: u32 = 4;

/// Everything the session needs, fixed for the life of the process.
pub struct SessionConfig {
    /// The configured gateway URL (`--gateway`).
    pub gateway: String,
    pub sandbox_id: String,
    pub instance_id: String,
    pub token: BearerToken,
    pub tls: TlsSettings,
    pub exec: Arc<ExecSettings>,
}

/// How one connect attempt ended.
#[derive(Debug, PartialEq, Eq)]
enum AttemptEnd {
    Lost { accepted: bool },
    Rejected { accepted: bool },
    Redirect { peer: String, accepted: bool },
}

/// Where the next attempt goes.
enum Target {
    Gateway,
    Peer(String),
}

/// Runs the session loop forever. `alive` is handed to every relay, so the
/// caller can wait for all relays to wind down after dropping this future.
pub async fn run(config: SessionConfig, home: Channel, alive: mpsc::Sender<()>) {
    let mut session = Session {
        config,
        home,
        peer: None,
        epoch: 0,
        backoff: Backoff::reconnect(),
        alive,
    };
    session.run().await
}

struct Session {
    config: SessionConfig,
    /// Channel to `--gateway`, reused across attempts.
    home: Channel,
    /// Channel to the last redirect target, reused if redirected there again.
    peer: Option<(String, Channel)>,
    epoch: u64,
    backoff: Backoff,
    alive: mpsc::Sender<()>,
}

impl Session {
    async fn run(&mut self) {
        let mut target = Target::Gateway;
        let mut redirected = false;
        let mut redirects_in_a_row = 0u32;
        loop {
            let (url, channel) = match &target {
                Target::Gateway => (self.config.gateway.clone(), self.home.clone()),
                Target::Peer(url) => match self.peer_channel(url) {
                    Ok(channel) => (url.clone(), channel),
                    Err(err) => {
                        warn!(peer = url, error = %format!("{err:#}"), "cannot follow redirect");
                        target = Target::Gateway;
                        self.wait_backoff().await;
                        continue;
                    }
                },
            };
            self.epoch += 1;
            let end = self.attempt(&url, channel, redirected).await;
            target = match end {
                AttemptEnd::Redirect { peer, accepted } => {
                    if accepted {
                        redirects_in_a_row = 0;
                    }
                    redirects_in_a_row += 1;
                    redirected = true;
                    if redirects_in_a_row > MAX_IMMEDIATE_REDIRECTS {
                        self.wait_backoff().await;
                    }
                    Target::Peer(peer)
                }
                AttemptEnd::Lost { accepted } | AttemptEnd::Rejected { accepted } => {
                    if accepted {
                        redirected = false;
                    }
                    redirects_in_a_row = 0;
                    self.wait_backoff().await;
                    Target::Gateway
                }
            };
        }
    }

    async fn wait_backoff(&mut self) {
        let delay = self.backoff.next_delay();
        debug!(
            delay_ms = delay.as_millis() as u64,
            "reconnecting after backoff"
        );
        tokio::time::sleep(delay).await;
    }

    fn peer_channel(&mut self, url: &str) -> anyhow::Result<Channel> {
        if let Some((known, channel)) = &self.peer
            && known == url
        {
            return Ok(channel.clone());
        }
        let channel = transport::channel(url, &self.config.tls)?;
        self.peer = Some((url.to_owned(), channel.clone()));
        Ok(channel)
    }

    fn hello(&self, redirected: bool) -> SupervisorMessage {
        SupervisorMessage {
            payload: Some(supervisor_message::Payload::Hello(SupervisorHello {
                sandbox_id: self.config.sandbox_id.clone(),
                instance_id: self.config.instance_id.clone(),
                connection_epoch: self.epoch,
                supports_provider_readiness: false,
                redirected,
                supports_session_redirect: true,
            })),
        }
    }

    /// One connect attempt, running until the session ends.
    async fn attempt(&mut self, url: &str, channel: Channel, redirected: bool) -> AttemptEnd {
        let span = info_span!("session", gateway = url, epoch = self.epoch);
        self.attempt_inner(channel, redirected)
            .instrument(span)
            .await
    }

    async fn attempt_inner(&mut self, channel: Channel, redirected: bool) -> AttemptEnd {
        let (tx, rx) = mpsc::channel(OUTBOUND_MESSAGES);
        tx.try_send(self.hello(redirected))
            .expect("a fresh channel has room for hello");
        let mut client = OpenShellClient::new(channel.clone());
        let request = self.config.token.request(ReceiverStream::new(rx));
        let served_by;
        let mut inbound = match client.connect_supervisor(request).await {
            Ok(response) => {
                // Through an edge, relay claims must reach the replica that
                // holds this session: pin them with the replica hint.
                served_by = response
                    .metadata()
                    .get(SERVED_BY)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                response.into_inner()
            }
            Err(status) => {
                warn!(error = %transport::describe_status(&status), "session connect failed");
                return AttemptEnd::Lost { accepted: false };
            }
        };
        debug!(redirected, "session stream open");

        let ctx = RelayContext {
            channel,
            replica: served_by,
            token: self.config.token.clone(),
            session: tx.clone(),
            exec: self.config.exec.clone(),
            alive: self.alive.clone(),
        };
        // Dropped when this attempt returns, which cancels every relay.
        let mut relays = Relays::default();
        let mut heartbeat: Option<Interval> = None;
        let mut accepted = false;
        loop {
            let message = tokio::select! {
                message = inbound.message() => message,
                _ = next_tick(&mut heartbeat) => {
                    let beat = SupervisorMessage {
                        payload: Some(supervisor_message::Payload::Heartbeat(SupervisorHeartbeat {})),
                    };
                    // A full queue already tells the gateway we are alive.
                    let _ = tx.try_send(beat);
                    continue;
                }
            };
            let payload = match message {
                Ok(Some(GatewayMessage {
                    payload: Some(payload),
                })) => payload,
                Ok(Some(_)) => continue,
                Ok(None) => {
                    info!(accepted, "session ended by the gateway");
                    return AttemptEnd::Lost { accepted };
                }
                Err(status) => {
                    warn!(accepted, error = %transport::describe_status(&status), "session lost");
                    return AttemptEnd::Lost { accepted };
                }
            };
            match payload {
                gateway_message::Payload::SessionAccepted(accept) => {
                    let period = heartbeat_period(accept.heartbeat_interval);
                    info!(
                        session_id = accept.session_id,
                        heartbeat_secs = period.as_secs_f64(),
                        "session accepted"
                    );
                    accepted = true;
                    self.backoff.reset();
                    let mut interval =
                        tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
                    heartbeat = Some(interval);
                }
                gateway_message::Payload::SessionRejected(reject) => {
                    warn!(reason = reject.reason, "session rejected");
                    return AttemptEnd::Rejected { accepted };
                }
                gateway_message::Payload::SessionRedirect(redirect) => {
                    if redirect.peer_endpoint.is_empty() {
                        warn!("redirect without a peer endpoint");
                        return AttemptEnd::Lost { accepted };
                    }
                    info!(
                        peer = redirect.peer_endpoint,
                        owner = redirect.owner_replica_id,
                        "session redirected"
                    );
                    return AttemptEnd::Redirect {
                        peer: redirect.peer_endpoint,
                        accepted,
                    };
                }
                gateway_message::Payload::Heartbeat(_) => {}
                gateway_message::Payload::RelayOpen(open) => relays.open(open, ctx.clone()),
                gateway_message::Payload::RelayClose(close) => {
                    debug!(
                        channel_id = close.channel_id,
                        reason = close.reason,
                        "relay closed by the gateway"
                    );
                    relays.close(&close.channel_id);
                }
            }
        }
    }
}

async fn next_tick(heartbeat: &mut Option<Interval>) {
    match heartbeat {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The advertised heartbeat interval, but never below 5 s (nor above an
/// hour, which keeps timer arithmetic sane whatever the gateway sends).
fn heartbeat_period(advertised: Option<prost_types::Duration>) -> Duration {
    let advertised = advertised
        .and_then(|d| {
            let seconds = Duration::from_secs(u64::try_from(d.seconds).ok()?);
            Some(seconds.saturating_add(Duration::from_nanos(u64::try_from(d.nanos).ok()?)))
        })
        .unwrap_or(MIN_HEARTBEAT);
    advertised.clamp(MIN_HEARTBEAT, MAX_HEARTBEAT)
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
    fn open(&mut self, open: RelayOpen, ctx: RelayContext) {
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
                relay::serve(open, ctx, cancelled).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn duration(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
        Some(prost_types::Duration { seconds, nanos })
    }

    #[test]
    fn heartbeat_is_never_faster_than_five_seconds() {
        assert_eq!(heartbeat_period(None), Duration::from_secs(5));
        assert_eq!(heartbeat_period(duration(1, 0)), Duration::from_secs(5));
        assert_eq!(heartbeat_period(duration(-3, 0)), Duration::from_secs(5));
        assert_eq!(heartbeat_period(duration(12, 0)), Duration::from_secs(12));
        assert_eq!(
            heartbeat_period(duration(7, 500_000_000)),
            Duration::from_millis(7500)
        );
        assert_eq!(
            heartbeat_period(duration(i64::MAX, 999_999_999)),
            Duration::from_secs(3600)
        );
    }
}
