package native

// The inline slot: a unary call that starts while no other unary call of
// the process is in flight runs on its caller's thread (the library's
// blocking exports drive the call's future right there), which spares a
// lone call the two hand-offs of the queue path (to a runtime thread to
// start, back through the doorbell to end). Every call that starts while
// another is in flight goes through the queue (queue.go), and so does every
// stream. So at most one OS thread is ever held by a call in flight,
// however many goroutines call at once, and a program that makes one call
// at a time keeps the latency of a direct call.

/*
#include "openshell.h"
*/
import "C"

import (
	"sync/atomic"
	"unsafe"
)

var (
	// unaryInFlight counts the unary calls of the process in flight.
	unaryInFlight atomic.Int64
	// inlineBusy is the slot: set while a call runs on its caller's thread.
	inlineBusy atomic.Bool
)

// claimInline counts a unary call in and tells whether it may run inline:
// it is the only one in flight and the slot was free. done must run once
// the call completed.
func claimInline() (inline bool, done func()) {
	if unaryInFlight.Add(1) == 1 && inlineBusy.CompareAndSwap(false, true) {
		return true, func() { inlineBusy.Store(false); unaryInFlight.Add(-1) }
	}
	return false, func() { unaryInFlight.Add(-1) }
}

// Unary runs a curated operation (Op*): on the calling thread when it may
// run inline, else through the queue.
func (c *Client) Unary(op uint32, req []byte, o CallOpts) Completion {
	inline, done := claimInline()
	defer done()
	if !inline {
		return c.Call(op, req, o)
	}
	c.mu.RLock()
	p := c.p
	if p == nil {
		c.mu.RUnlock()
		return closedErr("client")
	}
	var out C.OsOwnedBytes
	var cerr *C.OsErrorBox
	st := C.openshell_client_call_blocking(p, C.uint32_t(op), bytesOf(req), o.c(), &out, &cerr)
	c.mu.RUnlock()
	return c.owned(st, out, nil, cerr)
}

// RawUnaryAny calls any unary method by path (md is key, value, key,
// value...): on the calling thread when it may run inline, else through
// the queue. Without wantMetadata the response metadata is not
// copied out (ServedBy stays empty).
func (c *Client) RawUnaryAny(path string, req []byte, md []string, wantMetadata bool, o CallOpts) Completion {
	inline, done := claimInline()
	defer done()
	if !inline {
		return c.RawUnary(path, req, md, o)
	}
	m := metadataOf(md)
	c.mu.RLock()
	p := c.p
	if p == nil {
		c.mu.RUnlock()
		return closedErr("client")
	}
	var out, outMD C.OsOwnedBytes
	var cerr *C.OsErrorBox
	mdOut := &outMD
	if !wantMetadata {
		mdOut = nil
	}
	st := C.openshell_client_raw_unary_blocking(p, stringOf(path), bytesOf(req), bytesOf(m), o.c(), &out, mdOut, &cerr)
	c.mu.RUnlock()
	return c.owned(st, out, mdOut, cerr)
}

// owned turns what a blocking export wrote into a completion and frees it.
func (c *Client) owned(st C.int32_t, out C.OsOwnedBytes, md *C.OsOwnedBytes, cerr *C.OsErrorBox) Completion {
	switch {
	case st == C.OS_OK:
		comp := Completion{Status: StatusOK}
		if out.len > 0 {
			comp.Value = C.GoBytes(unsafe.Pointer(out.ptr), C.int(out.len))
		}
		C.openshell_bytes_free(out)
		if md != nil {
			if md.len > 0 {
				comp.metadata = C.GoStringN((*C.char)(unsafe.Pointer(md.ptr)), C.int(md.len))
			}
			for _, kv := range comp.Metadata() {
				if kv[0] == "x-openshell-served-by" {
					comp.ServedBy = kv[1]
				}
			}
			C.openshell_bytes_free(*md)
		}
		return comp
	case cerr != nil:
		e := errorOf(C.openshell_error_view(cerr))
		C.openshell_error_free(cerr)
		return c.settle(Completion{Status: StatusError, Err: e})
	}
	return rejected(st)
}
