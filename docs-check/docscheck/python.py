"""Python blocks: each block is a file run with the project venv's Python; a
block of pytest tests (``def test_...``) runs under pytest."""

from __future__ import annotations

import re
import time

from .blocks import Block
from .common import SNIPPET_TIMEOUT
from .context import Context, run_logged, write_if_changed
from .gateways import block_env


def check_python(ctx: Context, blocks: list[Block]) -> None:
    """Each block runs as a program; a block of pytest tests runs under pytest."""
    for block in blocks:
        tests = re.search(r"^def test_", block.text, re.MULTILINE) is not None
        stem = block.name.replace("-", "_")
        path = ctx.work / "python" / (f"test_{stem}.py" if tests else f"{stem}.py")
        write_if_changed(path, block.text)
        env = block_env(ctx, block)
        log = ctx.work / "logs" / f"{block.name}.log"
        started = time.monotonic()
        argv = [str(ctx.python), str(path)]
        if tests:
            argv = [str(ctx.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)]
        rc = run_logged(argv, ctx, log, SNIPPET_TIMEOUT, env=env, cwd=ctx.work)
        took = f"({time.monotonic() - started:.1f} s)"
        ctx.report(block, "ok" if rc == 0 else "FAIL", took if rc == 0 else f"exit {rc}")
