//! Connect and ask the gateway for its health.
//!
//! Shows the connection settings: endpoint (http or https), bearer token,
//! an optional CA bundle, connect timeout, keepalive and default deadline.
//!
//! ```sh
//! OPENSHELL_ENDPOINT=http://127.0.0.1:17670 \
//!     cargo run -p openshell-sdk --example health
//! # TLS with a private CA:
//! OPENSHELL_ENDPOINT=https://gateway.example:443 OPENSHELL_CA_PEM=ca.pem \
//!     cargo run -p openshell-sdk --example health
//! ```

use std::time::Duration;

use openshell_sdk::{CallOptions, Client, ClientConfig, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let endpoint =
        std::env::var("OPENSHELL_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:17670".into());
    let mut builder = ClientConfig::builder(endpoint)
        .connect_timeout(Duration::from_secs(5))
        .keepalive(Some(Duration::from_secs(30)))
        .default_deadline(Some(Duration::from_secs(10)));
    if let Ok(token) = std::env::var("OPENSHELL_TOKEN") {
        builder = builder.token(token);
    }
    if let Ok(path) = std::env::var("OPENSHELL_CA_PEM") {
        let pem = std::fs::read(&path)
            .map_err(|e| Error::invalid_config(format!("reading {path}: {e}")))?;
        builder = builder.ca_pem(pem);
    }
    let config = builder.build()?;
    // Debug output never shows the token.
    println!("{config:?}");

    let client = match Client::connect(config).await {
        Ok(client) => client,
        Err(err) => {
            // Every error has a stable code and says whether a retry may help.
            eprintln!("code={} retryable={} {err}", err.code(), err.retryable());
            return Err(err);
        }
    };
    let health = client.health(CallOptions::new()).await?;
    println!(
        "status={:?} version={} served_by={}",
        health.status,
        health.version,
        health.served_by.as_deref().unwrap_or("-")
    );
    Ok(())
}
