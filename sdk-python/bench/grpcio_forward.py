"""A port forward over ``ForwardTcp`` written with plain grpcio: what a grpcio
user would write without the SDK. The benchmark in ``languages.py`` runs it
beside the SDK's ``forward``.

Both pumps follow the wire contract (docs/PROTOCOL.md): a local listener, one
``ForwardTcp`` stream per accepted connection, an ``init`` frame naming the
sandbox and the target port on the sandbox's own loopback, then ``data`` frames
each way and an ``eof`` frame when a side stops writing. Backpressure is the
transport's own: the sync pump's request iterator is only pulled as fast as
gRPC can send, and its socket writes block the response loop; the aio pump
awaits every ``write`` and ``drain``.

- :class:`ThreadForward`: sync grpcio, two threads per connection;
- :class:`AioForward`: ``grpc.aio`` on the caller's event loop.

``pb`` and ``stub_class`` are the message module and ``OpenShellStub`` that
``grpc_tools.protoc`` generated from ``proto/`` (the benchmark generates them at
run time).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import grpc.aio

__all__ = ["AioForward", "ThreadForward"]

# Bytes per data frame: one read of the local socket.
CHUNK = 64 * 1024


def _init_frame(pb: Any, sandbox: str, port: int) -> Any:
    return pb.TcpForwardFrame(
        init=pb.TcpForwardInit(sandbox=sandbox, tcp=pb.TcpRelayTarget(host="127.0.0.1", port=port))
    )


class ThreadForward:
    """A listener on 127.0.0.1; each connection is pumped by two threads over
    one ``ForwardTcp`` stream of a sync grpcio channel."""

    def __init__(
        self,
        channel: grpc.Channel,
        pb: Any,
        stub_class: Any,
        sandbox: str,
        remote_port: int,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self._stub = stub_class(channel)
        self._pb = pb
        self._sandbox = sandbox
        self._remote_port = remote_port
        self._metadata = tuple(metadata)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(conn,), daemon=True).start()

    def _requests(self, conn: socket.socket) -> Iterator[Any]:
        pb = self._pb
        yield _init_frame(pb, self._sandbox, self._remote_port)
        while True:
            try:
                data = conn.recv(CHUNK)
            except OSError:
                return
            if not data:
                yield pb.TcpForwardFrame(eof=pb.TcpForwardEof())
                return
            yield pb.TcpForwardFrame(data=data)

    def _pump(self, conn: socket.socket) -> None:
        # grpcio pulls the request iterator on a thread of its own; this
        # thread writes the responses to the socket.
        responses = self._stub.ForwardTcp(self._requests(conn), metadata=self._metadata)
        try:
            for frame in responses:
                kind = frame.WhichOneof("payload")
                if kind == "data":
                    conn.sendall(frame.data)
                elif kind == "eof":
                    with contextlib.suppress(OSError):
                        conn.shutdown(socket.SHUT_WR)
        except (grpc.RpcError, OSError):
            responses.cancel()
        finally:
            # Wakes the request iterator's recv (close alone would not).
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()


class AioForward:
    """A listener on 127.0.0.1 served by the running event loop; each
    connection is one ``ForwardTcp`` stream of a ``grpc.aio`` channel."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        pb: Any,
        stub_class: Any,
        sandbox: str,
        remote_port: int,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self._stub = stub_class(channel)
        self._pb = pb
        self._sandbox = sandbox
        self._remote_port = remote_port
        self._metadata = tuple(metadata)
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> AioForward:
        self._server = await asyncio.start_server(self._pump, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pb = self._pb
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        call = self._stub.ForwardTcp(metadata=self._metadata)

        async def upstream() -> None:
            await call.write(_init_frame(pb, self._sandbox, self._remote_port))
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    await call.write(pb.TcpForwardFrame(eof=pb.TcpForwardEof()))
                    await call.done_writing()
                    return
                await call.write(pb.TcpForwardFrame(data=data))

        sending = asyncio.create_task(upstream())
        try:
            async for frame in call:
                kind = frame.WhichOneof("payload")
                if kind == "data":
                    writer.write(frame.data)
                    await writer.drain()
                elif kind == "eof" and writer.can_write_eof():
                    writer.write_eof()
            # The gateway ended the call: the relay is over both ways.
        except (grpc.RpcError, OSError):
            pass
        finally:
            call.cancel()
            sending.cancel()
            with contextlib.suppress(
                asyncio.CancelledError, asyncio.InvalidStateError, grpc.RpcError, OSError
            ):
                await sending
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
