package openshell

import (
	"context"
	"io"
	"runtime"
	"sync"

	"example.invalid/openshell/sdk-go/internal/native"
)

// Files move over the sandbox's SFTP server, run by its supervisor as the
// sandbox's own user (a transfer can touch exactly what an exec can).
// Remote paths are relative to the sandbox's working directory; absolute
// ones must lie inside it (anything else is ErrInvalidArgument before
// anything is written). Every file goes to a temp name next to its target
// and is renamed into place last, so a failed or cancelled transfer leaves
// nothing half-written. Errors name the path: ErrNotFound,
// ErrFailedPrecondition (a directory where a file is expected, or the
// reverse), ErrResourceExhausted (no space), ErrPermissionDenied,
// ErrInvalidArgument.

// TransferSummary is what a transfer did.
type TransferSummary struct {
	// Files is the number of regular files written.
	Files uint64
	// Directories created (or found) in a tree.
	Directories uint64
	// Symlinks recreated (their target stays inside the tree).
	Symlinks uint64
	// SkippedSymlinks point out of the tree, so were left out.
	SkippedSymlinks uint64
	// Ignored entries were left out by the ignore files (a directory counts once).
	Ignored uint64
	// SkippedOther are sockets, devices and fifos, left out.
	SkippedOther uint64
	// Bytes of file content moved.
	Bytes uint64
}

// Progress is where a transfer stands, as handed to WithProgress.
type Progress struct {
	// BytesDone of file content moved so far.
	BytesDone uint64
	// BytesTotal the transfer moves (UploadFrom: what was read so far).
	BytesTotal uint64
	// FilesDone were renamed into place.
	FilesDone uint64
	// FilesTotal the transfer moves.
	FilesTotal uint64
	// Current is the destination path of the file being moved.
	Current string
}

// TransferOption tunes a transfer.
type TransferOption func(*transferSettings)

type transferSettings struct {
	ignoreFile string
	// ignoreSet: WithIgnoreFile was given (even with an empty name).
	ignoreSet bool
	progress  func(Progress)
}

// WithIgnoreFile honours ignore files of this name (".gitignore" syntax)
// in every directory of a tree, for uploads and downloads alike. It applies
// to local paths only: UploadFrom and DownloadTo refuse it
// (ErrInvalidConfig, before any I/O).
func WithIgnoreFile(name string) TransferOption {
	return func(s *transferSettings) { s.ignoreFile, s.ignoreSet = name, true }
}

// WithProgress calls fn with the transfer's progress, at most about ten
// times a second and once at the end, always before the transfer returns.
// It runs on a goroutine of the SDK, never two calls at once; a slow fn
// sees fewer, later reports (never a stale one after a newer).
func WithProgress(fn func(Progress)) TransferOption {
	return func(s *transferSettings) { s.progress = fn }
}

func transferSettingsOf(opts []TransferOption) transferSettings {
	var s transferSettings
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	return s
}

// progressRelay hands the core's reports (on a library thread, which must
// not block) to the caller's function on a goroutine of its own, keeping
// only the newest one pending.
type progressRelay struct {
	fn      func(Progress)
	id      uintptr
	mu      sync.Mutex
	latest  Progress
	pending bool
	wake    chan struct{}
	quit    chan struct{}
	done    chan struct{}
}

