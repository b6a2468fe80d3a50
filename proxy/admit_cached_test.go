package proxy

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/prefixcache"
)

// Issue 51: admission's KV room counts the cached blocks once. A
// follow-up turn whose history one replica holds in its prefix cache
// adds only its new tokens to that replica's KV; judged by its whole
// prompt it waited at the router while the replica had room for what it
// costs there. A cold prompt of the same size still waits (and, past its
// timeout, is shed).
func TestCachedTurnAdmittedWhereAColdOneWaits(t *testing.T) {
	up0, up1 := newFakeVLLM(t), newFakeVLLM(t)
	up0.promptTokens, up1.promptTokens = -1, -1 // the router's prompt estimates stay its own
	tr := startRouterWith(t, []string{up0.url, up1.url}, func(o *Options) {
		ctl, err := admission.New("m", admission.Config{ExpireQueued: true}, admission.Deps{Pool: o.Routes[0].Pool})
		if err != nil {
			t.Fatal(err)
		}
		o.Routes[0].Admission = ctl
	}, withPolicy("predictive"))
	idx := prefixcache.NewIndex()
	tr.pool.SetPrefixCache(&balancer.PrefixCache{Index: idx, BlockSize: prefixcache.DefaultBlockBytes, Approximate: true})
	for i, r := range tr.reps {
		if _, err := idx.Add(r.Name(), 1<<16); err != nil {
			t.Fatal(err)
		}
		r.SetPrefixSlot(i)
	}
	at := time.Now().Add(time.Hour) // never stale
	for _, r := range tr.reps {
		r.SetEngineLoad(balancer.EngineLoad{Running: 1, KVUsage: 0.3, KVCapacityTokens: 30000, At: at})
	}
	send := func(prompt string, hdr ...string) int {
		t.Helper()
		resp := post(t, tr.url+"/v1/completions", `{"model":"m","prompt":"`+prompt+`","max_tokens":4}`, hdr...)
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		return resp.StatusCode
	}
	history := strings.Repeat("the quick brown fox jumps over the lazy dog ", 1200) // ~12,000 tokens
	if st := send(history); st != 200 {
		t.Fatalf("first turn: %d", st)
	}
	holder := 0
	if up1.requests.Load() == 1 {
		holder = 1
	}
	// Both replicas' token budgets (their KV capacity) are all but
	// 6,000 tokens taken by what the router already sent.
	for _, r := range tr.reps {
		held, err := r.AcquireCostKV(0, 24000, false)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Done(nil)
	}
	if st := send(history+"and then what happened", headerTimeout, "2s"); st != 200 {
		t.Fatalf("the follow-up turn, its history cached on r%d: %d, want 200 at once", holder, st)
	}
	if got := []int64{up0.requests.Load(), up1.requests.Load()}; got[holder] != 2 {
		t.Errorf("requests by replica %v: the follow-up went away from r%d, which holds its history", got, holder)
	}
	cold := strings.Repeat("a slow green turtle walks under the bright moon ", 1100)
	if st := send(cold, headerTimeout, "300ms"); st == 200 {
		t.Errorf("a cold prompt of the same size with no room for it anywhere: 200, want it held and shed")
	}
}
