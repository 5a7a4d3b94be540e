"""One check per expectation key, over the ``result`` a runner observed for one step.

A check returns None when the observation meets the expectation and a short
failure message otherwise. A field the runner did not report raises
``KeyError``; the verdict turns that into a failure naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PLACEHOLDER = re.compile(r"\$\{([a-z][a-z0-9]*)\}")


@dataclass(frozen=True)
class RunContext:
    """What the harness knows of one runner's run, from its hello line."""

    sandbox_prefix: str
    run: str

    def name(self, alias: str) -> str:
        """The real name of a sandbox alias (README: "Naming")."""
        return self.sandbox_prefix + alias

    def subst(self, value: Any) -> Any:
        """``${run}`` is the run id, ``${alias}`` a sandbox's real name."""
        if isinstance(value, str):
            return PLACEHOLDER.sub(
                lambda m: self.run if m.group(1) == "run" else self.name(m.group(1)), value
            )
        if isinstance(value, list):
            return [self.subst(v) for v in value]
        if isinstance(value, dict):
            return {self.subst(k): self.subst(v) for k, v in value.items()}
        return value


@dataclass(frozen=True)
class StepContext:
    step: dict[str, Any]
    run: RunContext


Check = Callable[[dict[str, Any], Any, StepContext], "str | None"]


def text_equals(field: str) -> Check:
    """``stdout``/``stderr``/``content``: the whole text (``${...}`` substituted);
    ``<field>_bytes`` rules out a cut text."""

    def check(obs: dict[str, Any], want: str, ctx: StepContext) -> str | None:
        want = ctx.run.subst(want)
        got, size = obs[field], obs[f"{field}_bytes"]
        if got != want or size != len(want.encode()):
            return f"{field} {got[:200]!r} ({size} bytes), expected {want!r}"
        return None

    return check


def equals(field: str, what: str) -> Check:
    def check(obs: dict[str, Any], want: Any, ctx: StepContext) -> str | None:
        got = obs[field]
        return None if got == want else f"{what} {got!r}, expected {want!r}"

    return check


def logs_contain(obs: dict[str, Any], want: str, ctx: StepContext) -> str | None:
    """``contains_message``: one of the lines read is exactly ``want``."""
    messages = obs["messages"]
    if want in messages:
        return None
    return f"no line {want!r} among {len(messages)}: {messages[-5:]}"


def logs_sources(obs: dict[str, Any], want: list[str], ctx: StepContext) -> str | None:
    """``sources``: the lines read came from exactly these sources."""
    got = sorted(set(obs["sources"]))
    return None if got == sorted(set(want)) else f"sources {got}, expected {sorted(set(want))}"


def phase_in(obs: dict[str, Any], want: list[str], ctx: StepContext) -> str | None:
    got = obs["phase"]
    return None if got in want else f"phase {got!r}, expected one of {want}"


def label(obs: dict[str, Any], want: list[str], ctx: StepContext) -> str | None:
    labels = obs["labels"]
    return None if labels.get(want[0]) == want[1] else f"labels {labels}"


def contains(obs: dict[str, Any], want: str, ctx: StepContext) -> str | None:
    name = ctx.run.name(want)
    return None if name in obs["names"] else f"{name} not listed"


def at_least(field: str, what: str) -> Check:
    def check(obs: dict[str, Any], want: int, ctx: StepContext) -> str | None:
        got = obs[field]
        return None if got >= want else f"{got} {what}, expected at least {want}"

    return check


def exit_last(obs: dict[str, Any], want: bool, ctx: StepContext) -> str | None:
    single_last = obs["exit_events"] == 1 and obs["last_event"] == "exit"
    if single_last == want:
        return None
    return (
        f"{obs['exit_events']} exit events, the last event is {obs['last_event']!r}"
        f" (expected the exit event {'' if want else 'not '}alone and last)"
    )


def stdout_len(obs: dict[str, Any], want: int, ctx: StepContext) -> str | None:
    got = obs["stdout_bytes"]
    return None if got == want else f"{got} bytes of stdout, expected {want}"


def output_contains(obs: dict[str, Any], want: list[str], ctx: StepContext) -> str | None:
    for text in want:
        if text not in obs["output"]:
            return f"{text!r} not in output {obs['output'][:200]!r}"
    return None


def echoed(obs: dict[str, Any], want: bool, ctx: StepContext) -> str | None:
    results = obs["echoed"]
    every = len(results) == ctx.step["connections"] and all(r is True for r in results)
    if every == want:
        return None
    good = sum(r is True for r in results)
    return f"{good} of {ctx.step['connections']} connections echoed their payload"


