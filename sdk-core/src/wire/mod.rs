//! gRPC framing done by the suite itself, so that bulk messages are not
//! copied on their way between a socket and HTTP/2.
//!
//! tonic copies every message twice on the hot path of a relay: its encoder
//! copies a request message into its send buffer, and its decoder copies
//! every received DATA chunk into a receive buffer (and, because the
//! messages already cut from that buffer still share it, often copies it
//! again when it reserves room for the next message). For a forward those
//! copies are a large part of what each process on the path spends. This
//! module is the copy-free path the core's streams, the supervisor's relays
//! and the gateway's relay routes use:
//!
//! - [`FramedBody`]: a request body of [`Outbound`] messages, each handed
//!   to HTTP/2 as the [`Bytes`] it already is;
//! - [`GrpcFrames`]: the messages of a response or request body, each a
//!   slice of the DATA chunk it arrived in (copied only when one spans
//!   chunks), and a response's status from its trailers;
//! - [`request`] and [`check_response`]: the gRPC request around a body and
//!   the checks of the response head, as `tonic::client::Grpc` does them;
//! - [`ResponseBody`], [`response`] and [`check_request`]: the server side,
//!   a streamed answer of [`Outbound`] messages ending in its status
//!   trailers;
//! - [`write_all_vectored`]: received messages written to a socket in
//!   vectored writes, without copying them together.
//!
//! Everything here is plain gRPC over HTTP/2, uncompressed: the wire is the
//! same as tonic's, only the buffers differ.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use futures::stream::BoxStream;
use http::header::{CONTENT_TYPE, TE};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, Version};
use http_body::Frame;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::{Code, Status};

/// Length of the gRPC message prefix: a compression flag and a big-endian
/// `u32` length.
pub const PREFIX_LEN: usize = 5;
/// Messages up to this size are copied behind their prefix, so they go out
/// as one DATA frame; larger ones are sent as they are, behind a separate
/// prefix chunk.
const COALESCE_LIMIT: usize = 16 * 1024;

/// One message of a stream this side sends.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// An encoded message; the body adds the gRPC prefix.
    Message(Bytes),
    /// A complete gRPC message: prefix (uncompressed) and message.
    Framed(Bytes),
}

impl Outbound {
    /// The encoded message, without its prefix (what the router inspects
    /// and a retried attempt resends as its first message).
    pub fn into_message(self) -> Bytes {
        match self {
            Outbound::Message(message) => message,
            Outbound::Framed(mut frame) => frame.split_off(PREFIX_LEN.min(frame.len())),
        }
    }
}

/// Writes the gRPC prefix of an uncompressed message of `len` bytes.
pub fn write_prefix(dst: &mut [u8], len: usize) {
    let len = u32::try_from(len).expect("a message fits a gRPC length prefix");
    dst[0] = 0;
    dst[1..PREFIX_LEN].copy_from_slice(&len.to_be_bytes());
}

/// The request body: the caller's messages as gRPC-framed chunks. A
/// cancellation ends it with an error, which resets the HTTP/2 stream with
/// `CANCEL` (tonic's encoder does the same).
pub struct FramedBody {
    messages: BoxStream<'static, Outbound>,
    /// The message whose prefix went out last, sent on the next poll.
    pending: Option<Bytes>,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
    ended: bool,
}

impl FramedBody {
    /// A body of `messages`; cancelling `cancel` resets the stream.
    pub fn new(messages: BoxStream<'static, Outbound>, cancel: CancellationToken) -> Self {
        Self {
            messages,
            pending: None,
            cancelled: Box::pin(cancel.cancelled_owned()),
            ended: false,
        }
    }
}

