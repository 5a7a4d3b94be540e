package check

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// valueSet is one documented value set and what it must render.
type valueSet struct {
	// file under deploy/helm/values; "" renders the chart's defaults alone.
	file       string
	replicas   int
	isolation  string
	database   bool
	hosts      int
	edge       bool
	ingress    bool
	snippet    bool
	gatewayAPI bool
}

var valueSets = []valueSet{
	{file: "", replicas: 1, isolation: "namespaces"},
	{file: "single-sqlite.yaml", replicas: 1, isolation: "namespaces"},
	{file: "cluster-edge.yaml", replicas: 3, isolation: "namespaces", database: true, edge: true},
	{file: "cluster-hosts.yaml", replicas: 3, isolation: "namespaces", database: true, edge: true, hosts: 4},
	{file: "cluster-ingress-nginx.yaml", replicas: 3, isolation: "namespaces", database: true, edge: true, ingress: true},
	{file: "cluster-ingress-nginx-snippet.yaml", replicas: 3, isolation: "namespaces", database: true, ingress: true, snippet: true},
	{file: "cluster-gateway-api.yaml", replicas: 3, isolation: "namespaces", database: true, gatewayAPI: true},
	{file: "isolation-none.yaml", replicas: 3, isolation: "none", database: true, edge: true, hosts: 2},
}

func (v valueSet) name() string {
	if v.file == "" {
		return "chart-defaults"
	}
	return strings.TrimSuffix(v.file, ".yaml")
}

func (v valueSet) render() Render {
	r := Render{Chart: chartDir, Release: release, Namespace: namespace}
	if v.file != "" {
		r.ValueFiles = []string{filepath.Join(valueSetsDir, v.file)}
	}
	return r
}

// A value set added to deploy/helm/values must be added here too, with
// what it renders.
func TestEveryValueSetIsChecked(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(valueSetsDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no value sets in %s", valueSetsDir)
	}
	for _, path := range files {
		name := filepath.Base(path)
		if !slices.ContainsFunc(valueSets, func(v valueSet) bool { return v.file == name }) {
			t.Errorf("value set %s is not in valueSets (chart_test.go)", name)
		}
	}
}

func TestValueSets(t *testing.T) {
	public, err := publicServices()
	if err != nil {
		t.Fatal(err)
	}
	for _, set := range valueSets {
		t.Run(set.name(), func(t *testing.T) {
			t.Parallel()
			lint := helm.Lint(set.render())
			if lint.Err != nil {
				t.Fatalf("helm lint --strict: %v\n%s%s", lint.Err, lint.Stdout, lint.Stderr)
			}
			out := helm.Template(set.render())
			if out.Err != nil {
				t.Fatalf("helm template: %v\n%s", out.Err, out.Stderr)
			}
			manifests, err := Decode(out.Stdout)
			if err != nil {
				t.Fatalf("strict decoding: %v", err)
			}
			c := &chart{t: t, set: set, manifests: manifests, text: string(out.Stdout), public: public}
			c.checkNames()
			c.checkGateway()
			c.checkServices()
			c.checkBudgets()
			c.checkSecretsNotInlined()
			c.checkSecurity()
			c.checkHosts()
			c.checkEdge()
			c.checkIngress()
			c.checkGRPCRoute()
		})
	}
}

// refusal is a value set the chart must refuse, and what its message says.
type refusal struct {
	name    string
	sets    []string
	message string
}

var refusals = []refusal{
	{
		name:    "replicas-without-database",
		sets:    []string{"replicas=3"},
		message: "replicas is 3 but secrets.database.name is empty",
	},
	{
		name:    "zero-replicas",
		sets:    []string{"replicas=0"},
		message: "replicas must be at least 1",
	},
	{
		name:    "unknown-isolation",
		sets:    []string{"isolation=auto"},
		message: `isolation must be namespaces or none, not "auto"`,
	},
	{
		name:    "dev-mode",
		sets:    []string{"gateway.extraArgs={--dev}"},
		message: "--dev turns user authentication off",
	},
	{
		name:    "hosts-without-hosts",
		sets:    []string{"hosts.enabled=true", "hosts.replicas=0"},
		message: "hosts.enabled needs hosts.replicas of at least 1",
	},
	{
		name: "grpcroute-over-16-rules",
		sets: []string{"replicas=16", "secrets.database.name=pg", "gatewayAPI.enabled=true",
			"gatewayAPI.parentRefs[0].name=gw"},
		message: "a GRPCRoute holds at most 16 rules",
	},
	{
		name:    "grpcroute-without-gateway",
		sets:    []string{"gatewayAPI.enabled=true"},
		message: "gatewayAPI.enabled needs gatewayAPI.parentRefs",
	},
	{
		name:    "ingress-without-tls",
		sets:    []string{"ingressNginx.enabled=true"},
		message: "ingressNginx.enabled needs ingressNginx.tlsSecretName",
	},
	{
		name: "snippet-behind-edge",
		sets: []string{"ingressNginx.enabled=true", "ingressNginx.tlsSecretName=tls",
			"ingressNginx.replicaRoutingSnippet=true", "edge.enabled=true"},
		message: "turn the snippet off",
	},
}

// `helm template` exits non-zero with the template's message, and renders
// nothing, for every value set the chart refuses.
func TestRefused(t *testing.T) {
	for _, bad := range refusals {
		t.Run(bad.name, func(t *testing.T) {
			t.Parallel()
			r := Render{Chart: chartDir, Release: release, Namespace: namespace, Sets: bad.sets}
			out := helm.Template(r)
			if out.Err == nil {
				t.Fatalf("helm template --set %v succeeded; want it refused with %q", bad.sets, bad.message)
			}
			if !strings.Contains(string(out.Stderr), bad.message) {
				t.Fatalf("helm template --set %v failed without %q:\n%s", bad.sets, bad.message, out.Stderr)
			}
			if len(strings.TrimSpace(string(out.Stdout))) != 0 {
				t.Fatalf("a refused render printed manifests:\n%s", out.Stdout)
			}
		})
	}
}

// The refusal of replicas > 1 without a database holds for every documented
// cluster value set with its database taken away, not just the defaults.
func TestClusterSetsNeedDatabase(t *testing.T) {
	for _, set := range valueSets {
		if set.replicas < 2 {
			continue
		}
		t.Run(set.name(), func(t *testing.T) {
			t.Parallel()
			r := set.render()
			r.Sets = []string{"secrets.database.name="}
			out := helm.Template(r)
			if out.Err == nil || !strings.Contains(string(out.Stderr), "secrets.database.name is empty") {
				t.Fatalf("without a database: err %v, stderr:\n%s", out.Err, out.Stderr)
			}
		})
	}
}

// The chart's lists of services follow proto/: the GRPCRoute names every
// public service and the ingress refuses every peer one.
func publicServices() ([]string, error) {
	all, err := Services(protoDir)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, IsPeer), nil
}

func TestProtoServices(t *testing.T) {
	all, err := Services(protoDir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(all, "openshell.v1.OpenShell") || !slices.ContainsFunc(all, IsPeer) {
		t.Fatalf("proto/ services %v: the parser found neither the client API nor the peer service", all)
	}
	if _, err := os.Stat(chartDir); err != nil {
		t.Fatal(err)
	}
}
