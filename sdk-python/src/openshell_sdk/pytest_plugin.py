"""pytest fixtures for tests against a real local OpenShell cluster.

Registered through the ``pytest11`` entry point when ``openshell-sdk`` is
installed; nothing starts until a test asks for a fixture.

- ``openshell_cluster``: a :class:`~openshell_sdk.testing.LocalCluster`, shared
  by every test of the session that asks for the same options, started on
  first use and stopped when the session ends. After each test, the faults
  that test ordered through it are undone (:meth:`LocalCluster.heal`).
- ``openshell_client``: a :class:`~openshell_sdk.Client` of that cluster,
  closed after the test.

Options come from the ini file (``openshell_replicas``, ``openshell_hosts``,
``openshell_config_delivery``, ``openshell_isolation``) and, per test, from
the marker ``@pytest.mark.openshell_cluster(replicas=1, hosts=2, ...)``.
``isolated=True`` in the marker gives the test a cluster of its own, stopped
after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ._sync_client import Client
from .testing import LocalCluster

_INI = {
    "replicas": ("openshell_replicas", "3", int),
    "hosts": ("openshell_hosts", "0", int),
    "config_delivery": ("openshell_config_delivery", "push", str),
    "isolation": ("openshell_isolation", "auto", str),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    for option, (name, default, _) in _INI.items():
        parser.addini(name, f"{option} of the openshell_cluster fixture", default=default)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "openshell_cluster(replicas=3, hosts=0, config_delivery='push', isolation='auto', "
        "isolated=False): options of the openshell_cluster fixture for this test",
    )


class _Clusters:
    """The session's shared clusters, one per set of options."""

    def __init__(self) -> None:
        self._started: dict[tuple[tuple[str, Any], ...], LocalCluster] = {}

    def get(self, options: dict[str, Any]) -> LocalCluster:
        key = tuple(sorted(options.items()))
        if key not in self._started:
            self._started[key] = LocalCluster(**options).start()
        return self._started[key]

    def stop_all(self) -> None:
        errors = []
        for cluster in self._started.values():
            try:
                cluster.stop()
            except Exception as err:
                errors.append(err)
        self._started.clear()
        if errors:
            raise errors[0]


def _options(request: pytest.FixtureRequest) -> tuple[dict[str, Any], bool]:
    options: dict[str, Any] = {
        option: convert(request.config.getini(name)) for option, (name, _, convert) in _INI.items()
    }
    isolated = False
    marker = request.node.get_closest_marker("openshell_cluster")
    if marker is not None:
        given = dict(marker.kwargs)
        isolated = bool(given.pop("isolated", False))
        unknown = set(given) - set(_INI) - {"restart_crashed"}
        if unknown:
            raise pytest.UsageError(
                f"openshell_cluster marker: unknown option(s) {sorted(unknown)}"
            )
        options.update(given)
    return options, isolated


@pytest.fixture(scope="session")
def _openshell_clusters() -> Iterator[_Clusters]:
    clusters = _Clusters()
    yield clusters
    clusters.stop_all()


@pytest.fixture
def openshell_cluster(
    request: pytest.FixtureRequest, _openshell_clusters: _Clusters
) -> Iterator[LocalCluster]:
    """A running local cluster (see the module docs for its options)."""
    options, isolated = _options(request)
    if isolated:
        with LocalCluster(**options) as cluster:
            yield cluster
        return
    cluster = _openshell_clusters.get(options)
    yield cluster
    cluster.heal()


@pytest.fixture
def openshell_client(openshell_cluster: LocalCluster) -> Iterator[Client]:
    """A client of ``openshell_cluster`` (owner routing on), closed after the test."""
    with openshell_cluster.client() as client:
        yield client
