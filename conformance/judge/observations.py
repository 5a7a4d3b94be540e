"""Parses a runner's stdout (README: "Observations") into per-scenario records.

Every non-empty line must be one JSON object of a known type. A line that is
not (bad JSON, a missing field, a step reported twice) is a problem of the
scenario it belongs to: the one it names, else the scenario of the last good
line. Problems before any scenario line are the runner's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ScenarioRecords:
    """What a runner reported for one scenario."""

    skipped: list[str] | None = None  # capabilities the runner says it lacks
    setup_failure: str | None = None
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


@dataclass
class RunnerReport:
    hello: dict[str, Any] | None = None
    scenarios: dict[str, ScenarioRecords] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def records(self, scenario_id: str) -> ScenarioRecords:
        return self.scenarios.setdefault(scenario_id, ScenarioRecords())


def _is_strs(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _hello_problem(line: dict[str, Any]) -> str | None:
    for key in ("runner", "sandbox_prefix", "run"):
        if not isinstance(line.get(key), str):
            return f"hello: {key} must be a string"
    if not _is_strs(line.get("capabilities")):
        return "hello: capabilities must be a list of strings"
    return None


def _step_problem(line: dict[str, Any]) -> str | None:
    if not _int(line.get("step")) or not isinstance(line.get("op"), str):
        return "a step line needs an integer step and a string op"
    outcomes = [k for k in ("result", "error", "failure") if k in line]
    if len(outcomes) != 1:
        return f"a step line needs exactly one of result, error, failure (has {outcomes})"
    if "result" in line and not isinstance(line["result"], dict):
        return "result must be an object"
    if "failure" in line and not isinstance(line["failure"], str):
        return "failure must be a string"
    if "error" in line:
        error = line["error"]
        if not isinstance(error, dict):
            return "error must be an object"
        for key, kind in (("code", str), ("message", str), ("retryable", bool)):
            if not isinstance(error.get(key), kind):
                return f"error.{key} must be a {kind.__name__}"
    return None


def parse(stdout: str, scenario_ids: list[str]) -> RunnerReport:
    report = RunnerReport()
    known = set(scenario_ids)
    current: str | None = None

    def problem(scenario: str | None, text: str) -> None:
        if scenario is None:
            report.problems.append(text)
        else:
            report.records(scenario).problems.append(text)

    for number, raw in enumerate(stdout.splitlines(), 1):
        text = raw.strip()
        if not text:
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError as err:
            problem(current, f"line {number} is not JSON ({err.msg}): {text[:120]!r}")
            continue
        if not isinstance(line, dict):
            problem(current, f"line {number} is not a JSON object: {text[:120]!r}")
            continue
        kind = line.get("type")
        if kind == "hello":
            issue = _hello_problem(line)
            if issue or report.hello is not None:
                report.problems.append(f"line {number}: {issue or 'a second hello line'}")
            else:
                report.hello = line
            continue
        scenario = line.get("scenario")
        if not isinstance(scenario, str) or scenario not in known:
            report.problems.append(f"line {number}: unknown scenario {scenario!r}")
            continue
        current = scenario
        records = report.records(scenario)
        if kind == "skip":
            if not _is_strs(line.get("missing")) or not line["missing"]:
                records.problems.append(f"line {number}: skip needs a non-empty missing list")
            else:
                records.skipped = line["missing"]
        elif kind == "setup":
            if not isinstance(line.get("alias"), str) or not isinstance(line.get("failure"), str):
                records.problems.append(f"line {number}: setup needs an alias and a failure")
            else:
                records.setup_failure = f"setting up sandbox {line['alias']}: {line['failure']}"
        elif kind == "step":
            issue = _step_problem(line)
            if issue:
                records.problems.append(f"line {number}: {issue}")
            elif line["step"] in records.steps:
                records.problems.append(f"line {number}: step {line['step']} reported twice")
            else:
                records.steps[line["step"]] = line
        else:
            records.problems.append(f"line {number}: unknown line type {kind!r}")
    return report
