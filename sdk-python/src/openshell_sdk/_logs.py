"""Sandbox logs and the resuming watch (``client.sandboxes.logs`` / ``.events``).

The watch runs in the core: every event carries the gateway's cursor, and when
the stream breaks (a replica died, a connection dropped) the core opens a new
one after the last cursor it delivered, on whichever replica answers, so nothing
is lost and nothing repeats. Events cross from the core in batches.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import TypeAlias

from . import _native
from .errors import CallCancelledError, _invalid_config
from .types import LogEvent, LogLine, Logs, Sandbox, SandboxEvent, WatchEvent

__all__ = ["EventWatch", "Since", "Sources"]

Since: TypeAlias = datetime | timedelta
"""A point in time (a naive ``datetime`` is local time) or a span back from now."""

Sources: TypeAlias = str | Sequence[str]
"""``"gateway"``, ``"sandbox"``, or several."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def since_us(since: Since | None) -> int | None:
    """Microseconds since the epoch of ``since``."""
    if since is None:
        return None
    if isinstance(since, timedelta):
        if since < timedelta(0):
            raise _invalid_config("since, as a timedelta, is a span back from now: not negative")
        at = datetime.now(UTC) - since
    elif isinstance(since, datetime):
        at = since if since.tzinfo is not None else since.astimezone()
    else:
        raise TypeError(f"since is a datetime or a timedelta, not {type(since).__name__}")
    return (at - _EPOCH) // _MICROSECOND


def sources_list(sources: Sources | None) -> list[str]:
    if sources is None:
        return []
    if isinstance(sources, str):
        return [sources]
    return list(sources)


def tail_lines(tail: int | None) -> int | None:
    if tail is None:
        return None
    if isinstance(tail, bool) or not isinstance(tail, int) or not 0 <= tail <= 0xFFFF_FFFF:
        raise _invalid_config(f"tail is a number of lines (0 or more), not {tail!r}")
    return tail


async def logs(
    native: _native.NativeClient,
    name: str,
    *,
    tail: int | None,
    since: Since | None,
    sources: Sources | None,
    min_level: str | None,
    timeout: float | None,
) -> Logs:
    lines, buffer_total = await native.sandbox_logs(
        name,
        tail=tail_lines(tail),
        since_us=since_us(since),
        sources=sources_list(sources),
        min_level=min_level,
        timeout=timeout,
    )
    return Logs([LogLine._from_wire(line) for line in lines], buffer_total)


def _event(wire: _native.WireWatchEvent) -> WatchEvent:
    cursor, sandbox, line = wire
    if sandbox is not None:
        return SandboxEvent(Sandbox.from_bytes(sandbox), cursor)
    assert line is not None
    return LogEvent(LogLine._from_wire(line), cursor)


class EventWatch:
    """The events of one sandbox: ``async for event in watch``.

    Yields :class:`SandboxEvent` (status snapshots) and :class:`LogEvent` (log
    lines), each with its ``cursor``. The watch resumes by itself after a broken
    stream, from the last cursor, on whichever replica answers (:attr:`resumes`
    counts it): nothing is lost and nothing repeats. It ends (the iteration
    stops) when the gateway ends it (``stop_on_terminal``), or raises:
    :class:`~openshell_sdk.errors.OutOfRangeError` when the gateway no longer
    holds what followed the cursor, :class:`~openshell_sdk.errors.NotFoundError`
    when the sandbox was deleted. The stream opens when the iteration starts;
    leaving an ``async with`` block, or :meth:`close`, ends it.
    """

    def __init__(self, handle: _native.EventWatchHandle) -> None:
        self._handle = handle
        self._buffer: collections.deque[_native.WireWatchEvent] = collections.deque()
        self._ended = False
        self._closed = False
        self._cursor: str | None = None

    @property
    def cursor(self) -> str | None:
        """The cursor of the last event handed out: a new watch with
        ``resume_after=watch.cursor`` gets exactly the events that followed."""
        return self._cursor

    @property
    def resumes(self) -> int:
        """How many times the watch opened a new stream after a broken one."""
        return self._handle.resumes

    @property
    def closed(self) -> bool:
        return self._closed

    async def next_event(self) -> WatchEvent | None:
        """The next event, or ``None`` once the watch ended or was closed."""
        while not self._buffer:
            if self._ended or self._closed:
                return None
            try:
                batch = await self._handle.next_batch()
            except CallCancelledError:
                if self._closed:
                    return None
                raise
            if not batch:
                self._ended = True
                return None
            self._buffer.extend(batch)
        if self._closed:
            return None
        wire = self._buffer.popleft()
        self._cursor = wire[0]
        return _event(wire)

    def __aiter__(self) -> EventWatch:
        return self

    async def __anext__(self) -> WatchEvent:
        event = await self.next_event()
        if event is None:
            raise StopAsyncIteration
        return event

    def close(self) -> None:
        """Ends the watch (the iteration stops). Idempotent."""
        self._closed = True
        self._buffer.clear()
        self._handle.cancel()

    cancel = close

    async def __aenter__(self) -> EventWatch:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EventWatch(cursor={self._cursor!r}, resumes={self.resumes})"
