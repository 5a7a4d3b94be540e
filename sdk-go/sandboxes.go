package openshell

import (
	"context"
	"iter"
	"maps"

	"example.invalid/openshell/sdk-go/internal/native"
	"example.invalid/openshell/sdk-go/proto/openshellv1"
	"google.golang.org/protobuf/proto"
)

// Phase is a sandbox's lifecycle phase: "PROVISIONING", "READY", "ERROR",
// "DELETING", ... (the proto enum name without its prefix).
type Phase string

// Phases a caller usually checks.
const (
	PhaseProvisioning Phase = "PROVISIONING"
	PhaseReady        Phase = "READY"
	PhaseError        Phase = "ERROR"
	PhaseDeleting     Phase = "DELETING"
	PhaseCompleted    Phase = "COMPLETED"
)

// Sandbox is a sandbox as the gateway reported it: the common fields, and
// the full message in Proto.
type Sandbox struct {
	ID              string
	Name            string
	Phase           Phase
	Labels          map[string]string
	ResourceVersion uint64
	// ExitCode is set once the main process ended.
	ExitCode *int32
	Proto    *openshellv1.Sandbox
}

func sandboxOf(p *openshellv1.Sandbox) *Sandbox {
	meta := p.GetMetadata()
	s := &Sandbox{
		ID:              meta.GetId(),
		Name:            meta.GetName(),
		Phase:           Phase(trimEnum(p.GetStatus().GetPhase().String(), "SANDBOX_PHASE_")),
		Labels:          maps.Clone(meta.GetLabels()),
		ResourceVersion: meta.GetResourceVersion(),
		Proto:           p,
	}
	if p.GetStatus() != nil && p.GetStatus().ExitCode != nil {
		code := p.GetStatus().GetExitCode()
		s.ExitCode = &code
	}
	return s
}

// CreateSandbox describes a sandbox to create. The zero value asks for a
// generated name and the gateway's default image.
type CreateSandbox struct {
	Name        string
	Image       string
	Environment map[string]string
	// Command is the main process (argv, no shell parsing).
	Command []string
	Labels  map[string]string
	TTY     bool
	// RequestID makes retries of the same create idempotent; generated when empty.
	RequestID string
}

// ListOptions filter List.
type ListOptions struct {
	// LabelSelector is "key=value,key2=value2".
	LabelSelector string
	// PageSize is the page size used while fetching every page.
	PageSize int32
}

// Sandboxes is the sandbox lifecycle API of a client.
type Sandboxes struct{ c *Client }

// Sandboxes returns the sandbox API.
func (c *Client) Sandboxes() *Sandboxes { return &Sandboxes{c: c} }

// Create creates a sandbox; it is usually PROVISIONING when this returns
// (see WaitReady).
func (s *Sandboxes) Create(ctx context.Context, spec CreateSandbox) (*Sandbox, error) {
	req := &openshellv1.CreateSandboxRequest{
		Name:      spec.Name,
		Labels:    spec.Labels,
		RequestId: spec.RequestID,
		Spec: &openshellv1.SandboxSpec{
			Environment: spec.Environment,
			Command:     spec.Command,
			Tty:         spec.TTY,
			Template:    &openshellv1.SandboxTemplate{Image: spec.Image},
		},
	}
	return s.sandbox(ctx, native.OpCreate, req)
}

func (s *Sandboxes) sandbox(ctx context.Context, op uint32, req proto.Message) (*Sandbox, error) {
	resp := new(openshellv1.Sandbox)
	if err := s.c.unary(ctx, op, req, resp, 0); err != nil {
		return nil, err
	}
	return sandboxOf(resp), nil
}

// Get returns a sandbox by name (ErrNotFound when there is none).
func (s *Sandboxes) Get(ctx context.Context, name string) (*Sandbox, error) {
	resp := new(openshellv1.SandboxResponse)
	if err := s.c.unaryRaw(ctx, pathGetSandbox, &openshellv1.GetSandboxRequest{Name: name}, resp); err != nil {
		return nil, err
	}
	if resp.GetSandbox() == nil {
		return nil, &Error{Code: "protocol", GRPCStatus: 13, Message: pathGetSandbox + ": answer without a sandbox"}
	}
	return sandboxOf(resp.GetSandbox()), nil
}

// List returns every sandbox that matches (all pages).
func (s *Sandboxes) List(ctx context.Context, opts ListOptions) ([]*Sandbox, error) {
	resp := new(openshellv1.ListSandboxesResponse)
	req := &openshellv1.ListSandboxesRequest{LabelSelector: opts.LabelSelector, PageSize: opts.PageSize}
	if err := s.c.unary(ctx, native.OpList, req, resp, 0); err != nil {
		return nil, err
	}
	out := make([]*Sandbox, 0, len(resp.GetSandboxes()))
	for _, p := range resp.GetSandboxes() {
		out = append(out, sandboxOf(p))
	}
	return out, nil
}

// DeletionOutcome is what Delete did: "COMPLETED", "ACCEPTED" or
// "ALREADY_ABSENT".
type DeletionOutcome string

// Delete deletes a sandbox (see WaitDeleted).
func (s *Sandboxes) Delete(ctx context.Context, name string) (DeletionOutcome, error) {
	resp := new(openshellv1.DeleteSandboxResponse)
	if err := s.c.unary(ctx, native.OpDelete, &openshellv1.DeleteSandboxRequest{Name: name}, resp, 0); err != nil {
		return "", err
	}
	return DeletionOutcome(trimEnum(resp.GetOutcome().String(), "DELETION_OUTCOME_")), nil
}

// WaitReady waits until the sandbox is READY; an error matching
// ErrFailedPrecondition when it failed instead.
func (s *Sandboxes) WaitReady(ctx context.Context, name string) (*Sandbox, error) {
	return s.sandbox(ctx, native.OpWaitReady, &openshellv1.GetSandboxRequest{Name: name})
}

// WaitDeleted waits until the sandbox is gone.
func (s *Sandboxes) WaitDeleted(ctx context.Context, name string) error {
	return s.c.unary(ctx, native.OpWaitDeleted, &openshellv1.GetSandboxRequest{Name: name}, nil, 0)
}

// Watch streams snapshots of one sandbox as it changes, starting with the
// current one. Stop it with Close (or by cancelling ctx).
func (s *Sandboxes) Watch(ctx context.Context, name string) (*Watch, error) {
	st, err := s.c.open(ctx, native.StreamWatch, &openshellv1.GetSandboxRequest{Name: name}, 0)
	if err != nil {
		return nil, err
	}
	return &Watch{s: st}, nil
}

// Watch is a stream of sandbox snapshots.
type Watch struct{ s *stream }

// Recv returns the next snapshot; io.EOF when the watch ended.
func (w *Watch) Recv() (*Sandbox, error) {
	b, err := w.s.recv()
	if err != nil {
		return nil, err
	}
	p := new(openshellv1.Sandbox)
	if err := proto.Unmarshal(b, p); err != nil {
		return nil, &Error{Code: "protocol", GRPCStatus: 13, Message: "decoding a snapshot: " + err.Error()}
	}
	return sandboxOf(p), nil
}

// All ranges over the snapshots; the error, if any, is the last pair.
func (w *Watch) All() iter.Seq2[*Sandbox, error] {
	return func(yield func(*Sandbox, error) bool) {
		for {
			s, err := w.Recv()
			if isEOF(err) {
				return
			}
			if !yield(s, err) || err != nil {
				return
			}
		}
	}
}

// Close stops the watch. Idempotent.
func (w *Watch) Close() error { w.s.close(); return nil }
