//! Stream snapshots of one sandbox until Ctrl-C.
//!
//! ```sh
//! OPENSHELL_ENDPOINT=http://127.0.0.1:17670 \
//!     cargo run -p openshell-sdk --example watch -- my-sandbox
//! ```

use futures::StreamExt;
use openshell_sdk::{CallOptions, CancellationToken, Client, ClientConfig, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let name = std::env::args()
        .nth(1)
        .ok_or_else(|| Error::invalid_config("usage: watch <sandbox>"))?;
    let client = Client::connect(ClientConfig::from_env().build()?).await?;

    // Ctrl-C cancels the watch through its token.
    let cancel = CancellationToken::new();
    let on_ctrl_c = cancel.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_ctrl_c.cancel();
    });

    let mut watch = client
        .sandboxes()
        .watch(&name, CallOptions::new().cancel_token(cancel))
        .await?;
    while let Some(snapshot) = watch.next().await {
        match snapshot {
            Ok(sandbox) => println!(
                "{} phase={:?} version={}",
                sandbox.name, sandbox.phase, sandbox.resource_version
            ),
            Err(err) if err.code() == "cancelled" => break,
            Err(err) => return Err(err),
        }
    }
    Ok(())
}
