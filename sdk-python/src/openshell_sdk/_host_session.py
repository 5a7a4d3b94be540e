"""A shared supervisor host's session: :class:`HostSession`.

A host is one process serving many sandboxes. It holds ONE ``ConnectHost``
session with the gateway, authenticated with its host token, and the gateway
assigns sandboxes to it; the session of every assigned sandbox rides inside
the host's. The protocol runs in the core (Rust, ``sdk-core``'s
``HostSession``): the host hello (member id, capacity, ``stay``), placement
redirects followed at once with ``stay``, sticky redials to the replica that
accepted it, falls back to the shared address, the assignment, and each
sandbox's configuration (pushed, or polled when not). Python sees one thing:
an ``apply(sandbox_id, snapshot)`` callback, called one snapshot at a time per
sandbox, whose return value answers it (``None`` / ``True``: applied;
``False`` or :class:`Rejected`: rejected; an exception rejects).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeAlias

from . import _native
from ._background_loop import BackgroundLoop, shared_loop
from ._config_session import ApplyResult, ConfigSnapshot, _failure, _verdict
from .errors import GrpcStatus, InvalidConfigError

__all__ = [
    "HostApplyCallback",
    "HostSession",
    "HostSessionStats",
    "SyncHostApplyCallback",
    "SyncHostSession",
]

HostApplyCallback: TypeAlias = Callable[[str, ConfigSnapshot], ApplyResult | Awaitable[ApplyResult]]
"""``apply(sandbox_id, snapshot)``, sync or async."""

SyncHostApplyCallback: TypeAlias = Callable[[str, ConfigSnapshot], ApplyResult]


@dataclass(frozen=True)
class HostSessionStats:
    """Counters of a :class:`HostSession` (the core's)."""

    sessions_accepted: int
    """Host sessions the gateway accepted."""
    redirects: int
    """Placement redirects followed (each at once, with ``stay``)."""
    sticky_redials: int
    """Redials of the replica that held a lost session (with ``stay``)."""
    fallbacks: int
    """Falls back to the shared address after a redirect target or a sticky
    redial could not be reached."""
    stay: bool
    """Whether the last hello carried ``stay``."""
    session_id: str | None
    """The current host session, while one is accepted."""
    served_by: str | None
    """The replica holding the current session."""
    assigned: int
    """Sandboxes in the last assignment."""

    @classmethod
    def _from_native(cls, raw: Mapping[str, Any]) -> HostSessionStats:
        return cls(
            sessions_accepted=raw["sessions_accepted"],
            redirects=raw["redirects"],
            sticky_redials=raw["sticky_redials"],
            fallbacks=raw["fallbacks"],
            stay=raw["stay"],
            session_id=raw["session_id"],
            served_by=raw["served_by"],
            assigned=raw["assigned"],
        )


def _require_apply(apply: object) -> None:
    if not callable(apply):
        raise InvalidConfigError(
            "a host session needs an apply function",
            code="invalid_config",
            grpc_status=GrpcStatus.INVALID_ARGUMENT,
        )


class _HostBase:
    def __init__(
        self,
        endpoint: str,
        member_id: str,
        host_token: str,
        *,
        capacity: int,
        config_push: bool,
        instance_id: str | None,
        ca_pem: bytes | None,
        tls_server_name: str | None,
        connect_timeout: float | None,
        allow_cleartext_token: bool,
    ) -> None:
        if capacity < 0:
            raise InvalidConfigError(
                "capacity must not be negative",
                code="invalid_config",
                grpc_status=GrpcStatus.INVALID_ARGUMENT,
            )
        self._native = _native.NativeHostSession(
            endpoint,
            member_id,
            host_token,
            capacity=capacity,
            config_push=config_push,
            instance_id=instance_id,
            ca_pem=ca_pem,
            tls_server_name=tls_server_name,
            connect_timeout=connect_timeout,
            allow_cleartext_token=allow_cleartext_token,
        )

    @property
    def member_id(self) -> str:
        """The host's member id (the id its host token was issued for)."""
        return self._native.member_id

    @property
    def instance_id(self) -> str:
        """The instance id every hello carries (stable for the session's life)."""
        return self._native.instance_id

    @property
    def closed(self) -> bool:
        return self._native.closed

    def stats(self) -> HostSessionStats:
        return HostSessionStats._from_native(self._native.stats())

    def _accepted(self) -> HostSessionStats | None:
        stats = self.stats()
        if stats.sessions_accepted == 0 or stats.session_id is None:
            return None
        return stats

    async def _next(self) -> tuple[int, str, ConfigSnapshot] | None:
        item = await self._native.next_update()
        if item is None:
            return None
        update_id, sandbox_id, sandbox_config, provider_environment = item
        return update_id, sandbox_id, ConfigSnapshot(sandbox_config, provider_environment)

    def _answer(self, update_id: int, applied: bool, reason: str | None) -> None:
        # False when the session closed meanwhile: nothing is waiting any more.
        self._native.ack(update_id, applied, reason)

    def __repr__(self) -> str:
        # Never the token: it lives in the core's configuration only.
        return (
            f"{type(self).__name__}(member_id={self.member_id!r}, "
            f"instance_id={self.instance_id!r}, closed={self.closed})"
        )


class HostSession(_HostBase):
    """A shared supervisor host's session, for asyncio code.

    ``host_token`` is the token issued for host ``member_id``
    (``openshell-gateway host-token``); ``endpoint`` is the gateway's shared
    address (the edge of a cluster). Usage::

        async def apply(sandbox_id: str, snapshot: ConfigSnapshot) -> None:
            ...  # apply snapshot.sandbox_config / snapshot.environment

        async with HostSession(endpoint, "h-0", token, apply=apply) as host:
            await host.wait_closed()

    or ``await host.run()`` (cancelling the task that awaits it closes the
    session). ``apply`` runs on the event loop, one snapshot at a time per
    sandbox; snapshots of different sandboxes are applied concurrently.
    ``capacity`` (0: no limit) is the most sandboxes the host serves;
    ``config_push=False`` makes the sandbox sessions poll.
    """

    def __init__(
        self,
        endpoint: str,
        member_id: str,
        host_token: str,
        *,
        apply: HostApplyCallback,
        capacity: int = 0,
        config_push: bool = True,
        instance_id: str | None = None,
        ca_pem: bytes | None = None,
        tls_server_name: str | None = None,
        connect_timeout: float | None = None,
        allow_cleartext_token: bool = False,
    ) -> None:
        _require_apply(apply)
        super().__init__(
            endpoint,
            member_id,
            host_token,
            capacity=capacity,
            config_push=config_push,
            instance_id=instance_id,
            ca_pem=ca_pem,
            tls_server_name=tls_server_name,
            connect_timeout=connect_timeout,
            allow_cleartext_token=allow_cleartext_token,
        )
        self._apply = apply
        self._driver: asyncio.Task[None] | None = None
        self._applying: set[asyncio.Task[None]] = set()

    async def start(self) -> HostSession:
        """Starts the session (``async with`` and ``run`` do). Idempotent."""
        self._native.start()
        if self._driver is None:
            self._driver = asyncio.get_running_loop().create_task(self._drive())
        return self

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        while (item := await self._next()) is not None:
            task = loop.create_task(self._apply_one(*item))
            self._applying.add(task)
            task.add_done_callback(self._applying.discard)

    async def _apply_one(self, update_id: int, sandbox_id: str, snapshot: ConfigSnapshot) -> None:
        try:
            result = self._apply(sandbox_id, snapshot)
            if inspect.isawaitable(result):
                result = await result
            applied, reason = _verdict(result)
        except asyncio.CancelledError:
            self._answer(update_id, False, "the session is closing")
            raise
        except Exception as exc:
            applied, reason = False, _failure(exc)
        self._answer(update_id, applied, reason)

    async def run(self) -> None:
        """Serves the host's sandboxes until :meth:`close` (or until the task
        awaiting it is cancelled, which closes the session); raises the
        session's error if it could not run (an unusable endpoint)."""
        await self.start()
        try:
            await self.wait_closed()
        finally:
            await self.close()

    async def wait_accepted(self, *, timeout: float = 30.0) -> HostSessionStats:
        """Waits until the gateway accepted a host session; returns the stats."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (stats := self._accepted()) is None:
            if self.closed:
                raise RuntimeError("the host session is closed")
            if loop.time() >= deadline:
                raise TimeoutError(f"no host session accepted within {timeout} s")
            await asyncio.sleep(0.02)
        return stats

    async def wait_closed(self) -> None:
        """Waits until the session ends; raises its error, if any."""
        if self._driver is not None:
            await asyncio.shield(self._driver)

    async def close(self) -> None:
        """Ends the session; unanswered snapshots are rejected. Idempotent."""
        self._native.close()
        driver, self._driver = self._driver, None
        tasks = [t for t in (driver, *self._applying) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            # Waits without raising the tasks' cancellation or error.
            await asyncio.wait(tasks)
            for task in tasks:
                if not task.cancelled():
                    task.exception()

    async def __aenter__(self) -> HostSession:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class SyncHostSession(_HostBase):
    """The blocking form of :class:`HostSession`.

    ``apply(sandbox_id, snapshot)`` runs on a pool of ``workers`` threads of
    its own (never on the SDK's background loop), one snapshot at a time per
    sandbox::

        with SyncHostSession(endpoint, "h-0", token, apply=fn) as host:
            host.wait_accepted()
            host.run()  # until close() from another thread, or Ctrl-C
    """

    def __init__(
        self,
        endpoint: str,
        member_id: str,
        host_token: str,
        *,
        apply: SyncHostApplyCallback,
        capacity: int = 0,
        config_push: bool = True,
        instance_id: str | None = None,
        ca_pem: bytes | None = None,
        tls_server_name: str | None = None,
        connect_timeout: float | None = None,
        allow_cleartext_token: bool = False,
        workers: int = 4,
        loop: BackgroundLoop | None = None,
    ) -> None:
        _require_apply(apply)
        if workers < 1:
            raise InvalidConfigError(
                "workers must be at least 1",
                code="invalid_config",
                grpc_status=GrpcStatus.INVALID_ARGUMENT,
            )
        super().__init__(
            endpoint,
            member_id,
            host_token,
            capacity=capacity,
            config_push=config_push,
            instance_id=instance_id,
            ca_pem=ca_pem,
            tls_server_name=tls_server_name,
            connect_timeout=connect_timeout,
            allow_cleartext_token=allow_cleartext_token,
        )
        self._apply = apply
        self._workers = workers
        self._loop = loop or shared_loop()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closing = False

    def start(self) -> SyncHostSession:
        """Starts the session and its apply threads (``with`` does). Idempotent."""
        self._native.start()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._drive, name="openshell-host-session", daemon=True
            )
            self._thread.start()
        return self

    def _apply_one(self, update_id: int, sandbox_id: str, snapshot: ConfigSnapshot) -> None:
        try:
            applied, reason = _verdict(self._apply(sandbox_id, snapshot))
        except Exception as exc:
            applied, reason = False, _failure(exc)
        self._answer(update_id, applied, reason)

    def _drive(self) -> None:
        with ThreadPoolExecutor(self._workers, thread_name_prefix="openshell-host-apply") as pool:
            try:
                while (item := self._loop.run(self._next())) is not None:
                    pool.submit(self._apply_one, *item)
            except BaseException as exc:
                # A session that could not run closes itself before its
                # error arrives here: only a close() asked for hides it.
                if not self._closing:
                    self._error = exc

    def run(self) -> None:
        """Starts if needed and serves until :meth:`close` (from another
        thread); Ctrl-C closes the session. Raises its error, if any."""
        self.start()
        try:
            self.wait_closed()
        finally:
            self.close()

    def wait_accepted(self, *, timeout: float = 30.0) -> HostSessionStats:
        """Waits until the gateway accepted a host session; returns the stats."""
        deadline = time.monotonic() + timeout
        while (stats := self._accepted()) is None:
            if self.closed:
                raise RuntimeError("the host session is closed")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no host session accepted within {timeout} s")
            time.sleep(0.02)
        return stats

    def close(self) -> None:
        """Ends the session and waits for the apply threads. Idempotent."""
        self._closing = True
        self._native.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(30)

    def wait_closed(self, timeout: float | None = None) -> None:
        """Waits until the session ends; raises its error, if any."""
        if self._thread is not None:
            # Short joins: Ctrl-C reaches the waiting thread.
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._thread.is_alive():
                if deadline is not None and time.monotonic() >= deadline:
                    break
                self._thread.join(0.2)
        if self._error is not None:
            raise self._error

    def __enter__(self) -> SyncHostSession:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
