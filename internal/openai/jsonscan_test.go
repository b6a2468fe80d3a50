package openai

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

// EachMember finds the members fastjson's parse of the whole object
// holds, in order, and IDArrays reads what the tree-based readers read
// from every value it takes.
func FuzzMemberScan(f *testing.F) {
	for _, s := range []string{
		`{}`, ` { "a" : 1 , "b":[1,2] } `, `{"a":"x\"y","b\\"":{"c":[]}}`, `{"mod\u0065l":"m","a":null,"a":true}`,
		`{"p":[1,2,3]}`, `{"p":[[1,2],[3],[]]}`, `{"p":[]}`, `{"p":[1e3,-2.5E-1]}`, `{"p":[[1,[2]]]}`, `{"p":[1,"a"]}`,
		`{"p":[true]}`, `{"p":[[1],2]}`, "{\"a\":\"\\\\\",\"b\":\"[\"}", `{"a":{"b":{"c":"}"}},"d":"{"}`,
		`{"us\u0061ge":1,"usage":{"a":[]}}`, `{"usage" : {} , "usage":2}`, `{"a":[],"b":{}, "usage":[ ] }`,
		`{` + strings.Repeat(`"k":0,`, MaxMembers) + `"usage":{"prompt_tokens":1}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		body = bytes.TrimSpace(body)
		if CheckJSON(body) != nil || len(body) == 0 || body[0] != '{' {
			return
		}
		var p, q fastjson.Parser
		root, err := q.ParseBytes(body)
		if err != nil {
			t.Fatalf("%q: checked but not parsed: %v", body, err)
		}
		var want []string
		obj, _ := root.Object()
		obj.Visit(func(k []byte, v *fastjson.Value) { want = append(want, string(k)+"="+v.String()) })
		var got []string
		err = EachMember(body, func(key, raw []byte) error {
			k := MemberKey(&p, key)
			v, err := p.ParseBytes(raw)
			if err != nil {
				return fmt.Errorf("member %s: %q is not a value: %w", k, raw, err)
			}
			got = append(got, k+"="+v.String())
			if size, cont, ok := IDArrays(raw); ok {
				wantSize, err := TextSize("p", v)
				if err != nil || size != wantSize || cont != PromptCont(v) {
					return fmt.Errorf("idArrays(%s) = %d, %d; the tree reads %d, %d (%v)", raw, size, cont, wantSize, PromptCont(v), err)
				}
			}
			return nil
		})
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%q:\n eachMember %v %v\n parse      %v", body, got, err, want)
		}
		// The members the check notes are EachMember's, raw bytes and all,
		// and member finds the first of a name as the parse's Get does.
		var m ObjectMembers
		if err := CheckJSONMembers(body, &m); err != nil {
			t.Fatalf("%q: checkJSON passed, checkJSONMembers: %v", body, err)
		}
		var scan, noted []string
		EachMember(body, func(key, raw []byte) error { scan = append(scan, string(key)+"="+string(raw)); return nil }) //nolint:errcheck
		m.Each(body, func(key, raw []byte) error { noted = append(noted, string(key)+"="+string(raw)); return nil })   //nolint:errcheck
		if fmt.Sprint(scan) != fmt.Sprint(noted) {
			t.Fatalf("%q:\n eachMember %q\n noted      %q", body, scan, noted)
		}
		for _, name := range []string{"a", "model", "usage"} {
			raw, known := m.Member(body, name)
			if !known {
				continue
			}
			v := root.Get(name)
			if (v == nil) != (raw == nil) || (v != nil && string(raw) != v.String() && !sameValue(&p, raw, v)) {
				t.Fatalf("%q: member %q = %q, the parse's Get %v", body, name, raw, v)
			}
		}
	})
}

// sameValue reports whether raw parses to v's value.
func sameValue(p *fastjson.Parser, raw []byte, v *fastjson.Value) bool {
	w, err := p.ParseBytes(raw)
	return err == nil && w.String() == v.String()
}
