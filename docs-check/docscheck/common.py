"""What every part of the check shares: where the repository is, the address
the READMEs document, the run directory sh blocks get, how long a snippet
may run, and the error that fails the check."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
DOCUMENTED_ADDRESS = "127.0.0.1:17670"
# What `.run` (the run directory of `make up`) stands for in sh blocks: a
# directory of its own inside it, so relative paths stay relative.
RUN_DIR = ".run/docs-check"
SNIPPET_TIMEOUT = 180.0


class CheckFailed(Exception):
    pass
