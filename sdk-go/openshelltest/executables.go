package openshelltest

// Finding openshell-gateway: WithGatewayBin, OPENSHELL_GATEWAY_BIN, the
// executables a release of this module carries beside its static library
// (internal/native/lib/<goos>_<goarch>/, written by scripts/release-go.sh),
// then PATH.
//
// The module cache is read-only and a module zip keeps no executable bit,
// so the carried executables are copied once into a directory of their own
// under os.UserCacheDir, named by the module's version and their content's
// hash: a directory made complete under a temporary name and renamed into
// place, so test processes starting at once never see half of it.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"unicode"

	openshell "example.invalid/openshell/sdk-go"
)

// GatewayBinEnv is the variable naming the openshell-gateway to run.
const GatewayBinEnv = "OPENSHELL_GATEWAY_BIN"

const (
	modulePath = "example.invalid/openshell/sdk-go"
	gatewayExe = "openshell-gateway"
	// The supervisor the gateway starts for each sandbox, found beside it.
	supervisorExe = "openshell-supervisor"
	// The sandboxes' init the supervisor runs when it is beside it (else
	// the supervisor itself is the init).
	sandboxInitExe = "openshell-sandbox-init"
)

var platform = runtime.GOOS + "_" + runtime.GOARCH

// findGateway is the gateway when no WithGatewayBin was given: the
// variable's, the module's own (copied to the cache), then PATH's; "" when
// none (the core then reports it, and New says how to get one).
func findGateway() (string, error) {
	if bin := os.Getenv(GatewayBinEnv); bin != "" {
		return bin, nil
	}
	if dir, version, ok := carried(); ok {
		bin, err := installed(dir, version)
		if err != nil {
			return "", &openshell.Error{Code: "cluster", GRPCStatus: 14, Message: fmt.Sprintf(
				"copying the gateway this module carries (%s) to the user cache: %v", dir, err)}
		}
		return bin, nil
	}
	if bin, err := exec.LookPath(gatewayExe); err == nil {
		return bin, nil
	}
	return "", nil
}

// notFound is the error message when no gateway was found anywhere.
func notFound() string {
	return fmt.Sprintf("openshell-gateway not found: %s is not set, this copy of %s carries no "+
		"executables for %s (a release does, beside its static library), and none is on PATH. "+
		"Use a release (go get %s@VERSION), or set %s to an openshell-gateway with its "+
		"openshell-supervisor beside it (in a checkout of the SDK: `cargo build -p "+
		"openshell-gateway -p openshell-supervisor` builds both in target/debug), or pass "+
		"openshelltest.WithGatewayBin(path)",
		GatewayBinEnv, modulePath, platform, modulePath, GatewayBinEnv)
}

// carried is the directory holding this module's executables for this
// platform, and the module's version, if this copy of the module has them.
func carried() (dir, version string, ok bool) {
	for _, root := range moduleRoots() {
		dir := filepath.Join(root, "internal", "native", "lib", platform)
		if isFile(filepath.Join(dir, gatewayExe)) && isFile(filepath.Join(dir, supervisorExe)) {
			version := "devel"
			if _, v, found := strings.Cut(filepath.Base(root), "@"); found {
				version = v
			}
			return dir, version, true
		}
	}
	return "", "", false
}

// moduleRoots are the places this module's source may be: the directory
// this file was compiled from (absent under -trimpath), then the module
// cache's copy of the version the program was built with.
func moduleRoots() []string {
	var roots []string
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		roots = append(roots, filepath.Dir(filepath.Dir(file)))
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return roots
	}
	for _, dep := range info.Deps {
		if dep.Path != modulePath {
			continue
		}
		if dep.Replace != nil {
			if filepath.IsAbs(dep.Replace.Path) {
				roots = append(roots, dep.Replace.Path)
			}
			if dep.Replace.Version == "" {
				break
			}
			dep = dep.Replace
		}
		for _, cache := range moduleCaches() {
			roots = append(roots, filepath.Join(cache, escapePath(dep.Path)+"@"+dep.Version))
		}
	}
	return roots
}

