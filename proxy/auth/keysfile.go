package auth

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// ParseKeys reads a keys file: one YAML list of KeyConfig,
//
//   - id: team-a
//     hash: sha256:2f5e76fffc57b679887fe1c4501f07940ca11af4befc06535a1c68fd7d72173c
//     models: [meta-llama/Llama-3.1-8B-Instruct]
//     tier: 2
//     requests_per_minute: 600
//     tokens_per_minute: 200000
//
// decoded strictly (unknown or repeated fields are errors) and checked as
// ValidateKeys does. Every problem is reported, each with its line. An
// empty file is an empty list. Messages never quote a field's value: a
// secret pasted where its hash belongs must not reach a log.
func ParseKeys(data []byte) ([]KeyConfig, error) {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, fmt.Errorf("keys file: %w", err)
	}
	if err := dec.Decode(new(yaml.Node)); !errors.Is(err, io.EOF) {
		return nil, errors.New("keys file: must be a single YAML document (found more after the first)")
	}
	doc := &root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	if doc.Kind == yaml.ScalarNode && doc.Tag == "!!null" {
		return nil, nil
	}
	if doc.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("line %d: keys file must be a YAML list of keys (\"- id: ...\")", doc.Line)
	}
	var errs []error
	keys := make([]KeyConfig, 0, len(doc.Content))
	lines := make([]int, 0, len(doc.Content))
	for i, item := range doc.Content {
		k, fieldLines, kerrs := decodeKey(item, i)
		errs = append(errs, kerrs...)
		if fieldLines == nil {
			continue // not a mapping
		}
		for _, p := range keyProblems(k) {
			field, _, _ := strings.Cut(p.field, "[")
			line, ok := fieldLines[field]
			if line < 0 {
				continue // did not decode: already reported
			}
			if !ok {
				line = item.Line
			}
			errs = append(errs, fmt.Errorf("line %d: keys[%d].%s: %s", line, i, p.field, p.msg))
		}
		keys = append(keys, k)
		lines = append(lines, item.Line)
	}
	for _, d := range duplicateKeys(keys) {
		errs = append(errs, fmt.Errorf("line %d: keys[%d].%s: already used by the key at line %d", lines[d.i], d.i, d.field, lines[d.prev]))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return keys, nil
}

// keyFields are the keys of one entry, in KeyConfig order.
var keyFields = []string{"id", "hash", "models", "tier", "requests_per_minute", "tokens_per_minute"}

// decodeKey decodes one list item field by field, so that type errors name
// the field and line without quoting the value. fieldLines maps each field
// present to its line, or to -1 when it did not decode; it is nil when the
// item is not a mapping.
func decodeKey(item *yaml.Node, i int) (k KeyConfig, fieldLines map[string]int, errs []error) {
	if item.Kind != yaml.MappingNode {
		return k, nil, []error{fmt.Errorf("line %d: keys[%d]: must be a mapping (id: ..., hash: ...)", item.Line, i)}
	}
	fieldLines = make(map[string]int, len(keyFields))
	for j := 0; j+1 < len(item.Content); j += 2 {
		name, v := item.Content[j], item.Content[j+1]
		at := fmt.Sprintf("line %d: keys[%d].%s", name.Line, i, name.Value)
		if _, dup := fieldLines[name.Value]; dup {
			errs = append(errs, fmt.Errorf("%s: given twice", at))
			continue
		}
		fieldLines[name.Value] = name.Line
		var err error
		var want string
		switch name.Value {
		case "id":
			err, want = v.Decode(&k.ID), "a string"
		case "hash":
			err, want = v.Decode(&k.Hash), "a string"
		case "models":
			k.Models, err = decodeModels(v)
			want = "a list of model names (omit it to allow every model)"
		case "tier":
			err, want = v.Decode(&k.Tier), "an integer"
		case "requests_per_minute":
			err, want = v.Decode(&k.RequestsPerMinute), "a number"
		case "tokens_per_minute":
			err, want = v.Decode(&k.TokensPerMinute), "a number"
		default:
			errs = append(errs, fmt.Errorf("%s: unknown key (known keys: %s)", at, strings.Join(keyFields, ", ")))
			continue
		}
		if err != nil || (v.Kind != yaml.ScalarNode && name.Value != "models") {
			errs = append(errs, fmt.Errorf("%s: must be %s", at, want))
			fieldLines[name.Value] = -1
		}
	}
	return k, fieldLines, errs
}