// startProgress is nil when fn is.
func startProgress(fn func(Progress)) *progressRelay {
	if fn == nil {
		return nil
	}
	r := &progressRelay{fn: fn, wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	r.id = native.RegisterProgress(r.push)
	go r.run()
	return r
}

func (r *progressRelay) push(p native.Progress) {
	r.mu.Lock()
	r.latest = Progress(p)
	r.pending = true
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *progressRelay) deliver() {
	r.mu.Lock()
	p, ok := r.latest, r.pending
	r.pending = false
	r.mu.Unlock()
	if ok {
		r.fn(p)
	}
}

func (r *progressRelay) run() {
	defer close(r.done)
	for {
		select {
		case <-r.wake:
			r.deliver()
		case <-r.quit:
			r.deliver() // the final report, if it is still pending
			return
		}
	}
}

// stop delivers what is pending and returns once fn will not be called
// again. Safe on nil.
func (r *progressRelay) stop() {
	if r == nil {
		return
	}
	native.UnregisterProgress(r.id)
	close(r.quit)
	<-r.done
}

func (r *progressRelay) opts(ignoreFile string) native.TransferOpts {
	t := native.TransferOpts{IgnoreFile: ignoreFile}
	if r != nil {
		t.ProgressID = r.id
	}
	return t
}

func summaryOf(b []byte) (TransferSummary, error) {
	s, ok := native.SummaryOf(b)
	if !ok {
		return TransferSummary{}, &Error{Code: "protocol", GRPCStatus: 13, Message: "a transfer summary of the wrong length"}
	}
	return TransferSummary(s), nil
}

// transfer runs a path upload or download: the core does the I/O.
func (c *Client) transfer(ctx context.Context, opts []TransferOption,
	run func(t native.TransferOpts, o native.CallOpts) native.Completion) (TransferSummary, error) {
	if err := ctx.Err(); err != nil {
		return TransferSummary{}, contextError(err)
	}
	s := transferSettingsOf(opts)
	relay := startProgress(s.progress)
	o, release := callOpts(ctx, 0)
	comp := run(relay.opts(s.ignoreFile), o)
	release()
	relay.stop()
	if err := c.done(ctx, comp); err != nil {
		return TransferSummary{}, err
	}
	return summaryOf(comp.Value)
}

// Upload copies localPath (a file, or a directory with everything in it)
// to remote in the sandbox; when remote is an existing directory the copy
// goes inside it under localPath's name (as scp does). Modes and
// modification times are kept; symlinks whose target stays inside the
// tree are recreated, others are skipped (and counted). The core reads the
// files itself, streamed: a file is never held whole in memory.
// Cancelling ctx cancels the transfer (nothing half-written is left).
func (c *Client) Upload(ctx context.Context, sandbox, localPath, remote string, opts ...TransferOption) (TransferSummary, error) {
	return c.transfer(ctx, opts, func(t native.TransferOpts, o native.CallOpts) native.Completion {
		return c.n.Upload(sandbox, localPath, remote, t, o)
	})
}

// Download copies remote (a file or a directory) from the sandbox to
// localPath; when localPath is an existing directory the copy goes inside
// it under remote's name. Like Upload, streamed by the core, and atomic per
// file (a temp name renamed into place).
func (c *Client) Download(ctx context.Context, sandbox, remote, localPath string, opts ...TransferOption) (TransferSummary, error) {
	return c.transfer(ctx, opts, func(t native.TransferOpts, o native.CallOpts) native.Completion {
		return c.n.Download(sandbox, remote, localPath, t, o)
	})
}

// uploadChunk is how much UploadFrom reads before handing it to the core
// (which sends it in 256 KiB requests, several in flight).
const uploadChunk = 1 << 20

// UploadFrom writes what r yields, until io.EOF, as the file remote (mode
// 0644), replacing any file there atomically once r is exhausted. It is
// streamed in chunks: at most a few MiB are in memory at once. An error of
// r (or a cancelled ctx) gives the upload up and leaves the target as it
// was. WithIgnoreFile applies to local paths only: it is ErrInvalidConfig
// here, before any I/O.
func (c *Client) UploadFrom(ctx context.Context, sandbox string, r io.Reader, remote string, opts ...TransferOption) (TransferSummary, error) {
	if r == nil {
		return TransferSummary{}, invalid("UploadFrom needs a reader")
	}
	settings := transferSettingsOf(opts)
	if settings.ignoreSet {
		return TransferSummary{}, invalid("WithIgnoreFile applies to uploads from a local path, not to UploadFrom")
	}
	if err := ctx.Err(); err != nil {
		return TransferSummary{}, contextError(err)
	}
	relay := startProgress(settings.progress)
	defer relay.stop()
	o, release := callOpts(ctx, 0)
	comp := c.n.UploadStream(sandbox, remote, relay.opts(""), o)
	if err := c.done(ctx, comp); err != nil {
		release()
		return TransferSummary{}, err
	}
	s := newStream(ctx, c, c.n.StreamOf(comp.Handle), release)
	defer s.close()
	buf := make([]byte, uploadChunk)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if err := s.send(buf[:n]); err != nil {
				return TransferSummary{}, err
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			s.finish(false)
			return TransferSummary{}, rerr
		}
	}
	fin, err := s.finish(true)
	if err != nil {
		return TransferSummary{}, err
	}
	return summaryOf(fin)
}

