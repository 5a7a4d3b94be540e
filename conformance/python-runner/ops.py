"""The ops of ``scenarios.json`` but ``config_session`` (in ``config_ops``).

Each op performs a step and returns the observed ``result`` object; an SDK
error propagates as is, ``StepFailed`` says the step could not be carried out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format
from observe import text

import openshell_sdk as osdk
from openshell_sdk import AsyncClient
from openshell_sdk._proto import openshell_pb2

if TYPE_CHECKING:
    from runner import Runner

Result = dict[str, Any]


class StepFailed(Exception):
    """The runner could not carry the step out (not an SDK error)."""


async def create_sandbox(r: Runner, step: dict[str, Any]) -> Result:
    name = r.target(step)
    s = await r.client.sandboxes.create(name, env=step.get("env"), labels=step.get("labels"))
    if "sandbox" in step:
        r.ready.discard(step["sandbox"])
    return {"name": s.name, "phase": s.phase.name, "labels": dict(s.labels)}


async def wait_ready(r: Runner, step: dict[str, Any]) -> Result:
    s = await r.client.sandboxes.wait_ready(r.target(step), timeout=step.get("timeout"))
    return {"name": s.name, "phase": s.phase.name}


async def get_sandbox(r: Runner, step: dict[str, Any]) -> Result:
    s = await r.client.sandboxes.get(r.target(step))
    return {"name": s.name, "phase": s.phase.name}


async def list_sandboxes(r: Runner, step: dict[str, Any]) -> Result:
    found = await r.client.sandboxes.list(label_selector=step.get("label_selector"))
    return {"names": [s.name for s in found]}


async def delete_sandbox(r: Runner, step: dict[str, Any]) -> Result:
    await r.client.sandboxes.delete(r.target(step))
    return {}


async def wait_deleted(r: Runner, step: dict[str, Any]) -> Result:
    await r.client.sandboxes.wait_deleted(r.target(step), timeout=step.get("timeout"))
    return {}


async def client_health(r: Runner, step: dict[str, Any]) -> Result:
    async with AsyncClient(step["endpoint"], connect_timeout=2) as other:
        await other.health()
    return {}


async def run_exec(r: Runner, step: dict[str, Any]) -> osdk.ExecResult:
    stdin: bytes | None = step["stdin"].encode() if "stdin" in step else None
    if "stdin_size" in step:
        stdin = b"\0" * int(step["stdin_size"])
    return await r.client.exec(
        r.target(step),
        step["command"],
        env=step.get("env"),
        stdin=stdin,
        exec_timeout=step.get("exec_timeout"),
    )


async def exec_(r: Runner, step: dict[str, Any]) -> Result:
    out = await run_exec(r, step)
    return {**text("stdout", out.stdout), **text("stderr", out.stderr), "exit_code": out.exit_code}


async def exec_stream(r: Runner, step: dict[str, Any]) -> Result:
    events: list[osdk.ExecEvent] = []
    async with r.client.exec_stream(r.target(step), step["command"]) as stream:
        async for event in stream:
            events.append(event)
    kinds = {osdk.ExecStdout: "stdout", osdk.ExecStderr: "stderr", osdk.ExecExit: "exit"}
    return {
        **text("stdout", b"".join(e.data for e in events if isinstance(e, osdk.ExecStdout))),
        **text("stderr", b"".join(e.data for e in events if isinstance(e, osdk.ExecStderr))),
        "exit_code": stream.exit_code,
        "events": len(events),
        "exit_events": sum(isinstance(e, osdk.ExecExit) for e in events),
        "last_event": kinds[type(events[-1])] if events else None,
    }


async def exec_repeat(r: Runner, step: dict[str, Any]) -> Result:
    runs = []
    for _ in range(step["count"]):
        out = await run_exec(r, step)
        runs.append({**text("stdout", out.stdout), "exit_code": out.exit_code})
    return {"runs": runs}


def counters(r: Runner) -> dict[str, int]:
    stats = r.client.routing_stats()
    return {"hinted": stats.hinted, "unrouted_retry": stats.unrouted_retries}


async def routing_stats_delta(r: Runner, step: dict[str, Any]) -> Result:
    before = counters(r)
    for _ in range(step["count"]):
        await r.client.exec(r.target(step), step["command"])
    return {"routing_before": before, "routing_after": counters(r)}


CONTROL_TIMEOUT = 30.0  # the harness answers once its edge reloaded (within 10 s)


async def ask_harness(control: str, request: str) -> None:
    """One line to the harness's control port (README: "Replica control");
    its answer must be ``ok``."""
    host, _, port = control.rpartition(":")

    async def exchange() -> str:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(request.encode() + b"\n")
            await writer.drain()
            return (await reader.readline()).decode(errors="replace").strip()
        finally:
            writer.close()

    try:
        answer = await asyncio.wait_for(exchange(), CONTROL_TIMEOUT)
    except TimeoutError:
        raise StepFailed(f"the harness did not answer {request!r} in 30 s") from None
    if answer != "ok":
        raise StepFailed(f"the harness refused {request!r}: {answer}")


async def unroute_owner_then_exec(r: Runner, step: dict[str, Any]) -> Result:
    """The unrouted retry: the harness points the owner's route at a dead
    port, the exec goes out hinted to it, and the routes are restored after."""
    if r.control is None:
        raise StepFailed("no OPENSHELL_CONFORMANCE_CONTROL: no replica control")
    name = r.target(step)
    answer = await r.client.raw.get_sandbox_with_metadata(
        openshell_pb2.GetSandboxRequest(name=name), metadata=[("x-openshell-want-owner", "1")]
    )
    owner = next((v for k, v in answer.metadata if k == "x-openshell-owner"), None)
    if owner is None:
        raise StepFailed(f"GetSandbox {name} named no owner replica")
    await ask_harness(r.control, f"unroute {owner}")
    before = counters(r)
    try:
        result = await exec_(r, step)
    finally:
        after = counters(r)
        await ask_harness(r.control, "restore")
    return {
        **result,
        "unrouted_replica": owner,
        "routing_before": before,
        "routing_after": after,
    }


async def interactive(r: Runner, step: dict[str, Any]) -> Result:
    """Runs the actions in order (``wait_output`` reads until the text has
    appeared), then reads to the exit."""
    session = await r.client.exec_interactive(
        r.target(step),
        step["command"],
        tty=step.get("tty", False),
        cols=step.get("cols", 80),
        rows=step.get("rows", 24),
    )
    output, stdout = bytearray(), bytearray()
    async with session:
        for action in step.get("actions", []):
            if "wait_output" in action:
                wanted = action["wait_output"].encode()
                while wanted not in output:
                    event = await session.next_event()
                    if event is None or isinstance(event, osdk.ExecExit):
                        raise StepFailed(f"the process ended before {wanted!r}")
                    output.extend(event.data)
                    if isinstance(event, osdk.ExecStdout):
                        stdout.extend(event.data)
            elif "resize" in action:
                await session.resize(*action["resize"])
            elif "write" in action:
                await session.write(action["write"])
            elif action.get("close_stdin"):
                await session.close_stdin()
        rest = await session.wait()
    output.extend(rest.stdout + rest.stderr)
    stdout.extend(rest.stdout)
    return {**text("stdout", stdout), **text("output", output), "exit_code": rest.exit_code}


ECHO_SCRIPT = Path(__file__).resolve().parents[2] / "testkit" / "scripts" / "sandbox-echo.py"
LISTENING_WITHIN = 30.0  # how long the echo server may take to say it listens
STOP_WITHIN = 10.0  # how long its exec stream may take to end once cancelled


@contextlib.asynccontextmanager
async def sandbox_echo(r: Runner, sandbox: str) -> AsyncIterator[int]:
    """A TCP echo server inside ``sandbox`` (its own loopback):
    ``testkit/scripts/sandbox-echo.py`` through an exec stream. Yields the port
    of its ``listening PORT`` line; the stream is cancelled at the end (the
    gateway kills the process group)."""
    stream = r.client.exec_stream(sandbox, ["python3", "-c", ECHO_SCRIPT.read_text()])
    stdout, stderr = bytearray(), bytearray()

    async def listening() -> int:
        async for event in stream:
            if isinstance(event, osdk.ExecStdout):
                stdout.extend(event.data)
                line, newline, _ = bytes(stdout).partition(b"\n")
                if newline:
                    if (found := re.fullmatch(rb"listening (\d+)", line)) is None:
                        raise StepFailed(f"the echo server said {line!r}")
                    return int(found[1])
            elif isinstance(event, osdk.ExecStderr):
                stderr.extend(event.data)
            else:
                raise StepFailed(
                    f"the echo server exited with {event.exit_code}: {text_of(stderr)}"
                )
        raise StepFailed(f"the echo server's exec stream ended: {text_of(stderr)}")

    try:
        try:
            port = await asyncio.wait_for(listening(), LISTENING_WITHIN)
        except TimeoutError:
            raise StepFailed(
                f"the echo server did not listen within {LISTENING_WITHIN:g} s: {text_of(stderr)}"
            ) from None
        yield port
    finally:
        stream.cancel()
        # The cancel ends the stream: a read after it fails (or sees the end).
        with contextlib.suppress(osdk.OpenShellError, TimeoutError):
            await asyncio.wait_for(stream.next_event(), STOP_WITHIN)


def text_of(data: bytearray) -> str:
    return data.decode(errors="replace")[-2000:] or "(no stderr)"


async def forward(r: Runner, step: dict[str, Any]) -> Result:
    if "remote_port" in step:
        (await r.client.forward(r.target(step), step["remote_port"])).close()
        return {}
    sandbox = r.target(step)
    async with sandbox_echo(r, sandbox) as echo_port:
        size = step["bytes_per_connection"]
        async with await r.client.forward(sandbox, echo_port) as fwd:
            host, port = fwd.local_address

            async def roundtrip(i: int) -> bool:
                payload = os.urandom(size - 1) + bytes([i % 256])
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(payload)
                await writer.drain()
                writer.write_eof()
                echoed = await reader.read()
                writer.close()
                return echoed == payload

            tries = (roundtrip(i) for i in range(step["connections"]))
            echoed = await asyncio.gather(*tries, return_exceptions=True)
            accepted = fwd.stats().connections_accepted
        try:
            socket.create_connection((host, port), timeout=2).close()
            refuses = False
        except OSError:
            refuses = True
        return {
            "echoed": [e is True for e in echoed],
            "accepted": accepted,
            "closed_refuses": refuses,
        }


def snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


def message(r: Runner, method: str, body: dict[str, Any]) -> Any:
    """A request message of ``method`` from the scenario's proto JSON."""
    service = openshell_pb2.DESCRIPTOR.services_by_name["OpenShell"]
    cls = getattr(openshell_pb2, service.methods_by_name[method].input_type.name)
    return json_format.ParseDict(r.subst(body), cls())


