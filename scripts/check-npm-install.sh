#!/usr/bin/env bash
# `npm install <checkout>/sdk-typescript` into a temporary project, as a user
# on a fresh machine would. The package installed is a clean copy of
# sdk-typescript (the tracked and new files of the working tree: no
# node_modules, no dist/, no native/), so the install script must do all of
# it: install the package's own dependencies (npm does not, for a folder
# dependency), compile its TypeScript with the pinned compiler, and build the
# addon with cargo (debug profile, the shared cargo target dir). Then a
# program using the package runs. The working tree's sdk-typescript is left
# alone. npm 11 runs a dependency's install script only once the project
# approves it (`npm install-scripts approve`), which the README shows.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
tmp=$(mktemp -d)
# The copy sits inside the checkout (gitignored) so the install script finds
# the Rust workspace above it and cargo reuses the shared target dir.
copy_root=$(mktemp -d "$root/.npm-install-check.XXXXXX")
trap 'rm -rf "$tmp" "$copy_root"' EXIT
log="$tmp/npm.log"
fail() {
  echo "check-npm-install: FAILED: $1 (log follows)" >&2
  cat "$log" >&2
  exit 1
}

package="$copy_root/sdk-typescript"
mkdir -p "$package"
git ls-files -z --cached --others --exclude-standard -- sdk-typescript |
  while IFS= read -r -d '' file; do
    [ -e "$file" ] || continue # deleted in the working tree
    mkdir -p "$copy_root/$(dirname "$file")"
    cp -p "$file" "$copy_root/$file"
  done
for leftover in node_modules dist native; do
  [ ! -e "$package/$leftover" ] || { echo "check-npm-install: $leftover in the copy" >&2; exit 1; }
done

cd "$tmp"
mkdir project
cd project
printf '{"name":"npm-install-check","version":"1.0.0","private":true,"type":"module"}\n' > package.json
echo "check-npm-install: npm install of a clean copy of sdk-typescript into a temporary project"
started=$(date +%s)
# As the README shows: install, approve the package's install script
# (npm 11 warns about unapproved ones), install again from scratch. The
# install script's own lines (`@openshell/sdk: ...`) are checked below.
npm install --no-audit --no-fund --foreground-scripts "$package" >"$log" 2>&1 || fail "npm install"
npm install-scripts approve @openshell/sdk >>"$log" 2>&1 || fail "npm install-scripts approve"
rm -rf node_modules package-lock.json
npm install --no-audit --no-fund --foreground-scripts >>"$log" 2>&1 || fail "npm install (with the install script)"
[ -f "$package/dist/src/index.js" ] || fail "the install script did not compile dist/"
cat > check.mjs <<'JS'
import { Client, ConnectError } from "@openshell/sdk";
const client = new Client({ endpoint: "http://127.0.0.1:1", connectTimeoutMs: 1000 });
try {
  await client.health();
  throw new Error("expected a connect error");
} catch (err) {
  if (!(err instanceof ConnectError) || err.code !== "connect") throw err;
}
await client.close();
console.log("check-npm-install: ok");
JS
node check.mjs >>"$log" 2>&1 || fail "the program using the package"
# What the install script did (it must have done each step itself).
grep '^@openshell/sdk:' "$log" || true
for step in "installing its dependencies" "compiling the TypeScript" "building the native addon"; do
  grep -q "^@openshell/sdk: $step" "$log" || fail "the install script did not report: $step"
done
tail -n 1 "$log"
echo "check-npm-install: install and run took $(($(date +%s) - started)) s"
