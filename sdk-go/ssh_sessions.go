package openshell

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"example.invalid/openshell/sdk-go/proto/openshellv1"
)

const (
	pathCreateSSHSession = "/openshell.v1.OpenShell/CreateSshSession"
	pathRevokeSSHSession = "/openshell.v1.OpenShell/RevokeSshSession"
)

// SSHSession is a token for one sandbox, as CreateSshSession issued it.
//
// Token is a secret: whoever holds it can forward to the sandbox
// (ForwardOptions.SSHSessionToken) without a user token, until ExpiresAt or
// a revoke. The session's fmt verbs (String, GoString, %v, %+v, %#v, %d,
// ...), its slog value and its JSON encoding all leave the token out; read
// the field itself where it is needed.
type SSHSession struct {
	// SandboxID is the sandbox's id.
	SandboxID string
	// Token goes into a forward's ForwardOptions.SSHSessionToken.
	Token string `json:"-"`
	// HostKeyFingerprint is "SHA256:<base64>" of the sandbox's SSH host
	// key (OpenSSH's form): pin it. Empty until its supervisor reports one.
	HostKeyFingerprint string
	// ExpiresAt is when the token stops working; the zero time when it
	// does not expire (only a revoke ends it).
	ExpiresAt time.Time
	// GatewayHost and GatewayPort are the gateway address the session was
	// issued through; GatewayScheme is "http" or "https".
	GatewayHost   string
	GatewayPort   uint16
	GatewayScheme string
}

// String describes the session without its token.
func (s SSHSession) String() string {
	expires := "never"
	if !s.ExpiresAt.IsZero() {
		expires = s.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("SSHSession{SandboxID: %q, Token: <redacted>, HostKeyFingerprint: %q, ExpiresAt: %s, Gateway: %s://%s:%d}",
		s.SandboxID, s.HostKeyFingerprint, expires, s.GatewayScheme, s.GatewayHost, s.GatewayPort)
}

// GoString is String: %#v never shows the token either.
func (s SSHSession) GoString() string { return s.String() }

// Format writes String for every verb, so that no verb (%d, %x, ...)
// falls back to printing the fields one by one.
func (s SSHSession) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, s.String()) }

// LogValue is what log/slog records: the session without its token.
func (s SSHSession) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("sandbox_id", s.SandboxID),
		slog.String("host_key_fingerprint", s.HostKeyFingerprint),
		slog.Time("expires_at", s.ExpiresAt),
		slog.String("gateway_host", s.GatewayHost),
		slog.Int("gateway_port", int(s.GatewayPort)),
		slog.String("gateway_scheme", s.GatewayScheme),
	)
}

// SSHSessions issues and revokes SSH session tokens.
type SSHSessions struct{ c *Client }

// SSHSessions returns the SSH session API.
func (c *Client) SSHSessions() *SSHSessions { return &SSHSessions{c: c} }

// Create issues a token for sandbox (ErrNotFound when there is none,
// ErrInvalidArgument for an empty or malformed name). How long it lives is
// the gateway's setting (ExpiresAt).
func (s *SSHSessions) Create(ctx context.Context, sandbox string) (*SSHSession, error) {
	resp := new(openshellv1.CreateSshSessionResponse)
	req := &openshellv1.CreateSshSessionRequest{Sandbox: sandbox}
	if err := s.c.unaryRaw(ctx, pathCreateSSHSession, req, resp); err != nil {
		return nil, err
	}
	session := &SSHSession{
		SandboxID:          resp.GetSandboxId(),
		Token:              resp.GetToken(),
		HostKeyFingerprint: resp.GetHostKeyFingerprint(),
		GatewayHost:        resp.GetGatewayHost(),
		GatewayScheme:      resp.GetGatewayScheme(),
	}
	if port := resp.GetGatewayPort(); port <= 65535 {
		session.GatewayPort = uint16(port)
	}
	if t := resp.GetExpirationTime(); t != nil {
		session.ExpiresAt = t.AsTime()
	}
	return session, nil
}

// Revoke revokes a token: forwards can no longer open with it. It reports
// whether the token was live; an unknown, expired or already revoked token
// is false, not an error. An empty token is ErrInvalidArgument.
func (s *SSHSessions) Revoke(ctx context.Context, token string) (bool, error) {
	resp := new(openshellv1.RevokeSshSessionResponse)
	if err := s.c.unaryRaw(ctx, pathRevokeSSHSession, &openshellv1.RevokeSshSessionRequest{Token: token}, resp); err != nil {
		return false, err
	}
	return resp.GetRevoked(), nil
}
