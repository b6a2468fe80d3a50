package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// DefaultDNSInterval is how often a DNS source re-resolves its name when
// DNSConfig.Interval is zero.
const DefaultDNSInterval = 5 * time.Second

// Resolver looks names up: *net.Resolver (net.DefaultResolver in
// production; tests point one at a DNS server of their own).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// DNSConfig is a pool whose replicas are every address a name resolves to
// (A and AAAA records): a headless Service's name, typically.
type DNSConfig struct {
	Model string // the pool's model; required
	Name  string // the name to resolve; required
	Port  int    // the engines' port; required
	// Scheme of the replicas' URLs; "" means http.
	Scheme string
	// Interval between lookups; zero means DefaultDNSInterval.
	Interval time.Duration
	// Timeout of one lookup; zero means the interval.
	Timeout time.Duration
}

// ParseDNSURL reads the dns://NAME:PORT form of a --pool URL.
func ParseDNSURL(raw string) (name string, port int, err error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "dns" {
		return "", 0, fmt.Errorf("want dns://NAME:PORT, got %q", raw)
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", 0, fmt.Errorf("want dns://NAME:PORT with nothing after the port, got %q", raw)
	}
	name, portStr := u.Hostname(), u.Port()
	if name == "" || portStr == "" {
		return "", 0, fmt.Errorf("want dns://NAME:PORT, got %q", raw)
	}
	port, err = strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("port must be 1-65535, got %q", portStr)
	}
	return name, port, nil
}

// DNS re-resolves a name every interval and publishes the addresses as
// the pool's replicas. A failed lookup keeps the last set (a resolver's
// hiccup must not empty a pool); a name that does not exist (NXDOMAIN) is
// an empty set. Build with NewDNS; the zero value is unusable.
type DNS struct {
	cfg      DNSConfig
	resolver Resolver
	pub      *Publisher
	log      *zap.Logger
}

// NewDNS builds the source; nil r means net.DefaultResolver, nil log none.
// It starts nothing.
func NewDNS(cfg DNSConfig, r Resolver, sink Sink, m *Metrics, log *zap.Logger) (*DNS, error) {
	if cfg.Model == "" || cfg.Name == "" || cfg.Port < 1 || cfg.Port > 65535 {
		return nil, fmt.Errorf("discovery: dns needs a model, a name and a port 1-65535, got %+v", cfg)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultDNSInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = cfg.Interval
	}
	if cfg.Scheme == "" {
		cfg.Scheme = "http"
	}
	if r == nil {
		r = net.DefaultResolver
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &DNS{cfg: cfg, resolver: r, pub: NewPublisher(cfg.Model, "dns", sink, m, log), log: log}, nil
}

// Run resolves at once, then every interval, until ctx ends. One Run at
// a time: a second would publish beside the first.
func (d *DNS) Run(ctx context.Context) error {
	t := time.NewTicker(d.cfg.Interval)
	defer t.Stop()
	failing := false // log a lookup failure once per streak, not every interval
	for {
		eps, err := d.resolve(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			d.pub.Failed()
			if !failing {
				d.log.Warn("discovery: dns lookup failed; keeping the last replica set", zap.String("model", d.cfg.Model),
					zap.String("name", d.cfg.Name), zap.Error(err))
			}
			failing = true
		default:
			if failing {
				d.log.Info("discovery: dns lookup works again", zap.String("model", d.cfg.Model), zap.String("name", d.cfg.Name))
			}
			failing = false
			_ = d.pub.Publish(ctx, eps) // logged there; offered again next interval
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// resolve looks the name up once.
func (d *DNS) resolve(ctx context.Context) ([]Endpoint, error) {
	lctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	addrs, err := d.resolver.LookupNetIP(lctx, "ip", d.cfg.Name)
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		return []Endpoint{}, nil
	}
	if err != nil {
		return nil, err
	}
	eps := make([]Endpoint, 0, len(addrs))
	seen := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		a = a.Unmap()
		if seen[a] {
			continue
		}
		seen[a] = true
		host := netip.AddrPortFrom(a.WithZone(""), uint16(d.cfg.Port)).String()
		eps = append(eps, Endpoint{Name: host, URL: d.cfg.Scheme + "://" + host})
	}
	return eps, nil
}

// HostPort is ip:port, an IPv6 address bracketed.
func HostPort(ip string, port int) string {
	if strings.Contains(ip, ":") {
		return "[" + ip + "]:" + strconv.Itoa(port)
	}
	return ip + ":" + strconv.Itoa(port)
}
