//! The owner-routed streams: exec, interactive exec and TCP forward. Each one
//! opens a relay to the sandbox's supervisor and pumps frames between the
//! client and the relay. A client that goes away drops the relay, which makes
//! the supervisor kill the process or close the socket; a gateway that shuts
//! down ends every stream with UNAVAILABLE instead of leaving it hanging.
//!
//! A forward may carry an SSH session token (`init.authorization_token`,
//! from `CreateSshSession`): it must be live and belong to the sandbox the
//! init names, else UNAUTHENTICATED, whoever calls. A caller without a user
//! token ([`Principal::SshSessionOnly`]) must bring one. Every refusal is the
//! same message, so a token-only caller learns nothing about other
//! sandboxes, and no message or log line carries the token. Such a forward
//! ends with UNAUTHENTICATED when its session does (see
//! [`OpenForwards`]).

use std::sync::Arc;

use openshell_proto::{
    ExecSandboxEvent, ExecSandboxInput, ExecSandboxRequest, RelayEof, RelayFrame, SandboxPhase,
    SshRelayTarget, TcpForwardEof, TcpForwardFrame, TcpRelayTarget, exec_sandbox_event,
    exec_sandbox_input, relay_frame, relay_open, tcp_forward_frame, tcp_forward_init,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status, Streaming};

use crate::api::ssh_sessions::{OpenForwards, RECHECK_INTERVAL};
use crate::auth::{self, Principal};
use crate::sandboxes::{Sandboxes, id_of, merged_environment, phase_of, store_status};
use crate::sessions::Relay;
use crate::sessions::routing::RelayRouter;
use crate::validate;
use futures::StreamExt;

pub type ExecEvents = ReceiverStream<Result<ExecSandboxEvent, Status>>;
pub type ForwardFrames = ReceiverStream<Result<TcpForwardFrame, Status>>;

pub struct Streams {
    pub sandboxes: Arc<Sandboxes>,
    pub router: Arc<RelayRouter>,
    pub shutdown: CancellationToken,
    pub ssh_forwards: Arc<OpenForwards>,
}

/// The SSH session a forward was opened with: its token hash and the time
/// it has left.
struct ForwardSession {
    hash: String,
    expires_in: Option<std::time::Duration>,
}

fn eof_frame() -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::Eof(RelayEof {})),
    }
}

/// How long a forward without a user token may take to send its init.
const ANONYMOUS_INIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Every refusal of an SSH session token, whatever the reason.
const BAD_SSH_SESSION: &str =
    "the SSH session token is unknown, revoked, expired or for another sandbox";

fn relay_failure(status: Status) -> Status {
    Status::unavailable(format!("sandbox relay failed: {}", status.message()))
}

/// A client message the gateway could not decode (tonic reports INTERNAL)
/// is the client's fault: INVALID_ARGUMENT. Other failures of a client's
/// stream (it reset the stream, its connection broke) get `None`: nobody
/// is left to read an answer.
fn malformed(status: &Status, what: &str) -> Option<Status> {
    (status.code() == Code::Internal)
        .then(|| Status::invalid_argument(format!("malformed {what}: {}", status.message())))
}

