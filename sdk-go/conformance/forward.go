package main

// The forward op: a forward to a TCP echo server the runner starts inside
// the sandbox (testkit/scripts/sandbox-echo.py through an exec stream; the
// sandbox has a network of its own, so 127.0.0.1 is its loopback), exercised
// by concurrent half-closing connections. Ending the exec stream afterwards
// kills the server.

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	openshell "example.invalid/openshell/sdk-go"
)

// listeningWithin bounds how long the echo server may take to say it listens.
const listeningWithin = 20 * time.Second

// echoScript is the text of testkit/scripts/sandbox-echo.py, found from
// this source file (the runner is built in the repository).
func echoScript() (string, error) {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", fail("no source path to find testkit/scripts/sandbox-echo.py from")
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(self), "..", "..", "testkit", "scripts", "sandbox-echo.py"))
	if err != nil {
		return "", fail("the echo server's script: %v", err)
	}
	return string(b), nil
}

// startEcho runs the echo server in sandbox and returns the port of its
// `listening PORT` line; cancel ends it.
func startEcho(ctx context.Context, r *runner, sandbox string) (int, context.CancelFunc, error) {
	script, err := echoScript()
	if err != nil {
		return 0, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	s, err := r.client.ExecStream(ctx, openshell.ExecRequest{Sandbox: sandbox, Command: []string{"python3", "-c", script}})
	if err != nil {
		cancel()
		return 0, nil, err
	}
	stop := func() { cancel(); s.Close() }
	late := time.AfterFunc(listeningWithin, cancel) // ends a Recv that waits too long
	defer late.Stop()
	var stdout bytes.Buffer
	for {
		ev, err := s.Recv()
		switch {
		case err != nil && !late.Stop():
			stop()
			return 0, nil, fail("the echo server did not listen within %v", listeningWithin)
		case err != nil:
			stop()
			return 0, nil, err
		case ev.Exited:
			stop()
			return 0, nil, fail("the echo server exited with %d", ev.ExitCode)
		}
		stdout.Write(ev.Stdout)
		if line, _, ok := strings.Cut(stdout.String(), "\n"); ok {
			port, err := strconv.Atoi(strings.TrimPrefix(line, "listening "))
			if !strings.HasPrefix(line, "listening ") || err != nil {
				stop()
				return 0, nil, fail("the echo server said %q", line)
			}
			return port, stop, nil
		}
	}
}

func forwardOp(ctx context.Context, r *runner, s step) (result, error) {
	if port, ok := s["remote_port"]; ok {
		f, err := r.client.Forward(ctx, r.target(s), number(port))
		if err != nil {
			return nil, err
		}
		f.Close()
		return result{}, nil
	}
	sandbox := r.target(s)
	port, stopEcho, err := startEcho(ctx, r, sandbox)
	if err != nil {
		return nil, err
	}
	defer stopEcho()
	f, err := r.client.Forward(ctx, sandbox, port)
	if err != nil {
		return nil, err
	}
	size := number(s["bytes_per_connection"])
	n := number(s["connections"])
	echoed := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			payload := make([]byte, size)
			_, _ = rand.Read(payload)
			if size > 0 {
				payload[size-1] = byte(i % 256)
			}
			c, err := net.DialTimeout("tcp", f.Addr(), 10*time.Second)
			if err != nil {
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			go func() { _, _ = c.Write(payload); c.(*net.TCPConn).CloseWrite() }()
			got, err := io.ReadAll(c)
			echoed[i] = err == nil && bytes.Equal(got, payload)
		}()
	}
	wg.Wait()
	accepted := f.Stats().ConnectionsAccepted
	f.Close()
	refuses := false
	for range 100 { // the listener closes asynchronously: up to 5 s
		c, err := net.DialTimeout("tcp", f.Addr(), time.Second)
		if err != nil {
			refuses = true
			break
		}
		c.Close()
		time.Sleep(50 * time.Millisecond)
	}
	return result{"echoed": echoed, "accepted": accepted, "closed_refuses": refuses}, nil
}
