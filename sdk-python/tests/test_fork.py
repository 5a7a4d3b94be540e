"""The runtime survives fork(): a child rebuilds it (multiprocessing, fork start method)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os

from conftest import Cluster

import openshell_sdk as osdk
from openshell_sdk import AsyncClient, Client, _native


def _child_exec(client: Client, sandbox: str, queue: multiprocessing.Queue) -> None:
    try:
        result = client.exec(sandbox, ["echo", f"child-{os.getpid()}"], timeout=30)
        info = _native.runtime_info()
        queue.put(("ok", result.stdout_text, info["pid"], info["runtime_builds"]))
    except BaseException as err:
        queue.put(("error", repr(err), os.getpid(), -1))


def _child_async(endpoint: str, sandbox: str, queue: multiprocessing.Queue) -> None:
    async def run() -> str:
        async with AsyncClient(endpoint) as client:
            return (await client.exec(sandbox, ["echo", "async-child"])).stdout_text

    try:
        queue.put(("ok", asyncio.run(run())))
    except BaseException as err:
        queue.put(("error", repr(err)))


def _child_error(client: Client, queue: multiprocessing.Queue) -> None:
    try:
        client.sandboxes.get("no-such-sandbox-in-child")
        queue.put(("no error",))
    except osdk.NotFoundError as err:
        queue.put(("ok", err))


def test_a_forked_child_uses_the_parents_client(client: Client, ready_sandbox: str) -> None:
    # The parent's runtime and client are in use before the fork.
    assert client.exec(ready_sandbox, ["true"]).exit_code == 0
    parent = _native.runtime_info()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    children = [
        ctx.Process(target=_child_exec, args=(client, ready_sandbox, queue)) for _ in range(2)
    ]
    for child in children:
        child.start()
    results = [queue.get(timeout=60) for _ in children]
    for child in children:
        child.join(30)
        assert child.exitcode == 0
    for status, stdout, pid, builds in results:
        assert status == "ok", stdout
        assert stdout == f"child-{pid}\n"
        assert pid != parent["pid"]
        # The child built its own runtime.
        assert builds == parent["runtime_builds"] + 1
    # The parent is unaffected.
    assert client.exec(ready_sandbox, ["echo", "parent"]).stdout_text == "parent\n"
    assert _native.runtime_info() == parent


def _child_busy(client: Client, sandbox: str, queue: multiprocessing.Queue) -> None:
    try:
        outputs = [client.exec(sandbox, ["echo", str(n)], timeout=30).stdout_text for n in range(3)]
        queue.put(("ok", outputs))
    except BaseException as err:
        queue.put(("error", repr(err)))


def test_children_forked_one_after_another_all_work(client: Client, ready_sandbox: str) -> None:
    # Before each fork the parent's runtime threads have just parked again
    # after a call: a child must never inherit wait-queue state that points
    # into the parent's thread stacks (glibc gives those stacks to the
    # child's new threads).
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    for n in range(6):
        assert client.exec(ready_sandbox, ["echo", f"parent-{n}"]).stdout_text == f"parent-{n}\n"
        child = ctx.Process(target=_child_busy, args=(client, ready_sandbox, queue))
        child.start()
        assert queue.get(timeout=60) == ("ok", ["0\n", "1\n", "2\n"])
        child.join(30)
        assert child.exitcode == 0


def test_a_forked_child_can_start_its_own_async_client(
    cluster: Cluster, ready_sandbox: str
) -> None:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_async, args=(cluster.endpoint, ready_sandbox, queue))
    child.start()
    assert queue.get(timeout=60) == ("ok", "async-child\n")
    child.join(30)
    assert child.exitcode == 0


def test_errors_cross_process_boundaries(client: Client) -> None:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_error, args=(client, queue))
    child.start()
    status, err = queue.get(timeout=60)
    child.join(30)
    assert status == "ok"
    assert isinstance(err, osdk.NotFoundError)
    assert err.code == "not_found" and err.grpc_status == osdk.GrpcStatus.NOT_FOUND
