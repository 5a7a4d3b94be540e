//! gRPC framing done by the suite itself, so that bulk messages are not
//! copied on their way between a socket and HTTP/2.
//!
//! tonic copies every message twice on the hot path of a relay: its encoder
//! copies a request message into its send buffer, and its decoder copies
//! every received DATA chunk into a receive buffer (and, because the
//! messages already cut from that buffer still share it, often copies it
//! again when it reserves room for the next message). For a forward those
//! copies are a large part of what each process on the path spends. This
//! module is the copy-free path the core's streams and the supervisor's
//! relays use:
//!
//! - [`FramedBody`]: a request body of [`Outbound`] messages, each handed
//!   to HTTP/2 as the [`Bytes`] it already is;
//! - [`GrpcFrames`]: the messages of a response body, each a slice of the
//!   DATA chunk it arrived in (copied only when one spans chunks), and the
//!   status from the trailers;
//! - [`request`] and [`check_response`]: the gRPC request around a body and
//!   the checks of the response head, as `tonic::client::Grpc` does them.
//!
//! Everything here is plain gRPC over HTTP/2, uncompressed: the wire is the
//! same as tonic's, only the buffers differ.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use http::header::{CONTENT_TYPE, TE};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, Version};
use http_body::{Body, Frame};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::{Code, Status};

/// Length of the gRPC message prefix: a compression flag and a big-endian
/// `u32` length.
pub const PREFIX_LEN: usize = 5;
/// Messages up to this size are copied behind their prefix, so they go out
/// as one DATA frame; larger ones are sent as they are, behind a separate
/// prefix chunk.
const COALESCE_LIMIT: usize = 16 * 1024;

/// One request message of a stream.
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
    match headers.get("grpc-encoding") {
        None => {}
        Some(value) if value.as_bytes() == b"identity" => {}
        Some(value) => {
            return Err(Status::unimplemented(format!(
                "Content is compressed with `{}` which isn't supported",
                String::from_utf8_lossy(value.as_bytes())
            )));
        }
    }
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

/// The messages of a gRPC response body, without copying them out of the
/// chunks they arrive in. Ends with `None` after trailers with status OK;
/// a failed status, a broken body or bad framing is the last item.
pub struct GrpcFrames<B> {
    body: Option<B>,
    /// Received bytes not yet cut into messages, oldest first.
    chunks: VecDeque<Bytes>,
    buffered: usize,
    /// Length of the message whose prefix was read.
    next_len: Option<usize>,
    max_message_size: usize,
    /// Set once: after trailers with OK (`Ok`), or after a failure.
    end: Option<Result<(), ()>>,
    trailers: Option<HeaderMap>,
}

impl<B> GrpcFrames<B> {
    /// Messages larger than `max_message_size` fail the stream with
    /// `OUT_OF_RANGE`, as tonic's decoder does.
    pub fn new(body: B, max_message_size: usize) -> Self {
        Self {
            body: Some(body),
            chunks: VecDeque::new(),
            buffered: 0,
            next_len: None,
            max_message_size,
            end: None,
            trailers: None,
        }
    }

