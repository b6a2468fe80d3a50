package bench

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/proxy/observe"
)

// observe.Record (what the router serves at /debug/requests) and RouterRecord
// (what bench decodes from a remote router) are one JSON schema written
// twice, so that bench reads routers without importing their internals.
// The tests below fail when the two drift apart; the router's side is the
// contract.

// TestRouterRecordSchema: every JSON field of observe.Record exists in
// RouterRecord with a compatible kind, and the other way round.
func TestRouterRecordSchema(t *testing.T) {
	for _, d := range schemaDiff(reflect.TypeFor[observe.Record](), reflect.TypeFor[RouterRecord]()) {
		t.Error(d)
	}
}

// TestRouterRecordRoundTrip: a observe.Record with every field set survives
// JSON into a RouterRecord and back with every value unchanged.
func TestRouterRecordRoundTrip(t *testing.T) {
	var rec observe.Record
	n := 0
	fillValue(t, reflect.ValueOf(&rec).Elem(), "Record", &n)
	in, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var got RouterRecord
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.DisallowUnknownFields() // a router field bench lacks is an error
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("decode the router's record into RouterRecord: %v\n%s", err, in)
	}
	out, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	want, have := jsonDoc(t, in), jsonDoc(t, out)
	for k, v := range want {
		if !reflect.DeepEqual(have[k], v) {
			t.Errorf("field %q: router sent %v, RouterRecord kept %v", k, v, have[k])
		}
	}
	for k := range have {
		if _, ok := want[k]; !ok {
			t.Errorf("field %q: RouterRecord has it, the router's record does not", k)
		}
	}
}

// TestSchemaDiffCatchesDrift: the checker itself sees a missing field, a
// changed kind and a renamed tag, and follows embedded structs as
// encoding/json does.
func TestSchemaDiffCatchesDrift(t *testing.T) {
	type inner struct {
		B int `json:"b"`
	}
	type embedded struct {
		A string `json:"a"`
		inner
	}
	type flat struct {
		A string `json:"a"`
		B int    `json:"b"`
	}
	type missing struct {
		A string `json:"a"`
	}
	type kind struct {
		A string  `json:"a"`
		B float64 `json:"b"`
	}
	type renamed struct {
		A string `json:"a"`
		B int    `json:"bb"`
	}
	type quoted struct {
		A string `json:"a"`
		B int    `json:"b,string"`
	}
	tests := []struct {
		name  string
		other reflect.Type
		want  int // disagreements found
	}{
		{"embedded struct flattened", reflect.TypeFor[embedded](), 0},
		{"missing field", reflect.TypeFor[missing](), 1},
		{"changed kind", reflect.TypeFor[kind](), 1},
		{"renamed tag", reflect.TypeFor[renamed](), 2},
		{"number sent as a string", reflect.TypeFor[quoted](), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := schemaDiff(reflect.TypeFor[flat](), tt.other); len(d) != tt.want {
				t.Fatalf("schemaDiff found %d disagreements, want %d: %q", len(d), tt.want, d)
			}
		})
	}
}

// jsonField is one field of a JSON object as a Go struct declares it.
type jsonField struct {
	t      reflect.Type
	quoted bool // the ",string" option: a scalar travels as a JSON string
}

// jsonFields returns the JSON object fields of struct type t by name, with
// encoding/json's rules: "-" and unexported fields are skipped, an
// untagged embedded struct's fields are promoted, an untagged field is
// named after the Go field.
func jsonFields(t reflect.Type) map[string]jsonField {
	out := map[string]jsonField{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		ft := f.Type
		if f.Anonymous && name == "" {
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range jsonFields(ft) {
					if _, ok := out[k]; !ok { // the outer field wins
						out[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = jsonField{t: ft, quoted: strings.Contains(","+opts+",", ",string,")}
	}
	return out
}

var textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()

// kind is the JSON shape the field encodes to.
func (f jsonField) kind() string {
	k := jsonKind(f.t)
	if f.quoted && (k == "bool" || k == "integer" || k == "number") {
		return "string"
	}
	return k
}

// jsonKind is the JSON shape a Go type encodes to, as far as decoding the
// other side's value depends on it.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Implements(textMarshaler) || reflect.PointerTo(t).Implements(textMarshaler) {
		return "string"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "array of " + jsonKind(t.Elem())
	case reflect.Map:
		return "object of " + jsonKind(t.Elem())
	case reflect.Struct:
		return "object"
	}
	return t.Kind().String()
}

// schemaDiff lists every way struct types a and b disagree as JSON: a field
// only one has, or a field whose kinds differ (objects are compared field
// by field).
func schemaDiff(a, b reflect.Type) []string {
	fa, fb := jsonFields(a), jsonFields(b)
	var out []string
	for name, ja := range fa {
		jb, ok := fb[name]
		if !ok {
			out = append(out, fmt.Sprintf("%q: in %s, missing from %s", name, a, b))
			continue
		}
		ka, kb := ja.kind(), jb.kind()
		if ka != kb {
			out = append(out, fmt.Sprintf("%q: %s in %s (%s), %s in %s (%s)", name, ka, a, ja.t, kb, b, jb.t))
			continue
		}
		if ka == "object" {
			for _, d := range schemaDiff(deref(ja.t), deref(jb.t)) {
				out = append(out, name+"."+d)
			}
		}
	}
	for name := range fb {
		if _, ok := fa[name]; !ok {
			out = append(out, fmt.Sprintf("%q: in %s, missing from %s", name, b, a))
		}
	}
	sort.Strings(out)
	return out
}

func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// fillValue sets v and everything under it to distinct non-zero values, so
// a field added to observe.Record is populated without editing this test; a
// kind it cannot fill fails the test rather than being left zero. Numbers
// are as wide as the field allows (Unix nanoseconds need 64 bits) and
// floats are not exact in float32, so a narrower type on bench's side
// loses them visibly.
func fillValue(t *testing.T, v reflect.Value, path string, n *int) {
	t.Helper()
	*n++
	if v.Type() == reflect.TypeFor[time.Time]() {
		v.Set(reflect.ValueOf(time.Unix(1_700_000_000+int64(*n), 0).UTC()))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("%s-%d", path, *n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		x := int64(1_700_000_000_000_000_000) + int64(*n)
		if v.OverflowInt(x) {
			x = int64(*n)
		}
		v.SetInt(x)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		x := uint64(1_700_000_000_000_000_000) + uint64(*n)
		if v.OverflowUint(x) {
			x = uint64(*n)
		}
		v.SetUint(x)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(*n) + 0.1)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillValue(t, v.Elem(), path, n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fillValue(t, v.Index(0), path+"[0]", n)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fillValue(t, k, path+".key", n)
		fillValue(t, e, path+".value", n)
		v.SetMapIndex(k, e)
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			// encoding/json reads exported fields, and those promoted from
			// an embedded struct even when its type is unexported.
			if f.IsExported() || (f.Anonymous && f.Type.Kind() == reflect.Struct) {
				fillValue(t, v.Field(i), path+"."+f.Name, n)
			}
		}
	default:
		t.Fatalf("%s: cannot fill a %s; teach fillValue", path, v.Kind())
	}
}

// jsonDoc decodes a JSON object keeping numbers exact.
func jsonDoc(t *testing.T, b []byte) map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}
