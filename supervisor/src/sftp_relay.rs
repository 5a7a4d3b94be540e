//! SFTP relays: the sandbox's SFTP server (`crate::sftp`) on a relay of its
//! own, what the SDK's file transfer (`Client::upload` and friends) opens
//! through `ForwardTcp` with the `sftp` target.
//!
//! The server runs exactly as the SSH `sftp` subsystem runs it: an exec of
//! the sandbox ([`exec::run_program`] with [`Program::Sftp`]), so it gets the
//! sandbox's namespaces, uid, working directory and control group, and the
//! same rights as any exec. This module only translates frames: inbound
//! `data` becomes the process's stdin, its stdout goes back as `data`, its
//! exit as `eof`. Stderr is logged, never sent (the byte stream is SFTP).
//!
//! The end is gentle on purpose. When the client's stream ends, fails, or
//! the relay is cancelled (session lost, `relay_close`), the process first
//! gets EOF on stdin and [`EXIT_GRACE`] to exit by itself: the server then
//! removes the upload temp files it created and nobody renamed, so a client
//! that died mid-upload leaves no half-written file. Only after the grace is
//! it killed. Output it writes meanwhile is read and dropped, so it never
//! blocks on a full pipe.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use openshell_proto::{
    ExecSandboxInput, ExecSandboxRequest, RelayEof, RelayFrame, exec_sandbox_event,
    exec_sandbox_input, relay_frame,
};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::exec::{self, ExecSettings, Program};
use crate::relay::{self, RelayContext};
use crate::transport;

/// How long the server gets to exit (and clean up) after its input ended.
pub const EXIT_GRACE: Duration = Duration::from_secs(5);
/// Frames queued each way between the relay and the process.
const FRAMES: usize = 16;

fn data_frame(data: bytes::Bytes) -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::Data(data)),
    }
}

fn eof_frame() -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::Eof(RelayEof {})),
    }
}

fn stdin_frame(data: bytes::Bytes) -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::ExecInput(ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Stdin(data)),
        })),
    }
}

