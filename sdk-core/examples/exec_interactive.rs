//! Interactive exec: a shell with a terminal; this program's stdin goes to
//! it line by line and its output comes back as events.
//!
//! Raw terminal mode and SIGWINCH handling are left to the caller; this
//! example only sends one resize.
//!
//! ```sh
//! OPENSHELL_ENDPOINT=http://127.0.0.1:17670 \
//!     cargo run -p openshell-sdk --example exec_interactive -- my-sandbox
//! ```

use std::io::Write;

use openshell_sdk::{CallOptions, Client, ClientConfig, Error, ExecEvent, ExecRequest};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let sandbox = std::env::args()
        .nth(1)
        .ok_or_else(|| Error::invalid_config("usage: exec_interactive <sandbox>"))?;
    let client = Client::connect(ClientConfig::from_env().build()?).await?;

    let session = client
        .exec_interactive(
            ExecRequest::new(&sandbox, ["sh"]).tty(80, 24),
            CallOptions::new(),
        )
        .await?;
    session.resize(120, 40).await?;
    let (input, mut events) = session.into_parts();

    // Local stdin -> the process; EOF (Ctrl-D) closes its stdin.
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if input.write(format!("{line}\n")).await.is_err() {
                return;
            }
        }
        input.close();
    });

    use futures::StreamExt;
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
    Ok(())
}
