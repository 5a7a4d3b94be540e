//! The session loop: one `ConnectSupervisor` attempt after another (hello,
//! accepted / rejected / redirected, heartbeats, pushed updates, relay
//! messages), with the reconnect backoff and redirect handling.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use openshell_proto::{
    ConfigUpdate, GatewayMessage, RelayOpenResult, SupervisorHeartbeat, SupervisorHello,
    SupervisorMessage, gateway_message, supervisor_message,
};
use prost::Message;
use tokio::sync::mpsc;

use super::{Backoff, CarriedSession, Carrier, DeliveryMode, Inner, SessionEvent, SessionHandle};
use crate::client::{CallOptions, Client};
use crate::error::Error;
use crate::metadata::{Metadata, SERVED_BY};
use crate::raw::{RawReceiver, RawSender};

const CONNECT_SUPERVISOR: &str = "/openshell.v1.OpenShell/ConnectSupervisor";
/// Heartbeats never go out more often than this.
const MIN_HEARTBEAT: Duration = Duration::from_secs(5);
const MAX_HEARTBEAT: Duration = Duration::from_secs(3600);
/// Redirects followed back to back without an accepted session before the
/// next one waits for the backoff (guards against a redirect loop).
const MAX_IMMEDIATE_REDIRECTS: u32 = 4;
/// Messages buffered towards the gateway (heartbeats, results, relay answers).
const OUTBOUND_MESSAGES: usize = 64;

/// How one connect attempt ended.
#[derive(Debug, PartialEq, Eq)]
enum AttemptEnd {
    Lost { accepted: bool },
    Rejected { accepted: bool },
    Redirect { peer: String, accepted: bool },
}

impl Inner {
    pub(super) async fn session_loop(self: &Arc<Self>, home: &Client) {
        if let Some(carrier) = self.carrier.clone() {
            return self.carried_loop(&*carrier).await;
        }
        let mut backoff = Backoff::reconnect();
        let mut epoch = 0u64;
        let mut target: Option<String> = None;
        let mut peer: Option<(String, Client)> = None;
        let mut redirected = false;
        let mut redirects_in_a_row = 0u32;
        loop {
            let client = match &target {
                None => home.clone(),
                Some(url) => match self.peer_client(&mut peer, url).await {
                    Ok(client) => client,
                    Err(err) => {
                        tracing::warn!(peer = url, error = %err, "cannot follow redirect");
                        target = None;
                        tokio::time::sleep(backoff.next_delay()).await;
                        continue;
                    }
                },
            };
            epoch += 1;
            let url = target
                .clone()
                .unwrap_or_else(|| self.config.endpoint().to_string());
            let end = self.attempt(&client, epoch, redirected, &mut backoff).await;
            tracing::debug!(gateway = url, epoch, ?end, "session attempt ended");
            target = match end {
                AttemptEnd::Redirect { peer, accepted } => {
                    if accepted {
                        redirects_in_a_row = 0;
                    }
                    redirects_in_a_row += 1;
                    redirected = true;
                    self.stats.lock().unwrap().redirects += 1;
                    if redirects_in_a_row > MAX_IMMEDIATE_REDIRECTS {
                        tokio::time::sleep(backoff.next_delay()).await;
                    }
                    Some(peer)
                }
                AttemptEnd::Lost { accepted } | AttemptEnd::Rejected { accepted } => {
                    if accepted {
                        redirected = false;
                    }
                    redirects_in_a_row = 0;
                    let delay = backoff.next_delay();
                    tracing::debug!(
                        delay_ms = delay.as_millis() as u64,
                        "reconnecting after backoff"
                    );
                    tokio::time::sleep(delay).await;
                    None
                }
            };
        }
    }

    async fn peer_client(
        &self,
        peer: &mut Option<(String, Client)>,
        url: &str,
    ) -> Result<Client, Error> {
        if let Some((known, client)) = peer
            && known == url
        {
            return Ok(client.clone());
        }
        let client = Client::connect_lazy(self.config.for_endpoint(url)?).await?;
        *peer = Some((url.to_owned(), client.clone()));
        Ok(client)
    }

