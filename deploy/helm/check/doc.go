// Package check is the CI check of the Helm chart in deploy/helm/openshell
// (`make check-helm`).
//
// It builds the helm binary pinned in go.mod (a `tool` dependency, from the
// module proxy), then for every value set in deploy/helm/values runs
// `helm lint --strict` and `helm template`, and decodes every rendered
// document strictly into its Kubernetes API type (apps/v1, core/v1,
// policy/v1, networking.k8s.io/v1, gateway.networking.k8s.io/v1): a field the
// type does not have, a value of the wrong type, a duplicate key or a kind
// the chart should not render is an error. The tests then assert what the
// chart promises (README.md beside the chart): replica ids from pod names,
// probes, secrets referenced and never inlined, a GRPCRoute rule per replica
// plus the default, budgets that select their pods, security contexts per
// isolation mode, and value sets the chart must refuse.
//
// The code here only renders and reads; nothing talks to a cluster.
package check
