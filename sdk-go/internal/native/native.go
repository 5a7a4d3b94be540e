// Package native is the cgo layer of sdk-go over the OpenShell C ABI
// (bindings/c). It is the only package that imports "C"; everything it
// exports is plain Go. The rules it keeps (see openshell.h):
//
//   - inputs are borrowed for the call only: Go memory is passed by value
//     (pointer + length) and copied by the library before the export
//     returns, so no Go pointer is retained by C;
//   - every async export completes exactly once, through the library's
//     completion queue (queue.go; openshellGoComplete where the queue is
//     unavailable); the goroutine waiting on the completion's channel is
//     released by it, also when the call is cancelled; a unary call alone
//     in flight runs on its caller's thread instead (inline.go);
//   - every handle the library returns is freed exactly once by its Free
//     method.
package native

/*
#cgo CFLAGS: -I${SRCDIR}
#include "openshell.h"

extern void openshellGoComplete(size_t, OsCompletion*);
extern void openshellGoToken(size_t, bool, OsTokenReply*);
extern void openshellGoApply(size_t, OsBytes, int32_t, OsApplyReply*);
extern void openshellGoHostApply(size_t, OsBytes, OsBytes, OsApplyReply*);

static OsCallback os_complete_cb(void) { return (OsCallback)openshellGoComplete; }
static OsCallback os_queue_cb(void) { return (OsCallback)openshell_queue_complete; }
static OsTokenCallback os_token_cb(void) { return (OsTokenCallback)openshellGoToken; }
static OsApplyCallback os_apply_cb(void) { return (OsApplyCallback)openshellGoApply; }
static OsHostApplyCallback os_host_apply_cb(void) { return (OsHostApplyCallback)openshellGoHostApply; }
*/
import "C"

import (
	"runtime/cgo"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Completion statuses.
const (
	StatusOK    = int(C.OS_OK)
	StatusEnd   = int(C.OS_END)
	StatusError = int(C.OS_ERROR)
)

// Operations of Client.Call.
const (
	OpHealth      = uint32(C.OS_OP_HEALTH)
	OpCreate      = uint32(C.OS_OP_CREATE)
	OpGet         = uint32(C.OS_OP_GET)
	OpList        = uint32(C.OS_OP_LIST)
	OpDelete      = uint32(C.OS_OP_DELETE)
	OpWaitReady   = uint32(C.OS_OP_WAIT_READY)
	OpWaitDeleted = uint32(C.OS_OP_WAIT_DELETED)
	OpExec        = uint32(C.OS_OP_EXEC)
)

// Stream kinds of Client.Open.
const (
	StreamWatch       = uint32(C.OS_STREAM_WATCH)
	StreamExec        = uint32(C.OS_STREAM_EXEC)
	StreamInteractive = uint32(C.OS_STREAM_INTERACTIVE)
)

// Error is an error as the library reports it.
type Error struct {
	Code       string
	Message    string
	ServedBy   string
	GRPCStatus int
	Retryable  bool
	// Closed is set when the call failed because its client (or the
	// handle it used) was closed, before or while it ran.
	Closed bool
	// Logs is the directory of a local cluster's kept logs (code cluster).
	Logs string
}

// Completion is a copied OsCompletion.
type Completion struct {
	Status   int
	Value    []byte
	Handle   unsafe.Pointer
	ServedBy string
	// metadata is the response metadata of a raw unary call as the
	// library sends it (`key \0 value \0` pairs), split by Metadata only
	// when asked for.
	metadata string
	Err      *Error
}

// Metadata is the response metadata of a raw unary call, in the order
// received.
func (c Completion) Metadata() [][2]string {
	if c.metadata == "" {
		return nil
	}
	return splitPairs(c.metadata)
}

func splitPairs(s string) [][2]string {
	parts := strings.Split(strings.TrimSuffix(s, "\x00"), "\x00")
	out := make([][2]string, 0, len(parts)/2)
	for i := 0; i+1 < len(parts); i += 2 {
		out = append(out, [2]string{parts[i], parts[i+1]})
	}
	return out
}

func bytesOf(b []byte) C.OsBytes {
	if len(b) == 0 {
		return C.OsBytes{}
	}
	return C.OsBytes{ptr: (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(b))), len: C.size_t(len(b))}
}

func stringOf(s string) C.OsBytes {
	if len(s) == 0 {
		return C.OsBytes{}
	}
	return C.OsBytes{ptr: (*C.uint8_t)(unsafe.Pointer(unsafe.StringData(s))), len: C.size_t(len(s))}
}

