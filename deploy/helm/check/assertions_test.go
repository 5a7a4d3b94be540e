package check

import (
	"fmt"
	"net"
	"path"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// The chart's fixed facts (values.yaml defaults the value sets keep).
const (
	grpcPort         = 17670
	replicaHeader    = "x-openshell-replica"
	hostTokenVolume  = "host-tokens"
	podNameRef       = "$(POD_NAME)"
	clusterDomain    = "cluster.local"
	minShutdownGrace = 30
)

// chart is one rendered value set under test.
type chart struct {
	t         *testing.T
	set       valueSet
	manifests []Manifest
	text      string
	// public are the non-peer gRPC services proto/ declares.
	public []string
}

func replicaID(i int) string      { return fmt.Sprintf("%s-%d", fullname, i) }
func replicaService(i int) string { return fmt.Sprintf("%s-replica-%d", fullname, i) }
func serviceHost(name string) string {
	return fmt.Sprintf("%s.%s.svc.%s", name, namespace, clusterDomain)
}
func serviceURL(name string) string { return fmt.Sprintf("http://%s:%d", serviceHost(name), grpcPort) }

// find returns the object of kind and name, or nil.
func find[T any](c *chart, kind, name string) *T {
	for _, m := range c.manifests {
		if m.Kind == kind && m.Name == name {
			if object, ok := m.Object.(*T); ok {
				return object
			}
		}
	}
	return nil
}

// must returns the object of kind and name, failing the test without it.
func must[T any](c *chart, kind, name string) *T {
	c.t.Helper()
	object := find[T](c, kind, name)
	if object == nil {
		c.t.Fatalf("no %s %q rendered", kind, name)
	}
	return object
}

func (c *chart) errorf(format string, args ...any) {
	c.t.Helper()
	c.t.Errorf("%s: "+format, append([]any{c.set.name()}, args...)...)
}

// flags reads `--name=value` and `--name` arguments (after the subcommand).
func flags(args []string) map[string][]string {
	out := map[string][]string{}
	for _, arg := range args {
		name, value, _ := strings.Cut(arg, "=")
		if strings.HasPrefix(name, "--") {
			out[name] = append(out[name], value)
		}
	}
	return out
}

// one returns the single value of a flag, failing when it is absent or
// repeated.
func (c *chart) one(where string, f map[string][]string, name string) string {
	c.t.Helper()
	values := f[name]
	if len(values) != 1 {
		c.errorf("%s: %s given %d times, want once", where, name, len(values))
		return ""
	}
	return values[0]
}

func container(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

func env(ctr *corev1.Container, name string) *corev1.EnvVar {
	for i := range ctr.Env {
		if ctr.Env[i].Name == name {
			return &ctr.Env[i]
		}
	}
	return nil
}

func portNamed(ctr *corev1.Container, name string) int32 {
	for _, port := range ctr.Ports {
		if port.Name == name {
			return port.ContainerPort
		}
	}
	return 0
}

// portOf returns the port of a host:port flag value.
func portOf(address string) string {
	_, port, err := net.SplitHostPort(address)
	if err != nil {
		return ""
	}
	return port
}

// workload is a pod template the chart renders.
type workload struct {
	kind, name string
	template   *corev1.PodTemplateSpec
	selector   *metav1.LabelSelector
}

func (c *chart) workloads() []workload {
	var out []workload
	for _, m := range c.manifests {
		switch object := m.Object.(type) {
		case *appsv1.StatefulSet:
			out = append(out, workload{m.Kind, m.Name, &object.Spec.Template, object.Spec.Selector})
		case *appsv1.Deployment:
			out = append(out, workload{m.Kind, m.Name, &object.Spec.Template, object.Spec.Selector})
		}
	}
	return out
}

// checkNames: exactly the objects this value set promises, no more.
func (c *chart) checkNames() {
	want := []string{
		"StatefulSet/" + fullname,
		"Service/" + fullname,
		"Service/" + fullname + "-peers",
		"PodDisruptionBudget/" + fullname,
	}
	for i := range c.set.replicas {
		want = append(want, "Service/"+replicaService(i))
	}
	if c.set.edge {
		want = append(want, "Deployment/"+fullname+"-edge", "Service/"+fullname+"-edge",
			"PodDisruptionBudget/"+fullname+"-edge")
	}
	if c.set.hosts > 0 {
		want = append(want, "StatefulSet/"+fullname+"-host", "Service/"+fullname+"-host",
			"PodDisruptionBudget/"+fullname+"-host")
	}
	if c.set.ingress {
		want = append(want, "Ingress/"+fullname, "Ingress/"+fullname+"-peer-deny")
	}
	if c.set.gatewayAPI {
		want = append(want, "GRPCRoute/"+fullname)
	}
	var got []string
	for _, m := range c.manifests {
		got = append(got, m.Kind+"/"+m.Name)
	}
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		c.t.Fatalf("rendered objects\n  %v\nwant\n  %v", got, want)
	}
	for _, w := range c.workloads() {
		selector, err := metav1.LabelSelectorAsSelector(w.selector)
		if err != nil || selector.Empty() || !selector.Matches(labels.Set(w.template.Labels)) {
			c.errorf("%s %s: its selector does not select its own pod template (%v)", w.kind, w.name, err)
		}
	}
}

// checkGateway: replica ids and peer endpoints from the pod name, probes,
// metrics annotations, the grace period, the data volume.
func (c *chart) checkGateway() {
	sts := must[appsv1.StatefulSet](c, "StatefulSet", fullname)
	if sts.Spec.Replicas == nil || int(*sts.Spec.Replicas) != c.set.replicas {
		c.errorf("gateway StatefulSet replicas %s, want %d", show(sts.Spec.Replicas), c.set.replicas)
	}
	if sts.Spec.ServiceName != fullname+"-peers" {
		c.errorf("gateway StatefulSet serviceName %q, want the headless %s-peers", sts.Spec.ServiceName, fullname)
	}
	pod := &sts.Spec.Template.Spec
	gw := container(pod, "gateway")
	if gw == nil {
		c.t.Fatalf("no gateway container")
	}
	if !slices.Equal(gw.Command, []string{"openshell-gateway"}) || len(gw.Args) == 0 || gw.Args[0] != "serve" {
		c.errorf("gateway runs %v %v, want openshell-gateway serve", gw.Command, gw.Args)
	}
	f := flags(gw.Args)
	c.checkPodName(gw, "gateway")
	if id := c.one("gateway", f, "--replica-id"); id != podNameRef {
		c.errorf("--replica-id %q, want %s: the replica id is the pod name", id, podNameRef)
	}
	endpoint := f["--peer-endpoint"]
	if c.set.replicas > 1 {
		want := fmt.Sprintf("http://%s.%s-peers.$(POD_NAMESPACE).svc.%s:%d", podNameRef, fullname, clusterDomain, grpcPort)
		if len(endpoint) != 1 || endpoint[0] != want {
			c.errorf("--peer-endpoint %v, want %s", endpoint, want)
		}
		ns := env(gw, "POD_NAMESPACE")
		if ns == nil || ns.ValueFrom == nil || ns.ValueFrom.FieldRef == nil || ns.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
			c.errorf("POD_NAMESPACE is not the pod's namespace (downward API)")
		}
	} else if len(endpoint) != 0 {
		c.errorf("a single replica got --peer-endpoint %v", endpoint)
	}
	if got := c.one("gateway", f, "--isolation"); got != c.set.isolation {
		c.errorf("gateway --isolation %q, want %q", got, c.set.isolation)
	}
	wantDriver := "process"
	if c.set.hosts > 0 {
		wantDriver = "hosts"
	}
	if got := c.one("gateway", f, "--driver"); got != wantDriver {
		c.errorf("gateway --driver %q, want %q", got, wantDriver)
	}
	if got := c.one("gateway", f, "--supervisor-url"); got != c.supervisorURL() {
		c.errorf("gateway --supervisor-url %q, want %q", got, c.supervisorURL())
	}
	if _, trusted := f["--trust-forwarded-authority"]; trusted != c.set.edge {
		c.errorf("--trust-forwarded-authority %v, want it exactly when the built-in edge fronts the replicas", trusted)
	}
	grpc, metrics := portNamed(gw, "grpc"), portNamed(gw, "metrics")
	if grpc != grpcPort || metrics == 0 {
		c.errorf("gateway ports grpc %d metrics %d", grpc, metrics)
	}
	if portOf(c.one("gateway", f, "--listen")) != fmt.Sprint(grpc) {
		c.errorf("--listen is not on the grpc container port %d", grpc)
	}
	if portOf(c.one("gateway", f, "--metrics-listen")) != fmt.Sprint(metrics) {
		c.errorf("--metrics-listen is not on the metrics container port %d", metrics)
	}
	c.checkProbes("gateway", gw)
	c.checkScrape("gateway", &sts.Spec.Template, metrics)
	if grace := pod.TerminationGracePeriodSeconds; grace == nil || *grace < minShutdownGrace {
		c.errorf("gateway terminationGracePeriodSeconds %s: the shutdown (leave the ring, hand hosts off for up to 10 s, drain for 5 s) needs %d", show(grace), minShutdownGrace)
	}
	if gw.Resources.Requests.Cpu().IsZero() || gw.Resources.Requests.Memory().IsZero() || gw.Resources.Limits.Memory().IsZero() {
		c.errorf("gateway resources %v: want cpu and memory requests and a memory limit", gw.Resources)
	}
	dataDir := c.one("gateway", f, "--data-dir")
	if !c.mounted(pod, gw, dataDir, sts.Spec.VolumeClaimTemplates) {
		c.errorf("the data directory %s is not a volume", dataDir)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		c.errorf("gateway pods mount a service account token sandboxes could read")
	}
}

