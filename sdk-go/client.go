package openshell

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"runtime"
	"time"

	"example.invalid/openshell/sdk-go/internal/native"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
	"google.golang.org/protobuf/proto"
)

// Token is what a TokenProvider returns.
type Token struct {
	// Value is the bearer token.
	Value string
	// ExpiresIn is its lifetime, when known (the core refreshes before it ends).
	ExpiresIn time.Duration
}

// TokenProvider returns a bearer token; forceRefresh is set after the
// gateway refused the cached one. The core calls it single-flight: one
// call at a time however many calls need a token. Return an error to fail
// the calls waiting for it (wrap ErrUnavailable to mark it retryable).
type TokenProvider func(ctx context.Context, forceRefresh bool) (Token, error)

type settings struct {
	native.Options
	providerTimeout time.Duration
	provider        TokenProvider
}

// Option configures Dial.
type Option func(*settings) error

// WithToken sets a static bearer token.
func WithToken(token string) Option {
	return func(s *settings) error { s.Token = token; return nil }
}

// WithTokenProvider sets a function the core calls for tokens.
func WithTokenProvider(p TokenProvider) Option {
	return func(s *settings) error { s.provider = p; return nil }
}

// WithCA trusts the PEM certificates in pem for the gateway's certificate.
func WithCA(pemBytes []byte) Option {
	return func(s *settings) error {
		block, _ := pem.Decode(pemBytes)
		if block == nil {
			return invalid("the CA is not PEM")
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return invalid("the CA certificate does not parse: %v", err)
		}
		s.CAPEM = pemBytes
		return nil
	}
}

// WithTLSServerName sets the name checked on the gateway's certificate.
func WithTLSServerName(name string) Option {
	return func(s *settings) error { s.TLSServerName = name; return nil }
}

// WithConnectTimeout bounds connection setup.
func WithConnectTimeout(d time.Duration) Option {
	return func(s *settings) error {
		if d <= 0 {
			return invalid("connect timeout must be positive")
		}
		s.ConnectTimeout = d
		return nil
	}
}

// WithDefaultTimeout is the deadline of unary calls whose context has
// none; 0 means none.
func WithDefaultTimeout(d time.Duration) Option {
	return func(s *settings) error {
		switch {
		case d < 0:
			return invalid("default timeout must not be negative")
		case d == 0:
			s.NoDefaultTimeout = true
		default:
			s.DefaultTimeout = d
		}
		return nil
	}
}

// WithExecOutputLimit caps the output Exec collects (bytes).
func WithExecOutputLimit(n int) Option {
	return func(s *settings) error {
		if n <= 0 {
			return invalid("exec output limit must be positive")
		}
		s.ExecOutputLimit = uint64(n)
		return nil
	}
}

// WithCleartextToken allows sending a token over http:// (loopback
// development only).
func WithCleartextToken() Option {
	return func(s *settings) error { s.AllowCleartextToken = true; return nil }
}

// Client is a connection to an OpenShell gateway (or cluster). Safe for
// concurrent use; share one per process.
type Client struct {
	n        *native.Client
	endpoint string
	cleanup  runtime.Cleanup
}

// DefaultEndpoint is what `make up` serves.
const DefaultEndpoint = "http://127.0.0.1:17670"

// Dial builds a client for endpoint (http://host:port or https://host:port).
// Connections are made lazily; ctx bounds nothing today but is kept for
// symmetry and future eager checks.
func Dial(ctx context.Context, endpoint string, opts ...Option) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := settings{Options: native.Options{Endpoint: endpoint}}
	for _, o := range opts {
		if err := o(&s); err != nil {
			return nil, err
		}
	}
	if s.provider != nil {
		provider := s.provider
		s.TokenProvider = func(force bool) native.TokenAnswer {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tok, err := provider(ctx, force)
			if err != nil {
				// The message of a provider's error is the provider's; it
				// must not carry the token.
				var e *Error
				retry := false
				if asError(err, &e) {
					retry = e.Retryable
				}
				return native.TokenAnswer{Error: err.Error(), Retryable: retry || isUnavailable(err)}
			}
			ms := uint64(0)
			if tok.ExpiresIn > 0 {
				ms = uint64(max(tok.ExpiresIn.Milliseconds(), 1))
			}
			return native.TokenAnswer{Token: tok.Value, ExpiresInMillis: ms}
		}
	}
	n, nerr := native.NewClient(s.Options)
	if nerr != nil {
		return nil, fromNative(nerr)
	}
	c := &Client{n: n, endpoint: endpoint}
	// The safety net: a client dropped without Close is freed when collected.
	c.cleanup = runtime.AddCleanup(c, func(n *native.Client) { n.Free() }, n)
	return c, nil
}

// DialFromEnv dials OPENSHELL_ENDPOINT (default DefaultEndpoint) with
// OPENSHELL_TOKEN when set; opts are applied after.
func DialFromEnv(ctx context.Context, opts ...Option) (*Client, error) {
	endpoint := os.Getenv("OPENSHELL_ENDPOINT")
	if endpoint == "" {
		endpoint = DefaultEndpoint
	}
	if tok := os.Getenv("OPENSHELL_TOKEN"); tok != "" {
		opts = append([]Option{WithToken(tok)}, opts...)
	}
	return Dial(ctx, endpoint, opts...)
}

// Endpoint is the endpoint the client was dialled with.
func (c *Client) Endpoint() string { return c.endpoint }

// Close cancels every call, stream and forward of the client and releases
// it. Later calls fail with an error matching ErrClosed. Idempotent.
func (c *Client) Close() error {
	c.cleanup.Stop()
	c.n.Free()
	return nil
}