func goString(b C.OsBytes) string {
	if b.len == 0 || b.ptr == nil {
		return ""
	}
	return C.GoStringN((*C.char)(unsafe.Pointer(b.ptr)), C.int(b.len))
}

func errorOf(e C.OsError) *Error {
	return &Error{
		Code:       goString(e.code),
		Message:    goString(e.message),
		ServedBy:   goString(e.served_by),
		GRPCStatus: int(e.grpc_status),
		Retryable:  bool(e.retryable),
		Logs:       goString(e.logs),
	}
}

// Version is the library's version.
func Version() string { return goString(C.openshell_version()) }

// rejected is the completion of an export that refused its arguments.
func rejected(status C.int32_t) Completion {
	code, msg := "invalid_config", "the OpenShell library refused the call (closed handle?)"
	if int(status) == int(C.OS_PANIC) {
		code, msg = "panic", "the OpenShell library panicked"
	}
	return Completion{Status: StatusError, Err: &Error{Code: code, Message: msg, GRPCStatus: 13}}
}

// completionCallback is the callback every async export gets: the
// completion queue's (queue.go), else openshellGoComplete.
func completionCallback() C.OsCallback {
	if queueStarted() {
		return C.os_queue_cb()
	}
	return C.os_complete_cb()
}

// await runs start with a fresh completion slot and waits for the
// completion. The library fires the callback exactly once when start
// returns OS_OK, and never otherwise.
func await(start func(cb C.OsCallback, ud C.size_t) C.int32_t) Completion {
	ch := make(chan Completion, 1)
	h := cgo.NewHandle(ch)
	if st := start(completionCallback(), C.size_t(h)); st != C.OS_OK {
		h.Delete()
		return rejected(st)
	}
	return <-ch
}

// Cancel is a cancellation token, safe to cancel and free concurrently.
type Cancel struct {
	mu sync.Mutex
	p  *C.OsCancel
}

// NewCancel makes a token.
func NewCancel() *Cancel { return &Cancel{p: C.openshell_cancel_new()} }

// Cancel cancels every call that took the token (no-op once freed).
func (c *Cancel) Cancel() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p != nil {
		C.openshell_cancel_cancel(c.p)
	}
}

// Free releases the token (calls that took it keep their reference).
func (c *Cancel) Free() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p != nil {
		C.openshell_cancel_free(c.p)
		c.p = nil
	}
}

// CallOpts are the per-call options.
type CallOpts struct {
	Timeout     time.Duration
	Cancel      *Cancel
	OutputLimit uint64
}

func (o CallOpts) c() C.OsCallOptions {
	var out C.OsCallOptions
	if o.Timeout > 0 {
		ms := o.Timeout.Milliseconds()
		if ms < 1 {
			ms = 1
		}
		out.timeout_ms = C.uint64_t(ms)
	}
	if o.Cancel != nil {
		// The token is read during the call only; the caller frees it after
		// the completion.
		out.cancel = o.Cancel.p
	}
	out.output_limit = C.uint64_t(o.OutputLimit)
	return out
}

// TokenAnswer is what a token provider returns.
type TokenAnswer struct {
	Token           string
	ExpiresInMillis uint64
	Error           string
	Retryable       bool
}

// TokenFunc is called when the core needs a token.
type TokenFunc func(forceRefresh bool) TokenAnswer

var (
	providers      sync.Map // uintptr -> TokenFunc
	nextProviderID atomic.Uintptr
)

func answerToken(reply *C.OsTokenReply, token string, expires uint64, errText string, retryable bool) {
	C.openshell_token_reply(reply, stringOf(token), C.uint64_t(expires), stringOf(errText), C.bool(retryable))
}

// Options configure a client.
type Options struct {
	Endpoint            string
	Token               string
	CAPEM               []byte
	TLSServerName       string
	ConnectTimeout      time.Duration
	DefaultTimeout      time.Duration // 0: the library default
	NoDefaultTimeout    bool
	ExecOutputLimit     uint64
	AllowCleartextToken bool
	TokenProvider       TokenFunc
}

// Client is a library client.
type Client struct {
	mu         sync.RWMutex
	p          *C.OsClient
	providerID uintptr
	// closed is set by Close before it cancels: a call it cancels reports
	// the close, not a plain cancellation.
	closed atomic.Bool
}

