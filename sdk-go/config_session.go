package openshell

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"example.invalid/openshell/sdk-go/internal/native"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
	"example.invalid/openshell/sdk-go/proto/sandboxv1"
)

// DeliveryMode is how a configuration arrived.
type DeliveryMode string

// Delivery modes.
const (
	ModePush DeliveryMode = "push"
	ModePoll DeliveryMode = "poll"
)

func modeOf(m int) DeliveryMode {
	switch m {
	case native.ModePush:
		return ModePush
	case native.ModePoll:
		return ModePoll
	}
	return ""
}

// ConfigSnapshot is one full configuration of a sandbox.
type ConfigSnapshot struct {
	// SandboxConfig holds the policy, the effective settings and revisions.
	SandboxConfig *sandboxv1.GetSandboxConfigResponse
	// ProviderEnvironment's values are secrets: never log them.
	ProviderEnvironment *openshellv1.GetSandboxProviderEnvironmentResponse
	// Mode says whether it was pushed or polled ("" for a HostSession's
	// snapshots: the host session does not report it).
	Mode DeliveryMode
}

// Setting returns a string setting of the snapshot.
func (s *ConfigSnapshot) Setting(key string) (string, bool) {
	v, ok := s.SandboxConfig.GetSettings()[key]
	if !ok {
		return "", false
	}
	return v.GetValue().GetStringValue(), true
}

// ApplyFunc applies a configuration; an error rejects it (its message goes
// to the gateway as the reason: it must not hold secret values). Called
// one at a time, only for a configuration that differs from the last
// applied one.
type ApplyFunc func(ctx context.Context, snapshot *ConfigSnapshot) error

// ConfigSessionOptions tune a ConfigSession.
type ConfigSessionOptions struct {
	// PollInterval is the GetSandboxConfig interval while nothing is pushed
	// (10 s when 0; at least 100 ms).
	PollInterval time.Duration
	// NoPush leaves push support out of the hello: configuration is polled.
	NoPush bool
	// InstanceID identifies this supervisor instance (generated when empty).
	InstanceID string
	// CA, TLSServerName, ConnectTimeout, AllowCleartextToken: as for Dial.
	CAPEM               []byte
	TLSServerName       string
	ConnectTimeout      time.Duration
	AllowCleartextToken bool
}

// ConfigSessionStats are a session's counters.
type ConfigSessionStats struct {
	// Mode is how configuration arrives now ("" before anything arrived).
	Mode             DeliveryMode
	Applied          uint64
	Rejected         uint64
	Duplicates       uint64
	UpdatesReceived  uint64
	LastUpdateID     uint64
	ConfigRevision   uint64
	Polls            uint64
	SessionsAccepted uint64
	Redirects        uint64
	// ServedBy is the replica holding the session.
	ServedBy string
}

// ConfigSession is the supervisor side of a sandbox's session: it keeps
// the ConnectSupervisor session (hello, heartbeats, redirects, reconnects)
// and applies the sandbox's configuration, pushed when the gateway pushes,
// polled otherwise, through one ApplyFunc. The protocol is the core's, as
// in every SDK.
type ConfigSession struct {
	n       *native.ConfigSession
	ctx     context.Context
	cancel  context.CancelFunc
	apply   *applyContext
	once    sync.Once
	cleanup runtime.Cleanup
	// running is held by a Run from its start to its return.
	running atomic.Bool
}

// applyContext is the context ApplyFunc receives: the running Run's (which
// also ends on Close), else the session's. It is apart from ConfigSession
// because the native apply callback holds it: holding the session itself
// would keep it reachable for ever and defeat its cleanup.
type applyContext struct {
	closed context.Context
	run    atomic.Pointer[context.Context]
}

func (a *applyContext) get() context.Context {
	if ctx := a.run.Load(); ctx != nil {
		return *ctx
	}
	return a.closed
}

// NewConfigSession builds a session for the sandbox with id sandboxID,
// authenticated with the sandbox's own token. Nothing connects before Run.
func NewConfigSession(endpoint, sandboxID, sandboxToken string, apply ApplyFunc, opts ConfigSessionOptions) (*ConfigSession, error) {
	if apply == nil {
		return nil, invalid("an apply function is required")
	}
	if opts.PollInterval < 0 {
		return nil, invalid("poll interval must not be negative")
	}
	ctx, cancel := context.WithCancel(context.Background())
	applyCtx := &applyContext{closed: ctx}
	applyBytes := func(b []byte, mode int) string {
		snap, ok := decodeSnapshot(b, modeOf(mode))
		if !ok {
			return "the snapshot did not decode"
		}
		if err := apply(applyCtx.get(), snap); err != nil {
			reason := err.Error()
			if reason == "" {
				reason = "rejected"
			}
			return reason
		}
		return ""
	}
	n, nerr := native.NewConfigSession(native.Options{
		Endpoint: endpoint, Token: sandboxToken, CAPEM: opts.CAPEM, TLSServerName: opts.TLSServerName,
		ConnectTimeout: opts.ConnectTimeout, AllowCleartextToken: opts.AllowCleartextToken,
	}, sandboxID, native.SessionOptions{PollInterval: opts.PollInterval, AnnouncePush: !opts.NoPush, InstanceID: opts.InstanceID}, applyBytes)
	if nerr != nil {
		cancel()
		return nil, fromNative(nerr)
	}
	s := &ConfigSession{n: n, ctx: ctx, cancel: cancel, apply: applyCtx}
	// The safety net: a session dropped without Close is freed when
	// collected. Run keeps its session reachable until it returns
	// (runtime.KeepAlive): nothing else refers to it while it waits.
	s.cleanup = runtime.AddCleanup(s, func(n *native.ConfigSession) { n.Free() }, n)
	return s, nil
}

// Run holds the session until ctx ends (then it returns nil) or Close.
// The ApplyFunc's context ends with ctx too. One Run at a time: a second
// Run while one is under way returns at once an error matching
// ErrFailedPrecondition and changes nothing (the first goes on); once Run
// returned, the session may run again.
func (s *ConfigSession) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return alreadyRunning("config session")
	}
	defer s.running.Store(false)
	// Without this the session could be collected (and its cleanup free it)
	// while the native run below waits: nothing refers to s after the call.
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
func (s *ConfigSession) Stats() ConfigSessionStats {
	st := s.n.Stats()
	return ConfigSessionStats{
		Mode: modeOf(st.Mode), Applied: st.Applied, Rejected: st.Rejected, Duplicates: st.Duplicates,
		UpdatesReceived: st.UpdatesReceived, LastUpdateID: st.LastUpdateID, ConfigRevision: st.ConfigRevision,
		Polls: st.Polls, SessionsAccepted: st.SessionsAccepted, Redirects: st.Redirects, ServedBy: st.ServedBy,
	}
}

// Close stops a running Run and releases the session. Idempotent.
func (s *ConfigSession) Close() error {
	s.once.Do(func() {
		s.cleanup.Stop()
		s.cancel()
		// The running task holds its own reference to the core session.
		s.n.Free()
	})
	return nil
}
