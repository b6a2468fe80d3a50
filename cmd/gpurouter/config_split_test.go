package main

import (
	"testing"

	"github.com/gpurouter/gpurouter/fleet"
)

// roles: lists read into the pool's replicas, each with its role, and the
// split's defaults filled; fleet's spec carries both.
func TestConfigRoles(t *testing.T) {
	cfg, err := parseConfig([]byte(`pools:
  - model: m
    replicas:
      - url: http://c:1
    roles:
      prefill: [{url: 'http://p:1'}]
      decode: [{url: 'http://d:1'}]
      both: [{url: 'http://b:1'}]
    split: {min_prompt_tokens: 8000}
`))
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Pools[0]
	want := []struct{ url, role string }{{"http://c:1", ""}, {"http://p:1", "prefill"}, {"http://d:1", "decode"}, {"http://b:1", "both"}}
	if p.Roles != nil || len(p.Replicas) != len(want) {
		t.Fatalf("roles %+v, replicas %+v: want the lists read into replicas", p.Roles, p.Replicas)
	}
	for i, w := range want {
		if r := p.Replicas[i]; r.URL != w.url || r.Role != w.role {
			t.Errorf("replicas[%d] = %s role %q, want %s role %q", i, r.URL, r.Role, w.url, w.role)
		}
	}
	if s := p.Split; s.MinPromptTokens != 8000 || s.PrefillPolicy != "predictive" || s.PrefillsPerReplica != 2 {
		t.Errorf("split %+v: want min_prompt_tokens 8000 and the defaults", s)
	}
	sp := specPools(cfg.Pools)[0]
	if sp.Replicas[1].Role != fleet.RolePrefill || sp.Split.MinPromptTokens != 8000 {
		t.Errorf("spec pool %+v: want the roles and the split", sp)
	}
}

func TestConfigRolesRejects(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"unknown role", "pools: [{model: m, replicas: [{url: 'http://a:1', role: prefil}]}]\n",
			[]string{`pools[0].replicas[0].role: unknown role "prefil"`}},
		{"prefill without decode", "pools: [{model: m, roles: {prefill: [{url: 'http://a:1'}]}, replicas: [{url: 'http://b:1'}]}]\n",
			[]string{"pools[0].roles: prefill replicas need a decode (or both) replica"}},
		{"split numbers", "pools: [{model: m, split: {min_prompt_tokens: -1, prefills_per_replica: -2, prefill_policy: fastest}, replicas: [{url: 'http://a:1'}]}]\n",
			[]string{"pools[0].split.min_prompt_tokens: must be >= 0", "pools[0].split.prefills_per_replica: must be >= 0",
				`pools[0].split.prefill_policy: unknown policy "fastest"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConfig([]byte(tt.yaml))
			assertErrContains(t, err, tt.want)
		})
	}
}
