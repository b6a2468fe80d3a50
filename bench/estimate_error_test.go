package bench

import "testing"

func TestPromptEstimateError(t *testing.T) {
	m := RouterMatch{Pairs: []MatchedRequest{
		{Router: RouterRecord{EstPromptTokens: 110, PromptTokens: 100}},
		{Router: RouterRecord{EstPromptTokens: 90, PromptTokens: 100}},
		{Router: RouterRecord{EstPromptTokens: 0, PromptTokens: 100}}, // no estimate: skipped
		{Router: RouterRecord{EstPromptTokens: 50, PromptTokens: 0}},  // no usage: skipped
	}}
	d, n := m.PromptEstimateError([]float64{50})
	if n != 2 || d.Mean != 0 || d.Min != -10 || d.Max != 10 {
		t.Fatalf("n=%d dist=%+v", n, d)
	}
	if _, n := (RouterMatch{}).PromptEstimateError(nil); n != 0 {
		t.Fatal("empty match has estimates")
	}
}
