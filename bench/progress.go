package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progress draws a one-line progress bar in the manner of vllm bench's tqdm
// bar — requests done of the total, elapsed time, completion rate and
// failures — redrawn at most every 200 ms and once more at the end. The
// zero value with a nil w draws nothing: callers give a writer only when it
// is a terminal, so redirected output holds no carriage-return noise.
type progress struct {
	w     io.Writer
	clock Clock
	total int
	start time.Time

	mu     sync.Mutex // guards done, failed, last
	done   int
	failed int
	last   time.Time
}

// minRedraw is how often the bar may be redrawn: a fast run finishing
// thousands of requests a second would otherwise spend its time drawing.
const minRedraw = 200 * time.Millisecond

// finished counts one finished request, ok or failed, and redraws the bar
// when it is due.
func (p *progress) finished(ok bool) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	if !ok {
		p.failed++
	}
	now := p.clock.Now()
	if p.done < p.total && now.Sub(p.last) < minRedraw {
		return
	}
	p.last = now
	io.WriteString(p.w, "\r"+p.line(now.Sub(p.start))) //nolint:errcheck // a lost redraw is not an error
	if p.done >= p.total {
		fmt.Fprintln(p.w)
	}
}

// line renders the bar after elapsed.
func (p *progress) line(elapsed time.Duration) string {
	const width = 30
	filled := 0
	if p.total > 0 {
		filled = min(width, p.done*width/p.total)
	}
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(p.done) / s
	}
	// Trailing spaces wipe what a longer previous line left behind.
	return fmt.Sprintf("%3d%%|%s%s| %d/%d [%s, %.2f req/s, %d failed]  ", percent(p.done, p.total),
		strings.Repeat("█", filled), strings.Repeat(" ", width-filled), p.done, p.total, clockText(elapsed), rate, p.failed)
}

// clockText is elapsed as tqdm shows it: MM:SS, or H:MM:SS past an hour.
func clockText(d time.Duration) string {
	s := int(d.Round(time.Second) / time.Second)
	if s >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", s/3600, s/60%60, s%60)
	}
	return fmt.Sprintf("%02d:%02d", s/60, s%60)
}

func percent(a, b int) int {
	if b == 0 {
		return 100
	}
	return a * 100 / b
}
