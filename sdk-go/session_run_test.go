package openshell_test

// One Run at a time per session: a second Run of a ConfigSession or a
// HostSession while one is under way fails at once with
// ErrFailedPrecondition and leaves the running one as it was.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
)

// refusedAtOnce runs second and fails the test unless it returns an error
// matching ErrFailedPrecondition within 20 s (a Run that was not refused
// would hold until its context ends: it is then cancelled and reported).
func refusedAtOnce(t *testing.T, what string, second func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- second(ctx) }()
	select {
	case err := <-ran:
		var e *openshell.Error
		if !errors.Is(err, openshell.ErrFailedPrecondition) || !errors.As(err, &e) ||
			e.Code != "failed_precondition" || e.GRPCStatus != 9 || !strings.Contains(e.Message, "already running") {
			t.Fatalf("the second Run of the %s ended with %v", what, err)
		}
	case <-time.After(20 * time.Second):
		cancel()
		<-ran
		t.Fatalf("a second Run of the %s while one ran was not refused", what)
	}
}

func TestConfigSessionRefusesASecondConcurrentRun(t *testing.T) {
	f := newConfigFixture(t, "push")
	var a applied
	s := f.session(t, a.apply, openshell.ConfigSessionOptions{})
	defer s.Close()
	ctx, stop := context.WithCancel(f.ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	until(t, "the session pushes", 20*time.Second, func() bool { return s.Stats().Mode == openshell.ModePush })
	before := s.Stats()

	refusedAtOnce(t, "config session", s.Run)

	// The first Run goes on, on the same session: still running, nothing
	// accepted again, and it still applies what is pushed.
	select {
	case err := <-ran:
		t.Fatalf("the first Run ended with %v", err)
	default:
	}
	f.set("color", "teal")
	until(t, "color=teal applied", 20*time.Second, func() bool { return a.setting("color") == "teal" })
	if st := s.Stats(); st.SessionsAccepted != before.SessionsAccepted || st.Mode != openshell.ModePush {
		t.Fatalf("stats before the refusal %+v, after %+v", before, st)
	}
	stop()
	waitRun(t, ran)

	// Once it ended, the session runs again.
	ctx2, stop2 := context.WithCancel(f.ctx)
	defer stop2()
	ran2 := make(chan error, 1)
	go func() { ran2 <- s.Run(ctx2) }()
	until(t, "the session accepted again", 20*time.Second, func() bool {
		return s.Stats().SessionsAccepted > before.SessionsAccepted
	})
	stop2()
	waitRun(t, ran2)
}

func TestHostSessionRefusesASecondConcurrentRun(t *testing.T) {
	gw := startHostsGateway(t)
	ctx := testContext(t, 2*time.Minute)
	hostID := unique("h-go-twice")
	token := gw.hostToken(t, hostID)
	apply := func(context.Context, string, *openshell.ConfigSnapshot) error { return nil }
	h, err := openshell.NewHostSession(gw.endpoint, hostID, token, apply, openshell.HostSessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- h.Run(runCtx) }()
	until(t, "the host session accepted", 30*time.Second, func() bool { return h.Stats().SessionID != "" })
	before := h.Stats()

	refusedAtOnce(t, "host session", h.Run)

	select {
	case err := <-ran:
		t.Fatalf("the first Run ended with %v", err)
	default:
	}
	if st := h.Stats(); st.SessionID != before.SessionID || st.SessionsAccepted != before.SessionsAccepted {
		t.Fatalf("stats before the refusal %+v, after %+v", before, st)
	}
	if held := gw.metric(hostsHeld); held != 1 {
		t.Fatalf("the replica holds %v host sessions", held)
	}
	stop()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("the first Run ended with %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the first Run did not end after its context was cancelled")
	}
}
