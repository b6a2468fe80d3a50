package proxy

import (
	"net"
	"testing"
)

func TestAppendIPMatchesString(t *testing.T) {
	for _, s := range []string{"127.0.0.1", "::1", "2001:db8::68", "10.1.2.3"} {
		ip := net.ParseIP(s) // 16 bytes, IPv4 ones mapped
		if got := string(appendIP(nil, ip)); got != ip.String() {
			t.Errorf("%s: %q, want %q", s, got, ip.String())
		}
		if v4 := ip.To4(); v4 != nil {
			if got := string(appendIP(nil, v4)); got != s {
				t.Errorf("%s in 4 bytes: %q", s, got)
			}
		}
	}
	if got := string(appendIP(nil, nil)); got != "<nil>" {
		t.Errorf("nil: %q, want net.IP's <nil>", got)
	}
}
