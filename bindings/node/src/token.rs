//! A JavaScript function as the core's [`TokenProvider`].
//!
//! `@openshell/sdk` wraps the user's `tokenProvider` into a function
//! `(forceRefresh: boolean) => Promise<TokenAnswer>` that never rejects: a
//! throw becomes `{ error, retryable }`. It is held as a *weak* thread-safe
//! function, so a client with a provider never keeps Node alive. The core
//! decides when to call it (cached, single flight, forced after
//! `UNAUTHENTICATED`); the call is queued onto Node's main thread and its
//! promise awaited on a tokio worker.

use std::time::Duration;

use futures::future::BoxFuture;
use napi::Status;
use napi::bindgen_prelude::Promise;
use napi::threadsafe_function::ThreadsafeFunction;
use napi_derive::napi;
use openshell_sdk::{AccessToken, Error, TokenProvider};

/// What the TypeScript wrapper of a token provider resolves to.
#[napi(object)]
pub struct TokenAnswer {
    pub token: Option<String>,
    /// Lifetime of `token`, when known.
    pub expires_in_ms: Option<f64>,
    /// The provider threw: its message (never a token).
    pub error: Option<String>,
    pub retryable: Option<bool>,
}

/// The provider function as napi holds it: weak, not callee-handled.
pub type ProviderFn = ThreadsafeFunction<bool, Promise<TokenAnswer>, bool, Status, false, true>;

pub struct JsTokenProvider {
    function: ProviderFn,
}

impl JsTokenProvider {
    pub fn new(function: ProviderFn) -> Self {
        Self { function }
    }
}

fn answer(answer: TokenAnswer) -> Result<AccessToken, Error> {
    if let Some(message) = answer.error {
        return Err(Error::auth(
            format!("token provider failed: {message}"),
            answer.retryable.unwrap_or(false),
        ));
    }
    let Some(token) = answer.token else {
        return Err(Error::auth("token provider returned no token", false));
    };
    let token = AccessToken::new(token);
    Ok(match answer.expires_in_ms {
        Some(ms) if ms.is_finite() && ms > 0.0 => {
            token.expires_in(Duration::from_secs_f64(ms / 1000.0))
        }
        _ => token,
    })
}

impl TokenProvider for JsTokenProvider {
    fn token(&self, force_refresh: bool) -> BoxFuture<'_, Result<AccessToken, Error>> {
        Box::pin(async move {
            let unavailable = |e: napi::Error| {
                Error::auth(
                    format!("token provider could not be called: {}", e.reason),
                    false,
                )
            };
            let promise = self
                .function
                .call_async(force_refresh)
                .await
                .map_err(unavailable)?;
            answer(promise.await.map_err(unavailable)?)
        })
    }
}
