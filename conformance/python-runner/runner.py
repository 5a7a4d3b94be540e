"""Python runner of the conformance scenarios (``conformance/scenarios.json``).

Runs every scenario with ``openshell_sdk.AsyncClient`` against the cluster at
``$OPENSHELL_ENDPOINT`` and prints one JSON line per scenario on stdout::

    {"id": "exec.buffered", "status": "pass" | "fail" | "skip", "detail": "...", "ms": 12}

Usage: ``python runner.py [SCENARIOS_JSON] [--only ID ...]``. The harness
(``conformance/harness``) starts the cluster and runs every language's runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format

import openshell_sdk as osdk
from openshell_sdk import AsyncClient, OpenShellError
from openshell_sdk._proto import openshell_pb2

LANGUAGE = "py"
DEFAULT_SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios.json"


class StepFailed(Exception):
    """A step's outcome did not match its expectation."""


DATA_DIR_VAR = "OPENSHELL_CONFORMANCE_DATA_DIR"


def capabilities(client: AsyncClient) -> set[str]:
    """What this runner can exercise with the SDK as built."""
    del client  # every capability below is in the SDK as built
    caps = {"routing_stats"}
    # ConfigSession is in the SDK; a session needs a sandbox token, read from
    # the sandbox's supervisor in the cluster's data directory.
    if os.environ.get(DATA_DIR_VAR):
        caps.add("push_config")
    return caps


def process_running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def supervisor_token(data_dir: Path, sandbox_id: str) -> tuple[int, str]:
    """The sandbox's supervisor PID and the sandbox token the harness's
    cluster keeps for tests (``<data-dir>/sandboxes/<id>/token``)."""
    pid = int((data_dir / "sandboxes" / sandbox_id / "supervisor.pid").read_text().strip())
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    if not any(a.endswith(b"openshell-supervisor") for a in args) or (
        sandbox_id.encode() not in args
    ):
        raise StepFailed(f"process {pid} is not the supervisor of sandbox {sandbox_id}")
    token_file = data_dir / "sandboxes" / sandbox_id / "token"
    try:
        token = token_file.read_text().strip()
    except OSError as err:
        raise StepFailed(f"cannot read {token_file}: {err.strerror}") from None
    return pid, token


async def take_over(data_dir: Path, sandbox_id: str) -> str:
    """The sandbox token; the sandbox's supervisor is then stopped by its PID
    (SIGTERM, bounded wait), so the step's session is the sandbox's only one."""
    pid, token = supervisor_token(data_dir, sandbox_id)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while process_running(pid):
        if time.monotonic() > deadline:
            raise StepFailed(f"supervisor {pid} did not stop within 10 s")
        await asyncio.sleep(0.02)
    return token


def string_settings(update: osdk.ConfigUpdate) -> dict[str, str]:
    return {k: v for k, v in update.settings.items() if isinstance(v, str)}


def snake(name: str) -> str:
    out = ""
    for i, c in enumerate(name):
        if c.isupper() and i > 0:
            out += "_"
        out += c.lower()
    return out


