//! `openshell exec SANDBOX [-i] [-t] -- CMD...`: stdout and stderr streamed
//! as they come, the remote exit code as ours.
//!
//! - no flag: `ExecSandbox`, stdin untouched;
//! - `-i`: `ExecSandboxInteractive` without a terminal, stdin passed until
//!   its EOF;
//! - `-t`: with a pty in the sandbox; the local terminal goes raw (Ctrl-C,
//!   Ctrl-D, Ctrl-Z are bytes for the remote side), window resizes
//!   (SIGWINCH) follow, and the terminal is restored on every way out.
//!
//! Our own failures exit 255 so that a remote command's 1 stays its own.

use std::time::Duration;

use futures::StreamExt;
use openshell_sdk::{CallOptions, Client, ExecEvent, ExecInput, ExecRequest};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::signal::unix::{SignalKind, signal};

use super::signals::Interrupts;
use crate::args::ExecArgs;
use crate::failure::{EXIT_REMOTE_COMMAND_FAILED, Failure, io};
use crate::settings::Settings;
use crate::terminal::{RawMode, stdin_is_terminal, window_size};

pub async fn run(args: ExecArgs, settings: &Settings) -> Result<u8, Failure> {
    exec(args, settings)
        .await
        .map_err(|f| f.with_exit(EXIT_REMOTE_COMMAND_FAILED))
}

async fn exec(args: ExecArgs, settings: &Settings) -> Result<u8, Failure> {
    if args.tty && !stdin_is_terminal() {
        return Err(Failure::invalid(
            "exec -t needs a terminal on stdin (use -i to pass stdin without one)",
        ));
    }
    if args.timeout == Some(0) {
        return Err(Failure::invalid("--timeout must be at least 1 second"));
    }
    let mut request = ExecRequest::new(&args.sandbox, args.command.clone());
    if let Some(dir) = &args.workdir {
        request = request.workdir(dir);
    }
    for (k, v) in &args.env {
        request = request.env(k, v);
    }
    if let Some(secs) = args.timeout {
        request = request.timeout(Duration::from_secs(secs));
    }
    let client = settings.connect().await?;
    if args.tty {
        let (cols, rows) = window_size();
        // Raw before the stream opens: nothing typed meanwhile is echoed
        // locally. Dropped (restored) on every return below.
        let raw = RawMode::enable()?;
        let code = interactive(&client, request.tty(cols, rows), true).await;
        drop(raw);
        code
    } else if args.stdin {
        interactive(&client, request, false).await
    } else {
        streamed(&client, request).await
    }
}

/// Exit code from the remote code (0..=255 as is; anything else modulo 256).
fn exit_code(code: i32) -> u8 {
    (code & 0xff) as u8
}

async fn write_out(out: &mut (impl AsyncWrite + Unpin), data: &[u8]) -> Result<(), Failure> {
    out.write_all(data)
        .await
        .map_err(|e| io("writing the command's output", &e))?;
    out.flush()
        .await
        .map_err(|e| io("writing the command's output", &e))
}

async fn streamed(client: &Client, request: ExecRequest) -> Result<u8, Failure> {
    let mut interrupts = Interrupts::new()?;
    let mut events = client.exec_stream(request, CallOptions::new()).await?;
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            // Dropping the stream cancels the command's call.
            code = interrupts.recv() => return Ok(code),
        };
        match event {
            Some(Ok(ExecEvent::Stdout(data))) => write_out(&mut stdout, &data).await?,
            Some(Ok(ExecEvent::Stderr(data))) => write_out(&mut stderr, &data).await?,
            Some(Ok(ExecEvent::Exit(code))) => return Ok(exit_code(code)),
            Some(Err(err)) => return Err(err.into()),
            None => {
                return Err(Failure::new(
                    "protocol",
                    "the exec stream ended without an exit code",
                ));
            }
        }
    }
}

/// Copies stdin to the command until EOF (which closes its stdin).
async fn pump_stdin(input: ExecInput) -> Result<(), Failure> {
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = stdin
            .read(&mut buf)
            .await
            .map_err(|e| io("reading stdin", &e))?;
        if n == 0 {
            input.close();
            return Ok(());
        }
        if input.write(buf[..n].to_vec()).await.is_err() {
            // The call ended; the events say how.
            return Ok(());
        }
    }
}

async fn interactive(client: &Client, request: ExecRequest, tty: bool) -> Result<u8, Failure> {
    let mut interrupts = Interrupts::new()?;
    let mut resizes =
        signal(SignalKind::window_change()).map_err(|e| io("installing SIGWINCH", &e))?;
    let session = client.exec_interactive(request, CallOptions::new()).await?;
    let (input, mut events) = session.into_parts();
    let stdin_task = tokio::spawn(pump_stdin(input.clone()));
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let result = loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = resizes.recv(), if tty => {
                let (cols, rows) = window_size();
                let _ = input.resize(cols, rows).await;
                continue;
            }
            code = interrupts.recv() => break Ok(code),
        };
        match event {
            Some(Ok(ExecEvent::Stdout(data))) => {
                if let Err(f) = write_out(&mut stdout, &data).await {
                    break Err(f);
                }
            }
            Some(Ok(ExecEvent::Stderr(data))) => {
                if let Err(f) = write_out(&mut stderr, &data).await {
                    break Err(f);
                }
            }
            Some(Ok(ExecEvent::Exit(code))) => break Ok(exit_code(code)),
            Some(Err(err)) => break Err(err.into()),
            None => {
                break Err(Failure::new(
                    "protocol",
                    "the exec stream ended without an exit code",
                ));
            }
        }
    };
    stdin_task.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_fit_a_byte() {
        assert_eq!(exit_code(0), 0);
        assert_eq!(exit_code(3), 3);
        assert_eq!(exit_code(255), 255);
        assert_eq!(exit_code(256), 0);
        assert_eq!(exit_code(-1), 255);
    }
}