// show prints a pointer's value ("unset" for nil).
func show[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// supervisorURL is what supervisors and hosts dial: the edge, else the
// main Service.
func (c *chart) supervisorURL() string {
	if c.set.edge {
		return serviceURL(fullname + "-edge")
	}
	return serviceURL(fullname)
}

// checkPodName: POD_NAME comes from the downward API (metadata.name).
func (c *chart) checkPodName(ctr *corev1.Container, where string) {
	c.t.Helper()
	pod := env(ctr, "POD_NAME")
	if pod == nil || pod.ValueFrom == nil || pod.ValueFrom.FieldRef == nil || pod.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		c.errorf("%s: POD_NAME is not the pod's name (downward API fieldRef metadata.name)", where)
	}
}

// checkProbes: startup and liveness on /healthz, readiness on /readyz, all
// on the container's metrics port.
func (c *chart) checkProbes(where string, ctr *corev1.Container) {
	c.t.Helper()
	for _, probe := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"startupProbe", ctr.StartupProbe, "/healthz"},
		{"livenessProbe", ctr.LivenessProbe, "/healthz"},
		{"readinessProbe", ctr.ReadinessProbe, "/readyz"},
	} {
		if probe.probe == nil || probe.probe.HTTPGet == nil {
			c.errorf("%s: no HTTP %s", where, probe.name)
			continue
		}
		get := probe.probe.HTTPGet
		if get.Path != probe.path {
			c.errorf("%s: %s on %q, want %s", where, probe.name, get.Path, probe.path)
		}
		port := get.Port.IntVal
		if get.Port.StrVal != "" {
			port = portNamed(ctr, get.Port.StrVal)
		}
		if port == 0 || port != portNamed(ctr, "metrics") {
			c.errorf("%s: %s port %s is not the metrics port", where, probe.name, get.Port.String())
		}
	}
}