// decodeModels reads a flow or block list of model names; null entries
// are errors rather than dropped, so a typo cannot widen a key's access.
func decodeModels(v *yaml.Node) ([]string, error) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return nil, nil
	}
	if v.Kind != yaml.SequenceNode {
		return nil, errors.New("not a list")
	}
	models := make([]string, 0, len(v.Content))
	for _, item := range v.Content {
		if item.Kind != yaml.ScalarNode || item.Tag == "!!null" {
			return nil, errors.New("not a name")
		}
		models = append(models, item.Value)
	}
	return models, nil
}

// ValidateKeys checks keys for a KeyStore and reports every problem, each
// prefixed by path and the key's index ("auth.keys[2].hash: ..."): ids and
// hashes present, well-formed and unique, model names non-empty (and an
// empty, non-nil list refused: omit Models to allow every model), tier
// and rates non-negative and finite. Messages never quote a hash field's value.
func ValidateKeys(path string, keys []KeyConfig) error {
	var errs []error
	for i, k := range keys {
		for _, p := range keyProblems(k) {
			errs = append(errs, fmt.Errorf("%s[%d].%s: %s", path, i, p.field, p.msg))
		}
	}
	for _, d := range duplicateKeys(keys) {
		errs = append(errs, fmt.Errorf("%s[%d].%s: already used by %s[%d]", path, d.i, d.field, path, d.prev))
	}
	return errors.Join(errs...)
}

// keyProblem is one thing wrong with one field of a key.
type keyProblem struct{ field, msg string }

// keyProblems lists what is wrong with k on its own.
func keyProblems(k KeyConfig) []keyProblem {
	var ps []keyProblem
	add := func(field, format string, args ...any) {
		ps = append(ps, keyProblem{field, fmt.Sprintf(format, args...)})
	}
	if msg := checkKeyID(k.ID); msg != "" {
		add("id", "%s", msg)
	}
	if !validHash(k.Hash) {
		// The value is never echoed: it may be the key itself.
		add("hash", "must be %q followed by 64 hex digits (the SHA-256 of the key: gpurouter serve --hash-key KEY), not the key itself", hashPrefix)
	}
	if k.Models != nil && len(k.Models) == 0 {
		add("models", "must name at least one model; omit it to allow every model")
	}
	for j, m := range k.Models {
		if strings.TrimSpace(m) == "" || strings.TrimSpace(m) != m || !printable(m) {
			add(fmt.Sprintf("models[%d]", j), "must be a model name: printable, without leading or trailing spaces")
		}
	}
	if k.Tier < 0 {
		add("tier", "must be >= 0, got %d", k.Tier)
	}
	for _, r := range []struct {
		field string
		v     float64
	}{{"requests_per_minute", k.RequestsPerMinute}, {"tokens_per_minute", k.TokensPerMinute}} {
		if math.IsNaN(r.v) || math.IsInf(r.v, 0) || r.v < 0 {
			add(r.field, "must be a finite number >= 0 (0 = unlimited), got %g", r.v)
		}
	}
	return ps
}

// maxKeyIDLen bounds a key id: it is a metric label and a log field.
const maxKeyIDLen = 64

func checkKeyID(id string) string {
	if id == "" {
		return "required"
	}
	if len(id) > maxKeyIDLen {
		return fmt.Sprintf("must be at most %d characters", maxKeyIDLen)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._:@/-", c)) {
			return "may only contain letters, digits and . _ : @ / -"
		}
	}
	return ""
}

func validHash(h string) bool {
	hx, ok := strings.CutPrefix(h, hashPrefix)
	if !ok || len(hx) != 64 {
		return false
	}
	for i := 0; i < len(hx); i++ {
		c := hx[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// duplicate is a key whose field repeats an earlier key's.
type duplicate struct {
	i, prev int
	field   string
}

// duplicateKeys finds repeated ids and hashes (hashes compared as digests,
// so letter case does not hide a repeat).
func duplicateKeys(keys []KeyConfig) []duplicate {
	var out []duplicate
	ids := make(map[string]int, len(keys))
	hashes := make(map[string]int, len(keys))
	for i, k := range keys {
		if prev, dup := ids[k.ID]; dup && k.ID != "" {
			out = append(out, duplicate{i, prev, "id"})
		} else {
			ids[k.ID] = i
		}
		if !validHash(k.Hash) {
			continue
		}
		h := strings.ToLower(k.Hash)
		if prev, dup := hashes[h]; dup {
			out = append(out, duplicate{i, prev, "hash"})
		} else {
			hashes[h] = i
		}
	}
	return out
}
