"""The state of one run of the check (``Context``: scratch space, the
environment, the servers it started, the results it reported), and what the
checks of every language do with it: write scratch files, run logged."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .blocks import Block
from .processes import Server


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


def write_if_changed(path: Path, text: str) -> None:
    # Unchanged files keep their mtime, so a warm check compiles nothing.
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