// NewClient builds a client (no I/O).
func NewClient(o Options) (*Client, *Error) {
	var opts C.OsClientOptions
	opts.endpoint = stringOf(o.Endpoint)
	opts.token = stringOf(o.Token)
	opts.ca_pem = bytesOf(o.CAPEM)
	opts.tls_server_name = stringOf(o.TLSServerName)
	opts.connect_timeout_ms = C.uint64_t(o.ConnectTimeout.Milliseconds())
	switch {
	case o.NoDefaultTimeout:
		opts.default_timeout_ms = -1
	case o.DefaultTimeout > 0:
		opts.default_timeout_ms = C.int64_t(max(o.DefaultTimeout.Milliseconds(), 1))
	}
	opts.exec_output_limit = C.uint64_t(o.ExecOutputLimit)
	opts.allow_cleartext_token = C.bool(o.AllowCleartextToken)
	var id uintptr
	if o.TokenProvider != nil {
		id = nextProviderID.Add(1)
		providers.Store(id, o.TokenProvider)
		opts.token_provider = C.os_token_cb()
		opts.token_provider_data = C.size_t(id)
	}
	var out *C.OsClient
	var cerr *C.OsErrorBox
	st := C.openshell_client_new(opts, &out, &cerr)
	if st != C.OS_OK {
		if id != 0 {
			providers.Delete(id)
		}
		if cerr != nil {
			e := errorOf(C.openshell_error_view(cerr))
			C.openshell_error_free(cerr)
			return nil, e
		}
		return nil, rejected(st).Err
	}
	return &Client{p: out, providerID: id}, nil
}

// Close cancels every call, stream and forward of the client.
func (c *Client) Close() {
	c.closed.Store(true)
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.p != nil {
		C.openshell_client_close(c.p)
	}
}

// Free closes and frees the client; later calls fail as closed. It
// cancels first, so calls in flight complete as closed; an export holds the
// read lock only while it starts a call.
func (c *Client) Free() {
	c.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p != nil {
		C.openshell_client_free(c.p)
		c.p = nil
		if c.providerID != 0 {
			providers.Delete(c.providerID)
		}
	}
}

// closedErr is the completion of a call on a closed client or handle.
func closedErr(what string) Completion {
	return Completion{Status: StatusError, Err: &Error{Code: "cancelled", Message: "the " + what + " is closed", GRPCStatus: 1, Closed: true}}
}

// closedDuring marks the error of a call that a Close cancelled while it
// ran (closed tells whether a Close ran).
func closedDuring(comp Completion, closed bool, what string) Completion {
	if closed && comp.Status == StatusError && comp.Err.Code == "cancelled" {
		comp.Err.Closed = true
		comp.Err.Message = "the " + what + " was closed during the call"
	}
	return comp
}

// settle marks a call that failed because the client was closed.
func (c *Client) settle(comp Completion) Completion {
	return closedDuring(comp, c.closed.Load(), "client")
}

// start runs an async export with the client pointer held, so Free
// cannot race the export itself, and waits for its completion. The library
// copies what it needs before the export returns.
func (c *Client) start(f func(p *C.OsClient, cb C.OsCallback, ud C.size_t) C.int32_t) Completion {
	c.mu.RLock()
	p := c.p
	if p == nil {
		c.mu.RUnlock()
		return closedErr("client")
	}
	return c.settle(await(func(cb C.OsCallback, ud C.size_t) C.int32_t {
		defer c.mu.RUnlock()
		return f(p, cb, ud)
	}))
}

// Call runs a curated operation (Op*) and waits for its completion.
func (c *Client) Call(op uint32, req []byte, o CallOpts) Completion {
	return c.start(func(p *C.OsClient, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_client_call(p, C.uint32_t(op), bytesOf(req), o.c(), cb, ud)
	})
}

// Open opens a stream (Stream*); the completion's Handle is the stream.
func (c *Client) Open(kind uint32, req []byte, o CallOpts) Completion {
	return c.start(func(p *C.OsClient, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_client_open(p, C.uint32_t(kind), bytesOf(req), o.c(), cb, ud)
	})
}

func metadataOf(md []string) []byte {
	var b []byte
	for _, s := range md {
		b = append(b, s...)
		b = append(b, 0)
	}
	return b
}

