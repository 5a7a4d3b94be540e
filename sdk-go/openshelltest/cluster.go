// Package openshelltest starts a real local OpenShell cluster for your own
// tests, with faults on demand: the reference gateway's developer cluster
// (openshell-gateway up) with N replicas behind an edge on a free loopback
// port and a fresh data directory, run by the SDK's core.
//
//	func TestMyService(t *testing.T) {
//		cluster := openshelltest.Start(t) // 3 replicas, stopped by t.Cleanup
//		client := cluster.Client()
//		sandbox, err := client.Sandboxes().Create(ctx, openshell.CreateSandbox{})
//		...
//		owner, _ := cluster.OwnerOf(ctx, sandbox.Name)
//		cluster.KillReplica(ctx, owner) // SIGKILL; its sandboxes move to the others
//	}
//
// Every process of the cluster is stopped by PID when the cluster stops, and
// a test process that dies (even by SIGKILL) takes the cluster with it: the
// cluster's supervisor stops everything when its input from this process
// closes. A clean stop removes the data directory; the logs are kept (their
// directory in the error, Error.Logs) when a start or a stop fails, and
// copied aside when the test failed.
//
// # The executables
//
// The gateway is, in this order: WithGatewayBin's path, the
// OPENSHELL_GATEWAY_BIN variable, the executables a release of this module
// carries for the platform (copied once to a directory under
// os.UserCacheDir, since the module cache keeps no executable bit), then
// openshell-gateway on PATH. Its openshell-supervisor must sit beside it.
package openshelltest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
	"example.invalid/openshell/sdk-go/internal/native"
)

type settings struct {
	replicas, hosts int
	native.ClusterOptions
}

// Option configures a cluster.
type Option func(*settings)

// WithReplicas sets the number of gateway replicas (gw-0, gw-1, ...; at
// least 1; default 3).
func WithReplicas(n int) Option { return func(s *settings) { s.replicas = n } }

// WithHosts runs n shared supervisor hosts (h-0, ...); 0 (the default)
// runs one supervisor process per sandbox.
func WithHosts(n int) Option { return func(s *settings) { s.hosts = n } }

// WithConfigDelivery sets how sandboxes get their configuration: "push"
// (the default) or "poll".
func WithConfigDelivery(mode string) Option {
	return func(s *settings) { s.ConfigDelivery = mode }
}

// WithIsolation sets the sandboxes' isolation: "auto" (the default),
// "namespaces" or "none" (see the gateway's --isolation).
func WithIsolation(isolation string) Option {
	return func(s *settings) { s.Isolation = isolation }
}

// WithRestartCrashed starts a process that died without being told to
// again; off by default, so a test sees a crash.
func WithRestartCrashed(restart bool) Option {
	return func(s *settings) { s.RestartCrashed = restart }
}

// WithGatewayBin names the openshell-gateway executable to run (its
// openshell-supervisor beside it).
func WithGatewayBin(path string) Option { return func(s *settings) { s.GatewayBin = path } }

// Cluster is a running local cluster. Its methods are safe for concurrent
// use; fault orders are carried out one at a time.
type Cluster struct {
	n        *native.LocalCluster
	endpoint string
	dataDir  string
	replicas []string
	hosts    []string
	// t is the test of Start (nil for New).
	t testing.TB

	mu      sync.Mutex
	clients []*openshell.Client
	stopped bool
	cleanup runtime.Cleanup
}