def metadata_prefix(obs: dict[str, Any], want: list[str], ctx: StepContext) -> str | None:
    values = [v for k, v in obs["metadata"] if k == want[0]]
    if values and values[0].startswith(want[1]):
        return None
    return f"{want[0]} = {values}, expected a value starting {want[1]!r}"


def response_field(obs: dict[str, Any], want: list[str], ctx: StepContext) -> str | None:
    got: Any = obs["response"]
    for part in want[0].split("."):
        got = got.get(part) if isinstance(got, dict) else None
    expected = ctx.run.subst(want[1])
    return None if got == expected else f"{want[0]} = {got!r}, expected {expected!r}"


def counter_delta(counter: str) -> Callable[[dict[str, Any]], int]:
    def delta(obs: dict[str, Any]) -> int:
        return int(obs["routing_after"][counter]) - int(obs["routing_before"][counter])

    return delta


def delta_at_least(counter: str, what: str) -> Check:
    def check(obs: dict[str, Any], want: int, ctx: StepContext) -> str | None:
        got = counter_delta(counter)(obs)
        return None if got >= want else f"{got} {what}, expected at least {want}"

    return check


def delta_equals(counter: str, what: str) -> Check:
    def check(obs: dict[str, Any], want: int, ctx: StepContext) -> str | None:
        got = counter_delta(counter)(obs)
        return None if got == want else f"{got} {what}, expected {want}"

    return check


# ------------------------------------------------------------ config_session


def bootstrap(obs: dict[str, Any]) -> bool:
    """The session is in push mode and its bootstrap (update id 1) was answered."""
    s = obs["stats"]
    return bool(s["mode"] == "push" and s["updates_received"] >= 1 and s["last_update_id"] >= 1)


def updates_acknowledged(obs: dict[str, Any], writes: int) -> bool:
    """Every pushed update answered, in order, on one session: ids run 1..
    from the bootstrap, and one more update than the writes arrived."""
    s = obs["stats"]
    return bool(
        s["sessions_accepted"] == 1
        and s["updates_received"] > writes
        and s["last_update_id"] == s["updates_received"]
    )


def config_bootstrap(obs: dict[str, Any], want: bool, ctx: StepContext) -> str | None:
    got = bootstrap(obs)
    return None if got == want else f"bootstrap received and answered: {got} ({obs['stats']})"


def config_acknowledged(obs: dict[str, Any], want: bool, ctx: StepContext) -> str | None:
    got = updates_acknowledged(obs, len(ctx.step.get("writes", [])))
    return None if got == want else f"every pushed update answered: {got} ({obs['stats']})"


def config_stat(field: str, what: str) -> Check:
    def check(obs: dict[str, Any], want: Any, ctx: StepContext) -> str | None:
        got = obs["stats"][field]
        return None if got == want else f"{what} {got!r}, expected {want!r}"

    return check


def min_polls(obs: dict[str, Any], want: int, ctx: StepContext) -> str | None:
    got = obs["stats"]["polls"]
    return None if got >= want else f"{got} polls, expected at least {want}"


def max_latency(obs: dict[str, Any], want: float, ctx: StepContext) -> str | None:
    slowest = max((float(w["seconds"]) for w in obs["writes"]), default=0.0)
    return None if slowest <= want else f"a write took {slowest:.2f} s to arrive (limit {want} s)"


def applied_settings(obs: dict[str, Any], want: dict[str, str], ctx: StepContext) -> str | None:
    applied = obs["applied_settings"]
    for key, value in ctx.run.subst(want).items():
        if applied.get(key) != value:
            return f"applied settings {applied}, expected {key}={value}"
    return None


def config_session_performed(obs: dict[str, Any], ctx: StepContext) -> str | None:
    """What a config_session step must show whatever it expects: the bootstrap
    of a push session answered, and every write seen by the session."""
    if obs["bootstrap_answered"] is False:
        return "the bootstrap was never answered"
    writes = ctx.run.subst(ctx.step.get("writes", []))
    seen = obs["writes"]
    for index, write in enumerate(writes):
        if index >= len(seen) or not seen[index]["arrived"]:
            return f"{write['setting']}={write['value']} never reached the session"
    return None


def exec_repeat_performed(obs: dict[str, Any], ctx: StepContext) -> str | None:
    runs, count = len(obs["runs"]), ctx.step["count"]
    return None if runs == count else f"{runs} runs reported, expected {count}"
