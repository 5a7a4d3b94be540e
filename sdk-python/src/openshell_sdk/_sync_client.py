"""The blocking API: :class:`Client`, the same operations as :class:`AsyncClient`.

The client's native calls wait on the calling thread with the GIL released
(other Python threads keep running), and the async implementation's
coroutines are driven to their end right there (:mod:`openshell_sdk._blocking`):
no event loop and no thread hop. Ctrl-C while waiting raises
``KeyboardInterrupt`` and cancels the call.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

from ._async_client import (
    _UNSET,
    AsyncClient,
    AsyncSandboxes,
    ExecStream,
    Forward,
    InteractiveExec,
    SandboxWatch,
    TokenProvider,
)
from ._blocking import run
from ._files import BinarySink, BinarySource, LocalPath, ProgressCallback
from ._logs import EventWatch, Since, Sources
from .raw_sync import SyncRaw
from .types import (
    DeletionOutcome,
    ExecEvent,
    ExecResult,
    Health,
    Logs,
    RoutingStats,
    Sandbox,
    SshSession,
    TransferSummary,
    WatchEvent,
)

__all__ = [
    "Client",
    "Sandboxes",
    "SyncEventWatch",
    "SyncExecStream",
    "SyncForward",
    "SyncInteractiveExec",
    "SyncSandboxWatch",
]


class SyncExecStream:
    """The events of a running command: ``for event in stream``; ends with ``ExecExit``."""

    def __init__(self, stream: ExecStream) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[ExecEvent]:
        while True:
            event = run(self._stream.next_event())
            if event is None:
                return
            yield event

    @property
    def exit_code(self) -> int | None:
        return self._stream.exit_code

    def collect(self) -> ExecResult:
        """Reads the rest of the stream into an :class:`ExecResult` (collected by
        the core under ``output_limit``; see :meth:`ExecStream.collect`)."""
        return run(self._stream.collect())

    def cancel(self) -> None:
        self._stream.cancel()

    def __enter__(self) -> SyncExecStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._stream.finished:
            self.cancel()


class SyncInteractiveExec:
    """A running interactive command (see :class:`InteractiveExec`)."""

    def __init__(self, interactive: InteractiveExec) -> None:
        self._interactive = interactive

    def write(self, data: bytes | str) -> None:
        run(self._interactive.write(data))

    def resize(self, cols: int, rows: int) -> None:
        run(self._interactive.resize(cols, rows))

    def close_stdin(self) -> None:
        """Closes stdin (EOF). Idempotent."""
        run(self._interactive.close_stdin())

    def cancel(self) -> None:
        self._interactive.cancel()

    def next_event(self) -> ExecEvent | None:
        """The next event, or ``None`` after the exit event."""
        return run(self._interactive.next_event())

    def __iter__(self) -> Iterator[ExecEvent]:
        while True:
            event = self.next_event()
            if event is None:
                return
            yield event

    @property
    def exit_code(self) -> int | None:
        return self._interactive.exit_code

    def wait(self) -> ExecResult:
        """The rest of the output and the exit code (see :meth:`InteractiveExec.wait`)."""
        return run(self._interactive.wait())

    def __enter__(self) -> SyncInteractiveExec:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._interactive.finished:
            self.cancel()


class SyncForward(Forward):
    """A running port forward; ``with client.forward(...) as fwd:`` closes it on exit."""

    def __init__(self, forward: Forward) -> None:
        super().__init__(forward._handle)

    def wait_closed_sync(self) -> None:
        """Waits until every connection has ended (after :meth:`close`)."""
        run(self.wait_closed())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
        self.wait_closed_sync()


class SyncSandboxWatch:
    """Snapshots of one sandbox: ``for sandbox in watch``."""

    def __init__(self, watch: SandboxWatch) -> None:
        self._watch = watch

    def __iter__(self) -> Iterator[Sandbox]:
        while True:
            try:
                yield run(self._watch.__anext__())
            except StopAsyncIteration:
                return

    def cancel(self) -> None:
        self._watch.cancel()

    def __enter__(self) -> SyncSandboxWatch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()


class SyncEventWatch:
    """The events of one sandbox: ``for event in watch`` (see :class:`EventWatch`).

    Each step waits on this thread with the GIL released; Ctrl-C raises
    ``KeyboardInterrupt`` and the watch can be closed. ``with`` closes it.
    """

    def __init__(self, watch: EventWatch) -> None:
        self._watch = watch

    def __iter__(self) -> SyncEventWatch:
        return self

    def __next__(self) -> WatchEvent:
        event = run(self._watch.next_event())
        if event is None:
            raise StopIteration
        return event

    @property
    def cursor(self) -> str | None:
        """The cursor of the last event handed out (see :attr:`EventWatch.cursor`)."""
        return self._watch.cursor

    @property
    def resumes(self) -> int:
        """How many times the watch opened a new stream after a broken one."""
        return self._watch.resumes

    @property
    def closed(self) -> bool:
        return self._watch.closed

    def close(self) -> None:
        """Ends the watch. Idempotent."""
        self._watch.close()

    cancel = close

    def __enter__(self) -> SyncEventWatch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Sync{self._watch!r}"


class Sandboxes:
    """Sandbox lifecycle calls; get it as ``client.sandboxes``."""

    def __init__(self, sandboxes: AsyncSandboxes) -> None:
        self._async = sandboxes

    def create(
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
        return run(
            self._async.create(
                name,
                image=image,
                env=env,
                command=command,
                labels=labels,
                tty=tty,
                timeout=timeout,
            )
        )

    def get(self, name: str, *, timeout: float | None = None) -> Sandbox:
        return run(self._async.get(name, timeout=timeout))

    def list(
        self,
        *,
        label_selector: str | None = None,
        page_size: int | None = None,
        timeout: float | None = None,
    ) -> list[Sandbox]:
        return run(
            self._async.list(label_selector=label_selector, page_size=page_size, timeout=timeout)
        )

    def delete(self, name: str, *, timeout: float | None = None) -> DeletionOutcome:
        return run(self._async.delete(name, timeout=timeout))

    def wait_ready(self, name: str, *, timeout: float | None = None) -> Sandbox:
        return run(self._async.wait_ready(name, timeout=timeout))

    def wait_deleted(self, name: str, *, timeout: float | None = None) -> None:
        run(self._async.wait_deleted(name, timeout=timeout))

    def watch(self, name: str, *, timeout: float | None = None) -> SyncSandboxWatch:
        return SyncSandboxWatch(self._async.watch(name, timeout=timeout))

    def logs(
        self,
        name: str,
        *,
        tail: int | None = None,
        since: Since | None = None,
        sources: Sources | None = None,
        min_level: str | None = None,
        timeout: float | None = None,
    ) -> Logs:
        """The sandbox's recorded log lines, oldest first (see :meth:`AsyncSandboxes.logs`)."""
        return run(
            self._async.logs(
                name,
                tail=tail,
                since=since,
                sources=sources,
                min_level=min_level,
                timeout=timeout,
            )
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
    ) -> SyncEventWatch:
        """Follows the sandbox, resuming after breaks: ``for event in ...``
        (see :meth:`AsyncSandboxes.events`)."""
        return SyncEventWatch(
            self._async.events(
                name,
                status=status,
                logs=logs,
                tail=tail,
                since=since,
                sources=sources,
                min_level=min_level,
                resume_after=resume_after,
                stop_on_terminal=stop_on_terminal,
                timeout=timeout,
            )
        )