// finish ends an upload stream (commit: into place; else given up).
func (s *stream) finish(commit bool) ([]byte, error) {
	defer runtime.KeepAlive(s)
	comp := s.n.Finish(commit)
	if comp.Status == native.StatusError {
		return nil, errorIn(s.ctx, comp.Err)
	}
	return comp.Value, nil
}

// DownloadTo writes the content of the file remote to w, chunk by chunk
// (at most 256 KiB at a time in memory), and returns the bytes written.
// An error of w (or a cancelled ctx) ends the download. WithIgnoreFile
// applies to local paths only: it is ErrInvalidConfig here, before any I/O.
func (c *Client) DownloadTo(ctx context.Context, sandbox, remote string, w io.Writer, opts ...TransferOption) (int64, error) {
	if w == nil {
		return 0, invalid("DownloadTo needs a writer")
	}
	settings := transferSettingsOf(opts)
	if settings.ignoreSet {
		return 0, invalid("WithIgnoreFile applies to downloads into a local path, not to DownloadTo")
	}
	if err := ctx.Err(); err != nil {
		return 0, contextError(err)
	}
	relay := startProgress(settings.progress)
	defer relay.stop()
	o, release := callOpts(ctx, 0)
	comp := c.n.DownloadStream(sandbox, remote, relay.opts(""), o)
	if err := c.done(ctx, comp); err != nil {
		release()
		return 0, err
	}
	s := newStream(ctx, c, c.n.StreamOf(comp.Handle), release)
	defer s.close()
	var written int64
	for {
		chunk, err := s.recv()
		if isEOF(err) {
			break
		}
		if err != nil {
			return written, err
		}
		n, werr := w.Write(chunk)
		written += int64(n)
		if werr != nil {
			return written, werr
		}
	}
	return written, nil
}

// ReadFile returns the whole content of the file remote, at most 64 MiB
// (ErrFailedPrecondition beyond, before anything is read; use DownloadTo).
func (c *Client) ReadFile(ctx context.Context, sandbox, remote string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, contextError(err)
	}
	o, release := callOpts(ctx, 0)
	comp := c.n.ReadFile(sandbox, remote, o)
	release()
	if err := c.done(ctx, comp); err != nil {
		return nil, err
	}
	if comp.Value == nil {
		return []byte{}, nil
	}
	return comp.Value, nil
}

// WriteFile writes data as the file remote (mode 0644), replacing any file
// there atomically, and returns what it did (one file, len(data) bytes).
func (c *Client) WriteFile(ctx context.Context, sandbox, remote string, data []byte) (TransferSummary, error) {
	if err := ctx.Err(); err != nil {
		return TransferSummary{}, contextError(err)
	}
	o, release := callOpts(ctx, 0)
	comp := c.n.WriteFile(sandbox, remote, data, o)
	release()
	if err := c.done(ctx, comp); err != nil {
		return TransferSummary{}, err
	}
	return summaryOf(comp.Value)
}
