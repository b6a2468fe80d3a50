package bench

import (
	"context"
	"strings"
	"testing"
	"time"
)

// stepClock is a Clock the test moves by hand.
type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time { return c.now }
func (c *stepClock) Sleep(ctx context.Context, d time.Duration) error {
	c.now = c.now.Add(d)
	return ctx.Err()
}

func TestProgressLine(t *testing.T) {
	start := time.Unix(1000, 0)
	clk := &stepClock{now: start}
	var out strings.Builder
	p := &progress{w: &out, clock: clk, total: 4, start: start}

	clk.now = start.Add(time.Second)
	p.finished(true)
	clk.now = start.Add(1100 * time.Millisecond) // within minRedraw: not drawn
	p.finished(false)
	clk.now = start.Add(2 * time.Second)
	p.finished(true)
	clk.now = start.Add(65 * time.Second) // the last one is always drawn
	p.finished(false)

	draws := strings.Split(out.String(), "\r")[1:]
	if len(draws) != 3 {
		t.Fatalf("%d redraws, want 3 (one skipped inside the redraw interval):\n%q", len(draws), out.String())
	}
	for i, want := range []string{
		" 25%|███████                       | 1/4 [00:01, 1.00 req/s, 0 failed]  ",
		" 75%|██████████████████████        | 3/4 [00:02, 1.50 req/s, 1 failed]  ",
		"100%|██████████████████████████████| 4/4 [01:05, 0.06 req/s, 2 failed]  \n",
	} {
		if draws[i] != want {
			t.Errorf("redraw %d:\n got %q\nwant %q", i, draws[i], want)
		}
	}
}

func TestProgressQuietWithoutWriter(t *testing.T) {
	var p *progress
	p.finished(true) // a nil bar (no Run yet) draws nothing and does not panic
	(&progress{clock: &stepClock{}, total: 1}).finished(false)
}

func TestClockText(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{{0, "00:00"}, {59600 * time.Millisecond, "01:00"}, {3*time.Hour + 2*time.Minute + 5*time.Second, "3:02:05"}} {
		if got := clockText(c.d); got != c.want {
			t.Errorf("clockText(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}
