"""Go blocks: each block is the ``main.go`` of a scratch module that requires
sdk-go from the tree (a ``replace`` directive; ``make go-native`` has linked
the static library), run with ``go run``; a block of tests (``func Test...``)
is the module's ``readme_test.go``, run with ``go test``."""

from __future__ import annotations

import re
import shutil
import time

from .blocks import Block
from .common import ROOT, SNIPPET_TIMEOUT
from .context import Context, run_logged, write_if_changed
from .gateways import block_env

GO_MODULE = "example.invalid/openshell/sdk-go"


def go_binary() -> str:
    return shutil.which("go") or "/usr/local/go/bin/go"


def check_go(ctx: Context, blocks: list[Block]) -> None:
    """Each block is main.go of its own module over sdk-go from the tree, run
    with ``go run``; a block of tests (``func Test...``) is its readme_test.go,
    run with ``go test``."""
    for block in blocks:
        base = ctx.work / "go" / block.name
        base.mkdir(parents=True, exist_ok=True)
        go_mod = (
            f"module docscheck/{block.name.replace('-', '_')}\n\ngo 1.24\n\n"
            f"require {GO_MODULE} v0.0.0\n\nreplace {GO_MODULE} => {ROOT / 'sdk-go'}\n"
        )
        write_if_changed(base / "go.mod", go_mod)
        write_if_changed(base / "go.sum", (ROOT / "sdk-go" / "go.sum").read_text())
        tests = re.search(r"^func Test", block.text, re.MULTILINE) is not None
        source, other = ("readme_test.go", "main.go") if tests else ("main.go", "readme_test.go")
        (base / other).unlink(missing_ok=True)
        write_if_changed(base / source, block.text)
        log = ctx.work / "logs" / f"{block.name}.log"
        started = time.monotonic()
        env = dict(block_env(ctx, block), GOFLAGS="-mod=mod")
        argv = [go_binary(), "test", "-count=1", "-v", "."] if tests else [go_binary(), "run", "."]
        rc = run_logged(argv, ctx, log, SNIPPET_TIMEOUT, env=env, cwd=base)
        took = f"({time.monotonic() - started:.1f} s)"
        ctx.report(block, "ok" if rc == 0 else "FAIL", took if rc == 0 else f"exit {rc}")
