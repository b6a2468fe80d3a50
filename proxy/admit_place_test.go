package proxy

import (
	"io"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
)

// Issue 14: with admission on, a request is admitted because SOME replica
// has room, and was then placed wherever the policy's own score pointed —
// least_loaded counts requests, not the token budget admission judges by, so
// a replica whose budget was used up (the half-speed one in the issue's
// runs: its long prompts stay outstanding twice as long while it reports
// few requests running) kept taking traffic it had no room for, and the
// router queued *and* the engine queued. An admitted request must go to a
// replica where it fits.
//
// Deterministic: telemetry is stamped an hour ahead (never stale), the
// budget is used up by a lease held for the test, and the one request's
// placement is read from the replicas' counters. Before the fix it went to
// r1 (least_loaded's choice: 1 running against 6).
func TestAdmittedRequestGoesToAReplicaWithRoom(t *testing.T) {
	for _, policy := range []string{"least_loaded", "least_request", "kv_aware", "predictive"} {
		t.Run(policy, func(t *testing.T) {
			up0, up1 := newFakeVLLM(t), newFakeVLLM(t)
			tr := startRouterWith(t, []string{up0.url, up1.url}, func(o *Options) {
				ctl, err := admission.New("m", admission.Config{}, admission.Deps{Pool: o.Routes[0].Pool})
				if err != nil {
					t.Fatal(err)
				}
				o.Routes[0].Admission = ctl
			}, withPolicy(policy))
			r0, r1 := tr.reps[0], tr.reps[1]
			// r1's token budget (its KV capacity, 30,000 tokens) is taken by
			// what the router already sent there.
			held, err := r1.AcquireCostKV(0, 30000, false)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Done(nil)
			at := time.Now().Add(time.Hour)
			r0.SetEngineLoad(balancer.EngineLoad{Running: 6, KVUsage: 0.3, KVCapacityTokens: 30000, At: at})
			r1.SetEngineLoad(balancer.EngineLoad{Running: 1, KVUsage: 0.3, KVCapacityTokens: 30000, At: at})

			resp := post(t, tr.url+"/v1/completions", `{"model":"m","prompt":"hello there","max_tokens":4}`)
			io.Copy(io.Discard, resp.Body) //nolint:errcheck
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if got0, got1 := up0.requests.Load(), up1.requests.Load(); got0 != 1 || got1 != 0 {
				t.Errorf("requests: r0 (room) %d, r1 (budget used up) %d; want 1, 0", got0, got1)
			}
		})
	}
}
