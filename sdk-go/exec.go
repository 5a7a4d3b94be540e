package openshell

import (
	"context"
	"iter"
	"time"

	"example.invalid/openshell/sdk-go/internal/native"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ExecRequest runs Command (argv, no shell parsing) in Sandbox.
type ExecRequest struct {
	Sandbox     string
	Command     []string
	Workdir     string
	Environment map[string]string
	// Stdin is fed to the process (Exec and ExecStream).
	Stdin []byte
	// TTY runs the process under a pseudo-terminal of Cols x Rows.
	TTY        bool
	Cols, Rows uint32
	// Timeout is enforced by the gateway (exit code 124 when it expires).
	Timeout time.Duration
	// OutputLimit caps the output Exec collects; the client's when 0.
	OutputLimit int
}

func (r *ExecRequest) proto() (*openshellv1.ExecSandboxRequest, uint64, error) {
	if r.OutputLimit < 0 {
		return nil, 0, invalid("exec output limit must be positive")
	}
	if r.Timeout < 0 {
		return nil, 0, invalid("exec timeout must not be negative")
	}
	p := &openshellv1.ExecSandboxRequest{
		Sandbox:     r.Sandbox,
		Command:     r.Command,
		Workdir:     r.Workdir,
		Environment: r.Environment,
		Stdin:       r.Stdin,
		Tty:         r.TTY,
		Cols:        r.Cols,
		Rows:        r.Rows,
	}
	if r.Timeout > 0 {
		p.ExecutionTimeout = durationpb.New(r.Timeout)
	}
	return p, uint64(r.OutputLimit), nil
}

// ExecResult is the collected output of a command.
type ExecResult struct {
	Stdout   []byte
	Stderr   []byte
	ExitCode int32
}

// Success reports whether the command exited with 0.
func (r *ExecResult) Success() bool { return r.ExitCode == 0 }

// Exec runs a command to completion and returns its output (collected in
// the core under the output limit). Cancelling ctx kills the process.
func (c *Client) Exec(ctx context.Context, req ExecRequest) (*ExecResult, error) {
	p, limit, err := req.proto()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, contextError(err)
	}
	body, err := proto.Marshal(p)
	if err != nil {
		return nil, invalid("encoding the request: %v", err)
	}
	o, release := callOpts(ctx, limit)
	comp := c.n.Call(native.OpExec, body, o)
	release()
	if err := c.done(ctx, comp); err != nil {
		return nil, err
	}
	out := &ExecResult{}
	b := comp.Value
	for len(b) > 0 {
		msg, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, &Error{Code: "protocol", GRPCStatus: 13, Message: "decoding the exec output"}
		}
		b = b[n:]
		ev := new(openshellv1.ExecSandboxEvent)
		if err := proto.Unmarshal(msg, ev); err != nil {
			return nil, &Error{Code: "protocol", GRPCStatus: 13, Message: "decoding the exec output: " + err.Error()}
		}
		switch e := ev.GetPayload().(type) {
		case *openshellv1.ExecSandboxEvent_Stdout:
			out.Stdout = e.Stdout.GetData()
		case *openshellv1.ExecSandboxEvent_Stderr:
			out.Stderr = e.Stderr.GetData()
		case *openshellv1.ExecSandboxEvent_Exit:
			out.ExitCode = e.Exit.GetExitCode()
		}
	}
	return out, nil
}

// ExecEvent is one event of a running command: a chunk of Stdout or
// Stderr, or (last) the exit.
type ExecEvent struct {
	Stdout   []byte
	Stderr   []byte
	Exited   bool
	ExitCode int32
}

// ExecStream is a running command's events. Close it when done (or cancel
// the context it was started with): that kills the process if it still runs.
type ExecStream struct{ s *stream }

