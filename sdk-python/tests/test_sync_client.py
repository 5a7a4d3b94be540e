"""The sync Client against the real cluster: same operations, no event loop in sight."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time

import pytest
from conftest import marked_pids, process_running, unique
from sandbox_server import sandbox_echo

import openshell_sdk as osdk
from openshell_sdk import Client, proto


def test_no_event_loop_is_needed(client: Client) -> None:
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()
    assert client.health().status is osdk.ServiceStatus.HEALTHY


def test_sandbox_lifecycle(client: Client) -> None:
    name = unique("py-sync-life")
    created = client.sandboxes.create(name, env={"TOKEN": "env-secret"}, labels={"suite": "sync"})
    assert "env-secret" not in repr(created)
    assert client.sandboxes.wait_ready(name, timeout=60).is_ready
    assert client.sandboxes.get(name).name == name
    assert name in [s.name for s in client.sandboxes.list(label_selector="suite=sync")]
    with client.sandboxes.watch(name) as watch:
        assert next(iter(watch)).is_ready
    client.sandboxes.delete(name)
    client.sandboxes.wait_deleted(name, timeout=60)
    with pytest.raises(osdk.NotFoundError):
        client.sandboxes.delete(name)


def test_exec_and_stream(client: Client, ready_sandbox: str) -> None:
    result = client.exec(ready_sandbox, ["sh", "-c", "echo o-u-t; echo err >&2; exit 2"])
    assert (result.stdout_text, result.stderr_text, result.exit_code) == ("o-u-t\n", "err\n", 2)
    assert "o-u-t" not in repr(result)
    with client.exec_stream(ready_sandbox, ["sh", "-c", "printf a; printf b >&2"]) as stream:
        events = list(stream)
    assert events[-1] == osdk.ExecExit(0)
    assert stream.exit_code == 0
    assert b"".join(e.data for e in events if isinstance(e, osdk.ExecStdout)) == b"a"


def test_interactive(client: Client, ready_sandbox: str) -> None:
    with client.exec_interactive(ready_sandbox, ["sh", "-c", "read x; echo got:$x"]) as session:
        session.write("hi\n")
        result = session.wait()
    assert result.stdout == b"got:hi\n" and result.exit_code == 0
    with client.exec_interactive(ready_sandbox, ["cat"]) as session:
        session.write("eof")
        session.close_stdin()
        assert session.wait().stdout == b"eof"


def test_collect_past_the_cap_fails_with_output_limit(client: Client, ready_sandbox: str) -> None:
    stream = client.exec_stream(ready_sandbox, ["yes"], output_limit=1000)
    with stream, pytest.raises(osdk.OutputLimitError) as info:
        stream.collect()
    assert info.value.code == "output_limit"


def test_forward_is_a_context_manager(client: Client, ready_sandbox: str) -> None:
    # The forward's target: an echo server on the sandbox's own loopback.
    with sandbox_echo(client, ready_sandbox) as echo_port:
        with client.forward(ready_sandbox, echo_port) as fwd:
            host, port = fwd.local_address
            with socket.create_connection((host, port), timeout=10) as conn:
                conn.sendall(b"hello")
                conn.shutdown(socket.SHUT_WR)
                received = b""
                while chunk := conn.recv(4096):
                    received += chunk
            assert received == b"hello"
            assert fwd.stats().connections_accepted == 1
        assert fwd.closed


def test_raw_sync_stubs(client: Client, ready_sandbox: str) -> None:
    response = client.raw.get_sandbox(proto.GetSandboxRequest(name=ready_sandbox))
    assert response.sandbox.metadata.name == ready_sandbox
    with client.raw.exec_sandbox(
        proto.ExecSandboxRequest(sandbox=ready_sandbox, command=["echo", "x"])
    ) as stream:
        events = list(stream)
    assert events[-1].exit.exit_code == 0
    with pytest.raises(osdk.InvalidArgumentError) as info:
        client.raw.create_sandbox(proto.CreateSandboxRequest(name="Bad_Name"))
    assert info.value.grpc_status == osdk.GrpcStatus.INVALID_ARGUMENT


def test_the_gil_is_released_while_waiting(client: Client, ready_sandbox: str) -> None:
    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        started = time.monotonic()
        client.exec(ready_sandbox, ["sleep", "1"])
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        counter.join()
    # The counter ran all along: about one tick per millisecond of the wait.
    assert elapsed >= 1.0
    assert ticks > 200, ticks


def test_ctrl_c_cancels_the_call_and_kills_the_process(client: Client, ready_sandbox: str) -> None:
    """SIGINT to the process (any thread may take it) while a sync call waits
    raises KeyboardInterrupt and cancels the call: the sandbox process dies."""
    marker = unique("m")
    found: list[int] = []

    def interrupt() -> None:
        # Generous bounds: on a loaded machine the command may take a while to
        # show up; the command outlives them, so only a cancel ends it early.
        deadline = time.monotonic() + 100
        while not (pids := marked_pids(marker)):
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        found.extend(pids)
        os.kill(os.getpid(), signal.SIGINT)

    # A process started in the background by a shell without job control
    # inherits SIGINT ignored, and Python then installs no handler: install
    # the default one for this test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            client.exec(ready_sandbox, ["sleep", "150"], env={"TEST_MARKER": marker})
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 120
    assert found, "the command never started"
    deadline = time.monotonic() + 20
    while any(process_running(pid) for pid in found):
        assert time.monotonic() < deadline, f"processes {found} still run after Ctrl-C"
        time.sleep(0.1)
    # The client still works afterwards.
    assert client.exec(ready_sandbox, ["true"]).exit_code == 0


def test_calls_from_many_threads(client: Client, ready_sandbox: str) -> None:
    """Each thread's call waits on that thread; they run at the same time."""
    names: list[str] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            for _ in range(10):
                names.append(client.sandboxes.get(ready_sandbox).name)
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=call) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert names == [ready_sandbox] * 160


def test_no_helper_thread_runs_the_calls(client: Client, ready_sandbox: str) -> None:
    """The sync client starts no Python thread of its own (no background loop)."""
    before = {t.name for t in threading.enumerate()}
    assert client.sandboxes.get(ready_sandbox).name == ready_sandbox
    with client.exec_stream(ready_sandbox, ["echo", "x"]) as stream:
        assert [type(e).__name__ for e in stream][-1] == "ExecExit"
    after = {t.name for t in threading.enumerate()}
    assert "openshell-sdk-loop" not in after - before
