//! Forward a local port to a port inside a sandbox until Ctrl-C.
//!
//! The core binds the listener and pumps every connection over its own
//! `ForwardTcp` stream; this program only holds the handle.
//!
//! ```sh
//! OPENSHELL_ENDPOINT=http://127.0.0.1:17670 \
//!     cargo run -p openshell-sdk --example forward -- my-sandbox 8080 127.0.0.1:18080
//! curl http://127.0.0.1:18080/
//! ```

use std::time::Duration;

use openshell_sdk::{CallOptions, Client, ClientConfig, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let usage = || Error::invalid_config("usage: forward <sandbox> <remote-port> [local-addr]");
    let sandbox = args.next().ok_or_else(usage)?;
    let remote_port: u16 = args.next().and_then(|p| p.parse().ok()).ok_or_else(usage)?;
    let local = args.next().unwrap_or_else(|| "127.0.0.1:0".into());
    let client = Client::connect(ClientConfig::from_env().build()?).await?;

    let handle = client
        .forward(&sandbox, remote_port, local.as_str(), CallOptions::new())
        .await?;
    println!(
        "forwarding {} -> {sandbox}:{remote_port} (Ctrl-C to stop)",
        handle.local_addr()
    );

    let mut report = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = report.tick() => println!("{:?}", handle.stats()),
        }
    }
    // Idempotent; new connections are refused at once, active ones end.
    handle.close();
    handle.closed().await;
    println!("closed: {:?}", handle.stats());
    Ok(())
}
