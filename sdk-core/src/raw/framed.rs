//! The request side of a stream, framed by the core instead of tonic's
//! encoder, so that a message's bytes reach HTTP/2 without being copied.
//!
//! tonic's client encoder copies every message into its own send buffer
//! before HTTP/2 sees it. For a forward that is one full copy of the data
//! plane, plus the allocation (and page faults) of that buffer. Here each
//! message is handed to HTTP/2 as the [`Bytes`] it already is:
//!
//! - [`Outbound::Framed`]: a complete gRPC message, 5-byte prefix
//!   included (a forward writes the prefix into the room in front of the
//!   socket read, so its frames are never copied);
//! - [`Outbound::Message`]: an encoded message without the prefix; a small
//!   one is copied behind a fresh prefix (one DATA frame), a large one goes
//!   out as two chunks, the prefix and the message itself.
//!
//! The response side stays tonic's [`Streaming`], fed the response body
//! exactly as `tonic::client::Grpc` would feed it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use futures::stream::BoxStream;
use http::header::{CONTENT_TYPE, TE};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method, Request, Uri, Version};
use http_body::Frame;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::codec::Streaming;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};
use tower::{Service, ServiceExt};

use super::codec::BytesDecoder;
use super::proxy_answer::ProxyAnswers;
use crate::client::Client;
use crate::error::Error;
use crate::metadata::Metadata;

/// Length of the gRPC message prefix: a compression flag and a big-endian
/// `u32` length.
pub(crate) const PREFIX_LEN: usize = 5;
/// Messages up to this size are copied behind their prefix, so they go out
/// as one DATA frame; larger ones are sent as they are, behind a separate
/// prefix chunk.
const COALESCE_LIMIT: usize = 16 * 1024;

/// One request message of a stream.
#[derive(Debug, Clone)]
pub(crate) enum Outbound {
    /// An encoded message; the body adds the gRPC prefix.
    Message(Bytes),
    /// A complete gRPC message: prefix (uncompressed) and message.
    Framed(Bytes),
}

impl Outbound {
    /// The encoded message, without its prefix (what the router inspects
    /// and a retried attempt resends as its first message).
    pub(crate) fn into_message(self) -> Bytes {
        match self {
            Outbound::Message(message) => message,
            Outbound::Framed(mut frame) => frame.split_off(PREFIX_LEN.min(frame.len())),
        }
    }
}

/// Writes the gRPC prefix of an uncompressed message of `len` bytes.
pub(crate) fn write_prefix(dst: &mut [u8], len: usize) {
    let len = u32::try_from(len).expect("a message fits a gRPC length prefix");
    dst[0] = 0;
    dst[1..PREFIX_LEN].copy_from_slice(&len.to_be_bytes());
}

/// The request body: the caller's messages as gRPC-framed chunks. A
/// cancellation ends it with an error, which resets the HTTP/2 stream with
/// `CANCEL` (tonic's encoder does the same).
pub(super) struct FramedBody {
    messages: BoxStream<'static, Outbound>,
    /// The message whose prefix went out last, sent on the next poll.
    pending: Option<Bytes>,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
    ended: bool,
}

impl FramedBody {
    pub(super) fn new(messages: BoxStream<'static, Outbound>, cancel: CancellationToken) -> Self {
        Self {
            messages,
            pending: None,
            cancelled: Box::pin(cancel.cancelled_owned()),
            ended: false,
        }
    }
}

fn cancelled_status() -> Status {
    let mut status = Status::cancelled("client cancelled");
    // hyper picks the RST_STREAM code from an h2 error in the source chain.
    status.set_source(Arc::new(h2::Error::from(h2::Reason::CANCEL)));
    status
}

