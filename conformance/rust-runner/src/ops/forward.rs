//! `forward`: a forward to a TCP echo server the runner starts on loopback
//! (the sandbox's host), exercised by concurrent half-closing connections.

use anyhow::anyhow;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::report::StepResult;
use crate::runner::{Runner, opts};

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
        let server = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| anyhow!("echo server: {e}"))?;
        let target = server.local_addr().map_err(|e| anyhow!("{e}"))?.port();
        let echo = tokio::spawn(async move {
            while let Ok((mut conn, _)) = server.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = conn.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                });
            }
        });
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
        echo.abort();
        Ok(json!({"echoed": echoed, "accepted": accepted, "closed_refuses": closed_refuses}))
    }
}
