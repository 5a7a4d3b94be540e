//! A tower layer around every gRPC call: it authenticates the caller (and
//! answers UNAUTHENTICATED itself), stamps `x-openshell-served-by` on every
//! response, errors included, and counts requests by method and final status.
//! The method label comes from the generated method table: any path outside
//! the contract counts as `unknown`, so callers (authenticated or not)
//! cannot create metric series by inventing paths.
//!
//! The final status of a streaming call is only known from its trailers, so
//! the response body is wrapped and observed until it ends or is dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{HeaderValue, Request, Response};
use http_body::{Body, Frame};
use tonic::Status;

use crate::auth::{Authenticator, access_for};
use crate::metrics::{Metrics, code_name};

pub const SERVED_BY: &str = "x-openshell-served-by";

/// The `host[:port]` a call was addressed to (HTTP/2 `:authority`), as a
/// request extension.
#[derive(Debug, Clone)]
pub struct Authority(pub String);

#[derive(Clone)]
pub struct GatewayLayer {
    pub replica_id: HeaderValue,
    /// Take [`Authority`] from the edge's `x-openshell-forwarded-authority`
    /// when a request carries it (`serve --trust-forwarded-authority`).
    pub trust_forwarded_authority: bool,
    pub auth: Arc<Authenticator>,
    pub metrics: Arc<Metrics>,
}

impl<S> tower::Layer<S> for GatewayLayer {
    type Service = LayeredService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        LayeredService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct LayeredService<S> {
    inner: S,
    layer: GatewayLayer,
}

impl<S, ReqBody> tower::Service<Request<ReqBody>> for LayeredService<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
{
    type Response = Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        // Take the service that was driven to readiness; leave a clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let path = req.uri().path().to_owned();
            let forwarded = layer
                .trust_forwarded_authority
                .then(|| forwarded_authority(req.headers()))
                .flatten();
            let authority = forwarded
                .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()))
                .or_else(|| {
                    req.headers()
                        .get(http::header::HOST)
                        .and_then(|h| h.to_str().ok())
                        .map(str::to_owned)
                });
            if let Some(authority) = authority {
                req.extensions_mut().insert(Authority(authority));
            }
            let method = method_label(&path);
            let authorization = req
                .headers()
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes().to_vec());
            let peer_replica = req
                .headers()
                .get(crate::sessions::routing::PEER_REPLICA_HEADER)
                .map(|v| v.as_bytes().to_vec());
            let principal = layer
                .auth
                .authenticate(
                    access_for(&path),
                    authorization.as_deref(),
                    peer_replica.as_deref(),
                )
                .await;
            let mut response = match principal {
                Ok(principal) => {
                    req.extensions_mut().insert(principal);
                    inner.call(req).await?
                }
                Err(status) => status.into_http(),
            };
            response
                .headers_mut()
                .insert(SERVED_BY, layer.replica_id.clone());
            // Trailers-only answers (errors) carry grpc-status in the headers.
            let early = response
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok());
            if let Some(code) = early {
                layer
                    .metrics
                    .record_request(method, code_name(tonic::Code::from_i32(code)));
                return Ok(response);
            }
            let (parts, body) = response.into_parts();
            let observed = ObservedBody {
                inner: body,
                method: Some(method),
                metrics: layer.metrics.clone(),
            };
            Ok(Response::from_parts(
                parts,
                tonic::body::Body::new(observed),
            ))
        })
    }
}

/// The `method` label of a path: the RPC's name from the generated method
/// table, or `unknown`.
pub fn method_label(path: &str) -> &'static str {
    openshell_proto::method(path).map_or("unknown", |m| m.name)
}

/// Records the call's grpc-status from its trailers; a body dropped before
/// trailers is a call the client cancelled.
struct ObservedBody {
    inner: tonic::body::Body,
    method: Option<&'static str>,
    metrics: Arc<Metrics>,
}

impl ObservedBody {
    fn finish(&mut self, code: &str) {
        if let Some(method) = self.method.take() {
            self.metrics.record_request(method, code);
        }
    }
}

impl Body for ObservedBody {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code = trailers
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<i32>().ok())
                        .map(|c| code_name(tonic::Code::from_i32(c)))
                        .unwrap_or("unknown");
                    self.finish(code);
                }
            }
            Poll::Ready(Some(Err(_))) => self.finish("internal"),
            Poll::Ready(None) => self.finish("ok"),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for ObservedBody {
    fn drop(&mut self) {
        self.finish("cancelled");
    }
}

/// The edge's `x-openshell-forwarded-authority`, when it is one valid
/// `host[:port]`.
fn forwarded_authority(headers: &http::HeaderMap) -> Option<String> {
    let value = headers
        .get(openshell_edge::FORWARDED_AUTHORITY_HEADER)?
        .to_str()
        .ok()?;
    let authority = value.parse::<http::uri::Authority>().ok()?;
    (!value.contains('@')).then(|| authority.as_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::{forwarded_authority, method_label};

    #[test]
    fn forwarded_authorities_are_host_and_port_only() {
        let header = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(
                openshell_edge::FORWARDED_AUTHORITY_HEADER,
                value.parse().unwrap(),
            );
            forwarded_authority(&headers)
        };
        assert_eq!(
            header("edge.example:8443").as_deref(),
            Some("edge.example:8443")
        );
        assert_eq!(header("[::1]:9").as_deref(), Some("[::1]:9"));
        for bad in ["user@edge.example:1", "a b", "edge/x", ""] {
            assert_eq!(header(bad), None, "{bad}");
        }
        assert_eq!(forwarded_authority(&http::HeaderMap::new()), None);
    }

    #[test]
    fn only_contract_paths_name_a_method() {
        assert_eq!(method_label("/openshell.v1.OpenShell/Health"), "Health");
        assert_eq!(
            method_label("/openshell.peer.v1.Peer/PeerRelay"),
            "PeerRelay"
        );
        for path in [
            "/x.Y/Health",
            "/openshell.v1.OpenShell/Nope",
            "/",
            "",
            "/a/b/c",
        ] {
            assert_eq!(method_label(path), "unknown", "{path}");
        }
    }
}
