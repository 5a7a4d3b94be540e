//! A stream's HTTP/2 call with its request body framed by the core
//! ([`wire::FramedBody`]): each message reaches HTTP/2 without tonic's
//! encoder copying it into a send buffer. A forward's socket read carries
//! its own gRPC prefix, so its frames are never copied at all.
//!
//! The response's messages are read with [`wire::GrpcFrames`]: each is a
//! slice of the HTTP/2 chunk it arrived in, where tonic's decoder would
//! copy every chunk into its receive buffer first.

use http::uri::PathAndQuery;
use tonic::Status;
use tonic::metadata::MetadataMap;
use tower::{Service, ServiceExt};

use super::proxy_answer::ProxyAnswers;
use crate::client::Client;
use crate::error::Error;
use crate::metadata::Metadata;
use crate::wire::{self, FramedBody, GrpcFrames};

impl Client {
    /// Sends a streaming request whose body is `body` and returns the
    /// response metadata and messages, as `tonic::client::Grpc`'s
    /// `streaming` would with [`BytesCodec`](super::BytesCodec), minus the
    /// encoder's and the decoder's copies.
    pub(super) async fn start_framed(
        &self,
        path: &PathAndQuery,
        metadata: MetadataMap,
        body: FramedBody,
    ) -> Result<(Metadata, GrpcFrames<tonic::body::Body>), Error> {
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
        let messages = if ended {
            GrpcFrames::ended()
        } else {
            GrpcFrames::new(body, self.inner.config.max_message_size)
        };
        Ok((Metadata::from_headers(&parts.headers), messages))
    }
}