/// The first chunk `message` goes out as. A message larger than
/// [`COALESCE_LIMIT`] is sent behind a prefix chunk of its own; it is left in
/// `rest`, to be the next chunk.
fn first_chunk(message: Outbound, rest: &mut Option<Bytes>) -> Result<Bytes, Status> {
    let message = match message {
        Outbound::Framed(frame) => return Ok(frame),
        Outbound::Message(message) => message,
    };
    if u32::try_from(message.len()).is_err() {
        return Err(Status::resource_exhausted(
            "a message is larger than gRPC framing allows (4 GiB)",
        ));
    }
    let mut prefix = [0; PREFIX_LEN];
    write_prefix(&mut prefix, message.len());
    if message.len() <= COALESCE_LIMIT {
        let mut chunk = BytesMut::with_capacity(PREFIX_LEN + message.len());
        chunk.put_slice(&prefix);
        chunk.put_slice(&message);
        return Ok(chunk.freeze());
    }
    *rest = Some(message);
    Ok(Bytes::copy_from_slice(&prefix))
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
        let Some(message) = ready!(self.messages.poll_next_unpin(cx)) else {
            self.ended = true;
            return Poll::Ready(None);
        };
        let chunk = match first_chunk(message, &mut self.pending) {
            Ok(chunk) => chunk,
            Err(status) => {
                self.ended = true;
                return Poll::Ready(Some(Err(status)));
            }
        };
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

/// `message` encoded behind its gRPC prefix, in one buffer: ready for
/// [`Outbound::Framed`].
pub fn frame_message(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut frame = BytesMut::with_capacity(PREFIX_LEN + len);
    frame.put_bytes(0, PREFIX_LEN);
    message
        .encode(&mut frame)
        .expect("the buffer was sized for the message");
    write_prefix(&mut frame[..PREFIX_LEN], len);
    frame.freeze()
}

/// The gRPC request for `path` with `headers` (metadata) and `body`:
/// reserved gRPC headers in `headers` are dropped, `te` and the content type
/// set, as tonic's client does.
pub fn request(
    path: &PathAndQuery,
    mut headers: HeaderMap,
    body: FramedBody,
) -> Request<tonic::body::Body> {
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
    request
}

/// What the head of a response says: `Ok(true)` when the call is over
/// already (a trailers-only OK, so the body holds no messages), `Ok(false)`
/// when messages and trailers follow, the status when it failed.
pub fn check_response(status: StatusCode, headers: &HeaderMap) -> Result<bool, Status> {
    check_encoding(headers)?;
    if let Some(answer) = Status::from_header_map(headers) {
        if answer.code() != Code::Ok {
            return Err(answer);
        }
        return Ok(true);
    }
    if status != StatusCode::OK {
        return Err(Status::unknown(format!(
            "the server answered HTTP {status} without a gRPC status"
        )));
    }
    Ok(false)
}

/// Refuses messages compressed with anything (nothing is negotiated), as
/// tonic does: `UNIMPLEMENTED`.
fn check_encoding(headers: &HeaderMap) -> Result<(), Status> {
    match headers.get("grpc-encoding") {
        None => Ok(()),
        Some(value) if value.as_bytes() == b"identity" => Ok(()),
        Some(value) => Err(Status::unimplemented(format!(
            "Content is compressed with `{}` which isn't supported",
            String::from_utf8_lossy(value.as_bytes())
        ))),
    }
}

mod frames;
mod server;
mod vectored;

pub use frames::GrpcFrames;
pub use server::{ResponseBody, check_request, response};
pub use vectored::write_all_vectored;

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
        let message = openshell_proto::RelayEof {};
        let got = chunks(body(
            vec![
                Outbound::Message(large.clone()),
                Outbound::Framed(frame_message(&message)),
                Outbound::Framed(frame_message(&openshell_proto::TcpRelayTarget {
                    host: "h".into(),
                    port: 1,
                })),
            ],
            &cancel,
        ))
        .await;
        let wire: Vec<u8> = got.into_iter().flat_map(|c| c.unwrap().to_vec()).collect();
        let response = http_body_util::Full::new(Bytes::from(wire));
        let mut streaming =
            tonic::codec::Streaming::new_request(crate::raw::BytesDecoder, response, None, None);
        assert_eq!(streaming.message().await.unwrap(), Some(large));
        assert_eq!(streaming.message().await.unwrap(), Some(Bytes::new()));
        let target = streaming.message().await.unwrap().unwrap();
        assert_eq!(
            <openshell_proto::TcpRelayTarget as prost::Message>::decode(target)
                .unwrap()
                .host,
            "h"
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

    #[test]
    fn response_heads_are_checked_as_tonic_checks_them() {
        let mut headers = HeaderMap::new();
        assert!(!check_response(StatusCode::OK, &headers).unwrap());
        headers.insert("grpc-status", HeaderValue::from_static("0"));
        assert!(check_response(StatusCode::OK, &headers).unwrap());
        headers.insert("grpc-status", HeaderValue::from_static("7"));
        assert_eq!(
            check_response(StatusCode::OK, &headers).unwrap_err().code(),
            Code::PermissionDenied
        );
        let none = HeaderMap::new();
        assert_eq!(
            check_response(StatusCode::BAD_GATEWAY, &none)
                .unwrap_err()
                .code(),
            Code::Unknown
        );
        let mut gzip = HeaderMap::new();
        gzip.insert("grpc-encoding", HeaderValue::from_static("gzip"));
        assert_eq!(
            check_response(StatusCode::OK, &gzip).unwrap_err().code(),
            Code::Unimplemented
        );
    }
}
