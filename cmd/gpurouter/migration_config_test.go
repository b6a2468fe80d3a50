package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/fleet"
	"github.com/gpurouter/gpurouter/proxy"
)

// pools[].migration: on by default (one move), 0 turns it off, and the
// command line's --migration-limit sets it for every pool.
func TestMigrationConfig(t *testing.T) {
	const pool = "pools: [{model: m, replicas: [{url: 'http://h:1'}]%s}]\n"
	tests := []struct {
		name  string
		extra string
		want  proxy.Migration
		err   string
	}{
		{name: "defaults", want: proxy.Migration{Max: 1, MaxSeqLen: 32768, DrainGrace: 20 * time.Second}},
		{name: "off", extra: ", migration: {max: 0}", want: proxy.Migration{Max: 0, MaxSeqLen: 32768, DrainGrace: 20 * time.Second}},
		{name: "set", extra: ", migration: {max: 3, max_seq_len: 1000, drain_grace: 2s}", want: proxy.Migration{Max: 3, MaxSeqLen: 1000, DrainGrace: 2 * time.Second}},
		{name: "never moved off a drained replica", extra: ", migration: {drain_grace: -1s}", want: proxy.Migration{Max: 1, MaxSeqLen: 32768}},
		{name: "no token ids asked of SGLang", extra: ", engine: sglang", want: proxy.Migration{Max: 1, MaxSeqLen: 32768, DrainGrace: 20 * time.Second, NoTokenIDs: true}},
		{name: "negative", extra: ", migration: {max: -1}", err: "pools[0].migration.max: must be >= 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseConfig([]byte(strings.Replace(pool, "%s", tt.extra, 1)))
			if tt.err != "" {
				assertErrContains(t, err, []string{tt.err})
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := specPools(cfg.Pools)[0].Migration; got != tt.want {
				t.Errorf("migration %+v, want %+v", got, tt.want)
			}
			back := filePools(fleet.Spec{Pools: specPools(cfg.Pools)}, cfg.Pools)[0].Migration
			if *back.Max != tt.want.Max || back.MaxSeqLen != tt.want.MaxSeqLen {
				t.Errorf("shown as %+v", back)
			}
		})
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--pool", "m=http://h:1", "--print-config"}, "max: 1\n"},
		{[]string{"--pool", "m=http://h:1", "--migration-limit", "0", "--print-config"}, "max: 0\n"},
		{[]string{"--pool", "m=http://h:1", "--migration-limit", "4", "--print-config"}, "max: 4\n"},
	} {
		var out, errb bytes.Buffer
		if code := runServe(tt.args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", tt.args, code, errb.String())
		}
		if _, rest, ok := strings.Cut(out.String(), "migration:\n"); !ok || !strings.Contains(rest, tt.want) {
			t.Errorf("%v: printed config lacks migration %q:\n%s", tt.args, tt.want, out.String())
		}
	}
	var out, errb bytes.Buffer
	if code := runServe([]string{"--pool", "m=http://h:1", "--migration-limit", "-2"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "migration-limit") {
		t.Errorf("--migration-limit -2: exit %d: %s", code, errb.String())
	}
}
