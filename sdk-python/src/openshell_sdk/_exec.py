"""Exec streams of the asyncio API: :class:`ExecStream` (output of a running
command) and :class:`InteractiveExec` (stdin, resizes and output), over the
native handles, with the argument checks every exec call shares."""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from . import _native
from .types import ExecEvent, ExecExit, ExecResult, ExecStderr, ExecStdout

__all__ = ["ExecStream", "InteractiveExec"]


def _exec_args(
    sandbox: str,
    command: Sequence[str],
    *,
    workdir: str | None,
    env: Mapping[str, str] | None,
    stdin: bytes | str | None,
    tty: bool,
    cols: int,
    rows: int,
    exec_timeout: float | None,
    output_limit: int | None,
) -> dict[str, Any]:
    if isinstance(command, str | bytes):
        raise TypeError("command is an argv list, for example ['sh', '-c', 'echo hi']")
    return {
        "sandbox": sandbox,
        "command": list(command),
        "workdir": workdir,
        "environment": dict(env or {}),
        "stdin": stdin.encode() if isinstance(stdin, str) else stdin,
        "tty": tty,
        "cols": cols,
        "rows": rows,
        "exec_timeout": exec_timeout,
        "output_limit": output_limit,
    }


def _event(kind: int, data: bytes, exit_code: int) -> ExecEvent:
    if kind == 1:
        return ExecStdout(data)
    if kind == 2:
        return ExecStderr(data)
    return ExecExit(exit_code)


def _wire(event: ExecEvent) -> tuple[int, bytes, int]:
    if isinstance(event, ExecStdout):
        return (1, event.data, 0)
    if isinstance(event, ExecStderr):
        return (2, event.data, 0)
    return (3, b"", event.exit_code)


class _EventSource:
    """Events of a native exec handle, fetched in batches."""

    def __init__(self) -> None:
        self._buffer: collections.deque[ExecEvent] = collections.deque()
        self._ended = False
        self.exit_code: int | None = None

    async def _fetch(self) -> list[tuple[int, bytes, int]]:
        raise NotImplementedError

    async def _native_collect(
        self, buffered: list[tuple[int, bytes, int]]
    ) -> tuple[bytes, bytes, int]:
        raise NotImplementedError

    async def _collect_rest(self) -> ExecResult:
        """The remaining output, collected by the core under the stream's cap
        (``output_limit`` past it, and the command is cancelled, as for
        buffered exec). Events fetched but not handed out yet count too."""
        if self.finished and self.exit_code is not None:
            return ExecResult(b"", b"", self.exit_code)
        buffered = [_wire(event) for event in self._buffer]
        self._buffer.clear()
        try:
            stdout, stderr, exit_code = await self._native_collect(buffered)
        finally:
            self._ended = True
        self.exit_code = exit_code
        return ExecResult(stdout, stderr, exit_code)

    async def next_event(self) -> ExecEvent | None:
        while not self._buffer:
            if self._ended:
                return None
            batch = await self._fetch()
            if not batch:
                self._ended = True
                return None
            self._buffer.extend(_event(*item) for item in batch)
        event = self._buffer.popleft()
        if isinstance(event, ExecExit):
            self.exit_code = event.exit_code
            self._ended = True
        return event

    @property
    def finished(self) -> bool:
        return self._ended and not self._buffer


class ExecStream(_EventSource):
    """The events of a running command: ``async for event in stream``.

    Yields :class:`ExecStdout` and :class:`ExecStderr` chunks, then exactly one
    :class:`ExecExit`, which ends the iteration. A stream that breaks raises
    instead. The command starts when the iteration does. Leaving an
    ``async with`` block (or :meth:`cancel`) cancels the call, and the gateway
    kills the process group.
    """

    def __init__(self, start: Callable[[], Awaitable[_native.ExecStreamHandle]]) -> None:
        super().__init__()
        self._start = start
        self._handle: _native.ExecStreamHandle | None = None
        self._cancelled = False

    async def _native_handle(self) -> _native.ExecStreamHandle:
        if self._handle is None:
            self._handle = await self._start()
            if self._cancelled:
                self._handle.cancel()
        return self._handle

    async def _fetch(self) -> list[tuple[int, bytes, int]]:
        handle = await self._native_handle()
        return await handle.next_batch()

    async def _native_collect(
        self, buffered: list[tuple[int, bytes, int]]
    ) -> tuple[bytes, bytes, int]:
        handle = await self._native_handle()
        return await handle.collect(buffered)

    def __aiter__(self) -> ExecStream:
        return self

    async def __anext__(self) -> ExecEvent:
        event = await self.next_event()
        if event is None:
            raise StopAsyncIteration
        return event

    async def collect(self) -> ExecResult:
        """Reads the rest of the stream into an :class:`ExecResult`.

        The core collects it, up to the stream's ``output_limit`` (stdout and
        stderr together; the client's cap by default). Past the cap this raises
        :class:`~openshell_sdk.errors.OutputLimitError` (code ``output_limit``)
        and the command is cancelled, as for buffered :meth:`AsyncClient.exec`.
        """
        return await self._collect_rest()

    def cancel(self) -> None:
        """Cancels the command's stream. Idempotent."""
        self._cancelled = True
        if self._handle is not None:
            self._handle.cancel()

    async def __aenter__(self) -> ExecStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.finished:
            self.cancel()


class InteractiveExec(_EventSource):
    """A running interactive command: stdin, terminal size and events.

    ``async for event in interactive`` yields output chunks and ends with the
    :class:`ExecExit` event. :meth:`close_stdin` sends EOF (Ctrl-D on a
    terminal). Leaving an ``async with`` block cancels the command if it is
    still running.
    """

    def __init__(self, handle: _native.InteractiveHandle) -> None:
        super().__init__()
        self._handle = handle

    async def _fetch(self) -> list[tuple[int, bytes, int]]:
        return await self._handle.next_batch()

    async def _native_collect(
        self, buffered: list[tuple[int, bytes, int]]
    ) -> tuple[bytes, bytes, int]:
        return await self._handle.collect(buffered)

    async def write(self, data: bytes | str) -> None:
        """Writes to the process's stdin."""
        await self._handle.write(data.encode() if isinstance(data, str) else data)

    async def resize(self, cols: int, rows: int) -> None:
        """Resizes the terminal."""
        await self._handle.resize(cols, rows)

    async def close_stdin(self) -> None:
        """Closes stdin: the process reads EOF. No write or resize can follow.
        Idempotent."""
        self._handle.close_stdin()

    def cancel(self) -> None:
        """Cancels the command's stream."""
        self._handle.cancel()

    def __aiter__(self) -> InteractiveExec:
        return self

    async def __anext__(self) -> ExecEvent:
        event = await self.next_event()
        if event is None:
            raise StopAsyncIteration
        return event

    async def wait(self) -> ExecResult:
        """Reads every remaining event; returns the output and exit code.

        Collected by the core under ``output_limit``, like
        :meth:`ExecStream.collect`: past it this raises
        :class:`~openshell_sdk.errors.OutputLimitError` and the command is
        cancelled."""
        return await self._collect_rest()

    async def __aenter__(self) -> InteractiveExec:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.finished:
            self.cancel()
