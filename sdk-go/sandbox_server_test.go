package openshell_test

// Forward targets live inside the sandbox: under namespace isolation a
// sandbox has a network of its own, so a forward to 127.0.0.1:PORT reaches
// the sandbox's PORT, never a listener of the test process.

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
)

// listeningWithin bounds how long a server in a sandbox may take to say
// it listens.
const listeningWithin = 20 * time.Second

// sandboxEchoScript is testkit/scripts/sandbox-echo.py, the echo server
// every language's tests run in their sandboxes.
func sandboxEchoScript(t *testing.T) string {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no source path to find testkit/scripts/sandbox-echo.py from")
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(self), "..", "testkit", "scripts", "sandbox-echo.py"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sandboxEcho starts sandbox-echo.py in sandbox on port (0: a free one)
// and returns the port it listens on; it stops with the test.
func sandboxEcho(t *testing.T, c *openshell.Client, sandbox string, port int) int {
	t.Helper()
	return sandboxServer(t, c, sandbox, sandboxEchoScript(t), strconv.Itoa(port))
}

// sandboxServer runs `python3 -c program args...` in sandbox through an
// exec stream, waits (bounded) for its first stdout line `listening PORT`
// and returns PORT. The stream, and so the process, ends with the test.
func sandboxServer(t *testing.T, c *openshell.Client, sandbox, program string, args ...string) int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := c.ExecStream(ctx, openshell.ExecRequest{Sandbox: sandbox, Command: append([]string{"python3", "-c", program}, args...)})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); s.Close() })
	// Cancelling the stream's context ends a Recv that waits too long.
	late := time.AfterFunc(listeningWithin, cancel)
	defer late.Stop()
	var stdout, stderr bytes.Buffer
	for {
		ev, err := s.Recv()
		if errors.Is(err, context.Canceled) {
			t.Fatalf("the server in %s did not listen within %v (stderr %q)", sandbox, listeningWithin, stderr.String())
		}
		if err != nil {
			t.Fatalf("the server in %s: %v (stderr %q)", sandbox, err, stderr.String())
		}
		if ev.Exited {
			t.Fatalf("the server in %s exited with %d before it listened (stderr %q)", sandbox, ev.ExitCode, stderr.String())
		}
		stdout.Write(ev.Stdout)
		stderr.Write(ev.Stderr)
		if line, _, ok := strings.Cut(stdout.String(), "\n"); ok {
			port, err := strconv.Atoi(strings.TrimPrefix(line, "listening "))
			if !strings.HasPrefix(line, "listening ") || err != nil {
				t.Fatalf("the server in %s said %q", sandbox, line)
			}
			return port
		}
	}
}
