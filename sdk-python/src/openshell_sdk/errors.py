"""Exceptions: one base class, :class:`OpenShellError`, and a subclass per common code.

Every error the SDK raises for a failed call is an :class:`OpenShellError` with:

- ``code``: the core's stable string code (``"not_found"``, ``"invalid_argument"``,
  ``"unavailable"``, ``"connect"``, ``"tls"``, ``"invalid_config"``, ...), the same
  in every language of the suite;
- ``grpc_status``: the gRPC status (a :class:`GrpcStatus`, an ``int``): the
  server's, or the nearest equivalent of a local failure;
- ``message``, ``retryable``, the response ``metadata`` of server errors, and
  ``served_by`` (the gateway replica that produced it, if one did).

Catch the base class, a subclass, or compare ``err.code``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

__all__ = [
    "AbortedError",
    "AlreadyExistsError",
    "AuthError",
    "CallCancelledError",
    "ClusterError",
    "ConnectError",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "GrpcStatus",
    "InternalError",
    "InvalidArgumentError",
    "InvalidConfigError",
    "IoError",
    "NotFoundError",
    "OpenShellError",
    "OutOfRangeError",
    "OutputLimitError",
    "PermissionDeniedError",
    "ProtocolError",
    "ResourceExhaustedError",
    "StreamClosedError",
    "TlsError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownError",
    "error_class",
]


class GrpcStatus(enum.IntEnum):
    """gRPC status codes."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class OpenShellError(Exception):
    """A call failed. ``code`` says why, in the suite's common vocabulary."""

    code: str
    grpc_status: GrpcStatus
    message: str
    retryable: bool
    metadata: tuple[tuple[str, str], ...]

    def __init__(
        self,
        message: str,
        *,
        code: str = "unknown",
        grpc_status: int = GrpcStatus.UNKNOWN,
        retryable: bool = False,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.grpc_status = _status(grpc_status)
        self.message = message
        self.retryable = retryable
        self.metadata = tuple(metadata)

    @property
    def served_by(self) -> str | None:
        """The gateway replica that produced this error (``x-openshell-served-by``)."""
        for key, value in self.metadata:
            if key == "x-openshell-served-by":
                return value
        return None

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments: pickle (multiprocessing) needs a hand.
        return (
            _rebuild,
            (
                type(self),
                self.message,
                self.code,
                int(self.grpc_status),
                self.retryable,
                self.metadata,
            ),
        )


def _rebuild(
    cls: type[OpenShellError],
    message: str,
    code: str,
    grpc_status: int,
    retryable: bool,
    metadata: tuple[tuple[str, str], ...],
) -> OpenShellError:
    return cls(message, code=code, grpc_status=grpc_status, retryable=retryable, metadata=metadata)


def _status(value: int) -> GrpcStatus:
    try:
        return GrpcStatus(value)
    except ValueError:
        return GrpcStatus.UNKNOWN


class NotFoundError(OpenShellError):
    """``not_found``: no such sandbox (or other object)."""


class InvalidArgumentError(OpenShellError):
    """``invalid_argument``: the gateway rejected the request."""


class AlreadyExistsError(OpenShellError):
    """``already_exists``: for example a sandbox name that is taken."""


class PermissionDeniedError(OpenShellError):
    """``permission_denied``."""


class UnauthenticatedError(OpenShellError):
    """``unauthenticated``: missing or wrong token."""


class FailedPreconditionError(OpenShellError):
    """``failed_precondition``: for example a sandbox that is not ready (or became ERROR)."""


class ResourceExhaustedError(OpenShellError):
    """``resource_exhausted``: for example a frame over the gateway's limit."""


class UnavailableError(OpenShellError):
    """``unavailable``: the gateway or the edge could not serve the call now; retryable."""


class DeadlineExceededError(OpenShellError):
    """``deadline_exceeded``: the call's timeout passed."""


class CallCancelledError(OpenShellError):
    """``cancelled``: the call was cancelled (its stream or client was closed).

    A cancelled asyncio task raises :class:`asyncio.CancelledError` as usual; this
    class is for calls that end because something else cancelled them.
    """


class InternalError(OpenShellError):
    """``internal``."""


class UnimplementedError(OpenShellError):
    """``unimplemented``: the gateway does not know the method."""


class AbortedError(OpenShellError):
    """``aborted``: a conflict; retryable."""


class OutOfRangeError(OpenShellError):
    """``out_of_range``: for a watch (``client.sandboxes.events``), the gateway no
    longer holds the events that followed its cursor (it keeps a bounded number of
    log lines), or the cursor is not one of this gateway's. The watch ends with it
    rather than skip ahead quietly; watch again without ``resume_after`` to start
    from the current state."""


class DataLossError(OpenShellError):
    """``data_loss``."""


class UnknownError(OpenShellError):
    """``unknown``: the server (or a proxy) gave no usable status."""


class ConnectError(OpenShellError):
    """``connect``: no connection (refused, DNS, connect timeout); retryable."""


class TlsError(OpenShellError):
    """``tls``: TLS setup or handshake failed (bad CA bundle, untrusted certificate)."""


class InvalidConfigError(OpenShellError):
    """``invalid_config``: the configuration or a request was rejected before any I/O."""


class ProtocolError(OpenShellError):
    """``protocol``: the server broke the wire contract."""


class OutputLimitError(OpenShellError):
    """``output_limit``: buffered exec output passed the cap; the call was cancelled."""


class AuthError(OpenShellError):
    """``auth``: the token provider failed."""


class StreamClosedError(OpenShellError):
    """``stream_closed``: a send on a stream whose send side is closed."""


class IoError(OpenShellError):
    """``io``: a local socket failed (for example binding a forward's listener)."""


class ClusterError(OpenShellError):
    """``cluster``: a local test cluster (:mod:`openshell_sdk.testing`) failed to start,
    carry out a fault, or stop cleanly.

    ``logs`` is the directory where the cluster's logs were kept, when there is one.
    """

    logs: str | None = None


_CLASSES: dict[str, type[OpenShellError]] = {
    "not_found": NotFoundError,
    "invalid_argument": InvalidArgumentError,
    "already_exists": AlreadyExistsError,
    "permission_denied": PermissionDeniedError,
    "unauthenticated": UnauthenticatedError,
    "failed_precondition": FailedPreconditionError,
    "resource_exhausted": ResourceExhaustedError,
    "unavailable": UnavailableError,
    "deadline_exceeded": DeadlineExceededError,
    "cancelled": CallCancelledError,
    "internal": InternalError,
    "unimplemented": UnimplementedError,
    "aborted": AbortedError,
    "out_of_range": OutOfRangeError,
    "data_loss": DataLossError,
    "unknown": UnknownError,
    "connect": ConnectError,
    "tls": TlsError,
    "invalid_config": InvalidConfigError,
    "protocol": ProtocolError,
    "output_limit": OutputLimitError,
    "auth": AuthError,
    "stream_closed": StreamClosedError,
    "io": IoError,
    "cluster": ClusterError,
}


def _invalid_config(message: str) -> InvalidConfigError:
    """A request the SDK refuses before any I/O."""
    return InvalidConfigError(
        message, code="invalid_config", grpc_status=GrpcStatus.INVALID_ARGUMENT
    )


def error_class(code: str) -> type[OpenShellError]:
    """The exception class of a code (:class:`OpenShellError` for the rest)."""
    return _CLASSES.get(code, OpenShellError)


def _from_native(
    code: str,
    message: str,
    grpc_status: int,
    retryable: bool,
    metadata: list[tuple[str, str]],
) -> OpenShellError:
    """Called by the native module to build the exception of a core error."""
    # Some core messages repeat their code ("cancelled: ..."); str() adds it once.
    message = message.removeprefix(f"{code}: ")
    return error_class(code)(
        message, code=code, grpc_status=grpc_status, retryable=retryable, metadata=metadata
    )