// RawUnary calls any unary method by path; md is key, value, key, value...
func (c *Client) RawUnary(path string, req []byte, md []string, o CallOpts) Completion {
	m := metadataOf(md)
	return c.start(func(p *C.OsClient, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_client_raw_unary(p, stringOf(path), bytesOf(req), bytesOf(m), o.c(), cb, ud)
	})
}

// RawStream opens a stream on any method by path.
func (c *Client) RawStream(path string, md []string, o CallOpts) Completion {
	m := metadataOf(md)
	return c.start(func(p *C.OsClient, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_client_raw_stream(p, stringOf(path), bytesOf(m), o.c(), cb, ud)
	})
}

// Forward starts a forward whose connections carry sshSessionToken (none
// when empty); the completion's Handle is the forward.
func (c *Client) Forward(sandbox string, port uint32, sshSessionToken, local string, o CallOpts) Completion {
	return c.start(func(p *C.OsClient, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_client_forward_to(p, stringOf(sandbox), C.uint32_t(port), stringOf(sshSessionToken), stringOf(local), o.c(), cb, ud)
	})
}

// RoutingStats are the owner-routing counters.
type RoutingStats struct {
	Hinted, Unhinted, UnroutedRetries, OwnerLookups, CacheHits uint64
}

// RoutingStats reads the client's counters (zero once freed).
func (c *Client) RoutingStats() RoutingStats {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.p == nil {
		return RoutingStats{}
	}
	var s C.OsRoutingStats
	C.openshell_client_routing_stats(c.p, &s)
	return RoutingStats{uint64(s.hinted), uint64(s.unhinted), uint64(s.unrouted_retries), uint64(s.owner_lookups), uint64(s.cache_hits)}
}

// Stream is an OsStream.
type Stream struct {
	mu     sync.RWMutex
	p      *C.OsStream
	client *Client
	// freed is set by Free before it cancels (see Client.closed).
	freed atomic.Bool
}

// StreamOf wraps the handle of a completion of one of c's calls.
func (c *Client) StreamOf(h unsafe.Pointer) *Stream {
	return &Stream{p: (*C.OsStream)(h), client: c}
}

func (s *Stream) start(f func(p *C.OsStream, cb C.OsCallback, ud C.size_t) C.int32_t) Completion {
	s.mu.RLock()
	p := s.p
	if p == nil {
		s.mu.RUnlock()
		return closedErr("stream")
	}
	comp := await(func(cb C.OsCallback, ud C.size_t) C.int32_t {
		defer s.mu.RUnlock()
		return f(p, cb, ud)
	})
	if s.freed.Load() {
		return closedDuring(comp, true, "stream")
	}
	return s.client.settle(comp)
}

// Next receives one message (StatusEnd at the end).
func (s *Stream) Next() Completion {
	return s.start(func(p *C.OsStream, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_stream_next(p, cb, ud)
	})
}

// Send sends one message.
func (s *Stream) Send(msg []byte) Completion {
	return s.start(func(p *C.OsStream, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_stream_send(p, bytesOf(msg), cb, ud)
	})
}

// CloseSend ends the sending side.
func (s *Stream) CloseSend() {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.p != nil {
		C.openshell_stream_close_send(s.p)
	}
}

// Cancel resets the stream.
func (s *Stream) Cancel() {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.p != nil {
		C.openshell_stream_cancel(s.p)
	}
}

// Free cancels and frees the stream (idempotent). A Next in flight ends
// with cancelled first: cancel, then take the write lock.
func (s *Stream) Free() {
	s.freed.Store(true)
	s.Cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p != nil {
		C.openshell_stream_free(s.p)
		s.p = nil
	}
}

// Forward is an OsForward.
type Forward struct {
	mu sync.RWMutex
	p  *C.OsForward
}

// ForwardOf wraps the handle of a completion.
func ForwardOf(h unsafe.Pointer) *Forward { return &Forward{p: (*C.OsForward)(h)} }

// Addr is the local listener's address.
func (f *Forward) Addr() string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.p == nil {
		return ""
	}
	b := C.openshell_forward_local_addr(f.p)
	defer C.openshell_bytes_free(b)
	return C.GoStringN((*C.char)(unsafe.Pointer(b.ptr)), C.int(b.len))
}

// ForwardStats are a forward's counters.
type ForwardStats struct {
	ConnectionsAccepted, ConnectionsActive, ConnectionsFailed, BytesIn, BytesOut uint64
}

