//! The host's connect loop: where to dial next (shared address, redirect
//! target, sticky redial, fallbacks) and one `ConnectHost` attempt (hello,
//! acceptance, heartbeats, assignment, sandbox envelopes).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use openshell_proto::supervisor_host::{
    HostGatewayMessage, HostHeartbeat, HostHello, HostMessage, host_gateway_message, host_message,
};
use prost::Message;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{AssignedSandbox, HOST_OUTBOUND, HostEvent, HostInner, Link, ResourceLimits};
use crate::client::{CallOptions, Client};
use crate::config_session::{AbortOnDrop, Backoff, heartbeat_period, next_tick};
use crate::error::Error;
use crate::metadata::{Metadata, REPLICA, SERVED_BY};
use crate::routing::never_forwarded;

const CONNECT_HOST: &str = "/openshell.supervisor_host.v1.SupervisorHost/ConnectHost";
/// Redirects followed back to back without an accepted session before the
/// next one waits for the backoff (guards against a redirect loop).
const MAX_IMMEDIATE_REDIRECTS: u32 = 4;

/// Where the next attempt goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Dial {
    /// The shared address; `stay` after a redirect target was unreachable.
    Shared { stay: bool },
    /// A redirect's target, with `stay`.
    Redirected { url: String },
    /// The replica that held the lost session, with `stay`: its URL when it
    /// was a redirect target, else the shared address with the replica hint.
    Sticky {
        url: Option<String>,
        replica: Option<String>,
    },
}

/// Why the next attempt goes where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Redirect,
    RedirectTargetDown,
    StickyTargetGone,
    SessionLost,
    Retry,
}

/// The next attempt: where, whether it waits for the backoff first, and why.
#[derive(Debug, PartialEq, Eq)]
struct Step {
    dial: Dial,
    backoff: bool,
    why: Why,
}

/// Where to dial after an attempt that dialled `dial` ended with `end`.
/// `sticky` is where a sticky redial goes when a session was accepted.
fn next_dial(dial: Dial, end: HostEnd, sticky: Option<Dial>) -> Step {
    let step = |dial, backoff, why| Step { dial, backoff, why };
    match (end, dial) {
        // At once, with `stay`: the gateway chose the target.
        (HostEnd::Redirect { url, .. }, _) => step(Dial::Redirected { url }, false, Why::Redirect),
        // The target is down: the replica the shared address picks keeps us.
        (HostEnd::Unreachable, Dial::Redirected { .. }) => {
            step(Dial::Shared { stay: true }, false, Why::RedirectTargetDown)
        }
        // The replica that held us is gone: placement runs again.
        (HostEnd::Unreachable, Dial::Sticky { .. }) => {
            step(Dial::Shared { stay: false }, false, Why::StickyTargetGone)
        }
        // A blip, a token refresh: back to the same replica, with `stay`.
        (HostEnd::Lost { accepted: true } | HostEnd::Rejected { accepted: true }, dial) => {
            step(sticky.unwrap_or(dial), true, Why::SessionLost)
        }
        // A peer that answered but did not keep us: back to the shared
        // address, keeping `stay`.
        (_, Dial::Redirected { .. } | Dial::Sticky { .. }) => {
            step(Dial::Shared { stay: true }, true, Why::Retry)
        }
        (_, shared) => step(shared, true, Why::Retry),
    }
}

/// How one attempt ended.
#[derive(Debug, PartialEq, Eq)]
enum HostEnd {
    /// Nothing reached a gateway (connect failed, or the edge could not
    /// route the hinted replica).
    Unreachable,
    /// The gateway answered and the session ended (or never started).
    Lost {
        accepted: bool,
    },
    Rejected {
        accepted: bool,
    },
    Redirect {
        url: String,
        accepted: bool,
    },
}

