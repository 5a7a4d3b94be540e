#!/usr/bin/env bash
# A consumer module built against a Go SDK release as a user gets it: from a
# module proxy (file:// here), with cargo off PATH, offline (the SDK from the
# release directory, other modules from the local module cache).
#
#   scripts/check-go-consumer.sh [PROXY_DIR] [VERSION]
#
# Defaults: $CARGO_TARGET_DIR/go-release, v0.0.0-ci (what `make
# check-go-release` writes with scripts/release-go.sh --profile debug).
#
# Two checks: a program whose call reaches the linked core, and a _test.go
# with openshelltest.Start(t) and no OPENSHELL_GATEWAY_BIN, which runs the
# gateway the release carries (copied into a fresh user cache directory):
# an exec on each of 3 replicas, the owner of a sandbox killed, the next
# exec on it runs; as root and as uid 65534. Afterwards no process runs
# from that cache directory.
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
cat > consumer_test.go <<'GO'
package main

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
	"example.invalid/openshell/sdk-go/openshelltest"
)

func countRun(t *testing.T, ctx context.Context, client *openshell.Client, sandbox string) string {
	t.Helper()
	out, err := client.Exec(ctx, openshell.ExecRequest{
		Sandbox: sandbox, Command: []string{"sh", "-c", "echo run >> runs; wc -l < runs"}})
	if err != nil {
		t.Fatalf("exec in %s: %v", sandbox, err)
	}
	return strings.TrimSpace(string(out.Stdout))
}