/// The first message of a client stream, with decode failures answered as
/// [`malformed`].
async fn first_message<T>(input: &mut Streaming<T>, what: &str) -> Result<Option<T>, Status> {
    input
        .message()
        .await
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

    /// The sandbox a forward reaches, checked against its SSH session token
    /// when there is one. Returns the sandbox and the session.
    async fn forward_sandbox(
        &self,
        principal: &Principal,
        name: &str,
        token: &str,
    ) -> Result<(openshell_proto::Sandbox, Option<ForwardSession>), Status> {
        if token.is_empty() {
            if *principal == Principal::SshSessionOnly {
                return Err(Status::unauthenticated(
                    "ForwardTcp needs a user token (authorization: Bearer <token>) or an SSH \
                     session token in init.authorization_token",
                ));
            }
            return Ok((self.sandboxes.by_name(name).await?, None));
        }
        if token.len() > 256 {
            return Err(Status::unauthenticated(BAD_SSH_SESSION));
        }
        let hash = auth::ssh_session_hash(token);
        let session = self
            .sandboxes
            .store
            .ssh_session(&hash)
            .await
            .map_err(store_status)?
            .filter(|s| !s.revoked && !s.expired)
            .ok_or_else(|| Status::unauthenticated(BAD_SSH_SESSION))?;
        let sandbox = match self.sandboxes.by_name(name).await {
            Ok(sandbox) => sandbox,
            // A token-only caller may not learn which names exist.
            Err(status)
                if status.code() == tonic::Code::NotFound
                    && *principal == Principal::SshSessionOnly =>
            {
                return Err(Status::unauthenticated(BAD_SSH_SESSION));
            }
            Err(status) => return Err(status),
        };
        if id_of(&sandbox) != session.sandbox_id {
            return Err(Status::unauthenticated(BAD_SSH_SESSION));
        }
        Ok((
            sandbox,
            Some(ForwardSession {
                hash,
                expires_in: session.expires_in,
            }),
        ))
    }

    pub async fn exec(&self, req: ExecSandboxRequest) -> Result<ExecEvents, Status> {
        let (sandbox_id, start) = self.prepare_exec(&req).await?;
        let relay = self
            .open(&sandbox_id, relay_open::Target::Exec(start))
            .await?;
        // All stdin travelled in the request; close the process's stdin.
        relay
            .outbound
            .send(Ok(eof_frame()))
            .await
            .map_err(|_| Status::unavailable("sandbox relay closed"))?;
        let (tx, rx) = mpsc::channel(32);
        let done = CancellationToken::new();
        tokio::spawn(pump_exec_events(relay, tx, self.shutdown.clone(), done));
        Ok(ReceiverStream::new(rx))
    }

    pub async fn exec_interactive(
        &self,
        mut input: Streaming<ExecSandboxInput>,
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
                    message = input.message() => message,
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
                        let _ = outbound.send(Ok(eof_frame())).await;
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
                if outbound.send(Ok(frame)).await.is_err() {
                    return;
                }
            }
        });
        tokio::spawn(pump_exec_events(relay, tx, self.shutdown.clone(), done));
        Ok(ReceiverStream::new(rx))
    }

    pub async fn forward(
        &self,
        principal: Principal,
        mut input: Streaming<TcpForwardFrame>,
    ) -> Result<ForwardFrames, Status> {
        // A caller without a user token may not hold a stream open unnamed.
        let first = if principal == Principal::SshSessionOnly {
            tokio::time::timeout(
                ANONYMOUS_INIT_WAIT,
                first_message(&mut input, "forward frame"),
            )
            .await
            .map_err(|_| Status::deadline_exceeded("no forward init within 10 s"))??
        } else {
            first_message(&mut input, "forward frame").await?
        };
        let init = match first {
            Some(TcpForwardFrame {
                payload: Some(tcp_forward_frame::Payload::Init(init)),
            }) => init,
            _ => {
                return Err(Status::invalid_argument(
                    "the first forward frame must be init",
                ));
            }
        };
        validate::sandbox_name(&init.sandbox)?;
        if !(init.workspace.is_empty() || init.workspace == "default") {
            return Err(Status::not_found(format!(
                "workspace {} not found",
                crate::validate::quote(&init.workspace)
            )));
        }
        let mut target = match &init.target {
            Some(tcp_forward_init::Target::Tcp(tcp)) => {
                let host = validate::forward_target(&tcp.host, tcp.port)?;
                relay_open::Target::Tcp(TcpRelayTarget {
                    host,
                    port: tcp.port,
                })
            }
            // The sandbox's embedded SSH server (the supervisor's); its
            // environment is the sandbox's, set below.
            Some(tcp_forward_init::Target::Ssh(_)) => {
                relay_open::Target::Ssh(SshRelayTarget::default())
            }
            None => return Err(Status::invalid_argument("forward init needs a target")),
        };
        let (sandbox, ssh_session) = self
            .forward_sandbox(&principal, &init.sandbox, &init.authorization_token)
            .await?;
        drop(init);
        require_ready(&sandbox)?;
        if let relay_open::Target::Ssh(ssh) = &mut target {
            ssh.environment = merged_environment(sandbox.spec.as_ref(), &Default::default());
        }
        let relay = self
            .router
            .open(
                id_of(&sandbox),
                target,
                ssh_session.as_ref().map(|s| s.hash.as_str()),
            )
            .await?;
        // Resolves with the status the forward ends with when its SSH
        // session ends; never for a forward without one.
        let session_end: std::pin::Pin<Box<dyn Future<Output = Status> + Send>> = match ssh_session
        {
            Some(session) => Box::pin(self.ssh_forwards.session_end(
                self.sandboxes.store.clone(),
                session.hash,
                session.expires_in,
                RECHECK_INTERVAL,
            )),
            None => Box::pin(std::future::pending()),
        };

        let (tx, rx) = mpsc::channel(32);
        let abort = CancellationToken::new();
        let client_done = CancellationToken::new();
        // Client -> sandbox.
        {
            let outbound = relay.outbound.clone();
            let tx = tx.clone();
            let abort = abort.clone();
            let client_done = client_done.clone();
            tokio::spawn(async move {
                loop {
                    let message = tokio::select! {
                        _ = abort.cancelled() => return,
                        message = input.message() => message,
                    };
                    let frame = match message {
                        Ok(Some(TcpForwardFrame {
                            payload: Some(tcp_forward_frame::Payload::Data(data)),
                        })) => {
                            if let Err(status) =
                                validate::frame_size("forward data frame", data.len())
                            {
                                let _ = tx.send(Err(status)).await;
                                abort.cancel();
                                return;
                            }
                            relay_frame::Payload::Data(data)
                        }
                        Ok(Some(TcpForwardFrame {
                            payload: Some(tcp_forward_frame::Payload::Init(_)),
                        })) => {
                            let _ = tx
                                .send(Err(Status::invalid_argument(
                                    "init may only be the first forward frame",
                                )))
                                .await;
                            abort.cancel();
                            return;
                        }
                        Ok(Some(TcpForwardFrame {
                            payload: Some(tcp_forward_frame::Payload::Eof(_)),
                        }))
                        | Ok(None) => {
                            let _ = outbound.send(Ok(eof_frame())).await;
                            client_done.cancel();
                            return;
                        }
                        Ok(Some(_)) => continue,
                        Err(status) => {
                            if let Some(invalid) = malformed(&status, "forward frame") {
                                let _ = tx.send(Err(invalid)).await;
                            }
                            abort.cancel();
                            return;
                        }
                    };
                    if outbound
                        .send(Ok(RelayFrame {
                            payload: Some(frame),
                        }))
                        .await
                        .is_err()
                    {
                        abort.cancel();
                        return;
                    }
                }
            });
        }
        // Sandbox -> client.
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut relay = relay;
            let mut session_end = session_end;
            loop {
                let frame = tokio::select! {
                    _ = abort.cancelled() => return,
                    _ = tx.closed() => { abort.cancel(); return; }
                    status = &mut session_end => {
                        let _ = tx.send(Err(status)).await;
                        abort.cancel();
                        return;
                    }
                    _ = shutdown.cancelled() => {
                        let _ = tx.send(Err(Status::unavailable("gateway is shutting down"))).await;
                        abort.cancel();
                        return;
                    }
                    frame = relay.inbound.next() => frame.transpose(),
                };
                let payload = match frame {
                    Ok(Some(RelayFrame {
                        payload: Some(relay_frame::Payload::Data(data)),
                    })) => tcp_forward_frame::Payload::Data(data),
                    Ok(Some(RelayFrame {
                        payload: Some(relay_frame::Payload::Eof(_)),
                    })) => {
                        let eof = TcpForwardFrame {
                            payload: Some(tcp_forward_frame::Payload::Eof(TcpForwardEof {})),
                        };
                        if tx.send(Ok(eof)).await.is_err() {
                            abort.cancel();
                            return;
                        }
                        // The sandbox side finished writing; end once the client has too.
                        tokio::select! {
                            _ = client_done.cancelled() => {}
                            _ = abort.cancelled() => {}
                            _ = tx.closed() => {}
                            status = &mut session_end => {
                                let _ = tx.send(Err(status)).await;
                            }
                            _ = shutdown.cancelled() => {
                                let _ = tx.send(Err(Status::unavailable("gateway is shutting down"))).await;
                            }
                        }
                        abort.cancel();
                        return;
                    }
                    Ok(Some(_)) => continue,
                    Ok(None) => {
                        abort.cancel();
                        return;
                    }
                    Err(status) => {
                        let _ = tx.send(Err(relay_failure(status))).await;
                        abort.cancel();
                        return;
                    }
                };
                if tx
                    .send(Ok(TcpForwardFrame {
                        payload: Some(payload),
                    }))
                    .await
                    .is_err()
                {
                    abort.cancel();
                    return;
                }
            }
        });
        Ok(ReceiverStream::new(rx))
    }
}

