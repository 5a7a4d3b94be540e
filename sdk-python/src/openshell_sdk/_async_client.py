"""The asyncio API: :class:`AsyncClient` and the handles of its operations."""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeAlias

from . import _files, _logs, _native
from . import errors as _errors
from ._exec import ExecStream, InteractiveExec, _exec_args
from ._files import BinarySink, BinarySource, LocalPath, ProgressCallback
from ._logs import EventWatch, Since, Sources
from ._proto.openshell_pb2 import SandboxResponse as _SandboxResponse
from .raw import AsyncRaw
from .types import (
    DeletionOutcome,
    ExecResult,
    ForwardStats,
    Health,
    Logs,
    RoutingStats,
    Sandbox,
    ServiceStatus,
    SshSession,
    TransferSummary,
)

__all__ = [
    "AsyncClient",
    "AsyncSandboxes",
    "EventWatch",
    "ExecStream",
    "Forward",
    "InteractiveExec",
    "SandboxWatch",
    "TokenProvider",
]

TokenAnswer: TypeAlias = str | tuple[str, float | None]
TokenProvider: TypeAlias = Callable[[bool], TokenAnswer | Awaitable[TokenAnswer]]
"""``provider(force_refresh)`` returns a token, or ``(token, expires_in_seconds)``.

It may be ``async``. The core calls it when it needs a token: once, then again
when the token expires or the gateway answers ``UNAUTHENTICATED``
(``force_refresh=True``), never twice at the same time.
"""

_UNSET: Any = object()


def _adapt_provider(
    provider: TokenProvider, loop_of_client: Callable[[], asyncio.AbstractEventLoop | None]
) -> Callable[[bool], TokenAnswer]:
    """The native module calls providers on a worker thread and wants an answer:
    an async provider runs on the client's loop (or a private one if there is none)."""

    def call(force_refresh: bool) -> TokenAnswer:
        answer = provider(force_refresh)
        if not inspect.isawaitable(answer):
            return answer

        async def wait() -> TokenAnswer:
            return await answer

        loop = loop_of_client()
        if loop is None or loop.is_closed() or not loop.is_running():
            return asyncio.run(wait())
        return asyncio.run_coroutine_threadsafe(wait(), loop).result(timeout=120)

    return call


class Forward:
    """A running port forward. The listener and its byte pumps run in the core.

    Connect to :attr:`local_address`; each connection reaches ``remote_port`` on
    loopback inside the sandbox's host. Use it as a context manager (sync or
    async) or call :meth:`close`.
    """

    def __init__(self, handle: _native.NativeForward) -> None:
        self._handle = handle

    @property
    def local_address(self) -> tuple[str, int]:
        """``(host, port)`` of the local listener."""
        return self._handle.local_address

    @property
    def host(self) -> str:
        return self._handle.local_address[0]

    @property
    def port(self) -> int:
        return self._handle.local_address[1]

    @property
    def sandbox(self) -> str:
        return self._handle.sandbox

    @property
    def remote_port(self) -> int:
        return self._handle.remote_port

    @property
    def closed(self) -> bool:
        return self._handle.closed

    def stats(self) -> ForwardStats:
        """Counters: connections and bytes."""
        return ForwardStats(**self._handle.stats())

    def close(self) -> None:
        """Stops listening and ends every connection. Idempotent; returns at once."""
        self._handle.close()

    async def wait_closed(self) -> None:
        """Waits until every connection has ended (after :meth:`close`)."""
        await self._handle.wait_closed()

    def __enter__(self) -> Forward:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Forward:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
        await self.wait_closed()

    def __repr__(self) -> str:
        host, port = self.local_address
        return f"Forward({host}:{port} -> {self.sandbox}:{self.remote_port})"


class SandboxWatch:
    """Snapshots of one sandbox: the current state, then every change."""

    def __init__(self, start: Callable[[], Awaitable[_native.WatchHandle]]) -> None:
        self._start = start
        self._handle: _native.WatchHandle | None = None
        self._cancelled = False

    def __aiter__(self) -> SandboxWatch:
        return self

    async def __anext__(self) -> Sandbox:
        if self._handle is None:
            self._handle = await self._start()
            if self._cancelled:
                self._handle.cancel()
        data = await self._handle.next()
        if data is None:
            raise StopAsyncIteration
        return Sandbox.from_bytes(data)

    def cancel(self) -> None:
        """Ends the watch."""
        self._cancelled = True
        if self._handle is not None:
            self._handle.cancel()

    async def __aenter__(self) -> SandboxWatch:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()


