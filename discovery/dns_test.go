package discovery

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsServer is a real DNS server on a loopback UDP port answering A and
// AAAA queries for one name from records the test sets; SERVFAIL while
// fail is set, NXDOMAIN while there are no records.
type dnsServer struct {
	pc   net.PacketConn
	name string

	mu      sync.Mutex
	records []netip.Addr
	fail    bool
	queries int // A queries answered, one per lookup
}

func startDNS(t *testing.T, name string) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{pc: pc, name: name}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 512)
		for {
			n, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return // closed
			}
			if resp := s.answer(buf[:n]); resp != nil {
				_, _ = pc.WriteTo(resp, addr)
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return s
}

func (s *dnsServer) set(fail bool, addrs ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = fail
	s.records = s.records[:0]
	for _, a := range addrs {
		s.records = append(s.records, netip.MustParseAddr(a))
	}
}

func (s *dnsServer) lookups() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries
}

func (s *dnsServer) answer(req []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	switch {
	case s.fail:
		rh.RCode = dnsmessage.RCodeServerFailure
	case !strings.EqualFold(q.Name.String(), s.name) || len(s.records) == 0:
		rh.RCode = dnsmessage.RCodeNameError
	}
	if q.Type == dnsmessage.TypeA {
		s.queries++
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	if rh.RCode == dnsmessage.RCodeSuccess {
		for _, a := range s.records {
			res := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}
			switch {
			case q.Type == dnsmessage.TypeA && a.Is4():
				_ = b.AResource(res, dnsmessage.AResource{A: a.As4()})
			case q.Type == dnsmessage.TypeAAAA && a.Is6():
				_ = b.AAAAResource(res, dnsmessage.AAAAResource{AAAA: a.As16()})
			}
		}
	}
	out, _ := b.Finish()
	return out
}

// resolver is a net.Resolver (the production type) that asks only s.
func (s *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", s.pc.LocalAddr().String())
	}}
}

// chanSink passes each accepted set to the test.
type chanSink chan []Endpoint

func (c chanSink) SetEndpoints(ctx context.Context, _ string, eps []Endpoint) error {
	select {
	case c <- slices.Clone(eps):
	case <-ctx.Done():
	}
	return nil
}

// Acceptance 2: against a real DNS server, records added and removed are
// followed by the first lookup after the change (within one interval); a
// failing server keeps the last set, a vanished name empties it.
func TestDNSFollowsRecords(t *testing.T) {
	const name = "vllm.gpurouter.test."
	srv := startDNS(t, name)
	srv.set(false, "127.0.0.2", "::1")
	sink := make(chanSink, 16)
	const interval = 100 * time.Millisecond
	d, err := NewDNS(DNSConfig{Model: "m", Name: name, Port: 8000, Interval: interval, Timeout: 2 * time.Second}, srv.resolver(), sink, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// next waits for the next set and checks that the lookups since the
	// change are at most two: the one in flight when it was made (it may
	// have read the old records) and the next one.
	next := func(what string, since int, want ...string) {
		t.Helper()
		select {
		case got := <-sink:
			var urls []string
			for _, e := range got {
				urls = append(urls, e.URL)
			}
			if !slices.Equal(urls, want) {
				t.Fatalf("%s: set %v, want %v", what, urls, want)
			}
			if n := srv.lookups() - since; n > 2 {
				t.Fatalf("%s: followed after %d lookups, want within one interval (at most 2)", what, n)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no set within 10s", what)
		}
	}
	next("initial", 0, "http://127.0.0.2:8000", "http://[::1]:8000")

	n := srv.lookups()
	srv.set(false, "127.0.0.2", "127.0.0.3", "::1")
	next("added", n, "http://127.0.0.2:8000", "http://127.0.0.3:8000", "http://[::1]:8000")

	n = srv.lookups()
	srv.set(false, "127.0.0.3")
	next("removed", n, "http://127.0.0.3:8000")

	// SERVFAIL for a few intervals: the set stays, nothing is published.
	srv.set(true)
	n = srv.lookups()
	for srv.lookups() < n+3 {
		select {
		case got := <-sink:
			t.Fatalf("a failing server changed the set to %v", got)
		case <-time.After(interval):
		}
	}
	n = srv.lookups()
	srv.set(false) // NXDOMAIN: the name has no addresses
	next("gone", n)
}