impl HostInner {
    pub(super) async fn host_loop(self: &Arc<Self>, home: &Client) {
        let mut backoff = Backoff::reconnect();
        let mut epoch = 0u64;
        let mut dial = Dial::Shared { stay: false };
        let mut peer: Option<(String, Client)> = None;
        let mut redirects_in_a_row = 0u32;
        loop {
            epoch += 1;
            let (url, hint, stay, redirected) = match &dial {
                Dial::Shared { stay } => (None, None, *stay, false),
                Dial::Redirected { url } => (Some(url.clone()), None, true, true),
                Dial::Sticky { url, replica } => (url.clone(), replica.clone(), true, false),
            };
            let client = match &url {
                None => Ok(home.clone()),
                Some(url) => self.peer_client(&mut peer, url).await,
            };
            let end = match client {
                Ok(client) => {
                    let accepted_at = (url.clone(), hint.clone());
                    self.attempt(
                        &client,
                        hint.as_deref(),
                        epoch,
                        redirected,
                        stay,
                        &mut backoff,
                    )
                    .await
                    .map_sticky(accepted_at)
                }
                Err(err) => {
                    tracing::warn!(error = %err, "cannot dial the host session's target");
                    (HostEnd::Unreachable, None)
                }
            };
            let (end, sticky) = end;
            tracing::debug!(epoch, ?dial, ?end, "host session attempt ended");
            if matches!(end, HostEnd::Redirect { accepted: true, .. })
                || matches!(
                    end,
                    HostEnd::Lost { accepted: true } | HostEnd::Rejected { accepted: true }
                )
            {
                redirects_in_a_row = 0;
            }
            let step = next_dial(dial, end, sticky);
            match step.why {
                Why::Redirect => {
                    redirects_in_a_row += 1;
                    self.stats.lock().unwrap().redirects += 1;
                }
                Why::RedirectTargetDown => {
                    tracing::warn!(
                        "redirect target unreachable; back to the shared address, with stay"
                    );
                    self.stats.lock().unwrap().fallbacks += 1;
                }
                Why::StickyTargetGone => {
                    tracing::info!(
                        "the replica that held the session is gone; placement through the shared address"
                    );
                    self.stats.lock().unwrap().fallbacks += 1;
                }
                Why::SessionLost => self.stats.lock().unwrap().sticky_redials += 1,
                Why::Retry => {}
            }
            if !matches!(step.why, Why::Redirect) {
                redirects_in_a_row = 0;
            }
            let wait = step.backoff || redirects_in_a_row > MAX_IMMEDIATE_REDIRECTS;
            if wait {
                let delay = backoff.next_delay();
                tracing::debug!(
                    delay_ms = delay.as_millis() as u64,
                    "redialling after backoff"
                );
                tokio::time::sleep(delay).await;
            }
            dial = step.dial;
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

    fn hello(&self, epoch: u64, redirected: bool, stay: bool) -> HostMessage {
        HostMessage {
            payload: Some(host_message::Payload::Hello(HostHello {
                member_id: self.member_id.clone(),
                instance_id: self.instance_id.clone(),
                connection_epoch: epoch,
                redirected,
                stay,
                capacity: self.capacity,
            })),
        }
    }

    /// One connect attempt, running until the session ends. Returns how it
    /// ended and, when a session was accepted, the replica that accepted it.
    async fn attempt(
        self: &Arc<Self>,
        client: &Client,
        hint: Option<&str>,
        epoch: u64,
        redirected: bool,
        stay: bool,
        backoff: &mut Backoff,
    ) -> Attempt {
        self.stats.lock().unwrap().stay = stay;
        let mut metadata = Metadata::new();
        if let Some(replica) = hint {
            metadata.append(REPLICA, replica);
        }
        let opened = async {
            let mut stream = client
                .raw_stream(CONNECT_HOST, metadata, CallOptions::new())
                .await?;
            stream
                .send(Bytes::from(
                    self.hello(epoch, redirected, stay).encode_to_vec(),
                ))
                .await?;
            let metadata = stream.response_metadata().await?;
            Ok::<_, Error>((stream, metadata))
        };
        let (stream, metadata) = match opened.await {
            Ok(opened) => opened,
            Err(err) => {
                tracing::warn!(error = %err, "host session connect failed");
                let unreachable =
                    matches!(err, Error::Connect { .. }) || never_forwarded(&err).is_some();
                return Attempt::ended(if unreachable {
                    HostEnd::Unreachable
                } else {
                    HostEnd::Rejected { accepted: false }
                });
            }
        };
        let served_by = metadata.get(SERVED_BY).map(str::to_owned);
        let (sender, mut receiver) = stream.split();
        let (outbound, mut outbound_rx) = mpsc::channel::<HostMessage>(HOST_OUTBOUND);
        let pump_sender = sender.clone();
        let pump = tokio::spawn(async move {
            while let Some(message) = outbound_rx.recv().await {
                if pump_sender
                    .send(Bytes::from(message.encode_to_vec()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        let _stop_pump = AbortOnDrop(pump);

        let routes: Arc<Mutex<HashMap<String, mpsc::Sender<_>>>> = Arc::default();
        let ended = CancellationToken::new();
        let mut heartbeat: Option<tokio::time::Interval> = None;
        let mut accepted: Option<String> = None;
        let end = loop {
            let message = tokio::select! {
                message = receiver.recv() => message,
                _ = next_tick(&mut heartbeat) => {
                    let beat = HostMessage {
                        payload: Some(host_message::Payload::Heartbeat(HostHeartbeat {})),
                    };
                    // A full queue already tells the gateway we are alive.
                    let _ = outbound.try_send(beat);
                    continue;
                }
            };
            let was_accepted = accepted.is_some();
            let payload = match message {
                Ok(Some(bytes)) => match HostGatewayMessage::decode(bytes) {
                    Ok(HostGatewayMessage {
                        payload: Some(payload),
                    }) => payload,
                    Ok(_) => continue,
                    Err(err) => {
                        tracing::warn!(error = %err, "undecodable host gateway message");
                        break HostEnd::Lost {
                            accepted: was_accepted,
                        };
                    }
                },
                Ok(None) => {
                    tracing::info!(accepted = was_accepted, "host session ended by the gateway");
                    break HostEnd::Lost {
                        accepted: was_accepted,
                    };
                }
                Err(err) => {
                    tracing::warn!(accepted = was_accepted, error = %err, "host session lost");
                    break HostEnd::Lost {
                        accepted: was_accepted,
                    };
                }
            };
            match payload {
                host_gateway_message::Payload::Accepted(accept) => {
                    let period = heartbeat_period(accept.heartbeat_interval);
                    let replica = served_by.clone().or_else(|| {
                        (!accept.replica_id.is_empty()).then(|| accept.replica_id.clone())
                    });
                    tracing::info!(
                        session_id = accept.session_id,
                        replica = replica.as_deref().unwrap_or(""),
                        stay,
                        "host session accepted"
                    );
                    backoff.reset();
                    let mut interval =
                        tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    heartbeat = Some(interval);
                    {
                        let mut stats = self.stats.lock().unwrap();
                        stats.sessions_accepted += 1;
                        stats.session_id = Some(accept.session_id.clone());
                        stats.served_by = replica.clone();
                    }
                    accepted = Some(replica.clone().unwrap_or_default());
                    self.link.send_replace(Some(Link {
                        client: client.clone(),
                        served_by: replica.clone(),
                        outbound: outbound.clone(),
                        routes: routes.clone(),
                        ended: ended.clone(),
                    }));
                    self.emit(HostEvent::Accepted {
                        session_id: accept.session_id,
                        served_by: replica,
                    })
                    .await;
                }
                host_gateway_message::Payload::Rejected(reject) => {
                    tracing::warn!(reason = reject.reason, "host session rejected");
                    break HostEnd::Rejected {
                        accepted: was_accepted,
                    };
                }
                host_gateway_message::Payload::Redirect(redirect) => {
                    if redirect.peer_endpoint.is_empty() {
                        tracing::warn!("host redirect without a peer endpoint");
                        break HostEnd::Lost {
                            accepted: was_accepted,
                        };
                    }
                    tracing::info!(
                        peer = redirect.peer_endpoint,
                        replica = redirect.replica_id,
                        "host session redirected"
                    );
                    break HostEnd::Redirect {
                        url: redirect.peer_endpoint,
                        accepted: was_accepted,
                    };
                }
                host_gateway_message::Payload::Heartbeat(_) => {}
                host_gateway_message::Payload::Assignment(assignment) => {
                    let sandboxes: Vec<AssignedSandbox> = assignment
                        .sandboxes
                        .into_iter()
                        .filter(|s| !s.sandbox_id.is_empty())
                        .map(|s| AssignedSandbox {
                            sandbox_id: s.sandbox_id,
                            name: s.name,
                            environment: s.environment.into_iter().collect(),
                            limits: s
                                .limits
                                .map(|l| ResourceLimits {
                                    memory_bytes: l.memory_bytes,
                                    cpu_millis: l.cpu_millis,
                                    pids: l.pids,
                                })
                                .unwrap_or_default(),
                        })
                        .collect();
                    self.stats.lock().unwrap().assigned = sandboxes.len();
                    self.assignment.send_replace(Some(sandboxes.clone()));
                    self.emit(HostEvent::Assignment(sandboxes)).await;
                }
                host_gateway_message::Payload::Sandbox(envelope) => {
                    let mut routes = routes.lock().unwrap();
                    if envelope.end {
                        // Dropping the sender ends that sandbox's session.
                        routes.remove(&envelope.sandbox_id);
                        continue;
                    }
                    let Some(message) = envelope.message else {
                        continue;
                    };
                    if let Some(route) = routes.get(&envelope.sandbox_id)
                        && route.try_send(Box::new(message)).is_err()
                    {
                        tracing::warn!(
                            sandbox_id = envelope.sandbox_id,
                            "sandbox session not keeping up; ending it"
                        );
                        routes.remove(&envelope.sandbox_id);
                    }
                }
            }
        };
        // Every sandbox session inside this one ends with it.
        ended.cancel();
        routes.lock().unwrap().clear();
        self.link.send_if_modified(|link| {
            let ours = link.as_ref().is_some_and(|l| l.ended.is_cancelled());
            if ours {
                *link = None;
            }
            ours
        });
        if accepted.is_some() {
            {
                let mut stats = self.stats.lock().unwrap();
                stats.session_id = None;
                stats.served_by = None;
            }
            self.emit(HostEvent::Ended).await;
        }
        sender.cancel();
        Attempt {
            end,
            accepted_by: accepted,
        }
    }
}

/// An attempt's end, and the replica that accepted its session, if any.
struct Attempt {
    end: HostEnd,
    accepted_by: Option<String>,
}

impl Attempt {
    fn ended(end: HostEnd) -> Self {
        Self {
            end,
            accepted_by: None,
        }
    }

    /// Where a sticky redial goes: the same peer URL, or the shared address
    /// with the accepting replica as the hint.
    fn map_sticky(self, (url, hint): (Option<String>, Option<String>)) -> (HostEnd, Option<Dial>) {
        let sticky = self.accepted_by.map(|replica| match url {
            Some(url) => Dial::Sticky {
                url: Some(url),
                replica: None,
            },
            None => Dial::Sticky {
                url: None,
                replica: Some(replica).filter(|r| !r.is_empty()).or(hint),
            },
        });
        (self.end, sticky)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(u: &str) -> String {
        u.to_owned()
    }

    #[test]
    fn a_redirect_is_followed_at_once_and_a_dead_target_falls_back_with_stay() {
        let first = next_dial(
            Dial::Shared { stay: false },
            HostEnd::Redirect {
                url: url("http://gw-1"),
                accepted: false,
            },
            None,
        );
        assert_eq!(
            first.dial,
            Dial::Redirected {
                url: url("http://gw-1")
            }
        );
        assert!(!first.backoff);
        let second = next_dial(first.dial, HostEnd::Unreachable, None);
        assert_eq!(second.dial, Dial::Shared { stay: true });
        assert!(!second.backoff);
        assert_eq!(second.why, Why::RedirectTargetDown);
    }

    #[test]
    fn a_lost_session_redials_its_replica_with_stay_and_a_gone_one_is_placed_again() {
        // Accepted through the shared address: the sticky redial hints the replica.
        let lost = next_dial(
            Dial::Shared { stay: false },
            HostEnd::Lost { accepted: true },
            Some(Dial::Sticky {
                url: None,
                replica: Some(url("gw-0")),
            }),
        );
        assert_eq!(
            lost.dial,
            Dial::Sticky {
                url: None,
                replica: Some(url("gw-0"))
            }
        );
        assert_eq!(lost.why, Why::SessionLost);
        let gone = next_dial(lost.dial, HostEnd::Unreachable, None);
        assert_eq!(gone.dial, Dial::Shared { stay: false });
        // Accepted at a redirect target: the sticky redial goes to its URL.
        let lost = next_dial(
            Dial::Redirected {
                url: url("http://gw-2"),
            },
            HostEnd::Lost { accepted: true },
            Some(Dial::Sticky {
                url: Some(url("http://gw-2")),
                replica: None,
            }),
        );
        assert_eq!(
            lost.dial,
            Dial::Sticky {
                url: Some(url("http://gw-2")),
                replica: None
            }
        );
    }

    #[test]
    fn a_shutdown_redirect_of_an_accepted_session_is_followed_at_once() {
        let step = next_dial(
            Dial::Sticky {
                url: None,
                replica: Some(url("gw-0")),
            },
            HostEnd::Redirect {
                url: url("http://gw-1"),
                accepted: true,
            },
            Some(Dial::Sticky {
                url: None,
                replica: Some(url("gw-0")),
            }),
        );
        assert_eq!(
            step.dial,
            Dial::Redirected {
                url: url("http://gw-1")
            }
        );
        assert!(!step.backoff);
    }

    #[test]
    fn other_failures_back_off_and_keep_or_gain_stay_off_the_shared_address() {
        let step = next_dial(Dial::Shared { stay: false }, HostEnd::Unreachable, None);
        assert_eq!(step.dial, Dial::Shared { stay: false });
        assert!(step.backoff);
        let step = next_dial(
            Dial::Redirected {
                url: url("http://gw-1"),
            },
            HostEnd::Rejected { accepted: false },
            None,
        );
        assert_eq!(step.dial, Dial::Shared { stay: true });
        assert!(step.backoff);
    }
}
