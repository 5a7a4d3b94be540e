"""TCP servers the tests run inside a sandbox.

Every sandbox has a network namespace of its own (loopback only), so a forward
to 127.0.0.1:PORT reaches the sandbox's port PORT, never a listener of the test
process: a forward's target has to listen in there. The server is a python3
program run through an exec stream (by default ``testkit/scripts/sandbox-echo.py``,
which every language's tests use); it prints ``listening PORT`` once it accepts
connections, and ending the stream ends it (the gateway kills the command's
process group).

- :func:`sandbox_echo`, :func:`sandbox_server`: for the sync ``Client``;
- :func:`async_sandbox_echo`, :func:`async_sandbox_server`: for ``AsyncClient``.

Each is a context manager that yields the port once the server listens (within
``START_TIMEOUT``; otherwise it fails with the server's stderr) and on exit
cancels the stream and waits, at most ``STOP_TIMEOUT``, until it has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openshell_sdk as osdk
from openshell_sdk import AsyncClient, Client

ECHO_SCRIPT = Path(__file__).resolve().parents[2] / "testkit" / "scripts" / "sandbox-echo.py"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
_LISTENING = re.compile(rb"^listening (\d+)\n", re.MULTILINE)


class SandboxServerError(Exception):
    """The server in the sandbox did not come up, or its stream did not end."""


@functools.cache
def echo_program() -> str:
    """The echo server (``testkit/scripts/sandbox-echo.py``): binds
    127.0.0.1:PORT (its argument; 0 picks a free port) and echoes every
    connection back, passing a half-close on, until it is killed."""
    return ECHO_SCRIPT.read_text()


class _Output:
    """What the server printed so far, and why its stream ended."""

    def __init__(self, sandbox: str) -> None:
        self.sandbox = sandbox
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.port: int | None = None
        self.ended: str | None = None

    def add(self, event: osdk.ExecEvent) -> None:
        if isinstance(event, osdk.ExecStdout):
            self.stdout += event.data
            if self.port is None and (found := _LISTENING.search(self.stdout)):
                self.port = int(found[1])
        elif isinstance(event, osdk.ExecStderr):
            self.stderr += event.data
        else:
            self.ended = f"it exited with {event.exit_code}"

    def end(self, why: str) -> None:
        if self.ended is None:
            self.ended = why

    def failure(self, what: str) -> SandboxServerError:
        stderr = self.stderr.decode(errors="replace")[-4000:]
        return SandboxServerError(
            f"the server in sandbox {self.sandbox} {what}; stdout {bytes(self.stdout)[-400:]!r}, "
            f"stderr:\n{stderr}"
        )

    def listening_port(self, start_timeout: float) -> int:
        """The port, once the wait for it is over (raises if there is none)."""
        if self.port is not None:
            return self.port
        if self.ended is not None:
            raise self.failure(f"ended before it listened ({self.ended})")
        raise self.failure(f"did not print 'listening PORT' within {start_timeout:g} s")


def _command(program: str, args: tuple[str, ...]) -> list[str]:
    return ["python3", "-c", program, *args]


@contextlib.contextmanager
def sandbox_server(
    client: Client,
    sandbox: str,
    program: str,
    *args: str,
    start_timeout: float = START_TIMEOUT,
) -> Iterator[int]:
    """Runs ``python3 -c program args...`` in ``sandbox`` and yields the port of
    its ``listening PORT`` line. One thread reads the stream for its whole life
    (so the server's output never backs up); leaving cancels the stream."""
    stream = client.exec_stream(sandbox, _command(program, args))
    output = _Output(sandbox)
    changed = threading.Condition()

    def read() -> None:
        try:
            for event in stream:
                with changed:
                    output.add(event)
                    changed.notify_all()
        except Exception as err:  # the cancel at the end lands here too
            with changed:
                output.end(f"its exec stream failed: {err!r}")
        finally:
            with changed:
                output.end("its exec stream ended")
                changed.notify_all()

    reader = threading.Thread(target=read, name=f"sandbox-server-{sandbox}", daemon=True)
    reader.start()
    failed = True
    try:
        with changed:
            changed.wait_for(
                lambda: output.port is not None or output.ended is not None, start_timeout
            )
            port = output.listening_port(start_timeout)
        yield port
        failed = False
    finally:
        stream.cancel()
        reader.join(STOP_TIMEOUT)
        if reader.is_alive() and not failed:
            raise SandboxServerError(
                f"the exec stream of the server in {sandbox} did not end within "
                f"{STOP_TIMEOUT:g} s of its cancel"
            )


@contextlib.asynccontextmanager
async def async_sandbox_server(
    client: AsyncClient,
    sandbox: str,
    program: str,
    *args: str,
    start_timeout: float = START_TIMEOUT,
) -> AsyncIterator[int]:
    """:func:`sandbox_server` for ``AsyncClient``: a task reads the stream."""
    stream = client.exec_stream(sandbox, _command(program, args))
    output = _Output(sandbox)
    settled = asyncio.Event()

    async def read() -> None:
        try:
            async for event in stream:
                output.add(event)
                if output.port is not None:
                    settled.set()
        except Exception as err:  # the cancel at the end lands here too
            output.end(f"its exec stream failed: {err!r}")
        finally:
            output.end("its exec stream ended")
            settled.set()

    reader = asyncio.create_task(read())
    failed = True
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(settled.wait(), start_timeout)
        yield output.listening_port(start_timeout)
        failed = False
    finally:
        stream.cancel()
        done, _ = await asyncio.wait({reader}, timeout=STOP_TIMEOUT)
        if not done:
            reader.cancel()
            if not failed:
                raise SandboxServerError(
                    f"the exec stream of the server in {sandbox} did not end within "
                    f"{STOP_TIMEOUT:g} s of its cancel"
                )


def sandbox_echo(
    client: Client, sandbox: str, port: int = 0
) -> contextlib.AbstractContextManager[int]:
    """The echo server in ``sandbox`` on ``port`` (0: a free one); yields its port."""
    return sandbox_server(client, sandbox, echo_program(), str(port))


def async_sandbox_echo(
    client: AsyncClient, sandbox: str, port: int = 0
) -> contextlib.AbstractAsyncContextManager[int]:
    """:func:`sandbox_echo` for ``AsyncClient``."""
    return async_sandbox_server(client, sandbox, echo_program(), str(port))