// checkScrape: the pod tells Prometheus where /metrics is.
func (c *chart) checkScrape(where string, template *corev1.PodTemplateSpec, port int32) {
	c.t.Helper()
	a := template.Annotations
	if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != fmt.Sprint(port) || a["prometheus.io/path"] != "/metrics" {
		c.errorf("%s: scrape annotations %v, want scrape true, port %d, path /metrics", where, a, port)
	}
}

// mounted reports whether dir is the mount path of a volume (a pod volume
// or a claim template).
func (c *chart) mounted(pod *corev1.PodSpec, ctr *corev1.Container, dir string, claims []corev1.PersistentVolumeClaim) bool {
	for _, mount := range ctr.VolumeMounts {
		if mount.MountPath != dir || mount.SubPath != "" || mount.SubPathExpr != "" {
			continue
		}
		for _, volume := range pod.Volumes {
			if volume.Name == mount.Name {
				return true
			}
		}
		for _, claim := range claims {
			if claim.Name == mount.Name {
				return true
			}
		}
	}
	return false
}

// checkServices: who each Service selects, and that routing Services pick
// one replica each.
func (c *chart) checkServices() {
	sts := must[appsv1.StatefulSet](c, "StatefulSet", fullname)
	gatewayPods := labels.Set(sts.Spec.Template.Labels)
	selects := func(svc *corev1.Service) []string {
		var names []string
		for _, w := range c.workloads() {
			if len(svc.Spec.Selector) > 0 && labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(w.template.Labels)) {
				names = append(names, w.kind+"/"+w.name)
			}
		}
		return names
	}
	checkPort := func(svc *corev1.Service) {
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.StrVal != "grpc" ||
			svc.Spec.Ports[0].AppProtocol == nil || *svc.Spec.Ports[0].AppProtocol != "kubernetes.io/h2c" {
			c.errorf("Service %s: want one port to target port grpc with appProtocol kubernetes.io/h2c, got %+v", svc.Name, svc.Spec.Ports)
		}
	}
	main := must[corev1.Service](c, "Service", fullname)
	if got := selects(main); !slices.Equal(got, []string{"StatefulSet/" + fullname}) {
		c.errorf("Service %s selects %v, want the gateway pods only", fullname, got)
	}
	checkPort(main)
	peers := must[corev1.Service](c, "Service", fullname+"-peers")
	if peers.Spec.ClusterIP != corev1.ClusterIPNone || !peers.Spec.PublishNotReadyAddresses {
		c.errorf("Service %s-peers: want headless with publishNotReadyAddresses (peer DNS names resolve before readiness)", fullname)
	}
	if got := selects(peers); !slices.Equal(got, []string{"StatefulSet/" + fullname}) {
		c.errorf("Service %s-peers selects %v", fullname, got)
	}
	for i := range c.set.replicas {
		svc := must[corev1.Service](c, "Service", replicaService(i))
		if svc.Spec.Selector["statefulset.kubernetes.io/pod-name"] != replicaID(i) {
			c.errorf("Service %s does not select pod %s by statefulset.kubernetes.io/pod-name", svc.Name, replicaID(i))
		}
		for key, value := range svc.Spec.Selector {
			if key != "statefulset.kubernetes.io/pod-name" && gatewayPods[key] != value {
				c.errorf("Service %s selector %s=%s is not a gateway pod label", svc.Name, key, value)
			}
		}
		if svc.Spec.PublishNotReadyAddresses {
			c.errorf("Service %s routes to a replica that is not ready", svc.Name)
		}
		checkPort(svc)
	}
	if c.set.edge {
		edge := must[corev1.Service](c, "Service", fullname+"-edge")
		if got := selects(edge); !slices.Equal(got, []string{"Deployment/" + fullname + "-edge"}) {
			c.errorf("Service %s-edge selects %v", fullname, got)
		}
		checkPort(edge)
	}
}

