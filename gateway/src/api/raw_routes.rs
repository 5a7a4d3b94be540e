//! The relay routes, served without tonic's codec: `ForwardTcp` (clients)
//! and `RelayStream` (supervisors). These two carry a forward's bytes, and
//! tonic would copy each message twice on its way through this replica:
//! into its receive buffer when decoding, into its send buffer when
//! encoding. Here the request's messages are read with
//! `openshell_sdk::wire::GrpcFrames` (each, prefix included, a slice of the
//! HTTP/2 chunk it came in) and the answer is written with
//! `wire::ResponseBody`, so a data frame crosses the replica uncopied and in
//! one piece (`sessions::frames`).
//!
//! [`RawRoutes`] wraps the generated `OpenShell` server and takes these two
//! paths before it; every other method goes on to it. It sits inside the
//! request layer, so authentication, `x-openshell-served-by` and the
//! request metrics are the same as for every call, and inside tonic's
//! server, which enforces `grpc-timeout`. What tonic's generated code does
//! for a streaming method is done here too: compressed requests are
//! refused (`UNIMPLEMENTED`), messages over the size limit fail with
//! `OUT_OF_RANGE`, errors before the answer are trailers-only, and the
//! answer ends with its status in the trailers.

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
use crate::auth::Principal;
use crate::sessions::FrameStream;

const FORWARD_TCP: &str = "/openshell.v1.OpenShell/ForwardTcp";
const RELAY_STREAM: &str = "/openshell.v1.OpenShell/RelayStream";

/// The generated `OpenShell` server `S`, with `ForwardTcp` and
/// `RelayStream` served by `service` directly.
#[derive(Clone)]
pub struct RawRoutes<S> {
    inner: S,
    service: Arc<GatewayService>,
    max_message_size: usize,
}

impl<S> RawRoutes<S> {
    /// `max_message_size`: the largest request message, as the generated
    /// server's `max_decoding_message_size`.
    pub fn new(inner: S, service: Arc<GatewayService>, max_message_size: usize) -> Self {
        Self {
            inner,
            service,
            max_message_size,
        }
    }
}

impl<S: NamedService> NamedService for RawRoutes<S> {
    const NAME: &'static str = S::NAME;
}

#[derive(Clone, Copy)]
enum Route {
    Forward,
    Relay,
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
            FORWARD_TCP => Route::Forward,
            RELAY_STREAM => Route::Relay,
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
    let messages: FrameStream =
        Box::pin(GrpcFrames::request(request.into_body(), max_message_size).with_prefixes());
    match route {
        Route::Forward => {
            let principal = principal.unwrap_or(Principal::SshSessionOnly);
            service.streams.forward(principal, messages).await
        }
        Route::Relay => service.claim_relay(principal, messages).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routes_are_the_contract_paths() {
        for (path, name) in [(FORWARD_TCP, "ForwardTcp"), (RELAY_STREAM, "RelayStream")] {
            assert_eq!(openshell_proto::method(path).map(|m| m.name), Some(name));
        }
        assert_eq!(
            <RawRoutes<openshell_proto::open_shell_server::OpenShellServer<GatewayService>>>::NAME,
            "openshell.v1.OpenShell"
        );
    }
}
