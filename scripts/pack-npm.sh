#!/usr/bin/env bash
# Packs @openshell/sdk as a release publishes it, for this machine's
# platform: two npm tarballs that install with no cargo and no install script.
#
#   scripts/pack-npm.sh [--profile debug|release] [--out DIR]
#
#   @openshell/sdk-<platform>  (sdk-typescript/npm/<platform>/package.json:
#       os, cpu, libc) the addon openshell-sdk.<platform>.node, and the
#       reference gateway's executables that @openshell/sdk/testing runs
#       (mode 0755): bin/openshell-gateway, bin/openshell-supervisor and the
#       sandboxes' init bin/openshell-sandbox-init;
#   @openshell/sdk  the compiled package (dist/src, src for the source maps)
#       with no install script, the platform package named in its
#       optionalDependencies at the release version (what `napi pre-publish`
#       adds for every target of a release; here only this platform's).
#
# Everything comes from builds that exist already: target/<profile>/ (the
# addon, `cargo build -p openshell-sdk-node`, and the executables, `cargo
# build --bins`, with --release for release) and sdk-typescript/dist (`make
# typescript`). Binaries are copied without their debug info (release:
# without symbols either). Prints each
# tarball's and executable's size; the tarballs' paths are the last lines.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
profile=debug
out="$CARGO_TARGET_DIR/npm"
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "pack-npm: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$profile" in
  debug | release) ;;
  *) echo "pack-npm: --profile is debug or release" >&2; exit 2 ;;
esac
built="$CARGO_TARGET_DIR/$profile"
platform=$(node --input-type=module -e '
import { platformName } from "./sdk-typescript/scripts/platform.mjs";
console.log(platformName());')
[ -f "sdk-typescript/npm/$platform/package.json" ] || {
  echo "pack-npm: no platform package for $platform (sdk-typescript/npm/)" >&2
  exit 1
}
[ -f sdk-typescript/dist/src/index.js ] || {
  echo "pack-npm: sdk-typescript/dist is missing: make typescript first" >&2
  exit 1
}
case "$platform" in
  darwin-*) library=libopenshell_sdk_node.dylib ;;
  win32-*) library=openshell_sdk_node.dll ;;
  *) library=libopenshell_sdk_node.so ;;
esac
executables=(openshell-gateway openshell-supervisor openshell-sandbox-init)
for file in "$library" "${executables[@]}"; do
  [ -f "$built/$file" ] || {
    echo "pack-npm: $built/$file is missing: cargo build --bins -p openshell-sdk-node first" >&2
    exit 1
  }
done
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$out"
rm -f "$out"/openshell-sdk-*.tgz

# The platform package: its committed manifest, the addon, the executables.
pkg="$stage/platform"
mkdir -p "$pkg/bin"
cp "sdk-typescript/npm/$platform/package.json" "$pkg/"
# debug keeps its symbols (readable backtraces); release is stripped whole
# (the addon keeps the dynamic symbols Node loads it by).
case "$profile" in
  debug) strip_exe=(--strip-debug) strip_lib=(--strip-debug) ;;
  release) strip_exe=(--strip-all) strip_lib=(--strip-unneeded) ;;
esac
strip "${strip_lib[@]}" -o "$pkg/openshell-sdk.$platform.node" "$built/$library"
for exe in "${executables[@]}"; do
  strip "${strip_exe[@]}" -o "$pkg/bin/$exe" "$built/$exe"
  chmod 0755 "$pkg/bin/$exe"
done

# The main package: the committed manifest as a release publishes it.
main="$stage/main"
mkdir -p "$main/dist"
cp -R sdk-typescript/dist/src "$main/dist/src"
cp -R sdk-typescript/src sdk-typescript/README.md "$main/"
PLATFORM="$platform" FROM="$root/sdk-typescript/package.json" TO="$main/package.json" \
  node --input-type=module <<'JS'
import { readFileSync, writeFileSync } from "node:fs";
const { FROM: from, TO: to } = process.env;
const manifest = JSON.parse(readFileSync(from, "utf8"));
// No install script (the addon comes from the platform package) and
// nothing that only a source tree needs.
delete manifest.scripts;
delete manifest.devDependencies;
manifest.files = ["dist/src", "src"];
manifest.optionalDependencies = {
  [`@openshell/sdk-${process.env.PLATFORM}`]: manifest.version,
};
writeFileSync(to, `${JSON.stringify(manifest, null, 2)}\n`);
JS

for dir in "$pkg" "$main"; do
  (cd "$dir" && npm pack --ignore-scripts --silent --pack-destination "$out" >/dev/null)
done
kib() { echo "$(($(stat -c %s "$1") / 1024)) KiB"; }
for exe in "${executables[@]}"; do
  echo "pack-npm: $exe ($profile, strip ${strip_exe[*]}): $(kib "$pkg/bin/$exe")"
done
echo "pack-npm: addon openshell-sdk.$platform.node ($profile, strip ${strip_lib[*]}): $(kib "$pkg/openshell-sdk.$platform.node")"
for tarball in "$out"/openshell-sdk-*.tgz; do
  unpacked=$(tar -xzOf "$tarball" | wc -c)
  echo "pack-npm: $(basename "$tarball"): $(kib "$tarball") packed, $((unpacked / 1024)) KiB unpacked"
done
ls "$out"/openshell-sdk-*.tgz