// checkBudgets: each PodDisruptionBudget selects the pods of exactly one
// workload, the gateway's budget the gateway StatefulSet's.
func (c *chart) checkBudgets() {
	for _, m := range c.manifests {
		pdb, ok := m.Object.(*policyv1.PodDisruptionBudget)
		if !ok {
			continue
		}
		selector, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || selector.Empty() {
			c.errorf("PodDisruptionBudget %s: selector %v (%v)", pdb.Name, pdb.Spec.Selector, err)
			continue
		}
		var matched []string
		for _, w := range c.workloads() {
			if selector.Matches(labels.Set(w.template.Labels)) {
				matched = append(matched, w.name)
			}
		}
		if len(matched) != 1 || matched[0] != pdb.Name {
			c.errorf("PodDisruptionBudget %s selects the pods of %v, want %s alone", pdb.Name, matched, pdb.Name)
		}
		if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
			c.errorf("PodDisruptionBudget %s sets no budget", pdb.Name)
		}
	}
}

// sensitive names an environment variable that must come from a Secret.
func sensitive(name string) bool {
	upper := strings.ToUpper(name)
	for _, word := range []string{"TOKEN", "PASSWORD", "SECRET", "DATABASE_URL"} {
		if strings.Contains(upper, word) {
			return true
		}
	}
	return false
}

// Flags that carry a secret on the command line (every local user can read
// it): the chart must never render them.
var secretFlags = []string{"--token", "--peer-token", "--database-url", "--tokens-file"}

