package proxy

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// FuzzParseKeys checks that whatever ParseKeys accepts builds a KeyStore
// and survives a print-and-parse round trip, and that what it refuses it
// refuses without quoting a hash field's value (it may be a secret).
func FuzzParseKeys(f *testing.F) {
	for _, s := range []string{
		"",
		"[]\n",
		"- id: team-a\n  hash: " + hashA + "\n  models: [m, other]\n  tier: 2\n  requests_per_minute: 600\n  tokens_per_minute: 2.5e5\n- id: b\n  hash: " + hashB + "\n",
		"- {id: a, hash: '" + hashA + "', models: [\"x y\"]}\n",
		"- id: a\n  hash: sha256:zz\n",
		"- id: a\n  hash: " + hashA + "\n  id: b\n",
		"- id: &x a\n  hash: " + hashA + "\n  models: [*x]\n",
		"id: a\n",
		"- id: a\n  hash: " + hashA + "\n  models: []\n  tier: -1\n  requests_per_minute: .inf\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		keys, err := ParseKeys(data)
		if err != nil {
			for _, v := range scalarValues(data) {
				if strings.Contains(err.Error(), v) {
					t.Fatalf("error quotes the value %q: %v", v, err)
				}
			}
			return
		}
		if _, err := NewKeyStore(keys, func() time.Time { return time.Unix(0, 0) }); err != nil {
			t.Fatalf("ParseKeys accepted keys NewKeyStore refuses: %v", err)
		}
		out, err := yaml.Marshal(keys)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		back, err := ParseKeys(out)
		if err != nil {
			t.Fatalf("printed keys do not parse: %v\n%s", err, out)
		}
		if len(keys) == 0 && len(back) == 0 {
			return
		}
		if !reflect.DeepEqual(back, keys) {
			t.Fatalf("round trip differs:\n got %+v\nwant %+v\n%s", back, keys, out)
		}
	})
}

// scalarValues are the non-numeric mapping values of at least 12 bytes in
// a YAML document (where a misplaced key would be): what errors must not
// quote.
func scalarValues(data []byte) []string {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil {
		return nil
	}
	var out []string
	var walk func(n *yaml.Node, depth int)
	walk = func(n *yaml.Node, depth int) {
		if depth > 50 {
			return
		}
		for i, c := range n.Content {
			isKey := n.Kind == yaml.MappingNode && i%2 == 0
			if c.Kind == yaml.ScalarNode && !isKey && len(c.Value) >= 12 {
				if _, err := strconv.ParseFloat(strings.TrimSpace(c.Value), 64); err != nil {
					out = append(out, c.Value)
				}
			}
			walk(c, depth+1)
		}
	}
	walk(&root, 0)
	return out
}
