"""Runs ``languages.py`` against a gateway of its own: starts
``openshell-gateway serve --dev`` from ``$OPENSHELL_BIN_DIR`` (default
``target/release``), creates a READY sandbox and an ``iperf3 -s`` inside it
(on the sandbox's own loopback, where a forward's target is: it runs through
an exec stream), runs the benchmark with the environment it expects, and stops
iperf3 by cancelling its stream and the gateway by its PID.

    OPENSHELL_BIN_DIR=target/release .venv/bin/python sdk-python/bench/run_local.py

``OPENSHELL_BENCH_ROUNDS`` and ``OPENSHELL_BENCH_FORWARD_SECONDS`` pass through.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from openshell_sdk import Client, ExecExit, OpenShellError, SyncExecStream

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0
SANDBOX = "pybench"


def stop(process: subprocess.Popen[bytes], sig: int) -> None:
    if process.poll() is not None:
        return
    os.kill(process.pid, sig)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_gateway(bin_dir: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    ready = tmp / "ready.json"
    log = open(tmp / "gateway.log", "wb")  # noqa: SIM115 (the process keeps it)
    process = subprocess.Popen(
        [
            str(bin_dir / "openshell-gateway"),
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--data-dir",
            str(tmp / "data"),
            "--ready-file",
            str(ready),
            "--supervisor-bin",
            str(bin_dir / "openshell-supervisor"),
            "--stop-sandboxes-on-exit",
            "--dev",
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
    )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"the gateway exited before it was ready (log: {tmp / 'gateway.log'})")
        try:
            url = str(json.loads(ready.read_text())["url"]).rstrip("/")
            return process, url
        except (OSError, ValueError, KeyError):
            time.sleep(0.05)
    stop(process, signal.SIGINT)
    sys.exit("the gateway did not start in time")


def start_iperf(client: Client, port: int) -> tuple[SyncExecStream, threading.Thread]:
    """``iperf3 -s`` on ``port`` inside the sandbox, through an exec stream
    (cancelling it ends iperf3: the gateway kills the process group). The port
    is one free on this host, so that it is free in the sandbox without
    isolation too. A thread reads the stream to its end, so iperf3 never blocks
    on a full pipe."""
    if shutil.which("iperf3") is None:
        sys.exit("iperf3 is not on PATH (make bench installs it)")
    stream = client.exec_stream(
        SANDBOX, ["iperf3", "-s", "--forceflush", "-B", "127.0.0.1", "-p", str(port)]
    )
    output = bytearray()
    settled = threading.Event()

    def read() -> None:
        try:
            for event in stream:
                if not settled.is_set() and not isinstance(event, ExecExit):
                    output.extend(event.data)
                    if b"Server listening" in output:
                        settled.set()
        except OpenShellError:
            pass  # the cancel at the end
        finally:
            settled.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if not settled.wait(10) or b"Server listening" not in output:
        stop_iperf(stream, reader)
        sys.exit(
            "iperf3 -s did not listen in the sandbox in time: "
            + output.decode(errors="replace")[-2000:]
        )
    return stream, reader


def stop_iperf(stream: SyncExecStream, reader: threading.Thread) -> None:
    stream.cancel()
    reader.join(10)


def main() -> None:
    bin_dir = Path(os.environ.get("OPENSHELL_BIN_DIR", ROOT / "target" / "release"))
    with tempfile.TemporaryDirectory(prefix="openshell-pybench-run-") as tmp_name:
        tmp = Path(tmp_name)
        gateway, url = start_gateway(bin_dir, tmp)
        try:
            with Client(url) as client:
                client.sandboxes.create(SANDBOX)
                client.sandboxes.wait_ready(SANDBOX, timeout=60)
                port = free_port()
                env = {
                    **os.environ,
                    "OPENSHELL_ENDPOINT": url,
                    "OPENSHELL_BENCH_SANDBOX": SANDBOX,
                    "OPENSHELL_BENCH_IPERF_PORT": str(port),
                }
                env.pop("OPENSHELL_TOKEN", None)
                bench = Path(__file__).resolve().parent / "languages.py"
                iperf = start_iperf(client, port)
                try:
                    code = subprocess.run(
                        [sys.executable, str(bench)], env=env, check=False
                    ).returncode
                finally:
                    stop_iperf(*iperf)
        finally:
            stop(gateway, signal.SIGINT)
    sys.exit(code)


if __name__ == "__main__":
    main()
