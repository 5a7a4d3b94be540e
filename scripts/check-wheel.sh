#!/usr/bin/env bash
# The built wheel as a user gets it: installed into a fresh virtualenv with
# no cargo on PATH and the checkout nowhere on the import path, then
#   1. the package imports and works (abi3 extension, py.typed, errors);
#   2. a user's pytest file (sdk-python/consumer) runs against the cluster the
#      plugin's openshell_cluster fixture starts from the executables inside
#      the wheel: an exec on each of 3 replicas, the owner of a sandbox
#      killed, the next exec runs once; no process of ours is left after;
#   3. the same pytest run as an unprivileged user (uid 65534);
#   4. a Python process holding a cluster, killed with SIGKILL, leaves no
#      gateway, edge or supervisor behind.
# The wheel is scripts/build-wheel.sh's debug build (no release build here).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
# The system's interpreter where it is new enough: one under /root (pyenv)
# cannot be run by the unprivileged user of step 3.
python=python3
if /usr/bin/python3 -c 'import sys, venv; assert sys.version_info >= (3, 11)' 2>/dev/null; then
  python=/usr/bin/python3
fi

"$python" -m venv "$tmp/source"
"$tmp/source/bin/pip" install -q --disable-pip-version-check ./sdk-python \
  --config-settings build-args="--profile dev" >"$tmp/source.log" 2>&1 || { cat "$tmp/source.log" >&2; exit 1; }
(cd "$tmp" && "$tmp/source/bin/python" -c '
import openshell_sdk, openshell_sdk.testing as t
assert "site-packages" in openshell_sdk._native.__file__
assert t.bundled_gateway() is None, "a source install has no bundled gateway"
print("check-wheel: pip install ./sdk-python: ok (the client alone)")
')

bash scripts/build-wheel.sh --profile debug --out "$tmp/wheels" >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log" >&2; exit 1; }
wheel=$(ls "$tmp"/wheels/*.whl)
echo "check-wheel: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB) into a clean venv"
"$python" -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --disable-pip-version-check "$wheel" "pytest==9.2.0"
bundle=$("$tmp/venv/bin/python" -c 'import openshell_sdk.testing as t; print(t.bundled_gateway().parent)')

# A user's machine: no cargo, no checkout binaries, no variable naming them.
user_env=(env -i "PATH=$tmp/venv/bin:/usr/bin:/bin" "HOME=$tmp/home" "TMPDIR=$tmp/run")
mkdir -p "$tmp/home" "$tmp/run" "$tmp/project"
if "${user_env[@]}" sh -c 'command -v cargo' >/dev/null; then
  echo "check-wheel: cargo is on the user's PATH" >&2
  exit 1
fi
cp sdk-python/consumer/test_local_cluster.py "$tmp/project/"

# Every live process running an executable from the installed wheel.
ours() {
  for exe in /proc/[0-9]*/exe; do
    target=$(readlink "$exe" 2>/dev/null) || continue
    case "$target" in "$bundle"/*) pid=${exe#/proc/}; echo "${pid%/exe}" ;; esac
  done
}
# Waits (bounded) until no process of ours runs.
none_left() {
  local what=$1 within=$2 waited=0
  while [ -n "$(ours)" ] && [ "$waited" -lt $((within * 10)) ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  if [ -n "$(ours)" ]; then
    echo "check-wheel: FAILED: $what left processes: $(ours | tr '\n' ' ')" >&2
    exit 1
  fi
}
[ -z "$(ours)" ] || { echo "check-wheel: processes of the new venv before any test" >&2; exit 1; }

cd "$tmp/project"
"${user_env[@]}" python - <<'PY'
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
print("check-wheel: imports:", importlib.metadata.version("openshell-sdk"), module.name)
PY

echo "check-wheel: pytest with the openshell_cluster fixture (root)"
"${user_env[@]}" python -m pytest -q -p no:cacheprovider test_local_cluster.py
none_left "pytest" 10

echo "check-wheel: the same as uid 65534"
chown -R 65534:65534 "$tmp/home" "$tmp/run" "$tmp/project"
"${user_env[@]}" setpriv --reuid=65534 --regid=65534 --clear-groups \
  python -m pytest -q -p no:cacheprovider test_local_cluster.py
none_left "pytest as uid 65534" 10

echo "check-wheel: SIGKILL of a process holding a cluster"
fifo="$tmp/holder.out"
mkfifo "$fifo"
"${user_env[@]}" python -c '
from openshell_sdk.testing import LocalCluster
import sys, time
cluster = LocalCluster(replicas=2).start()
with cluster.client() as client:
    sandbox = client.sandboxes.create()
    client.sandboxes.wait_ready(sandbox.name, timeout=60)
print(cluster.data_dir, flush=True)
time.sleep(600)
' >"$fifo" &
holder=$!
read -r -t 120 data_dir <"$fifo" || { echo "check-wheel: the holder printed nothing" >&2; kill -9 "$holder"; exit 1; }
running=$(ours | wc -l)
# up, 2 replicas, the edge and the sandbox's supervisor.
[ "$running" -ge 5 ] || { echo "check-wheel: only $running processes of the cluster run" >&2; kill -9 "$holder"; exit 1; }
kill -9 "$holder"
wait "$holder" 2>/dev/null || true
none_left "a SIGKILLed holder" 60
echo "check-wheel: ok: $running processes gone after SIGKILL (data $data_dir kept)"
