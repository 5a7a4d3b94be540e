"""The gateways the blocks run against, and the environment a block gets.

One cluster started like ``make up`` (``openshell-gateway up --replicas 3``):
on the documented address 127.0.0.1:17670 when it is free, else on a free
loopback port; either way ``OPENSHELL_ENDPOINT`` names it, and snippets read
it. Blocks that use ``ConfigSession`` (the supervisor side) instead get a
single gateway started with the hidden test driver ``none``
(``--config-delivery-mode push``) and a fresh sandbox of their own:
``OPENSHELL_ENDPOINT``, ``OPENSHELL_SANDBOX_ID`` and
``OPENSHELL_SANDBOX_TOKEN`` name it. Blocks (Python, TypeScript or Go) that
use ``HostSession`` (a shared supervisor host) get a single gateway started
with ``--driver hosts`` and a host token of their own, issued with
``openshell-gateway host-token``: ``OPENSHELL_ENDPOINT``,
``OPENSHELL_HOST_ID`` and ``OPENSHELL_HOST_TOKEN`` name them.
"""

from __future__ import annotations

import signal
import subprocess
import time

from .blocks import Block
from .common import DOCUMENTED_ADDRESS, ROOT, RUN_DIR, CheckFailed
from .context import Context
from .processes import START_TIMEOUT, free_port, port_free, start_server


def start_cluster(ctx: Context) -> None:
    """`openshell-gateway up`, as `make up` runs it, on 17670 if that is free."""
    address = DOCUMENTED_ADDRESS if port_free(DOCUMENTED_ADDRESS) else f"127.0.0.1:{free_port()}"
    ctx.data_dir = ROOT / RUN_DIR / "data"
    gateway = str(ctx.bin_dir / "openshell-gateway")
    cluster = start_server(
        "openshell-gateway up",
        # Push mode: conformance/README.md documents push scenarios against a
        # running cluster; sandboxes and exec behave the same in both modes.
        [
            gateway,
            "up",
            "--replicas",
            "3",
            "--listen",
            address,
            "--data-dir",
            str(ctx.data_dir),
            "--config-delivery-mode",
            "push",
        ],
        ctx.work / "logs" / "cluster.log",
        ctx.env,
    )
    ctx.servers.append(cluster)
    # The supervisor-side blocks: one gateway whose sandboxes have no
    # supervisor, so the snippet holds the sandbox's session.
    listen = f"127.0.0.1:{free_port()}"
    ctx.sandbox_data = ctx.work / "driver-none"
    single = start_server(
        "openshell-gateway serve --driver none",
        [
            gateway,
            "serve",
            "--dev",
            "--allow-test-flags",
            "--driver",
            "none",
            "--config-delivery-mode",
            "push",
            "--listen",
            listen,
            "--metrics-listen",
            f"127.0.0.1:{free_port()}",
            "--data-dir",
            str(ctx.sandbox_data),
        ],
        ctx.work / "logs" / "driver-none.log",
        ctx.env,
    )
    ctx.servers.append(single)
    deadline = time.monotonic() + START_TIMEOUT
    while "serving http://" not in cluster.log.read_text(errors="replace"):
        if not cluster.alive() or time.monotonic() > deadline:
            raise CheckFailed(f"the cluster did not start:\n{cluster.tail()}")
        time.sleep(0.2)
    single.wait_listening(listen)
    ctx.edge = f"http://{address}"
    ctx.sandbox_gateway = f"http://{listen}"
    ctx.env["OPENSHELL_ENDPOINT"] = ctx.edge
    # Blocks that start a cluster of their own (`testing::LocalCluster`)
    # find the executable by its documented variable.
    ctx.env["OPENSHELL_GATEWAY_BIN"] = str(ctx.bin_dir / "openshell-gateway")
    where = "the documented address" if address == DOCUMENTED_ADDRESS else "a free port"
    print(f"check-docs: cluster of 3 replicas on {ctx.edge} ({where})", flush=True)


def stop_servers(ctx: Context) -> None:
    for server in reversed(ctx.servers):
        # `up` stops its replicas and their supervisors on SIGINT, like Ctrl-C.
        server.stop(signal.SIGINT if server.name.endswith(" up") else signal.SIGTERM)
    ctx.servers.clear()


def supervisor_side_env(ctx: Context, block: Block) -> dict[str, str]:
    """A fresh sandbox on the driver-none gateway, and its token."""
    create = (
        "import sys\nfrom openshell_sdk import Client\n"
        "with Client(sys.argv[1]) as c:\n"
        "    s = c.sandboxes.create(labels={'docs-check': 'supervisor-side'})\n"
        "    print(s.id)\n"
    )
    out = subprocess.run(
        [str(ctx.python), "-c", create, ctx.sandbox_gateway],
        capture_output=True,
        text=True,
        env=ctx.env,
        timeout=60,
    )
    if out.returncode != 0:
        raise CheckFailed(f"{block.where}: creating its sandbox failed:\n{out.stderr}")
    sandbox_id = out.stdout.strip()
    tokens = list(ctx.sandbox_data.glob(f"**/sandboxes/{sandbox_id}/token"))
    if not tokens:
        raise CheckFailed(f"{block.where}: no token file for sandbox {sandbox_id}")
    env = dict(ctx.env)
    env["OPENSHELL_ENDPOINT"] = ctx.sandbox_gateway
    env["OPENSHELL_SANDBOX_ID"] = sandbox_id
    env["OPENSHELL_SANDBOX_TOKEN"] = tokens[0].read_text().strip()
    return env


def host_side_env(ctx: Context, block: Block) -> dict[str, str]:
    """A `--driver hosts` gateway (started on first use) and a host token
    issued for this block's own host id."""
    if not ctx.host_gateway:
        listen = f"127.0.0.1:{free_port()}"
        ctx.host_data = ctx.work / "driver-hosts"
        server = start_server(
            "openshell-gateway serve --driver hosts",
            [
                str(ctx.bin_dir / "openshell-gateway"),
                "serve",
                "--dev",
                "--driver",
                "hosts",
                "--config-delivery-mode",
                "push",
                "--listen",
                listen,
                "--metrics-listen",
                f"127.0.0.1:{free_port()}",
                "--data-dir",
                str(ctx.host_data),
            ],
            ctx.work / "logs" / "driver-hosts.log",
            ctx.env,
        )
        ctx.servers.append(server)
        server.wait_listening(listen)
        ctx.host_gateway = f"http://{listen}"
    host_id = f"docs-{block.name}"
    token_file = ctx.work / "host-tokens" / host_id
    token_file.parent.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [
            str(ctx.bin_dir / "openshell-gateway"),
            "host-token",
            "--data-dir",
            str(ctx.host_data),
            "--host-id",
            host_id,
            "--out",
            str(token_file),
        ],
        capture_output=True,
        text=True,
        env=ctx.env,
        timeout=60,
    )
    if out.returncode != 0:
        raise CheckFailed(f"{block.where}: issuing its host token failed:\n{out.stderr}")
    env = dict(ctx.env)
    env["OPENSHELL_ENDPOINT"] = ctx.host_gateway
    env["OPENSHELL_HOST_ID"] = host_id
    env["OPENSHELL_HOST_TOKEN"] = token_file.read_text().strip()
    return env


def block_env(ctx: Context, block: Block) -> dict[str, str]:
    """The environment a block runs in: host side, supervisor side, or the cluster."""
    if "HostSession" in block.text:
        return host_side_env(ctx, block)
    if block.lang == "python" and "ConfigSession" in block.text:
        return supervisor_side_env(ctx, block)
    return ctx.env