    /// The trailers of a stream that ended with OK (after the last `None`).
    pub fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers.as_ref()
    }

    /// A stream over a body that holds no messages (trailers-only OK).
    pub fn ended() -> Self {
        Self {
            body: None,
            chunks: VecDeque::new(),
            buffered: 0,
            next_len: None,
            max_message_size: 0,
            end: Some(Ok(())),
            trailers: None,
        }
    }

    /// Takes `len` buffered bytes: a slice of one chunk when they lie in
    /// one, else a copy of the pieces.
    fn take(&mut self, len: usize) -> Bytes {
        self.buffered -= len;
        let first = self.chunks.front_mut().expect("enough bytes are buffered");
        if first.len() >= len {
            let taken = first.split_to(len);
            if first.is_empty() {
                self.chunks.pop_front();
            }
            return taken;
        }
        let mut joined = BytesMut::with_capacity(len);
        while joined.len() < len {
            let chunk = self.chunks.front_mut().expect("enough bytes are buffered");
            let n = chunk.len().min(len - joined.len());
            joined.put_slice(&chunk[..n]);
            chunk.advance(n);
            if chunk.is_empty() {
                self.chunks.pop_front();
            }
        }
        joined.freeze()
    }

    /// The next whole message among the buffered bytes, if there is one.
    fn next_message(&mut self) -> Result<Option<Bytes>, Status> {
        if self.next_len.is_none() {
            if self.buffered < PREFIX_LEN {
                return Ok(None);
            }
            let prefix = self.take(PREFIX_LEN);
            if prefix[0] != 0 {
                return Err(Status::internal(format!(
                    "protocol error: received message with compression flag {} (nothing was negotiated)",
                    prefix[0]
                )));
            }
            let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
            if len > self.max_message_size {
                return Err(Status::out_of_range(format!(
                    "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                    self.max_message_size
                )));
            }
            self.next_len = Some(len);
        }
        let len = self.next_len.expect("set above");
        if self.buffered < len {
            return Ok(None);
        }
        self.next_len = None;
        Ok(Some(if len == 0 {
            Bytes::new()
        } else {
            self.take(len)
        }))
    }
}

impl<B> GrpcFrames<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn fail(&mut self, status: Status) -> Poll<Option<Result<Bytes, Status>>> {
        self.body = None;
        self.chunks.clear();
        self.buffered = 0;
        self.end = Some(Err(()));
        Poll::Ready(Some(Err(status)))
    }
}

