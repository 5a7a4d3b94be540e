"""Python runner of the conformance scenarios (``conformance/scenarios.json``).

Performs every scenario's steps with ``openshell_sdk.AsyncClient`` against the
cluster at ``$OPENSHELL_ENDPOINT`` and reports what it observed, one JSON line
per step (format: ``conformance/README.md``, "Observations"). It never reads a
step's ``expect``: the harness judges every runner in one place.

Usage: ``python runner.py [SCENARIOS_JSON] [--only ID ...]``.

Modules: ``runner`` (this: the client, sandbox names, the scenario loop),
``observe`` (observation values), ``ops`` (sandboxes, exec, forward, raw
calls), ``config_ops`` (``config_session``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import config_ops
import ops
from observe import error_observation

import openshell_sdk as osdk
from openshell_sdk import AsyncClient, OpenShellError

DEFAULT_SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios.json"
DATA_DIR_VAR = "OPENSHELL_CONFORMANCE_DATA_DIR"
CONTROL_VAR = "OPENSHELL_CONFORMANCE_CONTROL"
STEP_LIMIT = 120.0
PLACEHOLDER = re.compile(r"\$\{([a-z][a-z0-9]*)\}")

Op = Callable[["Runner", dict[str, Any]], Awaitable[dict[str, Any]]]
OPS: dict[str, Op] = {**ops.OPS, "config_session": config_ops.config_session}


def emit(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


class Runner:
    """The client, this run's sandbox names, and step inputs made concrete."""

    def __init__(self, endpoint: str, run_id: str) -> None:
        self.endpoint = endpoint
        self.run_id = re.sub(r"[^a-z0-9]", "", run_id.lower())[:12]
        self.prefix = f"cf-py-{self.run_id}-"
        self.client = AsyncClient(endpoint)
        self.named: set[str] = set()
        self.ready: set[str] = set()
        data_dir = os.environ.get(DATA_DIR_VAR)
        self.data_dir = Path(data_dir) if data_dir else None
        # The harness's control port changes the routes in front of the
        # cluster (``unroute_owner_then_exec``).
        self.control = os.environ.get(CONTROL_VAR) or None
        # The SDK has the routing counters; a config session needs a sandbox
        # token, read from the supervisor in the cluster's data directory;
        # making a replica unreachable is the harness's job.
        self.caps = ["routing_stats"] + (["push_config"] if self.data_dir else [])
        if self.control:
            self.caps.append("replica_control")

    def name(self, alias: str) -> str:
        self.named.add(self.prefix + alias)
        return self.prefix + alias

    def subst(self, value: Any) -> Any:
        """``${run}`` is the run id, ``${alias}`` a sandbox's real name."""
        if isinstance(value, str):
            return PLACEHOLDER.sub(
                lambda m: self.run_id if m.group(1) == "run" else self.name(m.group(1)), value
            )
        if isinstance(value, list):
            return [self.subst(v) for v in value]
        if isinstance(value, dict):
            return {self.subst(k): self.subst(v) for k, v in value.items()}
        return value

    def target(self, step: dict[str, Any]) -> str:
        """The sandbox a step names: a literal ``name`` or a ``sandbox`` alias."""
        if "name" in step:
            return str(self.subst(step["name"]))
        return self.name(step.get("sandbox", "main"))

    async def ensure(self, alias: str) -> None:
        if alias in self.ready:
            return
        name = self.name(alias)
        with contextlib.suppress(osdk.AlreadyExistsError):
            await self.client.sandboxes.create(name)
        await self.client.sandboxes.wait_ready(name, timeout=60)
        self.ready.add(alias)

    async def cleanup(self) -> None:
        for name in sorted(self.named):
            try:
                await self.client.sandboxes.delete(name)
                await self.client.sandboxes.wait_deleted(name, timeout=60)
            except OpenShellError:
                pass
        await self.client.close()

    async def run(self, scenario: dict[str, Any]) -> None:
        sid = scenario["id"]
        missing = [c for c in scenario.get("requires", []) if c not in self.caps]
        if missing:
            emit({"type": "skip", "scenario": sid, "missing": missing})
            return
        for alias in scenario.get("uses", []):
            try:
                await self.ensure(alias)
            except (OpenShellError, OSError, TimeoutError) as err:
                emit({"type": "setup", "scenario": sid, "alias": alias, "failure": str(err)})
                return
        for index, step in enumerate(scenario["steps"]):
            started = time.monotonic()
            outcome = await self.perform(step)
            ms = int((time.monotonic() - started) * 1000)
            line = {"type": "step", "scenario": sid, "step": index, "op": step["op"], "ms": ms}
            emit({**line, **outcome})

    async def perform(self, step: dict[str, Any]) -> dict[str, Any]:
        """``{"result": ...}``, ``{"error": ...}`` or ``{"failure": ...}``."""
        op = OPS.get(step["op"])
        if op is None:
            return {"failure": f"this runner does not know op {step['op']!r}"}
        try:
            return {"result": await asyncio.wait_for(op(self, step), timeout=STEP_LIMIT)}
        except OpenShellError as err:
            return {"error": error_observation(err)}
        except TimeoutError:
            return {"failure": f"timed out after {STEP_LIMIT:.0f} s"}
        except (ops.StepFailed, OSError) as err:
            return {"failure": f"{type(err).__name__}: {err}"}


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
    emit(
        {
            "type": "hello",
            "runner": "python",
            "run": runner.run_id,
            "sandbox_prefix": runner.prefix,
            "capabilities": runner.caps,
        }
    )
    try:
        for scenario in json.loads(path.read_text())["scenarios"]:
            if not only or scenario["id"] in only:
                await runner.run(scenario)
    finally:
        await runner.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
