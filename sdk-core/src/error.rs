//! One error type for every operation, with a stable string [`Error::code`].
//!
//! The codes are the shared vocabulary of the SDK suite: every binding maps
//! them to its own idiom (exception classes in Python, `Error` subclasses with
//! `.code` in TypeScript, `errors.Is` in Go). Codes are never renamed; new
//! ones may be added.
//!
//! | code | meaning |
//! |---|---|
//! | `cancelled` … `unauthenticated` | the gRPC status of that name (server or proxy answer, or a local cancel/deadline) |
//! | `connect` | no connection could be made (refused, DNS, connect timeout) |
//! | `tls` | TLS setup or handshake failed (bad CA, certificate not trusted, no h2 ALPN) |
//! | `invalid_config` | the [`ClientConfig`](crate::ClientConfig) or a request was rejected before any I/O |
//! | `protocol` | the server broke the contract (undecodable message, exec stream without exit event) |
//! | `output_limit` | buffered exec output passed the configured cap; the call was cancelled |
//! | `auth` | the host's [`TokenProvider`](crate::TokenProvider) failed |
//! | `stream_closed` | a send on a stream whose request half is closed (the receive side says why) |
//! | `io` | a local socket failed (forward listener bind, accept) |
//! | `cluster` | a local test cluster (the `testing` module) failed to start, take an order or stop; the message names what failed and where its logs are |
//!
//! An HTTP answer without a gRPC status (a proxy's own error page, for
//! example nginx's HTML 502 for a dead route) is `unavailable` with a message
//! naming the HTTP status: "a proxy answered HTTP 502 Bad Gateway instead of
//! gRPC"; the proxy's response headers are its metadata.
//!
//! Secrets never appear here: no error is built from a token or from a value
//! of an environment map, and `Debug` of every type holding such values
//! redacts them.

use std::time::Duration;

use tonic::Code;

use crate::metadata::{InvalidMetadata, Metadata, SERVED_BY};

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure the SDK reports.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server (or a proxy in front of it) answered with a non-OK gRPC status.
    #[error("{}: {message}", grpc_code_str(*code))]
    Rpc {
        /// The gRPC status code.
        code: Code,
        /// The status message as sent by the server.
        message: String,
        /// Response metadata that came with the status (for example
        /// `x-openshell-served-by`).
        metadata: Metadata,
    },
    /// No connection to the endpoint could be made.
    #[error("connect: {message}")]
    Connect {
        /// What failed.
        message: String,
    },
    /// TLS could not be set up or the handshake failed.
    #[error("tls: {message}")]
    Tls {
        /// What failed.
        message: String,
    },
    /// The configuration or a request was rejected before any I/O.
    #[error("invalid config: {message}")]
    InvalidConfig {
        /// What is wrong.
        message: String,
    },
    /// The server broke the wire contract.
    #[error("protocol: {message}")]
    Protocol {
        /// What was unexpected.
        message: String,
    },
    /// Buffered exec output passed the configured cap.
    #[error("output limit: exec output exceeded {limit} bytes; the call was cancelled")]
    OutputLimit {
        /// The cap in bytes (stdout and stderr together).
        limit: usize,
    },
    /// The caller cancelled the call (a cancellation token fired or a handle closed).
    #[error("cancelled: the call was cancelled by the caller")]
    Cancelled,
    /// The per-call deadline passed on the client side.
    #[error("deadline exceeded: no answer within {deadline:?}")]
    DeadlineExceeded {
        /// The deadline that was set for the call.
        deadline: Duration,
    },
    /// A sandbox reached a phase from which the awaited state cannot follow
    /// (for example ERROR while waiting for READY).
    #[error("failed precondition: {message}")]
    SandboxFailed {
        /// Name of the sandbox.
        sandbox: String,
        /// Why waiting stopped (phase and condition message).
        message: String,
    },
    /// The host's token provider failed.
    #[error("auth: token provider failed: {message}")]
    Auth {
        /// What the provider reported.
        message: String,
        /// Whether asking again later may succeed.
        retryable: bool,
    },
    /// A send on a stream whose request half is closed.
    #[error("stream closed: {message}")]
    StreamClosed {
        /// Why sending is no longer possible.
        message: String,
    },
    /// A local socket operation failed.
    #[error("io: {message}")]
    Io {
        /// The I/O error kind.
        kind: std::io::ErrorKind,
        /// What failed.
        message: String,
    },
    /// A local test cluster (the `testing` module) failed to start, carry
    /// out a fault order, or stop cleanly.
    #[error("cluster: {message}")]
    Cluster {
        /// What failed (and, when there are logs, where they are).
        message: String,
        /// The directory with the cluster's logs, kept for reading.
        logs: Option<std::path::PathBuf>,
    },
}

