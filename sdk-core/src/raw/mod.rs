//! The raw boundary: any method of the proto by path, with encoded request
//! bytes and string metadata in, response bytes and response metadata out.
//!
//! This is what the language bindings export, and it is also the only way
//! the curated surface talks to the gateway: `sandboxes`, `exec` and
//! `forward` encode prost messages and go through the same internal unary
//! and stream functions here, so auth, deadlines, cancellation and routing
//! behave the same for every caller.
//!
//! # One path for every call
//!
//! Each attempt of each call: get a token (single-flight, see
//! [`crate::auth`]) → ask the [`Router`](crate::routing::Router) (it sees the
//! method table entry and the first request message) → build the request
//! metadata (caller pairs, `authorization`, routing hints, `grpc-timeout`) →
//! send over the client's one channel with [`BytesCodec`] (streams: framed
//! and read by [`crate::wire`]) → map the outcome
//! to [`Error`] and report it to the router. An `UNAUTHENTICATED` answer to
//! a call whose request can be replayed (unary and server-streaming calls)
//! refreshes the token and retries exactly once.
//!
//! # Streams
//!
//! [`RawStream`] is opened by [`Client::raw_stream`]. The HTTP/2 call starts
//! when the first message is sent (or when the caller first receives, or
//! closes the send side): routing needs the first message, which names the
//! sandbox for owner-routed streams. For unary and server-streaming methods
//! the first message is the whole request and the send side closes by
//! itself. Dropping the receiving half (or the whole stream) cancels the RPC;
//!
//! # Files
//!
//! - `codec`: [`BytesCodec`], encoded messages in and out of tonic as bytes;
//! - `framed`: a stream's HTTP/2 call with the core's own gRPC framing
//!   ([`crate::wire`]): request messages reach HTTP/2 and response messages
//!   reach the caller without tonic's copies;
//! - `proxy_answer`: the channel wrapper that turns a proxy's non-gRPC HTTP
//!   answer (an HTML 502) into `UNAVAILABLE` naming the HTTP status;
//! - `call`: the unary call path and the request builder every attempt uses,
//!   and the owner lookup the router is handed;
//! - `stream`: the halves of a [`RawStream`] the caller holds;
//! - `attempt`: the task that starts a stream (attempts, unrouted retry,
//!   token refresh) and pumps its answers.

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use http::uri::PathAndQuery;
use openshell_proto::{MethodInfo, StreamingKind};

use crate::client::{CallOptions, Client, DeadlineKind, Resolved};
use crate::error::Error;
use crate::metadata::{Metadata, SERVED_BY};

mod attempt;
mod call;
mod codec;
mod framed;
mod proxy_answer;
mod stream;

pub use codec::{BytesCodec, BytesDecoder, BytesEncoder};
pub use stream::{RawReceiver, RawSender, RawStream};

/// The answer to a unary call.
#[derive(Debug, Clone)]
pub struct RawResponse {
    /// The encoded response message.
    pub bytes: Bytes,
    /// Response headers and trailers (for example `x-openshell-served-by`).
    pub metadata: Metadata,
}

impl RawResponse {
    /// The replica that answered (`x-openshell-served-by`), if it said.
    pub fn served_by(&self) -> Option<&str> {
        self.metadata.get(SERVED_BY)
    }
}

/// Everything the one call path needs to know about a call.
#[derive(Debug, Clone)]
pub(crate) struct CallContext {
    pub(crate) path: PathAndQuery,
    pub(crate) method: Option<&'static MethodInfo>,
    pub(crate) metadata: Metadata,
    pub(crate) resolved: Resolved,
    /// Route to this sandbox's owner although the method is not
    /// owner-routed (a watch that follows logs, which its owner writes).
    pub(crate) owner_of: Option<String>,
}

impl CallContext {
    pub(crate) fn new(path: &str, metadata: Metadata, resolved: Resolved) -> Result<Self, Error> {
        if !path.starts_with('/') || path.matches('/').count() != 2 {
            return Err(Error::invalid_config(format!(
                "method path {path:?} must look like /package.Service/Method"
            )));
        }
        let parsed = PathAndQuery::try_from(path).map_err(|_| {
            Error::invalid_config(format!("method path {path:?} is not a valid path"))
        })?;
        Ok(Self {
            path: parsed,
            method: openshell_proto::method(path),
            metadata,
            resolved,
            owner_of: None,
        })
    }

    /// A context for one of the curated layer's own paths (known valid):
    /// no parsing and no copy of the path.
    pub(crate) fn curated(path: &'static str, metadata: Metadata, resolved: Resolved) -> Self {
        Self {
            path: PathAndQuery::from_static(path),
            method: openshell_proto::method(path),
            metadata,
            resolved,
            owner_of: None,
        }
    }

