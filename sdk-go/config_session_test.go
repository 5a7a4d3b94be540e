package openshell_test

// ConfigSession against real gateways in push and in poll mode. Each
// gateway is `openshell-gateway serve --dev --allow-test-flags --driver
// none`: sandboxes get a record and a token file
// (<data-dir>/sandboxes/<id>/token) and no supervisor, so the session under
// test is the sandbox's only one. Configuration is written with
// UpdateConfig through the raw stubs of a normal client.

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
	"example.invalid/openshell/sdk-go/proto/sandboxv1"
)

type configGateway struct {
	endpoint string
	dataDir  string
}

func startConfigGateway(t *testing.T, mode string) configGateway {
	t.Helper()
	bin, err := gatewayBinary()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	ready := filepath.Join(tmp, "ready.json")
	cmd := exec.Command(bin, "serve", "--dev", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--data-dir", filepath.Join(tmp, "data"), "--ready-file", ready, "--config-delivery-mode", mode,
		"--allow-test-flags", "--driver", "none")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { stopProcess(cmd, done) })
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		var info struct {
			URL string `json:"url"`
		}
		if b, err := os.ReadFile(ready); err == nil && json.Unmarshal(b, &info) == nil && info.URL != "" {
			return configGateway{endpoint: strings.TrimSuffix(info.URL, "/"), dataDir: filepath.Join(tmp, "data")}
		}
		select {
		case <-done:
			t.Fatal("the gateway exited before it was ready")
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatal("the gateway did not start in 90 s")
	return configGateway{}
}

type applied struct {
	mu    sync.Mutex
	snaps []*openshell.ConfigSnapshot
}

func (a *applied) apply(_ context.Context, s *openshell.ConfigSnapshot) error {
	if v, _ := s.Setting("verdict"); v == "no" {
		return errors.New("verdict must not be no")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.snaps = append(a.snaps, s)
	return nil
}

func (a *applied) last() *openshell.ConfigSnapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.snaps) == 0 {
		return nil
	}
	return a.snaps[len(a.snaps)-1]
}

// configFixture is a gateway in one delivery mode with one sandbox: what a
// session needs, and set, which writes one of the sandbox's settings.
type configFixture struct {
	ctx                 context.Context
	endpoint, id, token string
	set                 func(key, value string)
}

