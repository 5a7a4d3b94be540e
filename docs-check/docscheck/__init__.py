"""The parts of `make check-docs` (docs-check/check_docs.py), one concern each.

- ``common``: the repository root, shared addresses and timeouts, the error.
- ``blocks``: fenced code blocks out of Markdown.
- ``processes``: free loopback ports and the servers the check starts.
- ``context``: the state of one run, scratch files, logged runs, reports.
- ``gateways``: the cluster and the single gateways the blocks run against.
- ``rust``, ``python``, ``typescript``, ``go``: each language's blocks.
- ``shell``: sh blocks, command by command (``ShellRunner``).
- ``coverage``: sh commands the check does not run but ``make test`` does.
"""
