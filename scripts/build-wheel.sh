#!/usr/bin/env bash
# Builds the openshell-sdk wheel with the reference gateway inside it, so that
# `pip install` of the wheel gives a working local cluster without cargo
# (openshell_sdk.testing finds them in openshell_sdk/_bin/).
#
#   scripts/build-wheel.sh [--profile debug|release] [--out DIR]
#
# The executables (openshell-gateway, openshell-supervisor and the sandboxes'
# init, openshell-sandbox-init) are taken from
# target/<profile>/ (built already: `cargo build --bins`, with --release for
# release), copied without their debug info, and removed from the source tree
# again after the build. debug reuses `make python`'s build of the extension;
# release is what a published wheel carries.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
profile=debug
out="$CARGO_TARGET_DIR/wheels"
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "build-wheel: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$profile" in
  debug) cargo_profile=dev ;;
  release) cargo_profile=release ;;
  *) echo "build-wheel: --profile is debug or release" >&2; exit 2 ;;
esac
bundle="$root/sdk-python/src/openshell_sdk/_bin"
trap 'rm -rf "$bundle"' EXIT
rm -rf "$bundle"
mkdir -p "$bundle"
for exe in openshell-gateway openshell-supervisor openshell-sandbox-init; do
  built="$CARGO_TARGET_DIR/$profile/$exe"
  [ -x "$built" ] || { echo "build-wheel: $built is missing: cargo build --bins first" >&2; exit 1; }
  # Release wheels lose their symbols too; debug ones keep them (backtraces).
  if [ "$profile" = release ]; then
    strip --strip-all -o "$bundle/$exe" "$built"
  else
    strip --strip-debug -o "$bundle/$exe" "$built"
  fi
done
rm -rf "$out"
mkdir -p "$out"
cd sdk-python
"${MATURIN:-$root/.venv/bin/maturin}" build -q --profile "$cargo_profile" --out "$out"
ls "$out"/*.whl