    /// Requests of these methods are one message: the call can be replayed.
    fn single_request(&self) -> bool {
        matches!(
            self.method.map(|m| m.kind),
            Some(StreamingKind::Unary | StreamingKind::ServerStreaming)
        )
    }

    fn caller_sets_authorization(&self) -> bool {
        self.metadata.get("authorization").is_some()
    }
}

impl Client {
    /// Calls a unary method by path (`/openshell.v1.OpenShell/GetSandbox`)
    /// with an encoded request and caller metadata.
    ///
    /// An `authorization` pair in `metadata` replaces the client's token for
    /// this call. Fails with `invalid_config` for a path that is not
    /// `/package.Service/Method` or that the method table marks as streaming.
    pub async fn raw_unary(
        &self,
        path: &str,
        request: Bytes,
        metadata: impl Into<Metadata>,
        options: CallOptions,
    ) -> Result<RawResponse, Error> {
        let resolved = Resolved::new(self, &options, DeadlineKind::Bounded);
        let ctx = CallContext::new(path, metadata.into(), resolved)?;
        if let Some(m) = ctx.method
            && m.kind != StreamingKind::Unary
        {
            return Err(Error::invalid_config(format!(
                "{path} is a {:?} method; use raw_stream",
                m.kind
            )));
        }
        self.unary_call(ctx, request).await
    }

    /// Opens a stream on any method by path. See [`RawStream`] for when the
    /// call actually starts. The deadline in `options` (if any) bounds the
    /// whole stream; the client's default deadline does not apply.
    pub async fn raw_stream(
        &self,
        path: &str,
        metadata: impl Into<Metadata>,
        options: CallOptions,
    ) -> Result<RawStream, Error> {
        let resolved = Resolved::new(self, &options, DeadlineKind::Stream);
        let ctx = CallContext::new(path, metadata.into(), resolved)?;
        Ok(self.open_stream(ctx, None))
    }
}

/// `protocol` error.
pub(crate) fn decode<M: prost::Message + Default>(path: &str, bytes: Bytes) -> Result<M, Error> {
    M::decode(bytes).map_err(|e| Error::protocol(format!("{path}: undecodable message: {e}")))
}

/// Ends a stream after its first error.
pub(crate) fn stop_after_error<T: Send + 'static>(
    stream: BoxStream<'static, Result<T, Error>>,
) -> BoxStream<'static, Result<T, Error>> {
    futures::stream::unfold((stream, false), |(mut stream, failed)| async move {
        if failed {
            return None;
        }
        let item = stream.next().await?;
        let failed = item.is_err();
        Some((item, (stream, failed)))
    })
    // Fused: polling after the end keeps returning `None` instead of panicking.
    .fuse()
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;

    #[test]
    fn call_context_validates_paths_and_finds_methods() {
        let resolved = Resolved {
            deadline: None,
            cancel: CancellationToken::new(),
        };
        let ctx = CallContext::new(
            "/openshell.v1.OpenShell/ExecSandbox",
            Metadata::new(),
            resolved.clone(),
        )
        .unwrap();
        assert_eq!(ctx.method.unwrap().owner_routed_field, Some("sandbox"));
        assert!(ctx.single_request());
        let ctx = CallContext::new(
            "/openshell.v1.OpenShell/ForwardTcp",
            Metadata::new(),
            resolved.clone(),
        )
        .unwrap();
        assert!(!ctx.single_request());
        let unknown =
            CallContext::new("/other.v1.Svc/Call", Metadata::new(), resolved.clone()).unwrap();
        assert!(unknown.method.is_none());
        for bad in ["", "Health", "/openshell.v1.OpenShell", "/a/b/c", "/a b/c"] {
            let err = CallContext::new(bad, Metadata::new(), resolved.clone()).unwrap_err();
            assert_eq!(err.code(), "invalid_config", "{bad}");
        }
    }

    pub(super) async fn lazy_client() -> Client {
        let config = crate::ClientConfig::builder("http://127.0.0.1:1")
            .connect_timeout(std::time::Duration::from_millis(200))
            .build()
            .unwrap();
        Client::connect_lazy(config).await.unwrap()
    }

    #[tokio::test]
    async fn raw_unary_rejects_streaming_methods_before_any_io() {
        let client = lazy_client().await;
        let err = client
            .raw_unary(
                "/openshell.v1.OpenShell/ExecSandbox",
                Bytes::new(),
                Metadata::new(),
                CallOptions::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), "invalid_config");
    }
}