impl Error {
    /// The stable string code of this error (see the module docs for the list).
    pub fn code(&self) -> &'static str {
        match self {
            Error::Rpc { code, .. } => grpc_code_str(*code),
            Error::Connect { .. } => "connect",
            Error::Tls { .. } => "tls",
            Error::InvalidConfig { .. } => "invalid_config",
            Error::Protocol { .. } => "protocol",
            Error::OutputLimit { .. } => "output_limit",
            Error::Cancelled => "cancelled",
            Error::DeadlineExceeded { .. } => "deadline_exceeded",
            Error::SandboxFailed { .. } => "failed_precondition",
            Error::Auth { .. } => "auth",
            Error::StreamClosed { .. } => "stream_closed",
            Error::Io { .. } => "io",
            Error::Cluster { .. } => "cluster",
        }
    }

    /// The gRPC status code: the server's for [`Error::Rpc`], otherwise the
    /// nearest equivalent of the local failure.
    pub fn grpc_code(&self) -> Code {
        match self {
            Error::Rpc { code, .. } => *code,
            Error::Connect { .. } | Error::Tls { .. } => Code::Unavailable,
            Error::InvalidConfig { .. } => Code::InvalidArgument,
            Error::Protocol { .. } => Code::Internal,
            Error::OutputLimit { .. } => Code::ResourceExhausted,
            Error::Cancelled => Code::Cancelled,
            Error::DeadlineExceeded { .. } => Code::DeadlineExceeded,
            Error::SandboxFailed { .. } => Code::FailedPrecondition,
            Error::Auth { .. } => Code::Unauthenticated,
            Error::StreamClosed { .. } => Code::Aborted,
            Error::Io { .. } => Code::Unavailable,
            Error::Cluster { .. } => Code::Unavailable,
        }
    }

    /// The message without the code prefix.
    pub fn message(&self) -> String {
        match self {
            Error::Rpc { message, .. }
            | Error::Connect { message }
            | Error::Tls { message }
            | Error::InvalidConfig { message }
            | Error::Protocol { message }
            | Error::SandboxFailed { message, .. }
            | Error::Auth { message, .. }
            | Error::StreamClosed { message }
            | Error::Io { message, .. }
            | Error::Cluster { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// Whether the same call may succeed if retried later (with backoff).
    ///
    /// True for `unavailable`, `aborted`, `connect`, and transient token
    /// provider failures. Never true for a failure that a retry would repeat
    /// (`invalid_argument`, `not_found`, `tls`, ...).
    pub fn retryable(&self) -> bool {
        match self {
            Error::Rpc { code, .. } => matches!(code, Code::Unavailable | Code::Aborted),
            Error::Connect { .. } => true,
            Error::Auth { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// Response metadata that came with a server status, if any.
    pub fn metadata(&self) -> Option<&Metadata> {
        match self {
            Error::Rpc { metadata, .. } => Some(metadata),
            _ => None,
        }
    }

    /// The replica that produced this error (`x-openshell-served-by`), when a
    /// reference gateway answered. Absent for edge and transport failures.
    pub fn served_by(&self) -> Option<&str> {
        self.metadata().and_then(|m| m.get(SERVED_BY))
    }

    /// For a `cluster` error, the directory where the local cluster's logs
    /// were kept.
    pub fn logs(&self) -> Option<&std::path::Path> {
        match self {
            Error::Cluster { logs, .. } => logs.as_deref(),
            _ => None,
        }
    }

    /// A configuration error.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Error::InvalidConfig {
            message: message.into(),
        }
    }

    /// A contract violation by the server.
    pub fn protocol(message: impl Into<String>) -> Self {
        Error::Protocol {
            message: message.into(),
        }
    }

    /// A token provider failure; hosts return this from
    /// [`TokenProvider::token`](crate::TokenProvider::token).
    pub fn auth(message: impl Into<String>, retryable: bool) -> Self {
        Error::Auth {
            message: message.into(),
            retryable,
        }
    }

    /// Whether this is a server answer `UNAUTHENTICATED`.
    pub(crate) fn is_unauthenticated(&self) -> bool {
        matches!(
            self,
            Error::Rpc {
                code: Code::Unauthenticated,
                ..
            }
        )
    }

    pub(crate) fn io(context: &str, err: &std::io::Error) -> Self {
        Error::Io {
            kind: err.kind(),
            message: format!("{context}: {err}"),
        }
    }

    /// Maps a tonic status, recognising transport and TLS failures by the
    /// error chain tonic keeps as the status source.
    pub(crate) fn from_status(status: tonic::Status) -> Self {
        if let Some(kind) = classify_source_chain(&status) {
            let message = describe_chain(&status);
            return match kind {
                TransportFailure::Tls => Error::Tls { message },
                TransportFailure::Connect => Error::Connect { message },
            };
        }
        Error::Rpc {
            code: status.code(),
            message: status.message().to_owned(),
            metadata: Metadata::from_tonic(status.metadata()),
        }
    }

    /// Maps an error from `tonic::transport` (channel setup, `ready()`).
    pub(crate) fn from_transport(err: &(dyn std::error::Error + 'static)) -> Self {
        let message = describe_chain(err);
        match classify_source_chain(err) {
            Some(TransportFailure::Tls) => Error::Tls { message },
            _ => Error::Connect { message },
        }
    }
}

impl From<InvalidMetadata> for Error {
    fn from(err: InvalidMetadata) -> Self {
        Error::InvalidConfig { message: err.0 }
    }
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        Error::from_status(status)
    }
}

/// The message of an HTTP answer that carried no gRPC status (a proxy's
/// own error page): "a proxy answered HTTP 502 Bad Gateway instead of gRPC",
/// with a short plain-text body appended after a colon when there was one.
pub(crate) fn proxy_answer_message(status: http::StatusCode, body: Option<&str>) -> String {
    let status = match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    };
    match body {
        Some(text) => format!("a proxy answered HTTP {status} instead of gRPC: {text}"),
        None => format!("a proxy answered HTTP {status} instead of gRPC"),
    }
}

/// The string code of a gRPC status code.
pub fn grpc_code_str(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

enum TransportFailure {
    Connect,
    Tls,
}

/// Walks an error chain looking for a rustls error (`tls`), a TLS setup
/// failure reported by tonic, or tonic's `ConnectError` (`connect`).
fn classify_source_chain(err: &(dyn std::error::Error + 'static)) -> Option<TransportFailure> {
    let mut connect = false;
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if e.downcast_ref::<rustls::Error>().is_some() {
            return Some(TransportFailure::Tls);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            // io::Error::source() skips the wrapped error itself; look at it.
            if let Some(inner) = io.get_ref()
                && inner.downcast_ref::<rustls::Error>().is_some()
            {
                return Some(TransportFailure::Tls);
            }
        }
        // tonic's own TLS errors (no h2 via ALPN, handshake timeout) are private
        // types; their messages are stable enough to recognise.
        let text = e.to_string();
        if text.contains("HTTP/2 was not negotiated") || text.contains("TLS handshake timed out") {
            return Some(TransportFailure::Tls);
        }
        if e.downcast_ref::<tonic::ConnectError>().is_some() {
            connect = true;
        }
        current = e.source();
    }
    connect.then_some(TransportFailure::Connect)
}

/// "outer: inner: innermost", skipping repeated messages.
fn describe_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        // A status prints its code and source too; its message is enough.
        let text = match e.downcast_ref::<tonic::Status>() {
            Some(status) => status.message().to_owned(),
            None => e.to_string(),
        };
        // tonic's wrapper adds nothing but a generic label.
        let generic = text == "transport error";
        if !text.is_empty() && !generic && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        current = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_statuses_map_to_stable_codes() {
        let cases = [
            (Code::NotFound, "not_found", false),
            (Code::InvalidArgument, "invalid_argument", false),
            (Code::Unavailable, "unavailable", true),
            (Code::Unauthenticated, "unauthenticated", false),
            (Code::PermissionDenied, "permission_denied", false),
            (Code::DeadlineExceeded, "deadline_exceeded", false),
            (Code::Cancelled, "cancelled", false),
            (Code::AlreadyExists, "already_exists", false),
            (Code::FailedPrecondition, "failed_precondition", false),
            (Code::ResourceExhausted, "resource_exhausted", false),
            (Code::Aborted, "aborted", true),
            (Code::Internal, "internal", false),
            (Code::Unimplemented, "unimplemented", false),
        ];
        for (code, expected, retryable) in cases {
            let err = Error::from(tonic::Status::new(code, "boom"));
            assert_eq!(err.code(), expected);
            assert_eq!(err.grpc_code(), code);
            assert_eq!(err.message(), "boom");
            assert_eq!(err.retryable(), retryable, "{expected}");
            assert_eq!(err.to_string(), format!("{expected}: boom"));
        }
    }

    #[test]
    fn local_failures_have_their_own_codes() {
        assert_eq!(Error::invalid_config("x").code(), "invalid_config");
        assert_eq!(Error::protocol("x").code(), "protocol");
        assert_eq!(Error::OutputLimit { limit: 1 }.code(), "output_limit");
        assert_eq!(Error::Cancelled.code(), "cancelled");
        assert_eq!(
            Error::DeadlineExceeded {
                deadline: Duration::from_secs(1)
            }
            .code(),
            "deadline_exceeded"
        );
        assert_eq!(
            Error::Connect {
                message: "x".into()
            }
            .code(),
            "connect"
        );
        assert!(
            Error::Connect {
                message: "x".into()
            }
            .retryable()
        );
        assert_eq!(
            Error::Tls {
                message: "x".into()
            }
            .code(),
            "tls"
        );
        assert!(
            !Error::Tls {
                message: "x".into()
            }
            .retryable()
        );
        assert_eq!(Error::auth("x", true).code(), "auth");
        assert!(Error::auth("x", true).retryable());
        assert!(!Error::auth("x", false).retryable());
        let failed = Error::SandboxFailed {
            sandbox: "s".into(),
            message: "phase ERROR".into(),
        };
        assert_eq!(failed.code(), "failed_precondition");
        assert_eq!(failed.grpc_code(), Code::FailedPrecondition);
    }

    #[test]
    fn connect_errors_in_the_source_chain_become_connect() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let status = tonic::Status::from_error(Box::new(tonic::ConnectError(Box::new(io))));
        assert_eq!(status.code(), Code::Unavailable);
        let err = Error::from(status);
        assert_eq!(err.code(), "connect");
        assert!(err.retryable());
        assert_eq!(err.to_string(), "connect: refused");
    }

    #[test]
    fn rustls_errors_in_the_source_chain_become_tls() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let status = tonic::Status::from_error(Box::new(tonic::ConnectError(Box::new(io))));
        let err = Error::from(status);
        assert_eq!(err.code(), "tls");
        assert!(!err.retryable());
    }

    #[test]
    fn status_metadata_is_kept_and_names_the_replica() {
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert("x-openshell-served-by", "gw-1".parse().unwrap());
        let status = tonic::Status::with_metadata(Code::NotFound, "no sandbox", md);
        let err = Error::from(status);
        assert_eq!(err.served_by(), Some("gw-1"));
        assert_eq!(err.code(), "not_found");
    }
}
