#!/usr/bin/env bash
# Ships the Go SDK so that `go get` users need no Rust toolchain.
#
#   scripts/release-go.sh VERSION [--profile release|debug] [--out DIR] [--tag] [--scratch]
#
# 1. Builds the static library (bindings/c) for this machine's platform
#    (only linux_amd64 can be built here); archives of other platforms, built
#    on their own runners, are taken from $OPENSHELL_GO_ARCHIVES/<goos>_<goarch>/
#    libopenshell_c.a when that directory exists.
#    The reference gateway's executables (openshell-gateway, the
#    openshell-supervisor it starts per sandbox and the sandboxes' init
#    openshell-sandbox-init: what openshelltest runs) are built with it and
#    stripped (a release whole, a debug build of its debug info); other
#    platforms' are taken from the same
#    directory.
# 2. Makes a release commit: HEAD's tree plus every platform's archive at
#    sdk-go/internal/native/lib/<goos>_<goarch>/libopenshell_c.a (the path the
#    cgo LDFLAGS of sdk-go/internal/native name) and its executables beside it
#    (where openshelltest looks for them), with HEAD as parent. The work
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
echo "release-go: building the $profile static library and executables for $host"
packages=(-p openshell-c -p openshell-gateway -p openshell-supervisor)
if [ "$profile" = release ]; then
  cargo build -q --release "${packages[@]}"
else
  cargo build -q "${packages[@]}"
fi
EXECUTABLES=(openshell-gateway openshell-supervisor openshell-sandbox-init)
# platform -> the directory holding its libopenshell_c.a and executables.
declare -A platforms=(["$host"]="$CARGO_TARGET_DIR/$profile")
if [ -n "${OPENSHELL_GO_ARCHIVES:-}" ] && [ -d "$OPENSHELL_GO_ARCHIVES" ]; then
  for dir in "$OPENSHELL_GO_ARCHIVES"/*_*; do
    [ -f "$dir/libopenshell_c.a" ] && platforms["$(basename "$dir")"]="$dir"
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
for platform in "${!platforms[@]}"; do
  from="${platforms[$platform]}"
  lib="sdk-go/internal/native/lib/$platform"
  blob=$(git hash-object -w "$from/libopenshell_c.a")
  git update-index --add --cacheinfo "100644,$blob,$lib/libopenshell_c.a"
  printf 'release-go: %-12s %-26s %10s bytes (%s)\n' "$platform" libopenshell_c.a \
    "$(stat -c %s "$from/libopenshell_c.a")" "$from"
  for exe in "${EXECUTABLES[@]}"; do
    if [ ! -f "$from/$exe" ]; then
      echo "release-go: $from/$exe is missing (each platform ships its executables)" >&2
      exit 1
    fi
    mkdir -p "$tmp/strip/$platform"
    # A release loses its symbols too (as the wheel's and npm's do); a
    # debug build keeps them for backtraces.
    if [ "$profile" = release ]; then
      objcopy --strip-all "$from/$exe" "$tmp/strip/$platform/$exe"
    else
      objcopy --strip-debug "$from/$exe" "$tmp/strip/$platform/$exe"
    fi
    blob=$(git hash-object -w "$tmp/strip/$platform/$exe")
    git update-index --add --cacheinfo "100755,$blob,$lib/$exe"
    printf 'release-go: %-12s %-26s %10s bytes (stripped, %s before)\n' \
      "$platform" "$exe" "$(stat -c %s "$tmp/strip/$platform/$exe")" "$(stat -c %s "$from/$exe")"
  done
done
tree=$(git write-tree)
unset GIT_INDEX_FILE
commit=$(git commit-tree "$tree" -p HEAD -m "release: sdk-go $version (static archives and executables: ${!platforms[*]})")
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
# The go command refuses a module zip over 500 MiB, or whose files add up
# to more than that.
LIMIT = 500 << 20
unzipped = 0
with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
    for base, dirs, files in os.walk(src):
        # A directory with its own go.mod is another module (sdk-go/bench).
        dirs[:] = sorted(d for d in dirs if not os.path.exists(os.path.join(base, d, "go.mod")))
        for name in sorted(files):
            path = os.path.join(base, name)
            rel = os.path.relpath(path, src)
            z.write(path, f"{prefix}/{rel}")
            unzipped += os.path.getsize(path)
zipped = os.path.getsize(target)
print(f"release-go: module zip {zipped} bytes ({zipped / 1e6:.1f} MB), "
      f"{unzipped} bytes unzipped ({unzipped / 1e6:.1f} MB); Go's limit is {LIMIT} bytes for each")
if zipped > LIMIT or unzipped > LIMIT:
    sys.exit("release-go: the module zip is over Go's 500 MiB limit")
PY
( ls "$dest"/*.info 2>/dev/null | xargs -n1 basename | sed 's/\.info$//' ) > "$dest/list"
echo "release-go: GOPROXY=file://$out ($(stat -c %s "$dest/$version.zip") bytes zipped)"
