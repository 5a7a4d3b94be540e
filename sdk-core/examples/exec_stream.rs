//! Streaming exec: print stdout and stderr as they arrive, then the exit code.
//!
//! The stream always ends with `ExecEvent::Exit` or an error; a server stream
//! without an exit event is reported as a `protocol` error. A deadline bounds
//! the whole command here.
//!
//! ```sh
//! cargo run -p openshell-sdk --example exec_stream              # a sandbox of its own
//! cargo run -p openshell-sdk --example exec_stream -- my-sandbox
//! ```

mod support;

use std::io::Write;
use std::time::Duration;

use futures::StreamExt;
use openshell_sdk::{CallOptions, Client, ClientConfig, Error, ExecEvent, ExecRequest};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let client = Client::connect(ClientConfig::from_env().build()?).await?;
    let sandbox = support::sandbox(&client, "exec_stream", std::env::args().nth(1)).await?;

    let script = "for i in 1 2 3; do echo tick $i; echo tock $i >&2; sleep 1; done";
    let mut events = client
        .exec_stream(
            ExecRequest::new(&sandbox.name, ["sh", "-c", script]),
            CallOptions::new().deadline(Duration::from_secs(30)),
        )
        .await?;
    while let Some(event) = events.next().await {
        match event? {
            ExecEvent::Stdout(chunk) => {
                std::io::stdout().write_all(&chunk).ok();
            }
            ExecEvent::Stderr(chunk) => {
                std::io::stderr().write_all(&chunk).ok();
            }
            ExecEvent::Exit(code) => println!("exit code {code}"),
        }
    }
    sandbox.finish(&client).await
}
