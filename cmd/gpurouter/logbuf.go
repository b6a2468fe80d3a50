package main

import (
	"context"
	"io"
	"sync"
	"time"

	"go.uber.org/zap"
)

// logBuffer batches the router's log — one access log line per request —
// into few writes: a write(2) per request cost as much CPU as parsing the
// request did. It writes out when it holds limit bytes, every interval
// (Run), and on Sync: zap syncs on every entry above Error, and serve
// syncs once everything has stopped, so a SIGTERM loses no line. The zero
// value is not usable; build with newLogBuffer.
type logBuffer struct {
	mu       sync.Mutex
	w        io.Writer
	buf      []byte
	limit    int
	interval time.Duration
	err      error // the last write's error, returned by the next Sync
}

func newLogBuffer(w io.Writer, limit int, interval time.Duration) *logBuffer {
	return &logBuffer{w: w, limit: limit, interval: interval, buf: make([]byte, 0, limit)}
}

// Write keeps p for the next flush; p is copied (zap reuses its buffers).
func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.buf)+len(p) > b.limit {
		b.flushLocked()
	}
	if len(p) > b.limit {
		_, err := b.w.Write(p)
		return len(p), err
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// Sync writes out what is buffered.
func (b *logBuffer) Sync() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
	err := b.err
	b.err = nil
	if s, ok := b.w.(interface{ Sync() error }); ok && err == nil {
		// Syncing a terminal or a pipe fails with EINVAL: not a lost line.
		s.Sync() //nolint:errcheck
	}
	return err
}

func (b *logBuffer) flushLocked() {
	if len(b.buf) == 0 {
		return
	}
	if _, err := b.w.Write(b.buf); err != nil {
		b.err = err
	}
	b.buf = b.buf[:0]
}

// Run writes the buffer out every interval until ctx ends, and once more
// then.
func (b *logBuffer) Run(ctx context.Context) error {
	t := time.NewTicker(b.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			b.Sync() //nolint:errcheck
			return nil
		case <-t.C:
			b.mu.Lock()
			b.flushLocked()
			b.mu.Unlock()
		}
	}
}

// Log buffering of serve: 64 KiB holds a few hundred access log lines;
// a line waits at most logFlushEvery before it is written.
const (
	logBufferBytes = 64 << 10
	logFlushEvery  = 200 * time.Millisecond
)

// newBufferedLogger is newLogger writing through a logBuffer, which the
// caller runs (its Run) and syncs (the logger's Sync) at exit.
func newBufferedLogger(lc logConfig, w io.Writer) (*zap.Logger, *logBuffer, error) {
	b := newLogBuffer(w, logBufferBytes, logFlushEvery)
	log, err := newLoggerSync(lc, b)
	return log, b, err
}
