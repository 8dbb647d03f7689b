// Command k8s-manifest decodes Kubernetes manifests with the API's own Go
// types, refusing any field the types do not have (case-sensitive names,
// as the API server decodes), and prints each object
// back as JSON (one per line) for a test to check. It needs no cluster.
//
//	k8s-manifest FILE...
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// decoders by apiVersion and kind: the kinds the project ships.
var decoders = map[string]func() any{
	"apps/v1/DaemonSet": func() any { return &appsv1.DaemonSet{} },
	"v1/ServiceAccount": func() any { return &corev1.ServiceAccount{} },
	"v1/ConfigMap":      func() any { return &corev1.ConfigMap{} },
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: k8s-manifest FILE...")
		os.Exit(2)
	}
	for _, name := range os.Args[1:] {
		if err := check(name); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			os.Exit(1)
		}
	}
}

func check(name string) error {
	text, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	for i, doc := range bytes.Split(text, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return fmt.Errorf("document %d: %w", i+1, err)
		}
		newObject, ok := decoders[meta.APIVersion+"/"+meta.Kind]
		if !ok {
			return fmt.Errorf("document %d: unsupported kind %s/%s", i+1, meta.APIVersion, meta.Kind)
		}
		data, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return fmt.Errorf("document %d: %w", i+1, err)
		}
		// As the API server decodes: field names match case-sensitively,
		// and an unknown or repeated field is an error.
		object := newObject()
		strict, err := kjson.UnmarshalStrict(data, object)
		if err != nil {
			return fmt.Errorf("document %d (%s): %w", i+1, meta.Kind, err)
		}
		if len(strict) > 0 {
			return fmt.Errorf("document %d (%s): %v", i+1, meta.Kind, strict)
		}
		line, err := json.Marshal(object)
		if err != nil {
			return err
		}
		fmt.Println(string(line))
	}
	return nil
}

// stripComments drops whole-line comments, so a document of only comments is empty.
func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line)
		}
	}
	return bytes.Join(out, []byte("\n"))
}
