//! `ForwardTcp`: a TCP stream to a port in the sandbox, pumped between the
//! client and a relay to the sandbox's supervisor. It is served by the raw
//! relay route (`raw_routes`): the client's messages arrive encoded, and a
//! data frame passes to the relay, and back, as the bytes it arrived in
//! (see `sessions::frames`). Only init, eof and oddly encoded frames are
//! decoded.
//!
//! A forward may carry an SSH session token (`init.authorization_token`,
//! from `CreateSshSession`): it must be live and belong to the sandbox the
//! init names, else UNAUTHENTICATED, whoever calls. A caller without a user
//! token ([`Principal::SshSessionOnly`]) must bring one. Every refusal is the
//! same message, so a token-only caller learns nothing about other
//! sandboxes, and no message or log line carries the token. Such a forward
//! ends with UNAUTHENTICATED when its session does (see
//! [`OpenForwards`](crate::api::ssh_sessions::OpenForwards)).

use bytes::Bytes;
use futures::StreamExt;
use openshell_proto::{
    RelayFrame, SftpRelayTarget, SshRelayTarget, TcpForwardEof, TcpForwardFrame, TcpRelayTarget,
    relay_frame, relay_open, tcp_forward_frame, tcp_forward_init,
};
use openshell_sdk::wire::Outbound;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::streams::{Streams, eof_frame, first_message, malformed, relay_failure, require_ready};
use crate::api::ssh_sessions::RECHECK_INTERVAL;
use crate::auth::{self, Principal};
use crate::sandboxes::{id_of, merged_environment, store_status};
use crate::sessions::{FrameStream, frames};
use crate::validate;

/// The forward's answer: encoded `TcpForwardFrame`s.
pub type ForwardFrames = ReceiverStream<Result<Outbound, Status>>;

/// How long a forward without a user token may take to send its init.
const ANONYMOUS_INIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Every refusal of an SSH session token, whatever the reason.
const BAD_SSH_SESSION: &str =
    "the SSH session token is unknown, revoked, expired or for another sandbox";

/// The SSH session a forward was opened with: its token hash and the time
/// it has left.
struct ForwardSession {
    hash: String,
    expires_in: Option<std::time::Duration>,
}

/// A client's message after the init.
enum FromClient {
    /// Bytes for the sandbox, as a relay frame.
    Data(Outbound),
    Init,
    Eof,
    /// A frame without a payload (a newer client's): ignored.
    Skip,
}

/// Decodes a client message (framed; a data frame passes as it is). Failures are
/// the client's: the status to end its stream with.
fn from_client(message: Bytes) -> Result<FromClient, Status> {
    if let Some(len) = frames::data_len(&message) {
        validate::frame_size("forward data frame", len)?;
        return Ok(FromClient::Data(Outbound::Framed(message)));
    }
    let frame: TcpForwardFrame = frames::decode(message)
        .map_err(|status| malformed(&status, "forward frame").unwrap_or(status))?;
    Ok(match frame.payload {
        Some(tcp_forward_frame::Payload::Data(data)) => {
            validate::frame_size("forward data frame", data.len())?;
            FromClient::Data(frames::framed(&RelayFrame {
                payload: Some(relay_frame::Payload::Data(data)),
            }))
        }
        Some(tcp_forward_frame::Payload::Init(_)) => FromClient::Init,
        Some(tcp_forward_frame::Payload::Eof(_)) => FromClient::Eof,
        None => FromClient::Skip,
    })
}

/// A relay frame from the supervisor.
enum FromSandbox {
    /// Bytes for the client, as a forward frame.
    Data(Outbound),
    Eof,
    /// Not a forward's frame: ignored.
    Skip,
}

fn from_sandbox(message: Bytes) -> Result<FromSandbox, Status> {
    if frames::data_len(&message).is_some() {
        return Ok(FromSandbox::Data(Outbound::Framed(message)));
    }
    Ok(match frames::decode::<RelayFrame>(message)?.payload {
        Some(relay_frame::Payload::Data(data)) => {
            FromSandbox::Data(frames::framed(&TcpForwardFrame {
                payload: Some(tcp_forward_frame::Payload::Data(data)),
            }))
        }
        Some(relay_frame::Payload::Eof(_)) => FromSandbox::Eof,
        _ => FromSandbox::Skip,
    })
}

impl Streams {
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

    /// Serves a forward: `input` is the client's encoded messages.
    pub async fn forward(
        &self,
        principal: Principal,
        mut input: FrameStream,
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
        let first = first
            .map(frames::decode::<TcpForwardFrame>)
            .transpose()
            .map_err(|status| malformed(&status, "forward frame").unwrap_or(status))?;
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
            Some(tcp_forward_init::Target::Sftp(_)) => {
                relay_open::Target::Sftp(SftpRelayTarget::default())
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
                        message = input.next() => message,
                    };
                    let parsed = match message {
                        Some(Ok(message)) => from_client(message),
                        None => Ok(FromClient::Eof),
                        Some(Err(status)) => {
                            if let Some(invalid) = malformed(&status, "forward frame") {
                                let _ = tx.send(Err(invalid)).await;
                            }
                            abort.cancel();
                            return;
                        }
                    };
                    let frame = match parsed {
                        Ok(FromClient::Data(frame)) => frame,
                        Ok(FromClient::Init) => {
                            let _ = tx
                                .send(Err(Status::invalid_argument(
                                    "init may only be the first forward frame",
                                )))
                                .await;
                            abort.cancel();
                            return;
                        }
                        Ok(FromClient::Eof) => {
                            let _ = outbound.send(Ok(frames::framed(&eof_frame()))).await;
                            client_done.cancel();
                            return;
                        }
                        Ok(FromClient::Skip) => continue,
                        Err(status) => {
                            let _ = tx.send(Err(status)).await;
                            abort.cancel();
                            return;
                        }
                    };
                    if outbound.send(Ok(frame)).await.is_err() {
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
                    frame = relay.inbound.next() => frame,
                };
                let frame = match frame.map(|f| f.and_then(from_sandbox)) {
                    Some(Ok(FromSandbox::Data(frame))) => frame,
                    Some(Ok(FromSandbox::Eof)) => {
                        let eof = frames::framed(&TcpForwardFrame {
                            payload: Some(tcp_forward_frame::Payload::Eof(TcpForwardEof {})),
                        });
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
                    Some(Ok(FromSandbox::Skip)) => continue,
                    None => {
                        abort.cancel();
                        return;
                    }
                    Some(Err(status)) => {
                        let _ = tx.send(Err(relay_failure(status))).await;
                        abort.cancel();
                        return;
                    }
                };
                if tx.send(Ok(frame)).await.is_err() {
                    abort.cancel();
                    return;
                }
            }
        });
        Ok(ReceiverStream::new(rx))
    }
}
