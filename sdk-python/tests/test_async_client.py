"""AsyncClient against a real 3-replica cluster (edge + replicas + supervisors)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest
from conftest import Cluster, marked_pids, process_running, unique
from sandbox_server import async_sandbox_echo

import openshell_sdk as osdk
from openshell_sdk import AsyncClient, proto


async def test_health_names_the_replica(aclient: AsyncClient) -> None:
    health = await aclient.health()
    assert health.status is osdk.ServiceStatus.HEALTHY
    assert health.served_by is not None and health.served_by.startswith("gw-")


async def test_sandbox_lifecycle(aclient: AsyncClient) -> None:
    name = unique("py-life")
    created = await aclient.sandboxes.create(name, labels={"suite": "pytest-async"})
    assert created.name == name
    assert created.phase in (osdk.SandboxPhase.PROVISIONING, osdk.SandboxPhase.READY)
    ready = await aclient.sandboxes.wait_ready(name, timeout=60)
    assert ready.is_ready and ready.id == created.id
    got = await aclient.sandboxes.get(name)
    assert got.phase is osdk.SandboxPhase.READY
    assert got.labels["suite"] == "pytest-async"
    assert isinstance(got.proto, proto.Sandbox)
    listed = await aclient.sandboxes.list(label_selector="suite=pytest-async")
    assert name in [s.name for s in listed]

    watch = aclient.sandboxes.watch(name)
    async with watch:
        first = await anext(watch)
        assert first.name == name and first.is_ready

    outcome = await aclient.sandboxes.delete(name)
    assert outcome in (osdk.DeletionOutcome.COMPLETED, osdk.DeletionOutcome.ACCEPTED)
    await aclient.sandboxes.wait_deleted(name, timeout=60)
    with pytest.raises(osdk.NotFoundError) as info:
        await aclient.sandboxes.get(name)
    assert info.value.code == "not_found"
    assert info.value.grpc_status == osdk.GrpcStatus.NOT_FOUND
    assert info.value.served_by is not None


async def test_exec_buffered(aclient: AsyncClient, ready_sandbox: str) -> None:
    result = await aclient.exec(
        ready_sandbox,
        ["sh", "-c", 'cat; printf ":%s" "$GREETING"; printf err >&2; exit 3'],
        stdin=b"in",
        env={"GREETING": "hi"},
    )
    assert result.stdout == b"in:hi"
    assert result.stderr == b"err"
    assert result.exit_code == 3 and not result.success


async def test_exec_exit_codes(aclient: AsyncClient, ready_sandbox: str) -> None:
    killed = await aclient.exec(ready_sandbox, ["sh", "-c", "kill -TERM $$"])
    assert killed.exit_code == 128 + 15
    missing = await aclient.exec(ready_sandbox, ["definitely-not-a-program-xyz"])
    assert missing.exit_code == 127 and missing.stderr
    timed_out = await aclient.exec(ready_sandbox, ["sleep", "10"], exec_timeout=0.5)
    assert timed_out.exit_code == 124


async def test_exec_output_limit(aclient: AsyncClient, ready_sandbox: str) -> None:
    with pytest.raises(osdk.OutputLimitError) as info:
        await aclient.exec(ready_sandbox, ["head", "-c", "100000", "/dev/zero"], output_limit=1000)
    assert info.value.code == "output_limit"


async def test_exec_stream_ends_with_exit(aclient: AsyncClient, ready_sandbox: str) -> None:
    events = []
    async with aclient.exec_stream(
        ready_sandbox,
        ["sh", "-c", "echo 1; sleep 0.2; echo 2 >&2; sleep 0.2; echo 3; exit 5"],
    ) as stream:
        async for event in stream:
            events.append(event)
    assert isinstance(events[-1], osdk.ExecExit) and events[-1].exit_code == 5
    assert sum(isinstance(e, osdk.ExecExit) for e in events) == 1
    stdout = b"".join(e.data for e in events if isinstance(e, osdk.ExecStdout))
    stderr = b"".join(e.data for e in events if isinstance(e, osdk.ExecStderr))
    assert (stdout, stderr) == (b"1\n3\n", b"2\n")
    assert stream.exit_code == 5


async def test_exec_stream_batches_large_output(aclient: AsyncClient, ready_sandbox: str) -> None:
    size = 8 * 1024 * 1024
    result = await aclient.exec_stream(
        ready_sandbox, ["head", "-c", str(size), "/dev/urandom"]
    ).collect()
    assert len(result.stdout) == size and result.exit_code == 0


async def test_interactive_with_tty(aclient: AsyncClient, ready_sandbox: str) -> None:
    async with await aclient.exec_interactive(
        ready_sandbox,
        ["sh", "-c", 'stty size; read line; stty size; echo "got:$line"; exit 7'],
        tty=True,
        cols=80,
        rows=24,
    ) as session:
        output = bytearray()

        async def until(text: bytes) -> None:
            while text not in output:
                event = await session.next_event()
                assert event is not None, output
                if isinstance(event, osdk.ExecStdout | osdk.ExecStderr):
                    output.extend(event.data)

        await asyncio.wait_for(until(b"24 80"), 30)
        await session.resize(100, 30)
        await session.write("hello\n")
        rest = await asyncio.wait_for(session.wait(), 30)
        output.extend(rest.stdout)
        assert rest.exit_code == 7
        assert b"got:hello" in output and b"30 100" in output


async def test_interactive_stdin_eof(aclient: AsyncClient, ready_sandbox: str) -> None:
    session = await aclient.exec_interactive(ready_sandbox, ["cat"])
    await session.write(b"abc")
    await session.close_stdin()
    await session.close_stdin()  # idempotent
    result = await asyncio.wait_for(session.wait(), 30)
    assert (result.stdout, result.exit_code) == (b"abc", 0)


async def wait_gone(pids: list[int], what: str) -> None:
    deadline = time.monotonic() + 20
    while any(process_running(pid) for pid in pids):
        assert time.monotonic() < deadline, f"processes {pids} still run after {what}"
        await asyncio.sleep(0.1)


async def test_collect_past_the_cap_fails_with_output_limit_and_stops_the_process(
    aclient: AsyncClient, ready_sandbox: str
) -> None:
    marker = unique("m")
    stream = aclient.exec_stream(
        ready_sandbox,
        ["sh", "-c", "echo started; exec yes"],
        env={"TEST_MARKER": marker},
        output_limit=64 * 1024,
    )
    first = await asyncio.wait_for(anext(stream), 30)
    assert isinstance(first, osdk.ExecStdout)
    pids = marked_pids(marker)
    assert pids, "the command is not running"
    with pytest.raises(osdk.OutputLimitError) as info:
        await asyncio.wait_for(stream.collect(), 30)
    assert info.value.code == "output_limit"
    assert "65536 bytes" in str(info.value)
    assert stream.finished
    await wait_gone(pids, "the output cap")
    # Under the cap, collect() gathers what was not handed out yet.
    result = await aclient.exec_stream(
        ready_sandbox, ["sh", "-c", "echo out; echo err >&2; exit 3"], output_limit=1000
    ).collect()
    assert (result.stdout, result.stderr, result.exit_code) == (b"out\n", b"err\n", 3)


async def test_interactive_wait_past_the_cap_fails_with_output_limit(
    aclient: AsyncClient, ready_sandbox: str
) -> None:
    marker = unique("m")
    session = await aclient.exec_interactive(
        ready_sandbox,
        ["sh", "-c", "read line; exec yes"],
        env={"TEST_MARKER": marker},
        output_limit=4096,
    )
    async with session:
        deadline = time.monotonic() + 30
        while not (pids := marked_pids(marker)):
            assert time.monotonic() < deadline, "the command never started"
            await asyncio.sleep(0.05)
        await session.write("go\n")
        with pytest.raises(osdk.OutputLimitError) as info:
            await asyncio.wait_for(session.wait(), 30)
        assert info.value.code == "output_limit"
    await wait_gone(pids, "the output cap")


async def test_forward_concurrent_connections(aclient: AsyncClient, ready_sandbox: str) -> None:
    # The forward's target: an echo server on the sandbox's own loopback.
    async with async_sandbox_echo(aclient, ready_sandbox) as port:
        async with await aclient.forward(ready_sandbox, port) as fwd:
            host, local_port = fwd.local_address
            assert host == "127.0.0.1" and local_port > 0

            async def roundtrip(i: int) -> bool:
                payload = os.urandom(200_000) + bytes([i])
                reader, writer = await asyncio.open_connection(host, local_port)
                writer.write(payload)
                await writer.drain()
                writer.write_eof()
                echoed = await reader.read()
                writer.close()
                return echoed == payload

            results = await asyncio.wait_for(asyncio.gather(*(roundtrip(i) for i in range(8))), 60)
            assert all(results)
            stats = fwd.stats()
            assert stats.connections_accepted >= 8
            assert stats.bytes_out >= 8 * 200_000 and stats.bytes_in >= 8 * 200_000
        assert fwd.closed
        with pytest.raises(OSError):
            socket.create_connection((host, local_port), timeout=2).close()


async def test_cancelling_a_task_kills_the_sandbox_process(
    aclient: AsyncClient, ready_sandbox: str
) -> None:
    marker = unique("m")
    task = asyncio.create_task(
        aclient.exec(ready_sandbox, ["sleep", "60"], env={"TEST_MARKER": marker})
    )
    deadline = time.monotonic() + 30
    while not (pids := marked_pids(marker)):
        assert time.monotonic() < deadline, "the command never started"
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 20
    while any(process_running(pid) for pid in pids):
        assert time.monotonic() < deadline, f"processes {pids} still run after the cancel"
        await asyncio.sleep(0.1)


async def test_cancelling_an_exec_stream_kills_the_process(
    aclient: AsyncClient, ready_sandbox: str
) -> None:
    marker = unique("m")
    stream = aclient.exec_stream(
        ready_sandbox, ["sh", "-c", "echo started; exec sleep 60"], env={"TEST_MARKER": marker}
    )
    async with stream:
        first = await anext(stream)
        assert isinstance(first, osdk.ExecStdout)
        pids = marked_pids(marker)
        assert pids, "the command is not running"
    deadline = time.monotonic() + 20
    while any(process_running(pid) for pid in pids):
        assert time.monotonic() < deadline, f"processes {pids} still run after the cancel"
        await asyncio.sleep(0.1)


async def test_timeouts_are_deadlines(aclient: AsyncClient, ready_sandbox: str) -> None:
    with pytest.raises(osdk.DeadlineExceededError) as info:
        await aclient.exec(ready_sandbox, ["sleep", "10"], timeout=0.5)
    assert info.value.code == "deadline_exceeded"


async def test_close_cancels_calls_in_flight(cluster: Cluster, ready_sandbox: str) -> None:
    client = AsyncClient(cluster.endpoint)
    running = asyncio.create_task(client.exec(ready_sandbox, ["sleep", "30"]))
    await asyncio.sleep(0.5)
    await client.close()
    with pytest.raises(osdk.CallCancelledError):
        await asyncio.wait_for(running, 10)
    with pytest.raises(osdk.CallCancelledError):
        await client.health()
    assert client.closed


async def test_raw_unary_with_owner_metadata(aclient: AsyncClient, ready_sandbox: str) -> None:
    answer = await aclient.raw.get_sandbox_with_metadata(
        proto.GetSandboxRequest(name=ready_sandbox),
        metadata=[("x-openshell-want-owner", "1")],
    )
    assert isinstance(answer.message, proto.SandboxResponse)
    assert answer.message.sandbox.metadata.name == ready_sandbox
    owner = answer.get("x-openshell-owner")
    assert owner is not None and owner.startswith("gw-")
    assert answer.served_by is not None
    health = await aclient.raw.health(proto.HealthRequest())
    assert health.status == proto.SERVICE_STATUS_HEALTHY


async def test_raw_server_stream_exec(aclient: AsyncClient, ready_sandbox: str) -> None:
    stream = aclient.raw.exec_sandbox(
        proto.ExecSandboxRequest(sandbox=ready_sandbox, command=["echo", "raw"])
    )
    events = [event async for event in stream]
    assert events[-1].WhichOneof("payload") == "exit"
    assert b"".join(e.stdout.data for e in events if e.HasField("stdout")) == b"raw\n"
    assert any(k == "x-openshell-served-by" for k, _ in await stream.response_metadata())


async def test_raw_bidi_forward_tcp(aclient: AsyncClient, ready_sandbox: str) -> None:
    # The relay's target: an echo server on the sandbox's own loopback.
    async with (
        async_sandbox_echo(aclient, ready_sandbox) as port,
        aclient.raw.forward_tcp() as stream,
    ):
        await stream.send(
            proto.TcpForwardFrame(
                init=proto.TcpForwardInit(
                    sandbox=ready_sandbox,
                    tcp=proto.TcpRelayTarget(host="127.0.0.1", port=port),
                )
            )
        )
        await stream.send(proto.TcpForwardFrame(data=b"ping"))
        await stream.close_send()
        received = b""
        async for frame in stream:
            if frame.HasField("data"):
                received += frame.data
        assert received == b"ping"


async def test_raw_errors_are_typed(aclient: AsyncClient) -> None:
    with pytest.raises(osdk.InvalidArgumentError):
        await aclient.raw.list_sandboxes(proto.ListSandboxesRequest(page_size=-1))
    stream = aclient.raw.exec_sandbox_interactive()
    await stream.send(proto.ExecSandboxInput(stdin=b"hi"))
    await stream.close_send()
    with pytest.raises(osdk.InvalidArgumentError):
        await stream.recv()


async def test_every_rpc_has_a_typed_stub(aclient: AsyncClient) -> None:
    for method in osdk.METHODS:
        snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in method.name).lstrip("_")
        assert callable(getattr(aclient.raw, snake)), method.name
        if method.kind == "unary":
            assert callable(getattr(aclient.raw, f"{snake}_with_metadata"))
    names = {m.name for m in osdk.METHODS}
    assert {"ExecSandbox", "ForwardTcp", "ConnectSupervisor"} <= names
    routed = {m.name: m.owner_routed_field for m in osdk.METHODS if m.owner_routed_field}
    assert routed == {
        "ExecSandbox": "sandbox",
        "ExecSandboxInteractive": "start.sandbox",
        "ForwardTcp": "init.sandbox",
    }


async def test_routing_counters_when_the_core_has_them(
    aclient: AsyncClient, ready_sandbox: str
) -> None:
    before = aclient.routing_stats()
    if before is None:
        pytest.skip("the core client has no routing counters yet")
    for _ in range(3):
        assert (await aclient.exec(ready_sandbox, ["true"])).exit_code == 0
    after = aclient.routing_stats()
    assert after is not None
    assert after.hinted + after.unhinted >= before.hinted + before.unhinted + 3
    assert after.unrouted_retries == before.unrouted_retries


async def test_many_concurrent_calls(aclient: AsyncClient, ready_sandbox: str) -> None:
    results = await asyncio.gather(
        *(aclient.exec(ready_sandbox, ["echo", str(i)]) for i in range(20))
    )
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(20)]


async def test_calls_settle_on_the_loop_that_made_them(
    cluster: Cluster, aclient: AsyncClient, ready_sandbox: str
) -> None:
    """Results reach each event loop through its own waker: calls from a loop
    in another thread complete there, while this loop's calls complete here."""
    results: list[str] = []

    def other_loop() -> None:
        async def calls() -> list[str]:
            async with AsyncClient(cluster.endpoint) as client:
                got = await asyncio.gather(
                    *(client.sandboxes.get(ready_sandbox) for _ in range(50))
                )
                return [s.name for s in got]

        results.extend(asyncio.run(calls()))

    thread = threading.Thread(target=other_loop)
    thread.start()
    here = await asyncio.gather(*(aclient.sandboxes.get(ready_sandbox) for _ in range(200)))
    await asyncio.to_thread(thread.join, 60)
    assert not thread.is_alive()
    assert [s.name for s in here] == [ready_sandbox] * 200
    assert results == [ready_sandbox] * 50


async def test_a_cancelled_call_leaves_the_others_alone(
    aclient: AsyncClient, ready_sandbox: str
) -> None:
    """A task cancelled while its result may already be queued is cancelled
    (not settled), and calls completing in the same wake-up still settle."""
    for _ in range(20):
        tasks = [asyncio.create_task(aclient.sandboxes.get(ready_sandbox)) for _ in range(10)]
        await asyncio.sleep(0)
        tasks[0].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[0], asyncio.CancelledError) or done[0].name == ready_sandbox
        assert all(not isinstance(d, BaseException) and d.name == ready_sandbox for d in done[1:])


async def test_a_core_error_settles_the_future_with_its_exception(aclient: AsyncClient) -> None:
    """A core error raised by a spawned future arrives as the typed exception."""
    with pytest.raises(osdk.NotFoundError):
        await aclient.sandboxes.get(unique("missing"))