// Stats reads the counters (zero once freed).
func (f *Forward) Stats() ForwardStats {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.p == nil {
		return ForwardStats{}
	}
	var s C.OsForwardStats
	C.openshell_forward_stats(f.p, &s)
	return ForwardStats{uint64(s.connections_accepted), uint64(s.connections_active), uint64(s.connections_failed), uint64(s.bytes_in), uint64(s.bytes_out)}
}

// Close stops the listener and ends every connection.
func (f *Forward) Close() {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.p != nil {
		C.openshell_forward_close(f.p)
	}
}

// Free closes and frees the forward (idempotent).
func (f *Forward) Free() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.p != nil {
		C.openshell_forward_free(f.p)
		f.p = nil
	}
}

// Delivery modes of a config session.
const (
	ModePush = int(C.OS_MODE_PUSH)
	ModePoll = int(C.OS_MODE_POLL)
)

// ApplyFunc applies a snapshot (two length-delimited messages) and returns
// the rejection reason, empty to apply.
type ApplyFunc func(snapshot []byte, mode int) string

var appliers sync.Map // uintptr -> ApplyFunc

// ConfigSession is an OsConfigSession.
type ConfigSession struct {
	mu      sync.RWMutex
	p       *C.OsConfigSession
	applyID uintptr
}

// SessionOptions configure a config session.
type SessionOptions struct {
	PollInterval time.Duration
	AnnouncePush bool
	InstanceID   string
}

// NewConfigSession builds a session (no I/O).
func NewConfigSession(o Options, sandboxID string, so SessionOptions, apply ApplyFunc) (*ConfigSession, *Error) {
	opts := sessionClientOptions(o)
	id := nextProviderID.Add(1)
	appliers.Store(id, apply)
	var sopts C.OsConfigSessionOptions
	sopts.poll_interval_ms = C.uint64_t(so.PollInterval.Milliseconds())
	sopts.announce_push = C.bool(so.AnnouncePush)
	sopts.instance_id = stringOf(so.InstanceID)
	sopts.apply = C.os_apply_cb()
	sopts.apply_data = C.size_t(id)
	var out *C.OsConfigSession
	var cerr *C.OsErrorBox
	st := C.openshell_config_session_new(opts, stringOf(sandboxID), sopts, &out, &cerr)
	if st != C.OS_OK {
		appliers.Delete(id)
		if cerr != nil {
			e := errorOf(C.openshell_error_view(cerr))
			C.openshell_error_free(cerr)
			return nil, e
		}
		return nil, rejected(st).Err
	}
	return &ConfigSession{p: out, applyID: id}, nil
}

// Run runs the session until cancel is cancelled.
func (s *ConfigSession) Run(cancel *Cancel) Completion {
	s.mu.RLock()
	p := s.p
	if p == nil {
		s.mu.RUnlock()
		return closedErr("config session")
	}
	cancel.mu.Lock()
	cp := cancel.p
	cancel.mu.Unlock()
	return await(func(cb C.OsCallback, ud C.size_t) C.int32_t {
		defer s.mu.RUnlock()
		return C.openshell_config_session_run(p, cp, cb, ud)
	})
}

// SessionStats are a session's counters.
type SessionStats struct {
	Mode                                                  int
	Applied, Rejected, Duplicates, UpdatesReceived        uint64
	LastUpdateID, ConfigRevision, Polls, SessionsAccepted uint64
	Redirects                                             uint64
	ServedBy                                              string
}

// Stats reads the counters.
func (s *ConfigSession) Stats() SessionStats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.p == nil {
		return SessionStats{}
	}
	var st C.OsConfigSessionStats
	C.openshell_config_session_stats(s.p, &st)
	b := C.openshell_config_session_served_by(s.p)
	served := C.GoStringN((*C.char)(unsafe.Pointer(b.ptr)), C.int(b.len))
	C.openshell_bytes_free(b)
	return SessionStats{
		Mode: int(st.mode), Applied: uint64(st.applied), Rejected: uint64(st.rejected),
		Duplicates: uint64(st.duplicates), UpdatesReceived: uint64(st.updates_received),
		LastUpdateID: uint64(st.last_update_id), ConfigRevision: uint64(st.config_revision),
		Polls: uint64(st.polls), SessionsAccepted: uint64(st.sessions_accepted),
		Redirects: uint64(st.redirects), ServedBy: served,
	}
}

// Free frees the session (its run must have ended).
func (s *ConfigSession) Free() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p != nil {
		C.openshell_config_session_free(s.p)
		s.p = nil
		appliers.Delete(s.applyID)
	}
}