class Client:
    """The OpenShell client for blocking code; same options as :class:`AsyncClient`.

    ::

        with Client("http://127.0.0.1:17670") as client:
            sandbox = client.sandboxes.create(image="alpine:3")
            client.sandboxes.wait_ready(sandbox.name)
            print(client.exec(sandbox.name, ["echo", "hello"]).stdout_text)
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
    ) -> None:
        self._async = AsyncClient(
            endpoint,
            token=token,
            token_provider=token_provider,
            ca_pem=ca_pem,
            tls_server_name=tls_server_name,
            connect_timeout=connect_timeout,
            timeout=timeout,
            exec_output_limit=exec_output_limit,
            allow_cleartext_token=allow_cleartext_token,
            # An async provider runs on a loop of its own (asyncio.run) on
            # the thread the core calls it from.
            _provider_loop=lambda: None,
            _blocking=True,
        )
        self.sandboxes = Sandboxes(self._async.sandboxes)
        self.raw = SyncRaw(self._async.raw)

    @classmethod
    def connect(cls, endpoint: str, **options: Any) -> Client:
        """A client that is connected (fails with ``connect`` or ``tls`` if it cannot)."""
        client = cls(endpoint, **options)
        run(client._async._connect())
        return client

    @classmethod
    def from_env(cls, **options: Any) -> Client:
        """A client for ``$OPENSHELL_ENDPOINT`` with ``$OPENSHELL_TOKEN`` (if set)."""
        endpoint = os.environ.get("OPENSHELL_ENDPOINT", "http://127.0.0.1:17670")
        options.setdefault("token", os.environ.get("OPENSHELL_TOKEN") or None)
        return cls(endpoint, **options)

    @property
    def endpoint(self) -> str:
        return self._async.endpoint

    def health(self, *, timeout: float | None = None) -> Health:
        return run(self._async.health(timeout=timeout))

    def exec(
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
        """Runs ``command`` and returns its output and exit code (see ``AsyncClient.exec``)."""
        return run(
            self._async.exec(
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
                timeout=timeout,
            )
        )

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
    ) -> SyncExecStream:
        """Runs ``command`` and streams its events (``for event in stream``);
        ``output_limit`` caps :meth:`SyncExecStream.collect`."""
        stream = self._async.exec_stream(
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
            timeout=timeout,
        )
        return SyncExecStream(stream)

    def exec_interactive(
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
    ) -> SyncInteractiveExec:
        """Starts ``command`` with an input side (see ``AsyncClient.exec_interactive``)."""
        interactive = run(
            self._async.exec_interactive(
                sandbox,
                command,
                tty=tty,
                cols=cols,
                rows=rows,
                workdir=workdir,
                env=env,
                stdin=stdin,
                exec_timeout=exec_timeout,
                output_limit=output_limit,
                timeout=timeout,
            )
        )
        return SyncInteractiveExec(interactive)

    def forward(
        self,
        sandbox: str,
        remote_port: int,
        *,
        local_address: str = "127.0.0.1:0",
        ssh_session_token: str | None = None,
        timeout: float | None = None,
    ) -> SyncForward:
        """Listens on ``local_address`` and forwards connections into the sandbox's host
        (with ``ssh_session_token`` on every connection when given; see
        :meth:`AsyncClient.forward`)."""
        forward = run(
            self._async.forward(
                sandbox,
                remote_port,
                local_address=local_address,
                ssh_session_token=ssh_session_token,
                timeout=timeout,
            )
        )
        return SyncForward(forward)

    def create_ssh_session(self, sandbox: str, *, timeout: float | None = None) -> SshSession:
        """Issues an SSH session token for ``sandbox`` (see
        :meth:`AsyncClient.create_ssh_session`)."""
        return run(self._async.create_ssh_session(sandbox, timeout=timeout))

    def revoke_ssh_session(
        self, session: SshSession | str, *, timeout: float | None = None
    ) -> bool:
        """Revokes an SSH session (or its token); ``True`` when it was live."""
        return run(self._async.revoke_ssh_session(session, timeout=timeout))

    def upload(
        self,
        sandbox: str,
        local: LocalPath | BinarySource,
        remote: str,
        *,
        ignore_file: str | None = None,
        progress: ProgressCallback | None = None,
        timeout: float | None = None,
    ) -> TransferSummary:
        """Uploads a path (file or directory), bytes or a binary file object to
        ``remote`` (see :meth:`AsyncClient.upload`). ``progress`` is called on this
        thread while the call waits."""
        return run(
            self._async.upload(
                sandbox,
                local,
                remote,
                ignore_file=ignore_file,
                progress=progress,
                timeout=timeout,
            )
        )

    def download(
        self,
        sandbox: str,
        remote: str,
        local: LocalPath | BinarySink,
        *,
        ignore_file: str | None = None,
        progress: ProgressCallback | None = None,
        timeout: float | None = None,
    ) -> TransferSummary:
        """Downloads ``remote`` to a path or a writable binary file object (see
        :meth:`AsyncClient.download`)."""
        return run(
            self._async.download(
                sandbox,
                remote,
                local,
                ignore_file=ignore_file,
                progress=progress,
                timeout=timeout,
            )
        )

    def read_file(self, sandbox: str, remote: str, *, timeout: float | None = None) -> bytes:
        """The whole file ``remote`` (at most 64 MiB)."""
        return run(self._async.read_file(sandbox, remote, timeout=timeout))

    def write_file(
        self,
        sandbox: str,
        remote: str,
        data: bytes | bytearray | memoryview | str,
        *,
        timeout: float | None = None,
    ) -> TransferSummary:
        """Writes ``data`` as the file ``remote`` (mode 0644), atomically."""
        return run(self._async.write_file(sandbox, remote, data, timeout=timeout))

    def routing_stats(self) -> RoutingStats:
        return self._async.routing_stats()

    def close(self) -> None:
        """Cancels every call, stream and forward of this client. Idempotent."""
        self._async._native.close()

    @property
    def closed(self) -> bool:
        return self._async.closed

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.endpoint!r})"
