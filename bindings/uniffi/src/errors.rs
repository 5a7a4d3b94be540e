//! The core's [`openshell_sdk::Error`] as a uniffi error enum: one variant per
//! stable code, so Kotlin can `catch (e: OpenShellException.NotFound)`.
//! Every variant carries the same fields; `code` is the core's string code
//! (the one the other SDKs report), `detail` its message (never a token).

/// Defines [`OpenShellError`] from one list of `Variant = "code"` pairs and,
/// after a `;`, the variant for any code not listed, with the same five fields
/// on every variant, the code -> variant mapping and `parts()`.
macro_rules! openshell_error {
    (
        $( $(#[$doc:meta])* $variant:ident = $code:literal ),+ ;
        $(#[$other_doc:meta])* $other:ident
    ) => {
        /// An OpenShell error, by its stable code.
        #[derive(Debug, thiserror::Error, uniffi::Error)]
        pub enum OpenShellError {
            $(
                $(#[$doc])*
                #[error("{code}: {detail}")]
                $variant {
                    code: String,
                    detail: String,
                    grpc_status: i32,
                    retryable: bool,
                    served_by: Option<String>,
                },
            )*
            $(#[$other_doc])*
            #[error("{code}: {detail}")]
            $other {
                code: String,
                detail: String,
                grpc_status: i32,
                retryable: bool,
                served_by: Option<String>,
            },
        }

        impl OpenShellError {
            /// The variant for `code` (the last one for a code not listed).
            fn build(
                code: String,
                detail: String,
                grpc_status: i32,
                retryable: bool,
                served_by: Option<String>,
            ) -> Self {
                match code.as_str() {
                    $(
                        $code => OpenShellError::$variant {
                            code,
                            detail,
                            grpc_status,
                            retryable,
                            served_by,
                        },
                    )*
                    _ => OpenShellError::$other {
                        code,
                        detail,
                        grpc_status,
                        retryable,
                        served_by,
                    },
                }
            }

            /// The fields every variant carries.
            fn parts(&self) -> (&str, &str, i32, bool, Option<&str>) {
                match self {
                    $(OpenShellError::$variant {
                        code,
                        detail,
                        grpc_status,
                        retryable,
                        served_by,
                    })|*
                    | OpenShellError::$other {
                        code,
                        detail,
                        grpc_status,
                        retryable,
                        served_by,
                    } => (code, detail, *grpc_status, *retryable, served_by.as_deref()),
                }
            }
        }
    };
}

openshell_error! {
    /// `cancelled`
    Cancelled = "cancelled",
    /// `unknown`
    Unknown = "unknown",
    /// `invalid_argument`
    InvalidArgument = "invalid_argument",
    /// `deadline_exceeded`
    DeadlineExceeded = "deadline_exceeded",
    /// `not_found`
    NotFound = "not_found",
    /// `already_exists`
    AlreadyExists = "already_exists",
    /// `permission_denied`
    PermissionDenied = "permission_denied",
    /// `resource_exhausted`
    ResourceExhausted = "resource_exhausted",
    /// `failed_precondition` (also a sandbox that failed to start)
    FailedPrecondition = "failed_precondition",
    /// `aborted`
    Aborted = "aborted",
    /// `out_of_range`
    OutOfRange = "out_of_range",
    /// `unimplemented`
    Unimplemented = "unimplemented",
    /// `internal`
    Internal = "internal",
    /// `unavailable`
    Unavailable = "unavailable",
    /// `data_loss`
    DataLoss = "data_loss",
    /// `unauthenticated`
    Unauthenticated = "unauthenticated",
    /// `connect`: the gateway could not be reached.
    Connect = "connect",
    /// `tls`
    Tls = "tls",
    /// `invalid_config`: refused before any I/O.
    InvalidConfig = "invalid_config",
    /// `protocol`
    Protocol = "protocol",
    /// `output_limit`: a buffered exec's output passed its cap.
    OutputLimit = "output_limit",
    /// `auth`: the token provider failed.
    Auth = "auth",
    /// `stream_closed`
    StreamClosed = "stream_closed",
    /// `io`
    Io = "io",
    /// `cluster`: a local test cluster failed.
    Cluster = "cluster";
    /// Any code this binding does not know yet (never a panic).
    Other
}

impl From<openshell_sdk::Error> for OpenShellError {
    fn from(err: openshell_sdk::Error) -> Self {
        OpenShellError::build(
            err.code().to_owned(),
            err.message(),
            err.grpc_code() as i32,
            err.retryable(),
            err.served_by().map(str::to_owned),
        )
    }
}

/// A token source (a JVM object) that threw something unexpected.
impl From<uniffi::UnexpectedUniFFICallbackError> for OpenShellError {
    fn from(err: uniffi::UnexpectedUniFFICallbackError) -> Self {
        openshell_sdk::Error::auth(format!("token source failed: {}", err.reason), false).into()
    }
}

impl OpenShellError {
    /// The detail (message) of any variant.
    pub(crate) fn detail(&self) -> String {
        self.parts().1.to_owned()
    }

    /// The core error again (for a token source's error going back in).
    pub(crate) fn into_core(self) -> openshell_sdk::Error {
        let (_, detail, _, retryable, _) = self.parts();
        openshell_sdk::Error::auth(format!("token source failed: {detail}"), retryable)
    }
}

/// What every variant carries, readable on the sealed base class.
#[uniffi::export]
impl OpenShellError {
    /// The stable code (`not_found`, `unavailable`, ...).
    pub fn error_code(&self) -> String {
        self.parts().0.to_owned()
    }

    /// The gRPC status code (5 for `not_found`, 14 for `unavailable`, ...).
    pub fn grpc_status_code(&self) -> i32 {
        self.parts().2
    }

    /// Whether trying again may succeed.
    pub fn is_retryable(&self) -> bool {
        self.parts().3
    }
}

/// An `invalid_config` error raised before any I/O.
pub(crate) fn invalid(message: impl Into<String>) -> OpenShellError {
    openshell_sdk::Error::invalid_config(message).into()
}
