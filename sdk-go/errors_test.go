package openshell_test

// Every bad-input row of the conformance list (conformance/scenarios.json,
// group "errors") through the Go client, checked with errors.Is and
// errors.As.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
)

func requireCode(t *testing.T, err error, sentinel error, code string) *openshell.Error {
	t.Helper()
	var e *openshell.Error
	if !errors.As(err, &e) {
		t.Fatalf("want an *openshell.Error (%s), got %v", code, err)
	}
	if !errors.Is(err, sentinel) || e.Code != code {
		t.Fatalf("want %s (%v), got %v", code, sentinel, err)
	}
	return e
}

func TestBadInput(t *testing.T) {
	c := newClient(t)
	main := readySandbox(t, c, "go-errors", nil)
	ctx := testContext(t, 60*time.Second)
	sb := c.Sandboxes()

	t.Run("create", func(t *testing.T) {
		_, err := sb.Create(ctx, openshell.CreateSandbox{Name: "Upper_Case"})
		requireCode(t, err, openshell.ErrInvalidArgument, "invalid_argument")
		_, err = sb.Create(ctx, openshell.CreateSandbox{Name: "cf-bad-env", Environment: map[string]string{"NOT-AN-ID": "s3cr3t-value"}})
		e := requireCode(t, err, openshell.ErrInvalidArgument, "invalid_argument")
		if strings.Contains(e.Error(), "s3cr3t-value") {
			t.Fatal("the error echoes an environment value")
		}
		_, err = sb.Create(ctx, openshell.CreateSandbox{Name: main})
		requireCode(t, err, openshell.ErrAlreadyExists, "already_exists")
	})

	t.Run("get, delete, list", func(t *testing.T) {
		_, err := sb.Get(ctx, "cf-no-such-sandbox")
		e := requireCode(t, err, openshell.ErrNotFound, "not_found")
		if e.GRPCStatus != 5 || e.GRPCCode() != 5 {
			t.Fatalf("grpc status %d", e.GRPCStatus)
		}
		if e.ServedBy == "" {
			t.Fatal("a gateway error does not name the replica that served it")
		}
		_, err = sb.Get(ctx, "")
		requireCode(t, err, openshell.ErrInvalidArgument, "invalid_argument")
		_, err = sb.Delete(ctx, "cf-no-such-sandbox")
		requireCode(t, err, openshell.ErrNotFound, "not_found")
		_, err = sb.List(ctx, openshell.ListOptions{LabelSelector: "novalue"})
		requireCode(t, err, openshell.ErrInvalidArgument, "invalid_argument")
	})

	t.Run("raw list with a negative page size", func(t *testing.T) {
		_, err := c.Raw().ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{PageSize: -1})
		requireCode(t, err, openshell.ErrInvalidArgument, "invalid_argument")
	})

	t.Run("raw exec with an empty command", func(t *testing.T) {
		s, err := c.Raw().ExecSandbox(ctx, &openshellv1.ExecSandboxRequest{Sandbox: main})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		_, err = s.Recv()
		requireCode(t, err, openshell.ErrInvalidArgument, "invalid_argument")
	})

	t.Run("exec", func(t *testing.T) {
		_, err := c.Exec(ctx, openshell.ExecRequest{Sandbox: "cf-no-such-sandbox", Command: []string{"true"}})
		requireCode(t, err, openshell.ErrNotFound, "not_found")
		_, err = c.Exec(ctx, openshell.ExecRequest{Sandbox: main})
		requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
		_, err = c.Exec(ctx, openshell.ExecRequest{Sandbox: main, Command: []string{"true"}, Environment: map[string]string{"1X": "hidden-value"}})
		e := requireCode(t, err, openshell.ErrInvalidArgument, "invalid_argument")
		if strings.Contains(e.Error(), "hidden-value") {
			t.Fatal("the error echoes an environment value")
		}
		_, err = c.Exec(ctx, openshell.ExecRequest{Sandbox: main, Command: []string{"cat"}, Stdin: make([]byte, 9<<20)})
		var big *openshell.Error
		if !errors.As(err, &big) || (big.Code != "resource_exhausted" && big.Code != "out_of_range") {
			t.Fatalf("oversized request: %v", err)
		}
	})

	t.Run("forward without a port", func(t *testing.T) {
		_, err := c.Forward(ctx, main, 0)
		requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
	})

	t.Run("client: bad endpoint, unreachable endpoint", func(t *testing.T) {
		_, err := openshell.Dial(context.Background(), "ftp://127.0.0.1:1")
		requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
		u, err := openshell.Dial(context.Background(), "http://127.0.0.1:1")
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		_, err = u.Health(ctx)
		e := requireCode(t, err, openshell.ErrUnavailable, "connect")
		if !e.Retryable {
			t.Fatal("a connect error is not retryable")
		}
	})

	t.Run("options", func(t *testing.T) {
		_, err := openshell.Dial(context.Background(), clusterEndpoint, openshell.WithCA([]byte("not pem")))
		requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
		_, err = openshell.Dial(context.Background(), clusterEndpoint, openshell.WithExecOutputLimit(0))
		requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
		_, err = openshell.Dial(context.Background(), clusterEndpoint, openshell.WithConnectTimeout(-time.Second))
		requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
	})
}
