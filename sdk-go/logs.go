package openshell

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"example.invalid/openshell/sdk-go/internal/native"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// LogLine is one line the gateway recorded about a sandbox: its own, or
// its supervisor's (for example "exec finished", with an exit_code field).
type LogLine struct {
	// Time is when it was written (the writer's clock; zero when unknown).
	Time time.Time
	// Level is TRACE, DEBUG, INFO, WARN or ERROR.
	Level string
	// Source is "gateway" or "sandbox" (its supervisor).
	Source string
	// Target is what wrote it (a module path).
	Target string
	// Message is the line itself.
	Message string
	// Fields are its structured fields.
	Fields map[string]string
}

// String is `2026-12-04T05:01:02.345Z INFO  sandbox exec finished exit_code=0`
// (the CLI's format; fields sorted by key).
func (l LogLine) String() string {
	var b strings.Builder
	when := "-"
	if !l.Time.IsZero() {
		when = l.Time.UTC().Format("2006-01-02T15:04:05.000Z")
	}
	fmt.Fprintf(&b, "%s %-5s %-7s %s", when, l.Level, l.Source, l.Message)
	for _, k := range slices.Sorted(maps.Keys(l.Fields)) {
		fmt.Fprintf(&b, " %s=%s", k, l.Fields[k])
	}
	return b.String()
}

func logLineOf(p *openshellv1.SandboxLogLine) LogLine {
	l := LogLine{
		Level:   p.GetLevel(),
		Source:  p.GetSource(),
		Target:  p.GetTarget(),
		Message: p.GetMessage(),
		Fields:  maps.Clone(p.GetFields()),
	}
	if l.Source == "" {
		l.Source = "gateway"
	}
	if t := p.GetEventTime(); t != nil {
		l.Time = t.AsTime()
	}
	return l
}

// LogQuery selects lines; the zero value is every line (the newest 2000).
type LogQuery struct {
	// Tail keeps only the newest Tail lines of those that match (0: no cap).
	// A watch replays its Tail lines first (200 when 0) unless it resumes.
	Tail int
	// Since keeps lines written at or after it (zero: no bound).
	Since time.Time
	// Sources keeps lines of these sources ("gateway", "sandbox"); all when empty.
	Sources []string
	// MinLevel keeps lines at this level or above (TRACE, DEBUG, INFO,
	// WARN, ERROR); an unknown level is ErrInvalidArgument.
	MinLevel string
}

func (q LogQuery) check() error {
	if q.Tail < 0 || int64(q.Tail) > int64(^uint32(0)) {
		return invalid("log tail must be between 0 and %d", ^uint32(0))
	}
	if !q.Since.IsZero() && q.Since.Before(time.Unix(0, 0)) {
		return invalid("log since must not be before 1970")
	}
	return nil
}

// Logs is what Sandboxes.Logs returns.
type Logs struct {
	// Lines are oldest first.
	Lines []LogLine
	// BufferTotal is how many lines the gateway holds for the sandbox
	// (before the query's filters).
	BufferTotal int
}

// Logs reads the sandbox's recorded log lines, oldest first.
func (s *Sandboxes) Logs(ctx context.Context, name string, q LogQuery) (*Logs, error) {
	if err := q.check(); err != nil {
		return nil, err
	}
	req := &openshellv1.GetSandboxLogsRequest{
		Sandbox:  name,
		Lines:    uint32(q.Tail),
		Sources:  q.Sources,
		MinLevel: q.MinLevel,
	}
	if !q.Since.IsZero() {
		req.SinceMs = max(q.Since.UnixMilli(), 1)
	}
	resp := new(openshellv1.GetSandboxLogsResponse)
	if err := s.c.unary(ctx, native.OpLogs, req, resp, 0); err != nil {
		return nil, err
	}
	out := &Logs{Lines: make([]LogLine, 0, len(resp.GetLogs())), BufferTotal: int(resp.GetBufferTotal())}
	for _, l := range resp.GetLogs() {
		out.Lines = append(out.Lines, logLineOf(l))
	}
	return out, nil
}

// WatchOptions say what Sandboxes.Events follows. As in the other SDKs,
// status is followed unless NoStatus is set, and log lines only when Logs
// is: the zero value follows status, WatchOptions{Logs: &q} follows status
// and logs, and WatchOptions{NoStatus: true, Logs: &q} logs only. NoStatus
// without Logs follows nothing: ErrInvalidConfig, before any I/O.
type WatchOptions struct {
	// NoStatus leaves out status changes; followed (the default), the
	// status is the current snapshot first (unless resuming), then every
	// change. Without ResumeAfter the watch starts with the current
	// snapshot even with NoStatus.
	NoStatus bool
	// Logs, when set, follows log lines matching it.
	Logs *LogQuery
	// ResumeAfter starts after this cursor (an Event's): no snapshot first,
	// exactly the events that came later (after a replayed line's cursor,
	// the rest of that replay first; set Logs as the watch had it).
	// ErrOutOfRange when the gateway no longer holds them.
	ResumeAfter string
	// StopOnTerminal ends the watch once the sandbox is READY, COMPLETED,
	// STOPPED or in ERROR.
	StopOnTerminal bool
}

