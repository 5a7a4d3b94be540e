"""A real local OpenShell cluster for your own tests, with faults on demand.

:class:`LocalCluster` (blocking code) and :class:`AsyncLocalCluster` (asyncio)
start the reference gateway's developer cluster: ``replicas`` gateway
replicas behind an edge on a free loopback port, a fresh data directory, and
with ``hosts`` shared supervisor hosts. Faults on demand: replicas stopped, killed
and started, the edge's route to a replica cut, the edge restarted, shared
hosts killed, the store slowed or cut. Leaving the ``with`` block stops every
process by PID and removes the directory; a test process that dies (even by
SIGKILL) takes the cluster with it. ::

    from openshell_sdk.testing import LocalCluster

    with LocalCluster(replicas=3) as cluster, cluster.client() as client:
        sandbox = client.sandboxes.create()
        client.sandboxes.wait_ready(sandbox.name)
        owner = cluster.owner_of(sandbox.name)
        cluster.kill_replica(owner)  # SIGKILL; its sandboxes move to the others
        print(client.exec(sandbox.name, ["echo", "still here"]).stdout_text)

The executables ship inside this package's wheel. ``OPENSHELL_GATEWAY_BIN``
names another ``openshell-gateway`` (its ``openshell-supervisor`` beside it);
without either, ``openshell-gateway`` is looked up on ``PATH``.

The pytest plugin (:mod:`openshell_sdk.pytest_plugin`, registered when the
package is installed) gives the fixtures ``openshell_cluster`` and
``openshell_client``.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Awaitable
from types import TracebackType
from typing import Any, Literal, TypeVar, cast

from . import _native
from ._async_client import AsyncClient
from ._sync_client import Client
from .errors import InvalidConfigError

__all__ = ["GATEWAY_BIN_ENV", "AsyncLocalCluster", "LocalCluster", "bundled_gateway"]

GATEWAY_BIN_ENV = "OPENSHELL_GATEWAY_BIN"
"""The environment variable naming the ``openshell-gateway`` executable to run."""

ConfigDelivery = Literal["push", "poll"]
Isolation = Literal["auto", "namespaces", "none"]


def bundled_gateway() -> pathlib.Path | None:
    """The ``openshell-gateway`` shipped in this package, if this install has one."""
    path = pathlib.Path(__file__).parent / "_bin" / "openshell-gateway"
    return path if path.is_file() else None


def _gateway_bin(explicit: str | os.PathLike[str] | None) -> str | None:
    # The explicit path, then the variable (the core reads it), then the
    # bundled executable, then PATH (the core again).
    if explicit is not None:
        return os.fspath(explicit)
    if os.environ.get(GATEWAY_BIN_ENV):
        return None
    bundled = bundled_gateway()
    return None if bundled is None else str(bundled)


class _Options:
    def __init__(
        self,
        replicas: int,
        hosts: int,
        config_delivery: ConfigDelivery,
        isolation: Isolation,
        restart_crashed: bool,
        gateway_bin: str | os.PathLike[str] | None,
    ) -> None:
        self.replicas = replicas
        self.hosts = hosts
        self.config_delivery = config_delivery
        self.isolation = isolation
        self.restart_crashed = restart_crashed
        self.gateway_bin = _gateway_bin(gateway_bin)

    def start(self, blocking: bool) -> Awaitable[_native.NativeLocalCluster]:
        return _native.NativeLocalCluster.start(
            replicas=self.replicas,
            hosts=self.hosts,
            config_delivery=self.config_delivery,
            isolation=self.isolation,
            restart_crashed=self.restart_crashed,
            gateway_bin=self.gateway_bin,
            blocking=blocking,
        )


class _Facts:
    """The options, and what every cluster form reports without a call."""

    _cluster: _native.NativeLocalCluster | None

    def __init__(
        self,
        replicas: int = 3,
        hosts: int = 0,
        config_delivery: ConfigDelivery = "push",
        isolation: Isolation = "auto",
        *,
        restart_crashed: bool = False,
        gateway_bin: str | os.PathLike[str] | None = None,
    ) -> None:
        self._options = _Options(
            replicas, hosts, config_delivery, isolation, restart_crashed, gateway_bin
        )
        self._cluster = None
        # The faults ordered through this object, for LocalCluster.heal().
        self._down: set[str] = set()
        self._cut: set[str] = set()
        self._store_faulted = False

    def _handle(self) -> _native.NativeLocalCluster:
        if self._cluster is None:
            raise RuntimeError("the local cluster is not started (use it in a with block)")
        return self._cluster

    @property
    def endpoint(self) -> str:
        """The edge's URL: what clients and supervisors dial."""
        return self._handle().endpoint

    @property
    def data_dir(self) -> str:
        """The cluster's data directory (store, sandboxes, logs under ``up/``)."""
        return self._handle().data_dir

    @property
    def replica_ids(self) -> list[str]:
        """The replica ids, ``gw-0``.. in order."""
        return self._handle().replica_ids

    @property
    def host_ids(self) -> list[str]:
        """The shared host ids, ``h-0``.. in order (empty without hosts)."""
        return self._handle().host_ids


