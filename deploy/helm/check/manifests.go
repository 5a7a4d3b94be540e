package check

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

// Manifest is one rendered document, decoded into its API type.
type Manifest struct {
	// Source is the template that rendered it (helm's `# Source:` line).
	Source     string
	APIVersion string
	Kind       string
	Name       string
	// Object is a pointer to the typed object, e.g. *appsv1.StatefulSet.
	Object any
}

// kinds are the only objects the chart may render, by "apiVersion/kind".
var kinds = map[string]func() any{
	"apps/v1/StatefulSet":                    func() any { return &appsv1.StatefulSet{} },
	"apps/v1/Deployment":                     func() any { return &appsv1.Deployment{} },
	"v1/Service":                             func() any { return &corev1.Service{} },
	"policy/v1/PodDisruptionBudget":          func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/Ingress":           func() any { return &networkingv1.Ingress{} },
	"gateway.networking.k8s.io/v1/GRPCRoute": func() any { return &gatewayv1.GRPCRoute{} },
}

// Decode splits `helm template` output into documents and decodes each one
// strictly: YAML with a duplicate key, a field its type lacks, a value of
// the wrong type, trailing data, or an apiVersion/kind outside [kinds] is
// an error naming the template it came from.
func Decode(rendered []byte) ([]Manifest, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(rendered)))
	var out []Manifest
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("splitting the rendered documents: %w", err)
		}
		source := sourceOf(doc)
		if isBlank(doc) {
			continue
		}
		manifest, err := decodeOne(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		manifest.Source = source
		out = append(out, manifest)
	}
}

func decodeOne(doc []byte) (Manifest, error) {
	// Strict: a key given twice is an error, not the last one winning.
	data, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return Manifest{}, fmt.Errorf("not valid YAML: %w", err)
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return Manifest{}, fmt.Errorf("not an object: %w", err)
	}
	key := head.APIVersion + "/" + head.Kind
	newObject, ok := kinds[key]
	if !ok {
		return Manifest{}, fmt.Errorf("kind %q (apiVersion %q) is not one the chart renders", head.Kind, head.APIVersion)
	}
	object := newObject()
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(object); err != nil {
		return Manifest{}, fmt.Errorf("%s %q does not decode as %s: %w", head.Kind, head.Metadata.Name, key, err)
	}
	if decoder.More() {
		return Manifest{}, fmt.Errorf("%s %q: data after the object", head.Kind, head.Metadata.Name)
	}
	if head.Metadata.Name == "" {
		return Manifest{}, fmt.Errorf("%s without metadata.name", head.Kind)
	}
	return Manifest{APIVersion: head.APIVersion, Kind: head.Kind, Name: head.Metadata.Name, Object: object}, nil
}

// sourceOf returns the template named by helm's `# Source: ...` comment.
func sourceOf(doc []byte) string {
	for _, line := range strings.Split(string(doc), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "# Source:"); ok {
			return strings.TrimSpace(rest)
		}
	}
	return "(no source)"
}

// isBlank reports a document of comments and blank lines only.
func isBlank(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && line != "---" && !strings.HasPrefix(line, "#") {
			return false
		}
	}
	return true
}
