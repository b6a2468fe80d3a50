package auth

import (
	"reflect"
	"strings"
	"testing"
)

// Hashes of "a", "b" and "c", for key files.
var (
	hashA = HashKey("a")
	hashB = HashKey("b")
)

func TestAuthParseKeys(t *testing.T) {
	file := "# clients\n" +
		"- id: team-a\n" +
		"  hash: " + hashA + "\n" +
		"  models: [m, other]\n" +
		"  tier: 2\n" +
		"  requests_per_minute: 600\n" +
		"  tokens_per_minute: 2.5e5\n" +
		"- id: batch\n" +
		"  hash: " + hashB + "\n"
	keys, err := ParseKeys([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	want := []KeyConfig{
		{ID: "team-a", Hash: hashA, Models: []string{"m", "other"}, Tier: 2, RequestsPerMinute: 600, TokensPerMinute: 250000},
		{ID: "batch", Hash: hashB},
	}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("got %+v\nwant %+v", keys, want)
	}
	for _, empty := range []string{"", "# no keys yet\n", "~\n", "[]\n"} {
		keys, err := ParseKeys([]byte(empty))
		if err != nil || len(keys) != 0 {
			t.Errorf("%q: %v %v, want no keys and no error", empty, keys, err)
		}
	}
}

func TestAuthParseKeysRejects(t *testing.T) {
	const secret = "sk-live-do-not-print-me-0123456789"
	tests := []struct {
		name string
		file string
		want []string
	}{
		{"syntax", "- id: a\n  hash: [\n", []string{"keys file:", "line"}},
		{"not a list", "id: a\nhash: " + hashA + "\n", []string{"line 1: keys file must be a YAML list"}},
		{"scalar item", "- " + hashA + "\n", []string{"line 1: keys[0]: must be a mapping"}},
		{"unknown field", "- id: a\n  hash: " + hashA + "\n  modles: [m]\n", []string{"line 3: keys[0].modles: unknown key", "known keys: id, hash, models"}},
		{"field twice", "- id: a\n  hash: " + hashA + "\n  id: b\n", []string{"line 3: keys[0].id: given twice"}},
		{"raw key as hash", "- id: a\n  hash: " + secret + "\n", []string{"line 2: keys[0].hash: must be \"sha256:\""}},
		{"raw key with prefix", "- id: a\n  hash: sha256:" + secret + "\n", []string{"line 2: keys[0].hash"}},
		{"missing hash", "- id: a\n", []string{"line 1: keys[0].hash"}},
		{"missing id", "- hash: " + hashA + "\n", []string{"line 1: keys[0].id: required"}},
		{"tier not a number", "- id: a\n  hash: " + hashA + "\n  tier: " + secret + "\n", []string{"line 3: keys[0].tier: must be an integer"}},
		{"rate not a number", "- id: a\n  hash: " + hashA + "\n  tokens_per_minute: lots\n", []string{"line 3: keys[0].tokens_per_minute: must be a number"}},
		{"negative rate", "- id: a\n  hash: " + hashA + "\n  requests_per_minute: -5\n", []string{"line 3: keys[0].requests_per_minute: must be a finite number >= 0"}},
		{"nan rate", "- id: a\n  hash: " + hashA + "\n  requests_per_minute: .nan\n", []string{"line 3: keys[0].requests_per_minute"}},
		{"models scalar", "- id: a\n  hash: " + hashA + "\n  models: m\n", []string{"line 3: keys[0].models: must be a list"}},
		{"models empty", "- id: a\n  hash: " + hashA + "\n  models: []\n", []string{"line 3: keys[0].models: must name at least one model"}},
		{"models null entry", "- id: a\n  hash: " + hashA + "\n  models: [m, ~]\n", []string{"line 3: keys[0].models: must be a list"}},
		{"id as mapping", "- id: {x: 1}\n  hash: " + hashA + "\n", []string{"line 1: keys[0].id: must be a string"}},
		{"duplicate id", "- id: a\n  hash: " + hashA + "\n- id: a\n  hash: " + hashB + "\n", []string{"line 3: keys[1].id: already used by the key at line 1"}},
		{"duplicate hash", "- id: a\n  hash: " + hashA + "\n- id: b\n  hash: " + hashA + "\n", []string{"line 3: keys[1].hash: already used"}},
		{"two documents", "- id: a\n  hash: " + hashA + "\n---\n- id: b\n", []string{"single YAML document"}},
		{
			"every problem reported",
			"- id: a b\n  hash: x\n- id: c\n  hash: " + hashA + "\n  tier: -1\n  color: red\n",
			[]string{"line 1: keys[0].id", "line 2: keys[0].hash", "line 5: keys[1].tier: must be >= 0", "line 6: keys[1].color: unknown key"},
		},
		{
			"a field that did not decode is reported once",
			"- id: a\n  hash: {}\n  tier: x\n  models: [m, '']\n",
			[]string{"line 2: keys[0].hash: must be a string", "line 3: keys[0].tier: must be an integer", "line 4: keys[0].models[1]: must be a model name"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys, err := ParseKeys([]byte(tt.file))
			if err == nil {
				t.Fatalf("accepted: %+v", keys)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			if strings.Contains(err.Error(), "do-not-print-me") {
				t.Errorf("error quotes a value that may be a key:\n%v", err)
			}
		})
	}
}
