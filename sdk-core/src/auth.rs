//! Bearer credentials: a fixed token or a [`TokenProvider`] the host implements.
//!
//! # Who does what
//!
//! The host (an application, or a language binding on behalf of Python,
//! TypeScript or Go code) implements [`TokenProvider`]: it knows how to obtain
//! a token (OIDC, a file, a vault). The core owns *when* to ask:
//!
//! - the first call asks with `force_refresh = false` and caches the answer
//!   (until its expiry, if the provider gave one);
//! - **single flight**: at most one provider call is in flight; every caller
//!   that needs a token meanwhile waits for that same call and shares its
//!   result (or its error);
//! - a server answer `UNAUTHENTICATED` to a call made with token generation
//!   `g` asks for a new token with `force_refresh = true` (unless another
//!   caller already replaced `g`), and the call is retried exactly once.
//!
//! The refresh runs as its own task, so a caller that is cancelled (a Python
//! task cancel, an `AbortSignal`, a Go `ctx`) while waiting does not cancel
//! the refresh the other waiters depend on.
//!
//! Tokens never appear in errors, logs or `Debug` output.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use crate::error::Error;

/// A bearer token and, optionally, when it stops being valid.
#[derive(Clone)]
pub struct AccessToken {
    secret: Arc<str>,
    expires_at: Option<Instant>,
}

impl AccessToken {
    /// A token without a known expiry.
    pub fn new(secret: impl Into<String>) -> Self {
        Self {
            secret: Arc::from(secret.into()),
            expires_at: None,
        }
    }

    /// Sets the instant after which the core asks the provider again.
    pub fn expires_at(mut self, at: Instant) -> Self {
        self.expires_at = Some(at);
        self
    }

    /// Sets the expiry relative to now.
    pub fn expires_in(self, ttl: Duration) -> Self {
        self.expires_at(Instant::now() + ttl)
    }

    /// The token itself. Handle with care: never log it.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// The expiry, if known.
    pub fn expiry(&self) -> Option<Instant> {
        self.expires_at
    }

    /// Still usable, with a small margin so that a call does not leave with
    /// a token that expires in flight.
    fn is_fresh(&self, now: Instant) -> bool {
        match self.expires_at {
            Some(at) => now + EXPIRY_MARGIN < at,
            None => true,
        }
    }
}

impl From<String> for AccessToken {
    fn from(secret: String) -> Self {
        AccessToken::new(secret)
    }
}

impl From<&str> for AccessToken {
    fn from(secret: &str) -> Self {
        AccessToken::new(secret)
    }
}

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessToken")
            .field("secret", &"<redacted>")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

const EXPIRY_MARGIN: Duration = Duration::from_secs(10);

/// Supplies bearer tokens. Implemented by the host.
///
/// `force_refresh` is true when the server rejected the current token
/// (`UNAUTHENTICATED`): the provider must not answer from its own cache.
/// Return [`Error::auth`] on failure, saying whether a later attempt may
/// succeed. The core never calls this concurrently with itself.
///
/// ```
/// use openshell_sdk::{AccessToken, Error, TokenProvider};
/// use futures::future::BoxFuture;
///
/// struct FromEnv;
///
/// impl TokenProvider for FromEnv {
///     fn token(&self, _force_refresh: bool) -> BoxFuture<'_, Result<AccessToken, Error>> {
///         Box::pin(async {
///             std::env::var("OPENSHELL_TOKEN")
///                 .map(AccessToken::new)
///                 .map_err(|_| Error::auth("OPENSHELL_TOKEN is not set", false))
///         })
///     }
/// }
/// ```
pub trait TokenProvider: Send + Sync + 'static {
    /// Returns a token, fresh from the source when `force_refresh` is set.
    fn token(&self, force_refresh: bool) -> BoxFuture<'_, Result<AccessToken, Error>>;
}

/// How requests are authenticated.
#[derive(Clone, Default)]
pub(crate) enum Credentials {
    /// No `authorization` header.
    #[default]
    None,
    /// The same token on every call; `UNAUTHENTICATED` is reported as is.
    Static(AccessToken),
    /// Tokens from the host, cached and refreshed single-flight.
    Provider(Arc<dyn TokenProvider>),
}

impl Credentials {
    pub(crate) fn is_some(&self) -> bool {
        !matches!(self, Credentials::None)
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::None => f.write_str("None"),
            Credentials::Static(_) => f.write_str("Static(<redacted>)"),
            Credentials::Provider(_) => f.write_str("Provider(<host token provider>)"),
        }
    }
}

/// A token with the generation it belongs to; a refresh bumps the generation.
#[derive(Clone, Debug)]
pub(crate) struct IssuedToken {
    pub(crate) token: AccessToken,
    pub(crate) generation: u64,
}

