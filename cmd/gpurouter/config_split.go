package main

import (
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/proxy"
)

// applySplitDefaults reads a pool's roles: lists into its replicas (each
// with its role, after those listed under replicas:) and fills the split's
// defaults, so the printed configuration says each once.
func applySplitDefaults(p *poolConfig) {
	if r := p.Roles; r != nil {
		for _, g := range []struct {
			role string
			rs   []replicaConfig
		}{{"prefill", r.Prefill}, {"decode", r.Decode}, {"both", r.Both}} {
			for _, rc := range g.rs {
				rc.Role = g.role
				p.Replicas = append(p.Replicas, rc)
			}
		}
		p.Roles = nil
	}
	setString(&p.Split.PrefillPolicy, balancer.DefaultPolicy)
	setInt(&p.Split.MinPromptTokens, proxy.DefaultSplitMinPromptTokens)
	setInt(&p.Split.PrefillsPerReplica, proxy.DefaultSplitPrefillsPerReplica)
}