class EchoServer:
    """A TCP echo server on loopback: the forward target on the sandbox's host."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._pump, args=(conn,), daemon=True).start()

    @staticmethod
    def _pump(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def close(self) -> None:
        self.sock.close()


class Runner:
    def __init__(self, endpoint: str, run_id: str) -> None:
        self.endpoint = endpoint
        self.run_id = run_id
        self.client = AsyncClient(endpoint)
        self.names: dict[str, str] = {}
        self.ready: set[str] = set()
        self.caps = capabilities(self.client)

    def name(self, alias: str) -> str:
        if alias not in self.names:
            self.names[alias] = f"cf-{LANGUAGE}-{self.run_id}-{alias}"[:63].rstrip("-")
        return self.names[alias]

    def subst(self, value: Any) -> Any:
        if isinstance(value, str):
            value = value.replace("${run}", self.run_id)
            for alias in ("main", "life"):
                value = value.replace("${" + alias + "}", self.name(alias))
            return value
        if isinstance(value, list):
            return [self.subst(v) for v in value]
        if isinstance(value, dict):
            return {k: self.subst(v) for k, v in value.items()}
        return value

    def target(self, step: dict[str, Any]) -> str:
        if "name" in step:
            return str(self.subst(step["name"]))
        return self.name(step["sandbox"])

    async def ensure(self, alias: str) -> None:
        if alias in self.ready:
            return
        name = self.name(alias)
        with contextlib.suppress(osdk.AlreadyExistsError):
            await self.client.sandboxes.create(name)
        await self.client.sandboxes.wait_ready(name, timeout=60)
        self.ready.add(alias)

    async def cleanup(self) -> None:
        for name in self.names.values():
            try:
                await self.client.sandboxes.delete(name)
                await self.client.sandboxes.wait_deleted(name, timeout=60)
            except OpenShellError:
                pass
        await self.client.close()

    # ------------------------------------------------------------ scenarios

    async def run(self, scenario: dict[str, Any]) -> tuple[str, str]:
        missing = [c for c in scenario.get("requires", []) if c not in self.caps]
        if missing:
            return "skip", "runner lacks capability: " + ", ".join(missing)
        try:
            for alias in scenario.get("uses", []):
                await self.ensure(alias)
            for index, step in enumerate(scenario["steps"]):
                try:
                    await asyncio.wait_for(self.step(step), timeout=120)
                except StepFailed as err:
                    raise StepFailed(f"step {index} ({step['op']}): {err}") from None
        except StepFailed as err:
            return "fail", str(err)
        except (OpenShellError, OSError, TimeoutError) as err:
            return "fail", f"unexpected {type(err).__name__}: {err}"
        return "pass", ""

    async def step(self, step: dict[str, Any]) -> None:
        expect = step.get("expect", {})
        want_error = expect.get("error")
        try:
            result = await self.execute(step)
        except OpenShellError as err:
            if want_error is None:
                raise StepFailed(f"unexpected error {err.code}: {err.message}") from None
            codes = [want_error] if isinstance(want_error, str) else want_error
            if err.code not in codes:
                raise StepFailed(f"error code {err.code!r}, expected {codes}: {err}") from None
            if osdk.errors.error_class(err.code) is not type(err):
                raise StepFailed(f"{err.code} raised as {type(err).__name__}") from None
            excluded = expect.get("message_excludes")
            if excluded and excluded in str(err):
                raise StepFailed("the error message echoes a secret value") from None
            if "retryable" in expect and err.retryable != expect["retryable"]:
                raise StepFailed(f"retryable is {err.retryable}") from None
            return
        if want_error is not None:
            raise StepFailed(f"expected error {want_error}, got success: {result!r}"[:300])
        check(self, expect, result)

    async def execute(self, step: dict[str, Any]) -> dict[str, Any]:
        op = step["op"]
        c = self.client
        if op == "create_sandbox":
            name = self.target(step)
            s = await c.sandboxes.create(name, env=step.get("env"), labels=step.get("labels"))
            if "sandbox" in step:
                self.ready.discard(step["sandbox"])
            return {"phase": s.phase.name, "labels": dict(s.labels)}
        if op == "wait_ready":
            s = await c.sandboxes.wait_ready(self.target(step), timeout=step.get("timeout"))
            return {"phase": s.phase.name}
        if op == "get_sandbox":
            s = await c.sandboxes.get(self.target(step))
            return {"phase": s.phase.name}
        if op == "list_sandboxes":
            found = await c.sandboxes.list(label_selector=step.get("label_selector"))
            return {"names": [s.name for s in found]}
        if op == "delete_sandbox":
            await c.sandboxes.delete(self.target(step))
            return {}
        if op == "wait_deleted":
            await c.sandboxes.wait_deleted(self.target(step), timeout=step.get("timeout"))
            return {}
        if op == "exec":
            stdin: bytes | None = step["stdin"].encode() if "stdin" in step else None
            if "stdin_size" in step:
                stdin = b"\0" * int(step["stdin_size"])
            r = await c.exec(
                self.target(step),
                step["command"],
                env=step.get("env"),
                stdin=stdin,
                exec_timeout=step.get("exec_timeout"),
            )
            return {"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code}
        if op == "exec_stream":
            events = []
            async with c.exec_stream(self.target(step), step["command"]) as stream:
                async for event in stream:
                    events.append(event)
            return {
                "stdout": b"".join(e.data for e in events if isinstance(e, osdk.ExecStdout)),
                "stderr": b"".join(e.data for e in events if isinstance(e, osdk.ExecStderr)),
                "exit_code": stream.exit_code,
                "exit_last": isinstance(events[-1], osdk.ExecExit)
                and sum(isinstance(e, osdk.ExecExit) for e in events) == 1,
                "events": len(events),
            }
        if op == "interactive":
            return await self.interactive(step)
        if op == "forward":
            return await self.forward(step)
        if op == "exec_repeat":
            outs = [await c.exec(self.target(step), step["command"]) for _ in range(step["count"])]
            bad = [o for o in outs if o.stdout != outs[0].stdout or o.exit_code != 0]
            if bad:
                raise StepFailed(f"{len(bad)} of {len(outs)} execs differ: {bad[0]!r}")
            return {"stdout": outs[0].stdout, "exit_code": 0}
        if op == "raw_unary":
            request = self.message(step["method"], step.get("request", {}))
            call = getattr(c.raw, snake(step["method"]) + "_with_metadata")
            answer = await call(request, metadata=[tuple(p) for p in step.get("metadata", [])])
            return {"metadata": answer.metadata, "response": answer.message}
        if op == "raw_stream":
            return await self.raw_stream(step)
        if op == "routing_stats_delta":
            before = c.routing_stats()
            for _ in range(step["count"]):
                await c.exec(self.target(step), step["command"])
            after = c.routing_stats()
            assert before is not None and after is not None
            return {
                "hinted_delta": after.hinted - before.hinted,
                "unrouted_retry_delta": after.unrouted_retry - before.unrouted_retry,
            }
        if op == "config_session":
            return await self.config_session(step)
        if op == "client_health":
            async with AsyncClient(step["endpoint"], connect_timeout=2) as other:
                await other.health()
            return {}
        raise StepFailed(f"this runner does not know op {op!r}")

    async def config_session(self, step: dict[str, Any]) -> dict[str, Any]:
        """Takes over a sandbox's session with ``openshell_sdk.ConfigSession`` on
        the sandbox's own token, writes the step's settings and watches them
        arrive. Push sessions are answered through ``events()`` and explicit
        acknowledgements, the others through an ``apply`` callback."""
        name = self.target(step)
        sandbox = await self.client.sandboxes.get(name)
        token = await take_over(Path(os.environ[DATA_DIR_VAR]), sandbox.id)
        reject = step.get("reject")
        refused = None if reject is None else (reject["setting"], reject["value"])
        applied: list[dict[str, str]] = []

        def verdict(update: osdk.ConfigUpdate) -> osdk.ApplyResult:
            settings = string_settings(update)
            if refused is not None and settings.get(refused[0]) == refused[1]:
                return osdk.Rejected(f"{refused[0]} must not be {refused[1]}")
            applied.append(settings)
            return None

        announce = bool(step.get("announce_push", True))
        session = osdk.ConfigSession(
            self.endpoint,
            sandbox.id,
            token,
            apply=None if announce else verdict,
            announce_push=announce,
            poll_interval=float(step.get("poll_interval", 10)),
        )

        async def answer() -> None:
            async for update in session.events():
                result = verdict(update)
                if isinstance(result, osdk.Rejected):
                    await update.reject(result.reason)
                else:
                    await update.ack()

        async def until(check: Any, timeout: float) -> bool:
            deadline = time.monotonic() + timeout
            while not check():
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.02)
            return True

        answering = asyncio.get_running_loop().create_task(answer()) if announce else None
        globals_written: list[str] = []
        latency = 0.0
        try:
            await session.start()
            mode = await session.wait_mode(timeout=30)
            if mode is osdk.DeliveryMode.PUSH and not await until(
                lambda: session.stats().last_update_id >= 1, 10
            ):
                raise StepFailed("the bootstrap was never answered")
            for write in self.subst(step.get("writes", [])):
                key, value, is_global = write["setting"], write["value"], write.get("global")
                rejected_before = session.stats().rejected
                started = time.monotonic()
                await self.update_setting(name, key, value, bool(is_global))
                if is_global:
                    globals_written.append(key)
                if (key, value) == refused:
                    arrived = await until(
                        lambda n=rejected_before: session.stats().rejected > n, 15
                    )
                else:
                    arrived = await until(
                        lambda k=key, v=value: bool(applied) and applied[-1].get(k) == v, 15
                    )
                if not arrived:
                    raise StepFailed(f"{key}={value} never reached the session")
                latency = max(latency, time.monotonic() - started)
            stats = session.stats()
        finally:
            for key in globals_written:
                await self.update_setting(name, key, None, True)
            await session.close()
            if answering is not None:
                answering.cancel()
                await asyncio.wait({answering})
        writes = len(step.get("writes", []))
        return {
            "config_mode": None if stats.mode is None else stats.mode.value,
            "bootstrap": stats.mode is osdk.DeliveryMode.PUSH
            and stats.updates_received >= 1
            and stats.last_update_id >= 1,
            # Every pushed update answered, in order, on one session.
            "updates_acknowledged": stats.sessions_accepted == 1
            and stats.updates_received > writes
            and stats.last_update_id == stats.updates_received,
            "rejected": stats.rejected,
            "updates_received": stats.updates_received,
            "polls": stats.polls,
            "applied_settings": applied[-1] if applied else {},
            "max_latency": latency,
        }

    async def update_setting(self, sandbox: str, key: str, value: str | None, glob: bool) -> None:
        request = openshell_pb2.UpdateConfigRequest(
            sandbox="" if glob else sandbox,
            setting_key=key,
            delete_setting=value is None,
            **{"global": glob},
        )
        if value is not None:
            request.setting_value.string_value = value
        await self.client.raw.update_config(request)

    def message(self, method: str, body: dict[str, Any]) -> Any:
        service = openshell_pb2.DESCRIPTOR.services_by_name["OpenShell"]
        input_type = service.methods_by_name[method].input_type
        cls = getattr(openshell_pb2, input_type.name)
        return json_format.ParseDict(self.subst(body), cls())

    async def raw_stream(self, step: dict[str, Any]) -> dict[str, Any]:
        method = step["method"]
        info = next(m for m in osdk.METHODS if m.name == method)
        messages = [self.message(method, m) for m in step["messages"]]
        stub = getattr(self.client.raw, snake(method))
        if info.kind == "server_streaming":
            stream = stub(messages[0])
        else:
            stream = stub()
            for message in messages:
                await stream.send(message)
            await stream.close_send()
        received = [m async for m in stream]
        return {"messages": received}

    async def interactive(self, step: dict[str, Any]) -> dict[str, Any]:
        session = await self.client.exec_interactive(
            self.target(step),
            step["command"],
            tty=step.get("tty", False),
            cols=step.get("cols", 80),
            rows=step.get("rows", 24),
        )
        output = bytearray()
        stdout = bytearray()
        async with session:
            for action in step.get("actions", []):
                if "wait_output" in action:
                    wanted = action["wait_output"].encode()
                    while wanted not in output:
                        event = await session.next_event()
                        if event is None or isinstance(event, osdk.ExecExit):
                            raise StepFailed(f"ended before {wanted!r}: {bytes(output)!r}")
                        output.extend(event.data)
                        if isinstance(event, osdk.ExecStdout):
                            stdout.extend(event.data)
                elif "resize" in action:
                    await session.resize(*action["resize"])
                elif "write" in action:
                    await session.write(action["write"])
                elif action.get("close_stdin"):
                    session.close_stdin()
            rest = await session.wait()
        output.extend(rest.stdout + rest.stderr)
        stdout.extend(rest.stdout)
        return {"exit_code": rest.exit_code, "output": bytes(output), "stdout": bytes(stdout)}

    async def forward(self, step: dict[str, Any]) -> dict[str, Any]:
        if "remote_port" in step:
            fwd = await self.client.forward(self.target(step), step["remote_port"])
            fwd.close()
            return {}
        server = EchoServer()
        try:
            size = step["bytes_per_connection"]
            async with await self.client.forward(self.target(step), server.port) as fwd:
                host, port = fwd.local_address

                async def roundtrip(i: int) -> bool:
                    payload = os.urandom(size - 1) + bytes([i])
                    reader, writer = await asyncio.open_connection(host, port)
                    writer.write(payload)
                    await writer.drain()
                    writer.write_eof()
                    echoed = await reader.read()
                    writer.close()
                    return echoed == payload

                results = await asyncio.gather(*(roundtrip(i) for i in range(step["connections"])))
                accepted = fwd.stats().connections_accepted
            try:
                socket.create_connection((host, port), timeout=2).close()
                refuses = False
            except OSError:
                refuses = True
            return {"echoed": all(results), "accepted": accepted, "closed_refuses": refuses}
        finally:
            server.close()


def as_text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def field(message: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        message = getattr(message, part)
    return message


def check(runner: Runner, expect: dict[str, Any], result: dict[str, Any]) -> None:
    def fail(what: str) -> None:
        raise StepFailed(what[:400])

    for key, want in expect.items():
        if key in ("error", "message_excludes", "retryable"):
            continue
        if key == "phase" and result["phase"] != want:
            fail(f"phase {result['phase']}, expected {want}")
        elif key == "phase_in" and result["phase"] not in want:
            fail(f"phase {result['phase']}, expected one of {want}")
        elif key == "label" and result["labels"].get(want[0]) != want[1]:
            fail(f"labels {result['labels']}")
        elif key == "contains" and runner.name(want) not in result["names"]:
            fail(f"{runner.name(want)} not listed")
        elif key in ("stdout", "stderr") and as_text(result[key]) != want:
            fail(f"{key} {as_text(result[key])!r}, expected {want!r}")
        elif key == "exit_code" and result["exit_code"] != want:
            fail(f"exit code {result['exit_code']}, expected {want}")
        elif key == "exit_last" and result["exit_last"] != want:
            fail("the exit event is not the single last event")
        elif key == "min_events" and result["events"] < want:
            fail(f"{result['events']} events")
        elif key == "stdout_len" and len(result["stdout"]) != want:
            fail(f"{len(result['stdout'])} bytes of stdout")
        elif key == "output_contains":
            for text in want:
                if text.encode() not in result["output"]:
                    fail(f"{text!r} not in output {result['output']!r}")
        elif key == "echoed" and result["echoed"] != want:
            fail("a connection did not echo its payload")
        elif key == "min_accepted" and result["accepted"] < want:
            fail(f"{result['accepted']} connections accepted")
        elif key == "closed_refuses" and result["closed_refuses"] != want:
            fail("the listener still accepts after close")
        elif key == "metadata_prefix":
            values = [v for k, v in result["metadata"] if k == want[0]]
            if not values or not values[0].startswith(want[1]):
                fail(f"{want[0]} = {values}")
        elif key == "response_field":
            got = field(result["response"], want[0])
            if got != runner.subst(want[1]):
                fail(f"{want[0]} = {got!r}")
        elif key == "hinted_min" and result["hinted_delta"] < want:
            fail(f"{result['hinted_delta']} hinted attempts")
        elif key == "unrouted_retry" and result["unrouted_retry_delta"] != want:
            fail(f"{result['unrouted_retry_delta']} unrouted retries")
        elif key == "mode" and result["config_mode"] != want:
            fail(f"delivery mode {result['config_mode']}, expected {want}")
        elif key in ("bootstrap", "updates_acknowledged", "rejected", "updates_received") and (
            result[key] != want
        ):
            fail(f"{key} is {result[key]}, expected {want}")
        elif key == "min_polls" and result["polls"] < want:
            fail(f"{result['polls']} polls")
        elif key == "max_latency" and result["max_latency"] > want:
            fail(f"a write took {result['max_latency']:.2f} s to arrive")
        elif key == "applied_settings":
            for k, v in want.items():
                k, v = runner.subst(k), runner.subst(v)
                if result["applied_settings"].get(k) != v:
                    fail(f"applied settings {result['applied_settings']}, expected {k}={v}")
        elif key not in KNOWN_EXPECTATIONS:
            fail(f"this runner does not know expectation {key!r}")


KNOWN_EXPECTATIONS = {
    "phase",
    "phase_in",
    "label",
    "contains",
    "stdout",
    "stderr",
    "exit_code",
    "exit_last",
    "min_events",
    "stdout_len",
    "output_contains",
    "echoed",
    "min_accepted",
    "closed_refuses",
    "metadata_prefix",
    "response_field",
    "hinted_min",
    "unrouted_retry",
    "mode",
    "bootstrap",
    "updates_acknowledged",
    "rejected",
    "updates_received",
    "min_polls",
    "max_latency",
    "applied_settings",
}


def load(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["scenarios"])


async def main(argv: Sequence[str]) -> int:
    args = list(argv)
    only: set[str] = set()
    if "--only" in args:
        i = args.index("--only")
        only = set(args[i + 1 :])
        args = args[:i]
    path = Path(args[0]) if args else DEFAULT_SCENARIOS
    endpoint = os.environ.get("OPENSHELL_ENDPOINT", "http://127.0.0.1:17670")
    run_id = os.environ.get("OPENSHELL_CONFORMANCE_RUN") or uuid.uuid4().hex[:8]
    runner = Runner(endpoint, run_id)
    try:
        for scenario in load(path):
            if only and scenario["id"] not in only:
                continue
            started = time.monotonic()
            status, detail = await runner.run(scenario)
            line = {
                "id": scenario["id"],
                "status": status,
                "detail": detail,
                "ms": int((time.monotonic() - started) * 1000),
            }
            print(json.dumps(line), flush=True)
    finally:
        await runner.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
