"""openshell_sdk.testing and its pytest plugin against real local clusters: execs on
every replica, each fault as a user of the SDK sees it, bad options refused, and a
stop that leaves no process and no data directory."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import process_running

from openshell_sdk import (
    Client,
    ClusterError,
    FailedPreconditionError,
    InvalidConfigError,
    UnavailableError,
)
from openshell_sdk.testing import AsyncLocalCluster, LocalCluster


def ready_sandbox(client: Client) -> str:
    sandbox = client.sandboxes.create()
    client.sandboxes.wait_ready(sandbox.name, timeout=60)
    return sandbox.name


def count_run(client: Client, sandbox: str) -> str:
    """Appends a line and answers the count: an exec that ran twice shows one too many."""
    out = client.exec(sandbox, ["sh", "-c", "echo run >> runs; wc -l < runs"])
    return out.stdout_text.strip()


def cluster_pids(data_dir: str) -> list[int]:
    status = json.loads((Path(data_dir) / "up" / "status.json").read_text())
    pids = [int(p["pid"]) for p in status["processes"] if p["pid"] is not None]
    pids.append(int(status["pid"]))
    for entry in (Path(data_dir) / "sandboxes").glob("*/supervisor.pid"):
        pids.append(int(entry.read_text().strip()))
    return pids


def assert_stopped(pids: list[int], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while any(process_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if process_running(p)], "a process of the cluster is running"


def assert_gone(data_dir: str, pids: list[int]) -> None:
    assert not os.path.exists(data_dir), "a clean stop removes the data directory"
    assert_stopped(pids)


def states(cluster: LocalCluster) -> dict[str, str]:
    status = json.loads((Path(cluster.data_dir) / "up" / "status.json").read_text())
    return {p["name"]: p["state"] for p in status["processes"]}


@pytest.mark.openshell_cluster(isolated=True)
def test_every_replica_serves_and_a_killed_owner_costs_no_exec(
    openshell_cluster: LocalCluster, openshell_client: Client
) -> None:
    cluster, client = openshell_cluster, openshell_client
    assert cluster.replica_ids == ["gw-0", "gw-1", "gw-2"]
    assert cluster.endpoint.startswith("http://127.0.0.1:")
    assert not cluster.endpoint.endswith(":17670")

    # Sandboxes until every replica owns one (at most 40), an exec on each.
    # (A replica misses one sandbox with p < 0.7: 15 tries missed in 1 run of 140.)
    on: dict[str, str] = {}
    for _ in range(40):
        name = ready_sandbox(client)
        owner = cluster.owner_of(name)
        assert owner is not None
        on.setdefault(owner, name)
        if len(on) == 3:
            break
    assert sorted(on) == cluster.replica_ids, on
    for sandbox in on.values():
        assert count_run(client, sandbox) == "1"

    # A second client learns the owner, which then dies: the next exec runs once.
    owner, sandbox = sorted(on.items())[0]
    with cluster.client() as stale:
        assert count_run(stale, sandbox) == "2"
        cluster.kill_replica(owner)
        assert count_run(client, sandbox) == "3"
        moved = cluster.owner_of(sandbox)
        assert moved is not None and moved != owner

        # The replica comes back; the edge loses its route, and the second
        # client's hint (still the dead owner) is retried once, unrouted.
        cluster.start_replica(owner)
        cluster.cut_route(owner)
        retries = stale.routing_stats().unrouted_retries
        assert count_run(stale, sandbox) == "4"
        assert stale.routing_stats().unrouted_retries == retries + 1
        cluster.restore_route(owner)

    # Every connection through the edge breaks; the supervisors dial again.
    cluster.restart_edge()
    deadline = time.monotonic() + 60
    while True:
        try:
            out = client.exec(sandbox, ["sh", "-c", "wc -l < runs"])
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)
    assert out.stdout_text.strip() == "4", "an exec ran twice"

    with pytest.raises(InvalidConfigError, match='no replica "gw-9"'):
        cluster.kill_replica("gw-9")
    with pytest.raises(InvalidConfigError, match="the hosts are"):
        cluster.kill_host("h-0")


@pytest.mark.openshell_cluster(replicas=2)
def test_a_shared_cluster_takes_marker_options_and_faults_are_undone(
    openshell_cluster: LocalCluster,
) -> None:
    assert openshell_cluster.replica_ids == ["gw-0", "gw-1"]
    openshell_cluster.kill_replica("gw-1")
    assert states(openshell_cluster)["gw-1"] == "stopped"


@pytest.mark.openshell_cluster(replicas=2)
def test_the_next_test_gets_the_shared_cluster_healed(
    openshell_cluster: LocalCluster, openshell_client: Client
) -> None:
    # The fixture started gw-1 again after the test before.
    assert states(openshell_cluster)["gw-1"] == "running"
    name = ready_sandbox(openshell_client)
    assert count_run(openshell_client, name) == "1"


@pytest.mark.openshell_cluster(replicas=1)
def test_a_slow_or_cut_store_is_what_clients_see(
    openshell_cluster: LocalCluster, openshell_client: Client
) -> None:
    cluster, client = openshell_cluster, openshell_client
    name = ready_sandbox(client)
    cluster.slow_store(0.4)
    begun = time.monotonic()
    assert client.exec(name, ["true"]).exit_code == 0
    assert time.monotonic() - begun >= 0.4
    cluster.cut_store()
    with pytest.raises(UnavailableError, match="store"):
        client.sandboxes.create(name="made-during-the-cut")
    cluster.restore_store()
    assert client.exec(name, ["true"]).exit_code == 0
    assert "made-during-the-cut" not in [s.name for s in client.sandboxes.list()]
    with pytest.raises(InvalidConfigError, match="store delay"):
        cluster.slow_store(-1)
    cluster.cut_store()  # left for the fixture to undo


@pytest.mark.openshell_cluster(replicas=1)
def test_the_fixture_restored_the_store(openshell_client: Client) -> None:
    begun = time.monotonic()
    ready_sandbox(openshell_client)
    assert time.monotonic() - begun < 30


@pytest.mark.openshell_cluster(replicas=2, hosts=2, isolated=True)
def test_a_stopped_replica_and_killed_hosts_are_what_clients_see(
    openshell_cluster: LocalCluster, openshell_client: Client
) -> None:
    cluster, client = openshell_cluster, openshell_client
    assert cluster.host_ids == ["h-0", "h-1"]
    name = ready_sandbox(client)
    assert count_run(client, name) == "1"
    # SIGTERM: the owner redirects its sessions first; no retry, one run.
    owner = cluster.owner_of(name)
    assert owner is not None
    cluster.stop_replica(owner)
    assert count_run(client, name) == "2"
    cluster.start_replica(owner)
    # Every host dies: the exec is refused (no session yet, or the sandbox
    # already marked not ready); back, the sandbox is served again.
    for host in cluster.host_ids:
        cluster.kill_host(host)
    with pytest.raises((UnavailableError, FailedPreconditionError)):
        client.exec(name, ["true"], timeout=20)
    for host in cluster.host_ids:
        cluster.start_host(host)
    deadline = time.monotonic() + 60
    while True:
        try:
            assert count_run(client, name) == "3", "the refused exec never ran"
            break
        except (UnavailableError, FailedPreconditionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_bad_options_are_refused_and_a_failed_start_keeps_its_logs() -> None:
    with pytest.raises(InvalidConfigError, match="replicas must be at least 1"):
        LocalCluster(replicas=0).start()
    with pytest.raises(InvalidConfigError, match="isolation must be"):
        LocalCluster(isolation="bogus").start()  # type: ignore[arg-type]
    with pytest.raises(ClusterError, match="does not exist") as missing:
        LocalCluster(gateway_bin="/nonexistent/openshell-gateway").start()
    assert missing.value.code == "cluster"
    with pytest.raises(ClusterError, match="did not start") as failed:
        LocalCluster(gateway_bin="/bin/false").start()
    logs = failed.value.logs
    assert logs is not None and (Path(logs) / "up.log").exists()
    for entry in sorted(Path(logs).rglob("*"), reverse=True):
        entry.unlink() if entry.is_file() else entry.rmdir()
    Path(logs).rmdir()
    with pytest.raises(RuntimeError, match="not started"):
        _ = LocalCluster().endpoint


async def test_an_async_cluster_serves_and_stops_clean() -> None:
    async with AsyncLocalCluster(replicas=1) as cluster:
        assert cluster.replica_ids == ["gw-0"]
        async with cluster.client() as client:
            sandbox = await client.sandboxes.create()
            await client.sandboxes.wait_ready(sandbox.name, timeout=60)
            out = await client.exec(sandbox.name, ["echo", "hello"])
            assert out.stdout_text == "hello\n"
            assert await cluster.owner_of(sandbox.name) in (None, "gw-0")
        data_dir, pids = cluster.data_dir, cluster_pids(cluster.data_dir)
    assert_gone(data_dir, pids)
