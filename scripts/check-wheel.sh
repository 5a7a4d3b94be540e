#!/usr/bin/env bash
# `pip install ./sdk-python` in a clean virtualenv, as a user would: pip builds
# the abi3 wheel with maturin through PEP 517 (maturin comes from PyPI into
# pip's isolated build environment), installs it, and the package imports
# and works without the project venv. Release build; the cargo target
# directory is the workspace's, so later runs reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
echo "check-wheel: pip install ./sdk-python into a clean venv"
CARGO_TARGET_DIR="$root/target" "$tmp/venv/bin/pip" install -q ./sdk-python
cd "$tmp"
"$tmp/venv/bin/python" - <<'PY'
import importlib.metadata
import pathlib

import openshell_sdk

module = pathlib.Path(openshell_sdk._native.__file__)
assert module.name.endswith(".abi3.so"), module
assert "site-packages" in str(module), module
assert (pathlib.Path(openshell_sdk.__file__).parent / "py.typed").exists()
client = openshell_sdk.Client("http://127.0.0.1:1", connect_timeout=1)
try:
    client.health()
except openshell_sdk.ConnectError as err:
    assert err.code == "connect"
else:
    raise AssertionError("expected a connect error")
print("check-wheel: ok:", importlib.metadata.version("openshell-sdk"), module.name)
PY
