package native

// The completion queue (bindings/c/src/queue.rs): async exports complete
// into a queue in the library instead of calling into Go on a Rust runtime
// thread. One goroutine, drainQueue, waits for the queue's doorbell socket in
// Go's netpoller, takes every queued completion with one cgo call and hands
// each to the goroutine waiting on its channel. So a call in flight holds no
// OS thread of the Go process: its goroutine is parked on a channel like any
// other, and N concurrent calls cost N parked goroutines, not N threads. A
// cgo callback from a foreign thread (the fallback below) would instead
// have the runtime adopt a Rust thread and take a P for each completion.

/*
#include "openshell.h"
*/
import "C"

import (
	"os"
	"sync"
	"time"
	"unsafe"
)

var completionQueue struct {
	once  sync.Once
	ready bool
}

// queueStarted starts the drainer on first use and tells whether the queue
// is there (false only when its socket could not be made).
func queueStarted() bool {
	completionQueue.once.Do(func() {
		fd := int(C.openshell_queue_fd())
		if fd < 0 {
			return
		}
		// The fd is non-blocking, so the File is pollable: Read parks the
		// goroutine in the netpoller. The library owns the fd; this File is
		// never closed nor collected (drainQueue holds it for ever).
		door := os.NewFile(uintptr(fd), "openshell-completions")
		if door == nil {
			return
		}
		go drainQueue(door)
		completionQueue.ready = true
	})
	return completionQueue.ready
}

// drainQueue delivers queued completions for the life of the process. An
// empty take arms the doorbell: the next completion writes one byte, which
// the Read below waits for.
func drainQueue(door *os.File) {
	var batch *C.OsQueueBatch
	bell := make([]byte, 64)
	for {
		var items *C.OsQueued
		var n C.size_t
		// Frees the previous batch (its completions were copied) and takes
		// the next.
		batch = C.openshell_queue_take(batch, &items, &n)
		if batch == nil {
			if _, err := door.Read(bell); err != nil {
				// Never expected (the library never closes its end); poll
				// rather than leave completions waiting.
				time.Sleep(time.Millisecond)
			}
			continue
		}
		for _, q := range unsafe.Slice(items, int(n)) {
			deliver(q.user_data, &q.completion)
		}
	}
}
