"""Rust blocks: each block is one binary of a scratch crate (under the cargo
target directory) that depends on ``sdk-core`` by path and copies the
workspace's lock file and profiles, so it shares every compiled dependency
with ``make build``. A block of tests (``#[test]``, no ``main``) is one of
its integration tests. All are compiled (warnings are errors), then run."""

from __future__ import annotations

import os
import re
import subprocess
import time
import tomllib
from pathlib import Path

from .blocks import Block
from .common import ROOT, SNIPPET_TIMEOUT
from .context import Context, run_logged, write_if_changed


def workspace_profiles() -> str:
    """The root manifest's [profile.*] sections: same profile, same artifacts."""
    text = (ROOT / "Cargo.toml").read_text(encoding="utf-8")
    sections = re.split(r"(?m)^(?=\[)", text)
    return "".join(s for s in sections if s.startswith("[profile")).strip() + "\n"


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


def sdk_core_dependencies() -> str:
    """sdk-core's dependencies and dev-dependencies, as `cargo run -p
    openshell-sdk --example ...` (documented in the READMEs) resolves them:
    the snippets get the same feature set, so the two share one build of
    sdk-core's graph."""
    root = tomllib.loads((ROOT / "Cargo.toml").read_text(encoding="utf-8"))
    shared = root["workspace"]["dependencies"]
    manifest = tomllib.loads((ROOT / "sdk-core" / "Cargo.toml").read_text(encoding="utf-8"))
    lines = [f"openshell-sdk = {toml_value({'path': str(ROOT / 'sdk-core')})}"]
    for table in ("dependencies", "dev-dependencies"):
        for name, spec in manifest.get(table, {}).items():
            if isinstance(spec, str):
                spec = {"version": spec}
            spec = dict(spec)
            if spec.pop("workspace", False):
                base = shared[name]
                base = {"version": base} if isinstance(base, str) else dict(base)
                base["features"] = base.get("features", []) + spec.pop("features", [])
                spec = {**base, **spec}
            if "path" in spec:
                spec["path"] = str(ROOT / spec["path"])
            lines.append(f"{name} = {toml_value(spec)}")
    return "\n".join(lines) + "\n"


def rust_crate(ctx: Context, blocks: list[Block]) -> Path:
    crate = ctx.target_dir / "docs-check" / "snippets"
    manifest = f"""# Written by docs-check/check_docs.py: one binary per README block.
[package]
name = "openshell-docs-snippets"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
{sdk_core_dependencies()}
[lints.rust]
warnings = "deny"

[workspace]

{workspace_profiles()}"""
    write_if_changed(crate / "Cargo.toml", manifest)
    write_if_changed(crate / "Cargo.lock", (ROOT / "Cargo.lock").read_text(encoding="utf-8"))
    write_if_changed(crate / "src" / "lib.rs", "")
    for folder, kind in ((crate / "src" / "bin", False), (crate / "tests", True)):
        mine = [b for b in blocks if is_rust_test(b) == kind]
        wanted = {f"{b.name}.rs" for b in mine}
        if folder.exists():
            for stale in folder.iterdir():
                if stale.name not in wanted:
                    stale.unlink()
        for block in mine:
            write_if_changed(folder / f"{block.name}.rs", block.text)
    return crate


def is_rust_test(block: Block) -> bool:
    """A block of tests (`#[test]`/`#[tokio::test]`, no `main`): an integration test."""
    has_tests = re.search(r"^#\[(tokio::)?test\]", block.text, re.MULTILINE) is not None
    return has_tests and re.search(r"^(async )?fn main\(", block.text, re.MULTILINE) is None


def check_rust(ctx: Context, blocks: list[Block]) -> None:
    if not blocks:
        return
    crate = rust_crate(ctx, blocks)
    print(f"check-docs: compiling {len(blocks)} rust block(s) in {crate}", flush=True)
    for block in blocks:
        where = "tests" if is_rust_test(block) else "src/bin"
        print(f"check-docs:   {where}/{block.name}.rs is {block.where}", flush=True)
    cargo = os.environ.get("CARGO", "cargo")
    manifest = ["--manifest-path", str(crate / "Cargo.toml")]
    build = subprocess.run([cargo, "build", *manifest, "--bins", "--tests"], env=ctx.env, cwd=crate)
    if build.returncode != 0:
        for block in blocks:
            ctx.report(block, "FAIL", "(the scratch crate does not compile: see above)")
        return
    for block in blocks:
        argv = [str(ctx.bin_dir / block.name)]
        if is_rust_test(block):
            argv = [cargo, "test", "-q", *manifest, "--test", block.name]
        log = ctx.work / "logs" / f"{block.name}.log"
        started = time.monotonic()
        rc = run_logged(argv, ctx, log, SNIPPET_TIMEOUT, cwd=ctx.work)
        took = f"({time.monotonic() - started:.1f} s)"
        ctx.report(block, "ok" if rc == 0 else "FAIL", took if rc == 0 else f"exit {rc}")
