package openshell_test

// Real gateway processes on loopback for the tests, stopped by their own
// PIDs: one `openshell-gateway up --replicas 3` cluster shared by the whole
// run (TestMain), and single replicas that require a token. Binaries come
// from $OPENSHELL_BIN_DIR, else $CARGO_TARGET_DIR/debug, else
// ../target/debug.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var clusterEndpoint string

func binDir() string {
	if d := os.Getenv("OPENSHELL_BIN_DIR"); d != "" {
		return d
	}
	if t := os.Getenv("CARGO_TARGET_DIR"); t != "" {
		return filepath.Join(t, "debug")
	}
	return filepath.Join("..", "target", "debug")
}

func gatewayBinary() (string, error) {
	p := filepath.Join(binDir(), "openshell-gateway")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s is missing: run `make build` (cargo build --workspace --bins)", p)
	}
	return p, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// stopProcess signals cmd's own PID and waits; SIGKILL after 30 s.
func stopProcess(cmd *exec.Cmd, done <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

type cluster struct {
	endpoint string
	cmd      *exec.Cmd
	done     chan struct{}
	tmp      string
}

// startCluster starts the shared cluster, again elsewhere (at most three
// times) when a port it was given was taken meanwhile: the edge's port is
// picked free a moment before up binds it, and other packages' clusters
// bind ports at the same time.
func startCluster() (*cluster, error) {
	var err error
	for range 3 {
		var c *cluster
		var taken bool
		if c, taken, err = startClusterOnce(); !taken {
			return c, err
		}
	}
	return nil, err
}

// portTaken tells whether a process of a failed up could not bind its port.
func portTaken(dataDir string) bool {
	logs, _ := filepath.Glob(filepath.Join(dataDir, "up", "*.log"))
	for _, log := range logs {
		if b, err := os.ReadFile(log); err == nil && strings.Contains(string(b), "Address already in use") {
			return true
		}
	}
	return false
}

func startClusterOnce() (*cluster, bool, error) {
	bin, err := gatewayBinary()
	if err != nil {
		return nil, false, err
	}
	tmp, err := os.MkdirTemp("", "openshell-go-test-")
	if err != nil {
		return nil, false, err
	}
	port, err := freePort()
	if err != nil {
		return nil, false, err
	}
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(bin, "up", "--replicas", "3", "--listen", listen, "--data-dir", filepath.Join(tmp, "data"))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, false, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, false, err
	}
	if err := cmd.Start(); err != nil {
		return nil, false, err
	}
	done := make(chan struct{})
	ready := make(chan struct{})
	// tail is written by the scanner and read on failure: guarded.
	var tailMu sync.Mutex
	var tail strings.Builder
	tailText := func() string {
		tailMu.Lock()
		defer tailMu.Unlock()
		return tail.String()
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stdout)
		signalled := false
		for sc.Scan() {
			tailMu.Lock()
			if tail.Len() < 8000 {
				tail.WriteString(sc.Text() + "\n")
			}
			tailMu.Unlock()
			if !signalled && strings.Contains(sc.Text(), "serving http://") {
				signalled = true
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() { _ = cmd.Wait(); close(done) }()
	c := &cluster{endpoint: "http://" + listen, cmd: cmd, done: done, tmp: tmp}
	select {
	case <-ready:
		return c, false, nil
	case <-done:
		// The last lines may still be in the pipe: let the scanner finish.
		select {
		case <-scanned:
		case <-time.After(5 * time.Second):
		}
		taken := portTaken(filepath.Join(tmp, "data"))
		err := fmt.Errorf("openshell-gateway up exited (port taken: %v; logs in %s):\n%s", taken, tmp, tailText())
		if taken {
			fmt.Fprintln(os.Stderr, err, "\ntrying again on other ports")
			_ = os.RemoveAll(tmp)
		}
		return nil, taken, err
	case <-time.After(90 * time.Second):
		c.stop()
		return nil, false, fmt.Errorf("openshell-gateway up did not start in 90 s")
	}
}

func (c *cluster) stop() {
	stopProcess(c.cmd, c.done)
	_ = os.RemoveAll(c.tmp)
}

func TestMain(m *testing.M) {
	if os.Getenv(threadsChildEnv) != "" {
		// The measuring process of threads_test.go: it needs no cluster.
		os.Exit(m.Run())
	}
	c, err := startCluster()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the test cluster:", err)
		os.Exit(1)
	}
	clusterEndpoint = c.endpoint
	// The examples dial from the environment.
	os.Setenv("OPENSHELL_ENDPOINT", c.endpoint)
	os.Unsetenv("OPENSHELL_TOKEN")
	code := m.Run()
	c.stop()
	os.Exit(code)
}

// tokenGateway starts one replica that requires the token it returns.
func tokenGateway(t *testing.T) (endpoint, token string) {
	t.Helper()
	bin, err := gatewayBinary()
	if err != nil {
		t.Fatal(err)
	}
	token = "tok-" + randomHex(8)
	tmp := t.TempDir()
	readyFile := filepath.Join(tmp, "ready.json")
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--data-dir", filepath.Join(tmp, "data"), "--ready-file", readyFile, "--token", token,
		"--stop-sandboxes-on-exit")
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
		if b, err := os.ReadFile(readyFile); err == nil && json.Unmarshal(b, &info) == nil && info.URL != "" {
			return strings.TrimSuffix(info.URL, "/"), token
		}
		select {
		case <-done:
			t.Fatal("gateway serve exited before it was ready")
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatal("gateway serve did not start in 90 s")
	return "", ""
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func unique(prefix string) string { return prefix + "-" + randomHex(4) }

// until polls check every 50 ms; fails the test after timeout.
func until(t *testing.T, what string, timeout time.Duration, check func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !check() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting: %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// markedPids are the host PIDs of running processes whose environment
// holds TEST_MARKER=marker.
func markedPids(marker string) []int {
	want := "TEST_MARKER=" + marker
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !slices.Contains(strings.Split(string(env), "\x00"), want) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		fields := strings.SplitN(string(stat), ") ", 2)
		if len(fields) == 2 && !strings.HasPrefix(fields[1], "Z") {
			pids = append(pids, pid)
		}
	}
	return pids
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
