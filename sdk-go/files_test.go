package openshell_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	openshell "example.invalid/openshell/sdk-go"
)

// writeRandomFile writes size pseudo-random bytes (ChaCha8, seeded) to
// path in 16 MiB chunks and returns their SHA-256.
func writeRandomFile(t *testing.T, path string, size int64, seed byte) [32]byte {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var key [32]byte
	key[0] = seed
	src := rand.NewChaCha8(key)
	h := sha256.New()
	buf := make([]byte, 16<<20)
	for left := size; left > 0; {
		n := min(int64(len(buf)), left)
		_, _ = src.Read(buf[:n])
		if _, err := f.Write(buf[:n]); err != nil {
			t.Fatal(err)
		}
		h.Write(buf[:n])
		left -= n
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

func fileSHA256(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, f, make([]byte, 4<<20)); err != nil {
		t.Fatal(err)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// peakRSS is the test process's peak resident set so far, in bytes.
func peakRSS(t *testing.T) int64 {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Maxrss * 1024 // KiB on Linux
}

// sh runs a shell script in the sandbox and returns its stdout (exit 0 required).
func sh(t *testing.T, c *openshell.Client, sandbox, script string) string {
	t.Helper()
	ctx := testContext(t, 2*time.Minute)
	out, err := c.Exec(ctx, openshell.ExecRequest{Sandbox: sandbox, Command: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	if out.ExitCode != 0 {
		t.Fatalf("%s: exit %d: %s", script, out.ExitCode, out.Stderr)
	}
	return string(out.Stdout)
}

// noLeftovers fails unless no upload temp file is left in the sandbox
// (polled briefly: the server removes one when its stream ends).
func noLeftovers(t *testing.T, c *openshell.Client, sandbox string) {
	t.Helper()
	var left string
	deadline := time.Now().Add(10 * time.Second)
	for {
		left = sh(t, c, sandbox, "find . -name '*.openshell-part-*'")
		if left == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("temp files left in the sandbox: %s", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

const mib = 1 << 20

func TestTransferTwoGiBByPathWithFlatMemory(t *testing.T) {
	const size = 2 << 30
	c := newClient(t)
	sandbox := readySandbox(t, c, "go-files-big", nil)
	dir := t.TempDir()
	src := filepath.Join(dir, "big.bin")
	start := time.Now()
	want := writeRandomFile(t, src, size, 7)
	generated := time.Since(start)
	rssBefore := peakRSS(t)

	var mu sync.Mutex
	var reports []openshell.Progress
	progress := openshell.WithProgress(func(p openshell.Progress) {
		mu.Lock()
		reports = append(reports, p)
		mu.Unlock()
	})
	ctx := testContext(t, 15*time.Minute)
	start = time.Now()
	sum, err := c.Upload(ctx, sandbox, src, "big.bin", progress)
	if err != nil {
		t.Fatal(err)
	}
	upload := time.Since(start)
	if sum.Files != 1 || sum.Bytes != size {
		t.Fatalf("upload summary %+v", sum)
	}
	// Every report came before Upload returned; the last is complete.
	mu.Lock()
	got := append([]openshell.Progress(nil), reports...)
	mu.Unlock()
	if len(got) == 0 {
		t.Fatal("no progress reports")
	}
	last := got[len(got)-1]
	if last.BytesDone != size || last.BytesTotal != size || last.FilesDone != 1 || !strings.HasSuffix(last.Current, "/big.bin") {
		t.Fatalf("last progress %+v", last)
	}
	if limit := int(upload/(100*time.Millisecond)) + 3; len(got) > limit {
		t.Fatalf("%d progress reports in %v (at most %d)", len(got), upload, limit)
	}
	for i := 1; i < len(got); i++ {
		if got[i].BytesDone < got[i-1].BytesDone {
			t.Fatalf("progress went back: %+v then %+v", got[i-1], got[i])
		}
	}
	remoteSum := strings.Fields(sh(t, c, sandbox, "sha256sum big.bin"))[0]
	if remoteSum != fmt.Sprintf("%x", want) {
		t.Fatalf("sha256 in the sandbox %s, want %x", remoteSum, want)
	}
	if err := os.Remove(src); err != nil { // room for the copy back
		t.Fatal(err)
	}

	back := filepath.Join(dir, "back.bin")
	start = time.Now()
	sum, err = c.Download(ctx, sandbox, "big.bin", back)
	if err != nil {
		t.Fatal(err)
	}
	download := time.Since(start)
	if sum.Files != 1 || sum.Bytes != size {
		t.Fatalf("download summary %+v", sum)
	}
	if got := fileSHA256(t, back); got != want {
		t.Fatalf("sha256 of the download %x, want %x", got, want)
	}
	_ = os.Remove(back)
	sh(t, c, sandbox, "rm big.bin")

	peak := peakRSS(t)
	rate := func(d time.Duration) float64 { return float64(size) / mib / d.Seconds() }
	t.Logf("2 GiB: generated in %v; upload %v (%.0f MiB/s, %d progress reports), download %v (%.0f MiB/s); peak RSS %d MiB (%d MiB before the transfers)",
		generated.Round(time.Millisecond), upload.Round(time.Millisecond), rate(upload), len(got),
		download.Round(time.Millisecond), rate(download), peak/mib, rssBefore/mib)
	if peak > 400*mib {
		t.Fatalf("peak RSS %d MiB, want under 400 MiB", peak/mib)
	}
}

func TestUploadFromReaderAndDownloadToWriter(t *testing.T) {
	const size = 64 << 20
	c := newClient(t)
	sandbox := readySandbox(t, c, "go-files-stream", nil)
	ctx := testContext(t, 5*time.Minute)

	var key [32]byte
	key[0] = 3
	src := io.LimitReader(rand.NewChaCha8(key), size)
	h := sha256.New()
	var reports int
	sum, err := c.UploadFrom(ctx, sandbox, io.TeeReader(src, h), "streamed.bin",
		openshell.WithProgress(func(openshell.Progress) { reports++ }))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Files != 1 || sum.Bytes != size {
		t.Fatalf("summary %+v", sum)
	}
	if reports == 0 {
		t.Fatal("no progress reports")
	}
	want := fmt.Sprintf("%x", h.Sum(nil))
	if got := strings.Fields(sh(t, c, sandbox, "sha256sum streamed.bin; stat -c %a streamed.bin"))[0]; got != want {
		t.Fatalf("sha256 in the sandbox %s, want %s", got, want)
	}
	if mode := strings.Fields(sh(t, c, sandbox, "stat -c %a streamed.bin"))[0]; mode != "644" {
		t.Fatalf("mode %s", mode)
	}

	back := sha256.New()
	n, err := c.DownloadTo(ctx, sandbox, "streamed.bin", back)
	if err != nil {
		t.Fatal(err)
	}
	if n != size || fmt.Sprintf("%x", back.Sum(nil)) != want {
		t.Fatalf("downloaded %d bytes, sha256 %x, want %d and %s", n, back.Sum(nil), size, want)
	}
	var buf bytes.Buffer
	if _, err := c.DownloadTo(ctx, sandbox, "streamed.bin", &buf); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%x", sha256.Sum256(buf.Bytes())) != want {
		t.Fatal("the buffer's content differs")
	}

	// A reader that fails gives the upload up: the target keeps its content.
	failing := io.MultiReader(strings.NewReader("partial"), errReader{errors.New("disk on fire")})
	if _, err := c.UploadFrom(ctx, sandbox, failing, "streamed.bin"); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("a failing reader: %v", err)
	}
	if got := strings.Fields(sh(t, c, sandbox, "sha256sum streamed.bin"))[0]; got != want {
		t.Fatal("a failed upload changed the target")
	}
	// A writer that fails ends the download with its error.
	if _, err := c.DownloadTo(ctx, sandbox, "streamed.bin", errWriter{}); err == nil || !strings.Contains(err.Error(), "writer full") {
		t.Fatalf("a failing writer: %v", err)
	}
	noLeftovers(t, c, sandbox)
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

type errWriter struct{}

func (errWriter) Write([]byte) (int, error) { return 0, errors.New("writer full") }

func TestDirectoryRoundTripKeepsModesTimesAndLinks(t *testing.T) {
	c := newClient(t)
	sandbox := readySandbox(t, c, "go-files-tree", nil)
	ctx := testContext(t, 3*time.Minute)
	root := filepath.Join(t.TempDir(), "proj")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "src", "deep"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "build"), 0o755))
	must(os.WriteFile(filepath.Join(root, "README"), []byte("hello\n"), 0o644))
	must(os.WriteFile(filepath.Join(root, "run.sh"), []byte("#!/bin/sh\necho run\n"), 0o755))
	must(os.WriteFile(filepath.Join(root, "src", "deep", "a.txt"), []byte("deep"), 0o600))
	must(os.WriteFile(filepath.Join(root, "build", "out.o"), []byte("obj"), 0o644))
	must(os.WriteFile(filepath.Join(root, "debug.log"), []byte("noise"), 0o644))
	must(os.WriteFile(filepath.Join(root, ".gitignore"), []byte("build/\n*.log\n"), 0o644))
	must(os.Symlink("src/deep/a.txt", filepath.Join(root, "link-inside")))
	must(os.Symlink("/etc/passwd", filepath.Join(root, "link-outside")))
	old := time.Date(2020, 5, 17, 12, 0, 0, 0, time.UTC)
	must(os.Chtimes(filepath.Join(root, "README"), old, old))

	sum, err := c.Upload(ctx, sandbox, root, ".", openshell.WithIgnoreFile(".gitignore"))
	if err != nil {
		t.Fatal(err)
	}
	// README, run.sh, a.txt, .gitignore; build/ and debug.log ignored.
	if sum.Files != 4 || sum.Symlinks != 1 || sum.SkippedSymlinks != 1 || sum.Ignored != 2 {
		t.Fatalf("upload summary %+v", sum)
	}
	listing := sh(t, c, sandbox, "cd proj && stat -c '%n %a' README run.sh src/deep/a.txt && readlink link-inside && "+
		"stat -c %Y README && ls build debug.log link-outside 2>&1 | wc -l")
	for _, want := range []string{"README 644", "run.sh 755", "src/deep/a.txt 600", "src/deep/a.txt\n", fmt.Sprint(old.Unix())} {
		if !strings.Contains(listing, want) {
			t.Fatalf("%q missing in the sandbox's listing:\n%s", want, listing)
		}
	}

	back := t.TempDir()
	sum, err = c.Download(ctx, sandbox, "proj", back)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Files != 4 || sum.Symlinks != 1 {
		t.Fatalf("download summary %+v", sum)
	}
	got := filepath.Join(back, "proj")
	for name, mode := range map[string]os.FileMode{"README": 0o644, "run.sh": 0o755, "src/deep/a.txt": 0o600} {
		st, err := os.Stat(filepath.Join(got, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != mode {
			t.Fatalf("%s: mode %v, want %v", name, st.Mode().Perm(), mode)
		}
	}
	if st, _ := os.Stat(filepath.Join(got, "README")); !st.ModTime().Equal(old) {
		t.Fatalf("README mtime %v, want %v", st.ModTime(), old)
	}
	if target, err := os.Readlink(filepath.Join(got, "link-inside")); err != nil || target != "src/deep/a.txt" {
		t.Fatalf("link-inside: %q %v", target, err)
	}
	if b, _ := os.ReadFile(filepath.Join(got, "src", "deep", "a.txt")); string(b) != "deep" {
		t.Fatalf("a.txt: %q", b)
	}
}

func TestReadFileAndWriteFile(t *testing.T) {
	c := newClient(t)
	sandbox := readySandbox(t, c, "go-files-small", nil)
	ctx := testContext(t, 2*time.Minute)
	hello := []byte("hello, sandbox\n")
	sum, err := c.WriteFile(ctx, sandbox, "notes/../hello.txt", hello)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Files != 1 || sum.Bytes != uint64(len(hello)) {
		t.Fatalf("write summary %+v, want 1 file of %d bytes", sum, len(hello))
	}
	got, err := c.ReadFile(ctx, sandbox, "hello.txt")
	if err != nil || string(got) != "hello, sandbox\n" {
		t.Fatalf("read %q, %v", got, err)
	}
	if out := sh(t, c, sandbox, "cat hello.txt"); out != "hello, sandbox\n" {
		t.Fatalf("in the sandbox: %q", out)
	}
	// Replaced whole; an empty file reads as empty, not nil.
	if sum, err := c.WriteFile(ctx, sandbox, "hello.txt", nil); err != nil || sum.Files != 1 || sum.Bytes != 0 {
		t.Fatalf("an empty write: %+v, %v", sum, err)
	}
	if got, err := c.ReadFile(ctx, sandbox, "hello.txt"); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("empty file: %q, %v", got, err)
	}
	// An absolute path inside the working directory is fine.
	root := strings.TrimSpace(sh(t, c, sandbox, "pwd"))
	if _, err := c.WriteFile(ctx, sandbox, root+"/abs.txt", []byte("x")); err != nil {
		t.Fatal(err)
	}
	// Past the 64 MiB limit ReadFile refuses before reading.
	sh(t, c, sandbox, "head -c 67108865 /dev/zero > huge.bin")
	if _, err := c.ReadFile(ctx, sandbox, "huge.bin"); !errors.Is(err, openshell.ErrFailedPrecondition) || !strings.Contains(err.Error(), "huge.bin") {
		t.Fatalf("a file over the limit: %v", err)
	}
}

func TestFileErrorsNameThePathAndLeaveNothing(t *testing.T) {
	c := newClient(t)
	sandbox := readySandbox(t, c, "go-files-bad", nil)
	ctx := testContext(t, 3*time.Minute)
	dir := t.TempDir()
	local := filepath.Join(dir, "f.txt")
	if err := os.WriteFile(local, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	expect := func(err error, sentinel error, code, path string) {
		t.Helper()
		var e *openshell.Error
		if !errors.As(err, &e) || !errors.Is(err, sentinel) || e.Code != code {
			t.Fatalf("want %s, got %v", code, err)
		}
		if !strings.Contains(e.Message, path) {
			t.Fatalf("the error does not name %s: %v", path, err)
		}
	}

	// Missing remote files.
	_, err := c.Download(ctx, sandbox, "absent.txt", filepath.Join(dir, "absent.txt"))
	expect(err, openshell.ErrNotFound, "not_found", "absent.txt")
	_, err = c.ReadFile(ctx, sandbox, "absent.txt")
	expect(err, openshell.ErrNotFound, "not_found", "absent.txt")
	_, err = c.DownloadTo(ctx, sandbox, "absent.txt", io.Discard)
	expect(err, openshell.ErrNotFound, "not_found", "absent.txt")
	// A missing local file.
	_, err = c.Upload(ctx, sandbox, filepath.Join(dir, "nope.txt"), ".")
	expect(err, openshell.ErrNotFound, "not_found", "nope.txt")
	if _, err := os.Stat(filepath.Join(dir, "absent.txt")); !os.IsNotExist(err) {
		t.Fatalf("a failed download left a local file: %v", err)
	}

	// Paths outside the working directory, before anything is written.
	for _, remote := range []string{"/etc/openshell-go-test", "../escaped.txt", "a/../../escaped.txt", "/tmp/x"} {
		_, err := c.Upload(ctx, sandbox, local, remote)
		expect(err, openshell.ErrInvalidArgument, "invalid_argument", remote)
		_, err = c.Download(ctx, sandbox, remote, filepath.Join(dir, "g.txt"))
		expect(err, openshell.ErrInvalidArgument, "invalid_argument", remote)
		_, err = c.WriteFile(ctx, sandbox, remote, []byte("x"))
		expect(err, openshell.ErrInvalidArgument, "invalid_argument", remote)
		_, err = c.UploadFrom(ctx, sandbox, strings.NewReader("x"), remote)
		expect(err, openshell.ErrInvalidArgument, "invalid_argument", remote)
	}
	if out := sh(t, c, sandbox, "ls /etc/openshell-go-test ../escaped.txt /tmp/x 2>/dev/null; true"); out != "" {
		t.Fatalf("written outside: %q", out)
	}
	// A directory where a file is expected: the error names its resolved
	// path (a name no other part of the message contains).
	sh(t, c, sandbox, "mkdir -p go-a-directory")
	_, err = c.UploadFrom(ctx, sandbox, strings.NewReader("x"), "go-a-directory")
	expect(err, openshell.ErrFailedPrecondition, "failed_precondition", "/go-a-directory")
	_, err = c.ReadFile(ctx, sandbox, "go-a-directory")
	expect(err, openshell.ErrFailedPrecondition, "failed_precondition", "/go-a-directory")
	// An ignore file applies to local paths only: the stream forms refuse
	// it before any I/O, as the other SDKs do.
	_, err = c.UploadFrom(ctx, sandbox, strings.NewReader("x"), "ignored.txt", openshell.WithIgnoreFile(".gitignore"))
	requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
	_, err = c.DownloadTo(ctx, sandbox, "absent.txt", io.Discard, openshell.WithIgnoreFile(""))
	requireCode(t, err, openshell.ErrInvalidConfig, "invalid_config")
	if out := sh(t, c, sandbox, "ls ignored.txt 2>/dev/null; true"); out != "" {
		t.Fatalf("a refused upload wrote its target: %q", out)
	}
	noLeftovers(t, c, sandbox)
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("local leftovers: %v", entries)
	}
}

func TestTransferCancelledByContextLeavesNothing(t *testing.T) {
	c := newClient(t)
	sandbox := readySandbox(t, c, "go-files-cancel", nil)
	dir := t.TempDir()
	src := filepath.Join(dir, "src.bin")
	writeRandomFile(t, src, 256<<20, 9)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := c.Upload(ctx, sandbox, src, "cancelled.bin", openshell.WithProgress(func(p openshell.Progress) {
			if p.BytesDone > 0 {
				once.Do(func() { close(started) })
			}
		}))
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("the upload ended before it was cancelled: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the upload never started")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a cancelled upload: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled upload did not return")
	}
	if out := sh(t, c, sandbox, "ls cancelled.bin 2>/dev/null; true"); out != "" {
		t.Fatalf("a cancelled upload left its target: %q", out)
	}
	noLeftovers(t, c, sandbox)
}
