"""The step vocabulary of ``scenarios.json`` and its validation.

``OPS`` names every op, the inputs a step of it may carry and the
expectations the harness checks for it (each with its type and its check).
``validate`` refuses a scenarios file that strays from it: an unknown op,
input or expectation, a value of the wrong type, ``message_excludes`` without
``error``. The harness runs it before it starts a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import checks
from .checks import StepContext

CAPABILITIES = {"routing_stats", "push_config", "replica_control"}
ALIAS = re.compile(r"^[a-z][a-z0-9]{0,15}$")


@dataclass(frozen=True)
class Kind:
    """A JSON type, described for error messages."""

    label: str
    test: Callable[[Any], bool]

    def accepts(self, value: Any) -> bool:
        return bool(self.test(value))


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _strs(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _str_map(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


STR = Kind("a string", lambda v: isinstance(v, str))
ALIAS_KIND = Kind(
    "a sandbox alias ([a-z][a-z0-9]*)", lambda v: isinstance(v, str) and ALIAS.match(v) is not None
)
COUNT = Kind("an integer >= 0", lambda v: _int(v) and v >= 0)
INT = Kind("an integer", _int)
NUMBER = Kind("a number >= 0", lambda v: (_int(v) or isinstance(v, float)) and v >= 0)
BOOL = Kind("true or false", lambda v: isinstance(v, bool))
STRS = Kind("a list of strings", _strs)
PAIR = Kind("a [string, string] pair", lambda v: _strs(v) and len(v) == 2)
PAIRS = Kind(
    "a list of [string, string] pairs",
    lambda v: isinstance(v, list) and all(PAIR.test(p) for p in v),
)
STR_MAP = Kind("an object of strings", _str_map)
OBJECT = Kind("an object", lambda v: isinstance(v, dict))
OBJECTS = Kind(
    "a list of objects", lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v)
)
CODES = Kind(
    "an error code or a non-empty list of them",
    lambda v: isinstance(v, str) or (_strs(v) and v != []),
)
MODE = Kind('"push" or "poll"', lambda v: v in ("push", "poll"))
PHASE = Kind("a phase name", lambda v: isinstance(v, str) and v.isupper())
SIZE = Kind(
    "[cols, rows]", lambda v: isinstance(v, list) and len(v) == 2 and all(_int(x) for x in v)
)

ACTIONS = {"wait_output": STR, "resize": SIZE, "write": STR, "close_stdin": BOOL}
WRITE = {"setting": STR, "value": STR, "global": BOOL}
REJECT = {"setting": STR, "value": STR}

Performed = Callable[[dict[str, Any], StepContext], "str | None"]


@dataclass(frozen=True)
class Op:
    inputs: dict[str, Kind]
    expects: dict[str, tuple[Kind, checks.Check]] = field(default_factory=dict)
    # Checked whatever the step expects: the op was carried out in full.
    performed: Performed | None = None
    # An expectation that applies to every element of result[each].
    each: str | None = None


TARGET = {"sandbox": ALIAS_KIND, "name": STR}
EXEC_OUT = {
    "stdout": (STR, checks.text_equals("stdout")),
    "stderr": (STR, checks.text_equals("stderr")),
    "exit_code": (INT, checks.equals("exit_code", "exit code")),
}

OPS: dict[str, Op] = {
    "create_sandbox": Op(
        {**TARGET, "env": STR_MAP, "labels": STR_MAP},
        {"phase_in": (STRS, checks.phase_in), "label": (PAIR, checks.label)},
    ),
    "wait_ready": Op(
        {**TARGET, "timeout": NUMBER}, {"phase": (PHASE, checks.equals("phase", "phase"))}
    ),
    "get_sandbox": Op(TARGET, {"phase": (PHASE, checks.equals("phase", "phase"))}),
    "list_sandboxes": Op({"label_selector": STR}, {"contains": (ALIAS_KIND, checks.contains)}),
    "delete_sandbox": Op(TARGET),
    "wait_deleted": Op({**TARGET, "timeout": NUMBER}),
    "exec": Op(
        {
            **TARGET,
            "command": STRS,
            "stdin": STR,
            "stdin_size": COUNT,
            "env": STR_MAP,
            "exec_timeout": NUMBER,
        },
        EXEC_OUT,
    ),
    "exec_stream": Op(
        {**TARGET, "command": STRS},
        {
            **EXEC_OUT,
            "exit_last": (BOOL, checks.exit_last),
            "min_events": (COUNT, checks.at_least("events", "events")),
            "stdout_len": (COUNT, checks.stdout_len),
        },
    ),
    "interactive": Op(
        {**TARGET, "command": STRS, "tty": BOOL, "cols": COUNT, "rows": COUNT, "actions": OBJECTS},
        {
            "exit_code": EXEC_OUT["exit_code"],
            "stdout": EXEC_OUT["stdout"],
            "output_contains": (STRS, checks.output_contains),
        },
    ),
    "forward": Op(
        {
            **TARGET,
            "target": Kind('"echo_server"', lambda v: v == "echo_server"),
            "connections": COUNT,
            "bytes_per_connection": COUNT,
            "remote_port": COUNT,
        },
        {
            "echoed": (BOOL, checks.echoed),
            "min_accepted": (COUNT, checks.at_least("accepted", "connections accepted")),
            "closed_refuses": (BOOL, checks.equals("closed_refuses", "closed listener refuses:")),
        },
    ),
    "exec_repeat": Op(
        {**TARGET, "command": STRS, "count": COUNT},
        {"stdout": EXEC_OUT["stdout"], "exit_code": EXEC_OUT["exit_code"]},
        performed=checks.exec_repeat_performed,
        each="runs",
    ),
    "raw_unary": Op(
        {"method": STR, "request": OBJECT, "metadata": PAIRS},
        {
            "metadata_prefix": (PAIR, checks.metadata_prefix),
            "response_field": (PAIR, checks.response_field),
        },
    ),
    "raw_stream": Op({"method": STR, "messages": OBJECTS}),
    "routing_stats_delta": Op(
        {**TARGET, "command": STRS, "count": COUNT},
        {
            "hinted_min": (COUNT, checks.delta_at_least("hinted", "hinted attempts")),
            "unrouted_retry": (COUNT, checks.delta_equals("unrouted_retry", "unrouted retries")),
        },
    ),
    "unroute_owner_then_exec": Op(
        {**TARGET, "command": STRS},
        {
            "stdout": EXEC_OUT["stdout"],
            "unrouted_retry_delta": (
                COUNT,
                checks.delta_equals("unrouted_retry", "unrouted retries"),
            ),
        },
    ),
    "client_health": Op({"endpoint": STR}),
    "write_file": Op({**TARGET, "path": STR, "content": STR}),
    "read_file": Op({**TARGET, "path": STR}, {"content": (STR, checks.text_equals("content"))}),
    "file_round_trip": Op(
        {**TARGET, "remote": STR, "size": COUNT},
        {
            "same": (BOOL, checks.equals("same", "downloaded bytes equal the uploaded ones:")),
            "bytes": (COUNT, checks.equals("bytes", "bytes uploaded")),
        },
    ),
    "logs": Op(
        {**TARGET, "source": STR, "min_level": STR, "tail": COUNT, "wait_for": STR},
        {
            "contains_message": (STR, checks.logs_contain),
            "sources": (STRS, checks.logs_sources),
        },
    ),
    "watch_logs": Op(
        {**TARGET, "command": STRS},
        {
            "finished_exit_code": (
                INT,
                checks.equals("finished_exit_code", "exit code of the followed exec line"),
            ),
            "cursors_ordered": (BOOL, checks.equals("cursors_ordered", "cursors in order:")),
        },
    ),
    "watch_events": Op({**TARGET, "resume_after": STR}),
    "config_session": Op(
        {
            "sandbox": ALIAS_KIND,
            "announce_push": BOOL,
            "poll_interval": NUMBER,
            "writes": OBJECTS,
            "reject": OBJECT,
        },
        {
            "mode": (MODE, checks.config_stat("mode", "delivery mode")),
            "bootstrap": (BOOL, checks.config_bootstrap),
            "updates_acknowledged": (BOOL, checks.config_acknowledged),
            "rejected": (COUNT, checks.config_stat("rejected", "updates rejected:")),
            "updates_received": (COUNT, checks.config_stat("updates_received", "pushed updates:")),
            "min_polls": (COUNT, checks.min_polls),
            "applied_settings": (STR_MAP, checks.applied_settings),
            "max_latency": (NUMBER, checks.max_latency),
        },
        performed=checks.config_session_performed,
    ),
}

# Expectations of a failed call, valid on every op.
ERROR_EXPECTS: dict[str, Kind] = {"error": CODES, "message_excludes": STR, "retryable": BOOL}
SCENARIO_KEYS: dict[str, Kind] = {
    "id": STR,
    "group": STR,
    "description": STR,
    "uses": Kind(
        "a list of sandbox aliases",
        lambda v: isinstance(v, list) and all(ALIAS_KIND.test(a) for a in v),
    ),
    "requires": STRS,
    "steps": Kind("a non-empty list of steps", lambda v: OBJECTS.test(v) and v != []),
}


class InvalidScenarios(Exception):
    """The scenarios file strays from the vocabulary; the message lists every problem."""


def _objects(step: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = step.get(key, [])
    return value if OBJECTS.accepts(value) else []


def _fields(
    where: str,
    value: dict[str, Any],
    kinds: dict[str, Kind],
    problems: list[str],
    required: tuple[str, ...] = (),
) -> None:
    for key in required:
        if key not in value:
            problems.append(f"{where}: {key} is missing")
    for key, item in value.items():
        kind = kinds.get(key)
        if kind is None:
            problems.append(f"{where}: unknown key {key!r} (known: {', '.join(sorted(kinds))})")
        elif not kind.accepts(item):
            problems.append(f"{where}: {key} must be {kind.label}, not {item!r}"[:300])


def _step(where: str, step: dict[str, Any], problems: list[str]) -> None:
    op_name = step.get("op")
    op = OPS.get(op_name) if isinstance(op_name, str) else None
    if op is None:
        problems.append(f"{where}: unknown op {op_name!r} (known: {', '.join(sorted(OPS))})")
        return
    where = f"{where} ({op_name})"
    inputs = {k: v for k, v in step.items() if k not in ("op", "expect")}
    _fields(where, inputs, op.inputs, problems)
    for index, action in enumerate(_objects(step, "actions")):
        _fields(f"{where} action {index}", action, ACTIONS, problems)
        if len(action) != 1:
            problems.append(f"{where} action {index}: one action per object, not {action}")
    for index, write in enumerate(_objects(step, "writes")):
        _fields(f"{where} write {index}", write, WRITE, problems, required=("setting", "value"))
    if isinstance(step.get("reject"), dict):
        _fields(f"{where} reject", step["reject"], REJECT, problems, required=("setting", "value"))
    expect = step.get("expect", {})
    if not isinstance(expect, dict):
        problems.append(f"{where}: expect must be an object, not {expect!r}")
        return
    kinds = {**ERROR_EXPECTS, **{k: kind for k, (kind, _) in op.expects.items()}}
    _fields(f"{where} expect", expect, kinds, problems)
    outcome_keys = sorted(k for k in expect if k not in ERROR_EXPECTS)
    if "error" in expect and outcome_keys:
        problems.append(f"{where} expect: error with outcome keys {outcome_keys}")
    for key in ("message_excludes", "retryable"):
        if key in expect and "error" not in expect:
            problems.append(f"{where} expect: {key} needs error")


def validate(document: Any) -> list[dict[str, Any]]:
    """The scenarios of a parsed scenarios file; InvalidScenarios if any stray."""
    problems: list[str] = []
    if not isinstance(document, dict) or not OBJECTS.accepts(document.get("scenarios")):
        raise InvalidScenarios('the file must be an object with a "scenarios" list of objects')
    _fields("file", document, {"version": INT, "about": STR, "scenarios": OBJECTS}, problems)
    seen: set[str] = set()
    for index, scenario in enumerate(document["scenarios"]):
        where = f"scenario {scenario.get('id', index)!r}"
        _fields(where, scenario, SCENARIO_KEYS, problems)
        for key in ("id", "steps"):
            if key not in scenario:
                problems.append(f"{where}: {key} is missing")
        if scenario.get("id") in seen:
            problems.append(f"{where}: the id is not unique")
        seen.add(str(scenario.get("id")))
        for cap in scenario.get("requires", []) if STRS.accepts(scenario.get("requires")) else []:
            if cap not in CAPABILITIES:
                problems.append(f"{where}: unknown capability {cap!r}")
        if SCENARIO_KEYS["steps"].accepts(scenario.get("steps")):
            for i, step in enumerate(scenario["steps"]):
                _step(f"{where} step {i}", step, problems)
    if problems:
        raise InvalidScenarios("\n".join(problems))
    return list(document["scenarios"])
