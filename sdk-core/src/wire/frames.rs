//! Reading gRPC messages out of a body without copying them: the
//! messages of a response (the core's streams, the supervisor's relays)
//! and of a request (the gateway's relay routes).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::Stream;
use http::HeaderMap;
use http_body::Body;
use tonic::{Code, Status};

use super::PREFIX_LEN;

/// The messages of a gRPC body, without copying them out of the chunks they
/// arrive in. A response's ends with `None` after trailers with status OK; a
/// request's ([`GrpcFrames::request`]) when the body ends. A failed status, a
/// broken body or bad framing is the last item.
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
    /// A request body: it ends without trailers, and its end is the end of
    /// the client's messages.
    request: bool,
    /// Each message is yielded behind its prefix ([`GrpcFrames::with_prefixes`]).
    with_prefixes: bool,
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
            request: false,
            with_prefixes: false,
        }
    }

    /// The messages of a request body: its end without trailers is the
    /// client's last message, and so is a reset with `CANCEL` (tonic's server
    /// reads both so).
    pub fn request(body: B, max_message_size: usize) -> Self {
        Self {
            request: true,
            ..Self::new(body, max_message_size)
        }
    }

    /// Yields each message behind its gRPC prefix, as it arrived: a relay
    /// sends it on as [`Outbound::Framed`](super::Outbound::Framed), in one
    /// piece and uncopied (when it arrived in one chunk).
    pub fn with_prefixes(mut self) -> Self {
        self.with_prefixes = true;
        self
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
            request: false,
            with_prefixes: false,
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
            let prefix = self.peek_prefix();
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
        if self.buffered < PREFIX_LEN + len {
            return Ok(None);
        }
        self.next_len = None;
        if self.with_prefixes {
            return Ok(Some(self.take(PREFIX_LEN + len)));
        }
        self.take(PREFIX_LEN);
        Ok(Some(if len == 0 {
            Bytes::new()
        } else {
            self.take(len)
        }))
    }

    /// The prefix at the front of the buffered bytes, left in place.
    fn peek_prefix(&self) -> [u8; PREFIX_LEN] {
        let mut prefix = [0; PREFIX_LEN];
        let mut filled = 0;
        for chunk in &self.chunks {
            let n = chunk.len().min(PREFIX_LEN - filled);
            prefix[filled..filled + n].copy_from_slice(&chunk[..n]);
            filled += n;
            if filled == PREFIX_LEN {
                break;
            }
        }
        prefix
    }
}

impl<B> GrpcFrames<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// A request's clean end.
    fn finish(&mut self) -> Poll<Option<Result<Bytes, Status>>> {
        self.body = None;
        self.chunks.clear();
        self.buffered = 0;
        self.end = Some(Ok(()));
        Poll::Ready(None)
    }

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
                Some(Err(err)) => {
                    let status = Status::from_error(err.into());
                    if this.request && status.code() == Code::Cancelled {
                        // The client reset its stream with CANCEL: the end
                        // of its messages, as tonic's server reads it.
                        return this.finish();
                    }
                    return this.fail(status);
                }
                None => {
                    let status = if this.buffered > 0 || this.next_len.is_some() {
                        Status::internal("Unexpected EOF decoding stream.")
                    } else if this.request {
                        return this.finish();
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
                    if this.request {
                        // A request's trailers carry no status: the end.
                        return this.finish();
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
    use crate::wire::write_prefix;
    use futures::StreamExt;
    use http::HeaderValue;
    use http_body::Frame;

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
    async fn with_prefixes_a_message_keeps_its_prefix_and_its_chunk() {
        let one = Bytes::from(framed(&[1u8; 3000]));
        let two = framed(b"second");
        // Message two's prefix is split over two chunks: it is joined.
        let (two_a, two_b) = two.split_at(3);
        let body = response(
            vec![[one.to_vec(), two_a.to_vec()].concat(), two_b.to_vec()],
            Some(ok_trailers()),
        );
        let mut frames = GrpcFrames::new(body, 1 << 20).with_prefixes();
        let first = frames.next().await.unwrap().unwrap();
        assert_eq!(first, one);
        let second = frames.next().await.unwrap().unwrap();
        assert_eq!(second, Bytes::from(two.clone()));
        assert!(frames.next().await.is_none());
        // The first message is a slice of its chunk, prefix included.
        let chunk = Bytes::from([one.to_vec(), two_a.to_vec()].concat());
        let start_of = chunk.as_ptr() as usize;
        let mut frames = GrpcFrames::new(
            http_body_util::StreamBody::new(futures::stream::iter(vec![
                Ok::<_, std::io::Error>(Frame::data(chunk.clone())),
                Ok(Frame::data(Bytes::from(two_b.to_vec()))),
                Ok(Frame::trailers(ok_trailers())),
            ])),
            1 << 20,
        )
        .with_prefixes();
        let first = frames.next().await.unwrap().unwrap();
        assert_eq!(first.as_ptr() as usize, start_of);
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
}
