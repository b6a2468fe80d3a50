package discovery

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// sets is a Sink that keeps every set it accepts, refusing while fail is
// set.
type sets struct {
	got  [][]Endpoint
	fail error
}

func (s *sets) SetEndpoints(_ context.Context, model string, eps []Endpoint) error {
	if s.fail != nil {
		return s.fail
	}
	s.got = append(s.got, slices.Clone(eps))
	return nil
}

func TestDiff(t *testing.T) {
	a := Endpoint{Name: "a", URL: "http://10.0.0.1:8000"}
	b := Endpoint{Name: "b", URL: "http://10.0.0.2:8000"}
	bDrain := b
	bDrain.Draining = true
	bMoved := b
	bMoved.URL = "http://10.0.0.9:8000"
	for _, tc := range []struct {
		name       string
		prev, next []Endpoint
		want       string
	}{
		{"first set", nil, []Endpoint{a, b}, "added a, added b"},
		{"same", []Endpoint{a, b}, []Endpoint{a, b}, ""},
		{"one goes", []Endpoint{a, b}, []Endpoint{b}, "removed a"},
		{"one drains", []Endpoint{a, b}, []Endpoint{a, bDrain}, "draining b"},
		{"ready again", []Endpoint{a, bDrain}, []Endpoint{a, b}, "ready b"},
		{"new address", []Endpoint{a, b}, []Endpoint{a, bMoved}, "removed b, added b"},
		{"all go", []Endpoint{a, b}, nil, "removed a, removed b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, c := range diff(tc.prev, tc.next) {
				got = append(got, c.kind+" "+c.ep.Name)
			}
			if s := strings.Join(got, ", "); s != tc.want {
				t.Fatalf("diff = %q, want %q", s, tc.want)
			}
		})
	}
}

// The publisher offers only sets that differ from the last one accepted,
// sorted, and logs and counts one change per replica; a refused set is
// offered again, and a repeated refusal logged once.
func TestPublisher(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	sink := &sets{}
	p := NewPublisher("m", "dns", sink, m, zap.New(core))
	ctx := context.Background()
	a := Endpoint{Name: "a", URL: "http://10.0.0.1:8000"}
	b := Endpoint{Name: "b", URL: "http://10.0.0.2:8000"}

	if err := p.Publish(ctx, []Endpoint{b, a}); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(ctx, []Endpoint{a, b}); err != nil {
		t.Fatal(err)
	}
	if len(sink.got) != 1 || sink.got[0][0].Name != "a" {
		t.Fatalf("sink got %v; want one sorted set", sink.got)
	}
	sink.fail = errors.New("no")
	b.Draining = true
	for range 3 {
		if err := p.Publish(ctx, []Endpoint{a, b}); err == nil {
			t.Fatal("refusal not returned")
		}
	}
	if n := logs.FilterMessage("discovery: replica set refused").Len(); n != 1 {
		t.Errorf("%d lines for one refusal repeated, want 1", n)
	}
	sink.fail = nil
	if err := p.Publish(ctx, []Endpoint{a, b}); err != nil {
		t.Fatal(err)
	}
	if len(sink.got) != 2 {
		t.Fatalf("the refused set was not offered again: %v", sink.got)
	}
	for change, want := range map[string]float64{ChangeAdded: 2, ChangeDraining: 1, ChangeRemoved: 0} {
		if got := testutil.ToFloat64(m.changes.WithLabelValues("m", "dns", change)); got != want {
			t.Errorf("changes{%s} = %v, want %v", change, got, want)
		}
	}
	if got := testutil.ToFloat64(m.errors.WithLabelValues("m", "dns")); got != 3 {
		t.Errorf("errors = %v, want 3", got)
	}
	if n := logs.FilterMessage("discovery: replica added").Len(); n != 2 {
		t.Errorf("%d 'added' lines, want 2", n)
	}
	if n := logs.FilterMessage("discovery: replica draining").Len(); n != 1 {
		t.Errorf("%d 'draining' lines, want 1", n)
	}
}

func TestParseDNSURL(t *testing.T) {
	for _, tc := range []struct {
		in   string
		name string
		port int
		bad  bool
	}{
		{in: "dns://vllm.default.svc.cluster.local:8000", name: "vllm.default.svc.cluster.local", port: 8000},
		{in: "dns://vllm:8000/", name: "vllm", port: 8000},
		{in: "dns://vllm", bad: true},
		{in: "dns://:8000", bad: true},
		{in: "dns://vllm:0", bad: true},
		{in: "dns://vllm:8000/v1", bad: true},
		{in: "http://vllm:8000", bad: true},
	} {
		name, port, err := ParseDNSURL(tc.in)
		if tc.bad != (err != nil) || name != tc.name || port != tc.port {
			t.Errorf("ParseDNSURL(%q) = %q, %d, %v", tc.in, name, port, err)
		}
	}
}