impl<B> Stream for GrpcFrames<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.end.is_some() {
                // After OK trailers, or after the failure was the last item.
                return Poll::Ready(None);
            }
            match this.next_message() {
                Ok(Some(message)) => return Poll::Ready(Some(Ok(message))),
                Ok(None) => {}
                Err(status) => return this.fail(status),
            }
            let Some(body) = this.body.as_mut() else {
                return Poll::Ready(None);
            };
            let frame = match ready!(Pin::new(body).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(err)) => return this.fail(Status::from_error(err.into())),
                None => {
                    let status = if this.buffered > 0 || this.next_len.is_some() {
                        Status::internal("Unexpected EOF decoding stream.")
                    } else {
                        Status::internal("the server closed the stream without sending trailers")
                    };
                    return this.fail(status);
                }
            };
            match frame.into_data() {
                Ok(data) => {
                    if !data.is_empty() {
                        this.buffered += data.len();
                        this.chunks.push_back(data);
                    }
                }
                Err(frame) => {
                    let Ok(trailers) = frame.into_trailers() else {
                        continue;
                    };
                    if this.buffered > 0 || this.next_len.is_some() {
                        return this.fail(Status::internal("Unexpected EOF decoding stream."));
                    }
                    match Status::from_header_map(&trailers) {
                        Some(status) if status.code() == Code::Ok => {
                            this.body = None;
                            this.end = Some(Ok(()));
                            this.trailers = Some(trailers);
                        }
                        Some(status) => return this.fail(status),
                        None => {
                            return this.fail(Status::internal(
                                "the server's trailers carry no grpc-status",
                            ));
                        }
                    }
                }
            }
        }
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

    type TestFrames = std::vec::IntoIter<Result<Frame<Bytes>, std::io::Error>>;
    type TestBody = http_body_util::StreamBody<futures::stream::Iter<TestFrames>>;

    /// A response body of `chunks`, then `trailers` (if any).
    fn response(chunks: Vec<Vec<u8>>, trailers: Option<HeaderMap>) -> TestBody {
        let mut frames: Vec<Result<Frame<Bytes>, std::io::Error>> = chunks
            .into_iter()
            .map(|c| Ok(Frame::data(Bytes::from(c))))
            .collect();
        if let Some(t) = trailers {
            frames.push(Ok(Frame::trailers(t)));
        }
        http_body_util::StreamBody::new(futures::stream::iter(frames))
    }

    fn ok_trailers() -> HeaderMap {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        t
    }

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut out = vec![0; PREFIX_LEN];
        write_prefix(&mut out, message.len());
        out.extend_from_slice(message);
        out
    }

    async fn collect<B>(frames: GrpcFrames<B>) -> Vec<Result<Bytes, (Code, String)>>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        frames
            .map(|r| r.map_err(|s| (s.code(), s.message().to_owned())))
            .collect()
            .await
    }

    #[tokio::test]
    async fn messages_are_slices_of_their_chunk_and_split_messages_are_joined() {
        let one = framed(b"first");
        let two = framed(&[5u8; 1000]);
        let three = framed(b"");
        // Chunk 1: message one whole and the start of two; chunk 2: the rest
        // of two, message three, and the prefix of four split over chunks.
        let mut all = [one.clone(), two.clone(), three, framed(b"four")].concat();
        let chunk3 = all.split_off(one.len() + two.len() + PREFIX_LEN + 2);
        let chunk2 = all.split_off(one.len() + 10);
        let body = response(vec![all.clone(), chunk2, chunk3], Some(ok_trailers()));
        let mut frames = GrpcFrames::new(body, 1 << 20);
        let first = frames.next().await.unwrap().unwrap();
        assert_eq!(first, Bytes::from_static(b"first"));
        let rest = collect(frames).await;
        assert_eq!(
            rest,
            vec![
                Ok(Bytes::from(vec![5u8; 1000])),
                Ok(Bytes::new()),
                Ok(Bytes::from_static(b"four")),
            ]
        );
    }

    #[tokio::test]
    async fn a_message_in_one_chunk_is_not_copied() {
        let chunk = Bytes::from(framed(&[9u8; 4096]));
        let start = chunk.as_ptr() as usize;
        let body = http_body_util::StreamBody::new(futures::stream::iter(vec![
            Ok::<_, std::io::Error>(Frame::data(chunk.clone())),
            Ok(Frame::trailers(ok_trailers())),
        ]));
        let mut frames = GrpcFrames::new(body, 1 << 20);
        let message = frames.next().await.unwrap().unwrap();
        assert_eq!(message.as_ptr() as usize, start + PREFIX_LEN);
        assert!(frames.next().await.is_none());
        assert_eq!(frames.trailers().unwrap()["grpc-status"], "0");
    }

    #[tokio::test]
    async fn failures_end_the_stream_with_their_status() {
        let mut failed = HeaderMap::new();
        failed.insert("grpc-status", HeaderValue::from_static("14"));
        failed.insert("grpc-message", HeaderValue::from_static("gone"));
        let got = collect(GrpcFrames::new(
            response(vec![framed(b"a")], Some(failed)),
            1024,
        ))
        .await;
        assert_eq!(
            got,
            vec![
                Ok(Bytes::from_static(b"a")),
                Err((Code::Unavailable, "gone".into()))
            ]
        );

        let got = collect(GrpcFrames::new(response(vec![framed(&[1; 100])], None), 10)).await;
        assert_eq!(got[0].as_ref().unwrap_err().0, Code::OutOfRange);
        assert_eq!(got.len(), 1);

        let mut half = framed(b"abcdef");
        half.truncate(8);
        let got = collect(GrpcFrames::new(
            response(vec![half], Some(ok_trailers())),
            1024,
        ))
        .await;
        assert_eq!(
            got,
            vec![Err((
                Code::Internal,
                "Unexpected EOF decoding stream.".into()
            ))]
        );

        let got = collect(GrpcFrames::new(response(vec![framed(b"x")], None), 1024)).await;
        assert_eq!(got[0], Ok(Bytes::from_static(b"x")));
        assert_eq!(got[1].as_ref().unwrap_err().0, Code::Internal);
        let got = collect(GrpcFrames::new(
            response(vec![framed(b"x")], Some(HeaderMap::new())),
            1024,
        ))
        .await;
        assert_eq!(got[1].as_ref().unwrap_err().0, Code::Internal);

        let mut compressed = framed(b"x");
        compressed[0] = 1;
        let got = collect(GrpcFrames::new(response(vec![compressed], None), 1024)).await;
        assert_eq!(got[0].as_ref().unwrap_err().0, Code::Internal);
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
