//! The server side: a streamed gRPC answer of [`Outbound`] messages, framed
//! as [`FramedBody`] frames them and ended by trailers with its status. The
//! gateway's relay routes answer with it, so that the messages they pass
//! through are not re-encoded.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Response};
use http_body::Frame;
use tonic::Status;

use super::{Outbound, check_encoding, first_chunk};

/// A response body: the handler's messages, then trailers with `grpc-status`
/// 0 when they end, or the status of the error that ended them.
pub struct ResponseBody {
    messages: BoxStream<'static, Result<Outbound, Status>>,
    /// The message whose prefix went out last, sent on the next poll.
    pending: Option<Bytes>,
    ended: bool,
}

impl ResponseBody {
    /// An answer of `messages`; an error among them is its last item.
    pub fn new(messages: BoxStream<'static, Result<Outbound, Status>>) -> Self {
        Self {
            messages,
            pending: None,
            ended: false,
        }
    }

    fn end(&mut self, status: Option<Status>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.ended = true;
        Poll::Ready(Some(Ok(Frame::trailers(trailers(status)))))
    }
}

/// The trailers of a stream ending with `status` (`None`: OK).
fn trailers(status: Option<Status>) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    match status {
        None => {
            trailers.insert(Status::GRPC_STATUS, HeaderValue::from_static("0"));
        }
        Some(status) => {
            if status.add_header(&mut trailers).is_err() {
                // Only custom metadata can fail to be a header; the code
                // and the (percent-encoded) message always can.
                trailers.clear();
                let _ = Status::new(status.code(), status.message()).add_header(&mut trailers);
            }
        }
    }
    trailers
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(message) = self.pending.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        let message = match ready!(self.messages.poll_next_unpin(cx)) {
            None => return self.end(None),
            Some(Err(status)) => return self.end(Some(status)),
            Some(Ok(message)) => message,
        };
        match first_chunk(message, &mut self.pending) {
            Ok(chunk) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
            Err(status) => self.end(Some(status)),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

/// The head of a streamed answer (HTTP 200, gRPC content type) with `body`.
pub fn response(body: ResponseBody) -> Response<tonic::body::Body> {
    let mut response = Response::new(tonic::body::Body::new(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// What a server checks of a request's head before it reads the body: the
/// messages must be uncompressed (`UNIMPLEMENTED` otherwise, as tonic's
/// server answers).
pub fn check_request(headers: &HeaderMap) -> Result<(), Status> {
    check_encoding(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::GrpcFrames;
    use http_body::Body;
    use http_body_util::BodyExt;
    use tonic::Code;

    fn answer(items: Vec<Result<Outbound, Status>>) -> ResponseBody {
        ResponseBody::new(futures::stream::iter(items).boxed())
    }

    #[tokio::test]
    async fn an_answer_reads_back_as_its_messages_and_ok() {
        let large = Bytes::from(vec![4u8; 40_000]);
        let body = answer(vec![
            Ok(Outbound::Message(Bytes::from_static(b"one"))),
            Ok(Outbound::Message(large.clone())),
            Ok(Outbound::Framed(crate::wire::frame_message(
                &openshell_proto::TcpRelayTarget {
                    host: "h".into(),
                    port: 2,
                },
            ))),
        ]);
        let mut frames = GrpcFrames::new(body, 1 << 20);
        assert_eq!(frames.next().await.unwrap().unwrap(), "one");
        assert_eq!(frames.next().await.unwrap().unwrap(), large);
        let target = frames.next().await.unwrap().unwrap();
        let target = <openshell_proto::TcpRelayTarget as prost::Message>::decode(target).unwrap();
        assert_eq!((target.host.as_str(), target.port), ("h", 2));
        assert!(frames.next().await.is_none());
        assert_eq!(frames.trailers().unwrap()["grpc-status"], "0");
    }

    #[tokio::test]
    async fn an_error_ends_the_answer_with_its_status_and_nothing_after() {
        let mut body = answer(vec![
            Ok(Outbound::Message(Bytes::from_static(b"a"))),
            Err(Status::unavailable("sandbox relay failed: 100% gone")),
            Ok(Outbound::Message(Bytes::from_static(b"never"))),
        ]);
        let first = body.frame().await.unwrap().unwrap();
        assert!(first.is_data());
        let end = body.frame().await.unwrap().unwrap();
        let status = Status::from_header_map(end.trailers_ref().unwrap()).unwrap();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), "sandbox relay failed: 100% gone");
        assert!(body.frame().await.is_none());
        assert!(body.is_end_stream());
    }

    #[tokio::test]
    async fn a_request_body_ends_with_its_last_message() {
        let mut wire = vec![0, 0, 0, 0, 2, 7, 7];
        wire.extend_from_slice(&[0, 0, 0, 0, 0]);
        let body = http_body_util::Full::new(Bytes::from(wire));
        let got: Vec<_> = GrpcFrames::request(body, 1024).collect().await;
        let got: Vec<_> = got.into_iter().map(Result::unwrap).collect();
        assert_eq!(got, vec![Bytes::from_static(&[7, 7]), Bytes::new()]);

        // A client that resets with CANCEL has ended its messages; any other
        // failure of the body is the stream's failure.
        let reset = |code: Code| {
            let mut status = Status::new(code, "reset");
            status.set_source(std::sync::Arc::new(h2::Error::from(h2::Reason::CANCEL)));
            http_body_util::StreamBody::new(futures::stream::iter(vec![
                Ok(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 1, 3]))),
                Err(status),
            ]))
        };
        let got: Vec<_> = GrpcFrames::request(reset(Code::Cancelled), 1024)
            .collect()
            .await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap(), &Bytes::from_static(&[3]));
        let got: Vec<_> = GrpcFrames::request(reset(Code::Internal), 1024)
            .collect()
            .await;
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].as_ref().unwrap_err().code(), Code::Internal);

        // Cut short inside a message: INTERNAL, as tonic's server reads it.
        let body = http_body_util::Full::new(Bytes::from_static(&[0, 0, 0, 0, 9, 1]));
        let got: Vec<_> = GrpcFrames::request(body, 1024).collect().await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap_err().code(), Code::Internal);
    }

    #[test]
    fn compressed_requests_are_unimplemented() {
        let mut headers = HeaderMap::new();
        assert!(check_request(&headers).is_ok());
        headers.insert("grpc-encoding", HeaderValue::from_static("identity"));
        assert!(check_request(&headers).is_ok());
        headers.insert("grpc-encoding", HeaderValue::from_static("gzip"));
        assert_eq!(
            check_request(&headers).unwrap_err().code(),
            Code::Unimplemented
        );
    }
}