func newConfigFixture(t *testing.T, mode string) configFixture {
	t.Helper()
	gw := startConfigGateway(t, mode)
	ctx := testContext(t, 90*time.Second)
	c, err := openshell.Dial(ctx, gw.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	name := unique("go-cfg")
	sb, err := c.Sandboxes().Create(ctx, openshell.CreateSandbox{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	token, err := os.ReadFile(filepath.Join(gw.dataDir, "sandboxes", sb.ID, "token"))
	if err != nil {
		t.Fatal(err)
	}
	set := func(key, value string) {
		t.Helper()
		_, err := c.Raw().UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{
			Sandbox: name, SettingKey: key,
			SettingValue: &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_StringValue{StringValue: value}},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return configFixture{ctx: ctx, endpoint: gw.endpoint, id: sb.ID, token: strings.TrimSpace(string(token)), set: set}
}

func (f configFixture) session(t *testing.T, apply openshell.ApplyFunc, opts openshell.ConfigSessionOptions) *openshell.ConfigSession {
	t.Helper()
	opts.AllowCleartextToken = true
	s, err := openshell.NewConfigSession(f.endpoint, f.id, f.token, apply, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitRun fails the test unless Run ends (with nil) within 10 s.
func waitRun(t *testing.T, ran <-chan error) {
	t.Helper()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not end after its context was cancelled")
	}
}

// setting is a setting of the last applied snapshot ("" before any).
func (a *applied) setting(key string) string {
	l := a.last()
	if l == nil {
		return ""
	}
	v, _ := l.Setting(key)
	return v
}

func testConfigSession(t *testing.T, mode string, opts openshell.ConfigSessionOptions) {
	f := newConfigFixture(t, mode)
	ctx, set := f.ctx, f.set
	var a applied
	s := f.session(t, a.apply, opts)
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- s.Run(runCtx) }()
	want := openshell.ModePush
	if mode == "poll" {
		want = openshell.ModePoll
	}
	until(t, "the session's mode", 20*time.Second, func() bool { return s.Stats().Mode == want })
	started := time.Now()
	set("color", "blue")
	until(t, "color=blue applied", 20*time.Second, func() bool {
		l := a.last()
		v, _ := "", false
		if l != nil {
			v, _ = l.Setting("color")
		}
		return v == "blue"
	})
	took := time.Since(started)
	if l := a.last(); l.Mode != want {
		t.Fatalf("applied in mode %q, want %q", l.Mode, want)
	}
	if mode == "push" && took > 2*time.Second {
		t.Fatalf("a pushed update took %v", took)
	}
	set("verdict", "no")
	until(t, "verdict=no rejected", 20*time.Second, func() bool { return s.Stats().Rejected == 1 })
	set("verdict", "yes")
	until(t, "verdict=yes applied", 20*time.Second, func() bool {
		l := a.last()
		v, _ := l.Setting("verdict")
		return v == "yes"
	})
	// The apply function returns before the core counts its answer.
	until(t, "three answers counted applied", 20*time.Second, func() bool { return s.Stats().Applied >= 3 })
	st := s.Stats()
	if st.Applied != 3 || st.Rejected != 1 {
		t.Fatalf("stats %+v", st)
	}
	if mode == "push" && (st.SessionsAccepted < 1 || st.UpdatesReceived < 4 || st.ServedBy == "") {
		t.Fatalf("push stats %+v", st)
	}
	if mode == "poll" && st.Polls < 2 {
		t.Fatalf("poll stats %+v", st)
	}
	stop()
	waitRun(t, ran)
	s.Close()
	s.Close()
}

// A running session stays alive with no reference but its Run: collecting
// it (its cleanup frees the native session and its apply function) would
// reject every later configuration.
func TestConfigSessionRunKeepsTheSessionAlive(t *testing.T) {
	f := newConfigFixture(t, "push")
	var a applied
	ctx, stop := context.WithCancel(f.ctx)
	defer stop()
	ran := make(chan error, 1)
	// Nothing refers to the session after this function but its Run.
	func() {
		s := f.session(t, a.apply, openshell.ConfigSessionOptions{})
		go func() { ran <- s.Run(ctx) }()
	}()
	until(t, "the first configuration applied", 20*time.Second, func() bool { return a.last() != nil })
	for range 5 {
		runtime.GC()
		time.Sleep(50 * time.Millisecond)
	}
	f.set("color", "green")
	until(t, "color=green applied after GC", 20*time.Second, func() bool { return a.setting("color") == "green" })
	stop()
	waitRun(t, ran)
}

// The apply function's context is Run's: cancelling Run's context reaches
// an apply in progress.
func TestConfigSessionApplyContextEndsWithRun(t *testing.T) {
	f := newConfigFixture(t, "push")
	entered := make(chan struct{}, 1)
	ended := make(chan error, 1)
	apply := func(ctx context.Context, snap *openshell.ConfigSnapshot) error {
		if v, _ := snap.Setting("block"); v != "yes" {
			return nil
		}
		entered <- struct{}{}
		select {
		case <-ctx.Done():
			ended <- ctx.Err()
			return ctx.Err()
		case <-time.After(30 * time.Second):
			ended <- errors.New("the apply context did not end in 30 s")
			return nil
		}
	}
	s := f.session(t, apply, openshell.ConfigSessionOptions{})
	defer s.Close()
	ctx, stop := context.WithCancel(f.ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	until(t, "the session pushes", 20*time.Second, func() bool { return s.Stats().Mode == openshell.ModePush })
	f.set("block", "yes")
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the blocking configuration was not applied")
	}
	stop()
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the apply context ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelling Run's context did not reach the apply function")
	}
	waitRun(t, ran)
}

// A panicking apply function rejects its configuration; the process and
// the session live on.
func TestConfigSessionPanickingApplyRejects(t *testing.T) {
	f := newConfigFixture(t, "push")
	var a applied
	apply := func(ctx context.Context, snap *openshell.ConfigSnapshot) error {
		if v, _ := snap.Setting("verdict"); v == "panic" {
			panic("deliberate")
		}
		return a.apply(ctx, snap)
	}
	s := f.session(t, apply, openshell.ConfigSessionOptions{})
	defer s.Close()
	ctx, stop := context.WithCancel(f.ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	until(t, "the session pushes", 20*time.Second, func() bool { return s.Stats().Mode == openshell.ModePush })
	f.set("verdict", "panic")
	until(t, "the panicking apply rejected", 20*time.Second, func() bool { return s.Stats().Rejected == 1 })
	f.set("verdict", "yes")
	until(t, "verdict=yes applied after the panic", 20*time.Second, func() bool { return a.setting("verdict") == "yes" })
	stop()
	waitRun(t, ran)
}

func TestConfigSessionPush(t *testing.T) {
	testConfigSession(t, "push", openshell.ConfigSessionOptions{})
}

func TestConfigSessionPoll(t *testing.T) {
	testConfigSession(t, "poll", openshell.ConfigSessionOptions{PollInterval: 300 * time.Millisecond})
}

func TestConfigSessionBadInput(t *testing.T) {
	noop := func(context.Context, *openshell.ConfigSnapshot) error { return nil }
	_, err := openshell.NewConfigSession(clusterEndpoint, "", "tok", noop, openshell.ConfigSessionOptions{})
	requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
	_, err = openshell.NewConfigSession(clusterEndpoint, "id", "tok", nil, openshell.ConfigSessionOptions{})
	requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
	_, err = openshell.NewConfigSession(clusterEndpoint, "id", "tok", noop, openshell.ConfigSessionOptions{PollInterval: time.Millisecond, AllowCleartextToken: true})
	requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
}