// checkSecretsNotInlined: secrets come from secretKeyRefs, by the documented
// Secret names, never from a literal value or an argument.
func (c *chart) checkSecretsNotInlined() {
	for _, w := range c.workloads() {
		spec := &w.template.Spec
		for _, ctr := range slices.Concat(spec.InitContainers, spec.Containers) {
			for _, e := range ctr.Env {
				if sensitive(e.Name) && (e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
					c.errorf("%s/%s: %s is not taken from a Secret", w.name, ctr.Name, e.Name)
				}
			}
			for _, arg := range slices.Concat(ctr.Command, ctr.Args) {
				name, _, _ := strings.Cut(arg, "=")
				if slices.Contains(secretFlags, name) {
					c.errorf("%s/%s: secret flag %s on the command line", w.name, ctr.Name, name)
				}
			}
		}
	}
	for _, literal := range []string{"postgres://", "postgresql://", "osht_"} {
		if strings.Contains(c.text, literal) {
			c.errorf("the rendered chart contains %q: a secret value was inlined", literal)
		}
	}
	gw := container(&must[appsv1.StatefulSet](c, "StatefulSet", fullname).Spec.Template.Spec, "gateway")
	want := map[string][2]string{"OPENSHELL_GATEWAY_TOKENS": {fullname + "-tokens", "tokens"}}
	if c.set.replicas > 1 {
		want["OPENSHELL_PEER_TOKEN"] = [2]string{fullname + "-peer", "token"}
	}
	if c.set.database {
		want["OPENSHELL_DATABASE_URL"] = [2]string{"openshell-postgres", "url"}
	}
	for _, name := range []string{"OPENSHELL_GATEWAY_TOKENS", "OPENSHELL_PEER_TOKEN", "OPENSHELL_DATABASE_URL"} {
		e := env(gw, name)
		ref, wanted := want[name]
		switch {
		case !wanted && e != nil:
			c.errorf("gateway sets %s, which this value set does not use", name)
		case wanted && (e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil):
			c.errorf("gateway: %s is not a secretKeyRef", name)
		case wanted && (e.ValueFrom.SecretKeyRef.Name != ref[0] || e.ValueFrom.SecretKeyRef.Key != ref[1]):
			c.errorf("gateway: %s from Secret %s key %s, want %s key %s", name,
				e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key, ref[0], ref[1])
		}
	}
}

// checkSecurity: namespaces isolation runs the gateway and hosts as root in
// privileged containers; `none` and every other container run restricted.
func (c *chart) checkSecurity() {
	for _, w := range c.workloads() {
		spec := &w.template.Spec
		for _, ctr := range spec.InitContainers {
			c.restricted(w.name+"/"+ctr.Name, spec.SecurityContext, ctr.SecurityContext)
		}
		for _, ctr := range spec.Containers {
			where := w.name + "/" + ctr.Name
			isolating := ctr.Name == "gateway" || ctr.Name == "host"
			if isolating && c.set.isolation == "namespaces" {
				sc := ctr.SecurityContext
				if sc == nil || sc.Privileged == nil || !*sc.Privileged || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
					c.errorf("%s: --isolation namespaces needs root in a privileged container, got %+v", where, sc)
				}
				continue
			}
			c.restricted(where, spec.SecurityContext, ctr.SecurityContext)
		}
	}
}

// restricted: what the restricted Pod Security Standard asks, and a
// read-only root file system.
func (c *chart) restricted(where string, pod *corev1.PodSecurityContext, sc *corev1.SecurityContext) {
	c.t.Helper()
	if sc == nil {
		c.errorf("%s: no securityContext", where)
		return
	}
	nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (pod != nil && pod.RunAsNonRoot != nil && *pod.RunAsNonRoot)
	uid := sc.RunAsUser
	if uid == nil && pod != nil {
		uid = pod.RunAsUser
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil && pod != nil {
		seccomp = pod.SeccompProfile
	}
	switch {
	case !nonRoot || uid == nil || *uid == 0:
		c.errorf("%s: not run as a non-root user", where)
	case sc.Privileged != nil && *sc.Privileged:
		c.errorf("%s: privileged", where)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		c.errorf("%s: privilege escalation allowed", where)
	case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) != 0:
		c.errorf("%s: capabilities %+v, want ALL dropped and none added", where, sc.Capabilities)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		c.errorf("%s: writable root file system", where)
	case seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault:
		c.errorf("%s: seccomp profile %+v, want RuntimeDefault", where, seccomp)
	}
}

