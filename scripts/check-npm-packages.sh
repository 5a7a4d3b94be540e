#!/usr/bin/env bash
# The packed npm packages as a user gets them (scripts/pack-npm.sh, from the
# debug build: no release build here): @openshell/sdk and this platform's
# @openshell/sdk-<platform> installed from their tarballs into a fresh
# project, with no cargo on PATH, no install script (the published manifest
# has none, and --ignore-scripts) and no OPENSHELL_GATEWAY_BIN; then
#   1. a user's node:test file (sdk-typescript/consumer) starts a cluster
#      from the gateway inside the platform package: an exec on each of 3
#      replicas, the owner of a sandbox killed, the next exec runs once; no
#      process of ours is left after;
#   2. the same as an unprivileged user (uid 65534);
#   3. a Node process holding a cluster, killed with SIGKILL, leaves no
#      gateway, edge or supervisor behind within 60 s.
# "Ours": a process whose /proc/PID/exe lies inside the temporary project.
# `scripts/check-npm-packages.sh --profile release` checks a release build's
# packages the same way (built beforehand; make test never builds release).
set -euo pipefail
profile=debug
if [ "${1:-}" = "--profile" ]; then profile=$2; fi
cd "$(dirname "$0")/.."
root=$(pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
tmp=$(mktemp -d)
holder=""
cleanup() {
  # Only the holder this script started, by its PID.
  if [ -n "$holder" ]; then kill -9 "$holder" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
chmod 755 "$tmp"

bash scripts/pack-npm.sh --profile "$profile" --out "$tmp/packs" | tee "$tmp/pack.log" | grep -v '^/'
main=$(ls "$tmp"/packs/openshell-sdk-[0-9]*.tgz)
platform=$(ls "$tmp"/packs/openshell-sdk-*.tgz | grep -v "^$main$")
if tar -xzOf "$main" package/package.json | grep -Eq '"(pre|post)?install"'; then
  echo "check-npm-packages: the packed @openshell/sdk has an install script" >&2
  exit 1
fi

# A user's machine: no cargo, no checkout binaries, no variable naming them.
project="$tmp/project"
mkdir -p "$tmp/home" "$tmp/run" "$project"
user_env=(env -i "PATH=/usr/bin:/bin" "HOME=$tmp/home" "TMPDIR=$tmp/run"
  "npm_config_cache=${npm_config_cache:-$HOME/.npm}")
if "${user_env[@]}" sh -c 'command -v cargo' >/dev/null; then
  echo "check-npm-packages: cargo is on the user's PATH" >&2
  exit 1
fi
cd "$project"
printf '{"name":"npm-packages-check","version":"1.0.0","private":true,"type":"module"}\n' >package.json
cp "$root/sdk-typescript/consumer/local-cluster.test.mjs" .
started=$(date +%s)
# --prefer-offline: @bufbuild/protobuf comes from the npm cache `make node` filled.
"${user_env[@]}" npm install --no-audit --no-fund --ignore-scripts --prefer-offline \
  "$main" "$platform" >"$tmp/npm.log" 2>&1 || {
  cat "$tmp/npm.log" >&2
  echo "check-npm-packages: FAILED: npm install of the tarballs" >&2
  exit 1
}
for exe in openshell-gateway openshell-supervisor openshell-sandbox-init; do
  found=$(ls "$project"/node_modules/@openshell/sdk-*/bin/$exe 2>/dev/null || true)
  [ -n "$found" ] && [ -x "$found" ] || {
    echo "check-npm-packages: no executable $exe in the installed platform package" >&2
    exit 1
  }
done
echo "check-npm-packages: installed both tarballs in $(($(date +%s) - started)) s"

# Every live process running an executable from the project.
ours() {
  for exe in /proc/[0-9]*/exe; do
    target=$(readlink "$exe" 2>/dev/null) || continue
    case "$target" in "$project"/*) pid=${exe#/proc/}; echo "${pid%/exe}" ;; esac
  done
}
# Waits (bounded) until no process of ours runs.
none_left() {
  local what=$1 within=$2 from
  from=$(date +%s%N)
  while [ -n "$(ours)" ] && [ $(($(date +%s%N) - from)) -lt $((within * 1000000000)) ]; do
    sleep 0.1
  done
  if [ -n "$(ours)" ]; then
    echo "check-npm-packages: FAILED: $what left processes: $(ours | tr '\n' ' ')" >&2
    exit 1
  fi
  echo "check-npm-packages: no process of ours $((($(date +%s%N) - from) / 1000000)) ms after $what"
}
[ -z "$(ours)" ] || { echo "check-npm-packages: processes of the project before any test" >&2; exit 1; }

echo "check-npm-packages: node --test with startLocalCluster (root)"
"${user_env[@]}" node --test --test-reporter=spec local-cluster.test.mjs
none_left "node --test" 10

echo "check-npm-packages: the same as uid 65534"
chown -R 65534:65534 "$tmp/home" "$tmp/run" "$project"
"${user_env[@]}" setpriv --reuid=65534 --regid=65534 --clear-groups \
  node --test --test-reporter=spec local-cluster.test.mjs
none_left "node --test as uid 65534" 10

echo "check-npm-packages: SIGKILL of a process holding a cluster"
cat >holder.mjs <<'JS'
import { startLocalCluster } from "@openshell/sdk/testing";
const cluster = await startLocalCluster({ replicas: 2 });
const client = cluster.client();
const sandbox = await client.sandboxes.create();
await client.sandboxes.waitReady(sandbox.name, { timeoutMs: 60_000 });
console.log(cluster.dataDir);
setInterval(() => {}, 1000); // held until killed
JS
fifo="$tmp/holder.out"
mkfifo "$fifo"
"${user_env[@]}" node holder.mjs >"$fifo" &
holder=$!
read -r -t 120 data_dir <"$fifo" || { echo "check-npm-packages: the holder printed nothing" >&2; exit 1; }
running=$(ours | wc -l)
# up, 2 replicas, the edge and the sandbox's supervisor at least.
[ "$running" -ge 5 ] || { echo "check-npm-packages: only $running processes of the cluster run" >&2; exit 1; }
kill -9 "$holder"
wait "$holder" 2>/dev/null || true
holder=""
none_left "a SIGKILLed holder" 60
echo "check-npm-packages: ok: $running processes gone after SIGKILL (data $data_dir kept)"
echo "check-npm-packages: tarballs: $(grep 'packed,' "$tmp/pack.log" | sed 's/^pack-npm: //' | tr '\n' ';')"
