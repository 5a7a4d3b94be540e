package native

/*
#include "openshell.h"

extern void openshellGoProgress(size_t, OsProgress*);

static OsProgressCallback os_progress_cb(void) { return (OsProgressCallback)openshellGoProgress; }
*/
import "C"

import (
	"encoding/binary"
	"sync"
)

// Operations and stream kinds of logs and resumable watches.
const (
	OpLogs       = uint32(C.OS_OP_LOGS)
	StreamEvents = uint32(C.OS_STREAM_EVENTS)
)

// Progress is a copied OsProgress.
type Progress struct {
	BytesDone, BytesTotal, FilesDone, FilesTotal uint64
	Current                                      string
}

// ProgressFunc receives a transfer's progress on a library thread: it must
// not block.
type ProgressFunc func(Progress)

var progressFns sync.Map // uintptr -> ProgressFunc

// RegisterProgress makes f callable by the library under the id it
// returns, until UnregisterProgress. A call that comes after (none should)
// finds nothing and is dropped.
func RegisterProgress(f ProgressFunc) uintptr {
	id := nextProviderID.Add(1)
	progressFns.Store(id, f)
	return id
}

// UnregisterProgress forgets the function of id.
func UnregisterProgress(id uintptr) { progressFns.Delete(id) }

// openshellGoProgress is the C progress callback: it copies the progress
// (borrowed for the call) and hands it to the registered function, which
// does not block.
//
//export openshellGoProgress
func openshellGoProgress(userData C.size_t, p *C.OsProgress) {
	f, ok := progressFns.Load(uintptr(userData))
	if !ok {
		return
	}
	f.(ProgressFunc)(Progress{
		BytesDone:  uint64(p.bytes_done),
		BytesTotal: uint64(p.bytes_total),
		FilesDone:  uint64(p.files_done),
		FilesTotal: uint64(p.files_total),
		Current:    goString(p.current),
	})
}

// TransferOpts are a transfer's options; ProgressID is from
// RegisterProgress (0: none).
type TransferOpts struct {
	IgnoreFile string
	ProgressID uintptr
}

func (t TransferOpts) c() C.OsTransferOptions {
	var out C.OsTransferOptions
	out.ignore_file = stringOf(t.IgnoreFile)
	if t.ProgressID != 0 {
		out.progress = C.os_progress_cb()
		out.progress_data = C.size_t(t.ProgressID)
	}
	return out
}

// Summary is a decoded transfer summary.
type Summary struct {
	Files, Directories, Symlinks, SkippedSymlinks, Ignored, SkippedOther, Bytes uint64
}

// SummaryOf decodes a completion's value (seven little-endian u64s).
func SummaryOf(b []byte) (Summary, bool) {
	if len(b) != int(C.OS_TRANSFER_SUMMARY_LEN) {
		return Summary{}, false
	}
	n := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	return Summary{n(0), n(1), n(2), n(3), n(4), n(5), n(6)}, true
}

// Upload uploads a local path.
func (c *Client) Upload(sandbox, local, remote string, t TransferOpts, o CallOpts) Completion {
	return c.start(func(p *C.OsClient, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_client_upload(p, stringOf(sandbox), stringOf(local), stringOf(remote), t.c(), o.c(), cb, ud)
	})
}

// Download downloads to a local path.
func (c *Client) Download(sandbox, remote, local string, t TransferOpts, o CallOpts) Completion {
	return c.start(func(p *C.OsClient, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_client_download(p, stringOf(sandbox), stringOf(remote), stringOf(local), t.c(), o.c(), cb, ud)
	})
}

// UploadStream opens an upload stream: the completion's Handle is the
// stream, its Value the target path.
func (c *Client) UploadStream(sandbox, remote string, t TransferOpts, o CallOpts) Completion {
	return c.start(func(p *C.OsClient, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_client_upload_stream(p, stringOf(sandbox), stringOf(remote), t.c(), o.c(), cb, ud)
	})
}

// DownloadStream opens a download stream: the completion's Handle is the
// stream, its Value the size (8 bytes, little-endian) and the source path.
func (c *Client) DownloadStream(sandbox, remote string, t TransferOpts, o CallOpts) Completion {
	return c.start(func(p *C.OsClient, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_client_download_stream(p, stringOf(sandbox), stringOf(remote), t.c(), o.c(), cb, ud)
	})
}

// ReadFile reads a whole (small) file.
func (c *Client) ReadFile(sandbox, remote string, o CallOpts) Completion {
	return c.start(func(p *C.OsClient, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_client_read_file(p, stringOf(sandbox), stringOf(remote), o.c(), cb, ud)
	})
}

// WriteFile writes a whole file.
func (c *Client) WriteFile(sandbox, remote string, data []byte, o CallOpts) Completion {
	return c.start(func(p *C.OsClient, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_client_write_file(p, stringOf(sandbox), stringOf(remote), bytesOf(data), o.c(), cb, ud)
	})
}

// Finish ends an upload stream: commit renames the file into place (the
// completion's Value is the summary), otherwise it is given up.
func (s *Stream) Finish(commit bool) Completion {
	return s.start(func(p *C.OsStream, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_stream_finish(p, C.bool(commit), cb, ud)
	})
}

// Resumes is how many times an event watch reopened its stream.
func (s *Stream) Resumes() uint32 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.p == nil {
		return 0
	}
	return uint32(C.openshell_stream_resumes(s.p))
}
