package openai

import (
	"bytes"
	"fmt"
	"math"

	"github.com/valyala/fastjson"
)

// A JSON body is read member by member: its object's members are found
// in its bytes — noted by the check as it reads them (ObjectMembers,
// CheckJSONMembers), else by a scan (EachMember) — and only those the
// router reads are parsed,
// one at a time, within a bound on the tree they may grow (memberParser).
// fastjson builds a tree of ~400 bytes per value, and ~90 ns: parsed
// whole, one client's 8 MiB of "[0,0,0,…]" under a key nobody reads took
// 2 GB of heap and 2.9 s (TestReadRequestManyValues).

// MaxTreeValues is the most JSON values the router parses out of one
// body: ~25 MB of parse tree and ~25 ms at most. A request holds a few
// hundred; prompts of token ids, which can hold a model's whole context,
// are read from their bytes (IDArrays) instead.
const MaxTreeValues = 1 << 16

// PooledTreeValues is the most values a pooled parser parses (~2 MB of
// tree it then keeps); more take a parser of their own (memberParser.tree).
const PooledTreeValues = 4096

// EachMember calls fn with each member of obj, a JSON object that
// CheckJSON passed, in order: its key as written (within the quotes,
// escapes left) and its value's bytes. It stops at fn's first error; an
// object that does not end where obj does is errJSONSyntax.
func EachMember(obj []byte, fn func(key, raw []byte) error) error {
	i := skipJSONSpace(obj, 1)
	for i < len(obj) && obj[i] == '"' {
		ke := stringEnd(obj, i)
		if ke < 0 {
			return errJSONSyntax
		}
		key := obj[i+1 : ke-1]
		i = skipJSONSpace(obj, ke)
		if i >= len(obj) || obj[i] != ':' {
			return errJSONSyntax
		}
		i = skipJSONSpace(obj, i+1)
		ve := valueEnd(obj, i)
		if ve < 0 {
			return errJSONSyntax
		}
		if err := fn(key, obj[i:ve]); err != nil {
			return err
		}
		i = skipJSONSpace(obj, ve)
		if i < len(obj) && obj[i] == ',' {
			i = skipJSONSpace(obj, i+1)
		}
	}
	if i >= len(obj) || obj[i] != '}' || skipJSONSpace(obj, i+1) != len(obj) {
		return errJSONSyntax
	}
	return nil
}

// MaxMembers is how many members ObjectMembers notes: more than an
// OpenAI request or answer has at its top level.
const MaxMembers = 32

// ObjectMembers are where a JSON object's members are in its bytes, as
// CheckJSONMembers found them. Its zero value holds none.
type ObjectMembers struct {
	n    int
	over bool // more than MaxMembers: each scans the object instead
	at   [MaxMembers]struct{ key, keyEnd, val, valEnd int32 }
}

// key notes a member whose key is the string from k to end (its
// quotes).
func (m *ObjectMembers) key(k, end int) {
	if m.over || m.n == MaxMembers || end > math.MaxInt32 {
		m.over = true
		return
	}
	m.at[m.n].key, m.at[m.n].keyEnd = int32(k+1), int32(end-1)
	m.n++
}

// value notes where the last member's value starts (end false) or ends.
// An offset past int32 (a body over 2 GiB) leaves the members to the
// scan.
func (m *ObjectMembers) value(i int, end bool) {
	switch {
	case m.over:
	case i > math.MaxInt32:
		m.over = true
	case end:
		m.at[m.n-1].valEnd = int32(i)
	default:
		m.at[m.n-1].val = int32(i)
	}
}

// Each is EachMember(obj, fn) for obj, the object m was noted from.
func (m *ObjectMembers) Each(obj []byte, fn func(key, raw []byte) error) error {
	if m.over {
		return EachMember(obj, fn)
	}
	for _, a := range m.at[:m.n] {
		if err := fn(obj[a.key:a.keyEnd], obj[a.val:a.valEnd]); err != nil {
			return err
		}
	}
	return nil
}

// Member is the value of obj's first member named name, as a parse's Get
// finds it (nil when there is none); known is false when m cannot tell —
// more members than it notes, or a key with escapes before that member —
// and obj must be scanned (EachMember).
func (m *ObjectMembers) Member(obj []byte, name string) (raw []byte, known bool) {
	if m.over {
		return nil, false
	}
	for _, a := range m.at[:m.n] {
		key := obj[a.key:a.keyEnd]
		if bytes.IndexByte(key, '\\') >= 0 {
			return nil, false
		}
		if string(key) == name {
			return obj[a.val:a.valEnd], true
		}
	}
	return nil, true
}

