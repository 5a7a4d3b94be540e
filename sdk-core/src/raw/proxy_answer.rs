//! HTTP answers that are not gRPC: a proxy's own error page (nginx without
//! gRPC error mapping answers a dead route with an HTML 502, Envoy with a
//! plain-text 503 `no healthy upstream`).
//!
//! Left to tonic, such a body is decoded as gRPC frames and the call fails
//! with `internal: protocol error: received message with invalid compression
//! flag: 60`. [`ProxyAnswers`] wraps the client's channel and turns every
//! answer without `grpc-status` that is not a gRPC response (HTTP status
//! other than 200, or a content type other than `application/grpc*`) into a
//! trailers-only `UNAVAILABLE` naming the HTTP status ("a proxy answered HTTP
//! 502 Bad Gateway instead of gRPC"). The proxy's headers stay as the error's
//! metadata, so a marker such as `x-openshell-edge: not-forwarded` still
//! reaches the router; whether the call is retried is the router's rule
//! alone (ARCHITECTURE.md section 4), never this module's.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, StatusCode};
use tonic::body::Body;
use tonic::codegen::Body as _;

use crate::error::proxy_answer_message;

/// At most this much of a proxy's body is read (for a one-line text message).
const BODY_LIMIT: usize = 1024;
/// A proxy's error page arrives at once; never wait longer than this for it.
const BODY_WAIT: Duration = Duration::from_secs(1);
/// Longest body text quoted in the message.
const QUOTE_LIMIT: usize = 200;

/// Wraps a gRPC transport so that non-gRPC HTTP answers become `UNAVAILABLE`.
#[derive(Clone, Debug)]
pub(crate) struct ProxyAnswers<S> {
    inner: S,
}

impl<S> ProxyAnswers<S> {
    pub(crate) fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S> tower::Service<http::Request<Body>> for ProxyAnswers<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            if is_grpc(&response) {
                return Ok(response);
            }
            Ok(as_grpc_unavailable(response).await)
        })
    }
}

/// A gRPC answer: a `grpc-status` header (trailers-only, whatever the HTTP
/// status), or HTTP 200 with a gRPC content type (status in the trailers).
fn is_grpc(response: &http::Response<Body>) -> bool {
    if response.headers().contains_key("grpc-status") {
        return true;
    }
    let grpc_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/grpc"));
    response.status() == StatusCode::OK && grpc_type
}

/// The trailers-only `UNAVAILABLE` that stands for a proxy's HTTP answer.
pub(crate) async fn as_grpc_unavailable(response: http::Response<Body>) -> http::Response<Body> {
    let (parts, body) = response.into_parts();
    let text = if is_plain_text(&parts.headers) {
        read_prefix(body).await.and_then(|b| quotable(&b))
    } else {
        None
    };
    let message = proxy_answer_message(parts.status, text.as_deref());
    tracing::debug!(status = %parts.status, %message, "a proxy answered instead of gRPC");

    let mut headers = parts.headers;
    headers.remove(CONTENT_TYPE);
    headers.remove(CONTENT_LENGTH);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(
        "grpc-status",
        HeaderValue::from(tonic::Code::Unavailable as i32),
    );
    headers.insert(
        "grpc-message",
        HeaderValue::from_str(&percent_encode(&message))
            .expect("percent-encoded text is a valid header value"),
    );
    let mut grpc = http::Response::new(Body::empty());
    *grpc.headers_mut() = headers;
    grpc
}

fn is_plain_text(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.trim_start().starts_with("text/plain"))
}

/// The whole body if it ends within [`BODY_LIMIT`] bytes and [`BODY_WAIT`].
async fn read_prefix(mut body: Body) -> Option<Bytes> {
    let read = async {
        let mut buf = BytesMut::new();
        loop {
            let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
            match frame {
                None => return Some(buf.freeze()),
                Some(Err(_)) => return None,
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        buf.extend_from_slice(&data);
                        if buf.len() > BODY_LIMIT {
                            return None;
                        }
                    }
                }
            }
        }
    };
    tokio::time::timeout(BODY_WAIT, read).await.ok().flatten()
}

/// A short one-line text worth quoting.
fn quotable(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?.trim();
    let printable = text.chars().all(|c| !c.is_control());
    (!text.is_empty() && printable && text.len() <= QUOTE_LIMIT).then(|| text.to_owned())
}

