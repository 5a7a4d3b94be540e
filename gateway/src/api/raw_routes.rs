//! The relay routes, served without tonic's codec: `ExecSandbox`,
//! `ExecSandboxInteractive` and `ForwardTcp` (clients), `RelayStream`
//! (supervisors) and the peer service's `PeerRelayFrames` (replicas). These carry an exec's output and a forward's bytes, and
//! tonic would copy each message twice on its way through this replica:
//! into its receive buffer when decoding, into its send buffer when
//! encoding. Here the request's messages are read with
//! `openshell_sdk::wire::GrpcFrames` (each, prefix included, a slice of the
//! HTTP/2 chunk it came in) and the answer is written with
//! `wire::ResponseBody`, so a forward's data frame crosses the replica
//! uncopied and in one piece, and an exec's output event is sent on as the
//! supervisor encoded it (`sessions::frames`).
//!
//! [`RawRoutes`] wraps a generated server (`OpenShell`, `Peer`) and takes
//! these paths before it; every other method goes on to it. It sits inside the
//! request layer, so authentication, `x-openshell-served-by` and the
//! request metrics are the same as for every call, and inside tonic's
//! server, which enforces `grpc-timeout`. What tonic's generated code does
//! for a streaming method is done here too: compressed requests are
//! refused (`UNIMPLEMENTED`), messages over the size limit fail with
//! `OUT_OF_RANGE`, errors before the answer are trailers-only, and the
//! answer ends with its status in the trailers. A request message that does
//! not decode is the client's fault (`INVALID_ARGUMENT`).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::StreamExt;
use futures::future::BoxFuture;
use http::{Request, Response};
use openshell_sdk::wire::{self, GrpcFrames, Outbound, ResponseBody};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::body::Body;
use tonic::server::NamedService;

use crate::api::service::GatewayService;
use crate::api::streams::{first_message, malformed};
use crate::auth::Principal;
use crate::sessions::{FrameStream, frames};

const EXEC: &str = "/openshell.v1.OpenShell/ExecSandbox";
const EXEC_INTERACTIVE: &str = "/openshell.v1.OpenShell/ExecSandboxInteractive";
const FORWARD_TCP: &str = "/openshell.v1.OpenShell/ForwardTcp";
const RELAY_STREAM: &str = "/openshell.v1.OpenShell/RelayStream";
pub const PEER_RELAY_FRAMES: &str = "/openshell.peer.v1.Peer/PeerRelayFrames";

/// The generated `OpenShell` server `S`, with `ForwardTcp` and
/// `RelayStream` served by `service` directly.
#[derive(Clone)]
pub struct RawRoutes<S> {
    inner: S,
    service: Arc<GatewayService>,
    max_message_size: usize,
    /// False (tests only): `PeerRelayFrames` goes on to `inner`, which
    /// answers UNIMPLEMENTED as a replica from before it does.
    peer_relay_frames: bool,
}

impl<S> RawRoutes<S> {
    /// `max_message_size`: the largest request message, as the generated
    /// server's `max_decoding_message_size`.
    pub fn new(inner: S, service: Arc<GatewayService>, max_message_size: usize) -> Self {
        Self {
            inner,
            service,
            max_message_size,
            peer_relay_frames: true,
        }
    }

    /// Leaves `PeerRelayFrames` to the wrapped server (tests only).
    pub fn without_peer_relay_frames(mut self) -> Self {
        self.peer_relay_frames = false;
        self
    }
}

impl<S: NamedService> NamedService for RawRoutes<S> {
    const NAME: &'static str = S::NAME;
}

#[derive(Clone, Copy)]
enum Route {
    Exec,
    ExecInteractive,
    Forward,
    Relay,
    PeerRelay,
}

impl<S> tower::Service<Request<Body>> for RawRoutes<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let route = match request.uri().path() {
            EXEC => Route::Exec,
            EXEC_INTERACTIVE => Route::ExecInteractive,
            FORWARD_TCP => Route::Forward,
            RELAY_STREAM => Route::Relay,
            PEER_RELAY_FRAMES if self.peer_relay_frames => Route::PeerRelay,
            _ => return Box::pin(self.inner.call(request)),
        };
        let service = self.service.clone();
        let max = self.max_message_size;
        Box::pin(async move {
            Ok(match serve(&service, route, request, max).await {
                Ok(answer) => wire::response(ResponseBody::new(answer.boxed())),
                Err(status) => status.into_http(),
            })
        })
    }
}

async fn serve(
    service: &GatewayService,
    route: Route,
    request: Request<Body>,
    max_message_size: usize,
) -> Result<ReceiverStream<Result<Outbound, Status>>, Status> {
    wire::check_request(request.headers())?;
    let principal = request.extensions().get::<Principal>().cloned();
    let (parts, body) = request.into_parts();
    let messages = GrpcFrames::request(body, max_message_size);
    match route {
        Route::Exec => {
            // One request message, as tonic's server-streaming methods read
            // it; anything after it is not read.
            let mut messages = messages;
            let request = first_message(&mut messages, "exec request")
                .await?
                .ok_or_else(|| Status::internal("Missing request message."))?;
            let request = frames::decode_message(request)
                .map_err(|status| malformed(&status, "exec request").unwrap_or(status))?;
            service.streams.exec(request).await
        }
        Route::ExecInteractive => {
            let inputs = messages.map(|m| m.and_then(frames::decode_message));
            service.streams.exec_interactive(inputs).await
        }
        Route::Forward => {
            let principal = principal.unwrap_or(Principal::SshSessionOnly);
            let messages: FrameStream = Box::pin(messages.with_prefixes());
            service.streams.forward(principal, messages).await
        }
        Route::Relay => {
            let messages: FrameStream = Box::pin(messages.with_prefixes());
            service.claim_relay(principal, messages).await
        }
        Route::PeerRelay => {
            let messages: FrameStream = Box::pin(messages.with_prefixes());
            crate::api::peer::relay_frames(&service.sessions, principal, &parts.headers, messages)
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routes_are_the_contract_paths() {
        for (path, name) in [
            (EXEC, "ExecSandbox"),
            (EXEC_INTERACTIVE, "ExecSandboxInteractive"),
            (FORWARD_TCP, "ForwardTcp"),
            (RELAY_STREAM, "RelayStream"),
            (PEER_RELAY_FRAMES, "PeerRelayFrames"),
        ] {
            assert_eq!(openshell_proto::method(path).map(|m| m.name), Some(name));
        }
        assert_eq!(
            <RawRoutes<openshell_proto::open_shell_server::OpenShellServer<GatewayService>>>::NAME,
            "openshell.v1.OpenShell"
        );
    }
}
