//! The unary call path, and the request every attempt of every call is
//! built with.

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use tonic::client::Grpc;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;

use super::codec::BytesCodec;
use super::proxy_answer::ProxyAnswers;
use super::{CallContext, RawResponse, RawStream, decode};
use crate::auth::{IssuedToken, bearer_header};
use crate::client::{CallOptions, Client, DeadlineKind, Resolved};
use crate::error::Error;
use crate::metadata::Metadata;
use crate::routing::{
    LOOKUP_DEADLINE, OwnerLookup, RouteDecision, owner_from, owner_lookup_metadata,
};

const GET_SANDBOX: &str = crate::paths::GET_SANDBOX;

impl Client {
    /// The unary call path used by raw and curated calls alike.
    #[tracing::instrument(name = "openshell.call", skip_all, fields(path = %ctx.path, replica = tracing::field::Empty))]
    pub(crate) async fn unary_call(
        &self,
        ctx: CallContext,
        request: Bytes,
    ) -> Result<RawResponse, Error> {
        let resolved = ctx.resolved.clone();
        let path = ctx.path.clone();
        let result = resolved
            .guard(async {
                let mut token = self.call_token(&ctx).await?;
                let mut refreshed = false;
                let mut unrouted = false;
                loop {
                    let route = self
                        .inner
                        .router
                        .route(
                            self,
                            ctx.method,
                            Some(&request),
                            unrouted,
                            ctx.owner_of.as_deref(),
                        )
                        .await;
                    record_replica(&route);
                    let req = self.build_request(&ctx, token.as_ref(), &route, request.clone())?;
                    let mut grpc = self.grpc().await?;
                    match grpc.unary(req, ctx.path.clone(), BytesCodec).await {
                        Ok(response) => {
                            let (md, bytes, _) = response.into_parts();
                            let metadata = Metadata::from_tonic_owned(md);
                            self.inner.router.observe(&route, Ok(&metadata));
                            return Ok(RawResponse { bytes, metadata });
                        }
                        Err(status) => {
                            let err = Error::from_status(status);
                            // Never forwarded (the router's rule): one unrouted retry.
                            if self.inner.router.observe(&route, Err(&err)) && !unrouted {
                                unrouted = true;
                                continue;
                            }
                            if err.is_unauthenticated() && !refreshed && self.can_refresh(&ctx) {
                                refreshed = true;
                                let rejected = token.as_ref().map_or(0, |t| t.generation);
                                token = self.inner.tokens.refresh_after(rejected).await?;
                                continue;
                            }
                            return Err(err);
                        }
                    }
                }
            })
            .await;
        if let Err(err) = &result {
            tracing::debug!(path = path.as_str(), code = err.code(), "unary call failed");
        }
        result
    }

