//! The [`Client`] handle and per-call [`CallOptions`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::auth::TokenSource;
use crate::config::ClientConfig;
use crate::error::Error;
use crate::routing::{Router, RoutingStats};
use crate::transport;

/// A connection to one gateway endpoint. Cheap to clone; clones share the
/// channel, the token cache and the routing state.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) channel: Channel,
    pub(crate) config: ClientConfig,
    pub(crate) tokens: TokenSource,
    pub(crate) router: Router,
}

impl Client {
    /// Connects to the configured endpoint now. Fails with `connect` or `tls`
    /// when the endpoint cannot be reached. Later connection losses are
    /// repaired by reconnecting on the next call.
    pub async fn connect(config: ClientConfig) -> Result<Self, Error> {
        let channel = transport::connect(&config).await?;
        Ok(Self::with_channel(config, channel))
    }

    /// A client that connects on its first call. No I/O happens here; must be
    /// called inside a tokio runtime.
    pub async fn connect_lazy(config: ClientConfig) -> Result<Self, Error> {
        let channel = transport::connect_lazy(&config)?;
        Ok(Self::with_channel(config, channel))
    }

    fn with_channel(config: ClientConfig, channel: Channel) -> Self {
        let tokens = TokenSource::new(config.credentials.clone());
        let config_routing = config.routing;
        Self {
            inner: Arc::new(Inner {
                channel,
                config,
                tokens,
                router: Router::new(config_routing),
            }),
        }
    }

    /// The configuration this client was built from.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// Drops the cached owner of `sandbox` (the next routed call looks it
    /// up again).
    pub(crate) fn forget_owner(&self, sandbox: &str) {
        self.inner.router.forget(sandbox);
    }

    /// Owner-routing counters of this client (shared by its clones).
    pub fn routing_stats(&self) -> RoutingStats {
        self.inner.router.stats()
    }

    /// Takes `replica` as the owner of `sandbox`, as if an owner lookup had
    /// just answered it: owner-routed streams for the sandbox opened within
    /// the owner cache's TTL go out hinted to `replica` without a
    /// `GetSandbox`. For callers that already know the owner (an ssh
    /// `ProxyCommand` started with it). A wrong guess costs what a stale
    /// cache entry costs: a replica the edge cannot route gets the single
    /// unrouted retry (and is forgotten); a live replica that is not the
    /// owner relays the stream. `invalid_config` for a replica id that is
    /// empty or not 1..=63 of `[A-Za-z0-9._-]`.
    pub fn assume_owner(&self, sandbox: &str, replica: &str) -> Result<(), Error> {
        let valid = (1..=63).contains(&replica.len())
            && replica
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !valid {
            return Err(Error::invalid_config(format!(
                "replica id {:?} is not 1 to 63 of [A-Za-z0-9._-]",
                replica.chars().take(64).collect::<String>()
            )));
        }
        if sandbox.is_empty() {
            return Err(Error::invalid_config("assume_owner needs a sandbox name"));
        }
        self.inner
            .router
            .remember(sandbox, Some(replica.to_owned()));
        Ok(())
    }

    /// The tonic channel every call of this client rides on. For callers
    /// that need typed tonic stubs on the same HTTP/2 connection (a
    /// supervisor claiming relays on the connection of its session); they
    /// add their own credentials.
    pub fn channel(&self) -> Channel {
        self.inner.channel.clone()
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// Options of one call (or one curated operation).
///
/// - `deadline`: the whole call must finish within it; for a stream, the
///   whole stream. When `None`, unary calls and `wait_ready` /
///   `wait_deleted` use the client's default deadline and streams have none.
/// - `cancel`: firing this token cancels the call (and every call and stream
///   started with a clone of these options) with code `cancelled`.
///
/// Dropping a call's future or a stream handle cancels it as well.
#[derive(Clone, Default, Debug)]
pub struct CallOptions {
    /// Deadline of the call, from its start.
    pub deadline: Option<Duration>,
    /// Cancels the call when fired.
    pub cancel: Option<CancellationToken>,
}

impl CallOptions {
    /// No deadline of its own, no cancellation token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the deadline.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sets the cancellation token.
    pub fn cancel_token(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }
}

/// Whether a call gets the client's default deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeadlineKind {
    /// Unary calls and bounded operations (`wait_*`).
    Bounded,
    /// Streams: only an explicit deadline applies.
    Stream,
}

/// Call options resolved at the start of an operation: an operation made of
/// several calls (all pages of a list, a watch then a get) shares one
/// deadline instant and one cancellation token.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) deadline: Option<(Instant, Duration)>,
    pub(crate) cancel: CancellationToken,
}

