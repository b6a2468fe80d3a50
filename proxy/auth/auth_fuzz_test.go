package auth

import (
	"reflect"
	"regexp"
	"sort"
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
	wording := fixedWording(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		keys, err := ParseKeys(data)
		if err != nil {
			// A value may happen to be a piece of the parser's own wording
			// (a value "ns_per_minut" and the list of known keys): only
			// what is left once that wording is taken out counts as quoted.
			msg := err.Error()
			for _, w := range wording {
				msg = strings.ReplaceAll(msg, w, "\x00")
			}
			for _, v := range scalarValues(data) {
				if strings.Contains(msg, v) {
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

// fixedWording is the text ParseKeys's messages are made of, whatever the
// input: the digit-free runs of the errors (less where they point) for documents that trip every
// message with values too short to count as quoted. It comes from the
// parser itself so that a reworded message needs no change here.
func fixedWording(tb testing.TB) []string {
	docs := []string{
		"a: b\n",
		"[]\n---\n[]\n",
		"- 1\n" +
			"- {id: 'a b', hash: x, models: [], tier: -1, requests_per_minute: -1, tokens_per_minute: -1, zz: 1}\n" +
			"- {id: {}, hash: {}, models: {}, tier: {}, requests_per_minute: {}, tokens_per_minute: {}}\n" +
			"- {id: " + strings.Repeat("a", maxKeyIDLen+1) + ", models: [' ']}\n" +
			"- {id: a, id: b}\n" +
			"- {id: d, hash: '" + hashA + "'}\n" +
			"- {id: d, hash: '" + hashA + "'}\n",
	}
	// The place ("line 3: keys[2].zz: ") names the document's own fields.
	place := regexp.MustCompile(`^(line \d+: )?(keys\[\d+\](\.[a-z_]+(\[\d+\])?)?: )?`)
	var runs []string
	for _, d := range docs {
		_, err := ParseKeys([]byte(d))
		if err == nil {
			tb.Fatalf("wording document parsed: %q", d)
		}
		for _, line := range strings.Split(err.Error(), "\n") {
			msg := place.ReplaceAllString(line, "")
			runs = append(runs, strings.FieldsFunc(msg, func(r rune) bool { return r >= '0' && r <= '9' })...)
		}
	}
	// Longest first, so a run inside another is not taken out of it first.
	sort.Slice(runs, func(i, j int) bool { return len(runs[i]) > len(runs[j]) })
	return runs
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
