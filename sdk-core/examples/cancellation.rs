//! Deadlines and cancellation: every call and stream takes `CallOptions`.
//!
//! - a deadline ends the call with `deadline_exceeded`;
//! - a `CancellationToken` ends every call started with it (`cancelled`);
//! - dropping a stream cancels its RPC.
//!
//! ```sh
//! cargo run -p openshell-sdk --example cancellation              # a sandbox of its own
//! cargo run -p openshell-sdk --example cancellation -- my-sandbox
//! ```

mod support;

use std::time::Duration;

use openshell_sdk::{CallOptions, CancellationToken, Client, ClientConfig, Error, ExecRequest};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let client = Client::connect(ClientConfig::from_env().build()?).await?;
    let sandbox = support::sandbox(&client, "cancellation", std::env::args().nth(1)).await?;
    let sleep = || ExecRequest::new(&sandbox.name, ["sleep", "30"]);

    // 1. A deadline.
    let err = client
        .exec(
            sleep(),
            CallOptions::new().deadline(Duration::from_millis(500)),
        )
        .await
        .expect_err("sleep 30 outlives a 500 ms deadline");
    println!("deadline: code={} ({err})", err.code());

    // 2. One token cancels two calls.
    let token = CancellationToken::new();
    let options = CallOptions::new().cancel_token(token.clone());
    let first = tokio::spawn({
        let (client, options, request) = (client.clone(), options.clone(), sleep());
        async move { client.exec(request, options).await }
    });
    let second = tokio::spawn({
        let (client, request) = (client.clone(), sleep());
        async move { client.exec(request, options).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    token.cancel();
    for call in [first, second] {
        let err = call.await.expect("task").expect_err("cancelled");
        println!("token: code={}", err.code());
    }

    // 3. Dropping a stream cancels the command's RPC.
    let stream = client.exec_stream(sleep(), CallOptions::new()).await?;
    drop(stream);
    println!("stream dropped");
    sandbox.finish(&client).await
}
