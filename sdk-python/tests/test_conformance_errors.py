"""Every bad-input row of the conformance list (conformance/scenarios.json) raises
the expected exception, with the expected ``.code``, through the Python SDK.

The rows run through the Python conformance runner's interpreter, the same code
the harness runs, so the list and this suite cannot drift apart.
"""

from __future__ import annotations

import importlib
import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import ROOT, Cluster
from sandbox_server import echo_program

SCENARIOS = ROOT / "conformance" / "scenarios.json"


def _load(directory: Path, module: str) -> ModuleType:
    """A module of the conformance tree, imported the way its own entry point
    imports it (its directory first on the path)."""
    sys.path.insert(0, str(directory))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(directory))


RUNNER = _load(ROOT / "conformance" / "python-runner", "runner")
VERDICT = _load(ROOT / "conformance", "judge.verdict")
CHECKS = _load(ROOT / "conformance", "judge.checks")
BAD_INPUT = [s for s in json.loads(SCENARIOS.read_text())["scenarios"] if s["group"] == "bad_input"]


def test_the_list_has_bad_input_rows_with_expected_codes() -> None:
    assert len(BAD_INPUT) >= 15
    for scenario in BAD_INPUT:
        expects = [step["expect"] for step in scenario["steps"]]
        assert all("error" in e for e in expects), scenario["id"]


@pytest.fixture(scope="module")
async def runner(cluster: Cluster) -> AsyncIterator[Any]:
    instance = RUNNER.Runner(cluster.endpoint, f"pt{uuid.uuid4().hex[:6]}")
    yield instance
    await instance.cleanup()


@pytest.mark.parametrize("scenario", BAD_INPUT, ids=[s["id"] for s in BAD_INPUT])
async def test_bad_input_row(runner: Any, scenario: dict[str, Any]) -> None:
    """The runner performs the row; the harness's own judge decides."""
    context = CHECKS.RunContext(sandbox_prefix=runner.prefix, run=runner.run_id)
    for alias in scenario.get("uses", []):
        await runner.ensure(alias)
    for step in scenario["steps"]:
        observed = await runner.perform(step)
        failure = VERDICT.judge_step(step, observed, context)
        assert failure is None, f"{scenario['id']}: {failure}"


def test_rows_name_only_codes_the_sdk_has_classes_for() -> None:
    import openshell_sdk as osdk

    for scenario in BAD_INPUT:
        for step in scenario["steps"]:
            codes = step["expect"]["error"]
            for code in [codes] if isinstance(codes, str) else codes:
                cls = osdk.errors.error_class(code)
                assert cls is not osdk.OpenShellError, f"{scenario['id']}: {code}"


def test_interpreter_exit_with_calls_in_flight_is_clean(cluster: Cluster, tmp_path: Path) -> None:
    """Leaving the interpreter with a forward (and a connection through it),
    streams and a call still running stops the native runtime first (atexit):
    no crash, exit status 0."""
    import subprocess
    import sys

    script = tmp_path / "exit.py"
    # The forward's target is an echo server on the sandbox's own loopback
    # (testkit/scripts/sandbox-echo.py through an exec stream), so the
    # connection through it is relaying when the interpreter leaves.
    script.write_text(
        f"""
import asyncio, socket, openshell_sdk as o
ENDPOINT = {cluster.endpoint!r}
ECHO = {echo_program()!r}
HELD = []
async def main():
    c = o.AsyncClient(ENDPOINT)
    name = "py-exit-" + __import__("uuid").uuid4().hex[:8]
    await c.sandboxes.create(name)
    await c.sandboxes.wait_ready(name, timeout=60)
    echo = c.exec_stream(name, ["python3", "-c", ECHO])
    out = b""
    while b"\\n" not in out:
        event = await asyncio.wait_for(anext(echo), 30)
        if isinstance(event, o.ExecExit):
            raise SystemExit("the echo server exited: %r" % (event,))
        if isinstance(event, o.ExecStdout):
            out += event.data
    port = int(out.split()[1])
    fwd = await c.forward(name, port)
    conn = socket.create_connection(fwd.local_address, timeout=20)
    conn.sendall(b"ping")
    got = b""
    while len(got) < 4:
        chunk = conn.recv(4 - len(got))
        if not chunk:
            raise SystemExit("the forward did not echo")
        got += chunk
    if got != b"ping":
        raise SystemExit("the forward echoed %r" % (got,))
    HELD.append(conn)
    stream = c.exec_stream(name, ["sh", "-c", "echo hi; sleep 30"])
    await anext(stream)
    asyncio.ensure_future(c.exec(name, ["sleep", "30"]))
    await asyncio.sleep(0.3)
    await c.sandboxes.delete(name)
asyncio.run(main())
"""
    )
    for _ in range(3):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
