#!/usr/bin/env bash
# Ships the Go SDK so that `go get` users need no Rust toolchain.
#
#   scripts/release-go.sh VERSION [--profile release|debug] [--out DIR] [--tag] [--scratch]
#
# 1. Builds the static library (bindings/c) for this machine's platform
#    (only linux_amd64 can be built here); archives of other platforms, built
#    on their own runners, are taken from $OPENSHELL_GO_ARCHIVES/<goos>_<goarch>/
#    libopenshell_c.a when that directory exists.
# 2. Makes a release commit: HEAD's tree plus every platform's archive at
#    sdk-go/internal/native/lib/<goos>_<goarch>/libopenshell_c.a (the path the
#    cgo LDFLAGS of sdk-go/internal/native name), with HEAD as parent. The work
#    tree, the index and HEAD are untouched; with --tag the commit is tagged
#    sdk-go/VERSION (the tag form Go expects for a module in a subdirectory).
# 3. Writes a module proxy directory for that commit to DIR (default
#    $CARGO_TARGET_DIR/go-release): example.invalid/openshell/sdk-go/@v/
#    {list,VERSION.info,VERSION.mod,VERSION.zip}, servable as it is with
#    GOPROXY=file://DIR or any static file server.
#
# --scratch (checks, CI) writes the release commit's objects to a temporary
# object directory that reads the repository's as an alternate, so a check
# leaves nothing in the repository.
#
# scripts/check-go-consumer.sh builds a consumer module against that
# directory with cargo off PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
MODULE=example.invalid/openshell/sdk-go

version="${1:-}"
shift || true
profile=release
out="$CARGO_TARGET_DIR/go-release"
tag=0
scratch=0
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --tag) tag=1; shift ;;
    --scratch) scratch=1; shift ;;
    *) echo "release-go: unknown argument $1" >&2; exit 2 ;;
  esac
done
if ! [[ "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "usage: scripts/release-go.sh vX.Y.Z [--profile release|debug] [--out DIR] [--tag]" >&2
  exit 2
fi

host="$("$GO" env GOOS)_$("$GO" env GOARCH)"
echo "release-go: building the $profile static library for $host"
if [ "$profile" = release ]; then
  cargo build -q --release -p openshell-c
else
  cargo build -q -p openshell-c
fi
declare -A archives=(["$host"]="$CARGO_TARGET_DIR/$profile/libopenshell_c.a")
if [ -n "${OPENSHELL_GO_ARCHIVES:-}" ] && [ -d "$OPENSHELL_GO_ARCHIVES" ]; then
  for dir in "$OPENSHELL_GO_ARCHIVES"/*_*; do
    [ -f "$dir/libopenshell_c.a" ] && archives["$(basename "$dir")"]="$dir/libopenshell_c.a"
  done
fi

# The release commit, built with a private index.
index=$(mktemp)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$index"' EXIT
if [ "$scratch" = 1 ]; then
  if [ "$tag" = 1 ]; then
    echo "release-go: --tag and --scratch exclude each other" >&2
    exit 2
  fi
  objects="$(cd "$(git rev-parse --git-common-dir)" && pwd)/objects"
  mkdir -p "$tmp/objects"
  export GIT_OBJECT_DIRECTORY="$tmp/objects" GIT_ALTERNATE_OBJECT_DIRECTORIES="$objects"
fi
export GIT_INDEX_FILE="$index"
git read-tree HEAD
for platform in "${!archives[@]}"; do
  archive="${archives[$platform]}"
  blob=$(git hash-object -w "$archive")
  git update-index --add --cacheinfo "100644,$blob,sdk-go/internal/native/lib/$platform/libopenshell_c.a"
  printf 'release-go: %-12s %s (%s bytes)\n' "$platform" "$archive" "$(stat -c %s "$archive")"
done
tree=$(git write-tree)
unset GIT_INDEX_FILE
commit=$(git commit-tree "$tree" -p HEAD -m "release: sdk-go $version (static archives: ${!archives[*]})")
echo "release-go: release commit $commit"
if [ "$tag" = 1 ]; then
  git tag "sdk-go/$version" "$commit"
  echo "release-go: tagged sdk-go/$version"
fi

# The module proxy directory, from the release commit's sdk-go tree.
mkdir -p "$tmp/tree"
git archive "$commit" sdk-go | tar -x -C "$tmp/tree"
dest="$out/$MODULE/@v"
mkdir -p "$dest"
cp "$tmp/tree/sdk-go/go.mod" "$dest/$version.mod"
printf '{"Version":"%s","Time":"%s"}\n' "$version" "$(git show -s --format=%cI "$commit")" > "$dest/$version.info"
python3 - "$tmp/tree/sdk-go" "$MODULE@$version" "$dest/$version.zip" <<'PY'
import os, sys, zipfile
src, prefix, target = sys.argv[1:]
with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
    for base, dirs, files in os.walk(src):
        # A directory with its own go.mod is another module (sdk-go/bench).
        dirs[:] = sorted(d for d in dirs if not os.path.exists(os.path.join(base, d, "go.mod")))
        for name in sorted(files):
            path = os.path.join(base, name)
            rel = os.path.relpath(path, src)
            z.write(path, f"{prefix}/{rel}")
PY
( ls "$dest"/*.info 2>/dev/null | xargs -n1 basename | sed 's/\.info$//' ) > "$dest/list"
echo "release-go: GOPROXY=file://$out ($(stat -c %s "$dest/$version.zip") bytes zipped)"