async def raw_unary(r: Runner, step: dict[str, Any]) -> Result:
    request = message(r, step["method"], step.get("request", {}))
    call = getattr(r.client.raw, snake(step["method"]) + "_with_metadata")
    answer = await call(request, metadata=[tuple(p) for p in step.get("metadata", [])])
    response = json_format.MessageToDict(answer.message, preserving_proto_field_name=True)
    return {"metadata": [list(p) for p in answer.metadata], "response": response}


async def raw_stream(r: Runner, step: dict[str, Any]) -> Result:
    """Sends the step's messages, half-closes, and reads to the end."""
    method = step["method"]
    info = next(m for m in osdk.METHODS if m.name == method)
    messages = [message(r, method, m) for m in step["messages"]]
    stub = getattr(r.client.raw, snake(method))
    if info.kind == "server_streaming":
        stream = stub(messages[0])
    else:
        stream = stub()
        for m in messages:
            await stream.send(m)
        await stream.close_send()
    return {"received": len([m async for m in stream])}


async def write_file(r: Runner, step: dict[str, Any]) -> Result:
    path, content = r.subst(step["path"]), r.subst(step.get("content", ""))
    summary = await r.client.write_file(r.target(step), path, content)
    return {"bytes": summary.bytes}


async def read_file(r: Runner, step: dict[str, Any]) -> Result:
    data = await r.client.read_file(r.target(step), r.subst(step["path"]))
    return text("content", data)


