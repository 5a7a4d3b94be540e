"""Fixtures: real gateway processes on loopback, stopped by their own PIDs.

- ``cluster``: ``openshell-gateway up --replicas 3`` (three replicas, the edge and
  the sandbox supervisors), once per test session; the tests talk to the edge.
- ``token_gateway``: one ``openshell-gateway serve --token ...`` replica.

Binaries come from ``target/debug`` (``make build``), or ``$OPENSHELL_BIN_DIR``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from openshell_sdk import AsyncClient, Client

ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("OPENSHELL_BIN_DIR", ROOT / "target" / "debug"))
START_TIMEOUT = 90.0
# openshell_sdk.testing (and its pytest plugin) run this checkout's gateway.
os.environ.setdefault("OPENSHELL_GATEWAY_BIN", str(BIN_DIR / "openshell-gateway"))
STOP_TIMEOUT = 30.0


def gateway_binary() -> Path:
    path = BIN_DIR / "openshell-gateway"
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make build` (cargo build --workspace --bins)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGINT) -> None:
    """Signals the process by its PID and waits; SIGKILL if it does not stop in time."""
    if process.poll() is not None:
        return
    os.kill(process.pid, sig)
    try:
        process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(STOP_TIMEOUT)


@dataclass
class Cluster:
    endpoint: str
    data_dir: Path
    process: subprocess.Popen[bytes]


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A developer cluster: 3 replicas behind the edge, in dev mode (no auth)."""
    with tempfile.TemporaryDirectory(prefix="openshell-pytest-") as tmp:
        data_dir = Path(tmp) / "data"
        listen = f"127.0.0.1:{free_port()}"
        log = open(Path(tmp) / "up.log", "w+b")  # noqa: SIM115 (closed below)
        process = subprocess.Popen(
            [
                str(gateway_binary()),
                "up",
                "--replicas",
                "3",
                "--listen",
                listen,
                "--data-dir",
                str(data_dir),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        assert process.stdout is not None
        lines: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert process.stdout is not None
            for raw in process.stdout:
                line = raw.decode(errors="replace").rstrip()
                lines.append(line)
                if "serving http://" in line:
                    ready.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not ready.wait(0.2):
            if process.poll() is not None or time.monotonic() > deadline:
                stop(process)
                log.seek(0)
                pytest.fail(
                    "openshell-gateway up did not start:\n"
                    + "\n".join(lines)
                    + log.read().decode(errors="replace")[-4000:]
                )
        try:
            yield Cluster(f"http://{listen}", data_dir, process)
        finally:
            stop(process)
            log.close()


@dataclass
class TokenGateway:
    endpoint: str
    token: str


@pytest.fixture(scope="session")
def token_gateway() -> Iterator[TokenGateway]:
    """One replica that requires the bearer token ``token``."""
    token = f"tok-{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory(prefix="openshell-pytest-token-") as tmp:
        ready_file = Path(tmp) / "ready.json"
        log = open(Path(tmp) / "serve.log", "w+b")  # noqa: SIM115 (closed below)
        process = subprocess.Popen(
            [
                str(gateway_binary()),
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--data-dir",
                str(Path(tmp) / "data"),
                "--ready-file",
                str(ready_file),
                "--token",
                token,
                "--stop-sandboxes-on-exit",
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
            yield TokenGateway(str(info["url"]).rstrip("/"), token)
        finally:
            stop(process)
            log.close()


def marked_pids(marker: str) -> list[int]:
    """Host pids of the processes whose environment holds ``TEST_MARKER=marker``.

    Tests find a sandbox's processes this way: a pid the sandbox reports about
    itself is one of its own PID namespace, not the host's.
    """
    wanted = f"TEST_MARKER={marker}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if wanted in environ.split(b"\0") and process_running(int(entry.name)):
            pids.append(int(entry.name))
    return pids


def process_running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has exited: only its reaping is pending)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except FileNotFoundError:
        return False
    return not stat.rsplit(") ", 1)[-1].startswith("Z")


def unique(prefix: str) -> str:
    """A sandbox name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def client(cluster: Cluster) -> Iterator[Client]:
    with Client(cluster.endpoint) as c:
        yield c


@pytest.fixture(scope="session")
def ready_sandbox(client: Client) -> Iterator[str]:
    """One READY sandbox shared by the tests that only run commands in it."""
    name = unique("py-shared")
    client.sandboxes.create(name)
    client.sandboxes.wait_ready(name, timeout=60)
    yield name
    client.sandboxes.delete(name)
    client.sandboxes.wait_deleted(name, timeout=60)


@pytest.fixture
async def aclient(cluster: Cluster) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(cluster.endpoint) as c:
        yield c
