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
- ``sh``: the blocks of one README run in order, command by command, from
  the repository root (see ``ShellRunner``).
- ``text``: output, not run. Any other language is an error.

Rust and Python blocks run against one cluster the check starts like
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

Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILES = [
    "README.md",
    "sdk-python/README.md",
    "sdk-typescript/README.md",
    "sdk-go/README.md",
    "sdkgen/README.md",
    "deploy/nginx/README.md",
    "sdk-core/README.md",
    "conformance/README.md",
]
DOCUMENTED_ADDRESS = "127.0.0.1:17670"
# What `.run` (the run directory of `make up`) stands for in sh blocks: a
# directory of its own inside it, so relative paths stay relative.
RUN_DIR = ".run/docs-check"
# The only commands a README may mark `[not run]`: `make up` serves until
# Ctrl-C, and `make test` is what runs this check.
NOT_RUN_MARK = "[not run]"
NOT_RUN_ALLOWED = {"up", "test"}
# Documented commands that `make test` runs in another target: the target,
# and the script of that target that must contain the command.
COVERED_ELSEWHERE = {
    ("pip", "install", "./sdk-python"): ("check-wheel", "scripts/check-wheel.sh"),
}
# `cargo <cmd> -p CRATE` is covered by the target that runs `<cmd>` over the
# whole workspace (the words its recipe must contain).
WORKSPACE_TARGETS = {
    ("cargo", "test"): ("test-rust", "$(CARGO) test --workspace"),
    ("cargo", "clippy"): ("lint", "$(CARGO) clippy --workspace --all-targets -- -D warnings"),
}
SH_LANGS = {"sh", "bash", "shell"}
IGNORED_LANGS = {"text"}
START_TIMEOUT = 120.0
SNIPPET_TIMEOUT = 180.0
COMMAND_TIMEOUT = 900.0
STOP_TIMEOUT = 30.0


class CheckFailed(Exception):
    pass


@dataclass
class Block:
    file: str
    line: int  # of the first line inside the fence
    lang: str
    text: str

    @property
    def name(self) -> str:
        stem = self.file.removesuffix(".md").lower().replace("/", "-")
        return re.sub(r"[^a-z0-9-]", "-", f"{stem}-l{self.line}")

    @property
    def where(self) -> str:
        last = self.line + self.text.count("\n") - 1
        return f"{self.file}:{self.line}-{last}"


FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