// checkHosts: host ids from pod names, each pod reading its own token from
// the host-tokens Secret in a file only it may read.
func (c *chart) checkHosts() {
	name := fullname + "-host"
	sts := find[appsv1.StatefulSet](c, "StatefulSet", name)
	if c.set.hosts == 0 {
		return
	}
	if sts == nil {
		c.t.Fatalf("no hosts StatefulSet")
	}
	if sts.Spec.Replicas == nil || int(*sts.Spec.Replicas) != c.set.hosts {
		c.errorf("hosts replicas %s, want %d", show(sts.Spec.Replicas), c.set.hosts)
	}
	gwFlags := flags(container(&must[appsv1.StatefulSet](c, "StatefulSet", fullname).Spec.Template.Spec, "gateway").Args)
	for _, flag := range []string{"--host-lost-after", "--host-lost-policy"} {
		c.one("gateway", gwFlags, flag)
	}
	pod := &sts.Spec.Template.Spec
	host := container(pod, "host")
	if host == nil {
		c.t.Fatalf("no host container")
	}
	if !slices.Equal(host.Command, []string{"openshell-supervisor"}) || len(host.Args) == 0 || host.Args[0] != "host" {
		c.errorf("host runs %v %v, want openshell-supervisor host", host.Command, host.Args)
	}
	f := flags(host.Args)
	c.checkPodName(host, "host")
	if id := c.one("host", f, "--host-id"); id != podNameRef {
		c.errorf("--host-id %q, want %s: the host id is the pod name", id, podNameRef)
	}
	if got := c.one("host", f, "--gateway"); got != c.supervisorURL() {
		c.errorf("host --gateway %q, want %q", got, c.supervisorURL())
	}
	if got := c.one("host", f, "--isolation"); got != c.set.isolation {
		c.errorf("host --isolation %q, want %q", got, c.set.isolation)
	}
	root := c.one("host", f, "--root")
	if !c.mounted(pod, host, root, sts.Spec.VolumeClaimTemplates) {
		c.errorf("the host root %s is not a volume", root)
	}
	tokenFile := c.one("host", f, "--token-file")

	var secret *corev1.SecretVolumeSource
	for _, volume := range pod.Volumes {
		if volume.Name == hostTokenVolume {
			secret = volume.Secret
		}
	}
	if secret == nil || secret.SecretName != fullname+"-host-tokens" || secret.DefaultMode == nil || *secret.DefaultMode != 0o400 {
		c.t.Fatalf("volume %s: want Secret %s-host-tokens with defaultMode 0400, got %+v", hostTokenVolume, fullname, secret)
	}
	// Every mount of the Secret is the pod's own key alone.
	for _, ctr := range slices.Concat(pod.InitContainers, pod.Containers) {
		for _, mount := range ctr.VolumeMounts {
			if mount.Name == hostTokenVolume && (mount.SubPathExpr != podNameRef || !mount.ReadOnly) {
				c.errorf("%s mounts %s as %+v: want only its own key (subPathExpr %s), read-only", ctr.Name, hostTokenVolume, mount, podNameRef)
			}
		}
	}
	tokenDir := path.Dir(tokenFile)
	if c.set.isolation == "namespaces" {
		ownKey := slices.ContainsFunc(host.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == hostTokenVolume && m.MountPath == tokenFile
		})
		if !ownKey {
			c.errorf("--token-file %s is not the pod's key of the Secret", tokenFile)
		}
		hidden := slices.ContainsFunc(f["--hide"], func(p string) bool { return p == tokenFile || p == tokenDir })
		if !hidden {
			c.errorf("the host token %s is not hidden from sandboxes (--hide %v)", tokenFile, f["--hide"])
		}
		if len(pod.InitContainers) != 0 {
			c.errorf("hosts run as root need no token copy, got init containers")
		}
		return
	}
	// isolation none: an init container copies the key into a memory volume
	// (mode 0600, the host's own uid) that the host mounts read-only.
	if len(pod.InitContainers) != 1 {
		c.t.Fatalf("non-root hosts need one init container copying the token, got %d", len(pod.InitContainers))
	}
	initCtr := &pod.InitContainers[0]
	c.checkPodName(initCtr, "host-token init container")
	script := strings.Join(initCtr.Command, " ")
	if !strings.Contains(script, "umask 077") || !strings.Contains(script, tokenFile) {
		c.errorf("the token copy %q does not write %s with umask 077", script, tokenFile)
	}
	var copyVolume string
	for _, mount := range host.VolumeMounts {
		if mount.MountPath == tokenDir {
			copyVolume = mount.Name
			if !mount.ReadOnly {
				c.errorf("the host may write its token volume")
			}
		}
	}
	memory := slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool {
		return v.Name == copyVolume && v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory
	})
	shared := slices.ContainsFunc(initCtr.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == copyVolume && m.MountPath == tokenDir && !m.ReadOnly
	})
	if !memory || !shared {
		c.errorf("the token copy does not land in a memory emptyDir at %s shared with the host", tokenDir)
	}
}

