package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progress draws a one-line progress bar, redrawn at most every 200 ms. The
// zero value with a nil w draws nothing.
type progress struct {
	w     io.Writer
	clock Clock
	total int
	start time.Time

	mu   sync.Mutex
	done int
	last time.Time
}

func (p *progress) add(n int) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	now := p.clock.Now()
	if p.done < p.total && now.Sub(p.last) < 200*time.Millisecond {
		return
	}
	p.last = now
	const width = 30
	filled := 0
	if p.total > 0 {
		filled = p.done * width / p.total
	}
	fmt.Fprintf(p.w, "\r%3d%%|%s%s| %d/%d [%s]", percent(p.done, p.total), strings.Repeat("█", filled), strings.Repeat(" ", width-filled),
		p.done, p.total, now.Sub(p.start).Round(time.Second))
	if p.done >= p.total {
		fmt.Fprintln(p.w)
	}
}

func percent(a, b int) int {
	if b == 0 {
		return 100
	}
	return a * 100 / b
}
