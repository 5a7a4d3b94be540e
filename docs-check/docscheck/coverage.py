"""sh commands the check does not run itself: `make <target>` is exercised
when `make test` runs that target (only `make up` and `make test` may be
marked `[not run]`), and a few documented commands are covered by the
target of `make test` that runs them (or their workspace-wide form)."""

from __future__ import annotations

import os
import re

from .common import ROOT, CheckFailed

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


def not_run_outcome(
    label: str, argv: list[str], command: str, test_targets: set[str]
) -> tuple[str, str] | None:
    """The outcome and detail to report for a command the check does not run
    (marked `[not run]`, or covered by `make test`), None for one it runs.
    Raises CheckFailed when the README's claim does not hold."""
    marked = NOT_RUN_MARK in command.partition("#")[2]
    program = os.path.basename(argv[0])
    if program == "make":
        targets = [w for w in argv[1:] if not w.startswith("-") and "=" not in w] or ["all"]
        if marked:
            if set(targets) <= NOT_RUN_ALLOWED:
                return "not run", "(marked [not run])"
            raise CheckFailed(f"{label}: only `make up` and `make test` may be [not run]")
        if set(targets) <= NOT_RUN_ALLOWED:
            raise CheckFailed(f"{label}: mark it `# {NOT_RUN_MARK}` (the check cannot run it)")
        missing = [t for t in targets if t not in test_targets]
        if missing:
            raise CheckFailed(f"{label}: `make test` never runs {missing}")
        return "covered", "(make test runs it)"
    if marked:
        raise CheckFailed(f"{label}: only `make up` and `make test` may be [not run]")
    workspace = WORKSPACE_TARGETS.get(tuple(argv[:2]))
    if workspace and "-p" in argv:
        # `cargo test -p X` / `cargo clippy -p X`: the workspace-wide run
        # of the same command in `make test` covers every crate.
        target, recipe = workspace
        makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
        if target not in test_targets or recipe not in makefile:
            raise CheckFailed(f"{label}: `make {target}` no longer runs `{recipe}`")
        return "covered", f"(make {target} runs it for the workspace)"
    covered = COVERED_ELSEWHERE.get(tuple(argv))
    if covered:
        target, script = covered
        if target not in test_targets:
            raise CheckFailed(f"{label}: `make {target}` is not part of `make test`")
        # The same words in a command of the script (options between them allowed).
        pattern = r"\s+(-\S+\s+)*".join(re.escape(w) for w in argv[1:])
        lines = (ROOT / script).read_text(encoding="utf-8").splitlines()
        commands = [x for x in lines if not x.lstrip().startswith(("#", "echo"))]
        if not any(re.search(pattern, x) for x in commands):
            raise CheckFailed(f"{label}: {script} (`make {target}`) no longer runs it")
        return "covered", f"(make {target} runs it)"
    return None
