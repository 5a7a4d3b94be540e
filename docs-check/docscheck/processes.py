"""Processes the check starts: free loopback ports, and servers that run in
the foreground until they are stopped by their PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .common import ROOT, CheckFailed

START_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError:
            return False
    return True


def accepts(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 0.5):
        return True
    return False


@dataclass
class Server:
    """A process serving in the foreground; stopped by its PID."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    extra_logs: list[Path] = field(default_factory=list)

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, size: int = 3000) -> str:
        logs = [p for p in [self.log, *self.extra_logs] if p.exists()]
        texts = [p.read_text(errors="replace")[-size:] for p in logs]
        return "\n".join(t for t in texts if t)

    def wait_listening(self, address: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not accepts(address):
            if not self.alive():
                raise CheckFailed(f"{self.name} exited before serving:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise CheckFailed(f"{self.name} did not listen on {address}:\n{self.tail()}")
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT)


def start_server(
    name: str, argv: list[str], log: Path, env: dict[str, str], cwd: Path = ROOT
) -> Server:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd
        )
    return Server(name, process, log)
