package openshell_test

// Concurrent unary calls hold no OS thread each. The store of a dedicated
// gateway is slowed (`serve --store-fault-file`, a test flag), so 100 calls
// started at once are all in flight together; a fresh process (this test
// binary again, with GOMAXPROCS=2) makes them on one client and counts the
// threads the Go runtime created meanwhile (the "threadcreate" profile). A
// call that waited in a blocking cgo call would take a thread of its own:
// about 100 then. Completions through the library's queue leave every
// waiting goroutine parked (at most one call, one started while no other
// was in flight, runs on its own thread), so the count stays near
// GOMAXPROCS.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
)

// threadsChildEnv, when set ("endpoint sandbox"), makes
// TestConcurrentUnaryCallsHoldNoThreadEach the measuring child and TestMain
// start no cluster.
const threadsChildEnv = "OPENSHELL_GO_TEST_THREADS_CHILD"

const (
	threadCallers = 100
	// Threads the child may create while its calls run: its Ps' threads,
	// spinning threads and the short cgo calls that start and drain calls.
	threadLimit = 25
	storeDelay  = 600 // ms each store call of the gateway waits
)

func TestConcurrentUnaryCallsHoldNoThreadEach(t *testing.T) {
	if spec := os.Getenv(threadsChildEnv); spec != "" {
		endpoint, name, _ := strings.Cut(spec, " ")
		threadsChild(t, endpoint, name)
		return
	}
	bin, err := gatewayBinary()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	ready := filepath.Join(tmp, "ready.json")
	fault := filepath.Join(tmp, "store-fault.json")
	cmd := exec.Command(bin, "serve", "--dev", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--data-dir", filepath.Join(tmp, "data"), "--ready-file", ready, "--allow-test-flags",
		"--driver", "none", "--store-fault-file", fault)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { stopProcess(cmd, done) })
	var info struct {
		URL     string `json:"url"`
		Metrics string `json:"metrics"`
	}
	until(t, "the gateway is ready", 90*time.Second, func() bool {
		b, err := os.ReadFile(ready)
		return err == nil && json.Unmarshal(b, &info) == nil && info.URL != ""
	})
	endpoint := strings.TrimSuffix(info.URL, "/")
	ctx := testContext(t, 2*time.Minute)
	c, err := openshell.Dial(ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name := unique("go-threads")
	if _, err := c.Sandboxes().Create(ctx, openshell.CreateSandbox{Name: name}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fault, []byte(fmt.Sprintf(`{"delay_ms": %d}`, storeDelay)), 0o600); err != nil {
		t.Fatal(err)
	}
	until(t, "the gateway slows its store", 20*time.Second, func() bool {
		resp, err := http.Get("http://" + info.Metrics + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), fmt.Sprintf("openshell_store_fault_delay_ms %d\n", storeDelay))
	})

	child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestConcurrentUnaryCallsHoldNoThreadEach$", "-test.count=1", "-test.v")
	child.Env = append(os.Environ(), threadsChildEnv+"="+endpoint+" "+name, "GOMAXPROCS=2")
	out, err := child.CombinedOutput()
	t.Logf("the measuring process:\n%s", out)
	if err != nil {
		t.Fatalf("the measuring process failed: %v", err)
	}
}

// threadsChild makes the concurrent calls (curated Get, raw GetSandbox,
// curated List) and checks how many threads the runtime created for them.
func threadsChild(t *testing.T, endpoint, name string) {
	ctx := testContext(t, 2*time.Minute)
	c, err := openshell.Dial(ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The connection, and whatever the first call starts once.
	if _, err := c.Sandboxes().Get(ctx, name); err != nil {
		t.Fatal(err)
	}
	threads := pprof.Lookup("threadcreate")
	before := threads.Count()
	var wg sync.WaitGroup
	errs := make(chan error, threadCallers)
	for i := range threadCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			switch i % 3 {
			case 0:
				_, err = c.Sandboxes().Get(ctx, name)
			case 1:
				_, err = c.Raw().GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: name})
			default:
				_, err = c.Sandboxes().List(ctx, openshell.ListOptions{})
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	created := threads.Count() - before
	t.Logf("%d concurrent unary calls: %d threads created (limit %d)", threadCallers, created, threadLimit)
	if created > threadLimit {
		t.Fatalf("%d concurrent unary calls created %d threads (limit %d): calls hold a thread each", threadCallers, created, threadLimit)
	}
}
