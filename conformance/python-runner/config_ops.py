"""``config_session``: takes over a sandbox's session with
``openshell_sdk.ConfigSession`` on the sandbox's own token (its real
supervisor stopped first), writes the step's settings one at a time and
reports what the session saw: its counters, when each write arrived, the last
applied settings.

Push sessions are answered through ``events()`` and explicit
acknowledgements, the others through an ``apply`` callback.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops import StepFailed

import openshell_sdk as osdk
from openshell_sdk._proto import openshell_pb2

if TYPE_CHECKING:
    from runner import Runner

# How long one write may take to reach the session before the step stops.
ARRIVAL_LIMIT = 15.0


def process_running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def supervisor_and_token(data_dir: Path, sandbox_id: str) -> tuple[int, str]:
    """The sandbox's supervisor PID and the sandbox token the harness's cluster
    keeps for tests (``<data-dir>/sandboxes/<id>/token``)."""
    folder = data_dir / "sandboxes" / sandbox_id
    pid = int((folder / "supervisor.pid").read_text().strip())
    # Guard against a reused PID: it must be this sandbox's supervisor.
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    if not any(a.endswith(b"openshell-supervisor") for a in args) or (
        sandbox_id.encode() not in args
    ):
        raise StepFailed(f"process {pid} is not the supervisor of sandbox {sandbox_id}")
    return pid, (folder / "token").read_text().strip()


async def take_over(data_dir: Path, sandbox_id: str) -> str:
    """The sandbox token; the sandbox's supervisor is then stopped by its PID
    (SIGTERM, bounded wait) so the step's session is the sandbox's only one."""
    pid, token = supervisor_and_token(data_dir, sandbox_id)
    os.kill(pid, signal.SIGTERM)
    if not await until(lambda: not process_running(pid), 10):
        raise StepFailed(f"supervisor {pid} did not stop within 10 s")
    return token


async def until(check: Callable[[], bool], timeout: float) -> bool:
    """Polls ``check`` every 20 ms for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def string_settings(update: osdk.ConfigUpdate) -> dict[str, str]:
    return {k: v for k, v in update.settings.items() if isinstance(v, str)}


async def update_setting(r: Runner, sandbox: str, key: str, value: str | None, glob: bool) -> None:
    """``UpdateConfig`` of one string setting (deleted when ``value`` is None)."""
    request = openshell_pb2.UpdateConfigRequest(
        sandbox="" if glob else sandbox,
        setting_key=key,
        delete_setting=value is None,
        **{"global": glob},
    )
    if value is not None:
        request.setting_value.string_value = value
    await r.client.raw.update_config(request)


async def config_session(r: Runner, step: dict[str, Any]) -> dict[str, Any]:
    if r.data_dir is None:
        raise StepFailed("no OPENSHELL_CONFORMANCE_DATA_DIR")
    name = r.target(step)
    sandbox = await r.client.sandboxes.get(name)
    token = await take_over(r.data_dir, sandbox.id)
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
        r.endpoint,
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

    answering = asyncio.get_running_loop().create_task(answer()) if announce else None
    writes: list[dict[str, Any]] = []
    globals_written: list[str] = []
    bootstrap_answered: bool | None = None
    try:
        await session.start()
        if await session.wait_mode(timeout=30) is osdk.DeliveryMode.PUSH:
            bootstrap_answered = await until(lambda: session.stats().last_update_id >= 1, 10)
        for write in r.subst(step.get("writes", [])) if bootstrap_answered is not False else []:
            key, value, is_global = write["setting"], write["value"], bool(write.get("global"))
            rejected_before = session.stats().rejected
            started = time.monotonic()
            await update_setting(r, name, key, value, is_global)
            if is_global:
                globals_written.append(key)
            # A refused value arrives as a rejection, any other as applied.
            if (key, value) == refused:
                arrived = await until(
                    lambda n=rejected_before: session.stats().rejected > n, ARRIVAL_LIMIT
                )
            else:
                arrived = await until(
                    lambda k=key, v=value: bool(applied) and applied[-1].get(k) == v,
                    ARRIVAL_LIMIT,
                )
            seconds = time.monotonic() - started
            writes.append({"setting": key, "value": value, "arrived": arrived, "seconds": seconds})
            if not arrived:
                break
        # Observed before the clean-up below, whose deletions also arrive.
        stats, last_applied = session.stats(), (applied[-1] if applied else {})
    finally:
        # Global settings would reach every later session: removed again.
        for key in globals_written:
            await update_setting(r, name, key, None, True)
        await session.close()
        if answering is not None:
            answering.cancel()
            await asyncio.wait({answering})
    return {
        "stats": {
            "mode": None if stats.mode is None else stats.mode.value,
            "sessions_accepted": stats.sessions_accepted,
            "updates_received": stats.updates_received,
            "last_update_id": stats.last_update_id,
            "rejected": stats.rejected,
            "polls": stats.polls,
            "served_by": stats.served_by,
        },
        "bootstrap_answered": bootstrap_answered,
        "writes": writes,
        "applied_settings": last_applied,
    }
