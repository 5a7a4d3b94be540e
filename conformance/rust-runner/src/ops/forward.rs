//! `forward`: a forward to a TCP echo server the runner starts inside the
//! sandbox (an exec stream running `testkit/scripts/sandbox-echo.py`, which
//! prints `listening PORT`), exercised by concurrent half-closing
//! connections; the exec stream is dropped (cancelled) at the end.

use std::time::Duration;

use anyhow::{anyhow, bail};
use futures::StreamExt;
use openshell_sdk::{ExecEvent, ExecRequest, ExecStream};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::report::StepResult;
use crate::runner::{Runner, opts};

/// The echo server every runner starts in the sandbox.
const ECHO_SERVER: &str = include_str!("../../../../testkit/scripts/sandbox-echo.py");
/// How long the echo server may take to say it listens.
const LISTENING_WITHIN: Duration = Duration::from_secs(20);

/// Reads `stream`'s stdout up to the `listening PORT` line.
async fn listening_port(stream: &mut ExecStream) -> anyhow::Result<u16> {
    let mut stdout = Vec::new();
    while let Some(event) = stream.next().await {
        match event? {
            ExecEvent::Stdout(data) => stdout.extend_from_slice(&data),
            ExecEvent::Stderr(_) => {}
            ExecEvent::Exit(code) => bail!("the echo server exited with {code}"),
        }
        if let Some(end) = stdout.iter().position(|b| *b == b'\n') {
            let line = String::from_utf8_lossy(&stdout[..end]).into_owned();
            return line
                .strip_prefix("listening ")
                .and_then(|port| port.trim().parse().ok())
                .ok_or_else(|| anyhow!("the echo server said {line:?}"));
        }
    }
    bail!("the echo server's stream ended")
}

impl Runner {
    pub async fn forward(&mut self, step: &Value) -> StepResult {
        let sandbox = self.target(step);
        if let Some(port) = step["remote_port"].as_u64() {
            let port = u16::try_from(port).map_err(|_| anyhow!("remote_port {port}"))?;
            let handle = self
                .client
                .forward(&sandbox, port, "127.0.0.1:0", opts())
                .await?;
            handle.close();
            return Ok(json!({}));
        }
        let mut echo = self
            .client
            .exec_stream(
                ExecRequest::new(&sandbox, ["python3", "-c", ECHO_SERVER]),
                opts(),
            )
            .await?;
        let target = tokio::time::timeout(LISTENING_WITHIN, listening_port(&mut echo))
            .await
            .map_err(|_| anyhow!("the echo server did not listen within 20 s"))??;
        let handle = self
            .client
            .forward(&sandbox, target, "127.0.0.1:0", opts())
            .await?;
        let addr = handle.local_addr();
        let size = step["bytes_per_connection"].as_u64().unwrap_or(1024) as usize;
        let connections = step["connections"].as_u64().unwrap_or(1) as usize;
        let rounds = (0..connections).map(|i| async move {
            let payload: Vec<u8> = (0..size).map(|j| (i * 31 + j * 7) as u8).collect();
            let mut conn = TcpStream::connect(addr).await?;
            let (mut r, mut w) = conn.split();
            let send = async {
                w.write_all(&payload).await?;
                w.shutdown().await
            };
            let mut echoed = Vec::new();
            let (sent, read) = tokio::join!(send, r.read_to_end(&mut echoed));
            sent?;
            read?;
            Ok::<bool, std::io::Error>(echoed == payload)
        });
        let echoed: Vec<bool> = futures::future::join_all(rounds)
            .await
            .into_iter()
            .map(|r| matches!(r, Ok(true)))
            .collect();
        let accepted = handle.stats().connections_accepted;
        handle.close();
        handle.closed().await;
        let closed_refuses = TcpStream::connect(addr).await.is_err();
        drop(echo);
        Ok(json!({"echoed": echoed, "accepted": accepted, "closed_refuses": closed_refuses}))
    }
}
