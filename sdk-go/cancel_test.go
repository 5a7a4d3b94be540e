package openshell_test

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
)

// Cancelling a context reaches the sandbox: the gateway kills the process
// group of a cancelled command.
func TestCancelMidExecKillsTheProcess(t *testing.T) {
	c := newClient(t)
	name := readySandbox(t, c, "go-cancel", nil)
	marker := unique("cancel")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, openshell.ExecRequest{Sandbox: name, Command: []string{"sleep", "300"}, Environment: map[string]string{"TEST_MARKER": marker}})
		done <- err
	}()
	until(t, "the command runs", 20*time.Second, func() bool { return len(markedPids(marker)) > 0 })
	cancel()
	select {
	case err := <-done:
		var e *openshell.Error
		if !errors.Is(err, context.Canceled) || !errors.As(err, &e) || e.Code != "cancelled" || e.GRPCStatus != 1 {
			t.Fatalf("exec after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Exec did not return within 10 s of the cancel")
	}
	until(t, "the command is killed", 20*time.Second, func() bool { return len(markedPids(marker)) == 0 })
}

func TestCancelExecStreamAndClose(t *testing.T) {
	c := newClient(t)
	name := readySandbox(t, c, "go-cancel-s", nil)

	// Cancelling the context of a stream ends Recv with cancelled and kills the process.
	marker := unique("stream")
	ctx, cancel := context.WithCancel(testContext(t, 60*time.Second))
	s, err := c.ExecStream(ctx, openshell.ExecRequest{Sandbox: name, Command: []string{"sh", "-c", "echo started; exec sleep 300"}, Environment: map[string]string{"TEST_MARKER": marker}})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := s.Recv(); err != nil || string(ev.Stdout) != "started\n" {
		t.Fatalf("first event %+v %v", ev, err)
	}
	cancel()
	if _, err := s.Recv(); !errors.Is(err, context.Canceled) || ctx.Err() != context.Canceled {
		t.Fatalf("recv after cancel: %v (context: %v)", err, ctx.Err())
	}
	s.Close()
	until(t, "the streamed command is killed", 20*time.Second, func() bool { return len(markedPids(marker)) == 0 })

	// Breaking out of the range and closing kills the process too.
	marker2 := unique("break")
	s2, err := c.ExecStream(testContext(t, 60*time.Second), openshell.ExecRequest{Sandbox: name, Command: []string{"sh", "-c", "echo started; exec sleep 300"}, Environment: map[string]string{"TEST_MARKER": marker2}})
	if err != nil {
		t.Fatal(err)
	}
	for range s2.All() {
		break
	}
	until(t, "the command runs", 20*time.Second, func() bool { return len(markedPids(marker2)) > 0 })
	s2.Close()
	until(t, "the closed command is killed", 20*time.Second, func() bool { return len(markedPids(marker2)) == 0 })
}

func TestDeadlineAndCancelledContext(t *testing.T) {
	c := newClient(t)
	name := readySandbox(t, c, "go-deadline", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Exec(ctx, openshell.ExecRequest{Sandbox: name, Command: []string{"sleep", "30"}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("exec past the deadline: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the deadline took %v", took)
	}
	done, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, err := c.Sandboxes().Get(done, name); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled context: %v", err)
	}
}

func TestCloseCancelsCallsAndLaterCalls(t *testing.T) {
	c, err := openshell.Dial(context.Background(), clusterEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	helper := newClient(t)
	name := readySandbox(t, helper, "go-close", nil)
	marker := unique("close")
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), openshell.ExecRequest{Sandbox: name, Command: []string{"sleep", "300"}, Environment: map[string]string{"TEST_MARKER": marker}})
		done <- err
	}()
	until(t, "the command runs", 20*time.Second, func() bool { return len(markedPids(marker)) > 0 })
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, openshell.ErrClosed) {
			t.Fatalf("exec in flight during Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the call")
	}
	if _, err := c.Sandboxes().Get(context.Background(), name); !errors.Is(err, openshell.ErrClosed) {
		t.Fatalf("call after Close: %v", err)
	}
	c.Close() // idempotent
	until(t, "the command is killed", 20*time.Second, func() bool { return len(markedPids(marker)) == 0 })
}