    /// Curated unary calls: encode, call through [`Client::unary_call`], decode.
    pub(crate) async fn typed_unary<Req, Resp>(
        &self,
        path: &'static str,
        request: &Req,
        resolved: &Resolved,
    ) -> Result<(Resp, Metadata), Error>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        self.typed_unary_with(path, request, Metadata::new(), resolved)
            .await
    }

    /// [`typed_unary`](Self::typed_unary) with caller metadata.
    pub(crate) async fn typed_unary_with<Req, Resp>(
        &self,
        path: &'static str,
        request: &Req,
        metadata: Metadata,
        resolved: &Resolved,
    ) -> Result<(Resp, Metadata), Error>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let ctx = CallContext::curated(path, metadata, resolved.clone());
        let response = self
            .unary_call(ctx, Bytes::from(request.encode_to_vec()))
            .await?;
        Ok((decode(path, response.bytes)?, response.metadata))
    }

    /// Curated streams: the encoded first message opens the call at once.
    pub(crate) fn typed_stream(
        &self,
        path: &'static str,
        first: &impl prost::Message,
        resolved: &Resolved,
    ) -> Result<RawStream, Error> {
        self.typed_stream_routed(path, first, resolved, None)
    }

    /// [`typed_stream`](Self::typed_stream) routed to `owner_of`'s owner
    /// (hint, and the single unrouted retry) when set.
    pub(crate) fn typed_stream_routed(
        &self,
        path: &'static str,
        first: &impl prost::Message,
        resolved: &Resolved,
        owner_of: Option<String>,
    ) -> Result<RawStream, Error> {
        let mut ctx = CallContext::curated(path, Metadata::new(), resolved.clone());
        ctx.owner_of = owner_of;
        Ok(self.open_stream(ctx, Some(Bytes::from(first.encode_to_vec()))))
    }

    pub(super) fn can_refresh(&self, ctx: &CallContext) -> bool {
        self.inner.tokens.can_refresh() && !ctx.caller_sets_authorization()
    }

    pub(super) async fn call_token(&self, ctx: &CallContext) -> Result<Option<IssuedToken>, Error> {
        if ctx.caller_sets_authorization() {
            return Ok(None);
        }
        self.inner.tokens.token().await
    }

    /// The client's channel, with proxies' non-gRPC answers turned into
    /// `UNAVAILABLE` ([`ProxyAnswers`]).
    pub(super) async fn grpc(&self) -> Result<Grpc<ProxyAnswers<Channel>>, Error> {
        let mut grpc = Grpc::new(ProxyAnswers::new(self.inner.channel.clone()))
            .max_decoding_message_size(self.inner.config.max_message_size);
        grpc.ready().await.map_err(|e| Error::from_transport(&e))?;
        Ok(grpc)
    }

    /// The metadata [`build_request`](Self::build_request) gives a request,
    /// `grpc-timeout` included, for a request built without tonic.
    pub(super) fn request_metadata(
        &self,
        ctx: &CallContext,
        token: Option<&IssuedToken>,
        route: &RouteDecision,
    ) -> Result<MetadataMap, Error> {
        Ok(self.build_request(ctx, token, route, ())?.into_parts().0)
    }

    /// The one place request metadata is built.
    pub(super) fn build_request<S>(
        &self,
        ctx: &CallContext,
        token: Option<&IssuedToken>,
        route: &RouteDecision,
        body: S,
    ) -> Result<tonic::Request<S>, Error> {
        let mut headers = http::HeaderMap::new();
        ctx.metadata.write_to(&mut headers)?;
        route.metadata.write_to(&mut headers)?;
        if let Some(token) = token {
            headers.insert(http::header::AUTHORIZATION, bearer_header(&token.token)?);
        }
        let mut request = tonic::Request::new(body);
        *request.metadata_mut() = MetadataMap::from_headers(headers);
        if let Some(remaining) = ctx.resolved.remaining() {
            request.set_timeout(remaining);
        }
        Ok(request)
    }
}

/// The router's owner lookups are ordinary calls on the one call path.
impl OwnerLookup for Client {
    fn lookup_owner<'a>(
        &'a self,
        sandbox: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, Error>> {
        async move {
            let request = openshell_proto::GetSandboxRequest {
                name: sandbox.to_owned(),
                workspace_scope: None,
            };
            let options = CallOptions::new().deadline(LOOKUP_DEADLINE);
            let resolved = Resolved::new(self, &options, DeadlineKind::Bounded);
            let ctx = CallContext::new(GET_SANDBOX, owner_lookup_metadata(), resolved)?;
            let bytes = Bytes::from(prost::Message::encode_to_vec(&request));
            // This unary call passes through `route` again (unrouted: GetSandbox
            // is not owner-routed), hence the boxed future.
            let response = self.unary_call(ctx, bytes).await?;
            Ok(owner_from(&response.metadata))
        }
        .boxed()
    }
}

/// Names the replica a call was routed to in the current tracing span.
pub(super) fn record_replica(route: &RouteDecision) {
    if let Some(replica) = &route.hinted_replica {
        tracing::Span::current().record("replica", replica.as_str());
    }
}
