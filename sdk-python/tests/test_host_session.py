"""HostSession: a shared supervisor host's session.

Bad input is refused before any I/O; the token never shows. Then against a
real gateway in ``--driver hosts`` mode (``openshell-gateway serve --dev
--driver hosts``, stopped by its PID) with a host token issued by the real
``openshell-gateway host-token``: the host session is accepted by that
replica, a new sandbox is assigned to it, and the sandbox's configuration
(the first snapshot, then a written setting) reaches the apply callback.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import START_TIMEOUT, gateway_binary, stop, unique

from openshell_sdk import (
    AsyncClient,
    Client,
    ConfigSnapshot,
    HostSession,
    InvalidConfigError,
    Rejected,
    SyncHostSession,
    openshell_pb2,
    sandbox_pb2,
)

SECRET = "host-token-that-must-never-show"


def noop(sandbox_id: str, snapshot: ConfigSnapshot) -> None:
    return None


@pytest.mark.parametrize("cls", [HostSession, SyncHostSession])
def test_bad_input_is_refused_before_any_io(cls: type[HostSession] | type[SyncHostSession]) -> None:
    endpoint = "http://127.0.0.1:1"
    with pytest.raises(InvalidConfigError) as empty:
        cls(endpoint, " ", SECRET, apply=noop, allow_cleartext_token=True)
    assert empty.value.code == "invalid_config"
    assert "member id" in str(empty.value)
    with pytest.raises(InvalidConfigError):
        cls(endpoint, "h-0", SECRET, apply=None, allow_cleartext_token=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError):
        cls("ftp://127.0.0.1:1", "h-0", SECRET, apply=noop)
    with pytest.raises(InvalidConfigError):
        cls(endpoint, "h-0", SECRET, apply=noop, capacity=-1, allow_cleartext_token=True)
    with pytest.raises(InvalidConfigError) as cleartext:
        # A token over plain http to a non-loopback host is refused unless allowed.
        cls("http://192.0.2.1:1", "h-0", SECRET, apply=noop)
    for err in (empty.value, cleartext.value):
        assert SECRET not in str(err) and SECRET not in repr(err)


async def test_the_token_never_shows_and_close_ends_an_unconnected_session() -> None:
    host = HostSession(
        "http://127.0.0.1:1",
        "h-7",
        SECRET,
        apply=noop,
        capacity=3,
        instance_id="inst-1",
        connect_timeout=0.2,
    )
    assert SECRET not in repr(host) and "h-7" in repr(host)
    assert host.member_id == "h-7" and host.instance_id == "inst-1"
    runner = asyncio.get_running_loop().create_task(host.run())
    await asyncio.sleep(0.3)
    stats = host.stats()
    assert stats.sessions_accepted == 0 and stats.session_id is None and stats.assigned == 0
    with pytest.raises(TimeoutError):
        await host.wait_accepted(timeout=0.2)
    runner.cancel()
    await asyncio.wait({runner}, timeout=10)
    assert runner.done() and host.closed


@dataclass
class HostsGateway:
    endpoint: str
    metrics: str
    replica: str
    data_dir: Path

    def host_token(self, host_id: str) -> str:
        out = self.data_dir.parent / f"{host_id}.token"
        done = subprocess.run(
            [
                str(gateway_binary()),
                "host-token",
                "--data-dir",
                str(self.data_dir),
                "--host-id",
                host_id,
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        token = out.read_text().strip()
        assert token and token not in done.stdout + done.stderr
        return token

    def metric(self, sample: str) -> float:
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        for line in text.splitlines():
            if line.startswith(sample + " "):
                return float(line.split()[-1])
        return 0.0


@pytest.fixture(scope="module")
def hosts_gateway() -> Iterator[HostsGateway]:
    with tempfile.TemporaryDirectory(prefix="openshell-pytest-hosts-") as tmp:
        ready_file = Path(tmp) / "ready.json"
        data_dir = Path(tmp) / "data"
        log = open(Path(tmp) / "serve.log", "w+b")  # noqa: SIM115 (closed below)
        process = subprocess.Popen(
            [
                str(gateway_binary()),
                "serve",
                "--dev",
                "--driver",
                "hosts",
                "--config-delivery-mode",
                "push",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--data-dir",
                str(data_dir),
                "--ready-file",
                str(ready_file),
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
            yield HostsGateway(
                str(info["url"]).rstrip("/"),
                str(info["metrics"]),
                str(info["replica_id"]),
                data_dir.resolve(),
            )
        finally:
            stop(process)
            log.close()


async def eventually(what: str, check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.05)


async def test_a_host_is_accepted_assigned_a_sandbox_and_applies_its_config(
    hosts_gateway: HostsGateway,
) -> None:
    gw = hosts_gateway
    host_id = unique("h-py")
    token = gw.host_token(host_id)
    seen: list[tuple[str, int, object]] = []

    async def apply(sandbox_id: str, snapshot: ConfigSnapshot) -> Rejected | None:
        seen.append((sandbox_id, snapshot.config_revision, snapshot.setting("color")))
        if snapshot.setting("color") == "plaid":
            return Rejected("no plaid")
        return None

    async with (
        HostSession(gw.endpoint, host_id, token, apply=apply, capacity=10) as host,
        AsyncClient(gw.endpoint) as client,
    ):
        assert token not in repr(host)
        accepted = await host.wait_accepted(timeout=30)
        assert accepted.sessions_accepted == 1
        assert accepted.served_by == gw.replica
        assert accepted.stay is False and accepted.redirects == 0
        await eventually("the replica counts the host", lambda: gw.metric(HOSTS_HELD) == 1)

        name = unique("py-host")
        sandbox = await client.sandboxes.create(name)
        try:
            await eventually("the first snapshot", lambda: (sandbox.id, 0, None) in seen)
            assert host.stats().assigned == 1
            for color in ("blue", "plaid"):
                await client.raw.update_config(
                    openshell_pb2.UpdateConfigRequest(
                        sandbox=name,
                        setting_key="color",
                        setting_value=sandbox_pb2.SettingValue(string_value=color),
                    )
                )
                await eventually(
                    f"color={color} applied", lambda c=color: any(s[2] == c for s in seen)
                )
            await eventually(
                "the gateway saw the rejection",
                lambda: gw.metric('openshell_server_config_results_total{outcome="rejected"}') >= 1,
            )
            assert [s for s in seen if s[0] != sandbox.id] == []
            # Only changes reach the callback: the bootstrap equal to what was
            # applied is answered by the core.
            assert [s[2] for s in seen] == [None, "blue", "plaid"]
        finally:
            await client.sandboxes.delete(name)
        await eventually("the sandbox leaves the assignment", lambda: host.stats().assigned == 0)
    await eventually("the host session ends", lambda: gw.metric(HOSTS_HELD) == 0)


def test_sync_host_session_applies_on_its_threads(hosts_gateway: HostsGateway) -> None:
    gw = hosts_gateway
    host_id = unique("h-py-sync")
    seen: list[tuple[str, str]] = []

    def apply(sandbox_id: str, snapshot: ConfigSnapshot) -> None:
        seen.append((sandbox_id, threading.current_thread().name))

    with (
        SyncHostSession(gw.endpoint, host_id, gw.host_token(host_id), apply=apply) as host,
        Client(gw.endpoint) as client,
    ):
        assert host.wait_accepted(timeout=30).served_by == gw.replica
        name = unique("py-host-sync")
        sandbox = client.sandboxes.create(name)
        try:
            deadline = time.monotonic() + 20
            while not seen and time.monotonic() < deadline:
                time.sleep(0.05)
            assert seen and seen[0][0] == sandbox.id
            assert seen[0][1].startswith("openshell-host-apply")
            assert host.stats().assigned == 1
        finally:
            client.sandboxes.delete(name)
        closer = threading.Timer(0.2, host.close)
        closer.start()
        host.run()  # returns once close() ran on the other thread
        assert host.closed


HOSTS_HELD = "openshell_server_supervisor_hosts"


# Run in a process of its own: where the TLS trust store is read from is
# fixed per process. An https endpoint with no CA bundle given and no
# system roots to read is a session that cannot run at all.
_UNUSABLE_ENDPOINT = """
import sys
from openshell_sdk import SyncConfigSession, SyncHostSession

def apply(*args):
    return None

session = (
    SyncHostSession("https://127.0.0.1:1", "h-0", "t" * 43, apply=apply)
    if sys.argv[1] == "host"
    else SyncConfigSession("https://127.0.0.1:1", "sb-0", "t" * 43, apply=apply)
)
try:
    if sys.argv[1] == "host":
        session.run()
    else:
        session.start()
        session.wait_closed(30)
except Exception as err:
    print("raised", type(err).__name__, err.code)
else:
    print("returned")
"""


@pytest.mark.parametrize("kind", ["host", "config"])
def test_a_sync_session_that_cannot_run_raises_its_error(kind: str, tmp_path: Path) -> None:
    empty = tmp_path / "no-roots.pem"
    empty.write_text("")
    env = {
        **os.environ,
        "SSL_CERT_FILE": str(empty),
        "SSL_CERT_DIR": str(tmp_path / "no-such-dir"),
    }
    done = subprocess.run(
        [sys.executable, "-c", _UNUSABLE_ENDPOINT, kind],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "raised TlsError tls", done.stdout