// ExecStream starts a command and streams its output.
func (c *Client) ExecStream(ctx context.Context, req ExecRequest) (*ExecStream, error) {
	p, limit, err := req.proto()
	if err != nil {
		return nil, err
	}
	s, err := c.open(ctx, native.StreamExec, p, limit)
	if err != nil {
		return nil, err
	}
	return &ExecStream{s: s}, nil
}

func recvEvent(s *stream) (*ExecEvent, error) {
	b, err := s.recv()
	if err != nil {
		return nil, err
	}
	ev := new(openshellv1.ExecSandboxEvent)
	if err := proto.Unmarshal(b, ev); err != nil {
		return nil, &Error{Code: "protocol", GRPCStatus: 13, Message: "decoding an exec event: " + err.Error()}
	}
	switch e := ev.GetPayload().(type) {
	case *openshellv1.ExecSandboxEvent_Stdout:
		return &ExecEvent{Stdout: e.Stdout.GetData()}, nil
	case *openshellv1.ExecSandboxEvent_Stderr:
		return &ExecEvent{Stderr: e.Stderr.GetData()}, nil
	case *openshellv1.ExecSandboxEvent_Exit:
		return &ExecEvent{Exited: true, ExitCode: e.Exit.GetExitCode()}, nil
	}
	return nil, &Error{Code: "protocol", GRPCStatus: 13, Message: "an exec event without a payload"}
}

func allEvents(s *stream) iter.Seq2[*ExecEvent, error] {
	return func(yield func(*ExecEvent, error) bool) {
		for {
			ev, err := recvEvent(s)
			if isEOF(err) {
				return
			}
			if !yield(ev, err) || err != nil || ev.Exited {
				return
			}
		}
	}
}

// Recv returns the next event; the exit is the last one, then io.EOF.
func (e *ExecStream) Recv() (*ExecEvent, error) { return recvEvent(e.s) }

// All ranges over the events up to and including the exit; an error ends
// the range as the last pair.
func (e *ExecStream) All() iter.Seq2[*ExecEvent, error] { return allEvents(e.s) }

// Close ends the stream (killing the process if it still runs). Idempotent.
func (e *ExecStream) Close() error { e.s.close(); return nil }

// Interactive is an interactive exec: write stdin, resize the terminal,
// receive events.
type Interactive struct{ s *stream }

// ExecInteractive starts an interactive command (set TTY for a terminal).
func (c *Client) ExecInteractive(ctx context.Context, req ExecRequest) (*Interactive, error) {
	p, limit, err := req.proto()
	if err != nil {
		return nil, err
	}
	s, err := c.open(ctx, native.StreamInteractive, p, limit)
	if err != nil {
		return nil, err
	}
	return &Interactive{s: s}, nil
}

// Write sends bytes to the process's stdin (it implements io.Writer).
func (i *Interactive) Write(b []byte) (int, error) {
	msg, _ := proto.Marshal(&openshellv1.ExecSandboxInput{Payload: &openshellv1.ExecSandboxInput_Stdin{Stdin: b}})
	if err := i.s.send(msg); err != nil {
		return 0, err
	}
	return len(b), nil
}

// Resize changes the terminal size.
func (i *Interactive) Resize(cols, rows uint32) error {
	msg, _ := proto.Marshal(&openshellv1.ExecSandboxInput{Payload: &openshellv1.ExecSandboxInput_Resize{
		Resize: &openshellv1.ExecSandboxWindowResize{Cols: cols, Rows: rows},
	}})
	return i.s.send(msg)
}

// CloseStdin sends end-of-file to the process.
func (i *Interactive) CloseStdin() error { i.s.n.CloseSend(); return nil }

// Recv returns the next event; the exit is the last one, then io.EOF.
func (i *Interactive) Recv() (*ExecEvent, error) { return recvEvent(i.s) }

// All ranges over the events up to and including the exit.
func (i *Interactive) All() iter.Seq2[*ExecEvent, error] { return allEvents(i.s) }

// Close ends the session (killing the process if it still runs). Idempotent.
func (i *Interactive) Close() error { i.s.close(); return nil }
