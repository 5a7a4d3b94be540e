//! One SSH session channel: its requests (`pty-req`, `env`,
//! `window-change`), then the one program it asked for (`shell`, `exec` or
//! the `sftp` subsystem), run as an exec of the sandbox by
//! [`exec::run_program`]: the exec machinery's isolation, environment,
//! process group and cancellation, driven in process instead of over a
//! relay. Stdout goes out as channel data, stderr as extended data (1), the
//! exit code as `exit-status`, then EOF and close. The client closing the
//! channel (or the connection ending) kills the process.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use openshell_proto::{
    ExecSandboxInput, ExecSandboxRequest, ExecSandboxWindowResize, RelayEof, RelayFrame,
    exec_sandbox_event, exec_sandbox_input, relay_frame,
};
use russh::server::Msg;
use russh::{Channel, ChannelMsg};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::exec::{self, ExecSettings, Program};

/// The one subsystem served.
pub const SFTP: &str = "sftp";
/// `env` requests kept per channel, and the longest value kept.
const MAX_ENV: usize = 64;
const MAX_ENV_VALUE: usize = 4096;
/// Input messages handed to the process ahead of its reading them.
const INPUT_FRAMES: usize = 16;
/// Stdin bytes a channel holds for a process that is not reading them.
/// russh delivers every channel's data from one connection loop, which
/// waits while a channel's queue is full, and it opens the client's window
/// again as data arrives, not as it is consumed. So a channel keeps reading
/// whatever its process does, and one whose process leaves this much
/// unread is closed instead of stalling its connection's other channels.
pub(crate) const STDIN_BACKLOG: usize = 16 << 20;

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

/// What a queued frame counts against [`STDIN_BACKLOG`]: its stdin bytes
/// plus a fixed charge, so that many tiny frames (or window changes) are
/// bounded too.
fn queued_cost(frame: &RelayFrame) -> usize {
    const FRAME_CHARGE: usize = 128;
    FRAME_CHARGE
        + match &frame.payload {
            Some(relay_frame::Payload::ExecInput(ExecSandboxInput {
                payload: Some(exec_sandbox_input::Payload::Stdin(data)),
            })) => data.len(),
            _ => 0,
        }
}

/// Why the client side of a channel stopped.
enum InputEnd {
    /// The client closed the channel, or the connection ended.
    Closed,
    /// The process left more than [`STDIN_BACKLOG`] bytes unread.
    Backlog,
}

/// Serves one session channel to its end. `base_env`: the sandbox's spec
/// environment, under what the client's `env` requests set.
pub async fn serve(
    channel: Channel<Msg>,
    settings: Arc<ExecSettings>,
    base_env: &HashMap<String, String>,
) {
    let (mut read, write) = channel.split();
    let mut env: HashMap<String, String> = HashMap::new();
    let mut pty: Option<Pty> = None;
    let mut eof_early = false;
    let request = loop {
        match read.wait().await {
            None | Some(ChannelMsg::Close) => return,
            Some(ChannelMsg::Eof) => eof_early = true,
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

    let (in_tx, in_rx) = mpsc::channel::<Result<RelayFrame, tonic::Status>>(INPUT_FRAMES);
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
                ReceiverStream::new(in_rx),
                cancel.cancelled_owned(),
            )
            .await;
        });
    }

    // Client -> process: until the client closes the channel. The channel
    // is read without waiting on the process (see STDIN_BACKLOG).
    let input = async move {
        let mut queue: VecDeque<RelayFrame> = VecDeque::new();
        let mut queued = 0usize;
        let mut process_gone = false;
        if eof_early {
            queue.push_back(eof_frame());
        }
        loop {
            tokio::select! {
                message = read.wait() => {
                    let frame = match message {
                        None | Some(ChannelMsg::Close) => return InputEnd::Closed,
                        Some(ChannelMsg::Data { data }) => input_frame(
                            exec_sandbox_input::Payload::Stdin(bytes::Bytes::copy_from_slice(&data)),
                        ),
                        Some(ChannelMsg::Eof) => eof_frame(),
                        Some(ChannelMsg::WindowChange {
                            col_width,
                            row_height,
                            ..
                        }) => input_frame(exec_sandbox_input::Payload::Resize(
                            ExecSandboxWindowResize {
                                cols: col_width,
                                rows: row_height,
                            },
                        )),
                        Some(_) => continue,
                    };
                    // The process is gone: keep reading until the close.
                    if process_gone {
                        continue;
                    }
                    queued += queued_cost(&frame);
                    if queued > STDIN_BACKLOG {
                        return InputEnd::Backlog;
                    }
                    queue.push_back(frame);
                }
                permit = in_tx.reserve(), if !queue.is_empty() && !process_gone => match permit {
                    Ok(permit) => {
                        let frame = queue.pop_front().expect("a queued frame");
                        queued -= queued_cost(&frame);
                        permit.send(Ok(frame));
                    }
                    Err(_) => {
                        process_gone = true;
                        queue.clear();
                        queued = 0;
                    }
                },
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

    let end = tokio::select! {
        end = input => Some(end),
        _ = output => None,
    };
    match end {
        None => debug!("ssh channel finished"),
        Some(InputEnd::Closed) => debug!("ssh channel closed by the client"),
        Some(InputEnd::Backlog) => {
            debug!("ssh channel closed: its process left too much input unread");
            let message = format!(
                "openshell: closing the channel: the program left more than {} MiB of input unread\r\n",
                STDIN_BACKLOG >> 20
            );
            let _ = write.extended_data(1, message.as_bytes()).await;
            let _ = write.eof().await;
            let _ = write.close().await;
        }
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
