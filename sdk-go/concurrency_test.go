package openshell_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
)

// 200 goroutines share one client: gets, execs and health calls at once.
func TestTwoHundredGoroutinesShareOneClient(t *testing.T) {
	c := newClient(t)
	name := readySandbox(t, c, "go-conc", nil)
	ctx := testContext(t, 120*time.Second)
	var wg sync.WaitGroup
	var failures atomic.Int32
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			switch i % 3 {
			case 0:
				var s *openshell.Sandbox
				s, err = c.Sandboxes().Get(ctx, name)
				if err == nil && s.Name != name {
					err = fmt.Errorf("got %q", s.Name)
				}
			case 1:
				var out *openshell.ExecResult
				want := fmt.Sprintf("n%d\n", i)
				out, err = c.Exec(ctx, openshell.ExecRequest{Sandbox: name, Command: []string{"echo", want[:len(want)-1]}})
				if err == nil && string(out.Stdout) != want {
					err = fmt.Errorf("exec %d: %q", i, out.Stdout)
				}
			default:
				_, err = c.Health(ctx)
			}
			if err != nil {
				failures.Add(1)
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if failures.Load() != 0 {
		t.Fatalf("%d of 200 calls failed", failures.Load())
	}
}

func TestStaticToken(t *testing.T) {
	endpoint, token := tokenGateway(t)
	ctx := testContext(t, 30*time.Second)
	c, err := openshell.Dial(ctx, endpoint, openshell.WithToken(token), openshell.WithCleartextToken())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Sandboxes().List(ctx, openshell.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	bad, err := openshell.Dial(ctx, endpoint, openshell.WithToken("wrong-"+token), openshell.WithCleartextToken())
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	_, err = bad.Sandboxes().List(ctx, openshell.ListOptions{})
	var e *openshell.Error
	if !errors.Is(err, openshell.ErrUnauthenticated) || !errors.As(err, &e) || e.GRPCStatus != 16 {
		t.Fatalf("a wrong token: %v", err)
	}
	if containsToken(err.Error(), token) {
		t.Fatal("the error names the token")
	}
}

func containsToken(s, token string) bool {
	return len(token) > 0 && len(s) >= len(token) && (func() bool {
		for i := 0; i+len(token) <= len(s); i++ {
			if s[i:i+len(token)] == token {
				return true
			}
		}
		return false
	})()
}

// The provider is called once for 20 concurrent calls (single flight),
// then once more, forced, after the gateway refuses its token.
func TestTokenProviderSingleFlightAndRefresh(t *testing.T) {
	endpoint, token := tokenGateway(t)
	ctx := testContext(t, 60*time.Second)
	var calls atomic.Int32
	var mu sync.Mutex
	var forced []bool
	stale := true
	provider := func(ctx context.Context, force bool) (openshell.Token, error) {
		calls.Add(1)
		mu.Lock()
		forced = append(forced, force)
		mu.Unlock()
		time.Sleep(100 * time.Millisecond) // let the concurrent calls pile up
		return openshell.Token{Value: token, ExpiresIn: time.Hour}, nil
	}
	c, err := openshell.Dial(ctx, endpoint, openshell.WithTokenProvider(provider), openshell.WithCleartextToken())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Sandboxes().List(ctx, openshell.ListOptions{}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Fatalf("provider called %d times for 20 concurrent calls", n)
	}

	// A provider whose first token is refused: refreshed once, forced.
	calls.Store(0)
	forced = nil
	refreshing := func(ctx context.Context, force bool) (openshell.Token, error) {
		calls.Add(1)
		mu.Lock()
		defer mu.Unlock()
		forced = append(forced, force)
		if stale {
			stale = false
			return openshell.Token{Value: "expired-" + token}, nil
		}
		return openshell.Token{Value: token}, nil
	}
	c2, err := openshell.Dial(ctx, endpoint, openshell.WithTokenProvider(refreshing), openshell.WithCleartextToken())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	// 20 concurrent calls meet the refused token: one forced refresh for all.
	var wg2 sync.WaitGroup
	for range 20 {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			if _, err := c2.Sandboxes().List(ctx, openshell.ListOptions{}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg2.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(forced) != 2 || forced[0] || !forced[1] {
		t.Fatalf("provider calls (forceRefresh) for 20 concurrent calls: %v", forced)
	}
}

func TestFailingTokenProvider(t *testing.T) {
	endpoint, _ := tokenGateway(t)
	ctx := testContext(t, 30*time.Second)
	c, err := openshell.Dial(ctx, endpoint, openshell.WithCleartextToken(), openshell.WithTokenProvider(
		func(context.Context, bool) (openshell.Token, error) {
			return openshell.Token{}, errors.New("vault sealed")
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Sandboxes().List(ctx, openshell.ListOptions{})
	var e *openshell.Error
	if !errors.As(err, &e) || e.Code != "auth" || !errors.Is(err, openshell.ErrUnauthenticated) {
		t.Fatalf("failing provider: %v", err)
	}
}

// A panicking token provider fails the calls waiting for a token, with a
// reason; it does not take the process down.
func TestPanickingTokenProvider(t *testing.T) {
	endpoint, _ := tokenGateway(t)
	ctx := testContext(t, 30*time.Second)
	c, err := openshell.Dial(ctx, endpoint, openshell.WithCleartextToken(), openshell.WithTokenProvider(
		func(context.Context, bool) (openshell.Token, error) {
			panic("deliberate")
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Sandboxes().List(ctx, openshell.ListOptions{})
	var e *openshell.Error
	if !errors.As(err, &e) || e.Code != "auth" || !strings.Contains(e.Message, "panicked") {
		t.Fatalf("panicking provider: %v", err)
	}
}
