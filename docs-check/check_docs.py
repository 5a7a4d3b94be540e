#!/usr/bin/env python3
"""`make check-docs`: every code block of the READMEs runs.

Fenced blocks are taken by language:

- ``rust``: each block is one binary of a scratch crate (under the cargo
  target directory) that depends on ``sdk-core`` by path and copies the
  workspace's lock file and profiles, so it shares every compiled dependency
  with ``make build``. All are compiled (warnings are errors), then run.
- ``python``: each block is a file run with the project venv's Python.
- ``typescript``: each block is a module compiled with sdk-typescript's pinned
  ``tsc`` (strict, NodeNext) against ``@openshell/sdk`` from the tree, then
  run with ``node``.
- ``go``: each block is the ``main.go`` of a scratch module that requires
  sdk-go from the tree (a ``replace`` directive; ``make go-native`` has
  linked the static library), run with ``go run``; a block of tests
  (``func Test...``) is the module's ``readme_test.go``, run with ``go test``.
- ``kotlin`` and ``java``: each block is the one source file of a scratch
  Maven module that depends on ``dev.openshell:openshell-sdk`` from the local
  Maven repository (``make jvm-install`` put it there: the jar a user gets,
  native library inside); one reactor build compiles them all, then each
  block's ``main`` runs with ``java``.
- ``sh``: the blocks of one README run in order, command by command, from
  the repository root (see ``docscheck.shell.ShellRunner``).
- ``text``: output, not run. Any other language is an error.

Rust, Python, TypeScript, Go, Kotlin and Java blocks run against one cluster the check starts like
``make up`` (``openshell-gateway up --replicas 3``): on the documented
address 127.0.0.1:17670 when it is free, else on a free loopback port; either
way ``OPENSHELL_ENDPOINT`` names it, and snippets read it. Blocks that use
``ConfigSession`` (the supervisor side) instead get a single gateway started
with the hidden test driver ``none`` (``--config-delivery-mode push``) and a
fresh sandbox of their own: ``OPENSHELL_ENDPOINT``, ``OPENSHELL_SANDBOX_ID``
and ``OPENSHELL_SANDBOX_TOKEN`` name it. Blocks (Python, TypeScript or Go)
that use ``HostSession`` (a shared supervisor host) get a single gateway
started with ``--driver hosts`` and a host token of their own, issued with
``openshell-gateway host-token``: ``OPENSHELL_ENDPOINT``,
``OPENSHELL_HOST_ID`` and ``OPENSHELL_HOST_TOKEN`` name them. Every process
the check starts listens on loopback and is stopped by its PID.

The parts live in the ``docscheck`` package next to this file, one module
per concern (listed in its ``__init__``); this file reads the arguments,
takes the blocks and runs each language's check in turn.

Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from docscheck.blocks import Block, extract_blocks
from docscheck.common import ROOT, RUN_DIR, CheckFailed
from docscheck.context import Context
from docscheck.gateways import start_cluster, stop_servers
from docscheck.go import check_go
from docscheck.jvm import JVM_LANGS, check_jvm
from docscheck.python import check_python
from docscheck.rust import check_rust
from docscheck.shell import SH_LANGS, check_shell
from docscheck.typescript import TS_LANGS, check_typescript

DEFAULT_FILES = [
    "README.md",
    "sdk-python/README.md",
    "sdk-typescript/README.md",
    "sdk-go/README.md",
    "sdk-jvm/README.md",
    "sdkgen/README.md",
    "deploy/nginx/README.md",
    "sdk-core/README.md",
    "conformance/README.md",
]
IGNORED_LANGS = {"text"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", default=DEFAULT_FILES, help="Markdown files")
    parser.add_argument("--list", action="store_true", help="list the blocks and exit")
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    args = parser.parse_args()

    blocks: list[Block] = []
    for relative in args.files:
        blocks.extend(extract_blocks(relative))
    known = {"rust", "python", "go", *TS_LANGS, *JVM_LANGS, *SH_LANGS, *IGNORED_LANGS}
    unknown = [b for b in blocks if b.lang not in known]
    for block in unknown:
        print(
            f"check-docs: {block.where}: language {block.lang!r} is not checked "
            f"(use rust, python, typescript, go, kotlin, java, sh, or text for output)"
        )
    if args.list or unknown:
        for block in blocks:
            print(f"{block.where} {block.lang}")
        return 1 if unknown else 0

    target_dir = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target").resolve()
    work = target_dir / "docs-check" / "work"
    for scratch in (work, ROOT / RUN_DIR):
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
    env = dict(os.environ)
    env["CARGO_TARGET_DIR"] = str(target_dir)
    env.pop("OPENSHELL_TOKEN", None)
    # Where tools that start the gateway themselves (conformance/harness) find it.
    env["OPENSHELL_BIN_DIR"] = str(target_dir / "debug")
    ctx = Context(target_dir, work, Path(args.python), env)
    if not (ctx.bin_dir / "openshell-gateway").exists():
        print("check-docs: target/debug/openshell-gateway is missing: run `make build`")
        return 1
    started = time.monotonic()
    failures: list[str] = []
    try:
        start_cluster(ctx)
        check_rust(ctx, [b for b in blocks if b.lang == "rust"])
        check_python(ctx, [b for b in blocks if b.lang == "python"])
        check_typescript(ctx, [b for b in blocks if b.lang in TS_LANGS])
        check_go(ctx, [b for b in blocks if b.lang == "go"])
        check_jvm(ctx, [b for b in blocks if b.lang in JVM_LANGS])
        for relative in args.files:
            sh = [b for b in blocks if b.file == relative and b.lang in SH_LANGS]
            if sh:
                failures.extend(check_shell(ctx, relative, sh))
    except CheckFailed as err:
        failures.append(str(err))
    finally:
        stop_servers(ctx)
    failed = [r for r in ctx.results if r[1] == "FAIL"]
    for failure in failures:
        print(f"check-docs: {failure}")
    counts = {o: sum(1 for r in ctx.results if r[1] == o) for o in ("ok", "covered", "not run")}
    print(
        f"check-docs: {len(blocks)} blocks in {len(args.files)} files; "
        + ", ".join(f"{n} {o}" for o, n in counts.items())
        + f", {len(failed)} failed; {time.monotonic() - started:.0f} s",
        flush=True,
    )
    return 1 if failed or failures else 0


if __name__ == "__main__":
    sys.exit(main())
