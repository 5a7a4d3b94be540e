"""The one place that judges conformance.

Runners only perform the steps of ``scenarios.json`` and report what they
observed, one JSON line per step (the format is in ``conformance/README.md``).
This package decides pass, fail or skip, the same way for every language:

- ``checks``: one function per expectation key, over one step's observation;
- ``vocabulary``: the ops, the inputs each takes and the expectations the
  harness checks for it; ``validate`` refuses a scenarios file that uses
  anything else, before a cluster is started;
- ``observations``: parses a runner's stdout into per-scenario records;
- ``verdict``: a scenario's outcome from its expectations and the records.

Standard library only, like the harness. Lower modules never import higher
ones (checks < vocabulary < observations < verdict).
"""
