package check

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Paths from this module's directory.
const (
	chartDir     = "../openshell"
	valueSetsDir = "../values"
	protoDir     = "../../../proto/openshell"
)

// The release every render uses: a name and a namespace other than the
// chart's own, so a name or namespace written into a template shows.
const (
	release   = "demo"
	namespace = "sandboxes"
	fullname  = "demo-openshell"
)

// helm is the binary TestMain built (or $HELM).
var helm Helm

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	home, err := os.MkdirTemp("", "openshell-helm-check-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(home)
	path := os.Getenv("HELM")
	if path == "" {
		started := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		path, err = BuildHelm(ctx, ".", filepath.Join(home, "bin"))
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "check-helm: built %s in %.1f s\n", HelmPackage, time.Since(started).Seconds())
	}
	helm = Helm{Path: path, Home: home}
	return m.Run()
}
