"""File transfer for both clients: paths go to the core (it reads and writes the
files, Python never holds them), bytes and file objects are streamed through the
core's upload and download streams chunk by chunk.

Progress: the core keeps the latest report of a transfer in a native
``ProgressChannel`` (it never takes the GIL). An async path transfer reads it
from a task on the caller's event loop; a blocking one has it delivered on the
calling thread while it waits; a stream transfer takes it between chunks. So the
callback always runs with the GIL, on the caller's own thread, at most about ten
times a second, and once at the end. An exception it raises cancels the transfer
(nothing is left half-written) and is raised by the call.

Every coroutine here awaits only native calls, so the sync client drives it to
its end in one step (:mod:`openshell_sdk._blocking`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator
from typing import IO, Any, Protocol, TypeAlias

from . import _native
from .errors import _invalid_config
from .types import TransferProgress, TransferSummary

__all__ = ["BinarySink", "BinarySource", "LocalPath", "ProgressCallback"]

LocalPath: TypeAlias = str | os.PathLike[str]
"""A path on this machine: the core reads or writes it."""


class _Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


class _Writable(Protocol):
    def write(self, data: bytes, /) -> Any: ...


BinarySource: TypeAlias = bytes | bytearray | memoryview | _Readable | IO[bytes]
"""Data to upload: bytes, or a binary file object (``open(..., "rb")``, ``io.BytesIO``)."""

BinarySink: TypeAlias = _Writable | IO[bytes]
"""Where a download goes: a writable binary file object."""

ProgressCallback: TypeAlias = Callable[[TransferProgress], object]
"""``progress(report)``, called with a :class:`TransferProgress`."""

# What crosses into the core per write of a stream upload.
STREAM_CHUNK = 1 << 20

_WireSummary: TypeAlias = tuple[int, int, int, int, int, int, int]
_WireProgress: TypeAlias = tuple[int, int, int, int, str]


def _is_path(value: object) -> bool:
    return isinstance(value, str | os.PathLike)


def _deliverer(progress: ProgressCallback) -> Callable[[_WireProgress], None]:
    def deliver(wire: _WireProgress) -> None:
        progress(TransferProgress(*wire))

    return deliver


def _report(
    channel: _native.ProgressChannel | None, deliver: Callable[[_WireProgress], None]
) -> None:
    if channel is not None and (wire := channel.take()) is not None:
        deliver(wire)


async def _pump(channel: _native.ProgressChannel, deliver: Callable[[_WireProgress], None]) -> None:
    while (wire := await channel.next()) is not None:
        deliver(wire)


async def path_transfer(
    native: _native.NativeClient,
    progress: ProgressCallback | None,
    start: Callable[[_native.ProgressChannel | None], Awaitable[_WireSummary]],
) -> TransferSummary:
    """A core transfer of paths, with its progress delivered (see the module docs)."""
    if progress is None:
        return TransferSummary(*await start(None))
    deliver = _deliverer(progress)
    channel = _native.ProgressChannel(deliver)
    if native.blocking:
        # The native call delivers on this thread while it waits.
        return TransferSummary(*await start(channel))
    transfer = asyncio.ensure_future(start(channel))
    pump = asyncio.ensure_future(_pump(channel, deliver))
    try:
        await asyncio.wait({transfer, pump}, return_when=asyncio.FIRST_COMPLETED)
        if pump.done():
            # The callback raised: the transfer is cancelled.
            transfer.cancel()
            pump.result()
        wire = await transfer
    except BaseException:
        transfer.cancel()
        pump.cancel()
        raise
    finally:
        channel.close()
    await pump  # the last report
    return TransferSummary(*wire)


def _chunks(source: BinarySource) -> Iterator[bytes]:
    if isinstance(source, bytes | bytearray | memoryview):
        view = memoryview(source).cast("B")
        for start in range(0, len(view), STREAM_CHUNK):
            yield bytes(view[start : start + STREAM_CHUNK])
        return
    read = getattr(source, "read", None)
    if not callable(read):
        raise TypeError(
            f"upload takes a path, bytes or a binary file object, not {type(source).__name__}"
        )
    while True:
        chunk = read(STREAM_CHUNK)
        if not chunk:
            return
        if not isinstance(chunk, bytes | bytearray | memoryview):
            raise TypeError(
                f"the file object's read() returned {type(chunk).__name__}, not bytes "
                "(open it in binary mode)"
            )
        yield bytes(chunk)


async def upload(
    native: _native.NativeClient,
    sandbox: str,
    local: LocalPath | BinarySource,
    remote: str,
    *,
    ignore_file: str | None,
    progress: ProgressCallback | None,
    timeout: float | None,
) -> TransferSummary:
    if _is_path(local):
        path = os.fspath(local)  # type: ignore[arg-type]
        return await path_transfer(
            native,
            progress,
            lambda channel: native.upload(
                sandbox,
                path,
                remote,
                ignore_file=ignore_file,
                progress=channel,
                timeout=timeout,
            ),
        )
    if ignore_file is not None:
        raise _invalid_config("ignore_file applies to uploads from a local path")
    chunks = _chunks(local)  # type: ignore[arg-type]
    deliver = _deliverer(progress) if progress is not None else _ignore
    channel = _native.ProgressChannel(deliver) if progress is not None else None
    sink = await native.upload_stream(sandbox, remote, progress=channel, timeout=timeout)
    try:
        for chunk in chunks:
            await sink.write(chunk)
            _report(channel, deliver)
        wire = await sink.finish()
    except BaseException:
        sink.abort()
        raise
    _report(channel, deliver)
    return TransferSummary(*wire)


def _ignore(_wire: _WireProgress) -> None:
    pass


async def download(
    native: _native.NativeClient,
    sandbox: str,
    remote: str,
    local: LocalPath | BinarySink,
    *,
    ignore_file: str | None,
    progress: ProgressCallback | None,
    timeout: float | None,
) -> TransferSummary:
    if _is_path(local):
        path = os.fspath(local)  # type: ignore[arg-type]
        return await path_transfer(
            native,
            progress,
            lambda channel: native.download(
                sandbox,
                remote,
                path,
                ignore_file=ignore_file,
                progress=channel,
                timeout=timeout,
            ),
        )
    write = getattr(local, "write", None)
    if not callable(write):
        raise TypeError(
            f"download takes a path or a writable binary file object, not {type(local).__name__}"
        )
    if ignore_file is not None:
        raise _invalid_config("ignore_file applies to downloads into a local path")
    deliver = _deliverer(progress) if progress is not None else _ignore
    channel = _native.ProgressChannel(deliver) if progress is not None else None
    source = await native.download_stream(sandbox, remote, progress=channel, timeout=timeout)
    moved = 0
    try:
        while (chunk := await source.next_chunk()) is not None:
            write(chunk)
            moved += len(chunk)
            _report(channel, deliver)
    except BaseException:
        source.close()
        raise
    _report(channel, deliver)
    return TransferSummary(
        files=1,
        directories=0,
        symlinks=0,
        skipped_symlinks=0,
        ignored=0,
        skipped_other=0,
        bytes=moved,
    )