// Start starts a cluster for test t and stops it when t ends (t.Cleanup),
// with the clients of Client. A cluster that cannot start fails t at once;
// the error names the directory of its logs.
func Start(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	c, err := New(context.Background(), opts...)
	if err != nil {
		t.Fatalf("openshelltest: %v", err)
	}
	c.t = t
	t.Cleanup(func() {
		if t.Failed() {
			if dir, err := c.keepLogs(); err == nil {
				t.Logf("openshelltest: the cluster's logs are kept in %s", dir)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("openshelltest: stopping the cluster: %v", err)
		}
	})
	return c
}

// New starts a cluster outside a test (a TestMain sharing one cluster, a
// program); stop it with Stop. It returns once the cluster serves, or when
// ctx ends (a cluster that starts after that is stopped at once).
func New(ctx context.Context, opts ...Option) (*Cluster, error) {
	s := settings{replicas: 3}
	for _, o := range opts {
		o(&s)
	}
	if s.hosts < 0 {
		return nil, &openshell.Error{Code: "invalid_config", GRPCStatus: 3, Message: "hosts must not be negative"}
	}
	// The core judges the count (0 or less: "at least 1").
	s.Replicas = uint32(max(s.replicas, 0))
	s.Hosts = uint32(s.hosts)
	found := s.GatewayBin != ""
	if !found {
		bin, err := findGateway()
		if err != nil {
			return nil, err
		}
		s.GatewayBin, found = bin, bin != ""
	}
	if err := ctx.Err(); err != nil {
		return nil, contextError(err)
	}
	type started struct {
		n   *native.LocalCluster
		err *native.Error
	}
	done := make(chan started, 1)
	go func() {
		n, err := native.StartLocalCluster(s.ClusterOptions)
		done <- started{n, err}
	}()
	var got started
	select {
	case got = <-done:
	case <-ctx.Done():
		go func() {
			if late := <-done; late.n != nil {
				_ = late.n.Close()
				late.n.Free()
			}
		}()
		return nil, contextError(ctx.Err())
	}
	if got.err != nil {
		err := errorOf(got.err)
		if !found && err.Code == "cluster" && err.Logs == "" {
			err.Message = notFound()
		}
		return nil, err
	}
	c := &Cluster{
		n:        got.n,
		endpoint: got.n.Endpoint(),
		dataDir:  got.n.DataDir(),
		replicas: got.n.ReplicaIDs(),
		hosts:    got.n.HostIDs(),
	}
	// The safety net: a cluster dropped without Stop is stopped when
	// collected (the core closes its supervisor's input and waits).
	c.cleanup = runtime.AddCleanup(c, func(n *native.LocalCluster) { n.Free() }, got.n)
	return c, nil
}

// Endpoint is the edge's URL (http://127.0.0.1:PORT): what clients dial.
func (c *Cluster) Endpoint() string { return c.endpoint }

// DataDir is the cluster's data directory (store, sandboxes, logs under
// up/), removed by a clean stop.
func (c *Cluster) DataDir() string { return c.dataDir }

// ReplicaIDs are the replica ids, gw-0, gw-1, ... in order.
func (c *Cluster) ReplicaIDs() []string { return append([]string(nil), c.replicas...) }

// HostIDs are the shared host ids, h-0, ... in order (empty without
// WithHosts).
func (c *Cluster) HostIDs() []string { return append([]string(nil), c.hosts...) }

// Dial makes a client of the edge (owner routing on, as every client),
// closed when the cluster stops.
func (c *Cluster) Dial(ctx context.Context, opts ...openshell.Option) (*openshell.Client, error) {
	client, err := openshell.Dial(ctx, c.endpoint, opts...)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		_ = client.Close()
		return nil, &openshell.Error{Code: "cluster", GRPCStatus: 14, Message: "the cluster is stopped"}
	}
	c.clients = append(c.clients, client)
	return client, nil
}

// Client is Dial for a test: the options are checked before any I/O, so
// an error is a mistake of the caller, and it fails the test of Start
// (t.Fatalf: call it from the test's goroutine; a cluster of New panics
// instead).
func (c *Cluster) Client(opts ...openshell.Option) *openshell.Client {
	client, err := c.Dial(context.Background(), opts...)
	if err != nil {
		if c.t != nil {
			c.t.Helper()
			c.t.Fatalf("openshelltest: a client of the cluster: %v", err)
		}
		panic(fmt.Sprintf("openshelltest: a client of the cluster: %v", err))
	}
	return client
}

// OwnerOf is the replica holding sandbox's supervisor session, as the
// gateway reports it ("" when no replica holds it now, or with one replica).
func (c *Cluster) OwnerOf(ctx context.Context, sandbox string) (string, error) {
	var owner string
	err := c.wait(ctx, func() *native.Error {
		o, err := c.n.OwnerOf(sandbox)
		owner = o
		return err
	})
	return owner, err
}

// StopReplica sends SIGTERM to replica id (its sessions are redirected to
// the others); it stays down until StartReplica.
func (c *Cluster) StopReplica(ctx context.Context, id string) error {
	return c.fault(ctx, native.FaultStopReplica, id)
}

// KillReplica sends SIGKILL to replica id; it stays down until
// StartReplica.
func (c *Cluster) KillReplica(ctx context.Context, id string) error {
	return c.fault(ctx, native.FaultKillReplica, id)
}

// StartReplica starts a stopped or killed replica again on its old ports;
// it returns once the replica serves.
func (c *Cluster) StartReplica(ctx context.Context, id string) error {
	return c.fault(ctx, native.FaultStartReplica, id)
}

// CutRoute makes the edge lose its route to replica id: a call hinted to
// it is answered "not forwarded" (the SDK retries it once, unhinted), and
// unhinted calls go to the other replicas. Streams already open keep
// running; the sandboxes id owns get no new relays until RestoreRoute.
func (c *Cluster) CutRoute(ctx context.Context, id string) error {
	return c.fault(ctx, native.FaultCutRoute, id)
}

