//! Forward a local port to a port on the sandbox's host.
//!
//! The core binds the listener and pumps every connection over its own
//! `ForwardTcp` stream to `remote_port` on loopback of the host that runs
//! the sandbox; this program only holds the handle.
//!
//! Without arguments the example is self-contained: it creates a sandbox,
//! starts a small echo service on this machine's loopback (on `make up` /
//! `openshell-gateway up` the sandboxes run on this machine, so that is the
//! sandbox's host), sends a line through the forward, prints the echo and
//! the counters, closes the forward and deletes the sandbox. With a sandbox
//! and a port it forwards until Ctrl-C.
//!
//! ```sh
//! cargo run -p openshell-sdk --example forward
//! cargo run -p openshell-sdk --example forward -- my-sandbox 8080 127.0.0.1:18080
//! curl http://127.0.0.1:18080/
//! ```

mod support;

use std::time::Duration;

use openshell_sdk::{CallOptions, Client, ClientConfig, Error, ForwardHandle};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let usage = || Error::invalid_config("usage: forward [<sandbox> <remote-port> [local-addr]]");
    let client = Client::connect(ClientConfig::from_env().build()?).await?;
    let Some(name) = args.next() else {
        return self_contained(&client).await;
    };
    let remote_port: u16 = args.next().and_then(|p| p.parse().ok()).ok_or_else(usage)?;
    let local = args.next().unwrap_or_else(|| "127.0.0.1:0".into());

    let handle = client
        .forward(&name, remote_port, local.as_str(), CallOptions::new())
        .await?;
    println!(
        "forwarding {} -> {name}:{remote_port} (Ctrl-C to stop)",
        handle.local_addr()
    );
    let mut report = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = report.tick() => println!("{:?}", handle.stats()),
        }
    }
    close(&handle).await;
    Ok(())
}

/// A sandbox, an echo service on its host, one round trip through the forward.
async fn self_contained(client: &Client) -> Result<(), Error> {
    let sandbox = support::sandbox(client, "forward", None).await?;
    let io = |e: std::io::Error| Error::Io {
        kind: e.kind(),
        message: e.to_string(),
    };
    let service = TcpListener::bind("127.0.0.1:0").await.map_err(io)?;
    let remote_port = service.local_addr().expect("bound").port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = service.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let _ = write.write_all(format!("echo: {line}\n").as_bytes()).await;
                }
            });
        }
    });

    let handle = client
        .forward(
            &sandbox.name,
            remote_port,
            "127.0.0.1:0",
            CallOptions::new(),
        )
        .await?;
    println!(
        "forwarding {} -> {}:{remote_port}",
        handle.local_addr(),
        sandbox.name
    );
    let socket = TcpStream::connect(handle.local_addr()).await.map_err(io)?;
    let (read, mut write) = socket.into_split();
    write
        .write_all(b"hello through the forward\n")
        .await
        .map_err(io)?;
    let answer = BufReader::new(read).lines().next_line().await.map_err(io)?;
    println!("{}", answer.unwrap_or_default());
    drop(write);
    close(&handle).await;
    sandbox.finish(client).await
}

async fn close(handle: &ForwardHandle) {
    // Idempotent; new connections are refused at once, active ones end.
    handle.close();
    handle.closed().await;
    println!("closed: {:?}", handle.stats());
}
