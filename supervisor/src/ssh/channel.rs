//! One SSH session channel: its requests (`pty-req`, `env`,
//! `window-change`), then the one program it asked for (`shell`, `exec` or
//! the `sftp` subsystem), run as an exec of the sandbox by
//! [`exec::run_program`]: the exec machinery's isolation, environment,
//! process group and cancellation, driven in process instead of over a
//! relay. Stdout goes out as channel data, stderr as extended data (1), the
//! exit code as `exit-status`, then EOF and close. The client closing the
//! channel (or the connection ending) kills the process.
//!
//! Input the process has not read yet is counted against the process's
//! budget ([`input_budget`](super::input_budget)): the connection charges
//! each message as russh hands it over, and the channel gives the cost
//! back once the program's stdin took it (or it was dropped, the program
//! being gone). The channel itself never waits: it takes every message
//! russh delivers, so one channel never stalls the connection's loop.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use openshell_proto::{
    ExecSandboxInput, ExecSandboxRequest, ExecSandboxWindowResize, RelayEof, RelayFrame,
    exec_sandbox_event, exec_sandbox_input, relay_frame,
};
use russh::server::Msg;
use russh::{Channel, ChannelMsg};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::input_budget::{ChannelInput, FRAME_CHARGE, data_cost};
use crate::exec::{self, ExecSettings, Program};

/// The one subsystem served.
pub const SFTP: &str = "sftp";
/// `env` requests kept per channel, and the longest value kept.
const MAX_ENV: usize = 64;
const MAX_ENV_VALUE: usize = 4096;
/// Names an `env` request may set: shell identifiers, none of ours.
pub fn acceptable_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.starts_with("OPENSHELL_")
}

enum Request {
    Shell,
    Exec(String),
    Sftp,
}

struct Pty {
    term: String,
    cols: u32,
    rows: u32,
}

/// The sandbox's shell: bash where the sandbox has it, else sh.
fn shell() -> &'static str {
    if std::path::Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    }
}

fn input_frame(payload: exec_sandbox_input::Payload) -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::ExecInput(ExecSandboxInput {
            payload: Some(payload),
        })),
    }
}

fn eof_frame() -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::Eof(RelayEof {})),
    }
}

/// The program's stdin as the exec machinery reads it: frames with their
/// cost, given back to the budget once the exec asks for the next frame
/// (it writes one frame to the program before it asks again), or when the
/// exec is gone.
struct BudgetedInput {
    frames: mpsc::UnboundedReceiver<(RelayFrame, usize)>,
    input: Arc<ChannelInput>,
    /// The cost of the frame the exec is writing now.
    current: usize,
}

