//! The core's [`openshell_sdk::Error`] as a uniffi error enum: one variant per
//! stable code, so Kotlin can `catch (e: OpenShellException.NotFound)`.
//! Every variant carries the same fields; `code` is the core's string code
//! (the one the other SDKs report), `detail` its message (never a token).

/// An OpenShell error, by its stable code.
#[derive(Debug, thiserror::Error, uniffi::Error)]
pub enum OpenShellError {
    /// `cancelled`
    #[error("{code}: {detail}")]
    Cancelled {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `unknown`
    #[error("{code}: {detail}")]
    Unknown {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `invalid_argument`
    #[error("{code}: {detail}")]
    InvalidArgument {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `deadline_exceeded`
    #[error("{code}: {detail}")]
    DeadlineExceeded {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `not_found`
    #[error("{code}: {detail}")]
    NotFound {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `already_exists`
    #[error("{code}: {detail}")]
    AlreadyExists {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `permission_denied`
    #[error("{code}: {detail}")]
    PermissionDenied {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `resource_exhausted`
    #[error("{code}: {detail}")]
    ResourceExhausted {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `failed_precondition` (also a sandbox that failed to start)
    #[error("{code}: {detail}")]
    FailedPrecondition {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `aborted`
    #[error("{code}: {detail}")]
    Aborted {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `out_of_range`
    #[error("{code}: {detail}")]
    OutOfRange {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `unimplemented`
    #[error("{code}: {detail}")]
    Unimplemented {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `internal`
    #[error("{code}: {detail}")]
    Internal {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `unavailable`
    #[error("{code}: {detail}")]
    Unavailable {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `data_loss`
    #[error("{code}: {detail}")]
    DataLoss {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `unauthenticated`
    #[error("{code}: {detail}")]
    Unauthenticated {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `connect`: the gateway could not be reached.
    #[error("{code}: {detail}")]
    Connect {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `tls`
    #[error("{code}: {detail}")]
    Tls {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `invalid_config`: refused before any I/O.
    #[error("{code}: {detail}")]
    InvalidConfig {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `protocol`
    #[error("{code}: {detail}")]
    Protocol {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `output_limit`: a buffered exec's output passed its cap.
    #[error("{code}: {detail}")]
    OutputLimit {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `auth`: the token provider failed.
    #[error("{code}: {detail}")]
    Auth {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `stream_closed`
    #[error("{code}: {detail}")]
    StreamClosed {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `io`
    #[error("{code}: {detail}")]
    Io {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// `cluster`: a local test cluster failed.
    #[error("{code}: {detail}")]
    Cluster {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
    /// Any code this binding does not know yet (never a panic).
    #[error("{code}: {detail}")]
    Other {
        code: String,
        detail: String,
        grpc_status: i32,
        retryable: bool,
        served_by: Option<String>,
    },
}

impl From<openshell_sdk::Error> for OpenShellError {
    fn from(err: openshell_sdk::Error) -> Self {
        let code = err.code().to_owned();
        let detail = err.message();
        let grpc_status = err.grpc_code() as i32;
        let retryable = err.retryable();
        let served_by = err.served_by().map(str::to_owned);
        macro_rules! build {
            ($variant:ident) => {
                OpenShellError::$variant {
                    code,
                    detail,
                    grpc_status,
                    retryable,
                    served_by,
                }
            };
        }
        match code.as_str() {
            "cancelled" => build!(Cancelled),
            "unknown" => build!(Unknown),
            "invalid_argument" => build!(InvalidArgument),
            "deadline_exceeded" => build!(DeadlineExceeded),
            "not_found" => build!(NotFound),
            "already_exists" => build!(AlreadyExists),
            "permission_denied" => build!(PermissionDenied),
            "resource_exhausted" => build!(ResourceExhausted),
            "failed_precondition" => build!(FailedPrecondition),
            "aborted" => build!(Aborted),
            "out_of_range" => build!(OutOfRange),
            "unimplemented" => build!(Unimplemented),
            "internal" => build!(Internal),
            "unavailable" => build!(Unavailable),
            "data_loss" => build!(DataLoss),
            "unauthenticated" => build!(Unauthenticated),
            "connect" => build!(Connect),
            "tls" => build!(Tls),
            "invalid_config" => build!(InvalidConfig),
            "protocol" => build!(Protocol),
            "output_limit" => build!(OutputLimit),
            "auth" => build!(Auth),
            "stream_closed" => build!(StreamClosed),
            "io" => build!(Io),
            "cluster" => build!(Cluster),
            _ => build!(Other),
        }
    }
}

/// A token source (a JVM object) that threw something unexpected.
impl From<uniffi::UnexpectedUniFFICallbackError> for OpenShellError {
    fn from(err: uniffi::UnexpectedUniFFICallbackError) -> Self {
        openshell_sdk::Error::auth(format!("token source failed: {}", err.reason), false).into()
    }
}

impl OpenShellError {
    /// The fields every variant carries.
    fn parts(&self) -> (&str, &str, i32, bool, Option<&str>) {
        match self {
            OpenShellError::Cancelled {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::Unknown {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::InvalidArgument {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::DeadlineExceeded {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::NotFound {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::AlreadyExists {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::PermissionDenied {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::ResourceExhausted {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::FailedPrecondition {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::Aborted {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::OutOfRange {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::Unimplemented {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::Internal {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::Unavailable {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::DataLoss {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::Unauthenticated {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::Connect {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::Tls {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::InvalidConfig {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::Protocol {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::OutputLimit {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::Auth {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::StreamClosed {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::Io {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::Cluster {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            }
            | OpenShellError::Other {
                code,
                detail,
                grpc_status,
                retryable,
                served_by,
            } => (code, detail, *grpc_status, *retryable, served_by.as_deref()),
        }
    }

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
