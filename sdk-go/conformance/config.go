package main

// config_session: takes over a sandbox's session with the SDK's
// ConfigSession on the sandbox's own token (its real supervisor stopped
// first), writes the step's settings one at a time and reports what the
// session saw: its counters, when each write arrived, the last applied
// settings.

import (
	"bytes"
	"context"

	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	openshell "example.invalid/openshell/sdk-go"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
	"example.invalid/openshell/sdk-go/proto/sandboxv1"
)

// arrivalLimit bounds how long one write may take to reach the session.
const arrivalLimit = 15 * time.Second

func processRunning(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

func waitFor(check func() bool, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for !check() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// takeOver returns the sandbox token and stops the sandbox's supervisor by
// its PID, so the step's session is the sandbox's only one.
func takeOver(dataDir, sandboxID string) (string, error) {
	folder := filepath.Join(dataDir, "sandboxes", sandboxID)
	rawPid, err := os.ReadFile(filepath.Join(folder, "supervisor.pid"))
	if err != nil {
		return "", err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(rawPid)))
	if err != nil {
		return "", err
	}
	// Guard against a reused PID: it must be this sandbox's supervisor.
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	args := bytes.Split(cmdline, []byte{0})
	isSupervisor, names := false, false
	for _, a := range args {
		isSupervisor = isSupervisor || bytes.HasSuffix(a, []byte("openshell-supervisor"))
		names = names || string(a) == sandboxID
	}
	if !isSupervisor || !names {
		return "", fail("process %d is not the supervisor of sandbox %s", pid, sandboxID)
	}
	token, err := os.ReadFile(filepath.Join(folder, "token"))
	if err != nil {
		return "", err
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return "", err
	}
	if !waitFor(func() bool { return !processRunning(pid) }, 10*time.Second) {
		return "", fail("supervisor %d did not stop within 10 s", pid)
	}
	return strings.TrimSpace(string(token)), nil
}

func updateSetting(ctx context.Context, r *runner, sandbox, key string, value *string, global bool) error {
	req := &openshellv1.UpdateConfigRequest{SettingKey: key, Global: global, DeleteSetting: value == nil}
	if !global {
		req.Sandbox = sandbox
	}
	if value != nil {
		req.SettingValue = &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_StringValue{StringValue: *value}}
	}
	_, err := r.client.Raw().UpdateConfig(ctx, req)
	return err
}

func stringSettings(s *openshell.ConfigSnapshot) map[string]string {
	out := map[string]string{}
	for k, v := range s.SandboxConfig.GetSettings() {
		if sv, ok := v.GetValue().GetValue().(*sandboxv1.SettingValue_StringValue); ok {
			out[k] = sv.StringValue
		}
	}
	return out
}

func configSessionOp(ctx context.Context, r *runner, s step) (result, error) {
	if r.dataDir == "" {
		return nil, fail("no OPENSHELL_CONFORMANCE_DATA_DIR")
	}
	name := r.target(s)
	sb, err := r.client.Sandboxes().Get(ctx, name)
	if err != nil {
		return nil, err
	}
	token, err := takeOver(r.dataDir, sb.ID)
	if err != nil {
		return nil, err
	}
	var refusedKey, refusedValue string
	refuse := false
	if rj, ok := s["reject"].(map[string]any); ok {
		refuse, refusedKey, refusedValue = true, fmt.Sprint(rj["setting"]), fmt.Sprint(rj["value"])
	}
	var mu sync.Mutex
	var applied []map[string]string
	apply := func(_ context.Context, snap *openshell.ConfigSnapshot) error {
		settings := stringSettings(snap)
		if refuse && settings[refusedKey] == refusedValue {
			return fmt.Errorf("%s must not be %s", refusedKey, refusedValue)
		}
		mu.Lock()
		applied = append(applied, settings)
		mu.Unlock()
		return nil
	}
	lastApplied := func() map[string]string {
		mu.Lock()
		defer mu.Unlock()
		if len(applied) == 0 {
			return nil
		}
		return applied[len(applied)-1]
	}
	announce := true
	if v, ok := s["announce_push"].(bool); ok {
		announce = v
	}
	poll := 10 * time.Second
	if v, ok := s["poll_interval"].(float64); ok {
		poll = time.Duration(v * float64(time.Second))
	}
	session, err := openshell.NewConfigSession(r.endpoint, sb.ID, token, apply, openshell.ConfigSessionOptions{
		PollInterval: poll, NoPush: !announce, AllowCleartextToken: true,
	})
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- session.Run(runCtx) }()
	var globals []string
	defer func() {
		// Global settings would reach every later session: removed again.
		for _, key := range globals {
			_ = updateSetting(context.Background(), r, name, key, nil, true)
		}
		stop()
		<-ran
		session.Close()
	}()
	var bootstrap any
	// Accepted, not merely polled: the startup poll sets a mode first.
	if waitFor(func() bool { st := session.Stats(); return st.SessionsAccepted > 0 && st.Mode != "" }, 30*time.Second) &&
		session.Stats().Mode == openshell.ModePush {
		bootstrap = waitFor(func() bool { return session.Stats().LastUpdateID >= 1 }, 10*time.Second)
	}
	writes := []result{}
	list, _ := r.subst(s["writes"]).([]any)
	if bootstrap != false {
		for _, w := range list {
			write, _ := w.(map[string]any)
			key, value := fmt.Sprint(write["setting"]), fmt.Sprint(write["value"])
			global := write["global"] == true
			rejectedBefore := session.Stats().Rejected
			started := time.Now()
			if err := updateSetting(ctx, r, name, key, &value, global); err != nil {
				return nil, err
			}
			if global {
				globals = append(globals, key)
			}
			var arrived bool
			if refuse && key == refusedKey && value == refusedValue {
				arrived = waitFor(func() bool { return session.Stats().Rejected > rejectedBefore }, arrivalLimit)
			} else {
				arrived = waitFor(func() bool { l := lastApplied(); return l != nil && l[key] == value }, arrivalLimit)
			}
			writes = append(writes, result{"setting": key, "value": value, "arrived": arrived, "seconds": time.Since(started).Seconds()})
			if !arrived {
				break
			}
		}
	}
	// A value shows in lastApplied while the apply function runs, before the
	// core has answered the update: observed once every update received was
	// answered (bounded), so the counts describe finished work.
	waitFor(func() bool { st := session.Stats(); return st.LastUpdateID == st.UpdatesReceived }, 5*time.Second)
	// Observed before the clean-up, whose deletions also arrive.
	st := session.Stats()
	last := lastApplied()
	if last == nil {
		last = map[string]string{}
	}
	var mode, servedBy any
	if st.Mode != "" {
		mode = string(st.Mode)
	}
	if st.ServedBy != "" {
		servedBy = st.ServedBy
	}
	return result{
		"stats": map[string]any{
			"mode": mode, "sessions_accepted": st.SessionsAccepted, "updates_received": st.UpdatesReceived,
			"last_update_id": st.LastUpdateID, "rejected": st.Rejected, "polls": st.Polls, "served_by": servedBy,
		},
		"bootstrap_answered": bootstrap,
		"writes":             writes,
		"applied_settings":   last,
	}, nil
}