func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// MemberKey is a member's key unescaped, as fastjson reads keys; a key
// without escapes is a view of the body, valid while it is.
func MemberKey(p *fastjson.Parser, key []byte) string {
	if bytes.IndexByte(key, '\\') < 0 {
		return BytesView(key)
	}
	q := make([]byte, 0, len(key)+2)
	q = append(append(append(q, '"'), key...), '"')
	v, err := p.ParseBytes(q)
	if err != nil {
		return BytesView(key)
	}
	return string(v.GetStringBytes())
}

// memberParser parses the members a reader reads, out of one budget of
// MaxTreeValues values for the whole body: the tree one body may grow,
// and the time spent growing it, stay bounded however its members repeat.
type memberParser struct {
	p    *fastjson.Parser
	left int // values the body's members may still hold
}

func NewMemberParser(p *fastjson.Parser) memberParser {
	return memberParser{p: p, left: MaxTreeValues}
}

// Tree parses one member's value, refusing it (an error naming the
// member) when the body's members would hold more than MaxTreeValues
// values; the tree is valid until the next parse.
func (m *memberParser) Tree(name string, raw []byte) (*fastjson.Value, error) {
	n := jsonValues(raw, m.left)
	if n > m.left {
		return nil, BadParam(name, fmt.Sprintf("more than %d JSON values in the body", MaxTreeValues))
	}
	m.left -= n
	p := m.p
	if n > PooledTreeValues {
		// A parser keeps its tree's memory for its next parse, in the
		// pool: a large tree is grown by a parser of its own, dropped
		// with the request.
		p = new(fastjson.Parser)
	}
	v, err := p.ParseBytes(raw)
	if err != nil {
		return nil, BadParam("body", fmt.Sprintf("JSON nested more than %d levels deep", MaxJSONDepth))
	}
	return v, nil
}

// jsonValues bounds the JSON values raw holds by its commas and opening
// brackets outside strings, plus one; past max it stops counting. Three
// counts at memchr speed, which count the bytes within strings too, settle
// a value with few of them (no more than PooledTreeValues, so that such a
// count never sends a parse out of the pool); one with many is read
// through, its strings skipped, so that text full of commas is not
// counted as values.
func jsonValues(raw []byte, max int) int {
	n := 1 + bytes.Count(raw, []byte{','}) + bytes.Count(raw, []byte{'{'}) + bytes.Count(raw, []byte{'['})
	if n <= PooledTreeValues {
		return n
	}
	n = 1
	for i := 0; i < len(raw) && n <= max; i++ {
		switch raw[i] {
		case ',', '[', '{':
			n++
		case '"':
			e := stringEnd(raw, i)
			if e < 0 {
				return n
			}
			i = e - 1
		}
	}
	return n
}

// IDArrays reads a prompt of token ids from its bytes, without a parse
// tree: an array of numbers (one prompt) or of arrays of numbers (several).
// size is TextSize's (4 bytes a token), cont PromptCont's; ok is false for
// any other value, which is parsed.
func IDArrays(raw []byte) (size int, cont ContFlags, ok bool) {
	if len(raw) < 2 || raw[0] != '[' {
		return 0, 0, false
	}
	depth, elems, inner := 0, 0, 0
	var first byte
	expect := false // the next number starts an element
	for _, c := range raw {
		switch {
		case c == '[':
			depth++
			switch depth {
			case 2:
				elems++
				if elems == 1 {
					first = '['
				}
				inner = 0
			case 3:
				return 0, 0, false
			}
			expect = true
		case c == ']':
			if depth == 2 {
				size += 4 * inner
			}
			depth--
			expect = false
		case c == ',':
			expect = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
		case c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E':
			if !expect {
				continue
			}
			expect = false
			if depth == 1 {
				elems++
				size += 4
				if elems == 1 {
					first = '0'
				}
			} else {
				inner++
			}
		default:
			return 0, 0, false
		}
	}
	switch {
	case first == '0':
		cont = ContPromptIDs // one prompt of token ids
	case elems > 1:
		cont = ContNo // several prompts
	case first == '[':
		cont = ContPromptIDs
	}
	return size, cont, true
}

// RawType is the type of the JSON value raw (which CheckJSON passed), read
// from its first byte.
func RawType(raw []byte) fastjson.Type {
	if len(raw) == 0 {
		return fastjson.TypeNull
	}
	switch raw[0] {
	case '"':
		return fastjson.TypeString
	case '{':
		return fastjson.TypeObject
	case '[':
		return fastjson.TypeArray
	case 't':
		return fastjson.TypeTrue
	case 'f':
		return fastjson.TypeFalse
	case 'n':
		return fastjson.TypeNull
	}
	return fastjson.TypeNumber
}
