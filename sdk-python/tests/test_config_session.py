"""ConfigSession against real gateways in push and in poll mode.

Each gateway is ``openshell-gateway serve --dev --allow-test-flags --driver
none``: sandboxes get a record and a token file
(``<data-dir>/sandboxes/<id>/token``, the hidden test driver) and no
supervisor, so the session under test is the sandbox's only one.
Configuration is written with ``UpdateConfig`` through the raw stubs of a
normal client; the gateway's own metrics confirm what it saw.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import START_TIMEOUT, gateway_binary, stop, unique

from openshell_sdk import (
    AsyncClient,
    Client,
    ConfigSession,
    ConfigUpdate,
    DeliveryMode,
    InvalidConfigError,
    Rejected,
    SyncConfigSession,
    openshell_pb2,
    sandbox_pb2,
)


@dataclass
class ConfigGateway:
    endpoint: str
    metrics: str
    data_dir: Path
    mode: str

    def token(self, sandbox_id: str) -> str:
        return (self.data_dir / "sandboxes" / sandbox_id / "token").read_text()

    def metric(self, sample: str) -> float:
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        for line in text.splitlines():
            if line.startswith(sample + " "):
                return float(line.split()[-1])
        return 0.0


def start_gateway(mode: str) -> Iterator[ConfigGateway]:
    with tempfile.TemporaryDirectory(prefix=f"openshell-pytest-{mode}-") as tmp:
        ready_file = Path(tmp) / "ready.json"
        data_dir = Path(tmp) / "data"
        log = open(Path(tmp) / "serve.log", "w+b")  # noqa: SIM115 (closed below)
        process = subprocess.Popen(
            [
                str(gateway_binary()),
                "serve",
                "--dev",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--data-dir",
                str(data_dir),
                "--ready-file",
                str(ready_file),
                "--config-delivery-mode",
                mode,
                "--allow-test-flags",
                "--driver",
                "none",
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT
        info = None
        while info is None:
            if process.poll() is not None or time.monotonic() > deadline:
                stop(process)
                log.seek(0)
                pytest.fail("gateway did not start:\n" + log.read().decode(errors="replace"))
            try:
                info = json.loads(ready_file.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                time.sleep(0.05)
        try:
            yield ConfigGateway(
                str(info["url"]).rstrip("/"), str(info["metrics"]), data_dir.resolve(), mode
            )
        finally:
            stop(process)
            log.close()


@pytest.fixture(scope="module")
def push_gateway() -> Iterator[ConfigGateway]:
    yield from start_gateway("push")


@pytest.fixture(scope="module")
def poll_gateway() -> Iterator[ConfigGateway]:
    yield from start_gateway("poll")


@dataclass
class Target:
    gateway: ConfigGateway
    client: AsyncClient
    name: str
    id: str
    token: str

    async def set(self, key: str, value: str) -> None:
        await self.client.raw.update_config(
            openshell_pb2.UpdateConfigRequest(
                sandbox=self.name,
                setting_key=key,
                setting_value=sandbox_pb2.SettingValue(string_value=value),
            )
        )


async def new_target(gateway: ConfigGateway) -> AsyncIterator[Target]:
    async with AsyncClient(gateway.endpoint) as client:
        name = unique("py-cfg")
        sandbox = await client.sandboxes.create(name)
        target = Target(gateway, client, name, sandbox.id, gateway.token(sandbox.id))
        try:
            yield target
        finally:
            await client.sandboxes.delete(name)


@pytest.fixture
async def pushed(push_gateway: ConfigGateway) -> AsyncIterator[Target]:
    async for target in new_target(push_gateway):
        yield target


@pytest.fixture
async def polled(poll_gateway: ConfigGateway) -> AsyncIterator[Target]:
    async for target in new_target(poll_gateway):
        yield target


def session(target: Target, **options: object) -> ConfigSession:
    return ConfigSession(
        target.gateway.endpoint,
        target.id,
        target.token,
        **options,  # type: ignore[arg-type]
    )


async def next_update(events: AsyncIterator[ConfigUpdate], timeout: float = 5.0) -> ConfigUpdate:
    return await asyncio.wait_for(anext(events), timeout)


async def test_push_delivers_updates_that_are_acknowledged_explicitly(pushed: Target) -> None:
    gw = pushed.gateway
    rejected_before = gw.metric('openshell_server_config_results_total{outcome="rejected"}')
    async with session(pushed) as s:
        events = s.events()
        # Supervisors start from polled configuration, as always.
        first = await next_update(events)
        assert first.mode is DeliveryMode.POLL
        assert first.config_revision == 0
        await first.ack()
        # Then the session is accepted with push; its bootstrap equals what
        # was applied, so the core answers it without asking again.
        assert await s.wait_mode(DeliveryMode.PUSH, timeout=10) is DeliveryMode.PUSH
        for _ in range(250):
            if s.stats().last_update_id >= 1:
                break
            await asyncio.sleep(0.02)
        assert s.stats().duplicates == 1
        assert gw.metric("openshell_server_config_push_sessions") >= 1

        started = time.monotonic()
        await pushed.set("color", "blue")
        update = await next_update(events)
        took = time.monotonic() - started
        assert update.mode is DeliveryMode.PUSH
        assert update.setting("color") == "blue"
        assert update.settings == {"color": "blue"}
        assert update.config_revision == 1
        assert "color" in repr(update)
        await update.ack()
        with pytest.raises(ValueError):
            await update.ack()
        # Far under the 10 s poll interval: it was pushed.
        assert took < 2.0, took

        await pushed.set("verdict", "no")
        refused = await next_update(events)
        assert refused.setting("verdict") == "no"
        await refused.reject("verdict must not be no")
        for _ in range(250):
            rejected = gw.metric('openshell_server_config_results_total{outcome="rejected"}')
            if rejected >= rejected_before + 1:
                break
            await asyncio.sleep(0.02)
        assert rejected == rejected_before + 1

        await pushed.set("verdict", "yes")
        good = await next_update(events)
        assert (good.setting("color"), good.setting("verdict")) == ("blue", "yes")
        await good.ack()
        for _ in range(250):
            if s.stats().applied == 3:
                break
            await asyncio.sleep(0.02)
        stats = s.stats()
        assert (stats.applied, stats.rejected) == (3, 1)
        assert stats.updates_received >= 4  # bootstrap + three updates
        assert stats.last_update_id == stats.updates_received
        assert stats.config_revision == 3
        assert stats.session_id
        assert stats.served_by == "gw-0"
        assert s.mode is DeliveryMode.PUSH
    assert s.closed


async def test_poll_gateway_delivers_through_the_apply_callback(polled: Target) -> None:
    seen: list[ConfigUpdate] = []

    async def apply(update: ConfigUpdate) -> Rejected | None:
        await asyncio.sleep(0)
        if update.setting("verdict") == "no":
            return Rejected("verdict must not be no")
        seen.append(update)
        return None

    async with session(polled, apply=apply, poll_interval=0.3) as s:
        assert await s.wait_mode(timeout=10) is DeliveryMode.POLL
        for key, value in [("color", "blue"), ("verdict", "no"), ("verdict", "yes")]:
            await polled.set(key, value)
            for _ in range(250):
                stats = s.stats()
                if value == "no" and stats.rejected >= 1:
                    break
                if seen and seen[-1].setting(key) == value:
                    break
                await asyncio.sleep(0.02)
        # The callback returns before the core counts its answer: wait for the count.
        for _ in range(250):
            stats = s.stats()
            if stats.applied >= 3:
                break
            await asyncio.sleep(0.02)
        assert [u.mode for u in seen] == [DeliveryMode.POLL] * 3
        assert seen[-1].settings == {"color": "blue", "verdict": "yes"}
        assert (stats.applied, stats.rejected) == (3, 1)
        assert stats.updates_received == 0
        assert stats.polls >= 3
        assert polled.gateway.metric("openshell_server_config_push_sessions") == 0


async def test_a_session_that_does_not_announce_push_polls_against_a_push_gateway(
    pushed: Target,
) -> None:
    bootstraps = pushed.gateway.metric('openshell_server_config_updates_sent_total{kind="initial"}')
    applied: list[int] = []

    def apply(update: ConfigUpdate) -> bool:
        applied.append(update.config_revision)
        return True

    async with session(pushed, apply=apply, poll_interval=0.3, announce_push=False) as s:
        assert await s.wait_mode(timeout=10) is DeliveryMode.POLL
        await pushed.set("old", "supervisor")
        for _ in range(250):
            if applied[-1:] == [1]:
                break
            await asyncio.sleep(0.02)
        assert applied == [0, 1]
        assert s.stats().updates_received == 0
        assert s.mode is DeliveryMode.POLL
    assert (
        pushed.gateway.metric('openshell_server_config_updates_sent_total{kind="initial"}')
        == bootstraps
    )


async def test_a_failing_callback_rejects_and_close_ends_the_iteration(pushed: Target) -> None:
    def apply(update: ConfigUpdate) -> bool:
        if update.setting("boom") is not None:
            raise RuntimeError("broken applier")
        return True

    async with session(pushed, apply=apply) as s:
        await s.wait_mode(DeliveryMode.PUSH, timeout=10)
        await pushed.set("boom", "1")
        for _ in range(250):
            if s.stats().rejected == 1:
                break
            await asyncio.sleep(0.02)
        assert s.stats().rejected == 1
        with pytest.raises(RuntimeError):
            await anext(s.events())

    # An update left unanswered does not hold up close(), and the iteration ends.
    other = session(pushed)
    events = other.events()
    pending = await next_update(events)
    assert not pending.answered
    await other.close()
    with pytest.raises(StopAsyncIteration):
        await next_update(events)


def test_sync_session_applies_with_a_callback(push_gateway: ConfigGateway) -> None:
    with Client(push_gateway.endpoint) as client:
        name = unique("py-cfg-sync")
        sandbox = client.sandboxes.create(name)
        seen: list[object] = []

        def apply(update: ConfigUpdate) -> Rejected | None:
            seen.append(update.setting("mode"))
            return None

        try:
            with SyncConfigSession(
                push_gateway.endpoint, sandbox.id, push_gateway.token(sandbox.id), apply=apply
            ) as s:
                assert s.wait_mode(DeliveryMode.PUSH, timeout=10) is DeliveryMode.PUSH
                client.raw.update_config(
                    openshell_pb2.UpdateConfigRequest(
                        sandbox=name,
                        setting_key="mode",
                        setting_value=sandbox_pb2.SettingValue(string_value="sync"),
                    )
                )
                deadline = time.monotonic() + 5
                while seen[-1:] != ["sync"] and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert seen == [None, "sync"]
                assert s.stats().applied == 2
        finally:
            client.sandboxes.delete(name)


def test_bad_configuration_is_refused_before_any_io() -> None:
    with pytest.raises(InvalidConfigError):
        ConfigSession("ftp://127.0.0.1:1", "sb", "token")
    with pytest.raises(InvalidConfigError):
        ConfigSession("http://127.0.0.1:1", " ", "token")
    with pytest.raises(InvalidConfigError):
        ConfigSession("http://127.0.0.1:1", "sb", "token", poll_interval=0.01)
