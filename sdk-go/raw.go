package openshell

import (
	"context"

	"google.golang.org/protobuf/proto"
)

// Raw calls any RPC of the gateway with its proto messages, through the
// core (owner routing, tokens, deadlines and cancellation apply as for the
// curated calls). Its methods are generated, one per RPC
// (raw_generated.go).
type Raw struct{ c *Client }

// Raw returns the raw API.
func (c *Client) Raw() *Raw { return &Raw{c: c} }

// CallOption tunes one raw call.
type CallOption func(*callSettings)

type callSettings struct {
	metadata []string
	servedBy *string
	header   *[][2]string
}

// WithMetadata adds a request metadata pair.
func WithMetadata(key, value string) CallOption {
	return func(s *callSettings) { s.metadata = append(s.metadata, key, value) }
}

// ServedBy stores the replica that answered a unary call in *dst.
func ServedBy(dst *string) CallOption {
	return func(s *callSettings) { s.servedBy = dst }
}

// Header stores the response metadata of a unary call in *dst (key,
// value pairs in the order received).
func Header(dst *[][2]string) CallOption {
	return func(s *callSettings) { s.header = dst }
}

func settingsOf(opts []CallOption) callSettings {
	var s callSettings
	for _, o := range opts {
		o(&s)
	}
	return s
}

func (r *Raw) unary(ctx context.Context, path string, req, resp proto.Message, opts []CallOption) error {
	if err := ctx.Err(); err != nil {
		return contextError(err)
	}
	s := settingsOf(opts)
	body, err := proto.Marshal(req)
	if err != nil {
		return invalid("encoding the request: %v", err)
	}
	o, release := callOpts(ctx, 0)
	comp := r.c.n.RawUnaryAny(path, body, s.metadata, true, o)
	release()
	if err := r.c.done(ctx, comp); err != nil {
		return err
	}
	if s.servedBy != nil {
		*s.servedBy = comp.ServedBy
	}
	if s.header != nil {
		*s.header = comp.Metadata()
	}
	if err := proto.Unmarshal(comp.Value, resp); err != nil {
		return &Error{Code: "protocol", GRPCStatus: 13, Message: "decoding the response: " + err.Error()}
	}
	return nil
}

// Invoke calls the unary method at path (for example
// "/openshell.v1.OpenShell/GetSandbox") with req and decodes the answer
// into resp. The generated methods of Raw are typed wrappers of it.
func (r *Raw) Invoke(ctx context.Context, path string, req, resp proto.Message, opts ...CallOption) error {
	return r.unary(ctx, path, req, resp, opts)
}

// NewStream opens a stream on the method at path; newResp makes an empty
// response message for Recv to decode into.
func (r *Raw) NewStream(ctx context.Context, path string, newResp func() proto.Message, opts ...CallOption) (*RawStream[proto.Message, proto.Message], error) {
	return openRawStream[proto.Message, proto.Message](ctx, r.c, path, newResp, opts)
}

// RawStream is a stream of any method: Send requests, Recv responses.
type RawStream[Req, Resp proto.Message] struct {
	s    *stream
	newT func() Resp
}

func openRawStream[Req, Resp proto.Message](ctx context.Context, c *Client, path string, newT func() Resp, opts []CallOption) (*RawStream[Req, Resp], error) {
	if err := ctx.Err(); err != nil {
		return nil, contextError(err)
	}
	s := settingsOf(opts)
	o, release := callOpts(ctx, 0)
	comp := c.n.RawStream(path, s.metadata, o)
	if err := c.done(ctx, comp); err != nil {
		release()
		return nil, err
	}
	return &RawStream[Req, Resp]{s: newStream(ctx, c, c.n.StreamOf(comp.Handle), release), newT: newT}, nil
}

// Send sends one request message; it waits while the stream's send queue
// is full. A ctx that has ended sends nothing; a ctx that ends while Send
// waits resets the stream (as ending the stream's own context does), and
// Send fails with an error matching context.Canceled or
// context.DeadlineExceeded.
func (r *RawStream[Req, Resp]) Send(ctx context.Context, m Req) error {
	if err := ctx.Err(); err != nil {
		return contextError(err)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return invalid("encoding the message: %v", err)
	}
	stop := context.AfterFunc(ctx, r.s.n.Cancel)
	defer stop()
	return r.s.sendIn(ctx, b)
}

// CloseSend ends the sending side.
func (r *RawStream[Req, Resp]) CloseSend() { r.s.n.CloseSend() }

// Recv returns the next response; io.EOF at the end.
func (r *RawStream[Req, Resp]) Recv() (Resp, error) {
	var zero Resp
	b, err := r.s.recv()
	if err != nil {
		return zero, err
	}
	m := r.newT()
	if err := proto.Unmarshal(b, m); err != nil {
		return zero, &Error{Code: "protocol", GRPCStatus: 13, Message: "decoding a message: " + err.Error()}
	}
	return m, nil
}

// Close cancels the stream. Idempotent.
func (r *RawStream[Req, Resp]) Close() error { r.s.close(); return nil }