class LocalCluster(_Facts):
    """A local cluster for blocking code; start it with ``with`` or :meth:`start`.

    ``replicas`` gateway replicas (``gw-0``..), ``hosts`` shared supervisor
    hosts (``h-0``..; 0 runs one supervisor process per sandbox),
    ``config_delivery`` ``"push"`` or ``"poll"``, ``isolation`` as the
    gateway's ``--isolation``. A process that dies unasked stays down unless
    ``restart_crashed``. Failures raise :class:`openshell_sdk.errors.ClusterError`
    with the logs' directory in ``.logs``; bad options raise
    :class:`openshell_sdk.errors.InvalidConfigError`.
    """

    def start(self) -> LocalCluster:
        """Starts the cluster and returns once it serves (idempotent)."""
        if self._cluster is None:
            self._cluster = _ready(self._options.start(blocking=True))
        return self

    def stop(self) -> None:
        """Stops every process and removes the data directory (kept on an unclean stop)."""
        if self._cluster is not None:
            _ready(self._cluster.close())

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def client(self, **options: Any) -> Client:
        """A :class:`Client` of the edge (owner routing on; ``options`` as for Client)."""
        return Client(self.endpoint, **options)

    def owner_of(self, sandbox: str) -> str | None:
        """The replica holding ``sandbox``'s supervisor session, or ``None``."""
        return _ready(self._handle().owner_of(sandbox))

    def stop_replica(self, replica_id: str) -> None:
        """SIGTERM to a replica (its sessions move to the others); down until started."""
        _ready(self._handle().stop_replica(replica_id))
        self._down.add(replica_id)

    def kill_replica(self, replica_id: str) -> None:
        """SIGKILL to a replica; down until :meth:`start_replica`."""
        _ready(self._handle().kill_replica(replica_id))
        self._down.add(replica_id)

    def start_replica(self, replica_id: str) -> None:
        """Starts a stopped or killed replica again; returns once it serves."""
        _ready(self._handle().start_replica(replica_id))
        self._down.discard(replica_id)

    def cut_route(self, replica_id: str) -> None:
        """The edge loses its route to a replica (hinted calls take the unrouted retry)."""
        _ready(self._handle().cut_route(replica_id))
        self._cut.add(replica_id)

    def restore_route(self, replica_id: str) -> None:
        """Gives the edge its route to a replica back."""
        _ready(self._handle().restore_route(replica_id))
        self._cut.discard(replica_id)

    def restart_edge(self) -> None:
        """Stops and starts the edge: every connection through it is dialled anew."""
        _ready(self._handle().restart_edge())

    def kill_host(self, host_id: str) -> None:
        """SIGKILL to a shared host; down until :meth:`start_host`."""
        _ready(self._handle().kill_host(host_id))
        self._down.add(host_id)

    def start_host(self, host_id: str) -> None:
        """Starts a killed host again."""
        _ready(self._handle().start_host(host_id))
        self._down.discard(host_id)

    def slow_store(self, delay: float) -> None:
        """Every replica's store calls wait ``delay`` seconds first, until
        :meth:`restore_store` (past a call's 5 s deadline it fails ``unavailable``)."""
        _ready(self._handle().set_store(_millis(delay), False))
        self._store_faulted = True

    def cut_store(self) -> None:
        """The store stops answering (a frozen database): calls that need it fail
        ``unavailable`` after their deadline, until :meth:`restore_store`."""
        _ready(self._handle().set_store(0, True))
        self._store_faulted = True

    def restore_store(self) -> None:
        """Ends :meth:`slow_store` and :meth:`cut_store`."""
        _ready(self._handle().set_store(0, False))
        self._store_faulted = False

    def heal(self) -> None:
        """Undoes the faults ordered through this object: starts every replica and
        host it stopped or killed, and restores every route it cut."""
        for name in sorted(self._down):
            if name in self.host_ids:
                self.start_host(name)
            else:
                self.start_replica(name)
        for replica_id in sorted(self._cut):
            self.restore_route(replica_id)
        if self._store_faulted:
            self.restore_store()


