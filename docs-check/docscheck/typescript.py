"""TypeScript blocks: each block is a module compiled with sdk-typescript's
pinned ``tsc`` (strict, NodeNext) against ``@openshell/sdk`` from the tree,
then run with ``node``."""

from __future__ import annotations

import json
import shutil
import time

from .blocks import Block
from .common import ROOT, SNIPPET_TIMEOUT
from .context import Context, run_logged, write_if_changed
from .gateways import block_env

TS_LANGS = {"typescript", "ts"}


def check_typescript(ctx: Context, blocks: list[Block]) -> None:
    """Compiles every block in one strict tsc run, then runs each with node."""
    if not blocks:
        return
    base = ctx.work / "typescript"
    scope = base / "node_modules" / "@openshell"
    scope.mkdir(parents=True, exist_ok=True)
    package = ROOT / "sdk-typescript"
    for link, to in (
        (scope / "sdk", package),
        (base / "node_modules" / "@types", package / "node_modules" / "@types"),
    ):
        if not link.is_symlink():
            link.symlink_to(to)
    write_if_changed(base / "package.json", '{"type": "module"}\n')
    # Exactly the setup the README's TypeScript quick start tells a user to
    # use (package.json "type": "module" above, these compiler options): a
    # block that needs more does not run for a user either.
    options = {
        "target": "ES2022",
        "module": "NodeNext",
        "strict": True,
        "types": ["node"],
        "outDir": "dist",
    }
    config = {"compilerOptions": options, "include": ["*.ts"]}
    write_if_changed(base / "tsconfig.json", json.dumps(config, indent=2) + "\n")
    for block in blocks:
        write_if_changed(base / f"{block.name}.ts", block.text)
    log = ctx.work / "logs" / "typescript-tsc.log"
    tsc = [str(package / "node_modules" / ".bin" / "tsc"), "-p", str(base)]
    if run_logged(tsc, ctx, log, SNIPPET_TIMEOUT, env=ctx.env, cwd=base) != 0:
        for block in blocks:
            ctx.report(block, "FAIL", f"tsc failed (see {log})")
        return
    for block in blocks:
        log = ctx.work / "logs" / f"{block.name}.log"
        started = time.monotonic()
        program = [str(shutil.which("node") or "node"), str(base / "dist" / f"{block.name}.js")]
        rc = run_logged(program, ctx, log, SNIPPET_TIMEOUT, env=block_env(ctx, block), cwd=base)
        took = f"({time.monotonic() - started:.1f} s)"
        ctx.report(block, "ok" if rc == 0 else "FAIL", took if rc == 0 else f"exit {rc}")
