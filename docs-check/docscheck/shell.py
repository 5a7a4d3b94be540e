"""sh blocks: the blocks of one README run in order, command by command,
from the repository root (see ``ShellRunner``)."""

from __future__ import annotations

import os
import re
import shlex
import time
from pathlib import Path

from .blocks import Block
from .common import DOCUMENTED_ADDRESS, ROOT, RUN_DIR, CheckFailed
from .context import Context, run_logged
from .coverage import make_closure, not_run_outcome
from .processes import Server, free_port, start_server

SH_LANGS = {"sh", "bash", "shell"}
COMMAND_TIMEOUT = 900.0


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
      `make up` and `make test` may be marked `[not run]` (see ``coverage``).
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
        outcome = not_run_outcome(label, argv, command, self.test_targets)
        if outcome:
            self.ctx.report(label, *outcome)
            return
        program = os.path.basename(argv[0])
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


def check_shell(ctx: Context, relative: str, blocks: list[Block]) -> list[str]:
    """Runs the sh blocks of one README; the failures, to print at the end."""
    failures: list[str] = []
    runner = ShellRunner(ctx, relative)
    try:
        for block in blocks:
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
    return failures