type RefreshFuture = Shared<BoxFuture<'static, Result<IssuedToken, Error>>>;

struct State {
    current: Option<IssuedToken>,
    generation: u64,
    in_flight: Option<RefreshFuture>,
}

/// The per-client token cache with single-flight refresh.
pub(crate) struct TokenSource {
    credentials: Credentials,
    state: Arc<Mutex<State>>,
}

impl TokenSource {
    pub(crate) fn new(credentials: Credentials) -> Self {
        Self {
            credentials,
            state: Arc::new(Mutex::new(State {
                current: None,
                generation: 0,
                in_flight: None,
            })),
        }
    }

    /// Whether an `UNAUTHENTICATED` answer can be cured by asking again.
    pub(crate) fn can_refresh(&self) -> bool {
        matches!(self.credentials, Credentials::Provider(_))
    }

    /// The token to send, or `None` when the client has no credentials.
    pub(crate) async fn token(&self) -> Result<Option<IssuedToken>, Error> {
        match &self.credentials {
            Credentials::None => Ok(None),
            Credentials::Static(token) => Ok(Some(IssuedToken {
                token: token.clone(),
                generation: 0,
            })),
            Credentials::Provider(provider) => {
                let refresh = {
                    let mut state = lock(&self.state);
                    if let Some(current) = &state.current
                        && current.token.is_fresh(Instant::now())
                    {
                        return Ok(Some(current.clone()));
                    }
                    self.join_or_start(&mut state, provider, false)
                };
                refresh.await.map(Some)
            }
        }
    }

    /// Called after the server rejected a token of generation `rejected`:
    /// returns a newer token, refreshing (forced) only if nobody else has.
    pub(crate) async fn refresh_after(&self, rejected: u64) -> Result<Option<IssuedToken>, Error> {
        let Credentials::Provider(provider) = &self.credentials else {
            return self.token().await;
        };
        let refresh = {
            let mut state = lock(&self.state);
            if let Some(current) = &state.current
                && current.generation > rejected
            {
                return Ok(Some(current.clone()));
            }
            self.join_or_start(&mut state, provider, true)
        };
        refresh.await.map(Some)
    }

    /// Joins the refresh in flight or starts one. Runs under the state lock,
    /// which is what makes it single-flight.
    fn join_or_start(
        &self,
        state: &mut State,
        provider: &Arc<dyn TokenProvider>,
        force_refresh: bool,
    ) -> RefreshFuture {
        if let Some(in_flight) = &state.in_flight {
            return in_flight.clone();
        }
        let provider = Arc::clone(provider);
        let shared_state = Arc::clone(&self.state);
        // A task of its own: waiters may be cancelled, the refresh is not.
        let task = tokio::spawn(async move {
            let result = provider.token(force_refresh).await;
            let mut state = lock(&shared_state);
            state.in_flight = None;
            match result {
                Ok(token) => {
                    state.generation += 1;
                    let issued = IssuedToken {
                        token,
                        generation: state.generation,
                    };
                    state.current = Some(issued.clone());
                    Ok(issued)
                }
                Err(err) => {
                    tracing::debug!(code = err.code(), "token provider failed");
                    Err(err)
                }
            }
        });
        let refresh = async move {
            match task.await {
                Ok(result) => result,
                Err(join) => Err(Error::auth(
                    if join.is_panic() {
                        "token provider panicked"
                    } else {
                        "token refresh was aborted"
                    },
                    true,
                )),
            }
        }
        .boxed()
        .shared();
        state.in_flight = Some(refresh.clone());
        refresh
    }
}

impl fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenSource")
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

