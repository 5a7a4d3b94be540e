package openshell

import (
	"context"
	"runtime"
	"sync"

	"example.invalid/openshell/sdk-go/internal/native"
)

// ForwardStats are a forward's counters.
type ForwardStats struct {
	ConnectionsAccepted uint64
	ConnectionsActive   uint64
	ConnectionsFailed   uint64
	// BytesIn went from the sandbox to local clients.
	BytesIn uint64
	// BytesOut went from local clients to the sandbox.
	BytesOut uint64
}

// Forward is a local TCP listener whose connections are pumped (in the
// core) to a port of a sandbox's host. Close it when done.
type Forward struct {
	// owner keeps the client reachable while the forward is (collecting
	// it would close the client and so the forward).
	owner   *Client
	n       *native.Forward
	addr    string
	release func()
	cleanup runtime.Cleanup
	once    sync.Once
}

// ForwardOptions tune Forward.
type ForwardOptions struct {
	// LocalAddr is the listener's address; 127.0.0.1:0 (a free port) when empty.
	LocalAddr string
	// SSHSessionToken (SSHSession.Token), when set, goes with every
	// connection's stream: a client without a user token can then forward
	// to that token's sandbox, and to no other. The gateway checks it per
	// connection; a refused connection is closed and counted in
	// ForwardStats.ConnectionsFailed.
	SSHSessionToken string
}

// Forward listens locally and forwards each connection to remotePort of
// the sandbox. The forward stays bound to ctx: cancelling it closes the
// forward.
func (c *Client) Forward(ctx context.Context, sandbox string, remotePort int, opts ...ForwardOptions) (*Forward, error) {
	if remotePort < 1 || remotePort > 65535 {
		return nil, invalid("remote port must be between 1 and 65535")
	}
	if err := ctx.Err(); err != nil {
		return nil, contextError(err)
	}
	var options ForwardOptions
	for _, o := range opts {
		options = o
	}
	o, release := callOpts(ctx, 0)
	comp := c.n.Forward(sandbox, uint32(remotePort), options.SSHSessionToken, options.LocalAddr, o)
	if err := c.done(ctx, comp); err != nil {
		release()
		return nil, err
	}
	n := native.ForwardOf(comp.Handle)
	f := &Forward{owner: c, n: n, addr: n.Addr(), release: release}
	f.cleanup = runtime.AddCleanup(f, freeResources[*native.Forward], nativeResources[*native.Forward]{n, release})
	return f, nil
}

// Addr is the local listener's address (host:port).
func (f *Forward) Addr() string { return f.addr }

// Stats reads the counters.
func (f *Forward) Stats() ForwardStats {
	s := f.n.Stats()
	return ForwardStats{s.ConnectionsAccepted, s.ConnectionsActive, s.ConnectionsFailed, s.BytesIn, s.BytesOut}
}

// Close stops the listener and ends every connection. Idempotent.
func (f *Forward) Close() error {
	f.once.Do(func() {
		f.cleanup.Stop()
		f.n.Free()
		f.release()
	})
	return nil
}
