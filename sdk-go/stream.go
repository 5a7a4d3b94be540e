package openshell

import (
	"context"
	"errors"
	"io"
	"runtime"
	"sync"

	"example.invalid/openshell/sdk-go/internal/native"
	"google.golang.org/protobuf/proto"
)

// stream is a native stream with its cancellation, freed by close or by a
// cleanup when dropped.
type stream struct {
	ctx context.Context
	// owner keeps the client reachable while the stream is: collecting it
	// would close the client and so reset the stream.
	owner   *Client
	n       *native.Stream
	release func()
	cleanup runtime.Cleanup
	once    sync.Once
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }

// nativeResources are what a cleanup frees for a handle dropped without
// Close: the native handle and the call's release (which stops the
// context.AfterFunc and frees the native cancel token). They must not refer
// to the Go handle itself, or it would never be collected.
type nativeResources[N interface{ Free() }] struct {
	n       N
	release func()
}

func freeResources[N interface{ Free() }](r nativeResources[N]) {
	r.n.Free()
	r.release()
}

func newStream(ctx context.Context, owner *Client, h *native.Stream, release func()) *stream {
	s := &stream{ctx: ctx, owner: owner, n: h, release: release}
	s.cleanup = runtime.AddCleanup(s, freeResources[*native.Stream], nativeResources[*native.Stream]{h, release})
	return s
}

// open opens a curated stream. The stream stays bound to ctx: cancelling
// it resets the stream.
func (c *Client) open(ctx context.Context, kind uint32, req proto.Message, outputLimit uint64) (*stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, contextError(err)
	}
	body, err := proto.Marshal(req)
	if err != nil {
		return nil, invalid("encoding the request: %v", err)
	}
	o, release := callOpts(ctx, outputLimit)
	comp := c.n.Open(kind, body, o)
	if err := c.done(ctx, comp); err != nil {
		release()
		return nil, err
	}
	return newStream(ctx, c, c.n.StreamOf(comp.Handle), release), nil
}

// recv returns the next message, io.EOF at the end.
func (s *stream) recv() ([]byte, error) {
	// The cleanup must not free the stream while a call on it waits.
	defer runtime.KeepAlive(s)
	comp := s.n.Next()
	switch comp.Status {
	case native.StatusEnd:
		return nil, io.EOF
	case native.StatusError:
		return nil, errorIn(s.ctx, comp.Err)
	}
	return comp.Value, nil
}

func (s *stream) send(b []byte) error { return s.sendIn(s.ctx, b) }

// sendIn sends under ctx as well as the stream's own context: an error of
// a send that ctx cancelled reports ctx's end.
func (s *stream) sendIn(ctx context.Context, b []byte) error {
	defer runtime.KeepAlive(s)
	comp := s.n.Send(b)
	if comp.Status == native.StatusError {
		if ctx.Err() != nil {
			return errorIn(ctx, comp.Err)
		}
		return errorIn(s.ctx, comp.Err)
	}
	return nil
}

func (s *stream) close() {
	s.once.Do(func() {
		s.cleanup.Stop()
		s.n.Free()
		s.release()
	})
}
