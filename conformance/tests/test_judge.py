"""The judge over recorded observations, and the refusal of malformed scenarios.

``recorded/<runner>.jsonl`` is each runner's stdout from a real passing run
(``conformance/harness --record conformance/tests/recorded``). Every test
here needs no cluster; ``conformance/harness --self-test`` runs them.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any

from judge.observations import parse
from judge.verdict import Verdict, judge
from judge.vocabulary import InvalidScenarios, validate

HERE = Path(__file__).resolve().parent
CONFORMANCE = HERE.parent
RUNNERS = ("rust", "python", "jvm")


def load_scenarios() -> dict[str, Any]:
    return dict(json.loads((CONFORMANCE / "scenarios.json").read_text()))


def recorded(runner: str) -> str:
    return (HERE / "recorded" / f"{runner}.jsonl").read_text()


def verdicts(document: dict[str, Any], stdout: str, ended: str = "") -> dict[str, Verdict]:
    scenarios = validate(document)
    report = parse(stdout, [s["id"] for s in scenarios])
    return {s["id"]: judge(s, report, ended) for s in scenarios}


def step_of(document: dict[str, Any], scenario_id: str, index: int = 0) -> dict[str, Any]:
    scenario = next(s for s in document["scenarios"] if s["id"] == scenario_id)
    return dict(scenario["steps"][index])


class RecordedRuns(unittest.TestCase):
    def test_recorded_runs_pass_as_they_did(self) -> None:
        for runner in RUNNERS:
            with self.subTest(runner=runner):
                got = verdicts(load_scenarios(), recorded(runner))
                failed = {k: v.detail for k, v in got.items() if v.status == "fail"}
                self.assertEqual(failed, {})
                skipped = {k: v.detail for k, v in got.items() if v.status == "skip"}
                self.assertEqual(skipped, {})

    def test_wrong_expectations_fail_every_runner(self) -> None:
        wrong = {
            ("exec.buffered", "stdout"): "in:bye",
            ("exec.exit_codes", "exit_code"): 0,
            ("exec.streaming_large", "stdout_len"): 8388607,
            ("sandbox.create", "phase_in"): ["DELETING"],
            ("forward.concurrent", "min_accepted"): 9,
            ("routing.owner_reported", "metadata_prefix"): ["x-openshell-owner", "nobody-"],
            ("routing.client_counters", "hinted_min"): 50,
            ("routing.unrouted_retry", "unrouted_retry_delta"): 0,
            ("routing.unrouted_retry", "stdout"): "ko\n",
            ("push_config.delivery", "rejected"): 2,
            ("push_config.delivery", "max_latency"): 0.0001,
            ("push_config.no_push_polls", "applied_settings"): {"color": "red"},
            ("errors.get_missing", "error"): "already_exists",
            ("errors.unreachable", "retryable"): False,
            ("errors.create_bad_env_key", "message_excludes"): "invalid",
        }
        for (scenario_id, key), value in wrong.items():
            document = load_scenarios()
            scenario = next(s for s in document["scenarios"] if s["id"] == scenario_id)
            scenario["steps"][0]["expect"][key] = value
            for runner in RUNNERS:
                with self.subTest(scenario=scenario_id, key=key, runner=runner):
                    verdict = verdicts(document, recorded(runner))[scenario_id]
                    self.assertEqual(verdict.status, "fail", verdict)
                    self.assertTrue(verdict.detail.startswith("step 0 ("), verdict.detail)

    def test_an_expected_error_that_did_not_happen_fails(self) -> None:
        document = load_scenarios()
        step_of(document, "exec.buffered")  # the step exists
        scenario = next(s for s in document["scenarios"] if s["id"] == "exec.buffered")
        scenario["steps"][0]["expect"] = {"error": "not_found"}
        for runner in RUNNERS:
            verdict = verdicts(document, recorded(runner))["exec.buffered"]
            self.assertEqual(verdict.status, "fail")
            self.assertIn("expected error not_found, got success", verdict.detail)

    def test_a_crash_fails_the_unreported_scenarios(self) -> None:
        for runner in RUNNERS:
            lines = recorded(runner).splitlines()
            cut = next(i for i, line in enumerate(lines) if '"exec.streaming"' in line)
            got = verdicts(load_scenarios(), "\n".join(lines[:cut]), "the runner exited -9")
            self.assertEqual(got["exec.buffered"].status, "pass")
            self.assertEqual(got["exec.streaming"].status, "fail")
            self.assertIn("not reported (the runner exited -9)", got["exec.streaming"].detail)
            self.assertEqual(got["errors.unreachable"].status, "fail")

    def test_an_omitted_step_fails_its_scenario(self) -> None:
        def omitted(line: str) -> bool:
            record = json.loads(line)
            return bool(record.get("scenario") == "sandbox.wait_ready" and record.get("step") == 1)

        for runner in RUNNERS:
            lines = [line for line in recorded(runner).splitlines() if not omitted(line)]
            verdict = verdicts(load_scenarios(), "\n".join(lines))["sandbox.wait_ready"]
            self.assertEqual(verdict, Verdict("fail", "step 1 (get_sandbox): not reported"))

    def test_malformed_json_fails_the_scenario_it_follows(self) -> None:
        for runner in RUNNERS:
            lines = recorded(runner).splitlines()
            at = next(i for i, line in enumerate(lines) if '"exec.buffered"' in line)
            lines.insert(at + 1, '{"type": "step", "scenario": "exec.buffered", "step": 1')
            got = verdicts(load_scenarios(), "\n".join(lines))
            self.assertEqual(got["exec.buffered"].status, "fail")
            self.assertIn("is not JSON", got["exec.buffered"].detail)
            self.assertEqual(got["exec.streaming"].status, "pass")

    def test_an_observation_without_a_field_fails(self) -> None:
        for runner in RUNNERS:
            lines = []
            for line in recorded(runner).splitlines():
                record = json.loads(line)
                if record.get("scenario") == "exec.buffered":
                    del record["result"]["stderr"]
                lines.append(json.dumps(record))
            verdict = verdicts(load_scenarios(), "\n".join(lines))["exec.buffered"]
            self.assertEqual(
                verdict, Verdict("fail", "step 0 (exec): the observation has no field 'stderr'")
            )


HELLO = {"type": "hello", "runner": "t", "run": "r1", "sandbox_prefix": "cf-t-r1-"}


class Skips(unittest.TestCase):
    def lines(self, capabilities: list[str], *records: dict[str, Any]) -> str:
        hello = {**HELLO, "capabilities": capabilities}
        return "\n".join(json.dumps(r) for r in (hello, *records))

    def test_a_skip_needs_a_missing_capability(self) -> None:
        skip = {"type": "skip", "scenario": "errors.get_missing", "missing": ["routing_stats"]}
        verdict = verdicts(load_scenarios(), self.lines([], skip))["errors.get_missing"]
        self.assertEqual(verdict.status, "fail")

    def test_a_runner_lacking_a_capability_must_skip(self) -> None:
        step = {
            "type": "step",
            "scenario": "routing.client_counters",
            "step": 0,
            "op": "routing_stats_delta",
            "result": {
                "routing_before": {"hinted": 0, "unrouted_retry": 0},
                "routing_after": {"hinted": 5, "unrouted_retry": 0},
            },
        }
        got = verdicts(load_scenarios(), self.lines([], step))["routing.client_counters"]
        self.assertEqual(got.status, "fail")
        self.assertIn("did not skip", got.detail)
        lines = self.lines(["routing_stats"], step)
        got = verdicts(load_scenarios(), lines)["routing.client_counters"]
        self.assertEqual(got, Verdict("pass"))

    def test_an_honest_skip_is_a_skip_never_a_pass(self) -> None:
        skip = {"type": "skip", "scenario": "routing.client_counters", "missing": ["routing_stats"]}
        got = verdicts(load_scenarios(), self.lines([], skip))["routing.client_counters"]
        self.assertEqual(got, Verdict("skip", "runner lacks capability: routing_stats"))

    def test_an_error_raised_as_the_wrong_class_fails(self) -> None:
        error = {
            "code": "not_found",
            "message": "not_found: no sandbox",
            "retryable": False,
            "class": "OpenShellError",
            "class_for_code": "NotFoundError",
        }
        step = {"type": "step", "scenario": "errors.get_missing", "step": 0, "op": "get_sandbox"}
        step["error"] = error
        got = verdicts(load_scenarios(), self.lines([], step))["errors.get_missing"]
        self.assertEqual(got.status, "fail")
        self.assertIn("raised as OpenShellError", got.detail)
        error["class"] = "NotFoundError"
        got = verdicts(load_scenarios(), self.lines([], step))["errors.get_missing"]
        self.assertEqual(got, Verdict("pass"))


class MalformedScenarios(unittest.TestCase):
    def refused(self, mutate: Any) -> str:
        document = copy.deepcopy(load_scenarios())
        mutate(document["scenarios"])
        with self.assertRaises(InvalidScenarios) as caught:
            validate(document)
        return str(caught.exception)

    def test_the_real_file_is_valid(self) -> None:
        self.assertGreater(len(validate(load_scenarios())), 30)

    def test_an_unknown_expectation_is_refused(self) -> None:
        message = self.refused(lambda s: s[3]["steps"][0]["expect"].update(stdot="x"))
        self.assertIn("scenario 'exec.buffered' step 0 (exec) expect: unknown key 'stdot'", message)

    def test_an_expectation_of_the_wrong_type_is_refused(self) -> None:
        message = self.refused(lambda s: s[3]["steps"][0]["expect"].update(exit_code="3"))
        self.assertIn("exit_code must be an integer, not '3'", message)

    def test_an_unknown_op_is_refused(self) -> None:
        message = self.refused(lambda s: s[3]["steps"][0].update(op="exec_twice"))
        self.assertIn("unknown op 'exec_twice'", message)

    def test_an_unknown_input_is_refused(self) -> None:
        message = self.refused(lambda s: s[3]["steps"][0].update(stdinn="x"))
        self.assertIn("unknown key 'stdinn'", message)

    def test_error_details_without_an_error_are_refused(self) -> None:
        message = self.refused(lambda s: s[3]["steps"][0]["expect"].update(retryable=True))
        self.assertIn("retryable needs error", message)

    def test_an_expectation_of_another_op_is_refused(self) -> None:
        message = self.refused(lambda s: s[3]["steps"][0]["expect"].update(phase="READY"))
        self.assertIn("unknown key 'phase'", message)

    def test_the_harness_refuses_before_starting_anything(self) -> None:
        document = load_scenarios()
        document["scenarios"][3]["steps"][0]["expect"]["stdout"] = 1
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "scenarios.json"
            path.write_text(json.dumps(document))
            done = subprocess.run(
                [
                    sys.executable,
                    str(CONFORMANCE / "harness"),
                    "--scenarios",
                    str(path),
                    "--bin-dir",
                    str(Path(tmp) / "no-binaries-here"),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn("stdout must be a string, not 1", done.stderr)
        self.assertEqual(done.stdout, "")


if __name__ == "__main__":
    unittest.main()
