"""How the sync :class:`~openshell_sdk.Client` runs the async implementation
without an event loop.

The sync client's native client is built with ``blocking=True``: each of its
native calls waits on the calling thread with the GIL released (Ctrl-C raises
``KeyboardInterrupt`` from it and cancels the call) and returns an awaitable
that is already complete. A coroutine of the async layer that only awaits such
calls therefore finishes in its first step, which :func:`run` takes on the
calling thread: no loop, no thread hop.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["run"]


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Runs ``coro`` to its end on this thread and returns its result (or raises
    its error). ``coro`` must await nothing but blocking native calls."""
    try:
        suspended = coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError(
        f"the sync openshell_sdk.Client awaited {suspended!r}, which needs an event loop"
    )