    fn hello(&self, epoch: u64, redirected: bool) -> SupervisorMessage {
        SupervisorMessage {
            payload: Some(supervisor_message::Payload::Hello(SupervisorHello {
                sandbox_id: self.sandbox_id.clone(),
                instance_id: self.instance_id.clone(),
                connection_epoch: epoch,
                supports_provider_readiness: false,
                redirected,
                supports_session_redirect: true,
                supports_config_push: self.config_push,
                ssh_host_key_fingerprint: self.ssh_host_key_fingerprint.clone(),
            })),
        }
    }

    async fn emit(&self, event: SessionEvent) {
        if let Some(events) = &self.session_events {
            let _ = events.send(event).await;
        }
    }

    /// One connect attempt, running until the session ends.
    async fn attempt(
        self: &Arc<Self>,
        client: &Client,
        epoch: u64,
        redirected: bool,
        backoff: &mut Backoff,
    ) -> AttemptEnd {
        let opened = async {
            let mut stream = client
                .raw_stream(CONNECT_SUPERVISOR, Metadata::new(), CallOptions::new())
                .await?;
            stream
                .send(Bytes::from(self.hello(epoch, redirected).encode_to_vec()))
                .await?;
            let metadata = stream.response_metadata().await?;
            Ok::<_, Error>((stream, metadata))
        };
        let (stream, metadata) = match opened.await {
            Ok(opened) => opened,
            Err(err) => {
                tracing::warn!(error = %err, "session connect failed");
                return AttemptEnd::Lost { accepted: false };
            }
        };
        let served_by = metadata.get(SERVED_BY).map(str::to_owned);
        let (sender, receiver) = stream.split();
        self.serve(
            client,
            served_by,
            Wire::Direct { sender, receiver },
            backoff,
        )
        .await
    }

    /// The session loop of a sandbox served by a shared host: each attempt
    /// opens the sandbox's session inside the host's current session (it
    /// waits for one to be accepted). The host's own session does the
    /// connecting, redirects and backoff; a sandbox session that ends while
    /// the host's goes on (the gateway rejected or closed it) is retried
    /// after the usual backoff, cut short (and reset) when the host session
    /// ends: a stopping replica closes its sandbox sessions before it hands
    /// the host off, and the next host session must not inherit that wait.
    async fn carried_loop(self: &Arc<Self>, carrier: &dyn Carrier) {
        let mut backoff = Backoff::reconnect();
        let mut epoch = 0u64;
        loop {
            epoch += 1;
            let carried = carrier
                .open(self.sandbox_id.clone(), self.hello(epoch, false))
                .await;
            let host_ended = carried.carrier_ended.clone();
            let client = carried.client.clone();
            let served_by = carried.served_by.clone();
            let end = self
                .serve(&client, served_by, Wire::Carried(carried), &mut backoff)
                .await;
            tracing::debug!(epoch, ?end, "sandbox session inside the host session ended");
            // The gateway ended or refused this sandbox's session while the
            // host's went on: back off, but only as long as that host
            // session lasts. A new host session (the host moved) is a fresh
            // start: its first attempt goes out at once.
            tokio::select! {
                _ = tokio::time::sleep(backoff.next_delay()), if !host_ended.is_cancelled() => {}
                _ = host_ended.cancelled() => backoff.reset(),
            }
        }
    }

    /// Applies the updates sent to it one at a time, in order, answering
    /// each on `outbound`; stops when dropped. Updates are boxed: a channel
    /// allocates room for 32 messages up front.
    fn apply_worker(
        self: &Arc<Self>,
        outbound: mpsc::Sender<Box<SupervisorMessage>>,
    ) -> (mpsc::UnboundedSender<Box<ConfigUpdate>>, AbortOnDrop) {
        let (updates, mut updates_rx) = mpsc::unbounded_channel::<Box<ConfigUpdate>>();
        let this = self.clone();
        let worker = tokio::spawn(async move {
            while let Some(update) = updates_rx.recv().await {
                let result = this.applier.apply_update(&this, *update).await;
                let answer = SupervisorMessage {
                    payload: Some(supervisor_message::Payload::ConfigUpdateResult(result)),
                };
                if outbound.send(Box::new(answer)).await.is_err() {
                    return;
                }
            }
        });
        (updates, AbortOnDrop(worker))
    }

