"""Type stubs of the extension module ``openshell_sdk._native`` (bindings/python).

Async methods must be called inside a running event loop and return asyncio
futures; on a client built with ``blocking=True`` (the sync API) they wait on the
calling thread with the GIL released and return an awaitable that is already
complete (:class:`Ready`), and so do the methods of that client's handles.
Messages are encoded protobuf ``bytes``; metadata is a list of ``(key, value)``
pairs; timeouts are seconds. Errors are raised as :mod:`openshell_sdk.errors`
exceptions.
"""

from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any, TypedDict

__version__: str

class Ready:
    """A completed awaitable: ``await`` returns its value without suspending."""

    def __await__(self) -> Generator[Any, None, Any]: ...
    def result(self) -> Any: ...

class ExecArgs(TypedDict):
    sandbox: str
    command: list[str]
    workdir: str | None
    environment: dict[str, str]
    stdin: bytes | None
    tty: bool
    cols: int
    rows: int
    exec_timeout: float | None
    output_limit: int | None

class ForwardStatsDict(TypedDict):
    connections_accepted: int
    connections_active: int
    connections_failed: int
    bytes_in: int
    bytes_out: int

class RoutingStatsDict(TypedDict):
    hinted: int
    unhinted: int
    unrouted_retries: int
    owner_lookups: int
    cache_hits: int

class RuntimeInfo(TypedDict):
    pid: int
    runtime_builds: int

Metadata = list[tuple[str, str]]
# (kind, data, exit_code): kind 1 stdout, 2 stderr, 3 exit.
WireEvent = tuple[int, bytes, int]

# (stdout, stderr, exit_code), as buffered exec answers.
WireOutput = tuple[bytes, bytes, int]

class ExecStreamHandle:
    def next_batch(self, max_events: int = 256) -> Awaitable[list[WireEvent]]: ...
    def collect(self, buffered: list[WireEvent] = ...) -> Awaitable[WireOutput]: ...
    def cancel(self) -> None: ...

class InteractiveHandle:
    def write(self, data: bytes) -> Awaitable[None]: ...
    def resize(self, cols: int, rows: int) -> Awaitable[None]: ...
    def close_stdin(self) -> None: ...
    def next_batch(self, max_events: int = 256) -> Awaitable[list[WireEvent]]: ...
    def collect(self, buffered: list[WireEvent] = ...) -> Awaitable[WireOutput]: ...
    def cancel(self) -> None: ...

class WatchHandle:
    def next(self) -> Awaitable[bytes | None]: ...
    def cancel(self) -> None: ...