async def file_round_trip(r: Runner, step: dict[str, Any]) -> Result:
    """Random bytes to a local file, uploaded by path, downloaded by path to
    another, compared."""
    name, remote = r.target(step), r.subst(step["remote"])
    data = os.urandom(step.get("size", 0))
    with tempfile.TemporaryDirectory() as tmp:
        sent, back = Path(tmp) / "sent.bin", Path(tmp) / "back.bin"
        sent.write_bytes(data)
        summary = await r.client.upload(name, sent, remote)
        await r.client.download(name, remote, back)
        return {"bytes": summary.bytes, "same": back.read_bytes() == data}


LOGS_WAIT = 15.0
WATCH_WAIT = 20.0
# Quiet time after the first event before watch_logs runs its command.
SETTLE = 1.0
# How long watch_logs waits for that quiet at most.
SETTLE_LIMIT = 60.0


async def logs(r: Runner, step: dict[str, Any]) -> Result:
    name, wait_for = r.target(step), step.get("wait_for")
    sources = [step["source"]] if "source" in step else None
    deadline = asyncio.get_running_loop().time() + LOGS_WAIT
    while True:
        got = await r.client.sandboxes.logs(
            name, tail=step.get("tail"), sources=sources, min_level=step.get("min_level")
        )
        messages = [line.message for line in got.lines]
        if wait_for is None or wait_for in messages or asyncio.get_running_loop().time() > deadline:
            return {"messages": messages, "sources": [line.source for line in got.lines]}
        await asyncio.sleep(0.2)