def extract_blocks(relative: str) -> list[Block]:
    """Fenced code blocks of one Markdown file, with their language."""
    lines = (ROOT / relative).read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        info = opening["info"].strip().split()
        lang = info[0].lower() if info else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped.startswith(fence) and set(stripped) <= {fence[0]}:
                break
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        if j == len(lines):
            raise CheckFailed(f"{relative}:{i + 1}: code fence never closed")
        blocks.append(Block(relative, i + 2, lang, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


# ---------------------------------------------------------------- processes


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


# ---------------------------------------------------------------- the check


@dataclass
class Context:
    target_dir: Path
    work: Path  # scratch space under the target dir, emptied per run
    python: Path
    env: dict[str, str]
    servers: list[Server] = field(default_factory=list)
    edge: str = ""
    data_dir: Path = Path()
    sandbox_gateway: str = ""
    sandbox_data: Path = Path()
    host_gateway: str = ""
    host_data: Path = Path()
    results: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def bin_dir(self) -> Path:
        return self.target_dir / "debug"

    def report(self, block: Block | str, outcome: str, detail: str = "") -> None:
        where = block.where if isinstance(block, Block) else block
        self.results.append((where, outcome, detail))
        print(f"check-docs: {outcome:<9} {where} {detail}".rstrip(), flush=True)


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


def run_logged(argv: list[str], ctx: Context, log: Path, timeout: float, **kw: object) -> int:
    """Runs argv, output into log; prints the output when it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = kw.pop("env", ctx.env)
    with open(log, "wb") as out:
        try:
            rc = subprocess.run(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                env=env,
                **kw,  # type: ignore[arg-type]
            ).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    if rc != 0:
        sys.stdout.write(log.read_text(errors="replace")[-6000:])
    return rc


# ---------------------------------------------------------------- rust


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


def write_if_changed(path: Path, text: str) -> None:
    # Unchanged files keep their mtime, so a warm check compiles nothing.
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


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


# ---------------------------------------------------------------- python


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


# ---------------------------------------------------------------- typescript

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


# ---------------------------------------------------------------- go

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


# ---------------------------------------------------------------- sh


def make_closure(target: str) -> set[str]:
    """The targets `make <target>` runs, from the Makefile's rules."""
    rules: dict[str, list[str]] = {}
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        rule = re.match(r"^([A-Za-z0-9_.-]+)\s*:(?!=)\s*([^=#]*)$", line)
        if rule and not line.startswith((".", "\t")):
            rules.setdefault(rule[1], []).extend(rule[2].split())
    seen: set[str] = set()
    pending = [target]
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending.extend(rules.get(name, []))
    return seen


def logical_lines(text: str) -> list[str]:
    """Commands of a block: backslash continuations joined, blank lines dropped."""
    commands: list[str] = []
    current = ""
    for raw in text.splitlines():
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        current += raw
        if current.strip():
            commands.append(current.strip())
        current = ""
    if current.strip():
        commands.append(current.strip())
    return commands


def words(command: str) -> list[str]:
    """The argv of a command (comments and leading VAR=value dropped)."""
    argv = shlex.split(command, comments=True)
    while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
        argv.pop(0)
    return argv


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, word in enumerate(argv[:-1]):
        if word == flag:
            return argv[i + 1]
    return None


class ShellRunner:
    """The sh blocks of one README, in order, from the repository root.

    - `.run` (also as `$PWD/.run`) becomes `.run/docs-check`, still relative
      where the README's path is: a block never touches what `make up` keeps
      in `.run`, and `.run/data` is the data directory of the check's
      cluster, as it is `make up`'s.
    - 127.0.0.1:17670 names the check's cluster.
    - A command that serves in the foreground (`openshell-gateway serve`,
      `edge` or `up`; `nginx` with `daemon off`) starts in the background on
      a free loopback port (its `--listen`, and for nginx the `--listen`
      given to `render.py`; `serve` also gets a free `--metrics-listen`),
      must accept connections, must still run after the README's last block
      and log no nginx `[alert]`/`[emerg]`; then it is stopped by its PID.
    - `make <target>` is exercised when `make test` runs that target; only
      `make up` and `make test` may be marked `[not run]`.
    """

    def __init__(self, ctx: Context, relative: str) -> None:
        self.ctx = ctx
        self.relative = relative
        self.listen: dict[str, str] = {}  # documented listen address -> the check's
        self.servers: list[tuple[Server, Path | None]] = []
        self.test_targets = make_closure("test")
        self.env = dict(ctx.env)
        self.env["PATH"] = f"{ctx.bin_dir}:/usr/sbin:/sbin:{ctx.env.get('PATH', '')}"

    def substitute(self, command: str, serving: bool) -> str:
        command = re.sub(
            r"(\$\{?PWD\}?/|(?<![\w/.$]))\.run(?=[/\s\"';)]|$)", rf"\1{RUN_DIR}", command
        )
        if serving:
            # Every --listen of a serving command gets a free port, the same
            # one each time the README names that address.
            def listen(match: re.Match[str]) -> str:
                documented = match[2]
                if documented not in self.listen:
                    self.listen[documented] = f"127.0.0.1:{free_port()}"
                return f"{match[1]}{self.listen[documented]}"

            return re.sub(r"(--listen[ =])(\S+)", listen, command)
        return command.replace(DOCUMENTED_ADDRESS, self.ctx.edge.removeprefix("http://"))

    def run_block(self, block: Block) -> None:
        for command in logical_lines(block.text):
            self.run_command(block, command)

    def run_command(self, block: Block, command: str) -> None:
        argv = words(command)
        if not argv:
            return
        label = f"{block.where} `{' '.join(argv)[:70]}`"
        marked = NOT_RUN_MARK in command.partition("#")[2]
        program = os.path.basename(argv[0])
        if program == "make":
            targets = [w for w in argv[1:] if not w.startswith("-") and "=" not in w] or ["all"]
            if marked:
                if set(targets) <= NOT_RUN_ALLOWED:
                    self.ctx.report(label, "not run", "(marked [not run])")
                    return
                raise CheckFailed(f"{label}: only `make up` and `make test` may be [not run]")
            if set(targets) <= NOT_RUN_ALLOWED:
                raise CheckFailed(f"{label}: mark it `# {NOT_RUN_MARK}` (the check cannot run it)")
            missing = [t for t in targets if t not in self.test_targets]
            if missing:
                raise CheckFailed(f"{label}: `make test` never runs {missing}")
            self.ctx.report(label, "covered", "(make test runs it)")
            return
        if marked:
            raise CheckFailed(f"{label}: only `make up` and `make test` may be [not run]")
        workspace = WORKSPACE_TARGETS.get(tuple(argv[:2]))
        if workspace and "-p" in argv:
            # `cargo test -p X` / `cargo clippy -p X`: the workspace-wide run
            # of the same command in `make test` covers every crate.
            target, recipe = workspace
            makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
            if target not in self.test_targets or recipe not in makefile:
                raise CheckFailed(f"{label}: `make {target}` no longer runs `{recipe}`")
            self.ctx.report(label, "covered", f"(make {target} runs it for the workspace)")
            return
        covered = COVERED_ELSEWHERE.get(tuple(argv))
        if covered:
            target, script = covered
            if target not in self.test_targets:
                raise CheckFailed(f"{label}: `make {target}` is not part of `make test`")
            # The same words in a command of the script (options between them allowed).
            pattern = r"\s+(-\S+\s+)*".join(re.escape(w) for w in argv[1:])
            lines = (ROOT / script).read_text(encoding="utf-8").splitlines()
            commands = [x for x in lines if not x.lstrip().startswith(("#", "echo"))]
            if not any(re.search(pattern, x) for x in commands):
                raise CheckFailed(f"{label}: {script} (`make {target}`) no longer runs it")
            self.ctx.report(label, "covered", f"(make {target} runs it)")
            return
        serving = program == "openshell-gateway" and argv[1:2] in (["serve"], ["edge"], ["up"])
        nginx = program == "nginx" and "daemon off" in (flag_value(argv, "-g") or "")
        renders = any(w.endswith("render.py") for w in argv)
        text = self.substitute(command, serving or renders)
        if serving or nginx:
            self.start(block, label, text, nginx)
            return
        started = time.monotonic()
        log = self.ctx.work / "logs" / f"{block.name}-{len(self.ctx.results)}.log"
        rc = run_logged(
            ["bash", "-euo", "pipefail", "-c", text],
            self.ctx,
            log,
            COMMAND_TIMEOUT,
            env=self.env,
            cwd=ROOT,
        )
        took = f"({time.monotonic() - started:.1f} s)"
        self.ctx.report(label, "ok" if rc == 0 else "FAIL", took if rc == 0 else f"exit {rc}")

    def start(self, block: Block, label: str, text: str, nginx: bool) -> None:
        argv = shlex.split(text, comments=True)
        assignments = {}
        while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
            key, _, value = argv.pop(0).partition("=")
            assignments[key] = value
        # `$PWD` inside a quoted word is the shell's to expand: do it here.
        argv = [w.replace("${PWD}", str(ROOT)).replace("$PWD", str(ROOT)) for w in argv]
        if nginx:
            if not self.listen:
                raise CheckFailed(f"{label}: no `render.py --listen` before it")
            address = list(self.listen.values())[-1]
            error_log = ROOT / (flag_value(argv, "-e") or "/nonexistent")
        else:
            address = flag_value(argv, "--listen") or ""
            error_log = None
            if argv[1] == "serve" and "--metrics-listen" not in argv:
                # The default 9090 may be taken by another program.
                argv += ["--metrics-listen", f"127.0.0.1:{free_port()}"]
        env = dict(self.env, **assignments)
        server = start_server(
            label, argv, self.ctx.work / "logs" / f"{block.name}-server.log", env, cwd=ROOT
        )
        if error_log is not None:
            server.extra_logs.append(error_log)
        self.servers.append((server, error_log))
        self.ctx.servers.append(server)
        server.wait_listening(address)
        self.ctx.report(label, "ok", f"(serving on {address})")

    def finish(self) -> None:
        """The servers this README started still run; then they stop."""
        problems = []
        for server, _ in self.servers:
            if not server.alive():
                problems.append(f"{server.name} exited:\n{server.tail()}")
            server.stop()
            self.ctx.servers.remove(server)
            logged = server.tail(100_000)
            alerts = [line for line in logged.splitlines() if re.search(r"\[(alert|emerg)\]", line)]
            if alerts:
                problems.append(f"{server.name} logged:\n" + "\n".join(alerts))
        if problems:
            raise CheckFailed("\n".join(problems))


# ---------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", default=DEFAULT_FILES, help="Markdown files")
    parser.add_argument("--list", action="store_true", help="list the blocks and exit")
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    args = parser.parse_args()

    blocks: list[Block] = []
    for relative in args.files:
        blocks.extend(extract_blocks(relative))
    known = {"rust", "python", "go", *TS_LANGS, *SH_LANGS, *IGNORED_LANGS}
    unknown = [b for b in blocks if b.lang not in known]
    for block in unknown:
        print(
            f"check-docs: {block.where}: language {block.lang!r} is not checked "
            f"(use rust, python, typescript, go, sh, or text for output)"
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
        for relative in args.files:
            sh = [b for b in blocks if b.file == relative and b.lang in SH_LANGS]
            if not sh:
                continue
            runner = ShellRunner(ctx, relative)
            try:
                for block in sh:
                    runner.run_block(block)
            except CheckFailed as err:
                failures.append(str(err))
                ctx.report(relative, "FAIL", "(see below)")
            finally:
                try:
                    runner.finish()
                except CheckFailed as err:
                    failures.append(str(err))
                    ctx.report(relative, "FAIL", "(a server it started)")
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