// RestoreRoute gives the edge its route to replica id back.
func (c *Cluster) RestoreRoute(ctx context.Context, id string) error {
	return c.fault(ctx, native.FaultRestoreRoute, id)
}

// RestartEdge stops the edge and starts it again: every connection through
// it (clients', supervisors', hosts') breaks and is dialled anew.
func (c *Cluster) RestartEdge(ctx context.Context) error {
	return c.fault(ctx, native.FaultRestartEdge, "")
}

// KillHost sends SIGKILL to shared host id (its sandboxes lose their
// supervisor); it stays down until StartHost.
func (c *Cluster) KillHost(ctx context.Context, id string) error {
	return c.fault(ctx, native.FaultKillHost, id)
}

// StartHost starts a killed host again.
func (c *Cluster) StartHost(ctx context.Context, id string) error {
	return c.fault(ctx, native.FaultStartHost, id)
}

// SlowStore makes every replica's store calls wait delay first (a slow
// database) until RestoreStore; a delay past a call's deadline (5 s) makes
// it fail with ErrUnavailable. The delay is whole milliseconds, at least 1.
func (c *Cluster) SlowStore(ctx context.Context, delay time.Duration) error {
	if delay < time.Millisecond {
		return &openshell.Error{Code: "invalid_config", GRPCStatus: 3,
			Message: fmt.Sprintf("the store delay must be at least 1 ms, not %v", delay)}
	}
	return c.wait(ctx, func() *native.Error { return c.n.SlowStore(delay) })
}

// CutStore makes the store stop answering (a frozen or unreachable
// database): every call that needs it fails with ErrUnavailable after its
// deadline (5 s), naming the store, until RestoreStore.
func (c *Cluster) CutStore(ctx context.Context) error {
	return c.fault(ctx, native.FaultCutStore, "")
}

// RestoreStore ends SlowStore and CutStore.
func (c *Cluster) RestoreStore(ctx context.Context) error {
	return c.fault(ctx, native.FaultRestoreStore, "")
}

// Stop closes the clients of Client and Dial, stops every process of the
// cluster (hosts, the edge and replicas, then the sandbox supervisors) and
// removes the data directory. It fails with ErrCluster, keeping the
// directory (Error.Logs), when the cluster did not stop cleanly. Later
// calls return nil; fault orders after it fail.
//
// When ctx ends first, Stop returns its error and the cluster finishes
// stopping in the background.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	clients := c.clients
	c.clients = nil
	c.mu.Unlock()
	for _, client := range clients {
		_ = client.Close()
	}
	c.cleanup.Stop()
	return c.wait(ctx, func() *native.Error {
		defer c.n.Free()
		return c.n.Close()
	})
}

func (c *Cluster) fault(ctx context.Context, fault uint32, id string) error {
	return c.wait(ctx, func() *native.Error { return c.n.Fault(fault, id) })
}

// wait runs a blocking library call, returning early when ctx ends (the
// call then finishes on its own: an order half carried out is never
// abandoned in the middle, so the next one starts clean).
func (c *Cluster) wait(ctx context.Context, call func() *native.Error) error {
	if err := ctx.Err(); err != nil {
		return contextError(err)
	}
	done := make(chan *native.Error, 1)
	go func() { done <- call() }()
	select {
	case e := <-done:
		runtime.KeepAlive(c)
		if e == nil {
			return nil
		}
		return errorOf(e)
	case <-ctx.Done():
		return contextError(ctx.Err())
	}
}

// keepLogs copies the cluster's logs (up's, every process's, every
// sandbox's) to a new directory that outlives the stop.
func (c *Cluster) keepLogs() (string, error) {
	dir, err := os.MkdirTemp("", "openshell-cluster-logs-")
	if err != nil {
		return "", err
	}
	err = filepath.WalkDir(c.dataDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(c.dataDir, path)
		if filepath.Ext(path) != ".log" && filepath.Base(path) != "status.json" {
			return nil
		}
		return copyFile(path, filepath.Join(dir, rel), 0o644)
	})
	return dir, err
}

func copyFile(from, to string, mode os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func errorOf(e *native.Error) *openshell.Error {
	return &openshell.Error{
		Code:       e.Code,
		GRPCStatus: openshell.GRPCCode(e.GRPCStatus),
		Message:    e.Message,
		Retryable:  e.Retryable,
		ServedBy:   e.ServedBy,
		Logs:       e.Logs,
	}
}

func contextError(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return &openshell.Error{Code: "deadline_exceeded", GRPCStatus: 4, Message: "the context's deadline passed"}
	}
	return &openshell.Error{Code: "cancelled", GRPCStatus: 1, Message: "the context was cancelled"}
}