// Event is one event of a watch: a status snapshot (Sandbox) or a log
// line (Log), never both.
type Event struct {
	// Sandbox is set for a status event.
	Sandbox *Sandbox
	// Log is set for a log line.
	Log *LogLine
	// Cursor names the event: WatchOptions.ResumeAfter it to get what followed.
	Cursor string
}

// EventWatch follows one sandbox. The core reopens the stream by itself
// after the last cursor when it breaks (a replica died, a connection
// dropped), on whichever replica answers, so nothing is lost or repeated;
// it gives up after several failed attempts in a row. Close it when done.
type EventWatch struct {
	s      *stream
	mu     sync.Mutex
	cursor string
}

// Events follows a sandbox: see WatchOptions and EventWatch. The watch
// stays bound to ctx: cancelling it ends the watch. A watch that follows
// logs goes to the sandbox's owner (where lines arrive first), like exec.
func (s *Sandboxes) Events(ctx context.Context, name string, opts WatchOptions) (*EventWatch, error) {
	if opts.NoStatus && opts.Logs == nil {
		return nil, invalid("a watch follows status, logs or both: NoStatus needs Logs")
	}
	req := &openshellv1.WatchSandboxRequest{
		Sandbox:           name,
		FollowStatus:      !opts.NoStatus,
		StopOnTerminal:    opts.StopOnTerminal,
		ResumeAfterCursor: opts.ResumeAfter,
	}
	if q := opts.Logs; q != nil {
		if err := q.check(); err != nil {
			return nil, err
		}
		req.FollowLogs = true
		req.LogTailLines = uint32(q.Tail)
		req.LogSources = q.Sources
		req.LogMinLevel = q.MinLevel
		if !q.Since.IsZero() {
			req.SinceTime = timestamppb.New(q.Since)
		}
	}
	st, err := s.c.open(ctx, native.StreamEvents, req, 0)
	if err != nil {
		return nil, err
	}
	return &EventWatch{s: st, cursor: opts.ResumeAfter}, nil
}

// Next returns the next event; io.EOF once the watch ended (StopOnTerminal,
// or nothing left to follow). If ctx ends first the watch is closed and
// the context's error returned: resume with Cursor.
func (w *EventWatch) Next(ctx context.Context) (Event, error) {
	if err := ctx.Err(); err != nil {
		w.Close()
		return Event{}, contextError(err)
	}
	stop := context.AfterFunc(ctx, w.s.n.Cancel)
	b, err := w.s.recv()
	if !stop() && ctx.Err() != nil {
		w.Close()
		return Event{}, contextError(ctx.Err())
	}
	if err != nil {
		return Event{}, err
	}
	p := new(openshellv1.SandboxStreamEvent)
	if err := proto.Unmarshal(b, p); err != nil {
		return Event{}, &Error{Code: "protocol", GRPCStatus: 13, Message: "decoding a watch event: " + err.Error()}
	}
	ev := Event{Cursor: p.GetCursor()}
	switch x := p.GetPayload().(type) {
	case *openshellv1.SandboxStreamEvent_Sandbox:
		ev.Sandbox = sandboxOf(x.Sandbox)
	case *openshellv1.SandboxStreamEvent_Log:
		line := logLineOf(x.Log)
		ev.Log = &line
	default:
		return Event{}, &Error{Code: "protocol", GRPCStatus: 13, Message: "a watch event without a payload"}
	}
	if ev.Cursor != "" {
		w.mu.Lock()
		w.cursor = ev.Cursor
		w.mu.Unlock()
	}
	return ev, nil
}

// All ranges over the events until the watch ends; an error (one matching
// ErrOutOfRange, ErrNotFound once the sandbox was deleted, ...) is the
// last pair. Breaking out of the loop leaves the watch open.
func (w *EventWatch) All(ctx context.Context) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		for {
			ev, err := w.Next(ctx)
			if isEOF(err) {
				return
			}
			if !yield(ev, err) || err != nil {
				return
			}
		}
	}
}

// Cursor is the cursor of the last event returned (or ResumeAfter before
// the first): a new watch resuming after it continues where this one
// stopped.
func (w *EventWatch) Cursor() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cursor
}

// Resumes counts the times the watch reopened its stream after a broken
// one, as of the last event it returned.
func (w *EventWatch) Resumes() int { return int(w.s.n.Resumes()) }

// Close ends the watch. Idempotent.
func (w *EventWatch) Close() error { w.s.close(); return nil }