impl Stream for BudgetedInput {
    type Item = Result<RelayFrame, tonic::Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let done = std::mem::take(&mut self.current);
        if done > 0 {
            self.input.release(done);
        }
        match self.frames.poll_recv(cx) {
            Poll::Ready(Some((frame, cost))) => {
                self.current = cost;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for BudgetedInput {
    fn drop(&mut self) {
        self.frames.close();
        let mut cost = std::mem::take(&mut self.current);
        while let Ok((_, queued)) = self.frames.try_recv() {
            cost += queued;
        }
        self.input.release(cost);
    }
}

/// Serves one session channel to its end. `base_env`: the sandbox's spec
/// environment, under what the client's `env` requests set. `input`: the
/// channel's account, which the connection charges.
pub async fn serve(
    channel: Channel<Msg>,
    settings: Arc<ExecSettings>,
    base_env: &HashMap<String, String>,
    input: Arc<ChannelInput>,
) {
    let _give_back = CloseOnDrop(input.clone());
    let (mut read, write) = channel.split();
    let mut env: HashMap<String, String> = HashMap::new();
    let mut pty: Option<Pty> = None;
    let mut eof_early = false;
    let request = loop {
        match read.wait().await {
            None | Some(ChannelMsg::Close) => return,
            // Input before the program starts goes nowhere.
            Some(ChannelMsg::Data { data }) => input.release(data_cost(data.len())),
            Some(ChannelMsg::Eof) => {
                input.release(FRAME_CHARGE);
                eof_early = true;
            }
            Some(ChannelMsg::RequestPty {
                term,
                col_width,
                row_height,
                ..
            }) => {
                pty = Some(Pty {
                    term,
                    cols: col_width,
                    rows: row_height,
                })
            }
            Some(ChannelMsg::SetEnv {
                variable_name,
                variable_value,
                ..
            }) => {
                if acceptable_env_name(&variable_name)
                    && variable_value.len() <= MAX_ENV_VALUE
                    && (env.len() < MAX_ENV || env.contains_key(&variable_name))
                {
                    env.insert(variable_name, variable_value);
                }
            }
            Some(ChannelMsg::WindowChange {
                col_width,
                row_height,
                ..
            }) => {
                input.release(FRAME_CHARGE);
                if let Some(pty) = &mut pty {
                    pty.cols = col_width;
                    pty.rows = row_height;
                }
            }
            Some(ChannelMsg::RequestShell { .. }) => break Request::Shell,
            Some(ChannelMsg::Exec { command, .. }) => {
                break Request::Exec(String::from_utf8_lossy(&command).into_owned());
            }
            Some(ChannelMsg::RequestSubsystem { name, .. }) if name == SFTP => break Request::Sftp,
            Some(_) => {}
        }
    };

    let shell = shell();
    let (program, command, tty) = match request {
        Request::Shell => (Program::Command, vec![shell.into(), "-l".into()], true),
        Request::Exec(line) => (
            Program::Command,
            vec![shell.into(), "-c".into(), line],
            true,
        ),
        Request::Sftp => (Program::Sftp, vec!["sftp-server".into()], false),
    };
    let tty = tty && pty.is_some();
    let mut env = {
        let mut merged = base_env.clone();
        merged.extend(env);
        merged
    };
    env.insert("SHELL".into(), shell.into());
    if let Some(pty) = pty.as_ref().filter(|_| tty) {
        env.insert("TERM".into(), pty.term.clone());
    }
    let request = ExecSandboxRequest {
        command,
        environment: env,
        tty,
        cols: pty.as_ref().map_or(0, |p| p.cols),
        rows: pty.as_ref().map_or(0, |p| p.rows),
        ..Default::default()
    };

    // Unbounded: what it holds is charged to the budget, which stops the
    // connection's reading instead.
    let (in_tx, in_rx) = mpsc::unbounded_channel::<(RelayFrame, usize)>();
    let stdin = BudgetedInput {
        frames: in_rx,
        input: input.clone(),
        current: 0,
    };
    let (out_tx, mut out_rx) = mpsc::channel::<RelayFrame>(16);
    let cancel = CancellationToken::new();
    let _kill_on_return = cancel.clone().drop_guard();
    {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            exec::run_program(
                program,
                request,
                &settings,
                out_tx,
                stdin,
                cancel.cancelled_owned(),
            )
            .await;
        });
    }

    // Client -> process: until the client closes the channel. Every message
    // is taken at once; a frame the process can no longer take is given
    // back.
    let client_input = async move {
        if eof_early {
            let _ = in_tx.send((eof_frame(), 0));
        }
        loop {
            let (frame, cost) = match read.wait().await {
                None | Some(ChannelMsg::Close) => return,
                Some(ChannelMsg::Data { data }) => (
                    input_frame(exec_sandbox_input::Payload::Stdin(
                        bytes::Bytes::copy_from_slice(&data),
                    )),
                    data_cost(data.len()),
                ),
                Some(ChannelMsg::Eof) => (eof_frame(), FRAME_CHARGE),
                Some(ChannelMsg::WindowChange {
                    col_width,
                    row_height,
                    ..
                }) => (
                    input_frame(exec_sandbox_input::Payload::Resize(
                        ExecSandboxWindowResize {
                            cols: col_width,
                            rows: row_height,
                        },
                    )),
                    FRAME_CHARGE,
                ),
                Some(_) => continue,
            };
            if in_tx.send((frame, cost)).is_err() {
                input.release(cost);
            }
        }
    };

    // Process -> client: output, then the exit status.
    let output = async {
        while let Some(frame) = out_rx.recv().await {
            let Some(relay_frame::Payload::ExecEvent(event)) = frame.payload else {
                continue;
            };
            let sent = match event.payload {
                Some(exec_sandbox_event::Payload::Stdout(out)) => write.data_bytes(out.data).await,
                Some(exec_sandbox_event::Payload::Stderr(err)) => {
                    write.extended_data_bytes(1, err.data).await
                }
                Some(exec_sandbox_event::Payload::Exit(exit)) => {
                    let _ = write.exit_status(exit.exit_code.max(0) as u32).await;
                    let _ = write.eof().await;
                    let _ = write.close().await;
                    return;
                }
                None => Ok(()),
            };
            if sent.is_err() {
                return;
            }
        }
        // Cancelled before an exit: nothing more will come.
        let _ = write.close().await;
    };

    tokio::select! {
        () = client_input => debug!("ssh channel closed by the client"),
        () = output => debug!("ssh channel finished"),
    }
}

/// Gives the channel's holding back to the budget when the channel's task
/// ends, however it ends.
struct CloseOnDrop(Arc<ChannelInput>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use super::acceptable_env_name;

    #[test]
    fn env_names() {
        assert!(acceptable_env_name("LANG"));
        assert!(acceptable_env_name("LC_ALL"));
        assert!(acceptable_env_name("_x1"));
        assert!(!acceptable_env_name(""));
        assert!(!acceptable_env_name("1A"));
        assert!(!acceptable_env_name("A=B"));
        assert!(!acceptable_env_name("OPENSHELL_SANDBOX_TOKEN"));
    }
}
