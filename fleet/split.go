package fleet

import (
	"fmt"
	"slices"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/proxy"
)

// Replica roles for prefill/decode disaggregation (Replica.Role): what a
// replica's KV connector lets the router ask of it.
const (
	RoleColocated = ""        // no KV connector, or unknown: serves whole requests only
	RolePrefill   = "prefill" // kv_producer: prefills for others, and serves whole requests
	RoleDecode    = "decode"  // kv_consumer: takes a prompt another replica computed, and whole requests
	RoleBoth      = "both"    // kv_both: either
)

// Roles are the role names a replica may have, "" (colocated) first.
func Roles() []string { return []string{RoleColocated, RolePrefill, RoleDecode, RoleBoth} }

// Split is how a pool with prefill replicas splits its requests
// (proxy.Split). The zero value takes every default.
type Split struct {
	// PrefillPolicy picks the prefill replica; "" means
	// balancer.DefaultPolicy. The pool's Policy picks the decode replica,
	// and the replica of a request served colocated.
	PrefillPolicy string
	// MinPromptTokens: shorter prompts are served colocated; 0 means
	// proxy.DefaultSplitMinPromptTokens.
	MinPromptTokens int
	// PrefillsPerReplica bounds the router's prefills in flight on a
	// prefill replica under admission; 0 means
	// proxy.DefaultSplitPrefillsPerReplica.
	PrefillsPerReplica int
}

// splits reports whether pc splits its requests: it has a prefill replica.
func (pc Pool) splits() bool {
	return slices.ContainsFunc(pc.Replicas, func(r Replica) bool { return r.Role == RolePrefill })
}

// split builds the proxy.Split of pc, served by p with reps (pc's
// replicas, in order); nil when pc does not split. Its admission, when
// spec has admission, is its own controller (named MODEL/prefill).
func (f *Fleet) split(spec Spec, pc Pool, p *balancer.Pool, reps []*balancer.Replica) (*proxy.Split, error) {
	if !pc.splits() {
		return nil, nil
	}
	var prefill, decode []*balancer.Replica
	for j, rc := range pc.Replicas {
		switch rc.Role {
		case RolePrefill:
			prefill = append(prefill, reps[j])
		case RoleDecode, RoleBoth:
			decode = append(decode, reps[j])
		}
	}
	pk, err := balancer.NewPickerWith(pc.Split.PrefillPolicy, balancer.PickerOptions{Score: spec.Score})
	if err != nil {
		return nil, err
	}
	sp := proxy.NewSplit(prefill, decode, pk)
	sp.MinPromptTokens, sp.PrefillsPerReplica = pc.Split.MinPromptTokens, pc.Split.PrefillsPerReplica
	if spec.Admission != nil {
		ctl, err := admission.New(p.Model()+"/prefill", sp.AdmissionConfig(*spec.Admission), admission.Deps{Capacity: sp, Metrics: f.opts.AdmissionMetrics})
		if err != nil {
			return nil, fmt.Errorf("prefill admission: %w", err)
		}
		sp.Admission = ctl
	}
	return sp, nil
}

// split checks a pool's roles: known names, and a pool with prefill
// replicas needs one that decodes what they prefill.
func (v *validator) split(at string, p Pool) {
	for j, r := range p.Replicas {
		if !slices.Contains(Roles(), r.Role) {
			v.add(fmt.Sprintf("%s.replicas[%d].role", at, j), "unknown role %q (known: prefill, decode, both, or none: colocated)", r.Role)
		}
	}
	v.policy(at+".split.prefill_policy", p.Split.PrefillPolicy)
	if p.Split.MinPromptTokens < 0 {
		v.add(at+".split.min_prompt_tokens", "must be >= 0, got %d", p.Split.MinPromptTokens)
	}
	if p.Split.PrefillsPerReplica < 0 {
		v.add(at+".split.prefills_per_replica", "must be >= 0, got %d", p.Split.PrefillsPerReplica)
	}
	if !p.splits() {
		return
	}
	if !slices.ContainsFunc(p.Replicas, func(r Replica) bool { return r.Role == RoleDecode || r.Role == RoleBoth }) {
		v.add(at+".roles", "prefill replicas need a decode (or both) replica to take what they prefill")
	}
}
