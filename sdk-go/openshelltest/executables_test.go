package openshelltest

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Test processes starting at once copy the carried executables into one
// directory: each sees it complete, executable, and no temporary copy is
// left.
func TestCarriedExecutablesAreCopiedOnceAtomically(t *testing.T) {
	src, root := t.TempDir(), t.TempDir()
	for _, name := range []string{gatewayExe, supervisorExe, sandboxInitExe} {
		// As the module cache holds them: read-only, no executable bit.
		if err := os.WriteFile(filepath.Join(src, name), []byte("#!/bin/sh\necho "+name+"\n"), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	const racers = 8
	got := make([]string, racers)
	errs := make([]error, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = installTo(src, root, "v1.2.3")
		}()
	}
	wg.Wait()
	for i := range racers {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if got[i] != got[0] {
			t.Fatalf("two copies: %s and %s", got[0], got[i])
		}
	}
	dir := filepath.Dir(got[0])
	if !strings.HasPrefix(filepath.Base(dir), "v1.2.3-") || filepath.Base(filepath.Dir(dir)) != platform {
		t.Fatalf("copied to %s", dir)
	}
	for _, name := range []string{gatewayExe, supervisorExe, sandboxInitExe} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o755 {
			t.Fatalf("%s has mode %v", name, st.Mode())
		}
		b, _ := os.ReadFile(filepath.Join(dir, name))
		if !bytes.Contains(b, []byte("echo "+name)) {
			t.Fatalf("%s holds %q", name, b)
		}
	}
	entries, _ := os.ReadDir(filepath.Dir(dir))
	if len(entries) != 1 {
		t.Fatalf("left in %s: %v", filepath.Dir(dir), entries)
	}

	// Other content under the same version (a rebuilt pre-release) gets a
	// directory of its own.
	if err := os.Chmod(filepath.Join(src, gatewayExe), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, gatewayExe), []byte("#!/bin/sh\necho rebuilt\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	again, err := installTo(src, root, "v1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(again) == dir {
		t.Fatal("new content reused the old copy")
	}
}

func TestModuleCachePathsAreEscaped(t *testing.T) {
	if got := escapePath("github.com/Azure/Go"); got != "github.com/!azure/!go" {
		t.Fatal(got)
	}
}

func TestACacheOthersMayWriteIsRefused(t *testing.T) {
	src := t.TempDir()
	for _, name := range []string{gatewayExe, supervisorExe} {
		if err := os.WriteFile(filepath.Join(src, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join(t.TempDir(), "cache")
	if err := os.MkdirAll(filepath.Join(root, platform), 0o755); err != nil {
		t.Fatal(err)
	}
	// Another user could swap what is run from a directory anyone may write.
	if err := os.Chmod(filepath.Join(root, platform), 0o777); err != nil {
		t.Fatal(err)
	}
	_, err := installTo(src, root, "v1.2.3")
	if err == nil || !strings.Contains(err.Error(), "writable by others") {
		t.Fatalf("installTo into a world-writable cache: %v", err)
	}
}