    /// Runs one opened session until it ends: acceptance, heartbeats,
    /// pushed updates, relay messages.
    async fn serve(
        self: &Arc<Self>,
        client: &Client,
        served_by: Option<String>,
        mut wire: Wire,
        backoff: &mut Backoff,
    ) -> AttemptEnd {
        // Everything towards the gateway goes through one queue.
        // Boxed: a channel allocates room for 32 messages up front.
        let (outbound, outbound_rx) = mpsc::channel::<Box<SupervisorMessage>>(OUTBOUND_MESSAGES);
        let _stop_pump = AbortOnDrop(wire.spawn_pump(outbound_rx));
        // Config updates are applied one at a time, in order, beside the
        // receive loop (relay opens are never held up by an apply), by a
        // worker started with the first update: a session that is only
        // polled (a host runs one per sandbox) never pays for one.
        let mut worker: Option<(mpsc::UnboundedSender<Box<ConfigUpdate>>, AbortOnDrop)> = None;
        let mut apply_in_order = |update: ConfigUpdate| {
            let (updates, _) = worker.get_or_insert_with(|| self.apply_worker(outbound.clone()));
            let _ = updates.send(Box::new(update));
        };

        let mut heartbeat: Option<tokio::time::Interval> = None;
        let mut accepted = false;
        let mut push = false;
        let end = loop {
            let message = tokio::select! {
                message = wire.recv() => message,
                _ = next_tick(&mut heartbeat) => {
                    let beat = SupervisorMessage {
                        payload: Some(supervisor_message::Payload::Heartbeat(SupervisorHeartbeat {})),
                    };
                    // A full queue already tells the gateway we are alive.
                    let _ = outbound.try_send(Box::new(beat));
                    continue;
                }
            };
            let payload = match message {
                Ok(Some(GatewayMessage {
                    payload: Some(payload),
                })) => payload,
                Ok(Some(_)) => continue,
                Ok(None) => {
                    tracing::info!(accepted, "session ended by the gateway");
                    break AttemptEnd::Lost { accepted };
                }
                Err(err) => {
                    tracing::warn!(accepted, error = %err, "session lost");
                    break AttemptEnd::Lost { accepted };
                }
            };
            match payload {
                gateway_message::Payload::SessionAccepted(accept) => {
                    let period = heartbeat_period(accept.heartbeat_interval);
                    push = accept.config_push_enabled;
                    tracing::info!(
                        session_id = accept.session_id,
                        heartbeat_secs = period.as_secs_f64(),
                        config_push = push,
                        "session accepted"
                    );
                    accepted = true;
                    backoff.reset();
                    let mut interval =
                        tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    heartbeat = Some(interval);
                    // One step under the stats lock, which a poll's end
                    // takes too: whoever sees the session accepted sees its
                    // mode, and a poll that ends from now on applies nothing.
                    self.set_mode_with(|stats| {
                        stats.sessions_accepted += 1;
                        stats.session_id = Some(accept.session_id.clone());
                        stats.served_by = served_by.clone();
                        if push {
                            self.pushing.send_replace(true);
                            Some(DeliveryMode::Push)
                        } else {
                            Some(DeliveryMode::Poll)
                        }
                    });
                    if push {
                        match accept.bootstrap {
                            Some(bootstrap) => {
                                apply_in_order(bootstrap);
                            }
                            None => tracing::warn!("push session accepted without a bootstrap"),
                        }
                    }
                    self.emit(SessionEvent::Accepted(Box::new(SessionHandle {
                        session_id: accept.session_id,
                        served_by: served_by.clone(),
                        client: client.clone(),
                        outbound: outbound.clone(),
                        config_push: push,
                    })))
                    .await;
                }
                gateway_message::Payload::SessionRejected(reject) => {
                    tracing::warn!(reason = reject.reason, "session rejected");
                    break AttemptEnd::Rejected { accepted };
                }
                gateway_message::Payload::SessionRedirect(redirect) => {
                    if redirect.peer_endpoint.is_empty() {
                        tracing::warn!("redirect without a peer endpoint");
                        break AttemptEnd::Lost { accepted };
                    }
                    tracing::info!(
                        peer = redirect.peer_endpoint,
                        owner = redirect.owner_replica_id,
                        "session redirected"
                    );
                    break AttemptEnd::Redirect {
                        peer: redirect.peer_endpoint,
                        accepted,
                    };
                }
                gateway_message::Payload::Heartbeat(_) => {}
                gateway_message::Payload::ConfigUpdate(update) => {
                    apply_in_order(update);
                }
                other @ (gateway_message::Payload::RelayOpen(_)
                | gateway_message::Payload::RelayClose(_)) => {
                    if self.session_events.is_some() {
                        self.emit(SessionEvent::Message(Box::new(GatewayMessage {
                            payload: Some(other),
                        })))
                        .await;
                    } else if let gateway_message::Payload::RelayOpen(open) = other {
                        let _ = outbound.try_send(Box::new(SupervisorMessage {
                            payload: Some(supervisor_message::Payload::RelayOpenResult(
                                RelayOpenResult {
                                    channel_id: open.channel_id,
                                    success: false,
                                    error: "this supervisor serves no relays".into(),
                                },
                            )),
                        }));
                    }
                }
            }
        };
        if push {
            self.pushing.send_replace(false);
            self.poll_now.notify_one();
        }
        if accepted {
            {
                let mut stats = self.stats.lock().unwrap();
                stats.session_id = None;
                stats.served_by = None;
            }
            self.emit(SessionEvent::Ended).await;
        }
        wire.finish();
        end
    }
}