impl Resolved {
    pub(crate) fn new(client: &Client, options: &CallOptions, kind: DeadlineKind) -> Self {
        let deadline = options.deadline.or(match kind {
            DeadlineKind::Bounded => client.inner.config.default_deadline,
            DeadlineKind::Stream => None,
        });
        Self {
            deadline: deadline.map(|d| (Instant::now() + d, d)),
            // A child: cancelling this operation never cancels the caller's token.
            cancel: options
                .cancel
                .as_ref()
                .map(CancellationToken::child_token)
                .unwrap_or_default(),
        }
    }

    /// Time left before the deadline (zero once passed).
    pub(crate) fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|(at, _)| at.saturating_duration_since(Instant::now()))
    }

    /// Runs `fut` unless the deadline passes or the call is cancelled first.
    pub(crate) async fn guard<T>(
        &self,
        fut: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let deadline = async {
            match self.deadline {
                Some((at, d)) => {
                    tokio::time::sleep_until(at).await;
                    d
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(Error::Cancelled),
            d = deadline => Err(Error::DeadlineExceeded { deadline: d }),
            result = fut => result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClientConfig;

    async fn client(deadline: Option<Duration>) -> Client {
        let config = ClientConfig::builder("http://127.0.0.1:1")
            .default_deadline(deadline)
            .build()
            .unwrap();
        Client::connect_lazy(config).await.unwrap()
    }

    #[tokio::test]
    async fn default_deadline_applies_to_bounded_calls_only() {
        let c = client(Some(Duration::from_secs(5))).await;
        let bounded = Resolved::new(&c, &CallOptions::new(), DeadlineKind::Bounded);
        assert_eq!(bounded.deadline.unwrap().1, Duration::from_secs(5));
        let stream = Resolved::new(&c, &CallOptions::new(), DeadlineKind::Stream);
        assert!(stream.deadline.is_none());
        let explicit = Resolved::new(
            &c,
            &CallOptions::new().deadline(Duration::from_secs(1)),
            DeadlineKind::Stream,
        );
        assert_eq!(explicit.deadline.unwrap().1, Duration::from_secs(1));
    }

    #[tokio::test]
    async fn guard_reports_deadline_and_cancellation() {
        let c = client(None).await;
        let r = Resolved::new(
            &c,
            &CallOptions::new().deadline(Duration::from_millis(10)),
            DeadlineKind::Bounded,
        );
        let err = r
            .guard(std::future::pending::<Result<(), Error>>())
            .await
            .unwrap_err();
        assert_eq!(err.code(), "deadline_exceeded");

        let token = CancellationToken::new();
        let r = Resolved::new(
            &c,
            &CallOptions::new().cancel_token(token.clone()),
            DeadlineKind::Bounded,
        );
        let waiting =
            tokio::spawn(async move { r.guard(std::future::pending::<Result<(), Error>>()).await });
        token.cancel();
        assert_eq!(waiting.await.unwrap().unwrap_err().code(), "cancelled");

        // Cancelling an operation leaves the caller's token alone.
        let token = CancellationToken::new();
        let r = Resolved::new(
            &c,
            &CallOptions::new().cancel_token(token.clone()),
            DeadlineKind::Bounded,
        );
        r.cancel.cancel();
        assert!(!token.is_cancelled());
    }
}
