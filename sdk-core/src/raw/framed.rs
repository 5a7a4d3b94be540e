//! A stream's HTTP/2 call with its request body framed by the core
//! ([`wire::FramedBody`]): each message reaches HTTP/2 without tonic's
//! encoder copying it into a send buffer. A forward's socket read carries
//! its own gRPC prefix, so its frames are never copied at all.
//!
//! The response side stays tonic's [`Streaming`], fed the response body as
//! `tonic::client::Grpc` would feed it.

use bytes::Bytes;
use http::uri::PathAndQuery;
use tonic::Status;
use tonic::codec::Streaming;
use tonic::metadata::MetadataMap;
use tower::{Service, ServiceExt};

use super::codec::BytesDecoder;
use super::proxy_answer::ProxyAnswers;
use crate::client::Client;
use crate::error::Error;
use crate::metadata::Metadata;
use crate::wire::{self, FramedBody};

impl Client {
    /// Sends a streaming request whose body is `body` and returns the
    /// response metadata and message stream, as `tonic::client::Grpc`'s
    /// `streaming` would with [`BytesCodec`](super::BytesCodec), minus the
    /// encoder's copy.
    pub(super) async fn start_framed(
        &self,
        path: &PathAndQuery,
        metadata: MetadataMap,
        body: FramedBody,
    ) -> Result<(Metadata, Streaming<Bytes>), Error> {
        let request = wire::request(path, metadata.into_headers(), body);
        let mut service = ProxyAnswers::new(self.inner.channel.clone());
        service
            .ready()
            .await
            .map_err(|e| Error::from_transport(&e))?;
        let response = service
            .call(request)
            .await
            .map_err(|e| Error::from_status(Status::from_error(Box::new(e))))?;
        let (parts, body) = response.into_parts();
        let ended =
            wire::check_response(parts.status, &parts.headers).map_err(Error::from_status)?;
        let streaming = if ended {
            Streaming::new_empty(BytesDecoder, body)
        } else {
            Streaming::new_response(
                BytesDecoder,
                body,
                parts.status,
                None,
                Some(self.inner.config.max_message_size),
            )
        };
        Ok((Metadata::from_headers(&parts.headers), streaming))
    }
}