class AsyncLocalCluster(_Facts):
    """A local cluster for asyncio code: ``async with AsyncLocalCluster() as cluster``.

    Same options and faults as :class:`LocalCluster`, as coroutines.
    """

    async def start(self) -> AsyncLocalCluster:
        """Starts the cluster and returns once it serves (idempotent)."""
        if self._cluster is None:
            self._cluster = await self._options.start(blocking=False)
        return self

    async def stop(self) -> None:
        """Stops every process and removes the data directory (kept on an unclean stop)."""
        if self._cluster is not None:
            await self._cluster.close()

    async def __aenter__(self) -> AsyncLocalCluster:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def client(self, **options: Any) -> AsyncClient:
        """An :class:`AsyncClient` of the edge (``options`` as for AsyncClient)."""
        return AsyncClient(self.endpoint, **options)

    async def owner_of(self, sandbox: str) -> str | None:
        """The replica holding ``sandbox``'s supervisor session, or ``None``."""
        return await self._handle().owner_of(sandbox)

    async def stop_replica(self, replica_id: str) -> None:
        """SIGTERM to a replica (its sessions move to the others); down until started."""
        await self._handle().stop_replica(replica_id)

    async def kill_replica(self, replica_id: str) -> None:
        """SIGKILL to a replica; down until :meth:`start_replica`."""
        await self._handle().kill_replica(replica_id)

    async def start_replica(self, replica_id: str) -> None:
        """Starts a stopped or killed replica again; returns once it serves."""
        await self._handle().start_replica(replica_id)

    async def cut_route(self, replica_id: str) -> None:
        """The edge loses its route to a replica (hinted calls take the unrouted retry)."""
        await self._handle().cut_route(replica_id)

    async def restore_route(self, replica_id: str) -> None:
        """Gives the edge its route to a replica back."""
        await self._handle().restore_route(replica_id)

    async def restart_edge(self) -> None:
        """Stops and starts the edge: every connection through it is dialled anew."""
        await self._handle().restart_edge()

    async def kill_host(self, host_id: str) -> None:
        """SIGKILL to a shared host; down until :meth:`start_host`."""
        await self._handle().kill_host(host_id)

    async def start_host(self, host_id: str) -> None:
        """Starts a killed host again."""
        await self._handle().start_host(host_id)

    async def slow_store(self, delay: float) -> None:
        """Every replica's store calls wait ``delay`` seconds first, until
        :meth:`restore_store` (past a call's 5 s deadline it fails ``unavailable``)."""
        await self._handle().set_store(_millis(delay), False)

    async def cut_store(self) -> None:
        """The store stops answering (a frozen database): calls that need it fail
        ``unavailable`` after their deadline, until :meth:`restore_store`."""
        await self._handle().set_store(0, True)

    async def restore_store(self) -> None:
        """Ends :meth:`slow_store` and :meth:`cut_store`."""
        await self._handle().set_store(0, False)


_T = TypeVar("_T")


def _ready(awaitable: Awaitable[_T]) -> _T:
    """The value of a completed awaitable of a blocking handle (``_native.Ready``)."""
    if not isinstance(awaitable, _native.Ready):
        raise TypeError("a blocking cluster handle returned a pending awaitable")
    return cast(_T, awaitable.result())


def _millis(seconds: float) -> int:
    if not (0 <= seconds <= 600):
        raise InvalidConfigError(
            "a store delay is 0 to 600 seconds", code="invalid_config", grpc_status=3
        )
    return round(seconds * 1000)
