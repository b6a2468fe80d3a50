package balancer_test

import (
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// decoding holds n leases on r that have each streamed gaps output
// chunks step apart, expecting output tokens under a TPOT objective of
// obj: requests decoding there, whose headroom r then knows.
func decoding(t *testing.T, r *balancer.Replica, c *fakeClock, n int, output int64, obj, step time.Duration, gaps int) *streams {
	t.Helper()
	s := &streams{c: c}
	for range n {
		l, err := r.AcquireRequest(balancer.LeaseCost{OutputTokens: output, TPOTObjective: obj})
		if err != nil {
			t.Fatal(err)
		}
		s.leases = append(s.leases, l)
	}
	s.step(step, gaps)
	return s
}

// halfFull is two replicas that decode at 60 ms a step, "half"
// prefilling at 400 µs a token and "full" at 200, full decoding ten
// 400-token outputs (16 s of headroom each), and a predictive picker.
type halfFull struct {
	c           *fakeClock
	half, full  *balancer.Replica
	p           balancer.Picker
	fullStreams *streams
}

func newHalfFull(t *testing.T) *halfFull {
	t.Helper()
	c := newFakeClock()
	h := &halfFull{c: c, half: newReplica(t, "half", c, replicaOpts{}), full: newReplica(t, "full", c, replicaOpts{})}
	teachDecode(t, h.half, c, 400*time.Microsecond, 60*time.Millisecond, 0)
	teachDecode(t, h.full, c, 200*time.Microsecond, 60*time.Millisecond, 0)
	p, err := balancer.NewPicker("predictive")
	if err != nil {
		t.Fatal(err)
	}
	h.p = p
	fs := decoding(t, h.full, c, 10, 400, 100*time.Millisecond, 60*time.Millisecond, 4)
	t.Cleanup(fs.done)
	h.fullStreams = fs
	return h
}

// pick places a request of prompt tokens and a 40-token output, under
// 2 s / 100 ms objectives, now.
func (h *halfFull) pick(prompt int) *balancer.Replica {
	req := &balancer.Request{Now: h.c.now(), PromptTokens: prompt, OutputTokens: 40,
		SLOTTFT: 2 * time.Second, SLOTPOT: 100 * time.Millisecond}
	return h.p.Pick(req, []*balancer.Replica{h.half, h.full})
}

// A long prompt goes where its prefill stalls no decode past its TPOT
// objective, though it would meet its own objectives on a less loaded
// replica: the half-speed replica decodes one 16-token output (0.6 s of
// headroom at 60 ms a token under a 100 ms objective) and would prefill
// 4,000 tokens in 1.6 s; the full-speed one decodes ten 400-token
// outputs (16 s of headroom each) and would take 0.8 s. A short prompt
// still goes to the less loaded replica. Without the headroom the
// policy sent the long prompt to the half-speed replica, and on the
// conversation trace every output that then missed its TPOT objective
// there was such a neighbour's.
func TestPredictiveKeepsALongPromptOffShortDecodes(t *testing.T) {
	h := newHalfFull(t)
	defer decoding(t, h.half, h.c, 1, 16, 100*time.Millisecond, 60*time.Millisecond, 4).done()
	if got := h.pick(4000); got != h.full {
		t.Errorf("4,000-token prompt, a 16-token output decoding on half: picked %s, want full", got.Name())
	}
	if got := h.pick(100); got != h.half {
		t.Errorf("100-token prompt (40 ms there): picked %s, want half, the less loaded", got.Name())
	}
}

// The headroom is the tightest decoding request's, forgotten a second
// after it last reported: once the short output ends, the long prompt may
// go back to the less loaded replica.
func TestDecodeHeadroomForgetsAnEndedRequest(t *testing.T) {
	h := newHalfFull(t)
	short := decoding(t, h.half, h.c, 1, 16, 100*time.Millisecond, 60*time.Millisecond, 4)
	longs := decoding(t, h.half, h.c, 1, 400, 100*time.Millisecond, 60*time.Millisecond, 4)
	defer longs.done()
	if got := h.pick(4000); got != h.full {
		t.Fatalf("with the 16-token output decoding on half: picked %s, want full", got.Name())
	}
	short.done()
	for range 20 { // 1.2 s: the others go on streaming
		h.c.advance(60 * time.Millisecond)
		longs.gap(60 * time.Millisecond)
		h.fullStreams.gap(60 * time.Millisecond)
	}
	if got := h.pick(4000); got != h.half {
		t.Errorf("1.2 s after the short output ended: picked %s, want half (the 400-token output is not protected: it ends 24 s later)", got.Name())
	}
}

// A request is protected only where that can save it at a price a prompt
// can pay: not one past its objective already (a 16-token output under a
// 50 ms objective on a replica at 60 ms: no headroom; it would keep every
// prompt off its replica until it ended), nor one whose decode ends later
// than a TTFT objective from now (a 200-token output at 95 ms a token has
// under a second of headroom, less than the 4,000-token prompt's 1.6 s
// there, but 18 s to go): the prompt goes to the less loaded replica
// either way.
func TestDecodeHeadroomIgnoresWhatCannotBeSaved(t *testing.T) {
	for _, tc := range []struct {
		name      string
		output    int64
		obj, step time.Duration
	}{
		{"a 16-token output under a 50 ms objective at 60 ms a token", 16, 50 * time.Millisecond, 60 * time.Millisecond},
		{"a 200-token output at 95 ms a token", 200, 100 * time.Millisecond, 95 * time.Millisecond},
	} {
		h := newHalfFull(t)
		// 12 chunks: past the second in which what it reported when
		// placed (at the step fit's 60 ms) still counts.
		d := decoding(t, h.half, h.c, 1, tc.output, tc.obj, tc.step, 12)
		if got := h.pick(4000); got != h.half {
			t.Errorf("%s decoding on half: picked %s, want half, the less loaded", tc.name, got.Name())
		}
		d.done()
	}
}
