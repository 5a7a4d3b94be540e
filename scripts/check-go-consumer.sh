#!/usr/bin/env bash
# A consumer module built against a Go SDK release as a user gets it: from a
# module proxy (file:// here), with cargo off PATH, offline (the SDK from the
# release directory, other modules from the local module cache).
#
#   scripts/check-go-consumer.sh [PROXY_DIR] [VERSION]
#
# Defaults: $CARGO_TARGET_DIR/go-release, v0.0.0-ci (what `make
# check-go-release` writes with scripts/release-go.sh --profile debug).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
proxy="${1:-$CARGO_TARGET_DIR/go-release}"
version="${2:-v0.0.0-ci}"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
cache="$("$GO" env GOMODCACHE)/cache/download"
tmp=$(mktemp -d)
# Go writes its module cache read-only: make it writable before removing
# it, also when a step below failed.
trap 'chmod -R u+w "$tmp" 2>/dev/null || true; rm -rf "$tmp"' EXIT
cd "$tmp"
cat > go.mod <<MOD
module consumer

go 1.24

require example.invalid/openshell/sdk-go $version
MOD
cat > main.go <<'GO'
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	openshell "example.invalid/openshell/sdk-go"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := openshell.Dial(ctx, "http://127.0.0.1:1", openshell.WithConnectTimeout(time.Second))
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	defer client.Close()
	_, err = client.Health(ctx)
	var e *openshell.Error
	if !errors.As(err, &e) || e.Code != "connect" || !errors.Is(err, openshell.ErrUnavailable) {
		fmt.Println("expected a connect error, got:", err)
		os.Exit(1)
	}
	fmt.Println("check-go-consumer: ok (the linked core answered with", e.Code+")")
}
GO
# cargo off PATH: only the Go toolchain and the system's tools (cc, ld).
export PATH="$(dirname "$GO"):/usr/local/bin:/usr/bin:/bin"
if command -v cargo >/dev/null 2>&1; then
  echo "check-go-consumer: cargo is still on PATH ($(command -v cargo))" >&2
  exit 1
fi
# The release's proxy, then the local module cache, then the public Go module
# proxy for what neither holds (tidy also resolves the test imports of the
# dependencies, which `go mod download` does not fetch on a fresh machine).
export GOPROXY="file://$proxy,file://$cache,https://proxy.golang.org" GOSUMDB=off GOFLAGS="-mod=mod -modcacherw" GOTOOLCHAIN=local
export GOMODCACHE="$tmp/modcache"  # a fresh module cache: the SDK really comes from the proxy
export CGO_ENABLED=1
"$GO" mod tidy
"$GO" build -o consumer .
echo "check-go-consumer: built $(stat -c %s consumer) bytes against $version from $proxy"
./consumer
