//! Moving an exec's bytes: output to relay frames, relay frames to stdin and
//! pty resizes.

use super::*;

/// The output pump failed because the relay's outbound side is gone.
pub(super) struct RelayClosed;

pub(super) type OutputPump = Pin<Box<dyn Future<Output = Result<(), RelayClosed>> + Send>>;

pub(super) async fn pump_output<R>(
    mut reader: R,
    out: mpsc::Sender<RelayFrame>,
    event: fn(Vec<u8>) -> exec_sandbox_event::Payload,
) -> Result<(), RelayClosed>
where
    R: AsyncRead + Unpin,
{
    loop {
        // Each read lands in a buffer of its own, which becomes the event's
        // payload as is; a small read gives back the room it did not use.
        let mut buf = Vec::with_capacity(CHUNK);
        let n = match reader.read_buf(&mut buf).await {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => {
                debug!(error = %err, "exec output read failed");
                return Ok(());
            }
        };
        if n < CHUNK / 4 {
            buf.shrink_to_fit();
        }
        out.send(event_frame(event(buf)))
            .await
            .map_err(|_| RelayClosed)?;
    }
}

pub(super) fn stdout_event(data: Vec<u8>) -> exec_sandbox_event::Payload {
    exec_sandbox_event::Payload::Stdout(ExecSandboxStdout { data })
}

pub(super) fn stderr_event(data: Vec<u8>) -> exec_sandbox_event::Payload {
    exec_sandbox_event::Payload::Stderr(ExecSandboxStderr { data })
}

pub(super) fn event_frame(payload: exec_sandbox_event::Payload) -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::ExecEvent(ExecSandboxEvent {
            payload: Some(payload),
        })),
    }
}

pub(super) fn exit_frame(exit_code: i32) -> RelayFrame {
    exit_frame_with(exit_code, false)
}

/// The exit event, saying whether the sandbox's memory limit killed it.
pub(super) fn exit_frame_with(exit_code: i32, oom_killed: bool) -> RelayFrame {
    event_frame(exec_sandbox_event::Payload::Exit(ExecSandboxExit {
        exit_code,
        oom_killed,
    }))
}

/// Where stdin bytes go.
pub(super) enum Stdin {
    Pipe(ChildStdin),
    Pty(pty::Master),
}

impl Stdin {
    pub(super) async fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Stdin::Pipe(pipe) => pipe.write_all(data).await,
            Stdin::Pty(master) => master.write_all(data).await,
        }
    }

    /// A pipe is closed; a pty cannot close its input alone, so it gets the
    /// terminal's end-of-file character instead.
    pub(super) async fn close(self) {
        match self {
            Stdin::Pipe(pipe) => drop(pipe),
            Stdin::Pty(mut master) => {
                let eof = master.eof_char();
                let _ = master.write_all(&[eof]).await;
            }
        }
    }
}

pub(super) async fn write_stdin(stdin: &mut Option<Stdin>, data: &[u8]) {
    if let Some(sink) = stdin
        && let Err(err) = sink.write(data).await
    {
        // The process closed its stdin or exited; later input is dropped.
        debug!(error = %err, "exec stdin write failed");
        *stdin = None;
    }
}

/// Feeds stdin and resizes until the inbound relay stream ends.
pub(super) async fn pump_input<S>(
    inbound: &mut S,
    mut stdin: Option<Stdin>,
    initial: Vec<u8>,
    pty: Option<pty::Master>,
) where
    S: Stream<Item = Result<RelayFrame, tonic::Status>> + Unpin,
{
    if !initial.is_empty() {
        write_stdin(&mut stdin, &initial).await;
    }
    while let Some(frame) = inbound.next().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(status) => {
                debug!(error = %transport::describe_status(&status), "exec relay stream failed");
                return;
            }
        };
        match frame.payload {
            Some(relay_frame::Payload::ExecInput(ExecSandboxInput {
                payload: Some(input),
            })) => match input {
                exec_sandbox_input::Payload::Stdin(data) => write_stdin(&mut stdin, &data).await,
                exec_sandbox_input::Payload::Resize(size) => {
                    if let Some(pty) = &pty
                        && let Err(err) = pty.resize(size.cols, size.rows)
                    {
                        debug!(error = %err, "pty resize failed");
                    }
                }
                exec_sandbox_input::Payload::Start(_) => debug!("ignoring a second exec start"),
            },
            Some(relay_frame::Payload::Eof(_)) => {
                if let Some(stdin) = stdin.take() {
                    stdin.close().await;
                }
            }
            _ => debug!("ignoring an unexpected frame on an exec relay"),
        }
    }
}
