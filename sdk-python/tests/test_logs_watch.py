"""Sandbox logs and resuming watches against real clusters: the lines a sandbox's
supervisor records about execs and their filters, a log watch through the edge
that sees every exec's line exactly once while the sandbox's owner replica is
killed, the blocking client's iterator, and how a watch ends (terminal phase,
deleted sandbox, a cursor the gateway does not hold, close, cancellation)."""

from __future__ import annotations

import asyncio
import collections
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from openshell_sdk import (
    AsyncClient,
    Client,
    InvalidArgumentError,
    InvalidConfigError,
    LogEvent,
    LogLine,
    NotFoundError,
    OutOfRangeError,
    SandboxEvent,
    SandboxPhase,
    WatchEvent,
)
from openshell_sdk.testing import LocalCluster


def finished(lines: list[LogLine], code: int) -> LogLine | None:
    for line in lines:
        if line.message == "exec finished" and line.fields.get("exit_code") == str(code):
            return line
    return None


def test_an_exec_is_logged_and_the_filters_apply(client: Client, ready_sandbox: str) -> None:
    sandbox = ready_sandbox
    assert client.exec(sandbox, ["sh", "-c", "exit 7"]).exit_code == 7
    deadline = time.monotonic() + 15
    while (line := finished((logs := client.sandboxes.logs(sandbox)).lines, 7)) is None:
        assert time.monotonic() < deadline, f"no exec line: {logs.lines}"
        time.sleep(0.1)
    assert line.source == "sandbox" and line.level == "INFO"
    assert line.time is not None and abs(datetime.now(UTC) - line.time) < timedelta(minutes=5)
    printed = str(line)
    assert " INFO  sandbox exec finished" in printed and "exit_code=7" in printed, printed
    assert printed.startswith(line.time.strftime("%Y-%m-%dT%H:%M:%S."))
    assert any(line.source == "gateway" for line in logs.lines)

    only = client.sandboxes.logs(sandbox, sources="sandbox", min_level="info", tail=1)
    assert len(only.lines) == 1 and only.lines[0].source == "sandbox"
    assert only.buffer_total >= len(logs.lines)
    gateway = client.sandboxes.logs(sandbox, sources=["gateway"])
    assert gateway.lines and all(line.source == "gateway" for line in gateway.lines)
    recent = client.sandboxes.logs(sandbox, since=timedelta(minutes=10))
    assert finished(recent.lines, 7) is not None
    assert client.sandboxes.logs(sandbox, since=datetime.now(UTC) + timedelta(hours=1)).lines == []
    warnings = client.sandboxes.logs(sandbox, min_level="WARN")
    assert all(line.level in ("WARN", "ERROR") for line in warnings.lines)

    with pytest.raises(InvalidArgumentError) as caught:
        client.sandboxes.logs(sandbox, min_level="LOUD")
    assert caught.value.code == "invalid_argument"
    with pytest.raises(NotFoundError):
        client.sandboxes.logs("no-such-sandbox-py")
    with pytest.raises(InvalidConfigError):
        client.sandboxes.logs(sandbox, tail=-1)
    with pytest.raises(TypeError):
        client.sandboxes.logs(sandbox, since=12.5)  # type: ignore[arg-type]


def finished_codes(events: list[WatchEvent]) -> collections.Counter[int]:
    codes: collections.Counter[int] = collections.Counter()
    for event in events:
        if isinstance(event, LogEvent) and event.line.message == "exec finished":
            codes[int(event.line.fields["exit_code"])] += 1
    return codes


async def test_a_log_watch_sees_each_exec_once_while_the_owner_is_killed(
    openshell_cluster: LocalCluster,
) -> None:
    cluster = openshell_cluster
    async with AsyncClient(cluster.endpoint) as client:
        sandbox = (await client.sandboxes.create()).name
        await client.sandboxes.wait_ready(sandbox, timeout=60)
        events: list[WatchEvent] = []
        watch = client.sandboxes.events(sandbox, status=False, logs=True, sources="sandbox")

        async def follow() -> None:
            async for event in watch:
                events.append(event)

        follower = asyncio.ensure_future(follow())
        completed: list[int] = []

        async def run_execs(codes: range) -> None:
            for code in codes:
                try:
                    out = await client.exec(sandbox, ["sh", "-c", f"exit {code}"], timeout=20)
                except Exception:
                    continue  # the owner's death may cost an exec; its line may still come
                assert out.exit_code == code
                completed.append(code)

        await run_execs(range(1, 11))
        owner = await asyncio.to_thread(cluster.owner_of, sandbox)
        assert owner is not None
        await asyncio.to_thread(cluster.kill_replica, owner)
        await run_execs(range(11, 21))
        await asyncio.to_thread(cluster.start_replica, owner)
        await run_execs(range(21, 31))
        assert len(completed) >= 25, completed

        deadline = time.monotonic() + 30
        while not set(completed) <= set(finished_codes(events)):
            assert not follower.done(), follower.exception()
            assert time.monotonic() < deadline, (completed, finished_codes(events))
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.7)  # a line delivered twice would show now
        watch.close()
        await asyncio.wait_for(follower, 10)

        codes = finished_codes(events)
        assert [code for code, n in codes.items() if n > 1] == [], codes
        cursors = [event.cursor for event in events]
        assert cursors == sorted(cursors), "cursors went back"
        assert watch.cursor == cursors[-1]
        assert watch.resumes >= 1, "the owner kill never reached the watch"
        print(
            f"\nlog watch across an owner kill: {len(completed)} execs completed, each line "
            f"seen once, {watch.resumes} resumes"
        )
        await client.sandboxes.delete(sandbox)