impl http_body::Body for FramedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if self.cancelled.as_mut().poll(cx).is_ready() {
            self.ended = true;
            return Poll::Ready(Some(Err(cancelled_status())));
        }
        if let Some(message) = self.pending.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        let chunk = match ready!(self.messages.poll_next_unpin(cx)) {
            None => {
                self.ended = true;
                return Poll::Ready(None);
            }
            Some(Outbound::Framed(frame)) => frame,
            Some(Outbound::Message(message)) => {
                if u32::try_from(message.len()).is_err() {
                    self.ended = true;
                    return Poll::Ready(Some(Err(Status::resource_exhausted(
                        "a request message is larger than gRPC framing allows (4 GiB)",
                    ))));
                }
                let mut prefix = [0; PREFIX_LEN];
                write_prefix(&mut prefix, message.len());
                if message.len() <= COALESCE_LIMIT {
                    let mut chunk = BytesMut::with_capacity(PREFIX_LEN + message.len());
                    chunk.put_slice(&prefix);
                    chunk.put_slice(&message);
                    chunk.freeze()
                } else {
                    self.pending = Some(message);
                    Bytes::copy_from_slice(&prefix)
                }
            }
        };
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

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
        let mut headers = metadata.into_headers();
        for reserved in [
            "te",
            "content-type",
            "grpc-message",
            "grpc-message-type",
            "grpc-status",
        ] {
            headers.remove(reserved);
        }
        headers.insert(TE, HeaderValue::from_static("trailers"));
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        let mut request = Request::new(tonic::body::Body::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = Uri::from(path.clone());
        *request.version_mut() = Version::HTTP_2;
        *request.headers_mut() = headers;

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
        check_identity_encoding(&parts.headers)?;
        let streaming = match Status::from_header_map(&parts.headers) {
            // Trailers-only: the status is in the headers.
            Some(status) if status.code() != Code::Ok => {
                return Err(Error::from_status(status));
            }
            Some(_) => Streaming::new_empty(BytesDecoder, body),
            None => Streaming::new_response(
                BytesDecoder,
                body,
                parts.status,
                None,
                Some(self.inner.config.max_message_size),
            ),
        };
        Ok((Metadata::from_headers(&parts.headers), streaming))
    }
}

/// The core asks for no compression; a response compressed anyway cannot
/// be read (tonic answers the same way).
fn check_identity_encoding(headers: &HeaderMap) -> Result<(), Error> {
    match headers.get("grpc-encoding") {
        None => Ok(()),
        Some(value) if value.as_bytes() == b"identity" => Ok(()),
        Some(value) => Err(Error::from_status(Status::unimplemented(format!(
            "Content is compressed with `{}` which isn't supported",
            String::from_utf8_lossy(value.as_bytes())
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn body(messages: Vec<Outbound>, cancel: &CancellationToken) -> FramedBody {
        FramedBody::new(futures::stream::iter(messages).boxed(), cancel.clone())
    }

    async fn chunks(mut body: FramedBody) -> Vec<Result<Bytes, Code>> {
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            out.push(frame.map(|f| f.into_data().unwrap()).map_err(|s| s.code()));
        }
        out
    }

    #[tokio::test]
    async fn small_messages_are_one_chunk_large_ones_two_and_framed_ones_pass_through() {
        let cancel = CancellationToken::new();
        let large = Bytes::from(vec![7u8; COALESCE_LIMIT + 1]);
        let framed = Bytes::from_static(&[0, 0, 0, 0, 2, 9, 9]);
        let got = chunks(body(
            vec![
                Outbound::Message(Bytes::from_static(b"abc")),
                Outbound::Message(large.clone()),
                Outbound::Framed(framed.clone()),
                Outbound::Message(Bytes::new()),
            ],
            &cancel,
        ))
        .await;
        let len = (COALESCE_LIMIT + 1) as u32;
        let large_prefix = [&[0u8][..], &len.to_be_bytes()].concat();
        assert_eq!(
            got,
            vec![
                Ok(Bytes::from_static(&[0, 0, 0, 0, 3, b'a', b'b', b'c'])),
                Ok(Bytes::from(large_prefix)),
                Ok(large),
                Ok(framed),
                Ok(Bytes::from_static(&[0, 0, 0, 0, 0])),
            ]
        );
    }

    #[tokio::test]
    async fn the_framing_is_what_tonic_decodes() {
        // The chunks, concatenated, decode through tonic's own streaming
        // decoder into the messages that went in.
        let cancel = CancellationToken::new();
        let large = Bytes::from(vec![3u8; 100_000]);
        let mut prefixed = vec![0u8; PREFIX_LEN];
        write_prefix(&mut prefixed, 2);
        prefixed.extend_from_slice(b"hi");
        let got = chunks(body(
            vec![
                Outbound::Message(large.clone()),
                Outbound::Framed(Bytes::from(prefixed)),
            ],
            &cancel,
        ))
        .await;
        let wire: Vec<u8> = got.into_iter().flat_map(|c| c.unwrap().to_vec()).collect();
        let response = http_body_util::Full::new(Bytes::from(wire));
        let mut streaming = Streaming::new_request(BytesDecoder, response, None, None);
        assert_eq!(streaming.message().await.unwrap(), Some(large));
        assert_eq!(
            streaming.message().await.unwrap(),
            Some(Bytes::from_static(b"hi"))
        );
        assert_eq!(streaming.message().await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_cancelled_body_ends_with_cancelled_and_takes_no_more_messages() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        let got = chunks(body(
            vec![Outbound::Message(Bytes::from_static(b"never"))],
            &cancel,
        ))
        .await;
        assert_eq!(got, vec![Err(Code::Cancelled)]);
    }
}