// Close ends a unary call that is stuck on a peer that never answers: Close
// must not wait for calls in flight, it cancels them.
func TestCloseEndsAStuckUnaryCall(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	var held []net.Conn
	go func() {
		for {
			conn, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, conn)
		}
	}()
	c, err := openshell.Dial(context.Background(), "http://"+silent.Addr().String(), openshell.WithDefaultTimeout(0))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Health(context.Background())
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case err := <-done:
		if !errors.Is(err, openshell.ErrClosed) {
			t.Fatalf("the stuck call ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the stuck unary call")
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
}

// A stream dropped without Close is freed by its cleanup once collected,
// which resets the RPC: the gateway kills the process.
func TestDroppedStreamIsCleanedUp(t *testing.T) {
	c := newClient(t)
	name := readySandbox(t, c, "go-drop", nil)
	marker := unique("drop")
	func() {
		s, err := c.ExecStream(testContext(t, 60*time.Second), openshell.ExecRequest{Sandbox: name, Command: []string{"sh", "-c", "echo started; exec sleep 300"}, Environment: map[string]string{"TEST_MARKER": marker}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
	}()
	until(t, "the command runs", 20*time.Second, func() bool { return len(markedPids(marker)) > 0 })
	until(t, "the dropped stream's process is killed", 30*time.Second, func() bool {
		runtime.GC()
		return len(markedPids(marker)) == 0
	})
}

// trackedContext never ends and counts the context.AfterFunc registrations
// made on it and how many were stopped (context.AfterFunc uses the
// AfterFunc method of a parent that has one).
type trackedContext struct {
	context.Context
	done                chan struct{}
	registered, stopped atomic.Int64
}

func newTrackedContext() *trackedContext {
	return &trackedContext{Context: context.Background(), done: make(chan struct{})}
}

func (c *trackedContext) Done() <-chan struct{} { return c.done }

func (c *trackedContext) AfterFunc(func()) func() bool {
	c.registered.Add(1)
	var once sync.Once
	return func() bool {
		first := false
		once.Do(func() { first = true; c.stopped.Add(1) })
		return first
	}
}

// A stream or forward dropped without Close releases its call as Close
// does: the context.AfterFunc bound to the call's context is stopped (and
// the native cancel token freed with it).
func TestDroppedHandlesReleaseTheirContext(t *testing.T) {
	c := newClient(t)
	name := readySandbox(t, c, "go-drop-rel", nil)
	marker := unique("droprel")
	ctx := newTrackedContext()
	func() {
		s, err := c.ExecStream(ctx, openshell.ExecRequest{Sandbox: name, Command: []string{"sh", "-c", "echo started; exec sleep 300"}, Environment: map[string]string{"TEST_MARKER": marker}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Forward(ctx, name, 9); err != nil {
			t.Fatal(err)
		}
	}()
	if n := ctx.registered.Load(); n != 2 {
		t.Fatalf("%d AfterFunc registrations for a stream and a forward, want 2", n)
	}
	until(t, "the dropped handles stop their AfterFuncs", 30*time.Second, func() bool {
		runtime.GC()
		return ctx.stopped.Load() == 2
	})
	until(t, "the dropped stream's process is killed", 30*time.Second, func() bool { return len(markedPids(marker)) == 0 })
}

// RawStream.Send honours its context: an ended context sends nothing, and
// one that ends while Send waits on a full send queue ends the Send.
func TestRawSendHonoursItsContext(t *testing.T) {
	// A peer that accepts and never answers: the stream's first message
	// waits for a connection, and the send queue fills up behind it.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			conn, err := silent.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, conn)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, conn := range held {
			conn.Close()
		}
	}()
	c, err := openshell.Dial(context.Background(), "http://"+silent.Addr().String(), openshell.WithConnectTimeout(5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Raw().ForwardTcp(testContext(t, 60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// 64 KiB frames: the connection's flow-control window and the send
	// queue fill after a few dozen.
	frame := &openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Data{Data: make([]byte, 64*1024)}}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Send(cancelled, frame); !errors.Is(err, context.Canceled) {
		t.Fatalf("send with a cancelled context: %v", err)
	}
	ctx, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	done := make(chan error, 1)
	go func() {
		// Bounded: the window and the queue hold far fewer than 500 frames.
		for range 500 {
			if err := s.Send(ctx, frame); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a send past its deadline: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a blocked Send did not end with its context's deadline")
	}
}
