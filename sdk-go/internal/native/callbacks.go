package native

/*
#include "openshell.h"
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// openshellGoComplete is the C callback of async exports when the
// completion queue is not available (see queue.go). It runs on a Rust
// runtime thread: it copies the completion (borrowed for the duration of the
// call) and hands it to the waiting goroutine without blocking.
//
//export openshellGoComplete
func openshellGoComplete(userData C.size_t, c *C.OsCompletion) {
	deliver(userData, c)
}

// deliver copies a completion (borrowed) and hands it to the goroutine
// waiting on the channel its cgo.Handle names, without blocking.
func deliver(userData C.size_t, c *C.OsCompletion) {
	h := cgo.Handle(userData)
	ch := h.Value().(chan Completion)
	h.Delete()
	out := Completion{Status: int(c.status), Handle: unsafe.Pointer(c.handle)}
	if c.value.len > 0 {
		out.Value = C.GoBytes(unsafe.Pointer(c.value.ptr), C.int(c.value.len))
	}
	out.ServedBy = goString(c.served_by)
	out.metadata = goString(c.metadata)
	if out.Status == StatusError {
		out.Err = errorOf(c.error)
	}
	ch <- out // buffered (capacity 1): never blocks
}

// openshellGoToken is the C token-provider callback: it looks the provider
// up and answers from a new goroutine, so the Rust thread never waits on Go
// code.
//
//export openshellGoToken
func openshellGoToken(userData C.size_t, force C.bool, reply *C.OsTokenReply) {
	provider, ok := providers.Load(uintptr(userData))
	if !ok {
		answerToken(reply, "", 0, "the client was closed", false)
		return
	}
	go func() {
		// A panicking provider fails the calls waiting for the token (the
		// reply is answered exactly once) instead of the process.
		tok := TokenAnswer{Error: "the token provider panicked"}
		defer func() {
			if recover() != nil {
				tok = TokenAnswer{Error: "the token provider panicked"}
			}
			answerToken(reply, tok.Token, tok.ExpiresInMillis, tok.Error, tok.Retryable)
		}()
		tok = provider.(TokenFunc)(bool(force))
	}()
}

const applyPanicked = "the apply function panicked"

// openshellGoApply is the C apply callback: it copies the snapshot (borrowed
// for the call) and applies it on a new goroutine, which answers the reply.
//
//export openshellGoApply
func openshellGoApply(userData C.size_t, snapshot C.OsBytes, mode C.int32_t, reply *C.OsApplyReply) {
	apply, ok := appliers.Load(uintptr(userData))
	if !ok {
		answerApply(reply, "the session was closed")
		return
	}
	var b []byte
	if snapshot.len > 0 {
		b = C.GoBytes(unsafe.Pointer(snapshot.ptr), C.int(snapshot.len))
	}
	go func() {
		// A panicking apply function rejects the configuration (the reply
		// is answered exactly once) instead of crashing the process. The
		// panic value is left out of the reason: it may hold the snapshot.
		reason := applyPanicked
		defer func() {
			if recover() != nil {
				reason = applyPanicked
			}
			answerApply(reply, reason)
		}()
		reason = apply.(ApplyFunc)(b, int(mode))
	}()
}

// openshellGoHostApply is the C apply callback of a host session: it copies
// the sandbox id and the snapshot (borrowed for the call) and applies them
// on a new goroutine, which answers the reply.
//
//export openshellGoHostApply
func openshellGoHostApply(userData C.size_t, sandboxID C.OsBytes, snapshot C.OsBytes, reply *C.OsApplyReply) {
	apply, ok := hostAppliers.Load(uintptr(userData))
	if !ok {
		answerApply(reply, "the session was closed")
		return
	}
	id := C.GoStringN((*C.char)(unsafe.Pointer(sandboxID.ptr)), C.int(sandboxID.len))
	var b []byte
	if snapshot.len > 0 {
		b = C.GoBytes(unsafe.Pointer(snapshot.ptr), C.int(snapshot.len))
	}
	go func() {
		// As for openshellGoApply: a panic rejects, the reply is answered once.
		reason := applyPanicked
		defer func() {
			if recover() != nil {
				reason = applyPanicked
			}
			answerApply(reply, reason)
		}()
		reason = apply.(HostApplyFunc)(id, b)
	}()
}