func TestTheReleaseRunsAClusterOfItsOwn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cluster := openshelltest.Start(t)
	client := cluster.Client()

	// The gateway runs from the user cache, copied there from the module.
	var status struct {
		PID int `json:"pid"`
	}
	b, err := os.ReadFile(filepath.Join(cluster.DataDir(), "up", "status.json"))
	if err != nil || json.Unmarshal(b, &status) != nil {
		t.Fatalf("status file: %v", err)
	}
	exe, _ := os.Readlink("/proc/" + strconv.Itoa(status.PID) + "/exe")
	cache, _ := os.UserCacheDir()
	if !strings.HasPrefix(exe, filepath.Join(cache, "openshell")+"/") {
		t.Fatalf("the gateway runs from %s, not from the user cache %s", exe, cache)
	}
	t.Logf("gateway: %s", exe)

	on := map[string]string{}
	for i := 0; i < 15 && len(on) < 3; i++ {
		sandbox, err := client.Sandboxes().Create(ctx, openshell.CreateSandbox{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Sandboxes().WaitReady(ctx, sandbox.Name); err != nil {
			t.Fatal(err)
		}
		owner, err := cluster.OwnerOf(ctx, sandbox.Name)
		if err != nil || owner == "" {
			t.Fatalf("owner %q: %v", owner, err)
		}
		if _, seen := on[owner]; !seen {
			on[owner] = sandbox.Name
		}
	}
	if len(on) != 3 {
		t.Fatalf("owners: %v", on)
	}
	for _, sandbox := range on {
		if got := countRun(t, ctx, client, sandbox); got != "1" {
			t.Fatalf("counted %s", got)
		}
	}
	owner := slices.Sorted(maps.Keys(on))[0]
	if err := cluster.KillReplica(ctx, owner); err != nil {
		t.Fatal(err)
	}
	if got := countRun(t, ctx, client, on[owner]); got != "2" {
		t.Fatalf("the exec after %s was killed counted %s (want 2: once)", owner, got)
	}
}

func TestFilesAndLogsWithTheReleasesExecutables(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cluster := openshelltest.Start(t, openshelltest.WithReplicas(1))
	client := cluster.Client()
	sandbox, err := client.Sandboxes().Create(ctx, openshell.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Sandboxes().WaitReady(ctx, sandbox.Name); err != nil {
		t.Fatal(err)
	}
	// Every byte value, 1 MiB: binary-safe both ways.
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i)
	}
	if sum, err := client.WriteFile(ctx, sandbox.Name, "blob.bin", data); err != nil || sum.Bytes != uint64(len(data)) {
		t.Fatalf("write: %+v %v", sum, err)
	}
	if got, err := client.ReadFile(ctx, sandbox.Name, "blob.bin"); err != nil || string(got) != string(data) {
		t.Fatalf("read back %d bytes: %v", len(got), err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tree", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tree", "sub", "a.txt"), []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if sum, err := client.Upload(ctx, sandbox.Name, filepath.Join(dir, "tree"), "tree"); err != nil || sum.Files != 1 {
		t.Fatalf("upload: %+v %v", sum, err)
	}
	if _, err := client.Download(ctx, sandbox.Name, "tree", filepath.Join(dir, "back")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "back", "sub", "a.txt")); err != nil || string(b) != "a\n" {
		t.Fatalf("downloaded %q: %v", b, err)
	}

	out, err := client.Exec(ctx, openshell.ExecRequest{Sandbox: sandbox.Name, Command: []string{"sh", "-c", "exit 3"}})
	if err != nil || out.ExitCode != 3 {
		t.Fatalf("exec: %+v %v", out, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		logs, err := client.Sandboxes().Logs(ctx, sandbox.Name, openshell.LogQuery{Sources: []string{"sandbox"}})
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(logs.Lines, func(l openshell.LogLine) bool {
			return l.Message == "exec finished" && l.Fields["exit_code"] == "3"
		}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no exit 3 line in %d lines", len(logs.Lines))
		}
		time.Sleep(200 * time.Millisecond)
	}
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
export GOPROXY="file://$proxy,file://$cache,https://proxy.golang.org" GOSUMDB=off GOFLAGS="-mod=mod" GOTOOLCHAIN=local
export GOMODCACHE="$tmp/modcache"  # a fresh module cache: the SDK really comes from the proxy
export CGO_ENABLED=1
"$GO" mod tidy
"$GO" build -o consumer .
echo "check-go-consumer: built $(stat -c %s consumer) bytes against $version from $proxy"
./consumer

# openshelltest with nothing but the release: no variable, no gateway on
# PATH, and a fresh user cache directory for the copied executables; as
# root, then as an unprivileged user (uid 65534, isolation falls back).
unset OPENSHELL_GATEWAY_BIN
if command -v openshell-gateway >/dev/null 2>&1; then
  echo "check-go-consumer: an openshell-gateway is on PATH ($(command -v openshell-gateway))" >&2
  exit 1
fi
"$GO" test -c -o consumer.test .

# The processes running an executable under $1.
running_from() {
  local exe target pid
  for exe in /proc/[0-9]*/exe; do
    target=$(readlink "$exe" 2>/dev/null) || continue
    pid=${exe#/proc/}
    case "$target" in "$1"/*) echo "${pid%/exe}" ;; esac
  done
}

# Runs the consumer's test with its own HOME and user cache directory ($1),
# as the user of the command prefix that follows, then checks that the
# executables were copied there and that no process runs from them (at most
# 10 s after the test ended).
run_test() {
  local home=$1 began=$SECONDS
  shift
  mkdir -p "$home"
  [ "$(id -u)" = 0 ] && [ $# -gt 0 ] && chown 65534:65534 "$home"
  env HOME="$home" XDG_CACHE_HOME="$home/cache" "$@" ./consumer.test -test.v -test.count=1 \
    -test.timeout=10m 2>&1 | tee "$home.log"
  grep -q -- '--- PASS: TestTheReleaseRunsAClusterOfItsOwn' "$home.log"
  grep -q -- '--- PASS: TestFilesAndLogsWithTheReleasesExecutables' "$home.log"
  local copied=("$home"/cache/openshell/sdk-go/*/*/)
  for exe in openshell-gateway openshell-supervisor openshell-sandbox-init; do
    if [ ! -x "${copied[0]}$exe" ]; then
      echo "check-go-consumer: $exe was not copied, executable, under $home/cache" >&2
      exit 1
    fi
  done
  echo "check-go-consumer: openshelltest ran the release's executables (copied to ${copied[0]}) in $((SECONDS - began)) s"
  for _ in $(seq 100); do
    [ -z "$(running_from "$home/cache")" ] && break
    sleep 0.1
  done
  if [ -n "$(running_from "$home/cache")" ]; then
    echo "check-go-consumer: processes still run from $home/cache: $(running_from "$home/cache" | tr '\n' ' ')" >&2
    exit 1
  fi
  echo "check-go-consumer: no process runs from the copied executables' directory"
}

echo "check-go-consumer: openshelltest.Start(t) as $(id -un)"
run_test "$tmp/home"
if [ "$(id -u)" = 0 ]; then
  echo "check-go-consumer: the same as uid 65534"
  chmod 755 "$tmp"  # the module cache and the test binary, readable by that user
  run_test "$tmp/nobody" setpriv --reuid=65534 --regid=65534 --clear-groups
fi
echo "check-go-consumer: ok"