async def watch_logs(r: Runner, step: dict[str, Any]) -> Result:
    """Follows the sandbox's supervisor lines, lets earlier steps' lines
    arrive, runs the command, and reads until its own exec line."""
    name, command = r.target(step), list(step["command"])
    watch = r.client.sandboxes.events(name, status=False, logs=True, sources=["sandbox"])
    events = aiter(watch)
    try:
        first = await asyncio.wait_for(anext(events), WATCH_WAIT)
        last, ordered = first.cursor, True
        settle_by = asyncio.get_running_loop().time() + SETTLE_LIMIT
        while True:
            if asyncio.get_running_loop().time() > settle_by:
                raise StepFailed(
                    f"the watch did not go quiet for {SETTLE:.0f} s within {SETTLE_LIMIT:.0f} s"
                )
            try:
                event = await asyncio.wait_for(anext(events), SETTLE)
            except TimeoutError:
                break
            ordered &= event.cursor >= last
            last = event.cursor
        opened = last
        await r.client.exec(name, command)
        deadline = asyncio.get_running_loop().time() + WATCH_WAIT
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise StepFailed(f"no exec line within {WATCH_WAIT:.0f} s")
            event = await asyncio.wait_for(anext(events), left)
            ordered &= event.cursor >= last
            last = event.cursor
            if (
                isinstance(event, osdk.LogEvent)
                and event.line.message == "exec finished"
                and event.line.fields.get("argv0") == command[0]
                and event.cursor > opened
            ):
                code = int(event.line.fields["exit_code"])
                return {"finished_exit_code": code, "cursors_ordered": ordered}
    finally:
        watch.close()


async def watch_events(r: Runner, step: dict[str, Any]) -> Result:
    watch = r.client.sandboxes.events(r.target(step), resume_after=step.get("resume_after"))
    try:
        first = await asyncio.wait_for(anext(aiter(watch)), WATCH_WAIT)
    finally:
        watch.close()
    return {"first": "log" if isinstance(first, osdk.LogEvent) else "sandbox"}


OPS: dict[str, Callable[[Runner, dict[str, Any]], Awaitable[Result]]] = {
    "create_sandbox": create_sandbox,
    "wait_ready": wait_ready,
    "get_sandbox": get_sandbox,
    "list_sandboxes": list_sandboxes,
    "delete_sandbox": delete_sandbox,
    "wait_deleted": wait_deleted,
    "client_health": client_health,
    "exec": exec_,
    "exec_stream": exec_stream,
    "exec_repeat": exec_repeat,
    "routing_stats_delta": routing_stats_delta,
    "unroute_owner_then_exec": unroute_owner_then_exec,
    "interactive": interactive,
    "forward": forward,
    "raw_unary": raw_unary,
    "raw_stream": raw_stream,
    "write_file": write_file,
    "read_file": read_file,
    "file_round_trip": file_round_trip,
    "logs": logs,
    "watch_logs": watch_logs,
    "watch_events": watch_events,
}
