package fleet

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/kvevents"
	"github.com/gpurouter/gpurouter/prefixcache"
)

// Validate reports every problem of s, each prefixed by the path of the
// field at fault in the configuration file's terms ("pools[1].replicas[0].url:
// ..."), so that a file and an admin edit are refused for the same reasons
// with the same words. Zero values that have a default are valid.
func (s Spec) Validate() error {
	var v validator
	s = s.clone().withDefaults()
	if s.Admission != nil {
		if err := s.Admission.Validate(); err != nil {
			v.add("admission", "%v", err)
		}
	}
	v.pools(s.Pools)
	return errors.Join(v.errs...)
}

// CheckURL reports why s cannot be the base URL of an HTTP server (a
// replica, a GPU agent, a DCGM exporter).
func CheckURL(s string) error {
	if s == "" {
		return errors.New("required")
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return errors.New("must be an absolute http:// or https:// URL with a host")
	}
	if u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return errors.New("must not have a query or fragment")
	}
	return nil
}

// validator collects problems; each check adds to it and never stops.
type validator struct {
	errs []error
}

func (v *validator) add(path, format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
}

// policy checks a policy name; "" is the default policy.
func (v *validator) policy(path, name string) {
	if known := balancer.Policies(); name != "" && !slices.Contains(known, name) {
		v.add(path, "unknown policy %q (known: %s)", name, strings.Join(known, ", "))
	}
}

// pools checks each pool and what must be unique across pools: model
// names and aliases share one namespace, and path prefixes one another.
func (v *validator) pools(pools []Pool) {
	if len(pools) == 0 {
		v.add("pools", "at least one pool is required")
		return
	}
	names := make(map[string]int)    // model or alias → index of the pool it names
	prefixes := make(map[string]int) // path prefix, without trailing /, → pool index
	claim := func(path, name string, pool int) {
		if prev, dup := names[name]; dup {
			v.add(path, "%q already names pools[%d]", name, prev)
			return
		}
		names[name] = pool
	}
	for i, p := range pools {
		at := fmt.Sprintf("pools[%d]", i)
		switch {
		case strings.TrimSpace(p.Model) == "":
			v.add(at+".model", "required")
		case strings.TrimSpace(p.Model) != p.Model:
			v.add(at+".model", "%q has leading or trailing spaces", p.Model)
		default:
			claim(at+".model", p.Model, i)
		}
		for j, a := range p.Aliases {
			if strings.TrimSpace(a) == "" {
				v.add(fmt.Sprintf("%s.aliases[%d]", at, j), "must not be empty")
				continue
			}
			claim(fmt.Sprintf("%s.aliases[%d]", at, j), a, i)
		}
		for j, a := range p.LoRA.Adapters {
			if strings.TrimSpace(a) == "" || strings.TrimSpace(a) != a {
				v.add(fmt.Sprintf("%s.lora.adapters[%d]", at, j), "must be a name without leading or trailing spaces, got %q", a)
				continue
			}
			claim(fmt.Sprintf("%s.lora.adapters[%d]", at, j), a, i)
			if p.LoRA.LoadOnDemand && p.LoRA.Paths[a] == "" {
				v.add(fmt.Sprintf("%s.lora.adapters[%d]", at, j),
					"lora.load_on_demand needs where adapter %q's weights live, as vLLM's lora_path: write it name=path", a)
			}
		}
		for _, a := range slices.Sorted(maps.Keys(p.LoRA.Paths)) {
			if !slices.Contains(p.LoRA.Adapters, a) {
				v.add(at+".lora.adapters", "a path is given for %q, which is not among the pool's adapters", a)
			}
		}
		if p.LoRA.LoadTimeout < 0 || p.LoRA.LoadBackoff < 0 {
			v.add(at+".lora", "load_timeout and load_backoff must not be negative")
		}
		if p.PathPrefix != "" {
			key := strings.TrimSuffix(p.PathPrefix, "/")
			switch {
			case !strings.HasPrefix(p.PathPrefix, "/v1/") || key == "/v1":
				v.add(at+".path_prefix", "must start with /v1/ and name a route below it, got %q", p.PathPrefix)
			case strings.ContainsAny(p.PathPrefix, "?# \t\r\n"):
				v.add(at+".path_prefix", "must be a plain path without query, fragment or spaces, got %q", p.PathPrefix)
			default:
				if prev, dup := prefixes[key]; dup {
					v.add(at+".path_prefix", "%q already used by pools[%d]", p.PathPrefix, prev)
				} else {
					prefixes[key] = i
				}
			}
		}
		v.policy(at+".policy", p.Policy)
		if p.MaxTokens < 0 {
			v.add(at+".max_tokens_limit", "must be >= 0 (0 = no cap), got %d", p.MaxTokens)
		}
		if p.Migration.Max < 0 {
			v.add(at+".migration.max", "must be >= 0 (0 = off), got %d", p.Migration.Max)
		}
		if p.Migration.MaxSeqLen < 0 {
			v.add(at+".migration.max_seq_len", "must be > 0, got %d", p.Migration.MaxSeqLen)
		}
		v.arms(at, p.Arms)
		v.replicas(at, p.Replicas, p.Discovered)
		v.prefix(at, p.Prefix, len(p.Replicas))
		v.split(at, p)
	}
}

