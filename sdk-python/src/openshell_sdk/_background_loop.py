"""The private event loop the sync :class:`~openshell_sdk.Client` runs on.

The native module is async only. The sync API submits coroutines to one asyncio
loop running in a daemon thread of this process and waits for their results, so
sync users never create or manage a loop. The waiting thread does not hold the
GIL while it waits (``concurrent.futures.Future.result``), and the loop thread
only holds it while Python code runs.

After ``fork()`` the loop thread does not exist in the child: the loop records
the PID that started it and a child starts its own on first use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["BackgroundLoop", "shared_loop"]

_POLL = 0.2


class BackgroundLoop:
    """An asyncio loop in a daemon thread, restarted in a forked child."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _ensure(self) -> asyncio.AbstractEventLoop:
        pid = os.getpid()
        if self._pid == pid and self._loop is not None:
            return self._loop
        with self._lock:
            if self._pid == pid and self._loop is not None:
                return self._loop
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            thread = threading.Thread(target=serve, name="openshell-sdk-loop", daemon=True)
            thread.start()
            ready.wait()
            self._loop, self._thread, self._pid = loop, thread, pid
            return loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._ensure()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Runs ``coro`` on the loop and returns its result (or raises its error).

        An interrupt (Ctrl-C) while waiting cancels the coroutine, which cancels
        the call it was making.
        """
        loop = self._ensure()
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "the sync openshell_sdk.Client was called from its own loop thread; "
                "use AsyncClient in async code"
            )
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            # Short waits, not one long one: a signal (Ctrl-C) may be delivered
            # to any thread of the process (tokio's included), and the main
            # thread only runs its handler once it wakes up.
            while True:
                step = _POLL if deadline is None else min(_POLL, deadline - time.monotonic())
                if step <= 0:
                    raise TimeoutError(f"no result within {timeout} s")
                done, _ = concurrent.futures.wait([future], timeout=step)
                if done:
                    return future.result()
        except BaseException:
            future.cancel()
            raise


_shared = BackgroundLoop()


def shared_loop() -> BackgroundLoop:
    """The process-wide loop of the sync API."""
    return _shared