fn require_ready(sandbox: &openshell_proto::Sandbox) -> Result<(), Status> {
    let phase = phase_of(sandbox);
    if phase != SandboxPhase::Ready {
        return Err(Status::failed_precondition(format!(
            "sandbox is not ready (phase {})",
            phase.as_str_name().trim_start_matches("SANDBOX_PHASE_")
        )));
    }
    Ok(())
}

/// Relays exec events to the client until the exit event. Ends the client
/// stream with UNAVAILABLE if the relay breaks first or the gateway stops.
async fn pump_exec_events(
    mut relay: Relay,
    tx: mpsc::Sender<Result<ExecSandboxEvent, Status>>,
    shutdown: CancellationToken,
    done: CancellationToken,
) {
    let _stop_input = done.clone().drop_guard();
    loop {
        let frame = tokio::select! {
            _ = tx.closed() => return,
            _ = done.cancelled() => return,
            _ = shutdown.cancelled() => {
                let _ = tx.send(Err(Status::unavailable("gateway is shutting down"))).await;
                return;
            }
            frame = relay.inbound.next() => frame.transpose(),
        };
        match frame {
            Ok(Some(RelayFrame {
                payload: Some(relay_frame::Payload::ExecEvent(event)),
            })) => {
                let exit = matches!(event.payload, Some(exec_sandbox_event::Payload::Exit(_)));
                if tx.send(Ok(event)).await.is_err() || exit {
                    return;
                }
            }
            Ok(Some(_)) => continue,
            Ok(None) => {
                let _ = tx
                    .send(Err(Status::unavailable(
                        "sandbox relay ended before the process exited",
                    )))
                    .await;
                return;
            }
            Err(status) => {
                let _ = tx.send(Err(relay_failure(status))).await;
                return;
            }
        }
    }
}
