package openshell_test

// HostSession: a shared supervisor host's session. Bad input is refused
// before any I/O, the token never shows, and a session that cannot
// connect ends with its context. Then against a real replica in `--driver
// hosts` mode with a host token from `openshell-gateway host-token`:
// accepted by that replica, assigned a new sandbox, whose configuration
// reaches the apply function.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
	"example.invalid/openshell/sdk-go/proto/sandboxv1"
)

const hostSecret = "host-token-that-must-never-show"

func noopHostApply(context.Context, string, *openshell.ConfigSnapshot) error { return nil }

func TestHostSessionBadInput(t *testing.T) {
	endpoint := "http://127.0.0.1:1"
	_, err := openshell.NewHostSession(endpoint, " ", hostSecret, noopHostApply, openshell.HostSessionOptions{AllowCleartextToken: true})
	e := requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
	if !strings.Contains(e.Message, "member id") {
		t.Fatalf("the error does not say what is wrong: %v", e)
	}
	_, err = openshell.NewHostSession(endpoint, "h-0", hostSecret, nil, openshell.HostSessionOptions{AllowCleartextToken: true})
	requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
	_, err = openshell.NewHostSession("ftp://127.0.0.1:1", "h-0", hostSecret, noopHostApply, openshell.HostSessionOptions{})
	requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
	_, err = openshell.NewHostSession("http://192.0.2.1:1", "h-0", hostSecret, noopHostApply, openshell.HostSessionOptions{})
	e = requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
	if strings.Contains(fmt.Sprintf("%v %+v", e, e), hostSecret) {
		t.Fatal("the token is in the error")
	}
}

