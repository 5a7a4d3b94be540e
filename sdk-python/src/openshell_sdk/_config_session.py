"""The supervisor side of the session protocol: :class:`ConfigSession`.

A supervisor (or anything that runs a sandbox's workload) keeps one
``ConnectSupervisor`` session with the gateway, authenticated with the
sandbox's own token, and applies the sandbox's configuration. The protocol runs
in the core (Rust, ``sdk-core``'s ``ConfigSession``): the startup poll, the
hello announcing push support, the bootstrap, pushed updates answered in order,
heartbeats, redirects, reconnects with backoff, and polling whenever the
gateway does not push. Python sees one thing: full configuration snapshots
(:class:`ConfigUpdate`), one at a time, each to be answered *applied* or
*rejected*. A snapshot equal to the last applied one is answered by the core
and never reaches Python.

Two ways to answer:

- iterate ``session.events()`` and call ``await update.ack()`` or
  ``await update.reject(reason)``;
- or pass ``apply=fn``: ``fn(update)`` (sync or async) returns ``None`` /
  ``True`` (applied), ``False`` or :class:`Rejected` (rejected); an exception
  rejects the update.

Until an update is answered the next one waits (the gateway keeps at most one
update in flight per session), so answer every update.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeAlias

from . import _native
from ._background_loop import BackgroundLoop, shared_loop
from ._proto import openshell_pb2, sandbox_pb2

__all__ = [
    "ApplyCallback",
    "ApplyResult",
    "ConfigSession",
    "ConfigSessionStats",
    "ConfigSnapshot",
    "ConfigUpdate",
    "DeliveryMode",
    "Rejected",
    "SyncConfigSession",
]

_log = logging.getLogger("openshell_sdk")

SettingValue: TypeAlias = str | int | bool | bytes | None


class DeliveryMode(enum.Enum):
    """How configuration reaches the session."""

    PUSH = "push"
    """Pushed by the gateway over the session."""
    POLL = "poll"
    """Polled with ``GetSandboxConfig`` (a poll gateway, or push not announced)."""


@dataclass(frozen=True)
class Rejected:
    """What an ``apply`` callback returns to reject an update.

    ``reason`` goes to the gateway; the core cuts it to 256 characters and
    removes provider environment values from it. Never put configuration
    values in it anyway.
    """

    reason: str


ApplyResult: TypeAlias = bool | Rejected | None
"""``None`` or ``True``: applied; ``False`` or :class:`Rejected`: rejected."""


@dataclass(frozen=True)
class ConfigSessionStats:
    """Counters of a :class:`ConfigSession` (the core's)."""

    mode: DeliveryMode | None
    """How configuration arrives now (``None`` before the first answer)."""
    applied: int
    """Snapshots answered applied."""
    rejected: int
    """Snapshots answered rejected."""
    duplicates: int
    """Pushed updates equal to the last applied snapshot (answered by the core)."""
    updates_received: int
    """Pushed updates received, bootstraps included."""
    last_update_id: int
    """Id of the last pushed update answered (per gateway session)."""
    config_revision: int
    """``config_revision`` of the applied configuration."""
    polls: int
    """Successful ``GetSandboxConfig`` polls."""
    sessions_accepted: int
    """Sessions the gateway accepted."""
    redirects: int
    """Session redirects followed."""
    session_id: str | None
    """The current gateway session, while one is accepted."""
    served_by: str | None
    """The replica holding the current session."""

    @classmethod
    def _from_native(cls, raw: Mapping[str, Any]) -> ConfigSessionStats:
        mode = raw["mode"]
        return cls(
            mode=None if mode is None else DeliveryMode(mode),
            applied=raw["applied"],
            rejected=raw["rejected"],
            duplicates=raw["duplicates"],
            updates_received=raw["updates_received"],
            last_update_id=raw["last_update_id"],
            config_revision=raw["config_revision"],
            polls=raw["polls"],
            sessions_accepted=raw["sessions_accepted"],
            redirects=raw["redirects"],
            session_id=raw["session_id"],
            served_by=raw["served_by"],
        )


def _setting_value(value: sandbox_pb2.SettingValue) -> SettingValue:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    result: SettingValue = getattr(value, kind)
    return result


class ConfigSnapshot:
    """One full configuration of a sandbox.

    ``sandbox_config`` (policy, settings, revisions) and
    ``provider_environment`` (the provider values it names, which are
    secrets: ``repr`` shows only their keys) are the wire messages. A
    :class:`HostSession` hands these to its apply callback;
    :class:`ConfigUpdate` is one with an answer attached.
    """

    __slots__ = ("provider_environment", "sandbox_config")

    def __init__(self, sandbox_config: bytes, provider_environment: bytes) -> None:
        self.sandbox_config = sandbox_pb2.GetSandboxConfigResponse.FromString(sandbox_config)
        self.provider_environment = openshell_pb2.GetSandboxProviderEnvironmentResponse.FromString(
            provider_environment
        )

    @property
    def config_revision(self) -> int:
        return self.sandbox_config.config_revision

    @property
    def provider_env_revision(self) -> int:
        return self.provider_environment.provider_env_revision

    @property
    def policy(self) -> sandbox_pb2.SandboxPolicy:
        return self.sandbox_config.policy

    @property
    def settings(self) -> dict[str, SettingValue]:
        """The effective settings (a global value overrides the sandbox's)."""
        return {
            key: _setting_value(effective.value)
            for key, effective in self.sandbox_config.settings.items()
        }

    def setting(self, key: str) -> SettingValue:
        """One effective setting, or ``None``."""
        effective = self.sandbox_config.settings.get(key)
        return None if effective is None else _setting_value(effective.value)

    @property
    def environment(self) -> dict[str, str]:
        """The provider environment (secret values)."""
        return dict(self.provider_environment.environment)

    def _fields(self) -> str:
        keys = sorted(self.provider_environment.environment)
        return (
            f"config_revision={self.config_revision}, "
            f"provider_env_revision={self.provider_env_revision}, "
            f"settings={sorted(self.sandbox_config.settings)}, environment_keys={keys}"
        )

    def __repr__(self) -> str:
        return f"ConfigSnapshot({self._fields()})"


class ConfigUpdate(ConfigSnapshot):
    """One full configuration of the sandbox, to apply and answer.

    ``sandbox_config`` (policy, settings, revisions) and
    ``provider_environment`` (the provider values it names, which are
    secrets: ``repr`` shows only their keys) are the wire messages.
    """

    __slots__ = ("_answered", "_id", "_native", "mode")

    def __init__(
        self,
        native: _native.NativeConfigSession,
        update_id: int,
        sandbox_config: bytes,
        provider_environment: bytes,
        mode: str,
    ) -> None:
        super().__init__(sandbox_config, provider_environment)
        self._native = native
        self._id = update_id
        self._answered = False
        self.mode = DeliveryMode(mode)

    @property
    def answered(self) -> bool:
        return self._answered

    def _answer(self, applied: bool, reason: str | None) -> None:
        if self._answered:
            raise ValueError("this configuration update was already answered")
        self._answered = True
        # False when the session closed meanwhile: nothing is waiting any more.
        self._native.ack(self._id, applied, reason)

    def _settle(self, applied: bool, reason: str | None) -> None:
        """Answers unless the callback already did."""
        if not self._answered:
            self._answer(applied, reason)

    async def ack(self) -> None:
        """Answers *applied*: the configuration is in force."""
        self._answer(True, None)

    async def reject(self, reason: str) -> None:
        """Answers *rejected*; the previous configuration stays in force.

        The gateway resends the update on its next reconcile pass.
        """
        self._answer(False, reason)

    def __repr__(self) -> str:
        return f"ConfigUpdate(mode={self.mode.value}, {self._fields()})"


ApplyCallback: TypeAlias = Callable[[ConfigUpdate], ApplyResult | Awaitable[ApplyResult]]


def _verdict(result: ApplyResult) -> tuple[bool, str | None]:
    if result is None or result is True:
        return True, None
    if result is False:
        return False, "rejected by the apply callback"
    if isinstance(result, Rejected):
        return False, result.reason
    raise TypeError(
        f"an apply callback returns None, a bool or Rejected, not {type(result).__name__}"
    )


def _failure(exc: BaseException) -> str:
    _log.warning("the config apply callback raised %s; update rejected", type(exc).__name__)
    return f"the apply callback raised {type(exc).__name__}"


class _Base:
    def __init__(
        self,
        endpoint: str,
        sandbox_id: str,
        sandbox_token: str,
        *,
        poll_interval: float | None,
        announce_push: bool,
        instance_id: str | None,
        ca_pem: bytes | None,
        tls_server_name: str | None,
        connect_timeout: float | None,
        allow_cleartext_token: bool,
    ) -> None:
        self._native = _native.NativeConfigSession(
            endpoint,
            sandbox_id,
            sandbox_token,
            poll_interval=poll_interval,
            announce_push=announce_push,
            instance_id=instance_id,
            ca_pem=ca_pem,
            tls_server_name=tls_server_name,
            connect_timeout=connect_timeout,
            allow_cleartext_token=allow_cleartext_token,
        )
        self.sandbox_id = sandbox_id

    @property
    def instance_id(self) -> str:
        """The instance id every hello carries (stable for the session's life)."""
        return self._native.instance_id

    @property
    def closed(self) -> bool:
        return self._native.closed

    def stats(self) -> ConfigSessionStats:
        return ConfigSessionStats._from_native(self._native.stats())

    @property
    def mode(self) -> DeliveryMode | None:
        """``DeliveryMode.PUSH`` or ``POLL`` once known, else ``None``."""
        return self.stats().mode

    def _mode_reached(self, mode: DeliveryMode | None) -> DeliveryMode | None:
        stats = self.stats()
        if stats.mode is None or stats.sessions_accepted == 0:
            return None
        if mode is not None and stats.mode is not mode:
            return None
        return stats.mode


class ConfigSession(_Base):
    """The supervisor side of a sandbox's session, for asyncio code.

    ``sandbox_token`` is the sandbox's own token (a supervisor gets it in
    ``OPENSHELL_SANDBOX_TOKEN``). Usage::

        async with ConfigSession(endpoint, sandbox_id, token) as session:
            async for update in session.events():
                ...  # apply update.sandbox_config / update.environment
                await update.ack()  # or: await update.reject("why")

    or with a callback::

        async with ConfigSession(endpoint, sandbox_id, token, apply=fn) as session:
            await session.wait_closed()

    ``announce_push=False`` behaves like a supervisor that predates push: it
    polls every ``poll_interval`` seconds (default 10) whatever the gateway's
    mode. One session per sandbox: a newer one replaces the older one.
    """

    def __init__(
        self,
        endpoint: str,
        sandbox_id: str,
        sandbox_token: str,
        *,
        apply: ApplyCallback | None = None,
        poll_interval: float | None = None,
        announce_push: bool = True,
        instance_id: str | None = None,
        ca_pem: bytes | None = None,
        tls_server_name: str | None = None,
        connect_timeout: float | None = None,
        allow_cleartext_token: bool = False,
    ) -> None:
        super().__init__(
            endpoint,
            sandbox_id,
            sandbox_token,
            poll_interval=poll_interval,
            announce_push=announce_push,
            instance_id=instance_id,
            ca_pem=ca_pem,
            tls_server_name=tls_server_name,
            connect_timeout=connect_timeout,
            allow_cleartext_token=allow_cleartext_token,
        )
        self._apply = apply
        self._driver: asyncio.Task[None] | None = None
        self._iterating = False

    async def start(self) -> ConfigSession:
        """Starts the session (``async with`` does). Idempotent."""
        self._native.start()
        if self._apply is not None and self._driver is None:
            self._driver = asyncio.get_running_loop().create_task(self._drive(self._apply))
        return self

    async def _next(self) -> ConfigUpdate | None:
        item = await self._native.next_update()
        if item is None:
            return None
        return ConfigUpdate(self._native, *item)

    async def _drive(self, apply: ApplyCallback) -> None:
        while (update := await self._next()) is not None:
            try:
                result = apply(update)
                if inspect.isawaitable(result):
                    result = await result
                applied, reason = _verdict(result)
            except asyncio.CancelledError:
                update._settle(False, "the session is closing")
                raise
            except Exception as exc:
                applied, reason = False, _failure(exc)
            update._settle(applied, reason)

    async def events(self) -> AsyncIterator[ConfigUpdate]:
        """The snapshots to apply, in order, until the session closes.

        Answer each one (``ack`` or ``reject``) before the next arrives. One
        consumer at a time; not available with ``apply=``.
        """
        if self._apply is not None:
            raise RuntimeError("this session answers through its apply callback")
        if self._iterating:
            raise RuntimeError("events() already has a consumer")
        self._iterating = True
        try:
            await self.start()
            while (update := await self._next()) is not None:
                yield update
        finally:
            self._iterating = False

    async def wait_mode(
        self, mode: DeliveryMode | None = None, *, timeout: float = 30.0
    ) -> DeliveryMode:
        """Waits until a session is accepted and delivery is ``mode`` (any if ``None``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (reached := self._mode_reached(mode)) is None:
            if self.closed:
                raise RuntimeError("the session is closed")
            if loop.time() >= deadline:
                raise TimeoutError(f"delivery mode {mode} not reached within {timeout} s")
            await asyncio.sleep(0.02)
        return reached

    async def wait_closed(self) -> None:
        """With ``apply=``: waits until the session ends; raises its error, if any."""
        if self._driver is not None:
            await asyncio.shield(self._driver)

    async def close(self) -> None:
        """Ends the session; unanswered updates are rejected. Idempotent."""
        self._native.close()
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.cancel()
            # Waits without raising the driver's cancellation or error.
            await asyncio.wait({driver})
            if not driver.cancelled():
                driver.exception()

    async def __aenter__(self) -> ConfigSession:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


SyncApplyCallback: TypeAlias = Callable[[ConfigUpdate], ApplyResult]


class SyncConfigSession(_Base):
    """The blocking form of :class:`ConfigSession`, driven by a callback.

    ``apply(update)`` runs on a thread of its own (never on the SDK's
    background loop), one update at a time::

        with SyncConfigSession(endpoint, sandbox_id, token, apply=fn) as session:
            session.wait_mode()
            ...
    """

    def __init__(
        self,
        endpoint: str,
        sandbox_id: str,
        sandbox_token: str,
        *,
        apply: SyncApplyCallback,
        poll_interval: float | None = None,
        announce_push: bool = True,
        instance_id: str | None = None,
        ca_pem: bytes | None = None,
        tls_server_name: str | None = None,
        connect_timeout: float | None = None,
        allow_cleartext_token: bool = False,
        loop: BackgroundLoop | None = None,
    ) -> None:
        super().__init__(
            endpoint,
            sandbox_id,
            sandbox_token,
            poll_interval=poll_interval,
            announce_push=announce_push,
            instance_id=instance_id,
            ca_pem=ca_pem,
            tls_server_name=tls_server_name,
            connect_timeout=connect_timeout,
            allow_cleartext_token=allow_cleartext_token,
        )
        self._apply = apply
        self._loop = loop or shared_loop()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closing = False

    def start(self) -> SyncConfigSession:
        """Starts the session and its apply thread (``with`` does). Idempotent."""
        self._native.start()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._drive, name="openshell-config-session", daemon=True
            )
            self._thread.start()
        return self

    async def _next(self) -> ConfigUpdate | None:
        item = await self._native.next_update()
        if item is None:
            return None
        return ConfigUpdate(self._native, *item)

    def _drive(self) -> None:
        try:
            while (update := self._loop.run(self._next())) is not None:
                try:
                    applied, reason = _verdict(self._apply(update))
                except Exception as exc:
                    applied, reason = False, _failure(exc)
                update._settle(applied, reason)
        except BaseException as exc:
            # A session that could not run closes itself before its error
            # arrives here: only a close() asked for hides it.
            if not self._closing:
                self._error = exc

    def wait_mode(self, mode: DeliveryMode | None = None, *, timeout: float = 30.0) -> DeliveryMode:
        """Waits until a session is accepted and delivery is ``mode`` (any if ``None``)."""
        deadline = time.monotonic() + timeout
        while (reached := self._mode_reached(mode)) is None:
            if self.closed:
                raise RuntimeError("the session is closed")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"delivery mode {mode} not reached within {timeout} s")
            time.sleep(0.02)
        return reached

    def close(self) -> None:
        """Ends the session and waits for the apply thread. Idempotent."""
        self._closing = True
        self._native.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(30)

    def wait_closed(self, timeout: float | None = None) -> None:
        """Waits until the session ends; raises its error, if any."""
        if self._thread is not None:
            self._thread.join(timeout)
        if self._error is not None:
            raise self._error

    def __enter__(self) -> SyncConfigSession:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