// checkEdge: one route per replica to that replica's Service.
func (c *chart) checkEdge() {
	if !c.set.edge {
		return
	}
	deploy := must[appsv1.Deployment](c, "Deployment", fullname+"-edge")
	edge := container(&deploy.Spec.Template.Spec, "edge")
	if edge == nil {
		c.t.Fatalf("no edge container")
	}
	if len(edge.Args) == 0 || edge.Args[0] != "edge" {
		c.errorf("edge args %v, want the edge subcommand", edge.Args)
	}
	f := flags(edge.Args)
	if _, ok := f["--allow-public"]; !ok {
		c.errorf("the edge listens on the pod address without --allow-public")
	}
	var want []string
	for i := range c.set.replicas {
		want = append(want, replicaID(i)+"="+serviceURL(replicaService(i)))
	}
	if !slices.Equal(f["--replica"], want) {
		c.errorf("edge routes %v, want %v", f["--replica"], want)
	}
	metrics := portNamed(edge, "metrics")
	if portOf(c.one("edge", f, "--metrics-listen")) != fmt.Sprint(metrics) {
		c.errorf("edge --metrics-listen is not on its metrics port %d", metrics)
	}
	if portOf(c.one("edge", f, "--listen")) != fmt.Sprint(portNamed(edge, "grpc")) {
		c.errorf("edge --listen is not on its grpc port")
	}
	c.checkProbes("edge", edge)
	c.checkScrape("edge", &deploy.Spec.Template, metrics)
}

// checkIngress: gRPC to the right backend, the peer service refused, and the
// opt-in snippet routing each replica's id to its Service.
func (c *chart) checkIngress() {
	if !c.set.ingress {
		return
	}
	main := must[networkingv1.Ingress](c, "Ingress", fullname)
	if main.Annotations["nginx.ingress.kubernetes.io/backend-protocol"] != "GRPC" {
		c.errorf("Ingress %s does not speak gRPC upstream", main.Name)
	}
	backend := fullname
	if c.set.edge {
		backend = fullname + "-edge"
	}
	if got := ingressBackends(main); !slices.Equal(got, []string{backend}) {
		c.errorf("Ingress %s sends calls to %v, want %s", main.Name, got, backend)
	}
	if len(main.Spec.TLS) == 0 || main.Spec.TLS[0].SecretName == "" {
		c.errorf("Ingress %s without TLS: ingress-nginx serves gRPC over TLS only", main.Name)
	}
	snippet, hasSnippet := main.Annotations["nginx.ingress.kubernetes.io/configuration-snippet"]
	if hasSnippet != c.set.snippet {
		c.errorf("replica routing snippet present %v, want %v", hasSnippet, c.set.snippet)
	}
	if hasSnippet {
		if n := strings.Count(snippet, "if ("); n != c.set.replicas {
			c.errorf("the snippet has %d conditions, want one per replica (%d)", n, c.set.replicas)
		}
		for i := range c.set.replicas {
			route := fmt.Sprintf("if ($http_x_openshell_replica = %q) {\n    grpc_pass grpc://%s:%d;\n}",
				replicaID(i), serviceHost(replicaService(i)), grpcPort)
			if !strings.Contains(snippet, route) {
				c.errorf("the snippet does not route %s to its Service:\n%s", replicaID(i), snippet)
			}
		}
	}

	deny := must[networkingv1.Ingress](c, "Ingress", fullname+"-peer-deny")
	if deny.Annotations["nginx.ingress.kubernetes.io/denylist-source-range"] != "0.0.0.0/0,::/0" {
		c.errorf("Ingress %s does not deny every address", deny.Name)
	}
	peers, err := Services(protoDir)
	if err != nil {
		c.t.Fatal(err)
	}
	peers = slices.DeleteFunc(peers, func(s string) bool { return !IsPeer(s) })
	var paths []string
	for _, rule := range deny.Spec.Rules {
		if rule.Host != main.Spec.Rules[0].Host {
			c.errorf("the peer refusal is on host %q, the client Ingress on %q", rule.Host, main.Spec.Rules[0].Host)
		}
		for _, p := range rule.HTTP.Paths {
			if p.PathType == nil || *p.PathType != networkingv1.PathTypePrefix {
				c.errorf("peer refusal path %s is not a Prefix path", p.Path)
			}
			paths = append(paths, p.Path)
		}
	}
	for _, service := range peers {
		if !slices.Contains(paths, "/"+service) {
			c.errorf("the peer service %s (proto/) is not refused by Ingress %s (paths %v)", service, deny.Name, paths)
		}
	}
}

