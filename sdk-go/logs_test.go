package openshell_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
	"example.invalid/openshell/sdk-go/openshelltest"
)

// exitWith runs `exit code` in the sandbox, so its "exec finished" line
// names this exec by its exit_code field.
func exitWith(ctx context.Context, c *openshell.Client, sandbox string, code int) error {
	out, err := c.Exec(ctx, openshell.ExecRequest{Sandbox: sandbox, Command: []string{"sh", "-c", "exit " + strconv.Itoa(code)}})
	if err != nil {
		return err
	}
	if int(out.ExitCode) != code {
		return errors.New("exit " + strconv.Itoa(int(out.ExitCode)))
	}
	return nil
}

func finishedCode(l *openshell.LogLine) (int, bool) {
	if l == nil || l.Message != "exec finished" {
		return 0, false
	}
	code, err := strconv.Atoi(l.Fields["exit_code"])
	return code, err == nil
}

func TestLogsOfAnExecAndTheirFilters(t *testing.T) {
	c := newClient(t)
	sandbox := readySandbox(t, c, "go-logs", nil)
	ctx := testContext(t, 2*time.Minute)
	before := time.Now().Add(-time.Second)
	if err := exitWith(ctx, c, sandbox, 7); err != nil {
		t.Fatal(err)
	}
	var line *openshell.LogLine
	until(t, "the exec's line", 30*time.Second, func() bool {
		logs, err := c.Sandboxes().Logs(ctx, sandbox, openshell.LogQuery{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range logs.Lines {
			if code, ok := finishedCode(&logs.Lines[i]); ok && code == 7 {
				line = &logs.Lines[i]
				return true
			}
		}
		return false
	})
	if line.Source != "sandbox" || line.Level != "INFO" || line.Time.Before(before) || line.Time.After(time.Now().Add(time.Minute)) {
		t.Fatalf("line %+v", line)
	}
	if s := line.String(); !strings.Contains(s, " INFO  sandbox exec finished") || !strings.Contains(s, "exit_code=7") {
		t.Fatalf("printed %q", s)
	}

	// Filters: by source, level, tail and time.
	gateway, err := c.Sandboxes().Logs(ctx, sandbox, openshell.LogQuery{Sources: []string{"gateway"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range gateway.Lines {
		if l.Source != "gateway" {
			t.Fatalf("a %s line among the gateway's", l.Source)
		}
	}
	if gateway.BufferTotal < len(gateway.Lines)+1 {
		t.Fatalf("buffer total %d with %d gateway lines and a sandbox one", gateway.BufferTotal, len(gateway.Lines))
	}
	errorsOnly, err := c.Sandboxes().Logs(ctx, sandbox, openshell.LogQuery{MinLevel: "ERROR"})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range errorsOnly.Lines {
		if l.Level != "ERROR" {
			t.Fatalf("a %s line at min level ERROR", l.Level)
		}
	}
	tail, err := c.Sandboxes().Logs(ctx, sandbox, openshell.LogQuery{Tail: 1, Sources: []string{"sandbox"}})
	if err != nil || len(tail.Lines) != 1 {
		t.Fatalf("tail 1: %+v, %v", tail, err)
	}
	future, err := c.Sandboxes().Logs(ctx, sandbox, openshell.LogQuery{Since: time.Now().Add(time.Hour)})
	if err != nil || len(future.Lines) != 0 {
		t.Fatalf("lines from the future: %+v, %v", future, err)
	}

	// Bad input.
	_, err = c.Sandboxes().Logs(ctx, sandbox, openshell.LogQuery{MinLevel: "LOUD"})
	requireCode(t, err, openshell.ErrInvalidArgument, "invalid_argument")
	_, err = c.Sandboxes().Logs(ctx, "no-such-sandbox", openshell.LogQuery{})
	requireCode(t, err, openshell.ErrNotFound, "not_found")
	_, err = c.Sandboxes().Logs(ctx, sandbox, openshell.LogQuery{Tail: -1})
	requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
}

func TestEventsStatusThenLogsAndCursors(t *testing.T) {
	c := newClient(t)
	sandbox := readySandbox(t, c, "go-events", nil)
	ctx := testContext(t, 2*time.Minute)

	// The zero options follow status: the current snapshot first.
	status, err := c.Sandboxes().Events(ctx, sandbox, openshell.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := status.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if first.Sandbox == nil || first.Sandbox.Name != sandbox || first.Log != nil || first.Cursor == "" || status.Cursor() != first.Cursor {
		t.Fatalf("first event %+v (cursor %q)", first, status.Cursor())
	}
	status.Close()
	status.Close() // idempotent

	// Resuming after that cursor: exactly what came later, the exec's line
	// among it, with no snapshot first.
	if err := exitWith(ctx, c, sandbox, 3); err != nil {
		t.Fatal(err)
	}
	// Logs set and NoStatus not: status and logs, as in the other SDKs.
	w, err := c.Sandboxes().Events(ctx, sandbox, openshell.WatchOptions{
		Logs: &openshell.LogQuery{Sources: []string{"sandbox"}}, ResumeAfter: first.Cursor,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var last string
	for ev, err := range w.All(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Cursor <= first.Cursor || ev.Cursor < last {
			t.Fatalf("cursor %q after %q (resumed after %q)", ev.Cursor, last, first.Cursor)
		}
		last = ev.Cursor
		if code, ok := finishedCode(ev.Log); ok && code == 3 {
			break
		}
	}
	if w.Cursor() != last {
		t.Fatalf("Cursor %q, last event's %q", w.Cursor(), last)
	}

	// A Next whose context ends closes the watch. An event that comes
	// within the window is returned instead (the watch stays open): wait
	// again until a Next reaches its deadline first.
	for attempt := 1; ; attempt++ {
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := w.Next(short)
		cancel()
		if err == nil {
			if attempt == 20 {
				t.Fatal("20 events in a row came within 300 ms each: no Next reached its deadline")
			}
			continue
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a Next past its deadline: %v", err)
		}
		break
	}
	if _, err := w.Next(ctx); !errors.Is(err, openshell.ErrClosed) && !errors.Is(err, io.EOF) {
		t.Fatalf("Next on a closed watch: %v", err)
	}

	// A cursor the gateway's event log does not reach (ahead of it):
	// out_of_range, its own sentinel.
	ahead := first.Cursor[:strings.IndexByte(first.Cursor, '.')+1] + "00000000099999999999"
	bad, err := c.Sandboxes().Events(ctx, sandbox, openshell.WatchOptions{ResumeAfter: ahead})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	_, err = bad.Next(ctx)
	requireCode(t, err, openshell.ErrOutOfRange, "out_of_range")
	garbage, err := c.Sandboxes().Events(ctx, sandbox, openshell.WatchOptions{ResumeAfter: "garbage"})
	if err != nil {
		t.Fatal(err)
	}
	defer garbage.Close()
	_, err = garbage.Next(ctx)
	requireCode(t, err, openshell.ErrInvalidArgument, "invalid_argument")
	// NoStatus without Logs follows nothing: refused before any I/O.
	_, err = c.Sandboxes().Events(ctx, sandbox, openshell.WatchOptions{NoStatus: true})
	requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")

	// A deleted sandbox ends a watch with not_found.
	gone, err := c.Sandboxes().Events(ctx, sandbox, openshell.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	if _, err := c.Sandboxes().Delete(ctx, sandbox); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := gone.Next(ctx)
		if err != nil {
			if !errors.Is(err, openshell.ErrNotFound) {
				t.Fatalf("the watch of a deleted sandbox ended with %v", err)
			}
			break
		}
		if ev.Sandbox == nil {
			t.Fatalf("a status watch gave %+v", ev)
		}
	}
}

// A log watch through the edge sees every exec's line exactly once while
// the sandbox's owner replica is killed mid-watch: the core resumes after
// its last cursor on another replica.
func TestEventsResumeAcrossAnOwnerKill(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	bin, err := gatewayBinary()
	if err != nil {
		t.Fatal(err)
	}
	cluster := openshelltest.Start(t, openshelltest.WithReplicas(3), openshelltest.WithGatewayBin(bin))
	c := cluster.Client()
	sandbox, err := c.Sandboxes().Create(ctx, openshell.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sandboxes().WaitReady(ctx, sandbox.Name); err != nil {
		t.Fatal(err)
	}
	w, err := c.Sandboxes().Events(ctx, sandbox.Name, openshell.WatchOptions{
		NoStatus: true, Logs: &openshell.LogQuery{Sources: []string{"sandbox"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	type result struct {
		ev  openshell.Event
		err error
	}
	events := make(chan result, 1024)
	go func() {
		for ev, err := range w.All(ctx) {
			events <- result{ev, err}
		}
		close(events)
	}()

	var completed []int
	run := func(from, to int) {
		for code := from; code <= to; code++ {
			if err := exitWith(ctx, c, sandbox.Name, code); err == nil {
				completed = append(completed, code)
			} else {
				t.Logf("exec %d failed (the owner's death may take one): %v", code, err)
			}
		}
	}
	run(1, 10)
	owner, err := cluster.OwnerOf(ctx, sandbox.Name)
	if err != nil || owner == "" {
		t.Fatalf("owner %q, %v", owner, err)
	}
	if err := cluster.KillReplica(ctx, owner); err != nil {
		t.Fatal(err)
	}
	run(11, 20)
	if err := cluster.StartReplica(ctx, owner); err != nil {
		t.Fatal(err)
	}
	run(21, 30)
	if len(completed) < 25 {
		t.Fatalf("too few execs completed: %v", completed)
	}

	seen := map[int]int{}
	var last string
	take := func(r result) {
		if r.err != nil {
			t.Fatalf("the watch ended: %v", r.err)
		}
		if r.ev.Cursor < last {
			t.Fatalf("cursor %q after %q", r.ev.Cursor, last)
		}
		last = r.ev.Cursor
		if code, ok := finishedCode(r.ev.Log); ok {
			seen[code]++
		}
	}
	allSeen := func() bool {
		for _, code := range completed {
			if seen[code] == 0 {
				return false
			}
		}
		return true
	}
	deadline := time.After(30 * time.Second)
	for !allSeen() {
		select {
		case r, ok := <-events:
			if !ok {
				t.Fatal("the watch ended quietly")
			}
			take(r)
		case <-deadline:
			t.Fatalf("lines missing after 30 s: completed %v, seen %v", completed, seen)
		}
	}
	// A little longer, so a line delivered twice would show.
	for quiet := time.After(time.Second); ; {
		select {
		case r, ok := <-events:
			if !ok {
				t.Fatal("the watch ended quietly")
			}
			take(r)
			continue
		case <-quiet:
		}
		break
	}
	for code, n := range seen {
		if n != 1 {
			t.Fatalf("exec %d's line seen %d times", code, n)
		}
	}
	if w.Resumes() < 1 {
		t.Fatal("the watch never resumed: the owner kill did not reach it")
	}
	t.Logf("log watch across a kill of %s: %d execs, each line once, %d resumes", owner, len(completed), w.Resumes())
}
