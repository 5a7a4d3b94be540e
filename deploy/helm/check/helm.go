package check

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// HelmPackage is the helm command go.mod pins as a tool dependency.
const HelmPackage = "helm.sh/helm/v4/cmd/helm"

// BuildHelm builds the pinned helm binary into dir and returns its path.
// The module proxy supplies the source on a fresh machine; afterwards the
// Go build cache makes this a link step.
func BuildHelm(ctx context.Context, moduleDir, dir string) (string, error) {
	out := filepath.Join(dir, "helm")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, HelmPackage)
	cmd.Dir = moduleDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", HelmPackage, err, stderr.String())
	}
	return out, nil
}

// Helm runs one helm binary with a configuration of its own (no user
// repositories, caches or plugins take part).
type Helm struct {
	Path string
	// Home holds helm's config, cache and data directories.
	Home string
}

// Result is what one helm command printed, and whether it failed.
type Result struct {
	Stdout []byte
	Stderr []byte
	Err    error
}

// Run runs helm with args and a deadline of a minute.
func (h Helm) Run(args ...string) Result {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.Path, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(h.Home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(h.Home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(h.Home, "data"),
		// The check never reaches a cluster.
		"KUBECONFIG="+filepath.Join(h.Home, "no-kubeconfig"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return Result{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), Err: err}
}

// Render is one `helm template` of the chart.
type Render struct {
	Chart     string
	Release   string
	Namespace string
	// ValueFiles are passed as -f, in order; Sets as --set.
	ValueFiles []string
	Sets       []string
}

func (r Render) args() []string {
	args := []string{r.Release, r.Chart, "--namespace", r.Namespace}
	for _, file := range r.ValueFiles {
		args = append(args, "--values", file)
	}
	for _, set := range r.Sets {
		args = append(args, "--set", set)
	}
	return args
}

// Template runs `helm template`.
func (h Helm) Template(r Render) Result {
	return h.Run(append([]string{"template"}, r.args()...)...)
}

// Lint runs `helm lint --strict` with the same values (warnings fail too).
func (h Helm) Lint(r Render) Result {
	args := []string{"lint", "--strict", r.Chart, "--namespace", r.Namespace}
	for _, file := range r.ValueFiles {
		args = append(args, "--values", file)
	}
	for _, set := range r.Sets {
		args = append(args, "--set", set)
	}
	return h.Run(args...)
}
