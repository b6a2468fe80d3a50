package helm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/discovery/kubetest"
)

// writeSchemas writes kubeconform's JSON schemas for every kind the API
// server c serves, from its own OpenAPI v2 document, into a new directory,
// named as kubeconform's -schema-location template
// "{{ .ResourceKind }}{{ .KindSuffix }}.json" looks them up
// (deployment-apps-v1.json, service-v1.json). It is what kubeconform's
// openapi2jsonschema.py does, without the network: each kind's definition
// with the definitions it refers to, int-or-string as string or integer,
// quantities as string or number, and (strict) no properties beyond those
// named.
func writeSchemas(t *testing.T, c *kubetest.Cluster) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raw, err := c.Clientset(t).Discovery().RESTClient().Get().AbsPath("/openapi/v2").
		SetHeader("Accept", "application/json").DoRaw(ctx)
	if err != nil {
		t.Fatalf("GET /openapi/v2: %v", err)
	}
	dir := t.TempDir()
	n, err := openAPIToSchemas(raw, dir)
	if err != nil {
		t.Fatal(err)
	}
	if n < 50 {
		t.Fatalf("only %d kinds in the server's OpenAPI", n)
	}
	return dir
}

// openAPIToSchemas converts an OpenAPI v2 document to one schema file per
// group/version/kind in dir and returns how many it wrote.
func openAPIToSchemas(doc []byte, dir string) (int, error) {
	var spec struct {
		Definitions map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(doc, &spec); err != nil {
		return 0, fmt.Errorf("openapi: %w", err)
	}
	defs := map[string]any{}
	for name, d := range spec.Definitions {
		if strings.HasSuffix(name, ".api.resource.Quantity") {
			d = map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}}
		}
		defs[name] = strictify(d)
	}
	n := 0
	for name, d := range spec.Definitions {
		gvks, _ := d.(map[string]any)["x-kubernetes-group-version-kind"].([]any)
		if len(gvks) != 1 {
			continue // none, or a shared type (DeleteOptions, WatchEvent)
		}
		gvk := gvks[0].(map[string]any)
		group, version, kind := gvk["group"].(string), gvk["version"].(string), gvk["kind"].(string)
		file := strings.ToLower(kind)
		if group != "" {
			file += "-" + strings.ToLower(strings.Split(group, ".")[0])
		}
		file += "-" + strings.ToLower(version) + ".json"
		closure := map[string]any{}
		collect(name, defs, closure)
		schema := map[string]any{
			"$schema":     "http://json-schema.org/draft-07/schema#",
			"$ref":        "#/definitions/" + name,
			"definitions": closure,
		}
		b, err := json.Marshal(schema)
		if err != nil {
			return n, err
		}
		if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// strictify returns s with int-or-string formats replaced by their oneOf
// and additionalProperties false on every object schema that names its
// properties and says nothing of others (kubectl's validation).
func strictify(s any) any {
	switch v := s.(type) {
	case map[string]any:
		if v["format"] == "int-or-string" {
			return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}}
		}
		out := make(map[string]any, len(v)+1)
		for k, x := range v {
			if k == "properties" {
				props := map[string]any{}
				for pk, pv := range x.(map[string]any) {
					props[pk] = strictify(pv)
				}
				out[k] = props
				continue
			}
			out[k] = strictify(x)
		}
		if _, ok := v["properties"]; ok {
			if _, set := v["additionalProperties"]; !set {
				out["additionalProperties"] = false
			}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = strictify(x)
		}
		return out
	}
	return s
}

// collect adds name and every definition it refers to, transitively.
func collect(name string, defs, into map[string]any) {
	if _, done := into[name]; done {
		return
	}
	d, ok := defs[name]
	if !ok {
		return
	}
	into[name] = d
	var walk func(any)
	walk = func(s any) {
		switch v := s.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok {
				collect(strings.TrimPrefix(ref, "#/definitions/"), defs, into)
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(d)
}

// kubeconform validates manifests against the schemas in dir, skipping
// the kinds in skip; it returns kubeconform's output and error.
func kubeconform(t *testing.T, bin, dir string, manifests []byte, skip ...string) ([]byte, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "manifests.yaml")
	if err := os.WriteFile(path, manifests, 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"-strict", "-summary", "-schema-location", filepath.Join(dir, "{{ .ResourceKind }}{{ .KindSuffix }}.json")}
	if len(skip) > 0 {
		args = append(args, "-skip", strings.Join(skip, ","))
	}
	out, errb, err := runErr(bin, append(args, path)...)
	return append(out, errb...), err
}
