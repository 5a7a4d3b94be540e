//! The owner-routed streams: exec, interactive exec and TCP forward (in
//! `forward`), served by the raw relay routes (`raw_routes`). Each one opens
//! a relay to the sandbox's supervisor and pumps frames between the client
//! and the relay. A client that goes away drops
//! the relay, which makes the supervisor kill the process or close the
//! socket; a gateway that shuts down ends every stream with UNAVAILABLE
//! instead of leaving it hanging.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use openshell_proto::{
    ExecSandboxInput, ExecSandboxRequest, RelayEof, RelayFrame, SandboxPhase, exec_sandbox_event,
    exec_sandbox_input, relay_frame, relay_open,
};
use openshell_sdk::wire::Outbound;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use crate::api::ssh_sessions::OpenForwards;
use crate::sandboxes::{Sandboxes, id_of, merged_environment, phase_of};
use crate::sessions::routing::RelayRouter;
use crate::sessions::{Relay, frames};
use crate::validate;

/// An exec's answer: encoded `ExecSandboxEvent`s (stdout and stderr as the
/// supervisor encoded them, see `frames::exec_output`).
pub type ExecEvents = ReceiverStream<Result<Outbound, Status>>;

pub struct Streams {
    pub sandboxes: Arc<Sandboxes>,
    pub router: Arc<RelayRouter>,
    pub shutdown: CancellationToken,
    pub ssh_forwards: Arc<OpenForwards>,
}

pub(super) fn eof_frame() -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::Eof(RelayEof {})),
    }
}

pub(super) fn relay_failure(status: Status) -> Status {
    Status::unavailable(format!("sandbox relay failed: {}", status.message()))
}

/// A client message the gateway could not decode (INTERNAL, as tonic's
/// decoder reports it) is the client's fault: INVALID_ARGUMENT. A message
/// over the size limit (OUT_OF_RANGE) is too, and keeps its status. Other
/// failures of a client's stream (it reset the stream, its connection
/// broke) get `None`: nobody is left to read an answer.
pub(super) fn malformed(status: &Status, what: &str) -> Option<Status> {
    match status.code() {
        Code::Internal => Some(Status::invalid_argument(format!(
            "malformed {what}: {}",
            status.message()
        ))),
        Code::OutOfRange => Some(status.clone()),
        _ => None,
    }
}

/// The first message of a client stream, with decode failures answered as
/// [`malformed`].
pub(super) async fn first_message<T>(
    input: &mut (impl Stream<Item = Result<T, Status>> + Unpin),
    what: &str,
) -> Result<Option<T>, Status> {
    input
        .next()
        .await
        .transpose()
        .map_err(|status| malformed(&status, what).unwrap_or(status))
}

impl Streams {
    /// Validates an exec request and returns the sandbox id and the request
    /// the supervisor will run (environment merged).
    async fn prepare_exec(
        &self,
        req: &ExecSandboxRequest,
    ) -> Result<(String, ExecSandboxRequest), Status> {
        validate::workspace(req.workspace_scope.as_ref())?;
        validate::sandbox_name(&req.sandbox)?;
        validate::command("command", &req.command, true)?;
        validate::environment("environment", &req.environment)?;
        if req.workdir.contains('\0') {
            return Err(Status::invalid_argument(
                "workdir must not contain NUL bytes",
            ));
        }
        if let Some(timeout) = &req.execution_timeout
            && (timeout.seconds < 0
                || timeout.nanos < 0
                || (timeout.seconds == 0 && timeout.nanos == 0))
        {
            return Err(Status::invalid_argument(
                "execution_timeout must be positive",
            ));
        }
        let sandbox = self.sandboxes.by_name(&req.sandbox).await?;
        require_ready(&sandbox)?;
        let mut start = req.clone();
        start.environment = merged_environment(sandbox.spec.as_ref(), &req.environment);
        Ok((id_of(&sandbox).to_owned(), start))
    }

    async fn open(&self, sandbox_id: &str, target: relay_open::Target) -> Result<Relay, Status> {
        self.router.open(sandbox_id, target, None).await
    }

    pub async fn exec(&self, req: ExecSandboxRequest) -> Result<ExecEvents, Status> {
        let (sandbox_id, start) = self.prepare_exec(&req).await?;
        let relay = self
            .open(&sandbox_id, relay_open::Target::Exec(start))
            .await?;
        // All stdin travelled in the request; close the process's stdin.
        if !relay.send_frame(&eof_frame()).await {
            return Err(Status::unavailable("sandbox relay closed"));
        }
        let (tx, rx) = mpsc::channel(32);
        let done = CancellationToken::new();
        tokio::spawn(pump_exec_events(relay, tx, self.shutdown.clone(), done));
        Ok(ReceiverStream::new(rx))
    }

