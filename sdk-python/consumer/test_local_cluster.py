"""A user's own test suite against the installed wheel (scripts/check-wheel.sh runs it in a
fresh virtualenv, without cargo and without this checkout on the path): the pytest plugin's
``openshell_cluster`` fixture starts the gateway shipped inside the wheel."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from openshell_sdk import Client
from openshell_sdk.testing import LocalCluster, bundled_gateway


def count_run(client: Client, sandbox: str) -> str:
    out = client.exec(sandbox, ["sh", "-c", "echo run >> runs; wc -l < runs"])
    return out.stdout_text.strip()


def test_the_gateway_comes_from_the_wheel() -> None:
    bundled = bundled_gateway()
    assert bundled is not None and "site-packages" in str(bundled), bundled


@pytest.mark.openshell_cluster(replicas=3)
def test_exec_on_every_replica_and_after_a_killed_owner(
    openshell_cluster: LocalCluster, openshell_client: Client
) -> None:
    on: dict[str, str] = {}
    for _ in range(40):
        sandbox = openshell_client.sandboxes.create()
        openshell_client.sandboxes.wait_ready(sandbox.name, timeout=60)
        owner = openshell_cluster.owner_of(sandbox.name)
        assert owner is not None
        on.setdefault(owner, sandbox.name)
        if len(on) == 3:
            break
    assert sorted(on) == ["gw-0", "gw-1", "gw-2"], on
    for name in on.values():
        assert count_run(openshell_client, name) == "1"

    owner, name = sorted(on.items())[0]
    openshell_cluster.kill_replica(owner)
    assert count_run(openshell_client, name) == "2", "the exec after the kill ran once"


def test_files_and_logs_with_the_wheels_executables(
    openshell_client: Client, tmp_path: Path
) -> None:
    sandbox = openshell_client.sandboxes.create().name
    openshell_client.sandboxes.wait_ready(sandbox, timeout=60)
    # Every byte value, 1 MiB: binary-safe both ways.
    data = bytes(range(256)) * 4096
    assert openshell_client.write_file(sandbox, "blob.bin", data).bytes == len(data)
    assert openshell_client.read_file(sandbox, "blob.bin") == data
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a.txt").write_text("a\n")
    assert openshell_client.upload(sandbox, tree, "tree").files == 1
    back = tmp_path / "back"
    openshell_client.download(sandbox, "tree", back)
    assert (back / "sub" / "a.txt").read_text() == "a\n"

    assert openshell_client.exec(sandbox, ["sh", "-c", "exit 3"]).exit_code == 3
    deadline = time.monotonic() + 30
    while True:
        lines = openshell_client.sandboxes.logs(sandbox, sources="sandbox").lines
        if any(
            line.message == "exec finished" and line.fields.get("exit_code") == "3"
            for line in lines
        ):
            break
        assert time.monotonic() < deadline, [str(line) for line in lines]
        time.sleep(0.2)
