//! A Python callable as the core's [`TokenProvider`].
//!
//! The callable is `provider(force_refresh: bool)` and returns a token string,
//! or `(token, expires_in_seconds)`. The core decides when to call it (cached,
//! single flight, forced after `UNAUTHENTICATED`); each call runs on a tokio
//! blocking thread that takes the GIL for the call only, so no tokio worker
//! ever waits for the GIL. An exception becomes an `auth` error (retryable
//! when the exception has a true `retryable` attribute). Async providers are
//! adapted to this shape by `openshell_sdk` (they run on the caller's loop).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use openshell_sdk::{AccessToken, Error, TokenProvider};
use pyo3::prelude::*;

pub struct PyTokenProvider {
    callable: Arc<Py<PyAny>>,
}

impl PyTokenProvider {
    pub fn new(callable: Py<PyAny>) -> Self {
        Self {
            callable: Arc::new(callable),
        }
    }
}

fn call(callable: &Py<PyAny>, force_refresh: bool) -> Result<AccessToken, Error> {
    Python::attach(|py| {
        let answer = callable.bind(py).call1((force_refresh,)).map_err(|err| {
            let retryable = err
                .value(py)
                .getattr("retryable")
                .and_then(|r| r.is_truthy())
                .unwrap_or(false);
            // The exception's message only: a provider must not put tokens
            // in its errors, and the core never logs them either way.
            Error::auth(format!("token provider raised: {err}"), retryable)
        })?;
        if let Ok(token) = answer.extract::<String>() {
            return Ok(AccessToken::new(token));
        }
        if let Ok((token, ttl)) = answer.extract::<(String, Option<f64>)>() {
            let token = AccessToken::new(token);
            return Ok(match ttl {
                Some(s) if s.is_finite() && s > 0.0 => token.expires_in(Duration::from_secs_f64(s)),
                _ => token,
            });
        }
        Err(Error::auth(
            "token provider must return a str or (str, expires_in_seconds)",
            false,
        ))
    })
}

impl TokenProvider for PyTokenProvider {
    fn token(&self, force_refresh: bool) -> BoxFuture<'_, Result<AccessToken, Error>> {
        let callable = Arc::clone(&self.callable);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || call(&callable, force_refresh))
                .await
                .unwrap_or_else(|join| {
                    Err(Error::auth(
                        format!("token provider panicked: {join}"),
                        false,
                    ))
                })
        })
    }
}
