package proxy

import (
	"io"
	"testing"
	"time"
)

// A stream whose first chunk carries the role alone, tens of milliseconds
// before the first token (as vLLM's chat streams do): the router's TTFT —
// its histogram, its records, what the replica's predictor learns — is
// the first token's, and the role chunk is no inter-token gap. For
// completions, a first chunk of empty text likewise.
func TestTTFTIsTheFirstChunkWithOutput(t *testing.T) {
	const lead = 80 * time.Millisecond
	up := newFakeVLLM(t)
	up.roleLead, up.tokens = lead, 3
	tr := startRouter(t, []string{up.url})
	for i, c := range []struct{ path, body string }{
		{"/v1/chat/completions", chatStream},
		{"/v1/completions", `{"model":"m","stream":true,"prompt":"hi"}`},
		{"/v1/chat/completions", chatStream},
	} {
		resp := post(t, tr.url+c.path, c.body)
		events := sseEvents(t, resp.Body)
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		if resp.StatusCode != 200 || len(events) == 0 || events[len(events)-1] != "[DONE]" {
			t.Fatalf("request %d: status %d, events %q", i, resp.StatusCode, events)
		}
		waitFor(t, "the record", func() bool { return len(tr.srv.records.Since(0, 0)) == i+1 })
		rec := tr.srv.records.Since(0, 0)[i]
		if rec.TTFTS < lead.Seconds() || rec.PlacedTTFTS < lead.Seconds() {
			t.Errorf("request %d (%s): TTFT %.3fs, placed %.3fs; want at least the role chunk's lead, %v", i, c.path, rec.TTFTS, rec.PlacedTTFTS, lead)
		}
		if rec.ITLCount != up.tokens-1 {
			t.Errorf("request %d: %d inter-token gaps, want %d (the role chunk is none)", i, rec.ITLCount, up.tokens-1)
		}
		if i > 0 && rec.PredictedTTFTS < lead.Seconds()/2 {
			t.Errorf("request %d: predicted TTFT %.3fs: the predictor learned a TTFT shorter than the first token's", i, rec.PredictedTTFTS)
		}
	}
	var sum float64
	for _, rec := range tr.srv.records.Since(0, 0) {
		sum += rec.TTFTS
	}
	mfs, err := tr.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "gpurouter_time_to_first_token_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		if got := h.GetSampleSum(); h.GetSampleCount() != 3 || got < 3*lead.Seconds() || got > sum+1e-6 {
			t.Errorf("TTFT histogram: %d samples, sum %.3fs; want 3, at least 3×%v (records say %.3fs)", h.GetSampleCount(), got, lead, sum)
		}
		return
	}
	t.Error("no TTFT histogram")
}