func answerApply(reply *C.OsApplyReply, reason string) {
	C.openshell_apply_reply(reply, stringOf(reason))
}

// sessionClientOptions are the client options of a config or host session:
// the session's own token, no token provider.
func sessionClientOptions(o Options) C.OsClientOptions {
	var opts C.OsClientOptions
	opts.endpoint = stringOf(o.Endpoint)
	opts.token = stringOf(o.Token)
	opts.ca_pem = bytesOf(o.CAPEM)
	opts.tls_server_name = stringOf(o.TLSServerName)
	opts.connect_timeout_ms = C.uint64_t(o.ConnectTimeout.Milliseconds())
	opts.allow_cleartext_token = C.bool(o.AllowCleartextToken)
	return opts
}

// HostApplyFunc applies one sandbox's snapshot (two length-delimited
// messages) and returns the rejection reason, empty to apply.
type HostApplyFunc func(sandboxID string, snapshot []byte) string

var hostAppliers sync.Map // uintptr -> HostApplyFunc

// HostSession is an OsHostSession.
type HostSession struct {
	mu      sync.RWMutex
	p       *C.OsHostSession
	applyID uintptr
}

// HostOptions configure a host session.
type HostOptions struct {
	Capacity   uint32
	ConfigPush bool
	InstanceID string
}

// NewHostSession builds a host session (no I/O).
func NewHostSession(o Options, memberID string, ho HostOptions, apply HostApplyFunc) (*HostSession, *Error) {
	opts := sessionClientOptions(o)
	id := nextProviderID.Add(1)
	hostAppliers.Store(id, apply)
	var hopts C.OsHostSessionOptions
	hopts.capacity = C.uint32_t(ho.Capacity)
	hopts.config_push = C.bool(ho.ConfigPush)
	hopts.instance_id = stringOf(ho.InstanceID)
	hopts.apply = C.os_host_apply_cb()
	hopts.apply_data = C.size_t(id)
	var out *C.OsHostSession
	var cerr *C.OsErrorBox
	st := C.openshell_host_session_new(opts, stringOf(memberID), hopts, &out, &cerr)
	if st != C.OS_OK {
		hostAppliers.Delete(id)
		if cerr != nil {
			e := errorOf(C.openshell_error_view(cerr))
			C.openshell_error_free(cerr)
			return nil, e
		}
		return nil, rejected(st).Err
	}
	return &HostSession{p: out, applyID: id}, nil
}

// Run runs the host session until cancel is cancelled.
func (s *HostSession) Run(cancel *Cancel) Completion {
	s.mu.RLock()
	p := s.p
	if p == nil {
		s.mu.RUnlock()
		return closedErr("host session")
	}
	cancel.mu.Lock()
	cp := cancel.p
	cancel.mu.Unlock()
	return await(func(cb C.OsCallback, ud C.size_t) C.int32_t {
		defer s.mu.RUnlock()
		return C.openshell_host_session_run(p, cp, cb, ud)
	})
}

// HostStats are a host session's counters.
type HostStats struct {
	SessionsAccepted, Redirects, StickyRedials, Fallbacks, Assigned uint64
	Stay                                                            bool
	SessionID, ServedBy, InstanceID                                 string
}

func (s *HostSession) text(which C.int32_t) string {
	b := C.openshell_host_session_text(s.p, which)
	defer C.openshell_bytes_free(b)
	return C.GoStringN((*C.char)(unsafe.Pointer(b.ptr)), C.int(b.len))
}

// Stats reads the counters (zero once freed).
func (s *HostSession) Stats() HostStats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.p == nil {
		return HostStats{}
	}
	var st C.OsHostSessionStats
	C.openshell_host_session_stats(s.p, &st)
	return HostStats{
		SessionsAccepted: uint64(st.sessions_accepted), Redirects: uint64(st.redirects),
		StickyRedials: uint64(st.sticky_redials), Fallbacks: uint64(st.fallbacks),
		Assigned: uint64(st.assigned), Stay: bool(st.stay),
		SessionID: s.text(C.OS_HOST_SESSION_ID), ServedBy: s.text(C.OS_HOST_SERVED_BY),
		InstanceID: s.text(C.OS_HOST_INSTANCE_ID),
	}
}

// Free frees the session (its run must have ended).
func (s *HostSession) Free() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p != nil {
		C.openshell_host_session_free(s.p)
		s.p = nil
		hostAppliers.Delete(s.applyID)
	}
}
