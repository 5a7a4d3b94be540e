//! Interactive exec: a shell with a terminal; this program's stdin goes to
//! it line by line and its output comes back as events.
//!
//! Raw terminal mode and SIGWINCH handling are left to the caller; this
//! example only sends one resize.
//!
//! Type commands, end with Ctrl-D (or `exit`). Without a terminal, pipe the
//! commands in; the shell exits at the end of the input:
//!
//! ```sh
//! cargo run -p openshell-sdk --example exec_interactive              # a sandbox of its own
//! cargo run -p openshell-sdk --example exec_interactive -- my-sandbox
//! echo 'uname -a' | cargo run -p openshell-sdk --example exec_interactive
//! ```

mod support;

use std::io::{BufRead, Write};

use futures::StreamExt;
use openshell_sdk::{CallOptions, Client, ClientConfig, Error, ExecEvent, ExecRequest};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let client = Client::connect(ClientConfig::from_env().build()?).await?;
    let sandbox = support::sandbox(&client, "exec_interactive", std::env::args().nth(1)).await?;

    let session = client
        .exec_interactive(
            ExecRequest::new(&sandbox.name, ["sh"]).tty(80, 24),
            CallOptions::new(),
        )
        .await?;
    session.resize(120, 40).await?;
    let (input, mut events) = session.into_parts();

    // Local stdin -> the process; EOF (Ctrl-D) closes its stdin. A plain
    // thread reads the terminal: a read still waiting when the shell exits
    // must not keep the program (and its runtime) alive.
    let (lines_tx, mut lines) = tokio::sync::mpsc::channel::<String>(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines_tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(line) = lines.recv().await {
            if input.write(format!("{line}\n")).await.is_err() {
                return;
            }
        }
        input.close();
    });

    while let Some(event) = events.next().await {
        match event? {
            ExecEvent::Stdout(chunk) | ExecEvent::Stderr(chunk) => {
                std::io::stdout().write_all(&chunk).ok();
                std::io::stdout().flush().ok();
            }
            ExecEvent::Exit(code) => {
                println!("\r\n[exit {code}]");
            }
        }
    }
    sandbox.finish(&client).await
}
