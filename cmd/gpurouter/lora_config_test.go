package main

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/fleet"
)

// pools[].lora: adapters declared, awareness on by default and off with
// aware: false, /v1/models read every 10s unless told; an adapter may not
// take a name another pool routes.
func TestLoRAConfig(t *testing.T) {
	const pools = "pools: [{model: m, replicas: [{url: 'http://h:1'}]%s}, {model: other, replicas: [{url: 'http://h:2'}]}]\n"
	tests := []struct {
		name, extra string
		want        fleet.LoRA
		err         string
	}{
		{name: "defaults", want: fleet.LoRA{ModelsInterval: 10 * time.Second}},
		{name: "declared, blind", extra: ", lora: {adapters: [sql-lora, chat-lora], aware: false, models_interval: -1s}",
			want: fleet.LoRA{LoRAConfig: balancer.LoRAConfig{Adapters: []string{"sql-lora", "chat-lora"}, Blind: true}, ModelsInterval: -time.Second}},
		{name: "aware said", extra: ", lora: {aware: true, models_interval: 1m}", want: fleet.LoRA{ModelsInterval: time.Minute}},
		{name: "an adapter named as another pool", extra: ", lora: {adapters: [other]}", err: `pools[1].model: "other" already names pools[0]`},
		{name: "an empty adapter name", extra: ", lora: {adapters: ['']}", err: "pools[0].lora.adapters[0]: must be a name"},
		{name: "load on demand", extra: ", lora: {adapters: [sql-lora=/adapters/sql, 'chat-lora=s3://b/chat'], load_on_demand: true, load_timeout: 5s}",
			want: fleet.LoRA{LoRAConfig: balancer.LoRAConfig{Adapters: []string{"sql-lora", "chat-lora"}, LoadOnDemand: true,
				Paths: map[string]string{"sql-lora": "/adapters/sql", "chat-lora": "s3://b/chat"}, LoadTimeout: 5 * time.Second,
				LoadBackoff: 30 * time.Second}, ModelsInterval: 10 * time.Second}},
		{name: "paths without load on demand", extra: ", lora: {adapters: [sql-lora=/adapters/sql, chat-lora]}",
			want: fleet.LoRA{LoRAConfig: balancer.LoRAConfig{Adapters: []string{"sql-lora", "chat-lora"},
				Paths: map[string]string{"sql-lora": "/adapters/sql"}, LoadTimeout: 30 * time.Second, LoadBackoff: 30 * time.Second},
				ModelsInterval: 10 * time.Second}},
		{name: "load on demand without a path", extra: ", lora: {adapters: [sql-lora=/adapters/sql, chat-lora], load_on_demand: true}",
			err: `pools[0].lora.adapters[1]: lora.load_on_demand needs where adapter "chat-lora"'s weights live`},
		{name: "load on demand with an empty path", extra: ", lora: {adapters: ['sql-lora='], load_on_demand: true}",
			err: `pools[0].lora.adapters[0]: lora.load_on_demand needs where adapter "sql-lora"'s weights live`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseConfig([]byte(strings.Replace(pools, "%s", tt.extra, 1)))
			if tt.err != "" {
				assertErrContains(t, err, []string{tt.err})
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := specPools(cfg.Pools)[0].LoRA
			if got.Blind != tt.want.Blind || got.ModelsInterval != tt.want.ModelsInterval || !slices.Equal(got.Adapters, tt.want.Adapters) ||
				got.LoadOnDemand != tt.want.LoadOnDemand || !maps.Equal(got.Paths, tt.want.Paths) ||
				(tt.want.LoadTimeout != 0 && got.LoadTimeout != tt.want.LoadTimeout) || (tt.want.LoadBackoff != 0 && got.LoadBackoff != tt.want.LoadBackoff) {
				t.Errorf("lora %+v, want %+v", got, tt.want)
			}
			back := filePools(fleet.Spec{Pools: specPools(cfg.Pools)}, cfg.Pools)[0].LoRA
			if *back.Aware == tt.want.Blind || back.LoadOnDemand != tt.want.LoadOnDemand {
				t.Errorf("shown as %+v", back)
			}
			// Shown as written: each adapter name=path where it has one,
			// which reads back as the same pool.
			names, paths := adapterPaths(back.Adapters)
			if !slices.Equal(names, tt.want.Adapters) || !maps.Equal(paths, tt.want.Paths) {
				t.Errorf("shown as %+v", back)
			}
		})
	}
}