def test_the_blocking_iterator_ends_on_terminal_and_resumes_after_a_cursor(
    client: Client,
) -> None:
    sandbox = client.sandboxes.create().name
    with client.sandboxes.events(sandbox, stop_on_terminal=True, timeout=60) as watch:
        phases = [event.sandbox.phase for event in watch if isinstance(event, SandboxEvent)]
    assert phases[-1] is SandboxPhase.READY, phases
    cursor = watch.cursor
    assert cursor is not None

    # After the cursor: no snapshot first, exactly what came later (bounded:
    # 60 s for the whole watch, at most 500 events).
    client.exec(sandbox, ["sh", "-c", "exit 5"])
    with client.sandboxes.events(
        sandbox, status=False, logs=True, sources="sandbox", resume_after=cursor, timeout=60
    ) as watch:
        seen: list[WatchEvent] = []
        for event in watch:
            seen.append(event)
            if finished_codes(seen)[5] or len(seen) >= 500:
                break
    assert finished_codes(seen)[5] == 1, seen
    assert not [e for e in seen if isinstance(e, SandboxEvent)], seen
    assert all(e.cursor > cursor for e in seen)
    assert watch.closed

    # A cursor ahead of the gateway's event log: the watch ends with out_of_range.
    space, _ = cursor.split(".")
    with (
        pytest.raises(OutOfRangeError) as caught,
        client.sandboxes.events(sandbox, resume_after=f"{space}.{10**18:020d}") as watch,
    ):
        next(iter(watch))
    assert caught.value.code == "out_of_range"
    client.sandboxes.delete(sandbox)


async def test_a_watch_ends_when_the_sandbox_is_deleted_and_on_close_or_cancel(
    aclient: AsyncClient,
) -> None:
    sandbox = (await aclient.sandboxes.create()).name
    await aclient.sandboxes.wait_ready(sandbox, timeout=60)

    # Cancelling the task that waits for an event ends it quietly.
    watch = aclient.sandboxes.events(sandbox)
    first = await watch.__anext__()
    assert isinstance(first, SandboxEvent) and first.sandbox.name == sandbox
    # An event arriving in the 0.2 s is taken and the wait starts again
    # (bounded): only a wait still pending is what this cancels.
    for _ in range(20):
        waiting = asyncio.ensure_future(watch.__anext__())
        await asyncio.sleep(0.2)
        if not waiting.done():
            break
        await waiting
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    watch.close()
    with pytest.raises(StopAsyncIteration):
        await watch.__anext__()

    # Closing from elsewhere stops an iteration that waits: closed once the
    # snapshot came, when the iteration waits for the next event.
    async with aclient.sandboxes.events(sandbox) as watch:
        got: list[WatchEvent] = []
        snapshot = asyncio.Event()

        async def follow() -> None:
            async for event in watch:
                got.append(event)
                snapshot.set()

        follower = asyncio.ensure_future(follow())
        await asyncio.wait_for(snapshot.wait(), 60)
        watch.close()
        await asyncio.wait_for(follower, 10)
    assert isinstance(got[0], SandboxEvent) and got[0].sandbox.name == sandbox, got

    # A deleted sandbox ends the watch with not_found.
    watch = aclient.sandboxes.events(sandbox)
    assert isinstance(await watch.__anext__(), SandboxEvent)
    await aclient.sandboxes.delete(sandbox)

    async def drain() -> None:
        async for _ in watch:
            pass

    with pytest.raises(NotFoundError):
        await asyncio.wait_for(drain(), 60)
    with pytest.raises(InvalidConfigError):
        aclient.sandboxes.events(sandbox, status=False, logs=False)
    # Log filters without logs=True, as in TypeScript: refused before any I/O.
    filters: list[dict[str, Any]] = [
        {"tail": 3},
        {"since": timedelta(minutes=1)},
        {"sources": "sandbox"},
        {"min_level": "INFO"},
    ]
    for only in filters:
        with pytest.raises(InvalidConfigError, match="logs=True") as refused:
            aclient.sandboxes.events(sandbox, **only)
        assert refused.value.code == "invalid_config"
