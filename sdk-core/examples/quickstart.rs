//! The quick start of the README, as a program (`cargo run -p openshell-sdk
//! --example quickstart` against `make up`). Keep the two the same.

use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, ExecRequest};

#[tokio::main]
async fn main() -> Result<(), openshell_sdk::Error> {
    // $OPENSHELL_ENDPOINT, by default http://127.0.0.1:17670 (`make up`), and
    // $OPENSHELL_TOKEN if set (`make up`'s dev cluster needs none). Or:
    // ClientConfig::builder("https://gateway.example").token("...").build()?
    let config = ClientConfig::from_env().build()?;
    let client = Client::connect(config).await?;

    let sandboxes = client.sandboxes();
    let sandbox = sandboxes
        .create(CreateSandbox::new().image("alpine:3"), CallOptions::new())
        .await?;
    sandboxes
        .wait_ready(&sandbox.name, CallOptions::new())
        .await?;

    let output = client
        .exec(
            ExecRequest::new(&sandbox.name, ["echo", "hello"]),
            CallOptions::new(),
        )
        .await?;
    println!(
        "{} (exit {})",
        output.stdout_text().trim_end(),
        output.exit_code
    );

    sandboxes.delete(&sandbox.name, CallOptions::new()).await?;
    sandboxes
        .wait_deleted(&sandbox.name, CallOptions::new())
        .await?;
    Ok(())
}
