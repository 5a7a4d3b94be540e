package openshell_test

// SSH session tokens (Client.SSHSessions) and a forward that carries one,
// against a replica that requires a user token: a client with no token and
// only the session token is the token-only caller the gateway scopes.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
)

// echoes tells whether a connection to the forward gets its bytes back (a
// refused stream closes the connection instead).
func echoes(t *testing.T, fwd *openshell.Forward) bool {
	t.Helper()
	conn, err := net.DialTimeout("tcp", fwd.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Write([]byte("ping")); err != nil {
		return false
	}
	_ = conn.(*net.TCPConn).CloseWrite()
	got, _ := io.ReadAll(conn)
	return string(got) == "ping"
}

// refused tells whether the connection was closed without an echo and
// counted as failed.
func refused(t *testing.T, fwd *openshell.Forward) bool {
	t.Helper()
	if echoes(t, fwd) {
		return false
	}
	until(t, "a failed connection", 10*time.Second, func() bool { return fwd.Stats().ConnectionsFailed >= 1 })
	return true
}

func forwardWith(t *testing.T, ctx context.Context, c *openshell.Client, sandbox string, port int, token string) *openshell.Forward {
	t.Helper()
	fwd, err := c.Forward(ctx, sandbox, port, openshell.ForwardOptions{SSHSessionToken: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	return fwd
}

// sshGateway is a token gateway with a user client, a client without a
// token, and two READY sandboxes.
func sshGateway(t *testing.T) (endpoint string, user, anonymous *openshell.Client, mine, other string) {
	endpoint, token := tokenGateway(t)
	ctx := testContext(t, 30*time.Second)
	var err error
	if user, err = openshell.Dial(ctx, endpoint, openshell.WithToken(token)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { user.Close() })
	if anonymous, err = openshell.Dial(ctx, endpoint); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { anonymous.Close() })
	mine, other = readySandbox(t, user, "go-ssh-a", nil), readySandbox(t, user, "go-ssh-b", nil)
	return endpoint, user, anonymous, mine, other
}

func TestSSHSessions(t *testing.T) {
	endpoint, user, anonymous, mine, other := sshGateway(t)
	ctx := testContext(t, 120*time.Second)
	// The same port serves in both sandboxes (each has a network of its
	// own), so a refusal comes from the token check, not a closed port.
	port := sandboxEcho(t, user, mine, 0)
	sandboxEcho(t, user, other, port)

	t.Run("a session token alone forwards to its sandbox until revoked", func(t *testing.T) {
		before := time.Now()
		session, err := user.SSHSessions().Create(ctx, mine)
		if err != nil {
			t.Fatal(err)
		}
		sb, err := user.Sandboxes().Get(ctx, mine)
		if err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(endpoint)
		wantPort, _ := strconv.Atoi(u.Port())
		if session.SandboxID != sb.ID || session.Token == "" || session.GatewayScheme != "http" ||
			session.GatewayHost != "127.0.0.1" || int(session.GatewayPort) != wantPort ||
			!strings.HasPrefix(session.HostKeyFingerprint, "SHA256:") {
			t.Fatalf("session %v (token set: %v)", session, session.Token != "")
		}
		// The gateway's default TTL: a day.
		if ttl := session.ExpiresAt.Sub(before); ttl <= 0 || ttl > 48*time.Hour {
			t.Fatalf("expires in %v", ttl)
		}

		if !refused(t, forwardWith(t, ctx, anonymous, mine, port, "")) {
			t.Fatal("a token-less client forwarded without a session token")
		}
		fwd := forwardWith(t, ctx, anonymous, mine, port, session.Token)
		if !echoes(t, fwd) || fwd.Stats().ConnectionsFailed != 0 {
			t.Fatalf("the token's own sandbox: %+v", fwd.Stats())
		}
		// Another sandbox: refused for the token-only caller and a user alike.
		if !refused(t, forwardWith(t, ctx, anonymous, other, port, session.Token)) {
			t.Fatal("the token reached another sandbox")
		}
		if !refused(t, forwardWith(t, ctx, user, other, port, session.Token)) {
			t.Fatal("a user's forward with another sandbox's token was let through")
		}

		if revoked, err := user.SSHSessions().Revoke(ctx, session.Token); err != nil || !revoked {
			t.Fatalf("revoke: %v %v", revoked, err)
		}
		if revoked, err := user.SSHSessions().Revoke(ctx, session.Token); err != nil || revoked {
			t.Fatalf("revoking again: %v %v", revoked, err)
		}
		if !refused(t, forwardWith(t, ctx, anonymous, mine, port, session.Token)) {
			t.Fatal("a revoked token still forwards")
		}
		if _, err := anonymous.SSHSessions().Create(ctx, mine); !errors.Is(err, openshell.ErrUnauthenticated) {
			t.Fatalf("a token-only client issued a token: %v", err)
		}
	})

	t.Run("fmt, slog and JSON never show the token", func(t *testing.T) {
		session, err := user.SSHSessions().Create(ctx, mine)
		if err != nil {
			t.Fatal(err)
		}
		defer user.SSHSessions().Revoke(context.Background(), session.Token)
		var texts []string
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%d", "%x", "%T %v"} {
			texts = append(texts, fmt.Sprintf(verb, session), fmt.Sprintf(verb, *session))
		}
		texts = append(texts, fmt.Sprint(session), fmt.Sprintln([]*openshell.SSHSession{session}),
			fmt.Sprintf("%+v", struct{ S openshell.SSHSession }{*session}))
		j, _ := json.Marshal(session)
		texts = append(texts, string(j))
		var buf bytes.Buffer
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("issued", "session", session)
		slog.New(slog.NewTextHandler(&buf, nil)).Info("issued", "session", *session)
		texts = append(texts, buf.String())
		for _, text := range texts {
			if strings.Contains(text, session.Token) {
				t.Fatalf("the token is in %q", text)
			}
		}
		if !strings.Contains(fmt.Sprint(session), session.SandboxID) || !strings.Contains(buf.String(), session.SandboxID) {
			t.Fatalf("the session's fields are missing: %v / %s", session, buf.String())
		}
	})

	t.Run("bad input gets the right error", func(t *testing.T) {
		_, err := user.SSHSessions().Create(ctx, "")
		var e *openshell.Error
		if !errors.Is(err, openshell.ErrInvalidArgument) || !errors.As(err, &e) || e.Code != "invalid_argument" || e.GRPCStatus != 3 {
			t.Fatalf("empty name: %v", err)
		}
		if _, err := user.SSHSessions().Create(ctx, unique("go-no-such")); !errors.Is(err, openshell.ErrNotFound) {
			t.Fatalf("unknown sandbox: %v", err)
		}
		if _, err := user.SSHSessions().Revoke(ctx, ""); !errors.Is(err, openshell.ErrInvalidArgument) {
			t.Fatalf("empty token: %v", err)
		}
		if revoked, err := user.SSHSessions().Revoke(ctx, "not-a-token"); err != nil || revoked {
			t.Fatalf("unknown token: %v %v", revoked, err)
		}
		// A context that already ended: no call is made.
		done, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := user.SSHSessions().Create(done, mine); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled context: %v", err)
		}
	})
}