class AsyncSandboxes:
    """Sandbox lifecycle calls; get it as ``client.sandboxes``."""

    def __init__(self, native: _native.NativeClient) -> None:
        self._native = native

    async def create(
        self,
        name: str | None = None,
        *,
        image: str | None = None,
        env: Mapping[str, str] | None = None,
        command: Sequence[str] | None = None,
        labels: Mapping[str, str] | None = None,
        tty: bool = False,
        timeout: float | None = None,
    ) -> Sandbox:
        """Creates a sandbox (usually PROVISIONING); pair with :meth:`wait_ready`.

        Without a name the gateway generates one.
        """
        data = await self._native.create_sandbox(
            name=name,
            image=image,
            environment=dict(env) if env else None,
            command=list(command) if command is not None else None,
            labels=dict(labels) if labels else None,
            tty=tty,
            timeout=timeout,
        )
        return Sandbox.from_bytes(data)

    async def get(self, name: str, *, timeout: float | None = None) -> Sandbox:
        """Gets a sandbox by name (:class:`~openshell_sdk.errors.NotFoundError` if none)."""
        response = await self._native.get_sandbox(name, timeout=timeout)
        return Sandbox.from_proto(_SandboxResponse.FromString(response).sandbox)

    async def list(
        self,
        *,
        label_selector: str | None = None,
        page_size: int | None = None,
        timeout: float | None = None,
    ) -> list[Sandbox]:
        """Every sandbox (all pages), optionally filtered by ``"k=v,k2=v2"`` labels."""
        pages = await self._native.list_sandboxes(
            label_selector=label_selector, page_size=page_size, timeout=timeout
        )
        return [Sandbox.from_bytes(data) for data in pages]

    async def delete(self, name: str, *, timeout: float | None = None) -> DeletionOutcome:
        """Deletes a sandbox; pair with :meth:`wait_deleted`."""
        return DeletionOutcome(await self._native.delete_sandbox(name, timeout=timeout))

    async def wait_ready(self, name: str, *, timeout: float | None = None) -> Sandbox:
        """Waits until READY (:class:`~openshell_sdk.errors.FailedPreconditionError` if
        it reaches ERROR). ``timeout`` defaults to the client's."""
        return Sandbox.from_bytes(await self._native.wait_ready(name, timeout=timeout))

    async def wait_deleted(self, name: str, *, timeout: float | None = None) -> None:
        """Waits until the sandbox no longer exists."""
        await self._native.wait_deleted(name, timeout=timeout)

    def watch(self, name: str, *, timeout: float | None = None) -> SandboxWatch:
        """``async for sandbox in client.sandboxes.watch(name)``: snapshots as they change."""
        return SandboxWatch(lambda: self._native.watch(name, timeout=timeout))

    async def logs(
        self,
        name: str,
        *,
        tail: int | None = None,
        since: Since | None = None,
        sources: Sources | None = None,
        min_level: str | None = None,
        timeout: float | None = None,
    ) -> Logs:
        """The log lines the gateway recorded about the sandbox (its own and its
        supervisor's), oldest first: every line by default (the newest 2000).

        ``tail``: only the newest that many (of those that match); ``since``: only
        lines written at or after a ``datetime``, or within a ``timedelta`` back
        from now; ``sources``: ``"gateway"``, ``"sandbox"`` or both; ``min_level``:
        ``TRACE``, ``DEBUG``, ``INFO``, ``WARN`` or ``ERROR`` and above (another
        word is :class:`~openshell_sdk.errors.InvalidArgumentError`)."""
        return await _logs.logs(
            self._native,
            name,
            tail=tail,
            since=since,
            sources=sources,
            min_level=min_level,
            timeout=timeout,
        )

    def events(
        self,
        name: str,
        *,
        status: bool = True,
        logs: bool = False,
        tail: int | None = None,
        since: Since | None = None,
        sources: Sources | None = None,
        min_level: str | None = None,
        resume_after: str | None = None,
        stop_on_terminal: bool = False,
        timeout: float | None = None,
    ) -> EventWatch:
        """Follows the sandbox: ``async for event in client.sandboxes.events(name)``.

        ``status`` follows its snapshots (:class:`SandboxEvent`; without a cursor
        the first is the current state), ``logs`` its log lines
        (:class:`LogEvent`, filtered by ``since``, ``sources`` and ``min_level``;
        without a cursor the newest ``tail`` lines, 200 by default, come first).
        ``resume_after`` (an event's ``cursor``) starts after that event: no
        snapshot first, exactly the events that came later. ``stop_on_terminal``
        ends the watch once the sandbox is READY, COMPLETED, STOPPED or in ERROR.
        ``tail``, ``since``, ``sources`` or ``min_level`` without ``logs=True``
        is :class:`~openshell_sdk.errors.InvalidConfigError`, before any I/O.
        The watch resumes by itself after a broken stream; see
        :class:`EventWatch` for how it ends. ``timeout`` (none by default)
        bounds the whole watch."""
        if not (status or logs):
            raise _errors._invalid_config("a watch follows status, logs or both")
        if not logs and any(f is not None for f in (tail, since, sources, min_level)):
            raise _errors._invalid_config(
                "tail, since, sources and min_level filter log lines: set logs=True"
            )
        handle = self._native.sandbox_events(
            name,
            status=status,
            logs=logs,
            tail=_logs.tail_lines(tail),
            since_us=_logs.since_us(since),
            sources=_logs.sources_list(sources),
            min_level=min_level,
            resume_after=resume_after,
            stop_on_terminal=stop_on_terminal,
            timeout=timeout,
        )
        return EventWatch(handle)