func TestHostSessionHidesItsTokenAndEndsWithItsContext(t *testing.T) {
	h, err := openshell.NewHostSession("http://127.0.0.1:1", "h-7", hostSecret, noopHostApply,
		openshell.HostSessionOptions{Capacity: 3, InstanceID: "inst-1", ConnectTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, s := range []string{h.String(), fmt.Sprintf("%v", h), fmt.Sprintf("%#v", h)} {
		if strings.Contains(s, hostSecret) {
			t.Fatalf("the token shows: %s", s)
		}
	}
	if h.MemberID() != "h-7" || h.InstanceID() != "inst-1" {
		t.Fatalf("member %q instance %q", h.MemberID(), h.InstanceID())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := h.Run(ctx); err != nil {
		t.Fatalf("run: %v", err)
	}
	if st := h.Stats(); st.SessionsAccepted != 0 || st.SessionID != "" || st.Assigned != 0 {
		t.Fatalf("stats of a session that never connected: %+v", st)
	}
}

// hostsGateway is one dev-mode replica in --driver hosts mode.
type hostsGateway struct {
	endpoint, metrics, replica, dataDir string
}

func startHostsGateway(t *testing.T) hostsGateway {
	t.Helper()
	bin, err := gatewayBinary()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	ready := filepath.Join(tmp, "ready.json")
	cmd := exec.Command(bin, "serve", "--dev", "--driver", "hosts", "--config-delivery-mode", "push",
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--data-dir", filepath.Join(tmp, "data"), "--ready-file", ready)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { stopProcess(cmd, done) })
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		var info struct {
			URL       string `json:"url"`
			Metrics   string `json:"metrics"`
			ReplicaID string `json:"replica_id"`
		}
		if b, err := os.ReadFile(ready); err == nil && json.Unmarshal(b, &info) == nil && info.URL != "" {
			return hostsGateway{strings.TrimSuffix(info.URL, "/"), info.Metrics, info.ReplicaID, filepath.Join(tmp, "data")}
		}
		select {
		case <-done:
			t.Fatal("the gateway exited before it was ready")
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatal("the gateway did not start in 90 s")
	return hostsGateway{}
}

// hostToken issues host hostID's token with the real host-token subcommand.
func (g hostsGateway) hostToken(t *testing.T, hostID string) string {
	t.Helper()
	bin, _ := gatewayBinary()
	out := filepath.Join(filepath.Dir(g.dataDir), hostID+".token")
	printed, err := exec.Command(bin, "host-token", "--data-dir", g.dataDir, "--host-id", hostID, "--out", out).CombinedOutput()
	if err != nil {
		t.Fatalf("host-token: %v: %s", err, printed)
	}
	b, err := os.ReadFile(out)
	token := strings.TrimSpace(string(b))
	if err != nil || token == "" || strings.Contains(string(printed), token) {
		t.Fatalf("host-token misbehaved (%v)", err)
	}
	return token
}

func (g hostsGateway) metric(sample string) float64 {
	resp, err := http.Get("http://" + g.metrics + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, sample+" ") {
			v, _ := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
			return v
		}
	}
	return 0
}

const hostsHeld = "openshell_server_supervisor_hosts"

func TestHostSessionServesAnAssignedSandbox(t *testing.T) {
	gw := startHostsGateway(t)
	ctx := testContext(t, 2*time.Minute)
	hostID := unique("h-go")
	token := gw.hostToken(t, hostID)
	type seen struct {
		sandboxID, color string
	}
	var mu sync.Mutex
	var got []seen
	snapshot := func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), got...)
	}
	apply := func(_ context.Context, sandboxID string, s *openshell.ConfigSnapshot) error {
		color, _ := s.Setting("color")
		mu.Lock()
		got = append(got, seen{sandboxID, color})
		mu.Unlock()
		if color == "plaid" {
			return errors.New("no plaid")
		}
		return nil
	}
	h, err := openshell.NewHostSession(gw.endpoint, hostID, token, apply, openshell.HostSessionOptions{Capacity: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if strings.Contains(h.String(), token) {
		t.Fatal("the token shows")
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- h.Run(runCtx) }()
	until(t, "the host session accepted", 30*time.Second, func() bool { return h.Stats().SessionID != "" })
	if st := h.Stats(); st.SessionsAccepted != 1 || st.ServedBy != gw.replica || st.Stay || st.Redirects != 0 {
		t.Fatalf("stats once accepted: %+v (replica %s)", st, gw.replica)
	}
	until(t, "the replica counts the host", 20*time.Second, func() bool { return gw.metric(hostsHeld) == 1 })

	c, err := openshell.Dial(ctx, gw.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name := unique("go-host")
	sb, err := c.Sandboxes().Create(ctx, openshell.CreateSandbox{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = c.Sandboxes().Delete(context.Background(), name) }()
	until(t, "the first snapshot", 20*time.Second, func() bool { return len(snapshot()) == 1 })
	if h.Stats().Assigned != 1 {
		t.Fatalf("assigned: %+v", h.Stats())
	}
	for _, color := range []string{"blue", "plaid"} {
		_, err := c.Raw().UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{
			Sandbox: name, SettingKey: "color",
			SettingValue: &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_StringValue{StringValue: color}},
		})
		if err != nil {
			t.Fatal(err)
		}
		until(t, "color="+color+" applied", 20*time.Second, func() bool {
			s := snapshot()
			return len(s) > 0 && s[len(s)-1].color == color
		})
	}
	until(t, "the gateway saw the rejection", 20*time.Second, func() bool {
		return gw.metric(`openshell_server_config_results_total{outcome="rejected"}`) >= 1
	})
	want := []seen{{sb.ID, ""}, {sb.ID, "blue"}, {sb.ID, "plaid"}}
	if fmt.Sprint(snapshot()) != fmt.Sprint(want) {
		t.Fatalf("applied %v, want %v", snapshot(), want)
	}
	if _, err := c.Sandboxes().Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	until(t, "the sandbox leaves the assignment", 20*time.Second, func() bool { return h.Stats().Assigned == 0 })
	stop()
	if err := <-ran; err != nil {
		t.Fatalf("run: %v", err)
	}
	until(t, "the host session ends", 20*time.Second, func() bool { return gw.metric(hostsHeld) == 0 })
}
