//! Create a sandbox, wait until it is READY, look it up, list, delete it and
//! wait until it is gone. Waiting follows `WatchSandbox` events, no polling.
//!
//! ```sh
//! OPENSHELL_ENDPOINT=http://127.0.0.1:17670 \
//!     cargo run -p openshell-sdk --example sandbox_lifecycle
//! ```

use std::time::Duration;

use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, Error, ListSandboxes};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let client = Client::connect(ClientConfig::from_env().build()?).await?;
    let sandboxes = client.sandboxes();

    // No name: the server generates one. The environment stays out of logs.
    let mut request = CreateSandbox::new()
        .label("example", "lifecycle")
        .env("GREETING", "hello");
    if let Ok(image) = std::env::var("OPENSHELL_IMAGE") {
        request = request.image(image);
    }
    let created = sandboxes.create(request, CallOptions::new()).await?;
    println!("created {} ({:?})", created.name, created.phase);

    let ready = sandboxes
        .wait_ready(
            &created.name,
            CallOptions::new().deadline(Duration::from_secs(120)),
        )
        .await?;
    println!("ready: {ready:?}");

    let fetched = sandboxes.get(&created.name, CallOptions::new()).await?;
    println!("get: {} is {:?}", fetched.name, fetched.phase);

    let labelled = sandboxes
        .list(
            ListSandboxes {
                label_selector: Some("example=lifecycle".into()),
                ..Default::default()
            },
            CallOptions::new(),
        )
        .await?;
    println!("{} sandbox(es) labelled example=lifecycle", labelled.len());

    let outcome = sandboxes.delete(&created.name, CallOptions::new()).await?;
    println!("delete: {outcome:?}");
    sandboxes
        .wait_deleted(
            &created.name,
            CallOptions::new().deadline(Duration::from_secs(60)),
        )
        .await?;
    println!("{} is gone", created.name);
    Ok(())
}
