"""OpenShell SDK for Python.

Two clients with the same operations:

- :class:`AsyncClient` for asyncio code;
- :class:`Client` for blocking code (it waits on the core on the calling
  thread with the GIL released, so you never manage a loop).

:class:`ConfigSession` (and its blocking form :class:`SyncConfigSession`) is
the supervisor side of a sandbox's session: pushed or polled configuration
snapshots, each answered applied or rejected. :class:`HostSession` (and
:class:`SyncHostSession`) is a shared supervisor host's session: one session
for many sandboxes, each assigned sandbox's configuration handed to one
``apply(sandbox_id, snapshot)`` callback.

Both are thin layers over the OpenShell core client (Rust, in the
``_native`` extension module): owner routing, auth refresh, deadlines, and the
data planes of exec and port forwarding run there. Protobuf message types of
the wire contract are in :mod:`openshell_sdk.proto`; every RPC is also
reachable through the typed raw stubs ``client.raw``.
"""

import atexit as _atexit

from . import _native, errors, proto, types
from ._async_client import (
    AsyncClient,
    AsyncSandboxes,
    EventWatch,
    ExecStream,
    Forward,
    InteractiveExec,
    SandboxWatch,
    TokenProvider,
)
from ._config_session import (
    ApplyCallback,
    ApplyResult,
    ConfigSession,
    ConfigSessionStats,
    ConfigSnapshot,
    ConfigUpdate,
    DeliveryMode,
    Rejected,
    SyncConfigSession,
)
from ._files import BinarySink, BinarySource, LocalPath, ProgressCallback
from ._host_session import (
    HostApplyCallback,
    HostSession,
    HostSessionStats,
    SyncHostApplyCallback,
    SyncHostSession,
)
from ._logs import Since, Sources
from ._native import __version__ as _native_version
from ._proto import datamodel_pb2, openshell_pb2, sandbox_pb2
from ._raw_runtime import BidiStream, MethodInfo, RawResponse, ServerStream
from ._sync_client import (
    Client,
    Sandboxes,
    SyncEventWatch,
    SyncExecStream,
    SyncForward,
    SyncInteractiveExec,
    SyncSandboxWatch,
)
from .errors import (
    AbortedError,
    AlreadyExistsError,
    AuthError,
    CallCancelledError,
    ClusterError,
    ConnectError,
    DeadlineExceededError,
    FailedPreconditionError,
    GrpcStatus,
    InternalError,
    InvalidArgumentError,
    InvalidConfigError,
    NotFoundError,
    OpenShellError,
    OutOfRangeError,
    OutputLimitError,
    PermissionDeniedError,
    ProtocolError,
    ResourceExhaustedError,
    StreamClosedError,
    TlsError,
    UnauthenticatedError,
    UnavailableError,
)
from .raw import METHODS, AsyncRaw
from .raw_sync import SyncRaw
from .types import (
    DeletionOutcome,
    ExecEvent,
    ExecExit,
    ExecResult,
    ExecStderr,
    ExecStdout,
    ForwardStats,
    Health,
    LogEvent,
    LogLine,
    Logs,
    RoutingStats,
    Sandbox,
    SandboxEvent,
    SandboxPhase,
    ServiceStatus,
    SshSession,
    TransferProgress,
    TransferSummary,
    WatchEvent,
)

# Stop the native runtime before the interpreter is torn down (see
# bindings/python/src/runtime.rs): a call completing during finalization
# would otherwise take the GIL of a dying interpreter.
_atexit.register(_native._shutdown_runtime)

__version__ = _native_version

__all__ = [
    "AbortedError",
    "AlreadyExistsError",
    "ApplyCallback",
    "ApplyResult",
    "AsyncClient",
    "AsyncRaw",
    "AsyncSandboxes",
    "AuthError",
    "BidiStream",
    "BinarySink",
    "BinarySource",
    "CallCancelledError",
    "Client",
    "ClusterError",
    "ConfigSession",
    "ConfigSessionStats",
    "ConfigSnapshot",
    "ConfigUpdate",
    "ConnectError",
    "DeadlineExceededError",
    "DeletionOutcome",
    "DeliveryMode",
    "EventWatch",
    "ExecEvent",
    "ExecExit",
    "ExecResult",
    "ExecStderr",
    "ExecStdout",
    "ExecStream",
    "FailedPreconditionError",
    "Forward",
    "ForwardStats",
    "GrpcStatus",
    "Health",
    "HostApplyCallback",
    "HostSession",
    "HostSessionStats",
    "InteractiveExec",
    "InternalError",
    "InvalidArgumentError",
    "InvalidConfigError",
    "LocalPath",
    "LogEvent",
    "LogLine",
    "Logs",
    "METHODS",
    "MethodInfo",
    "NotFoundError",
    "OpenShellError",
    "OutOfRangeError",
    "OutputLimitError",
    "PermissionDeniedError",
    "ProgressCallback",
    "ProtocolError",
    "RawResponse",
    "Rejected",
    "ResourceExhaustedError",
    "RoutingStats",
    "Sandbox",
    "SandboxEvent",
    "SandboxPhase",
    "SandboxWatch",
    "Sandboxes",
    "ServerStream",
    "ServiceStatus",
    "Since",
    "Sources",
    "SshSession",
    "StreamClosedError",
    "SyncConfigSession",
    "SyncEventWatch",
    "SyncExecStream",
    "SyncForward",
    "SyncHostApplyCallback",
    "SyncHostSession",
    "SyncInteractiveExec",
    "SyncRaw",
    "SyncSandboxWatch",
    "TlsError",
    "TokenProvider",
    "TransferProgress",
    "TransferSummary",
    "UnauthenticatedError",
    "UnavailableError",
    "WatchEvent",
    "__version__",
    "datamodel_pb2",
    "errors",
    "openshell_pb2",
    "proto",
    "sandbox_pb2",
    "types",
]
