"""The Python row of the cross-language benchmark: the SDK's sync ``Client`` and
``AsyncClient`` beside grpcio (sync and ``grpc.aio``) on one gateway, in one run.

Measured per client, in rounds; in every round each measurement visits the
clients in a fresh random order, and the figures are medians over rounds:

- unary ``GetSandbox`` latency, p50 and p99 of a batch of calls one at a time;
- 100 concurrent ``GetSandbox`` calls: completed calls per second with 100
  callers (asyncio tasks for the async clients, threads for the sync ones);
- forward throughput in Gbit/s with iperf3 on both ends: ``iperf3 -c`` here,
  into the SDK's ``forward`` or the grpcio ``ForwardTcp`` pump of
  ``grpcio_forward.py``, to ``iperf3 -s`` on the sandbox's loopback;
- exec stdout in MiB/s: a command in the sandbox writes ``EXEC_MIB`` MiB to
  stdout, read as a stream (SDK ``exec_stream`` or grpcio ``ExecSandbox``).

grpcio's stubs are generated from ``proto/`` with ``grpc_tools.protoc`` into a
temporary directory at start.

Inputs (environment):

- ``OPENSHELL_ENDPOINT`` (required), ``OPENSHELL_TOKEN`` (optional);
- ``OPENSHELL_BENCH_SANDBOX``: a READY sandbox;
- ``OPENSHELL_BENCH_IPERF_PORT``: an ``iperf3 -s`` on 127.0.0.1:PORT inside
  the sandbox's network (its own loopback under isolation), a forward target
  (forward rows are ``null`` without it);
- ``OPENSHELL_BENCH_ROUNDS`` (default 5), ``OPENSHELL_BENCH_FORWARD_SECONDS``
  (default 3).

Output: a table, then as the last line ``BENCH_JSON {...}`` with one row per
client (``sdk-sync``, ``sdk-async``, ``grpcio-sync``, ``grpcio-aio``).
``run_local.py`` starts a gateway, a sandbox and iperf3 in it for a local run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import importlib.resources
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from grpc_tools import protoc

from openshell_sdk import AsyncClient, Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpcio_forward import AioForward, ThreadForward

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"

CLIENTS = ("sdk-sync", "sdk-async", "grpcio-sync", "grpcio-aio")
SYNC_CLIENTS = frozenset({"sdk-sync", "grpcio-sync"})
UNARY_WARMUP = 50
UNARY_CALLS = 300
CONCURRENCY = 100
CALLS_PER_CALLER = 10
EXEC_MIB = 64
CALL_TIMEOUT = 30.0


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        sys.exit(f"{name} must be an integer")
    if number <= 0:
        sys.exit(f"{name} must be positive")
    return number


def generate_stubs(out: Path) -> tuple[Any, Any]:
    """``openshell_pb2`` and ``openshell_pb2_grpc`` generated from ``proto/`` into ``out``."""
    include = importlib.resources.files("grpc_tools") / "_proto"
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.glob("openshell/*.proto"))
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            *protos,
        ]
    )
    if code != 0:
        sys.exit(f"grpc_tools.protoc failed ({code}) on {PROTO_DIR}")
    sys.path.insert(0, str(out))
    pb = importlib.import_module("openshell.openshell_pb2")
    pb_grpc = importlib.import_module("openshell.openshell_pb2_grpc")
    return pb, pb_grpc


def percentile(sorted_values: list[float], p: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * p))]


@dataclass
class Figures:
    """Per-round figures of one client."""

    p50_us: list[float] = field(default_factory=list)
    p99_us: list[float] = field(default_factory=list)
    concurrent_per_s: list[float] = field(default_factory=list)
    forward_gbit_s: list[float] = field(default_factory=list)
    exec_mib_s: list[float] = field(default_factory=list)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass
class Setup:
    endpoint: str
    target: str
    token: str | None
    sandbox: str
    iperf_port: int | None
    iperf3: str | None
    rounds: int
    forward_seconds: int

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


def read_setup() -> Setup:
    endpoint = os.environ.get("OPENSHELL_ENDPOINT")
    if not endpoint:
        sys.exit("OPENSHELL_ENDPOINT is required (for example http://127.0.0.1:17670)")
    sandbox = os.environ.get("OPENSHELL_BENCH_SANDBOX")
    if not sandbox:
        sys.exit("OPENSHELL_BENCH_SANDBOX is required (a READY sandbox)")
    if endpoint.startswith("http://"):
        target = endpoint.removeprefix("http://").rstrip("/")
    else:
        sys.exit("OPENSHELL_ENDPOINT must be an http:// endpoint (the benchmark runs on loopback)")
    iperf_port = env_int("OPENSHELL_BENCH_IPERF_PORT", 0) or None
    iperf3 = shutil.which("iperf3")
    if iperf_port is not None and iperf3 is None:
        print("iperf3 is not on PATH: no forward figures", file=sys.stderr)
    return Setup(
        endpoint=endpoint.rstrip("/"),
        target=target,
        token=os.environ.get("OPENSHELL_TOKEN") or None,
        sandbox=sandbox,
        iperf_port=iperf_port,
        iperf3=iperf3,
        rounds=env_int("OPENSHELL_BENCH_ROUNDS", 5),
        forward_seconds=env_int("OPENSHELL_BENCH_FORWARD_SECONDS", 3),
    )


def iperf_command(iperf3: str, port: int, seconds: int) -> list[str]:
    return [iperf3, "-c", "127.0.0.1", "-p", str(port), "-t", str(seconds), "-J"]


def iperf_gbit(output: bytes, port: int) -> float:
    report = json.loads(output)
    if report.get("error"):
        raise RuntimeError(f"iperf3 -c to port {port}: {report['error']}")
    return float(report["end"]["sum_received"]["bits_per_second"]) / 1e9


class Bench:
    """The four clients on one gateway, and the measurements of each."""

    def __init__(self, setup: Setup, pb: Any, pb_grpc: Any) -> None:
        self.setup = setup
        self.pb = pb
        self.stub_class = pb_grpc.OpenShellStub
        self.loop = asyncio.new_event_loop()
        self.sync_client = Client(
            setup.endpoint, token=setup.token, allow_cleartext_token=setup.token is not None
        )
        self.async_client: AsyncClient = self.loop.run_until_complete(self._async_client())
        options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        self.channel = grpc.insecure_channel(setup.target, options=options)
        self.stub = self.stub_class(self.channel)
        self.aio_channel: grpc.aio.Channel = self.loop.run_until_complete(
            self._aio_channel(options)
        )
        self.aio_stub = self.stub_class(self.aio_channel)
        self.request = pb.GetSandboxRequest(name=setup.sandbox)
        self.pool = concurrent.futures.ThreadPoolExecutor(CONCURRENCY)
        self.forwards: dict[str, int] = {}
        self._closers: list[Callable[[], None]] = []

    async def _async_client(self) -> AsyncClient:
        return AsyncClient(
            self.setup.endpoint,
            token=self.setup.token,
            allow_cleartext_token=self.setup.token is not None,
        )

    async def _aio_channel(self, options: list[tuple[str, int]]) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(self.setup.target, options=options)

    # ---------------------------------------------------------------- unary

    def sync_call(self, client: str) -> Callable[[], None]:
        name = self.setup.sandbox
        metadata = self.setup.metadata
        if client == "sdk-sync":
            sandboxes = self.sync_client.sandboxes

            def sdk() -> None:
                sandboxes.get(name, timeout=CALL_TIMEOUT)

            return sdk
        stub, request = self.stub, self.request

        def grpcio() -> None:
            stub.GetSandbox(request, metadata=metadata, timeout=CALL_TIMEOUT)

        return grpcio

    def async_call(self, client: str) -> Callable[[], Awaitable[Any]]:
        name = self.setup.sandbox
        metadata = self.setup.metadata
        if client == "sdk-async":
            sandboxes = self.async_client.sandboxes
            return lambda: sandboxes.get(name, timeout=CALL_TIMEOUT)
        stub, request = self.aio_stub, self.request
        return lambda: stub.GetSandbox(request, metadata=metadata, timeout=CALL_TIMEOUT)

    def unary(self, client: str, figures: Figures) -> None:
        if client in SYNC_CLIENTS:
            call = self.sync_call(client)
            for _ in range(UNARY_WARMUP):
                call()
            samples = []
            for _ in range(UNARY_CALLS):
                started = time.perf_counter_ns()
                call()
                samples.append((time.perf_counter_ns() - started) / 1000)
        else:
            samples = self.loop.run_until_complete(self._async_unary(self.async_call(client)))
        samples.sort()
        figures.p50_us.append(percentile(samples, 0.50))
        figures.p99_us.append(percentile(samples, 0.99))

    @staticmethod
    async def _async_unary(call: Callable[[], Awaitable[Any]]) -> list[float]:
        for _ in range(UNARY_WARMUP):
            await call()
        samples = []
        for _ in range(UNARY_CALLS):
            started = time.perf_counter_ns()
            await call()
            samples.append((time.perf_counter_ns() - started) / 1000)
        return samples

    # ---------------------------------------------------------------- concurrent

    def concurrent(self, client: str, figures: Figures) -> None:
        if client in SYNC_CLIENTS:
            call = self.sync_call(client)

            def caller(start: threading.Barrier) -> None:
                start.wait()
                for _ in range(CALLS_PER_CALLER):
                    call()

            barrier = threading.Barrier(CONCURRENCY + 1)
            futures = [self.pool.submit(caller, barrier) for _ in range(CONCURRENCY)]
            barrier.wait()
            started = time.perf_counter()
            for future in futures:
                future.result()
            elapsed = time.perf_counter() - started
        else:
            elapsed = self.loop.run_until_complete(self._async_concurrent(self.async_call(client)))
        figures.concurrent_per_s.append(CONCURRENCY * CALLS_PER_CALLER / elapsed)

    @staticmethod
    async def _async_concurrent(call: Callable[[], Awaitable[Any]]) -> float:
        async def caller() -> None:
            for _ in range(CALLS_PER_CALLER):
                await call()

        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
        return time.perf_counter() - started

    # ---------------------------------------------------------------- forward

    def open_forwards(self) -> None:
        """One forward per client, kept for the whole run."""
        port = self.setup.iperf_port
        if port is None or self.setup.iperf3 is None:
            return
        sandbox, metadata = self.setup.sandbox, self.setup.metadata
        sync_forward = self.sync_client.forward(sandbox, port)
        self.forwards["sdk-sync"] = sync_forward.port
        self._closers.append(sync_forward.close)

        async def open_async() -> tuple[Any, AioForward]:
            sdk = await self.async_client.forward(sandbox, port)
            aio = await AioForward(
                self.aio_channel, self.pb, self.stub_class, sandbox, port, metadata
            ).start()
            return sdk, aio

        async_forward, aio_forward = self.loop.run_until_complete(open_async())
        self.forwards["sdk-async"] = async_forward.port
        self._closers.append(async_forward.close)
        self.forwards["grpcio-aio"] = aio_forward.port
        self._closers.append(lambda: self.loop.run_until_complete(aio_forward.close()))
        thread_forward = ThreadForward(
            self.channel, self.pb, self.stub_class, sandbox, port, metadata
        )
        self.forwards["grpcio-sync"] = thread_forward.port
        self._closers.append(thread_forward.close)

    def forward(self, client: str, figures: Figures) -> None:
        local = self.forwards.get(client)
        if local is None or self.setup.iperf3 is None:
            return
        command = iperf_command(self.setup.iperf3, local, self.setup.forward_seconds)
        limit = self.setup.forward_seconds + 60
        if client == "grpcio-aio":
            # The pump runs on this loop: the loop must run while iperf3 does.
            output = self.loop.run_until_complete(self._async_iperf(command, limit))
        else:
            output = subprocess.run(command, capture_output=True, timeout=limit, check=False).stdout
        figures.forward_gbit_s.append(iperf_gbit(output, local))

    @staticmethod
    async def _async_iperf(command: list[str], limit: float) -> bytes:
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), limit)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        return output

    # ---------------------------------------------------------------- exec

    def exec_command(self) -> list[str]:
        return ["head", "-c", str(EXEC_MIB * 1024 * 1024), "/dev/zero"]

    def exec_stdout(self, client: str, figures: Figures) -> None:
        command = self.exec_command()
        started = time.perf_counter()
        if client == "sdk-sync":
            received = 0
            with self.sync_client.exec_stream(self.setup.sandbox, command, timeout=120) as stream:
                for event in stream:
                    data = getattr(event, "data", None)
                    if data is not None:
                        received += len(data)
                exit_code = stream.exit_code
        elif client == "grpcio-sync":
            received, exit_code = 0, None
            request = self.pb.ExecSandboxRequest(sandbox=self.setup.sandbox, command=command)
            for event in self.stub.ExecSandbox(request, metadata=self.setup.metadata, timeout=120):
                kind = event.WhichOneof("payload")
                if kind == "stdout":
                    received += len(event.stdout.data)
                elif kind == "exit":
                    exit_code = event.exit.exit_code
        else:
            received, exit_code = self.loop.run_until_complete(self._async_exec(client, command))
        elapsed = time.perf_counter() - started
        expected = EXEC_MIB * 1024 * 1024
        if received != expected or exit_code != 0:
            raise RuntimeError(
                f"{client} exec: {received} bytes of stdout (want {expected}), exit {exit_code}"
            )
        figures.exec_mib_s.append(EXEC_MIB / elapsed)

    async def _async_exec(self, client: str, command: list[str]) -> tuple[int, int | None]:
        received = 0
        if client == "sdk-async":
            async with self.async_client.exec_stream(
                self.setup.sandbox, command, timeout=120
            ) as stream:
                async for event in stream:
                    data = getattr(event, "data", None)
                    if data is not None:
                        received += len(data)
                return received, stream.exit_code
        exit_code = None
        request = self.pb.ExecSandboxRequest(sandbox=self.setup.sandbox, command=command)
        async for event in self.aio_stub.ExecSandbox(
            request, metadata=self.setup.metadata, timeout=120
        ):
            kind = event.WhichOneof("payload")
            if kind == "stdout":
                received += len(event.stdout.data)
            elif kind == "exit":
                exit_code = event.exit.exit_code
        return received, exit_code

    # ---------------------------------------------------------------- run

    def close(self) -> None:
        for close in reversed(self._closers):
            close()
        self.sync_client.close()
        self.loop.run_until_complete(self.async_client.close())
        self.loop.run_until_complete(self.aio_channel.close())
        self.channel.close()
        self.pool.shutdown()
        self.loop.close()


def run(setup: Setup, pb: Any, pb_grpc: Any) -> dict[str, Figures]:
    bench = Bench(setup, pb, pb_grpc)
    figures = {client: Figures() for client in CLIENTS}
    measurements = (bench.unary, bench.concurrent, bench.forward, bench.exec_stdout)
    try:
        bench.open_forwards()
        for round_number in range(setup.rounds):
            for measure in measurements:
                order = list(CLIENTS)
                random.shuffle(order)
                for client in order:
                    measure(client, figures[client])
            print(f"round {round_number + 1}/{setup.rounds} done", file=sys.stderr, flush=True)
    finally:
        bench.close()
    return figures


def fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def report(setup: Setup, figures: dict[str, Figures]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for client in CLIENTS:
        f = figures[client]
        rows.append(
            {
                "client": client,
                "unary_p50_us": median(f.p50_us),
                "unary_p99_us": median(f.p99_us),
                "concurrent_per_s": median(f.concurrent_per_s),
                "forward_gbit_s": median(f.forward_gbit_s),
                "exec_stdout_mib_s": median(f.exec_mib_s),
            }
        )
    print(
        f"Python SDK vs grpcio ({setup.rounds} rounds, medians; unary: {UNARY_CALLS} calls "
        f"per client per round; concurrent: {CONCURRENCY} callers x {CALLS_PER_CALLER} calls; "
        f"forward: iperf3 -t {setup.forward_seconds}; exec: {EXEC_MIB} MiB of stdout)"
    )
    print(
        f"  {'client':<12} {'p50 us':>9} {'p99 us':>9} {'calls/s':>9} "
        f"{'Gbit/s':>8} {'exec MiB/s':>11}"
    )
    for row in rows:
        print(
            f"  {row['client']:<12} {fmt(row['unary_p50_us'], '9.0f')} "
            f"{fmt(row['unary_p99_us'], '9.0f')} {fmt(row['concurrent_per_s'], '9.0f')} "
            f"{fmt(row['forward_gbit_s'], '8.2f')} {fmt(row['exec_stdout_mib_s'], '11.0f')}"
        )
    by_client = {row["client"]: row for row in rows}
    for sdk, native in (("sdk-sync", "grpcio-sync"), ("sdk-async", "grpcio-aio")):
        print(f"  {sdk} / {native}: " + ratio_line(by_client[sdk], by_client[native]))
    print(
        "  sdk-sync forward / grpcio-sync pump: "
        + ratio(by_client["sdk-sync"]["forward_gbit_s"], by_client["grpcio-sync"]["forward_gbit_s"])
        + ", sdk-async forward / grpcio-aio pump: "
        + ratio(by_client["sdk-async"]["forward_gbit_s"], by_client["grpcio-aio"]["forward_gbit_s"])
    )
    return {"language": "python", "rows": rows}


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def ratio_line(sdk: dict[str, Any], native: dict[str, Any]) -> str:
    return ", ".join(
        f"{label} {ratio(sdk[key], native[key])}"
        for label, key in (
            ("p50", "unary_p50_us"),
            ("p99", "unary_p99_us"),
            ("calls/s", "concurrent_per_s"),
            ("exec", "exec_stdout_mib_s"),
        )
    )


def main() -> None:
    setup = read_setup()
    with tempfile.TemporaryDirectory(prefix="openshell-pybench-") as tmp:
        pb, pb_grpc = generate_stubs(Path(tmp))
        figures = run(setup, pb, pb_grpc)
    document = report(setup, figures)
    print("BENCH_JSON " + json.dumps(document, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
