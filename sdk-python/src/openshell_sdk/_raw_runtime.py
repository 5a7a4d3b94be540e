"""What the generated raw stubs (``raw.py``, ``raw_sync.py``) are built on.

A stub encodes its request with protobuf, calls the native raw boundary by
method path (so the core applies deadlines, auth and owner routing) and
decodes the answer into the response type.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from google.protobuf.message import Message

from ._blocking import run

if TYPE_CHECKING:
    from . import _native

__all__ = [
    "BidiStream",
    "MetadataLike",
    "MethodInfo",
    "RawResponse",
    "RawStubBase",
    "ServerStream",
    "SyncBidiStream",
    "SyncServerStream",
]

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)
M = TypeVar("M", bound=Message)

MetadataLike = Sequence[tuple[str, str]]
"""Request metadata: ``(key, value)`` pairs; keys are lowercase ASCII."""


@dataclass(frozen=True)
class MethodInfo:
    """One RPC of the service, from the generated method table."""

    name: str
    path: str
    kind: Literal["unary", "server_streaming", "client_streaming", "bidi_streaming"]
    owner_routed_field: str | None


@dataclass(frozen=True)
class RawResponse(Generic[M]):
    """A unary answer with its response metadata."""

    message: M
    metadata: tuple[tuple[str, str], ...]

    def get(self, key: str) -> str | None:
        """First value of a metadata key."""
        for k, v in self.metadata:
            if k == key:
                return v
        return None

    @property
    def served_by(self) -> str | None:
        """The gateway replica that answered (``x-openshell-served-by``)."""
        return self.get("x-openshell-served-by")


def _pairs(metadata: MetadataLike) -> list[tuple[str, str]]:
    return [(str(k), str(v)) for k, v in metadata]


class RawStubBase:
    """Calls the native raw boundary; the generated ``AsyncRaw`` adds one method per RPC."""

    def __init__(self, native: _native.NativeClient) -> None:
        self._native = native

    async def _unary(
        self,
        path: str,
        request: Message,
        response_type: type[M],
        metadata: MetadataLike,
        timeout: float | None,
    ) -> RawResponse[M]:
        data, response_metadata = await self._native.raw_unary(
            path, request.SerializeToString(), metadata=_pairs(metadata), timeout=timeout
        )
        return RawResponse(response_type.FromString(data), tuple(response_metadata))

    def _server_stream(
        self,
        path: str,
        request: Message,
        response_type: type[M],
        metadata: MetadataLike,
        timeout: float | None,
    ) -> ServerStream[M]:
        return ServerStream(self._native, path, request, response_type, metadata, timeout)

    def _bidi_stream(
        self,
        path: str,
        response_type: type[Resp],
        metadata: MetadataLike,
        timeout: float | None,
    ) -> BidiStream[Any, Resp]:
        return BidiStream(self._native, path, response_type, metadata, timeout)


class _StreamCore(Generic[Resp]):
    """Opens the native stream on first use and decodes what it receives."""

    def __init__(
        self,
        native: _native.NativeClient,
        path: str,
        response_type: type[Resp],
        metadata: MetadataLike,
        timeout: float | None,
    ) -> None:
        self._native = native
        self._path = path
        self._response_type = response_type
        self._metadata = _pairs(metadata)
        self._timeout = timeout
        self._handle: _native.RawStreamHandle | None = None
        self._open_lock = asyncio.Lock()
        self._cancelled = False

    async def _open(self) -> _native.RawStreamHandle:
        if self._handle is not None:
            return self._handle
        async with self._open_lock:
            if self._handle is None:
                handle = await self._native.raw_stream(
                    self._path, metadata=self._metadata, timeout=self._timeout
                )
                self._handle = handle
                if self._cancelled:
                    handle.cancel()
                await self._opened(handle)
            return self._handle

    async def _opened(self, handle: _native.RawStreamHandle) -> None:
        """Called once, right after the native stream exists."""

    async def recv(self) -> Resp | None:
        """The next message, or ``None`` once the server ended the stream OK."""
        handle = await self._open()
        data = await handle.recv()
        return None if data is None else self._response_type.FromString(data)

    async def response_metadata(self) -> tuple[tuple[str, str], ...]:
        """Response headers; waits for them."""
        handle = await self._open()
        return tuple(await handle.response_metadata())

    @property
    def trailers(self) -> tuple[tuple[str, str], ...] | None:
        """Trailers once the stream ended OK."""
        if self._handle is None:
            return None
        trailers = self._handle.trailers()
        return None if trailers is None else tuple(trailers)

    def cancel(self) -> None:
        """Cancels the RPC. Idempotent."""
        self._cancelled = True
        if self._handle is not None:
            self._handle.cancel()

    def __aiter__(self) -> AsyncIterator[Resp]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Resp]:
        while True:
            message = await self.recv()
            if message is None:
                return
            yield message


class ServerStream(_StreamCore[Resp]):
    """A server-streaming call: iterate it (``async for``). Starts on first use."""

    def __init__(
        self,
        native: _native.NativeClient,
        path: str,
        request: Message,
        response_type: type[Resp],
        metadata: MetadataLike,
        timeout: float | None,
    ) -> None:
        super().__init__(native, path, response_type, metadata, timeout)
        self._request = request.SerializeToString()

    async def _opened(self, handle: _native.RawStreamHandle) -> None:
        await handle.send(self._request)

    async def __aenter__(self) -> ServerStream[Resp]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()


class BidiStream(_StreamCore[Resp], Generic[Req, Resp]):
    """A client- or bidi-streaming call: ``send``, ``close_send``, ``recv``/iterate.

    The call starts with the first ``send`` (owner routing reads the first message).
    """

    async def send(self, message: Req) -> None:
        """Sends one message; waits while the send queue is full."""
        handle = await self._open()
        await handle.send(message.SerializeToString())

    async def close_send(self) -> None:
        """Half-closes the call (no more messages). Idempotent."""
        handle = await self._open()
        handle.close_send()

    async def __aenter__(self) -> BidiStream[Req, Resp]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()


class _SyncOpen:
    """Opens a sync stream's native call once even when threads race to it
    (the async layer's lock needs a loop to wait on, so a sync stream takes
    this one first and the async lock is never contended)."""

    def __init__(self, stream: _StreamCore[Any]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def __call__(self) -> None:
        if self._stream._handle is None:
            with self._lock:
                run(self._stream._open())


class SyncServerStream(Generic[Resp]):
    """A server-streaming call for the sync client: a plain iterator."""

    def __init__(self, stream: ServerStream[Resp]) -> None:
        self._stream = stream
        self._open = _SyncOpen(stream)

    def recv(self) -> Resp | None:
        self._open()
        return run(self._stream.recv())

    def response_metadata(self) -> tuple[tuple[str, str], ...]:
        self._open()
        return run(self._stream.response_metadata())

    @property
    def trailers(self) -> tuple[tuple[str, str], ...] | None:
        return self._stream.trailers

    def cancel(self) -> None:
        self._stream.cancel()

    def __iter__(self) -> Iterator[Resp]:
        while True:
            message = self.recv()
            if message is None:
                return
            yield message

    def __enter__(self) -> SyncServerStream[Resp]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()


class SyncBidiStream(Generic[Req, Resp]):
    """A client- or bidi-streaming call for the sync client."""

    def __init__(self, stream: BidiStream[Req, Resp]) -> None:
        self._stream = stream
        self._open = _SyncOpen(stream)

    def send(self, message: Req) -> None:
        self._open()
        run(self._stream.send(message))

    def close_send(self) -> None:
        self._open()
        run(self._stream.close_send())

    def recv(self) -> Resp | None:
        self._open()
        return run(self._stream.recv())

    def response_metadata(self) -> tuple[tuple[str, str], ...]:
        self._open()
        return run(self._stream.response_metadata())

    @property
    def trailers(self) -> tuple[tuple[str, str], ...] | None:
        return self._stream.trailers

    def cancel(self) -> None:
        self._stream.cancel()

    def __iter__(self) -> Iterator[Resp]:
        while True:
            message = self.recv()
            if message is None:
                return
            yield message

    def __enter__(self) -> SyncBidiStream[Req, Resp]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()
