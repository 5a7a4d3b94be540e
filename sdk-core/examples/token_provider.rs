//! Supply tokens from the host with a `TokenProvider`.
//!
//! The core asks the provider once and caches the token (until its expiry);
//! when the gateway answers UNAUTHENTICATED it asks again with
//! `force_refresh = true` - one refresh at a time, shared by every waiting
//! call - and retries the call once. Here the provider re-reads
//! `OPENSHELL_TOKEN_FILE` (or `OPENSHELL_TOKEN`) each time it is asked.
//! When neither is set it hands out a placeholder: the dev cluster of
//! `make up` / `openshell-gateway up` runs without auth and ignores tokens,
//! so the example works there as is. A gateway that checks tokens
//! (`openshell-gateway serve --token ...`) rejects the placeholder with
//! `unauthenticated`.
//!
//! ```sh
//! cargo run -p openshell-sdk --example token_provider       # dev cluster
//! echo my-token > /tmp/token
//! OPENSHELL_TOKEN_FILE=/tmp/token cargo run -p openshell-sdk --example token_provider
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use openshell_sdk::{
    AccessToken, CallOptions, Client, ClientConfig, Error, ListSandboxes, TokenProvider,
};

/// Sent when no token is configured; dev clusters ignore tokens.
const PLACEHOLDER: &str = "dev-placeholder-token";

struct FileTokens {
    calls: AtomicUsize,
}

impl TokenProvider for FileTokens {
    fn token(&self, force_refresh: bool) -> BoxFuture<'_, Result<AccessToken, Error>> {
        Box::pin(async move {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            println!("provider call #{n} (force_refresh={force_refresh})");
            let token = match std::env::var("OPENSHELL_TOKEN_FILE") {
                Ok(path) => tokio::fs::read_to_string(&path)
                    .await
                    .map_err(|e| Error::auth(format!("reading {path}: {e}"), true))?,
                Err(_) => match std::env::var("OPENSHELL_TOKEN") {
                    Ok(token) if !token.is_empty() => token,
                    _ => {
                        println!("no OPENSHELL_TOKEN_FILE or OPENSHELL_TOKEN: using a placeholder");
                        PLACEHOLDER.to_owned()
                    }
                },
            };
            // Ask again after five minutes even without a rejection.
            Ok(AccessToken::new(token.trim()).expires_in(Duration::from_secs(300)))
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let endpoint =
        std::env::var("OPENSHELL_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:17670".into());
    let provider = Arc::new(FileTokens {
        calls: AtomicUsize::new(0),
    });
    let config = ClientConfig::builder(endpoint)
        .token_provider(provider.clone())
        .build()?;
    let client = Client::connect(config).await?;

    // Ten concurrent calls share one provider call.
    let calls: Vec<_> = (0..10)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .sandboxes()
                    .list(ListSandboxes::default(), CallOptions::new())
                    .await
            })
        })
        .collect();
    for call in calls {
        let sandboxes = call.await.expect("task")?;
        println!("{} sandboxes", sandboxes.len());
    }
    println!(
        "provider was called {} time(s)",
        provider.calls.load(Ordering::SeqCst)
    );
    Ok(())
}