/// The `authorization` header value for a token. The error names no part of
/// the token.
pub(crate) fn bearer_header(token: &AccessToken) -> Result<http::HeaderValue, Error> {
    let mut value = http::HeaderValue::from_str(&format!("Bearer {}", token.secret()))
        .map_err(|_| Error::invalid_config("token contains characters not allowed in a header"))?;
    value.set_sensitive(true);
    Ok(value)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave the state inconsistent
    // (every update is a single assignment), so poisoning is ignored.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts calls; each call takes a while so that waiters pile up.
    struct Counting {
        calls: AtomicUsize,
        forced: AtomicUsize,
        fail: bool,
    }

    impl Counting {
        fn new(fail: bool) -> Arc<Self> {
            Arc::new(Self {
                calls: AtomicUsize::new(0),
                forced: AtomicUsize::new(0),
                fail,
            })
        }
    }

    impl TokenProvider for Counting {
        fn token(&self, force_refresh: bool) -> BoxFuture<'_, Result<AccessToken, Error>> {
            Box::pin(async move {
                let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
                if force_refresh {
                    self.forced.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                if self.fail {
                    Err(Error::auth("provider down", true))
                } else {
                    Ok(AccessToken::new(format!("token-{n}")))
                }
            })
        }
    }

    fn source(provider: &Arc<Counting>) -> Arc<TokenSource> {
        let provider: Arc<dyn TokenProvider> = provider.clone();
        Arc::new(TokenSource::new(Credentials::Provider(provider)))
    }

    #[tokio::test]
    async fn twenty_concurrent_waiters_share_one_provider_call() {
        let provider = Counting::new(false);
        let source = source(&provider);
        let waiters: Vec<_> = (0..20)
            .map(|_| {
                let source = Arc::clone(&source);
                tokio::spawn(async move { source.token().await })
            })
            .collect();
        for w in waiters {
            let issued = w.await.unwrap().unwrap().unwrap();
            assert_eq!(issued.token.secret(), "token-1");
            assert_eq!(issued.generation, 1);
        }
        assert_eq!(provider.calls.load(Ordering::SeqCst), 1);
        // Cached afterwards: no new call.
        source.token().await.unwrap();
        assert_eq!(provider.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn twenty_concurrent_rejections_force_exactly_one_refresh() {
        let provider = Counting::new(false);
        let source = source(&provider);
        let first = source.token().await.unwrap().unwrap();
        let waiters: Vec<_> = (0..20)
            .map(|_| {
                let source = Arc::clone(&source);
                let rejected = first.generation;
                tokio::spawn(async move { source.refresh_after(rejected).await })
            })
            .collect();
        for w in waiters {
            let issued = w.await.unwrap().unwrap().unwrap();
            assert_eq!(issued.token.secret(), "token-2");
            assert_eq!(issued.generation, 2);
        }
        assert_eq!(provider.calls.load(Ordering::SeqCst), 2);
        assert_eq!(provider.forced.load(Ordering::SeqCst), 1);
        // A late rejection of the old generation does not refresh again.
        let late = source
            .refresh_after(first.generation)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(late.generation, 2);
        assert_eq!(provider.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_cancelled_waiter_does_not_cancel_the_refresh() {
        let provider = Counting::new(false);
        let source = source(&provider);
        let cancelled = {
            let source = Arc::clone(&source);
            tokio::spawn(async move { source.token().await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        cancelled.abort();
        let issued = source.token().await.unwrap().unwrap();
        assert_eq!(issued.token.secret(), "token-1");
        assert_eq!(provider.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn failures_are_shared_and_the_next_call_tries_again() {
        let provider = Counting::new(true);
        let source = source(&provider);
        let waiters: Vec<_> = (0..5)
            .map(|_| {
                let source = Arc::clone(&source);
                tokio::spawn(async move { source.token().await })
            })
            .collect();
        for w in waiters {
            let err = w.await.unwrap().unwrap_err();
            assert_eq!(err.code(), "auth");
            assert!(err.retryable());
        }
        assert_eq!(provider.calls.load(Ordering::SeqCst), 1);
        assert!(source.token().await.is_err());
        assert_eq!(provider.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn expired_tokens_are_fetched_again() {
        struct Short(AtomicUsize);
        impl TokenProvider for Short {
            fn token(&self, _: bool) -> BoxFuture<'_, Result<AccessToken, Error>> {
                let n = self.0.fetch_add(1, Ordering::SeqCst);
                // Inside the expiry margin: stale at once.
                Box::pin(async move {
                    Ok(AccessToken::new(format!("t{n}")).expires_in(Duration::from_secs(1)))
                })
            }
        }
        let provider = Arc::new(Short(AtomicUsize::new(0)));
        let source = TokenSource::new(Credentials::Provider(provider.clone()));
        source.token().await.unwrap();
        source.token().await.unwrap();
        assert_eq!(provider.0.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn static_and_missing_credentials() {
        let none = TokenSource::new(Credentials::None);
        assert!(none.token().await.unwrap().is_none());
        assert!(!none.can_refresh());
        let fixed = TokenSource::new(Credentials::Static(AccessToken::new("abc")));
        assert_eq!(fixed.token().await.unwrap().unwrap().token.secret(), "abc");
        assert!(!fixed.can_refresh());
    }

    #[test]
    fn debug_never_shows_the_token() {
        let token = AccessToken::new("super-secret-token");
        assert!(!format!("{token:?}").contains("super-secret"));
        let creds = Credentials::Static(token.clone());
        assert!(!format!("{creds:?}").contains("super-secret"));
        let source = TokenSource::new(creds);
        assert!(!format!("{source:?}").contains("super-secret"));
        let err = bearer_header(&AccessToken::new("bad\ntoken-secret")).unwrap_err();
        assert!(!format!("{err:?} {err}").contains("token-secret"));
        let header = bearer_header(&token).unwrap();
        assert!(header.is_sensitive());
        assert!(!format!("{header:?}").contains("super-secret"));
    }
}