// arms checks a pool's A/B experiment.
func (v *validator) arms(at string, arms []balancer.Arm) {
	seen := map[string]bool{}
	for i, a := range arms {
		ap := fmt.Sprintf("%s.arms[%d]", at, i)
		switch {
		case a.Name == "":
			v.add(ap+".name", "required")
		case seen[a.Name]:
			v.add(ap+".name", "%q already names another arm", a.Name)
		}
		seen[a.Name] = true
		if known := balancer.Policies(); !slices.Contains(known, a.Policy) {
			v.add(ap+".policy", "unknown policy %q (known: %s)", a.Policy, strings.Join(known, ", "))
		}
		if !(a.Share > 0) || math.IsInf(a.Share, 0) {
			v.add(ap+".share", "must be > 0, got %g", a.Share)
		}
	}
	if len(arms) == 1 {
		v.add(at+".arms", "an experiment needs at least two arms (use policy for one)")
	}
}

// replicas checks one pool's replicas; URLs and names must be unique in the
// pool since both identify a replica in metrics, logs and the admin API.
// A discovered pool may have none.
func (v *validator) replicas(pool string, rs []Replica, discovered bool) {
	if len(rs) == 0 && !discovered {
		v.add(pool+".replicas", "at least one replica is required")
		return
	}
	urls := make(map[string]int)
	names := make(map[string]int)
	for j, r := range rs {
		at := fmt.Sprintf("%s.replicas[%d]", pool, j)
		if err := CheckURL(r.URL); err != nil {
			v.add(at+".url", "%v", err)
		} else {
			key := canonicalURL(r.URL)
			if prev, dup := urls[key]; dup {
				v.add(at+".url", "%q duplicates replicas[%d]", r.URL, prev)
			} else {
				urls[key] = j
			}
		}
		if r.Name == "" {
			v.add(at+".name", "required (defaults to the URL's host:port)")
		} else if prev, dup := names[r.Name]; dup {
			v.add(at+".name", "%q already used by replicas[%d]", r.Name, prev)
		} else {
			names[r.Name] = j
		}
		if math.IsNaN(r.Weight) || math.IsInf(r.Weight, 0) || r.Weight <= 0 {
			v.add(at+".weight", "must be a finite number > 0, got %v", r.Weight)
		}
	}
}

// canonicalURL is the form in which two replica URLs are compared: scheme
// and host case-insensitive, trailing slash ignored. CheckURL has already
// accepted raw.
func canonicalURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return strings.ToLower(u.Scheme+"://"+u.Host) + strings.TrimSuffix(u.Path, "/")
}

// prefix checks a pool's prefix index (defaults filled); at is the pool's
// path, whose prefix_cache and kv_events the file has.
func (v *validator) prefix(pool string, c PrefixCache, replicas int) {
	at := pool + ".prefix_cache"
	switch c.Mode {
	case PrefixOff, PrefixApproximate, PrefixEvents:
	default:
		v.add(at+".mode", "must be approximate, events or off, got %q", c.Mode)
		return
	}
	if c.Mode != PrefixOff && replicas > prefixcache.MaxReplicas {
		v.add(at, "indexes at most %d replicas, the pool has %d", prefixcache.MaxReplicas, replicas)
	}
	if c.Mode != PrefixEvents {
		return
	}
	if c.BlockSize < 0 || c.BlockSize > 1<<16 {
		v.add(at+".block_size", "must be between 1 and 65536 tokens, or 0 for the engines', got %d", c.BlockSize)
	}
	switch {
	case isTokenizerFile(c.Tokenizer):
		// Read in full when the index is built; here only whether it
		// is there, so that a mistyped path reads as one.
		if fi, err := os.Stat(c.Tokenizer); err != nil {
			v.add(at+".tokenizer", "%v", err)
		} else if !fi.Mode().IsRegular() {
			v.add(at+".tokenizer", "%s is not a file", c.Tokenizer)
		}
	case !slices.Contains([]string{"cl100k_base", "o200k_base"}, c.Tokenizer):
		v.add(at+".tokenizer", "must be cl100k_base or o200k_base (embedded) or a tokenizer.json's path ending in .json, got %q", c.Tokenizer)
	}
	// A replica's URL fills the templates; any well-formed one checks them.
	const probe = "http://127.0.0.1:8000"
	if c.KVEvents.Endpoint == "" {
		v.add(pool+".kv_events.endpoint", "required in events mode")
	} else if _, err := kvevents.ExpandEndpoint(c.KVEvents.Endpoint, probe); err != nil {
		v.add(pool+".kv_events.endpoint", "%v", err)
	}
	if c.KVEvents.ReplayEndpoint != "" {
		if _, err := kvevents.ExpandEndpoint(c.KVEvents.ReplayEndpoint, probe); err != nil {
			v.add(pool+".kv_events.replay_endpoint", "%v", err)
		}
	}
}