func ingressBackends(ing *networkingv1.Ingress) []string {
	var out []string
	for _, rule := range ing.Spec.Rules {
		for _, p := range rule.HTTP.Paths {
			if p.Backend.Service != nil && p.Backend.Service.Port.Number == grpcPort {
				out = append(out, p.Backend.Service.Name)
			}
		}
	}
	return out
}

// GRPCRoute limits of gateway.networking.k8s.io/v1 (its CRD validation).
const (
	maxRouteRules        = 16
	maxMatchesPerRule    = 64
	maxMatchesPerRouting = 128
)

// checkGRPCRoute: a rule per replica matching the replica header exactly,
// then the default rule; the public services only, never the peer service.
func (c *chart) checkGRPCRoute() {
	if !c.set.gatewayAPI {
		return
	}
	route := must[gatewayv1.GRPCRoute](c, "GRPCRoute", fullname)
	if len(route.Spec.ParentRefs) == 0 {
		c.errorf("GRPCRoute attaches to no Gateway")
	}
	rules := route.Spec.Rules
	if len(rules) != c.set.replicas+1 {
		c.t.Fatalf("GRPCRoute has %d rules, want one per replica (%d) and the default", len(rules), c.set.replicas)
	}
	total := 0
	for i, rule := range rules {
		total += len(rule.Matches)
		if len(rule.Matches) > maxMatchesPerRule {
			c.errorf("GRPCRoute rule %d has %d matches (at most %d)", i, len(rule.Matches), maxMatchesPerRule)
		}
		header, backend := replicaID(i), replicaService(i)
		if i == c.set.replicas {
			header, backend = "", fullname
		}
		var services []string
		for _, match := range rule.Matches {
			m := match.Method
			if m == nil || m.Service == nil || m.Method != nil || m.Type == nil || *m.Type != gatewayv1.GRPCMethodMatchExact {
				c.errorf("GRPCRoute rule %d: match %+v is not an exact match of a whole service", i, m)
				continue
			}
			if IsPeer(*m.Service) {
				c.errorf("GRPCRoute rule %d routes the peer service %s", i, *m.Service)
			}
			services = append(services, *m.Service)
			switch {
			case header == "" && len(match.Headers) != 0:
				c.errorf("GRPCRoute default rule matches headers %+v", match.Headers)
			case header != "" && (len(match.Headers) != 1 || match.Headers[0].Type == nil ||
				*match.Headers[0].Type != gatewayv1.GRPCHeaderMatchExact ||
				string(match.Headers[0].Name) != replicaHeader || match.Headers[0].Value != header):
				c.errorf("GRPCRoute rule %d: headers %+v, want %s exactly %q", i, match.Headers, replicaHeader, header)
			}
		}
		sort.Strings(services)
		if !slices.Equal(services, c.public) {
			c.errorf("GRPCRoute rule %d matches services %v, want the public ones of proto/ %v", i, services, c.public)
		}
		if len(rule.BackendRefs) != 1 {
			c.errorf("GRPCRoute rule %d has %d backends, want 1", i, len(rule.BackendRefs))
			continue
		}
		ref := rule.BackendRefs[0].BackendRef.BackendObjectReference
		kindOK := ref.Kind == nil || *ref.Kind == "Service"
		if string(ref.Name) != backend || !kindOK || ref.Port == nil || *ref.Port != grpcPort || ref.Namespace != nil {
			c.errorf("GRPCRoute rule %d sends to %+v, want Service %s port %d", i, ref, backend, grpcPort)
		}
		if find[corev1.Service](c, "Service", string(ref.Name)) == nil {
			c.errorf("GRPCRoute rule %d names Service %s, which the chart does not render", i, ref.Name)
		}
	}
	if len(rules) > maxRouteRules || total > maxMatchesPerRouting {
		c.errorf("GRPCRoute has %d rules and %d matches (at most %d and %d)", len(rules), total, maxRouteRules, maxMatchesPerRouting)
	}
}
