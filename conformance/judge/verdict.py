"""A scenario's outcome for one runner: its expectations against the records.

Skips are honest only: a runner may skip a scenario exactly when its hello
line lacks a capability the scenario requires, and must then skip it. Every
step must be reported, in the scenario's order of ops; the first step whose
observation misses its expectation fails the scenario.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .checks import RunContext, StepContext
from .observations import RunnerReport, ScenarioRecords
from .vocabulary import ERROR_EXPECTS, OPS

DETAIL_LIMIT = 400


@dataclass(frozen=True)
class Verdict:
    status: str  # "pass", "fail" or "skip"
    detail: str = ""


def _fail(detail: str) -> Verdict:
    return Verdict("fail", detail[:DETAIL_LIMIT])


def judge(scenario: dict[str, Any], report: RunnerReport, ended: str = "") -> Verdict:
    """``ended`` says how the runner ended, for steps it never reported."""
    hello = report.hello
    if hello is None:
        return _fail("the runner reported no hello line" + (f" ({ended})" if ended else ""))
    records = report.scenarios.get(scenario["id"], ScenarioRecords())
    if records.problems:
        return _fail("malformed observation: " + records.problems[0])
    missing = [c for c in scenario.get("requires", []) if c not in hello["capabilities"]]
    if missing or records.skipped is not None:
        return _skip(missing, records)
    if records.setup_failure is not None:
        return _fail(records.setup_failure)
    run = RunContext(hello["sandbox_prefix"], hello["run"])
    steps = scenario["steps"]
    extra = sorted(i for i in records.steps if not 0 <= i < len(steps))
    if extra:
        return _fail(f"reported step {extra[0]}, which the scenario does not have")
    for index, step in enumerate(steps):
        where = f"step {index} ({step['op']})"
        observed = records.steps.get(index)
        if observed is None:
            return _fail(f"{where}: not reported" + (f" ({ended})" if ended else ""))
        if observed["op"] != step["op"]:
            return _fail(f"{where}: reported as op {observed['op']!r}")
        failure = judge_step(step, observed, run)
        if failure is not None:
            return _fail(f"{where}: {failure}")
    return Verdict("pass")


def _skip(missing: list[str], records: ScenarioRecords) -> Verdict:
    if records.skipped is None:
        return _fail(f"the runner lacks {', '.join(missing)} but did not skip the scenario")
    if not missing:
        return _fail(f"skipped for lack of {records.skipped}, but the runner has every capability")
    if sorted(records.skipped) != sorted(missing):
        return _fail(f"skipped for lack of {records.skipped}, but it lacks {missing}")
    return Verdict("skip", "runner lacks capability: " + ", ".join(missing))


def judge_step(step: dict[str, Any], observed: dict[str, Any], run: RunContext) -> str | None:
    """None when the observation meets every expectation of the step."""
    if "failure" in observed:
        return str(observed["failure"])
    expect: dict[str, Any] = step.get("expect", {})
    if "error" in observed:
        return _judge_error(expect, observed["error"])
    if "error" in expect:
        return f"expected error {expect['error']}, got success: {observed['result']}"
    op = OPS[step["op"]]
    ctx = StepContext(step, run)
    result = observed["result"]
    try:
        if op.performed is not None and (failure := op.performed(result, ctx)):
            return failure
        for key, want in expect.items():
            if key in ERROR_EXPECTS:
                continue
            check = op.expects[key][1]
            if op.each is None:
                failure = check(result, want, ctx)
            else:
                failure = next(
                    (
                        f"run {i}: {f}"
                        for i, item in enumerate(result[op.each])
                        if (f := check(item, want, ctx))
                    ),
                    None,
                )
            if failure is not None:
                return failure
    except KeyError as err:
        return f"the observation has no field {err}"
    except (TypeError, ValueError, AttributeError, IndexError) as err:
        return f"malformed observation ({type(err).__name__}: {err})"
    return None


def _judge_error(expect: dict[str, Any], error: dict[str, Any]) -> str | None:
    code, message = error["code"], error["message"]
    want = expect.get("error")
    if want is None:
        return f"unexpected error {code}: {message}"
    codes = [want] if isinstance(want, str) else list(want)
    if code not in codes:
        return f"error code {code!r}, expected {codes}: {message}"
    # Languages with a class per code report both; they must agree.
    if "class" in error and error["class"] != error.get("class_for_code"):
        return f"{code} raised as {error['class']}, not {error.get('class_for_code')}"
    excluded = expect.get("message_excludes")
    if excluded and excluded in message:
        return "the error message echoes a secret value"
    if "retryable" in expect and error["retryable"] != expect["retryable"]:
        return f"retryable is {error['retryable']}"
    return None
