package openshell_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
)

func newClient(t *testing.T, opts ...openshell.Option) *openshell.Client {
	t.Helper()
	c, err := openshell.Dial(context.Background(), clusterEndpoint, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readySandbox creates a READY sandbox, deleted when the test ends.
func readySandbox(t *testing.T, c *openshell.Client, prefix string, labels map[string]string) string {
	t.Helper()
	ctx := testContext(t, 90*time.Second)
	name := unique(prefix)
	if _, err := c.Sandboxes().Create(ctx, openshell.CreateSandbox{Name: name, Labels: labels}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = c.Sandboxes().Delete(ctx, name)
	})
	if _, err := c.Sandboxes().WaitReady(ctx, name); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestSandboxLifecycle(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t, 120*time.Second)
	label := unique("life")
	name := unique("go-life")
	created, err := c.Sandboxes().Create(ctx, openshell.CreateSandbox{
		Name: name, Labels: map[string]string{"suite": label}, Environment: map[string]string{"GREETING": "hi"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if created.Name != name || created.ID == "" {
		t.Fatalf("created %+v", created)
	}
	ready, err := c.Sandboxes().WaitReady(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if ready.Phase != openshell.PhaseReady || ready.Proto.GetMetadata().GetName() != name {
		t.Fatalf("ready: phase %s", ready.Phase)
	}
	got, err := c.Sandboxes().Get(ctx, name)
	if err != nil || got.ID != created.ID || got.Labels["suite"] != label {
		t.Fatalf("get: %+v %v", got, err)
	}
	list, err := c.Sandboxes().List(ctx, openshell.ListOptions{LabelSelector: "suite=" + label})
	if err != nil || len(list) != 1 || list[0].Name != name {
		t.Fatalf("list: %d %v", len(list), err)
	}
	out, err := c.Exec(ctx, openshell.ExecRequest{Sandbox: name, Command: []string{"sh", "-c", "echo $GREETING"}})
	if err != nil || string(out.Stdout) != "hi\n" || !out.Success() {
		t.Fatalf("exec: %+v %v", out, err)
	}
	outcome, err := c.Sandboxes().Delete(ctx, name)
	if err != nil || outcome == "" {
		t.Fatalf("delete: %q %v", outcome, err)
	}
	if err := c.Sandboxes().WaitDeleted(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sandboxes().Get(ctx, name); !errors.Is(err, openshell.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
}

func TestHealthAndRoutingStats(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t, 90*time.Second)
	h, err := c.Health(ctx)
	if err != nil || h.Status != "HEALTHY" || h.Version == "" {
		t.Fatalf("health %+v %v", h, err)
	}
	name := readySandbox(t, c, "go-route", nil)
	before := c.RoutingStats()
	for range 3 {
		if _, err := c.Exec(ctx, openshell.ExecRequest{Sandbox: name, Command: []string{"true"}}); err != nil {
			t.Fatal(err)
		}
	}
	after := c.RoutingStats()
	if after.Hinted+after.Unhinted < before.Hinted+before.Unhinted+3 {
		t.Fatalf("routing stats did not count the owner-routed execs: %+v -> %+v", before, after)
	}
	if after.Hinted == 0 || after.OwnerLookups+after.CacheHits == 0 {
		t.Fatalf("no hinted exec, or no owner lookup: %+v", after)
	}
}

func TestExecStdinEnvWorkdir(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t, 90*time.Second)
	name := readySandbox(t, c, "go-exec", nil)
	out, err := c.Exec(ctx, openshell.ExecRequest{
		Sandbox: name, Command: []string{"sh", "-c", "cat; echo \"$A\" >&2; exit 3"},
		Stdin: []byte("from stdin"), Environment: map[string]string{"A": "env-a"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if string(out.Stdout) != "from stdin" || string(out.Stderr) != "env-a\n" || out.ExitCode != 3 {
		t.Fatalf("exec: %q %q %d", out.Stdout, out.Stderr, out.ExitCode)
	}
	limited, err := c.Exec(ctx, openshell.ExecRequest{Sandbox: name, Command: []string{"head", "-c", "4096", "/dev/zero"}, OutputLimit: 100})
	if !errors.Is(err, openshell.ErrOutputLimit) {
		t.Fatalf("output limit: %v %v", limited, err)
	}
}

func TestExecStreamRecvAndRange(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t, 90*time.Second)
	name := readySandbox(t, c, "go-stream", nil)
	cmd := []string{"sh", "-c", "echo one; echo two >&2; echo three; exit 7"}

	s, err := c.ExecStream(ctx, openshell.ExecRequest{Sandbox: name, Command: cmd})
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	exits := 0
	for {
		ev, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		stdout.Write(ev.Stdout)
		stderr.Write(ev.Stderr)
		if ev.Exited {
			exits++
			if ev.ExitCode != 7 {
				t.Fatalf("exit %d", ev.ExitCode)
			}
		}
	}
	s.Close()
	if stdout.String() != "one\nthree\n" || stderr.String() != "two\n" || exits != 1 {
		t.Fatalf("recv: %q %q exits=%d", stdout.String(), stderr.String(), exits)
	}

	s2, err := c.ExecStream(ctx, openshell.ExecRequest{Sandbox: name, Command: cmd})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	var last *openshell.ExecEvent
	n := 0
	for ev, err := range s2.All() {
		if err != nil {
			t.Fatal(err)
		}
		last = ev
		n++
	}
	if last == nil || !last.Exited || last.ExitCode != 7 || n < 2 {
		t.Fatalf("range: %d events, last %+v", n, last)
	}
}

func TestExecInteractive(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t, 90*time.Second)
	name := readySandbox(t, c, "go-inter", nil)
	it, err := c.ExecInteractive(ctx, openshell.ExecRequest{Sandbox: name, Command: []string{"cat"}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	if _, err := io.WriteString(it, "hello "); err != nil {
		t.Fatal(err)
	}
	if _, err := it.Write([]byte("world")); err != nil {
		t.Fatal(err)
	}
	if err := it.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	code := int32(-1)
	for ev, err := range it.All() {
		if err != nil {
			t.Fatal(err)
		}
		out.Write(ev.Stdout)
		if ev.Exited {
			code = ev.ExitCode
		}
	}
	if out.String() != "hello world" || code != 0 {
		t.Fatalf("interactive: %q exit %d", out.String(), code)
	}

	tty, err := c.ExecInteractive(ctx, openshell.ExecRequest{Sandbox: name, Command: []string{"sh", "-c", "read x; stty size"}, TTY: true, Cols: 80, Rows: 24})
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	if err := tty.Resize(100, 40); err != nil {
		t.Fatal(err)
	}
	time.Sleep(0) // the resize is ordered before the line below on the stream
	if _, err := tty.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	var term bytes.Buffer
	for ev, err := range tty.All() {
		if err != nil {
			t.Fatal(err)
		}
		term.Write(ev.Stdout)
	}
	if !strings.Contains(term.String(), "40 100") {
		t.Fatalf("tty output %q does not show the resize", term.String())
	}
}

func TestForward(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t, 90*time.Second)
	name := readySandbox(t, c, "go-fwd", nil)
	// The target: an echo server on the sandbox's own loopback.
	port := sandboxEcho(t, c, name, 0)
	fwd, err := c.Forward(ctx, name, port)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(fwd.Addr(), "127.0.0.1:") {
		t.Fatalf("addr %q", fwd.Addr())
	}
	payload := make([]byte, 256*1024)
	_, _ = rand.Read(payload)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.DialTimeout("tcp", fwd.Addr(), 5*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
			go func() { _, _ = conn.Write(payload); conn.(*net.TCPConn).CloseWrite() }()
			got, err := io.ReadAll(conn)
			if err != nil || !bytes.Equal(got, payload) {
				t.Errorf("echo: %d bytes, %v", len(got), err)
			}
		}()
	}
	wg.Wait()
	until(t, "the forward's counters", 10*time.Second, func() bool {
		s := fwd.Stats()
		return s.ConnectionsAccepted == 3 && s.BytesIn == 3*uint64(len(payload)) && s.BytesOut == 3*uint64(len(payload)) && s.ConnectionsActive == 0
	})
	fwd.Close()
	fwd.Close() // idempotent
	until(t, "the listener refuses after Close", 10*time.Second, func() bool {
		conn, err := net.DialTimeout("tcp", fwd.Addr(), time.Second)
		if err == nil {
			conn.Close()
		}
		return err != nil
	})
	if _, err := c.Forward(ctx, name, 0); !errors.Is(err, openshell.ErrInvalidConfig) {
		t.Fatalf("port 0: %v", err)
	}
}

func TestWatch(t *testing.T) {
	c := newClient(t)
	name := readySandbox(t, c, "go-watch", nil)
	ctx := testContext(t, 30*time.Second)
	w, err := c.Sandboxes().Watch(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	first, err := w.Recv()
	if err != nil || first.Name != name || first.Phase != openshell.PhaseReady {
		t.Fatalf("first snapshot %+v %v", first, err)
	}
	if _, err := c.Sandboxes().Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	// After the delete the watch reports the change and then ends (with
	// io.EOF or not_found), well before the context's 30 s.
	var last error
	for s, err := range w.All() {
		if err != nil {
			last = err
			break
		}
		if s.Name != name {
			t.Fatalf("a snapshot of %q", s.Name)
		}
	}
	if last != nil && !errors.Is(last, openshell.ErrNotFound) {
		t.Fatalf("the watch ended with %v", last)
	}
	if ctx.Err() != nil {
		t.Fatal("the watch did not end after the delete")
	}
}

func TestRawStubs(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t, 90*time.Second)
	name := readySandbox(t, c, "go-raw", nil)
	var servedBy string
	resp, err := c.Raw().GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: name}, openshell.ServedBy(&servedBy))
	if err != nil || resp.GetSandbox().GetMetadata().GetName() != name {
		t.Fatalf("raw get: %v", err)
	}
	if servedBy == "" {
		t.Fatal("raw get: no served-by")
	}
	s, err := c.Raw().ExecSandbox(ctx, &openshellv1.ExecSandboxRequest{Sandbox: name, Command: []string{"echo", "raw"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out bytes.Buffer
	for {
		ev, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		out.Write(ev.GetStdout().GetData())
	}
	if out.String() != "raw\n" {
		t.Fatalf("raw exec %q", out.String())
	}
}
