//! Raw calls: any method by path, with encoded bytes and string metadata.
//!
//! This is the boundary the language bindings use. Here the messages are
//! encoded and decoded with prost; a binding does the same with its own
//! protobuf library.
//!
//! ```sh
//! cargo run -p openshell-sdk --example raw              # a sandbox of its own
//! cargo run -p openshell-sdk --example raw -- my-sandbox
//! ```

mod support;

use std::time::Duration;

use bytes::Bytes;
use openshell_sdk::proto::{self, GetSandboxRequest, SandboxResponse, SandboxStreamEvent};
use openshell_sdk::{CallOptions, Client, ClientConfig, Error, Metadata};
use prost::Message;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let client = Client::connect(ClientConfig::from_env().build()?).await?;
    let example = support::sandbox(&client, "raw", std::env::args().nth(1)).await?;
    let sandbox = example.name.clone();

    // The generated method table says how each method streams and which
    // field names the sandbox for owner-routed streams.
    for method in proto::METHODS {
        println!(
            "{:<50} {:?} owner_routed={:?}",
            method.path, method.kind, method.owner_routed_field
        );
    }

    // Unary: request bytes in, response bytes and metadata out.
    let request = GetSandboxRequest {
        name: sandbox.clone(),
        ..Default::default()
    };
    let response = client
        .raw_unary(
            "/openshell.v1.OpenShell/GetSandbox",
            Bytes::from(request.encode_to_vec()),
            Metadata::new().with("x-request-id", "raw-example-1"),
            CallOptions::new().deadline(Duration::from_secs(5)),
        )
        .await?;
    let got = SandboxResponse::decode(response.bytes.clone())
        .map_err(|e| Error::protocol(e.to_string()))?;
    println!(
        "GetSandbox served by {:?}: {:?}",
        response.served_by(),
        got.sandbox.and_then(|s| s.metadata).map(|m| m.name)
    );

    // Stream: send the request, read the first event (the current snapshot),
    // wait briefly for a change (an idle sandbox has none), then cancel.
    let mut stream = client
        .raw_stream(
            "/openshell.v1.OpenShell/WatchSandbox",
            Metadata::new(),
            CallOptions::new(),
        )
        .await?;
    let watch = proto::WatchSandboxRequest {
        sandbox,
        follow_status: true,
        ..Default::default()
    };
    stream.send(Bytes::from(watch.encode_to_vec())).await?;
    println!("response metadata: {:?}", stream.response_metadata().await?);
    for wait in [Duration::from_secs(30), Duration::from_secs(2)] {
        let Ok(received) = tokio::time::timeout(wait, stream.recv()).await else {
            println!("no change within {wait:?}");
            break;
        };
        match received? {
            Some(bytes) => {
                let event = SandboxStreamEvent::decode(bytes)
                    .map_err(|e| Error::protocol(e.to_string()))?;
                println!("event: {:?}", event.payload.map(|_| "snapshot or warning"));
            }
            None => break,
        }
    }
    // Cancelling (or dropping) the stream ends the RPC.
    stream.cancel();
    example.finish(&client).await
}