/// Claims the relay and serves SFTP on it until the process is gone.
pub async fn run(
    ctx: &RelayContext,
    channel_id: &str,
    settings: Arc<ExecSettings>,
    cancel: impl Future<Output = ()>,
) {
    let mut cancel = pin!(cancel);
    let claimed = tokio::select! {
        _ = cancel.as_mut() => return,
        claimed = relay::claim(ctx, channel_id) => claimed,
    };
    let claimed = match claimed {
        Ok(claimed) => claimed,
        Err(status) => {
            warn!(channel_id, error = %transport::describe_status(&status), "claiming sftp relay failed");
            relay::report_failure(
                ctx,
                channel_id,
                format!("claim relay: {}", transport::describe_status(&status)),
            )
            .await;
            return;
        }
    };
    let relay::Claimed { out, mut inbound } = claimed;

    let (stdin_tx, stdin_rx) = mpsc::channel::<Result<RelayFrame, tonic::Status>>(FRAMES);
    let (events_tx, mut events_rx) = mpsc::channel::<RelayFrame>(FRAMES);
    // Fired once the input side is over (client EOF, stream end, cancel).
    let (input_over_tx, input_over_rx) = oneshot::channel::<()>();
    // Fired once the process exited: the input side may let go then.
    let (exited_tx, exited_rx) = oneshot::channel::<()>();
    // Fired when the relay broke (or was cancelled): output is dropped
    // from then on instead of waiting on a stream nobody reads.
    let broken = CancellationToken::new();
    let broken_out = broken.clone();

    // Relay -> stdin. After the end of input the sender is held until the
    // process exited, since the end of the exec's inbound kills it.
    let input = async move {
        let mut cancel = cancel;
        let mut cancelled = false;
        let mut clean = false;
        loop {
            let frame = tokio::select! {
                _ = cancel.as_mut() => {
                    cancelled = true;
                    break;
                }
                frame = inbound.next() => frame,
            };
            match frame {
                Some(Ok(RelayFrame {
                    payload: Some(relay_frame::Payload::Data(data)),
                })) => {
                    let sent = tokio::select! {
                        _ = cancel.as_mut() => {
                            cancelled = true;
                            break;
                        }
                        sent = stdin_tx.send(Ok(stdin_frame(data))) => sent,
                    };
                    if sent.is_err() {
                        break;
                    }
                }
                Some(Ok(RelayFrame {
                    payload: Some(relay_frame::Payload::Eof(_)),
                })) => {
                    clean = true;
                    break;
                }
                Some(Ok(_)) => debug!("ignoring an unexpected frame on an sftp relay"),
                Some(Err(status)) => {
                    debug!(error = %transport::describe_status(&status), "sftp relay stream failed");
                    break;
                }
                None => break,
            }
        }
        if !clean {
            broken.cancel();
        }
        let _ = input_over_tx.send(());
        // Stdin is full while the server is stuck on its output: the EOF
        // goes in once there is room, or is moot once the process is gone.
        let mut exited_rx = exited_rx;
        let eof_sent = tokio::select! {
            _ = stdin_tx.send(Ok(eof_frame())) => true,
            _ = &mut exited_rx => false,
        };
        if eof_sent {
            // Until the process is gone, a relay that breaks still says so.
            loop {
                tokio::select! {
                    _ = &mut exited_rx => break,
                    _ = cancel.as_mut(), if !cancelled => {
                        cancelled = true;
                        broken.cancel();
                    }
                    frame = inbound.next(), if !broken.is_cancelled() => {
                        if !matches!(frame, Some(Ok(_))) {
                            broken.cancel();
                        }
                    }
                }
            }
        }
        drop(stdin_tx);
        // What the client still sends is read and dropped until it ends.
        if !cancelled && !broken.is_cancelled() {
            relay::drain(inbound, std::future::pending()).await;
        }
    };

    // Stdout -> relay; the exit becomes eof. A gone relay does not stop
    // the reading: the process must never block on its output.
    let output = async move {
        let mut out = Some(out);
        let mut exited_tx = Some(exited_tx);
        while let Some(frame) = events_rx.recv().await {
            let Some(relay_frame::Payload::ExecEvent(event)) = frame.payload else {
                continue;
            };
            match event.payload {
                Some(exec_sandbox_event::Payload::Stdout(stdout)) => {
                    if broken_out.is_cancelled() {
                        out = None;
                    }
                    if let Some(sender) = &out {
                        let sent = tokio::select! {
                            sent = sender.send(data_frame(stdout.data.into())) => sent.is_ok(),
                            _ = broken_out.cancelled() => false,
                        };
                        if !sent {
                            out = None;
                        }
                    }
                }
                Some(exec_sandbox_event::Payload::Stderr(stderr)) => {
                    debug!(stderr = %String::from_utf8_lossy(&stderr.data), "sftp server");
                }
                Some(exec_sandbox_event::Payload::Exit(exit)) => {
                    debug!(exit_code = exit.exit_code, "sftp server exited");
                    if let Some(sender) = out.take() {
                        let _ = sender.send(eof_frame()).await;
                    }
                    if let Some(tx) = exited_tx.take() {
                        let _ = tx.send(());
                    }
                }
                None => {}
            }
        }
    };

    // The process is killed only EXIT_GRACE after its input ended.
    let kill = async move {
        let _ = input_over_rx.await;
        tokio::time::sleep(EXIT_GRACE).await;
    };
    let request = ExecSandboxRequest {
        command: vec!["sftp-server".into()],
        ..Default::default()
    };
    let process = exec::run_program(
        Program::Sftp,
        request,
        &settings,
        events_tx,
        ReceiverStream::new(stdin_rx),
        kill,
    );
    // The output side ends with the process (its sender goes with it).
    let mut input = pin!(input);
    let mut input_done = false;
    let serving = async {
        tokio::join!(process, output);
    };
    let mut serving = pin!(serving);
    loop {
        tokio::select! {
            _ = &mut input, if !input_done => input_done = true,
            _ = &mut serving => break,
        }
    }
    // The process is gone: give the input side its drain, bounded.
    if !input_done {
        let _ = tokio::time::timeout(relay::DRAIN_TIMEOUT, input).await;
    }
}
