package openshell_test

// HostSession: a shared supervisor host's session. Bad input is refused
// before any I/O, the token never shows, and a session that cannot
// connect ends with its context.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
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
