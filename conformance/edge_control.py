"""The harness's own edge: the routes in front of the cluster, under its control.

Runners reach the cluster through an `openshell-gateway edge` that the
harness starts with a routes file it writes (one route per replica, read
from the replicas' ready files in `<data dir>/up/`). That gives the harness
the `replica_control` capability: on a runner's request it points one
replica's route at a dead loopback port, so that a call hinted to that
replica is answered by the edge as never forwarded (`x-openshell-edge:
not-forwarded`), the case the SDK's unrouted retry exists for. The replica
itself keeps running (stopping it would make `up` stop the whole cluster).

Control is a loopback TCP port, one line per request, one line per answer:

    unroute gw-1   ->  ok        (gw-1's route now refuses connections)
    restore        ->  ok        (every route points at its replica again)
    anything else  ->  error: <why>

An answer comes only once the edge has reloaded its routes (its
`openshell_edge_route_reloads_total{result="ok"}` counter grew), so the
runner's next call already sees the new routes. Runners learn the port from
`OPENSHELL_CONFORMANCE_CONTROL` (`127.0.0.1:PORT`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import socketserver
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

START_TIMEOUT = 30.0
RELOAD_TIMEOUT = 10.0
RELOADS_OK = re.compile(r'^openshell_edge_route_reloads_total\{result="ok"\} (\d+)$', re.M)


class EdgeControlError(Exception):
    """The edge could not be started or did not apply a route change."""


def replica_routes(data_dir: Path) -> dict[str, str]:
    """Replica id -> URL, from the ready files `up` keeps in `<data dir>/up/`."""
    routes = {}
    for ready in sorted((data_dir / "up").glob("gw-*.ready.json")):
        url = json.loads(ready.read_text()).get("url")
        if isinstance(url, str) and url:
            routes[ready.name.removesuffix(".ready.json")] = url
    return routes


class ControlledEdge:
    """An edge process in front of `routes`, and the control port that changes them."""

    def __init__(self, gateway: Path, routes: dict[str, str], work_dir: Path) -> None:
        if not routes:
            raise EdgeControlError("no replica routes to put behind the edge")
        self.routes = dict(routes)
        self.routes_file = work_dir / "harness-edge.routes.json"
        self.lock = threading.Lock()
        # Bound, never listening: a connect to it is refused, and no other
        # process can take the port while the harness holds it.
        self.dead = socket.socket()
        self.dead.bind(("127.0.0.1", 0))
        self.dead_url = f"http://127.0.0.1:{self.dead.getsockname()[1]}"
        self._write(self.routes)
        ready = work_dir / "harness-edge.ready.json"
        ready.unlink(missing_ok=True)
        self.log = open(work_dir / "harness-edge.log", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [
                str(gateway),
                "edge",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--routes-file",
                str(self.routes_file),
                "--ready-file",
                str(ready),
            ],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise EdgeControlError(
                    f"the harness's edge did not start; see {work_dir / 'harness-edge.log'}"
                )
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        self.endpoint = str(info["url"])
        self.metrics_url = f"http://{info['metrics']}/metrics"
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.control_address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _write(self, routes: dict[str, str]) -> None:
        tmp = self.routes_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"replicas": routes}))
        os.replace(tmp, self.routes_file)

    def _reloads(self) -> int:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as answer:
            found = RELOADS_OK.search(answer.read().decode())
        if found is None:
            raise EdgeControlError("the edge's metrics lack its route reload counter")
        return int(found.group(1))

    def _install(self, routes: dict[str, str]) -> None:
        """Writes the routes, signals the edge and waits until it reloaded them."""
        before = self._reloads()
        self._write(routes)
        os.kill(self.process.pid, signal.SIGHUP)
        deadline = time.monotonic() + RELOAD_TIMEOUT
        while self._reloads() <= before:
            if time.monotonic() > deadline:
                raise EdgeControlError(f"the edge did not reload in {RELOAD_TIMEOUT:.0f} s")
            time.sleep(0.02)

    def unroute(self, replica: str) -> None:
        if replica not in self.routes:
            raise EdgeControlError(f"no replica {replica!r} (known: {sorted(self.routes)})")
        with self.lock:
            self._install({**self.routes, replica: self.dead_url})

    def restore(self) -> None:
        with self.lock:
            self._install(self.routes)

    def answer(self, request: str) -> str:
        words = request.split()
        try:
            if len(words) == 2 and words[0] == "unroute":
                self.unroute(words[1])
            elif words == ["restore"]:
                self.restore()
            else:
                return "error: expected `unroute REPLICA` or `restore`"
        except (EdgeControlError, OSError) as err:
            return f"error: {err}"
        return "ok"

    def _handler(self) -> type[socketserver.StreamRequestHandler]:
        edge = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for raw in self.rfile:
                    line = raw.decode(errors="replace").strip()[:200]
                    self.wfile.write((edge.answer(line) + "\n").encode())

        return Handler

    def stop(self) -> None:
        """Stops the control port and the edge (by its PID: SIGTERM, then SIGKILL)."""
        if getattr(self, "server", None) is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(15)
        self.log.close()
        self.dead.close()