class NativeForward:
    @property
    def local_address(self) -> tuple[str, int]: ...
    @property
    def sandbox(self) -> str: ...
    @property
    def remote_port(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def stats(self) -> ForwardStatsDict: ...
    def close(self) -> None: ...
    def wait_closed(self) -> Awaitable[None]: ...

class RawStreamHandle:
    def send(self, message: bytes) -> Awaitable[None]: ...
    def close_send(self) -> None: ...
    def recv(self) -> Awaitable[bytes | None]: ...
    def response_metadata(self) -> Awaitable[Metadata]: ...
    def trailers(self) -> Metadata | None: ...
    def cancel(self) -> None: ...

# (files, directories, symlinks, skipped_symlinks, ignored, skipped_other, bytes).
WireSummary = tuple[int, int, int, int, int, int, int]
# (bytes_done, bytes_total, files_done, files_total, current).
WireProgress = tuple[int, int, int, int, str]
# (time in microseconds since the epoch or None, level, source, target, message, fields).
WireLogLine = tuple[int | None, str, str, str, str, dict[str, str]]
# (cursor, encoded Sandbox or None, log line or None).
WireWatchEvent = tuple[str, bytes | None, WireLogLine | None]

class ProgressChannel:
    """The latest progress report of a transfer; ``deliver`` gets it on a
    blocking caller's thread."""

    def __init__(self, deliver: Callable[[WireProgress], object]) -> None: ...
    def next(self) -> Awaitable[WireProgress | None]: ...
    def take(self) -> WireProgress | None: ...
    def close(self) -> None: ...

class UploadSinkHandle:
    @property
    def target(self) -> str: ...
    def write(self, data: bytes) -> Awaitable[None]: ...
    def finish(self) -> Awaitable[WireSummary]: ...
    def abort(self) -> None: ...

class DownloadSourceHandle:
    @property
    def size(self) -> int: ...
    @property
    def source(self) -> str: ...
    def next_chunk(self) -> Awaitable[bytes | None]: ...
    def close(self) -> None: ...

class EventWatchHandle:
    def next_batch(self, max_events: int = 256) -> Awaitable[list[WireWatchEvent]]: ...
    @property
    def resumes(self) -> int: ...
    def cancel(self) -> None: ...

class NativeClient:
    def __init__(
        self,
        endpoint: str,
        *,
        token: str | None = None,
        token_provider: Callable[[bool], Any] | None = None,
        ca_pem: bytes | None = None,
        tls_server_name: str | None = None,
        connect_timeout: float | None = None,
        default_timeout: float | None = None,
        no_default_timeout: bool = False,
        exec_output_limit: int | None = None,
        allow_cleartext_token: bool = False,
        blocking: bool = False,
    ) -> None: ...
    @property
    def endpoint(self) -> str: ...
    @property
    def blocking(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def connect(self) -> Awaitable[None]: ...
    def health(self, *, timeout: float | None = None) -> Awaitable[tuple[int, str, str | None]]: ...
    def create_sandbox(
        self,
        *,
        name: str | None = None,
        image: str | None = None,
        environment: Mapping[str, str] | None = None,
        command: list[str] | None = None,
        labels: Mapping[str, str] | None = None,
        tty: bool = False,
        timeout: float | None = None,
    ) -> Awaitable[bytes]: ...
    # The encoded SandboxResponse (checked to carry a sandbox).
    def get_sandbox(self, name: str, *, timeout: float | None = None) -> Awaitable[bytes]: ...
    def list_sandboxes(
        self,
        *,
        label_selector: str | None = None,
        page_size: int | None = None,
        timeout: float | None = None,
    ) -> Awaitable[list[bytes]]: ...
    def delete_sandbox(self, name: str, *, timeout: float | None = None) -> Awaitable[int]: ...
    def wait_ready(self, name: str, *, timeout: float | None = None) -> Awaitable[bytes]: ...
    def wait_deleted(self, name: str, *, timeout: float | None = None) -> Awaitable[None]: ...
    def watch(self, name: str, *, timeout: float | None = None) -> Awaitable[WatchHandle]: ...
    def exec(
        self, request: ExecArgs | dict[str, Any], *, timeout: float | None = None
    ) -> Awaitable[tuple[bytes, bytes, int]]: ...
    def exec_stream(
        self, request: ExecArgs | dict[str, Any], *, timeout: float | None = None
    ) -> Awaitable[ExecStreamHandle]: ...
    def exec_interactive(
        self, request: ExecArgs | dict[str, Any], *, timeout: float | None = None
    ) -> Awaitable[InteractiveHandle]: ...
    def forward(
        self,
        sandbox: str,
        remote_port: int,
        *,
        local_address: str = "127.0.0.1:0",
        ssh_session_token: str | None = None,
        timeout: float | None = None,
    ) -> Awaitable[NativeForward]: ...
    # (sandbox_id, token, host_key_fingerprint, expires_at epoch seconds or None,
    # gateway_host, gateway_port, gateway_scheme).
    def create_ssh_session(
        self, sandbox: str, *, timeout: float | None = None
    ) -> Awaitable[tuple[str, str, str, float | None, str, int, str]]: ...
    def revoke_ssh_session(
        self, token: str, *, timeout: float | None = None
    ) -> Awaitable[bool]: ...
    def raw_unary(
        self,
        path: str,
        request: bytes,
        *,
        metadata: Metadata = ...,
        timeout: float | None = None,
    ) -> Awaitable[tuple[bytes, Metadata]]: ...
    def raw_stream(
        self, path: str, *, metadata: Metadata = ..., timeout: float | None = None
    ) -> Awaitable[RawStreamHandle]: ...
    def upload(
        self,
        sandbox: str,
        local: str,
        remote: str,
        *,
        ignore_file: str | None = None,
        progress: ProgressChannel | None = None,
        timeout: float | None = None,
    ) -> Awaitable[WireSummary]: ...
    def download(
        self,
        sandbox: str,
        remote: str,
        local: str,
        *,
        ignore_file: str | None = None,
        progress: ProgressChannel | None = None,
        timeout: float | None = None,
    ) -> Awaitable[WireSummary]: ...
    def upload_stream(
        self,
        sandbox: str,
        remote: str,
        *,
        progress: ProgressChannel | None = None,
        timeout: float | None = None,
    ) -> Awaitable[UploadSinkHandle]: ...
    def download_stream(
        self,
        sandbox: str,
        remote: str,
        *,
        progress: ProgressChannel | None = None,
        timeout: float | None = None,
    ) -> Awaitable[DownloadSourceHandle]: ...
    def read_file(
        self, sandbox: str, remote: str, *, timeout: float | None = None
    ) -> Awaitable[bytes]: ...
    def write_file(
        self, sandbox: str, remote: str, data: bytes, *, timeout: float | None = None
    ) -> Awaitable[WireSummary]: ...
    def sandbox_logs(
        self,
        name: str,
        *,
        tail: int | None = None,
        since_us: int | None = None,
        sources: list[str] = ...,
        min_level: str | None = None,
        timeout: float | None = None,
    ) -> Awaitable[tuple[list[WireLogLine], int]]: ...
    def sandbox_events(
        self,
        name: str,
        *,
        status: bool = True,
        logs: bool = False,
        tail: int | None = None,
        since_us: int | None = None,
        sources: list[str] = ...,
        min_level: str | None = None,
        resume_after: str | None = None,
        stop_on_terminal: bool = False,
        timeout: float | None = None,
    ) -> EventWatchHandle: ...
    def routing_stats(self) -> RoutingStatsDict: ...

class ConfigSessionStatsDict(TypedDict):
    mode: str | None
    applied: int
    rejected: int
    duplicates: int
    updates_received: int
    last_update_id: int
    config_revision: int
    polls: int
    sessions_accepted: int
    redirects: int
    session_id: str | None
    served_by: str | None

# (id, encoded GetSandboxConfigResponse, encoded GetSandboxProviderEnvironmentResponse,
# mode "push" | "poll").
PendingUpdate = tuple[int, bytes, bytes, str]

class NativeConfigSession:
    def __init__(
        self,
        endpoint: str,
        sandbox_id: str,
        sandbox_token: str,
        *,
        poll_interval: float | None = None,
        announce_push: bool = True,
        instance_id: str | None = None,
        ca_pem: bytes | None = None,
        tls_server_name: str | None = None,
        connect_timeout: float | None = None,
        allow_cleartext_token: bool = False,
    ) -> None: ...
    def start(self) -> None: ...
    def next_update(self) -> Awaitable[PendingUpdate | None]: ...
    def ack(self, id: int, applied: bool, reason: str | None = None) -> bool: ...
    def stats(self) -> ConfigSessionStatsDict: ...
    @property
    def instance_id(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...

class HostSessionStatsDict(TypedDict):
    sessions_accepted: int
    redirects: int
    sticky_redials: int
    fallbacks: int
    stay: bool
    session_id: str | None
    served_by: str | None
    assigned: int

# (id, sandbox id, encoded GetSandboxConfigResponse,
# encoded GetSandboxProviderEnvironmentResponse).
PendingHostUpdate = tuple[int, str, bytes, bytes]

class NativeHostSession:
    def __init__(
        self,
        endpoint: str,
        member_id: str,
        host_token: str,
        *,
        capacity: int = 0,
        config_push: bool = True,
        instance_id: str | None = None,
        ca_pem: bytes | None = None,
        tls_server_name: str | None = None,
        connect_timeout: float | None = None,
        allow_cleartext_token: bool = False,
    ) -> None: ...
    def start(self) -> None: ...
    def next_update(self) -> Awaitable[PendingHostUpdate | None]: ...
    def ack(self, id: int, applied: bool, reason: str | None = None) -> bool: ...
    def stats(self) -> HostSessionStatsDict: ...
    @property
    def member_id(self) -> str: ...
    @property
    def instance_id(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...

class NativeLocalCluster:
    @staticmethod
    def start(
        *,
        replicas: int,
        hosts: int,
        config_delivery: str,
        isolation: str,
        restart_crashed: bool,
        gateway_bin: str | None,
        blocking: bool,
    ) -> Awaitable[NativeLocalCluster]: ...
    @property
    def endpoint(self) -> str: ...
    @property
    def data_dir(self) -> str: ...
    @property
    def replica_ids(self) -> list[str]: ...
    @property
    def host_ids(self) -> list[str]: ...
    def owner_of(self, sandbox: str) -> Awaitable[str | None]: ...
    def stop_replica(self, id: str) -> Awaitable[None]: ...
    def kill_replica(self, id: str) -> Awaitable[None]: ...
    def start_replica(self, id: str) -> Awaitable[None]: ...
    def cut_route(self, id: str) -> Awaitable[None]: ...
    def restore_route(self, id: str) -> Awaitable[None]: ...
    def kill_host(self, id: str) -> Awaitable[None]: ...
    def start_host(self, id: str) -> Awaitable[None]: ...
    def restart_edge(self) -> Awaitable[None]: ...
    def set_store(self, delay_ms: int, cut: bool) -> Awaitable[None]: ...
    def close(self) -> Awaitable[None]: ...

def runtime_info() -> RuntimeInfo: ...
def _shutdown_runtime() -> None: ...