class AsyncClient:
    """The OpenShell client for asyncio.

    ::

        async with AsyncClient("http://127.0.0.1:17670") as client:
            sandbox = await client.sandboxes.create(image="alpine:3")
            await client.sandboxes.wait_ready(sandbox.name)
            result = await client.exec(sandbox.name, ["echo", "hello"])

    No I/O happens in the constructor (use :meth:`connect` to connect eagerly).
    ``timeout`` is the default deadline of unary calls and ``wait_*`` (``None``:
    no default); streams only get a deadline when a call sets one. Every call
    takes ``timeout=`` in seconds. Cancelling the task that awaits a call
    cancels the call.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        token: str | None = None,
        token_provider: TokenProvider | None = None,
        ca_pem: bytes | str | None = None,
        tls_server_name: str | None = None,
        connect_timeout: float | None = None,
        timeout: float | None = _UNSET,
        exec_output_limit: int | None = None,
        allow_cleartext_token: bool = False,
        _provider_loop: Callable[[], asyncio.AbstractEventLoop | None] | None = None,
        _blocking: bool = False,
    ) -> None:
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        provider = None
        if token_provider is not None:
            provider = _adapt_provider(token_provider, _provider_loop or (lambda: self._loop))
        self._native = _native.NativeClient(
            endpoint,
            token=token,
            token_provider=provider,
            ca_pem=ca_pem.encode() if isinstance(ca_pem, str) else ca_pem,
            tls_server_name=tls_server_name,
            connect_timeout=connect_timeout,
            default_timeout=None if timeout is _UNSET else timeout,
            no_default_timeout=timeout is None,
            exec_output_limit=exec_output_limit,
            allow_cleartext_token=allow_cleartext_token,
            blocking=_blocking,
        )
        self.sandboxes = AsyncSandboxes(self._native)
        self.raw = AsyncRaw(self._native)

    @classmethod
    async def connect(cls, endpoint: str, **options: Any) -> AsyncClient:
        """A client that is connected (fails with ``connect`` or ``tls`` if it cannot)."""
        client = cls(endpoint, **options)
        await client._connect()
        return client

    async def _connect(self) -> None:
        await self._native.connect()

    @classmethod
    def from_env(cls, **options: Any) -> AsyncClient:
        """A client for ``$OPENSHELL_ENDPOINT`` with ``$OPENSHELL_TOKEN`` (if set)."""
        endpoint = os.environ.get("OPENSHELL_ENDPOINT", "http://127.0.0.1:17670")
        options.setdefault("token", os.environ.get("OPENSHELL_TOKEN") or None)
        return cls(endpoint, **options)

    @property
    def endpoint(self) -> str:
        return self._native.endpoint

    async def health(self, *, timeout: float | None = None) -> Health:
        """Liveness of the replica that answers."""
        status, version, served_by = await self._native.health(timeout=timeout)
        return Health(ServiceStatus(status), version, served_by)

    async def exec(
        self,
        sandbox: str,
        command: Sequence[str],
        *,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        tty: bool = False,
        cols: int = 0,
        rows: int = 0,
        exec_timeout: float | None = None,
        output_limit: int | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """Runs ``command`` (argv, no shell) and returns its output and exit code.

        Output is collected in the core up to ``output_limit`` bytes (stdout and
        stderr together; the client's cap by default), past which the call fails
        with ``output_limit``. ``exec_timeout`` is enforced by the gateway (exit
        code 124); ``timeout`` bounds the whole call.
        """
        args = _exec_args(
            sandbox,
            command,
            workdir=workdir,
            env=env,
            stdin=stdin,
            tty=tty,
            cols=cols,
            rows=rows,
            exec_timeout=exec_timeout,
            output_limit=output_limit,
        )
        stdout, stderr, exit_code = await self._native.exec(args, timeout=timeout)
        return ExecResult(stdout, stderr, exit_code)

    def exec_stream(
        self,
        sandbox: str,
        command: Sequence[str],
        *,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        tty: bool = False,
        cols: int = 0,
        rows: int = 0,
        exec_timeout: float | None = None,
        output_limit: int | None = None,
        timeout: float | None = None,
    ) -> ExecStream:
        """Runs ``command`` and streams its events (see :class:`ExecStream`).

        ``output_limit`` caps what :meth:`ExecStream.collect` gathers (the
        client's cap by default); iterating events is not capped."""
        args = _exec_args(
            sandbox,
            command,
            workdir=workdir,
            env=env,
            stdin=stdin,
            tty=tty,
            cols=cols,
            rows=rows,
            exec_timeout=exec_timeout,
            output_limit=output_limit,
        )
        return ExecStream(lambda: self._native.exec_stream(args, timeout=timeout))

    async def exec_interactive(
        self,
        sandbox: str,
        command: Sequence[str],
        *,
        tty: bool = False,
        cols: int = 80,
        rows: int = 24,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        exec_timeout: float | None = None,
        output_limit: int | None = None,
        timeout: float | None = None,
    ) -> InteractiveExec:
        """Starts ``command`` with an input side; ``tty=True`` runs it under a terminal
        of ``cols`` x ``rows``. ``stdin``, if given, is written first.
        ``output_limit`` caps what :meth:`InteractiveExec.wait` gathers."""
        args = _exec_args(
            sandbox,
            command,
            workdir=workdir,
            env=env,
            stdin=stdin,
            tty=tty,
            cols=cols if tty else 0,
            rows=rows if tty else 0,
            exec_timeout=exec_timeout,
            output_limit=output_limit,
        )
        return InteractiveExec(await self._native.exec_interactive(args, timeout=timeout))

    async def forward(
        self,
        sandbox: str,
        remote_port: int,
        *,
        local_address: str = "127.0.0.1:0",
        ssh_session_token: str | None = None,
        timeout: float | None = None,
    ) -> Forward:
        """Listens on ``local_address`` and forwards every connection to
        ``remote_port`` on loopback inside the sandbox's host.

        With ``ssh_session_token`` (:attr:`SshSession.token`) every connection's
        stream carries it: a client without a user token can then forward to
        that token's sandbox, and to no other. The gateway checks it per
        connection, so a refused one (wrong sandbox, revoked or expired token)
        is closed and counted in ``stats().connections_failed``.
        """
        return Forward(
            await self._native.forward(
                sandbox,
                remote_port,
                local_address=local_address,
                ssh_session_token=ssh_session_token,
                timeout=timeout,
            )
        )

    async def create_ssh_session(self, sandbox: str, *, timeout: float | None = None) -> SshSession:
        """Issues an SSH session token for ``sandbox`` (needs a user token).

        How long it lives is the gateway's setting (``expires_at``). The token
        is a secret: :class:`SshSession`'s ``repr`` leaves it out.
        """
        (
            sandbox_id,
            token,
            fingerprint,
            expires_at,
            host,
            port,
            scheme,
        ) = await self._native.create_ssh_session(sandbox, timeout=timeout)
        return SshSession(
            sandbox_id=sandbox_id,
            token=token,
            host_key_fingerprint=fingerprint,
            expires_at=None if expires_at is None else datetime.fromtimestamp(expires_at, UTC),
            gateway_host=host,
            gateway_port=port,
            gateway_scheme=scheme,
        )

    async def revoke_ssh_session(
        self, session: SshSession | str, *, timeout: float | None = None
    ) -> bool:
        """Revokes an SSH session (or its token): forwards can no longer open
        with it. ``True`` when it was live; an unknown, expired or already
        revoked token is ``False``, not an error."""
        token = session.token if isinstance(session, SshSession) else session
        return await self._native.revoke_ssh_session(token, timeout=timeout)

    async def upload(
        self,
        sandbox: str,
        local: LocalPath | BinarySource,
        remote: str,
        *,
        ignore_file: str | None = None,
        progress: ProgressCallback | None = None,
        timeout: float | None = None,
    ) -> TransferSummary:
        """Uploads ``local`` to ``remote`` in the sandbox.

        ``local`` is a path (``str`` or ``os.PathLike``: a file, or a directory
        with everything in it; the core reads it, in chunks, keeping modes and
        mtimes; symlinks whose target leaves the tree are skipped), or the data
        itself: ``bytes`` or a binary file object (``read()`` in chunks of 1 MiB,
        streamed; the file gets mode 0644). Remote paths are relative to the
        sandbox's working directory, and absolute ones must lie inside it. When
        ``remote`` is an existing directory, a path upload goes inside it under
        its own name (as ``scp`` does). Every file is written under a temp name
        and renamed into place: a failed or cancelled upload leaves nothing
        half-written. ``ignore_file`` (for example ``".gitignore"``) names ignore
        files honoured in every directory. ``progress`` is called with a
        :class:`TransferProgress` on this thread, at most about ten times a
        second and once at the end; an exception it raises cancels the upload.
        Errors name the path: ``not_found``, ``invalid_argument`` (outside the
        working directory), ``failed_precondition`` (a directory where a file is
        expected or the reverse), ``permission_denied``, ``resource_exhausted``
        (no space). ``timeout`` (none by default) bounds the whole transfer.
        """
        return await _files.upload(
            self._native,
            sandbox,
            local,
            remote,
            ignore_file=ignore_file,
            progress=progress,
            timeout=timeout,
        )

    async def download(
        self,
        sandbox: str,
        remote: str,
        local: LocalPath | BinarySink,
        *,
        ignore_file: str | None = None,
        progress: ProgressCallback | None = None,
        timeout: float | None = None,
    ) -> TransferSummary:
        """Downloads ``remote`` (a file or a directory) from the sandbox.

        ``local`` is a path (the core writes it: a temp name renamed into place,
        modes and mtimes kept; an existing directory receives ``remote`` under
        its own name) or a writable binary file object, which gets the file's
        bytes chunk by chunk (a remote directory is then
        :class:`~openshell_sdk.errors.FailedPreconditionError`). ``ignore_file``,
        ``progress``, ``timeout`` and the errors are as for :meth:`upload`."""
        return await _files.download(
            self._native,
            sandbox,
            remote,
            local,
            ignore_file=ignore_file,
            progress=progress,
            timeout=timeout,
        )

    async def read_file(self, sandbox: str, remote: str, *, timeout: float | None = None) -> bytes:
        """The whole content of the file ``remote``: at most 64 MiB (larger is
        :class:`~openshell_sdk.errors.FailedPreconditionError`: use
        :meth:`download`)."""
        return await self._native.read_file(sandbox, remote, timeout=timeout)

    async def write_file(
        self,
        sandbox: str,
        remote: str,
        data: bytes | bytearray | memoryview | str,
        *,
        timeout: float | None = None,
    ) -> TransferSummary:
        """Writes ``data`` (``str`` as UTF-8) as the file ``remote`` (mode 0644),
        replacing any file there atomically."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        return TransferSummary(
            *await self._native.write_file(sandbox, remote, payload, timeout=timeout)
        )

    def routing_stats(self) -> RoutingStats:
        """Owner-routing counters of this client (hinted, unhinted, unrouted
        retries, owner lookups, cache hits)."""
        return RoutingStats(**self._native.routing_stats())

    async def close(self) -> None:
        """Cancels every call, stream and forward of this client. Idempotent."""
        self._native.close()

    @property
    def closed(self) -> bool:
        return self._native.closed

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncClient({self.endpoint!r})"