// RoutingStats are the core's owner-routing counters.
type RoutingStats struct {
	// Hinted counts owner-routed attempts sent with a replica hint.
	Hinted uint64
	// Unhinted counts owner-routed attempts sent without one.
	Unhinted uint64
	// UnroutedRetries counts hinted attempts that never reached a gateway
	// and were retried unhinted.
	UnroutedRetries uint64
	// OwnerLookups counts GetSandbox owner lookups.
	OwnerLookups uint64
	// CacheHits counts attempts answered from the owner cache.
	CacheHits uint64
}

// RoutingStats reads the owner-routing counters.
func (c *Client) RoutingStats() RoutingStats {
	s := c.n.RoutingStats()
	return RoutingStats{s.Hinted, s.Unhinted, s.UnroutedRetries, s.OwnerLookups, s.CacheHits}
}

// Health is the answer of Health.
type Health struct {
	// Status is SERVING, NOT_SERVING, ... (the enum name without prefix).
	Status  string
	Version string
}

// Health asks the replica that answers whether it serves.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	resp := new(openshellv1.HealthResponse)
	if err := c.unary(ctx, native.OpHealth, &openshellv1.HealthRequest{}, resp, 0); err != nil {
		return nil, err
	}
	return &Health{Status: trimEnum(resp.GetStatus().String(), "SERVICE_STATUS_"), Version: resp.GetVersion()}, nil
}

// callOpts turns a context into call options: its deadline becomes the
// call's, its cancellation cancels the call in the core. release must run
// once the call completed.
func callOpts(ctx context.Context, outputLimit uint64) (native.CallOpts, func()) {
	o := native.CallOpts{OutputLimit: outputLimit}
	if dl, ok := ctx.Deadline(); ok {
		o.Timeout = max(time.Until(dl), time.Millisecond)
	}
	if ctx.Done() == nil {
		return o, func() {}
	}
	tok := native.NewCancel()
	o.Cancel = tok
	stop := context.AfterFunc(ctx, tok.Cancel)
	return o, func() {
		stop()
		tok.Free()
	}
}

// done is the error of a completion (nil on success). A call that failed
// because its context ended matches context.Canceled or
// context.DeadlineExceeded through errors.Is.
//
// Every call runs it after its native call returned, which keeps c
// reachable until then: without it, a Client whose last use is the call
// could be collected during it, and its cleanup would close the client
// under the call.
func (c *Client) done(ctx context.Context, comp native.Completion) error {
	runtime.KeepAlive(c)
	if comp.Status != native.StatusError {
		return nil
	}
	return errorIn(ctx, comp.Err)
}

// errorIn is the SDK error of a failed call under ctx: a call cancelled
// because ctx's deadline passed reports deadline_exceeded (the core and
// the context's own timer race for the same instant).
func errorIn(ctx context.Context, e *native.Error) *Error {
	out := fromNative(e)
	if out.Code == "cancelled" && !out.closed && ctx.Err() == context.DeadlineExceeded {
		out.Code, out.GRPCStatus = "deadline_exceeded", 4
		out.Message = "the context's deadline passed"
	}
	return out
}

// unary runs a curated operation with a proto request and response.
func (c *Client) unary(ctx context.Context, op uint32, req, resp proto.Message, outputLimit uint64) error {
	if err := ctx.Err(); err != nil {
		return contextError(err)
	}
	body, err := proto.Marshal(req)
	if err != nil {
		return invalid("encoding the request: %v", err)
	}
	o, release := callOpts(ctx, outputLimit)
	comp := c.n.Unary(op, body, o)
	release()
	if err := c.done(ctx, comp); err != nil {
		return err
	}
	if resp != nil {
		if err := proto.Unmarshal(comp.Value, resp); err != nil {
			return &Error{Code: "protocol", GRPCStatus: 13, Message: "decoding the response: " + err.Error()}
		}
	}
	return nil
}

// pathGetSandbox is the method path of GetSandbox.
const pathGetSandbox = "/openshell.v1.OpenShell/GetSandbox"

// unaryRaw runs a curated call that is one plain RPC through the core's raw
// byte path: the request and response cross the C boundary encoded once,
// with no decoding and re-encoding in the library (which curated
// operations made of several calls, or with their own logic in the core,
// need). Deadlines, tokens and cancellation are the core's, as for unary.
// The response metadata is left out.
func (c *Client) unaryRaw(ctx context.Context, path string, req, resp proto.Message) error {
	if err := ctx.Err(); err != nil {
		return contextError(err)
	}
	body, err := proto.Marshal(req)
	if err != nil {
		return invalid("encoding the request: %v", err)
	}
	o, release := callOpts(ctx, 0)
	comp := c.n.RawUnaryAny(path, body, nil, false, o)
	release()
	if err := c.done(ctx, comp); err != nil {
		return err
	}
	if err := proto.Unmarshal(comp.Value, resp); err != nil {
		return &Error{Code: "protocol", GRPCStatus: 13, Message: "decoding the response: " + err.Error()}
	}
	return nil
}

// contextError is the SDK error of a context that ended before the call.
func contextError(err error) error {
	if err == context.DeadlineExceeded {
		return &Error{Code: "deadline_exceeded", GRPCStatus: 4, Message: "the context's deadline passed before the call"}
	}
	return &Error{Code: "cancelled", GRPCStatus: 1, Message: "the context was cancelled before the call"}
}

func trimEnum(name, prefix string) string {
	if len(name) > len(prefix) && name[:len(prefix)] == prefix {
		return name[len(prefix):]
	}
	return name
}