/// Both directions of one session attempt.
enum Wire {
    /// A `ConnectSupervisor` stream of its own.
    Direct {
        sender: RawSender,
        receiver: RawReceiver,
    },
    /// Inside a shared host's session.
    Carried(CarriedSession),
}

impl Wire {
    /// Moves queued messages onto the wire until the queue or the wire closes.
    fn spawn_pump(
        &mut self,
        mut queue: mpsc::Receiver<Box<SupervisorMessage>>,
    ) -> tokio::task::JoinHandle<()> {
        match self {
            Wire::Direct { sender, .. } => {
                let sender = sender.clone();
                tokio::spawn(async move {
                    while let Some(message) = queue.recv().await {
                        if sender
                            .send(Bytes::from(message.encode_to_vec()))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                })
            }
            Wire::Carried(carried) => {
                // The pump owns the sender; the session keeps a stub.
                let send = std::mem::replace(
                    &mut carried.outbound,
                    Box::new(|_| Box::pin(async { false })),
                );
                tokio::spawn(async move {
                    while let Some(message) = queue.recv().await {
                        if !send(*message).await {
                            return;
                        }
                    }
                })
            }
        }
    }

    /// The next gateway message; `Err` carries why the wire broke.
    async fn recv(&mut self) -> Result<Option<GatewayMessage>, String> {
        match self {
            Wire::Direct { receiver, .. } => match receiver.recv().await {
                Ok(Some(bytes)) => GatewayMessage::decode(bytes)
                    .map(Some)
                    .map_err(|err| format!("undecodable gateway message: {err}")),
                Ok(None) => Ok(None),
                Err(err) => Err(err.to_string()),
            },
            // The carrier's session ending ends this one even if its route
            // never reached the carrier (registered as the carrier ended).
            Wire::Carried(carried) => Ok(tokio::select! {
                message = carried.inbound.recv() => message.map(|message| *message),
                _ = carried.carrier_ended.cancelled() => None,
            }),
        }
    }

    fn finish(self) {
        match self {
            Wire::Direct { sender, .. } => sender.cancel(),
            // Dropping it tells the gateway this sandbox's session ended.
            Wire::Carried(carried) => drop(carried),
        }
    }
}

/// Aborts a task when dropped (the pumps and workers of one attempt).
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The next heartbeat, or never before a session was accepted.
pub(crate) async fn next_tick(heartbeat: &mut Option<tokio::time::Interval>) {
    match heartbeat {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The advertised heartbeat interval, but never below 5 s (nor above an
/// hour, which keeps timer arithmetic sane whatever the gateway sends).
pub(crate) fn heartbeat_period(advertised: Option<prost_types::Duration>) -> Duration {
    let advertised = advertised
        .and_then(|d| {
            let seconds = Duration::from_secs(u64::try_from(d.seconds).ok()?);
            Some(seconds.saturating_add(Duration::from_nanos(u64::try_from(d.nanos).ok()?)))
        })
        .unwrap_or(MIN_HEARTBEAT);
    advertised.clamp(MIN_HEARTBEAT, MAX_HEARTBEAT)
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