    pub async fn exec_interactive(
        &self,
        mut input: impl Stream<Item = Result<ExecSandboxInput, Status>> + Send + Unpin + 'static,
    ) -> Result<ExecEvents, Status> {
        let start = match first_message(&mut input, "exec input message").await? {
            Some(ExecSandboxInput {
                payload: Some(exec_sandbox_input::Payload::Start(start)),
            }) => start,
            _ => {
                return Err(Status::invalid_argument(
                    "the first interactive exec message must be start",
                ));
            }
        };
        let (sandbox_id, start) = self.prepare_exec(&start).await?;
        let relay = self
            .open(&sandbox_id, relay_open::Target::Exec(start))
            .await?;
        let (tx, rx) = mpsc::channel(32);
        let done = CancellationToken::new();
        let outbound = relay.outbound.clone();
        let input_tx = tx.clone();
        let input_done = done.clone();
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    _ = input_done.cancelled() => return,
                    message = input.next() => message.transpose(),
                };
                let frame = match message {
                    Ok(Some(ExecSandboxInput {
                        payload: Some(payload),
                    })) => match payload {
                        exec_sandbox_input::Payload::Stdin(data) => {
                            if let Err(status) = validate::frame_size("stdin message", data.len()) {
                                let _ = input_tx.send(Err(status)).await;
                                input_done.cancel();
                                return;
                            }
                            exec_sandbox_input::Payload::Stdin(data)
                        }
                        exec_sandbox_input::Payload::Resize(resize) => {
                            exec_sandbox_input::Payload::Resize(resize)
                        }
                        exec_sandbox_input::Payload::Start(_) => {
                            let _ = input_tx
                                .send(Err(Status::invalid_argument(
                                    "start may only be the first interactive exec message",
                                )))
                                .await;
                            input_done.cancel();
                            return;
                        }
                    },
                    Ok(Some(_)) => continue,
                    Ok(None) => {
                        // Client closed its side: close the process's stdin
                        // and keep the relay open for the remaining output.
                        let _ = outbound.send(Ok(frames::framed(&eof_frame()))).await;
                        input_done.cancelled().await;
                        return;
                    }
                    Err(status) => {
                        if let Some(invalid) = malformed(&status, "exec input message") {
                            let _ = input_tx.send(Err(invalid)).await;
                        }
                        input_done.cancel();
                        return;
                    }
                };
                let frame = RelayFrame {
                    payload: Some(relay_frame::Payload::ExecInput(ExecSandboxInput {
                        payload: Some(frame),
                    })),
                };
                if outbound.send(Ok(frames::framed(&frame))).await.is_err() {
                    return;
                }
            }
        });
        tokio::spawn(pump_exec_events(relay, tx, self.shutdown.clone(), done));
        Ok(ReceiverStream::new(rx))
    }
}

pub(super) fn require_ready(sandbox: &openshell_proto::Sandbox) -> Result<(), Status> {
    let phase = phase_of(sandbox);
    if phase != SandboxPhase::Ready {
        return Err(Status::failed_precondition(format!(
            "sandbox is not ready (phase {})",
            phase.as_str_name().trim_start_matches("SANDBOX_PHASE_")
        )));
    }
    Ok(())
}

/// Ends an exec's answer with UNAVAILABLE when its pump stops before the
/// exit event was sent and without saying why (a panic, or a path that
/// forgot to): the stream never ends as if the exec had succeeded quietly.
/// An error sent before stays the one the client sees.
struct Ending {
    tx: Option<mpsc::Sender<Result<Outbound, Status>>>,
}

impl Drop for Ending {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take()
            && !tx.is_closed()
        {
            tracing::warn!("an exec's relay pump ended before the exit event");
            tokio::spawn(async move {
                let _ = tx
                    .send(Err(Status::unavailable(
                        "sandbox relay ended before the process exited",
                    )))
                    .await;
            });
        }
    }
}

/// Relays exec events to the client until the exit event. Ends the client
/// stream with UNAVAILABLE if the relay breaks first or the gateway stops.
/// Output events pass as the supervisor encoded them; the rest are decoded.
async fn pump_exec_events(
    mut relay: Relay,
    tx: mpsc::Sender<Result<Outbound, Status>>,
    shutdown: CancellationToken,
    done: CancellationToken,
) {
    let _stop_input = done.clone().drop_guard();
    let mut ending = Ending {
        tx: Some(tx.clone()),
    };
    loop {
        let message = tokio::select! {
            _ = tx.closed() => return,
            // The input side ended the exec and said why.
            _ = done.cancelled() => {
                ending.tx = None;
                return;
            }
            _ = shutdown.cancelled() => {
                ending.tx = None;
                let _ = tx.send(Err(Status::unavailable("gateway is shutting down"))).await;
                return;
            }
            message = relay.inbound.next() => message,
        };
        let frame = match message {
            Some(Ok(message)) => match frames::exec_output(&message) {
                Some(event) => {
                    if tx.send(Ok(Outbound::Message(event))).await.is_err() {
                        return;
                    }
                    continue;
                }
                None => frames::decode::<RelayFrame>(message),
            },
            None => {
                ending.tx = None;
                let _ = tx
                    .send(Err(Status::unavailable(
                        "sandbox relay ended before the process exited",
                    )))
                    .await;
                return;
            }
            Some(Err(status)) => Err(status),
        };
        match frame {
            Ok(RelayFrame {
                payload: Some(relay_frame::Payload::ExecEvent(event)),
            }) => {
                let exit = matches!(event.payload, Some(exec_sandbox_event::Payload::Exit(_)));
                if exit {
                    ending.tx = None;
                }
                if tx.send(Ok(frames::framed(&event))).await.is_err() || exit {
                    return;
                }
            }
            Ok(_) => continue,
            Err(status) => {
                ending.tx = None;
                let _ = tx.send(Err(relay_failure(status))).await;
                return;
            }
        }
    }
}