/// grpc-message encoding: printable ASCII except '%' as is, the rest %XX.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::error::Error;

    /// What tonic makes of the answer the wrapper hands it: the status of a
    /// trailers-only response.
    pub(crate) async fn error_of(response: http::Response<Body>) -> Error {
        assert!(!is_grpc(&response), "already gRPC");
        let grpc = as_grpc_unavailable(response).await;
        assert!(is_grpc(&grpc));
        let status = tonic::Status::from_header_map(grpc.headers()).expect("a grpc-status");
        Error::from_status(status)
    }

    pub(crate) fn answer(
        status: u16,
        headers: &[(&str, &str)],
        body: &'static str,
    ) -> http::Response<Body> {
        let mut response = http::Response::new(Body::new(http_body_util::Full::new(
            Bytes::from_static(body.as_bytes()),
        )));
        *response.status_mut() = StatusCode::from_u16(status).unwrap();
        for (k, v) in headers {
            response.headers_mut().append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        response
    }

    const NGINX_502: &str = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n\
        <center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.22.1</center>\r\n\
        </body>\r\n</html>\r\n";

    #[tokio::test]
    async fn an_html_502_is_unavailable_naming_the_status() {
        let err = error_of(answer(
            502,
            &[("content-type", "text/html"), ("server", "nginx/1.22.1")],
            NGINX_502,
        ))
        .await;
        assert_eq!(err.code(), "unavailable");
        assert!(err.retryable());
        assert_eq!(
            err.message(),
            "a proxy answered HTTP 502 Bad Gateway instead of gRPC"
        );
        // The proxy's headers are the error's metadata.
        assert_eq!(err.metadata().unwrap().get("server"), Some("nginx/1.22.1"));
    }

    #[tokio::test]
    async fn a_short_plain_text_body_is_quoted() {
        let err = error_of(answer(
            503,
            &[("content-type", "text/plain"), ("server", "envoy")],
            "no healthy upstream",
        ))
        .await;
        assert_eq!(
            err.message(),
            "a proxy answered HTTP 503 Service Unavailable instead of gRPC: no healthy upstream"
        );
        let long = error_of(answer(503, &[("content-type", "text/plain")], {
            const LONG: &str = concat!(
                "0123456789012345678901234567890123456789012345678901234567890123456789",
                "0123456789012345678901234567890123456789012345678901234567890123456789",
                "0123456789012345678901234567890123456789012345678901234567890123456789"
            );
            LONG
        }))
        .await;
        assert_eq!(
            long.message(),
            "a proxy answered HTTP 503 Service Unavailable instead of gRPC"
        );
    }

    #[tokio::test]
    async fn any_answer_without_grpc_status_that_is_not_grpc_is_converted() {
        // A 200 whose body is a web page is no gRPC answer either.
        let err = error_of(answer(200, &[("content-type", "text/html")], "<html/>")).await;
        assert_eq!(err.code(), "unavailable");
        assert_eq!(
            err.message(),
            "a proxy answered HTTP 200 OK instead of gRPC"
        );
        let err = error_of(answer(404, &[], "")).await;
        assert_eq!(
            err.message(),
            "a proxy answered HTTP 404 Not Found instead of gRPC"
        );
    }

    #[test]
    fn grpc_answers_pass_through() {
        assert!(is_grpc(&answer(
            200,
            &[("content-type", "application/grpc")],
            ""
        )));
        assert!(is_grpc(&answer(
            200,
            &[("content-type", "application/grpc+proto")],
            ""
        )));
        // Trailers-only errors, whatever the HTTP status a proxy put on them.
        assert!(is_grpc(&answer(
            503,
            &[("grpc-status", "14"), ("content-type", "application/grpc")],
            ""
        )));
        assert!(!is_grpc(&answer(
            502,
            &[("content-type", "application/grpc")],
            ""
        )));
    }

    /// The unrouted-retry classifier on whole HTTP answers, as the call
    /// layer hands them to the router.
    mod classifier {
        use super::*;
        use crate::routing::{NeverForwarded, never_forwarded};

        #[tokio::test]
        async fn envoys_recorded_no_healthy_upstream_counts_as_never_forwarded() {
            // Envoy's local reply with no gRPC mapping: HTTP 503, text/plain,
            // no grpc-status.
            let err = error_of(answer(
                503,
                &[
                    ("content-length", "19"),
                    ("content-type", "text/plain"),
                    ("date", "Sat, 30 Nov 2024 13:00:00 GMT"),
                    ("server", "envoy"),
                ],
                "no healthy upstream",
            ))
            .await;
            assert_eq!(err.code(), "unavailable");
            assert_eq!(
                never_forwarded(&err),
                Some(NeverForwarded::EnvoyNoHealthyUpstream)
            );
        }

        #[tokio::test]
        async fn an_html_502_is_not_retried_unless_marked() {
            let plain = error_of(answer(502, &[("content-type", "text/html")], NGINX_502)).await;
            assert_eq!(never_forwarded(&plain), None);
            let marked = error_of(answer(
                502,
                &[
                    ("content-type", "text/html"),
                    ("x-openshell-edge", "not-forwarded"),
                ],
                NGINX_502,
            ))
            .await;
            assert_eq!(never_forwarded(&marked), Some(NeverForwarded::EdgeMarker));
            // Other 503 pages are no proof.
            let other = error_of(answer(
                503,
                &[("content-type", "text/plain")],
                "upstream connect error or disconnect/reset before headers. reset reason: connection termination",
            ))
            .await;
            assert_eq!(never_forwarded(&other), None);
        }

        #[test]
        fn trailers_only_answers_of_the_edges() {
            // The built-in edge: never forwarded, and forwarded then failed.
            let mut headers = HeaderMap::new();
            headers.insert("grpc-status", HeaderValue::from_static("14"));
            headers.insert(
                "x-openshell-edge",
                HeaderValue::from_static("not-forwarded"),
            );
            let err = Error::from_status(tonic::Status::from_header_map(&headers).unwrap());
            assert_eq!(never_forwarded(&err), Some(NeverForwarded::EdgeMarker));
            let mut headers = HeaderMap::new();
            headers.insert("grpc-status", HeaderValue::from_static("14"));
            headers.insert(
                "grpc-message",
                HeaderValue::from_static("upstream failed before response headers"),
            );
            let err = Error::from_status(tonic::Status::from_header_map(&headers).unwrap());
            assert_eq!(err.code(), "unavailable");
            assert_eq!(never_forwarded(&err), None);
        }
    }
}