// moduleCaches are where the go command keeps modules: GOMODCACHE, else
// the first GOPATH's pkg/mod, else ~/go/pkg/mod.
func moduleCaches() []string {
	if dir := os.Getenv("GOMODCACHE"); dir != "" {
		return []string{dir}
	}
	if gopath := os.Getenv("GOPATH"); gopath != "" {
		return []string{filepath.Join(filepath.SplitList(gopath)[0], "pkg", "mod")}
	}
	if home, err := os.UserHomeDir(); err == nil {
		return []string{filepath.Join(home, "go", "pkg", "mod")}
	}
	return nil
}

// escapePath is the module cache's spelling of a module path (an upper
// case letter becomes '!' and its lower case).
func escapePath(path string) string {
	var b strings.Builder
	for _, r := range path {
		if unicode.IsUpper(r) {
			b.WriteByte('!')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

var install struct {
	once sync.Once
	bin  string
	err  error
}

// installed is the gateway of dir copied (once per process) into the user
// cache directory.
func installed(dir, version string) (string, error) {
	install.once.Do(func() {
		root := filepath.Join("openshell", "sdk-go")
		if cache, err := os.UserCacheDir(); err == nil {
			root = filepath.Join(cache, root)
		} else {
			// No home: a directory of this user's own in the shared
			// temporary directory (installTo refuses one someone else made).
			root = filepath.Join(os.TempDir(), fmt.Sprintf("openshell-sdk-go-%d", os.Geteuid()))
		}
		install.bin, install.err = installTo(dir, root, version)
	})
	return install.bin, install.err
}

// installTo copies the executables of src into a directory of root named
// by version and their hash, made complete under a temporary name and
// renamed into place; a directory already there is used as it is.
func installTo(src, root, version string) (string, error) {
	names := []string{gatewayExe, supervisorExe}
	if isFile(filepath.Join(src, sandboxInitExe)) {
		names = append(names, sandboxInitExe)
	}
	sum := sha256.New()
	for _, name := range names {
		f, err := os.Open(filepath.Join(src, name))
		if err != nil {
			return "", err
		}
		_, err = io.Copy(sum, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	key := strings.NewReplacer("/", "_", string(os.PathSeparator), "_").Replace(version) + "-" +
		hex.EncodeToString(sum.Sum(nil))[:16]
	dest := filepath.Join(root, platform, key)
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return "", err
	}
	// Executables are run from here: every directory on the way must be
	// this user's and writable by nobody else, or another local user could
	// swap them.
	for dir := filepath.Dir(dest); ; dir = filepath.Dir(dir) {
		if !owned(dir) {
			return "", fmt.Errorf("refusing %s: not this user's, or writable by others", dir)
		}
		if dir == root || dir == filepath.Dir(dir) {
			break
		}
	}
	if complete(dest, names) {
		return filepath.Join(dest, gatewayExe), nil
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dest), key+".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, name := range names {
		if err := copyFile(filepath.Join(src, name), filepath.Join(tmp, name), 0o755); err != nil {
			return "", err
		}
		// The mode is given on create, under the umask: set it exactly.
		if err := os.Chmod(filepath.Join(tmp, name), 0o755); err != nil {
			return "", err
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dest); err != nil && !complete(dest, names) {
		// Another process renamed its copy into place first: that one is used.
		return "", err
	}
	return filepath.Join(dest, gatewayExe), nil
}

// complete is whether dir holds every executable, all of this user's and
// writable by nobody else.
func complete(dir string, names []string) bool {
	if !owned(dir) {
		return false
	}
	for _, name := range names {
		path := filepath.Join(dir, name)
		if !isFile(path) || !owned(path) {
			return false
		}
	}
	return true
}

// owned is whether path itself (not a symlink's target) belongs to this
// user and no one else may write it.
func owned(path string) bool {
	st, err := os.Lstat(path)
	if err != nil {
		return false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && int(sys.Uid) == os.Geteuid() && st.Mode()&os.ModeSymlink == 0 &&
		st.Mode().Perm()&0o022 == 0
}

func isFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}
