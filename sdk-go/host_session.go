package openshell

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"example.invalid/openshell/sdk-go/internal/native"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
	"example.invalid/openshell/sdk-go/proto/sandboxv1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// HostApplyFunc applies one assigned sandbox's configuration; an error
// rejects it (its message goes to the gateway as the reason: it must not
// hold secret values). Called one at a time per sandbox (calls for
// different sandboxes may run at once), only for a configuration that
// differs from that sandbox's last applied one. The snapshot's Mode is
// empty: a host session does not report how each snapshot arrived.
type HostApplyFunc func(ctx context.Context, sandboxID string, snapshot *ConfigSnapshot) error

// HostSessionOptions tune a HostSession.
type HostSessionOptions struct {
	// Capacity is the most sandboxes this host serves at once (0: no limit).
	Capacity uint32
	// NoPush leaves push support out of the sandbox sessions' hellos: their
	// configuration is polled.
	NoPush bool
	// InstanceID identifies this host instance (generated when empty).
	InstanceID string
	// CA, TLSServerName, ConnectTimeout, AllowCleartextToken: as for Dial.
	CAPEM               []byte
	TLSServerName       string
	ConnectTimeout      time.Duration
	AllowCleartextToken bool
}

// HostSessionStats are a host session's counters.
type HostSessionStats struct {
	// SessionsAccepted counts host sessions the gateway accepted.
	SessionsAccepted uint64
	// Redirects counts redirects followed (each at once, with stay).
	Redirects uint64
	// StickyRedials counts redials of the replica that held a lost session.
	StickyRedials uint64
	// Fallbacks counts falls back to the shared address.
	Fallbacks uint64
	// Stay is whether the last hello carried stay.
	Stay bool
	// SessionID is the current session's id ("" while none is accepted).
	SessionID string
	// ServedBy is the replica holding the current session.
	ServedBy string
	// Assigned is the number of sandboxes in the last assignment.
	Assigned int
}

// HostSession is a shared supervisor host's session: one ConnectHost
// stream (hello with the host's member id, placement redirects followed at
// once, sticky redials, fallbacks to the shared address) that carries the
// session of every sandbox the gateway assigns to the host, and applies
// each one's configuration through one HostApplyFunc. The protocol is the
// core's, as in every SDK.
type HostSession struct {
	n        *native.HostSession
	memberID string
	ctx      context.Context
	cancel   context.CancelFunc
	apply    *applyContext
	once     sync.Once
	cleanup  runtime.Cleanup
	// running is held by a Run from its start to its return.
	running atomic.Bool
}

// NewHostSession builds the session of host memberID (the id its host
// token was issued for), authenticated with that host token, against the
// gateway's shared address (the edge of a cluster). Nothing connects
// before Run.
func NewHostSession(endpoint, memberID, hostToken string, apply HostApplyFunc, opts HostSessionOptions) (*HostSession, error) {
	if apply == nil {
		return nil, invalid("an apply function is required")
	}
	ctx, cancel := context.WithCancel(context.Background())
	applyCtx := &applyContext{closed: ctx}
	applyBytes := func(sandboxID string, b []byte) string {
		snap, ok := decodeSnapshot(b, "")
		if !ok {
			return "the snapshot did not decode"
		}
		if err := apply(applyCtx.get(), sandboxID, snap); err != nil {
			reason := err.Error()
			if reason == "" {
				reason = "rejected"
			}
			return reason
		}
		return ""
	}
	n, nerr := native.NewHostSession(native.Options{
		Endpoint: endpoint, Token: hostToken, CAPEM: opts.CAPEM, TLSServerName: opts.TLSServerName,
		ConnectTimeout: opts.ConnectTimeout, AllowCleartextToken: opts.AllowCleartextToken,
	}, memberID, native.HostOptions{Capacity: opts.Capacity, ConfigPush: !opts.NoPush, InstanceID: opts.InstanceID}, applyBytes)
	if nerr != nil {
		cancel()
		return nil, fromNative(nerr)
	}
	s := &HostSession{n: n, memberID: memberID, ctx: ctx, cancel: cancel, apply: applyCtx}
	// As for ConfigSession: a session dropped without Close is freed when
	// collected; Run keeps it reachable until it returns.
	s.cleanup = runtime.AddCleanup(s, func(n *native.HostSession) { n.Free() }, n)
	return s, nil
}

// decodeSnapshot reads the two length-delimited messages of a snapshot.
func decodeSnapshot(b []byte, mode DeliveryMode) (*ConfigSnapshot, bool) {
	snap := &ConfigSnapshot{
		SandboxConfig:       new(sandboxv1.GetSandboxConfigResponse),
		ProviderEnvironment: new(openshellv1.GetSandboxProviderEnvironmentResponse),
		Mode:                mode,
	}
	for _, m := range []proto.Message{snap.SandboxConfig, snap.ProviderEnvironment} {
		msg, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		if err := proto.Unmarshal(msg, m); err != nil {
			return nil, false
		}
	}
	return snap, true
}

// Run holds the host session and serves its sandboxes until ctx ends (then
// it returns nil) or Close. The HostApplyFunc's context ends with ctx too.
// An unusable endpoint returns its error. One Run at a time, as for
// ConfigSession.Run: a second one while one is under way returns at once an
// error matching ErrFailedPrecondition and changes nothing.
func (s *HostSession) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return alreadyRunning("host session")
	}
	defer s.running.Store(false)
	defer runtime.KeepAlive(s)
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	stopClose := context.AfterFunc(s.ctx, cancelRun)
	defer stopClose()
	s.apply.run.Store(&runCtx)
	defer s.apply.run.Store(nil)
	tok := native.NewCancel()
	defer tok.Free()
	stop := context.AfterFunc(runCtx, tok.Cancel)
	defer stop()
	comp := s.n.Run(tok)
	if comp.Status == native.StatusError {
		return errorIn(ctx, comp.Err)
	}
	return nil
}

// Stats reads the session's counters.
func (s *HostSession) Stats() HostSessionStats {
	st := s.n.Stats()
	return HostSessionStats{
		SessionsAccepted: st.SessionsAccepted, Redirects: st.Redirects, StickyRedials: st.StickyRedials,
		Fallbacks: st.Fallbacks, Stay: st.Stay, SessionID: st.SessionID, ServedBy: st.ServedBy,
		Assigned: int(st.Assigned),
	}
}

// MemberID is the host's member id.
func (s *HostSession) MemberID() string { return s.memberID }

// InstanceID is the instance id every hello carries ("" once closed).
func (s *HostSession) InstanceID() string { return s.n.Stats().InstanceID }

// String names the host, never its token.
func (s *HostSession) String() string {
	return fmt.Sprintf("HostSession(member=%q, instance=%q)", s.memberID, s.InstanceID())
}

// Close stops a running Run and releases the session. Idempotent.
func (s *HostSession) Close() error {
	s.once.Do(func() {
		s.cleanup.Stop()
		s.cancel()
		// The running task holds its own reference to the core session.
		s.n.Free()
	})
	return nil
}
