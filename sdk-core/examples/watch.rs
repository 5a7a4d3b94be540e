//! Stream snapshots of one sandbox as it changes.
//!
//! Without a sandbox name the example creates one, watches it become READY,
//! deletes it and watches until it is gone (the watch then ends with
//! `not_found`). With a name it prints that sandbox's snapshots for ten
//! seconds. Ctrl-C stops it early through the watch's cancellation token.
//!
//! ```sh
//! cargo run -p openshell-sdk --example watch
//! cargo run -p openshell-sdk --example watch -- my-sandbox
//! ```

mod support;

use std::time::Duration;

use futures::StreamExt;
use openshell_sdk::{CallOptions, CancellationToken, Client, ClientConfig, Error, SandboxPhase};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let client = Client::connect(ClientConfig::from_env().build()?).await?;
    let sandbox = match std::env::args().nth(1) {
        Some(name) => support::sandbox(&client, "watch", Some(name)).await?,
        // Not waited for: the watch shows it becoming READY.
        None => support::create(&client, "watch").await?,
    };

    // Ctrl-C (or, for a sandbox this example did not create, ten seconds)
    // cancels the watch through its token.
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let limit = if sandbox.created() {
        Duration::from_secs(180)
    } else {
        Duration::from_secs(10)
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = tokio::time::sleep(limit) => {}
        }
        stop.cancel();
    });

    let mut watch = client
        .sandboxes()
        .watch(&sandbox.name, CallOptions::new().cancel_token(cancel))
        .await?;
    let mut deleting = false;
    while let Some(snapshot) = watch.next().await {
        match snapshot {
            Ok(snapshot) => {
                println!(
                    "{} phase={:?} version={}",
                    snapshot.name, snapshot.phase, snapshot.resource_version
                );
                if sandbox.created() && !deleting && snapshot.phase == SandboxPhase::Ready {
                    deleting = true;
                    client
                        .sandboxes()
                        .delete(&sandbox.name, CallOptions::new())
                        .await?;
                    println!("deleting {}", sandbox.name);
                }
            }
            Err(err) if err.code() == "not_found" && deleting => {
                println!("{} is gone", sandbox.name);
                break;
            }
            Err(err) if err.code() == "cancelled" => break,
            Err(err) => return Err(err),
        }
    }
    if !deleting {
        // Stopped early: a sandbox this example created still goes.
        sandbox.finish(&client).await?;
    }
    Ok(())
}
